"""Store the committed per-step logs under results/ compactly, a few grids at a time.

    python scripts/compact_results.py --budget-mib N [--added-mib M] [--grid GRID ...] [--dry-run]

The per-step logs of a committed run (``metrics.jsonl``, ``timing.jsonl``, ``mechanism.jsonl``,
``log.txt``; suite/packed.py ``PER_STEP_LOGS``) are most of the tree's bytes. Each tracked one is
stored in its most compact form (suite/packed.py ``pack``): a JSONL log as columns,
``NAME.tar.xz``; any other log as ``NAME.xz``. A log whose bytes another committed log holds too
(a main-job cell that is also a sanity cell, a control that is also a source-grid cell) becomes a
relative symbolic link to that one's file, the first of them in path order, so each is stored
once; ordinary tools and every reader in suite/ follow the link. Every new file is checked to give
back the original bytes before the old one is removed. A run's ``config.json``, ``summary.json`` and
``env.json`` stay plain JSON, one value a line without the indentation a run writes (a fifth of
their bytes; the same values, checked), as the leaderboard's data.js. Runs keep writing plain,
indented files.

A grid (``results/<kind>/<class>/<grid>``, named by its path under results/, e.g.
``reference/cpu-amx-native/h3-tail``) is done whole or not at all, the largest first. One commit
may only carry so many bytes of diff (a deleted file counts with its whole text, an added binary
file too), so the compaction goes in steps: a grid whose old logs would take the removed bytes over
``--budget-mib``, or whose new files would take the added bytes over ``--added-mib``, is left for
the next run, which goes on from there; a log whose twin is not stored yet is packed on its own
and becomes a link in the run that stores the twin. Once every log is in its form a run changes
nothing. The tree's size counts the files a copy of the checkout carries (tracked, untracked, not
ignored; a link counts as itself, not as its target).
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # this checkout's suite/, also when another one is installed

from suite.packed import COLUMNS, PER_STEP_LOGS, SUFFIX, pack, read_bytes  # noqa: E402
from suite.results import atomic_write_bytes  # noqa: E402

MIB = 1 << 20
GRID_DEPTH = 3  # results/<kind>/<class>/<grid>
RUN_JSON = ("config.json", "summary.json", "env.json")


def _git_files(repo: Path, *flags: str) -> list[Path]:
    cmd = ["git", "-C", str(repo), "ls-files", "-z", *flags]
    out = subprocess.run(cmd, check=True, capture_output=True).stdout
    return [repo / p for p in out.decode().split("\0") if p]


def tree_bytes(repo: Path) -> int:
    """Bytes of the files a copy of the checkout carries: tracked and untracked, not ignored."""
    files = _git_files(repo, "--cached", "--others", "--exclude-standard")
    return sum(p.lstat().st_size for p in files if p.is_symlink() or p.is_file())


def _log_name(path: Path) -> str | None:
    """The log a stored file holds (``metrics.jsonl`` for ``metrics.jsonl.tar.xz``), or None."""
    for suffix in (COLUMNS, SUFFIX, ""):
        name = path.name.removesuffix(suffix) if suffix else path.name
        if path.name.endswith(suffix) and name in PER_STEP_LOGS:
            return name
    return None


def compact_json(text: str) -> str:
    """JSON text as the committed run files keep it: sorted keys, one value a line, no indentation,
    NaN as ``NaN`` (suite/results.py)."""
    return json.dumps(json.loads(text), sort_keys=True, indent=0, separators=(",", ":"),
                      allow_nan=True) + "\n"


def _json_todo(files: list[Path]) -> dict[Path, bytes]:
    """The run JSON files beside these logs that are not stored compactly yet -> their new bytes,
    checked to hold the same values."""
    todo = {}
    for path in sorted({p.parent / name for p in files for name in RUN_JSON}):
        if not path.is_file() or path.is_symlink():
            continue
        old = path.read_text()
        new = compact_json(old)
        if new != old:
            if compact_json(new) != new or json.dumps(json.loads(new)) != json.dumps(
                    json.loads(old)):
                raise RuntimeError(f"{path}: the compact JSON does not hold the same values")
            todo[path] = new.encode()
    return todo


def per_step_logs(repo: Path) -> dict[str, list[Path]]:
    """Grid -> the files holding its per-step logs, in any form, in path order. A log counts only in
    a run directory (next to a config.json): an outside framework's source log keeps its bytes."""
    grids: dict[str, list[Path]] = {}
    for path in _git_files(repo, "--cached", "--others", "--exclude-standard", "--", "results"):
        in_run = (path.parent / "config.json").is_file()
        if _log_name(path) and in_run and (path.is_file() or path.is_symlink()):
            rel = path.relative_to(repo / "results").parts
            grids.setdefault("/".join(rel[:min(GRID_DEPTH, len(rel) - 2)]), []).append(path)
    return {grid: sorted(files) for grid, files in grids.items()}


def _plan(found: dict[str, list[Path]]) -> dict[Path, tuple[Path, bytes, Path | None]]:
    """Old file -> (new file, its bytes or b"" for a link, the file the link points at or None)
    for every log not stored as it should be. The holder of bytes that several logs share is the
    first of them by the log's own path (the run directory and log name, whatever its form)."""
    content = {p: read_bytes(p) for files in found.values() for p in files}
    holder: dict[bytes, Path] = {}
    stored: dict[Path, str] = {}  # holder -> the suffix its packed form takes
    plan = {}
    # holders first (path order), so that each is packed once and its twins only link to it
    for p in sorted(content, key=lambda p: p.parent / _log_name(p)):
        first = holder.setdefault(hashlib.sha256(content[p]).digest(), p)
        if first == p:
            name, packed = pack(_log_name(p), content[p])
            stored[p], target = name.removeprefix(_log_name(p)), None
        else:  # the same bytes, so the same form as its holder's
            name, packed = _log_name(p) + stored[first], b""
            target = first.with_name(_log_name(first) + stored[first])
        new = p.with_name(name)
        link = Path(os.path.relpath(target, p.parent)) if target else None
        if p == new and (p.is_symlink() and p.readlink() == link if target
                         else not p.is_symlink() and p.read_bytes() == packed):
            continue  # already stored as it should be
        plan[p] = (new, packed, target)
    return plan


def _store(old: Path, new: Path, packed: bytes, target: Path | None) -> None:
    if target is None:
        atomic_write_bytes(new, packed)
    else:
        tmp = new.with_name(f".{new.name}.link")
        tmp.unlink(missing_ok=True)
        tmp.symlink_to(os.path.relpath(target, new.parent))
        os.replace(tmp, new)  # atomic: readers see the old file or the link
    if read_bytes(new) != read_bytes(old):  # never remove an original its new form does not give
        raise RuntimeError(f"{new} does not give back the bytes of {old}")
    if old != new:
        old.unlink()


def compact(repo: Path, budget_mib: float, added_mib: float, grids: list[str] | None = None,
            dry_run: bool = False, say=print) -> dict:
    """Store whole grids' logs compactly, largest first, within both budgets; what was done."""
    if not budget_mib > 0 or not added_mib > 0:
        raise ValueError(f"--budget-mib={budget_mib} and --added-mib={added_mib} must be positive")
    found = per_step_logs(repo)
    unknown = sorted(set(grids or ()) - set(found))
    if unknown:
        raise ValueError(f"--grid: no per-step logs in {', '.join(unknown)} "
                         f"(grids with some: {', '.join(sorted(found)) or 'none'})")
    plan = _plan(found)
    rewrites = {g: _json_todo(files) for g, files in found.items()}
    size = {g: sum(p.lstat().st_size for p in [*(p for p in files if p in plan), *rewrites[g]])
            for g, files in found.items()}
    before = tree_bytes(repo)
    done = {"tree_before": before, "removed": 0, "added": 0, "grids": [], "left": []}
    stored: set[Path] = set()  # files that hold their bytes as they should, now or in a dry run
    for grid, files in found.items():
        stored.update(p for p in files if p not in plan)
    for grid in sorted(set(grids or found), key=lambda g: (-size[g], g)):
        todo = [p for p in found[grid] if p in plan]
        if not todo and not rewrites[grid]:
            continue  # done by an earlier run
        steps = {}
        for p in todo:
            new, packed, target = plan[p]
            if target is not None and target not in stored and target not in steps.values():
                # its twin is not stored yet: packed on its own; a later run links it
                name, packed = pack(_log_name(p), read_bytes(p))
                new, target = p.with_name(name), None
                if p == new:
                    continue
            steps[p] = target
            plan[p] = (new, packed, target)
        added = sum(len(plan[p][1]) for p in steps) + sum(map(len, rewrites[grid].values()))
        mib = size[grid] / MIB
        if done["removed"] + size[grid] > budget_mib * MIB:
            done["left"].append(grid)
            say(f"left for later: {grid} ({mib:.2f} MiB would pass --budget-mib {budget_mib})")
            continue
        if done["added"] + added > added_mib * MIB:
            done["left"].append(grid)
            say(f"left for later: {grid} ({added / MIB:.2f} MiB of new files would pass "
                f"--added-mib {added_mib})")
            continue
        for p in steps:
            new, packed, target = plan[p]
            if not dry_run:
                _store(p, new, packed, target)
            if target is None:
                stored.add(new)
        for path, data in rewrites[grid].items():
            if not dry_run:
                atomic_write_bytes(path, data)
        links = sum(t is not None for t in steps.values())
        done["removed"] += size[grid]
        done["added"] += added
        done["grids"].append(grid)
        say(f"{'would store' if dry_run else 'stored'} {grid}: {len(steps)} logs "
            f"({links} as links), {len(rewrites[grid])} JSON files, {mib:.2f} MiB -> "
            f"{added / MIB:.2f} MiB")
    after = before - done["removed"] + done["added"] if dry_run else tree_bytes(repo)
    done["tree_after"] = after
    say(f"removed {done['removed'] / MIB:.2f} MiB of old files, added {done['added'] / MIB:.2f} "
        f"MiB; tree {before / MIB:.1f} MiB -> {after / MIB:.1f} MiB"
        + ("" if done["grids"] or done["left"] else " (nothing left to compress)"))
    return done


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--budget-mib", type=float, required=True,
                   help="most MiB of old log files this run removes")
    p.add_argument("--added-mib", type=float, default=20.0,
                   help="most MiB of new files this run adds (default 20)")
    p.add_argument("--grid", action="append",
                   help="only this grid, by its path under results/ (repeatable)")
    p.add_argument("--dry-run", action="store_true", help="say what would be done; change nothing")
    p.add_argument("--repo", type=Path, default=ROOT, help=argparse.SUPPRESS)
    a = p.parse_args(argv)
    try:
        compact(a.repo, a.budget_mib, a.added_mib, a.grid, a.dry_run)
    except ValueError as e:
        p.error(str(e))
    return 0


if __name__ == "__main__":
    sys.exit(main())
