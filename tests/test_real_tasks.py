"""The published sanity test and the dataset tasks through the training loop.

Nothing is fetched: the datasets are small local files in the published schemas, written here,
and the embedded policy stands in for the hub model (an untrained char-level Llama with a chat
template). The published recipe is checked against the published recipe.
"""

import json
import re
from pathlib import Path

import pytest
from test_hub_tasks import SUFFIX, verl_rows, write_parquet

from suite.rl import config, models
from suite.rl.train import run

# The "Hyperparameters" of the published sanity test (arXiv 2510.26788).
PUBLISHED = {
    "prompts_per_step": 64, "samples_per_prompt": 8, "updates_per_step": 4, "optim.lr": 1e-6,
    "optim.betas": (0.9, 0.95), "optim.eps": 1e-15, "optim.weight_decay": 0.0,
    "optim.grad_clip": 1.0, "sampling.max_new_tokens": 8192, "sampling.temperature": 1.0,
    "sampling.top_p": 1.0, "model": "r1d-1.5b",
}


@pytest.fixture
def r1d_copy(tmp_path):
    """A local snapshot of sail/Sanity-Test-R1D-1.5B's layout with a few rows in its schema."""
    train = [(f"What is {a} + {b}?", str(a + b)) for a, b in zip(range(1, 21), range(5, 25))]
    write_parquet(tmp_path / "train/math_1460.parquet", verl_rows(train))
    write_parquet(tmp_path / "test/aime_2024.parquet",
                  verl_rows([("Find 2^10.", "1024"), ("3!?", "6")], "test"))
    write_parquet(tmp_path / "test/aime_2025.parquet", verl_rows([("Half of 2?", "1")], "test"))
    return tmp_path


def _get(cfg, dotted):
    for part in dotted.split("."):
        cfg = getattr(cfg, part)
    return tuple(cfg) if isinstance(cfg, list) else cfg


def test_full_tier_is_the_published_recipe():
    cfg = config.load(["task=sanity_r1d", "tier=full"])  # no data read, no model fetched
    assert {k: _get(cfg, k) for k in PUBLISHED} == PUBLISHED
    from suite.rl.algos import get_algorithm

    algo = get_algorithm(cfg.algorithm)  # clip 0.2 / 0.28 and C = 3 are the algorithms' defaults
    assert (algo.clip_low, algo.clip_high, algo.C) == (0.2, 0.28, 3.0)
    assert cfg.eval.every > 0 and cfg.perfectible.max_prompts == 0
    # command line wins
    assert config.load(["task=sanity_r1d", "tier=full", "optim.lr=3e-6"]).optim.lr == 3e-6


def test_few_rl_steps_on_a_local_parquet_with_the_embedded_stand_in(r1d_copy, tmp_path):
    cfg = config.load(["task=sanity_r1d", "tier=smoke", f"data={r1d_copy}",
                       f"out={tmp_path / 'out'}", "eval.every=2", "eval.samples=2", "steps=3"])
    assert cfg.model == "embedded"
    run_dir = run(cfg)
    rows = [json.loads(ln) for ln in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2, 3]
    # untrained: no box, no answer
    assert all(r["reward/mean"] == 0.0 and r["reward/timeouts"] == 0 for r in rows)
    assert {k for k in rows[1] if k.startswith("eval/")} == {"eval/aime24/mean@2",
                                                             "eval/aime25/mean@2"}
    # every 2 steps and the last
    assert "eval/aime24/mean@2" not in rows[0] and "eval/aime24/mean@2" in rows[2]
    env = json.loads((run_dir / "env.json").read_text())
    assert (env["dataset"]["prompts"] == 16
            and env["dataset"]["provenance"]["prefiltered"].startswith("published"))
    assert env["task"] == {"name": "sanity_r1d", "version": 1}
    # The prompt went through the stand-in's chat template, as a real model's would.
    from suite.rl.policy import CHAT_TEMPLATE, load_policy
    from suite.tasks.registry import get_task, prompt_ids

    _, tok = load_policy(Path(env["policy"]["path"]))
    item = get_task("sanity_r1d", str(r1d_copy)).split("train", 1)[0]
    assert tok.chat_template == CHAT_TEMPLATE
    assert tok.decode(prompt_ids(tok, item)) == f"<|user|>What is 1 + 5?{SUFFIX}\n<|assistant|>"


def test_bad_input_is_refused_before_compute(r1d_copy, tmp_path, monkeypatch):
    # a hub model that is not cached, offline
    with pytest.raises(FileNotFoundError, match=r"not in the local Hugging Face "
                                                r"cache.*HF_HUB_OFFLINE=1.*hf download"):
        models.model_dir("r1d-1.5b")
    # a model whose tokenizer has no chat template, on a chat task: the arith policy (plain-text
    # prompts)
    arith = run(config.load(["tier=smoke", "steps=1", f"out={tmp_path / 'a'}"]))
    base = json.loads((arith / "env.json").read_text())["policy"]["path"]
    cfg = config.load(["task=sanity_r1d", "tier=smoke", f"data={r1d_copy}", f"model={base}",
                       f"out={tmp_path / 'b'}"])
    with pytest.raises(ValueError, match="no chat template"):
        run(cfg)
    assert not list((tmp_path / "b").rglob("metrics.jsonl"))  # nothing trained
    # an unknown model name, a missing eval split, an unknown task
    with pytest.raises(ValueError, match="model: unknown value 'r1d-15b'. Did you mean 'r1d-1.5b'"):
        config.load(["model=r1d-15b"])
    single = write_parquet(tmp_path / "only.parquet", verl_rows([("1+1?", "2")] * 4))
    with pytest.raises(ValueError, match="aime24"):
        run(config.load(["task=sanity_r1d", "tier=smoke", f"data={single}", "eval.every=1",
                         f"out={tmp_path / 'c'}"]))


def test_perfectible_builder_on_a_dataset_task(tmp_path):
    """The builder runs on gsm8k from a local file with the stand-in and records its provenance."""
    from suite.rl import perfectible
    from suite.rl.policy import PolicySpec, ensure_policy
    from suite.tasks.registry import get_task

    rows = [{"question": f"Tom has {a} apples and buys {b}. How many?",
             "answer": f"{a}+{b}=<<{a}+{b}={a + b}>>{a + b}\n#### {a + b}"}
            for a, b in [(1, 2), (3, 4), (5, 6)]]
    path = tmp_path / "gsm8k_train.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    task = get_task("gsm8k", f"train={path}")
    model_dir = ensure_policy(PolicySpec(hidden=64, layers=1, heads=2, kv_heads=1, mlp=128), task)
    out = perfectible.build(model_dir, task, k=2, lo=0.0, hi=1.0, pool=10, max_new_tokens=8,
                            out_dir=tmp_path / "set")
    items, prov = perfectible.load(out)
    assert [it.answer for it in items] == ["3", "7", "11"] and items[0].messages[0][0] == "user"
    assert (prov["k"], prov["band"], prov["count_before"],
            prov["count_after"]) == (2, [0.0, 1.0], 3, 3)
    assert prov["data_source"] == f"train={path}" and prov["sampler"]["engine"] == "torch"
    assert re.fullmatch(r"[0-9a-f]{16}", prov["dataset_sha256"])
