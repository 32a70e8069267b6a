"""Cells of a sweep run side by side; a failing cell is recorded and never stops the others.

``suite sweep``: named grids expanded through Hydra, validated before compute, launched by
Hydra's launcher plugins (basic, joblib, submitit, ray) or our own local process launcher.
"""

import json
import os
import shutil
import subprocess
import sys
from dataclasses import replace

import pytest
from rich.console import Console

from suite.experiments import grids, sweep
from suite.experiments.cells import plan
from suite.rl import config


def test_plan_validates_every_cell_and_expands_axes(tmp_path):
    cells = plan(["tier=smoke", f"out={tmp_path}", "precision=bf16"],
                 {"precision": ["fp32", "fp16"], "seed": [0, 1]})
    assert [(c.cfg.precision, c.cfg.seed)
            for c in cells] == [("fp32", 0), ("fp32", 1), ("fp16", 0), ("fp16", 1)]
    assert all(c.cfg.tier == "smoke" for c in cells)


def test_failing_cell_is_isolated_and_rerun_runs_only_what_is_missing(tmp_path):
    base = ["tier=smoke", f"out={tmp_path}", "name=grid"]
    good = sweep.Cell(base + ["precision=fp32"], config.load(base + ["precision=fp32"]))
    # An impossible setting in one cell only: its model directory does not exist.
    bad_ov = base + ["precision=bf16", f"policy.path={tmp_path / 'no-such-model'}"]
    bad = sweep.Cell(bad_ov, config.load(bad_ov))
    from suite.rl.data import prepare_data
    # the shared policy, built once (as `suite main` does)
    prepare_data(good.cfg, Console(quiet=True))
    codes = sweep.launch_local([good, bad], jobs=2, console=Console(quiet=True))
    assert codes[str(good.run_dir)] == 0 and codes[str(bad.run_dir)] != 0
    assert sweep.read_summary(good)["verdict"] != "incomplete"
    s = sweep.read_summary(bad)
    assert s["verdict"] == "incomplete" and "no-such-model" in s["error"]
    assert "FileNotFoundError" in (bad.run_dir / "error.txt").read_text()
    # Second invocation: the finished cell is skipped (its metrics untouched), the failed one
    # retried.
    before = (good.run_dir / "metrics.jsonl").stat().st_mtime_ns
    codes = sweep.launch_local([good, bad], jobs=2, console=Console(quiet=True))
    assert (good.run_dir / "metrics.jsonl").stat().st_mtime_ns == before
    assert "already complete" in (good.run_dir / "log.txt").read_text()
    assert codes[str(bad.run_dir)] != 0
    assert json.loads((bad.run_dir / "summary.json").read_text())["verdict"] == "incomplete"


# ---- suite sweep: named grids expanded and launched through Hydra ------------------------------
def _smoke(out, name, *extra):
    """A smoke-tier sweep of the sanity grid cut down to fp32 x grpo (the seeds come from
    ``extra``)."""
    return ["grid=sanity", "tier=smoke", f"out={out}", f"name={name}", "precision=fp32",
            "algorithm=grpo", *extra]


def _summary(run_dir):
    return json.loads((run_dir / "summary.json").read_text())


def test_sanity_grid_is_every_flow_times_three_algorithms_and_a_seed_sweep_doubles_it(tmp_path):
    from suite.numerics.precision import main_flows

    FLOWS = main_flows()  # the controls of the mechanism studies are not in the main grids
    cells = sweep.plan_grid(["grid=sanity", f"out={tmp_path}"]).cells
    assert len(cells) == len(FLOWS) * 3
    assert {c.cfg.precision for c in cells} == set(FLOWS)
    assert {c.cfg.algorithm for c in cells} == {"grpo", "grpo_token_tis", "pg_seq_is"}
    assert {c.cfg.seed for c in cells} == {0} and all(c.cfg.name == "sanity" for c in cells)
    doubled = sweep.plan_grid(["grid=sanity", f"out={tmp_path}", "seed=0,1", "tier=smoke"]).cells
    assert len(doubled) == 2 * len(FLOWS) * 3
    assert {c.cfg.seed for c in doubled} == {0, 1} and all(c.cfg.tier == "smoke" for c in doubled)
    assert not any(tmp_path.iterdir())  # planning writes nothing


def test_grids_read_flows_and_algorithms_when_looked_up(monkeypatch):
    from suite.numerics import precision
    from suite.rl import algos

    monkeypatch.setitem(precision.FLOWS, "fp8_later",
                        replace(precision.FLOWS["bf16"], name="fp8_later"))
    assert "fp8_later" in grids.get("sanity")["axes"]["precision"]
    assert grids.get("precision-ablation")["axes"] == {"precision": precision.main_flows(),
                                                       "algorithm": ["grpo"], "seed": [0, 1, 2]}
    fp8 = grids.get("fp8")["axes"]
    assert set(fp8["precision"]) == {f for f in precision.FLOWS if "fp8" in f} | {"bf16", "fp32"}
    assert fp8["algorithm"] == ["grpo", "grpo_token_tis"] and fp8["seed"] == [0, 1, 2]
    full = grids.get("sanity-full")
    assert full["overrides"] == ["steps=200"] and full["axes"]["seed"] == [0, 1, 2]
    assert grids.get("algorithms")["axes"] == {"algorithm": list(algos.ALGORITHMS),
                                               "precision": ["bf16", "fp16"], "seed": [0, 1]}


def test_unknown_grid_answers_with_did_you_mean(tmp_path):
    with pytest.raises(ValueError, match="(?i)did you mean 'sanity'"):
        sweep.main(["grid=sanityy", f"out={tmp_path}"])


@pytest.mark.parametrize("bad, words", [
    # one bad value in one axis
    (["precision=fp32,bf17"], ["precision", "bf17"]),
    (["precision=fp32", "seed=0,-1"], ["seed", ">= 0"]),
    # two cells, one directory
    (["precision=fp32", "optim.lr=1e-4,3e-5"], ["share the run directory"]),
    # an unknown launcher
    (["precision=fp32", "hydra/launcher=joblb"], ["hydra/launcher", "joblb"]),
], ids=["precision", "seed", "same-dir", "launcher"])
def test_bad_input_is_refused_before_any_job_runs(tmp_path, bad, words):
    with pytest.raises(ValueError) as err:
        sweep.main(["grid=sanity", "tier=smoke", f"out={tmp_path}", "algorithm=grpo", *bad])
    assert all(w in str(err.value) for w in words), str(err.value)
    assert not any(tmp_path.iterdir())  # no run directory, no Hydra output


def test_hydra_sweep_records_a_crash_goes_on_and_a_rerun_runs_only_what_is_missing(
    tmp_path, monkeypatch, capsys):
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    monkeypatch.chdir(cwd)
    out = tmp_path / "out"
    # default launcher: Hydra's basic (sequential, in this process)
    args = _smoke(out, "iso", "seed=0,1")
    bad, good = out / "iso" / "arith__grpo__fp32__s0", out / "iso" / "arith__grpo__fp32__s1"
    # The first cell only: a checkpoint that fails its checksum. Valid config, fails at run time.
    (bad / "ckpt").mkdir(parents=True)
    (bad / "ckpt" / "latest.json").write_text(json.dumps({"step": 2, "file": "step_000002.pt",
                                                          "sha256": "0" * 64}))

    assert sweep.main(args) == 1
    assert _summary(good)["verdict"] != "incomplete"  # ran after the crash
    origins = json.loads((good / "config.json").read_text())["config_origins"]  # suite/rl/layers.py
    assert origins["seed"] == "command line" and origins["steps"] == "tier smoke"
    s = _summary(bad)
    assert s["verdict"] == "incomplete" and "CorruptCheckpoint" in s["error"]
    assert "Traceback" in (bad / "error.txt").read_text()
    printed = capsys.readouterr().out
    assert f"FAILED {bad}: CorruptCheckpoint" in printed and "outcomes in" in printed
    # Hydra's own files live under <out>/<name>/.hydra/<time>/, one job directory per cell; no
    # chdir.
    (first,) = (out / "iso" / ".hydra").iterdir()
    assert (first / "multirun.yaml").exists()
    assert {p.name for p in first.iterdir() if p.is_dir()} == {bad.name, good.name}
    assert list(cwd.iterdir()) == []

    # The cause removed, the same command again: the complete cell is skipped, only the other runs.
    shutil.rmtree(bad / "ckpt")
    before = (good / "metrics.jsonl").stat().st_mtime_ns
    assert sweep.main(args) == 0
    assert (good / "metrics.jsonl").stat().st_mtime_ns == before
    assert _summary(bad)["verdict"] != "incomplete"
    (second,) = [p for p in (out / "iso" / ".hydra").iterdir() if p != first]
    assert {p.name for p in second.iterdir() if p.is_dir()} == {bad.name}
    # A directory that holds another config is refused before anything runs.
    with pytest.raises(ValueError, match="optim.lr"):
        sweep.main(args + ["optim.lr=3e-5"])


@pytest.mark.parametrize("launcher",
                         [["launcher=local", "jobs=2"],
                          ["hydra/launcher=joblib", "hydra.launcher.n_jobs=2"]],
                         ids=["local", "joblib"])
def test_local_parallel_launchers_run_cells_at_the_same_time(tmp_path, launcher):
    if "joblib" in launcher[0]:
        pytest.importorskip("hydra_plugins.hydra_joblib_launcher")
    out = tmp_path / "out"
    assert sweep.main(_smoke(out, "par", "seed=0,1", *launcher)) == 0
    dirs = [out / "par" / f"arith__grpo__fp32__s{i}" for i in (0, 1)]
    # Each run writes config.json when it claims its directory and summary.json when it ends:
    # both started before either ended, so they overlapped.
    starts = [(d / "config.json").stat().st_mtime for d in dirs]
    ends = [(d / "summary.json").stat().st_mtime for d in dirs]
    assert max(starts) < min(ends), (starts, ends)
    assert all(_summary(d)["verdict"] != "incomplete" for d in dirs)


def test_submitit_local_launcher_runs_a_cell(tmp_path):
    pytest.importorskip("hydra_plugins.hydra_submitit_launcher")
    out = tmp_path / "out"
    args = _smoke(out, "sub", "seed=0", "hydra/launcher=submitit_local",
                  "hydra.launcher.timeout_min=10")
    assert sweep.main(args) == 0
    assert _summary(out / "sub" / "arith__grpo__fp32__s0")["verdict"] != "incomplete"
    # it went through submitit
    assert list((out / "sub" / ".hydra").glob("*/.submitit/*/*_result.pkl"))


def test_slurm_dry_run_prints_the_sbatch_job_and_submits_nothing(tmp_path, capsys):
    pytest.importorskip("hydra_plugins.hydra_submitit_launcher")
    out = tmp_path / "out"
    args = ["grid=sanity", "tier=smoke", f"out={out}", "precision=fp32,bf16", "algorithm=grpo",
            "seed=0,1,2", "hydra/launcher=submitit_slurm", "hydra.launcher.partition=gpu",
            "hydra.launcher.gpus_per_node=1", "hydra.launcher.timeout_min=240",
            "hydra.launcher.mem_gb=32", "dry_run=true"]
    assert sweep.main(args) == 0
    text = capsys.readouterr().out
    for line in ("#SBATCH --array=0-5%6", "#SBATCH --partition=gpu", "#SBATCH --gpus-per-node=1",
                 "#SBATCH --time=240", "#SBATCH --mem=32GB", "#SBATCH --job-name=suite_sanity"):
        assert line in text
    assert "-m submitit.core._submit" in text and f"{out / 'sanity' / '.hydra'}" in text
    assert not out.exists()
    one = sweep.sbatch_script({"submitit_folder": "f/%j", "timeout_min": 5, "partition": "p",
                               "mem_gb": None}, 1)
    assert "--array" not in one and "#SBATCH --time=5" in one


def test_ray_launcher_runs_a_cell(tmp_path):
    pytest.importorskip("hydra_plugins.hydra_ray_launcher")
    out = tmp_path / "out"
    # Its own process: a local Ray cluster lives as long as the process that started it.
    args = _smoke(out, "ray", "seed=0", "hydra/launcher=ray", "+hydra.launcher.ray.init.num_cpus=1",
                  "+hydra.launcher.ray.init.include_dashboard=false")
    env = {**os.environ, "RAY_USAGE_STATS_ENABLED": "0"}
    r = subprocess.run([sys.executable, "-m", "suite.experiments.sweep", *args], env=env,
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert _summary(out / "ray" / "arith__grpo__fp32__s0")["verdict"] != "incomplete"
