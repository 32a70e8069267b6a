"""What the trainer scores, and the pure function that scores it.

A ``Batch`` is some rows of a rollout as the trainer sees them: the left-padded prompts followed by
the sampled responses, the response tokens whose log-probs are wanted, and how the sampler drew them
(its temperature, and when a run asks for them its MoE experts, its kept ids under truncated
sampling, its next-token distribution for score centering). One object travels from the loop to the
log-softmax, so a reader sees at the call what is scored and with what
(``trainer.score(batch.rows(c))``), and slicing rows, columns or packed positions slices every field
alike.

``log_probs`` is the one place a compute-dtype logit becomes a log-prob: fp32 log_softmax of the
logits divided by the sampling temperature, exactly as the sampler does it (a different temperature
or dtype here would be a mismatch of the suite's own making).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import NamedTuple

import torch
from torch import Tensor

from suite.numerics import centering, truncation
from suite.numerics.engine import left_pad


class Scores(NamedTuple):
    """The trainer's log-probs of the targets and its entropy, (B, R) each; with a sampler
    distribution to centre on, also score centering's E_t (B, R), whose gradient is the
    sampler-expected score."""

    logp: Tensor
    entropy: Tensor
    expected: Tensor | None = None


@dataclass(frozen=True)
class Batch:
    """Rows to score. ``ids``/``attn`` (B, P+R): prompts left-padded, then the responses;
    ``targets`` (B, R): the response tokens (the last R columns of ids; the logits at position t
    predict token t+1); ``temperature``: the sampler's. Optional, each as the sampler recorded it:
    ``routes`` (B, P+R, L, k) the experts of a mixture of experts, replayed in the trainer's forward
    (routing replay); ``kept`` (B, R, K) the ids truncated sampling kept, to renormalise over;
    ``centre`` the next-token distribution (score centering)."""

    ids: Tensor
    attn: Tensor
    targets: Tensor
    temperature: float
    routes: Tensor | None = None
    kept: Tensor | None = None
    centre: centering.SamplerDist | None = None

    @classmethod
    def of(cls, roll, temperature: float, **recorded) -> Batch:
        """The whole rollout ``roll`` (suite/numerics/rollout.py) with the sampler's recordings
        given in ``recorded`` (routes=, kept=, centre=)."""
        ids, attn = batch_tensors(roll.prompt_ids, roll.tokens, roll.mask)
        return cls(ids, attn, roll.tokens, temperature, **recorded)

    @property
    def n_resp(self) -> int:
        return self.targets.shape[1]

    def rows(self, index) -> Batch:
        """The rows ``index`` (a micro-batch, a rank's share) of every field."""
        return self._map(lambda x: x[index])

    def columns(self, first: int, last: int) -> Batch:
        """Columns first .. last of ids/attn, whose last ``r`` are responses: the first r response
        positions. Routes stay whole: the trainer replays them from where it was handed the
        batch."""
        r = last - (self.ids.shape[1] - self.n_resp)
        cut = dataclasses.replace(self, ids=self.ids[:, first:last], attn=self.attn[:, first:last])
        return cut._map(lambda x: x[:, :r], fields=("targets", "kept", "centre"))

    def to(self, device) -> Batch:
        return self._map(lambda x: x.to(device))

    def without(self, *names: str) -> Batch:
        """The batch without some recordings: e.g. a frozen policy's forward chooses its own experts
        (``without("routes")``)."""
        return dataclasses.replace(self, **dict.fromkeys(names))

    def _map(self, fn, fields=("ids", "attn", "targets", "routes", "kept", "centre")) -> Batch:
        return dataclasses.replace(self,
                                   **{f: fn(getattr(self, f)) for f in fields
                                      if getattr(self, f) is not None})


def batch_tensors(prompt_ids: list[list[int]], tokens: Tensor,
                  mask: Tensor) -> tuple[Tensor, Tensor]:
    """Left-padded prompts + right-padded responses -> ids, attention mask (B, P+R)."""
    ids, valid = left_pad(prompt_ids)
    return torch.cat([ids, tokens], 1), torch.cat([valid.long(), mask.long()], 1)


def log_probs(logits: Tensor, targets: Tensor, temperature: float, kept: Tensor | None = None,
              centre: centering.SamplerDist | None = None) -> tuple[Tensor, ...]:
    """Log-probs of ``targets`` and the entropy, (B, R) each, from compute-dtype logits (B, R, V):
    log_softmax in fp32 on the logits divided by the sampling temperature, exactly as the sampler.
    ``kept`` (B, R, K): the log-prob is renormalised over the sampler's kept ids
    (suite/numerics/truncation.py); the entropy stays the full distribution's. ``centre``: a third
    output (B, R), score centering's E_t (suite/numerics/centering.py). Plain tensors in and out:
    activation checkpointing calls it per chunk."""
    logp_all = torch.log_softmax(logits.float() / temperature, dim=-1)  # (B, R, V)
    if kept is not None:
        logp = truncation.renormalised(logp_all, targets, kept)[0]
    else:
        logp = logp_all.gather(-1, targets[..., None])[..., 0]
    entropy = -(logp_all.exp() * logp_all).sum(-1)
    if centre is not None:
        return logp, entropy, centering.expected_logp(logp_all, centre)
    return logp, entropy
