"""Transferability Index: does an RL recipe keep the model's general abilities?

A precision flow that reaches the same training reward but forgets more is worse, so next to
reward and mismatch the suite measures how a run's gain on its own (math) group transfers to
other reasoning and to non-reasoning benchmarks. The formulas are those of arXiv 2507.00432
("Does Math Reasoning Improve General LLM Capabilities?", section 3 and Table 1;
section 6). Every model is compared with its own base checkpoint; scores are accuracies in
percent, R_b for benchmark b, grouped into G = {math, other, non}.

- v1 (relative gain):   gain_g = mean_{b in g} (R_model_b - R_base_b) / R_base_b
                        TI_g   = 100 * gain_g / gain_math
- v2 (the published one): dR_b = R_model_b - R_base_b;  delta_b = dR_b / sigma_g;
                        s_b = sign(delta_b) * sqrt(|delta_b|); w_b = (100 - R_base_b) / sum_{b' in
                        g} (100 - R_base_b')
                        DI_g = sum_{b in g} w_b s_b;  TI_g = 100 * DI_g / DI_math
  sigma_g is not reproducible from the paper, so it is a parameter (``SIGMAS``):
    per_model  population std of dR_b over the group's benchmarks, for this model alone;
    pooled     population std of dR_b over the group's benchmarks of every model evaluated together;
    fixed      constants given by the user (one per group);
    none       sigma_g = 1 (the "no-sigma" variant). The published values equal the no-sigma values
               times one constant per group, which is what one sigma per group shared by a larger
               model pool produces (arXiv 2507.00432, Sec. 3).
  With equal group sizes the choice of ddof cancels in TI; we use ddof=0 so that a group of one
  benchmark has sigma 0 (flagged) rather than NaN.

TI > 0 is transfer, TI < 0 forgetting. A TI is a ratio to the math gain: undefined when the math
gain is 0 and meaningless when math got worse, so those cases are *flagged* (value None plus a
flag string) instead of printed as a number. Test vectors: tests/test_transfer.py (Table 1).

This module is pure arithmetic on score dicts; suite/rl/evaluate.py produces the scores with
lm-eval and writes them into the run bundle.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

GROUPS = ("math", "other", "non")  # math (the trained family), other reasoning, non-reasoning
TARGETS = ("other", "non")  # the groups a TI is reported for
SIGMAS = ("per_model", "pooled", "fixed", "none")

# Flags: a TI that would be a misleading number is None and carries one of these instead.
MATH_GAIN_ZERO = "math_gain_zero"  # TI = x / 0: undefined
MATH_GAIN_NEGATIVE = "math_gain_negative"  # math got worse: the ratio's sign means nothing
BASE_SCORE_ZERO = "base_score_zero"  # v1 divides by R_base: a 0 base score has no relative gain
SIGMA_ZERO = "sigma_zero"  # v2: dR differs within a group but its spread is 0 (e.g. one benchmark)

Scores = Mapping[str, float]  # benchmark -> accuracy in percent
Groups = Mapping[str, Sequence[str]]  # group -> benchmarks


def _mean(xs: Sequence[float]) -> float:
    return sum(xs) / len(xs)


def _pstd(xs: Sequence[float]) -> float:
    """Population standard deviation (ddof=0)."""
    m = _mean(xs)
    return math.sqrt(sum((x - m) ** 2 for x in xs) / len(xs))


def _sign_sqrt(x: float) -> float:
    return math.copysign(math.sqrt(abs(x)), x) if x else 0.0


def _ratio(gains: Mapping[str, float | None], flags: list[str]) -> dict[str, float | None]:
    """100 * gain_g / gain_math per target group; None (with a flag) when it is not a number."""
    g_math = gains.get("math")
    if g_math is None:  # already flagged by whoever could not compute it
        return dict.fromkeys(TARGETS)
    if g_math <= 0:
        flags.append(MATH_GAIN_ZERO if g_math == 0 else MATH_GAIN_NEGATIVE)
        return dict.fromkeys(TARGETS)
    return {g: None if gains.get(g) is None else 100.0 * gains[g] / g_math for g in TARGETS}


# ---- v1 --------------------------------------------------------------------------------------
def relative_gains(base: Scores, model: Scores, groups: Groups,
                   flags: list[str]) -> dict[str, float | None]:
    """gain_g = mean over the group of (R_model - R_base) / R_base (arXiv 2507.00432, TI v1)."""
    out: dict[str, float | None] = {}
    for g, benches in groups.items():
        if any(base[b] == 0 for b in benches):
            flags.append(f"{BASE_SCORE_ZERO}:{g}")
            out[g] = None
            continue
        out[g] = _mean([(model[b] - base[b]) / base[b] for b in benches])
    return out


def ti_v1(base: Scores, model: Scores, groups: Groups) -> tuple[dict[str, float | None], list[str]]:
    """({other: TI, non: TI}, flags) with TI_g = 100 * gain_g / gain_math."""
    flags: list[str] = []
    return _ratio(relative_gains(base, model, groups, flags), flags), flags


# ---- v2 --------------------------------------------------------------------------------------
def deltas(base: Scores, model: Scores, benches: Sequence[str]) -> list[float]:
    """dR_b = R_model_b - R_base_b, in points."""
    return [model[b] - base[b] for b in benches]


def sigma_per_model(base: Scores, model: Scores, groups: Groups) -> dict[str, float]:
    """sigma_g of one model: the population std of its dR_b over the group's benchmarks."""
    return {g: _pstd(deltas(base, model, benches)) for g, benches in groups.items()}


def sigma_pooled(pairs: Sequence[tuple[Scores, Scores]], groups: Groups) -> dict[str, float]:
    """sigma_g shared by several models: the std of dR_b over (model, benchmark in g) pairs.
    ``pairs`` holds each model's (base scores, model scores); every model keeps its own base."""
    return {g: _pstd([d for base, model in pairs for d in deltas(base, model, benches)])
            for g, benches in groups.items()}


def group_di(base: Scores, model: Scores, benches: Sequence[str], sigma: float, flags: list[str],
             name: str) -> float | None:
    """DI_g = sum_b w_b * sign(delta_b) sqrt|delta_b|, delta_b = dR_b / sigma, w_b ~ 100 -
    R_base_b."""
    d = deltas(base, model, benches)
    if sigma == 0:
        if all(x == 0 for x in d):
            return 0.0  # nothing moved: no transfer, no forgetting
        flags.append(f"{SIGMA_ZERO}:{name}")
        return None
    w = [100.0 - base[b] for b in benches]
    total = sum(w)
    if total == 0:  # every base score is 100: plain mean
        w, total = [1.0] * len(benches), float(len(benches))
    return sum(wi / total * _sign_sqrt(x / sigma) for wi, x in zip(w, d))


def ti_v2(base: Scores, model: Scores, groups: Groups,
          sigma: Mapping[str, float] | None = None) -> tuple[dict[str, float | None], list[str]]:
    """({other: TI, non: TI}, flags) with TI_g = 100 * DI_g / DI_math; ``sigma=None`` is the
    no-sigma variant (sigma_g = 1)."""
    flags: list[str] = []
    # A sigma > 0 only scales DI_math, so its sign (did math improve?) is the no-sigma one: flag
    # that first.
    direction = group_di(base, model, groups["math"], 1.0, flags, "math")
    if direction <= 0:
        return _ratio({"math": direction}, flags), flags
    di = {g: group_di(base, model, benches, 1.0 if sigma is None else sigma[g], flags, g)
          for g, benches in groups.items()}
    return _ratio(di, flags), flags


# ---- every variant at once ---------------------------------------------------------------------
def check_groups(groups: Groups, *score_dicts: Scores) -> None:
    """ValueError naming what is missing: the three groups, each non-empty, each benchmark
    scored."""
    missing = [g for g in GROUPS if not groups.get(g)]
    if missing:
        raise ValueError(f"transfer groups: {', '.join(missing)} missing or empty (need "
                         f"{', '.join(GROUPS)})")
    for scores in score_dicts:
        absent = [b for g in GROUPS for b in groups[g] if b not in scores]
        if absent:
            raise ValueError(f"transfer scores: no score for {', '.join(absent)}")


def group_means(scores: Scores, groups: Groups) -> dict[str, float]:
    """Plain mean score per group (for tables; the TI uses the per-benchmark scores)."""
    return {g: _mean([scores[b] for b in benches]) for g, benches in groups.items()}


def all_variants(base: Scores, model: Scores, groups: Groups,
                 pooled: Mapping[str, float] | None = None,
                 fixed: Mapping[str, float] | None = None) -> dict:
    """Every TI variant of one model against its base, with the sigmas used and the flags.

    Returns ``{"v1": {...}, "v2_per_model": {...}, "v2_pooled": {...}, "v2_fixed": {...},
    "v2_no_sigma": {...}, "sigma": {...}, "flags": {variant: [...]}, "delta": {...}}``; a variant
    whose sigma was not given (pooled, fixed) is left out.
    """
    check_groups(groups, base, model)
    groups = {g: list(groups[g]) for g in GROUPS}
    out: dict = {"flags": {}, "sigma": {"per_model": sigma_per_model(base, model, groups)}}
    out["v1"], out["flags"]["v1"] = ti_v1(base, model, groups)
    variants = {"v2_per_model": out["sigma"]["per_model"], "v2_no_sigma": None}
    if pooled is not None:
        out["sigma"]["pooled"] = dict(pooled)
        variants["v2_pooled"] = pooled
    if fixed is not None:
        out["sigma"]["fixed"] = dict(fixed)
        variants["v2_fixed"] = fixed
    for name, sigma in variants.items():
        out[name], out["flags"][name] = ti_v2(base, model, groups, sigma)
    base_m, model_m = group_means(base, groups), group_means(model, groups)
    out["delta"] = {g: model_m[g] - base_m[g] for g in GROUPS}  # mean dR per group, points
    return out


def parse_sigma(text: str) -> dict[str, float]:
    """``"math=2.1,other=1.3,non=4"`` -> {group: sigma}; ValueError naming what is wrong."""
    out = {}
    for part in filter(None, (p.strip() for p in text.split(","))):
        key, sep, value = part.partition("=")
        if not sep or key not in GROUPS:
            raise ValueError(f"--sigma: '{part}' is not GROUP=VALUE with GROUP in "
                             f"{', '.join(GROUPS)}")
        try:
            out[key] = float(value)
        except ValueError:
            raise ValueError(f"--sigma: '{value}' is not a number (in '{part}')") from None
        if not out[key] > 0:
            raise ValueError(f"--sigma: {key} must be > 0")
    if set(out) != set(GROUPS):
        raise ValueError(f"--sigma: give all of {', '.join(GROUPS)} (got "
                         f"{', '.join(out) or 'none'})")
    return out


# ---- reading a bundle's transfer.json (reports and the leaderboard) -----------------------------
# the variant shown in leaderboard columns: deterministic per run (no pool)
HEADLINE = "v2_no_sigma"


def load(run_dir) -> dict | None:
    """A run's ``transfer.json`` (written by ``suite transfer``), or None when absent or
    unreadable."""
    import json
    from pathlib import Path

    path = Path(run_dir) / "transfer.json"
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return doc if isinstance(doc, dict) and isinstance(doc.get("ti"), dict) else None


def summary_keys(doc: dict | None) -> dict[str, float | None]:
    """Flat ``transfer/*`` numbers for tables: the headline TI per target group (None when flagged)
    and the mean score change per group in points."""
    if not doc:
        return {}
    out = {f"transfer/ti_{g}": doc["ti"].get(HEADLINE, {}).get(g) for g in TARGETS}
    out.update({f"transfer/delta_{g}": doc.get("delta", {}).get(g) for g in GROUPS})
    return out


def flags_of(doc: dict | None) -> list[str]:
    """Every flag of a transfer.json (variant flags and run flags), without duplicates."""
    if not doc:
        return []
    flags = [f for fl in (doc.get("flags") or {}).values()
             for f in fl] + list(doc.get("run_flags") or [])
    return list(dict.fromkeys(flags))
