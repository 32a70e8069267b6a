"""The main job (``suite main``, ``bash scripts/main.sh``): the main flows and the controls
(known-bad recipes beside their corrections), three seeds each, then the table, the controls'
judgement, the reproduction checks, the report and the leaderboard, all under ``runs/``
(``runs/main``, ``runs/controls``); nothing tracked by git is written. Exits non-zero when a cell
failed or a control did not behave as its committed evidence says."""

from __future__ import annotations

import os
import time

from rich.console import Console

GRIDS = ("main", "controls")


def _train(args: list[str], console: Console) -> tuple[list, list, int]:
    """Plan both grids (every cell validated before any compute), run what is missing in one queue
    on the local cores (the longest cells first), print the outcome tables; (cells, cells trained,
    number failed)."""
    from suite.experiments import sweep
    from suite.experiments.local_launcher import launch_local

    plans = [sweep.plan_grid([f"grid={g}", *args]) for g in GRIDS]
    cells = [c for p in plans for c in p.cells]
    todo = [c for c in cells if sweep.state(c) != "complete"]
    console.print(f"main job: {len(cells)} cells ({len(cells) - len(todo)} already complete): "
                  + ", ".join(f"{p.grid['name']} {len(p.cells)}" for p in plans), highlight=False)
    if todo:
        from suite.numerics import determinism

        determinism.reserve(any(c.cfg.deterministic for c in todo))
        jobs = plans[0].options.get("jobs")
        launch_local(todo, int(jobs) if jobs else None, console,
                     prepare=lambda: sweep.prebuild(todo, console))
    failed = sweep.report_sweep(cells, console, tables=False)  # the tables follow, by grid
    return cells, todo, len(failed)


def run(args: list[str], console: Console) -> int:
    """Train the ``main`` and ``controls`` grids (extra ``key=value`` go to every cell: the user's
    word is final, so ``staleness=0`` plants a control that must then be caught), then write and
    print the controls' judgement (its first line: the known-bad recipes failed, the fixes and
    references passed), the mismatch table, the reproduction checks against this class's references,
    the report and the leaderboard; ``job.json`` records the command and wall time that ``suite
    reference`` keeps as provenance."""
    from rich.table import Table

    from suite.analysis import leaderboard, outcomes, report, reproduce
    from suite.analysis.runs import load_summaries
    from suite.experiments import controls
    from suite.numerics import machine
    from suite.results import atomic_write_json, atomic_write_text
    from suite.rl.env_record import env_info

    t0 = time.time()
    # The embedded grid needs no hub: say so to every library (a user's explicit setting wins).
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
    cells, todo, failed = _train(["launcher=local", *args], console)
    root = next(c.root for c in cells if c.cfg.name == "main")
    # each control row's cells lie below it (controls/<control>/<bad|fix>)
    ctl_root = root.parent / "controls"
    roots = {"main": root, "controls": ctl_root}

    docs = {g: reproduce.check(r, g) for g, r in roots.items()}
    cls = docs["main"]["machine_class"]
    records = controls.judge(ctl_root, tuple(args))
    refs = [s.get("verdict") for s in load_summaries(root) if s.get("precision") == "fp32"]
    line = controls.first_line(records, refs, machine.label(cls))
    controls.write(ctl_root, root, records, line)
    title, _, rest = outcomes.outcome_markdown(root).partition("\n")
    atomic_write_text(root / "outcomes.md", f"{title}\n\n**{line}**\n{rest}")

    head, rows, text = outcomes.mismatch_lead(root)
    lead = Table(*head, title="mismatch first (step 0, mean over each flow's runs)")
    for row in rows:
        lead.add_row(*row)
    console.print(lead)
    console.print(text, highlight=False)
    head, rows = controls.table(records)
    ctl = Table(*head, title="controls: each known-bad recipe beside its corrections")
    for row in rows:
        ctl.add_row(*row)
    console.print(ctl)
    for g, doc in docs.items():
        reproduce.write(roots[g], doc)
        table = Table(*reproduce.HEAD, title=f"reproduction of {g} on machine class "
                                             f"{(cls or {}).get('id')}")
        for row in reproduce.table_rows(doc):
            table.add_row(*row)
        console.print(table)
        console.print(doc["statement"], highlight=False)

    out = report.write_report(root)
    site = leaderboard.build([root], root / "leaderboard")
    # what `suite reference` records as the reference's provenance
    atomic_write_json(root / "job.json", {
        "command": " ".join(["suite", "main", *args]), "wall_time_s": round(time.time() - t0, 1),
        "cells": len(cells), "cells_trained": len(todo), "machine_class": cls,
        "git_sha": env_info()["git_sha"], "first_line": line})
    trained = (f"trained {len(todo)} of {len(cells)} cells" if todo else
               f"trained nothing: all {len(cells)} cells were already complete under {root.parent} "
               "(delete runs/main and runs/controls, or pass out=DIR, to compute them again)")
    console.print(f"{line}\nmain job: {trained}; wall time {time.time() - t0:.0f} s.\n  results    "
                  f"  {root}, {ctl_root}\n  table        {root / 'outcomes.md'}\n  reproduction "
                  f"{root / 'reproduction.md'}, {ctl_root / 'reproduction.md'}\n  report       "
                  f"{out / 'index.html'}\n  leaderboard  {site}",
                  highlight=False)
    wrong = controls.misbehaved(records)
    for w in wrong:
        console.print(f"[red]control did not behave as its committed evidence says: {w}[/]",
                      soft_wrap=True)
    return 1 if failed else 3 if wrong else 0

