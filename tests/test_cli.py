"""The command line's conventions: --help on the config subcommands lists every field with its default and
docstring, --cfg job prints the resolved config, and bad input is one line with exit code 2."""

from __future__ import annotations

import dataclasses
import json

import pytest

from suite import cli
from suite.rl import config


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
    (tmp_path / cls / "reference.json").write_text(json.dumps({"jobs": {"sanity": {"wall_time_s": 600.0}}}))
    # fp8 grid: flows x grpo, grpo_token_tis x 3 seeds, small tier (arith3, 100 steps, regime base).
    flows = grids.get("fp8")["axes"]["precision"]
    for i, flow in enumerate(flows):
        for seconds, algo in ((10.0 * (i + 1), "grpo"), (30.0 * (i + 1), "grpo_token_tis")):
            _reference_run(tmp_path, cls, f"arith3__{algo}__{flow}__s0", seconds, task="arith3", tier="small",
                           regime="base", precision=flow, steps=100, updates_per_step=2)
            _reference_run(tmp_path, cls, f"arith3__{algo}__{flow}__s1", 1000.0, task="arith3", tier="small",
                           regime="base", precision=flow, steps=100, updates_per_step=4)  # another recipe: not mixed in
    rows = {r["grid"]: r for r in grids.catalogue(tmp_path)}
    assert rows["sanity"]["time"][cls] == ("measured", 600.0)
    # Each cell takes the mean of its flow's runs (20 s x (i+1)), over 2 algorithms x 3 seeds per flow.
    want = sum(20.0 * (i + 1) * 6 for i in range(len(flows)))
    assert rows["fp8"]["time"][cls] == ("estimate", pytest.approx(want))
    assert rows["fp8"]["cells"] == len(flows) * 6 and rows["fp8"]["steps"] == [100]
    assert cls not in rows["collapse-search"]["time"]  # no run of those regimes: no figure, no extrapolation
