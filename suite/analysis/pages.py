"""The report pages: a document (the list of blocks that suite/analysis/report.py and
suite/analysis/hypotheses.py assemble; suite/analysis/render.py lists the block kinds) rendered as
one self-contained HTML page and as Markdown that say the same, and the report folder holding both,
written beside its old version and swapped in by rename so that a reader sees the old report or the
new one, never half of one. Nothing here reads runs: these functions know blocks and files only.
"""

from __future__ import annotations

import html
import os
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path

# A backslash at the end of a line joins it to the next, so the page carries these rules verbatim.
CSS = """
body{font:14px/1.45 system-ui,-apple-system,"Segoe UI",sans-serif;margin:0 auto;max-width:1500px;\
padding:0 24px 48px;color:#1d1d1f}
h1{font-size:24px;margin:24px 0 4px}h2{font-size:19px;margin:32px 0 8px;\
border-bottom:1px solid #ddd;padding-bottom:4px}
nav a{margin-right:14px}table{border-collapse:collapse;font-size:12.5px;margin:6px 0}
.scroll{overflow-x:auto}th,td{border:1px solid #d6d6d6;padding:3px 7px;text-align:left;\
vertical-align:top}
th{background:#f3f4f6}tr:nth-child(even) td{background:#fafafa}.cap{color:#555;font-size:12.5px;\
max-width:1100px}
.warn{background:#fff6e0;border:1px solid #f0c36d;padding:8px 12px 8px 28px}\
pre{background:#f6f8fa;padding:10px;
overflow-x:auto;font-size:12px}figure{margin:10px 0}\
figure img{max-width:100%;height:auto;border:1px solid #eee}
figcaption{color:#555;font-size:12.5px}
.s-pass{color:#0a7d28;font-weight:600}.s-collapse,.s-failed{color:#b3261e;font-weight:600}
.s-unstable,.s-incomplete{color:#9a6700;font-weight:600}.s-too_short,.s-at_line{color:#555}
"""
STATUS_CELLS = {"pass", "at_line", "collapse", "unstable", "too_short", "incomplete", "failed"}


def to_html(doc: list[tuple], title: str, svgs: frozenset = frozenset()) -> str:
    """A self-contained page: inline CSS, figures as relative files, every string HTML-escaped; a
    figure links its SVG only when its stem is in `svgs` (written by ``suite report --svg``)."""
    e = html.escape
    nav = " ".join(f'<a href="#{b[2]}">{e(b[1])}</a>' for b in doc if b[0] == "h")
    out = ['<!DOCTYPE html><html lang="en"><head><meta charset="utf-8">',
           '<meta name="viewport" content="width=device-width, initial-scale=1">',
           '<link rel="icon" href="data:,">',  # no favicon request (no network, no console error)
           f"<title>{e(title)}</title><style>{CSS}</style></head><body>", f"<h1>{e(title)}</h1>",
           f"<nav>{nav}</nav>"]
    for b in doc:
        kind = b[0]
        if kind == "h":
            out.append(f'<h2 id="{e(b[2])}">{e(b[1])}</h2>')
        elif kind == "p":
            out.append(f"<p>{e(b[1])}</p>")
        elif kind == "warn":
            out.append('<ul class="warn">' + "".join(f"<li>{e(w)}</li>" for w in b[1]) + "</ul>")
        elif kind == "table":
            head = "".join(f"<th>{e(h)}</th>" for h in b[1])
            body = "".join("<tr>" + "".join(
                f'<td class="s-{c}">{e(c)}</td>' if c in STATUS_CELLS else f"<td>{e(c)}</td>"
                for c in row) + "</tr>"
                for row in b[2])
            cap = f'<p class="cap">{e(b[3])}</p>'.replace("\n", "<br>") if b[3] else ""
            out.append(f'<div class="scroll"><table><thead><tr>{head}</tr></thead>'
                       f"<tbody>{body}</tbody></table></div>{cap}")
        elif kind == "fig":
            stem, cap = e(b[1]), e(b[2])
            img = f'<img src="figures/{stem}.png" alt="{cap}">'
            if b[1] in svgs:
                img, cap = (f'<a href="figures/{stem}.svg">{img}</a>',
                            f'{cap} (<a href="figures/{stem}.svg">SVG</a>)')
            out.append(f"<figure>{img}<figcaption>{cap}</figcaption></figure>")
        elif kind == "pre":
            out.append(f"<pre>{e(b[1])}</pre>")
    return "\n".join(out + ["</body></html>", ""])


def _md_cell(s: str) -> str:
    return str(s).replace("|", "\\|").replace("\n", " ")


def to_markdown(doc: list[tuple], title: str, svgs: frozenset = frozenset()) -> str:
    out = [f"# {title}", ""]
    for b in doc:
        kind = b[0]
        if kind == "h":
            out += [f"## {b[1]}", ""]
        elif kind == "p":
            out += [b[1], ""]
        elif kind == "warn":
            out += [f"- **warning:** {w}" for w in b[1]] + [""]
        elif kind == "table":
            out += ["| " + " | ".join(map(_md_cell, b[1])) + " |", "|" + "---|" * len(b[1])]
            out += ["| " + " | ".join(map(_md_cell, row)) + " |" for row in b[2]]
            out += ["", b[3], ""] if b[3] else [""]
        elif kind == "fig":
            link = f" ([SVG](figures/{b[1]}.svg))" if b[1] in svgs else ""
            out += [f"![{b[2]}](figures/{b[1]}.png)", "", b[2] + link, ""]
        elif kind == "pre":
            fence = "~~~~" if "```" in b[1] else "```"
            out += [fence, b[1], fence, ""]
    return "\n".join(out)


def write_folder(out: Path, build: Callable[[Path], tuple[list[tuple], str]]) -> Path:
    """Write a report folder (index.html, report.md, figures/ from
    ``build(figure_dir) -> (doc, title)``).

    Built in a temporary directory next to ``out``, then swapped in by rename, so readers see the
    old report or the new one. An existing ``out`` is replaced only if it is a report (holds
    index.html) or empty: ``--out`` pointed at a results directory must not erase runs.
    """
    out = Path(out)
    if out.exists() and (not out.is_dir()
                         or (any(out.iterdir()) and not (out / "index.html").is_file())):
        raise ValueError(f"--out {out} exists and is not a report folder (no index.html); refusing "
                         "to replace it")
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=out.parent, prefix=f".{out.name}.", suffix=".tmp"))
    try:
        os.chmod(tmp, 0o755)  # mkdtemp makes 0700; reports are meant to be shared like results
        doc, title = build(tmp / "figures")
        figs = tmp / "figures"
        svgs = frozenset(f.relative_to(figs).with_suffix("").as_posix()
                         for f in figs.glob("**/*.svg"))
        (tmp / "index.html").write_text(to_html(doc, title, svgs), encoding="utf-8")
        (tmp / "report.md").write_text(to_markdown(doc, title, svgs), encoding="utf-8")
        old = None
        if out.exists():
            old = out.with_name(f".{out.name}.old-{os.getpid()}")
            os.rename(out, old)
        os.rename(tmp, out)
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return out
