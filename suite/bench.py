"""``suite bench``: where an RL step's time goes, and the sampler against HF ``generate``.

Prints (1) the RL step time split (sampling / trainer log-probs / update / other) with sampler
and trainer tokens per second, as medians over a short real run of the embedded default in
every precision flow (the cost of ``exact`` and of FP8 relative to bf16 included), and (2) the same rollout batch sampled by the built-in engine and by
Hugging Face ``generate`` (same weights, same dtype, same lengths), with the speed ratio.
Figures are measured on this machine each time; nothing here is asserted.
"""

from __future__ import annotations

import statistics
import tempfile
import time
from pathlib import Path

import torch
from rich.console import Console
from rich.table import Table

from suite import config as cfgmod
from suite.engine import TorchEngine
from suite.precision import gemm_backend, resolve
from suite.results import read_jsonl


def _median_time(fn, repeats: int) -> float:
    fn()  # warm-up
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def step_split(cfg, console: Console) -> dict:
    """Run ``cfg.steps`` real RL steps in a scratch directory and return median timings."""
    from suite.train import run

    with tempfile.TemporaryDirectory() as tmp:
        cfg.out = tmp
        d = run(cfg, Console(quiet=True))
        rows = read_jsonl(Path(d) / "timing.jsonl")[1:]  # drop the first (warm-up) step
    return {k: statistics.median(r[k] for r in rows) for k in rows[0] if k != "step"}


def sampler_vs_generate(cfg, repeats: int) -> list[dict]:
    """Tokens/s of the built-in engine and of HF ``generate`` on one identical batch."""
    from suite.policy import load_policy
    from suite.tasks import get_task
    from suite.train import prepare_data

    model_dir, data_dir = prepare_data(cfg, Console(quiet=True))
    model, tok = load_policy(model_dir)
    task = get_task(cfg.task)
    items = task.split("train", cfg.prompts_per_step)
    prompts = [tok(it.prompt)["input_ids"] for it in items for _ in range(cfg.samples_per_prompt)]
    n_new = cfg.sampling.max_new_tokens
    out = []
    for name in ("fp32", "bf16", "fp16"):
        flow = resolve(name)
        backend = gemm_backend(cfg.gemm, flow.sampler_dtype)
        engine = TorchEngine(model.config, flow.sampler_dtype, backend)
        engine.sync(model.state_dict())
        tokens = {}

        def ours():
            roll = engine.generate(prompts, n_new, 1.0, 1.0, torch.Generator().manual_seed(0))
            tokens["ours"] = roll.n_tokens

        hf = model.to(flow.sampler_dtype)
        hf.generation_config.pad_token_id = tok.pad_token_id
        ids = torch.tensor(prompts)

        def theirs():
            with torch.no_grad():
                torch.manual_seed(0)
                o = hf.generate(input_ids=ids, attention_mask=torch.ones_like(ids), do_sample=True, temperature=1.0,
                                top_p=1.0, top_k=0, max_new_tokens=n_new, eos_token_id=tok.eos_token_id)
            resp = o[:, ids.shape[1]:]
            tokens["hf"] = int(((resp != tok.pad_token_id) | (resp == tok.eos_token_id)).sum())

        t_ours = _median_time(ours, repeats)
        t_hf = _median_time(theirs, max(1, repeats // 2))
        model.float()
        out.append({"dtype": name, "engine_backend": backend, "batch": len(prompts),
                    "ours_tok_s": tokens["ours"] / t_ours, "hf_tok_s": tokens["hf"] / t_hf,
                    "ours_s": t_ours, "hf_s": t_hf, "speedup": t_hf / t_ours * tokens["ours"] / max(tokens["hf"], 1)})
    return out


def main(args: list[str]) -> int:
    console = Console(width=200)
    steps = 11
    base = cfgmod.load(args)
    torch.set_num_threads(base.threads)
    table = Table(title=f"RL step time split, medians over {steps - 1} steps ({base.tier} tier, "
                        f"{base.prompts_per_step}x{base.samples_per_prompt} responses, {base.threads} thread(s))")
    for col in ("precision", "gemm", "step s", "sampling s", "trainer log-probs s", "update s", "other s",
                "sampler tok/s", "trainer tok/s"):
        table.add_column(col)
    from suite.precision import FLOWS

    for name in FLOWS:  # every flow: the cost of exact and of the FP8 emulation is part of the answer
        cfg = cfgmod.load(args + [f"precision={name}", f"steps={steps}", "name=bench"])
        t = step_split(cfg, console)
        table.add_row(name, gemm_backend(cfg.gemm, resolve(name).trainer_dtype), f"{t['time/step_s']:.3f}",
                      f"{t['time/sample_s']:.3f}", f"{t['time/logprob_s']:.3f}", f"{t['time/update_s']:.3f}",
                      f"{t['time/other_s']:.3f}", f"{t['throughput/sampler_tok_s']:.0f}",
                      f"{t['throughput/trainer_tok_s']:.0f}")
    console.print(table)
    t2 = Table(title="one rollout batch: built-in engine vs Hugging Face generate (same weights, dtype, batch)")
    for col in ("dtype", "engine gemm", "batch", "engine s", "HF generate s", "engine tok/s", "HF tok/s", "speed-up"):
        t2.add_column(col)
    for r in sampler_vs_generate(base, repeats=5):
        t2.add_row(r["dtype"], r["engine_backend"], str(r["batch"]), f"{r['ours_s']:.3f}", f"{r['hf_s']:.3f}",
                   f"{r['ours_tok_s']:.0f}", f"{r['hf_tok_s']:.0f}", f"{r['speedup']:.1f}x")
    console.print(t2)
    return 0


def mismatch_main(args: list[str]) -> int:
    """``suite mismatch``: step-0 mismatch of every precision flow on one identical rollout batch.

    Same policy, same prompts, same sampling seed; each flow's sampler draws the batch and its
    trainer scores it at the same parameters (no update). Measured, never tuned.
    """
    import copy

    from suite.mismatch import mismatch_metrics
    from suite.perfectible import load
    from suite.policy import load_policy
    from suite.precision import FLOWS
    from suite.train import batch_tensors, build_engines, prepare_data

    console = Console(width=200)
    base = cfgmod.load(args)
    torch.set_num_threads(base.threads)
    model_dir, data_dir = prepare_data(base, console)
    items, _ = load(data_dir, base.perfectible.max_prompts)
    model, tok = load_policy(model_dir)
    prompts = [tok(it.prompt)["input_ids"] for it in items[:base.prompts_per_step] for _ in range(base.samples_per_prompt)]
    table = Table(title=f"step-0 mismatch, {len(prompts)} responses, same prompts and seed for every flow")
    for col in ("flow", "mean abs dp", "max abs dp", "k3 KL", "mean abs seq log-ratio", "max abs log-prob diff",
                "k3 / bf16", "sample s", "score s"):
        table.add_column(col)
    rows = {}
    for name in FLOWS:
        cfg = cfgmod.load(args + [f"precision={name}"])
        trainer, engine, _ = build_engines(cfg, copy.deepcopy(model))
        engine.sync(trainer.model.state_dict())
        t0 = time.perf_counter()
        roll = engine.generate(prompts, cfg.sampling.max_new_tokens, cfg.sampling.temperature, cfg.sampling.top_p,
                               torch.Generator().manual_seed(cfg.seed))
        t1 = time.perf_counter()
        ids, attn = batch_tensors(roll.prompt_ids, roll.tokens, roll.mask)
        with torch.no_grad():
            logp, _ = trainer.logprobs(ids, attn, roll.tokens.shape[1], roll.tokens, cfg.sampling.temperature)
        rows[name] = (mismatch_metrics(logp, roll.logprobs, roll.mask), t1 - t0, time.perf_counter() - t1)
    ref = rows.get("bf16", (None,))[0]
    for name, (m, ts, tl) in rows.items():
        ratio = m["mismatch/kl_k3"] / ref["mismatch/kl_k3"] if ref and ref["mismatch/kl_k3"] else float("nan")
        table.add_row(name, f"{m['mismatch/prob_diff/mean']:.2e}", f"{m['mismatch/prob_diff/max']:.2e}",
                      f"{m['mismatch/kl_k3']:.2e}", f"{m['mismatch/seq_log_ratio/mean_abs']:.2e}",
                      f"{m['mismatch/logprob_diff/max']:.2e}", f"{ratio:.3g}", f"{ts:.2f}", f"{tl:.2f}")
    console.print(table)
    return 0
