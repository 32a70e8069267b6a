"""A recipe's knobs: algorithm overrides, KL and entropy terms, the learning-rate schedule, recipe
files."""

from __future__ import annotations

import json
import math

import pytest
import torch
import yaml
from test_run import _kill_at

from suite import cli
from suite.results import read_jsonl
from suite.rl import config, recipe
from suite.rl.algos import (
    ALGORITHMS,
    get_algorithm,
    kl_penalty,
    policy_loss,
    regularised_loss,
)
from suite.rl.train import run


def test_default_knobs_are_each_algorithms_own_row():
    for name in ALGORITHMS:
        assert recipe.algorithm(config.load(["tier=smoke",
                                             f"algorithm={name}"])) == get_algorithm(name)


def test_clip_high_knob_moves_the_clip_exactly_as_ppo_clip_says():
    # One token, A = 1, ratio pi/pi_old = 1.4: the loss is -min(r A, clip(r, 1 - lo, 1 + hi) A) =
    # -(1 + hi).
    logp, old, mask = torch.tensor([[math.log(1.4)]]), torch.zeros(1, 1), torch.ones(1, 1)
    for hi, want in ((None, -1.28), (0.5, -1.4), (0.1, -1.1)):
        cfg = config.load(["tier=smoke", "algorithm=grpo", "algo.agg=token-mean"]
                          + ([f"algo.clip_high={hi}"] if hi is not None else []))
        loss, m = policy_loss(recipe.algorithm(cfg), logp, old, None, torch.ones(1), mask,
                              norm_len=1)
        assert float(loss) == pytest.approx(want, rel=1e-6)
        assert m["ppo/clip_frac"] == (1.0 if want > -1.4 else 0.0)


def test_is_cap_and_advantage_knobs_reach_the_algorithm():
    cfg = config.load(["tier=smoke", "algorithm=grpo_token_tis", "algo.C=1.5",
                       "algo.advantage=std"])
    algo = recipe.algorithm(cfg)
    assert (algo.C, algo.advantage, algo.correction) == (1.5, "std", "token_tis")


def test_kl_estimators_against_a_hand_computation():
    logp, ref = torch.tensor([[-1.0, -0.5, -2.0]]), torch.tensor([[-1.2, -0.5, -1.0]])
    log_r = ref - logp  # -0.2, 0, 1
    assert torch.allclose(kl_penalty(logp, ref, "k1"), torch.tensor([[0.2, 0.0, -1.0]]))
    assert torch.allclose(kl_penalty(logp, ref, "k2"), torch.tensor([[0.02, 0.0, 0.5]]))
    k3 = [math.exp(x) - 1 - x for x in (-0.2, 0.0, 1.0)]
    assert torch.allclose(kl_penalty(logp, ref, "k3"), torch.tensor([k3]))
    assert torch.equal(kl_penalty(logp, logp, "k3"), torch.zeros(1, 3))
    assert log_r.shape == (1, 3)


def test_regularised_loss_adds_the_aggregated_terms_and_zero_coefficients_change_nothing():
    logp, ref = torch.tensor([[-1.0, -0.5, -2.0]]), torch.tensor([[-1.2, -0.5, -1.0]])
    # last token is padding
    entropy, mask = torch.tensor([[0.3, 0.6, 0.9]]), torch.tensor([[1.0, 1.0, 0.0]])
    base = torch.tensor(0.25)
    same, extra = regularised_loss(base, logp, entropy, None, mask, "token-mean", 3, 0.0, "k3", 0.0)
    assert same is base and extra == {}
    loss, extra = regularised_loss(base, logp, entropy, ref, mask, "token-mean", 3, 0.1, "k3", 0.01)
    kl = (math.exp(-0.2) - 1 + 0.2 + 0.0) / 2  # mean over the two response tokens
    ent = (0.3 + 0.6) / 2
    assert float(loss) == pytest.approx(0.25 + 0.1 * kl - 0.01 * ent, rel=1e-6)
    assert (extra["loss/kl_ref"] == pytest.approx(kl, rel=1e-6)
            and extra["loss/entropy"] == pytest.approx(ent))


@pytest.mark.parametrize("schedule, want", [
    # 8 updates, 3 of warm-up: 1/4, 2/4, 3/4, then the schedule over updates 3..7 (progress (u - 3)
    # / 5).
    ("constant", [0.25, 0.5, 0.75, 1, 1, 1, 1, 1]),
    ("linear", [0.25, 0.5, 0.75, 1, 0.8, 0.6, 0.4, 0.2]),
    ("cosine", [0.25, 0.5, 0.75] + [0.5 * (1 + math.cos(math.pi * p / 5)) for p in range(5)]),
])
def test_lr_schedule_against_a_hand_computation(schedule, want):
    got = [recipe.lr_factor(u, 8, 3, schedule) for u in range(8)]
    assert got == pytest.approx(want)
    assert recipe.lr_factor(0, 8, 0, "constant") == 1.0


def test_a_run_with_knobs_logs_them_and_resumes_to_the_same_numbers(tmp_path, monkeypatch):
    knobs = ["algo.kl_coef=0.1", "algo.entropy_coef=0.01", "optim.warmup_steps=3",
             "optim.schedule=cosine", "algo.clip_high=0.3"]

    def cfg(name):
        return config.load(["tier=smoke", f"out={tmp_path}", "ckpt_every=2", f"name={name}",
                            *knobs])

    ref = run(cfg("ref"))
    rows = read_jsonl(ref / "metrics.jsonl")
    lr = cfg("ref").optim.lr
    assert [r["train/lr"]
            for r in rows] == pytest.approx(
                [lr * recipe.lr_factor(2 * s + 1, 8, 3, "cosine") for s in range(4)])
    # the reference is the starting policy
    assert rows[0]["ref/kl_k3"] == 0.0 and rows[-1]["ref/kl_k3"] > 0
    assert all(r["loss/kl_ref"] >= 0 and r["loss/entropy"] > 0 for r in rows)
    saved = json.loads((ref / "config.json").read_text())["config"]
    assert saved["algo"]["kl_coef"] == 0.1 and saved["optim"]["schedule"] == "cosine"

    with monkeypatch.context() as m:
        _kill_at(m, 6)  # step 3, second update: after the step-2 checkpoint
        with pytest.raises(KeyboardInterrupt):
            run(cfg("kill"))
    d = run(cfg("kill"))
    assert (d / "metrics.jsonl").read_bytes() == (ref / "metrics.jsonl").read_bytes()


@pytest.mark.parametrize("override, words", [
    ("algo.agg=bogus", "algo.agg"), ("algo.C=0", "algo.C"),
    ("algo.kl_estimator=k4", "algo.kl_estimator"), ("algo.kl_coef=-1", "algo.kl_coef"),
    ("optim.schedule=step", "optim.schedule"), ("optim.warmup_steps=9", "optim.warmup_steps"),
])
def test_bad_knobs_are_refused_naming_the_field(override, words):
    with pytest.raises(ValueError, match=words.replace(".", r"\.")):
        config.load(["tier=smoke", override])


def test_recipe_file_is_applied_first_and_the_command_line_wins(tmp_path, capsys):
    path = tmp_path / "dapo.yaml"
    path.write_text("algorithm: grpo\nalgo:\n  agg: token-mean\n  clip_high: 0.28\noptim:\n  lr: "
                    "3.0e-5\n  betas: [0.9, 0.99]\nsampling.temperature: 0.9\n")
    cfg = config.load(["tier=smoke", f"recipe={path}", "optim.lr=1e-5"])
    assert (cfg.algo.agg, cfg.algo.clip_high, cfg.optim.lr, tuple(cfg.optim.betas),
            cfg.sampling.temperature) == \
        ("token-mean", 0.28, 1e-5, (0.9, 0.99), 0.9)
    assert cli.main(["run", "--cfg", "job", "tier=smoke", f"recipe={path}"]) == 0
    out = capsys.readouterr().out
    assert yaml.safe_load(out)["optim"]["lr"] == 3e-5 and f"  lr: 3.0e-05  # recipe {path}\n" in out


def test_bad_recipe_files_are_refused_with_one_line(tmp_path, capsys):
    bad = tmp_path / "bad.yaml"
    bad.write_text("algo:\n  clip_hihg: 0.3\n")
    assert cli.main(["run", "tier=smoke", f"recipe={bad}"]) == 2
    assert "clip_hihg" in capsys.readouterr().err
    assert cli.main(["run", "tier=smoke", f"recipe={tmp_path / 'missing.yaml'}"]) == 2
    assert "recipe: cannot read" in capsys.readouterr().err
    bad.write_text("- a list\n")
    assert cli.main(["run", "tier=smoke", f"recipe={bad}"]) == 2
    assert "must hold a mapping" in capsys.readouterr().err


def test_the_shipped_dapo_recipe_is_dapos_loss_and_is_found_by_name_from_any_directory(
    tmp_path, monkeypatch):
    """recipes/dapo_loss.yaml: DAPO's advantage (divided by the group std), token-level loss and
    clip-higher
    0.2/0.28 (arXiv 2503.14476 Sec. 3.1, 3.3), no KL; `recipe=dapo_loss` finds it wherever the
    command runs."""
    from suite.rl import recipe

    monkeypatch.chdir(tmp_path)  # no recipes/ folder here: the suite's own is found by name
    assert "dapo_loss" in recipe.shipped_recipes()
    for value in ("dapo_loss", "recipes/dapo_loss.yaml"):
        algo = recipe.algorithm(config.load(["tier=smoke", f"recipe={value}"]))
        assert (algo.advantage, algo.agg, algo.clip_low, algo.clip_high, algo.correction) == \
            ("std", "token-mean", 0.2, 0.28, "none")
    with pytest.raises(ValueError, match="Did you mean 'dapo_loss'"):
        config.load(["tier=smoke", "recipe=dapo_los"])
