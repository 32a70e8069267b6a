"""`suite bench`'s targets and per-class baseline (suite/experiments/bench_targets.py): ratios
computed as the issue defines them, a baseline that round-trips, a comparison that names what it
cannot compare. No timing is asserted: the figures here are planted."""

from __future__ import annotations

import json
import math

import pytest
from rich.console import Console

from suite import cli
from suite.experiments import bench, bench_targets

CLASS = {"id": "cpu-test-class", "device": "cpu", "threads": 1}


def _medians(step: dict[str, float]) -> dict[str, dict]:
    # a split that adds up: sampling half, log-probs a tenth, update three tenths, the rest a tenth
    return {f: {"time/step_s": s, "time/sample_s": s * 0.5, "time/logprob_s": s * 0.1,
                "time/update_s": s * 0.3, "time/other_s": s * 0.1} for f, s in step.items()}


def test_each_target_is_the_flows_step_over_bf16s():
    steps = {"fp32": 1.0, "bf16": 2.0, "fp8": 3.2, "bf16_fp8rollout": 2.2, "exact": 2.5}
    rows = {r["flow"]: r for r in bench_targets.target_rows(steps)}
    assert set(rows) == {"fp8", "bf16_fp8rollout", "exact"}  # fp32 has no target
    assert rows["fp8"]["ratio"] == pytest.approx(1.6) and not rows["fp8"]["met"]  # > 1.5
    assert rows["bf16_fp8rollout"]["ratio"] == pytest.approx(1.1) and rows["bf16_fp8rollout"]["met"]
    assert rows["exact"]["ratio"] == 1.25 and rows["exact"]["met"]  # the bound itself meets it
    assert [r["target"] for r in rows.values()] == [1.5, 1.2, 1.25]
    with pytest.raises(ValueError, match="ratios to the bf16 step, which this run did not measure"):
        bench_targets.target_rows({"fp8": 1.0})
    trl = bench_targets.trl_row(trl_step_s=0.9, suite_step_s=0.5)
    assert trl["ratio"] == pytest.approx(1.8) and trl["target"] == 2.0 and not trl["met"]


def test_the_verdict_is_on_the_median_of_the_rounds_and_the_range_is_shown():
    # fp8 meets 1.5x in two rounds of three, exact in none, bf16_fp8rollout has one round only
    rounds = [{"bf16": 2.0, "fp8": 3.2, "exact": 3.0, "bf16_fp8rollout": 2.2},
              {"bf16": 2.5, "fp8": 3.5, "exact": 3.5},
              {"bf16": 1.6, "fp8": 2.24, "exact": 2.4}]
    rows = {r["flow"]: r for r in bench_targets.round_rows(rounds)}
    assert rows["fp8"]["ratios"] == pytest.approx([1.6, 1.4, 1.4])
    assert rows["fp8"]["ratio"] == pytest.approx(1.4) and rows["fp8"]["met"]
    assert rows["fp8"]["met_rounds"] == 2 and rows["fp8"]["high"] == pytest.approx(1.6)
    assert rows["exact"]["ratio"] == pytest.approx(1.5) and not rows["exact"]["met"]
    assert rows["exact"]["met_rounds"] == 0 and rows["exact"]["low"] == pytest.approx(1.4)
    assert rows["bf16_fp8rollout"]["ratios"] == pytest.approx([1.1])
    with pytest.raises(ValueError, match="did not measure"):  # a round without its bf16 step
        bench_targets.round_rows([{"bf16": 1.0, "fp8": 1.2}, {"fp8": 1.0}])


def test_a_baseline_round_trips_and_today_is_compared_stage_by_stage(tmp_path):
    then = _medians({"bf16": 2.0, "fp8": 3.0, "exact": 2.5})
    rounds = [{"bf16": 2.0, "fp8": 3.0}, {"bf16": 2.1, "fp8": 2.9}]
    path = bench_targets.write_baseline(tmp_path, CLASS, then, {"git_sha": "abc1234"}, rounds)
    assert path == tmp_path / "cpu-test-class.json"
    record = bench_targets.load_baseline(tmp_path, "cpu-test-class")
    assert record["flows"] == then and record["machine_class"] == CLASS
    assert record["target_rounds"] == rounds
    # the same figures compare at exactly 1; fp8 twice as slow in every stage is flagged
    now = _medians({"bf16": 2.0, "fp8": 6.0, "fp16": 1.0})
    rows = {r["flow"]: r for r in bench_targets.compare_rows(now, record)}
    assert set(rows) == {"bf16", "fp8"}  # fp16 has no baseline, exact was not run today
    assert all(r[2] == 1.0 for r in rows["bf16"]["stages"].values()) and not rows["bf16"]["slower"]
    assert rows["fp8"]["stages"]["time/update_s"] == (pytest.approx(1.8), pytest.approx(0.9),
                                                      pytest.approx(2.0))
    assert rows["fp8"]["slower"]
    # a ratio inside the noise band is not called slower
    near = _medians({"bf16": 2.0 * bench_targets.NOISE})
    assert not bench_targets.compare_rows(near, record)[0]["slower"]
    zero = {**record, "flows": {"bf16": {**then["bf16"], "time/other_s": 0.0}}}
    assert math.isnan(bench_targets.compare_rows(now, zero)[0]["stages"]["time/other_s"][2])


def test_the_tables_say_met_missed_and_slower():
    console = Console(width=240, record=True)
    medians = _medians({"bf16": 2.0, "fp8": 3.2, "exact": 2.4})
    console.print(bench.targets_table([{f: m["time/step_s"] for f, m in medians.items()},
                                       {"bf16": 2.0, "fp8": 2.8, "exact": 2.4}]))
    record = {"machine_class": CLASS, "setting": {"git_sha": "abc1234def"},
              "flows": _medians({"bf16": 2.0, "fp8": 1.6})}
    console.print(bench.compare_table(medians, record))
    text = console.export_text()
    assert "1.60x  1.40x" in text and "1.50x" in text and "met (1 of 2 rounds)" in text
    assert "1.20x  1.20x" in text and "met (2 of 2 rounds)" in text
    assert "3.200 / 1.600 = 2.00x" in text and "SLOWER" in text and "abc1234" in text


def test_a_missing_or_stale_baseline_is_refused_before_anything_runs(tmp_path, monkeypatch,
                                                                     capsys):
    (tmp_path / "cpu-other.json").write_text(json.dumps({"schema_version": 0}))
    monkeypatch.setattr(bench_targets, "BASELINE_DIR", tmp_path)
    # fails fast: no flow is run (it would take minutes) before the baseline is looked up
    monkeypatch.setattr(bench, "step_split", lambda *a: pytest.fail("measured before refusing"))
    assert cli.main(["bench", "--compare", "tier=smoke"]) == 2
    err = capsys.readouterr().err
    assert "no bench baseline for machine class" in err and "classes with one: cpu-other" in err
    with pytest.raises(ValueError, match="schema_version 0, expected 1"):
        bench_targets.load_baseline(tmp_path, "cpu-other")
    # a baseline of another setting is refused, naming what differs
    record = {"setting": {"tier": "small", "threads": 1, "engine": "torch", "steps": 11}}
    bench_targets.check_setting(record, dict(record["setting"], git_sha="x"))
    with pytest.raises(ValueError, match=r"tier='smoke' \(baseline 'small'\), threads=2"):
        bench_targets.check_setting(record, dict(record["setting"], tier="smoke", threads=2))


def test_the_docs_state_the_targets_the_code_holds():
    from pathlib import Path

    text = (Path(__file__).resolve().parents[1] / "docs" / "speed.md").read_text()
    stated = {}
    for line in text.splitlines():
        cells = [c.strip() for c in line.strip("|").split("|")]
        if len(cells) == 3 and cells[0].startswith("`") and cells[1].endswith("x"):
            stated[cells[0].strip("`")] = float(cells[1][:-1])
    assert stated == bench_targets.TARGETS
    assert f"at least {bench_targets.TRL_SPEEDUP:g}x faster than TRL" in " ".join(text.split())
    assert f"more than {bench_targets.NOISE:.2f}x the baseline" in " ".join(text.split())
