"""The CLI's display (rich): live progress of a sweep and the printed reports of the read
commands. Only the CLI layer imports it; the library reports through callbacks."""

from __future__ import annotations

import os
import re
import sys
from collections.abc import Mapping, Sequence
from typing import Any

from rich.cells import cell_len
from rich.console import Console
from rich.markup import escape
from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn
from rich.table import Table
from rich.text import Text

from musku.domain import ComparisonResult, Configuration, Decision, TimeBreakdown, format_value
from musku.sweep.modes import strategy_of
from musku.text import change_text, time_short, time_text
from musku.text import hours as _hours
from musku.text import interval as _interval
from musku.text import pct as _pct

_COLOURS = {
    Decision.BETTER: "green",
    Decision.WORSE: "red",
    Decision.NO_DIFFERENCE: "yellow",
    Decision.INCONCLUSIVE: "magenta",
    Decision.NOT_BETTER: "yellow",
    Decision.GUARDRAIL: "red",
    Decision.ABORTED: "grey50",
}


PIPED_WIDTH = 160
"""Width of tables written to a pipe or file when ``COLUMNS`` is not set."""


def make_console(*, stderr: bool = False) -> Any:
    """A rich console for the read commands: a terminal's own width, else ``COLUMNS``, else
    :data:`PIPED_WIDTH` when the output is piped. No emoji codes: a name like ``:o:`` is text
    (escape() leaves it alone; Hypothesis found it)."""
    stream = sys.stderr if stderr else sys.stdout
    columns = os.environ.get("COLUMNS", "")
    tty = stream.isatty()
    width = None if tty or (columns.isdigit() and int(columns) > 0) else PIPED_WIDTH
    return Console(stderr=stderr, highlight=False, emoji=False, width=width)


_KEEP = "\ue000"  # stands for a space that must not break a line (private use, not whitespace)
_ATOMIC = re.compile(
    r"\[[^\[\]\n]*\](?: %)?"  # an interval: [+0.06, +9.50] % or [-0.99 %, -0.01 %]
    r"|[+-±]?\d[\d,.]*(?: %| h| min| s\b| GHz)"  # a number with its unit: +4.67 %, 8.53 h
)


def wrap_atomic(text: str, width: int, indent: int = 4) -> list[str]:
    """Greedy word wrap at ``width`` cells that never breaks inside an interval or between a
    number and its unit; continuation lines are indented by ``indent``. A lone token wider
    than ``width`` stays whole on its own line (a terminal folds it; nothing is cut)."""
    protected = _ATOMIC.sub(lambda m: m.group(0).replace(" ", _KEEP), text)
    lines: list[str] = []
    cur, pending = "", ""
    for tok in re.findall(r"\S+|\s+", protected):
        if tok.isspace():
            pending += tok
            continue
        if cur.strip() and cell_len(cur + pending + tok) > width:
            lines.append(cur)
            cur, pending = " " * indent + tok, ""
        else:
            cur, pending = cur + pending + tok, ""
    if cur or not lines:
        lines.append(cur)
    return [line.replace(_KEEP, " ") for line in lines]


def print_wrapped(
    con: Any, text: str, *, indent: int = 4, styles: Mapping[str, str] | None = None
) -> None:
    """Print plain ``text`` (no markup) wrapped by :func:`wrap_atomic` at the console's width;
    ``styles`` colours whole words (e.g. a decision)."""
    for line in wrap_atomic(text, max(20, int(con.width)), indent):
        t = Text(line)
        for word, style in (styles or {}).items():
            t.highlight_words([word], style=style)
        con.print(t, soft_wrap=True)


def print_table(con: Any, table: Any) -> None:
    """Print a rich table when it fits the console without cutting a cell; otherwise one
    block per row (``column: value`` lines), so nothing is ever truncated."""
    if _min_width(table) <= con.width:
        con.print(table)
        return
    if table.title:  # markup with user strings escaped, as the cells: print what it shows
        # a Text, and no emoji codes: ":b:" in a name is text, whatever the console's setting
        con.print(Text(Text.from_markup(str(table.title), emoji=False).plain))
    headers = [str(c.header) for c in table.columns]
    label = max((len(h) for h in headers), default=0)
    cells = [list(c.cells) for c in table.columns]
    for i in range(table.row_count):
        for j, h in enumerate(headers):
            value = cells[j][i] if i < len(cells[j]) else ""
            # a str cell is rich markup (user strings in it are escaped): print what it shows
            text = (
                value.plain
                if hasattr(value, "plain")
                else Text.from_markup(str(value), emoji=False).plain
            )
            prefix = f"{h:>{label}}: "
            print_wrapped(con, prefix + text.replace("\n", " "), indent=label + 2)
        if i != table.row_count - 1:
            con.print()


def _min_width(table: Any) -> int:
    """Cells the table needs so that no cell is cut: per column its longest word (its longest
    line when the column does not wrap) plus padding, plus the borders."""
    total = 1
    for col in table.columns:
        texts = [str(col.header), *(getattr(c, "plain", str(c)) for c in col.cells)]
        widest = 0
        for text in texts:
            pieces = text.splitlines() if col.no_wrap else text.split()
            widest = max([widest, *(cell_len(p) for p in pieces)])
        total += widest + 2 + 1  # padding, then the column's right border
    return total


def _field(info: Any, name: str, default: Any = None) -> Any:
    if isinstance(info, Mapping):
        return info.get(name, default)
    return getattr(info, name, default)


class LiveProgress:
    """Rich live display: current knob and comparison, samples, interval narrowing, decisions."""

    def __init__(self, *, enabled: bool = True, console: Any = None) -> None:
        self.enabled = enabled
        self._progress: Any = None
        self._task: Any = None
        self._label = ""
        self.console: Any = console  # default: stderr

    def __enter__(self) -> LiveProgress:
        if self.enabled:
            if self.console is None:
                self.console = Console(stderr=True, highlight=False, emoji=False)
            self._progress = Progress(
                SpinnerColumn(),
                TextColumn("{task.description}"),
                TimeElapsedColumn(),
                console=self.console,
                transient=True,
            )
            self._progress.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        if self._progress is not None:
            self._progress.__exit__(None, None, None)
            self._progress = None

    def comparison_started(
        self, purpose: str, baseline: Configuration, candidate: Configuration
    ) -> None:
        if self._progress is None:
            return
        self._label = escape(f"{purpose}: {change_text(baseline, candidate)}")
        if self._task is None:
            self._task = self._progress.add_task(self._label, total=None)
        else:
            self._progress.update(self._task, description=self._label)

    def comparison_progress(self, info: Any) -> None:
        if self._progress is None or self._task is None:
            return
        samples = _field(info, "samples", 0)
        est = _field(info, "estimate")
        lo, hi = _field(info, "ci_low"), _field(info, "ci_high")
        host = _field(info, "host_time_s", 0.0) or 0.0
        text = f"{self._label}  n={samples:,}"
        if est is not None and est == est:
            text += f"  {_pct(est)} {_interval(lo, hi, needed=_field(info, 'windows_needed'))}"
        text += f"  host {_hours(host)}"
        self._progress.update(self._task, description=text)

    def comparison_finished(self, purpose: str, result: ComparisonResult, cached: bool) -> None:
        if self._progress is None:
            return
        colour = _COLOURS.get(result.decision, "white")
        origin = " (resumed)" if cached else ""
        print_wrapped(
            self._progress.console,
            f"{purpose:>22}  {change_text(result.baseline, result.candidate):40}  "
            f"{result.decision.value:13} {_pct(result.estimate)} "
            f"{_interval(result.ci_low, result.ci_high, result.reason)}  n={result.samples:,}  "
            f"{_hours(result.host_time_s)}{origin}",
            indent=24,
            styles={result.decision.value: colour},
        )

    def message(self, text: str) -> None:
        if self._progress is not None:
            self._progress.console.print(escape(text))


def print_result(con: Any, r: ComparisonResult) -> None:
    colour = _COLOURS.get(r.decision, "white")
    con.print(escape(f"A: {r.baseline}"))
    con.print(escape(f"B: {r.candidate}"))
    print_wrapped(
        con,
        f"{r.decision.value}: B vs A {_pct(r.estimate)} {_interval(r.ci_low, r.ci_high, r.reason)}, "
        f"{r.samples:,} samples per host, {_hours(r.host_time_s)} host time",
        styles={r.decision.value: colour},
    )
    print_wrapped(con, f"  {r.reason}")
    if r.threading and any(r.threading.values()):
        con.print(escape(f"  threading: {dict(r.threading)}"))


def print_report(con: Any, rep: Any, wall_s: float) -> None:
    t = Table(title=escape(f"{rep.experiment}: {rep.mode} sweep"), title_justify="left")
    for col in (
        "knob",
        "baseline",
        "best",
        "gain vs baseline",
        "compared",
        "pruned (guardrails)",
        "skipped",
    ):
        t.add_column(col, no_wrap=col == "gain vs baseline")
    for o in rep.knobs:
        gain = "-"
        for r in o.results:
            only_this_knob = not set(r.baseline.diff(r.candidate)) - {o.knob}
            if (
                r.candidate.get(o.knob) == o.best_value
                and only_this_knob
                and r.baseline == rep.baseline
            ):
                gain = f"{_pct(r.estimate)} {_interval(r.ci_low, r.ci_high, r.reason)}"
                break
        pruned = ", ".join(format_value(o.knob, v) for v in o.pruned) or "-"  # type: ignore[arg-type]
        t.add_row(
            o.knob,
            escape(format_value(o.knob, o.baseline_value)),  # type: ignore[arg-type]
            escape(format_value(o.knob, o.best_value)),  # type: ignore[arg-type]
            gain,
            str(len(o.results)),
            escape(pruned),
            escape(", ".join(format_value(o.knob, v) for v in o.skipped) or "-"),  # type: ignore[arg-type]
        )
    print_table(con, t)
    if rep.sku is not None:
        sku = rep.sku
        print_wrapped(
            con,
            f"Soft SKU for {sku.service} on {sku.platform}: {sku.configuration}",
            styles={"Soft SKU": "bold"},
        )
        for label, r in (("production", sku.vs_production), ("stock", sku.vs_stock)):
            if r is None:
                continue
            colour = _COLOURS.get(r.decision, "white")
            print_wrapped(
                con,
                f"  vs {label:10} {_pct(r.estimate)} {_interval(r.ci_low, r.ci_high, r.reason)} "
                f"({r.decision.value}, {r.samples:,} samples)",
                styles={r.decision.value: colour},
            )
    resumed = rep.comparisons - rep.measured
    print_wrapped(
        con,
        f"{rep.comparisons} comparisons ({rep.measured} measured"
        + (f", {resumed} resumed" if resumed else "")
        + f"), host time {_hours(rep.host_time_s)} ({rep.host_hours:.2f} host-hours)"
        + f", host-clock to the soft SKU {_hours(getattr(rep, 'clock_s', rep.host_time_s))}"
        + (
            f" (estimated {_hours(rep.estimate_clock_s)})"
            if getattr(rep, "estimate_clock_s", None) is not None
            else ""
        )
        + (
            " (multi-arm groups of the pool)"
            if strategy_of(rep.mode).groups
            else (f" on {rep.pairs} pairs" if getattr(rep, "pairs", 1) > 1 else "")
        )
        + f", wall time {wall_s:.1f} s"
        + (f"; experiment id {rep.experiment_id}" if rep.experiment_id is not None else ""),
    )
    time = getattr(rep, "time", None)
    if time is not None:
        print_wrapped(con, time_text(time, getattr(rep, "time_missing", 0)))
    if getattr(rep, "periods", ""):
        print_wrapped(con, escape(rep.periods))


def print_experiments(con: Any, exps: Sequence[Any]) -> None:
    t = Table("id", "name", "service", "platform", "mode", "status", "started")
    for e in exps:
        d = e.to_dict()
        started = d.get("started_at") or d.get("created_at")
        t.add_row(
            *(
                escape(str(d.get(k, "")))
                for k in ("id", "name", "service", "platform", "mode", "status")
            ),
            _when(started),
        )
    print_table(con, t)


def _when(stamp: Any) -> str:
    """An ISO timestamp as ``YYYY-MM-DD HH:MM`` (UTC), '-' when absent."""
    if not stamp:
        return "-"
    text = str(stamp).replace("T", " ")
    return text[:16] + (" UTC" if text.endswith("+00:00") else "")


def print_comparisons(con: Any, rec: Any, comps: Sequence[Any], skus: Sequence[Any]) -> None:
    d = rec.to_dict()
    con.print(
        f"[bold]{escape(str(d.get('name')))}[/] (id {d.get('id')}): "
        + escape(f"{d.get('service')} on {d.get('platform')}, {d.get('mode')}, {d.get('status')}")
    )
    t = Table(
        "id",
        "purpose",
        "change",
        "decision",
        "estimate",
        "interval",
        "samples",
        "host time",
        "overhead",
    )
    t.columns[5].no_wrap = True
    results = [c.result for c in comps if getattr(c, "result", None) is not None]
    for c in comps:
        cd = c.to_dict()
        res = cd.get("result") or cd
        est, lo, hi = res.get("estimate"), res.get("ci_low"), res.get("ci_high")
        base = Configuration.of(cd.get("baseline") or {})
        cand = Configuration.of(cd.get("candidate") or {})
        t.add_row(
            str(cd.get("id", "")),
            escape(str(cd.get("purpose", ""))),
            escape(change_text(base, cand)),
            str(res.get("decision", cd.get("status", ""))),
            _pct(est) if est is not None else "-",
            _interval(lo, hi, res.get("reason")) if res.get("decision") else "-",
            f"{res.get('samples', 0) or 0:,}",
            _hours(res.get("host_time_s") or 0.0),
            escape(time_short(getattr(c, "result", None) and c.result.time)),
        )
    print_table(con, t)
    if results:
        print_wrapped(con, time_text(*TimeBreakdown.total(results)))
    for s in skus:
        print_sku(con, s)


def print_skus(con: Any, skus: Sequence[Any]) -> None:
    t = Table("id", "service", "platform", "configuration", "vs production", "vs stock")
    for col in t.columns[4:]:
        col.no_wrap = True
    for s in skus:
        d = s.to_dict()
        t.add_row(
            str(d.get("id", "")),
            escape(str(d.get("service", ""))),
            escape(str(d.get("platform", ""))),
            escape(str(Configuration.of(d.get("configuration") or {}))),
            _gain(d.get("vs_production")),
            _gain(d.get("vs_stock")),
        )
    print_table(con, t)


def _gain(v: Any) -> str:
    if not v:
        return "-"
    return f"{_pct(v['estimate'])} {_interval(v['ci_low'], v['ci_high'], v.get('reason'))}"


def print_sku(con: Any, s: Any) -> None:
    d = s.to_dict()
    con.print(
        f"[bold]Soft SKU {d.get('id', '')}[/]: "
        + escape(f"{d.get('service')} on {d.get('platform')}")
    )
    cfg = d.get("configuration") or {}
    for knob, value in cfg.items():
        con.print(escape(f"  {knob:12} {format_value(knob, value)}"))
    print_wrapped(con, f"  vs production: {_gain(d.get('vs_production'))}")
    print_wrapped(con, f"  vs stock:      {_gain(d.get('vs_stock'))}")


def print_dry_run(con: Any, d: Mapping[str, Any]) -> None:
    """``musku sweep FILE --dry-run``'s plan, host checks and host-time estimate."""
    plan, hosts, est = d["plan"], d["hosts"], d["host_time"]
    print_wrapped(con, f"{d['experiment']}: dry run (nothing applied, nothing written)")
    print_wrapped(
        con,
        f"  {plan['mode']} sweep: {plan['comparisons_planned']} comparisons planned -- "
        f"{plan['note']}",
    )
    for k in plan["knobs"]:
        settings = ", ".join(format_value(k["knob"], v) for v in k["settings"]) or "-"
        reboot = " (reboot)" if k["reboot"] else ""
        base = format_value(k["knob"], k["baseline"]) if k["baseline"] is not None else "-"
        print_wrapped(
            con,
            f"    {k['knob']:12} {k['comparisons']:3} vs {base}{reboot}: {settings}",
            indent=8,
        )
    print_wrapped(con, f"    + {plan['validations']} validation(s) of the soft SKU")
    status = "OK" if hosts["ok"] else "FAILED"
    print_wrapped(con, f"  hosts ({hosts['backend']}): {status} {hosts.get('error', '')}")
    for h in hosts.get("hosts", []):
        detail = h.get("check") or h.get("error") or ""
        if "knobs" in h:
            detail = "; ".join(f"{k}: {v}" for k, v in h["knobs"].items())
        print_wrapped(
            con, f"    {h['name']}: {'ok' if h.get('ok', True) else 'FAILED'} {detail}", indent=8
        )
    total, bound = est.get("total_s"), est.get("bound_s")
    guess = f"about {_hours(total)}" if total is not None else "unknown"
    print_wrapped(
        con,
        f"  host time: {guess} (from {est['source']}); at most {_hours(bound)} if every "
        "comparison ran to the sample cap",
    )
    _print_decidable(con, d.get("decidable"))
    pool = d.get("pool")
    if pool:
        idle = f"; {pool['idle']} idles (odd pool)" if pool.get("idle") else ""
        clock = est.get("clock_s")
        when = (
            f"host-clock to the soft SKU about {_hours(clock)} (the tasks' expected host "
            "times scheduled on the pairs as the sweep schedules them, then the validations)"
            if clock is not None
            else "host-clock: no estimate for this mode (its later phases depend on results)"
        )
        print_wrapped(
            con,
            f"  pool: {pool['hosts']} hosts ({pool['first']} .. {pool['last']}), "
            f"{pool['pairs']} pairs{idle}; {when}",
        )
    _print_advice(con, d.get("mode_advice"), d["plan"]["mode"])


def print_check(con: Any, exp: Any, data: Mapping[str, Any]) -> None:
    """``musku check``'s summary (:func:`musku.summary.check_experiment`) as text."""
    # every user string is escaped: a name like "x[/bold]" is text
    con.print(
        f"[bold]{escape(exp.name)}[/]: "
        + escape(
            f"{exp.service.name} on {exp.platform.name}, {exp.mode} sweep, "
            f"{exp.hosts.backend} hosts -- OK"
        )
    )
    for knob, values in exp.space.items():
        con.print(
            escape(
                f"  {knob:12} {len(values):3} settings  production="
                + (
                    format_value(knob, v)
                    if (v := exp.production.get(knob)) is not None
                    else "(not set)"
                )
            )
        )
    con.print(
        escape(
            f"  metric {exp.spec.metric} ({exp.spec.direction.value} is better); guardrails: "
            f"{', '.join(str(g) for g in exp.spec.guardrails) or 'none'}"
        )
    )
    ct = data.get("threading")
    if ct is not None:
        n = len(ct["loads"]) * len(ct["candidates"])
        con.print(
            escape(
                f"  threading co-tuned per configuration: {ct['service']} mid-tier, {n} training "
                f"points (~{n * ct['seconds_per_point'] / 60:.0f} min host time per new "
                "configuration)"
            )
        )
    else:
        con.print("  threading: not co-tuned (hosts keep what their mid-tiers run)")
    _print_decidable(con, data.get("decidable"))
    _print_advice(con, data.get("mode_advice"), exp.mode)


def _print_advice(con: Any, advice: Mapping[str, Any] | None, mode: str) -> None:
    """Which of pairwise and multiarm is expected faster (musku.design.advice), for a pool
    of >= 3 hosts or a multiarm sweep."""
    groups = bool(strategy_of(mode).groups)
    if not advice or (advice["hosts"] < 3 and not groups):
        return
    hint = ""
    if groups and advice["faster"] == "pairwise":
        hint = f' (this file runs {mode}: mode = "independent" runs pairwise)'
    elif not groups and advice["faster"] == "multiarm":
        hint = f' (this file runs {mode}: mode = "multiarm" runs multi-arm groups)'
    print_wrapped(con, f"  mode: {advice['text']}{hint}")


def _print_decidable(con: Any, fit: Mapping[str, Any] | None) -> None:
    """The sample cap against min_effect (musku.summary.decidable): a warning line when the
    cap cannot allow a decision with the noise expected, naming the cap that would."""
    if not fit:
        return
    if fit.get("ok"):
        hw = fit.get("halfwidth_at_cap")
        if hw is not None:
            print_wrapped(
                con,
                f"  sample cap: a decision is possible (interval at the cap at best "
                f"±{hw * 100:.1f} % with the noise of {fit.get('noise_source')})",
            )
        return
    print_wrapped(
        con,
        f"  warning: {fit.get('reason')} (noise from {fit.get('noise_source')})",
        styles={"warning": "yellow"},
    )


def print_sku_diff(con: Any, diff: Any) -> None:
    """``musku sku diff`` (:func:`musku.summary.sku_diff`) as a table."""
    a, b = diff.skus
    t = Table(
        "knob",
        escape(f"#{diff.first} {a.service}/{a.platform}"),
        escape(f"#{diff.second} {b.service}/{b.platform}"),
        "same?",
    )
    for r in diff.rows:
        fa = format_value(r["knob"], r["first"]) if r["first"] is not None else "-"
        fb = format_value(r["knob"], r["second"]) if r["second"] is not None else "-"
        t.add_row(r["knob"], escape(fa), escape(fb), "same" if r["same"] else "differs")
    con.print(t)


def _host_summary(hosts: list[str]) -> str:
    """A pool's hosts in a table cell: up to four by name, more as ``first .. last (N)``
    (all of them in --json)."""
    if not hosts:
        return "-"
    if len(hosts) <= 4:
        return ", ".join(hosts)
    return f"{hosts[0]} .. {hosts[-1]} ({len(hosts)})"


def print_experiment_claims(con: Any, rows: Sequence[Mapping[str, Any]]) -> None:
    """``musku experiments``: rows of :func:`musku.sweep.queue.experiment_rows`."""

    def age(value: Any) -> str:
        return "-" if value is None else f"{float(value):.0f}s ago"

    if not rows:
        con.print("no experiments")
        return
    t = Table("id", "name", "status", "hosts", "controller", "heartbeat", "queued/claimed/done")
    for r in rows:
        ctl = r.get("controller")
        q = r.get("queue") or {}
        claims = r.get("claims") or []
        # no queue (SQLite runs one controller per experiment, docs/cli.md): "-", not 0/0/0
        counts = (
            "-"
            if not any(q.values())
            else f"{q.get('queued', 0)}/{q.get('claimed', 0)}/{q.get('done', 0)}"
        )
        if claims:
            counts += (
                " ("
                + ", ".join(f"{c['claimer']} {age(c['heartbeat_age_s'])}" for c in claims)
                + ")"
            )
        t.add_row(
            str(r["id"]),
            escape(str(r["name"])),
            str(r["status"]),
            escape(_host_summary(list(r.get("hosts") or []))),
            escape(ctl["id"]) if ctl else "-",
            age(ctl["heartbeat_age_s"]) if ctl else "-",
            escape(counts),
        )
    print_table(con, t)
