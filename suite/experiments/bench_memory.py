"""``suite bench-memory``: peak memory and time of a training update with each real-model option on
and off.

The embedded policy's architecture with a synthetic vocabulary (default 151,936 tokens, Qwen2.5's)
makes the output head and the fp32 log-softmax as large as a real model's, which is where the memory
of an RL update peaks. Each variant runs in its own process (the peak resident set only grows within
a process): build the model and a batch, time ``steps`` updates (log-probs and entropy of the
responses, a loss, the backward pass, the optimizer step), and report the peak over what the built
model held: the memory the update itself needed. It measures where a run computes on this host
(``--device``, default suite/dist.py's choice): on the CPU the process's peak RSS minus the RSS
after the model was built, on a CUDA GPU the caching allocator's peak of allocated bytes minus those
held once the model was there; the tables and the written file name that device's machine class. The
reward pool is timed on the math reward (math-verify worker processes) with 1 and ``reward_workers``
workers. ``--plan`` instead compares the memory plan (suite/numerics/memory.py) with the measured
peak at PLAN_SIZES, glibc's mmap threshold fixed (``LIVE_BYTES``).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

VARIANTS = {"baseline": {}, "gradient_checkpointing": {"gradient_checkpointing": True},
            "logprob_chunk": {"logprob_chunk": 16},
            "both": {"gradient_checkpointing": True, "logprob_chunk": 16}}
# what ``one`` reads, on CPU and on a CUDA GPU
PEAK = {False: "peak RSS", True: "torch.cuda.max_memory_allocated"}


def _rss_mb() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * resource.getpagesize() / 2**20


def _peak_rss_mb() -> float:
    """This process's peak resident set in MiB: VmHWM, the high-water mark of its own address space.
    Not getrusage's ru_maxrss, which Linux carries across execve (getrusage(2)): a measurement
    started from a larger parent, as ``suite accept`` after its GEMM checks, would report the
    parent's peak."""
    try:
        with open("/proc/self/status") as f:
            # kB
            return next(int(line.split()[1]) for line in f if line.startswith("VmHWM:")) / 1024
    except (OSError, StopIteration):
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / (
            1024 if sys.platform != "darwin" else 2**20)


def _widths(hidden: int, arch: str | None = None) -> dict:
    """The small tier's layers, at ``hidden`` (0: the tier's width) with the SwiGLU widened in
    proportion; or ``arch``, a preset's layer widths (suite/rl/models.py: r1d-1.5b), embedded layers
    with synthetic weights."""
    from suite.rl import config

    if arch:
        from suite.rl.models import PRESETS

        pre = PRESETS[arch]
        cfg = pre.config
        return dict(hidden=pre.hidden, layers=pre.layers, heads=cfg["num_attention_heads"],
                    kv_heads=cfg["num_key_value_heads"], mlp=cfg["intermediate_size"])

    small = config.load(["tier=small"]).policy
    h = hidden or small.hidden
    return dict(hidden=h, layers=small.layers, heads=small.heads, kv_heads=small.kv_heads,
                mlp=small.mlp * h // small.hidden)


def one(variant: str, vocab: int, batch: int, prompt: int, response: int, steps: int,
        precision: str, hidden: int = 0, device: str | None = None,
        arch: str | None = None) -> dict:
    """One variant in this process: {peak_mb (over the built model), step_s (median), device, peak
    (how)} on ``device`` (default: where this host computes, as a run does). On CPU the peak
    resident set; on a GPU the caching allocator's peak of allocated bytes
    (``torch.cuda.max_memory_allocated``)."""
    import torch

    from suite import dist
    from suite.numerics.precision import resolve
    from suite.numerics.scoring import Batch
    from suite.numerics.trainer import Trainer, TrainerOptions
    from suite.rl import config
    from suite.rl.policy import PolicySpec, build_model

    device = device or dist.World().device
    cuda = device.startswith("cuda")
    if not cuda and device != "cpu":
        raise ValueError(f"--device: {device} has no peak to read; bench-memory measures the CPU's "
                         "resident set or a CUDA GPU's allocator")
    torch.manual_seed(0)
    torch.set_num_threads(1)
    spec = PolicySpec(**_widths(hidden, arch))
    model = build_model(spec, vocab_size=vocab, max_len=prompt + response + 8)
    cfg = config.load(["tier=small", f"precision={precision}"])
    trainer = Trainer(model, resolve(precision), "native", cfg.optim,
                      TrainerOptions(**VARIANTS[variant]), world=dist.World(device=device))
    ids = torch.randint(3, vocab, (batch, prompt + response))
    attn = torch.ones_like(ids)
    # one left-padded prompt, as in every real batch: the attention then runs with a padding mask
    attn[0, 0] = 0
    if cuda:
        ids, attn = ids.to(device), attn.to(device)
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated() / 2**20 if cuda else _rss_mb()
    times = []
    for _ in range(steps):
        t0 = time.perf_counter()

        def loss_fn():
            logp, ent, _ = trainer.score(Batch(ids, attn, ids[:, -response:], 1.0))
            return -(logp.mean() + 0.01 * ent.mean()), {}

        trainer.step(loss_fn)
        times.append(time.perf_counter() - t0)
    peak = torch.cuda.max_memory_allocated() / 2**20 if cuda else _peak_rss_mb()
    return {"variant": variant, "peak_mb": peak - base,
            "step_s": statistics.median(times[1:] or times),
            "params": sum(p.numel() for p in model.parameters()), "device": device,
            "peak": PEAK[cuda]}


def predicted_mb(variant: str, vocab: int, batch: int, prompt: int, response: int, precision: str,
                 hidden: int = 0, arch: str | None = None, **_) -> float:
    """The memory plan's prediction of what ``one`` measures: the update's peak over the built model
    and batch (suite/numerics/memory.py, for the same policy, no sampler), i.e. the plan's peak less
    the fp32 masters."""
    from suite.numerics.memory import Arch, Shape, plan
    w = _widths(hidden, arch)
    a = Arch(w["layers"], w["hidden"], w["heads"], w["kv_heads"], w["mlp"], vocab)
    opts = VARIANTS[variant]
    s = Shape(micro_batch=batch, prompt=prompt, response=response, sampler="none",
              compute={"fp32": 4, "bf16": 2, "fp16": 2}[precision],
              checkpointing=opts.get("gradient_checkpointing", False),
              logprob_chunk=opts.get("logprob_chunk", 0))
    p = plan(a, s)
    return (p.peak - p.states[0].bytes) / 2**20


# (variant, vocab, batch, prompt, response, precision, hidden): the sizes `suite bench-memory
# --plan` checks the plan at: the head's peak (a 152k vocabulary), the layers' (2k-token sequences,
# a small vocabulary), wider layers.
PLAN_SIZES = [("baseline", 151936, 8, 32, 128, "bf16", 0), ("both", 151936, 8, 32, 128, "bf16", 0),
              ("baseline", 512, 4, 32, 2048, "bf16", 0),
              ("gradient_checkpointing", 512, 4, 32, 2048, "bf16", 0),
              ("logprob_chunk", 65536, 2, 32, 384, "fp32", 0),
              ("baseline", 4096, 2, 32, 1024, "bf16", 512),
              ("gradient_checkpointing", 4096, 2, 32, 1024, "fp32", 512)]


def plan_check(console, steps: int, write: str | None = None, device: str | None = None) -> int:
    """Predicted vs measured peak of an update at PLAN_SIZES (each in its own process) on ``device``
    (default: the host's, as a run's); ``write``: the rows as JSON (docs/tasks.md's table is
    generated from the committed file, ``plan_markdown``), labelled with the class of the device the
    peaks were measured on."""
    from rich.table import Table

    from suite import dist
    from suite.numerics import machine
    from suite.results import atomic_write_json

    device = device or dist.World().device
    rows = []
    for variant, vocab, batch, prompt, response, precision, hidden in PLAN_SIZES:
        sizes = dict(vocab=vocab, batch=batch, prompt=prompt, response=response, steps=steps,
                     precision=precision, hidden=hidden)
        m = _measure(variant, {**sizes, "device": device}, env=LIVE_BYTES)
        if m["device"] != device:
            raise RuntimeError(f"variant {variant} measured on {m['device']}, not {device}")
        got = m["peak_mb"]
        want = predicted_mb(variant, **sizes)
        rows.append({"option": variant, **sizes, "hidden": _widths(hidden)["hidden"],
                     "predicted_mib": round(want, 1), "measured_mib": round(got, 1),
                     "error": round((want - got) / got, 4)})
        console.print(f"{variant} V={vocab} B={batch} R={response} {precision}: predicted "
                      f"{want:.0f} MiB, measured {got:.0f}")
    cls, cuda = machine.describe("auto", 1, device=device)["id"], device.startswith("cuda")
    peak = PEAK[cuda] + ("" if cuda else " (mmap threshold 64 KiB: live bytes)")
    t = Table("option", "hidden", "vocab", "batch x (prompt + response)", "precision",
              "predicted MiB", "measured MiB", "error",
              title=f"memory plan vs measured {peak} over the built model of an update, embedded "
                    f"small-tier layers, on {device}, machine class {cls}")
    for r in rows:
        t.add_row(*_cells(r))
    console.print(t)
    if write:
        import torch

        atomic_write_json(Path(write),
                          {"machine_class": cls, "device": device, "peak": peak,
                           "torch": torch.__version__, "steps": steps,
                           "command": f"suite bench-memory --plan --steps {steps}", "rows": rows})
        console.print(f"written to {write}")
    return 0


def _cells(r: dict) -> list[str]:
    option = {"both": "logprob_chunk=16 + gradient_checkpointing",
              "logprob_chunk": "logprob_chunk=16"}.get(
        r["option"], r["option"])
    return [option, str(r["hidden"]), f"{r['vocab']:,}", f"{r['batch']} x ({r['prompt']} + "
                                                         f"{r['response']})",
            r["precision"], f"{r['predicted_mib']:.0f}", f"{r['measured_mib']:.0f}",
            f"{r['error']:+.1%}"]


def plan_markdown(path: Path, part: str = "table") -> str:
    """The committed plan-vs-measured rows (``--plan --write``) as docs/tasks.md's table, or
    (part=range) the smallest and largest error, or (part=under) the rows the plan underestimates,
    the largest shortfall first."""
    rows = json.loads(Path(path).read_text())["rows"]
    if part == "range":
        errors = [r["error"] for r in rows]
        return f"{min(errors):+.0%} to {max(errors):+.0%}"
    if part == "under":
        under = sorted((r for r in rows if r["error"] < 0), key=lambda r: r["error"])
        if not under:
            return "no row"
        return f"{len(under)} of the {len(rows)} rows: " + ", ".join(
            f"{_cells(r)[0]} (hidden {r['hidden']}, vocabulary {r['vocab']:,}, {r['precision']}) "
            f"by {-r['error']:.1%}"
            for r in under)
    if part != "table":
        raise ValueError(f"part must be table, range or under, not {part!r}")
    head = ["option", "hidden", "vocab", "batch x (prompt + response)", "precision",
            "predicted MiB", "measured MiB", "error"]
    return "\n".join(["| " + " | ".join(head) + " |", "|---|---:|---:|---|---|---:|---:|---:|",
                      *("| " + " | ".join(_cells(r)) + " |" for r in rows)])


# glibc keeps freed blocks below its dynamic mmap threshold (up to 32 MiB) in the heap, so the
# default peak RSS adds the allocator's retention (measured here: up to 1.8x the live bytes for fp32
# chunked log-probs). A fixed threshold makes every tensor of 64 KiB or more its own mapping,
# returned when freed: the peak RSS is then the peak of the live tensors, which is what the plan
# counts (a GPU's caching allocator adds its own fragmentation on top, as glibc does).
LIVE_BYTES = {"MALLOC_MMAP_THRESHOLD_": "65536"}


def _measure(variant: str, sizes: dict, env: dict | None = None) -> dict:
    argv = [sys.executable, "-m", "suite.experiments.bench_memory", "--one", variant,
            *(f"--{k}={v}" for k, v in sizes.items())]
    out = subprocess.run(argv, capture_output=True, text=True, env={**os.environ, **(env or {})})
    if out.returncode != 0:
        raise RuntimeError(f"variant {variant} failed:\n{out.stderr[-2000:]}")
    return json.loads(out.stdout.splitlines()[-1])


def reward_pool(workers: int, n: int = 256) -> float:
    """Median seconds to grade ``n`` math responses whose answers need math-verify, with ``workers``
    workers."""
    from suite.tasks import math_reward
    from suite.tasks.registry import grade

    class Boxed:
        def reward(self, item, response, truncated):
            return math_reward.boxed_reward(response, item, truncated)

    def batch(rep: int) -> tuple:
        # Distinct answers in every batch, as in a rollout: math-verify's caches cannot answer them.
        ks = range(rep * n + 1, (rep + 1) * n + 1)
        # against the expanded polynomial: a symbolic simplification each
        gold = [f"(x+{k})^2" for k in ks]
        return Boxed(), gold, [f"\\boxed{{x^2+{2 * k}x+{k * k}}}" for k in ks], [False] * n, workers

    math_reward.set_workers(workers)
    grade(*batch(0))  # unmeasured: the workers' imports and first parses
    times = []
    for rep in range(1, 4):
        args = batch(rep + 10 * workers)
        t0 = time.perf_counter()
        assert sum(grade(*args)) == n  # every answer is equivalent
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def main(args: list[str]) -> int:
    p = argparse.ArgumentParser(prog="suite bench-memory", description=__doc__.split("\n\n")[0])
    p.add_argument("--vocab", type=int, default=151936)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--prompt", type=int, default=32)
    p.add_argument("--response", type=int, default=128)
    p.add_argument("--steps", type=int, default=4)
    p.add_argument("--precision", default="bf16", choices=("fp32", "bf16", "fp16"))
    p.add_argument("--reward-workers", type=int, default=2,
                   help="workers of the reward-pool timing at the end (math-verify); 0 skips it")
    p.add_argument("--one", default=None, help=argparse.SUPPRESS)
    p.add_argument("--hidden", type=int, default=0, help=argparse.SUPPRESS)
    p.add_argument("--arch", default=None, help=argparse.SUPPRESS)
    p.add_argument("--device", default=None, help="where to measure (default: where a run computes "
                                                  "on this host, "
                   "cuda:0 on a GPU machine)")
    p.add_argument("--write", default=None, help="with --plan: write the rows as JSON to this file")
    p.add_argument("--plan", action="store_true", help="the memory plan's prediction against the "
                                                       "measured peak at "
                   "several sizes (suite plan; suite/numerics/memory.py)")
    a = p.parse_args(args)
    if a.vocab < 16 or a.batch < 1 or a.response < 1 or a.steps < 1 or a.reward_workers < 0:
        raise ValueError("--vocab >= 16; --batch, --response, --steps >= 1; --reward-workers >= 0")
    timed = not (a.one or a.plan) and a.reward_workers
    if timed and importlib.util.find_spec("math_verify") is None:
        # Refused before the variants run (minutes each): the last timing grades with math-verify.
        raise ValueError("--reward-workers: the reward-pool timing grades with math-verify, "
                         "which is not installed: pip install -e '.[math]', or pass "
                         "--reward-workers 0 to skip that timing.")
    sizes = dict(vocab=a.vocab, batch=a.batch, prompt=a.prompt, response=a.response, steps=a.steps,
                 precision=a.precision)
    if a.one:
        print(json.dumps(one(a.one, **sizes, hidden=a.hidden, device=a.device, arch=a.arch)))
        return 0
    from rich.table import Table

    from suite import dist
    from suite.console import make_console
    from suite.numerics import machine

    console = make_console()
    device = a.device or dist.World().device
    if a.plan:
        return plan_check(console, a.steps, a.write, device)
    rows = []
    for name in VARIANTS:
        rows.append(_measure(name, {**sizes, "device": device}))
        console.print(f"{name}: {rows[-1]['peak_mb']:.0f} MiB over the built model, "
                      f"{rows[-1]['step_s']:.2f} s/update")
    base = rows[0]
    t = Table("option", "peak memory of an update (MiB)", "vs baseline", "update time (s)",
              "vs baseline", title=f"{a.precision}, vocabulary {a.vocab:,}, {a.batch} x "
                                   f"({a.prompt} + {a.response}) tokens, "
                                   f"{base['params'] / 1e6:.1f}M parameters, median of "
                                   f"{a.steps - 1} updates, {base['peak']} on {device} "
                                   f"({machine.describe('auto', 1, device=device)['id']})")
    for r in rows:
        t.add_row(r["variant"], f"{r['peak_mb']:.0f}", f"{r['peak_mb'] / base['peak_mb']:.2f}x",
                  f"{r['step_s']:.2f}", f"{r['step_s'] / base['step_s']:.2f}x")
    console.print(t)
    if not a.reward_workers:
        return 0
    serial, pooled = reward_pool(1), reward_pool(a.reward_workers)
    console.print(f"reward workers: 256 math-verify answers graded in {serial:.2f} s with 1 "
                  f"worker, {pooled:.2f} s with {a.reward_workers} ({serial / pooled:.2f}x)")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
