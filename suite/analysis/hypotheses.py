"""The science report: which mechanism could make BF16 fail the sanity test at small scale, one
section per hypothesis, generated from the grids' run directories (``suite hypotheses``).

The collapse search (suite/analysis/collapse.py) found no regime where BF16 fails while FP16 and
FP32 pass. Each hypothesis here is a grid (suite/experiments/grids.py) whose runs differ along one
*arm* (the PPO reference, the response length, ...) and the precision flow. Its section is computed
from the runs alone, with the collapse search's rules (an arm plays the part of a regime): the
separation table, the outcomes with 95% bootstrap CIs over seeds, step-0 and final mismatch and wall
time, the mechanism measured per step (``mechanism.jsonl``), the curves, and one sentence stating
the outcome, either way. Two more sections use the same runs' numbers: the trainer-numerics controls
(is a gap the mismatch, or the trainer's own rounding?) and the dose-response curve (an fp32 run
with a calibrated synthetic mismatch, the real flows placed on it by their measured mismatch). A
hypothesis without results on this machine class says so.
"""

from __future__ import annotations

import argparse
import dataclasses
from pathlib import Path

import numpy as np

from suite.analysis import collapse, pages, render
from suite.analysis.hypothesis_tables import (
    _fmt_ms,
    length_table,
    mechanism_table,
    mismatch_table,
    routing_table,
    step1,
)
from suite.analysis.runs import load_runs
from suite.analysis.stats import bootstrap_ci, finite, mean_std
from suite.results import (
    PEAK_WINDOW,
    REFERENCE_ROOT,
    VERDICT_RULE,
    display_path,
)


@dataclasses.dataclass(frozen=True)
class Study:
    id: str
    title: str
    grid: str
    arm: str | None  # the config field that tells the grid's arms apart (None: one arm)
    claim: str


STUDIES = [
    Study("H1", "phantom clipping", "h1-phantom-clip", "algo.ppo_ref",
          "With the sampler's log-probs as the PPO ratio's denominator (verl's bypass mode), the "
          "clip reads the precision gap as policy change and zeroes those tokens' gradients from "
          "the first update on (published: ~18% of tokens at step 0 on a 0.6B model, fp32 trainer, "
          "bf16 sampler)."),
    Study("H2", "length", "h2-length", "task",
          "Sequence-level importance weights have variance growing like (1 + chi2)^T: with long "
          "responses BF16's per-token mismatch should collapse the effective sample size while "
          "FP16's stays near 1."),
    Study("H3", "a fat low-probability tail", "h3-tail", "task",
          "The per-token mismatch grows with 1 - p; a task with many valid answers and a larger "
          "vocabulary keeps entropy high at forking tokens and makes low-probability tokens "
          "common."),
    Study("H4", "a tiny mixture of experts", "h4-moe", "routing_replay",
          "BF16 rounding flips top-k routing decisions, turning a small numeric gap into a "
          "discrete one; replaying the sampler's routing in the trainer should remove it."),
]
EMULATED = Study("H2e", "length, emulated with logit noise", "h2-emulated-length", "inject.scale",
                 "The lengths a CPU can train stop at 163 tokens. Noise on the sampler's logits "
                 "raises the per-token chi2 so that 163 tokens carry the sequence-weight variance "
                 "of a bf16 trace thousands of tokens long: does untruncated sequence IS then fail "
                 "where token-level GRPO and the masked correction do not?")
CONTROLS = Study("C", "trainer-numerics controls", "trainer-controls", None,
                 "bf16, fp16 and bf16_fp8rollout train the HF module under autocast (fp32 residual "
                 "stream and norms), exact and unified FP8 train with the sampler's pure "
                 "low-precision code; bf16_unified and fp16_unified train with that code too, so a "
                 "gap between bf16 and bf16_unified is the trainer's numerics and the mismatch "
                 "together, and one between bf16_unified and exact is the mismatch alone.")
DOSE = Study("D", "dose-response", "dose-response", "inject.kind",
             "An fp32 run whose sampler draws from a perturbed distribution (Gaussian logit noise, "
             "or a bias on low-probability tokens) at several magnitudes: where on the measured "
             "mismatch axis does the sanity test start to fail, and where do the real flows sit?")
CONTROL_PAIRS = (("bf16", "bf16_unified"), ("fp16", "fp16_unified"), ("bf16_unified", "exact"),
                 ("fp16", "bf16"))


def _get(cfg: dict | None, dotted: str):
    node = cfg or {}
    for part in dotted.split("."):
        node = node.get(part) if isinstance(node, dict) else None
    return node


def with_arms(runs, field: str | None) -> list:
    """The runs with their arm (``field=value``) in the place of the collapse search's regime."""
    return [dataclasses.replace(r,
                                config={**(r.config or {}),
                                        "regime": f"{field}={_get(r.config, field)}"
                                           if field else "base"}) for r in runs]


# ---- one hypothesis ------------------------------------------------------------------------------
def pass_counts(runs) -> dict[str, str]:
    """arm -> "fp32 2/3, fp16 2/3, ..." (passing seeds / complete seeds, flows in table order)."""
    out = {}
    for (arm, _, prec), cell in collapse.cells(runs).items():
        done = [r for r in cell if r.verdict != "incomplete"]
        out.setdefault(arm, []).append(f"{prec} "
                                       f"{sum(r.verdict == 'pass' for r in done)}/{len(done)}")
    return {arm: ", ".join(v) for arm, v in out.items()}


def outcome(study: Study, runs, found: list[dict]) -> str:
    """The one sentence of a hypothesis, computed from the findings (never written by hand)."""
    counts = "; ".join(f"{arm}: {c}" for arm, c in pass_counts(runs).items())
    sep = [f for f in found if f["separated"]]
    if sep:
        where = "; ".join(f"{f['flow']} in {f['regime']}" for f in sep)
        text = (f"{study.id} separates: {where} fails the sanity test in every seed while every "
                f"seed of fp16 and fp32 passes (passing seeds per arm: {counts}).")
    else:
        text = (f"{study.id} does not separate BF16 from FP16 and FP32 here: in no arm does every "
                "seed of a low-precision flow fail while every seed of fp16 and fp32 passes "
                f"(passing seeds per arm: {counts}).")
    gaps = [f for f in found if f["gap_significant"]]
    if gaps:
        text += " Final-accuracy gaps to fp16 whose 95% CI excludes 0: " + "; ".join(
            f"{f['flow']} in {f['regime']} {f['gap'][0]:+.3f} [{f['gap'][1]:+.3f}, "
            f"{f['gap'][2]:+.3f}]" for f in gaps) + "."
    return text


def study_section(study: Study, runs, fig_dir: Path) -> list[tuple]:
    from suite.analysis import figures

    runs = with_arms(runs, study.arm)
    found = collapse.findings(runs)
    arms = collapse.regimes_of(runs)
    flows = render.flow_order(r.precision for r in runs)
    doc = [("p", "Outcome: " + outcome(study, runs, found)),
           ("table", ["arm", *collapse.findings_table(found)[0][1:]],
            collapse.findings_table(found)[1],
            "Separated: every complete seed of the low-precision flow fails while every complete "
            "seed of fp16 and fp32 passes (>= 3 seeds each). Gap: final accuracy minus fp16's, "
            "95% percentile-bootstrap CI resampling seeds."),
           ("table", *mismatch_table(runs),
            "Every arm tried, including those where nothing separated. Final accuracy: the "
            "verdict rule's final window; wall time: run time summed over the arm's seeds (two "
            "ran at a time on 2 cores)."),
           ("table", *mechanism_table(runs),
            "Gap-clipped: share of response tokens PPO's clip would zero at the first update if "
            "the ratio's denominator were the sampler's log-prob (the precision gap alone). ESS: "
            "(sum w)^2 / (n sum w^2) of the raw weights pi/mu, tokens pooled, resp. one product "
            "per sequence.")]
    if study.id == "H2":  # the length axis
        doc.append(("table", *length_table(runs),
                    "Step 1, mean ± std over seeds. chi2 = 1 / ESS - 1 of the weights w = pi/mu, "
                    "the self-normalised E[w^2] / E[w]^2 - 1 (token: pooled; sequence: w = "
                    "prod_t w_t). With independent tokens the sequence chi2 is (1 + token chi2)^T "
                    "- 1; the last column extrapolates the length at which the sequence weights' "
                    "ESS would halve, ln 2 / ln(1 + token chi2)."))
    if study.arm == "routing_replay":
        doc.append(("table", *routing_table(runs),
                    "mech/moe/route_flip_frac of mechanism.jsonl, mean ± std over seeds: how often "
                    "bf16 or fp16 rounding changes a routing decision."))
    stem = f"{study.grid}_reward"
    figures.panels({a: [collapse._curve(r, "reward/mean") for r in runs if collapse.regime(r) == a]
                    for a in arms},
                   flows, fig_dir / stem, PEAK_WINDOW, ylabel="training accuracy", hline=0.95)
    doc.append(("fig", stem, f"{study.id}: training accuracy per arm (trailing mean over "
                f"{PEAK_WINDOW} steps), band = 95% bootstrap CI over seeds; dashed: the pass "
                "threshold."))
    head, rows = collapse.lead_table(runs)
    doc.append(("table", head, rows, f"Runs whose smoothed accuracy fell by >= {collapse.DROP}: "
                f"the k3 KL of the {collapse.LEAD} steps before the fall against the first "
                f"{collapse.LEAD} steps (does the mismatch grow before the drop?).") if rows else
               ("p", f"No run fell by {collapse.DROP} or more below its running best: no drop for "
                     "the mismatch to precede."))
    return doc


def emulated_section(runs, length_runs) -> list[tuple]:
    """H2 at an emulated length: per algorithm on the same noisy fp32 sampler, the verdicts, the
    step-1 chi2 and ESS, the final accuracy and its gap to GRPO's, and the bf16 length with the same
    (1 + chi2_tok)^T."""
    task = _get(runs[0].config, "task") if runs else None
    bf16 = finite(step1(r)["tok"] for r in length_runs if r.precision == "bf16"
                  and _get(r.config, "task") == task)
    groups = [(arm, algo, cell)
              for (arm, algo, _), cell in collapse.cells(with_arms(runs, EMULATED.arm)).items()]
    # the same estimator on the clean fp32 sampler (h2-length), for scale: what the noise costs
    # by itself
    groups += [("no noise (h2-length)", algo, cell) for (_, algo, prec), cell in collapse.cells(
        [r for r in length_runs if _get(r.config, "task") == task]).items() if prec == "fp32"]
    final = {(arm, algo): finite(r.summary.get("accuracy/final") for r in c
                                 if r.verdict != "incomplete")
             for arm, algo, c in groups}
    head = ["arm", "algorithm", "seeds", "passing seeds", "response tokens", "token chi2",
            "sequence chi2", "sequence chi2, max over steps",
            "bf16 tokens with the same sequence chi2", "final acc [95% CI]",
            "final acc - grpo's [95% CI]"]
    rows, said, equivalent = [], [], []
    for arm, algo, cell in groups:
        noisy = not arm.startswith("no noise")
        one = [step1(r) for r in cell]
        same = [x["T"] * np.log1p(x["tok"]) / np.log1p(float(np.mean(bf16))) for x in one
                if bf16 and x["T"] and x["tok"] is not None]
        equivalent += same if noisy else []
        ci = bootstrap_ci(final[(arm, algo)])
        grpo = final.get((arm, "grpo"))
        gap = collapse.gap_ci(final[(arm, algo)], grpo) if grpo and algo != "grpo" else None
        passing = f"{sum(r.verdict == 'pass' for r in cell)}/{len(final[(arm, algo)])}"
        rows.append([arm, algo, f"{len(final[(arm, algo)])}/{len(cell)}", passing,
                     _fmt_ms([x["T"] for x in one], ".1f"), _fmt_ms([x["tok"] for x in one], ".2e"),
                     _fmt_ms([x["seq"] for x in one], ".2e"),
                     _fmt_ms([x["seq_max"] for x in one], ".2e"), _fmt_ms(same, ".3g"),
                     _fmt_ms(final[(arm, algo)], ".3f")
                     + (f" [{ci[0]:.3f}, {ci[1]:.3f}]" if ci else ""),
                     "-" if not gap else f"{gap[0]:+.3f} [{gap[1]:+.3f}, {gap[2]:+.3f}]"])
        if noisy:
            said.append(f"{algo} passes {passing}, final accuracy "
                        f"{_fmt_ms(final[(arm, algo)], '.3f')}"
                        + (f" ({gap[0]:+.3f} [{gap[1]:+.3f}, {gap[2]:+.3f}] against grpo)" if gap
                           else ""))
        else:
            said.append(f"without the noise {algo} passes {passing}, final accuracy "
                        f"{_fmt_ms(final[(arm, algo)], '.3f')}")
    sentence = "Outcome: no run." if not said else (
        "Outcome: on the same noisy fp32 sampler, " + "; ".join(said) + "."
        + (" At step 1 the noise gives the responses the sequence chi2 that bf16's per-token chi2 "
           f"on {task} reaches over ~{np.mean(equivalent):.3g} tokens." if equivalent else ""))
    return [("p", sentence),
            ("table", head, rows, "Step 1, mean ± std over seeds; chi2 = 1 / ESS - 1 of the "
             "weights w = pi/mu. bf16 tokens with the same sequence chi2: T ln(1 + chi2_tok) / "
             "ln(1 + chi2_tok of bf16), bf16's from the h2-length grid on the same task. Gap: 95% "
             "percentile-bootstrap CI resampling seeds.")]


# ---- the controls --------------------------------------------------------------------------------
def controls_section(runs) -> list[tuple]:
    runs = with_arms(runs, None)
    done = {}
    for r in runs:
        if r.verdict != "incomplete":
            done.setdefault(r.precision, []).append(r)
    head = ["pair (a vs b)", "passing seeds a / b", "step-0 k3 a / b", "final acc a - b [95% CI]"]
    rows, said = [], []
    for a, b in CONTROL_PAIRS:
        if a not in done or b not in done:
            continue
        fa, fb = (finite(r.summary.get("accuracy/final") for r in done[f]) for f in (a, b))
        gap = collapse.gap_ci(fa, fb)
        k3 = [mean_std([r.summary.get("mismatch/step0/kl_k3") for r in done[f]])[0] for f in (a, b)]
        rows.append([f"{a} vs {b}", f"{sum(r.verdict == 'pass' for r in done[a])}/{len(done[a])} / "
                     f"{sum(r.verdict == 'pass' for r in done[b])}/{len(done[b])}",
                     f"{render.fmt(k3[0], '.2e')} / {render.fmt(k3[1], '.2e')}",
                     "-" if not gap else f"{gap[0]:+.3f} [{gap[1]:+.3f}, {gap[2]:+.3f}]"])
        if gap:
            said.append(f"{a} vs {b} {gap[0]:+.3f} [{gap[1]:+.3f}, {gap[2]:+.3f}] "
                        + ("(CI excludes 0)" if gap[1] > 0 or gap[2] < 0 else "(CI includes 0)"))
    sentence = ("Outcome: final-accuracy differences, 95% CI over seeds: " + "; ".join(said) + ". "
                "A CI that includes 0 means this grid cannot tell the two apart."
                if said else "Outcome: no pair of the controls ran.")
    return [("p", sentence),
            ("table", head, rows, "a vs b: bf16 vs bf16_unified differ in the trainer's numerics "
             "(and the mismatch that comes with them); bf16_unified vs exact differ only in the "
             "remaining mismatch (GEMM shapes); fp16 vs bf16 is the headline comparison."),
            ("table", *mismatch_table(runs), "Every flow of the controls grid.")]


# ---- the dose-response curve ---------------------------------------------------------------------
def _dose_groups(runs) -> dict[tuple[str, float], list]:
    out: dict[tuple[str, float], list] = {}
    for r in sorted(runs,
                    key=lambda r: (_get(r.config, "inject.kind") or "",
                                   _get(r.config, "inject.scale") or 0.0)):
        out.setdefault((_get(r.config, "inject.kind"),
                        float(_get(r.config, "inject.scale") or 0.0)), []).append(r)
    return out


def _xy(cell) -> tuple[list[float], list[float]]:
    done = [r for r in cell if r.verdict != "incomplete"
            and r.summary.get("accuracy/final") is not None]
    return ([float(r.summary.get("mismatch/step0/kl_k3") or 0.0) for r in done],
            [float(r.summary["accuracy/final"]) for r in done])


def dose_sentence(groups: dict, real: dict[str, list]) -> str:
    parts = []
    for kind in dict.fromkeys(k for k, _ in groups):
        cells = [(s, [r for r in c if r.verdict != "incomplete"]) for (k, s), c in groups.items()
                 if k == kind]
        cells = [(s, c) for s, c in cells if c]  # magnitudes with at least one complete seed
        if not cells:
            continue
        failing = [(s, c) for s, c in cells if any(r.verdict != "pass" for r in c)]
        worst = [(s, c) for s, c in cells if all(r.verdict != "pass" for r in c)]
        k3 = {s: float(np.mean(_xy(c)[0])) if _xy(c)[0] else float("nan") for s, c in cells}
        if not failing:
            parts.append(f"with {kind}, fp32 passes in every seed at every magnitude, up to a "
                         f"step-0 k3 of {max(k3.values()):.2e} (scale {max(k3, key=k3.get)})")
            continue
        s0 = failing[0][0]
        text = (f"with {kind}, the smallest magnitude where a seed does not pass is scale {s0} "
                f"(step-0 k3 {k3[s0]:.2e})")
        if worst:
            text += f", and no seed passes from scale {worst[0][0]} (k3 {k3[worst[0][0]]:.2e})"
        parts.append(text)
    flows = "; ".join(f"{f} k3 {np.mean(_xy(c)[0]):.2e} "
                      f"({sum(r.verdict == 'pass' for r in c)}/{len(c)} pass)"
                      for f, c in real.items() if _xy(c)[0])
    return "Outcome: " + "; ".join(parts) + "." + (" The real flows measured in the controls grid: "
                                                   f"{flows}." if flows else "")


def dose_section(runs, real_runs, fig_dir: Path) -> list[tuple]:
    from suite.analysis import figures

    groups = _dose_groups(runs)
    real = {}
    for r in real_runs:
        if r.verdict != "incomplete":
            real.setdefault(r.precision, []).append(r)
    real = {f: real[f] for f in render.flow_order(real)}
    head = ["sampler", "scale", "seeds", "passing seeds", "step-0 k3 KL", "final acc [95% CI]"]
    rows = []
    for (kind, scale), cell in groups.items():
        x, y = _xy(cell)
        ci = bootstrap_ci(y)
        rows.append([f"fp32 + {kind}", f"{scale:g}", f"{len(y)}/{len(cell)}",
                     str(sum(r.verdict == "pass" for r in cell)), _fmt_ms(x, ".2e"),
                     _fmt_ms(y, ".3f") + (f" [{ci[0]:.3f}, {ci[1]:.3f}]" if ci else "")])
    for f, cell in real.items():
        x, y = _xy(cell)
        ci = bootstrap_ci(y)
        rows.append([f"{f} (real)", "-", f"{len(y)}/{len(cell)}",
                     str(sum(r.verdict == "pass" for r in cell)), _fmt_ms(x, ".2e"),
                     _fmt_ms(y, ".3f") + (f" [{ci[0]:.3f}, {ci[1]:.3f}]" if ci else "")])
    curves = {}
    for (kind, scale), cell in groups.items():
        x, y = _xy(cell)
        if y:
            curves.setdefault(kind, []).append({"x": x, "y": y, "label": f"{scale:g}"})
    figures.dose_response(curves,
                          [{"label": f, "x": _xy(c)[0], "y": _xy(c)[1]} for f, c in real.items()
                           if _xy(c)[1]], fig_dir / "dose_response")
    return [("p", dose_sentence(groups, real)),
            ("fig", "dose_response", "Final training accuracy against each run's measured step-0 "
             "mismatch (log axis): lines = fp32 with an injected perturbation at increasing "
             "magnitude (labels: inject.scale), small dots = seeds; diamonds = the real flows of "
             "the controls grid (same settings), placed by their own measured mismatch; dashed = "
             "the pass threshold. A k3 of exactly 0 (exact) is drawn at the left edge."),
            ("table", head, rows, "noise: Gaussian noise of std `scale` on every processed logit "
             "of the sampler; lowp_bias: `scale` added to the logits of tokens below p = 0.1 "
             "(suite/numerics/perturbation.py). Passing seeds: verdict pass (" + VERDICT_RULE
             + ").")]


# ---- the document -------------------------------------------------------------------------------
def _reproduce(study: Study, class_dir: Path) -> str:
    import json

    ref = class_dir / "reference.json"
    sha = ((json.loads(ref.read_text()).get("jobs") or {}).get(study.grid)
           or {}).get("git_sha") if ref.is_file() else None
    return (f"Produced by: suite sweep grid={study.grid} launcher=local jobs=2 (from a clean clone"
            + (f" of {sha[:7]}" if sha else "") + "), promoted with suite reference "
            f"runs/{study.grid} --grid {study.grid}; the standard report of the grid (or of one "
            f"arm): suite report {display_path(class_dir / study.grid)}[/<arm>].")


def build_document(class_dir: Path, fig_dir: Path) -> list[tuple]:
    """One section per study whose grid has runs under ``class_dir`` (results/reference/<class>/), a
    line for those without, and the summary table first."""
    class_dir = Path(class_dir)
    loaded = {s.grid: load_runs(class_dir / s.grid) if (class_dir / s.grid).is_dir() else []
              for s in [*STUDIES, EMULATED, CONTROLS, DOSE]}
    summary, body = [], []
    for study in [*STUDIES[:2], EMULATED, *STUDIES[2:], CONTROLS, DOSE]:
        runs = loaded[study.grid]
        body += [("h", f"{study.id}: {study.title}", study.id.lower()),
                 ("p", "Question: " + study.claim)]
        if not runs:
            line = (f"Not run on this machine class: no runs under {class_dir.name}/{study.grid}/ "
                    f"(run suite sweep grid={study.grid} launcher=local jobs=2, then suite "
                    f"reference runs/{study.grid} --grid {study.grid}).")
            body.append(("p", line))
            summary.append([study.id, study.title, study.grid, "0", "not run on this class"])
            continue
        body.append(("p", _reproduce(study, class_dir)))
        if study is CONTROLS:
            section = controls_section(runs)
        elif study is EMULATED:
            section = emulated_section(runs, loaded[STUDIES[1].grid])
        elif study is DOSE:
            section = dose_section(runs, loaded[CONTROLS.grid], fig_dir)
        else:
            section = study_section(study, runs, fig_dir)
        body += section
        summary.append([study.id, study.title, study.grid, str(len(runs)),
                        section[0][1].removeprefix("Outcome: ")])
    return [("h", "Summary", "summary"),
            ("p", f"Machine class {class_dir.name}; every number is computed from the run "
                  f"directories under {display_path(class_dir)} (suite hypotheses). Verdict rule: "
                  f"{VERDICT_RULE}"),
            ("table", ["study", "hypothesis", "grid", "runs", "outcome"], summary, "")] + body


def write(class_dir: Path, out: Path, svg: bool = False) -> Path:
    """Write the report folder ``out`` (replaced atomically; a folder that is not a report is
    refused); `svg`: every figure also as SVG."""
    from suite.analysis import figures

    title = f"Why does BF16 not fail at small scale? Hypotheses, {Path(class_dir).name}"
    with figures.vectors(svg):
        return pages.write_folder(out, lambda fig_dir: (build_document(class_dir, fig_dir), title))


def cli(args: list[str]) -> int:
    from suite.numerics import machine

    p = argparse.ArgumentParser(prog="suite hypotheses",
                                description="The per-hypothesis science report of one machine "
                                "class's committed grids, computed from the run files alone.")
    p.add_argument("--class", dest="cls", help="machine class (default: this machine's)")
    p.add_argument("--root", type=Path, default=REFERENCE_ROOT,
                   help="reference root (default: results/reference)")
    p.add_argument("--out", type=Path, help="output folder (default: results/hypotheses/<class>)")
    p.add_argument("--svg", action="store_true",
                   help="also write every figure as SVG (vector; larger files)")
    ns = p.parse_args(args)
    cls = ns.cls or machine.describe("auto", 1)["id"]
    class_dir = ns.root / cls
    if not class_dir.is_dir():
        raise ValueError(f"no reference results for machine class {cls} under {ns.root}")
    out = write(class_dir, ns.out or ns.root.parent / "hypotheses" / cls, svg=ns.svg)
    print(f"hypotheses report written to {out / 'index.html'} (also report.md and figures/)")
    return 0
