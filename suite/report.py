"""Tables and reports: pure functions of result bundles."""

from __future__ import annotations

import json
from pathlib import Path

from rich.table import Table


def load_summaries(root: Path) -> list[dict]:
    out = []
    for path in sorted(Path(root).glob("*/summary.json")):
        s = json.loads(path.read_text())
        s["_dir"] = str(path.parent)
        out.append(s)
    return out


def _fmt(x, spec=".3f"):
    return "-" if x is None else format(x, spec)


def outcome_table(root: Path) -> Table:
    """One row per run: verdict, peak and final accuracy, step-0 and final mismatch."""
    t = Table(title=f"outcomes in {root}")
    for col in ("run", "verdict", "peak acc (step)", "final acc", "first pass step", "step-0 |dp| mean",
                "step-0 k3 KL", "step-0 |seq log-ratio|", "final k3 KL", "skipped", "time s"):
        t.add_column(col)
    for s in load_summaries(root):
        t.add_row(s["run"], s["verdict"], f"{_fmt(s['accuracy/peak'])} ({s['accuracy/peak_step']})",
                  _fmt(s["accuracy/final"]), str(s["accuracy/first_pass_step"]),
                  _fmt(s.get("mismatch/step0/prob_diff/mean"), ".2e"), _fmt(s.get("mismatch/step0/kl_k3"), ".2e"),
                  _fmt(s.get("mismatch/step0/seq_log_ratio/mean_abs"), ".2e"),
                  _fmt(s.get("mismatch/final/kl_k3"), ".2e"), str(s.get("train/skipped_steps")),
                  _fmt(s.get("time/total_s"), ".0f"))
    return t
