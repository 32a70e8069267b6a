"""What an in-process vLLM engine changes in the whole process: recorded, then undone at close.

The engine core runs in the trainer's process (suite/numerics/vllm_engine.py), so whatever vLLM
sets process-wide while it starts stays in force for the trainer, and for the next cell of a
sweep, unless put back. What vLLM 0.32 sets (paths relative to ``vllm/``):

- **batch invariance** (``VLLM_BATCH_INVARIANT=1``, which ``deterministic=true`` sets):
  ``model_executor/determinism/batch_invariant.py: init_batch_invariance``, called by the worker's
  ``init_worker_distributed_environment`` (``v1/worker/gpu_worker.py``), registers its own kernels
  for aten ``_log_softmax``, ``softmax``, ``_softmax``, ``mean.dim``, ``bmm`` and ``bmm.out`` (on
  Ampere and ROCm also ``mm``, ``addmm``, ``matmul``, ``linear``) in a
  ``torch.library.Library("aten", "IMPL")`` under the device's dispatch key: the trainer's
  log-softmax and means then run vLLM's kernels too. It turns off reduced-precision fp16/bf16
  reductions, prefers cuBLASLt, sets ``fp32_precision = "ieee"`` for matmul, cuDNN convolutions
  and RNNs, and writes ``CUBLAS_WORKSPACE_CONFIG``, ``CUBLASLT_WORKSPACE_SIZE``, NCCL's
  determinism settings (``NCCL_ALGO``, ``NCCL_PROTO``, ``NCCL_MAX_NCHANNELS``, ...) and a few
  ``VLLM_*`` variables into ``os.environ``. Its module flag ``_batch_invariant_MODE`` makes a
  second call a no-op.
- **the environment cache**: the engine core wraps ``vllm.envs``' lookups in ``functools.cache``
  (``v1/engine/core.py``: ``enable_envs_cache``), so a later engine would read this one's
  environment.

``record`` before the engine starts, ``restore`` after it has shut down. Not undone: NCCL reads
some variables (``NCCL_LAUNCH_MODE``) once per process, so communicators created meanwhile keep
them.
"""

from __future__ import annotations

import os
import sys

import torch

# Where batch invariance lives: vLLM 0.32 onwards, and the releases before.
MODULES = ("vllm.model_executor.determinism.batch_invariant",
           "vllm.model_executor.layers.batch_invariant")


def _flags() -> list[tuple[object, str]]:
    """The torch backend settings batch invariance assigns (``enable_batch_invariant_mode``)."""
    mm, cudnn = torch.backends.cuda.matmul, torch.backends.cudnn
    return [(mm, "allow_fp16_reduced_precision_reduction"),
            (mm, "allow_bf16_reduced_precision_reduction"), (mm, "fp32_precision"),
            (cudnn.conv, "fp32_precision"), (cudnn.rnn, "fp32_precision")]


def record() -> dict:
    """The process-wide state an engine's start may change; call it right before the start."""
    envs = sys.modules.get("vllm.envs")
    mode = {m: bool(getattr(sys.modules.get(m), "_batch_invariant_MODE", False)) for m in MODULES}
    return {"environ": dict(os.environ), "flags": [getattr(obj, name) for obj, name in _flags()],
            "blas": torch.backends.cuda.preferred_blas_library(), "invariant": mode,
            "envs_cache": envs is not None and hasattr(envs.__getattr__, "cache_clear")}


def restore(before: dict, started: dict[str, str]) -> None:
    """Put back what the engine's start changed: ``before`` from ``record``, ``started`` the
    environment right after the start. A variable changed since (by someone else) is left as is."""
    for name in MODULES:
        mod = sys.modules.get(name)
        on = mod is not None and getattr(mod, "_batch_invariant_MODE", False)
        if on and not before["invariant"][name]:
            if mod._batch_invariant_LIB is not None:
                mod._batch_invariant_LIB._destroy()  # unregisters every aten kernel it added
            # A later engine in this process registers them again.
            mod._batch_invariant_LIB, mod._batch_invariant_MODE = None, False
    for (obj, name), value in zip(_flags(), before["flags"]):
        if getattr(obj, name) != value:
            setattr(obj, name, value)
    if torch.backends.cuda.preferred_blas_library() != before["blas"]:
        torch.backends.cuda.preferred_blas_library(before["blas"])
    env = before["environ"]
    for key in set(env) | set(started):
        changed = env.get(key) != started.get(key)
        if changed and os.environ.get(key) == started.get(key):
            if env.get(key) is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = env[key]
    envs = sys.modules.get("vllm.envs")
    if envs is not None and not before["envs_cache"] and hasattr(envs, "disable_envs_cache"):
        envs.disable_envs_cache()
