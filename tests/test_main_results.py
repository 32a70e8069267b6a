"""The committed references of the main job (results/reference/<machine class>/sanity) say what the
README says.

These read measured files, so they fail if a regenerated grid stops showing the mismatch
ordering of REFERENCE section 4 or an fp32 cell stops passing; they never recompute anything.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from suite.experiments import grids
from suite.numerics.precision import main_flows

REFERENCE = Path(__file__).resolve().parents[1] / "results" / "reference"
# the first reference (also holds the collapse search)
ROOT = REFERENCE / "cpu-avx2-emulated" / "sanity"
CLASSES = sorted(p.parent.name for p in REFERENCE.glob("*/sanity"))
KEYS = ("kl_k3", "prob_diff/mean", "seq_log_ratio/mean_abs")


def _by_seed(root: Path = ROOT) -> dict[int, dict[tuple[str, str], dict]]:
    """{seed: {(precision, algorithm): summary}}: a grid of several seeds is read whole, seed by
    seed."""
    out: dict[int, dict] = {}
    for path in sorted(root.glob("*/summary.json")):
        s = json.loads(path.read_text())
        cell = out.setdefault(s["seed"], {})
        assert (s["precision"],
                s["algorithm"]) not in cell, f"two runs of one cell and seed: {path}"
        cell[(s["precision"], s["algorithm"])] = s
    return out


def _summaries(root: Path = ROOT) -> dict[tuple[str, str], dict]:
    """Seed 0's cells (every class ran it); the tests that hold for every seed use _by_seed."""
    return _by_seed(root)[0]


def test_references_of_three_classes_are_committed():
    assert {"cpu-avx2-emulated", "cpu-amx-native", "cpu-amx-emulated"} <= set(CLASSES)


def _missing(cls: str) -> set[tuple[str, str]]:
    """(precision, algorithm) cells a reference declares it lacks (reference.json: a borrowed GPU's
    time ran out)."""
    meta = json.loads((REFERENCE / cls / "reference.json").read_text())
    return {tuple(c) for c in meta.get("jobs", {}).get("sanity", {}).get("cells_missing", [])}


@pytest.mark.parametrize("cls", CLASSES)
def test_every_cell_of_the_sanity_grid_is_committed_and_complete(cls):
    want = {(p, a) for p in main_flows() for a in grids.SANITY_ALGORITHMS} - _missing(cls)
    assert len(_missing(cls)) <= 1, ("a reference may lack a cell its time ran out for, "
                                     "not a grid's worth")
    seeds = _by_seed(REFERENCE / cls / "sanity")
    assert 0 in seeds
    for seed, got in seeds.items():
        assert set(got) == want, seed
        assert all(s["verdict"] in ("pass", "at_line", "collapse", "unstable")
                   for s in got.values())
        # At the published 0.95 fp32 peaks on the line itself (docs/calibration.md): it never fails,
        # and passes or sits at the line.
        assert all(got[("fp32", a)]["verdict"] in ("pass", "at_line")
                   for a in grids.SANITY_ALGORITHMS), seed


@pytest.mark.parametrize("cls", CLASSES)
@pytest.mark.parametrize("algorithm", grids.SANITY_ALGORITHMS)
@pytest.mark.parametrize("key", KEYS)
def test_step0_mismatch_ordering(cls, algorithm, key):
    """On every class and seed: exact is exactly 0; fp32 < fp16 < bf16 < bf16_fp8rollout; unified
    fp8 < bf16_fp8rollout."""
    for seed, cells in _by_seed(REFERENCE / cls / "sanity").items():
        s = {p: a_s[f"mismatch/step0/{key}"] for (p, a), a_s in cells.items() if a == algorithm}
        assert s["exact"] == 0.0 if ("exact",
                                     algorithm) not in _missing(cls) else "exact" not in s, seed
        assert 0.0 < s["fp32"] < s["fp16"] < s["bf16"] < s["bf16_fp8rollout"], seed
        assert s["fp8"] < s["bf16_fp8rollout"], seed


@pytest.mark.parametrize("cls", CLASSES)
def test_step0_mismatch_is_a_property_of_the_flow_not_the_algorithm(cls):
    """Step 1 samples the same prompts with the same seed before any update, in every algorithm."""
    for seed, cells in _by_seed(REFERENCE / cls / "sanity").items():
        by_flow: dict[str, set] = {}
        for (p, _), s in cells.items():
            by_flow.setdefault(p, set()).add(s["mismatch/step0/kl_k3"])
        assert all(len(v) == 1 for v in by_flow.values()), seed


def test_the_main_table_leads_with_the_mismatch():
    """outcomes.md opens with the per-flow mismatch, ordered by the precision table, and the verdict
    count."""
    from suite.analysis.outcomes import outcome_markdown

    md = outcome_markdown(ROOT)
    lead = md[md.index("## Mismatch first"):md.index("## Runs")]
    n_pass = sum(s["verdict"] == "pass" for s in _summaries().values())
    assert f"{n_pass} of {len(_summaries())} runs pass" in lead
    rows = [ln.split(" | ") for ln in lead.splitlines() if ln.startswith("| ")
            and "precision flow" not in ln]
    assert [r[0].strip("| ") for r in rows] == main_flows()
    k3 = {r[0].strip("| "): float(r[4]) for r in rows}
    assert k3["fp32"] < k3["fp16"] < k3["bf16"] < k3["bf16_fp8rollout"] and k3["exact"] == 0.0


def test_the_committed_grids_are_complete_for_todays_code():
    """`suite main` on a clean clone skips the committed cells instead of refusing them as "another
    config" after fields were added to the code (provenance.same_experiment)."""
    from suite.experiments import sweep

    for grid in ("sanity", "collapse-search"):
        cells = sweep.plan_grid([f"grid={grid}", f"out={ROOT.parent}"]).cells
        assert {sweep.state(c) for c in cells} == {"complete"}, grid


def test_same_experiment_tolerates_only_fields_added_at_their_defaults(tmp_path):
    from suite.results import config_hash
    from suite.rl import config
    from suite.rl.provenance import same_experiment

    new = config.to_dict(config.load(["tier=smoke"]))
    # recorded before those fields existed
    old = {k: v for k, v in new.items() if k not in ("micro_batch", "eval")}
    assert same_experiment({"config": old, "config_hash": config_hash(old)}, new)
    changed = config.to_dict(config.load(["tier=smoke", "micro_batch=2"]))
    assert not same_experiment({"config": old, "config_hash": config_hash(old)}, changed)
    other = config.to_dict(config.load(["tier=smoke", "optim.lr=3e-4"]))
    assert not same_experiment({"config": new, "config_hash": config_hash(new)}, other)


@pytest.mark.parametrize("cls", ["cpu-amx-native", "cpu-amx-emulated"])
def test_references_record_their_class_and_a_clean_commit(cls):
    """A reference made with today's bundle format names its class in every env.json, from one clean
    commit."""
    envs = [json.loads(p.read_text()) for p in (REFERENCE / cls / "sanity").glob("*/env.json")]
    meta = json.loads((REFERENCE / cls / "reference.json").read_text())
    assert len(envs) == 24 and {e["machine_class"]["id"]
                                for e in envs} == {cls} == {meta["machine_class"]["id"]}
    assert {e["git_dirty"]
            for e in envs} == {False} and {e["git_sha"] for e in envs} == {meta["git_sha"]}


def test_unified_fp8_is_zero_only_where_gemms_are_emulated():
    """What the unified flow's zero measures (docs/reproduce.md): with emulated GEMMs its trainer
    reproduces the sampler's decode bit for bit at step 0; with native AMX kernels it does not, yet
    stays below bf16."""
    for cls, zero in (("cpu-avx2-emulated", True), ("cpu-amx-emulated", True),
                      ("cpu-amx-native", False)):
        s = _summaries(REFERENCE / cls / "sanity")
        fp8 = {s[("fp8", a)]["mismatch/step0/kl_k3"] for a in grids.SANITY_ALGORITHMS}
        assert (fp8 == {0.0}) == zero, cls
        assert max(fp8) < s[("bf16", "grpo")]["mismatch/step0/kl_k3"]
