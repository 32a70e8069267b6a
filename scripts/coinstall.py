"""Does the suite install next to the RL stacks its users run? pip's resolver, dry runs, against
PyPI.

For each stack (its current release and the pins of its vLLM/SGLang set-up) the suite's wheel, built
from this checkout, is resolved together with the stack twice: the core, and the core with the
``vllm`` extra. Nothing is installed: ``pip install --dry-run --report`` only resolves, and
``--isolated`` keeps this machine's pip configuration (constraints, local indexes) out, so the
answer is PyPI's. The table goes into docs/install.md between its ``coinstall`` markers:

    python scripts/coinstall.py                 # all stacks, rewrites the table in docs/install.md
    python scripts/coinstall.py --only trl --print

Markers are evaluated for the interpreter running this (CPython 3.11 on Linux x86_64 for the
committed table). OpenRLHF needs flash-attn, published as a source archive only, whose setup.py
imports torch: so source archives are prepared without build isolation (run this with a Python that
has torch, as those stacks' own instructions assume) and with FLASH_ATTENTION_SKIP_CUDA_BUILD=TRUE
(metadata only, no CUDA).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import shlex
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DOC = ROOT / "docs" / "install.md"
BEGIN = "<!-- coinstall:begin (scripts/coinstall.py writes this part) -->"
END = "<!-- coinstall:end -->"
SHOWN = ("torch", "vllm", "transformers", "sglang")  # the resolved versions the table reports

# slime is not on PyPI (the PyPI project "slime" is an unrelated linear mixed-effects library): its
# requirements.txt at THUDM/slime 624b824 (2026-08-21), plus the SGLang and torch that its
# build_conda.sh installs (SGLang v0.5.15.post1, torch 2.11.0); Megatron-LM and TransformerEngine
# come from source there and are left out.
SLIME_COMMIT = "624b824a898ab0ec1fcb4d373004c7f3852bf515"
SLIME_REQUIREMENTS = [
    "accelerate", "anthropic", "blake3", "blobfile", "datasets", "e2b", "httpx[http2]", "mcp[cli]",
    "memray", "numba", "omegaconf", "openai", "openai-agents", "pillow", "pylatexenc", "pyyaml",
    "qwen_vl_utils", "ray[default]", "safetensors", "sglang-router>=0.3.0", "tensorboard",
    "transformers", "wandb", "xxhash", "zstandard",
]


@dataclass(frozen=True)
class Stack:
    name: str
    version: str
    requirements: tuple[str, ...]
    source: str
    """Where the version and the pins come from."""


STACKS = [
    Stack("verl", "0.9.1", ("verl[vllm]==0.9.1",), "PyPI; its `vllm` extra pins torch 2.11.0, vLLM "
                                                   "0.24.0, transformers 5.9.0"),
    Stack("OpenRLHF", "0.11.2", ("openrlhf[vllm]==0.11.2",),
          "PyPI; pins transformers 5.15.0, DeepSpeed 0.19.6, flash-attn 2.8.3, its `vllm` extra "
          "vLLM 0.29.0"),
    Stack("TRL", "1.16.0", ("trl[vllm]==1.16.0",),
          "PyPI; its `vllm` extra takes vLLM 0.22 to 0.31"),
    Stack("slime", f"0.3.1 ({SLIME_COMMIT[:7]})",
          (*SLIME_REQUIREMENTS, "sglang==0.5.15.post1", "torch==2.11.0"),
          f"GitHub THUDM/slime@{SLIME_COMMIT[:7]}: requirements.txt + SGLang 0.5.15.post1 and "
          "torch 2.11.0 (build_conda.sh); not on PyPI"),
]


def build_wheel(out: Path) -> Path:
    """The suite's wheel from this checkout (no dependencies resolved here)."""
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--isolated", "--no-deps", "-q", "-w",
                    str(out), str(ROOT)],
                   check=True)
    return next(out.glob("lowprec_rl_suite-*.whl"))


def resolve_cmd(stack: Stack, suite_req: str, report: str) -> list[str]:
    return ["pip", "install", "--dry-run", "--isolated", "--ignore-installed",
            "--no-build-isolation", "--report", report, *stack.requirements, suite_req]


def conflict(output: str) -> str:
    """pip's explanation of a failed resolution, condensed: per conflicting dependency, who asks for
    which versions (the releases of one package that ask the same thing grouped into a range)."""
    lines = output.splitlines()
    if "The conflict is caused by:" not in output:
        errors = [line.strip() for line in lines if line.startswith("ERROR")]
        return errors[-1] if errors else (lines[-1].strip() if lines
                                          else "pip failed without a message")
    start = next(i for i, line in enumerate(lines) if "The conflict is caused by:" in line) + 1
    # dependency -> (package, spec) -> versions
    asks: dict[str, dict[tuple[str, str], list[str]]] = {}
    for line in lines[start:]:
        if not line.strip():
            break
        m = re.match(r"\s*(\S+) (\S+) depends on ([A-Za-z0-9_.\-]+)(?:\[[^\]]*\])?\s*([^;]*)", line)
        if m:
            pkg, ver, dep, spec = m.groups()
            spec = spec.strip().replace(" and ", ",") or "any"
            asks.setdefault(dep, {}).setdefault((pkg, spec), []).append(ver)
    parts = []
    for dep, who in asks.items():
        # one package's own releases disagreeing is not the conflict
        if len({pkg for pkg, _ in who}) < 2:
            continue
        said = [f"{pkg} {vs[-1] if len(vs) == 1 else vs[-1] + '-' + vs[0]} {spec}" for (pkg, spec),
                vs in who.items()]
        parts.append(f"{dep}: " + "; ".join(said))
    return " / ".join(parts) or "; ".join(line.strip() for line in lines[start:start + 6])


def resolve(stack: Stack, suite_req: str) -> dict:
    """One dry run: resolved versions of SHOWN, or why pip found none."""
    with tempfile.TemporaryDirectory() as tmp:
        report = str(Path(tmp) / "report.json")
        cmd = resolve_cmd(stack, suite_req, report)
        env = {**os.environ, "FLASH_ATTENTION_SKIP_CUDA_BUILD": "TRUE"}
        proc = subprocess.run([sys.executable, "-m", *cmd], capture_output=True, text=True, env=env)
        if proc.returncode != 0:
            return {"ok": False, "why": conflict(proc.stdout + "\n" + proc.stderr)}
        items = json.loads(Path(report).read_text())["install"]
    versions = {i["metadata"]["name"].lower(): i["metadata"]["version"] for i in items}
    return {"ok": True, **{k: versions.get(k, "-") for k in SHOWN}}


def table(rows: list[tuple[Stack, str, dict]]) -> str:
    head = ("| stack | version | suite | resolves | torch | vLLM | transformers | SGLang | why not "
            "|\n|---|---|---|---|---|---|---|---|---|\n")
    out = []
    for stack, extra, r in rows:
        got = [r.get(k, "") for k in SHOWN] if r["ok"] else ["", "", "", ""]
        why = "" if r["ok"] else r["why"].replace("|", "\\|")
        out.append(f"| {stack.name} | {stack.version} | {extra} | {'yes' if r['ok'] else '**no**'} "
                   "| "
                   + " | ".join(got) + f" | {why} |")
    return head + "\n".join(out) + "\n"


def section(rows, wheel_name: str) -> str:
    py = f"CPython {platform.python_version()} on {platform.system()} {platform.machine()}"
    pip = subprocess.run([sys.executable, "-m", "pip", "--version"], capture_output=True,
                         text=True).stdout.split()[1]
    cmds = []
    for stack in dict.fromkeys(s for s, _, _ in rows):
        for req in (f"dist/{wheel_name}", f"dist/{wheel_name}[vllm]"):
            cmds.append(shlex.join(resolve_cmd(stack, req, "report.json")))
    sources = "\n".join(f"- {s.name} {s.version}: {s.source}."
                        for s in dict.fromkeys(s for s, _, _ in rows))
    return (f"{BEGIN}\nResolved with pip {pip}, {py}, against PyPI; `suite` is this checkout's "
            f"wheel (`{wheel_name}`), `core` without extras, `[vllm]` with the `vllm` extra. "
            f"Versions are what pip would install.\n\n{table(rows)}\nThe stacks' versions and "
            f"pins:\n{sources}\n\nThe commands (`FLASH_ATTENTION_SKIP_CUDA_BUILD=TRUE` set; "
            "`python scripts/coinstall.py` runs them and rewrites this table):\n\n```bash\n"
            + "\n".join(cmds) + f"\n```\n{END}")


def atomic_json(path: Path, obj) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(obj, indent=1))
    os.replace(tmp, path)


def write_doc(text: str) -> None:
    doc = DOC.read_text()
    if BEGIN not in doc or END not in doc:
        raise SystemExit(f"{DOC}: the coinstall markers are missing")
    pre, rest = doc.split(BEGIN, 1)
    tmp = DOC.with_suffix(".md.tmp")
    tmp.write_text(pre + text + rest.split(END, 1)[1])
    os.replace(tmp, DOC)


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--only", default="", help="comma-separated stack names (default: all)")
    ap.add_argument("--print", action="store_true", help="print the section instead of rewriting "
                                                         "docs/install.md")
    ap.add_argument("--results", type=Path, help="JSON file of pip's answers: rows found there are "
                                                 "not resolved again, new ones are added (to "
                                                 "resume or re-render)")
    args = ap.parse_args(argv)
    names = {n.strip().lower() for n in args.only.split(",") if n.strip()}
    unknown = names - {s.name.lower() for s in STACKS}
    if unknown:
        raise SystemExit(f"--only: unknown stack(s) {sorted(unknown)}; known: "
                         f"{[s.name for s in STACKS]}")
    stacks = [s for s in STACKS if not names or s.name.lower() in names]
    done = json.loads(args.results.read_text()) if args.results and args.results.exists() else {}
    with tempfile.TemporaryDirectory() as tmp:
        wheel = build_wheel(Path(tmp))
        rows = []
        for stack in stacks:
            for extra, req in (("core", str(wheel)), ("[vllm]", f"{wheel}[vllm]")):
                key = f"{stack.name} {stack.version} {extra}"
                r = done[key] if key in done else resolve(stack, req)
                if args.results:
                    done[key] = r
                    atomic_json(args.results, done)
                print(f"{stack.name} {stack.version} + suite {extra}: "
                      + (", ".join(f"{k} {r[k]}" for k in SHOWN) if r["ok"] else f"no: {r['why']}"),
                      flush=True)
                rows.append((stack, extra, r))
    text = section(rows, wheel.name)
    print(text) if args.print else write_doc(text)


if __name__ == "__main__":
    main()
