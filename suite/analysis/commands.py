"""The ``suite`` commands that read result directories: the outcome table (``suite table``), the
committed references (``suite reference``), the reproducibility report (``suite report``), the
per-hypothesis report (``suite hypotheses``), leaderboard submissions (``suite submit``), the
static leaderboard (``suite leaderboard``) and the early-warning tally (``suite warnings``).

Like every command of suite/cli.py (which lists these in ``COMMANDS`` and dispatches to them), each
is one ``cmd_*`` function whose docstring is its ``--help``; nothing heavy is imported before the
command runs.
"""

from __future__ import annotations

from pathlib import Path

# The rich console of every command: nothing cut when writing to a file or a pipe (CI logs, sweep
# cell logs).
from suite.console import make_console as _console


def cmd_table(args: list[str]) -> int:
    """suite table [RESULTS_DIR]: print the outcome table of a results directory (default
    runs/main)."""
    from suite.analysis import outcomes

    root = Path(args[0] if args else "runs/main")
    if not root.is_dir():
        raise ValueError(f"{root}: no such results directory")
    # `suite run out=OUT` writes OUT/<name>/<run>/: a folder of experiments gets one table per
    # experiment
    roots = ([root] if any(root.glob("*/summary.json"))
             else sorted({p.parent.parent for p in root.glob("*/*/summary.json")}))
    if not roots:
        raise ValueError(f"{root}: no run in it (no <run>/summary.json, nor "
                         "<name>/<run>/summary.json)")
    for r in roots:
        _console().print(outcomes.outcome_table(r))
    return 0


def cmd_reference(args: list[str]) -> int:
    """suite reference RESULTS_DIR [--grid NAME] [--allow-dirty]: copy a finished grid into the
    committed references.

    The copy goes to results/reference/<machine class>/<grid>/ (the reference later runs of this
    class are compared with), ready to commit."""
    import argparse

    p = argparse.ArgumentParser(prog="suite reference", description=cmd_reference.__doc__)
    p.add_argument("results_dir", type=Path)
    p.add_argument("--grid", help="the grid's name (default: the folder's, e.g. runs/main -> main)")
    p.add_argument("--allow-dirty", action="store_true")
    ns = p.parse_args(args)  # before the import below, so --help answers at once
    from suite.analysis import reference

    dest = reference.promote(ns.results_dir, ns.grid or ns.results_dir.resolve().name,
                             allow_dirty=ns.allow_dirty)
    _console().print(f"reference written to {dest} (with {dest.parent / 'reference.json'}); commit "
                     "it to make it the reference of this machine class", highlight=False)
    return 0


def cmd_report(args: list[str]) -> int:
    """suite report RESULTS_DIR [--out DIR] [--svg]: write the reproducibility report of a results
    directory.

      RESULTS_DIR  directory holding run directories (or up to two levels of experiment folders)
      --out DIR    output folder (default: RESULTS_DIR/report)
      --svg        also write every figure as SVG (the report links it beside the PNG)"""
    from suite.analysis import report

    return report.cli(args)


def cmd_hypotheses(args: list[str]) -> int:
    """suite hypotheses [--class CLASS] [--root DIR] [--out DIR] [--svg]: the per-hypothesis science
    report.

    Reads a machine class's committed grids.

      --class CLASS  machine class (default: this machine's)
      --root DIR     reference root (default: results/reference)
      --out DIR      output folder (default: results/hypotheses/<class>)
      --svg          also write every figure as SVG"""
    from suite.analysis import hypotheses

    return hypotheses.cli(args)


def cmd_submit(args: list[str]) -> int:
    """suite submit RUN_DIR... --out DIR [--name NAME]: check runs with the leaderboard's
    validators, write a submission.

      RUN_DIR...      run directories (or folders holding them)
      --out DIR the submission folder to write (nothing is written if any run would be rejected)
      --check DIR...  check submission folders again instead (what CI runs on a pull request)"""
    from suite.analysis import submit

    return submit.cli(args)


def cmd_leaderboard(args: list[str]) -> int:
    """suite leaderboard RESULTS_DIR... [--out DIR]: build the static leaderboard site.

      RESULTS_DIR...  results directories (run bundles, or up to two levels of experiment folders)
      --out DIR       site folder (default: RESULTS_DIR/leaderboard of the first one)"""
    from suite.analysis import leaderboard

    return leaderboard.cli(args)


def cmd_warnings(args: list[str]) -> int:
    """suite warnings RESULTS_DIR...: how often each early-warning signal (IS-weight ESS,
    gradient-norm spikes, entropy) fired before the collapses of these runs, and in the runs that
    did not collapse (docs/collapse.md)."""
    from suite.analysis import early_warnings

    if not args or any(a.startswith("-") or not Path(a).is_dir() for a in args):
        raise ValueError("suite warnings: give result directories "
                         f"(got {' '.join(args) or 'none'})")
    print(early_warnings.markdown(early_warnings.tally([Path(a) for a in args])))
    return 0
