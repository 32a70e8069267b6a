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

import os
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Preset:
    hub: str
    """Hugging Face repo id."""
    arch: str
    """transformers architecture (what the built-in sampler must support; vLLM supports all three)."""
    params_b: float
    """Parameters, billions (for the time and memory estimates in docs/tasks.md)."""
    layers: int
    hidden: int
    note: str


# Published models of the sanity test (arXiv 2510.26788: R1-Distill-Qwen-1.5B; Qwen2.5-Math-1.5B
# and Qwen3-1.7B are the other small bases of that paper's and of Precision-RL's experiments).
PRESETS: dict[str, Preset] = {
    "r1d-1.5b": Preset("deepseek-ai/DeepSeek-R1-Distill-Qwen-1.5B", "Qwen2ForCausalLM", 1.78, 28, 1536,
                       "the sanity test's base model; its chat template opens <think>"),
    "qwen2.5-math-1.5b": Preset("Qwen/Qwen2.5-Math-1.5B", "Qwen2ForCausalLM", 1.54, 28, 1536,
                                "base (not instruct) math model; 4k context"),
    "qwen3-1.7b": Preset("Qwen/Qwen3-1.7B", "Qwen3ForCausalLM", 2.03, 28, 2048,
                         "hybrid thinking model (q/k RMSNorm)"),
}
EMBEDDED = "embedded"


def is_path(model: str) -> bool:
    return "/" in model and model not in PRESETS and (model.startswith((".", "/", "~")) or Path(model).exists())


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
                                      allow_patterns=["*.json", "*.safetensors", "*.model", "*.txt", "*.jinja"]))
    except Exception as e:  # LocalEntryNotFoundError, connection errors: one line that says what to do
        raise FileNotFoundError(
            f"model={model}: {preset.hub} is not in the local Hugging Face cache and the hub is "
            f"{'disabled (HF_HUB_OFFLINE=1)' if offline else 'unreachable'} ({type(e).__name__}). On a connected "
            f"machine run `hf download {preset.hub}`, or pass model=/path/to/a/local/copy.") from None


def check_chat_template(tok, model: str, task_name: str) -> None:
    """The math tasks' prompts are chat messages: a tokenizer without a template cannot render them."""
    if not getattr(tok, "chat_template", None):
        raise ValueError(f"model={model}: its tokenizer has no chat template, and task {task_name} gives its prompts "
                         f"as chat messages. Use a chat/instruct checkpoint, or add a template to the tokenizer "
                         f"(tokenizer.chat_template = ...; save_pretrained).")
