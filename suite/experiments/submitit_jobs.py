"""The submitit job of a sweep (hydra-submitit-launcher): its shape for cells of several ranks, its
sbatch file.

A submitit sweep submits every cell with one launcher config, so a cell of ``nproc`` ranks on
``nnodes`` nodes makes every job of the sweep that shape (the cells must agree):

- **submitit_slurm**: ``tasks_per_node=nproc``, ``nodes=nnodes``, ``gpus_per_node=nproc`` and
  ``srun_args=[--kill-on-bad-exit=1]`` (a rank that dies ends the step), each unless the user set
  it. Slurm starts the ranks as the job's tasks; ``suite.dist.from_env`` reads their world from
  SLURM_* variables and every task runs the cell (rank 0 writes).
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
from pathlib import Path

from suite.experiments.cells import override_key

SUBMITIT = ("submitit_slurm", "submitit_local")
# Ways of asking Slurm for GPUs; any of them given by the user replaces our gpus_per_node default.
GPU_FIELDS = ("hydra.launcher.gpus_per_node", "hydra.launcher.gres", "hydra.launcher.gpus_per_task",
              "hydra.launcher.additional_parameters.gpus-per-node",
              "hydra.launcher.additional_parameters.gres",
              "hydra.launcher.additional_parameters.gpus")


def check_one_shape(cells, launcher: str) -> None:
    """Refuse, before compute, a submitit sweep of several ranks whose cells ask for different
    worlds."""
    shapes = list(dict.fromkeys((c.cfg.nproc, c.cfg.nnodes) for c in cells))
    if launcher in SUBMITIT and len(shapes) > 1 and any(p * n > 1 for p, n in shapes):
        (p, n), (q, m) = shapes[:2]
        raise ValueError(f"{'nproc' if p != q else 'nnodes'}: hydra/launcher={launcher} submits "
                         "every cell of a sweep with one job shape, but the cells ask for "
                         f"nproc={p} nnodes={n} and nproc={q} nnodes={m}; run one sweep per value")


def job_shape(launcher: str, ranks: tuple[int, int], user_overrides: list[str]) -> dict:
    """Hydra overrides of the launcher's job shape for cells of ``ranks`` = (nproc, nnodes); {} if
    none apply."""
    nproc, nnodes = ranks
    if launcher not in SUBMITIT or nproc * nnodes == 1:
        return {}
    if launcher == "submitit_local":
        import torch

        return {"hydra.launcher.gpus_per_node": nproc} if torch.cuda.is_available() else {}
    ours = {"hydra.launcher.tasks_per_node": nproc, "hydra.launcher.nodes": nnodes}
    if not any(override_key(o) in GPU_FIELDS for o in user_overrides):
        ours["hydra.launcher.gpus_per_node"] = nproc
    if not any(override_key(o) == "hydra.launcher.srun_args" for o in user_overrides):
        # a rank that dies (OOM, a signal) ends the step: its peers would otherwise wait in a
        # collective until dist.COLLECTIVE_TIMEOUT_S (a rank that raises still exits 0: run_cell
        # records the failure). '++': hydra-submitit-launcher < 1.3 has no srun_args field (submitit
        # itself takes it either way)
        ours["++hydra.launcher.srun_args"] = "['--kill-on-bad-exit=1']"
    return ours


def check_job_shape(launcher: str, ranks: tuple[int, int], launcher_cfg) -> None:
    """The composed job shape must be the cells' world: a user's other value would fail in every
    task (dist.init)."""
    nproc, nnodes = ranks
    if launcher not in SUBMITIT or nproc * nnodes == 1:
        return
    want = {"tasks_per_node": nproc,
            "nodes": nnodes} if launcher == "submitit_slurm" else {"tasks_per_node": 1}
    for k, v in want.items():
        if launcher_cfg.get(k) != v:
            why = ("one task per rank" if launcher == "submitit_slurm"
                   else "one task per cell, which starts torchrun")
            raise ValueError(f"hydra.launcher.{k}: {launcher_cfg.get(k)} given, but the cells "
                             f"(nproc={nproc} nnodes={nnodes}) need {v} under {launcher} ({why}); "
                             f"drop hydra.launcher.{k}")


# hydra-submitit-launcher's Slurm fields under their sbatch names and units, as submitit's
# SlurmExecutor converts them (generic names: timeout_min, mem_gb, tasks_per_node, name,
# signal_delay_s); every other field keeps its name with '-' for '_'. These fields configure the
# launcher or the command, not sbatch:
_SBATCH_NAMES = {"timeout_min": "time", "mem_gb": "mem", "tasks_per_node": "ntasks-per-node",
                 "name": "job-name", "signal_delay_s": "signal"}
_NOT_SBATCH = ("_target_", "submitit_folder", "max_num_timeout", "array_parallelism", "setup",
               "srun_args", "stderr_to_stdout", "additional_parameters")


def sbatch_script(launcher_cfg: dict, n_jobs: int) -> str:
    """The sbatch file of the job hydra-submitit-launcher submits for ``n_jobs`` cells (a job array
    when n_jobs > 1), rendered here from the launcher config with submitit's conventions (its
    parameter conversion, log paths and ``python -m submitit.core._submit FOLDER`` command) for a
    dry run: nothing is submitted and Slurm need not exist. The file submitit writes may order its
    lines differently; the options and the command are these."""
    # None means "not set" to submitit
    cfg = {k: v for k, v in launcher_cfg.items() if v is not None}
    job = "%A_%a" if n_jobs > 1 else "%j"
    folder = cfg["submitit_folder"]
    logs = str(Path(folder.replace("%j", job)).resolve())
    opts = ({"array": f"0-{n_jobs - 1}%{min(n_jobs, int(cfg.get('array_parallelism', n_jobs)))}"}
            if n_jobs > 1 else {})
    for k, v in cfg.items():
        if k not in _NOT_SBATCH:
            opts[_SBATCH_NAMES.get(k, k)] = (f"{v}GB" if k == "mem_gb"
                                             else f"USR2@{v}" if k == "signal_delay_s" else v)
    opts.update(cfg.get("additional_parameters") or {})
    opts.update({"output": f"{logs}/{job}_0_log.out", "open-mode": "append",
                 "wckey": opts.get("wckey", "submitit")})
    err = [] if cfg.get("stderr_to_stdout") else ["--error", f"{logs}/{job}_%t_log.err"]
    if err:
        opts["error"] = f"{logs}/{job}_0_log.err"
    srun = ["srun", "--unbuffered", "--output", f"{logs}/{job}_%t_log.out", *err,
            *(cfg.get("srun_args") or []), sys.executable, "-u", "-m", "submitit.core._submit",
            folder]
    setup = ["", "# setup", *cfg["setup"]] if cfg.get("setup") else []
    return "\n".join(
        ["#!/bin/bash", "", "# Parameters",
         *(f"#SBATCH --{k.replace('_', '-')}={v}"
           for k, v in sorted(opts.items(), key=lambda kv: kv[0].replace("_", "-"))), *setup, "",
         "# command", "export SUBMITIT_EXECUTOR=slurm", shlex.join(srun), ""])
