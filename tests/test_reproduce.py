"""The main job reproduces: machine classes, the comparison with a committed reference, what must
hold on every machine, promotion of a grid to a reference, and a main job that leaves the checkout
untouched."""

from __future__ import annotations

import dataclasses
import io
import json
import shutil
import subprocess
from pathlib import Path

import pytest

from suite import packed
from suite.analysis import reference, reproduce
from suite.numerics import machine
from suite.results import config_hash
from suite.rl.recipe import AlgoConfig

REPO = Path(__file__).resolve().parents[1]
AVX2 = REPO / "results" / "reference" / "cpu-avx2-emulated" / "sanity"


# ---- machine class --------------------------------------------------------------------------
@pytest.mark.parametrize("flags, level", [
    ({"avx2", "fma"}, "avx2"),
    ({"avx2", "avx512f", "avx512bw"}, "avx512"),
    ({"avx2", "avx512f", "avx512_bf16"}, "avx512bf16"),
    ({"avx2", "avx512f", "avx512_bf16", "avx512_fp16", "amx_bf16", "amx_tile"}, "amx"),
])
def test_isa_level_from_cpu_flags(flags, level):
    assert machine.cpu_isa(frozenset(flags)) == level


def test_this_machines_class_names_isa_and_gemm_backend():
    cls = machine.describe("emulated", threads=1)
    assert cls["id"] == f"cpu-{machine.cpu_isa()}-emulated" and cls["gemm"] == {
        "bf16": "emulated", "fp16": "emulated"}
    assert cls["threads"] == 1 and cls["torch"]
    assert machine.describe("native", threads=1)["id"].endswith("-native")
    assert machine.differences(cls, {**cls, "torch": "2.99"}) == ["torch"]
    assert machine.differences(cls, None) == ["class"]


def test_old_runs_get_the_class_their_reference_folder_declares():
    run = AVX2 / "arith3__grpo__bf16__s0"
    env = json.loads((run / "env.json").read_text())
    assert "machine_class" not in env  # made before env.json recorded it
    cls = machine.of_run(run, env)
    assert cls["id"] == "cpu-avx2-emulated" and cls["declared"] is True
    assert "declared by the reference folder" in machine.label(cls)


# ---- comparison with a reference ------------------------------------------------------------
@pytest.fixture
def fresh(tmp_path):
    """A copy of the committed AVX2 grid, as if a machine of that class had just rerun it: its logs
    plain, as a run writes them (the reference stores them as .xz, results/README.md), so a test
    edits them by name."""
    root = tmp_path / "sanity"
    shutil.copytree(AVX2, root, ignore=shutil.ignore_patterns("report"))
    packed.unpack(root)
    assert len(list(root.glob("*/metrics.jsonl"))) == 24 and not list(root.rglob("*.jsonl.xz"))
    return root


def test_an_identical_rerun_is_byte_identical_in_every_cell(fresh):
    rows = reproduce.compare(fresh, AVX2)
    assert len(rows) == 24 and {r["metrics"] for r in rows} == {"identical"}
    assert all(r["step0_rel_diff"] == 0.0 and r["verdict"] == r["ref_verdict"] for r in rows)


def test_a_moved_number_is_found_at_its_step(fresh):
    path = fresh / "arith3__grpo__fp16__s0" / "metrics.jsonl"
    lines = path.read_text().splitlines()
    row = json.loads(lines[36])
    row["mismatch/kl_k3"] = row["mismatch/kl_k3"] * (1 + 2**-52)  # one ulp-ish nudge
    lines[36] = json.dumps(row)
    path.write_text("\n".join(lines) + "\n")
    rows = {r["run"]: r for r in reproduce.compare(fresh, AVX2)}
    assert rows["arith3__grpo__fp16__s0"]["metrics"] == f"differs from step {row['step']}"
    assert sum(r["metrics"] == "identical" for r in rows.values()) == 23


def test_a_cell_of_another_config_is_not_compared(fresh):
    path = fresh / "arith3__grpo__fp32__s0" / "config.json"
    cfg = json.loads(path.read_text())
    cfg["config"]["optim"]["lr"] *= 2
    cfg["config_hash"] = config_hash(cfg["config"])
    path.write_text(json.dumps(cfg))
    rows = {r["run"]: r for r in reproduce.compare(fresh, AVX2)}
    assert rows["arith3__grpo__fp32__s0"]["metrics"] == "reference has another config"


def test_a_field_added_since_the_reference_at_its_default_still_compares(fresh):
    """A reference written before a config field existed is the same experiment when the fresh run
    holds that field's default (provenance.same_experiment); a non-default value is another
    experiment."""
    path = fresh / "arith3__grpo__fp32__s0" / "config.json"
    cfg = json.loads(path.read_text())
    for added, want in ((0.0, "identical"), (0.5, "reference has another config")):
        # as written today
        cfg["config"]["algo"] = {**dataclasses.asdict(AlgoConfig()), "entropy_coef": added}
        cfg["config_hash"] = config_hash(cfg["config"])
        path.write_text(json.dumps(cfg))
        old = json.loads((AVX2 / "arith3__grpo__fp32__s0" / "config.json").read_text())["config"]
        assert "algo" not in old  # the committed reference predates the algo.* knobs
        assert {r["run"]: r
                for r in reproduce.compare(fresh,
                                           AVX2)}["arith3__grpo__fp32__s0"]["metrics"] == want


def test_invariants_hold_on_the_reference_and_break_when_they_should(fresh):
    assert [i["ok"] for i in reproduce.invariants(AVX2)] == [True, True, True]
    # exact non-zero on one step
    path = fresh / "arith3__grpo__exact__s0" / "metrics.jsonl"
    rows = [json.loads(x) for x in path.read_text().splitlines()]
    rows[9]["mismatch/kl_k3"] = 1e-12
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    # bf16 below fp16 at step 0
    for algo in ("grpo", "grpo_token_tis", "pg_seq_is"):
        p = fresh / f"arith3__{algo}__bf16__s0" / "summary.json"
        s = json.loads(p.read_text())
        s["mismatch/step0/kl_k3"] = 1e-9
        p.write_text(json.dumps(s))
    inv = reproduce.invariants(fresh)
    assert [i["ok"] for i in inv] == [False, False, True]
    assert "steps [10]" in inv[0]["detail"]


def test_statement_without_a_reference_of_this_class(fresh, tmp_path):
    doc = {"machine_class": {"id": "cpu-zz-native"}, "reference": None,
           "known_classes": ["cpu-avx2-emulated"], "invariants": reproduce.invariants(fresh),
           "rows": reproduce.compare(fresh, None)}
    text = reproduce.statement(doc)
    assert text.startswith("No committed reference for machine class cpu-zz-native")
    assert "3 of 3 checks hold" in text and "cpu-avx2-emulated" in text
    assert {r["metrics"] for r in doc["rows"]} == {"no reference"}


def test_promote_refuses_a_dirty_checkout_and_copies_a_clean_grid(fresh, tmp_path):
    with pytest.raises(ValueError, match="do not record one machine class"):
        # made before env.json recorded it
        reference.promote(fresh, "sanity", ref_root=tmp_path / "ref")

    def set_env(**kw):
        for env_path in fresh.glob("*/env.json"):
            env_path.write_text(json.dumps({**json.loads(env_path.read_text()), **kw}))

    set_env(machine_class=machine.describe("auto", 1))
    with pytest.raises(ValueError, match="dirty checkout"):
        # these runs recorded git_dirty true
        reference.promote(fresh, "sanity", ref_root=tmp_path / "ref")
    set_env(git_dirty=False)
    (fresh / "arith3__grpo__fp32__s0" / "ckpt").mkdir()
    dest = reference.promote(fresh, "sanity", ref_root=tmp_path / "ref")
    assert dest == tmp_path / "ref" / machine.describe("auto", 1)["id"] / "sanity"
    assert len(list(dest.glob("*/metrics.jsonl"))) == 24 and not list(dest.glob("*/ckpt"))
    meta = json.loads((dest.parent / "reference.json").read_text())
    assert meta["grids"] == ["sanity"] and meta["machine_class"]["id"] == dest.parent.name
    assert (dest / "report" / "index.html").is_file()
    assert {r["metrics"] for r in reproduce.compare(fresh, dest)} == {"identical"}


def test_promote_keeps_the_folders_of_a_nested_grid(fresh, tmp_path):
    """A grid nested by an axis (<grid>/<ppo_ref or regime>/<run>) repeats run names across its
    folders."""
    nested = tmp_path / "nested"
    for arm in ("trainer", "sampler"):
        shutil.copytree(fresh, nested / arm)
    for env_path in [*fresh.glob("*/env.json"), *nested.glob("*/*/env.json")]:
        sha = "b" * 40 if env_path.is_relative_to(nested) else "a" * 40
        env_path.write_text(json.dumps({**json.loads(env_path.read_text()), "git_sha": sha,
                                        "machine_class": machine.describe("auto", 1),
                                        "git_dirty": False}))
    reference.promote(fresh, "sanity", ref_root=tmp_path / "ref")
    dest = reference.promote(nested, "h1", ref_root=tmp_path / "ref")
    assert {p.parent.parent.name for p in dest.glob("*/*/metrics.jsonl")} == {"trainer", "sampler"}
    assert len(list(dest.glob("*/*/metrics.jsonl"))) == 48
    # Each grid keeps the commit it was made at; a later grid does not rewrite the first one's.
    meta = json.loads((dest.parent / "reference.json").read_text())
    assert meta["git_sha"] == "a" * 40 and meta["jobs"]["h1"]["git_sha"] == "b" * 40
    assert "made at commit aaaaaaa" in reproduce.check(fresh, "sanity",
                                                       ref_root=tmp_path / "ref")["statement"]


# ---- the console and the main job ----------------------------------------------------------
def test_piped_output_is_never_cut():
    from suite.console import make_console

    buf = io.StringIO()
    sentence = " ".join(f"word{i}" for i in range(120)) + " END."
    make_console(buf).print(sentence)
    assert buf.getvalue().strip() == sentence


def test_main_job_writes_next_to_its_runs_and_leaves_git_status_clean(tmp_path):
    """A small main job (smoke cells, one seed, every row in fp32) writes runs, table, controls,
    reproduction, report and leaderboard under its out directory; nothing tracked by git (the
    committed references, the committed site) changes. Runs too short to judge judge no control, and
    say so."""
    from suite import cli

    before = subprocess.run(["git", "status", "--porcelain"], cwd=REPO, capture_output=True,
                            text=True).stdout
    site = (REPO / "leaderboard" / "data.js").read_bytes()
    out = tmp_path / "out"
    assert cli.main(["main", "tier=smoke", "precision=fp32", "seed=0", f"out={out}"]) == 0
    root = out / "main"
    for f in ("outcomes.md", "reproduction.md", "reproduction.json", "job.json",
              "report/index.html", "leaderboard/index.html", "leaderboard/data.js", "controls.json",
              "../controls/reproduction.md"):
        assert (root / f).is_file(), f
    first = json.loads((root / "controls.json").read_text())["first_line"]
    assert ("not judged: stale-k4 (" in first
            and first in (root / "outcomes.md").read_text())
    md = (root / "report" / "report.md").read_text()
    assert (md.index(first) < md.index("Controls: known-bad recipes beside their corrections")
            < md.index("The runs"))
    # a panel per flow and per control row
    assert (root / "report" / "figures" / "headline.png").is_file()
    doc = json.loads((root / "reproduction.json").read_text())
    assert doc["machine_class"]["id"] == machine.describe("auto", 1)["id"]
    assert ("Reproduction against the committed reference"
            in (root / "report" / "report.md").read_text())
    env = json.loads((root / "arith__grpo__fp32__s0" / "env.json").read_text())
    assert env["machine_class"] == doc["machine_class"]
    # 1 main cell, 4 control rows
    assert json.loads((root / "job.json").read_text())["cells_trained"] == 5
    after = subprocess.run(["git", "status", "--porcelain"], cwd=REPO, capture_output=True,
                           text=True).stdout
    assert after == before and (REPO / "leaderboard" / "data.js").read_bytes() == site
    # Promoted as references, main first (the natural order): the controls refresh the main
    # report, whose headline draws a panel per control row from the sibling folder.
    for env_path in out.glob("**/env.json"):
        env_path.write_text(json.dumps({**json.loads(env_path.read_text()), "git_dirty": False}))
    main_ref = reference.promote(root, "main", ref_root=tmp_path / "ref")
    fig = main_ref / "report" / "figures" / "headline.png"
    alone = fig.read_bytes()
    reference.promote(out / "controls", "controls", ref_root=tmp_path / "ref")
    assert fig.read_bytes() != alone


def test_runs_never_write_into_the_committed_references(tmp_path):
    from suite.rl import config
    from suite.rl.train import RunDirConflict, run

    cfg = config.load(["tier=smoke", f"out={AVX2.parent}", "name=new-grid"])
    with pytest.raises(RunDirConflict, match="committed reference"):
        run(cfg)
    assert not (AVX2.parent / "new-grid").exists()
