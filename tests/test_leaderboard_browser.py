"""The leaderboard in a real browser (Debian's Chromium, headless, via Playwright): opened from
disk, sorted, filtered, a detail view opened, no console errors, and markup in bundle
strings shown as text."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from suite.analysis import leaderboard
from suite.results import REFERENCE_ROOT, atomic_write_json, config_hash

# real runs (an earlier small tier)
DEFAULT = Path(__file__).resolve().parent / "fixtures" / "results-2seeds"
# No "/" in it: it also becomes a directory name and a model label (the path's last part).
MARKUP = '<script>alert(1)<script>"onmouseover=alert(2) x="<img src=x onerror=alert(3)>'


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("lb") / "site"
    leaderboard.build([DEFAULT], out)
    return out


def rows(page, section="unranked") -> list[str]:
    """Precision flow of each row of a section of the shown board, top to bottom."""
    return page.locator(f'table[data-section="{section}"] tbody tr .prec').all_inner_texts()


@pytest.fixture(scope="module")
def two_classes(tmp_path_factory) -> Path:
    """A site over two machine classes from the committed references: on cpu-amx-native grpo x fp16
    has three seeds (sanity + trainer-controls) next to exact; on cpu-avx2-emulated nothing
    reproduces any more."""
    root = tmp_path_factory.mktemp("classes")
    amx, avx2 = REFERENCE_ROOT / "cpu-amx-native", REFERENCE_ROOT / "cpu-avx2-emulated"
    for d in ("arith3__grpo__fp16__s0", "arith3__grpo__exact__s0", "arith3__grpo__bf16__s0"):
        shutil.copytree(amx / "sanity" / d, root / "amx" / d)
        shutil.copytree(avx2 / "sanity" / d, root / "avx2" / d)
    for s in (1, 2):
        shutil.copytree(amx / "trainer-controls" / f"arith3__grpo__fp16__s{s}",
                        root / "amx" / f"tc{s}")
    shutil.copy(avx2 / "reference.json", root / "avx2" / "reference.json")
    leaderboard.build([root / "amx", root / "avx2"], root / "site")
    return root / "site"


def test_class_selector_shows_one_board_per_class(two_classes, page):
    page.goto((two_classes / "index.html").as_uri())
    assert page.locator("h1").inner_text() == "Low-precision RL leaderboard"
    select = page.locator("#class-select")
    # most reproducible first
    assert select.locator("option").all_inner_texts()[0].startswith("cpu-amx-native")
    assert page.locator("#class-view").get_attribute("data-class") == "cpu-amx-native"
    assert "What this board measures" in page.locator(".what").first.inner_text()
    assert "206,496 parameters" in page.locator(".what").first.inner_text()
    assert (rows(page, "ranked") == ["fp16"] and rows(page, "controls") == ["exact"]
            and rows(page, "unranked") == ["bf16"])
    assert page.locator('table[data-section="ranked"] td.num').first.inner_text() == "1"
    assert "n=3" in page.locator('table[data-section="ranked"]').inner_text()
    # grpo is the sanity test's, not verl's and TRL's GRPO: said next to the name, with the knobs in
    # the tooltip.
    warn = page.locator('table[data-section="ranked"] .badge.namewarn')
    assert warn.inner_text() == "not verl's and TRL's GRPO"
    assert ("algo.advantage=std algo.clip_high=0.2 algo.agg=token-mean"
            in warn.get_attribute("title"))

    page.select_option("#class-select", "cpu-avx2-emulated")
    page.locator('#class-view[data-class="cpu-avx2-emulated"]').wait_for()
    assert page.url.endswith("#/class/cpu-avx2-emulated")
    assert page.locator("#class-view").get_attribute("data-class") == "cpu-avx2-emulated"
    assert page.locator('table[data-section="ranked"]').count() == 0
    assert "Nothing is ranked on this board" in page.locator(".no-rank").inner_text()
    assert sorted(rows(page, "stale")) == ["bf16", "fp16"] and rows(page, "controls") == ["exact"]
    assert "no longer reproduce" in page.locator('table[data-section="stale"]').inner_text()
    page.go_back()
    page.locator('#class-view[data-class="cpu-amx-native"]').wait_for()
    assert page.errors == []


def test_unranked_entries_say_why_and_their_page_says_how_to_fill(site, page):
    page.goto((site / "index.html").as_uri())
    assert page.locator('table[data-section="ranked"]').count() == 0
    assert sorted(rows(page)) == ["bf16", "fp16", "fp32"]
    whys = page.locator('table[data-section="unranked"] .why').all_inner_texts()
    assert whys and all(w.startswith("2 seeds: a rank needs 3") for w in whys)
    # two seeds: an interval, n=2
    assert "one run" not in page.locator('table[data-section="unranked"]').inner_text()
    page.locator('tr:has(.prec:text-is("fp16")) a.entry-link').click()
    detail = page.locator("#detail-view")
    detail.wait_for(state="visible")
    assert page.locator("#index-view").is_hidden()
    assert "not ranked: 2 seeds" in detail.locator(".placing").inner_text()
    assert detail.locator("pre.cmd.fill").inner_text().startswith(
        "for s in 2; do suite run task=arith")
    # Per seed: raw and 5-step-average accuracy, and the k3 KL curve; the seeds differ in dashes,
    # not only colour.
    assert detail.locator("svg.chart path.series").count() == 2 * 3
    series = detail.locator("svg.chart").first.locator("path.series")
    dashes = [series.nth(i).get_attribute("stroke-dasharray") for i in (1, 3)]
    assert dashes[0] != dashes[1]
    commands = detail.locator("pre.cmd:not(.fill)").all_inner_texts()
    assert commands == [f"suite run task=arith algorithm=grpo precision=fp16 seed={s} tier=small "
                        "perfectible.max_prompts=256 policy.hidden=128 policy.layers=3 "
                        "policy.mlp=384 policy.target_acc=0.5 steps=200" for s in (0, 1)]
    config = json.loads((DEFAULT / "arith__grpo__fp16__s0" / "config.json").read_text())
    assert config["config_hash"] in detail.inner_text()
    page.locator("a.back").click()
    page.locator("#index-view").wait_for(state="visible")
    assert page.errors == []


def test_rejected_submission_is_listed_with_its_reason(tmp_path, page):
    bad = tmp_path / "submission" / "arith__grpo__bf16__s9"
    shutil.copytree(DEFAULT / "arith__grpo__bf16__s0", bad,
                    ignore=shutil.ignore_patterns("ckpt", "log.txt"))
    summary = json.loads((bad / "summary.json").read_text())
    summary["accuracy/peak"] = 0.999
    atomic_write_json(bad / "summary.json", summary)
    leaderboard.build([DEFAULT, tmp_path / "submission"], tmp_path / "site")
    page.goto((tmp_path / "site" / "index.html").as_uri())
    rejected = page.locator("details#rejected")
    assert rejected.locator("summary").inner_text().startswith("Rejected bundles (1)")
    rejected.locator("summary").click()
    assert ("summary.json: accuracy/peak=0.999 but metrics.jsonl"
            in rejected.locator(".reason").inner_text())
    assert "arith__grpo__bf16__s9" not in page.locator("#class-view").inner_text()
    assert ("1 rejected" in page.locator("#meta").inner_text()
            and "Version " in page.locator("#meta").inner_text())
    assert page.errors == []


def test_reported_section_and_changelog(site, page):
    page.goto((site / "index.html").as_uri() + "#/reported")
    table = page.locator("table.reported")
    table.wait_for(state="visible")
    n = len(leaderboard.read_site_data(site)["reported"])
    assert table.locator("tbody tr").count() == n and n >= 5
    assert table.locator("a[href^='https://']").count() == n
    assert table.locator(".badge").all_inner_texts() == ["reported, unverified"] * n
    assert page.locator("#index-view").is_hidden()
    page.locator("nav.tabs a[data-view='changes']").click()
    # The click only changes the hash; the page re-renders on the (asynchronous) hashchange event.
    page.locator("#page-view h2", has_text="Changelog").wait_for(state="visible")
    assert ("Version " + leaderboard.changes()[0]["version"]
            in page.locator("#page-view").inner_text())
    assert page.errors == []


def _markup_bundle(root: Path) -> Path:
    """Two valid runs (seeds 0 and 1 of fp16) relabelled so every free-text field holds markup:
    the run directory, the model path, the experiment name and the CPU model."""
    sub = root / "submission"
    for seed in (0, 1):
        run = sub / f"arith__grpo__fp16__s{seed}{MARKUP}"
        shutil.copytree(DEFAULT / f"arith__grpo__fp16__s{seed}", run,
                        ignore=shutil.ignore_patterns("ckpt", "log.txt"))
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
    # the bundle is valid: it is the markup that is tested
    assert data["rejected"] == [] and data["accepted"] == 8

    dialogs = []
    page.on("dialog", lambda d: (dialogs.append(d.message), d.dismiss()))
    page.goto((out / "index.html").as_uri())

    def no_injection():
        # Only the page's own two scripts and no element carrying a bundle's attributes.
        assert page.evaluate("document.scripts.length") == 2
        assert page.evaluate("document.querySelectorAll('[onmouseover], [onerror], img')"
                             ".length") == 0

    page.locator("a.entry-link").first.wait_for()
    assert any(f"Policy\t{MARKUP}" in t or MARKUP in t
               for t in page.locator(".what").all_inner_texts())
    no_injection()
    link = page.locator('tr:has(.prec:text-is("fp16")) a.entry-link').first
    link.hover()
    page.evaluate("location.hash = '#/entry/' + "
                  "encodeURIComponent([].concat(...window.LEADERBOARD.classes[0].boards.map(b => "
                  "b.unranked)).filter(e => e.model.indexOf('<script>') >= 0)[0].id)")
    detail = page.locator("#detail-view")
    detail.wait_for(state="visible")
    text = detail.inner_text()
    assert f"arith__grpo__fp16__s0{MARKUP}" in text  # the run directory's name
    assert MARKUP in detail.locator("h2").inner_text()
    assert f"class not recorded: CPU {MARKUP}, 2 cores" in text  # the class first, then the host
    # The command quotes the markup for Hydra and the shell, and recomposes (else: rejected).
    assert "policy.path=" in detail.locator("pre.cmd:not(.fill)").first.inner_text()
    no_injection()
    detail.locator("h2").hover()
    page.wait_for_timeout(200)
    assert dialogs == []
    assert page.errors == []


def test_framework_column_filter_and_evidence(tmp_path, page, tiny_model):
    """A bundle from an outside loop next to the suite's runs: its framework is a column and a
    filter, and its detail says what backs its numbers and that its command is as recorded, not
    recomposed."""
    from test_bundle import write_run

    write_run(tmp_path / "mine", tiny_model[0], steps=2)
    out = tmp_path / "site"
    leaderboard.build([DEFAULT, tmp_path / "mine"], out)
    page.goto((out / "index.html").as_uri())
    # The outside loop ran on this machine (its class recorded), the fixture on a class not
    # recorded. Which board comes first depends on this machine's class (its committed reference
    # decides what reproduces): read them all.
    cells, mine = [], None
    for value in page.locator("#class-select option").evaluate_all("os => os.map(o => o.value)"):
        page.select_option("#class-select", value)
        page.locator(f'#class-view[data-class="{value}"]').wait_for()
        shown = page.locator("#class-view tbody tr .fw").all_inner_texts()
        mine = value if "mylib 0.1" in shown else mine
        cells += shown
    env = json.loads((DEFAULT / "arith__grpo__fp16__s0" / "env.json").read_text())
    assert sorted(set(cells)) == ["mylib 0.1", "suite " + env["git_sha"][:12]]
    page.select_option("#class-select", mine)
    page.locator(f'#class-view[data-class="{mine}"]').wait_for()
    page.locator('tr:has(.fw:text-is("mylib 0.1")) a.entry-link').click()
    detail = page.locator("#detail-view")
    detail.wait_for(state="visible")
    text = detail.inner_text()
    assert "recomputed from log-prob evidence" in text and "as recorded, not recomposed" in text
    assert detail.locator("pre.cmd:not(.fill)").inner_text() == "python train.py --bf16"
    assert page.errors == []
