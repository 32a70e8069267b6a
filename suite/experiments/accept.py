"""``suite accept STAGE [out=DIR] [budget=SECONDS]``: the acceptance on a borrowed GPU, in stages.

The GPU the project borrows (one H100 or H200, docs/gpu.md) runs a command for at most 10 minutes,
takes a working tree of at most 64 MiB and sends back at most 8 files per folder; its image has
torch, transformers and numpy but neither hydra-core nor omegaconf, and reaches no registry. So the
acceptance is cut in stages, each writing one folder ``<out>/<stage>/`` with ``summary.json`` (every
check with pass or fail, the stage's provenance) and a few tables, each exiting 1 when a check
fails:

- ``prepare`` (on the CPU, before borrowing): the wheels the GPU image lacks into ``.whl/``, the
  embedded policies and perfectible sets the other stages use into ``.gpu/cache`` (their
  ``$SUITE_CACHE``), the commit into ``.gpu/provenance.json``, and the size of what travels
  (tracked, untracked not ignored, carried) under 60 MiB.
- ``numerics``: ``suite doctor``; the step-0 mismatch of every flow at the sanity grid's tier with
  the GEMM and attention kernels the profiler saw; the FP8 and FP4 GEMMs at
  DeepSeek-R1-Distill-Qwen-1.5B's shapes against the emulation, with their speed against bf16; the
  memory plan against the allocator's peak.
- ``cells``: the sanity grid's cells side by side until the budget runs out, with their verdicts
  and step times.

``scripts/gpu_accept.sh STAGE ...`` installs the carried wheels and runs the stages with
``python3 -m suite``. Each stage's bookkeeping (its checks, summary.json, provenance) is
suite/experiments/accept_stage.py.
"""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

from suite.experiments.accept_stage import GPU_DIR, ROOT, Stage

WHEEL_DIR = Path(os.environ.get("WHEELS") or ROOT / ".whl")  # scripts/gpu_accept.sh's WHEELS
# The GPU image's missing packages (the developers' device notes list what it holds): hydra-core and
# omegaconf, and omegaconf's parser runtime, which PyPI has as a source archive only (so it is built
# into a wheel here).
WHEELS = ("hydra-core", "omegaconf")
BUILT_WHEELS = ("antlr4-python3-runtime",)
# the device takes 64 MiB; the margin is for what a command adds beside the tree
TRAVEL_LIMIT_MIB = 60
DEFAULT_OUT = Path("runs") / "accept"
DEFAULT_BUDGET = {"prepare": 1800, "numerics": 300, "fingerprint": 300, "cells": 240}
# The shapes of one DeepSeek-R1-Distill-Qwen-1.5B layer and its head (N, K) (suite/rl/models.py's
# preset).
R1D_SHAPES = {"q_proj": (1536, 1536), "k_proj": (256, 1536), "gate_proj": (8960, 1536),
              "down_proj": (1536, 8960), "lm_head": (151936, 1536)}
KERNEL = re.compile(r"gemm|gemv|xmma|cutlass|nvjet|scaled_mm|matmul|addmm|\bmm\b|bmm|flash|fmha|"
                    r"attention", re.I)


def _suite(*args: str, timeout: float, log: Path | None = None) -> int | str:
    """``python -m suite ARGS`` in its own process group (its own CUDA context), the whole group
    killed at ``timeout``: its exit code, or "timeout"."""
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    with open(log or os.devnull, "w") as f:
        p = subprocess.Popen([sys.executable, "-m", "suite", *args], stdout=f,
                             stderr=subprocess.STDOUT, env=env, cwd=ROOT, start_new_session=True)
        try:
            return p.wait(timeout=max(1.0, timeout))
        except subprocess.TimeoutExpired:
            os.killpg(p.pid, 9)
            p.wait()
            return "timeout"


def _last_line(log: Path) -> str:
    """A log's last line (its first 200 characters), empty for an empty log."""
    return log.read_text().strip().splitlines()[-1][:200] if log.read_text().strip() else ''


# ---- prepare (CPU) -------------------------------------------------------------------------------
def download_wheels(dest: Path) -> list[str]:
    """The wheels of the packages the GPU image lacks, at the versions installed here, into
    ``dest``."""
    from importlib.metadata import version

    dest.mkdir(parents=True, exist_ok=True)
    pip = [sys.executable, "-m", "pip", "-q"]
    subprocess.run([*pip, "download", "--no-deps", "--only-binary=:all:", "-d", str(dest),
                    *(f"{n}=={version(n)}" for n in WHEELS)], check=True)
    subprocess.run([*pip, "wheel", "--no-deps", "-w", str(dest),
                    *(f"{n}=={version(n)}" for n in BUILT_WHEELS)],
                   check=True)
    return sorted(p.name for p in dest.glob("*.whl"))


def prepare(st: Stage) -> None:
    from suite.results import atomic_write_json

    def wheels():
        names = download_wheels(WHEEL_DIR)
        st.add("wheels", len(names) == len(WHEELS) + len(BUILT_WHEELS), ", ".join(names),
               f"one wheel each of {', '.join(WHEELS + BUILT_WHEELS)} in .whl/")

    def policies():
        os.environ["SUITE_CACHE"] = str(GPU_DIR / "cache")
        # the doctor's and the sanity grid's (tier=small is also the mismatch's)
        for tier in ("smoke", "small"):
            t0 = time.monotonic()
            log = st.dir / f"perfectible-{tier}.log"
            rc = _suite("perfectible", f"tier={tier}", timeout=st.left(), log=log)
            st.add(f"policy {tier}", rc == 0, f"built in {GPU_DIR / 'cache'}" if rc == 0 else
                   f"exit {rc}: {_last_line(log)}",
                   "built and cached", t0)

    def travel():
        from suite.results import git

        atomic_write_json(GPU_DIR / "provenance.json",
                          {"commit": git("rev-parse", "HEAD", cwd=ROOT),
                           "dirty": bool(git("status", "--porcelain", cwd=ROOT))})
        tracked = git("ls-files", "-z", "--cached", "--others", "--exclude-standard",
                      cwd=ROOT) or ""
        files = [ROOT / p for p in tracked.split("\0") if p]
        carried = [p for d in (WHEEL_DIR, GPU_DIR) for p in d.rglob("*") if p.is_file()]
        # a link travels as a link (a twin log of results/: scripts/compact_results.py)
        mib = sum(p.lstat().st_size for p in files + carried
                  if p.is_file() or p.is_symlink()) / 2**20
        st.add("travels", mib <= TRAVEL_LIMIT_MIB,
               f"{mib:.1f} MiB (tree {len(files)} files, carried .whl/ and .gpu/)",
               f"<= {TRAVEL_LIMIT_MIB} MiB (the device takes 64)")

    st.run("wheels", wheels)
    st.run("policies", policies)
    st.run("travels", travel)


# ---- numerics (GPU) ------------------------------------------------------------------------------
def doctor(st: Stage) -> None:
    t0 = time.monotonic()
    work = st.dir.parent / "work" / "doctor"
    rc = _suite("doctor", f"out={work}", timeout=min(st.left() - 150, 200),
                log=st.dir / "doctor.log")
    rows = (json.loads((work / "doctor.json").read_text())["rows"]
            if (work / "doctor.json").is_file() else [])
    st.table("doctor.json", rows)
    for r in rows:
        st.add(f"doctor: {r['check']}", r["ok"], r["measured"], r["expected"])
    st.add("doctor", rc == 0 and bool(rows),
           f"exit {rc}, {sum(r['ok'] for r in rows)}/{len(rows)} rows pass",
           "exit 0, every row passes", t0)


def _kernels(prof, cuda: bool) -> list[list]:
    """The GEMM and attention kernels of a profile (CUDA kernels on a GPU, aten ops on the CPU), by
    device time."""
    rows = []
    for e in prof.key_averages():
        on_device = getattr(e, "device_type", None) is not None and "CUDA" in str(e.device_type)
        if cuda != on_device or not KERNEL.search(e.key):
            continue
        t = getattr(e, "self_device_time_total", None) if cuda else e.self_cpu_time_total
        rows.append([e.key[:120], int(e.count), round(float(t or 0.0) / 1e3, 3)])
    return sorted(rows, key=lambda r: -r[2])[:8]


def mismatch(st: Stage) -> None:
    """The step-0 mismatch of every flow on one rollout batch of the sanity grid's tier, as ``suite
    mismatch``, each flow's sampling and scoring under the profiler."""
    import copy

    import torch

    from suite import dist
    from suite.experiments.bench import step0_mismatch
    from suite.numerics import fp4, fp8
    from suite.numerics.precision import FLOWS
    from suite.rl import config
    from suite.rl.data import prepare_data
    from suite.rl.perfectible import load
    from suite.rl.policy import load_policy
    from suite.rl.train import build_engines
    from suite.tasks.registry import prompt_ids

    t0 = time.monotonic()
    dev = dist.World().device
    cuda = dev.startswith("cuda")
    base = config.load(["tier=small"])
    from suite.console import make_console

    model_dir, data_dir = prepare_data(base, make_console())
    items, _ = load(data_dir, base.perfectible.max_prompts)
    model, tok = load_policy(model_dir)
    prompts = [prompt_ids(tok, it) for it in items[:base.prompts_per_step]
               for _ in range(base.samples_per_prompt)]
    acts = ([torch.profiler.ProfilerActivity.CPU]
            + ([torch.profiler.ProfilerActivity.CUDA] if cuda else []))
    table = {}
    for name in FLOWS:
        if st.left() < 100:  # the memory and GEMM checks after it need about this long
            st.add(f"mismatch {name}", False, "not measured: the stage's budget ran out",
                   "measured")
            continue
        cfg = config.load(["tier=small", f"precision={name}"])
        trainer, engine, _ = build_engines(cfg, copy.deepcopy(model), dist.World(device=dev))
        try:
            with torch.profiler.profile(activities=acts) as prof:
                m, ts, tl = step0_mismatch(cfg, trainer, engine, prompts)
            seen = trainer.observe()
            table[name] = {"kl_k3": m["mismatch/kl_k3"],
                           "prob_diff_mean": m["mismatch/prob_diff/mean"],
                           "prob_diff_max": m["mismatch/prob_diff/max"],
                           "logprob_diff_max": m["mismatch/logprob_diff/max"],
                           "sample_s": round(ts, 3), "score_s": round(tl, 3),
                           "trainer_gemm": seen["gemm_output"], "trainer_logits": seen["logits"],
                           "sampler": str(getattr(engine, "dtype", None)),
                           "kernels": _kernels(prof, cuda)}
        finally:
            if hasattr(engine, "close"):
                engine.close()
    table["_paths"] = {"fp8_gemm": fp8.gemm_path(dev), "fp4_gemm": fp4.gemm_path(dev),
                       "device": dev, "responses": len(prompts)}
    st.table("mismatch.json", table)
    k3 = {n: r["kl_k3"] for n, r in table.items() if not n.startswith("_")}
    finite = all(v == v and v != float("inf") for v in k3.values())
    st.add("mismatch", finite and k3.get("exact") == 0.0 and len(k3) == len(FLOWS),
           " ".join(f"{n} {v:.2e}" for n, v in k3.items()),
           "every flow measured, finite; exact = 0", t0)
    if "bf16" in k3 and k3.get("fp16"):
        st.add("bf16 / fp16", k3["bf16"] > k3["fp16"], f"{k3['bf16'] / k3['fp16']:.1f}x in k3",
               "> 1")
    if "fp8" in k3 and k3.get("bf16_fp8rollout"):
        st.add("unified fp8 < fp8 rollout", k3["fp8"] < k3["bf16_fp8rollout"],
               f"fp8 {k3['fp8']:.2e} vs bf16_fp8rollout {k3['bf16_fp8rollout']:.2e}",
               "fp8 < bf16_fp8rollout")


def gemms(st: Stage) -> None:
    """FP8 (block-scaled, the path this device chose) and FP4 (emulated before Blackwell) GEMMs at
    R1D-1.5B's layer shapes: FP8 against the emulation up to the FP8 accumulator's rounding
    (fp8.agrees), FP4 against an fp64 product of the same operands up to fp32 summation; each timed
    against the bf16 GEMM of the same shape."""
    import torch

    from suite import dist
    from suite.experiments.bench import median_time
    from suite.numerics import fp4, fp8

    t0 = time.monotonic()
    dev = dist.World().device
    cuda = dev.startswith("cuda")
    # tokens of one micro-batch; a CPU run checks the same code on fewer rows, and on at most
    # 8,960 of the output head's 151,936 (each row's product is the same code; its 233 M weights
    # took a 2-core CPU a minute to draw and quantise twice); each row records its N
    M = 4096 if cuda else 64
    g = torch.Generator().manual_seed(0)
    rows, ok = [], True
    for layer, (N, K) in R1D_SHAPES.items():
        N = N if cuda else min(N, 8960)
        x = torch.randn(M, K, generator=g).to(dev)
        w = (torch.randn(N, K, generator=g) * K ** -0.5).to(dev)
        qx, sx = fp8.quantize_groupwise(x)
        qw, sw = fp8.quantize_blockwise(w)
        swr = fp8._block_scales_per_row(sw, N)
        got = fp8._gemm(qx, sx, qw, swr)
        agree = fp8.agrees(got, qx, sx, qw, swr)
        xb, wb = x.bfloat16(), w.bfloat16()
        reps = 10 if cuda else 2
        t_bf16 = median_time(lambda: xb @ wb.T, reps, cuda)
        t_fp8 = median_time(lambda: fp8._gemm(qx, sx, qw, swr), reps, cuda)
        t_fp8_lin = median_time(lambda: fp8.fp8_linear_inference(xb, qw, sw), reps, cuda)
        w4 = fp4.quantize_weight(w, "nvfp4")
        y4 = fp4.fp4_linear(xb, w4, out_dtype=torch.float32)
        # fp64 on the device: every product and sum exact enough
        a64, b64 = xb.double(), w4.operand.double()
        want4 = (a64 @ b64.T) / float(w4.tensor_scale)
        bound4 = (2 * K * torch.finfo(torch.float32).eps * (a64.abs() @ b64.abs().T)
                  / float(w4.tensor_scale))
        agree4 = bool(((y4.double() - want4).abs() <= bound4 + 1e-30).all())
        t_fp4 = median_time(lambda: fp4.fp4_linear(xb, w4), reps, cuda)
        flop = 2 * M * N * K
        rows.append({"layer": layer, "M": M, "N": N, "K": K, "fp8_agrees": agree,
                     "fp4_agrees": agree4, "bf16_tflops": round(flop / t_bf16 / 1e12, 2),
                     "fp8_gemm_tflops": round(flop / t_fp8 / 1e12, 2),
                     "fp8_gemm_vs_bf16": round(t_bf16 / t_fp8, 3),
                     "fp8_linear_vs_bf16": round(t_bf16 / t_fp8_lin, 3),
                     "nvfp4_linear_vs_bf16": round(t_bf16 / t_fp4, 3),
                     "fp8_max_abs_diff":
                         float((got - fp8._fp8_gemm_emulated(qx, sx, qw, swr)).abs().max())})
        ok &= agree and agree4
    paths = {"fp8": fp8.gemm_path(dev), "fp4": fp4.gemm_path(dev)}
    st.table("gemm.json", {"device": dev, "paths": paths, "rows": rows})
    st.add("gemm at r1d shapes", ok,
           f"fp8 {paths['fp8']['path']}, fp4 {paths['fp4']['path']}; fp8 GEMM / bf16 speed "
           + ", ".join(f"{r['layer']} {r['fp8_gemm_vs_bf16']:.2f}x" for r in rows),
           "FP8 agrees with the emulation, FP4 with fp64 up to fp32 sums, at every shape", t0)


# The published recipe's shapes for one update, with embedded layers at R1D-1.5B's widths (synthetic
# weights): one 1024 + 4096-token sequence per micro-batch, checkpointing and chunked log-probs (the
# recipe's memory savers).
RECIPE_SIZES = [("both", 151936, 1, 1024, 4096, "bf16", 0, "r1d-1.5b"),
                ("both", 151936, 4, 1024, 4096, "bf16", 0, "r1d-1.5b")]


def memory(st: Stage) -> None:
    """The memory plan against the measured peak: the plan's sizes (``suite bench-memory --plan``),
    then the recipe's shapes at R1D-1.5B's widths, each in its own process."""
    from suite import dist
    from suite.experiments import bench_memory as bm

    t0 = time.monotonic()
    dev = dist.World().device
    rows = []
    for variant, vocab, batch, prompt, response, precision, hidden, arch in [
            *((*r, None) for r in bm.PLAN_SIZES), *RECIPE_SIZES]:
        if st.left() < 40:  # the GEMM check after it
            break
        sizes = dict(vocab=vocab, batch=batch, prompt=prompt, response=response, steps=2,
                     precision=precision, hidden=hidden, **({"arch": arch} if arch else {}))
        if arch == "r1d-1.5b" and not dev.startswith("cuda"):
            # 1.78 B parameters: a GPU's row (on a 2-core CPU one update takes many minutes)
            continue
        m = bm._measure(variant, {**sizes, "device": dev}, env=bm.LIVE_BYTES)
        want = bm.predicted_mb(variant, **sizes)
        rows.append({"option": variant, **sizes, "predicted_mib": round(want, 1),
                     "measured_mib": round(m["peak_mb"], 1),
                     "error": round((want - m["peak_mb"]) / m["peak_mb"], 4),
                     "step_s": round(m["step_s"], 3)})
        print(f"accept memory: {rows[-1]}", flush=True)
    st.table("memory.json", {"device": dev, "peak": bm.PEAK[dev.startswith('cuda')], "rows": rows})
    from suite.experiments.doctor import PLAN_ACCURACY
    bad = [r for r in rows if abs(r["error"]) > PLAN_ACCURACY]
    st.add("memory plan", rows and not bad, f"{len(rows)} sizes, errors "
           + ", ".join(f"{r['error']:+.0%}" for r in rows),
           f"each within {PLAN_ACCURACY:.0%}", t0)


NUMERICS = {"doctor": doctor, "mismatch": mismatch, "memory": memory, "gemm": gemms}


def numerics(st: Stage, only: list[str] | None = None) -> None:
    for name, fn in NUMERICS.items():
        if not only or name in only:
            st.run(name, lambda fn=fn: fn(st))


# ---- fingerprint (GPU) ---------------------------------------------------------------------------
def fingerprint(st: Stage) -> None:
    """``suite fingerprint --write``'s file of this class (``fingerprint.json``, to commit as
    results/reference/<class>/fingerprint.json), computed twice in fresh folders: the file claims
    that every main flow's numbers come back bit for bit (on a GPU with deterministic kernels,
    suite/analysis/fingerprint.py), so the second pass must give the first one's bytes."""
    import shutil

    from suite.analysis import fingerprint as fp

    t0 = time.monotonic()
    work = st.dir.parent / "work" / "fingerprint"
    shutil.rmtree(work, ignore_errors=True)  # a pass that finds complete runs only rereads them
    first = fp.compute(workdir=work / "1")
    st.table("fingerprint.json", first)
    inv = first["invariants"]
    state = {None: "n/a", True: "holds", False: "BROKEN"}
    st.add("fingerprint: invariants", all(i["ok"] is not False for i in inv),
           "; ".join(f"{i['name']}: {state[i['ok']]}" for i in inv),
           "what holds on every machine holds", t0)
    took = time.monotonic() - t0
    if st.left() < 1.2 * took:
        st.add("fingerprint: rerun", False, f"not run: {st.left():.0f} s of the budget left, the "
               f"first pass took {took:.0f} s", "a second pass, bit-identical to the first", t0)
        return
    problems = fp.compare(fp.compute(workdir=work / "2"), first)
    st.add("fingerprint: rerun", not problems,
           "; ".join(problems) or f"{len(first['flows'])} flows' metrics.jsonl identical in both "
                                   "passes", "a second pass, bit-identical to the first", t0)


# ---- cells (GPU) ---------------------------------------------------------------------------------
def sanity_cells(only: list[str] = ()) -> list[tuple[str, str]]:
    """The sanity grid's (algorithm, precision) cells, grpo first; ``only``: those named
    ``ALGORITHM:PRECISION`` (ValueError naming any the grid does not have)."""
    from suite.experiments import grids

    grid = grids.get("sanity")
    every = [(a, p) for a in grid["axes"]["algorithm"] for p in grid["axes"]["precision"]]
    wanted = [tuple(c.split(":", 1)) for c in only]
    unknown = [":".join(c) for c in wanted if c not in every]
    if unknown:
        raise ValueError(f"suite accept cells: only= names ALGORITHM:PRECISION cells of the sanity "
                         f"grid; it has no {', '.join(unknown)} (e.g. {':'.join(every[0])})")
    return [c for c in every if c in wanted] if wanted else every


def cells(st: Stage, overrides: list[str] = (), jobs: int | None = None,
          limit: int | None = None, only: list[str] = ()) -> None:
    """The sanity grid's cells (grpo first; ``only``: ALGORITHM:PRECISION ones), ``jobs`` at a time
    on the one device, until the budget or, with ``limit``, the end of the first ``limit`` cells:
    each a ``suite run`` of its own (``overrides`` last: the caller's word wins); a finished cell's
    verdict and its median step time, an unfinished one's steps."""
    from suite.experiments import grids

    t0 = time.monotonic()
    grid = grids.get("sanity")
    todo = sanity_cells(only)
    todo = todo[:limit] if limit else todo
    jobs = jobs or max(1, min(8, (os.cpu_count() or 2) // 2))
    work = st.dir.parent / "work" / "cells"
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    running: dict[tuple, subprocess.Popen] = {}
    while (todo or running) and st.left() > 5:
        while todo and len(running) < jobs:
            a, p = todo.pop(0)
            cmd = [sys.executable, "-m", "suite", "run", f"algorithm={a}", f"precision={p}",
                   "seed=0", "name=sanity", f"out={work}", *grid["overrides"], *overrides]
            running[(a, p)] = subprocess.Popen(cmd, env=env, cwd=ROOT, stdout=subprocess.DEVNULL,
                                               stderr=subprocess.DEVNULL, start_new_session=True)
        for key, proc in list(running.items()):
            if proc.poll() is not None:
                running.pop(key)
        time.sleep(1)
    # the budget ran out: stop what is left (each cell keeps its last checkpoint)
    for proc in running.values():
        os.killpg(proc.pid, 9)
        proc.wait()
    rows = []
    for run_dir in sorted((work / "sanity").glob("*__s0")):
        rows.append(_cell_row(run_dir))
    st.table("cells.json",
             {"jobs": jobs, "rows": rows, "not_started": [f"{a} x {p}" for a, p in todo]})
    done = [r for r in rows if r["finished"]]
    st.add("cells", bool(done) and all(r["error"] is None for r in done),
           f"{len(done)} of {len(rows) + len(todo)} cells finished, "
           f"{sum(r['verdict'] == 'pass' for r in done)} pass; median step "
           + ", ".join(f"{r['cell']} {r['step_s']} s" for r in done[:4]),
           "finished cells ran without error", t0)


def _cell_row(run_dir: Path) -> dict:
    import statistics

    from suite.packed import read_jsonl, run_file

    metrics, timing = run_file(run_dir, "metrics.jsonl"), run_file(run_dir, "timing.jsonl")
    steps = read_jsonl(metrics) if metrics else []
    times = [r["time/step_s"] for r in (read_jsonl(timing) if timing else [])
             if isinstance(r.get("time/step_s"), float)]
    summary = run_dir / "summary.json"
    s = json.loads(summary.read_text()) if summary.is_file() else {}
    return {"cell": run_dir.name, "finished": summary.is_file(), "steps": len(steps),
            "verdict": s.get("verdict"), "accuracy_final": s.get("accuracy/final"),
            "step0_kl_k3": s.get("mismatch/step0/kl_k3"), "error": s.get("error"),
            "step_s": round(statistics.median(times), 3) if times else None}


STAGES = ("prepare", "numerics", "fingerprint", "cells")


def main(args: list[str]) -> int:
    """``suite accept STAGE [out=DIR] [budget=SECONDS] [only=...] [limit=N] [KEY=VALUE ...]``:
    ``only`` picks the numerics stage's checks (doctor, mismatch, memory, gemm) or the cells
    stage's cells (ALGORITHM:PRECISION, e.g. only=pg_seq_is:exact); ``limit`` the cells stage's
    first N cells (it ends when they do, not at its budget); other KEY=VALUE go to each cell's
    ``suite run``."""
    if not args or args[0] not in STAGES:
        raise ValueError(f"suite accept: name a stage first, one of {', '.join(STAGES)} "
                         "(suite/experiments/accept.py)")
    name, opts, runs = args[0], {}, []
    for a in args[1:]:
        key, eq, value = a.partition("=")
        if not eq:
            raise ValueError(f"suite accept: {a!r} is not KEY=VALUE")
        if key in ("out", "budget", "only", "limit"):
            opts[key] = value
        else:
            runs.append(a)
    only = opts.get("only", "").split(",") if opts.get("only") else []
    if "limit" in opts and (name != "cells" or not opts["limit"].isdigit()
                            or int(opts["limit"]) < 1):
        raise ValueError(f"suite accept: limit= is the cells stage's number of cells, a whole "
                         f"number >= 1 (got {name} limit={opts['limit']!r})")
    if name == "cells":
        sanity_cells(only)  # an unknown cell is refused before anything runs
    elif (only and name != "numerics") or set(only) - set(NUMERICS) or runs:
        raise ValueError(f"suite accept: only= takes the numerics checks ({', '.join(NUMERICS)}) "
                         "or the cells stage's ALGORITHM:PRECISION cells; run fields go to the "
                         "cells stage")
    st = Stage(name, Path(opts.get("out", DEFAULT_OUT)),
               float(opts.get("budget", DEFAULT_BUDGET[name])))
    limit = int(opts["limit"]) if "limit" in opts else None
    call = {"numerics": lambda: numerics(st, only), "fingerprint": lambda: fingerprint(st),
            "cells": lambda: cells(st, runs, limit=limit, only=only),
            "prepare": lambda: prepare(st)}
    st.run(name, call[name])
    st.write()
    failed = [c.check for c in st.checks if not c.ok]
    print(f"accept {name}: {len(st.checks) - len(failed)}/{len(st.checks)} checks pass in "
          f"{time.monotonic() - st.t0:.0f} s"
          + (f"; failed: {', '.join(failed)}" if failed else "") + f"; {st.dir / 'summary.json'}",
          flush=True)
    return 1 if failed or not st.checks else 0
