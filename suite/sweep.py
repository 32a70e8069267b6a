"""Run many cells (one RL run each) side by side on this machine.

Each cell is a separate ``suite run`` process with its own overrides, so a crash in one cell
never takes the others down; its output goes to ``<run_dir>/log.txt`` and a failure is
recorded there and in its ``summary.json`` (verdict ``incomplete`` with the error). Cells
already complete are skipped by ``suite run`` itself; partial cells resume from their last
checkpoint. ``jobs`` processes run at once (default: cores / threads per cell).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from suite import config as cfgmod
from suite.results import run_dir_name


@dataclass
class Cell:
    overrides: list[str]
    cfg: cfgmod.RunConfig

    @property
    def run_dir(self) -> Path:
        c = self.cfg
        return Path(c.out) / c.name / run_dir_name(c.task, c.algorithm, c.precision, c.seed)


def plan(base: list[str], axes: dict[str, list[str]]) -> list[Cell]:
    """Cartesian product of ``axes`` on top of ``base``; every cell validated before any compute."""
    cells = [[]]
    for key, values in axes.items():
        cells = [c + [f"{key}={v}"] for c in cells for v in values]
    out = []
    for extra in cells:
        overrides = [o for o in base if o.split("=", 1)[0] not in axes] + extra
        out.append(Cell(overrides, cfgmod.load(overrides)))
    return out


def _steps_done(cell: Cell) -> int:
    path = cell.run_dir / "metrics.jsonl"
    return sum(1 for _ in path.open()) if path.exists() else 0


def launch_local(cells: list[Cell], jobs: int, console: Console) -> dict[str, int]:
    """Run cells as subprocesses, ``jobs`` at a time; return each run dir's exit code."""
    pending, running, codes = list(cells), {}, {}
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "PYTHONUNBUFFERED": "1"}
    with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                  console=console) as progress:
        bars = {str(c.run_dir): progress.add_task(c.run_dir.name, total=c.cfg.steps, completed=_steps_done(c))
                for c in cells}
        while pending or running:
            while pending and len(running) < jobs:
                cell = pending.pop(0)
                cell.run_dir.mkdir(parents=True, exist_ok=True)
                log = (cell.run_dir / "log.txt").open("a")
                proc = subprocess.Popen([sys.executable, "-m", "suite.cli", "run", *cell.overrides],
                                        stdout=log, stderr=subprocess.STDOUT, env=env)
                running[proc] = (cell, log)
            time.sleep(1.0)
            for proc, (cell, log) in list(running.items()):
                progress.update(bars[str(cell.run_dir)], completed=_steps_done(cell))
                if proc.poll() is not None:
                    log.close()
                    codes[str(cell.run_dir)] = proc.returncode
                    del running[proc]
                    if proc.returncode != 0:
                        console.print(f"[red]{cell.run_dir.name} failed (exit {proc.returncode}); "
                                      f"see {cell.run_dir / 'log.txt'}[/]")
                        _record_failure(cell, proc.returncode)
                    else:
                        s = read_summary(cell) or {}
                        console.print(f"{cell.run_dir.name}: {s.get('verdict')}, peak accuracy "
                                      f"{s.get('accuracy/peak')} at step {s.get('accuracy/peak_step')}")
    return codes


def _record_failure(cell: Cell, code: int) -> None:
    """A cell that died before writing its own summary (e.g. killed) still gets one."""
    path = cell.run_dir / "summary.json"
    if path.exists():
        return
    from suite.results import atomic_write_json, summarize

    s = summarize([], total_steps=cell.cfg.steps, error=f"process exited with code {code}")
    s.update({"run": cell.run_dir.name, "task": cell.cfg.task, "algorithm": cell.cfg.algorithm,
              "precision": cell.cfg.precision, "seed": cell.cfg.seed})
    atomic_write_json(path, s)


def default_jobs(threads: int) -> int:
    return max(1, (os.cpu_count() or 1) // max(1, threads))


def read_summary(cell: Cell) -> dict | None:
    path = cell.run_dir / "summary.json"
    return json.loads(path.read_text()) if path.exists() else None
