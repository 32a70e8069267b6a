"""Named grids: the experiments ``suite sweep grid=NAME`` runs.

A grid is data: ``axes`` (config field -> values; the sweep is their Cartesian product),
``overrides`` (plain ``key=value`` applied to every cell) and a one-line ``doc``. An axis may
be a function instead of a list; it is called when the grid is looked up, so a grid over
"every precision flow" picks up flows added to ``suite.precision.FLOWS`` later without an
edit here. Any axis or field can be replaced on the command line (``seed=0,1,2``,
``tier=smoke``); see ``suite/sweep.py`` and docs/sweeps.md.
"""

from __future__ import annotations

from typing import Any

from suite.names import lookup


def _flows() -> list[str]:
    from suite.precision import FLOWS

    return list(FLOWS)


def _fp8_flows() -> list[str]:
    """Every flow with FP8 somewhere (unified FP8, FP8 rollouts), against bf16 and fp32; table order."""
    return [f for f in _flows() if "fp8" in f or f in ("bf16", "fp32")]


def _algorithms() -> list[str]:
    from suite.algos import ALGORITHMS

    return list(ALGORITHMS)


# The precision-robust algorithms of the published sanity test (REFERENCE section 1):
# plain PPO-clip, token-level truncated IS, sequence-level IS policy gradient.
SANITY_ALGORITHMS = ["grpo", "grpo_token_tis", "pg_seq_is"]

GRIDS: dict[str, dict[str, Any]] = {
    "sanity": {
        "doc": "the main job: every precision flow x the three sanity-test algorithms, one seed",
        "axes": {"precision": _flows, "algorithm": SANITY_ALGORITHMS, "seed": [0]},
        "overrides": [],
    },
    "sanity-full": {
        "doc": "the sanity grid with three seeds and twice the steps (the complete picture, ~2 h on 2 cores)",
        "axes": {"precision": _flows, "algorithm": SANITY_ALGORITHMS, "seed": [0, 1, 2]},
        "overrides": ["steps=200"],
    },
    "precision-ablation": {
        "doc": "every precision flow with plain GRPO, three seeds: precision alone decides",
        "axes": {"precision": _flows, "algorithm": ["grpo"], "seed": [0, 1, 2]},
        "overrides": [],
    },
    "fp8": {
        "doc": "FP8 flows (unified and FP8 rollouts) against bf16 and fp32, with and without token TIS",
        "axes": {"precision": _fp8_flows, "algorithm": ["grpo", "grpo_token_tis"], "seed": [0, 1, 2]},
        "overrides": [],
    },
    "algorithms": {
        "doc": "every algorithm of suite.algos in bf16 (collapses) and fp16 (the fix), two seeds",
        "axes": {"algorithm": _algorithms, "precision": ["bf16", "fp16"], "seed": [0, 1]},
        "overrides": [],
    },
}


def get(name: str) -> dict[str, Any]:
    """The grid ``name`` with every axis resolved to a list; unknown names get a "did you mean"."""
    g = lookup("grid", name, GRIDS)
    axes = {k: list(v() if callable(v) else v) for k, v in g["axes"].items()}
    return {"name": name, "doc": g["doc"], "axes": axes, "overrides": list(g["overrides"])}


def describe() -> str:
    """One line per grid: name, size with today's flows and algorithms, doc."""
    lines = []
    for name in GRIDS:
        g = get(name)
        size = " x ".join(f"{len(v)} {k}" for k, v in g["axes"].items())
        extra = f" ({' '.join(g['overrides'])})" if g["overrides"] else ""
        lines.append(f"  {name:<20} {size}{extra}: {g['doc']}")
    return "\n".join(lines)

