"""The trainer: fp32 master weights, a full-sequence forward in the flow's compute dtype, AdamW.

This is the training engine's side of the mismatch (FSDP / Megatron in real stacks): the
fp32 master copy is rounded to the compute dtype inside every GEMM (``torch.autocast``, or
its exact emulation from precision.py), while the residual stream and norms stay fp32. It
recomputes the log-probs of the sampled tokens with a full-sequence forward, which is what
the importance ratios and the mismatch metrics compare with the sampler's log-probs.

fp16 needs dynamic loss scaling (arXiv 2510.26788 section 3; PyTorch GradScaler semantics):
scale the loss before backward, unscale before clipping, skip the step on inf/nan and halve
the scale, double it after ``growth_interval`` clean steps. ``LossScaler``
(suite/numerics/loss_scaling.py) is that, small enough to read and to checkpoint.

Sharded (``World.distributed``, suite/dist.py): the model is FSDP2 (``fully_shard`` on every
decoder layer, then on the root) over **fp32** parameter shards, and the flow's compute dtype
still comes from autocast (or its emulation) inside the forward, exactly as unsharded, so the
precision table stays the one place that decides it and a 1-rank FSDP2 run computes what a
plain process computes (docs/distributed.md has the measured comparison with the other choice,
``MixedPrecisionPolicy(param_dtype=bf16)``, which also rounds the residual stream and norms).
Gradients are reduce-scattered in fp32 and summed (each rank's loss already carries its share of
the global minibatch); the loss scaler skips the step on every rank when any rank's shard holds
an inf (as ``ShardedGradScaler``), and clipping uses the global gradient norm.
"""

from __future__ import annotations

import contextlib
import functools
import math
from dataclasses import dataclass

import torch

from suite import dist
from suite.numerics import moe, packing
from suite.numerics.engine import TorchEngine
from suite.numerics.loss_scaling import LossScaler
from suite.numerics.precision import (
    Flow,
    emulate_autocast,
    fp8_decoder_linears,
    fp32_lm_head,
    lowp_linear,
)
from suite.numerics.scoring import Batch, Scores, log_probs


def _padded_back(score, b: Batch) -> tuple[torch.Tensor, ...]:
    """Per-micro-batch padding (``trim_padding``): score only the columns some row of this
    micro-batch attends to.

    A rollout batch pads every row to its longest prompt (left) and longest response (right); a
    micro-batch of a few rows usually needs far fewer columns (verl's and OpenRLHF's "remove
    padding" for the same reason: the logits and activations of the dropped columns are the largest
    tensors of a long-response update). Dropped columns are attended by no row, so positions (from
    the mask's cumulative sum) and every kept logit are the same up to the kernels' summation order;
    the log-probs and entropies of dropped response positions, masked out of every loss and metric,
    come back as 0 in the (B, R) shape the caller expects.
    """
    S, n_resp = b.ids.shape[1], b.n_resp
    cols = b.attn.bool().any(0).nonzero().flatten()
    first, last = int(cols[0]) if len(cols) else 0, max(int(cols[-1]) + 1 if len(cols) else S,
                                                        S - n_resp + 1)
    out = score(b.columns(first, last))
    # response positions kept (at least one, so every shape stays non-empty)
    r = last - (S - n_resp)
    return tuple(torch.nn.functional.pad(x, (0, n_resp - r)) for x in out)


@dataclass(frozen=True)
class TrainerOptions:
    """The trainer's knobs, each the config field of the same name (suite/rl/schema.py says what it
    does; suite/rl/config.py validate holds every rule about combining them, the trainer only
    asserts)."""

    lm_head_fp32: bool = False
    gradient_checkpointing: bool = False
    logprob_chunk: int = 0
    # the sampler's KV-cache format, for the flows that score in the sampler's code
    kv_quant: str | None = None
    trim_padding: bool = False
    defer_grad_sync: bool = False
    packing: bool = False


class Trainer:
    """Holds the fp32 master model (FSDP2-sharded over a world), its optimizer and loss scaler."""

    def __init__(self, model: torch.nn.Module, flow: Flow, backend: str, optim_cfg,
                 options: TrainerOptions = TrainerOptions(), world: dist.World | None = None):
        self.world = world or dist.World()
        o = self.options = options
        assert not (o.packing and o.trim_padding), \
            "config.validate: packing drops every pad already"
        assert not (flow.sampler_code
                    and (o.packing or o.gradient_checkpointing or self.world.distributed)), \
            (f"config.validate: precision {flow.name} trains through the sampler's code, not the "
             "HF module")
        self.device = torch.device(self.world.device)
        self.model = model.float().to(self.device)
        self.flow = flow
        self.backend = backend
        self.dtype = flow.trainer_dtype
        if backend == "emulated" and self.dtype != torch.float32:
            emulate_autocast(self.model, self.dtype)
        else:
            self.model.config._attn_implementation = "sdpa"
        if flow.trainer_quant == "fp8":  # kept for the HF module too (e.g. evaluation code paths)
            fp8_decoder_linears(self.model)
        if o.lm_head_fp32:
            fp32_lm_head(self.model)
        # A mixture-of-experts policy computes its MoE blocks with suite/numerics/moe.py (the
        # sampler's routing semantics, the compute dtype's GEMMs, and the routing-replay hook);
        # ``routing`` holds the replayed and the chosen experts of the last forward.
        self.routing = moe.Routing() if getattr(self.model.config, "num_local_experts", 0) else None
        if self.routing is not None:
            emulated = backend == "emulated" and self.dtype != torch.float32
            moe.patch_hf(self.model, self.routing,
                         (lambda x, w: lowp_linear(x, w, None, self.dtype)) if emulated else None)
        # The exact flow (bitwise on-policy, vLLM + TorchTitan style): score with the sampler's
        # own forward, replaying its decode loop, so trainer and sampler run identical kernels.
        # kv_quant: the sampler's KV cache format (config kv_cache); only the flows that run the
        # sampler's code apply it, the HF module has no KV cache to quantise (that difference is the
        # source it measures).
        engine = functools.partial(TorchEngine, self.model.config, self.dtype, backend,
                                   lm_head_fp32=o.lm_head_fp32, device=str(self.device),
                                   kv_quant=o.kv_quant)
        self.exact_engine = engine(functional_cache=True) if flow.exact else None
        # The unified flows (Jet-RL's FP8 one, and the bf16/fp16 controls): the trainer's forward
        # runs the sampler's own code (its activation dtype, the same FP8 quantisers) on the full
        # sequence, so the sampler's computation is a subgraph of it; only GEMM shapes differ.
        self.unified_engine = engine(quant=flow.trainer_quant) if flow.unified else None
        self._forward = self._scoring_path()  # decided once, here
        if o.gradient_checkpointing:
            # HF recomputes a layer only in train mode; the policy has no dropout, so train()
            # changes nothing else.
            self.model.gradient_checkpointing_enable(
                gradient_checkpointing_kwargs={"use_reentrant": False})
            self.model.train()
        if self.world.distributed:
            self._shard()
        self.params = [p for p in self.model.parameters() if p.requires_grad]
        self.opt = torch.optim.AdamW(self.params, lr=optim_cfg.lr, betas=tuple(optim_cfg.betas),
                                     eps=optim_cfg.eps, weight_decay=optim_cfg.weight_decay)
        self.grad_clip = optim_cfg.grad_clip
        self.scaler = LossScaler(enabled=flow.loss_scaling)

    def _scoring_path(self):
        """The forward that scores a batch: the sampler's code (exact: its decode loop replayed;
        unified: its code on the full sequence), or the HF module on the packed row, on the
        micro-batch's own columns, or padded."""
        if self.exact_engine is not None:
            return self._replayed
        if self.unified_engine is not None:
            return self._unified
        if self.options.packing:
            return self._packed
        if self.options.trim_padding:
            return functools.partial(_padded_back, self._hf)
        return self._hf

    def _shard(self) -> None:
        """FSDP2 over fp32 shards: every decoder layer is a unit, then the root (embeddings, final
        norm, head); fp32 all-gathers and fp32 reduce-scatters, summed (not averaged) over ranks."""
        from torch.distributed.fsdp import FSDPModule, MixedPrecisionPolicy, fully_shard

        mp = MixedPrecisionPolicy(param_dtype=None, reduce_dtype=torch.float32)
        for layer in self.model.model.layers:
            fully_shard(layer, mp_policy=mp)
        fully_shard(self.model, mp_policy=mp)
        for m in self.model.modules():
            if isinstance(m, FSDPModule):
                m.set_gradient_divide_factor(1.0)  # a plain SUM (gloo has no PREMUL_SUM)
                m.set_force_sum_reduction_for_comms(True)

    def _autocast(self):
        """Autocast on the device the parameters live on (an autocast("cuda") around CPU tensors, or
        the reverse, would silently compute in fp32)."""
        if self.backend == "native" and self.dtype != torch.float32:
            return torch.autocast(self.autocast_device(), dtype=self.dtype)
        return contextlib.nullcontext()

    def autocast_device(self) -> str:
        return next(self.model.parameters()).device.type

    def full_weights(self) -> dict[str, torch.Tensor]:
        """Unsharded parameters (all-gathered from the FSDP2 shards on every rank): the weight
        sync's input."""
        if not self.world.distributed:
            return self.model.state_dict()
        return {n: p.full_tensor() for n, p in self.model.named_parameters()}

    @torch.no_grad()
    def observe(self) -> dict[str, str]:
        """The dtypes the trainer's forward actually produces: the first decoder GEMM's output and
        the logits (one tiny forward, on every rank), recorded in env.json instead of the configured
        dtype."""
        param_device = str(next(self.model.parameters()).device)
        if self.exact_engine is not None or self.unified_engine is not None:
            return {**self._observe_engine(self.exact_engine or self.unified_engine),
                    "autocast_device": "none", "param_device": param_device}
        seen = {}
        first = next(m for m in self.model.modules()
                     if isinstance(m, torch.nn.Linear)
                     and m is not self.model.get_output_embeddings())
        # returns None
        hook = first.register_forward_hook(
            lambda m, i, o: seen.update(gemm=seen.get("gemm", o.dtype)))
        try:
            ids = torch.full((1, 2), int(self.model.config.bos_token_id or 0), device=self.device)
            with self._autocast():
                logits = self.model(input_ids=ids).logits
        finally:
            hook.remove()
        device = (self.autocast_device() if self.backend == "native" and self.dtype != torch.float32
                  else "none")
        return {"gemm_output": str(seen["gemm"]), "logits": str(logits.dtype),
                "autocast_device": device, "param_device": param_device}

    def _observe_engine(self, engine) -> dict[str, str]:
        """The same two dtypes for the flows that train through the sampler's code (exact, unified
        FP8): its first GEMM's output and its logits, seen in one tiny full-sequence pass on the
        training weights."""
        seen, lin, forward = {}, engine._lin, engine._forward

        def spy_lin(x, name):
            out = lin(x, name)
            seen.setdefault("gemm_output", str(out.dtype))
            return out

        def spy_forward(*args, **kwargs):
            out = forward(*args, **kwargs)
            seen.setdefault("logits", str(out.dtype))
            return out

        # instance attributes shadow the methods
        engine._lin, engine._forward = spy_lin, spy_forward
        try:
            ids = torch.full((1, 3), int(self.model.config.bos_token_id or 0), device=self.device)
            with torch.no_grad():
                engine.score_full(ids, torch.ones_like(ids), 1, ids[:, -1:], 1.0,
                                  engine.training_weights(dict(self.model.named_parameters())))
        finally:
            del engine._lin, engine._forward
        return seen

    def score(self, b: Batch) -> Scores:
        """The trainer's log-probs (B, R) of ``b.targets`` and its entropy (B, R), with score
        centering's E_t when ``b.centre`` is given; the batch's routes are replayed through a
        mixture of experts' blocks."""
        assert b.centre is None or not self.flow.sampler_code, \
            "config.validate: centering scores in the HF module"
        # One place moves a batch to this rank's device, for every flow: the HF module's, the
        # replayed decode loop's (exact) and the sampler code's (unified) forward alike.
        b = b.to(self.device)
        if self.routing is None:
            return Scores(*self._forward(b))
        self.routing.replay, self.routing.seen = b.routes, {}
        try:
            return Scores(*self._forward(b))
        finally:
            self.routing.replay = None

    def chosen_routes(self, batch: int) -> torch.Tensor | None:
        """The experts the trainer's own routers chose in the last forward, (B, S, L, k); None for a
        dense policy."""
        if self.routing is None:
            return None
        if self.unified_engine is not None:
            return (torch.stack(self.unified_engine.routes_seen, 2)
                    if self.unified_engine.routes_seen else None)
        return self.routing.chosen(batch)

    def _replayed(self, b: Batch) -> tuple[torch.Tensor, ...]:
        weights = self.exact_engine.training_weights(dict(self.model.named_parameters()))
        prompt = slice(None, -b.n_resp)
        return self.exact_engine.score(b.ids[:, prompt], b.attn[:, prompt].bool(), b.targets,
                                       b.temperature, weights, b.kept)

    def _unified(self, b: Batch) -> tuple[torch.Tensor, ...]:
        weights = self.unified_engine.training_weights(dict(self.model.named_parameters()))
        return self.unified_engine.score_full(b.ids, b.attn, b.n_resp, b.targets, b.temperature,
                                              weights, b.routes, b.kept)

    def _hf(self, b: Batch) -> tuple[torch.Tensor, ...]:
        pos = (b.attn.cumsum(1) - 1).clamp(min=0)
        with self._autocast():
            logits = self.model(input_ids=b.ids, attention_mask=b.attn, position_ids=pos).logits
        # (B, R, V)
        return self._log_probs(logits[:, -b.n_resp - 1:-1], b.targets, b.temperature, b.kept,
                               b.centre)

    def _log_probs(self, logits, targets, temperature, kept, centre) -> tuple[torch.Tensor, ...]:
        """scoring.log_probs of logits (B, R, V), in chunks of ``logprob_chunk`` positions when
        set."""
        n, c = logits.shape[1], self.options.logprob_chunk
        if not c or c >= n:
            return log_probs(logits, targets, temperature, kept, centre)
        # Chunks of positions, each recomputed in the backward pass: the fp32 log-softmax of one
        # chunk is alive at a time. Positions are independent, so the values equal the unchunked
        # ones.
        from torch.utils.checkpoint import checkpoint

        def part(x, i):  # positions i .. i + c of an optional (B, R, ...) input
            return None if x is None else x[:, i:i + c]
        parts = [checkpoint(log_probs, logits[:, i:i + c], targets[:, i:i + c], temperature,
                            part(kept, i), part(centre, i), use_reentrant=False)
                 for i in range(0, n, c)]
        return tuple(torch.cat(outs, 1) for outs in zip(*parts))

    def _packed(self, b: Batch) -> tuple[torch.Tensor, ...]:
        """``packing``: the micro-batch scored as one row (suite/numerics/packing.py). Only the M
        scored positions' logits are computed (1, M, V), their log-probs and entropies come back in
        the (B, R) shape, 0 elsewhere."""
        where, idx = packing.scored(b.attn, b.n_resp)
        logits = self._packed_logits(b.ids, b.attn, idx)
        out = self._log_probs(logits, b.targets[where][None], b.temperature,
                              None if b.kept is None else b.kept[where][None],
                              None if b.centre is None else b.centre[where][None])
        return tuple(packing.unpack(x[0], where) for x in out)

    def _packed_logits(self, ids, attn, idx):
        """The HF module's forward on the packed row: no attention mask and no cache, so that
        transformers builds the block-diagonal causal mask from the restarting position ids
        (packing.py says why); ``logits_to_keep`` (a 1-D index tensor) keeps the head's GEMM to the
        predicting positions ``idx``. A mixture of experts replays the sampler's experts of the kept
        positions and reports its own in the padded layout."""
        packed, pos, keep = packing.pack(ids, attn)
        if self.routing is not None and self.routing.replay is not None:
            self.routing.replay = self.routing.replay[keep][None]  # (B, S, L, k) -> (1, N, L, k)
        with self._autocast():
            logits = self.model(input_ids=packed, position_ids=pos, use_cache=False,
                                logits_to_keep=idx).logits
        if self.routing is not None:
            self.routing.seen = {i: packing.unpack_routes(s, keep)
                                 for i, s in self.routing.seen.items()}
        return logits  # (1, M, V)

    @torch.no_grad()
    def log_distribution(self, ids: torch.Tensor, attn: torch.Tensor, n_resp: int,
                         temperature: float) -> torch.Tensor:
        """The trainer's full fp32 log-distribution (B, R, V) at each response position (HF module
        flows): for the full-vocabulary divergences of ``suite attribute`` and ``suite gate``
        (mismatch.distribution_divergence). Packed, the positions it does not score (after a row's
        EOS) are 0, as its log-probs."""
        if self.exact_engine is not None or self.unified_engine is not None:
            raise ValueError(f"precision {self.flow.name}: the full distribution is read from the "
                             "sampler's code")
        ids, attn = ids.to(self.device), attn.to(self.device)
        if self.options.packing:
            where, idx = packing.scored(attn, n_resp)
            logits = self._packed_logits(ids, attn, idx)[0]  # (M, V)
            return packing.unpack(torch.log_softmax(logits.float() / temperature, dim=-1), where)
        pos = (attn.cumsum(1) - 1).clamp(min=0)
        with self._autocast():
            logits = self.model(input_ids=ids, attention_mask=attn, position_ids=pos).logits
        return torch.log_softmax(logits[:, -n_resp - 1:-1].float() / temperature, dim=-1)

    def set_lr(self, lr: float) -> None:
        """The learning rate of the next update (the schedule is a pure function of the update
        index, suite/rl/recipe.py lr_factor, so nothing about it needs to be checkpointed)."""
        for group in self.opt.param_groups:
            group["lr"] = lr

    def step(self, loss_fns) -> dict:
        """One optimizer update: backward of the (scaled) loss, unscale, clip, step or skip.

        ``loss_fns`` is a closure returning (loss, metrics), or a list of (closure, weight) pairs,
        one per micro-batch: gradients accumulate over sum_i weight_i * loss_i (suite.rl.step.
        accumulation_weights makes that the minibatch loss), one forward graph alive at a time.
        """
        self.opt.zero_grad(set_to_none=True)
        parts = [(loss_fns, 1.0)] if callable(loss_fns) else loss_fns
        total, metrics, finite_loss = 0.0, {}, True
        # defer_grad_sync: FSDP2 accumulates the unsharded gradients of every micro-batch but the
        # last and reduce-scatters once (FSDP1's no_sync; pytorch#118298), one collective per unit
        # per update instead of one per micro-batch, at the price of the whole model's fp32
        # gradients on every rank until then. Off by default as in torchtitan
        # (pytorch/torchtitan#292, #1710) and verl (use_no_sync_for_gradient_accumulation).
        defer = self.options.defer_grad_sync and self.world.distributed and len(parts) > 1
        try:
            for i, (fn, w) in enumerate(parts):
                if defer:
                    self.model.set_requires_gradient_sync(i == len(parts) - 1)
                loss, m = fn()
                (loss * (w * self.scaler.scale)).backward()
                value = loss.item()  # one read per micro-batch (its value is logged)
                finite_loss = finite_loss and math.isfinite(value)
                total += w * value
                # weighted means of the micro-batch metrics (extremes stay extremes)
                for k, v in m.items():
                    if k.endswith(("/max", "/min")) and k in metrics:
                        metrics[k] = (max(metrics[k], v) if k.endswith("/max")
                                      else min(metrics[k], v))
                    else:
                        metrics[k] = (v if k.endswith(("/max", "/min"))
                                      else metrics.get(k, 0.0) + w * v)
        finally:
            if defer:  # the next update, and any other backward, syncs again
                self.model.set_requires_gradient_sync(True)
        if len(parts) > 1 or self.world.distributed:
            metrics["loss/policy"] = total
        metrics = self._global(metrics)
        found_inf = (self.scaler.unscale_(self.params, self.world)
                     or dist.any_rank(not finite_loss, self.world))
        if found_inf:
            grad_norm = float("nan")  # a skipped step reports NaN, never crashes
        else:
            grads = [p.grad for p in self.params if p.grad is not None]
            # what clip_grad_norm_ computes, then clips with
            norm = torch.nn.utils.get_total_norm(grads, 2.0)
            # FSDP2: the global norm
            norm = norm.full_tensor() if hasattr(norm, "full_tensor") else norm
            torch.nn.utils.clip_grads_with_norm_(self.params, self.grad_clip, norm)
            grad_norm = float(norm)
            self.opt.step()
        self.scaler.update(found_inf)
        return {**metrics, "train/grad_norm": grad_norm, "train/skipped": float(found_inf)}

    def _global(self, metrics: dict) -> dict:
        """The ranks' weighted micro-batch metrics combined: sums of the weighted means, max of
        maxima, min of minima (each rank's weights are its share of the global minibatch, so the
        sums are the global means)."""
        if not self.world.distributed:
            return metrics
        keys = sorted(metrics)
        out = {}
        for op in ("sum", "max", "min"):
            ks = [k for k in keys if (k.endswith("/max") and op == "max")
                  or (k.endswith("/min") and op == "min")
                  or (not k.endswith(("/max", "/min")) and op == "sum")]
            if ks:
                t = dist.all_reduce(torch.tensor([float(metrics[k]) for k in ks],
                                                 dtype=torch.float64), self.world, op)
                out.update(zip(ks, t.tolist()))
        return out
