"""The refit check: after a weight sync, the sampler's quantised weights equal a fresh quantisation
of the weights it was sent, bit for bit.

A sampler that quantises its weights (FP8 block scales, NVFP4/MXFP4 block and tensor scales)
re-derives them at every sync; if any of that state survives a reload (a scale cached by a CUDA
graph, a buffer the loader does not overwrite), the sampler keeps sampling from the old weights'
codes while the run reports the new ones, and nothing in the metrics says so: prime-rl found stale
NVFP4 scales after a weight reload under CUDA graphs (github.com/PrimeIntellect-ai/prime-rl, issue
3513). The check quantises the synced weights again, here, with the quantisers the sampler is meant
to use, and compares codes and scales bit for bit: on a rotating few layers every step (cheap:
``rotating``), on all of them in ``suite doctor``. A mismatch stops the run, naming the layer.

Engines without quantised weights, and the vLLM engine, whose weights live inside vLLM's workers,
are not checked here (``checkable``).
"""
from __future__ import annotations

import re

import torch

from suite.numerics import fp4
from suite.numerics.fp8 import quantize_blockwise, weight_operand

LAYER = re.compile(r".*\.layers\.\d+\.")  # a decoder layer's prefix: "model.layers.3."


class StaleWeights(RuntimeError):
    """The sampler's quantised weights are not those of the last sync."""


def checkable(engine) -> bool:
    return bool(getattr(engine, "wq", None)) and hasattr(engine, "cast_weights")


def _bits(t: torch.Tensor) -> torch.Tensor:
    """The tensor's bytes, so that equality is bitwise (a NaN scale equals itself; -0 differs from
    +0)."""
    return t.detach().contiguous().view(torch.uint8)


def _parts(q) -> dict[str, torch.Tensor]:
    if isinstance(q, fp4.SamplerWeight):
        return {"codes x block scales": q.operand, "tensor scale": q.tensor_scale.reshape(1)}
    codes, scales = q
    return {"E4M3 codes": codes, "block scales": scales}


def check(engine, state_dict: dict[str, torch.Tensor],
          layers: list[str] | None = None) -> list[str]:
    """Compare ``engine``'s quantised weights with a fresh quantisation of ``state_dict`` (what it
    was synced to); ``layers``: the weight names to check (default all). Raises StaleWeights naming
    the first layer that differs; returns the names checked."""
    if not checkable(engine):
        return []
    names = sorted(engine.wq) if layers is None else layers
    # Cast only the decoder layers checked: the per-step check runs in the RL step, where a copy of
    # the whole model in the sampler's dtype would cost more than the check.
    matched = [LAYER.match(n) for n in names]
    if all(matched):
        prefixes = tuple({m.group(0) for m in matched})
        state_dict = {k: v for k, v in state_dict.items() if k.startswith(prefixes)}
    fresh = engine.cast_weights(state_dict, detach=True)
    for name in names:
        w = fresh[name]
        fresh_q = quantize_blockwise(w) if engine.quant == "fp8" else fp4.quantize_weight(
            w, engine.quant)
        have, want = _parts(engine.wq[name]), _parts(fresh_q)
        # emulated FP8: the dequantised operand the sampler keeps between syncs, derived state that
        # could go stale as a scale can
        if name in getattr(engine, "w_hat", {}):
            have["dequantised operand"] = engine.w_hat[name]
            want["dequantised operand"] = weight_operand(*fresh_q)
        for (part, a), b in zip(have.items(), want.values()):
            if a.shape != b.shape or not torch.equal(_bits(a), _bits(b)):
                n = int((_bits(a) != _bits(b)).any(-1).sum()) if a.shape == b.shape else -1
                raise StaleWeights(f"refit check: the sampler's {engine.quant} weight {name} "
                                   f"({part}) differs from a fresh quantisation of the weights it "
                                   "was synced to"
                                   + (f" in {n} rows" if n >= 0 else f": shape {tuple(a.shape)} vs "
                                                                     f"{tuple(b.shape)}")
                                   + "; a stale scale or code survived the sync")
    return names


def rotating(engine, step: int, per_step: int = 2) -> list[str]:
    """The ``per_step`` quantised weights to check at ``step``: every weight once per ceil(n /
    per_step) steps."""
    names = sorted(getattr(engine, "wq", {}) or {})
    if not names:
        return []
    start = (step * per_step) % len(names)
    return [names[(start + i) % len(names)] for i in range(min(per_step, len(names)))]
