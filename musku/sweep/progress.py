"""Live progress of a sweep (rich) and the printed reports of the CLI's read commands."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from rich.markup import escape

from musku.domain import ComparisonResult, Configuration, Decision, format_value

_COLOURS = {
    Decision.BETTER: "green",
    Decision.WORSE: "red",
    Decision.NO_DIFFERENCE: "yellow",
    Decision.INCONCLUSIVE: "magenta",
    Decision.GUARDRAIL: "red",
    Decision.ABORTED: "grey50",
}


def _pct(x: float) -> str:
    return f"{x * 100:+.2f} %"


def _interval(lo: float, hi: float) -> str:
    return f"[{lo * 100:+.2f}, {hi * 100:+.2f}] %"


def _hours(seconds: float) -> str:
    if seconds >= 3600:
        return f"{seconds / 3600:.2f} h"
    if seconds >= 60:
        return f"{seconds / 60:.1f} min"
    return f"{seconds:.0f} s"


def change_text(baseline: Configuration, candidate: Configuration) -> str:
    diff = baseline.diff(candidate)
    if not diff:
        return "A/A (same configuration)"
    return ", ".join(
        f"{k} {format_value(k, a) if a is not None else '-'} -> {format_value(k, b) if b is not None else '-'}"
        for k, (a, b) in diff.items()
    )


def _field(info: Any, name: str, default: Any = None) -> Any:
    if isinstance(info, Mapping):
        return info.get(name, default)
    return getattr(info, name, default)


class LiveProgress:
    """Rich live display: current knob and comparison, samples, interval narrowing, decisions."""

    def __init__(self, *, enabled: bool = True) -> None:
        self.enabled = enabled
        self._progress: Any = None
        self._task: Any = None
        self._label = ""
        self.console: Any = None

    def __enter__(self) -> LiveProgress:
        if self.enabled:
            from rich.console import Console
            from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

            self.console = Console(stderr=True, highlight=False)
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
        if est is not None and lo is not None and hi is not None and lo == lo and hi == hi:
            text += f"  {_pct(est)} {_interval(lo, hi)}"
        text += f"  host {_hours(host)}"
        self._progress.update(self._task, description=text)

    def comparison_finished(self, purpose: str, result: ComparisonResult, cached: bool) -> None:
        if self._progress is None:
            return
        colour = _COLOURS.get(result.decision, "white")
        origin = " (resumed)" if cached else ""
        self._progress.console.print(
            f"{escape(f'{purpose:>22}  {change_text(result.baseline, result.candidate):40}')}  "
            f"[{colour}]{result.decision.value:13}[/] {_pct(result.estimate)} "
            f"{_interval(result.ci_low, result.ci_high)}  n={result.samples:,}  "
            f"{_hours(result.host_time_s)}{origin}"
        )

    def message(self, text: str) -> None:
        if self._progress is not None:
            self._progress.console.print(escape(text))


def print_result(con: Any, r: ComparisonResult) -> None:
    colour = _COLOURS.get(r.decision, "white")
    con.print(escape(f"A: {r.baseline}"))
    con.print(escape(f"B: {r.candidate}"))
    con.print(
        f"[{colour}]{r.decision.value}[/]: B vs A {_pct(r.estimate)} {_interval(r.ci_low, r.ci_high)}, "
        f"{r.samples:,} samples per host, {_hours(r.host_time_s)} host time"
    )
    con.print(escape(f"  {r.reason}"))
    if r.threading and any(r.threading.values()):
        con.print(escape(f"  threading: {dict(r.threading)}"))


def print_report(con: Any, rep: Any, wall_s: float) -> None:
    from rich.table import Table

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
        t.add_column(col)
    for o in rep.knobs:
        gain = "-"
        for r in o.results:
            only_this_knob = not set(r.baseline.diff(r.candidate)) - {o.knob}
            if (
                r.candidate.get(o.knob) == o.best_value
                and only_this_knob
                and r.baseline == rep.baseline
            ):
                gain = f"{_pct(r.estimate)} {_interval(r.ci_low, r.ci_high)}"
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
    con.print(t)
    if rep.sku is not None:
        sku = rep.sku
        con.print(
            f"[bold]Soft SKU[/] for {escape(f'{sku.service} on {sku.platform}: {sku.configuration}')}"
        )
        for label, r in (("production", sku.vs_production), ("stock", sku.vs_stock)):
            if r is None:
                continue
            colour = _COLOURS.get(r.decision, "white")
            con.print(
                f"  vs {label:10} [{colour}]{_pct(r.estimate)}[/] {_interval(r.ci_low, r.ci_high)} "
                f"({r.decision.value}, {r.samples:,} samples)"
            )
    resumed = rep.comparisons - rep.measured
    con.print(
        f"{rep.comparisons} comparisons ({rep.measured} measured"
        + (f", {resumed} resumed" if resumed else "")
        + f"), host time {_hours(rep.host_time_s)}, wall time {wall_s:.1f} s"
        + (f"; experiment id {rep.experiment_id}" if rep.experiment_id is not None else "")
    )


def print_experiments(con: Any, exps: Sequence[Any]) -> None:
    from rich.table import Table

    t = Table("id", "name", "service", "platform", "mode", "status", "started")
    for e in exps:
        d = e.to_dict()
        t.add_row(
            *(
                escape(str(d.get(k, "")))
                for k in ("id", "name", "service", "platform", "mode", "status", "started")
            )
        )
    con.print(t)


def print_comparisons(con: Any, rec: Any, comps: Sequence[Any], skus: Sequence[Any]) -> None:
    from rich.table import Table

    d = rec.to_dict()
    con.print(
        f"[bold]{escape(str(d.get('name')))}[/] (id {d.get('id')}): "
        + escape(f"{d.get('service')} on {d.get('platform')}, {d.get('mode')}, {d.get('status')}")
    )
    t = Table("id", "purpose", "change", "decision", "estimate", "interval", "samples", "host time")
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
            _interval(lo, hi) if lo is not None and hi is not None else "-",
            f"{res.get('samples', 0) or 0:,}",
            _hours(res.get("host_time_s") or 0.0),
        )
    con.print(t)
    for s in skus:
        print_sku(con, s)


def print_skus(con: Any, skus: Sequence[Any]) -> None:
    from rich.table import Table

    t = Table("id", "service", "platform", "configuration", "vs production", "vs stock")
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
    con.print(t)


def _gain(v: Any) -> str:
    if not v:
        return "-"
    return f"{_pct(v['estimate'])} {_interval(v['ci_low'], v['ci_high'])}"


def print_sku(con: Any, s: Any) -> None:
    d = s.to_dict()
    con.print(
        f"[bold]Soft SKU {d.get('id', '')}[/]: "
        + escape(f"{d.get('service')} on {d.get('platform')}")
    )
    cfg = d.get("configuration") or {}
    for knob, value in cfg.items():
        con.print(escape(f"  {knob:12} {format_value(knob, value)}"))
    con.print(f"  vs production: {_gain(d.get('vs_production'))}")
    con.print(f"  vs stock:      {_gain(d.get('vs_stock'))}")
