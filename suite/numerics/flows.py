"""The precision table: one row per flow, naming the dtype of each engine (no torch import).

The flows' meaning and the GEMM emulation are documented in suite/numerics/precision.py, which
re-exports this table and turns its names into torch dtypes; the table lives here, apart from the
kernels, so that ``suite ls flows``, ``--help`` and config validation read it without loading torch.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING

from suite.names import lookup

if TYPE_CHECKING:
    import torch

# Each dtype name of the table -> the torch dtype an engine computes in (precision.DTYPES).
TORCH_DTYPES = {"fp32": "float32", "bf16": "bfloat16", "fp16": "float16",
                # fp8: FP8 GEMMs in every decoder linear layer; everything else (attention, norms,
                # the output head, activations between operators) in bf16, as DeepSeek-V3 and Jet-RL
                # do.
                "fp8": "bfloat16",
                # 4-bit samplers (suite/numerics/fp4.py): NVFP4 / MXFP4 weights in every decoder
                # linear layer ("a4": their inputs too); everything else in bf16.
                **dict.fromkeys(("nvfp4", "nvfp4a4", "mxfp4", "mxfp4a4"), "bfloat16")}
# The samplers that quantise their decoder linear layers (the others cast weights to the dtype).
QUANTISED = ("fp8", "nvfp4", "nvfp4a4", "mxfp4", "mxfp4a4")


@dataclass(frozen=True)
class Flow:
    """One row of the precision table."""

    name: str
    trainer: str  # autocast dtype of the trainer's forward ("fp32" = no autocast)
    sampler: str  # dtype of the sampler's weights, activations and KV cache
    loss_scaling: bool  # dynamic loss scaling (needed for fp16 gradients)
    note: str
    exact: bool = False  # trainer scores with the sampler's own kernels on the sampler's shapes
    # trainer scores with the sampler's own code on the full sequence (Jet-RL's unified flow)
    unified: bool = False
    # a control flow of the mechanism studies, left out of the main grids (grids._flows)
    control: bool = False

    @property
    def trainer_dtype(self) -> torch.dtype:
        import torch

        return getattr(torch, TORCH_DTYPES[self.trainer])

    @property
    def sampler_dtype(self) -> torch.dtype:
        import torch

        return getattr(torch, TORCH_DTYPES[self.sampler])

    @property
    def sampler_code(self) -> bool:
        """The trainer computes with the sampler's engine code (exact replay or unified full
        sequence), not with the HF module under autocast: these flows cannot shard the trainer or
        checkpoint its activations."""
        return self.exact or self.unified

    @property
    def trainer_quant(self) -> str | None:
        return self.trainer if self.trainer in QUANTISED else None

    @property
    def sampler_quant(self) -> str | None:
        return self.sampler if self.sampler in QUANTISED else None

    @property
    def fp4(self) -> bool:
        """A 4-bit sampler: a flow of its own study, left out of the main grids (``main_flows``)."""
        return self.sampler_quant not in (None, "fp8")

    def describe(self) -> dict:
        """The resolved precision, as recorded in env.json and the config."""
        return asdict(self)


FLOWS: dict[str, Flow] = {
    f.name: f
    for f in [
        Flow("fp32", "fp32", "fp32", False, "reference: both engines in fp32"),
        Flow("bf16", "bf16", "bf16", False, "the common default; 7 mantissa bits, collapses in the "
                                            "published test"),
        Flow("fp16", "fp16", "fp16", True, "the fix of arXiv 2510.26788: 10 mantissa bits plus "
                                           "dynamic loss scaling"),
        Flow("bf16_fp32rollout", "bf16", "fp32", False, "paper ablation: bf16 trainer, fp32 "
                                                        "sampler; stable but slow"),
        Flow("bf16_fp16rollout", "bf16", "fp16", False,
             "paper ablation: bf16 trainer, fp16 sampler"),
        Flow("fp8", "fp8", "fp8", False, "Jet-RL unified FP8 flow (arXiv 2601.14243): the same "
                                         "block-scaled E4M3 "
             "quantiser in the sampler and in the trainer's forward and backward GEMMs",
             unified=True),
        Flow("bf16_fp8rollout", "bf16", "fp8", False, "the common baseline (verl, slime, NeMo-RL, "
                                                      "OpenRLHF): "
             "bf16 trainer, sampler FP8-quantised at every weight sync"),
        # 4-bit rollouts (suite/numerics/fp4.py): bf16_fp8rollout with the sampler's weights in
        # NVFP4 (NVIDIA, 2025) or MXFP4 (OCP MX v1.0) at every sync; "a4": W4A4, inputs too.
        *[Flow(f"bf16_{q}rollout", "bf16", q, False, note) for q, note in [
            ("nvfp4", "sampler weights in NVFP4 at every sync (W4A16: blocks of 16, E4M3 block "
                      "scales, an fp32 tensor scale; NVIDIA)"),
            ("nvfp4a4", "NVFP4 W4A4 sampler: weights and each linear layer's input in NVFP4, "
                        "per-token tensor scales (the 4-bit rollouts SkyRL v0.5.0 reports on)"),
            ("mxfp4", "sampler weights in MXFP4 at every sync (W4A16: blocks of 32, power-of-two "
                      "E8M0 scales; OCP MX v1.0)"),
            ("mxfp4a4", "MXFP4 W4A4 sampler: weights and each linear layer's input in MXFP4")]],
        Flow("nvfp4a4", "nvfp4a4", "nvfp4a4", False, "quantisation-aware NVFP4 W4A4 (Jet-RL's "
             "unified flow, NeMo-RL's QARL): the trainer's forward is the sampler's, quantised "
             "alike, with straight-through gradients into the fp32 masters", unified=True),
        Flow("exact", "bf16", "bf16", False, "bitwise on-policy: the trainer replays the sampler's "
                                             "decode loop "
             "(same kernels, same shapes); mismatch exactly 0, at the cost of a sequential "
             "training forward", True),
        # Controls for the trainer's numerics (docs/hypotheses.md). bf16/fp16 train the HF module
        # under autocast (fp32 residual stream and norms) while exact and unified fp8 train with the
        # sampler's pure low-precision code; these two train with that code too, on the full
        # sequence, so comparing bf16 with bf16_unified separates what the mismatch does from what
        # the trainer's own rounding does.
        Flow("bf16_unified", "bf16", "bf16", False, "control: the trainer runs the sampler's "
                                                    "pure-bf16 code on the "
             "full sequence (mismatch only from GEMM shapes and accumulation order)", unified=True,
             control=True),
        Flow("fp16_unified", "fp16", "fp16", True, "control: the trainer runs the sampler's "
                                                   "pure-fp16 code on the "
             "full sequence, with dynamic loss scaling", unified=True, control=True),
    ]
}


# The sampler's KV cache, a knob of its own (config kv_cache): a stack's KV cache precision is
# chosen apart from its weights' (vLLM's kv_cache_dtype, NeMo-RL's FP8 KV cache gate is 2x its
# FP8-weights one). name -> the quantiser the built-in engine applies (suite/numerics/fp8.py
# fake_quant_kv) and the vLLM kv_cache_dtype it maps to.
KV_CACHE = {"auto": (None, "auto"), "fp8": ("fp8", "fp8")}


def kv_quant(choice: str) -> str | None:
    """The KV quantiser of a ``kv_cache`` choice (None: the cache holds the sampler's dtype)."""
    return lookup("kv_cache", choice, KV_CACHE)[0]


def main_flows() -> list[str]:
    """The flows of the main grids (sanity, precision ablation): every row but the controls and the
    4-bit rollouts (a study of their own: the main job's cells stay those of the references)."""
    return [n for n, f in FLOWS.items() if not (f.control or f.fp4)]


def resolve(name: str) -> Flow:
    """Look a flow up by name; unknown names get a "did you mean"."""
    return lookup("precision", name, FLOWS)
