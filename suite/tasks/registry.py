"""Verifiable tasks: prompts, reference traces and rewards, one task file each.

A task is a versioned YAML file, ``NAME.yaml`` (like lm-eval's task YAMLs; format and checks in
suite/tasks/spec.py), found on the task path: the folders of ``include_path`` (a config field,
``suite run include_path=DIR``), then those of the ``SUITE_TASKS_PATH`` environment variable (both
``os.pathsep``-separated, as lm-eval's ``--include_path``), then the suite's own ``tasks/`` (the
clone's top-level folder, or its copy in the wheel: suite/locations.py). A name defined twice on the
path is an error, so ``arith3`` always means the suite's. docs/own_task.md is the guide to adding
one.

The file's ``kind`` picks the code that builds it (``KINDS``); every task exposes ``split(name,
n)``, ``trace(item)`` (the correct step-by-step response, used only for the supervised warm start)
and ``reward(item, response, truncated)``. A lookup answers a typo with "did you mean".

The embedded tasks ``arith`` and ``arith3`` are column-wise addition of 5- and 3-digit numbers,
written as a trace of 53 and 33 tokens; ``arith8``, ``arith16`` and ``arith32`` (83, 163 and 323
tokens) make response length an explicit axis for hypothesis H2. The dataset tasks ``sanity_r1d``
(the published sanity test), ``math`` and ``gsm8k`` read their rows from the Hugging Face hub or a
local copy (suite/tasks/hub_tasks.py) and score responses with suite/tasks/math_reward.py; a task of
the user's own reads local files and may name its own reward function. Length matters: the
training-inference mismatch is per token, so a sequence's log-ratio (and its importance weight)
accumulates over the trace (arXiv 2510.26788).
"""

from __future__ import annotations

import functools
import os
import random
from pathlib import Path

from suite.locations import shipped_dir
from suite.names import unknown
from suite.tasks import spec as task_file
from suite.tasks.category import CategoryTask
from suite.tasks.hub_tasks import HubTask
from suite.tasks.item import Item

# the suite's own task files: the clone's tasks/, or the wheel's copy
TASK_DIR = shipped_dir("tasks")
TASKS_PATH_ENV = "SUITE_TASKS_PATH"


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
            raise ValueError(f"task {self.name}: cannot draw {n} distinct pairs of "
                             f"{self.digits}-digit numbers")
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
        default (trace + 8, suite/rl/config.py). The embedded policy's context covers it
        (policy.py)."""
        item = self._item(0, 0)
        return 1 + len(item.prompt) + len(self.trace(item)) + 8

    def _item(self, a: int, b: int) -> Item:
        d = self.digits
        return Item(id=f"{a:0{d}d}+{b:0{d}d}", prompt=f"{a:0{d}d}+{b:0{d}d}=",
                    answer=f"{a + b:0{d + 1}d}")

    def split(self, name: str, n: int | None = None) -> list[Item]:
        """The first ``n`` items of split ``train`` or ``test`` (deterministic, disjoint)."""
        if name == "test":
            pairs = self._pool[: self._test_n]
        elif name == "train":
            pairs = self._pool[self._test_n :]
        else:
            raise ValueError(f"task {self.name}: unknown split '{name}' (train, test)")
        if n is not None and n > len(pairs):
            raise ValueError(f"task {self.name}: split '{name}' has {len(pairs)} items, {n} "
                             "requested")
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


# kind -> the class that builds a task from its file (suite/tasks/spec.py checks the keys of each
# kind).
# arith: the embedded additions (arith: 5-digit sums, 53-token responses, the full tier; arith3:
# 3-digit sums, 33 tokens, the small tier and main job; arith8/16/32: 83-, 163- and 323-token
# responses for hypothesis H2, where the sequence-level importance ratio's variance grows like (1 +
# chi2)^T).
# category: many valid answers over a 2,048-word vocabulary, for hypothesis H3
# (suite/tasks/category.py).
# dataset: rows from files or the hub, math or own reward (suite/tasks/hub_tasks.py): sanity_r1d,
# math, gsm8k.
KINDS = {"arith": ArithTask, "category": CategoryTask, "dataset": HubTask}


# ---------------------------------------------------------------------------- the task path
def search_path(include: str | None = None) -> tuple[Path, ...]:
    """The folders searched for task files, first to last: ``include``, then ``SUITE_TASKS_PATH``
    (each ``os.pathsep``-separated), then the suite's own. A folder that does not exist is an
    error."""
    dirs = []
    for source, value in (("include_path", include),
                          (TASKS_PATH_ENV, os.environ.get(TASKS_PATH_ENV))):
        for part in (value or "").split(os.pathsep):
            if not part.strip():
                continue
            d = Path(part.strip()).expanduser().resolve()
            if not d.is_dir():
                raise ValueError(f"{source}: task folder {d} does not exist (a folder of NAME.yaml "
                                 "task files)")
            dirs.append(d)
    return tuple(dict.fromkeys([*dirs, TASK_DIR]))


def absolute_path(include: str) -> str:
    """``include`` with each folder made absolute, each once (whether it exists is checked on
    use)."""
    dirs = (str(Path(p.strip()).expanduser().resolve()) for p in include.split(os.pathsep)
            if p.strip())
    return os.pathsep.join(dict.fromkeys(dirs))


def task_files(include: str | None = None) -> dict[str, Path]:
    """name -> task file, for every ``*.yaml`` directly in each folder of the task path (not
    recursive). A name in two folders is an error naming both files."""
    found: dict[str, Path] = {}
    for d in search_path(include):
        for f in sorted(d.glob("*.yaml")):
            if f.stem in found:
                raise ValueError(f"task {f.stem} is defined twice: {found[f.stem]} and {f}; rename "
                                 f"one (a task's name is its file's name)")
            found[f.stem] = f
    return found


def task_names(include: str | None = None) -> list[str]:
    """Every task name on the task path (the suite's first, then the user's folders')."""
    files = task_files(include)
    return sorted(files, key=lambda n: (files[n].parent != TASK_DIR, n))


def task_file_of(name: str, include: str | None = None) -> Path:
    """The file of task ``name`` ("did you mean" on a typo)."""
    files = task_files(include)
    if name not in files:
        raise unknown("task", name, task_names(include))
    return files[name]


@functools.cache
def _read(path: Path, mtime: float) -> dict:
    return task_file.read(path)


def task_spec(name: str, include: str | None = None) -> dict:
    """The checked task file (no data read): recipe values such as ``tiers`` and ``eval``. Raises
    ValueError (TaskFileError) for an unknown name or a malformed file, before any compute."""
    path = task_file_of(name, include)
    return _read(path, path.stat().st_mtime)


def task_class(name: str, include: str | None = None):
    """The class that builds task ``name`` (its file's ``kind``)."""
    return KINDS[task_spec(name, include)["kind"]]


def list_tasks(include: str | None = None) -> list[dict]:
    """One row per task on the path, for ``suite ls tasks``: name, version, kind, where its file is,
    whether it is the suite's own, and its ``summary`` (else the first sentence of its description).
    Every file is checked (a bad one raises)."""
    rows = []
    for name in task_names(include):
        spec, path = task_spec(name, include), task_file_of(name, include)
        text = spec.get("summary") or " ".join(str(spec.get("description")
                                                   or "").split()).split(". ")[0]
        rows.append({"name": name, "version": spec["version"], "kind": spec["kind"],
                     "file": str(path), "builtin": path.parent == TASK_DIR, "summary": text})
    return rows


def prompt_ids(tok, item: Item) -> list[int]:
    """Token ids of a prompt: chat messages through the tokenizer's chat template (R1-distill's
    opens <think>), plain text as is (BOS prepended by the tokenizer)."""
    if item.messages:
        text = tok.apply_chat_template([{"role": r, "content": c} for r, c in item.messages],
                                       add_generation_prompt=True, tokenize=False)
        return tok(text, add_special_tokens=False)["input_ids"]  # the template already holds BOS
    return tok(item.prompt)["input_ids"]


def get_task(name: str, data: str | None = None, include: str | None = None):
    """Load task ``name`` from its file on the task path (cached per (name, data, include): a task
    object is read-only). ``data`` is a local copy of a dataset task's rows (a directory mirroring
    the hub layout, one file for the train split, or ``"train=A,test=B"``); None reads the files the
    task file names."""
    return _load(name, data, include)  # one cache key however the arguments are passed


@functools.cache
def _load(name: str, data: str | None, include: str | None):
    spec = task_spec(name, include)
    cls = KINDS[spec["kind"]]
    if data is None:
        return cls(spec)
    if not getattr(cls, "takes_data", False):
        raise ValueError(f"task {name} is generated and takes no data (got data={data!r})")
    return cls(spec, data=data)


def grade(task, items: list, responses: list[str], truncated: list[bool],
          workers: int = 1) -> list[float]:
    """``task.reward`` of each response, in order. ``workers`` > 1 grades them from that many
    threads, and the math tasks check answers in as many math-verify worker processes
    (suite/tasks/math_reward.py), where the symbolic checks of a 512-response step spend their time;
    the counters stay exact (one lock)."""
    if workers <= 1:
        return [task.reward(i, r, t) for i, r, t in zip(items, responses, truncated)]
    from concurrent.futures import ThreadPoolExecutor

    from suite.tasks import math_reward

    math_reward.set_workers(workers)
    with ThreadPoolExecutor(workers) as pool:
        return list(pool.map(task.reward, items, responses, truncated))
