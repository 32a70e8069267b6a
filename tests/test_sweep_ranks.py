"""Sweeps whose cells each take several ranks (``nproc``/``nnodes``).

The local launcher packs cells by cores (a cell takes nproc x threads), Hydra's local launchers
start a cell's ranks through torchrun, and a submitit Slurm sweep becomes one job per cell with a
task and a GPU per rank. Everything here runs on this CPU (gloo); no GPU and no Slurm.
"""

import json
import os
import re
import signal
import subprocess
import sys
from types import SimpleNamespace

import process_tree
import pytest

from suite import dist
from suite.experiments import forkserver, local_launcher, sweep

SHARDED = pytest.mark.skipif(not dist.fsdp_sums(),
                             reason="sharded training needs torch >= 2.8 (FSDP2 sum reduction, "
                                    "pytorch#155915); refused before compute there "
                                    "(tests/test_torch_floor.py)")


def _smoke(out, name, *extra):
    """The sanity grid cut down to fp32 x grpo at smoke size, two RL steps per cell."""
    return ["grid=sanity", "tier=smoke", "steps=2", f"out={out}", f"name={name}", "precision=fp32",
            "algorithm=grpo", *extra]


def _summary(run_dir):
    return json.loads((run_dir / "summary.json").read_text())


def _span(run_dir) -> tuple[float, float]:
    """When the sweep started and reaped the cell (the lines it writes to the cell's log.txt)."""
    text = (run_dir / "log.txt").read_text()
    start = re.findall(r"sweep: cell started at ([\d.]+)", text)
    end = re.findall(r"sweep: cell finished at ([\d.]+)", text)
    assert len(start) == 1 and len(end) == 1, text[-2000:]
    return float(start[0]), float(end[0])


def _cell(nproc, threads=1, nnodes=1):
    return SimpleNamespace(cfg=SimpleNamespace(nproc=nproc, threads=threads, nnodes=nnodes))


def test_capacity_counts_cores_and_a_cell_wider_than_it_runs_alone():
    two, four, one = _cell(2), _cell(4), _cell(1)
    assert local_launcher.capacity([two, one], jobs=2) == 2
    # jobs x the largest threads
    assert local_launcher.capacity([_cell(1, threads=3), one], jobs=2) == 6
    assert local_launcher.capacity([two], jobs=None) == (os.cpu_count() or 1)
    assert local_launcher.cores(_cell(2, threads=3)) == 6
    assert local_launcher.next_fit([two, two], in_use=0, cap=2) == 0
    # a second 2-rank cell waits
    assert local_launcher.next_fit([two], in_use=2, cap=2) is None
    # first fit: the 1-rank cell starts
    assert local_launcher.next_fit([two, one], in_use=1, cap=2) == 1
    # wider than the capacity: alone ...
    assert local_launcher.next_fit([four], in_use=0, cap=2) == 0
    # ... and nothing beside it
    assert local_launcher.next_fit([four, one], in_use=4, cap=2) is None


@SHARDED
def test_local_launcher_runs_two_2_rank_cells_one_after_the_other(tmp_path, capsys):
    out = tmp_path / "out"
    assert sweep.main(_smoke(out, "ranks", "seed=0,1", "nproc=2", "launcher=local", "jobs=2")) == 0
    dirs = [out / "ranks" / f"arith__grpo__fp32__s{i}" for i in (0, 1)]
    (s0, e0), (s1, e1) = sorted(_span(d) for d in dirs)
    assert e0 <= s1, ((s0, e0), (s1, e1))  # capacity 2 cores, 2 cores each: never side by side
    for d in dirs:
        assert _summary(d)["verdict"] != "incomplete"
        assert json.loads((d / "env.json").read_text())["world"]["world_size"] == 2
    printed = capsys.readouterr().out
    assert ("capacity 2 cores" in printed and "1 queued" in printed
            and "running arith__grpo__fp32__s" in printed)


@SHARDED
def test_basic_launcher_starts_a_cells_ranks_with_torchrun_and_records_a_failed_one(
    tmp_path, monkeypatch, capfd):
    real = dist.launch
    calls = []

    def launch(argv, nproc, nnodes):  # seed 0: torchrun "killed" before any rank wrote a thing
        calls.append((argv, nproc, nnodes))
        return 9 if "seed=0" in argv else real(argv, nproc, nnodes)

    monkeypatch.setattr(dist, "launch", launch)
    out = tmp_path / "out"
    # Hydra's basic launcher, in this process
    assert sweep.main(_smoke(out, "hyd", "seed=0,1", "nproc=2")) == 1
    bad, good = out / "hyd" / "arith__grpo__fp32__s0", out / "hyd" / "arith__grpo__fp32__s1"
    assert [c[0][0] for c in calls] == ["run", "run"] and all(c[1:] == (2, 1) for c in calls)
    s = _summary(bad)
    assert s["verdict"] == "incomplete" and s["error"] == "process exited with code 9"
    assert _summary(good)["verdict"] != "incomplete"  # ran after the failure
    world = json.loads((good / "env.json").read_text())["world"]
    assert world["world_size"] == 2 and world["launcher"] == "torchrun"
    # the ranks' output is in the cell's log ...
    assert "step    2" in (good / "log.txt").read_text()
    printed = capfd.readouterr().out
    assert "step    2" not in printed  # ... not on the sweep's terminal
    assert f"FAILED {bad}: process exited with code 9" in printed


@SHARDED
@pytest.mark.parametrize("launcher", ["launcher=local", "hydra/launcher=basic"])
def test_a_killed_sweep_leaves_no_rank_of_its_cells(tmp_path, launcher):
    """`suite sweep` SIGKILLed while a 2-rank cell trains: local (the sweep -> the cell's `suite
    run` -> torchrun's agent -> the ranks) and Hydra's basic launcher (the sweep runs the cell and
    starts the agent itself). Every process below the sweep is gone within dist.ORPHAN_TIMEOUT_S
    (from the watchdog period and the agent's shutdown grace, not from this machine's speed)."""
    out, log = tmp_path / "out", tmp_path / "log.txt"
    args = ["grid=sanity", "tier=smoke", "steps=1000", f"out={out}", "name=k", "precision=fp32",
            # 1000 steps: minutes, so nothing ends by itself
            "algorithm=grpo", "seed=0", "nproc=2", launcher]
    metrics = out / "k" / "arith__grpo__fp32__s0" / "metrics.jsonl"
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    with log.open("w") as f:
        swept = subprocess.Popen([sys.executable, "-m", "suite.cli", "sweep", *args], env=env,
                                 stdout=f, stderr=subprocess.STDOUT, start_new_session=True)
    procs = {}
    try:
        process_tree.first_step(metrics, swept, log)
        ranks = [process_tree.with_env(swept.pid, "RANK", r) for r in (0, 1)]
        assert None not in ranks, (ranks, log.read_text()[-3000:])
        procs = process_tree.tree(swept.pid)  # the cell's process (local), the agent, the ranks
        assert len(procs) >= (4 if launcher == "launcher=local" else 3), procs
        os.kill(swept.pid, signal.SIGKILL)
        process_tree.gone_after(procs, dist.ORPHAN_TIMEOUT_S)
    finally:
        process_tree.kill_all(procs)
        if swept.poll() is None:
            swept.kill()
        swept.wait()


@SHARDED
@pytest.mark.parametrize("extra, words", [
    (["nproc=2", "nnodes=2", "launcher=local"],
     ["nnodes", "arith__grpo__fp32__s0", "launcher local"]),
    (["nproc=2", "nnodes=2"], ["nnodes", "launcher basic", "submitit_slurm"]),
    (["nproc=2", "launcher=local", "jobs=0"], ["jobs", ">= 1"]),
    (["nproc=1,2", "name=r${nproc}", "hydra/launcher=submitit_slurm"],
     ["nproc", "nproc=1", "nproc=2", "one job shape"]),
    (["nproc=2", "hydra/launcher=submitit_slurm", "hydra.launcher.tasks_per_node=4"],
     ["hydra.launcher.tasks_per_node", "4 given", "need 2"]),
    (["nproc=2", "hydra/launcher=submitit_local", "hydra.launcher.tasks_per_node=2"],
     ["hydra.launcher.tasks_per_node", "need 1"]),
], ids=["local-nnodes", "basic-nnodes", "jobs", "slurm-mixed-nproc", "slurm-tasks", "local-tasks"])
def test_ranks_a_launcher_cannot_start_are_refused_before_compute(tmp_path, extra, words):
    if any("submitit" in e for e in extra):
        pytest.importorskip("hydra_plugins.hydra_submitit_launcher")
    with pytest.raises(ValueError) as err:
        sweep.main(_smoke(tmp_path, "no", "seed=0", *extra))
    msg = str(err.value)
    assert "\n" not in msg and all(w in msg for w in words), msg
    assert not any(tmp_path.iterdir())


@SHARDED
def test_slurm_dry_run_asks_for_a_task_and_a_gpu_per_rank(tmp_path, capsys):
    pytest.importorskip("hydra_plugins.hydra_submitit_launcher")
    out = tmp_path / "out"
    # The documented command for the published sanity test (docs/sweeps.md), planned on this
    # CPU-only machine.
    base = ["grid=sanity-r1d", "engine=torch", f"out={out}", "hydra/launcher=submitit_slurm",
            "hydra.launcher.partition=gpu", "hydra.launcher.timeout_min=720", "dry_run=true"]
    assert sweep.main([*base, "nproc=8"]) == 0
    text = capsys.readouterr().out
    for line in ("#SBATCH --ntasks-per-node=8", "#SBATCH --gpus-per-node=8", "#SBATCH --nodes=1",
                 "#SBATCH --array=0-5%6", "#SBATCH --partition=gpu", "#SBATCH --time=720"):
        assert line in text, line
    # a dead rank ends the step
    assert "srun --unbuffered" in text and " --kill-on-bad-exit=1 " in text
    assert sweep.main([*base, "nproc=8", "nnodes=2"]) == 0
    text = capsys.readouterr().out
    assert "#SBATCH --nodes=2" in text and "#SBATCH --ntasks-per-node=8" in text
    # GPUs asked for another way replace the default; a CPU partition asks for none.
    assert sweep.main([*base, "nproc=8", "hydra.launcher.gres=gpu:a100:8"]) == 0
    text = capsys.readouterr().out
    assert "#SBATCH --gres=gpu:a100:8" in text and "--gpus-per-node" not in text
    assert sweep.main([*base, "nproc=8", "hydra.launcher.gpus_per_node=null"]) == 0
    assert "--gpus-per-node" not in capsys.readouterr().out
    # One rank per cell: the job is what it was (one task, the user's GPUs or none).
    assert sweep.main([*base]) == 0
    text = capsys.readouterr().out
    assert ("#SBATCH --ntasks-per-node=1" in text and "--gpus-per-node" not in text
            and "--kill-on-bad-exit" not in text)
    assert not out.exists()


def test_local_launcher_passes_the_users_hub_settings_to_every_cell(tmp_path, monkeypatch):
    """A connected machine that says HF_HUB_OFFLINE=0 gets it in every cell (real tasks download
    there); the suite does not force offline mode on a sweep."""
    seen = []

    class Done:
        returncode = 0

        def __init__(self, cmd, env, **kw):
            seen.append(env)

        def poll(self):
            return 0

    monkeypatch.setenv("HF_HUB_OFFLINE", "0")
    monkeypatch.delenv("HF_DATASETS_OFFLINE", raising=False)
    # the cell's own process, the one this fake Popen stands for (not a fork server's cell)
    monkeypatch.setenv(forkserver.OPT_OUT, "0")
    monkeypatch.setattr(local_launcher.subprocess, "Popen", Done)
    monkeypatch.setattr(local_launcher.time, "sleep", lambda s: None)
    from suite.rl import config

    cell = sweep.Cell(["tier=smoke"], config.load(["tier=smoke", f"out={tmp_path}"]))
    local_launcher.launch_local([cell], jobs=1, console=local_launcher.Console(quiet=True))
    assert seen and seen[0]["HF_HUB_OFFLINE"] == "0" and "HF_DATASETS_OFFLINE" not in seen[0]


@SHARDED
def test_local_launcher_on_gpus_gives_each_cell_gpus_of_its_own(tmp_path, monkeypatch):
    """With CUDA GPUs a cell takes nproc GPUs as CUDA_VISIBLE_DEVICES: cells never share a GPU, a
    2-rank cell waits for two free ones, and a cell wider than the machine is refused before any
    cell starts."""
    # the GPUs of the processes alive now; (cell, its GPUs, the GPUs held by the others)
    live, log = [], []

    class Proc:
        def __init__(self, cmd, env, **kw):
            self.gpus, self.polls, self.returncode = env["CUDA_VISIBLE_DEVICES"].split(","), 0, None
            log.append((cmd[cmd.index("run") + 1:], self.gpus, [g for p in live for g in p.gpus]))
            live.append(self)

        def poll(self):  # each process lives for three polls of the launcher
            self.polls += 1
            if self.polls == 3:
                self.returncode = 0
                live.remove(self)
            return self.returncode

    monkeypatch.setattr(local_launcher.subprocess, "Popen", Proc)
    monkeypatch.setattr(local_launcher.time, "sleep", lambda s: None)
    from suite.rl import config

    def cell(seed, nproc):
        ov = ["tier=smoke", f"seed={seed}", f"nproc={nproc}", f"out={tmp_path}"]
        return sweep.Cell(ov, config.load(ov))

    cells = [cell(0, 1), cell(1, 2), cell(2, 1), cell(3, 1)]
    quiet = local_launcher.Console(quiet=True)
    codes = local_launcher.launch_local(cells, jobs=None, console=quiet, gpus=["0", "1"])
    assert sorted(codes.values()) == [0, 0, 0, 0] and len(log) == 4
    for overrides, mine, others in log:
        assert (len(mine) == int(overrides[2].split("=")[1])
                and not set(mine) & set(others)), (overrides, mine, others)
    assert max(len(others) for _, _, others in log) == 1  # two 1-rank cells did run side by side
    with pytest.raises(ValueError, match=r"nproc=2, but this machine has 1 GPU\(s\)"):
        local_launcher.launch_local(cells, jobs=None, console=quiet, gpus=["0"])
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "2,3")
    assert local_launcher.visible_gpus() == ["2", "3"]
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    assert local_launcher.visible_gpus() == []
