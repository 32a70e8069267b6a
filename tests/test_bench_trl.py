"""`suite bench --vs trl`: the suite's step and TRL's GRPOTrainer round on one config, from one
command."""

from __future__ import annotations

import importlib.util

import pytest

from suite import cli
from suite.rl import config

# a spec lookup, not an import: importing TRL at collection would cost every test worker seconds
if importlib.util.find_spec("trl") is None:
    pytest.skip("TRL is not installed (the trl extra)", allow_module_level=True)


def test_both_sides_do_the_same_work_and_the_ratio_is_theirs(capsys):
    # In its own process: TRL and a suite run in one interpreter leave process-wide state (vLLM's
    # parallel groups, imported through TRL) that a later in-process vLLM engine of the test session
    # trips over.
    import json
    import subprocess
    import sys

    code = ("import json; from suite.experiments import bench_trl; from suite.rl import config; "
            "from suite.console import make_console; r = "
            "bench_trl.compare(config.load(['tier=smoke', 'steps=4', 'precision=fp32']), "
            "make_console()); print('RESULT ' + json.dumps(r))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=900)
    assert out.returncode == 0, out.stderr[-3000:]
    r = json.loads(next(ln for ln in out.stdout.splitlines() if ln.startswith("RESULT "))[7:])
    cfg = config.load(["tier=smoke", "steps=4", "precision=fp32"])
    want = cfg.prompts_per_step * cfg.samples_per_prompt
    # counted, not assumed
    assert r["suite_completions"] == [want] * 4 and r["trl_completions"] == [want] * 4
    assert r["suite_step_s"] > 0 and r["trl_step_s"] > 0
    assert r["ratio"] == r["trl_step_s"] / r["suite_step_s"]
    assert r["trl_step_s"] == r["trl"]["time/step_s"] - r["trl"]["time/logprob_s"]


@pytest.mark.parametrize("argv, words",
                         [(["bench", "--vs", "verl", "tier=smoke"],
                           "--vs: the one framework to compare with is trl"),
                          (["bench", "--vs", "trl", "tier=smoke", "precision=fp8"],
                           "precision: fp8 cannot be run by TRL"),
                          (["bench", "--vs=trl", "tier=smoke", "algo.agg=token-mean"],
                           "algo.agg: no GRPOConfig equivalent"),])
def test_what_cannot_be_compared_is_refused_with_one_line(argv, words, capsys):
    assert cli.main(argv) == 2
    err = capsys.readouterr().err
    assert words in err and err.count("\n") == 1


def _planted(suite_step: float, trl_step: float) -> dict:
    return {"suite_step_s": suite_step, "trl_step_s": trl_step, "ratio": trl_step / suite_step,
            "suite": {"time/sample_s": 0.068, "time/logprob_s": 0.027, "time/update_s": 0.170},
            "trl": {"time/sample_s": 0.131}}


def test_a_recorded_comparison_keeps_each_precision_and_fills_the_docs_table(tmp_path, monkeypatch):
    from types import SimpleNamespace

    from suite.experiments import bench_trl

    monkeypatch.setattr(bench_trl, "TRL_DIR", tmp_path)
    cls = {"id": "cpu-test-class"}
    path = tmp_path / "cpu-test-class.json"
    bench_trl.record(path, cls, SimpleNamespace(precision="fp32"), _planted(0.2, 0.3), {"c": 1})
    bench_trl.record(path, cls, SimpleNamespace(precision="bf16"), _planted(0.261, 0.331), {})
    bench_trl.record(path, cls, SimpleNamespace(precision="fp32"), _planted(0.206, 0.285), {})
    assert bench_trl.f_table("cpu-test-class").splitlines()[2:] == [
        # TRL's updates: its step after sampling and scoring, 0.331 - 0.131
        "| bf16 | 0.261 | 0.331 | 1.27x | 0.068 | 0.131 | 0.027 | 0.170 | 0.200 |",
        "| fp32 | 0.206 | 0.285 | 1.38x | 0.068 | 0.131 | 0.027 | 0.170 | 0.154 |"]  # rerun wins
    assert bench_trl.f_ratio("cpu-test-class", "bf16") == "1.27x"
    with pytest.raises(ValueError, match="suite bench --vs trl precision=P --write-baseline"):
        bench_trl.f_table("cpu-other-class")
    with pytest.raises(ValueError, match="suite bench --vs trl precision=P --write-baseline"):
        bench_trl.f_ratio("cpu-other-class", "bf16")
