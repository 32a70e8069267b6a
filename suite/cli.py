"""The ``suite`` command: ``suite <command> [key=value ...]`` (or ``python -m suite``).

Each command is one ``cmd_*`` function, listed in ``COMMANDS``: below, or in
suite/analysis/commands.py for the commands that read result directories; its docstring is its
``--help``, and the docstring's first sentence its line in ``suite --help``. The commands that take
run-config fields (``CONFIG_COMMANDS``) answer ``--help`` with every field, its default, docstring
and allowed values (read from the registries), and ``--cfg job`` with the resolved config. No
``--help`` imports torch. Other tools' habits (``--precision bf16``, ``logger=wandb``,
``precision=BF16``, ``optimizer.lr=``) are translated or refused with the spelling to use
(suite/rl/cmdline.py). Every command validates its input before any compute; a bad value is one line
naming the field, exit code 2.
"""

from __future__ import annotations

import faulthandler
import inspect
import os
import sys
from pathlib import Path

from suite.analysis.commands import (
    cmd_hypotheses,
    cmd_leaderboard,
    cmd_reference,
    cmd_report,
    cmd_submit,
    cmd_table,
    cmd_warnings,
)

# The rich console of every command: nothing cut when writing to a file or a pipe (CI logs, sweep
# cell logs).
from suite.console import make_console as _console


def _configs(args: list[str]):
    import torch

    from suite.rl import config

    cfg, origins = config.load_layers(args)
    torch.set_num_threads(cfg.threads)
    return cfg, origins


def cmd_run(args: list[str]) -> int:
    """One RL run (or its resumption) into <out>/<name>/<task>__<algorithm>__<precision>__s<seed>/.

    nproc=N starts N ranks through torchrun (docs/distributed.md)."""
    from suite import dist
    from suite.rl.train import run

    cfg, origins = _configs(args)
    world = dist.from_env()
    # `suite run nproc=N`: torchrun starts N ranks of this command
    if world is None and cfg.nproc * cfg.nnodes > 1:
        return dist.launch(["run", *args], cfg.nproc, cfg.nnodes)
    run_dir = run(cfg, _console(), origins=origins)
    return _print_summary(run_dir) if world is None or world["rank"] == 0 else 0


def _print_summary(run_dir: Path) -> int:
    import json

    s = json.loads((run_dir / "summary.json").read_text())
    _console().print(f"{run_dir}: verdict [bold]{s['verdict']}[/], peak accuracy "
                     f"{s['accuracy/peak']:.3f} at step "
                    f"{s['accuracy/peak_step']}, final {s['accuracy/final']:.3f}, "
                    f"step-0 k3 KL {s.get('mismatch/step0/kl_k3', float('nan')):.2e}")
    return 0


def cmd_perfectible(args: list[str]) -> int:
    """Build (or read from the cache) the base policy and the perfectible set of this config."""
    from suite.rl import perfectible
    from suite.rl.data import prepare_data

    cfg, _ = _configs(args)
    console = _console()
    _, data_dir = prepare_data(cfg, console)
    _, prov = perfectible.load(data_dir)
    console.print(perfectible.describe(prov))
    console.print(f"written to {data_dir}")
    return 0


def cmd_main(args: list[str]) -> int:
    """The main job: the main flows and the controls into runs/main and runs/controls, then the
    controls' judgement, the table, reproduction checks, report and leaderboard.

    The ``main`` grid (fp32, fp16, bf16, FP8 rollouts under plain GRPO) and the ``controls`` grid
    (known-bad recipes beside their corrections), three seeds, on the embedded default, side by side
    on the local cores (ignored by git); exit 3 when a control does not behave as its committed
    evidence says. Nothing tracked by git is written. Extra ``key=value`` arguments go to every cell
    (suite/experiments/main_job.py)."""
    from suite.experiments import main_job

    return main_job.run(args, _console())


def cmd_grids(args: list[str]) -> int:
    """suite grids: every grid and regime with its axes, cells, steps and wall time per machine
    class.

    Grids run with ``suite sweep grid=NAME``, regimes with ``regime=NAME``. The wall time is
    measured where a committed reference ran the grid, else estimated from the reference runs of the
    same kind of cell (sequential), else not given."""
    from suite.experiments import grids

    return grids.cli(args, _console())


def cmd_fingerprint(args: list[str]) -> int:
    """suite fingerprint [--write] [gemm=auto|native|emulated]: check this machine's numerics
    fingerprint.

    Runs smoke-tier steps of every precision flow and compares them with the committed numerics
    fingerprint of this machine class; exit 1 when the numbers moved.

      --write       regenerate the committed fingerprint of this machine class instead
      gemm=BACKEND  auto (default), native or emulated low-precision GEMMs"""
    from suite.analysis import fingerprint

    return fingerprint.cli(args, _console())


def cmd_bench(args: list[str]) -> int:
    """Step-time split of a few steps in every flow, each flow's step over bf16's against its
    target, engine vs HF generate.

    --compare prints the medians over this machine class's committed baseline (results/bench/),
    --write-baseline records this run as it; nproc=1,2 measures data-parallel scaling; --vs trl
    runs TRL's GRPOTrainer on the same config and prints both step times and their ratio against
    its target (with --write-baseline into results/bench/trl/); --profile splits the steps of
    fp32, bf16 and the flows with a target by kind of operation (torch.profiler: GEMMs, attention,
    casts), with --write-baseline into results/bench/profile/."""
    from suite.experiments import bench

    return bench.main(args)


def cmd_bench_memory(args: list[str]) -> int:
    """suite bench-memory [options]: peak memory and time of an update, with and without the memory
    savers.

    An update with gradient_checkpointing and logprob_chunk on and off, and the reward pool's
    speed-up. Options:
    --vocab N, --batch B, --prompt P, --response R, --steps S, --precision fp32|bf16|fp16,
    --reward-workers K (suite bench-memory --help gives their defaults); --plan: suite plan's
    predictions vs measured peaks (docs/tasks.md)."""
    from suite.experiments import bench_memory

    return bench_memory.main(args)


def cmd_sweep(args: list[str]) -> int:
    """suite sweep grid=NAME [key=value ...] [launcher=local jobs=N] [dry_run=true]: run a named
    grid as a Hydra multirun."""
    from suite.experiments import sweep

    return sweep.main(args)


def cmd_mismatch(args: list[str]) -> int:
    """Step-0 training-inference mismatch of every precision flow on the same policy and samples."""
    from suite.experiments import bench

    return bench.mismatch_main(args)


def cmd_attribute(args: list[str]) -> int:
    """suite attribute [key=value ...] [--batches N] [--seeds N] [--sources a,b] [--top-p P] [--out
    DIR]: the mismatch of a stack by source.

    On the same batches, from a matched pair (the trainer replaying the sampler's own decode loop:
    mismatch 0) each source switched on alone, and from the full stack each switched off alone, with
    the interaction: per source its effect and share of k3 KL, mean |dp|, the token-multiplicative
    error and the fraction of ratios outside [0.9, 1.1], with bootstrap intervals over batches x
    seeds; a table and a waterfall figure (docs/attribution.md). Sources: kernels, fp8_weights
    (FP8-rollout flows), kv_fp8, top_p, staleness, micro_batch. key=value are run-config fields
    (precision=bf16, engine=vllm, tier=...).

      --batches N   prompt batches of the run's size (default 4)
      --seeds N     sampling seeds per batch (default 2)
      --sources     a subset of the flow's stack (default: all of it)
      --top-p P     the nucleus of the top_p source (default 0.8, TRL issue 7269's setting)
      --out DIR     default <out>/attribute/<precision>__<engine>"""
    from suite.experiments import attribute

    return attribute.cli(args)


def cmd_gate(args: list[str]) -> int:
    """suite gate [key=value ...] [--calibrate] [--flows a,b] [--batches N] [--seeds N] [--band
    FILE] [--ledger FILE]: a CI gate on step-0 mismatch.

    Measures each flow's step-0 mismatch on a fixed probe (the config's policy, its first
    perfectible prompts, fixed seeds) and compares it with a band (mean + 3 sd over batches x seeds)
    calibrated with --calibrate and stored with the torch, vLLM and transformers versions and the
    machine class; exit 1 outside it. Published framework thresholds are printed beside it. Each
    calibration and check is appended to a ledger keyed by those versions and the machine class
    (docs/attribution.md).

      --calibrate measure --batches x --seeds times per flow and write the band (default: every main
      flow)
      --flows       flows to calibrate or check (default: those of the band file)
      --band FILE   default results/gate/<machine class>__<tier>.json
      --ledger FILE default ledger.jsonl next to the band"""
    from suite.experiments import gate

    return gate.main(args)


def cmd_transfer(args: list[str]) -> int:
    """suite transfer RUN_DIR... [options]: write the Transferability Index into each run's bundle
    (docs/transfer.md).

      RUN_DIR...           run directories, or results directories holding them
      --groups NAME        embedded (the tiny policy's tasks, default) or paper (arXiv 2507.00432)
      --sigma SPEC         fixed sigma per group for TI v2, e.g. math=5,other=3,non=4
      --backend NAME       hf (lm-eval HFLM, CPU or GPU; default) or vllm (GPU)
      --device DEV         torch device for hf (default: cuda if available, else cpu)
      --batch-size N       evaluation batch size (default 64)
      --limit N            documents per task (quick checks only)
      --include DIR        an extra lm-eval task directory (repeatable)"""
    from suite.rl import evaluate

    return evaluate.cli(args)


def cmd_trl_run(args: list[str]) -> int:
    """suite trl-run [key=value ...]: the sanity test of a suite config trained by TRL's GRPOTrainer
    (the trl extra).

    Written as a bundle to <out>/<name>/ (name default trl; docs/bundle.md). TRL runs fp32, bf16 or
    fp16 and grpo, dr_grpo, dapo or grpo_vanilla; anything else is refused before any compute."""
    from suite.rl import config

    config.load(args)  # bad input is refused before TRL (and its import-time notices) loads
    try:
        from suite.experiments import trl_bridge
    except ImportError as e:
        raise ValueError(f"trl-run needs TRL ({e}); install the extra: pip install "
                         "'lowprec-rl-suite[trl]'") from None
    return trl_bridge.cli(args)


def cmd_import(args: list[str]) -> int:
    """suite import verl METRICS.jsonl --out DIR [options]: another framework's logged run as a
    bundle.

      METRICS.jsonl          verl's file-logger JSONL ($VERL_FILE_LOGGER_PATH) or a flat export
      --out DIR              results directory; the bundle goes to OUT/<task>__...__s<seed>
      --task, --algorithm, --precision, --seed, --verl-version, --git-sha, --torch (required) what
      ran
      --gpu NAME --gpus N GPU model and count (e.g. 'NVIDIA H100 80GB HBM3'), or --cpu NAME without
      GPUs
      --package NAME=VERSION more package versions (repeatable)
      --steps N              planned steps (default: the last logged)
      --threshold X          pass threshold on training accuracy (default 0.95)
      --model NAME           the model trained (name or path)
      --command CMD          the command line that started the run
      --config FILE          verl's resolved config (JSON or YAML), kept as the recipe
      --git-dirty            the code that ran had uncommitted changes"""
    from suite.experiments import verl_import

    if not args or args[0] != "verl":
        raise ValueError("import: name the framework (supported: verl), e.g. suite import verl "
                         "METRICS.jsonl --out DIR")
    return verl_import.cli(args[1:])


def cmd_doctor(args: list[str]) -> int:
    """suite doctor [out=DIR]: the acceptance table (placement, dtypes, mismatch order, FP8 path,
    FP4 quantisers, fp16 overflow, FSDP2 = plain, kill + resume, memory plan), measured here, in
    DIR/doctor.json (default runs/doctor); exit 1 on a fail."""
    from suite.experiments import doctor
    return doctor.main(args)


def cmd_accept(args: list[str]) -> int:
    """suite accept STAGE [out=DIR] [budget=SECONDS]: the staged acceptance on a borrowed GPU
    (prepare on the CPU, then numerics, fingerprint, cells), each stage one folder with
    summary.json; exit 1 on a failed check (docs/gpu.md). numerics takes only=CHECK,...; cells
    takes limit=N (the sanity grid's first N cells), only=ALGORITHM:PRECISION,... and any run
    field."""
    from suite.experiments import accept
    return accept.main(args)


def cmd_plan(args: list[str]) -> int:
    """suite plan [key=value ...] [gpu_gib=G]: the predicted peak memory per rank of a run config,
    itemised.

    suite run's config fields (task=sanity_r1d tier=full nproc=8 ...), planned against this
    machine's device or a GPU of G GiB (gpu_gib=79.1: an 80 GB H100); exit 1 when it does not fit,
    naming the knobs that would make it fit (suite/rl/plan.py, suite/numerics/memory.py,
    docs/tasks.md)."""
    from suite.rl import plan

    return plan.cmd_plan(args)


def cmd_ls(args: list[str]) -> int:
    """suite ls tasks|flows|algorithms|grids|regimes|tiers|models|recipes: list the names a field
    takes, with what each means.

    One line per entry, read from the registry itself (the task files, the precision table, the
    algorithm table, ...); ``suite ls`` alone lists every list. ``suite ls tasks include_path=DIR``
    adds the task files of your own folder(s), as ``suite run`` finds them (docs/own_task.md)."""
    from suite.experiments import listing

    if args and args[0] in ("-h", "--help"):
        print(command_help(cmd_ls))
        return 0
    include = [a.split("=", 1)[1] for a in args if a.startswith("include_path=")]
    args = [a for a in args if not a.startswith("include_path=")]
    if include and args != ["tasks"]:
        raise ValueError("include_path= goes with the task list only: suite ls tasks "
                         "include_path=DIR")
    if len(args) > 1:
        raise ValueError(f"suite ls takes one list name (got {' '.join(args)!r}); lists: "
                         f"{', '.join(listing.LISTS)}")
    for i, what in enumerate(args or listing.LISTS):
        print(("\n" if i else "")
              + "\n".join(listing.lines(what, include[-1] if include else None)))
    return 0


COMMANDS = {"run": cmd_run, "perfectible": cmd_perfectible, "main": cmd_main, "table": cmd_table,
            "bench": cmd_bench, "mismatch": cmd_mismatch, "attribute": cmd_attribute,
            "gate": cmd_gate, "sweep": cmd_sweep, "grids": cmd_grids, "ls": cmd_ls,
            "bench-memory": cmd_bench_memory, "report": cmd_report, "hypotheses": cmd_hypotheses,
            "leaderboard": cmd_leaderboard, "submit": cmd_submit, "transfer": cmd_transfer,
            "reference": cmd_reference, "fingerprint": cmd_fingerprint, "trl-run": cmd_trl_run,
            "import": cmd_import, "doctor": cmd_doctor, "plan": cmd_plan, "accept": cmd_accept,
            "warnings": cmd_warnings}


# Commands whose key=value arguments are run-config fields (suite/rl/schema.py: RunConfig): their
# --help lists the fields, --cfg job prints the resolved config, and other tools' habits are
# translated (suite/rl/cmdline.py).
CONFIG_COMMANDS = ("run", "perfectible", "bench", "mismatch", "main", "trl-run")
# Commands whose own --help is fast and says more than their docstring; every other --help is the
# docstring.
OWN_HELP = ("sweep", "bench-memory", "ls")
# Commands whose key=value arguments are sweeps (a comma separates values) and whose habits are
# translated too.
SWEEP_COMMANDS = ("sweep", "main")


def _summary(fn) -> str:
    """A command's line in ``suite --help``: the first sentence of its docstring, less its
    synopsis."""
    from suite.experiments.listing import _first_sentence

    first = inspect.cleandoc(fn.__doc__ or "").split("\n\n")[0]
    line = _first_sentence(first.split(": ", 1)[1] if first.startswith("suite ") and ": " in first
                           else first)
    return line[:1].upper() + line[1:]


def command_help(fn) -> str:
    """A command's ``--help``: its docstring, the synopsis before the first ``: `` as the usage
    line."""
    doc = inspect.cleandoc(fn.__doc__ or "")
    synopsis, _, rest = doc.partition(": ")
    if not doc.startswith("suite ") or "\n\n" in synopsis:
        return doc
    return f"usage: {synopsis}\n\n{rest[:1].upper()}{rest[1:]}"


def usage() -> str:
    """``suite --help``: every command of COMMANDS with its one line."""
    width = max(map(len, COMMANDS))
    return "\n".join([
        "usage: suite <command> [key=value ...]      (python -m suite <command> ... is the same)",
        "", "commands:", *(f"  {name:<{width}}  {_summary(fn)}" for name, fn in COMMANDS.items()),
        "", "suite <command> --help describes a command and its fields; suite ls says what each "
            "task, flow,",
        "algorithm, grid, regime, tier, model and recipe name means. Config fields are key=value "
        "(Hydra's",
        "syntax: seed=0,1,2 sweeps in suite sweep), never --key value."])


def _config_help(command: str, args: list[str]) -> int | None:
    """``--help`` and ``--cfg job`` (the resolved, validated config, each field's layer after
    ``#``) for the commands that take config fields; None when neither was asked."""
    import dataclasses

    if "-h" in args or "--help" in args:
        from suite.experiments import listing

        print(listing.config_help(command, COMMANDS[command].__doc__ or ""))
        return 0
    if "--cfg" in args:
        from suite.rl import config, layers

        i = args.index("--cfg")
        if args[i + 1:i + 2] != ["job"]:
            raise ValueError("--cfg: only `--cfg job` (the resolved config of this command line) "
                             "is supported")
        cfg, origins = config.load_layers(args[:i] + args[i + 2:])
        print(layers.render(dataclasses.asdict(cfg), origins))
        return 0
    return None


def entry(argv: list[str] | None = None) -> int:
    """The program's entry point (the ``suite`` console script, ``python -m suite``, a fork server's
    cell): ``main``, then ``gc.freeze()`` before the interpreter exits. Its exit is otherwise a
    full garbage collection over every object torch and transformers made at import, 1.2-1.5 s of
    CPU on a 2-core machine per ``suite`` process (a main job ends ~30 cells); frozen objects are
    skipped by that collection and freed with the process. Nothing else of the exit changes: atexit
    handlers, non-daemon threads and the flush of stdout and stderr run as before. Only on a
    return: an exception leaves as it would have."""
    import gc

    code = main(argv)
    gc.freeze()
    return code


def main(argv: list[str] | None = None) -> int:
    from suite import lifetime

    # A crash in native code (a kernel, gloo) prints every thread's Python stack, not only "exitcode
    # -11".
    if sys.__stderr__ is not None and not faulthandler.is_enabled():
        faulthandler.enable(sys.__stderr__)
    # a sweep's cell: it ends with the sweep (docs/distributed.md, "Lifetime")
    lifetime.honour_tie()
    argv = sys.argv[1:] if argv is None else argv
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    try:
        return _dispatch(argv)
    # `suite run --help | head`: the reader has gone; end as `yes | head` does, no traceback
    except BrokenPipeError:
        # Python's flush at exit would fail again
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 128 + 13  # killed by SIGPIPE, in the shell's terms


def _dispatch(argv: list[str]) -> int:
    if not argv or argv[0] in ("-h", "--help", "help"):
        print(usage())
        return 0
    command, args = argv[0], argv[1:]
    if command not in COMMANDS:
        from suite.names import unknown

        print(f"suite: {unknown('command', command, COMMANDS)}", file=sys.stderr)
        return 2
    try:
        if command in CONFIG_COMMANDS or command in SWEEP_COMMANDS:
            from suite.rl import cmdline

            args = cmdline.translate(args, sweep=command in SWEEP_COMMANDS)
        if command == "trl-run" and not any(a.startswith("name=") for a in args):
            args = ["name=trl", *args]  # TRL's runs go to <out>/trl/ (what --cfg job shows, too)
        if command in CONFIG_COMMANDS and (done := _config_help(command, args)) is not None:
            return done
        if command not in OWN_HELP and ("-h" in args or "--help" in args):
            print(command_help(COMMANDS[command]))
            return 0
        return COMMANDS[command](args)
    except ValueError as e:
        print(f"suite {command}: error: {e}", file=sys.stderr)
        return 2
    # argparse's --help (0) and usage errors (2, message printed), or a sys.exit
    except SystemExit as e:
        if e.code is None or isinstance(e.code, int):
            return e.code or 0
        print(e.code, file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
