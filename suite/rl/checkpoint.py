"""Checkpoints: torch.distributed.checkpoint (DCP) directories, complete or absent; HF export.

One format for every world size: ``ckpt/step_NNNNNN/`` is a DCP checkpoint of the model and
AdamW (each rank writes its own shards, rank 0 the metadata) plus ``trainer.json`` (step, loss
scaler, world size). It is written as ``ckpt/.step_NNNNNN.tmp/`` and renamed by rank 0 only after
every rank has finished; then ``ckpt/latest.json`` (atomic) points at it with a sha256 over its
files, and only then are older checkpoints deleted. A rank killed at any moment therefore leaves
either the previous complete checkpoint as the latest or the new one, never a half-written one.

Loading reshards: DCP reads each rank's slices by parameter name and offset, so a run saved with
N ranks resumes with M (or in one plain process), and ``model_state`` reads a checkpoint into an
ordinary state dict (for ``suite transfer``). ``export_hf`` writes the final policy as an HF
``save_pretrained`` directory (rank 0 gathers the full weights) that transformers, vLLM and
lm-eval load like any hub checkpoint.
"""

from __future__ import annotations

import copy
import hashlib
import inspect
import json
import os
import re
import shutil
from pathlib import Path

import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    get_state_dict,
    set_state_dict,
)

from suite import dist
from suite.results import atomic_write_json


class CorruptCheckpoint(RuntimeError):
    """A checkpoint failed its checksum or could not be read."""


def _digest(path: Path) -> str:
    """sha256 over the names and bytes of every file of a checkpoint directory."""
    h = hashlib.sha256()
    for f in sorted(p for p in path.rglob("*") if p.is_file()):
        h.update(str(f.relative_to(path)).encode() + b"\0")
        with open(f, "rb") as fh:
            for block in iter(lambda: fh.read(1 << 20), b""):
                h.update(block)
    return h.hexdigest()


def save(run_dir: Path, step: int, trainer, world: dist.World, keep_last: int = 1) -> None:
    """Collective: every rank writes its shards; rank 0 renames the complete directory and points
    latest at it, then deletes all but the ``keep_last`` newest complete checkpoints (and any
    leftover)."""
    ck = run_dir / "ckpt"
    name = f"step_{step:06d}"
    tmp = ck / f".{name}.tmp"
    if world.main:
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
    dist.barrier(world)
    model_sd, optim_sd = get_state_dict(trainer.model, trainer.opt)
    dcp.save({"model": model_sd, "optim": optim_sd}, checkpoint_id=str(tmp))
    dist.barrier(world)  # every rank's shards are on disk
    if world.main:
        (tmp / "trainer.json").write_text(json.dumps({"step": step,
                                                      "scaler": trainer.scaler.state_dict(),
                                                      "world_size": world.size}))
        digest = _digest(tmp)
        # a complete one from a run killed before latest.json moved
        shutil.rmtree(ck / name, ignore_errors=True)
        os.replace(tmp, ck / name)
        atomic_write_json(ck / "latest.json",
                          {"step": step, "file": name, "sha256": digest, "world_size": world.size})
        complete = sorted(p.name for p in ck.iterdir() if p.is_dir()
                          and re.fullmatch(r"step_\d{6}", p.name))
        keep = {name, *complete[-keep_last:], "latest.json"}
        for old in ck.iterdir():
            if old.name not in keep:
                shutil.rmtree(old) if old.is_dir() else old.unlink()
    dist.barrier(world)


def latest(run_dir: Path) -> tuple[Path, dict] | None:
    """(directory, latest.json) of the last complete checkpoint, checksum verified; None if there is
    none."""
    path = run_dir / "ckpt" / "latest.json"
    if not path.exists():
        return None
    meta = json.loads(path.read_text())
    ck = run_dir / "ckpt" / meta["file"]
    if not ck.is_dir() or _digest(ck) != meta["sha256"]:
        raise CorruptCheckpoint(f"checkpoint {ck} is corrupted or missing (sha256 mismatch); it "
                                f"was not loaded. Delete {run_dir / 'ckpt'} to restart this run "
                                "from scratch.")
    return ck, meta


def load(run_dir: Path, trainer, world: dist.World) -> int:
    """Restore the last complete checkpoint into the (sharded) trainer; return its step (0 if
    none)."""
    found = None
    if world.main:
        try:
            found = latest(run_dir)
        except CorruptCheckpoint as e:
            found = e
    found = dist.broadcast_object(found, world)
    if isinstance(found, CorruptCheckpoint):
        raise found
    if found is None:
        return 0
    ck, meta = found
    model_sd, optim_sd = get_state_dict(trainer.model, trainer.opt)
    state = {"model": model_sd, "optim": optim_sd}
    dcp.load(state, checkpoint_id=str(ck))  # reshards: each rank reads the slices it owns now
    set_state_dict(trainer.model, trainer.opt, model_state_dict=state["model"],
                   optim_state_dict=state["optim"])
    info = json.loads((ck / "trainer.json").read_text())
    trainer.scaler.load_state_dict(info["scaler"])
    return int(info["step"])


def model_state(run_dir: Path, model: torch.nn.Module) -> tuple[dict, dict]:
    """(state_dict, latest.json) of a run's last checkpoint, read into ``model``'s layout in one
    process."""
    found = latest(run_dir)
    if found is None:
        raise FileNotFoundError(f"{run_dir}: no checkpoint (ckpt/latest.json)")
    ck, meta = found
    state = {"model": {k: v.clone() for k, v in model.state_dict().items()}}
    # no_dist: read here even inside an initialised process group. torch 2.6's DCP has no such
    # argument and reads in one process when no group is initialised, as wherever this runs (suite
    # transfer, tests).
    one_process = {"no_dist": True} if "no_dist" in inspect.signature(dcp.load).parameters else {}
    dcp.load(state, checkpoint_id=str(ck), **one_process)
    return state["model"], meta


def export_hf(out: Path, trainer, tokenizer, world: dist.World) -> None:
    """The trainer's fp32 master weights as an HF ``save_pretrained`` directory (atomic; written by
    rank 0)."""
    full = get_model_state_dict(trainer.model,
                                options=StateDictOptions(full_state_dict=True, cpu_offload=True))
    if world.main:
        from transformers import AutoModelForCausalLM

        config = copy.deepcopy(trainer.model.config)
        # the emulation's attention is ours, not a name others know
        config._attn_implementation = "sdpa"
        model = AutoModelForCausalLM.from_config(config, torch_dtype=torch.float32)
        model.load_state_dict(full, strict=True)
        tmp = out.with_name(f".{out.name}.tmp")
        shutil.rmtree(tmp, ignore_errors=True)
        model.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        shutil.rmtree(out, ignore_errors=True)
        os.replace(tmp, out)
    dist.barrier(world)
