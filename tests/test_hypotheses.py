"""The per-hypothesis science report (suite/analysis/hypotheses.py) on hand-made run bundles whose
outcome is known."""

import json

import pytest

from suite.analysis import hypotheses, hypothesis_tables
from suite.analysis.runs import load_runs
from suite.results import config_hash, summarize

STEPS = 40


def _curve(kind: str) -> list[float]:
    if kind == "pass":
        return [min(0.99, 0.6 + 0.03 * t) for t in range(STEPS)]
    return [min(0.8, 0.6 + 0.02 * t) if t < 20 else max(0.1, 0.8 - 0.07 * (t - 19))
            for t in range(STEPS)]


def _write(d, precision: str, seed: int, kind: str, k3: float, extra: dict | None = None,
           mech: float | None = None, algorithm: str = "grpo", task: str = "arith3",
           row: dict | None = None, mech_rows: list | None = None):
    cfg = {"task": task, "algorithm": algorithm, "precision": precision, "seed": seed,
           "regime": "base", "steps": STEPS, "threshold": 0.95, "tier": "small", **(extra or {})}
    d = d / f"{task}__{algorithm}__{precision}__s{seed}"
    d.mkdir(parents=True)
    rows = [{"step": t + 1, "reward/mean": r, "entropy/mean": 0.05, "mismatch/kl_k3": k3,
             **(row or {})}
            for t, r in enumerate(_curve(kind))]
    (d / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    if mech is not None:
        mech_rows = [{"step": 1, "mech/gap_clip_frac": mech, "mech/is_tok/ess": 0.99,
                      "mech/is_seq/ess": 0.9}]
    if mech_rows:
        (d / "mechanism.jsonl").write_text("".join(json.dumps(m) + "\n" for m in mech_rows))
    s = summarize(rows, total_steps=STEPS)
    s.update({k: cfg[k] for k in ("task", "algorithm", "precision", "seed")})
    (d / "summary.json").write_text(json.dumps(s))
    (d / "config.json").write_text(json.dumps({"config_hash": config_hash(cfg), "config": cfg}))
    (d / "env.json").write_text(json.dumps({"schema_version": 1}))


K3 = {"fp32": 1e-14, "fp16": 2e-6, "bf16": 2e-4, "bf16_unified": 2e-6, "exact": 0.0}


@pytest.fixture
def class_dir(tmp_path):
    """H1: with the sampler reference bf16 fails every seed while fp16/fp32 pass; with the trainer's
    all pass.
    Controls: every flow passes. Dose: noise passes at 0.1, one seed fails at 0.3, every seed at
    1.0."""
    root = tmp_path / "cpu-test"
    for seed in range(3):
        for ref in ("trainer", "sampler"):
            for prec in ("fp32", "fp16", "bf16"):
                kind = "collapse" if (ref, prec) == ("sampler", "bf16") else "pass"
                _write(root / "h1-phantom-clip" / ref, prec, seed, kind, K3[prec],
                       {"algo": {"ppo_ref": ref}}, mech=0.01 if prec == "bf16" else 0.0)
        for prec in K3:
            _write(root / "trainer-controls", prec, seed, "pass", K3[prec])
        for scale, k3 in ((0.1, 1.5e-4), (0.3, 1.4e-3), (1.0, 1.8e-2)):
            kind = "pass" if scale == 0.1 or (scale == 0.3 and seed) else "collapse"
            _write(root / "dose-response" / f"noise-{scale}", "fp32", seed, kind, k3,
                   {"inject": {"kind": "noise", "scale": scale, "threshold": 0.1}})
    return root


def test_each_hypothesis_states_its_outcome_from_the_runs(class_dir, tmp_path):
    doc = hypotheses.build_document(class_dir, tmp_path / "fig")
    summary = {row[0]: row for row in doc[2][2]}
    assert summary["H1"][4].startswith("H1 separates: bf16 in algo.ppo_ref=sampler fails the "
                                       "sanity test in every seed")
    assert "algo.ppo_ref=trainer: fp32 3/3, bf16 3/3, fp16 3/3" in summary["H1"][4]
    assert summary["H2"][3:] == ["0", "not run on this class"]
    assert summary["D"][4].startswith("with noise, the smallest magnitude where a seed does not "
                                      "pass is scale 0.3 (step-0 k3 1.40e-03), and no seed passes "
                                      "from scale 1.0 (k3 1.80e-02)")
    assert "bf16 k3 2.00e-04 (3/3 pass)" in summary["D"][4]
    assert "bf16 vs bf16_unified +0.000 [+0.000, +0.000] (CI includes 0)" in summary["C"][4]
    assert ((tmp_path / "fig" / "dose_response.png").is_file()
            and (tmp_path / "fig" / "h1-phantom-clip_reward.png").is_file())


def test_the_mechanism_table_reads_mechanism_jsonl(class_dir):
    runs = hypotheses.with_arms(load_runs(class_dir / "h1-phantom-clip"), "algo.ppo_ref")
    head, rows = hypothesis_tables.mechanism_table(runs)
    row = {(r[0], r[1]): r for r in rows}[("algo.ppo_ref=sampler", "bf16")]
    assert row[2] == "1.000 ± 0.000 %" and row[-1] == "3/3"


def test_the_report_is_written_atomically_and_refuses_a_foreign_folder(class_dir, tmp_path):
    out = hypotheses.write(class_dir, tmp_path / "report")
    md = (out / "report.md").read_text()
    assert ("## H1: phantom clipping" in md and "## D: dose-response" in md
            and "figures/dose_response.png" in md)
    hypotheses.write(class_dir, out)  # a report folder is replaced
    foreign = tmp_path / "runs"
    (foreign / "x").mkdir(parents=True)
    with pytest.raises(ValueError, match="not a report folder"):
        hypotheses.write(class_dir, foreign)
    assert (foreign / "x").is_dir()


def _ess(tok: float, seq: float, step: int = 1) -> dict:
    """A mechanism.jsonl row whose weights have chi2 (= 1 / ESS - 1) tok per token and seq per
    sequence."""
    return {"step": step, "mech/is_tok/ess": 1 / (1 + tok), "mech/is_seq/ess": 1 / (1 + seq)}


def test_the_length_table_compounds_the_token_chi2_over_the_response(tmp_path):
    """H2: (1 + chi2_tok)^T - 1 against the measured sequence chi2, and the length where the ESS
    would halve."""
    for seed in range(2):
        _write(tmp_path, "bf16", seed, "pass", 1e-4, algorithm="pg_seq_is", task="arith8",
               row={"response/length/mean": 80.0 + 6 * seed},
               mech_rows=[_ess(1e-3, 0.05 + 0.02 * seed), _ess(2e-3, 0.3, step=2)])
    head, rows = hypothesis_tables.length_table(hypotheses.with_arms(load_runs(tmp_path), "task"))
    (row,) = rows
    got = dict(zip(head, row))
    assert got["arm"] == "task=arith8" and got["response tokens"] == "83.0 ± 4.2"
    # (1.001^80 - 1 + 1.001^86 - 1) / 2 = (0.083263 + 0.089762) / 2
    assert (got["(1 + token chi2)^T - 1"].startswith("8.65e-02")
            and got["token chi2"].startswith("1.00e-03 ± "))
    assert (got["sequence chi2"].startswith("6.00e-02")
            and got["sequence chi2, max over steps"].startswith("3.00e-01"))
    # ln 2 / ln 1.001 = 693.5
    assert got["tokens where the sequence ESS would be 1/2"].startswith("693")


def test_the_emulated_length_section_compares_the_estimators_on_one_sampler(tmp_path):
    """H2e: pg_seq_is collapses where grpo passes on the same noisy sampler; the bf16 length with
    the same sequence chi2 is T ln(1 + chi2_tok) / ln(1 + chi2_tok of bf16) = 100 ln 1.01 / ln 1.001
    = 995.5."""
    noisy = {"inject": {"kind": "noise", "scale": 1.0, "threshold": 0.1}}
    row, mech = {"response/length/mean": 100.0}, [_ess(0.01, 1.7)]
    for seed in range(3):
        for algorithm, kind in (("pg_seq_is", "collapse"), ("grpo", "pass")):
            _write(tmp_path / "emu", "fp32", seed, kind, 4e-3, noisy, algorithm=algorithm,
                   task="arith16", row=row, mech_rows=mech)
        _write(tmp_path / "len", "bf16", seed, "pass", 1e-4, task="arith16",
               mech_rows=[_ess(1e-3, 0.1)])
        _write(tmp_path / "len", "fp32", seed, "pass", 1e-14, algorithm="pg_seq_is", task="arith16")
    doc = hypotheses.emulated_section(load_runs(tmp_path / "emu"), load_runs(tmp_path / "len"))
    assert doc[0][1].startswith("Outcome: on the same noisy fp32 sampler, grpo passes 3/3, final "
                                "accuracy 0.990 ± 0.000; pg_seq_is passes 0/3, final accuracy "
                                "0.100 ± 0.000 (-0.890 [-0.890, -0.890] against grpo); without the "
                                "noise pg_seq_is passes 3/3, final accuracy 0.990 ± 0.000.")
    assert "reaches over ~996 tokens" in doc[0][1]
    rows = {r[1]: dict(zip(doc[1][1], r)) for r in doc[1][2] if r[0] == "inject.scale=1.0"}
    assert [r[0] for r in doc[1][2]] == ["inject.scale=1.0"] * 2 + ["no noise (h2-length)"]
    assert rows["pg_seq_is"]["bf16 tokens with the same sequence chi2"].startswith("996 ± ")
    assert (rows["grpo"]["final acc - grpo's [95% CI]"] == "-"
            and rows["pg_seq_is"]["sequence chi2"].startswith("1.70e+00"))


def test_the_routing_table_reads_the_expert_flips(tmp_path):
    """H4: step-1, mean and max share of flipped expert sets, in percent, per arm and flow."""
    for seed, flips in enumerate(([0.004, 0.002], [0.006, 0.010])):
        _write(tmp_path / "replay-False", "bf16", seed, "pass", 1e-4, {"routing_replay": False},
               mech_rows=[{"step": t + 1, "mech/moe/route_flip_frac": f}
                          for t, f in enumerate(flips)])
    head, rows = hypothesis_tables.routing_table(
        hypotheses.with_arms(load_runs(tmp_path), "routing_replay"))
    assert rows == [["routing_replay=False", "bf16", "0.500 ± 0.141 %", "0.550 ± 0.354 %",
                     "0.700 ± 0.424 %"]]
