"""``suite sweep ... launcher=local``: each cell is its own ``suite run`` process, packed by cores.

A cell occupies ``nproc x threads`` cores (its ranks, each with ``threads`` torch threads;
``suite run nproc=N`` starts torchrun itself). Cells start while the cores in use stay within
the **capacity**:

- ``jobs=N`` given: ``N x threads`` cores, ``threads`` being the largest of the cells (one value
  in nearly every sweep). So ``jobs`` keeps its old meaning for single-rank cells (N of them at a
  time), and a cell of ``nproc=2`` takes two of the N slots;
- no ``jobs``: ``os.cpu_count()`` cores.

On a machine with CUDA GPUs the unit is the GPU, not the core: a cell takes ``nproc`` GPUs of its
own, handed to it as ``CUDA_VISIBLE_DEVICES`` (every rank of a cell otherwise lands on ``cuda:0``
beside the other cells' models), cells start while enough GPUs are free (and, with ``jobs=N``, at
most N at a time), and a cell needing more GPUs than the machine has is refused before compute.

A cell needing more than the (core) capacity runs alone (it is not refused: a slower run beats
none). The queue is widest first, then longest (exact and unified FP8 cost ~2x a step), so wide
cells start on an empty machine; when the head of the queue does not fit, the first smaller cell
that fits starts (first fit). Multi-node cells cannot run here and are refused before any compute.

A cell killed outright (OOM killer, segfault) still gets an ``incomplete`` summary and the others
go on. A sweep killed outright (SIGKILL included) ends its cells and their ranks
(``suite.lifetime``). Each cell's ``log.txt`` records when the sweep started and reaped it (``sweep:
cell started at <unix time>`` / ``finished at``), the same lines ``sweep.run_cell`` writes.

On Linux, CPU cells of one rank are forked from a fork server that has imported torch,
transformers and the suite once (``suite.experiments.forkserver``: ~5 s of CPU saved per cell);
``SUITE_FORKSERVER=0`` starts every cell as its own process.

Cells are duck-typed (``.cfg``, ``.overrides``, ``.run_dir``): ``suite.experiments.sweep`` imports
this module, never the other way round.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TextColumn,
    TimeElapsedColumn,
)

from suite import lifetime
from suite.experiments import forkserver


# ---- the cell's files ----------------------------------------------------------------------------
def read_summary(cell) -> dict | None:
    path = cell.run_dir / "summary.json"
    return json.loads(path.read_text()) if path.exists() else None


def steps_done(cell) -> int:
    path = cell.run_dir / "metrics.jsonl"
    return sum(1 for _ in path.open()) if path.exists() else 0


def record_failure(cell, code: int) -> None:
    """A cell that died before writing its own summary (e.g. killed) still gets one."""
    path = cell.run_dir / "summary.json"
    if path.exists():
        return
    from suite.results import atomic_write_json, summarize

    s = summarize([], total_steps=cell.cfg.steps, error=f"process exited with code {code}")
    s.update({"run": cell.run_dir.name, "task": cell.cfg.task, "algorithm": cell.cfg.algorithm,
              "precision": cell.cfg.precision, "seed": cell.cfg.seed})
    atomic_write_json(path, s)


# ---- cores ---------------------------------------------------------------------------------------
def cores(cell) -> int:
    """Cores a cell occupies: its ranks on this node times each rank's torch threads."""
    return cell.cfg.nproc * cell.cfg.threads


def capacity(cells, jobs: int | None) -> int:
    """Cores the sweep may fill: ``jobs x threads`` (largest threads of the cells), else every
    core."""
    if jobs is None:
        return os.cpu_count() or 1
    return jobs * max((c.cfg.threads for c in cells), default=1)


# ---- GPUs ----------------------------------------------------------------------------------------
def visible_gpus() -> list[str]:
    """The GPUs this process may hand out: CUDA_VISIBLE_DEVICES's entries when it is set (indices or
    UUIDs, as the user restricted them), else every device torch sees; [] on a machine without
    CUDA."""
    env = os.environ.get("CUDA_VISIBLE_DEVICES")
    if env is not None:
        ids = [x.strip() for x in env.split(",") if x.strip()]
        return [] if ids[:1] == ["-1"] else ids
    import torch

    return [str(i) for i in range(torch.cuda.device_count())] if torch.cuda.is_available() else []


def check_gpus(cells, gpus: list[str]) -> None:
    """Refuse, before compute, a cell with more ranks than the machine has GPUs (each rank owns
    one)."""
    for c in cells:
        if c.cfg.nproc > len(gpus):
            raise ValueError(f"nproc: the cell {c.run_dir.name} has nproc={c.cfg.nproc}, but this "
                             f"machine has {len(gpus)} GPU(s) ({','.join(gpus)}); one rank per GPU")


def next_gpu_fit(pending: list, free: list[str], running: int, jobs: int | None) -> int | None:
    """Index of the first queued cell whose ranks fit on the free GPUs (and within ``jobs`` cells at
    a time)."""
    if jobs is not None and running >= jobs:
        return None
    return next((i for i, cell in enumerate(pending) if cell.cfg.nproc <= len(free)), None)


def check_one_node(cells, launcher: str) -> None:
    """Refuse, before compute, a cell spanning several nodes: a local launcher starts ranks on this
    machine only."""
    for c in cells:
        if c.cfg.nnodes > 1:
            raise ValueError(f"nnodes: the cell {c.run_dir.name} has nnodes={c.cfg.nnodes}, but "
                             f"launcher {launcher} runs cells on this machine only; use "
                             "hydra/launcher=submitit_slurm (docs/sweeps.md)")


def next_fit(pending: list, in_use: int, cap: int) -> int | None:
    """Index of the first queued cell that fits beside the running ones; an idle machine takes any
    cell."""
    for i, cell in enumerate(pending):
        if in_use == 0 or in_use + cores(cell) <= cap:
            return i
    return None


def relative_cost(cell) -> float:
    """Rough cost of a cell for scheduling (the longest first shortens the queue's tail): steps x
    samples, doubled where the trainer runs heavier kernels (exact replay, a quantised forward),
    x1.5 where only the sampler does (FP8 or 4-bit rollouts), x1.2 more with stale rollouts (a
    second trainer scores every batch at the sampling weights: the main job's stale-k4 cells took
    60-73 s against 52-53 s for their fp32 reference on cpu-avx2-emulated), as the committed step
    times order them (results/README.md)."""
    from suite.numerics.precision import resolve

    flow = resolve(cell.cfg.precision)
    # unified bf16/fp16: 1
    factor = 2.0 if flow.exact or flow.trainer_quant else 1.5 if flow.sampler_quant else 1.0
    factor *= 1.2 if cell.cfg.staleness else 1.0
    return cell.cfg.steps * cell.cfg.prompts_per_step * cell.cfg.samples_per_prompt * factor


# ---- the launcher --------------------------------------------------------------------------------
def launch_local(cells: list, jobs: int | None, console: Console,
                 gpus: list[str] | None = None, prepare=None) -> dict[str, int]:
    """Run cells as ``suite run`` subprocesses within the core capacity, or on GPUs of their own
    where the machine has CUDA GPUs (``gpus``: default ``visible_gpus()``); return each run dir's
    exit code. ``prepare()`` (the cells' policy and data build) runs after the checks, while the
    fork server imports."""
    check_one_node(cells, "local")
    gpus = visible_gpus() if gpus is None else gpus
    if gpus:
        check_gpus(cells, gpus)
    cap = capacity(cells, jobs)
    pending = sorted(cells, key=lambda c: (cores(c), relative_cost(c)), reverse=True)
    # the user's hub settings pass through to every cell
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    if gpus:
        console.print(f"local launcher: {len(cells)} cell(s) queued; {len(gpus)} GPU(s) "
                      f"({','.join(gpus)}), a cell takes nproc GPUs of its "
                      f"own{f', at most {jobs} cells at a time' if jobs else ''}")
    else:
        why = f"jobs={jobs} x threads" if jobs else "every core of this machine"
        console.print(f"local launcher: {len(cells)} cell(s) queued; capacity {cap} cores ({why}); "
                      "a cell takes nproc x threads cores")
    # before the progress bar's thread; the server is a fresh process all the same
    server = None
    if any(forkserver.eligible(c, gpus) for c in cells):
        server = forkserver.start(env, lambda m: console.print(m, highlight=False), prepare)
    elif prepare is not None:
        prepare()
    try:
        return _run(cells, pending, cap, jobs, gpus, env, server, console)
    finally:
        if server is not None:
            server.close()


def _run(cells, pending, cap, jobs, gpus, env, server, console) -> dict[str, int]:
    running, codes, owned = {}, {}, {}  # owned: process -> the GPUs it holds
    with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                  TimeElapsedColumn(), console=console) as progress:
        bars = {str(c.run_dir): progress.add_task(f"{c.run_dir.name} queued", total=c.cfg.steps,
                                                  completed=steps_done(c)) for c in cells}
        while pending or running:
            in_use = sum(cores(c) for c in running.values())
            free = [g for g in gpus if not any(g in held for held in owned.values())]
            while (i := (next_gpu_fit(pending, free, len(running), jobs) if gpus
                         else next_fit(pending, in_use, cap))) is not None:
                cell = pending.pop(i)
                if gpus:
                    mine, free = free[:cell.cfg.nproc], free[cell.cfg.nproc:]
                    proc = _start(cell, {**env, "CUDA_VISIBLE_DEVICES": ",".join(mine)})
                    owned[proc] = mine
                    where = f"GPU(s) {','.join(mine)}; {len(free)} free"
                else:
                    in_use += cores(cell)
                    proc = _start(cell, env, server if server and server.alive
                                  and forkserver.eligible(cell, gpus) else None)
                    alone = ", more than the capacity: it runs alone" if cores(cell) > cap else ""
                    where = (f"{cell.cfg.threads} thread(s) = {cores(cell)} cores{alone}; "
                             f"{in_use}/{cap} cores in use")
                running[proc] = cell
                console.print(f"running {cell.run_dir.name} ({cell.cfg.nproc} rank(s), {where}, "
                              f"{len(pending)} queued)", highlight=False)
                progress.update(bars[str(cell.run_dir)], description=f"{cell.run_dir.name} running")
            # a finished cell's cores idle until the next poll (1 s polls: ~8 s of the main job)
            time.sleep(0.2)
            for proc, cell in list(running.items()):
                progress.update(bars[str(cell.run_dir)], completed=steps_done(cell))
                if proc.poll() is None:
                    continue
                del running[proc]
                owned.pop(proc, None)
                codes[str(cell.run_dir)] = proc.returncode
                _finish(cell, proc, console)
                progress.update(bars[str(cell.run_dir)],
                                description=f"{cell.run_dir.name} "
                                            f"{'done' if proc.returncode == 0 else 'failed'}")
    return codes


def _start(cell, env: dict, server=None):
    """The cell's process: a ``Popen``, or a ``forkserver.Forked`` (the same poll, returncode,
    kill) when ``server`` is given."""
    cell.run_dir.mkdir(parents=True, exist_ok=True)
    with (cell.run_dir / "log.txt").open("a") as logf:  # the child keeps its own descriptor
        gpus = (f", CUDA_VISIBLE_DEVICES={env['CUDA_VISIBLE_DEVICES']}"
                if "CUDA_VISIBLE_DEVICES" in env else "")
        how = ", fork server" if server else ""
        logf.write(f"sweep: cell started at {time.time():.3f} ({cell.cfg.nproc} rank(s) x "
                   f"{cell.cfg.threads} thread(s), launcher local{gpus}{how})\n")
        logf.flush()
        if server:
            # its parent is the server, which dies with this process (suite/experiments/forkserver)
            try:
                return server.spawn(["run", *cell.overrides], lifetime.tied_env(
                    env, signal.SIGTERM, parent=server.pid), logf.name)
            except (OSError, RuntimeError) as e:  # the server has gone: this cell starts as before
                logf.write(f"sweep: the fork server could not start the cell ({e}); a subprocess "
                           "does\n")
                logf.flush()
        # tied: a killed sweep ends its cells, and they their ranks (suite/lifetime.py)
        return subprocess.Popen([sys.executable, "-m", "suite.cli", "run", *cell.overrides],
                                stdout=logf, stderr=subprocess.STDOUT,
                                env=lifetime.tied_env(env, signal.SIGTERM))


def _finish(cell, proc, console: Console) -> None:
    code = proc.returncode
    with (cell.run_dir / "log.txt").open("a") as logf:
        logf.write(f"sweep: cell finished at {time.time():.3f} (exit code {code})\n")
    if code != 0:
        console.print(f"[red]{cell.run_dir.name} failed (exit {code}); see "
                      f"{cell.run_dir / 'log.txt'}[/]")
        record_failure(cell, code)
    else:
        s = read_summary(cell) or {}
        console.print(f"{cell.run_dir.name}: {s.get('verdict')}, peak accuracy "
                      f"{s.get('accuracy/peak')} at step {s.get('accuracy/peak_step')}")
