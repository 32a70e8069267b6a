"""``suite doctor``: the machine acceptance table runs here (the CPU) with every row passing, and a
failing check is a failing row and exit code 1, never the end of the table."""

import json
import subprocess
import sys

from process_tree import env as _env

from suite.experiments import doctor


def test_doctor_passes_on_this_machine(tmp_path):
    p = subprocess.run([sys.executable, "-m", "suite.cli", "doctor", f"out={tmp_path}"], env=_env(),
                       capture_output=True, text=True, timeout=900)
    rows = json.loads((tmp_path / "doctor.json").read_text())["rows"]
    failed = [r for r in rows if not r["ok"]]
    assert p.returncode == 0 and not failed, (failed, p.stdout[-2000:], p.stderr[-2000:])
    from suite.numerics.precision import FLOWS

    checks = {r["check"] for r in rows}
    assert {f"placement {f}" for f in FLOWS} | {f"dtypes {f}" for f in FLOWS} <= checks
    assert {"mismatch order", "mismatch fp8 unified", "fp8 gemm", "fp4 quantisers",
            "mismatch fp4 rollout", "fp16 overflow", "fsdp2 = plain", "kill + resume",
            "memory plan"} <= checks
    order = next(r for r in rows if r["check"] == "mismatch order")["measured"]
    # the measured values are in the table, in order
    assert order.startswith("exact 0.00e+00 < fp32")
    assert "suite doctor: " in p.stdout and f"{len(rows)}/{len(rows)} pass" in p.stdout


def test_a_failing_check_is_a_failing_row_and_exit_1(tmp_path, monkeypatch):
    def broken(*a, **k):
        raise RuntimeError("CUDA error: an illegal memory access")

    monkeypatch.setattr(doctor, "_setup", lambda out, console: (None, None, None))
    monkeypatch.setattr(doctor, "check_flows",
                        lambda *a: [doctor.Row("placement fp32", True, "ok", "ok")])
    monkeypatch.setattr(doctor, "check_fsdp_and_resume", broken)
    monkeypatch.setattr(doctor, "check_fp16_overflow",
                        lambda model: [doctor.Row("fp16 overflow", True, "ok", "ok")])
    monkeypatch.setattr(doctor, "check_memory_plan",
                        lambda: [doctor.Row("memory plan", True, "ok", "ok")])
    assert doctor.main([f"out={tmp_path}"]) == 1
    rows = json.loads((tmp_path / "doctor.json").read_text())["rows"]
    assert [(r["check"], r["ok"]) for r in rows] == [("placement fp32", True), ("fp8 gemm", True),
                                                     ("fp4 quantisers", True),
                                                     ("fp16 overflow", True), ("runs", False),
                                                     # a failing check ends no table
                                                     ("memory plan", True)]
    assert "illegal memory access" in rows[-2]["measured"]


def test_without_out_it_writes_beside_the_runs_where_git_looks_away(tmp_path, monkeypatch):
    """`suite doctor` in a checkout wrote into results/doctor/, which git does not ignore (a dirty
    checkout after the first command a user runs): by default it writes under the runs' root, as
    every run does."""
    from pathlib import Path

    repo = Path(__file__).resolve().parents[1]
    if not (repo / ".git").exists():
        import pytest

        pytest.skip("not a git checkout")
    ignored = subprocess.run(["git", "check-ignore", "-q", str(doctor.DEFAULT_OUT / "doctor.json")],
                             cwd=repo)
    assert ignored.returncode == 0, f"{doctor.DEFAULT_OUT} is not ignored by git"
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(doctor, "run_doctor",
                        lambda out, console: [doctor.Row("fp8 gemm", True, "ok", "ok")])
    assert doctor.main([]) == 0
    assert json.loads((tmp_path / "runs" / "doctor" / "doctor.json").read_text())["rows"][0]["ok"]
