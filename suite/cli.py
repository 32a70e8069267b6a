"""The ``suite`` command: ``suite <subcommand> [key=value ...]``.

Subcommands: run (one RL run), perfectible (build a perfectible set), main (the main job: the
``sanity`` grid into runs/sanity, then its table, the reproduction check against the committed
reference of this machine class, report and leaderboard), table (print a results table), bench (step
time split; engine vs HF generate), mismatch (step-0 mismatch of every precision flow),
sweep (a named grid as a Hydra multirun: ``suite sweep grid=sanity launcher=local jobs=2``),
report (the reproducibility report of a results directory), leaderboard (the static site),
transfer (lm-eval transfer index of runs' base vs final checkpoints: docs/transfer.md),
reference (copy a finished grid into results/reference/<machine class>/), fingerprint (the
numerics fingerprint of this machine class: smoke steps of every flow vs the committed one),
trl-run (the sanity test trained by TRL's GRPOTrainer, written as a bundle: docs/bundle.md),
import (a run of another framework, e.g. ``suite import verl METRICS.jsonl ...``, as a bundle).
Every subcommand validates its config before any compute; a bad value is one line naming
the field, exit code 2.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

from rich.console import Console

from suite.console import make_console

USAGE = __doc__


def _console() -> Console:
    """Rich console; nothing cut when writing to a file or a pipe (CI logs, sweep cell logs)."""
    return make_console()


def _configs(args: list[str]):
    import torch

    from suite.rl import config

    cfg = config.load(args)
    torch.set_num_threads(cfg.threads)
    return cfg


def cmd_run(args: list[str]) -> int:
    """One RL run (or its resumption) into <out>/<name>/<task>__<algorithm>__<precision>__s<seed>/;
    nproc=N starts N ranks through torchrun (docs/distributed.md)."""
    from suite import dist
    from suite.rl.train import run

    cfg = _configs(args)
    world = dist.from_env()
    if world is None and cfg.nproc * cfg.nnodes > 1:  # `suite run nproc=N`: torchrun starts N ranks of this command
        return dist.launch(["run", *args], cfg.nproc, cfg.nnodes)
    run_dir = run(cfg, _console())
    return _print_summary(run_dir) if world is None or world["rank"] == 0 else 0


def _print_summary(run_dir: Path) -> int:
    import json

    s = json.loads((run_dir / "summary.json").read_text())
    _console().print(f"{run_dir}: verdict [bold]{s['verdict']}[/], peak accuracy {s['accuracy/peak']:.3f} at step "
                    f"{s['accuracy/peak_step']}, final {s['accuracy/final']:.3f}, "
                    f"step-0 k3 KL {s.get('mismatch/step0/kl_k3', float('nan')):.2e}")
    return 0


def cmd_perfectible(args: list[str]) -> int:
    """Build (or read from the cache) the base policy and the perfectible set of this config."""
    from suite.rl import perfectible
    from suite.rl.data import prepare_data

    cfg = _configs(args)
    console = _console()
    _, data_dir = prepare_data(cfg, console)
    _, prov = perfectible.load(data_dir)
    console.print(perfectible.describe(prov))
    console.print(f"written to {data_dir}")
    return 0


def cmd_main(args: list[str]) -> int:
    """The main job: the ``sanity`` grid (every precision flow x grpo, grpo_token_tis, pg_seq_is,
    one seed) on the embedded default, side by side on the local cores, into ``runs/sanity`` (ignored
    by git); then the grid table, the reproduction check against the committed reference of this
    machine class, the report and the leaderboard, all next to the runs. Nothing tracked by git is
    written. Extra ``key=value`` arguments go to every cell."""
    from rich.table import Table

    from suite.analysis import leaderboard, outcomes, report, reproduce
    from suite.experiments import sweep
    from suite.numerics import machine
    from suite.results import atomic_write_json, atomic_write_text, env_info

    t0 = time.time()
    # The embedded grid needs no hub: say so to every library (a user's explicit setting wins).
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
    plan = sweep.plan_grid(["grid=sanity", *args])  # validates every cell first
    root = plan.cells[0].root
    todo = [c for c in plan.cells if sweep.state(c) != "complete"]
    code = sweep.main(["grid=sanity", "launcher=local", *args])
    console = _console()
    atomic_write_text(root / "outcomes.md", outcomes.outcome_markdown(root))
    head, rows, text = outcomes.mismatch_lead(root)
    lead = Table(*head, title="mismatch first (step 0, mean over each flow's runs)")
    for row in rows:
        lead.add_row(*row)
    console.print(lead)
    console.print(text, highlight=False)

    doc = reproduce.check(root, "sanity")
    reproduce.write(root, doc)
    table = Table(*reproduce.HEAD, title=f"reproduction on machine class {(doc['machine_class'] or {}).get('id')}")
    for row in reproduce.table_rows(doc):
        table.add_row(*row)
    console.print(table)
    console.print(doc["statement"], highlight=False)

    out = report.write_report(root)
    site = leaderboard.build([root], root / "leaderboard")
    atomic_write_json(root / "job.json", {  # what `suite reference` records as the reference's provenance
        "command": " ".join(["suite", "main", *args]), "wall_time_s": round(time.time() - t0, 1),
        "cells": len(plan.cells), "cells_trained": len(todo), "machine_class": doc["machine_class"],
        "git_sha": env_info()["git_sha"]})
    trained = (f"trained {len(todo)} of {len(plan.cells)} cells" if todo else
               f"trained nothing: all {len(plan.cells)} cells were already complete in {root} (delete it, or pass "
               "out=DIR, to compute them again)")
    console.print(f"main job: {trained}; wall time {time.time() - t0:.0f} s on machine class "
                  f"{machine.label(doc['machine_class'])}.\n  results      {root}\n  table        {root / 'outcomes.md'}"
                  f"\n  reproduction {root / 'reproduction.md'}\n  report       {out / 'index.html'}\n  leaderboard  {site}",
                  highlight=False)
    return code


def cmd_table(args: list[str]) -> int:
    """suite table [RESULTS_DIR]: the outcome table of a results directory (default runs/sanity)."""
    from suite.analysis import outcomes

    if args and args[0] in ("-h", "--help"):
        print(cmd_table.__doc__)
        return 0
    root = Path(args[0] if args else "runs/sanity")
    if not root.is_dir():
        raise ValueError(f"{root}: no such results directory")
    if not any(root.glob("*/summary.json")):
        raise ValueError(f"{root}: no run in it (no <run>/summary.json)")
    _console().print(outcomes.outcome_table(root))
    return 0


def cmd_grids(args: list[str]) -> int:
    """suite grids: every grid (``suite sweep grid=NAME``) and regime (``regime=NAME``) with its axes, number of
    cells, steps per cell and wall time per machine class: measured where a committed reference ran the grid,
    else estimated from the reference runs of the same kind of cell (sequential), else not given."""
    from rich.table import Table

    from suite.experiments import grids
    from suite.results import REFERENCE_ROOT
    from suite.rl.schema import REGIMES

    if args:
        if args[0] in ("-h", "--help"):
            print(cmd_grids.__doc__)
            return 0
        raise ValueError(f"suite grids takes no arguments (got {' '.join(args)!r})")
    console = _console()
    rows = grids.catalogue(REFERENCE_ROOT)
    classes = sorted({cls for r in rows for cls in r["time"]})
    table = Table("grid", "cells", "axes", "steps (tier)", *classes,
                  title="grids; wall time per machine class: m = measured as the committed reference ran it, "
                        "e = estimate, its cells one after another")
    for row in rows:
        axes = " x ".join(f"{len(v)} {k}" for k, v in row["axes"].items())
        times = [f"{row['time'][c][1] / 60:.0f} min {row['time'][c][0][0]}" if c in row["time"] else "-" for c in classes]
        table.add_row(row["grid"], str(row["cells"]), axes, f"{','.join(map(str, row['steps']))} ({row['tiers'][0]})",
                      *times)
    console.print(table)
    regimes = Table("regime", "sets", "what it tests", title="regimes (regime=NAME, on top of the tier)")
    for name, r in REGIMES.items():
        regimes.add_row(name, " ".join(f"{k}={v}" for k, v in r["set"].items()) or "-", r["doc"])
    console.print(regimes)
    return 0


def cmd_reference(args: list[str]) -> int:
    """suite reference RESULTS_DIR [--grid NAME] [--allow-dirty]: commit-ready copy of a finished grid into
    results/reference/<machine class>/<grid>/ (the reference later runs of this class are compared with)."""
    import argparse

    from suite.analysis import reference

    p = argparse.ArgumentParser(prog="suite reference", description=cmd_reference.__doc__)
    p.add_argument("results_dir", type=Path)
    p.add_argument("--grid", default="sanity")
    p.add_argument("--allow-dirty", action="store_true")
    ns = p.parse_args(args)
    dest = reference.promote(ns.results_dir, ns.grid, allow_dirty=ns.allow_dirty)
    _console().print(f"reference written to {dest} (with {dest.parent / 'reference.json'}); commit it to make it the "
                     "reference of this machine class", highlight=False)
    return 0


def cmd_fingerprint(args: list[str]) -> int:
    """suite fingerprint [--write] [gemm=auto|native|emulated]: smoke-tier steps of every precision flow,
    compared with the committed numerics fingerprint of this machine class (--write regenerates it)."""
    from suite.analysis import fingerprint

    return fingerprint.cli(args, _console())


def cmd_bench(args: list[str]) -> int:
    """Step-time split of a few steps (engine vs HF generate); nproc=1,2 measures data-parallel scaling;
    --vs trl runs TRL's GRPOTrainer on the same config and prints both step times and their ratio."""
    from suite.experiments import bench

    return bench.main(args)


def cmd_bench_memory(args: list[str]) -> int:
    """suite bench-memory [--vocab N] [--batch B] [--response R] [--precision P] [--reward-workers K]: peak memory and
    time of an update with gradient_checkpointing and logprob_chunk on and off, and the reward pool's speed-up."""
    from suite.experiments import bench_memory

    return bench_memory.main(args)


def cmd_sweep(args: list[str]) -> int:
    from suite.experiments import sweep

    return sweep.main(args)


def cmd_mismatch(args: list[str]) -> int:
    """Step-0 training-inference mismatch of every precision flow on the same policy and samples."""
    from suite.experiments import bench

    return bench.mismatch_main(args)


def cmd_report(args: list[str]) -> int:
    """suite report RESULTS_DIR [--out DIR]: the reproducibility report of a results directory."""
    from suite.analysis import report

    return report.cli(args)


def cmd_hypotheses(args: list[str]) -> int:
    """suite hypotheses [--class CLASS] [--out DIR]: the per-hypothesis science report of a machine class's
    committed grids (results/hypotheses/<class>/ by default)."""
    from suite.analysis import hypotheses

    return hypotheses.cli(args)


def cmd_leaderboard(args: list[str]) -> int:
    """suite leaderboard RESULTS_DIR... [--out DIR]: the static leaderboard site."""
    from suite.analysis import leaderboard

    return leaderboard.cli(args)


def cmd_transfer(args: list[str]) -> int:
    """suite transfer RUN_DIR... [--groups embedded|paper] [--sigma ...]: Transferability Index into each bundle."""
    from suite.rl import evaluate

    return evaluate.cli(args)


def cmd_trl_run(args: list[str]) -> int:
    """suite trl-run [key=value ...]: the sanity test of a suite config trained by TRL (the trl extra)."""
    from suite.rl import config

    if not (args and args[0] in ("-h", "--help")):
        config.load(args)  # bad input is refused before TRL (and its import-time notices) loads
    try:
        from suite.experiments import trl_bridge
    except ImportError as e:
        raise ValueError(f"trl-run needs TRL ({e}); install the extra: pip install 'lowprec-rl-suite[trl]'") from None
    return trl_bridge.cli(args)


def cmd_import(args: list[str]) -> int:
    """suite import verl METRICS.jsonl --out DIR ...: another framework's logged run as a bundle."""
    from suite.experiments import verl_import

    if not args or args[0] != "verl":
        raise ValueError("import: name the framework (supported: verl), e.g. suite import verl METRICS.jsonl --out DIR")
    return verl_import.cli(args[1:])


def cmd_doctor(args: list[str]) -> int:
    """suite doctor [out=DIR]: the machine acceptance table (placement, dtypes, mismatch order, FP8 path, fp16
    overflow, FSDP2 vs plain, kill and resume), every row measured on this machine; exit 1 if one fails."""
    from suite.experiments import doctor

    return doctor.main(args)


COMMANDS = {"run": cmd_run, "perfectible": cmd_perfectible, "main": cmd_main, "table": cmd_table, "bench": cmd_bench,
            "mismatch": cmd_mismatch, "sweep": cmd_sweep, "grids": cmd_grids, "bench-memory": cmd_bench_memory,
            "report": cmd_report, "hypotheses": cmd_hypotheses, "leaderboard": cmd_leaderboard, "transfer": cmd_transfer,
            "reference": cmd_reference, "fingerprint": cmd_fingerprint, "trl-run": cmd_trl_run, "import": cmd_import,
            "doctor": cmd_doctor}


# Subcommands whose key=value arguments are run-config fields (suite/rl/schema.py: RunConfig).
CONFIG_COMMANDS = ("run", "perfectible", "bench", "mismatch", "main")


def _field_docs(cls) -> dict[str, str]:
    """The docstring under each field of a config dataclass (the string literal that follows it)."""
    import ast
    import inspect
    import textwrap

    body = ast.parse(textwrap.dedent(inspect.getsource(cls))).body[0].body
    return {a.target.id: " ".join(b.value.value.split()) for a, b in zip(body, body[1:])
            if isinstance(a, ast.AnnAssign) and isinstance(a.target, ast.Name) and isinstance(b, ast.Expr)
            and isinstance(b.value, ast.Constant) and isinstance(b.value.value, str)}


def field_help(cls, prefix: str = "") -> list[str]:
    """Every field as ``name=default`` and its docstring, nested configs as ``section.name``."""
    import dataclasses
    import textwrap

    lines, docs = [], _field_docs(cls)
    for f in dataclasses.fields(cls):
        default = f.default if f.default is not dataclasses.MISSING else f.default_factory()
        if dataclasses.is_dataclass(default):
            lines += field_help(type(default), f"{prefix}{f.name}.")
            continue
        lines.append(f"  {prefix}{f.name}={default}")
        lines += textwrap.wrap(docs.get(f.name, ""), 96, initial_indent=" " * 6, subsequent_indent=" " * 6)
    return lines


def _config_help(command: str, args: list[str]) -> int | None:
    """``--help`` (every field, default and docstring) and ``--cfg job`` (the resolved, validated config)
    for the subcommands that take config fields; None when neither was asked."""
    import dataclasses
    import json

    from suite.rl import config

    if "-h" in args or "--help" in args:
        print(f"usage: suite {command} [key=value ...] [--cfg job]\n\n{COMMANDS[command].__doc__ or ''}\n\n"
              "Config fields (key=default; the tier fills what is not given; --cfg job prints the result):")
        print("\n".join(field_help(config.RunConfig)))
        return 0
    if "--cfg" in args:
        i = args.index("--cfg")
        if args[i + 1:i + 2] != ["job"]:
            raise ValueError("--cfg: only `--cfg job` (the resolved config of this command line) is supported")
        cfg = config.load(args[:i] + args[i + 2:])
        print(json.dumps(dataclasses.asdict(cfg), indent=2))
        return 0
    return None


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    if not argv or argv[0] in ("-h", "--help", "help"):
        print(USAGE)
        return 0
    if argv[0] not in COMMANDS:
        from suite.names import unknown

        print(f"suite: {unknown('command', argv[0], COMMANDS)}", file=sys.stderr)
        return 2
    try:
        if argv[0] in CONFIG_COMMANDS and (done := _config_help(argv[0], argv[1:])) is not None:
            return done
        return COMMANDS[argv[0]](argv[1:])
    except ValueError as e:
        print(f"suite {argv[0]}: error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
