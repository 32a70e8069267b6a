"""Training-inference mismatch metrics: pure functions of (trainer, sampler, mask).

The sampler (rollout engine, distribution mu) draws the response tokens; the trainer
(training engine, distribution pi) re-scores the same tokens at the same parameters.
In exact arithmetic pi == mu; in BF16 they drift apart, and arXiv 2510.26788
("Defeating the Training-Inference Mismatch via FP16") shows that this gap is what
collapses RL runs. Everything here is computed on the *sampled* tokens only, in float64,
with log pi - log mu written as `log_ratio` (so rho_t = pi_t / mu_t = exp(log_ratio_t)).

Reductions: "token" means are over all masked (response) tokens of the batch pooled
together; "sequence" statistics are over the sequences that have at least one response
token (an empty row has a trivially zero log-ratio and would bias them). All `std` are
population std (divide by n): they must exist for a batch of one.

Keys and formulas: `METRIC_KEYS` below; each key's formula and its name in verl, TRL, slime,
prime-rl and Oat, with whether the peer computes the same number, are in the metric table
(suite/numerics/peers.py, rendered as docs/metrics.md) and checked against the released verl and TRL
by tests/test_conformance.py. IS-weight diagnostics depend on the correction in use and are returned
by `suite.rl.algos.policy_loss` under `is/*` (same table).

`log_ppl_diff` sign: trainer log-perplexity minus sampler log-perplexity, per sequence,
then averaged; positive when the trainer finds the sampled text less likely than the
sampler did (verl's sign), and log of each sequence's ppl_ratio. Health thresholds
(practitioners' rules of thumb, not a published standard): exp_abs_logprob_diff/mean below
1.03-1.05 and KL estimates below 1e-3; watch prob_diff/max, not only the mean.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

# Log-ratios are clamped to +-20 before exp (rho <= 4.9e8) where a sequence log-ratio is
# exponentiated (chi2_seq), and for chi2_token as verl does: a sequence log-ratio sums over
# thousands of tokens and in BF16 can reach hundreds, where exp overflows to inf and one sequence
# would turn a batch mean into inf/NaN. 20 matches verl's SAFETY_BOUND. kl_k3 and ppl_ratio are not
# clamped, as in verl: kl_k3 exponentiates one token's log pi - log mu (float64 overflows past 709:
# a token the sampler drew with probability below e^-709), ppl_ratio a sequence's mean of log mu -
# log pi (a trainer that finds the sampled text e^709 times less likely per token): only a broken
# engine gets there, and inf says so.
LOG_RATIO_CLAMP = 20.0

METRIC_KEYS = (
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
)


def _masked_log_ratio(trainer_logp: Tensor, sampler_logp: Tensor,
                      mask: Tensor) -> tuple[Tensor, Tensor]:
    """(log pi - log mu) in float64 with off-mask positions set to exactly 0, and the bool mask.

    torch.where, not multiplication: padded positions may hold -inf, and 0 * inf = NaN.
    """
    m = mask.bool()  # (B, T)
    diff = trainer_logp.detach().double() - sampler_logp.detach().double()  # (B, T)
    return torch.where(m, diff, torch.zeros_like(diff)), m


def token_mismatch(trainer_logp: Tensor, sampler_logp: Tensor, mask: Tensor) -> Tensor:
    """Per-token abs(log pi - log mu), float64 (B, T), exactly 0 off the mask.

    Where in a response the mismatch sits (which positions, which tokens) is what the
    token-vs-sequence correction debate turns on (Liu, Li et al. 2025, "When Speed Kills
    Stability", richardli.xyz/rl-collapse).
    """
    log_ratio, _ = _masked_log_ratio(trainer_logp, sampler_logp, mask)
    return log_ratio.abs()


def mismatch_metrics(trainer_logp: Tensor, sampler_logp: Tensor, mask: Tensor) -> dict[str, float]:
    """All `METRIC_KEYS` as python floats; NaN for every key when the mask is empty.

    trainer_logp, sampler_logp: (B, T) log-probs of the sampled tokens under pi and mu,
    computed at the same parameters (before the update). mask: (B, T), 1 on response
    tokens. Formulas and peer names: suite/numerics/peers.py.
    """
    log_ratio, m = _masked_log_ratio(trainer_logp, sampler_logp, mask)  # (B, T)
    if not bool(m.any()):
        return {key: math.nan for key in METRIC_KEYS}

    # ---- token level: pooled over every response token of the batch
    tok = log_ratio[m]  # (N,) log pi_t - log mu_t
    tok_c = tok.clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)  # chi2_token only
    pi = trainer_logp.detach().double()[m].exp()  # (N,)
    mu = sampler_logp.detach().double()[m].exp()  # (N,)
    prob_diff = (pi - mu).abs()
    abs_tok = tok.abs()

    # ---- sequence level: rows with at least one response token
    rows = m.any(dim=-1)  # (B,)
    seq_log_ratio = log_ratio.sum(dim=-1)[rows]  # (S,) log prod_t rho_t
    seq_mean_log_ratio = seq_log_ratio / m.sum(dim=-1)[rows]  # (S,) mean_t(log pi - log mu)
    seq_c = seq_log_ratio.clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)

    out = {
        # k1/k2/k3 estimators of KL(mu || pi) under y ~ mu (Schulman, "Approximating KL
        # divergence", joschu.net/blog/kl-approx.html). k3 uses expm1: for a mismatch of
        # 1e-6 per token, exp(x) - 1 - x loses most digits of the ~5e-13 result.
        "mismatch/kl_k1": (-tok).mean(),
        "mismatch/kl_k2": 0.5 * tok.square().mean(),
        "mismatch/kl_k3": (torch.expm1(tok) - tok).mean(),
        "mismatch/prob_diff/mean": prob_diff.mean(),
        "mismatch/prob_diff/max": prob_diff.max(),
        "mismatch/prob_diff/std": prob_diff.std(correction=0),
        "mismatch/logprob_diff/mean": abs_tok.mean(),
        "mismatch/logprob_diff/max": abs_tok.max(),
        "mismatch/seq_log_ratio/mean_abs": seq_log_ratio.abs().mean(),
        "mismatch/seq_log_ratio/max_abs": seq_log_ratio.abs().max(),
        "mismatch/seq_log_ratio/std": seq_log_ratio.std(correction=0),
        # mean_t(-log pi) - mean_t(-log mu) = -mean_t(log pi - log mu), per sequence.
        "mismatch/log_ppl_diff": (-seq_mean_log_ratio).mean(),
        "mismatch/ppl_ratio": (-seq_mean_log_ratio).exp().mean(),
        # chi^2(pi || mu) = E_mu[rho^2] - 1: the variance of the IS weight, which sets how
        # fast sequence-level IS variance grows, O((1 + chi2)^T) (Liu, Li et al. 2025).
        "mismatch/chi2_token": (2.0 * tok_c).exp().mean() - 1.0,
        "mismatch/chi2_seq": (2.0 * seq_c).exp().mean() - 1.0,
        "mismatch/exp_abs_logprob_diff/mean": abs_tok.clamp(max=LOG_RATIO_CLAMP).exp().mean(),
    }
    return {key: float(value) for key, value in out.items()}


# ---- anatomy: where the mismatch sits ----------------------------------------------------
# Which tokens carry the mismatch decides which correction can fix it: token-level TIS
# bounds per-token ratios, sequence-level IS/MIS sees the accumulated log-ratio (Liu, Li et
# al. 2025, "When Speed Kills Stability"). The published BF16 runs show the mismatch growing
# before the collapse (arXiv 2510.26788 Fig. 2) without saying where it sits; these per-step
# numbers answer that on our runs (the mechanism measured, not only the outcome).
PI_BINS = ((0.0, 0.5, "lt0.5"), (0.5, 0.9, "0.5-0.9"), (0.9, 0.99, "0.9-0.99"),
           (0.99, 1.0 + 1e-9, "ge0.99"))
POS_BINS = 4  # quarters of each response, by relative position


def _corr(a: Tensor, b: Tensor) -> float:
    """Pearson correlation; NaN when either side is constant (e.g. a mismatch of exactly 0)."""
    a, b = a - a.mean(), b - b.mean()
    den = float((a.square().sum() * b.square().sum()).sqrt())
    return float((a * b).sum()) / den if den > 0 else math.nan


def mismatch_anatomy(trainer_logp: Tensor, sampler_logp: Tensor, mask: Tensor,
                     entropy: Tensor) -> dict[str, float]:
    """How abs(log pi - log mu) is distributed over positions, trainer probabilities and entropy.

    Keys (all over the masked tokens of the batch, float):
      anatomy/pos_q{1..4}/mean mean abs log-ratio in each quarter of the response (relative
      position) anatomy/pi_{bin}/mean, /frac mean abs log-ratio of tokens whose trainer prob pi_t is
      in the bin,
                                      and the fraction of tokens in it (bins: <0.5, 0.5-0.9,
                                      0.9-0.99, >=0.99)
      anatomy/pi_{bin}/share          share of the total abs log-ratio mass carried by the bin
      anatomy/top1pct_share share of that mass carried by the top 1% tokens (concentration)
      anatomy/corr_entropy Pearson corr(abs log-ratio, trainer entropy at that position)
      anatomy/corr_surprisal Pearson corr(abs log-ratio, -log pi_t) anatomy/mu_gt_pi_frac fraction
      of tokens the sampler found likelier than the trainer (mu > pi);
                                      above 0.5 means sampling favours tokens the trainer underrates
    Empty bins give NaN means (and 0 frac); an all-zero mismatch gives 0 means and NaN
    shares/correlations.
    """
    log_ratio, m = _masked_log_ratio(trainer_logp, sampler_logp, mask)
    keys = ([f"anatomy/pos_q{q + 1}/mean" for q in range(POS_BINS)]
            + [f"anatomy/pi_{n}/{s}" for _, _, n in PI_BINS for s in ("mean", "frac", "share")]
            + ["anatomy/top1pct_share", "anatomy/corr_entropy", "anatomy/corr_surprisal",
               "anatomy/mu_gt_pi_frac"])
    if not bool(m.any()):
        return {k: math.nan for k in keys}
    abs_lr = log_ratio.abs()
    # relative position of each response token in its own response: 0 for the first, -> 1 for the
    # last
    idx = m.long().cumsum(1) - 1
    rel = idx.double() / m.sum(1, keepdim=True).clamp(min=1).double()
    quarter = (rel * POS_BINS).floor().clamp(max=POS_BINS - 1).long()
    a, q = abs_lr[m], quarter[m]
    pi = trainer_logp.detach().double()[m].exp()
    total = float(a.sum())
    out: dict[str, float] = {}
    for b in range(POS_BINS):
        sel = q == b
        out[f"anatomy/pos_q{b + 1}/mean"] = float(a[sel].mean()) if bool(sel.any()) else math.nan
    for lo, hi, name in PI_BINS:
        sel = (pi >= lo) & (pi < hi)
        out[f"anatomy/pi_{name}/mean"] = float(a[sel].mean()) if bool(sel.any()) else math.nan
        out[f"anatomy/pi_{name}/frac"] = float(sel.double().mean())
        out[f"anatomy/pi_{name}/share"] = float(a[sel].sum()) / total if total > 0 else math.nan
    k = max(1, math.ceil(0.01 * a.numel()))
    out["anatomy/top1pct_share"] = float(a.topk(k).values.sum()) / total if total > 0 else math.nan
    out["anatomy/corr_entropy"] = _corr(a, entropy.detach().double()[m])
    out["anatomy/corr_surprisal"] = _corr(a, -trainer_logp.detach().double()[m])
    out["anatomy/mu_gt_pi_frac"] = float((log_ratio[m] < 0).double().mean())
    return out


# ---- mechanism: what the hypotheses of the collapse search need per step -----------------
# Written to <run>/mechanism.jsonl (not metrics.jsonl, so the committed references stay
# byte-comparable): the raw IS weights whatever the algorithm corrects, sequence log-ratios by
# response length (sequence-level IS variance grows like (1 + chi2)^T, Liu, Li et al. 2025) and
# entropy by absolute position.
LENGTH_BINS = ((1, 16), (17, 32), (33, 64), (65, 128), (129, 256), (257, 512), (513, 1024),
               (1025, 1 << 30))


def _ess(w: Tensor) -> float:
    """Normalised effective sample size (sum w)^2 / (n sum w^2), in (0, 1]; 1 when every weight is
    equal."""
    sq = float(w.square().sum())
    return float(w.sum()) ** 2 / (w.numel() * sq) if sq > 0 else math.nan


def _bin_name(lo: int, hi: int) -> str:
    return f"{lo}-{hi}" if hi < 1 << 30 else f"{lo}+"


def mechanism_metrics(trainer_logp: Tensor, sampler_logp: Tensor, mask: Tensor,
                      entropy: Tensor) -> dict[str, float]:
    """Keys (over the masked tokens / non-empty sequences of the batch, float; empty bins are left
    out):
      mech/is_tok/{mean,min,max,ess} raw token weights rho_t = pi_t / mu_t, never truncated, and
      their ESS mech/is_seq/{mean,max,ess} raw sequence weights prod_t rho_t (log clamped at +-20)
      and their ESS mech/seq_log_ratio/len_{lo-hi}/{mean_abs,n} abs sum_t log rho_t of the sequences
      of that length mech/entropy/pos_{lo-hi} mean trainer entropy at response positions lo..hi
      (1-based)
    """
    log_ratio, m = _masked_log_ratio(trainer_logp, sampler_logp, mask)
    if not bool(m.any()):
        return {}
    tok = log_ratio[m].clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP).exp()
    rows = m.any(dim=-1)
    seq_lr = log_ratio.sum(-1)[rows]
    seq = seq_lr.clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP).exp()
    out = {"mech/is_tok/mean": float(tok.mean()), "mech/is_tok/min": float(tok.min()),
           "mech/is_tok/max": float(tok.max()), "mech/is_tok/ess": _ess(tok),
           "mech/is_seq/mean": float(seq.mean()), "mech/is_seq/max": float(seq.max()),
           "mech/is_seq/ess": _ess(seq)}
    lengths = m.sum(-1)[rows]
    pos = torch.arange(1, m.shape[1] + 1).expand_as(m)
    ent = entropy.detach().double()
    for lo, hi in LENGTH_BINS:
        sel = (lengths >= lo) & (lengths <= hi)
        if bool(sel.any()):
            out[f"mech/seq_log_ratio/len_{_bin_name(lo, hi)}/mean_abs"] = float(
                seq_lr[sel].abs().mean())
            out[f"mech/seq_log_ratio/len_{_bin_name(lo, hi)}/n"] = float(sel.sum())
        at = m & (pos >= lo) & (pos <= hi)
        if bool(at.any()):
            out[f"mech/entropy/pos_{_bin_name(lo, hi)}"] = float(ent[at].mean())
    return out


# ---- diagnostics of the sources: ratio bands, full-vocabulary divergences, length bias --------
# Where practitioners draw their lines (TRL issue 6789 counts tokens outside [0.9, 1.1]; "mean IS
# weight outside [0.5, 2]" is the usual warning). NeMo-RL's token-multiplicative probability error,
# mean_t exp|log pi - log mu|, is mismatch/exp_abs_logprob_diff/mean above.
RATIO_BANDS = ((0.9, 1.1), (0.5, 2.0))


def ratio_band_fractions(trainer_logp: Tensor, sampler_logp: Tensor,
                         mask: Tensor) -> dict[str, float]:
    """mech/ratio_out/{lo}-{hi}: the fraction of response tokens whose raw ratio pi_t / mu_t lies
    outside [lo, hi]."""
    log_ratio, m = _masked_log_ratio(trainer_logp, sampler_logp, mask)
    tok = log_ratio[m]
    if tok.numel() == 0:
        return {f"mech/ratio_out/{lo:g}-{hi:g}": math.nan for lo, hi in RATIO_BANDS}
    return {f"mech/ratio_out/{lo:g}-{hi:g}":
            float(((tok < math.log(lo)) | (tok > math.log(hi))).double().mean())
            for lo, hi in RATIO_BANDS}


def distribution_divergence(trainer_dist: Tensor, sampler_dist: Tensor,
                            mask: Tensor) -> dict[str, float]:
    """Full-vocabulary divergences between the engines' next-token distributions, mean over response
    tokens.

    trainer_dist, sampler_dist: (B, T, V) log-probabilities (log pi, log mu) over the whole
    vocabulary, where both are available (the built-in engine's ``keep_dist``, the trainer's
    ``log_distribution``). Keys:
      dist/kl_sampler_trainer KL(mu || pi) = sum_v mu (log mu - log pi): what k1/k3 estimate from
      sampled tokens dist/kl_trainer_sampler KL(pi || mu) dist/tv total variation 1/2 sum_v |pi -
      mu|
    Tokens a side gives probability 0 (-inf log-prob) contribute 0 where the other side's
    probability is 0 too.
    """
    m = mask.bool()
    if not bool(m.any()):
        return {k: math.nan
                for k in ("dist/kl_sampler_trainer", "dist/kl_trainer_sampler", "dist/tv")}
    lp, lm = trainer_dist.detach().double()[m], sampler_dist.detach().double()[m]  # (N, V)
    p, q = lp.exp(), lm.exp()

    def kl(a, la, lb):  # sum_v a (la - lb), 0 log 0 = 0
        return torch.where(a > 0, a * (la - lb), torch.zeros_like(a)).sum(-1)
    return {"dist/kl_sampler_trainer": float(kl(q, lm, lp).mean()),
            "dist/kl_trainer_sampler": float(kl(p, lp, lm).mean()),
            "dist/tv": float(0.5 * (p - q).abs().sum(-1).mean())}


# Sequence-level corrections and what each does to a sequence, from its raw weight w = prod_t rho_t
# (log-space): (name, source, affected(seq_log_ratio, length) -> bool). The suite's own at its C = 3
# (suite/rl/algo_table.py); TRL's defaults vllm_importance_sampling_mode="sequence_mask",
# vllm_importance_sampling_clip_max=3 (TRL 1.16; TRL issue 4772: with a mean signed per-token gap of
# 0.012 every sequence longer than ln 3 / 0.012 ~ 92 tokens is masked); verl's rollout_corr defaults
# (rollout_is_threshold 2.0: sequence truncation; rollout_rs rejection with lower bound 1 / upper;
# geometric-mean rejection at 1 +- 0.001, the length-normalised alternative).
SEQUENCE_RULES = (
    ("suite_seq_tis", "suite grpo_seq_tis / pg_seq_tis, C = 3: w truncated to 3",
     lambda s, n: s > math.log(3.0)),
    ("suite_seq_mis", "suite grpo_seq_mis / pg_seq_mis, C = 3: masked when w > 3",
     lambda s, n: s > math.log(3.0)),
    ("trl_sequence_mask", "TRL default: sequence_mask, clip_max 3", lambda s, n: s > math.log(3.0)),
    ("verl_seq_is", "verl rollout_is=sequence, threshold 2: w truncated to 2",
     lambda s, n: s > math.log(2.0)),
    ("verl_seq_rs", "verl rollout_rs=sequence, threshold 2, lower 1/2: rejected outside [1/2, 2]",
     lambda s, n: s.abs() > math.log(2.0)),
    ("verl_geo_rs", "verl rollout_rs=geometric, 1 +- 0.001: rejected when exp(mean_t log rho) is "
                    "outside",
     lambda s, n: ((s / n) > math.log(1.001)) | ((s / n) < math.log(0.999))),
)


def length_bias(trainer_logp: Tensor, sampler_logp: Tensor, mask: Tensor) -> dict[str, float]:
    """mech/lenbias/{rule}/len_{lo-hi}: the fraction of the sequences of each response-length bin
    (LENGTH_BINS) that each sequence-level correction of SEQUENCE_RULES truncates or masks, on these
    log-probs; and mech/lenbias/{rule}/all over every sequence. A rule whose fraction grows with
    length is length-biased."""
    log_ratio, m = _masked_log_ratio(trainer_logp, sampler_logp, mask)
    rows = m.any(-1)
    if not bool(rows.any()):
        return {}
    s, n = log_ratio.sum(-1)[rows], m.sum(-1)[rows].double()
    out = {}
    for name, _, affected in SEQUENCE_RULES:
        hit = affected(s, n)
        out[f"mech/lenbias/{name}/all"] = float(hit.double().mean())
        for lo, hi in LENGTH_BINS:
            sel = (n >= lo) & (n <= hi)
            if bool(sel.any()):
                out[f"mech/lenbias/{name}/len_{_bin_name(lo, hi)}"] = float(
                    hit[sel].double().mean())
    return out
