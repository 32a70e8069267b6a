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
    """(mean, sample std with ddof=1) of the finite values; (None, None) when empty, std None for one."""
    xs = finite(values)
    if not xs:
        return None, None
    a = np.asarray(xs)
    return float(a.mean()), (float(a.std(ddof=1)) if len(xs) > 1 else None)


def iqm(values) -> float | None:
    """Interquartile mean: mean after dropping floor(n/4) values at each end (rliable's trim_mean(0.25))."""
    xs = sorted(finite(values))
    if not xs:
        return None
    cut = len(xs) // 4
    return float(np.mean(xs[cut:len(xs) - cut]))


def median(values) -> float | None:
    """Median of the finite values (the mean of the middle two for an even count); None when empty."""
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
    """Percentile-bootstrap `level` interval of `stat` over the finite values; None for fewer than 2.

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
        raise ValueError(f"bootstrap_band: curves must be (S, T) with S >= 1, got shape {curves.shape}")
    if curves.shape[0] == 1:
        return curves[0].copy(), curves[0].copy()
    rng = np.random.default_rng(seed)
    idx = rng.integers(0, curves.shape[0], size=(n_boot, curves.shape[0]))  # (n_boot, S)
    boots = curves[idx].mean(axis=1)  # (n_boot, T)
    lo, hi = np.quantile(boots, [(1 - level) / 2, (1 + level) / 2], axis=0)
    return lo, hi


def trailing_mean(values, w: int) -> np.ndarray:
    """Trailing moving average over full windows: out[i] = mean(values[i-w+1 .. i]), NaN for i < w-1.

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
