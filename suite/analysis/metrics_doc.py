"""docs/metrics.md, written from the metric table (suite/numerics/peers.py) so that the two cannot
disagree.

    python -m suite.analysis.metrics_doc --write     # regenerate docs/metrics.md
    python -m suite.analysis.metrics_doc --check # exit 1 if the committed file differs (tests do
    this)
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from suite.locations import CHECKOUT, refuse_installed
from suite.numerics import peers
from suite.results import atomic_write_text

# The clone's docs/metrics.md; an installed suite has no docs/ of its own, so ./docs/metrics.md.
DOC = (CHECKOUT or Path.cwd()) / "docs" / "metrics.md"
COLUMNS = ("verl", "TRL", "slime", "prime-rl", "Oat")

INTRO = """\
# Metrics reference

<!-- Generated from suite/numerics/peers.py by `python -m suite.analysis.metrics_doc --write`; do \
not edit. -->

Every mismatch metric (`suite.numerics.mismatch.mismatch_metrics`, logged each step in \
`metrics.jsonl`) and
IS diagnostic (`suite.rl.algos.is_weights`, under `is/*` when the algorithm has a correction; a \
training run
writes `is/applied/*` to `mechanism.jsonl`, the others to `metrics.jsonl`), with its name
in the frameworks users compare against. Under a peer's name the suite puts only the peer's \
number: a cell
marked **=** is the same number (to 1e-6 relative, rounding aside); any other mark names the one \
convention
in which the peer differs, and the suite keeps its own value under its own key. verl and TRL were \
checked by
running their released code on the same tensors (tests/test_conformance.py; `bash \
scripts/conformance.sh`);
slime, prime-rl and Oat by reading their source at the commit named below. The suite writes \
nothing under
slime's, prime-rl's or Oat's names: their columns say which of the numbers they log corresponds \
to a suite key.

Conventions of the suite: log-probs of the *sampled* tokens, trainer pi and sampler mu at the \
same parameters,
in float64; rho_t = pi_t / mu_t. Token means pool every response token of the batch; sequence \
statistics use
the rows with at least one response token; std is the population std (it exists for one token); \
an empty
batch gives NaN. "Clamped": the log-ratio is clamped to +-20 before exp, as verl's SAFETY_BOUND.
"""


def _peers() -> list[str]:
    rows = ["| peer | version | checked by | definitions in | the suite writes under its names |",
            "|---|---|---|---|---|"]
    for p in peers.PEERS.values():
        how = ("running the released package" if p.how == "run"
               else "reading the source at this commit")
        rows.append(f"| {p.name} | `{p.version}` | {how} | {p.where} | {p.written or 'nothing'} |")
    return rows


def _cell(m: peers.Metric, peer: str) -> str:
    parts = []
    for c in m.counterparts:
        if c.peer != peer:
            continue
        mark = "=" if c.relation == "identical" else ("~" if c.relation != "other" else "vs")
        rel = "" if c.relation == "identical" else f" ({c.relation})"
        level = f" [{c.level}]" if c.level else ""
        parts.append(f"{mark} `{c.name}`{rel}{level}")
    return "<br>".join(parts) or "-"


def _metrics() -> list[str]:
    head = "| suite key | formula | " + " | ".join(f"{p} {peers.PEERS[p].version[:12]}"
                                                   for p in COLUMNS) + " |"
    rows = [head, "|---|---|" + "---|" * len(COLUMNS)]
    for m in peers.METRICS:
        formula = m.formula.replace("|", "\\|")  # a table cell
        rows.append(f"| `{m.key}` | {formula} | " + " | ".join(_cell(m, p) for p in COLUMNS) + " |")
    return rows


def render() -> str:
    out = [INTRO, "## Peers", "", *_peers(), "", "## The metrics", "",
           "`[token]` / `[sequence]`: the relation holds for corrections at that level (the IS "
           "diagnostics).", "",
           *_metrics(), "", "## Relations", "", "| relation | what differs |", "|---|---|",
           *[f"| `{k}` | {v} |" for k, v in peers.RELATIONS.items()], "", "## Notes", ""]
    out += [f"- `{m.key}` vs {c.peer} `{c.name}`: {c.note}." for m in peers.METRICS
            for c in m.counterparts if c.note]
    out += ["", "## An empty batch", "", "No response token in the whole batch "
                                         "(tests/test_conformance.py checks "
            "each line on the peers' code):", ""]
    out += [f"- {who}: {what}." for who, what in peers.EMPTY_BATCH.items()]
    out += ["", "## The same weights in the peers", "",
            "Each suite correction and the peer settings that apply the same weight to every "
            "response token (compared weight by weight in tests/test_conformance.py, threshold C = "
            "3):", "",
            "| suite correction | verl | TRL |", "|---|---|---|"]
    out += [f"| `{k}` | {v.get('verl', '-')} | {v.get('TRL', '-')} |"
            for k, v in peers.CORRECTION_PEERS.items()]
    out += ["", "## Peer keys without a suite counterpart", ""]
    out += [f"- {peer} `{name}`: {why}." for peer, names in peers.UNMATCHED.items()
            for name, why in names.items()]
    return "\n".join(out) + "\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m suite.analysis.metrics_doc",
                                description=__doc__.split("\n\n")[0])
    p.add_argument("--write", action="store_true", help=f"write {DOC}")
    p.add_argument("--check", action="store_true", help=f"exit 1 if {DOC} is not what the table "
                                                        "gives")
    ns = p.parse_args(argv)
    text = render()
    if ns.write:
        atomic_write_text(refuse_installed(DOC, "metrics_doc --write"), text)
    elif ns.check:
        if not DOC.is_file() or DOC.read_text() != text:
            print(f"{DOC} is out of date: run python -m suite.analysis.metrics_doc --write",
                  file=sys.stderr)
            return 1
    else:
        sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
