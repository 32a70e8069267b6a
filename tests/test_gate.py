"""suite gate: a calibrated band passes its own stack and fails a planted regression; the ledger
records both."""

import json

from suite import cli
from suite.results import read_jsonl


def test_gate_passes_the_calibrated_stack_and_fails_a_planted_regression(tmp_path, capsys):
    band, ledger = tmp_path / "band.json", tmp_path / "ledger.jsonl"
    common = ["tier=smoke", f"--band={band}", f"--ledger={ledger}", "--flows=fp32,bf16"]
    assert cli.main(["gate", "--calibrate", "--batches=2", "--seeds=2", *common]) == 0
    doc = json.loads(band.read_text())
    assert set(doc["flows"]) == {"fp32",
                                 "bf16"} and doc["versions"]["torch"] and doc["machine_class"]["id"]
    assert doc["flows"]["bf16"]["k3"]["n"] == 4
    # the bands order the flows
    assert doc["flows"]["bf16"]["k3"]["upper"] > doc["flows"]["fp32"]["k3"]["upper"]
    # the calibrated stack: its own measurement is one of the calibration's (batch 0, seed 0),
    # within mean + 3 sd
    assert cli.main(["gate", *common]) == 0
    # planted regression: the sampler's distribution perturbed (the dose-response dial), the probe
    # unchanged
    assert cli.main(["gate", "inject.kind=noise", "inject.scale=0.05", *common]) == 1
    out = capsys.readouterr().out
    assert "FAIL" in out and "NeMo-RL" in out and "prime-rl" in out
    rows = read_jsonl(ledger)
    assert ([r["kind"] for r in rows] == ["calibration", "check", "check"]
            and [r.get("pass") for r in rows[1:]] == [True, False])
    assert rows[0]["key"] == rows[1]["key"] and rows[0]["key"].startswith("torch=")
    assert rows[2]["stack"]["inject"] == {"kind": "noise", "scale": 0.05}


def test_gate_refuses_a_band_of_another_probe(tmp_path, capsys):
    band = tmp_path / "band.json"
    assert cli.main(["gate", "--calibrate", "--batches=2", "--seeds=1", "tier=smoke",
                     "--flows=fp32", f"--band={band}"]) == 0
    assert cli.main(["gate", "tier=smoke", "samples_per_prompt=2", f"--band={band}"]) == 2
    assert "calibrated on another probe" in capsys.readouterr().err
