"""What ``suite ls`` and the ``--help`` pages say about the registries: one line per entry, read
from the tables themselves (the precision flows, the algorithm table, the task files, the grids, the
regimes and tiers, the model presets, the recipe files), so that a listing cannot drift from what
the code runs; and the ``--help`` of the commands that take config fields (every field, its default,
docstring and allowed values). No torch is imported: ``suite ls`` and ``--help`` answer at once.
"""

from __future__ import annotations

import inspect
import re
from pathlib import Path


def _first_sentence(text: str) -> str:
    """The first sentence of ``text`` (whitespace collapsed): up to the first period followed by a
    space ("arXiv 2510.26788", "et al.," and "e.g. " do not end one)."""
    text = " ".join(text.split())
    m = re.search(r"(?<!\be\.g)(?<!\bi\.e)\.(?=\s)", text)
    return text[:m.end()] if m else text


def _header_comment(path: Path) -> str:
    """The first sentence of a YAML file's leading comment block (its own description of itself)."""
    lines = []
    for line in path.read_text().splitlines():
        if not line.startswith("#"):
            break
        lines.append(line.lstrip("#").strip())
    return _first_sentence(" ".join(lines))


def flows() -> list[tuple[str, str]]:
    from suite.numerics.flows import FLOWS

    return [(n, f"trainer {f.trainer}, sampler "
                f"{f.sampler}{', loss scaling' if f.loss_scaling else ''}: {f.note}")
            for n, f in FLOWS.items()]


def algorithms() -> list[tuple[str, str]]:
    from suite.rl.algo_table import ALGORITHMS, in_words

    return [(n, in_words(a)) for n, a in ALGORITHMS.items()]


def tasks(include: str | None = None) -> list[tuple[str, str]]:
    """Each task on the task path (the suite's tasks/, then the folders of ``include`` and
    $SUITE_TASKS_PATH): its kind, the first sentence of its task file's header (else of its summary
    or description), and where a task of the user's own lives."""
    from suite.tasks.registry import list_tasks

    out = []
    for row in list_tasks(include):
        path = Path(row["file"])
        about = _header_comment(path) or _first_sentence(row["summary"])
        where = "" if row["builtin"] else f" [{path}]"
        out.append((row["name"], f"{'dataset' if row['kind'] == 'dataset' else 'generated'}: "
                                 f"{about}{where}"))
    return out


def grids() -> list[tuple[str, str]]:
    from suite.experiments import grids as g

    out = []
    for name in g.GRIDS:
        grid, cells = g.get(name), 1
        for values in grid["axes"].values():
            cells *= len(values)
        out.append((name, f"{cells} cells: {grid['doc']}"))
    return out


def regimes() -> list[tuple[str, str]]:
    from suite.rl.schema import REGIMES

    return [(n, r["doc"]
             + (f" ({' '.join(f'{k}={v}' for k, v in r['set'].items())})" if r["set"] else ""))
            for n, r in REGIMES.items()]


def tiers() -> list[tuple[str, str]]:
    from suite.rl.schema import TIERS

    def values(t: dict) -> str:
        flat = {**{k: v for k, v in t.items() if k != "policy"},
                **{f"policy.{k}": v for k, v in t["policy"].items()}}
        return " ".join(f"{k}={v}" for k, v in flat.items())

    return [(n, values(t)) for n, t in TIERS.items()]


def models() -> list[tuple[str, str]]:
    from suite.rl.models import EMBEDDED, PRESETS

    return [(EMBEDDED, "the tiny Llama the suite builds (its size: the tier's policy.* values)"),
            *[(n, f"{p.hub} ({p.params_b:g}B parameters, {p.arch}): {p.note}")
              for n, p in PRESETS.items()]]


def recipes() -> list[tuple[str, str]]:
    """The suite's own recipe files (``recipe=NAME``; the clone's recipes/, or the wheel's copy)."""
    from suite.locations import shipped_dir

    return [(p.stem, _header_comment(p)) for p in sorted(shipped_dir("recipes").glob("*.yaml"))]


LISTS = {"tasks": tasks, "flows": flows, "algorithms": algorithms, "grids": grids,
         "regimes": regimes, "tiers": tiers, "models": models, "recipes": recipes}
# What each list is, and the field or command that takes its names.
ABOUT = {"tasks": "tasks (task=NAME; your own: include_path=DIR or $SUITE_TASKS_PATH, "
                  "docs/own_task.md)", "flows": "precision flows (precision=NAME)",
         "algorithms": "algorithms (algorithm=NAME): the loss each name computes "
                       "(suite/rl/algo_table.py)",
         "grids": "grids (suite sweep grid=NAME; suite grids adds wall times)",
         "regimes": "regimes (regime=NAME, on top of the tier)",
         "tiers": "tiers (tier=NAME: the scale dial)",
         "models": "base models (model=NAME, or a local HF model directory)",
         "recipes": "the suite's recipe files (recipe=NAME, or recipe=PATH for your own: config "
                    "fields applied first, the command line wins)"}


def lines(what: str, include: str | None = None) -> list[str]:
    """``suite ls WHAT``: a title line, then one line per entry, names aligned (``include``: task
    folders of the user's own, for the task list)."""
    from suite.names import lookup

    rows = lookup("ls", what,
                  LISTS)(include) if what == "tasks" and include else lookup("ls", what, LISTS)()
    width = max((len(n) for n, _ in rows), default=0)
    return [f"{ABOUT[what]}:", *(f"  {n:<{width}}  {d}" for n, d in rows)]


# ---- --help of the commands that take config fields -------------------------------------------
# The listing (suite ls NAME) that explains the values of a field.
LS_OF_FIELD = {"task": "tasks", "precision": "flows", "algorithm": "algorithms", "tier": "tiers",
               "regime": "regimes", "model": "models"}


def _field_docs(cls) -> dict[str, str]:
    """The docstring under each field of a config dataclass (the string literal that follows it)."""
    import ast
    import textwrap

    body = ast.parse(textwrap.dedent(inspect.getsource(cls))).body[0].body
    return {a.target.id: " ".join(b.value.value.split()) for a, b in zip(body, body[1:])
            if isinstance(a, ast.AnnAssign) and isinstance(a.target, ast.Name)
            and isinstance(b, ast.Expr)
            and isinstance(b.value, ast.Constant) and isinstance(b.value.value, str)}


def field_help(cls, prefix: str = "", choices: dict[str, list[str]] | None = None) -> list[str]:
    """Every field as ``name=default``, its docstring and, for a field that names registry entries,
    the allowed values; nested configs as ``section.name``."""
    import dataclasses
    import textwrap

    from suite.rl import cmdline

    choices = cmdline.choices() if choices is None else choices
    lines, docs = [], _field_docs(cls)
    for f in dataclasses.fields(cls):
        default = f.default if f.default is not dataclasses.MISSING else f.default_factory()
        if dataclasses.is_dataclass(default):
            lines += field_help(type(default), f"{prefix}{f.name}.", choices)
            continue
        key = f"{prefix}{f.name}"
        lines.append(f"  {key}={default}")
        lines += textwrap.wrap(docs.get(f.name, ""), 96, initial_indent=" " * 6,
                               subsequent_indent=" " * 6)
        if key in choices:
            more = [cmdline.OPEN_CHOICES[key]] if key in cmdline.OPEN_CHOICES else []
            see = f" (suite ls {LS_OF_FIELD[key]})" if key in LS_OF_FIELD else ""
            lines += textwrap.wrap(f"values: {', '.join(choices[key] + more)}{see}", 96,
                                   initial_indent=" " * 6, subsequent_indent=" " * 8)
    return lines


def config_help(command: str, doc: str) -> str:
    """``suite COMMAND --help`` for a command that takes config fields (``doc``: its docstring):
    usage, every field with its default, docstring and allowed values, then the regimes and
    tiers."""
    from suite.rl.schema import RunConfig

    def section(title: str, what: str) -> list[str]:
        rows = LISTS[what]()
        width = max(len(n) for n, _ in rows)
        return ["", title, *(f"    {n:<{width}}  {d}" for n, d in rows)]

    return "\n".join([
        f"usage: suite {command} [key=value ...] [recipe=FILE.yaml] [--cfg job]", "",
        inspect.cleandoc(doc), "",
        "Fields are key=value (Hydra's override syntax), never --key value; a list field takes "
        "[a,b], and one",
        "name alone is a one-element list. recipe=FILE.yaml applies a YAML mapping of fields first "
        "and the",
        "command line wins (suite ls recipes; docs/recipes.md). --cfg job prints the resolved",
        "config, each value's layer in a comment (suite/rl/layers.py).", "",
        "Config fields (key=default; the tier fills what is not given):",
        *field_help(RunConfig),
        *section("Algorithms (algorithm=NAME: what each name computes; the kernels: "
                 "suite/rl/algos.py):", "algorithms"),
        *section("Regimes (regime=NAME: over the tier, task file and preset, under what you set):",
                 "regimes"),
        *section("Tiers (tier=NAME: the values it gives every field left at None):", "tiers")])
