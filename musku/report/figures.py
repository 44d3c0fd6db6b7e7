"""The report's figures, drawn with matplotlib's object API (no pyplot: no global state, no
display needed). Each function returns a :class:`matplotlib.figure.Figure`.

- :func:`knob_figure`: the SoftSKU paper's Figs. 14-18 for one knob -- the relative throughput
  of each setting against the baseline with its 95 % interval, the baseline (production) and
  stock settings marked, pruned settings (guardrails) and untested ones shown as such, the
  setting the soft SKU took starred, every decision coloured.
- :func:`softsku_figure`: Fig. 19 -- the soft SKU against production and stock, with the
  paper's gains where the paper has the service and platform.
- :class:`ComparisonPlot`: one comparison's windows on both hosts (warm-up, crossover periods
  and discarded windows shaded) and its interval narrowing over time.
- :func:`host_time_figure`: host time per knob against the paper's 5-10 h a sweep.
"""

from __future__ import annotations

import base64
import io
import math
import re
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Literal

import numpy as np
from matplotlib import rcParams
from matplotlib.figure import Figure
from matplotlib.patches import Patch
from matplotlib.ticker import MaxNLocator

from musku.domain import Decision, TimeBreakdown, format_value
from musku.report.data import (
    PAPER_GAINS,
    PAPER_HOST_HOURS,
    ReportData,
    Series,
    running_interval,
)
from musku.text import TIME_WORDS

if TYPE_CHECKING:
    from matplotlib.axes import Axes

COLOURS = {
    Decision.BETTER: "#1a9850",
    Decision.WORSE: "#d73027",
    Decision.NO_DIFFERENCE: "#8c8c8c",
    Decision.INCONCLUSIVE: "#9e6ebd",
    Decision.NOT_BETTER: "#b8a88a",
    Decision.GUARDRAIL: "#d73027",
    Decision.ABORTED: "#bbbbbb",
}
HOST_COLOURS = ("#2c7bb6", "#fdae61")
SIDES = ("#2c7bb6", "#e66101")  # experiments side by side (--compare)
SIDE_MARKERS = ("o", "s")  # --compare: the left run's settings as dots, the right's as squares


def mark_name(marker: str) -> str:
    return {"o": "dots", "s": "squares"}.get(marker, marker)


def _figure(w: float, h: float, *, layout: Literal["constrained"] | None = "constrained") -> Figure:
    rcParams["svg.fonttype"] = "none"  # SVG text as text: small files, fast to write
    rcParams["svg.hashsalt"] = "musku"  # stable ids: the same data gives the same file
    return Figure(figsize=(w, h), layout=layout)


def _style(ax: Axes) -> None:
    ax.spines[["top", "right"]].set_visible(False)
    ax.grid(axis="y", color="#e6e6e6", linewidth=0.8)
    ax.set_axisbelow(True)


PNG_DPI = 200
"""PNG figures' resolution: sharp on slides and printed."""

_PATH = re.compile(rb'( d="[^"]*")')
_DECIMALS = re.compile(rb"(\.\d)\d+")


def compact_svg(data: bytes) -> bytes:
    """An SVG's path coordinates to 0.1 pt, one line each: the same drawing in about half the
    bytes (matplotlib writes six decimals and a line per vertex)."""
    return _PATH.sub(
        lambda m: _DECIMALS.sub(rb"\1", m.group(1)).replace(b" \n", b" ").replace(b"\n", b" "),
        data,
    )


def render(fig: Figure, fmt: str, dpi: int = PNG_DPI) -> bytes:
    """The figure as ``fmt`` bytes: compacted SVG, or PNG at ``dpi``."""
    buf = io.BytesIO()
    fig.savefig(buf, format=fmt, dpi=dpi if fmt == "png" else None, metadata=_metadata(fmt))
    data = buf.getvalue()
    return compact_svg(data) if fmt == "svg" else data


def encode(fig: Figure, fmt: str) -> str:
    """A ``data:`` URI of the figure as SVG or PNG (for an ``<img src>``)."""
    mime = "image/svg+xml" if fmt == "svg" else "image/png"
    return f"data:{mime};base64,{base64.b64encode(render(fig, fmt)).decode('ascii')}"


def _metadata(fmt: str) -> dict[str, Any]:
    # reproducible files: no creation date in SVG/PNG
    return {"Date": None} if fmt == "svg" else {"Software": None}


def _pct(x: float) -> float:
    return 100.0 * x


def _clip(v: float, lim: float) -> float:
    return max(-lim, min(lim, v)) if math.isfinite(v) else math.copysign(lim, v)


def knob_figure(knob: str, sides: Sequence[ReportData]) -> Figure:
    """Relative throughput per setting of ``knob``; one series per experiment in ``sides``."""
    first = sides[0]
    settings: list[Any] = []
    for d in sides:
        for v in d.space.get(knob, []):
            if v not in settings:
                settings.append(v)
    labels = [format_value(knob, v) for v in settings]
    x_of = {json_key(v): i for i, v in enumerate(settings)}
    w = max(5.0, 0.7 * len(settings) + 3.4)
    fig = _figure(w, 3.1, layout=None)  # fixed margins: constrained layout draws twice
    fig.subplots_adjust(left=0.75 / w, right=1 - 2.0 / w, bottom=0.2, top=0.9)
    ax = fig.add_subplot()
    _style(ax)
    metric = first.experiment.metric
    stats = first.statistics
    m = float(stats.get("min_effect", 0.0) or 0.0)
    if m > 0:
        ax.axhspan(
            -_pct(m), _pct(m), color="#f2f2f2", zorder=0, label=f"±{_pct(m):.1f} % (no difference)"
        )
    ax.axhline(0.0, color="#555555", linewidth=0.8, zorder=1)
    finite = [
        abs(v)
        for d in sides
        for c in d.knob_comparisons(knob)
        if c.result is not None
        for v in (c.result.ci_low, c.result.ci_high, c.result.estimate)
        if math.isfinite(v)
    ]
    lim = _pct(max(finite + [0.02])) * 1.15
    width = 0.28 if len(sides) > 1 else 0.0
    seen: set[str] = set()

    def once(label: str) -> str:
        if label in seen:
            return "_nolegend_"
        seen.add(label)
        return label

    marks = SIDE_MARKERS if len(sides) > 1 else ("o",)
    swatches: dict[str, str] = {}  # --compare: decision -> its colour
    untested: dict[int, list[int]] = {}  # x -> the sides that did not test it
    for k, d in enumerate(sides):
        off = (k - (len(sides) - 1) / 2) * width
        mark = marks[k % len(marks)]
        base_value = d.baseline_config.get(knob)
        tested: set[str] = set()
        latest: dict[str, Any] = {}
        for c in d.knob_comparisons(knob):
            if c.result is not None and c.result.decision.final:
                latest[json_key(c.candidate.get(knob))] = c.result
        for key, r in latest.items():
            if key not in x_of:
                continue
            tested.add(key)
            x = x_of[key] + off
            colour = COLOURS.get(r.decision, "#444444")
            if r.decision is Decision.GUARDRAIL:
                ax.scatter(
                    [x],
                    [_clip(_pct(r.estimate), lim)],
                    marker="x",
                    s=60,
                    color=colour,
                    zorder=4,
                    label=once("pruned (guardrail)"),
                )
                continue
            lo, hi = _clip(_pct(r.ci_low), lim), _clip(_pct(r.ci_high), lim)
            y = _clip(_pct(r.estimate), lim)
            ax.errorbar(
                [x],
                [y],
                yerr=[[y - lo], [hi - y]],
                fmt=mark,
                color=colour,
                ecolor=colour,
                capsize=3,
                markersize=5,
                zorder=3,
                label="_nolegend_" if len(sides) > 1 else once(r.decision.value.replace("_", " ")),
            )
            if len(sides) > 1:  # the colour is the decision, the shape the side: a swatch
                swatches.setdefault(r.decision.value.replace("_", " "), colour)
        if base_value is not None and json_key(base_value) in x_of:
            label = (
                "production (baseline)" if d.experiment.baseline != "stock" else "stock (baseline)"
            )
            ax.scatter(
                [x_of[json_key(base_value)] + off],
                [0.0],
                marker="D",
                s=34,
                color="black",
                zorder=5,
                label=once(label),
            )
        sku = d.sku
        if sku is not None:
            best = sku.sku.configuration.get(knob)
            if (
                best is not None
                and json_key(best) in x_of
                and json_key(best) != json_key(base_value)
            ):
                r = latest.get(json_key(best))
                y = _clip(_pct(r.estimate), lim) if r is not None else 0.0
                ax.scatter(
                    [x_of[json_key(best)] + off],
                    [y],
                    marker="*",
                    s=180,
                    facecolor="none",
                    edgecolor="#b8860b",
                    linewidth=1.4,
                    zorder=6,
                    label=once("soft SKU's setting"),
                )
        for key, i in x_of.items():
            if (
                key not in tested
                and key != json_key(base_value)
                and any(json_key(v) == key for v in d.space.get(knob, []))
            ):
                untested.setdefault(i, []).append(k)
        if len(sides) > 1:
            ax.scatter(
                [],
                [],
                marker=mark,
                color="#444444",
                label=once(f"#{d.experiment.id} {d.experiment.name} ({mark_name(mark)})"),
            )
    for i, ks in untested.items():  # one label per setting, however many sides skipped it
        who = (
            ""
            if len(ks) == len(sides)
            else "\n" + ", ".join(f"#{sides[k].experiment.id}" for k in ks)
        )
        ax.text(
            i,
            -1.3 * lim,
            f"not\ntested{who}",
            ha="center",
            va="bottom",
            fontsize=7,
            color="#888888",
        )
    stock = (first.resolved.get("stock") or {}).get(knob)
    ticks = [
        f"{lab}\n(stock)" if json_key(v) == json_key(stock) else lab
        for v, lab in zip(settings, labels, strict=True)
    ]
    ax.set_xticks(range(len(settings)), ticks, fontsize=8)
    ax.set_xlim(-0.6, len(settings) - 0.4)
    ax.set_ylim(-1.35 * lim if untested else -lim, lim)  # room for "not tested" under the data
    ax.set_ylabel(f"{metric} vs baseline (%)")
    ax.set_title(
        f"{knob}: relative {metric} per setting, {int(100 * float(stats.get('confidence', 0.95)))} % intervals",
        fontsize=10,
        loc="left",
    )
    handles, names = ax.get_legend_handles_labels()
    for label, colour in swatches.items():
        handles.append(Patch(facecolor=colour, label=label))
        names.append(label)
    ax.legend(
        handles, names, fontsize=7, loc="upper left", bbox_to_anchor=(1.0, 1.0), frameon=False
    )
    return fig


def json_key(v: Any) -> str:
    """A setting as a comparable key (2.2 and 2.2 from JSON, 'off' and 'off')."""
    if isinstance(v, float) and v.is_integer():
        v = int(v)
    return repr(v)


def softsku_figure(sides: Sequence[ReportData]) -> Figure | None:
    """Fig. 19: each soft SKU against production and stock, with the paper's gains."""
    rows: list[tuple[str, Any, str]] = []
    for k, d in enumerate(sides):
        if d.sku is None:
            continue
        for against, r in (("production", d.sku.sku.vs_production), ("stock", d.sku.sku.vs_stock)):
            if r is not None:
                name = f"#{d.experiment.id} vs {against}" if len(sides) > 1 else f"vs {against}"
                rows.append(
                    (name, r, SIDES[k % 2] if len(sides) > 1 else COLOURS.get(r.decision, "#444"))
                )
    if not rows:
        return None
    papers = {
        name: (paper[1] if name.endswith("production") else paper[0])
        for k, d in enumerate(sides)
        if (paper := PAPER_GAINS.get((d.experiment.service, d.experiment.platform))) is not None
        for name, _r, _c in rows
        if len(sides) == 1 or name.startswith(f"#{d.experiment.id} ")
    }
    h = 0.75 * len(rows) + 1.6
    fig = _figure(7.4, h, layout=None)
    fig.subplots_adjust(left=0.17, right=0.97, bottom=1.05 / h, top=1 - 0.35 / h)
    ax = fig.add_subplot()
    _style(ax)
    ax.grid(axis="x", color="#e6e6e6", linewidth=0.8)
    ax.grid(axis="y", visible=False)
    ys = np.arange(len(rows))[::-1].astype(float)
    bar_h = 0.34
    for y, (name, r, colour) in zip(ys, rows, strict=True):
        lo = _pct(r.ci_low) if math.isfinite(r.ci_low) else 0.0
        hi = _pct(r.ci_high) if math.isfinite(r.ci_high) else _pct(r.estimate)
        est = _pct(r.estimate)
        ym = y + (bar_h / 2 if name in papers else 0.0)
        who = name.split(" ")[0] + " soft SKU" if len(sides) > 1 else "musku's soft SKU"
        ax.barh([ym], [est], color=colour, alpha=0.8, height=bar_h, label=who)
        ax.errorbar(
            [est],
            [ym],
            xerr=[[est - lo], [hi - est]],
            fmt="none",
            ecolor="black",
            capsize=3,
            label="its interval",
        )
        ax.text(
            max(hi, est) + 0.15,
            ym,
            f"{est:+.2f} % [{lo:+.2f}, {hi:+.2f}] {r.decision.value.replace('_', ' ')}",
            va="center",
            fontsize=7.5,
        )
        if name in papers:
            value = _pct(papers[name])
            yp = y - bar_h / 2
            ax.barh(
                [yp],
                [value],
                height=bar_h,
                facecolor="white",
                edgecolor="#b35806",
                hatch="////",
                linewidth=1.0,
                label="the paper's gain (Fig. 19)",
            )
            ax.text(
                value + 0.15,
                yp,
                f"paper {value:+.1f} %",
                va="center",
                fontsize=7.5,
                color="#b35806",
            )
    ax.axvline(0.0, color="#555555", linewidth=0.8)
    ax.set_yticks(ys, [n for n, _, _ in rows], fontsize=9)
    ax.set_ylim(-0.6, len(rows) - 0.4)
    ax.set_xlabel(f"soft SKU's {sides[0].experiment.metric} gain (%)")
    ax.set_title("Soft SKU against production and stock (paper Fig. 19)", fontsize=10, loc="left")
    ends = [_pct(r.ci_high) for _, r, _ in rows if math.isfinite(r.ci_high)]
    ends += [_pct(v) for v in papers.values()] + [4.0]
    left = min([_pct(r.ci_low) for _, r, _ in rows if math.isfinite(r.ci_low)] + [0.0])
    ax.set_xlim(min(left * 1.2, -1.0), max(ends) * 1.75)
    handles, labels = ax.get_legend_handles_labels()
    uniq = dict(zip(labels, handles, strict=True))
    fig.legend(  # framed, below the axes: never over a bar
        uniq.values(),
        uniq.keys(),
        loc="lower center",
        ncol=len(uniq),
        fontsize=8,
        frameon=True,
        bbox_to_anchor=(0.5, 0.0),
    )
    return fig


TIME_COLOURS = (
    "#1b9e77",
    "#e6ab02",
    "#7570b3",
    "#d95f02",
)  # measuring, warm-up, switching, reboots


def time_breakdown_figure(sides: Sequence[ReportData]) -> Figure | None:
    """Where each experiment's host time went (issue 31 item 5): one stacked bar per
    experiment, measuring / warm-up / switching / reboots in host hours; None when no
    comparison recorded a breakdown (rows stored before revision 0009, multi-arm rows)."""
    totals = [TimeBreakdown.total(c.result for c in d.comparisons if c.result) for d in sides]
    if all(t.total_s == 0.0 for t, _ in totals):
        return None
    h = 0.6 * len(sides) + 1.3
    fig = _figure(7.4, h, layout=None)
    fig.subplots_adjust(left=0.24, right=0.72, bottom=0.55 / h, top=1 - 0.35 / h)
    ax = fig.add_subplot()
    ax.spines[["top", "right"]].set_visible(False)
    ends: list[float] = []
    for y, (time, _) in enumerate(totals[::-1]):
        left = 0.0
        for name, secs, colour in zip(TIME_WORDS, time.seconds(), TIME_COLOURS, strict=True):
            ax.barh([y], [secs / 3600.0], left=left, color=colour, height=0.5, label=name)
            left += secs / 3600.0
        ends.append(left)
    end = max(ends) * 1.02 or 1.0
    for y, ((time, missing), total) in enumerate(zip(totals[::-1], ends, strict=True)):
        share = 100.0 * time.measuring_s / time.total_s if time.total_s else 0.0
        note = f" ({missing} without)" if missing else ""
        ax.text(end, y, f" {total:.2f} h, {share:.0f} % measuring{note}", va="center", fontsize=8)
    ax.set_xlim(0, end * 1.6)
    ax.set_yticks(
        range(len(sides)),
        [f"#{d.experiment.id} {d.experiment.name}" for d in sides[::-1]],
        fontsize=9,
    )
    ax.set_xlabel("host time (h)")
    ax.set_title("Where the host time went", fontsize=10, loc="left")
    handles, labels = ax.get_legend_handles_labels()
    uniq = dict(zip(labels, handles, strict=True))
    ax.legend(
        uniq.values(), uniq.keys(), fontsize=7, loc="upper left", bbox_to_anchor=(1.0, 1.0),
        frameon=False,
    )  # fmt: skip
    return fig


def host_time_figure(sides: Sequence[ReportData]) -> Figure:
    """Host hours per knob (stacked) for each experiment, against the paper's 5-10 h."""
    h = 0.6 * len(sides) + 1.5
    fig = _figure(7.4, h, layout=None)
    fig.subplots_adjust(left=0.24, right=0.72, bottom=0.55 / h, top=1 - 0.35 / h)
    ax = fig.add_subplot()
    ax.spines[["top", "right"]].set_visible(False)
    lo, hi = PAPER_HOST_HOURS
    # the paper's band over the bars (hatched, see-through) so a long bar never hides it
    ax.axvspan(
        lo,
        hi,
        facecolor="none",
        edgecolor="#d8a600",
        hatch="\\\\",
        linewidth=0,
        zorder=3,
        label=f"the paper: {lo:g}-{hi:g} h a sweep",
    )
    for x in (lo, hi):
        ax.axvline(x, color="#d8a600", linewidth=1.0, linestyle="--", zorder=3)
    cmap_colors = [
        "#1b9e77",
        "#d95f02",
        "#7570b3",
        "#e7298a",
        "#66a61e",
        "#e6ab02",
        "#a6761d",
        "#666666",
        "#1f78b4",
    ]
    groups: list[str] = []
    totals: list[float] = []
    for y, d in enumerate(sides[::-1]):
        per: dict[str, float] = {}
        for c in d.comparisons:
            if c.result is None:
                continue
            parts = c.purpose.split(":")
            group = parts[1] if parts[0] in ("knob", "multiarm") and len(parts) > 1 else parts[0]
            per[group] = per.get(group, 0.0) + c.result.host_time_s / 3600.0
        left = 0.0
        for group, h in per.items():
            if group not in groups:
                groups.append(group)
            colour = cmap_colors[groups.index(group) % len(cmap_colors)]
            ax.barh(
                [y],
                [h],
                left=left,
                color=colour,
                height=0.5,
                zorder=2,
                label=group if y == len(sides) - 1 or group not in groups[:-1] else "_nolegend_",
            )
            left += h
        totals.append(left)
    end = max(totals + [hi]) * 1.02
    for y, total in enumerate(totals):  # right of the bars and the band: overlaps neither
        ax.text(end, y, f" {total:.2f} h", va="center", ha="left", fontsize=9)
    ax.set_xlim(0, end * 1.18)
    ax.set_yticks(
        range(len(sides)),
        [f"#{d.experiment.id} {d.experiment.name}" for d in sides[::-1]],
        fontsize=9,
    )
    ax.set_xlabel("host time (h)")
    ax.set_title("Host time used, by knob", fontsize=10, loc="left")
    handles, labels = ax.get_legend_handles_labels()
    uniq = dict(zip(labels, handles, strict=True))
    ax.legend(
        uniq.values(),
        uniq.keys(),
        fontsize=7,
        loc="upper left",
        bbox_to_anchor=(1.0, 1.0),
        frameon=False,
    )
    return fig


LEGEND = (
    ("line", HOST_COLOURS[0], "each host's windows (colours and names in the figure)"),
    ("box", "#fdd49e", "warm-up (discarded)"),
    ("box", "#dde6f0", "periods with B on the pair's first host (roles swapped by the crossover)"),
    ("mark", "#d73027", "✕ invalid window (discarded)"),
    ("line", "#969696", "B vs A per window (binned means)"),
    ("box", "#9ecae1", "interval, recomputed from the windows"),
    ("line", "#08519c", "estimate"),
    ("mark", "black", "■ the tester's decision and interval"),
)
"""What the colours of a :class:`ComparisonPlot` mean (drawn once, in HTML)."""

POINTS = 160
"""Points per drawn trace: a comparison's windows are binned to this many means (the raw
windows stay in the DB and in ``musku results NAME --format ... --table samples``)."""

PALETTE = (
    "#2c7bb6",
    "#e66101",
    "#1b9e77",
    "#7570b3",
    "#e7298a",
    "#66a61e",
    "#a6761d",
    "#666666",
    "#1f78b4",
    "#b2182b",
    "#35978f",
    "#8073ac",
    "#c51b7d",
    "#4d9221",
    "#bf812d",
    "#000000",
)


def binned(t: np.ndarray, v: np.ndarray, points: int = POINTS) -> tuple[np.ndarray, np.ndarray]:
    """``v`` over ``t`` as at most ``points`` bin means (NaNs ignored; a bin with no value is
    NaN, so a drawn line breaks there): what the eye sees of thousands of windows, in a few
    kilobytes of SVG."""
    n = t.size
    if n <= points:
        return t, np.where(np.isfinite(v), v, np.nan)
    edges = np.linspace(0, n, points + 1).astype(int)
    ok = np.isfinite(v)
    sums = np.add.reduceat(np.where(ok, v, 0.0), edges[:-1])
    counts = np.add.reduceat(ok.astype(float), edges[:-1])
    tm = np.add.reduceat(t, edges[:-1]) / np.diff(edges)
    with np.errstate(invalid="ignore", divide="ignore"):
        return tm, np.where(counts > 0, sums / counts, np.nan)


def spans(t: np.ndarray, mask: np.ndarray, limit: int = 400) -> list[tuple[float, float]]:
    """The runs of ``mask`` as (start, end) on ``t`` (each run ends where the next window
    starts): a few rectangles instead of a fill over every window."""
    if t.size == 0 or not mask.any():
        return []
    m = mask.astype(np.int8)
    d = np.diff(np.r_[0, m, 0])
    starts, ends = np.flatnonzero(d == 1), np.flatnonzero(d == -1)
    step = float(np.median(np.diff(t))) if t.size > 1 else 1.0
    out = [
        (float(t[a]), float(t[b]) if b < t.size else float(t[-1]) + step)
        for a, b in zip(starts, ends, strict=True)
    ]
    return out[:limit]


class ComparisonPlot:
    """One comparison's figure: each host's windows (top; coloured and named, warm-up,
    crossover periods and invalid windows shaded) and B against A (bottom): the relative
    difference per window, binned, and the effect's interval over time.

    A report draws dozens of these, so the figure is built once and its artists replaced for
    each comparison (:meth:`draw`): building a matplotlib figure costs as much as drawing it.
    Series are binned to :data:`POINTS` means, so a figure is a few kilobytes of SVG whatever
    the comparison's length; text is left to the browser (SVG text, not glyph paths)."""

    def __init__(self) -> None:
        fig = _figure(7.2, 3.9, layout=None)
        fig.subplots_adjust(left=0.1, right=0.8, top=0.97, bottom=0.12, hspace=0.1)
        self.fig = fig
        self.top, self.bottom = fig.subplots(2, 1, sharex=True, height_ratios=(3, 2))
        top, bottom = self.top, self.bottom
        for ax in (top, bottom):  # few ticks, no grid: every tick and grid line is an artist
            ax.spines[["top", "right"]].set_visible(False)
            ax.tick_params(labelsize=7)
            ax.yaxis.set_major_locator(MaxNLocator(3))
        top.tick_params(bottom=False)
        bottom.xaxis.set_major_locator(MaxNLocator(5))
        bottom.axhline(0.0, color="#555555", linewidth=0.8)
        self.dynamic: list[Any] = []
        bottom.set_ylabel("B vs A (%)", fontsize=8)

    def draw(
        self,
        s: Series,
        result: Any,
        *,
        direction: float,
        confidence: float,
        min_effect: float,
        metric: str,
        fmt: str = "png",
        names: Sequence[str] = (),
        dpi: int = 200,
    ) -> bytes:
        """The figure of series ``s`` as ``fmt`` bytes; ``names`` are the run's hosts by pool
        index (the legend), ``dpi`` a PNG's resolution."""
        top, bottom = self.top, self.bottom
        for artist in self.dynamic:
            artist.remove()
        self.dynamic = []
        dyn = self.dynamic.append
        span = float(s.t[-1] - s.t[0])
        scale = 3600.0 if span > 3 * 3600 else 60.0
        t = (s.t - s.t[0]) / scale
        first_b = {
            h: bool(s.role_b[k][np.isfinite(s.value[k])][:1].any()) for k, h in enumerate(s.hosts)
        }
        for k, h in enumerate(s.hosts):
            name = names[h] if h < len(names) else f"host {h}"
            role = "B first" if first_b[h] else "A first"
            tb, vb = binned(t, s.value[k])
            (line,) = top.plot(
                tb,
                vb,
                marker="o" if np.isfinite(vb).sum() <= 60 else "",
                markersize=2.5,
                linewidth=0.8,
                color=PALETTE[k % len(PALETTE)],
                label=f"{name} ({role})",
            )
            dyn(line)
        bad = np.flatnonzero(~s.valid)[:: max(1, int((~s.valid).sum()) // 100)]
        if bad.size:
            y0 = np.nanmean(s.value[:, bad], axis=0) if s.value.size else bad * 0.0
            (mark,) = top.plot(t[bad], y0, "x", markersize=4, color="#d73027", zorder=4)
            dyn(mark)
        swapped = s.role_b[0] if s.pair else np.zeros(s.size, dtype=bool)
        for ax in (top, bottom):
            for a, b in spans(t, swapped):
                dyn(ax.axvspan(a, b, color="#dde6f0", zorder=0, linewidth=0))
            for a, b in spans(t, s.warmup):
                dyn(ax.axvspan(a, b, color="#fdd49e", alpha=0.8, zorder=0, linewidth=0))
        vals = s.value[np.isfinite(s.value)]
        if vals.size:
            lo, hi = np.percentile(vals, [0.5, 99.5])
            pad = 0.08 * (hi - lo or abs(hi) or 1.0)
            top.set_ylim(float(lo - pad), float(hi + pad))
        top.set_xlim(float(t[0]), float(t[-1]) if t[-1] > t[0] else float(t[0]) + 1.0)
        top.set_ylabel(metric, fontsize=8)
        ncol = 1 if len(s.hosts) <= 8 else 2
        dyn(
            top.legend(
                fontsize=6,
                loc="upper left",
                bbox_to_anchor=(1.01, 1.0),
                ncol=ncol,
                frameon=True,
                title="hosts",
                title_fontsize=6,
            )
        )
        lim = 0.02
        rel = s.relative(direction)
        rel[s.warmup | ~s.valid] = np.nan
        tr, vr = binned(t, rel)
        if vr.size:
            (line,) = bottom.plot(tr, vr * 100, color="#969696", linewidth=0.7, zorder=2)
            dyn(line)
            lim = max(lim, float(np.percentile(np.abs(vr), 90)) * 1.2)
        ri = running_interval(s, direction, confidence)
        if ri is not None:
            rt, est, ilo, ihi = ri
            rt = (rt - s.t[0]) / scale
            half = len(rt) // 2
            tail = np.r_[est, ilo[half:], ihi[half:]]
            tail = tail[np.isfinite(tail)]
            lim = max(lim, 1.3 * float(np.max(np.abs(tail))) if tail.size else lim)
            keep = np.unique(np.linspace(0, rt.size - 1, min(rt.size, POINTS)).astype(int))
            dyn(
                bottom.fill_between(
                    rt[keep],
                    np.clip(ilo[keep], -lim, lim) * 100,
                    np.clip(ihi[keep], -lim, lim) * 100,
                    color="#9ecae1",
                    alpha=0.7,
                    step="post",
                    linewidth=0,
                )
            )
            (line,) = bottom.plot(
                rt[keep],
                est[keep] * 100,
                color="#08519c",
                linewidth=1.0,
                drawstyle="steps-post",
                zorder=3,
            )
            dyn(line)
        if result is not None and math.isfinite(result.ci_low) and math.isfinite(result.ci_high):
            x = float(t[-1])
            (line,) = bottom.plot(
                [x, x, x],
                [100 * result.ci_low, 100 * result.estimate, 100 * result.ci_high],
                color="black",
                linewidth=1.2,
                marker="s",
                markersize=4,
                markevery=[1],
                zorder=5,
            )
            dyn(line)
            lim = max(lim, 1.15 * abs(result.ci_low), 1.15 * abs(result.ci_high))
        dyn(bottom.axhspan(-100 * min_effect, 100 * min_effect, color="#f2f2f2", zorder=0))
        bottom.set_ylim(-lim * 100, lim * 100)
        bottom.set_xlabel(f"host time ({'h' if scale == 3600.0 else 'min'})", fontsize=8)
        return render(self.fig, fmt, dpi)
