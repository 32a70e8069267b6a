"""The documentation is reachable and its references hold: every page of docs/ is listed in the
index (docs/README.md), which README links; every relative link and every path a document names
exists; and the code a page tells users to copy runs."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
DOCS = REPO / "docs"
DOCUMENTS = [REPO / "README.md", REPO / "results" / "README.md", *sorted(DOCS.glob("*.md"))]
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")  # [text](target)
# A repository path named in prose or code: docs/x.md, suite/rl/train.py, scripts/main.sh, ...
PATH = re.compile(r"(?<![\w./-])((?:docs|suite|tests|scripts|results|recipes)/"
                  r"[\w./-]*\.(?:md|py|sh|yaml|json))")
FENCE = re.compile(r"```python\n(.*?)```", re.DOTALL)


def relative_links(path: Path) -> list[str]:
    """Link targets of a Markdown file that point into the repository (no scheme, not a bare
    #anchor)."""
    return [t for t in LINK.findall(path.read_text(encoding="utf-8"))
            if not re.match(r"^[a-z][a-z0-9+.-]*:", t) and not t.startswith("#")]


def test_the_index_lists_every_page_and_readme_links_the_index():
    index = DOCS / "README.md"
    listed = {(DOCS / t.split("#")[0]).resolve() for t in relative_links(index)}
    pages = {p.resolve() for p in DOCS.glob("*.md") if p != index}
    missing = sorted(p.name for p in pages - listed)
    assert not pages - listed, f"pages missing from docs/README.md: {missing}"
    assert "docs/README.md" in relative_links(REPO / "README.md")


@pytest.mark.parametrize("doc", DOCUMENTS, ids=lambda p: str(p.relative_to(REPO)))
def test_every_relative_link_resolves(doc):
    missing = [t for t in relative_links(doc) if not (doc.parent / t.split("#")[0]).exists()]
    assert not missing, f"{doc.relative_to(REPO)} links to missing files: {missing}"


@pytest.mark.parametrize("doc", DOCUMENTS, ids=lambda p: str(p.relative_to(REPO)))
def test_every_repository_path_named_exists(doc):
    missing = sorted({p for p in PATH.findall(doc.read_text(encoding="utf-8"))
                      if not (REPO / p).exists()})
    assert not missing, f"{doc.relative_to(REPO)} names paths that do not exist: {missing}"


def test_the_link_checks_catch_a_dead_link(tmp_path):
    page = tmp_path / "page.md"
    page.write_text("[ok](page.md), [dead](gone.md#x), [web](https://example.org), [anchor](#top), "
                    "docs/nope.md\n")
    assert [t for t in relative_links(page)
            if not (page.parent / t.split("#")[0]).exists()] == ["gone.md#x"]
    assert PATH.findall(page.read_text()) == ["docs/nope.md"]


@pytest.mark.parametrize("doc", DOCUMENTS, ids=lambda p: str(p.relative_to(REPO)))
def test_the_suite_imports_of_every_python_snippet_resolve(doc):
    """A snippet that imports a module that does not exist (docs/bundle.md once imported
    suite.rl.bundle) fails here."""
    for block in FENCE.findall(doc.read_text(encoding="utf-8")):
        for line in block.splitlines():
            if not re.match(r"(from|import) suite\b", line):
                continue
            try:
                exec(line, {})  # noqa: S102 - the documents' own import lines
            except ModuleNotFoundError as e:
                if (e.name or "").split(".")[0] == "suite":
                    raise
                pytest.skip(f"{line!r} needs {e.name}, an optional extra not installed here")


def test_the_bundle_snippet_runs_and_writes_a_bundle(tmp_path, monkeypatch):
    """docs/bundle.md's "Writing a bundle from your loop", run as written with (B, T) tensors of the
    shapes it states."""
    import torch

    from suite.analysis.runs import load_bundle

    code = FENCE.findall((DOCS / "bundle.md").read_text(encoding="utf-8"))[0]
    g, b, t = 2, 4, 3  # G responses per prompt, B = 2 prompts x G
    gen = torch.Generator().manual_seed(0)
    sampler = -torch.rand(b, t, generator=gen)
    env = {"G": g, "trainer_logp": sampler + 1e-3 * torch.randn(b, t, generator=gen),
           "sampler_logp": sampler, "mask": torch.ones(b, t),
           "rewards": torch.tensor([1.0, 0.0, 1.0, 1.0]), "entropy": torch.ones(b, t),
           "grad_norm": 0.5}
    monkeypatch.chdir(tmp_path)
    exec(code, env)  # noqa: S102
    run_dir = next((tmp_path / "runs" / "mine").iterdir())
    run = load_bundle(run_dir, run_dir.parent)
    assert len(run.metrics) == 100 and run.summary["steps_done"] == 100 and not run.problems
