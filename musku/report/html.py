"""``musku report``: one self-contained HTML file (figures embedded as data URIs, inline CSS, no
script, nothing fetched) or the figures alone as PNG/SVG files.

The page's figures are the registered ones (:data:`musku.report.figure.FIGURES`): each is laid
out in its section, in its order; the "Figures" section (and its link) appears only when a
figure placed there is drawn. The comparisons' own figures (:class:`~musku.report.figures.
ComparisonPlot`, one per comparison) are the comparisons section's, not registered figures."""

from __future__ import annotations

import base64
import html
import math
import multiprocessing
import os
import tomllib
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np

from musku import outputs
from musku.abtest.calibration import CalibrationEffect, describe
from musku.domain import Configuration, format_value
from musku.report import figures as F
from musku.report.data import PAPER_HOST_HOURS, ReportData, host_bias
from musku.report.figure import SECTIONS, ReportFigure, select
from musku.report.figure import draw as draw_figure
from musku.strict_json import dumps
from musku.text import change_text, interval

FORMATS = ("html", "png", "svg")

CSS = """
body{font-family:"DejaVu Sans",system-ui,sans-serif;margin:0 auto;max-width:1100px;padding:0 18px 40px;color:#222;line-height:1.4}
h1{font-size:1.5em;margin:18px 0 4px}h2{border-bottom:1px solid #ddd;padding-bottom:3px;margin-top:28px}
h3{margin:18px 0 4px}.meta{color:#555;font-size:.9em}
table{border-collapse:collapse;font-size:.82em;margin:6px 0 10px}th,td{border-bottom:1px solid #eee;padding:2px 8px;text-align:left;vertical-align:top}
th{background:#f6f6f6}td.num{text-align:right;white-space:nowrap}.iv{white-space:nowrap}
figure{margin:8px 0}figure img{max-width:100%;height:auto}figcaption{font-size:.82em;color:#444}
details{border:1px solid #e3e3e3;border-radius:4px;margin:4px 0;padding:2px 8px}summary{cursor:pointer;font-size:.88em}
.better{color:#1a9850}.worse,.guardrail{color:#d73027}.no_difference{color:#777}.not_better{color:#8a7a5c}.inconclusive{color:#9e6ebd}.aborted{color:#aaa}
.legend{font-size:.8em}.lg{margin-right:14px;white-space:nowrap}.sw{display:inline-block;width:14px;height:10px;margin-right:4px;vertical-align:middle}
.sw.ln{height:0;border-top:2px solid}pre{background:#f7f7f7;padding:8px;overflow-x:auto;font-size:.8em}nav a{margin-right:10px}
"""


def _e(x: Any) -> str:
    return html.escape(str(x), quote=True)


def _pct(x: float) -> str:
    return f"{x * 100:+.2f} %" if math.isfinite(x) else "-"


def _iv(lo: float, hi: float, reason: str = "") -> str:
    """The interval, or "no interval yet (needs about N more windows)": never an infinite one."""
    return interval(lo, hi, reason)


def _hours(s: float) -> str:
    return f"{s / 3600:.2f} h" if s >= 3600 else f"{s / 60:.1f} min"


def _img(uri: str, alt: str, **attrs: str) -> str:
    extra = "".join(f' {k}="{_e(v)}"' for k, v in attrs.items())
    return f'<img src="{uri}" alt="{_e(alt)}"{extra}>'


def _change(base: Configuration, cand: Configuration) -> str:
    return change_text(base, cand, arrow="→", same="A/A")


def knobs_of(sides: Sequence[ReportData]) -> list[str]:
    out: list[str] = []
    for d in sides:
        for k in d.space:
            if k not in out and (len(d.space[k]) > 1 or d.knob_comparisons(k)):
                out.append(k)
    return out


def _figure(fig: ReportFigure, sides: Sequence[ReportData], knob: str = "") -> str:
    """One registered figure's ``<figure>`` element, or "" when it does not apply or draws
    nothing for these runs."""
    if not fig.applies(sides):
        return ""
    drawn = draw_figure(fig, sides, knob)
    if drawn is None:
        return ""
    attrs = "".join(f' {k}="{_e(v)}"' for k, v in fig.attributes(knob))
    caption = f"<figcaption>{fig.caption}</figcaption>" if fig.caption else ""
    return f"<figure{attrs}>{_img(F.encode(drawn, 'svg'), fig.alt(knob))}{caption}</figure>"


def _placed(figures: Sequence[ReportFigure]) -> dict[str, list[ReportFigure]]:
    return {s: [f for f in figures if f.section == s] for s in SECTIONS}


def render(
    sides: Sequence[ReportData],
    *,
    version: str,
    figures: Sequence[ReportFigure] | None = None,
) -> str:
    """The whole report as one HTML string. ``figures``: the registered figures to lay out
    (default: those drawn by default, :func:`musku.report.figure.select`)."""
    placed = _placed(select() if figures is None else figures)
    extra = "".join(
        f'<section class="figure-section"><h3>{_e(f.title)}</h3>{element}</section>'
        for f in placed["figures"]
        if (element := _figure(f, sides))
    )
    title = " vs ".join(f"{d.experiment.name} (#{d.experiment.id})" for d in sides)
    parts = [
        "<!doctype html>",
        '<html lang="en"><head><meta charset="utf-8">',
        '<meta name="viewport" content="width=device-width, initial-scale=1">',
        f"<title>musku report: {_e(title)}</title><style>{CSS}</style></head><body>",
        f"<h1>musku report: {_e(title)}</h1>",
    ]
    for d in sides:
        parts.append(_header(d))
    knobs = knobs_of(sides)
    parts.append(
        "<nav>"
        + "".join(f'<a href="#knob-{_e(k)}">{_e(k)}</a>' for k in knobs)
        + '<a href="#softsku">soft SKU</a><a href="#host-time">host time</a>'
        + ('<a href="#figures">figures</a>' if extra else "")
        + '<a href="#comparisons">comparisons</a><a href="#reproduce">reproduce</a></nav>'
    )
    parts.append(_summary(sides, knobs))
    parts.append('<h2 id="knobs">Knobs (paper Figs. 14-18)</h2>')
    for k in knobs:
        parts.append(_knob_section(k, sides, placed["knob"]))
    parts.append(_softsku_section(sides, placed["softsku"]))
    parts.append(_host_time_section(sides, placed["host-time"]))
    if extra:
        parts.append(f'<h2 id="figures">Figures</h2>{extra}')
    parts.append('<h2 id="comparisons">Comparisons</h2>')
    parts.append(
        '<p class="meta">Open one to see both hosts\' windows (warm-up, crossover periods and '
        "discarded windows shaded), the interval narrowing as windows arrive (recomputed from "
        "the stored windows with the tester's estimator and confidence sequence), and the "
        "host bias estimate.</p>"
    )
    parts.append(_legend())
    images = comparison_images(sides, "svg")
    for d in sides:
        if len(sides) > 1:
            parts.append(f"<h3>#{d.experiment.id} {_e(d.experiment.name)}</h3>")
        for c in d.comparisons:
            parts.append(_comparison(d, c, images.get((d.experiment.id, c.id))))
    parts.append(_reproduce(sides, version))
    parts.append(
        f'<p class="meta">Generated by musku {_e(version)} on '
        f"{datetime.now(UTC):%Y-%m-%d %H:%M} UTC.</p></body></html>"
    )
    return "\n".join(parts)


def _header(d: ReportData) -> str:
    e = d.experiment
    hosts = ", ".join(f"{h.name} ({h.backend})" for h in e.hosts) or "-"
    when = e.started_at or e.created_at
    done = f", finished {e.finished_at:%Y-%m-%d %H:%M} UTC" if e.finished_at else ""
    return (
        f'<p class="meta">#{e.id} <b>{_e(e.name)}</b>: {_e(e.description)}<br>'
        f"{_e(e.service)} on {_e(e.platform)}; {_e(e.mode)} sweep against {_e(e.baseline)}; "
        f"metric {_e(e.metric)} ({_e(e.direction)} is better); status <b>{_e(e.status.value)}</b>; "
        f"started {when:%Y-%m-%d %H:%M} UTC{done}; hosts {_e(hosts)}.</p>"
    )


def _best_gain(d: ReportData, knob: str) -> tuple[Any, str]:
    sku = d.sku
    best = sku.sku.configuration.get(knob) if sku is not None else None
    for c in reversed(d.knob_comparisons(knob)):
        r = c.result
        if r is not None and best is not None and c.candidate.get(knob) == best:
            return best, f"{_pct(r.estimate)} {_iv(r.ci_low, r.ci_high, r.reason)}"
    return best, "-"


def _summary(sides: Sequence[ReportData], knobs: list[str]) -> str:
    rows = []
    head = "".join(f"<th>#{d.experiment.id} best</th><th>gain vs baseline</th>" for d in sides)
    for k in knobs:
        cells = []
        for d in sides:
            best, gain = _best_gain(d, k)
            base = d.baseline_config.get(k)
            cells.append(
                f"<td>{_e(format_value(k, best)) if best is not None else '-'}"
                f"{' (baseline)' if best is not None and best == base else ''}</td>"
                f'<td class="iv">{_e(gain)}</td>'
            )
        base = sides[0].baseline_config.get(k)
        rows.append(
            f'<tr><td><a href="#knob-{_e(k)}">{_e(k)}</a></td>'
            f"<td>{_e(format_value(k, base)) if base is not None else '-'}</td>{''.join(cells)}</tr>"
        )
    return (
        '<h2 id="summary">Summary</h2><table><tr><th>knob</th><th>baseline</th>'
        f"{head}</tr>{''.join(rows)}</table>"
    )


def _knob_section(knob: str, sides: Sequence[ReportData], figures: Sequence[ReportFigure]) -> str:
    rows = []
    for d in sides:
        for c in d.knob_comparisons(knob) + d.knob_steps(knob):
            r = c.result
            if r is None:
                rows.append(
                    f"<tr><td>{_cmp_link(c)}</td><td>{_e(c.purpose)}</td>"
                    f"<td>{_e(_change(c.baseline, c.candidate))}</td>"
                    f'<td class="aborted">{_e(c.status.value)}</td><td></td><td></td><td></td><td></td><td></td></tr>'
                )
                continue
            rows.append(
                f"<tr><td>{_cmp_link(c)}</td><td>{_e(c.purpose)}</td>"
                f"<td>{_e(_change(c.baseline, c.candidate))}</td>"
                f'<td class="{_e(r.decision.value)}">{_e(r.decision.value)}</td>'
                f'<td class="num">{_e(_pct(r.estimate))}</td><td class="iv">{_e(_iv(r.ci_low, r.ci_high, r.reason))}</td>'
                f'<td class="num">{r.samples:,}</td><td class="num">{_e(_hours(r.host_time_s))}</td>'
                f"<td>{_e(r.reason)}</td></tr>"
            )
    table = (
        "<details><summary>decisions</summary><table><tr><th>#</th><th>purpose</th><th>change</th>"
        "<th>decision</th><th>estimate</th><th>interval</th><th>samples</th><th>host time</th>"
        f"<th>reason</th></tr>{''.join(rows)}</table></details>"
        if rows
        else "<p class='meta'>not compared</p>"
    )
    return (
        f'<section class="knob-section"><h3>{_e(knob)}</h3>'
        + "".join(_figure(f, sides, knob) for f in figures)
        + f"{table}</section>"
    )


def _legend() -> str:
    items = []
    for kind, colour, label in F.LEGEND:
        if kind == "box":
            mark = f'<span class="sw" style="background:{colour}"></span>'
        elif kind == "line":
            mark = f'<span class="sw ln" style="border-color:{colour}"></span>'
        else:
            mark = ""
        style = f' style="color:{colour}"' if kind == "mark" else ""
        items.append(f"<span class='lg'{style}>{mark}{_e(label)}</span>")
    return f'<p class="legend">{"".join(items)}</p>'


def _cmp_link(c: Any) -> str:
    return f'<a href="#cmp-{c.experiment_id}-{c.id}">{c.id}</a>'


def _softsku_section(sides: Sequence[ReportData], figures: Sequence[ReportFigure]) -> str:
    out = ['<h2 id="softsku">Soft SKU (paper Fig. 19)</h2>']
    for d in sides:
        sku = d.sku
        if sku is None:
            out.append(f"<p>#{d.experiment.id}: no soft SKU stored.</p>")
            continue
        cfg = sku.sku.configuration
        out.append(
            f"<p>#{d.experiment.id} soft SKU {sku.id} for {_e(sku.sku.service)} on "
            f"{_e(sku.sku.platform)}: <code>{_e(cfg)}</code></p>"
        )
    out.extend(_figure(f, sides) for f in figures)
    return "".join(out)


def _host_time_section(sides: Sequence[ReportData], figures: Sequence[ReportFigure]) -> str:
    lo, hi = PAPER_HOST_HOURS
    lines = "".join(
        f"<li>#{d.experiment.id} {_e(d.experiment.name)}: {_e(_hours(d.host_time_s))} of host "
        f"time over {sum(1 for c in d.comparisons if c.result is not None)} comparisons "
        f"({d.host_time_s / 3600 / hi:.2f}-{d.host_time_s / 3600 / lo:.2f}x the paper's {lo:g}-{hi:g} h)</li>"
        for d in sides
    )
    return f'<h2 id="host-time">Host time</h2><ul>{lines}</ul>' + "".join(
        _figure(f, sides) for f in figures
    )


def _comparison_image(d: ReportData, c: Any, plot: F.ComparisonPlot, fmt: str) -> bytes:
    stats = d.statistics
    return plot.draw(
        d.series[c.id],
        c.result,
        direction=d.direction,
        confidence=float(stats.get("confidence", 0.95)),
        min_effect=float(stats.get("min_effect", 0.0) or 0.0),
        metric=d.experiment.metric,
        fmt=fmt,
        names=[h.name for h in d.experiment.hosts],
    )


_SIDES: Sequence[ReportData] = ()  # what forked workers draw (inherited, not pickled)
_PLOT: F.ComparisonPlot | None = None


def _draw_some(work: tuple[str, list[tuple[int, int]]]) -> list[tuple[tuple[int, int], bytes]]:
    global _PLOT
    fmt, keys = work
    if _PLOT is None:
        _PLOT = F.ComparisonPlot()
    out = []
    for side, cmp_id in keys:
        d = _SIDES[side]
        c = next(c for c in d.comparisons if c.id == cmp_id)
        out.append(((d.experiment.id, cmp_id), _comparison_image(d, c, _PLOT, fmt)))
    return out


def comparison_images(sides: Sequence[ReportData], fmt: str) -> dict[tuple[int, int], bytes]:
    """Every comparison's figure, (experiment id, comparison id) -> image bytes. Drawn by
    one forked worker per CPU when there are many (each draws its share into its own
    figure), else here."""
    global _SIDES
    keys = [
        (i, c.id)
        for i, d in enumerate(sides)
        for c in d.comparisons
        if (s := d.series.get(c.id)) is not None and s.size >= 2
    ]
    workers = min(os.cpu_count() or 1, 8, len(keys) // 8)
    _SIDES = sides
    try:
        if workers < 2 or "fork" not in multiprocessing.get_all_start_methods():
            return dict(_draw_some((fmt, keys)))
        chunks = [(fmt, keys[k::workers]) for k in range(workers)]
        with multiprocessing.get_context("fork").Pool(workers) as pool:
            return {k: v for part in pool.map(_draw_some, chunks) for k, v in part}
    finally:
        _SIDES = ()


def _periods(s: Any, hosts: Sequence[str]) -> str:
    starts = np.r_[0, np.flatnonzero(np.diff(s.period)) + 1]

    def name(h: int) -> str:
        return hosts[h] if h < len(hosts) else f"host {h}"

    def on(a: int, b: bool) -> str:
        rows = [
            k for k in range(len(s.hosts)) if s.role_b[k, a] == b and np.isfinite(s.value[k, a])
        ]
        return ", ".join(_e(name(s.hosts[k])) for k in rows) or "-"

    return "; ".join(
        f"P{int(s.period[a])}: A on {on(a, False)}, B on {on(a, True)}" for a in starts[:12]
    ) + (" ..." if len(starts) > 12 else "")


def _comparison(d: ReportData, c: Any, image: bytes | None) -> str:
    r = c.result
    head = f"#{c.id} {_e(c.purpose)}: {_e(_change(c.baseline, c.candidate))} -- " + (
        f'<span class="{_e(r.decision.value)}">{_e(r.decision.value)}</span> '
        f"{_e(_pct(r.estimate))} {_e(_iv(r.ci_low, r.ci_high, r.reason))}, {_e(_hours(r.host_time_s))}"
        if r is not None
        else _e(c.status.value)
    )
    body = []
    s = d.series.get(c.id)
    if s is not None and image is not None:
        svg = base64.b64encode(image).decode("ascii")
        body.append(
            f'<figure class="comparison">{_img("data:image/svg+xml;base64," + svg, f"comparison {c.id}: both hosts and the interval over time", loading="lazy")}</figure>'
        )
        bias = host_bias(s)
        hosts = [h.name for h in d.experiment.hosts]
        pair = " and ".join(_e(hosts[h] if h < len(hosts) else f"host {h}") for h in s.hosts)
        adjusted = r is not None and "CUPED" in r.method
        note = (
            "; the tester's figure in the reason below is adjusted for each host's offered load "
            "(CUPED), so the two can differ by a few tenths of a percent"
            if adjusted
            else ""
        )
        if s.pair:
            what = (
                f"Host bias ({pair}: the second over the first on the same configuration, from "
                f"the two role orders' raw windows{note}): <b>"
                + (_e(_pct(bias)) if bias is not None else "not estimable (one role order only)")
                + "</b>. "
            )
        else:
            what = (
                f"Multi-arm scan on {len(s.hosts)} hosts ({pair}); each point is a host's mean "
                "over a period, on the baseline (A) or this arm (B). "
            )
        body.append(
            f"<p>{what}{s.size:,} windows per host, {int((~s.valid).sum()):,} invalid, "
            f"{int(s.warmup.sum()):,} warm-up. Periods: {_periods(s, hosts)}.</p>"
        )
    else:
        body.append("<p>No windows stored.</p>")
    if r is not None:
        body.append(f"<p>{_e(r.reason)}<br><small>{_e(r.method)}</small></p>")
    return (
        f'<details class="cmp" id="cmp-{c.experiment_id}-{c.id}"><summary>{head}</summary>'
        f"{''.join(body)}</details>"
    )


def _reproduce(sides: Sequence[ReportData], version: str) -> str:
    out = ['<h2 id="reproduce">Reproduce</h2>']
    for d in sides:
        e = d.experiment
        made_by = d.meta.get("musku_version") or "?"
        seed = d.statistics.get("seed")
        file_seed = (dict(e.content).get("statistics") or {}).get("seed")
        override = f" --seed {seed}" if seed is not None and seed != file_seed else ""
        where = "given with --seed" if override else "the file's"
        out.append(
            f"<p>#{e.id}: experiment file <code>{_e(e.path)}</code>, run by musku "
            f"{_e(made_by)} (this report: musku {_e(version)}). Rerun with "
            f"<code>musku sweep {_e(e.path)}{override}</code> (seed {_e(seed)}, {where}; on "
            "simulated hosts the same file and seed give the same comparisons); statistics: "
            f"<code>{_e(dumps(d.statistics))}</code>.</p>"
        )
        out.append(_calibration(d))
        text = _file_text(e.path, e.content)
        out.append(
            f"<details><summary>the experiment file</summary><pre>{_e(text)}</pre></details>"
        )
    return "".join(out)


def _calibration(d: ReportData) -> str:
    """What a pair calibration did to the run (docs/abtest.md "What a calibration changes"):
    which one, and its early decisions against the crossover ones; "" when none decided."""
    effect = CalibrationEffect.of([c.result for c in d.comparisons if c.result is not None])
    if not effect.early:
        return ""
    used = "; ".join(f"used {describe(c)}" for c in d.calibrations) or "used a pair calibration"
    return f'<p class="calibration">{_e(used)}. {_e(effect.text())}.</p>'


def _file_text(path: str, content: Any) -> str:
    """The experiment file as stored (its parsed content, as TOML-like JSON), plus the file
    on disk when it still parses to the same content."""
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
        if tomllib.loads(text) == dict(content):
            return f"# {path}\n{text}"
    except (OSError, ValueError):
        pass
    return (
        f"# {path} as parsed when the experiment ran (the file has changed or is gone)\n"
        + dumps(content, indent=2)
    )


def write_report(
    sides: Sequence[ReportData],
    out: Path,
    *,
    version: str,
    figures: Sequence[ReportFigure] | None = None,
) -> Path:
    text = render(sides, version=version, figures=figures)
    _write(out, text.encode("utf-8"))
    return out


def write_figures(
    sides: Sequence[ReportData],
    out_dir: Path,
    fmt: str,
    figures: Sequence[ReportFigure] | None = None,
) -> list[Path]:
    """Every figure as its own ``fmt`` file in ``out_dir`` (created): the registered figures
    that apply, in page order, each named by its ``stem`` (knob-<knob>, softsku, host-time;
    an added figure's name), then comparison-<id>. ``figures``: as for :func:`render`."""
    outputs.check_directory(out_dir)
    written: list[Path] = []

    def put(name: str, fig: Any) -> None:
        path = out_dir / f"{name}.{fmt}"
        outputs.write_bytes(path, F.render(fig, fmt))
        written.append(path)

    for fig in select() if figures is None else figures:
        if not fig.file or not fig.applies(sides):
            continue
        for knob in knobs_of(sides) if fig.per_knob else [""]:
            drawn = draw_figure(fig, sides, knob)
            if drawn is not None:
                put(fig.stem(knob), drawn)
    for (exp_id, cmp_id), image in sorted(comparison_images(sides, fmt).items()):
        path = out_dir / f"comparison-{exp_id}-{cmp_id}.{fmt}"
        outputs.write_bytes(path, image)
        written.append(path)
    return written


def check_output(out: Path) -> None:
    """Refuse, before any work, an output that is not a new path or a regular file, or whose
    directory does not exist or is not writable (musku/outputs.py); ``-`` is standard
    output."""
    outputs.check_target(out)


def _write(out: Path, data: bytes) -> None:
    """Write atomically: a reader never sees half a report; never over a device, a FIFO or a
    link (musku/outputs.py)."""
    outputs.write_bytes(out, data)
