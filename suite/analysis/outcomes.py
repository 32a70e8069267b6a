"""The outcome table of a results directory (``suite sweep``, ``suite main``, ``outcomes.md``), led
by the mismatch per flow: pure functions of the runs' summary.json files (suite/analysis/runs.py
loads them).
"""

from __future__ import annotations

from pathlib import Path

from rich.table import Table

from suite.analysis import render
from suite.analysis.render import fmt, ratio_caption
from suite.analysis.runs import Run, load_runs, load_summaries
from suite.results import MIN_JUDGED_STEPS, VERDICT_RULE, display_path, find_run_dirs

# ---------------------------------------------------------------------------- the outcome table
# (sweeps, suite main)
COLUMNS = ("run", "verdict", "peak acc (step)", "final acc", "first pass step",
           "step-0 mean abs dp", "step-0 k3 KL", "step-0 mean abs seq log-ratio", "final k3 KL",
           "skipped steps", "time s")


def outcome_rows(root: Path) -> list[list[str]]:
    """One row per run: verdict, peak and final accuracy, step-0 and final mismatch."""
    out = []
    for s in load_summaries(root):
        out.append([s.get("run", Path(s["_dir"]).name), s.get("verdict", "-"),
                    f"{fmt(s.get('accuracy/peak'))} ({s.get('accuracy/peak_step')})",
                    fmt(s.get("accuracy/final")), str(s.get("accuracy/first_pass_step")),
                    fmt(s.get("mismatch/step0/prob_diff/mean"), ".2e"),
                    fmt(s.get("mismatch/step0/kl_k3"), ".2e"),
                    fmt(s.get("mismatch/step0/seq_log_ratio/mean_abs"), ".2e"),
                    fmt(s.get("mismatch/final/kl_k3"), ".2e"), str(s.get("train/skipped_steps")),
                    fmt(s.get("time/total_s"), ".0f")])
    return out


def outcome_table(root: Path) -> Table:
    t = Table(title=f"outcomes in {root}", caption=ratio_caption(load_summaries(root)))
    for col in COLUMNS:
        t.add_column(col)
    for row in outcome_rows(root):
        t.add_row(*row)
    return t


SEARCH_DIR = "collapse-search"  # the collapse search's results, next to the main job's


def mismatch_lead(root: Path) -> tuple[list[str], list[list[str]], str]:
    """What the main job shows first: the mismatch per flow (it separates the flows at every step),
    the verdicts per flow, and what the collapse search found, all computed from the results."""
    summaries = load_summaries(root)
    flows = render.flow_order(s.get("precision") for s in summaries if s.get("precision"))
    head = ["precision flow", "runs", "pass", "step-0 mean abs dp", "step-0 k3 KL",
            "step-0 mean abs seq log-ratio"]
    rows = []
    for f in flows:
        ss = [s for s in summaries if s.get("precision") == f]
        def mean(key):
            vals = [s[key] for s in ss if isinstance(s.get(key), (int, float))]
            return fmt(sum(vals) / len(vals), ".2e") if vals else "-"
        rows.append([f, str(len(ss)), str(sum(s.get("verdict") == "pass" for s in ss)),
                     mean("mismatch/step0/prob_diff/mean"), mean("mismatch/step0/kl_k3"),
                     mean("mismatch/step0/seq_log_ratio/mean_abs")])
    n_pass = sum(s.get("verdict") == "pass" for s in summaries)
    text = f"{n_pass} of {len(summaries)} runs pass the sanity threshold."
    if n_pass == len(summaries):
        text += (" At this scale the precision flow does not decide the reward; the mismatch does "
                 "separate the flows, at every step (table).")
    else:
        text += " " + _not_passing(summaries)
    search = Path(root).parent / SEARCH_DIR
    if find_run_dirs(search):
        from suite.analysis import collapse

        runs = load_runs(search)
        text += (f" The collapse search ({display_path(search)}, report in "
                 f"{display_path(search / 'report')}): "
                 + collapse.statement(runs, collapse.findings(runs)))
    else:
        from suite.results import REFERENCE_ROOT

        committed = sorted(REFERENCE_ROOT.glob(f"*/{SEARCH_DIR}"))
        # where the sweep writes (out/name): beside the main job's runs, or the default out for a
        # committed grid
        where = (f"runs/{SEARCH_DIR}"
                 if Path(root).resolve().is_relative_to(REFERENCE_ROOT.resolve())
                 else display_path(search))
        text += (" Where precision does decide the outcome is searched by `suite sweep "
                 f"grid=collapse-search launcher=local jobs=2` (results in {where}, `suite report "
                 f"{where}`)" + (
                     "; committed searches: "
                     + ", ".join(f"{display_path(p)} (machine class {p.parent.name})"
                                 for p in committed)
                     if committed else "") + ".")
    return head, rows, text


def _not_passing(summaries: list[dict]) -> str:
    """Which runs did not pass, and whether the mismatch can explain it (a flow with exactly 0
    cannot)."""
    bad = [s for s in summaries if s.get("verdict") not in ("pass", "too_short", "at_line")]
    short = sum(s.get("verdict") == "too_short" for s in summaries)
    line = sorted(s.get("run", Path(s["_dir"]).name) for s in summaries
                  if s.get("verdict") == "at_line")
    note = " ".join(t for t in (
        (f"{short} run(s) too short to judge (fewer than {MIN_JUDGED_STEPS} steps: the verdict "
         "rule needs a peak window and a final window that do not overlap); no verdict is drawn "
         "from them.") if short else "",
        (f"{len(line)} run(s) at the line (the peak within one binomial standard error of the "
         f"threshold, a few samples either way; no verdict): {', '.join(line)}.") if line else "")
                    if t)
    if not bad:
        return note
    flows = render.flow_order(s.get("precision") for s in summaries if s.get("precision"))
    by_flow = {f: [s for s in summaries if s.get("precision") == f] for f in flows}
    parts = []
    for s in bad:
        zero = s.get("mismatch/step0/kl_k3") == 0.0 and s.get("mismatch/final/kl_k3") == 0.0
        peers = by_flow.get(s.get("precision"), [])
        parts.append(f"{s.get('run', Path(s['_dir']).name)} ({s.get('verdict')}, final accuracy "
                     f"{fmt(s.get('accuracy/final'))}; "
                     f"{sum(p.get('verdict') == 'pass' for p in peers)} of {len(peers)} "
                     f"{s.get('precision')} runs pass"
                     + ("; its mismatch is exactly 0, so the mismatch does not explain it" if zero
                        else "") + ")")
    fails = {s.get("precision") for s in bad}
    lowp_only = fails and all(by_flow.get(f)
                              and all(p.get("verdict") not in ("pass", "too_short", "at_line")
                                      for p in by_flow[f])
                              for f in fails)
    return (f"{note} " if note else "") + (f"Not passing: {'; '.join(parts)}. " + (
        "Every run of those flows fails." if lowp_only else
        f"No flow fails in every run, so with {_seeds_per_cell(summaries)} per cell this does not "
        "show precision deciding the reward."))


def _seeds_per_cell(summaries: list[dict]) -> str:
    """How many seeds each (task, algorithm, flow) cell holds, in words: "one seed", "three seeds",
    "1-3 seeds"."""
    cells: dict[tuple, set] = {}
    for s in summaries:
        cells.setdefault((s.get("task"), s.get("algorithm"), s.get("precision")),
                         set()).add(s.get("seed"))
    counts = sorted({len(v) for v in cells.values()}) or [0]
    if len(counts) > 1:
        return f"{counts[0]}-{counts[-1]} seeds"
    words = {1: "one seed", 2: "two seeds", 3: "three seeds", 4: "four seeds", 5: "five seeds"}
    return words.get(counts[0], f"{counts[0]} seeds")


def outcome_markdown(root: Path) -> str:
    """The same table as Markdown (written next to the runs by ``suite main``), led by the
    mismatch."""
    from suite.analysis import sources

    runs = load_runs(root)
    lines = [f"# Outcomes in `{display_path(root)}`", "", machine_sentence(runs), ""]
    # a source grid: each source against its control, never pooled
    if axis := sources.source_axis(runs):
        records = sources.rows(runs, axis)
        head, rows = sources.table(records, axis)
        lines += ["## Source against its control", "", sources.outcome(records, axis), "", "| "
                  + " | ".join(head) + " |", "|"
                  + "---|" * len(head)] + ["| " + " | ".join(r) + " |" for r in rows]
    else:
        head, rows, text = mismatch_lead(root)
        lines += ["## Mismatch first", "", text, "", "| " + " | ".join(head) + " |",
                  "|" + "---|" * len(head)] + ["| " + " | ".join(r) + " |" for r in rows]
        lines += ["", ratio_caption(load_summaries(root)).replace("\n", "  \n")]
    lines += ["", "## Runs", "", "| " + " | ".join(COLUMNS) + " |", "|" + "---|" * len(COLUMNS)]
    lines += ["| " + " | ".join(r) + " |" for r in outcome_rows(root)]
    caption = ratio_caption(load_summaries(root))
    return "\n".join(lines + ["", caption, "", "Verdict rule: " + VERDICT_RULE, ""])


def machine_sentence(runs: list[Run]) -> str:
    """Which machine class produced the runs: every hardware-dependent number below holds for it."""
    from suite.numerics import machine

    labels: dict[str, list[str]] = {}
    for r in runs:
        labels.setdefault(machine.label(machine.of_run(r.dir, r.env)), []).append(r.label)
    if len(labels) == 1:
        return (f"Machine class of every run: {next(iter(labels))}. The numbers below hold for "
                "this class; another CPU ISA level, GEMM backend, torch version or GPU gives other "
                "values (suite/numerics/machine.py).")
    return "Machine classes differ between runs: " + "; ".join(
        f"{k}: {len(v)} run(s)" for k, v in labels.items()) + "."
