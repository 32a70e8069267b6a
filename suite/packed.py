"""Per-step logs stored plain or xz-compressed: finding and reading either form.

A run writes its per-step logs plain (``metrics.jsonl``, ``timing.jsonl``, ``mechanism.jsonl``,
``log.txt``; suite/results.py appends and rewrites them atomically). The committed references keep
many of them as ``NAME.xz`` instead (``scripts/compact_results.py``; results/README.md): JSONL of
floats compresses about sixfold. Every reader goes through ``run_file``/``read_log`` (or
``read_jsonl``, which takes either path), so a report, a fingerprint or the reproduction check sees
the decompressed bytes, byte for byte.

Compression is deterministic: the .xz container (stdlib ``lzma``, format XZ, check CRC64, preset
9 | extreme) records no file name and no time, so the same input always gives the same bytes and a
recompression is no diff.

A JSONL log whose every line is what the suite writes (``json.dumps(row, sort_keys=True,
allow_nan=True)``, suite/results.py) is stored tighter still, as ``NAME.tar.xz``: a tar of one
``.npy`` array per numeric key plus ``columns.json`` (the keys, which rows hold which, the values
that are not numbers), xz-compressed with LZMA2 set for 8-byte items. A float beside its own
column's values takes about 30% fewer bytes than its text in compressed JSONL (the committed logs:
results/README.md). The bytes are rebuilt exactly, and ``pack`` keeps this form
only after checking that they are: a log that does not round-trip stays ``NAME.xz``. Ordinary tools
read it too: ``tar -xJf metrics.jsonl.tar.xz`` gives the arrays for ``numpy.load``, and
``python -m suite.packed PATH`` prints the plain log.
"""

from __future__ import annotations

import ast
import functools
import io
import json
import lzma
import math
import sys
import tarfile
from pathlib import Path

import numpy as np

SUFFIX = ".xz"
COLUMNS = ".tar.xz"  # a JSONL log as columns (module docstring)
COLUMNS_FORMAT = "lowprec-rl-suite jsonl columns 1"
# The per-step logs of a run directory, the files that grow with the number of steps (config.json,
# summary.json and env.json stay plain: they are small and read by eye).
PER_STEP_LOGS = ("metrics.jsonl", "timing.jsonl", "mechanism.jsonl", "log.txt")
XZ_PRESET = 9 | lzma.PRESET_EXTREME
# For the columns: no literal context (lc=0) and 8-byte position alignment (lp=pb=3), the settings
# xz's documentation gives for aligned multibyte data; the bytes of a float64 then predict better.
COLUMN_FILTERS = [{"id": lzma.FILTER_LZMA2, "preset": XZ_PRESET, "lc": 0, "lp": 3, "pb": 3}]


def compress(data: bytes) -> bytes:
    """``data`` as a .xz stream, the same bytes for the same input (no name or time is recorded)."""
    return lzma.compress(data, format=lzma.FORMAT_XZ, check=lzma.CHECK_CRC64, preset=XZ_PRESET)


def _line(row: dict) -> bytes:
    return json.dumps(row, sort_keys=True, allow_nan=True).encode() + b"\n"


def _array(values: list) -> np.ndarray | None:
    """A column as the narrowest array that holds its values exactly: float32 for floats that are
    float32 values (most metrics are a tensor's ``.item()``), else float64; the smallest int type
    for ints; a 2-D array for lists of one length (a step's pass rate per prompt); None (kept in
    columns.json as written) for anything else."""
    if values and all(type(v) is list and v and len(v) == len(values[0]) for v in values):
        flat = _array([x for v in values for x in v])
        return None if flat is None else flat.reshape(len(values), len(values[0]))
    if all(type(v) is float for v in values):
        wide = np.array(values, dtype="<f8")
        narrow = wide.astype("<f4")
        return narrow if np.array_equal(narrow.astype("<f8"), wide, equal_nan=True) else wide
    if all(type(v) is int and -(1 << 63) <= v < (1 << 63) for v in values):
        wide = np.array(values, dtype="<i8")
        return next(a for a in (wide.astype(t) for t in ("<i1", "<i2", "<i4", "<i8"))
                    if np.array_equal(a, wide))
    return None


def _member(tar: tarfile.TarFile, name: str, data: bytes) -> None:
    info = tarfile.TarInfo(name)  # mtime, owner and mode fixed: the same log, the same bytes
    info.size, info.mode = len(data), 0o644
    tar.addfile(info, io.BytesIO(data))


def to_columns(data: bytes) -> bytes | None:
    """``data`` (JSONL bytes) as ``NAME.tar.xz`` bytes, or None when they would not give ``data``
    back exactly: a line the suite would not have written so, a torn line, no final newline."""
    rows = []
    for raw in data.split(b"\n")[:-1] if data.endswith(b"\n") else [None]:
        try:
            row = json.loads(raw)
        except (TypeError, ValueError):
            return None
        if not isinstance(row, dict) or _line(row) != raw + b"\n":
            return None
        rows.append(row)
    keys = sorted({k for row in rows for k in row})
    index = {k: i for i, k in enumerate(keys)}
    schemas: dict[tuple, int] = {}  # each distinct key set once; rows name theirs
    runs: list[list[int]] = []  # [schema, number of rows in a row]
    for row in rows:
        schema = schemas.setdefault(tuple(index[k] for k in row), len(schemas))
        if runs and runs[-1][0] == schema:
            runs[-1][1] += 1
        else:
            runs.append([schema, 1])
    layout = {"format": COLUMNS_FORMAT, "keys": keys, "schemas": [list(s) for s in schemas],
              "rows": runs, "json": {}}
    arrays = {}
    for i, key in enumerate(keys):
        values = [row[key] for row in rows if key in row]
        array = _array(values)
        if array is None:
            layout["json"][str(i)] = values
        else:
            arrays[i] = array
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w", format=tarfile.USTAR_FORMAT) as tar:
        # Widest items first, so that LZMA's 8-byte alignment (lp=pb=3) meets the float64s.
        for i in sorted(arrays, key=lambda i: (-arrays[i].itemsize, arrays[i].dtype.kind, i)):
            npy = io.BytesIO()
            np.save(npy, arrays[i], allow_pickle=False)
            _member(tar, f"{i:04d}.npy", npy.getvalue())
        _member(tar, "columns.json", json.dumps(layout, allow_nan=True).encode())
    packed = lzma.compress(buffer.getvalue(), format=lzma.FORMAT_XZ, check=lzma.CHECK_CRC64,
                           filters=COLUMN_FILTERS)
    return packed if from_columns(packed) == data else None


def column_rows(packed: bytes) -> list[dict]:
    """The rows of the JSONL log that ``to_columns`` stored, without writing them out as text and
    parsing them back: each row is the dict ``json.loads`` gives for its line (``to_columns`` keeps
    a log only when every line is ``_line`` of its parsed row, and a float, a NaN, an int or a list
    makes the same value through both), so ``read_jsonl`` gets what parsing ``from_columns`` would
    give, at a fraction of the cost."""
    with tarfile.open(fileobj=io.BytesIO(lzma.decompress(packed)), mode="r:") as tar:
        # by name from one index: tarfile's own lookup scans every member, once per column
        members = {m.name: m for m in tar.getmembers()}

        def member(name):
            return tar.extractfile(members[name]).read()
        layout = json.loads(member("columns.json"))
        if layout.get("format") != COLUMNS_FORMAT:
            raise ValueError(f"not {COLUMNS_FORMAT!r} but {layout.get('format')!r}")
        columns = [iter(layout["json"][str(i)]) if str(i) in layout["json"] else
                   iter(_values(_npy(member(f"{i:04d}.npy"))))
                   for i in range(len(layout["keys"]))]
    keys, schemas, out = layout["keys"], layout["schemas"], []
    for schema, count in layout["rows"]:
        these = [(keys[i], columns[i]) for i in schemas[schema]]
        out.extend({key: next(column) for key, column in these} for _ in range(count))
    return out


def from_columns(packed: bytes) -> bytes:
    """The JSONL bytes that ``to_columns`` stored, byte for byte."""
    return b"".join(map(_line, column_rows(packed)))


NPY_MAGIC = b"\x93NUMPY"
JSON_NAN = json.loads("NaN")  # the one object json gives for every NaN it parses


def _values(column: np.ndarray) -> list:
    """``column.tolist()``, each NaN being json's own NaN object, as parsing the line gives it: a
    NaN equals nothing but itself, so a row read from columns would otherwise differ (``==``) from
    the same row parsed from text."""
    values = column.tolist()
    if column.dtype.kind != "f" or not np.isnan(column).any():
        return values
    if column.ndim == 1:
        return [JSON_NAN if v != v else v for v in values]
    return [[JSON_NAN if v != v else v for v in row] for row in values]


@functools.lru_cache(maxsize=256)
def _npy_header(header: bytes, encoding: str) -> tuple[np.dtype, tuple[int, ...], bool]:
    """An .npy header's dtype, shape and order, parsed as numpy parses it (a Python dict literal,
    ``ast.literal_eval``), once per distinct header: the logs' columns repeat a few shapes, and
    parsing the header was most of the cost of reading a small array with ``np.load``."""
    d = ast.literal_eval(header.decode(encoding))
    return np.lib.format.descr_to_dtype(d["descr"]), tuple(d["shape"]), d["fortran_order"]


def _npy(data: bytes) -> np.ndarray:
    """The array of an .npy file's bytes as ``np.save`` writes them (format 1.0, 2.0 or 3.0; no
    object arrays: ``to_columns`` stores numbers only)."""
    if data[:6] != NPY_MAGIC or data[6] not in (1, 2, 3):
        raise ValueError("a column is not an .npy array of format 1.0-3.0")
    width = 2 if data[6] == 1 else 4  # the header length's bytes (numpy.lib.format)
    start = 8 + width + int.from_bytes(data[8:8 + width], "little")
    dtype, shape, fortran = _npy_header(data[8 + width:start],
                                        "utf8" if data[6] == 3 else "latin1")
    if dtype.hasobject:
        raise ValueError("a column holds Python objects")
    flat = np.frombuffer(data, dtype=dtype, count=math.prod(shape), offset=start)
    return flat.reshape(shape, order="F" if fortran else "C")


def pack(name: str, data: bytes) -> tuple[str, bytes]:
    """How log ``name`` with content ``data`` is stored: ``(NAME.tar.xz, columns)`` for a JSONL
    log that round-trips, else ``(NAME.xz, compress(data))``."""
    columns = to_columns(data) if name.endswith(".jsonl") else None
    return (name + COLUMNS, columns) if columns is not None else (name + SUFFIX, compress(data))


def locate(path) -> Path | None:
    """``path`` if it is a file, else its ``.xz`` or ``.tar.xz`` twin if that is one, else None.
    The plain file wins: it is what a run writes, and a compressed copy next to it can only be
    older."""
    path = Path(path)
    if path.is_file():
        return path
    if path.name.endswith(SUFFIX):
        return None
    twins = (path.with_name(path.name + s) for s in (SUFFIX, COLUMNS))
    return next((twin for twin in twins if twin.is_file()), None)


def run_file(run_dir, name: str) -> Path | None:
    """The file holding log ``name`` (``"metrics.jsonl"``) of a run: NAME or NAME.xz, or None."""
    return locate(Path(run_dir) / name)


def read_bytes(path) -> bytes:
    """The (decompressed) content of ``path``, which names a plain file, a ``.xz`` file, or a plain
    file that is stored as ``.xz``. FileNotFoundError names both places when neither exists."""
    found = locate(path)
    if found is None:
        raise FileNotFoundError(f"{path}: no such file (nor {Path(path).name}{SUFFIX})")
    if found.suffix != SUFFIX:
        return found.read_bytes()
    if found.name.endswith(COLUMNS):
        return _decoded(found, from_columns)
    return _decoded(found, lambda data: lzma.decompress(data, format=lzma.FORMAT_XZ))


def _decoded(found: Path, decode):
    """``decode`` of the bytes of compressed log ``found``; a file it cannot read is a ValueError
    naming the file and its kind."""
    try:
        return decode(found.read_bytes())
    except (lzma.LZMAError, tarfile.TarError, KeyError, ValueError) as e:
        kind = COLUMNS if found.name.endswith(COLUMNS) else SUFFIX
        raise ValueError(f"{found}: not a readable {kind} file ({e})") from None


def parse_jsonl(data: bytes, path) -> list[dict]:
    """Rows of JSONL bytes. An unparsable *last* line is a write torn by a kill and is dropped; an
    unparsable line anywhere else is corruption and raises ValueError naming ``path``."""
    lines = data.split(b"\n")
    # Index of the last non-blank line: only that one may be torn.
    last = max((i for i, raw in enumerate(lines) if raw.strip()), default=-1)
    rows = []
    for i, raw in enumerate(lines):
        if not raw.strip():
            continue
        try:
            # Decode per line: a torn multi-byte character must only spoil its own line.
            row = json.loads(raw.decode("utf-8"))
            if not isinstance(row, dict):
                raise ValueError(f"expected a JSON object, got {type(row).__name__}")
        except ValueError as e:  # JSONDecodeError and UnicodeDecodeError are ValueErrors
            if i == last:
                break
            raise ValueError(f"{path}: line {i + 1} is corrupt ({e}); "
                             "only the last line may be torn") from e
        rows.append(row)
    return rows


def read_jsonl(path) -> list[dict]:
    """Rows of a JSONL file, plain or ``.xz`` (``read_bytes``), torn last line dropped; a log stored
    as columns gives its rows directly (``column_rows``: whole lines only, never a torn one)."""
    found = locate(path)
    if found is not None and found.name.endswith(COLUMNS):
        return _decoded(found, column_rows)
    return parse_jsonl(read_bytes(path), path)


def read_log(run_dir, name: str, *, lines: bool = False, missing_ok: bool = False) -> list:
    """Log ``name`` of a run, plain or compressed: its parsed rows for a ``.jsonl`` log, else (or
    with ``lines=True``) its text lines. ``missing_ok``: [] when the run has neither form, else
    FileNotFoundError."""
    path = run_file(run_dir, name)
    if path is None:
        if missing_ok:
            return []
        raise FileNotFoundError(f"{Path(run_dir) / name}: no such file (nor {name}{SUFFIX})")
    if name.endswith(".jsonl") and not lines:
        return read_jsonl(path)
    return read_bytes(path).decode("utf-8", errors="replace").splitlines()


def unpack(root) -> list[Path]:
    """Store every per-step log under ``root`` plain again, byte for byte: each ``NAME.xz`` or
    ``NAME.tar.xz`` of a ``PER_STEP_LOGS`` name (a file or a link to one) becomes ``NAME`` and the
    packed file is removed. For a copy of a committed run or grid that is to be edited or rerun in
    place like a fresh one (a run appends to the plain file). The plain files written, in path
    order; a log already plain keeps its plain file (an older packed one beside it, which no
    reader would see, is removed). Links go first: their targets may be packed files here."""
    packed = sorted(Path(root).rglob("*" + SUFFIX), key=lambda p: (not p.is_symlink(), p))
    broken = [p for p in packed if p.is_symlink() and not p.exists()]
    if broken:  # before anything is written: a log that cannot be read must not just go missing
        raise FileNotFoundError(
            f"{broken[0]} links to {broken[0].readlink()}, which is not there ({len(broken)} such "
            "links): a copy of committed results needs the links resolved, e.g. cp -rL or "
            "shutil.copytree(symlinks=False)")
    written = []
    for xz in packed:
        suffix = COLUMNS if xz.name.endswith(COLUMNS) else SUFFIX
        plain = xz.with_name(xz.name.removesuffix(suffix))
        if plain.name not in PER_STEP_LOGS or not xz.is_file():
            continue
        if not plain.exists():
            plain.write_bytes(read_bytes(xz))
            written.append(plain)
        xz.unlink()
    return sorted(written)


if __name__ == "__main__":  # python -m suite.packed PATH: the plain log, byte for byte
    for arg in sys.argv[1:]:
        sys.stdout.buffer.write(read_bytes(arg))
