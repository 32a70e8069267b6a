"""A verl run's own per-step log as a suite bundle, with every number marked ``copied``.

verl (github.com/volcengine/verl) logs, per training step, the mismatch between its rollout
engine and its actor under documented names: ``training/rollout_probs_diff_{mean,max,std}``
(``ray_trainer.py``: actor log-probs recomputed at the sampling parameters vs the rollout's, over
the batch's response tokens, before the update) and ``rollout_corr/*``
(``rollout_corr_helper.compute_offpolicy_metrics``: k1 and k3 KL, chi^2 per token and per
sequence, perplexity ratio and log-difference). Its file logger (``trainer.logger=[...,"file"]``,
path in ``$VERL_FILE_LOGGER_PATH``) writes one JSON line per step, ``{"step": n, "data": {...}}``;
rows flattened by a W&B export (``{"step": n, "rollout_corr/kl": ...}``) read the same.

What the log does not hold cannot be recomputed: no per-token log-probs, so the suite's own
``suite.numerics.mismatch`` functions never run on a verl import. Each value is copied under the
bundle's name, marked ``copied`` in env.json with the verl name it came from, and the original log
is kept in ``source/``: the leaderboard checks every copied number against it. Metrics verl does not
log (k2 KL, |log-prob| differences, sequence log-ratios, the anatomy, per-prompt pass rates) stay
absent rather than estimated. Where verl's formula differs from the suite's (``MAPPING`` notes how),
its value is kept under its own name (``verl/rollout_corr/...``), not the suite's; and verl's actor
also logs ``rollout_corr/*`` per micro-batch at the *current* policy under the same names, averaged
over micro-batches: which of the two a log holds depends on the run's configuration.

The run's provenance cannot be observed from here: git commit, package versions, hardware and
precision are declared by whoever imports (``declared`` in env.json), and the importing suite's
own environment is kept under ``importer``. No verl run was made while writing this module; it
was tested on rows written with verl's documented names (tests/test_verl_import.py).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import re
from pathlib import Path

from suite.analysis import bundle
from suite.numerics import peers
from suite.results import (
    SCHEMA_VERSION,
    append_jsonl,
    atomic_write_bytes,
    write_summary,
)
from suite.rl.env_record import env_info

# bundle key -> (verl key, how the two differ). Rows: the verl key's value is copied as is. A
# mismatch number goes under the suite's key only where the metric table (suite/numerics/peers.py)
# says verl computes the same number; otherwise under verl's own name, prefixed "verl/", so that a
# suite key never holds another formula's value.
_OWN = {
    "reward/mean": ("critic/score/mean", "mean sequence score before any KL penalty; the training "
                                         "accuracy for 0/1 rewards"),
    "response/length/mean": ("response_length/mean", "same"),
    "response/length/max": ("response_length/max", "same"),
    "response/truncated_frac": ("response_length/clip_ratio",
                                "responses that hit the length budget"),
    "entropy/mean": ("actor/entropy", "aggregated with the run's loss_agg_mode, per micro-batch, "
                                      "averaged"),
    "train/grad_norm": ("actor/grad_norm", "same"),
}
_MISMATCH = {
    (key if c.relation == "identical" else f"verl/{c.name}"): (c.name, peers.RELATIONS[c.relation])
    for key, c in peers.counterparts("verl")
}
MAPPING = {"reward/mean": _OWN["reward/mean"], **_MISMATCH,
           **{k: v for k, v in _OWN.items() if k != "reward/mean"}}
TIMING = {"time/step_s": "timing_s/step", "time/sample_s": "timing_s/gen"}
NOT_LOGGED = ("mismatch/kl_k2", "mismatch/logprob_diff/{mean,max}", "mismatch/seq_log_ratio/*",
              "mismatch/prob_diff/std", "mismatch/log_ppl_diff", "mismatch/ppl_ratio",
              "mismatch/chi2_seq", "mismatch/exp_abs_logprob_diff/mean", "anatomy/*", "logprob/*",
              "reward/pass_rates")
SOURCE = f"{bundle.SOURCE_DIR}/metrics.jsonl"


def import_run(metrics_path, out, *, task: str, algorithm: str, precision: str, seed: int,
               verl_version: str, git_sha: str, git_dirty: bool, packages: dict, hardware: dict,
               steps: int | None = None, threshold: float = 0.95, model: str | None = None,
               command: str | None = None, recipe: dict | None = None) -> Path:
    """Write the bundle of the verl run logged in ``metrics_path``; return its directory.

    Declared (not observable from the log): ``git_sha``/``git_dirty`` of the code that ran,
    ``packages`` (torch at least; verl's own version is ``verl_version``), ``hardware``
    (``{"gpus": [names...]}`` or ``{"cpu_model": name}``), ``precision`` (a suite flow: verl's
    default FSDP bf16 actor with a bf16 vLLM rollout is ``bf16``). ``steps``: the run's planned
    steps (``trainer.total_training_steps``); default: the last logged step. ``command`` or
    ``recipe`` (verl's resolved config) must say how it ran.
    """
    if not Path(metrics_path).is_file():
        raise ValueError(f"{metrics_path}: no such file (verl's file-logger JSONL, "
                         "$VERL_FILE_LOGGER_PATH)")
    raw = Path(metrics_path).read_bytes()
    log = bundle.read_source_log(Path(metrics_path))
    # step 0 holds validation only
    train = sorted(s for s, d in log.items() if MAPPING["reward/mean"][0] in d)
    if not train:
        raise ValueError(f"{metrics_path}: no row with {MAPPING['reward/mean'][0]} (the training "
                         "reward); is it a verl metrics log (trainer.logger=[..., file])?")
    if not re.fullmatch(r"[0-9a-f]{7,64}", str(git_sha)) or not isinstance(git_dirty, bool):
        raise ValueError(f"git_sha={git_sha!r} must be the commit id of the code that ran, "
                         "git_dirty true or false")
    if not packages.get("torch") or not (hardware.get("gpus") or hardware.get("cpu_model")):
        raise ValueError("packages must give torch's version, and hardware the GPUs (or the CPU) "
                         "the run used")
    if not (command or recipe):
        raise ValueError("say how the run was started: its command line, or verl's resolved config "
                         "as the recipe")
    config = bundle.run_config(task=task, algorithm=algorithm, precision=precision, seed=seed,
                               steps=steps or train[-1], framework=("verl", verl_version),
                               recipe=recipe, threshold=threshold, model=model)
    rows = [_row(step, log[step]) for step in train]
    copied = {key: verl for key, (verl, _) in MAPPING.items() if any(key in r for r in rows)}
    slug = re.sub(r"[^a-z0-9]+", "-",
                  str(hardware.get("gpus", [None])[0]
                      or hardware.get("cpu_model")).lower()).strip("-")
    importer = env_info()
    env = {"schema_version": SCHEMA_VERSION, "git_sha": git_sha, "git_dirty": git_dirty,
           "packages": {**packages, "verl": verl_version}, "gpus": list(hardware.get("gpus") or []),
           "cpu_model": hardware.get("cpu_model"), "cpu_count": None, "python": None,
           "platform": None, "torch_threads": None, "hostname": None,
           "framework": config["framework"],
           "machine_class": {"id": f"declared-{slug}", "declared_by": "importer",
                             "gpu": (hardware.get("gpus") or [None])[0],
                             "cpu_model": hardware.get("cpu_model"), "torch": packages.get("torch"),
                             "threads": None},
           "bundle": {"schema": bundle.BUNDLE_SCHEMA, "writer": "suite.verl_import",
                      "evidence": None, "recomputed": [], "copied": copied,
                      "source_log": {"path": SOURCE, "sha256": hashlib.sha256(raw).hexdigest(),
                                     "format": "verl file logger (JSONL of {step, data})"},
                      "command": command or "(see config.json recipe: verl's resolved config)",
                      "precision": "declared",
                      "declared": ["git_sha", "packages", "hardware", "precision"],
                      "not_logged": list(NOT_LOGGED)},
           "importer": {k: importer.get(k)
                        for k in ("git_sha", "git_dirty", "packages", "python", "hostname")},}
    run_dir = bundle.write_head(out, config, env)
    atomic_write_bytes(run_dir / SOURCE, raw)
    for step, row in zip(train, rows):
        append_jsonl(run_dir / "metrics.jsonl", row)
        append_jsonl(run_dir / "timing.jsonl",
                     {"step": step,
                      **{k: log[step][v] for k, v in TIMING.items() if _number(log[step].get(v))}})
    write_summary(run_dir, config, None)
    return run_dir


def _number(x) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


def _row(step: int, data: dict) -> dict:
    """One bundle row: each mapped verl value copied under the bundle's name (absent stays
    absent)."""
    return {"step": step, **{key: data[verl] for key, (verl, _) in MAPPING.items() if verl in data}}


def cli(args: list[str]) -> int:
    """suite import verl METRICS.jsonl --out DIR --task T --algorithm A --precision P --seed S
    --verl-version V
    --git-sha SHA --torch VERSION (--gpu NAME --gpus N | --cpu NAME) [--steps N] [--command CMD]
    [--config FILE]"""
    p = argparse.ArgumentParser(prog="suite import verl", description=__doc__.split("\n\n")[0])
    p.add_argument("metrics", type=Path, help="verl's file-logger JSONL ($VERL_FILE_LOGGER_PATH) "
                                              "or a flat export")
    p.add_argument("--out", type=Path, required=True, help="results directory; the bundle goes to "
                                                           "OUT/<task>__...__s<seed>")
    for name in ("task", "algorithm", "precision", "verl-version", "git-sha", "torch"):
        p.add_argument(f"--{name}", required=True)
    p.add_argument("--seed", type=int, required=True)
    p.add_argument("--git-dirty", action="store_true",
                   help="the code that ran had uncommitted changes")
    p.add_argument("--gpu", help="GPU model, e.g. 'NVIDIA H100 80GB HBM3'")
    p.add_argument("--gpus", type=int, default=1, help="number of GPUs (with --gpu)")
    p.add_argument("--cpu", help="CPU model, for a run without GPUs")
    p.add_argument("--package", action="append", default=[], metavar="NAME=VERSION",
                   help="more versions (vllm=0.10.2)")
    p.add_argument("--steps", type=int, help="planned steps (trainer.total_training_steps); "
                                             "default: the last logged")
    p.add_argument("--threshold", type=float, default=0.95)
    p.add_argument("--model", help="the model trained (name or path)")
    p.add_argument("--command", help="the command line that started the run")
    p.add_argument("--config", type=Path, help="verl's resolved config (JSON or YAML), kept as the "
                                               "recipe")
    ns = p.parse_args(args)
    if not (ns.gpu or ns.cpu):
        raise ValueError("give the hardware the run used: --gpu NAME [--gpus N] or --cpu NAME")
    bad = [s for s in ns.package if "=" not in s]
    if bad:
        raise ValueError(f"--package {bad[0]!r}: expected NAME=VERSION")
    recipe = None
    if ns.config:
        import yaml

        recipe = yaml.safe_load(ns.config.read_text())  # JSON is YAML too
    run_dir = import_run(ns.metrics, ns.out, task=ns.task, algorithm=ns.algorithm,
                         precision=ns.precision, seed=ns.seed, verl_version=ns.verl_version,
                         git_sha=ns.git_sha, git_dirty=ns.git_dirty,
                         packages={"torch": ns.torch, **dict(s.split("=", 1) for s in ns.package)},
                         hardware={"gpus": [ns.gpu] * ns.gpus} if ns.gpu else {"cpu_model": ns.cpu},
                         steps=ns.steps, threshold=ns.threshold, model=ns.model, command=ns.command,
                         recipe=recipe)
    summary = json.loads((run_dir / "summary.json").read_text())
    copied = json.loads((run_dir / "env.json").read_text())["bundle"]["copied"]
    print(f"{run_dir}: {summary['steps_done']} steps imported, verdict {summary['verdict']}; "
          f"copied from verl's log (not recomputable): {', '.join(sorted(copied))}")
    return 0
