"""The E4M3 element format and its group-scaled round trip, as fast as eager torch allows on a CPU.

The format
==========
``torch.float8_e4m3fn`` (E4M3): 1 sign, 4 exponent and 3 mantissa bits, no infinities,
largest finite value 448, smallest normal 2^-6, smallest subnormal 2^-9. Three mantissa
bits mean round-to-nearest has a relative error of at most 2^-4 = 6.25% for values in the
normal range. The range is tiny (448 / 2^-9 ~ 2^18), so a tensor only fits if it is first
divided by a *scale*; one scale per whole tensor lets a single outlier push every other
value into the subnormals. Hence fine-grained scales, one fp32 number per small group:

    scale = amax(group) / 448        (amax == 0 -> scale 1, so an all-zero group stays zero)
    q     = clamp(x / scale, -448, 448).to(float8_e4m3fn)     # clamp first: older torch
    x_hat = q.float() * scale                                 # turns overflow into NaN

The recipe that decides the groups (1x128, 128x1, 128x128) is suite/numerics/fp8.py's.

Cost on a CPU
=============
A GEMM emulated on a CPU reads x_hat in fp32, so the round trip is elementwise work on every
activation and gradient of every step. Two things made it cost more than the GEMM (measured on
cpu-avx2-emulated, ``suite bench``):

- torch's CPU cast from float8 converts one element at a time (~4.5 ns an element); ``decoded``
  reads the codes through fp16 bit patterns instead (~0.7 ns), exactly.
- padding a dimension shorter than one group (a hidden size of 96 in 1x128 groups) to the group
  costs a copy on the way in and one on the way out; ``tiles`` makes such a dimension one group of
  its own length (an amax over it is the same number) and ``scaled`` writes the result where the
  padded layout had it, so every GEMM operand keeps its strides (a BLAS may sum in an order that
  depends on them) and every run its bytes.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

E4M3_MAX = 448.0  # torch.finfo(torch.float8_e4m3fn).max
FP8 = torch.float8_e4m3fn
DECODE_SHIFT = 256.0  # decoded's factor: 2^(15 - 7), fp16's exponent bias over E4M3's
SMALL = 1 << 13  # below: torch's one cast beats decoded's ten calls (~8k on cpu-avx2-emulated)


def scale_from_amax(amax: torch.Tensor) -> torch.Tensor:
    """fp32 dequantisation scale amax / 448; 1 where that is 0 (all-zero tile, or an amax
    so tiny that amax / 448 underflows), so that x / scale never divides by zero."""
    s = amax.float() / E4M3_MAX
    return torch.where(s > 0, s, 1.0)


def to_e4m3(x: torch.Tensor) -> torch.Tensor:
    """Round fp32 values already divided by their scale to E4M3 (saturating, not NaN). Clamps
    ``x`` in place: callers pass the temporary that the division made."""
    return x.clamp_(-E4M3_MAX, E4M3_MAX).to(FP8)


def decoded(q: torch.Tensor) -> torch.Tensor:
    """``q.float() / 256``, exactly, for E4M3 codes ``q`` (any layout, kept by the result).

    A code's sign-extended byte shifted left by 7 is an fp16 bit pattern with E4M3's exponent in
    fp16's exponent field and its 3 mantissa bits on top of fp16's 10, once bit 14 (set by the sign
    extension) is cleared: the fp16 number is the E4M3 value times 2^-8, subnormals included (each
    format's subnormals carry the exponent of its smallest normal), and fp16 -> fp32 is a
    vectorised cast. The two NaN codes would read as +-1.875 (480 / 256), so a tensor holding one
    takes torch's cast, as do small tensors and other devices. Callers multiply by ``scale * 256``
    (exact: a power of two), so every value is the one ``q.float() * scale`` rounds to."""
    if (q.device.type != "cpu" or q.numel() < SMALL
            or (q.view(torch.uint8) & 0x7F).max() == 0x7F):
        return q.float().mul_(1 / DECODE_SHIFT)
    h = q.view(torch.int8).to(torch.int16)
    h <<= 7
    h &= ~0x4000
    return h.view(torch.float16).float()


def tiles(x: torch.Tensor, dim: int, group: int) -> torch.Tensor:
    """x -> (pre, G, g, post): ``dim`` cut into G = ceil(L/group) groups of g = group elements,
    the last zero-padded (zeros never change an amax); a ``dim`` no longer than one group is one
    group of its own length L, unpadded. A reshape, so no copy whatever ``dim`` is, unless
    padded."""
    dim = dim % x.dim()
    L, G = x.shape[dim], math.ceil(x.shape[dim] / group)
    t = x.reshape(math.prod(x.shape[:dim]), L, math.prod(x.shape[dim + 1 :]))
    if G > 1 and G * group != L:
        t = F.pad(t, (0, 0, 0, G * group - L))
    return t.reshape(t.shape[0], G, group if G > 1 else L, t.shape[2])


def untile(t: torch.Tensor, shape: torch.Size, dim: int) -> torch.Tensor:
    """(pre, G, g, post) -> ``shape``: drop the padding again."""
    return t.flatten(1, 2)[:, : shape[dim]].reshape(shape)


def scaled(codes: torch.Tensor, scales: torch.Tensor, shape: torch.Size, dim: int,
           group: int) -> torch.Tensor:
    """Decoded tiles (``decoded``: codes / 256) times their scales (pre, G, 1, post), untiled to
    ``shape``: the values ``q.float() * scale`` rounds to. A ``dim`` shorter than one group comes
    back in rows of ``group``, where padded tiles left it (the module docstring)."""
    s = scales * DECODE_SHIFT
    pre, G, g, post = codes.shape
    if G == 1 and g < group:
        buf = codes.new_empty(pre, group, post)[:, :g]
        torch.mul(codes, s, out=buf.unsqueeze(1))
        return buf.reshape(shape)
    return untile(codes.mul_(s), shape, dim)  # codes: decoded's own dense tensor (or tiles' pad)


def scale_shape(shape: torch.Size, dim: int, group: int) -> list[int]:
    out = list(shape)
    out[dim] = math.ceil(shape[dim] / group)
    return out


def quantized(x: torch.Tensor, dim: int, group: int,
              dequantize: bool) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """One scale per ``group`` consecutive elements of x along ``dim``: (codes in x's shape,
    scales (x's shape with ``dim`` shrunk by ``group``), and with ``dequantize`` the fp32 values
    the codes stand for, from the same tiles, else None)."""
    q, s = _tile_codes(x, dim, group)
    x_hat = scaled(decoded(q), s, x.shape, dim, group) if dequantize else None
    return untile(q, x.shape, dim), s.reshape(scale_shape(x.shape, dim, group)), x_hat


def _tile_codes(x: torch.Tensor, dim: int, group: int) -> tuple[torch.Tensor, torch.Tensor]:
    """x's codes, still in tiles (pre, G, g, post), and their scales (pre, G, 1, post)."""
    t = tiles(x.float(), dim, group)
    s = scale_from_amax(t.abs().amax(dim=2, keepdim=True))
    return to_e4m3(t / s), s


def dequantized(q: torch.Tensor, scales: torch.Tensor, dim: int, group: int) -> torch.Tensor:
    """Inverse of ``quantized`` (same ``dim`` and ``group``): fp32, q's shape."""
    t = tiles(decoded(q), dim, group)  # (pre, G, g, post)
    return scaled(t, scales.reshape(t.shape[0], t.shape[1], 1, t.shape[3]), q.shape, dim, group)


def round_trip(x: torch.Tensor, dim: int, group: int) -> torch.Tensor:
    """x through group-wise E4M3 along ``dim`` and back, fp32: ``dequantized(*quantized(x))``
    without untiling and re-tiling the codes between the two, so the same values."""
    q, s = _tile_codes(x, dim, group)
    return scaled(decoded(q), s, x.shape, dim, group)
