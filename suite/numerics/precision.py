"""Precision flows: the one place where a run's precision becomes dtypes.

A *precision flow* names how both engines compute (arXiv 2510.26788 Sec. 4; Jet-RL, arXiv
2601.14243):

- the **trainer** keeps fp32 master weights and fp32 optimizer states in every flow
  (as the published sanity test does, arXiv 2510.26788 section 4) and runs its
  forward under ``torch.autocast`` in ``trainer_dtype``;
- the **sampler** (the rollout engine, vLLM-like) holds its own copy of the weights
  *cast* to ``sampler_dtype`` and computes everything in it: weights, activations,
  KV cache and logits; only the final log-softmax runs in fp32;
- fp16 training needs dynamic loss scaling (``loss_scaling``) or its small gradients
  underflow and it ends up worse than bf16 (same paper, section 3).

**GEMM emulation.** Low-precision GEMMs on tensor cores (and on CPUs with AMX / AVX512-BF16)
take low-precision inputs, multiply exactly, accumulate in fp32 and round the output once.
On a CPU without those units (AVX2 only, like this project's CI machine) torch falls back to
a bf16/fp16 GEMM about 10x slower than fp32. Because the product of two bf16 (8-bit
significand) or fp16 (11-bit) numbers is exact in fp32 (24-bit), ``upcast -> fp32 GEMM ->
round`` computes the same thing as the hardware kernel up to accumulation order
(``lowp_linear``); attention is emulated the way FlashAttention computes it (scores and
softmax in fp32, probabilities rounded to the dtype before the PV product, ``lowp_attention``).
Autograd through the casts rounds the backward GEMM outputs the same way autocast does.
``gemm_backend`` picks ``native`` (real autocast / kernels) or ``emulated`` once per run.

Every other module asks this table; nothing else names a dtype for a run. The sampler
is built from ``Flow.sampler_dtype`` and checks it at every weight sync, so an "fp16"
run cannot silently sample in bf16 (the OpenRLHF failure STYLE.md mentions).
"""

from __future__ import annotations

import functools
import math
from pathlib import Path

import torch
import torch.nn.functional as F

from suite.numerics.flows import FLOWS, TORCH_DTYPES, Flow, main_flows, resolve  # noqa: F401 (the table, re-exported)

DTYPES = {name: getattr(torch, dtype) for name, dtype in TORCH_DTYPES.items()}


# ---- GEMM backend ------------------------------------------------------------------------
_NATIVE_FLAGS = {torch.bfloat16: ("avx512_bf16", "amx_bf16"),
                 torch.float16: ("avx512_fp16", "amx_fp16")}


@functools.cache
def _cpu_flags() -> frozenset[str]:
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return frozenset()
    return frozenset(w for line in text.splitlines() if line.startswith("flags")
                     for w in line.split())


def gemm_backend(choice: str, dtype: torch.dtype, device: str = "cpu") -> str:
    """Resolve ``auto|native|emulated`` for one compute dtype on one device."""
    if choice not in ("auto", "native", "emulated"):
        raise ValueError(f"gemm: unknown backend '{choice}' (auto, native, emulated)")
    if choice != "auto":
        return choice
    if dtype == torch.float32 or device != "cpu":
        return "native"
    return "native" if _cpu_flags() & set(_NATIVE_FLAGS[dtype]) else "emulated"


def lowp_linear(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None, dtype: torch.dtype,
                w32: torch.Tensor | None = None) -> torch.Tensor:
    """A ``dtype`` GEMM with fp32 accumulation, computed in fp32: y = round(round(x) @ round(w).T +
    b).

    ``w32`` is an optional fp32 copy of the already-rounded weight (the sampler caches it).
    Output dtype is ``dtype``, as under autocast.
    """
    wl = w32 if w32 is not None else w.to(dtype).float()
    bl = None if b is None else b.to(dtype).float()
    return F.linear(x.to(dtype).float(), wl, bl).to(dtype)


def lowp_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, keep: torch.Tensor | None,
                   scale: float, dtype: torch.dtype) -> torch.Tensor:
    """FlashAttention numerics in fp32: q, k, v (B, H, S|T, D) in ``dtype``; keep (B, 1, S, T) bool.

    Scores and softmax in fp32; the probabilities are rounded to ``dtype`` before the PV
    GEMM (FlashAttention-2 does the same); the output is rounded to ``dtype``.
    """
    B, H, S, D = q.shape
    Hkv, T = k.shape[1], k.shape[2]
    # Grouped-query attention without copying K/V: the G = H / Hkv query heads that share a KV
    # head are stacked along the query axis, (B, Hkv, G*S, D) @ (B, Hkv, D, T).
    qg = q.to(dtype).float().reshape(B, Hkv, (H // Hkv) * S, D)
    s = torch.matmul(qg, k.to(dtype).float().transpose(-1, -2)) * scale  # (B, Hkv, G*S, T)
    s = s.view(B, Hkv, H // Hkv, S, T)
    if keep is not None:
        # A fully masked row (a left-pad query) would softmax to NaN, and 0 * NaN in the next
        # PV product poisons real rows: let such rows attend everywhere (HF's "torch fix").
        keep = keep | ~keep.any(dim=-1, keepdim=True)
        s = s.masked_fill(~keep[:, :, None], -math.inf)  # keep (B, 1, S, T) -> (B, 1, 1, S, T)
    p = torch.softmax(s, dim=-1).to(dtype).float().view(B, Hkv, -1, T)
    return torch.matmul(p, v.to(dtype).float()).view(B, H, S, D).to(dtype)


def _hf_lowp_attention(module, query, key, value, attention_mask, dropout=0.0, scaling=None,
                       is_causal=None, **kwargs):
    """``transformers`` attention function (AttentionInterface) built on ``lowp_attention``."""
    dtype = module._suite_dtype
    S, T = query.shape[-2], key.shape[-2]
    if attention_mask is None:
        keep = torch.ones(S, T, dtype=torch.bool, device=query.device).tril(T - S)[None, None]
    elif attention_mask.dtype == torch.bool:
        keep = attention_mask
    else:  # additive float mask (0 keep, large negative drop)
        keep = attention_mask > torch.finfo(attention_mask.dtype).min / 2
    scale = scaling if scaling is not None else query.shape[-1] ** -0.5
    out = lowp_attention(query, key, value, keep[..., :T], scale, dtype)
    return out.transpose(1, 2).contiguous(), None


def fp8_decoder_linears(model: torch.nn.Module) -> None:
    """Route every linear layer but the output head through Jet-RL's FP8 linear (in place).

    Forward, input-gradient and weight-gradient GEMMs all run on block-scaled FP8 operands
    (suite/numerics/fp8.py); outputs are bf16, master weights and their gradients stay fp32.
    """
    from suite.numerics.fp8 import fp8_linear

    head = model.get_output_embeddings()
    for m in model.modules():
        if isinstance(m, torch.nn.Linear) and m is not head:
            m.forward = functools.partial(
                lambda mod, x: fp8_linear(x, mod.weight, mod.bias, torch.bfloat16), m)
            m._suite_gemm = "fp8"  # recorded so tests and env.json can see what each layer computes


def fp32_lm_head(model: torch.nn.Module) -> None:
    """Compute the model's output head in fp32 whatever the autocast dtype (in place).

    ScaleRL / MiniMax-M1 / TRL ``cast_lm_head_to_fp32``: the logits, hence every log-prob, come
    from an fp32 GEMM on fp32 weights. Applied to sampler and trainer together, one-sided
    makes the mismatch worse (arXiv 2510.26788 discusses the LM-head fix).
    """
    head = model.get_output_embeddings()

    def forward(x, head=head):
        with torch.autocast(x.device.type, enabled=False):
            return F.linear(x.float(), head.weight.float(), None if head.bias is None
                            else head.bias.float())

    head.forward = forward
    head._suite_gemm = "fp32"


def emulate_autocast(model: torch.nn.Module, dtype: torch.dtype) -> None:
    """Make an HF model compute like ``torch.autocast(dtype)`` with emulated GEMMs (in place).

    Every ``nn.Linear`` computes through ``lowp_linear`` (parameters untouched: still fp32
    masters) and attention through ``lowp_attention``; everything else keeps autocast's
    type-promotion behaviour (fp32 residual stream, fp32 norms).
    """
    from transformers import AttentionInterface
    from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, sdpa_mask

    AttentionInterface.register("suite_lowp", _hf_lowp_attention)
    ALL_MASK_ATTENTION_FUNCTIONS.register("suite_lowp", sdpa_mask)
    for m in model.modules():
        if isinstance(m, torch.nn.Linear):
            m.forward = functools.partial(
                lambda mod, x: lowp_linear(x, mod.weight, mod.bias, dtype), m)
            m._suite_gemm = f"emulated-{dtype}"
        m._suite_dtype = dtype
    model.config._attn_implementation = "suite_lowp"
