"""``suite submit``: a submission is checked with the leaderboard's own validators, written whole or
not at all, and checked again (``--check``, what CI runs) including for files edited after
submitting."""

from __future__ import annotations

import json

import pytest
from test_leaderboard import DEFAULT, RUN, copy_run, edit_json

from suite.analysis import leaderboard, submit


def test_a_valid_run_is_submitted_and_enters_the_board(tmp_path, capsys):
    run = copy_run(tmp_path / "elsewhere")  # a run directory outside the repository
    out = tmp_path / "submissions" / "alice"
    assert submit.cli([str(run), "--name", "alice", "--out", str(out)]) == 0
    assert "1 run(s) accepted" in capsys.readouterr().out
    manifest = json.loads((out / submit.MANIFEST).read_text())
    assert manifest["name"] == "alice" and [r["run"] for r in manifest["runs"]] == [RUN]
    assert "metrics.jsonl" in manifest["runs"][0]["files"] and not (out / RUN / "ckpt").exists()
    assert submit.check(out) == []
    # the folder the CI workflow builds from
    leaderboard.build([tmp_path / "submissions"], tmp_path / "site")
    assert leaderboard.read_site_data(tmp_path / "site")["accepted"] == 1


def test_a_tampered_run_is_refused_with_the_reason_and_nothing_is_written(tmp_path, capsys):
    good = copy_run(tmp_path / "mine")
    bad = copy_run(tmp_path / "mine", "arith__grpo__bf16__s0")
    edit_json(bad / "summary.json", lambda s: s.update({"accuracy/final": 0.999}))
    out = tmp_path / "sub"
    assert submit.cli([str(tmp_path / "mine"), "--name", "mallory", "--out", str(out)]) == 1
    printed = capsys.readouterr().out
    assert (f"refused {bad}: summary.json: accuracy/final=0.999 "
            "but metrics.jsonl + timing.jsonl give" in printed)
    assert "nothing written" in printed and not out.exists() and good.is_dir()
    # no temp folder left
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []


def test_check_catches_an_edit_after_submitting(tmp_path, capsys):
    out = tmp_path / "sub"
    submit.submit([copy_run(tmp_path / "mine")], out, "bob")
    edit_json(out / RUN / "summary.json", lambda s: s.update({"accuracy/peak": 1.0}))
    problems = submit.check(out)
    assert any("changed since it was submitted: summary.json" in p for p in problems)
    assert any("accuracy/peak=1.0 but metrics.jsonl" in p for p in problems)
    assert submit.cli(["--check", str(out)]) == 1 and "refused" in capsys.readouterr().out
    (out / submit.MANIFEST).unlink()
    assert submit.check(out) == [f"{out}: no {submit.MANIFEST} (make submissions with `suite "
                                 "submit`)"]


def test_bad_arguments_are_errors_before_any_check(tmp_path):
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "x").write_text("keep")
    with pytest.raises(ValueError, match="not empty"):
        submit.submit([DEFAULT], tmp_path / "full", "eve")
    with pytest.raises(ValueError, match="--name"):
        submit.submit([DEFAULT], tmp_path / "new", " ")
    with pytest.raises(ValueError, match="RUN_DIR"):
        submit.cli(["--out", str(tmp_path / "o")])
