"""The metric table: every mismatch metric and IS diagnostic, its formula, and its name in each peer
framework.

Users paste a suite number next to their framework's and expect the two to mean the same thing. So
every suite key lists its counterparts in verl, TRL, slime, prime-rl and Oat with one *relation*
from `RELATIONS`: ``identical`` means the peer computes the same number from the same log-probs (to
1e-6 relative, rounding aside); every other relation names the one convention in which the two
differ. For verl and TRL every relation is tested on their released code, the differences as
differences: the peer's number is the one the relation's convention gives, the suite's the one its
own gives, and the two are apart where the convention bites. A peer key that computes something else
is listed with what it computes, never under a suite key it does not equal. The suite keeps its own
conventions where they are the better ones (sequence statistics leave out rows without response
tokens; an empty batch is NaN, not 0: `EMPTY_BATCH`) and says so here.

How each peer was checked (`PEERS`): verl and TRL publish packages, and tests/test_conformance.py
runs the released code (verl's `compute_offpolicy_metrics`, `calculate_debug_metrics`,
`compute_rollout_correction_weights`; the importance-sampling and `sampling/*` blocks of TRL's
`GRPOTrainer._generate_and_score_completions`) on the same tensors as the suite, installed with
pinned versions and file hashes by scripts/conformance.sh. slime, prime-rl and Oat publish no
package that runs without a GPU cluster: their definitions were read from their source at the named
commit, and the suite writes nothing under their names (`Peer.written`; tests/test_metrics_doc.py
checks that no module does), so their columns only say which of their logged numbers corresponds to
a suite key.

docs/metrics.md is generated from this table (`python -m suite.analysis.metrics_doc --write`).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Peer:
    name: str
    version: str
    """A released version (checked by running it) or a commit (read)."""
    how: str
    """"run": tests/test_conformance.py runs the released code; "read": the definition was read from
    the source."""
    where: str
    """The functions or files the definitions come from."""
    written: str = ""
    """Where the suite writes values under this peer's names; "" for nowhere."""


PEERS = {
    "verl": Peer("verl", "0.9.1", "run",
                 "`verl.trainer.ppo.rollout_corr_helper.compute_offpolicy_metrics`, "
                 "`compute_rollout_correction_weights`; "
                 "`verl.utils.debug.metrics.calculate_debug_metrics`",
                 "`suite import verl` copies the mismatch metrics of a verl log: under the suite "
                 "key where marked =, otherwise under `verl/<verl name>`"),
    "TRL": Peer("TRL", "1.16.0", "run", "the importance-sampling and `sampling/*` blocks of "
                "`trl.GRPOTrainer._generate_and_score_completions`"),
    "slime": Peer("slime", "624b824a898ab0ec1fcb4d373004c7f3852bf515", "read",
                  "`slime/backends/megatron_utils/loss.py` (`policy_loss_function`), "
                  "`cp_utils.get_sum_of_sample_mean`"),
    "prime-rl": Peer("prime-rl", "559b44772e471d1538537b8805cc77f3824a5e64", "read",
                     "`src/prime_rl/trainer/rl/loss.py` "
                     "(`compute_importance_ratio_and_mismatch_kl`), "
                     "`src/prime_rl/trainer/rl/train.py`, `trainer/utils.py` (`compute_stats`)"),
    "Oat": Peer("Oat", "c1a074c320ff5ca9fe9a4f669bf05208e2f310be", "read",
                "`oat/algorithms/ppo.py` (`PPOLearner`)"),
}

# relation -> what differs. Every relation but "identical" and "other" has a test that the
# difference is exactly this one (tests/test_conformance.py).
RELATIONS = {
    "identical": "the same number",
    "empty_rows": "the peer counts a row without response tokens as a sequence with log-ratio 0 "
                  "(weight 1); equal to the suite's once such rows are dropped",
    "sample_std": "the peer's std divides by n - 1 (NaN for one token); the suite's by n: "
                  "suite = peer * sqrt((n - 1) / n)",
    "token_weighted": "the peer averages the sequence weight w_s over response tokens, so sequence "
                      "s counts n_s times (its response tokens; a row without any not at all, as "
                      "in the suite): mean sum_s(n_s w_s) / sum_s(n_s), ESS (sum_s n_s w_s)^2 / "
                      "(sum_s(n_s) sum_s(n_s w_s^2)); the suite counts each sequence once. Equal "
                      "when all rows have the same number of response tokens",
    "other": "a different quantity, described in the note",
}

# "": any; IS diagnostics depend on the level of the correction
PEER_LEVELS = ("", "token", "sequence")


@dataclass(frozen=True)
class Counterpart:
    peer: str
    name: str
    relation: str
    level: str = ""
    """For IS diagnostics: the correction level ("token" or "sequence") the relation holds at; ""
    for all."""
    note: str = ""


@dataclass(frozen=True)
class Metric:
    key: str
    formula: str
    counterparts: tuple[Counterpart, ...] = ()


def _c(peer: str, name: str, relation: str = "identical", level: str = "",
       note: str = "") -> Counterpart:
    if peer not in PEERS or relation not in RELATIONS or level not in PEER_LEVELS:
        raise ValueError(f"bad counterpart {peer!r} {name!r} {relation!r} {level!r}")
    return Counterpart(peer, name, relation, level, note)


# A batch without any response token (every row empty), per peer; tests/test_conformance.py checks
# each line on the peers' code. The suite has no number to report there, so it reports NaN rather
# than a value that looks like a measurement (TRL's 0.0, "no mismatch"; its 1.0, "weights uniform").
EMPTY_BATCH = {
    "suite": "NaN for every mismatch metric and IS diagnostic",
    "verl": "`compute_offpolicy_metrics` fails an assertion and "
            "`compute_rollout_correction_and_rejection_mask` raises ValueError, so no "
            "`rollout_corr/*` is logged; `calculate_debug_metrics` gives NaN for "
            "`training/rollout_probs_diff_{mean,max,std}`",
    "TRL": "0.0 for `sampling/sampling_logp_difference/{mean,max}` and, with a token-level mode, "
           "for `sampling/importance_sampling_ratio/{min,mean,max}`; 1.0 for the latter with a "
           "sequence-level mode (every row counts as a sequence with log-ratio 0)",
}
_TRL_NAN = "TRL leaves out tokens whose sampler log-prob is NaN (the suite's value is NaN then)"

# Token means pool every response token of the batch; sequence statistics use the rows with at least
# one response token; rho_t = pi_t / mu_t = exp(log pi_t - log mu_t); "clamped" = log-ratio clamped
# to +-20 before exp (verl's SAFETY_BOUND). Keys of suite.numerics.mismatch.mismatch_metrics, then
# suite.rl.algos.is_weights.
METRICS = (
    Metric("mismatch/kl_k1", "mean_tok(log mu - log pi), k1 estimate of KL(mu || pi)",
           (_c("verl", "rollout_corr/kl"), _c("Oat", "kl_sample_train_v1"))),
    Metric("mismatch/kl_k2", "0.5 mean_tok((log mu - log pi)^2)",
           (_c("Oat", "kl_sample_train_v2"),)),
    Metric("mismatch/kl_k3", "mean_tok(rho - log rho - 1), not clamped",
           (_c("verl", "rollout_corr/k3_kl"),
            _c("prime-rl", "mismatch_kl/all/mean", note="at the trainer's current parameters, over "
                                                        "the step's "
               "micro-batches; the same as the suite's when taken before the update"))),
    Metric("mismatch/prob_diff/mean", "mean_tok abs(pi_t - mu_t)",
           (_c("verl", "training/rollout_probs_diff_mean"),)),
    Metric("mismatch/prob_diff/max", "max_tok abs(pi_t - mu_t)",
           (_c("verl", "training/rollout_probs_diff_max"),)),
    Metric("mismatch/prob_diff/std", "population std_tok abs(pi_t - mu_t)",
           (_c("verl", "training/rollout_probs_diff_std", "sample_std"),)),
    Metric("mismatch/logprob_diff/mean", "mean_tok abs(log pi - log mu)",
           (_c("TRL", "sampling/sampling_logp_difference/mean", note=_TRL_NAN),
            _c("slime", "train/train_rollout_logprob_abs_diff", "other",
               note="per sample, the token sum of abs(log pi - log mu) divided by the "
                    "response-token total of its rollout (the samples sharing a rollout id, one by "
                    "default), summed and divided by the step's sample count: the mean over "
                    "samples of each sample's token mean, not the pooled token mean; with "
                    "`--calculate-per-token-loss` the pooled token mean (the suite's). log pi is "
                    "the old policy's, or the current one's with `--use-rollout-logprobs`"))),
    Metric("mismatch/logprob_diff/max", "max_tok abs(log pi - log mu)",
           (_c("TRL", "sampling/sampling_logp_difference/max", note=_TRL_NAN),)),
    Metric("mismatch/seq_log_ratio/mean_abs", "mean_seq abs(sum_t(log pi - log mu))"),
    Metric("mismatch/seq_log_ratio/max_abs", "max_seq abs(sum_t(log pi - log mu))"),
    Metric("mismatch/seq_log_ratio/std", "population std_seq sum_t(log pi - log mu)"),
    Metric("mismatch/log_ppl_diff", "mean_seq[mean_t(-log pi) - mean_t(-log mu)] (trainer minus "
                                    "sampler)",
           (_c("verl", "rollout_corr/log_ppl_diff", "empty_rows"),)),
    Metric("mismatch/ppl_ratio", "mean_seq exp(mean_t(log mu - log pi)) (trainer ppl / sampler "
                                 "ppl), not clamped",
           (_c("verl", "rollout_corr/ppl_ratio", "empty_rows"),)),
    Metric("mismatch/chi2_token", "mean_tok(rho_t^2) - 1, clamped",
           (_c("verl", "rollout_corr/chi2_token"),)),
    Metric("mismatch/chi2_seq", "mean_seq(rho_seq^2) - 1, rho_seq = prod_t rho_t, clamped",
           (_c("verl", "rollout_corr/chi2_seq", "empty_rows"),)),
    Metric("mismatch/exp_abs_logprob_diff/mean", "mean_tok exp(abs(log pi - log mu)), clamped"),
    # IS diagnostics (suite.rl.algos.is_weights). "raw" weight: exp of the clamped log-ratio, per
    # token (token corrections) or per sequence (sequence corrections), before truncation or
    # masking; "applied": after.
    Metric("is/weight/mean", "mean over units of the raw weight (before truncation or masking)"),
    Metric("is/weight/min", "min over units of the raw weight"),
    Metric("is/weight/max", "max over units of the raw weight",
           (_c("verl", "rollout_corr/rollout_is_max", "empty_rows", "sequence",
               note="verl clamps this one only from above: it also differs when every sequence "
                    "log-ratio of the batch is below -20 (the suite's floor is exp(-20))"),)),
    Metric("is/applied/mean", "mean over units of the applied weight (after truncation or masking)",
           (_c("TRL", "sampling/importance_sampling_ratio/mean", level="token"),
            _c("TRL", "sampling/importance_sampling_ratio/mean", "empty_rows", "sequence"),
            _c("verl", "rollout_corr/rollout_is_mean", level="token"),
            _c("verl", "rollout_corr/rollout_is_mean", "token_weighted", "sequence"))),
    Metric("is/applied/min", "min over units of the applied weight",
           (_c("TRL", "sampling/importance_sampling_ratio/min", level="token"),
            _c("TRL", "sampling/importance_sampling_ratio/min", "empty_rows", "sequence"),
            _c("verl", "rollout_corr/rollout_is_min", level="token"))),
    Metric("is/applied/max", "max over units of the applied weight",
           (_c("TRL", "sampling/importance_sampling_ratio/max", level="token"),
            _c("TRL", "sampling/importance_sampling_ratio/max", "empty_rows", "sequence"),
            _c("verl", "rollout_corr/rollout_is_max", level="token"))),
    Metric("is/ess", "(sum w)^2 / (n sum w^2) of the applied weights over the n units; 1 = "
                     "uniform, 0 = all masked",
           (_c("verl", "rollout_corr/rollout_is_eff_sample_size", level="token",
               note="verl adds 1e-8 to the mean weight: agrees to 1e-6 while the mean applied "
                    "weight is above 1e-2"),
            _c("verl", "rollout_corr/rollout_is_eff_sample_size", "token_weighted", "sequence"))),
    Metric("is/truncated_frac", "share of units whose raw weight exceeds C and is truncated (TIS); "
                                "0 otherwise",
           (_c("verl", "rollout_corr/rollout_is_ratio_fraction_high", level="token"),
            _c("verl", "rollout_corr/rollout_is_ratio_fraction_high", "empty_rows", "sequence"))),
    Metric("is/masked_frac", "share of units whose raw weight exceeds C and is masked to 0 (MIS); "
                             "0 otherwise"),
)

# The suite's corrections and the peer settings that apply the same weights (compared weight by
# weight on the response tokens in tests/test_conformance.py). verl's rollout_is thresholds truncate
# only (a "lower_upper" string is IcePop, two-sided); TRL's clip_min must stay None (its default)
# for the one-sided suite weights.
CORRECTION_PEERS = {
    "token_tis": {"verl": "rollout_is='token', rollout_is_threshold=C",
                  "TRL": "vllm_importance_sampling_mode='token_truncate', "
                         "vllm_importance_sampling_clip_max=C"},
    "seq_tis": {"verl": "rollout_is='sequence', rollout_is_threshold=C",
                "TRL": "vllm_importance_sampling_mode='sequence_truncate', "
                       "vllm_importance_sampling_clip_max=C"},
    "seq_mis": {"TRL": "vllm_importance_sampling_mode='sequence_mask', "
                       "vllm_importance_sampling_clip_max=C"},
}

# Peer keys with no suite counterpart, so that nobody looks for one (and why).
UNMATCHED = {
    "verl": {"rollout_corr/rollout_is_min (sequence level)": "exp of the smallest sequence "
                                                             "log-ratio, not clamped "
             "below: the suite clamps at exp(-20)",
             "rollout_corr/training_ppl, rollout_ppl, *_log_ppl, log_ppl_abs_diff, "
             "log_ppl_diff_{max,min}":
             "per-engine perplexities; not logged by the suite",
             "rollout_corr/rollout_is_std, rollout_is_seq_*": "not logged by the suite",
             "training/rollout_actor_probs_pearson_corr": "not logged by the suite"},
    "prime-rl": {"masked_mismatch_kl, unmasked_mismatch_kl": "k3 over the tokens its DPPO/IPO "
                                                             "trust region masks "
                 "or keeps"},
}


def metric(key: str) -> Metric:
    for m in METRICS:
        if m.key == key:
            return m
    raise KeyError(f"{key!r} is not in the metric table")


def counterparts(peer: str, level: str = "") -> list[tuple[str, Counterpart]]:
    """(suite key, counterpart) for every name of `peer` that holds at correction `level` ("token"
    or "sequence": the IS diagnostics), or for every level-free name (level "": the mismatch
    metrics)."""
    return [(m.key, c) for m in METRICS for c in m.counterparts if c.peer == peer
            and c.level == level]
