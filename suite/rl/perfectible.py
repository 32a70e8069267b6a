"""The perfectible-set builder: keep the prompts a model solves sometimes but not always.

Recipe of the published sanity test (arXiv 2510.26788): sample k
responses per prompt with the base policy, keep prompts whose pass rate lies in
[lo, hi] = [0.2, 0.8] (k = 40 there; 1,460 MATH problems survive for R1-Distill-Qwen-1.5B).
Every prompt kept is learnable by that policy, so a sound RL recipe must drive training
accuracy above 95%; a recipe that stalls or collapses on it has a numerical or algorithmic
problem, not a data problem. The authors never released the filter (Precision-RL issue #8);
this is ours, for any model and task.

Sampling uses the built-in engine in fp32 by default, so every precision flow of a grid
trains on the same set. The output is ``train.jsonl`` plus ``provenance.json`` (model, k,
band, counts before and after, pass-rate histogram, dataset hash).
"""

from __future__ import annotations

import hashlib
import json
import time
from dataclasses import asdict
from pathlib import Path

import torch
from rich.console import Console
from rich.progress import Progress

from suite.numerics.engine import TorchEngine
from suite.numerics.precision import DTYPES
from suite.results import atomic_write_json, atomic_write_text
from suite.tasks.item import Item
from suite.tasks.registry import prompt_ids


def pass_rates(engine, tok, task, items: list[Item], k: int, max_new_tokens: int,
               temperature: float, seed: int, chunk: int = 512, progress=None) -> list[float]:
    """Fraction of k responses per prompt, sampled by `engine` (synced), that earn reward 1."""
    gen = torch.Generator().manual_seed(seed)
    per = max(1, chunk // k)  # prompts per generate call (k copies each)
    out: list[float] = []
    task_id = progress.add_task("pass rates", total=len(items)) if progress else None
    for i in range(0, len(items), per):
        block = items[i:i + per]
        prompts = [list(ids) for it in block for ids in [prompt_ids(tok, it)] * k]  # once a prompt
        roll = engine.generate(prompts, max_new_tokens, temperature, 1.0, gen)
        texts = tok.batch_decode(roll.response_ids(), skip_special_tokens=True)
        rewards = [task.reward(block[j // k], t, tr)
                   for j, (t, tr) in enumerate(zip(texts, roll.truncated))]
        out += [sum(rewards[j * k:(j + 1) * k]) / k for j in range(len(block))]
        if progress:
            progress.advance(task_id, len(block))
    return out


def sampler_engine(model_dir: Path, sampler: str, engine: str, vllm_cfg=None):
    """The engine that estimates pass rates: built-in (fp32 by default) or vLLM, weights from
    model_dir."""
    from suite.rl.policy import load_policy

    if engine == "vllm":
        from transformers import AutoTokenizer

        from suite.numerics.precision import resolve
        from suite.numerics.vllm_engine import VllmEngine
        from suite.rl.schema import VllmConfig

        return VllmEngine(model_dir, resolve(sampler), vllm_cfg
                          or VllmConfig()), AutoTokenizer.from_pretrained(model_dir)
    model, tok = load_policy(model_dir)
    eng = TorchEngine(model.config, DTYPES[sampler])
    eng.sync(model.state_dict())
    return eng, tok


def build(model_dir: Path, task, *, k: int, lo: float, hi: float, pool: int, max_new_tokens: int,
          out_dir: Path, temperature: float = 1.0, seed: int = 0, sampler: str = "fp32",
          engine: str = "torch", vllm_cfg=None, console: Console | None = None) -> Path:
    """Screen the first ``pool`` train prompts and write the perfectible set to ``out_dir``."""
    console = console or Console(stderr=True)
    if (out_dir / "provenance.json").exists():
        return out_dir
    t0 = time.time()
    eng, tok = sampler_engine(model_dir, sampler, engine, vllm_cfg)
    items = task.split("train", min(pool, len(task.split("train"))))
    try:
        with Progress(console=console, transient=True) as progress:
            rates = pass_rates(eng, tok, task, items, k, max_new_tokens, temperature, seed,
                               progress=progress)
    # a vLLM engine holds device memory and process-wide state until closed, not until collected
    finally:
        if hasattr(eng, "close"):
            eng.close()
    # A pass rate is a multiple of 1/k; compare with a tolerance so 0.2 * 40 = 8 is kept.
    kept = [(it, r) for it, r in zip(items, rates) if lo - 1e-9 <= r <= hi + 1e-9]
    lines = "".join(json.dumps({**asdict(it), "pass_rate": r}) + "\n" for it, r in kept)
    edges = [i / 10 for i in range(11)]
    hist = [sum(1 for r in rates if edges[i] <= r < edges[i + 1] or (i == 9 and r == 1.0))
            for i in range(10)]
    prov = {
        "task": task.name, "task_version": task.version, "model": str(model_dir),
        "model_build": _read_json(Path(model_dir) / "build.json"),
        "k": k, "band": [lo, hi], "pool": pool, "count_before": len(items),
        "count_after": len(kept), "mean_pass_rate_before": sum(rates) / len(rates),
        "histogram": {"edges": edges, "counts": hist},
        "data_source": getattr(task, "source", "generated"),
        "sampler": {"engine": engine, "dtype": sampler, "temperature": temperature, "top_p": 1.0,
                    "max_new_tokens": max_new_tokens, "seed": seed},
        "dataset_sha256": hashlib.sha256(lines.encode()).hexdigest()[:16],
        "build_seconds": round(time.time() - t0, 1),
    }
    out_dir.mkdir(parents=True, exist_ok=True)
    atomic_write_text(out_dir / "train.jsonl", lines)
    # written last: its presence marks a complete set
    atomic_write_json(out_dir / "provenance.json", prov)
    return out_dir


def from_split(task, out_dir: Path, note: str) -> Path:
    """A task whose train split already is a perfectible set (sanity_r1d: the published filter,
    arXiv 2510.26788) is written out as is, with the same provenance fields where they apply."""
    items = task.split("train")
    lines = "".join(json.dumps({**asdict(it), "pass_rate": None}) + "\n" for it in items)
    prov = {"task": task.name, "task_version": task.version, "model": None, "model_build": None,
            "prefiltered": note, "data_source": getattr(task, "source", "generated"), "k": None,
            "band": None, "pool": len(items), "count_before": len(items), "count_after": len(items),
            "mean_pass_rate_before": None, "histogram": None, "sampler": None,
            "dataset_sha256": hashlib.sha256(lines.encode()).hexdigest()[:16], "build_seconds": 0.0}
    out_dir.mkdir(parents=True, exist_ok=True)
    atomic_write_text(out_dir / "train.jsonl", lines)
    atomic_write_json(out_dir / "provenance.json", prov)
    return out_dir


def load(out_dir: Path, max_prompts: int | None = None) -> tuple[list[Item], dict]:
    """Read a perfectible set (items in pool order) and its provenance."""
    prov = json.loads((out_dir / "provenance.json").read_text())
    items = []
    for line in (out_dir / "train.jsonl").read_text().splitlines():
        row = json.loads(line)
        items.append(Item(id=row["id"], prompt=row["prompt"], answer=row["answer"],
                          messages=tuple(tuple(m) for m in row.get("messages") or ())))
    return items[:max_prompts] if max_prompts else items, prov


def describe(prov: dict) -> str:
    if prov.get("prefiltered"):
        return (f"{prov['task']} v{prov['task_version']}: {prov['count_after']} prompts, "
                f"prefiltered ({prov['prefiltered']})")
    h = prov["histogram"]
    bars = " ".join(f"[{e:.1f},{e + 0.1:.1f}):{c}" for e, c in zip(h["edges"], h["counts"]))
    return (f"{prov['task']} v{prov['task_version']}: kept {prov['count_after']} of "
            f"{prov['count_before']} prompts with pass rate in [{prov['band'][0]}, "
            f"{prov['band'][1]}] (k={prov['k']}, mean pass rate before "
            f"{prov['mean_pass_rate_before']:.2f})\n  pass-rate histogram: {bars}")


def _read_json(path: Path):
    return json.loads(path.read_text()) if path.exists() else None


def too_few(prov: dict, n: int, cfg) -> str:
    """Why a run cannot start on this perfectible set, and what would make one: the user's fixes by
    name."""
    where = describe(prov).replace("\n", ";")
    if prov.get("prefiltered"):
        return (f"perfectible set has {n} prompts, fewer than "
                f"prompts_per_step={cfg.prompts_per_step} ({where}): the task's train split is "
                "used as it is; give it more rows or lower prompts_per_step")
    rate = prov.get("mean_pass_rate_before")
    lo, hi = prov["band"]
    hint = (f"the base policy's pass rates lie mostly below the band (mean {rate:.2f} < {lo}): a "
            "lower perfectible.lo, a stronger model= (a local HF model directory) or an easier task"
            if rate is not None and rate < lo else
            f"the base policy's pass rates lie mostly above the band (mean {rate:.2f} > {hi}): a "
            "higher perfectible.hi or a harder task" if rate is not None and rate > hi
            else "a wider band (perfectible.lo, perfectible.hi)")
    return (f"perfectible set has {n} prompts, fewer than prompts_per_step={cfg.prompts_per_step} "
            f"({where}). Fixes: {hint}; a larger perfectible.pool; or, if your data are already "
            "filtered, `prefiltered:` in the task file (docs/own_task.md) to train on its train "
            "split as it is.")
