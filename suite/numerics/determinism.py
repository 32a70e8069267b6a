"""Deterministic GPU kernels on request (config ``deterministic``), and which equality claims hold
where.

The suite makes two equality claims (README, docs/distributed.md): a run killed and resumed ends
with a ``metrics.jsonl`` byte-identical to an uninterrupted one, and N ranks sample the tokens one
rank samples. Both need every kernel to give the same bits for the same inputs:

- **CPU**: they hold as is. torch's CPU kernels reduce in a fixed order for a fixed thread count
  (``threads``); ``deterministic`` changes nothing there but the flag it records.
- **GPU, deterministic=true**: ``torch.use_deterministic_algorithms(True)`` (kernels that reduce
with
  atomics, such as ``index_add_``, ``scatter_add_`` and the embedding backward, take their
  deterministic variants, and an op that has none raises, naming itself, instead of varying
  silently), with ``CUBLAS_WORKSPACE_CONFIG=:4096:8``, the cuBLAS setting torch requires for it on
  CUDA >= 10.2 (cuBLAS "Results reproducibility"; torch's ``use_deterministic_algorithms``
  documentation), and vLLM's batch invariance (``VLLM_BATCH_INVARIANT=1``: a request's tokens do not
  depend on the other requests of its batch, so the batches N ranks form sample what one rank's
  batch samples). Equality then holds on the same GPU model, driver and library versions; slower.
- **GPU, deterministic=false** (the default, the speed of production stacks): neither claim holds; a
rerun
  differs from the first sampled token whose logits a reduction order changed.

Process-wide state, so ``enabled`` restores torch's flag and vLLM's variable when the run ends:
a sweep's next cell in the same process starts as it would alone. ``CUBLAS_WORKSPACE_CONFIG`` is
the exception: torch reads it once per process, at the first cuBLAS GEMM
(aten/src/ATen/Context.cpp, ``alertCuBLASConfigNotDeterministic`` keeps the answer in a
function-local static, as ``getChosenWorkspaceSize`` keeps the workspace size), so setting it
for a run that follows another run's GEMMs changes nothing, and every GEMM of the deterministic
run raises. It is therefore set once and kept: by ``reserve`` in a process that will start any
deterministic run (a sweep, before its first cell), else by the first deterministic run before
its CUDA work. A deterministic run in a process whose CUDA was initialised without it is refused
before it computes. torch has no query for "cuBLAS has run"; ``torch.cuda.is_initialized()``,
true before any GEMM, is the test: it may refuse a process that initialised CUDA without a GEMM,
never accept one whose GEMMs would raise.
"""

from __future__ import annotations

import contextlib
import os

import torch

# The environment a deterministic run sets (read by cuBLAS, and by vLLM when its engine starts).
ENV = {"CUBLAS_WORKSPACE_CONFIG": ":4096:8", "VLLM_BATCH_INVARIANT": "1"}
CUBLAS = "CUBLAS_WORKSPACE_CONFIG"
CUBLAS_DETERMINISTIC = (":4096:8", ":16:8")  # the two values torch accepts (Context.cpp)


def reserve(requested: bool) -> None:
    """The deterministic cuBLAS workspace for the whole process, before its first CUDA work,
    when any run it will start asks for ``deterministic`` (a sweep passes whether any cell
    does); else nothing. Every run of the process then computes with it: cuBLAS holds one
    setting per process."""
    if requested:
        _set_cublas()


def _set_cublas() -> None:
    if os.environ.get(CUBLAS) in CUBLAS_DETERMINISTIC:
        return
    if torch.cuda.is_initialized():
        raise ValueError(
            f"deterministic=true: this process initialised CUDA with {CUBLAS}="
            f"{os.environ.get(CUBLAS)!r}, and torch reads that setting once, at the process's "
            f"first cuBLAS call, so every GEMM of this run would raise. Run it in a fresh "
            f"process (`suite run`), or export {CUBLAS}={ENV[CUBLAS]} before the process starts.")
    os.environ[CUBLAS] = ENV[CUBLAS]


@contextlib.contextmanager
def enabled(on: bool):
    """Deterministic algorithms and the environment ``ENV`` for the duration when ``on`` (cuBLAS's
    setting for the rest of the process, see above); nothing otherwise."""
    if not on:
        yield
        return
    _set_cublas()  # first: a refused run has changed nothing
    saved_env = {k: os.environ.get(k) for k in ENV if k != CUBLAS}
    saved = (torch.are_deterministic_algorithms_enabled(),
             torch.is_deterministic_algorithms_warn_only_enabled())
    os.environ.update({k: v for k, v in ENV.items() if k != CUBLAS})
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
    return {"requested": requested,
            "torch_deterministic_algorithms": torch.are_deterministic_algorithms_enabled(),
            **{k: os.environ.get(k) for k in ENV}}
