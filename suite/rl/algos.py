"""The algorithm table: one name -> (advantage, surrogate, IS correction, aggregation).

Notation (after arXiv 2510.26788 "Defeating the Training-Inference
Mismatch via FP16", code github.com/sail-sg/Precision-RL):
  mu           the sampler (rollout engine) that drew y, at the old parameters theta'
  pi_theta'    the trainer at those same old parameters (`old_logp`, no grad)
  pi_theta     the trainer now (`trainer_logp`, carries the gradient)
  r_t   = pi_theta(y_t) / pi_theta'(y_t)          PPO ratio (on-policy part)
  rho_t = pi_theta'(y_t) / mu(y_t), rho = prod_t rho_t   mismatch ratio at theta'
  w     = pi_theta(y) / mu(y), detached             PG sequence weight
  l_t   = max(-A r_t, -A clip(r_t, 1 - eps_low, 1 + eps_high))   PPO-clip, arXiv 1707.06347 Eq. (7)

A loss is: per-token surrogate (B, T)  x  detached IS weight (B, T) or (B, 1)  ->  aggregate.
`policy_loss` is the one place that dispatches on the surrogate; `is_weights` is the one
place that interprets the correction, through the `_CORRECTIONS` table. Every variant in
`ALGORITHMS` (the table: suite/rl/algo_table.py, torch-free) is a parameter setting of that shared
kernel.

Shapes: B sequences, T response positions (right-padded), P prompts x G samples = B.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from suite.names import did_you_mean
from suite.rl.algo_table import (  # noqa: F401 (the table, re-exported: the kernels and their settings in one import)
    _CORRECTIONS,
    ADVANTAGE_MODES,
    AGG_MODES,
    ALGORITHMS,
    CORRECTIONS,
    SURROGATES,
    Algorithm,
    get_algorithm,
)

# Log-ratios are clamped to +-20 before exp: a sequence log-ratio sums thousands of
# per-token terms and in BF16 reaches hundreds, where exp overflows to inf and inf * 0 in
# the backward pass becomes NaN. exp(20) = 4.9e8 is far past any threshold C we use, so the
# clamp never changes a weight that survives truncation or masking. (Same bound as VeRL.)
LOG_RATIO_CLAMP = 20.0
STD_EPS = 1e-6  # GRPO's (r - mean) / (std + eps); keeps an all-equal group at exactly 0

# ---------------------------------------------------------------------------- advantages
def compute_advantages(rewards: Tensor, mode: str) -> Tensor:
    """Group-relative advantages, (P, G) -> (P, G), one group of G samples per prompt.

    "mean": r - mean_g(r), Dr.GRPO (arXiv 2503.20783, Sec. 3), no std division so easy and
    hard prompts are not re-weighted. "std": (r - mean) / (std + 1e-6), original GRPO
    (arXiv 2402.03300, Sec. 4.1.2), with the population std (unbiased=False, divide by G).
    An all-equal group gives exactly 0 in both modes (0 / (0 + 1e-6)), never NaN.
    """
    r = rewards.to(torch.float32) if not rewards.is_floating_point() else rewards
    centered = r - r.mean(dim=-1, keepdim=True)  # (P, G)
    if mode == "mean":
        return centered
    if mode == "std":
        return centered / (r.std(dim=-1, correction=0, keepdim=True) + STD_EPS)
    raise ValueError(f"advantage mode {mode!r} is not one of "
                     f"{ADVANTAGE_MODES}{did_you_mean(mode, ADVANTAGE_MODES)}")


# ---------------------------------------------------------------------------- aggregation
def aggregate(loss_tok: Tensor, mask: Tensor, mode: str, norm_len: int) -> Tensor:
    """Reduce a per-token loss (B, T) over response tokens to a scalar (VeRL `loss_agg_mode`).

    token-mean:              sum of all tokens / number of tokens (DAPO, arXiv 2503.14476)
    seq-mean-token-sum:      mean over sequences of the per-sequence token sum
    seq-mean-token-mean:     mean over sequences of the per-sequence token mean (GRPO, GSPO)
    seq-mean-token-sum-norm: mean over sequences of token sum / norm_len, a constant (the max
                             response length), so no length bias (Dr.GRPO, arXiv 2503.20783)
    Every row counts as a sequence in the seq-mean modes, even an empty one (it adds 0).
    """
    m = mask.bool()  # (B, T)
    # (B, T); padding may be non-finite
    masked = torch.where(m, loss_tok, torch.zeros_like(loss_tok))
    tok_sum = masked.sum(dim=-1)  # (B,)
    n_tok = m.sum(dim=-1).to(loss_tok.dtype)  # (B,)
    if mode == "token-mean":
        return masked.sum() / n_tok.sum().clamp(min=1.0)
    if mode == "seq-mean-token-sum":
        return tok_sum.mean()
    if mode == "seq-mean-token-mean":
        return (tok_sum / n_tok.clamp(min=1.0)).mean()
    if mode == "seq-mean-token-sum-norm":
        if not norm_len > 0:
            raise ValueError(f"norm_len must be > 0 for seq-mean-token-sum-norm, got {norm_len!r}")
        return (tok_sum / norm_len).mean()
    raise ValueError(f"aggregation {mode!r} is not one of "
                     f"{AGG_MODES}{did_you_mean(mode, AGG_MODES)}")


# ---------------------------------------------------------------------------- surrogates
def _masked_mean(x: Tensor, mask: Tensor) -> float:
    return float(x[mask].float().mean()) if bool(mask.any()) else math.nan


def clipped_objective(
    ratio: Tensor, adv: Tensor, mask: Tensor, clip_low: float, clip_high: float
) -> tuple[Tensor, float]:
    """l_t = max(-A r, -A clip(r, 1 - eps_low, 1 + eps_high)), PPO arXiv 1707.06347 Eq. (7).

    ratio (B, T), adv (B, 1). torch.where rather than torch.maximum: the gradient must go
    entirely to the unclipped branch unless the clipped one is strictly larger, where the
    token gets zero gradient (maximum would split ties half-half). Returns (loss (B, T),
    fraction of response tokens clipped).
    """
    unclipped = -adv * ratio
    clipped = -adv * ratio.clamp(1.0 - clip_low, 1.0 + clip_high)
    is_clipped = clipped > unclipped  # (B, T)
    return torch.where(is_clipped, clipped, unclipped), _masked_mean(is_clipped, mask)


def ppo_token_loss(
    trainer_logp: Tensor, old_logp: Tensor, adv: Tensor, mask: Tensor, clip_low: float,
    clip_high: float
) -> tuple[Tensor, dict[str, float]]:
    """Token PPO-clip with r_t = exp(log pi_theta - log pi_theta') (GRPO/DAPO/Dr.GRPO kernel)."""
    ratio = torch.exp((trainer_logp - old_logp).clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP))  # (B, T)
    loss_tok, clip_frac = clipped_objective(ratio, adv, mask, clip_low, clip_high)
    return loss_tok, {"ppo/clip_frac": clip_frac}


def gap_clip_fraction(old_logp: Tensor, sampler_logp: Tensor, advantages: Tensor, mask: Tensor,
                      clip_low: float, clip_high: float) -> float:
    """Share of response tokens PPO's clip zeroes at the first update of a rollout when the ratio's
    denominator is the sampler's log-prob: there theta = theta', so r_t = pi_theta'/mu_t is the
    precision gap alone and every clipped token is clipped by it, not by a policy change ("phantom
    clipping"). 0 when they agree."""
    m = mask.bool()
    gap = torch.where(m, old_logp - sampler_logp, torch.zeros_like(old_logp))
    ratio = torch.exp(gap.clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP))
    return clipped_objective(ratio, advantages.to(ratio.dtype)[:, None], m, clip_low, clip_high)[1]


def gspo_token_loss(
    trainer_logp: Tensor, old_logp: Tensor, adv: Tensor, mask: Tensor, clip_low: float,
    clip_high: float
) -> tuple[Tensor, dict[str, float]]:
    """GSPO-token (arXiv 2507.18071, Sec. 4): ratio_t = sg(s) * pi_t / sg(pi_t), clipped as in PPO.

    s = exp(mean_t(log pi_theta - log pi_theta')) per sequence, the length-normalised
    sequence ratio. Its value is s for every token of the sequence, and d ratio_t / d log pi_t
    = s, which with the seq-mean-token-mean aggregation reproduces the GSPO gradient.
    """
    n_tok = mask.sum(dim=-1).clamp(min=1)  # (B,)
    log_s = (trainer_logp - old_logp).sum(dim=-1) / n_tok  # (B,) off-mask already zero
    log_s = log_s.detach().clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)
    ratio = torch.exp(log_s[:, None] + trainer_logp - trainer_logp.detach())  # (B, T)
    loss_tok, clip_frac = clipped_objective(ratio, adv, mask, clip_low, clip_high)
    rows = mask.any(dim=-1)
    seq_ratio_mean = float(log_s[rows].exp().mean()) if bool(rows.any()) else math.nan
    return loss_tok, {"ppo/clip_frac": clip_frac, "gspo/seq_ratio/mean": seq_ratio_mean}


def pg_token_loss(trainer_logp: Tensor, adv: Tensor) -> tuple[Tensor, dict[str, float]]:
    """REINFORCE surrogate -A * log pi_t; its gradient is -A * grad log pi_t (no ratio, no clip)."""
    return -adv * trainer_logp, {}


# ---------------------------------------------------------------------------- IS correction
def is_weights(
    correction: str, numerator_logp: Tensor, sampler_logp: Tensor | None, mask: Tensor, C: float
) -> tuple[Tensor | None, dict[str, float]]:
    """Detached mismatch weight to multiply the per-token loss by, and its diagnostics.

    log weight = log numerator - log mu, per token ("token" level, (B, T)) or summed over
    the response ("seq" level, (B, 1)). The numerator is pi_theta' for the PPO-type
    surrogates (rho, arXiv 2510.26788) and pi_theta for PG (w). Above C the weight is
    truncated to C (TIS), set to 0 (MIS) or kept (plain IS), per `_CORRECTIONS`.

    Metrics, over units (response tokens, or sequences with at least one response token):
    is/weight/{mean,min,max} of the raw weight before truncation or masking (the mismatch
    signal; a practitioners' rule of thumb warns outside [0.5, 2]); is/applied/{mean,min,max}
    of the weight after it (what verl and TRL report, suite/numerics/peers.py); is/truncated_frac
    (TIS) and is/masked_frac (MIS), the fraction of units whose raw weight exceeded C and was
    truncated, resp. masked (0.0 for the other kind): the weights the correction changed;
    is/ess, the normalised effective sample size (sum w)^2 / (n sum w^2) of the applied
    weights (1 = uniform, 0 = everything masked). Positions off the mask may hold anything
    (-inf included): they are zeroed first.
    """
    spec = _CORRECTIONS[correction]
    if spec is None:
        return None, {}
    if sampler_logp is None:
        raise ValueError(f"correction {correction!r} needs sampler_logp (the sampler's log-probs), "
                         "got None")
    level, above_c = spec
    m = mask.bool()
    log_ratio = torch.where(m, numerator_logp.detach() - sampler_logp.detach(), 0.0)  # (B, T)
    if level == "token":
        log_w, units = log_ratio, m  # (B, T)
    else:
        log_w, units = log_ratio.sum(dim=-1, keepdim=True), m.any(dim=-1, keepdim=True)  # (B, 1)
    raw = torch.exp(log_w.clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP))
    if above_c == "truncate":
        weight = raw.clamp(max=C)
    elif above_c == "mask":
        weight = torch.where(raw <= C, raw, torch.zeros_like(raw))
    else:
        weight = raw

    raw_u, w_u = raw[units].double(), weight[units].double()  # (n,)
    if raw_u.numel() == 0:
        nan = math.nan
        return weight, {k: nan
                        for k in ("is/weight/mean", "is/weight/min", "is/weight/max",
                                  "is/applied/mean",
                                         "is/applied/min", "is/applied/max", "is/truncated_frac",
                                         "is/masked_frac", "is/ess")}
    above = float((raw_u > C).double().mean())
    sq = float(w_u.square().sum())
    metrics = {
        "is/weight/mean": float(raw_u.mean()),
        "is/weight/min": float(raw_u.min()),
        "is/weight/max": float(raw_u.max()),
        "is/applied/mean": float(w_u.mean()),
        "is/applied/min": float(w_u.min()),
        "is/applied/max": float(w_u.max()),
        "is/truncated_frac": above if above_c == "truncate" else 0.0,
        "is/masked_frac": above if above_c == "mask" else 0.0,
        "is/ess": float(w_u.sum()) ** 2 / (w_u.numel() * sq) if sq > 0 else 0.0,
    }
    return weight, metrics


# ---------------------------------------------------------------------------- score centering
def centering_term(loss_tok: Tensor, logp: Tensor, expected: Tensor) -> Tensor:
    """Per-token term (B, T) that centres the score of every row's surrogate: score centering,
    arXiv 2609.20807 Eq. (14) (the equation NeMo-RL's implementation cites).

    At each prefix, E_mu[A grad log pi] = E_mu[A] E_mu[grad log pi] + Cov_mu(A, grad log pi); the
    first part, the drift, pulls the trainer toward the sampler mu, and group-centred advantages do
    not remove it. Centering replaces the score e_y - pi (w.r.t. the logits) of the sampled token by
    e_y - mu, its sampler expectation subtracted. A row's per-token loss ``loss_tok`` (its ratio,
    clip and IS weight applied) has gradient c_t grad log pi(y_t) with c_t = d loss_tok / d logp_t,
    whatever the row; so adding -sg(c_t) (E_t - sg(E_t)), with E_t = ``expected`` (B, T) whose
    gradient is mu - pi (suite/numerics/centering.py), turns it into c_t (e_y - mu). For REINFORCE
    that is the surrogate A_t (log pi(y_t) - sum_v sg(mu(v)) log pi(v)) times the row's weight. The
    term's value is exactly 0, so loss/policy is unchanged; only the gradient moves.

    c_t is the sampled token's own coefficient (its IS weight included). NeMo-RL weights the
    centring mass instead (mu(v) w(v) over the candidates v): under an untruncated IS correction the
    estimator's expected score is already 0, and there this term adds E[c_t] (pi - mu) on average
    (docs/algorithms.md).
    """
    coef = torch.autograd.grad(loss_tok.sum(), logp, retain_graph=True)[0]  # (B, T) c_t, detached
    return -coef * (expected - expected.detach())


# ---------------------------------------------------------------------------- the loss
def _require(x: Tensor | None, what: str, algo: Algorithm) -> Tensor:
    if x is None:
        raise ValueError(f"algorithm {algo.name!r} (surrogate {algo.surrogate!r}) needs {what}, "
                         "got None")
    return x


def policy_loss(
    algo: Algorithm,
    trainer_logp: Tensor,
    old_logp: Tensor | None,
    sampler_logp: Tensor | None,
    advantages: Tensor,
    mask: Tensor,
    norm_len: int,
    *,
    expected_logp: Tensor | None = None,
) -> tuple[Tensor, dict[str, float]]:
    """Scalar policy loss for `algo` and its metrics.

    trainer_logp (B, T) log pi_theta, requires grad; old_logp (B, T) log pi_theta', the
    trainer's log-probs at the sampling parameters (unused by "pg", may be None there);
    sampler_logp (B, T) log mu (needed iff algo.uses_sampler_logp); advantages (B,), one
    per sequence; mask (B, T) 1 on response tokens; norm_len the constant of
    seq-mean-token-sum-norm (max response length). ``expected_logp`` (B, T): score centering's E_t
    (suite/numerics/centering.py), or None (off). Metrics: loss/policy, ppo/clip_frac (ppo, gspo),
    gspo/seq_ratio/mean (gspo), is/* (see `is_weights`).
    """
    m = mask.bool()  # (B, T)

    # Padded positions may hold anything (-inf from a masked log-softmax, stale values):
    # zero them before any arithmetic so no inf/NaN reaches exp() or the backward pass.
    def clean(x: Tensor | None) -> Tensor | None:
        return None if x is None else torch.where(m, x, torch.zeros_like(x))

    logp, old, sampler = clean(trainer_logp), clean(old_logp), clean(sampler_logp)
    adv = advantages.detach().to(logp.dtype)[:, None]  # (B, 1), same A on every token

    # The one dispatch on the surrogate. It also fixes the IS numerator: PPO-type losses
    # already carry pi_theta/pi_theta' in r_t, so they correct only the mismatch
    # rho = pi_theta'/mu; PG has no ratio, so it weights by w = pi_theta/mu (detached).
    if algo.surrogate == "ppo":
        numerator = _require(old, "old_logp", algo)
        loss_tok, metrics = ppo_token_loss(logp, numerator, adv, m, algo.clip_low, algo.clip_high)
    elif algo.surrogate == "gspo":
        numerator = _require(old, "old_logp", algo)
        loss_tok, metrics = gspo_token_loss(logp, numerator, adv, m, algo.clip_low, algo.clip_high)
    elif algo.surrogate == "pg":
        loss_tok, metrics = pg_token_loss(logp, adv)
        numerator = logp.detach()
    else:  # unreachable for a validated Algorithm
        raise ValueError(f"unknown surrogate {algo.surrogate!r}")

    weight, is_metrics = is_weights(algo.correction, numerator, sampler, m, algo.C)
    if weight is not None:
        loss_tok = loss_tok * weight  # (B, T) * (B, T) or (B, 1); weight is detached
    if expected_logp is not None:  # score centering: one place, after every row's own terms
        loss_tok = loss_tok + centering_term(loss_tok, logp, clean(expected_logp))
    loss = aggregate(loss_tok, m, algo.agg, norm_len)
    return loss, {"loss/policy": float(loss.detach()), **metrics, **is_metrics}


# ---------------------------------------------------------------------------- regularisers
def kl_penalty(trainer_logp: Tensor, ref_logp: Tensor, estimator: str) -> Tensor:
    """Per-token estimate (B, T) of KL(pi_theta || pi_ref) on tokens sampled from the policy.

    With log r = log pi_ref - log pi_theta (Schulman, "Approximating KL divergence", 2020):
    k1 = -log r (unbiased, can be negative), k2 = (log r)^2 / 2, k3 = r - 1 - log r (unbiased and
    >= 0; GRPO arXiv 2402.03300 Eq. 4). log r is clamped like every log-ratio here
    (LOG_RATIO_CLAMP)."""
    log_r = (ref_logp - trainer_logp).clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)
    if estimator == "k1":
        return -log_r
    if estimator == "k2":
        return 0.5 * log_r**2
    if estimator == "k3":
        return torch.exp(log_r) - 1.0 - log_r
    raise ValueError(f"unknown KL estimator {estimator!r} (k1, k2, k3)")


def regularised_loss(loss: Tensor, trainer_logp: Tensor, entropy: Tensor, ref_logp: Tensor | None,
                     mask: Tensor, agg: str, norm_len: int, kl_coef: float, kl_estimator: str,
                     entropy_coef: float) -> tuple[Tensor, dict[str, float]]:
    """``loss + kl_coef * KL - entropy_coef * H``, each term aggregated like the policy loss (so
    gradient accumulation weights stay right). A zero coefficient leaves the loss as it is, bit for
    bit."""
    m = mask.bool()
    metrics = {}
    if kl_coef:
        kl = aggregate(kl_penalty(trainer_logp, ref_logp, kl_estimator), m, agg, norm_len)
        loss = loss + kl_coef * kl
        metrics["loss/kl_ref"] = float(kl.detach())
    if entropy_coef:
        ent = aggregate(entropy, m, agg, norm_len)
        loss = loss - entropy_coef * ent
        metrics["loss/entropy"] = float(ent.detach())
    return loss, metrics
