"""One RL run: the loop a reader should find in ten seconds.

Each step reads top to bottom: sample (sampler, low precision, KV cache) -> reward ->
group-relative advantage -> trainer log-probs of the same tokens at the same parameters ->
mismatch metrics -> loss and optimizer updates -> sync the sampler -> log and checkpoint.

Determinism and resume: the prompts and the sampling seed of step s are pure functions of
(seed, s), and the checkpoint holds the master weights, AdamW and the loss scaler, so a run
killed anywhere and rerun with the same command continues from its last checkpoint and
ends with a ``metrics.jsonl`` byte-identical to an uninterrupted run (CPU, same threads).
Wall-clock figures live in ``timing.jsonl`` for that reason.
"""

from __future__ import annotations

import functools
import hashlib
import json
import time
import traceback
from pathlib import Path

import numpy as np
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
from suite.numerics import determinism, flops, fp4, fp8, machine, moe, refit
from suite.numerics.centering import SamplerDist
from suite.numerics.engine import Rollout, TorchEngine, left_pad
from suite.numerics.sampling import sequence_seeds
from suite.numerics.flows import kv_quant
from suite.numerics.mismatch import (length_bias, mechanism_metrics, mismatch_anatomy,
                                     mismatch_metrics, ratio_band_fractions)
from suite.numerics.perturbation import Perturbation
from suite.numerics.precision import gemm_backend, resolve
from suite.packed import read_log
from suite.results import (
    REFERENCE_ROOT,
    append_jsonl,
    atomic_write_json,
    atomic_write_text,
    config_hash,
    env_info,
    run_dir_name,
    truncate_jsonl,
)
from suite.rl import checkpoint, data, loggers, perfectible, plan, recipe, staleness
from suite.rl import config as cfgmod
from suite.rl.algos import compute_advantages, gap_clip_fraction, policy_loss, regularised_loss
from suite.rl.checkpoint import CorruptCheckpoint  # noqa: F401 -- re-exported: a run's error type
from suite.rl.policy import BUILD_THREADS, load_policy
from suite.rl.provenance import same_experiment
from suite.tasks.registry import get_task, grade, prompt_ids


class RunDirConflict(ValueError):
    """The run directory holds a run of a different config."""


def evaluate(engine, tok, task, settings: dict, max_new_tokens: int, seed: int,
             world: dist.World | None = None, tp: int = 1, workers: int = 1) -> dict[str, float]:
    """Held-out accuracy with the run's own sampler: eval/<split>/mean@<n> = mean reward over n samples
    per prompt (AIME mean@32 at temperature 0.6, top-p 0.95 for sanity_r1d, as published), graded by ``workers``.

    ``world``: vLLM engines of a data-parallel world step together (vLLM's DP lockstep), so every rank
    evaluates: each sampler (a rank, or a group of ``tp`` ranks) takes a slice of every batch with the
    per-request seeds a single engine would draw for it, and the rewards are gathered."""
    out, n = {}, settings["samples"]
    gen = torch.Generator().manual_seed(seed)
    for split in settings["splits"]:
        items = task.split(split, settings["prompts"] and min(settings["prompts"], len(task.split(split))))
        prompts = [prompt_ids(tok, it) for it in items for _ in range(n)]
        rewards, size = [], engine.max_batch or max(len(prompts), 1)  # built-in engine: 256 (dense cache); vLLM: all
        for i in range(0, len(prompts), size):
            chunk, rows = prompts[i:i + size], list(range(i, min(i + size, len(prompts))))
            seeds = gen
            if world is not None and world.distributed:  # = VllmEngine.generate's draw (the same in any batching)
                seeds = torch.randint(0, 2**31 - 1, (len(chunk),), generator=gen)
                part = torch.arange(len(chunk)).tensor_split(world.size // tp)[world.rank // tp]
                rows, chunk, seeds = [i + int(k) for k in part], [chunk[int(k)] for k in part], seeds[part]
            # Graded as text: no per-token log-probs (vLLM applies the published top-p itself).
            roll = engine.generate(chunk, max_new_tokens, settings["temperature"],
                                   settings["top_p"], seeds, logprobs=False)
            texts = tok.batch_decode(roll.response_ids(), skip_special_tokens=True)
            mine = grade(task, [items[r // n] for r in rows], texts, roll.truncated, workers)  # as the rollouts are
            if world is not None and world.distributed:
                mine = [x for part in dist.gather_objects(mine, world)[::tp] for x in part]
            rewards += mine
        out[f"eval/{split}/mean@{n}"] = sum(rewards) / len(rewards)
    return out


def step_prompts(n: int, step: int, per_step: int, seed: int) -> list[int]:
    """Indices of the prompts of ``step`` (1-based): epochs of seeded permutations, no state."""
    out, start = [], (step - 1) * per_step
    for i in range(start, start + per_step):
        epoch, j = divmod(i, n)
        perm = torch.randperm(n, generator=torch.Generator().manual_seed(seed * 100_003 + epoch))
        out.append(int(perm[j]))
    return out


def micro_batches(idx: torch.Tensor, size: int | None) -> list[torch.Tensor]:
    """Split row indices into micro-batches of at most ``size`` rows (None: one batch)."""
    return list(idx.split(size)) if size else [idx]


def accumulation_weights(micro: list[torch.Tensor], mask: torch.Tensor, agg: str,
                         whole: torch.Tensor | None = None) -> list[float]:
    """Weights that make the sum of micro-batch losses equal the minibatch loss (gradient accumulation):
    each micro-batch's share of the tokens for token-mean, of the sequences for the seq-mean modes.
    ``whole``: the rows of the global minibatch when ``micro`` is only this rank's part of it (the
    ranks' weights then sum to 1 and their gradients are summed)."""
    def size(rows):
        return float(mask[rows].sum()) if agg == "token-mean" else float(len(rows))
    total = size(whole) if whole is not None else sum(size(c) for c in micro)
    return [size(c) / (total or 1.0) for c in micro]


def batch_tensors(prompt_ids: list[list[int]], tokens: torch.Tensor, mask: torch.Tensor):
    """Left-padded prompts + right-padded responses -> ids, attention mask (B, P+R)."""
    ids, valid = left_pad(prompt_ids)
    return torch.cat([ids, tokens], 1), torch.cat([valid.long(), mask.long()], 1)


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
        # A run that stopped before its first step (bad input found late) holds no result: the corrected rerun takes
        # its folder, and the failed attempt's record goes.
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
    """The trainer alone (the KL reference needs no sampler: building one would start a second vLLM engine)."""
    from suite.numerics.trainer import Trainer

    flow, world = resolve(cfg.precision), world or dist.World()
    backend = gemm_backend(cfg.gemm, flow.trainer_dtype, world.device.split(":")[0])
    return Trainer(model, flow, backend, cfg.optim, lm_head_fp32=cfg.lm_head_fp32, world=world,
                   gradient_checkpointing=cfg.gradient_checkpointing, logprob_chunk=cfg.logprob_chunk, packing=cfg.packing,
                   kv_quant=kv_quant(cfg.kv_cache), trim_padding=cfg.trim_padding, defer_grad_sync=cfg.defer_grad_sync)


def build_engines(cfg, model, world: dist.World | None = None):
    """Trainer and sampler of a run (on this rank's device), configured from the precision table and nothing else."""
    flow, world = resolve(cfg.precision), world or dist.World()
    device = world.device.split(":")[0]
    backends = {"trainer": gemm_backend(cfg.gemm, flow.trainer_dtype, device),
                "sampler": gemm_backend(cfg.gemm, flow.sampler_dtype, device)}
    trainer = build_trainer(cfg, model, world)
    if cfg.routing_replay and trainer.routing is None:  # a given model: only known once loaded
        raise ValueError("routing_replay: the policy has no mixture-of-experts layers to replay")
    if cfg.engine == "vllm":  # vLLM starts from the policy's directory; sync() then loads the trainer's weights
        from suite.numerics.vllm_engine import VllmEngine

        if not model.name_or_path:
            raise ValueError("engine=vllm: the policy must be loaded from a directory (load_policy), vLLM starts from it")
        backends["sampler"] = "vllm"
        return trainer, VllmEngine(model.name_or_path, flow, cfg.vllm, seed=cfg.seed, world=world, kv_cache=cfg.kv_cache,
                                   truncating=cfg.sampling.top_p < 1 or cfg.sampling.top_k > 0,
                                   head_logprobs=cfg.algo.score_centering_topk or 0), backends
    engine = TorchEngine(model.config, flow.sampler_dtype, backends["sampler"], lm_head_fp32=cfg.lm_head_fp32,
                         functional_cache=flow.exact, quant=flow.sampler_quant, device=world.device,
                         perturbation=Perturbation(cfg.inject.kind, cfg.inject.scale, cfg.inject.threshold),
                         kv_quant=kv_quant(cfg.kv_cache))
    return trainer, engine, backends


def run(cfg, console: Console | None = None, origins: dict | None = None) -> Path:
    """Run (or resume) one RL run; return its directory. ``cfg`` must be resolved and validated.

    Under torchrun or srun (suite/dist.py) every rank calls this; rank 0 alone writes the bundle.
    A config whose memory plan exceeds this rank's device is refused first (suite/rl/plan.py; plan.check=false).
    """
    with determinism.enabled(cfg.deterministic):  # before any CUDA work: cuBLAS reads its setting once
        plan.check_rank(cfg)  # refused before any compute when the memory plan exceeds this rank's device
        world = dist.init(cfg.nproc, cfg.nnodes)
        try:
            return _run(cfg, world, console or Console(), origins)
        finally:
            dist.close(world)


def _run(cfg, world: dist.World, console: Console, origins: dict | None = None) -> Path:
    torch.set_num_threads(cfg.threads)
    if not world.main:
        console = Console(quiet=True)
    flow, algo, task = resolve(cfg.precision), recipe.algorithm(cfg), get_task(cfg.task, cfg.data, cfg.include_path)
    cfg_dict = cfgmod.to_dict(cfg)
    run_dir = Path(cfg.out) / cfg.name / run_dir_name(cfg.task, cfg.algorithm, cfg.precision, cfg.seed)
    summary_path = run_dir / "summary.json"
    complete = summary_path.exists() and json.loads(summary_path.read_text()).get("verdict") != "incomplete"
    if not complete and run_dir.resolve().is_relative_to(REFERENCE_ROOT):
        raise RunDirConflict(f"out: {run_dir} is inside the committed reference results ({REFERENCE_ROOT}), which runs "
                             "never write; run elsewhere (default out=runs) and promote a finished grid with `suite reference`")
    if world.main:
        claim_run_dir(run_dir, cfg_dict, origins)
    if dist.broadcast_object(complete, world):
        console.print(f"{run_dir}: already complete")
        return run_dir

    error, mirrors, engines = None, None, []
    try:
        built = failed = None
        if world.local_rank == 0:  # one build per node (the cache is per machine), the other ranks read it
            try:
                built = (data.prepare_data_outside_world(cfg, console) if world.distributed and cfg.engine == "vllm"
                         else data.prepare_data(cfg, console))
            except Exception as e:
                failed = e
        dist.barrier(world, patient=True)  # a build may take hours: BUILD_TIMEOUT_S
        if dist.any_rank(failed is not None, world):  # a failed build stops every rank, not only the builder
            raise failed or RuntimeError("building the base policy or perfectible set failed on another node; see "
                                         "the log of its local rank 0")
        model_dir, data_dir = built or data.prepare_data(cfg, console)
        items, prov = perfectible.load(data_dir, cfg.perfectible.max_prompts)
        if len(items) < cfg.prompts_per_step:
            raise ValueError(perfectible.too_few(prov, len(items), cfg))
        model, tok = load_policy(model_dir)
        n_matmul = flops.matmul_params(model)  # before sharding
        trainer, engine, backends = build_engines(cfg, model, world)
        engines.append(engine)  # closed in `finally`: a vLLM engine holds GPU memory until it is shut down
        # The KL reference: the starting policy, frozen, scored with the trainer's numerics (also on resume).
        ref = build_trainer(cfg, load_policy(model_dir)[0], world) if cfg.algo.kl_coef else None
        # Asynchronous rollouts (staleness k > 0): the weight history, and a scoring-only trainer at the sampling weights
        history = staleness.WeightHistory(cfg.staleness)
        then = build_trainer(cfg, load_policy(model_dir)[0], world) if cfg.staleness else None
        start = checkpoint.load(run_dir, trainer, world)
        for name in ("metrics.jsonl", "timing.jsonl", "mechanism.jsonl"):
            if world.main and (run_dir / name).exists():
                truncate_jsonl(run_dir / name, start)
        engine.sync(synced := history.push(trainer.full_weights()))
        refit.check(engine, synced)  # every quantised weight once; then a few per step (suite/numerics/refit.py)
        if then is not None:
            then.model.load_state_dict(history.snaps[0])
        observed = trainer.observe()
        if world.main:
            atomic_write_json(run_dir / "env.json", env_info({
                "machine_class": machine.describe(cfg.gemm, cfg.threads),
                "precision": flow.describe(), "gemm_backend": backends, "lm_head_fp32": cfg.lm_head_fp32,
                "engine": cfg.engine, "sampler_dtype": str(engine.dtype), "trainer_compute_dtype": str(trainer.dtype),
                **({"kv_cache": cfg.kv_cache} if cfg.kv_cache != "auto" else {}),
                "trainer_observed": observed, "world": world.describe(),
                "determinism": determinism.describe(cfg.deterministic),
                **({"fp8_gemm": fp8.gemm_path(trainer.device)} if "fp8" in (flow.trainer_quant, flow.sampler_quant)
                   else {"fp4_gemm": fp4.gemm_path(trainer.device)} if flow.fp4 else {}),
                "task": {"name": task.name, "version": task.version},
                "dataset": {"path": str(data_dir), "sha256": prov["dataset_sha256"], "prompts": len(items),
                            "build_threads": BUILD_THREADS, "provenance": prov},
                "policy": {"path": str(model_dir), "params": sum(p.numel() for p in model.parameters())},
            }))
        mirrors = (loggers.Mirrors(cfg.logger, run_dir, cfg_dict, json.loads((run_dir / "env.json").read_text()),
                                   cfg.name, start, console) if world.main and cfg.logger else None)

        G, T = cfg.samples_per_prompt, cfg.sampling.temperature
        # score centering: the sampler records its next-token distribution, whole or its top-k head
        centering = ({"keep_dist": True, "dist_topk": cfg.algo.score_centering_topk or 0}
                     if cfg.algo.score_centering else {})
        # One sampler per rank, or per group of tp consecutive ranks (vLLM tensor parallel under its
        # external launcher: vLLM's DP rank is RANK // tp); each samples an equal share of the prompt groups.
        tp = cfg.vllm.tensor_parallel_size if cfg.engine == "vllm" and world.distributed else 1
        share = cfg.prompts_per_step // (world.size // tp)  # config.validate: exact
        mine = list(range(world.rank // tp * share, (world.rank // tp + 1) * share))
        reward_seen = task.reward_stats() if hasattr(task, "reward_stats") else {}
        progress = Progress(TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(),
                            TimeElapsedColumn(), console=console, transient=True, disable=not world.main)
        with progress:
            bar = progress.add_task(run_dir.name, total=cfg.steps, completed=start)
            for step in range(start + 1, cfg.steps + 1):
                t0 = time.perf_counter()
                # ---- sample: this rank's prompt groups, G responses each; a sequence's seed is a function of
                # (seed, step, group, sample) only, so every world size samples the same tokens
                batch = [items[i] for i in step_prompts(len(items), step, cfg.prompts_per_step, cfg.seed)]
                prompts = [prompt_ids(tok, batch[g]) for g in mine for _ in range(G)]
                mine_roll = engine.generate(prompts, cfg.sampling.max_new_tokens, T, cfg.sampling.top_p,
                                            sequence_seeds(cfg.seed, step, mine, G),
                                            top_k=cfg.sampling.top_k, **centering)
                texts = tok.batch_decode(mine_roll.response_ids(), skip_special_tokens=True)
                mine_rewards = grade(task, [batch[mine[i // G]] for i in range(len(texts))], texts,
                                     mine_roll.truncated, cfg.reward_workers)
                t_sample = time.perf_counter()

                # ---- reward and group-relative advantage, over the gathered global batch (groups stay whole)
                gathered = dist.gather_objects((mine_roll, mine_rewards), world)[::tp]  # one copy per TP group
                roll = Rollout.concat([r for r, _ in gathered])
                rewards = torch.tensor([x for _, rs in gathered for x in rs])
                adv = compute_advantages(rewards.view(-1, G), algo.advantage).view(-1)  # (B,)

                # ---- trainer log-probs of the sampled tokens at the sampling parameters (each rank its rows)
                ids, attn = batch_tensors(roll.prompt_ids, roll.tokens, roll.mask)
                B, R = len(ids), roll.tokens.shape[1]
                own = torch.arange(B).tensor_split(world.size)[world.rank]
                # MoE: the sampler's experts, replayed in every trainer forward of this rollout (routing_replay)
                replay = roll.routes if cfg.routing_replay else None
                # truncated sampling: the sampler's kept ids, which the trainer renormalises over (sampling.truncation)
                kept = roll.kept if cfg.sampling.truncation == "renormalise" else None

                # score centering: the sampler's distribution at each response position
                centre = SamplerDist(roll.dist, roll.dist_ids) if cfg.algo.score_centering else None

                def keep(c):
                    return None if kept is None else kept[c]
                flips = []  # MoE: share of (position, layer) whose expert set the trainer chose differently
                with torch.no_grad():  # in micro-batches: (B, R, vocab) fp32 logits of a real model do not fit at once
                    parts = []
                    for c in micro_batches(own, cfg.micro_batch):
                        parts.append(tuple(t.cpu() for t in trainer.logprobs(ids[c], attn[c], R, roll.tokens[c], T,
                                                                             None if replay is None else replay[c],
                                                                             keep(c))))
                        chosen = trainer.chosen_routes(len(c)) if roll.routes is not None else None
                        if chosen is not None:
                            flips.append(moe.flip_fraction(roll.routes[c], chosen, attn[c].bool()))
                    parts = [p for rank_parts in dist.gather_objects(parts, world) for p in rank_parts]
                    old_logp, entropy = torch.cat([a for a, _ in parts]), torch.cat([b for _, b in parts])  # (B, R)
                    if ref is not None:
                        parts = [ref.logprobs(ids[c], attn[c], R, roll.tokens[c], T, kept=keep(c))[0].cpu()
                                 for c in micro_batches(own, cfg.micro_batch)]
                        ref_logp = torch.cat([p for rank_parts in dist.gather_objects(parts, world) for p in rank_parts])
                    if then is not None:  # the trainer's numerics at the sampling weights (one rank: config.validate)
                        then_logp = torch.cat([then.logprobs(ids[c], attn[c], R, roll.tokens[c], T, kept=keep(c))[0].cpu()
                                               for c in micro_batches(own, cfg.micro_batch)])
                t_logp = time.perf_counter()

                # ---- mismatch: sampler (mu) vs trainer (pi) on the same tokens, before any update
                row = {"step": step, **mismatch_metrics(old_logp, roll.logprobs, roll.mask),
                       **mismatch_anatomy(old_logp, roll.logprobs, roll.mask, entropy)}
                gap_clip = (gap_clip_fraction(old_logp, roll.logprobs, adv, roll.mask, algo.clip_low, algo.clip_high)
                            if algo.surrogate == "ppo" else None)
                if gap_clip is not None and cfg.algo.ppo_ref == "sampler":  # what the gap alone clips
                    row["ppo/clip_frac_gap"] = gap_clip
                # every run, any algorithm: raw IS weights, lengths, entropy by position, and the share PPO's clip
                # would zero at the first update with the sampler's denominator (counterfactual under ppo_ref=trainer)
                if then is not None:
                    row.update(staleness.split(old_logp, then_logp, roll.logprobs, roll.mask))
                mech = {"step": step, **mechanism_metrics(old_logp, roll.logprobs, roll.mask, entropy),
                        **ratio_band_fractions(old_logp, roll.logprobs, roll.mask),
                        **length_bias(old_logp, roll.logprobs, roll.mask),
                        **({"mech/kept_mass/mean": float(roll.kept_mass[roll.mask.bool()].mean())}
                           if roll.kept_mass is not None else {}),
                        **({"mech/gap_clip_frac": gap_clip} if gap_clip is not None else {}),
                        **({"mech/moe/route_flip_frac": float(np.nanmean(flips))} if flips else {})}

                # ---- updates: minibatches of the rollout batch, one PPO epoch; each rank takes an equal share
                # of every minibatch and the gradients are summed over ranks (suite/numerics/trainer.py)
                gen = torch.Generator().manual_seed(cfg.seed * 1_000_003 + step)
                perm = torch.randperm(B, generator=gen)
                dev = trainer.device
                # The ratio's denominator: the trainer's recomputed log-probs, or the sampler's (algo.ppo_ref).
                denom = roll.logprobs if cfg.algo.ppo_ref == "sampler" else old_logp
                old_d, mu_d, adv_d, mask_d = (t.to(dev) for t in (denom, roll.logprobs, adv, roll.mask))
                ref_d = ref_logp.to(dev) if ref is not None else None
                updates = []
                for u, mb in enumerate(perm.chunk(cfg.updates_per_step)):
                    def loss_fn(c):
                        logp, ent, *expected = trainer.logprobs(
                            ids[c], attn[c], R, roll.tokens[c], T,
                            None if replay is None else replay[c], keep(c),
                            centre=None if centre is None else centre[c])
                        loss, metrics = policy_loss(algo, logp, old_d[c], mu_d[c], adv_d[c], mask_d[c],
                                                    norm_len=cfg.sampling.max_new_tokens,
                                                    expected_logp=expected[0] if expected else None)
                        loss, extra = regularised_loss(loss, logp, ent, None if ref_d is None else ref_d[c], mask_d[c],
                                                       algo.agg, cfg.sampling.max_new_tokens, cfg.algo.kl_coef,
                                                       cfg.algo.kl_estimator, cfg.algo.entropy_coef)
                        return loss, {**metrics, **extra}
                    lr = cfg.optim.lr * recipe.lr_factor((step - 1) * cfg.updates_per_step + u,
                                                         cfg.steps * cfg.updates_per_step, cfg.optim.warmup_steps,
                                                         cfg.optim.schedule)
                    trainer.set_lr(lr)
                    micro = micro_batches(mb.tensor_split(world.size)[world.rank], cfg.micro_batch)
                    weights = accumulation_weights(micro, roll.mask, algo.agg, whole=mb)
                    updates.append(trainer.step([(functools.partial(loss_fn, c), w) for c, w in zip(micro, weights)]))
                engine.sync(synced := history.push(trainer.full_weights()))  # after the optimizer steps (k old)
                refit.check(engine, synced, refit.rotating(engine, step))
                if then is not None:
                    then.model.load_state_dict(history.snaps[0])
                t_update = time.perf_counter()

                # ---- log (rank 0; every number is the global one)
                lengths = roll.mask.sum(1)
                m = roll.mask.bool()
                rates = rewards.view(-1, G).mean(1)
                row.update({
                    "reward/mean": float(rewards.mean()),
                    "reward/pass_rates": [round(float(r), 6) for r in rates],
                    "reward/all_solved_frac": float((rates == 1).float().mean()),
                    "reward/none_solved_frac": float((rates == 0).float().mean()),
                    "response/length/mean": float(lengths.mean()), "response/length/max": float(lengths.max()),
                    "response/truncated_frac": sum(roll.truncated) / B,
                    # the sampled tokens themselves, so any two runs (e.g. 1 rank vs N ranks) can be compared
                    "rollout/tokens_sha256": hashlib.sha256(roll.tokens.numpy().tobytes()).hexdigest()[:16],
                    "entropy/mean": float(entropy[m].mean()),
                    "train/loss_scale": trainer.scaler.scale, "train/skipped_steps": trainer.scaler.skipped,
                    # the schedule's last rate of the step, logged only when there is a schedule (the metrics
                    # of a constant-rate run stay those of the committed references)
                    **({"train/lr": lr} if cfg.optim.warmup_steps or cfg.optim.schedule != "constant" else {}),
                    **({"ref/kl_k3": float(mismatch_metrics(ref_logp, old_logp, roll.mask)["mismatch/kl_k3"])}
                       if ref is not None else {}),
                })
                for key in updates[0]:  # NaN grad norm stays NaN; the IS weights after truncation (what verl and
                    # TRL report) go to mechanism.jsonl, so that the committed references' metrics stay byte-comparable
                    (mech if key.startswith("is/applied/") else row)[key] = sum(u[key] for u in updates) / len(updates)
                if hasattr(task, "reward_stats"):  # symbolic-check counters of the math reward, this step's, all ranks
                    stats = task.reward_stats()
                    mine_stats = {k: v - reward_seen.get(k, 0) for k, v in stats.items()}
                    every = dist.gather_objects(mine_stats, world)[::tp]  # one gather; one copy per TP group
                    row.update({f"reward/{k}": sum(d[k] for d in every) for k in mine_stats})
                    reward_seen = stats
                lockstep = cfg.engine == "vllm" and world.distributed  # every rank's vLLM engine must step
                if (world.main or lockstep) and cfg.eval.every and (step % cfg.eval.every == 0 or step == cfg.steps):
                    scores = evaluate(engine, tok, task, data.eval_settings(cfg, task), cfg.sampling.max_new_tokens,
                                      seed=cfg.seed * 1_000_003 + step + 500_000, world=world if lockstep else None,
                                      tp=tp, workers=cfg.reward_workers)
                    row.update(scores if world.main else {})
                n_tok = roll.n_tokens
                t_end = time.perf_counter()
                timing = {"step": step, "time/sample_s": t_sample - t0, "time/logprob_s": t_logp - t_sample,
                          "time/update_s": t_update - t_logp, "time/other_s": t_end - t_update,
                          "time/step_s": t_end - t0, "throughput/sampler_tok_s": n_tok / (t_sample - t0),
                          "throughput/trainer_tok_s": n_tok / (t_update - t_sample),
                          **dist.peak_memory_mb(trainer.device, world),
                          **flops.step_rates(model.config, n_matmul, n_tok, B, ids.shape[1], t_sample - t0,
                                             t_update - t_sample, forwards=2 if ref is not None else 1)}
                if world.main:
                    append_jsonl(run_dir / "metrics.jsonl", row)
                    append_jsonl(run_dir / "timing.jsonl", timing)
                    append_jsonl(run_dir / "mechanism.jsonl", mech)
                    if mirrors:
                        mirrors.log(row)
                if step % cfg.ckpt_every == 0 or step == cfg.steps:
                    checkpoint.save(run_dir, step, trainer, world, keep_last=cfg.keep_last)
                progress.advance(bar)
                console.print(_line(row, timing))
        if cfg.steps > start or not (run_dir / "policy").exists():
            checkpoint.export_hf(run_dir / "policy", trainer, tok, world)  # the final policy, for transfer and users
    except BaseException as e:  # a kill or a crash still leaves an honest "incomplete" summary
        error = f"{type(e).__name__}: {e}"
        if world.main:
            atomic_write_text(run_dir / "error.txt", traceback.format_exc())
        raise
    finally:
        for e in engines:  # the next run (a sweep's next cell in this process) starts on a freed device
            if hasattr(e, "close"):
                e.close()
        if world.main:
            write_summary(run_dir, cfg, error)
        if mirrors:
            mirrors.close()
    if cfg.transfer and world.main:  # lm-eval transfer index of base vs final checkpoint; never fails the finished run
        from suite.rl.evaluate import after_run

        after_run(run_dir, console)
    return run_dir


def write_summary(run_dir: Path, cfg, error: str | None) -> dict:
    return results.write_summary(run_dir, cfgmod.to_dict(cfg), error)


def _line(row: dict, timing: dict) -> str:
    return (f"step {row['step']:4d}  reward {row['reward/mean']:.3f}  len {row['response/length/mean']:5.1f}  "
            f"ent {row['entropy/mean']:.3f}  k3 {row['mismatch/kl_k3']:.2e}  "
            f"|dp| {row['mismatch/prob_diff/mean']:.2e}  |seq lr| {row['mismatch/seq_log_ratio/mean_abs']:.2e}  "
            f"gnorm {row['train/grad_norm']:.3f}  scale {row['train/loss_scale']:.0f}  "
            f"{timing['time/step_s']:.2f}s (sample {timing['time/sample_s']:.2f})")
