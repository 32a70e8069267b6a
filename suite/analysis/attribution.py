"""The attribution table and waterfall of ``suite attribute``: pure functions of its rows.

Rows (suite/experiments/attribute.py ``run_probe``): one per (configuration, batch, seed) with the
metrics of ``METRICS``. Per metric and replicate (batch, seed):

    total = full - base (base: the matched pair; with vLLM, "kernels only") on[s] = (base + req(s) +
    s) - (base + req(s)) one source switched on, given what it requires off[s] = full - (full - s -
    dep(s)) one source switched off from the full stack
    interaction = total - sum_s on[s] so that sum_s on[s] + interaction = total exactly share[s] =
    on[s] / total (and interaction / total): the shares sum to 1

req(s): the sources ``s`` exists only with (``requires``; ``packing`` requires ``kernels``: packing
is a property of the trainer's HF forward, which the matched pair does not run), empty for the
others, so on[s] is the plain (base + s) - base; dep(s): the sources that require ``s``, switched
off with it. The identity still holds exactly: the interaction is the residual whatever the on
effects are.

Means over replicates with 95% percentile-bootstrap intervals (suite/analysis/stats.py). A source
whose ``on`` and ``off`` differ interacts with the others (e.g. truncation shifts which tokens carry
the rounding error).
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np

from suite.analysis.stats import bootstrap_ci

METRIC_LABELS = {"k3": "k3 KL", "dp": "mean |dp|", "tme": "token-mult. error - 1",
                 "out_0.9_1.1": "frac outside [0.9, 1.1]", "out_0.5_2": "frac outside [0.5, 2]",
                 "kl_full": "full-vocab KL(mu||pi)", "tv": "full-vocab TV"}
# one per family of the peers' mismatch metrics: k3 share, mean |dp|, TME, frac outside
TABLE_METRICS = ("k3", "dp", "tme", "out_0.9_1.1")


def _key(config) -> frozenset:
    return frozenset(config)


def _replicates(rows: list[dict]) -> dict:
    """{(batch, seed): {config: row}}"""
    out: dict = {}
    for r in rows:
        out.setdefault((r["batch"], r["seed"]), {})[_key(r["config"])] = r
    return out


def _interval(values) -> dict:
    xs = [float(v) for v in values]
    ci = bootstrap_ci(xs)
    return {"mean": float(np.mean(xs)), "lo": ci[0] if ci else None, "hi": ci[1] if ci else None,
            "n": len(xs)}


def summarise(rows: list[dict], stack: list[str], base: list[str],
              requires: dict | None = None) -> dict:
    """Per metric: base and full values, on/off effects, interaction and shares, each with its
    interval, and the additivity check (max over replicates of |sum on + interaction - total|, 0 up
    to float addition). ``requires``: source -> the sources it is measured given
    (suite/experiments/attribute.py REQUIRES)."""
    reps = _replicates(rows)
    base_k, full_k = _key(base), _key(stack)
    free = [s for s in stack if s not in base]
    req = {s: frozenset((requires or {}).get(s, ())) for s in stack}
    given = {s: base_k | req[s] for s in free}  # what the one-on effect of s is measured from
    dropped = {s: {s} | {t for t in stack if s in req[t]} for s in free}  # switched off with s
    out = {"stack": list(stack), "base": list(base), "sources": free, "replicates": len(reps),
           "metrics": {}, "requires": {s: sorted(req[s]) for s in free if req[s]}}
    for metric in METRIC_LABELS:
        per = {"base": [], "full": [], "total": [], "interaction": [], "check": []}
        on = {s: [] for s in free}
        off = {s: [] for s in free}
        share = {s: [] for s in free + ["interaction"]}
        for cfgs in reps.values():
            b, f = cfgs[base_k][metric], cfgs[full_k][metric]
            effects = {s: cfgs[given[s] | {s}][metric] - cfgs[given[s]][metric] for s in free}
            total = f - b
            inter = total - sum(effects.values())
            per["base"].append(b)
            per["full"].append(f)
            per["total"].append(total)
            per["interaction"].append(inter)
            per["check"].append(abs(sum(effects.values()) + inter - total))
            for s in free:
                on[s].append(effects[s])
                off[s].append(f - cfgs[full_k - dropped[s]][metric])
                share[s].append(effects[s] / total if total else math.nan)
            share["interaction"].append(inter / total if total else math.nan)
        out["metrics"][metric] = {
            **{k: _interval(v) for k, v in per.items() if k != "check"},
            "on": {s: _interval(v) for s, v in on.items()},
            "off": {s: _interval(v) for s, v in off.items()},
            "share": {s: _interval([x for x in v if math.isfinite(x)] or [math.nan])
                      for s, v in share.items()},
            "additivity_error": max(per["check"]),
        }
    return out


def _fmt(iv: dict, pct: bool = False) -> str:
    if iv["mean"] is None or not math.isfinite(iv["mean"]):
        return "-"
    f = (lambda x: f"{100 * x:.0f}%") if pct else (lambda x: f"{x:.2e}")
    return f(iv["mean"]) + (f" [{f(iv['lo'])}, {f(iv['hi'])}]" if iv["lo"] is not None else "")


def label(summary: dict, source: str) -> str:
    """A source's row label: "packing (given kernels)" for one measured given others (summaries
    written before ``requires`` existed have none)."""
    req = summary.get("requires", {}).get(source)
    return f"{source} (given {', '.join(req)})" if req else source


def table_rows(summary: dict) -> tuple[list[str], list[list[str]]]:
    """The attribution table: one row per source (on effect and share of k3, then the on effects of
    mean |dp|, TME - 1 and the fraction outside [0.9, 1.1]), the interaction, base and full
    stack."""
    m = summary["metrics"]
    head = ["source", "k3: on", "k3 share", "k3: off",
            *[f"{METRIC_LABELS[k]}: on" for k in TABLE_METRICS[1:]]]
    rows = [[label(summary, s), _fmt(m["k3"]["on"][s]), _fmt(m["k3"]["share"][s], True),
             _fmt(m["k3"]["off"][s]), *[_fmt(m[k]["on"][s]) for k in TABLE_METRICS[1:]]]
            for s in summary["sources"]]
    rows.append(["interaction", _fmt(m["k3"]["interaction"]),
                 _fmt(m["k3"]["share"]["interaction"], True), "",
                 *[_fmt(m[k]["interaction"]) for k in TABLE_METRICS[1:]]])
    base = " + ".join(summary["base"]) or "matched pair"
    rows.append([f"base ({base})", _fmt(m["k3"]["base"]), "", "",
                 *[_fmt(m[k]["base"]) for k in TABLE_METRICS[1:]]])
    rows.append(["full stack", _fmt(m["k3"]["full"]), "100%", "",
                 *[_fmt(m[k]["full"]) for k in TABLE_METRICS[1:]]])
    return head, rows


def check_sentence(summary: dict) -> str:
    err = max(v["additivity_error"] for v in summary["metrics"].values())
    return ("Check: for every metric and replicate, sum of the one-on effects + interaction = full "
            f"- base (largest deviation {err:.1e}, float addition).")


def caption(summary: dict) -> str:
    return f"{summary['replicates']} replicates = batches x seeds; mean [95% bootstrap interval]"


def table_markdown(summary: dict, title: str) -> str:
    """The attribution table as Markdown, with its check line (what ``suite attribute`` prints and
    writes)."""
    head, rows = table_rows(summary)
    lines = [f"**{title}** ({caption(summary)})", "", "| " + " | ".join(head) + " |", "|"
             + "---|" * len(head)]
    lines += ["| " + " | ".join(r) + " |" for r in rows]
    return "\n".join([*lines, "", check_sentence(summary)])


def find(root: Path) -> list[Path]:
    """The ``attribution.json`` files of ``suite attribute`` in a results directory: its
    ``attribute/<stack>/`` folders (the command's default place), or the directory itself when it is
    one of them or their parent."""
    root = Path(root)
    return sorted({*root.glob("attribution.json"), *root.glob("*/attribution.json"),
                   *root.glob("attribute/*/attribution.json")})


def title_of(summary: dict) -> str:
    """"bf16, engine torch, <class>: 128 responses x 2 batches x 2 seeds"."""
    from suite.numerics import machine

    cls = summary.get("machine_class")
    cls = machine.label(cls) if cls and "id" in cls else "unknown class"
    return (f"{summary.get('precision')}, engine {summary.get('engine')}, {cls}: "
            f"{summary.get('responses_per_batch')} responses x {summary.get('batches')} batches x "
            f"{summary.get('seeds')} seeds")


def report_section(paths: list[Path], fig_dir: Path) -> list[tuple]:
    """The report's section "Mismatch by source": per attribution, its table, check and
    waterfall."""
    import json

    doc: list[tuple] = [("h", "Mismatch by source (suite attribute)", "attribution"),
                        ("p", "On the same batches, each source of the mismatch switched on alone "
                              "from a matched pair (the trainer replaying the sampler's own decode "
                              "loop: mismatch exactly 0; a source that exists only with another, "
                              "as packing with the trainer's kernels, given it) and off alone from "
                              "the full stack; the interaction is what the one-at-a-time effects "
                              "leave of the total (docs/attribution.md).")]
    fig_dir.mkdir(parents=True, exist_ok=True)
    for i, path in enumerate(paths):
        summary = json.loads(Path(path).read_text(encoding="utf-8"))
        title = title_of(summary)
        stem = f"attribution_{i}"
        waterfall(summary, fig_dir / stem, title)
        head, rows = table_rows(summary)
        doc += [("p", f"{title} ({path.parent.name})"), ("table", head, rows, caption(summary)),
                ("p", check_sentence(summary)),
                ("fig", stem, "Waterfall: base, each source's one-on effect (whiskers: 95% "
                              "intervals) and the interaction, stacking up to the full stack.")]
    return doc


def waterfall(summary: dict, stem: Path, title: str, metrics=("k3", "out_0.9_1.1")) -> list[str]:
    """Waterfall per metric: base, then each source's one-on effect and the interaction stacked up
    to the full stack; the whiskers are the effects' 95% intervals."""
    import matplotlib.pyplot as plt

    # sets matplotlib up first (Agg backend, the report style)
    from suite.analysis.figures import save

    fig, axes = plt.subplots(1, len(metrics), figsize=(5.6 * len(metrics), 3.8), squeeze=False)
    for ax, metric in zip(axes[0], metrics):
        m = summary["metrics"][metric]
        names = ["base", *[label(summary, s) for s in summary["sources"]], "interaction",
                 "full stack"]
        steps = [m["base"], *[m["on"][s] for s in summary["sources"]], m["interaction"]]
        level, x = 0.0, np.arange(len(names))
        for i, iv in enumerate(steps):
            bottom = 0.0 if i == 0 else level
            color = "0.55" if i == 0 else ("tab:red" if iv["mean"] >= 0 else "tab:green")
            ax.bar(i, iv["mean"], bottom=bottom, color=color, width=0.7)
            if i and iv["lo"] is not None:
                ax.errorbar(i, bottom + iv["mean"],
                            yerr=[[iv["mean"] - iv["lo"]], [iv["hi"] - iv["mean"]]], color="k",
                            capsize=3, lw=0.8)
            level = bottom + iv["mean"]
        ax.bar(len(names) - 1, m["full"]["mean"], color="tab:blue", width=0.7)
        ax.axhline(0, color="k", lw=0.6)
        ax.set_xticks(x, names, rotation=35, ha="right")
        ax.set_title(METRIC_LABELS[metric])
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    return save(fig, stem)

