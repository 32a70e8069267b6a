"""Named grids: the experiments ``suite sweep grid=NAME`` runs.

A grid is data: ``axes`` (config field -> values; the sweep is their Cartesian product),
``overrides`` (plain ``key=value`` applied to every cell) and a one-line ``doc``. An axis may
be a function instead of a list; it is called when the grid is looked up, so a grid over
"every precision flow" picks up flows added to ``suite.numerics.precision.FLOWS`` later without an
edit here. Any axis or field can be replaced on the command line (``seed=0,1,2``,
``tier=smoke``); see ``suite/experiments/sweep.py`` and docs/sweeps.md.
"""

from __future__ import annotations

from typing import Any

from suite.experiments.calibration import EMBEDDED_LINE
from suite.names import lookup


def _flows() -> list[str]:
    """Every precision flow of the table but the controls of the mechanism studies."""
    from suite.numerics.flows import main_flows

    return main_flows()


def _fp8_flows() -> list[str]:
    """Every flow with FP8 somewhere (unified FP8, FP8 rollouts), against bf16 and fp32; table
    order."""
    return [f for f in _flows() if "fp8" in f or f in ("bf16", "fp32")]


def _algorithms() -> list[str]:
    from suite.rl.algo_table import ALGORITHMS

    return list(ALGORITHMS)


# The precision-robust algorithms of the published sanity test (arXiv 2510.26788):
# plain PPO-clip, token-level truncated IS, sequence-level IS policy gradient.
SANITY_ALGORITHMS = ["grpo", "grpo_token_tis", "pg_seq_is"]

SEARCH_FLOWS = ["fp32", "fp16", "bf16", "bf16_fp8rollout"]

# The 4-bit study's flows, baselines first (suite/numerics/flows.py: the rows with fp4 set, out of
# the main grids).
FP4_FLOWS = ["bf16", "bf16_fp8rollout", "bf16_nvfp4rollout", "bf16_nvfp4a4rollout",
             "bf16_mxfp4rollout", "bf16_mxfp4a4rollout", "nvfp4a4"]

# The corrections the source grids cross with each source: none, token-level TIS, sequence-level
# MIS.
SOURCE_ALGORITHMS = ["grpo", "grpo_token_tis", "grpo_seq_mis"]

# The main job's precision flows: the reference (fp32) and the three the literature argues about,
# under plain GRPO. The unified FP8 and exact flows, the rollout-dtype ablations and the other
# algorithms are in ``sanity``.
MAIN_FLOWS = ["fp32", "fp16", "bf16", "bf16_fp8rollout"]
# The dose-response dial (suite/numerics/perturbation.py): two kinds of injected mismatch, four
# magnitudes spanning fp16's to beyond FP8 rollouts' step-0 mismatch, three seeds.
DOSES = {"inject.kind": ["noise", "lowp_bias"], "inject.scale": [0.1, 0.3, 1.0, 3.0],
         "seed": [0, 1, 2]}


def _control_rows() -> list[list[str]]:
    from suite.experiments.controls import rows

    return rows()


def _class_dependent_rows() -> list[list[str]]:
    from suite.experiments.controls import CLASS_DEPENDENT, rows

    return rows(CLASS_DEPENDENT)


GRIDS: dict[str, dict[str, Any]] = {
    "main": {
        "doc": "the main job's flows: fp32 (the reference), fp16, bf16 and FP8 rollouts under "
               "plain GRPO, three seeds, judged at the calibrated line (run with the controls grid "
               "by `suite main`)",
        "axes": {"precision": MAIN_FLOWS, "seed": [0, 1, 2]},
        "overrides": ["algorithm=grpo", f"threshold={EMBEDDED_LINE}"],
    },
    "controls": {
        "doc": "the main job's controls: each known-bad recipe beside its corrections "
               "(suite/experiments/controls.py), three seeds, judged at the calibrated line",
        "rows": _control_rows,
        "axes": {"seed": [0, 1, 2]},
        "overrides": [f"threshold={EMBEDDED_LINE}"],
    },
    "controls-4bit": {
        "doc": "the 4-bit control, out of the main job because its known-bad recipe fails on one "
               "class and passes on another: NVFP4 W4A4 rollouts under plain GRPO beside score "
               "centering and the quantisation-aware flow (suite/experiments/controls.py), three "
               "seeds, judged at the calibrated line",
        "rows": _class_dependent_rows,
        "axes": {"seed": [0, 1, 2]},
        "overrides": [f"threshold={EMBEDDED_LINE}"],
    },
    "calibration-lr": {
        "doc": "the calibration's learning-rate check (docs/calibration.md): fp32 at lr 2e-4 and "
               "3e-4 (the small tier's is 1e-4) x no correction / token TIS / sequence MIS, three "
               "seeds",
        "axes": {"optim.lr": [2e-4, 3e-4], "algorithm": SOURCE_ALGORITHMS, "seed": [0, 1, 2]},
        "overrides": ["precision=fp32", "name=calibration-lr/lr${optim.lr}"],
    },
    "sanity": {
        "doc": "every precision flow x the three sanity-test algorithms, one seed, at the "
               "published line 0.95",
        "axes": {"precision": _flows, "algorithm": SANITY_ALGORITHMS, "seed": [0]},
        "overrides": [],
    },
    "sanity-full": {
        "doc": "the sanity grid with three seeds and twice the steps (the complete picture, ~2 h "
               "on 2 cores)",
        "axes": {"precision": _flows, "algorithm": SANITY_ALGORITHMS, "seed": [0, 1, 2]},
        "overrides": ["steps=200"],
    },
    "precision-ablation": {
        "doc": "every precision flow with plain GRPO, three seeds: precision alone decides",
        "axes": {"precision": _flows, "algorithm": ["grpo"], "seed": [0, 1, 2]},
        "overrides": [],
    },
    "fp8": {
        "doc": "FP8 flows (unified and FP8 rollouts) against bf16 and fp32, with and without token "
               "TIS",
        "axes": {"precision": _fp8_flows, "algorithm": ["grpo", "grpo_token_tis"],
                 "seed": [0, 1, 2]},
        "overrides": [],
    },
    "collapse-search": {
        "doc": "five regimes chosen for sensitivity x fp32/fp16/bf16/bf16_fp8rollout x plain GRPO, "
               "three seeds (60 runs; regime=... picks any of REGIMES)",
        "axes": {"regime": ["base", "tiny-set", "lr-edge", "many-updates", "stress"],
                 "precision": SEARCH_FLOWS, "seed": [0, 1, 2]},
        "overrides": ["algorithm=grpo", "name=collapse-search/${regime}"],
    },
    "h1-phantom-clip": {
        "doc": "hypothesis H1 (phantom clipping): the PPO ratio's denominator recomputed by the "
               "trainer or taken from the sampler (verl's bypass mode), GRPO's clip 0.2 / 0.28, 4 "
               "updates per rollout, x fp32/fp16/bf16/bf16_fp8rollout, three seeds",
        "axes": {"algo.ppo_ref": ["trainer", "sampler"], "precision": SEARCH_FLOWS,
                 "seed": [0, 1, 2]},
        "overrides": ["algorithm=grpo", "updates_per_step=4",
                      "name=h1-phantom-clip/${algo.ppo_ref}"],
    },
    "h2-length": {
        "doc": "hypothesis H2 (length): untruncated sequence-level IS (pg_seq_is) on arith3 / "
               "arith8 / arith16 (33-, 83- and 163-token responses; the same 4-layer policy for "
               "every length) x fp32/fp16/bf16/bf16_fp8rollout, three seeds",
        "axes": {"task": ["arith3", "arith8", "arith16"], "precision": SEARCH_FLOWS,
                 "seed": [0, 1, 2]},
        "overrides": ["algorithm=pg_seq_is", "policy.layers=4", "name=h2-length"],
    },
    "h2-emulated-length": {
        "doc": "hypothesis H2 beyond CPU lengths: fp32 on arith16 whose sampler adds Gaussian "
               "logit noise of std 1.0 (step-0 k3 4.3e-3, 31x bf16's there; mean |sequence "
               "log-ratio| 1.07 against bf16's 0.11), so that 163 tokens carry the sequence-weight "
               "variance of a much longer bf16 trace, x untruncated sequence IS (pg_seq_is), its "
               "masked correction (pg_seq_mis) and token-level GRPO, three seeds",
        "axes": {"algorithm": ["pg_seq_is", "pg_seq_mis", "grpo"], "seed": [0, 1, 2]},
        "overrides": ["task=arith16", "policy.layers=4", "precision=fp32", "inject.kind=noise",
                      "inject.scale=1.0", "name=h2-emulated-length"],
    },
    "h3-tail": {
        "doc": "hypothesis H3: the many-answer task category (2,048-word vocabulary, 16 valid "
               "words at each of 4 positions; regime tail: lr 3e-4, 400 steps) x "
               "fp32/fp16/bf16/bf16_fp8rollout, plain GRPO, three seeds",
        "axes": {"precision": SEARCH_FLOWS, "seed": [0, 1, 2]},
        "overrides": ["algorithm=grpo", "regime=tail", "name=h3-tail"],
    },
    "h4-moe": {
        "doc": "hypothesis H4: a top-2-of-4 mixture-of-experts policy (regime moe), the trainer "
               "routing by itself or replaying the sampler's experts (routing_replay), x "
               "fp32/fp16/bf16 (FP8 flows would leave the experts unquantised), plain GRPO, three "
               "seeds",
        "axes": {"routing_replay": [False, True], "precision": ["fp32", "fp16", "bf16"],
                 "seed": [0, 1, 2]},
        "overrides": ["algorithm=grpo", "regime=moe", "name=h4-moe/replay-${routing_replay}"],
    },
    "trainer-controls": {
        "doc": "the trainer-numerics controls (bf16_unified, fp16_unified: the trainer runs the "
               "sampler's own code) next to fp32, fp16, bf16, exact and bf16_fp8rollout, plain "
               "GRPO, the main job's setting, three seeds",
        "axes": {"precision": ["fp32", "fp16", "fp16_unified", "bf16", "bf16_unified", "exact",
                               "bf16_fp8rollout"],
                 "seed": [0, 1, 2]},
        "overrides": ["algorithm=grpo", "name=trainer-controls"],
    },
    "dose-response": {
        "doc": "an fp32 run whose sampler draws from a perturbed distribution (inject.kind: "
               "Gaussian logit noise, or a bias on tokens below p 0.1), four magnitudes spanning "
               "fp16's to beyond FP8 rollouts' step-0 mismatch, plain GRPO, the main job's "
               "setting, three seeds",
        "axes": DOSES,
        "overrides": ["algorithm=grpo", "precision=fp32",
                      "name=dose-response/${inject.kind}-${inject.scale}"],
    },
    # Where does score centering start to pay (arXiv 2609.20807)? The dose-response dial under
    # centering, beside the dose-response grid run with the same held-out evaluation
    # (docs/hypotheses.md; results/README.md, 4-bit section).
    "dose-centering": {
        "doc": "the dose-response grid under score centering (algo.score_centering=true: the "
               "sampler's recorded, perturbed distribution), with the policy's held-out accuracy "
               "every 25 steps (4 samples a prompt), three seeds; compare with grid=dose-response "
               "eval.every=25 eval.samples=4",
        "axes": DOSES,
        "overrides": ["algorithm=grpo", "precision=fp32", "algo.score_centering=true",
                      "eval.every=25", "eval.samples=4",
                      "name=dose-centering/${inject.kind}-${inject.scale}"],
    },
    # Does a non-precision source decide the outcome (docs/attribution.md)? Each grid switches one
    # source against its matched control, on fp32 (so the studied source is the only mismatch), x no
    # correction / token TIS / sequence MIS, three seeds, on the main job's task (base) and on the
    # many-answer task where entropy is high (tail).
    "src-top-p": {
        "doc": "a source of mismatch: rollouts with top_p 0.8, the trainer scoring the whole "
               "vocabulary (truncation none, the common bug) or renormalising over the sampler's "
               "kept set, x grpo / grpo_token_tis / grpo_seq_mis, fp32, base and tail regimes, "
               "three seeds (control: renormalise)",
        "axes": {"regime": ["base", "tail"], "sampling.truncation": ["none", "renormalise"],
                 "algorithm": SOURCE_ALGORITHMS, "seed": [0, 1, 2]},
        "overrides": ["precision=fp32", "sampling.top_p=0.8",
                      "name=src-top-p/${regime}/${sampling.truncation}"],
    },
    "src-kv-fp8": {
        "doc": "a source of mismatch: the sampler's KV cache in FP8 E4M3 (vLLM's "
               "kv_cache_dtype=fp8) or in the sampler dtype, x grpo / grpo_token_tis / "
               "grpo_seq_mis, fp32, base and tail regimes, three seeds (control: auto)",
        "axes": {"regime": ["base", "tail"], "kv_cache": ["auto", "fp8"],
                 "algorithm": SOURCE_ALGORITHMS, "seed": [0, 1, 2]},
        "overrides": ["precision=fp32", "name=src-kv-fp8/${regime}/${kv_cache}"],
    },
    "src-staleness": {
        "doc": "a source of mismatch: rollouts sampled with weights 0, 1 or 4 RL steps old "
               "(asynchronous trainers), x grpo / grpo_token_tis / grpo_seq_mis, fp32, base and "
               "tail regimes, three seeds (control: 0)",
        "axes": {"regime": ["base", "tail"], "staleness": [0, 1, 4], "algorithm": SOURCE_ALGORITHMS,
                 "seed": [0, 1, 2]},
        "overrides": ["precision=fp32", "name=src-staleness/${regime}/k${staleness}"],
    },
    "sanity-r1d": {
        "doc": "the published sanity test on GPUs: R1-Distill-Qwen-1.5B, 1,460 MATH prompts, the "
               "published recipe (task file tier full), bf16 vs fp16 x the sanity algorithms, vLLM "
               "rollouts",
        "axes": {"precision": ["bf16", "fp16"], "algorithm": SANITY_ALGORITHMS, "seed": [0]},
        "overrides": ["task=sanity_r1d", "tier=full", "engine=vllm"],
    },
    # Do 4-bit rollouts fail at this scale, and which correction recovers them? The 4-bit flows, the
    # quantisation-aware flow and the bf16 / FP8-rollout baselines x no correction, token TIS,
    # sequence MIS; score centering (arXiv 2609.20807) is a switch on top of an uncorrected row, so
    # it has its own grid.
    "fp4": {
        "doc": "4-bit rollouts (NVFP4 and MXFP4, W4A16 and W4A4), the quantisation-aware nvfp4a4 "
               "and the bf16 and FP8-rollout baselines x no correction / token TIS / sequence MIS, "
               "three seeds",
        "axes": {"precision": FP4_FLOWS, "algorithm": SOURCE_ALGORITHMS, "seed": [0, 1, 2]},
        "overrides": ["name=fp4"],
    },
    "fp4-centering": {
        "doc": "the fp4 grid's flows under plain GRPO with score centering "
               "(algo.score_centering=true, the sampler's full distribution), three seeds: the "
               "fourth correction beside the fp4 grid's three (not nvfp4a4, which trains through "
               "the sampler's own code and has no distribution to centre with)",
        "axes": {"precision": [f for f in FP4_FLOWS if f != "nvfp4a4"], "seed": [0, 1, 2]},
        "overrides": ["algorithm=grpo", "algo.score_centering=true", "name=fp4-centering"],
    },
    "algorithms": {
        "doc": "every algorithm of suite.rl.algos in bf16 and fp16, two seeds",
        "axes": {"algorithm": _algorithms, "precision": ["bf16", "fp16"], "seed": [0, 1]},
        "overrides": [],
    },
}


def get(name: str) -> dict[str, Any]:
    """The grid ``name`` with every axis resolved to a list; unknown names get a "did you mean"."""
    g = lookup("grid", name, GRIDS)
    axes = {k: list(v() if callable(v) else v) for k, v in g["axes"].items()}
    rows = g.get("rows", [[]])  # a grid of rows: each row's overrides crossed with the axes
    rows = [list(r) for r in (rows() if callable(rows) else rows)]
    return {"name": name, "doc": g["doc"], "axes": axes, "overrides": list(g["overrides"]),
            "rows": rows}


def describe() -> str:
    """One line per grid: name, size with today's flows and algorithms, doc."""
    lines = []
    for name in GRIDS:
        g = get(name)
        rows = [f"{len(g['rows'])} rows"] if len(g["rows"]) > 1 else []
        size = " x ".join(rows + [f"{len(v)} {k}" for k, v in g["axes"].items()])
        extra = f" ({' '.join(g['overrides'])})" if g["overrides"] else ""
        lines.append(f"  {name:<20} {size}{extra}: {g['doc']}")
    return "\n".join(lines)



# ---- `suite grids`: sizes and wall times --------------------------------------------------------
def _reference_times(reference_root) -> dict:
    """{machine class: {(task, tier, regime, precision, steps, updates per step): [seconds per
    run]}} from the committed references' run bundles (summary.json ``time/total_s``, config.json):
    what each kind of cell took where it was run."""
    import json

    out: dict = {}
    for summary in sorted(reference_root.glob("*/*/**/summary.json")):
        try:
            s, c = (json.loads(summary.read_text()),
                    json.loads((summary.parent / "config.json").read_text())["config"])
        except (OSError, ValueError, KeyError):
            continue
        if s.get("time/total_s") is None:
            continue
        cls = summary.relative_to(reference_root).parts[0]
        key = (c["task"], c["tier"], c.get("regime"), c["precision"], c["steps"],
               c.get("updates_per_step"))
        out.setdefault(cls, {}).setdefault(key, []).append(float(s["time/total_s"]))
    return out


def catalogue(reference_root) -> list[dict]:
    """Every grid and regime: axes, cells, steps per cell, and wall time per machine class.

    The time is *measured* where a committed reference ran the grid (its ``reference.json`` job),
    else an
    *estimate*: the sum over the grid's cells of the mean time of reference runs with the same task,
    tier, regime, flow, steps and updates per rollout on that class (cells run one after another;
    the algorithm is not matched: every algorithm runs the same loop). A class without such runs
    gets no figure. Nothing is extrapolated across steps, tiers or machine classes."""
    import itertools
    import json

    from suite.rl import compose, config, layers

    times = _reference_times(reference_root)
    jobs = {}
    for ref in sorted(reference_root.glob("*/reference.json")):
        for name, job in (json.loads(ref.read_text()).get("jobs") or {}).items():
            if job.get("wall_time_s"):
                jobs[(ref.parent.name, name)] = (float(job["wall_time_s"]),
                                                 job.get("cells_trained"))
    rows = []
    for name in GRIDS:
        g = get(name)
        cells = [dict(zip(g["axes"], v)) for v in itertools.product(*g["axes"].values())]
        fixed = [o for o in g["overrides"] if "${" not in o]
        plain = [[*fixed, *(f"{k}={v}" for k, v in c.items())] for c in cells]
        cfgs = [config.resolve(compose.from_plain(ov), layers.given(ov)) for ov in plain]
        per_class = {}
        for cls in sorted({p.parent.name for p in reference_root.glob("*/reference.json")}):
            wall, trained = jobs.get((cls, name), (None, None))
            # a job of part of the grid measures that part only
            if wall is not None and trained in (None, len(cells)):
                per_class[cls] = ("measured", wall)
                continue
            runs = [times.get(cls,
                              {}).get((c.task, c.tier, c.regime, c.precision, c.steps,
                                       c.updates_per_step))
                    for c in cfgs]
            if runs and all(runs):
                per_class[cls] = ("estimate", sum(sum(r) / len(r) for r in runs))
        rows.append({"grid": name, "doc": g["doc"], "axes": g["axes"], "cells": len(cells),
                     "steps": sorted({c.steps for c in cfgs}),
                     "tiers": sorted({c.tier for c in cfgs}), "time": per_class})
    return rows


def cli(args: list[str], console) -> int:
    """``suite grids``: the catalogue of grids and regimes as tables (suite/cli.py's cmd_grids)."""
    from rich.table import Table

    from suite.results import REFERENCE_ROOT
    from suite.rl.schema import REGIMES

    if args:
        raise ValueError(f"suite grids takes no arguments (got {' '.join(args)!r})")
    rows = catalogue(REFERENCE_ROOT)
    classes = sorted({cls for r in rows for cls in r["time"]})
    table = Table("grid", "cells", "axes", "steps (tier)", *classes,
                  title="grids; wall time per machine class: m = measured as the committed "
                        "reference ran it, e = estimate, its cells one after another")
    for row in rows:
        axes = " x ".join(f"{len(v)} {k}" for k, v in row["axes"].items())
        times = [f"{row['time'][c][1] / 60:.0f} min {row['time'][c][0][0]}" if c in row["time"]
                 else "-" for c in classes]
        table.add_row(row["grid"], str(row["cells"]), axes, f"{','.join(map(str, row['steps']))} "
                                                            f"({row['tiers'][0]})",
                      *times)
    console.print(table)
    # an installed suite reads references from ./results/reference or SUITE_REFERENCE_ROOT
    if not classes:
        from suite.locations import where_to_get_references

        console.print(f"no wall times: no committed reference under {REFERENCE_ROOT}; "
                      f"{where_to_get_references()}",
                      highlight=False)
    regimes = Table("regime", "sets", "what it tests",
                    title="regimes (regime=NAME, on top of the tier)")
    for name, r in REGIMES.items():
        regimes.add_row(name, " ".join(f"{k}={v}" for k, v in r["set"].items()) or "-", r["doc"])
    console.print(regimes)
    return 0
