"""The run bundle: one directory per run, and the only thing reports read.

Layout (rliable/openrlbenchmark conventions; run names follow cleanrl's `env__algo__seed`):

    <out>/<name>/<task>__<algorithm>__<precision>__s<seed>/
        config.json     the resolved config, exactly what ran
        metrics.jsonl   one JSON object per RL step, appended as training goes
        summary.json    `summarize(metrics)`: peak/final accuracy, mismatch, verdict
        env.json        `env_info(...)` (suite/rl/env_record.py): git sha + dirty flag, versions,
                        hardware, dtypes

A committed reference may hold ``metrics.jsonl.tar.xz`` or ``metrics.jsonl.xz`` (and the other
per-step logs) in the place of the plain file (suite/packed.py); every reader here takes any form.

Reports and the leaderboard are pure functions of these four files, so every file is
self-describing (`schema_version`) and written so that a kill at any instant leaves
either the old or the new content, never half of it:

- whole files go through `atomic_write_*`: temp file in the same directory, flush,
  fsync, `os.replace` (atomic on POSIX when source and target share a filesystem);
- the metrics log is append-only; a kill mid-append can tear only the last line, so
  `read_jsonl` drops an unparsable final line, and a resumed run calls
  `truncate_jsonl(path, checkpoint_step)` to forget steps the checkpoint does not hold.

NaN: grad norms are NaN on a skipped fp16 step and windows can be empty, so JSON here
is written with `allow_nan=True`. Python's `json` then emits the bare tokens `NaN`,
`Infinity`, `-Infinity`. They are not strict RFC 8259 JSON, but Python's `json`,
pandas and JavaScript's JSON5 read them back; strict parsers (`jq`, `JSON.parse`) do
not. `summarize` itself writes None (JSON null) for "no data", so NaN in a summary
means a NaN was measured.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import re
import subprocess
import tempfile
from pathlib import Path

from suite.locations import reference_root
from suite.packed import read_jsonl, read_log, run_file  # noqa: F401 -- read_jsonl re-exported

SCHEMA_VERSION = 1

RUN_FILES = ("config.json", "metrics.jsonl", "summary.json", "env.json")
RUN_NAME = re.compile(r"^(?P<task>.+?)__(?P<algorithm>.+?)__(?P<precision>.+?)__s(?P<seed>\d+)$")

# Keys of a run's config that say where results go (and which trackers mirror them), over how many
# ranks, and how memory and time are traded (options tested to leave every number as it is;
# defer_grad_sync, like nproc, changes only the order in which the ranks' gradients are summed),
# where task files are found, not what runs; they do not enter `config_hash`, so the same experiment
# written to two places, or resumed with another world size (suite/dist.py), hashes the same.
LOCATION_KEYS = ("out", "name", "nproc", "nnodes", "logger", "reward_workers", "keep_last",
                 "gradient_checkpointing", "logprob_chunk", "include_path", "plan",
                 "defer_grad_sync")
# Committed reference results, one folder per machine class (suite/analysis/reproduce.py); runs
# never write there. The clone's results/reference, SUITE_REFERENCE_ROOT, or ./results/reference for
# an installed wheel (suite/locations.py).
REFERENCE_ROOT = reference_root()

PEAK_WINDOW = 5  # w: steps in the trailing moving average used for peak and first pass
MIN_FINAL_WINDOW = 5  # W = max(5, total_steps // 10): the final-accuracy window
# A run shorter than a peak window plus a final window compares its best with itself: no verdict (a
# 4-step smoke run is no collapse, whatever its reward did).
MIN_JUDGED_STEPS = PEAK_WINDOW + MIN_FINAL_WINDOW
# A peak within one binomial standard error of the line, over the peak window's samples (640 at the
# small tier: 0.0086 at a line of 0.95, about 5 samples), is decided by a few samples: "at_line",
# not a verdict either way.
AT_LINE_SE = 1.0

VERDICT_RULE = (
    "acc_t = trailing mean of reward/mean over w = min(5, steps_done) steps; "
    "peak = max_t acc_t; final = mean of reward/mean over the last W = min(max(5, total_steps // "
    "10), steps_done) steps; initial = reward/mean of the first step. "
    "incomplete: an error was recorded or steps_done < total_steps. "
    "too_short: complete, but total_steps < 10, too few for a peak window and a final window that "
    "do not overlap: too short to judge. "
    "band = one binomial standard error of an accuracy at the threshold over the peak window's "
    "samples (w x prompts x samples per prompt). "
    "at_line: final >= threshold - 0.05 and |peak - threshold| <= band, and no collapse: the peak "
    "decides and a few samples would flip it, so no verdict either way. "
    "pass: otherwise, peak > threshold and final >= threshold - 0.05. "
    "collapse: otherwise, final <= peak - 0.25 or final < initial - 0.1 (fell far from its best or "
    "below where it started). unstable: otherwise (completed without passing and without "
    "collapsing: never held the pass threshold)."
)


# ----------------------------------------------------------------------------
# Naming


def display_path(path) -> str:
    """``path`` relative to the working directory when it is below it, else to the clone (committed
    results are named ``results/reference/...`` wherever they were generated): no machine-specific
    prefix in text."""
    from suite.locations import CHECKOUT

    for base in (Path.cwd(), CHECKOUT):
        if base is not None and Path(path).resolve().is_relative_to(base.resolve()):
            return str(Path(path).resolve().relative_to(base.resolve()))
    return str(path)


def run_dir_name(task: str, algorithm: str, precision: str, seed: int) -> str:
    """`<task>__<algorithm>__<precision>__s<seed>`, e.g. `math_1460__grpo__bf16__s0`."""
    for field, value in (("task", task), ("algorithm", algorithm), ("precision", precision)):
        # "__" separates the parts and "/" would make a subdirectory; either would make
        # the name ambiguous for anyone reading a results tree by eye or by script.
        if not value or "__" in value or "/" in value or os.sep in value:
            raise ValueError(f"run_dir_name: {field}={value!r} must be non-empty and contain no "
                             "'__' or '/'")
    if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
        raise ValueError(f"run_dir_name: seed={seed!r} must be a non-negative int")
    return f"{task}__{algorithm}__{precision}__s{seed}"


# ----------------------------------------------------------------------------
# Atomic I/O


def atomic_write_bytes(path, data: bytes) -> None:
    """Write `data` to `path` so readers see the old file or the new one, never a mix."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    # Same directory as the target: os.replace is only atomic within one filesystem.
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())  # data on disk before the rename makes it visible
            if hasattr(os, "fchmod"):
                os.fchmod(f.fileno(), 0o644)  # mkstemp creates 0600; results are meant to be shared
        os.replace(tmp, path)
    except BaseException:
        # Also on KeyboardInterrupt: never leave `.name.xxxx.tmp` litter next to results.
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise
    _fsync_dir(path.parent)


def atomic_write_text(path, text: str) -> None:
    atomic_write_bytes(path, text.encode("utf-8"))


def atomic_write_json(path, obj) -> None:
    """Pretty, key-sorted JSON (stable diffs); NaN/inf written as `NaN`/`Infinity` (see module
    doc)."""
    atomic_write_text(path, json.dumps(obj, indent=2, sort_keys=True, allow_nan=True) + "\n")


def _fsync_dir(directory: Path) -> None:
    # Makes the rename itself durable across a power loss; best effort, since some
    # filesystems and platforms refuse to open or fsync a directory.
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def _jsonl_line(row: dict) -> str:
    # No indent, so json escapes any newline inside strings: one row is one line.
    return json.dumps(row, sort_keys=True, allow_nan=True) + "\n"


def append_jsonl(path, row: dict) -> None:
    """Append one row as one line, flushed and fsynced (a kill can tear only this line)."""
    if not isinstance(row, dict):
        raise TypeError(f"append_jsonl: row must be a dict, got {type(row).__name__}")
    line = _jsonl_line(row)  # serialise first, so a bad value raises before the file is touched
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a", encoding="utf-8") as f:
        f.write(line)
        f.flush()
        os.fsync(f.fileno())


def truncate_jsonl(path, max_step: int) -> int:
    """Atomically rewrite `path` keeping rows with row["step"] <= max_step (and dropping a
    torn last line). Used on resume so the log matches the checkpoint. Returns rows kept."""
    path = Path(path)
    rows = read_jsonl(path)
    kept = []
    for n, row in enumerate(rows, start=1):
        if "step" not in row:
            raise ValueError(f"{path}: row {n} has no 'step' key, cannot truncate by step")
        if row["step"] <= max_step:
            kept.append(row)
    atomic_write_text(path, "".join(_jsonl_line(r) for r in kept))
    return len(kept)


# ----------------------------------------------------------------------------
# Identity of a run: what ran and where


def config_hash(cfg: dict) -> str:
    """First 16 hex digits of sha256 over the canonical JSON of `cfg` (keys sorted at every
    level, compact separators), with the top-level `out` and `name` keys removed. Only the
    top level: a nested `model.name` is part of what runs. Note 1 and 1.0 hash differently."""
    if not isinstance(cfg, dict):
        raise TypeError(f"config_hash: cfg must be a dict, got {type(cfg).__name__}")
    what_runs = {k: v for k, v in cfg.items() if k not in LOCATION_KEYS}
    # default=str so a Path or an enum in a resolved config hashes by its text.
    canonical = json.dumps(what_runs, sort_keys=True, separators=(",", ":"), ensure_ascii=True,
                           allow_nan=True, default=str)
    return hashlib.sha256(canonical.encode("utf-8")).hexdigest()[:16]


def git(*args: str, cwd: Path | None = None) -> str | None:
    """stdout of `git <args>` (stripped) run in ``cwd`` (default: this file's directory), or None on
    any failure."""
    try:
        out = subprocess.run(
            ["git", *args], cwd=cwd or Path(__file__).resolve().parent,
            capture_output=True, text=True, timeout=10, check=True,
        )
    except (OSError, subprocess.SubprocessError):  # git missing, not a repo, hung
        return None
    return out.stdout.strip()


# ----------------------------------------------------------------------------
# Summary and verdict


def _mean(values: list[float]) -> float | None:
    return sum(values) / len(values) if values else None


def _finite(x) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


def summarize(rows: list[dict], *, total_steps: int, threshold: float = 0.95,
              error: str | None = None, samples_per_step: int | None = None) -> dict:
    """Summary of one run from its per-step metric rows.

    Each row has `step` (1-based) and `reward/mean` (training accuracy of that step's
    batch), optionally `mismatch/*`, `train/grad_norm` (NaN on a skipped fp16 step),
    `train/skipped_steps` (cumulative), `time/step_s`. Rows are ordered by step; if a
    step appears twice (a resume that did not truncate) the later row wins.

    Accuracy: `accuracy/peak` is the maximum over steps of the trailing moving average of
    reward/mean over w = min(5, steps_done) steps, `accuracy/peak_step` the last step of
    that window (earliest on ties); `accuracy/first_pass_step` the first step whose moving
    average exceeds `threshold`; `accuracy/final` the mean over the last
    W = min(max(5, total_steps // 10), steps_done) steps; `accuracy/initial` the first
    step's reward/mean. Mismatch: `mismatch/step0/<k>` is the first row's `mismatch/<k>`
    (measured before the first update, so it is the step-0 mismatch) and
    `mismatch/final/<k>` its mean over the final window.

    Verdict (also in VERDICT_RULE, which reports print):
      incomplete  an error was recorded or steps_done < total_steps (or no rows);
      too_short   total_steps < MIN_JUDGED_STEPS;
      at_line final >= threshold - 0.05 and the peak within `accuracy/line_band` (AT_LINE_SE
      binomial
                  standard errors at the threshold over the peak window's w x samples_per_step
                  samples) of the threshold, and no collapse; without samples_per_step (an outside
                  loop's bundle) no band;
      pass        peak > threshold and final >= threshold - 0.05;
      collapse    otherwise, final <= peak - 0.25 or final < initial - 0.1;
      unstable    otherwise: completed, never held the pass threshold, did not collapse.

    Values with no data (no rows, key never logged) are None rather than NaN; a NaN in
    the output means a NaN was measured (e.g. a mismatch metric that overflowed).
    """
    if isinstance(total_steps, bool) or not isinstance(total_steps, int) or total_steps < 1:
        raise ValueError(f"summarize: total_steps={total_steps!r} must be an int >= 1")
    by_step = {}
    for n, row in enumerate(rows, start=1):
        if "step" not in row or "reward/mean" not in row:
            raise ValueError(f"summarize: row {n} lacks 'step' or 'reward/mean' (keys: "
                             f"{sorted(row)})")
        by_step[row["step"]] = row
    rows = [by_step[s] for s in sorted(by_step)]
    steps = [int(r["step"]) for r in rows]
    rewards = [float(r["reward/mean"]) for r in rows]
    n = len(rows)

    # Trailing moving average over full windows only, so early steps cannot "pass" on one
    # lucky batch. moving[i] ends at rows[i + w - 1].
    w = min(PEAK_WINDOW, n)
    moving = [sum(rewards[i:i + w]) / w for i in range(n - w + 1)] if n else []
    peak = max(moving) if moving else None
    peak_step = steps[moving.index(peak) + w - 1] if moving else None
    first_pass_step = next((steps[i + w - 1] for i, m in enumerate(moving) if m > threshold), None)

    big_w = min(max(MIN_FINAL_WINDOW, total_steps // 10), n)
    final_rows = rows[n - big_w:] if n else []
    final = _mean(rewards[n - big_w:]) if n else None
    initial = rewards[0] if n else None

    summary = {
        "schema_version": SCHEMA_VERSION,
        "steps_done": n,
        "total_steps": total_steps,
        "threshold": threshold,
        "accuracy/peak": peak,
        "accuracy/peak_step": peak_step,
        "accuracy/peak_window": w,
        "accuracy/final": final,
        "accuracy/final_window": big_w,
        "accuracy/initial": initial,
        "accuracy/first_pass_step": first_pass_step,
    }

    # Mismatch: every key logged under mismatch/, whatever the metrics module emits.
    # Missing values are skipped; a measured NaN/inf is kept so it shows in the report.
    mismatch_keys = sorted({k for r in rows for k in r if k.startswith("mismatch/")})
    for key in mismatch_keys:
        name = key[len("mismatch/"):]
        summary[f"mismatch/step0/{name}"] = rows[0].get(key)
        summary[f"mismatch/final/{name}"] = _mean([r[key] for r in final_rows
                                                   if r.get(key) is not None])

    skipped = [r["train/skipped_steps"] for r in rows if r.get("train/skipped_steps") is not None]
    grad_norms = [r["train/grad_norm"] for r in rows if "train/grad_norm" in r]
    step_times = [r["time/step_s"] for r in rows if r.get("time/step_s") is not None]
    summary["train/skipped_steps"] = skipped[-1] if skipped else None
    # A None grad norm also means "no finite norm" (some writers turn NaN into null).
    summary["train/nan_grad_steps"] = sum(1 for g in grad_norms if not _finite(g))
    summary["time/total_s"] = sum(step_times) if step_times else None

    band = (AT_LINE_SE * math.sqrt(threshold * (1 - threshold) / (w * samples_per_step))
            if samples_per_step and w and 0 < threshold < 1 else None)
    summary["accuracy/line_band"] = band
    summary["verdict"] = _verdict(n, total_steps, threshold, error, peak, final, initial, band)
    summary["verdict_rule"] = VERDICT_RULE
    summary["error"] = error
    return summary


def _verdict(steps_done, total_steps, threshold, error, peak, final, initial, band=None) -> str:
    if error is not None or steps_done == 0 or steps_done < total_steps:
        return "incomplete"
    if total_steps < MIN_JUDGED_STEPS:
        return "too_short"
    collapse = final <= peak - 0.25 or final < initial - 0.1
    if (final >= threshold - 0.05 and band is not None and abs(peak - threshold) <= band
            and not collapse):
        return "at_line"
    if peak > threshold and final >= threshold - 0.05:
        return "pass"
    return "collapse" if collapse else "unstable"


def samples_per_step(config: dict) -> int | None:
    """Samples a step's accuracy is measured on (prompts x samples per prompt); None when the config
    lacks them."""
    p, k = config.get("prompts_per_step"), config.get("samples_per_prompt")
    return p * k if isinstance(p, int) and isinstance(k, int) else None


def write_summary(run_dir, config: dict, error: str | None = None) -> dict:
    """Write ``summary.json`` of a run directory: ``summarize`` over metrics.jsonl merged with
    timing.jsonl (by step), plus the run's identity from its config dict. The suite's loop and the
    writer for outside loops (suite/analysis/bundle.py) both end a run here, and the leaderboard
    recomputes the same thing, so a summary is a pure function of the per-step rows and the
    config."""
    run_dir = Path(run_dir)
    rows = read_log(run_dir, "metrics.jsonl", missing_ok=True)
    timing = {r["step"]: r for r in read_log(run_dir, "timing.jsonl", missing_ok=True)}
    merged = [{**r, **timing.get(r["step"], {})} for r in rows]
    summary = summarize(merged, total_steps=config["steps"],
                        threshold=config.get("threshold", 0.95), error=error,
                        samples_per_step=samples_per_step(config))
    summary.update({"run": run_dir.name,
                    **{k: config.get(k)
                       for k in ("task", "algorithm", "precision", "seed", "tier")},
                    "config_hash": config_hash(config)})
    atomic_write_json(run_dir / "summary.json", summary)
    return summary


# ----------------------------------------------------------------------------
# Reading a run back


def load_run(run_dir) -> dict:
    """{"config", "summary", "env", "metrics"} of one run directory.

    Raises FileNotFoundError naming every missing file, ValueError naming a file that is
    not valid JSON or was written by a newer schema than this code reads."""
    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        raise FileNotFoundError(f"load_run: run directory {run_dir} does not exist")
    missing = [f for f in RUN_FILES if run_file(run_dir, f) is None]  # metrics.jsonl may be .xz
    if missing:
        raise FileNotFoundError(f"load_run: {run_dir} is missing {', '.join(missing)}")
    out = {}
    for key in ("config", "summary", "env"):
        path = run_dir / f"{key}.json"
        try:
            out[key] = json.loads(path.read_text(encoding="utf-8"))
        except ValueError as e:
            raise ValueError(f"load_run: {path} is not valid JSON ({e})") from e
    for key in ("summary", "env"):
        version = out[key].get("schema_version") if isinstance(out[key], dict) else None
        if not isinstance(version, int) or version > SCHEMA_VERSION:
            raise ValueError(f"load_run: {run_dir / (key + '.json')} has "
                             f"schema_version={version!r}; this code reads versions <= "
                             f"{SCHEMA_VERSION}")
    out["metrics"] = read_jsonl(run_dir / "metrics.jsonl")
    return out


# ---- which directories are runs -------------------------------------------------------------
def _is_run_dir(d: Path) -> bool:
    return bool(RUN_NAME.match(d.name)) and any(run_file(d, f) for f in (*RUN_FILES, "error.txt"))


def find_run_dirs(root: Path, depth: int = 3) -> list[Path]:
    """Run directories in `root` and up to two levels below it (hidden directories skipped), in path
    order: a grid's runs, a grid of experiments (``collapse-search/<regime>/<run>``) and a grid of
    two knobs (``src-top-p/<regime>/<truncation>/<run>``). A run directory is not searched
    further."""
    root = Path(root)
    if not root.is_dir() or depth == 0:
        return []
    out = []
    for d in sorted(p for p in root.iterdir() if p.is_dir() and not p.name.startswith(".")):
        out += [d] if _is_run_dir(d) else find_run_dirs(d, depth - 1)
    return out
