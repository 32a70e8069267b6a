"""Time torch's CPU scaled-dot-product attention, forward and backward, in fp32 and bf16 at the
trainer's shapes.

Why: the suite's bf16 update (and TRL's, through the same transformers module) spends most of its
time in torch's CPU flash-attention backward, which in bf16 took several times its fp32 time on
``cpu-avx512bf16-mixed`` (docs/speed.md). The shapes default to the small tier's update: 64 rows of
prompt + response (~56 tokens), 4 heads, head sizes 24 (the embedded policy's), 32 and 64.

    python scripts/sdpa_backward.py [--rows 64] [--tokens 56] [--heads 4] [--repeats 20]

Prints one line per head size: each dtype's forward and backward in ms (medians over the repeats)
and bf16's backward over fp32's. One thread, as the suite's cells run.
"""
from __future__ import annotations

import argparse
import statistics
import time

import torch
import torch.nn.functional as F


def timed(dtype: torch.dtype, rows: int, heads: int, tokens: int, size: int,
          repeats: int) -> tuple[float, float]:
    """Median forward and backward ms of causal SDPA on (rows, heads, tokens, size) inputs."""
    gen = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(rows, heads, tokens, size, generator=gen).to(dtype).requires_grad_()
               for _ in range(3))
    fwd, bwd = [], []
    for i in range(repeats + 3):  # three warm-up calls
        t0 = time.perf_counter()
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        t1 = time.perf_counter()
        out.sum().backward()
        t2 = time.perf_counter()
        if i >= 3:
            fwd.append(t1 - t0)
            bwd.append(t2 - t1)
    return statistics.median(fwd) * 1e3, statistics.median(bwd) * 1e3


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rows", type=int, default=64)
    ap.add_argument("--tokens", type=int, default=56)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--sizes", type=int, nargs="+", default=[24, 32, 64])
    ap.add_argument("--repeats", type=int, default=20)
    a = ap.parse_args()
    torch.set_num_threads(1)
    print(f"torch {torch.__version__}, causal SDPA, {a.rows} rows x {a.heads} heads x {a.tokens} "
          f"tokens, one thread, medians of {a.repeats}")
    for size in a.sizes:
        f32 = timed(torch.float32, a.rows, a.heads, a.tokens, size, a.repeats)
        b16 = timed(torch.bfloat16, a.rows, a.heads, a.tokens, size, a.repeats)
        print(f"head size {size}: fp32 forward {f32[0]:.2f} ms, backward {f32[1]:.2f} ms; "
              f"bf16 forward {b16[0]:.2f} ms, backward {b16[1]:.2f} ms; "
              f"bf16 backward / fp32 backward {b16[1] / f32[1]:.1f}x")


if __name__ == "__main__":
    main()
