"""4-bit rollouts: NVFP4 and MXFP4 quantisers and their linear layer, emulated exactly.

The element format
==================
E2M1 (FP4; ``torch.float4_e2m1fn_x2`` packs two per byte, with no arithmetic): 1 sign, 2 exponent
bits (bias 1) and 1 mantissa bit. Its magnitudes are the eight points

    0, 0.5, 1, 1.5, 2, 3, 4, 6        (0.5 is the one subnormal; no inf, no NaN)

Rounding goes to the nearest point, a tie to the point whose code (its index above) is even: 0.25 ->
0, 0.75 -> 1, 1.25 -> 1, 1.75 -> 2, 2.5 -> 2, 3.5 -> 4, 5 -> 4. Anything beyond 6 saturates to 6.
Between two points the step is 0.5 below 2, 1 from 2 to 4 and 2 above, so rounding is ``round``
(half to even) on that grid; ``round_e2m1`` does it in fp32 with no table.

Four bits cannot cover a tensor's range, so every block of consecutive values along the reduction
(K) dimension shares a scale, and a value is stored as ``code`` with ``x ~ code * scale``:

NVFP4 (NVIDIA, "Introducing NVFP4 for Efficient and Accurate Low-Precision Inference", 2025)
-------------------------------------------------------------------------------------------
Blocks of **16**, one **E4M3** scale per block, and one fp32 scale per tensor that moves the block
scales into E4M3's range (two-level scaling; NVIDIA ModelOpt's ``NVFP4QTensor`` computes the same):

    s_t   = 448 * 6 / amax(tensor)                  (amax == 0 -> s_t = 1)
    s_b   = e4m3(min(amax(block) / 6 * s_t, 448))   (s_b == 0 -> 1: the block's codes are all 0)
    code  = e2m1(x * s_t / s_b)
    x_hat = code * s_b / s_t

The block holding the tensor's amax gets s_b = 448, E4M3's largest value (saturated, never NaN).
E4M3 rounds s_b by up to 6.25%, so a block's largest value can land above 6 and saturate there. A
block scale that underflows E4M3 (amax(block) * s_t / 6 below 2^-10) would give codes below 0.25
anyway: all zero.

MXFP4 (Open Compute Project, "OCP Microscaling Formats (MX) Specification", v1.0, 2023)
-------------------------------------------------------------------------------------
Blocks of **32**, one **E8M0** scale per block (a power of two, exponent in [-127, 127]), no tensor
scale:

    scale = 2^(floor(log2(amax(block))) - 2)        (2: E2M1's largest exponent; amax == 0 -> 1)
    code  = e2m1(x / scale),   x_hat = code * scale

floor(log2) comes exactly from the fp32 exponent (``torch.frexp``), not from a rounded ``log2``.
With this scale amax / scale lies in [4, 8), so a block's largest values above 6 saturate to 6
(the spec's conversion clamps to the element format's largest normal).

Widths that are no multiple of the block: the last block is ragged. It is zero-padded for its amax
(zeros never change an amax) and the padding is sliced off again, so no result depends on the
padding.

Non-finite input propagates, it is not refused: an inf or NaN makes its block's scale NaN, so every
value of that block decodes to NaN; for NVFP4 so does the whole tensor (or the token, with per-token
scales), whose second-level scale comes from the same amax. The run's own non-finite checks see it;
refusing would cost a device sync on every activation.

The linear layer, exact
=======================
The sampler's weights are quantised at every weight sync (as ``bf16_fp8rollout`` does for FP8), from
their bf16 rounding, the copy a rollout engine's loader receives. Two ways to run a layer:

- **W4A16** (weights only): ``y = x @ W_hat.T`` with x in the sampler's bf16;
- **W4A4**: x is quantised too, per token, in blocks of K. ModelOpt-style deployments calibrate a
  static activation tensor scale (NeMo-RL's quantization-aware RL guide streams it to vLLM); with no
  calibration set, the NVFP4 second-level scale here is each token's own amax, the granularity of
  NeMo-RL's "End-to-End W4A4 NVFP4 with Per-Token vLLM Rollout" design, so a token's quantisation
  does not depend on its batch (the sampler decodes one token at a time, the trainer scores whole
  sequences).

Every product is exact and every sum fp32, as on FP4 tensor cores (Blackwell's block-scaled MMA
applies the block scales inside the dot product and the fp32 tensor scales once, as ``alpha``): the
GEMM operands are ``code * s_b`` (2 + 4 significant bits; exact in fp32), an operand times a bf16
activation (8 bits) or another operand stays below fp32's 24 bits, and the tensor scales divide the
fp32 sum once:

    y = (A @ B.T) / (s_t(A) * s_t(B))          A = x (W4A16) or code_x * s_b(x) (W4A4)

which equals ``dequantize`` then an fp32 GEMM up to fp32 rounding (exactly, when the tensor scales
are powers of two, as MXFP4's are). No GPU before Blackwell (sm_100) has FP4 tensor cores, so on
H100/H200 and on CPUs this emulation is the path; ``gemm_path`` says so and a run records it in
env.json (``fp4_gemm``). Blackwell's FP4 kernels are not wired: there too the emulation computes.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import NamedTuple

import torch
import torch.nn.functional as F

from suite.numerics.e4m3 import E4M3_MAX, FP8

E2M1_MAX = 6.0


@dataclass(frozen=True)
class Format:
    """One 4-bit flavour of the sampler's linear layers."""

    name: str
    block: int  # values per block along K
    two_level: bool  # NVFP4: E4M3 block scales under an fp32 tensor scale; MXFP4: E8M0 scales only
    acts: bool  # W4A4: the activations entering each layer are quantised too


# The flows' sampler names (suite/numerics/flows.py) -> their format.
FORMATS = {f.name: f for f in [Format("nvfp4", 16, True, False), Format("nvfp4a4", 16, True, True),
                               Format("mxfp4", 32, False, False),
                               Format("mxfp4a4", 32, False, True)]}


class Quantized(NamedTuple):
    """x (..., K) as codes and scales: x_hat = codes * scales (per block) / tensor_scale."""

    codes: torch.Tensor  # (..., K) fp32, E2M1 values in [-6, 6]
    scales: torch.Tensor  # (..., ceil(K/block)) fp32 block scales (E4M3 values or powers of two)
    tensor_scale: torch.Tensor  # fp32: () per tensor, (..., 1) per row; 1 for MXFP4
    block: int


# ---- quantisers --------------------------------------------------------------------------
def round_e2m1(y: torch.Tensor) -> torch.Tensor:
    """fp32 values to the nearest E2M1 value, ties to the even code, +-6 at most (NaN stays NaN)."""
    a = y.abs()
    # the grid's step is 0.5 below 2, 1 in [2, 4), 2 above; torch.round rounds half to even on it
    q = torch.where(a < 2, torch.round(a * 2) / 2,
                    torch.where(a < 4, torch.round(a), torch.round(a / 2) * 2))
    return torch.copysign(q.clamp(max=E2M1_MAX), y)


def _blocks(x: torch.Tensor, block: int) -> torch.Tensor:
    """x (..., K) -> fp32 (..., ceil(K/block), block), the ragged last block zero-padded."""
    K = x.shape[-1]
    pad = math.ceil(K / block) * block - K
    return F.pad(x.float(), (0, pad)).unflatten(-1, (-1, block))


def _nonfinite_to_nan(scale: torch.Tensor, amax: torch.Tensor) -> torch.Tensor:
    return torch.where(torch.isfinite(amax), scale, torch.full_like(scale, math.nan))


def _nvfp4_scales(tiles: torch.Tensor, per_row: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """NVFP4's block scales (..., G) and tensor scale s_t, () or per row (..., 1) (docstring)."""
    amax_b = tiles.abs().amax(-1)  # (..., G)
    amax_t = amax_b.amax(-1, keepdim=True) if per_row else amax_b.amax()
    s_t = torch.where(amax_t > 0, E4M3_MAX * E2M1_MAX / amax_t, torch.ones_like(amax_t))
    s_t = _nonfinite_to_nan(s_t, amax_t)
    s_b = (amax_b / E2M1_MAX * s_t).clamp(max=E4M3_MAX).to(FP8).float()
    return torch.where(s_b > 0, s_b, torch.ones_like(s_b)), s_t


def _mxfp4_scales(tiles: torch.Tensor) -> torch.Tensor:
    """E8M0 block scales (..., G): 2^(floor(log2 amax) - 2), exponents clamped to [-127, 127]."""
    amax = tiles.abs().amax(-1)  # (..., G)
    _, e = torch.frexp(amax)  # amax = m * 2^e, m in [0.5, 1): floor(log2 amax) = e - 1
    exp = (e - 1 - 2).clamp(-127, 127)
    scale = torch.where(amax > 0, torch.ldexp(torch.ones_like(amax), exp), torch.ones_like(amax))
    return _nonfinite_to_nan(scale, amax)


def quantize(x: torch.Tensor, fmt: str, per_row: bool = False) -> Quantized:
    """x (..., K) in ``fmt`` (a name of FORMATS), blocks along the last dim. per_row: NVFP4's
    second-level scale per row of x (a token's activations), not per tensor."""
    f = FORMATS[fmt]
    tiles = _blocks(x, f.block)  # (..., G, block)
    if f.two_level:
        s_b, s_t = _nvfp4_scales(tiles, per_row)
        scaled = tiles * (s_t[..., None] if per_row else s_t) / s_b[..., None]
    else:
        s_b, s_t = _mxfp4_scales(tiles), torch.ones((), device=x.device)
        scaled = tiles / s_b[..., None]
    codes = round_e2m1(scaled).flatten(-2)[..., : x.shape[-1]]
    return Quantized(codes, s_b, s_t, f.block)


def operand(q: Quantized) -> torch.Tensor:
    """codes * block scales, fp32 (..., K): exact (2 + 4 significant bits), the GEMM's input."""
    K = q.codes.shape[-1]
    # each block times its scale, broadcast: the same products, no repeated scales
    if K % q.block == 0:
        return (q.codes.unflatten(-1, (-1, q.block)) * q.scales[..., None]).flatten(-2)
    return q.codes * q.scales.repeat_interleave(q.block, dim=-1)[..., :K]


def dequantize(q: Quantized) -> torch.Tensor:
    """x_hat = codes * block scales / tensor scale, fp32 (..., K)."""
    return operand(q) / q.tensor_scale


def fake_quant(x: torch.Tensor, fmt: str) -> torch.Tensor:
    """x rounded through ``fmt`` and back, in x's dtype."""
    return dequantize(quantize(x, fmt)).to(x.dtype)


# ---- the linear layer --------------------------------------------------------------------
class SamplerWeight(NamedTuple):
    """A weight as the sampler holds it between syncs: the GEMM operand and its tensor scale."""

    operand: torch.Tensor  # (N, K) fp32 codes * block scales
    tensor_scale: torch.Tensor  # () fp32
    fmt: str


def quantize_weight(w: torch.Tensor, fmt: str) -> SamplerWeight:
    """w (N, K), blocks along K (the reduction), one tensor scale; quantised at each weight sync."""
    q = quantize(w, fmt)
    return SamplerWeight(operand(q), q.tensor_scale, fmt)


def fp4_linear(x: torch.Tensor, w: SamplerWeight, b: torch.Tensor | None = None,
               out_dtype: torch.dtype = torch.bfloat16) -> torch.Tensor:
    """The sampler's 4-bit linear: x (..., K) in bf16 -> (..., N) in ``out_dtype`` (docstring).

    W4A16 multiplies x as it is; W4A4 first quantises x per token in blocks of K. Exact products,
    fp32 sums, tensor scales applied once to the fp32 sum, bias added in fp32, one rounding.
    """
    K, N = x.shape[-1], w.operand.shape[0]
    x2 = x.reshape(-1, K)  # (M, K): tokens flattened
    if FORMATS[w.fmt].acts:
        qx = quantize(x2, w.fmt, per_row=True)
        a, s = operand(qx), qx.tensor_scale * w.tensor_scale  # (M, K), (M, 1) or ()
    else:
        a, s = x2.float(), w.tensor_scale
    y = (a @ w.operand.T) / s  # (M, N) fp32
    if b is not None:
        y = y + b.float()
    return y.to(out_dtype).reshape(*x.shape[:-1], N)


class FP4LinearSTE(torch.autograd.Function):
    """Quantisation-aware training's linear (NeMo-RL's QARL; Jet-RL's unified flow in 4 bits):
    the forward is the sampler's ``fp4_linear`` on w quantised now, value for value; the backward
    is that of the unquantised x @ w.T + b (straight-through estimator), in fp32, into x and w."""

    @staticmethod
    def forward(ctx, x, w, b, out_dtype, fmt):
        ctx.save_for_backward(x, w)
        ctx.has_bias = b is not None
        return fp4_linear(x, quantize_weight(w, fmt), b, out_dtype)

    @staticmethod
    def backward(ctx, gy):
        x, w = ctx.saved_tensors
        g = gy.reshape(-1, w.shape[0]).float()  # (M, N)
        gx = (g @ w.float()).to(x.dtype).reshape(x.shape) if ctx.needs_input_grad[0] else None
        gw = g.T @ x.reshape(-1, w.shape[1]).float() if ctx.needs_input_grad[1] else None  # (N, K)
        gb = g.sum(0) if ctx.has_bias and ctx.needs_input_grad[2] else None
        return gx, gw, gb, None, None


def gemm_path(device: str | torch.device) -> dict[str, str]:
    """Which FP4 GEMM this device runs, and why (env.json ``fp4_gemm``; ``suite doctor``)."""
    device = torch.device(device)
    if device.type != "cuda":
        return {"path": "emulated", "reason": f"no FP4 tensor cores: {device.type}"}
    major, minor = torch.cuda.get_device_capability(device)
    if major < 10:  # block-scaled FP4 MMA arrived with Blackwell (sm_100)
        return {"path": "emulated", "reason": f"no FP4 tensor cores: sm_{major}{minor}"}
    return {"path": "emulated", "reason": f"FP4 tensor cores on sm_{major}{minor}, not wired: the "
                                          "emulation computes the same products with fp32 sums"}
