"""A grid's outcome as the documents quote it (the ``matrix``, ``centering`` and ``source`` spans of
suite/experiments/docfigures.py): final accuracy per flow x correction with its spread over seeds,
what an exact test on those seeds can and cannot say, and a source grid's table against its
control."""

from __future__ import annotations

from suite.results import REFERENCE_ROOT


def _cells(path: str) -> dict[tuple, list]:
    from suite.analysis.runs import load_runs

    cells: dict[tuple, list] = {}
    for r in load_runs(REFERENCE_ROOT / path):
        cells.setdefault((r.summary.get("precision"), r.summary.get("algorithm")), []).append(r)
    return cells


def _finals(runs) -> list[float]:
    return [r.summary["accuracy/final"] for r in runs]


def _show(runs) -> str:
    """One run: its final accuracy and verdict; several: mean [min, max] and how many passed, with
    the rest named."""
    if not runs:
        return "-"
    finals = _finals(runs)
    if len(runs) == 1:
        return f"{finals[0]:.3f} ({runs[0].verdict})"
    others = sorted({r.verdict for r in runs} - {"pass"})
    rest = "".join(f", {sum(r.verdict == v for r in runs)} {v}" for v in others)
    return (f"{sum(finals) / len(finals):.3f} [{min(finals):.3f}, {max(finals):.3f}]; "
            f"{sum(r.verdict == 'pass' for r in runs)}/{len(runs)} pass{rest}")


def _extra_column(more: dict, flow: str) -> list:
    return next((v for (p, _), v in more.items() if p == flow), [])


def f_matrix(path: str, extra: str = "", label: str = "") -> str:
    """A grid's outcome as flow x algorithm: each cell's final accuracy over its seeds and its
    verdicts; ``extra``: another grid of one algorithm (the fp4 grid's centering runs) as one more
    column, headed ``label``."""
    from suite.analysis.render import flow_order
    from suite.rl.algo_table import ALGORITHMS

    main, more = _cells(path), (_cells(extra) if extra else {})
    flows = flow_order({p for p, _ in main})
    algos = sorted({a for _, a in main}, key=list(ALGORITHMS).index)
    lines = ["| flow | " + " | ".join([*algos, *([label or extra] if extra else [])]) + " |",
             "|---|" + "---|" * (len(algos) + bool(extra))]
    for f in flows:
        row = [_show(main.get((f, a)))
               for a in algos] + ([_show(_extra_column(more, f))] if extra else [])
        lines.append(f"| {f} | " + " | ".join(row) + " |")
    return "\n".join(lines)


def f_centering(path: str, extra: str, baseline: str = "grpo") -> str:
    """Score centering (``extra``, one algorithm) against ``baseline`` and against each IS
    correction of ``path``, flow by flow, with the one-sided exact permutation test on final
    accuracy: which differences the seeds separate at 0.05, and the smallest p the number of seeds
    allows."""
    import math

    from suite.analysis import stats
    from suite.analysis.render import flow_order

    main, more = _cells(path), _cells(extra)
    flows = [f for f in flow_order({p for p, _ in more}) if _extra_column(more, f)
             and main.get((f, baseline))]
    if not flows:
        raise ValueError(f"{extra}: no flow has both score-centering runs and {baseline} runs in "
                         f"{path}")
    algos = sorted({a for _, a in main} - {baseline})
    above, separated, against = [], [], {a: [] for a in algos}
    for f in flows:
        c = _finals(_extra_column(more, f))
        b = _finals(main[(f, baseline)])
        if sum(c) / len(c) > sum(b) / len(b):
            above.append(f)
        if stats.separated(c, b):
            separated.append(f)
        for a in algos:
            if main.get((f, a)) and stats.separated(c, _finals(main[(f, a)])):
                against[a].append(f)
    n = min(len(_extra_column(more, f)) for f in flows)
    floor = 1 / math.comb(2 * n, n)

    def names(xs):
        return ", ".join(xs) if xs else "none"
    return (f"Over {n} seeds per cell: score centering's mean final accuracy is above plain "
            f"{baseline}'s in {len(above)} of {len(flows)} flows ({names(above)}); the exact "
            "one-sided permutation test on final accuracy separates it (p <= 0.05; the smallest p "
            f"{n} against {n} seeds can give is {floor:.2f}) in {names(separated)}. Against each "
            "IS correction it is separated in: "
            + "; ".join(f"{a} {names(v)}" for a, v in against.items()) + ".")


def _dose_cells(path: str) -> dict[str, list]:
    """A dose-response grid's runs by injected mismatch, "fp32 + noise 0.3" (the clean arm left
    out)."""
    from suite.analysis.runs import load_runs

    cells: dict[str, list] = {}
    for r in load_runs(REFERENCE_ROOT / path):
        inject = (r.config or {}).get("inject") or {}
        if inject.get("kind", "none") != "none":
            cells.setdefault(f"fp32 + {inject['kind']} {inject['scale']:g}", []).append(r)
    return cells


def _by_mismatch(flows: str, flows_centred: str, dose: str,
                 dose_centred: str) -> list[tuple[float, str, list, list]]:
    """(step-0 k3 of the plain runs, setting, plain GRPO runs, centred runs) for every setting run
    both ways: the precision flows of ``flows`` (plain) and ``flows_centred`` (their trainer is
    bf16) and the injected mismatches of the dose grids (an fp32 trainer), in order of the
    mismatch."""
    import statistics

    plain = {p: runs for (p, a), runs in _cells(flows).items() if a == "grpo"} | _dose_cells(dose)
    centred = {p: runs for (p, _),
               runs in _cells(flows_centred).items()} | _dose_cells(dose_centred)
    rows = [(statistics.fmean(r.summary["mismatch/step0/kl_k3"] for r in plain[s]), s, plain[s],
             centred[s])
            for s in plain.keys() & centred.keys()]
    if not rows:
        raise ValueError(f"no setting has runs both in {flows}/{dose} and in "
                         f"{flows_centred}/{dose_centred}")
    return sorted(rows)


def f_centering_dose(flows: str, flows_centred: str, dose: str, dose_centred: str,
                     part: str = "table") -> str:
    """Where score centering starts to pay (arXiv 2609.20807; SkyRL saw no gain at mild mismatch):
    every setting run with plain GRPO and with centering, ordered by its step-0 k3, each with both
    outcomes over seeds and the exact one-sided permutation p that centering ends higher (part
    "table"), or the sentence that sums the table up (part "outcome")."""
    import statistics

    from suite.analysis import stats

    # (step-0 k3, setting, plain runs, centred runs, centred minus plain mean final accuracy, exact
    # p)
    rows = [(k3, s, b, c, statistics.fmean(_finals(c)) - statistics.fmean(_finals(b)),
             stats.permutation_test(_finals(c), _finals(b))["p"])
            for k3, s, b, c in _by_mismatch(flows, flows_centred, dose, dose_centred)]
    if part == "table":
        lines = ["| setting | step-0 k3 (plain runs) | plain GRPO | score centering | centering "
                 "minus plain (p) |",
                 "|---|---|---|---|---|"]
        lines += [f"| {s} | {k3:.1e} | {_show(b)} | {_show(c)} | {gap:+.3f} (p {p:.2f}) |"
                  for k3, s, b, c, gap, p in rows]
        return "\n".join(lines)
    above = [s for _, s, _, _, gap, _ in rows if gap > 0]
    sep = [f"{s} ({k3:.1e}, {gap:+.3f})" for k3, s, _, _, gap, p in rows if p <= stats.ALPHA]
    injected = [p <= stats.ALPHA for _, s, *_, p in rows if s.startswith("fp32 + ")]
    flows = [p <= stats.ALPHA for _, s, *_, p in rows if not s.startswith("fp32 + ")]
    return (f"Score centering's mean final accuracy is above plain GRPO's in {len(above)} of "
            f"{len(rows)} settings; the exact test separates it (p <= {stats.ALPHA}) in "
            f"{len(sep)}, in order of step-0 k3: {', '.join(sep) or 'none'}: {sum(flows)} of "
            f"{len(flows)} precision flows and {sum(injected)} of {len(injected)} injected "
            "mismatches.")


def f_source(path: str, part: str) -> str:
    """A committed source grid (suite/analysis/sources.py): its outcome sentence (part=outcome) or
    table (part=table)."""
    from suite.analysis import sources
    from suite.analysis.runs import load_runs

    runs = [r for r in load_runs(REFERENCE_ROOT / path) if r.verdict != "incomplete"]
    axis = sources.source_axis(runs)
    records = sources.rows(runs, axis)
    if part == "outcome":
        return sources.outcome(records, axis)
    head, body = sources.table(records, axis)
    return "\n".join(["| " + " | ".join(head) + " |", "|" + "---|" * len(head),
                      *("| " + " | ".join(r) + " |" for r in body)])
