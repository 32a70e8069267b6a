"""``suite bench --vs trl``: the suite's RL step and TRL's GRPOTrainer round side by side, from one
command.

Both sides train the same embedded policy on the same perfectible prompts with the same group size,
response budget, precision, optimizer and number of updates per rollout batch (TRL's recipe is the
suite config translated by ``suite.experiments.trl_bridge.grpo_args``, which refuses what it cannot
map). A suite step and a TRL round are the same unit of work: sample prompts_per_step x
samples_per_prompt responses, score them, then updates_per_step optimizer updates. Times are medians
over the steps after the first.

What each side does per step:
- suite: its own sampler (batched decode with a KV cache, ``suite/numerics/engine.py``), one no-grad
forward of
  the trainer for the old log-probs and the mismatch, then the updates (forward + backward each);
- TRL: ``model.generate`` (transformers) inside ``_generate_and_score_completions`` (which also
  computes the old log-probs when it needs them), then the updates. The bridge that records TRL's
  bundle adds one no-grad trainer forward per round (``time/logprob_s``); it is subtracted, so the
  TRL column is what TRL alone does.
"""

from __future__ import annotations

import dataclasses
import json
import statistics
import tempfile
from pathlib import Path

from rich.table import Table

from suite.experiments import bench_targets
from suite.results import atomic_write_json, read_jsonl


def _medians(run_dir: Path, drop_last: bool = False) -> dict:
    """Medians of timing.jsonl without the first step (start-up); ``drop_last`` also drops the last
    row, which in a bundle written by an outside loop runs from the last round's sampling to the end
    (no sampling in it)."""
    rows = read_jsonl(run_dir / "timing.jsonl")
    rows = rows[1:-1] if drop_last else rows[1:]
    keys = set.intersection(*(set(r) for r in rows)) - {"step"}
    return {k: statistics.median(r[k] for r in rows) for k in keys}


def _completions(run_dir: Path, group: int) -> list[int]:
    """Completions sampled in each step, counted from the recorded per-prompt pass rates."""
    return [len(r["reward/pass_rates"]) * group for r in read_jsonl(run_dir / "metrics.jsonl")]


def compare(cfg, console) -> dict:
    """Run both sides on ``cfg`` (validated; ``cfg.out`` is replaced by a scratch directory)."""
    from rich.console import Console

    from suite.experiments import trl_bridge
    from suite.rl.train import run

    trl_bridge.grpo_args(cfg, "/nonexistent")  # refuse an unmappable config before any compute
    with tempfile.TemporaryDirectory(prefix="vs-trl-") as tmp:
        ours = run(dataclasses.replace(cfg, out=tmp, name="suite"), Console(quiet=True))
        theirs = trl_bridge.run(dataclasses.replace(cfg, out=tmp, name="trl"), console)
        out = {"suite": _medians(ours), "trl": _medians(theirs, drop_last=True),
               "suite_completions": _completions(ours, cfg.samples_per_prompt),
               "trl_completions": _completions(theirs, cfg.samples_per_prompt)}
    s, t = out["suite"], out["trl"]
    out["suite_step_s"] = s["time/step_s"]
    # the bridge's own recording forward removed
    out["trl_step_s"] = t["time/step_s"] - t["time/logprob_s"]
    out["ratio"] = out["trl_step_s"] / out["suite_step_s"]
    return out


# ``suite bench --vs trl --write-baseline``: this class's comparison, one entry per precision
TRL_DIR = bench_targets.BASELINE_DIR / "trl"  # <machine class>.json


def record(path: Path, cls: dict, cfg, r: dict, setting: dict) -> None:
    """Write ``r`` (``compare``'s result) as ``cfg.precision``'s entry of the class's file, keeping
    the other precisions' entries (each names the commit and command that measured it)."""
    old = json.loads(path.read_text()) if path.is_file() else {}
    entries = {**old.get("precisions", {}), cfg.precision: {**r, "setting": setting}}
    atomic_write_json(path, {"schema_version": bench_targets.SCHEMA, "machine_class": cls,
                             "precisions": dict(sorted(entries.items()))})


def _record(class_id: str) -> dict:
    return bench_targets.load_baseline(TRL_DIR, class_id,
                                       "suite bench --vs trl precision=P --write-baseline")


def f_table(class_id: str) -> str:
    """docs/trl.md's table for ``class_id``: each recorded precision, both sides' steps and
    phases."""
    rec = _record(class_id)
    lines = ["| precision | suite step (s) | TRL step (s) | TRL / suite | suite sampling (s) | TRL "
             "sampling + scoring (s) | suite log-probs (s) | suite updates (s) | TRL updates (s) |",
             "|---|" + "---|" * 8]
    for prec, r in rec["precisions"].items():
        s, t = r["suite"], r["trl"]
        phases = (s["time/sample_s"], t["time/sample_s"], s["time/logprob_s"], s["time/update_s"],
                  r["trl_step_s"] - t["time/sample_s"])  # TRL's updates: its step after sampling
        lines.append(f"| {prec} | {r['suite_step_s']:.3f} | {r['trl_step_s']:.3f} | "
                     f"{r['ratio']:.2f}x | " + " | ".join(f"{x:.3f}" for x in phases) + " |")
    return "\n".join(lines)


def f_ratio(class_id: str, precision: str) -> str:
    """TRL's step over the suite's for one recorded precision of ``class_id`` ("1.27x")."""
    return f"{_record(class_id)['precisions'][precision]['ratio']:.2f}x"


def main(args: list[str]) -> int:
    from suite.console import make_console
    from suite.numerics import machine
    from suite.results import git
    from suite.rl import config

    write = "--write-baseline" in args
    args = [a for a in args if a != "--write-baseline"]

    try:
        import trl
    except ImportError as e:
        raise ValueError(f"--vs trl needs TRL ({e}): pip install 'lowprec-rl-suite[trl]'") from None
    if not any(a.startswith("steps=") for a in args):
        args = [*args, "steps=6"]
    cfg = config.load(args)
    console = make_console()
    r = compare(cfg, console)
    s, t = r["suite"], r["trl"]
    n = len(r["suite_completions"]) - 1
    table = Table("", "suite", "TRL GRPOTrainer", title=(
        f"{cfg.precision}, {cfg.tier} tier: {cfg.prompts_per_step} prompts x "
        f"{cfg.samples_per_prompt} samples, {cfg.sampling.max_new_tokens} new tokens max, "
        f"{cfg.updates_per_step} updates per step; medians over the suite's {n} steps after the "
        f"first and TRL's {n - 1} rounds after the first (its last round has no sampling); machine "
        f"class {machine.describe(cfg.gemm, cfg.threads)['id']}"))
    table.add_row("step (s)", f"{r['suite_step_s']:.3f}", f"{r['trl_step_s']:.3f}")
    table.add_row("sampling (s)", f"{s['time/sample_s']:.3f}",
                  f"{t['time/sample_s']:.3f} (with TRL's scoring)")
    table.add_row("old log-probs (s)", f"{s['time/logprob_s']:.3f}", "in sampling")
    table.add_row("updates and the rest (s)", f"{s['time/update_s'] + s['time/other_s']:.3f}",
                  f"{r['trl_step_s'] - t['time/sample_s']:.3f}")
    table.add_row("completions per step", ", ".join(map(str, sorted(set(r["suite_completions"])))),
                  ", ".join(map(str, sorted(set(r["trl_completions"])))))
    console.print(table)
    target = bench_targets.trl_row(r["trl_step_s"], r["suite_step_s"])
    console.print(f"TRL / suite step time: {r['ratio']:.2f}x (target >= {target['target']:.1f}x: "
                  f"{'met' if target['met'] else 'MISSED'})")
    if write:
        cls = machine.describe(cfg.gemm, cfg.threads)
        path = TRL_DIR / f"{cls['id']}.json"
        record(path, cls, cfg, r, {"command": " ".join(["suite", "bench", "--vs", "trl", *args]),
                                   "trl": trl.__version__, "git_sha": git("rev-parse", "HEAD"),
                                   # the code's state: an earlier precision's entry is not a change
                                   "git_dirty": bool(git("status", "-s", "--", ".",
                                                         f":(exclude){TRL_DIR.parent}"))})
        console.print(f"{cfg.precision} written to {path}")
    return 0
