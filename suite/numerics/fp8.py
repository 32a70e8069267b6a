"""FP8 linear layers with the DeepSeek-V3 / Jet-RL block-scaled recipe (arXiv 2412.19437 Sec. 3.3;
Jet-RL, arXiv 2601.14243).

The format
==========
E4M3 with one fp32 scale per small tile (suite/numerics/e4m3.py: the element format, its
saturating rounding and its round trip); scale = amax(tile) / 448.

The tiles (a GEMM ``out = A @ B.T`` reduces over K; every scale covers one K-slice of 128
so that, per K-slice, a scale factors out of the dot product):

- weights (N, K): one scale per 128x128 block           -> scales (ceil(N/128), ceil(K/128))
- activations and gradients (..., K): one scale per 1x128 group along K
                                                         -> scales (..., ceil(K/128))
- the weight-gradient GEMM ``dW = dY.T @ X`` reduces over *tokens*, so both of its
  operands are (re-)quantised in 128x1 groups along the token dimension (``dim=0``).

Shapes not divisible by 128: the last block/group is ragged (covers fewer elements). It is
implemented by zero-padding before the amax (zeros never change an amax) and slicing the
padding off again (a dimension shorter than 128 is one group of its own length); no padded value
ever leaves this module.

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
the same quantised operands feed ``torch._scaled_mm``, in one call with 1x128 block scales
on both operands where the installed torch and cuBLAS support it (torch >= 2.9, CUDA >= 12.9,
sm90: cuBLAS's "1D block scaling"), else one row-wise call per 128-wide K-slice whose fp32
partial products are summed in fp32 (DeepGEMM's "promote to fp32 every K block"). Layout rules
of ``_scaled_mm``: A row-major (M, K), B column-major (K, N) (``b.t()`` of a contiguous (N, K)
tensor), dimensions multiples of 16 (operands are zero-padded, which changes no number).
Before its first product a device runs each path on a probe of two 128-groups along K
(``_probe``: with one group torch takes the row-wise kernel, and the block-scaled one would go
unchecked) and compares it with the emulation, up to the rounding of the tensor cores' FP8
accumulator (``agrees``); a path that raises or disagrees is dropped, and the one a device runs,
with the reason for every fallback, is recorded in env.json (``fp8_gemm``) and shown by
``suite doctor``.

Cost of the emulation on CPU: the GEMMs are ordinary fp32 GEMMs; the overhead is the
elementwise work (amax, divide, clamp, fp32 <-> fp8 casts; e4m3.py says what makes it cheap),
where the gradient is quantised twice (1x128 and 128x1) and x re-quantised. The emulated layer
computes each operand's round trip in one pass over its tiles (``FP8Linear``: the codes a GEMM
on tensor cores would read, never untiled and re-tiled on the way) and saves the FP8 codes
alone. Weight-gradient operands are grouped along tokens in their own (token-major) layout,
never transposed in memory.
"""

from __future__ import annotations

import math
import warnings

import torch
import torch.nn.functional as F

from suite.numerics.e4m3 import (
    DECODE_SHIFT,
    decoded,
    dequantized,
    quantized,
    round_trip,
    scale_from_amax,
    to_e4m3,
)

BLOCK = 128  # tile edge of the recipe (weights 128x128, activations 1x128)


# ---- quantisers --------------------------------------------------------------------------
def quantize_groupwise(x: torch.Tensor, group: int = BLOCK,
                       dim: int = -1) -> tuple[torch.Tensor, torch.Tensor]:
    """One scale per ``group`` consecutive elements along ``dim``.

    x (..., K) with dim=-1 -> q float8 (..., K), scales fp32 (..., ceil(K/group))  [1x128]
    x (T, K)   with dim=0  -> q float8 (T, K),   scales fp32 (ceil(T/group), K)    [128x1]
    The scales keep x's layout with the grouped dimension shrunk by ``group``.
    """
    q, scales, _ = quantized(x, dim, group, dequantize=False)
    return q, scales


def dequantize_groupwise(q: torch.Tensor, scales: torch.Tensor, group: int = BLOCK,
                         dim: int = -1) -> torch.Tensor:
    """Inverse of ``quantize_groupwise`` (same ``group`` and ``dim``): fp32, q's shape."""
    return dequantized(q, scales, dim, group)


def quantize_blockwise(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """One scale per 128x128 block: w (N, K) -> q float8 (N, K), scales fp32 (ceil(N/128),
    ceil(K/128))."""
    N, K = w.shape
    Nb, Kb = math.ceil(N / BLOCK), math.ceil(K / BLOCK)
    padded = F.pad(w.float(), (0, Kb * BLOCK - K, 0, Nb * BLOCK - N))  # zeros: amax unchanged
    tiles = padded.reshape(Nb, BLOCK, Kb, BLOCK)  # [nb, n, kb, k]
    scales = scale_from_amax(tiles.abs().amax(dim=(1, 3)))  # (Nb, Kb)
    q = to_e4m3(tiles / scales[:, None, :, None])
    return q.reshape(Nb * BLOCK, Kb * BLOCK)[:N, :K], scales


def dequantize_blockwise(q: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    """Inverse of ``quantize_blockwise``: fp32 (N, K)."""
    return decoded(q) * _block_scales_per_row(scales * DECODE_SHIFT, q.shape[0], q.shape[1])


def _block_scales_per_row(scales: torch.Tensor, N: int, K: int | None = None) -> torch.Tensor:
    """Block scales (Nb, Kb) -> per-row 1x128 scales (N, Kb); with K, per element (N, K)."""
    rows = scales.repeat_interleave(BLOCK, dim=0)[:N]
    return rows if K is None else rows.repeat_interleave(BLOCK, dim=1)[:, :K]


def fake_quant_weight(w: torch.Tensor) -> torch.Tensor:
    """w rounded through 128x128-block FP8 and back, in w's dtype (the CPU emulation)."""
    return dequantize_blockwise(*quantize_blockwise(w)).to(w.dtype)


def fake_quant_act(x: torch.Tensor, dim: int = -1) -> torch.Tensor:
    """x rounded through 1x128-group FP8 along ``dim`` (dim=0: 128x1) and back, in x's dtype."""
    return round_trip(x, dim, BLOCK).to(x.dtype)


def quant_error(x: torch.Tensor, kind: str = "act") -> dict[str, float]:
    """Relative round-trip error of ``x`` through the weight ('weight') or activation ('act')
    quantiser."""
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


def _fp8_gemm_blockwise(qa, sa, qb, sb) -> torch.Tensor:
    """The product in ONE ``torch._scaled_mm`` with 1x128 block scales on both operands
    (DeepSeek-V3's recipe as cuBLAS runs it: "1D block scaling" for FP8, CUDA >= 12.9 on sm90; torch
    >= 2.9 recognises it from the scales' shapes and strides). torch's layout rules (ScaledBlas.cpp,
    ``is_blockwise_1x128_scaling``): A row-major (M, K) with scale_a (M, ceil(K/128))
    outer-dim-major (stride (1, M)); B column-major (K, N) with scale_b (ceil(K/128), N) row-major,
    i.e. B's (N, Kg) scales outer-dim-major seen transposed. Operands padded (``_padded``)."""
    return torch._scaled_mm(qa, qb.t(), scale_a=sa.t().contiguous().t(),
                            scale_b=sb.t().contiguous(), out_dtype=torch.float32)


def _fp8_gemm_cuda(qa, sa, qb, sb) -> torch.Tensor:
    """The same product as one row-wise ``torch._scaled_mm`` per 128-wide K-slice (the fallback for
    builds without block scaling: torch < 2.9, CUDA < 12.9, sm89).

    Within slice j every scale is row-wise: scale_a = sa[:, j] (M, 1) per row of A,
    scale_b = sb[:, j] (1, N) per column of B = qb.T. Partial products come out in fp32 and
    are summed in fp32 (DeepGEMM's "promote to fp32 every K block").
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


# The tensor-core paths in the order tried; a device keeps the first that runs and agrees with the
# emulation.
_CUDA_PATHS = {"torch._scaled_mm blockwise 1x128": _fp8_gemm_blockwise,
               "torch._scaled_mm per K-slice": _fp8_gemm_cuda}
# Per device: the path it runs ("emulated" after every tensor-core path failed) and why (env.json
# ``fp8_gemm``). A path is dropped when _scaled_mm raises (a RuntimeError on some builds, a
# ValueError on others, e.g. the sm89 row-wise path of CUDA < 12.9 wheels, which emits only bf16:
# rounding each partial sum to bf16 would change the numbers, not only the summation order) or when
# its first product disagrees with the emulation (a scale layout read otherwise than here): never
# silently, the reason is recorded and warned.
_PATH: dict[str, str] = {}
_FALLBACK_REASON: dict[str, str] = {}


def _padded(q: torch.Tensor, s: torch.Tensor, rows: int,
            cols: int) -> tuple[torch.Tensor, torch.Tensor]:
    """q (R, K) zero-padded to (rows, cols) and its scales (R, Kg) to (rows, Kg) with ones: cuBLAS's
    FP8 GEMMs want dimensions in multiples of 16 and whole 128-wide K groups. Zero elements add
    nothing to any product, and padding K inside the last group leaves its scale as is (zeros never
    change an amax), so no number changes."""
    R, K = q.shape
    if (R, K) == (rows, cols) and q.is_contiguous():
        return q, s
    # float8 0x00 is +0; pad through a uint8 view (torch's pad has no float8 kernels everywhere)
    qp = torch.nn.functional.pad(q.view(torch.uint8),
                                 (0, cols - K, 0, rows - R)).contiguous().view(q.dtype)
    return qp, torch.nn.functional.pad(s, (0, 0, 0, rows - R), value=1.0)


# FP8 tensor cores accumulate in a register that keeps about 14 significand bits, not fp32's 24
# (DeepSeek-V3, arXiv 2412.19437, Sec. 3.3.2, measured on H800); one bit less here, as margin.
ACC_BITS = 13


def agrees(got: torch.Tensor, qa, sa, qb, sb) -> bool:
    """Whether a tensor-core product equals the emulation's up to accumulation rounding.

    Both add the same exact products (E4M3 x E4M3 is exact in fp32, and so is each product's
    scaling up to one rounding): the emulation in fp32, the tensor cores in an accumulator of
    ``ACC_BITS`` significand bits that may truncate (unit roundoff u = 2^(1 - ACC_BITS)).
    Recursive summation of K terms errs by at most gamma_K(u) sum_k |a_k b_k|, with
    gamma_K(u) = K u / (1 - K u) (Higham, Accuracy and Stability of Numerical Algorithms,
    Eq. 3.5), so |diff| <= (gamma_K(u) + 2 K eps32) sum_k |a_k b_k|, the second term for the
    fp32 sums and scalings on both sides. All K terms count as summed in the short accumulator:
    where cuBLAS promotes partial sums to fp32 is not documented. The bound is loose (6.7% of
    sum |a b| at K = 256), so paths are chosen on ``_probe``, where a misread scale moves a
    product by far more."""
    want = _fp8_gemm_emulated(qa, sa, qb, sb)
    K = qa.shape[1]
    Ku = K * 2.0 ** (1 - ACC_BITS)
    rel = (Ku / (1 - Ku) if Ku < 1 else math.inf) + 2 * K * torch.finfo(torch.float32).eps
    bound = rel * (dequantize_groupwise(qa, sa).abs() @ dequantize_groupwise(qb, sb).abs().T)
    return bool(((got - want).abs() <= bound + torch.finfo(torch.float32).tiny).all())


def _probe(device) -> tuple[torch.Tensor, ...]:
    """(qa, sa, qb, sb): the product each device chooses its path on, A and B (32, 256) quantised.

    Two 128-groups along K, so the block-scaled kernel runs: with one group torch matches the
    scales as row-wise first (ScaledBlas.cpp, ``get_joint_scaling``) and the block-scaled call
    would go unchecked. Positive entries, so no sum cancels and a misread scale moves every
    product it enters by its ratio, far beyond ``agrees``'s bound; magnitudes 2^e, e in -2..2
    drawn per (row, group), so a transposed, swapped or shifted scale reads another value; the
    second group ramps up along K, so the two groups' sums differ and exchanging their scales
    shows too."""
    g = torch.Generator().manual_seed(0)
    ramp = torch.cat([torch.ones(BLOCK), torch.arange(1, BLOCK + 1) / BLOCK])  # (256,)

    def operand():
        e = torch.randint(-2, 3, (32, 2), generator=g).repeat_interleave(BLOCK, dim=1)
        x = (0.5 + torch.rand(32, 2 * BLOCK, generator=g)) * ramp * torch.exp2(e.float())  # (32, K)
        return quantize_groupwise(x.to(device))

    return (*operand(), *operand())


def _choose_path(dev: str, probe: tuple[torch.Tensor, ...]) -> None:
    """Each tensor-core path on ``probe``; the device keeps the first that runs and agrees."""
    reasons = []
    for name, fn in _CUDA_PATHS.items():
        try:
            out = fn(*probe)
        except (RuntimeError, ValueError) as e:  # either type, by build: "not supported here"
            reasons.append(f"{name} raised {type(e).__name__}: {' '.join(str(e).split())[:200]}")
            continue
        if not agrees(out, *probe):
            reasons.append(f"{name} disagreed with the emulation beyond accumulation rounding")
            continue
        _PATH[dev] = name
        _FALLBACK_REASON[dev] = "; ".join(reasons) or "FP8 tensor cores, fp32 output"
        if reasons:
            warnings.warn(f"FP8 GEMM on {dev}: {_FALLBACK_REASON[dev]}; using {name}",
                          RuntimeWarning, stacklevel=2)
        return
    _PATH[dev], _FALLBACK_REASON[dev] = "emulated", "; ".join(reasons)
    warnings.warn(f"FP8 GEMM on {dev}: {_FALLBACK_REASON[dev]}; computing it emulated (exact "
                  "products, fp32 sums) from now on", RuntimeWarning, stacklevel=2)


def _tensor_core_gemm(qa, sa, qb, sb) -> torch.Tensor | None:
    """The product on FP8 tensor cores through this device's path (chosen first); None: emulate."""
    dev = str(qa.device)
    if dev not in _PATH:
        _choose_path(dev, _probe(qa.device))
    if _PATH[dev] == "emulated":
        return None
    M, K = qa.shape
    N = qb.shape[0]
    up = lambda n, m: -(-n // m) * m  # noqa: E731
    a, sa_ = _padded(qa, sa, up(M, 16), up(K, BLOCK))
    b, sb_ = _padded(qb, sb, up(N, 16), up(K, BLOCK))
    return _CUDA_PATHS[_PATH[dev]](a, sa_, b, sb_)[:M, :N]


def gemm_path(device: str | torch.device) -> dict[str, str]:
    """Which FP8 GEMM this device runs, and why (env.json ``fp8_gemm``; ``suite doctor``).

    The answer comes from a product run now when none has run on the device yet: env.json is written
    before a run's first FP8 GEMM (a bf16_fp8rollout run computes none by then), and a build that
    refuses a path must be recorded as what it computes, not as what it was expected to."""
    device = str(device)
    probe = _probe(device)
    if not _has_fp8_tensor_cores(probe[0]):
        return {"path": "emulated", "reason": "no FP8 tensor cores on this device"}
    if device not in _PATH:
        _choose_path(device, probe)
    return {"path": _PATH[device], "reason": _FALLBACK_REASON[device]}


def _has_fp8_tensor_cores(t: torch.Tensor) -> bool:
    return not emulated(t.device)


def _gemm(qa, sa, qb, sb, reduce_dim: int = -1) -> torch.Tensor:
    """fp32 product of two FP8 operands whose scales are 1x128 groups along the reduced dim.

    reduce_dim=-1: A (M, K), B (N, K), scales (M|N, Kg) -> A @ B.T   (forward, input grad)
    reduce_dim=0:  A (K, M), B (K, N), scales (Kg, M|N) -> A.T @ B   (weight grad, K = tokens)
    The reduce_dim=0 form keeps the token-major tensors in their own layout on CPU, where a
    transpose copy costs more than the GEMM. On tensor cores every shape runs in FP8, the weight
    gradient's token count included (padded, ``_padded``); only a recorded, warned fallback leaves
    it.
    """
    if reduce_dim == 0:
        if _has_fp8_tensor_cores(qa):
            return _gemm(qa.t(), sa.t(), qb.t(), sb.t())
        return dequantize_groupwise(qa, sa, dim=0).T @ dequantize_groupwise(qb, sb, dim=0)
    if _has_fp8_tensor_cores(qa):
        out = _tensor_core_gemm(qa, sa, qb, sb)
        if out is not None:
            return out
    return _fp8_gemm_emulated(qa, sa, qb, sb)


# ---- the linear layer --------------------------------------------------------------------
class FP8Linear(torch.autograd.Function):
    """y = x @ w.T + b with all three GEMMs in FP8 (module docstring); saves only FP8 operands."""

    @staticmethod
    def forward(ctx, x, w, b, out_dtype):
        K = x.shape[-1]
        x2 = x.reshape(-1, K)  # (M, K): tokens flattened
        emulate = not _has_fp8_tensor_cores(x2)
        # 1x128 along K: (M, K) fp8, (M, Kg), and emulated, the fp32 operand from the same tiles
        qx, sx, x_hat = quantized(x2, -1, BLOCK, dequantize=emulate)
        qw, sw = quantize_blockwise(w)  # 128x128: (N, K) fp8, (Nb, Kg)
        if emulate:  # _fp8_gemm_emulated's product
            y = x_hat @ weight_operand(qw, sw).T
        else:
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
        if not _has_fp8_tensor_cores(g):
            return (*_emulated_grads(ctx, g, qx, sx, qw, sw), None)
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


def _emulated_grads(ctx, g, qx, sx, qw, sw) -> tuple:
    """FP8Linear.backward's three gradients where the GEMMs are emulated: the same operands, each
    computed as one round trip (e4m3.round_trip) from g in fp32 and from x's saved codes."""
    K = qw.shape[1]
    g32 = g.float()
    grad_x = grad_w = grad_b = None
    if ctx.needs_input_grad[0]:
        w_t = dequantize_groupwise(qw.t(), _block_scales_per_row(sw.t(), K))  # (K, N)
        grad_x = (round_trip(g32, -1, BLOCK) @ w_t.T).to(ctx.x_dtype).reshape(ctx.x_shape)
    if ctx.needs_input_grad[1]:
        x0 = round_trip(dequantize_groupwise(qx, sx), 0, BLOCK)  # (M, K), 128x1 along M
        grad_w = round_trip(g32, 0, BLOCK).T @ x0  # (N, K) fp32 master grad
    if ctx.has_bias and ctx.needs_input_grad[2]:
        grad_b = g32.sum(0)  # (N,) fp32
    return grad_x, grad_w, grad_b


def fp8_linear(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None = None,
               out_dtype: torch.dtype = torch.bfloat16) -> torch.Tensor:
    """Jet-RL's unified FP8 linear: x (..., K), w (N, K), b (N,) or None -> (..., N) in
    ``out_dtype``.

    Gradients: x's in x.dtype, w's and b's computed in fp32 (autograd casts them to the
    parameters' dtype, so keep fp32 master weights).
    """
    return FP8Linear.apply(x, w, b, out_dtype)


def fp8_linear_inference(x: torch.Tensor, qw: torch.Tensor, sw: torch.Tensor,
                         b: torch.Tensor | None = None,
                         out_dtype: torch.dtype = torch.bfloat16,
                         w_hat: torch.Tensor | None = None) -> torch.Tensor:
    """The sampler's FP8 linear on weights quantised once per sync: the forward of ``FP8Linear``.

    qw (N, K) fp8 and sw (ceil(N/128), ceil(K/128)) come from ``quantize_blockwise`` of the
    same master weight the trainer quantises, so in the unified flow both engines see the same
    FP8 weights and the same activation quantiser (Jet-RL). ``w_hat``: where the GEMM is emulated,
    ``weight_operand(qw, sw)``, which the sampler computes once per sync instead of once per
    product (the same values, so the same result, bit for bit).
    """
    K, N = x.shape[-1], qw.shape[0]
    if w_hat is not None:
        y = act_operand(x.reshape(-1, K)) @ w_hat.T  # _fp8_gemm_emulated's product
    else:
        qx, sx = quantize_groupwise(x.reshape(-1, K))
        y = _gemm(qx, sx, qw, _block_scales_per_row(sw, N))  # (M, N) fp32
    if b is not None:
        y = y + b.float()
    return y.to(out_dtype).reshape(*x.shape[:-1], N)


def emulated(device: str | torch.device) -> bool:
    """Whether FP8 GEMMs on ``device`` are emulated (no FP8 tensor cores): then the sampler keeps
    ``weight_operand`` of each weight between syncs."""
    device = torch.device(device)
    return device.type != "cuda" or torch.cuda.get_device_capability(device) < (8, 9)


def weight_operand(qw: torch.Tensor, sw: torch.Tensor) -> torch.Tensor:
    """The emulated GEMM's weight operand: E4M3 codes (N, K) times their 128x128 block scales,
    fp32."""
    return dequantize_groupwise(qw, _block_scales_per_row(sw, qw.shape[0]))


def act_operand(x: torch.Tensor) -> torch.Tensor:
    """The emulated GEMM's activation operand: x (M, K) through 1x128-group E4M3 and back, fp32,
    ``dequantize_groupwise(*quantize_groupwise(x))``'s values (e4m3.round_trip)."""
    return round_trip(x, -1, BLOCK)


# ---- KV cache ----------------------------------------------------------------------------
def fake_quant_kv(x: torch.Tensor, scale: float = 1.0) -> torch.Tensor:
    """K or V as an FP8 E4M3 KV cache holds it: one scale per tensor, x_hat = e4m3(x / scale) *
    scale, back in ``x.dtype``. vLLM's ``kv_cache_dtype="fp8"`` with a checkpoint that carries no
    k/v scales uses scale 1.0 (``set_default_quant_scales``, vLLM 0.32), so 1.0 is the default here.
    The gradient passes straight through (a trainer that runs the sampler's code keeps its
    graph)."""
    q = (decoded(to_e4m3(x.float() / scale)) * (scale * DECODE_SHIFT)).to(x.dtype)
    return x + (q - x).detach() if x.requires_grad else q
