"""Per-step logs stored as .xz, as columns (.tar.xz) or as links to a twin (suite/packed.py,
scripts/compact_results.py): every reader gets the same bytes and records as from the plain file,
the reproduction check still compares byte for byte, and the compaction is deterministic,
idempotent and stays within its budgets."""

from __future__ import annotations

import importlib.util
import io
import json
import lzma
import random
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

import numpy as np
import pytest

from suite import packed
from suite.analysis import leaderboard, reproduce
from suite.analysis.runs import load_runs
from suite.results import find_run_dirs, load_run, read_jsonl

REPO = Path(__file__).resolve().parents[1]
# real runs: metrics, timing, log.txt (stored as .xz)
FIXTURE = REPO / "tests" / "fixtures" / "results-2seeds"
RUN = "arith__grpo__fp16__s0"
MIB = 1 << 20


def _script():
    path = REPO / "scripts" / "compact_results.py"
    spec = importlib.util.spec_from_file_location("compact_results", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _pack_run(run_dir: Path) -> None:
    """Store a run's per-step logs as the compaction does: NAME.tar.xz (a JSONL log) or NAME.xz in
    the place of NAME."""
    for name in packed.PER_STEP_LOGS:
        plain = run_dir / name
        if plain.is_file():
            stored, data = packed.pack(name, plain.read_bytes())
            (run_dir / stored).write_bytes(data)
            plain.unlink()


@pytest.fixture
def pair(tmp_path):
    """A fresh copy of the fixture grid and a reference copy of it whose logs are compressed."""
    fresh, ref = tmp_path / "fresh", tmp_path / "ref"
    shutil.copytree(FIXTURE, fresh)
    shutil.copytree(FIXTURE, ref)
    packed.unpack(fresh)  # the fixture is stored compressed: the plain logs a run writes
    packed.unpack(ref)
    for d in find_run_dirs(ref):
        _pack_run(d)
    return fresh, ref


# ---- reading --------------------------------------------------------------------------------
def test_read_log_gives_the_same_records_and_lines_from_plain_and_xz(pair):
    fresh, ref = pair
    assert packed.run_file(ref / RUN, "metrics.jsonl") == ref / RUN / "metrics.jsonl.tar.xz"
    assert packed.run_file(ref / RUN, "log.txt") == ref / RUN / "log.txt.xz"
    assert not (ref / RUN / "metrics.jsonl").exists()
    for name in ("metrics.jsonl", "timing.jsonl"):
        plain = packed.read_log(fresh / RUN, name)
        assert plain and plain == packed.read_log(ref / RUN, name) == read_jsonl(ref / RUN / name)
    log = packed.read_log(ref / RUN, "log.txt")
    assert log and log == (fresh / RUN / "log.txt").read_text().splitlines()
    want = (fresh / RUN / "metrics.jsonl").read_bytes()
    assert packed.read_bytes(ref / RUN / "metrics.jsonl") == want
    assert packed.read_log(ref / RUN, "mechanism.jsonl", missing_ok=True) == []
    with pytest.raises(FileNotFoundError, match="mechanism.jsonl.xz"):
        packed.read_log(ref / RUN, "mechanism.jsonl")


def test_a_torn_last_line_is_dropped_and_a_broken_stream_named(tmp_path):
    xz = tmp_path / "metrics.jsonl.xz"
    xz.write_bytes(packed.compress(b'{"step": 0}\n{"step": 1}\n{"st'))
    assert packed.read_log(tmp_path, "metrics.jsonl") == [{"step": 0}, {"step": 1}]
    xz.write_bytes(b"not xz")
    with pytest.raises(ValueError, match="metrics.jsonl.xz: not a readable .xz file"):
        packed.read_log(tmp_path, "metrics.jsonl")
    # A plain file next to a compressed one is what a run wrote last: it is the one read.
    (tmp_path / "metrics.jsonl").write_text('{"step": 7}\n')
    assert packed.read_log(tmp_path, "metrics.jsonl") == [{"step": 7}]


def test_compressed_runs_are_found_loaded_and_summarized_like_plain_ones(pair):
    fresh, ref = pair
    assert [d.name for d in find_run_dirs(ref)] == [d.name for d in find_run_dirs(fresh)]
    a, b = ({r.label: r for r in load_runs(root)} for root in (fresh, ref))
    assert a.keys() == b.keys()
    assert all(a[k].metrics == b[k].metrics and a[k].summary == b[k].summary for k in a)
    assert load_run(ref / RUN)["metrics"] == load_run(fresh / RUN)["metrics"]
    # A run killed before its summary: the report shows the tail of its (compressed) log.txt.
    (ref / RUN / "summary.json").unlink()
    (run,) = [r for r in load_runs(ref) if r.label == RUN]
    assert run.detail and run.detail.splitlines()[-1] == packed.read_log(ref / RUN, "log.txt")[-1]


def test_the_leaderboard_validates_a_bundle_stored_as_xz(pair):
    fresh, ref = pair
    assert leaderboard.find_bundles(ref / RUN) == [ref / RUN]
    got, want = (leaderboard.validate_run(root / RUN) for root in (ref, fresh))
    assert got["summary"] == want["summary"] and got["curves"] == want["curves"]


def test_unpack_gives_back_the_plain_logs_byte_for_byte(pair):
    fresh, ref = pair
    stale = ref / RUN / "metrics.jsonl"  # a plain log next to its .xz wins and keeps its bytes
    stale.write_bytes(b'{"step": 1}\n')
    written = packed.unpack(ref)
    assert stale not in written and stale.read_bytes() == b'{"step": 1}\n'
    assert not list(ref.rglob("*" + packed.SUFFIX)) and written == sorted(written)
    want = {p.relative_to(fresh) for p in fresh.rglob("*") if p.is_file()}
    assert {p.relative_to(ref) for p in ref.rglob("*") if p.is_file()} == want
    for rel in want - {stale.relative_to(ref)}:
        assert (ref / rel).read_bytes() == (fresh / rel).read_bytes(), rel
    assert packed.unpack(ref) == []  # nothing left to unpack


# ---- the reproduction check -----------------------------------------------------------------
def test_a_rerun_is_compared_byte_for_byte_with_a_compressed_reference(pair):
    fresh, ref = pair
    assert {r["metrics"] for r in reproduce.compare(fresh, ref)} == {"identical"}
    assert {r["metrics"] for r in reproduce.compare(ref, fresh)} == {"identical"}
    ok = [i["ok"] for i in reproduce.invariants(fresh)]
    assert [i["ok"] for i in reproduce.invariants(ref)] == ok
    # One byte moved in the fresh run is found at its step, against the decompressed reference:
    # the last mantissa digit of a number, so that the line stays valid JSON.
    path = fresh / RUN / "metrics.jsonl"
    lines = path.read_bytes().splitlines(keepends=True)
    i = next(j for j, line in enumerate(lines) if j >= 3 and b"e-0" in line)
    pos = lines[i].index(b"e-0") - 1
    digit = b"0123456789"[(lines[i][pos] - ord("0") + 1) % 10]
    lines[i] = lines[i][:pos] + bytes([digit]) + lines[i][pos + 1:]
    path.write_bytes(b"".join(lines))
    rows = {r["run"]: r["metrics"] for r in reproduce.compare(fresh, ref)}
    assert rows.pop(RUN) == f"differs from step {json.loads(lines[i])['step']}"
    assert set(rows.values()) == {"identical"}


# ---- the compaction -------------------------------------------------------------------------
def _repo(root: Path, sizes: dict[str, int]) -> Path:
    """A git checkout with one run of ``rows`` JSONL rows per grid under results/reference/cls/,
    plus a source log outside a run directory and a ledger, which must stay as they are."""
    rng = random.Random(0)
    for grid, rows in sizes.items():
        run = root / "results" / "reference" / "cls" / grid / "arith__grpo__bf16__s0"
        run.mkdir(parents=True)
        (run / "config.json").write_text("{}\n")
        lines = [json.dumps({"step": s, "mismatch/kl_k3": rng.random() * 1e-4}, sort_keys=True)
                 + "\n" for s in range(rows)]
        (run / "metrics.jsonl").write_text("".join(lines))
        (run / "log.txt").write_text("".join(f"step {s}\n" for s in range(rows)))
        (run / "source").mkdir()
        (run / "source" / "metrics.jsonl").write_text(lines[0])
    (root / "results" / "gate").mkdir(parents=True)
    (root / "results" / "gate" / "ledger.jsonl").write_text('{"a": 1}\n')
    subprocess.run(["git", "init", "-q", str(root)], check=True)
    subprocess.run(["git", "-C", str(root), "add", "-A"], check=True)
    return root


def _xz_files(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*.xz"))}


def _is_log(path: Path) -> bool:
    return path.name in packed.PER_STEP_LOGS and path.parent.name != "source"


def test_compaction_is_deterministic_idempotent_and_within_its_budgets(tmp_path):
    compact = _script().compact
    sizes = {"big": 4000, "mid": 2500, "small": 1000}
    a, b = _repo(tmp_path / "a", sizes), _repo(tmp_path / "b", sizes)
    files = [p for p in a.rglob("*") if p.is_file() and ".git" not in p.parts]
    originals = {p: p.read_bytes() for p in files}
    plain = {g: sum(len(data) for p, data in originals.items() if g in p.parts and _is_log(p))
             for g in sizes}
    budget = (plain["big"] + plain["small"] + 100) / MIB  # room for big and small, not mid too
    said = []
    done = compact(a, budget, 20, say=said.append)
    assert done["grids"] == ["reference/cls/big", "reference/cls/small"]
    assert done["left"] == ["reference/cls/mid"]
    assert done["removed"] == plain["big"] + plain["small"] <= budget * MIB
    assert done["tree_after"] == done["tree_before"] - done["removed"] + done["added"]
    assert any("left for later: reference/cls/mid" in s for s in said) and "tree" in said[-1]
    for path, data in originals.items():  # every log given back byte for byte; nothing else moved
        if _is_log(path) and "mid" not in path.parts:
            suffix = ".tar.xz" if path.suffix == ".jsonl" else ".xz"
            stored = path.with_name(path.name + suffix)
            assert not path.exists() and packed.read_bytes(stored) == data
        else:
            assert path.read_bytes() == data
    # The added-bytes budget leaves a grid whose .xz would not fit, for a later run.
    tight = compact(a, budget, done["added"] / 10 / MIB, say=said.append)
    assert tight["grids"] == [] and tight["left"] == ["reference/cls/mid"]
    # The same command again goes on with what is left; once nothing is left it changes no byte.
    assert compact(a, budget, 20, say=said.append)["grids"] == ["reference/cls/mid"]
    first = _xz_files(a)
    again = compact(a, budget, 20, say=said.append)
    assert again["grids"] == again["left"] == [] and again["removed"] == 0
    assert _xz_files(a) == first and said[-1].endswith("(nothing left to compress)")
    grids = ["reference/cls/mid", "reference/cls/small"]  # named grids: the same, none an error
    assert compact(a, budget, 20, grids=grids, say=said.append)["grids"] == []
    # Deterministic: another checkout of the same files gives the same .xz bytes.
    for _ in range(2):
        compact(b, budget, 20, say=said.append)
    assert _xz_files(b) == first


def test_compaction_refuses_bad_arguments_before_touching_a_file(tmp_path):
    compact = _script().compact
    repo = _repo(tmp_path / "r", {"g": 10})
    with pytest.raises(ValueError, match="--budget-mib"):
        compact(repo, 0, 20, say=lambda s: None)
    with pytest.raises(ValueError, match="--grid: no per-step logs in reference/cls/typo"):
        compact(repo, 10, 20, grids=["reference/cls/typo"], say=lambda s: None)
    assert not list(repo.rglob("*.xz"))


# ---- columns and links ----------------------------------------------------------------------
def _lines(rows) -> bytes:
    return "".join(json.dumps(r, sort_keys=True, allow_nan=True) + "\n" for r in rows).encode()


def test_a_jsonl_log_stored_as_columns_gives_back_every_byte(tmp_path):
    nan, inf = float("nan"), float("inf")
    rows = [{"step": 0, "a/f32": 0.5, "a/f64": 0.1, "odd": nan, "big": 1 << 70, "sha": "ab12",
             "rates": [0.125, 0.25], "ragged": [1], "flag": True, "none": None},
            {"step": 1, "a/f32": -0.0, "a/f64": 5e-324, "odd": inf, "big": 3, "sha": "cd34",
             "rates": [1.0, 0.0], "ragged": [1, 2], "flag": False, "none": None},
            {"step": 2, "a/f32": 2.5, "eval/only_here": -inf, "nested": {"k": [1, "x"]}},
            {"step": 300, "a/f32": 1.0, "a/f64": 1 / 3, "rates": [0.5, 0.75], "uni": "\u00e9"}]
    data = _lines(rows)
    name, stored = packed.pack("metrics.jsonl", data)
    assert name == "metrics.jsonl.tar.xz" and packed.from_columns(stored) == data
    # ordinary tools: an xz'd tar of .npy arrays and columns.json
    (tmp_path / name).write_bytes(stored)
    with tarfile.open(tmp_path / name, "r:xz") as tar:
        layout = json.loads(tar.extractfile("columns.json").read())
        arrays = {layout["keys"][int(m.name[:4])]: np.load(io.BytesIO(tar.extractfile(m).read()))
                  for m in tar.getmembers() if m.name.endswith(".npy")}
    assert arrays["step"].dtype == np.int16 and arrays["step"].tolist() == [0, 1, 2, 300]
    assert arrays["a/f32"].dtype == np.float32 and arrays["a/f64"].dtype == np.float64
    assert arrays["rates"].shape == (3, 2) and "big" not in arrays and "ragged" not in arrays
    assert packed.read_log(tmp_path, "metrics.jsonl") == json.loads(
        json.dumps([json.loads(line) for line in data.splitlines()]))  # NaN aside: same records
    got = subprocess.run([sys.executable, "-m", "suite.packed", str(tmp_path / name)],
                         capture_output=True, check=True, cwd=REPO).stdout
    assert got == data


@pytest.mark.parametrize("version", [(1, 0), (2, 0), (3, 0)])
def test_a_column_reads_as_numpy_reads_it(version):
    """The columns' own .npy reader (suite/packed.py ``_npy``) against ``np.load``: every header
    format, an int, a float32 with a NaN and a -0.0, a Fortran-ordered 2-D array."""
    for a in (np.arange(5, dtype="<i2"), np.array([[0.5, np.nan], [1.0, -0.0]], dtype="<f4"),
              np.asfortranarray(np.arange(6.0).reshape(2, 3))):
        buf = io.BytesIO()
        np.lib.format.write_array(buf, a, version=version)
        want, got = np.load(io.BytesIO(buf.getvalue())), packed._npy(buf.getvalue())
        assert got.dtype == want.dtype and got.shape == want.shape
        assert got.tobytes(order="A") == want.tobytes(order="A")
    with pytest.raises(ValueError, match="not an .npy array"):
        packed._npy(b"PK\x03\x04 a zip, not an array")


@pytest.mark.parametrize("data", [
    b'{"step": 0, "a": 1}\n{"b": 2, "a": 1}\n',  # keys not sorted: not what the suite writes
    b'{"a":1}\n',  # other separators
    b'{"a": 1}\n{"a": 2}\n{"a',  # torn last line
    b'{"a": 1}',  # no final newline
    b'',
    b'[1, 2]\n'])
def test_a_log_that_would_not_come_back_byte_for_byte_stays_plain_xz(data):
    assert packed.to_columns(data) is None
    name, stored = packed.pack("metrics.jsonl", data)
    assert name == "metrics.jsonl.xz" and lzma.decompress(stored) == data
    assert packed.pack("log.txt", b"step 0\n")[0] == "log.txt.xz"


def test_twin_logs_are_stored_once_and_linked_even_across_steps(tmp_path):
    compact = _script().compact
    repo = _repo(tmp_path / "r", {"a": 50, "b": 60})
    runs = {g: repo / "results" / "reference" / "cls" / g / "arith__grpo__bf16__s0" for g in "ab"}
    twin = runs["b"].parent / "arith__grpo__fp32__s0"
    shutil.copytree(runs["a"], twin)  # the same bytes in another grid, later in path order
    want = {p: p.read_bytes() for p in repo.rglob("*") if p.is_file() and ".git" not in p.parts}
    said = []
    # Only grid b fits: the twin's holder (grid a) is not stored yet, so it is packed on its own.
    size_b = sum(len(d) for p, d in want.items() if "b" in p.parts and _is_log(p))
    done = compact(repo, (size_b + 10) / MIB, 20, say=said.append)
    assert done["grids"] == ["reference/cls/b"]
    assert not (twin / "metrics.jsonl.tar.xz").is_symlink()
    # The next run stores grid a, then turns the twin into links to a's files.
    compact(repo, 100, 20, say=said.append)
    for name in ("metrics.jsonl.tar.xz", "log.txt.xz"):
        link = twin / name
        assert link.is_symlink() and link.resolve() == (runs["a"] / name).resolve()
        assert not Path(link.readlink()).is_absolute()
    for path, data in want.items():
        if _is_log(path):
            assert packed.read_bytes(path) == data, path
    assert compact(repo, 100, 20, say=said.append)["grids"] == []  # nothing left to do
    # a copy that keeps the links but not their targets is refused before anything is written
    kept = tmp_path / "kept"
    shutil.copytree(twin, kept, symlinks=True)
    with pytest.raises(FileNotFoundError, match="which is not there .2 such links.*cp -rL"):
        packed.unpack(kept)
    assert not (kept / "metrics.jsonl").exists()
    # unpack gives plain files everywhere, the links' too, whatever the order
    packed.unpack(repo / "results")
    for path, data in want.items():
        assert path.is_file() and not path.is_symlink() and path.read_bytes() == data, path


def test_committed_run_json_keeps_its_values_one_a_line(tmp_path):
    compact = _script().compact
    repo = _repo(tmp_path / "r", {"g": 5})
    run = repo / "results" / "reference" / "cls" / "g" / "arith__grpo__bf16__s0"
    summary = {"verdict": "pass", "accuracy/peak": 0.96875, "nested": {"b": [1, 2.5], "a": None},
               "mismatch/final/kl_k3": float("nan")}
    (run / "summary.json").write_text(json.dumps(summary, indent=2, sort_keys=True) + "\n")
    compact(repo, 10, 10, say=lambda s: None)
    text = (run / "summary.json").read_text()
    assert text.startswith('{\n"accuracy/peak":0.96875,\n') and "  " not in text
    assert json.dumps(json.loads(text)) == json.dumps(summary, sort_keys=True)
    assert compact(repo, 10, 10, say=lambda s: None)["grids"] == []  # nothing left to do
