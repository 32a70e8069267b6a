"""What the reproducibility report shows, as text: pure functions of loaded runs
(suite.analysis.runs.Run).

Runs are grouped into cells (task, algorithm, precision) with across-seed statistics
(suite/analysis/stats.py); each table is a header and rows of strings; the warnings name what makes
runs less comparable than the grid axes allow. suite/analysis/report.py assembles these into a
document, a list of blocks, which suite/analysis/pages.py renders as HTML and as Markdown so that
both files say the same:
  ("h", text, anchor) | ("p", text) | ("warn", [text]) | ("table", head, rows, caption) |
  ("fig", stem, caption) | ("pre", text)
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING

from suite.analysis import stats
from suite.results import LOCATION_KEYS
from suite.rl.provenance import flatten

if TYPE_CHECKING:
    from suite.analysis.runs import Run

GRID_AXES = ("precision", "algorithm", "seed")  # what may differ between cells of one report
VERDICTS = ("pass", "at_line", "collapse", "unstable", "too_short", "incomplete")
# env.json fields that must agree across a results directory for its cells to be comparable.
ENV_CHECKED = ("git_sha", "python", "cpu_model", "cpu_count", "gpus", "torch_threads", "engine",
               "lm_head_fp32", "task.name", "task.version", "dataset.sha256", "dataset.prompts",
               "policy.params")
MISMATCH_PLOT = {"mismatch/kl_k3": "k3 KL (sampler || trainer)",
                 "mismatch/prob_diff/max": "max |p_trainer - p_sampler|",
                 "mismatch/seq_log_ratio/mean_abs": "mean |sequence log-ratio|"}
IS_PLOT = {"is/ess": "IS effective sample size (normalised)", "is/weight/max": "max raw IS weight"}
# held-out evaluation and transfer index, when runs have them
EXTRA_PREFIXES = ("eval/", "transfer/")

# Published outcomes of the sanity test (arXiv 2510.26788, numbers are
# approximate write-ups of the paper). `algorithm` None matches any algorithm of that flow;
# `expect` is the set of our verdicts consistent with the published outcome.
PUBLISHED_SANITY = (
    {"precision": "bf16", "algorithm": "grpo", "setting": "BF16, GRPO (PPO-clip, Dr.GRPO)",
     "outcome": "collapses; peak train acc ~73% (VeRL) / ~84% (Oat)", "expect": ("collapse",)},
    {"precision": "bf16", "algorithm": "grpo_token_tis", "setting": "BF16, GRPO + token TIS",
     "outcome": "collapses later; peak ~82% / ~88%", "expect": ("collapse",)},
    {"precision": "bf16", "algorithm": "gspo", "setting": "BF16, GSPO",
     "outcome": "grad norm NaN after ~1,200 steps (VeRL)", "expect": ("collapse", "incomplete")},
    {"precision": "bf16", "algorithm": "grpo_seq_mis", "setting": "BF16, GRPO + seq MIS",
     "outcome": "stable but slow, peak ~95%", "expect": ("pass", "unstable")},
    {"precision": "fp16", "algorithm": "pg_seq_is", "setting": "FP16, PG-Seq-IS",
     "outcome": "~99%, fast and stable", "expect": ("pass",)},
    {"precision": "fp16", "algorithm": None, "setting": "FP16, other algorithms",
     "outcome": "all FP16 algorithms nearly coincide (~99%)", "expect": ("pass",)},
    {"precision": "bf16_fp32rollout", "algorithm": None, "setting": "BF16 train + FP32 rollout",
     "outcome": "stable, ~3x slower", "expect": ("pass", "unstable")},
    {"precision": "bf16_fp16rollout", "algorithm": None, "setting": "BF16 train + FP16 rollout",
     "outcome": "better than BF16/BF16, still unstable", "expect": ("unstable", "collapse")},
)
SANITY_TASK = "sanity_r1d"


# ---------------------------------------------------------------------------- numbers as text
def fmt(x, spec=".3f"):
    if x is None:
        return "-"
    if isinstance(x, int) and not isinstance(x, bool):
        return str(x)  # steps and counts
    if isinstance(x, float):
        return format(x, spec)
    return str(x)


def ratio_caption(rows: list[dict]) -> str:
    """bf16/fp16 ratios of the step-0 mismatch, when both flows are present (same task, algorithm,
    seed)."""
    by = {(r.get("task"), r.get("algorithm"), r.get("seed"), r.get("precision")): r for r in rows}
    parts = []
    for (task, algo, seed, prec), r in sorted(by.items(), key=lambda kv: tuple(map(str, kv[0]))):
        other = by.get((task, algo, seed, "fp16"))
        if prec != "bf16" or other is None:
            continue
        ratios = []
        for key, label in (("prob_diff/mean", "mean abs dp"), ("kl_k3", "k3 KL"),
                           ("seq_log_ratio/mean_abs", "mean abs seq log-ratio")):
            a, b = r.get(f"mismatch/step0/{key}"), other.get(f"mismatch/step0/{key}")
            if a is not None and b:
                ratios.append(f"{label} {a / b:.1f}x")
        parts.append(f"step-0 mismatch bf16/fp16 ({algo}, seed {seed}): " + ", ".join(ratios))
    return "\n".join(parts)


# ------------------------------------------------------------------------ cells: the verdict table
def flow_order(precisions) -> list[str]:
    """Precision flows in the order of suite.numerics.precision.FLOWS, unknown ones after,
    sorted."""
    try:
        from suite.numerics.precision import FLOWS

        known = list(FLOWS)
    except Exception:  # a report must not need torch to render
        known = []
    present = set(precisions)
    return [f for f in known if f in present] + sorted(present - set(known))


def group_cells(runs: list[Run]) -> dict[tuple[str, str, str], list[Run]]:
    """(task, algorithm, precision) -> runs sorted by seed; cells ordered by task, algorithm, flow
    order."""
    order = {f: i for i, f in enumerate(flow_order(r.precision for r in runs))}
    cells: dict[tuple[str, str, str], list[Run]] = {}
    for r in sorted(runs, key=lambda r: (r.task, r.algorithm, order[r.precision], r.seed, r.label)):
        cells.setdefault((r.task, r.algorithm, r.precision), []).append(r)
    return cells


def extra_keys(runs: list[Run]) -> list[str]:
    """Summary keys of held-out evaluation / transfer index (eval/*, transfer/*) present in any
    run."""
    return sorted({k for r in runs for k in r.summary if k.startswith(EXTRA_PREFIXES)})


def cell_stats(cell: list[Run], extras: list[str] = ()) -> dict:
    """Across-seed numbers of one cell. Accuracy statistics use complete runs only (a run that
    died at step 3 has no meaningful peak); counts cover every run."""
    done = [r for r in cell if r.verdict != "incomplete"]
    counts = {v: sum(r.verdict == v for r in cell) for v in VERDICTS}
    out = {"runs": len(cell), "seeds": [r.seed for r in cell], "counts": counts,
           "complete": len(done), "failed": sum(r.status == "failed" for r in cell)}
    for key in ("peak", "final"):
        vals = stats.finite(r.summary.get(f"accuracy/{key}") for r in done)
        mean, std = stats.mean_std(vals)
        out[key] = {"values": vals, "mean": mean, "std": std, "ci": stats.bootstrap_ci(vals),
                    "iqm": stats.iqm(vals)}
    firsts = [r.summary.get("accuracy/first_pass_step") for r in done]
    reached = stats.finite(firsts)
    out["first_pass"] = {"values": firsts, "reached": len(reached),
                         "mean": stats.mean_std(reached)[0]}
    out["extra"] = {k: stats.mean_std(r.summary.get(k) for r in done) for k in extras}
    return out


def _pm(mean, std, n=None) -> str:
    if mean is None:
        return "-"
    return f"{mean:.3f} ± {std:.3f}" if std is not None else f"{mean:.3f} (n={n or 1})"


def _ci(ci) -> str:
    return "-" if ci is None else f"[{ci[0]:.3f}, {ci[1]:.3f}]"


def verdict_table(runs: list[Run]) -> tuple[list[str], list[list[str]]]:
    """One row per cell; only the columns that carry information at the number of seeds there is
    (informative_columns)."""
    extras = extra_keys(runs)
    cells = group_cells(runs)
    # one run per cell: a value, not a mean ± std
    one = max((len(c) for c in cells.values()), default=0) <= 1
    pm = (lambda m, sd: fmt(m)) if one else _pm
    head = ["task", "algorithm", "precision", "seed ids", "pass", "at the line", "collapse",
            "unstable", "too short to judge", "incomplete (failed)",
            "peak acc" if one else "peak acc mean ± std", "peak 95% CI",
            "final acc" if one else "final acc mean ± std", "final 95% CI", "final IQM",
            "first pass step" if one else "first pass step: mean (reached)"]
    head += [k if one else f"{k} mean ± std" for k in extras]
    rows = []
    for (task, algo, prec), cell in cells.items():
        s = cell_stats(cell, extras)
        c, fp = s["counts"], s["first_pass"]
        rows.append([task, algo, prec, ",".join(map(str, s["seeds"])), str(c["pass"]),
                     str(c["at_line"]), str(c["collapse"]), str(c["unstable"]), str(c["too_short"]),
                     f"{c['incomplete']} ({s['failed']})", pm(s["peak"]["mean"], s["peak"]["std"]),
                     _ci(s["peak"]["ci"]), pm(s["final"]["mean"], s["final"]["std"]),
                     _ci(s["final"]["ci"]), "-" if one else fmt(s["final"]["iqm"]),
                     fmt(fp["mean"], ".0f") if one
                     else f"{fmt(fp['mean'], '.1f')} ({fp['reached']}/{s['complete']})"]
                    + [pm(*s["extra"][k]) for k in extras])
    return informative_columns(head, rows, keep=("task", "algorithm", "precision", "pass"))


EMPTY = ("-", "", "0", "0 (0)")


def informative_columns(head: list[str], rows: list[list[str]],
                        keep=()) -> tuple[list[str], list[list[str]]]:
    """Drop the columns whose every cell says nothing ('-', empty, a count of 0), except those in
    ``keep``."""
    cols = [i for i, h in enumerate(head) if h in keep or any(r[i] not in EMPTY for r in rows)]
    return [head[i] for i in cols], [[r[i] for i in cols] for r in rows]


def run_table(runs: list[Run]) -> tuple[list[str], list[list[str]]]:
    head = ["run", "status", "steps", "peak acc (step)", "final acc", "first pass step",
            "step-0 k3 KL", "final k3 KL", "skipped steps", "time s"]
    rows = []
    for r in runs:
        s = r.summary
        rows.append([r.label, r.status,
                     f"{s.get('steps_done', len(r.metrics))}/{s.get('total_steps', '?')}",
                     f"{fmt(s.get('accuracy/peak'))} ({fmt(s.get('accuracy/peak_step'))})",
                     fmt(s.get("accuracy/final")), fmt(s.get("accuracy/first_pass_step")),
                     fmt(s.get("mismatch/step0/kl_k3"), ".2e"),
                     fmt(s.get("mismatch/final/kl_k3"), ".2e"), fmt(s.get("train/skipped_steps")),
                     fmt(s.get("time/total_s"), ".0f")])
    return head, rows


def uses_loss_scaling(r: Run) -> bool:
    flow = (r.env or {}).get("precision")
    if isinstance(flow, dict) and "loss_scaling" in flow:
        return bool(flow["loss_scaling"])
    return any(m.get("train/loss_scale") not in (None, 1.0) for m in r.metrics)


def loss_scale_table(runs: list[Run]) -> tuple[list[str], list[list[str]]]:
    """Per run with dynamic loss scaling: the scale's trajectory (start, min, end, halvings,
    doublings) and skipped steps."""
    head = ["run", "status", "initial scale", "min scale", "final scale", "back-offs", "growths",
            "skipped steps", "NaN grad-norm steps"]
    rows = []
    for r in runs:
        scales = stats.finite(m.get("train/loss_scale") for m in r.metrics)
        if not uses_loss_scaling(r) or not scales:
            continue
        down = sum(b < a for a, b in zip(scales, scales[1:]))
        up = sum(b > a for a, b in zip(scales, scales[1:]))
        rows.append([r.label, r.status, f"{scales[0]:g}", f"{min(scales):g}", f"{scales[-1]:g}",
                     str(down), str(up), fmt(r.summary.get("train/skipped_steps")),
                     fmt(r.summary.get("train/nan_grad_steps"))])
    return head, rows


def is_table(runs: list[Run]) -> tuple[list[str], list[list[str]]]:
    """Per cell: every is/* metric as mean [min, max] over all steps of all its runs."""
    keys = sorted({k for r in runs for m in r.metrics for k in m if k.startswith("is/")})
    head = ["task", "algorithm", "precision", "steps"] + keys
    rows = []
    for (task, algo, prec), cell in group_cells(runs).items():
        vals = {k: stats.finite(m.get(k) for r in cell for m in r.metrics) for k in keys}
        if not any(vals.values()):
            continue
        n = sum(len(r.metrics) for r in cell)
        rows.append([task, algo, prec, str(n)] + [
            f"{stats.mean_std(v)[0]:.3g} [{min(v):.3g}, {max(v):.3g}]" if v else "-"
            for v in vals.values()])
    return head, rows


def flow_label(r: Run) -> str:
    """The precision flow, tagged with the training loop when it is not the suite's own: the same
    flow run by two loops is two samplers and two trainers, so their mismatch is never pooled."""
    return r.precision if r.framework == "suite" else f"{r.precision} [{r.framework}]"


def step0_table(runs: list[Run]) -> tuple[list[str], list[list[str]]]:
    """Step-0 mismatch per flow. Runs of one flow that share a seed measure the same step 0 (same
    policy, prompts and samples; the algorithm acts only after it), so identical values are one
    measurement, shown as one value and counted as one: a mean ± 0 over copies would read as zero
    spread between seeds."""
    head = ["precision", "runs", "measurements"] + [f"step-0 {lab}"
                                                    for lab in MISMATCH_PLOT.values()]
    rows = []
    for flow in flow_order(flow_label(r) for r in runs):
        mine = [r for r in runs if flow_label(r) == flow]
        vals = [stats.finite(r.summary.get("mismatch/step0/" + k[len("mismatch/"):]) for r in mine)
                for k in MISMATCH_PLOT]
        distinct = [sorted(set(v)) for v in vals]
        cells = []
        for d in distinct:
            mean, std = stats.mean_std(d)
            cells.append("-" if mean is None else f"{mean:.2e}"
                         + (f" ± {std:.1e} (n={len(d)})" if std is not None else ""))
        rows.append([flow, str(len(mine)), str(max((len(d) for d in distinct), default=0))] + cells)
    return head, rows


def transfer_tables(runs: list[Run]) -> list[tuple[list[str], list[list[str]]]]:
    """Runs with a transfer.json (suite transfer; docs/transfer.md): the TI variants per run, then
    the per-benchmark scores base -> final. A TI that is not a meaningful number shows "flag". []
    when none."""
    from suite.rl import transfer

    docs = [(r, d) for r in runs if (d := transfer.load(r.dir)) is not None]
    if not docs:
        return []

    def ti(doc, variant):
        t = doc["ti"].get(variant)
        return "-" if t is None else " / ".join("flag" if t.get(g) is None else f"{t[g]:+.1f}"
                                                for g in transfer.TARGETS)

    labels = {"v1": "TI v1 (other / non)", "v2_per_model": "TI v2 per-model",
              "v2_pooled": "TI v2 pooled", "v2_fixed": "TI v2 fixed",
              "v2_no_sigma": "TI v2 no sigma"}
    variants = [v for v in labels if any(v in d["ti"] for _, d in docs)]
    head = (["run", "final step", "Δ math", "Δ other", "Δ non"] + [labels[v] for v in variants]
            + ["flags"])
    rows = [[r.label, str(d["final"].get("step")),
             *(fmt(d["delta"].get(g), "+.1f") for g in transfer.GROUPS),
             *(ti(d, v) for v in variants), ", ".join(transfer.flags_of(d)) or "-"]
            for r, d in docs]
    names = list(dict.fromkeys(n for _, d in docs for g in transfer.GROUPS
                               for n in d["groups"].get(g, [])))
    bench = [[r.label]
             + [f"{fmt(d['base']['scores'][n]['score'], '.1f')} → "
                f"{fmt(d['final']['scores'][n]['score'], '.1f')}"
                if n in d["final"]["scores"] else "-" for n in names]
             for r, d in docs]
    return [(head, rows), (["run"] + names, bench)]


def sanity_table(runs: list[Run]) -> tuple[list[str], list[list[str]]]:
    """Our sanity_r1d cells next to the published outcome of the same setting; [] rows without such
    runs."""
    ours = {k: v for k, v in group_cells([r for r in runs if r.task == SANITY_TASK]).items()}
    if not ours:
        return [], []
    claimed: set = set()
    head = ["published setting", "published outcome", "our cells", "our verdicts", "our peak acc",
            "consistent"]
    rows = []
    for pub in PUBLISHED_SANITY:
        keys = [k for k in ours if k[2] == pub["precision"] and k not in claimed
                and (pub["algorithm"] is None or k[1] == pub["algorithm"])]
        claimed.update(keys)
        cell = [r for k in keys for r in ours[k]]
        done = [r for r in cell if r.verdict != "incomplete"]
        verdicts = ", ".join(f"{sum(r.verdict == v for r in cell)} {v}" for v in VERDICTS
                             if any(r.verdict == v for r in cell))
        ok = [r.verdict in pub["expect"] for r in done]
        consistent = ("-" if not ok else "yes" if all(ok) else "no" if not any(ok)
                      else f"{sum(ok)}/{len(ok)} runs")
        rows.append([pub["setting"], pub["outcome"],
                     ", ".join(f"{k[1]}/{k[2]}" for k in keys) or "not run",
                     verdicts or "-",
                     _pm(*stats.mean_std(r.summary.get("accuracy/peak") for r in done)),
                     consistent])
    return head, rows


# --------------------------------------------------------------------- consistency and provenance
def _values(flats: dict[str, dict], key: str) -> dict[str, list[str]]:
    """json(value of `key`) -> labels of the runs having it; `flats` maps run label -> flattened
    dict."""
    out: dict[str, list[str]] = {}
    for label, flat in flats.items():
        v = flat.get(key, "(absent)")
        text = v if isinstance(v, str) else json.dumps(v, sort_keys=True, default=str)
        out.setdefault(text, []).append(label)
    return out


def _describe(values: dict[str, list[str]]) -> str:
    parts = []
    for v, labels in sorted(values.items(), key=lambda kv: -len(kv[1])):
        who = ", ".join(labels) if len(labels) <= 3 else f"{len(labels)} runs"
        parts.append(f"{v} ({who})")
    return "; ".join(parts)


def consistency_warnings(runs: list[Run]) -> list[str]:
    """Differences between runs beyond the grid axes (precision, algorithm, seed): config fields
    and the env.json fields that decide whether numbers are comparable; plus dirty checkouts."""
    warnings = []
    frameworks = sorted({r.framework for r in runs})
    # configs of different loops share no schema: compared within each loop only
    if len(frameworks) > 1:
        warnings.append("runs come from several training loops (" + ", ".join(
            f"{f}: {sum(r.framework == f for r in runs)}" for f in frameworks) + "); configs are "
            "compared within each loop only. Compare their step-0 mismatch (same policy, before "
            "any update) before their training curves.")
    for fw in frameworks:
        cfgs = {r.label: flatten(r.config) for r in runs if r.config and r.framework == fw}
        for k in sorted({k for f in cfgs.values() for k in f
                         if k.split(".")[0] not in (*GRID_AXES, *LOCATION_KEYS)}):
            vals = _values(cfgs, k)
            if len(vals) > 1:
                warnings.append(f"config {k} differs between "
                                f"{'' if fw == 'suite' else fw + ' '}runs: {_describe(vals)}")
    envs = {r.label: flatten(r.env) for r in runs if r.env}
    for k in sorted({k for f in envs.values() for k in f if k in ENV_CHECKED
                     or k.startswith("packages.")}):
        vals = _values(envs, k)
        if len(vals) > 1:
            warnings.append(f"environment {k} differs between runs: {_describe(vals)}")
    dirty = [r.label for r in runs if r.env and r.env.get("git_dirty")]
    if dirty:
        warnings.append(f"{len(dirty)} run(s) ran from a checkout with uncommitted changes "
                        "(git_dirty), so the git sha alone does not pin their code: "
                        f"{', '.join(dirty)}")
    return warnings


def env_table(runs: list[Run]) -> tuple[list[str], list[list[str]]]:
    envs = {r.label: flatten(r.env) for r in runs if r.env}
    # the dataset's folder name carries its version and hash; the folder above is the machine's
    for f in envs.values():
        if "dataset.path" in f:
            f["dataset.path"] = "(cache)/datasets/" + Path(str(f["dataset.path"])).name
    keys = sorted({k for f in envs.values() for k in f
                   if k in (*ENV_CHECKED, "git_dirty", "platform", "hostname", "dataset.path")
                   or k.startswith("packages.")})
    rows = []
    for k in keys:
        vals = _values(envs, k)
        rows.append([k, next(iter(vals)) if len(vals) == 1 else "differs: " + _describe(vals)])
    return ["field", "value (all runs unless noted)"], rows


def provenance_table(runs: list[Run], answers: dict[str, str]) -> tuple[list[str], list[list[str]]]:
    """Per run: config hash, whether its rerun command reproduces it (`answers`,
    suite/rl/provenance.py), code and data."""
    head = ["run", "config hash", "rerun command reproduces the hash", "git sha", "dirty",
            "task (version)", "dataset sha256"]
    rows = []
    for r in runs:
        e = r.env or {}
        task = e.get("task") if isinstance(e.get("task"), dict) else {}
        ds = e.get("dataset") if isinstance(e.get("dataset"), dict) else {}
        rows.append([r.label, r.config_hash or "-", answers.get(r.label, "no config.json"),
                     (e.get("git_sha") or "-")[:12], fmt(e.get("git_dirty")),
                     f"{task.get('name', r.task)} (v{task.get('version', '?')})",
                     fmt(ds.get("sha256"))])
    return head, rows
