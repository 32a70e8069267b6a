"""The main job's controls and calibrated line: a known-bad recipe beside its corrections, judged by
what the committed evidence says it does, and a pass line chosen from the references alone.

A test that cannot fail a known-bad recipe is not a test: a control whose known-bad recipe passes
(planted here by writing its runs' verdicts) must make the main job's judgement name it, and the
line the main grid uses must be the one the calibration procedure gives from the committed
references."""

import json

import pytest

from suite.experiments import calibration, controls, grids, sweep
from suite.rl.config import TIERS


def _plant(root, verdicts: dict[tuple[str, str], list[str]]):
    """Run directories holding only a summary with the given verdicts, where the controls grid
    writes them."""
    for (name, role), vs in verdicts.items():
        for seed, v in enumerate(vs):
            d = root / name / role / f"arith3__grpo__fp32__s{seed}"
            d.mkdir(parents=True)
            (d / "summary.json").write_text(json.dumps({"verdict": v}))
            (d / "config.json").write_text("{}")


def _all(bad: list[str], fix: list[str], shown: list[str] | None = None) -> dict:
    """Verdicts per (control, row): ``bad`` for each known-bad recipe, ``fix`` for each judged fix,
    ``shown`` (default: ``fix``) for the corrections shown but not judged."""
    pick = {"fail": bad, "pass": fix, None: fix if shown is None else shown}
    return {(c.name, r.role): pick[r.expect] for c in controls.CONTROLS for r in c.rows}


def _count(expect):
    return sum(r.expect == expect for c in controls.CONTROLS for r in c.rows)


def test_controls_that_behave_are_counted_in_the_first_line(tmp_path):
    _plant(tmp_path,
           _all(["unstable", "collapse", "pass"], ["pass", "pass", "unstable"], ["collapse"] * 3))
    records = controls.judge(tmp_path)
    assert all(r["behaved"] is True for r in records)
    line = controls.first_line(records, ["pass", "pass", "pass"], "cpu-x")
    n, k, shown = len(controls.CONTROLS), _count("pass"), _count(None)
    # the committed table: what the sentence below is checked against
    assert n == 1 and k == 1 and shown == 2
    assert line == (f"sanity test on cpu-x: failed {n} of {n} known-bad recipes; passed {k} of {k} "
                    f"fixes and 3 of 3 reference runs (fp32); {shown} more corrections shown "
                    "beside them, not judged")
    # a shown correction that fails every seed is no misbehaviour
    assert controls.misbehaved(records) == []
    # 2 of 3 passes against 1 of 3: the one-sided Fisher exact p is 0.5 (hand count: 10 of 20
    # splits).
    assert records[0]["rows"][1]["fisher_p"] == pytest.approx(0.5)
    # 0 of 3 against 1 of 3: p = 1 (the fix cannot pass more often than that by chance alone any
    # less).
    assert records[0]["rows"][2]["fisher_p"] == pytest.approx(1.0)
    # the known-bad recipe is not compared with itself
    assert "fisher_p" not in records[0]["rows"][0]


def test_a_known_bad_recipe_that_passes_is_named(tmp_path):
    planted = _all(["unstable"] * 3, ["pass"] * 3)
    # e.g. staleness=0 on the command line
    planted[("stale-k4", "bad")] = ["pass", "pass", "unstable"]
    _plant(tmp_path, planted)
    records = controls.judge(tmp_path, ("staleness=0", "seed=0"))
    assert records[0]["what"].endswith("(as run: staleness=0 from the command line)")
    # no row of nvfp4a4-rollout sets staleness
    fp4 = controls.judge(tmp_path, ("staleness=0",), controls.CLASS_DEPENDENT)
    assert fp4[0]["what"] == controls.CLASS_DEPENDENT[0].what
    wrong = controls.misbehaved(records)
    assert wrong == ["stale-k4 (the known-bad recipe should fail in a majority of seeds; 2 of 3 "
                     "passed)"]
    assert "CONTROLS DID NOT BEHAVE: stale-k4" in controls.first_line(records, ["pass"], "cpu-x")
    head, rows = controls.table(records)
    assert rows[0][-1].startswith("NO: stale-k4") and rows[1][-1] == "yes"
    assert [r[2] for r in rows[:4]] == ["known-bad: plain GRPO", "fix: token TIS",
                                        "shown: sequence MIS", "shown: score centering"]
    assert rows[2][-1] == "not judged" and rows[2][5] == "(evidence splits)"


def test_a_fix_that_fails_is_named_and_a_short_run_judges_nothing(tmp_path):
    planted = _all(["unstable"] * 3, ["pass"] * 3)
    planted[("stale-k4", "fix")] = ["unstable", "pass", "collapse"]
    _plant(tmp_path / "a", planted)
    assert controls.misbehaved(controls.judge(tmp_path / "a")) == [
        "stale-k4 (token TIS should pass in a majority of seeds; 1 of 3 passed)"]
    # the class-dependent control is judged by the same rule where its grid ran
    _plant(tmp_path / "c", {("nvfp4a4-rollout", "bad"): ["pass"] * 3,
                            ("nvfp4a4-rollout", "fix"): ["pass"] * 3,
                            ("nvfp4a4-rollout", "qat"): ["unstable", "pass", "collapse"]})
    assert controls.misbehaved(controls.judge(tmp_path / "c", (), controls.CLASS_DEPENDENT)) == [
        "nvfp4a4-rollout (the known-bad recipe should fail in a majority of seeds; 3 of 3 passed)",
        "nvfp4a4-rollout (quantisation-aware flow (nvfp4a4) should pass in a majority of seeds; 1 "
        "of 3 passed)"]
    # a smoke run: no verdict, no catch
    _plant(tmp_path / "b", _all(["too_short"] * 3, ["too_short"] * 3))
    records = controls.judge(tmp_path / "b")
    assert all(r["behaved"] is None for r in records) and controls.misbehaved(records) == []
    assert "not judged: stale-k4 (" in controls.first_line(records, [], "cpu-x")


def test_main_and_controls_grids_cross_rows_with_three_seeds_and_the_command_line_wins(tmp_path):
    main = sweep.plan_grid(["grid=main", f"out={tmp_path}"]).cells
    assert {(c.cfg.precision, c.cfg.algorithm)
            for c in main} == {(f, "grpo") for f in grids.MAIN_FLOWS}
    assert {c.cfg.seed for c in main} == {0, 1, 2} and {c.cfg.threshold
                                                        for c in main} == {grids.EMBEDDED_LINE}
    ctl = sweep.plan_grid(["grid=controls", f"out={tmp_path}"]).cells
    assert len(ctl) == sum(len(c.rows) for c in controls.CONTROLS) * 3
    stale = [c for c in ctl if c.cfg.name.startswith("controls/stale-k4/")]
    assert {c.cfg.staleness for c in stale} == {4}
    assert {c.cfg.algorithm for c in stale} == {"grpo", "grpo_token_tis", "grpo_seq_mis"}
    centred = {c.cfg.name for c in ctl if c.cfg.algo.score_centering}
    assert centred == {"controls/stale-k4/centering"} and len({c.run_dir for c in ctl}) == len(ctl)
    fp4 = sweep.plan_grid(["grid=controls-4bit", f"out={tmp_path}"]).cells
    assert len(fp4) == 9 and {c.cfg.seed for c in fp4} == {0, 1, 2}
    assert {c.cfg.name for c in fp4 if c.cfg.algo.score_centering} == {
        "controls-4bit/nvfp4a4-rollout/fix"}
    qat = [c for c in fp4 if c.cfg.name == "controls-4bit/nvfp4a4-rollout/qat"]
    assert {c.cfg.precision for c in qat} == {"nvfp4a4"} and len(qat) == 3
    planted = sweep.plan_grid(["grid=controls", f"out={tmp_path}", "staleness=0", "seed=0"]).cells
    assert {c.cfg.staleness for c in planted} == {0} and {c.cfg.seed for c in planted} == {0}
    assert not any(tmp_path.iterdir())  # planning writes nothing


def test_the_main_grid_line_is_the_calibrated_one():
    cal = calibration.calibrate()
    assert cal["line"] == grids.EMBEDDED_LINE
    assert cal["budget"] == TIERS["small"]["steps"]  # the main job's budget: the small tier's steps
    chosen = next(t for t in cal["tried"]
                  if (t["budget"], t["line"]) == (cal["budget"], cal["line"]))
    assert chosen["passes"] == chosen["runs"] > 0 and chosen["margin_se"] >= calibration.K
    # The published line is at the references' ceiling: at 0.95 the lowest reference clears it by
    # under one error.
    at_95 = next(t for t in cal["tried"] if (t["budget"], t["line"]) == (cal["budget"], 0.95))
    assert at_95["margin_se"] < 1


def test_calibration_margin_against_a_hand_computation(tmp_path):
    rows = tuple({"step": s, "reward/mean": 0.96 if s > 50 else 0.5} for s in range(1, 101))
    runs = (("cls", "r", rows, 128),)
    t = calibration.judge(runs, 100, 0.9)
    # Peak 0.96 over a 5-step window of 128 samples: 0.06 x 640 = 38.4 samples; SE sqrt(0.9 x 0.1 /
    # 640).
    assert t["passes"] == 1 and t["margin_samples"] == pytest.approx(38.4)
    assert t["margin_se"] == pytest.approx(0.06 / (0.09 / 640) ** 0.5)


def test_every_control_behaves_in_its_committed_evidence_at_the_main_line():
    """The expectation is the evidence's: the committed runs, re-judged at the main job's line and
    budget, show the known-bad recipe passing in no seed and each judged fix in every one of three
    (a majority is what the main job then asks), and each correction shown unjudged splitting (else
    it would be judged)."""
    for c in (*controls.CONTROLS, *controls.CLASS_DEPENDENT):
        for r in c.rows:
            verdicts = [s["verdict"]
                        for s in controls.evidence(c, r, grids.EMBEDDED_LINE,
                                                   TIERS["small"]["steps"])]
            assert len(verdicts) >= 3, (c.name, r.role)
            if r.expect is None:
                assert 0 < verdicts.count("pass") < len(verdicts), (c.name, r.role, verdicts)
            elif r.expect == "pass":
                assert verdicts.count("pass") == len(verdicts), (c.name, r.role, verdicts)
            else:  # no seed passes; a majority fails outright (one NVFP4 seed ends at the line)
                assert "pass" not in verdicts and controls._behaved("fail", verdicts), (
                    c.name, r.role, verdicts)


def test_the_main_jobs_controls_bite_on_every_class_and_the_class_dependent_one_does_not():
    """Why the 4-bit control left the main job, from the committed runs: each main-job control's
    known-bad recipe fails in a majority of seeds on every class with a committed main job (no seed
    passes), while the class-dependent one fails on one class and passes on another."""
    from suite.results import REFERENCE_ROOT

    classes = [p.name for p in REFERENCE_ROOT.iterdir() if (p / "controls").is_dir()]
    assert len(classes) >= 2, classes
    for c in controls.CONTROLS:
        for cls in classes:
            bad = controls.judge(REFERENCE_ROOT / cls / "controls", controls=(c,))[0]["rows"][0]
            assert bad["runs"] >= 3 and bad["passes"] == 0 and bad["ok"] is True, (cls, bad)
    for c in controls.CLASS_DEPENDENT:
        bad = {cls: rows[0] for cls, rows in controls.by_class(c).items()}
        assert len(bad) >= 2, bad
        assert {r["ok"] for r in bad.values()} == {True, False}, bad
