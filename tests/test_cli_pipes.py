"""A command's printout is not its result: `suite run ... | head` finishes and records its run, and
`suite table` reads the folder `suite run out=OUT` wrote."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_a_run_piped_into_head_is_recorded_as_the_run_it_was(tmp_path, suite_cache):
    env = {**os.environ, "PYTHONPATH": str(ROOT), "SUITE_CACHE": suite_cache}
    cmd = f"{sys.executable} -m suite run tier=smoke steps=3 out={tmp_path} 2>/dev/null | head -1"
    p = subprocess.run(["bash", "-c", f"set -o pipefail; {cmd}"], env=env, capture_output=True,
                       text=True, timeout=900)
    assert p.returncode == 0 and p.stdout.startswith("step    1"), p.stdout + p.stderr
    summary = json.loads(next(tmp_path.rglob("summary.json")).read_text())
    assert (summary["error"] is None and summary["steps_done"] == 3
            and summary["verdict"] != "incomplete")

    table = subprocess.run([sys.executable, "-m", "suite", "table", str(tmp_path)], env=env,
                           capture_output=True, text=True, timeout=300)
    assert (table.returncode == 0
            and "arith__grpo__fp32__s0" in table.stdout), table.stdout + table.stderr
    empty = subprocess.run([sys.executable, "-m", "suite", "table",
                            str(tmp_path / "default" / "arith__grpo__fp32__s0")],
                           env=env, capture_output=True, text=True, timeout=300)
    assert empty.returncode != 0 and "no run in it" in empty.stderr + empty.stdout


def test_after_the_main_job_other_commands_reuse_its_policies(tmp_path, monkeypatch):
    """scripts/main.sh caches in the checkout's .cache; `suite mismatch` right after must not build
    the policy again."""
    from suite.rl.policy import cache_root

    monkeypatch.delenv("SUITE_CACHE", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "user"))
    checkout = tmp_path / "checkout" / ".cache"
    assert cache_root(checkout) == tmp_path / "user" / "lowprec-rl-suite"  # no main job yet
    (checkout / "policies").mkdir(parents=True)
    assert cache_root(checkout) == checkout
    monkeypatch.setenv("SUITE_CACHE", str(tmp_path / "mine"))
    assert cache_root(checkout) == tmp_path / "mine"  # the user's word wins
