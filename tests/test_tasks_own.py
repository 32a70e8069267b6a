"""A task of the user's own, from a folder outside the package (docs/own_task.md): found on the task
path, checked before any compute, scored by its own reward function, and run; and the suite's own
files found, and never written, when it is installed."""

from __future__ import annotations

import json
import os
import shlex
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

from suite import locations
from suite.rl import config
from suite.tasks import registry

REPO = Path(__file__).resolve().parents[1]
EXAMPLE = REPO / "examples" / "own_task"


@pytest.fixture
def own(tmp_path) -> Path:
    """The example task folder, copied outside the package and the checkout's tasks/."""
    dest = tmp_path / "my_tasks"
    shutil.copytree(EXAMPLE, dest)
    return dest


def test_a_folder_on_the_include_path_or_in_the_env_var_adds_its_tasks_to_the_listing(
    own, monkeypatch):
    rows = {r["name"]: r for r in registry.list_tasks(str(own))}
    assert {"my_math", "my_letters"} <= set(rows) and {"arith3", "sanity_r1d"} <= set(rows)
    assert (rows["my_letters"]["file"] == str(own / "my_letters.yaml")
            and not rows["my_letters"]["builtin"])
    assert rows["arith3"]["builtin"] and rows["my_math"]["kind"] == "dataset"
    assert "my_math" not in registry.task_names()  # nothing leaks into the default path
    monkeypatch.setenv(registry.TASKS_PATH_ENV, str(own))
    assert "my_math" in registry.task_names()
    # the task's smoke tier
    assert config.load(["task=my_letters", "tier=smoke"]).sampling.max_new_tokens == 16


def test_a_run_records_its_task_folder_and_its_rerun_command_finds_the_task_without_the_environment(
        own, monkeypatch):
    """A folder given by $SUITE_TASKS_PATH is recorded in the config (not in its hash), so that the
    rerun command the report prints composes the same config in a shell that lacks the variable."""
    from suite.results import config_hash
    from suite.rl import provenance

    monkeypatch.setenv(registry.TASKS_PATH_ENV, str(own))
    cfg = config.to_dict(config.load(["task=my_math", "tier=smoke"]))
    assert cfg["include_path"] == str(own.resolve())
    monkeypatch.delenv(registry.TASKS_PATH_ENV)
    assert config_hash(cfg) == config_hash({**cfg, "include_path": "/elsewhere"})  # where, not what
    command = provenance.rerun_command(cfg)
    assert any(a.startswith("include_path=") and str(own.resolve()) in a
               for a in shlex.split(command)), command
    check = provenance.check(cfg, config_hash(cfg))
    assert str(check).startswith("yes"), str(check)


def test_the_own_reward_function_scores_with_verls_signature(own):
    task = registry.get_task("my_letters", None, str(own))
    item = task.split("train", 1)[0]
    assert item.messages[0][0] == "user" and "letter r" in item.prompt
    assert task.reward(item, f"I count.\nAnswer: {item.answer}", False) == 1.0
    assert task.reward(item, f"Answer: {int(item.answer) + 1}", False) == 0.0
    # truncated: 0, as every task of the suite
    assert task.reward(item, f"Answer: {item.answer}", True) == 0.0


def test_a_verl_dataset_with_the_math_reward(own):
    pytest.importorskip("math_verify")
    task = registry.get_task("my_math", None, str(own))
    item = task.split("test", 1)[0]
    assert task.reward(item, f"so \\boxed{{{item.answer}}}", False) == 1.0
    assert task.reward(item, "\\boxed{-1}", False) == 0.0


def _write(path: Path, text: str) -> Path:
    path.write_text(text)
    return path


@pytest.mark.parametrize("edit, message", [
    (lambda d: _write(d / "my_math.yaml",
                      (d / "my_math.yaml").read_text().replace("format:", "formt:")),
     r"my_math.yaml: unknown key 'formt'. Did you mean 'format'"),
    (lambda d: (d / "data" / "my_math_test.jsonl").unlink(),
     r"my_math.yaml: splits.test.files: no file matches .*my_math_test.jsonl"),
    (lambda d: _write(d / "reward.py", "def score(data_source, solution_str, ground_truth, "
                                       "extra_info):\n    return 0\n"),
     r"my_letters.yaml: reward.function: '.*reward.py' has no function 'compute_score'"),
    (lambda d: _write(d / "my_letters.yaml", (d / "my_letters.yaml").read_text().replace(
        "reward.py:compute_score", "no_such_pkg.rewards:compute_score")),
     r"reward.function: cannot import module 'no_such_pkg.rewards'"),
    (lambda d: _write(d / "my_math.yaml",
                      (d / "my_math.yaml").read_text().replace("name: my_math", "name: mymath")),
     r"name 'mymath' differs from the file's name"),
    (lambda d: shutil.copy(REPO / "tasks" / "arith3.yaml", d / "arith3.yaml"),
     r"task arith3 is defined twice"),
])
def test_a_bad_task_file_is_refused_before_compute_naming_file_and_key(own, edit, message):
    edit(own)
    with pytest.raises(ValueError, match=message):
        config.load([f"task={'my_letters' if 'reward' in message else 'my_math'}", "tier=smoke",
                     f"include_path={own}"])


def test_unknown_names_and_missing_folders_are_refused(own, tmp_path):
    with pytest.raises(ValueError, match="task: unknown value 'my_mth'. Did you mean 'my_math'"):
        config.load(["task=my_mth", f"include_path={own}"])
    with pytest.raises(ValueError, match="include_path: task folder .*nowhere does not exist"):
        config.load(["task=my_math", f"include_path={tmp_path / 'nowhere'}"])


def test_a_smoke_run_of_a_task_from_an_outside_folder_completes(own, tmp_path, suite_cache):
    """The command a user types, with the folder given by the environment variable; 2 smoke
    steps."""
    env = {**os.environ, registry.TASKS_PATH_ENV: str(own), "SUITE_CACHE": suite_cache}
    p = subprocess.run([sys.executable, "-m", "suite.cli", "run", "task=my_letters", "tier=smoke",
                        "steps=2", f"out={tmp_path / 'runs'}"], env=env, cwd=REPO,
                       capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    run_dir = tmp_path / "runs" / "default" / "my_letters__grpo__fp32__s0"
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2]
    assert json.loads((run_dir / "env.json").read_text())["task"] == {
        "name": "my_letters", "version": 1}


# ---------------------------------------------------------------------------- installed from a
# wheel
def test_an_installed_suite_finds_its_own_files_and_reads_references_from_the_current_directory(
        tmp_path, monkeypatch):
    shipped = tmp_path / "site" / "suite"
    (shipped / "_shipped" / "tasks").mkdir(parents=True)
    monkeypatch.setattr(locations, "CHECKOUT", None)  # what an installed package looks like
    monkeypatch.setattr(locations, "PACKAGE", shipped)
    assert locations.shipped_dir("tasks") == shipped / "_shipped" / "tasks"
    with pytest.raises(FileNotFoundError, match="recipes/ folder is missing"):
        locations.shipped_dir("recipes")
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("SUITE_REFERENCE_ROOT", raising=False)
    assert locations.reference_root() == tmp_path / "results" / "reference"
    monkeypatch.setenv("SUITE_REFERENCE_ROOT", str(tmp_path / "refs"))
    assert locations.reference_root() == tmp_path / "refs"
    assert "SUITE_REFERENCE_ROOT" in locations.where_to_get_references()


def test_nothing_is_written_into_site_packages(tmp_path):
    site = Path(sysconfig.get_paths()["purelib"])
    with pytest.raises(ValueError, match="suite fingerprint --write: .* is inside the installed "
                                         "packages"):
        locations.refuse_installed(site / "results" / "reference" / "x" / "fingerprint.json",
                                   "suite fingerprint --write")
    assert locations.refuse_installed(tmp_path / "fingerprint.json",
                                      "w") == (tmp_path / "fingerprint.json").resolve()
