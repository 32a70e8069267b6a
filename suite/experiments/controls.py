"""The sanity test's controls: recipes known to fail at the embedded scale, each beside its
corrections.

A test that cannot fail a known-bad recipe is not a test. Each control is rows of the ``controls``
grid (``suite/experiments/grids.py``), the known-bad recipe and its corrections, run over the same
seeds as the main flows; ``judge`` says whether they behaved as the committed evidence says they do,
and ``suite main`` exits non-zero, naming the control, when one did not.

Expected behaviour (each ``Row``'s ``expect``): the known-bad recipe fails (unstable or collapse) in
a majority of its seeds and each judged fix passes in a majority of them; a correction whose
committed seeds split is run and shown beside them but not judged. A majority, not every seed: the
evidence is three seeds on one machine class, and one seed of another class landing a few samples on
the other side of the line is what three runs cannot rule out; the pass counts and the one-sided
Fisher exact test of fix against known-bad are printed beside the judgement, so the strength of the
separation is never hidden behind it.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from suite.analysis.stats import fisher_exact
from suite.results import atomic_write_json, display_path, find_run_dirs


@dataclass(frozen=True)
class Row:
    """One row of a control: a recipe, the committed runs that say how it behaves, and what is
    expected of it."""

    # its folder under the control's (controls/<control>/<role>/): bad, fix, mis, centering, qat
    role: str
    label: str  # the recipe in words: "plain GRPO", "token TIS", ...
    overrides: tuple[str, ...]
    # Where the committed grids hold its runs (relative to results/reference/<class>/, with the
    # runs' algorithm): the evidence ``evidence`` re-judges at the main job's line.
    evidence: tuple[str, str]
    # "fail" (the known-bad recipe), "pass" (a fix), or None: a correction shown beside them but not
    # judged, because its committed runs split between pass and fail (a majority of 2 of 3 is what
    # one seed can flip).
    expect: str | None


@dataclass(frozen=True)
class Control:
    name: str
    what: str  # the setting, in words
    rows: tuple[Row, ...]  # the known-bad recipe first, then its corrections
    evidence_class: str = "cpu-avx512bf16-mixed"
    grid: str = "controls"  # the grid that runs it; its runs lie in <grid>/<name>/<role>


_STALE = ("precision=fp32", "staleness=4")
_FP4 = ("precision=bf16_nvfp4a4rollout",)
# The main job's controls. Each known-bad recipe fails, and each judged fix passes, in 3 of 3
# committed seeds on cpu-avx512bf16-mixed at the calibrated line (docs/calibration.md), and the
# known-bad recipe fails in every committed seed of every class that ran the main job (a control
# must bite on the user's machine, whatever its class); the corrections whose seeds split are shown
# beside them, unjudged.
CONTROLS = (
    # Asynchronous RL samples with old weights; plain GRPO's ratio is taken against the trainer's
    # current policy, so the rollouts are silently off-policy (the staleness source,
    # docs/attribution.md).
    Control("stale-k4", "fp32, rollouts sampled with weights 4 RL steps old", rows=(
        Row("bad", "plain GRPO", (*_STALE, "algorithm=grpo"), ("src-staleness/base/k4", "grpo"),
            "fail"),
        Row("fix", "token TIS", (*_STALE, "algorithm=grpo_token_tis"),
            ("src-staleness/base/k4", "grpo_token_tis"), "pass"),
        Row("mis", "sequence MIS", (*_STALE, "algorithm=grpo_seq_mis"),
            ("src-staleness/base/k4", "grpo_seq_mis"), None),
        # Score centering (arXiv 2609.20807) removes the drift a sampler-trainer mismatch adds at
        # every prefix; its committed runs are the controls grid's own (no other grid ran it with
        # stale rollouts).
        Row("centering", "score centering",
            (*_STALE, "algorithm=grpo", "algo.score_centering=true"),
            ("controls/stale-k4/centering", "grpo"), None),
    )),
)
# Controls whose known-bad recipe fails on one class and passes on another: not the main job's
# (its exit code would depend on the machine, not on the recipe); their own grid (``controls-4bit``)
# runs them, and ``by_class`` sets each class's committed runs side by side.
CLASS_DEPENDENT = (
    # SkyRL v0.5.0's headline run: NVFP4 W4A4 rollouts with a BF16 trainer collapsed without a
    # correction. At the embedded scale it fails in 3 of 3 seeds on cpu-avx512bf16-mixed (step-0
    # k3 0.03-0.06) and passes in 3 of 3 on cpu-avx2-emulated, whose policy the same quantiser moves
    # less (k3 0.02-0.03): how far 4-bit rollouts carry a run off-policy depends on the policy.
    Control("nvfp4a4-rollout", "bf16 trainer, NVFP4 W4A4 rollouts (4-bit weights and activations)",
            grid="controls-4bit", rows=(
        Row("bad", "plain GRPO", (*_FP4, "algorithm=grpo"), ("fp4", "grpo"), "fail"),
        Row("fix", "score centering", (*_FP4, "algorithm=grpo", "algo.score_centering=true"),
            ("fp4-centering", "grpo"), "pass"),
        # Jet-RL (arXiv 2601.14243) and NeMo-RL's QARL: the trainer's forward quantised as the
        # sampler's is, so both compute the same log-probs and nothing is off-policy to correct.
        Row("qat", "quantisation-aware flow (nvfp4a4)", ("precision=nvfp4a4", "algorithm=grpo"),
            ("fp4", "grpo"), "pass"),
    )),
)
# Verdicts of a complete run long enough to judge (suite/results.py); at_line counts as neither a
# pass nor a fail.
JUDGED = ("pass", "at_line", "unstable", "collapse")


def rows(controls: tuple[Control, ...] = CONTROLS) -> list[list[str]]:
    """A controls grid's rows: each control's recipes, each under its own name."""
    return [[*r.overrides, f"name={c.grid}/{c.name}/{r.role}"] for c in controls for r in c.rows]


def _verdicts(root: Path, control: Control, row: Row) -> list[str]:
    """The verdicts of one row's runs, in seed order ("missing" for a run without a summary)."""
    out = []
    for d in find_run_dirs(Path(root) / control.name / row.role):
        path = d / "summary.json"
        out.append(json.loads(path.read_text()).get("verdict", "missing") if path.exists()
                   else "missing")
    return out


def _as_run(c: Control, overrides: tuple[str, ...]) -> str:
    """The setting of ``c`` in words, with the command-line values that replaced a value of one of
    its rows (the user's word is final: ``suite main staleness=0`` runs stale-k4 without staleness,
    and says so)."""
    mine = {o for r in c.rows for o in r.overrides}
    keys = {o.split("=", 1)[0] for o in mine}
    changed = [a for a in overrides if a.split("=", 1)[0] in keys and a not in mine]
    return c.what + (f" (as run: {', '.join(changed)} from the command line)" if changed else "")


def judge(root: Path, overrides: tuple[str, ...] = (),
          controls: tuple[Control, ...] = CONTROLS) -> list[dict]:
    """One record per control of ``controls`` (default the main job's) whose runs lie in ``root``
    (its grid's folder): per row its verdicts, whether it behaved as expected, and (for a
    correction) the one-sided Fisher exact p that it passes more often than the known-bad.
    ``overrides``: the main job's ``key=value`` arguments, named in the setting where they replaced
    a row's."""
    out = []
    for c in controls:
        found = []
        for r in c.rows:
            v = _verdicts(root, c, r)
            found.append({"role": r.role, "label": r.label, "expect": r.expect,
                          "kind": kind(r.expect), "verdicts": v, "runs": len(v),
                          "passes": sum(x == "pass" for x in v), "ok": _behaved(r.expect, v)})
        bad = found[0]
        for f in found[1:]:
            f["fisher_p"] = (fisher_exact(f["passes"], f["runs"], bad["passes"], bad["runs"])
                             if f["runs"] and bad["runs"] else None)
        judged = [f["ok"] for f in found if f["expect"]]
        out.append({"control": c.name, "what": _as_run(c, tuple(overrides)),
                    "evidence": evidence_text(c), "rows": found, "behaved": None if None in judged
                    else all(judged)})
    return out


def _behaved(expect: str | None, verdicts: list[str]) -> bool | None:
    """Whether a row's runs behaved as expected in a majority of its seeds; None when nothing is
    expected of it, or a run has no verdict to judge by (too short, incomplete, missing): a smoke
    run neither catches nor misses."""
    if expect is None or not verdicts or any(v not in JUDGED for v in verdicts):
        return None
    hits = sum(v == "pass" if expect == "pass" else v in ("unstable", "collapse") for v in verdicts)
    return 2 * hits > len(verdicts)


def evidence_text(c: Control) -> str:
    """Where the committed evidence of a control lies, in words."""
    return f"{c.evidence_class}: " + ", ".join(f"{r.role} {r.evidence[0]} ({r.evidence[1]})"
                                               for r in c.rows)


def _flow(row: Row) -> str:
    return next(o.split("=", 1)[1] for o in row.overrides if o.startswith("precision="))


def evidence(c: Control, row: Row, line: float, budget: int) -> list[dict]:
    """The committed runs of one row, re-judged at the main job's line and budget (their summaries
    hold the line they ran with): a summary per seed."""
    from suite.results import REFERENCE_ROOT, read_log, samples_per_step, summarize

    path, algo = row.evidence
    out = []
    for d in find_run_dirs(REFERENCE_ROOT / c.evidence_class / path):
        cfg = json.loads((d / "config.json").read_text())["config"]
        if cfg["precision"] == _flow(row) and cfg["algorithm"] == algo:
            rows = [r for r in read_log(d, "metrics.jsonl") if r["step"] <= budget]
            out.append(summarize(rows, total_steps=budget, threshold=line,
                                 samples_per_step=samples_per_step(cfg)))
    return out


def kind(expect: str | None) -> str:
    """What a row is, by what is expected of it: "known-bad" (fails), "fix" (passes) or "shown" (not
    judged); each record of ``judge`` carries it, so that the report and the figures name rows as
    the table does."""
    return {"fail": "known-bad", "pass": "fix"}.get(expect, "shown")


def f_evidence() -> str:
    """Markdown: each control's committed runs at the main job's line and budget, per row."""
    from suite.experiments.calibration import EMBEDDED_LINE
    from suite.rl.config import TIERS

    lines = ["| control | row | committed runs | pass | peak: min-max | final: min-max |",
             "|---|---|---|---|---|---|"]
    for c in (*CONTROLS, *CLASS_DEPENDENT):
        for row in c.rows:
            sums = evidence(c, row, EMBEDDED_LINE, TIERS["small"]["steps"])
            peaks, finals = [s["accuracy/peak"] for s in sums], [s["accuracy/final"] for s in sums]
            passes = sum(s["verdict"] == "pass" for s in sums)
            at = sum(s["verdict"] == "at_line" for s in sums)
            lines.append(f"| {c.name} | {kind(row.expect)}: {row.label} | "
                         f"{c.evidence_class}/{row.evidence[0]} | "
                         f"{passes}/{len(sums)}{f' ({at} at the line)' if at else ''} | "
                         f"{min(peaks):.3f}-{max(peaks):.3f} | {min(finals):.3f}-{max(finals):.3f} "
                         "|")
    return "\n".join(lines)


def by_class(c: Control) -> dict[str, list[dict]]:
    """Each class's committed runs of ``c`` (its grid's own, ``<class>/<grid>/<name>``), judged as
    they ran (at the main job's line and budget): per class one record per row, with the range of
    its runs' step-0 k3."""
    from suite.results import REFERENCE_ROOT

    out = {}
    for cls_dir in sorted(p for p in REFERENCE_ROOT.iterdir() if (p / c.grid / c.name).is_dir()):
        rec = judge(cls_dir / c.grid, controls=(c,))[0]
        for r in rec["rows"]:
            k3 = [json.loads((d / "summary.json").read_text()).get("mismatch/step0/kl_k3")
                  for d in find_run_dirs(cls_dir / c.grid / c.name / r["role"])]
            r["k3"] = [min(k3), max(k3)] if k3 and None not in k3 else None
        out[cls_dir.name] = rec["rows"]
    return out


def f_class_dependent() -> str:
    """Markdown: each class-dependent control's rows on every class that ran it, and whether its
    known-bad recipe failed there."""
    lines = ["| control | class | row | pass | step-0 k3 (min-max) |", "|---|---|---|---|---|"]
    for c in CLASS_DEPENDENT:
        for cls, rows_ in by_class(c).items():
            for r in rows_:
                k3 = "-" if r["k3"] is None else f"{r['k3'][0]:.3g}-{r['k3'][1]:.3g}"
                lines.append(f"| {c.name} | {cls} | {r['kind']}: {r['label']} | "
                             f"{r['passes']}/{r['runs']} | {k3} |")
    return "\n".join(lines)


def f_class_split(name: str) -> str:
    """How a class-dependent control's known-bad recipe fared on each class: "0/3 pass on A, 3/3
    pass on B"."""
    c = next(c for c in CLASS_DEPENDENT if c.name == name)
    parts = [f"{rows_[0]['passes']}/{rows_[0]['runs']} pass on {cls}"
             for cls, rows_ in by_class(c).items()]
    return ", ".join(parts)


def first_line(records: list[dict], references: list[str], machine_class: str) -> str:
    """The main job's first line: the known-bad recipes caught, the references and fixes passed, on
    this class."""
    rows = [r for rec in records for r in rec["rows"]]
    bad, fixes = ([r for r in rows if r["expect"] == e] for e in ("fail", "pass"))
    shown = [r for r in rows if r["expect"] is None]
    ref_pass = sum(v == "pass" for v in references)
    line = (f"sanity test on {machine_class}: failed {sum(r['ok'] is True for r in bad)} of "
            f"{len(bad)} known-bad recipes; passed {sum(r['ok'] is True for r in fixes)} of "
            f"{len(fixes)} fixes and {ref_pass} of {len(references)} reference runs (fp32)")
    if shown:
        line += f"; {len(shown)} more corrections shown beside them, not judged"
    unjudged = [r["control"] for r in records if r["behaved"] is None]
    if unjudged:
        line += (f"; not judged: {', '.join(unjudged)} (a run too short to judge, or incomplete: "
                 "the controls need the full budget)")
    wrong = misbehaved(records)
    return line + (f"; CONTROLS DID NOT BEHAVE: {', '.join(wrong)}" if wrong else "")


def misbehaved(records: list[dict]) -> list[str]:
    """'<control> (<row> should <expected> ..., got ...)' for each row that did not behave as its
    evidence says."""
    return [f"{rec['control']} ({'the known-bad recipe' if r['expect'] == 'fail' else r['label']} "
            f"should {r['expect']} in a majority of seeds; {r['passes']} of {r['runs']} passed)"
            for rec in records for r in rec["rows"] if r["ok"] is False]


def table(records: list[dict]) -> tuple[list[str], list[list[str]]]:
    """Header and rows of the controls table (report, outcomes.md and the console): one line per
    recipe."""
    head = ["control", "setting", "recipe", "passes", "Fisher p (> known-bad)", "expected",
            "behaved"]
    out = []
    for rec in records:
        for i, r in enumerate(rec["rows"]):
            p = r.get("fisher_p")
            ok = {True: "yes", None: "not judged"}.get(r["ok"]) or "NO: " + "; ".join(
                misbehaved([{**rec, "rows": [r]}]))
            out.append([rec["control"] if i == 0 else "", rec["what"] if i == 0 else "",
                        f"{r['kind']}: {r['label']}", f"{r['passes']}/{r['runs']} pass", "-"
                        if p is None else f"{p:.2f}",
                        {"fail": "fails", "pass": "passes"}.get(r["expect"], "(evidence splits)"),
                        ok])
    return head, out


def write(root: Path, out: Path, records: list[dict], line: str) -> None:
    """``controls.json`` next to the main runs: what the report and the leaderboard show of the
    controls."""
    head, body = table(records)
    atomic_write_json(Path(out) / "controls.json",
                      {"first_line": line, "root": display_path(root), "records": records,
                                                    "head": head, "rows": body})


def f_first_line(cls: str) -> str:
    """The first line of a class's committed main job, recomputed from its committed runs."""
    from suite.analysis.runs import load_summaries
    from suite.results import REFERENCE_ROOT

    refs = [s["verdict"] for s in load_summaries(REFERENCE_ROOT / cls / "main")
            if s["precision"] == "fp32"]
    return first_line(judge(REFERENCE_ROOT / cls / "controls"), refs, cls)


def f_flows(cls: str) -> str:
    """Pass counts per main flow of a class's committed main job: "fp32 3/3, fp16 3/3, ..."."""
    from suite.analysis.render import flow_order
    from suite.analysis.runs import load_summaries
    from suite.results import REFERENCE_ROOT

    sums = load_summaries(REFERENCE_ROOT / cls / "main")
    by = {f: [s["verdict"] for s in sums if s["precision"] == f]
          for f in flow_order(s["precision"] for s in sums)}
    return ", ".join(f"{f} {v.count('pass')}/{len(v)}" for f, v in by.items())


def f_pairs(cls: str) -> str:
    """Each committed control of a class as "stale-k4 0/3 pass beside token TIS 3/3, sequence MIS
    2/3"."""
    from suite.results import REFERENCE_ROOT

    return "; ".join(f"{rec['control']} {rec['rows'][0]['passes']}/{rec['rows'][0]['runs']} pass "
                     "beside "
                     + ", ".join(f"{r['label']} {r['passes']}/{r['runs']}" for r in rec["rows"][1:])
                     for rec in judge(REFERENCE_ROOT / cls / "controls"))
