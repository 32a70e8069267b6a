"""``suite plan``: a run config's memory plan per rank, and the check ``suite run`` makes before any
compute.

The arithmetic is suite/numerics/memory.py's; this module reads the model's dimensions (the embedded
policy from ``policy.*``, a preset from suite/rl/models.py, a directory from its config.json), the
run's shapes from the config, and the device's memory (a GPU's ``total_memory``, or the machine's
RAM from /proc/meminfo, shared by the ranks of a node). A run whose predicted peak exceeds the
device is refused with the knobs that would make it fit; ``plan.check=false`` skips the check (the
plan is an estimate).
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

from suite.numerics import memory
from suite.numerics.memory import GIB, Arch, Plan, Shape, gib

# a dataset task without a hint: Precision-RL's and verl's usual max prompt length
DEFAULT_PROMPT = 1024


@dataclasses.dataclass(frozen=True)
class Device:
    kind: str  # cuda or cpu
    bytes: int  # memory of one device (a GPU), or of the machine (CPU)
    name: str

    def budget(self, ranks_per_node: int) -> int:
        """Bytes one rank may use: a GPU each, or an equal share of the machine's RAM."""
        return self.bytes if self.kind == "cuda" else self.bytes // ranks_per_node


def this_device(local_rank: int = 0) -> Device:
    import torch

    if torch.cuda.is_available():
        p = torch.cuda.get_device_properties(local_rank)
        return Device("cuda", p.total_memory, p.name)
    return Device("cpu", _mem_total(), "this machine's RAM")


def _mem_total() -> int:
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemTotal:"):
            return int(line.split()[1]) * 1024
    raise ValueError("plan: no MemTotal in /proc/meminfo")


# What torch.cuda.get_device_properties(0).total_memory reports on an 80 GB H100 (HBM3, SXM): 79.1
# GiB, as in PyTorch's out-of-memory message "GPU 0 has a total capacity of 79.10 GiB" (the rest of
# the 80 GB is the ECC and firmware reservation).
H100_GIB = 79.1


def gpu(gib_: float) -> Device:
    """A GPU of ``gib_`` GiB (planning for a machine this is not)."""
    return Device("cuda", int(gib_ * GIB), f"a {gib_:g} GiB GPU")


# ---- the config's model and shapes --------------------------------------------------------------
def arch_from_json(c: dict, qk_norm: bool | None = None) -> Arch:
    """config.json (or a preset's copy of it) -> Arch."""
    heads = c.get("num_attention_heads", 1)
    experts = c.get("num_local_experts", 0) or 0
    return Arch(layers=c["num_hidden_layers"], hidden=c["hidden_size"], heads=heads,
                kv_heads=c.get("num_key_value_heads", heads),
                mlp=c.get("intermediate_size", 4 * c["hidden_size"]), vocab=c["vocab_size"],
                head_dim=c.get("head_dim") or 0, tied=bool(c.get("tie_word_embeddings", False)),
                qk_norm=bool(qk_norm if qk_norm is not None
                             else "qwen3" in str(c.get("model_type", ""))),
                qkv_bias=bool(c.get("attention_bias", c.get("model_type") == "qwen2")),
                experts=experts, top_k=c.get("num_experts_per_tok", 0) if experts else 0)


def arch(cfg) -> Arch:
    """The dimensions of the model a run trains (no weights read, nothing downloaded)."""
    from suite.rl import models

    if cfg.policy.path or models.is_path(cfg.model):
        path = Path(cfg.policy.path or cfg.model).expanduser() / "config.json"
        return arch_from_json(json.loads(path.read_text()))
    if cfg.model in models.PRESETS:
        p = models.PRESETS[cfg.model]
        return arch_from_json({"num_hidden_layers": p.layers, "hidden_size": p.hidden, **p.config},
                              qk_norm=p.arch.startswith("Qwen3"))
    pol = cfg.policy
    return Arch(layers=pol.layers, hidden=pol.hidden, heads=pol.heads, kv_heads=pol.kv_heads,
                mlp=pol.mlp, vocab=_embedded_vocab(cfg.task, cfg.include_path), experts=pol.experts,
                top_k=pol.top_k if pol.experts else 0)


def _embedded_vocab(task_name: str, include: str | None = None) -> int:
    """The embedded tokenizer's size (suite/rl/policy.py): specials + the task's characters or
    words, or the printable-ASCII stand-in of a dataset task."""
    from suite.rl.policy import SPECIALS, TEXT_ALPHABET
    from suite.tasks.registry import get_task, task_spec

    spec = task_spec(task_name, include)
    if spec.get("splits"):  # a dataset task (no rows read)
        return len(SPECIALS) + len(TEXT_ALPHABET)
    task = get_task(task_name, include=include)
    return len(SPECIALS) + len(getattr(task, "vocab", None) or task.alphabet)


def prompt_tokens(cfg) -> int:
    """The longest prompt the plan pads to (``plan.prompt_tokens``'s docstring says the order)."""
    from suite.tasks.registry import get_task, task_spec

    if cfg.plan.prompt_tokens:
        return cfg.plan.prompt_tokens
    spec = task_spec(cfg.task, cfg.include_path)  # a task of the user's own folder too
    hint = (spec.get("sampling") or {}).get("max_prompt_tokens")
    if hint:
        return int(hint)
    # generated: every prompt has the same length, context minus the default budget
    if not spec.get("splits"):
        task = get_task(cfg.task, include=cfg.include_path)
        budget = (spec.get("sampling")
                  or {}).get("max_new_tokens") or len(task.trace(task.split("train", 1)[0])) + 8
        return task.context - int(budget)
    if cfg.vllm.max_model_len:
        return max(cfg.vllm.max_model_len - cfg.sampling.max_new_tokens, 1)
    return DEFAULT_PROMPT


def shape(cfg, device: Device, world: int | None = None) -> Shape:
    from suite.numerics.engine import TorchEngine
    from suite.numerics.precision import gemm_backend, resolve

    flow, world = resolve(cfg.precision), world or cfg.nproc * cfg.nnodes
    dev = "cpu" if device.kind == "cpu" else "cuda"
    per_rank = cfg.prompts_per_step * cfg.samples_per_prompt // cfg.updates_per_step // world
    tdt, sdt = flow.trainer_dtype, flow.sampler_dtype
    tp = cfg.vllm.tensor_parallel_size if cfg.engine == "vllm" and world > 1 else 1
    rollouts = cfg.prompts_per_step // (world // tp) * cfg.samples_per_prompt
    a = arch(cfg)
    sampler_bytes = 1.0 if flow.sampler_quant else sdt.itemsize
    if cfg.engine == "vllm":
        weights = int(a.params * sampler_bytes)
        if device.kind == "cuda" and cfg.vllm.kv_cache_gib is None:
            vllm = int(cfg.vllm.gpu_memory_fraction * device.bytes)
        else:
            vllm = weights + int((cfg.vllm.kv_cache_gib or 1.0) * GIB)
    else:
        vllm = 0
    return Shape(world=world, micro_batch=min(cfg.micro_batch or per_rank, per_rank),
                 update_rows=per_rank, defer_grad_sync=cfg.defer_grad_sync,
                 prompt=prompt_tokens(cfg), response=cfg.sampling.max_new_tokens,
                 checkpointing=cfg.gradient_checkpointing, logprob_chunk=cfg.logprob_chunk,
                 compute=tdt.itemsize, emulated=tdt.itemsize < 4
                 and gemm_backend(cfg.gemm, tdt, dev) == "emulated",
                 logits=4 if cfg.lm_head_fp32 else 0, kl_reference=bool(cfg.algo.kl_coef),
                 sampler=cfg.engine, sampler_bytes=sampler_bytes, sampler_act=sdt.itemsize,
                 sampler_emulated=sdt.itemsize < 4
                 and gemm_backend(cfg.gemm, sdt, dev) == "emulated",
                 gen_batch=max(rollouts, TorchEngine.max_batch if cfg.eval.every else 0),
                 vllm_bytes=vllm, vllm_asleep=cfg.engine == "vllm" and cfg.vllm.enable_sleep_mode,
                 packing=cfg.packing)


def for_config(cfg, device: Device, world: int | None = None) -> tuple[Arch, Shape, Plan]:
    a, s = arch(cfg), shape(cfg, device, world)
    return a, s, memory.plan(a, s)


# ---- what would make it fit ---------------------------------------------------------------------
def fixes(a: Arch, s: Shape, device: Device, budget: int) -> list[str]:
    """The knobs (one at a time, then all the trainer's together) whose plan fits ``budget``, with
    its peak."""
    out, R = [], s.response
    tries = []
    if s.deferred_sync:
        tries.append(("defer_grad_sync=false", dataclasses.replace(s, defer_grad_sync=False)))
    if s.micro_batch > 1:
        tries.append(("micro_batch=1", dataclasses.replace(s, micro_batch=1)))
    if not s.checkpointing:
        tries.append(("gradient_checkpointing=true", dataclasses.replace(s, checkpointing=True)))
    for chunk in (1024, 256):
        if not 0 < s.logprob_chunk <= chunk and chunk < R:
            tries.append((f"logprob_chunk={chunk}", dataclasses.replace(s, logprob_chunk=chunk)))
    for more in (2, 4, 8):
        tries.append((f"nproc x nnodes = {s.world * more}",
                      dataclasses.replace(s, world=s.world * more)))
    trainer = dataclasses.replace(s, micro_batch=1, checkpointing=True, defer_grad_sync=False,
                                  logprob_chunk=min(s.logprob_chunk or 256, 256) if R > 256 else 0)
    tries.append(
        ("micro_batch=1 gradient_checkpointing=true"
         + (f" logprob_chunk={trainer.logprob_chunk}" if trainer.logprob_chunk else "")
         + (" defer_grad_sync=false" if s.defer_grad_sync else ""), trainer))
    for label, t in tries:
        p = memory.plan(a, t).peak
        if p <= budget:
            out.append(f"{label} ({gib(p)} GiB)")
    # the share of the device vLLM may take and still leave room
    if s.sampler == "vllm" and device.kind == "cuda":
        rest = memory.plan(a, dataclasses.replace(s, vllm_bytes=0)).peak
        frac = (budget - rest) / device.bytes
        if frac >= 0.05:
            out.append(f"vllm.gpu_memory_fraction={int(frac * 100) / 100:g} or less")
        awake = memory.plan(a, dataclasses.replace(s, vllm_asleep=True)).peak
        if not s.vllm_asleep and awake <= budget:
            out.append(f"vllm.enable_sleep_mode=true ({gib(awake)} GiB)")
    return out


def check(cfg, device: Device | None = None, world: int | None = None,
          ranks_per_node: int | None = None) -> Plan:
    """Refuse (ValueError), before any compute, a config whose plan exceeds this rank's memory."""
    device = device or this_device()
    a, s, p = for_config(cfg, device, world)
    budget = device.budget(ranks_per_node or cfg.nproc)
    if cfg.plan.check and p.peak > budget:
        fit = fixes(a, s, device, budget)
        largest = ", ".join(f"{i.name} {gib(i.bytes)}"
                            for i in sorted(p.items(), key=lambda i: -i.bytes)[:3])
        raise ValueError(
            f"memory plan: {gib(p.peak)} GiB per rank at the {p.peak_moment} > {gib(budget)} GiB "
            f"({device.name}"
            + (f", shared by {ranks_per_node or cfg.nproc} ranks" if device.kind == "cpu"
               and (ranks_per_node or cfg.nproc) > 1 else "")
            + f"); largest items: {largest}. "
            + (f"It fits with: {'; '.join(fit)}. " if fit
               else "No single knob makes it fit: reduce sampling.max_new_tokens "
                    "or use a smaller model. ")
            + "The knobs: micro_batch, gradient_checkpointing, logprob_chunk, defer_grad_sync, "
            "vllm.gpu_memory_fraction, vllm.enable_sleep_mode, nproc. "
            "`suite plan` with the same arguments prints every item; plan.check=false runs anyway "
            "(the plan is an estimate).")
    return p


# ---- suite plan
# -----------------------------------------------------------------------------------
def table(p: Plan, a: Arch, s: Shape, device: Device, budget: int, title: str):
    from rich.table import Table

    t = Table("item", "GiB", "what", title=title)
    for i in p.items():
        t.add_row(i.name, gib(i.bytes), i.note)
    t.add_section()
    t.add_row("[bold]peak per rank", f"[bold]{gib(p.peak)}", f"at the {p.peak_moment}")
    t.add_row("device", gib(budget), device.name
              + ("" if p.peak <= budget else "  [bold red]does not fit"))
    for k, v in p.totals.items():
        if k != p.peak_moment:
            t.add_row(f"  ({k})", gib(v), "")
    return t


def _load_as_on_gpu(args: list[str]):
    """The config validated as on the GPU machine a plan is made for (vLLM's sleep mode is refused
    on CPU)."""
    from unittest import mock

    from suite.numerics import vllm_support
    from suite.rl import config

    with mock.patch.object(vllm_support, "device", lambda: "cuda"):
        return config.load(args)


def cmd_plan(args: list[str]) -> int:
    """suite plan [key=value ...] [gpu_gib=G] (suite/cli.py says what it prints)."""
    from suite.console import make_console
    from suite.rl import config

    device = None
    for a in [a for a in args if a.startswith("gpu_gib=")]:
        try:
            device = gpu(float(a.split("=", 1)[1]))
        except ValueError:
            raise ValueError("gpu_gib: the GPU's memory in GiB (an 80 GB H100: "
                             f"gpu_gib={H100_GIB}), got {a!r}") from None
        args = [x for x in args if x != a]
    cfg = config.load(args) if device is None else _load_as_on_gpu(args)
    device = device or this_device()
    a, s, p = for_config(cfg, device)
    budget = device.budget(cfg.nproc)
    title = (f"{cfg.task} tier={cfg.tier} model={cfg.model} precision={cfg.precision} "
             f"engine={cfg.engine}: {a.params / 1e9:.3g}B parameters, {s.world} rank(s), "
             f"micro-batch {s.micro_batch} x ({s.prompt} + {s.response}) tokens, checkpointing "
             f"{'on' if s.checkpointing else 'off'}, logprob_chunk {s.logprob_chunk}"
             + (", packed (one row per micro-batch)" if s.packing else ""))
    console = make_console()
    console.print(table(p, a, s, device, budget, title))
    if p.peak > budget:
        fit = fixes(a, s, device, budget)
        console.print("fits with: " + ("; ".join(fit) if fit else "no single knob"),
                      highlight=False)
        return 1
    return 0


def check_rank(cfg) -> Plan | None:
    """``check`` for this process: under torchrun or srun (suite/dist.py) the launcher's world and
    this rank's device; one plain process otherwise."""
    from suite import dist

    launched = dist.from_env()
    try:
        return check(cfg, this_device(launched["local_rank"] if launched else 0), world=launched
                     and launched["size"],
                     ranks_per_node=launched and launched["local_size"])
    # no model to plan (a policy.path that does not exist): the run says so, recorded in
    except FileNotFoundError:
        # its summary.json, instead of a plan failing before the run directory exists
        return None


def markdown(overrides: list[str], gib_: float = H100_GIB) -> str:
    """The plan of a config on 1 and 8 GPUs of ``gib_`` GiB as a markdown table, items of each peak
    moment (the ``plan`` figure of docs/tasks.md, suite/experiments/docfigures.py)."""
    device, cols = gpu(gib_), []
    for n in (1, 8):
        cfg = _load_as_on_gpu([*overrides, f"nproc={n}"])
        cols.append(for_config(cfg, device)[2])
    names = list(dict.fromkeys(i.name for p in cols for i in p.items()))
    lines = [f"| GiB per rank ({cfg.precision}) | 1 x {gib_:g} GiB GPU | 8 x {gib_:g} GiB GPUs "
             "(FSDP2) |", "|---|---:|---:|"]
    for name in names:
        cells = [next((gib(i.bytes) for i in p.items() if i.name == name), "-") for p in cols]
        lines.append(f"| {name} | {' | '.join(cells)} |")
    lines.append(f"| **peak** | **{gib(cols[0].peak)}** ({cols[0].peak_moment}) | "
                 f"**{gib(cols[1].peak)}** ({cols[1].peak_moment}) |")
    return "\n".join(lines)
