"""The machine class: what decides a run's numerics on this host.

Two runs of one config give byte-identical ``metrics.jsonl`` on machines of the same class and
may differ between classes. What decides it:

- **the GEMM kernels.** On CPUs, torch picks different fp32 kernels (blocking, hence
  accumulation order) for AVX2 and for AVX-512, and bf16/fp16 GEMMs run natively only with
  AVX512-BF16/FP16 or AMX; without them ``gemm=auto`` emulates them (suite/numerics/precision.py).
  The perfectible set is built in fp32 and still differs between AVX2 and AMX machines, so the ISA
  level is part of the class even for fp32 runs. On GPUs: the GPU model, the driver and CUDA.
- **the GEMM backend per dtype** (``native`` or ``emulated``, resolved from ``gemm=``);
- **torch's version and its CPU threads** (another version or thread count may reorder sums).

The class id names the first two (``cpu-avx2-emulated``, ``cpu-amx-native``,
``cuda-nvidia-h100-80gb-hbm3``); torch and threads are recorded beside it and compared too
(``differences``). Committed references live in ``results/reference/<class id>/``.
"""

from __future__ import annotations

import functools
import json
import platform
import re
import subprocess
from pathlib import Path

import torch

from suite import dist
from suite.numerics.precision import _cpu_flags, gemm_backend

# x86 ISA levels that change torch's CPU kernels, most capable first.
ISA_LEVELS = (("amx", ("amx_bf16",)), ("avx512bf16", ("avx512_bf16", "avx512_fp16")),
              ("avx512", ("avx512f",)), ("avx2", ("avx2",)))
# what must agree for "same class" (plus everything in the id)
COMPARED = ("id", "torch", "threads")


def cpu_isa(flags: frozenset[str] | None = None) -> str:
    """The highest ISA level of ``ISA_LEVELS`` this CPU has (``platform.machine()`` elsewhere)."""
    flags = _cpu_flags() if flags is None else flags
    for level, needs in ISA_LEVELS:
        if flags & set(needs):
            return level
    return platform.machine().lower() or "unknown"


@functools.cache
def _cpuinfo_field(name: str) -> str | None:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.split(":")[0].strip() == name:
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return None


def _slug(text: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-")


def _nvidia_driver() -> str | None:
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=10)
        return (out.stdout.splitlines()[0].strip()
                if out.returncode == 0 and out.stdout.strip() else None)
    except (OSError, subprocess.SubprocessError):
        return None


def gemm_label(backends: dict[str, str]) -> str:
    """native | emulated | mixed (bf16 native, fp16 emulated: AVX512-BF16 without AVX512-FP16)."""
    values = set(backends.values())
    return values.pop() if len(values) == 1 else "mixed"


def describe(gemm: str = "auto", threads: int | None = None, device: str | None = None) -> dict:
    """The class of this machine computing on ``device`` for a run with ``gemm=`` and ``threads``
    (default: torch's current). ``device`` defaults to where this host computes (suite/dist.py); a
    tool that measured elsewhere names its device, so that a CPU measurement on a GPU host is
    labelled with the CPU's class."""
    threads = torch.get_num_threads() if threads is None else threads
    dev = torch.device(device or dist.device_for(0))
    if dev.type == "cuda":
        name = torch.cuda.get_device_name(dev)
        return {"id": f"cuda-{_slug(name)}", "device": "cuda", "gpu": name,
                "gpu_count": torch.cuda.device_count(), "gpu_driver": _nvidia_driver(),
                "cuda": torch.version.cuda, "gemm": {"bf16": "native", "fp16": "native"},
                "torch": torch.__version__, "threads": threads}
    # a device this module knows no more of (mps, xpu, the tests' meta): its name, not the CPU's
    if dev.type != "cpu":
        return {"id": dev.type, "device": dev.type, "torch": torch.__version__, "threads": threads}
    backends = {k: gemm_backend(gemm, dt)
                for k, dt in (("bf16", torch.bfloat16), ("fp16", torch.float16))}
    isa = cpu_isa()
    return {"id": f"cpu-{isa}-{gemm_label(backends)}", "device": "cpu",
            "cpu_vendor": _cpuinfo_field("vendor_id"), "cpu_model": _cpuinfo_field("model name")
            or platform.processor() or None, "isa": isa,
            "gemm": backends, "torch": torch.__version__, "threads": threads}


def differences(a: dict | None, b: dict | None) -> list[str]:
    """The compared fields (``COMPARED``) in which two classes differ; ["class"] when one is
    unknown."""
    if not a or not b:
        return ["class"]
    return [k for k in COMPARED if a.get(k) != b.get(k)]


def declared(run_dir: Path) -> dict | None:
    """The class a reference folder declares (``reference.json`` up to two levels above a run), for
    runs written before env.json recorded one; marked ``declared: true``."""
    for parent in list(Path(run_dir).parents)[:3]:
        path = parent / "reference.json"
        if path.is_file():
            cls = json.loads(path.read_text()).get("machine_class")
            return {**cls, "declared": True} if isinstance(cls, dict) else None
    return None


def of_run(run_dir: Path, env: dict | None) -> dict | None:
    """A run's machine class: recorded in env.json, else declared by its reference folder, else
    None."""
    cls = (env or {}).get("machine_class")
    return cls if isinstance(cls, dict) else declared(run_dir)


def label(cls: dict | None) -> str:
    """One line for tables: the id, then what makes it up."""
    if not cls:
        return "not recorded"
    hw = cls.get("gpu") or cls.get("cpu_model") or "?"
    return (f"{cls['id']} ({hw}; torch {cls.get('torch')}, {cls.get('threads')} thread(s)"
            + ("; declared by the reference folder" if cls.get("declared") else "") + ")")
