"""The boards' statistics and sections: rliable's estimates checked by hand, against the exact
bootstrap distribution and against rliable itself; seeds of one experiment made at two commits;
controls, entries that no longer reproduce, the class order; the reported section's sources."""

from __future__ import annotations

import itertools
import json
import math
import shutil

import numpy as np
import pytest
from test_leaderboard import copy_run, edit_json, entries, rehash

from suite.analysis import board, leaderboard, reported, stats
from suite.results import REFERENCE_ROOT, atomic_write_text, read_jsonl

AMX = REFERENCE_ROOT / "cpu-amx-native"
AVX2 = REFERENCE_ROOT / "cpu-avx2-emulated"


# ---- statistics
# ---------------------------------------------------------------------------------------
def test_probability_of_improvement_by_hand():
    # x > y in 4 of the 9 pairs (1>0, 2>0, 3>0, 3>2), tied in 1 (2=2): (4 + 0.5) / 9.
    poi = stats.probability_of_improvement([1.0, 2.0, 3.0], [0.0, 2.0, 5.0])
    assert poi["p"] == pytest.approx(4.5 / 9) and (poi["n_x"], poi["n_y"]) == (3, 3)
    assert 0.0 <= poi["lo"] <= poi["p"] <= poi["hi"] <= 1.0
    assert stats.probability_of_improvement([2.0, 3.0, 4.0], [0.0, 1.0, 1.5])["p"] == 1.0
    # Two tasks: the mean over tasks of the per-task probabilities (1 and 0 here).
    two = stats.probability_of_improvement([[1.0, 0.0], [1.0, 0.0]], [[0.0, 1.0], [0.0, 1.0]])
    assert two["p"] == 0.5
    with pytest.raises(ValueError, match="NaN"):
        stats.probability_of_improvement([1.0, float("nan")], [0.0, 1.0])


def test_exact_permutation_test_by_hand():
    # 3 seeds against 3 fully separated: 1 of the C(6, 3) = 20 splits is as extreme, p = 1/20, which
    # is also the floor of any such test; the bootstrap says P = 1.00 [1.00, 1.00] for the same
    # data.
    got = stats.permutation_test([3.0, 4.0, 5.0], [0.0, 1.0, 2.0])
    assert (got["p"], got["min_p"], got["exact"]) == (0.05, 0.05, True)
    poi = stats.probability_of_improvement([3.0, 4.0, 5.0], [0.0, 1.0, 2.0])
    # the degenerate interval the board must not show as certainty
    assert poi["lo"] == poi["hi"] == 1.0
    assert stats.permutation_test([0.0, 1.0, 2.0], [3.0, 4.0, 5.0])["p"] == 1.0
    # [1, 2, 3] vs [0, 2, 5]: the sum 13 splits into x-sums >= 6 (the observed one) in 13 of 20
    # ways.
    sums = [sum(c) for c in itertools.combinations([1, 2, 3, 0, 2, 5], 3)]
    assert sum(v >= 6 for v in sums) == 13
    assert stats.permutation_test([1.0, 2.0, 3.0], [0.0, 2.0, 5.0])["p"] == pytest.approx(13 / 20)
    # Beyond EXACT_SPLITS the p-value is estimated: two equal samples sit near 0.5, never near 0.
    big = stats.permutation_test(list(range(12)), list(range(12)))
    assert not big["exact"] and 0.4 < big["p"] < 0.65
    with pytest.raises(ValueError, match="finite value"):
        stats.permutation_test([float("nan")], [1.0])


def test_fisher_exact_by_hand():
    assert stats.fisher_exact(3, 3, 0, 3) == pytest.approx(1 / 20)  # C(3,3) C(3,0) / C(6,3)
    assert stats.fisher_exact(2, 3, 0, 3) == pytest.approx(4 / 20)  # C(2,2) C(4,1) / C(6,3)
    assert stats.fisher_exact(3, 3, 3, 3) == 1.0
    with pytest.raises(ValueError, match="passes must lie"):
        stats.fisher_exact(4, 3, 0, 3)


def _ranked(name, finals):
    return {"id": name, "runs": [{"summary": {board.SCORE: v}} for v in finals]}


def test_ranks_order_only_what_the_seeds_separate():
    a = _ranked("a", [0.97, 0.96, 0.97])
    c = _ranked("c", [0.95, 0.90, 0.99])  # the widest: separated from nobody
    b = _ranked("b", [0.93, 0.94, 0.935])  # below a in every seed: p = 0.05
    got = board.tied_ranks([a, c, b])
    assert [(e["id"], e["rank"], e["tied"]) for e in got] == [("a", 1, 2), ("c", 1, 2), ("b", 2, 1)]
    assert b["above"] == ["a"] and a["above"] == c["above"] == []
    # One seed of b above one of a: no longer separated, all three tie.
    b["runs"][0]["summary"][board.SCORE] = 0.975
    assert {e["rank"] for e in board.tied_ranks([a, c, b])} == {1}


def _exact_cdf(values: list[float], x: float, strict: bool) -> float:
    """P(IQM of a resample < x (strict) or <= x): every one of the n^n equally likely resamples."""
    n, hits = len(values), 0
    for idx in itertools.product(range(n), repeat=n):
        v = stats.iqm([values[i] for i in idx])
        hits += (v < x) if strict else (v <= x + 1e-12)
    return hits / n ** n


def _check_against_exact(values, lo, hi, reps):
    # A percentile of `reps` resamples misses the exact quantile by a binomial error: the exact CDF
    # at the returned bound is 0.025 +- 4 sigma, sigma = sqrt(0.025 * 0.975 / reps).
    tol = 4 * math.sqrt(0.025 * 0.975 / reps)
    assert (_exact_cdf(values, lo, strict=False) >= 0.025 - tol
            and _exact_cdf(values, lo, strict=True) <= 0.025 + tol)
    assert (_exact_cdf(values, hi, strict=True) <= 0.975 + tol
            and _exact_cdf(values, hi, strict=False) >= 0.975 - tol)


def test_iqm_interval_matches_the_exact_bootstrap_distribution():
    values = [0.91, 0.94, 0.95, 0.97, 0.99]  # 5^5 = 3,125 resamples, enumerable
    got = stats.iqm_interval(values)
    assert got["iqm"] == pytest.approx(np.mean([0.94, 0.95, 0.97])) and got["n"] == 5
    _check_against_exact(values, got["lo"], got["hi"], stats.BOOT_SAMPLES)
    one = stats.iqm_interval([0.9])
    # one run: a value, never an interval
    assert one == {"iqm": 0.9, "lo": None, "hi": None, "n": 1}


def test_estimates_agree_with_rliable():
    metrics = pytest.importorskip("rliable.metrics")
    rng = np.random.default_rng(0)
    x, y = rng.uniform(0.8, 1.0, size=(5, 1)), rng.uniform(0.8, 1.0, size=(4, 1))
    assert stats.iqm_interval(x)["iqm"] == pytest.approx(metrics.aggregate_iqm(x), rel=1e-12)
    assert stats.probability_of_improvement(x, y)["p"] == pytest.approx(
        metrics.probability_of_improvement(x, y), rel=1e-12)
    # rliable's intervals (rliable.library) need arch < 8, which needs pandas < 3; with this
    # environment's pandas they cannot run, so the intervals are checked against the exact bootstrap
    # distribution above.


# ---- seeds, twins, sections
# --------------------------------------------------------------------------
def test_a_rerun_with_identical_metrics_is_evidence_not_a_seed(tmp_path):
    copy_run(tmp_path / "a")
    old = copy_run(tmp_path / "b")  # the same run as recorded before optim.grad_clip existed
    edit_json(old / "config.json", lambda c: c["config"]["optim"].pop("grad_clip"))
    rehash(old)
    leaderboard.build([tmp_path / "a", tmp_path / "b"], tmp_path / "site")
    data = leaderboard.read_site_data(tmp_path / "site")
    assert data["accepted"] == 1 and data["rejected"] == []
    (e,) = entries(data)
    assert e["seeds"] == 1 and e["runs"][0]["twins"] == [
        {"source": str(old), "git_sha": e["runs"][0]["provenance"]["git_sha"]}]
    assert "byte-identical rerun" in e["reproduction"]["why"]

    # A rerun whose logs differ is not a seed either: refused, saying where the two part.
    rows = read_jsonl(old / "metrics.jsonl")
    rows[2]["loss/policy"] = 123.0  # not in the summary: the bundle itself stays valid
    atomic_write_text(old / "metrics.jsonl", "".join(json.dumps(r) + "\n" for r in rows))
    leaderboard.build([tmp_path / "a", tmp_path / "b"], tmp_path / "site")
    data = leaderboard.read_site_data(tmp_path / "site")
    assert (data["accepted"] == 1
            and "metrics.jsonl differs from step 3" in data["rejected"][0]["reason"])


def test_classes_controls_and_entries_that_no_longer_reproduce(tmp_path):
    for d in ("arith3__grpo__fp16__s0", "arith3__grpo__exact__s0"):
        for src in (AMX / "sanity" / d, AVX2 / "sanity" / d):
            shutil.copytree(src, tmp_path / src.parent.parent.name / d)
    for s in (1, 2):  # trainer-controls fills grpo x fp16 to three seeds on cpu-amx-native
        shutil.copytree(AMX / "trainer-controls" / f"arith3__grpo__fp16__s{s}",
                        tmp_path / "cpu-amx-native" / f"tc{s}")
    # declares the class
    shutil.copy(AVX2 / "reference.json", tmp_path / "cpu-avx2-emulated" / "reference.json")
    leaderboard.build([tmp_path / "cpu-amx-native", tmp_path / "cpu-avx2-emulated"],
                      tmp_path / "site")
    data = leaderboard.read_site_data(tmp_path / "site")
    assert data["rejected"] == []
    # most reproducible first
    assert [c["id"] for c in data["classes"]] == ["cpu-amx-native", "cpu-avx2-emulated"]
    amx, avx2 = ((c["boards"][0]) for c in data["classes"])
    (fp16,) = amx["ranked"]
    assert (fp16["precision"], fp16["seeds"], fp16["rank"]) == ("fp16", 3, 1)
    assert (fp16["reproduction"]["status"] == "pinned"
            and fp16["improvement"]["why"] == "the fp16 baseline itself")
    assert [e["precision"]
            for e in amx["controls"]] == ["exact"] and amx["controls"][0]["rank"] is None
    assert "bitwise on-policy" in amx["controls"][0]["why"]
    assert avx2["ranked"] == [] and [e["precision"] for e in avx2["stale"]] == ["fp16"]
    assert ("no longer reproduces" in avx2["stale"][0]["why"]
            and "own stream" in avx2["stale"][0]["why"])
    assert [e["precision"] for e in avx2["controls"]] == ["exact"]


def test_reproduction_status_reads_the_references(tmp_path):
    (tmp_path / "cls").mkdir()
    assert board.reproduction("cls", "bf16", tmp_path)["status"] == "unchecked"
    (tmp_path / "cls" / "fingerprint.json").write_text(json.dumps({"flows": {"bf16": {}}}))
    assert board.reproduction("cls", "bf16", tmp_path)["status"] == "pinned"
    assert board.reproduction("cls", "fp8", tmp_path)["status"] == "unchecked"
    changed = {"numerics_changed_since": {"fp8, bf16": "x moved"}}
    (tmp_path / "cls" / "reference.json").write_text(json.dumps(changed))
    assert board.reproduction("cls", "bf16", tmp_path) == {
        "status": "stale", "why": "no longer reproduces with today's code: x moved"}


# ---- the reported section
# -----------------------------------------------------------------------------
def test_reported_entries_carry_their_sources():
    got = reported.load()
    assert len(got) >= 5 and len({r["id"] for r in got}) == len(got)
    for r in got:
        assert (r["url"].startswith("https://") and r["where"] and r["quote"]
                and r["status"] == "reported, unverified")
    assert any("0.0005" in r["quote"] for r in got)  # prime-rl's mismatch KL gate, as written


def test_an_unsourced_reported_entry_is_refused(tmp_path):
    path = tmp_path / "reported.yaml"
    path.write_text("- {id: x, source: s, url: 'http://insecure', where: w, quote: q, kind: "
                    "result, precision: p, measures: m, compare: c}\n")
    with pytest.raises(ValueError, match="https"):
        reported.load(path)
    path.write_text("- {id: x, source: s, url: 'https://a', quote: q, kind: result, precision: p, "
                    "measures: m, compare: c}\n")
    with pytest.raises(ValueError, match="lacks where"):
        reported.load(path)


def test_an_entry_says_what_its_algorithm_computes_with_the_knobs_it_recorded():
    """The leaderboard shows grpo as "not verl's and TRL's GRPO" (docs/algorithms.md) unless the run
    set the knobs that make it theirs; a name today's table lacks gets nothing rather than a
    guess."""
    plain = board.algorithm_words({"algorithm": "grpo", "algo": {"C": None, "agg": None}})
    assert (plain["elsewhere"].startswith("NOT verl's and TRL's GRPO")
            and "clip-higher" in plain["words"])
    theirs = board.algorithm_words({"algorithm": "grpo",
                                    "algo": {"advantage": "std", "clip_high": 0.2,
                                                                  "agg": "token-mean"}})
    assert theirs["elsewhere"] == "" and "[0.8, 1.2]" in theirs["words"]
    assert board.algorithm_words({"algorithm": "ppo_from_elsewhere"}) is None


def test_the_board_says_where_it_reverses_ties_or_agrees_with_the_literature():
    def entry(flow, finals):
        e = _ranked(flow, finals)
        return {**e, "precision": flow, "algorithm": "grpo", "model": "embedded"}

    bf16, fp16 = entry("bf16", [0.97, 0.96, 0.97]), entry("fp16", [0.93, 0.94, 0.935])
    (got,) = board.literature(board.tied_ranks([bf16, fp16]))
    assert got["verdict"] == "reverses" and got["source"] == "precision-rl-fp16"
    assert "puts bf16 above fp16 (exact p = 0.05)" in got["text"]
    fp16["runs"][0]["summary"][board.SCORE] = 0.99  # one fp16 seed above every bf16 seed: a tie
    (got,) = board.literature(board.tied_ranks([bf16, fp16]))
    assert got["verdict"] == "ties" and "3 vs 3 seeds" in got["text"]
    fp16["runs"] = [{"summary": {board.SCORE: v}} for v in (0.99, 0.985, 0.995)]
    (got,) = board.literature(board.tied_ranks([bf16, fp16]))
    assert got["verdict"] == "agrees"
    # Different ranks are not a verdict: fp16 and bf16 each tied with a third, not separated from
    # each other.
    mid = entry("fp32", [0.95, 0.955, 0.96])
    fp16["runs"] = [{"summary": {board.SCORE: v}} for v in (0.94, 0.99, 0.985)]
    bf16["runs"] = [{"summary": {board.SCORE: v}} for v in (0.93, 0.97, 0.92)]
    ranked = board.tied_ranks([fp16, mid, bf16])
    (got,) = board.literature(ranked)
    assert got["verdict"] == "ties"
    assert {s for s in (r["id"] for r in reported.load())} >= {e[2] for e in board.LITERATURE}
