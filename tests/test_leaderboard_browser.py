"""The leaderboard in a real browser (Debian's Chromium, headless, via Playwright): opened from
disk, sorted, filtered, a detail view opened, no console errors, and markup in bundle
strings shown as text."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from suite.analysis import leaderboard
from suite.results import atomic_write_json, config_hash

DEFAULT = Path(__file__).resolve().parent / "fixtures" / "results-2seeds"  # real runs (an earlier small tier)
# No "/" in it: it also becomes a directory name and a model label (the path's last part).
MARKUP = '<script>alert(1)<script>"onmouseover=alert(2) x="<img src=x onerror=alert(3)>'


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("lb") / "site"
    leaderboard.build([DEFAULT], out)
    return out


def rows(page, task="arith") -> list[str]:
    """Precision flow of each visible row, top to bottom."""
    return page.locator(f'table[data-task="{task}"] tbody tr .prec').all_inner_texts()


def test_opens_from_disk_sorts_and_filters(site, page):
    page.goto((site / "index.html").as_uri())
    assert page.locator("h1").inner_text() == "Low-precision RL leaderboard"
    entries = leaderboard.read_site_data(site)["tasks"][0]["entries"]
    assert rows(page) == [e["precision"] for e in entries]  # default ranking
    assert rows(page)[-1] == "bf16"  # 1/2 passes ranks below 2/2

    by_final = sorted(entries, key=lambda e: e["metrics"]["accuracy/final"]["iqm"])
    header = page.locator('th[data-key="final"] button')
    header.click()
    assert page.locator('th[data-key="final"]').get_attribute("aria-sort") == "ascending"
    assert rows(page) == [e["precision"] for e in by_final]
    header.click()
    assert page.locator('th[data-key="final"]').get_attribute("aria-sort") == "descending"
    assert rows(page) == [e["precision"] for e in reversed(by_final)]

    page.select_option("#filter-precision", "fp16")
    assert rows(page) == ["fp16"]
    page.select_option("#filter-precision", "")
    assert len(rows(page)) == 3
    page.select_option("#filter-hardware", index=1)
    assert len(rows(page)) == 3  # every committed run ran on the same machine
    assert page.errors == []


def test_detail_view_has_curves_and_provenance(site, page):
    page.goto((site / "index.html").as_uri())
    page.locator('tr:has(.prec:text-is("fp16")) a.entry-link').click()
    detail = page.locator("#detail-view")
    detail.wait_for(state="visible")
    assert page.locator("#index-view").is_hidden()
    assert "fp16" in detail.locator("h2").inner_text()
    # Per seed: raw and 5-step-average accuracy, and the k3 KL curve.
    assert detail.locator("svg.chart path.series").count() == 2 * 3
    commands = detail.locator("pre.cmd").all_inner_texts()
    # The fixture predates today's small tier: the command spells out every field that now differs.
    assert commands == [f"suite run task=arith algorithm=grpo precision=fp16 seed={s} tier=small "
                        "perfectible.max_prompts=256 policy.hidden=128 policy.layers=3 policy.mlp=384 "
                        "policy.target_acc=0.5 steps=200" for s in (0, 1)]
    config = json.loads((DEFAULT / "arith__grpo__fp16__s0" / "config.json").read_text())
    assert config["config_hash"] in detail.inner_text()
    page.locator("a.back").click()
    page.locator("#index-view").wait_for(state="visible")
    assert page.errors == []


def _markup_bundle(root: Path) -> Path:
    """Two valid runs (seeds 0 and 1 of fp16) relabelled so every free-text field holds markup:
    the run directory, the model path, the experiment name and the CPU model."""
    sub = root / "submission"
    for seed in (0, 1):
        run = sub / f"arith__grpo__fp16__s{seed}{MARKUP}"
        shutil.copytree(DEFAULT / f"arith__grpo__fp16__s{seed}", run, ignore=shutil.ignore_patterns("ckpt", "log.txt"))
        cfg_file = json.loads((run / "config.json").read_text())
        cfg_file["config"]["policy"]["path"] = f"models/{MARKUP}"
        cfg_file["config"]["name"] = MARKUP
        cfg_file["config_hash"] = config_hash(cfg_file["config"])
        atomic_write_json(run / "config.json", cfg_file)
        summary = json.loads((run / "summary.json").read_text())
        summary["config_hash"], summary["run"] = cfg_file["config_hash"], run.name
        atomic_write_json(run / "summary.json", summary)
        env = json.loads((run / "env.json").read_text())
        env["cpu_model"] = MARKUP
        atomic_write_json(run / "env.json", env)
    return sub


def test_markup_in_bundles_is_shown_as_text(tmp_path, page):
    out = tmp_path / "site"
    leaderboard.build([DEFAULT, _markup_bundle(tmp_path)], out)
    data = leaderboard.read_site_data(out)
    assert data["rejected"] == [] and data["accepted"] == 8  # the bundle is valid: it is the markup that is tested

    dialogs = []
    page.on("dialog", lambda d: (dialogs.append(d.message), d.dismiss()))
    page.goto((out / "index.html").as_uri())

    def no_injection():
        # Only the page's own two scripts and no element carrying a bundle's attributes.
        assert page.evaluate("document.scripts.length") == 2
        assert page.evaluate("document.querySelectorAll('[onmouseover], [onerror], img').length") == 0

    model_cell = page.locator("td", has_text=MARKUP).first
    assert model_cell.inner_text() == MARKUP
    no_injection()
    model_cell.hover()
    page.select_option("#filter-model", label=MARKUP)
    assert len(rows(page)) == 1
    page.select_option("#filter-hardware", label=f"class not recorded: CPU {MARKUP}, 2 cores")  # class first
    assert len(rows(page)) == 1
    page.locator("a.entry-link").first.click()
    detail = page.locator("#detail-view")
    detail.wait_for(state="visible")
    text = detail.inner_text()
    assert f"arith__grpo__fp16__s0{MARKUP}" in text  # the run directory's name
    assert MARKUP in detail.locator("h2").inner_text()
    # The command quotes the markup for Hydra and the shell, and recomposes (else: rejected).
    assert "policy.path=" in detail.locator("pre.cmd").first.inner_text()
    no_injection()
    detail.locator("h2").hover()
    page.wait_for_timeout(200)
    assert dialogs == []
    assert page.errors == []


def test_framework_column_filter_and_evidence(tmp_path, page, tiny_model):
    """A bundle from an outside loop next to the suite's runs: its framework is a column and a filter, and its
    detail says what backs its numbers and that its command is as recorded, not recomposed."""
    from test_bundle import write_run

    write_run(tmp_path / "mine", tiny_model[0], steps=2)
    out = tmp_path / "site"
    leaderboard.build([DEFAULT, tmp_path / "mine"], out)
    page.goto((out / "index.html").as_uri())
    cells = page.locator('table[data-task="arith"] tbody tr .fw').all_inner_texts()
    assert sorted(set(cells)) == ["mylib 0.1", "suite " + json.loads((DEFAULT / "arith__grpo__fp16__s0" / "env.json")
                                                                    .read_text())["git_sha"][:12]]
    page.select_option("#filter-framework", "mylib 0.1")
    assert rows(page) == ["bf16"]
    page.locator("a.entry-link").first.click()
    detail = page.locator("#detail-view")
    detail.wait_for(state="visible")
    text = detail.inner_text()
    assert "recomputed from log-prob evidence" in text and "as recorded, not recomposed" in text
    assert detail.locator("pre.cmd").inner_text() == "python train.py --bf16"
    assert page.errors == []
