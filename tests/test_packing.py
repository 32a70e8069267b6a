"""Sequence packing (``packing=true``, suite/numerics/packing.py): the trainer's HF forward scores a
micro-batch as one row. Same log-probs, entropies and gradients as the padded forward up to fp32
summation order, pads 0, no token sees another sequence's, the truncation and chunking paths, a
training step, MoE routing replay, the refusals."""

import copy
import math

import pytest
import torch

from suite.numerics.precision import resolve
from suite.numerics.scoring import Batch, batch_tensors
from suite.numerics.trainer import Trainer, TrainerOptions
from suite.rl.schema import OptimConfig

R = 12
LENGTHS = (12, 5, 3, 7)  # response lengths: rows 1-3 end early (right padding)


def _batch(tok, task):
    """Four rows, one long prompt (the others left-padded to it), responses of LENGTHS
    (right-padded)."""
    items = task.split("train", 4)
    prompts = [tok(it.prompt)["input_ids"] for it in items]
    prompts[0] = prompts[0] + prompts[1][:3]
    tokens = torch.randint(3, len(tok), (4, R), generator=torch.Generator().manual_seed(0))
    mask = torch.zeros(4, R)
    for row, n in enumerate(LENGTHS):
        mask[row, :n] = 1
    ids, attn = batch_tensors(prompts, tokens, mask)
    return ids, attn, tokens, mask, prompts


def _tolerance(model, seq: int) -> float:
    """How far two fp32 forwards that differ only in summation order (GEMM shapes, attention over N
    instead of S keys) may put a log-prob or an entropy apart; derived from the model, not tuned on
    a machine.

    A sum of n fp32 terms in any order is within about sqrt(n) u of the exact sum, relative to the
    sum of the terms' magnitudes (u = 2^-24; Higham and Mary 2019, "A new approach to probabilistic
    rounding error analysis", the bound that holds with high probability, the worst case being n u).
    Along one log-prob the reductions follow each
    other: per layer the q/k/v (hidden), the attention scores (head_dim), softmax and value sums
    (seq), the output, gate/up (hidden) and down (mlp) projections, then the head (hidden) and the
    log-softmax and entropy (vocab). Their errors add; two orders differ by twice one's; every value
    along the path is O(1) after RMSNorm at this random init, and log-probs and entropies are at
    most ln(vocab) + 1 in magnitude, the factor applied. Here that is ~5e-5, against ~2e-7 seen on
    CPUs and ~4e-3 for one bf16 rounding, so a wrong mask or position (O(1)) fails."""
    c = model.config
    d = c.hidden_size // c.num_attention_heads
    per_layer = [c.hidden_size, d, seq, seq, c.hidden_size, c.hidden_size, c.intermediate_size]
    path = per_layer * c.num_hidden_layers + [c.hidden_size, c.vocab_size, c.vocab_size]
    u = 2.0 ** -24
    return 2 * u * sum(math.sqrt(n) for n in path) * (math.log(c.vocab_size) + 1)


def _trainer(model, packing, precision="fp32", backend="native", **kw):
    return Trainer(copy.deepcopy(model), resolve(precision), backend,
                   OptimConfig(lr=1e-3, grad_clip=1e9), TrainerOptions(packing=packing, **kw))


def test_packed_equals_padded_in_fp32_and_pads_are_zero(tiny_model):
    """fp32, SDPA: one packed row of exactly the attended tokens; log-probs, entropies, gradients
    and the full log-distribution equal the padded forward's within the derived tolerance at every
    response token; every position after a row's EOS comes back as 0."""
    model, tok, task = tiny_model
    ids, attn, tokens, mask, _ = _batch(tok, task)
    tol = _tolerance(model, ids.shape[1])
    out, shapes = {}, []
    for packing in (False, True):
        t = _trainer(model, packing)
        t.model.register_forward_pre_hook(
            lambda m, a, kw: shapes.append(tuple(kw["input_ids"].shape)), with_kwargs=True)
        logp, ent, _ = t.score(Batch(ids, attn, tokens, 1.0))
        (-(logp * mask).sum()).backward()
        grad = torch.cat([p.grad.flatten() for p in t.params])
        out[packing] = logp.detach(), ent.detach(), grad, t.log_distribution(ids, attn, R, 1.0)
    # log-probs, then the log-distribution
    assert shapes == [tuple(ids.shape)] * 2 + [(1, int(attn.sum()))] * 2
    m = mask.bool()
    for padded, packed in zip(out[False][:2], out[True][:2]):
        assert packed.shape == padded.shape == (4, R)
        torch.testing.assert_close(packed[m], padded[m], rtol=0, atol=tol)
        assert (packed[~m] == 0).all()
    # the gradient is a sum of these log-probs' derivatives through the same reductions: the same
    # relative bound
    g_pad, g_pack = out[False][2], out[True][2]
    assert float((g_pack - g_pad).norm() / g_pad.norm()) <= tol
    torch.testing.assert_close(out[True][3][m], out[False][3][m], rtol=0, atol=tol)
    assert (out[True][3][~m] == 0).all()


def test_packed_sequences_do_not_see_each_other(tiny_model):
    """Block-diagonal attention: changing the response of the second sequence changes its own
    log-probs and leaves every other sequence's bitwise unchanged, the later ones included
    (causality alone would protect only the earlier ones). Exact, not within a tolerance: the shapes
    are the same, a GEMM's output row depends on its own input row only, and a masked key's
    attention weight is exactly 0, so the other sequences' sums are the same sums of the same
    numbers."""
    model, tok, task = tiny_model
    ids, attn, tokens, mask, prompts = _batch(tok, task)
    t = _trainer(model, True)
    changed = tokens.clone()
    # other ids, same length
    changed[1, :LENGTHS[1]] = 3 + (tokens[1, :LENGTHS[1]] - 2) % (len(tok) - 3)
    ids2, _ = batch_tensors(prompts, changed, mask)
    with torch.no_grad():
        a, _, _ = t.score(Batch(ids, attn, tokens, 1.0))
        b, _, _ = t.score(Batch(ids2, attn, changed, 1.0))
    assert not torch.equal(a[1], b[1])
    for row in (0, 2, 3):
        assert torch.equal(a[row], b[row]), row


def test_packed_truncation_and_chunks(tiny_model):
    """Truncated sampling (``kept``: renormalised over the sampler's kept ids) packed equals padded
    within the tolerance; ``logprob_chunk`` over the packed positions gives bitwise the unchunked
    values (positions are independent rows of the log-softmax)."""
    model, tok, task = tiny_model
    ids, attn, tokens, mask, _ = _batch(tok, task)
    g = torch.Generator().manual_seed(1)
    kept = torch.stack([torch.randperm(len(tok), generator=g)[:6] for _ in range(4 * R)]).view(
        4, R, 6)
    kept[..., 0] = tokens  # the sampled token is always in the kept set
    kept[0, :, 5] = -1  # a smaller kept set: -1 pads it
    tol = _tolerance(model, ids.shape[1])
    with torch.no_grad():
        padded = _trainer(model, False).score(Batch(ids, attn, tokens, 1.0, kept=kept))
        packed = _trainer(model, True).score(Batch(ids, attn, tokens, 1.0, kept=kept))
        chunked = _trainer(model, True,
                           logprob_chunk=5).score(Batch(ids, attn, tokens, 1.0, kept=kept))
        full = _trainer(model, True).score(Batch(ids, attn, tokens, 1.0))
    m = mask.bool()
    torch.testing.assert_close(packed[0][m], padded[0][m], rtol=0, atol=tol)
    assert (packed[0][m] > full[0][m]).all()  # renormalised over fewer tokens than the vocabulary
    assert (packed[0][~m] == 0).all()
    assert torch.equal(chunked[0], packed[0]) and torch.equal(chunked[1], packed[1])


def test_a_packed_training_step_changes_the_weights(tiny_model):
    """Gradients flow through the packed row (and through bf16 autocast): a step changes the
    weights, the loss is finite, and a second step lowers it."""
    model, tok, task = tiny_model
    ids, attn, tokens, mask, _ = _batch(tok, task)
    t = _trainer(model, True, precision="bf16", backend="emulated")
    before = [p.detach().clone() for p in t.params]

    def loss():
        logp, _, _ = t.score(Batch(ids, attn, tokens, 1.0))
        return -(logp * mask).sum() / mask.sum(), {}
    with torch.no_grad():
        first = float(loss()[0])
    out = t.step(loss)
    assert math.isfinite(out["train/grad_norm"]) and out["train/skipped"] == 0.0
    assert any(not torch.equal(a, b) for a, b in zip(before, t.params))
    with torch.no_grad():
        assert float(loss()[0]) < first


def test_packed_routing_replay_and_the_experts_chosen(tiny_model):
    """A mixture of experts packed: the replayed experts are those of each kept position (packed
    log-probs equal the padded ones under the same replayed routes), and the experts the trainer
    chose come back in the padded (B, S, L, k) layout, -1 at the pads, equal to the padded forward's
    at every attended position."""
    from suite.rl.policy import PolicySpec, build_model

    _, tok, task = tiny_model
    moe_model = build_model(PolicySpec(hidden=64, layers=2, heads=4, kv_heads=2, mlp=96, experts=4,
                                       top_k=2), len(tok))
    ids, attn, tokens, mask, _ = _batch(tok, task)
    B, S = ids.shape
    g = torch.Generator().manual_seed(2)
    routes = torch.stack([torch.randperm(4, generator=g)[:2] for _ in range(B * S * 2)]).view(
        B, S, 2, 2)
    out = {}
    for packing in (False, True):
        t = _trainer(moe_model, packing)
        with torch.no_grad():
            forced = t.score(Batch(ids, attn, tokens, 1.0, routes=routes))[0]
            own = t.score(Batch(ids, attn, tokens, 1.0))[0]
        out[packing] = forced, own, t.chosen_routes(B)
    m, keep = mask.bool(), attn.bool()
    tol = _tolerance(moe_model, S)
    torch.testing.assert_close(out[True][0][m], out[False][0][m], rtol=0, atol=tol)
    # the replay did force other experts
    assert (out[True][0][m] - out[True][1][m]).abs().max() > 1e-3
    chosen = out[True][2]
    assert chosen.shape == (B, S, 2, 2) and bool((chosen[~keep] == -1).all())
    assert torch.equal(chosen[keep], out[False][2][keep])


@pytest.mark.parametrize("overrides, words", [
    (["packing=true", "trim_padding=true"], "packing: drops every pad"),
    (["packing=true", "precision=fp8"], "packing: precision fp8 trains through the sampler's own "
                                        "engine code"),
    (["packing=true", "precision=exact"], "packing: precision exact trains through the sampler's "
                                          "own engine code"),
])
def test_packing_is_refused_where_it_cannot_apply(overrides, words):
    from suite.rl import config

    with pytest.raises(ValueError, match=words):
        config.load(["tier=smoke", *overrides])


def test_packing_is_in_the_config_hash_and_replaces_the_presets_trim_padding():
    from suite.results import config_hash
    from suite.rl import compose, config

    off, on = (config.to_dict(config.load(["tier=smoke", f"packing={v}"]))
               for v in ("false", "true"))
    assert config_hash(off) != config_hash(on)
    preset = config.resolve(compose.from_overrides(["model=r1d-1.5b", "packing=true"]))
    assert preset.packing and not preset.trim_padding
    assert config.resolve(compose.from_overrides(["model=r1d-1.5b"])).trim_padding
