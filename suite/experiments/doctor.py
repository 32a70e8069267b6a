"""``suite doctor``: the machine acceptance table, the first command to run on a new machine.

In a few minutes on the device it runs on (the first CUDA GPU, else the CPU), it checks what every
figure the suite reports depends on, each row measured here and now:

- **placement**: every flow's trainer and sampler live on the device and one sampling + scoring pass
runs there
  (a tensor left on the CPU fails the way it would in a run);
- **dtypes**: the trainer's observed GEMM output and logits and the sampler's dtype are the
precision table's;
- **mismatch order**: the step-0 k3 KL of one rollout batch per flow orders as the mantissa bits
predict,
  exact = 0 < fp32 < fp16 < bf16 < bf16_fp8rollout, and the unified FP8 flow below the FP8-rollout
  baseline;
- **fp8 gemm**: which FP8 GEMM path this device runs (``torch._scaled_mm`` on FP8 tensor cores, else
the
  emulation) and that it agrees with the emulation up to the FP8 accumulator's rounding;
- **fp4 quantisers**: NVFP4 and MXFP4 round trips on this device against hand-computed codes, and
  the FP4 GEMM path (the emulation on every GPU before Blackwell); W4A16 rollouts' k3 above FP8's;
- **fp16 overflow**: an overflowing fp16 backward skips the step, halves the loss scale, keeps the
weights;
- **fsdp2 = plain**: a 1-rank FSDP2 run under torchrun writes the metrics of a plain process, value
for value;
- **kill + resume**: a run SIGKILLed mid-way and rerun ends with the uninterrupted run's metrics,
  byte for byte (on a GPU, these runs and fsdp2's take ``deterministic=true``, its condition).

Each check is a function returning rows; one failing check never stops the others. The table is
printed and written to ``<out>/doctor.json`` (default ``runs/doctor/``, beside the runs); the exit
code is 1 when any row fails.
"""

from __future__ import annotations

import copy
import json
import math
import os
import signal
import subprocess
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
from rich.console import Console
from rich.table import Table

from suite.numerics.scoring import Batch
from suite.rl.schema import RunConfig

# The ordering the mantissa bits predict (bf16 keeps 8 significand bits, fp16 11), and the unified
# FP8 flow below the FP8-rollout baseline (Jet-RL, arXiv 2601.14243).
ORDER = ("exact", "fp32", "fp16", "bf16", "bf16_fp8rollout")
RUN_ARGS = ["tier=smoke", "steps=4", "ckpt_every=2", "precision=fp16"]
# Scratch runs and doctor.json go where runs go by default (the config's out, git-ignored), not into
# results/: the doctor is run in a checkout, and its work is no result to commit.
DEFAULT_OUT = Path(RunConfig.out) / "doctor"


@dataclass
class Row:
    check: str
    ok: bool
    measured: str
    expected: str


def _device() -> str:
    """Where a run computes on this host: suite/dist.py decides it, for the doctor as for every
    tool."""
    from suite import dist

    return dist.World().device


def _setup(out: Path, console: Console):
    """The smoke tier's policy and prompts (built once, cached like every run's)."""
    from suite.rl import config
    from suite.rl.data import prepare_data
    from suite.rl.perfectible import load
    from suite.rl.policy import load_policy
    from suite.tasks.registry import prompt_ids

    base = config.load(["tier=smoke", f"out={out}"])
    model_dir, data_dir = prepare_data(base, console)
    items, _ = load(data_dir, base.perfectible.max_prompts)
    model, tok = load_policy(model_dir)
    prompts = [prompt_ids(tok, it) for it in items[:base.prompts_per_step]
               for _ in range(base.samples_per_prompt)]
    return base, model, prompts


def _engines(flow: str, model, out: Path):
    from suite import dist
    from suite.rl import config
    from suite.rl.train import build_engines

    cfg = config.load(["tier=smoke", f"precision={flow}", f"out={out}"])
    trainer, engine, _ = build_engines(cfg, copy.deepcopy(model), dist.World(device=_device()))
    return cfg, trainer, engine


def check_flows(out: Path, model, prompts) -> list[Row]:
    """placement, dtypes and the step-0 mismatch of every flow, from one rollout batch each."""
    from suite.experiments.bench import step0_mismatch
    from suite.numerics import refit
    from suite.numerics.precision import FLOWS

    dev, rows, k3 = torch.device(_device()), [], {}
    for name, flow in FLOWS.items():
        cfg, trainer, engine = _engines(name, model, out)
        try:
            m, _, _ = step0_mismatch(cfg, trainer, engine, prompts)
            k3[name] = m["mismatch/kl_k3"]
            # every quantised weight against a fresh quantisation, bit for bit
            if refit.checkable(engine):
                try:
                    got = (f"{len(refit.check(engine, trainer.model.state_dict()))} "
                           f"{engine.quant} weights equal")
                except refit.StaleWeights as e:
                    got = str(e)[:200]
                rows.append(
                    Row(f"refit {name}", got.endswith("equal"), got,
                        "a fresh quantisation, bit for bit"))
            stray = sorted({str(t.device)
                            for t in [*trainer.model.parameters(), *trainer.model.buffers()]
                            if t.device.type != dev.type})
            rows.append(Row(f"placement {name}", not stray and math.isfinite(k3[name]),
                            f"trainer on {trainer.device}; sampled and scored"
                            + (f"; stray {stray}" if stray else ""),
                            f"everything on {dev.type}"))
            seen = trainer.observe()
            want = "torch.bfloat16" if flow.trainer_quant == "fp8" else str(flow.trainer_dtype)
            sampler = str(getattr(engine, "dtype", flow.sampler_dtype))
            rows.append(Row(f"dtypes {name}", seen["gemm_output"] == want
                            and sampler == str(flow.sampler_dtype),
                            f"trainer GEMM {seen['gemm_output']}, logits {seen['logits']}; sampler "
                            f"{sampler}",
                            f"trainer GEMM {want}; sampler {flow.sampler_dtype}"))
        except Exception as e:  # one flow's failure is a failing row, never the end of the table
            rows.append(Row(f"placement {name}", False, f"{type(e).__name__}: {str(e)[:160]}",
                            f"runs on {dev.type}"))
        finally:
            if hasattr(engine, "close"):
                engine.close()
    have = [n for n in ORDER if n in k3]
    ordered = k3.get("exact") == 0.0 and all(k3[a] < k3[b] for a, b in zip(have[1:], have[2:]))
    rows.append(Row("mismatch order", ordered and len(have) == len(ORDER),
                    " < ".join(f"{n} {k3[n]:.2e}" for n in have), "exact = 0 < fp32 < fp16 < bf16 "
                                                                  "< bf16_fp8rollout"))
    if "fp8" in k3 and "bf16_fp8rollout" in k3:
        rows.append(Row("mismatch fp8 unified", k3["fp8"] < k3["bf16_fp8rollout"],
                        f"fp8 {k3['fp8']:.2e} vs bf16_fp8rollout {k3['bf16_fp8rollout']:.2e} "
                        f"({k3['fp8'] / k3['bf16_fp8rollout']:.3g}x)", "fp8 < bf16_fp8rollout"))
    w4 = [n for n in ("bf16_nvfp4rollout", "bf16_mxfp4rollout") if n in k3]
    if w4 and "bf16_fp8rollout" in k3:  # 1 mantissa bit in the weights against FP8's 3 (fp4.py)
        fp8 = k3["bf16_fp8rollout"]
        rows.append(Row("mismatch fp4 rollout", all(k3[n] > fp8 for n in w4),
                        ", ".join(f"{n} {k3[n]:.2e}" for n in w4) + f" vs fp8 rollout {fp8:.2e}",
                        "W4A16 rollouts > bf16_fp8rollout"))
    if k3.get("fp16"):
        rows.append(
            Row("mismatch bf16 / fp16", k3["bf16"] > k3["fp16"],
                f"{k3['bf16'] / k3['fp16']:.1f}x in k3", "> 1 (bf16 keeps 3 fewer mantissa bits)"))
    return rows


def check_fp8_gemm() -> list[Row]:
    """The FP8 GEMM path of this device against the emulation (exact products, fp32 sums) on one
    problem."""
    from suite.numerics import fp8

    dev = _device()
    g = torch.Generator().manual_seed(0)
    a, b = torch.randn(64, 256, generator=g).to(dev), torch.randn(32, 256, generator=g).to(dev)
    (qa, sa), (qb, sb) = fp8.quantize_groupwise(a), fp8.quantize_groupwise(b)
    got, want = fp8._gemm(qa, sa, qb, sb), fp8._fp8_gemm_emulated(qa, sa, qb, sb)
    p = fp8.gemm_path(dev)
    path = f"{p['path']} ({p['reason']})"
    ok = fp8.agrees(got, qa, sa, qb, sb)  # the same exact products, summed otherwise
    return [Row("fp8 gemm", ok, f"{path}; max |diff| {float((got - want).abs().max()):.1e} vs "
                                "emulation",
                f"agrees with the emulation up to a {fp8.ACC_BITS}-bit accumulator's rounding")]


# Hand-computed round trips (the rules: suite/numerics/fp4.py's docstring). NVFP4, one block of 16:
# amax 12 gives s_t = 2688 / 12 = 224 and the block scale 12 / 6 * 224 = 448, so code = x / 2: 5 ->
# 2.5 and 7 -> 3.5 are ties (to the even codes 2 and 4), -0.375 -> -0.5, 0.65 -> 0.5, 0.15 -> 0.
# MXFP4, one block of 32: amax 7 gives 2^(floor(log2 7) - 2) = 1: 7 saturates to 6, -2.5 ties to -2.
FP4_PROBES = {"nvfp4": ([12, 5, 7, -0.75, 1.3, 0.3, 0], [6, 2, 4, -0.5, 0.5, 0, 0]),
              "mxfp4": ([7, 1, -2.5, 0.2, 0.75, -5, 0], [6, 1, -2, 0, 1, -4, 0])}


def check_fp4() -> list[Row]:
    """The FP4 quantisers on this device against hand-computed codes; its FP4 GEMM path."""
    from suite.numerics import fp4

    dev, got = _device(), {}
    for fmt, (x, _) in FP4_PROBES.items():
        q = fp4.quantize(torch.tensor([x], dtype=torch.float32, device=dev), fmt)
        got[fmt] = q.codes[0].cpu().tolist()
    ok = all(got[f] == want for f, (_, want) in FP4_PROBES.items())
    p = fp4.gemm_path(dev)
    measured = "; ".join(f"{f} codes {c}" for f, c in got.items())
    measured += f"; gemm {p['path']} ({p['reason']})"
    want = "; ".join(f"{f} codes {[float(c) for c in w]}" for f, (_, w) in FP4_PROBES.items())
    return [Row("fp4 quantisers", ok, measured, want)]


def check_fp16_overflow(model) -> list[Row]:
    """An overflowing fp16 backward: the step is skipped, the scale halves, the weights stay (arXiv
    1710.03740)."""
    from suite import dist
    from suite.numerics.precision import resolve
    from suite.numerics.trainer import Trainer
    from suite.rl import config

    cfg = config.load(["tier=smoke", "precision=fp16"])
    trainer = Trainer(copy.deepcopy(model), resolve("fp16"), "native", cfg.optim,
                      world=dist.World(device=_device()))
    before = {k: v.detach().clone() for k, v in trainer.model.state_dict().items()}
    scale = trainer.scaler.scale
    ids = torch.full((2, 6), int(model.config.bos_token_id or 0))

    # a finite loss whose scaled gradient overflows: 1e35 x scale 65536 > fp32's 3.4e38
    def loss_fn():
        logp, _, _ = trainer.score(Batch(ids, torch.ones_like(ids), ids[:, -3:], 1.0))
        return logp.sum() * 1e35, {}

    m = trainer.step(loss_fn)
    kept = all(torch.equal(before[k], v) for k, v in trainer.model.state_dict().items())
    ok = m["train/skipped"] == 1.0 and trainer.scaler.scale == scale / 2 and kept
    return [Row("fp16 overflow", ok, f"skipped {m['train/skipped']:.0f}, scale {scale:.0f} -> "
                f"{trainer.scaler.scale:.0f}, weights {'kept' if kept else 'CHANGED'}",
                "skipped 1, scale halved, weights kept")]


def _run_args() -> list[str]:
    """The runs the equality rows compare. On a GPU the suite claims byte-identical reruns only
    with deterministic kernels (docs/distributed.md): a default GPU run varies from rerun to rerun
    (atomics, split-K), and once one sampled token differs, no rounding tolerance bounds the
    metrics that follow."""
    return [*RUN_ARGS, *(["deterministic=true"] if _device().startswith("cuda") else [])]


def _run(out: Path, *extra: str, torchrun: bool = False, wait: bool = True):
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    head = ([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=1"]
            if torchrun
            else [sys.executable])
    cmd = [*head, "-m", "suite.cli", "run", *_run_args(), f"out={out}", *extra]
    if not wait:
        return subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT,
                                start_new_session=True)
    p = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=900)
    if p.returncode:
        raise RuntimeError(f"`suite run` exited {p.returncode}: {(p.stderr or p.stdout)[-300:]}")
    return p


def _metrics(out: Path) -> Path:
    return next(out.rglob("metrics.jsonl"))


def _values(path: Path) -> list[dict]:
    """The metrics of every step without the wall-clock ones (the only values two processes may not
    share)."""
    from suite.results import read_jsonl

    return [{k: v for k, v in r.items() if not k.startswith("time/")} for r in read_jsonl(path)]


def check_fsdp_and_resume(out: Path) -> list[Row]:
    """FSDP2 at world size 1 against a plain process; a SIGKILL mid-run, then a rerun, against the
    plain run."""
    rows = []
    _run(out / "plain")
    ref = _metrics(out / "plain")
    try:
        _run(out / "fsdp", torchrun=True)
        a, b = _values(ref), _values(_metrics(out / "fsdp"))
        env = json.loads((_metrics(out / "fsdp").parent / "env.json").read_text())["world"]
        same = a == b and env["launcher"] == "torchrun"
        diff = [k for x, y in zip(a, b) for k in x if x.get(k) != y.get(k)]
        rows.append(Row("fsdp2 = plain", same, f"{len(b)} steps under torchrun ({env['backend']}), "
                        + ("every metric equal" if same else f"differ in {sorted(set(diff))[:4]}"),
                        "every metric of every step equal"))
    except Exception as e:
        rows.append(
            Row("fsdp2 = plain", False, f"{type(e).__name__}: {str(e)[:160]}",
                "every metric equal"))
    proc = _run(out / "kill", wait=False)
    deadline = time.time() + 600
    path = None
    while time.time() < deadline and proc.poll() is None:
        path = next((out / "kill").rglob("metrics.jsonl"), None)
        # after the step-2 checkpoint
        if path and path.exists() and len(path.read_text().splitlines()) >= 3:
            break
        time.sleep(0.01)
    killed = proc.poll() is None
    if killed:
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    _run(out / "kill")
    same = _metrics(out / "kill").read_bytes() == ref.read_bytes()
    rows.append(
        Row("kill + resume", same and killed,
            ("SIGKILL after step 3, rerun: " if killed
             else "finished before the kill (inconclusive): ")
            + ("metrics.jsonl byte-identical" if same else "metrics.jsonl DIFFERS"),
            f"byte-identical to the uninterrupted run ({' '.join(_run_args())})"))
    return rows


# One update of a small policy with a large head, the shape where an RL update peaks: the plan
# against the peak.
PLAN_PROBE = dict(vocab=32768, batch=4, prompt=32, response=256, steps=2, precision="bf16",
                  hidden=0)
# the plan's error at the seven sizes of docs/tasks.md stays inside it on CPU; beyond it, say so
PLAN_ACCURACY = 0.25


def check_memory_plan() -> list[Row]:
    """The memory plan's predicted peak of one update against the peak measured on this device (its
    own process)."""
    from suite.experiments import bench_memory as bm

    dev = _device()
    got = bm._measure("baseline", {**PLAN_PROBE, "device": dev}, env=bm.LIVE_BYTES)["peak_mb"]
    want = bm.predicted_mb("baseline", **PLAN_PROBE)
    how = ("torch.cuda.max_memory_allocated" if dev.startswith("cuda")
           else "peak RSS, 64 KiB mmap threshold")
    err = (want - got) / got
    return [Row("memory plan", abs(err) <= PLAN_ACCURACY, f"predicted {want:.0f} MiB, measured "
                                                          f"{got:.0f} MiB ({how}) "
                f"for one update, {err:+.0%}", f"within {PLAN_ACCURACY:.0%} (suite plan; "
                                               "docs/tasks.md)")]


def run_doctor(out: Path, console: Console) -> list[Row]:
    out.mkdir(parents=True, exist_ok=True)
    console.print(f"suite doctor on {_device()} "
                  f"({torch.cuda.get_device_name(0) if torch.cuda.is_available() else 'cpu'}), "
                  f"torch {torch.__version__}; work in {out}")
    _, model, prompts = _setup(out, console)
    rows: list[Row] = []
    checks = [("flows", lambda: check_flows(out / "flows", model, prompts)),
              ("fp8 gemm", check_fp8_gemm), ("fp4 quantisers", check_fp4),
              ("fp16 overflow", lambda: check_fp16_overflow(model)),
              ("runs", lambda: check_fsdp_and_resume(out)), ("memory plan", check_memory_plan)]
    for name, fn in checks:
        console.print(f"[dim]doctor: {name} ...[/]")
        try:
            rows += fn()
        except Exception as e:
            rows.append(Row(name, False, f"{type(e).__name__}: {str(e)[:200]}", "runs"))
        # after every check: a doctor stopped at a time limit keeps the rows it measured
        _write(out, rows)
    return rows


def _write(out: Path, rows: list[Row]) -> None:
    from suite.results import atomic_write_json

    atomic_write_json(out / "doctor.json", {"device": _device(), "torch": torch.__version__,
                                            "rows": [asdict(r) for r in rows]})


def main(args: list[str]) -> int:
    """``suite doctor [out=DIR]``: the machine acceptance table (every row measured here; exit 1 if
    one fails), written to DIR/doctor.json (default runs/doctor)."""
    from suite.console import make_console
    from suite.numerics import machine

    opts = dict(a.split("=", 1) for a in args if "=" in a)
    bad = [a for a in args if "=" not in a or a.split("=", 1)[0] != "out"]
    if bad:
        raise ValueError(f"suite doctor: unknown argument(s) {bad}; it takes out=DIR only")
    out = Path(opts.get("out", DEFAULT_OUT))
    console = make_console()
    t0 = time.perf_counter()
    rows = run_doctor(out, console)
    table = Table(title=f"suite doctor: {sum(r.ok for r in rows)}/{len(rows)} pass on {_device()}, "
                        f"{machine.label(machine.describe('auto', 1, device=_device()))}")
    for col in ("check", "", "measured", "expected"):
        table.add_column(col)
    for r in rows:
        table.add_row(r.check, "[green]pass[/]" if r.ok else "[red]FAIL[/]", r.measured, r.expected)
    console.print(table)
    console.print(f"{time.perf_counter() - t0:.0f} s; written to {out / 'doctor.json'}")
    _write(out, rows)
    return 0 if all(r.ok for r in rows) else 1
