"""The collapse-search report: does precision decide the outcome, in which regime, and why.

It looks for the published separation (arXiv 2510.26788: BF16 GRPO collapses on the
sanity test, FP16 reaches > 95%) at CPU scale, searched over named regimes
(``suite/rl/schema.py`` REGIMES, the ``collapse-search`` grid) with several seeds per cell, and
for the outcome to be *stated by the suite from the results*, either way. Everything here is
a pure function of run bundles (``suite.analysis.runs.Run``): ``suite report
results/collapse-search`` calls ``build_document`` when the runs span more than one regime.

Rules (stated in the report):
- a regime **separates** a low-precision flow L (bf16, bf16_fp8rollout) when every complete
  seed of L fails the sanity test (verdict collapse or unstable) while every complete seed of
  fp16 and of fp32 passes, with at least ``MIN_SEEDS`` complete seeds in each;
- a **reward gap** is the difference of final accuracy L - fp16 whose 95% bootstrap CI
  (resampling seeds within each flow) excludes 0: weaker evidence than a separation;
- a **drop** is a fall of the smoothed accuracy (the verdict rule's acc_t) by >= ``DROP``
  below its running best; its *lead* compares the k3 KL of the ``LEAD`` steps before the
  fall with the run's first ``LEAD`` steps (the published BF16 runs show the mismatch
  growing before the collapse, arXiv 2510.26788 Fig. 2; Precision-RL issue #10).
"""

from __future__ import annotations

import re
from collections import Counter
from pathlib import Path

import numpy as np

from suite.analysis import render
from suite.analysis.stats import bootstrap_ci, finite, mean_std, trailing_mean
from suite.results import PEAK_WINDOW, VERDICT_RULE

LOW_FLOWS = ("bf16", "bf16_fp8rollout")
REFERENCE_FLOWS = ("fp16", "fp32")
MIN_SEEDS = 3
DROP = 0.2
LEAD = 10
PI_BINS = ("lt0.5", "0.5-0.9", "0.9-0.99", "ge0.99")


def regime(run) -> str:
    return (run.config or {}).get("regime", "base")


def _natural(name: str) -> list:
    """Sort key reading digit runs as numbers: task=arith3 < task=arith8 < task=arith16."""
    return [int(part) if part.isdigit() else part for part in re.split(r"(\d+)", name)]


def regimes_of(runs) -> list[str]:
    """Regimes in the order of suite.rl.schema.REGIMES (unknown names last, in natural order)."""
    from suite.rl.schema import REGIMES

    found = {regime(r) for r in runs}
    return [g for g in REGIMES if g in found] + sorted(found - set(REGIMES), key=_natural)


def cells(runs) -> dict[tuple[str, str, str], list]:
    """(regime, algorithm, precision) -> runs, in regime order then flow order."""
    order = {f: i for i, f in enumerate(render.flow_order(r.precision for r in runs))}
    reg = {g: i for i, g in enumerate(regimes_of(runs))}
    out: dict[tuple[str, str, str], list] = {}
    for r in sorted(runs, key=lambda r: (reg[regime(r)], r.algorithm, order[r.precision], r.seed)):
        out.setdefault((regime(r), r.algorithm, r.precision), []).append(r)
    return out


def _complete(cell) -> list:
    return [r for r in cell if r.verdict != "incomplete"]


def _series(run, key: str) -> np.ndarray:
    return np.array([m.get(key, np.nan) if m.get(key) is not None else np.nan for m in run.metrics],
                    dtype=float)


# ---- per-run quantities ---------------------------------------------------------------------
def drawdown(run) -> tuple[float, int | None]:
    """Largest fall of acc_t below its running best, and the step of that best (None: no data)."""
    acc = trailing_mean(_series(run, "reward/mean"), max(1, min(PEAK_WINDOW, len(run.metrics))))
    steps = [m["step"] for m in run.metrics]
    best, best_step, worst, worst_from = -np.inf, None, 0.0, None
    for s, a in zip(steps, acc):
        if not np.isfinite(a):
            continue
        if a > best:
            best, best_step = a, s
        if best - a > worst:
            worst, worst_from = best - a, best_step
    return float(worst), worst_from


def window_mean(run, key: str, first: bool, n: int = LEAD, end: int | None = None) -> float | None:
    """Mean of `key` over the first n steps, or the n steps ending before step `end` (default: the
    last n)."""
    rows = run.metrics if end is None else [m for m in run.metrics if m["step"] < end]
    rows = rows[:n] if first else rows[-n:]
    vals = finite(m.get(key) for m in rows)
    return float(np.mean(vals)) if vals else None


def growth(run, key: str = "mismatch/kl_k3") -> float | None:
    """Mean of `key` over the last LEAD steps / over the first LEAD steps (None when either is 0 or
    missing)."""
    a, b = window_mean(run, key, True), window_mean(run, key, False)
    return b / a if a and b is not None and a > 0 else None


# ---- cell statistics and the verdict of the search -----------------------------------------------
def cell_stats(cell) -> dict:
    done = _complete(cell)
    finals = [r.summary.get("accuracy/final") for r in done]
    peaks = [r.summary.get("accuracy/peak") for r in done]
    passes = [r.summary.get("accuracy/first_pass_step") for r in done
              if r.summary.get("accuracy/first_pass_step")]
    return {
        "n": len(cell), "complete": len(done), "verdicts": Counter(r.verdict for r in cell),
        "final": mean_std(finals), "final_ci": bootstrap_ci(finals), "finals": finite(finals),
        "peak": mean_std(peaks), "first_pass": mean_std(passes), "reached": len(passes),
        "drawdown": mean_std([drawdown(r)[0] for r in done]),
        "k3_first": mean_std([window_mean(r, "mismatch/kl_k3", True) for r in done]),
        "k3_last": mean_std([window_mean(r, "mismatch/kl_k3", False) for r in done]),
        "k3_growth": mean_std([growth(r) for r in done]),
        "ent_first": mean_std([window_mean(r, "entropy/mean", True) for r in done]),
        "ent_last": mean_std([window_mean(r, "entropy/mean", False) for r in done]),
        "step_s": mean_std([(r.summary.get("time/total_s") or np.nan)
                            / max(1, r.summary.get("steps_done") or 1) for r in done]),
        "wall_s": sum(finite(r.summary.get("time/total_s") for r in done)),
    }


def gap_ci(low: list[float], ref: list[float], n_boot: int = 10_000,
           seed: int = 0) -> tuple[float, float, float] | None:
    """Mean(low) - mean(ref) and its 95% percentile-bootstrap CI, resampling seeds within each
    group."""
    if len(low) < 2 or len(ref) < 2:
        return None
    rng = np.random.default_rng(seed)
    a, b = np.asarray(low), np.asarray(ref)
    d = rng.choice(a, (n_boot, len(a))).mean(1) - rng.choice(b, (n_boot, len(b))).mean(1)
    return float(a.mean() - b.mean()), float(np.percentile(d, 2.5)), float(np.percentile(d, 97.5))


def findings(runs) -> list[dict]:
    """One record per (regime, algorithm, low flow): separated?, reward gap vs fp16 with its CI."""
    cs = cells(runs)
    out = []
    for (reg, algo, prec), cell in cs.items():
        if prec not in LOW_FLOWS:
            continue
        low = _complete(cell)
        refs = {f: _complete(cs.get((reg, algo, f), [])) for f in REFERENCE_FLOWS}
        enough = len(low) >= MIN_SEEDS and all(len(v) >= MIN_SEEDS for v in refs.values())
        low_fails = bool(low) and all(r.verdict != "pass" for r in low)
        refs_pass = all(v and all(r.verdict == "pass" for r in v) for v in refs.values())
        gap = gap_ci(finite(r.summary.get("accuracy/final") for r in low),
                     finite(r.summary.get("accuracy/final") for r in refs["fp16"]))
        out.append({"regime": reg, "algorithm": algo, "flow": prec, "enough_seeds": enough,
                    "separated": enough and low_fails and refs_pass, "low_fails": low_fails,
                    "refs_pass": refs_pass, "gap": gap,
                    "gap_significant": bool(gap and (gap[1] > 0 or gap[2] < 0))})
    return out


def statement(runs, found: list[dict]) -> str:
    """The outcome of the search in words, computed from `found` (never written by hand)."""
    regs = regimes_of(runs)
    sep = [f for f in found if f["separated"]]
    seeds = sorted({r.seed for r in runs})
    algos = sorted({r.algorithm for r in runs})
    head = (f"Searched {len(regs)} regimes ({', '.join(regs)}) x flows "
            f"{', '.join(render.flow_order(r.precision for r in runs))} x {len(seeds)} seeds, "
            f"algorithms {', '.join(algos)} (not every cell runs every algorithm; tables below): "
            f"{len(runs)} runs, {sum(r.verdict != 'incomplete' for r in runs)} complete. ")
    if sep:
        where = "; ".join(f"{f['flow']} {f['algorithm']} in regime {f['regime']}" for f in sep)
        return head + (f"Precision decides the outcome in {len(sep)} setting(s): {where}: every "
                       "seed of the low-precision flow fails the sanity test while every seed of "
                       "fp16 and fp32 passes.")
    gaps = [f for f in found if f["gap_significant"]]
    text = head + ("No regime separates: in none does a low-precision flow (bf16, bf16_fp8rollout) "
                   "fail in every seed while fp16 and fp32 pass in every seed. ")
    if gaps:
        listed = "; ".join(f"{f['flow']} in {f['regime']}: {f['gap'][0]:+.3f} "
                           f"[{f['gap'][1]:+.3f}, {f['gap'][2]:+.3f}]" for f in gaps)
        text += ("Reward-level differences whose 95% CI excludes 0 (final accuracy, low flow - "
                 "fp16): " + listed + ".")
    else:
        text += ("No reward-level difference between a low-precision flow and fp16 has a 95% CI "
                 "that excludes 0.")
    return text


# ---- tables
# ---------------------------------------------------------------------------------------
def _pm(ms, spec=".3f") -> str:
    m, s = ms
    return "-" if m is None else (render.fmt(m, spec)
                                  + ("" if s is None else " ± " + render.fmt(s, spec)))


def outcome_table(runs) -> tuple[list[str], list[list[str]]]:
    head = ["regime", "algorithm", "precision", "seeds", "pass / unstable / collapse",
            "final acc (mean ± std) [95% CI]", "peak acc", "first pass step (reached)",
            "max drawdown", "s / step"]
    rows = []
    for (reg, algo, prec), cell in cells(runs).items():
        st = cell_stats(cell)
        v = st["verdicts"]
        ci = st["final_ci"]
        rows.append(
            [reg, algo, prec, f"{st['complete']}/{st['n']}",
             f"{v['pass']} / {v['unstable']} / {v['collapse']}", _pm(st["final"])
             + (f" [{ci[0]:.3f}, {ci[1]:.3f}]" if ci else ""), _pm(st["peak"]),
             f"{_pm(st['first_pass'], '.0f')} ({st['reached']}/{st['complete']})",
             _pm(st["drawdown"]), _pm(st["step_s"], ".2f")])
    return head, rows


def findings_table(found: list[dict]) -> tuple[list[str], list[list[str]]]:
    head = ["regime", "algorithm", "low flow", "low flow fails every seed",
            "fp16 and fp32 pass every seed", "separated", "final acc gap vs fp16 [95% CI]"]
    rows = [[f["regime"], f["algorithm"], f["flow"], "yes" if f["low_fails"] else "no", "yes"
             if f["refs_pass"] else "no",
             ("yes" if f["separated"] else "no")
             + ("" if f["enough_seeds"] else f" (< {MIN_SEEDS} seeds)"),
             "-" if not f["gap"]
             else f"{f['gap'][0]:+.3f} [{f['gap'][1]:+.3f}, {f['gap'][2]:+.3f}]"] for f in found]
    return head, rows


def growth_table(runs) -> tuple[list[str], list[list[str]]]:
    head = ["regime", "precision", "k3 KL, first 10 steps", "k3 KL, last 10 steps",
            "growth (last / first)", "entropy first 10", "entropy last 10"]
    rows = []
    for (reg, algo, prec), cell in cells(runs).items():
        st = cell_stats(cell)
        rows.append([reg, prec, _pm(st["k3_first"], ".2e"), _pm(st["k3_last"], ".2e"),
                     _pm(st["k3_growth"], ".2f"), _pm(st["ent_first"], ".4f"),
                     _pm(st["ent_last"], ".4f")])
    return head, rows


def _anatomy_rows(runs, precision: str) -> list[dict]:
    """Every logged step of the flow's runs that carries the anatomy of its mismatch."""
    return [m for r in runs if r.precision == precision for m in r.metrics
            if "anatomy/top1pct_share" in m]


def anatomy_mean(runs, precision: str, key: str) -> float:
    """One flow's ``anatomy/<key>`` pooled over its runs and steps, as the anatomy table shows
    it."""
    vals = finite(m.get(f"anatomy/{key}") for m in _anatomy_rows(runs, precision))
    if not vals:
        raise ValueError(f"no run of {precision} logs anatomy/{key}")
    return float(np.mean(vals))


def fell(runs) -> list[tuple]:
    """(run, drawdown, step of the fall, k3 of the first LEAD steps, k3 of the LEAD steps before the
    fall) for every run whose smoothed accuracy fell by >= DROP below its running best."""
    out = []
    for r in runs:
        dd, step = drawdown(r)
        if dd >= DROP and step is not None:
            out.append((r, dd, step, window_mean(r, "mismatch/kl_k3", True),
                        window_mean(r, "mismatch/kl_k3", False, end=step + 1)))
    return out


def anatomy_table(runs) -> tuple[list[str], list[list[str]]]:
    """Per precision flow, pooled over regimes, seeds and steps: where the abs log-ratio mass
    sits."""
    head = (["precision", "steps"] + [f"pi {b}: tokens / mass" for b in PI_BINS]
            + ["top 1% tokens' mass", "position q1 / q2 / q3 / q4 mean", "corr with entropy",
               "corr with -log pi", "mu > pi"])
    rows = []
    for prec in render.flow_order(r.precision for r in runs):
        ms = _anatomy_rows(runs, prec)
        if not ms:
            continue

        def avg(key, spec=".2f"):
            vals = finite(m.get(key) for m in ms)
            return render.fmt(float(np.mean(vals)), spec) if vals else "-"
        rows.append([prec, str(len(ms))]
                    + [f"{avg(f'anatomy/pi_{b}/frac', '.3f')} / {avg(f'anatomy/pi_{b}/share')}"
                                             for b in PI_BINS]
                    + [avg("anatomy/top1pct_share"),
                       " / ".join(avg(f"anatomy/pos_q{q}/mean", ".1e") for q in range(1, 5)),
                       avg("anatomy/corr_entropy"), avg("anatomy/corr_surprisal"),
                       avg("anatomy/mu_gt_pi_frac")])
    return head, rows


def lead_table(runs) -> tuple[list[str], list[list[str]]]:
    """Runs whose smoothed accuracy fell by >= DROP: did the mismatch grow before the fall?"""
    head = ["run", "regime", "drawdown", "from step", f"k3 first {LEAD} steps",
            f"k3 {LEAD} steps before the fall", "ratio"]
    rows = []
    for r, dd, step, a, b in fell(runs):
        rows.append([r.label, regime(r), f"{dd:.3f}", str(step), render.fmt(a, ".2e"),
                     render.fmt(b, ".2e"), render.fmt(b / a, ".2f") if a and b is not None
                     else "-"])
    return head, rows


def corrections_table(runs, base_algo: str = "grpo") -> tuple[list[str], list[list[str]]]:
    """Within one regime and flow: does a sampler-aware correction beat uncorrected GRPO? Final
    accuracy gap to `base_algo` with a 95% bootstrap CI over seeds (the mission's question: which
    correction helps)."""
    cs = cells(runs)
    head = ["regime", "precision", "algorithm", "seeds", "final acc (mean ± std)",
            f"gap vs {base_algo} [95% CI]"]
    rows = []
    for (reg, algo, prec), cell in cs.items():
        ref = _complete(cs.get((reg, base_algo, prec), []))
        if algo == base_algo or not ref:
            continue
        st, gap = cell_stats(cell), gap_ci(finite(r.summary.get("accuracy/final")
                                                  for r in _complete(cell)),
                                           finite(r.summary.get("accuracy/final") for r in ref))
        rows.append([reg, prec, algo, f"{st['complete']}/{st['n']}", _pm(st["final"]),
                     "-" if not gap else f"{gap[0]:+.3f} [{gap[1]:+.3f}, {gap[2]:+.3f}]"])
    return head, rows


def settings_table(runs) -> tuple[list[str], list[list[str]]]:
    from suite.rl.schema import REGIMES

    head = ["regime", "what it changes (on top of the tier)", "why", "runs"]
    count = Counter(regime(r) for r in runs)
    rows = []
    for g in regimes_of(runs):
        spec = REGIMES.get(g, {"set": {}, "doc": "(not in suite/rl/schema.py REGIMES)"})
        rows.append([g, ", ".join(f"{k}={v}" for k, v in spec["set"].items()) or "nothing",
                     spec["doc"], str(count[g])])
    return head, rows


# ---- the document -------------------------------------------------------------------------------
def _curve(run, key: str) -> dict:
    return {"task": run.task, "algorithm": run.algorithm, "precision": run.precision,
            "seed": run.seed, "complete": run.verdict != "incomplete",
            "steps": [m["step"] for m in run.metrics if key in m],
            "values": [m[key] for m in run.metrics if key in m]}


def _wall(runs) -> str:
    """Summed run time (time/total_s) per regime, in minutes: what each regime costs on this
    machine."""
    per = Counter()
    for r in runs:
        per[regime(r)] += r.summary.get("time/total_s") or 0.0
    return ", ".join(f"{g} {per[g] / 60:.0f} min"
                     for g in regimes_of(runs)) + " (run time summed over runs; two ran at a time)"


def build_document(runs, root: Path, fig_dir: Path) -> list[tuple]:
    """The search report: outcome statement, settings, outcomes with CIs, the mechanism, figures."""
    from suite.analysis import figures

    found = findings(runs)
    flows = render.flow_order(r.precision for r in runs)
    regs = regimes_of(runs)
    tier = sorted({(r.config or {}).get("tier", "?") for r in runs})
    doc: list[tuple] = [
        ("h", "Outcome", "outcome"),
        ("p", statement(runs, found)),
        ("p", f"Runs from {root} (tier {', '.join(tier)}); every number below is computed from the "
              "run directories (suite report). Produced by: suite sweep grid=collapse-search "
              f"regime={','.join(regs)} launcher=local jobs=2, then suite report {root}. Wall time "
              f"of the runs: {_wall(runs)}."),
        ("h", "Settings tried", "settings"),
        ("table", *settings_table(runs), "Every regime of this search, including those where "
                                         "nothing separated. "
         "A regime sets its fields on top of the tier for every precision alike "
         "(suite/rl/schema.py REGIMES)."),
        ("h", "Separation", "separation"),
        ("table", *findings_table(found), "Separated: every complete seed of the low-precision "
                                          "flow fails (verdict "
         "unstable or collapse) while every complete seed of fp16 and fp32 passes, with >= "
         f"{MIN_SEEDS} seeds each. Gap: mean final accuracy of the flow minus fp16's, 95% "
         "percentile-bootstrap CI resampling seeds within each flow (10,000 resamples)."),
        ("h", "Outcomes per cell", "cells"),
        ("table", *outcome_table(runs), "Final accuracy: mean reward over the last W steps "
                                        "(verdict rule below); "
         "95% bootstrap CI of the mean over seeds. Max drawdown: largest fall of acc_t below its "
         "running best."),
        ("p", "Verdict rule: " + VERDICT_RULE),
    ]
    head, rows = corrections_table(runs)
    if rows:
        cmd = (f"suite sweep grid=collapse-search regime={','.join(sorted({r[0] for r in rows}))} "
               f"precision={','.join(sorted({r[1] for r in rows}))} "
               f"algorithm={','.join(sorted({r[2] for r in rows}))} launcher=local jobs=2")
        doc += [("h", "Corrections", "corrections"), ("p", f"Produced by: {cmd}"),
                ("table", head, rows, "Cells where sampler-aware corrections ran next to "
                                      "uncorrected grpo (same regime, "
                 "flow and seeds): final accuracy and its gap to grpo, 95% percentile-bootstrap CI "
                 "resampling seeds.")]
    fig_dir.mkdir(parents=True, exist_ok=True)
    thresholds = {r.task: (r.config or {}).get("threshold", 0.95) for r in runs}
    panels = {g: [_curve(r, "reward/mean") for r in runs if regime(r) == g] for g in regs}
    figures.panels(panels, flows, fig_dir / "search_reward", PEAK_WINDOW,
                   ylabel="training accuracy", hline=min(thresholds.values(), default=0.95))
    doc.append(("fig", "search_reward", "Training accuracy per regime (trailing mean over 5 "
                                        "steps), colour = "
                "precision flow, band = 95% bootstrap CI over seeds; dashed: the pass threshold."))
    panels = {g: [_curve(r, "mismatch/kl_k3") for r in runs if regime(r) == g] for g in regs}
    figures.panels(panels, flows, fig_dir / "search_k3", PEAK_WINDOW, ylabel="k3 KL (sampler || "
                                                                             "trainer)", log=True)
    doc += [("fig", "search_k3", "Mismatch (k3 KL of the sampled tokens, before each update) per "
                                 "regime, log axis."),
            ("h", "Mechanism: where the mismatch sits", "anatomy"),
            ("table", *anatomy_table(runs), "suite.numerics.mismatch.mismatch_anatomy per step, "
                                            "averaged over every step of "
             "every run of the flow. pi bins: the trainer's probability of the sampled token; "
             "tokens = fraction of tokens in the bin, mass = its share of the summed abs(log pi - "
             "log mu). Position quarters: mean abs log-ratio by relative position in the response. "
             "mu > pi: fraction of tokens the sampler found likelier than the trainer."),
            ("h", "Mechanism: does the mismatch grow, and does it precede a drop?", "growth"),
            ("table", *growth_table(runs), "Mean over complete seeds of each run's k3 KL and "
                                           "trainer entropy in its "
             "first and last 10 steps.")]
    head, rows = lead_table(runs)
    doc.append(("table", head, rows, f"Every run whose smoothed accuracy fell by >= {DROP} below "
                                     "its running best: "
                f"k3 KL of the {LEAD} steps before the best (where the fall starts) against the "
                f"first {LEAD} steps.")
               if rows
               else ("p", f"No run's smoothed accuracy fell by {DROP} or more below its running "
                          "best, so "
                                  "there is no drop for the mismatch to precede."))
    return doc
