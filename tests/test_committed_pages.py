"""What the committed pages say about where things are: no path of the machine that generated them,
and no folder that does not exist in a clone."""

from __future__ import annotations

import re
from pathlib import Path

from suite.analysis import outcomes
from suite.results import display_path

ROOT = Path(__file__).resolve().parents[1]
PAGES = sorted(p for p in (ROOT / "results" / "reference").rglob("*")
               if p.suffix in (".md", ".html"))
ABSOLUTE = re.compile(r"(?<![\w.~])/(?:root|home|work|tmp|Users)/[^\s`'\"<)]+")


def test_no_committed_page_names_a_path_of_the_machine_that_wrote_it():
    assert PAGES
    found = {str(p.relative_to(ROOT)): ABSOLUTE.findall(p.read_text(encoding="utf-8"))[:2]
             for p in PAGES}
    assert {k: v for k, v in found.items() if v} == {}


def test_a_committed_grid_points_its_reader_to_where_the_search_would_be_written(
    tmp_path, monkeypatch):
    # the sanity grid of a class without a committed collapse search: the sweep writes to
    # runs/collapse-search
    # a reader anywhere: the clone's paths are still named from the clone
    monkeypatch.chdir(tmp_path)
    root = ROOT / "results" / "reference" / "cpu-amx-native" / "sanity"
    text = outcomes.mismatch_lead(root)[2]
    assert "(results in runs/collapse-search, `suite report runs/collapse-search`)" in text
    assert ("results/reference/cpu-avx2-emulated/collapse-search "
            "(machine class cpu-avx2-emulated)" in text)
    assert display_path(root) == "results/reference/cpu-amx-native/sanity"
    assert display_path("/nowhere/else") == "/nowhere/else"
