"""The tables of a GPU acceptance (``suite accept``), rendered from what it committed under
``results/reference/<class>/accept/``: the documents quote them through ``<!--
generated:accept:CLASS:TABLE -->`` spans (suite/experiments/docfigures.py), so they say what the
device measured and nothing else."""

from __future__ import annotations

import json

from suite.results import REFERENCE_ROOT


def _load(cls: str, name: str):
    path = REFERENCE_ROOT / cls / "accept" / name
    if not path.is_file():
        raise ValueError(f"no {path}")
    return json.loads(path.read_text())


def _e(x: float) -> str:
    return "0" if x == 0 else f"{x:.2e}"


def doctor(cls: str) -> str:
    """The doctor's rows; the per-flow placement and dtype rows folded into one line."""
    rows = _load(cls, "doctor.json")
    per_flow = [r for r in rows if r["check"].startswith(("placement ", "dtypes "))]
    lines = ["| check | result | measured |", "|---|---|---|",
             f"| placement, dtypes | {sum(r['ok'] for r in per_flow)} of {len(per_flow)} pass | "
             "every flow's trainer and sampler on cuda:0, each engine's observed dtype the flow "
             "table's |"]
    for r in rows:
        if r not in per_flow:
            lines.append(f"| {r['check']} | {'pass' if r['ok'] else 'FAIL'} | "
                         f"{r['measured'].replace('|', '/')} |")
    return "\n".join(lines)


def mismatch(cls: str) -> str:
    """Every flow's step-0 mismatch with the observed dtypes and the GEMM kernel that took the most
    device time."""
    table = _load(cls, "mismatch.json")
    lines = ["| flow | k3 KL | mean abs dp | max abs log-prob diff | trainer GEMM / sampler | "
             "longest GEMM kernel |",
             "|---|---|---|---|---|---|"]
    for name, r in table.items():
        if name.startswith("_"):
            continue
        gemm = next((k[0] for k in r["kernels"]
                     if any(s in k[0] for s in ("gemm", "nvjet", "xmma", "cutlass"))), "-")
        dtypes = (f"{r['trainer_gemm'].removeprefix('torch.')} / "
                  f"{str(r['sampler']).removeprefix('torch.')}")
        lines.append(f"| {name} | {_e(r['kl_k3'])} | {_e(r['prob_diff_mean'])} | "
                     f"{_e(r['logprob_diff_max'])} | {dtypes} | `{gemm[:60]}` |")
    return "\n".join(lines)


def gemm(cls: str) -> str:
    g = _load(cls, "gemm.json")
    lines = ["| layer | M x N x K | bf16 TFLOP/s | FP8 GEMM TFLOP/s | FP8 GEMM / bf16 time | FP8 "
             "linear / bf16 | NVFP4 linear / bf16 | FP8 = emulation, FP4 = fp64 |",
             "|---|---|---|---|---|---|---|---|"]
    for r in g["rows"]:
        lines.append(f"| {r['layer']} | {r['M']} x {r['N']} x {r['K']} | {r['bf16_tflops']:.0f} | "
                     f"{r['fp8_gemm_tflops']:.0f} | {1 / r['fp8_gemm_vs_bf16']:.2f}x | "
                     f"{1 / r['fp8_linear_vs_bf16']:.2f}x | {1 / r['nvfp4_linear_vs_bf16']:.1f}x | "
                     f"{'yes' if r['fp8_agrees'] and r['fp4_agrees'] else 'NO'} |")
    return "\n".join(lines)


def memory(cls: str) -> str:
    """The plan against the allocator's peak: the plan's sizes, then R1D-1.5B's widths at the
    recipe's shapes (memory_r1d.txt: the JSON lines of ``bench-memory --one``, predicted here by the
    current plan)."""
    from suite.experiments.bench_memory import predicted_mb

    rows = [dict(r) for r in _load(cls, "memory.json")["rows"]]
    r1d = REFERENCE_ROOT / cls / "accept" / "memory_r1d.txt"
    for line, batch in zip([ln for ln in r1d.read_text().splitlines() if ln.startswith("{")],
                           (1, 4)):
        m = json.loads(line)
        sizes = dict(vocab=151936, batch=batch, prompt=1024, response=4096, precision="bf16",
                     arch="r1d-1.5b")
        want = predicted_mb(m["variant"], **sizes)
        rows.append({"option": m["variant"], **sizes, "hidden": "r1d-1.5b", "predicted_mib": want,
                     "measured_mib": m["peak_mb"], "error": (want - m["peak_mb"]) / m["peak_mb"]})
    lines = ["| option | widths | vocab | batch x (prompt + response) | precision | predicted MiB "
             "| measured MiB | error |",
             "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['option']} | {r['hidden'] or 'small tier'} | {r['vocab']} | "
                     f"{r['batch']} x ({r['prompt']} + {r['response']}) | {r['precision']} | "
                     f"{r['predicted_mib']:,.0f} | {r['measured_mib']:,.0f} | {r['error']:+.0%} |")
    return "\n".join(lines)


TABLES = {"doctor": doctor, "mismatch": mismatch, "gemm": gemm, "memory": memory}


def f_accept(cls: str, table: str) -> str:
    if table not in TABLES:
        raise ValueError(f"accept:{cls}:{table}: tables are {', '.join(TABLES)}")
    return TABLES[table](cls)
