"""The figures README.md, results/README.md and docs/*.md quote are what the committed results and
the code give.

Each quoted figure sits in a span ``<!-- generated:NAME -->...<!-- /generated -->`` that
suite/experiments/docfigures.py fills from results/reference/ (and the tiers, the grids); a
regenerated reference or a changed tier fails here until ``python -m suite.experiments.docfigures
--write`` is run and the prose around the figures is read again.
"""

from __future__ import annotations

import pytest

from suite.experiments import docfigures

DOCUMENTS = [p for p in docfigures.documents()
             if docfigures.SPAN.search(p.read_text(encoding="utf-8"))]


def test_the_readmes_quote_generated_figures():
    names = {p.relative_to(docfigures.REPO).as_posix() for p in DOCUMENTS}
    assert {"README.md", "results/README.md", "docs/sweeps.md"} <= names


@pytest.mark.parametrize("doc", DOCUMENTS, ids=lambda p: p.relative_to(docfigures.REPO).as_posix())
def test_every_generated_figure_agrees_with_the_data(doc):
    bad = docfigures.disagreements(doc)
    assert not bad, "\n".join(bad) + ("\n(python -m suite.experiments.docfigures --write, "
                                      "then reread the sentences)")


def test_a_planted_disagreement_is_caught_and_refilled():
    """A verdict count edited in a copy of README.md (the counts were once swapped between two
    classes)."""
    readme = docfigures.REPO / "README.md"
    text = readme.read_text(encoding="utf-8")
    span = "<!-- generated:verdicts:cpu-amx-native -->"
    true = docfigures.figure("verdicts:cpu-amx-native")
    planted = text.replace(f"{span}{true}<!-- /generated -->", f"{span}22 of 24<!-- /generated -->")
    assert planted != text
    bad = docfigures.disagreements(readme, planted)
    assert (len(bad) == 1 and "verdicts:cpu-amx-native says '22 of 24'" in bad[0]
            and repr(true) in bad[0])
    assert docfigures.fill(planted) == docfigures.fill(text)


def test_the_verdict_counts_are_the_summaries():
    """The figure functions read the committed summaries: a class's count is its passing
    summary.json files, with the runs at the line named beside it (never counted as passing or
    failing)."""
    import json

    for cls in docfigures.classes():
        summaries = [json.loads(p.read_text())
                     for p in (docfigures.REFERENCE_ROOT / cls / "sanity").glob("*/summary.json")]
        n_pass = sum(s["verdict"] == "pass" for s in summaries)
        at = sum(s["verdict"] == "at_line" for s in summaries)
        assert docfigures.figure(f"verdicts:{cls}") == f"{n_pass} of {len(summaries)}" + (
            f" ({at} at the line)" if at else "")


def test_tier_sizes_are_counted_from_the_built_policy():
    """tier=full's policy (hidden 192, 4 layers, 6 heads / 2 KV heads, SwiGLU 512, 17-token
    vocabulary, untied head): embeddings and head 2 x 17 x 192, per layer q/o 2 x 192^2, k/v 2 x 192
    x 64, MLP 3 x 192 x 512, 2 norms."""
    h, kv, mlp, v, layers = 192, 2 * 192 // 6, 512, 17, 4
    by_hand = 2 * v * h + layers * (2 * h * h + 2 * h * kv + 3 * h * mlp + 2 * h) + h
    assert docfigures.policy_parameters("full") == by_hand == 1_581_120
    assert docfigures.figure("params:full") == "1.58M"


def test_bad_span_names_are_refused_with_the_name():
    with pytest.raises(ValueError, match="unknown figure 'verdict'. Did you mean 'verdicts'"):
        docfigures.figure("verdict:cpu-amx-native")
    with pytest.raises(ValueError, match="no complete run with precision=bf17"):
        docfigures.figure("final:cpu-avx2-emulated/collapse-search:precision=bf17")
