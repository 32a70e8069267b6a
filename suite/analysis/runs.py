"""Loading result directories: which folders are runs, and each run read into a ``Run`` without
raising.

The shared base of the analysis stage: suite/analysis/report.py (the document),
suite/analysis/outcomes.py (the outcome tables), suite/analysis/reproduce.py and
suite/analysis/render.py read runs through it, so none of them has to import another for it.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

from suite.analysis import bundle
from suite.packed import read_bytes, read_log, run_file
from suite.results import RUN_NAME, SCHEMA_VERSION, find_run_dirs, samples_per_step, summarize


# ---------------------------------------------------------------------------- loading
@dataclass
class Run:
    """One run directory as read back; `summary` is always there (recomputed if summary.json is
    missing)."""

    dir: Path
    label: str  # the directory name, prefixed with its parent's when runs are nested
    task: str
    algorithm: str
    precision: str
    seed: int
    summary: dict
    config: dict | None = None
    config_hash: str | None = None
    env: dict | None = None
    metrics: list[dict] = field(default_factory=list)
    error: str | None = None  # one line
    detail: str | None = None  # the tail of error.txt (or log.txt of a run that left no summary)
    problems: list[str] = field(default_factory=list)
    # "suite", or the outside loop and its version ("trl 1.16.0"; docs/bundle.md)
    framework: str = bundle.SUITE

    @property
    def verdict(self) -> str:
        return self.summary.get("verdict") or "incomplete"

    @property
    def status(self) -> str:
        """The verdict, with incomplete runs that recorded an error shown as failed."""
        return "failed" if self.verdict == "incomplete" and self.error else self.verdict


def _read_json(path: Path, problems: list[str], versioned: bool = False):
    if not path.is_file():
        problems.append(f"{path.name} missing")
        return None
    try:
        obj = json.loads(path.read_text(encoding="utf-8"))
    except ValueError as e:
        problems.append(f"{path.name} unreadable ({e})")
        return None
    if versioned:
        v = obj.get("schema_version") if isinstance(obj, dict) else None
        if not isinstance(v, int) or v > SCHEMA_VERSION:
            problems.append(f"{path.name} has schema_version={v!r}, this code reads <= "
                            f"{SCHEMA_VERSION}; ignored")
            return None
    return obj


def _tail(run_dir: Path, name: str, lines: int = 20) -> str | None:
    """The last ``lines`` lines of a run's text file ``name`` (log.txt may be NAME.xz), or None."""
    path = run_file(run_dir, name)
    if path is None:
        return None
    text = read_bytes(path).decode("utf-8", errors="replace")
    return "\n".join(text.rstrip().splitlines()[-lines:])


def load_bundle(run_dir: Path, root: Path) -> Run:
    """Read one run directory without raising on missing or broken files (they become
    `problems`)."""
    problems: list[str] = []
    cfg_file = _read_json(run_dir / "config.json", problems)
    cfg = cfg_file.get("config") if isinstance(cfg_file, dict) else None
    summary = _read_json(run_dir / "summary.json", problems, versioned=True)
    env = _read_json(run_dir / "env.json", problems, versioned=True)
    metrics = []
    try:
        metrics = read_log(run_dir, "metrics.jsonl", missing_ok=True)
        if timing := {r.get("step"): r for r in read_log(run_dir, "timing.jsonl", missing_ok=True)}:
            metrics = [{**r, **timing.get(r.get("step"), {})} for r in metrics]
    except ValueError as e:
        problems.append(str(e))
    detail = _tail(run_dir, "error.txt")
    error = (summary or {}).get("error") or (detail.splitlines()[-1] if detail else None)
    if summary is None:
        # Killed before summary.json was written: the summary is a pure function of the metrics.
        if cfg:
            summary = summarize(metrics, total_steps=cfg.get("steps") or max(1, len(metrics)),
                                threshold=cfg.get("threshold", 0.95),
                                error=error or (None if metrics else "no metrics were written"),
                                samples_per_step=samples_per_step(cfg))
        else:
            summary = {"verdict": "incomplete", "steps_done": len(metrics)}
        detail = detail or _tail(run_dir, "log.txt")
        problems.append("summary recomputed from metrics.jsonl" if cfg
                        else "no summary and no config")
    m = RUN_NAME.match(run_dir.name)
    ident = {**m.groupdict(),
             **{k: (cfg or {}).get(k) for k in ("task", "algorithm", "precision", "seed") if cfg},
             **{k: summary[k] for k in ("task", "algorithm", "precision", "seed")
                if summary.get(k) is not None}}
    label = run_dir.name if run_dir.parent == root else f"{run_dir.parent.name}/{run_dir.name}"
    framework = (bundle.framework_label(env) if bundle.framework_of(env)["name"] != bundle.SUITE
                 else bundle.SUITE)
    # An outside loop's algorithm is its own implementation, and score centering (arXiv 2609.20807)
    # a correction on top of the named loss: each gets its own cells and panels, never pooled with
    # the plain recipe.
    centred = bool(((cfg or {}).get("algo") or {}).get("score_centering"))
    algorithm = (str(ident["algorithm"]) + ("+centering" if centred else "")
                 + ("" if framework == bundle.SUITE else f" [{framework}]"))
    return Run(dir=run_dir, label=label, task=str(ident["task"]), algorithm=algorithm,
               framework=framework, precision=str(ident["precision"]), seed=int(ident["seed"]),
               summary=summary, config=cfg, config_hash=(cfg_file or {}).get("config_hash")
               or summary.get("config_hash"), env=env,
               metrics=metrics, error=error, detail=detail, problems=problems)


def load_runs(root: Path) -> list[Run]:
    """Every run under `root`; ValueError (one line) when there is none."""
    root = Path(root)
    if not root.is_dir():
        raise ValueError(f"{root}: no such directory")
    dirs = find_run_dirs(root)
    if not dirs:
        raise ValueError(f"{root}: no run directories found (expected "
                         "<task>__<algorithm>__<precision>__s<seed>/ holding "
                         "config.json/summary.json/metrics.jsonl, directly or up to two levels "
                         "down)")
    return [load_bundle(d, root) for d in dirs]


def load_summaries(root: Path) -> list[dict]:
    """summary.json of every run under `root` (nested up to two levels), with `_dir`; [] when there
    are none."""
    out = []
    for d in find_run_dirs(root):
        if (d / "summary.json").is_file():
            s = json.loads((d / "summary.json").read_text())
            s["_dir"] = str(d)
            out.append(s)
    return out
