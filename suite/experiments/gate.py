"""``suite gate``: a CI gate on a stack's step-0 mismatch, calibrated instead of guessed.

Frameworks gate their CI on mismatch thresholds 10^4 apart (NeMo-RL's token-multiplicative error <
1.05 for BF16, slime |dlogp| <= 0.1, SkyRL 0.09, prime-rl KL <= 5e-4) and loosen them after a torch
or vLLM upgrade. This gate measures the stack's own step-0 mismatch per precision flow on a fixed
probe (the config's policy and task, its first ``prompts_per_step`` perfectible prompts, fixed
sampling seeds) and compares it with a band calibrated from repeated measurements on the same probe:

    upper = mean + 3 sd over (batches x seeds) measurements (per flow and metric; sd with ddof = 1)

stored in a band file with the versions and machine class it was measured on. ``check`` measures
once (batch 0, seed 0) and fails (exit 1) when a metric is above its band; the published framework
thresholds are printed beside it, for reference, not used. Every calibration and check is appended
to a ledger keyed by the torch, vLLM and transformers versions and the machine class, so an
upgrade's effect is a diff between ledger lines rather than a loosened threshold.

A calibration replicate can never fail its own band: with n <= 10 values, no value lies more than
(n - 1) / sqrt(n) < 3 sample standard deviations from their mean.
"""

from __future__ import annotations

import copy
import dataclasses
import json
import math
import statistics
import time
from pathlib import Path

import torch

from suite.numerics import machine
from suite.numerics.mismatch import mismatch_metrics, ratio_band_fractions

SCHEMA = 1
# The gated metrics: name -> key of the measurement. tme = NeMo-RL's token-multiplicative error.
GATED = {"k3": "mismatch/kl_k3", "dp": "mismatch/prob_diff/mean",
         "tme": "mismatch/exp_abs_logprob_diff/mean", "dlogp_max": "mismatch/logprob_diff/max",
         "out_0.9_1.1": "mech/ratio_out/0.9-1.1"}
K_SD = 3.0
# What frameworks gate on (docs/attribution.md cites each); printed beside the calibrated band,
# never used by it.
PUBLISHED = (
    ("NeMo-RL", "tme", "BF16: max over steps < 1.05; FP8 / MXFP8: median < 1.1; FP8 KV cache: "
                       "median < 2.0; NVFP4 W4A4: < 1.15 at step 1"),
    ("slime", "dlogp_max", "|dlogp| <= 0.1 in CI; < 1e-6 for its aligned FP8 stack"),
    ("SkyRL", "dlogp", "mean |dlogp| < 0.09 (raised from 0.07 after a torch/vLLM upgrade, SkyRL "
                       "issue 1408)"),
    ("prime-rl", "k3", "nightly: mismatch KL (k3) <= 5e-4 and reward >= 0.75 after 1,000 steps"),
)
# The fields that define the probe: a band is compared only with measurements of the same probe.
PROBE_FIELDS = ("task", "tier", "model", "prompts_per_step", "samples_per_prompt",
                "perfectible.max_prompts", "sampling.max_new_tokens", "sampling.temperature",
                "policy")


def versions() -> dict:
    from suite.rl.env_record import env_info

    pk = env_info().get("packages", {})
    return {k: pk.get(k) for k in ("torch", "vllm", "transformers")}


def probe_identity(cfg) -> dict:
    from suite.rl.config import to_dict
    from suite.rl.provenance import flatten

    flat = flatten(to_dict(cfg))
    return {k: (to_dict(cfg)["policy"] if k == "policy" else flat[k]) for k in PROBE_FIELDS}


def measure(cfg, flow: str, model, prompts, batch: int, seed: int) -> dict[str, float]:
    """One step-0 measurement of ``flow``: its sampler draws ``prompts`` with the per-sequence seeds
    of (seed, batch), its trainer scores them at the same parameters; the GATED metrics."""
    from suite.numerics.sampling import sequence_seeds
    from suite.numerics.scoring import Batch, batch_tensors
    from suite.rl import config as cfgmod
    from suite.rl.train import build_engines

    c = cfgmod.validate(dataclasses.replace(cfg, precision=flow))
    trainer, engine, _ = build_engines(c, copy.deepcopy(model))
    try:
        engine.sync(trainer.full_weights())
        G = c.samples_per_prompt
        roll = engine.generate(prompts, c.sampling.max_new_tokens, c.sampling.temperature,
                               c.sampling.top_p,
                               sequence_seeds(seed, batch + 1, list(range(len(prompts) // G)), G),
                               top_k=c.sampling.top_k)
        ids, attn = batch_tensors(roll.prompt_ids, roll.tokens, roll.mask)
        kept = roll.kept if c.sampling.truncation == "renormalise" else None
        with torch.no_grad():
            logp = trainer.score(Batch(ids, attn, roll.tokens, c.sampling.temperature,
                                       kept=kept))[0]
        m = {**mismatch_metrics(logp.cpu(), roll.logprobs, roll.mask),
             **ratio_band_fractions(logp.cpu(), roll.logprobs, roll.mask)}
        return {k: float(m[v]) for k, v in GATED.items()}
    finally:
        if hasattr(engine, "close"):
            engine.close()


def probe(cfg, batches: int):
    """The policy and ``batches`` batches of the run's size from the perfectible set (prompts x
    samples each)."""
    from rich.console import Console

    from suite.rl.data import prepare_data
    from suite.rl.perfectible import load
    from suite.rl.policy import load_policy
    from suite.tasks.registry import prompt_ids

    model_dir, data_dir = prepare_data(cfg, Console(quiet=True))
    items, _ = load(data_dir, cfg.perfectible.max_prompts)
    n = cfg.prompts_per_step
    if len(items) < batches * n:
        raise ValueError(f"--batches: {batches} x {n} prompts needed, the perfectible set has "
                         f"{len(items)}")
    model, tok = load_policy(model_dir)
    G = cfg.samples_per_prompt
    return model, [[prompt_ids(tok, it) for it in items[b * n:(b + 1) * n] for _ in range(G)]
                   for b in range(batches)]


def band(values: list[float]) -> dict:
    """mean, sample sd (ddof 1), n and the upper edge mean + K_SD sd."""
    mean = statistics.fmean(values)
    sd = statistics.stdev(values) if len(values) > 1 else 0.0
    return {"mean": mean, "sd": sd, "n": len(values), "upper": mean + K_SD * sd}


def calibrate(cfg, flows: list[str], batches: int, seeds: int) -> dict:
    """The band file's content: per flow and metric, the band over batches x seeds measurements."""
    if batches * seeds < 2:
        raise ValueError("--batches x --seeds: a band needs at least 2 measurements (got "
                         f"{batches} x {seeds})")
    model, prompts = probe(cfg, batches)
    out = {}
    for flow in flows:
        runs = [measure(cfg, flow, model, prompts[b], b, s) for b in range(batches)
                for s in range(seeds)]
        out[flow] = {k: band([r[k] for r in runs]) for k in GATED}
    return {"schema_version": SCHEMA, "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "versions": versions(), "machine_class": machine.describe(cfg.gemm, cfg.threads),
            "probe": probe_identity(cfg), "stack": stack_identity(cfg), "batches": batches,
            "seeds": seeds, "k_sd": K_SD, "flows": out}


def stack_identity(cfg) -> dict:
    """The knobs of the stack under test (what a regression changes; recorded, not required to
    match)."""
    return {"engine": cfg.engine, "gemm": cfg.gemm, "kv_cache": cfg.kv_cache,
            "lm_head_fp32": cfg.lm_head_fp32, "top_p": cfg.sampling.top_p,
            "top_k": cfg.sampling.top_k, "truncation": cfg.sampling.truncation,
            "inject": {"kind": cfg.inject.kind, "scale": cfg.inject.scale}}


def check(cfg, bands: dict, flows: list[str] | None = None) -> dict:
    """Measure every flow of the band file (or ``flows``) once on the probe (batch 0, seed 0) and
    compare."""
    if bands.get("probe") != probe_identity(cfg):
        diff = [k for k in PROBE_FIELDS if bands.get("probe", {}).get(k) != probe_identity(cfg)[k]]
        raise ValueError(f"band: calibrated on another probe (differs in {', '.join(diff)}); "
                         "calibrate this one first (suite gate --calibrate)")
    flows = flows or list(bands["flows"])
    missing = [f for f in flows if f not in bands["flows"]]
    if missing:
        raise ValueError(f"--flows: no band for {', '.join(missing)} in the band file (it has "
                         f"{', '.join(bands['flows'])})")
    model, prompts = probe(cfg, 1)
    results = {}
    for flow in flows:
        got = measure(cfg, flow, model, prompts[0], 0, 0)
        results[flow] = {k: {"value": v, "upper": bands["flows"][flow][k]["upper"],
                             "ok": v <= bands["flows"][flow][k]["upper"]
                             or math.isclose(v, bands["flows"][flow][k]["upper"])}
                         for k, v in got.items()}
    return {"versions": versions(), "machine_class": machine.describe(cfg.gemm, cfg.threads),
            "stack": stack_identity(cfg), "band_versions": bands["versions"], "results": results,
            "pass": all(r["ok"] for f in results.values() for r in f.values())}


def ledger_key(doc: dict) -> str:
    """The ledger's key: torch / vLLM / transformers versions and machine class."""
    v, cls = doc["versions"], doc["machine_class"]["id"]
    return f"torch={v['torch']} vllm={v['vllm']} transformers={v['transformers']} class={cls}"


def default_band_path(cfg) -> Path:
    from suite.results import REFERENCE_ROOT

    class_id = machine.describe(cfg.gemm, cfg.threads)["id"]
    return REFERENCE_ROOT.parent / "gate" / f"{class_id}__{cfg.tier}.json"


def main(args: list[str]) -> int:
    """``suite gate``: check (default) or ``--calibrate``; exit 1 when a flow is outside its
    band."""
    import argparse

    from rich.console import Console
    from rich.table import Table

    from suite.results import append_jsonl, atomic_write_json
    from suite.rl import config as cfgmod

    p = argparse.ArgumentParser(prog="suite gate", add_help=False)
    p.add_argument("--calibrate", action="store_true")
    p.add_argument("--flows", default=None)
    p.add_argument("--batches", type=int, default=4)
    p.add_argument("--seeds", type=int, default=2)
    p.add_argument("--band", type=Path, default=None)
    p.add_argument("--ledger", type=Path, default=None)
    ns, overrides = p.parse_known_args(args)
    cfg = cfgmod.load(overrides)
    torch.set_num_threads(cfg.threads)
    path = ns.band or default_band_path(cfg)
    ledger = ns.ledger or path.parent / "ledger.jsonl"
    flows = ns.flows.split(",") if ns.flows else None
    console = Console()
    if ns.calibrate:
        from suite.numerics.precision import FLOWS, main_flows

        flows = flows or main_flows()
        bad = [f for f in flows if f not in FLOWS]
        if bad:
            raise ValueError(f"--flows: unknown flow {', '.join(bad)}")
        doc = calibrate(cfg, flows, ns.batches, ns.seeds)
        path.parent.mkdir(parents=True, exist_ok=True)
        atomic_write_json(path, doc)
        append_jsonl(ledger,
                     {"kind": "calibration", "key": ledger_key(doc), "band": str(path),
                      "created": doc["created"], "stack": doc["stack"],
                      "flows": {f: {k: b["mean"] for k, b in m.items()}
                                for f, m in doc["flows"].items()}})
        console.print(f"gate: band of {len(flows)} flows ({ns.batches} batches x {ns.seeds} seeds) "
                      f"written to {path}; ledger {ledger}")
        return 0
    if not path.exists():
        raise ValueError(f"--band: {path} does not exist; calibrate first (suite gate --calibrate "
                         "...)")
    bands = json.loads(path.read_text())
    doc = check(cfg, bands, flows)
    append_jsonl(ledger, {"kind": "check", "key": ledger_key(doc), "band": str(path),
                          "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                          "stack": doc["stack"], "pass": doc["pass"],
                          "flows": {f: {k: r["value"] for k, r in m.items()}
                                                         for f, m in doc["results"].items()}})
    table = Table("flow", *[f"{k} (band)" for k in GATED], title="suite gate: step-0 mismatch vs "
                                                                 f"the band of {path.name} "
                  f"(mean + {K_SD:g} sd; calibrated with {ledger_key(bands)})")
    for flow, res in doc["results"].items():
        table.add_row(flow,
                      *[f"{'' if r['ok'] else '[bold red]OUT '}{r['value']:.2e} (<= "
                        f"{r['upper']:.2e})"
                              f"{'' if r['ok'] else '[/]'}" for r in res.values()])
    console.print(table)
    pub = Table("framework", "metric", "published threshold", title="published CI thresholds (for "
                                                                    "reference, not used)")
    for name, metric, text in PUBLISHED:
        pub.add_row(name, metric, text)
    console.print(pub)
    console.print(f"gate: {'PASS' if doc['pass'] else 'FAIL'} ({ledger_key(doc)}); ledger {ledger}",
                  highlight=False)
    return 0 if doc["pass"] else 1
