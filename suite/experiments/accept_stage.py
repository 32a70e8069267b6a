"""The bookkeeping of one stage of ``suite accept`` (suite/experiments/accept.py): ``Stage`` keeps
the stage's checks (``Check``: what was checked, pass or fail, measured, expected, seconds) and
rewrites ``<out>/<stage>/summary.json`` after every one, so a stage that the device stops at its
time limit still sends back what it measured, and a check that raises becomes a failing row while
the stage goes on; ``provenance`` says what ran where (the commit ``prepare`` recorded, torch,
CUDA, the GPU and its driver, the machine class).
"""
from __future__ import annotations

import json
import os
import platform
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
# what prepare builds for the device (git-ignored through .git/info/exclude)
GPU_DIR = ROOT / ".gpu"


@dataclass
class Check:
    check: str
    ok: bool
    measured: str
    expected: str
    seconds: float = 0.0


class Stage:
    """One stage's folder: its checks, written to summary.json after every check, so a stage stopped
    by the device's time limit still returns what it measured."""

    def __init__(self, name: str, out: Path, budget: float):
        self.name, self.dir, self.budget, self.t0 = name, out / name, budget, time.monotonic()
        self.dir.mkdir(parents=True, exist_ok=True)
        self.checks: list[Check] = []
        self.provenance = provenance()

    def left(self) -> float:
        return self.budget - (time.monotonic() - self.t0)

    def add(self, check: str, ok: bool, measured: str, expected: str,
            t0: float | None = None) -> None:
        self.checks.append(Check(check, bool(ok), measured, expected,
                                 round(time.monotonic() - t0, 1) if t0 else 0.0))
        print(f"accept {self.name}: {'pass' if ok else 'FAIL'} {check}: {measured}", flush=True)
        self.write()

    def run(self, check: str, fn, expected: str = "runs") -> None:
        """``fn()`` adds its own rows; an exception becomes a failing row and the stage goes on."""
        t0 = time.monotonic()
        try:
            fn()
        except Exception as e:  # one failing check never ends the stage
            self.add(check, False, f"{type(e).__name__}: {' '.join(str(e).split())[:300]}",
                     expected, t0)

    def write(self) -> None:
        from suite.results import atomic_write_json

        atomic_write_json(self.dir / "summary.json", {
            "stage": self.name, "ok": all(c.ok for c in self.checks),
            "wall_s": round(time.monotonic() - self.t0, 1), "budget_s": self.budget,
            **self.provenance, "checks": [asdict(c) for c in self.checks]})

    def table(self, name: str, obj) -> None:
        from suite.results import atomic_write_json

        atomic_write_json(self.dir / name, obj)


def provenance() -> dict:
    """What ran where: the commit prepare recorded (the device gets a copy of the tree, no .git),
    the command, torch, CUDA, the driver and the GPU, the machine class."""
    import torch

    from suite.numerics import machine
    from suite.results import git

    rec = GPU_DIR / "provenance.json"
    prov = (json.loads(rec.read_text()) if rec.is_file()
            else {"commit": git("rev-parse", "HEAD", cwd=ROOT)})
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    cls = machine.describe("auto", 1, device=dev)
    return {"commit": prov.get("commit"), "dirty": prov.get("dirty"), "command": " ".join(sys.argv),
            "python": platform.python_version(), "torch": torch.__version__,
            "cuda": torch.version.cuda, "gpu": cls.get("gpu"), "gpu_driver": cls.get("gpu_driver"),
            "machine_class": cls["id"], "cpu_count": os.cpu_count(), "device": dev}
