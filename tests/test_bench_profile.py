"""`suite bench --profile` (suite/experiments/bench_profile.py): each operation counted once, in
its kind, inside the steps that count; the docs' table from a committed profile. No timing is
asserted: a real profiled run is checked for what it must contain, not for how long it took."""

from __future__ import annotations

import json
import math

import pytest
from rich.console import Console

from suite.experiments import bench, bench_profile
from suite.rl import config

RANGE = bench_profile.STEP_RANGE


def test_each_operation_has_one_kind():
    kinds = {"aten::mm": "GEMM", "aten::addmm": "GEMM", "aten::bmm": "GEMM",
             "aten::_scaled_dot_product_flash_attention_for_cpu": "attention fwd",
             "aten::_scaled_dot_product_flash_attention_for_cpu_backward": "attention bwd",
             "aten::_efficient_attention_backward": "other",  # no "scaled_dot_product" in it
             "aten::copy_": "copies, casts", "aten::_to_copy": "copies, casts",
             "aten::mul": "other", "FP8LinearBackward": "other", "aten::matmul": "other"}
    assert {op: bench_profile.kind(op) for op in kinds} == kinds
    assert set(kinds.values()) == set(bench_profile.KINDS)


def test_only_the_counted_steps_count_and_each_operation_once_per_step():
    # (name, start us, self us): step ranges [0, 100) (left out: the warm-up) and [100, 200),
    # [200, 300) counted; the ranges' own events and an event after the last step never count
    events = [(RANGE, 0, 5.0), ("aten::mm", 10, 1000.0),  # warm-up step
              (RANGE, 100, 7.0), ("aten::mm", 110, 3000.0), ("aten::copy_", 150, 500.0),
              (RANGE, 200, 7.0), ("aten::mm", 250, 1000.0), ("aten::mul", 299.5, 250.0),
              ("aten::_scaled_dot_product_flash_attention_for_cpu_backward", 260, 4000.0),
              ("aten::mm", 300, 9000.0)]  # after the last step: evaluation, export
    ms = bench_profile.split(events, [(100, 200), (200, 300)])
    assert ms == {"GEMM": 2.0, "attention fwd": 0.0, "attention bwd": 2.0, "copies, casts": 0.25,
                  "other": 0.125}  # (3000 + 1000) us / 2 steps = 2 ms; 500 / 2; 250 / 2


def test_a_profiled_run_counts_its_gemms_and_attention_in_every_step_after_the_first():
    cfg = config.load(["tier=smoke", "steps=3", "precision=bf16", "threads=1", "name=bench"])
    got = bench_profile.profiled(cfg)
    assert got["steps_counted"] == 2  # steps 2 and 3
    ms = got["ms_per_step"]
    assert set(ms) == set(bench_profile.KINDS) and all(math.isfinite(v) and v >= 0
                                                       for v in ms.values())
    # every update runs the trainer's GEMMs and its torch attention backward (HF's sdpa), on
    # every machine class
    assert ms["GEMM"] > 0 and ms["attention bwd"] > 0
    assert got["unprofiled_step_s"] > 0


def test_the_docs_table_comes_from_the_committed_profile(tmp_path, monkeypatch):
    monkeypatch.setattr(bench_profile, "PROFILE_DIR", tmp_path)
    with pytest.raises(ValueError, match="suite bench --profile --write-baseline"):
        bench_profile.f_table("cpu-test-class")
    ms = {"GEMM": 34.2, "attention fwd": 54.9, "attention bwd": 95.3, "copies, casts": 8.6,
          "other": 56.6}
    (tmp_path / "cpu-test-class.json").write_text(json.dumps({
        "schema_version": bench_profile.SCHEMA, "flows": {
            "bf16": {"ms_per_step": ms, "steps_counted": 5, "unprofiled_step_s": 0.2722}}}))
    assert bench_profile.f_table("cpu-test-class").splitlines() == [
        "| flow | GEMM | attention fwd | attention bwd | copies, casts | other | sum | unprofiled "
        "step |", "|---|---|---|---|---|---|---|---|",
        "| bf16 | 34.2 | 54.9 | 95.3 | 8.6 | 56.6 | 249.6 | 272.2 |"]
    record = json.loads((tmp_path / "cpu-test-class.json").read_text())
    record["flows"]["fp8"] = {"ms_per_step": {**ms, "GEMM": 119.7}, "steps_counted": 5,
                              "unprofiled_step_s": 0.4462}
    (tmp_path / "cpu-test-class.json").write_text(json.dumps(record))
    assert bench_profile.f_ratio("cpu-test-class", "fp8", "bf16", "GEMM") == "3.50x"  # 119.7/34.2
    assert bench_profile.f_ratio("cpu-test-class", "fp8", "bf16", "attention-fwd") == "1.00x"
    with pytest.raises(ValueError, match="unknown kind 'attention' .*attention-fwd"):
        bench_profile.f_ratio("cpu-test-class", "fp8", "bf16", "attention")
    # bf16's 272.2 ms plus the 85.5 ms more that fp8's GEMMs take: 357.7 / 272.2
    assert bench_profile.f_floor("cpu-test-class", "fp8") == "1.31x"
    assert bench_profile.f_ms("cpu-test-class", "bf16", "attention-bwd") == "95.3 ms"
    assert bench_profile.f_ms("cpu-test-class", "fp8", "step") == "446.2 ms"
    record["sdpa"] = {"shape": bench_profile.SDPA_SHAPE, "rows": [
        {"head_size": 24, "fp32": {"forward_ms": 2.13, "backward_ms": 3.76},
         "bf16": {"forward_ms": 2.58, "backward_ms": 28.29}}]}
    (tmp_path / "cpu-test-class.json").write_text(json.dumps(record))
    assert bench_profile.f_sdpa("cpu-test-class").splitlines() == [
        "| head size | fp32 forward / backward (ms) | bf16 forward / backward (ms) | bf16 backward "
        "over fp32's |", "|---|---|---|---|", "| 24 | 2.13 / 3.76 | 2.58 / 28.29 | 7.5x |"]


def test_what_it_cannot_profile_is_refused_before_anything_runs(monkeypatch):
    monkeypatch.setattr(bench_profile, "profiled", lambda cfg: pytest.fail("measured"))
    with pytest.raises(ValueError, match="--profile: --compare"):
        bench.main(["--profile", "--compare", "tier=smoke"])
    with pytest.raises(ValueError, match="--profile: nproc=2; the profiler sees this process"):
        bench.main(["--profile", "tier=smoke", "nproc=2"])


def test_with_vllm_only_the_flows_its_vllm_runs_here_are_profiled(monkeypatch):
    from suite.numerics import vllm_support

    monkeypatch.setattr(vllm_support, "supported_flows", lambda: ["fp32", "bf16", "fp16"])
    ran = []

    def fake(cfg):
        ran.append((cfg.precision, cfg.engine))
        return {"ms_per_step": dict.fromkeys(bench_profile.KINDS, 1.0), "steps_counted": 5,
                "unprofiled_step_s": 0.01}

    monkeypatch.setattr(bench_profile, "profiled", fake)
    assert bench_profile.main(["tier=smoke", "engine=vllm", "policy.heads=2", "policy.kv_heads=1"],
                              False, Console(quiet=True)) == 0
    assert ran == [("fp32", "vllm"), ("bf16", "vllm")]  # fp8, bf16_fp8rollout, exact: not here


def test_sdpa_is_timed_forward_and_backward_in_both_dtypes_per_head_size():
    rows = bench_profile.sdpa_rows(sizes=(8, 16), repeats=2, rows=2, heads=1, tokens=8)
    assert [r["head_size"] for r in rows] == [8, 16]
    for r in rows:
        assert set(r) == {"head_size", "fp32", "bf16"}
        for dtype in ("fp32", "bf16"):
            assert set(r[dtype]) == {"forward_ms", "backward_ms"}
            assert all(math.isfinite(v) and v > 0 for v in r[dtype].values())
