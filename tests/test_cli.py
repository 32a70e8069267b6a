"""The command line's conventions: --help on the config subcommands lists every field with its
default, docstring and allowed values, --cfg job prints the resolved config, every command answers
--help without loading torch, ``suite ls`` lists what each registry name means, other tools' habits
are translated or refused with the spelling to use, and bad input is one line with exit code 2."""

from __future__ import annotations

import dataclasses
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from suite import cli
from suite.rl import compose, config


def _leaf_fields(cls, prefix=""):
    for f in dataclasses.fields(cls):
        default = f.default if f.default is not dataclasses.MISSING else f.default_factory()
        if dataclasses.is_dataclass(default):
            yield from _leaf_fields(type(default), f"{prefix}{f.name}.")
        else:
            yield f"{prefix}{f.name}"


@pytest.mark.parametrize("command", cli.CONFIG_COMMANDS)
def test_help_lists_every_config_field_with_its_docstring(command, capsys):
    assert cli.main([command, "--help"]) == 0
    out = capsys.readouterr().out
    listed = {line.split("=", 1)[0].strip() for line in out.splitlines() if line.startswith("  ")
              and
              not line.startswith("   ") and "=" in line}
    assert listed == set(_leaf_fields(config.RunConfig))
    assert "  precision=fp32\n      Precision flow" in out
    assert "  vllm.tensor_parallel_size=1\n      Devices one engine shards" in out


def test_cfg_job_prints_the_resolved_config(capsys):
    assert cli.main(["run", "tier=smoke", "precision=bf16", "--cfg", "job"]) == 0
    out = capsys.readouterr().out
    printed = yaml.safe_load(out)  # YAML, each value's layer in a comment (suite/rl/layers.py)
    assert "precision: bf16  # command line\n" in out and "  lr: 0.0001  # tier smoke\n" in out
    want = dataclasses.asdict(config.load(["tier=smoke", "precision=bf16"]))
    assert printed == want and printed["precision"] == "bf16" and printed["steps"] == want["steps"]


@pytest.mark.parametrize("argv, words", [
    (["run", "--cfg", "job", "precision=bogus"], "precision: unknown value 'bogus'"),
    (["run", "--cfg", "hydra"], "--cfg: only `--cfg job`"),
    (["table", "/nonexistent/results"], "no such results directory"),
    (["grids", "sanity"], "suite grids takes no arguments"),
    (["transfer", "/nonexistent/run"], "no such run or results directory"),
    (["trl-run", "bogus=1"], "bogus: unknown config field"),
    (["report", "/nonexistent/results"], "no such directory"),
    (["reference", "/nonexistent/results"], "no run directories"),
    (["bogus"], "command: unknown value 'bogus'"),
])
def test_bad_input_is_one_line_and_exit_2(argv, words, capsys, tmp_path):
    assert cli.main(argv) == 2
    err = capsys.readouterr().err
    assert words in err and err.count("\n") == 1


def test_table_of_a_directory_without_runs_is_refused(tmp_path, capsys):
    assert cli.main(["table", str(tmp_path)]) == 2
    assert "no run in it" in capsys.readouterr().err
    assert cli.main(["table", "--help"]) == 0


def _reference_run(root, cls, name, seconds, **cfg):
    d = root / cls / "sanity" / name
    d.mkdir(parents=True)
    d.joinpath("summary.json").write_text(json.dumps({"time/total_s": seconds}))
    d.joinpath("config.json").write_text(json.dumps({"config": cfg}))


def test_grids_lists_every_grid_and_regime(capsys):
    from suite.experiments import grids
    from suite.rl import schema

    assert cli.main(["grids"]) == 0
    out = capsys.readouterr().out
    for name in [*grids.GRIDS, *schema.REGIMES]:
        assert name in out, name


def test_grid_time_is_measured_where_a_reference_ran_it_else_summed_from_matching_cells(tmp_path):
    from suite.experiments import grids

    cls = "cpu-test"
    (tmp_path / cls).mkdir()
    jobs = {"sanity": {"wall_time_s": 600.0}, "fp4": {"wall_time_s": 60.0, "cells_trained": 21}}
    (tmp_path / cls / "reference.json").write_text(json.dumps({"jobs": jobs}))
    # fp8 grid: flows x grpo, grpo_token_tis x 3 seeds, small tier (arith3, 100 steps, regime base).
    flows = grids.get("fp8")["axes"]["precision"]
    for i, flow in enumerate(flows):
        for seconds, algo in ((10.0 * (i + 1), "grpo"), (30.0 * (i + 1), "grpo_token_tis")):
            _reference_run(tmp_path, cls, f"arith3__{algo}__{flow}__s0", seconds, task="arith3",
                           tier="small", regime="base", precision=flow, steps=100,
                           updates_per_step=2)
            _reference_run(tmp_path, cls, f"arith3__{algo}__{flow}__s1", 1000.0, task="arith3",
                           # another recipe: not mixed in
                           tier="small", regime="base", precision=flow, steps=100,
                           updates_per_step=4)
    rows = {r["grid"]: r for r in grids.catalogue(tmp_path)}
    assert rows["sanity"]["time"][cls] == ("measured", 600.0)
    # Each cell takes the mean of its flow's runs (20 s x (i+1)), over 2 algorithms x 3 seeds per
    # flow.
    want = sum(20.0 * (i + 1) * 6 for i in range(len(flows)))
    assert rows["fp8"]["time"][cls] == ("estimate", pytest.approx(want))
    assert rows["fp8"]["cells"] == len(flows) * 6 and rows["fp8"]["steps"] == [100]
    # no run of those regimes: no figure, no extrapolation
    assert cls not in rows["collapse-search"]["time"]
    # a job of 21 of its 63 cells measures those, not the grid
    assert cls not in rows["fp4"]["time"]


# ---- suite --help, python -m suite, every command's --help
# ------------------------------------------
ROOT = Path(__file__).resolve().parent.parent


def test_suite_help_lists_every_command_with_a_line(capsys):
    assert cli.main(["--help"]) == 0
    out = capsys.readouterr().out
    for name in cli.COMMANDS:
        line = next((ln for ln in out.splitlines() if ln.split()[:1] == [name]), None)
        assert line is not None and len(line.split()) > 2, name  # the name, then a description


def test_python_dash_m_suite_is_the_suite_command():
    # `torchrun ... -m suite run` (the nnodes refusal's advice) and `python -m suite` need
    # suite/__main__.py.
    done = subprocess.run([sys.executable, "-m", "suite", "--help"], cwd=ROOT, capture_output=True,
                          text=True)
    assert done.returncode == 0 and "usage: suite <command>" in done.stdout
    done = subprocess.run([sys.executable, "-m", "suite", "run", "--precision", "bf16"], cwd=ROOT,
                          capture_output=True, text=True)
    assert done.returncode == 2 and "use precision=bf16" in done.stderr


def test_the_programs_entry_freezes_the_heap_and_keeps_the_exit_that_python_gives():
    """``cli.entry`` (console script, ``python -m suite``, fork-server cells) skips the exit's full
    collection by ``gc.freeze()`` and changes nothing else of it: the command's exit code, what it
    printed, atexit handlers and a buffered write flushed at exit all survive."""
    code = ("import atexit, gc, sys\nfrom suite import cli\n"
            "atexit.register(lambda: print('atexit ran', gc.get_freeze_count() > 0))\n"
            "sys.stdout.write('buffered, no newline')\n"
            "sys.exit(cli.entry(sys.argv[1:]))\n")
    ok = subprocess.run([sys.executable, "-c", code, "grids"], cwd=ROOT, capture_output=True,
                        text=True)
    assert ok.returncode == 0, ok.stderr
    assert ok.stdout.startswith("buffered, no newline") and "main" in ok.stdout
    assert ok.stdout.rstrip().endswith("atexit ran True")
    bad = subprocess.run([sys.executable, "-c", code, "run", "precision=bf17"], cwd=ROOT,
                         capture_output=True, text=True)
    assert bad.returncode == 2 and "precision" in bad.stderr, bad.stderr
    assert bad.stdout.rstrip().endswith("atexit ran True")
    assert 'suite = "suite.cli:entry"' in (ROOT / "pyproject.toml").read_text()
    assert "sys.exit(entry())" in (ROOT / "suite" / "__main__.py").read_text()


def test_every_command_answers_help_without_loading_torch():
    # One fresh interpreter asks every command for --help in turn and reports the first heavy import
    # it sees.
    code = ("import contextlib, io, sys\nfrom suite import cli\nfor name in cli.COMMANDS:\n"
            "    with contextlib.redirect_stdout(io.StringIO()) as out:\n        rc = "
            "cli.main([name, '--help'])\n    heavy = [m for m in ('torch', 'transformers', 'vllm', "
            "'trl') if m in sys.modules]\n    print(name, rc, len(out.getvalue().splitlines()), "
            "','.join(heavy) or '-')\n")
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    rows = [line.split() for line in done.stdout.splitlines()]
    assert [r[0] for r in rows] == list(cli.COMMANDS)
    for name, rc, lines, heavy in rows:
        assert rc == "0" and int(lines) >= 3 and heavy == "-", (name, rc, lines, heavy)


def _argparse_options(fn, args=("--help",)) -> set[str]:
    import contextlib
    import io

    with contextlib.redirect_stdout(io.StringIO()) as out, pytest.raises(SystemExit):
        fn(list(args))
    return set(re.findall(r"(?<![\w-])--[a-z][a-z-]+", out.getvalue())) - {"--help"}


@pytest.mark.parametrize("command, module, function", [
    ("report", "suite.analysis.report", "cli"), ("hypotheses", "suite.analysis.hypotheses", "cli"),
    ("leaderboard", "suite.analysis.leaderboard", "cli"), ("transfer", "suite.rl.evaluate", "cli"),
    ("import", "suite.experiments.verl_import", "cli"),
    ("reference", "suite.analysis.commands", "cmd_reference")])
def test_a_command_help_names_every_option_its_parser_takes(command, module, function, capsys):
    # The fast --help is the command's docstring; its parser lives with the heavy code. They must
    # agree.
    import importlib

    options = _argparse_options(getattr(importlib.import_module(module), function))
    capsys.readouterr()
    assert options and cli.main([command, "--help"]) == 0
    shown = capsys.readouterr().out
    assert {o for o in options if o not in shown} == set()


# ---- value lists in --help and suite ls
# ------------------------------------------------------------
def _registries():
    from suite.numerics.flows import FLOWS
    from suite.rl import schema
    from suite.rl.algo_table import ALGORITHMS
    from suite.tasks.registry import task_names

    return {"precision": FLOWS, "algorithm": ALGORITHMS, "task": task_names(), "tier": schema.TIERS,
            "regime": schema.REGIMES, "engine": schema.ENGINES}


def _field_block(out: str, field: str) -> str:
    """The lines of one field in --help: its ``  field=default`` line up to the next field's."""
    lines = out.splitlines()
    i = next(i for i, ln in enumerate(lines) if ln.startswith(f"  {field}="))
    j = next((j for j in range(i + 1, len(lines)) if not lines[j].startswith("    ")), len(lines))
    return " ".join(lines[i:j])


def test_run_help_lists_the_allowed_values_of_every_registry_field_and_recipe(capsys):
    from suite.rl.algo_table import ALGORITHMS, in_words
    from suite.rl.schema import REGIMES

    assert cli.main(["run", "--help"]) == 0
    out = capsys.readouterr().out
    for field, table in _registries().items():
        values = re.search(r"values: (.*?)(?: \(suite ls \w+\))?$",
                           _field_block(out, field)).group(1)
        assert [v.strip() for v in values.replace("  ", " ").split(",")] == list(table), field
    assert "recipe=FILE.yaml" in out
    assert "(REGIMES below)" in out  # the regime field's promise, kept by the section below
    regimes = out.split("Regimes (regime=NAME")[1]
    for name, r in REGIMES.items():
        assert re.search(rf"^    {re.escape(name)} +{re.escape(r['doc'])}", regimes, re.M), name
    algos = out.split("Algorithms (algorithm=NAME")[1]
    for name, a in ALGORITHMS.items():
        assert re.search(rf"^    {name} +{re.escape(in_words(a))}$", algos, re.M), name


@pytest.mark.parametrize("what, table", [
    ("flows", "suite.numerics.flows:FLOWS"), ("algorithms", "suite.rl.algo_table:ALGORITHMS"),
    ("tasks", "suite.tasks.registry:task_names"), ("grids", "suite.experiments.grids:GRIDS"),
    ("regimes", "suite.rl.schema:REGIMES"), ("tiers", "suite.rl.schema:TIERS"),
    ("models", "suite.rl.models:PRESETS")])
def test_ls_lists_every_registry_entry_with_a_description(what, table, capsys):
    import importlib

    module, name = table.split(":")
    entries = getattr(importlib.import_module(module), name)
    entries = entries() if callable(entries) else entries
    assert cli.main(["ls", what]) == 0
    rows = {ln.split()[0]: ln.split(None, 1)[1] for ln in capsys.readouterr().out.splitlines()[1:]}
    assert set(entries) <= set(rows) and all(len(rows[e]) > 10 for e in entries)


def test_ls_algorithms_says_what_each_name_computes(capsys):
    assert cli.main(["ls", "algorithms"]) == 0
    rows = {ln.split()[0]: ln for ln in capsys.readouterr().out.splitlines()[1:]}
    # The row settings, in words: grpo here is Dr.GRPO's advantage and loss with clip-higher,
    # grpo_vanilla is GRPO's.
    assert ("Dr.GRPO advantage and loss (r - mean, no std" in rows["grpo"]
            and "[0.8, 1.28] (clip-higher)" in rows["grpo"])
    assert ("GRPO advantage and loss ((r - mean) / std" in rows["grpo_vanilla"]
            and "[0.8, 1.2];" in rows["grpo_vanilla"])
    assert "token TIS C=3" in rows["grpo_token_tis"] and "no IS correction" in rows["dapo"]
    # ... and a name verl and TRL use for other settings says so, with the knobs that give theirs.
    assert ("NOT verl's and TRL's GRPO (theirs: algorithm=grpo algo.advantage=std "
            "algo.clip_high=0.2 algo.agg=token-mean)" in rows["grpo"])


def test_ls_without_a_name_lists_every_list_and_refuses_an_unknown_one(capsys):
    from suite.experiments import listing

    assert cli.main(["ls"]) == 0
    out = capsys.readouterr().out
    assert all(listing.ABOUT[w] + ":" in out for w in listing.LISTS)
    assert cli.main(["ls", "flow"]) == 2
    assert "Did you mean 'flows'" in capsys.readouterr().err


def test_ls_recipes_lists_the_suites_recipes_by_the_name_recipe_takes(capsys):
    from suite.rl import config

    assert cli.main(["ls", "recipes"]) == 0
    out = capsys.readouterr().out
    assert re.search(r"^  dapo_loss +DAPO's loss", out, re.M), out
    # the name listed is the name taken
    assert config.load(["tier=smoke", "recipe=dapo_loss"]).algorithm == "dapo"


# ---- other tools' habits
# --------------------------------------------------------------------------
@pytest.mark.parametrize("command", ["run", "sweep", "main", "bench", "trl-run"])
@pytest.mark.parametrize("argv, words", [
    (["--precision=bf16"],
     "--precision: config fields are key=value, not flags: use precision=bf16"),
    (["--precision", "bf16"], "use precision=bf16"),
    (["--prompts-per-step", "4"], "use prompts_per_step=4"),
    (["--optim.lr=1e-5"], "use optim.lr=1e-5"),
])
def test_a_flag_that_names_a_field_is_refused_with_the_spelling_to_use(
    command, argv, words, capsys):
    assert cli.main([command, *argv]) == 2
    err = capsys.readouterr().err
    assert words in err and err.count("\n") == 1


@pytest.mark.parametrize("argv, field, want", [
    (["precision=BF16"], "precision", "bf16"),
    (["algorithm=GRPO_Token_TIS"], "algorithm", "grpo_token_tis"),
    (["task=Arith3"], "task", "arith3"), (["tier=SMOKE"], "tier", "smoke"),
    (["eval.splits=test"], "eval", {"splits": ["test"]}),
    (["optim.betas=0.9,0.99"], "optim", {"betas": [0.9, 0.99]}),
])
def test_case_and_one_element_lists_are_translated(argv, field, want, capsys):
    assert cli.main(["run", "tier=smoke", *argv, "--cfg", "job"]) == 0
    got = yaml.safe_load(capsys.readouterr().out)[field]
    assert got == want if not isinstance(want, dict) else {k: got[k] for k in want} == want


def test_translation_wraps_lists_folds_case_and_leaves_the_rest_alone():
    from suite.rl import cmdline

    assert cmdline.translate(["logger=wandb", "precision=BF16", "model=R1D-1.5B"]) == [
        "logger=[wandb]", "precision=bf16", "model=r1d-1.5b"]
    assert cmdline.translate(["logger=wandb", "seed=0,1", "precision=BF16,Fp16"], sweep=True) == [
        "logger=[wandb]", "seed=0,1", "precision=bf16,fp16"]  # in a sweep a comma separates values
    plain = ["task=arith", "precision=bf16", "logger=[tensorboard,wandb]", "eval.splits=null",
             "optim.lr=1e-4", "name=x/${regime}", "model=/data/My-Model", "precision=bogus",
             "grid=sanity", "--cfg", "job", "--vs", "trl"]
    assert cmdline.translate(plain) == plain


@pytest.mark.parametrize("override, want", [
    ("optimizer.lr=1e-5", "optim.lr"), ("learning_rate=1e-6", "optim.lr"),
    ("num_generations=8", "samples_per_prompt"),
    ("actor_rollout_ref.rollout.n=8", "samples_per_prompt"),
    ("actor_rollout_ref.actor.optim.lr=1e-6", "optim.lr"),
    ("temperature=0.7", "sampling.temperature"), ("model.path=/m", "policy.path"),
    ("precison=bf16", "precision"),
])
def test_another_tools_field_name_gets_ours(override, want, capsys):
    assert cli.main(["run", override]) == 2
    err = capsys.readouterr().err
    assert f"Did you mean '{want}'?" in err and err.startswith("suite run: error: "
                                                               f"{override.split('=')[0]}:")


def test_a_wrong_case_that_is_not_a_name_still_gets_a_suggestion(capsys):
    assert cli.main(["run", "precision=BF17"]) == 2
    assert "Did you mean 'bf16'?" in capsys.readouterr().err


# ---- suite grids: cells typed without composing each with Hydra
# -------------------------------------
@pytest.mark.parametrize("overrides", [
    [], ["tier=smoke", "precision=bf16"],
    ["steps=200", "policy.layers=4", "routing_replay=True", "inject.scale=1"],
    ["optim.betas=[0.9,0.99]", "logger=[wandb]", "eval.splits=[test]", "micro_batch=null",
     "algo.C=2"],
])
def test_from_plain_builds_the_config_hydra_composes(overrides):
    assert compose.from_plain(overrides) == compose.from_overrides(overrides)


def test_from_plain_refuses_a_value_of_the_wrong_type_naming_the_field():
    with pytest.raises(ValueError, match="^steps: .*could not be converted"):
        compose.from_plain(["steps=abc"])
