"""A top-k mixture-of-experts feed-forward block, computed the same way by the sampler and the
trainer, and rollout routing replay.

Why it matters for precision (hypothesis H4 of the collapse search, docs/hypotheses.md): the router
picks the top-k experts of each token from its logits, so a rounding difference between the two
engines near a tie flips a *discrete* choice, and the token then runs through another expert's
weights: a small numeric gap becomes a large one. Published: on a 30B MoE most tokens take a
different expert in at least one layer between the rollout and the training engine (Rollout Routing
Replay, "R3", arXiv 2510.11370). R3 fixes it by replaying the experts the sampler chose in the
trainer's forward, while the routing *weights* still come from the trainer's own router
probabilities, so the router keeps its gradient.

Layout and semantics are Mixtral's as in transformers 5 (``MixtralSparseMoeBlock``): router
``mlp.gate.weight`` (E, H); experts ``mlp.experts.gate_up_proj`` (E, 2I, H) and
``mlp.experts.down_proj`` (E, H, I); softmax over the E router logits in fp32, top-k, weights
renormalised to sum to 1; SwiGLU experts. ``linear`` is the engine's GEMM in its compute dtype
(native autocast, an emulated low-precision GEMM, or the sampler's own).
"""

from __future__ import annotations

import functools

import torch
import torch.nn.functional as F
from torch import Tensor


def route(logits: Tensor, k: int, replay: Tensor | None = None) -> tuple[Tensor, Tensor, Tensor]:
    """(weights (N, k) fp32, experts (N, k) long, own top-k (N, k)) from router logits (N, E).

    ``replay`` (N, k): experts chosen elsewhere (the sampler), -1 where there is none (then the own
    top-k is used); the weights are this router's probabilities of the experts used, renormalised
    (R3).
    """
    probs = torch.softmax(logits.float(), dim=-1)
    own = torch.topk(probs, k, dim=-1).indices
    idx = own if replay is None else torch.where(replay >= 0, replay.to(own.device), own)
    top = probs.gather(-1, idx)
    return top / top.sum(-1, keepdim=True), idx, own


def experts(x: Tensor, gate_up: Tensor, down: Tensor, idx: Tensor, weights: Tensor,
            linear) -> Tensor:
    """sum_j weights[n, j] * expert_{idx[n, j]}(x[n]) for tokens x (N, H); the weighted sum in fp32,
    rounded once to x's dtype (out-of-place, so autograd reaches every expert's weights)."""
    out = torch.zeros(x.shape, dtype=torch.float32, device=x.device)
    for e in range(gate_up.shape[0]):
        tok, slot = torch.where(idx == e)
        if tok.numel() == 0:
            continue
        gate, up = linear(x[tok], gate_up[e]).chunk(2, dim=-1)
        y = linear(F.silu(gate) * up, down[e])
        out = out.index_add(0, tok, y.float() * weights[tok, slot, None])
    return out.to(x.dtype)


class Routing:
    """Per forward pass: the experts to replay (B, S, L, k) or None, and the top-k each layer chose
    itself."""

    def __init__(self):
        self.replay: Tensor | None = None
        self.seen: dict[int, Tensor] = {}

    def for_layer(self, layer: int, n: int) -> Tensor | None:
        if self.replay is None:
            return None
        r = self.replay[:, :, layer]  # (B, S, k)
        if r.shape[0] * r.shape[1] != n:
            raise ValueError(f"routing replay: {tuple(r.shape[:2])} routed positions for {n} "
                             "tokens")
        return r.reshape(n, -1)

    def chosen(self, batch: int) -> Tensor | None:
        """The own top-k of the last forward, (B, S, L, k), or None before any."""
        if not self.seen:
            return None
        return torch.stack([self.seen[i].reshape(batch, -1, self.seen[i].shape[-1])
                            for i in sorted(self.seen)], 2)


def block_forward(block, hidden: Tensor, *, layer: int, routing: Routing, linear) -> Tensor:
    """Our forward of an HF ``MixtralSparseMoeBlock`` (replaces its own: the replay hook, and the
    same numerics as the sampler's ``TorchEngine``): (B, S, H) -> (B, S, H)."""
    B, S, H = hidden.shape
    x = hidden.reshape(-1, H)
    w, idx, own = route(linear(x, block.gate.weight), block.gate.top_k,
                        routing.for_layer(layer, B * S))
    routing.seen[layer] = own.detach()
    return experts(x, block.experts.gate_up_proj, block.experts.down_proj, idx, w,
                   linear).reshape(B, S, H)


def patch_hf(model: torch.nn.Module, routing: Routing, linear=None) -> int:
    """Route every MoE block of an HF Mixtral-layout model through ``block_forward`` (in place);
    returns how many. ``linear`` defaults to F.linear (under autocast: the autocast dtype's
    GEMM)."""
    linear = linear or (lambda x, w: F.linear(x, w))
    n = 0
    for i, layer in enumerate(model.model.layers):
        block = layer.mlp
        if hasattr(block, "experts") and hasattr(block, "gate"):
            block.forward = functools.partial(block_forward, block, layer=i, routing=routing,
                                              linear=linear)
            n += 1
    return n


def flip_fraction(sampler: Tensor, trainer: Tensor, valid: Tensor) -> float:
    """Share of (token, layer) pairs whose top-k expert *set* differs between two routings (B, S, L,
    k), over the positions ``valid`` (B, S) where the sampler recorded one."""
    a, b = sampler.sort(-1).values, trainer.to(sampler.device).sort(-1).values
    differ = (a != b).any(-1)  # (B, S, L)
    m = valid[..., None].expand_as(differ) & (sampler[..., 0] >= 0)
    return float(differ[m].double().mean()) if bool(m.any()) else float("nan")
