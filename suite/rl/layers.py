"""The layers a run's config is composed of, and where each resolved value came from.

Lowest first; a higher layer wins every field it sets:

    schema default   RunConfig's defaults (suite/rl/schema.py)
    tier             TIERS[tier]: the one scale dial, task and sizes
    model preset     PRESETS[model].recipe (suite/rl/models.py)
    task file        the task file's ``tiers.<tier>`` values
    regime           REGIMES[regime]["set"] (suite/rl/schema.py)
    recipe           ``recipe=FILE`` (suite/rl/recipe.py)
    command line     ``key=value``

A field the user set (on the command line or in a recipe) is *set*, whatever its value: no
lower layer overrides it, even when the value equals the schema default
(``gradient_checkpointing=false`` beside a preset that turns it on, ``optim.eps=1e-8`` beside a
regime of 1e-15). One exception keeps a documented meaning: ``null`` on a field whose ``None``
the schema documents as "the tier's value" (``FILLED``: steps, optim.lr, policy.*, task, model,
...) asks for that value, so it counts as not set.

Why the task file sits above the model preset: a task file's tier may name its model
(sanity_r1d's full tier names r1d-1.5b) with the values published for that model on that task;
a preset holds the model's values for any task. The more specific layer wins, as docs/tasks.md
has promised ("a preset fills what the task's tier and the command line leave unset"): an own
task file that names a preset and its own learning rate keeps it. The task files shipped with
the suite set no field to a value other than the preset's, so the other order would resolve them
the same; a user's task file could not rely on that.

Why not Hydra's defaults list: it selects config groups by name before composing, but here the lower
layers are only known from resolved values: the tier names the task, the regime may replace it, the
task file's tier may name the model, the model names the preset. So the layers are applied highest
first, each filling only what no higher layer set, and ``origins`` records who set each field.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from suite.rl.schema import TIERS, RunConfig

ORDER = ("schema default", "tier", "model preset", "task file", "regime", "recipe", "command line")
SCHEMA_DEFAULT = "schema default"
COMMAND_LINE = "command line"


def tier_values(tier: str) -> dict[str, Any]:
    """TIERS[tier] with its policy sizes as dotted fields (policy.hidden, ...)."""
    out: dict[str, Any] = {}
    for k, v in TIERS[tier].items():
        out.update({f"policy.{p}": x for p, x in v.items()} if k == "policy" else {k: v})
    return out


# Fields whose None the schema's docstrings define as "filled by a layer": null there is no value.
FILLED = frozenset({k for t in TIERS for k in tier_values(t)}
                   | {"task", "model", "sampling.max_new_tokens"})


def fields() -> list[str]:
    """Every leaf field of RunConfig, dotted."""
    from suite.rl.cmdline import fields as leaves

    return list(leaves())


def given(overrides: list[str], origin: str = COMMAND_LINE) -> dict[str, str]:
    """Dotted field -> ``origin`` for each field ``overrides`` set (``optim={lr:1e-5}`` sets lr)."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    known, out = set(fields()), {}

    def add(key: str, value: Any) -> None:
        if isinstance(value, dict) and key not in known:
            for k, v in value.items():
                add(f"{key}.{k}", v)
        elif key in known and not (value is None and key in FILLED):
            out[key] = origin

    for o in OverridesParser.create().parse_overrides(list(overrides)):
        if not o.is_delete():
            add(o.key_or_group, o.value())
    return out


def given_by_value(cfg: RunConfig) -> dict[str, str]:
    """For a caller that holds a composed config and not its overrides: every field whose value
    differs from the schema default counts as set on the command line (a value equal to the default
    cannot be told from one left alone, so the layers may fill it)."""
    default = _flat(RunConfig())
    return {k: COMMAND_LINE for k, v in _flat(cfg).items() if _norm(v) != _norm(default[k])}


def _norm(value: Any) -> Any:
    return list(value) if isinstance(value, tuple) else value


def _flat(cfg: Any, prefix: str = "") -> dict[str, Any]:
    out = {}
    for f in dataclasses.fields(cfg):
        value = getattr(cfg, f.name)
        out.update(_flat(value, f"{prefix}{f.name}.") if dataclasses.is_dataclass(value)
                   else {f"{prefix}{f.name}": value})
    return out


def apply(cfg: RunConfig, values: dict[str, Any], origin: str, origins: dict[str, str]) -> None:
    """Set each dotted field of ``values`` that no higher layer has set (``origins``), recording
    ``origin``. Layers are applied highest first, so a field in ``origins`` belongs to a layer that
    wins over this one."""
    for key, value in values.items():
        *path, leaf = key.split(".")
        obj, default = cfg, RunConfig()
        for part in path:
            if not hasattr(obj, part):
                raise ValueError(f"{origin}: {key} is not a config field")
            obj, default = getattr(obj, part), getattr(default, part)
        if not hasattr(obj, leaf) or dataclasses.is_dataclass(getattr(obj, leaf)):
            raise ValueError(f"{origin}: {key} is not a config field")
        if key not in origins:
            setattr(obj, leaf, tuple(value) if isinstance(getattr(default, leaf), tuple) else value)
            origins[key] = origin


def complete(cfg: RunConfig, origins: dict[str, str]) -> dict[str, str]:
    """``origins`` with every field no layer set marked as the schema default, checked: it names
    every field and nothing else, and a field it calls the schema default holds the default value
    (a value set without being recorded would be reported from the wrong layer)."""
    flat, default = _flat(cfg), _flat(RunConfig())
    extra = sorted(set(origins) - set(flat))
    if extra:
        raise ValueError(f"config origins: {', '.join(extra)} are not config fields")
    out = {k: origins.get(k, SCHEMA_DEFAULT) for k in flat}
    wrong = [k for k, o in out.items()
             if o == SCHEMA_DEFAULT and _norm(flat[k]) != _norm(default[k])]
    if wrong:
        k = wrong[0]
        raise ValueError(f"config origins: {k} holds {flat[k]!r}, not the schema default "
                         f"{default[k]!r}, but no layer is recorded as setting it")
    return out


def render(cfg: dict, origins: dict[str, str]) -> str:
    """The resolved config as YAML, each field followed by ``# <origin>`` (``suite run --cfg job``);
    ``yaml.safe_load`` reads it back to the config dict."""
    import yaml

    def scalar(v: Any) -> str:
        text = yaml.safe_dump(_norm(v), default_flow_style=True, width=10**9).rstrip("\n")
        return text[:-4] if text.endswith("\n...") else text

    def lines(d: dict, prefix: str, indent: str) -> list[str]:
        out = []
        for k, v in d.items():
            if isinstance(v, dict) and f"{prefix}{k}" not in origins:
                out += [f"{indent}{k}:", *lines(v, f"{prefix}{k}.", indent + "  ")]
            else:
                out.append(f"{indent}{k}: {scalar(v)}  # {origins[prefix + k]}")
        return out

    head = f"# Each value's layer after '#'; layers, lowest first: {' < '.join(ORDER)}."
    return "\n".join([head, *lines(cfg, "", "")])
