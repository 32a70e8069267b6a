"""Report figures (matplotlib Agg + seaborn): training curves across seeds, mismatch, loss scale.

Every function takes plain data and writes `<stem>.png` (and `<stem>.svg` inside `vectors()`);
nothing here reads result files (suite/analysis/report.py does) or knows the verdict rule. A
*series* is one run's per-step values of one metric:

    {"task", "algorithm", "precision", "seed", "complete": bool, "steps": [int], "values": [float]}

Curves are the trailing mean over `window` steps (the verdict rule's acc_t, so a reward
curve's maximum is the run's peak). Per panel and precision flow: each seed faint (dotted
when the run is incomplete or failed), the mean over the *complete* seeds as a solid line,
and a 95% bootstrap band over those seeds (suite.analysis.stats.bootstrap_band). Colours follow the
precision flow, in the order given by the caller, identically in every figure.

Files are byte-stable for the same inputs (SVG ids salted with a constant, no dates), so a
report is a pure function of the results it reads. A PNG is stored with a 256-colour palette
(`compact_png`): a third of the bytes of matplotlib's RGBA with no visible change, which is what
lets the committed reports travel with the checkout. SVGs are opt-in (`suite report --svg`).
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
import io
import textwrap
from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # files only, never a window; must precede pyplot

import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import seaborn as sns  # noqa: E402
from matplotlib.ticker import MaxNLocator  # noqa: E402

from suite.analysis.stats import bootstrap_band, trailing_mean  # noqa: E402

PANEL_W, PANEL_H = 4.6, 3.1  # inches per panel; 1400 px pages show three panels a row readably
DPI = 110
RC = {"svg.hashsalt": "suite-report", "svg.fonttype": "none", "axes.titlesize": 10,
      "axes.labelsize": 9, "xtick.labelsize": 8, "ytick.labelsize": 8, "legend.fontsize": 8}


def flow_colors(flows: list[str]) -> dict[str, tuple]:
    """A fixed colour per precision flow, by position in `flows` (seaborn's colour-blind palette;
    past its ten colours, which it would repeat, the dark palette's, so an eleventh series never
    takes the first's colour)."""
    palette = sns.color_palette("colorblind", 10) + sns.color_palette("dark", 10)
    palette += sns.color_palette("husl", max(0, len(flows) - len(palette)))
    return {f: palette[i] for i, f in enumerate(flows)}


# A line style per flow as well: the colour-blind palette still puts orange, vermillion and two
# pinks among the bf16 family, so each flow's mean curve also differs in its dashes (and in print).
LINE_STYLES = ("-", (0, (6, 2)), (0, (1, 1.2)), (0, (6, 2, 1, 2)), (0, (3, 1.5)),
               (0, (8, 2, 1, 2, 1, 2)), (0, (2, 2.5)), (0, (10, 3)), (0, (4, 1, 1, 1)), (0, (1, 3)))


def flow_style(flow: str, colors: dict) -> object:
    """The line style of `flow`: by its position among the flows that `colors` holds
    (flow_colors)."""
    return LINE_STYLES[list(colors).index(flow) % len(LINE_STYLES)]


# Whether save() also writes an SVG: vector figures are for reading a report locally (suite report
# --svg); the committed reports carry PNGs only, which a checkout must be small enough to copy to a
# borrowed machine.
_SVG = contextvars.ContextVar("svg", default=False)


@contextlib.contextmanager
def vectors(on: bool = True):
    """Inside this block save() writes `stem`.svg beside `stem`.png (when `on`)."""
    token = _SVG.set(on)
    try:
        yield
    finally:
        _SVG.reset(token)


def compact_png(png: bytes) -> bytes:
    """An opaque RGBA PNG (matplotlib's) as an 8-bit palette PNG, the same bytes for the same input.

    About a third of the bytes. Median cut keeps the white background and the flow colours exact;
    what moves are anti-aliased edges and overlapping translucent bands, each to its nearest of 256
    colours (on the densest mismatch grid 89% of pixels are exact, 1.5% are off by more than 8
    levels of 255, none by more than 34, which no one sees). Dithering is off: it would speckle flat
    areas and cost bytes. FASTOCTREE greys the background. A PNG with transparency, or one already
    paletted (a second pass), is returned unchanged.
    """
    from PIL import Image

    image = Image.open(io.BytesIO(png))
    if image.mode == "P" or (image.mode == "RGBA" and image.getextrema()[3][0] < 255):
        return png
    palette = image.convert("RGB").quantize(256, method=Image.Quantize.MEDIANCUT,
                                            dither=Image.Dither.NONE)
    out = io.BytesIO()
    # no text chunks, no time: nothing but the pixels
    palette.save(out, format="PNG", optimize=True)
    return out.getvalue()


def save(fig, stem: Path) -> list[str]:
    """Write `stem`.png (a palette PNG, compact_png) and, inside vectors(), `stem`.svg; return their
    file names."""
    stem = Path(stem)
    stem.parent.mkdir(parents=True, exist_ok=True)
    rgba = io.BytesIO()
    fig.savefig(rgba, format="png", dpi=DPI, metadata={"Software": None})
    stem.with_suffix(".png").write_bytes(compact_png(rgba.getvalue()))
    names = [stem.name + ".png"]
    if _SVG.get():
        fig.savefig(stem.with_suffix(".svg"), metadata={"Date": None, "Creator": None})
        names.append(stem.name + ".svg")
    plt.close(fig)
    return names


def _styled(fn):
    """Run a figure function under one style (whitegrid, the RC sizes, the SVG salt), restoring the
    caller's matplotlib state afterwards: text and the saved files pick up rcParams when created."""
    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        with sns.axes_style("whitegrid"), plt.rc_context(RC):
            return fn(*args, **kwargs)
    return wrapper


def _grid(n_rows: int, n_cols: int):
    # At least 7.5 in wide: a single panel would otherwise print its notes in a 500 px image.
    return plt.subplots(n_rows, n_cols,
                        figsize=(max(7.5, PANEL_W * n_cols), PANEL_H * n_rows + 0.8), squeeze=False,
                        constrained_layout=True)


def _positive(y: np.ndarray) -> tuple[np.ndarray, bool]:
    """y with values <= 0 set to NaN (a log axis cannot show them) and whether any were dropped."""
    bad = np.isfinite(y) & (y <= 0)
    return np.where(bad, np.nan, y), bool(bad.any())


def _panel(ax, series: list[dict], colors: dict, window: int, log: bool) -> bool:
    """Draw one panel's seeds, means and bands; return whether values <= 0 were hidden (log
    axis)."""
    if log:
        ax.set_yscale("log")
    hidden, smoothed = False, []
    for s in series:
        # min(window, n) as in summarize: a run that died before `window` steps still shows.
        y = trailing_mean(s["values"], max(1, min(window, len(s["values"]))))
        if log:
            y, h = _positive(y)
            hidden |= h
        smoothed.append(y)
    drawn = np.concatenate([y[np.isfinite(y)] for y in smoothed]) if smoothed else np.array([])
    if len(drawn) and drawn.min() == drawn.max():
        # One flat value: fix a range before drawing, or autoscaling warns about singular limits.
        v = float(drawn[0])
        ax.set_ylim(v / 3,
                    v * 3) if log else ax.set_ylim(v - 0.5 * (abs(v) or 1), v + 0.5 * (abs(v) or 1))
        ax.set_autoscaley_on(False)
    for flow in [f for f in colors if any(s["precision"] == f for s in series)]:
        smooth = []
        for s, y in zip(series, smoothed):
            if s["precision"] != flow:
                continue
            ax.plot(s["steps"], y, color=colors[flow], lw=0.8, alpha=0.35, ls="-" if s["complete"]
                    else ":")
            if s["complete"]:
                smooth.append(dict(zip(s["steps"], y)))
        if not smooth:
            continue
        steps = sorted(set.intersection(*(set(d) for d in smooth)))
        curves = np.array([[d[t] for t in steps] for d in smooth])  # (S, T)
        with np.errstate(invalid="ignore"):
            mean = curves.mean(axis=0)
            lo, hi = bootstrap_band(curves)
        ax.plot(steps, mean, color=colors[flow], lw=1.9, ls=flow_style(flow, colors),
                label=f"{flow} (n={len(smooth)})")
        if len(smooth) > 1:
            ax.fill_between(steps, lo, hi, color=colors[flow], alpha=0.18, lw=0)
    return hidden


def _labelled_panel(ax, series: list[dict], colors: dict, window: int, log: bool, title: str,
                    ylabel: str) -> None:
    """`_panel` plus the title, axis labels and, on a log axis, a note when values <= 0 were
    hidden."""
    hidden = _panel(ax, series, colors, window, log=log)
    ax.set_title(title)
    ax.set_xlabel("RL step")
    ax.set_ylabel(ylabel)
    if hidden:
        ax.text(0.99, 0.02, "values <= 0 not drawn (log axis)", transform=ax.transAxes, ha="right",
                va="bottom", fontsize=7, color="0.35")


def _note(fig, text: str, n_cols: int) -> None:
    """A grey note above the panels, wrapped to the figure's width (~90 characters per 4.6 in
    panel)."""
    fig.suptitle(textwrap.fill(text, width=max(110, 90 * n_cols)), fontsize=8, color="0.35")


def _legend(fig, axes, note: str) -> None:
    handles, labels = {}, []
    for ax in axes.flat:
        for h, lab in zip(*ax.get_legend_handles_labels()):
            flow = lab.split(" (")[0]
            if flow not in handles:
                handles[flow] = h
                labels.append(flow)
    if handles:
        fig.legend([handles[lab] for lab in labels], labels, loc="outside lower center",
                   ncol=min(len(labels), 8), title="precision flow", frameon=False)
    _note(fig, note, axes.shape[1])


NOTE = ("trailing mean over {w} steps; bold line (one style per flow): mean of complete seeds, "
        "band: 95% bootstrap CI over seeds, faint: individual seeds (dotted: incomplete or failed)")


@_styled
def reward_curves(series: list[dict], flows: list[str], stem: Path, window: int,
                  thresholds: dict[str, float]) -> list[str]:
    """Training accuracy (reward/mean): one row per task, one panel per algorithm; dashed line at
    the pass threshold."""
    tasks = sorted({s["task"] for s in series})
    algos = sorted({s["algorithm"] for s in series})
    colors = flow_colors(flows)
    fig, axes = _grid(len(tasks), len(algos))
    for i, task in enumerate(tasks):
        for j, algo in enumerate(algos):
            ax = axes[i, j]
            panel = [s for s in series if s["task"] == task and s["algorithm"] == algo]
            _panel(ax, panel, colors, window, log=False)
            if task in thresholds:
                ax.axhline(thresholds[task], color="0.3", ls="--", lw=0.9)
                # keep the threshold in view even when the curves sit far below it
                lo, hi = ax.get_ylim()
                ax.set_ylim(min(lo, thresholds[task] - 0.05), max(hi, thresholds[task] + 0.02))
            ax.set_title(f"{task} / {algo}" if panel else f"{task} / {algo} (no runs)")
            ax.set_xlabel("RL step")
            ax.set_ylabel("training accuracy (reward/mean)")
    _legend(fig, axes, NOTE.format(w=window) + "; dashed: pass threshold")
    return save(fig, stem)


@_styled
def metric_grid(series_by_metric: dict[str, list[dict]], labels: dict[str, str], flows: list[str],
                stem: Path, window: int, log: bool = True) -> list[str]:
    """One row per (task, algorithm), one column per metric; e.g. mismatch on a log axis."""
    metrics = list(series_by_metric)
    rows = sorted({(s["task"], s["algorithm"]) for ss in series_by_metric.values() for s in ss})
    colors = flow_colors(flows)
    fig, axes = _grid(max(1, len(rows)), len(metrics))
    for i, (task, algo) in enumerate(rows):
        for j, key in enumerate(metrics):
            ax = axes[i, j]
            panel = [s for s in series_by_metric[key] if s["task"] == task
                     and s["algorithm"] == algo]
            _labelled_panel(ax, panel, colors, window, log, f"{task} / {algo}: "
                                                            f"{labels.get(key, key)}", key)
    _legend(fig, axes, NOTE.format(w=window) + ("; log axis" if log else ""))
    return save(fig, stem)


@_styled
def panels(series_by_panel: dict[str, list[dict]], flows: list[str], stem: Path, window: int,
           ylabel: str, log: bool = False, hline: float | None = None,
           n_cols: int = 3) -> list[str]:
    """One panel per key (e.g. per regime of a search), `n_cols` a row; curves as in every figure
    here."""
    names = list(series_by_panel)
    n_rows = max(1, -(-len(names) // n_cols))
    colors = flow_colors(flows)
    fig, axes = _grid(n_rows, min(n_cols, max(1, len(names))))
    for ax in axes.flat[len(names):]:
        ax.set_visible(False)
    for ax, name in zip(axes.flat, names):
        _labelled_panel(ax, series_by_panel[name], colors, window, log, name, ylabel)
        if hline is not None:
            ax.axhline(hline, color="0.3", ls="--", lw=0.9)
    _legend(fig, axes, NOTE.format(w=window) + ("; log axis" if log else ""))
    return save(fig, stem)


@_styled
def step0_bars(points: list[dict], labels: dict[str, str], flows: list[str],
               stem: Path) -> list[str]:
    """Step-0 mismatch by precision flow: bars = mean over runs, dots = runs; one panel per metric,
    log axis.

    points: {"precision", "metric", "value"}, one per run and metric. A flow whose values
    are all 0 (e.g. `exact`) cannot be drawn on a log axis and is labelled "= 0" instead.
    """
    metrics = list(labels)
    present = [f for f in flows if any(p["precision"] == f for p in points)]
    colors = flow_colors(flows)
    fig, axes = _grid(1, len(metrics))
    for j, key in enumerate(metrics):
        ax = axes[0, j]
        for x, flow in enumerate(present):
            vals = np.array([p["value"] for p in points if p["precision"] == flow
                             and p["metric"] == key], float)
            vals = vals[np.isfinite(vals)]
            if not len(vals):
                continue
            pos = vals[vals > 0]
            if len(pos):
                ax.bar(x, vals.mean() if vals.mean() > 0 else pos.min(), color=colors[flow],
                       alpha=0.75, width=0.7)
                ax.scatter(np.full(len(pos), x), pos, color="0.15", s=12, zorder=3)
            if (vals <= 0).any():
                ax.text(x, 0.02, "= 0" if not len(pos) else "some 0",
                        transform=ax.get_xaxis_transform(), ha="center", fontsize=8, color="0.3")
        ax.set_yscale("log")
        ax.set_xticks(range(len(present)), present, rotation=30, ha="right")
        ax.set_title(f"step-0 {labels[key]}")
        ax.set_ylabel(key)
    _note(fig, "before any update, same policy: bars = mean over runs (all algorithms and seeds), "
               "dots = runs; "
          "log axis", len(metrics))
    return save(fig, stem)


@_styled
def loss_scale(series: list[dict], stem: Path) -> list[str]:
    """fp16 dynamic loss scaling: the scale (log2 axis) and the cumulative skipped steps, one line
    per run.

    series: as above with `values` = train/loss_scale and an extra `skipped` list
    (train/skipped_steps, cumulative, may hold None).
    """
    fig, axes = _grid(1, 2)
    palette = sns.color_palette("colorblind", max(10, len(series)))
    for k, s in enumerate(series):
        label = (f"{s['task']}/{s['algorithm']}/{s['precision']} s{s['seed']}"
                 + ("" if s["complete"] else " (incomplete)"))
        ls = "-" if s["complete"] else ":"
        lw = max(0.8, 2.6 - 0.5 * k)  # later runs thinner, so identical trajectories stay visible
        axes[0, 0].step(s["steps"], s["values"], where="post", color=palette[k], lw=lw, ls=ls,
                        label=label)
        skipped = [np.nan if v is None else v for v in s["skipped"]]
        axes[0, 1].step(s["steps"], skipped, where="post", color=palette[k], lw=lw, ls=ls,
                        label=label)
    axes[0, 0].set_yscale("log", base=2)
    axes[0, 0].set_title("loss scale (dynamic, GradScaler)")
    axes[0, 0].set_ylabel("train/loss_scale")
    axes[0, 1].set_title("skipped optimizer steps (inf/NaN gradients), cumulative")
    axes[0, 1].set_ylabel("train/skipped_steps")
    top = max([v for s in series for v in s["skipped"] if v is not None], default=0)
    # a count: from 0, never a +-0.04 axis
    axes[0, 1].set_ylim(-0.05 * max(1, top), 1.1 * max(1, top))
    axes[0, 1].yaxis.set_major_locator(MaxNLocator(integer=True))
    for ax in axes.flat:
        ax.set_xlabel("RL step")
    axes[0, 1].legend(loc="upper left", fontsize=7, frameon=False)
    return save(fig, stem)


@_styled
def dose_response(curves: dict[str, list[dict]], real: list[dict], stem: Path,
                  threshold: float = 0.95) -> list[str]:
    """Final training accuracy against the measured step-0 mismatch (k3 KL, log axis).

    curves: kind -> points {"x": [per-seed k3], "y": [per-seed final acc], "label"} of one injected
    magnitude, drawn as seed dots, the mean, and a line through the means; real: {"label", "x":
    [...], "y": [...]} of the real precision flows, drawn as labelled diamonds at their own measured
    mismatch (and a 0 k3 at the left edge).
    """
    fig, ax = plt.subplots(figsize=(7.5, 4.6), constrained_layout=True)
    palette = sns.color_palette("colorblind", 10)
    xs = [v for pts in curves.values() for p in pts
          for v in p["x"]] + [v for p in real for v in p["x"]]
    pos = [v for v in xs if v > 0]
    # where a mismatch of exactly 0 (exact) is drawn, apart from the rest
    floor = min(pos) / 30 if pos else 1e-12
    for i, (kind, pts) in enumerate(curves.items()):
        mx = [max(float(np.mean(p["x"])), floor) for p in pts]
        my = [float(np.mean(p["y"])) for p in pts]
        for p in pts:
            ax.scatter(np.maximum(p["x"], floor), p["y"], color=palette[i], s=10, alpha=0.45)
        ax.plot(mx, my, "-o", color=palette[i], lw=1.4, ms=5, label=f"fp32 + {kind}")
        for p, x, y in zip(pts, mx, my):
            ax.annotate(p["label"], (x, y), textcoords="offset points", xytext=(4, -10), fontsize=7,
                        color=palette[i])
    # Real flows sit close together: labels go on staggered leader lines, below the points, in x
    # order.
    order = sorted(range(len(real)), key=lambda j: float(np.mean(real[j]["x"])))
    for n, j in enumerate(order):
        p = real[j]
        x, y = max(float(np.mean(p["x"])), floor), float(np.mean(p["y"]))
        ax.scatter(np.maximum(p["x"], floor), p["y"], color="0.2", marker="d", s=12, alpha=0.4)
        ax.scatter([x], [y], color="0.1", marker="D", s=34, zorder=4)
        label = p["label"] + (" (k3 = 0)" if float(np.mean(p["x"])) <= 0 else "")
        ax.annotate(label, (x, y), textcoords="offset points", xytext=(-4, -22 - 13 * (n % 4)),
                    fontsize=7.5, ha="center",
                    arrowprops={"arrowstyle": "-", "color": "0.5", "lw": 0.6})
    ax.axhline(threshold, color="0.3", ls="--", lw=0.9)
    ax.set_xscale("log")
    ax.set_xlabel("step-0 mismatch, k3 KL(sampler || trainer), measured by each run (log axis)")
    ax.set_ylabel("final training accuracy")
    ax.legend(loc="lower left", fontsize=8)
    ax.set_title("dose-response: sanity-test outcome against the mismatch", fontsize=10)
    return save(fig, stem)
