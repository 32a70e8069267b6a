"""Early warnings of a collapse, read off a run's per-step metrics, and how well they warn.

VCPO (ICML 2026) reports that drops of the effective sample size (ESS) of the importance weights and
unstable gradient norms come before an off-policy RL run collapses; SkyRL v0.5.0's NVFP4 run
collapsed "as TIM and entropy blew up". Each signal below is a pure function of a run's rows,
returning the first step it fires (or None):

- ``ess_token`` / ``ess_seq``: the normalised ESS of the token-level / sequence-level IS weights w =
pi / mu,
  (E w)^2 / E[w^2] = 1 / (1 + chi2) with E_mu[w] = 1, from the logged ``mismatch/chi2_token`` and
  ``mismatch/chi2_seq`` (E[w^2] - 1, suite/numerics/mismatch.py), so it is available in every run
  ever written; fires below 1/2, sequential Monte Carlo's resampling rule (Doucet and Johansen, "A
  tutorial on particle filtering and smoothing", 2009, Sec. 3.5: resample when ESS < N/2);
- ``grad_norm``: the gradient norm non-finite, or above ``SPIKE`` times the median of the ``WINDOW``
steps before it;
- ``entropy``: the mean token entropy above ``SPIKE`` times its median over the first ``WINDOW``
steps.

A collapse's onset is the first step after the peak at which the reward's trailing mean (the
verdict's window, suite/results.py) falls to the peak - 0.25, or below the initial reward - 0.1 (the
verdict's two collapse rules); a signal warned when it fired at or before the onset. ``tally``
counts, per signal, the collapses it warned of (with the lead in steps) and the runs that passed or
stayed unstable in which it fired anyway.
"""
from __future__ import annotations

import hashlib
import json
import math
import statistics
from pathlib import Path

from suite.packed import read_log
from suite.results import PEAK_WINDOW, find_run_dirs

WINDOW = 10  # steps of the baseline a spike is measured against
SPIKE = 3.0  # a value this many times its baseline fires the gradient-norm and entropy signals
ESS_FLOOR = 0.5


def _first(rows: list[dict], fires) -> int | None:
    return next((int(r["step"]) for i, r in enumerate(rows) if fires(i, r)), None)


def _ess(key: str):
    def signal(rows: list[dict]) -> int | None:
        def fires(_, r):
            chi2 = r.get(key)
            return isinstance(chi2, (int, float)) and (not math.isfinite(chi2)
                                                       or 1 / (1 + max(chi2, 0.0)) < ESS_FLOOR)
        return _first(rows, fires)
    return signal


def grad_norm(rows: list[dict]) -> int | None:
    g = [r.get("train/grad_norm") for r in rows]

    def fires(i, _):
        if g[i] is None:
            return False
        if not math.isfinite(g[i]):
            return True
        before = [x for x in g[max(0, i - WINDOW):i] if x is not None and math.isfinite(x)]
        return len(before) == WINDOW and g[i] > SPIKE * statistics.median(before)
    return _first(rows, fires)


def entropy(rows: list[dict]) -> int | None:
    head = [r["entropy/mean"] for r in rows[:WINDOW]
            if isinstance(r.get("entropy/mean"), (int, float))]
    if len(head) < WINDOW:
        return None
    base = statistics.median(head)
    return _first(rows, lambda i, r: i >= WINDOW and isinstance(r.get("entropy/mean"), (int, float))
                  and r["entropy/mean"] > SPIKE * base)


SIGNALS = {"ess_token": _ess("mismatch/chi2_token"), "ess_seq": _ess("mismatch/chi2_seq"),
           "grad_norm": grad_norm, "entropy": entropy}


def onset(rows: list[dict]) -> int | None:
    """The step a collapse began: the trailing mean reward reaches peak - 0.25 after the peak, or
    initial - 0.1."""
    r = [float(x["reward/mean"]) for x in rows]
    w = min(PEAK_WINDOW, len(r))
    if not w:
        return None
    moving = [sum(r[i:i + w]) / w for i in range(len(r) - w + 1)]
    top = max(range(len(moving)), key=moving.__getitem__)
    for i in range(top, len(moving)):
        if moving[i] <= moving[top] - 0.25 or moving[i] < r[0] - 0.1:
            return int(rows[i + w - 1]["step"])
    return None


def of_rows(rows: list[dict], verdict: str | None) -> dict:
    """The first step each signal fired, the collapse's onset (collapsed runs) and each signal's
    lead on it."""
    fired = {name: fn(rows) for name, fn in SIGNALS.items()}
    start = onset(rows) if verdict == "collapse" else None
    return {"verdict": verdict, "onset": start, "fired": fired,
            "lead": {n: (start - s if start is not None and s is not None and s <= start else None)
                     for n, s in fired.items()}}


def of_run(run_dir: Path, rows: list[dict] | None = None) -> dict:
    """``of_rows`` of a run directory (``rows``: its metrics when already read)."""
    rows = read_log(run_dir, "metrics.jsonl", missing_ok=True) if rows is None else rows
    summary = run_dir / "summary.json"
    verdict = json.loads(summary.read_text()).get("verdict") if summary.is_file() else None
    return {"run": str(run_dir), **of_rows(rows, verdict)}


def report_table(runs: list[tuple[str, list[dict], str]]) -> tuple[
    list[str], list[list[str]], str] | None:
    """The report's section: for every run of (label, metric rows, verdict) that did not pass, the
    first step each signal fired (with its lead on a collapse's onset); the caption counts the
    passing runs it fired in anyway (false alarms). None when every run passed or none could be
    judged."""
    judged = [(label, of_rows(rows, verdict)) for label, rows, verdict in runs
              if verdict in ("pass", "unstable", "collapse")]
    failing = [(label, r) for label, r in judged if r["verdict"] != "pass"]
    if not failing:
        return None
    head = ["run", "verdict", "collapse onset (step)",
            *(f"{n}: first step (lead)" for n in SIGNALS)]
    rows = [[label, r["verdict"], "-" if r["onset"] is None else str(r["onset"]),
             *("-" if r["fired"][n] is None else f"{r['fired'][n]}"
               + ("" if r["lead"][n] is None else
                                                                        f" ({r['lead'][n]})")
               for n in SIGNALS)]
            for label, r in failing]
    passing = [r for _, r in judged if r["verdict"] == "pass"]
    alarms = ", ".join(f"{n} {sum(r['fired'][n] is not None for r in passing)}" for n in SIGNALS)
    caption = ("Early warnings (suite/analysis/early_warnings.py): ess_token / ess_seq = first "
               "step the normalised effective sample size of the token / sequence IS weights, 1 / "
               f"(1 + chi2), fell below {ESS_FLOOR:g}; grad_norm = first step the gradient norm "
               f"was non-finite or above {SPIKE:g}x the median of the {WINDOW} steps before; "
               f"entropy = first step the mean entropy exceeded {SPIKE:g}x its median over the "
               f"first {WINDOW} steps; lead = onset - first step, for a signal that fired at or "
               f"before a collapse's onset. The same signals fired in the {len(passing)} passing "
               f"run(s) too (false alarms): {alarms}.")
    return head, rows, caption


def tally(roots: list[Path]) -> dict:
    """Per signal: collapses warned of (and the median lead), and how often it fired in passing and
    unstable runs. A run committed twice (the main job's references repeat the grids that are their
    evidence, byte for byte) counts once."""
    seen, runs = set(), []
    for d in (d for root in roots for d in find_run_dirs(Path(root))):
        # keyed by the rows, so a log stored plain in one place and packed in another is one run;
        # each log is read once (reading them is most of this function's time)
        rows = read_log(d, "metrics.jsonl")
        if (key := hashlib.sha256(json.dumps(rows, allow_nan=True).encode()).digest()) not in seen:
            seen.add(key)
            runs.append(of_run(d, rows))
    out = {"runs": len(runs), "signals": {}}
    for name in SIGNALS:
        fell = [r for r in runs if r["verdict"] == "collapse" and r["onset"] is not None]
        leads = [r["lead"][name] for r in fell if r["lead"][name] is not None]
        row = {"collapses": len(fell), "warned": len(leads), "median_lead": statistics.median(leads)
               if leads else None}
        for v in ("pass", "unstable"):
            these = [r for r in runs if r["verdict"] == v]
            row[v] = len(these)
            row[f"fired_in_{v}"] = sum(r["fired"][name] is not None for r in these)
        out["signals"][name] = row
    return out


def markdown(t: dict) -> str:
    lines = ["| signal | collapses warned of (median lead, steps) | fired in passing runs | fired "
             "in unstable runs |",
             "|---|---|---|---|"]
    for name, r in t["signals"].items():
        lead = "" if r["median_lead"] is None else f" ({r['median_lead']:g})"
        lines.append(f"| {name} | {r['warned']} of {r['collapses']}{lead} | {r['fired_in_pass']} "
                     f"of {r['pass']} | {r['fired_in_unstable']} of {r['unstable']} |")
    return "\n".join(lines)
