"""The local launcher's fork server (suite/experiments/forkserver.py): a CPU cell forked from an
already-imported process computes what its own ``suite run`` process computes, fails as it would,
and dies with the sweep."""

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import process_tree
import pytest
from rich.console import Console

from suite import dist
from suite.experiments import forkserver, sweep
from suite.rl import config

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"),
                                reason="the fork server runs on Linux only")
QUIET = Console(quiet=True)


def _cell(out, *extra):
    ov = ["tier=smoke", "steps=2", f"out={out}", "name=f", "precision=bf16", *extra]
    return sweep.Cell(ov, config.load(ov))


def _built(cell):
    from suite.rl.data import prepare_data

    prepare_data(cell.cfg, QUIET)  # the shared policy, built once (as `suite main` does)
    return cell


def _log(cell) -> str:
    return (cell.run_dir / "log.txt").read_text()


def _cells_of(pid: int) -> list[int]:
    """The fork server's children: the cells."""
    server = [p for p in process_tree.tree(pid) if process_tree.stat(p)[1] == pid
              and b"forkserver" in Path(f"/proc/{p}/cmdline").read_bytes()]
    return [p for p in process_tree.tree(server[0]) if process_tree.stat(p)[1] == server[0]]


def test_a_forked_cell_writes_the_bytes_of_its_own_process(tmp_path, monkeypatch):
    forked, own = _built(_cell(tmp_path / "fork")), _cell(tmp_path / "own")
    assert sweep.launch_local([forked], jobs=1, console=QUIET) == {str(forked.run_dir): 0}
    assert ", fork server)" in _log(forked) and "step    2" in _log(forked)
    monkeypatch.setenv(forkserver.OPT_OUT, "0")
    assert sweep.launch_local([own], jobs=1, console=QUIET) == {str(own.run_dir): 0}
    assert ", fork server)" not in _log(own)
    metrics = (forked.run_dir / "metrics.jsonl").read_bytes()
    assert metrics.count(b"\n") == 2 and metrics == (own.run_dir / "metrics.jsonl").read_bytes()


def test_a_failing_or_killed_forked_cell_gets_its_code_and_summary(tmp_path):
    """A cell failing inside `suite run` exits as that process would; one SIGKILLed mid-run reads
    -9, as Popen's returncode, and still gets an incomplete summary."""
    bad = _cell(tmp_path, "seed=1", f"policy.path={tmp_path / 'no-such-model'}")
    killed = _built(_cell(tmp_path, "seed=2", "steps=1000"))
    metrics = killed.run_dir / "metrics.jsonl"

    def kill_at_first_step():
        deadline = time.monotonic() + process_tree.HANG_GUARD_S
        while not (metrics.exists() and metrics.read_text().strip()):
            assert time.monotonic() < deadline
            time.sleep(0.05)
        log = str(killed.run_dir / "log.txt")
        for pid in _cells_of(os.getpid()):
            if os.readlink(f"/proc/{pid}/fd/1") == log:  # the cell's stdout is its log
                os.kill(pid, signal.SIGKILL)

    killer = threading.Thread(target=kill_at_first_step, daemon=True)
    killer.start()
    codes = sweep.launch_local([bad, killed], jobs=2, console=QUIET)
    killer.join()
    assert codes[str(bad.run_dir)] == 1 and codes[str(killed.run_dir)] == -signal.SIGKILL
    assert "no-such-model" in sweep.read_summary(bad)["error"]
    s = sweep.read_summary(killed)
    assert s["verdict"] == "incomplete" and s["error"] == "process exited with code -9"
    assert "finished at" in _log(killed) and "(exit code -9)" in _log(killed)


def test_a_killed_sweep_leaves_no_forked_cell(tmp_path):
    """`suite sweep launcher=local` SIGKILLed while a forked cell trains: the server (the kernel's
    parent-death signal, or the end of its pipe) and then the cell (tied to the server) are gone
    within dist.ORPHAN_TIMEOUT_S."""
    _built(_cell(tmp_path / "out", "precision=fp32"))
    out, log = tmp_path / "out", tmp_path / "log.txt"
    args = ["grid=sanity", "tier=smoke", "steps=1000", f"out={out}", "name=k", "precision=fp32",
            "algorithm=grpo", "seed=0", "launcher=local"]
    metrics = out / "k" / "arith__grpo__fp32__s0" / "metrics.jsonl"
    with log.open("w") as f:
        swept = subprocess.Popen([sys.executable, "-m", "suite.cli", "sweep", *args],
                                 env={**os.environ, "PYTHONUNBUFFERED": "1"}, stdout=f,
                                 stderr=subprocess.STDOUT, start_new_session=True)
    procs = {}
    try:
        process_tree.first_step(metrics, swept, log)
        assert _cells_of(swept.pid), log.read_text()[-3000:]
        procs = process_tree.tree(swept.pid)  # the server, the cell, anything the cell started
        os.kill(swept.pid, signal.SIGKILL)
        process_tree.gone_after(procs, dist.ORPHAN_TIMEOUT_S)
    finally:
        process_tree.kill_all(procs)
        if swept.poll() is None:
            swept.kill()
        swept.wait()


def test_prepare_runs_while_the_server_imports_and_its_failure_leaves_no_server(monkeypatch):
    """``start(..., prepare)`` runs the data build after starting the server's process and before
    waiting for it (so the server's imports overlap the build); without a server the build still
    runs; a build that raises takes the server down with it."""
    seen, order, ready = [], [], forkserver.Server.ready

    def prepare():  # {pid: start time} of the fork servers below this process
        order.append("prepare")
        seen.append({p: t for p, t in process_tree.tree(os.getpid()).items()
                     if b"forkserver" in Path(f"/proc/{p}/cmdline").read_bytes()})

    monkeypatch.setattr(forkserver.Server, "ready",
                        lambda self: (order.append("wait for the server"), ready(self)))
    server = forkserver.start(dict(os.environ), print, prepare)
    try:  # the server's process ran while the build did, and was waited for after it
        assert server is not None and list(seen[0]) == [server.pid]
        assert order == ["prepare", "wait for the server"]
    finally:
        server.close()

    monkeypatch.setenv(forkserver.OPT_OUT, "0")
    assert forkserver.start(dict(os.environ), print, prepare) is None and seen[1] == {}
    monkeypatch.delenv(forkserver.OPT_OUT)

    def broken():
        prepare()
        raise RuntimeError("no disk")

    with pytest.raises(RuntimeError, match="no disk"):
        forkserver.start(dict(os.environ), print, broken)
    assert len(seen[2]) == 1 and not process_tree.alive(seen[2])
