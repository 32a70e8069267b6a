"""The documents of the embedded transfer tasks: six lm-eval tasks over the arith family's alphabet
("0123456789+=,#"), two per transfer group, generated from a task's held-out split and a seeded RNG
(nothing from a hub). Their lm-eval YAMLs are in suite/tasks/lm_eval_files/; suite/rl/evaluate.py
writes the documents into the cache and runs lm-eval on them (docs/transfer.md).
"""

from __future__ import annotations

import random
from pathlib import Path

import yaml

LM_EVAL_TASKS = Path(__file__).resolve().parent / "lm_eval_files"
GENERATOR_VERSION = 1  # bump when a generator below changes its documents


def _trace(a: str, b: str) -> tuple[list[str], str]:
    """Column steps "a+b+c=ss," (least significant first) and the sum, as in
    suite/tasks/registry.py."""
    steps, carry = [], 0
    for da, db in zip(reversed(a), reversed(b)):
        s = int(da) + int(db) + carry
        steps.append(f"{da}+{db}+{carry}={s:02d},")
        carry = s // 10
    return steps, f"{int(a) + int(b):0{len(a) + 1}d}"


def _carries(prompt: str) -> int:
    a, b = prompt[:-1].split("+")
    return sum(int(s[-2]) for s in _trace(a, b)[0])


def _near(rng: random.Random, s: str, k: int = 3) -> list[str]:
    """``s`` and ``k`` distinct strings that differ from it in one digit."""
    out = [s]
    while len(out) < k + 1:
        w = list(s)
        i = rng.randrange(len(w))
        w[i] = str((int(w[i]) + rng.randrange(1, 10)) % 10)
        if "".join(w) not in out:
            out.append("".join(w))
    return out


def _num(rng: random.Random, digits: int) -> str:
    return "".join(rng.choice("0123456789") for _ in range(digits))


def embedded_docs(name: str, task, n: int) -> list[dict]:
    """The documents of one embedded task for an arith-family ``task`` (``digits`` D)."""
    D, rng = task.digits, random.Random(f"{name}-{GENERATOR_VERSION}")
    test = task.split("test")
    if name == "tiny_math_sum":  # the first n held-out items
        return [{"prompt": it.prompt, "answer": it.answer} for it in test[:n]]
    if name == "tiny_math_carry":  # the carry-heavy held-out items, disjoint from tiny_math_sum's
        hard = [it for it in test[128:] if _carries(it.prompt) >= D - 1]
        return [{"prompt": it.prompt, "answer": it.answer} for it in hard[:n]]
    docs = []
    for _ in range(n):
        if name == "tiny_reason_column":  # "a+b+c=" -> one of "00".."19"
            a, b, c = rng.randrange(10), rng.randrange(10), rng.randrange(2)
            docs.append({"context": f"{a}+{b}+{c}=", "choices": [f"{v:02d}" for v in range(20)],
                         "gold": a + b + c})
        elif name == "tiny_reason_longer":  # a column step inside a (D+1)-digit trace
            a, b = _num(rng, D + 1), _num(rng, D + 1)
            steps, _ = _trace(a, b)
            k = rng.randrange(D + 1)
            context = f"{a}+{b}=" + "".join(steps[:k]) + steps[k][:6]
            docs.append({"context": context, "choices": [f"{v:02d}" for v in range(20)],
                         "gold": int(steps[k][6:8])})
        elif name == "tiny_copy_answer":  # a trace with random column sums: copy its answer
            a, b = _num(rng, D), _num(rng, D)
            sums = [rng.randrange(20) for _ in range(D)]
            steps = [f"{x}+{y}+{rng.randrange(2)}={s:02d},"
                     for x, y, s in zip(reversed(a), reversed(b), sums)]
            copied = str(sums[-1] // 10) + "".join(str(s % 10) for s in reversed(sums))
            true = f"{int(a) + int(b):0{D + 1}d}"
            # the computed sum: the tempting wrong one
            choices = [copied] + ([true] if true != copied else [])
            while len(choices) < 4:
                w = _num(rng, D + 1)
                if w not in choices:
                    choices.append(w)
            docs.append({"context": f"{a}+{b}=" + "".join(steps) + "#", "choices": choices,
                         "gold": 0})
        elif name == "tiny_copy_repeat":  # "dddd#" -> repeat the digits
            s = _num(rng, D + 1)
            docs.append({"context": s + "#", "choices": _near(rng, s), "gold": 0})
        else:
            raise KeyError(name)
    return docs


def templates() -> dict[str, dict]:
    """The embedded lm-eval task YAMLs by task name (their data paths are filled in by the
    caller)."""
    out = {}
    for path in sorted(LM_EVAL_TASKS.glob("*.yaml")):
        cfg = yaml.safe_load(path.read_text())
        out[cfg["task"]] = cfg
    return out
