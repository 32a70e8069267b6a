"""The algorithm table (no torch import): one name -> advantage, surrogate, IS correction,
aggregation.

Each row is a parameter setting of the shared loss kernel in suite/rl/algos.py, which re-exports
this table and documents the notation; the table lives here, apart from the kernels, so that
``suite ls algorithms``, ``--help`` and config validation read it without loading torch.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field

from suite.names import did_you_mean

ADVANTAGE_MODES = ("mean", "std")
SURROGATES = ("ppo", "pg", "gspo")
AGG_MODES = ("token-mean", "seq-mean-token-sum", "seq-mean-token-mean", "seq-mean-token-sum-norm")

# correction -> (level the weight lives at, what happens to weights above C).
# "truncate" = min(weight, C) (TIS); "mask" = weight * 1{weight <= C} (MIS); "keep" = plain IS.
_CORRECTIONS: dict[str, tuple[str, str] | None] = {
    "none": None,
    "token_tis": ("token", "truncate"),
    "seq_is": ("seq", "keep"),
    "seq_tis": ("seq", "truncate"),
    "seq_mis": ("seq", "mask"),
}
CORRECTIONS = tuple(_CORRECTIONS)


def _check_choice(field_name: str, value: str, allowed: tuple[str, ...]) -> None:
    if value not in allowed:
        raise ValueError(
            f"Algorithm.{field_name}={value!r} is not one of "
            f"{allowed}{did_you_mean(str(value), allowed)}"
        )


@dataclass(frozen=True)
class Algorithm:
    """One row of the table. Validated on construction, so a bad override fails early."""

    name: str
    """Registry key, also used in run names (`task__algo__precision__sSEED`)."""
    advantage: str
    """One of ADVANTAGE_MODES: mean = r - group mean (Dr.GRPO); std = (r - mean) / (std + 1e-6)
    (GRPO)."""
    surrogate: str
    """One of SURROGATES: ppo = clipped r_t; pg = -A log pi (REINFORCE); gspo = clipped sequence
    ratio."""
    correction: str
    """Mismatch IS correction, one of CORRECTIONS; none = the sampler's log-probs are not used."""
    C: float
    """IS threshold: truncation cap (TIS) or mask threshold (MIS). Unused when correction="none"."""
    clip_low: float
    """eps_low of the PPO/GSPO clip: ratios below 1 - clip_low are clipped. Unused by "pg"."""
    clip_high: float
    """eps_high: ratios above 1 + clip_high are clipped (DAPO's clip-higher when > clip_low)."""
    agg: str
    """Loss aggregation, one of AGG_MODES (VeRL `loss_agg_mode` names)."""
    source: str
    """Citation: paper arXiv id and equation / section, and the reference implementation."""
    uses_sampler_logp: bool = field(init=False)
    """Derived: True iff the correction needs the sampler's log-probs (log mu)."""

    def __post_init__(self) -> None:
        _check_choice("advantage", self.advantage, ADVANTAGE_MODES)
        _check_choice("surrogate", self.surrogate, SURROGATES)
        _check_choice("correction", self.correction, CORRECTIONS)
        _check_choice("agg", self.agg, AGG_MODES)
        if not (isinstance(self.C, (int, float)) and self.C > 0 and math.isfinite(self.C)):
            raise ValueError(f"Algorithm.C must be a finite number > 0, got {self.C!r}")
        for name in ("clip_low", "clip_high"):
            value = getattr(self, name)
            if not (isinstance(value, (int, float)) and value >= 0 and math.isfinite(value)):
                raise ValueError(f"Algorithm.{name} must be a finite number >= 0, got {value!r}")
        object.__setattr__(self, "uses_sampler_logp", self.correction != "none")


# ---------------------------------------------------------------------------- the table
_PRECISION_RL = "arXiv 2510.26788 (sanity test; github.com/sail-sg/Precision-RL)"
_DR_GRPO = "Dr.GRPO advantage and constant normaliser arXiv 2503.20783 (Sec. 3)"
_PPO_CLIP = "PPO-clip arXiv 1707.06347 Eq. (7)"
_TIS = "TIS: Yao et al. 2025, fengyao.notion.site/off-policy-rl"
_MIS = "MIS: Liu, Li et al. 2025, 'When Speed Kills Stability', richardli.xyz/rl-collapse"


def _precision_rl(name: str, surrogate: str, correction: str, paper_name: str,
                  extra: str) -> Algorithm:
    """The sanity-test defaults: Dr.GRPO advantage, token sum / max length, clip 0.2/0.28, C = 3."""
    return Algorithm(
        name=name, advantage="mean", surrogate=surrogate, correction=correction, C=3.0,
        clip_low=0.2, clip_high=0.28, agg="seq-mean-token-sum-norm",
        source=f"{_PRECISION_RL} '{paper_name}'; {extra}",
    )


ALGORITHMS: dict[str, Algorithm] = {a.name: a
                                    for a in (
                                        _precision_rl("grpo", "ppo", "none", "PPO",
                                                      f"{_PPO_CLIP}; {_DR_GRPO}"),
                                        _precision_rl("grpo_token_tis", "ppo", "token_tis",
                                                      "PPO-Token-TIS",
                                                      f"l_t * min(rho_t, C); {_TIS}"),
                                        _precision_rl("grpo_seq_tis", "ppo", "seq_tis",
                                                      "PPO-Seq-TIS", f"l_t * min(rho, C); {_TIS}"),
                                        _precision_rl("grpo_seq_mis", "ppo", "seq_mis",
                                                      "PPO-Seq-MIS",
                                                      f"l_t * rho * 1{{rho <= C}}; {_MIS}"),
                                        _precision_rl("pg_seq_is", "pg", "seq_is", "PG-Seq-IS",
                                                      "-A * sg(w) * log pi_t, importance-weighted "
                                                      "PG"),
                                        _precision_rl("pg_seq_tis", "pg", "seq_tis", "PG-Seq-TIS",
                                                      f"-A * min(w, C) * log pi_t; {_TIS}"),
                                        _precision_rl("pg_seq_mis", "pg", "seq_mis", "PG-Seq-MIS",
                                                      f"-A * w * 1{{w <= C}} * log pi_t; {_MIS}"),
                                        Algorithm(name="gspo", advantage="std", surrogate="gspo",
                                                  correction="none", C=3.0, clip_low=3e-4,
                                                  clip_high=4e-4, agg="seq-mean-token-mean",
                                                  source="GSPO arXiv 2507.18071 (Sec. 4: sequence "
                                                         "ratio s_i and the GSPO-token variant; "
                                                         "clip 3e-4/4e-4 from Sec. 5.1); "
                                                         "'Vanilla-GSPO' in " + _PRECISION_RL,),
                                        Algorithm(name="grpo_vanilla", advantage="std",
                                                  surrogate="ppo", correction="none", C=3.0,
                                                  clip_low=0.2, clip_high=0.2,
                                                  agg="seq-mean-token-mean",
                                                  source="GRPO arXiv 2402.03300 Eq. (3) objective, "
                                                         "Sec. 4.1.2 advantage; " + _PPO_CLIP,),
                                        Algorithm(name="dr_grpo", advantage="mean", surrogate="ppo",
                                                  correction="none", C=3.0, clip_low=0.2,
                                                  clip_high=0.2, agg="seq-mean-token-sum-norm",
                                                  source=_DR_GRPO + "; " + _PPO_CLIP,),
                                        Algorithm(name="dapo", advantage="std", surrogate="ppo",
                                                  correction="none", C=3.0, clip_low=0.2,
                                                  clip_high=0.28, agg="token-mean",
                                                  source="DAPO arXiv 2503.14476 (Sec. 3.1 "
                                                         "clip-higher, Sec. 3.3 token-level loss); "
                                                         "dynamic sampling and overlong shaping "
                                                         "are not part of the loss",),)}


# The row fields a config may override (``algo.C=...``, suite/rl/recipe.py AlgoConfig).
ROW_KNOBS = ("C", "clip_low", "clip_high", "agg", "advantage")


def get_algorithm(name: str, **overrides) -> Algorithm:
    """The table entry `name`, with dataclass fields replaced by `overrides` (validated)."""
    if name not in ALGORITHMS:
        raise ValueError(
            f"unknown algorithm {name!r}{did_you_mean(name, ALGORITHMS)} (known: "
            f"{', '.join(ALGORITHMS)})"
        )
    settable = [f.name for f in dataclasses.fields(Algorithm) if f.init]
    for key in overrides:
        if key not in settable:
            raise ValueError(
                f"unknown Algorithm field {key!r}{did_you_mean(key, settable)} (settable: "
                f"{', '.join(settable)})"
            )
    return dataclasses.replace(ALGORITHMS[name], **overrides)


# ---------------------------------------------------------------------------- in words
# What a row computes, in words: `suite ls algorithms` and `--help` say what a name means from its
# settings, so a name that another framework uses differently (verl's and TRL's "grpo" is
# grpo_vanilla here) cannot hide them.
_ADVANTAGE_WORDS = {"mean": "r - mean, no std", "std": "(r - mean) / std"}
_AGG_WORDS = {"token-mean": "token-mean", "seq-mean-token-mean": "seq-mean of token-means",
              "seq-mean-token-sum": "seq-mean of token-sums",
              "seq-mean-token-sum-norm": "token-sum / max length"}
# (advantage, aggregation) -> the method that defines that pair.
_FAMILIES = {("mean", "seq-mean-token-sum-norm"): "Dr.GRPO", ("std", "seq-mean-token-mean"): "GRPO",
             ("std", "token-mean"): "DAPO"}
_CORRECTION_WORDS = {"none": "no IS correction", "token_tis": "token TIS C={C:g}",
                     "seq_is": "seq IS (untruncated)", "seq_tis": "seq TIS C={C:g}",
                     "seq_mis": "seq MIS C={C:g}"}


def in_words(a: Algorithm) -> str:
    """One line saying what row ``a`` computes: advantage and loss aggregation (and whose they are),
    surrogate and clip range, IS correction."""
    family = _FAMILIES.get((a.advantage, a.agg))
    adv_loss = f"{_ADVANTAGE_WORDS[a.advantage]}; {_AGG_WORDS[a.agg]}"
    adv_loss = (f"{family} advantage and loss ({adv_loss})" if family
                else f"advantage and loss ({adv_loss})")
    clip = f"[{1 - a.clip_low:g}, {1 + a.clip_high:g}]" + (
        " (clip-higher)" if a.clip_high > a.clip_low else "")
    surrogate = {"ppo": f"PPO-clip {clip}", "pg": "policy gradient -A log pi (no PPO clip)",
                 "gspo": f"GSPO sequence-ratio clip {clip}"}[a.surrogate]
    words = f"{adv_loss}; {surrogate}; {_CORRECTION_WORDS[a.correction].format(C=a.C)}"
    return f"{words}; {note}" if (note := elsewhere(a)) else words


# ---------------------------------------------------------------------------- the same name
# elsewhere Names this table shares with verl and TRL, and the settings their defaults run under
# that name (the flag-by-flag mapping is docs/algorithms.md): verl adv_estimator=grpo with
# norm_adv_by_std_in_grpo=True, clip_ratio=0.2, loss_agg_mode=token-mean; TRL GRPOConfig
# scale_rewards="group", epsilon=0.2, loss_type="dapo" (token-mean). DAPO (arXiv 2503.14476) is a
# loss plus dynamic sampling and overlong reward shaping, which the suite does not have.
ELSEWHERE: dict[str, tuple[str, dict, str]] = {
    "grpo": ("verl's and TRL's GRPO",
             {"advantage": "std", "clip_low": 0.2, "clip_high": 0.2, "agg": "token-mean"}, ""),
    "dapo": ("DAPO as published and in verl's recipe",
             {"advantage": "std", "clip_low": 0.2, "clip_high": 0.28,
                                                         "agg": "token-mean"},
             "the loss only, without DAPO's dynamic sampling and overlong reward shaping"),
}
_KNOB = {"advantage": "algo.advantage", "clip_low": "algo.clip_low", "clip_high": "algo.clip_high",
         "agg": "algo.agg"}


def elsewhere(a: Algorithm) -> str:
    """What separates row ``a`` from what verl and TRL run under the same name ("" when nothing
    does), with the ``algo.*`` knobs that make it theirs. The name compared is the row's without its
    correction suffix (grpo_seq_tis is grpo with seq TIS), so an overridden row that matches theirs
    carries no warning."""
    base = a.name.removesuffix(f"_{a.correction}") if a.correction != "none" else a.name
    if base not in ELSEWHERE:
        return ""
    whose, theirs, scope = ELSEWHERE[base]
    knobs = [f"{_KNOB[k]}={v:g}" if isinstance(v, float) else f"{_KNOB[k]}={v}"
             for k, v in theirs.items() if getattr(a, k) != v]
    if knobs:
        return f"NOT {whose} (theirs: algorithm={a.name} {' '.join(knobs)})"
    return f"{whose}: {scope}" if scope else ""
