"""Figures of any committed grid, by cell, for the documents' generated spans
(suite/experiments/docfigures.py): final accuracies, gaps to a reference cell, seeds, step-0
mismatch over seeds, clipping and IS diagnostics.
"""

from __future__ import annotations

import statistics
from functools import cache

from suite.results import REFERENCE_ROOT

STEP0 = "mismatch/step0/"


def span(lo: float, hi: float, spec: str) -> str:
    """Two values as "lo-hi" in ``spec``, one when they print alike."""
    a, b = format(lo, spec), format(hi, spec)
    return a if a == b else f"{a}-{b}"


# A cell is named by its grid's folder under results/reference/ and a filter on the run's config:
# "cpu-avx2-emulated/collapse-search" and "regime=stress,precision=bf16_fp8rollout" (dotted fields,
# e.g. algo.ppo_ref=sampler; a run without the field counts as regime=base, like
# suite/analysis/collapse.py).
@cache
def _grid(path: str) -> tuple:
    from suite.analysis.runs import load_runs

    return tuple(r for r in load_runs(REFERENCE_ROOT / path) if r.verdict != "incomplete")


def _field(run, dotted: str):
    node = run.config or {}
    for part in dotted.split("."):
        node = node.get(part) if isinstance(node, dict) else None
    return "base" if node is None and dotted == "regime" else node


def cell(path: str, filt: str) -> list:
    """The complete runs of a committed grid whose config matches every ``field=value`` of
    ``filt``."""
    want = dict(kv.split("=", 1) for kv in filt.split(",") if kv)
    runs = [r for r in _grid(path) if all(str(_field(r, k)) == v for k, v in want.items())]
    if not runs:
        raise ValueError(f"{path}: no complete run with {filt}")
    return sorted(runs, key=lambda r: r.seed)


def _finals(path: str, filt: str) -> list[float]:
    return [r.summary["accuracy/final"] for r in cell(path, filt)]


def f_step0_cell(path: str, filt: str, key: str = "kl_k3") -> str:
    """A cell's step-0 mismatch over its seeds: "6.9e-05 [4.3e-05, 8.8e-05] (3 runs)", one run its
    value."""
    v = [r.summary[STEP0 + key] for r in cell(path, filt)]
    return (f"{v[0]:.1e}" if len(v) == 1
            else f"{statistics.fmean(v):.1e} [{min(v):.1e}, {max(v):.1e}] ({len(v)} runs)")


def f_final(path: str, filt: str, spec: str = ".3f") -> str:
    """Mean over seeds of a cell's final accuracy; spec "%" gives percent with one decimal."""
    m = statistics.fmean(_finals(path, filt))
    return f"{m * 100:.1f}%" if spec == "%" else format(m, spec)


def f_final_range(path: str, filt: str, field: str, values: str) -> str:
    """The range of the cells' mean final accuracies over ``field`` = each of ``values``, in
    percent: "44-54%"."""
    v = [statistics.fmean(_finals(path, f"{filt},{field}={x}")) * 100 for x in values.split("+")]
    return span(min(v), max(v), ".0f") + "%"


def f_seeds(path: str, filt: str) -> str:
    """Each seed's final accuracy, in seed order: "0.002, 0.023, 0.000"."""
    return ", ".join(f"{x:.3f}" for x in _finals(path, filt))


def f_gap(path: str, filt: str, ref: str, spec: str = ".3f") -> str:
    """Mean final accuracy of a cell minus a reference cell's, with its 95% percentile-bootstrap CI
    over seeds (suite/analysis/collapse.py ``gap_ci``, the estimator of the reports)."""
    from suite.analysis import collapse

    gap = collapse.gap_ci(_finals(path, filt), _finals(path, ref))
    if gap is None:
        raise ValueError(f"{path}: too few seeds for a gap between {filt} and {ref}")
    return "{} [{}, {}]".format(*(format(g, "+" + spec.lstrip("+")) for g in gap))


def f_runs(paths: str) -> str:
    """Complete runs in the committed grids listed ("+"-separated)."""
    return str(sum(len(_grid(p)) for p in paths.split("+")))


def f_gap_clipped(path: str, filt: str) -> str:
    """Mean over seeds of the share of tokens PPO's clip zeroes at step 1 on the precision gap alone
    (hypothesis H1; suite/analysis/hypothesis_tables.py ``mechanism_table``), in percent."""
    from suite.analysis.hypothesis_tables import _mech

    # runs older than mechanism.jsonl logged it in metrics.jsonl (ppo/clip_frac_gap), as the report
    # reads it
    fr = [_mech(r)[0]["mech/gap_clip_frac"] if _mech(r)
          else (r.metrics[0] if r.metrics else {}).get("ppo/clip_frac_gap")
          for r in cell(path, filt)]
    fr = [x for x in fr if x is not None]
    if not fr:
        raise ValueError(f"{path}: no mechanism.jsonl in {filt}")
    return f"{statistics.fmean(fr) * 100:.2f}%"


def f_half_ess(path: str, filt: str) -> str:
    """Response length at which the sequence IS weights' ESS would halve, ln 2 / ln(1 + chi2_tok)
    from the step-1 token chi2 (hypothesis H2; suite/analysis/hypothesis_tables.py
    ``length_table``), mean over seeds, 2 significant digits."""
    import math

    from suite.analysis.hypothesis_tables import step1

    t = [math.log(2.0) / math.log1p(x["tok"]) for x in map(step1, cell(path, filt)) if x["tok"]]
    if not t:
        raise ValueError(f"{path}: no token chi2 at step 1 in {filt}")
    return f"{float(f'{statistics.fmean(t):.2g}'):,.0f}"


# ---- the collapse report's mechanism figures (suite/analysis/collapse.py), over a grid's flows
# -----------------
def _pct_or(x: float, spec: str) -> str:
    return f"{x * 100:.0f}%" if spec == "%" else (f"{x * 100:.1f}%" if spec == "%.1"
                                                  else format(x, spec))


def f_anatomy(path: str, flows: str, key: str, spec: str = "%") -> str:
    """The range over ``flows`` ("fp32+bf16+fp16") of each flow's ``anatomy/<key>``, pooled over its
    runs and steps as in the collapse report's anatomy table: "51-52%" (spec "%"), "0.5%" ("%.1") or
    "0.53-0.54"."""
    from suite.analysis.collapse import anatomy_mean

    v = [anatomy_mean(_grid(path), f, key) for f in flows.split("+")]
    lo, hi = _pct_or(min(v), spec), _pct_or(max(v), spec)
    return lo if lo == hi else f"{lo.rstrip('%')}-{hi}" if spec.startswith("%") else f"{lo}-{hi}"


def f_growth(path: str, filt: str, spec: str = ".1f") -> str:
    """The range over the matching cells (regime x algorithm x flow; "+" in a value: any of them) of
    each cell's mean k3 growth, last LEAD steps over first LEAD (the collapse report's growth
    table): "0.4-0.8"."""
    from suite.analysis.collapse import cell_stats, cells

    want = {k: v.split("+") for k, v in (kv.split("=", 1) for kv in filt.split(",") if kv)}
    keys = {"regime": 0, "algorithm": 1, "precision": 2}
    v = [cell_stats(c)["k3_growth"][0] for key, c in cells(_grid(path)).items()
         if all(key[keys[k]] in vs for k, vs in want.items())]
    if not v:
        raise ValueError(f"{path}: no cell with {filt}")
    return span(min(v), max(v), spec)


def f_fell(path: str, part: str = "runs") -> str:
    """The runs whose smoothed accuracy fell by >= DROP (the collapse report's lead table): their
    number ("runs"), or the range of the k3 of the steps before the fall over the first steps'
    ("ratio")."""
    from suite.analysis.collapse import fell

    runs = fell(_grid(path))
    if part == "runs":
        return str(len(runs))
    ratios = [b / a for _, _, _, a, b in runs if a and b is not None]
    return span(min(ratios), max(ratios), ".1f")


# ---- held-out accuracy of the policy itself (the dose-response grid with eval.every;
# step.evaluate) -----------
def _heldout(run) -> float:
    """The run's last held-out accuracy (eval/<split>/mean@<n>, sampled without the injected
    perturbation)."""
    rows = [m for m in run.metrics if any(k.startswith("eval/") for k in m)]
    if not rows:
        raise ValueError(f"{run.dir}: no held-out evaluation in metrics.jsonl (eval.every)")
    return next(v for k, v in rows[-1].items() if k.startswith("eval/"))


def _spread(v: list[float], spec: str = ".3f") -> str:
    return f"{statistics.fmean(v):{spec}} [{min(v):{spec}}, {max(v):{spec}}]"


def f_heldout(path: str, part: str = "table") -> str:
    """Markdown: each arm of a dose-response grid (inject.kind x inject.scale; "none" the clean
    control) with its step-0 mismatch, training verdicts and final training accuracy (on the
    perturbed rollouts), and the policy's own held-out accuracy at the last step, mean [min, max]
    over seeds, and its difference to the clean arm's with the exact one-sided permutation p that
    the clean policy scores higher (3 seeds against 3: p >= 0.05). Part "outcome": the sentence that
    says which arms failing in training held-out accuracy separates from the clean."""
    from suite.analysis.stats import ALPHA, permutation_test

    arms = sorted({(str(_field(r, "inject.kind")), float(_field(r, "inject.scale")))
                   for r in _grid(path)})
    clean = [_heldout(r) for r in cell(path, "inject.kind=none")]
    failing, below = [], []
    lines = ["| injected mismatch | step-0 k3 | pass | final training accuracy | held-out accuracy "
             "of the policy | held-out minus clean (p) |", "|---|---|---|---|---|---|"]
    for kind, scale in sorted(arms, key=lambda a: (a[0] != "none", a[0], a[1])):
        runs = cell(path, f"inject.kind={kind},inject.scale={scale}")
        held = [_heldout(r) for r in runs]
        p = permutation_test(clean, held)["p"] if kind != "none" else None
        if p is not None and not any(r.verdict == "pass" for r in runs):
            failing.append(f"{kind} {scale:g}")
            below += [f"{kind} {scale:g}"] if p <= ALPHA else []
        lines.append(f"| {'none (clean)' if kind == 'none' else f'{kind} {scale:g}'} | "
                     f"{f_step0_cell(path, f'inject.kind={kind},inject.scale={scale}')} | "
                     f"{sum(r.verdict == 'pass' for r in runs)}/{len(runs)} | "
                     f"{_spread([r.summary['accuracy/final'] for r in runs])} | {_spread(held)} | "
                     + ("-" if p is None
                        else f"{statistics.fmean(held) - statistics.fmean(clean):+.3f} (p {p:.2f})")
                     + " |")
    if part == "table":
        return "\n".join(lines)
    kept = [a for a in failing if a not in below]
    return (f"No seed passes in training in {len(failing)} arm(s) "
            f"({', '.join(failing) or 'none'}); the policy's held-out accuracy is below the clean "
            f"policy's by the exact test in {', '.join(below) or 'none'}, and not separated from "
            f"it in {', '.join(kept) or 'none'}")
