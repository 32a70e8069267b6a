"""Print the import graph of the ``suite`` package and exit 1 if it has a circle.

Every ``import``/``from ... import`` inside ``suite/`` counts, at module level and inside functions
(a lazy import is still a dependency a reader has to follow, and still a circle if the other side
imports back). Edges are between modules (``suite.rl.train`` -> ``suite.rl.config``); importing a
package counts as importing its ``__init__``. ``python scripts/import_graph.py`` prints one line per
module, ``module -> dep, dep``, then either ``no import circle`` or each strongly connected
component of more than one module (or a self-import).
"""
from __future__ import annotations

import ast
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PKG = "suite"
# The pipeline's stages, in import order: a module may import its own stage, the stages before it
# and the shared modules; the shared modules import only each other; the command line imports
# anything.
STAGES = ("numerics", "tasks", "rl", "analysis", "experiments")
SHARED = ("names", "locations", "console", "packed", "results", "dist", "lifetime")
ENTRY = ("cli", "__main__")


def modules(root: Path = ROOT) -> dict[str, Path]:
    """Dotted module name -> file, for every .py file under suite/."""
    out = {}
    for path in sorted((root / PKG).rglob("*.py")):
        parts = list(path.relative_to(root).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out[".".join(parts)] = path
    return out


def _resolve(name: str, known: dict[str, Path]) -> str | None:
    """The longest known module that ``name`` starts with (``suite.rl.train.run`` ->
    ``suite.rl.train``)."""
    while name:
        if name in known:
            return name
        name = name.rpartition(".")[0]
    return None


def graph(root: Path = ROOT) -> dict[str, set[str]]:
    """Module -> the suite modules it imports anywhere in its body."""
    known = modules(root)
    edges: dict[str, set[str]] = {m: set() for m in known}
    for mod, path in known.items():
        is_pkg = path.name == "__init__.py"
        package = mod if is_pkg else mod.rpartition(".")[0]
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            targets = []
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    anchor = package.split(".")
                    anchor = anchor[: len(anchor) - (node.level - 1)]
                    base = ".".join(anchor + ([base] if base else []))
                # `from suite.x import y`: y may itself be a module (suite.x.y) or a name in suite.x
                targets = [f"{base}.{a.name}" for a in node.names] or [base]
            for t in targets:
                dep = _resolve(t, known)
                if dep and dep != mod:
                    edges[mod].add(dep)
    return edges


def circles(edges: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan), sorted."""
    index, low, stack, on, out, counter = {}, {}, [], set(), [], [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in sorted(edges[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    sys.setrecursionlimit(10_000)
    for v in sorted(edges):
        if v not in index:
            visit(v)
    return sorted(out)


def rank(mod: str) -> int | None:
    """A module's place in the stage order: -1 shared, 0.. the stages, len(STAGES) the entry point;
    None unplaced."""
    part = mod.split(".")[1] if mod.count(".") else ""
    if part in SHARED or mod == PKG:
        return -1
    if part in ENTRY:
        return len(STAGES)
    return STAGES.index(part) if part in STAGES else None


def against_the_stages(edges: dict[str, set[str]]) -> list[str]:
    """Imports that go from a stage to a later one (or out of a shared module), and modules in no
    stage."""
    out = [f"{m}: in no stage (STAGES, SHARED, ENTRY)" for m in sorted(edges) if rank(m) is None]
    for mod in sorted(edges):
        for dep in sorted(edges[mod]):
            r, d = rank(mod), rank(dep)
            if None not in (r, d) and d > max(r, -1) and not (r == -1 and d == -1):
                out.append(f"{mod} -> {dep}: imports a later stage")
            elif r == -1 and d is not None and d >= 0:
                out.append(f"{mod} -> {dep}: a shared module imports a stage")
    return out


def main() -> int:
    edges = graph()
    for mod in sorted(edges):
        print(f"{mod} -> {', '.join(sorted(edges[mod])) or '-'}")
    found, wrong = circles(edges), against_the_stages(edges)
    for comp in found:
        print("import circle: " + " <-> ".join(comp))
    for line in wrong:
        print("against the stage order: " + line)
    if found or wrong:
        return 1
    print(f"no import circle, every import follows the stage order {' -> '.join(STAGES)} "
          f"({len(edges)} modules, {sum(map(len, edges.values()))} edges)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
