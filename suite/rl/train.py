"""One RL run: set-up, the steps, teardown. The step itself is suite/rl/step.py, read top to bottom:
sample (sampler, low precision, KV cache) -> reward -> group-relative advantage -> trainer log-probs
of the same tokens at the same parameters -> mismatch metrics -> loss and optimizer updates -> sync
the sampler.

Determinism and resume: the prompts and the sampling seed of step s are pure functions of
(seed, s), and the checkpoint holds the master weights, AdamW and the loss scaler, so a run
killed anywhere and rerun with the same command continues from its last checkpoint and
ends with a ``metrics.jsonl`` byte-identical to an uninterrupted run (CPU, same threads).
Wall-clock figures live in ``timing.jsonl`` for that reason.
"""

from __future__ import annotations

import dataclasses
import json
import traceback
from pathlib import Path

import torch
from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TextColumn,
    TimeElapsedColumn,
)

from suite import dist, results
from suite.numerics import determinism, flops, fp4, fp8, machine
from suite.numerics.engine import TorchEngine
from suite.numerics.flows import kv_quant
from suite.numerics.perturbation import Perturbation
from suite.numerics.precision import gemm_backend, resolve
from suite.packed import read_log
from suite.results import (
    REFERENCE_ROOT,
    append_jsonl,
    atomic_write_json,
    atomic_write_text,
    config_hash,
    run_dir_name,
    truncate_jsonl,
)
from suite.rl import checkpoint, data, loggers, perfectible, plan, recipe, staleness
from suite.rl import config as cfgmod
from suite.rl.checkpoint import CorruptCheckpoint  # noqa: F401 -- re-exported: a run's error type
from suite.rl.env_record import env_info
from suite.rl.policy import BUILD_THREADS, load_policy
from suite.rl.provenance import same_experiment
from suite.rl.step import Run, rl_step, sync
from suite.tasks.registry import get_task


class RunDirConflict(ValueError):
    """The run directory holds a run of a different config."""


# ---- run directory, checkpoints -------------------------------------------------------------
def claim_run_dir(run_dir: Path, cfg_dict: dict, origins: dict | None = None) -> None:
    """Create the run dir, or check that an existing one holds this very config; ``origins``
    (config.load_layers) is recorded beside the config as ``config_origins``, outside the hash."""
    path = run_dir / "config.json"
    if path.exists():
        old = json.loads(path.read_text())
        if same_experiment(old, cfg_dict):
            return
        if read_log(run_dir, "metrics.jsonl", missing_ok=True) or (run_dir / "ckpt").exists():
            diff = _diff(old.get("config", {}), cfg_dict)
            raise RunDirConflict(f"{run_dir} holds a run of a different config ({diff}); "
                                 f"choose another name=..., or delete that directory")
        # A run that stopped before its first step (bad input found late) holds no result: the
        # corrected rerun takes its folder, and the failed attempt's record goes.
        for stale in ("summary.json", "error.txt"):
            (run_dir / stale).unlink(missing_ok=True)
    run_dir.mkdir(parents=True, exist_ok=True)
    atomic_write_json(path, {"config_hash": config_hash(cfg_dict), "config": cfg_dict,
                             **({"config_origins": origins} if origins else {})})


def _diff(a: dict, b: dict, prefix: str = "") -> str:
    for k in sorted((set(a) | set(b)) - (set() if prefix else {"out", "name"})):  # where, not what
        if isinstance(a.get(k), dict) and isinstance(b.get(k), dict):
            if d := _diff(a[k], b[k], prefix + k + "."):
                return d
        elif a.get(k) != b.get(k):
            return f"{prefix}{k}: {a.get(k)!r} there, {b.get(k)!r} now"
    return "" if prefix else "same values, different hash"


# ---- the run ---------------------------------------------------------------------------------
def build_trainer(cfg, model, world: dist.World | None = None):
    """The trainer alone (the KL reference needs no sampler: building one would start a second vLLM
    engine)."""
    from suite.numerics.trainer import Trainer, TrainerOptions

    flow, world = resolve(cfg.precision), world or dist.World()
    backend = gemm_backend(cfg.gemm, flow.trainer_dtype, world.device.split(":")[0])
    options = {f.name: getattr(cfg, f.name) for f in dataclasses.fields(TrainerOptions)
               if f.name != "kv_quant"}
    return Trainer(model, flow, backend, cfg.optim,
                   TrainerOptions(**options, kv_quant=kv_quant(cfg.kv_cache)), world)


def build_engines(cfg, model, world: dist.World | None = None):
    """Trainer and sampler of a run (on this rank's device), configured from the precision table and
    nothing else."""
    flow, world = resolve(cfg.precision), world or dist.World()
    device = world.device.split(":")[0]
    backends = {"trainer": gemm_backend(cfg.gemm, flow.trainer_dtype, device),
                "sampler": gemm_backend(cfg.gemm, flow.sampler_dtype, device)}
    trainer = build_trainer(cfg, model, world)
    if cfg.routing_replay and trainer.routing is None:  # a given model: only known once loaded
        raise ValueError("routing_replay: the policy has no mixture-of-experts layers to replay")
    # vLLM starts from the policy's directory; sync() then loads the trainer's weights
    if cfg.engine == "vllm":
        from suite.numerics.vllm_engine import VllmEngine

        if not model.name_or_path:
            raise ValueError("engine=vllm: the policy must be loaded from a directory "
                             "(load_policy), vLLM starts from it")
        backends["sampler"] = "vllm"
        return trainer, VllmEngine(model.name_or_path, flow, cfg.vllm, seed=cfg.seed, world=world,
                                   kv_cache=cfg.kv_cache, truncating=cfg.sampling.top_p < 1
                                   or cfg.sampling.top_k > 0,
                                   head_logprobs=cfg.algo.score_centering_topk or 0), backends
    engine = TorchEngine(model.config, flow.sampler_dtype, backends["sampler"],
                         lm_head_fp32=cfg.lm_head_fp32, functional_cache=flow.exact,
                         quant=flow.sampler_quant, device=world.device,
                         perturbation=Perturbation(cfg.inject.kind, cfg.inject.scale,
                                                   cfg.inject.threshold),
                         kv_quant=kv_quant(cfg.kv_cache))
    return trainer, engine, backends


def run(cfg, console: Console | None = None, origins: dict | None = None) -> Path:
    """Run (or resume) one RL run; return its directory. ``cfg`` must be resolved and validated.

    Under torchrun or srun (suite/dist.py) every rank calls this; rank 0 alone writes the bundle.
    A config whose memory plan exceeds this rank's device is refused first (suite/rl/plan.py;
    plan.check=false).
    """
    # before any CUDA work: cuBLAS reads its setting once
    with determinism.enabled(cfg.deterministic):
        # refused before any compute when the memory plan exceeds this rank's device
        plan.check_rank(cfg)
        world = dist.init(cfg.nproc, cfg.nnodes)
        try:
            return _run(cfg, world, console or Console(), origins)
        finally:
            dist.close(world)


def _run(cfg, world: dist.World, console: Console, origins: dict | None = None) -> Path:
    torch.set_num_threads(cfg.threads)
    console = console if world.main else Console(quiet=True)
    # before the folder is taken
    task, algo = get_task(cfg.task, cfg.data, cfg.include_path), recipe.algorithm(cfg)
    run_dir = Path(cfg.out) / cfg.name / run_dir_name(cfg.task, cfg.algorithm, cfg.precision,
                                                      cfg.seed)
    if _claim(cfg, run_dir, world, origins):
        console.print(f"{run_dir}: already complete")
        return run_dir
    error, mirrors, engines = None, None, []
    try:
        r, start = setup(cfg, task, algo, world, console, run_dir, engines)
        mirrors = (loggers.Mirrors(cfg.logger, run_dir, cfgmod.to_dict(cfg),
                                   json.loads((run_dir / "env.json").read_text()), cfg.name, start,
                                   console) if world.main and cfg.logger else None)
        progress = Progress(TextColumn("[bold]{task.description}"), BarColumn(),
                            MofNCompleteColumn(), TimeElapsedColumn(), console=console,
                            transient=True, disable=not world.main)
        with progress:
            bar = progress.add_task(run_dir.name, total=cfg.steps, completed=start)
            for step in range(start + 1, cfg.steps + 1):
                row, mech, timing = rl_step(r, step)
                if world.main:
                    append_jsonl(run_dir / "metrics.jsonl", row)
                    append_jsonl(run_dir / "timing.jsonl", timing)
                    append_jsonl(run_dir / "mechanism.jsonl", mech)
                    if mirrors:
                        mirrors.log(row)
                if step % cfg.ckpt_every == 0 or step == cfg.steps:
                    checkpoint.save(run_dir, step, r.trainer, world, keep_last=cfg.keep_last)
                progress.advance(bar)
                console.print(_line(row, timing))
        if cfg.steps > start or not (run_dir / "policy").exists():
            # the final policy, for transfer and users
            checkpoint.export_hf(run_dir / "policy", r.trainer, r.tok, world)
    except BaseException as e:  # a kill or a crash still leaves an honest "incomplete" summary
        error = f"{type(e).__name__}: {e}"
        if world.main:
            atomic_write_text(run_dir / "error.txt", traceback.format_exc())
        raise
    finally:
        # the next run (a sweep's next cell in this process) starts on a freed device
        for e in engines:
            if hasattr(e, "close"):
                e.close()
        if world.main:
            write_summary(run_dir, cfg, error)
        if mirrors:
            mirrors.close()
    # lm-eval transfer index of base vs final checkpoint; never fails the finished run
    if cfg.transfer and world.main:
        from suite.rl.evaluate import after_run

        after_run(run_dir, console)
    return run_dir


def _claim(cfg, run_dir: Path, world: dist.World, origins: dict | None) -> bool:
    """Take the run directory (rank 0); return whether it already holds this run, complete."""
    summary_path = run_dir / "summary.json"
    complete = (summary_path.exists()
                and json.loads(summary_path.read_text()).get("verdict") != "incomplete")
    if not complete and run_dir.resolve().is_relative_to(REFERENCE_ROOT):
        raise RunDirConflict(f"out: {run_dir} is inside the committed reference results "
                             f"({REFERENCE_ROOT}), which runs never write; run elsewhere (default "
                             "out=runs) and promote a finished grid with `suite reference`")
    if world.main:
        claim_run_dir(run_dir, cfgmod.to_dict(cfg), origins)
    return dist.broadcast_object(complete, world)


# ---- set-up: data, policy, engines, the checkpoint to resume from, the first sync
# -----------------------------------
def setup(cfg, task, algo, world: dist.World, console: Console, run_dir: Path,
          engines: list) -> tuple[Run, int]:
    """Everything a step reads, and the step to resume after (0: a new run). ``engines`` collects
    what the caller must close, even when set-up fails half way."""
    model_dir, data_dir = _build_data(cfg, world, console)
    items, prov = perfectible.load(data_dir, cfg.perfectible.max_prompts)
    if len(items) < cfg.prompts_per_step:
        raise ValueError(perfectible.too_few(prov, len(items), cfg))
    model, tok = load_policy(model_dir)
    n_matmul = flops.matmul_params(model)  # before sharding
    trainer, engine, backends = build_engines(cfg, model, world)
    engines.append(engine)  # a vLLM engine holds GPU memory until it is shut down
    # One sampler per rank, or per group of tp consecutive ranks (vLLM tensor parallel under its
    # external launcher: vLLM's DP rank is RANK // tp); each samples an equal share of the prompt
    # groups.
    tp = cfg.vllm.tensor_parallel_size if cfg.engine == "vllm" and world.distributed else 1
    share = cfg.prompts_per_step // (world.size // tp)  # config.validate: exact
    r = Run(cfg, world, task, algo, items, tok, model, trainer, engine,
            history=staleness.WeightHistory(cfg.staleness),
            # also on resume
            ref=build_trainer(cfg, load_policy(model_dir)[0], world) if cfg.algo.kl_coef else None,
            stale=build_trainer(cfg, load_policy(model_dir)[0], world) if cfg.staleness else None,
            groups=list(range(world.rank // tp * share, (world.rank // tp + 1) * share)), tp=tp,
            n_matmul=n_matmul, reward_seen=task.reward_stats() if hasattr(task, "reward_stats")
            else {})
    start = checkpoint.load(run_dir, trainer, world)
    for name in ("metrics.jsonl", "timing.jsonl", "mechanism.jsonl"):
        if world.main and (run_dir / name).exists():
            truncate_jsonl(run_dir / name, start)
    sync(r)  # every quantised weight checked once; then a few per step (suite/numerics/refit.py)
    observed = trainer.observe()
    if world.main:
        atomic_write_json(run_dir / "env.json",
                          env_info(_env(cfg, r, backends, observed, data_dir, prov, model_dir)))
    return r, start


def _build_data(cfg, world: dist.World, console: Console) -> tuple[Path, Path]:
    """The base policy and its perfectible set: one build per node (the cache is per machine), the
    other ranks read it; a failed build stops every rank, not only the builder."""
    built = failed = None
    if world.local_rank == 0:
        try:
            built = (data.prepare_data_outside_world(cfg, console) if world.distributed
                     and cfg.engine == "vllm"
                     else data.prepare_data(cfg, console))
        except Exception as e:
            failed = e
    dist.barrier(world, patient=True)  # a build may take hours: BUILD_TIMEOUT_S
    if dist.any_rank(failed is not None, world):
        raise failed or RuntimeError("building the base policy or perfectible set failed on "
                                     "another node; see the log of its local rank 0")
    return built or data.prepare_data(cfg, console)


def _env(cfg, r: Run, backends: dict, observed: dict, data_dir: Path, prov: dict,
         model_dir: Path) -> dict:
    """env.json: what this run computed with (the precision table's row, the kernels seen, the
    data)."""
    flow, trainer, engine = resolve(cfg.precision), r.trainer, r.engine
    return {
        "machine_class": machine.describe(cfg.gemm, cfg.threads),
        "precision": flow.describe(), "gemm_backend": backends, "lm_head_fp32": cfg.lm_head_fp32,
        "engine": cfg.engine, "sampler_dtype": str(engine.dtype),
        "trainer_compute_dtype": str(trainer.dtype),
        **({"kv_cache": cfg.kv_cache} if cfg.kv_cache != "auto" else {}),
        "trainer_observed": observed, "world": r.world.describe(),
        "determinism": determinism.describe(cfg.deterministic),
        **({"fp8_gemm": fp8.gemm_path(trainer.device)}
           if "fp8" in (flow.trainer_quant, flow.sampler_quant)
           else {"fp4_gemm": fp4.gemm_path(trainer.device)} if flow.fp4 else {}),
        "task": {"name": r.task.name, "version": r.task.version},
        "dataset": {"path": str(data_dir), "sha256": prov["dataset_sha256"],
                    "prompts": len(r.items), "build_threads": BUILD_THREADS, "provenance": prov},
        "policy": {"path": str(model_dir), "params": sum(p.numel() for p in r.model.parameters())},
    }


def write_summary(run_dir: Path, cfg, error: str | None) -> dict:
    return results.write_summary(run_dir, cfgmod.to_dict(cfg), error)


def _line(row: dict, timing: dict) -> str:
    return (f"step {row['step']:4d}  reward {row['reward/mean']:.3f}  len "
            f"{row['response/length/mean']:5.1f}  ent {row['entropy/mean']:.3f}  k3 "
            f"{row['mismatch/kl_k3']:.2e}  |dp| {row['mismatch/prob_diff/mean']:.2e}  |seq lr| "
            f"{row['mismatch/seq_log_ratio/mean_abs']:.2e}  gnorm {row['train/grad_norm']:.3f}  "
            f"scale {row['train/loss_scale']:.0f}  {timing['time/step_s']:.2f}s (sample "
            f"{timing['time/sample_s']:.2f})")
