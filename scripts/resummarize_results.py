"""Rewrite the summary.json of every committed run (results/, tests/fixtures/) from its own logs
after the verdict rule changed.

A summary is a pure function of the per-step logs and the config (suite/results.py
``write_summary``); the leaderboard refuses a summary its logs do not give. When the rule changes,
this recomputes every committed summary and refuses to write one where anything but the verdict, its
rule text and the keys the new rule adds would change (that would be a change of numbers, not of
rule).

    .venv/bin/python scripts/resummarize_results.py [--dry-run]
"""

from __future__ import annotations

import argparse
import collections
import json
import math
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from suite.results import atomic_write_json, find_run_dirs, read_log, samples_per_step, summarize  # noqa: E402

RULE_KEYS = {"verdict", "verdict_rule", "accuracy/line_band"}


def _same(a, b) -> bool:
    """Equal, up to the summation order of a mean (the leaderboard's tolerance), NaN equal to
    NaN."""
    if isinstance(a, float) and isinstance(b, float):
        return (math.isnan(a) and math.isnan(b)) or math.isclose(a, b, rel_tol=1e-9, abs_tol=1e-12)
    return a == b


def resummarize(run_dir: Path) -> tuple[dict, dict, dict]:
    """(old summary, new summary, the summary recomputed in full) of one run directory."""
    old = json.loads((run_dir / "summary.json").read_text())
    cfg = json.loads((run_dir / "config.json").read_text())
    cfg = cfg.get("config", cfg)
    rows = read_log(run_dir, "metrics.jsonl", missing_ok=True)
    timing = {r["step"]: r for r in read_log(run_dir, "timing.jsonl", missing_ok=True)}
    merged = [{**r, **timing.get(r["step"], {})} for r in rows]
    new = summarize(merged, total_steps=cfg["steps"], threshold=cfg.get("threshold", 0.95),
                    error=old.get("error"), samples_per_step=samples_per_step(cfg))
    # every number as written; only the rule's keys
    return old, {**old, **{k: new[k] for k in RULE_KEYS}}, new


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--dry-run", action="store_true", help="count the changes; write nothing")
    args = p.parse_args(argv)
    changed: collections.Counter = collections.Counter()
    refused = []
    # the committed references and the tests' real runs
    roots = (REPO / "results", REPO / "tests" / "fixtures")
    dirs = [d for r in roots for d in find_run_dirs(r, depth=6) if (d / "summary.json").is_file()]
    for d in dirs:
        old, new, full = resummarize(d)
        other = sorted(k for k in full if k not in RULE_KEYS and not _same(old.get(k), full.get(k)))
        if other:
            refused.append(f"{d.relative_to(REPO)}: {', '.join(other)}")
            continue
        if old.get("verdict") != new["verdict"]:
            changed[f"{old.get('verdict')} -> {new['verdict']}"] += 1
        if new != old and not args.dry_run:
            atomic_write_json(d / "summary.json", new)
    print(f"{len(dirs)} summaries; verdicts changed: {dict(changed) or 'none'}")
    for line in refused:
        print(f"REFUSED (numbers would change): {line}")
    return 1 if refused else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
