"""``suite attribute``: where a stack's training-inference mismatch comes from, source by source.

Every RL stack's gap between sampler and trainer is a sum of sources, several of them not precision
at all (docs/attribution.md): the trainer's own kernels, FP8 weights in the sampler, an FP8 KV
cache, truncated sampling the trainer does not renormalise, asynchronous rollouts, the trainer's
micro-batching. This measures each one on the same batches (same prompts, same per-sequence sampling
seeds):

- the **matched pair**: the flow's sampler dtype on both sides, the trainer replaying the sampler's
own decode
  loop on the sampler's batch (the ``exact`` flow's scorer): mismatch exactly 0;
- **one on**: from the matched pair, switch on one source at a time;
- the **full stack**: every source on; **one off**: from it, switch off one source at a time;
- the **interaction**: full - matched - sum of the one-on effects, so that the one-on effects and
the
  interaction add up to the full stack exactly (the check the table prints).

Sources (``SOURCES``; a flow's stack takes those it applies to, ``fp8_weights`` only for FP8-rollout
flows):

- ``kernels``: the trainer scores with its own kernels (the HF module's full-sequence forward under
the
  flow's autocast, as in a run) instead of the sampler's replayed decode loop;
- ``fp8_weights``: the sampler's decoder linears block-scaled FP8 (suite/numerics/fp8.py), the
trainer's not;
- ``kv_fp8``: the sampler's KV cache FP8 E4M3 (config kv_cache=fp8), the trainer has none;
- ``top_p``: the sampler draws from the top-p nucleus (``--top-p``) and records renormalised
log-probs; the
  trainer scores the whole vocabulary (sampling.truncation=none, the common bug);
- ``staleness``: the trainer holds the weights after one RL step of the flow, the sampler the ones
before it;
- ``micro_batch``: the trainer scores one sequence at a time instead of the whole batch (batch
variance);
- ``packing``: the trainer scores its batch packed, every pad dropped and the sequences concatenated
into one row
  (config ``packing``, suite/numerics/packing.py), instead of padded (batch variance of another
  shape).

Some sources exist only given another (``REQUIRES``): packing is a property of the trainer's
HF-module forward, so it needs ``kernels`` (the matched pair replays the sampler's decode loop,
which has no packing). Its one-on configuration is base + kernels + packing and its effect is
measured from base + kernels ("packing given the module"); switching ``kernels`` off from the full
stack switches packing off with it.

Per configuration and replicate (a batch of prompts x a sampling seed): k3 KL, mean |dp|, NeMo-RL's
token-multiplicative error (mean exp|dlogp|), the fraction of token ratios outside [0.9, 1.1] and
[0.5, 2], and the full-vocabulary KL(mu || pi) and TV; effects and shares get bootstrap intervals
over the replicates. With ``engine=vllm`` the sampler is vLLM: its kernels cannot be replayed, so
``kernels`` is always on and the baseline is "vLLM vs the trainer, every other source off" (reported
as such, not as a matched pair).
"""

from __future__ import annotations

import copy
import itertools
import tempfile
from dataclasses import dataclass, replace
from pathlib import Path

import torch

from suite import dist
from suite.numerics.engine import TorchEngine
from suite.numerics.mismatch import distribution_divergence, mismatch_metrics, ratio_band_fractions
from suite.numerics.precision import gemm_backend, resolve
from suite.numerics.sampling import sequence_seeds

SOURCES = ("kernels", "fp8_weights", "kv_fp8", "top_p", "staleness", "micro_batch", "packing")
# a source -> the sources it exists only with (its one-on effect is given them)
REQUIRES = {"packing": ("kernels",)}
SAMPLER_SOURCES = ("fp8_weights", "kv_fp8", "top_p")  # the rest change only the trainer
# (key in the result rows, label, key of the measurement)
METRICS = (("k3", "k3 KL", "mismatch/kl_k3"), ("dp", "mean |dp|", "mismatch/prob_diff/mean"),
           ("tme", "token-mult. error - 1", "mismatch/exp_abs_logprob_diff/mean"),
           ("out_0.9_1.1", "frac outside [0.9, 1.1]", "mech/ratio_out/0.9-1.1"),
           ("out_0.5_2", "frac outside [0.5, 2]", "mech/ratio_out/0.5-2"),
           ("kl_full", "full-vocab KL(mu||pi)", "dist/kl_sampler_trainer"),
           ("tv", "full-vocab TV", "dist/tv"))


def stack_of(precision: str, engine: str = "torch") -> tuple[str, ...]:
    """The sources of a flow's full stack: every source but FP8 weights, which only FP8-rollout
    flows have."""
    flow = resolve(precision)
    if flow.exact or flow.unified or flow.trainer_quant:
        raise ValueError(f"precision: {precision} trains through the sampler's code; attribute a "
                         "flow whose trainer is the HF module (bf16, fp16, fp32, bf16_fp8rollout, "
                         "...)")
    if flow.fp4:  # the sources toggle FP8 weights only: a 4-bit sampler would be measured as bf16
        raise ValueError(f"precision: {precision} has a 4-bit sampler, which suite attribute "
                         "has no source for; measure it with `suite mismatch`")
    return tuple(s for s in SOURCES if s != "fp8_weights" or flow.sampler_quant == "fp8")


def requires(source: str) -> frozenset:
    """The sources ``source`` exists only with (``REQUIRES``)."""
    return frozenset(REQUIRES.get(source, ()))


def configurations(stack: tuple[str, ...], engine: str = "torch") -> list[frozenset]:
    """matched, each one on, full, each one off (deduplicated, in that order). With vLLM ``kernels``
    is always on.

    A source that requires others (``REQUIRES``) is switched on together with them (base | requires
    | {s}; its effect is measured from base | requires), and switching a source off also switches
    off what requires it."""
    fixed = frozenset({"kernels"}) if engine == "vllm" else frozenset()
    missing = [f"{s} requires {r}" for s in stack for r in requires(s) if r not in stack]
    # refused, not added behind the user's back: the table's rows are the sources asked for
    if missing:
        raise ValueError(f"--sources: {'; '.join(missing)}: add it (a source measured given "
                         "another, docs/attribution.md)")
    free = [s for s in stack if s not in fixed]
    full = frozenset(stack)
    on = [fixed | requires(s) | {s} for s in free]
    off = [full - {s} - {t for t in stack if s in requires(t)} for s in free]
    return list(dict.fromkeys([fixed, *on, full, *off]))


@dataclass
class Probe:
    """What every configuration shares: the policy at the sampling weights (theta0) and one RL step
    later (theta1), the prompt batches, the seeds."""

    cfg: object
    model: object
    theta0: dict
    theta1: dict
    batches: list  # list of list of prompt ids (each a whole batch: prompts x samples)
    seeds: list[int]
    top_p: float


def _sampler(probe: Probe, on: frozenset):
    """The sampler of a configuration (built-in engine): the flow's dtype, with the sampler-side
    sources."""
    flow, cfg = resolve(probe.cfg.precision), probe.cfg
    quant = "fp8" if "fp8_weights" in on else None
    # an FP8 flow's sampler computes in bf16 around its FP8 GEMMs (flows.TORCH_DTYPES)
    dtype = flow.sampler_dtype
    # where the run's sampler computes (and the trainer of _module_scores)
    device = dist.World().device
    e = TorchEngine(probe.model.config, dtype, gemm_backend(cfg.gemm, dtype, device.split(":")[0]),
                    device=device, functional_cache=True, quant=quant, kv_quant="fp8"
                    if "kv_fp8" in on else None)
    e.sync(probe.theta0)
    return e


def _replay_scores(probe: Probe, roll, weights: dict, rows_per_call: int | None):
    """The matched trainer: the sampler's own code (no FP8, no FP8 KV cache), replaying the decode
    loop."""
    from suite.numerics.scoring import batch_tensors

    dtype = resolve(probe.cfg.precision).sampler_dtype
    device = dist.World().device  # the sampler's device: the replay runs its kernels
    e = TorchEngine(probe.model.config, dtype,
                    gemm_backend(probe.cfg.gemm, dtype, device.split(":")[0]), device=device,
                    functional_cache=True)
    e.sync(weights)
    ids, attn = (t.to(device) for t in batch_tensors(roll.prompt_ids, roll.tokens, roll.mask))
    P = ids.shape[1] - roll.tokens.shape[1]
    parts = []
    for c in torch.arange(len(ids)).split(rows_per_call or len(ids)):
        lp, _, full = e.score(ids[c, :P], attn[c, :P].bool(), roll.tokens[c].to(device),
                              probe.cfg.sampling.temperature, full=True)
        # the rollout's side is on the CPU (suite/numerics/engine.py)
        parts.append((lp.cpu(), full.cpu()))
    return torch.cat([p[0] for p in parts]), torch.cat([p[1] for p in parts])


def _module_scores(probe: Probe, roll, weights: dict, rows_per_call: int | None,
                   packing: bool = False):
    """The run's trainer: the HF module under the flow's autocast (or its emulation), fp32 masters;
    ``packing``: each call's rows scored as one packed row (the source decides it, whatever the
    config says)."""
    from suite.numerics.scoring import Batch, batch_tensors
    from suite.rl.train import build_trainer

    cfg = replace(probe.cfg, packing=packing, trim_padding=probe.cfg.trim_padding and not packing)
    trainer = build_trainer(cfg, copy.deepcopy(probe.model))
    trainer.model.load_state_dict(weights)
    ids, attn = batch_tensors(roll.prompt_ids, roll.tokens, roll.mask)
    R, T = roll.tokens.shape[1], probe.cfg.sampling.temperature
    lps, fulls = [], []
    with torch.no_grad():
        for c in torch.arange(len(ids)).split(rows_per_call or len(ids)):
            lps.append(trainer.score(Batch(ids[c], attn[c], roll.tokens[c], T))[0].cpu())
            fulls.append(trainer.log_distribution(ids[c], attn[c], R, T).cpu())
    return torch.cat(lps), torch.cat(fulls)


def sampler_distribution(roll) -> torch.Tensor:
    """The distribution the sampler drew from (B, R, V): its full one, or, truncated, renormalised
    over its kept set."""
    if roll.kept is None:
        return roll.dist
    keep = torch.zeros_like(roll.dist,
                            dtype=torch.bool).scatter(-1, roll.kept.clamp(min=0), roll.kept >= 0)
    return torch.where(keep, roll.dist - roll.kept_mass.log()[..., None], -torch.inf)


def measure(trainer_logp, trainer_dist, roll) -> dict[str, float]:
    """The attribution metrics of one configuration on one replicate (METRICS)."""
    m = {**mismatch_metrics(trainer_logp, roll.logprobs, roll.mask),
         **ratio_band_fractions(trainer_logp, roll.logprobs, roll.mask),
         **distribution_divergence(trainer_dist, sampler_distribution(roll), roll.mask)}
    out = {key: m[src] for key, _, src in METRICS}
    out["tme"] -= 1.0  # exp|dlogp| - 1: 0 for a matched pair, so effects add as for the others
    return out


def run_probe(probe: Probe, configs: list[frozenset], sampler_factory=None) -> list[dict]:
    """Every configuration on every replicate: rows {config, batch, seed, metrics}. Rollouts are
    shared by the configurations whose sampler-side sources agree (same sampler, same batch, same
    seeds, same tokens)."""
    rows, make = [], sampler_factory or (lambda on: _sampler(probe, on))
    T, n = probe.cfg.sampling.temperature, probe.cfg.sampling.max_new_tokens
    for key in dict.fromkeys(frozenset(c & set(SAMPLER_SOURCES)) for c in configs):
        engine = make(key)
        try:
            for (b, prompts), seed in itertools.product(enumerate(probe.batches), probe.seeds):
                top_p = probe.top_p if "top_p" in key else 1.0
                G = probe.cfg.samples_per_prompt
                roll = engine.generate(prompts, n, T, top_p,
                                       sequence_seeds(seed, b + 1, list(range(len(prompts) // G)),
                                                      G), keep_dist=True)
                for on in [c for c in configs if c & set(SAMPLER_SOURCES) == key]:
                    weights = probe.theta1 if "staleness" in on else probe.theta0
                    rows_per_call = 1 if "micro_batch" in on else None
                    if "kernels" in on:
                        lp, full = _module_scores(probe, roll, weights, rows_per_call,
                                                  packing="packing" in on)
                    else:
                        lp, full = _replay_scores(probe, roll, weights, rows_per_call)
                    rows.append({"config": sorted(on), "batch": b, "seed": seed,
                                 **measure(lp, full, roll)})
        finally:
            if hasattr(engine, "close"):
                engine.close()
    return rows


def one_step_later(cfg, model_dir) -> dict:
    """theta1: the flow's own run, one RL step (same seed), from the same policy; its exported
    weights."""
    from suite.rl.policy import load_policy
    from suite.rl.train import run

    with tempfile.TemporaryDirectory(prefix="suite-attribute-") as tmp:
        step = replace(cfg, steps=1, out=tmp, name="theta1", eval=replace(cfg.eval, every=0),
                       logger=[], transfer=False, staleness=0, kv_cache="auto",
                       sampling=replace(cfg.sampling, top_p=1.0, top_k=0))
        from rich.console import Console

        d = run(step, Console(quiet=True))
        return load_policy(d / "policy")[0].state_dict()


def build_probe(cfg, batches: int, seeds: int, top_p: float) -> Probe:
    """The policy, its perfectible prompts in ``batches`` batches of the run's size, and the two
    weight sets."""
    from rich.console import Console

    from suite.rl.data import prepare_data
    from suite.rl.perfectible import load
    from suite.rl.policy import load_policy
    from suite.tasks.registry import prompt_ids

    model_dir, data_dir = prepare_data(cfg, Console(quiet=True))
    items, _ = load(data_dir, cfg.perfectible.max_prompts)
    need = batches * cfg.prompts_per_step
    if len(items) < need:
        raise ValueError(f"batches: {batches} batches of {cfg.prompts_per_step} prompts need "
                         f"{need} perfectible prompts, the set has {len(items)}")
    model, tok = load_policy(model_dir)
    G = cfg.samples_per_prompt
    groups = [items[i * cfg.prompts_per_step:(i + 1) * cfg.prompts_per_step]
              for i in range(batches)]
    prompts = [[prompt_ids(tok, it) for it in g for _ in range(G)] for g in groups]
    return Probe(cfg=cfg, model=model, theta0={k: v.clone() for k, v in model.state_dict().items()},
                 theta1=one_step_later(cfg, model_dir), batches=prompts, seeds=list(range(seeds)),
                 top_p=top_p)


def vllm_sampler(probe: Probe, on: frozenset):
    """The sampler of a configuration with engine=vllm: a vLLM engine per KV-cache choice (an engine
    argument), started with every token's log-prob returned (truncating=True: the full distribution
    and the kept set)."""
    from suite.numerics.vllm_engine import VllmEngine

    if "fp8_weights" in on and resolve(probe.cfg.precision).sampler_quant != "fp8":
        raise ValueError("fp8_weights: only an FP8-rollout flow's vLLM sampler quantises its "
                         "weights")
    flow = resolve(probe.cfg.precision)
    # the same flow without FP8 weights: its bf16 sampler
    if "fp8_weights" not in on and flow.sampler_quant:
        flow = resolve("bf16")
    e = VllmEngine(probe.model.name_or_path, flow, probe.cfg.vllm, seed=probe.cfg.seed,
                   kv_cache="fp8" if "kv_fp8" in on else "auto", truncating=True)
    e.sync(probe.theta0)
    return e


def cli(args: list[str]) -> int:
    """``suite attribute [key=value ...] [--batches N] [--seeds N] [--sources a,b] [--top-p P]
    [--out DIR]``."""
    import argparse

    from rich.console import Console

    from suite.analysis.attribution import summarise, table_markdown, title_of, waterfall
    from suite.numerics import machine
    from suite.results import atomic_write_json, atomic_write_text
    from suite.rl import config as cfgmod

    p = argparse.ArgumentParser(prog="suite attribute", add_help=False)
    p.add_argument("--batches", type=int, default=4)
    p.add_argument("--seeds", type=int, default=2)
    p.add_argument("--sources", default=None)
    p.add_argument("--top-p", type=float, default=0.8)
    p.add_argument("--out", type=Path, default=None)
    ns, overrides = p.parse_known_args(args)
    if ns.batches < 1 or ns.seeds < 1 or ns.batches * ns.seeds < 2:
        raise ValueError("--batches x --seeds: need at least 2 replicates for an interval (got "
                         f"{ns.batches} x {ns.seeds})")
    if not 0.0 < ns.top_p < 1.0:
        raise ValueError(f"--top-p: must be in (0, 1) (got {ns.top_p})")
    cfg = cfgmod.load(overrides)
    stack = stack_of(cfg.precision, cfg.engine)
    if ns.sources:
        chosen = ns.sources.split(",")
        bad = [s for s in chosen if s not in stack]
        if bad:
            raise ValueError(f"--sources: {', '.join(bad)} not a source of {cfg.precision}'s stack "
                             f"({', '.join(stack)})")
        stack = tuple(s for s in stack if s in chosen or (s == "kernels" and cfg.engine == "vllm"))
    configs = configurations(stack, cfg.engine)
    cls = machine.describe(cfg.gemm, cfg.threads)
    out = ns.out or Path(cfg.out) / "attribute" / f"{cfg.precision}__{cfg.engine}"
    console = Console()
    console.print(f"attribute: {cfg.precision}, engine {cfg.engine}, stack {', '.join(stack)}; "
                  f"{len(configs)} configurations x {ns.batches} batches x {ns.seeds} seeds on "
                  f"{machine.label(cls)}")
    probe = build_probe(cfg, ns.batches, ns.seeds, ns.top_p)
    factory = (lambda on: vllm_sampler(probe, on)) if cfg.engine == "vllm" else None
    rows = run_probe(probe, configs, factory)
    base = sorted(configs[0])
    summary = summarise(rows, list(stack), base,
                        {s: list(requires(s)) for s in stack if requires(s)})
    summary.update({"precision": cfg.precision, "engine": cfg.engine, "top_p": ns.top_p,
                    "machine_class": cls, "batches": ns.batches, "seeds": ns.seeds,
                    "responses_per_batch": len(probe.batches[0])})
    title = title_of(summary)
    md = table_markdown(summary, title)
    out.mkdir(parents=True, exist_ok=True)
    atomic_write_json(out / "rows.json", rows)
    atomic_write_json(out / "attribution.json", summary)
    atomic_write_text(out / "attribution.md", md + "\n")
    waterfall(summary, out / "waterfall", title)
    console.print(md, markup=False, highlight=False)
    console.print(f"written to {out} (attribution.md, attribution.json, rows.json, waterfall.png)")
    return 0
