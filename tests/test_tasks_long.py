"""The long embedded tasks of hypothesis H2 (arith8, arith16, arith32): the same trace format and
reward as arith at 83-323 response tokens, and an embedded policy whose context covers them."""

import pytest

from suite.rl.policy import max_positions
from suite.tasks.registry import get_task, task_names

LONG = {"arith8": 8, "arith16": 16, "arith32": 32}
ALL = {"arith3": 3, "arith": 5, **LONG}


@pytest.mark.parametrize("name", LONG)
def test_long_trace_is_correct_and_rewarded(name):
    task = get_task(name)
    assert name in task_names() and task.digits == LONG[name]
    for item in task.split("train", 20):
        trace = task.trace(item)
        assert task.reward(item, trace, truncated=False) == 1.0
        assert task.reward(item, trace, truncated=True) == 0.0  # the budget is hit: scores 0
        a, b = (int(x) for x in item.prompt[:-1].split("+"))
        assert int(item.answer) == a + b and len(item.answer) == task.digits + 1


def test_carries_ripple_through_every_column():
    # 99...9 + 00...01: a carry through all 32 columns, a 33-digit sum (beyond float precision).
    task = get_task("arith32")
    item = task._item(10**32 - 1, 1)
    trace = task.trace(item)
    assert trace.startswith("9+1+0=10,9+0+1=10,") and trace.endswith("9+0+1=10,#1" + "0" * 32)
    assert task.reward(item, trace, truncated=False) == 1.0


@pytest.mark.parametrize("name", LONG)
def test_one_wrong_digit_scores_zero(name):
    task = get_task(name)
    item = task.split("test", 1)[0]
    good = task.trace(item)
    head, answer = good.rsplit("#", 1)
    for i in (0, len(answer) // 2, len(answer) - 1):  # the leading, a middle and the last digit
        wrong = answer[:i] + str((int(answer[i]) + 1) % 10) + answer[i + 1:]
        assert task.reward(item, head + "#" + wrong, truncated=False) == 0.0
    assert task.reward(item, head + "#" + answer[:-1], truncated=False) == 0.0  # a digit short
    assert task.reward(item, head, truncated=False) == 0.0  # no answer at all


def test_trace_length_grows_ten_tokens_per_digit():
    for name, d in ALL.items():
        task = get_task(name)
        for item in task.split("train", 5):
            # 9 characters per column ("a+b+c=ss,"), '#', the d+1-digit sum; one token per
            # character.
            assert len(task.trace(item)) == 10 * d + 2
            assert len(item.prompt) == 2 * d + 2
    # tokens with EOS
    assert len(get_task("arith32").trace(get_task("arith32").split("train", 1)[0])) + 1 == 323


@pytest.mark.parametrize("name", LONG)
def test_splits_disjoint_and_deterministic(name):
    a = get_task(name)
    test = {i.id for i in a.split("test")}
    train = {i.id for i in a.split("train", 5000)}
    assert len(test) == 512 and len(train) == 5000 and not test & train
    assert [i.id for i in a.split("train", 30)] == [i.id for i in get_task(name).split("train", 30)]
    assert all(i.prompt[:-1].count("+") == 1 and len(i.prompt) == 2 * LONG[name] + 2
               for i in a.split("test"))


def test_policy_context_covers_prompt_and_response_budget():
    for name in ALL:
        task = get_task(name)
        item = task.split("train", 1)[0]
        budget = len(task.trace(item)) + 8  # sampling.max_new_tokens' default (suite/rl/config.py)
        assert task.context == 1 + len(item.prompt) + budget  # BOS + prompt + response budget
        assert max_positions(task) >= task.context
    # The policies built before the long tasks keep their 128 positions (their builds are
    # unchanged).
    assert [max_positions(get_task(n)) for n in ("arith3", "arith", "arith8")] == [128, 128, 128]
    assert max_positions(get_task("arith16")) == 256 and max_positions(get_task("arith32")) == 512


def test_long_policy_config_and_tokenizer_cover_the_context():
    # The saved config and tokenizer state the context (vLLM's max_model_len and lm-eval read them);
    # the model is built, not trained.
    from suite.rl.policy import PolicySpec, build_model, build_tokenizer

    task = get_task("arith32")
    tok = build_tokenizer(task.alphabet, max_len=max(256, max_positions(task)))
    model = build_model(PolicySpec(hidden=16, layers=1, heads=2, kv_heads=1, mlp=32), len(tok),
                        max_positions(task))
    item = task.split("test", 1)[0]
    ids = tok(item.prompt + task.trace(item))["input_ids"]
    assert len(ids) == 1 + len(item.prompt) + len(task.trace(item))  # BOS + one token per character
    assert len(ids) + 9 <= model.config.max_position_embeddings <= tok.model_max_length
    assert tok.decode(ids, skip_special_tokens=True) == item.prompt + task.trace(item)
