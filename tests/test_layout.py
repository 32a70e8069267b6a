"""The package layout: stages that import only the stages before them, no import circle, short
files."""

from __future__ import annotations

import importlib.util
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _import_graph():
    spec = importlib.util.spec_from_file_location("import_graph",
                                                  ROOT / "scripts" / "import_graph.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_no_import_circle_and_every_import_follows_the_stage_order():
    ig = _import_graph()
    edges = ig.graph()
    # the graph is read
    assert "suite.rl.train" in edges and "suite.numerics.engine" in edges["suite.rl.train"]
    assert ig.circles(edges) == []
    assert ig.against_the_stages(edges) == []
    # The checker sees both kinds of mistake: a lazy import back into a later stage closes a circle.
    bad = {**edges, "suite.numerics.engine": edges["suite.numerics.engine"] | {"suite.rl.train"}}
    assert ig.circles(bad) and any("suite.numerics.engine -> suite.rl.train" in w
                                   for w in ig.against_the_stages(bad))


def test_no_module_over_500_lines():
    long = {str(p.relative_to(ROOT)): n for p in (ROOT / "suite").rglob("*.py")
            if (n := len(p.read_text().splitlines())) > 500}
    assert long == {}
