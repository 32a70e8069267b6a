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
"""

from __future__ import annotations

import contextlib
import math

import torch

from suite.engine import TorchEngine
from suite.precision import Flow, emulate_autocast, fp8_decoder_linears, fp32_lm_head


class LossScaler:
    """Dynamic loss scaling (GradScaler defaults: 2^16 start, x2 growth, x0.5 back-off)."""

    def __init__(self, enabled: bool, init_scale: float = 2.0**16, growth_interval: int = 400,
                 growth: float = 2.0, backoff: float = 0.5):
        self.enabled = enabled
        self.scale = init_scale if enabled else 1.0
        self.growth_interval, self.growth, self.backoff = growth_interval, growth, backoff
        self.good_steps = 0
        self.skipped = 0

    def unscale_(self, params: list[torch.nn.Parameter]) -> bool:
        """Divide grads by the scale in place; return True when any grad is inf or nan."""
        found_inf = False
        for p in params:
            if p.grad is None:
                continue
            if self.enabled:
                p.grad.div_(self.scale)
            found_inf = found_inf or not bool(torch.isfinite(p.grad).all())
        return found_inf

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


class Trainer:
    """Holds the fp32 master model, its optimizer and loss scaler."""

    def __init__(self, model: torch.nn.Module, flow: Flow, backend: str, optim_cfg, lm_head_fp32: bool = False):
        self.model = model.float()
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
        # The exact flow (bitwise on-policy, vLLM + TorchTitan style): score with the sampler's
        # own forward, replaying its decode loop, so trainer and sampler run identical kernels.
        self.replay = (TorchEngine(self.model.config, self.dtype, backend, lm_head_fp32=lm_head_fp32,
                                   functional_cache=True) if flow.exact else None)
        # The unified FP8 flow (Jet-RL): the trainer's forward runs the sampler's own code (bf16
        # activations, the same FP8 quantisers) on the full sequence, so the sampler's computation
        # is a subgraph of it; only GEMM shapes differ.
        self.unified = (TorchEngine(self.model.config, self.dtype, backend, lm_head_fp32=lm_head_fp32,
                                    quant="fp8") if flow.trainer_quant == "fp8" else None)
        self.params = [p for p in self.model.parameters() if p.requires_grad]
        self.opt = torch.optim.AdamW(self.params, lr=optim_cfg.lr, betas=tuple(optim_cfg.betas), eps=optim_cfg.eps,
                                     weight_decay=optim_cfg.weight_decay)
        self.grad_clip = optim_cfg.grad_clip
        self.scaler = LossScaler(enabled=flow.loss_scaling)

    def _autocast(self):
        if self.backend == "native" and self.dtype != torch.float32:
            return torch.autocast("cpu" if not torch.cuda.is_available() else "cuda", dtype=self.dtype)
        return contextlib.nullcontext()

    def logprobs(self, ids: torch.Tensor, attn: torch.Tensor, n_resp: int, targets: torch.Tensor,
                 temperature: float) -> tuple[torch.Tensor, torch.Tensor]:
        """Log-probs (B, R) of ``targets`` (the last ``n_resp`` tokens) and the entropy (B, R).

        ids/attn (B, P+R); the logits at position t predict token t+1. log_softmax runs in fp32
        on the compute-dtype logits divided by the sampling temperature, exactly as the sampler.
        """
        if self.replay is not None:
            weights = self.replay.training_weights(dict(self.model.named_parameters()))
            return self.replay.score(ids[:, :-n_resp], attn[:, :-n_resp].bool(), targets, temperature, weights)
        if self.unified is not None:
            weights = self.unified.training_weights(dict(self.model.named_parameters()))
            return self.unified.score_full(ids, attn, n_resp, targets, temperature, weights)
        pos = (attn.cumsum(1) - 1).clamp(min=0)
        with self._autocast():
            logits = self.model(input_ids=ids, attention_mask=attn, position_ids=pos).logits
        logp_all = torch.log_softmax(logits[:, -n_resp - 1:-1].float() / temperature, dim=-1)  # (B, R, V)
        logp = logp_all.gather(-1, targets[..., None])[..., 0]
        entropy = -(logp_all.exp() * logp_all).sum(-1)
        return logp, entropy

    def step(self, loss_fns) -> dict:
        """One optimizer update: backward of the (scaled) loss, unscale, clip, step or skip.

        ``loss_fns`` is a closure returning (loss, metrics), or a list of (closure, weight) pairs,
        one per micro-batch: gradients accumulate over sum_i weight_i * loss_i (suite.train.
        accumulation_weights makes that the minibatch loss), one forward graph alive at a time.
        """
        self.opt.zero_grad(set_to_none=True)
        parts = [(loss_fns, 1.0)] if callable(loss_fns) else loss_fns
        total, metrics, finite_loss = 0.0, {}, True
        for fn, w in parts:
            loss, m = fn()
            (loss * (w * self.scaler.scale)).backward()
            finite_loss = finite_loss and math.isfinite(loss.item())
            total += w * loss.item()
            for k, v in m.items():  # weighted means of the micro-batch metrics (extremes stay extremes)
                if k.endswith(("/max", "/min")) and k in metrics:
                    metrics[k] = max(metrics[k], v) if k.endswith("/max") else min(metrics[k], v)
                else:
                    metrics[k] = (v if k.endswith(("/max", "/min")) else metrics.get(k, 0.0) + w * v)
        if len(parts) > 1:
            metrics["loss/policy"] = total
        found_inf = self.scaler.unscale_(self.params) or not finite_loss
        if found_inf:
            grad_norm = float("nan")  # a skipped step reports NaN, never crashes (REFERENCE section 3)
        else:
            grad_norm = float(torch.nn.utils.clip_grad_norm_(self.params, self.grad_clip))
            self.opt.step()
        self.scaler.update(found_inf)
        return {**metrics, "train/grad_norm": grad_norm, "train/skipped": float(found_inf)}

    def state_dict(self) -> dict:
        return {"model": self.model.state_dict(), "opt": self.opt.state_dict(), "scaler": self.scaler.state_dict()}

    def load_state_dict(self, s: dict) -> None:
        self.model.load_state_dict(s["model"])
        self.opt.load_state_dict(s["opt"])
        self.scaler.load_state_dict(s["scaler"])
