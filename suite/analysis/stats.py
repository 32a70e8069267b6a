"""Across-seed statistics for reports: pure functions of plain lists and arrays.

Conventions (rliable, arXiv 2108.13264, and openrlbenchmark):
- mean +/- std of one number per seed; std is the *sample* std (ddof=1), so a cell with
  one seed has no std (None) rather than a misleading 0;
- IQM, the interquartile mean: drop floor(n/4) values at each end of the sorted sample
  and average the rest (`scipy.stats.trim_mean(x, 0.25)`, which rliable uses);
- percentile-bootstrap confidence intervals with a fixed seed, so a report is a pure
  function of its inputs. With n seeds the bootstrap only sees those n values: for n = 2
  the 95% interval of the mean is [min, max]. It describes seed spread, not a guarantee.

Missing values (None, NaN, inf) are dropped before any statistic: a run that logged no
value must not pull a mean to NaN, and the count `n` that reports print says how many
values remained.
"""

from __future__ import annotations

import itertools
import math

import numpy as np

BOOT_SEED = 0  # fixed: the same results always give the same intervals
BOOT_SAMPLES = 10_000
LEVEL = 0.95


def finite(values) -> list[float]:
    """The finite numbers of `values` as floats (None, NaN, inf and non-numbers dropped)."""
    out = []
    for v in values:
        if isinstance(v, bool) or not isinstance(v, (int, float)):
            continue
        if math.isfinite(v):
            out.append(float(v))
    return out


def mean_std(values) -> tuple[float | None, float | None]:
    """(mean, sample std with ddof=1) of the finite values; (None, None) when empty, std None for
    one."""
    xs = finite(values)
    if not xs:
        return None, None
    a = np.asarray(xs)
    return float(a.mean()), (float(a.std(ddof=1)) if len(xs) > 1 else None)


def iqm(values) -> float | None:
    """Interquartile mean: mean after dropping floor(n/4) values at each end (rliable's
    trim_mean(0.25))."""
    xs = sorted(finite(values))
    if not xs:
        return None
    cut = len(xs) // 4
    return float(np.mean(xs[cut:len(xs) - cut]))


def median(values) -> float | None:
    """Median of the finite values (the mean of the middle two for an even count); None when
    empty."""
    xs = finite(values)
    return float(np.median(xs)) if xs else None


def _stat(a: np.ndarray, stat: str) -> np.ndarray:
    """`stat` ('mean' or 'iqm') along the last axis of a (..., n) array."""
    if stat == "mean":
        return a.mean(axis=-1)
    if stat == "iqm":
        n = a.shape[-1]
        cut = n // 4
        return np.sort(a, axis=-1)[..., cut:n - cut].mean(axis=-1)
    raise ValueError(f"stat={stat!r}: must be 'mean' or 'iqm'")


def bootstrap_ci(values, stat: str = "mean", n_boot: int = BOOT_SAMPLES, level: float = LEVEL,
                 seed: int = BOOT_SEED) -> tuple[float, float] | None:
    """Percentile-bootstrap `level` interval of `stat` over the finite values; None for fewer than
    2.

    Resamples the n values with replacement `n_boot` times (numpy default_rng(seed)), takes
    `stat` of each resample and returns the (1-level)/2 and (1+level)/2 quantiles.
    """
    xs = finite(values)
    if len(xs) < 2:
        return None
    a = np.asarray(xs)
    rng = np.random.default_rng(seed)
    idx = rng.integers(0, len(a), size=(n_boot, len(a)))  # (n_boot, n)
    boots = _stat(a[idx], stat)  # (n_boot,)
    lo, hi = np.quantile(boots, [(1 - level) / 2, (1 + level) / 2])
    return float(lo), float(hi)


def bootstrap_band(curves: np.ndarray, n_boot: int = 2_000, level: float = LEVEL,
                   seed: int = BOOT_SEED) -> tuple[np.ndarray, np.ndarray]:
    """Pointwise bootstrap band of the across-seed mean curve.

    curves: (S, T), one row per seed on a shared step axis. Seeds (whole rows) are resampled,
    so the band reflects seed-to-seed variation at each step. Returns (lo, hi), each (T,);
    with one seed both equal that seed's curve.
    """
    curves = np.asarray(curves, dtype=float)
    if curves.ndim != 2 or curves.shape[0] == 0:
        raise ValueError("bootstrap_band: curves must be (S, T) with S >= 1, got shape "
                         f"{curves.shape}")
    if curves.shape[0] == 1:
        return curves[0].copy(), curves[0].copy()
    rng = np.random.default_rng(seed)
    idx = rng.integers(0, curves.shape[0], size=(n_boot, curves.shape[0]))  # (n_boot, S)
    boots = curves[idx].mean(axis=1)  # (n_boot, T)
    lo, hi = np.quantile(boots, [(1 - level) / 2, (1 + level) / 2], axis=0)
    return lo, hi


def trailing_mean(values, w: int) -> np.ndarray:
    """Trailing moving average over full windows: out[i] = mean(values[i-w+1 .. i]), NaN for i <
    w-1.

    The same smoothing as the verdict rule's acc_t (suite.results.summarize), so a reward
    curve's maximum is the run's reported peak. Non-finite values inside a window are
    skipped (a mismatch metric is NaN on an empty batch); an all-NaN window gives NaN.
    """
    if w < 1:
        raise ValueError(f"trailing_mean: w={w} must be >= 1")
    a = np.asarray(values, dtype=float)
    a = np.where(np.isfinite(a), a, np.nan)
    out = np.full(a.shape, np.nan)
    if len(a) >= w:
        win = np.lib.stride_tricks.sliding_window_view(a, w)  # (len - w + 1, w)
        counts = np.isfinite(win).sum(axis=1)
        sums = np.nansum(win, axis=1)
        out[w - 1:] = np.where(counts > 0, sums / np.maximum(counts, 1), np.nan)
    return out


# ---------------------------------------------------------------------------- rliable's aggregate
# estimates Agarwal et al. 2021, "Deep RL at the Edge of the Statistical Precipice" (arXiv
# 2108.13264), as its library rliable computes them: scores are a (runs, tasks) matrix; the IQM is
# taken over all its entries; intervals come from a *stratified* bootstrap that resamples runs
# within each task (the tasks stay fixed: the question is "what if the seeds were different"); the
# probability of improvement P(X > Y) is the Mann-Whitney U statistic over all run pairs, averaged
# over tasks, its interval from resampling X and Y independently (rliable's
# StratifiedIndependentBootstrap). A leaderboard board has one task, so each matrix has one column;
# the code does not assume it.


def _matrix(scores) -> np.ndarray:
    """(runs, tasks) float array from a list of numbers (one task) or a list of rows; non-finite
    values are refused here (drop them with `finite` first: a NaN would silently poison every
    resample)."""
    a = np.asarray(scores, dtype=float)
    if a.ndim == 1:
        a = a[:, None]
    if a.ndim != 2 or a.shape[0] == 0 or a.shape[1] == 0:
        raise ValueError(f"scores must be (runs, tasks) with at least one run, got shape {a.shape}")
    if not np.isfinite(a).all():
        raise ValueError("scores hold NaN or inf: drop missing runs before aggregating")
    return a


def _iqm_rows(a: np.ndarray) -> np.ndarray:
    """IQM of each (runs, tasks) matrix of a (B, runs, tasks) stack, over all of its entries
    (trim_mean 0.25)."""
    return _stat(a.reshape(a.shape[0], -1), "iqm")


def stratified_resample(scores: np.ndarray, n_boot: int, rng: np.random.Generator) -> np.ndarray:
    """(n_boot, runs, tasks): for every task independently, `runs` run indices drawn with
    replacement."""
    runs, tasks = scores.shape
    idx = rng.integers(0, runs, size=(n_boot, runs, tasks))  # (B, R, T)
    return np.take_along_axis(np.broadcast_to(scores, (n_boot, runs, tasks)), idx, axis=1)


def iqm_interval(scores, n_boot: int = BOOT_SAMPLES, level: float = LEVEL,
                 seed: int = BOOT_SEED) -> dict | None:
    """{"iqm", "lo", "hi", "n"}: the IQM of a (runs, tasks) score matrix and its
    stratified-bootstrap percentile interval; None without scores. `n` is the number of runs: with
    fewer than 2 there is no interval (lo = hi = None), and a reader must always see `n` next to
    one."""
    if len(scores) == 0:
        return None
    a = _matrix(scores)
    point = float(_iqm_rows(a[None])[0])
    if a.shape[0] < 2:
        return {"iqm": point, "lo": None, "hi": None, "n": int(a.shape[0])}
    boots = _iqm_rows(stratified_resample(a, n_boot, np.random.default_rng(seed)))
    lo, hi = np.quantile(boots, [(1 - level) / 2, (1 + level) / 2])
    return {"iqm": point, "lo": float(lo), "hi": float(hi), "n": int(a.shape[0])}


def _poi(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """P(X > Y) of (..., R, T) and (..., M, T) stacks: for each task the fraction of run pairs with
    x > y, ties counting one half (Mann-Whitney U / (R M)); then the mean over tasks."""
    gt = (x[..., :, None, :] > y[..., None, :, :]).mean(axis=(-3, -2))  # (..., T)
    eq = (x[..., :, None, :] == y[..., None, :, :]).mean(axis=(-3, -2))
    return (gt + 0.5 * eq).mean(axis=-1)


def probability_of_improvement(x, y, n_boot: int = BOOT_SAMPLES, level: float = LEVEL,
                               seed: int = BOOT_SEED) -> dict:
    """{"p", "lo", "hi", "n_x", "n_y"}: P(X > Y) (rliable.metrics.probability_of_improvement) and
    its interval from resampling the runs of X and of Y independently, each stratified by task."""
    a, b = _matrix(x), _matrix(y)
    if a.shape[1] != b.shape[1]:
        raise ValueError(f"probability_of_improvement: X has {a.shape[1]} tasks, Y {b.shape[1]}")
    rng = np.random.default_rng(seed)
    boots = _poi(stratified_resample(a, n_boot, rng), stratified_resample(b, n_boot, rng))  # (B,)
    lo, hi = np.quantile(boots, [(1 - level) / 2, (1 + level) / 2])
    return {"p": float(_poi(a, b)), "lo": float(lo), "hi": float(hi), "n_x": int(a.shape[0]),
            "n_y": int(b.shape[0])}


# ------------------------------------------------------------------ exact tests for few seeds
# With three seeds a side a bootstrap cannot say more than "the samples do not overlap": every
# resample of two separated samples keeps them separated, so P(X > Y) reads 1.00 [1.00, 1.00], a
# zero-width interval that looks like certainty. Exact tests say what such data can: the smallest
# one-sided p-value of a permutation test with n and m runs is 1 / C(n + m, n), 0.05 for 3 vs 3.
ALPHA = 0.05  # the level at which a board separates two entries (one-sided, each pair on its own)
EXACT_SPLITS = 200_000  # above this many splits the p-value is estimated from random splits


def permutation_test(x, y, seed: int = BOOT_SEED) -> dict:
    """{"p", "min_p", "n_x", "n_y", "exact"}: one-sided Fisher-Pitman permutation test of
    mean(X) > mean(Y).

    p is the fraction of the C(n+m, n) ways of splitting the pooled values into groups of n and m
    whose difference of means is at least the observed one (ties count, so p >= min_p =
    1 / C(n+m, n), and rejecting at p <= alpha is a level-alpha test). Exact up to EXACT_SPLITS
    splits, else estimated from that many random splits with a fixed seed (``exact`` False).
    Non-finite values are dropped first."""
    a, b = np.asarray(finite(x)), np.asarray(finite(y))
    n, m = len(a), len(b)
    if n == 0 or m == 0:
        raise ValueError(f"permutation_test: needs a finite value on each side (got {n} and {m})")
    pooled = np.concatenate([a, b])
    total = math.comb(n + m, n)
    if total <= EXACT_SPLITS:
        rows = np.array(list(itertools.combinations(range(n + m), n)), dtype=np.int64)  # (S, n)
    else:
        rng = np.random.default_rng(seed)
        rows = np.argsort(rng.random((EXACT_SPLITS, n + m)), axis=1)[:, :n]
    in_x = np.zeros((len(rows), n + m), dtype=bool)
    np.put_along_axis(in_x, rows, True, axis=1)
    sum_x = (in_x * pooled).sum(axis=1)  # (S,)
    diff = sum_x / n - (pooled.sum() - sum_x) / m
    observed = a.mean() - b.mean()
    # A split whose difference equals the observed one up to rounding counts as "at least as large".
    tol = 1e-12 * max(1.0, float(np.abs(pooled).max()))
    p = float((diff >= observed - tol).mean())
    return {"p": p, "min_p": 1.0 / total, "n_x": n, "n_y": m, "exact": total <= EXACT_SPLITS}


def fisher_exact(passes_x: int, runs_x: int, passes_y: int, runs_y: int) -> float:
    """One-sided Fisher exact test that X passes more often than Y: the hypergeometric probability
    of X holding at least ``passes_x`` of the passes when all runs are exchangeable."""
    if not (0 <= passes_x <= runs_x and 0 <= passes_y <= runs_y) or runs_x + runs_y == 0:
        raise ValueError(f"fisher_exact: passes must lie in [0, runs] "
                         f"(got {passes_x}/{runs_x} and {passes_y}/{runs_y})")
    k, n = passes_x + passes_y, runs_x + runs_y
    tail = sum(math.comb(k, i) * math.comb(n - k, runs_x - i)
               for i in range(passes_x, min(k, runs_x) + 1))
    return tail / math.comb(n, runs_x)


def separated(x, y, alpha: float = ALPHA) -> bool:
    """Whether the values ``x`` lie above ``y`` at level ``alpha`` (exact permutation test)."""
    return permutation_test(x, y)["p"] <= alpha
