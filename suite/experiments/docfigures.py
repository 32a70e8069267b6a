"""Figures the documents quote, generated from the committed results and the code, so that they
cannot go stale.

README.md, results/README.md and docs/*.md hold spans

    <!-- generated:NAME:ARG:... -->text<!-- /generated -->

(inline in a sentence, or around a whole table) whose text is ``figure("NAME:ARG:...")``: a pure
function of the files under results/reference/ (summary.json, metrics.jsonl, timing.jsonl, env.json
of each run) or of the code (the tiers' policy sizes, the named grids). Markdown renders the
comments as nothing.

    python -m suite.experiments.docfigures --write    # refill every span from the data
    python -m suite.experiments.docfigures # check: exit 1, naming each span that disagrees

tests/test_docs_figures.py runs the check, so a regenerated reference or a changed tier fails CI
until the documents say what the data say. Figures are formatted once here (``_num``, ``_ratio``),
so one number is written the same way everywhere it is quoted.
"""

from __future__ import annotations

import itertools
import json
import re
import statistics
import sys
from functools import cache
from pathlib import Path

from suite.experiments import bench_profile, bench_targets, bench_trl, calibration, controls
from suite.experiments.accept_tables import f_accept
from suite.experiments.bench_memory import plan_markdown
from suite.experiments.cell_figures import (
    f_anatomy,
    f_fell,
    f_final,
    f_final_range,
    f_gap,
    f_gap_clipped,
    f_growth,
    f_half_ess,
    f_heldout,
    f_runs,
    f_seeds,
    f_step0_cell,
    span,
)
from suite.experiments.grid_tables import f_centering, f_centering_dose, f_matrix, f_source
from suite.packed import read_log
from suite.results import REFERENCE_ROOT, atomic_write_text
from suite.rl.plan import markdown as plan_table

REPO = REFERENCE_ROOT.parents[1]
# A span: the name (with its arguments) and the text between the markers, shortest match.
SPAN = re.compile(r"<!-- generated:(?P<name>[^\s>]+) -->(?P<text>.*?)<!-- /generated -->",
                  re.DOTALL)
STEP0 = "mismatch/step0/"


def documents(repo: Path = REPO) -> list[Path]:
    """The documents whose spans are checked: README.md, results/README.md and every page of
    docs/."""
    return [repo / "README.md", repo / "results" / "README.md",
            *sorted((repo / "docs").glob("*.md"))]


# ---------------------------------------------------------------------------- number formats
def _num(x: float) -> str:
    """A mismatch value: 0 stays "0" (exactly zero is the point of the exact and unified flows),
    else 3 digits."""
    return "0" if x == 0 else f"{x:.2e}"


def _ratio(x: float) -> str:
    """A ratio of two mismatch values, 3 significant digits: "0.391x", "10.3x", "104x"."""
    return f"{x:.3g}x" if x < 1000 else f"{x:,.0f}x"


def _count(n: int) -> str:
    """A parameter count as the README writes it: 206k, 1.58M."""
    return f"{n / 1e3:.0f}k" if n < 1e6 else f"{n / 1e6:.2f}M"


# ---------------------------------------------------------------------------- the committed sanity
# grids
def classes() -> list[str]:
    """Machine classes with a committed `sanity` reference, sorted by name."""
    return sorted(p.parent.name for p in REFERENCE_ROOT.glob("*/sanity") if p.is_dir())


@cache
def _runs(cls: str, grid: str = "sanity") -> tuple[tuple[Path, dict], ...]:
    """(run directory, summary.json) of every run of a committed grid, in name order."""
    root = REFERENCE_ROOT / cls / grid
    if not root.is_dir():
        raise ValueError(f"no committed grid {root}")
    return tuple((p.parent, json.loads(p.read_text())) for p in sorted(root.glob("*/summary.json")))


@cache
def _rows(run_dir: Path, name: str) -> tuple[dict, ...]:
    return tuple(read_log(run_dir, name))  # plain or .xz (suite/packed.py)


def _flow_runs(cls: str, flow: str) -> list[tuple[Path, dict]]:
    out = [(d, s) for d, s in _runs(cls) if s["precision"] == flow]
    if not out:
        raise ValueError(f"{cls}: no {flow} run in the sanity reference")
    return out


def step0(cls: str, flow: str, key: str) -> float:
    """Mean over the flow's runs (one per algorithm) of the step-0 mismatch ``key``; step 0 precedes
    any update."""
    vals = [s[STEP0 + key] for _, s in _flow_runs(cls, flow)]
    return sum(vals) / len(vals)


def flows(cls: str) -> list[str]:
    from suite.analysis.render import flow_order

    return flow_order({s["precision"] for _, s in _runs(cls)})


def misses(cls: str) -> list[dict]:
    """The runs that failed: a verdict, neither pass nor at the line (nor too short to judge)."""
    return [s for _, s in _runs(cls) if s["verdict"] not in ("pass", "at_line", "too_short")]


# ---------------------------------------------------------------------------- figures: one function
# per name
def f_verdicts(cls: str) -> str:
    """Runs passing the sanity threshold, and those at the line: "9 of 24 (15 at the line)"."""
    runs = _runs(cls)
    at = sum(s["verdict"] == "at_line" for _, s in runs)
    return f"{sum(s['verdict'] == 'pass' for _, s in runs)} of {len(runs)}" + (
        f" ({at} at the line)" if at else "")


def f_misses(cls: str) -> str:
    """The cells that did not pass, with their final accuracy and verdict."""
    bad = misses(cls)
    if not bad:
        return "none"
    cells = ", ".join(f"`{s['algorithm']}` x {s['precision']} {s['accuracy/final']:.3f}"
                      for s in bad)
    verdicts = sorted({s["verdict"] for s in bad})
    return cells + (f", all `{verdicts[0]}`" if len(verdicts) == 1 else "")


def f_miss_flows() -> str:
    """The flows of every cell that missed, over all classes, with counts: "fp8 (2), bf16_fp8rollout
    (3)"."""
    n: dict[str, int] = {}
    for cls in classes():
        for s in misses(cls):
            n[s["precision"]] = n.get(s["precision"], 0) + 1
    order = flows(classes()[0])
    return ", ".join(f"{f} ({n[f]} of {sum(len(_flow_runs(c, f)) for c in classes())})"
                     for f in sorted(n, key=order.index)) or "none"


def f_miss_margin() -> str:
    """How far below the threshold the worst miss ended, over all classes (threshold - final
    accuracy)."""
    gaps = [s["threshold"] - s["accuracy/final"] for c in classes() for s in misses(c)]
    return f"{max(gaps):.3f}" if gaps else "0"


def f_flows_failing_everywhere() -> str:
    """"no flow fails in every run", or the flows that do (on some class)."""
    bad = sorted({(c, f) for c in classes() for f in flows(c)
                  if all(s["verdict"] in ("unstable", "collapse") for _, s in _flow_runs(c, f))})
    return "no flow fails in every run" if not bad else "every run fails for " + ", ".join(
        f"{f} on {c}" for c, f in bad)


def f_step0(cls: str, flow: str, key: str) -> str:
    return _num(step0(cls, flow, key))


def f_ratio(cls: str, num: str, den: str, key: str) -> str:
    """Step-0 mismatch of flow ``num`` over flow ``den`` on one class."""
    return _ratio(step0(cls, num, key) / step0(cls, den, key))


def f_ratio_range(num: str, den: str, key: str) -> str:
    """The same ratio over every class, as a range: "8.5x-10.3x"."""
    rs = sorted(step0(c, num, key) / step0(c, den, key) for c in classes())
    return _ratio(rs[0]) if _ratio(rs[0]) == _ratio(rs[-1]) else f"{_ratio(rs[0])}-{_ratio(rs[-1])}"


def f_order(chain: str) -> str:
    """"exact = 0 < fp32 < ..." when the step-0 k3 KL (and mean |dp|) of the listed flows rise in
    that order on every class, with the first exactly 0 if it is; otherwise the classes where the
    order breaks."""
    names = chain.split(",")
    broken = []
    for c in classes():
        for key in ("kl_k3", "prob_diff/mean"):
            v = [step0(c, f, key) for f in names]
            if any(a >= b for a, b in zip(v, v[1:])):
                broken.append(f"{c} ({key})")
    if broken:
        return f"the order {' < '.join(names)} breaks on " + ", ".join(broken)
    zero = all(step0(c, names[0], "kl_k3") == 0 for c in classes())
    return (f"{names[0]} = 0 < " if zero else f"{names[0]} < ") + " < ".join(names[1:])


def f_zero_steps(cls: str, flow: str) -> str:
    """On how many steps the flow's k3 KL is exactly 0, per run: "72-78 of 100" (range over its
    runs)."""
    counts, total = [], set()
    for d, _ in _flow_runs(cls, flow):
        rows = _rows(d, "metrics.jsonl")
        counts.append(sum(r["mismatch/kl_k3"] == 0 for r in rows))
        total.add(len(rows))
    return f"{span(min(counts), max(counts), 'd')} of {'/'.join(map(str, sorted(total)))}"


def f_zero_classes(flow: str, zero: str) -> str:
    """The classes where the flow's step-0 k3 KL is exactly 0 (zero=yes) or not (zero=no),
    comma-separated."""
    want = zero == "yes"
    return ", ".join(f"`{c}`" for c in classes()
                     if (step0(c, flow, "kl_k3") == 0) == want) or "none"


def f_perfectible(cls: str) -> str:
    """Prompts the perfectible filter kept of the pool, as env.json of the class's runs records
    it."""
    kept = {(json.loads((d / "env.json").read_text())["dataset"]["provenance"]["count_after"],
             json.loads((d / "env.json").read_text())["dataset"]["provenance"]["count_before"])
            for d, _ in _runs(cls)}
    if len(kept) != 1:
        raise ValueError(f"{cls}: the runs of the sanity reference record different perfectible "
                         f"sets {sorted(kept)}")
    after, before = kept.pop()
    return f"{after} of {before:,}"


def step_time(cls: str, flow: str) -> tuple[float, float]:
    """Range over the flow's runs of each run's median step time (timing.jsonl ``time/step_s``)."""
    meds = [statistics.median(r["time/step_s"] for r in _rows(d, "timing.jsonl"))
            for d, _ in _flow_runs(cls, flow)]
    return min(meds), max(meds)


def f_step0_table() -> str:
    """Per flow and class: mean step-0 k3 KL / mean |p_trainer - p_sampler| / runs passing."""
    cs = classes()
    lines = ["| flow | " + " | ".join(cs) + " |", "|---|" + "---|" * len(cs)]
    for f in flows(cs[0]):
        cells = []
        for c in cs:
            runs = _flow_runs(c, f)
            ok = sum(s["verdict"] == "pass" for _, s in runs)
            cells.append(f"{_num(step0(c, f, 'kl_k3'))} / {_num(step0(c, f, 'prob_diff/mean'))} / "
                         f"{ok} of {len(runs)}")
        lines.append(f"| {f} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def f_cost_table() -> str:
    """Per flow and class: the range over the flow's runs of their median step time."""
    cs = classes()
    lines = ["| flow | " + " | ".join(cs) + " |", "|---|" + "---|" * len(cs)]
    for f in flows(cs[0]):
        lines.append(f"| {f} | " + " | ".join(span(*step_time(c, f), ".2f") + " s" for c in cs)
                     + " |")
    return "\n".join(lines)


# ---------------------------------------------------------------------------- what reference.json
# records
def _reference(cls: str) -> dict:
    path = REFERENCE_ROOT / cls / "reference.json"
    if not path.is_file():
        raise ValueError(f"no {path}")
    return json.loads(path.read_text())


def f_wall(cls: str, grid: str, key: str = "wall_time_s") -> str:
    """The recorded wall time of the job that made a committed grid: "22 min 29 s" (``key`` another
    time it records, e.g. the README's first command on a fresh clone, set-up included)."""
    t = (_reference(cls).get("jobs") or {}).get(grid, {}).get(key)
    if t is None:
        raise ValueError(f"{cls}/reference.json records no wall time for {grid}")
    m, sec = divmod(round(t), 60)
    return f"{m} min {sec} s"


def f_made_at(cls: str) -> str:
    """The commit a class's reference was made at (reference.json ``git_sha``), short."""
    return _reference(cls)["git_sha"][:7]


# ---------------------------------------------------------------------------- the code: tiers and
# grids
@cache
def policy_parameters(tier: str) -> int:
    """Parameters of the embedded policy a tier builds: the model suite/rl/policy.py builds for the
    tier's task and architecture (built here, untrained, and counted)."""
    from suite.rl import config
    from suite.rl.data import policy_spec
    from suite.rl.policy import build_model, build_tokenizer, build_word_tokenizer, max_positions
    from suite.tasks.registry import get_task

    cfg = config.load([f"tier={tier}"])
    task = get_task(cfg.task)
    n_pos = max_positions(task)
    tok = (build_word_tokenizer(task.vocab, max(256, n_pos)) if hasattr(task, "vocab")
           else build_tokenizer(task.alphabet, max_len=max(256, n_pos)))
    return sum(p.numel()
               for p in build_model(policy_spec(cfg), vocab_size=len(tok),
                                    max_len=n_pos).parameters())


def f_params(tier: str) -> str:
    return _count(policy_parameters(tier))


def f_grids() -> str:
    """Every named grid, in the order of suite/experiments/grids.py."""
    from suite.experiments.grids import GRIDS
    return ", ".join(f"`{g}`" for g in GRIDS)


def f_grid_count() -> str:
    from suite.experiments.grids import GRIDS
    return str(len(GRIDS))


def f_grids_table() -> str:
    """One row per grid: runs with today's flows and algorithms, its axes, its fixed overrides, its
    doc."""
    from suite.experiments import grids
    lines = ["| grid | runs | axes | fixed | what |", "|---|---|---|---|---|"]
    for name in grids.GRIDS:
        g = grids.get(name)
        n = len(g["rows"]) * len(list(itertools.product(*g["axes"].values())))
        rows = ([f"rows {'; '.join(' '.join(f'`{o}`' for o in r) for r in g['rows'])}"]
                if len(g["rows"]) > 1 else [])
        axes = " x ".join(rows + [f"`{k}` {', '.join(map(str, v))}" for k, v in g["axes"].items()])
        fixed = " ".join(f"`{o}`" for o in g["overrides"])
        doc = g["doc"].replace("|", "\\|")  # a bar in a doc would end the table cell
        lines.append(f"| `{name}` | {n} | {axes} | {fixed} | {doc} |")
    return "\n".join(lines)


def f_attribution(cls: str, stack: str, source: str = "", metric: str = "k3") -> str:
    """The attribution table of a committed ``suite attribute`` output
    (results/reference/<class>/attribute/<stack>/ attribution.json) as the command prints it, or,
    given a source, its one-on effect on ``metric`` with its interval."""
    from suite.analysis.attribution import _fmt, table_markdown, title_of
    path = REFERENCE_ROOT / cls / "attribute" / stack / "attribution.json"
    summary = json.loads(path.read_text())
    return (_fmt(summary["metrics"][metric]["on"][source]) if source
            else table_markdown(summary, title_of(summary)))


def f_plan(*overrides: str) -> str:
    """The memory plan of a run config on 1 and 8 H100s, itemised (suite/rl/plan.py
    ``markdown``)."""
    return plan_table(list(overrides))


def f_memplan(cls: str, part: str = "table") -> str:
    """The plan against measured peaks on a class (``suite bench-memory --plan --write``): table,
    range or under."""
    return plan_markdown(REFERENCE_ROOT / cls / "memory_plan.json", part)


# ---------------------------------------------------------------------------- names, filling,
# checking
def f_early_warnings() -> str:
    """The early-warning signals' table over every committed reference run (``suite warnings
    results/reference/*/*``; suite/analysis/early_warnings.py)."""
    from suite.analysis import early_warnings as ew

    return ew.markdown(ew.tally([p for p in sorted(REFERENCE_ROOT.glob("*/*")) if p.is_dir()]))


FIGURES = {
    "verdicts": f_verdicts, "misses": f_misses, "miss-flows": f_miss_flows,
    "miss-margin": f_miss_margin, "flows-failing-everywhere": f_flows_failing_everywhere,
    "step0": f_step0, "ratio": f_ratio, "ratio-range": f_ratio_range, "order": f_order,
    "zero-steps": f_zero_steps, "zero-classes": f_zero_classes, "perfectible": f_perfectible,
    "step0-table": f_step0_table, "cost-table": f_cost_table, "final": f_final,
    "final-range": f_final_range, "seeds": f_seeds, "gap": f_gap, "runs": f_runs,
    "gap-clipped": f_gap_clipped, "wall": f_wall, "made-at": f_made_at, "half-ess": f_half_ess,
    "params": f_params, "grids": f_grids, "grid-count": f_grid_count, "grids-table": f_grids_table,
    "attribution": f_attribution, "attribution-on": f_attribution, "source": f_source,
    "plan": f_plan, "memplan": f_memplan, "accept": f_accept, "matrix": f_matrix,
    "centering": f_centering, "calibration": calibration.f_table,
    "calibrated": calibration.f_choice, "calibration-lr": calibration.f_lr,
    "control-evidence": controls.f_evidence, "main-line": controls.f_first_line,
    "main-flows": controls.f_flows, "main-pairs": controls.f_pairs, "step0-cell": f_step0_cell,
    "class-dependent": controls.f_class_dependent, "class-split": controls.f_class_split,
    "anatomy": f_anatomy, "growth": f_growth, "fell": f_fell, "early-warnings": f_early_warnings,
    "heldout": f_heldout, "centering-dose": f_centering_dose, "bench": bench_targets.f_table,
    "bench-profile": bench_profile.f_table, "bench-profile-ratio": bench_profile.f_ratio,
    "bench-profile-floor": bench_profile.f_floor, "bench-profile-ms": bench_profile.f_ms,
    "bench-sdpa": bench_profile.f_sdpa, "bench-trl": bench_trl.f_table,
    "bench-trl-ratio": bench_trl.f_ratio}


def figure(name: str) -> str:
    """The text of span ``NAME:ARG:...``; ValueError naming the span when the name or its arguments
    are wrong."""
    head, *args = name.split(":")
    fn = FIGURES.get(head)
    if fn is None:
        from suite.names import did_you_mean

        raise ValueError(f"generated:{name}: unknown figure '{head}'.{did_you_mean(head, FIGURES)}")
    try:
        return fn(*args)
    except TypeError as e:
        raise ValueError(f"generated:{name}: wrong arguments for '{head}' ({e})") from None


def _render(name: str) -> str:
    """A multi-line figure (a table) sits on its own lines between the markers."""
    text = figure(name)
    return f"\n{text}\n" if "\n" in text else text


def fill(text: str) -> str:
    """``text`` with every span's content replaced by what the data give."""
    return SPAN.sub(lambda m: f"<!-- generated:{m['name']} -->{_render(m['name'])}<!-- /generated "
                              "-->", text)


def disagreements(path: Path, text: str | None = None) -> list[str]:
    """One line per span of the document whose text differs from the data's: where, what it says,
    what is true."""
    text = path.read_text(encoding="utf-8") if text is None else text
    out = []
    for m in SPAN.finditer(text):
        want = _render(m["name"])
        if m["text"] != want:
            line = text.count("\n", 0, m.start()) + 1
            where = path.relative_to(REPO) if path.is_relative_to(REPO) else path
            out.append(f"{where}:{line}: generated:{m['name']} says {m['text'].strip()!r}, "
                       f"the data give {want.strip()!r}")
    return out


def main(argv: list[str]) -> int:
    """``--write``: refill every document; no argument: check them (exit 1 and one line per
    disagreement)."""
    if argv not in ([], ["--write"]):
        print("usage: python -m suite.experiments.docfigures [--write]", file=sys.stderr)
        return 2
    bad = []
    for path in documents():
        text = path.read_text(encoding="utf-8")
        if argv == ["--write"]:
            new = fill(text)
            if new != text:
                atomic_write_text(path, new)
                print(f"rewrote {path.relative_to(REPO)}")
        else:
            bad += disagreements(path, text)
    for line in bad:
        print(line)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
