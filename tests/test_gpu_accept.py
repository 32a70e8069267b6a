"""The staged GPU acceptance (suite/experiments/accept.py, scripts/gpu_accept.sh): its bookkeeping,
its refusals, and its stages run end to end in a stand-in of the GPU image: a virtual environment
without hydra-core and omegaconf, which get them from the carried wheels, as the borrowed GPU
does."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import sysconfig
from importlib import metadata
from pathlib import Path

import pytest

from suite.experiments import accept, accept_stage
from suite.experiments import bench_memory as bm

ROOT = Path(__file__).resolve().parents[1]
GPU_REF = ROOT / "results" / "reference" / "cuda-nvidia-h100-80gb-hbm3"
# What the GPU image lacks (docs/gpu.md): the stand-in leaves these out, so the stages must run on
# the wheels.
ABSENT = {"hydra-core", "omegaconf", "antlr4-python3-runtime"}


def test_a_measured_peak_is_this_process_not_its_parent():
    """bench-memory's child process reports its own peak: getrusage's ru_maxrss survives execve on
    Linux, so a child of a 1 GiB parent read 1 GiB for a few-MiB update (the acceptance measured
    after its GEMM checks)."""
    ballast = bytearray(1 << 30)
    ballast[:: 4096] = b"\1" * len(range(0, 1 << 30, 4096))  # touched: resident in this process
    sizes = dict(vocab=512, batch=2, prompt=8, response=32, steps=2, precision="bf16", hidden=0,
                 device="cpu")
    m = bm._measure("baseline", sizes, env=bm.LIVE_BYTES)
    del ballast
    assert m["peak_mb"] < 512, m  # the update itself needs a few MiB over its model


def test_a_stage_keeps_what_it_measured_and_the_failure(tmp_path):
    st = accept_stage.Stage("numerics", tmp_path, budget=60)
    st.add("one", True, "measured", "expected")
    first = json.loads((tmp_path / "numerics" / "summary.json").read_text())
    assert [c["check"] for c in first["checks"]] == ["one"] and first["ok"]

    def broken():
        raise RuntimeError("the device said no")

    st.run("two", broken)  # an exception is a failing row; the stage goes on
    st.add("three", True, "m", "e")
    s = json.loads((tmp_path / "numerics" / "summary.json").read_text())
    assert [(c["check"], c["ok"])
            for c in s["checks"]] == [("one", True), ("two", False), ("three", True)]
    assert "RuntimeError: the device said no" in s["checks"][1]["measured"] and not s["ok"]
    assert s["machine_class"] and s["torch"] and "commit" in s


@pytest.mark.parametrize("args",
                         [[], ["gpu"], ["cells", "only=gemm"], ["numerics", "only=doctor,nope"],
                                  ["numerics", "tier=smoke"], ["cells", "budget"],
                                  ["numerics", "limit=2"], ["cells", "limit=0"],
                                  ["cells", "limit=two"], ["cells", "only=grpo:fp99"],
                                  ["fingerprint", "only=doctor"], ["fingerprint", "tier=smoke"]])
def test_bad_arguments_are_refused_before_any_work(args, tmp_path):
    with pytest.raises(ValueError, match="suite accept"):
        accept.main([*args, f"out={tmp_path}"] if args else args)
    assert not any(tmp_path.iterdir())


def test_the_cells_stage_runs_the_cells_it_is_given_in_the_grids_order():
    assert accept.sanity_cells(["pg_seq_is:exact"]) == [("pg_seq_is", "exact")]
    assert accept.sanity_cells(["pg_seq_is:exact", "grpo:bf16"]) == [("grpo", "bf16"),
                                                                     ("pg_seq_is", "exact")]
    every = accept.sanity_cells()
    assert every[0][0] == "grpo" and len(every) == len(set(every)) == 24
    with pytest.raises(ValueError, match="it has no grpo:fp99, exact"):
        accept.sanity_cells(["grpo:fp99", "exact", "grpo:fp32"])


def _planted_fingerprint(moved: str | None = None) -> dict:
    flows = {f: {"sha256": ("0" if f == moved else "1") * 64, "steps": [{"step": 1}]}
             for f in ("fp32", "bf16")}
    return {"machine_class": {"id": "cuda-test"}, "flows": flows,
            "invariants": [{"name": "exact flow: mismatch exactly 0", "ok": True, "detail": ""}]}


@pytest.mark.parametrize("second", [None, "bf16"])
def test_the_fingerprint_stage_computes_twice_in_fresh_folders_and_compares(second, tmp_path,
                                                                             monkeypatch):
    from suite.analysis import fingerprint

    stale = tmp_path / "work" / "fingerprint" / "2" / "fingerprint"
    stale.mkdir(parents=True)  # complete runs of an earlier stage would be reread, not rerun
    passes = []

    def compute(workdir):
        assert not Path(workdir).exists()
        passes.append(Path(workdir))
        return _planted_fingerprint(None if len(passes) == 1 else second)

    monkeypatch.setattr(fingerprint, "compute", lambda gemm="auto", workdir=None: compute(workdir))
    st = accept_stage.Stage("fingerprint", tmp_path, budget=60)
    accept.fingerprint(st)
    assert passes == [tmp_path / "work" / "fingerprint" / n for n in ("1", "2")]
    s = json.loads((tmp_path / "fingerprint" / "summary.json").read_text())
    rows = {c["check"]: c for c in s["checks"]}
    assert rows["fingerprint: invariants"]["ok"]
    assert rows["fingerprint: rerun"]["ok"] == (second is None)
    assert ("bf16: metrics.jsonl moved" in rows["fingerprint: rerun"]["measured"]) == bool(second)
    written = json.loads((tmp_path / "fingerprint" / "fingerprint.json").read_text())
    assert written == _planted_fingerprint()  # the first pass's file, to commit


def test_a_fingerprint_without_time_for_its_rerun_is_not_a_pass(tmp_path, monkeypatch):
    from suite.analysis import fingerprint

    monkeypatch.setattr(fingerprint, "compute",
                        lambda gemm="auto", workdir=None: _planted_fingerprint())
    st = accept_stage.Stage("fingerprint", tmp_path, budget=0)
    accept.fingerprint(st)
    s = json.loads((tmp_path / "fingerprint" / "summary.json").read_text())
    rerun = next(c for c in s["checks"] if c["check"] == "fingerprint: rerun")
    assert not rerun["ok"] and rerun["measured"].startswith("not run:") and not s["ok"]


def test_a_committed_cell_reads_back_from_its_compressed_logs():
    cell = GPU_REF / "sanity" / "arith3__grpo__fp32__s0"
    row = accept._cell_row(cell)
    summary = json.loads((cell / "summary.json").read_text())
    assert row["finished"] and row["steps"] == 100 and row["verdict"] == summary["verdict"]
    assert 0 < row["step_s"] < 5


def _standin(venv: Path) -> Path:
    """A virtual environment that sees this one's packages but those the GPU image lacks (a .pth to
    links)."""
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    image = venv / "image"
    image.mkdir()
    here = Path(sysconfig.get_paths()["purelib"])
    for dist in metadata.distributions():
        if (dist.metadata["Name"].lower() in ABSENT
                or not str(dist.locate_file("")).startswith(str(here))):
            continue
        for top in {Path(str(f)).parts[0] for f in dist.files or []}:
            src, dst = here / top, image / top
            if (src.exists() and not dst.exists() and top not in ("..", "__pycache__")
                    and not top.endswith(".pth")):
                dst.symlink_to(src)
    site = subprocess.run([str(venv / "bin" / "python"), "-c", "import sysconfig; "
                                                               "print(sysconfig.get_paths()['purelib'])"],
                          capture_output=True, text=True, check=True).stdout.strip()
    Path(site, "gpu-image.pth").write_text(f"{image}\n")
    return venv / "bin" / "python"


def test_the_stages_run_in_a_standin_of_the_gpu_image(tmp_path, suite_cache):
    """numerics (its GEMM check) and cells (smoke-tier cells, each a `suite run` of its own) through
    scripts/gpu_accept.sh with python3 -m suite from PYTHONPATH, hydra-core and omegaconf from the
    wheels only."""
    py = _standin(tmp_path / "venv")
    lacks = subprocess.run([str(py), "-c", "import hydra"], capture_output=True)
    assert lacks.returncode != 0, "the stand-in must lack hydra-core, as the GPU image does"
    assert subprocess.run([str(py), "-c", "import torch, transformers"],
                          capture_output=True).returncode == 0
    names = accept.download_wheels(tmp_path / "whl")
    assert len(names) == len(accept.WHEELS) + len(accept.BUILT_WHEELS), names
    env = {**{k: v for k, v in os.environ.items() if k != "PYTHONPATH"}, "PYTHON": str(py),
           "WHEELS": str(tmp_path / "whl"), "ACCEPT_OUT": str(tmp_path / "out"),
           "TMPDIR": str(tmp_path), "SUITE_CACHE": suite_cache, "BUDGET_NUMERICS": "120",
           "ACCEPT_NUMERICS": "only=gemm", "BUDGET_CELLS": "300",
           "ACCEPT_CELLS": "tier=smoke steps=2 limit=2"}
    p = subprocess.run(["bash", str(ROOT / "scripts" / "gpu_accept.sh"), "numerics", "cells"],
                       env=env, cwd=ROOT, capture_output=True, text=True, timeout=900)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    assert ((tmp_path / "accept-site" / "hydra").is_dir()
            and (tmp_path / "accept-site" / "omegaconf").is_dir())
    num = json.loads((tmp_path / "out" / "numerics" / "summary.json").read_text())
    assert [c["check"] for c in num["checks"]] == ["gemm at r1d shapes"] and num["ok"]
    gemm = json.loads((tmp_path / "out" / "numerics" / "gemm.json").read_text())
    assert {r["layer"] for r in gemm["rows"]} == set(accept.R1D_SHAPES)
    assert all(r["fp8_agrees"] and r["fp4_agrees"] for r in gemm["rows"])
    cells = json.loads((tmp_path / "out" / "cells" / "cells.json").read_text())
    done = [r for r in cells["rows"] if r["finished"]]
    # limit=2: the stage ran the grid's first two cells to their end, and stopped there
    assert len(done) == 2 and all(r["error"] is None and r["steps"] == 2 for r in done), cells
    assert cells["not_started"] == [] and len(cells["rows"]) == 2


def test_a_gpu_reference_of_default_kernels_is_not_expected_to_repeat_its_bytes(tmp_path):
    """The H100 reference ran with deterministic=false: a rerun's moved bytes are no sign of a
    changed code."""
    import shutil

    from suite.analysis import reproduce
    from suite.packed import unpack

    fresh = tmp_path / "sanity"
    shutil.copytree(GPU_REF / "sanity" / "arith3__grpo__fp16__s0", fresh / "arith3__grpo__fp16__s0")
    unpack(fresh)
    path = fresh / "arith3__grpo__fp16__s0" / "metrics.jsonl"
    # a rerun that moved
    path.write_text(path.read_text().replace('"step": 3,', '"step": 3, "x": 1,', 1))
    doc = reproduce.check(fresh, "sanity")
    assert doc["reference"] and doc["nondeterministic_reference"] == ["arith3__grpo__fp16__s0"]
    assert "default CUDA kernels" in doc["statement"] and "Cells that moved" not in doc["statement"]
    assert doc["rows"][0]["metrics"] != "identical"
