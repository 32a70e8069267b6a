"""Reports are pure functions of result bundles: the outcome table, the statistics and the
reproducibility report, checked against hand computations on bundles written here."""

import importlib.util
import io
import json
import math
import re
from itertools import product
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from suite.analysis import figures, outcomes, render, report, stats
from suite.analysis.runs import load_runs
from suite.results import atomic_write_json, atomic_write_text, config_hash, summarize
from suite.rl import config, provenance

# ---------------------------------------------------------------------------- the outcome table


def _write(root, precision, k3, dp, slr, verdict="pass"):
    d = root / f"arith__grpo__{precision}__s0"
    d.mkdir(parents=True)
    s = {"run": d.name, "task": "arith", "algorithm": "grpo", "precision": precision, "seed": 0,
         "verdict": verdict, "accuracy/peak": 0.96, "accuracy/peak_step": 90,
         "accuracy/final": 0.95, "accuracy/first_pass_step": 80, "mismatch/step0/kl_k3": k3,
         "mismatch/step0/prob_diff/mean": dp, "mismatch/step0/seq_log_ratio/mean_abs": slr,
         "mismatch/final/kl_k3": k3, "train/skipped_steps": 0, "time/total_s": 12.0}
    (d / "summary.json").write_text(json.dumps(s))


def test_markdown_table_and_bf16_fp16_ratios(tmp_path):
    _write(tmp_path, "bf16", 4e-5, 5e-4, 4e-2)
    _write(tmp_path, "fp16", 2e-6, 1e-4, 8e-3, verdict="collapse")
    md = outcomes.outcome_markdown(tmp_path)
    assert "| arith__grpo__bf16__s0 | pass | 0.960 (90) |" in md
    assert "| arith__grpo__fp16__s0 | collapse |" in md
    assert "mean abs dp 5.0x, k3 KL 20.0x, mean abs seq log-ratio 5.0x" in md
    assert outcomes.outcome_rows(tmp_path / "nothing") == []


# ---------------------------------------------------------------------------- statistics


def test_stats_by_hand():
    # sample std: ((1)^2 + (1)^2) / (2 - 1)
    assert stats.mean_std([1.0, 3.0]) == (2.0, math.sqrt(2.0))
    assert stats.mean_std([0.5, None, float("nan")]) == (0.5, None)  # one value left: no std
    assert stats.mean_std([]) == (None, None)
    assert stats.iqm([1, 2, 3, 4, 100]) == 3.0  # floor(5/4) = 1 dropped at each end: mean(2, 3, 4)
    assert stats.iqm([4, 1, 3, 2]) == 2.5  # mean(2, 3)
    assert stats.iqm([0.2, 0.6]) == pytest.approx(0.4)  # n < 4: nothing dropped
    np.testing.assert_allclose(stats.trailing_mean([1, 2, 3, 4], 2), [np.nan, 1.5, 2.5, 3.5])
    # NaN skipped in a window
    np.testing.assert_allclose(stats.trailing_mean([1, np.nan, 3], 2), [np.nan, 1.0, 3.0])


def test_bootstrap_ci_matches_the_exact_bootstrap_distribution():
    # With 2 values a < b the bootstrap mean is a with probability 1/4 > 2.5%: the interval is [a,
    # b].
    assert stats.bootstrap_ci([0.96, 1.0]) == (0.96, 1.0)
    assert stats.bootstrap_ci([0.7]) is None
    # n = 5: enumerate all 5^5 equally likely resamples; the Monte-Carlo quantiles must be close.
    xs = [0.0, 0.1, 0.4, 0.8, 1.0]
    means = np.sort([np.mean(r) for r in product(xs, repeat=5)])
    exact = np.quantile(means, [0.025, 0.975])
    lo, hi = stats.bootstrap_ci(xs)
    assert lo == pytest.approx(exact[0], abs=0.02) and hi == pytest.approx(exact[1], abs=0.02)
    assert stats.bootstrap_ci(xs) == (lo, hi)  # fixed seed: deterministic
    # seed is used
    assert stats.bootstrap_ci(xs, n_boot=20, seed=1) != stats.bootstrap_ci(xs, n_boot=20, seed=2)
    lo_iqm, hi_iqm = stats.bootstrap_ci([1, 2, 3, 4, 100], stat="iqm")
    assert 1 <= lo_iqm <= 3 <= hi_iqm <= 100


# ---------------------------------------------------------------------------- fixture bundles
TOTAL = 10
SHA = "1111111111111111111111111111111111111111"


def _bundle(root: Path, algo: str, prec: str, seed: int, rewards: list[float], *,
            error: str | None = None, write_summary: bool = True, overrides=(), extra_summary=None,
            loss_scale=None, skipped=None, is_rows: bool = False, sha: str = SHA,
            task: str = "arith") -> Path:
    """A run directory as suite.rl.train writes it, with known metrics (1-based steps)."""
    cfg = config.to_dict(config.load([f"algorithm={algo}", f"precision={prec}", f"seed={seed}",
                                      "tier=smoke", f"steps={TOTAL}", f"out={root.parent}",
                                      f"name={root.name}", *overrides]))
    # sanity_r1d is not a registered task yet; its bundles are written as they will be
    cfg["task"] = task
    d = root / f"{task}__{algo}__{prec}__s{seed}"
    d.mkdir(parents=True)
    scale = 1e-6 if prec == "fp16" else 1e-4 if prec == "bf16" else 1e-12
    rows = []
    for i, r in enumerate(rewards):
        row = {"step": i + 1, "reward/mean": r, "mismatch/kl_k3": scale * (1 + i),
               "mismatch/prob_diff/max": 10 * scale, "mismatch/prob_diff/mean": scale,
               "mismatch/seq_log_ratio/mean_abs": 100 * scale, "train/loss_scale": loss_scale[i]
               if loss_scale else 1.0,
               "train/skipped_steps": skipped[i] if skipped else 0, "train/grad_norm": 0.5,
               "time/step_s": 1.0}
        if is_rows:
            row.update({"is/weight/mean": 1.0, "is/weight/min": 0.5 + 0.01 * i, "is/weight/max": 2.0
                        + i,
                        "is/truncated_frac": 0.01 * i, "is/masked_frac": 0.0, "is/ess": 0.9})
        rows.append(row)
    atomic_write_json(d / "config.json", {"config_hash": config_hash(cfg), "config": cfg})
    atomic_write_text(d / "metrics.jsonl", "".join(json.dumps(r) + "\n" for r in rows))
    atomic_write_json(d / "env.json", {
        "schema_version": 1, "git_sha": sha, "git_dirty": False, "python": "3.11.7",
        "cpu_model": "Test CPU", "cpu_count": 2, "gpus": [], "torch_threads": 1,
        "packages": {"torch": "2.13.0"}, "hostname": "<b>host</b>",
        "precision": {"name": prec, "loss_scaling": prec == "fp16"},
        "task": {"name": task, "version": 1}, "dataset": {"sha256": "feedbeef", "prompts": 64}})
    if error:
        atomic_write_text(d / "error.txt", "Traceback (most recent call last):\n  File "
                                           f"\"x\"\n{error}\n")
    if write_summary:
        s = summarize(rows, total_steps=TOTAL, threshold=0.95, error=error)
        s.update({"run": d.name, "task": task, "algorithm": algo, "precision": prec, "seed": seed,
                  "tier": "smoke", "config_hash": config_hash(cfg), **(extra_summary or {})})
        atomic_write_json(d / "summary.json", s)
    return d


FP16_S0 = [0.5, 0.6, 0.7, 0.8, 0.9, 1.0, 1.0, 1.0, 1.0, 1.0]
FP16_S1 = [0.5, 0.5, 0.6, 0.8, 0.9, 0.95, 0.95, 1.0, 1.0, 0.9]
BF16_COLLAPSE = [0.6, 0.8, 0.9, 1.0, 1.0, 1.0, 0.6, 0.4, 0.3, 0.2]
FP32_LEVELS = [0.97, 0.99, 0.96, 0.5]  # constant-reward runs: peak = final = the level


@pytest.fixture(scope="module")
def golden(tmp_path_factory):
    """4 fp32 seeds (3 pass, 1 unstable; seed 3 with another lr and git sha), 2 fp16 passes, bf16
    with a collapse and a failed run, bf16 + token TIS with a pass and a run killed before its
    summary."""
    root = tmp_path_factory.mktemp("results") / "exp"
    for seed, level in enumerate(FP32_LEVELS):
        _bundle(root, "grpo", "fp32", seed, [level] * TOTAL,
                **({"overrides": ["optim.lr=0.001"], "sha": "2" * 40} if seed == 3 else {}))
    scale = [65536.0] * 3 + [32768.0] * 4 + [65536.0] * 3  # back-off at step 4, growth at step 8
    _bundle(root, "grpo", "fp16", 0, FP16_S0, loss_scale=scale,
            skipped=[0, 0, 0, 1, 1, 1, 1, 1, 1, 1], extra_summary={"eval/aime": 0.3})
    _bundle(root, "grpo", "fp16", 1, FP16_S1, loss_scale=[65536.0] * TOTAL,
            extra_summary={"eval/aime": 0.5})
    _bundle(root, "grpo", "bf16", 0, BF16_COLLAPSE)
    _bundle(root, "grpo", "bf16", 1, [0.6, 0.7, 0.7], error="RuntimeError: boom <script>")
    _bundle(root, "grpo_token_tis", "bf16", 0, [0.98] * TOTAL, is_rows=True)
    _bundle(root, "grpo_token_tis", "bf16", 1, [0.6, 0.6, 0.7, 0.7], is_rows=True,
            write_summary=False)
    out = report.write_report(root)
    return root, out


def _cells(root):
    return {k: render.cell_stats(v, render.extra_keys(load_runs(root)))
            for k, v in render.group_cells(load_runs(root)).items()}


def test_golden_verdict_numbers_by_hand(golden):
    root, _ = golden
    cells = _cells(root)
    fp32 = cells[("arith", "grpo", "fp32")]
    assert fp32["counts"] == {"pass": 3, "at_line": 0, "collapse": 0, "unstable": 1, "too_short": 0,
                              "incomplete": 0}
    mean = (0.97 + 0.99 + 0.96 + 0.5) / 4  # 0.855
    std = math.sqrt(sum((x - mean) ** 2 for x in FP32_LEVELS) / 3)  # 0.23699
    for key in ("peak", "final"):
        assert fp32[key]["mean"] == pytest.approx(mean) and fp32[key]["std"] == pytest.approx(std)
        assert fp32[key]["iqm"] == pytest.approx((0.96 + 0.97) / 2)  # drop 0.5 and 0.99
        lo, hi = fp32[key]["ci"]
        assert 0.5 <= lo < mean < hi <= 0.99
    # first full window
    assert fp32["first_pass"]["reached"] == 3 and fp32["first_pass"]["mean"] == 5.0

    fp16 = cells[("arith", "grpo", "fp16")]
    assert fp16["counts"]["pass"] == 2
    # Peaks: seed 0's 5-step mean reaches 1.0 at step 10; seed 1's is (0.9+0.95+0.95+1+1)/5 = 0.96
    # at step 9. Finals (last 5 steps): 1.0 and (0.95+0.95+1+1+0.9)/5 = 0.96. First pass: both at
    # step 9 (0.98, 0.96).
    for key in ("peak", "final"):
        assert fp16[key]["values"] == pytest.approx([1.0, 0.96])
        assert (fp16[key]["mean"] == pytest.approx(0.98)
                and fp16[key]["std"] == pytest.approx(math.sqrt(2 * 0.02 ** 2)))
        assert fp16[key]["ci"] == pytest.approx((0.96, 1.0))  # two seeds: [min, max]
    assert fp16["first_pass"] == {"values": [9, 9], "reached": 2, "mean": 9.0}
    assert fp16["extra"]["eval/aime"] == pytest.approx((0.4, math.sqrt(0.02)))

    bf16 = cells[("arith", "grpo", "bf16")]
    assert bf16["counts"] == {"pass": 0, "at_line": 0, "collapse": 1, "unstable": 0, "too_short": 0,
                              "incomplete": 1}
    assert bf16["failed"] == 1
    # Only the complete run counts: peak (0.8+0.9+1+1+1)/5 = 0.94 at step 6; final = mean of the
    # last 5 steps (1.0, 0.6, 0.4, 0.3, 0.2) = 0.5 <= 0.94 - 0.25: collapse.
    assert bf16["peak"]["values"] == pytest.approx([0.94]) and bf16["peak"]["std"] is None
    assert bf16["final"]["values"] == pytest.approx([0.5]) and bf16["final"]["ci"] is None

    tis = cells[("arith", "grpo_token_tis", "bf16")]
    assert tis["counts"] == {"pass": 1, "at_line": 0, "collapse": 0, "unstable": 0, "too_short": 0,
                             "incomplete": 1} and tis["failed"] == 0


def test_golden_report_tables(golden):
    root, out = golden
    assert out == root / "report"
    md = (out / "report.md").read_text()
    # The verdict table as rendered (the CI of four seeds is checked above, not spelled here).
    assert "| arith | grpo | fp32 | 0,1,2,3 | 3 | 0 | 1 | 0 (0) | 0.855 ± 0.237 |" in md
    assert "| 0.965 | 5.0 (3/4) | - |" in md  # final IQM, first pass, no eval/aime for fp32
    assert ("| arith | grpo | fp16 | 0,1 | 2 | 0 | 0 | 0 (0) | 0.980 ± 0.028 | [0.960, 1.000] | "
            "0.980 ± 0.028 | [0.960, 1.000] | 0.980 | 9.0 (2/2) | 0.400 ± 0.141 |") in md
    assert ("| arith | grpo | bf16 | 0,1 | 0 | 1 | 0 | 1 (1) | 0.940 (n=1) | - | 0.500 (n=1) | - "
            "| 0.500 | - (0/1) |" in md)
    assert "eval/aime mean ± std" in md
    # Failed and killed runs appear as such, with the error.
    assert "| arith__grpo__bf16__s1 | failed | 3/10 | RuntimeError: boom <script> |" in md
    assert "| arith__grpo_token_tis__bf16__s1 | incomplete | 4/10 |" in md
    assert ("arith__grpo_token_tis__bf16__s1: summary.json missing; "
            "summary recomputed from metrics.jsonl" in md)
    # fp16 loss scale: 65536 -> 32768 at step 4 (one back-off, one skipped step) -> 65536 at step 8.
    assert "| arith__grpo__fp16__s0 | pass | 65536 | 32768 | 65536 | 1 | 1 | 1 | 0 |" in md
    assert "| arith__grpo__fp16__s1 | pass | 65536 | 65536 | 65536 | 0 | 0 | 0 | 0 |" in md
    # IS diagnostics of the token-TIS cell over 14 steps: is/weight/max = 2 + i, so max 11 (step 10
    # of seed 0).
    row = next(ln for ln in md.splitlines()
               if ln.startswith("| arith | grpo_token_tis | bf16 | 14 |"))
    assert "0.9 [0.9, 0.9]" in row and "[2, 11]" in row
    # Warnings: the lr and git sha of seed 3 differ; nothing else does.
    assert ("config optim.lr differs between runs: 0.0001 (9 runs); "
            "0.001 (arith__grpo__fp32__s3)" in md)
    assert (f"environment git_sha differs between runs: {SHA} (9 runs); "
            f"{'2' * 40} (arith__grpo__fp32__s3)" in md)
    assert "config tier differs" not in md and "packages.torch differs" not in md
    assert "Published sanity test" not in md  # no sanity_r1d runs
    # What each algorithm computed, from the runs' own config: grpo says it is not verl's and TRL's
    # GRPO.
    from suite.rl.algo_table import ALGORITHMS, in_words

    for name in ("grpo", "grpo_token_tis"):
        assert f"| {name} | {in_words(ALGORITHMS[name])} |" in md
    assert "NOT verl's and TRL's GRPO (theirs: algorithm=grpo algo.advantage=std" in md


def test_rerun_commands_reproduce_config_hashes(golden):
    root, out = golden
    runs = load_runs(root)
    for r in runs:
        overrides = provenance.rerun_overrides(r.config)
        assert config.load(overrides) is not None
        assert config_hash(config.to_dict(config.load(overrides))) == r.config_hash, r.label
        assert str(provenance.check(r.config, r.config_hash)) == "yes"
    lr_run = next(r for r in runs if r.seed == 3)
    assert ("optim.lr=0.001" in provenance.rerun_overrides(lr_run.config)
            and "tier=smoke" in provenance.rerun_overrides(lr_run.config))
    md = (out / "report.md").read_text()
    assert "suite run task=arith algorithm=grpo precision=fp32 seed=3 tier=smoke" in md
    # A config edited after its hash was recorded is caught.
    changed = json.loads(json.dumps(lr_run.config)) | {"threshold": 0.5}
    assert str(provenance.check(changed, lr_run.config_hash)).startswith("NO: composes to")


@pytest.mark.parametrize("root, n",
                         [("results/reference/cpu-avx2-emulated/sanity", 24),
                          ("tests/fixtures/results-2seeds", 6)])
def test_committed_results_rerun_commands(root, n):
    """Every committed run (the main job's grid; older real runs) recomposes to its recorded
    config."""
    runs = load_runs(Path(__file__).parents[1] / root)
    assert len(runs) == n
    for r in runs:
        assert str(provenance.check(r.config, r.config_hash)).startswith("yes"), r.label


def test_html_is_escaped_and_self_contained(golden):
    _, out = golden
    page = (out / "index.html").read_text()
    assert "RuntimeError: boom &lt;script&gt;" in page and "<script>" not in page
    assert "&lt;b&gt;host&lt;/b&gt;" in page
    assert "http://" not in page and "https://" not in page  # no network requests, no CDN
    imgs = [ln for ln in page.split("<img ")[1:]]
    assert imgs
    for name in ("reward_curves", "mismatch_curves", "mismatch_step0", "loss_scale",
                 "is_diagnostics"):
        f = out / "figures" / f"{name}.png"
        assert f.is_file() and f.stat().st_size > 1000, f
        assert Image.open(f).mode == "P"  # figures.compact_png: a palette PNG
        assert f'src="figures/{name}.png"' in page
    # SVGs only on request (--svg), and then each linked beside its PNG in both pages.
    assert not list(out.rglob("*.svg")) and ".svg" not in page + (out / "report.md").read_text()


def test_svg_figures_on_request(golden, tmp_path):
    root, out = golden
    vec = report.write_report(root, tmp_path / "svg", svg=True)
    pngs = sorted(f.stem for f in (vec / "figures").glob("*.png"))
    assert pngs and sorted(f.stem for f in (vec / "figures").glob("*.svg")) == pngs
    page, md = (vec / "index.html").read_text(), (vec / "report.md").read_text()
    for stem in pngs:
        assert (f'<a href="figures/{stem}.svg">SVG</a>' in page
                and f"([SVG](figures/{stem}.svg))" in md)
        assert ((vec / "figures" / f"{stem}.png").read_bytes()
                == (out / "figures" / f"{stem}.png").read_bytes())


REPO = Path(__file__).parents[1]


def test_compact_figures_turns_an_svg_report_into_the_png_only_one(golden, tmp_path):
    """scripts/compact_figures.py on a report written with SVGs and RGBA PNGs (as the references
    were) gives the files `suite report` writes today; a second pass changes nothing."""
    spec = importlib.util.spec_from_file_location("compact_figures",
                                                  REPO / "scripts" / "compact_figures.py")
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    root, out = golden
    old = report.write_report(root, tmp_path / "old", svg=True)
    # back to matplotlib's RGBA, as the older code wrote it
    for f in (old / "figures").glob("*.png"):
        Image.open(f).convert("RGBA").save(f)
    for f in (old / "figures").glob("*.svg"):
        f.unlink()
    for name in ("index.html", "report.md"):
        text = (old / name).read_text()
        fixed = script.unlink_svgs(text, lambda stem: False)
        assert fixed == (out / name).read_text() and script.unlink_svgs(
            fixed, lambda stem: False) == fixed
    for f in (old / "figures").glob("*.png"):
        small = figures.compact_png(f.read_bytes())
        assert Image.open(io.BytesIO(small)).mode == "P" and figures.compact_png(small) == small
        assert np.array_equal(
            np.asarray(Image.open(io.BytesIO(small)).convert("RGB")),
            np.asarray(Image.open(out / "figures" / f.name).convert("RGB"))), f.name


COMMITTED_PAGES = (sorted(REPO.glob("results/**/index.html"))
                   + sorted(REPO.glob("results/**/report.md")))


@pytest.mark.parametrize("page", COMMITTED_PAGES,
                         ids=lambda p: str(p.relative_to(REPO / "results")))
def test_committed_report_pages_link_only_files_that_exist(page):
    """Every figures/... link or image of a committed report page names a file next to it."""
    text = page.read_text(encoding="utf-8")
    links = re.findall(r'(?:href|src)="(figures/[^"]+)"',
                       text) + re.findall(r"\]\((figures/[^)]+)\)", text)
    for link in links:
        assert (page.parent / link).is_file(), f"{page}: {link}"


def test_committed_figures_are_palette_pngs():
    """The committed references store figures as figures.save writes them (compact_png), PNG
    only."""
    pngs = sorted(REPO.glob("results/**/*.png"))
    assert len(pngs) > 50 and not list(REPO.glob("results/**/figures/*.svg"))
    for f in pngs:
        assert Image.open(f).mode == "P", f


def test_report_is_deterministic_and_replaced_atomically(golden, tmp_path):
    root, out = golden
    again = report.write_report(root, tmp_path / "again")
    for f in sorted(p.relative_to(out) for p in out.rglob("*") if p.is_file()):
        assert (again / f).read_bytes() == (out / f).read_bytes(), f
    (again / "stale.txt").write_text("from an older report")
    assert report.write_report(root, again) == again
    assert not (again / "stale.txt").exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["again"]  # no temp dirs left behind
    with pytest.raises(ValueError, match="not a report folder"):
        report.write_report(root, root)  # --out pointed at the results must not replace them


def test_nested_runs_and_sanity_comparison(tmp_path):
    root = tmp_path / "results"
    exp = root / "sanity"
    _bundle(exp, "grpo", "bf16", 0, BF16_COLLAPSE, task="sanity_r1d")
    _bundle(exp, "pg_seq_is", "fp16", 0, FP16_S0, task="sanity_r1d")
    # unstable, published: pass
    _bundle(exp, "grpo_token_tis", "fp16", 0, [0.6] * TOTAL, task="sanity_r1d")
    md = (report.write_report(root) / "report.md").read_text()
    assert "sanity/sanity_r1d__grpo__bf16__s0" in md  # nested one level, labelled with its folder
    assert "## Published sanity test (arXiv 2510.26788)" in md
    assert ("| BF16, GRPO (PPO-clip, Dr.GRPO) | collapses; peak train acc ~73% (VeRL) / ~84% (Oat) "
            "| grpo/bf16 | 1 collapse | 0.940 (n=1) | yes |" in md)
    assert ("| FP16, PG-Seq-IS | ~99%, fast and stable | pg_seq_is/fp16 | 1 pass | 1.000 (n=1) "
            "| yes |" in md)
    assert ("| FP16, other algorithms | all FP16 algorithms nearly coincide (~99%) "
            "| grpo_token_tis/fp16 | 1 unstable | 0.600 (n=1) | no |" in md)
    assert "| BF16, GSPO | grad norm NaN after ~1,200 steps (VeRL) | not run | - | - | - |" in md
    # The task is registered (tasks/sanity_r1d.yaml): its rerun command recomposes the recorded
    # config.
    assert "| sanity/sanity_r1d__grpo__bf16__s0 | " in md and "cannot compose today" not in md


def test_empty_and_foreign_directories_give_one_line_errors(tmp_path, capsys):
    from suite.cli import main

    with pytest.raises(ValueError, match="no run directories found"):
        report.write_report(tmp_path)
    (tmp_path / "notes.txt").write_text("hello")
    (tmp_path / "model").mkdir()
    (tmp_path / "model" / "config.json").write_text("{}")  # an HF model folder is not a run
    with pytest.raises(ValueError, match="no run directories found"):
        report.write_report(tmp_path)
    with pytest.raises(ValueError, match="no such directory"):
        report.write_report(tmp_path / "missing")
    assert main(["report", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "no run directories found" in err
    assert not (tmp_path / "report").exists()


COMMITTED_AMX = Path(__file__).parents[1] / "results" / "reference" / "cpu-amx-native" / "sanity"


def test_report_leads_with_its_outcome_and_shows_one_measurement_as_one(tmp_path):
    md = (report.write_report(COMMITTED_AMX, tmp_path / "r") / "report.md").read_text()
    body = md.split("\n\n")
    # The first paragraph after the title and the contents is the generated outcome (outcomes.md's
    # sentence).
    first = next(p for p in body if not p.startswith(("#", "[", "- [")))
    sums = [json.loads(p.read_text()) for p in COMMITTED_AMX.glob("*/summary.json")]
    n = {v: sum(x["verdict"] == v for x in sums) for v in ("pass", "at_line")}
    # at the published 0.95 the references sit on the line (docs/calibration.md)
    assert n["at_line"] > 0
    assert first.startswith(f"Outcome: {n['pass']} of {len(sums)} runs pass the sanity threshold. "
                            f"{n['at_line']} run(s) at the line (the peak within one binomial "
                            "standard error of the threshold")
    # The warnings that do not change the reading come last, compact; here there are no others.
    assert "## Warnings" not in md and md.index("## Notes") > md.index("## Runs")
    # One seed per cell: no interval, IQM or std columns, no column of zeros; values shown as
    # values.
    head = next(line for line in md.splitlines()
                if line.startswith("| task | algorithm | precision |"))
    assert head == ("| task | algorithm | precision | pass | at the line | peak acc | final acc "
                    "| first pass step |")
    # Three algorithms per flow share one step 0 (seed 0): one measurement, no "± 0".
    row = next(line for line in md.splitlines() if line.startswith("| bf16 | 3 | 1 | "))
    assert "±" not in row


def test_outcome_counts_the_seeds_of_each_cell():
    """The lead sentence says how many seeds stand behind a cell: three on the class that has three,
    not "one"."""
    mixed = Path(__file__).parents[1] / "results" / "reference" / "cpu-avx512bf16-mixed" / "sanity"
    text = outcomes.mismatch_lead(mixed)[2]
    assert "60 of 72 runs pass" in text and "11 run(s) at the line" in text
    assert "with three seeds per cell this does not show" in text
    cell = [{"task": "t", "algorithm": "a", "precision": "bf16", "seed": s} for s in (0, 1, 2)]
    lone = [{"task": "t", "algorithm": "a", "precision": "fp16", "seed": 0}]
    assert outcomes._seeds_per_cell(cell) == "three seeds"
    assert outcomes._seeds_per_cell(cell + lone) == "1-3 seeds"
    # a rerun of one seed is not a second seed
    assert outcomes._seeds_per_cell(cell[:1] + cell[:1]) == "one seed"


def test_informative_columns_keep_what_varies():
    head, rows = render.informative_columns(["a", "b", "c", "d"],
                                            [["x", "-", "0", "1"], ["y", "-", "0 (0)", "0"]],
                                            keep=("b",))
    assert head == ["a", "b", "d"] and rows == [["x", "-", "1"], ["y", "-", "0"]]


def test_the_first_screen_is_the_verdict_per_flow_and_algorithm_then_the_reward(golden):
    root, out = golden
    md = (out / "report.md").read_text()
    first_table = md[md.index("| precision flow |"):].split("\n\n")[0].splitlines()
    assert first_table[0] == "| precision flow | grpo | grpo_token_tis |"
    # fp32: 3 pass + 1 unstable; bf16 grpo: a collapse and a failed run (incomplete), token TIS: a
    # pass and a run killed before its summary; fp16 never ran token TIS
    assert "| fp32 | 3/4 pass, 1 unstable | - |" in first_table
    assert "| fp16 | 2/2 pass | - |" in first_table
    assert "| bf16 | 0/2 pass, 1 collapse, 1 incomplete | 1/2 pass, 1 incomplete |" in first_table
    order = [md.index(s)
             for s in ("| precision flow |", "## Training accuracy", "## The runs",
                       "## Verdicts per cell")]
    assert order == sorted(order)
