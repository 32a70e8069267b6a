"""Dynamic loss scaling: skip an inf/nan step, report NaN grad norm, back off, recover."""

import copy
import math

import pytest
import torch

from suite import dist
from suite.numerics.loss_scaling import LossScaler
from suite.numerics.precision import resolve
from suite.numerics.scoring import Batch
from suite.numerics.trainer import Trainer, TrainerOptions
from suite.rl.schema import OptimConfig


def test_loss_scaler_backoff_and_growth():
    s = LossScaler(enabled=True, init_scale=1024.0, growth_interval=3)
    s.update(found_inf=True)
    assert s.scale == 512.0 and s.skipped == 1
    for _ in range(3):
        s.update(found_inf=False)
    assert s.scale == 1024.0 and s.skipped == 1
    off = LossScaler(enabled=False)
    assert off.scale == 1.0


def _unscale_per_parameter(scaler, params):
    """The definition: divide each gradient by the scale, then ask whether it is finite (a host read
    each)."""
    found = False
    for p in params:
        if p.grad is not None:
            if scaler.enabled:
                p.grad.div_(scaler.scale)
            found = found or not bool(torch.isfinite(p.grad).all())
    return found


def _params_with_grads(device="cpu"):
    """fp32 and bf16 parameters (two groups of the fused kernel) whose gradients span fp32's range,
    subnormal quotients included, and one parameter without a gradient."""
    g = torch.Generator().manual_seed(0)
    out = []
    for n, dtype in ((1000, torch.float32), (7, torch.float32), (64, torch.bfloat16),
                     (3, torch.float32)):
        p = torch.nn.Parameter(torch.zeros(n, dtype=dtype, device=device))
        mag = torch.logspace(-40 if dtype == torch.float32 else -30, 30, n)
        p.grad = (torch.randn(n, generator=g) * mag).to(dtype).to(device)
        out.append(p)
    out.append(torch.nn.Parameter(torch.zeros(2, device=device)))  # no gradient
    return out


@pytest.mark.parametrize("scale", [2.0**16, 3.0, 0.5])
@pytest.mark.parametrize("enabled", [True, False])
@pytest.mark.parametrize("poison", [None, "inf", "nan", "overflow"])
def test_unscale_equals_the_per_parameter_check(scale, enabled, poison):
    """LossScaler.unscale_ (one fused check, one read) against its definition: the same gradients
    bit for bit and the same verdict, for GradScaler's powers of two, a scale that is not one
    (divided, not multiplied by a rounded inverse), and a scale below 1, where dividing a finite
    3e38 overflows: an inf the step must skip on."""
    params = _params_with_grads()
    poke = {"inf": float("inf"), "nan": float("nan"), "overflow": 3e38}.get(poison)
    if poke is not None:
        params[1].grad[3] = poke
    ref = [torch.nn.Parameter(p.detach().clone()) for p in params]
    for r, p in zip(ref, params):
        r.grad = None if p.grad is None else p.grad.clone()
    want = _unscale_per_parameter(LossScaler(enabled, init_scale=scale), ref)
    got = LossScaler(enabled, init_scale=scale).unscale_(params)
    assert got == want
    assert want == (poison in ("inf", "nan") or (poison == "overflow" and enabled and scale < 1))
    for r, p in zip(ref, params):
        if p.grad is None:
            assert r.grad is None
        else:
            torch.testing.assert_close(p.grad, r.grad, rtol=0, atol=0, equal_nan=True)


@pytest.mark.parametrize("device", ["meta", pytest.param("cuda", marks=pytest.mark.skipif(
    not torch.cuda.is_available(), reason="CUDA's sync debug mode needs a GPU"))])
@pytest.mark.parametrize("scale", [2.0**16, 3.0])
def test_unscale_reads_the_device_once(monkeypatch, scale, device):
    """One host read per step, not one per parameter: on the meta device every host read (bool,
    item, a copy to the CPU) raises, and so does every synchronising call under CUDA's sync debug
    mode "error"; the per-parameter check fails there, and unscale_ gets through with the single
    read of its flag, which dist.any_rank does (counted here; it answers 'finite')."""
    params = _params_with_grads(device)
    reads = []
    monkeypatch.setattr(dist, "any_rank", lambda flag, world: reads.append(flag.device.type)
                        or False)
    if device == "cuda":
        torch.cuda.synchronize()
        torch.cuda.set_sync_debug_mode("error")
    try:
        with pytest.raises(RuntimeError, match="meta|synchroniz"):
            _unscale_per_parameter(LossScaler(True, init_scale=scale), params)
        assert LossScaler(True, init_scale=scale).unscale_(params) is False
    finally:
        if device == "cuda":
            torch.cuda.set_sync_debug_mode("default")
    assert reads == [device]


def test_fp16_trainer_skips_injected_inf_and_recovers(tiny_model):
    model, tok, task = tiny_model
    trainer = Trainer(copy.deepcopy(model), resolve("fp16"), "emulated", OptimConfig(lr=1e-3))
    ids = torch.tensor([tok(it.prompt + task.trace(it))["input_ids"]
                        for it in task.split("train", 4)])
    attn = torch.ones_like(ids)
    targets = ids[:, -10:]

    def loss_fn(poison=False):
        logp, _, _ = trainer.score(Batch(ids, attn, targets, 1.0))
        loss = -logp.mean()
        return (loss * float("inf") if poison else loss), {}

    scale0 = trainer.scaler.scale
    before = [p.detach().clone() for p in trainer.params]
    out = trainer.step(lambda: loss_fn(poison=True))
    assert math.isnan(out["train/grad_norm"]) and out["train/skipped"] == 1.0
    assert trainer.scaler.scale == scale0 / 2 and trainer.scaler.skipped == 1
    assert all(torch.equal(a, b) for a, b in zip(before, trainer.params))  # the step was skipped
    out = trainer.step(loss_fn)
    assert math.isfinite(out["train/grad_norm"]) and out["train/skipped"] == 0.0
    # and training goes on
    assert any(not torch.equal(a, b) for a, b in zip(before, trainer.params))


def test_scaled_gradients_equal_unscaled(tiny_model):
    """Scaling then unscaling gives the fp32 gradient of the unscaled loss (no underflow here)."""
    model, tok, task = tiny_model
    ids = torch.tensor([tok(it.prompt + task.trace(it))["input_ids"]
                        for it in task.split("train", 4)])
    grads = []
    for enabled in (False, True):
        t = Trainer(copy.deepcopy(model), resolve("fp32"), "native",
                    OptimConfig(lr=1e-3, grad_clip=1e9))
        t.scaler = LossScaler(enabled=enabled, init_scale=2.0**10)
        t.opt.step = lambda: None  # keep the parameters; look at the gradients only
        t.step(lambda: (-t.score(Batch(ids, torch.ones_like(ids), ids[:, -10:], 1.0))[0].mean(),
                        {}))
        grads.append(torch.cat([p.grad.flatten() for p in t.params]))
    assert torch.allclose(grads[0], grads[1], rtol=1e-5, atol=1e-9)


def test_micro_batches_accumulate_the_minibatch_gradient(tiny_model):
    """Gradient accumulation over micro-batches (weights from suite.rl.train.accumulation_weights)
    gives the gradient of the whole minibatch's loss, for a seq-mean and for the token-mean
    aggregation."""
    from suite.rl.algos import get_algorithm, policy_loss
    from suite.rl.step import accumulation_weights, micro_batches

    model, tok, task = tiny_model
    ids = torch.tensor([tok(it.prompt + task.trace(it))["input_ids"]
                        for it in task.split("train", 6)])
    attn, R = torch.ones_like(ids), 10
    mask = torch.ones(6, R)
    mask[0, 7:] = 0  # unequal lengths: token-mean weights must count tokens
    adv = torch.tensor([1.0, -0.5, 0.25, -1.0, 0.5, 0.0])
    for name in ("grpo", "dapo"):
        algo = get_algorithm(name)
        grads = []
        for size in (None, 4):
            t = Trainer(copy.deepcopy(model), resolve("fp32"), "native",
                        OptimConfig(lr=1e-3, grad_clip=1e9))
            t.opt.step = lambda: None
            with torch.no_grad():
                old, _, _ = t.score(Batch(ids, attn, ids[:, -R:], 1.0))

            def fn(c):
                logp, _, _ = t.score(Batch(ids[c], attn[c], ids[c, -R:], 1.0))
                return policy_loss(algo, logp, old[c], old[c], adv[c], mask[c], norm_len=R)
            micro = micro_batches(torch.arange(6), size)
            t.step(
                [(lambda c=c: fn(c), w)
                 for c, w in zip(micro, accumulation_weights(micro, mask, algo.agg))])
            grads.append(torch.cat([p.grad.flatten() for p in t.params]))
        assert torch.allclose(grads[0], grads[1], rtol=1e-4, atol=1e-8), name


def test_per_micro_batch_padding_scores_fewer_columns_to_the_same_numbers(tiny_model):
    """trim_padding: a micro-batch whose rows need fewer columns than the rollout batch (shorter
    prompts, shorter responses) is scored over those columns only; log-probs, entropies and the
    gradient equal the padded batch's up to fp32 summation order, and the dropped response positions
    come back as 0 in the (B, R) shape.

    Tolerance: both forwards round every op to fp32 (eps 1.2e-7) and differ only in summation order
    and in attention rows of other lengths; through two layers of hidden 64 and a 20-token
    vocabulary that is a few hundred rounded ops per log-prob, so 1e-5 absolute on values of order 1
    (a bf16 rounding would be 4e-3)."""
    from suite.numerics.scoring import Batch, batch_tensors

    model, tok, task = tiny_model
    items = task.split("train", 4)
    prompts = [tok(it.prompt)["input_ids"] for it in items]
    # one long prompt: the other rows are left-padded to it
    prompts[0] = prompts[0] + prompts[1][:3]
    R = 12
    g = torch.Generator().manual_seed(0)
    tokens = torch.randint(3, len(tok), (4, R), generator=g)
    mask = torch.zeros(4, R)
    for row, n in enumerate((12, 5, 3, 7)):  # right padding: rows 1-2 end early
        mask[row, :n] = 1
    ids, attn = batch_tensors(prompts, tokens, mask)
    seen = []
    out = {}
    for trim in (False, True):
        t = Trainer(copy.deepcopy(model), resolve("fp32"), "native", OptimConfig(lr=1e-3),
                    TrainerOptions(trim_padding=trim))
        t.model.register_forward_pre_hook(lambda m, a, kw: seen.append(kw["input_ids"].shape[1]),
                                          with_kwargs=True)
        c = torch.tensor([1, 2])  # the micro-batch of the two short rows
        logp, ent, _ = t.score(Batch(ids[c], attn[c], tokens[c], 1.0))
        (-(logp * mask[c]).sum()).backward()
        out[trim] = logp.detach(), ent.detach(), torch.cat([p.grad.flatten() for p in t.params])
    # 3 prompt + 7 response columns fewer
    assert seen[0] == ids.shape[1] and seen[1] == ids.shape[1] - 3 - (R - 5)
    m = mask[[1, 2]].bool()
    for full, trimmed in zip(out[False][:2], out[True][:2]):
        assert trimmed.shape == full.shape == (2, R)
        torch.testing.assert_close(trimmed[m], full[m], rtol=0, atol=1e-5)
        assert (trimmed[:, 5:] == 0).all()  # beyond the micro-batch's longest response
    torch.testing.assert_close(out[True][2], out[False][2], rtol=1e-4, atol=1e-6)
