"""Sequence packing: a micro-batch's sequences, every pad dropped, concatenated into one row.

This is verl's ``use_remove_padding``, TRL's ``padding_free`` and OpenRLHF's ``packing_samples``:
the trainer's forward sees one row of N = (attended tokens of the micro-batch) positions instead of
B rows of the padded length S. Position ids restart at 0 for each sequence (the positions the padded
forward computes from the mask's cumulative sum), and attention is block-diagonal and causal: a
token sees the earlier tokens of its own sequence only. Every per-token computation is the padded
forward's on other GEMM shapes, so the log-probs differ from the padded ones by the kernels'
summation order only (batch variance, which is what ``suite attribute``'s ``packing`` source
measures).

How the block-diagonal mask reaches attention. transformers' masking utilities detect packed rows
from the position ids (``masking_utils.find_packed_sequence_indices``, in every version pyproject
allows, >= 4.56): when the forward gets no attention mask and no KV cache, a new sequence starts
wherever the position ids do not increase by 1, and ``create_causal_mask`` ANDs the causal mask with
"same sequence". Each attention implementation then gets its own form of that mask: SDPA a boolean
(1, 1, N, N) one, eager an additive float one, the suite's emulated attention
(precision.emulate_autocast registers SDPA's mask function for it) the boolean one, and
flash-attention-2 none at all, but the varlen kernel's cu_seqlens from the same position ids. We use
that path rather than passing our own 4D mask, which transformers also accepts as is, because a 4D
mask must already be in the implementation's form (eager adds it to the scores: a boolean one would
add 0/1), and because it leaves flash-attention its mask-free kernel. Hence the forward passes
``use_cache=False``: with a cache (HF builds one whenever ``use_cache`` is on) the detection is
skipped and the row would be one causal sequence. The cost with SDPA and eager: the N x N mask is
materialised and attention computes every (query, key) pair of the row, the masked blocks included,
about B times the padded batch's pairs when the rows have similar lengths (the memory plan counts
the mask, suite/numerics/memory.py). Only flash-attention's varlen kernel avoids both, which is why
padding-free training is usually paired with it (transformers' "Padding-free training" guide).
"""

from __future__ import annotations

import torch


def pack(ids: torch.Tensor, attn: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(B, S) ids and mask -> the packed ids (1, N), their position ids (1, N) and the kept
    positions (B, S).

    Positions are the padded forward's, (cumsum of the mask) - 1 at every attended position, so each
    sequence starts at 0 and a row's holes (none in a rollout batch: left-padded prompt,
    right-padded response) are skipped exactly as the padded forward skips them."""
    keep = attn.bool()
    pos = attn.long().cumsum(1) - 1
    return ids[keep][None], pos[keep][None], keep


def scored(attn: torch.Tensor, n_resp: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The response positions the packed forward scores, (B, R) bool, and for each of them
    (row-major) the index in the packed row of the token whose logits predict it, (M,).

    Response token r of a row is scored when it is attended and so is the token before it (its
    predictor: the last prompt token for r = 0). Every other position, the pads after a row's EOS,
    is not computed at all and comes back as 0, as ``_padded_back`` returns the columns it drops."""
    keep = attn.bool()
    S = keep.shape[1]
    where = keep[:, S - n_resp:] & keep[:, S - n_resp - 1:S - 1]  # (B, R)
    # (B, S): index in the packed row
    packed_index = keep.flatten().long().cumsum(0).view_as(keep) - 1
    return where, packed_index[:, S - n_resp - 1:S - 1][where]


def unpack(values: torch.Tensor, where: torch.Tensor) -> torch.Tensor:
    """Values of the scored positions (M, ...) -> (B, R, ...), 0 at the others; differentiable."""
    out = values.new_zeros((*where.shape, *values.shape[1:]))
    return out.masked_scatter(where.view(*where.shape, *[1] * (values.dim() - 1)).expand_as(out),
                              values)


def unpack_routes(seen: torch.Tensor, keep: torch.Tensor) -> torch.Tensor:
    """A MoE layer's own top-k of the packed row, (N, k) -> (B * S, k) in the padded layout, -1 at
    the pads (where the sampler records none either), so ``Routing.chosen`` reshapes it as after a
    padded forward."""
    out = seen.new_full((keep.numel(), seen.shape[-1]), -1)
    out[keep.flatten()] = seen
    return out
