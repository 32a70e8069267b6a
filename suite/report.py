"""Tables and reports: pure functions of result bundles."""

from __future__ import annotations

import json
from pathlib import Path

from rich.table import Table

from suite.results import VERDICT_RULE


def load_summaries(root: Path) -> list[dict]:
    out = []
    for path in sorted(Path(root).glob("*/summary.json")):
        s = json.loads(path.read_text())
        s["_dir"] = str(path.parent)
        out.append(s)
    return out


def _fmt(x, spec=".3f"):
    return "-" if x is None else format(x, spec)


COLUMNS = ("run", "verdict", "peak acc (step)", "final acc", "first pass step", "step-0 mean abs dp",
           "step-0 k3 KL", "step-0 mean abs seq log-ratio", "final k3 KL", "skipped steps", "time s")


def outcome_rows(root: Path) -> list[list[str]]:
    """One row per run: verdict, peak and final accuracy, step-0 and final mismatch."""
    out = []
    for s in load_summaries(root):
        out.append([s["run"], s["verdict"], f"{_fmt(s['accuracy/peak'])} ({s['accuracy/peak_step']})",
                    _fmt(s["accuracy/final"]), str(s["accuracy/first_pass_step"]),
                    _fmt(s.get("mismatch/step0/prob_diff/mean"), ".2e"), _fmt(s.get("mismatch/step0/kl_k3"), ".2e"),
                    _fmt(s.get("mismatch/step0/seq_log_ratio/mean_abs"), ".2e"),
                    _fmt(s.get("mismatch/final/kl_k3"), ".2e"), str(s.get("train/skipped_steps")),
                    _fmt(s.get("time/total_s"), ".0f")])
    return out


def outcome_table(root: Path) -> Table:
    t = Table(title=f"outcomes in {root}", caption=_ratio_caption(load_summaries(root)))
    for col in COLUMNS:
        t.add_column(col)
    for row in outcome_rows(root):
        t.add_row(*row)
    return t


def outcome_markdown(root: Path) -> str:
    """The same table as Markdown (written next to the runs by ``suite main``)."""
    lines = [f"# Outcomes in `{root}`", "", "| " + " | ".join(COLUMNS) + " |", "|" + "---|" * len(COLUMNS)]
    lines += ["| " + " | ".join(r) + " |" for r in outcome_rows(root)]
    caption = _ratio_caption(load_summaries(root))
    return "\n".join(lines + ["", caption, "", "Verdict rule: " + VERDICT_RULE, ""])


def _ratio_caption(rows: list[dict]) -> str:
    """bf16/fp16 ratios of the step-0 mismatch, when both flows are present (same task, algorithm, seed)."""
    by = {(r["task"], r["algorithm"], r["seed"], r["precision"]): r for r in rows}
    parts = []
    for (task, algo, seed, prec), r in sorted(by.items()):
        other = by.get((task, algo, seed, "fp16"))
        if prec != "bf16" or other is None:
            continue
        ratios = []
        for key, label in (("prob_diff/mean", "mean abs dp"), ("kl_k3", "k3 KL"), ("seq_log_ratio/mean_abs", "mean abs seq log-ratio")):
            a, b = r.get(f"mismatch/step0/{key}"), other.get(f"mismatch/step0/{key}")
            if a is not None and b:
                ratios.append(f"{label} {a / b:.1f}x")
        parts.append(f"step-0 mismatch bf16/fp16 ({algo}, seed {seed}): " + ", ".join(ratios))
    return "\n".join(parts)
