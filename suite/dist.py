"""torch.distributed glue: one run over several ranks (torchrun, Slurm), nothing home-made.

A run is data parallel (docs/distributed.md): every rank samples its share of the step's prompt
groups with its own sampler, the rollouts are all-gathered so that every logged number is the
global one, and the trainer is one FSDP2 model (``fully_shard``) whose gradients are summed over
ranks. The world comes from the launcher's environment:

- **torchrun** (``torch.distributed.run``; ``suite run nproc=N`` starts it itself): RANK,
  WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, GROUP_RANK, MASTER_ADDR/PORT;
- **Slurm** (``srun``, or Hydra's submitit launcher with ``tasks_per_node``): SLURM_PROCID,
  SLURM_NTASKS, SLURM_LOCALID, SLURM_NNODES, SLURM_NODEID; the master is the first host of the
  job's node list and the port is derived from the job id (what submitit's
  ``TorchDistributedEnvironment`` does).

Backend NCCL on GPUs, gloo on CPU, chosen from the device; each rank computes on
``cuda:<local rank>`` on a GPU host, on the CPU otherwise. Without any of those variables a run is
one process with no process group at all (today's single-process path, bit for bit).
"""

from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import dataclass

import torch
import torch.distributed as tdist


@dataclass(frozen=True)
class World:
    """Where this process sits: rank, world size, node, device, backend (None: no process group)."""

    rank: int = 0
    size: int = 1
    local_rank: int = 0
    local_size: int = 1
    nodes: int = 1
    launcher: str = "none"  # none | torchrun | slurm
    backend: str | None = None
    device: str = "cpu"

    @property
    def main(self) -> bool:
        """Rank 0 writes the run bundle; the other ranks compute and write nothing."""
        return self.rank == 0

    @property
    def distributed(self) -> bool:
        return self.backend is not None

    def describe(self) -> dict:
        """Recorded in env.json."""
        devices = (torch.cuda.get_device_name(torch.device(self.device)) if self.device.startswith("cuda")
                   else "cpu")
        return {"world_size": self.size, "nodes": self.nodes, "ranks_per_node": self.local_size,
                "launcher": self.launcher, "backend": self.backend, "device": self.device, "device_name": devices}


def from_env(env=None) -> dict | None:
    """The world the launcher made (torchrun first, then Slurm tasks), or None for one plain process.

    Slurm counts only inside a job step (``srun``, which sets SLURM_STEP_ID; SLURM_STEPID on old
    versions): the batch shell of ``sbatch --ntasks=8`` carries SLURM_NTASKS=8 and SLURM_PROCID=0
    too, but it is one process, and taking it for rank 0 of 8 would wait forever for the other
    seven. The step's own counts (SLURM_STEP_NUM_TASKS/NODES) win over the job's, since a step may
    use part of the allocation. An ``srun`` of one task is one process, not a world of one.
    """
    env = os.environ if env is None else env
    if "RANK" in env and "WORLD_SIZE" in env:
        size = int(env["WORLD_SIZE"])
        local = int(env.get("LOCAL_WORLD_SIZE", size))
        return {"rank": int(env["RANK"]), "size": size, "local_rank": int(env.get("LOCAL_RANK", 0)),
                "local_size": local, "nodes": max(1, size // max(local, 1)), "launcher": "torchrun"}
    in_step = "SLURM_STEP_ID" in env or "SLURM_STEPID" in env
    size = int(env.get("SLURM_STEP_NUM_TASKS", env.get("SLURM_NTASKS", "1")))
    if in_step and size > 1 and "SLURM_PROCID" in env:
        nodes = int(env.get("SLURM_STEP_NUM_NODES", env.get("SLURM_NNODES", "1")))
        return {"rank": int(env["SLURM_PROCID"]), "size": size, "local_rank": int(env.get("SLURM_LOCALID", 0)),
                "local_size": size // nodes, "nodes": nodes, "launcher": "slurm"}
    return None


def _slurm_rendezvous() -> None:
    """MASTER_ADDR/PORT for a Slurm job step launched without torchrun (first host, port from the job id)."""
    if "MASTER_ADDR" not in os.environ:
        hosts = subprocess.run(["scontrol", "show", "hostnames", os.environ["SLURM_JOB_NODELIST"]],
                               capture_output=True, text=True, check=True).stdout.split()
        os.environ["MASTER_ADDR"] = hosts[0]
    os.environ.setdefault("MASTER_PORT", str(20000 + int(os.environ.get("SLURM_JOB_ID", "0")) % 20000))


def device_for(local_rank: int) -> str:
    """``cuda:<local rank>`` on a GPU host, the CPU otherwise."""
    return f"cuda:{local_rank}" if torch.cuda.is_available() else "cpu"


def init(nproc: int = 1, nnodes: int = 1) -> World:
    """Join the launcher's process group (if any) and return this process's World.

    ``nproc``/``nnodes`` are the config's; when a launcher made the world they must agree with it
    (a default ``nproc=1`` under a user's torchrun takes the launcher's world).
    """
    w = from_env()
    if w is None:
        if nproc * nnodes > 1:
            raise RuntimeError(f"nproc={nproc} nnodes={nnodes}: this process was not started by torchrun or srun; "
                               "`suite run nproc=N` starts torchrun itself on one node (docs/distributed.md)")
        return World(device=device_for(0))
    if (nproc, nnodes) != (1, 1) and (w["local_size"], w["nodes"]) != (nproc, nnodes):
        raise ValueError(f"nproc={nproc} nnodes={nnodes}, but the launcher started {w['local_size']} ranks per node "
                         f"on {w['nodes']} node(s); drop nproc/nnodes or make them agree")
    device = device_for(w["local_rank"])
    backend = "nccl" if device.startswith("cuda") else "gloo"
    if w["launcher"] == "slurm":
        _slurm_rendezvous()
        os.environ.update(RANK=str(w["rank"]), WORLD_SIZE=str(w["size"]), LOCAL_RANK=str(w["local_rank"]))
    if device.startswith("cuda"):
        torch.cuda.set_device(torch.device(device))
    if not tdist.is_initialized():
        tdist.init_process_group(backend, rank=w["rank"], world_size=w["size"],
                                 device_id=torch.device(device) if device.startswith("cuda") else None)
    return World(backend=backend, device=device, **w)


def close(world: World) -> None:
    if world.distributed and tdist.is_initialized():
        tdist.destroy_process_group()


def check_ranks(nproc: int, nnodes: int) -> None:
    """Refuse a world this machine cannot host, before any compute (GPU count on a GPU host)."""
    if torch.cuda.is_available() and nproc > torch.cuda.device_count():
        raise ValueError(f"nproc: {nproc} ranks per node, but this machine has {torch.cuda.device_count()} GPU(s)")
    if nproc * nnodes > 1 and not fsdp_sums():
        raise ValueError(f"nproc={nproc} nnodes={nnodes}: sharded training needs torch >= 2.8 (FSDP2's "
                         f"set_force_sum_reduction_for_comms, pytorch/pytorch#155915); this torch is {torch.__version__}")


def fsdp_sums() -> bool:
    """Whether FSDP2 can reduce gradients with a plain SUM. The trainer sums over ranks (its loss is already
    normalised by the global token count) and gloo has no PREMUL_SUM, so FSDP2 without the switch (torch < 2.8)
    cannot shard this trainer: found by the test suite under torch 2.6."""
    from torch.distributed.fsdp import FSDPModule

    return hasattr(FSDPModule, "set_force_sum_reduction_for_comms")


# ---- collectives (no-ops in a plain process) -------------------------------------------------
def gather_objects(obj, world: World) -> list:
    """Every rank's ``obj``, in rank order, on every rank (pickled; for rollouts and small dicts)."""
    if not world.distributed:
        return [obj]
    out = [None] * world.size
    tdist.all_gather_object(out, obj)
    return out


def all_reduce(t: torch.Tensor, world: World, op: str = "sum") -> torch.Tensor:
    """In-place all-reduce of a tensor on the world's device (sum, max or min); returns it."""
    if world.distributed:
        ops = {"sum": tdist.ReduceOp.SUM, "max": tdist.ReduceOp.MAX, "min": tdist.ReduceOp.MIN}
        moved = t.to(world.device)
        tdist.all_reduce(moved, op=ops[op])
        t.copy_(moved)
    return t


def any_rank(flag: bool, world: World) -> bool:
    """True on every rank when ``flag`` is True on any rank (the sharded grad scaler's inf check)."""
    return bool(all_reduce(torch.tensor([float(flag)]), world, "max").item() > 0)


def barrier(world: World) -> None:
    if world.distributed:
        tdist.barrier()


def broadcast_object(obj, world: World):
    """Rank 0's ``obj`` on every rank."""
    if not world.distributed:
        return obj
    box = [obj]
    tdist.broadcast_object_list(box, src=0)
    return box[0]


# ---- launch ----------------------------------------------------------------------------------
def launch(argv: list[str], nproc: int, nnodes: int) -> int:
    """Re-run ``suite <argv>`` as ``nproc`` ranks through torchrun on this node; return its exit code.

    One node only: a launcher cannot start processes on other machines, so a multi-node run is
    started on every node by torchrun or srun (docs/distributed.md gives both commands).
    """
    if nnodes > 1:
        raise ValueError(f"nnodes={nnodes}: start the run on every node yourself, e.g. `torchrun --nnodes={nnodes} "
                         f"--nproc_per_node={nproc} --rdzv-backend=c10d --rdzv-endpoint=HOST:29500 -m suite run ...` "
                         "or `srun --ntasks-per-node=... suite run ...` (docs/distributed.md)")
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={nproc}",
           "-m", "suite.cli", *argv]
    return subprocess.run(cmd).returncode
