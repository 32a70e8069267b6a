"""The package works outside the checkout: the wheel built from the repository carries its code and
data files, builds without warnings, and, installed in a fresh virtualenv in a temporary directory,
runs a smoke run from there. The user cache is the default cache."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import pytest
from packaging.requirements import Requirement

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> tuple[Path, str]:
    """The wheel of this checkout and pip's output while building it."""
    out, src = tmp_path_factory.mktemp("wheel"), tmp_path_factory.mktemp("source")
    # Built from a copy of the files git sees (tracked or new, not ignored): setuptools writes
    # build/ into the source tree, and a stale build/lib there would end up in the wheel.
    files = subprocess.run(["git", "ls-files", "-co", "--exclude-standard"], cwd=REPO,
                           capture_output=True, text=True, check=True).stdout.splitlines()
    for f in files:
        if (REPO / f).is_file():
            (src / f).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(REPO / f, src / f)
    # No build isolation: setuptools comes from the test environment, not from the network.
    proc = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps",
                           "--no-build-isolation", "-w", str(out), str(src)], capture_output=True,
                          text=True, cwd=out)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    (whl,) = out.glob("lowprec_rl_suite-*.whl")
    return whl, proc.stdout + proc.stderr


def test_the_wheel_builds_without_warnings_and_carries_every_file_the_checkout_tracks(wheel):
    whl, log = wheel
    assert "warning" not in log.lower(), log
    names = set(zipfile.ZipFile(whl).namelist())
    tracked = subprocess.run(["git", "ls-files", "suite"], cwd=REPO, capture_output=True, text=True,
                             check=True).stdout.split()
    missing = [f for f in tracked if f not in names and not f.endswith(".pyc")]
    assert not missing, f"files under suite/ the wheel lacks: {missing}"
    # The top-level tasks/ and recipes/ travel inside the package (setup.py), found there by
    # suite/locations.py.
    shipped = subprocess.run(["git", "ls-files", "-co", "--exclude-standard", "tasks", "recipes"],
                             cwd=REPO, capture_output=True, text=True, check=True).stdout.split()
    assert shipped and not [f for f in shipped if f"suite/_shipped/{f}" not in names]
    assert any(n.endswith(".dist-info/licenses/LICENSE") for n in names)
    meta = zipfile.ZipFile(whl).read(next(n for n in names
                                          if n.endswith(".dist-info/METADATA"))).decode()
    assert "License-Expression: Apache-2.0" in meta
    core = [Requirement(line.split(":", 1)[1].strip()) for line in meta.splitlines()
            if line.startswith("Requires-Dist:") and "extra ==" not in line]
    assert not [r.name for r in core
                if not r.specifier], "every core dependency has a version range"
    assert {"lm-eval", "math-verify", "datasets", "vllm", "trl"}.isdisjoint(r.name for r in core)


def test_a_wheel_installed_outside_the_checkout_runs_a_smoke_run(wheel, tmp_path, suite_cache):
    whl, _ = wheel
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env.update(SUITE_CACHE=suite_cache, HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1")
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    py = venv / "bin" / "python"
    site = Path(subprocess.run([py, "-c", "import sysconfig; "
                                          "print(sysconfig.get_paths()['purelib'])"],
                               capture_output=True, text=True, check=True, env=env).stdout.strip())
    subprocess.run([sys.executable, "-m", "pip", "--python", str(py), "install", "-q", "--no-deps",
                    "--no-index", str(whl)], check=True, capture_output=True, env=env)
    # The dependencies come from this environment (a .pth line adds its site-packages after the
    # venv's own; paths a .pth adds are not scanned for further .pth files, so the checkout's
    # editable install stays out).
    (site / "deps_from_test_env.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")

    proc = subprocess.run([py, "-c", "import suite; print(suite.__file__)"], capture_output=True,
                          text=True, cwd=tmp_path, env=env)
    assert proc.returncode == 0, proc.stderr
    where = proc.stdout.strip()
    assert Path(where).is_relative_to(venv), where
    # Every core requirement of the wheel is met by what the venv sees.
    check = ("import importlib.metadata as m; from packaging.requirements import Requirement as R; "
             "bad = [str(r) for r in map(R, m.requires('lowprec-rl-suite')) if r.marker is None "
             "and not r.specifier.contains(m.version(r.name), prereleases=True)]; print(bad); "
             "assert not bad")
    subprocess.run([py, "-c", check], check=True, cwd=tmp_path, env=env)

    # The suite's own tasks and recipes come from the wheel; references are looked for under the
    # current directory.
    check = ("from suite.tasks.registry import task_names, TASK_DIR; from suite.rl import recipe, "
             "config; from suite.results import REFERENCE_ROOT; import pathlib; "
             "assert TASK_DIR.parts[-2:] == ('_shipped', 'tasks') and 'arith3' in task_names(), "
             "TASK_DIR; assert config.load(['tier=smoke', 'recipe=dapo_loss']).algorithm == "
             "'dapo'; assert REFERENCE_ROOT == pathlib.Path.cwd() / 'results' / 'reference', "
             "REFERENCE_ROOT")
    subprocess.run([py, "-c", check], check=True, cwd=tmp_path, env=env)

    def installed_files() -> set[Path]:  # what pip put there; Python's own bytecode caches aside
        return {p for p in site.rglob("*") if p.is_file() and "__pycache__" not in p.parts}

    before = installed_files()
    suite_cmd = venv / "bin" / "suite"
    proc = subprocess.run([suite_cmd, "run", "tier=smoke", "steps=2", "out=runs"], cwd=tmp_path,
                          env=env, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    (run_dir,) = (tmp_path / "runs").glob("*/*__s0")
    for name in ("config.json", "metrics.jsonl", "timing.jsonl", "summary.json", "env.json"):
        assert (run_dir / name).is_file(), name
    assert len((run_dir / "metrics.jsonl").read_text().splitlines()) == 2

    # A task of the user's own, from a folder of theirs, listed and run by the installed suite
    # (docs/own_task.md).
    own = shutil.copytree(REPO / "examples" / "own_task", tmp_path / "my_tasks")
    proc = subprocess.run([suite_cmd, "ls", "tasks", "include_path=my_tasks"], cwd=tmp_path,
                          env=env, capture_output=True, text=True, check=True)
    assert f"[{own / 'my_letters.yaml'}]" in proc.stdout and "arith3" in proc.stdout, proc.stdout
    proc = subprocess.run([suite_cmd, "run", "task=my_letters", "include_path=my_tasks",
                           "tier=smoke", "steps=2", "out=runs"], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert (tmp_path / "runs" / "default" / "my_letters__grpo__fp32__s0" / "summary.json").is_file()

    # Without references the commands that read them say where to get them; a write into
    # site-packages is refused.
    proc = subprocess.run([suite_cmd, "grids"], cwd=tmp_path, env=env, capture_output=True,
                          text=True, check=True)
    assert ("SUITE_REFERENCE_ROOT=/path/to/clone/results/reference"
            in " ".join(proc.stdout.split())), proc.stdout
    proc = subprocess.run([suite_cmd, "fingerprint", "--write"], cwd=tmp_path, capture_output=True,
                          text=True,
                          env={**env, "SUITE_REFERENCE_ROOT": str(site / "results" / "reference")})
    assert (proc.returncode == 2
            and "is inside the installed packages" in proc.stderr), proc.stdout + proc.stderr
    assert installed_files() == before, sorted(map(str, installed_files() ^ before))


def test_the_cache_defaults_to_the_users_cache_directory(monkeypatch, tmp_path):
    from functools import partial

    from suite.rl import policy

    # a checkout in which the main job has not run (this one's .cache may hold its policies)
    cache_root = partial(policy.cache_root, tmp_path / "checkout" / ".cache")
    monkeypatch.delenv("SUITE_CACHE", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert cache_root() == tmp_path / "xdg" / "lowprec-rl-suite"
    monkeypatch.delenv("XDG_CACHE_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert cache_root() == tmp_path / "home" / ".cache" / "lowprec-rl-suite"
    monkeypatch.setenv("SUITE_CACHE", str(tmp_path / "mine"))
    assert cache_root() == tmp_path / "mine"


def test_a_feature_whose_extra_is_missing_is_refused_before_compute_naming_the_extra(monkeypatch):
    import importlib.util

    from suite.rl import config

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "lm_eval"
                        else real(name, *a))
    with pytest.raises(ValueError, match=r"transfer=True needs the optional package 'lm_eval': "
                                         r"pip install 'lowprec-rl-suite\[transfer\]'"):
        config.load(["tier=smoke", "transfer=true"])
