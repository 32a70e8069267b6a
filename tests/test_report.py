"""The outcome table is a pure function of summary files."""

import json

from suite import report


def _write(root, precision, k3, dp, slr, verdict="pass"):
    d = root / f"arith__grpo__{precision}__s0"
    d.mkdir(parents=True)
    s = {"run": d.name, "task": "arith", "algorithm": "grpo", "precision": precision, "seed": 0,
         "verdict": verdict, "accuracy/peak": 0.96, "accuracy/peak_step": 90, "accuracy/final": 0.95,
         "accuracy/first_pass_step": 80, "mismatch/step0/kl_k3": k3, "mismatch/step0/prob_diff/mean": dp,
         "mismatch/step0/seq_log_ratio/mean_abs": slr, "mismatch/final/kl_k3": k3, "train/skipped_steps": 0,
         "time/total_s": 12.0}
    (d / "summary.json").write_text(json.dumps(s))


def test_markdown_table_and_bf16_fp16_ratios(tmp_path):
    _write(tmp_path, "bf16", 4e-5, 5e-4, 4e-2)
    _write(tmp_path, "fp16", 2e-6, 1e-4, 8e-3, verdict="collapse")
    md = report.outcome_markdown(tmp_path)
    assert "| arith__grpo__bf16__s0 | pass | 0.960 (90) |" in md
    assert "| arith__grpo__fp16__s0 | collapse |" in md
    assert "mean abs dp 5.0x, k3 KL 20.0x, mean abs seq log-ratio 5.0x" in md
    assert report.outcome_rows(tmp_path / "nothing") == []
