"""What a sampler returns, shared by both engines (the built-in one and vLLM's adapter): the batch
of sampled responses with the sampler's log-probs, and the special ids of the embedded tokenizer."""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from suite.numerics import truncation

# The embedded tokenizer's special ids (suite/rl/policy.py builds it with them): the sampler pads
# with PAD and stops at EOS. Defined here, the lower module, so the policy imports the sampler and
# not the reverse.
PAD, BOS, EOS = 0, 1, 2


@dataclass
class Rollout:
    """A batch of sampled responses. Shapes: B sequences, R = longest response."""

    prompt_ids: list[list[int]]
    tokens: torch.Tensor  # (B, R) sampled ids, PAD after the end
    mask: torch.Tensor  # (B, R) float, 1 on sampled tokens (EOS included)
    logprobs: torch.Tensor  # (B, R) fp32 sampler log-probs of the sampled tokens, 0 off-mask
    truncated: list[bool]  # True when max_new_tokens was hit before EOS (finish reason "length")
    # MoE: (B, P+R, L, k) experts of every position (left-padded prompt + response)
    routes: torch.Tensor | None = None
    # Truncated sampling (top-k / top-p; suite/numerics/truncation.py): the kept ids (B, R, K), -1
    # padded, and the kept mass (B, R) of the full distribution; None without truncation. logprobs
    # are then renormalised over them.
    kept: torch.Tensor | None = None
    kept_mass: torch.Tensor | None = None
    # The sampler's full fp32 log-distribution (B, R, V), only when asked
    # (generate(keep_dist=True)): the full-vocabulary divergences of `suite attribute` and `suite
    # gate`, and score centering. With
    # dist_topk = k its top-k head instead: log-probs (B, R, k), their ids in `dist_ids` (B, R, k).
    dist: torch.Tensor | None = None
    dist_ids: torch.Tensor | None = None

    @property
    def finish_reasons(self) -> list[str]:
        return ["length" if t else "stop" for t in self.truncated]

    def response_ids(self) -> list[list[int]]:
        lengths = self.mask.sum(1).long().tolist()
        return [row[:n] for row, n in zip(self.tokens.tolist(), lengths)]

    @property
    def n_tokens(self) -> int:
        return int(self.mask.sum().item())

    @staticmethod
    def concat(parts: list[Rollout]) -> Rollout:
        """One batch from several (the ranks' rollouts, in rank order), right-padded to the longest
        response."""
        if len(parts) == 1:
            return parts[0]
        # config.validate keeps MoE policies to one rank
        if any(p.routes is not None for p in parts):
            raise ValueError("Rollout.concat: routes of several ranks are not aligned (prompt "
                             "padding differs)")
        R = max(p.tokens.shape[1] for p in parts)

        def pad(t, value):  # (B, R, ...) -> (B, R_max, ...)
            return F.pad(t, (0, 0) * (t.dim() - 2) + (0, R - t.shape[1]), value=value)

        def cat(name, value):  # an optional field: present in every part or in none
            if getattr(parts[0], name) is None:
                return None
            return torch.cat([pad(getattr(p, name), value) for p in parts])
        kept = parts[0].kept is not None
        return Rollout(prompt_ids=[x for p in parts for x in p.prompt_ids],
                       tokens=torch.cat([pad(p.tokens, PAD) for p in parts]),
                       mask=torch.cat([pad(p.mask, 0.0) for p in parts]),
                       logprobs=torch.cat([pad(p.logprobs, 0.0) for p in parts]),
                       truncated=[x for p in parts for x in p.truncated],
                       kept=truncation.pad_kept([p.kept for p in parts], R) if kept else None,
                       kept_mass=cat("kept_mass", 1.0), dist=cat("dist", 0.0),
                       dist_ids=cat("dist_ids", 0))


def eos_ids(config) -> list[int]:
    """End-of-sequence ids of a model: its config's eos_token_id (an int or a list, as Qwen and
    Llama 3 have several), else the embedded policy's EOS."""
    eos = getattr(config, "eos_token_id", None)
    return [EOS] if eos is None else [int(e)
                                      for e in (eos if isinstance(eos, (list, tuple)) else [eos])]
