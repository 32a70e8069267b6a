"""Does a fresh grid reproduce the committed reference of this machine class?

The main job ends here (``suite main``): each cell of the fresh results is compared with the
cell of the same name in ``results/reference/<machine class>/<grid>/`` (suite/numerics/machine.py):
is there a reference of this class, is ``metrics.jsonl`` byte-identical to it, the verdict on
both sides, and the relative difference of the step-0 and final mismatch. Without a reference
of this class, only what must hold on every machine is checked (``invariants``): the ``exact``
flow is exactly 0 at every step, and the step-0 mismatch is ordered
fp32 < fp16 < bf16 < bf16_fp8rollout (mantissa bits: 23 > 10 > 7 > 3). The rest (every
value, the perfectible set, whether unified FP8 is 0) depends on the hardware.

The result is ``reproduction.json`` (read by the report) and ``reproduction.md`` next to the
runs. Pure functions of the files; nothing here runs a model.
"""

from __future__ import annotations

import json
from pathlib import Path

from suite.locations import where_to_get_references
from suite.numerics import machine
from suite.packed import locate, read_bytes, read_log
from suite.results import (
    REFERENCE_ROOT,
    atomic_write_json,
    atomic_write_text,
    display_path,
    find_run_dirs,
)

# step-0 mismatch, smallest first, on every machine
ORDER = ("fp32", "fp16", "bf16", "bf16_fp8rollout")
KEYS = ("kl_k3", "prob_diff/mean")  # the invariants' mismatch measures
HEAD = ["run", "reference", "metrics.jsonl", "verdict (here / ref)", "step-0 k3 KL (here / ref)",
        "rel. diff", "final k3 KL (here / ref)", "rel. diff"]


def reference_dir(class_id: str, grid: str, root: Path = REFERENCE_ROOT) -> Path | None:
    path = Path(root) / class_id / grid
    return path if find_run_dirs(path) else None


def known_classes(root: Path = REFERENCE_ROOT) -> list[str]:
    return sorted(p.name for p in Path(root).iterdir()
                  if (p / "reference.json").is_file()) if Path(root).is_dir() else []


def _summary(run_dir: Path) -> dict:
    path = run_dir / "summary.json"
    return json.loads(path.read_text()) if path.is_file() else {}


def _env(run_dir: Path) -> dict:
    path = run_dir / "env.json"
    return json.loads(path.read_text()) if path.is_file() else {}


def _same_config(run_dir: Path, ref_dir: Path) -> bool:
    """Is the fresh run the reference's experiment? Same config hash, or the reference predates
    fields the code gained since and the fresh run holds their defaults
    (provenance.same_experiment)."""
    from suite.rl.provenance import same_experiment

    paths = run_dir / "config.json", ref_dir / "config.json"
    if not all(p.is_file() for p in paths):
        return False
    new, recorded = (json.loads(p.read_text()) for p in paths)
    return same_experiment(recorded, new.get("config") or {})


def rel_diff(a, b) -> float | None:
    """|a - b| / |b| (0 when both are 0; None when either is missing)."""
    if not isinstance(a, (int, float)) or not isinstance(b, (int, float)):
        return None
    if a == b:
        return 0.0
    return abs(a - b) / abs(b) if b else float("inf")


def first_difference(a: Path, b: Path) -> str:
    """'identical', or the first step whose metrics.jsonl line differs. Either side may be stored
    as .xz (suite/packed.py): the decompressed bytes are compared."""
    if locate(a) is None or locate(b) is None:
        return "missing"
    la, lb = read_bytes(a).splitlines(), read_bytes(b).splitlines()
    if la == lb:
        return "identical"
    for i, (x, y) in enumerate(zip(la, lb)):
        if x != y:
            return f"differs from step {json.loads(x).get('step', i + 1)}"
    return f"differs in length ({len(la)} vs {len(lb)} steps)"


def compare(root: Path, ref: Path | None) -> list[dict]:
    """One record per run of ``root``: its counterpart in ``ref`` (the same path below the grid's
    folder, so the rows of a grid of experiments never meet another row's run of the same name) and
    how they compare."""
    out = []
    ref_dirs = {d.relative_to(ref).as_posix(): d for d in find_run_dirs(ref)} if ref else {}
    for d in find_run_dirs(root):
        name = d.relative_to(root).as_posix()
        s, other = _summary(d), ref_dirs.get(name)
        # same cell name, another experiment (tier=smoke, ...)
        if other and not _same_config(d, other):
            other = None
        rs = _summary(other) if other else {}
        out.append({
            "run": name, "reference": str(other) if other else None,
            "metrics": (first_difference(d / "metrics.jsonl", other / "metrics.jsonl") if other else
                        "no reference" if name not in ref_dirs else "reference has another config"),
            "verdict": s.get("verdict"), "ref_verdict": rs.get("verdict"),
            "step0_kl_k3": s.get("mismatch/step0/kl_k3"),
            "ref_step0_kl_k3": rs.get("mismatch/step0/kl_k3"),
            "step0_rel_diff": rel_diff(s.get("mismatch/step0/kl_k3"),
                                       rs.get("mismatch/step0/kl_k3")) if other else None,
            "final_kl_k3": s.get("mismatch/final/kl_k3"),
            "ref_final_kl_k3": rs.get("mismatch/final/kl_k3"),
            "final_rel_diff": rel_diff(s.get("mismatch/final/kl_k3"),
                                       rs.get("mismatch/final/kl_k3")) if other else None,
        })
    return out


def invariants(root: Path) -> list[dict]:
    """What must hold on every machine, checked on the runs of ``root``: name, ok (None: not
    applicable), detail."""
    runs = [(d, _summary(d)) for d in find_run_dirs(root)]
    out = []
    exact = [d for d, s in runs if s.get("precision") == "exact"]
    if exact:
        bad = []
        for d in exact:
            rows = read_log(d, "metrics.jsonl", missing_ok=True)
            nonzero = [r["step"] for r in rows if r.get("mismatch/kl_k3") != 0.0
                       or r.get("mismatch/prob_diff/max") != 0.0]
            if nonzero or not rows:
                bad.append(f"{d.name}: "
                           f"{'no steps' if not rows else f'non-zero at steps {nonzero[:5]}'}")
        out.append({"name": "exact flow: mismatch exactly 0 at every step", "ok": not bad,
                    "detail": "; ".join(bad) or f"{len(exact)} run(s), every step 0"})
    for key in KEYS:
        means = {}
        for flow in ORDER:
            vals = [s[f"mismatch/step0/{key}"] for _, s in runs
                    if s.get("precision") == flow
                    and isinstance(s.get(f"mismatch/step0/{key}"), (int, float))]
            if vals:
                means[flow] = sum(vals) / len(vals)
        present = [f for f in ORDER if f in means]
        ok = all(means[a] < means[b]
                 for a, b in zip(present, present[1:])) if len(present) > 1 else None
        out.append(
            {"name": f"step-0 {key}: {' < '.join(present) or ' < '.join(ORDER)}", "ok": ok,
             "detail": ", ".join(f"{f} {means[f]:.3g}" for f in present)
             or "flows not in this grid"})
    return out


def check(root: Path, grid: str, ref_root: Path = REFERENCE_ROOT) -> dict:
    """Compare ``root`` (a fresh grid) with the reference of its machine class; the document written
    to disk."""
    dirs = find_run_dirs(root)
    if not dirs:
        raise ValueError(f"{root}: no run directories to compare")
    classes = {json.dumps(machine.of_run(d, _env(d)), sort_keys=True) for d in dirs}
    here = json.loads(sorted(classes)[0])
    ref = reference_dir(here["id"], grid, ref_root) if here else None
    ref_meta = (json.loads((Path(ref_root) / here["id"] / "reference.json").read_text())
                if ref else {})
    rows = compare(root, ref)
    # A GPU reference made with default kernels (atomics, split-K) is one draw of many: no rerun
    # repeats its bytes.
    loose = sorted({r["run"] for r in rows if r["reference"]
                    and (_env(Path(r["reference"])).get("machine_class")
                         or {}).get("device") == "cuda"
                    and not (_env(Path(r["reference"])).get("determinism") or {}).get("requested")})
    doc = {"grid": grid, "nondeterministic_reference": loose, "machine_class": here,
           "classes_in_runs": len(classes), "reference": display_path(ref) if ref else None,
           "reference_meta": ref_meta,
           "class_differences": machine.differences(here, ref_meta.get("machine_class")) if ref
           else [], "known_classes": known_classes(ref_root), "rows": rows,
           "invariants": invariants(root)}
    doc["statement"] = statement(doc)
    return doc


def statement(doc: dict) -> str:
    """The outcome in a few sentences, generated from ``doc`` (nothing here is committed text)."""
    cls = doc["machine_class"] or {}
    inv = doc["invariants"]
    held = [i for i in inv if i["ok"]]
    broke = [i for i in inv if i["ok"] is False]
    inv_text = ((f"What must hold on every machine: {len(held)} of {len(held) + len(broke)} checks "
                 "hold"
                 + (f"; broken: {'; '.join(i['name'] + ' (' + i['detail'] + ')' for i in broke)}"
                    if broke else "")
                 + ".") if held or broke else "No machine-independent check applies to these runs.")
    if not doc["reference"]:
        others = ", ".join(doc["known_classes"]) or "none"
        where = "" if doc["known_classes"] else f" ({where_to_get_references()})"
        what = (f"of the grid {doc.get('grid')} " if cls.get("id") in doc["known_classes"] else "")
        return (f"No committed reference {what}for machine class {cls.get('id', 'unknown')} "
                f"(references exist for: {others}{where}), so nothing here can be compared value "
                f"by value. {inv_text} Every other number (the values, the perfectible set, "
                "whether unified fp8 is exactly 0) depends on the hardware.")
    rows = doc["rows"]
    with_ref = [r for r in rows if r["reference"]]
    same = sum(r["metrics"] == "identical" for r in with_ref)
    agree = sum(r["verdict"] == r["ref_verdict"] for r in with_ref)
    meta = doc["reference_meta"]
    sha = ((meta.get("jobs") or {}).get(doc.get("grid"))
           or {}).get("git_sha") or meta.get("git_sha", "?")
    diffs = doc["class_differences"]
    unmatched = ("" if len(with_ref) == len(rows)
                 else f" ({len(rows) - len(with_ref)} without a reference cell)")
    text = (f"Against the committed reference of machine class {cls.get('id')} "
            f"({doc['reference']}, made at commit {str(sha)[:7]}): metrics.jsonl byte-identical in "
            f"{same} of {len(rows)} cells{unmatched}; verdicts agree in {agree} of "
            f"{len(with_ref)}.")
    if diffs:
        text += (f" This machine differs from the reference's in {', '.join(diffs)}, so byte "
                 "identity is not expected.")
    if doc.get("nondeterministic_reference"):
        text += (f" {len(doc['nondeterministic_reference'])} reference cells ran default CUDA "
                 "kernels (deterministic=false), which vary from rerun to rerun, so byte identity "
                 "is not expected of them; their verdicts and step-0 mismatch are the comparison "
                 "(docs/gpu.md).")
    loose = set(doc.get("nondeterministic_reference") or ())
    moved = [r["run"] for r in with_ref if r["metrics"] != "identical" and r["run"] not in loose]
    if moved:
        text += (f" Cells that moved: {', '.join(moved[:8])}{' ...' if len(moved) > 8 else ''} "
                 "(the code or the environment changed the numbers since the reference was made: "
                 "see its reference.json).")
    return text + " " + inv_text


def table_rows(doc: dict) -> list[list[str]]:
    def sci(x):
        return "-" if x is None else f"{x:.2e}"

    out = []
    for r in doc["rows"]:
        out.append([r["run"], "yes" if r["reference"] else "no", r["metrics"],
                    f"{r['verdict']} / {r['ref_verdict'] or '-'}",
                    f"{sci(r['step0_kl_k3'])} / {sci(r['ref_step0_kl_k3'])}",
                    sci(r["step0_rel_diff"]), f"{sci(r['final_kl_k3'])} / "
                                              f"{sci(r['ref_final_kl_k3'])}",
                    sci(r["final_rel_diff"])])
    return out


def markdown(doc: dict) -> str:
    lines = [f"# Reproduction: {doc['grid']} on machine class "
             f"{(doc['machine_class'] or {}).get('id', 'unknown')}", "",
             doc["statement"], "", f"Machine class: {machine.label(doc['machine_class'])}.", "",
             "| " + " | ".join(HEAD) + " |", "|" + "---|" * len(HEAD)]
    lines += ["| " + " | ".join(r) + " |" for r in table_rows(doc)]
    lines += ["", "| invariant (every machine) | holds | detail |", "|---|---|---|"]
    lines += [f"| {i['name']} | {'n/a' if i['ok'] is None else 'yes' if i['ok'] else 'NO'} | "
              f"{i['detail']} |"
              for i in doc["invariants"]]
    return "\n".join(lines) + "\n"


def write(root: Path, doc: dict) -> None:
    atomic_write_json(Path(root) / "reproduction.json", doc)
    atomic_write_text(Path(root) / "reproduction.md", markdown(doc))
