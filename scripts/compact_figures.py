"""Store the committed report figures as `suite report` writes them today: palette PNGs, no SVGs.

    python scripts/compact_figures.py [--dry-run]

`suite report` (suite/analysis/figures.py ``save``) writes each PNG through ``compact_png``
(256-colour palette, about a third of the bytes) and an SVG only with ``--svg``. Reports committed
before that carry matplotlib's RGBA PNGs and an SVG beside each. Regenerating them would also
refresh text that newer code words differently, so this converts the files in place instead, with
the very function ``save`` uses:

- every tracked PNG under results/ is replaced by ``compact_png`` of its bytes (the bytes a
regeneration writes
  when matplotlib draws the same pixels; a PNG already paletted is left as it is);
- every tracked SVG under a report's ``figures/`` is removed;
- every report page (``index.html``, ``report.md``) loses the links to SVGs that no longer exist,
rendered as
  suite/analysis/pages.py renders a figure without one.

A second run changes nothing.
"""
from __future__ import annotations

import argparse
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # this checkout's suite/, also when another one is installed

from suite.analysis.figures import compact_png  # noqa: E402
from suite.results import atomic_write_bytes, atomic_write_text  # noqa: E402

# A figure's SVG links as pages.to_html and pages.to_markdown wrote them; group "stem" names the
# figure.
HTML_IMAGE_LINK = re.compile(r'<a href="figures/(?P<stem>[^"]+)\.svg">(?P<img><img '
                             r'src="figures/(?P=stem)\.png" alt="[^"]*">)</a>')
HTML_CAPTION_LINK = re.compile(r' \(<a href="figures/(?P<stem>[^"]+)\.svg">SVG</a>\)')
MD_CAPTION_LINK = re.compile(r" \(\[SVG\]\(figures/(?P<stem>[^)]+)\.svg\)\)")


def tracked(repo: Path, *patterns: str) -> list[Path]:
    out = subprocess.run(["git", "-C", str(repo), "ls-files", "-z", "--", *patterns], check=True,
                         capture_output=True).stdout
    return [repo / p for p in out.decode().split("\0") if p]


def unlink_svgs(text: str, has_svg) -> str:
    """`text` (a report page) without the links to the SVGs of the stems for which `has_svg(stem)`
    is false."""
    def drop(keep: str):
        return lambda m: m[0] if has_svg(m["stem"]) else (m[keep] if keep else "")

    text = HTML_IMAGE_LINK.sub(drop("img"), text)
    text = HTML_CAPTION_LINK.sub(drop(""), text)
    return MD_CAPTION_LINK.sub(drop(""), text)


def compact(repo: Path, dry_run: bool = False, say=print) -> dict:
    """Convert the PNGs, remove the SVGs, fix the pages; what was done, in bytes and files."""
    done = {"png": 0, "png_before": 0, "png_after": 0, "svg": 0, "svg_bytes": 0, "pages": 0}
    for png in tracked(repo, "results/*.png"):
        data = png.read_bytes()
        small = compact_png(data)
        done["png_before"] += len(data)
        done["png_after"] += len(small)
        if small != data:
            done["png"] += 1
            if not dry_run:
                atomic_write_bytes(png, small)
    removed = {svg for svg in tracked(repo, "results/*/figures/*.svg") if svg.is_file()}
    for svg in sorted(removed):
        done["svg"] += 1
        done["svg_bytes"] += svg.stat().st_size
        if not dry_run:
            svg.unlink()
    for page in tracked(repo, "results/*index.html", "results/*report.md"):
        text = page.read_text(encoding="utf-8")
        figs = page.parent / "figures"
        fixed = unlink_svgs(text, lambda stem: (f := figs / f"{stem}.svg") not in removed
                            and f.is_file())
        if fixed != text:
            done["pages"] += 1
            if not dry_run:
                atomic_write_text(page, fixed)
    mib = 1 << 20
    say(f"{done['png']} PNGs converted ({done['png_before'] / mib:.1f} -> "
        f"{done['png_after'] / mib:.1f} MiB), {done['svg']} SVGs removed "
        f"({done['svg_bytes'] / mib:.1f} MiB), {done['pages']} pages unlinked"
        + (" (dry run: nothing written)" if dry_run else ""))
    return done


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--dry-run", action="store_true", help="say what would change, write nothing")
    ns = p.parse_args(argv)
    compact(ROOT, ns.dry_run)
    return 0


if __name__ == "__main__":
    sys.exit(main())
