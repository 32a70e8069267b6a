"""The bundle of outside loops (suite/analysis/bundle.py): what the writer logs, checked by hand on
tiny tensors, and what the leaderboard's check rejects: a number the evidence does not give, swapped
evidence, a precision label the observed dtypes contradict, a key nothing backs, and a suite run
that claims an outside framework to skip its own checks."""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load, save

from suite.analysis import bundle, leaderboard, report
from suite.results import atomic_write_json, read_jsonl, write_summary

FIXTURE = Path(__file__).resolve().parent / "fixtures" / "results-2seeds" / "arith__grpo__fp16__s0"
OBSERVED_BF16 = {"sampler": {"compute_dtype": "torch.bfloat16"},
                 "trainer": {"compute_dtype": "torch.bfloat16"}}


def test_step_metrics_by_hand():
    # Two responses, lengths 2 and 1; the padded position holds garbage that must not count.
    trainer = torch.tensor([[-0.1, -0.2, 7.0], [-0.5, 3.0, 3.0]])
    sampler = torch.tensor([[-0.1, -0.4, -9.0], [-0.25, 1.0, 1.0]])
    mask = torch.tensor([[1, 1, 0], [1, 0, 0]])
    m = bundle.step_metrics(trainer, sampler, mask)
    assert m["logprob/trainer/mean"] == pytest.approx((-0.1 - 0.2 - 0.5) / 3)
    assert m["logprob/sampler/mean"] == pytest.approx((-0.1 - 0.4 - 0.25) / 3)
    assert m["response/length/mean"] == 1.5 and m["response/length/max"] == 2.0
    # log pi - log mu on the three tokens: 0, 0.2, -0.25; k1 = mean(log mu - log pi)
    assert m["mismatch/kl_k1"] == pytest.approx(-(0.0 + 0.2 - 0.25) / 3)
    assert m["mismatch/kl_k3"] == pytest.approx(
        sum(math.exp(x) - x - 1 for x in (0.0, 0.2, -0.25)) / 3)
    # no entropy given, no anatomy
    assert "anatomy/pos_q1/mean" not in m and "entropy/mean" not in m
    ent = torch.tensor([[0.3, 0.6, 9.0], [0.9, 9.0, 9.0]])
    m = bundle.step_metrics(trainer, sampler, mask, ent)
    assert m["entropy/mean"] == pytest.approx(0.6) and "anatomy/corr_entropy" in m


def test_reward_metrics_by_hand():
    r = bundle.reward_metrics(torch.tensor([1.0, 0.0, 1.0, 1.0, 0.0, 0.0]), group_size=2)
    assert r == {"reward/mean": 0.5, "reward/pass_rates": [0.5, 1.0, 0.0],
                 "reward/all_solved_frac": pytest.approx(1 / 3),
                 "reward/none_solved_frac": pytest.approx(1 / 3)}
    with pytest.raises(ValueError, match="group_size"):
        bundle.reward_metrics(torch.ones(6), group_size=4)


def _step(model, gen: torch.Generator):
    """One step of real log-probs: 4 random responses of up to 6 tokens scored by the tiny Llama in
    fp32 (the trainer) and under bf16 autocast (the sampler): a bf16-sized mismatch."""
    ids = torch.randint(3, model.config.vocab_size, (4, 9), generator=gen)
    mask = torch.ones(4, 6, dtype=torch.long)
    mask[1, 4:] = 0
    mask[3, 2:] = 0

    def logp(autocast: bool):
        with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
            # predicts ids[:, 3:], the 6 response tokens
            logits = model(ids).logits[:, 2:-1].float()
        full = torch.log_softmax(logits, -1)
        return full.gather(-1, ids[:, 3:, None])[..., 0], -(full.exp() * full).sum(-1)

    (trainer, entropy), (sampler, _) = logp(False), logp(True)
    return trainer, sampler, mask, entropy


def write_run(out: Path, model, steps: int = 3, **kw) -> Path:
    gen = torch.Generator().manual_seed(0)
    args = dict(task="arith", algorithm="grpo", precision="bf16", seed=0, steps=steps,
                framework=("mylib", "0.1"), recipe={"lr": 1e-4}, observed=OBSERVED_BF16,
                command="python train.py --bf16", **kw)
    run = bundle.open_run(out, **args)
    for _ in range(steps):
        trainer, sampler, mask, entropy = _step(model, gen)
        run.log_step(trainer, sampler, mask, rewards=torch.tensor([1.0, 0.0, 1.0, 1.0]),
                     group_size=2, entropy=entropy, extra={"train/grad_norm": 0.5})
    run.close()
    return run.run_dir


def reason(run_dir: Path) -> str:
    with pytest.raises(leaderboard.Rejected) as e:
        leaderboard.validate_run(run_dir)
    return str(e.value)


def edit_rows(run_dir: Path, fn) -> None:
    """Edit metrics.jsonl, then rewrite the summary from it: only the evidence can tell."""
    rows = read_jsonl(run_dir / "metrics.jsonl")
    fn(rows)
    (run_dir / "metrics.jsonl").write_text(
        "".join(json.dumps(r, sort_keys=True) + "\n" for r in rows))
    write_summary(run_dir, json.loads((run_dir / "config.json").read_text())["config"])


def edit_env(run_dir: Path, fn) -> None:
    env = json.loads((run_dir / "env.json").read_text())
    fn(env)
    atomic_write_json(run_dir / "env.json", env)


def test_written_bundle_enters_the_leaderboard(tmp_path, tiny_model):
    d = write_run(tmp_path, tiny_model[0])
    assert d.name == "arith__grpo__bf16__s0"
    rows, timing = read_jsonl(d / "metrics.jsonl"), read_jsonl(d / "timing.jsonl")
    assert [r["step"] for r in rows] == [1, 2, 3] and [t["step"] for t in timing] == [1, 2, 3]
    assert all(t["time/step_s"] >= 0 for t in timing)
    assert rows[0]["reward/pass_rates"] == [0.5, 1.0] and rows[0]["train/grad_norm"] == 0.5
    assert 1e-9 < rows[0]["mismatch/kl_k3"] < 1e-2  # bf16 vs fp32 on a random policy: real, small
    env = json.loads((d / "env.json").read_text())
    assert env["framework"] == {"name": "mylib",
                                "version": "0.1"} and env["bundle"]["precision"] == "observed"
    recomputed = env["bundle"]["recomputed"]
    assert "mismatch/kl_k3" in recomputed and "anatomy/top1pct_share" in recomputed
    assert sorted(p.name
                  for p in (d / "logprobs").iterdir()) == [
                      f"step_00000{i}.safetensors" for i in (1, 2, 3)]
    rec = leaderboard.validate_run(d)
    assert (rec["framework"] == "mylib 0.1"
            and rec["provenance"]["command"] == "python train.py --bf16")
    assert (rec["provenance"]["command_checked"] is False
            and "recomputed from log-prob evidence" in rec["provenance"]["backing"])
    assert rec["summary"]["mismatch/step0/kl_k3"] == rows[0]["mismatch/kl_k3"]


def test_a_number_the_evidence_does_not_give_is_rejected(tmp_path, tiny_model):
    d = write_run(tmp_path, tiny_model[0])
    edit_rows(d, lambda rows: rows[1].update({"mismatch/kl_k3": rows[1]["mismatch/kl_k3"] / 10}))
    assert ("mismatch/kl_k3" in reason(d)
            and "at step 2 but its log-prob evidence gives" in reason(d))


def test_swapped_evidence_is_rejected(tmp_path, tiny_model):
    # The sampler's log-probs stored where the trainer's belong: k1 changes sign, k3 changes value.
    d = write_run(tmp_path, tiny_model[0])
    path = d / "logprobs" / "step_000001.safetensors"
    ev = load(path.read_bytes())
    ev["trainer_logp"], ev["sampler_logp"] = ev["sampler_logp"], ev["trainer_logp"]
    path.write_bytes(save(ev))
    assert "at step 1 but its log-prob evidence gives" in reason(d)


def test_missing_evidence_is_rejected(tmp_path, tiny_model):
    d = write_run(tmp_path, tiny_model[0])
    (d / "logprobs" / "step_000003.safetensors").unlink()
    assert "step_000003.safetensors (step 3) is missing" in reason(d)


def test_an_unbacked_mismatch_key_is_rejected(tmp_path, tiny_model):
    d = write_run(tmp_path, tiny_model[0])
    edit_rows(d, lambda rows: [r.update({"mismatch/my_kl": 0.001}) for r in rows])
    assert "mismatch/my_kl is neither recomputed" in reason(d)


def test_precision_label_must_match_what_was_observed(tmp_path, tiny_model):
    d = write_run(tmp_path, tiny_model[0])
    edit_env(d, lambda e: e["observed"]["sampler"].update(compute_dtype="torch.float32"))
    assert reason(d) == ("precision bf16 means a torch.bfloat16 sampler, but env.json observed the "
                         "sampler computing in torch.float32")


def test_framework_version_must_be_the_installed_one(tmp_path, tiny_model):
    d = write_run(tmp_path, tiny_model[0])
    edit_env(d, lambda e: e["packages"].update(mylib="0.2"))
    assert "framework mylib 0.1 but the installed package was 0.2" in reason(d)


def test_a_suite_run_cannot_skip_its_checks_by_claiming_a_framework(tmp_path):
    # The committed suite run relabelled as an outside loop: it has no evidence, so its mismatch is
    # unbacked.
    d = tmp_path / FIXTURE.name
    shutil.copytree(FIXTURE, d, ignore=shutil.ignore_patterns("ckpt", "log.txt"))
    edit_env(d, lambda e: e.update(framework={"name": "trl", "version": "1.16.0"}))
    assert "bundle schema None unknown" in reason(d)
    edit_env(d,
             lambda e: e.update(bundle={"schema": 1, "command": "x", "recomputed": [],
                                        "copied": {}}))
    assert "config.json: framework None but env.json says" in reason(d)


def test_writer_refusals(tmp_path, tiny_model):
    write_run(tmp_path, tiny_model[0], steps=1)
    with pytest.raises(ValueError, match="already holds a bundle"):
        write_run(tmp_path, tiny_model[0], steps=1)
    with pytest.raises(ValueError, match="must name the outside loop"):
        bundle.open_run(tmp_path / "x", task="arith", algorithm="grpo", precision="bf16", seed=0,
                        steps=1, framework=("suite", "1"))
    with pytest.raises(ValueError, match="precision: unknown value 'bf17'"):
        bundle.open_run(tmp_path / "x", task="arith", algorithm="grpo", precision="bf17", seed=0,
                        steps=1, framework=("mylib", "1"))
    run = bundle.open_run(tmp_path / "y", task="arith", algorithm="grpo", precision="fp32", seed=0,
                          steps=1, framework=("mylib", "1"))
    with pytest.raises(ValueError, match="computed by the writer"):
        run.log_step(torch.zeros(2, 3), torch.zeros(2, 3), torch.ones(2, 3), rewards=[1, 0],
                     group_size=2, extra={"mismatch/kl_k3": 0.0})
    with pytest.raises(ValueError, match=r"must be the same \(B, T\)"):
        run.log_step(torch.zeros(2, 3), torch.zeros(2, 4), torch.ones(2, 3), rewards=[1, 0],
                     group_size=2)


def test_report_and_leaderboard_show_the_framework(tmp_path, tiny_model):
    write_run(tmp_path / "mine", tiny_model[0], steps=2)
    shutil.copytree(FIXTURE, tmp_path / "suite" / FIXTURE.name,
                    ignore=shutil.ignore_patterns("ckpt", "log.txt"))
    out = report.write_report(tmp_path)
    md = (out / "report.md").read_text()
    assert "grpo [mylib 0.1]" in md and "outside loop, not rerun by suite run: mylib 0.1" in md
    assert "# mylib 0.1, as recorded (not recomposed):\npython train.py --bf16" in md
    leaderboard.build([tmp_path / "mine", tmp_path / "suite"], tmp_path / "site")
    data = leaderboard.read_site_data(tmp_path / "site")
    assert data["accepted"] == 2 and not data["rejected"]
    frameworks = {e["framework"] for c in data["classes"] for b in c["boards"]
                  for s in ("ranked", "unranked", "controls", "stale") for e in b[s]}
    assert frameworks == {"mylib 0.1", "suite "
                          + json.loads((FIXTURE / "env.json").read_text())["git_sha"][:12]}
