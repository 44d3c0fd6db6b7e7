"""``musku qsim curve -o curve.png|.svg|.html``: the load-latency curve as a figure
(docs/qsim.md "Curve figure").

Two panels over the offered load: end-to-end p50, p90 and p99 with their 95 % batch-means
intervals (a band; the engine's ``latency.ci``) on a log scale, and each service's thread
utilisation. The first saturated rate is marked (a red line and hollow red points: its
latency is that of a growing backlog, not a steady state). matplotlib's object API (no pyplot,
no display); the HTML is one self-contained file like ``musku report``'s (the figure as an
inline SVG data URI, inline CSS, no script, nothing fetched).
"""

from __future__ import annotations

import base64
import html
import io
from typing import Any

FORMATS = ("png", "svg", "html")
PNG_DPI = 150
PERCENTILES = (
    ("p50_us", "p50", "#2c7bb6"),
    ("p90_us", "p90", "#fdae61"),
    ("p99_us", "p99", "#d7191c"),
)
MAX_SERVICES = 8
"""Services drawn in the utilisation panel (the busiest at the highest stable rate)."""


def figure_format(out: str) -> str | None:
    """The figure format a ``-o`` name asks for (by its suffix), or None."""
    suffix = out.rsplit(".", 1)[-1].lower() if "." in out else ""
    return suffix if suffix in FORMATS else None


def _busiest(points: list[dict[str, Any]]) -> list[str]:
    util: dict[str, float] = {}
    for p in points:
        for name, u in p.get("services_util", {}).items():
            util[name] = max(util.get(name, 0.0), float(u))
    return sorted(util, key=lambda n: -util[n])[:MAX_SERVICES]


def curve_figure(res: dict[str, Any]) -> Any:
    """The curve as a matplotlib Figure (two panels, saturation marked)."""
    from matplotlib import rcParams  # lazy: matplotlib only when a figure is drawn
    from matplotlib.figure import Figure

    rcParams["svg.fonttype"] = "none"  # text as text: small SVG files
    rcParams["svg.hashsalt"] = "musku"  # stable ids: the same data gives the same file
    pts = res["points"]
    sat = res.get("saturation")
    fig = Figure(figsize=(8.0, 6.4), layout="constrained")
    lat, util = fig.subplots(2, 1, sharex=True, height_ratios=(3, 2))
    xs = [p["qps"] for p in pts]
    stable = [p for p in pts if not p["saturated"]]
    over = [p for p in pts if p["saturated"]]
    # a saturated rate's latency is a growing backlog's (often 100x the rest): drawn as a
    # marker at the top edge, so the stable curve keeps the axis
    top = None
    if stable and over:
        top = 1.6 * max(
            max(p["latency"]["p99_us"], *p["latency"].get("ci", {}).get("p99_us", [0.0]))
            for p in stable
        )
    for key, label, colour in PERCENTILES:
        sx = [p["qps"] for p in stable]
        sy = [p["latency"][key] for p in stable]
        lat.plot(sx, sy, "o-", color=colour, label=label, markersize=4, linewidth=1.5)
        band = [
            (p["qps"], *p["latency"]["ci"][key])
            for p in stable
            if key in p["latency"].get("ci", {})
        ]
        if band:
            bx, lo, hi = zip(*band, strict=True)
            lat.fill_between(bx, lo, hi, color=colour, alpha=0.25, linewidth=0)
        if over:
            ys = [p["latency"][key] if top is None else min(top, p["latency"][key]) for p in over]
            lat.plot([p["qps"] for p in over], ys, "^" if top is not None else "o",
                     markerfacecolor="none", markeredgecolor="#d62728", markersize=7,
                     clip_on=False, linestyle="none")  # fmt: skip
    if top is not None:
        lat.set_ylim(top=top)
    lat.set_yscale("log")
    lat.set_ylabel("end-to-end latency (us)")
    lat.set_title(f"load-latency curve of {res.get('model', 'the model')}", fontsize=10)
    for name in _busiest(pts):
        util.plot(xs, [100.0 * p.get("services_util", {}).get(name, 0.0) for p in pts], "o-",
                  markersize=3, linewidth=1.2, label=name)  # fmt: skip
    util.set_ylim(0, 105)
    util.set_ylabel("thread utilisation (%)")
    util.set_xlabel("offered load (req/s)")
    for ax in (lat, util):
        ax.spines[["top", "right"]].set_visible(False)
        ax.grid(color="#e6e6e6", linewidth=0.8)
        ax.set_axisbelow(True)
        if sat is not None:
            ax.axvline(sat["first_saturated_qps"], color="#d62728", linestyle="--", linewidth=1.2)
            if sat.get("last_stable_qps"):
                ax.axvspan(sat["last_stable_qps"], sat["first_saturated_qps"], color="#d62728",
                           alpha=0.07, linewidth=0)  # fmt: skip
    if sat is not None:
        off_scale = "\n(its latency off the scale: a growing backlog)" if top is not None else ""
        lat.annotate(
            f"saturated at {sat['first_saturated_qps']:.0f} req/s\n"
            f"max completed {sat['max_throughput_qps']:.0f} req/s{off_scale}",
            xy=(sat["first_saturated_qps"], 0.9), xycoords=("data", "axes fraction"),
            xytext=(-8, 0), textcoords="offset points",
            ha="right", va="top", fontsize=8, color="#d62728",
        )  # fmt: skip
    lat.legend(title="95 % interval shaded", fontsize=8, title_fontsize=8, loc="upper left")
    if util.get_legend_handles_labels()[0]:
        util.legend(fontsize=8, loc="upper left", ncols=2)
    return fig


def render(fig: Any, fmt: str) -> bytes:
    """The figure as PNG or SVG bytes (reproducible: no date in the file)."""
    buf = io.BytesIO()
    meta = {"Date": None} if fmt == "svg" else {"Software": None}
    fig.savefig(buf, format=fmt, dpi=PNG_DPI if fmt == "png" else None, metadata=meta)
    return buf.getvalue()


CSS = """
body{font-family:"DejaVu Sans",system-ui,sans-serif;margin:0 auto;max-width:1100px;padding:0 18px 40px;color:#222;line-height:1.4}
h1{font-size:1.4em;margin:18px 0 4px}.meta{color:#555;font-size:.9em}
table{border-collapse:collapse;font-size:.82em;margin:6px 0 10px}th,td{border-bottom:1px solid #eee;padding:2px 8px;text-align:right;white-space:nowrap}
th{background:#f6f6f6}figure{margin:8px 0}figure img{max-width:100%;height:auto}.sat{color:#d62728;font-weight:bold}.ci{color:#666;font-size:.9em}
"""


def _cell(text: str) -> str:
    """A table cell: a value's interval ("309.6 us [309.2 us, 310.1 us]") on a line of its own."""
    value, sep, ci = text.partition(" [")
    if not sep:
        return html.escape(text)
    return f'{html.escape(value)}<br><span class="ci">[{html.escape(ci)}</span>'


def curve_html(res: dict[str, Any], header: list[str], rows: list[list[str]]) -> str:
    """One self-contained HTML page: the figure (inline SVG data URI) and the curve's table."""
    e = html.escape
    svg = base64.b64encode(render(curve_figure(res), "svg")).decode("ascii")
    sat = res.get("saturation")
    if sat is None:
        verdict = "not saturated over the rates run"
    else:
        verdict = (
            f'<span class="sat">saturated at {sat["first_saturated_qps"]:.0f} req/s</span> '
            f"offered: {e(str(sat['reason']))}; max completed {sat['max_throughput_qps']:.0f} req/s"
        )
    head = "".join(f"<th>{e(h)}</th>" for h in header)
    body = "".join("<tr>" + "".join(f"<td>{_cell(c)}</td>" for c in row) + "</tr>" for row in rows)
    title = f"musku qsim curve: {res.get('model', '')}"
    return (
        '<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
        f"<title>{e(title)}</title><style>{CSS}</style></head><body>"
        f'<h1>{e(title)}</h1><p class="meta">{verdict}</p>'
        f'<figure id="curve"><img src="data:image/svg+xml;base64,{svg}" '
        'alt="latency percentiles and utilisation against offered load"></figure>'
        f'<table id="points"><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>'
        "</body></html>\n"
    )
