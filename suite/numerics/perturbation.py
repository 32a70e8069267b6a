"""Synthetic training-inference mismatch: a calibrated perturbation of the sampler's distribution.

A real flow's mismatch mixes several things (rounding noise in every logit, a systematic tilt, the
trainer's own numerics), and its size is fixed by the dtype. A dose-response curve needs a dial
instead: an fp32 run (mismatch ~1e-14) whose sampler draws from a perturbed distribution mu and
records log mu, as a low-precision rollout engine would, while the trainer scores the clean pi.
Sweeping the magnitude and measuring the mismatch the run actually saw places the sanity verdict
against the mismatch, and the real flows on that curve by their own measured mismatch.

Two kinds, applied to the fp32 processed log-probs (logits / temperature, log-softmaxed) and
renormalised:

- ``noise``: log mu = log_softmax(log pi + scale * z), z ~ N(0, 1) independent per response
  position and vocabulary entry: the unstructured part, like the rounding error of low-precision
  logits (bf16's relative error is up to 2^-8 of each logit).
- ``lowp_bias``: log mu = log_softmax(log pi + scale * 1[pi < threshold]): the systematic part, a
  sampler that over-weights (scale > 0) the low-probability tail, where the published mismatch
  concentrates (arXiv 2510.26788 section 3: the largest |pi - mu| sit on low-probability tokens).

``z`` is drawn per sequence from its own seed (as the sampler's tokens are,
sampling.sequence_seeds), so a sequence's perturbation does not depend on the batch it is sampled in
or on the rank.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass

import torch

KINDS = ("none", "noise", "lowp_bias")
# keeps the noise stream apart from the token-sampling stream of the same seed
_SALT = 0x9E3779B97F4A7C15 >> 1


@dataclass(frozen=True)
class Perturbation:
    """What the sampler adds to its log-probs (config group ``inject``)."""

    kind: str = "none"
    scale: float = 0.0
    threshold: float = 0.1

    @property
    def active(self) -> bool:
        return self.kind != "none"


@contextlib.contextmanager
def suspended(engine):
    """Inside the block ``engine`` samples from the policy itself. The perturbation stands for a
    rollout engine's mismatch in training, not for the policy: a held-out evaluation must score what
    the run learned, or a run failing on its perturbed rollouts cannot be told from a policy that
    learned less. An engine without an active perturbation (vLLM refuses one) is left as it is."""
    saved = getattr(engine, "perturbation", None)
    if saved is None or not saved.active:
        yield
        return
    engine.perturbation = Perturbation()
    try:
        yield
    finally:
        engine.perturbation = saved


def perturb(logp: torch.Tensor, p: Perturbation, z: torch.Tensor | None = None) -> torch.Tensor:
    """The perturbed log-probs (B, V) from clean fp32 log-probs ``logp`` (B, V); ``z`` (B, V)
    standard normals for ``noise``. Pure: same inputs, same output."""
    if p.kind == "none":
        return logp
    if p.kind == "noise":
        return torch.log_softmax(logp + p.scale * z.to(logp.dtype), dim=-1)
    if p.kind == "lowp_bias":
        return torch.log_softmax(logp + p.scale * (logp.exp() < p.threshold).to(logp.dtype), dim=-1)
    raise ValueError(f"inject.kind: unknown kind {p.kind!r} ({', '.join(KINDS)})")


class NoiseStream:
    """Standard normals (B, V) for each decoding step: one generator per sequence seed, or the
    batch's own generator when the sampler draws from one stream."""

    def __init__(self, rng: torch.Generator | torch.Tensor, vocab: int, device):
        self.vocab, self.device = vocab, device
        if isinstance(rng, torch.Generator):
            self.batch, self.rows = rng, None
        else:
            self.batch, self.rows = None, [torch.Generator().manual_seed(int(s) ^ _SALT)
                                           for s in rng.tolist()]

    def next(self, batch_size: int) -> torch.Tensor:
        if self.rows is None:
            return torch.randn(batch_size, self.vocab, generator=self.batch,
                               device=self.batch.device).to(self.device)
        return torch.stack([torch.randn(self.vocab, generator=g)
                            for g in self.rows]).to(self.device)
