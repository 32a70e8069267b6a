"""The built-in sampler against the trainer's model, and the precision table it obeys."""

import copy

import pytest
import torch

from suite.numerics.engine import TorchEngine
from suite.numerics.precision import (
    FLOWS,
    emulate_autocast,
    gemm_backend,
    lowp_linear,
    resolve,
)
from suite.numerics.scoring import Batch, batch_tensors
from suite.rl.policy import EOS


def _prompts(tok, task, n=12):
    prompts = [tok(it.prompt)["input_ids"] for it in task.split("train", n)]
    prompts[0] = prompts[0][:1] + prompts[0][4:]  # a shorter prompt: exercises left padding
    return prompts


def _hf_logprobs(model, roll, temperature=1.0):
    ids, attn = batch_tensors(roll.prompt_ids, roll.tokens, roll.mask)
    pos = (attn.cumsum(1) - 1).clamp(min=0)
    with torch.no_grad():
        logits = model(input_ids=ids, attention_mask=attn, position_ids=pos).logits.float()
    R = roll.tokens.shape[1]
    logp = torch.log_softmax(logits[:, -R - 1:-1] / temperature, -1)
    return logp.gather(-1, roll.tokens[..., None])[..., 0] * roll.mask


def test_fp32_engine_matches_hf_forward(tiny_model):
    """In fp32 the KV-cache engine and HF's full-sequence forward agree to float rounding."""
    model, tok, task = tiny_model
    engine = TorchEngine(model.config, torch.float32)
    engine.sync(model.state_dict())
    roll = engine.generate(_prompts(tok, task), 30, 0.7, 1.0, torch.Generator().manual_seed(0))
    diff = (_hf_logprobs(model, roll, 0.7) - roll.logprobs).abs().max().item()
    assert diff < 1e-5
    assert roll.n_tokens > 100


def test_low_precision_engine_differs_by_the_dtype(tiny_model):
    """bf16/fp16 samplers disagree with fp32 by an amount set by their mantissa: bf16 keeps 8
    significand bits and fp16 11, so their rounding errors stand 2^3 = 8x apart; the test asks
    bf16's mean |dlogp| to exceed fp16's by half of that, whatever the machine's GEMM kernels."""
    model, tok, task = tiny_model
    diff = {}
    for precision in ("bf16", "fp16"):
        flow = resolve(precision)
        engine = TorchEngine(model.config, flow.sampler_dtype,
                             gemm_backend("auto", flow.sampler_dtype))
        engine.sync(model.state_dict())
        roll = engine.generate(_prompts(tok, task, 32), 30, 1.0, 1.0,
                               torch.Generator().manual_seed(0))
        diff[precision] = ((_hf_logprobs(model, roll) - roll.logprobs).abs().sum()
                           / roll.mask.sum()).item()
    assert 1e-4 < diff["bf16"] < 5e-2 and 1e-5 < diff["fp16"] < 5e-3
    assert diff["bf16"] > 4 * diff["fp16"], diff


def test_generation_is_seeded_and_stops_at_eos(tiny_model):
    model, tok, task = tiny_model
    engine = TorchEngine(model.config, torch.float32)
    engine.sync(model.state_dict())
    a = engine.generate(_prompts(tok, task), 40, 1.0, 1.0, torch.Generator().manual_seed(3))
    b = engine.generate(_prompts(tok, task), 40, 1.0, 1.0, torch.Generator().manual_seed(3))
    assert torch.equal(a.tokens, b.tokens) and torch.equal(a.logprobs, b.logprobs)
    for row, n, trunc in zip(a.tokens.tolist(), a.mask.sum(1).long().tolist(), a.truncated):
        assert (row[n - 1] == EOS) != trunc  # finished rows end with EOS; truncated rows do not
        assert EOS not in row[: n - 1]
        assert all(t == 0 for t in row[n:])  # PAD after the end


def test_top_p_keeps_the_nucleus(tiny_model):
    model, tok, task = tiny_model
    engine = TorchEngine(model.config, torch.float32)
    engine.sync(model.state_dict())
    greedy = engine.generate(_prompts(tok, task), 10, 1.0, 1e-6, torch.Generator().manual_seed(0))
    again = engine.generate(_prompts(tok, task), 10, 1.0, 1e-6, torch.Generator().manual_seed(1))
    assert torch.equal(greedy.tokens, again.tokens)  # a vanishing nucleus is greedy decoding


@pytest.mark.parametrize("name", list(FLOWS))
@pytest.mark.parametrize("lm_head_fp32", [False, True])
def test_run_engines_follow_the_table(tiny_model, name, lm_head_fp32):
    """The engines a run builds hold exactly the table's dtypes (the sampler never picks its
    own)."""
    from suite.rl import config
    from suite.rl.train import build_engines

    model, tok, task = tiny_model
    flow = resolve(name)
    cfg = config.load(["tier=smoke", f"precision={name}", f"lm_head_fp32={lm_head_fp32}"])
    trainer, engine, _ = build_engines(cfg, copy.deepcopy(model))
    engine.sync(trainer.model.state_dict())
    assert engine.dtype == flow.sampler_dtype and trainer.dtype == flow.trainer_dtype
    assert trainer.scaler.enabled == flow.loss_scaling
    assert {v.dtype for v in engine.w.values()} == {flow.sampler_dtype}
    linears = {k for k in trainer.model.state_dict() if k.endswith("_proj.weight")}
    if flow.sampler_quant:  # every decoder linear, and nothing else, holds quantised weights
        assert {k for k in engine.wq} == {k
                                          for k in engine.cast_weights(
                                              trainer.model.state_dict(), True)
                                          if k.endswith("_proj.weight")}
        assert not any(k.endswith("_proj.weight") for k in engine.w)
    if flow.sampler == "fp8":  # E4M3 with fp32 block scales
        assert all(q.dtype == torch.float8_e4m3fn and s.dtype == torch.float32
                   for q, s in engine.wq.values())
    elif flow.fp4:  # the FP4 format the table names (suite/numerics/fp4.py)
        assert {w.fmt for w in engine.wq.values()} == {flow.sampler}
    else:
        assert engine.wq == {}
    if engine.backend == "emulated":  # the fp32 copies hold exactly the rounded values
        for k, v in engine.w32.items():
            assert torch.equal(v, engine.w[k].float())
    head = trainer.model.get_output_embeddings()
    body = [m for m in trainer.model.modules() if isinstance(m, torch.nn.Linear) and m is not head]
    assert len(body) == len(linears)
    assert all((getattr(m, "_suite_gemm", None) == "fp8") == (flow.trainer == "fp8") for m in body)
    assert (getattr(head, "_suite_gemm", None) == "fp32") == lm_head_fp32
    # Both sides produce fp32 logits from an fp32 head, or neither does.
    ids = torch.tensor([tok(it.prompt)["input_ids"] for it in task.split("train", 2)])
    with torch.no_grad(), trainer._autocast():
        logits = trainer.model(input_ids=ids).logits
    roll = engine.generate(ids.tolist(), 3, 1.0, 1.0, torch.Generator().manual_seed(0))
    assert (engine.head32 is not None) == lm_head_fp32
    expect = torch.float32 if lm_head_fp32 else flow.trainer_dtype
    assert logits.dtype == expect
    assert torch.isfinite(roll.logprobs).all()


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_emulated_gemm_is_the_low_precision_gemm(dtype):
    """upcast -> fp32 GEMM -> round equals the native low-precision GEMM up to accumulation
    order."""
    g = torch.Generator().manual_seed(0)
    x, w = torch.randn(64, 96, generator=g), torch.randn(48, 96, generator=g)
    native = torch.nn.functional.linear(x.to(dtype), w.to(dtype)).float()
    emulated = lowp_linear(x, w, None, dtype).float()
    assert lowp_linear(x, w, None, dtype).dtype == dtype
    ulp = native.abs() * (2.0 ** -7 if dtype == torch.bfloat16 else 2.0 ** -10)
    assert ((emulated - native).abs() <= ulp + 1e-6).all()  # at most one rounding step apart
    fp32 = torch.nn.functional.linear(x, w)
    assert (emulated - fp32).abs().max() > 0  # and it really is rounded


def test_emulated_autocast_matches_native_autocast(tiny_model):
    model, tok, task = tiny_model
    ids = torch.tensor([tok(it.prompt + task.trace(it))["input_ids"]
                        for it in task.split("train", 16)])
    m = copy.deepcopy(model)
    m.config._attn_implementation = "sdpa"
    with torch.no_grad():
        ref = torch.log_softmax(m(input_ids=ids).logits.float(), -1)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            native = torch.log_softmax(m(input_ids=ids).logits.float(), -1)
        e = copy.deepcopy(model)
        emulate_autocast(e, torch.bfloat16)
        emulated = torch.log_softmax(e(input_ids=ids).logits.float(), -1)
    err_native = (native - ref).abs().mean()
    err_emulated = (emulated - ref).abs().mean()
    assert 0.5 < err_emulated / err_native < 2.0  # same error magnitude against fp32


@pytest.mark.parametrize("lm_head_fp32", [False, True])
def test_exact_flow_has_zero_mismatch_and_trains(tiny_model, lm_head_fp32):
    """`exact`: the trainer's log-probs are bitwise the sampler's, and gradients still flow."""
    from suite.numerics.mismatch import mismatch_metrics
    from suite.rl import config
    from suite.rl.train import build_engines

    model, tok, task = tiny_model
    cfg = config.load(["tier=smoke", "precision=exact", f"lm_head_fp32={lm_head_fp32}"])
    trainer, engine, _ = build_engines(cfg, copy.deepcopy(model))
    engine.sync(trainer.model.state_dict())
    roll = engine.generate(_prompts(tok, task, 16), 30, 1.0, 1.0, torch.Generator().manual_seed(0))
    ids, attn = batch_tensors(roll.prompt_ids, roll.tokens, roll.mask)
    with torch.no_grad():
        logp, _, _ = trainer.score(Batch(ids, attn, roll.tokens, 1.0))
    assert torch.equal(logp * roll.mask, roll.logprobs)
    m = mismatch_metrics(logp, roll.logprobs, roll.mask)
    assert m["mismatch/kl_k3"] == 0.0 and m["mismatch/prob_diff/max"] == 0.0
    assert m["mismatch/seq_log_ratio/max_abs"] == 0.0
    logp, _, _ = trainer.score(Batch(ids, attn, roll.tokens, 1.0))
    (-(logp * roll.mask).sum()).backward()
    grads = {n: p.grad for n, p in trainer.model.named_parameters()}
    assert all(g is not None and g.abs().sum() > 0 for n, g in grads.items() if "layers.0" in n
               or "lm_head" in n)
    # The same weights through the ordinary trainer forward are *not* bitwise equal: that is the
    # mismatch.
    bf16 = config.load(["tier=smoke", "precision=bf16"])
    t2, e2, _ = build_engines(bf16, copy.deepcopy(model))
    with torch.no_grad():
        logp2, _, _ = t2.score(Batch(ids, attn, roll.tokens, 1.0))
    assert not torch.equal(logp2 * roll.mask, roll.logprobs)


def _step0_mismatch(model, tok, task, precision):
    from suite.numerics.mismatch import mismatch_metrics
    from suite.rl import config
    from suite.rl.train import build_engines

    trainer, engine, _ = build_engines(config.load(["tier=smoke", f"precision={precision}"]),
                                       copy.deepcopy(model))
    engine.sync(trainer.model.state_dict())
    roll = engine.generate(_prompts(tok, task, 16), 30, 1.0, 1.0, torch.Generator().manual_seed(0))
    ids, attn = batch_tensors(roll.prompt_ids, roll.tokens, roll.mask)
    logp, _, _ = trainer.score(Batch(ids, attn, roll.tokens, 1.0))
    return trainer, logp, roll, mismatch_metrics(logp.detach(), roll.logprobs, roll.mask)


def test_unified_fp8_shares_the_quantiser_and_trains(tiny_model):
    """Unified FP8 (Jet-RL): far less mismatch than bf16 training + FP8 rollout, and gradients
    reach the fp32 masters through FP8 GEMMs."""
    model, tok, task = tiny_model
    trainer, logp, roll, unified = _step0_mismatch(model, tok, task, "fp8")
    *_, baseline = _step0_mismatch(model, tok, task, "bf16_fp8rollout")
    assert (baseline["mismatch/kl_k3"] > 0
            and unified["mismatch/kl_k3"] < baseline["mismatch/kl_k3"] / 10)
    (-(logp * roll.mask).sum()).backward()
    q = trainer.model.model.layers[0].self_attn.q_proj.weight
    assert q.grad is not None and q.grad.dtype == torch.float32 and q.grad.abs().sum() > 0


@pytest.mark.parametrize("dtype", ["bf16", "fp16"])
def test_unified_controls_train_with_the_samplers_code(tiny_model, dtype):
    """The trainer-numerics controls: the trainer's full-sequence forward is the sampler's own pure
    low-precision code (its GEMM outputs and logits in that dtype, no fp32 residual stream), so only
    GEMM shapes differ from the sampler's: the mismatch is below the autocast trainer's of the same
    dtype (bf16: 75x on the small tier's policy with AMX kernels, `suite mismatch tier=small`;
    1.5-3.5x on this tiny one), and gradients reach the fp32 masters."""
    model, tok, task = tiny_model
    trainer, logp, roll, control = _step0_mismatch(model, tok, task, f"{dtype}_unified")
    *_, autocast = _step0_mismatch(model, tok, task, dtype)
    assert (trainer.unified_engine is not None and trainer.unified_engine.quant is None
            and trainer.exact_engine is None)
    want = str(resolve(dtype).trainer_dtype)
    assert {k: v for k, v in trainer.observe().items() if k in ("gemm_output", "logits")} == {
        "gemm_output": want, "logits": want}
    assert trainer.scaler.enabled == (dtype == "fp16")
    assert autocast["mismatch/kl_k3"] > 0 and control["mismatch/kl_k3"] < autocast["mismatch/kl_k3"]
    (-(logp * roll.mask).sum()).backward()
    q = trainer.model.model.layers[0].self_attn.q_proj.weight
    assert q.grad is not None and q.grad.dtype == torch.float32 and q.grad.abs().sum() > 0


def test_controls_stay_out_of_the_main_grids():
    from suite.experiments import grids
    from suite.numerics.precision import main_flows

    assert {n for n, f in FLOWS.items() if f.control} == {"bf16_unified", "fp16_unified"}
    # the 4-bit flows are a study of their own, out of the main grids too (tests/test_fp4.py)
    assert main_flows() == [n for n, f in FLOWS.items() if n not in ("bf16_unified", "fp16_unified")
                            and not f.fp4]
    assert grids.get("sanity")["axes"]["precision"] == main_flows()


@pytest.mark.parametrize("name", list(FLOWS))
def test_every_flow_scores_ragged_batches(tiny_model, name):
    """Left-padded (ragged) prompts give finite trainer log-probs and mismatch in every flow."""
    model, tok, task = tiny_model
    _, logp, roll, m = _step0_mismatch(model, tok, task, name)
    assert torch.isfinite(logp[roll.mask.bool()]).all()
    assert all(v == v for v in m.values())  # no NaN
    assert (m["mismatch/kl_k3"] == 0.0) == (name == "exact") or resolve(name).unified
