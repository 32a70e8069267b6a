"""The main job (``suite main``, ``bash scripts/main.sh``): the sanity grid, then its table, reproduction check,
report and leaderboard, all next to the runs in ``runs/sanity``; nothing tracked by git is written."""

from __future__ import annotations

import os
import time

from rich.console import Console


def run(args: list[str], console: Console) -> int:
    """Train the ``sanity`` grid (extra ``key=value`` go to every cell) on the local cores, then write and print
    the grid table (mismatch first), the reproduction check against this class's reference, the report and the
    leaderboard; ``job.json`` records the command and wall time that ``suite reference`` keeps as provenance."""
    from rich.table import Table

    from suite.analysis import leaderboard, outcomes, report, reproduce
    from suite.experiments import sweep
    from suite.numerics import machine
    from suite.results import atomic_write_json, atomic_write_text, env_info

    t0 = time.time()
    # The embedded grid needs no hub: say so to every library (a user's explicit setting wins).
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
    plan = sweep.plan_grid(["grid=sanity", *args])  # validates every cell first
    root = plan.cells[0].root
    todo = [c for c in plan.cells if sweep.state(c) != "complete"]
    code = sweep.main(["grid=sanity", "launcher=local", *args])
    atomic_write_text(root / "outcomes.md", outcomes.outcome_markdown(root))
    head, rows, text = outcomes.mismatch_lead(root)
    lead = Table(*head, title="mismatch first (step 0, mean over each flow's runs)")
    for row in rows:
        lead.add_row(*row)
    console.print(lead)
    console.print(text, highlight=False)

    doc = reproduce.check(root, "sanity")
    reproduce.write(root, doc)
    table = Table(*reproduce.HEAD, title=f"reproduction on machine class {(doc['machine_class'] or {}).get('id')}")
    for row in reproduce.table_rows(doc):
        table.add_row(*row)
    console.print(table)
    console.print(doc["statement"], highlight=False)

    out = report.write_report(root)
    site = leaderboard.build([root], root / "leaderboard")
    atomic_write_json(root / "job.json", {  # what `suite reference` records as the reference's provenance
        "command": " ".join(["suite", "main", *args]), "wall_time_s": round(time.time() - t0, 1),
        "cells": len(plan.cells), "cells_trained": len(todo), "machine_class": doc["machine_class"],
        "git_sha": env_info()["git_sha"]})
    trained = (f"trained {len(todo)} of {len(plan.cells)} cells" if todo else
               f"trained nothing: all {len(plan.cells)} cells were already complete in {root} (delete it, or pass "
               "out=DIR, to compute them again)")
    console.print(f"main job: {trained}; wall time {time.time() - t0:.0f} s on machine class "
                  f"{machine.label(doc['machine_class'])}.\n  results      {root}\n  table        {root / 'outcomes.md'}"
                  f"\n  reproduction {root / 'reproduction.md'}\n  report       {out / 'index.html'}\n  leaderboard  {site}",
                  highlight=False)
    return code
