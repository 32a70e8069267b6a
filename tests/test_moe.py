"""The mixture-of-experts policy (hypothesis H4): routing semantics, sampler = trainer in fp32,
routing replay."""

import copy
import math

import pytest
import torch

from suite.numerics import moe
from suite.numerics.sampling import sequence_seeds
from suite.numerics.scoring import Batch, batch_tensors


def test_route_against_a_hand_computation_and_replay():
    """softmax (0.5, 0.3, 0.2) -> top-2 {0, 1} with weights (0.625, 0.375); replaying {2, 1}
    renormalises the router's own probabilities of those experts, (0.4, 0.6); -1 keeps the own
    choice."""
    logits = torch.tensor([[0.5, 0.3, 0.2]]).log()
    w, idx, own = moe.route(logits, 2)
    assert idx.tolist() == [[0, 1]] and own.tolist() == [[0, 1]]
    assert torch.allclose(w, torch.tensor([[0.625, 0.375]]))
    w, idx, own = moe.route(logits, 2, torch.tensor([[2, 1]]))
    assert (idx.tolist() == [[2, 1]] and own.tolist() == [[0, 1]]
            and torch.allclose(w, torch.tensor([[0.4, 0.6]])))
    w, idx, _ = moe.route(logits.repeat(2, 1), 2, torch.tensor([[2, 1], [-1, -1]]))
    assert idx.tolist() == [[2, 1], [0, 1]]


def test_experts_is_the_weighted_sum_of_swiglu_experts():
    g = torch.Generator().manual_seed(0)
    E, H, Di = 3, 4, 5
    x, gate_up, down = torch.randn(2, H,
                                   generator=g), torch.randn(
                                       E, 2 * Di, H,
                                       generator=g), torch.randn(E, H, Di, generator=g)
    idx, w = torch.tensor([[0, 2], [1, 0]]), torch.tensor([[0.7, 0.3], [0.5, 0.5]])

    def expert(e, v):
        a, b = (gate_up[e] @ v).chunk(2)
        return down[e] @ (torch.nn.functional.silu(a) * b)
    want = torch.stack([0.7 * expert(0, x[0]) + 0.3 * expert(2, x[0]), 0.5 * expert(1, x[1])
                        + 0.5 * expert(0, x[1])])
    assert torch.allclose(moe.experts(x, gate_up, down, idx, w, lambda v, m: v @ m.T), want,
                          atol=1e-5)
    assert math.isnan(moe.flip_fraction(torch.full((1, 2, 1, 2), -1), idx.view(1, 2, 1, 2),
                                        torch.ones(1, 2).bool()))


@pytest.fixture(scope="module")
def tiny_moe(tiny_model):
    from suite.rl.policy import PolicySpec, build_model

    _, tok, task = tiny_model
    model = build_model(PolicySpec(hidden=64, layers=2, heads=4, kv_heads=2, mlp=96, experts=4,
                                   top_k=2), len(tok))
    return model, tok, task


def test_our_block_computes_what_mixtral_computes(tiny_moe):
    """The replacement forward (the sampler's routing semantics and the replay hook) equals
    transformers' own MixtralSparseMoeBlock in fp32."""
    model, _, _ = tiny_moe
    block = copy.deepcopy(model.model.layers[0].mlp)
    h = torch.randn(2, 5, 64, generator=torch.Generator().manual_seed(1))
    want = block(h)
    got = moe.block_forward(block, h, layer=0, routing=moe.Routing(),
                            linear=torch.nn.functional.linear)
    assert torch.allclose(got, want, atol=1e-6)


def _engines(model, precision, replay=False):
    from suite.rl import config
    from suite.rl.train import build_engines

    cfg = config.load(["tier=smoke", f"precision={precision}", "policy.experts=4",
                       f"routing_replay={replay}"])
    trainer, engine, _ = build_engines(cfg, copy.deepcopy(model))
    engine.sync(trainer.model.state_dict())
    return trainer, engine


def _rollout(engine, tok, task):
    prompts = [tok(it.prompt)["input_ids"] for it in task.split("train", 8)]
    roll = engine.generate(prompts, 20, 1.0, 1.0, sequence_seeds(0, 1, list(range(4)), 2))
    ids, attn = batch_tensors(roll.prompt_ids, roll.tokens, roll.mask)
    return roll, ids, attn


def test_fp32_sampler_and_trainer_agree_and_replay_forces_the_experts(tiny_moe):
    """fp32: the sampler's log-probs equal the HF trainer's, every position's experts are recorded,
    the trainer routes like the sampler (0 flips). Replaying *other* experts (each shifted by one)
    changes the trainer's log-probs to exactly what the sampler's own code computes with those
    experts, and gradients still reach the router (R3 keeps the routing weights differentiable)."""
    model, tok, task = tiny_moe
    trainer, engine = _engines(model, "fp32", replay=True)
    roll, ids, attn = _rollout(engine, tok, task)
    B, S = ids.shape
    assert roll.routes.shape == (B, S, 2, 2) and bool((roll.routes[:, :-1] >= 0).all())
    assert bool((roll.routes[:, -1] == -1).all())  # the last token never went through a forward
    with torch.no_grad():
        lp, _, _ = trainer.score(Batch(ids, attn, roll.tokens, 1.0))
    assert torch.allclose(lp * roll.mask, roll.logprobs, atol=1e-5)
    assert moe.flip_fraction(roll.routes, trainer.chosen_routes(B), attn.bool()) == 0.0
    other = torch.where(roll.routes >= 0, (roll.routes + 1) % 4, roll.routes)
    forced, _, _ = trainer.score(Batch(ids, attn, roll.tokens, 1.0, routes=other))
    w = engine.training_weights(dict(trainer.model.named_parameters()))
    with torch.no_grad():
        ref, _ = engine.score_full(ids, attn, roll.tokens.shape[1], roll.tokens, 1.0, w, other)
    m = roll.mask.bool()
    assert (forced[m] - lp[m]).abs().max() > 1e-3 and torch.allclose(forced[m], ref[m], atol=1e-5)
    (-(forced * roll.mask).sum()).backward()
    assert trainer.model.model.layers[0].mlp.gate.weight.grad.abs().sum() > 0


def test_bf16_routing_replay_uses_the_samplers_experts(tiny_moe):
    """bf16: with routing replay the trainer runs the sampler's experts; its own choice is still
    recorded."""
    model, tok, task = tiny_moe
    trainer, engine = _engines(model, "bf16", replay=True)
    roll, ids, attn = _rollout(engine, tok, task)
    seen = []
    real = moe.experts
    try:
        moe.experts = lambda x, gu, d, idx, w, lin: (seen.append(idx),
                                                     real(x, gu, d, idx, w, lin))[1]
        with torch.no_grad():
            trainer.score(Batch(ids, attn, roll.tokens, 1.0, routes=roll.routes))
    finally:
        moe.experts = real
    B, S = ids.shape
    used = torch.stack([i.view(B, S, -1) for i in seen], 2)
    rec = roll.routes >= 0
    assert torch.equal(used[rec], roll.routes[rec])
    assert trainer.chosen_routes(B).shape == roll.routes.shape


@pytest.mark.parametrize("args, match",
                         [(["routing_replay=true"], "routing_replay: needs a mixture-of-experts "
                                                    "policy"),
                          (["policy.experts=4", "precision=bf16_fp8rollout"],
                           "FP8 flows quantise the dense projections only"),
                          (["policy.experts=1"], "policy.experts: must be 0"),
                          (["policy.experts=4", "policy.top_k=5"], "policy.top_k"),
                          (["policy.experts=4", "engine=vllm"], "engine=torch"),])
def test_bad_moe_settings_are_refused(args, match):
    from suite.rl import config

    with pytest.raises(ValueError, match=match):
        config.load(["tier=smoke", *args])


def test_dense_policies_keep_their_cache_keys():
    """The MoE fields are left out of a dense spec's key: the small tier's policy keeps the key its
    committed references were built under (results/reference/*/sanity/*/env.json policy.path ends in
    arith3-ca124315afb8)."""
    from suite.rl import config
    from suite.rl.data import policy_spec
    from suite.rl.policy import policy_key
    from suite.tasks.registry import get_task

    cfg = config.load(["tier=small"])
    assert policy_key(policy_spec(cfg), get_task("arith3")) == "ca124315afb8"
    moe_cfg = config.load(["tier=small", "policy.experts=4"])
    assert policy_key(policy_spec(moe_cfg), get_task("arith3")) != "ca124315afb8"


def test_a_moe_run_with_routing_replay_end_to_end(tmp_path):
    """A run of a mixture-of-experts policy in bf16 with routing replay: it completes and logs the
    routing disagreement per step in mechanism.jsonl; a rerun resumes to the same files. (A random
    MoE policy given as policy.path, every prompt kept: the warm start of the embedded MoE takes
    minutes, `regime=moe` in the grid.)"""
    from suite.results import read_jsonl
    from suite.rl import config
    from suite.rl.policy import PolicySpec, build_model, build_tokenizer
    from suite.rl.train import run
    from suite.tasks.registry import get_task

    tok = build_tokenizer(get_task("arith").alphabet)
    policy = tmp_path / "moe-policy"
    build_model(PolicySpec(hidden=64, layers=2, heads=4, kv_heads=2, mlp=96, experts=4),
                len(tok)).save_pretrained(policy)
    tok.save_pretrained(policy)
    cfg = config.load(["tier=smoke", f"out={tmp_path}", "precision=bf16", f"policy.path={policy}",
                       "perfectible.lo=0", "perfectible.pool=16", "routing_replay=true", "steps=2"])
    d = run(cfg)
    mech = read_jsonl(d / "mechanism.jsonl")
    assert [r["step"] for r in mech] == [1, 2] and all(0.0 <= r["mech/moe/route_flip_frac"] <= 1.0
                                                       for r in mech)
    before = (d / "metrics.jsonl").read_bytes()
    run(cfg)
    assert (d / "metrics.jsonl").read_bytes() == before


def test_routing_replay_on_a_dense_model_is_refused_once_loaded(tmp_path, tiny_model):
    """A model given by path is only known to be dense once loaded: build_engines refuses it, before
    any compute."""
    from suite.rl import config
    from suite.rl.train import build_engines

    model, _, _ = tiny_model
    cfg = config.load(["tier=smoke", "routing_replay=true", f"policy.path={tmp_path}"])
    with pytest.raises(ValueError, match="routing_replay: the policy has no mixture-of-experts "
                                         "layers"):
        build_engines(cfg, copy.deepcopy(model))
