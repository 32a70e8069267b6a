"""Numerics fingerprint of a machine class: a few smoke-tier steps of every precision flow.

Every flow runs ``tier=smoke`` (a 64-wide policy, 4 prompts x 4 samples) with plain GRPO for
its 4 steps; the fingerprint is each flow's ``metrics.jsonl`` (its sha256, plus the per-step
values that say *where* it moved). It is committed per machine class in
``results/reference/<class id>/fingerprint.json``, and a test recomputes it, so any change
that moves a single bit of any flow's numbers (a kernel, a cast, an order of operations, a
dependency) fails CI until the fingerprint is regenerated on purpose:

    suite fingerprint --write          # on a machine of the class; then commit the file

On a class without a committed fingerprint only what holds everywhere is checked
(suite/analysis/reproduce.py: ``exact`` is 0, the step-0 mismatch ordering of the flows).
"""

from __future__ import annotations

import hashlib
import json
import tempfile
from pathlib import Path

from rich.console import Console
from rich.table import Table

from suite.analysis.reproduce import REFERENCE_ROOT, invariants, known_classes
from suite.locations import refuse_installed, where_to_get_references
from suite.numerics import machine
from suite.packed import read_bytes
from suite.results import atomic_write_json, read_jsonl

SCHEMA = 1
KEYS = ("reward/mean", "mismatch/kl_k3", "mismatch/prob_diff/mean", "train/grad_norm",
        "loss/policy")


def overrides(flow: str, gemm: str, out: Path, deterministic: bool = False) -> list[str]:
    return ["tier=smoke", f"precision={flow}", "algorithm=grpo", f"gemm={gemm}",
            *(["deterministic=true"] if deterministic else []), f"out={out}", "name=fingerprint"]


def deterministic_on(device: str) -> bool:
    """Whether a fingerprint's runs on ``device`` ask for deterministic kernels: on a GPU, whose
    default kernels (atomics, split-K) vary from rerun to rerun, so a fingerprint made with them
    could not claim bit-identity; CPU kernels are deterministic already, and their committed
    fingerprints were made without the field."""
    return device.startswith("cuda")


def compute(gemm: str = "auto", workdir: Path | None = None,
            console: Console | None = None) -> dict:
    """Run every main flow's smoke steps (in ``workdir``, default a temporary directory) and
    fingerprint them (the controls of the mechanism studies are left out, as from the main grids:
    the committed fingerprints stay valid)."""
    from suite import dist
    from suite.numerics.precision import main_flows
    from suite.rl import config as cfgmod
    from suite.rl.train import run

    console = console or Console(quiet=True)
    det = deterministic_on(dist.device_for(0))
    with tempfile.TemporaryDirectory(prefix="suite-fingerprint-") as tmp:
        out = Path(workdir or tmp)
        flows = {}
        for flow in main_flows():
            cfg = cfgmod.load(overrides(flow, gemm, out, det))
            console.print(f"fingerprint: {flow} ({cfg.steps} smoke steps)")
            run_dir = run(cfg, Console(quiet=True))
            data = read_bytes(run_dir / "metrics.jsonl")
            flows[flow] = {"sha256": hashlib.sha256(data).hexdigest(),
                           "steps": [{k: r.get(k) for k in ("step", *KEYS)}
                                     for r in read_jsonl(run_dir / "metrics.jsonl")]}
        inv = invariants(out / "fingerprint")
        cls = machine.describe(gemm, cfg.threads)
    return {"schema_version": SCHEMA, "machine_class": cls,
            "command": f"suite fingerprint --write gemm={gemm}",
            "overrides": overrides("<flow>", gemm, Path("<tmp>"), det)[:-2], "flows": flows,
            "invariants": inv}


def path_for(class_id: str, root: Path = REFERENCE_ROOT) -> Path:
    return Path(root) / class_id / "fingerprint.json"


def load(class_id: str, root: Path = REFERENCE_ROOT) -> dict | None:
    p = path_for(class_id, root)
    return json.loads(p.read_text()) if p.is_file() else None


def compare(got: dict, want: dict) -> list[str]:
    """One line per flow whose numbers moved (empty: every flow bit-identical to the
    fingerprint)."""
    problems = []
    diffs = machine.differences(got["machine_class"], want["machine_class"])
    if diffs:
        problems.append("the fingerprint was made on another class "
                        f"(differs in {', '.join(diffs)})")
    for flow in sorted(set(got["flows"]) | set(want["flows"])):
        g, w = got["flows"].get(flow), want["flows"].get(flow)
        if g is None or w is None:
            problems.append(f"{flow}: {'not run here' if g is None else 'not in the fingerprint'}")
        elif g["sha256"] != w["sha256"]:
            problems.append(f"{flow}: metrics.jsonl moved; {_first_change(g['steps'], w['steps'])}")
    return problems


def _first_change(got: list[dict], want: list[dict]) -> str:
    for a, b in zip(got, want):
        for k in KEYS:
            if a.get(k) != b.get(k):
                return f"first at step {a.get('step')}: {k} {a.get(k)!r} (fingerprint {b.get(k)!r})"
    if len(got) != len(want):
        return f"{len(got)} steps (fingerprint {len(want)})"
    return "in a metric outside the fingerprint's per-step keys (see metrics.jsonl)"


def cli(args: list[str], console: Console) -> int:
    """``suite fingerprint [--write] [gemm=auto|native|emulated]``; exit 1 when the numbers
    moved."""
    write = "--write" in args
    rest = [a for a in args if a != "--write"]
    gemm = "auto"
    for a in rest:
        if not a.startswith("gemm="):
            raise ValueError(f"'{a}': suite fingerprint takes --write and "
                             "gemm=auto|native|emulated only")
        gemm = a.split("=", 1)[1]
    from suite.rl import config as cfgmod

    cfgmod.load(overrides("fp32", gemm, Path("runs")))  # bad gemm: refused before compute
    if write:  # so is a destination inside the installed packages (suite/locations.py)
        refuse_installed(REFERENCE_ROOT, "suite fingerprint --write")
    got = compute(gemm, console=console)
    cls = got["machine_class"]
    table = Table("flow", "sha256 of metrics.jsonl", "last step k3 KL",
                  title=f"numerics fingerprint, {machine.label(cls)}")
    for flow, f in got["flows"].items():
        table.add_row(flow, f["sha256"][:16], f"{f['steps'][-1]['mismatch/kl_k3']:.3e}")
    console.print(table)
    for i in got["invariants"]:
        console.print(f"invariant: {i['name']}: "
                      f"{'n/a' if i['ok'] is None else 'holds' if i['ok'] else 'BROKEN'} "
                      f"({i['detail']})", highlight=False)
    if write:
        atomic_write_json(path_for(cls["id"]), got)
        console.print(f"written to {path_for(cls['id'])}: commit it", highlight=False)
        return 0
    want = load(cls["id"])
    if want is None:
        hint = "" if known_classes() else f"; {where_to_get_references()}"
        console.print(f"no committed fingerprint for machine class {cls['id']} under "
                      f"{REFERENCE_ROOT}: invariants only (`suite fingerprint --write` on this "
                      f"class makes one){hint}", highlight=False)
        return 0 if all(i["ok"] is not False for i in got["invariants"]) else 1
    problems = compare(got, want)
    for p in problems:
        console.print(f"[red]moved[/] {p}", highlight=False)
    console.print("every flow bit-identical to the committed fingerprint" if not problems else
                  f"{len(problems)} difference(s) from {path_for(cls['id'])}; if intended, "
                  "regenerate with `suite fingerprint "
                  f"--write{'' if gemm == 'auto' else ' gemm=' + gemm}` and commit it",
                  highlight=False)
    return 1 if problems else 0
