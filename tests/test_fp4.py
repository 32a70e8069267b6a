"""4-bit rollouts (suite/numerics/fp4.py): E2M1 rounding against a hand table and torch's own
reference, NVFP4 and MXFP4 scales by hand, zero blocks, ragged widths, non-finite input, the exact
linear layer, the flows in the table (not in the main grids, refused by vLLM), and a smoke run of
each (the sampler on a device: tests/test_gpu_path.py)."""

import ast
import json
import math
from pathlib import Path

import pytest
import torch

from suite.numerics import fp4
from suite.numerics.flows import FLOWS, main_flows

FP4_FLOWS = ["bf16_nvfp4rollout", "bf16_nvfp4a4rollout", "bf16_mxfp4rollout", "bf16_mxfp4a4rollout",
             "nvfp4a4"]
POINTS = [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0]  # E2M1's magnitudes, code = index
# Every tie between two neighbouring points goes to the even code (hand table): value -> rounded.
TIES = {0.25: 0.0, 0.75: 1.0, 1.25: 1.0, 1.75: 2.0, 2.5: 2.0, 3.5: 4.0, 5.0: 4.0}


# ---- E2M1 --------------------------------------------------------------------------------
def test_every_e2m1_point_is_kept_every_tie_goes_to_the_even_code_and_beyond_6_saturates():
    for sign in (1.0, -1.0):
        pts = torch.tensor([sign * p for p in POINTS])
        assert torch.equal(fp4.round_e2m1(pts), pts)
        ties = torch.tensor([sign * t for t in TIES])
        assert fp4.round_e2m1(ties).tolist() == [sign * v for v in TIES.values()]
        # just off a tie, the nearer point wins
        below = torch.nextafter(ties.abs(), torch.tensor(0.0)) * sign
        above = torch.nextafter(ties.abs(), torch.tensor(10.0)) * sign
        lo = [max(p for p in POINTS if p < t) for t in TIES]
        hi = [min(p for p in POINTS if p > t) for t in TIES]
        assert fp4.round_e2m1(below).tolist() == [sign * v for v in lo]
        assert fp4.round_e2m1(above).tolist() == [sign * v for v in hi]
        big = torch.tensor([6.5, 7.0, 1e30, math.inf]) * sign
        assert fp4.round_e2m1(big).tolist() == [6.0 * sign] * 4
    assert math.isnan(fp4.round_e2m1(torch.tensor([math.nan])).item())


def _torch_e2m1_reference():
    """torch's own float <-> E2M1 helpers (torch/testing/_internal/common_quantized.py, copied there
    from torchao), loaded without that module's test-only imports: those functions and constants."""
    path = Path(torch.__file__).parent / "testing" / "_internal" / "common_quantized.py"
    if not path.is_file():
        pytest.skip("this torch ships no common_quantized.py")
    want = {"_n_ones", "_f32_to_floatx_unpacked", "_floatx_unpacked_to_f32", "EBITS_F32",
            "F32_EXP_BIAS"}
    tree = ast.parse(path.read_text())
    keep = [n for n in tree.body if getattr(n, "name", None) in want
            or isinstance(n, ast.Assign)
            and {getattr(t, "id", None) for t in ast.walk(n.targets[0])} & want]
    ns = {"torch": torch, "Tensor": torch.Tensor}
    exec(compile(ast.Module(body=keep, type_ignores=[]), str(path), "exec"), ns)
    to_e2m1, to_f32 = ns["_f32_to_floatx_unpacked"], ns["_floatx_unpacked_to_f32"]
    return lambda x: to_f32(to_e2m1(x.float(), 2, 1), 2, 1)


def test_rounding_agrees_with_torchs_float4_reference_everywhere():
    ref = _torch_e2m1_reference()
    grid = torch.arange(-8 * 256, 8 * 256 + 1) / 256  # every tie and its neighbours in [-8, 8]
    rand = torch.randn(100_000, generator=torch.Generator().manual_seed(0)) * 3
    for x in (grid, rand, torch.tensor(list(TIES) + POINTS)):
        assert torch.equal(fp4.round_e2m1(x), ref(x))
    # and the codes pack into torch's own dtype, two per byte
    assert torch.zeros(4, dtype=torch.uint8).view(torch.float4_e2m1fn_x2).shape == (4,)


# ---- scales ------------------------------------------------------------------------------
def test_nvfp4_scales_by_hand_and_the_block_scale_saturates_at_448():
    x = torch.zeros(1, 32)
    x[0, :4] = torch.tensor([12.0, 5.0, 7.0, -0.75])  # block 0: amax 12, the tensor's
    x[0, 16:19] = torch.tensor([3.0, 1.0, 0.4])  # block 1: amax 3
    q = fp4.quantize(x, "nvfp4")
    assert q.tensor_scale.item() == 2688 / 12 == 224.0
    assert q.scales.tolist() == [[448.0, 112.0]]  # 12/6*224 = 448 (E4M3's max), 3/6*224 = 112
    assert q.codes[0, :4].tolist() == [6.0, 2.0, 4.0, -0.5]  # x/2: 6, 2.5 (tie), 3.5 (tie), -0.375
    assert q.codes[0, 16:19].tolist() == [6.0, 2.0, 1.0]  # x*2: 6, 2, 0.8
    assert fp4.dequantize(q)[0, 16:19].tolist() == [3.0, 1.0, 0.5]
    # amax / 6 * (2688 / amax) rounds above 448 in fp32 for some amax: clamped, never NaN
    amax = torch.rand(2000, generator=torch.Generator().manual_seed(1)) * 100 + 1e-3
    assert (amax / 6 * (2688 / amax) > 448).any()  # the clamp is needed
    q = fp4.quantize(torch.stack([amax, amax / 3], 1), "nvfp4", per_row=True)
    assert (q.scales == 448.0).all() and (q.codes[:, 0] == 6.0).all()


def test_mxfp4_scale_is_a_power_of_two_from_the_exact_exponent():
    amaxes = [1.0, 6.0, 7.99, 8.0, 0.3, 3.0, 2.0 ** -130, 2.0 ** 127]
    want = [-2, 0, 0, 1, -4, -1, -127, 125]  # floor(log2 amax) - 2, clamped to E8M0's [-127, 127]
    x = torch.zeros(len(amaxes), 32)
    x[:, 0] = torch.tensor(amaxes)
    q = fp4.quantize(x, "mxfp4")
    assert q.scales[:, 0].tolist() == [2.0 ** e for e in want]
    assert q.tensor_scale.item() == 1.0
    # amax / scale in [4, 8): a value above 6 saturates, as E2M1 has nothing larger
    q = fp4.quantize(torch.tensor([[7.0, 1.0, -2.5, 0.2]]), "mxfp4")
    assert q.codes.tolist() == [[6.0, 1.0, -2.0, 0.0]]


@pytest.mark.parametrize("fmt", list(fp4.FORMATS))
def test_zero_blocks_and_zero_tensors_stay_zero(fmt):
    x = torch.zeros(3, 64)
    x[1, 40] = 2.0  # one block of one row is non-zero
    for t in (x, torch.zeros(2, 64)):
        q = fp4.quantize(t, fmt)
        assert torch.isfinite(q.scales).all() and torch.isfinite(q.tensor_scale).all()
        assert torch.equal(fp4.dequantize(q) == 0, t == 0)
    assert fp4.dequantize(fp4.quantize(x, fmt))[1, 40].item() == 2.0


@pytest.mark.parametrize("fmt", list(fp4.FORMATS))
def test_a_ragged_last_block_gives_what_the_zero_padded_width_gives(fmt):
    block = fp4.FORMATS[fmt].block
    for K in (5, block + 3, 3 * block - 1):
        x = torch.randn(4, K, generator=torch.Generator().manual_seed(K))
        padded = torch.nn.functional.pad(x, (0, math.ceil(K / block) * block - K))
        q, qp = fp4.quantize(x, fmt), fp4.quantize(padded, fmt)
        assert q.codes.shape == x.shape and q.scales.shape == (4, math.ceil(K / block))
        assert torch.equal(q.codes, qp.codes[:, :K]) and torch.equal(q.scales, qp.scales)
        assert torch.equal(fp4.dequantize(q), fp4.dequantize(qp)[:, :K])


def test_non_finite_input_propagates_as_nan_over_its_block_or_tensor():
    x = torch.randn(2, 64, generator=torch.Generator().manual_seed(0))
    for bad in (math.nan, math.inf):
        y = x.clone()
        y[0, 3] = bad
        mx = fp4.dequantize(fp4.quantize(y, "mxfp4"))
        assert mx[0, :32].isnan().all() and torch.isfinite(mx[0, 32:]).all()
        assert torch.isfinite(mx[1]).all()
        assert fp4.dequantize(fp4.quantize(y, "nvfp4")).isnan().all()  # s_t comes from the amax
        rows = fp4.dequantize(fp4.quantize(y, "nvfp4", per_row=True))  # per-token: only that token
        assert rows[0].isnan().all() and torch.isfinite(rows[1]).all()


# ---- the linear layer --------------------------------------------------------------------
def _layer(K=40, N=24, M=6, seed=0):
    g = torch.Generator().manual_seed(seed)
    w = torch.randn(N, K, generator=g) * 0.1
    w[0, 0] = 2.625  # the tensor amax: s_t = 2688 / 2.625 = 1024, a power of two
    x = torch.randn(2, M // 2, K, generator=g).bfloat16()
    return x, w, torch.randn(N, generator=g)


@pytest.mark.parametrize("fmt", list(fp4.FORMATS))
def test_emulated_linear_is_dequantise_then_an_fp32_gemm(fmt):
    """Exact products, fp32 sums: with power-of-two tensor scales the layer equals dequantise ->
    fp32 GEMM -> bias -> bf16 bit for bit; every product of its operands is exact in fp32."""
    x, w, b = _layer()
    sw = fp4.quantize_weight(w, fmt)
    w_hat = fp4.dequantize(fp4.quantize(w, fmt))
    x_in = x.float()
    if fp4.FORMATS[fmt].acts:
        qx = fp4.quantize(x.reshape(-1, x.shape[-1]), fmt, per_row=True)
        x_in = fp4.dequantize(qx).reshape(x.shape)
        a = fp4.operand(qx)
        # per-token tensor scales are no powers of two: the products are exact, the sums fp32
        assert torch.equal((a[:, None, :] * sw.operand[None]).double(),
                           a.double()[:, None, :] * sw.operand.double()[None])
    want = (torch.nn.functional.linear(x_in, w_hat) + b).bfloat16()
    got = fp4.fp4_linear(x, sw, b)
    assert got.dtype == torch.bfloat16 and got.shape == (2, 3, 24)
    if fp4.FORMATS[fmt].acts and fp4.FORMATS[fmt].two_level:
        assert (got.float() - want.float()).abs().max() <= 2 ** -7 * want.float().abs().max()
    else:
        assert sw.tensor_scale.item() in (1.0, 1024.0) and torch.equal(got, want)
    prod = x.float()[..., None, :] * sw.operand  # bf16 activation x operand: exact in fp32
    assert torch.equal(prod.double(), x.double()[..., None, :] * sw.operand.double())


def test_w4a16_errs_more_than_fp8_and_w4a4_more_than_w4a16():
    from suite.numerics.fp8 import fp8_linear

    x, w, _ = _layer(K=256, N=64, M=32, seed=3)
    exact = torch.nn.functional.linear(x.float(), w)
    err = {f: (fp4.fp4_linear(x, fp4.quantize_weight(w, f), out_dtype=torch.float32) - exact).norm()
           for f in fp4.FORMATS}
    e8 = (fp8_linear(x.float(), w, out_dtype=torch.float32) - exact).norm()
    assert e8 < err["nvfp4"] < err["nvfp4a4"] and e8 < err["mxfp4"] < err["mxfp4a4"]
    assert err["nvfp4"] < err["mxfp4"]  # finer blocks and E4M3 scales beat power-of-two scales


def test_the_gemm_path_is_recorded_as_emulated_and_why():
    assert fp4.gemm_path("cpu") == {"path": "emulated", "reason": "no FP4 tensor cores: cpu"}
    assert fp4.gemm_path("meta")["path"] == "emulated"


# ---- the flows ---------------------------------------------------------------------------
def test_the_fp4_flows_are_rows_of_the_table_but_not_of_the_main_grids():
    from suite.experiments import grids
    from suite.experiments.listing import flows

    assert all(FLOWS[f].sampler_quant in fp4.FORMATS and FLOWS[f].fp4 for f in FP4_FLOWS)
    assert not any(FLOWS[f].fp4 for f in ("fp8", "bf16_fp8rollout", "bf16"))
    # the main job's cells are those of the committed references
    assert main_flows() == ["fp32", "bf16", "fp16", "bf16_fp32rollout", "bf16_fp16rollout", "fp8",
                            "bf16_fp8rollout", "exact"]
    assert not set(FP4_FLOWS) & set(grids.GRIDS["sanity"]["axes"]["precision"]())
    listed = dict(flows())
    assert all(f in listed and "sampler" in listed[f] for f in FP4_FLOWS)


@pytest.mark.parametrize("flow", FP4_FLOWS)
def test_vllm_and_attribute_refuse_a_4bit_sampler_by_name(flow):
    from suite.experiments.attribute import stack_of
    from suite.rl import config

    with pytest.raises(ValueError, match=f"'{flow}' .*4-bit sampler.*engine=torch"):
        config.load(["tier=smoke", f"precision={flow}", "engine=vllm"])
    with pytest.raises(ValueError, match="4-bit sampler|trains through the sampler's code"):
        stack_of(flow)


def _step0(model, tok, task, precision):
    """One rollout batch of the tiny policy from ``precision``'s sampler, scored by its trainer."""
    import copy

    from suite.numerics.mismatch import mismatch_metrics
    from suite.numerics.scoring import Batch, batch_tensors
    from suite.rl import config
    from suite.rl.train import build_engines

    trainer, engine, _ = build_engines(config.load(["tier=smoke", f"precision={precision}"]),
                                       copy.deepcopy(model))
    engine.sync(trainer.model.state_dict())
    prompts = [tok(it.prompt)["input_ids"] for it in task.split("train", 12)]
    roll = engine.generate(prompts, 20, 1.0, 1.0, torch.Generator().manual_seed(0))
    ids, attn = batch_tensors(roll.prompt_ids, roll.tokens, roll.mask)
    logp, _, _ = trainer.score(Batch(ids, attn, roll.tokens, 1.0))
    return trainer, logp, roll, mismatch_metrics(logp.detach(), roll.logprobs, roll.mask)


def test_quantisation_aware_nvfp4a4_scores_with_the_samplers_quantiser_and_trains(tiny_model):
    """nvfp4a4 (Jet-RL's unified flow with NVFP4 W4A4, NeMo-RL's QARL): the trainer's forward
    quantises as the sampler does, so its step-0 mismatch is far below the bf16 trainer's against
    the same W4A4 sampler (only GEMM shapes differ), and straight-through gradients reach the
    fp32 masters."""
    model, tok, task = tiny_model
    trainer, logp, roll, qat = _step0(model, tok, task, "nvfp4a4")
    *_, rollout = _step0(model, tok, task, "bf16_nvfp4a4rollout")
    assert trainer.unified_engine is not None and trainer.unified_engine.quant == "nvfp4a4"
    assert 0 <= qat["mismatch/kl_k3"] < rollout["mismatch/kl_k3"] / 10
    (-(logp * roll.mask).sum()).backward()
    q = trainer.model.model.layers[0].self_attn.q_proj.weight
    assert q.grad is not None and q.grad.dtype == torch.float32 and q.grad.abs().sum() > 0


def test_the_straight_through_linear_is_the_samplers_forward_and_the_plain_backward():
    x, w, b = _layer()
    x, w, b = x.requires_grad_(), w.requires_grad_(), b.requires_grad_()
    y = fp4.FP4LinearSTE.apply(x, w, b, torch.bfloat16, "nvfp4a4")
    want = fp4.fp4_linear(x.detach(), fp4.quantize_weight(w.detach(), "nvfp4a4"), b.detach())
    assert torch.equal(y, want)
    gy = torch.randn_like(y, dtype=torch.float32).bfloat16()
    y.backward(gy)
    g = gy.float().reshape(-1, 24)
    assert torch.equal(w.grad, g.T @ x.detach().float().reshape(-1, 40))
    assert torch.equal(b.grad, g.sum(0))
    assert torch.equal(x.grad, (g @ w.detach()).bfloat16().reshape(x.shape))


@pytest.fixture(scope="module")
def bf16_run(tmp_path_factory):
    from suite.rl import config
    from suite.rl.train import run

    out = tmp_path_factory.mktemp("bf16")
    return run(config.load(["tier=smoke", f"out={out}", "precision=bf16", "steps=2"]))


@pytest.mark.parametrize("flow", FP4_FLOWS)
def test_a_smoke_run_of_each_fp4_flow_finishes_and_rollouts_mismatch_more_than_bf16(
    tmp_path, flow, bf16_run):
    """The rollout flows' step-0 k3 is above bf16's; the quantisation-aware flow's is only finite
    (its trainer quantises alike; the tiny-policy test above compares it)."""
    from suite.results import read_jsonl
    from suite.rl import config
    from suite.rl.train import run

    d = run(config.load(["tier=smoke", f"out={tmp_path}", f"precision={flow}", "steps=2"]))
    rows = read_jsonl(d / "metrics.jsonl")
    assert len(rows) == 2
    for r in rows:
        bad = {k for k, v in r.items() if isinstance(v, float) and not math.isfinite(v)}
        # The anatomy apportions the mismatch, so it is undefined (NaN) where there is none: the
        # quantisation-aware flow on a class whose bf16 GEMMs are emulated (cpu-avx2-emulated),
        # where sampler and trainer compute the same 4-bit products.
        none = r["mismatch/prob_diff/mean"] == 0
        assert bad <= ({k for k in r if k.startswith("anatomy/")} if none else set()), bad
    env = json.loads((d / "env.json").read_text())
    assert env["fp4_gemm"] == {"path": "emulated", "reason": "no FP4 tensor cores: cpu"}
    assert env["precision"]["sampler"] == FLOWS[flow].sampler
    bf16 = read_jsonl(bf16_run / "metrics.jsonl")[0]["mismatch/kl_k3"]
    assert FLOWS[flow].unified or rows[0]["mismatch/kl_k3"] > bf16
