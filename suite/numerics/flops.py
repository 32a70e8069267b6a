"""Achieved FLOP rates: model FLOPs of a step's work divided by the time it took (timing.jsonl).

Forward FLOPs per token, Kaplan et al. 2020 (arXiv 2001.08361, Sec. 2.1, Table 1):
C_forward = 2 N + 2 n_layer n_ctx d_attn, with N the parameters that take part in matrix products.
We count every ``nn.Linear`` weight, the output head included (its GEMM is real work at a 150k
vocabulary; Kaplan leave embeddings out because a lookup costs nothing). A backward pass costs twice
the forward, so a training token costs 3 C_forward. n_ctx is the padded sequence length of the step,
an upper bound for the attention term of tokens early in a sequence. No MFU is given: the suite
knows no peak FLOP rate for CPUs, and a peak it guessed would make the ratio meaningless.
"""

from __future__ import annotations

import torch


def matmul_params(model: torch.nn.Module) -> int:
    """Parameters of every ``nn.Linear`` (counted once each, even if tied to an embedding)."""
    return sum(m.weight.numel() for m in model.modules() if isinstance(m, torch.nn.Linear))


def forward_flops_per_token(n_matmul: int, n_layer: int, d_attn: int, n_ctx: int) -> float:
    """Kaplan et al. 2020 Table 1: 2 N + 2 n_layer n_ctx d_attn."""
    return 2.0 * n_matmul + 2.0 * n_layer * n_ctx * d_attn


def step_rates(model_cfg, n_matmul: int, generated: int, sequences: int, seq_len: int,
               sample_s: float, train_s: float, forwards: int = 1) -> dict[str, float]:
    """TFLOP/s of the sampling phase (a forward per generated token) and of the training phase
    (``forwards`` scoring passes over every sequence, then one forward and backward per sequence: 3
    C_forward)."""
    c = forward_flops_per_token(n_matmul, model_cfg.num_hidden_layers, model_cfg.hidden_size,
                                seq_len)
    return {"flops/sample_tflop_s": c * generated / sample_s / 1e12,
            "flops/train_tflop_s": c * sequences * seq_len * (forwards + 3) / train_s / 1e12}
