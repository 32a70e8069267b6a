"""``suite reference RESULTS_DIR GRID``: promote a finished grid into the committed reference tree
``results/reference/<machine class>/<grid>/`` with its outcomes and report, for
suite/analysis/reproduce.py to compare later grids against. Above both reproduce.py (what a
reference must record) and report.py (the report written next to it), so neither imports the other
for it.
"""

from __future__ import annotations

import json
from pathlib import Path

from suite.analysis.outcomes import outcome_markdown
from suite.analysis.report import write_report
from suite.analysis.reproduce import _env, _summary
from suite.locations import refuse_installed
from suite.results import (
    REFERENCE_ROOT,
    atomic_write_json,
    atomic_write_text,
    find_run_dirs,
)


def promote(root: Path, grid: str, ref_root: Path = REFERENCE_ROOT,
            allow_dirty: bool = False) -> Path:
    """Copy a finished grid into ``<ref_root>/<class id>/<grid>/`` (checkpoints left out), with its
    provenance in ``reference.json``; the report is regenerated there. Refuses runs of a dirty
    checkout, incomplete runs and mixed classes: a reference must be reproducible from its
    commit."""
    import shutil

    dirs = find_run_dirs(root)
    if not dirs:
        raise ValueError(f"{root}: no run directories")
    envs = {str(d.relative_to(root)): _env(d) for d in dirs}
    classes = {json.dumps(e.get("machine_class"), sort_keys=True) for e in envs.values()}
    if len(classes) != 1 or "null" in classes:
        raise ValueError(f"{root}: the runs do not record one machine class ({len(classes)} found)")
    shas = {e.get("git_sha") for e in envs.values()}
    dirty = [n for n, e in envs.items() if e.get("git_dirty") is not False]
    if (dirty or len(shas) != 1) and not allow_dirty:
        raise ValueError(f"{root}: runs from a dirty checkout ({', '.join(dirty[:3])}) or several "
                         f"commits ({len(shas)}); a reference comes from a clean checkout of one "
                         "commit (--allow-dirty to override)")
    unfinished = [str(d.relative_to(root)) for d in dirs
                  if _summary(d).get("verdict") in (None, "incomplete")]
    if unfinished:
        raise ValueError(f"{root}: incomplete runs cannot be a reference: "
                         f"{', '.join(unfinished[:5])}")
    cls = json.loads(classes.pop())
    dest = refuse_installed(Path(ref_root) / cls["id"] / grid, "suite reference")
    tmp = dest.with_name(f".{grid}.tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    for d in dirs:
        # Nested grids (<grid>/<regime or ppo_ref>/<run>) keep their folders: run names repeat
        # across them. Evidence only, as a leaderboard submission (suite/analysis/submit.py): a
        # reference run is complete, so its console log.txt says nothing that metrics.jsonl and
        # timing.jsonl do not (its tail matters for a run left without a summary, which is refused
        # above).
        shutil.copytree(d, tmp / d.relative_to(root),
                        ignore=shutil.ignore_patterns("ckpt", "policy", "error.txt", "log.txt"))
    # the main job's judgement of its controls: the report shows it
    if (Path(root) / "controls.json").is_file():
        shutil.copy2(Path(root) / "controls.json", tmp / "controls.json")
    job_path = Path(root) / "job.json"
    job = json.loads(job_path.read_text()) if job_path.is_file() else {}
    meta_path = dest.parent / "reference.json"
    meta = json.loads(meta_path.read_text()) if meta_path.is_file() else {}
    sha = shas.pop()
    meta.update({"machine_class": cls, "grids": sorted({*meta.get("grids", []), grid})})
    # the class's first grid; each grid records its own commit below
    meta.setdefault("git_sha", sha)
    meta.setdefault("jobs",
                    {})[grid] = {**{k: job.get(k)
                                    for k in ("command", "wall_time_s", "cells_trained")},
                                         "git_sha": sha}
    if dest.exists():
        shutil.rmtree(dest)
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp.rename(dest)
    atomic_write_json(meta_path, meta)
    atomic_write_text(dest / "outcomes.md", outcome_markdown(dest))
    write_report(dest)
    # A main job's report draws its controls from the sibling folder: promoted after the main grid
    # (the natural order), the controls must refresh it, or its headline figure lacks their panels.
    main = dest.parent / "main"
    if grid == "controls" and (main / "controls.json").is_file():
        write_report(main)
    return dest
