"""Exact values of suite/numerics/mismatch.py on tiny tensors (float64)."""

import math
import statistics

import pytest
import torch

from suite.numerics.mismatch import METRIC_KEYS, mismatch_metrics, token_mismatch

# sampler log-probs mu, B=2 sequences of 3 and 2 response tokens (one padded slot)
MU = [[-1.0, -2.0, -0.5], [-0.3, -1.2, 0.0]]
MASK = [[1, 1, 1], [1, 1, 0]]
EXPECTED_KEYS = {
    "mismatch/kl_k1",
    "mismatch/kl_k2",
    "mismatch/kl_k3",
    "mismatch/prob_diff/mean",
    "mismatch/prob_diff/max",
    "mismatch/prob_diff/std",
    "mismatch/logprob_diff/mean",
    "mismatch/logprob_diff/max",
    "mismatch/seq_log_ratio/mean_abs",
    "mismatch/seq_log_ratio/max_abs",
    "mismatch/seq_log_ratio/std",
    "mismatch/log_ppl_diff",
    "mismatch/ppl_ratio",
    "mismatch/chi2_token",
    "mismatch/chi2_seq",
    "mismatch/exp_abs_logprob_diff/mean",
}


def t(x):
    return torch.tensor(x, dtype=torch.float64)


def test_keys():
    assert set(METRIC_KEYS) == EXPECTED_KEYS
    out = mismatch_metrics(t(MU), t(MU), t(MASK))
    assert set(out) == EXPECTED_KEYS
    assert all(type(v) is float for v in out.values())


def test_identical_logprobs_give_exact_zeros():
    g = torch.Generator().manual_seed(0)
    mu = -torch.rand(3, 5, generator=g, dtype=torch.float64) * 4
    mask = torch.tensor([[1, 1, 1, 1, 0], [1, 0, 0, 0, 0], [1, 1, 1, 1, 1]])
    out = mismatch_metrics(mu.clone(), mu, mask)
    ones = {"mismatch/ppl_ratio", "mismatch/exp_abs_logprob_diff/mean"}
    for key, value in out.items():
        assert value == (1.0 if key in ones else 0.0), key


def test_known_perturbation():
    """log pi = log mu + 0.1 on every response token."""
    d = 0.1
    pi = [[v + d for v in row] for row in MU]
    out = mismatch_metrics(t(pi), t(MU), t(MASK))
    lens = [3, 2]
    prob_diffs = [math.exp(MU[b][i] + d) - math.exp(MU[b][i]) for b in range(2)
                  for i in range(lens[b])]
    want = {
        "mismatch/kl_k1": -d,
        "mismatch/kl_k2": 0.5 * d * d,
        "mismatch/kl_k3": math.exp(d) - d - 1,
        "mismatch/prob_diff/mean": sum(prob_diffs) / 5,
        "mismatch/prob_diff/max": max(prob_diffs),
        "mismatch/prob_diff/std": statistics.pstdev(prob_diffs),
        "mismatch/logprob_diff/mean": d,
        "mismatch/logprob_diff/max": d,
        "mismatch/seq_log_ratio/mean_abs": (0.3 + 0.2) / 2,
        "mismatch/seq_log_ratio/max_abs": 0.3,
        "mismatch/seq_log_ratio/std": 0.05,
        # trainer log-ppl is 0.1 lower than the sampler's on every sequence
        "mismatch/log_ppl_diff": -d,
        "mismatch/ppl_ratio": math.exp(-d),
        "mismatch/chi2_token": math.exp(2 * d) - 1,
        "mismatch/chi2_seq": (math.exp(0.6) + math.exp(0.4)) / 2 - 1,
        "mismatch/exp_abs_logprob_diff/mean": math.exp(d),
    }
    for key, value in want.items():
        assert out[key] == pytest.approx(value, rel=1e-9, abs=1e-14), key


def test_sign_conventions():
    """Trainer less confident than the sampler: k1 > 0 (estimates KL(mu||pi)), log_ppl_diff > 0."""
    pi = [[v - 0.2 for v in row] for row in MU]
    out = mismatch_metrics(t(pi), t(MU), t(MASK))
    assert out["mismatch/kl_k1"] == pytest.approx(0.2)
    assert out["mismatch/log_ppl_diff"] == pytest.approx(0.2)
    assert out["mismatch/ppl_ratio"] == pytest.approx(math.exp(0.2))
    assert out["mismatch/kl_k3"] == pytest.approx(math.exp(-0.2) + 0.2 - 1)


def test_mixed_signs_pool_tokens_and_sequences():
    """Per-token deltas +0.3, -0.1, 0 | +0.2, -0.4: token pooling vs sequence statistics."""
    deltas = [[0.3, -0.1, 0.0], [0.2, -0.4, 0.0]]
    pi = [[MU[b][i] + deltas[b][i] for i in range(3)] for b in range(2)]
    out = mismatch_metrics(t(pi), t(MU), t(MASK))
    toks = [0.3, -0.1, 0.0, 0.2, -0.4]
    assert out["mismatch/kl_k1"] == pytest.approx(-sum(toks) / 5)
    assert out["mismatch/kl_k2"] == pytest.approx(0.5 * sum(x * x for x in toks) / 5)
    assert out["mismatch/logprob_diff/max"] == pytest.approx(0.4)
    seq = [0.2, -0.2]
    assert out["mismatch/seq_log_ratio/mean_abs"] == pytest.approx(0.2)
    assert out["mismatch/seq_log_ratio/std"] == pytest.approx(0.2)
    # log_ppl_diff averages per-sequence means: -(0.2/3) and -(-0.2/2)
    assert out["mismatch/log_ppl_diff"] == pytest.approx((-0.2 / 3 + 0.1) / 2)
    assert out["mismatch/ppl_ratio"] == pytest.approx((math.exp(-0.2 / 3) + math.exp(0.1)) / 2)
    assert out["mismatch/chi2_seq"] == pytest.approx(
        (math.exp(2 * seq[0]) + math.exp(2 * seq[1])) / 2 - 1)
    assert out["mismatch/chi2_token"] == pytest.approx(sum(math.exp(2 * x) for x in toks) / 5 - 1)


def test_masked_tokens_are_ignored():
    pi = t([[v + 0.1 for v in row] for row in MU])
    base = mismatch_metrics(pi, t(MU), t(MASK))
    pi2, mu2 = pi.clone(), t(MU)
    pi2[1, 2], mu2[1, 2] = 5.0, -math.inf  # garbage under mask = 0
    assert mismatch_metrics(pi2, mu2, t(MASK)) == base
    pi3, mu3 = pi.clone(), t(MU)
    pi3[1, 2], mu3[1, 2] = math.nan, 3.0
    assert mismatch_metrics(pi3, mu3, torch.tensor(MASK, dtype=torch.bool)) == base


def test_empty_mask_gives_nan():
    out = mismatch_metrics(t(MU), t(MU), torch.zeros(2, 3))
    assert set(out) == EXPECTED_KEYS
    assert all(math.isnan(v) for v in out.values())


def test_empty_row_does_not_enter_sequence_stats():
    pi = [[v + 0.1 for v in row] for row in MU]
    mask = [[1, 1, 1], [0, 0, 0]]
    out = mismatch_metrics(t(pi), t(MU), t(mask))
    assert out["mismatch/seq_log_ratio/mean_abs"] == pytest.approx(0.3)
    assert out["mismatch/seq_log_ratio/std"] == 0.0
    assert out["mismatch/log_ppl_diff"] == pytest.approx(-0.1)


def test_chi2_seq_clamps_huge_log_ratio():
    """A sequence log-ratio of 1000 is clamped at 20 before exp, so chi2_seq stays finite."""
    mu = torch.full((1, 10), -101.0, dtype=torch.float64)
    pi = torch.full((1, 10), -1.0, dtype=torch.float64)
    out = mismatch_metrics(pi, mu, torch.ones(1, 10))
    assert out["mismatch/chi2_seq"] == pytest.approx(math.exp(40.0) - 1, rel=1e-12)
    assert all(math.isfinite(v) for v in out.values())


def test_kl_k3_and_ppl_ratio_are_not_clamped_as_in_verl():
    """verl's rollout_corr/k3_kl and ppl_ratio exponentiate the log-ratio as it is; so do ours (chi2
    clamps)."""
    pi = torch.tensor([[-0.5, -1.0]], dtype=torch.float64)
    # token log-ratio +50, then 0: means beyond 20
    mu = torch.tensor([[-50.5, -1.0]], dtype=torch.float64)
    out = mismatch_metrics(pi, mu, torch.ones(1, 2))
    assert out["mismatch/kl_k3"] == pytest.approx((math.expm1(50.0) - 50.0) / 2, rel=1e-12)
    assert out["mismatch/ppl_ratio"] == pytest.approx(math.exp(-25.0), rel=1e-12)
    # trainer 50 nats below the sampler on one token
    out = mismatch_metrics(mu, pi, torch.ones(1, 2))
    assert out["mismatch/ppl_ratio"] == pytest.approx(math.exp(25.0), rel=1e-12)
    assert out["mismatch/chi2_token"] == pytest.approx((math.exp(-40.0) + 1.0) / 2 - 1.0, rel=1e-12)


def test_low_precision_inputs_are_upcast():
    """bf16 inputs are converted to float64 before subtraction (no bf16 arithmetic)."""
    mu = torch.tensor([[-1.0, -2.0]], dtype=torch.bfloat16)
    pi = torch.tensor([[-1.0078125, -2.0]], dtype=torch.bfloat16)  # one bf16 ulp below -1
    out = mismatch_metrics(pi, mu, torch.ones(1, 2))
    assert out["mismatch/logprob_diff/max"] == 0.0078125


def test_token_mismatch():
    pi = t([[-0.9, -2.5, -0.5], [-0.3, -1.0, 7.0]])
    mu = t(MU)
    mu[1, 2] = -math.inf
    out = token_mismatch(pi, mu, t(MASK))
    want = t([[0.1, 0.5, 0.0], [0.0, 0.2, 0.0]])
    assert out.shape == (2, 3)
    assert torch.allclose(out, want, rtol=0, atol=1e-15)
    assert out[1, 2].item() == 0.0


# ---- anatomy ------------------------------------------------------------------------------
def test_anatomy_zero_for_identical_inputs():
    from suite.numerics.mismatch import mismatch_anatomy

    logp = torch.log(torch.tensor([[0.3, 0.95, 0.999, 0.6]]))
    out = mismatch_anatomy(logp, logp.clone(), torch.ones(1, 4), torch.rand(1, 4))
    assert all(out[f"anatomy/pos_q{q}/mean"] == 0.0 for q in range(1, 5))
    assert out["anatomy/mu_gt_pi_frac"] == 0.0
    assert math.isnan(out["anatomy/corr_entropy"]) and math.isnan(out["anatomy/top1pct_share"])


def test_anatomy_by_hand():
    """Two responses of 4 and 2 tokens; mismatch only on the last token of each."""
    from suite.numerics.mismatch import mismatch_anatomy

    pi = torch.tensor([[0.3, 0.6, 0.95, 0.999], [0.4, 0.7, 1.0, 1.0]])
    mu = pi.clone()
    mu[0, 3] = 0.999 * math.exp(0.2)  # log pi - log mu = -0.2 (sampler likelier)
    mu[1, 1] = 0.7 * math.exp(-0.1)  # +0.1
    mask = torch.tensor([[1, 1, 1, 1], [1, 1, 0, 0]])
    ent = torch.tensor([[0.1, 0.2, 0.3, 0.4], [0.5, 0.6, 9.0, 9.0]])
    out = mismatch_anatomy(pi.log(), mu.log(), mask, ent)
    # relative positions: row 0 -> 0, .25, .5, .75 (quarters 1..4); row 1 -> 0, .5 (quarters 1, 3)
    assert out["anatomy/pos_q1/mean"] == pytest.approx(0.0)
    assert out["anatomy/pos_q3/mean"] == pytest.approx(0.1 / 2)  # row0 t2 (0) and row1 t1 (0.1)
    assert out["anatomy/pos_q4/mean"] == pytest.approx(0.2)
    # trainer-prob bins over 6 tokens: <0.5: 0.3, 0.4; 0.5-0.9: 0.6, 0.7; 0.9-0.99: 0.95; >=0.99:
    # 0.999
    assert out["anatomy/pi_lt0.5/frac"] == pytest.approx(2 / 6)
    assert out["anatomy/pi_0.5-0.9/mean"] == pytest.approx(0.05)
    assert out["anatomy/pi_ge0.99/share"] == pytest.approx(0.2 / 0.3)
    assert out["anatomy/top1pct_share"] == pytest.approx(0.2 / 0.3)  # ceil(1% of 6) = 1 token
    assert out["anatomy/mu_gt_pi_frac"] == pytest.approx(1 / 6)
    a = torch.tensor([0, 0, 0, 0.2, 0, 0.1], dtype=torch.float64)
    e = torch.tensor([0.1, 0.2, 0.3, 0.4, 0.5, 0.6], dtype=torch.float64)
    assert out["anatomy/corr_entropy"] == pytest.approx(
        float(torch.corrcoef(torch.stack([a, e]))[0, 1]))


@pytest.mark.parametrize("quant", [None, "fp8"])
def test_an_engine_scoring_its_own_samples_with_emulated_gemms_is_exactly_zero(tiny_model, quant):
    """What the unified FP8 flow's zero measures where GEMMs are emulated: the trainer runs the
    sampler's own code (suite/numerics/engine.py score_full), and with fp32-accumulated emulated
    GEMMs the full-sequence pass reproduces the decode loop bit for bit, for plain bf16 as for FP8.
    It is "trainer = sampler code", not a property of FP8; with native low-precision kernels
    (shape-dependent accumulation) it is not zero."""
    from suite.numerics.engine import TorchEngine
    from suite.numerics.precision import _cpu_flags
    from suite.numerics.scoring import batch_tensors
    from suite.tasks.registry import prompt_ids

    model, tok, task = tiny_model
    prompts = [prompt_ids(tok, it) for it in task.split("train", 8) for _ in range(4)]
    for backend in ("emulated", "native"):
        if backend == "native" and not _cpu_flags() & {"amx_bf16", "avx512_bf16"}:
            continue  # native bf16 GEMMs are only a different numerics where the CPU has them
        sampler = TorchEngine(model.config, torch.bfloat16, backend, quant=quant)
        sampler.sync(model.state_dict())
        roll = sampler.generate(prompts, 60, 1.0, 1.0, torch.Generator().manual_seed(0))
        ids, attn = batch_tensors(roll.prompt_ids, roll.tokens, roll.mask)
        scorer = TorchEngine(model.config, torch.bfloat16, backend, quant=quant)
        with torch.no_grad():
            logp, _ = scorer.score_full(ids, attn, roll.tokens.shape[1], roll.tokens, 1.0,
                                        scorer.training_weights(dict(model.named_parameters())))
        m = mismatch_metrics(logp, roll.logprobs, roll.mask)
        if backend == "emulated":
            assert m["mismatch/kl_k3"] == 0.0 and m["mismatch/prob_diff/max"] == 0.0
        else:
            assert m["mismatch/prob_diff/max"] > 0.0


def test_mechanism_metrics_against_a_hand_computation():
    """Two sequences (3 and 1 tokens): token weights (2, 1, 1 | 0.5), sequence weights (2 | 0.5)."""
    from suite.numerics.mismatch import mechanism_metrics

    mu = torch.full((2, 3), -1.0)
    pi = mu + torch.tensor([[math.log(2.0), 0.0, 0.0], [-math.log(2.0), 0.0, 0.0]])
    mask = torch.tensor([[1.0, 1.0, 1.0], [1.0, 0.0, 0.0]])
    ent = torch.tensor([[1.0, 2.0, 3.0], [5.0, 9.0, 9.0]])
    out = mechanism_metrics(pi, mu, mask, ent)
    assert (out["mech/is_tok/mean"] == pytest.approx(4.5 / 4)
            and out["mech/is_tok/min"] == pytest.approx(0.5))
    assert out["mech/is_tok/ess"] == pytest.approx(4.5 ** 2 / (4 * 6.25))
    assert (out["mech/is_seq/max"] == pytest.approx(2.0)
            and out["mech/is_seq/ess"] == pytest.approx(2.5 ** 2 / (2 * 4.25)))
    assert out["mech/seq_log_ratio/len_1-16/mean_abs"] == pytest.approx(math.log(2.0))
    assert out["mech/seq_log_ratio/len_1-16/n"] == 2.0
    # masked positions left out
    assert out["mech/entropy/pos_1-16"] == pytest.approx((1 + 2 + 3 + 5) / 4)
    same = mechanism_metrics(mu, mu.clone(), mask, ent)
    assert (same["mech/is_tok/ess"] == 1.0 and same["mech/is_seq/ess"] == 1.0
            and same["mech/is_tok/max"] == 1.0)
    assert mechanism_metrics(mu, mu, torch.zeros(2, 3), ent) == {}
