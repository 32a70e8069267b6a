"""The dose-response dial: a calibrated perturbation of the sampler's distribution
(suite/numerics/perturbation.py)."""

import math

import pytest
import torch

from suite.numerics.engine import TorchEngine
from suite.numerics.mismatch import mismatch_metrics
from suite.numerics.perturbation import Perturbation, perturb
from suite.numerics.sampling import sequence_seeds
from suite.numerics.scoring import batch_tensors


def test_lowp_bias_against_a_hand_computation():
    """p = (0.7, 0.2, 0.1), bias ln 2 below 0.15: the tail token's weight doubles, then
    renormalise."""
    logp = torch.tensor([[0.7, 0.2, 0.1]]).log()
    got = perturb(logp, Perturbation("lowp_bias", math.log(2.0), 0.15)).exp()
    assert torch.allclose(got, torch.tensor([[0.7, 0.2, 0.2]]) / 1.1, atol=1e-7)


def test_noise_against_a_hand_computation_and_the_identities():
    logp = torch.tensor([[0.5, 0.3, 0.2]]).log()
    z = torch.tensor([[1.0, -1.0, 0.0]])
    w = torch.tensor([[0.5 * math.exp(0.1), 0.3 * math.exp(-0.1), 0.2]])
    assert torch.allclose(perturb(logp, Perturbation("noise", 0.1), z).exp(), w / w.sum(),
                          atol=1e-7)
    assert torch.allclose(perturb(logp, Perturbation("noise", 0.0), z), logp, atol=1e-7)
    assert perturb(logp, Perturbation()) is logp  # off: the sampler's log-probs are untouched
    with pytest.raises(ValueError, match="inject.kind"):
        perturb(logp, Perturbation("typo", 1.0))


def _sample(model, tok, task, perturbation, seeds=None):
    engine = TorchEngine(model.config, torch.float32, perturbation=perturbation)
    engine.sync(model.state_dict())
    prompts = [tok(it.prompt)["input_ids"] for it in task.split("train", 8)]
    seeds = sequence_seeds(0, 1, list(range(4)), 2) if seeds is None else seeds
    return engine.generate(prompts, 20, 1.0, 1.0, seeds), prompts


def _clean_logprobs(model, roll):
    ids, attn = batch_tensors(roll.prompt_ids, roll.tokens, roll.mask)
    pos = (attn.cumsum(1) - 1).clamp(min=0)
    with torch.no_grad():
        logits = model(input_ids=ids, attention_mask=attn, position_ids=pos).logits.float()
    R = roll.tokens.shape[1]
    logp = torch.log_softmax(logits[:, -R - 1:-1], -1)
    return logp.gather(-1, roll.tokens[..., None])[..., 0] * roll.mask


@pytest.mark.parametrize("kind", ["noise", "lowp_bias"])
def test_an_fp32_sampler_with_a_perturbation_shows_a_mismatch_that_grows_with_the_scale(
    tiny_model, kind):
    """The sampler records the perturbed log-probs it drew from; the clean fp32 trainer does not see
    the perturbation, so the measured mismatch is ~0 without it and grows with the scale. (The
    random policy is near uniform over 17 tokens, so the tail threshold sits just above 1/17 to
    split them.)"""
    model, tok, task = tiny_model
    k3 = []
    for scale in (0.0, 0.1, 0.5):
        roll, _ = _sample(model, tok, task, Perturbation(kind, scale, 0.06))
        k3.append(mismatch_metrics(_clean_logprobs(model, roll), roll.logprobs,
                                   roll.mask)["mismatch/kl_k3"])
    assert k3[0] < 1e-10 < k3[1] < k3[2]


def test_the_noise_of_a_sequence_does_not_depend_on_its_batch(tiny_model):
    """Each sequence draws its noise from its own seed, as its tokens: sampling half the batch alone
    gives the same tokens and (to fp32 rounding) log-probs for that half (what data-parallel ranks
    rely on)."""
    model, tok, task = tiny_model
    p = Perturbation("noise", 0.5)
    seeds = sequence_seeds(0, 1, list(range(4)), 2)
    full, prompts = _sample(model, tok, task, p, seeds)
    engine = TorchEngine(model.config, torch.float32, perturbation=p)
    engine.sync(model.state_dict())
    half = engine.generate(prompts[4:], 20, 1.0, 1.0, seeds[4:])
    n = half.tokens.shape[1]
    assert torch.equal(full.tokens[4:, :n], half.tokens)
    # fp32 GEMMs of another batch size
    assert torch.allclose(full.logprobs[4:, :n], half.logprobs, atol=1e-5)
    clean, _ = _sample(model, tok, task, Perturbation(), seeds)
    assert not torch.equal(full.logprobs, clean.logprobs)


@pytest.mark.parametrize("args, match", [
    (["inject.scale=0.1"], "inject.scale: needs inject.kind"),
    (["inject.kind=nois", "inject.scale=0.1"], "inject.kind: must be one of"),
    (["inject.kind=noise", "inject.scale=-1"], "inject.scale: must be >= 0"),
    (["inject.kind=lowp_bias", "inject.threshold=1.5"], "inject.threshold"),
    (["inject.kind=noise", "engine=vllm"], "engine=vllm has no such hook"),
])
def test_bad_injections_are_refused_before_compute(args, match):
    from suite.rl import config

    with pytest.raises(ValueError, match=match):
        config.load(["tier=smoke", *args])


def test_held_out_evaluation_scores_the_policy_not_the_perturbed_sampler(tiny_model, monkeypatch):
    """A dose-response run trains on perturbed rollouts; its held-out accuracy must be the policy's
    own, or a run that fails on its perturbed rollouts cannot be told from a policy that learned
    less. The evaluation of an engine with a strong tail bias draws the clean engine's tokens, and
    the bias is back afterwards."""
    from suite.rl import step

    model, tok, task = tiny_model
    texts = []
    monkeypatch.setattr(step, "grade", lambda t, items, got, truncated, workers: texts.append(got)
                        or [0.0] * len(got))
    settings = {"samples": 2, "splits": ["test"], "prompts": 8, "temperature": 1.0, "top_p": 1.0}
    bent = Perturbation("lowp_bias", 5.0, 0.06)
    for p in (Perturbation(), bent):
        engine = TorchEngine(model.config, torch.float32, perturbation=p)
        engine.sync(model.state_dict())
        step.evaluate(engine, tok, task, settings, 12, seed=7)
    assert texts[0] == texts[1]
    assert engine.perturbation == bent
    # the same seeds in training: the bias changes the tokens
    clean, _ = _sample(model, tok, task, Perturbation())
    assert not torch.equal(clean.tokens, _sample(model, tok, task, bent)[0].tokens)
