"""Truncated sampling (top-k / top-p): the kept set, the kept mass, and what the trainer does about
it."""

import copy
import math

import pytest
import torch

from suite.numerics import truncation
from suite.numerics.engine import TorchEngine
from suite.numerics.scoring import Batch, batch_tensors
from suite.rl import config
from suite.rl.train import build_engines


def test_keep_mask_by_hand():
    p = torch.tensor([[0.5, 0.3, 0.15, 0.05]])
    logp = p.log()
    # top-p 0.75: 0.5 alone is short of it, 0.5 + 0.3 reaches it -> the first two (a top_p exactly
    # at a partial sum is decided by fp32 rounding of the cumulative sum, as in every engine)
    assert truncation.keep_mask(logp, 0.75, 0).tolist() == [[True, True, False, False]]
    assert truncation.keep_mask(logp, 0.85, 0).tolist() == [[True, True, True, False]]
    assert truncation.keep_mask(logp, 1.0, 3).tolist() == [[True, True, True, False]]
    # top-k 3 then top-p 0.9 on the renormalised top 3 (0.5, 0.3, 0.15) / 0.95: 0.842 < 0.9 -> all
    # three
    assert truncation.keep_mask(logp, 0.9, 3).tolist() == [[True, True, True, False]]
    # the top token always
    assert truncation.keep_mask(logp, 1e-6, 0).tolist() == [[True, False, False, False]]


def test_renormalised_log_prob_and_mass_by_hand():
    logp = torch.tensor([[0.5, 0.3, 0.15, 0.05]]).log()
    kept = truncation.kept_ids(truncation.keep_mask(logp, 0.75, 0))
    assert kept.tolist() == [[0, 1]]
    lp, log_mass = truncation.renormalised(logp, torch.tensor([1]), kept)
    assert (lp.exp().item() == pytest.approx(0.3 / 0.8, rel=1e-6)
            and log_mass.exp().item() == pytest.approx(0.8, rel=1e-6))
    padded = torch.tensor([[0, 1, -1]])  # -1 padding is not a kept token
    assert truncation.renormalised(logp, torch.tensor([1]), padded)[0].item() == lp.item()


def _rollout_and_scores(tiny_model, precision, top_p=0.8, top_k=0):
    model, tok, task = tiny_model
    cfg = config.load(["tier=smoke", f"precision={precision}", f"sampling.top_p={top_p}",
                       f"sampling.top_k={top_k}"])
    trainer, engine, _ = build_engines(cfg, copy.deepcopy(model))
    engine.sync(trainer.model.state_dict())
    prompts = [tok(it.prompt)["input_ids"] for it in task.split("train", 8)]
    roll = engine.generate(prompts, 12, 1.0, top_p, torch.Generator().manual_seed(0), top_k=top_k)
    ids, attn = batch_tensors(roll.prompt_ids, roll.tokens, roll.mask)
    with torch.no_grad():
        renorm = trainer.score(Batch(ids, attn, roll.tokens, 1.0, kept=roll.kept))[0]
        plain = trainer.score(Batch(ids, attn, roll.tokens, 1.0))[0]
    return roll, renorm, plain


def test_exact_flow_renormalised_ratio_is_exactly_one_and_unrenormalised_is_the_kept_mass(
        tiny_model):
    """The exact flow's trainer replays the sampler's kernels: renormalised over the sampler's kept
    set the ratio is 1 bit for bit; scoring the whole vocabulary instead (the common bug) the ratio
    is the kept mass."""
    roll, renorm, plain = _rollout_and_scores(tiny_model, "exact")
    m = roll.mask.bool()
    # the nucleus really cut something
    assert roll.kept is not None and (roll.kept_mass[m] < 1).any()
    assert torch.equal(renorm[m], roll.logprobs[m])  # ratio exactly 1
    ratio = (plain - roll.logprobs)[m].double().exp()
    # log M computed once (logsumexp in fp32), exponentiated for the record: equal up to fp32
    # rounding of exp/log
    assert torch.allclose(ratio, roll.kept_mass[m].double(), rtol=4 * 2**-24, atol=0)
    assert ratio.mean().item() < 0.999


@pytest.mark.parametrize("top_k", [0, 5])
def test_fp32_renormalised_ratio_is_one_to_fp32_rounding(tiny_model, top_k):
    """fp32 flow: trainer (HF full sequence) and sampler (KV cache) agree to fp32 rounding, so the
    renormalised ratio is 1 and the unrenormalised one the kept mass, both to the same tolerance as
    the engines' fp32 agreement."""
    roll, renorm, plain = _rollout_and_scores(tiny_model, "fp32", top_k=top_k)
    m = roll.mask.bool()
    # fp32 log-probs of a 2-layer, 64-wide model: a few ulps of O(1) logits, summed over a 64-long
    # dot product
    tol = 64 * 2**-23
    assert (renorm - roll.logprobs)[m].abs().max().item() < tol
    assert ((plain - roll.logprobs)[m] - roll.kept_mass[m].log()).abs().max().item() < tol
    assert abs((plain - roll.logprobs)[m].exp().mean().item()
               - roll.kept_mass[m].mean().item()) < tol


def test_truncation_keeps_eval_tokens_and_records_nothing_without_it(tiny_model):
    """The kept set is what the old nucleus rule kept: the same tokens; no truncation records no
    kept set."""
    model, tok, task = tiny_model
    engine = TorchEngine(model.config, torch.float32)
    engine.sync(model.state_dict())
    prompts = [tok(it.prompt)["input_ids"] for it in task.split("train", 8)]
    full = engine.generate(prompts, 10, 1.0, 1.0, torch.Generator().manual_seed(0))
    assert full.kept is None and full.kept_mass is None
    cut = engine.generate(prompts, 10, 1.0, 0.5, torch.Generator().manual_seed(0))
    m = cut.mask.bool()
    assert (cut.kept_mass[m] >= 0.5 - 1e-6).all() and (cut.kept_mass[m] <= 1 + 1e-6).all()
    assert ((cut.kept >= 0).sum(-1)[m] >= 1).all()
    kept_tok = (cut.kept == cut.tokens[..., None]).any(-1)
    assert kept_tok[m].all()  # every sampled token is in its kept set


def test_fp8_kv_cache_changes_only_the_sampler(tiny_model):
    """kv_cache=fp8: the sampler's K/V are E4M3 values (x 1.0 scale); the bf16 trainer is unchanged,
    so the mismatch grows; the exact flow's replay applies the same cache and stays exact."""
    from suite.numerics.mismatch import mismatch_metrics

    model, tok, task = tiny_model
    prompts = [tok(it.prompt)["input_ids"] for it in task.split("train", 8)]
    k3 = {}
    for kv in ("auto", "fp8"):
        for precision in ("bf16", "exact"):
            cfg = config.load(["tier=smoke", f"precision={precision}", f"kv_cache={kv}"])
            trainer, engine, _ = build_engines(cfg, copy.deepcopy(model))
            assert engine.kv_quant == (None if kv == "auto" else "fp8")
            engine.sync(trainer.model.state_dict())
            roll = engine.generate(prompts, 12, 1.0, 1.0, torch.Generator().manual_seed(0))
            ids, attn = batch_tensors(roll.prompt_ids, roll.tokens, roll.mask)
            with torch.no_grad():
                logp = trainer.score(Batch(ids, attn, roll.tokens, 1.0))[0]
            k3[kv, precision] = mismatch_metrics(logp, roll.logprobs, roll.mask)["mismatch/kl_k3"]
    assert k3["auto", "exact"] == 0.0 and k3["fp8", "exact"] == 0.0
    assert k3["fp8", "bf16"] > k3["auto", "bf16"]


def test_fake_quant_kv_is_e4m3_with_unit_scale():
    from suite.numerics.fp8 import fake_quant_kv

    x = torch.tensor([0.0, 1.0, 1.0625, 1.1, 500.0, -3e-3], dtype=torch.bfloat16)
    q = fake_quant_kv(x)
    assert q.dtype == torch.bfloat16
    # 3 mantissa bits: 1.0625 rounds to even (1.0), 1.1 to 1.125; 448 saturates; 3e-3 is a subnormal
    # (2^-9 steps)
    assert q.tolist()[:5] == [0.0, 1.0, 1.0, 1.125, 448.0]
    assert q[5].item() == pytest.approx(-2 * 2**-9, abs=2**-10)
    assert math.isfinite(q.float().sum().item())
