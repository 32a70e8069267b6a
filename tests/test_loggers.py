"""Trackers as mirrors of metrics.jsonl (W&B offline, TensorBoard event files, MLflow's local
store), a failing tracker that never stops a run, and the FLOP-rate formula of timing.jsonl."""

from __future__ import annotations

import json
import math
import struct
from pathlib import Path

import numpy as np
import pytest

from suite import cli
from suite.numerics import flops
from suite.results import read_jsonl
from suite.rl import config, loggers
from suite.rl.train import run

RUN = "arith__grpo__fp32__s0"


def _wandb_history(run_dir: Path) -> list[dict]:
    """History records of an offline W&B run: its .wandb file is LevelDB's log format (32 KiB blocks
    of records with a 7-byte header: crc32, length, type) after a 7-byte W&B header, each record a
    protobuf."""
    from wandb.proto import wandb_internal_pb2

    (path,) = run_dir.glob("wandb/offline-run-*/run-*.wandb")
    data, pos, block, buf, out = path.read_bytes(), 7, 32768, b"", []
    while pos + 7 <= len(data):
        left = block - pos % block
        if left < 7:  # a block's tail too short for a header is padding
            pos += left
            continue
        _, length, kind = struct.unpack("<IHB", data[pos:pos + 7])
        pos += 7
        buf += data[pos:pos + length]
        pos += length
        if kind in (1, 4):  # FULL or LAST: a whole record
            rec = wandb_internal_pb2.Record()
            rec.ParseFromString(buf)
            buf = b""
            if rec.WhichOneof("record_type") == "history":
                out.append({"/".join(i.nested_key) or i.key: json.loads(i.value_json)
                            for i in rec.history.item})
    return out


def test_mirrors_hold_the_values_of_metrics_jsonl(tmp_path, monkeypatch):
    # nothing may land in the working directory (MLflow's default artifact root is ./mlruns)
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    monkeypatch.chdir(cwd)
    d = run(config.load(["tier=smoke", f"out={tmp_path}", "logger=[tensorboard,wandb,mlflow]"]))
    assert list(cwd.iterdir()) == []
    rows = read_jsonl(d / "metrics.jsonl")
    want = {(r["step"], k): v for r in rows for k, v in loggers.scalars(r).items()}
    assert len(want) > 20 * len(rows)

    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    tb = EventAccumulator(str(d / "tensorboard"), size_guidance={"scalars": 0})
    tb.Reload()
    got = {(e.step, k): e.value for k in tb.Tags()["scalars"] for e in tb.Scalars(k)}
    assert got.keys() == want.keys()
    for key, v in want.items():  # event files store float32
        assert got[key] == pytest.approx(float(np.float32(v)), nan_ok=True, rel=0, abs=0), key

    history = {h["_step"]: h for h in _wandb_history(d)}
    got = {(s, k): v for s, h in history.items() for k, v in h.items() if not k.startswith("_")}
    assert got.keys() == want.keys()
    assert all(got[k] == v or (math.isnan(v) and got[k] == "NaN") for k, v in want.items())

    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=f"sqlite:///{tmp_path / 'default' / 'mlflow.db'}")
    (mrun,) = client.search_runs([client.get_experiment_by_name("default").experiment_id])
    assert mrun.info.run_name == RUN and mrun.data.params["algorithm"] == '"grpo"'
    got = {(m.step, k): m.value for k in mrun.data.metrics
           for m in client.get_metric_history(mrun.info.run_id, k)}
    # MLflow refuses NaN: those stay in the JSONL
    assert got == {k: v for k, v in want.items() if math.isfinite(v)}
    (env,) = (tmp_path / "default" / "mlflow-artifacts").rglob("env.json")
    assert (json.loads(env.read_text())["python"]
            == json.loads((d / "env.json").read_text())["python"])


def test_a_logger_that_raises_is_switched_off_and_the_run_completes(tmp_path, monkeypatch, capsys):
    calls = {"n": 0}

    def boom(self, values, step):
        calls["n"] += 1
        raise RuntimeError("tracker unreachable")

    monkeypatch.setattr(loggers._TensorBoard, "log", boom)
    d = run(config.load(["tier=smoke", f"out={tmp_path}", "logger=[tensorboard]"]))
    out = capsys.readouterr().out
    assert out.count("logger tensorboard failed") == 1 and "tracker unreachable" in out
    assert calls["n"] == 1  # off after the first failure
    assert [r["step"] for r in read_jsonl(d / "metrics.jsonl")] == [1, 2, 3, 4]
    summary = json.loads((d / "summary.json").read_text())
    assert summary["verdict"] != "incomplete" and summary["steps_done"] == 4


def test_logger_is_not_part_of_the_experiment():
    from suite.results import config_hash

    plain, mirrored = (config.to_dict(config.load(["tier=smoke", *x]))
                       for x in ([], ["logger=[tensorboard]"]))
    assert config_hash(plain) == config_hash(mirrored)


@pytest.mark.parametrize("argv, words", [
    (["run", "tier=smoke", "logger=[tensorbord]"], "logger: unknown value 'tensorbord'"),
])
def test_bad_logger_is_one_line_and_exit_2(argv, words, capsys):
    assert cli.main(argv) == 2
    err = capsys.readouterr().err
    assert words in err and err.count("\n") == 1


def test_flop_formula_against_a_hand_computation():
    class Cfg:  # 2 layers of width 8
        num_hidden_layers, hidden_size = 2, 8

    n = 1000
    c = 2 * n + 2 * 2 * 10 * 8  # Kaplan et al. Table 1 with n_ctx = 10
    assert flops.forward_flops_per_token(n, 2, 8, 10) == c
    rates = flops.step_rates(Cfg, n, generated=50, sequences=4, seq_len=10, sample_s=2.0,
                             train_s=4.0)
    assert rates["flops/sample_tflop_s"] == pytest.approx(c * 50 / 2.0 / 1e12)
    # 1 scoring + 3 (fwd+bwd)
    assert rates["flops/train_tflop_s"] == pytest.approx(c * 4 * 10 * 4 / 4.0 / 1e12)


def test_matmul_params_count_each_linear_once():
    import torch

    m = torch.nn.Sequential(torch.nn.Embedding(10, 4), torch.nn.Linear(4, 3),
                            torch.nn.Linear(3, 10, bias=False))
    assert flops.matmul_params(m) == 4 * 3 + 3 * 10
