"""The static leaderboard site: a pure function of result bundles.

``suite leaderboard RESULTS_DIR... [--out leaderboard]`` writes ``index.html``, ``app.js``,
``style.css`` (copied from ``suite/analysis/site/``) and ``data.js`` (``window.LEADERBOARD =
{...}``): a script, not JSON fetched at load time, because browsers refuse ``fetch()`` on file://
and the site must work opened from disk with no server and no network.

1. **Validate every bundle first** (``validate_run``). A bundle enters only if its schema
   version is known, its provenance is there (env.json with a git sha, package versions,
   hardware), config.json's hash is the hash of its config, the summary is what
   ``results.summarize`` recomputes from metrics.jsonl + timing.jsonl (as ``train.write_summary``
   does), and the ``suite run key=value ...`` command we print for it recomposes, through
   ``config.load``, to the same config hash (``provenance.check``, shared with the report;
   fields added to the config since the run are shown next to the command). A bundle from an
   outside loop (TRL, verl, ...: ``env.json`` names its ``framework``) cannot be rerun with
   ``suite run``; instead every mismatch number it claims must be recomputable from its per-token
   log-prob evidence or match the framework log it was copied from (``bundle.check``,
   docs/bundle.md). A bundle that fails is rejected with the reason, printed and listed on the
   site; it never enters half-way.
2. **Aggregate seeds, then boards** (suite/analysis/board.py). Runs whose configs differ only in
   ``seed`` form one entry; entries of one setting on one machine class form a board; a board ranks
   only recipes with at least 3 seeds (IQM with stratified-bootstrap intervals, probability of
   improvement over the fp16 baseline: rliable, arXiv 2108.13264), lists the others unranked with
   why, shows controls as controls and entries that no longer reproduce apart. A run repeated from
   another commit with byte-identical metrics is kept as evidence that it reproduces, not as a seed.
   The site also carries the board's version, date and changelog (board_changes.yaml) and the
   published results beside it, reported and unverified (suite/analysis/reported.py).
3. **Write the site into a temporary directory, then swap it in** (``_swap_in``): readers see
   the old site or the new one, and a build that fails leaves the old one untouched.

Escaping: the browser code only ever puts bundle strings in the page with ``textContent``
(or ``new Option``); no HTML is generated here from bundle data, and ``data.js`` is
ASCII-only JSON, so a run, model or host name holding markup shows as text.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import math
import os
import re
import shutil
import tempfile
from pathlib import Path

from suite.analysis import board, bundle, reported, stats
from suite.analysis.run_labels import _env_facts, _hardware_label, _model_label, _precision_label
from suite.numerics import machine
from suite.packed import run_file
from suite.results import (
    SCHEMA_VERSION,
    VERDICT_RULE,
    config_hash,
    read_jsonl,
    samples_per_step,
    summarize,
)
from suite.rl import provenance, transfer

KNOWN_SCHEMAS = (SCHEMA_VERSION,)  # versions whose files this code knows how to read
SITE_DIR = Path(__file__).with_name("site")
SITE_ASSETS = ("index.html", "app.js", "style.css")
DATA_FILE = "data.js"
DATA_PREFIX = "window.LEADERBOARD = "
BUNDLE_FILES = ("config.json", "metrics.jsonl", "timing.jsonl", "summary.json", "env.json")

# Summary keys the summary must agree on with its own recomputation. time/total_s is
# checked too, since it is the cost column. eval/ and transfer/ are written by evaluators
# outside the training loop, so they are not recomputable and are shown as submitted.
CHECKED_PREFIXES = ("accuracy/", "mismatch/")
CHECKED_KEYS = ("verdict", "steps_done", "total_steps", "threshold", "time/total_s")
# what the verdict rule decides (suite/results.py VERDICT_RULE)
RULE_KEYS = ("verdict", "accuracy/line_band")
EXTRA_PREFIXES = ("eval/", "transfer/")
CURVES = {"reward": "reward/mean", "kl_k3": "mismatch/kl_k3",
          "prob_diff": "mismatch/prob_diff/mean"}

CHANGES = Path(__file__).with_name("board_changes.yaml")  # the board's version, date and changelog


class Rejected(ValueError):
    """A bundle that may not enter the leaderboard; the message is the reason."""


# ----------------------------------------------------------------------------
# Finding and validating bundles


def find_bundles(results_dir: Path) -> list[Path]:
    """Run directories under ``results_dir``: the directory itself if it holds a run file, else
    every directory below it holding one (a grid's ``<regime>/<run>``, a submission's
    ``<name>/<run>``); the site's own folders and ``.hydra`` scratch hold none."""
    results_dir = Path(results_dir)
    if not results_dir.is_dir():
        raise ValueError(f"leaderboard: {results_dir} is not a directory")
    if any(run_file(results_dir, f) for f in BUNDLE_FILES):
        return [results_dir]
    return [b for d in sorted(results_dir.iterdir()) if d.is_dir() and not d.name.startswith(".")
            for b in find_bundles(d)]


def _read_json(path: Path):
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:  # ValueError covers JSONDecodeError and bad UTF-8
        raise Rejected(f"{path.name} is not readable JSON ({e})") from None


def validate_run(run_dir: Path) -> dict:
    """The leaderboard record of one run directory, or ``Rejected`` with the first reason."""
    run_dir = Path(run_dir)
    missing = [f for f in BUNDLE_FILES if run_file(run_dir, f) is None]  # a log may be NAME.xz
    if missing:
        raise Rejected(f"missing {', '.join(missing)}")
    summary, env, cfg_file = (_read_json(run_dir / f)
                              for f in ("summary.json", "env.json", "config.json"))
    for name, obj in (("summary.json", summary), ("env.json", env), ("config.json", cfg_file)):
        if not isinstance(obj, dict):
            raise Rejected(f"{name} is not a JSON object")
    for name, obj in (("summary.json", summary), ("env.json", env)):
        if obj.get("schema_version") not in KNOWN_SCHEMAS:
            raise Rejected(f"{name} has schema_version={obj.get('schema_version')!r}; "
                           f"this leaderboard reads {', '.join(map(str, KNOWN_SCHEMAS))}")
    prov = _check_provenance(env)
    cfg, digest = _check_config(cfg_file, summary)
    try:
        rows, timing = read_jsonl(run_dir / "metrics.jsonl"), read_jsonl(run_dir / "timing.jsonl")
    except (OSError, ValueError) as e:
        raise Rejected(str(e)) from None
    recomputed = _check_summary(summary, rows, timing, cfg)
    outside = _check_origin(run_dir, cfg, digest, env, rows)
    extras = {}
    for key, value in summary.items():
        if key.startswith(EXTRA_PREFIXES):
            if value is not None and (isinstance(value, bool)
                                      or not isinstance(value, (int, float))):
                raise Rejected(f"summary.json: {key}={value!r} is not a number")
            extras[key] = value
    tdoc = transfer.load(run_dir)  # suite transfer's lm-eval results, when the run has them
    extras.update(transfer.summary_keys(tdoc))
    cls = machine.of_run(run_dir, env)
    today = board.normalised(cfg, outside["fields_added_since"])  # as today's code composes it
    return {
        "run": run_dir.name,
        "source": str(run_dir),
        "task": cfg["task"], "algorithm": cfg["algorithm"], "seed": cfg["seed"],
        "precision": _precision_label(cfg), "model": _model_label(cfg), "tier": cfg.get("tier"),
        "framework": bundle.framework_label(env),
        "hardware": _hardware_label(env, cls),
        "class": cls, "class_id": (cls or {}).get("id"),
        "group": board.group_key(today, (cls or {}).get("id")),
        "setting": board.setting_key(today, (cls or {}).get("id")),
        "env_facts": _env_facts(env),
        "transfer_flags": transfer.flags_of(tdoc),
        "summary": {**{k: v for k, v in recomputed.items() if k.startswith(CHECKED_PREFIXES)
                       or k in CHECKED_KEYS},
                    "error": summary.get("error"),
                    "train/skipped_steps": recomputed.get("train/skipped_steps"), **extras},
        "curves": {"step": [r["step"] for r in _by_step(rows)],
                   **{name: [_round(r.get(key)) for r in _by_step(rows)]
                      for name, key in CURVES.items()}},
        "provenance": {**prov, "config_hash": digest, **outside},
        "config": cfg,
    }


def _check_origin(run_dir: Path, cfg: dict, digest: str, env: dict, rows: list[dict]) -> dict:
    """How a bundle can be trusted: the suite's own run by its `suite run` command recomposing to
    its hash; an outside loop's by the evidence behind its numbers (bundle.check). The command and
    what backs the numbers, for the site."""
    if bundle.framework_of(env)["name"] == bundle.SUITE:
        check = provenance.check(cfg, digest)
        if check.problem:
            raise Rejected("config does not recompose with `suite run` in this version of the "
                           f"suite ({check.problem})")
        return {"command": check.command, "command_checked": True,
                "fields_added_since": check.added, "backing": None}
    try:
        info = bundle.check(run_dir, cfg, env, rows)
    except ValueError as e:
        raise Rejected(str(e)) from None
    return {"command": info["command"], "command_checked": False, "fields_added_since": {},
            "backing": bundle.describe_check(info)}


def _check_provenance(env: dict) -> dict:
    """What a reader needs to trust and reproduce a run: code version, software, hardware."""
    sha = env.get("git_sha")
    if not isinstance(sha, str) or not re.fullmatch(r"[0-9a-f]{7,64}", sha):
        raise Rejected(f"env.json: git_sha={sha!r} is not a git commit id (provenance required)")
    if not isinstance(env.get("git_dirty"), bool):
        raise Rejected(f"env.json: git_dirty={env.get('git_dirty')!r} must be true or false")
    packages = env.get("packages")
    if not isinstance(packages, dict) or not packages.get("torch"):
        raise Rejected("env.json: package versions missing (packages.torch required)")
    gpus = env.get("gpus")
    if not isinstance(gpus, list) or not (gpus or env.get("cpu_model")):
        raise Rejected("env.json: hardware missing (gpus list and cpu_model)")
    keep = ("git_sha", "git_dirty", "packages", "python", "platform", "cpu_model", "cpu_count",
            "gpus", "torch_threads", "gemm_backend", "sampler_dtype", "trainer_compute_dtype",
            "lm_head_fp32")
    out = {k: env.get(k) for k in keep}
    out["task_version"] = ((env.get("task") or {}).get("version")
                           if isinstance(env.get("task"), dict) else None)
    out["dataset_sha256"] = ((env.get("dataset") or {}).get("sha256")
                             if isinstance(env.get("dataset"), dict) else None)
    return out


def _check_config(cfg_file: dict, summary: dict) -> tuple[dict, str]:
    cfg = cfg_file.get("config")
    if not isinstance(cfg, dict):
        raise Rejected("config.json has no 'config' object")
    digest = config_hash(cfg)
    if cfg_file.get("config_hash") != digest:
        raise Rejected(f"config.json: config_hash {cfg_file.get('config_hash')!r} is not the hash "
                       f"of its config ({digest})")
    if summary.get("config_hash") != digest:
        raise Rejected(f"summary.json: config_hash {summary.get('config_hash')!r} differs from "
                       f"config.json's {digest}")
    for key in ("task", "algorithm", "precision", "seed"):
        if key not in cfg:
            raise Rejected(f"config.json: config has no '{key}'")
        if summary.get(key) != cfg[key]:
            raise Rejected(f"summary.json: {key}={summary.get(key)!r} but config.json says "
                           f"{cfg[key]!r}")
    return cfg, digest


def _by_step(rows: list[dict]) -> list[dict]:
    # As summarize does: ordered by step, a repeated step keeps its later row.
    by = {}
    for r in rows:
        by[r.get("step")] = r
    return [by[s]
            for s in sorted(by, key=lambda s: (s is None, s if isinstance(s, (int, float)) else 0))]


def _check_summary(summary: dict, rows: list[dict], timing: list[dict], cfg: dict) -> dict:
    """Recompute the summary as train.write_summary does; return it, or reject on disagreement."""
    for n, r in enumerate(rows, start=1):
        if "step" not in r:
            raise Rejected(f"metrics.jsonl: row {n} has no 'step'")
    by_step = {r["step"]: r for r in timing if "step" in r}
    merged = [{**r, **by_step.get(r["step"], {})} for r in rows]
    try:
        recomputed = summarize(merged, total_steps=cfg.get("steps"),
                               threshold=cfg.get("threshold", 0.95), error=summary.get("error"),
                               samples_per_step=samples_per_step(cfg))
    except (ValueError, TypeError) as e:
        raise Rejected(f"metrics.jsonl cannot be summarized ({e})") from None
    keys = sorted({k for k in (*recomputed, *summary)
                   if k.startswith(CHECKED_PREFIXES)} | set(CHECKED_KEYS))
    # written under an earlier rule: its numbers are checked, and
    if summary.get("verdict_rule") != VERDICT_RULE:
        # the board judges them by today's rule (recomputed below)
        keys = [k for k in keys if k not in RULE_KEYS]
    for key in keys:
        if not _same(summary.get(key), recomputed.get(key)):
            raise Rejected(f"summary.json: {key}={summary.get(key)!r} but metrics.jsonl + "
                           f"timing.jsonl give {recomputed.get(key)!r}")
    return recomputed


def _same(a, b) -> bool:
    if isinstance(a, (int, float)) and isinstance(b, (int, float)) and not isinstance(a, bool):
        if math.isnan(a) or math.isnan(b):
            return math.isnan(a) and math.isnan(b)
        # Tolerance for float summation order only: a JSON round trip is exact for floats.
        return math.isclose(a, b, rel_tol=1e-9, abs_tol=1e-12)
    return a == b


# ----------------------------------------------------------------------------
# Writing the site


def _round(x, digits: int = 6):
    """Curves at 6 significant digits keep data.js small; non-finite values as strings
    ("NaN", "Infinity"), since strict JSON has no NaN and a measured NaN must still show."""
    if isinstance(x, bool) or not isinstance(x, (int, float)):
        return x
    if not math.isfinite(x):
        return str(x).replace("inf", "Infinity").replace("nan", "NaN")
    return float(f"{x:.{digits}g}") if isinstance(x, float) else x


def _json_safe(obj):
    if isinstance(obj, float) and not math.isfinite(obj):
        return _round(obj)
    if isinstance(obj, dict):
        return {str(k): _json_safe(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_json_safe(v) for v in obj]
    return obj


def changes(path: Path = CHANGES) -> list[dict]:
    """The board's changelog, newest first: [{version, date, changes: [...]}]; its first entry is
    the version and date the site carries (a build is a pure function of its inputs, so the date is
    not the clock's)."""
    import yaml

    doc = yaml.safe_load(Path(path).read_text(encoding="utf-8"))
    if not isinstance(doc, list) or not doc or not all({"version", "date", "changes"} <= set(d)
                                                       for d in doc):
        raise ValueError(f"{path}: must be a list of {{version, date, changes}}, newest first")
    return [{"version": str(d["version"]), "date": str(d["date"]),
             "changes": [str(c) for c in d["changes"]]}
            for d in doc]


def site_data(records: list[dict], rejected: list[dict], sources: list[str]) -> dict:
    log = changes()
    return {
        "schema_version": SCHEMA_VERSION,
        "version": log[0]["version"], "date": log[0]["date"], "changelog": log,
        "sources": sources,
        "ranking": board.RANKING, "min_seeds": board.MIN_SEEDS, "baseline": board.BASELINE,
        "ci": f"{int(stats.LEVEL * 100)}% stratified bootstrap over seeds, {stats.BOOT_SAMPLES:,} "
              "resamples",
        "verdict_rule": next((r["summary"].get("verdict_rule") for r in records
                              if r["summary"].get("verdict_rule")),
                             None) or VERDICT_RULE,
        "classes": board.classes(records),
        "reported": reported.load(),
        "accepted": len(records),
        "rejected": rejected,
    }


def data_js(data: dict) -> str:
    """The text of ``data.js`` for the site data `data`."""
    # ensure_ascii: the file is pure ASCII, so U+2028 and friends cannot break the script, and
    # "</script>" inside a string is harmless in a separate .js file. indent=0 keeps one value a
    # line (a rebuilt site still diffs line by line) without the indentation, which was 40% of the
    # bytes.
    text = json.dumps(_json_safe(data), sort_keys=True, ensure_ascii=True, allow_nan=False,
                      indent=0, separators=(",", ":"))
    return f"// Generated by `suite leaderboard`; do not edit.\n{DATA_PREFIX}{text};\n"


def _write_site(directory: Path, data: dict) -> None:
    for name in SITE_ASSETS:
        shutil.copyfile(SITE_DIR / name, directory / name)
    (directory / DATA_FILE).write_text(data_js(data), encoding="ascii")


def read_site_data(out: Path) -> dict:
    """The data object of a built site (for tests and tools)."""
    text = (Path(out) / DATA_FILE).read_text(encoding="ascii")
    start = text.index(DATA_PREFIX) + len(DATA_PREFIX)
    return json.loads(text[start:].rstrip().rstrip(";"))


def _is_site(path: Path) -> bool:
    """An existing output directory we may replace: empty, or a site this module wrote."""
    if not any(path.iterdir()):
        return True
    data = path / DATA_FILE
    return data.is_file() and DATA_PREFIX in data.read_text(encoding="utf-8", errors="replace")[
        :200]


_RENAME_EXCHANGE = 2  # linux/fs.h


def _swap_in(new: Path, out: Path) -> None:
    """Make ``new`` become ``out``. On Linux, renameat2(RENAME_EXCHANGE) swaps the two
    directories in one atomic step; elsewhere, two renames (with a short window in which
    ``out`` does not exist, and the old site restored if the second rename fails)."""
    if not out.exists():
        os.rename(new, out)
        return
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        at_fdcwd = -100
        if libc.renameat2(at_fdcwd, os.fsencode(new), at_fdcwd, os.fsencode(out),
                          _RENAME_EXCHANGE) == 0:
            shutil.rmtree(new)  # it now holds the old site
            return
    except (OSError, AttributeError):  # no libc or no renameat2 symbol: use the fallback
        pass
    old = new.with_name(new.name + ".old")
    os.rename(out, old)
    try:
        os.rename(new, out)
    except BaseException:
        os.rename(old, out)
        raise
    shutil.rmtree(old)


def _admit(rec: dict, records: list[dict]) -> None:
    """Add ``rec`` unless it repeats a seed already there. The same bundle twice (a directory given
    twice, a copy) is refused; the same experiment and seed from another commit is not a new seed
    either: if its metrics.jsonl is byte-identical it is kept as evidence that the run reproduces
    (``twins``), else refused with the step where the two part."""
    from suite.analysis.reproduce import first_difference

    for other in records:
        if other["provenance"]["config_hash"] == rec["provenance"]["config_hash"]:
            raise Rejected(f"same config hash {rec['provenance']['config_hash']} as "
                           f"{other['source']}, already accepted")
        if (other["group"], other["seed"]) == (rec["group"], rec["seed"]):
            diff = first_difference(Path(rec["source"]) / "metrics.jsonl",
                                    Path(other["source"]) / "metrics.jsonl")
            if diff != "identical":
                raise Rejected(f"the experiment and seed of {other['source']}, but metrics.jsonl "
                               f"{diff}: one of the two does not reproduce (not counted as a seed)")
            other.setdefault("twins", []).append({"source": rec["source"],
                                                  "git_sha": rec["provenance"]["git_sha"]})
            return
    records.append(rec)


def build(results_dirs: list[Path], out: Path) -> Path:
    """Validate every bundle under ``results_dirs``, then write the site to ``out`` atomically.
    Returns the path of ``index.html``. Rejected bundles are listed in the site's data."""
    out = Path(out)
    if not results_dirs:
        raise ValueError("leaderboard: give at least one RESULTS_DIR")
    if out.exists() and (not out.is_dir() or not _is_site(out)):
        raise ValueError(f"leaderboard: {out} exists and is not a leaderboard site; refusing to "
                         "replace it")
    bundles = [b for d in results_dirs for b in find_bundles(Path(d))]

    # ---- validate everything before writing anything
    records, rejected = [], []
    for b in bundles:
        try:
            rec = validate_run(b)
            _admit(rec, records)
        except Rejected as e:
            rejected.append({"source": str(b), "reason": str(e)})
    data = site_data(records, rejected, [str(d) for d in results_dirs])

    # ---- build in a sibling temp dir (same filesystem, so the swap is a rename), then swap
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=out.parent, prefix=f".{out.name}.", suffix=".tmp"))
    try:
        _write_site(tmp, data)
        os.chmod(tmp, 0o755)  # mkdtemp makes 0700; a site is meant to be read
        _swap_in(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return out / "index.html"


def cli(args: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="suite leaderboard",
                                     description="Build the static leaderboard site from result "
                                                 "bundles.")
    parser.add_argument("results_dirs", nargs="+", type=Path, metavar="RESULTS_DIR")
    parser.add_argument("--out", type=Path,
                        help="site folder (default: RESULTS_DIR/leaderboard of the first "
                        "directory; the committed site is rebuilt only with --out leaderboard, "
                        "docs/leaderboard.md)")
    ns = parser.parse_args(args)
    ns.out = ns.out or ns.results_dirs[0] / "leaderboard"
    index = build(ns.results_dirs, ns.out)
    data = read_site_data(ns.out)
    for r in data["rejected"]:
        print(f"rejected {r['source']}: {r['reason']}")
    print(f"{index}: {data['accepted']} runs accepted, {len(data['rejected'])} rejected")
    return 0
