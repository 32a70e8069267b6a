"""What the vLLM sampler and the GPU tools would do on a GPU, checked without one: vLLM's objects
replaced by recording fakes that change what vLLM 0.32 changes, and rules read from vLLM's source
encoded as checks."""

from __future__ import annotations

import importlib.util
import inspect
import os
import resource
import sys
import types
from types import SimpleNamespace

import pytest
import torch

from suite import dist
from suite.rl import config

needs_vllm = pytest.mark.skipif(importlib.util.find_spec("vllm") is None,
                                reason="vllm(-cpu) not installed")


def _model_dir(tmp_path, hidden=32, heads=2, mlp=64):
    from transformers import Qwen2Config

    Qwen2Config(hidden_size=hidden, num_attention_heads=heads, num_key_value_heads=1,
                intermediate_size=mlp, num_hidden_layers=1, vocab_size=20,
                eos_token_id=2).save_pretrained(tmp_path)
    return tmp_path


class _Engine:
    """What ``VllmEngine`` reads of a started ``vllm.LLM``."""

    def __init__(self, dtype):
        self.model_config = SimpleNamespace(dtype=dtype)
        self.engine_core = SimpleNamespace(shutdown=lambda: None)


def _fake_llm(monkeypatch, on_start=lambda: None):
    """A ``vllm.LLM`` that runs ``on_start`` as it starts (vLLM's worker start-up) and records
    its arguments."""
    started = []

    class LLM:
        def __init__(self, **kw):
            started.append(kw)
            on_start()
            self.llm_engine = _Engine(kw["dtype"])

        def generate(self, prompts, params, use_tqdm=False):
            return []

    monkeypatch.setattr("vllm.LLM", LLM)
    monkeypatch.setattr("vllm.distributed.parallel_state.cleanup_dist_env_and_memory",
                        lambda: None)
    return started


# ---- batch invariance is undone at close -------------------------------------------------------
INVARIANCE_ENV = {"CUBLAS_WORKSPACE_CONFIG": ":4096:8", "NCCL_ALGO": "ring,tree;allreduce:tree",
                  "NCCL_PROTO": "Simple", "VLLM_USE_AOT_COMPILE": "0"}


def _fake_batch_invariance(mod: types.ModuleType):
    """vLLM 0.32's init_batch_invariance (model_executor/determinism/batch_invariant.py) on the
    CPU dispatch key: aten overrides in a Library, the backend flags, the environment, and the
    engine core's environment cache."""

    def init():
        if mod._batch_invariant_MODE:
            return
        mod._batch_invariant_MODE = True
        mod._batch_invariant_LIB = lib = torch.library.Library("aten", "IMPL")
        lib.impl("aten::_log_softmax", lambda x, dim, half: torch.zeros_like(x), "CPU")
        lib.impl("aten::mean.dim", lambda x, dim, keepdim=False, dtype=None: torch.zeros(()), "CPU")
        os.environ.update(INVARIANCE_ENV)
        torch.backends.cuda.matmul.allow_fp16_reduced_precision_reduction = False
        torch.backends.cuda.matmul.allow_bf16_reduced_precision_reduction = False
        torch.backends.cuda.matmul.fp32_precision = "ieee"
        torch.backends.cudnn.conv.fp32_precision = "ieee"
        torch.backends.cudnn.rnn.fp32_precision = "ieee"
        import vllm.envs

        vllm.envs.enable_envs_cache()

    return init


@needs_vllm
def test_closing_the_engine_undoes_what_batch_invariance_changed_in_this_process(
    tmp_path, monkeypatch):
    """deterministic=true starts vLLM with VLLM_BATCH_INVARIANT=1, whose start-up replaces aten
    kernels process-wide (the trainer's log-softmax and means too), sets torch backend flags,
    NCCL's and cuBLAS's environment and caches vLLM's environment: after close() the trainer and
    the next cell compute as before the engine started."""
    import vllm.envs

    from suite.numerics import vllm_engine, vllm_state
    from suite.numerics.precision import resolve

    mod = types.ModuleType(vllm_state.MODULES[0])
    mod._batch_invariant_MODE, mod._batch_invariant_LIB = False, None
    monkeypatch.setitem(sys.modules, vllm_state.MODULES[0], mod)
    monkeypatch.setenv("VLLM_BATCH_INVARIANT", "1")
    monkeypatch.setenv("CUBLAS_WORKSPACE_CONFIG", ":16:8")
    for k in ("NCCL_ALGO", "NCCL_PROTO", "VLLM_USE_AOT_COMPILE"):
        monkeypatch.delenv(k, raising=False)
    vllm.envs.disable_envs_cache()
    flags = vllm_state._flags()
    before = [getattr(o, n) for o, n in flags]
    x = torch.randn(3, 5)
    want = torch.log_softmax(x, -1), x.mean(0)
    _fake_llm(monkeypatch, _fake_batch_invariance(mod))
    try:
        vcfg = config.load(["tier=smoke"]).vllm
        eng = vllm_engine.VllmEngine(_model_dir(tmp_path), resolve("bf16"), vcfg)
        assert torch.log_softmax(x, -1).abs().sum() == 0  # the fake took effect
        eng.close()
        assert torch.equal(torch.log_softmax(x, -1), want[0]) and torch.equal(x.mean(0), want[1])
        assert [getattr(o, n) for o, n in flags] == before
        assert os.environ["CUBLAS_WORKSPACE_CONFIG"] == ":16:8"
        assert os.environ["VLLM_BATCH_INVARIANT"] == "1"  # the run's own setting, not vLLM's
        assert not {"NCCL_ALGO", "NCCL_PROTO", "VLLM_USE_AOT_COMPILE"} & set(os.environ)
        # A later engine registers its kernels again and reads the environment afresh.
        assert not mod._batch_invariant_MODE and mod._batch_invariant_LIB is None
        assert not hasattr(vllm.envs.__getattr__, "cache_clear")
    finally:  # whatever happened above, the rest of the session computes with torch's kernels
        if mod._batch_invariant_LIB is not None:
            mod._batch_invariant_LIB._destroy()
        for (o, n), v in zip(flags, before):
            setattr(o, n, v)
        vllm.envs.disable_envs_cache()


# ---- FP8 widths vLLM's CUDA block-FP8 linears cannot take ---------------------------------------
@needs_vllm
def test_fp8_with_vllm_on_cuda_refuses_widths_that_are_not_multiples_of_128(monkeypatch, tmp_path):
    """vLLM 0.32's CUDA block-FP8 path quantises each linear's input in groups of 128 and asserts
    that the width divides (per_token_group_quant_fp8) at the first forward: the small tier's
    policy (hidden 96) would die inside vLLM's start-up. The config refuses it before any compute,
    naming the fields; regime=wide (256, 640) passes; a model from a directory is refused before
    vLLM starts."""
    from suite.numerics import vllm_engine, vllm_support
    from suite.numerics.precision import resolve

    monkeypatch.setattr(vllm_support, "device", lambda: "cuda")
    monkeypatch.setattr(vllm_support, "fp8_capable", lambda: (True, ""))
    small = ["tier=small", "engine=vllm"]
    with pytest.raises(ValueError, match=r"policy.hidden: .*hidden 96.*of 128.*regime=wide"):
        config.load([*small, "precision=fp8"])
    assert config.load([*small, "precision=fp8", "regime=wide"]).policy.hidden == 256
    config.load([*small, "precision=bf16"])  # only FP8 has the rule
    started = _fake_llm(monkeypatch)
    with pytest.raises(ValueError, match="hidden 96, heads x head size 96, mlp 200 are not a"):
        vllm_engine.VllmEngine(_model_dir(tmp_path, hidden=96, heads=4, mlp=200), resolve("fp8"),
                               config.load(["tier=smoke"]).vllm)
    assert started == []  # refused before vLLM started


# ---- evaluation asks vLLM for no log-probs -------------------------------------------------------
@needs_vllm
def test_evaluation_samples_the_published_top_p_without_per_token_logprobs(tiny_model):
    """AIME mean@32 at temperature 0.6, top-p 0.95: the evaluation grades text, so the engine asks
    vLLM for no log-prob per token (16 M objects at 8,192 tokens) and lets vLLM apply top-p; an
    engine started for training (without the full distribution) no longer refuses it."""
    from suite.numerics import vllm_engine
    from suite.rl import step

    asked = []

    class LLM:
        def generate(self, prompts, params, use_tqdm):
            asked.extend(params)
            out = SimpleNamespace(token_ids=[5, 2], logprobs=None, finish_reason="stop")
            return [SimpleNamespace(outputs=[out], request_id=str(i)) for i in range(len(prompts))]

    eng = object.__new__(vllm_engine.VllmEngine)
    eng.llm, eng.sleep_mode, eng.asleep, eng.eos, eng.truncating = LLM(), False, False, [2], False
    _, tok, task = tiny_model
    settings = {"samples": 2, "splits": ["test"], "prompts": 3, "temperature": 0.6, "top_p": 0.95}
    scores = step.evaluate(eng, tok, task, settings, 4, seed=0)
    assert list(scores) == ["eval/test/mean@2"] and len(asked) == 6
    assert all(p.logprobs is None and p.top_p == 0.95 and p.temperature == 0.6 for p in asked)
    with pytest.raises(ValueError, match="truncat"):  # training needs the kept set
        eng.generate([[1, 3]], 4, 0.6, 0.95, torch.Generator().manual_seed(0))


# ---- bench-memory without math-verify ------------------------------------------------------------
def test_bench_memory_refuses_a_missing_math_verify_before_measuring(monkeypatch):
    """The reward-pool timing at the end grades with math-verify (the math extra): without it the
    command is refused before the variants run, not after them; --reward-workers 0 skips it."""
    from suite.experiments import bench_memory as bm

    measured, real = [], importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name == "math_verify" else real(name, *a))

    def measure(variant, sizes, env=None):
        measured.append(variant)
        return {"variant": variant, "peak_mb": 10.0, "step_s": 1.0, "params": 1e6, "peak": "RSS"}

    def no_math_verify(workers):
        raise ModuleNotFoundError("No module named 'math_verify'")

    monkeypatch.setattr(bm, "_measure", measure)
    monkeypatch.setattr(bm, "reward_pool", no_math_verify)
    with pytest.raises(ValueError, match=r"--reward-workers: .*math-verify.*--reward-workers 0"):
        bm.main(["--steps", "2", "--device", "cpu"])
    assert measured == []
    assert bm.main(["--steps", "2", "--device", "cpu", "--reward-workers", "0"]) == 0
    assert measured == list(bm.VARIANTS)


# ---- memory metrics under their own names --------------------------------------------------------
def test_peak_rss_is_the_processes_and_the_cuda_peak_has_its_own_key(monkeypatch):
    """memory/peak_rss_mb/max reported the CUDA allocator's peak on a GPU: it is the resident set
    everywhere, and the allocator's peak has its own key, on a GPU only (a CPU run's timing rows
    keep their one key)."""
    monkeypatch.setattr(torch.cuda, "max_memory_allocated", lambda device=None: 5 * 2**30)
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    got = dist.peak_memory_mb(torch.device("cuda", 0), dist.World(device="cpu"))
    assert got["memory/cuda_peak_allocated_mb/max"] == 5 * 1024
    assert rss <= got["memory/peak_rss_mb/max"] <= rss + 1024
    cpu = dist.peak_memory_mb(torch.device("cpu"), dist.World(device="cpu"))
    assert list(cpu) == ["memory/peak_rss_mb/max"]


# ---- the reload signature: the worker vLLM calls forwards to the runner it is read from ----------
@needs_vllm
def test_the_worker_vllm_calls_passes_the_reload_arguments_to_the_runner_that_is_read():
    """collective_rpc("reload_weights", kwargs) calls the worker; vLLM 0.32's worker
    (v1/worker/gpu_worker.py, inherited by CPUWorker) takes *args, **kwargs and hands them to its
    model runner (GPUModelRunner, or the V2 runner), so the runner's signature decides; both
    runners take weights_iterator."""
    from vllm.v1.worker.cpu_worker import CPUWorker
    from vllm.v1.worker.gpu.model_runner import GPUModelRunner as RunnerV2
    from vllm.v1.worker.gpu_model_runner import GPUModelRunner
    from vllm.v1.worker.gpu_worker import Worker

    from suite.numerics.vllm_engine import reload_takes_iterator

    kinds = {p.kind for p in inspect.signature(Worker.reload_weights).parameters.values()}
    assert inspect.Parameter.VAR_KEYWORD in kinds
    assert CPUWorker.reload_weights is Worker.reload_weights
    forward = "self.model_runner.reload_weights(*args, **kwargs)"
    assert forward in inspect.getsource(Worker.reload_weights)
    assert reload_takes_iterator(GPUModelRunner) and reload_takes_iterator(RunnerV2)
