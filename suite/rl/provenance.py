"""Provenance of a run: the ``suite run`` command that reruns it, and whether that command
still composes, with today's code, to the config hash the run recorded.

Used by the report (a column and warnings) and the leaderboard (a bundle whose command does
not recompose is rejected). The command is built from config.json alone: the run's axes
(task, algorithm, precision, seed, tier), then every field that differs from what those axes
compose to today, so the command stays short and still pins every recorded value.

Config fields are added to the code over time, their defaults keeping the old behaviour. An
older run's config.json lacks them, so no command composed today gives its old hash: the hash
is compared over the run's own fields (``_restrict``), and the fields added since are
reported next to the command (``Check.added``). A field removed from the code, or a value it
no longer accepts, makes the command fail to compose: that run is not reproducible today.
"""

from __future__ import annotations

import dataclasses
import json
import shlex
from dataclasses import dataclass, field

from suite.results import LOCATION_KEYS, config_hash
from suite.rl.recipe import hydra_value

AXES = ("task", "algorithm", "precision", "seed", "tier")  # always spelled out, in this order


def flatten(d: dict, prefix: str = "") -> dict:
    """Nested dict -> {"a.b.c": value}; an empty dict stays a value."""
    out = {}
    for k, v in d.items():
        if isinstance(v, dict) and v:
            out.update(flatten(v, f"{prefix}{k}."))
        else:
            out[f"{prefix}{k}"] = v
    return out


def _same(a, b) -> bool:
    # Canonical JSON: a tuple equals a list, but 1 differs from 1.0 (as in config_hash).
    return json.dumps(a, sort_keys=True, default=str) == json.dumps(b, sort_keys=True, default=str)


def rerun_overrides(cfg: dict) -> list[str]:
    """``key=value`` overrides that make ``suite run`` compose ``cfg``: its axes, then every
    field (sorted) that differs from what the axes alone compose to today."""
    from suite.rl import config as cfgmod

    base = [f"{k}={hydra_value(cfg[k])}" for k in AXES if k in cfg]
    # a task of the user's own composes only with its folder on the task path
    if cfg.get("include_path"):
        base.append(f"include_path={hydra_value(cfg['include_path'])}")
    try:
        default = flatten(cfgmod.to_dict(cfgmod.load(base)))
    except Exception:  # noqa: BLE001 -- e.g. a task not registered today: spell out every field
        default = flatten(cfgmod.to_dict(cfgmod.RunConfig()))
    flat = flatten(cfg)
    # `out` is where the run was written, not what it computes: a rerun goes to today's default
    # (runs/).
    return base + [f"{k}={hydra_value(v)}" for k, v in sorted(flat.items())
                   if k not in (*AXES, "out", "include_path")
                   and (k not in default or not _same(v, default[k]))]


def rerun_command(cfg: dict) -> str:
    return shlex.join(["suite", "run", *rerun_overrides(cfg)])


def _restrict(new: dict, old: dict) -> dict:
    """``new`` limited to the keys ``old`` has, at every level: what a run recorded, as composed
    today."""
    return {k: _restrict(v, old[k]) if isinstance(v, dict) and isinstance(old[k], dict) else v
            for k, v in new.items() if k in old}


@dataclass(frozen=True)
class Check:
    """Does ``command`` compose, with today's code, to the recorded config hash?"""

    command: str
    # fields the code gained since the run, at today's defaults
    added: dict = field(default_factory=dict)
    problem: str | None = None  # why it does not reproduce (one line); None when it does
    composes: bool = True  # False: config.load rejected the command

    def __str__(self) -> str:
        """The answer in a word or a line: yes / yes, except fields added since / NO / cannot
        compose."""
        if self.problem:
            return (f"NO: {self.problem}" if self.composes
                    else f"cannot compose today: {self.problem}")
        return f"yes, except fields added since: {self.added_text()}" if self.added else "yes"

    def added_text(self) -> str:
        return ", ".join(f"{k}={hydra_value(v)}" for k, v in self.added.items())


def check(cfg: dict, expected_hash: str) -> Check:
    """Recompose ``rerun_command(cfg)`` with ``suite.rl.config.load`` and compare config hashes
    over the fields ``cfg`` has (see the module docstring)."""
    from suite.rl import config as cfgmod

    command = rerun_command(cfg)
    try:
        new = cfgmod.to_dict(cfgmod.load(rerun_overrides(cfg)))
    except Exception as e:  # noqa: BLE001 -- Hydra and OmegaConf raise many types; each means "not reproducible"
        return Check(command, problem=f"{type(e).__name__}: {(str(e).splitlines() or [''])[0]}",
                     composes=False)
    again = config_hash(_restrict(new, cfg))
    flat_cfg, flat_new = flatten(cfg), flatten(new)
    if again != expected_hash:
        diff = [k for k, v in flat_cfg.items() if not _same(flat_new.get(k, v), v)]
        why = (f"differs in {', '.join(diff)}" if diff
               else "the recorded config itself has another hash")
        return Check(command, problem=f"composes to {again}, not {expected_hash}; {why}")
    added = {k: v for k, v in flat_new.items() if k not in flat_cfg
             and k.split(".")[0] not in LOCATION_KEYS}
    return Check(command, added)


def same_experiment(recorded: dict, new: dict) -> bool:
    """Is ``new`` (a resolved config dict) the experiment of ``recorded`` (a run's config.json)?

    Yes when the hashes match, or when ``new`` restricted to the recorded fields hashes to the
    recorded hash and every field added to the code since holds the value that tier and task
    resolve to by default (so the old run ran with today's behaviour): a run directory written
    before a field existed is resumed or skipped, not refused as "another config".
    """
    from suite.rl import config as cfgmod

    old_cfg, old_hash = recorded.get("config") or {}, recorded.get("config_hash")
    if old_hash == config_hash(new):
        return True
    if not old_cfg or config_hash(_restrict(new, old_cfg)) != old_hash:
        return False
    flat_old, flat_new = flatten(old_cfg), flatten(new)
    added = [k for k in flat_new if k not in flat_old and k.split(".")[0] not in LOCATION_KEYS]
    try:
        # Every field's resolved default, those that to_dict leaves out at their default included: a
        # config.json may hold them (a run that recorded them), and they must compare as defaults
        # too.
        default = flatten(dataclasses.asdict(cfgmod.load([f"tier={new['tier']}",
                                                          f"task={new['task']}"])))
    except Exception:  # noqa: BLE001 -- a tier or task the code no longer has: not the same experiment
        return False
    return all(_same(flat_new[k], default.get(k)) for k in added)
