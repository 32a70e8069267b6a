"""Asynchronous rollouts: the sampler holds weights ``k`` RL steps old (config ``staleness``).

prime-rl (``async_level``), AReaL and verl's fully-async mode sample the next batches while the
trainer updates, so a rollout comes from weights one or more updates behind the trainer's. Its gap
to the trainer is then two things at once, and users ask which one they see:

- the *numeric gap*: the trainer's numerics vs the sampler's at the sampling weights (what the
precision
  flows change; the whole mismatch when k = 0);
- the *policy lag*: the trainer now vs the trainer at the sampling weights (what off-policy
corrections
  were built for; exactly 0 when k = 0).

log pi_now - log mu = (log pi_now - log pi_then) + (log pi_then - log mu): ``split`` reports both
terms with the mismatch metrics of suite/numerics/mismatch.py, ``staleness/lag/*`` and
``staleness/numeric/*``, next to the run's ``mismatch/*`` (trainer now vs sampler, what the IS
corrections see).

With k = 0 nothing here runs: the loop syncs the sampler with the current weights as it always did.
"""

from __future__ import annotations

from collections import deque

import torch

from suite.numerics.mismatch import mismatch_metrics

SPLIT_KEYS = ("kl_k3", "prob_diff/mean", "logprob_diff/mean", "exp_abs_logprob_diff/mean",
              "seq_log_ratio/mean_abs")


class WeightHistory:
    """The trainer's weights at the last ``k + 1`` syncs; the sampler gets the oldest (k syncs
    behind).

    The first k steps of a run sample with the starting weights, as an asynchronous trainer does
    while its pipeline fills. The history is kept in memory: a resumed run starts it again from the
    checkpoint's weights.
    """

    def __init__(self, k: int):
        self.k = k
        self.snaps: deque[dict[str, torch.Tensor]] = deque(maxlen=k + 1)

    def push(self, weights: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """Record the weights of this sync; return the ones to sample with."""
        if self.k == 0:
            return weights
        self.snaps.append({n: t.detach().to("cpu", copy=True) for n, t in weights.items()})
        return self.snaps[0]


def split(trainer_now: torch.Tensor, trainer_then: torch.Tensor, sampler: torch.Tensor,
          mask: torch.Tensor) -> dict:
    """staleness/numeric/<key> (trainer then vs sampler) and staleness/lag/<key> (trainer now vs
    trainer then), for the keys SPLIT_KEYS of mismatch_metrics; all (B, R) log-probs of the sampled
    tokens."""
    numeric = mismatch_metrics(trainer_then, sampler, mask)
    lag = mismatch_metrics(trainer_now, trainer_then, mask)
    return {**{f"staleness/numeric/{k}": numeric[f"mismatch/{k}"] for k in SPLIT_KEYS},
            **{f"staleness/lag/{k}": lag[f"mismatch/{k}"] for k in SPLIT_KEYS}}
