"""The H3 task ``category`` (suite/tasks/category.py): rewards, diverse traces, disjoint splits, its
word-level tokenizer and warm start, and the guarantee that the arith tasks build exactly what they
built before the hook."""

from __future__ import annotations

import random

from suite.rl.policy import (
    SPECIALS,
    PolicySpec,
    build_tokenizer,
    build_word_tokenizer,
    ensure_policy,
    load_policy,
    policy_key,
)
from suite.rl.schema import TIERS
from suite.tasks import registry
from suite.tasks.registry import get_task


def _task():
    return get_task("category")


def test_reward_checks_count_category_and_eos():
    task = _task()
    item = task.split("train", 1)[0]
    labels = task._labels(item)
    good = task.trace(item)
    assert len(good.split()) == task.labels == len(labels)
    assert task.reward(item, good, truncated=False) == 1.0
    assert task.reward(item, good, truncated=True) == 0.0  # truncated responses score 0
    # a word of the wrong category, first position
    other = next(c for c in range(task.classes) if c != labels[0])
    wrong = " ".join([str(task.members[other][0])] + good.split()[1:])
    assert task.reward(item, wrong, truncated=False) == 0.0
    assert task.reward(item, " ".join(good.split()[:-1]), truncated=False) == 0.0  # one word short
    # one word too many
    assert task.reward(item, good + " " + good.split()[0], truncated=False) == 0.0
    assert task.reward(item, " ".join(reversed(good.split())),
                       truncated=False) == float(labels == labels[::-1])
    assert task.reward(item, "", truncated=False) == 0.0
    # whitespace is not a token
    assert task.reward(item, good.replace(" ", "  "), truncated=False) == 1.0


def test_sampled_traces_are_diverse_and_valid():
    task = _task()
    item = task.split("train", 1)[0]
    rng = random.Random(0)
    draws = [task.sample_trace(item, rng) for _ in range(300)]
    assert all(task.reward(item, d, truncated=False) == 1.0 for d in draws)
    assert len(set(draws)) > 250  # 16**4 valid answers: nearly every draw is new
    firsts = {d.split()[0] for d in draws}
    # the whole category is covered
    assert firsts == {str(w) for w in task.members[task._labels(item)[0]]}
    assert task.trace(item) == task.trace(item)  # the reference trace stays deterministic


def test_splits_are_deterministic_and_disjoint():
    a = _task()
    train = [i.prompt for i in a.split("train", 5000)]
    test = [i.prompt for i in a.split("test")]
    assert len(test) == 512 and not set(train) & set(test) and len(set(train)) == len(train)
    # a second object, built anew: not the cached one
    fresh = registry._load.__wrapped__("category", None, None)
    assert fresh is not a and train[:50] == [i.prompt for i in fresh.split("train", 50)]


def test_word_tokenizer_round_trips_a_response():
    task = _task()
    tok = build_word_tokenizer(task.vocab)
    assert len(tok) == len(SPECIALS) + len(task.vocab) > 2000
    # build_tokenizer's conventions
    assert (tok.pad_token_id, tok.bos_token_id, tok.eos_token_id) == (0, 1, 2)
    item = task.split("test", 1)[0]
    prompt = tok(item.prompt)["input_ids"]
    assert prompt[0] == 1 and len(prompt) == 1 + task.labels + 1  # BOS, one token per label, '='
    response = task.trace(item)
    ids = tok(response, add_special_tokens=False)["input_ids"]
    assert len(ids) == task.labels and 0 not in ids  # one token per word, none unknown
    assert tok.batch_decode([ids + [2, 0, 0]], skip_special_tokens=True) == [response]


def test_warm_start_uses_the_word_tokenizer_and_sampled_traces(monkeypatch, tmp_path):
    monkeypatch.setenv("SUITE_CACHE", str(tmp_path))  # built here, not found in a cache
    task = _task()
    seen = []
    real = type(task).sample_trace
    monkeypatch.setattr(type(task), "sample_trace", lambda self, it, rng: seen.append(it)
                        or real(self, it, rng))
    spec = PolicySpec(hidden=32, layers=1, heads=2, kv_heads=1, mlp=64, sft_batch=8,
                      # stops at the first probe
                      probe_prompts=8, eval_every=2, target_acc=0.0, build_threads=1)
    model, tok = load_policy(ensure_policy(spec, task))
    assert len(seen) == 2 * 8  # every supervised example drew its own answer
    assert model.config.vocab_size == len(tok) == len(SPECIALS) + len(task.vocab)
    item = task.split("test", 1)[0]
    ids = tok(task.trace(item), add_special_tokens=False)["input_ids"]
    assert tok.decode(ids) == task.trace(item)


def test_arith_policies_and_tokenizer_unchanged():
    # The keys of the cached arith builds from before the word-tokenizer hook (a changed key would
    # rebuild, and a changed tokenizer would change every committed reference).
    assert policy_key(PolicySpec(**TIERS["small"]["policy"]), get_task("arith3")) == "ca124315afb8"
    assert policy_key(PolicySpec(**TIERS["smoke"]["policy"]), get_task("arith")) == "0532730785f6"
    task = get_task("arith")
    assert not hasattr(task, "vocab") and not hasattr(task, "sample_trace")
    tok = build_tokenizer(task.alphabet)
    assert tok.get_vocab() == {t: i for i, t in enumerate(SPECIALS + list("0123456789+=,#"))}
    assert tok.decode(tok("12+3=")["input_ids"], skip_special_tokens=True) == "12+3="


def test_tail_regime_resolves_to_the_category_task():
    from suite.rl import config

    cfg = config.load(["regime=tail"])
    assert (cfg.task, cfg.optim.lr, cfg.steps,
            cfg.sampling.max_new_tokens) == ("category", 3e-4, 400, 12)
