"""Tables and reproducibility reports: pure functions of result bundles (suite/results.py).

``suite report RESULTS_DIR [--out DIR] [--svg]`` writes a self-contained folder (default
``RESULTS_DIR/report/``): ``index.html`` and ``report.md`` with the same content, and
``figures/*.png`` (with ``--svg`` also ``*.svg``, linked beside each PNG). RESULTS_DIR holds run
directories (``<task>__<algorithm>__<precision>__s<seed>/``), directly or up to two levels down
(``results/<name>/<run>/``). The report contains, in order: the generated outcome sentence
(outcomes.md's), what the runs are and on which machine class, warnings that change the reading
(cells that differ in more than the grid axes, dirty checkouts, unreadable files, commands that do
not reproduce a config hash), the verdict table per cell (task, algorithm, precision) over seeds
with only the columns that carry information, training curves, mismatch over training and at step 0,
fp16 loss scaling, IS diagnostics, the published sanity-test comparison (task ``sanity_r1d`` only),
failed and incomplete runs with their errors, the attribution section, every run, notes that do not
change the reading, and provenance (environment, config hashes, the exact ``suite run`` command of
every run). docs/report.md explains how to read it.

This module assembles the document and writes the files; suite/analysis/runs.py loads the runs,
suite/analysis/outcomes.py holds the outcome table, suite/analysis/render.py the cells and tables,
suite/analysis/pages.py the HTML/Markdown, suite/rl/provenance.py the rerun commands and their
config-hash check (shared with the leaderboard). Nothing is timestamped: the same result files give
the same report.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from suite.analysis import bundle, pages, render
from suite.analysis.outcomes import machine_sentence
from suite.analysis.render import IS_PLOT, MISMATCH_PLOT, ratio_caption
from suite.analysis.runs import Run, load_runs
from suite.results import PEAK_WINDOW, VERDICT_RULE, display_path, find_run_dirs
from suite.rl import provenance

# ---------------------------------------------------------------------------- the document
# A list of blocks (suite/analysis/render.py), rendered twice (HTML, Markdown) so both files say the
# same.


def _series(runs: list[Run], key: str) -> list[dict]:
    out = []
    for r in runs:
        rows = [m for m in r.metrics if key in m and "step" in m]
        if rows:
            out.append({"task": r.task, "algorithm": r.algorithm, "precision": r.precision,
                        "seed": r.seed, "complete": r.verdict != "incomplete",
                        "steps": [m["step"] for m in rows], "values": [m[key] for m in rows],
                        "skipped": [m.get("train/skipped_steps") for m in rows]})
    return out


def algorithm_rows(runs: list[Run]) -> list[list[str]]:
    """What each algorithm of the suite's runs computed (suite/rl/algo_table.py ``in_words``, with
    the ``algo.*`` knobs each run recorded), one row per name and meaning, so that ``grpo`` is never
    read as verl's or TRL's GRPO; none for runs imported from another framework (they name their own
    loss)."""
    from suite.rl.algo_table import ALGORITHMS, ROW_KNOBS, get_algorithm, in_words

    said: dict[str, list[str]] = {}
    for r in runs:
        if r.framework != bundle.SUITE or r.algorithm not in ALGORITHMS:
            continue
        knobs = {k: v for k, v in ((r.config or {}).get("algo") or {}).items()
                 if k in ROW_KNOBS and v is not None}
        try:
            words = in_words(get_algorithm(r.algorithm, **knobs))
        except ValueError as e:  # a knob today's table refuses: say so rather than guess
            words = f"not describable with today's table ({e})"
        if words not in said.setdefault(r.algorithm, []):
            said[r.algorithm].append(words)
    return [[name, w] for name, words in sorted(said.items()) for w in words]


def build_document(runs: list[Run], root: Path, fig_dir: Path) -> list[tuple]:
    """Every section of the report, drawing the figures into `fig_dir` on the way."""
    from suite.analysis import attribution, early_warnings, figures

    flows = render.flow_order(r.precision for r in runs)
    cells = render.group_cells(runs)
    own = [r for r in runs if r.framework == bundle.SUITE]
    checks = {r.label: provenance.check(r.config, r.config_hash) for r in own if r.config
              and r.config_hash}
    answers = {r.label: str(checks[r.label]) if r.label in checks else "no hash recorded"
               for r in own if r.config}
    answers.update({r.label: outside_answer(r) for r in runs if r.framework != bundle.SUITE
                    and r.config})
    # Warnings that change how the numbers read (cells not comparable, unreadable files, commands
    # that do not reproduce) lead; the ones that do not (fields added to the code since the runs) go
    # last, compact.
    warnings = render.consistency_warnings(runs)
    warnings += [f"{r.label}: {'; '.join(r.problems)}" for r in runs if r.problems]
    warnings += [f"{label}: the rerun command does not reproduce its config hash ({a})"
                 for label, a in answers.items() if not a.startswith(("yes", "outside loop"))]
    added = sorted({c.added_text() for c in checks.values() if c.added and not c.problem})
    notes = [f"Config fields added to the code since some runs ({'; '.join(added)}): the rerun "
             "commands reproduce every recorded field; a rerun's config hash will "
             "differ."] if added else []
    bad = [r for r in runs if r.verdict == "incomplete"]
    tasks, algos = sorted({r.task for r in runs}), sorted({r.algorithm for r in runs})
    # The first screen: what the runs found (verdicts per flow x algorithm, the reward they are read
    # from); then what they are, on which machine, what changes how they read, and how they compare
    # with the reference.
    head, rows = verdict_matrix(runs)
    doc: list[tuple] = [("p", outcome_sentence(root)),
                        ("table", head, rows, "Verdicts of every run per precision flow and "
                                              "algorithm (the rule, and "
                         "each cell's accuracies, under Verdicts per cell below).")]
    fig_dir.mkdir(parents=True, exist_ok=True)
    # the main job's judgement of its controls (experiments/controls)
    if (ctl := root / "controls.json").is_file():
        from suite.analysis import headline

        c, line = json.loads(ctl.read_text()), next(r.config.get("threshold", 0.95) for r in runs
                                                    if r.config)
        doc[:0] = [("p", c["first_line"])]
        if headline.draw(root, fig_dir / "headline", line):
            doc.append(("fig", "headline", "Training accuracy per precision flow (plain GRPO) and "
                                           "per control row, "
                        "one panel each: thin lines the seeds, bold their mean "
                        f"({PEAK_WINDOW}-step trailing mean, the verdict rule's acc_t); dashed: "
                        f"the pass line {line:g} (docs/calibration.md)."))
        doc += [("h", "Controls: known-bad recipes beside their corrections", "controls"),
                ("table", c["head"], c["rows"], "Committed evidence per control: "
                 + "; ".join(f"{r['control']}: {r['evidence']}" for r in c["records"])
                 + " (docs/calibration.md).")]
    rewards = _series(runs, "reward/mean")
    if rewards:
        thresholds = {r.task: r.config.get("threshold", 0.95) for r in runs if r.config}
        figures.reward_curves(rewards, flows, fig_dir / "reward_curves", PEAK_WINDOW, thresholds)
        doc += [("h", "Training accuracy", "curves"),
                ("fig", "reward_curves", "Training accuracy (reward/mean), trailing mean over "
                                         f"{PEAK_WINDOW} steps "
                 "(the verdict rule's acc_t). One panel per algorithm, colour = precision flow.")]
    if warned := early_warnings.report_table([(r.label, r.metrics, r.verdict) for r in runs]):
        doc += [("h", "Early warnings of the runs that did not pass", "early-warnings"),
                ("table", *warned)]
    doc += [
        ("h", "The runs", "about"),
        ("p", f"{len(runs)} runs in {len(cells)} cells from {display_path(root)}: tasks "
              f"{', '.join(tasks)}; algorithms {', '.join(algos)}; precision flows "
              f"{', '.join(flows)}; seeds {', '.join(map(str, sorted({r.seed for r in runs})))}. "
              f"{len(bad)} run(s) incomplete or failed. Every number below is computed from the "
              "run directories alone (suite report)."),
        ("p", machine_sentence(runs)),
        *([("table", ["Algorithm", "What it computes here"], names,
                    "A name another framework uses may mean other settings here: suite ls "
                    "algorithms, docs/algorithms.md.")] if (names := algorithm_rows(runs)) else []),
    ]
    if warnings:
        doc += [("h", "Warnings", "warnings"), ("warn", warnings)]
    head, rows = render.verdict_table(runs)
    doc += [("h", "Verdicts per cell", "verdicts"),
            ("table", head, rows, "Counts over every run of the cell; accuracy statistics over its "
                                  "complete runs "
             "only: mean ± sample std (ddof=1), 95% percentile-bootstrap CI of the mean (10,000 "
             "resamples, fixed seed; with two seeds it is [min, max]), IQM = mean after dropping "
             "the lowest and highest quarter. First pass step: mean over the runs that reached the "
             "threshold (reached / complete). Columns that carry nothing at this number of seeds "
             "(an interval of one run, a count that is 0 everywhere) are left out."),
            ("p", "Verdict rule: " + VERDICT_RULE)]

    repro = Path(root) / "reproduction.json"
    if repro.is_file():  # written by `suite main` (suite/analysis/reproduce.py)
        from suite.analysis import reproduce

        rdoc = json.loads(repro.read_text(encoding="utf-8"))
        doc += [("h", "Reproduction against the committed reference", "reproduction"),
                ("p", rdoc["statement"]),
                ("table", reproduce.HEAD, reproduce.table_rows(rdoc),
                 "metrics.jsonl compared byte for byte with the reference run of the same name; "
                 "rel. diff = |here - ref| / |ref|."),
                ("table", ["invariant (every machine)", "holds", "detail"],
                 [[i["name"], "n/a" if i["ok"] is None else "yes" if i["ok"] else "NO", i["detail"]]
                  for i in rdoc["invariants"]], "")]

    doc += [("h", "Training-inference mismatch", "mismatch")]
    mism = {k: _series(runs, k) for k in MISMATCH_PLOT}
    mism = {k: v for k, v in mism.items() if v}
    if mism:
        figures.metric_grid(mism, MISMATCH_PLOT, flows, fig_dir / "mismatch_curves", PEAK_WINDOW)
        doc.append(("fig", "mismatch_curves", "Mismatch between sampler and trainer log-probs of "
                                              "the sampled tokens, "
                    "per RL step, log axis (suite/numerics/mismatch.py: k3 KL, max abs probability "
                    "difference, mean abs per-sequence log-ratio)."))
    points = [{"precision": render.flow_label(r), "metric": k,
               "value": r.summary.get("mismatch/step0/" + k[len("mismatch/"):])}
              for r in runs for k in MISMATCH_PLOT]
    points = [p for p in points if isinstance(p["value"], (int, float))]
    if points:
        figures.step0_bars(points, MISMATCH_PLOT,
                           render.flow_order(render.flow_label(r) for r in runs),
                           fig_dir / "mismatch_step0")
        head, rows = render.step0_table(runs)
        doc += [("fig", "mismatch_step0", "Step-0 mismatch (first step, before any update) by "
                                          "precision flow."),
                ("table", head, rows,
                 ratio_caption([{**r.summary, "task": r.task, "algorithm": r.algorithm,
                                                       "seed": r.seed, "precision": r.precision}
                                for r in runs]))]
    if not mism and not points:
        doc.append(("p", "No mismatch metrics in these runs."))

    head, rows = render.loss_scale_table(runs)
    if rows:
        figures.loss_scale(_series([r for r in runs if render.uses_loss_scaling(r)],
                                   "train/loss_scale"),
                           fig_dir / "loss_scale")
        doc += [("h", "fp16 loss scaling", "loss-scale"),
                ("table", head, rows, "Dynamic loss scaling (GradScaler): a back-off halves the "
                                      "scale after an "
                 "inf/NaN gradient and skips that optimizer step; a growth doubles it after a run "
                 "of finite steps."),
                ("fig", "loss_scale",
                 "Loss scale (log2 axis) and cumulative skipped steps per run.")]

    head, rows = render.is_table(runs)
    if rows:
        doc += [("h", "Importance-sampling diagnostics", "is"),
                ("table", head, rows, "is/* metrics of suite/rl/algos.py (mean [min, max] over all "
                                      "steps of all runs "
                 "in the cell): raw IS weights before truncation or masking (practitioners' rule "
                 "of thumb: a warning outside [0.5, 2]), fraction truncated (TIS) or masked (MIS), "
                 "normalised ESS of the applied weights (1 = uniform).")]
        iss = {k: v for k, v in ((k, _series(runs, k)) for k in IS_PLOT) if v}
        if iss:
            figures.metric_grid(iss, IS_PLOT, flows, fig_dir / "is_diagnostics", PEAK_WINDOW,
                                log=False)
            doc.append(("fig", "is_diagnostics", "IS diagnostics over training (linear axis)."))

    head, rows = render.sanity_table(runs)
    if rows:
        doc += [("h", "Published sanity test (arXiv 2510.26788)", "sanity"),
                ("table", head, rows, "Published outcomes of arXiv 2510.26788 (read off its "
                                      "figures, approximate "
                 "figures from the paper, 1.5B model, 1,460 MATH problems). Consistent: our "
                 "complete runs' verdicts fall in the set the published outcome implies.")]

    transfer_tables = render.transfer_tables(runs)
    if transfer_tables:
        (head, rows), (bhead, brows) = transfer_tables
        doc += [("h", "Transfer index (lm-eval)", "transfer"),
                ("table", head, rows, "From each run's transfer.json (suite transfer): lm-eval "
                                      "scores in percent of "
                 "the base model and the final checkpoint; Δ = mean change per group in points. TI "
                 "= 100 x (gain of the group) / (gain on math), arXiv 2507.00432: v1 on relative "
                 "gains, v2 on sqrt-scaled changes with sigma per model, pooled over the runs "
                 "evaluated together, fixed, or none. > 0 transfer, < 0 forgetting; 'flag': not a "
                 "number (math gain <= 0, sigma 0; docs/transfer.md)."),
                ("table", bhead, brows, "Per benchmark: base -> final score (percent).")]

    if bad:
        doc += [("h", "Failed and incomplete runs", "failed"),
                ("table", ["run", "status", "steps", "error"],
                 [[r.label, r.status,
                   f"{r.summary.get('steps_done', len(r.metrics))}/"
                   f"{r.summary.get('total_steps', '?')}",
                   r.error or "no error recorded (stopped early or still running)"]
                  for r in bad], "")]
        doc += [x for r in bad if r.detail
                for x in (
                    ("p", f"{r.label}: last lines of "
                          f"{'error.txt' if (r.dir / 'error.txt').is_file() else 'log.txt'}"),
                    ("pre", r.detail))]

    if found := attribution.find(root):
        doc += attribution.report_section(found, fig_dir)

    head, rows = render.run_table(runs)
    doc += [("h", "Runs", "runs"), ("table", head, rows, "")]
    if notes:
        doc += [("h", "Notes", "notes"), ("p", " ".join(notes))]
    head, rows = render.provenance_table(runs, answers)
    doc += [("h", "Provenance", "provenance"),
            ("table", head, rows, "Config hash: suite.results.config_hash of the resolved config "
                                  "(out and name excluded). The check recomposes the command below "
                                  "with suite.rl.config.load and compares hashes."),
            ("table", *render.env_table(runs), "From env.json; 'differs' lists each value with its "
                                               "runs."),
            ("p", "Commands that rerun every run (its axes, then the fields that differ from what "
                  "those compose to):"),
            ("pre", "\n".join(f"# {r.label}\n{command_of(r)}" for r in runs if r.config)
             or "(no configs)")]
    return doc


def verdict_matrix(runs: list[Run]) -> tuple[list[str], list[list[str]]]:
    """The first screen's table: a row per precision flow, a column per algorithm (task-prefixed
    when a grid has several tasks), each cell its runs' verdicts: "3/3 pass", or "1/3 pass, 2
    unstable"."""
    cells = render.group_cells(runs)
    tasks = sorted({t for t, _, _ in cells})
    cols = sorted({(t, a) for t, a, _ in cells}, key=lambda c: (tasks.index(c[0]), c[1]))
    head = ["precision flow", *(a if len(tasks) == 1 else f"{t} {a}" for t, a in cols)]
    rows = []
    for f in render.flow_order(p for _, _, p in cells):
        row = [f]
        for t, a in cols:
            cell = cells.get((t, a, f), [])
            counts = [(v, sum(r.verdict == v for r in cell)) for v in render.VERDICTS]
            rest = ", ".join(f"{n} {v.replace('_', ' ')}" for v, n in counts[1:] if n)
            row.append("-" if not cell else f"{counts[0][1]}/{len(cell)} pass"
                       + (f", {rest}" if rest else ""))
        rows.append(row)
    return head, rows


def outcome_sentence(root: Path) -> str:
    """The result in one paragraph, generated from the summaries (the sentence outcomes.md leads
    with)."""
    from suite.analysis.outcomes import mismatch_lead

    try:
        return "Outcome: " + mismatch_lead(Path(root))[2]
    except (ValueError, KeyError, OSError) as e:  # a folder without summaries still gets its report
        return f"Outcome: not computable from these files ({e})."


def outside_answer(r: Run) -> str:
    """The provenance answer of an outside loop's run: what backs its numbers (bundle.check), or NO
    and why."""
    try:
        check = bundle.check(r.dir, r.config, r.env or {}, r.metrics)
        return "outside loop, not rerun by suite run: " + bundle.describe_check(check)
    except ValueError as e:
        return f"NO: {e}"


def command_of(r: Run) -> str:
    """The suite run command that reruns a run, or the command an outside loop recorded (not
    recomposable)."""
    if r.framework == bundle.SUITE:
        return provenance.rerun_command(r.config)
    return "# " + r.framework + ", as recorded (not recomposed):\n" + str(
        ((r.env or {}).get("bundle") or {}).get("command"))


# ---------------------------------------------------------------------------- writing, CLI
def write_report(results_dir: Path, out: Path | None = None, svg: bool = False) -> Path:
    """Write the report of `results_dir` to `out` (default `<results_dir>/report/`, replaced
    atomically) and return it; `svg`: every figure also as SVG (the committed references carry PNGs
    only)."""
    from suite.analysis import figures

    with figures.vectors(svg):
        return _write_report(Path(results_dir), out)


def _write_report(results_dir: Path, out: Path | None) -> Path:
    from suite.analysis import attribution

    root = Path(results_dir)
    found = attribution.find(root) if root.is_dir() else []
    # `suite report runs/attribute`: the attribution section alone
    if found and not find_run_dirs(root):
        return pages.write_folder(Path(out) if out is not None else root / "report",
                                  lambda fig_dir: (
            [("p", f"{len(found)} attribution(s) from {root}."),
             *attribution.report_section(found, fig_dir)],
            f"Mismatch by source: {root.resolve().name}"))
    runs = load_runs(root)

    def build(fig_dir: Path):
        from suite.analysis import sources

        # a source grid (src-top-p, src-kv-fp8, src-staleness)
        if axis := sources.source_axis(runs):
            head, rows = render.run_table(runs)
            doc = [*sources.build_document(runs, root, axis), ("h", "Runs", "runs"),
                   ("table", head, rows, "")]
            return doc, f"Source grid: {root.resolve().name}"
        if len({(r.config or {}).get("regime", "base") for r in runs}) > 1:
            # a collapse search (grid collapse-search): runs differ in their regime, not only the
            # grid axes
            from suite.analysis import collapse

            return collapse.build_document(runs, root,
                                           fig_dir), f"Collapse search: {root.resolve().name}"
        return build_document(runs, root, fig_dir), f"Reproducibility report: {root.resolve().name}"

    return pages.write_folder(Path(out) if out is not None else root / "report", build)


def cli(args: list[str]) -> int:
    """``suite report RESULTS_DIR [--out DIR] [--svg]``; bad input raises ValueError (exit code 2 in
    suite.cli)."""
    p = argparse.ArgumentParser(prog="suite report",
                                description="Reproducibility report of a results directory (HTML + "
                                            "Markdown + figures), computed from the run files "
                                            "alone.")
    p.add_argument("results_dir", help="directory holding run directories (or up to two levels of "
                                       "experiment folders)")
    p.add_argument("--out", help="output folder (default: RESULTS_DIR/report)")
    p.add_argument("--svg", action="store_true", help="also write every figure as SVG (vector; "
                                                      "larger files)")
    ns = p.parse_args(args)
    out = write_report(Path(ns.results_dir), Path(ns.out) if ns.out else None, svg=ns.svg)
    print(f"report written to {out / 'index.html'} (also report.md and figures/)")
    return 0
