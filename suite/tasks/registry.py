"""Verifiable tasks: prompts, reference traces and rewards.

A task is read from its versioned file in ``suite/tasks/task_files/`` (like lm-eval's task YAMLs) and exposes
``split(name, n)``, ``trace(item)`` (the correct step-by-step response, used only for the
supervised warm start) and ``reward(item, response, truncated)``. The registry answers a typo
with "did you mean".

The embedded tasks ``arith`` and ``arith3`` are column-wise addition of 5- and 3-digit numbers,
written as a trace of 53 and 33 tokens; ``arith8``, ``arith16`` and ``arith32`` (83, 163 and 323
tokens) make response length an explicit axis for hypothesis H2. The math tasks ``sanity_r1d`` (the published sanity test),
``math`` and ``gsm8k`` read their rows from the Hugging Face hub or a local copy
(suite/tasks/hub_tasks.py) and score responses with suite/tasks/math_reward.py.
Length matters: the training-inference mismatch is per token, so a sequence's log-ratio
(and its importance weight) accumulates over the trace (arXiv 2510.26788).
"""

from __future__ import annotations

import functools
import random
from pathlib import Path

import yaml

from suite.names import lookup
from suite.tasks.category import CategoryTask
from suite.tasks.hub_tasks import HubTask
from suite.tasks.item import Item

TASK_DIR = Path(__file__).resolve().parent / "task_files"  # shipped in the wheel (package data)


class ArithTask:
    """Column-wise addition of two zero-padded numbers (``suite/tasks/task_files/arith.yaml``)."""

    # The characters the embedded tokenizer must cover (see policy.py).
    alphabet = "0123456789+=,#"

    def __init__(self, spec: dict):
        self.spec = spec
        self.name = str(spec["name"])
        self.version = int(spec["version"])
        self.digits = int(spec["digits"])
        self._test_n = int(spec["n_test"])
        self._pool = self._draw(int(spec["seed"]), self._test_n + int(spec["n_train_max"]))

    def _draw(self, seed: int, n: int) -> list[tuple[int, int]]:
        rng, top, seen, out = random.Random(seed), 10**self.digits, set(), []
        if n > top * top // 2:
            raise ValueError(f"task {self.name}: cannot draw {n} distinct pairs of {self.digits}-digit numbers")
        while len(out) < n:
            pair = (rng.randrange(top), rng.randrange(top))
            if pair not in seen:
                seen.add(pair)
                out.append(pair)
        return out

    @property
    def context(self) -> int:
        """Positions a prompt and its default response budget take: BOS, the 2 * digits + 2 prompt
        characters, the trace (10 * digits + 2), EOS and the slack of ``sampling.max_new_tokens``'s
        default (trace + 8, suite/rl/config.py). The embedded policy's context covers it (policy.py)."""
        item = self._item(0, 0)
        return 1 + len(item.prompt) + len(self.trace(item)) + 8

    def _item(self, a: int, b: int) -> Item:
        d = self.digits
        return Item(id=f"{a:0{d}d}+{b:0{d}d}", prompt=f"{a:0{d}d}+{b:0{d}d}=", answer=f"{a + b:0{d + 1}d}")

    def split(self, name: str, n: int | None = None) -> list[Item]:
        """The first ``n`` items of split ``train`` or ``test`` (deterministic, disjoint)."""
        if name == "test":
            pairs = self._pool[: self._test_n]
        elif name == "train":
            pairs = self._pool[self._test_n :]
        else:
            raise ValueError(f"task {self.name}: unknown split '{name}' (train, test)")
        if n is not None and n > len(pairs):
            raise ValueError(f"task {self.name}: split '{name}' has {len(pairs)} items, {n} requested")
        return [self._item(a, b) for a, b in pairs[:n]]

    def trace(self, item: Item) -> str:
        """The correct response: one "a+b+c=ss," step per column, then '#' and the sum."""
        a, b = item.prompt[:-1].split("+")
        steps, carry = [], 0
        for da, db in zip(reversed(a), reversed(b)):
            s = int(da) + int(db) + carry
            steps.append(f"{da}+{db}+{carry}={s:02d},")
            carry = s // 10
        return "".join(steps) + "#" + item.answer

    def reward(self, item: Item, response: str, truncated: bool) -> float:
        """1.0 iff the response finished (EOS) and the number after its last '#' is the sum."""
        if truncated or "#" not in response:
            return 0.0
        final = response.rsplit("#", 1)[1].strip()
        return 1.0 if final.isdigit() and int(final) == int(item.answer) else 0.0


# arith: 5-digit sums, 53-token responses (the full tier); arith3: 3-digit sums, 33 tokens
# (the small tier, the main job: the same trace format, sized for the 2-core time budget).
# arith8, arith16, arith32: 83-, 163- and 323-token responses for hypothesis H2 (length), where the
# sequence-level importance ratio's variance grows like (1 + chi2)^T (regimes len8/len16/len32).
# category: many valid answers over a 2,048-word vocabulary, for hypothesis H3 (suite/tasks/category.py).
# sanity_r1d, math, gsm8k: dataset tasks for real models (suite/tasks/hub_tasks.py).
REGISTRY = {"arith": ArithTask, "arith3": ArithTask, "arith8": ArithTask, "arith16": ArithTask, "arith24": ArithTask,
            "arith32": ArithTask,
            "category": CategoryTask,
            "sanity_r1d": HubTask, "math": HubTask, "gsm8k": HubTask}


def prompt_ids(tok, item: Item) -> list[int]:
    """Token ids of a prompt: chat messages through the tokenizer's chat template (R1-distill's opens
    <think>), plain text as is (BOS prepended by the tokenizer)."""
    if item.messages:
        text = tok.apply_chat_template([{"role": r, "content": c} for r, c in item.messages],
                                       add_generation_prompt=True, tokenize=False)
        return tok(text, add_special_tokens=False)["input_ids"]  # the template already holds BOS
    return tok(item.prompt)["input_ids"]


@functools.lru_cache(maxsize=None)
def task_spec(name: str) -> dict:
    """The parsed task file (no data read): recipe values such as ``tiers`` and ``eval``."""
    lookup("task", name, REGISTRY)
    return yaml.safe_load((TASK_DIR / f"{name}.yaml").read_text())


@functools.lru_cache(maxsize=None)
def get_task(name: str, data: str | None = None):
    """Load a task by name from its file in ``suite/tasks/task_files/`` (cached per (name, data): a task object is
    read-only). ``data`` is a local copy of a dataset task's rows (a directory mirroring the hub
    layout, one file for the train split, or ``"train=A,test=B"``); None reads the hub."""
    cls = lookup("task", name, REGISTRY)
    spec = yaml.safe_load((TASK_DIR / f"{name}.yaml").read_text())
    if data is None:
        return cls(spec)
    if not getattr(cls, "takes_data", False):
        raise ValueError(f"task {name} is generated and takes no data (got data={data!r})")
    return cls(spec, data=data)


def grade(task, items: list, responses: list[str], truncated: list[bool], workers: int = 1) -> list[float]:
    """``task.reward`` of each response, in order. ``workers`` > 1 grades them from that many threads, and
    the math tasks check answers in as many math-verify worker processes (suite/tasks/math_reward.py), where
    the symbolic checks of a 512-response step spend their time; the counters stay exact (one lock)."""
    if workers <= 1:
        return [task.reward(i, r, t) for i, r, t in zip(items, responses, truncated)]
    from concurrent.futures import ThreadPoolExecutor

    from suite.tasks import math_reward

    math_reward.set_workers(workers)
    with ThreadPoolExecutor(workers) as pool:
        return list(pool.map(task.reward, items, responses, truncated))
