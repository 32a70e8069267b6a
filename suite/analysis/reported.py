"""Published precision results and framework CI thresholds, for the leaderboard's "reported"
section.

They come from ``reported.yaml`` (next to this file): each with its source, URL, the place in the
source and the number as written there. The suite did not rerun any of them, so the page marks each
one "reported, unverified" and keeps them apart from the measured boards. ``load`` refuses an entry
that lacks any of that, so an unsourced number cannot reach the page.
"""

from __future__ import annotations

from pathlib import Path

REPORTED = Path(__file__).with_name("reported.yaml")
FIELDS = ("id", "source", "url", "where", "quote", "kind", "precision", "measures", "compare")
KINDS = ("result", "threshold")
STATUS = "reported, unverified"


def load(path: Path = REPORTED) -> list[dict]:
    """The entries of ``path``, each checked and marked with STATUS; ValueError naming the entry
    otherwise."""
    import yaml

    doc = yaml.safe_load(Path(path).read_text(encoding="utf-8"))
    if not isinstance(doc, list):
        raise ValueError(f"{path}: must be a list of entries")
    out, seen = [], set()
    for n, e in enumerate(doc, start=1):
        name = e.get("id", f"entry {n}") if isinstance(e, dict) else f"entry {n}"
        if not isinstance(e, dict):
            raise ValueError(f"{path}: {name} is not a mapping")
        missing = [f for f in FIELDS if not str(e.get(f) or "").strip()]
        if missing:
            raise ValueError(f"{path}: {name} lacks {', '.join(missing)} (an unsourced number "
                             "stays out)")
        if not str(e["url"]).startswith("https://"):
            raise ValueError(f"{path}: {name}: url must be an https:// address, got {e['url']!r}")
        if e["kind"] not in KINDS:
            raise ValueError(f"{path}: {name}: kind={e['kind']!r}, allowed: {', '.join(KINDS)}")
        if e["id"] in seen:
            raise ValueError(f"{path}: id {e['id']!r} appears twice")
        seen.add(e["id"])
        out.append({**{f: str(e[f]) for f in FIELDS}, "status": STATUS})
    return out
