"""The sampler-expected score of score centering (arXiv 2609.20807), computed where the trainer's
full log-distribution exists.

At a response position with trainer pi = softmax(z) and sampler mu, the score of token y with
respect to the logits is grad_z log pi(y) = e_y - pi, and its expectation under the sampler is
E_{v~mu}[grad_z log pi(v)] = mu - pi. Score centering subtracts that expectation from every token's
score (suite/rl/algos.py centering_term takes it from there); this module supplies a per-position
scalar whose gradient is it:

    E_t = sum_v sg(mu(v) - pi(v)) log pi(v)
    grad_z E_t = (mu - pi) - pi * sum_v (mu(v) - pi(v)) = mu - pi

(the second sum is 0 for two distributions). Subtracting sg(pi) rather than writing sum_v sg(mu(v))
log pi(v) changes nothing in exact arithmetic (sum_v pi(v) log pi(v) has zero gradient), and makes
E_t's gradient exactly 0 when the sampler's distribution is the trainer's bit for bit, so a run
without mismatch is not perturbed by rounding.

The sampler's distribution comes whole (the built-in engine: (B, R, V) fp32, 4 B x R x V bytes, fine
for the embedded policy's vocabulary; about 5 GB per 8k-token response at a 152k vocabulary) or as
its top-k head (vLLM's ``logprobs=k``). With a head H only, the unobserved tail is modelled as the
trainer's tail rescaled to the sampler's tail mass, mu(v) ~ rho * pi(v) outside H with rho = (1 -
sum_H mu) / (1 - sum_H pi), as NeMo-RL (``loss_fn.score_centering``, its ``score_centering`` guide)
and SkyRL (``trainer.algorithm.score_centering``) do.

Checked against NeMo-RL's score-centering guide and API page (``compute_score_centering_term``:
"per-token sum_v sg(c_v) log p_v whose gradient is the sampler-expected score", arXiv 2609.20807 Eq.
14, the same rho) and the open implementation in the miles trainer (head mass minus the rescaled
trainer head, summed against log pi). One difference: they clamp the trainer's tail mass at 1e-6;
here an empty tail gives rho = 0, so that a head covering the vocabulary reproduces the full
distribution exactly."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor


@dataclass(frozen=True)
class SamplerDist:
    """The sampler's next-token log-distribution at each response position: all of it (``ids`` None,
    ``logp`` (B, R, V)) or its top-k head (``logp`` and ``ids`` (B, R, K)). Indexing slices the
    leading dimensions of both, as the trainer slices micro-batches, trimmed columns and packed
    positions."""

    logp: Tensor
    ids: Tensor | None = None

    def __getitem__(self, index) -> SamplerDist:
        return SamplerDist(self.logp[index], None if self.ids is None else self.ids[index])

    def to(self, device) -> SamplerDist:
        return SamplerDist(self.logp.to(device), None if self.ids is None else self.ids.to(device))


def sampler_probs(trainer_probs: Tensor, sampler: SamplerDist) -> Tensor:
    """The sampler's probabilities (..., V), detached: its recorded distribution, or its head with
    the tail modelled as rho * pi (module docstring). ``trainer_probs`` (..., V) pi, detached. With
    a head that covers the whole vocabulary (k = V) the result is the recorded distribution exactly:
    the tail is empty."""
    if sampler.ids is None:
        return sampler.logp.exp()
    ids = sampler.ids.to(torch.long)
    head = torch.zeros_like(trainer_probs).scatter(-1, ids, sampler.logp.exp())  # (..., V)
    in_head = torch.zeros_like(trainer_probs, dtype=torch.bool).scatter(-1, ids, True)
    tail_pi = torch.where(in_head, 0.0, trainer_probs).sum(-1, keepdim=True)  # 0 for an empty tail
    tail_mu = (1.0 - sampler.logp.exp().sum(-1, keepdim=True)).clamp(min=0.0)
    # rho = 0 where the trainer's tail is empty or underflows: no mass to rescale, and no inf that
    # the backward pass would turn into NaN
    tiny = torch.finfo(tail_pi.dtype).tiny
    rho = torch.where(tail_pi > 0, tail_mu / tail_pi.clamp(min=tiny), 0.0)
    return torch.where(in_head, head, rho * trainer_probs)


def expected_logp(logp_all: Tensor, sampler: SamplerDist) -> Tensor:
    """E_t = sum_v sg(mu(v) - pi(v)) log pi(v), (...), from the trainer's log-distribution
    ``logp_all`` (..., V) (carrying the gradient) and the sampler's: grad_z E_t = mu - pi, the
    expected score."""
    pi = logp_all.detach().exp()
    mu = sampler_probs(pi, sampler.to(logp_all.device))
    return ((mu - pi) * logp_all).sum(-1)
