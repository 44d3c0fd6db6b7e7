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
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Literal

import numpy as np
from matplotlib import rcParams
from matplotlib.figure import Figure
from matplotlib.ticker import MaxNLocator

from musku.domain import Decision, format_value
from musku.report.data import (
    PAPER_GAINS,
    PAPER_HOST_HOURS,
    ReportData,
    Series,
    running_interval,
)

if TYPE_CHECKING:
    from matplotlib.axes import Axes

COLOURS = {
    Decision.BETTER: "#1a9850",
    Decision.WORSE: "#d73027",
    Decision.NO_DIFFERENCE: "#8c8c8c",
    Decision.INCONCLUSIVE: "#9e6ebd",
    Decision.GUARDRAIL: "#d73027",
    Decision.ABORTED: "#bbbbbb",
}
HOST_COLOURS = ("#2c7bb6", "#fdae61")
SIDES = ("#2c7bb6", "#e66101")  # experiments side by side (--compare)


def _figure(w: float, h: float, *, layout: Literal["constrained"] | None = "constrained") -> Figure:
    rcParams["svg.fonttype"] = "none"  # SVG text as text: small files, fast to write
    rcParams["svg.hashsalt"] = "musku"  # stable ids: the same data gives the same file
    return Figure(figsize=(w, h), layout=layout)


def _style(ax: Axes) -> None:
    ax.spines[["top", "right"]].set_visible(False)
    ax.grid(axis="y", color="#e6e6e6", linewidth=0.8)
    ax.set_axisbelow(True)


def encode(fig: Figure, fmt: str) -> str:
    """A ``data:`` URI of the figure as SVG or PNG (for an ``<img src>``)."""
    buf = io.BytesIO()
    fig.savefig(buf, format=fmt, dpi=80 if fmt == "png" else None, metadata=_metadata(fmt))
    mime = "image/svg+xml" if fmt == "svg" else "image/png"
    return f"data:{mime};base64,{base64.b64encode(buf.getvalue()).decode('ascii')}"


def save(fig: Figure, path: Any, fmt: str) -> None:
    fig.savefig(path, format=fmt, dpi=110 if fmt == "png" else None, metadata=_metadata(fmt))


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

    for k, d in enumerate(sides):
        off = (k - (len(sides) - 1) / 2) * width
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
                fmt="o",
                color=colour,
                ecolor=colour,
                capsize=3,
                markersize=5,
                zorder=3,
                label=once(r.decision.value.replace("_", " ")),
            )
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
                ax.text(
                    i + off,
                    0.0,
                    "not\ntested",
                    ha="center",
                    va="bottom",
                    fontsize=7,
                    color="#999999",
                )
        if len(sides) > 1:
            ax.plot(
                [],
                [],
                color=SIDES[k % 2],
                linewidth=4,
                label=once(
                    f"#{d.experiment.id} {d.experiment.name} ({'left' if k == 0 else 'right'})"
                ),
            )
    stock = (first.resolved.get("stock") or {}).get(knob)
    ticks = [
        f"{lab}\n(stock)" if json_key(v) == json_key(stock) else lab
        for v, lab in zip(settings, labels, strict=True)
    ]
    ax.set_xticks(range(len(settings)), ticks, fontsize=8)
    ax.set_xlim(-0.6, len(settings) - 0.4)
    ax.set_ylim(-lim, lim)
    ax.set_ylabel(f"{metric} vs baseline (%)")
    ax.set_title(
        f"{knob}: relative {metric} per setting, {int(100 * float(stats.get('confidence', 0.95)))} % intervals",
        fontsize=10,
        loc="left",
    )
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.0, 1.0), frameon=False)
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
    h = 0.55 * len(rows) + 1.3
    fig = _figure(6.4, h, layout=None)
    fig.subplots_adjust(left=0.2, right=0.97, bottom=0.55 / h, top=1 - 0.35 / h)
    ax = fig.add_subplot()
    _style(ax)
    ax.grid(axis="x", color="#e6e6e6", linewidth=0.8)
    ys = np.arange(len(rows))[::-1]
    for y, (_name, r, colour) in zip(ys, rows, strict=True):
        lo = _pct(r.ci_low) if math.isfinite(r.ci_low) else 0.0
        hi = _pct(r.ci_high) if math.isfinite(r.ci_high) else _pct(r.estimate)
        ax.barh([y], [_pct(r.estimate)], color=colour, alpha=0.75, height=0.55)
        ax.errorbar(
            [_pct(r.estimate)],
            [y],
            xerr=[[_pct(r.estimate) - lo], [hi - _pct(r.estimate)]],
            fmt="none",
            ecolor="black",
            capsize=4,
        )
        ax.text(
            max(hi, _pct(r.estimate)) + 0.2,
            y,
            f"{_pct(r.estimate):+.2f} %  [{lo:+.2f}, {hi:+.2f}]  {r.decision.value}",
            va="center",
            fontsize=8,
        )
    labelled = False
    for d in sides:
        paper = PAPER_GAINS.get((d.experiment.service, d.experiment.platform))
        if paper is None:
            continue
        for y, (name, _r, _c) in zip(ys, rows, strict=True):
            if (len(sides) == 1 or name.startswith(f"#{d.experiment.id} ")) and name.endswith(
                ("production", "stock")
            ):
                value = paper[1] if name.endswith("production") else paper[0]
                ax.scatter(
                    [_pct(value)],
                    [y],
                    marker="|",
                    s=400,
                    color="black",
                    zorder=5,
                    label="the paper's gain" if not labelled else "_nolegend_",
                )
                labelled = True
    ax.axvline(0.0, color="#555555", linewidth=0.8)
    ax.set_yticks(ys, [n for n, _, _ in rows], fontsize=9)
    ax.set_xlabel(f"soft SKU's {sides[0].experiment.metric} gain (%)")
    ax.set_title("Soft SKU against production and stock (paper Fig. 19)", fontsize=10, loc="left")
    right = max([_pct(r.ci_high) for _, r, _ in rows if math.isfinite(r.ci_high)] + [5.0])
    left = min([_pct(r.ci_low) for _, r, _ in rows if math.isfinite(r.ci_low)] + [0.0])
    ax.set_xlim(min(left * 1.2, -1.0), right * 1.6)
    if labelled:
        ax.legend(fontsize=8, loc="upper right", frameon=False)
    return fig


def host_time_figure(sides: Sequence[ReportData]) -> Figure:
    """Host hours per knob (stacked) for each experiment, against the paper's 5-10 h."""
    h = 0.6 * len(sides) + 1.5
    fig = _figure(7.4, h, layout=None)
    fig.subplots_adjust(left=0.24, right=0.72, bottom=0.55 / h, top=1 - 0.35 / h)
    ax = fig.add_subplot()
    ax.spines[["top", "right"]].set_visible(False)
    lo, hi = PAPER_HOST_HOURS
    ax.axvspan(lo, hi, color="#fee08b", alpha=0.6, label=f"the paper: {lo:g}-{hi:g} h a sweep")
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
    for y, d in enumerate(sides[::-1]):
        per: dict[str, float] = {}
        for c in d.comparisons:
            if c.result is None:
                continue
            parts = c.purpose.split(":")
            group = parts[1] if parts[0] == "knob" and len(parts) > 1 else parts[0]
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
                label=group if y == len(sides) - 1 or group not in groups[:-1] else "_nolegend_",
            )
            left += h
        ax.text(left + 0.1, y, f"{left:.2f} h", va="center", fontsize=9)
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
    ("line", HOST_COLOURS[0], "host 0"),
    ("line", HOST_COLOURS[1], "host 1"),
    ("box", "#fdd49e", "warm-up (discarded)"),
    ("box", "#dde6f0", "periods with B on host 0 (roles swapped by the crossover)"),
    ("mark", "#d73027", "✕ invalid window (discarded)"),
    ("box", "#9ecae1", "interval, recomputed from the windows"),
    ("line", "#08519c", "estimate"),
    ("mark", "black", "■ the tester's decision and interval"),
)
"""What the colours of a :class:`ComparisonPlot` mean (drawn once, in HTML)."""


class ComparisonPlot:
    """One comparison's figure: both hosts' windows (top; warm-up, crossover periods and
    invalid windows shaded) and the effect's interval over time (bottom).

    A report draws dozens of these, so the figure is built once and its artists updated for
    each comparison (:meth:`draw`): building a matplotlib figure costs as much as drawing it.
    The legend is the report's (:data:`LEGEND`), the same for every comparison; text is left
    to the browser (SVG text, not glyph paths)."""

    def __init__(self) -> None:
        fig = _figure(7.2, 3.8, layout=None)
        fig.subplots_adjust(left=0.1, right=0.98, top=0.97, bottom=0.12, hspace=0.1)
        self.fig = fig
        self.top, self.bottom = fig.subplots(2, 1, sharex=True, height_ratios=(3, 2))
        top, bottom = self.top, self.bottom
        for ax in (top, bottom):  # few ticks, no grid: every tick and grid line is an artist
            ax.spines[["top", "right"]].set_visible(False)
            ax.tick_params(labelsize=7)
            ax.yaxis.set_major_locator(MaxNLocator(3))
        top.tick_params(bottom=False)
        bottom.xaxis.set_major_locator(MaxNLocator(5))
        (self.h0,) = top.plot([], [], linewidth=0.6, color=HOST_COLOURS[0])
        (self.h1,) = top.plot([], [], linewidth=0.6, color=HOST_COLOURS[1])
        (self.bad,) = top.plot([], [], "x", markersize=4, color="#d73027", zorder=4)
        (self.est,) = bottom.plot([], [], color="#08519c", linewidth=1.0, drawstyle="steps-post")
        (self.final,) = bottom.plot([], [], color="black", linewidth=1.2, marker="s", markersize=4)
        bottom.axhline(0.0, color="#555555", linewidth=0.8)
        self.min_band = bottom.axhspan(0, 0, color="#f2f2f2", zorder=0)
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
    ) -> bytes:
        top, bottom = self.top, self.bottom
        for artist in self.dynamic:
            artist.remove()
        self.dynamic = []
        span = float(s.t[-1] - s.t[0])
        scale = 3600.0 if span > 3 * 3600 else 60.0
        t = (s.t - s.t[0]) / scale
        step = max(1, s.size // 800)  # enough points for the eye, few enough to draw fast
        self.h0.set_data(t[::step], s.value[0, ::step])
        self.h1.set_data(t[::step], s.value[1, ::step])
        bad = np.flatnonzero(~s.valid)
        self.bad.set_data(t[bad], s.value[0, bad])
        swapped = s.role_b[0]  # host 0 ran B: the roles of period 0 swapped
        for ax in (top, bottom):
            trans = ax.get_xaxis_transform()
            self.dynamic.append(
                ax.fill_between(
                    t,
                    0,
                    1,
                    where=swapped,
                    transform=trans,
                    color="#dde6f0",
                    zorder=0,
                    linewidth=0,
                    step="post",
                )
            )
            self.dynamic.append(
                ax.fill_between(
                    t,
                    0,
                    1,
                    where=s.warmup,
                    transform=trans,
                    color="#fdd49e",
                    alpha=0.8,
                    zorder=0,
                    linewidth=0,
                    step="post",
                )
            )
        vals = s.value[np.isfinite(s.value)]
        if vals.size:
            lo, hi = float(vals.min()), float(vals.max())
            pad = 0.05 * (hi - lo or abs(hi) or 1.0)
            top.set_ylim(lo - pad, hi + pad)
        top.set_xlim(float(t[0]), float(t[-1]) if t[-1] > t[0] else float(t[0]) + 1.0)
        top.set_ylabel(metric, fontsize=8)
        lim = 0.02
        ri = running_interval(s, direction, confidence)
        if ri is not None:
            rt, est, ilo, ihi = ri
            rt = (rt - s.t[0]) / scale
            half = len(rt) // 2
            tail = np.r_[est, ilo[half:], ihi[half:]]
            tail = tail[np.isfinite(tail)]
            lim = max(lim, 1.3 * float(np.max(np.abs(tail))) if tail.size else lim)
            self.dynamic.append(
                bottom.fill_between(
                    rt,
                    np.clip(ilo, -lim, lim) * 100,
                    np.clip(ihi, -lim, lim) * 100,
                    color="#9ecae1",
                    alpha=0.7,
                    step="post",
                    linewidth=0,
                )
            )
            self.est.set_data(rt, est * 100)
        else:
            self.est.set_data([], [])
        if result is not None and math.isfinite(result.ci_low) and math.isfinite(result.ci_high):
            x = float(t[-1])
            self.final.set_data(
                [x, x, x], [100 * result.ci_low, 100 * result.estimate, 100 * result.ci_high]
            )
            self.final.set_markevery([1])
            lim = max(lim, 1.15 * abs(result.ci_low), 1.15 * abs(result.ci_high))
        else:
            self.final.set_data([], [])
        self.min_band.remove()
        self.min_band = bottom.axhspan(
            -100 * min_effect, 100 * min_effect, color="#f2f2f2", zorder=0
        )
        bottom.set_ylim(-lim * 100, lim * 100)
        bottom.set_xlabel(f"host time ({'h' if scale == 3600.0 else 'min'})", fontsize=8)
        buf = io.BytesIO()
        self.fig.savefig(buf, format=fmt, dpi=80 if fmt == "png" else None, metadata=_metadata(fmt))
        return buf.getvalue()
