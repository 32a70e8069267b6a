"""Task files: reading one, checking it before any compute, and loading a task's own reward
function.

A task file is a YAML mapping (one file per task, ``NAME.yaml``, like lm-eval's task YAMLs). The
keys every task has, and those of each ``kind`` (the code that builds the task,
suite/tasks/registry.py ``KINDS``):

    name, version, kind            required; ``name`` is the file's stem
    summary (one line for `suite ls tasks`), description, sampling (max_new_tokens,
    max_prompt_tokens), eval, tiers
    arith:    digits, seed, n_test, n_train_max
    category: classes, class_size, labels, seed, n_test, n_train_max, sampling (max_new_tokens)
    dataset:  format, splits; optional prompt_suffix, reward, prefiltered

``check`` refuses an unknown key (with "did you mean"), a missing one, a data file that does not
exist and a reward function that cannot be imported, each as one ``TaskFileError`` line naming the
file. Relative paths (a split's local ``files``, a reward function's ``.py`` file) are relative to
the task file's folder; the checked spec holds them absolute.
"""

from __future__ import annotations

import glob
import hashlib
import importlib
import importlib.util
import sys
from pathlib import Path

import yaml

from suite.names import did_you_mean


class TaskFileError(ValueError):
    """A task file is malformed; the message names the file and the key."""


COMMON = {"required": ("name", "version", "kind"),
          "optional": ("summary", "description", "sampling", "eval", "tiers")}
KIND_KEYS = {
    "arith": {"required": ("digits", "seed", "n_test", "n_train_max"), "optional": ()},
    "category": {"required": ("classes", "class_size", "labels", "seed", "n_test", "n_train_max",
                              "sampling"),
                 "optional": ()},
    "dataset": {"required": ("format", "splits"),
                "optional": ("prompt_suffix", "reward", "prefiltered")},
}
NESTED = {  # mapping-valued keys and the keys they may hold
    # the second: the memory plan's prompt length
    "sampling": ("max_new_tokens", "max_prompt_tokens"),
    "eval": ("splits", "metric", "n", "temperature", "top_p"),
    "reward": ("kind", "function", "require_think", "timeout"),
}
FORMATS = ("verl", "math", "gsm8k")  # the row formats of suite/tasks/hub_tasks.py
REWARD_KINDS = ("boxed", "gsm8k", "function")


def _keys(path: Path, where: str, got: dict, required: tuple, optional: tuple) -> None:
    allowed = (*required, *optional)
    for key in got:
        if key not in allowed:
            raise TaskFileError(f"{path}: unknown key '{where}{key}'.{did_you_mean(key, allowed)} "
                                f"Allowed: {', '.join(allowed)}")
    for key in required:
        if key not in got:
            raise TaskFileError(f"{path}: missing key '{where}{key}'")


def read(path: Path) -> dict:
    """The checked spec of the task file at ``path`` (TaskFileError on any problem; no data is
    read)."""
    path = Path(path)
    try:
        spec = yaml.safe_load(path.read_text())
    except OSError as e:
        raise TaskFileError(f"{path}: cannot read the task file ({e.strerror})") from None
    except yaml.YAMLError as e:
        raise TaskFileError(f"{path}: not valid YAML: {str(e).splitlines()[0]}") from None
    if not isinstance(spec, dict):
        raise TaskFileError(f"{path}: a task file holds a mapping (name: ..., version: ..., kind: "
                            "...)")
    return check(spec, path)


def check(spec: dict, path: Path) -> dict:
    """``spec`` with relative paths made absolute, or TaskFileError naming the file and the key."""
    kind = spec.get("kind")
    if kind not in KIND_KEYS:
        raise TaskFileError(f"{path}: kind: unknown value {kind!r}.{did_you_mean(kind, KIND_KEYS)} "
                            f"Allowed: {', '.join(KIND_KEYS)}")
    _keys(path, "", spec, COMMON["required"] + KIND_KEYS[kind]["required"],
          COMMON["optional"] + KIND_KEYS[kind]["optional"])
    if spec["name"] != path.stem:
        raise TaskFileError(f"{path}: name '{spec['name']}' differs from the file's name; a task "
                            "NAME lives in NAME.yaml")
    if not isinstance(spec["version"], int) or isinstance(spec["version"], bool):
        raise TaskFileError(f"{path}: version must be an integer (bump it whenever a prompt, trace "
                            "or reward changes)")
    for key, allowed in NESTED.items():
        if key in spec and not isinstance(spec[key], dict):
            raise TaskFileError(f"{path}: '{key}' must be a mapping")
        _keys(path, f"{key}.", spec.get(key) or {}, (), allowed)
    if not isinstance(spec.get("tiers") or {}, dict):
        raise TaskFileError(f"{path}: 'tiers' maps a tier name to config fields (tiers: {{smoke: "
                            f"{{steps: 2}}}})")
    if kind == "dataset":
        spec = {**spec, "splits": _splits(spec, path)}
        spec["reward"] = _reward(spec.get("reward") or {}, path)
    return spec


def _splits(spec: dict, path: Path) -> dict:
    if spec["format"] not in FORMATS:
        raise TaskFileError(f"{path}: format: unknown value "
                            f"{spec['format']!r}.{did_you_mean(spec['format'], FORMATS)} Allowed: "
                            f"{', '.join(FORMATS)}")
    if not isinstance(spec["splits"], dict) or "train" not in spec["splits"]:
        raise TaskFileError(f"{path}: splits maps each split name (train is required) to "
                            "{files: [...]} (local, relative to the task file) or {repo: HUB_REPO, "
                            "files: [...]}")
    out = {}
    for name, split in spec["splits"].items():
        if not isinstance(split, dict):
            raise TaskFileError(f"{path}: splits.{name} must be a mapping {{files: [...]}}")
        _keys(path, f"splits.{name}.", split, ("files",), ("repo",))
        files = split["files"]
        if not isinstance(files, list) or not files:
            raise TaskFileError(f"{path}: splits.{name}.files must be a non-empty list of files or "
                                "globs")
        if split.get("repo") is None:  # local files, relative to the task file's folder
            files = [str((path.parent / f).resolve()) for f in files]
            for f in files:
                if not glob.glob(f):
                    raise TaskFileError(f"{path}: splits.{name}.files: no file matches {f}")
        out[name] = {**split, "files": files}
    return out


def _reward(reward: dict, path: Path) -> dict:
    kind = reward.get("kind", "function" if "function" in reward else "boxed")
    if kind not in REWARD_KINDS:
        raise TaskFileError(f"{path}: reward.kind: unknown value "
                            f"{kind!r}.{did_you_mean(kind, REWARD_KINDS)} Allowed: "
                            f"{', '.join(REWARD_KINDS)}")
    if kind != "function":
        if "function" in reward:
            raise TaskFileError(f"{path}: reward.function is set but reward.kind is {kind}; drop "
                                "one of them")
        return {**reward, "kind": kind}
    extra = [k for k in ("require_think", "timeout") if k in reward]
    if extra:
        raise TaskFileError(f"{path}: reward.{extra[0]} applies to the built-in rewards (boxed, "
                            "gsm8k), not to a reward function, which scores the whole response "
                            "itself")
    if not isinstance(reward.get("function"), str):
        raise TaskFileError(f"{path}: reward.function must be 'package.module:function' or "
                            "'file.py:function'")
    ref = _absolute(reward["function"], path.parent)
    load_function(ref, path)  # refused now, before any compute
    return {**reward, "kind": kind, "function": ref}


def _absolute(ref: str, base: Path) -> str:
    """A ``file.py:function`` reference with its file made absolute (relative to ``base``); modules
    as given."""
    where, _, name = ref.rpartition(":")
    if where.endswith(".py"):
        return f"{(base / where).resolve()}:{name}"
    return ref


def load_function(ref: str, path: Path | str = "reward.function"):
    """The callable ``ref`` names: ``package.module:function`` (imported from sys.path) or
    ``/abs/file.py:function`` (loaded from the file). TaskFileError says what is missing."""
    where, sep, name = ref.rpartition(":")
    if not sep or not where or not name:
        raise TaskFileError(f"{path}: reward.function '{ref}' must be 'package.module:function' or "
                            "'file.py:function'")
    if where.endswith(".py"):
        file = Path(where)
        if not file.is_file():
            raise TaskFileError(f"{path}: reward.function: the file {file} does not exist")
        # One module per file, named after its path, so two tasks' reward.py files never collide.
        mod_name = f"suite_task_reward_{hashlib.sha256(str(file).encode()).hexdigest()[:12]}"
        module = sys.modules.get(mod_name)
        if module is None:
            loader_spec = importlib.util.spec_from_file_location(mod_name, file)
            module = importlib.util.module_from_spec(loader_spec)
            try:
                loader_spec.loader.exec_module(module)
            except Exception as e:  # noqa: BLE001 - the user's file failed to import: say which and why
                raise TaskFileError(f"{path}: reward.function: importing {file} failed "
                                    f"({type(e).__name__}: {e})") from None
            sys.modules[mod_name] = module
    else:
        try:
            module = importlib.import_module(where)
        except ImportError as e:
            raise TaskFileError(f"{path}: reward.function: cannot import module '{where}' ({e}); "
                                "install it or give a file path 'reward.py:function'") from None
    fn = getattr(module, name, None)
    if not callable(fn):
        found = [n for n in dir(module) if callable(getattr(module, n)) and not n.startswith("_")]
        raise TaskFileError(f"{path}: reward.function: '{where}' has no function "
                            f"'{name}'.{did_you_mean(name, found)}")
    return fn
