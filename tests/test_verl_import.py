"""The verl importer (suite/experiments/verl_import.py) on metric rows written with verl's
documented names. No verl run is made here: the rows are what verl's formulas
(rollout_corr_helper.compute_offpolicy_metrics and ray_trainer's rollout_probs_diff, re-implemented
below from their source so that these tests need no verl; tests/test_conformance.py runs the
released verl) give on real log-probs, in the JSONL format of verl's file logger. Also: which verl
numbers land under suite keys, and the rejection of an import whose numbers were edited or whose
copies claim to be recomputed."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch

from suite import cli
from suite.analysis import bundle, leaderboard
from suite.experiments import verl_import
from suite.numerics.mismatch import mismatch_metrics
from suite.results import atomic_write_json, read_jsonl, write_summary

PROVENANCE = dict(verl_version="0.6.0", git_sha="0123456789abcdef0123456789abcdef01234567",
                  git_dirty=False, packages={"torch": "2.8.0", "vllm": "0.10.2"},
                  hardware={"gpus": ["NVIDIA H100 80GB HBM3"] * 8},
                  command="python3 -m verl.trainer.main_ppo algorithm.adv_estimator=grpo ...")


def verl_metrics(old_log_prob: torch.Tensor, rollout_log_prob: torch.Tensor,
                 response_mask: torch.Tensor) -> dict:
    """verl's own numbers for one batch: compute_offpolicy_metrics (prefixed rollout_corr/ as verl
    logs it) and ray_trainer's training/rollout_probs_diff_*, transcribed from verl's source."""
    m = response_mask.float()

    def masked_mean(x, axis=()):
        return (x * m).sum(axis) / (m.sum(axis) + 1e-8)  # verl_F.masked_mean: an empty row gives 0

    log_ratio = old_log_prob - rollout_log_prob
    lr_safe = log_ratio.clamp(-20, 20)
    log_ppl_diff = masked_mean(rollout_log_prob, -1) - masked_mean(old_log_prob, -1)
    seq = (log_ratio * m).sum(-1).clamp(-20, 20)
    diff = torch.masked_select((rollout_log_prob.exp() - old_log_prob.exp()).abs(),
                               response_mask.bool())
    return {"rollout_corr/kl": masked_mean(rollout_log_prob - old_log_prob).item(),
            "rollout_corr/k3_kl": masked_mean(torch.exp(log_ratio) - log_ratio - 1).item(),
            "rollout_corr/log_ppl_diff": log_ppl_diff.mean().item(),
            "rollout_corr/ppl_ratio": torch.exp(log_ppl_diff).mean().item(),
            "rollout_corr/chi2_token": (masked_mean(lr_safe.exp().square()) - 1.0).item(),
            "rollout_corr/chi2_seq": (torch.exp(2.0 * seq).mean() - 1.0).item(),
            "training/rollout_probs_diff_max": diff.max().item(),
            "training/rollout_probs_diff_mean": diff.mean().item(),
            "training/rollout_probs_diff_std": diff.std().item()}


def _batch(seed: int):
    """Log-probs of a real bf16-vs-fp32 pair: 6 responses of up to 5 tokens under a fixed softmax
    policy, the sampler's logits rounded to bf16. Every response has at least one token (see
    chi2_seq below)."""
    g = torch.Generator().manual_seed(seed)
    logits = torch.randn(6, 5, 11, generator=g) * 3
    tokens = torch.randint(0, 11, (6, 5), generator=g)
    old = torch.log_softmax(logits, -1).gather(-1, tokens[..., None])[..., 0].double()
    rollout = torch.log_softmax(logits.bfloat16().float(),
                                -1).gather(-1, tokens[..., None])[..., 0].double()
    mask = (torch.arange(5)[None] < torch.tensor([5, 3, 1, 4, 5, 2])[:, None]).long()
    return old, rollout, mask


def test_verl_numbers_go_under_suite_keys_only_where_the_formulas_agree():
    """The released verl is run against the suite in tests/test_conformance.py; here, the importer's
    use of it: a suite key receives a verl value only where the metric table says the two are the
    same number."""
    old, rollout, mask = _batch(0)
    mask[2] = 0  # a row without response tokens: where verl's sequence means part from the suite's
    ours, theirs = mismatch_metrics(old, rollout, mask), verl_metrics(old, rollout, mask)
    same = [k for k in verl_import.MAPPING if k.startswith("mismatch/")]
    assert same == ["mismatch/kl_k1", "mismatch/kl_k3", "mismatch/prob_diff/mean",
                    "mismatch/prob_diff/max", "mismatch/chi2_token"]
    for key in same:  # verl adds 1e-8 to the token count of its means: 1e-8 / n relative
        assert ours[key] == pytest.approx(theirs[verl_import.MAPPING[key][0]], rel=1e-8), key
    # The rest keep verl's name, and really are other numbers on this batch.
    n = int(mask.sum())
    assert (verl_import.MAPPING["verl/training/rollout_probs_diff_std"][0]
            == "training/rollout_probs_diff_std")
    assert theirs["training/rollout_probs_diff_std"] == pytest.approx(
        ours["mismatch/prob_diff/std"] * math.sqrt(n / (n - 1)))
    for name in ("log_ppl_diff", "ppl_ratio", "chi2_seq"):
        assert f"verl/rollout_corr/{name}" in verl_import.MAPPING
        assert theirs[f"rollout_corr/{name}"] != pytest.approx(
            ours[f"mismatch/{name}"], rel=1e-6), name


def write_verl_log(path: Path, steps: int = 12, flat: bool = False) -> list[dict]:
    """A verl file-logger log: a validation row at step 0, then one row per training step with
    verl's names."""
    rows = [{"step": 0, "data": {"val-core/math/acc/mean@1": 0.31}}]
    for s in range(1, steps + 1):
        acc = min(1.0, 0.55 + 0.06 * s)
        data = {"critic/score/mean": acc, "critic/rewards/mean": acc, **verl_metrics(*_batch(s)),
                "response_length/mean": 812.5, "response_length/max": 2048.0,
                "response_length/clip_ratio": 0.02, "actor/entropy": 0.41, "actor/grad_norm": 0.12,
                "actor/pg_clipfrac": 0.003, "timing_s/step": 95.0 + s, "timing_s/gen": 51.0}
        rows.append({"step": s, **data} if flat
                    else {"step": s, "elapsed_seconds": 100.0 * s, "data": data})
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return rows


def _import(tmp_path, **kw) -> Path:
    src = tmp_path / "verl_metrics.jsonl"
    write_verl_log(src)
    args = dict(task="math_1460", algorithm="grpo", precision="bf16", seed=0,
                model="DeepSeek-R1-Distill-Qwen-1.5B", steps=12, **PROVENANCE)
    args.update(kw)
    return verl_import.import_run(src, tmp_path / "imported", **args)


def reason(run_dir: Path) -> str:
    with pytest.raises(leaderboard.Rejected) as e:
        leaderboard.validate_run(run_dir)
    return str(e.value)


def test_import_copies_verl_numbers_and_enters_the_leaderboard(tmp_path):
    d = _import(tmp_path)
    rows = read_jsonl(d / "metrics.jsonl")
    src = {r["step"]: r["data"] for r in read_jsonl(tmp_path / "verl_metrics.jsonl")}
    # the validation-only step 0 is not a training step
    assert [r["step"] for r in rows] == list(range(1, 13))
    assert (rows[0]["mismatch/kl_k3"] == src[1]["rollout_corr/k3_kl"]
            and rows[4]["reward/mean"] == src[5]["critic/score/mean"])
    # not logged by verl: absent
    assert "mismatch/kl_k2" not in rows[0] and "reward/pass_rates" not in rows[0]
    assert [t["time/step_s"] for t in read_jsonl(d / "timing.jsonl")][:2] == [96.0, 97.0]
    env = json.loads((d / "env.json").read_text())
    assert env["bundle"]["copied"]["mismatch/prob_diff/mean"] == "training/rollout_probs_diff_mean"
    assert env["bundle"]["recomputed"] == [] and env["bundle"]["evidence"] is None
    assert ((d / "source" / "metrics.jsonl").read_bytes()
            == (tmp_path / "verl_metrics.jsonl").read_bytes())
    summary = json.loads((d / "summary.json").read_text())
    assert (summary["verdict"] == "pass"
            and summary["mismatch/step0/kl_k3"] == src[1]["rollout_corr/k3_kl"])
    # accuracy 0.55 + 0.06 s: the 5-step mean first exceeds 0.95 over steps 6-10 (0.91, 0.97, 1, 1,
    # 1)
    assert summary["accuracy/first_pass_step"] == 10 and summary["accuracy/final"] == 1.0
    rec = leaderboard.validate_run(d)
    assert rec["framework"] == "verl 0.6.0" and rec["model"] == "DeepSeek-R1-Distill-Qwen-1.5B"
    assert rec["hardware"].startswith("declared-nvidia-h100-80gb-hbm3: 8x NVIDIA H100")
    assert "15 copied from the framework's log (not recomputable)" in rec["provenance"]["backing"]
    assert ("declared, not observed: git_sha, packages, hardware, precision"
            in rec["provenance"]["backing"])


def test_flat_rows_import_the_same(tmp_path):
    write_verl_log(tmp_path / "flat.jsonl", flat=True)
    d = verl_import.import_run(tmp_path / "flat.jsonl", tmp_path / "flat", task="math_1460",
                               algorithm="grpo", precision="bf16", seed=1, **PROVENANCE)
    # default: the last logged step
    assert json.loads((d / "config.json").read_text())["config"]["steps"] == 12
    leaderboard.validate_run(d)


def test_a_tampered_import_is_rejected(tmp_path):
    # The k3 KL of step 3 divided by 10 in metrics.jsonl, with the summary rewritten to agree with
    # it: only the verl log kept in source/ can tell.
    d = _import(tmp_path)
    rows = read_jsonl(d / "metrics.jsonl")
    rows[2]["mismatch/kl_k3"] /= 10
    (d / "metrics.jsonl").write_text("".join(json.dumps(r, sort_keys=True) + "\n" for r in rows))
    write_summary(d, json.loads((d / "config.json").read_text())["config"])
    assert ("mismatch/kl_k3=" in reason(d)
            and "at step 3 but the source log's rollout_corr/k3_kl is" in reason(d))


def test_a_copied_number_claimed_as_recomputed_is_rejected(tmp_path):
    d = _import(tmp_path)
    env = json.loads((d / "env.json").read_text())
    env["bundle"]["recomputed"] = ["mismatch/kl_k3"]
    del env["bundle"]["copied"]["mismatch/kl_k3"]
    atomic_write_json(d / "env.json", env)
    assert ("env.json claims mismatch/kl_k3 and 0 more keys are recomputed from per-token "
            "log-probs, but logprobs/step_000001.safetensors (step 1) is missing") in reason(d)


def test_an_edited_source_log_is_rejected(tmp_path):
    d = _import(tmp_path)
    source = d / "source" / "metrics.jsonl"
    source.write_text(source.read_text().replace("0.41", "0.42"))
    assert "differs from the one imported (sha256 mismatch)" in reason(d)


def test_provenance_must_be_declared(tmp_path):
    with pytest.raises(ValueError, match="commit id of the code that ran"):
        _import(tmp_path, git_sha="main")
    with pytest.raises(ValueError, match="torch's version"):
        _import(tmp_path, packages={"vllm": "0.10.2"})
    with pytest.raises(ValueError, match="say how the run was started"):
        _import(tmp_path, command=None)
    (tmp_path / "not_verl.jsonl").write_text('{"step": 1, "data": {"loss": 0.3}}\n')
    with pytest.raises(ValueError, match="no row with critic/score/mean"):
        verl_import.import_run(tmp_path / "not_verl.jsonl", tmp_path / "x", task="t",
                               algorithm="grpo", precision="bf16", seed=0, **PROVENANCE)


def test_cli(tmp_path, capsys):
    write_verl_log(tmp_path / "m.jsonl")
    argv = ["import", "verl", str(tmp_path / "m.jsonl"), "--out", str(tmp_path / "out"), "--task",
            "math_1460", "--algorithm", "grpo", "--precision", "bf16", "--seed", "0",
            "--verl-version", "0.6.0", "--git-sha", PROVENANCE["git_sha"], "--torch", "2.8.0",
            "--gpu", "NVIDIA H100 80GB HBM3", "--gpus", "8", "--package", "vllm=0.10.2",
            "--command", "python3 -m verl.trainer.main_ppo"]
    assert cli.main(argv) == 0
    assert "12 steps imported, verdict pass" in capsys.readouterr().out
    leaderboard.validate_run(tmp_path / "out" / "math_1460__grpo__bf16__s0")
    bad = [("bf17" if a == "bf16" else a) for a in argv]
    # bad input: one line, exit code 2
    assert cli.main([*bad[:3], "--out", str(tmp_path / "bad"), *bad[5:]]) == 2
    assert "precision: unknown value 'bf17'" in capsys.readouterr().err
    assert cli.main(["import", "openrlhf", "x"]) == 2
    assert bundle.framework_of(None) == {"name": "suite", "version": None}
