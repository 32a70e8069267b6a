"""Which base model a run trains: the embedded policy, a named preset, or a local HF directory.

``model=embedded`` (the default) is the tiny Llama the suite builds itself (suite/rl/policy.py).
``model=r1d-1.5b`` and the other presets name the hub checkpoints of the published work; a
preset also says what its tokenizer must provide (a chat template: the math tasks' prompts are
chat messages). ``model=/path/to/dir`` is any saved HF causal LM (``save_pretrained`` layout).

Hub checkpoints are fetched by ``huggingface_hub.snapshot_download`` on a connected machine and
read from its cache otherwise; with ``HF_HUB_OFFLINE=1`` and no cached copy the run stops
before any compute with a message that says how to get the files.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any


@dataclass(frozen=True)
class Preset:
    hub: str
    """Hugging Face repo id."""
    arch: str
    """transformers architecture (what the built-in sampler must support; vLLM supports all
    three)."""
    params_b: float
    """Parameters, billions (for the time and memory estimates in docs/tasks.md)."""
    layers: int
    hidden: int
    note: str
    recipe: dict[str, Any] = field(default_factory=dict)
    """Published hyper-parameters for this model (config fields; a task's tier and the command line
    win)."""
    config: dict[str, Any] = field(default_factory=dict)
    """The rest of its config.json's dimensions (the memory plan reads them without the
    download)."""


# What a 1-2B model needs that the embedded policy does not: a learning rate two orders below the
# toy tiers' 1e-4, and the memory knobs of an 8k-token, 152k-vocabulary response on one 80 GB GPU
# (docs/tasks.md): micro-batches of 2 sequences padded to their own longest row, activations
# recomputed per layer, the fp32 log-softmax in chunks of 1024 positions. lr 1e-6, no weight decay,
# clip 1.0: the published recipes of these models' RL runs (Precision-RL, arXiv 2510.26788; Dr.GRPO,
# arXiv 2503.20783, Sec. 4; verl's GRPO examples). AdamW eps 1e-15 and betas (0.9, 0.95) (the
# schema's default) are the sanity test's (arXiv 2510.26788); a local model keeps eps 1e-8 unwarned,
# since verl's and TRL's optimizers default to it too: both are published practice, the preset names
# its source's.
REAL_MODEL_RECIPE: dict[str, Any] = {
    "optim.lr": 1e-6, "optim.eps": 1e-15, "optim.weight_decay": 0.0, "optim.grad_clip": 1.0,
    "micro_batch": 2, "gradient_checkpointing": True, "logprob_chunk": 1024, "trim_padding": True,
}
# Below this a model trains with the toy tiers' hyper-parameters (the embedded tiers have 0.2-1.6M
# parameters); above it, a run that would use them is refused (``check_recipe``).
REAL_MODEL_PARAMS = 100_000_000


# Published models of the sanity test (arXiv 2510.26788: R1-Distill-Qwen-1.5B; Qwen2.5-Math-1.5B
# and Qwen3-1.7B are the other small bases of that paper's and of Precision-RL's experiments).
_QWEN2_1_5B = {"num_attention_heads": 12, "num_key_value_heads": 2, "intermediate_size": 8960,
               "vocab_size": 151936, "attention_bias": True}
PRESETS: dict[str, Preset] = {
    "r1d-1.5b": Preset("deepseek-ai/DeepSeek-R1-Distill-Qwen-1.5B", "Qwen2ForCausalLM", 1.78, 28,
                       1536, "the sanity test's base model; its chat template opens <think>",
                       REAL_MODEL_RECIPE, {**_QWEN2_1_5B, "tie_word_embeddings": False}),
    "qwen2.5-math-1.5b": Preset("Qwen/Qwen2.5-Math-1.5B", "Qwen2ForCausalLM", 1.54, 28, 1536,
                                "base (not instruct) math model; 4k context", REAL_MODEL_RECIPE,
                                {**_QWEN2_1_5B, "tie_word_embeddings": True}),
    "qwen3-1.7b": Preset("Qwen/Qwen3-1.7B", "Qwen3ForCausalLM", 2.03, 28, 2048,
                         "hybrid thinking model (q/k RMSNorm)", REAL_MODEL_RECIPE,
                         {"num_attention_heads": 16, "num_key_value_heads": 8, "head_dim": 128,
                          "intermediate_size": 6144, "vocab_size": 151936,
                          "tie_word_embeddings": True}),
}
EMBEDDED = "embedded"


def is_path(model: str) -> bool:
    return "/" in model and model not in PRESETS and (model.startswith((".", "/", "~"))
                                                      or Path(model).exists())


def check_name(model: str) -> None:
    """Config-time check (no I/O beyond a stat): embedded, a preset, or an existing directory."""
    from suite.names import unknown

    if model == EMBEDDED or model in PRESETS:
        return
    if is_path(model):
        if not (Path(model).expanduser() / "config.json").is_file():
            raise ValueError(f"model: no HF model (config.json) in {model}")
        return
    raise unknown("model", model, [EMBEDDED, *PRESETS, "/path/to/hf_model_dir"])


def model_dir(model: str) -> Path:
    """The local directory of a preset or path (downloading a preset when the hub is reachable)."""
    if is_path(model):
        return Path(model).expanduser()
    preset = PRESETS[model]
    from huggingface_hub import snapshot_download

    offline = os.environ.get("HF_HUB_OFFLINE", "0").lower() in ("1", "true", "yes")
    try:
        return Path(snapshot_download(preset.hub, local_files_only=offline,
                                      allow_patterns=["*.json", "*.safetensors", "*.model", "*.txt",
                                                      "*.jinja"]))
    # LocalEntryNotFoundError, connection errors: one line that says what to do
    except Exception as e:
        raise FileNotFoundError(
            f"model={model}: {preset.hub} is not in the local Hugging Face cache and the hub is "
            f"{'disabled (HF_HUB_OFFLINE=1)' if offline else 'unreachable'} ({type(e).__name__}). "
            f"On a connected machine run `hf download {preset.hub}`, or pass "
            "model=/path/to/a/local/copy.") from None


def check_chat_template(tok, model: str, task_name: str) -> None:
    """The math tasks' prompts are chat messages: a tokenizer without a template cannot render
    them."""
    if not getattr(tok, "chat_template", None):
        raise ValueError(f"model={model}: its tokenizer has no chat template, and task {task_name} "
                         "gives its prompts as chat messages. Use a chat/instruct checkpoint, or "
                         "add a template to the tokenizer (tokenizer.chat_template = ...; "
                         "save_pretrained).")


def param_count(model: str) -> int | None:
    """Parameters of a preset (its card) or of a local HF model (from config.json, no weights read):
    embeddings (tied or not) + per layer 4 attention projections (GQA-narrowed k/v) and a gated
    MLP."""
    if model in PRESETS:
        return int(PRESETS[model].params_b * 1e9)
    if not is_path(model):
        return None
    try:
        c = json.loads((Path(model).expanduser() / "config.json").read_text())
        h, n, v = c["hidden_size"], c["num_hidden_layers"], c["vocab_size"]
        heads, kv = c.get("num_attention_heads",
                          1), c.get("num_key_value_heads", c.get("num_attention_heads", 1))
        head_dim = c.get("head_dim") or h // heads
        mlp = c.get("intermediate_size", 4 * h) * c.get("num_local_experts", c.get("num_experts", 1)
                                                        or 1)
    except (OSError, ValueError, KeyError, TypeError):
        return None
    attn = h * heads * head_dim * 2 + h * kv * head_dim * 2
    return v * h * (1 if c.get("tie_word_embeddings", False) else 2) + n * (attn + 3 * h * mlp)


def check_recipe(model: str, lr_from_tier: bool, memory: dict[str, Any]) -> list[str]:
    """A real model (>= 100M parameters) trained with the embedded tiers' learning rate is refused
    (ValueError naming the knob); memory knobs (``memory``: field -> value) left at the embedded
    policy's settings come back as warnings naming the value a real model runs with."""
    n = param_count(model)
    if n is None or n < REAL_MODEL_PARAMS:
        return []
    if lr_from_tier:
        raise ValueError(f"model={model} has {n / 1e9:.2f}B parameters, but optim.lr would be the "
                         "toy tier's rate, set for the embedded policy's ~1M. Set optim.lr "
                         "(published RL recipes of 1-8B models: optim.lr=1e-6), or name a preset "
                         f"({', '.join(PRESETS)}), which brings its recipe.")
    untouched = {"micro_batch": None, "gradient_checkpointing": False, "logprob_chunk": 0}
    return [f"model={model} ({n / 1e9:.1f}B parameters): {key}={value} is the embedded policy's "
            f"setting; a real model runs {key}={REAL_MODEL_RECIPE[key]} (docs/tasks.md, memory)"
            for key, value in memory.items() if key in untouched and value == untouched[key]]
