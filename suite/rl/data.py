"""The data of a run, built before its first step: the base policy (the embedded one, built and
cached, or an HF model directory) and the training set (the perfectible set of
suite/rl/perfectible.py, or a task's own prefiltered split), and the held-out evaluation settings
they are checked against.

Everything that can fail without compute fails here, before training. Builds are cached under
``cache_root()`` and shared by every run of a grid; on several ranks the build happens once
(suite/rl/train.py: local rank 0 of each node builds, the other ranks wait and read it; with vLLM
samplers the build runs in a separate process).
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

from rich.console import Console

from suite.rl import perfectible
from suite.rl.policy import (
    BUILD_THREADS,
    PolicySpec,
    building,
    cache_root,
    ensure_policy,
    policy_key,
    torch_threads,
)
from suite.tasks.registry import get_task, task_spec


def policy_spec(cfg) -> PolicySpec:
    p = cfg.policy
    return PolicySpec(hidden=p.hidden, layers=p.layers, heads=p.heads, kv_heads=p.kv_heads,
                      mlp=p.mlp, target_acc=p.target_acc, experts=p.experts, top_k=p.top_k)


def prepare_data(cfg, console: Console) -> tuple[Path, Path]:
    """The base model directory and the training set for this config (built once, cached, with
    ``policy.BUILD_THREADS`` torch threads)."""
    with torch_threads(BUILD_THREADS):
        return _prepare_data(cfg, console)


LAUNCHER_ENV = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK", "ROLE_RANK",
                "MASTER_ADDR", "MASTER_PORT", "TORCHELASTIC_RUN_ID", "SLURM_PROCID",
                "SLURM_STEP_ID", "SLURM_STEPID")


def _prepare_alone(cfg) -> None:
    import multiprocessing
    import signal

    from suite import lifetime

    # a killed rank must not leave its build (and a vLLM engine) running; the rank spawned this
    # process from its main thread, so the parent-death signal is safe
    lifetime.die_with_parent(signal.SIGKILL, multiprocessing.parent_process().pid)
    for k in LAUNCHER_ENV:
        os.environ.pop(k, None)
    prepare_data(cfg, Console())


def prepare_data_outside_world(cfg, console: Console) -> tuple[Path, Path]:
    """prepare_data for one rank of a world whose sampler is vLLM: the build runs in a fresh
    process.

    A vLLM engine joins whatever process group its process has (it would wait in ``new_group`` for
    ranks that are waiting for this build), and the perfectible set must be the one a single
    process builds, so that a run on N ranks trains on the set of a 1-rank run. The child has no
    launcher variables; once it has filled the cache, the call here only reads it."""
    import multiprocessing

    child = multiprocessing.get_context("spawn").Process(target=_prepare_alone, args=(cfg,))
    child.start()
    child.join()
    if child.exitcode != 0:
        raise RuntimeError("building the base policy and perfectible set in a separate process "
                           f"failed (exit code {child.exitcode}); its error is printed above")
    return prepare_data(cfg, console)


def _prepare_data(cfg, console: Console) -> tuple[Path, Path]:
    """The base model directory and the training set for this config (built once, cached).

    Everything that can fail without compute fails here, before training: the dataset (missing
    columns, offline without a local copy), the model (not cached, offline) and its tokenizer
    (a chat task needs a chat template). Tasks whose train split is already a perfectible set
    (sanity_r1d: the published filter) use it as is; the others are filtered with the base model.
    """
    from suite.rl import models

    task = get_task(cfg.task, cfg.data, cfg.include_path)
    spec = task_spec(cfg.task, cfg.include_path)
    if cfg.policy.path or cfg.model != models.EMBEDDED:
        model_dir = models.model_dir(cfg.policy.path or cfg.model)
        if not (model_dir / "config.json").exists():
            raise FileNotFoundError(f"model: no HF model (config.json) in {model_dir}")
        key = hashlib.sha256(str(model_dir.resolve()).encode()).hexdigest()[:12]
    else:
        model_dir = ensure_policy(policy_spec(cfg), task, console)
        key = policy_key(policy_spec(cfg), task)
    if task.split("train", 1)[0].messages:
        from transformers import AutoTokenizer

        models.check_chat_template(AutoTokenizer.from_pretrained(model_dir), cfg.model, task.name)
    # a missing held-out split is bad input: say so now, not at the first evaluation
    if cfg.eval.every:
        for split in eval_settings(cfg, task)["splits"]:
            task.split(split, 1)
    pf = cfg.perfectible
    source = hashlib.sha256(str(getattr(task, "source", "")).encode()).hexdigest()[:8]
    if spec.get("prefiltered"):
        data_dir = cache_root() / "datasets" / f"{task.name}-v{task.version}-{source}-prefiltered"
        with building(data_dir, "provenance.json") as todo:
            if todo:
                perfectible.from_split(task, data_dir, note=spec["prefiltered"])
        return model_dir, data_dir
    data_dir = cache_root() / "datasets" / (
        f"{task.name}-v{task.version}-{key}-k{pf.k}-{pf.lo}-{pf.hi}"
        f"-pool{pf.pool}-len{cfg.sampling.max_new_tokens}"
        + (f"-{source}" if hasattr(task, "source") else "")
        + (f"-{pf.sampler}-{cfg.engine}" if (pf.sampler, cfg.engine) != ("fp32", "torch")
           else ""))
    with building(data_dir, "provenance.json") as todo:
        if todo:
            console.print(f"building the perfectible set: {pf.pool} prompts x k={pf.k} samples")
            perfectible.build(model_dir, task, k=pf.k, lo=pf.lo, hi=pf.hi, pool=pf.pool,
                              max_new_tokens=cfg.sampling.max_new_tokens, out_dir=data_dir,
                              console=console, sampler=pf.sampler, engine=cfg.engine,
                              vllm_cfg=cfg.vllm)
    return model_dir, data_dir


def eval_settings(cfg, task) -> dict:
    """Resolved held-out evaluation: splits, prompts, samples (mean@n), temperature, top-p."""
    e, spec = cfg.eval, getattr(task, "eval",
                                None) or task_spec(cfg.task, cfg.include_path).get("eval") or {}
    splits = e.splits or spec.get("splits") or ["test"]
    return {"splits": list(splits), "prompts": e.prompts
            or (None if hasattr(task, "source") else 128),
            "samples": e.samples or int(spec.get("n", 1)),
            "temperature": e.temperature
            or float(spec.get("temperature", cfg.sampling.temperature)),
            "top_p": e.top_p or float(spec.get("top_p", cfg.sampling.top_p))}
