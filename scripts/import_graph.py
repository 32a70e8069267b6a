"""Print the import graph of the ``suite`` package and exit 1 if it has a circle.

Every ``import``/``from ... import`` inside ``suite/`` counts, at module level and inside functions (a lazy
import is still a dependency a reader has to follow, and still a circle if the other side imports back).
Edges are between modules (``suite.rl.train`` -> ``suite.config``); importing a package counts as importing its
``__init__``. ``python scripts/import_graph.py`` prints one line per module, ``module -> dep, dep``, then either
``no import circle`` or each strongly connected component of more than one module (or a self-import).
"""
from __future__ import annotations

import ast
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PKG = "suite"


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
    """The longest known module that ``name`` starts with (``suite.rl.train.run`` -> ``suite.rl.train``)."""
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


def main() -> int:
    edges = graph()
    for mod in sorted(edges):
        print(f"{mod} -> {', '.join(sorted(edges[mod])) or '-'}")
    found = circles(edges)
    if not found:
        print(f"no import circle ({len(edges)} modules, {sum(map(len, edges.values()))} edges)")
        return 0
    for comp in found:
        print("import circle: " + " <-> ".join(comp))
    return 1


if __name__ == "__main__":
    sys.exit(main())
