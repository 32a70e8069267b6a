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
"""

from __future__ import annotations

import json
import lzma
from pathlib import Path

SUFFIX = ".xz"
# The per-step logs of a run directory, the files that grow with the number of steps (config.json,
# summary.json and env.json stay plain: they are small and read by eye).
PER_STEP_LOGS = ("metrics.jsonl", "timing.jsonl", "mechanism.jsonl", "log.txt")
XZ_PRESET = 9 | lzma.PRESET_EXTREME


def compress(data: bytes) -> bytes:
    """``data`` as a .xz stream, the same bytes for the same input (no name or time is recorded)."""
    return lzma.compress(data, format=lzma.FORMAT_XZ, check=lzma.CHECK_CRC64, preset=XZ_PRESET)


def locate(path) -> Path | None:
    """``path`` if it is a file, else its ``.xz`` twin if that is one, else None. The plain file
    wins: it is what a run writes, and a compressed copy next to it can only be older."""
    path = Path(path)
    if path.is_file():
        return path
    twin = path.with_name(path.name + SUFFIX)
    return twin if path.suffix != SUFFIX and twin.is_file() else None


def run_file(run_dir, name: str) -> Path | None:
    """The file holding log ``name`` (``"metrics.jsonl"``) of a run: NAME or NAME.xz, or None."""
    return locate(Path(run_dir) / name)


def read_bytes(path) -> bytes:
    """The (decompressed) content of ``path``, which names a plain file, a ``.xz`` file, or a plain
    file that is stored as ``.xz``. FileNotFoundError names both places when neither exists."""
    found = locate(path)
    if found is None:
        raise FileNotFoundError(f"{path}: no such file (nor {Path(path).name}{SUFFIX})")
    data = found.read_bytes()
    if found.suffix != SUFFIX:
        return data
    try:
        return lzma.decompress(data, format=lzma.FORMAT_XZ)
    except lzma.LZMAError as e:
        raise ValueError(f"{found}: not a readable .xz file ({e})") from None


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
    """Rows of a JSONL file, plain or ``.xz`` (``read_bytes``), torn last line dropped."""
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
    """Store every per-step log under ``root`` plain again, byte for byte: each ``NAME.xz`` of a
    ``PER_STEP_LOGS`` name becomes ``NAME`` and the .xz is removed. For a copy of a committed run
    or grid that is to be edited or rerun in place like a fresh one (a run appends to the plain
    file). The plain files written, in path order; a log already plain keeps its plain file (an
    older .xz beside it, which no reader would see, is removed)."""
    written = []
    for xz in sorted(Path(root).rglob("*" + SUFFIX)):
        plain = xz.with_name(xz.name.removesuffix(SUFFIX))
        if plain.name not in PER_STEP_LOGS or not xz.is_file():
            continue
        if not plain.exists():
            plain.write_bytes(read_bytes(xz))
            written.append(plain)
        xz.unlink()
    return written
