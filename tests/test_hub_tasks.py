"""Dataset tasks read from local copies in their published schemas (nothing is fetched: the
session runs with HF_HUB_OFFLINE=1, see conftest.py), and the errors raised before any compute."""

import json

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import yaml

from suite.tasks.hub_tasks import DataError, HubTask
from suite.tasks.registry import TASK_DIR, get_task

SUFFIX = " Please reason step by step, and put your final answer within \\boxed{}."


def verl_rows(problems, split="train", source="MATH"):
    """Rows in the published VeRL schema of sail/Sanity-Test-R1D-1.5B."""
    return [{"data_source": source,
             "prompt": [{"role": "user", "content": q + SUFFIX}],
             "ability": "math",
             "reward_model": {"ground_truth": a, "style": "rule"},
             "extra_info": {"index": i, "split": split}} for i, (q, a) in enumerate(problems)]


def write_parquet(path, rows):
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.Table.from_pylist(rows), path)
    return path


TRAIN = [("What is 1+1?", "2"), ("Half of 1?", r"\frac{1}{2}"), ("Root of 4?", "2")]


@pytest.fixture
def snapshot(tmp_path):
    """A local snapshot of the hub repo: the same relative layout."""
    write_parquet(tmp_path / "train/math_1460.parquet", verl_rows(TRAIN))
    write_parquet(tmp_path / "test/aime_2024.parquet",
                  verl_rows([("AIME 24 #1?", "204"), ("AIME 24 #2?", "25")], "test", "aime24"))
    write_parquet(tmp_path / "test/aime_2025.parquet",
                  verl_rows([("AIME 25 #1?", "70")], "test", "aime25"))
    return tmp_path


def test_sanity_from_one_parquet_file(tmp_path):
    path = write_parquet(tmp_path / "math_1460.parquet", verl_rows(TRAIN))
    task = get_task("sanity_r1d", data=str(path))
    assert get_task("sanity_r1d", data=str(path)) is task  # cached per (name, data)
    items = task.split("train")
    assert [it.answer for it in items] == ["2", r"\frac{1}{2}", "2"]
    assert items[0].messages == (("user", "What is 1+1?" + SUFFIX),)
    assert items[0].prompt == "What is 1+1?" + SUFFIX
    assert len({it.id for it in items}) == 3
    half = items[1]
    assert task.reward(half, "so it is one half</think>\n\nThe answer is $\\boxed{0.5}$.",
                       truncated=False) == 1.0
    assert task.reward(half, "so it is one half</think>\n\n$\\boxed{0.5}$", truncated=True) == 0.0
    assert task.reward(half, "$\\boxed{0.5}$", truncated=False) == 0.0  # no </think>
    assert task.reward(half, task.trace(half), truncated=False) == 1.0
    with pytest.raises(DataError, match="aime24.*single file"):
        task.split("aime24")
    with pytest.raises(ValueError, match="Did you mean 'aime25'"):
        task.split("aime26")


def test_sanity_from_snapshot_directory(snapshot):
    task = get_task("sanity_r1d", data=str(snapshot))
    assert len(task.split("train")) == 3
    assert [it.answer for it in task.split("aime24")] == ["204", "25"]
    assert [it.answer for it in task.split("aime25")] == ["70"]
    assert [it.answer for it in task.split("test")] == ["204", "25", "70"]  # both AIME years
    assert len({it.id for it in task.split("test")}) == 3
    assert task.split("train", 2) == task.split("train")[:2]
    # The published evaluation and response budget, for the training loop.
    assert task.eval == {"splits": ["aime24", "aime25"], "metric": "mean@n", "n": 32,
                         "temperature": 0.6, "top_p": 0.95}
    assert task.max_new_tokens == 8192 and task.version == 1 and task.source == str(snapshot)


def test_sanity_split_mapping(snapshot):
    data = (f"train={snapshot / 'train/math_1460.parquet'},"
            f"aime25={snapshot / 'test/aime_2025.parquet'}")
    task = get_task("sanity_r1d", data=data)
    assert len(task.split("train")) == 3 and len(task.split("aime25")) == 1
    with pytest.raises(ValueError, match="Did you mean 'aime24'"):
        get_task("sanity_r1d", data=f"aime2024={snapshot / 'test/aime_2024.parquet'}")


def test_missing_column_is_named_with_its_file(tmp_path):
    rows = [{k: v for k, v in r.items() if k != "reward_model"} for r in verl_rows(TRAIN)]
    path = write_parquet(tmp_path / "broken.parquet", rows)
    with pytest.raises(DataError, match=r"broken\.parquet has no column 'reward_model'"):
        get_task("sanity_r1d", data=str(path))


def test_nonexistent_path(tmp_path):
    with pytest.raises(DataError, match="does not exist"):
        get_task("sanity_r1d", data=str(tmp_path / "nope.parquet"))


def test_incomplete_snapshot_directory(tmp_path):
    write_parquet(tmp_path / "train/math_1460.parquet", verl_rows(TRAIN))
    with pytest.raises(DataError, match=r"lacks test/aime_2024\.parquet \(split aime24\)"):
        get_task("sanity_r1d", data=str(tmp_path))


def test_hub_offline_without_local_copy():
    # The real spec, pointed at a repo that no cache can hold, so the test never depends on the
    # machine.
    spec = yaml.safe_load((TASK_DIR / "sanity_r1d.yaml").read_text())
    for split in spec["splits"].values():
        split["repo"] = "suite-tests/no-such-dataset"
    with pytest.raises(DataError) as e:
        HubTask(spec)
    msg = str(e.value)
    assert ("offline" in msg and "data=/path/to/local/copy" in msg
            and "hf download suite-tests/no-such-dataset" in msg)
    assert "\n" not in msg


def test_embedded_tasks_take_no_data(tmp_path):
    with pytest.raises(ValueError, match="takes no data"):
        get_task("arith3", data=str(tmp_path))
    assert get_task("arith3").split("test", 1)[0].messages == ()


# ---------------------------------------------------------------------------- gsm8k and math

GSM = [{"question": "Tom has 3 apples and buys 4. How many?", "answer": "3+4=<<3+4=7>>7\n#### 7"},
       {"question": "What is 1000 + 234?", "answer": "1000+234=<<1000+234=1234>>1234\n#### 1,234"}]


def write_jsonl(path, rows):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_gsm8k_from_local_files(tmp_path):
    train = write_jsonl(tmp_path / "train.jsonl", GSM)
    test = write_jsonl(tmp_path / "test.jsonl", GSM[:1])
    task = get_task("gsm8k", data=f"train={train},test={test}")
    a, b = task.split("train")
    assert (a.answer, b.answer) == ("7", "1234")
    assert a.messages == (("user", GSM[0]["question"] + SUFFIX),)
    assert task.trace(a) == "3+4=7\n#### 7"  # calculator annotations removed
    assert task.reward(a, task.trace(a), truncated=False) == 1.0
    assert task.reward(b, "so 1,234 in total\n#### 1,234", truncated=False) == 1.0
    assert task.reward(b, r"so $\boxed{1234}$", truncated=False) == 1.0
    assert task.reward(b, "1233 or 1234", truncated=False) == 1.0  # the last number
    assert task.reward(b, "#### 1233", truncated=False) == 0.0
    assert len(task.split("test")) == 1


def test_gsm8k_from_snapshot_directory(tmp_path):
    write_parquet(tmp_path / "main/train-00000-of-00001.parquet", GSM)
    write_parquet(tmp_path / "main/test-00000-of-00001.parquet", GSM[1:])
    task = get_task("gsm8k", data=str(tmp_path))
    assert [it.answer for it in task.split("test")] == ["1234"]


def test_math_from_snapshot_directory(tmp_path):
    # MATH-lighteval train (problem, level, type, solution) and MATH-500 test (with `answer`).
    write_parquet(tmp_path / "data/train-00000-of-00001.parquet",
                  [{"problem": "Compute $\\dfrac{2}{4}$.", "level": "Level 1", "type": "Prealgebra",
                    "solution": "We reduce: $\\dfrac{2}{4} = \\boxed{\\dfrac{1}{2}}$."},
                   {"problem": "Broken row.", "level": "Level 1", "type": "Algebra",
                    "solution": "No box at all."},])
    write_jsonl(tmp_path / "test.jsonl", [
        {"problem": "What is $\\sqrt{2}/2$ rationalised?", "solution": "... "
                                                                       "$\\boxed{\\frac{\\sqrt2}{2}}$",
         "answer": "\\frac{\\sqrt{2}}{2}", "subject": "Algebra", "level": 2,
         "unique_id": "test/algebra/1.json"},
    ])
    task = get_task("math", data=str(tmp_path))
    (item,) = task.split("train")  # the row without a box is dropped
    assert task.dropped == {"train": 1, "test": 0}
    assert item.answer == "\\dfrac{1}{2}" and item.prompt.endswith(SUFFIX)
    assert task.reward(item, task.trace(item), truncated=False) == 1.0
    assert task.reward(item, "It is $\\boxed{0.5}$", truncated=False) == 1.0
    assert task.reward(item, "It is $\\boxed{0.25}$", truncated=False) == 0.0
    (t,) = task.split("test")
    assert t.id == "test/algebra/1.json"
    assert task.reward(t, "$\\boxed{\\frac{1}{\\sqrt{2}}}$", truncated=False) == 1.0
    assert task.eval["splits"] == ["test"]
