"""The embedded base policy: a tiny Llama the suite builds, warm-starts and caches itself.

The policy is an ordinary Hugging Face ``LlamaForCausalLM`` saved with ``save_pretrained``
next to a character-level fast tokenizer, so the directory loads in transformers, vLLM and
lm-eval like any hub checkpoint. It is warm-started by supervised learning on the task's
reference traces and stopped as soon as its *sampled* accuracy (temperature 1, the RL
sampling setting) on a probe set reaches ``target_acc``: an undertrained policy solves many
prompts sometimes but not always, which is what the perfectible filter needs
(arXiv 2510.26788: pass rate in [0.2, 0.8]).

Everything is seeded and the build is cached under ``<cache>/policies/<key>/`` where the key
hashes the spec and the task version, so a second call returns at once.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import random
import shutil
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
from rich.console import Console

from suite.numerics.engine import BOS, EOS, PAD

SPECIALS = ["<pad>", "<bos>", "<eos>"]  # ids PAD, BOS, EOS = 0, 1, 2 (suite/numerics/engine.py)
# The embedded policy standing in for a real model on a dataset task (sanity_r1d, math, gsm8k):
# one token per printable ASCII character, and a chat template so chat-message prompts render
# the way a real model's template renders them (structure only; the model is untrained there).
TEXT_ALPHABET = "".join(c for c in map(chr, range(32, 127))) + "\n\t"
CHAT_TEMPLATE = ("{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}\n{% endfor %}"
                 "{% if add_generation_prompt %}<|assistant|>{% endif %}")


# The warm start and the perfectible set are built with a fixed torch thread count, whichever
# command builds them first (`suite main` prebuilds in its own process, `suite run` and `suite
# perfectible` after setting cfg.threads) and whatever the core count: the thread count splits GEMM
# reductions, so a cached policy would otherwise depend on who built it (on one AMX machine: 286 vs
# 197 perfectible prompts of 1,024 built with 2 vs 1 threads). 2 is what every committed reference
# was built with. Part of the cache key.
BUILD_THREADS = 2


@dataclass(frozen=True)
class PolicySpec:
    """Architecture and warm-start recipe of the embedded policy (set by the tier)."""

    hidden: int
    layers: int
    heads: int
    kv_heads: int
    mlp: int
    sft_lr: float = 1e-3
    sft_batch: int = 64
    sft_max_steps: int = 3000
    target_acc: float = 0.5  # stop the warm start when sampled accuracy reaches this
    probe_prompts: int = 256
    eval_every: int = 25
    seed: int = 0
    build_threads: int = BUILD_THREADS  # torch threads of the warm start (and the perfectible set)
    # > 0: a top-k mixture of experts in every layer (Mixtral layout; suite/numerics/moe.py)
    experts: int = 0
    top_k: int = 2  # experts per token


@contextlib.contextmanager
def torch_threads(n: int):
    """Run the block with ``n`` torch threads, then restore the caller's count."""
    old = torch.get_num_threads()
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(old)


# The checkout's cache, which the main job fills (scripts/main.sh sets $SUITE_CACHE to it, so a
# fresh clone rebuilds everything it reports); an installed package's parent folder (site-packages)
# has none.
CHECKOUT_CACHE = Path(__file__).resolve().parents[2] / ".cache"


def cache_root(checkout_cache: Path = CHECKOUT_CACHE) -> Path:
    """Where built policies and datasets live: ``$SUITE_CACHE``; else the checkout's ``.cache`` once
    the main job has built policies there, so that the next command (``suite mismatch`` after
    ``scripts/main.sh``) reuses them instead of building the same policy again; else the user's
    cache directory (``$XDG_CACHE_HOME/lowprec-rl-suite``, by default
    ``~/.cache/lowprec-rl-suite``), so an installed package never writes next to its own files."""
    env = os.environ.get("SUITE_CACHE")
    if env:
        return Path(env)
    if (checkout_cache / "policies").is_dir():
        return checkout_cache
    xdg = os.environ.get("XDG_CACHE_HOME")
    return (Path(xdg) if xdg else Path.home() / ".cache") / "lowprec-rl-suite"


def build_tokenizer(alphabet: str, chat: bool = False, max_len: int | None = None):
    """A character-level ``PreTrainedTokenizerFast``: one token per character, BOS prepended
    (and a chat template when ``chat``); ``max_len`` is its model_max_length (default 4096 /
    256)."""
    from tokenizers import (
        Regex,
        Tokenizer,
        decoders,
        models,
        pre_tokenizers,
        processors,
    )
    from transformers import PreTrainedTokenizerFast

    vocab = {tok: i for i, tok in enumerate(SPECIALS + list(alphabet))}
    tk = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<pad>"))
    tk.pre_tokenizer = pre_tokenizers.Split(Regex("."), behavior="isolated")
    tk.decoder = decoders.Fuse()
    tk.post_processor = processors.TemplateProcessing(single="<bos> $A",
                                                      special_tokens=[("<bos>", BOS)])
    tok = PreTrainedTokenizerFast(
        tokenizer_object=tk, bos_token="<bos>", eos_token="<eos>", pad_token="<pad>",
        unk_token="<pad>", model_max_length=max_len or (4096 if chat else 256), padding_side="left",
    )
    if chat:
        tok.chat_template = CHAT_TEMPLATE
    return tok


def build_word_tokenizer(words: list[str], max_len: int = 256):
    """A word-level ``PreTrainedTokenizerFast`` for a task that lists its own ``vocab`` (whole
    words, e.g. numbers, one token each; suite/tasks/category.py): text splits on whitespace,
    decodes with one space between words, and keeps build_tokenizer's specials (PAD, BOS, EOS = 0,
    1, 2), BOS prepended, left padding."""
    from tokenizers import Tokenizer, models, pre_tokenizers, processors
    from transformers import PreTrainedTokenizerFast

    vocab = {tok: i for i, tok in enumerate(SPECIALS + list(words))}
    if len(vocab) != len(SPECIALS) + len(words):
        raise ValueError("word tokenizer: the vocabulary has duplicate words or special tokens")
    tk = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<pad>"))
    # no decoder: tokenizers joins decoded words with spaces
    tk.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tk.post_processor = processors.TemplateProcessing(single="<bos> $A",
                                                      special_tokens=[("<bos>", BOS)])
    return PreTrainedTokenizerFast(
        tokenizer_object=tk, bos_token="<bos>", eos_token="<eos>", pad_token="<pad>",
        unk_token="<pad>", model_max_length=max_len, padding_side="left",
    )


def build_model(spec: PolicySpec, vocab_size: int, max_len: int = 128):
    from transformers import LlamaConfig, LlamaForCausalLM

    if spec.experts:
        return _build_moe(spec, vocab_size, max_len)

    config = LlamaConfig(
        vocab_size=vocab_size, hidden_size=spec.hidden, intermediate_size=spec.mlp,
        num_hidden_layers=spec.layers, num_attention_heads=spec.heads,
        num_key_value_heads=spec.kv_heads, max_position_embeddings=max_len, rms_norm_eps=1e-6,
        rope_theta=10000.0, tie_word_embeddings=False, bos_token_id=BOS, eos_token_id=EOS,
        pad_token_id=PAD, torch_dtype="float32",
    )
    torch.manual_seed(spec.seed)
    return LlamaForCausalLM(config).float()


def max_positions(task) -> int:
    """max_position_embeddings of a generated task's policy: 128, what every policy was built with
    before the long H2 tasks (so those builds are unchanged), or the next power of two above the
    task's prompt + response budget (``task.context``: 205 for arith16, 397 for arith32). The
    built-in engine would run past 128 anyway (it computes its rotary tables per call), but vLLM
    sizes ``max_model_len`` and lm-eval truncates contexts by this number, so it must be true."""
    need = int(getattr(task, "context", 0))
    return max(128, 1 << max(need - 1, 0).bit_length())


def _build_moe(spec: PolicySpec, vocab_size: int, max_len: int):
    """The mixture-of-experts variant (hypothesis H4): the dense policy's attention, norms and
    rotary, and in every layer ``experts`` SwiGLU experts of width ``mlp`` with a top-``top_k``
    router (Mixtral's layout in transformers)."""
    from transformers import MixtralConfig, MixtralForCausalLM

    config = MixtralConfig(
        vocab_size=vocab_size, hidden_size=spec.hidden, intermediate_size=spec.mlp,
        num_hidden_layers=spec.layers, num_attention_heads=spec.heads,
        num_key_value_heads=spec.kv_heads, num_local_experts=spec.experts,
        num_experts_per_tok=spec.top_k, router_jitter_noise=0.0, max_position_embeddings=max_len,
        rms_norm_eps=1e-6, rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
        tie_word_embeddings=False, bos_token_id=BOS, eos_token_id=EOS, pad_token_id=PAD,
        torch_dtype="float32",
    )
    torch.manual_seed(spec.seed)
    return MixtralForCausalLM(config).float()


def policy_key(spec: PolicySpec, task) -> str:
    fields = asdict(spec)
    # dense policies keep the keys they had before the MoE fields existed (cached builds)
    if not spec.experts:
        fields.pop("experts"), fields.pop("top_k")
    blob = json.dumps({"spec": fields, "task": task.name, "task_version": task.version},
                      sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()[:12]


def encode_pairs(tok, prompts: list[str],
                 responses: list[str]) -> tuple[torch.Tensor, torch.Tensor]:
    """Token ids of prompt+response+EOS (right padded) and a loss mask on response tokens."""
    rows, masks = [], []
    # one batched call each (the same ids as one call per string: no padding, no truncation); a
    # call per string was most of the warm start's Python time
    p_ids = tok(list(prompts))["input_ids"]
    r_ids = tok(list(responses), add_special_tokens=False)["input_ids"]
    for pi, r in zip(p_ids, r_ids):
        ri = r + [EOS]
        rows.append(pi + ri)
        masks.append([0] * len(pi) + [1] * len(ri))
    width = max(map(len, rows))
    ids = torch.tensor([r + [PAD] * (width - len(r)) for r in rows])
    mask = torch.tensor([m + [0] * (width - len(m)) for m in masks], dtype=torch.float32)
    return ids, mask


def sampled_accuracy(model, tok, task, items, max_new_tokens: int, seed: int) -> float:
    """Mean reward of one temperature-1 sample per prompt, drawn with the fp32 built-in engine."""
    from suite.numerics.engine import TorchEngine
    from suite.tasks.registry import prompt_ids

    engine = TorchEngine(model.config, torch.float32)
    engine.sync(model.state_dict())
    gen = torch.Generator().manual_seed(seed)
    roll = engine.generate([prompt_ids(tok, it) for it in items], max_new_tokens, 1.0, 1.0, gen)
    texts = tok.batch_decode(roll.response_ids(), skip_special_tokens=True)
    return sum(task.reward(it, t, tr)
               for it, t, tr in zip(items, texts, roll.truncated)) / len(items)


@contextlib.contextmanager
def building(out: Path, done: str):
    """Whether this process must build the cache entry ``out`` (its file ``done`` is missing),
    with one builder per entry across processes: those that find it missing while another builds
    it (the cells of a sweep, parallel test workers) wait for that build and then read it, rather
    than build it again and replace it under a reader. The lock is held while the caller builds."""
    from filelock import FileLock

    if (out / done).exists():
        yield False
        return
    locks = cache_root() / "locks"
    locks.mkdir(parents=True, exist_ok=True)
    with FileLock(locks / f"{out.parent.name}-{out.name}.lock"):
        yield not (out / done).exists()  # else built by the process this one waited for


def ensure_policy(spec: PolicySpec, task, console: Console | None = None) -> Path:
    """Return the directory of the warm-started policy, building and caching it if needed."""
    out = cache_root() / "policies" / f"{task.name}-{policy_key(spec, task)}"
    with building(out, "build.json") as todo, torch_threads(spec.build_threads):
        return _build_policy(spec, task, out, console or Console(stderr=True)) if todo else out


def _build_policy(spec: PolicySpec, task, out: Path, console: Console) -> Path:
    # a dataset task: an untrained stand-in, no warm start
    if not hasattr(task, "alphabet") and not hasattr(task, "vocab"):
        return _save(out,
                     build_model(spec, len(build_tokenizer(TEXT_ALPHABET, chat=True)),
                                 max_len=4096), build_tokenizer(TEXT_ALPHABET, chat=True), task,
                     spec, steps=0, acc=None, t0=time.time(), console=console,
                     note="untrained stand-in (dataset task: no warm start)")
    # a function of the task and its version, so the cache key covers it
    n_pos = max_positions(task)
    # A task may list whole-word tokens (``vocab``, thousands of them: hypothesis H3) instead of an
    # alphabet.
    tok = (build_word_tokenizer(task.vocab, max(256, n_pos)) if hasattr(task, "vocab")
           else build_tokenizer(task.alphabet, max_len=max(256, n_pos)))
    model = build_model(spec, vocab_size=len(tok), max_len=n_pos)
    max_new = len(task.trace(task.split("train", 1)[0])) + 8
    # Probe prompts come from the held-out split so the warm start never sees them as training data.
    probe = task.split("test", spec.probe_prompts)
    train = task.split("train")
    opt = torch.optim.AdamW(model.parameters(), lr=spec.sft_lr, weight_decay=0.0)
    gen = torch.Generator().manual_seed(spec.seed)
    # A task with many valid answers (``sample_trace``) gives a fresh one each time an item is
    # drawn, so the warm start learns their spread, not one answer; from a stream of its own, so the
    # build stays seeded and the tasks without it draw exactly what they drew before.
    draw, trace_rng = getattr(task, "sample_trace", None), random.Random(spec.seed)
    t0, acc, step = time.time(), 0.0, 0
    with console.status("warm start") as status:
        for step in range(1, spec.sft_max_steps + 1):
            idx = torch.randint(len(train), (spec.sft_batch,), generator=gen).tolist()
            batch = [train[i] for i in idx]
            ids, mask = encode_pairs(tok, [b.prompt for b in batch],
                                     [draw(b, trace_rng) if draw else task.trace(b) for b in batch])
            logits = model(input_ids=ids).logits[:, :-1].float()
            nll = torch.nn.functional.cross_entropy(logits.transpose(1, 2), ids[:, 1:],
                                                    reduction="none")
            loss = (nll * mask[:, 1:]).sum() / mask[:, 1:].sum()
            opt.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
            if step % spec.eval_every == 0:
                acc = sampled_accuracy(model, tok, task, probe, max_new, seed=spec.seed + step)
                msg = f"warm start: step {step}, loss {loss.item():.3f}, sampled accuracy {acc:.2f}"
                status.update(msg)
                if not console.is_terminal:
                    console.print(msg)
                if acc >= spec.target_acc:
                    break
    if acc < spec.target_acc:
        raise RuntimeError(f"warm start reached only {acc:.2f} sampled accuracy in {step} steps "
                           f"(target {spec.target_acc})")
    return _save(out, model, tok, task, spec, step, acc, t0, console)


def _save(out: Path, model, tok, task, spec: PolicySpec, steps: int, acc: float | None, t0: float,
          console: Console, note: str = "warm-started") -> Path:
    build = {"spec": asdict(spec), "task": task.name, "task_version": task.version,
             "sft_steps": steps, "sampled_accuracy": acc,
             "build_seconds": round(time.time() - t0, 1), "note": note,
             "params": sum(p.numel() for p in model.parameters())}
    # Build in a temporary directory and rename, so a killed build never leaves a half-written
    # policy.
    tmp = out.with_name(out.name + f".tmp{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    model.save_pretrained(tmp)
    tok.save_pretrained(tmp)
    (tmp / "build.json").write_text(json.dumps(build, indent=2))
    out.parent.mkdir(parents=True, exist_ok=True)
    shutil.rmtree(out, ignore_errors=True)
    os.replace(tmp, out)
    console.print(f"built policy {out.name}: {build['params']:,} parameters, {note}, {steps} "
                  f"warm-start steps, sampled accuracy {acc if acc is None else round(acc, 2)}, "
                  f"{build['build_seconds']} s")
    return out


def load_policy(path: Path):
    """Load a saved policy (embedded or any HF causal LM directory) in fp32 with its tokenizer."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(path, torch_dtype=torch.float32)
    tok = AutoTokenizer.from_pretrained(path)
    return model, tok
