"""Does a source of the mismatch decide the outcome? The source grids' table (``src-top-p``,
``src-kv-fp8``, ``src-staleness``; docs/attribution.md): pure functions of the runs.

Each grid sets one source of the mismatch (truncated sampling without renormalisation, an FP8 KV
cache, stale weights) against its matched control (renormalised truncation, the sampler dtype's KV
cache, staleness 0) on fp32, where the studied source is the only mismatch, per regime x correction
x seed. A cell is *separated* when every seed of the source fails the sanity rule while every seed
of its control passes (>= 3 seeds each), the criterion of the collapse search
(suite/analysis/collapse.py); the reward gap is mean final accuracy of the source minus its
control's, with the same percentile bootstrap over seeds.
"""

from __future__ import annotations

import statistics

from suite.analysis.collapse import gap_ci

# The source knobs and the value that is their matched control (the value a framework that avoids
# the source uses).
SOURCE_AXES = {"sampling.truncation": "renormalise", "kv_cache": "auto", "staleness": 0}
MIN_SEEDS = 3


def _field(run, dotted: str):
    node = run.config or {}
    for part in dotted.split("."):
        node = node.get(part) if isinstance(node, dict) else None
    return node


def source_axis(runs) -> str | None:
    """The source knob these runs vary (None when they vary none of SOURCE_AXES, or also the
    precision flow: a source grid switches one source with everything else fixed, e.g. the main
    job's controls are not one)."""
    varying = [a for a in SOURCE_AXES if len({str(_field(r, a)) for r in runs}) > 1]
    one_flow = len({r.precision for r in runs}) == 1
    return varying[0] if len(varying) == 1 and one_flow else None


def cells(runs, axis: str) -> dict:
    """{(regime, algorithm, value): [complete runs by seed]}."""
    out: dict = {}
    for r in sorted(runs, key=lambda r: r.seed):
        if r.verdict != "incomplete":
            out.setdefault((_field(r, "regime") or "base", r.algorithm, str(_field(r, axis))),
                           []).append(r)
    return out


def _mean(xs) -> float | None:
    xs = [x for x in xs if x is not None]
    return statistics.fmean(xs) if xs else None


def _k3(x: float | None) -> str:
    return "-" if x is None else "0" if x == 0 else f"{x:.2e}"


def rows(runs, axis: str) -> list[dict]:
    """One record per (regime, algorithm, value): verdict counts, finals, step-0 k3, and against the
    control its gap [95% CI] and whether the cell separates."""
    control = str(SOURCE_AXES[axis])
    cs = cells(runs, axis)
    out = []
    order = sorted(cs.items(), key=lambda kv: (kv[0][0], kv[0][1], kv[0][2] != control, kv[0][2]))
    for (regime, algo, value), mine in order:
        finals = [r.summary["accuracy/final"] for r in mine]
        ref = cs.get((regime, algo, control), [])
        ref_finals = [r.summary["accuracy/final"] for r in ref]
        is_source = value != control
        k3 = [r.summary.get("mismatch/step0/kl_k3") for r in mine]
        k3_end = [r.summary.get("mismatch/final/kl_k3") for r in mine]
        out.append({
            "regime": regime, "algorithm": algo, "value": value, "control": not is_source,
            "seeds": len(mine),
            "verdicts": {v: sum(r.verdict == v for r in mine)
                         for v in ("pass", "unstable", "collapse")}, "finals": finals,
            "final_mean": statistics.fmean(finals), "step0_k3": _mean(k3),
            "final_k3": _mean(k3_end), "gap": gap_ci(finals, ref_finals) if is_source else None,
            "separated": (is_source and len(mine) >= MIN_SEEDS and len(ref) >= MIN_SEEDS
                          and all(r.verdict != "pass" for r in mine)
                          and all(r.verdict == "pass" for r in ref)),
        })
    return out


def table(records: list[dict], axis: str) -> tuple[list[str], list[list[str]]]:
    head = ["regime", "algorithm", axis, "seeds", "pass / unstable / collapse",
            "final acc: mean (seeds)", "k3 KL: step 0 / final", "gap vs control [95% CI]",
            "separated"]
    body = []
    for x in records:
        v = x["verdicts"]
        body.append([x["regime"], x["algorithm"], x["value"]
                     + (" (control)" if x["control"] else ""), str(x["seeds"]),
                     f"{v['pass']} / {v['unstable']} / {v['collapse']}",
                     f"{x['final_mean']:.3f} ({', '.join(f'{f:.3f}' for f in x['finals'])})",
                     f"{_k3(x['step0_k3'])} / {_k3(x['final_k3'])}",
                     "" if x["gap"] is None else "{:+.3f} [{:+.3f}, {:+.3f}]".format(*x["gap"]),
                     "" if x["control"] else ("yes" if x["separated"] else "no")])
    return head, body


def _cell(x: dict) -> str:
    return f"{x['regime']} x {x['algorithm']} x {x['value']}"


def outcome(records: list[dict], axis: str) -> str:
    """The grid's result in two sentences, generated from its records."""
    src = [x for x in records if not x["control"]]
    sep = [x for x in src if x["separated"]]
    moved = [x for x in src if x["gap"] and (x["gap"][1] > 0 or x["gap"][2] < 0)]
    runs = sum(x["seeds"] for x in records)
    text = (f"{runs} complete runs; source {axis} against its control {SOURCE_AXES[axis]}. "
            + (f"Separated (every seed of the source fails, every seed of the control passes): "
               f"{'; '.join(_cell(x) for x in sep)}. " if sep else
               "No cell separates: in none does the source fail in every seed while its control "
               "passes in every seed. "))
    if moved:
        text += ("Reward gaps whose 95% CI excludes 0: " + "; ".join(
            "{} {:+.3f} [{:+.3f}, {:+.3f}]".format(_cell(x), *x["gap"]) for x in moved) + ".")
    else:
        text += "No reward gap to the control has a 95% CI that excludes 0."
    return text


def build_document(runs, root, axis: str) -> list[tuple]:
    """The report of a source grid: outcome, the table, the rule; the caller appends runs and
    provenance."""
    records = rows(runs, axis)
    head, body = table(records, axis)
    return [("p", outcome(records, axis)),
            ("h", "Source against its control", "sources"),
            ("table", head, body, "Per regime x correction x value of the source knob, over "
                                  "complete seeds: verdict "
             "counts, mean final accuracy with each seed's, the mean k3 KL at step 0 and at the "
             "last step (fp32: the source is the only mismatch; stale weights differ only after "
             "the first updates), and the gap of mean final accuracy to the control with its 95% "
             "percentile-bootstrap CI (10,000 resamples of seeds within each group). Separated: "
             "every seed of the source fails the sanity rule while every seed of the control "
             f"passes, >= {MIN_SEEDS} seeds each."),
            ("p", f"Runs from {root}; every number above is computed from the run directories "
                  "(suite report).")]
