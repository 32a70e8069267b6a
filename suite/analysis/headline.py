"""The main job's headline figure: training accuracy per precision flow and per control row, one
panel each, every seed drawn, the pass line dashed; what the README and the report open with.

The controls' runs lie beside the main flows' (``<out>/main`` and
``<out>/controls/<control>/<bad|fix>``, and the same in ``results/reference/<class>/``); the main
job's judgement (``controls.json``) names each row."""

from __future__ import annotations

import json
from pathlib import Path

from suite.analysis.render import flow_order
from suite.analysis.runs import Run, load_runs
from suite.results import PEAK_WINDOW


def _series(runs: list[Run], flow: str) -> list[dict]:
    """Each run's reward curve, coloured as ``flow`` (one colour a panel: the panel names the
    row)."""
    return [{"task": r.task, "algorithm": r.algorithm, "precision": flow, "seed": r.seed,
             "complete": r.verdict != "incomplete",
             "steps": [m["step"] for m in r.metrics if "reward/mean" in m],
             "values": [m["reward/mean"] for m in r.metrics if "reward/mean" in m]} for r in runs]


def _title(name: str, runs: list[Run]) -> str:
    return f"{name}: {sum(r.verdict == 'pass' for r in runs)}/{len(runs)} pass"


def panels(root: Path) -> dict[str, list[dict]]:
    """Panel title -> series: the main flows of ``root`` (plain GRPO), then each control's rows."""
    root = Path(root)
    out: dict[str, list[dict]] = {}
    main = load_runs(root)
    for flow in flow_order(r.precision for r in main):
        runs = [r for r in main if r.precision == flow]
        out[_title(flow, runs)] = _series(runs, flow)
    judged = root / "controls.json"
    ctl_root = root.parent / "controls"
    if judged.is_file() and ctl_root.is_dir():
        for rec in json.loads(judged.read_text())["records"]:
            for row in rec["rows"]:
                # as the controls table names it (controls.kind)
                label = f"{row['kind']}, {row['label']}"
                path = ctl_root / rec["control"] / row["role"]
                runs = load_runs(path) if path.is_dir() else []
                if runs:
                    out[_title(f"{rec['control']}, {label}", runs)] = _series(
                        runs, f"{rec['control']} {row['role']}")
    return out


def draw(root: Path, stem: Path, line: float) -> list[str]:
    """The figure's files (``figures.save``); [] when ``root`` holds no controls judgement (not a
    main job)."""
    from suite.analysis import figures

    if not (Path(root) / "controls.json").is_file():
        return []
    series = panels(root)
    flows = list(dict.fromkeys(s["precision"] for ss in series.values() for s in ss))
    return figures.panels(series, flows, stem, PEAK_WINDOW, "training accuracy (reward/mean)",
                          hline=line, n_cols=4)
