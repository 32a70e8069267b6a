"""Verifiable tasks: prompts, reference traces and rewards.

A task is read from its versioned file in ``tasks/`` (like lm-eval's task YAMLs) and exposes
``split(name, n)``, ``trace(item)`` (the correct step-by-step response, used only for the
supervised warm start) and ``reward(item, response, truncated)``. The registry answers a typo
with "did you mean".

The embedded tasks ``arith`` and ``arith3`` are column-wise addition of 5- and 3-digit numbers,
written as a trace of 53 and 33 tokens.
Length matters: the training-inference mismatch is per token, so a sequence's log-ratio
(and its importance weight) accumulates over the trace (REFERENCE sections 1 and 8).
"""

from __future__ import annotations

import functools
import random
from dataclasses import dataclass
from pathlib import Path

import yaml

from suite.names import lookup

TASK_DIR = Path(__file__).resolve().parent.parent / "tasks"


@dataclass(frozen=True)
class Item:
    """One prompt with its ground truth."""

    id: str
    prompt: str
    answer: str


class ArithTask:
    """Column-wise addition of two zero-padded numbers (``tasks/arith.yaml``)."""

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
            raise ValueError(f"task arith: cannot draw {n} distinct pairs of {self.digits}-digit numbers")
        while len(out) < n:
            pair = (rng.randrange(top), rng.randrange(top))
            if pair not in seen:
                seen.add(pair)
                out.append(pair)
        return out

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
            raise ValueError(f"task arith: unknown split '{name}' (train, test)")
        if n is not None and n > len(pairs):
            raise ValueError(f"task arith: split '{name}' has {len(pairs)} items, {n} requested")
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
REGISTRY = {"arith": ArithTask, "arith3": ArithTask}


@functools.lru_cache(maxsize=None)
def get_task(name: str):
    """Load a task by name from its file in ``tasks/`` (cached: a task object is read-only)."""
    cls = lookup("task", name, REGISTRY)
    spec = yaml.safe_load((TASK_DIR / f"{name}.yaml").read_text())
    return cls(spec)
