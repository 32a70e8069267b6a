"""The report of the committed results of the main job (the sanity grid), opened in headless
Chromium: it renders without console errors and every figure loads. Also leaves a full-page
screenshot for a human look."""

from pathlib import Path

from suite.analysis import report

# a committed reference
RESULTS = Path(__file__).parents[1] / "results" / "reference" / "cpu-avx2-emulated" / "sanity"


def test_report_of_committed_results_in_browser(page, tmp_path):
    out = report.write_report(RESULTS, tmp_path / "report")
    figures = sorted((out / "figures").iterdir())
    names = {f.name for f in figures}
    for stem in ("reward_curves", "mismatch_curves", "mismatch_step0", "loss_scale"):
        assert f"{stem}.png" in names
    assert not any(n.endswith(".svg") for n in names)  # SVGs only with --svg
    assert all(f.stat().st_size > 1000 for f in figures)

    page.goto((out / "index.html").as_uri())
    page.wait_for_load_state("load")
    imgs = page.eval_on_selector_all("img", "els => els.map(e => [e.getAttribute('src'), "
                                            "e.complete, e.naturalWidth])")
    assert sorted(src for src, _, _ in imgs) == sorted(f"figures/{f.name}" for f in figures
                                                       if f.suffix == ".png")
    for src, complete, width in imgs:
        assert complete and width > 0, src
    # Every link points at a file that exists; no link leaves the folder.
    hrefs = page.eval_on_selector_all("a[href]", "els => els.map(e => e.getAttribute('href'))")
    for href in hrefs:
        assert href.startswith("#") or (out / href).is_file(), href
    text = page.inner_text("body")
    for heading in ("Warnings", "Verdicts per cell", "Training accuracy",
                    "Training-inference mismatch", "fp16 loss scaling", "Runs", "Provenance"):
        assert heading in text
    assert ("suite run task=arith3 algorithm=grpo precision=bf16 seed=0 tier=small name=sanity"
            in text)
    assert page.errors == []
    shot = tmp_path / "report.png"
    page.screenshot(path=str(shot), full_page=True)
    assert shot.stat().st_size > 10_000
