"""How the samplers draw tokens: one seeded stream per sampled sequence.

Every sequence draws from its own stream, seeded by (run seed, step, prompt group, sample), so the
rank that samples a group (suite/dist.py) never changes its tokens and a run over N ranks samples
the tokens of a 1-rank run (docs/distributed.md). The built-in engine draws by inverse CDF from
those streams' uniforms; vLLM gets the same seeds per request (vllm_engine.py).
"""

from __future__ import annotations

import hashlib

import torch


def sequence_seeds(seed: int, step: int, groups: list[int], group_size: int) -> torch.Tensor:
    """(len(groups) * group_size,) int64 seeds, one per sampled sequence: a function of (run seed,
    step, prompt group's index in the step's batch, sample within the group) and of nothing else, so
    the rank that samples a group (suite/dist.py) never changes its tokens."""
    def one(g: int, j: int) -> int:
        digest = hashlib.sha256(f"{seed}:{step}:{g}:{j}".encode()).digest()
        return int.from_bytes(digest[:8], "little") >> 1  # a non-negative int64
    return torch.tensor([one(g, j) for g in groups for j in range(group_size)], dtype=torch.long)


def uniforms(seeds: torch.Tensor, n: int, device) -> torch.Tensor:
    """(B, n) fp64 uniforms in [0, 1): row b is the first n draws of torch's generator seeded with
    seeds[b]."""
    rows = [torch.rand(n, dtype=torch.float64, generator=torch.Generator().manual_seed(int(s)))
            for s in seeds]
    return torch.stack(rows).to(device)


def draw(logp: torch.Tensor, keep: torch.Tensor | None,
         rng: torch.Generator | torch.Tensor) -> torch.Tensor:
    """Draw one token per row from exp(logp), optionally restricted to the kept set ``keep`` (B, V)
    bool (top-k / top-p, truncation.keep_mask).

    ``rng``: a generator (torch.multinomial over the batch), or (B,) uniforms u: inverse-CDF
    sampling, token = the first index whose cumulative probability exceeds u x total, computed
    per row in fp64 (a zero-probability token is never drawn).
    """
    probs = logp.exp()
    if keep is not None:
        probs = probs.masked_fill(~keep, 0.0)
    if isinstance(rng, torch.Generator):
        if rng.device == probs.device:
            return torch.multinomial(probs, 1, generator=rng)[:, 0]
        # CUDA refuses a generator of another device (a CPU one, as evaluation and the benchmarks
        # seed): draw the batch's uniforms from it where it lives and sample by inverse CDF on the
        # probabilities' device.
        rng = torch.rand(probs.shape[0], dtype=torch.float64, generator=rng).to(probs.device)
    cdf = probs.double().cumsum(-1)  # (B, V)
    tok = torch.searchsorted(cdf, (rng * cdf[:, -1])[:, None], right=True)[:, 0]
    # the last drawable token: u x total may round up to total
    last = (probs > 0).cumsum(-1).argmax(-1)
    return torch.minimum(tok, last)
