"""Compress the committed per-step logs under results/ into .xz, a few grids at a time.

    python scripts/compact_results.py --budget-mib N [--added-mib M] [--grid GRID ...] [--dry-run]

The per-step logs of a committed run (``metrics.jsonl``, ``timing.jsonl``, ``mechanism.jsonl``,
``log.txt``; suite/packed.py ``PER_STEP_LOGS``) are most of the tree's bytes and compress about
sixfold. Each tracked one is replaced by ``NAME.xz`` (suite/packed.py ``compress``: the same bytes
for the same input), checked to decompress to the original before the original is removed. Every
reader in suite/ reads either form; runs keep writing plain files.

A grid (``results/<kind>/<class>/<grid>``, named by its path under results/, e.g.
``reference/cpu-amx-native/h3-tail``) is compressed whole or not at all, the largest first. One
commit may only carry so many bytes of diff (a deleted file counts with its whole text, an added
binary file too), so the compaction goes in steps: a grid whose logs would take the removed bytes
over ``--budget-mib``, or whose .xz files would take the added bytes over ``--added-mib``, is left
for the next run, which goes on from there. Once every log is compressed a run changes nothing.
The tree's size counts the files a copy of the checkout carries (tracked, untracked, not ignored).
"""
from __future__ import annotations

import argparse
import lzma
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # this checkout's suite/, also when another one is installed

from suite.packed import PER_STEP_LOGS, SUFFIX, compress  # noqa: E402
from suite.results import atomic_write_bytes  # noqa: E402

MIB = 1 << 20
GRID_DEPTH = 3  # results/<kind>/<class>/<grid>


def _git_files(repo: Path, *flags: str) -> list[Path]:
    cmd = ["git", "-C", str(repo), "ls-files", "-z", *flags]
    out = subprocess.run(cmd, check=True, capture_output=True).stdout
    return [repo / p for p in out.decode().split("\0") if p]


def tree_bytes(repo: Path) -> int:
    """Bytes of the files a copy of the checkout carries: tracked and untracked, not ignored."""
    files = _git_files(repo, "--cached", "--others", "--exclude-standard")
    return sum(p.stat().st_size for p in files if p.is_file())


def per_step_logs(repo: Path) -> dict[str, list[Path]]:
    """Grid -> its per-step logs still stored plain, in path order ([] for a grid whose logs are all
    compressed). A log counts only in a run directory (next to a config.json): an outside
    framework's source log keeps its bytes."""
    grids: dict[str, list[Path]] = {}
    for path in _git_files(repo, "--cached", "--others", "--exclude-standard", "--", "results"):
        in_run = path.is_file() and (path.parent / "config.json").is_file()
        if path.name.removesuffix(SUFFIX) in PER_STEP_LOGS and in_run:
            rel = path.relative_to(repo / "results").parts
            files = grids.setdefault("/".join(rel[:min(GRID_DEPTH, len(rel) - 2)]), [])
            files += [path] if path.name in PER_STEP_LOGS else []
    return {grid: sorted(files) for grid, files in grids.items()}


def _packed(files: list[Path]) -> dict[Path, bytes]:
    out = {}
    for path in files:
        data = path.read_bytes()
        xz = compress(data)
        if lzma.decompress(xz) != data:  # never remove an original its .xz does not give back
            raise RuntimeError(f"{path}: the .xz does not decompress to the original")
        out[path] = xz
    return out


def compact(repo: Path, budget_mib: float, added_mib: float, grids: list[str] | None = None,
            dry_run: bool = False, say=print) -> dict:
    """Compress whole grids, largest first, within both budgets; what was done (bytes, grids)."""
    if not budget_mib > 0 or not added_mib > 0:
        raise ValueError(f"--budget-mib={budget_mib} and --added-mib={added_mib} must be positive")
    found = per_step_logs(repo)
    unknown = sorted(set(grids or ()) - set(found))
    if unknown:
        raise ValueError(f"--grid: no per-step logs in {', '.join(unknown)} "
                         f"(grids with some: {', '.join(sorted(found)) or 'none'})")
    size = {g: sum(p.stat().st_size for p in files) for g, files in found.items()}
    before = tree_bytes(repo)
    done = {"tree_before": before, "removed": 0, "added": 0, "grids": [], "left": []}
    for grid in sorted(set(grids or found), key=lambda g: (-size[g], g)):
        mib = size[grid] / MIB
        if not found[grid]:
            continue  # compressed by an earlier run
        if done["removed"] + size[grid] > budget_mib * MIB:
            done["left"].append(grid)
            say(f"left for later: {grid} ({mib:.2f} MiB would pass --budget-mib {budget_mib})")
            continue
        packed = _packed(found[grid])
        added = sum(len(x) for x in packed.values())
        if done["added"] + added > added_mib * MIB:
            done["left"].append(grid)
            say(f"left for later: {grid} ({added / MIB:.2f} MiB of .xz would pass "
                f"--added-mib {added_mib})")
            continue
        if not dry_run:
            for path, xz in packed.items():
                atomic_write_bytes(path.with_name(path.name + SUFFIX), xz)
                path.unlink()
        done["removed"] += size[grid]
        done["added"] += added
        done["grids"].append(grid)
        say(f"{'would compress' if dry_run else 'compressed'} {grid}: {len(packed)} files, "
            f"{mib:.2f} MiB -> {added / MIB:.2f} MiB")
    after = before - done["removed"] + done["added"] if dry_run else tree_bytes(repo)
    done["tree_after"] = after
    say(f"removed {done['removed'] / MIB:.2f} MiB of plain logs, added {done['added'] / MIB:.2f} "
        f"MiB of .xz; tree {before / MIB:.1f} MiB -> {after / MIB:.1f} MiB"
        + ("" if done["grids"] or done["left"] else " (nothing left to compress)"))
    return done


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--budget-mib", type=float, required=True,
                   help="most MiB of plain logs this run removes")
    p.add_argument("--added-mib", type=float, default=20.0,
                   help="most MiB of .xz files this run adds (default 20)")
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
