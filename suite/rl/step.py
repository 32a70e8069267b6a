"""One RL step, top to bottom: sample -> reward and advantage -> trainer log-probs -> mismatch ->
updates -> sync the sampler -> the step's log rows. ``rl_step`` is the page to read; each stage
below is one function.

A step is a pure function of (seed, step) and the weights: its prompts, its sampling seeds and its
minibatch order are drawn from generators seeded by them, never from global state, so a resumed run
repeats it byte for byte (suite/rl/train.py says how a run resumes). Sharded (suite/dist.py), each
rank samples its own prompt groups and scores its own rows; every number logged is the global one.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import time
from dataclasses import dataclass

import numpy as np
import torch

from suite import dist
from suite.numerics import flops, moe, perturbation, refit
from suite.numerics.centering import SamplerDist
from suite.numerics.mismatch import (
    length_bias,
    mechanism_metrics,
    mismatch_anatomy,
    mismatch_metrics,
    ratio_band_fractions,
)
from suite.numerics.rollout import Rollout
from suite.numerics.sampling import sequence_seeds
from suite.numerics.scoring import Batch
from suite.rl import data, recipe, staleness
from suite.rl.algos import compute_advantages, gap_clip_fraction, policy_loss, regularised_loss
from suite.tasks.registry import grade, prompt_ids


@dataclass
class Run:
    """What every step reads, built once by ``train.setup``."""

    cfg: object
    world: dist.World
    task: object
    algo: object  # the algorithm table's row (suite/rl/algo_table.py)
    items: list  # the perfectible prompts
    tok: object
    model: torch.nn.Module
    trainer: object
    engine: object
    history: staleness.WeightHistory  # the weights of the last k + 1 syncs (k = staleness)
    # the KL reference: the starting policy, frozen, scored with the trainer's numerics
    ref: object | None
    # staleness k > 0: a scoring-only trainer at the weights the sampler sampled with
    stale: object | None
    groups: list[int]  # this sampler's prompt groups of every step
    tp: int  # ranks per sampler (vLLM tensor parallel)
    n_matmul: int  # the policy's matmul parameters, before sharding (for the FLOP rates)
    reward_seen: dict  # the math reward's symbolic-check counters so far


@dataclass
class Scored:
    """Trainer-side log-probs (B, R) of the sampled tokens, all ranks' rows, before any update."""

    logp: torch.Tensor
    entropy: torch.Tensor
    ref_logp: torch.Tensor | None  # the KL reference's
    stale_logp: torch.Tensor | None  # the trainer's numerics at the sampling weights (staleness)
    # MoE: share of (position, layer) whose experts the trainer chose differently
    flips: list[float]


# the profiler's range of one step: `suite bench --profile` counts the operations inside it
@torch.profiler.record_function("suite.rl_step")
def rl_step(run: Run, step: int) -> tuple[dict, dict, dict]:
    """One step; returns its rows of metrics.jsonl, mechanism.jsonl and timing.jsonl."""
    cfg, G = run.cfg, run.cfg.samples_per_prompt
    t0 = time.perf_counter()
    sampled = sample(run, step)  # this sampler's share
    t_sample = time.perf_counter()
    roll, rewards = gather(run, sampled)
    # (B,), groups stay whole
    adv = compute_advantages(rewards.view(-1, G), run.algo.advantage).view(-1)
    batch = Batch.of(roll, cfg.sampling.temperature,
                     # MoE: the sampler's experts, replayed
                     routes=roll.routes if cfg.routing_replay else None,
                     # renormalised over
                     kept=roll.kept if cfg.sampling.truncation == "renormalise" else None)
    scored = score(run, batch, roll.routes)
    t_logp = time.perf_counter()
    row, mech = mismatch(run, step, roll, scored, adv)
    # the loss centres on the sampler's distribution at each response position
    if cfg.algo.score_centering:
        batch = dataclasses.replace(batch, centre=SamplerDist(roll.dist, roll.dist_ids))
    lr, updates = update(run, step, batch, roll, scored, adv)
    sync(run, step)  # after the optimizer steps (k syncs behind with staleness)
    t_update = time.perf_counter()
    row.update(outcome(run, roll, rewards, scored, lr))
    # the IS weights after truncation (what verl and TRL report) go to mechanism.jsonl,
    for key in updates[0]:
        # so that the committed references' metrics stay byte-comparable; a NaN grad norm stays NaN
        (mech if key.startswith("is/applied/")
         else row)[key] = sum(u[key] for u in updates) / len(updates)
    row.update(reward_counters(run))
    row.update(evaluate_now(run, step))
    t_end = time.perf_counter()
    B, n_tok = len(batch.ids), roll.n_tokens
    timing = {"step": step, "time/sample_s": t_sample - t0, "time/logprob_s": t_logp - t_sample,
              "time/update_s": t_update - t_logp, "time/other_s": t_end - t_update,
              "time/step_s": t_end - t0, "throughput/sampler_tok_s": n_tok / (t_sample - t0),
              "throughput/trainer_tok_s": n_tok / (t_update - t_sample),
              **dist.peak_memory_mb(run.trainer.device, run.world),
              **flops.step_rates(run.model.config, run.n_matmul, n_tok, B, batch.ids.shape[1],
                                 t_sample - t0, t_update - t_sample, forwards=2
                                 if run.ref is not None else 1)}
    return row, mech, timing


# ---- sample: this sampler's prompt groups, G responses each, and their rewards
# ------------------------------------
def sample(run: Run, step: int) -> tuple[Rollout, list[float]]:
    """A sequence's seed is a function of (seed, step, group, sample) only, so every world size
    samples the same tokens. Score centering has the sampler record its next-token distribution,
    whole or its top-k head."""
    cfg, G = run.cfg, run.cfg.samples_per_prompt
    step_items = [run.items[i]
                  for i in step_prompts(len(run.items), step, cfg.prompts_per_step, cfg.seed)]
    # each group's prompt tokenised once (a tokenizer call per sample was ~2% of a small-tier step)
    prompts = [list(ids) for g in run.groups
               for ids in [prompt_ids(run.tok, step_items[g])] * G]
    centering = ({"keep_dist": True, "dist_topk": cfg.algo.score_centering_topk or 0}
                 if cfg.algo.score_centering else {})
    roll = run.engine.generate(prompts, cfg.sampling.max_new_tokens, cfg.sampling.temperature,
                               cfg.sampling.top_p, sequence_seeds(cfg.seed, step, run.groups, G),
                               top_k=cfg.sampling.top_k, **centering)
    texts = run.tok.batch_decode(roll.response_ids(), skip_special_tokens=True)
    rewards = grade(run.task, [step_items[run.groups[i // G]] for i in range(len(texts))], texts,
                    roll.truncated, cfg.reward_workers)
    return roll, rewards


def gather(run: Run, sampled: tuple[Rollout, list[float]]) -> tuple[Rollout, torch.Tensor]:
    """Every sampler's rollouts and rewards, in group order (one copy per tensor-parallel group)."""
    gathered = dist.gather_objects(sampled, run.world)[::run.tp]
    return Rollout.concat([r for r, _ in gathered]), torch.tensor(
        [x for _, rs in gathered for x in rs])


def step_prompts(n: int, step: int, per_step: int, seed: int) -> list[int]:
    """Indices of the prompts of ``step`` (1-based): epochs of seeded permutations, no state."""
    out, start = [], (step - 1) * per_step
    for i in range(start, start + per_step):
        epoch, j = divmod(i, n)
        perm = torch.randperm(n, generator=torch.Generator().manual_seed(seed * 100_003 + epoch))
        out.append(int(perm[j]))
    return out


# ---- trainer log-probs of the sampled tokens at the sampling parameters (each rank its rows)
# ----------------------
@torch.no_grad()
def score(run: Run, batch: Batch, sampled_routes: torch.Tensor | None) -> Scored:
    """In micro-batches: (B, R, vocab) fp32 logits of a real model do not fit at once. The KL
    reference and the stale trainer are frozen policies: they choose their own experts (no routing
    replay)."""
    cfg, trainer, world = run.cfg, run.trainer, run.world
    own = micro_batches(torch.arange(len(batch.ids)).tensor_split(world.size)[world.rank],
                        cfg.micro_batch)
    parts, flips = [], []
    for c in own:
        s = trainer.score(batch.rows(c))
        parts.append((s.logp.cpu(), s.entropy.cpu()))
        chosen = trainer.chosen_routes(len(c)) if sampled_routes is not None else None
        if chosen is not None:
            flips.append(moe.flip_fraction(sampled_routes[c], chosen, batch.attn[c].bool()))
    parts = [p for rank_parts in dist.gather_objects(parts, world) for p in rank_parts]
    frozen = batch.without("routes")
    ref_logp = stale_logp = None
    if run.ref is not None:
        ref_parts = [run.ref.score(frozen.rows(c)).logp.cpu() for c in own]
        ref_logp = torch.cat([p for rank_parts in dist.gather_objects(ref_parts, world)
                              for p in rank_parts])
    if run.stale is not None:  # one rank (config.validate)
        stale_logp = torch.cat([run.stale.score(frozen.rows(c)).logp.cpu() for c in own])
    return Scored(torch.cat([a for a, _ in parts]), torch.cat([b for _, b in parts]), ref_logp,
                  stale_logp, flips)


def micro_batches(idx: torch.Tensor, size: int | None) -> list[torch.Tensor]:
    """Split row indices into micro-batches of at most ``size`` rows (None: one batch)."""
    return list(idx.split(size)) if size else [idx]


# ---- mismatch: sampler (mu) vs trainer (pi) on the same tokens, before any update
# ---------------------------------
def mismatch(run: Run, step: int, roll: Rollout, scored: Scored,
             adv: torch.Tensor) -> tuple[dict, dict]:
    """The step's first metrics (metrics.jsonl) and its mechanism row: raw IS weights, lengths,
    entropy by position, and the share PPO's clip would zero at the first update with the sampler's
    denominator (counterfactual under ppo_ref=trainer). Key order is the files' byte layout: keep
    it."""
    cfg, algo, logp, mask = run.cfg, run.algo, scored.logp, roll.mask
    row = {"step": step, **mismatch_metrics(logp, roll.logprobs, mask),
           **mismatch_anatomy(logp, roll.logprobs, mask, scored.entropy)}
    gap_clip = (gap_clip_fraction(logp, roll.logprobs, adv, mask, algo.clip_low, algo.clip_high)
                if algo.surrogate == "ppo" else None)
    if gap_clip is not None and cfg.algo.ppo_ref == "sampler":  # what the gap alone clips
        row["ppo/clip_frac_gap"] = gap_clip
    if scored.stale_logp is not None:
        row.update(staleness.split(logp, scored.stale_logp, roll.logprobs, mask))
    mech = {"step": step, **mechanism_metrics(logp, roll.logprobs, mask, scored.entropy),
            **ratio_band_fractions(logp, roll.logprobs, mask),
            **length_bias(logp, roll.logprobs, mask),
            **({"mech/kept_mass/mean": float(roll.kept_mass[mask.bool()].mean())}
               if roll.kept_mass is not None else {}),
            **({"mech/gap_clip_frac": gap_clip} if gap_clip is not None else {}),
            **({"mech/moe/route_flip_frac": float(np.nanmean(scored.flips))} if scored.flips
               else {})}
    return row, mech


# ---- updates: minibatches of the rollout batch, one PPO epoch
# ------------------------------------------------------
def update(run: Run, step: int, batch: Batch, roll: Rollout, scored: Scored,
           adv: torch.Tensor) -> tuple[float, list[dict]]:
    """Each rank takes an equal share of every minibatch and the gradients are summed over ranks
    (suite/numerics/trainer.py). Returns the last update's learning rate and every update's
    metrics."""
    cfg, algo, trainer, world = run.cfg, run.algo, run.trainer, run.world
    mask, L = roll.mask, cfg.sampling.max_new_tokens
    perm = torch.randperm(len(batch.ids),
                          generator=torch.Generator().manual_seed(cfg.seed * 1_000_003 + step))
    # The ratio's denominator: the trainer's recomputed log-probs, or the sampler's (algo.ppo_ref).
    denom = roll.logprobs if cfg.algo.ppo_ref == "sampler" else scored.logp
    old, mu, a, m = (t.to(trainer.device) for t in (denom, roll.logprobs, adv, mask))
    ref = scored.ref_logp.to(trainer.device) if scored.ref_logp is not None else None

    def loss(c):  # one micro-batch, through the trainer's forward at the current weights
        s = trainer.score(batch.rows(c))
        out, metrics = policy_loss(algo, s.logp, old[c], mu[c], a[c], m[c], norm_len=L,
                                   expected_logp=s.expected)
        out, extra = regularised_loss(out, s.logp, s.entropy, None if ref is None else ref[c], m[c],
                                      algo.agg, L, cfg.algo.kl_coef, cfg.algo.kl_estimator,
                                      cfg.algo.entropy_coef)
        return out, {**metrics, **extra}

    updates = []
    for u, mb in enumerate(perm.chunk(cfg.updates_per_step)):
        lr = cfg.optim.lr * recipe.lr_factor((step - 1) * cfg.updates_per_step + u,
                                             cfg.steps * cfg.updates_per_step,
                                             cfg.optim.warmup_steps, cfg.optim.schedule)
        trainer.set_lr(lr)
        micro = micro_batches(mb.tensor_split(world.size)[world.rank], cfg.micro_batch)
        weights = accumulation_weights(micro, mask, algo.agg, whole=mb)
        updates.append(
            trainer.step([(functools.partial(loss, c), w) for c, w in zip(micro, weights)]))
    return lr, updates


def accumulation_weights(micro: list[torch.Tensor], mask: torch.Tensor, agg: str,
                         whole: torch.Tensor | None = None) -> list[float]:
    """Weights that make the sum of micro-batch losses equal the minibatch loss (gradient
    accumulation): each micro-batch's share of the tokens for token-mean, of the sequences for the
    seq-mean modes. ``whole``: the rows of the global minibatch when ``micro`` is only this rank's
    part of it (the ranks' weights then sum to 1 and their gradients are summed)."""
    def size(rows):
        return float(mask[rows].sum()) if agg == "token-mean" else float(len(rows))
    total = size(whole) if whole is not None else sum(size(c) for c in micro)
    return [size(c) / (total or 1.0) for c in micro]


def sync(run: Run, step: int | None = None) -> None:
    """The sampler takes the trainer's weights (k syncs old with staleness), and the refit check
    compares the weights it quantised with a fresh quantisation: all of them at the first sync
    (``step`` None), a few in rotation after each step's updates (suite/numerics/refit.py)."""
    run.engine.sync(synced := run.history.push(run.trainer.full_weights()))
    refit.check(run.engine, synced, None if step is None else refit.rotating(run.engine, step))
    if run.stale is not None:
        run.stale.model.load_state_dict(run.history.snaps[0])


# ---- log: every number is the global one
# ---------------------------------------------------------------------------
def outcome(run: Run, roll: Rollout, rewards: torch.Tensor, scored: Scored, lr: float) -> dict:
    """Reward, lengths, entropy and the trainer's state after the updates."""
    cfg, trainer = run.cfg, run.trainer
    lengths, m = roll.mask.sum(1), roll.mask.bool()
    rates = rewards.view(-1, cfg.samples_per_prompt).mean(1)
    return {
        "reward/mean": float(rewards.mean()),
        "reward/pass_rates": [round(float(r), 6) for r in rates],
        "reward/all_solved_frac": float((rates == 1).float().mean()),
        "reward/none_solved_frac": float((rates == 0).float().mean()),
        "response/length/mean": float(lengths.mean()), "response/length/max": float(lengths.max()),
        "response/truncated_frac": sum(roll.truncated) / len(roll.truncated),
        # the sampled tokens themselves, so any two runs (e.g. 1 rank vs N ranks) can be compared
        "rollout/tokens_sha256": hashlib.sha256(roll.tokens.numpy().tobytes()).hexdigest()[:16],
        "entropy/mean": float(scored.entropy[m].mean()),
        "train/loss_scale": trainer.scaler.scale, "train/skipped_steps": trainer.scaler.skipped,
        # the schedule's last rate of the step, logged only when there is a schedule (the metrics of
        # a constant-rate run stay those of the committed references)
        **({"train/lr": lr} if cfg.optim.warmup_steps or cfg.optim.schedule != "constant" else {}),
        **({"ref/kl_k3": float(mismatch_metrics(scored.ref_logp, scored.logp,
                                                roll.mask)["mismatch/kl_k3"])}
           if scored.ref_logp is not None else {}),
    }


def reward_counters(run: Run) -> dict:
    """The math reward's symbolic-check counters of this step, over all ranks (other tasks have
    none)."""
    if not hasattr(run.task, "reward_stats"):
        return {}
    stats = run.task.reward_stats()
    this_step = {k: v - run.reward_seen.get(k, 0) for k, v in stats.items()}
    every = dist.gather_objects(this_step, run.world)[::run.tp]  # one gather; one copy per TP group
    run.reward_seen = stats
    return {f"reward/{k}": sum(d[k] for d in every) for k in this_step}


def evaluate_now(run: Run, step: int) -> dict:
    """Held-out accuracy every ``eval.every`` steps and at the last (suite/rl/evaluate.py's
    evaluate)."""
    cfg, world = run.cfg, run.world
    lockstep = cfg.engine == "vllm" and world.distributed  # every rank's vLLM engine must step
    if not ((world.main or lockstep) and cfg.eval.every
            and (step % cfg.eval.every == 0 or step == cfg.steps)):
        return {}
    scores = evaluate(run.engine, run.tok, run.task, data.eval_settings(cfg, run.task),
                      cfg.sampling.max_new_tokens, seed=cfg.seed * 1_000_003 + step + 500_000,
                      world=world if lockstep else None, tp=run.tp, workers=cfg.reward_workers)
    return scores if world.main else {}


def evaluate(engine, tok, task, settings: dict, max_new_tokens: int, seed: int,
             world: dist.World | None = None, tp: int = 1, workers: int = 1) -> dict[str, float]:
    """Held-out accuracy with the run's own sampler: eval/<split>/mean@<n> = mean reward over n
    samples per prompt (AIME mean@32 at temperature 0.6, top-p 0.95 for sanity_r1d, as published),
    graded by ``workers``. An injected perturbation (``inject.*``) is suspended: the score is the
    policy's, not the perturbed rollouts'.

    ``world``: vLLM engines of a data-parallel world step together (vLLM's DP lockstep), so every
    rank
    evaluates: each sampler (a rank, or a group of ``tp`` ranks) takes a slice of every batch with
    the per-request seeds a single engine would draw for it, and the rewards are gathered."""
    out, n = {}, settings["samples"]
    with perturbation.suspended(engine):
        gen = torch.Generator().manual_seed(seed)
        for split in settings["splits"]:
            items = task.split(split, settings["prompts"]
                               and min(settings["prompts"], len(task.split(split))))
            prompts = [prompt_ids(tok, it) for it in items for _ in range(n)]
            # built-in engine: 256 at a time (dense cache); vLLM: all
            rewards, size = [], engine.max_batch or max(len(prompts), 1)
            for i in range(0, len(prompts), size):
                chunk, rows = prompts[i:i + size], list(range(i, min(i + size, len(prompts))))
                seeds = gen
                # = VllmEngine.generate's draw, in any batching
                if world is not None and world.distributed:
                    seeds = torch.randint(0, 2**31 - 1, (len(chunk),), generator=gen)
                    part = torch.arange(len(chunk)).tensor_split(world.size // tp)[world.rank // tp]
                    rows, chunk, seeds = [i + int(k)
                                          for k in part], [chunk[int(k)] for k in part], seeds[part]
                # Graded as text: no per-token log-probs (vLLM applies the published top-p itself).
                roll = engine.generate(chunk, max_new_tokens, settings["temperature"],
                                       settings["top_p"], seeds, logprobs=False)
                texts = tok.batch_decode(roll.response_ids(), skip_special_tokens=True)
                # graded as the rollouts are
                graded = grade(task, [items[r // n] for r in rows], texts, roll.truncated, workers)
                if world is not None and world.distributed:
                    graded = [x for part in dist.gather_objects(graded, world)[::tp] for x in part]
                rewards += graded
            out[f"eval/{split}/mean@{n}"] = sum(rewards) / len(rewards)
    return out
