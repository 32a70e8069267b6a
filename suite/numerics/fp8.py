"""FP8 linear layers with the DeepSeek-V3 / Jet-RL block-scaled recipe (arXiv 2412.19437 Sec. 3.3; Jet-RL, arXiv 2601.14243).

The format
==========
``torch.float8_e4m3fn`` (E4M3): 1 sign, 4 exponent and 3 mantissa bits, no infinities,
largest finite value 448, smallest normal 2^-6, smallest subnormal 2^-9. Three mantissa
bits mean round-to-nearest has a relative error of at most 2^-4 = 6.25% for values in the
normal range. The range is tiny (448 / 2^-9 ~ 2^18), so a tensor only fits if it is first
divided by a *scale*; one scale per whole tensor lets a single outlier push every other
value into the subnormals. Hence fine-grained scales, one fp32 number per small tile:

    scale = amax(tile) / 448        (amax == 0 -> scale 1, so an all-zero tile stays zero)
    q     = clamp(x / scale, -448, 448).to(float8_e4m3fn)     # clamp first: older torch
    x_hat = q.float() * scale                                 # turns overflow into NaN

The tiles (a GEMM ``out = A @ B.T`` reduces over K; every scale covers one K-slice of 128
so that, per K-slice, a scale factors out of the dot product):

- weights (N, K): one scale per 128x128 block           -> scales (ceil(N/128), ceil(K/128))
- activations and gradients (..., K): one scale per 1x128 group along K
                                                         -> scales (..., ceil(K/128))
- the weight-gradient GEMM ``dW = dY.T @ X`` reduces over *tokens*, so both of its
  operands are (re-)quantised in 128x1 groups along the token dimension (``dim=0``).

Shapes not divisible by 128: the last block/group is ragged (covers fewer elements). It is
implemented by zero-padding before the amax (zeros never change an amax) and slicing the
padding off again; no padded value ever leaves this module.

The linear layer (Jet-RL's unified flow)
========================================
All three GEMMs of a linear layer run on FP8 operands, accumulate in fp32:

    forward:      y  = Q1x128(x)  @ Q128x128(W).T            -> out_dtype (bf16)
    input grad:   dx = Q1x128(dy) @ Q128x128(W)   (same blocks) -> x.dtype
    weight grad:  dW = Q128x1(dy).T @ Q128x1(x_hat)              -> fp32 (master grads)

Only the FP8 operands are saved for backward (Jet-RL stores activations in FP8), so the
weight-gradient operand is re-quantised from the dequantised FP8 activation ``x_hat``,
not from the original x. Gradients between operators stay in bf16.

Emulation vs real kernels
=========================
The error of FP8 training comes from quantise/dequantise, not from the kernel. On CPU
(and on GPUs without FP8 tensor cores) ``_gemm`` dequantises both operands and runs an fp32
GEMM, like ``precision.lowp_linear`` does for bf16. On a CUDA device of capability >= 8.9
the same quantised operands feed ``torch._scaled_mm``. That op only takes tensor-wise or
row-wise fp32 scales, so the block recipe is computed one 128-wide K-slice at a time (within
a slice every scale is per-row of A / per-column of B) and the fp32 partial products are
summed: DeepGEMM's "promote to fp32 every K block". Layout rules of ``_scaled_mm``: A
row-major (M, K), B column-major (K, N) (i.e. ``b.t()`` of a contiguous (N, K) tensor),
K and N multiples of 16; scale_a (M, 1), scale_b (1, N), fp32. Both paths give the same
numbers up to accumulation order (and the emulation's fp32 rounding of q * scale).

Cost of the emulation on CPU: the GEMMs are ordinary fp32 GEMMs; the overhead is the
elementwise work (amax, divide, clamp, fp32 <-> fp8 casts, which torch does slowly on CPU),
about 1-2x an fp32 ``F.linear`` in the forward and ~4x forward + backward, where the
gradient is quantised twice (1x128 and 128x1) and x re-quantised. Weight-gradient operands
are grouped along tokens in their own (token-major) layout, never transposed in memory.
"""

from __future__ import annotations

import math

import warnings

import torch
import torch.nn.functional as F

E4M3_MAX = 448.0  # torch.finfo(torch.float8_e4m3fn).max
BLOCK = 128  # tile edge of the recipe (weights 128x128, activations 1x128)
FP8 = torch.float8_e4m3fn


# ---- quantisers --------------------------------------------------------------------------
def _scale_from_amax(amax: torch.Tensor) -> torch.Tensor:
    """fp32 dequantisation scale amax / 448; 1 where that is 0 (all-zero tile, or an amax
    so tiny that amax / 448 underflows), so that x / scale never divides by zero."""
    s = amax.float() / E4M3_MAX
    return torch.where(s > 0, s, torch.ones_like(s))


def _to_e4m3(x: torch.Tensor) -> torch.Tensor:
    """Round fp32 values already divided by their scale to E4M3 (saturating, not NaN)."""
    return x.clamp(-E4M3_MAX, E4M3_MAX).to(FP8)


def _tiles(x: torch.Tensor, dim: int, group: int) -> torch.Tensor:
    """x -> (pre, G, group, post): ``dim`` cut into G = ceil(L/group) groups, zero-padded
    (zeros never change an amax). A reshape, so no transpose copy whatever ``dim`` is."""
    dim = dim % x.dim()
    L, G = x.shape[dim], math.ceil(x.shape[dim] / group)
    t = x.reshape(math.prod(x.shape[:dim]), L, math.prod(x.shape[dim + 1 :]))
    if G * group != L:
        t = F.pad(t, (0, 0, 0, G * group - L))
    return t.reshape(t.shape[0], G, group, t.shape[2])


def _untile(t: torch.Tensor, shape: torch.Size, dim: int) -> torch.Tensor:
    """(pre, G, group, post) -> ``shape``: drop the padding again."""
    return t.flatten(1, 2)[:, : shape[dim]].reshape(shape)


def _scale_shape(shape: torch.Size, dim: int, group: int) -> list[int]:
    out = list(shape)
    out[dim] = math.ceil(shape[dim] / group)
    return out


def quantize_groupwise(x: torch.Tensor, group: int = BLOCK, dim: int = -1) -> tuple[torch.Tensor, torch.Tensor]:
    """One scale per ``group`` consecutive elements along ``dim``.

    x (..., K) with dim=-1 -> q float8 (..., K), scales fp32 (..., ceil(K/group))  [1x128]
    x (T, K)   with dim=0  -> q float8 (T, K),   scales fp32 (ceil(T/group), K)    [128x1]
    The scales keep x's layout with the grouped dimension shrunk by ``group``.
    """
    tiles = _tiles(x.float(), dim, group)  # (pre, G, group, post)
    scales = _scale_from_amax(tiles.abs().amax(dim=2))  # (pre, G, post)
    q = _untile(_to_e4m3(tiles / scales[:, :, None]), x.shape, dim)
    return q, scales.reshape(_scale_shape(x.shape, dim, group))


def dequantize_groupwise(q: torch.Tensor, scales: torch.Tensor, group: int = BLOCK, dim: int = -1) -> torch.Tensor:
    """Inverse of ``quantize_groupwise`` (same ``group`` and ``dim``): fp32, q's shape."""
    tiles = _tiles(q.float(), dim, group)  # (pre, G, group, post)
    return _untile(tiles * scales.reshape(tiles.shape[0], tiles.shape[1], 1, tiles.shape[3]), q.shape, dim)


def quantize_blockwise(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """One scale per 128x128 block: w (N, K) -> q float8 (N, K), scales fp32 (ceil(N/128), ceil(K/128))."""
    N, K = w.shape
    Nb, Kb = math.ceil(N / BLOCK), math.ceil(K / BLOCK)
    padded = F.pad(w.float(), (0, Kb * BLOCK - K, 0, Nb * BLOCK - N))  # zeros: amax unchanged
    tiles = padded.reshape(Nb, BLOCK, Kb, BLOCK)  # [nb, n, kb, k]
    scales = _scale_from_amax(tiles.abs().amax(dim=(1, 3)))  # (Nb, Kb)
    q = _to_e4m3(tiles / scales[:, None, :, None])
    return q.reshape(Nb * BLOCK, Kb * BLOCK)[:N, :K], scales


def dequantize_blockwise(q: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    """Inverse of ``quantize_blockwise``: fp32 (N, K)."""
    return q.float() * _block_scales_per_row(scales, q.shape[0], q.shape[1])


def _block_scales_per_row(scales: torch.Tensor, N: int, K: int | None = None) -> torch.Tensor:
    """Block scales (Nb, Kb) -> per-row 1x128 scales (N, Kb); with K, per element (N, K)."""
    rows = scales.repeat_interleave(BLOCK, dim=0)[:N]
    return rows if K is None else rows.repeat_interleave(BLOCK, dim=1)[:, :K]


def fake_quant_weight(w: torch.Tensor) -> torch.Tensor:
    """w rounded through 128x128-block FP8 and back, in w's dtype (the CPU emulation)."""
    return dequantize_blockwise(*quantize_blockwise(w)).to(w.dtype)


def fake_quant_act(x: torch.Tensor, dim: int = -1) -> torch.Tensor:
    """x rounded through 1x128-group FP8 along ``dim`` (dim=0: 128x1) and back, in x's dtype."""
    return dequantize_groupwise(*quantize_groupwise(x, dim=dim), dim=dim).to(x.dtype)


def quant_error(x: torch.Tensor, kind: str = "act") -> dict[str, float]:
    """Relative round-trip error of ``x`` through the weight ('weight') or activation ('act') quantiser."""
    if kind not in ("act", "weight"):
        raise ValueError(f"quant_error: unknown kind '{kind}' (act, weight)")
    x = x.float()
    xq = fake_quant_weight(x) if kind == "weight" else fake_quant_act(x)
    err = (xq - x).abs()
    nz = x != 0
    rel = err[nz] / x.abs()[nz]
    return {
        "fp8/rel_err/mean": rel.mean().item() if rel.numel() else 0.0,
        "fp8/rel_err/max": rel.max().item() if rel.numel() else 0.0,
        "fp8/rel_err/norm": (err.norm() / x.norm().clamp_min(1e-30)).item(),
    }


# ---- GEMMs -------------------------------------------------------------------------------
def _fp8_gemm_emulated(qa, sa, qb, sb) -> torch.Tensor:
    """fp32 (M, N) = dequant(A) @ dequant(B).T; A (M, K), B (N, K), scales (M|N, ceil(K/128))."""
    return dequantize_groupwise(qa, sa) @ dequantize_groupwise(qb, sb).T


def _fp8_gemm_cuda(qa, sa, qb, sb) -> torch.Tensor:
    """The same product on FP8 tensor cores: one ``torch._scaled_mm`` per 128-wide K-slice.

    Within slice j every scale is row-wise: scale_a = sa[:, j] (M, 1) per row of A,
    scale_b = sb[:, j] (1, N) per column of B = qb.T. Partial products come out in fp32 and
    are summed in fp32. Needs K and N multiples of 16 (``_gemm`` checks). UNTESTED ON A
    GPU here (no GPU on the development machine); the slicing and scale logic is tested
    through the CPU implementation of ``torch._scaled_mm`` in tests/test_fp8.py.
    """
    M, K = qa.shape
    N = qb.shape[0]
    out = torch.zeros(M, N, dtype=torch.float32, device=qa.device)
    for j, k0 in enumerate(range(0, K, BLOCK)):
        ks = slice(k0, min(k0 + BLOCK, K))
        a = qa[:, ks].contiguous()  # (M, k) row-major
        b = qb[:, ks].contiguous().t()  # (k, N) column-major
        sa_j = sa[:, j : j + 1].contiguous()  # (M, 1)
        sb_j = sb[:, j].reshape(1, N).contiguous()  # (1, N)
        out += torch._scaled_mm(a, b, scale_a=sa_j, scale_b=sb_j, out_dtype=torch.float32)
    return out


# Set when torch._scaled_mm cannot emit fp32 here (the CUTLASS row-wise path on sm89 with CUDA < 12.9
# only emits bf16). Rounding each K-slice's partial sum to bf16 would change the numbers, not only the
# accumulation order, so such a device computes the GEMM the emulated way instead (exact products,
# fp32 accumulation), on the GPU.
_NO_FP32_SCALED_MM: set[str] = set()
# Why, per device: the exception torch._scaled_mm raised (a RuntimeError on some builds, a ValueError on others,
# e.g. the sm89 row-wise path of CUDA < 12.9 wheels), recorded in env.json (gemm_path) instead of switching quietly.
_FALLBACK_REASON: dict[str, str] = {}


def gemm_path(device: str | torch.device) -> dict[str, str]:
    """Which FP8 GEMM this device runs, and why (env.json ``fp8_gemm``; ``suite doctor``)."""
    device = str(device)
    q, s = quantize_groupwise(torch.ones(16, BLOCK, device=device))  # (16, 128): the smallest product _gemm sends there
    if not _has_fp8_tensor_cores(q):
        return {"path": "emulated", "reason": "no FP8 tensor cores on this device"}
    if device not in _NO_FP32_SCALED_MM:
        # Run one product now: a build whose _scaled_mm refuses fp32 output falls back here, before env.json records
        # the path, not at the first real GEMM (a bf16_fp8rollout run computes none before env.json is written).
        _gemm(q, s, q, s)
    if device in _NO_FP32_SCALED_MM:
        return {"path": "emulated", "reason": _FALLBACK_REASON.get(device, "torch._scaled_mm failed")}
    return {"path": "torch._scaled_mm", "reason": "FP8 tensor cores, fp32 output"}


def _has_fp8_tensor_cores(t: torch.Tensor) -> bool:
    return t.is_cuda and torch.cuda.get_device_capability(t.device) >= (8, 9)


def _gemm(qa, sa, qb, sb, reduce_dim: int = -1) -> torch.Tensor:
    """fp32 product of two FP8 operands whose scales are 1x128 groups along the reduced dim.

    reduce_dim=-1: A (M, K), B (N, K), scales (M|N, Kg) -> A @ B.T   (forward, input grad)
    reduce_dim=0:  A (K, M), B (K, N), scales (Kg, M|N) -> A.T @ B   (weight grad, K = tokens)
    The reduce_dim=0 form keeps the token-major tensors in their own layout on CPU, where a
    transpose copy costs more than the GEMM.
    """
    if reduce_dim == 0:
        if _has_fp8_tensor_cores(qa):
            return _gemm(qa.t(), sa.t(), qb.t(), sb.t())
        return dequantize_groupwise(qa, sa, dim=0).T @ dequantize_groupwise(qb, sb, dim=0)
    K, N = qa.shape[1], qb.shape[0]
    if _has_fp8_tensor_cores(qa) and K % 16 == 0 and N % 16 == 0 and str(qa.device) not in _NO_FP32_SCALED_MM:
        try:
            return _fp8_gemm_cuda(qa, sa, qb, sb)
        except (RuntimeError, ValueError) as e:  # either type, by build: "cannot emit fp32 here"
            _NO_FP32_SCALED_MM.add(str(qa.device))
            _FALLBACK_REASON[str(qa.device)] = f"torch._scaled_mm raised {type(e).__name__}: {str(e)[:200]}"
            warnings.warn(f"FP8 GEMM on {qa.device}: {_FALLBACK_REASON[str(qa.device)]}; computing it emulated "
                          "(exact products, fp32 sums) from now on", RuntimeWarning, stacklevel=2)
    return _fp8_gemm_emulated(qa, sa, qb, sb)


# ---- the linear layer --------------------------------------------------------------------
class FP8Linear(torch.autograd.Function):
    """y = x @ w.T + b with all three GEMMs in FP8 (module docstring); saves only FP8 operands."""

    @staticmethod
    def forward(ctx, x, w, b, out_dtype):
        K = x.shape[-1]
        x2 = x.reshape(-1, K)  # (M, K): tokens flattened
        qx, sx = quantize_groupwise(x2)  # 1x128 along K: (M, K) fp8, (M, Kg)
        qw, sw = quantize_blockwise(w)  # 128x128: (N, K) fp8, (Nb, Kg)
        y = _gemm(qx, sx, qw, _block_scales_per_row(sw, w.shape[0]))  # (M, N) fp32
        if b is not None:
            y = y + b.float()
        ctx.save_for_backward(qx, sx, qw, sw)
        ctx.x_shape, ctx.x_dtype, ctx.has_bias = x.shape, x.dtype, b is not None
        return y.to(out_dtype).reshape(*x.shape[:-1], w.shape[0])

    @staticmethod
    def backward(ctx, gy):
        qx, sx, qw, sw = ctx.saved_tensors
        N, K = qw.shape
        g = gy.reshape(-1, N)  # (M, N), bf16 between operators
        grad_x = grad_w = grad_b = None
        if ctx.needs_input_grad[0]:
            # dx = dy @ W reduces over N: dy in 1x128 groups along N, W^T reuses W's blocks
            qg, sg = quantize_groupwise(g)  # (M, N), (M, Ng)
            qwt, swt = qw.t(), _block_scales_per_row(sw.t(), K)  # (K, N), (K, Ng)
            grad_x = _gemm(qg, sg, qwt, swt).to(ctx.x_dtype).reshape(ctx.x_shape)
        if ctx.needs_input_grad[1]:
            # dW = dy.T @ x reduces over the M tokens: both operands in 128x1 groups along M;
            # x is re-quantised from its saved FP8 copy (the high-precision x was not kept)
            qg0, sg0 = quantize_groupwise(g, dim=0)  # (M, N), (Mg, N)
            qx0, sx0 = quantize_groupwise(dequantize_groupwise(qx, sx), dim=0)  # (M, K), (Mg, K)
            grad_w = _gemm(qg0, sg0, qx0, sx0, reduce_dim=0)  # (N, K) fp32 master grad
        if ctx.has_bias and ctx.needs_input_grad[2]:
            grad_b = g.float().sum(0)  # (N,) fp32
        return grad_x, grad_w, grad_b, None


def fp8_linear(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None = None,
               out_dtype: torch.dtype = torch.bfloat16) -> torch.Tensor:
    """Jet-RL's unified FP8 linear: x (..., K), w (N, K), b (N,) or None -> (..., N) in ``out_dtype``.

    Gradients: x's in x.dtype, w's and b's computed in fp32 (autograd casts them to the
    parameters' dtype, so keep fp32 master weights).
    """
    return FP8Linear.apply(x, w, b, out_dtype)


def fp8_linear_inference(x: torch.Tensor, qw: torch.Tensor, sw: torch.Tensor, b: torch.Tensor | None = None,
                         out_dtype: torch.dtype = torch.bfloat16) -> torch.Tensor:
    """The sampler's FP8 linear on weights quantised once per sync: the forward of ``FP8Linear``.

    qw (N, K) fp8 and sw (ceil(N/128), ceil(K/128)) come from ``quantize_blockwise`` of the
    same master weight the trainer quantises, so in the unified flow both engines see the same
    FP8 weights and the same activation quantiser (Jet-RL).
    """
    K, N = x.shape[-1], qw.shape[0]
    qx, sx = quantize_groupwise(x.reshape(-1, K))
    y = _gemm(qx, sx, qw, _block_scales_per_row(sw, N))  # (M, N) fp32
    if b is not None:
        y = y + b.float()
    return y.to(out_dtype).reshape(*x.shape[:-1], N)


# ---- KV cache ----------------------------------------------------------------------------
def fake_quant_kv(x: torch.Tensor, scale: float = 1.0) -> torch.Tensor:
    """K or V as an FP8 E4M3 KV cache holds it: one scale per tensor, x_hat = e4m3(x / scale) * scale, back in
    ``x.dtype``. vLLM's ``kv_cache_dtype="fp8"`` with a checkpoint that carries no k/v scales uses scale 1.0
    (``set_default_quant_scales``, vLLM 0.32), so 1.0 is the default here. The gradient passes straight
    through (a trainer that runs the sampler's code keeps its graph)."""
    q = (_to_e4m3(x.float() / scale).float() * scale).to(x.dtype)
    return x + (q - x).detach() if x.requires_grad else q
