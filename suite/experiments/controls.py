"""The sanity test's controls: recipes known to fail at the embedded scale, each beside its fix.

A test that cannot fail a known-bad recipe is not a test. Each control is two rows of the ``controls`` grid
(``suite/experiments/grids.py``), the known-bad recipe and its fix, run over the same seeds as the main
flows; ``judge`` says whether they behaved as the committed evidence says they do, and ``suite main`` exits
non-zero, naming the control, when one did not.

Expected behaviour (``EXPECT``): the known-bad recipe fails (any verdict but ``pass``) in a majority of its
seeds and its fix passes in a majority of them. A majority, not every seed: the evidence is three seeds on
one machine class, and one seed of another class landing a few samples on the other side of the line is what
three runs cannot rule out; the pass counts and the one-sided Fisher exact test of fix against known-bad are
printed beside the judgement, so the strength of the separation is never hidden behind it.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from suite.analysis.stats import fisher_exact
from suite.results import atomic_write_json, display_path, find_run_dirs


@dataclass(frozen=True)
class Control:
    name: str
    what: str  # the setting, in words
    bad: tuple[str, ...]  # overrides of the known-bad recipe
    fix: tuple[str, ...]  # overrides of its fix
    fix_name: str
    # Where the committed grids hold each row's runs (relative to results/reference/<class>/, with the runs'
    # algorithm): the evidence ``evidence`` re-judges at the main job's line.
    evidence: dict[str, tuple[str, str]]
    evidence_class: str = "cpu-avx512bf16-mixed"


# The two pairs the committed grids separate in every seed on cpu-avx512bf16-mixed at the calibrated line
# (docs/calibration.md): the known-bad recipe fails 3 of 3, its fix passes 3 of 3.
CONTROLS = (
    # Asynchronous RL samples with old weights; plain GRPO's ratio is taken against the trainer's current
    # policy, so the rollouts are silently off-policy (the staleness source, docs/attribution.md).
    Control("stale-k4", "fp32, rollouts sampled with weights 4 RL steps old",
            bad=("precision=fp32", "staleness=4", "algorithm=grpo"),
            fix=("precision=fp32", "staleness=4", "algorithm=grpo_token_tis"), fix_name="token TIS",
            evidence={"bad": ("src-staleness/base/k4", "grpo"), "fix": ("src-staleness/base/k4", "grpo_token_tis")}),
    # SkyRL v0.5.0's headline run: NVFP4 W4A4 rollouts with a BF16 trainer collapsed without a correction;
    # score centering (arXiv 2609.20807) removes the drift term the mismatch adds at every prefix.
    Control("nvfp4a4-rollout", "bf16 trainer, NVFP4 W4A4 rollouts (4-bit weights and activations)",
            bad=("precision=bf16_nvfp4a4rollout", "algorithm=grpo"),
            fix=("precision=bf16_nvfp4a4rollout", "algorithm=grpo", "algo.score_centering=true"),
            fix_name="score centering",
            evidence={"bad": ("fp4", "grpo"), "fix": ("fp4-centering", "grpo")}),
)
ROLES = ("bad", "fix")
EXPECT = {"bad": "fail", "fix": "pass"}  # in a majority of the row's seeds
# Verdicts of a complete run long enough to judge (suite/results.py); at_line counts as neither a pass nor a fail.
JUDGED = ("pass", "at_line", "unstable", "collapse")


def rows() -> list[list[str]]:
    """The ``controls`` grid's rows: each control's known-bad recipe and its fix, each under its own name."""
    return [[*getattr(c, role), f"name=controls/{c.name}/{role}"] for c in CONTROLS for role in ROLES]


def _verdicts(root: Path, control: Control, role: str) -> list[str]:
    """The verdicts of one row's runs, in seed order ("missing" for a run without a summary)."""
    out = []
    for d in find_run_dirs(Path(root) / control.name / role):
        path = d / "summary.json"
        out.append(json.loads(path.read_text()).get("verdict", "missing") if path.exists() else "missing")
    return out


def judge(root: Path) -> list[dict]:
    """One record per control of the ``controls`` grid in ``root``: the verdicts of both rows, whether each row
    behaved (``EXPECT``), and the one-sided Fisher exact p that the fix passes more often than the known-bad."""
    out = []
    for c in CONTROLS:
        v = {role: _verdicts(root, c, role) for role in ROLES}
        n = {role: len(v[role]) for role in ROLES}
        passes = {role: sum(x == "pass" for x in v[role]) for role in ROLES}
        ok = {role: _behaved(role, v[role]) for role in ROLES}
        p = fisher_exact(passes["fix"], n["fix"], passes["bad"], n["bad"]) if n["bad"] and n["fix"] else None
        behaved = None if None in ok.values() else ok["bad"] and ok["fix"]
        out.append({"control": c.name, "what": c.what, "fix": c.fix_name, "evidence": evidence_text(c),
                    "verdicts": v, "passes": passes, "runs": n, "ok": ok, "behaved": behaved, "fisher_p": p})
    return out


def _behaved(role: str, verdicts: list[str]) -> bool | None:
    """Whether a row's runs behaved as ``EXPECT`` says; None when a run has no verdict to judge by (too short,
    incomplete, missing): a smoke run neither catches nor misses a control."""
    if not verdicts or any(v not in JUDGED for v in verdicts):
        return None
    hits = sum(v == "pass" if EXPECT[role] == "pass" else v in ("unstable", "collapse") for v in verdicts)
    return 2 * hits > len(verdicts)


def evidence_text(c: Control) -> str:
    """Where the committed evidence of a control lies, in words."""
    return f"{c.evidence_class}: " + ", ".join(f"{role} {path} ({algo})" for role, (path, algo) in c.evidence.items())


def evidence(c: Control, role: str, line: float, budget: int) -> list[dict]:
    """The committed runs of one row, re-judged at the main job's line and budget (their summaries hold the
    line they ran with): a summary per seed."""
    from suite.results import REFERENCE_ROOT, read_log, samples_per_step, summarize

    path, algo = c.evidence[role]
    flow = next(o.split("=", 1)[1] for o in getattr(c, role) if o.startswith("precision="))
    out = []
    for d in find_run_dirs(REFERENCE_ROOT / c.evidence_class / path):
        cfg = json.loads((d / "config.json").read_text())["config"]
        if cfg["precision"] == flow and cfg["algorithm"] == algo:
            rows = [r for r in read_log(d, "metrics.jsonl") if r["step"] <= budget]
            out.append(summarize(rows, total_steps=budget, threshold=line, samples_per_step=samples_per_step(cfg)))
    return out


def f_evidence() -> str:
    """Markdown: each control's committed runs at the main job's line and budget, per row."""
    from suite.experiments.calibration import EMBEDDED_LINE
    from suite.rl.config import TIERS

    lines = ["| control | row | committed runs | pass | peak: min-max | final: min-max |", "|---|---|---|---|---|---|"]
    for c in CONTROLS:
        for role in ROLES:
            sums = evidence(c, role, EMBEDDED_LINE, TIERS["small"]["steps"])
            peaks, finals = [s["accuracy/peak"] for s in sums], [s["accuracy/final"] for s in sums]
            label = "known-bad: plain GRPO" if role == "bad" else f"fix: {c.fix_name}"
            at = sum(s["verdict"] == "at_line" for s in sums)
            lines.append(f"| {c.name} | {label} | {c.evidence_class}/{c.evidence[role][0]} | "
                         f"{sum(s['verdict'] == 'pass' for s in sums)}/{len(sums)}{f' ({at} at the line)' if at else ''} | "
                         f"{min(peaks):.3f}-{max(peaks):.3f} | "
                         f"{min(finals):.3f}-{max(finals):.3f} |")
    return "\n".join(lines)


def first_line(records: list[dict], references: list[str], machine_class: str) -> str:
    """The main job's first line: the known-bad recipes caught, the references and fixes passed, on this class."""
    caught = sum(r["ok"]["bad"] is True for r in records)
    fixed = sum(r["ok"]["fix"] is True for r in records)
    ref_pass = sum(v == "pass" for v in references)
    line = (f"sanity test on {machine_class}: failed {caught} of {len(records)} known-bad recipes; passed "
            f"{fixed} of {len(records)} fixes and {ref_pass} of {len(references)} reference runs (fp32)")
    unjudged = [r["control"] for r in records if r["behaved"] is None]
    if unjudged:
        line += (f"; not judged: {', '.join(unjudged)} (a run too short to judge, or incomplete: the controls need "
                 "the full budget)")
    wrong = misbehaved(records)
    return line + (f"; CONTROLS DID NOT BEHAVE: {', '.join(wrong)}" if wrong else "")


def misbehaved(records: list[dict]) -> list[str]:
    """'<control> (<row> <expected>, got <verdicts>)' for each row that did not behave as its evidence says."""
    return [f"{r['control']} ({'the known-bad recipe' if role == 'bad' else r['fix']} should {EXPECT[role]} in a "
            f"majority of seeds; {r['passes'][role]} of {r['runs'][role]} passed)"
            for r in records for role in ROLES if r["ok"][role] is False]


def table(records: list[dict]) -> tuple[list[str], list[list[str]]]:
    """Header and rows of the controls table (report, outcomes.md and the console)."""
    head = ["control", "setting", "known-bad: plain GRPO", "fix", "fix passes", "Fisher p (fix > bad)", "behaved"]
    rows = []
    for r in records:
        p = "-" if r["fisher_p"] is None else f"{r['fisher_p']:.2f}"
        rows.append([r["control"], r["what"], f"{r['passes']['bad']}/{r['runs']['bad']} pass", r["fix"],
                     f"{r['passes']['fix']}/{r['runs']['fix']} pass", p,
                     {True: "yes", None: "not judged"}.get(r["behaved"]) or "NO: " + "; ".join(misbehaved([r]))])
    return head, rows


def write(root: Path, out: Path, records: list[dict], line: str) -> None:
    """``controls.json`` next to the main runs: what the report and the leaderboard show of the controls."""
    head, body = table(records)
    atomic_write_json(Path(out) / "controls.json", {"first_line": line, "root": display_path(root), "records": records,
                                                    "expect": EXPECT, "head": head, "rows": body})


def f_first_line(cls: str) -> str:
    """The first line of a class's committed main job, recomputed from its committed runs."""
    from suite.analysis.runs import load_summaries
    from suite.results import REFERENCE_ROOT

    refs = [s["verdict"] for s in load_summaries(REFERENCE_ROOT / cls / "main") if s["precision"] == "fp32"]
    return first_line(judge(REFERENCE_ROOT / cls / "controls"), refs, cls)


def f_flows(cls: str) -> str:
    """Pass counts per main flow of a class's committed main job: "fp32 3/3, fp16 3/3, ..."."""
    from suite.analysis.render import flow_order
    from suite.analysis.runs import load_summaries
    from suite.results import REFERENCE_ROOT

    sums = load_summaries(REFERENCE_ROOT / cls / "main")
    by = {f: [s["verdict"] for s in sums if s["precision"] == f] for f in flow_order(s["precision"] for s in sums)}
    return ", ".join(f"{f} {v.count('pass')}/{len(v)}" for f, v in by.items())


def f_pairs(cls: str) -> str:
    """Each committed control of a class as "stale-k4 0/3 pass beside token TIS 3/3"."""
    from suite.results import REFERENCE_ROOT

    return "; ".join(f"{r['control']} {r['passes']['bad']}/{r['runs']['bad']} pass beside {r['fix']} "
                     f"{r['passes']['fix']}/{r['runs']['fix']}" for r in judge(REFERENCE_ROOT / cls / "controls"))
