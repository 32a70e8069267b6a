"""Exact math of suite/rl/algos.py on tiny tensors, against hand computations.

The reference below is written from arXiv 2510.26788 (Sec. 3) and the cited papers per algorithm
*name*, with plain python floats and loops; it does not call suite.rl.algos, so a wrong table entry,
a wrong surrogate or a wrong weight shows up as a mismatch. All tensors are float64.
"""

import dataclasses
import math

import pytest
import torch

from suite.rl.algos import (
    AGG_MODES,
    ALGORITHMS,
    Algorithm,
    aggregate,
    compute_advantages,
    get_algorithm,
    policy_loss,
)

# ---------------------------------------------------------------------------- the spec,
# independently Defaults of the published sanity test for the Precision-RL rows (clip 0.2/0.28, C =
# 3, Dr.GRPO advantage, token sum / max length), the GSPO paper's clip for gspo, and the classic
# settings for grpo_vanilla / dr_grpo / dapo.
PREC = dict(adv="mean", agg="seq-mean-token-sum-norm", clip=(0.2, 0.28), C=3.0)
SPEC = {
    "grpo": dict(PREC, sampler=False),
    "grpo_token_tis": dict(PREC, sampler=True),
    "grpo_seq_tis": dict(PREC, sampler=True),
    "grpo_seq_mis": dict(PREC, sampler=True),
    "pg_seq_is": dict(PREC, sampler=True),
    "pg_seq_tis": dict(PREC, sampler=True),
    "pg_seq_mis": dict(PREC, sampler=True),
    "gspo": dict(adv="std", agg="seq-mean-token-mean", clip=(3e-4, 4e-4), sampler=False),
    "grpo_vanilla": dict(adv="std", agg="seq-mean-token-mean", clip=(0.2, 0.2), sampler=False),
    "dr_grpo": dict(adv="mean", agg="seq-mean-token-sum-norm", clip=(0.2, 0.2), sampler=False),
    "dapo": dict(adv="std", agg="token-mean", clip=(0.2, 0.28), sampler=False),
}


def ppo_clip(A, r, dr, lo, hi):
    """max(-A r, -A clip(r, 1-lo, 1+hi)) and its derivative w.r.t. log pi (dr = d r / d log pi)."""
    rc = min(max(r, 1 - lo), 1 + hi)
    if -A * rc > -A * r:  # the clipped branch wins: constant in theta, zero gradient
        return -A * rc, 0.0
    return -A * r, -A * dr


def reference_token(name, A, lp, old, mu, seq):
    """(loss_t, d loss_t / d log pi_t) for one response token, straight from the published table."""
    lo, hi = SPEC[name]["clip"]
    C = SPEC[name].get("C", 3.0)
    r = math.exp(lp - old)  # pi_theta / pi_theta'
    rho_t = math.exp(old - mu)  # pi_theta' / mu
    rho, w, s = seq["rho"], seq["w"], seq["s"]
    if name in ("grpo", "grpo_vanilla", "dr_grpo", "dapo"):
        return ppo_clip(A, r, r, lo, hi)
    if name == "grpo_token_tis":
        v, d = ppo_clip(A, r, r, lo, hi)
        return v * min(rho_t, C), d * min(rho_t, C)
    if name == "grpo_seq_tis":
        v, d = ppo_clip(A, r, r, lo, hi)
        return v * min(rho, C), d * min(rho, C)
    if name == "grpo_seq_mis":
        v, d = ppo_clip(A, r, r, lo, hi)
        c = rho if rho <= C else 0.0
        return v * c, d * c
    if name == "pg_seq_is":
        return -A * w * lp, -A * w
    if name == "pg_seq_tis":
        return -A * min(w, C) * lp, -A * min(w, C)
    if name == "pg_seq_mis":
        c = w if w <= C else 0.0
        return -A * c * lp, -A * c
    if name == "gspo":
        # ratio_t = sg(s) pi_t / sg(pi_t): value s, d ratio_t / d log pi_t = s
        return ppo_clip(A, s, s, lo, hi)
    raise KeyError(f"no hand reference for {name!r}")


def reference(name, lp, old, mu, adv, mask, norm_len):
    """Loss and gradient w.r.t. log pi by explicit loops over sequences and tokens."""
    B, T = len(lp), len(lp[0])
    agg = SPEC[name]["agg"]
    n_all = sum(sum(row) for row in mask)
    loss, grad = 0.0, [[0.0] * T for _ in range(B)]
    for b in range(B):
        toks = [t for t in range(T) if mask[b][t]]
        seq = {
            "rho": math.exp(sum(old[b][t] - mu[b][t] for t in toks)),  # prod_t pi_theta'/mu
            "w": math.exp(sum(lp[b][t] - mu[b][t] for t in toks)),  # pi_theta(y)/mu(y)
            "s": math.exp(sum(lp[b][t] - old[b][t] for t in toks) / len(toks)),  # GSPO
        }
        coef = {
            "token-mean": 1.0 / n_all,
            "seq-mean-token-sum": 1.0 / B,
            "seq-mean-token-mean": 1.0 / (B * len(toks)),
            "seq-mean-token-sum-norm": 1.0 / (B * norm_len),
        }[agg]
        for t in toks:
            v, d = reference_token(name, adv[b], lp[b][t], old[b][t], mu[b][t], seq)
            loss += coef * v
            grad[b][t] = coef * d
    return loss, grad


# ---------------------------------------------------------------------------- inputs
MASK = [[1, 1, 1], [1, 1, 0]]  # B=2, T=3, one padded position
ADV = [1.0, -0.5]
NORM_LEN = 4
PAD = float("nan")  # stands for the pad entry; the tensors get garbage there

SCENARIOS = {
    # every PPO ratio inside [0.8, 1.28], every weight below C
    "mild": dict(
        lp=[[-1.0, -2.0, -0.5], [-0.3, -1.2, PAD]],
        old=[[-1.05, -1.9, -0.55], [-0.25, -1.3, PAD]],
        mu=[[-1.1, -1.85, -0.6], [-0.2, -1.25, PAD]],
    ),
    # PPO clipping at (0,0) and (1,1); token rho(0,1) = e^1.4 > C; sequence 0 has
    # rho = e^1.55 > C and w = e^1.7 > C; GSPO clips both sequences
    "extreme": dict(
        lp=[[-0.5, -2.0, -1.0], [-0.3, -2.5, PAD]],
        old=[[-1.0, -1.6, -1.05], [-0.35, -2.0, PAD]],
        mu=[[-1.2, -3.0, -1.0], [-0.4, -2.2, PAD]],
    ),
}


def tensors(sc):
    """Tensors for a scenario, with hostile values in the padded slot (must be ignored)."""
    lp = torch.tensor(sc["lp"], dtype=torch.float64)
    old = torch.tensor(sc["old"], dtype=torch.float64)
    mu = torch.tensor(sc["mu"], dtype=torch.float64)
    lp[1, 2], old[1, 2], mu[1, 2] = 3.0, -math.inf, math.nan
    return (
        lp.requires_grad_(True),
        old,
        mu,
        torch.tensor(ADV, dtype=torch.float64),
        torch.tensor(MASK, dtype=torch.float64),
    )


def run(name, sc, **overrides):
    lp, old, mu, adv, mask = tensors(SCENARIOS[sc])
    algo = get_algorithm(name, **overrides)
    loss, metrics = policy_loss(algo, lp, old, mu, adv, mask, NORM_LEN)
    (grad,) = torch.autograd.grad(loss, lp)
    return loss, grad, metrics


# ---------------------------------------------------------------------------- every table entry
def test_table_has_exactly_the_specified_entries():
    assert set(ALGORITHMS) == set(SPEC)


@pytest.mark.parametrize("name", sorted(SPEC))
def test_table_defaults(name):
    a, spec = ALGORITHMS[name], SPEC[name]
    assert a.name == name
    assert a.advantage == spec["adv"]
    assert a.agg == spec["agg"]
    assert (a.clip_low, a.clip_high) == spec["clip"]
    assert a.uses_sampler_logp is spec["sampler"]
    if spec["sampler"]:
        assert a.C == 3.0
    assert "arXiv" in a.source


@pytest.mark.parametrize("scenario", sorted(SCENARIOS))
@pytest.mark.parametrize("name", sorted(SPEC))
def test_loss_and_grad_match_hand_reference(name, scenario):
    sc = SCENARIOS[scenario]
    loss, grad, metrics = run(name, scenario)
    want_loss, want_grad = reference(name, sc["lp"], sc["old"], sc["mu"], ADV, MASK, NORM_LEN)
    assert loss.item() == pytest.approx(want_loss, rel=1e-12, abs=1e-14)
    assert torch.allclose(grad, torch.tensor(want_grad, dtype=torch.float64), rtol=1e-12,
                          atol=1e-14)
    assert grad[1, 2].item() == 0.0  # the padded slot (lp=3, old=-inf, mu=nan) gets nothing
    assert metrics["loss/policy"] == pytest.approx(want_loss, rel=1e-12, abs=1e-14)


def test_reference_exercises_nontrivial_gradients():
    """Guard against a vacuous comparison: the scenarios give non-zero gradients."""
    for name in SPEC:
        _, grad, _ = run(name, "mild")
        assert grad.abs().sum() > 0, name


# ---------------------------------------------------------------------------- pinned numbers
def test_ppo_clipping_gives_zero_gradient():
    _, grad, metrics = run("grpo", "extreme")
    # (0,0): r = e^0.5 = 1.65 > 1.28 with A = +1 -> clipped; (1,1): r = e^-0.5 = 0.61 < 0.8 with A <
    # 0 -> clipped
    assert grad[0, 0].item() == 0.0 and grad[1, 1].item() == 0.0
    # (0,1): r = e^-0.4 below 1 - 0.2 with A > 0: PPO keeps the unclipped branch
    assert grad[0, 1].item() == pytest.approx(-math.exp(-0.4) / (2 * NORM_LEN), rel=1e-12)
    assert metrics["ppo/clip_frac"] == pytest.approx(2 / 5)


def test_clip_high_is_asymmetric():
    # r = e^0.22 = 1.246 with A = +1: inside grpo's [0.8, 1.28] (gradient flows) but above
    # dr_grpo's symmetric 1 + 0.2 (clipped, zero gradient).
    lp = torch.tensor([[0.22 - 1.0]], dtype=torch.float64, requires_grad=True)
    old = torch.tensor([[-1.0]], dtype=torch.float64)
    mask, adv = torch.ones(1, 1, dtype=torch.float64), torch.ones(1, dtype=torch.float64)
    for name, want in (("grpo", -math.exp(0.22) / NORM_LEN), ("dr_grpo", 0.0)):
        loss, _ = policy_loss(ALGORITHMS[name], lp, old, None, adv, mask, NORM_LEN)
        (g,) = torch.autograd.grad(loss, lp)
        assert g.item() == pytest.approx(want, rel=1e-12, abs=0.0), name


def test_token_tis_truncates_at_C():
    _, grad, metrics = run("grpo_token_tis", "extreme")
    # (0,1): rho_t = e^(-1.6+3.0) = e^1.4 = 4.06 -> weight 3; r = e^-0.4 unclipped, A = 1
    assert grad[0, 1].item() == pytest.approx(-math.exp(-0.4) * 3.0 / (2 * NORM_LEN), rel=1e-12)
    assert metrics["is/truncated_frac"] == pytest.approx(1 / 5)
    assert metrics["is/masked_frac"] == 0.0
    assert metrics["is/weight/max"] == pytest.approx(math.exp(1.4), rel=1e-12)  # before truncation
    assert metrics["is/applied/max"] == 3.0  # after: what verl and TRL report


def test_grpo_seq_mis_masks_whole_sequence():
    loss, grad, metrics = run("grpo_seq_mis", "extreme")
    # sequence 0: rho = e^(0.2 + 1.4 - 0.05) = e^1.55 = 4.7 > 3 -> every token masked
    assert grad[0].abs().sum().item() == 0.0
    # sequence 1 kept with weight rho = e^(0.05 + 0.2); token (1,0): r = e^0.05 unclipped, A = -0.5
    rho1 = math.exp(0.25)
    assert grad[1, 0].item() == pytest.approx(0.5 * math.exp(0.05) * rho1 / (2 * NORM_LEN),
                                              rel=1e-12)
    # the loss is sequence 1 alone: tokens (1,0) unclipped and (1,1) clipped at 0.8
    want = (0.5 * math.exp(0.05) + 0.5 * 0.8) * rho1 / (2 * NORM_LEN)
    assert loss.item() == pytest.approx(want, rel=1e-12)
    assert metrics["is/masked_frac"] == pytest.approx(0.5)
    assert metrics["is/truncated_frac"] == 0.0


def test_grpo_seq_tis_truncates_sequence_weight():
    _, grad, _ = run("grpo_seq_tis", "extreme")
    assert grad[0, 1].item() == pytest.approx(-math.exp(-0.4) * 3.0 / (2 * NORM_LEN), rel=1e-12)


def test_pg_seq_mis_zero_gradient_above_C():
    loss, grad, metrics = run("pg_seq_mis", "extreme")
    # sequence 0: w = exp(sum(lp - mu)) = e^(0.7 + 1.0 + 0.0) = e^1.7 = 5.5 > 3 -> masked
    assert grad[0].abs().sum().item() == 0.0
    w1 = math.exp(0.1 - 0.3)  # sequence 1, kept
    assert grad[1, 0].item() == pytest.approx(0.5 * w1 / (2 * NORM_LEN), rel=1e-12)
    assert grad[1, 1].item() == pytest.approx(0.5 * w1 / (2 * NORM_LEN), rel=1e-12)
    assert loss.item() == pytest.approx(0.5 * w1 * (-0.3 - 2.5) / (2 * NORM_LEN), rel=1e-12)
    assert metrics["is/masked_frac"] == pytest.approx(0.5)
    # ESS of the applied weights [0, w1]: (0 + w1)^2 / (2 * (0 + w1^2)) = 1/2
    assert metrics["is/ess"] == pytest.approx(0.5, rel=1e-12)
    assert metrics["is/applied/min"] == 0.0 and metrics["is/applied/max"] == pytest.approx(
        w1, rel=1e-12)
    assert metrics["is/weight/max"] == pytest.approx(math.exp(1.7), rel=1e-12)


def test_pg_seq_tis_weight_equals_C():
    _, grad, metrics = run("pg_seq_tis", "extreme")
    # w = e^1.7 truncated to C = 3: d/d log pi of -A * 3 * log pi, over B * norm_len
    assert torch.equal(grad[0], torch.full((3,), -3.0 / (2 * NORM_LEN), dtype=torch.float64))
    assert metrics["is/truncated_frac"] == pytest.approx(0.5)
    # raw, before truncation
    assert metrics["is/weight/max"] == pytest.approx(math.exp(1.7), rel=1e-12)
    w1 = math.exp(-0.2)
    assert metrics["is/ess"] == pytest.approx((3.0 + w1) ** 2 / (2 * (9.0 + w1**2)), rel=1e-12)
    assert metrics["is/applied/mean"] == pytest.approx((3.0 + w1) / 2, rel=1e-12)
    assert metrics["is/applied/max"] == 3.0 and metrics["is/applied/min"] == pytest.approx(
        w1, rel=1e-12)


def test_pg_seq_is_weights_and_ess():
    _, grad, metrics = run("pg_seq_is", "extreme")
    w0, w1 = math.exp(1.7), math.exp(-0.2)
    assert grad[0, 2].item() == pytest.approx(-w0 / (2 * NORM_LEN), rel=1e-12)  # no truncation
    assert metrics["is/weight/mean"] == pytest.approx((w0 + w1) / 2, rel=1e-12)
    assert metrics["is/weight/min"] == pytest.approx(w1, rel=1e-12)
    assert metrics["is/ess"] == pytest.approx((w0 + w1) ** 2 / (2 * (w0**2 + w1**2)), rel=1e-12)
    assert metrics["is/truncated_frac"] == 0.0 and metrics["is/masked_frac"] == 0.0


def test_pg_weight_uses_current_trainer_not_old():
    """w = pi_theta / mu: moving old_logp must not change a PG loss or gradient."""
    lp, old, mu, adv, mask = tensors(SCENARIOS["extreme"])
    loss_a, _ = policy_loss(ALGORITHMS["pg_seq_is"], lp, old, mu, adv, mask, NORM_LEN)
    loss_b, _ = policy_loss(ALGORITHMS["pg_seq_is"], lp, None, mu, adv, mask, NORM_LEN)
    assert loss_a.item() == loss_b.item()


def test_gspo_sequence_ratio():
    loss, grad, metrics = run("gspo", "mild")
    # s_b = exp(mean_t(lp - old)): sequence 0 mean (0.05 - 0.1 + 0.05) / 3 = 0, sequence 1 (-0.05 +
    # 0.1) / 2
    s0, s1 = 1.0, math.exp(0.025)
    assert metrics["gspo/seq_ratio/mean"] == pytest.approx((s0 + s1) / 2, rel=1e-12)
    # s0 inside [1-3e-4, 1+4e-4]; s1 = 1.025 above it but A < 0 keeps the unclipped branch.
    # seq-mean-token-mean: every token of a sequence gets -A * s / (n_b * B)
    assert torch.allclose(grad[0], torch.full((3,), -s0 / (3 * 2), dtype=torch.float64), rtol=1e-12)
    assert torch.allclose(grad[1, :2], torch.full((2,), 0.5 * s1 / (2 * 2), dtype=torch.float64),
                          rtol=1e-12)
    assert loss.item() == pytest.approx((-s0 + 0.5 * s1) / 2, rel=1e-12)
    assert metrics["ppo/clip_frac"] == 0.0


def test_gspo_clipped_sequences_get_zero_gradient():
    _, grad, metrics = run("gspo", "extreme")
    # s0 = e^0.05 > 1 + 4e-4 with A > 0, s1 = e^-0.225 < 1 - 3e-4 with A < 0: both clipped
    assert grad.abs().sum().item() == 0.0
    assert metrics["ppo/clip_frac"] == 1.0


def test_gspo_never_reads_the_sampler():
    lp, old, mu, adv, mask = tensors(SCENARIOS["mild"])
    a, _ = policy_loss(ALGORITHMS["gspo"], lp, old, mu, adv, mask, NORM_LEN)
    b, _ = policy_loss(ALGORITHMS["gspo"], lp, old, None, adv, mask, NORM_LEN)
    assert a.item() == b.item()


def test_missing_inputs_raise():
    lp, old, mu, adv, mask = tensors(SCENARIOS["mild"])
    with pytest.raises(ValueError, match="sampler_logp"):
        policy_loss(ALGORITHMS["grpo_token_tis"], lp, old, None, adv, mask, NORM_LEN)
    with pytest.raises(ValueError, match="old_logp"):
        policy_loss(ALGORITHMS["grpo"], lp, None, mu, adv, mask, NORM_LEN)


def test_huge_log_ratio_is_clamped_not_inf():
    """A sequence log-ratio of 3000 must not overflow into inf/NaN (clamped at 20)."""
    T = 30
    lp = torch.zeros(1, T, dtype=torch.float64, requires_grad=True)
    mu = torch.full((1, T), -100.0, dtype=torch.float64)
    mask, adv = torch.ones(1, T, dtype=torch.float64), torch.ones(1, dtype=torch.float64)
    loss, metrics = policy_loss(ALGORITHMS["pg_seq_tis"], lp, lp.detach(), mu, adv, mask, T)
    (g,) = torch.autograd.grad(loss, lp)
    assert metrics["is/weight/max"] == pytest.approx(math.exp(20.0), rel=1e-12)
    assert torch.allclose(g, torch.full((1, T), -3.0 / T, dtype=torch.float64))


# ---------------------------------------------------------------------------- aggregation
LOSS_TOK = [[1.0, 2.0, 3.0], [4.0, 5.0, 99.0]]


@pytest.mark.parametrize(
    "mode, want",
    [
        ("token-mean", (1 + 2 + 3 + 4 + 5) / 5),
        ("seq-mean-token-sum", ((1 + 2 + 3) + (4 + 5)) / 2),
        ("seq-mean-token-mean", ((1 + 2 + 3) / 3 + (4 + 5) / 2) / 2),
        ("seq-mean-token-sum-norm", ((1 + 2 + 3) / 4 + (4 + 5) / 4) / 2),
    ],
)
def test_aggregate_modes(mode, want):
    loss_tok = torch.tensor(LOSS_TOK, dtype=torch.float64)
    loss_tok[1, 2] = math.nan  # padded slot: ignored even when non-finite
    assert aggregate(loss_tok, torch.tensor(MASK), mode, 4).item() == pytest.approx(want, rel=1e-15)


def test_agg_modes_tuple():
    assert AGG_MODES == ("token-mean", "seq-mean-token-sum", "seq-mean-token-mean",
                         "seq-mean-token-sum-norm")


def test_aggregate_empty_row_counts_as_zero_sequence():
    loss_tok = torch.tensor([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]])
    mask = torch.tensor([[1, 1, 1], [0, 0, 0]])
    assert aggregate(loss_tok, mask, "seq-mean-token-mean", 3).item() == pytest.approx(1.0)
    assert aggregate(loss_tok, mask, "token-mean", 3).item() == pytest.approx(2.0)


def test_aggregate_rejects_unknown_mode():
    with pytest.raises(ValueError, match="(?i)did you mean 'token-mean'"):
        aggregate(torch.zeros(1, 1), torch.ones(1, 1), "token_mean", 1)


# ---------------------------------------------------------------------------- advantages
REWARDS = [[1.0, 0.0, 1.0, 0.0], [1.0, 1.0, 1.0, 1.0], [0.0, 0.0, 0.0, 1.0]]


def test_advantage_mean():
    adv = compute_advantages(torch.tensor(REWARDS, dtype=torch.float64), "mean")
    want = [[0.5, -0.5, 0.5, -0.5], [0.0, 0.0, 0.0, 0.0], [-0.25, -0.25, -0.25, 0.75]]
    assert torch.allclose(adv, torch.tensor(want, dtype=torch.float64), rtol=0, atol=1e-15)


def test_advantage_std_uses_population_std():
    adv = compute_advantages(torch.tensor(REWARDS, dtype=torch.float64), "std")
    sd0 = 0.5  # population std of {1, 0, 1, 0}; the unbiased one would be 0.577
    sd2 = math.sqrt((3 * 0.25**2 + 0.75**2) / 4)
    want = [
        [0.5 / (sd0 + 1e-6), -0.5 / (sd0 + 1e-6), 0.5 / (sd0 + 1e-6), -0.5 / (sd0 + 1e-6)],
        [0.0, 0.0, 0.0, 0.0],
        [-0.25 / (sd2 + 1e-6)] * 3 + [0.75 / (sd2 + 1e-6)],
    ]
    assert torch.allclose(adv, torch.tensor(want, dtype=torch.float64), rtol=1e-12, atol=0)


@pytest.mark.parametrize("mode", ["mean", "std"])
def test_all_equal_group_gives_zero_not_nan(mode):
    adv = compute_advantages(torch.tensor([[0.0, 0.0, 0.0], [1.0, 1.0, 1.0]]), mode)
    assert torch.equal(adv, torch.zeros(2, 3))
    single = compute_advantages(torch.tensor([[1.0]]), mode)  # G = 1
    assert torch.equal(single, torch.zeros(1, 1))


def test_advantage_accepts_integer_rewards_and_rejects_unknown_mode():
    assert compute_advantages(torch.tensor([[1, 0]]), "mean").tolist() == [[0.5, -0.5]]
    with pytest.raises(ValueError, match="(?i)did you mean 'std'"):
        compute_advantages(torch.zeros(1, 2), "sdt")


# ---------------------------------------------------------------------------- registry
def test_unknown_algorithm_suggests():
    with pytest.raises(ValueError, match="(?i)did you mean 'grpo'"):
        get_algorithm("grpoo")


@pytest.mark.parametrize(
    "override, field",
    [
        (dict(C=0.0), "C"),
        (dict(C=-1.0), "C"),
        (dict(clip_low=-0.1), "clip_low"),
        (dict(clip_high=-0.1), "clip_high"),
        (dict(agg="token_mean"), "agg"),
        (dict(correction="seq_tiss"), "correction"),
        (dict(surrogate="ppp"), "surrogate"),
        (dict(advantage="median"), "advantage"),
        (dict(clip_hgih=0.3), "clip_hgih"),
        (dict(uses_sampler_logp=True), "uses_sampler_logp"),  # derived, not settable
    ],
)
def test_bad_override_names_the_field(override, field):
    with pytest.raises(ValueError, match=field):
        get_algorithm("grpo", **override)


def test_bad_agg_override_suggests_valid_mode():
    with pytest.raises(ValueError, match="(?i)did you mean 'token-mean'"):
        get_algorithm("dapo", agg="token_mean")


def test_good_override_returns_new_entry_and_leaves_table_alone():
    a = get_algorithm("grpo_seq_mis", C=2.0)
    assert a.C == 2.0 and ALGORITHMS["grpo_seq_mis"].C == 3.0
    b = get_algorithm("grpo", correction="token_tis")
    assert b.uses_sampler_logp and not ALGORITHMS["grpo"].uses_sampler_logp
    with pytest.raises(dataclasses.FrozenInstanceError):
        a.C = 5.0  # type: ignore[misc]
    assert isinstance(a, Algorithm)


def test_a_name_verl_and_trl_use_for_other_settings_says_so_and_the_knobs_that_make_it_theirs():
    """`algorithm=grpo` is the sanity test's Dr.GRPO with clip-higher; a verl or TRL user reading
    "grpo" means their
    defaults: std-normalised advantage, a symmetric clip 0.2 (verl's clip_ratio, TRL's epsilon) and
    token-mean aggregation. Every listing (suite ls, --help, the report) prints ``in_words``: it
    must say so, name the knobs, and those knobs must give exactly their settings, after which the
    warning goes away."""
    from suite.rl.algo_table import elsewhere, in_words

    for name in ("grpo", "grpo_token_tis", "grpo_seq_tis", "grpo_seq_mis"):
        words = in_words(ALGORITHMS[name])
        assert "NOT verl's and TRL's GRPO" in words, words
        knobs = dict(kv.split("=", 1) for kv in words.split("(theirs: ")[1].rstrip(")").split()[1:])
        theirs = get_algorithm(name,
                               **{k.removeprefix("algo."): float(v) if k.startswith("algo.clip")
                                  else v
                                         for k, v in knobs.items()})
        assert (theirs.advantage, theirs.clip_low, theirs.clip_high,
                theirs.agg) == ("std", 0.2, 0.2, "token-mean")
        assert theirs.correction == ALGORITHMS[name].correction and elsewhere(theirs) == ""
    # Names no other framework uses for other settings carry no warning; dapo says what it leaves
    # out.
    for name in ("grpo_vanilla", "dr_grpo", "gspo", "pg_seq_is"):
        assert "NOT" not in in_words(ALGORITHMS[name]), name
    assert ("without DAPO's dynamic sampling and overlong reward shaping"
            in in_words(ALGORITHMS["dapo"]))
