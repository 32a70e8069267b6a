"""The source grids' table (suite/analysis/sources.py): a source against its matched control, by
hand."""

from pathlib import Path

import pytest

from suite.analysis import sources
from suite.analysis.runs import Run


def _run(value, seed, final, verdict, regime="base", k3=1e-3):
    return Run(dir=Path("/x"), label=f"{value}/s{seed}", task="arith3", algorithm="grpo",
               precision="fp32", seed=seed,
               summary={"accuracy/final": final, "verdict": verdict, "mismatch/step0/kl_k3": k3},
               config={"regime": regime, "kv_cache": value, "algorithm": "grpo", "seed": seed})


def test_a_source_failing_every_seed_beside_a_passing_control_separates_with_its_gap():
    runs = ([_run("auto", s, f, "pass", k3=0.0) for s, f in enumerate((0.97, 0.98, 0.99))]
            + [_run("fp8", s, f, "unstable") for s, f in enumerate((0.80, 0.70, 0.90))])
    assert sources.source_axis(runs) == "kv_cache"
    control, source = sources.rows(runs, "kv_cache")
    assert control["control"] and control["gap"] is None and control["value"] == "auto"
    assert source["separated"] and source["verdicts"] == {"pass": 0, "unstable": 3, "collapse": 0}
    # mean of the source minus mean of the control
    assert source["gap"][0] == pytest.approx(0.80 - 0.98)
    assert source["gap"][1] <= source["gap"][0] <= source["gap"][2] < 0
    head, body = sources.table([control, source], "kv_cache")
    assert body[0][2] == "auto (control)" and body[0][6] == "0 / -" and body[1][8] == "yes"
    assert "Separated" in sources.outcome([control, source], "kv_cache")


def test_two_seeds_or_a_control_that_misses_never_separate():
    runs = ([_run("auto", s, 0.97, "pass") for s in (0, 1)]
            + [_run("fp8", s, 0.5, "collapse") for s in (0, 1)])
    assert not sources.rows(runs, "kv_cache")[1]["separated"]
    runs = (
        [_run("auto", s, f, v)
         for s, f, v in ((0, 0.97, "pass"), (1, 0.9, "unstable"), (2, 0.98, "pass"))]
        + [_run("fp8", s, 0.5, "collapse") for s in (0, 1, 2)])
    rec = sources.rows(runs, "kv_cache")
    assert not rec[1]["separated"]
    assert "No cell separates" in sources.outcome(rec, "kv_cache")


def test_runs_varying_no_source_or_two_are_not_a_source_grid():
    assert sources.source_axis([_run("auto", 0, 0.9, "pass"), _run("auto", 1, 0.9, "pass")]) is None
    a, b = _run("auto", 0, 0.9, "pass"), _run("fp8", 0, 0.9, "pass")
    b.config["staleness"] = 1
    assert sources.source_axis([a, b]) is None
