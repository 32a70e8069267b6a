"""What real models need: gradient checkpointing, chunked log-probs, checkpoint retention. Each
option must leave the numbers as they are; only memory and time may change (`suite bench memory`
measures them)."""

from __future__ import annotations

import pytest
import torch
from test_run import _kill_at

from suite.numerics.precision import resolve
from suite.numerics.scoring import Batch
from suite.numerics.trainer import Trainer, TrainerOptions
from suite.results import read_jsonl
from suite.rl import config
from suite.rl.train import run


def _logp_and_grads(tiny_model, precision, **options):
    model, tok, task = tiny_model
    import copy

    cfg = config.load(["tier=smoke", f"precision={precision}"])
    trainer = Trainer(copy.deepcopy(model), resolve(precision), "native", cfg.optim,
                      TrainerOptions(**options))
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(3, len(tok), (3, 20), generator=g)
    attn = torch.ones_like(ids)
    attn[0, :4] = 0  # a left-padded row
    logp, ent, _ = trainer.score(Batch(ids, attn, ids[:, -12:], 1.0))
    (logp.sum() + 0.1 * ent.sum()).backward()
    return logp.detach(), ent.detach(), [p.grad.clone() for p in trainer.params]


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
@pytest.mark.parametrize("options", [{"gradient_checkpointing": True}, {"logprob_chunk": 5},
                                     {"gradient_checkpointing": True, "logprob_chunk": 1}])
def test_options_give_the_same_logprobs_entropy_and_gradients(tiny_model, precision, options):
    base = _logp_and_grads(tiny_model, precision)
    other = _logp_and_grads(tiny_model, precision, **options)
    assert torch.equal(base[0], other[0]) and torch.equal(base[1], other[1])
    for a, b in zip(base[2], other[2]):
        assert torch.equal(a, b)


def test_a_run_with_the_options_writes_the_same_metrics(tmp_path):
    plain = run(config.load(["tier=smoke", f"out={tmp_path}", "name=plain", "precision=bf16"]))
    both = run(config.load(["tier=smoke", f"out={tmp_path}", "name=opts", "precision=bf16",
                            "gradient_checkpointing=true", "logprob_chunk=8"]))
    assert (plain / "metrics.jsonl").read_bytes() == (both / "metrics.jsonl").read_bytes()


def test_keep_last_keeps_the_newest_checkpoints_and_resume_still_matches(tmp_path, monkeypatch):
    def cfg(name):
        return config.load(["tier=smoke", f"out={tmp_path}", f"name={name}", "ckpt_every=1",
                            "keep_last=2"])

    ref = run(cfg("ref"))
    assert sorted(p.name
                  for p in (ref / "ckpt").iterdir()) == [
                      "latest.json", "step_000003", "step_000004"]
    with monkeypatch.context() as m:
        # step 3, second update: checkpoints of steps 1 and 2 exist, only 2 of them kept
        _kill_at(m, 6)
        with pytest.raises(KeyboardInterrupt):
            run(cfg("kill"))
    d = tmp_path / "kill" / ref.name
    assert sorted(p.name
                  for p in (d / "ckpt").iterdir()) == ["latest.json", "step_000001", "step_000002"]
    run(cfg("kill"))
    assert [r["step"] for r in read_jsonl(d / "metrics.jsonl")] == [1, 2, 3, 4]
    assert (d / "metrics.jsonl").read_bytes() == (ref / "metrics.jsonl").read_bytes()


@pytest.mark.parametrize("override, words", [
    ("keep_last=0", "keep_last"), ("logprob_chunk=-1", "logprob_chunk"),
    ("precision=exact gradient_checkpointing=true", "gradient_checkpointing"),
    ("precision=fp8 trim_padding=true", "trim_padding: precision fp8 trains through the sampler's "
                                        "own engine code"),
])
def test_bad_options_are_refused(override, words):
    with pytest.raises(ValueError, match=words):
        config.load(["tier=smoke", *override.split()])


class _Boxed:
    """A math task's reward on items that are (ground truth) strings: no dataset needed."""

    def reward(self, item, response, truncated):
        from suite.tasks import math_reward

        return math_reward.boxed_reward(response, item, truncated)


def test_a_pool_of_reward_workers_grades_like_one_worker(monkeypatch):
    from suite.tasks import math_reward

    used, real = set(), math_reward.SymbolicVerifier.check
    monkeypatch.setattr(math_reward.SymbolicVerifier, "check",
                        lambda self, *a: used.add(id(self)) or real(self, *a))
    from suite.tasks.registry import grade

    pairs = [("\\frac{1}{2}", "\\boxed{0.5}"), ("2\\sqrt{2}", "\\boxed{\\sqrt{8}}"),
             ("3", "\\boxed{4}"), ("x^2+2x+1", "\\boxed{(x+1)^2}"),
             ("10", "the answer is \\boxed{10}"), ("\\pi", "\\boxed{3.14}"),
             ("\\frac{3}{4}", "\\boxed{\\dfrac{3}{4}}"), ("7", "no box")] * 3
    items, responses = [g for g, _ in pairs], [r for _, r in pairs]
    truncated = [False] * (len(pairs) - 1) + [True]
    before = math_reward.counters()
    serial = grade(_Boxed(), items, responses, truncated, workers=1)
    middle = math_reward.counters()
    assert len(used) == 1
    try:
        pooled = grade(_Boxed(), items, responses, truncated, workers=3)
    finally:
        math_reward.set_workers(1)  # the other tests expect the one worker they warm up
    after = math_reward.counters()
    assert pooled == serial and sum(serial) >= 9  # the equivalent answers were found both ways
    assert {k: after[k] - middle[k] for k in after} == {k: middle[k] - before[k] for k in after}
    assert middle["symbolic"] > before["symbolic"]  # some answers needed math-verify
    assert len(used) > 1  # and the pool's workers shared them
