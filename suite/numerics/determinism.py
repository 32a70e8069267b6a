"""Deterministic GPU kernels on request (config ``deterministic``), and which equality claims hold where.

The suite makes two equality claims (README, docs/distributed.md): a run killed and resumed ends with a
``metrics.jsonl`` byte-identical to an uninterrupted one, and N ranks sample the tokens one rank samples.
Both need every kernel to give the same bits for the same inputs:

- **CPU**: they hold as is. torch's CPU kernels reduce in a fixed order for a fixed thread count
  (``threads``); ``deterministic`` changes nothing there but the flag it records.
- **GPU, deterministic=true**: ``torch.use_deterministic_algorithms(True)`` (kernels that reduce with
  atomics, such as ``index_add_``, ``scatter_add_`` and the embedding backward, take their deterministic
  variants, and an op that has none raises, naming itself, instead of varying silently), with
  ``CUBLAS_WORKSPACE_CONFIG=:4096:8``, the cuBLAS setting torch requires for it on CUDA >= 10.2
  (cuBLAS "Results reproducibility"; torch's ``use_deterministic_algorithms`` documentation), and vLLM's
  batch invariance (``VLLM_BATCH_INVARIANT=1``: a request's tokens do not depend on the other requests of
  its batch, so the batches N ranks form sample what one rank's batch samples). Equality then holds on
  the same GPU model, driver and library versions; slower.
- **GPU, deterministic=false** (the default, the speed of production stacks): neither claim holds; a rerun
  differs from the first sampled token whose logits a reduction order changed.

Process-wide state, so ``enabled`` restores what it found when the run ends: a sweep's next cell in the same
process starts as it would alone. cuBLAS reads its workspace setting when torch first creates its handle,
so a deterministic run should be the process's first CUDA work (``suite run`` is).
"""

from __future__ import annotations

import contextlib
import os

import torch

# The environment a deterministic run sets (read by cuBLAS, and by vLLM when its engine starts).
ENV = {"CUBLAS_WORKSPACE_CONFIG": ":4096:8", "VLLM_BATCH_INVARIANT": "1"}


@contextlib.contextmanager
def enabled(on: bool):
    """Deterministic algorithms and the environment ``ENV`` for the duration when ``on``; nothing otherwise."""
    if not on:
        yield
        return
    saved_env = {k: os.environ.get(k) for k in ENV}
    saved = torch.are_deterministic_algorithms_enabled(), torch.is_deterministic_algorithms_warn_only_enabled()
    os.environ.update(ENV)
    torch.use_deterministic_algorithms(True)
    try:
        yield
    finally:
        torch.use_deterministic_algorithms(saved[0], warn_only=saved[1])
        for k, v in saved_env.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def describe(requested: bool) -> dict:
    """What env.json records: the setting and the state the run actually computed under."""
    return {"requested": requested, "torch_deterministic_algorithms": torch.are_deterministic_algorithms_enabled(),
            **{k: os.environ.get(k) for k in ENV}}
