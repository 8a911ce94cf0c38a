"""The visual report's charts, drawn by matplotlib and returned as inline SVG text.

Why SVG through matplotlib's object API (no pyplot): the page must open from disk with no
script or server, stay sharp when zoomed, and be built from a background thread; pyplot's
global state is neither needed nor thread-safe. The SVG is made small for a page holding
hundreds of charts: text stays text (``svg.fonttype: none``), coordinates keep one decimal,
and the XML prologue and metadata are dropped.
"""
from __future__ import annotations

import io
import math
import re
from collections.abc import Sequence
from typing import Any, Optional

try:  # the report is written without charts where matplotlib is missing
    from matplotlib import rc_context
    from matplotlib.ticker import FuncFormatter, LogLocator, MaxNLocator, NullLocator
except ImportError:  # pragma: no cover - exercised by monkeypatching ``available``
    rc_context = None  # type: ignore[assignment]

#: matplotlib settings of every chart (applied with ``rc_context``)
RC: Any = {"svg.fonttype": "none", "font.family": "sans-serif", "font.sans-serif": ["DejaVu Sans"],
      "svg.hashsalt": "amct-report", "path.simplify": True,
      "font.size": 7.5, "axes.titlesize": 8, "axes.labelsize": 7.5, "xtick.labelsize": 6.5,
      "ytick.labelsize": 6.5, "legend.fontsize": 6.5, "axes.spines.top": False,
      "axes.spines.right": False, "figure.dpi": 72, "savefig.dpi": 72}
_GEOMETRY = re.compile(r'\b(d|x|y|x1|x2|y1|y2|width|height|transform|points)="([^"]*)"')
_DECIMAL = re.compile(r"-?\d+\.\d+(?:e-?\d+)?")
_LINES_ONLY = re.compile(r"[-\d .MLz]*")
#: the ids matplotlib gives every group (only clip paths and markers, p… and m…, are referred to)
_IDS = re.compile(r' id="(?:figure|axes|patch|line2d|text|xtick|ytick|matplotlib\.axis|legend'
                  r'|[A-Za-z]+Collection)_\d+"')
FLOAT_COLOR, BAD_COLOR, OK_COLOR, CLIP_COLOR = "#9e9e9e", "#d62728", "#1f77b4", "#ff7f0e"


def available() -> bool:
    """matplotlib can be imported (the report is written without charts otherwise)."""
    return rc_context is not None


def _figure(width: float, height: float, panels: int = 1, **adjust: float) -> tuple[Any, list]:
    """A figure of ``panels`` axes side by side (or stacked with ``rows``), fixed margins (a
    layout engine measures every text: most of a small chart's time)."""
    from matplotlib.figure import Figure

    rows = int(adjust.pop("rows", 1))
    fig = Figure(figsize=(width, height))
    fig.subplots_adjust(**{"left": 0.1, "right": 0.98, "top": 0.95, "bottom": 0.2, "wspace": 0.3, **adjust})
    axes = fig.subplots(rows, panels, squeeze=False).ravel().tolist()
    for ax in axes:
        ax.xaxis.set_major_locator(MaxNLocator(5))
        ax.yaxis.set_minor_locator(NullLocator())
    return fig, axes


def _log_y(ax: Any) -> None:
    """A log y axis with a few plain labels (the default's math text is most of a chart's time)."""
    ax.set_yscale("log")
    ax.yaxis.set_major_locator(LogLocator(numticks=4))
    ax.yaxis.set_minor_locator(NullLocator())
    ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:.0e}".replace("e+0", "e")))


def _svg(fig: Any) -> str:
    """``fig`` as a compact ``<svg>`` element (no prologue, metadata, ids nothing refers to,
    or long decimals)."""
    buf = io.StringIO()
    fig.savefig(buf, format="svg", metadata={"Date": None, "Creator": None, "Format": None,
                                              "Type": None})
    text = buf.getvalue()
    text = text[text.index("<svg"):]
    text = re.sub(r"<metadata>.*?</metadata>", "", text, flags=re.S)
    text = _IDS.sub("", text)
    text = _GEOMETRY.sub(_shorten, text)
    text = text.replace("font-family: 'DejaVu Sans', sans-serif; ", "")  # the page's CSS sets it
    text = re.sub(r' transform="rotate\(-?0 [-\d.]+ [-\d.]+\)"', "", text)
    return re.sub(r">\s+<", "><", text).strip()


def _shorten(m: re.Match[str]) -> str:
    """One geometry attribute with its numbers rounded to whole points (a pixel at 72 dpi);
    a path of straight lines without its repeated ``L`` (implied after M and L in SVG)."""
    value = " ".join(_DECIMAL.sub(lambda n: str(round(float(n.group(0)))), m.group(2)).split())
    if m.group(1) == "d" and _LINES_ONLY.fullmatch(value):
        value = value.replace(" L ", " ")
    return f'{m.group(1)}="{value}"'


def error_chart(stats: Sequence[Any], floats: Sequence[str], warn: float) -> str:
    """Cosine and SQNR of every reported layer, worst first (``stats``: ``LayerStat`` rows;
    red below ``warn``), the layers kept in float (``floats``) as grey crosses at the right end."""
    n = len(stats) + len(floats)
    with rc_context(RC):
        fig, (ax_c, ax_s) = _figure(min(12.0, max(6.0, 0.09 * n + 2.0)), 3.6, rows=2, left=0.07,
                                    bottom=0.3, top=0.97, hspace=0.1)
        ax_s.sharex(ax_c)
        edges = [i - 0.5 for i in range(len(stats) + 1)]
        bad = [not s.cosine >= warn for s in stats]
        err = [1.0 - s.cosine for s in stats]
        sq = [s.sqnr_db if math.isfinite(s.sqnr_db) else 0.0 for s in stats]
        for ax, vals in ((ax_c, err), (ax_s, sq)):
            ax.stairs([0.0 if b else v for v, b in zip(vals, bad)], edges, fill=True, color=OK_COLOR)
            if any(bad):
                ax.stairs([v if b else 0.0 for v, b in zip(vals, bad)], edges, fill=True, color=BAD_COLOR)
            if floats:
                ax.plot(range(len(stats), n), [0.0] * len(floats), "x", color=FLOAT_COLOR, ms=4)
        ax_c.set_yscale("symlog", linthresh=1e-4)
        ax_c.yaxis.set_minor_locator(NullLocator())
        ax_c.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:.0e}".replace("e-0", "e-") if v else "0"))
        ax_c.axhline(1.0 - warn, color=BAD_COLOR, lw=0.8, ls="--")
        ax_c.set_ylabel("1 − cosine")
        ax_s.set_ylabel("SQNR dB")
        names = [s.layer for s in stats] + list(floats)
        step = max(1, math.ceil(n / 80))
        ax_c.tick_params(labelbottom=False)
        ax_s.set_xticks(range(0, n, step), [names[i] for i in range(0, n, step)], rotation=90)
        ax_s.set_xlim(-0.8, n - 0.2)
        return _svg(fig)


class LayerCharts:
    """Draws one chart per layer on reused figures (one per panel layout): a figure's axes and
    tick objects are most of a small chart's cost, the data artists are replaced each time.

    A chart: the histogram of the layer's input on the calibration data (``summary``:
    ``calibration.summaries.ActivationSummary``, log counts) with the clip the observer chose
    (orange), the final one when an improvement moved it (red, dashed) and a mark every 32
    codes of the int8 grid; beside it the weight range of each output channel (``weight``:
    mins, maxes, and 127·scale_w drawn as ±, orange)."""

    def __init__(self) -> None:
        self._figs: dict[tuple[bool, bool], tuple[Any, list]] = {}

    def _layout(self, hist: bool, weights: bool) -> tuple[Any, list]:
        key = (hist, weights)
        if key not in self._figs:
            panels = hist + weights
            with rc_context(RC):
                fig, axes = _figure(3.3 * panels, 1.6, panels, left=0.12 / panels, bottom=0.16)
                if hist:
                    _log_y(axes[0])
                for ax in axes:
                    ax.yaxis.set_major_locator(LogLocator(numticks=4)) if ax is axes[0] and hist \
                        else ax.yaxis.set_major_locator(MaxNLocator(4))
            self._figs[key] = (fig, axes)
        fig, axes = self._figs[key]
        for ax in axes:
            for artist in list(ax.lines) + list(ax.patches) + list(ax.collections):
                artist.remove()
        return fig, list(axes)

    def draw(self, summary: Any, final_clip: Optional[tuple[float, float]],
             weight: Optional[tuple[Sequence[float], Sequence[float], Sequence[float]]]) -> str:
        fig, axes = self._layout(summary is not None, weight is not None)
        with rc_context(RC):
            if summary is not None:
                ax = axes.pop(0)
                ax.stairs(summary.counts, summary.edges, fill=True, color=OK_COLOR)
                lo, hi = summary.clip
                ax.axvline(lo, color=CLIP_COLOR, lw=1)
                ax.axvline(hi, color=CLIP_COLOR, lw=1)
                grid = [(q - summary.offset) * summary.scale for q in range(-128, 128, 32)]
                ax.plot(grid, [0.0] * len(grid), "|", color="#333333", ms=5, transform=ax.get_xaxis_transform())
                if final_clip is not None and final_clip != (lo, hi):
                    ax.axvline(final_clip[0], color=BAD_COLOR, lw=1, ls="--")
                    ax.axvline(final_clip[1], color=BAD_COLOR, lw=1, ls="--")
                ax.relim()
                ax.autoscale_view()
            if weight is not None:
                ax = axes.pop(0)
                mins, maxes, bound = weight
                xs = list(range(len(mins)))
                ax.fill_between(xs, mins, maxes, color=OK_COLOR, step="mid", lw=0)
                ax.plot(xs, bound, color=CLIP_COLOR, lw=0.8, drawstyle="steps-mid")
                ax.plot(xs, [-b for b in bound], color=CLIP_COLOR, lw=0.8, drawstyle="steps-mid")
                ax.relim()
                ax.autoscale_view()
            return _svg(fig)
