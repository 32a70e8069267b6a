"""The per-arm tables of the hypotheses report (suite/analysis/hypotheses.py): for each arm and
precision flow of a hypothesis grid, the outcome and mismatch read from the runs' summaries, and the
mechanism measured per step in ``mechanism.jsonl`` (the tokens PPO's clip would zero on the
precision gap alone, the token and sequence importance weights' ESS and chi2 with the response
length at which the sequence ESS would halve, the expert sets a MoE router flips), with the helpers
that read and format those numbers. Pure functions of loaded runs whose config carries the arm as
the collapse search's regime (``hypotheses.with_arms``); each table is a header and rows of strings.
"""

from __future__ import annotations

import numpy as np

from suite.analysis import collapse, render
from suite.analysis.stats import bootstrap_ci, finite, mean_std
from suite.packed import read_log


def _mech(run) -> list[dict]:
    return read_log(run.dir, "mechanism.jsonl", missing_ok=True)


def _fmt_ms(values, spec: str, unit: str = "") -> str:
    m, s = mean_std(values)
    return "-" if m is None else (render.fmt(m, spec)
                                  + ("" if s is None else " ± " + render.fmt(s, spec)) + unit)


def mismatch_table(runs) -> tuple[list[str], list[list[str]]]:
    head = ["arm", "precision", "seeds", "step-0 k3 KL", "k3 KL, last 10 steps",
            "final acc [95% CI]", "wall time (min, summed)"]
    rows = []
    for (arm, _, prec), cell in collapse.cells(runs).items():
        done = [r for r in cell if r.verdict != "incomplete"]
        finals = finite(r.summary.get("accuracy/final") for r in done)
        ci = bootstrap_ci(finals)
        rows.append([arm, prec, f"{len(done)}/{len(cell)}",
                     _fmt_ms([r.summary.get("mismatch/step0/kl_k3") for r in done], ".2e"),
                     _fmt_ms([collapse.window_mean(r, "mismatch/kl_k3", False) for r in done],
                             ".2e"),
                     _fmt_ms(finals, ".3f") + (f" [{ci[0]:.3f}, {ci[1]:.3f}]" if ci else ""),
                     f"{sum(finite(r.summary.get('time/total_s') for r in done)) / 60:.1f}"])
    return head, rows


def mechanism_table(runs) -> tuple[list[str], list[list[str]]]:
    """Per arm and flow, from mechanism.jsonl (runs older than it fall back to metrics.jsonl's
    ppo/clip_frac_gap, logged there with the sampler reference only)."""
    head = ["arm", "precision", "gap-clipped tokens, step 1", "token IS ESS, step 1",
            "sequence IS ESS, step 1", "sequence IS ESS, min over steps",
            "entropy, first 16 positions / 17-32", "runs with mechanism.jsonl"]
    rows = []
    for (arm, _, prec), cell in collapse.cells(runs).items():
        mechs = [_mech(r) for r in cell]
        first = [m[0] for m in mechs if m]
        gap = [f.get("mech/gap_clip_frac") for f in first] or [
            (r.metrics[0] if r.metrics else {}).get("ppo/clip_frac_gap") for r in cell]
        rows.append([arm, prec,
                     _fmt_ms([g * 100 if g is not None else None for g in gap], ".3f", " %"),
                     _fmt_ms([f.get("mech/is_tok/ess") for f in first], ".5f"),
                     _fmt_ms([f.get("mech/is_seq/ess") for f in first], ".4f"),
                     _fmt_ms([min(finite(x.get("mech/is_seq/ess") for x in m), default=None)
                              for m in mechs if m], ".4f"),
                     _fmt_ms([f.get("mech/entropy/pos_1-16") for f in first], ".3f") + " / "
                     + _fmt_ms([f.get("mech/entropy/pos_17-32") for f in first], ".3f"),
                     f"{len(first)}/{len(cell)}"])
    return head, rows


def _chi2(ess: float | None) -> float | None:
    """chi2 of self-normalised weights, n sum w^2 / (sum w)^2 - 1 = 1 / ESS - 1: never negative,
    unlike the raw E_mu[w^2] - 1 of metrics.jsonl, whose sample mean over a few thousand tokens can
    fall below 1."""
    return 1.0 / ess - 1.0 if ess else None


def step1(run) -> dict:
    """Response length and the token / sequence chi2 at step 1, and the sequence chi2's maximum over
    the run."""
    mech = _mech(run)
    first = mech[0] if mech else {}
    return {"T": (run.metrics[0] if run.metrics else {}).get("response/length/mean"),
            "tok": _chi2(first.get("mech/is_tok/ess")), "seq": _chi2(first.get("mech/is_seq/ess")),
            "seq_max": _chi2(min(finite(x.get("mech/is_seq/ess") for x in mech), default=None))}


def length_table(runs) -> tuple[list[str], list[list[str]]]:
    """H2's test, per arm and flow at step 1: is the sequence weight's chi2 the token one's
    compounded over the response, 1 + chi2_seq = (1 + chi2_tok)^T (independent tokens; Liu, Li et
    al. 2025), and at what length would the sequence ESS, 1 / (1 + chi2_seq), fall to one half:
    T_1/2 = ln 2 / ln(1 + chi2_tok)?"""
    head = ["arm", "precision", "response tokens", "token chi2", "(1 + token chi2)^T - 1",
            "sequence chi2", "sequence chi2, max over steps",
            "tokens where the sequence ESS would be 1/2"]
    rows = []
    for (arm, _, prec), cell in collapse.cells(runs).items():
        one = [step1(r) for r in cell]
        predicted = [(1.0 + x["tok"]) ** x["T"] - 1.0 for x in one if x["tok"] is not None
                     and x["T"] is not None]
        half = [float(np.log(2.0) / np.log1p(x["tok"])) for x in one if x["tok"]]
        rows.append([arm, prec, _fmt_ms([x["T"] for x in one], ".1f"),
                     _fmt_ms([x["tok"] for x in one], ".2e"), _fmt_ms(predicted, ".2e"),
                     _fmt_ms([x["seq"] for x in one], ".2e"),
                     _fmt_ms([x["seq_max"] for x in one], ".2e"), _fmt_ms(half, ".3g")])
    return head, rows


def routing_table(runs) -> tuple[list[str], list[list[str]]]:
    """H4: the share of (position, layer) pairs whose top-k expert set the trainer's router chose
    differently from the sampler's (recorded with and without replay: under replay the trainer still
    runs its router)."""
    head = ["arm", "precision", "expert sets flipped, step 1", "mean over steps", "max over steps"]
    rows = []
    for (arm, _, prec), cell in collapse.cells(runs).items():
        flips = [finite(x.get("mech/moe/route_flip_frac") for x in _mech(r)) for r in cell]
        flips = [f for f in flips if f]
        rows.append([arm, prec, _fmt_ms([100 * f[0] for f in flips], ".3f", " %"),
                     _fmt_ms([100 * float(np.mean(f)) for f in flips], ".3f", " %"),
                     _fmt_ms([100 * max(f) for f in flips], ".3f", " %")])
    return head, rows
