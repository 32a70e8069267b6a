"""Math tasks whose rows come from files: ``sanity_r1d``, ``math``, ``gsm8k``, and the user's own.

Each task file of kind ``dataset`` (``tasks/*.yaml``, or a folder on the task path) names, per
split, the files of a hub repo or local files (relative to the task file); the rows are read with
``datasets.load_dataset`` and turned into ``Item``s by one small function per row format (``verl``:
the published sanity-test schema, verl's own; ``math``: problem/solution[/answer]; ``gsm8k``:
question/answer). The reward is the suite's math reward (``boxed``, ``gsm8k``:
suite/tasks/math_reward.py) or the task's own ``reward.function``, called as verl calls a custom
reward: ``fn(data_source, solution_str, ground_truth, extra_info)``. Where the rows come from is one
string, ``data``:

- ``None``: the files the task file names (hub ones with ``load_dataset(repo, data_files=...)``,
which
  honours ``HF_HUB_OFFLINE``, so an offline machine uses the local HF cache or fails at once);
- a directory: a snapshot of the repo(s), the same relative file layout;
- a ``.parquet``/``.jsonl`` file: the train split only;
- ``"train=A.parquet,test=B.jsonl"``: files (or globs) per split.

Everything is loaded and checked when the task is built, so a missing file, a missing column or
an unreachable hub raises ``DataError`` (one line saying what to do) before any compute.
"""

from __future__ import annotations

import glob
import importlib.util
import logging
import os
import re
from pathlib import Path

from suite.names import unknown
from suite.tasks import math_reward
from suite.tasks.item import Item
from suite.tasks.spec import REWARD_KINDS, load_function

log = logging.getLogger(__name__)


class DataError(ValueError):
    """A task's data cannot be read; the message says which file or repo and what to do."""


# ---------------------------------------------------------------------------- row formats
# Each maps one dataset row to (id, prompt, answer, messages, reference body), or None to drop it.

def _verl_row(row: dict, index: int, stem: str, suffix: str):
    """VeRL schema (sail/Sanity-Test-R1D-1.5B, verl's data_preprocess output): the messages are
    given, the suffix is already in them; ``data_source`` and ``extra_info`` go to a task's own
    reward function."""
    messages = tuple((str(m["role"]), str(m["content"])) for m in row["prompt"])
    user = [c for r, c in messages if r == "user"] or [messages[-1][1]]
    truth = row["reward_model"]["ground_truth"]
    idx = (row.get("extra_info") or {}).get("index", index)
    return f"{stem}/{idx}", user[-1], str(truth), messages, ""  # no reference solution is published


def _math_row(row: dict, index: int, stem: str, suffix: str):
    """MATH / MATH-500: ground truth = ``answer`` when present, else the solution's last box."""
    answer = row.get("answer") or math_reward.last_boxed(row.get("solution") or "")
    if not answer:
        return None
    prompt = str(row["problem"]) + suffix
    return str(row.get("unique_id")
               or f"{stem}/{index}"), prompt, str(answer), (("user", prompt),), row.get(
                   "solution") or ""


def _gsm8k_row(row: dict, index: int, stem: str, suffix: str):
    """GSM8K: ground truth after '####'; the trace drops the calculator annotations
    ``<<48/2=24>>``."""
    prompt = str(row["question"]) + suffix
    body = re.sub(r"<<[^>]*>>", "", str(row["answer"]))
    return (f"{stem}/{index}", prompt, math_reward.gsm8k_answer(str(row["answer"])),
            (("user", prompt),), body)


# format -> (row function, required columns: each entry lists acceptable alternatives)
FORMATS = {
    "verl": (_verl_row, (("prompt",), ("reward_model",))),
    "math": (_math_row, (("problem",), ("answer", "solution"))),
    "gsm8k": (_gsm8k_row, (("question",), ("answer",))),
}


# ---------------------------------------------------------------------------- where the rows come
# from

def _offline() -> bool:
    return any(os.environ.get(v, "").lower() in ("1", "true", "yes", "on")
               for v in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE"))


def _sources(task: str, splits: dict, data: str | None) -> dict[str, list[tuple[str | None, str]]]:
    """split -> [(hub repo or None for a local path, file or glob)]. Local paths are checked
    here."""
    if data is None:
        return {s: [(v.get("repo"), f) for f in v["files"]] for s, v in splits.items()}
    if "=" in data:  # "train=A,test=B"
        out = {}
        for part in data.split(","):
            split, _, path = part.partition("=")
            split, path = split.strip(), path.strip()
            if split not in splits:
                raise unknown(f"task {task}: data split", split, splits)
            out[split] = [(None, _existing(task, path, f"split '{split}'"))]
        return out
    root = Path(data).expanduser()
    if root.is_dir():
        missing = {}  # file -> the first split that needs it
        for s, v in splits.items():
            for f in v["files"]:
                if not glob.glob(str(root / f)):
                    missing.setdefault(f, s)
        if missing:
            missing = [f"{f} (split {s})" for f, s in missing.items()]
            raise DataError(f"task {task}: the directory {root} lacks {', '.join(missing)}; it "
                            "must mirror the hub layout (or pass one file per split: "
                            "data=\"train=...,test=...\")")
        return {s: [(None, str(root / f)) for f in v["files"]] for s, v in splits.items()}
    return {"train": [(None, _existing(task, data, "data"))]}


def _existing(task: str, path: str, what: str) -> str:
    path = str(Path(path).expanduser())
    if not glob.glob(path):
        raise DataError(f"task {task}: {what} path '{path}' does not exist")
    return path


def _load(task: str, repo: str | None, file: str, required: tuple, hint: str) -> list[dict]:
    """Rows of one file (local, or ``file`` inside hub ``repo``), with the required columns
    checked."""
    from datasets import (
        load_dataset,  # heavy (pyarrow, pandas): only when a hub task is built
    )

    where = f"{repo}:{file}" if repo else file
    if repo is None:
        suffix = Path(file).suffix.lower()
        builder = {".parquet": "parquet", ".jsonl": "json", ".json": "json"}.get(suffix)
        if builder is None:
            raise DataError(f"task {task}: cannot read '{file}': expected .parquet, .jsonl or "
                            ".json")
        cache = (os.path.join(os.environ["SUITE_CACHE"], "hf-datasets")
                 if os.environ.get("SUITE_CACHE") else None)
        try:
            ds = load_dataset(builder, data_files=sorted(glob.glob(file)), split="train",
                              cache_dir=cache)
        except Exception as e:  # noqa: BLE001 - a corrupt file: say which one
            raise DataError(f"task {task}: cannot read '{file}' ({type(e).__name__}: "
                            f"{_first_line(e)})") from None
    else:
        try:
            ds = load_dataset(repo, data_files=file, split="train")
        except Exception as e:  # noqa: BLE001 - offline, no network, no access, missing file: one line
            why = "offline: HF_HUB_OFFLINE=1" if _offline() else "hub unreachable or file missing"
            raise DataError(
                f"task {task}: cannot load '{file}' from the hub dataset '{repo}' ({why}; "
                f"{type(e).__name__}: {_first_line(e)}) and no local copy is cached. Set "
                f"data=/path/to/local/copy ({hint}), or pre-download with `hf download {repo} "
                "--repo-type dataset --local-dir DIR` (older huggingface_hub: `huggingface-cli "
                f"download {repo} --repo-type dataset --local-dir DIR`)"
            ) from None
    for alternatives in required:
        if not any(c in ds.column_names for c in alternatives):
            need = " or ".join(f"'{c}'" for c in alternatives)
            raise DataError(f"task {task}: {where} has no column {need} (columns: "
                            f"{', '.join(ds.column_names)})")
    return ds.to_list()


def _first_line(e: Exception) -> str:
    return (str(e).strip().splitlines() or [""])[0][:200]


# ---------------------------------------------------------------------------- the task

class HubTask:
    """A math task whose items come from a dataset (``tasks/{sanity_r1d,math,gsm8k}.yaml``, or the
    user's own).

    Public surface, besides ``split``/``trace``/``reward`` (the task protocol of
    suite/tasks/registry.py): ``eval`` (the task file's evaluation settings: splits, metric, n,
    temperature, top_p), ``max_new_tokens`` (the response budget the task was published with),
    ``source`` (where the rows came from, for provenance) and ``reward_stats()`` (symbolic-check
    counters to log).
    """

    takes_data = True  # get_task(name, data=...) passes the local override

    def __init__(self, spec: dict, data: str | None = None):
        self.spec = spec
        self.name = str(spec["name"])
        self.version = int(spec["version"])
        self.format = str(spec["format"])
        if self.format not in FORMATS:
            raise unknown(f"task {self.name}: format", self.format, FORMATS)
        reward = spec.get("reward") or {}
        self.reward_kind = str(reward.get("kind", "function" if "function" in reward else "boxed"))
        if self.reward_kind not in REWARD_KINDS:
            raise unknown(f"task {self.name}: reward.kind", self.reward_kind, REWARD_KINDS)
        self._reward_fn = load_function(reward["function"],
                                        self.name) if self.reward_kind == "function" else None
        self.require_think = bool(reward.get("require_think", False))
        self.timeout = float(reward.get("timeout", math_reward.DEFAULT_TIMEOUT))
        self.eval = dict(spec.get("eval") or {})
        self.max_new_tokens = (spec.get("sampling") or {}).get("max_new_tokens")
        self.data = data
        if self.reward_kind == "boxed" and importlib.util.find_spec("math_verify") is None:
            raise DataError(f"task {self.name}: its reward needs math-verify: pip install "
                            "'lowprec-rl-suite[math]'")

        fn, required = FORMATS[self.format]
        suffix = str(spec.get("prompt_suffix") or "")
        sources = _sources(self.name, spec["splits"], data)
        hint = "a directory with " + ", ".join(
            dict.fromkeys(f for v in spec["splits"].values() for f in v["files"]))
        self.source = data if data is not None else ", ".join(
            sorted({v.get("repo") or f for v in spec["splits"].values() for f in v["files"]}))
        self._items: dict[str, list] = {}
        self._traces: dict[str, str] = {}
        # id -> (data_source, extra_info) of verl rows, for a reward function
        self._row_info: dict[str, tuple] = {}
        self.dropped: dict[str, int] = {}
        rows_by_file: dict[tuple, list[dict]] = {}  # `test` reuses the aime files
        prompts: dict[str, str] = {}  # id -> prompt: ids name prompts across splits
        for split, files in sources.items():
            items, dropped = [], 0
            for repo, file in files:
                if (repo, file) not in rows_by_file:
                    rows_by_file[(repo, file)] = _load(self.name, repo, file, required, hint)
                stem = Path(file).name.split(".")[0].split("-")[0]
                for i, row in enumerate(rows_by_file[(repo, file)]):
                    out = fn(row, i, stem, suffix)
                    if out is None:
                        dropped += 1
                        continue
                    id_, prompt, answer, messages, body = out
                    if prompts.setdefault(id_, prompt) != prompt:
                        raise DataError(f"task {self.name}: two different prompts share the id "
                                        f"'{id_}' ({file})")
                    items.append(Item(id=id_, prompt=prompt, answer=answer, messages=messages))
                    if self._reward_fn is not None:
                        self._row_info[id_] = (str(row.get("data_source") or self.name),
                                               row.get("extra_info") or {})
                    self._traces[id_] = self._format_trace(body, answer)
            if dropped:
                log.warning("task %s: split %s: dropped %d rows without a ground truth", self.name,
                            split, dropped)
            if not items:
                raise DataError(f"task {self.name}: split '{split}' "
                                f"({', '.join(f for _, f in files)}) has no usable rows")
            self.dropped[split] = dropped
            self._items[split] = items

    def split(self, name: str, n: int | None = None) -> list:
        """The first ``n`` items of split ``name``, in file order (deterministic)."""
        if name not in self._items:
            if name in self.spec["splits"]:
                raise DataError(f"task {self.name}: split '{name}' is not in data={self.data!r} (a "
                                "single file is the train split; pass a directory or "
                                f"\"train=...,{name}=...\")")
            raise unknown(f"task {self.name}: split", name, self.spec["splits"])
        items = self._items[name]
        if n is not None and n > len(items):
            raise ValueError(f"task {self.name}: split '{name}' has {len(items)} items, {n} "
                             "requested")
        return items[:n]

    def _format_trace(self, body: str, answer: str) -> str:
        """A response the reward scores 1: the reference solution when the data has one (MATH,
        GSM8K), else just the final answer (the sanity set publishes no solutions)."""
        final = f"\\boxed{{{answer}}}" if self.reward_kind == "boxed" else f"#### {answer}"
        if self.require_think:  # the response starts inside <think>: reasoning, </think>, answer
            return f"{body.strip()}\n</think>\n\n{final}".lstrip()
        return body if body.strip() else final

    def trace(self, item) -> str:
        """The reference response of ``item`` (used only for a supervised warm start)."""
        return self._traces[item.id]

    def reward(self, item, response: str, truncated: bool) -> float:
        """The task's rule-based reward (suite/tasks/math_reward.py); never blocks longer than
        ``timeout`` (plus a worker restart after a timeout)."""
        if self.reward_kind == "function":
            return self._own_reward(item, response, truncated)
        if self.reward_kind == "gsm8k":
            return math_reward.gsm8k_reward(response, item.answer, truncated, self.require_think)
        return math_reward.boxed_reward(response, item.answer, truncated, self.timeout,
                                        self.require_think)

    def _own_reward(self, item, response: str, truncated: bool) -> float:
        """The task's ``reward.function`` with verl's custom-reward signature; a truncated response
        scores 0 without a call, as in every task of the suite. A dict return is read at ``score``
        (verl allows both)."""
        if truncated:
            return 0.0
        data_source, extra_info = self._row_info.get(item.id, (self.name, {}))
        out = self._reward_fn(data_source, response, item.answer, extra_info)
        score = out.get("score") if isinstance(out, dict) else out
        if isinstance(score, bool) or not isinstance(score, (int, float)):
            raise TypeError(f"task {self.name}: reward.function returned {out!r}; it must return a "
                            "number (or a dict with a numeric 'score')")
        return float(score)

    def reward_stats(self) -> dict:
        """Cumulative symbolic-check counters (timeouts, refused, crashes, symbolic) of this
        process."""
        return math_reward.counters()
