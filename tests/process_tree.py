"""Processes of a run, read from /proc (Linux): which are there, and how long they outlive a kill;
and the environment the tests start them with.

Used by the lifetime tests (tests/test_dist.py, tests/test_sweep_ranks.py). A process is named by
its pid and its start time, so that a pid reused by the system is not taken for the process it once
was.
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path


def env() -> dict:
    """A test's subprocesses' environment, read when they start: after conftest's session fixture
    has pointed SUITE_CACHE at the test session's cache (read at import, it would send them to the
    user's cache, where a fresh machine builds the smoke policies a second time)."""
    return {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1",
            "PYTHONUNBUFFERED": "1"}


HANG_GUARD_S = 1800
"""How long a test waits for a run to reach its first step (building the smoke policy included): a
guard against a hang on a slow, shared machine, not a bound anything is held to."""


def first_step(metrics: Path, starter, log: Path) -> None:
    """Wait until the run has logged a step (its ranks are past dist.init, inside their
    collectives); fail with the log's tail if the process ``starter`` (a Popen) ends before."""
    deadline = time.monotonic() + HANG_GUARD_S
    while not (metrics.exists() and metrics.read_text().strip()):
        assert starter.poll() is None and time.monotonic() < deadline, log.read_text()[-3000:]
        time.sleep(0.05)


def stat(pid: int) -> tuple[str, int, int] | None:
    """(state, parent pid, start time) of a process, None once it is gone."""
    try:
        fields = (Path("/proc") / str(pid) / "stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    return fields[0], int(fields[1]), int(fields[19])


def descends(pid: int, ancestor: int) -> bool:
    while pid > 1:
        if pid == ancestor:
            return True
        s = stat(pid)
        if s is None:
            return False
        pid = s[1]
    return False


def tree(root: int) -> dict[int, int]:
    """{pid: start time} of every live process below ``root`` (not ``root`` itself)."""
    out = {}
    for d in Path("/proc").iterdir():
        if d.name.isdigit() and int(d.name) != root and (s := stat(int(d.name))) and descends(
            s[1], root):
            out[int(d.name)] = s[2]
    return out


def with_env(root: int, var: str, value) -> int | None:
    """The pid of the process below ``root`` whose environment has ``var=value`` (RANK=1,
    SLURM_PROCID=0)."""
    for pid in tree(root):
        try:
            environ = (Path("/proc") / str(pid) / "environ").read_bytes().split(b"\0")
            if f"{var}={value}".encode() in environ:
                return pid
        except OSError:
            continue
    return None


def alive(procs: dict[int, int]) -> list[int]:
    """Those of {pid: start time} still running (a zombie is dead; a reused pid has another start
    time)."""
    return [pid for pid, start in procs.items() if (s := stat(pid)) is not None and s[0] != "Z"
            and s[2] == start]


def gone_after(procs: dict[int, int], bound_s: float) -> float:
    """Seconds until none of ``procs`` runs; fails if that is more than ``bound_s`` (then kills what
    is left)."""
    t0 = time.monotonic()
    while (left := alive(procs)) and time.monotonic() - t0 < bound_s:
        time.sleep(0.05)
    took = time.monotonic() - t0
    kill_all(procs)
    assert not left, (f"{left} of {sorted(procs)} still alive {took:.1f} s after the kill "
                      f"(bound {bound_s} s)")
    print(f"all {len(procs)} processes gone {took:.2f} s after the kill (bound {bound_s} s)")
    return took


def kill_all(procs: dict[int, int]) -> None:
    """Clean-up after a failed test: SIGKILL whatever of ``procs`` still runs."""
    for pid in alive(procs):
        os.kill(pid, signal.SIGKILL)
