"""suite attribute: the matched pair is exact, the sources add up with the interaction, and the
table says so."""

import math

import pytest

from suite.analysis.attribution import summarise, table_markdown
from suite.experiments import attribute


def test_configurations_and_stacks():
    assert attribute.stack_of("bf16") == ("kernels", "kv_fp8", "top_p", "staleness", "micro_batch",
                                          "packing")
    assert "fp8_weights" in attribute.stack_of("bf16_fp8rollout")
    with pytest.raises(ValueError, match="sampler's code"):
        attribute.stack_of("exact")
    cfgs = attribute.configurations(("kernels", "kv_fp8"))
    assert cfgs == [frozenset(), {"kernels"}, {"kv_fp8"}, {"kernels", "kv_fp8"}]
    vllm = attribute.configurations(("kernels", "kv_fp8"), engine="vllm")
    assert all("kernels" in c for c in vllm) and len(vllm) == 2


def test_packing_is_switched_on_with_the_kernels_it_requires():
    """packing exists only in the trainer's HF forward: its one-on configuration is base + kernels +
    packing, its one-off full - packing, and switching kernels off switches packing off too. In
    order, deduplicated: matched, one-on (kernels, kv_fp8, packing given kernels), full, then the
    one-off configurations not seen yet."""
    k, kv, p = "kernels", "kv_fp8", "packing"
    assert attribute.configurations((k, kv, p)) == [
        # one-off kernels = {kv_fp8}, one-off kv_fp8 = {kernels, packing}
        frozenset(), {k}, {kv}, {k, p}, {k, kv, p},
        {k, kv}]  # one-off packing
    assert attribute.configurations((k, p)) == [frozenset(), {k}, {k, p}]
    assert attribute.configurations((k, kv, p), engine="vllm") == [{k}, {k, kv}, {k, p}, {k, kv, p}]
    with pytest.raises(ValueError, match="packing requires kernels"):
        attribute.configurations((kv, p))


def test_summary_measures_packing_given_kernels_by_hand():
    """Three sources, packing requiring kernels: matched 0, kernels 1, kv_fp8 2, kernels + packing
    1.5, full 4, kernels + kv_fp8 3.5. on: kernels 1, kv_fp8 2, packing 1.5 - 1 = 0.5 (from kernels,
    not from the matched pair); interaction 4 - 3.5 = 0.5; off: kernels 4 - 2 (packing off with it),
    kv_fp8 4 - 1.5, packing 4 - 3.5."""
    def row(cfg, v, seed):
        return {"config": sorted(cfg), "batch": 0, "seed": seed, **{k: v for k in
                ("k3", "dp", "tme", "out_0.9_1.1", "out_0.5_2", "kl_full", "tv")}}
    values = {(): 0.0, ("kernels",): 1.0, ("kv_fp8",): 2.0, ("kernels", "packing"): 1.5,
              ("kernels", "kv_fp8", "packing"): 4.0, ("kernels", "kv_fp8"): 3.5}
    rows = [row(c, v, seed) for seed in (0, 1) for c, v in values.items()]
    s = summarise(rows, ["kernels", "kv_fp8", "packing"], [], {"packing": ["kernels"]})
    k3 = s["metrics"]["k3"]
    assert {x: k3["on"][x]["mean"]
            for x in s["sources"]} == {"kernels": 1.0, "kv_fp8": 2.0, "packing": 0.5}
    assert {x: k3["off"][x]["mean"]
            for x in s["sources"]} == {"kernels": 2.0, "kv_fp8": 2.5, "packing": 0.5}
    assert k3["interaction"]["mean"] == 0.5 and k3["total"]["mean"] == 4.0
    assert [k3["share"][x]["mean"]
            for x in ("kernels", "kv_fp8", "packing", "interaction")] == [0.25, 0.5, 0.125, 0.125]
    assert k3["additivity_error"] == 0.0 and s["requires"] == {"packing": ["kernels"]}
    md = table_markdown(s, "t")
    assert ("| packing (given kernels) | 5.00e-01 [5.00e-01, 5.00e-01] | 12% [12%, 12%] | 5.00e-01"
            in md)
    assert "| kernels | 1.00e+00" in md


def test_summary_adds_up_by_hand():
    """Two sources, one replicate: on effects 1 and 2, full 4 -> interaction 1, shares 25/50/25%."""
    def row(cfg, k3):
        return {"config": sorted(cfg), "batch": 0, "seed": 0, **{k: k3 for k in
                ("k3", "dp", "tme", "out_0.9_1.1", "out_0.5_2", "kl_full", "tv")}}
    rows = [row([], 0.0), row(["a"], 1.0), row(["b"], 2.0), row(["a", "b"], 4.0)]
    s = summarise(rows + [{**r, "seed": 1} for r in rows], ["a", "b"], [])
    k3 = s["metrics"]["k3"]
    assert (k3["on"]["a"]["mean"] == 1.0 and k3["off"]["a"]["mean"] == 2.0
            and k3["interaction"]["mean"] == 1.0)
    assert [k3["share"][x]["mean"] for x in ("a", "b", "interaction")] == [0.25, 0.5, 0.25]
    assert k3["additivity_error"] == 0.0
    assert "largest deviation 0.0e+00" in table_markdown(s, "t")


def test_matched_pair_is_exact_and_sources_measured_on_the_same_batches():
    """A real probe on the smoke tier: the matched pair (the trainer replaying the sampler's decode
    loop) has mismatch exactly 0; kernels and the FP8 KV cache each switch on a mismatch; the sum
    check holds."""
    from suite.rl import config

    cfg = config.load(["tier=smoke", "precision=bf16"])
    probe = attribute.build_probe(cfg, batches=1, seeds=2, top_p=0.8)
    configs = attribute.configurations(("kernels", "kv_fp8"))
    rows = attribute.run_probe(probe, configs)
    assert len(rows) == len(configs) * 2
    matched = [r for r in rows if r["config"] == []]
    assert all(r[k] == 0.0 for r in matched
               for k in ("k3", "dp", "tme", "out_0.9_1.1", "kl_full", "tv"))
    s = summarise(rows, ["kernels", "kv_fp8"], [])
    for src in ("kernels", "kv_fp8"):
        assert s["metrics"]["k3"]["on"][src]["mean"] > 0
    # the one-on effects and the interaction add up to the full stack, to float addition of a few
    # numbers
    assert all(m["additivity_error"] <= 8 * math.ulp(max(1.0, abs(m["full"]["mean"])))
               for m in s["metrics"].values())


def test_the_report_shows_each_attribution_with_its_table_check_and_waterfall(tmp_path):
    """`suite report` of the attribution folder (and of a results directory holding one): the
    section carries the hand-computed effects and shares of test_summary_adds_up_by_hand, the check
    line and the waterfall."""
    import json
    import shutil
    from pathlib import Path

    from suite.analysis import report

    def row(cfg, k3, seed):
        return {"config": sorted(cfg), "batch": 0, "seed": seed, **{k: k3 for k in
                ("k3", "dp", "tme", "out_0.9_1.1", "out_0.5_2", "kl_full", "tv")}}
    rows = [row(c, v, seed) for seed in (0, 1)
            for c, v in (([], 0.0), (["a"], 1.0), (["b"], 2.0), (["a", "b"], 4.0))]
    s = {**summarise(rows, ["a", "b"], []), "precision": "bf16", "engine": "torch", "batches": 1,
         "seeds": 2, "responses_per_batch": 8,
         "machine_class": {"id": "cpu-test", "cpu_model": "CPU", "torch": "2.x", "threads": 1}}
    where = tmp_path / "res" / "attribute" / "bf16__torch"
    where.mkdir(parents=True)
    (where / "attribution.json").write_text(json.dumps(s))
    md = (report.write_report(tmp_path / "res" / "attribute") / "report.md").read_text()
    assert "Mismatch by source" in md and ("bf16, engine torch, cpu-test (CPU; torch 2.x, "
                                           "1 thread(s)): 8 responses x 1 batches x 2 seeds" in md)
    assert ("| a | 1.00e+00 [1.00e+00, 1.00e+00] | 25% [25%, 25%] | "
            "2.00e+00 [2.00e+00, 2.00e+00] |" in md)
    assert "| interaction | 1.00e+00 [1.00e+00, 1.00e+00] | 25% [25%, 25%] |" in md
    assert "largest deviation 0.0e+00" in md
    assert (tmp_path / "res" / "attribute" / "report" / "figures" / "attribution_0.png").is_file()
    # beside runs: the run report gains the section
    run = next(Path("tests/fixtures/results-2seeds").rglob("summary.json")).parent
    shutil.copytree(run, tmp_path / "res" / run.name)
    md = (report.write_report(tmp_path / "res") / "report.md").read_text()
    assert ("Verdicts per cell" in md
            and "| b | 2.00e+00 [2.00e+00, 2.00e+00] | 50% [50%, 50%] |" in md)


def test_suite_attribute_measures_packing_given_kernels_end_to_end(tmp_path):
    """`suite attribute --sources kernels,packing` on the smoke tier: three configurations (matched,
    kernels, kernels + packing), the matched pair exactly 0, the table's packing row labelled as
    measured given kernels, `requires` in the summary, and the one-on effects + interaction = full -
    base. Packing without kernels is refused before any compute."""
    import json

    out = tmp_path / "attr"
    with pytest.raises(ValueError, match="packing requires kernels"):
        attribute.cli(["tier=smoke", "precision=bf16", "--batches", "1", "--seeds", "2",
                       "--sources", "packing", "--out", str(out)])
    assert attribute.cli(["tier=smoke", "precision=bf16", "--batches", "1", "--seeds", "2",
                          "--sources", "kernels,packing", "--out", str(out)]) == 0
    rows = json.loads((out / "rows.json").read_text())
    assert sorted({tuple(r["config"]) for r in rows}) == [(), ("kernels",), ("kernels", "packing")]
    assert all(r["k3"] == 0.0 and r["dp"] == 0.0 for r in rows if r["config"] == [])
    s = json.loads((out / "attribution.json").read_text())
    assert s["requires"] == {"packing": ["kernels"]} and s["sources"] == ["kernels", "packing"]
    k3 = s["metrics"]["k3"]
    # the packing row is the difference of the two trainer configurations, replicate by replicate
    by = {(tuple(r["config"]), r["seed"]): r["k3"] for r in rows}
    want = sum(by[(("kernels", "packing"), seed)] - by[(("kernels",), seed)] for seed in (0, 1)) / 2
    assert abs(k3["on"]["packing"]["mean"] - want) <= 4 * math.ulp(max(1.0, abs(want)))
    assert all(m["additivity_error"] <= 8 * math.ulp(max(1.0, abs(m["full"]["mean"])))
               for m in s["metrics"].values())
    assert "| packing (given kernels) |" in (out / "attribution.md").read_text()
    assert (out / "waterfall.png").is_file()
