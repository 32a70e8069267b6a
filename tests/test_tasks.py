"""The embedded task: deterministic splits, long traces, and a reward that checks the answer."""

from suite.tasks.registry import get_task


def test_splits_are_deterministic_and_disjoint():
    a, b = get_task("arith"), get_task("arith")
    assert [i.id for i in a.split("train", 50)] == [i.id for i in b.split("train", 50)]
    train = {i.id for i in a.split("train", 5000)}
    test = {i.id for i in a.split("test")}
    assert len(test) == 512 and not train & test


def test_trace_is_long_and_correct():
    task = get_task("arith")
    items = task.split("train", 200)
    lengths = [len(task.trace(it)) + 1 for it in items]  # one token per character, plus EOS
    assert sum(lengths) / len(lengths) >= 40
    item = task._item(95, 7)  # 00095 + 00007: carries ripple through two columns
    assert task.trace(item) == "5+7+0=12,9+0+1=10,0+0+1=01,0+0+0=00,0+0+0=00,#000102"


def test_reward():
    task = get_task("arith")
    item = task._item(12345, 54321)
    good = task.trace(item)
    assert task.reward(item, good, truncated=False) == 1.0
    assert task.reward(item, good, truncated=True) == 0.0  # truncated responses score 0
    assert task.reward(item, good[:-1] + "8", truncated=False) == 0.0
    assert task.reward(item, "#66666", truncated=False) == 1.0  # only the final answer is checked
    assert task.reward(item, "5+1+0=06,", truncated=False) == 0.0
    assert task.reward(item, "#12#x", truncated=False) == 0.0
