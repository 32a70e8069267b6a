"""The trainer: fp32 master weights, a full-sequence forward in the flow's compute dtype, AdamW.

This is the training engine's side of the mismatch (FSDP / Megatron in real stacks): the
fp32 master copy is rounded to the compute dtype inside every GEMM (``torch.autocast``, or
its exact emulation from precision.py), while the residual stream and norms stay fp32. It
recomputes the log-probs of the sampled tokens with a full-sequence forward, which is what
the importance ratios and the mismatch metrics compare with the sampler's log-probs.

fp16 needs dynamic loss scaling (arXiv 2510.26788 section 3; PyTorch GradScaler semantics):
scale the loss before backward, unscale before clipping, skip the step on inf/nan and halve
the scale, double it after ``growth_interval`` clean steps. ``LossScaler`` is that, small
enough to read and to checkpoint.

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
import math

import torch

from suite import dist
from suite.numerics import centering, moe, packing, truncation
from suite.numerics.engine import TorchEngine
from suite.numerics.precision import (
    Flow,
    emulate_autocast,
    fp8_decoder_linears,
    fp32_lm_head,
    lowp_linear,
)


class LossScaler:
    """Dynamic loss scaling (GradScaler defaults: 2^16 start, x2 growth, x0.5 back-off)."""

    def __init__(self, enabled: bool, init_scale: float = 2.0**16, growth_interval: int = 400,
                 growth: float = 2.0, backoff: float = 0.5):
        self.enabled = enabled
        self.scale = init_scale if enabled else 1.0
        self.growth_interval, self.growth, self.backoff = growth_interval, growth, backoff
        self.good_steps = 0
        self.skipped = 0

    def unscale_(self, params: list[torch.nn.Parameter], world: dist.World | None = None) -> bool:
        """Divide grads by the scale in place; return True, on every rank, when any rank's grad shard is
        inf or nan (an inf lands in one rank's shard after the reduce-scatter: all must skip together).

        One host read per step: the inf/nan flag stays on the device, where the ranks agree on it, and is read
        once (``dist.any_rank``). A read per parameter (``bool(torch.isfinite(g).all())``) would stall the GPU's
        queue 338 times per update of Qwen2.5-1.5B (28 layers x 12 tensors, the embedding, the final norm). The
        check is GradScaler's fused kernel (``torch._amp_foreach_non_finite_check_and_unscale_``, one launch per
        device and dtype, CPU and CUDA), which tests each element before it multiplies it by ``inv``.
        """
        grads = [_local(p.grad) for p in params if p.grad is not None]
        inv = 1.0
        if self.enabled:
            mantissa, _ = math.frexp(self.scale)
            if mantissa == 0.5 and self.scale >= 1:
                # A power of two >= 1 (always, from GradScaler's defaults): x * 2^-k rounds exactly as x / 2^k,
                # and a finite x stays finite, so checking before the multiply is checking after the division.
                inv = 1.0 / self.scale
            else:
                # Otherwise divide first and check the quotients: a multiply by a rounded 1/scale can differ in
                # the last bit, and a scale below 1 (17 back-offs in a row) can overflow a finite gradient,
                # which must count as an inf.
                for g in grads:
                    g.div_(self.scale)
        found = {}  # device -> (1,) fp32 flag, set to 1 by the kernel on any inf/nan
        groups: dict[tuple, list[torch.Tensor]] = {}
        for g in grads:
            groups.setdefault((g.device, g.dtype), []).append(g)
        for (device, _), gs in groups.items():
            flag = found.setdefault(device, torch.zeros(1, device=device))
            torch._amp_foreach_non_finite_check_and_unscale_(gs, flag, torch.full((1,), inv, device=device))
        any_inf = sum(f.to(grads[0].device) for f in found.values()) if found else False
        return dist.any_rank(any_inf, world)

    def update(self, found_inf: bool) -> None:
        if found_inf:
            self.skipped += 1
            self.good_steps = 0
            if self.enabled:
                self.scale *= self.backoff
            return
        self.good_steps += 1
        if self.enabled and self.good_steps % self.growth_interval == 0:
            self.scale *= self.growth

    def state_dict(self) -> dict:
        return {"scale": self.scale, "good_steps": self.good_steps, "skipped": self.skipped}

    def load_state_dict(self, s: dict) -> None:
        self.scale, self.good_steps, self.skipped = s["scale"], s["good_steps"], s["skipped"]


def _local(t: torch.Tensor) -> torch.Tensor:
    """The local shard of a DTensor (FSDP2 parameters and grads), the tensor itself otherwise."""
    return t.to_local() if hasattr(t, "to_local") else t


def _logp_entropy(logits: torch.Tensor, targets: torch.Tensor, temperature: float,
                  kept: torch.Tensor | None = None,
                  centre: centering.SamplerDist | None = None) -> tuple[torch.Tensor, ...]:
    """Log-probs of ``targets`` and the entropy, (B, R) each, from compute-dtype logits (B, R, V): log_softmax
    in fp32 on the logits divided by the sampling temperature, exactly as the sampler. ``kept`` (B, R, K):
    the sampler's kept ids (truncated sampling, sampling.truncation=renormalise): the log-prob is renormalised
    over them (suite/numerics/truncation.py); the entropy stays the full distribution's.
    ``centre``: the sampler's distribution; a third output (B, R) is then score centering's E_t
    (suite/numerics/centering.py)."""
    logp_all = torch.log_softmax(logits.float() / temperature, dim=-1)  # (B, R, V)
    if kept is not None:
        logp = truncation.renormalised(logp_all, targets, kept)[0]
    else:
        logp = logp_all.gather(-1, targets[..., None])[..., 0]
    entropy = -(logp_all.exp() * logp_all).sum(-1)
    if centre is not None:
        return logp, entropy, centering.expected_logp(logp_all, centre)
    return logp, entropy


def _padded_back(score, ids, attn, n_resp, targets, temperature, kept, centre=None):
    """Per-micro-batch padding (``trim_padding``): score only the columns some row of this micro-batch attends to.

    A rollout batch pads every row to its longest prompt (left) and longest response (right); a micro-batch of a
    few rows usually needs far fewer columns (verl's and OpenRLHF's "remove padding" for the same reason: the
    logits and activations of the dropped columns are the largest tensors of a long-response update). Dropped
    columns are attended by no row, so positions (from the mask's cumulative sum) and every kept logit are the
    same up to the kernels' summation order; the log-probs and entropies of dropped response positions, masked
    out of every loss and metric, come back as 0 in the (B, R) shape the caller expects.
    """
    S = ids.shape[1]
    cols = attn.bool().any(0).nonzero().flatten()
    first, last = int(cols[0]) if len(cols) else 0, max(int(cols[-1]) + 1 if len(cols) else S, S - n_resp + 1)
    r = last - (S - n_resp)  # response positions kept (at least one, so every shape stays non-empty)
    out = score(ids[:, first:last], attn[:, first:last], r, targets[:, :r], temperature,
                None if kept is None else kept[:, :r], None if centre is None else centre[:, :r])
    return tuple(torch.nn.functional.pad(x, (0, n_resp - r)) for x in out)


class Trainer:
    """Holds the fp32 master model (FSDP2-sharded over a world), its optimizer and loss scaler."""

    def __init__(self, model: torch.nn.Module, flow: Flow, backend: str, optim_cfg, lm_head_fp32: bool = False,
                 world: dist.World | None = None, gradient_checkpointing: bool = False, logprob_chunk: int = 0,
                 kv_quant: str | None = None, trim_padding: bool = False, defer_grad_sync: bool = False,
                 packing: bool = False):
        self.world = world or dist.World()
        if packing and trim_padding:  # config.validate refuses it first
            raise ValueError("packing: drops every pad already; trim_padding must be off with it")
        self.trim_padding, self.packing = trim_padding, packing
        self.defer_grad_sync = defer_grad_sync
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
        if lm_head_fp32:
            fp32_lm_head(self.model)
        self.lm_head_fp32 = lm_head_fp32
        # A mixture-of-experts policy computes its MoE blocks with suite/numerics/moe.py (the sampler's routing
        # semantics, the compute dtype's GEMMs, and the routing-replay hook); ``routing`` holds the replayed and
        # the chosen experts of the last forward.
        self.routing = moe.Routing() if getattr(self.model.config, "num_local_experts", 0) else None
        if self.routing is not None:
            emulated = backend == "emulated" and self.dtype != torch.float32
            moe.patch_hf(self.model, self.routing,
                         (lambda x, w: lowp_linear(x, w, None, self.dtype)) if emulated else None)
        # The exact flow (bitwise on-policy, vLLM + TorchTitan style): score with the sampler's
        # own forward, replaying its decode loop, so trainer and sampler run identical kernels.
        # kv_quant: the sampler's KV cache format (config kv_cache); only the flows that run the sampler's code
        # apply it, the HF module has no KV cache to quantise (that difference is the source it measures).
        self.replay = (TorchEngine(self.model.config, self.dtype, backend, lm_head_fp32=lm_head_fp32,
                                   functional_cache=True, device=str(self.device), kv_quant=kv_quant)
                       if flow.exact else None)
        # The unified flows (Jet-RL's FP8 one, and the bf16/fp16 controls): the trainer's forward runs the
        # sampler's own code (its activation dtype, the same FP8 quantisers) on the full sequence, so the
        # sampler's computation is a subgraph of it; only GEMM shapes differ.
        self.unified = (TorchEngine(self.model.config, self.dtype, backend, lm_head_fp32=lm_head_fp32,
                                    quant=flow.trainer_quant, device=str(self.device), kv_quant=kv_quant)
                        if flow.unified else None)
        self.logprob_chunk = logprob_chunk
        if packing and (self.replay is not None or self.unified is not None):  # config.validate refuses it first
            raise ValueError(f"packing: precision {flow.name} trains through the sampler's code, not the HF module")
        if gradient_checkpointing:
            if self.replay is not None or self.unified is not None:  # config.validate refuses it first
                raise ValueError(f"gradient_checkpointing: precision {flow.name} trains through the sampler's code")
            # HF recomputes a layer only in train mode; the policy has no dropout, so train() changes nothing else.
            self.model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
            self.model.train()
        if self.world.distributed:
            if self.replay is not None or self.unified is not None:  # config.validate refuses it first
                raise ValueError(f"precision {flow.name}: not supported sharded (its trainer runs the sampler's code)")
            self._shard()
        self.params = [p for p in self.model.parameters() if p.requires_grad]
        self.opt = torch.optim.AdamW(self.params, lr=optim_cfg.lr, betas=tuple(optim_cfg.betas), eps=optim_cfg.eps,
                                     weight_decay=optim_cfg.weight_decay)
        self.grad_clip = optim_cfg.grad_clip
        self.scaler = LossScaler(enabled=flow.loss_scaling)

    def _shard(self) -> None:
        """FSDP2 over fp32 shards: every decoder layer is a unit, then the root (embeddings, final norm,
        head); fp32 all-gathers and fp32 reduce-scatters, summed (not averaged) over ranks."""
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
        """Autocast on the device the parameters live on (an autocast("cuda") around CPU tensors, or the
        reverse, would silently compute in fp32)."""
        if self.backend == "native" and self.dtype != torch.float32:
            return torch.autocast(self.autocast_device(), dtype=self.dtype)
        return contextlib.nullcontext()

    def autocast_device(self) -> str:
        return next(self.model.parameters()).device.type

    def full_weights(self) -> dict[str, torch.Tensor]:
        """Unsharded parameters (all-gathered from the FSDP2 shards on every rank): the weight sync's input."""
        if not self.world.distributed:
            return self.model.state_dict()
        return {n: p.full_tensor() for n, p in self.model.named_parameters()}

    @torch.no_grad()
    def observe(self) -> dict[str, str]:
        """The dtypes the trainer's forward actually produces: the first decoder GEMM's output and the
        logits (one tiny forward, on every rank), recorded in env.json instead of the configured dtype."""
        param_device = str(next(self.model.parameters()).device)
        if self.replay is not None or self.unified is not None:
            return {**self._observe_engine(self.replay or self.unified), "autocast_device": "none",
                    "param_device": param_device}
        seen = {}
        first = next(m for m in self.model.modules()
                     if isinstance(m, torch.nn.Linear) and m is not self.model.get_output_embeddings())
        hook = first.register_forward_hook(lambda m, i, o: seen.update(gemm=seen.get("gemm", o.dtype)))  # returns None
        try:
            ids = torch.full((1, 2), int(self.model.config.bos_token_id or 0), device=self.device)
            with self._autocast():
                logits = self.model(input_ids=ids).logits
        finally:
            hook.remove()
        device = self.autocast_device() if self.backend == "native" and self.dtype != torch.float32 else "none"
        return {"gemm_output": str(seen["gemm"]), "logits": str(logits.dtype), "autocast_device": device,
                "param_device": param_device}

    def _observe_engine(self, engine) -> dict[str, str]:
        """The same two dtypes for the flows that train through the sampler's code (exact, unified FP8):
        its first GEMM's output and its logits, seen in one tiny full-sequence pass on the training weights."""
        seen, lin, forward = {}, engine._lin, engine._forward

        def spy_lin(x, name):
            out = lin(x, name)
            seen.setdefault("gemm_output", str(out.dtype))
            return out

        def spy_forward(*args, **kwargs):
            out = forward(*args, **kwargs)
            seen.setdefault("logits", str(out.dtype))
            return out

        engine._lin, engine._forward = spy_lin, spy_forward  # instance attributes shadow the methods
        try:
            ids = torch.full((1, 3), int(self.model.config.bos_token_id or 0), device=self.device)
            with torch.no_grad():
                engine.score_full(ids, torch.ones_like(ids), 1, ids[:, -1:], 1.0,
                                  engine.training_weights(dict(self.model.named_parameters())))
        finally:
            del engine._lin, engine._forward
        return seen

    def logprobs(self, ids: torch.Tensor, attn: torch.Tensor, n_resp: int, targets: torch.Tensor,
                 temperature: float, routes: torch.Tensor | None = None,
                 kept: torch.Tensor | None = None, *,
                 centre: centering.SamplerDist | None = None) -> tuple[torch.Tensor, ...]:
        """Log-probs (B, R) of ``targets`` (the last ``n_resp`` tokens) and the entropy (B, R).

        ids/attn (B, P+R); the logits at position t predict token t+1. log_softmax runs in fp32
        on the compute-dtype logits divided by the sampling temperature, exactly as the sampler.
        ``routes`` (B, P+R, L, k): a mixture of experts runs each position through these experts (routing replay).
        ``kept`` (B, R, K): the sampler's kept ids, to renormalise over (truncated sampling).
        ``centre``: the sampler's distribution at each response position (score centering): a third
        output (B, R), E_t, whose gradient is the sampler-expected score (numerics/centering.py).
        """
        kept = None if kept is None else kept.to(self.device)
        centre = None if centre is None else centre.to(self.device)
        if centre is not None and self.flow.sampler_code:  # config.validate refuses it first
            raise ValueError(f"algo.score_centering: {self.flow.name} scores in the sampler's code")
        if self.routing is None:
            return self._logprobs(ids, attn, n_resp, targets, temperature, None, kept, centre)
        self.routing.replay, self.routing.seen = (None if routes is None else routes.to(self.device)), {}
        try:
            return self._logprobs(ids, attn, n_resp, targets, temperature, routes, kept, centre)
        finally:
            self.routing.replay = None

    def chosen_routes(self, batch: int) -> torch.Tensor | None:
        """The experts the trainer's own routers chose in the last forward, (B, S, L, k); None for a dense policy."""
        if self.routing is None:
            return None
        if self.unified is not None:
            return torch.stack(self.unified.routes_seen, 2) if self.unified.routes_seen else None
        return self.routing.chosen(batch)

    def _logprobs(self, ids, attn, n_resp, targets, temperature, routes, kept=None, centre=None):
        # One place moves a batch to this rank's device, for every flow: the HF module's, the replayed decode
        # loop's (exact) and the sampler code's (unified) forward alike.
        ids, attn, targets = ids.to(self.device), attn.to(self.device), targets.to(self.device)
        if self.replay is not None:
            weights = self.replay.training_weights(dict(self.model.named_parameters()))
            return self.replay.score(ids[:, :-n_resp], attn[:, :-n_resp].bool(), targets, temperature, weights, kept)
        if self.unified is not None:
            weights = self.unified.training_weights(dict(self.model.named_parameters()))
            return self.unified.score_full(ids, attn, n_resp, targets, temperature, weights,
                                           None if routes is None else routes.to(self.device), kept)
        if self.packing:
            return self._packed_logprobs(ids, attn, n_resp, targets, temperature, kept, centre)
        if self.trim_padding:
            return _padded_back(self._hf_logprobs, ids, attn, n_resp, targets, temperature, kept,
                                centre)
        return self._hf_logprobs(ids, attn, n_resp, targets, temperature, kept, centre)

    def _hf_logprobs(self, ids, attn, n_resp, targets, temperature, kept, centre=None):
        pos = (attn.cumsum(1) - 1).clamp(min=0)
        with self._autocast():
            logits = self.model(input_ids=ids, attention_mask=attn, position_ids=pos).logits
        logits = logits[:, -n_resp - 1:-1]  # (B, R, V)
        return self._scores(logits, targets, temperature, kept, centre)

    def _scores(self, logits, targets, temperature, kept, centre=None):
        """Log-probs and entropies (B, R) of logits (B, R, V) (and centering's E_t with ``centre``),
        in chunks of ``logprob_chunk`` positions when set."""
        n = logits.shape[1]
        if not self.logprob_chunk or self.logprob_chunk >= n:
            return _logp_entropy(logits, targets, temperature, kept, centre)
        # Chunks of positions, each recomputed in the backward pass: the fp32 log-softmax of one chunk is alive
        # at a time. Positions are independent, so the values equal the unchunked ones.
        from torch.utils.checkpoint import checkpoint

        c = self.logprob_chunk

        def part(x, i):  # positions i .. i + c of an optional (B, R, ...) input
            return None if x is None else x[:, i:i + c]
        parts = [checkpoint(_logp_entropy, logits[:, i:i + c], targets[:, i:i + c], temperature,
                            part(kept, i), part(centre, i), use_reentrant=False)
                 for i in range(0, n, c)]
        return tuple(torch.cat(outs, 1) for outs in zip(*parts))

    def _packed_logprobs(self, ids, attn, n_resp, targets, temperature, kept, centre=None):
        """``packing``: the micro-batch scored as one row (suite/numerics/packing.py). Only the M scored positions'
        logits are computed (1, M, V), their log-probs and entropies come back in the (B, R) shape, 0 elsewhere."""
        where, idx = packing.scored(attn, n_resp)
        logits = self._packed_logits(ids, attn, idx)
        out = self._scores(logits, targets[where][None], temperature,
                           None if kept is None else kept[where][None],
                           None if centre is None else centre[where][None])
        return tuple(packing.unpack(x[0], where) for x in out)

    def _packed_logits(self, ids, attn, idx):
        """The HF module's forward on the packed row: no attention mask and no cache, so that transformers builds
        the block-diagonal causal mask from the restarting position ids (packing.py says why); ``logits_to_keep``
        (a 1-D index tensor) keeps the head's GEMM to the predicting positions ``idx``. A mixture of experts replays
        the sampler's experts of the kept positions and reports its own in the padded layout."""
        packed, pos, keep = packing.pack(ids, attn)
        if self.routing is not None and self.routing.replay is not None:
            self.routing.replay = self.routing.replay[keep][None]  # (B, S, L, k) -> (1, N, L, k)
        with self._autocast():
            logits = self.model(input_ids=packed, position_ids=pos, use_cache=False, logits_to_keep=idx).logits
        if self.routing is not None:
            self.routing.seen = {i: packing.unpack_routes(s, keep) for i, s in self.routing.seen.items()}
        return logits  # (1, M, V)

    @torch.no_grad()
    def log_distribution(self, ids: torch.Tensor, attn: torch.Tensor, n_resp: int, temperature: float) -> torch.Tensor:
        """The trainer's full fp32 log-distribution (B, R, V) at each response position (HF module flows): for the
        full-vocabulary divergences of ``suite attribute`` and ``suite gate`` (mismatch.distribution_divergence).
        Packed, the positions it does not score (after a row's EOS) are 0, as its log-probs."""
        if self.replay is not None or self.unified is not None:
            raise ValueError(f"precision {self.flow.name}: the full distribution is read from the sampler's code")
        ids, attn = ids.to(self.device), attn.to(self.device)
        if self.packing:
            where, idx = packing.scored(attn, n_resp)
            logits = self._packed_logits(ids, attn, idx)[0]  # (M, V)
            return packing.unpack(torch.log_softmax(logits.float() / temperature, dim=-1), where)
        pos = (attn.cumsum(1) - 1).clamp(min=0)
        with self._autocast():
            logits = self.model(input_ids=ids, attention_mask=attn, position_ids=pos).logits
        return torch.log_softmax(logits[:, -n_resp - 1:-1].float() / temperature, dim=-1)

    def set_lr(self, lr: float) -> None:
        """The learning rate of the next update (the schedule is a pure function of the update index,
        suite/rl/recipe.py lr_factor, so nothing about it needs to be checkpointed)."""
        for group in self.opt.param_groups:
            group["lr"] = lr

    def step(self, loss_fns) -> dict:
        """One optimizer update: backward of the (scaled) loss, unscale, clip, step or skip.

        ``loss_fns`` is a closure returning (loss, metrics), or a list of (closure, weight) pairs,
        one per micro-batch: gradients accumulate over sum_i weight_i * loss_i (suite.rl.train.
        accumulation_weights makes that the minibatch loss), one forward graph alive at a time.
        """
        self.opt.zero_grad(set_to_none=True)
        parts = [(loss_fns, 1.0)] if callable(loss_fns) else loss_fns
        total, metrics, finite_loss = 0.0, {}, True
        # defer_grad_sync: FSDP2 accumulates the unsharded gradients of every micro-batch but the last and
        # reduce-scatters once (FSDP1's no_sync; pytorch#118298), one collective per unit per update instead of one
        # per micro-batch, at the price of the whole model's fp32 gradients on every rank until then. Off by default
        # as in torchtitan (pytorch/torchtitan#292, #1710) and verl (use_no_sync_for_gradient_accumulation).
        defer = self.defer_grad_sync and self.world.distributed and len(parts) > 1
        try:
            for i, (fn, w) in enumerate(parts):
                if defer:
                    self.model.set_requires_gradient_sync(i == len(parts) - 1)
                loss, m = fn()
                (loss * (w * self.scaler.scale)).backward()
                value = loss.item()  # one read per micro-batch (its value is logged)
                finite_loss = finite_loss and math.isfinite(value)
                total += w * value
                for k, v in m.items():  # weighted means of the micro-batch metrics (extremes stay extremes)
                    if k.endswith(("/max", "/min")) and k in metrics:
                        metrics[k] = max(metrics[k], v) if k.endswith("/max") else min(metrics[k], v)
                    else:
                        metrics[k] = (v if k.endswith(("/max", "/min")) else metrics.get(k, 0.0) + w * v)
        finally:
            if defer:  # the next update, and any other backward, syncs again
                self.model.set_requires_gradient_sync(True)
        if len(parts) > 1 or self.world.distributed:
            metrics["loss/policy"] = total
        metrics = self._global(metrics)
        found_inf = self.scaler.unscale_(self.params, self.world) or dist.any_rank(not finite_loss, self.world)
        if found_inf:
            grad_norm = float("nan")  # a skipped step reports NaN, never crashes
        else:
            grads = [p.grad for p in self.params if p.grad is not None]
            norm = torch.nn.utils.get_total_norm(grads, 2.0)  # what clip_grad_norm_ computes, then clips with
            norm = norm.full_tensor() if hasattr(norm, "full_tensor") else norm  # FSDP2: the global norm
            torch.nn.utils.clip_grads_with_norm_(self.params, self.grad_clip, norm)
            grad_norm = float(norm)
            self.opt.step()
        self.scaler.update(found_inf)
        return {**metrics, "train/grad_norm": grad_norm, "train/skipped": float(found_inf)}

    def _global(self, metrics: dict) -> dict:
        """The ranks' weighted micro-batch metrics combined: sums of the weighted means, max of maxima, min of minima
        (each rank's weights are its share of the global minibatch, so the sums are the global means)."""
        if not self.world.distributed:
            return metrics
        keys = sorted(metrics)
        out = {}
        for op in ("sum", "max", "min"):
            ks = [k for k in keys if (k.endswith("/max") and op == "max") or (k.endswith("/min") and op == "min")
                  or (not k.endswith(("/max", "/min")) and op == "sum")]
            if ks:
                t = dist.all_reduce(torch.tensor([float(metrics[k]) for k in ks], dtype=torch.float64), self.world, op)
                out.update(zip(ks, t.tolist()))
        return out
