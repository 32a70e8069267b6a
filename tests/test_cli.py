"""The command line's conventions: --help on the config subcommands lists every field with its default and
docstring, --cfg job prints the resolved config, and bad input is one line with exit code 2."""

from __future__ import annotations

import dataclasses
import json

import pytest

from suite import cli, config


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
    listed = {line.split("=", 1)[0].strip() for line in out.splitlines() if line.startswith("  ") and
              not line.startswith("   ") and "=" in line}
    assert listed == set(_leaf_fields(config.RunConfig))
    assert "  precision=fp32\n      Precision flow" in out
    assert "  vllm.tensor_parallel_size=1\n      Devices one engine shards" in out


def test_cfg_job_prints_the_resolved_config(capsys):
    assert cli.main(["run", "tier=smoke", "precision=bf16", "--cfg", "job"]) == 0
    printed = json.loads(capsys.readouterr().out)
    want = dataclasses.asdict(config.load(["tier=smoke", "precision=bf16"]))
    assert printed == want and printed["precision"] == "bf16" and printed["steps"] == want["steps"]


@pytest.mark.parametrize("argv, words", [
    (["run", "--cfg", "job", "precision=bogus"], "precision: unknown value 'bogus'"),
    (["run", "--cfg", "hydra"], "--cfg: only `--cfg job`"),
    (["table", "/nonexistent/results"], "no such results directory"),
])
def test_bad_input_is_one_line_and_exit_2(argv, words, capsys, tmp_path):
    assert cli.main(argv) == 2
    err = capsys.readouterr().err
    assert words in err and err.count("\n") == 1


def test_table_of_a_directory_without_runs_is_refused(tmp_path, capsys):
    assert cli.main(["table", str(tmp_path)]) == 2
    assert "no run in it" in capsys.readouterr().err
    assert cli.main(["table", "--help"]) == 0
