"""Truncated sampling (top-k, top-p) and what each engine records about it: pure functions.

A sampler with ``top_p < 1`` or ``top_k > 0`` draws from the distribution restricted to a *kept set*
K_t and renormalised over it, mu_K(y) = mu(y) / M_t with the kept mass M_t = sum_{v in K_t} mu(v).
vLLM's ``processed_logprobs`` (what verl, TRL and SkyRL hand to their trainers) are log mu_K. A
trainer that scores the full vocabulary then sees the ratio pi(y) / mu_K(y) = M_t x pi(y) / mu(y):
where the engines otherwise agree the ratio's mean is the kept mass, and every token whose M_t < 0.9
falls outside [0.9, 1.1] (TRL issue 7269; vLLM RFC 42259). Renormalising the trainer over the
*sampler's* kept set, pi_K(y) = pi(y) / sum_{v in K_t} pi(v), removes that term exactly.

The kept set is stored as padded ids, (B, R, K) with -1 after the last kept id (K = the largest kept
set of the batch), not as a (B, R, V) mask: a 150k vocabulary would make the mask the largest tensor
of a step. Both sides compute the renormalised log-prob with ``renormalised`` below, the same
function on the same values, so where the engines compute identically (the exact flow) the ratio is
exactly 1.
"""

from __future__ import annotations

import torch

# what the trainer does about the sampler's kept set (config sampling.truncation)
TRUNCATION = ("none", "renormalise")


def active(top_p: float, top_k: int) -> bool:
    return top_p < 1.0 or top_k > 0


def keep_mask(logp: torch.Tensor, top_p: float, top_k: int) -> torch.Tensor:
    """Kept set (B, V) bool of fp32 log-probs (B, V): the top ``top_k`` (0: all), then the smallest
    prefix by descending probability whose mass (within the top-k, renormalised, as vLLM applies
    top-p after top-k) reaches ``top_p``. The most likely token is always kept."""
    probs = logp.exp()
    keep = torch.ones_like(probs, dtype=torch.bool)
    if top_k > 0 and top_k < probs.shape[-1]:
        kth = probs.topk(top_k, dim=-1).values[..., -1:]  # (B, 1)
        keep = probs >= kth
        probs = probs.masked_fill(~keep, 0.0)
    if top_p < 1.0:
        sp, si = probs.sort(dim=-1, descending=True)
        total = sp.sum(-1, keepdim=True) if top_k > 0 else 1.0
        drop = sp.cumsum(-1) - sp > top_p * total  # mass before this token already reaches top_p
        keep = keep & torch.zeros_like(keep).scatter(-1, si, ~drop)
    return keep


def kept_ids(keep: torch.Tensor) -> torch.Tensor:
    """(..., V) bool -> (..., K) int64 ids of the kept tokens in vocabulary order, -1 padded."""
    n = int(keep.sum(-1).max()) if keep.numel() else 0
    # kept ids first, in id order
    order = torch.argsort((~keep).to(torch.int8), dim=-1, stable=True)[..., :n]
    return torch.where(keep.gather(-1, order), order, torch.full_like(order, -1))


def renormalised(logp_all: torch.Tensor, targets: torch.Tensor,
                 kept: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(log p_K(target), log M): the log-prob of ``targets`` (...) renormalised over the kept ids
    (..., K) and the log of the kept mass, from full log-probs (..., V). Differentiable in
    ``logp_all``."""
    picked = logp_all.gather(-1, kept.clamp(min=0))  # (..., K)
    log_mass = torch.logsumexp(picked.masked_fill(kept < 0, -torch.inf), dim=-1)  # (...)
    return logp_all.gather(-1, targets[..., None])[..., 0] - log_mass, log_mass


def pad_kept(parts: list[torch.Tensor], R: int) -> torch.Tensor:
    """Kept ids of several batches (B_i, R_i, K_i) -> one (sum B_i, R, max K_i), -1 padded."""
    K = max(p.shape[-1] for p in parts)
    return torch.cat([torch.nn.functional.pad(p, (0, K - p.shape[-1], 0, R - p.shape[1]), value=-1)
                      for p in parts])


def stack_kept(steps: list[torch.Tensor]) -> torch.Tensor:
    """Kept ids of each decoding step, (B, K_t) each -> (B, R, max K_t), -1 padded."""
    K = max(k.shape[-1] for k in steps)
    return torch.stack([torch.nn.functional.pad(k, (0, K - k.shape[-1]), value=-1) for k in steps],
                       1)
