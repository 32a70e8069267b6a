"""suite/numerics/fp8.py's tensor-core GEMM paths, without a GPU: which ``torch._scaled_mm`` call
runs, its layouts, and every fallback recorded.

CPU torch has no block-scaled ``_scaled_mm`` (it refuses 1x128 scales: an old build), so the
block-scaled call is driven through ``cuda_contract``: a stand-in that enforces the checks CUDA
torch makes before it calls cuBLAS (aten/src/ATen/native/cuda/ScaledBlas.cpp, ``get_joint_scaling``:
row-major A, column-major B, a 1x128 scale outer-dim-major, scale_b checked transposed; dimensions
multiples of 16 for cuBLAS's FP8 GEMMs) and computes what those scales mean. A call that passes it
hands cuBLAS the layout torch documents; the first product on a real device is checked against the
emulation again at run time (``fp8.agrees``), which no stand-in can replace.
"""

import pytest
import torch

from suite.numerics import fp8
from suite.numerics.fp8 import BLOCK, FP8Linear, _fp8_gemm_emulated, quantize_groupwise

F8 = torch.float8_e4m3fn
PROBE = ("blockwise", 32, 256, 32)  # fp8._probe: the product a device's path is chosen on


def _fits(t: torch.Tensor, dim: int, size: int, stride: int) -> bool:
    # torch's check_size_stride
    return t.size(dim) == size and (t.stride(dim) == stride or size == 1)


def cuda_contract(a, b, scale_a, scale_b, out_dtype, calls=None, misread=False):
    """torch._scaled_mm as CUDA torch accepts it (row-wise or 1x128 x 1x128), fp32 output."""
    assert a.dtype == F8 and b.dtype == F8 and out_dtype == torch.float32
    (M, K), (K2, N) = a.shape, b.shape
    if K != K2 or a.stride(1) != 1 or b.stride(0) != 1:
        raise RuntimeError("Only multiplication of row-major and column-major matrices is "
                           "supported by cuBLASLt")
    if M % 16 or N % 16 or K % 16:
        raise RuntimeError("mat dimensions must be multiples of 16")
    kg = -(-K // BLOCK)
    if (scale_a.shape == (M, 1) and scale_b.shape == (1, N) and scale_a.is_contiguous()
            and scale_b.is_contiguous()):
        kind, sa, sb = "rowwise", scale_a, scale_b.reshape(N, 1)
    elif (_fits(scale_a, 0, M, 1) and _fits(scale_a, 1, kg, M) and scale_a.dim() == 2
          and _fits(scale_b.t(), 0, N, 1) and _fits(scale_b.t(), 1, kg, N) and scale_b.dim() == 2):
        kind, sa, sb = "blockwise", scale_a, scale_b.t()
    else:
        raise ValueError("Invalid scaling configuration.")
    if calls is not None:
        calls.append((kind, M, K, N))
    if misread:  # a kernel that takes B's scales for A's and the other way round
        sa, sb = sb[:M] if sb.shape[0] >= M else sb.repeat(-(-M // sb.shape[0]), 1)[:M], sa[:N]
    ea = a.float() * sa.repeat_interleave(BLOCK, dim=1)[:, :K]
    eb = b.t().float() * sb.repeat_interleave(BLOCK, dim=1)[:, :K]
    return ea @ eb.T


@pytest.fixture
def gpu_like(monkeypatch):
    """CPU tensors treated as if on FP8 tensor cores, with a fresh per-device path table; returns
    the call log."""
    calls = []
    monkeypatch.setattr(fp8, "_has_fp8_tensor_cores", lambda t: True)
    monkeypatch.setattr(fp8, "_PATH", {})
    monkeypatch.setattr(fp8, "_FALLBACK_REASON", {})
    monkeypatch.setattr(torch, "_scaled_mm",
                        lambda a, b, scale_a, scale_b, out_dtype: cuda_contract(
                            a, b, scale_a, scale_b, out_dtype, calls))
    return calls


def _operands(m, k, n, seed=0):
    g = torch.Generator().manual_seed(seed)
    (qa, sa), (qb, sb) = quantize_groupwise(torch.randn(m, k, generator=g)), quantize_groupwise(
        torch.randn(n, k, generator=g))
    sb[:, 1 % sb.shape[1]] *= 4  # distinct scales per group, so a mixed-up group index shows
    return qa, sa, qb, sb


@pytest.mark.parametrize("mkn", [(64, 512, 32), (37, 200, 40), (5, 129, 3)])
def test_one_block_scaled_call_per_gemm_equal_to_the_emulation(gpu_like, mkn):
    """Ragged shapes too: operands are zero-padded to the multiples cuBLAS needs, which changes no
    number."""
    qa, sa, qb, sb = _operands(*mkn)
    out = fp8._gemm(qa, sa, qb, sb)
    m, k, n = mkn
    assert out.shape == (m, n) and fp8.agrees(out, qa, sa, qb, sb)
    up = lambda v, q: -(-v // q) * q  # noqa: E731
    # the probe the path is chosen on, then one call, K included
    assert gpu_like == [PROBE, ("blockwise", up(m, 16), up(k, BLOCK), up(n, 16))]
    assert fp8.gemm_path("cpu") == {"path": "torch._scaled_mm blockwise 1x128",
                                    "reason": "FP8 tensor cores, fp32 output"}


def test_the_weight_gradient_stays_in_fp8_at_any_token_count(gpu_like, monkeypatch):
    """dW = dY.T @ X reduces over tokens (K = 300 here, not a multiple of 16): it runs on the
    tensor-core path, padded, never silently on the emulation; forward, input and weight gradients
    are one block-scaled call each. (With a single 128-group torch matches the scales as row-wise
    first, the same product: so every reduction here spans two or more groups.)"""
    g = torch.Generator().manual_seed(1)
    x, w = torch.randn(300, 256, generator=g,
                       requires_grad=True), torch.randn(160, 256, generator=g, requires_grad=True)
    y = FP8Linear.apply(x, w, None, torch.float32)
    y.square().sum().backward()
    assert gpu_like == [PROBE, ("blockwise", 304, 256, 160),  # forward
                        ("blockwise", 304, 256, 256),  # input grad (K = N)
                        # weight grad: (N, tokens padded to 3 groups, K)
                        ("blockwise", 160, 384, 256)]
    x2, w2 = x.detach().clone().requires_grad_(), w.detach().clone().requires_grad_()
    # the CPU emulation, as reference
    monkeypatch.setattr(fp8, "_has_fp8_tensor_cores", lambda t: False)
    y2 = FP8Linear.apply(x2, w2, None, torch.float32)
    y2.square().sum().backward()
    # both paths sum the same exact products; only the fp32 summation order differs
    for got, want in ((y, y2), (x.grad, x2.grad), (w.grad, w2.grad)):
        torch.testing.assert_close(got, want, rtol=1e-5,
                                   atol=1e-5 * float(want.detach().abs().max()))


def test_cpu_torch_without_block_scaling_falls_back_to_per_slice_and_says_why(monkeypatch):
    """The real CPU _scaled_mm, which refuses 1x128 scales as a torch < 2.9 or CUDA < 12.9 build
    does: the GEMM runs one row-wise call per K-slice, equal to the emulation, and the reason is
    recorded (env.json fp8_gemm) and warned."""
    monkeypatch.setattr(fp8, "_has_fp8_tensor_cores", lambda t: True)
    monkeypatch.setattr(fp8, "_PATH", {})
    monkeypatch.setattr(fp8, "_FALLBACK_REASON", {})
    qa, sa, qb, sb = _operands(32, 272, 48)
    try:
        torch._scaled_mm(qa[:, :128].contiguous(), qb[:, :128].contiguous().t(),
                         scale_a=sa[:, :1].contiguous(),
                         scale_b=sb[:, 0].reshape(1, -1).contiguous(), out_dtype=torch.float32)
    except (RuntimeError, NotImplementedError) as e:
        pytest.skip(f"torch._scaled_mm unavailable on CPU: {e}")
    with pytest.warns(RuntimeWarning, match="blockwise 1x128 raised .*using torch._scaled_mm per "
                                            "K-slice"):
        out = fp8._gemm(qa, sa, qb, sb)
    assert fp8.agrees(out, qa, sa, qb, sb)
    path = fp8.gemm_path("cpu")
    assert (path["path"] == "torch._scaled_mm per K-slice"
            and "Invalid scaling configuration" in path["reason"])


def test_a_path_whose_product_disagrees_is_dropped_not_trusted(monkeypatch):
    """A block-scaled kernel that reads the scales otherwise than documented computes a wrong
    product without
    raising: the first product is checked against the emulation, and the device moves to the next
    path."""
    calls = []

    def scaled_mm(a, b, scale_a, scale_b, out_dtype):
        blockwise = scale_a.dim() == 2 and scale_a.shape[1] > 1
        return cuda_contract(a, b, scale_a, scale_b, out_dtype, calls, misread=blockwise)

    monkeypatch.setattr(fp8, "_has_fp8_tensor_cores", lambda t: True)
    monkeypatch.setattr(fp8, "_PATH", {})
    monkeypatch.setattr(fp8, "_FALLBACK_REASON", {})
    monkeypatch.setattr(torch, "_scaled_mm", scaled_mm)
    qa, sa, qb, sb = _operands(32, 256, 32)
    with pytest.warns(RuntimeWarning, match="disagreed with the emulation"):
        out = fp8._gemm(qa, sa, qb, sb)
    assert fp8.agrees(out, qa, sa, qb,
                      sb) and fp8.gemm_path("cpu")["path"] == "torch._scaled_mm per K-slice"
    n = len(calls)
    fp8._gemm(qa, sa, qb, sb)
    # the choice holds; no block-scaled retry
    assert [c[0] for c in calls[n:]] == ["rowwise", "rowwise"]


@pytest.mark.parametrize("error", [RuntimeError, ValueError])
def test_a_build_without_fp32_output_computes_emulated_once_and_says_so(monkeypatch, error):
    """Builds whose _scaled_mm cannot emit fp32 (sm89 row-wise with CUDA < 12.9 wheels) raise a
    RuntimeError or a
    ValueError: rounding each partial sum to bf16 would change the numbers, so the GEMM is emulated
    (exact products, fp32 sums), the reason of every path is recorded, and no later GEMM retries."""
    calls = []

    def bf16_only(a, b, scale_a, scale_b, out_dtype):
        calls.append(out_dtype)
        raise error("Only bf16 and fp16 high precision output types are supported for row-wise "
                    "scaling.")

    monkeypatch.setattr(fp8, "_has_fp8_tensor_cores", lambda t: True)
    monkeypatch.setattr(fp8, "_PATH", {})
    monkeypatch.setattr(fp8, "_FALLBACK_REASON", {})
    monkeypatch.setattr(torch, "_scaled_mm", bf16_only)
    qa, sa, qb, sb = _operands(16, 512, 32)
    with pytest.warns(RuntimeWarning, match=f"raised {error.__name__}.*emulated"):
        assert torch.equal(fp8._gemm(qa, sa, qb, sb), _fp8_gemm_emulated(qa, sa, qb, sb))
    assert torch.equal(fp8._gemm(qa, sa, qb, sb),
                       _fp8_gemm_emulated(qa, sa, qb, sb)) and len(calls) == 2
    path = fp8.gemm_path("cpu")
    assert (path["path"] == "emulated"
            and path["reason"].count(f"raised {error.__name__}: Only bf16") == 2)


def test_gemm_path_runs_a_product_before_it_answers(gpu_like):
    """env.json's fp8_gemm is written before a run's first FP8 GEMM (bf16_fp8rollout computes none
    by then): the answer comes from one product on the device, with block scales (K of two
    128-groups), not from expectation."""
    assert fp8.gemm_path("cpu")["path"] == "torch._scaled_mm blockwise 1x128"
    assert gpu_like == [PROBE]


def test_gemm_path_on_a_device_without_fp8_tensor_cores(monkeypatch):
    monkeypatch.setattr(fp8, "_PATH", {})
    assert fp8.gemm_path("cpu") == {"path": "emulated",
                                    "reason": "no FP8 tensor cores on this device"}
