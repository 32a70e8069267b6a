"""Concurrent processes that find a cache entry missing build it once: the others wait for it."""

from __future__ import annotations

import os
import subprocess
import sys

from rich.console import Console

from suite.rl.policy import PolicySpec, _build_policy, building, cache_root, policy_key
from suite.tasks.registry import get_task

SPEC = dict(hidden=32, layers=1, heads=2, kv_heads=1, mlp=64, sft_batch=8, probe_prompts=8,
            eval_every=2, target_acc=0.0, build_threads=1)
CHILD = f"""
from suite.rl.policy import PolicySpec, ensure_policy
from suite.tasks.registry import get_task
print("checking", flush=True)
print(ensure_policy(PolicySpec(**{SPEC!r}), get_task("arith")), flush=True)
"""


def test_a_second_process_waits_for_the_build_and_reads_it(monkeypatch, tmp_path):
    monkeypatch.setenv("SUITE_CACHE", str(tmp_path))
    spec, task = PolicySpec(**SPEC), get_task("arith")
    out = cache_root() / "policies" / f"{task.name}-{policy_key(spec, task)}"
    with building(out, "build.json") as todo:
        assert todo
        child = subprocess.Popen([sys.executable, "-c", CHILD], stdout=subprocess.PIPE,
                                 stderr=subprocess.STDOUT, text=True, env=os.environ.copy())
        # the child has looked (no policy yet) and now waits for the lock this process holds
        assert child.stdout.readline().strip() == "checking"
        _build_policy(spec, task, out, Console(quiet=True))
        first = (out / "build.json").read_bytes()
    log = child.communicate(timeout=120)[0]
    assert child.returncode == 0, log
    assert "built policy" not in log  # it read this process's build instead of building again
    assert log.strip().splitlines()[-1] == str(out)
    assert (out / "build.json").read_bytes() == first
