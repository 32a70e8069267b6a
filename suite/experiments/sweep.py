"""Sweeps: a named grid of cells (one RL run each), expanded and launched with Hydra.

``suite sweep grid=sanity [key=value ...] [hydra/launcher=NAME hydra.launcher.KEY=VALUE ...]``

1. **Plan.** The grid (``suite/experiments/grids.py``) becomes Hydra overrides, one sweep per axis
   (``precision=fp32,bf16,fp16``); the command line replaces any axis or field with Hydra's
   syntax (``seed=0,1,2``, ``tier=smoke``). Hydra's basic sweeper expands the product, and
   every cell is validated (``config.load``) before anything runs, together with the
   launcher's config and the run directories (two cells writing one directory, or a
   directory holding another config, are refused): bad input costs no compute.
2. **Skip.** Cells already complete are left out; partial and failed ones run again and
   resume from their last checkpoint. A second invocation runs only what is missing.
3. **Launch.** The remaining cells go to a Hydra launcher plugin (``hydra/launcher=basic``,
   sequential, the default; ``joblib``; ``submitit_local``; ``submitit_slurm``; ``ray``)
   with ``run_cell`` as the task function: one cell in the job's process, its output in
   ``<run_dir>/log.txt``. A crash is recorded by ``train.run`` (``error.txt`` and an
   ``incomplete`` summary) and returned as a status, never raised, so the other jobs go on.
   A cell of several ranks (``nproc``/``nnodes``) is started through torchrun by ``run_cell``
   on a local launcher, or runs in every task of a submitit Slurm job whose shape (tasks and
   GPUs per node, nodes) the sweep sets from the cells. ``launcher=local``
   (``suite/experiments/local_launcher.py``) instead runs each cell as its own ``suite run``
   process, as many as fit in the core capacity: a cell killed outright (OOM killer, segfault) is
   recorded too, which a joblib worker cannot promise, so it is the local-parallel choice.
4. **Report.** The outcome table of the grid, then one line per failed cell with its error.

Hydra's own files (``multirun.yaml``, each job's ``.hydra/`` and log, submitit's folders) go
to ``<out>/<name>/.hydra/<time>/``; Hydra never changes directory (``train.run`` uses the
relative ``out``).
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import sys
import time
import traceback
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path

from rich.console import Console

from suite.console import make_console
from suite.experiments.cells import Cell, check_run_dirs, expand, override_key, state
from suite.experiments.local_launcher import (
    capacity,
    check_one_node,
    cores,
    launch_local,
    read_summary,
    record_failure,
)
from suite.experiments.submitit_jobs import (
    check_job_shape,
    check_one_shape,
    job_shape,
    sbatch_script,
)
from suite.rl import config as cfgmod
from suite.rl.recipe import hydra_value

log = logging.getLogger(__name__)

CONFIG_NAME = "suite_run"  # the RunConfig node in Hydra's ConfigStore (as in suite/rl/compose.py)
# ours; everything else is Hydra's or RunConfig's
SWEEP_OPTIONS = ("grid", "launcher", "jobs", "dry_run")
# run on this machine: shared data is built first
LOCAL_LAUNCHERS = ("basic", "joblib", "submitit_local")
USAGE = """usage: suite sweep grid=NAME [key=value ...] \
[hydra/launcher=NAME hydra.launcher.KEY=VALUE ...]
                   [launcher=local jobs=N] [dry_run=true]

Any config field can be set or swept with Hydra syntax (seed=0,1,2 precision=bf16,fp16 tier=smoke);
a value given for an axis replaces the grid's. launcher=local packs cells into jobs x threads cores
(default: every core), a cell taking nproc x threads. See docs/sweeps.md.

grids:
"""


def _register_config() -> None:
    from hydra.core.config_store import ConfigStore
    from omegaconf import OmegaConf

    ConfigStore.instance().store(name=CONFIG_NAME, node=cfgmod.RunConfig)
    # Job directories are named like run directories; an unset task is the tier's (config.TIERS).
    OmegaConf.register_new_resolver(
        "suite_task", lambda task, tier: cfgmod.TIERS[tier]["task"] if task is None else task,
        replace=True)


# at import: a Hydra job process (joblib, submitit) unpickles run_cell, imports this
_register_config()


# ---- the grid and the command line -------------------------------------------------------------
@dataclass
class Sweep:
    grid: dict
    cells: list[Cell]
    hydra_overrides: list[str]
    options: dict = field(default_factory=dict)

    @property
    def ranks(self) -> tuple[int, int]:
        """(nproc, nnodes) of the cells: the widest (one value for a submitit sweep,
        check_one_shape)."""
        return max(((c.cfg.nproc, c.cfg.nnodes) for c in self.cells), key=lambda r: r[0] * r[1])

    @property
    def launcher(self) -> str:
        if self.options.get("launcher"):
            return self.options["launcher"]
        chosen = [o.split("=", 1)[1] for o in self.hydra_overrides
                  if override_key(o) == "hydra/launcher"]
        return chosen[-1] if chosen else "basic"


def plan_grid(args: list[str]) -> Sweep:
    """``grid=NAME`` plus command-line overrides -> validated cells (nothing runs, nothing is
    written)."""
    from suite.experiments import grids
    from suite.rl import recipe

    options, fields, hydra_ovs = {}, [], []
    for a in recipe.expand(args):  # a recipe file's fields first, the command line after them
        if a in ("-m", "--multirun"):  # a sweep is always a multirun
            continue
        if "=" not in a:
            raise ValueError(f"'{a}': expected key=value (grid=NAME, a config field, or "
                             "hydra/...).")
        k = override_key(a)
        if k in SWEEP_OPTIONS:
            options[k] = a.split("=", 1)[1]
        elif k == "hydra" or k.startswith(("hydra.", "hydra/")):
            hydra_ovs.append(a)
        else:
            fields.append(a)
    if "grid" not in options:
        raise ValueError(f"grid: required (grid=NAME). Grids: {', '.join(grids.GRIDS)}.")
    if options.get("launcher") not in (None, "local"):
        raise ValueError(f"launcher: unknown value '{options['launcher']}'. Allowed: local (our "
                         f"subprocess launcher); for Hydra's launchers use hydra/launcher=NAME.")
    if options.get("launcher") == "local" and any(
            override_key(o).startswith(("hydra/launcher", "hydra.launcher")) for o in hydra_ovs):
        raise ValueError("launcher=local runs its own processes: drop hydra/launcher=... and "
                         "hydra.launcher.*, or drop launcher=local")
    if not re.fullmatch(r"[1-9]\d*", options.get("jobs", "1")):
        raise ValueError(f"jobs: must be a whole number >= 1, got '{options['jobs']}'.")
    grid = grids.get(options["grid"])

    cells = [c for row in grid["rows"] for c in expand(_row_overrides(grid, row, fields))]
    check_run_dirs(cells)
    sweep = Sweep(grid, cells, hydra_ovs, options)
    if sweep.launcher == "local" or sweep.launcher in LOCAL_LAUNCHERS:
        check_one_node(cells, sweep.launcher)  # a local launcher starts ranks on this machine only
    check_one_shape(cells, sweep.launcher)
    if sweep.launcher != "local":
        # an unknown launcher or launcher field is refused here, before compute
        hcfg = hydra_config(sweep)
        check_job_shape(sweep.launcher, sweep.ranks, hcfg.hydra.launcher)
    return sweep


def _row_overrides(grid: dict, row: list[str], fields: list[str]) -> list[str]:
    """One row of the grid (most grids have one, empty) as overrides: its settings, the grid's, the
    axes as sweeps in place; the command line replaces any of them, and any field (the user's word
    is final)."""
    given = {override_key(o): o for o in fields}
    overrides = [o for o in [*grid["overrides"], *row] if override_key(o) not in given]
    if "name" not in given and not any(override_key(o) == "name" for o in overrides):
        overrides.append(f"name={grid['name']}")
    for k, values in grid["axes"].items():
        overrides.append(given.pop(k) if k in given
                         else f"{k}={','.join(hydra_value(v) for v in values)}")
    return overrides + [o for o in fields if override_key(o) in given]


def hydra_config(sweep: Sweep, sweep_dir: Path | None = None):
    """Hydra's multirun config (hydra node included) for this sweep's launcher; ValueError if it
    does not compose."""
    from hydra import initialize

    with initialize(version_base=None, config_path=None, job_name=_job_name(sweep)):
        return _compose(sweep, sweep_dir)


def _compose(sweep: Sweep, sweep_dir: Path | None):
    """Compose through Hydra's public Compose API, in multirun mode as ``--multirun`` sets it
    (inside ``initialize``)."""
    from hydra import compose
    from hydra.errors import HydraException

    try:
        return compose(CONFIG_NAME, _hydra_overrides(sweep, sweep_dir), return_hydra_config=True)
    except HydraException as e:
        raise ValueError(f"hydra: {e}") from None


def _hydra_overrides(sweep: Sweep, sweep_dir: Path | None) -> list[str]:
    """Hydra's outputs under <out>/<name>/.hydra/<time>/<cell>/, no chdir; the user's settings
    win."""
    plan = sweep_dir or sweep.cells[0].root / ".hydra" / "plan"
    subdir = "'${suite_task:${task},${tier}}__${algorithm}__${precision}__s${seed}'"
    ours = {"hydra.sweep.dir": hydra_value(str(plan)), "hydra.sweep.subdir": subdir,
            "hydra.job.chdir": "false", "hydra.mode": "MULTIRUN",
            **job_shape(sweep.launcher, sweep.ranks, sweep.hydra_overrides)}
    given = {override_key(o) for o in sweep.hydra_overrides}
    return [f"{k}={v}" for k, v in ours.items() if k not in given] + sweep.hydra_overrides


def _job_name(sweep: Sweep) -> str:
    """Hydra's job name: the Slurm job name and each job's log file (``<job name>.log``)."""
    return f"suite_{sweep.grid['name']}"


def _new_sweep_dir(root: Path) -> Path:
    stamp = datetime.now().strftime("%Y-%m-%d_%H-%M-%S")
    path, n = root / ".hydra" / stamp, 1
    while path.exists():
        n += 1
        path = root / ".hydra" / f"{stamp}_{n}"
    return path


# ---- the Hydra path: a launcher plugin runs run_cell once per cell -----------------------------
def run_cell(job_cfg) -> dict:
    """Hydra task function: run one cell. A failure is recorded and returned, not raised.

    One rank: in this process. Several ranks in a plain process (basic, joblib, submitit_local):
    torchrun starts them (``dist.launch``), their output in the cell's log. Several ranks inside a
    launcher's world (a submitit Slurm job of ``tasks_per_node`` tasks): every task runs the cell in
    its own process and rank 0 writes; the other ranks log to their task's own output."""
    from hydra.core.hydra_config import HydraConfig
    from omegaconf import OmegaConf

    from suite import dist
    from suite.rl import layers
    from suite.rl.train import run

    overrides = list(HydraConfig.get().overrides.task)  # the grid's, a recipe's, the command line's
    cfg, origins = cfgmod.resolve_layers(OmegaConf.to_object(job_cfg), layers.given(overrides))
    cell = Cell(overrides, cfgmod.validate(cfg))
    world = dist.from_env()
    if world is not None and world["rank"] != 0:
        return _run_other_rank(cell, world)
    cell.run_dir.mkdir(parents=True, exist_ok=True)
    log.info(f"{cell.run_dir.name}: started; log in {cell.run_dir / 'log.txt'}")
    error = None
    with (cell.run_dir / "log.txt").open("a") as f:
        console = make_console(f)
        where = f"{world['size']} ranks from {world['launcher']}" if world else f"pid {os.getpid()}"
        console.print(f"sweep: cell started at {time.time():.3f} ({where}, hydra job "
                      f"{HydraConfig.get().job.num}, {HydraConfig.get().runtime.output_dir})")
        if world is None and cfg.nproc * cfg.nnodes > 1:
            code = _launch_ranks(cell, f)
            if code != 0:  # a rank that raised has written the summary; a killed one has not
                record_failure(cell, code)
                error = (read_summary(cell)
                         or {}).get("error") or f"process exited with code {code}"
        else:
            try:
                run(cfg, console, origins=origins)
            except Exception as e:  # train.run has written error.txt and an incomplete summary
                error = f"{type(e).__name__}: {e}"
                console.print(traceback.format_exc())
        console.print(f"sweep: cell finished at {time.time():.3f}"
                      + (f" with {error}" if error else ""))
    s = read_summary(cell) or {}
    result = {"run": str(cell.run_dir), "verdict": s.get("verdict"), "error": error}
    (log.error if error else log.info)(f"{cell.run_dir.name}: {error or s.get('verdict')}")
    return result


def _launch_ranks(cell: Cell, logf) -> int:
    """``suite run <overrides>`` as the cell's ranks through torchrun; its output goes to the cell's
    log.

    ``dist.launch`` lets the child inherit this process's stdout and stderr, so both descriptors
    point at ``log.txt`` for the call (not the sweep's terminal) and are put back after it."""
    from suite import dist

    logf.flush()
    sys.stdout.flush()
    sys.stderr.flush()
    saved = os.dup(1), os.dup(2)
    unbuffered = os.environ.get("PYTHONUNBUFFERED")
    os.environ["PYTHONUNBUFFERED"] = "1"  # a killed rank's last lines still reach the log
    try:
        os.dup2(logf.fileno(), 1)
        os.dup2(logf.fileno(), 2)
        return dist.launch(["run", *cell.overrides], cell.cfg.nproc, cell.cfg.nnodes)
    except Exception as e:  # e.g. torchrun missing: a failed cell, not a stopped sweep
        print(traceback.format_exc(), file=logf, flush=True)
        log.error(f"{cell.run_dir.name}: could not start its ranks: {type(e).__name__}: {e}")
        return 1
    finally:
        os.dup2(saved[0], 1)
        os.dup2(saved[1], 2)
        os.close(saved[0])
        os.close(saved[1])
        if unbuffered is None:
            os.environ.pop("PYTHONUNBUFFERED")
        else:
            os.environ["PYTHONUNBUFFERED"] = unbuffered


def _run_other_rank(cell: Cell, world: dict) -> dict:
    """A rank other than 0 inside a launcher's world: compute, write nothing; output to this task's
    log."""
    from suite.rl.train import run

    error = None
    try:
        run(cell.cfg, make_console())
    except Exception as e:
        error = f"{type(e).__name__}: {e}"
        traceback.print_exc()
    return {"run": str(cell.run_dir), "rank": world["rank"], "verdict": None, "error": error}


class HydraCallbacks:
    """The user's ``hydra.callbacks`` (``hydra.experimental.callback.Callback`` subclasses), built
    with ``hydra.utils.instantiate`` and called as Hydra calls them: in order, and in reverse order
    for the ``*_end`` events. A launcher calls ``on_job_start``/``on_job_end`` around each cell, in
    its own process for joblib, submitit and Ray (so this object is pickled with the launcher's
    context)."""

    def __init__(self, cfg) -> None:
        from hydra.utils import instantiate

        self.callbacks = [instantiate(c) for c in (cfg.hydra.callbacks or {}).values()]

    def __getattr__(self, event: str):
        if not event.startswith("on_") or "callbacks" not in self.__dict__:
            raise AttributeError(event)
        order = reversed(self.callbacks) if event.endswith("_end") else self.callbacks
        return lambda **kw: [getattr(cb, event)(**kw) for cb in list(order)]


@contextlib.contextmanager
def _restore_logging():
    """Give the root logger back its handlers and level: a sweep started from Python (a notebook, a
    test) leaves logging as it found it, with no handler bound to a stream that has since closed."""
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    try:
        yield
    finally:
        root.handlers[:] = handlers
        root.setLevel(level)


def launch_hydra(sweep: Sweep, cells: list[Cell], sweep_dir: Path) -> list:
    """Hand ``cells`` to the configured Hydra launcher plugin; return its JobReturns.

    This is ``Hydra.multirun`` with the sweeper's expansion done (and filtered) beforehand:
    compose the multirun config, instantiate the launcher, launch one job per cell, with the user's
    ``hydra.callbacks`` around them. Public API only: Hydra's Compose API, its plugin registry (the
    one launcher plugins use), ``hydra.core.utils.configure_log``."""
    from hydra import initialize
    from hydra.core.global_hydra import GlobalHydra
    from hydra.core.plugins import Plugins
    from hydra.core.utils import configure_log
    from hydra.types import HydraContext
    from omegaconf import OmegaConf

    # Hydra configures logging for the sweep and for each in-process job; _restore_logging undoes
    # it.
    with initialize(version_base=None, config_path=None,
                    job_name=_job_name(sweep)), _restore_logging():
        cfg = _compose(sweep, sweep_dir)
        configure_log(cfg.hydra.hydra_logging, cfg.hydra.verbose)
        callbacks = HydraCallbacks(cfg)
        callbacks.on_multirun_start(config=cfg, config_name=CONFIG_NAME)
        launcher = Plugins.instance().instantiate_launcher(
            config=cfg,
            hydra_context=HydraContext(config_loader=GlobalHydra.instance().config_loader(),
                                       callbacks=callbacks),
            task_function=run_cell)
        out = Path(str(cfg.hydra.sweep.dir))
        out.mkdir(parents=True, exist_ok=True)
        OmegaConf.save(cfg, out / "multirun.yaml")
        log.info(f"hydra outputs in {out}")
        returns = launcher.launch([c.overrides for c in cells], initial_job_idx=0)
        callbacks.on_multirun_end(config=cfg, config_name=CONFIG_NAME)
    return list(returns)


# ---- main --------------------------------------------------------------------------------------
def prebuild(cells: list[Cell], console: Console) -> None:
    """Build each distinct policy and perfectible set once, before cells start side by side.

    A failure here is only reported: the cells that need that data fail on it and record it."""
    from suite.rl.data import prepare_data

    for cell in cells:
        try:
            prepare_data(cell.cfg, console)
        except Exception as e:
            console.print(f"[yellow]could not prepare the data of {cell.run_dir.name}: "
                          f"{type(e).__name__}: {e}[/]")


def report_sweep(cells: list[Cell], console: Console, tables: bool = True) -> list[Cell]:
    """The outcome table of each result root (``tables``), then one line per cell that is not
    complete; returns those."""
    from suite.analysis import outcomes

    for root in dict.fromkeys(c.root for c in cells) if tables else ():
        console.print(outcomes.outcome_table(root))
    failed = [c for c in cells if state(c) != "complete"]
    for c in failed:
        s = read_summary(c) or {}
        why = s.get("error") or "no result (the job did not run, or was killed before writing one)"
        err = c.run_dir / "error.txt"
        console.print(f"[red]FAILED[/] {c.run_dir}: {why}"
                      + (f" (traceback: {err})" if err.exists() else ""),
                      soft_wrap=True)
    return failed


def main(args: list[str]) -> int:
    """``suite sweep``: plan and validate the grid, run what is missing, print the table.

    Returns 0 when every cell is complete, 1 when some failed; raises ValueError on bad input."""
    from suite.experiments import grids

    console = make_console()
    if not args or args[0] in ("-h", "--help", "help"):
        console.print(USAGE + grids.describe(), markup=False, highlight=False)
        return 0
    t0 = time.time()
    sweep = plan_grid(args)
    cells = sweep.cells
    states = {c.run_dir: state(c) for c in cells}
    todo = [c for c in cells if states[c.run_dir] != "complete"]
    counts = ", ".join(f"{sum(s == k for s in states.values())} {k}"
                       for k in ("complete", "partial", "failed", "new"))
    console.print(f"sweep {sweep.grid['name']}: {len(cells)} cells ({counts}); {len(todo)} to run "
                  f"with launcher {sweep.launcher}; results in {cells[0].root}")

    if sweep.options.get("dry_run", "false").lower() in ("1", "true", "yes"):
        for c in cells:
            console.print(f"  {states[c.run_dir]:<8} {c.run_dir}  {' '.join(c.overrides)}",
                          markup=False, highlight=False, soft_wrap=True)
        if sweep.launcher == "local":
            jobs = int(sweep.options["jobs"]) if sweep.options.get("jobs") else None
            console.print(f"local launcher: capacity {capacity(todo or cells, jobs)} cores "
                          f"({f'jobs={jobs} x threads' if jobs else 'every core'}); a cell takes "
                          f"nproc x threads = {', '.join(sorted({str(cores(c)) for c in cells}))} "
                          "cores; a wider cell runs alone",
                          highlight=False)
        else:
            from omegaconf import OmegaConf

            hcfg = hydra_config(sweep, _new_sweep_dir(cells[0].root))
            launcher = OmegaConf.to_container(hcfg.hydra.launcher, resolve=True)
            console.print(f"hydra launcher config:\n{OmegaConf.to_yaml(launcher)}", markup=False,
                          highlight=False, soft_wrap=True)
            if str(launcher.get("_target_", "")).endswith("SlurmLauncher"):
                console.print("sbatch script (dry run, not "
                              f"submitted):\n{sbatch_script(launcher, len(todo) or 1)}",
                              markup=False, highlight=False, soft_wrap=True)
        return 0

    if todo:
        from suite.numerics import determinism

        # Before any cell's CUDA work: cuBLAS takes its workspace setting once per process
        # (determinism.py); the launcher's processes inherit this environment.
        determinism.reserve(any(c.cfg.deterministic for c in todo))
        if sweep.launcher == "local":  # the data build overlaps the fork server's imports
            launch_local(todo, int(sweep.options["jobs"]) if sweep.options.get("jobs") else None,
                         console, prepare=lambda: prebuild(todo, console))
        else:
            if sweep.launcher in LOCAL_LAUNCHERS:
                prebuild(todo, console)
            try:
                launch_hydra(sweep, todo, _new_sweep_dir(cells[0].root))
            # e.g. a Slurm job killed, a joblib worker lost: report what finished
            except Exception as e:
                console.print(f"[red]the launcher stopped: {type(e).__name__}: {e}[/]")
    failed = report_sweep(cells, console)
    console.print(f"{len(cells) - len(failed)}/{len(cells)} cells complete; wall time "
                  f"{time.time() - t0:.0f} s")
    return 1 if failed else 0


if __name__ == "__main__":
    try:
        sys.exit(main(sys.argv[1:]))
    except ValueError as e:
        print(f"suite sweep: error: {e}", file=sys.stderr)
        sys.exit(2)
