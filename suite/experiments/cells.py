"""The cells of a sweep: one resolved run config each, expanded from ``key=a,b`` overrides by
Hydra's override parser (the product Hydra's basic sweeper builds), with their run directories
checked before any compute: no two cells share one, and a directory holding another config is
refused.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from suite.experiments.local_launcher import read_summary, steps_done
from suite.results import run_dir_name
from suite.rl import config as cfgmod
from suite.rl.provenance import same_experiment
from suite.rl.recipe import hydra_value


@dataclass
class Cell:
    overrides: list[str]
    cfg: cfgmod.RunConfig

    @property
    def root(self) -> Path:
        return Path(self.cfg.out) / self.cfg.name

    @property
    def run_dir(self) -> Path:
        c = self.cfg
        return self.root / run_dir_name(c.task, c.algorithm, c.precision, c.seed)


def override_key(override: str) -> str:
    """The field an override sets: ``+a.b=1`` and ``~a.b`` -> ``a.b``."""
    return override.split("=", 1)[0].lstrip("+~")


def expand(overrides: list[str]) -> list[Cell]:
    """The product of the sweeps in ``overrides`` (``k=a,b``, ``k=range(0,3)``, ``k=glob(...)``), in
    Hydra's order (the first sweep varies slowest, as Hydra's basic sweeper), each cell validated.
    Hydra's public override parser reads them; each sweep's values come from its own iterator."""
    import itertools

    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.errors import HydraException

    try:
        # a key given twice: the last value, at the first one's place
        choices: dict[str, list[str]] = {}
        parsed = OverridesParser.create().parse_overrides(list(overrides))
        for o in parsed:
            key = o.get_key_element()
            if o.is_sweep_override() and not o.is_discrete_sweep():
                raise ValueError(f"{key}: an interval sweep has no list of values to run (use "
                                 "choices or range)")
            choices[key] = ([f"{key}={v}" for v in o.sweep_string_iterator()]
                            if o.is_sweep_override()
                            else [f"{key}={o.get_value_element_as_str()}"])
        jobs = [list(job) for job in itertools.product(*choices.values())]
    except HydraException as e:
        raise ValueError(f"overrides: {str(e).splitlines()[0]}") from None
    swept = {o.get_key_element() for o in parsed if o.is_sweep_override()}
    cells = []
    for job in jobs:
        try:
            cells.append(Cell(job, cfgmod.load(job)))
        except ValueError as e:
            where = " ".join(o for o in job if o.split("=", 1)[0] in swept)
            raise ValueError(f"{e}{f' (in the cell {where})' if where else ''}") from None
    return cells


def plan(base: list[str], axes: dict[str, list]) -> list[Cell]:
    """Cartesian product of ``axes`` on top of ``base``; every cell validated before any compute."""
    rest = [o for o in base if override_key(o) not in axes]
    return expand(rest + [f"{k}={','.join(hydra_value(v) for v in vs)}" for k, vs in axes.items()])


def state(cell: Cell) -> str:
    """complete | failed (an incomplete summary with an error) | partial (steps done, no verdict) |
    new."""
    s = read_summary(cell)
    if s and s.get("verdict") != "incomplete":
        return "complete"
    if s and s.get("error"):
        return "failed"
    return "partial" if steps_done(cell) else "new"


def check_run_dirs(cells: list[Cell]) -> None:
    """Refuse, before compute, two cells sharing a run directory or a directory of another
    config."""
    from suite.rl.train import _diff

    seen: dict[Path, Cell] = {}
    for cell in cells:
        other = seen.setdefault(cell.run_dir, cell)
        if other is not cell:
            a, b = (" ".join(sorted(set(c.overrides) - set(d.overrides)))
                    for c, d in ((other, cell), (cell, other)))
            raise ValueError(f"cells '{a}' and '{b}' would share the run directory {cell.run_dir}: "
                             "a swept field that is not in the run name (task, algorithm, "
                             "precision, seed) needs a name=... per value")
        path = cell.run_dir / "config.json"
        if path.exists():
            old = json.loads(path.read_text())
            new = cfgmod.to_dict(cell.cfg)
            if not same_experiment(old, new):
                raise ValueError(f"{cell.run_dir} holds a run of a different config "
                                 f"({_diff(old.get('config', {}), new)}); choose another name=..., "
                                 "or delete that directory")
