"""Cells of a sweep run side by side; a failing cell is recorded and never stops the others."""

import json

from rich.console import Console

from suite import config, sweep


def test_plan_validates_every_cell_and_expands_axes(tmp_path):
    cells = sweep.plan(["tier=smoke", f"out={tmp_path}", "precision=bf16"], {"precision": ["fp32", "fp16"], "seed": [0, 1]})
    assert [(c.cfg.precision, c.cfg.seed) for c in cells] == [("fp32", 0), ("fp32", 1), ("fp16", 0), ("fp16", 1)]
    assert all(c.cfg.tier == "smoke" for c in cells)


def test_failing_cell_is_isolated_and_rerun_runs_only_what_is_missing(tmp_path):
    base = ["tier=smoke", f"out={tmp_path}", "name=grid"]
    good = sweep.Cell(base + ["precision=fp32"], config.load(base + ["precision=fp32"]))
    # An impossible setting in one cell only: its model directory does not exist.
    bad_ov = base + ["precision=bf16", f"policy.path={tmp_path / 'no-such-model'}"]
    bad = sweep.Cell(bad_ov, config.load(bad_ov))
    from suite.train import prepare_data
    prepare_data(good.cfg, Console(quiet=True))  # the shared policy, built once (as `suite main` does)
    codes = sweep.launch_local([good, bad], jobs=2, console=Console(quiet=True))
    assert codes[str(good.run_dir)] == 0 and codes[str(bad.run_dir)] != 0
    assert sweep.read_summary(good)["verdict"] != "incomplete"
    s = sweep.read_summary(bad)
    assert s["verdict"] == "incomplete" and "no-such-model" in s["error"]
    assert "FileNotFoundError" in (bad.run_dir / "error.txt").read_text()
    # Second invocation: the finished cell is skipped (its metrics untouched), the failed one retried.
    before = (good.run_dir / "metrics.jsonl").stat().st_mtime_ns
    codes = sweep.launch_local([good, bad], jobs=2, console=Console(quiet=True))
    assert (good.run_dir / "metrics.jsonl").stat().st_mtime_ns == before
    assert "already complete" in (good.run_dir / "log.txt").read_text()
    assert codes[str(bad.run_dir)] != 0
    assert json.loads((bad.run_dir / "summary.json").read_text())["verdict"] == "incomplete"
