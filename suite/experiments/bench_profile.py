"""``suite bench --profile``: what a step spends its time on, by kind of operation, per flow.

``suite bench`` splits a step by stage (sampling, trainer log-probs, update); this splits the same
steps by what runs in them, from ``torch.profiler``: GEMMs, attention forward, attention backward,
copies and dtype casts, everything else. Each flow runs ``STEPS`` steps of the bench's setting
twice, once to build (or find) the policy and the perfectible set and once under the profiler;
only the operations inside the steps after the first count (the range ``suite.rl_step`` that
suite/rl/step.py marks), each by its own time (``self_cpu_time_total``), so nothing counts twice.

The profiler adds a few microseconds to every operation, so the kinds sum to more than an
unprofiled step of a flow with many small operations (the exact flow's replayed decode loop, the
FP8 emulation's quantisers); the table prints the unprofiled step of the same setting beside
them. Then torch's attention alone (``sdpa_rows``), forward and backward in fp32 and bf16 at the
small tier's update shapes: the kind that dominates bf16's update on some classes, timed without
the rest of the step. On ``cpu-avx512bf16-mixed`` they show where the targets of docs/speed.md are
lost: the FP8 emulation's products are fp32 GEMMs, several times bf16's native ones there, and
bf16's own update is mostly torch's bf16 flash-attention backward.
"""

from __future__ import annotations

import statistics
import tempfile
import time
from pathlib import Path

import torch
from rich.console import Console
from rich.table import Table

from suite.experiments import bench_targets
from suite.numerics import machine
from suite.results import atomic_write_json, git, read_jsonl
from suite.rl import config as cfgmod

KINDS = ("GEMM", "attention fwd", "attention bwd", "copies, casts", "other")
STEP_RANGE = "suite.rl_step"
STEPS = 6  # the first is left out: it warms up
# fp32 and bf16 beside the flows with a target: what each target's ratio is made of
FLOWS = ("fp32", bench_targets.REFERENCE_FLOW, *bench_targets.TARGETS)
# torch's attention alone, at the small tier's update shapes: 64 rows of prompt + response (about 56
# tokens), 4 heads, head size 24 (the embedded policy's) and two larger ones for comparison
SDPA_SHAPE = {"rows": 64, "heads": 4, "tokens": 56}
SDPA_SIZES = (24, 32, 64)
SCHEMA = bench_targets.SCHEMA  # read by bench_targets.load_baseline
PROFILE_DIR = bench_targets.BASELINE_DIR / "profile"  # <machine class>.json


def kind(op: str) -> str:
    """The kind of a profiled operation, by its name (aten's and autograd's)."""
    if op in ("aten::mm", "aten::addmm", "aten::bmm", "aten::baddbmm"):
        return "GEMM"
    if "scaled_dot_product" in op:
        return "attention bwd" if "backward" in op else "attention fwd"
    if op in ("aten::copy_", "aten::_to_copy"):
        return "copies, casts"
    return "other"


def split(events: list[tuple[str, float, float]], steps: list[tuple[float, float]]) -> dict:
    """ms per step of each kind: ``events`` (name, start us, self us), ``steps`` the (start, end)
    us of the steps that count; an event counts where it starts inside one of them."""
    out = dict.fromkeys(KINDS, 0.0)
    for name, start, self_us in events:
        if name != STEP_RANGE and any(a <= start < b for a, b in steps):
            out[kind(name)] += self_us / 1e3 / len(steps)
    return out


def profiled(cfg) -> dict:
    """One flow: the kinds' ms per step (steps after the first) and the unprofiled median step."""
    from suite.rl.train import run

    with tempfile.TemporaryDirectory() as tmp:  # also builds what the profiled run needs
        cfg.out = tmp
        timing = read_jsonl(Path(run(cfg, Console(quiet=True))) / "timing.jsonl")
    with tempfile.TemporaryDirectory() as tmp:
        cfg.out = tmp
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as p:
            run(cfg, Console(quiet=True))
    events = p.events()
    ranges = sorted((e.time_range.start, e.time_range.end) for e in events if e.name == STEP_RANGE)
    ms = split([(e.name, e.time_range.start, e.self_cpu_time_total) for e in events], ranges[1:])
    return {"ms_per_step": ms, "steps_counted": len(ranges) - 1,
            "unprofiled_step_s": statistics.median(r["time/step_s"] for r in timing[1:])}


def sdpa_times(dtype: torch.dtype, rows: int, heads: int, tokens: int, size: int,
               repeats: int = 20) -> dict[str, float]:
    """Median forward and backward ms of causal SDPA on (rows, heads, tokens, size) inputs, after
    three warm-up calls."""
    import torch.nn.functional as F

    gen = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(rows, heads, tokens, size, generator=gen).to(dtype).requires_grad_()
               for _ in range(3))
    fwd, bwd = [], []
    for i in range(repeats + 3):
        t0 = time.perf_counter()
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        t1 = time.perf_counter()
        out.sum().backward()
        t2 = time.perf_counter()
        if i >= 3:
            fwd.append(t1 - t0)
            bwd.append(t2 - t1)
    return {"forward_ms": statistics.median(fwd) * 1e3, "backward_ms": statistics.median(bwd) * 1e3}


def sdpa_rows(sizes=SDPA_SIZES, repeats: int = 20, **shape) -> list[dict]:
    """fp32's and bf16's SDPA times per head size (``shape``: rows, heads, tokens; default
    ``SDPA_SHAPE``)."""
    shape = {**SDPA_SHAPE, **shape}
    return [{"head_size": n, **{name: sdpa_times(dtype, size=n, repeats=repeats, **shape)
                                for name, dtype in (("fp32", torch.float32),
                                                    ("bf16", torch.bfloat16))}}
            for n in sizes]


def main(args: list[str], write: bool, console: Console) -> int:
    base = cfgmod.load(args)
    if base.nproc != 1:  # before anything runs
        raise ValueError(f"--profile: nproc={base.nproc}; the profiler sees this process's "
                         "operations, and the ranks of nproc > 1 run in their own (nproc=1)")
    cls = machine.describe(base.gemm, base.threads)
    torch.set_num_threads(base.threads)
    names = list(FLOWS)
    if base.engine == "vllm":  # the flows this device's vLLM can run (bench.py does the same)
        from suite.numerics.vllm_support import supported_flows

        names = [f for f in names if f in supported_flows()]
    flows = {}
    for name in names:
        console.print(f"profiling {name} ({STEPS} steps, twice)")
        flows[name] = profiled(cfgmod.load(args + [f"precision={name}", f"steps={STEPS}",
                                                   "name=bench"]))
    console.print(table(flows, cls["id"]))
    console.print(f"torch's SDPA alone, causal, {SDPA_SHAPE['rows']} rows x {SDPA_SHAPE['heads']} "
                  f"heads x {SDPA_SHAPE['tokens']} tokens (the small tier's update)")
    sdpa = sdpa_rows()
    console.print(sdpa_markdown(sdpa), highlight=False)
    if write:
        path = PROFILE_DIR / f"{cls['id']}.json"
        atomic_write_json(path, {
            "schema_version": SCHEMA, "machine_class": cls, "flows": flows,
            "sdpa": {"shape": SDPA_SHAPE, "rows": sdpa},
            "setting": {"command": " ".join(["suite", "bench", "--profile", *args]),
                        "steps": STEPS, "tier": base.tier, "threads": base.threads,
                        "torch": torch.__version__, "git_sha": git("rev-parse", "HEAD"),
                        "git_dirty": bool(git("status", "-s"))}})
        console.print(f"profile of {cls['id']} written: {path}")
    return 0


def table(flows: dict, class_id: str) -> Table:
    t = Table(title=f"ms per step by kind of operation (torch.profiler, each operation's own "
                    f"time); machine class {class_id}")
    for col in ("flow", *KINDS, "sum", "unprofiled step"):
        t.add_column(col, justify="left" if col == "flow" else "right")
    for name, f in flows.items():
        ms = f["ms_per_step"]
        t.add_row(name, *(f"{ms[k]:.1f}" for k in KINDS), f"{sum(ms.values()):.1f}",
                  f"{f['unprofiled_step_s'] * 1e3:.1f}")
    return t


def f_table(class_id: str) -> str:
    """docs/speed.md's table: the committed profile of ``class_id`` (``suite bench --profile
    --write-baseline``)."""
    from suite.numerics.precision import FLOWS as TABLE

    flows = _flows(class_id)
    lines = ["| flow | " + " | ".join(KINDS) + " | sum | unprofiled step |",
             "|---|" + "---|" * (len(KINDS) + 2)]
    for name in sorted(flows, key=list(TABLE).index):  # the flow table's order
        f = flows[name]
        ms = f["ms_per_step"]
        lines.append(f"| {name} | " + " | ".join(f"{ms[k]:.1f}" for k in KINDS)
                     + f" | {sum(ms.values()):.1f} | {f['unprofiled_step_s'] * 1e3:.1f} |")
    return "\n".join(lines)


def _kind(slug: str) -> str:
    """A kind as a span names it, without spaces ("attention-fwd", "copies-casts")."""
    kinds = {k.replace(", ", "-").replace(" ", "-"): k for k in KINDS}
    if slug not in kinds:
        raise ValueError(f"bench-profile: unknown kind '{slug}' ({', '.join(kinds)})")
    return kinds[slug]


def _record(class_id: str) -> dict:
    return bench_targets.load_baseline(PROFILE_DIR, class_id,
                                       "suite bench --profile --write-baseline")


def _flows(class_id: str) -> dict:
    return _record(class_id)["flows"]


def f_ratio(class_id: str, flow: str, other: str, slug: str) -> str:
    """``flow``'s ms per step of one kind over ``other``'s, in the committed profile: "3.48x"."""
    flows, k = _flows(class_id), _kind(slug)
    return f"{flows[flow]['ms_per_step'][k] / flows[other]['ms_per_step'][k]:.2f}x"


def f_ms(class_id: str, flow: str, slug: str) -> str:
    """``flow``'s ms per step of one kind ("95.1 ms"), or with slug ``step`` its unprofiled
    step."""
    f = _flows(class_id)[flow]
    ms = f["unprofiled_step_s"] * 1e3 if slug == "step" else f["ms_per_step"][_kind(slug)]
    return f"{ms:.1f} ms"


def f_floor(class_id: str, flow: str) -> str:
    """The step ``flow`` would take over bf16's if everything but its GEMMs cost what bf16's does:
    bf16's unprofiled step plus the difference of their GEMMs' ms, over bf16's step ("1.31x")."""
    flows = _flows(class_id)
    ref = flows[bench_targets.REFERENCE_FLOW]
    extra = (flows[flow]["ms_per_step"]["GEMM"] - ref["ms_per_step"]["GEMM"]) / 1e3
    return f"{(ref['unprofiled_step_s'] + extra) / ref['unprofiled_step_s']:.2f}x"


def sdpa_markdown(rows: list[dict]) -> str:
    lines = ["| head size | fp32 forward / backward (ms) | bf16 forward / backward (ms) | bf16 "
             "backward over fp32's |", "|---|---|---|---|"]
    for r in rows:
        a, b = r["fp32"], r["bf16"]
        lines.append(f"| {r['head_size']} | {a['forward_ms']:.2f} / {a['backward_ms']:.2f} | "
                     f"{b['forward_ms']:.2f} / {b['backward_ms']:.2f} | "
                     f"{b['backward_ms'] / a['backward_ms']:.1f}x |")
    return "\n".join(lines)


def f_sdpa(class_id: str) -> str:
    """docs/speed.md's table of torch's SDPA alone on ``class_id`` (the committed profile)."""
    return sdpa_markdown(_record(class_id)["sdpa"]["rows"])
