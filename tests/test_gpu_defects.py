"""GPU behaviour checked without a GPU: torch's cuBLAS setting read once per process, the doctor's
equality rows on a GPU, and the FP8 path check (which kernel the probe reaches, and the FP8 tensor
cores' short accumulator against a misread scale).

Each test encodes a documented rule of CUDA torch (cited at the test) with monkeypatching or a CPU
simulation, since the rule itself only acts on a GPU.
"""

import os

import pytest
import torch
from test_fp8_gemm_paths import cuda_contract, gpu_like  # noqa: F401  (a fixture)

from suite.experiments import doctor, sweep
from suite.numerics import determinism, fp8
from suite.numerics.fp8 import BLOCK, _fp8_gemm_emulated, quantize_groupwise

CUBLAS = "CUBLAS_WORKSPACE_CONFIG"


# ---- cuBLAS reads its workspace setting once per process ---------------------------------------
# aten/src/ATen/Context.cpp: alertCuBLASConfigNotDeterministic() keeps the answer of
# checkCuBLASConfigDeterministic() in a function-local static, evaluated at the process's first
# cuBLAS GEMM; CublasHandlePool.cpp keeps the workspace size the same way. A later value is never
# read.
def test_a_deterministic_run_after_cuda_work_without_the_setting_is_refused(monkeypatch):
    monkeypatch.delenv(CUBLAS, raising=False)
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: True)  # an earlier cell's GEMMs ran
    with pytest.raises(ValueError, match=f"deterministic=true.*{CUBLAS}.*fresh process"):
        with determinism.enabled(True):
            pytest.fail("the run started")
    assert not torch.are_deterministic_algorithms_enabled() and CUBLAS not in os.environ


def test_the_cublas_setting_is_kept_for_the_rest_of_the_process(monkeypatch):
    """The next cell in this process must find what cuBLAS computes with; torch's flag and vLLM's
    variable are the run's own."""
    monkeypatch.delenv(CUBLAS, raising=False)
    monkeypatch.delenv("VLLM_BATCH_INVARIANT", raising=False)
    with determinism.enabled(True):
        assert os.environ[CUBLAS] == ":4096:8" and torch.are_deterministic_algorithms_enabled()
    assert os.environ[CUBLAS] == ":4096:8" and "VLLM_BATCH_INVARIANT" not in os.environ
    assert not torch.are_deterministic_algorithms_enabled()
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: True)
    with determinism.enabled(True):  # the process has the setting: a later deterministic cell runs
        assert torch.are_deterministic_algorithms_enabled()


@pytest.mark.parametrize("deterministic", [True, False])
def test_a_sweep_sets_cublas_before_its_first_cell_when_any_cell_is_deterministic(
        tmp_path, monkeypatch, deterministic):
    monkeypatch.delenv(CUBLAS, raising=False)
    seen = []
    monkeypatch.setattr(sweep, "prebuild", lambda *a: seen.append(os.environ.get(CUBLAS)))
    monkeypatch.setattr(sweep, "launch_hydra", lambda *a: seen.append(os.environ.get(CUBLAS)))
    monkeypatch.setattr(sweep, "report_sweep", lambda cells, console: [])
    args = ["grid=sanity", "tier=smoke", f"out={tmp_path}", "name=det", "precision=fp32",
            "algorithm=grpo", f"deterministic={str(deterministic).lower()}"]
    assert sweep.main(args) == 0
    assert seen == [":4096:8" if deterministic else None] * 2  # else the environment is untouched


# ---- the doctor's equality rows on a GPU -------------------------------------------------------
@pytest.mark.parametrize("device", ["cuda:0", "cpu"])
def test_the_doctors_equality_runs_are_deterministic_on_a_gpu(tmp_path, monkeypatch, device):
    """docs/distributed.md: byte-identical reruns hold on a GPU only with deterministic=true."""
    cmds = []

    class Done:
        returncode = 0

    monkeypatch.setattr(doctor, "_device", lambda: device)
    monkeypatch.setattr(doctor.subprocess, "run", lambda cmd, **kw: cmds.append(cmd) or Done())
    doctor._run(tmp_path)
    run_args = cmds[0][cmds[0].index("run") + 1:]
    on_gpu = ["deterministic=true"] if device == "cuda:0" else []
    assert run_args == [*doctor.RUN_ARGS, *on_gpu, f"out={tmp_path}"]


# ---- FP8: the block-scaled kernel is the one checked -------------------------------------------
def test_a_first_product_of_one_group_still_checks_the_block_scaled_kernel(gpu_like):  # noqa: F811
    """The smoke policy's first FP8 GEMM has K = 64 (one 128-group): torch matches a single group's
    scales as row-wise before block-wise (ScaledBlas.cpp, get_joint_scaling), so that product never
    reaches the block-scaled kernel. The path is chosen on the two-group probe first."""
    g = torch.Generator().manual_seed(0)
    (qa, sa), (qb, sb) = (quantize_groupwise(torch.randn(16, 64, generator=g)) for _ in range(2))
    fp8._gemm(qa, sa, qb, sb)
    assert gpu_like == [("blockwise", 32, 2 * BLOCK, 32), ("rowwise", 16, BLOCK, 16)]
    assert fp8.gemm_path("cpu")["path"] == "torch._scaled_mm blockwise 1x128"


def test_a_block_scaled_kernel_that_misreads_scales_is_caught_when_the_first_product_has_one_group(
        monkeypatch):
    """A kernel whose two-group products are wrong is dropped even when the run's first product
    has one group; every later product is right."""
    calls = []

    def scaled_mm(a, b, scale_a, scale_b, out_dtype):
        blockwise = scale_a.dim() == 2 and scale_a.shape[1] > 1
        return cuda_contract(a, b, scale_a, scale_b, out_dtype, calls, misread=blockwise)

    monkeypatch.setattr(fp8, "_has_fp8_tensor_cores", lambda t: True)
    monkeypatch.setattr(fp8, "_PATH", {})
    monkeypatch.setattr(fp8, "_FALLBACK_REASON", {})
    monkeypatch.setattr(torch, "_scaled_mm", scaled_mm)
    g = torch.Generator().manual_seed(0)
    (qa, sa), (qb, sb) = (quantize_groupwise(torch.randn(16, 64, generator=g)) for _ in range(2))
    with pytest.warns(RuntimeWarning, match="blockwise 1x128 disagreed"):
        fp8._gemm(qa, sa, qb, sb)
    assert fp8.gemm_path("cpu")["path"] == "torch._scaled_mm per K-slice"
    (qa, sa), (qb, sb) = (quantize_groupwise(torch.randn(32, 512, generator=g)) for _ in range(2))
    sb[:, 1] *= 4  # distinct scales per group
    assert fp8.agrees(fp8._gemm(qa, sa, qb, sb), qa, sa, qb, sb)


# ---- FP8: agreement up to the tensor cores' short accumulator ----------------------------------
def _chop(x: torch.Tensor, bits: int) -> torch.Tensor:
    """x (fp64) truncated toward zero to ``bits`` significand bits."""
    m, e = torch.frexp(x)
    return torch.ldexp(torch.trunc(m * 2.0 ** bits) / 2.0 ** bits, e)


def _short_accumulator(qa, sa, qb, sb, bits: int, promote_every: int | None) -> torch.Tensor:
    """The product as FP8 tensor cores compute it: exact FP8 x FP8 products, each scaled, added in
    order in an accumulator of ``bits`` significand bits that truncates, promoted to an fp32 sum
    every ``promote_every`` terms (DeepGEMM: every 128) or never (None)."""
    A = fp8.dequantize_groupwise(qa, sa).double()
    B = fp8.dequantize_groupwise(qb, sb).double()
    K = A.shape[1]
    total = torch.zeros(A.shape[0], B.shape[0], dtype=torch.float64)
    acc = torch.zeros_like(total)
    for k in range(K):
        acc = _chop(acc + A[:, k:k + 1] * B[:, k][None, :], bits)
        if promote_every and (k + 1) % promote_every == 0:
            total, acc = (total + acc).float().double(), torch.zeros_like(acc)
    return (total + acc).float()


def _positive_operands(seed=0):
    """(qa, sa, qb, sb), (32, 256) each: positive entries, where truncation errors add up."""
    g = torch.Generator().manual_seed(seed)
    return (*quantize_groupwise(0.5 + torch.rand(32, 2 * BLOCK, generator=g)),
            *quantize_groupwise(0.5 + torch.rand(32, 2 * BLOCK, generator=g)))


@pytest.mark.parametrize("bits,promote_every", [(14, BLOCK), (14, None), (13, None)])
def test_a_correct_kernel_with_a_14_bit_accumulator_agrees(bits, promote_every):
    """DeepSeek-V3 (arXiv 2412.19437, Sec. 3.3.2): Hopper's FP8 GEMM accumulation keeps about 14
    bits. A correct kernel that accumulates so is no reason to fall back to the emulation."""
    ops = _positive_operands()
    got = _short_accumulator(*ops, bits, promote_every)
    assert not torch.equal(got, _fp8_gemm_emulated(*ops))  # rounding well beyond fp32's
    assert fp8.agrees(got, *ops)


def test_the_bound_still_catches_a_misread_scale_on_the_probe():
    """Kernels that read the scales wrongly, run on the probe, each with the short accumulator's
    rounding on top: transposed (a (M, Kg) scale read with the other layout), A's and B's exchanged,
    the K-groups' order reversed, rows shifted by one, the first group's scale for every group."""
    qa, sa, qb, sb = fp8._probe("cpu")
    M, Kg = sa.shape
    assert Kg == 2 and sa.unique().numel() > M  # the probe's scales differ by row and by group
    wrong = {"transposed": (sa.t().contiguous().reshape(M, Kg), sb),
             "exchanged": (sb, sa),
             "groups reversed": (sa.flip(1), sb.flip(1)),
             "rows shifted": (sa.roll(1, 0), sb),
             "first group only": (sa[:, :1].expand(M, Kg), sb[:, :1].expand(M, Kg))}
    for name, (wa, wb) in wrong.items():
        got = _short_accumulator(qa, wa, qb, wb, 14, BLOCK)
        assert not fp8.agrees(got, qa, sa, qb, sb), name
    assert fp8.agrees(_short_accumulator(qa, sa, qb, sb, 14, BLOCK), qa, sa, qb, sb)
