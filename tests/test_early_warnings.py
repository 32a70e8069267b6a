"""Early-warning signals (suite/analysis/early_warnings.py) on hand-built runs, and the table
docs/collapse.md quotes."""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path

from suite import packed
from suite.analysis import early_warnings as ew

ROOT = Path(__file__).resolve().parents[1]


def _rows(n=40, **series):
    rows = [{"step": s + 1, "reward/mean": 0.5, "train/grad_norm": 1.0, "entropy/mean": 0.2,
             "mismatch/chi2_token": 0.01, "mismatch/chi2_seq": 0.1} for s in range(n)]
    for key, values in series.items():
        for step, v in values.items():
            rows[step - 1][key] = v
    return rows


def test_each_signal_fires_at_its_first_step_and_not_before():
    assert all(fn(_rows()) is None for fn in ew.SIGNALS.values())  # a quiet run: nothing fires
    # 1/(1+1.01) < 1/2
    assert ew.SIGNALS["ess_seq"](_rows(**{"mismatch/chi2_seq": {7: 1.01, 9: 5.0}})) == 7
    # exactly 1/2: not below
    assert ew.SIGNALS["ess_seq"](_rows(**{"mismatch/chi2_seq": {7: 1.0}})) is None
    assert ew.SIGNALS["ess_token"](_rows(**{"mismatch/chi2_token": {3: math.inf}})) == 3
    # fewer than 10 steps of baseline
    assert ew.grad_norm(_rows(**{"train/grad_norm": {5: 100.0}})) is None
    assert ew.grad_norm(_rows(**{"train/grad_norm": {12: 3.01}})) == 12
    assert ew.grad_norm(_rows(**{"train/grad_norm": {12: 3.0}})) is None
    assert ew.grad_norm(_rows(**{"train/grad_norm": {4: math.nan}})) == 4
    assert ew.entropy(_rows(**{"entropy/mean": {20: 0.61}})) == 20


def test_the_onset_is_where_the_reward_falls_and_the_lead_counts_back_from_it(tmp_path):
    reward = {s: 0.9 for s in range(10, 21)} | {s: 0.5 for s in range(21, 41)}  # peak 0.9, then 0.5
    rows = _rows(**{"reward/mean": reward, "mismatch/chi2_seq": {15: 2.0}})
    # peak 0.9 (windows ending on steps 14-20); the window ending on step 23 holds 0.9 x 2 + 0.5 x 3
    # = 3.3 / 5 =
    # 0.66 > 0.9 - 0.25, the one ending on step 24 0.9 + 0.5 x 4 = 2.9 / 5 = 0.58: the onset
    assert ew.onset(rows) == 24
    run = tmp_path / "g" / "arith3__grpo__bf16__s0"
    run.mkdir(parents=True)
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (run / "summary.json").write_text(json.dumps({"verdict": "collapse"}))
    (run / "config.json").write_text("{}")
    got = ew.of_run(run)
    assert got["onset"] == 24 and got["fired"]["ess_seq"] == 15 and got["lead"]["ess_seq"] == 9
    t = ew.tally([tmp_path / "g"])
    assert t["signals"]["ess_seq"] == {"collapses": 1, "warned": 1, "median_lead": 9, "pass": 0,
                                       "fired_in_pass": 0, "unstable": 0, "fired_in_unstable": 0}
    # the same run committed elsewhere, its log stored compressed: one run, not two
    twin = tmp_path / "h" / run.name
    shutil.copytree(run, twin)
    name, data = packed.pack("metrics.jsonl", (twin / "metrics.jsonl").read_bytes())
    (twin / "metrics.jsonl").unlink()
    (twin / name).write_bytes(data)
    assert ew.tally([tmp_path / "g", tmp_path / "h"]) == t


def test_the_table_in_docs_is_what_the_committed_runs_give():
    roots = [p for p in sorted((ROOT / "results" / "reference").glob("*/*")) if p.is_dir()]
    table = ew.markdown(ew.tally(roots))
    assert table in (ROOT / "docs" / "collapse.md").read_text()


def test_the_reports_table_marks_each_signals_first_step_for_the_runs_that_did_not_pass():
    reward = {s: 0.9 for s in range(10, 21)} | {s: 0.5 for s in range(21, 41)}
    fell = _rows(**{"reward/mean": reward, "mismatch/chi2_seq": {15: 2.0},
                    "train/grad_norm": {30: 9.0}})
    # passed, yet its token ESS fell below 1/2 at step 5
    alarm = _rows(**{"mismatch/chi2_token": {5: 3.0}})
    # nothing failed
    assert ew.report_table([("ok", _rows(), "pass"), ("alarm", alarm, "pass")]) is None
    head, rows, caption = ew.report_table([("fell", fell, "collapse"), ("ok", _rows(), "pass"),
                                           ("alarm", alarm, "pass"),
                                           ("short", _rows(4), "too_short")])
    assert head[:3] == ["run", "verdict",
                        "collapse onset (step)"] and len(head) == 3 + len(ew.SIGNALS)
    # onset 24: the sequence ESS warned 9 steps ahead; the gradient spike at 30 came after it (no
    # lead)
    assert rows == [["fell", "collapse", "24", "-", "15 (9)", "30", "-"]]
    assert ("fired in the 2 passing run(s) too (false alarms): "
            "ess_token 1, ess_seq 0, grad_norm 0, entropy 0" in caption)
