"""Asynchronous rollouts (config staleness): k = 0 is today's loop byte for byte; k > 0 splits the
mismatch."""

import hashlib
import json
from pathlib import Path

import pytest

from suite.numerics import machine
from suite.results import read_jsonl
from suite.rl import config
from suite.rl.train import run

ROOT = Path(__file__).resolve().parents[1]


def _expected(flow: str) -> str | None:
    """sha256 of the smoke run's metrics.jsonl made by the code before staleness existed, for this
    machine class: the fixture (computed with main's code) or the class's committed numerics
    fingerprint."""
    cls = machine.describe("auto", 1)["id"]
    fixture_path = ROOT / "tests" / "fixtures" / "staleness0_metrics.json"
    fixture = json.loads(fixture_path.read_text())["classes"]
    if flow in fixture.get(cls, {}):
        return fixture[cls][flow]
    fp = ROOT / "results" / "reference" / cls / "fingerprint.json"
    return json.loads(fp.read_text())["flows"].get(flow, {}).get("sha256") if fp.exists() else None


@pytest.mark.parametrize("flow", ["fp32", "bf16"])
def test_staleness_zero_reproduces_the_metrics_of_the_synchronous_loop(tmp_path, flow):
    want = _expected(flow)
    if want is None:
        pytest.skip("no metrics of the synchronous loop recorded for machine class "
                    f"{machine.describe('auto', 1)['id']}")
    d = run(config.load(["tier=smoke", f"precision={flow}", "staleness=0", f"out={tmp_path}"]))
    assert hashlib.sha256((d / "metrics.jsonl").read_bytes()).hexdigest() == want


def test_staleness_splits_numeric_gap_and_policy_lag(tmp_path):
    d = run(config.load(["tier=smoke", "precision=fp32", "staleness=1", "steps=3",
                         f"out={tmp_path}"]))
    rows = read_jsonl(d / "metrics.jsonl")
    # step 1 samples with the starting weights, which the trainer still holds: no lag
    assert rows[0]["staleness/lag/kl_k3"] == 0.0
    # later steps sample one update behind: the lag is the policy's change, far above fp32 noise
    for r in rows[1:]:
        assert r["staleness/lag/logprob_diff/mean"] > 1e3 * r["staleness/numeric/logprob_diff/mean"]
        # fp32 engines at the same weights agree
        assert r["staleness/numeric/logprob_diff/mean"] < 1e-5
        # the total the corrections see (trainer now vs sampler) is lag + numeric, token by token
        assert r["mismatch/logprob_diff/mean"] == pytest.approx(
            r["staleness/lag/logprob_diff/mean"], rel=1e-3)
