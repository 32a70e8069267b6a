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

No rank outlives its launcher or a lost peer by more than a stated bound (section "lifetime" below,
docs/distributed.md): torchrun's agent dies with ``suite run`` and each rank with the agent (or with
slurmstepd), by ``suite.lifetime``'s parent-death signal and watchdog thread, and every collective
has a timeout.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from dataclasses import dataclass, field
from datetime import timedelta

import torch
import torch.distributed as tdist

from suite import lifetime


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
    # One place decides where a process computes: the GPU of its local rank on a GPU host, else the
    # CPU. A tool that builds engines without a launcher's World (suite mismatch, attribute, gate,
    # bench) gets the same device a run does, never the CPU silently on a GPU machine.
    device: str = field(default_factory=lambda: device_for(0))

    @property
    def main(self) -> bool:
        """Rank 0 writes the run bundle; the other ranks compute and write nothing."""
        return self.rank == 0

    @property
    def distributed(self) -> bool:
        return self.backend is not None

    def describe(self) -> dict:
        """Recorded in env.json."""
        devices = (torch.cuda.get_device_name(torch.device(self.device))
                   if self.device.startswith("cuda")
                   else "cpu")
        return {"world_size": self.size, "nodes": self.nodes, "ranks_per_node": self.local_size,
                "launcher": self.launcher, "backend": self.backend, "device": self.device,
                "device_name": devices}


# ---- lifetime: how long a rank may outlive its launcher or a lost peer -------------------------
COLLECTIVE_TIMEOUT_S = 600.0
"""A rank waits at most this long in one collective for its peers, then fails (init_process_group's
timeout: gloo raises, NCCL's watchdog aborts the process). It is the bound on a hung or lost peer
where no agent notices (srun), so it must exceed the longest gap between two collectives of a
healthy run: a checkpoint or HF export written by rank 0 while the others wait.
SUITE_COLLECTIVE_TIMEOUT_S overrides it."""
BUILD_TIMEOUT_S = 6 * 3600.0
"""The one longer wait: the other ranks wait while local rank 0 builds the base policy and filters
the perfectible set with it (hours for a real model at 40 samples per prompt). SUITE_BUILD_TIMEOUT_S
overrides it."""
SHUTDOWN_GRACE_S = 10
"""torchrun's agent, when it stops its ranks (its launcher died, a rank failed, Ctrl-C), sends
SIGTERM and SIGKILL after this many seconds (``--shutdown-timeout``; torchrun's default is 30). A
rank has nothing to save at that point: checkpoints are written atomically (docs/distributed.md)."""
ORPHAN_TIMEOUT_S = SHUTDOWN_GRACE_S + 3 * lifetime.PARENT_POLL_S
"""The bound a user relies on: once a sweep, its cell's ``suite run nproc=N``, torchrun's agent or
(under srun) slurmstepd is killed, or one rank of a torchrun world dies, no process of the run is
left after this many seconds. Off Linux (watchdogs only) each of the three ties of the longest chain
(sweep -> cell -> agent -> rank) is seen within one ``PARENT_POLL_S``, and the agent's stop of its
ranks takes ``SHUTDOWN_GRACE_S`` at most; on Linux the parent-death signals make it about a
second."""

_patient = None  # a gloo group with BUILD_TIMEOUT_S, for the wait on local rank 0's build


def _seconds(var: str, default: float) -> float:
    return float(os.environ.get(var, default))


def from_env(env=None) -> dict | None:
    """The world the launcher made (torchrun first, then Slurm tasks), or None for one plain
    process.

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
        return {"rank": int(env["SLURM_PROCID"]), "size": size,
                "local_rank": int(env.get("SLURM_LOCALID", 0)), "local_size": size // nodes,
                "nodes": nodes, "launcher": "slurm"}
    return None


def _slurm_rendezvous() -> None:
    """MASTER_ADDR/PORT for a Slurm job step launched without torchrun (first host, port from the
    job id)."""
    if "MASTER_ADDR" not in os.environ:
        hosts = subprocess.run(["scontrol", "show", "hostnames", os.environ["SLURM_JOB_NODELIST"]],
                               capture_output=True, text=True, check=True).stdout.split()
        os.environ["MASTER_ADDR"] = hosts[0]
    os.environ.setdefault("MASTER_PORT",
                          str(20000 + int(os.environ.get("SLURM_JOB_ID", "0")) % 20000))


def device_for(local_rank: int) -> str:
    """``cuda:<local rank>`` on a GPU host, the CPU otherwise."""
    return f"cuda:{local_rank}" if torch.cuda.is_available() else "cpu"


def init(nproc: int = 1, nnodes: int = 1) -> World:
    """Join the launcher's process group (if any) and return this process's World.

    ``nproc``/``nnodes`` are the config's; when a launcher made the world they must agree with it
    (a default ``nproc=1`` under a user's torchrun takes the launcher's world).
    """
    global _patient
    w = from_env()
    if w is None:
        if nproc * nnodes > 1:
            raise RuntimeError(f"nproc={nproc} nnodes={nnodes}: this process was not started by "
                               "torchrun or srun; `suite run nproc=N` starts torchrun itself on "
                               "one node (docs/distributed.md)")
        return World(device=device_for(0))
    if (nproc, nnodes) != (1, 1) and (w["local_size"], w["nodes"]) != (nproc, nnodes):
        raise ValueError(f"nproc={nproc} nnodes={nnodes}, but the launcher started "
                         f"{w['local_size']} ranks per node on {w['nodes']} node(s); drop "
                         "nproc/nnodes or make them agree")
    # torchrun's agent (it sets TORCHELASTIC_RUN_ID) starts its ranks from its main thread: a
    # parent-death signal is safe there; slurmstepd is multi-threaded: the watchdog alone
    # (lifetime's docstring)
    lifetime.die_with_parent(signal.SIGKILL, pdeathsig="TORCHELASTIC_RUN_ID" in os.environ)
    device = device_for(w["local_rank"])
    backend = "nccl" if device.startswith("cuda") else "gloo"
    if w["launcher"] == "slurm":
        _slurm_rendezvous()
        os.environ.update(RANK=str(w["rank"]), WORLD_SIZE=str(w["size"]),
                          LOCAL_RANK=str(w["local_rank"]))
    if device.startswith("cuda"):
        torch.cuda.set_device(torch.device(device))
    if not tdist.is_initialized():
        timeout = _seconds("SUITE_COLLECTIVE_TIMEOUT_S", COLLECTIVE_TIMEOUT_S)
        tdist.init_process_group(backend, rank=w["rank"], world_size=w["size"],
                                 timeout=timedelta(seconds=timeout), device_id=torch.device(device)
                                 if device.startswith("cuda") else None)
        build_s = _seconds("SUITE_BUILD_TIMEOUT_S", BUILD_TIMEOUT_S)
        _patient = tdist.new_group(backend="gloo", timeout=timedelta(seconds=build_s))
    return World(backend=backend, device=device, **w)


def close(world: World) -> None:
    global _patient
    if world.distributed and tdist.is_initialized():
        tdist.destroy_process_group()
        _patient = None


def check_ranks(nproc: int, nnodes: int) -> None:
    """Refuse a world this machine cannot host, before any compute (GPU count on a GPU host)."""
    if torch.cuda.is_available() and nproc > torch.cuda.device_count():
        raise ValueError(f"nproc: {nproc} ranks per node, but this machine has "
                         f"{torch.cuda.device_count()} GPU(s)")
    if nproc * nnodes > 1 and not fsdp_sums():
        raise ValueError(f"nproc={nproc} nnodes={nnodes}: sharded training needs torch >= 2.8 "
                         "(FSDP2's set_force_sum_reduction_for_comms, pytorch/pytorch#155915); "
                         f"this torch is {torch.__version__}")


def fsdp_sums() -> bool:
    """Whether FSDP2 can reduce gradients with a plain SUM. The trainer sums over ranks (its loss is
    already normalised by the global token count) and gloo has no PREMUL_SUM, so FSDP2 without the
    switch (torch < 2.8) cannot shard this trainer: found by the test suite under torch 2.6."""
    from torch.distributed.fsdp import FSDPModule

    return hasattr(FSDPModule, "set_force_sum_reduction_for_comms")


# ---- collectives (no-ops in a plain process) -------------------------------------------------
def gather_objects(obj, world: World) -> list:
    """Every rank's ``obj``, in rank order, on every rank (pickled; for rollouts and small
    dicts)."""
    if not world.distributed:
        return [obj]
    out = [None] * world.size
    tdist.all_gather_object(out, obj)
    return out


def peak_memory_mb(device: torch.device, world: World) -> dict[str, float]:
    """The largest peak so far over the ranks (MiB; collective), each under its own name: the
    process's resident set (host memory, on a GPU machine too) and, on a GPU, the caching
    allocator's peak of allocated bytes, which no resident set contains."""
    import resource

    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # Linux: KiB
    mine = {"memory/peak_rss_mb/max": rss}
    if device.type == "cuda":
        mine["memory/cuda_peak_allocated_mb/max"] = torch.cuda.max_memory_allocated(device) / 2**20
    every = gather_objects(mine, world)
    return {k: max(r[k] for r in every) for k in mine}


def all_reduce(t: torch.Tensor, world: World, op: str = "sum") -> torch.Tensor:
    """In-place all-reduce of a tensor on the world's device (sum, max or min); returns it."""
    if world.distributed:
        ops = {"sum": tdist.ReduceOp.SUM, "max": tdist.ReduceOp.MAX, "min": tdist.ReduceOp.MIN}
        moved = t.to(world.device)
        tdist.all_reduce(moved, op=ops[op])
        t.copy_(moved)
    return t


def any_rank(flag: bool | torch.Tensor, world: World | None) -> bool:
    """True on every rank when ``flag`` is true on any rank (the sharded grad scaler's inf check). A
    tensor flag is reduced on the device it lives on and read once: the caller's one host sync."""
    t = (flag.detach().float().reshape(1) if isinstance(flag, torch.Tensor)
         else torch.tensor([float(flag)]))
    if world is not None:
        all_reduce(t, world, "max")
    return bool(t.item() > 0)


def barrier(world: World, patient: bool = False) -> None:
    """Wait for every rank; ``patient``: up to BUILD_TIMEOUT_S instead of COLLECTIVE_TIMEOUT_S."""
    if world.distributed:
        tdist.barrier(group=_patient if patient else None)


def broadcast_object(obj, world: World):
    """Rank 0's ``obj`` on every rank."""
    if not world.distributed:
        return obj
    box = [obj]
    tdist.broadcast_object_list(box, src=0)
    return box[0]


# ---- launch ----------------------------------------------------------------------------------
AGENT = ("from suite import lifetime; lifetime.honour_tie(); "
         "from torch.distributed.run import main; main()")
"""``python -c AGENT <torchrun arguments>``: torchrun (``python -m torch.distributed.run``), tied to
its parent before torch is imported."""


def launch(argv: list[str], nproc: int, nnodes: int) -> int:
    """Re-run ``suite <argv>`` as ``nproc`` ranks through torchrun on this node; return its exit
    code.

    One node only: a launcher cannot start processes on other machines, so a multi-node run is
    started on every node by torchrun or srun (docs/distributed.md gives both commands).

    The agent dies with this process (``lifetime``): it gets SIGTERM when this process dies, however
    it dies (SIGKILL included), and torchrun answers SIGTERM by stopping its ranks (SIGTERM, then
    SIGKILL after SHUTDOWN_GRACE_S). When this process is unwound instead (Ctrl-C, an error), it
    stops the agent the same way and waits for it.
    """
    if nnodes > 1:
        raise ValueError(f"nnodes={nnodes}: start the run on every node yourself, e.g. `torchrun "
                         f"--nnodes={nnodes} --nproc_per_node={nproc} --rdzv-backend=c10d "
                         "--rdzv-endpoint=HOST:29500 -m suite run ...` or `srun "
                         "--ntasks-per-node=... suite run ...` (docs/distributed.md)")
    cmd = [sys.executable, "-c", AGENT, "--standalone", f"--nproc_per_node={nproc}",
           f"--shutdown-timeout={SHUTDOWN_GRACE_S}", "-m", "suite.cli", *argv]
    agent = subprocess.Popen(cmd, env=lifetime.tied_env(os.environ, signal.SIGTERM))
    try:
        return agent.wait()
    finally:
        if agent.poll() is None:
            agent.terminate()
            agent.wait()
