"""Device bugs caught without a GPU. The ``meta`` device refuses to mix with CPU tensors exactly as
CUDA does ("Tensor on device cpu is not on the expected device meta!"), so a trainer put there fails
where a GPU run would.
"""

import os

import pytest
import torch

from suite import dist
from suite.numerics import sampling
from suite.numerics.precision import FLOWS, resolve
from suite.numerics.scoring import Batch
from suite.numerics.trainer import Trainer
from suite.rl import config
from suite.rl.policy import PolicySpec, build_model

# The flows whose trainer runs the sampler's code (the replayed decode loop, the unified forward):
# autocast has no meta backend, so the HF-module flows are covered on CUDA by `suite doctor`'s
# placement rows instead.
ENGINE_CODE_FLOWS = [n for n, f in FLOWS.items() if f.exact or f.unified]


@pytest.mark.parametrize("flow", ENGINE_CODE_FLOWS)
def test_a_trainer_off_the_cpu_scores_a_cpu_batch_on_its_device(flow):
    """The run hands the trainer CPU ids/attention/targets (the rollout's); every flow moves them to
    the rank's device in one place, and the replay engine of the exact flow is built there (its
    inv_freq and eos too)."""
    assert flow in ("exact", "fp8", "nvfp4a4", "bf16_unified", "fp16_unified")
    model = build_model(PolicySpec(hidden=32, layers=1, heads=2, kv_heads=1, mlp=64), vocab_size=20)
    trainer = Trainer(model, resolve(flow), "native", config.load(["tier=smoke"]).optim,
                      world=dist.World(device="meta"))
    ids = torch.randint(3, 20, (2, 8))
    logp, ent, _ = trainer.score(Batch(ids, torch.ones_like(ids), ids[:, -3:], 1.0))
    assert logp.device.type == "meta" and logp.shape == (2, 3) and ent.shape == (2, 3)
    assert trainer.observe()["param_device"] == "meta"
    engine = trainer.exact_engine or trainer.unified_engine
    assert engine.inv_freq.device.type == "meta" and engine.eos.device.type == "meta"


def test_sampling_on_a_device_with_a_cpu_generator(monkeypatch):
    """Evaluation and the benchmarks seed a CPU torch.Generator; CUDA's multinomial refuses a
    generator of another device. The sampler then draws the uniforms on the generator's device and
    samples by inverse CDF on the probabilities' device; on one device it keeps torch.multinomial
    (the CPU numbers of the references)."""
    real = torch.multinomial

    def strict(probs, n, generator=None):  # what CUDA does with a generator of another device
        if generator is not None and generator.device != probs.device:
            raise RuntimeError(f"Expected a '{probs.device.type}' device type for generator")
        return real(probs, n, generator=generator)

    monkeypatch.setattr(torch, "multinomial", strict)
    logp = torch.log_softmax(torch.randn(4, 11, generator=torch.Generator().manual_seed(0)), -1)
    tok = sampling.draw(logp.to("meta"), None, torch.Generator().manual_seed(1))
    assert tok.device.type == "meta" and tok.shape == (4,)
    # same device: unchanged, the multinomial draw of the committed references
    a = sampling.draw(logp, None, torch.Generator().manual_seed(1))
    assert torch.equal(a, real(logp.exp(), 1, generator=torch.Generator().manual_seed(1))[:, 0])
    # the cross-device path is the inverse CDF of the generator's uniforms: the same tokens on the
    # CPU
    u = torch.rand(4, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    assert torch.equal(sampling.draw(logp, None, u), _inverse_cdf(logp, u))


def _inverse_cdf(logp, u):
    cdf = logp.exp().double().cumsum(-1)
    idx = torch.searchsorted(cdf, (u * cdf[:, -1])[:, None], right=True)[:, 0]
    return idx.clamp(max=logp.shape[-1] - 1)


@pytest.mark.parametrize("fail", [False, True])
def test_a_run_closes_its_sampler_and_builds_no_second_one_for_the_kl_reference(
    tmp_path, monkeypatch, fail):
    """A sweep's cells run one after another in one process: each run shuts its sampler down (a vLLM
    engine holds its GPU memory until then), whether it finishes or dies; the KL reference is a
    trainer, never a second engine."""
    from suite.rl import train

    built, closed, real = [], [], train.build_engines

    def spy(cfg, model, world=None):
        trainer, engine, backends = real(cfg, model, world)
        built.append(engine)
        engine.close = lambda: closed.append(engine)
        if fail:
            engine.sync = lambda weights: (_ for _ in ()).throw(RuntimeError("CUDA out of memory"))
        return trainer, engine, backends

    monkeypatch.setattr(train, "build_engines", spy)
    cfg = config.load(["tier=smoke", "steps=1", "algo.kl_coef=0.01", f"out={tmp_path}"])
    if fail:
        with pytest.raises(RuntimeError, match="out of memory"):
            train.run(cfg)
    else:
        train.run(cfg)
    assert len(built) == 1 and closed == built


@pytest.mark.skipif(__import__("importlib").util.find_spec("vllm") is None,
                    reason="vllm(-cpu) not installed")
def test_vllm_sleep_mode_wakes_in_vllms_order_and_samples_split_after_split(monkeypatch):
    """Sleep mode (GPU only: vLLM's CPU worker ignores it, so this drives the engine's logic with a
    recording LLM): an evaluation samples its second split after the first put the engine to sleep,
    and a weight sync wakes the weights, loads, then wakes the KV cache (vLLM's RL order, verl's
    rollout), freeing the trainer's cache first."""
    from types import SimpleNamespace

    from suite.numerics import vllm_engine

    calls = []

    class LLM:
        def sleep(self, level):
            calls.append(f"sleep{level}")

        def wake_up(self, tags=None):
            calls.append(f"wake {','.join(tags or ['all'])}")

        def collective_rpc(self, name, kwargs):
            calls.append(name)

        def reset_prefix_cache(self):
            calls.append("reset_prefix_cache")

        def generate(self, prompts, params, use_tqdm):
            calls.append("generate")
            out = SimpleNamespace(token_ids=[5, 2],
                                  logprobs=[{5: SimpleNamespace(logprob=-0.1)},
                                            {2: SimpleNamespace(logprob=-0.2)}],
                                  finish_reason="stop")
            return [SimpleNamespace(outputs=[out], request_id=str(i)) for i in range(len(prompts))]

    monkeypatch.setattr(vllm_engine, "_free_cached_device_memory",
                        lambda: calls.append("empty_cache"))
    eng = object.__new__(vllm_engine.VllmEngine)
    eng.llm, eng.sleep_mode, eng.asleep, eng.dtype, eng.eos, eng.n_syncs = (
        LLM(), True, False, torch.float32, [2], 0)
    for _ in range(2):  # an evaluation of two splits
        eng.generate([[1, 3]], 4, 1.0, 1.0, torch.Generator().manual_seed(0))
    assert calls == ["generate", "sleep1", "empty_cache", "wake weights", "empty_cache",
                     "wake kv_cache", "generate", "sleep1"]
    calls.clear()
    eng.sync({"w": torch.zeros(2)})
    assert calls == ["empty_cache", "wake weights", "reload_weights", "reset_prefix_cache",
                     "empty_cache", "wake kv_cache"] and not eng.asleep


@pytest.mark.parametrize("flow", list(FLOWS))
def test_every_flow_observes_its_dtypes_on_its_device_with_emulated_gemms(flow):
    """gemm=emulated (no autocast, so the HF-module flows run on meta too): observe() runs the model
    without an attention mask, and the emulated attention's causal mask is built on the queries'
    device, not on the CPU."""
    model = build_model(PolicySpec(hidden=32, layers=1, heads=2, kv_heads=1, mlp=64), vocab_size=20)
    trainer = Trainer(model, resolve(flow), "emulated", config.load(["tier=smoke"]).optim,
                      world=dist.World(device="meta"))
    seen = trainer.observe()
    assert seen["param_device"] == "meta" and seen["logits"] == str(resolve(flow).trainer_dtype)


@pytest.mark.parametrize("given", [None, ":16:8"])
def test_deterministic_sets_torchs_flag_for_the_run_and_cublas_for_the_process(monkeypatch, given):
    """Process-wide state: on inside, torch's flag and vLLM's variable as found afterwards (a
    sweep's next cell in this process starts clean), also when the run dies; cuBLAS's setting stays,
    since cuBLAS reads it once per process (suite/numerics/determinism.py), and a deterministic
    value the user set is kept; off changes nothing."""
    from suite.numerics import determinism

    if given:
        monkeypatch.setenv("CUBLAS_WORKSPACE_CONFIG", given)
    else:
        monkeypatch.delenv("CUBLAS_WORKSPACE_CONFIG", raising=False)
    monkeypatch.delenv("VLLM_BATCH_INVARIANT", raising=False)
    assert not torch.are_deterministic_algorithms_enabled()
    with determinism.enabled(False):
        assert determinism.describe(False) == {"requested": False,
                                               "torch_deterministic_algorithms": False,
                                               "CUBLAS_WORKSPACE_CONFIG": given,
                                               "VLLM_BATCH_INVARIANT": None}
    with pytest.raises(RuntimeError, match="died"), determinism.enabled(True):
        assert determinism.describe(True) == {"requested": True,
                                              "torch_deterministic_algorithms": True,
                                              "CUBLAS_WORKSPACE_CONFIG": given or ":4096:8",
                                              "VLLM_BATCH_INVARIANT": "1"}
        raise RuntimeError("died")
    assert not torch.are_deterministic_algorithms_enabled()
    assert os.environ["CUBLAS_WORKSPACE_CONFIG"] == (given or ":4096:8")
    assert "VLLM_BATCH_INVARIANT" not in os.environ


def test_a_deterministic_run_records_it_and_computes_the_same_on_cpu(tmp_path, monkeypatch):
    """CPU kernels are deterministic already: deterministic=true changes no number of a run
    (metrics.jsonl byte for byte), and env.json records the state the run computed under."""
    import json

    from suite.rl import train

    monkeypatch.delenv("CUBLAS_WORKSPACE_CONFIG", raising=False)  # the run sets it for the process

    dirs = {}
    for on in (False, True):
        cfg = config.load(["tier=smoke", "steps=2", f"deterministic={str(on).lower()}",
                           f"out={tmp_path / str(on)}"])
        dirs[on] = train.run(cfg)
    env = json.loads((dirs[True] / "env.json").read_text())["determinism"]
    assert (env["requested"] and env["torch_deterministic_algorithms"]
            and env["CUBLAS_WORKSPACE_CONFIG"] == ":4096:8")
    env_off = json.loads((dirs[False] / "env.json").read_text())["determinism"]
    assert not env_off["torch_deterministic_algorithms"]
    assert not torch.are_deterministic_algorithms_enabled()
    assert ((dirs[True] / "metrics.jsonl").read_bytes()
            == (dirs[False] / "metrics.jsonl").read_bytes())


@pytest.mark.parametrize("precision", ["bf16", "fp8", "bf16_nvfp4a4rollout", "nvfp4a4"])
def test_tools_without_a_launcher_compute_on_the_hosts_device(monkeypatch, precision):
    """suite mismatch, attribute, gate and bench build their engines without a launcher's World:
    they get the device a run gets (here a stand-in GPU, the meta device), not the CPU silently on a
    GPU machine."""
    from suite.rl.train import build_engines

    monkeypatch.setattr(dist, "device_for", lambda local_rank: "meta")
    assert dist.World().device == "meta"
    model = build_model(PolicySpec(hidden=32, layers=1, heads=2, kv_heads=1, mlp=64), vocab_size=20)
    cfg = config.load(["tier=smoke", f"precision={precision}", "gemm=emulated"])
    # as suite/experiments/bench.py's step-0 mismatch does
    trainer, engine, _ = build_engines(cfg, model)
    assert trainer.device.type == "meta" and engine.device == "meta"
    assert next(trainer.model.parameters()).device.type == "meta"


@pytest.mark.parametrize("flow", [n for n, f in FLOWS.items() if f.fp4])
def test_a_4bit_sampler_quantises_at_sync_and_computes_on_its_device(flow):
    """The FP4 rollout flows' sampler (suite/numerics/fp4.py) quantises the synced weights on its
    device and computes there, the per-token activation quantiser of the W4A4 rows included."""
    from suite.numerics import fp4
    from suite.numerics.engine import TorchEngine

    model = build_model(PolicySpec(hidden=32, layers=1, heads=2, kv_heads=1, mlp=64), vocab_size=20)
    engine = TorchEngine(model.config, resolve(flow).sampler_dtype, "native", device="meta",
                         quant=resolve(flow).sampler_quant)
    engine.sync(model.state_dict())  # CPU weights in, as a run syncs the trainer's
    assert engine.wq and all(isinstance(v, fp4.SamplerWeight) and v.operand.device.type == "meta"
                             for v in engine.wq.values())
    assert not any(k.endswith("_proj.weight") for k in engine.w)
    ids = torch.randint(3, 20, (2, 5))
    logp, ent = engine.score(ids.to("meta"), torch.ones(2, 5, dtype=torch.bool, device="meta"),
                             ids[:, -2:].to("meta"), 1.0)
    assert logp.device.type == "meta" and logp.shape == (2, 2) and ent.shape == (2, 2)


class _RecordingEngine:
    """Records each generate() call's prompts and per-request seeds, drawn as VllmEngine.generate
    draws them."""

    def __init__(self, max_batch):
        self.max_batch, self.calls = max_batch, []

    def generate(self, prompts, max_new_tokens, temperature, top_p, generator, logprobs=True):
        from suite.numerics.engine import EOS, Rollout

        seeds = (generator.tolist() if isinstance(generator, torch.Tensor)
                 else torch.randint(0, 2**31 - 1, (len(prompts),), generator=generator).tolist())
        self.calls.append((prompts, seeds))
        B = len(prompts)
        return Rollout(prompt_ids=prompts, tokens=torch.full((B, 1), EOS), mask=torch.ones(B, 1),
                       logprobs=torch.zeros(B, 1), truncated=[False] * B)


def test_evaluation_hands_vllm_every_prompt_at_once_with_the_seeds_of_chunks(
    tiny_model, monkeypatch):
    """Held-out evaluation batches as the engine says: the built-in engine (dense KV cache) 256
    prompts at a time, exactly as before; vLLM, which schedules requests itself, every prompt in one
    call, each request with the prompt and the seed it had when the evaluation was chunked (one draw
    of n seeds is the draws of its chunks), so vLLM samples the same responses. The responses are
    graded by the run's reward workers, as a step's are."""
    from suite.numerics.engine import TorchEngine
    from suite.numerics.vllm_engine import VllmEngine
    from suite.rl import step

    _, tok, task = tiny_model
    graded, grade = [], step.grade
    monkeypatch.setattr(step, "grade", lambda t, items, texts, truncated, workers: graded.append(
        (len(texts), workers)) or grade(t, items, texts, truncated))
    settings = {"samples": 8, "splits": ["test"], "prompts": 40, "temperature": 1.0, "top_p": 1.0}
    built_in, vllm = _RecordingEngine(TorchEngine.max_batch), _RecordingEngine(VllmEngine.max_batch)
    for engine in (built_in, vllm):
        step.evaluate(engine, tok, task, settings, 4, seed=3, workers=4)
    assert [len(p) for p, _ in built_in.calls] == [256,
                                                   64] and [len(p) for p, _ in vllm.calls] == [320]
    assert graded == [(256, 4), (64, 4), (320, 4)]
    pairs = [(tuple(p), s) for prompts, seeds in built_in.calls for p, s in zip(prompts, seeds)]
    assert pairs == [(tuple(p), s) for p, s in zip(*vllm.calls[0])]


def test_bench_memory_measures_where_a_run_computes_and_names_that_device(monkeypatch, tmp_path):
    """suite bench-memory (and --plan --write) measured on the CPU while its file named the host's
    class: it now measures on the host's device (here the stand-in meta, which has no peak to read:
    refused, not measured on the CPU), and the written file names the device the peaks came from,
    the CPU's class when --device cpu."""
    import json

    from rich.console import Console

    from suite.experiments import bench_memory as bm
    from suite.numerics import machine

    monkeypatch.setattr(dist, "device_for", lambda local_rank: "meta")
    with pytest.raises(ValueError, match="meta has no peak"):
        bm.one("baseline", vocab=64, batch=1, prompt=4, response=4, steps=1, precision="fp32")
    asked = []

    def measure(variant, sizes, env=None):  # each variant's own process, as `one` reports it
        asked.append(sizes["device"])
        return {"peak_mb": 100.0, "device": sizes["device"],
                "peak": bm.PEAK[sizes["device"].startswith("cuda")]}

    monkeypatch.setattr(bm, "_measure", measure)
    bm.plan_check(Console(quiet=True), 1, str(tmp_path / "host.json"))
    host = json.loads((tmp_path / "host.json").read_text())
    assert (asked == ["meta"] * len(bm.PLAN_SIZES) and host["device"] == "meta"
            and host["machine_class"] == "meta")
    bm.plan_check(Console(quiet=True), 1, str(tmp_path / "cpu.json"), device="cpu")
    cpu = json.loads((tmp_path / "cpu.json").read_text())
    assert cpu["device"] == "cpu" and cpu["machine_class"] == machine.describe(
        "auto", 1, device="cpu")["id"]
    assert cpu["machine_class"].startswith("cpu-") and cpu["peak"].startswith("peak RSS")


def test_bench_runs_the_engine_and_hf_generate_on_the_hosts_device(monkeypatch):
    """suite bench's "built-in engine vs HF generate" table built its engine and kept HF's model on
    the CPU, under the GPU's machine class: both sides now get the run's device (the engine's
    weights are the model's, moved)."""
    from suite.experiments import bench

    class Built(Exception):
        pass

    seen = {}

    class Spy:
        def __init__(self, config, dtype, backend="native", device="cpu", **kw):
            seen["engine"] = device

        def sync(self, state_dict):
            seen["weights"] = {str(t.device) for t in state_dict.values()}
            raise Built

    monkeypatch.setattr(dist, "device_for", lambda local_rank: "meta")
    monkeypatch.setattr(bench, "TorchEngine", Spy)
    with pytest.raises(Built):
        bench.sampler_vs_generate(config.load(["tier=smoke"]), repeats=1, dtypes=("bf16",))
    assert seen == {"engine": "meta", "weights": {"meta"}}


def test_attribute_samples_and_replays_on_the_hosts_device(monkeypatch):
    """suite attribute's sampler and its matched (replaying) trainer were TorchEngines on the CPU:
    they now compute on the run's device, the replay is handed its batch there, and its scores come
    back to the rollout's CPU."""
    from types import SimpleNamespace

    from suite.experiments import attribute
    from suite.numerics.engine import TorchEngine

    monkeypatch.setattr(dist, "device_for", lambda local_rank: "meta")
    model = build_model(PolicySpec(hidden=32, layers=1, heads=2, kv_heads=1, mlp=64), vocab_size=20)
    theta = {k: v.clone() for k, v in model.state_dict().items()}
    probe = attribute.Probe(cfg=config.load(["tier=smoke", "precision=bf16", "gemm=emulated"]),
                            model=model, theta0=theta, theta1=theta, batches=[], seeds=[0],
                            top_p=0.8)
    sampler = attribute._sampler(probe, frozenset({"kv_fp8"}))
    assert sampler.device == "meta" and sampler.inv_freq.device.type == "meta"
    assert {str(w.device) for w in sampler.w.values()} == {"meta"}
    scored = []

    def score(self, ids, valid_prompt, tokens, temperature, full=False):
        scored.append({self.device, str(ids.device), str(valid_prompt.device), str(tokens.device)})
        B, R = tokens.shape
        return torch.zeros(B, R), torch.zeros(B, R), torch.zeros(B, R, 20)

    monkeypatch.setattr(TorchEngine, "score", score)
    roll = SimpleNamespace(prompt_ids=[[5, 6], [7]], tokens=torch.tensor([[3, 4], [5, 2]]),
                           mask=torch.ones(2, 2))
    lp, full = attribute._replay_scores(probe, roll, theta, rows_per_call=1)
    assert scored == [{"meta"}, {"meta"}] and lp.device.type == "cpu" and full.shape == (2, 2, 20)


def test_the_doctor_computes_where_a_run_does():
    """suite doctor's device is suite/dist.py's choice, not a second rule of its own."""
    from suite.experiments import doctor

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(dist, "device_for", lambda local_rank: "meta")
        assert doctor._device() == "meta"
