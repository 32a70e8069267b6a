"""algo.ppo_ref: the PPO ratio's denominator, the trainer's recomputed log-probs (default) or the
sampler's (verl's bypass mode). With the sampler's, the clip reads the precision gap as policy
change ("phantom clipping"); ppo/clip_frac_gap measures what the gap alone clips. A default run's
metrics are unchanged."""

from __future__ import annotations

import json
import math

import pytest
import torch

from suite.results import read_jsonl
from suite.rl import config
from suite.rl.algos import gap_clip_fraction
from suite.rl.train import run


def test_gap_clip_fraction_against_a_hand_computation():
    old = torch.log(torch.full((2, 4), 0.5))
    mu = torch.log(torch.tensor([[0.5, 0.3, 0.7, 0.5], [0.3, 0.5, 0.5, 0.9]]))
    mask = torch.tensor([[1, 1, 1, 1], [1, 1, 1, 0]], dtype=torch.float32)
    # ratios pi'/mu: [1, 5/3, 5/7, 1] and [5/3, 1, 1, (5/9, masked)]; eps 0.2. A = +1 clips r > 1.2
    # only (the 5/3 of row 0); A = -1 clips r < 0.8 only (none: 5/3 stays on the unclipped branch).
    # 1 of 7 tokens.
    got = gap_clip_fraction(old, mu, torch.tensor([1.0, -1.0]), mask, 0.2, 0.2)
    assert got == pytest.approx(1 / 7)
    assert gap_clip_fraction(old, old, torch.tensor([1.0, -1.0]), mask, 0.2, 0.2) == 0.0


def _rows(tmp_path, name, *extra):
    d = run(config.load(["tier=smoke", f"out={tmp_path / name}", *extra]))
    return d, read_jsonl(d / "metrics.jsonl")


def test_with_identical_numerics_the_reference_changes_nothing(tmp_path):
    """precision=exact: sampler and trainer log-probs are bitwise equal, so both references give the
    same run."""
    _, rows = _rows(tmp_path, "trainer", "precision=exact", "steps=2")
    b, other = _rows(tmp_path, "sampler", "precision=exact", "steps=2", "algo.ppo_ref=sampler")
    assert all(r["mismatch/kl_k3"] == 0.0 and r["ppo/clip_frac_gap"] == 0.0 for r in other)
    assert [{k: v for k, v in r.items() if k != "ppo/clip_frac_gap"} for r in other] == rows
    assert json.loads((b / "config.json").read_text())["config"]["algo"]["ppo_ref"] == "sampler"


def test_sampler_reference_clips_exactly_what_the_gap_clips_at_the_first_update(tmp_path):
    """bf16, one update per rollout, a tight clip: with the trainer's reference the first update
    starts at ratio 1 and clips nothing; with the sampler's it clips exactly the tokens
    ppo/clip_frac_gap counts."""
    knobs = ["precision=bf16", "steps=3", "updates_per_step=1", "algo.clip_low=0.01",
             "algo.clip_high=0.01"]
    _, trainer = _rows(tmp_path, "trainer", *knobs)
    _, sampler = _rows(tmp_path, "sampler", *knobs, "algo.ppo_ref=sampler")
    assert all(r["ppo/clip_frac"] == 0.0 and "ppo/clip_frac_gap" not in r for r in trainer)
    assert [r["ppo/clip_frac"] for r in sampler] == [r["ppo/clip_frac_gap"] for r in sampler]
    # the gap is real in bf16 (2% of tokens at step 1 on cpu-amx-native)
    assert sampler[0]["ppo/clip_frac_gap"] > 0


@pytest.mark.parametrize("override, words", [
    (["algo.ppo_ref=behaviour"], "algo.ppo_ref: unknown value 'behaviour'"),
    (["algorithm=pg_seq_is", "algo.ppo_ref=sampler"], "algo.ppo_ref: pg_seq_is has no PPO ratio"),
])
def test_bad_reference_is_refused_naming_the_field(override, words):
    with pytest.raises(ValueError, match=words):
        config.load(["tier=smoke", *override])


def test_gspo_takes_the_sampler_reference_and_logs_no_token_gap_fraction(tmp_path):
    _, rows = _rows(tmp_path, "gspo", "algorithm=gspo", "steps=1", "algo.ppo_ref=sampler")
    assert "ppo/clip_frac_gap" not in rows[0] and math.isfinite(rows[0]["ppo/clip_frac"])
