"""The words of the command line: the values each config field allows, and other tools' habits
translated.

The suite has one syntax, Hydra's ``key=value`` (a sweep is ``key=a,b``), so that a recorded command
means one thing. Users arrive with the habits of argparse, TRL and verl; each habit gets a
translation that cannot change what a run computes, or a one-line refusal that names the field to
use (``translate``, ``suggest_field``):

- ``--precision=bf16`` or ``--precision bf16``: refused, "use precision=bf16". Accepting flags too
would give
  a run two spellings, and a sweep's ``seed=0,1,2`` has no flag form. A flag that names no config
  field is left to the command (``--cfg job``, ``bench --vs trl``).
- ``logger=wandb`` for a list field: taken as ``logger=[wandb]`` (what else could one name mean).
- ``precision=BF16`` for a field whose values are registry names: folded to ``bf16`` when exactly
one name
  matches without regard to case; anything else is left for validation and its "did you mean".
- ``optimizer.lr=``, TRL's ``learning_rate=``, verl's ``actor_rollout_ref.rollout.n=``: an unknown
field is
  answered with the field of that meaning here (``optim.lr``, ``samples_per_prompt``).

Only light registries are read here (no torch), so ``--help`` and these checks answer at once.
"""

from __future__ import annotations

import dataclasses
import difflib
import functools
import types
import typing

from suite.rl.schema import RunConfig


# ---- allowed values ---------------------------------------------------------------------------
def choices() -> dict[str, list[str]]:
    """Config field -> its allowed values, read from the registries (the same tables validation
    reads)."""
    from suite.numerics.flows import FLOWS
    from suite.rl import loggers, recipe
    from suite.rl.algo_table import ADVANTAGE_MODES, AGG_MODES, ALGORITHMS
    from suite.rl.models import EMBEDDED, PRESETS
    from suite.rl.schema import ENGINES, GEMMS, REGIMES, TIERS
    from suite.tasks.registry import task_names

    return {"task": task_names(), "precision": list(FLOWS), "algorithm": list(ALGORITHMS),
            "tier": list(TIERS), "regime": list(REGIMES), "engine": list(ENGINES),
            "gemm": list(GEMMS), "model": [EMBEDDED, *PRESETS], "logger": list(loggers.BACKENDS),
            "optim.schedule": list(recipe.SCHEDULES), "algo.advantage": list(ADVANTAGE_MODES),
            "algo.agg": list(AGG_MODES), "algo.kl_estimator": list(recipe.KL_ESTIMATORS),
            "algo.ppo_ref": list(recipe.PPO_REFS)}


# Fields whose values are not only the names listed: what else they take, for --help.
OPEN_CHOICES = {"model": "or a local HF model directory"}


# ---- the fields ---------------------------------------------------------------------------------
@functools.cache
def fields() -> dict[str, typing.Any]:
    """Every leaf field of RunConfig as ``section.name`` -> its type."""
    out: dict[str, typing.Any] = {}

    def walk(cls, prefix: str) -> None:
        hints = typing.get_type_hints(cls)
        for f in dataclasses.fields(cls):
            if (f.default_factory is not dataclasses.MISSING
                    and dataclasses.is_dataclass(f.default_factory)):
                walk(f.default_factory, f"{prefix}{f.name}.")
            else:
                out[f"{prefix}{f.name}"] = hints[f.name]

    walk(RunConfig, "")
    return out


def _is_sequence(tp) -> bool:
    """list[...] / tuple[...], also inside a union with None (``X | None`` or ``Optional[X]``)."""
    if typing.get_origin(tp) in (list, tuple):
        return True
    unions = (typing.Union, types.UnionType)
    return typing.get_origin(tp) in unions and any(_is_sequence(a) for a in typing.get_args(tp))


# ---- other tools' names -------------------------------------------------------------------------
# A field name another tool uses (TRL's GRPOConfig and HF TrainingArguments, verl's config) -> ours.
# Matched on the last part of a dotted key, so verl's ``actor_rollout_ref.actor.optim.lr`` finds
# ``optim.lr`` too.
LEAF_ALIASES = {
    "lr": "optim.lr", "learning_rate": "optim.lr", "lr_scheduler_type": "optim.schedule",
    "warmup": "optim.warmup_steps", "max_grad_norm": "optim.grad_clip",
    "clip_grad": "optim.grad_clip", "adam_epsilon": "optim.eps", "adam_beta1": "optim.betas",
    "adam_beta2": "optim.betas", "temperature": "sampling.temperature", "top_p": "sampling.top_p",
    "max_new_tokens": "sampling.max_new_tokens", "max_completion_length": "sampling.max_new_tokens",
    "max_response_length": "sampling.max_new_tokens", "max_tokens": "sampling.max_new_tokens",
    "response_length": "sampling.max_new_tokens", "num_generations": "samples_per_prompt",
    "n": "samples_per_prompt", "group_size": "samples_per_prompt",
    "train_batch_size": "prompts_per_step", "total_training_steps": "steps", "max_steps": "steps",
    "beta": "algo.kl_coef", "kl_coef": "algo.kl_coef", "kl_loss_coef": "algo.kl_coef",
    "kl_loss_type": "algo.kl_estimator", "epsilon": "algo.clip_low", "clip_ratio": "algo.clip_low",
    "clip_ratio_low": "algo.clip_low", "epsilon_high": "algo.clip_high",
    "clip_ratio_high": "algo.clip_high", "loss_agg_mode": "algo.agg",
    "entropy_coeff": "algo.entropy_coef", "report_to": "logger",
}
# A group name another tool uses -> ours (``optimizer.lr`` -> ``optim.lr``).
GROUP_ALIASES = {"optimizer": "optim", "opt": "optim", "rollout": "sampling",
                 "generation": "sampling", "sampler": "sampling", "algorithm": "algo",
                 "actor": "algo", "model": "policy", "evaluation": "eval"}


def suggest_field(key: str) -> str:
    """``" Did you mean 'optim.lr'?"`` for an unknown field: another tool's name for one of ours,
    the same key in our group names, or the closest field; ``""`` when nothing is close."""
    known = fields()
    key = key.lstrip("-+~").replace("-", "_")
    parts = key.split(".")
    guess = None
    if len(parts) > 1:
        grouped = ".".join([GROUP_ALIASES.get(parts[-2], parts[-2]), parts[-1]])
        guess = grouped if grouped in known else None
    guess = guess or (key if key in known else None) or LEAF_ALIASES.get(parts[-1].lower())
    if guess is None:
        close = difflib.get_close_matches(key.lower(), list(known), n=1)
        by_leaf = {k.rsplit(".", 1)[-1]: k for k in known}
        close = close or [by_leaf[c]
                          for c in difflib.get_close_matches(parts[-1].lower(), list(by_leaf), n=1)]
        guess = close[0] if close else None
    return f" Did you mean '{guess}'?" if guess else ""


# ---- translation --------------------------------------------------------------------------------
def _fold(value: str, allowed: list[str]) -> str:
    """Each comma-separated name of ``value`` (brackets kept) with its case folded onto the one
    allowed name it matches; names already allowed, or matching none or several, are left as they
    are."""
    inner = value[1:-1] if value.startswith("[") and value.endswith("]") else value
    lower: dict[str, list[str]] = {}
    for a in allowed:
        lower.setdefault(a.lower(), []).append(a)
    names = [n if n in allowed or len(lower.get(n.strip().lower(), [])) != 1
             else lower[n.strip().lower()][0]
             for n in inner.split(",")]
    return value.replace(inner, ",".join(names), 1) if inner else value


def _flag_field(token: str) -> str | None:
    """The config field a ``--name[=value]`` token names (``--prompts-per-step`` ->
    prompts_per_step), or None."""
    name = token[2:].split("=", 1)[0].replace("-", "_")
    return name if name in fields() or name == "recipe" else None


def translate(args: list[str], sweep: bool = False) -> list[str]:
    """``args`` with other tools' habits translated (module docstring); ValueError for a flag that
    names a field. ``sweep``: a comma separates the values of a sweep, so it never makes a
    one-element list a list."""
    allowed, out = choices(), []
    for i, a in enumerate(args):
        if a.startswith("--") and (field := _flag_field(a)):
            value = a.split("=",
                            1)[1] if "=" in a else (args[i + 1] if i + 1 < len(args)
                                                    and "=" not in args[i + 1]
                                                    and not args[i + 1].startswith("-")
                                                    else "VALUE")
            raise ValueError(f"{a.split('=', 1)[0]}: config fields are key=value, not flags: use "
                             f"{field}={value}")
        if "=" not in a or a.startswith("-"):
            out.append(a)
            continue
        key, value = a.split("=", 1)
        field = key.lstrip("+~")
        if field in allowed and value:
            value = _fold(value, allowed[field])
        if (_is_sequence(fields().get(field)) and value and not value.startswith("[")
                and value.lower() != "null" and not (sweep and "," in value)
                and "${" not in value):
            value = f"[{value}]"
        out.append(f"{key}={value}")
    return out
