"""A recipe's knobs: the algorithm's settings, KL and entropy terms, the learning-rate schedule, and
recipe files.

Every knob is a RunConfig field (``algo.*``, ``optim.schedule``, ``optim.warmup_steps``), so it
enters the config hash and the run directory's config.json. The algorithm knobs default to None,
"the value of the algorithm's row in suite/rl/algos.py", and the new terms to off, so a config that
sets none of them computes exactly what it computed before they existed.

A recipe file (``suite run recipe=my_recipe.yaml``, or ``recipe=NAME`` for one of the suite's own in
``recipes/``, shipped in the wheel) is a YAML mapping of config fields, nested or dotted; it is
applied first and the command line wins. Its path is not part of the config: the fields it resolves
to are.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from pathlib import Path

KL_ESTIMATORS = ("k1", "k2", "k3")
PPO_REFS = ("trainer", "sampler")
SCHEDULES = ("constant", "linear", "cosine")
_BARE = re.compile(r"[A-Za-z_][A-Za-z0-9_\-./]*")
_HYDRA_WORDS = {"true", "false", "null", "nan", "inf"}


@dataclass
class AlgoConfig:
    """The algorithm's knobs; None keeps the value of the algorithm's row (docs/recipes.md)."""

    C: float | None = None
    """IS threshold: truncation cap (TIS) or mask threshold (MIS). None: the row's (3 for the sanity
    algorithms)."""
    clip_low: float | None = None
    """eps_low of the PPO/GSPO clip (ratios below 1 - clip_low are clipped). None: the row's."""
    clip_high: float | None = None
    """eps_high (ratios above 1 + clip_high are clipped; DAPO's clip-higher when > clip_low). None:
    the row's."""
    agg: str | None = None
    """Loss aggregation: token-mean, seq-mean-token-sum, seq-mean-token-mean,
    seq-mean-token-sum-norm. None: the row's."""
    advantage: str | None = None
    """Advantage estimator: mean (r - group mean, Dr.GRPO) or std (divided by the group std, GRPO).
    None: the row's."""
    kl_coef: float = 0.0
    """Weight of the KL penalty to the reference policy (the run's starting weights, frozen), added
    to the loss with the loss's aggregation (GRPO, arXiv 2402.03300 Eq. 3). 0: no reference model is
    built."""
    kl_estimator: str = "k3"
    """KL estimator on the sampled tokens, with log r = log pi_ref - log pi (Schulman,
    "Approximating KL divergence", 2020): k1 = -log r, k2 = (log r)^2 / 2, k3 = r - 1 - log r
    (GRPO's, Eq. 4)."""
    entropy_coef: float = 0.0
    """Weight of the entropy bonus: the loss minus entropy_coef x the aggregated per-token entropy
    of the trainer (verl's entropy_coeff). 0: off."""
    ppo_ref: str = "trainer"
    """Denominator of the PPO/GSPO ratio, pi_theta': trainer (the trainer's log-probs of the sampled
    tokens at the sampling parameters, recomputed before the updates) or sampler (the sampler's own
    log-probs, as in verl's rollout "bypass" mode, which skips that forward pass; the suite still
    runs it for the mismatch metrics). With the sampler's, the clip reads the precision gap as
    policy change (ppo/clip_frac_gap)."""
    score_centering: bool = False
    """Score centering (arXiv 2609.20807): each token's policy-gradient term uses the centred score
    grad log pi(y_t) - E_{v~mu}[grad log pi(v)], the sampler's expected score at that position
    subtracted, which removes the drift that pulls the trainer toward the sampler (suite/rl/algos.py
    centering_term, docs/algorithms.md). The sampler then records its next-token distribution. Off:
    the loss is unchanged, and the field is left out of config.json and the config hash."""
    score_centering_topk: int | None = None
    """Centre with the sampler's top-k head only, its tail modelled as the trainer's tail rescaled
    to the sampler's tail mass (NeMo-RL's estimator): needed with engine=vllm, which returns a top-k
    head of log-probs; with the built-in engine it saves the (B, R, vocab) record of a large
    vocabulary. None: the full distribution."""


def algorithm(cfg):
    """The algorithm row of ``cfg.algorithm`` with the ``algo.*`` knobs the config sets (ValueError
    names the field when a value is refused)."""
    from suite.rl.algo_table import ROW_KNOBS, get_algorithm

    knobs = {k: getattr(cfg.algo, k) for k in ROW_KNOBS}
    overrides = {k: v for k, v in knobs.items() if v is not None}
    try:
        return get_algorithm(cfg.algorithm, **overrides)
    except ValueError as e:
        field = next((k for k in overrides if f".{k}" in str(e)), None)
        raise ValueError(f"algo.{field}: {e}" if field else str(e)) from None


def check(cfg) -> None:
    """Validate the recipe fields of a resolved config; ValueError names the field."""
    algorithm(cfg)
    a, o = cfg.algo, cfg.optim
    if a.kl_estimator not in KL_ESTIMATORS:
        from suite.names import unknown

        raise ValueError(f"algo.{unknown('kl_estimator', a.kl_estimator, KL_ESTIMATORS)}")
    if a.ppo_ref not in PPO_REFS:
        from suite.names import unknown

        raise ValueError(f"algo.{unknown('ppo_ref', a.ppo_ref, PPO_REFS)}")
    if a.ppo_ref == "sampler" and algorithm(cfg).surrogate == "pg":
        raise ValueError(f"algo.ppo_ref: {cfg.algorithm} has no PPO ratio (a policy-gradient "
                         "surrogate); the reference choice applies to PPO and GSPO algorithms")
    for name in ("kl_coef", "entropy_coef"):
        if not getattr(a, name) >= 0:
            raise ValueError(f"algo.{name}: must be >= 0 (got {getattr(a, name)!r}).")
    if o.schedule not in SCHEDULES:
        from suite.names import unknown

        raise ValueError(f"optim.{unknown('schedule', o.schedule, SCHEDULES)}")
    total = cfg.steps * cfg.updates_per_step
    if not 0 <= o.warmup_steps <= total:
        raise ValueError(f"optim.warmup_steps: must be in [0, {total}], the run's optimizer "
                         f"updates (steps x updates_per_step) (got {o.warmup_steps!r}).")


def lr_factor(update: int, total: int, warmup: int, schedule: str) -> float:
    """Multiplier of the base learning rate for optimizer update ``update`` (0-based) of ``total``.

    Linear warm-up from 1/(warmup+1) to 1 over the first ``warmup`` updates (never 0, so the first
    update moves), then constant, linear decay to 0 at ``total``, or half-cosine decay to 0
    (Loshchilov & Hutter, arXiv 1608.03983, without restarts). A pure function of the update index:
    a resumed run gets the same rates without any scheduler state."""
    if update < warmup:
        return (update + 1) / (warmup + 1)
    if schedule == "constant":
        return 1.0
    progress = (update - warmup) / max(total - warmup, 1)  # 0 at the first update after warm-up
    if schedule == "linear":
        return 1.0 - progress
    return 0.5 * (1.0 + math.cos(math.pi * progress))


# ---- recipe files -------------------------------------------------------------------------------
def expand(overrides: list[str]) -> list[str]:
    """Replace ``recipe=PATH`` by the overrides its YAML holds, put before every other override so
    the command line wins. A missing file, bad YAML or a non-mapping is a ValueError naming the
    file."""
    _, from_recipe, rest = layered(overrides)
    return from_recipe + rest


def layered(overrides: list[str]) -> tuple[Path | None, list[str], list[str]]:
    """(the recipe file or None, the overrides its YAML holds, the other overrides): the recipe's
    layer and the command line's (suite/rl/layers.py)."""
    recipes = [o for o in overrides if o.split("=", 1)[0] == "recipe"]
    if not recipes:
        return None, [], list(overrides)
    if len(recipes) > 1:
        raise ValueError("recipe: give one recipe file (merge them into one YAML)")
    path = find_recipe(recipes[0].split("=", 1)[1])
    return path, recipe_overrides(path), [o for o in overrides if o not in recipes]


def shipped_recipes() -> list[str]:
    """The names of the suite's own recipe files (``recipes/NAME.yaml``, in the clone or the
    wheel)."""
    from suite.locations import shipped_dir

    return sorted(p.stem for p in shipped_dir("recipes").glob("*.yaml"))


def find_recipe(value: str) -> Path:
    """The recipe file ``value`` names: a path that exists, else one of the suite's own recipes by
    name or as ``recipes/NAME.yaml`` (so an installed wheel finds them from any directory).
    ValueError lists them."""
    from suite.locations import shipped_dir

    path = Path(value).expanduser()
    if path.is_file():
        return path
    own = shipped_dir("recipes") / (path.name if path.suffix in (".yaml", ".yml")
                                    else f"{path.name}.yaml")
    if (path.parent in (Path("."), Path("recipes"))) and own.is_file():
        return own
    from suite.names import did_you_mean

    names = shipped_recipes()
    raise ValueError(f"recipe: cannot read {path}: no such file, and no recipe of the suite is "
                     f"called so.{did_you_mean(path.stem, names)} The suite's recipes: "
                     f"{', '.join(names)} (recipe=NAME; files in {shipped_dir('recipes')})")


def recipe_overrides(path: Path) -> list[str]:
    """The ``key=value`` overrides of a recipe file (nested mappings become dotted keys)."""
    import yaml

    try:
        doc = yaml.safe_load(path.read_text())
    except OSError as e:
        raise ValueError(f"recipe: cannot read {path}: {e.strerror}") from None
    except yaml.YAMLError as e:
        raise ValueError(f"recipe: {path} is not valid YAML: {str(e).splitlines()[0]}") from None
    if not isinstance(doc, dict):
        raise ValueError(f"recipe: {path} must hold a mapping of config fields (key: value)")

    def flat(d: dict, prefix: str = "") -> list[str]:
        out = []
        for k, v in d.items():
            key = f"{prefix}{k}"
            if key == "recipe":
                raise ValueError(f"recipe: {path} names another recipe; recipes do not nest")
            out += flat(v, f"{key}.") if isinstance(v, dict) else [f"{key}={hydra_value(v)}"]
        return out

    return flat(doc)


def hydra_value(v) -> str:
    """A value in Hydra's override grammar; strings that are not plain words are quoted."""
    if v is None:
        return "null"
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, (int, float)):
        return repr(v)  # repr keeps 1.0 a float, and config_hash tells 1 from 1.0
    if isinstance(v, (list, tuple)):
        return "[" + ",".join(hydra_value(x) for x in v) + "]"
    if isinstance(v, dict):
        return "{" + ",".join(f"{k}:{hydra_value(x)}" for k, x in v.items()) + "}"
    s = str(v)
    if _BARE.fullmatch(s) and s.lower() not in _HYDRA_WORDS:
        return s
    # Inside quotes Hydra unescapes \' and backslashes in front of a quote or at the end, and
    # still resolves ${...} interpolations, so those three are escaped.
    s = re.sub(r"(\\+)(?='|$)", lambda m: m.group(1) * 2, s)
    return "'" + s.replace("'", "\\'").replace("${", "\\${") + "'"
