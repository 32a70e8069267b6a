"""``suite bench``: where an RL step's time goes, and the sampler against HF ``generate``.

Prints (1) the RL step time split (sampling / trainer log-probs / update / other) with sampler
and trainer tokens per second, as medians over a short real run of the embedded default in
every precision flow (the cost of ``exact`` and of FP8 relative to bf16 included), and (2) the same
rollout batch sampled by the built-in engine and by Hugging Face ``generate`` (same weights, same
dtype, same lengths), with the speed ratio; with ``engine=vllm`` also by vLLM, with its start-up
time (and (1) runs the flows vLLM supports here). Figures are measured on this machine each time;
nothing here is asserted.
"""

from __future__ import annotations

import math
import statistics
import tempfile
import time
from pathlib import Path

import torch
from rich.console import Console
from rich.table import Table

from suite import dist
from suite.console import make_console
from suite.experiments import bench_targets
from suite.numerics import machine
from suite.numerics.engine import TorchEngine
from suite.numerics.precision import gemm_backend, resolve
from suite.results import git, read_jsonl
from suite.rl import config as cfgmod
from suite.tasks.registry import prompt_ids


def median_time(fn, repeats: int, cuda: bool = False) -> float:
    """Median seconds of ``fn()`` over ``repeats`` runs after one warm-up; on a GPU (``cuda``) timed
    with CUDA events, which measure the kernels queued between them rather than the host's return
    from an asynchronous launch."""
    fn()
    times = []
    for _ in range(repeats):
        if cuda:
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            fn()
            b.record()
            b.synchronize()
            times.append(a.elapsed_time(b) / 1e3)
        else:
            t0 = time.perf_counter()
            fn()
            times.append(time.perf_counter() - t0)
    return statistics.median(times)


def step_split(cfg, console: Console) -> dict:
    """Run ``cfg.steps`` real RL steps in a scratch directory and return median timings."""
    from suite.rl.train import run

    with tempfile.TemporaryDirectory() as tmp:
        cfg.out = tmp
        d = run(cfg, Console(quiet=True))
        rows = read_jsonl(Path(d) / "timing.jsonl")[1:]  # drop the first (warm-up) step
    return {k: statistics.median(r[k] for r in rows) for k in rows[0] if k != "step"}


def sampler_vs_generate(cfg, repeats: int, dtypes=("fp32", "bf16", "fp16"),
                        vllm_engines: dict | None = None) -> list[dict]:
    """Tokens/s of the built-in engine and of HF ``generate`` on one identical batch, and of vLLM
    (with its start-up time) when ``cfg.engine == "vllm"``. ``vllm_engines`` ({dtype name: engine})
    reuses engines already started (tests); otherwise one is started, timed and closed per dtype.
    Both sides run where a run computes on this host (suite/dist.py), so that the table's machine
    class is the one measured."""
    from suite.rl.data import prepare_data
    from suite.rl.policy import load_policy
    from suite.tasks.registry import get_task

    model_dir, data_dir = prepare_data(cfg, Console(quiet=True))
    device = dist.World().device
    model, tok = load_policy(model_dir)
    model.to(device)
    task = get_task(cfg.task, None, cfg.include_path)
    items = task.split("train", cfg.prompts_per_step)
    prompts = [prompt_ids(tok, it) for it in items for _ in range(cfg.samples_per_prompt)]
    n_new = cfg.sampling.max_new_tokens
    out = []
    for name in dtypes:
        flow = resolve(name)
        backend = gemm_backend(cfg.gemm, flow.sampler_dtype, device.split(":")[0])
        engine = TorchEngine(model.config, flow.sampler_dtype, backend, device=device)
        engine.sync(model.state_dict())
        tokens = {}

        def ours():
            roll = engine.generate(prompts, n_new, 1.0, 1.0, torch.Generator().manual_seed(0))
            tokens["ours"] = roll.n_tokens

        hf = model.to(flow.sampler_dtype)
        hf.generation_config.pad_token_id = tok.pad_token_id
        ids = torch.tensor(prompts, device=device)

        def theirs():
            with torch.no_grad():
                torch.manual_seed(0)
                o = hf.generate(input_ids=ids, attention_mask=torch.ones_like(ids), do_sample=True,
                                temperature=1.0, top_p=1.0, top_k=0, max_new_tokens=n_new,
                                eos_token_id=tok.eos_token_id)
            resp = o[:, ids.shape[1]:]
            tokens["hf"] = int(((resp != tok.pad_token_id) | (resp == tok.eos_token_id)).sum())

        t_ours = median_time(ours, repeats)
        t_hf = median_time(theirs, max(1, repeats // 2))
        model.float()
        row = {"dtype": name, "engine_backend": backend, "batch": len(prompts),
               "ours_tok_s": tokens["ours"] / t_ours, "hf_tok_s": tokens["hf"] / t_hf,
               "ours_s": t_ours, "hf_s": t_hf,
               "speedup": t_hf / t_ours * tokens["ours"] / max(tokens["hf"], 1)}
        if cfg.engine == "vllm":
            row.update(_vllm_speed(cfg, name, model, prompts, n_new, repeats,
                                   (vllm_engines or {}).get(name)))
        out.append(row)
    return out


def _vllm_speed(cfg, name: str, model, prompts, n_new: int, repeats: int, engine=None) -> dict:
    """vLLM tokens/s on the same batch (same weights, synced in memory), and its start-up time."""
    from suite.numerics.vllm_engine import VllmEngine

    own = engine is None
    if own:
        engine = VllmEngine(model.name_or_path, resolve(name), cfg.vllm, seed=cfg.seed)
    try:
        engine.sync(model.state_dict())
        tokens = {}

        def theirs():
            tokens["vllm"] = engine.generate(prompts, n_new, 1.0, 1.0,
                                             torch.Generator().manual_seed(0)).n_tokens

        t = median_time(theirs, repeats)
        return {"vllm_s": t, "vllm_tok_s": tokens["vllm"] / t, "vllm_startup_s": engine.startup_s}
    finally:
        if own:
            engine.close()


def sampler_table(rows: list[dict]) -> Table:
    """The rollout-speed table of ``suite bench`` (with vLLM columns when the rows have them)."""
    vllm = "vllm_tok_s" in rows[0]
    t2 = Table(title="one rollout batch: built-in engine vs Hugging Face generate"
               + (" vs vLLM" if vllm else "")
                     + " (same weights, dtype, batch)")
    cols = ["dtype", "engine gemm", "batch", "engine s", "HF generate s", "engine tok/s",
            "HF tok/s", "speed-up"]
    for col in cols + (["vLLM s", "vLLM tok/s", "vLLM start-up s"] if vllm else []):
        t2.add_column(col)
    for r in rows:
        cells = [r["dtype"], r["engine_backend"], str(r["batch"]), f"{r['ours_s']:.3f}",
                 f"{r['hf_s']:.3f}", f"{r['ours_tok_s']:.0f}", f"{r['hf_tok_s']:.0f}",
                 f"{r['speedup']:.1f}x"]
        if vllm:
            cells += [f"{r['vllm_s']:.3f}", f"{r['vllm_tok_s']:.0f}", f"{r['vllm_startup_s']:.1f}"]
        t2.add_row(*cells)
    return t2


def scaling_main(args: list[str], worlds: list[int], steps: int = 6) -> int:
    """``suite bench nproc=1,2 ...``: the same run (same global batch) on 1, 2, ... ranks through
    torchrun; median step time split, peak memory per rank, and the scaling efficiency t(1) / (N
    t(N))."""
    import json
    import os
    import subprocess
    import sys

    console = make_console()
    base = cfgmod.load(args)
    rows = {}
    for n in worlds:
        with tempfile.TemporaryDirectory() as tmp:
            cmd = [sys.executable, "-m", "suite.cli", "run", *args, f"nproc={n}", f"steps={steps}",
                   f"out={tmp}", "name=bench", f"ckpt_every={steps}"]
            console.print(f"bench: {n} rank(s): {' '.join(cmd[3:])}")
            p = subprocess.run(cmd, capture_output=True, text=True, env=os.environ)
            if p.returncode != 0:
                console.print(p.stdout[-2000:] + p.stderr[-2000:], markup=False)
                return 1
            d = next(Path(tmp, "bench").iterdir())
            timing = read_jsonl(d / "timing.jsonl")[1:]  # drop the warm-up step
            env = json.loads((d / "env.json").read_text())
        rows[n] = {k: statistics.median(r[k] for r in timing) for k in timing[0] if k != "step"}
        rows[n]["world"] = env["world"]
    t1 = rows[worlds[0]]["time/step_s"] * worlds[0]
    table = Table(title=f"data-parallel scaling, {base.precision}, {base.tier} tier "
                        f"({base.prompts_per_step}x{base.samples_per_prompt} responses per step, "
                        f"the same for every world size), {base.threads} thread(s) per rank, "
                        f"medians over {steps - 1} steps; machine class "
                        f"{machine.describe(base.gemm, base.threads)['id']}, "
                        f"{os.cpu_count()} cores")
    for col in ("ranks", "backend", "step s", "sampling s", "trainer log-probs s", "update s",
                "other s", "peak RSS / rank MiB", "speed-up", "efficiency"):
        table.add_column(col)
    for n, t in rows.items():
        table.add_row(str(n), str(t["world"]["backend"]), f"{t['time/step_s']:.3f}",
                      f"{t['time/sample_s']:.3f}", f"{t['time/logprob_s']:.3f}",
                      f"{t['time/update_s']:.3f}", f"{t['time/other_s']:.3f}",
                      f"{t['memory/peak_rss_mb/max']:.0f}", f"{t1 / t['time/step_s']:.2f}x",
                      f"{t1 / (n * t['time/step_s']):.0%}")
    console.print(table)
    return 0


def main(args: list[str]) -> int:
    vs = [a for a in args if a == "--vs" or a.startswith("--vs=")]
    # suite bench --vs trl [overrides]: TRL's GRPOTrainer side by side
    # (suite/experiments/bench_trl.py)
    if vs:
        i = args.index(vs[0])
        other = vs[0].split("=",
                            1)[1] if "=" in vs[0] else (args[i + 1] if i + 1 < len(args) else "")
        if other != "trl":
            raise ValueError(f"--vs: the one framework to compare with is trl (got {other!r})")
        from suite.experiments import bench_trl

        return bench_trl.main([a for j, a in enumerate(args) if j != i
                               and not (vs[0] == "--vs" and j == i + 1)])
    worlds = next((a.split("=", 1)[1] for a in args if a.startswith("nproc=") and "," in a), None)
    if worlds:  # a scaling measurement over world sizes
        try:
            sizes = [int(x) for x in worlds.split(",")]
        except ValueError:
            raise ValueError("nproc: expected a list of rank counts like nproc=1,2 (got "
                             f"'{worlds}')") from None
        return scaling_main([a for a in args if not a.startswith("nproc=")], sizes)
    flags = {a for a in args if a in ("--compare", "--write-baseline", "--profile")}
    args = [a for a in args if a not in flags]
    console = make_console()
    if "--profile" in flags:  # what the steps spend their time on (bench_profile.py)
        if "--compare" in flags:
            raise ValueError("--profile: --compare compares step times with the bench baseline; "
                             "run them separately")
        from suite.experiments import bench_profile

        return bench_profile.main(args, "--write-baseline" in flags, console)
    steps = 11
    base = cfgmod.load(args)
    cls = machine.describe(base.gemm, base.threads)
    setting = {"command": " ".join(["suite", "bench", *args]), "steps": steps, "tier": base.tier,
               "threads": base.threads, "engine": base.engine,
               "git_sha": git("rev-parse", "HEAD"), "git_dirty": bool(git("status", "-s"))}
    baseline = None
    if "--compare" in flags:  # refused before anything is measured
        baseline = bench_targets.load_baseline(bench_targets.BASELINE_DIR, cls["id"])
        bench_targets.check_setting(baseline, setting)
    torch.set_num_threads(base.threads)
    table = Table(title=f"RL step time split, medians over {steps - 1} steps ({base.tier} tier, "
                        f"{base.prompts_per_step}x{base.samples_per_prompt} responses, "
                        f"{base.threads} thread(s)); machine class "
                        f"{machine.describe(base.gemm, base.threads)['id']}")
    for col in ("precision", "gemm", "step s", "sampling s", "trainer log-probs s", "update s",
                "other s", "sampler tok/s", "trainer tok/s"):
        table.add_column(col)
    from suite.numerics.precision import FLOWS

    flows = list(FLOWS)
    # the flows this device's vLLM can run (the others are refused in validate)
    if base.engine == "vllm":
        from suite.numerics.vllm_support import supported_flows

        flows = supported_flows()
    # every flow: the cost of exact and of the FP8 emulation is part of the answer
    medians = {}
    for name in flows:
        cfg = cfgmod.load(args + [f"precision={name}", f"steps={steps}", "name=bench"])
        t = medians[name] = step_split(cfg, console)
        table.add_row(name,
                      gemm_backend(cfg.gemm, resolve(name).trainer_dtype,
                                   dist.World().device.split(":")[0]), f"{t['time/step_s']:.3f}",
                      f"{t['time/sample_s']:.3f}", f"{t['time/logprob_s']:.3f}",
                      f"{t['time/update_s']:.3f}", f"{t['time/other_s']:.3f}",
                      f"{t['throughput/sampler_tok_s']:.0f}",
                      f"{t['throughput/trainer_tok_s']:.0f}")
    console.print(table)
    rounds = [{f: m["time/step_s"] for f, m in medians.items()}]
    if bench_targets.REFERENCE_FLOW in medians:
        rounds += target_rounds(args, steps, [f for f in medians if f in bench_targets.TARGETS],
                                console)
        console.print(targets_table(rounds))
    else:  # every target is a ratio to it (engine=vllm runs only what vLLM supports here)
        console.print(f"no targets: this run has no {bench_targets.REFERENCE_FLOW} step to "
                      "divide by")
    if baseline is not None:
        console.print(compare_table(medians, baseline))
    if "--write-baseline" in flags:
        path = bench_targets.write_baseline(bench_targets.BASELINE_DIR, cls, medians,
                                             setting, rounds)
        console.print(f"baseline of {cls['id']} written: {path}")
    console.print(sampler_table(sampler_vs_generate(base, repeats=5)))
    return 0


def target_rounds(args: list[str], steps: int, flows: list[str],
                  console: Console) -> list[dict[str, float]]:
    """The rounds after the first (bench_targets.ROUNDS): bf16 and the target ``flows`` again, in
    turn, the order reversed every other round; each flow's median step per round."""
    rounds = []
    for r in range(1, bench_targets.ROUNDS):
        order = [bench_targets.REFERENCE_FLOW, *flows]
        got = {}
        for name in order[::-1] if r % 2 else order:
            console.print(f"target round {r + 1}/{bench_targets.ROUNDS}: {name}")
            cfg = cfgmod.load(args + [f"precision={name}", f"steps={steps}", "name=bench"])
            got[name] = step_split(cfg, console)["time/step_s"]
        rounds.append(got)
    return rounds


def targets_table(rounds: list[dict[str, float]]) -> Table:
    """Each target flow's step over bf16's in each round of this run (flow -> step seconds), the
    median beside its target."""
    table = Table(title=f"targets: step time over the {bench_targets.REFERENCE_FLOW} step of the "
                        f"same round, {len(rounds)} round(s) of this run")
    for col in ("flow", "ratio per round", "median", "target", ""):
        table.add_column(col)
    for r in bench_targets.round_rows(rounds):
        table.add_row(r["flow"], "  ".join(f"{x:.2f}x" for x in r["ratios"]),
                      f"{r['ratio']:.2f}x", f"<= {r['target']:.2f}x",
                      f"{'met' if r['met'] else 'MISSED'} ({r['met_rounds']} of "
                      f"{len(r['ratios'])} rounds)")
    return table


def compare_table(medians: dict[str, dict], baseline: dict) -> Table:
    """Today's medians over the committed baseline's, stage by stage."""
    setting = baseline.get("setting", {})
    table = Table(title=f"now / baseline ({baseline['machine_class']['id']}, "
                        f"{str(setting.get('git_sha', '?'))[:7]}; one run each, so ratios "
                        f"within {bench_targets.NOISE:.2f}x are what two runs of one commit "
                        "differ by)")
    for col in ("flow", *(s.removeprefix("time/").removesuffix("_s") for s in
                          bench_targets.STAGES), ""):
        table.add_column(col)
    for r in bench_targets.compare_rows(medians, baseline):
        cells = [f"{now:.3f} / {then:.3f} = {ratio:.2f}x" for now, then, ratio in
                 (r["stages"].get(s, (math.nan,) * 3) for s in bench_targets.STAGES)]
        table.add_row(r["flow"], *cells, "SLOWER" if r["slower"] else "")
    return table


def mismatch_main(args: list[str]) -> int:
    """``suite mismatch``: step-0 mismatch of every precision flow on one identical rollout batch.

    Same policy, same prompts, same sampling seed; each flow's sampler draws the batch and its
    trainer scores it at the same parameters (no update). Measured, never tuned.
    """
    import copy

    from suite.numerics.precision import FLOWS
    from suite.rl.data import prepare_data
    from suite.rl.perfectible import load
    from suite.rl.policy import load_policy
    from suite.rl.train import build_engines

    console = make_console()
    base = cfgmod.load(args)
    torch.set_num_threads(base.threads)
    model_dir, data_dir = prepare_data(base, console)
    items, _ = load(data_dir, base.perfectible.max_prompts)
    model, tok = load_policy(model_dir)
    prompts = [prompt_ids(tok, it) for it in items[:base.prompts_per_step]
               for _ in range(base.samples_per_prompt)]
    table = Table(title=f"step-0 mismatch, {len(prompts)} responses, same prompts and seed for "
                        "every flow; machine class "
                        f"{machine.label(machine.describe(base.gemm, base.threads))}")
    for col in ("flow", "mean abs dp", "max abs dp", "k3 KL", "mean abs seq log-ratio",
                "max abs log-prob diff", "k3 / bf16", "sample s", "score s"):
        table.add_column(col)
    rows = {}
    flows = list(FLOWS)
    # vLLM rows next to the built-in engine's, for the flows vLLM runs here
    if base.engine == "vllm":
        from suite.numerics.vllm_support import supported_flows

        flows = [f"{n} ({e})" for n in supported_flows() for e in ("torch", "vllm")]
    for label in flows:
        name, _, eng = label.partition(" (")
        cfg = cfgmod.load(args + [f"precision={name}"] + ([f"engine={eng[:-1]}"] if eng else []))
        trainer, engine, _ = build_engines(cfg, copy.deepcopy(model))
        try:
            rows[label] = step0_mismatch(cfg, trainer, engine, prompts)
        finally:
            if hasattr(engine, "close"):
                engine.close()
    ref = rows.get("bf16", rows.get("bf16 (torch)", (None,)))[0]
    for name, (m, ts, tl) in rows.items():
        ratio = (m["mismatch/kl_k3"] / ref["mismatch/kl_k3"] if ref and ref["mismatch/kl_k3"]
                 else float("nan"))
        table.add_row(name, f"{m['mismatch/prob_diff/mean']:.2e}",
                      f"{m['mismatch/prob_diff/max']:.2e}", f"{m['mismatch/kl_k3']:.2e}",
                      f"{m['mismatch/seq_log_ratio/mean_abs']:.2e}",
                      f"{m['mismatch/logprob_diff/max']:.2e}", f"{ratio:.3g}", f"{ts:.2f}",
                      f"{tl:.2f}")
    console.print(table)
    return 0


def step0_mismatch(cfg, trainer, engine, prompts) -> tuple[dict, float, float]:
    """Sample ``prompts`` with ``engine`` at the trainer's parameters, score them with ``trainer``:
    (mismatch metrics, sampling seconds, scoring seconds). No update in between."""
    from suite.numerics.mismatch import mismatch_metrics
    from suite.numerics.scoring import Batch, batch_tensors

    engine.sync(trainer.model.state_dict())
    t0 = time.perf_counter()
    roll = engine.generate(prompts, cfg.sampling.max_new_tokens, cfg.sampling.temperature,
                           cfg.sampling.top_p, torch.Generator().manual_seed(cfg.seed))
    t1 = time.perf_counter()
    ids, attn = batch_tensors(roll.prompt_ids, roll.tokens, roll.mask)
    with torch.no_grad():
        logp, _, _ = trainer.score(Batch(ids, attn, roll.tokens, cfg.sampling.temperature))
    # rollouts come back on the CPU (suite/numerics/engine.py), the trainer's log-probs on its
    # device
    return mismatch_metrics(logp.cpu(), roll.logprobs, roll.mask), t1 - t0, time.perf_counter() - t1
