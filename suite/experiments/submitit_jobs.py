"""The submitit job of a sweep (hydra-submitit-launcher): its shape for cells of several ranks, its sbatch file.

A submitit sweep submits every cell with one launcher config, so a cell of ``nproc`` ranks on
``nnodes`` nodes makes every job of the sweep that shape (the cells must agree):

- **submitit_slurm**: ``tasks_per_node=nproc``, ``nodes=nnodes`` and ``gpus_per_node=nproc``,
  each unless the user set it. Slurm starts the ranks as the job's tasks; ``suite.rl.dist.from_env``
  reads their world from SLURM_* variables and every task runs the cell (rank 0 writes).
  **GPU rule**: one GPU per rank unless the user asked for GPUs another way (``gpus_per_node``,
  ``gres``, ``gpus_per_task``). The job runs on a cluster node whose GPUs cannot be seen from
  where the sweep is planned (a dry run is usually prepared on a laptop or a login node), and a
  rank computes on ``cuda:<local rank>`` whenever its node has GPUs; a CPU partition takes
  ``hydra.launcher.gpus_per_node=null``.
- **submitit_local**: one task per cell, whose ``run_cell`` starts the ranks through torchrun:
  submitit's local tasks carry SUBMITIT_LOCAL_* variables, which ``dist.from_env`` does not read,
  so N local tasks would each start a whole run. ``gpus_per_node=nproc`` only when this machine
  has GPUs (submitit hides every GPU from a local job that asks for none).

Single-rank sweeps are left as they were (the user's ``gpus_per_node``, or none).
"""

from __future__ import annotations

import shlex
import sys

SUBMITIT = ("submitit_slurm", "submitit_local")
# Ways of asking Slurm for GPUs; any of them given by the user replaces our gpus_per_node default.
GPU_FIELDS = ("hydra.launcher.gpus_per_node", "hydra.launcher.gres", "hydra.launcher.gpus_per_task",
              "hydra.launcher.additional_parameters.gpus-per-node", "hydra.launcher.additional_parameters.gres",
              "hydra.launcher.additional_parameters.gpus")


def _key(override: str) -> str:
    return override.split("=", 1)[0].lstrip("+~")


def check_one_shape(cells, launcher: str) -> None:
    """Refuse, before compute, a submitit sweep of several ranks whose cells ask for different worlds."""
    shapes = list(dict.fromkeys((c.cfg.nproc, c.cfg.nnodes) for c in cells))
    if launcher in SUBMITIT and len(shapes) > 1 and any(p * n > 1 for p, n in shapes):
        (p, n), (q, m) = shapes[:2]
        raise ValueError(f"{'nproc' if p != q else 'nnodes'}: hydra/launcher={launcher} submits every cell of a sweep "
                         f"with one job shape, but the cells ask for nproc={p} nnodes={n} and nproc={q} nnodes={m}; "
                         "run one sweep per value")


def job_shape(launcher: str, ranks: tuple[int, int], user_overrides: list[str]) -> dict:
    """Hydra overrides of the launcher's job shape for cells of ``ranks`` = (nproc, nnodes); {} if none apply."""
    nproc, nnodes = ranks
    if launcher not in SUBMITIT or nproc * nnodes == 1:
        return {}
    if launcher == "submitit_local":
        import torch

        return {"hydra.launcher.gpus_per_node": nproc} if torch.cuda.is_available() else {}
    ours = {"hydra.launcher.tasks_per_node": nproc, "hydra.launcher.nodes": nnodes}
    if not any(_key(o) in GPU_FIELDS for o in user_overrides):
        ours["hydra.launcher.gpus_per_node"] = nproc
    return ours


def check_job_shape(launcher: str, ranks: tuple[int, int], launcher_cfg) -> None:
    """The composed job shape must be the cells' world: a user's other value would fail in every task (dist.init)."""
    nproc, nnodes = ranks
    if launcher not in SUBMITIT or nproc * nnodes == 1:
        return
    want = {"tasks_per_node": nproc, "nodes": nnodes} if launcher == "submitit_slurm" else {"tasks_per_node": 1}
    for k, v in want.items():
        if launcher_cfg.get(k) != v:
            why = "one task per rank" if launcher == "submitit_slurm" else "one task per cell, which starts torchrun"
            raise ValueError(f"hydra.launcher.{k}: {launcher_cfg.get(k)} given, but the cells (nproc={nproc} "
                             f"nnodes={nnodes}) need {v} under {launcher} ({why}); drop hydra.launcher.{k}")


def sbatch_script(launcher_cfg: dict, n_jobs: int) -> str:
    """The sbatch file that hydra-submitit-launcher would submit for ``n_jobs`` cells (a job array when
    n_jobs > 1), rendered with submitit's own template; nothing is submitted and Slurm need not exist.

    Mirrors ``BaseSubmititLauncher.launch`` -> ``AutoExecutor.update_parameters`` ->
    ``SlurmExecutor``: generic names (timeout_min, mem_gb, ...) become sbatch names (time, mem, ...)."""
    from submitit.slurm.slurm import SlurmExecutor, _make_sbatch_string

    params = {k: v for k, v in launcher_cfg.items()  # None means "not set" to submitit
              if v is not None and k not in ("_target_", "submitit_folder", "max_num_timeout")}
    executor = object.__new__(SlurmExecutor)  # only for its parameter conversion; __init__ looks for srun
    params = executor._convert_parameters(params)
    folder = launcher_cfg["submitit_folder"]
    command = " ".join([shlex.quote(sys.executable), "-u -m submitit.core._submit", shlex.quote(folder)])
    return _make_sbatch_string(command=command, folder=folder, map_count=n_jobs if n_jobs > 1 else None, **params)
