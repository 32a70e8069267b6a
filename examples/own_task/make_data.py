"""Writes the example tasks' data in verl's schema (nothing is downloaded): sums for my_math, letter counts
for my_letters, as JSONL under data/. Seeded, so the committed files are what this script writes:

    python examples/own_task/make_data.py

A verl row: data_source, prompt (a list of chat messages), ability, reward_model = {ground_truth, style},
extra_info = {index, split} (verl's data_preprocess scripts write the same columns, as parquet).
"""

import json
import random
from pathlib import Path

HERE = Path(__file__).resolve().parent
SUFFIX = " Please reason step by step, and put your final answer within \\boxed{}."


def row(source: str, question: str, answer: str, index: int, split: str) -> dict:
    return {"data_source": source, "prompt": [{"role": "user", "content": question}], "ability": "math",
            "reward_model": {"ground_truth": answer, "style": "rule"}, "extra_info": {"index": index, "split": split}}


def sums(rng: random.Random, n: int, split: str) -> list[dict]:
    out = []
    for i in range(n):
        a, b = rng.randrange(100), rng.randrange(100)
        out.append(row("my_math", f"What is {a} + {b}?{SUFFIX}", str(a + b), i, split))
    return out


def letters(rng: random.Random, n: int, split: str) -> list[dict]:
    out = []
    for i in range(n):
        word = "".join(rng.choice("rstrarr") for _ in range(rng.randrange(4, 9)))
        q = f"How many times does the letter r occur in '{word}'? End with the line 'Answer: N'."
        out.append(row("letter_count", q, str(word.count("r")), i, split))
    return out


def write(path: Path, rows: list[dict]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))


if __name__ == "__main__":
    rng = random.Random(0)
    write(HERE / "data" / "my_math_train.jsonl", sums(rng, 32, "train"))
    write(HERE / "data" / "my_math_test.jsonl", sums(rng, 8, "test"))
    write(HERE / "data" / "letters_train.jsonl", letters(rng, 32, "train"))
    write(HERE / "data" / "letters_test.jsonl", letters(rng, 8, "test"))
