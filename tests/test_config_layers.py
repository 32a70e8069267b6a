"""The config layers (suite/rl/layers.py): a higher layer wins every field it sets, whatever the
value; the fields the user set are never overridden; every resolved value says where it came from;
and the configs that existed before resolve exactly as they did (tests/fixtures/config_hashes.json).
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import warnings
from pathlib import Path

import pytest
import yaml

from suite import cli
from suite.results import config_hash
from suite.rl import config
from suite.rl.models import PRESETS
from suite.rl.recipe import hydra_value
from suite.rl.schema import REGIMES, TIERS

ROOT = Path(__file__).resolve().parent.parent
LAYERS = ("tier", "model preset", "task file", "regime", "recipe", "command line")  # lowest first
# Per field: the lower layer's value, the higher layer's other value, and the schema default.
FIELDS = {"optim.eps": (1e-15, 1e-10, 1e-8), "micro_batch": (4, 2, None)}


@pytest.fixture(autouse=True)
def _no_task_path(monkeypatch):
    monkeypatch.delenv("SUITE_TASKS_PATH", raising=False)


def _arrange(layer: str, field: str, value, monkeypatch, tmp: Path) -> list[str]:
    """Make ``layer`` set ``field`` to ``value``; return the overrides that bring the layer in."""
    if layer == "tier":
        monkeypatch.setitem(TIERS["smoke"], field, value)
        return []
    if layer == "model preset":
        monkeypatch.setitem(PRESETS["r1d-1.5b"].recipe, field, value)
        return ["model=r1d-1.5b"]
    if layer == "task file":  # the arith task under another name, with a tiers section
        text = (ROOT / "tasks" / "arith.yaml").read_text().replace("name: arith", "name: layered")
        tiers = yaml.safe_dump({"tiers": {"smoke": {field: value}}})
        (tmp / "layered.yaml").write_text(text + tiers)
        return [f"include_path={tmp}", "task=layered"]
    if layer == "regime":
        monkeypatch.setitem(REGIMES, "layered", {"doc": "a test's regime", "set": {field: value}})
        return ["regime=layered"]
    if layer == "recipe":
        (tmp / "recipe.yaml").write_text(yaml.safe_dump({field: value}))
        return [f"recipe={tmp / 'recipe.yaml'}"]
    return [f"{field}={hydra_value(value)}"]


def _get(cfg, dotted: str):
    for part in dotted.split("."):
        cfg = getattr(cfg, part)
    return cfg


def _load(overrides: list[str]):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", config.RecipeWarning)  # the preset at the toy tier
        return config.load(["tier=smoke", *overrides])


PAIRS = [(lo, hi, f, case) for lo, hi in itertools.combinations(LAYERS, 2) for f in FIELDS
         for case in ("other value", "schema default", "the lower's value")]


@pytest.mark.parametrize("lower, higher, field, case", PAIRS)
def test_the_higher_layer_wins_whatever_its_value(lower, higher, field, case, monkeypatch,
                                                  tmp_path):
    low, other, default = FIELDS[field]
    high = {"other value": other, "schema default": default, "the lower's value": low}[case]
    (tmp_path / "lo").mkdir(), (tmp_path / "hi").mkdir()
    overrides = _arrange(lower, field, low, monkeypatch, tmp_path / "lo")
    overrides += _arrange(higher, field, high, monkeypatch, tmp_path / "hi")
    assert _get(_load(overrides), field) == high
    if higher != "command line":  # without the higher layer, the lower one's value
        assert _get(_load(_arrange(lower, field, low, monkeypatch, tmp_path / "lo")), field) == low


@pytest.mark.parametrize("higher", LAYERS)
def test_every_layer_wins_over_the_schema_default_and_is_named(higher, monkeypatch, tmp_path):
    overrides = _arrange(higher, "optim.eps", 1e-12, monkeypatch, tmp_path)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", config.RecipeWarning)
        cfg, origins = config.load_layers(["tier=smoke", *overrides])
    assert cfg.optim.eps == 1e-12 and origins["optim.eps"].startswith(higher)
    lr_from = "model preset r1d-1.5b" if higher == "model preset" else "tier smoke"
    assert origins["optim.lr"] == lr_from


@pytest.mark.parametrize("argv, line", [
    (["model=r1d-1.5b", "gradient_checkpointing=false"],
     "gradient_checkpointing: false  # command line\n"),
    (["regime=adam-eps", "optim.eps=1e-8"], "  eps: 1.0e-08  # command line\n"),
])
def test_cfg_job_prints_the_users_value_from_the_command_line(argv, line, capsys):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", config.RecipeWarning)
        assert cli.main(["run", *argv, "--cfg", "job"]) == 0
    out = capsys.readouterr().out
    assert line in out
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", config.RecipeWarning)
        # every field, those to_dict omits at default too
        want = dataclasses.asdict(config.load(argv))
    assert yaml.safe_load(out) == want  # the comments aside, the config itself


def test_cfg_job_names_every_layer_it_resolves_from(capsys):
    assert cli.main(["run", "task=sanity_r1d", "tier=full", "regime=lr-edge", "recipe=dapo_loss",
                     "seed=3", "--cfg", "job"]) == 0
    out = capsys.readouterr().out
    task_file = ROOT / "tasks" / "sanity_r1d.yaml"
    for line in ["seed: 3  # command line",
                 f"algorithm: dapo  # recipe {ROOT / 'recipes' / 'dapo_loss.yaml'}",
                 "  lr: 0.0002  # regime lr-edge",
                 f"steps: 500  # task file {task_file} tiers.full",
                 "gradient_checkpointing: true  # model preset r1d-1.5b",
                 "  pool: 2048  # tier full",
                 "  k: 16  # schema default"]:
        assert line + "\n" in out, line


def test_null_asks_for_the_layers_value_only_where_none_means_so():
    # steps: None is "the tier's value"; micro_batch: None is "no accumulation", a value of its own
    with pytest.warns(config.RecipeWarning, match="micro_batch=None is the embedded policy's"):
        cfg, origins = config.load_layers(["tier=smoke", "steps=null", "model=r1d-1.5b",
                                           "micro_batch=null"])
    assert (cfg.steps, origins["steps"]) == (TIERS["smoke"]["steps"], "tier smoke")
    assert (cfg.micro_batch, origins["micro_batch"]) == (None, "command line")


def test_a_group_override_sets_only_the_fields_it_names():
    cfg, origins = config.load_layers(["regime=stress", "optim={eps:1e-8}"])
    assert (cfg.optim.eps, origins["optim.eps"]) == (1e-8, "command line")
    assert (cfg.optim.lr, origins["optim.lr"]) == (2e-4, "regime stress")


def test_a_task_file_that_names_a_preset_keeps_its_own_values(tmp_path):
    # The task file sits above the model preset (suite/rl/layers.py): its tier is the recipe of that
    # model on that task, as docs/tasks.md says.
    text = (ROOT / "tasks" / "arith.yaml").read_text().replace("name: arith", "name: mine")
    tiers = "tiers:\n  smoke:\n    model: r1d-1.5b\n    optim.lr: 2.0e-6\n"
    (tmp_path / "mine.yaml").write_text(text + tiers)
    cfg, origins = config.load_layers([f"include_path={tmp_path}", "task=mine", "tier=smoke"])
    assert (cfg.model, cfg.optim.lr, cfg.micro_batch) == ("r1d-1.5b", 2e-6, 2)
    assert origins["optim.lr"].endswith("tiers.smoke")
    assert origins["micro_batch"] == "model preset r1d-1.5b"


def test_origins_cover_every_field_and_a_value_no_layer_recorded_is_refused():
    from suite.rl import cmdline, layers

    cfg, origins = config.load_layers(["tier=smoke"])
    assert set(origins) == set(cmdline.fields())
    cfg.optim.eps = 1e-15  # set behind the layers' back
    with pytest.raises(ValueError, match="optim.eps holds 1e-15, not the schema default"):
        layers.complete(cfg, {k: v for k, v in origins.items() if k != "optim.eps"})
    with pytest.raises(ValueError, match="optim.bogus are not config fields"):
        layers.complete(cfg, {**origins, "optim.bogus": "command line"})


def test_config_json_records_the_origins_outside_the_hash(tmp_path, monkeypatch):
    from suite.rl import train

    def fake_run(cfg, console=None, origins=None):
        train.claim_run_dir(tmp_path / "run", config.to_dict(cfg), origins)
        return tmp_path / "run"

    monkeypatch.setattr(train, "run", fake_run)
    monkeypatch.setattr(cli, "_print_summary", lambda run_dir: 0)
    assert cli.main(["run", "tier=smoke", "regime=adam-eps", "optim.eps=1e-8"]) == 0
    saved = json.loads((tmp_path / "run" / "config.json").read_text())
    cfg, origins = config.load_layers(["tier=smoke", "regime=adam-eps", "optim.eps=1e-8"])
    assert saved["config_origins"] == origins and origins["optim.eps"] == "command line"
    assert saved["config_hash"] == config_hash(saved["config"]) == config_hash(config.to_dict(cfg))


def test_existing_configs_resolve_as_before():
    """Hashes written by scripts/config_hashes.py on the commit before the layers existed (the
    file's made_by and commit): every tier x regime, sanity_r1d at tier full, the sanity grid."""
    import importlib.util

    path = ROOT / "scripts" / "config_hashes.py"
    spec = importlib.util.spec_from_file_location("config_hashes", path)
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    want = json.loads((ROOT / "tests" / "fixtures" / "config_hashes.json").read_text())["hashes"]
    assert len(want) == 36 + 2 + 21  # tiers x regimes, sanity_r1d, the sanity grid's cells
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", config.RecipeWarning)
        got = script.hashes()
    assert got == want
