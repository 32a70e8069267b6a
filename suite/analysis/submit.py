"""``suite submit RUN_DIR... --out DIR``: check run bundles with the leaderboard's own validators
and write a submission folder, ready for a pull request; ``suite submit --check DIR`` checks such a
folder again (CI).

A submission is all or nothing: if any bundle would be rejected by the board
(leaderboard.validate_run: schema, provenance, config hash, a summary recomputed from the logs, a
command that recomposes, evidence behind an outside loop's numbers; and no seed counted twice),
nothing is written and every reason is printed. Otherwise ``DIR`` holds a copy of each run
(checkpoints and saved policies left out) and ``submission.json``: who submitted, with which suite,
and the sha256 of every file, so that ``--check`` also catches a file edited after submitting.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

from suite.analysis import leaderboard
from suite.results import atomic_write_json

MANIFEST = "submission.json"
SCHEMA = 1
# Large or not evidence (log.txt also as committed, .xz).
LEFT_OUT = ("ckpt", "policy", "log.txt", "log.txt.xz", "error.txt", "report", "leaderboard")


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def _files(run_dir: Path) -> dict[str, str]:
    return {str(p.relative_to(run_dir)): _sha256(p) for p in sorted(run_dir.rglob("*"))
            if p.is_file()}


def validate(run_dirs: list[Path]) -> tuple[list[dict], list[dict]]:
    """(records, rejected) of the bundles under ``run_dirs``, as the board would take them."""
    records, rejected = [], []
    for d in run_dirs:
        for b in leaderboard.find_bundles(Path(d)):
            try:
                leaderboard._admit(leaderboard.validate_run(b), records)
            except leaderboard.Rejected as e:
                rejected.append({"source": str(b), "reason": str(e)})
    return records, rejected


def _suite_version() -> str:
    """The commit of the suite doing the checks (what a reviewer reruns them with)."""
    try:
        return subprocess.run(["git", "rev-parse", "HEAD"], cwd=Path(__file__).parent,
                              capture_output=True, text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def submit(run_dirs: list[Path], out: Path, name: str) -> tuple[Path | None, list[dict]]:
    """Validate, then write the submission folder ``out`` (atomically: a temp folder renamed).
    Returns (out, []) or (None, rejected) when any bundle fails; nothing is written then."""
    out = Path(out)
    if not name or not name.strip():
        raise ValueError("suite submit: give --name (who submits; shown with the entries)")
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise ValueError(f"suite submit: {out} exists and is not empty; choose a new folder")
    records, rejected = validate(run_dirs)
    if not records and not rejected:
        raise ValueError(f"suite submit: no run directories under {', '.join(map(str, run_dirs))}")
    if rejected:
        return None, rejected
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=out.parent, prefix=f".{out.name}.", suffix=".tmp"))
    try:
        runs = []
        for rec in records:
            dest = tmp / rec["run"]
            if dest.exists():
                raise ValueError(f"suite submit: two runs named {rec['run']}; give them distinct "
                                 "directory names")
            shutil.copytree(rec["source"], dest, ignore=shutil.ignore_patterns(*LEFT_OUT))
            runs.append({"run": rec["run"], "from": rec["source"],
                         "config_hash": rec["provenance"]["config_hash"],
                         "machine_class": rec["class_id"], "files": _files(dest)})
        atomic_write_json(tmp / MANIFEST,
                          {"schema": SCHEMA, "name": name.strip(), "suite_commit": _suite_version(),
                                           "runs": runs})
        again, bad = validate([tmp])  # the copy is what is submitted: check it, not the originals
        if bad or len(again) != len(records):
            raise ValueError(f"suite submit: the copied bundles do not validate: {bad}")
        os.chmod(tmp, 0o755)
        if out.exists():
            out.rmdir()
        os.rename(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return out, []


def check(folder: Path) -> list[str]:
    """Problems of a submission folder (empty when it is sound): a manifest that is missing or does
    not list exactly the runs there, a file whose sha256 changed, and every reason the board would
    reject a run for."""
    folder = Path(folder)
    path = folder / MANIFEST
    if not path.is_file():
        return [f"{folder}: no {MANIFEST} (make submissions with `suite submit`)"]
    try:
        manifest = json.loads(path.read_text(encoding="utf-8"))
        listed = {r["run"]: r for r in manifest["runs"]}
    except (ValueError, KeyError, TypeError) as e:
        return [f"{path}: unreadable ({e})"]
    problems = []
    present = {b.name for b in leaderboard.find_bundles(folder)} if any(folder.iterdir()) else set()
    problems += [f"{r}: in the folder but not in {MANIFEST}" for r in sorted(present - set(listed))]
    problems += [f"{r}: listed in {MANIFEST} but missing" for r in sorted(set(listed) - present)]
    for run, entry in sorted(listed.items()):
        if run not in present:
            continue
        now = _files(folder / run)
        changed = sorted(k for k in set(now) | set(entry["files"])
                         if now.get(k) != entry["files"].get(k))
        if changed:
            problems.append(f"{run}: changed since it was submitted: {', '.join(changed)}")
    _, rejected = validate([folder])
    problems += [f"{Path(r['source']).name}: {r['reason']}" for r in rejected]
    return problems


def cli(args: list[str]) -> int:
    p = argparse.ArgumentParser(prog="suite submit", description="Check run bundles with the "
                                                                 "leaderboard's validators "
                                "and write a submission folder (or --check one).")
    p.add_argument("run_dirs", nargs="*", type=Path, metavar="RUN_DIR", help="run directories, or "
                                                                             "folders holding them")
    p.add_argument("--out", type=Path, help="submission folder to write (must not exist or be "
                                            "empty)")
    p.add_argument("--name", help="who submits (default: git config user.name)")
    p.add_argument("--check", type=Path, nargs="+", metavar="DIR",
                   help="check submission folders instead (CI)")
    ns = p.parse_args(args)
    if ns.check:
        bad = 0
        for folder in ns.check:
            problems = check(folder)
            for line in problems:
                print(f"refused {folder}: {line}")
            print(f"{folder}: {'ok' if not problems else f'{len(problems)} problem(s)'}")
            bad += bool(problems)
        return 1 if bad else 0
    if not ns.run_dirs or not ns.out:
        raise ValueError("suite submit: give RUN_DIR... and --out DIR (or --check DIR)")
    name = ns.name or subprocess.run(["git", "config", "user.name"], capture_output=True,
                                     text=True).stdout.strip()
    out, rejected = submit(ns.run_dirs, ns.out, name)
    for r in rejected:
        print(f"refused {r['source']}: {r['reason']}")
    if out is None:
        print(f"nothing written: {len(rejected)} bundle(s) would be rejected by the leaderboard")
        return 1
    n = len(json.loads((out / MANIFEST).read_text())["runs"])
    print(f"{out}: {n} run(s) accepted by the leaderboard's validators; submission written "
          f"({MANIFEST} lists them)")
    return 0
