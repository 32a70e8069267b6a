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
