"""suite attribute: the matched pair is exact, the sources add up with the interaction, and the table says so."""

import math

import pytest

from suite.analysis.attribution import summarise, table_markdown
from suite.experiments import attribute


def test_configurations_and_stacks():
    assert attribute.stack_of("bf16") == ("kernels", "kv_fp8", "top_p", "staleness", "micro_batch")
    assert "fp8_weights" in attribute.stack_of("bf16_fp8rollout")
    with pytest.raises(ValueError, match="sampler's code"):
        attribute.stack_of("exact")
    cfgs = attribute.configurations(("kernels", "kv_fp8"))
    assert cfgs == [frozenset(), {"kernels"}, {"kv_fp8"}, {"kernels", "kv_fp8"}]
    vllm = attribute.configurations(("kernels", "kv_fp8"), engine="vllm")
    assert all("kernels" in c for c in vllm) and len(vllm) == 2


def test_summary_adds_up_by_hand():
    """Two sources, one replicate: on effects 1 and 2, full 4 -> interaction 1, shares 25/50/25%."""
    def row(cfg, k3):
        return {"config": sorted(cfg), "batch": 0, "seed": 0, **{k: k3 for k in
                ("k3", "dp", "tme", "out_0.9_1.1", "out_0.5_2", "kl_full", "tv")}}
    rows = [row([], 0.0), row(["a"], 1.0), row(["b"], 2.0), row(["a", "b"], 4.0)]
    s = summarise(rows + [{**r, "seed": 1} for r in rows], ["a", "b"], [])
    k3 = s["metrics"]["k3"]
    assert k3["on"]["a"]["mean"] == 1.0 and k3["off"]["a"]["mean"] == 2.0 and k3["interaction"]["mean"] == 1.0
    assert [k3["share"][x]["mean"] for x in ("a", "b", "interaction")] == [0.25, 0.5, 0.25]
    assert k3["additivity_error"] == 0.0
    assert "largest deviation 0.0e+00" in table_markdown(s, "t")


def test_matched_pair_is_exact_and_sources_measured_on_the_same_batches():
    """A real probe on the smoke tier: the matched pair (the trainer replaying the sampler's decode loop) has
    mismatch exactly 0; kernels and the FP8 KV cache each switch on a mismatch; the sum check holds."""
    from suite.rl import config

    cfg = config.load(["tier=smoke", "precision=bf16"])
    probe = attribute.build_probe(cfg, batches=1, seeds=2, top_p=0.8)
    configs = attribute.configurations(("kernels", "kv_fp8"))
    rows = attribute.run_probe(probe, configs)
    assert len(rows) == len(configs) * 2
    matched = [r for r in rows if r["config"] == []]
    assert all(r[k] == 0.0 for r in matched for k in ("k3", "dp", "tme", "out_0.9_1.1", "kl_full", "tv"))
    s = summarise(rows, ["kernels", "kv_fp8"], [])
    for src in ("kernels", "kv_fp8"):
        assert s["metrics"]["k3"]["on"][src]["mean"] > 0
    # the one-on effects and the interaction add up to the full stack, to float addition of a few numbers
    assert all(m["additivity_error"] <= 8 * math.ulp(max(1.0, abs(m["full"]["mean"]))) for m in s["metrics"].values())
