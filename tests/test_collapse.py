"""The collapse-search report (suite/analysis/collapse.py) on hand-made run bundles whose outcome is
known."""

import json

import pytest

from suite.analysis import collapse
from suite.analysis.report import write_report
from suite.analysis.runs import load_runs
from suite.results import config_hash, summarize

STEPS = 40


def _curve(kind: str, seed: int) -> list[float]:
    """pass: rises to ~0.99 and stays; collapse: rises to 0.8 then falls to 0.1; flat: stays at
    0.6."""
    if kind == "pass":
        return [min(0.99, 0.6 + 0.03 * t) for t in range(STEPS)]
    if kind == "collapse":
        return [min(0.8, 0.6 + 0.02 * t) if t < 20 else max(0.1, 0.8 - 0.07 * (t - 19))
                for t in range(STEPS)]
    return [0.6 + 0.01 * (seed % 2)] * STEPS


def _write(root, regime: str, precision: str, seed: int, kind: str, k3_growth: float = 1.0,
           algo: str = "grpo") -> None:
    cfg = {"task": "arith3", "algorithm": algo, "precision": precision, "seed": seed,
           "regime": regime, "steps": STEPS, "threshold": 0.95, "tier": "small"}
    d = root / regime / f"arith3__{algo}__{precision}__s{seed}"
    d.mkdir(parents=True)
    rows = [{"step": t + 1, "reward/mean": r, "entropy/mean": 0.05,
             "mismatch/kl_k3": 1e-4 * (1 + (k3_growth - 1) * t / (STEPS - 1)),
             "anatomy/top1pct_share": 0.5, "anatomy/pi_lt0.5/frac": 0.02,
             "anatomy/pi_lt0.5/share": 0.7}
            for t, r in enumerate(_curve(kind, seed))]
    (d / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    s = summarize(rows, total_steps=STEPS)
    s.update({k: cfg[k] for k in ("task", "algorithm", "precision", "seed")})
    (d / "summary.json").write_text(json.dumps(s))
    (d / "config.json").write_text(json.dumps({"config_hash": config_hash(cfg), "config": cfg}))
    (d / "env.json").write_text(json.dumps({"schema_version": 1}))


@pytest.fixture
def search(tmp_path):
    """Regime 'sharp': bf16 collapses in every seed, fp16/fp32 pass. Regime 'dull': everything
    passes."""
    for seed in range(3):
        for prec in ("fp32", "fp16"):
            _write(tmp_path, "sharp", prec, seed, "pass")
            _write(tmp_path, "dull", prec, seed, "pass")
        _write(tmp_path, "sharp", "bf16", seed, "collapse", k3_growth=50.0)
        _write(tmp_path, "dull", "bf16", seed, "pass")
    return tmp_path


def test_findings_separate_only_the_sharp_regime(search):
    runs = load_runs(search)
    found = {(f["regime"], f["flow"]): f for f in collapse.findings(runs)}
    assert found[("sharp", "bf16")]["separated"] and not found[("dull", "bf16")]["separated"]
    # final accuracy 0.1 (bf16) vs 0.99 (fp16): -0.89 with a zero-width CI
    gap = found[("sharp", "bf16")]["gap"]
    assert gap == pytest.approx((-0.89, -0.89, -0.89))
    text = collapse.statement(runs, list(found.values()))
    assert "Precision decides the outcome in 1 setting(s): bf16 grpo in regime sharp" in text


def test_no_separation_is_stated_as_such(search):
    runs = [r for r in load_runs(search) if collapse.regime(r) == "dull"]
    text = collapse.statement(runs, collapse.findings(runs))
    assert "No regime separates" in text and "No reward-level difference" in text


def test_drawdown_and_lead_by_hand(search):
    run = next(r for r in load_runs(search) if r.label == "sharp/arith3__grpo__bf16__s0")
    dd, step = collapse.drawdown(run)
    # raw reward is 0.8 from step 11: the 5-step trailing mean reaches it at step 15
    assert step == 15
    assert dd == pytest.approx(0.8 - 0.1)
    head, rows = collapse.lead_table([run])
    # k3 grows linearly 1e-4 -> 5e-3 over 40 steps: the 10 steps up to step 15 against the first 10
    k3 = [1 + 49 * t / 39 for t in range(STEPS)]
    assert rows[0][3] == "15" and float(rows[0][6]) == pytest.approx(
        sum(k3[5:15]) / sum(k3[:10]), rel=1e-2)
    assert collapse.growth(run) == pytest.approx(sum(k3[30:]) / sum(k3[:10]))


def test_report_uses_the_search_document(search):
    out = write_report(search)
    md = (out / "report.md").read_text()
    assert md.startswith("# Collapse search")
    assert "Precision decides the outcome" in md and "Settings tried" in md and "Mechanism" in md
    assert (out / "figures" / "search_reward.png").stat().st_size > 10_000


def test_corrections_are_compared_with_grpo_in_the_same_cell(search):
    for seed in range(3):
        _write(search, "sharp", "bf16", seed, "pass", algo="grpo_token_tis")
    runs = load_runs(search)
    head, rows = collapse.corrections_table(runs)
    assert [r[:4] for r in rows] == [["sharp", "bf16", "grpo_token_tis", "3/3"]]
    # 0.99 against the collapsed 0.1, every seed alike
    assert rows[0][5] == "+0.890 [+0.890, +0.890]"
    md = (write_report(search) / "report.md").read_text()
    assert "## Corrections" in md and "algorithm=grpo_token_tis" in md
