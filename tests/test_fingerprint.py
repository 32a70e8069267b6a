"""The numerics fingerprint: a few smoke steps of every precision flow, bit for bit against the
committed fingerprint of this machine class (results/reference/<class>/fingerprint.json).

A change that moves any flow's numbers fails here until the fingerprint is regenerated on purpose:
``suite fingerprint --write`` (and ``--write gemm=emulated``) on a machine of the class, then
commit.
"""

from __future__ import annotations

import copy
import warnings

import pytest

from suite.analysis import fingerprint
from suite.numerics import machine


def _gemms() -> list[str]:
    """auto, plus emulated where that is another class here (AVX512-BF16/AMX machines)."""
    return ["auto"] + (["emulated"]
                       if machine.describe("emulated")["id"] != machine.describe("auto")["id"]
                       else [])


@pytest.mark.parametrize("gemm", _gemms())
def test_numerics_fingerprint_of_this_machine_class(gemm):
    got = fingerprint.compute(gemm)
    broken = [i for i in got["invariants"] if i["ok"] is False]
    # what holds on every machine: exact = 0, fp32 < fp16 < bf16 < bf16_fp8rollout
    assert not broken, broken
    assert [i["ok"] for i in got["invariants"]] == [True, True, True]
    want = fingerprint.load(got["machine_class"]["id"])
    if want is None:
        warnings.warn("no committed numerics fingerprint for machine class "
                      f"{got['machine_class']['id']}: invariants only (make one with `suite "
                      "fingerprint --write` on this class)")
        return
    problems = fingerprint.compare(got, want)
    assert not problems, ("numbers moved; if intended, regenerate with `suite fingerprint --write"
                          + ("" if gemm == "auto" else f" gemm={gemm}") + "`:\n"
                          + "\n".join(problems))


def _fake(value: float) -> dict:
    steps = [{"step": 1, "reward/mean": 0.5, "mismatch/kl_k3": value,
              "mismatch/prob_diff/mean": 1e-3, "train/grad_norm": 0.2, "loss/policy": 0.01}]
    return {"machine_class": {"id": "cpu-x-native", "torch": "2.13.0", "threads": 1},
            "flows": {"bf16": {"sha256": f"{hash(value):x}", "steps": steps},
                      "fp32": {"sha256": "aa", "steps": steps}}}


def test_compare_names_the_flow_and_step_a_one_ulp_change_moves():
    import math

    want = _fake(2.5e-4)
    got = copy.deepcopy(want)
    assert fingerprint.compare(got, want) == []
    nudged = math.nextafter(2.5e-4, 1.0)
    got = _fake(nudged)
    got["flows"]["fp32"] = want["flows"]["fp32"]
    (problem,) = fingerprint.compare(got, want)
    assert problem.startswith("bf16: metrics.jsonl moved; first at step 1: mismatch/kl_k3")
    assert repr(nudged) in problem
    other = copy.deepcopy(want)
    other["machine_class"]["torch"] = "2.14.0"
    assert fingerprint.compare(other, want) == ["the fingerprint was made on another class "
                                                "(differs in torch)"]


def test_a_gpus_fingerprint_asks_for_deterministic_kernels_and_a_cpus_runs_as_committed():
    from pathlib import Path

    from suite.analysis.reproduce import REFERENCE_ROOT
    from suite.rl import config

    assert fingerprint.deterministic_on("cuda:0") and not fingerprint.deterministic_on("cpu")
    gpu = fingerprint.overrides("bf16", "auto", Path("out"), deterministic=True)
    assert gpu[-3:] == ["deterministic=true", "out=out", "name=fingerprint"]
    assert config.load(gpu).deterministic
    # every committed (CPU) fingerprint was made with the overrides a CPU run still gets
    cpu = fingerprint.overrides("<flow>", "auto", Path("<tmp>"))[:-2]
    committed = [fingerprint.load(p.parent.name) for p in REFERENCE_ROOT.glob("*/fingerprint.json")]
    assert committed and all(f["overrides"] in (cpu, [*cpu[:3], "gemm=emulated"])
                             for f in committed)
