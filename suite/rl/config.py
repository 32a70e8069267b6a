"""One typed config tree (Hydra structured configs), resolved and validated before any compute.

Every field has a docstring (the string under it, cleanrl style). ``resolve`` fills the fields the
user did not set from the layers (suite/rl/layers.py: regime, task file, model preset, tier, schema
default) and says where each value came from; a value given on the command line or in a recipe
always wins. ``validate`` checks everything that can be checked without compute and raises
``ValueError`` naming the field and what is allowed. The ``key=value`` overrides are composed into a
RunConfig by suite/rl/compose.py.

Command line: ``suite run task=arith precision=bf16 algorithm=grpo seed=0 optim.lr=1e-4``.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import os
import warnings

from suite.names import unknown
from suite.rl import layers
from suite.rl.compose import from_overrides
from suite.rl.schema import ENGINES, GEMMS, OMITTED_AT_DEFAULT, REGIMES, TIERS, RunConfig


def _choice(fieldname: str, value: str, choices) -> None:
    if value not in choices:
        raise unknown(fieldname, value, choices)


def resolve(cfg: RunConfig, given: dict[str, str] | None = None) -> RunConfig:
    """``resolve_layers`` without the origins."""
    return resolve_layers(cfg, given)[0]


def resolve_layers(cfg: RunConfig,
                   given: dict[str, str] | None = None) -> tuple[RunConfig, dict[str, str]]:
    """Fill the fields no one set from the layers (suite/rl/layers.py: regime, task file, model
    preset, tier, schema default; the tier validated first). ``given``: the fields the user set
    (dotted field -> "command line" or "recipe FILE", ``layers.given``), which no layer overrides;
    None: every field that differs from its default. Returns a new config and each origin."""
    _choice("tier", cfg.tier, TIERS)
    cfg = dataclasses.replace(cfg, optim=dataclasses.replace(cfg.optim),
                              sampling=dataclasses.replace(cfg.sampling),
                              perfectible=dataclasses.replace(cfg.perfectible),
                              policy=dataclasses.replace(cfg.policy),
                              vllm=dataclasses.replace(cfg.vllm),
                              eval=dataclasses.replace(cfg.eval),
                              plan=dataclasses.replace(cfg.plan))
    origins = dict(layers.given_by_value(cfg) if given is None else given)
    # The task folders, absolute, so that ranks and sweep workers started elsewhere find the same
    # ones; those of $SUITE_TASKS_PATH are recorded too, so that a run's config.json says where its
    # task file was and its rerun command finds it without the environment.
    from suite.tasks.registry import TASKS_PATH_ENV, absolute_path

    include = os.pathsep.join(p for p in (cfg.include_path, os.environ.get(TASKS_PATH_ENV)) if p)
    cfg.include_path = absolute_path(include) if include.strip(os.pathsep + " ") else None
    if cfg.include_path is not None:
        origins.setdefault("include_path", f"${TASKS_PATH_ENV}")
    tier, tier_name = layers.tier_values(cfg.tier), f"tier {cfg.tier}"
    # Highest layer first: each fills only the fields no higher layer (nor the user) set.
    _choice("regime", cfg.regime, REGIMES)
    layers.apply(cfg, REGIMES[cfg.regime]["set"], f"regime {cfg.regime}", origins)
    layers.apply(cfg, {"task": tier["task"]}, tier_name, origins)  # the task file needs the name
    _apply_task_tier(cfg, origins)
    layers.apply(cfg, {"model": "embedded"}, "default (embedded policy)", origins)
    _apply_model_recipe(cfg, origins)
    lr_from_tier = "optim.lr" not in origins
    layers.apply(cfg, tier, tier_name, origins)
    if cfg.sampling.max_new_tokens is None:
        from suite.tasks.registry import get_task, task_file_of, task_spec

        spec = task_spec(cfg.task, cfg.include_path)
        budget = (spec.get("sampling") or {}).get("max_new_tokens")
        source = f"task file {task_file_of(cfg.task, cfg.include_path)} sampling.max_new_tokens"
        if budget is None:  # a generated task: its reference trace plus slack
            task = get_task(cfg.task, None, cfg.include_path)
            budget = len(task.trace(task.split("train", 1)[0])) + 8
            source = f"task {cfg.task}: trace length + 8"
        cfg.sampling.max_new_tokens = int(budget)
        origins["sampling.max_new_tokens"] = source
    from suite.rl.models import check_recipe

    for line in check_recipe(cfg.model, lr_from_tier, {k: getattr(cfg, k) for k in
                                                       ("micro_batch", "gradient_checkpointing",
                                                        "logprob_chunk")}):
        warnings.warn(line, RecipeWarning, stacklevel=2)
    return cfg, layers.complete(cfg, origins)


class RecipeWarning(UserWarning):
    """A real model run with a setting of the embedded policy's recipe (suite/rl/models.py
    check_recipe)."""


def _apply_model_recipe(cfg: RunConfig, origins: dict[str, str]) -> None:
    """A model preset brings its published recipe (suite/rl/models.py), below the task file's tier
    (the layer that may name the model) and above the global tier."""
    from suite.rl.models import PRESETS

    if cfg.model in PRESETS:
        # packing=true drops every pad already: the recipe's trim_padding would only be refused
        # beside it
        recipe = {k: v for k, v in PRESETS[cfg.model].recipe.items()
                  if not (cfg.packing and k == "trim_padding")}
        layers.apply(cfg, recipe, f"model preset {cfg.model}", origins)


def _apply_task_tier(cfg: RunConfig, origins: dict[str, str]) -> None:
    """A task file may set recipe values per tier (``tiers: {full: {...}}``): the published
    hyperparameters of sanity_r1d are its full tier. Below the regime, above the model preset."""
    from suite.tasks.registry import task_file_of, task_spec

    # an unknown name or a malformed task file: refused here
    spec = task_spec(cfg.task, cfg.include_path)
    where = task_file_of(cfg.task, cfg.include_path)
    for tier in spec.get("tiers") or {}:
        if tier not in TIERS:
            raise unknown(f"{where}: tiers", tier, TIERS)
    values = (spec.get("tiers") or {}).get(cfg.tier) or {}
    layers.apply(cfg, values, f"task file {where} tiers.{cfg.tier}", origins)


def _task_names(cfg):
    from suite.tasks.registry import task_names

    return task_names(cfg.include_path)


def validate(cfg: RunConfig) -> RunConfig:
    """Check a resolved config; raise ValueError naming the first bad field."""
    from suite.numerics.flows import KV_CACHE
    from suite.numerics.perturbation import KINDS
    from suite.numerics.precision import FLOWS, gemm_backend
    from suite.numerics.truncation import TRUNCATION
    from suite.rl.algo_table import ALGORITHMS

    _choice("task", cfg.task, _task_names(cfg))
    _choice("precision", cfg.precision, FLOWS)
    _choice("algorithm", cfg.algorithm, ALGORITHMS)
    _choice("tier", cfg.tier, TIERS)
    _choice("engine", cfg.engine, ENGINES)
    from suite.rl.models import check_name

    check_name(cfg.model)
    _choice("gemm", cfg.gemm, GEMMS)
    gemm_backend(cfg.gemm, FLOWS[cfg.precision].trainer_dtype)
    _check_finite(cfg)
    # Checked in order and lazily: a later check may divide by a field an earlier one has vetted.
    pos = ("must be >= 1", lambda v: v >= 1)
    checks = [
        ("seed", lambda c: c.seed >= 0, "must be >= 0"),
        ("threads", lambda c: c.threads >= 1, pos[0]),
        ("steps", lambda c: c.steps >= 1, pos[0]),
        ("prompts_per_step", lambda c: c.prompts_per_step >= 1, pos[0]),
        ("samples_per_prompt", lambda c: c.samples_per_prompt >= 2, "must be >= 2 (group-relative "
                                                                    "advantages need a group)"),
        ("updates_per_step", lambda c: c.updates_per_step >= 1, pos[0]),
        ("nproc", lambda c: c.nproc >= 1, pos[0]),
        ("nnodes", lambda c: c.nnodes >= 1, pos[0]),
        ("nproc", lambda c: c.prompts_per_step % (c.nproc * c.nnodes) == 0,
         f"{cfg.nproc * cfg.nnodes} ranks must split the {cfg.prompts_per_step} prompt groups of a "
         "step evenly (prompts_per_step must be a multiple of nproc x nnodes)"),
        ("nproc",
         lambda c: (c.prompts_per_step * c.samples_per_prompt // c.updates_per_step)
         % (c.nproc * c.nnodes) == 0,
         f"{cfg.nproc * cfg.nnodes} ranks must split each minibatch of "
         f"{cfg.prompts_per_step} x {cfg.samples_per_prompt} / {cfg.updates_per_step} sequences "
         "evenly"),
        ("micro_batch", lambda c: c.micro_batch is None or c.micro_batch >= 1,
         "must be >= 1 (or null: no accumulation)"),
        ("updates_per_step",
         lambda c: (c.prompts_per_step * c.samples_per_prompt) % c.updates_per_step == 0,
         f"must divide the rollout batch ({cfg.prompts_per_step} x {cfg.samples_per_prompt})"),
        ("threshold", lambda c: 0.0 < c.threshold <= 1.0, "must be in (0, 1]"),
        ("ckpt_every", lambda c: c.ckpt_every >= 1, pos[0]),
        ("keep_last", lambda c: c.keep_last >= 1, pos[0]),
        ("reward_workers", lambda c: c.reward_workers >= 1, pos[0]),
        ("logprob_chunk", lambda c: c.logprob_chunk >= 0, "must be >= 0 (0 = no chunking)"),
        ("optim.lr", lambda c: c.optim.lr > 0, "must be > 0"),
        ("optim.eps", lambda c: c.optim.eps > 0, "must be > 0"),
        ("optim.betas", lambda c: len(c.optim.betas) == 2
         and all(0.0 <= b < 1.0 for b in c.optim.betas),
         "must be two numbers, each in [0, 1)"),
        ("optim.weight_decay", lambda c: c.optim.weight_decay >= 0, "must be >= 0"),
        ("optim.grad_clip", lambda c: c.optim.grad_clip > 0, "must be > 0"),
        ("sampling.temperature", lambda c: c.sampling.temperature > 0, "must be > 0"),
        ("sampling.top_p", lambda c: 0.0 < c.sampling.top_p <= 1.0, "must be in (0, 1] (1: no "
                                                                    "nucleus cut)"),
        ("sampling.top_k", lambda c: c.sampling.top_k >= 0, "must be >= 0 (0: no top-k cut)"),
        ("sampling.truncation", lambda c: c.sampling.truncation in TRUNCATION,
         f"must be one of {', '.join(TRUNCATION)}"),
        ("kv_cache", lambda c: c.kv_cache in KV_CACHE, f"must be one of {', '.join(KV_CACHE)}"),
        ("staleness", lambda c: c.staleness >= 0, "must be >= 0 (0: the sampler holds the current "
                                                  "weights)"),
        ("staleness", lambda c: c.staleness == 0 or c.nproc * c.nnodes == 1,
         "asynchronous rollouts are not supported sharded (nproc x nnodes must be 1)"),
        ("sampling.max_new_tokens", lambda c: c.sampling.max_new_tokens >= 1, pos[0]),
        ("perfectible.k", lambda c: c.perfectible.k >= 2, "must be >= 2 (a pass rate needs several "
                                                          "samples)"),
        ("perfectible.lo", lambda c: 0.0 <= c.perfectible.lo <= 1.0, "must be in [0, 1]"),
        ("perfectible.hi", lambda c: 0.0 <= c.perfectible.hi <= 1.0, "must be in [0, 1]"),
        ("perfectible.lo", lambda c: c.perfectible.lo <= c.perfectible.hi,
         f"lo ({cfg.perfectible.lo}) must be <= hi ({cfg.perfectible.hi})"),
        ("perfectible.pool", lambda c: c.perfectible.pool >= 1, pos[0]),
        ("perfectible.sampler", lambda c: c.perfectible.sampler in ("fp32", "bf16", "fp16"),
         "must be fp32, bf16 or fp16"),
        ("perfectible.max_prompts", lambda c: c.perfectible.max_prompts >= 0, "must be >= 0 (0 = "
                                                                              "all)"),
        *[(f"policy.{k}", lambda c, k=k: getattr(c.policy, k) >= 1, pos[0])
          for k in ("hidden", "layers", "heads", "kv_heads", "mlp")],
        ("policy.hidden", lambda c: c.policy.hidden % c.policy.heads == 0, "must be divisible by "
                                                                           "policy.heads"),
        ("policy.heads", lambda c: c.policy.heads % c.policy.kv_heads == 0, "must be divisible by "
                                                                            "policy.kv_heads"),
        ("policy.target_acc", lambda c: 0.0 < c.policy.target_acc < 1.0, "must be in (0, 1)"),
        ("vllm.max_model_len", lambda c: c.vllm.max_model_len is None or c.vllm.max_model_len >= 1,
         pos[0]),
        ("vllm.gpu_memory_fraction", lambda c: 0.0 < c.vllm.gpu_memory_fraction <= 1.0,
         "must be in (0, 1]"),
        ("vllm.kv_cache_gib", lambda c: c.vllm.kv_cache_gib is None or c.vllm.kv_cache_gib > 0,
         "must be > 0"),
        ("vllm.tensor_parallel_size", lambda c: c.vllm.tensor_parallel_size >= 1, pos[0]),
        ("policy.experts", lambda c: c.policy.experts == 0 or c.policy.experts >= 2,
         "must be 0 (dense) or >= 2"),
        ("policy.top_k", lambda c: c.policy.experts == 0 or 1 <= c.policy.top_k <= c.policy.experts,
         "must be in [1, policy.experts]"),
        ("policy.experts", lambda c: c.policy.experts == 0
         or (c.model == "embedded" and c.policy.path is None),
         "builds the embedded policy as a mixture of experts; a given model keeps its own "
         "architecture"),
        ("policy.experts", lambda c: c.policy.experts == 0 or c.engine == "torch",
         "the mixture-of-experts policy runs on the built-in sampler (engine=torch)"),
        ("policy.experts", lambda c: c.policy.experts == 0
         or not (FLOWS[c.precision].sampler_quant or FLOWS[c.precision].trainer_quant),
         "FP8 flows quantise the dense projections only; the experts would silently stay bf16"),
        ("policy.experts", lambda c: c.policy.experts == 0 or c.nproc * c.nnodes == 1,
         "the mixture-of-experts policy is not supported sharded (nproc x nnodes must be 1)"),
        ("packing", lambda c: not (c.packing and c.trim_padding),
         "drops every pad of a micro-batch already; set trim_padding=false with it"),
        ("routing_replay", lambda c: not c.routing_replay or c.policy.experts > 0
         or c.policy.path is not None
         or c.model != "embedded", "needs a mixture-of-experts policy (policy.experts > 0, or a "
                                   "given MoE model)"),
        ("routing_replay", lambda c: not c.routing_replay or c.engine == "torch",
         "the built-in sampler records the experts it chose; engine=vllm does not here"),
        ("inject.kind", lambda c: c.inject.kind in KINDS, f"must be one of {', '.join(KINDS)}"),
        ("inject.scale", lambda c: c.inject.kind != "none" or c.inject.scale == 0.0,
         "needs inject.kind=noise or lowp_bias (a scale without a kind would silently do nothing)"),
        ("inject.scale", lambda c: c.inject.kind != "noise" or c.inject.scale >= 0.0,
         "must be >= 0 (a noise std)"),
        ("inject.threshold", lambda c: 0.0 < c.inject.threshold < 1.0, "must be in (0, 1)"),
        ("inject.kind", lambda c: c.inject.kind == "none" or c.engine == "torch",
         "perturbs the built-in sampler's distribution; engine=vllm has no such hook"),
        ("eval.every", lambda c: c.eval.every >= 0, "must be >= 0 (0 = no evaluation)"),
        ("eval.splits", lambda c: c.eval.splits is None or len(c.eval.splits) >= 1,
         "must name at least one split (or null)"),
        ("eval.prompts", lambda c: c.eval.prompts is None or c.eval.prompts >= 1, pos[0]),
        ("eval.samples", lambda c: c.eval.samples is None or c.eval.samples >= 1, pos[0]),
        ("eval.temperature", lambda c: c.eval.temperature is None or c.eval.temperature > 0,
         "must be > 0"),
        ("eval.top_p", lambda c: c.eval.top_p is None or 0.0 < c.eval.top_p <= 1.0, "must be in "
                                                                                    "(0, 1]"),
        ("plan.prompt_tokens", lambda c: c.plan.prompt_tokens is None or c.plan.prompt_tokens >= 1,
         pos[0]),
        *_centering_checks(cfg),
    ]
    for name, ok, why in checks:
        if not ok(cfg):
            raise ValueError(f"{name}: {why} (got {_get(cfg, name)!r}).")
    if cfg.nproc * cfg.nnodes > 1:
        from suite import dist

        dist.check_ranks(cfg.nproc, cfg.nnodes)
        if resolve_flow(cfg).sampler_code:
            raise ValueError(f"precision: {cfg.precision} trains through the sampler's own engine "
                             "code on the full weights, outside FSDP2's sharded forward; run it "
                             "with nproc=1 (docs/distributed.md)")
    on = [k for k in ("gradient_checkpointing", "logprob_chunk", "trim_padding", "packing")
          if getattr(cfg, k)]
    if on and resolve_flow(cfg).sampler_code:
        raise ValueError(f"{on[0]}: precision {cfg.precision} trains through the sampler's own "
                         "engine code, not the HF model these act on")
    if cfg.engine == "vllm":
        from suite.numerics.vllm_support import check_supported

        check_supported(cfg)
    from suite.rl import recipe

    recipe.check(cfg)
    from suite.rl import loggers

    loggers.check(cfg.logger)
    _check_extras(cfg)
    return cfg


def _centering_checks(cfg: RunConfig) -> list:
    """Rules of algo.score_centering (suite/rl/algos.py centering_term)."""
    from suite.numerics.precision import FLOWS
    from suite.rl import recipe

    def on(c):
        return c.algo.score_centering

    def k(c):
        return c.algo.score_centering_topk

    def untruncated(c):
        return c.sampling.top_p == 1.0 and c.sampling.top_k == 0

    return [
        ("algo.score_centering_topk", lambda c: k(c) is None or on(c),
         "has no effect without algo.score_centering=true"),
        ("algo.score_centering_topk", lambda c: k(c) is None or k(c) >= 1,
         "must be >= 1 (or null: the sampler's full distribution)"),
        ("algo.score_centering", lambda c: not on(c) or c.engine == "torch" or k(c) is not None,
         "engine=vllm returns a top-k head of the sampler's log-probs only: "
         "set algo.score_centering_topk (e.g. 20)"),
        ("algo.score_centering", lambda c: not on(c) or untruncated(c),
         "centres with the sampler's untruncated distribution: it needs sampling.top_p=1 and "
         "sampling.top_k=0"),
        # Under an IS correction the per-candidate centring mass must carry each candidate's own IS
        # weight (NeMo-RL's weighted form; it cancels under untruncated IS). Centring with mu times
        # the sampled token's weight instead adds a drift E[c_t](pi - mu) of its own: refused.
        ("algo.score_centering", lambda c: not on(c) or recipe.algorithm(c).correction == "none",
         f"not with algorithm {cfg.algorithm}, whose IS correction already reweights toward the "
         "trainer (centring it needs each candidate's own IS weight, not implemented): use a row "
         "without correction (grpo, dr_grpo, dapo, grpo_vanilla, gspo) or turn centering off"),
        ("algo.score_centering", lambda c: not on(c) or not FLOWS[c.precision].sampler_code,
         f"not with precision {cfg.precision}: it trains through the sampler's own engine code "
         "(exact, unified flows), whose scoring returns no distribution to centre with"),
    ]


def _check_extras(cfg: RunConfig) -> None:
    """A feature whose packages are an optional extra (pyproject.toml) is refused before any
    compute, naming the extra, when they are not installed."""
    import importlib.util

    from suite.tasks.registry import task_spec

    needs = []
    spec = task_spec(cfg.task, cfg.include_path)
    # the dataset tasks: rows via datasets, math-verify grading of \boxed answers
    if spec["kind"] == "dataset":
        needs.append(("task", cfg.task, "datasets", "math"))
        if spec["reward"]["kind"] == "boxed":
            needs.append(("task", cfg.task, "math_verify", "math"))
    if cfg.transfer:
        needs.append(("transfer", cfg.transfer, "lm_eval", "transfer"))
    for field_name, value, module, extra in needs:
        if importlib.util.find_spec(module) is None:
            raise ValueError(f"{field_name}={value} needs the optional package {module!r}: "
                             f"pip install 'lowprec-rl-suite[{extra}]'")


def resolve_flow(cfg: RunConfig):
    from suite.numerics.precision import resolve as flow

    return flow(cfg.precision)


def _get(cfg: RunConfig, dotted: str):
    obj = cfg
    for part in dotted.split("."):
        obj = getattr(obj, part)
    return obj


def _check_finite(cfg, prefix: str = "") -> None:
    """Every number of the config is finite (``optim.lr=inf`` or ``nan`` is refused, not run)."""
    for f in dataclasses.fields(cfg):
        value = getattr(cfg, f.name)
        if dataclasses.is_dataclass(value):
            _check_finite(value, f"{prefix}{f.name}.")
            continue
        for v in value if isinstance(value, (tuple, list)) else [value]:
            if isinstance(v, float) and not math.isfinite(v):
                raise ValueError(f"{prefix}{f.name}: must be a finite number (got {value!r}).")


def load(overrides: list[str]) -> RunConfig:
    """Overrides -> resolved, validated config."""
    return load_layers(overrides)[0]


def load_layers(overrides: list[str]) -> tuple[RunConfig, dict[str, str]]:
    """Overrides -> resolved, validated config and each field's origin (suite/rl/layers.py): the
    CLI's entry point. A recipe file's fields come from the recipe, the others' from the command
    line."""
    from suite.rl import recipe

    path, from_recipe, rest = recipe.layered(overrides)
    composed = from_overrides(from_recipe + rest)  # first: its refusals name the override
    given = {**layers.given(from_recipe, f"recipe {path}"), **layers.given(rest)}
    cfg, origins = resolve_layers(composed, given)
    return validate(cfg), origins


def to_dict(cfg: RunConfig) -> dict:
    """The config as saved in config.json and hashed: the OMITTED_AT_DEFAULT fields at their default
    are left out."""
    d = dataclasses.asdict(cfg)
    for key, default in OMITTED_AT_DEFAULT.items():
        *path, leaf = key.split(".")
        node = functools.reduce(dict.__getitem__, path, d)
        if leaf in node and node[leaf] == default and type(node[leaf]) is type(default):
            del node[leaf]
    return d
