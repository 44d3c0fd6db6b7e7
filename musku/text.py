"""Plain-text forms of sweep results (no display library): the words the CLI, the live
progress view, the sweep's own messages and the HTML report share."""

from __future__ import annotations

from musku.domain import Configuration, Value, format_value


def pct(x: float) -> str:
    """A relative change: ``+4.67 %``."""
    return f"{x * 100:+.2f} %"


def interval(lo: float, hi: float) -> str:
    """A relative interval: ``[+0.06, +9.50] %``."""
    return f"[{lo * 100:+.2f}, {hi * 100:+.2f}] %"


def hours(seconds: float) -> str:
    """A duration in the largest unit that reads well: ``8.53 h``, ``12.5 min``, ``40 s``."""
    if seconds >= 3600:
        return f"{seconds / 3600:.2f} h"
    if seconds >= 60:
        return f"{seconds / 60:.1f} min"
    return f"{seconds:.0f} s"


def change_text(
    baseline: Configuration,
    candidate: Configuration,
    *,
    arrow: str = "->",
    same: str = "A/A (same configuration)",
) -> str:
    """What a candidate changes: ``thp always -> never, core_freq 2.0 GHz -> 2.4 GHz``."""
    diff = baseline.diff(candidate)
    if not diff:
        return same

    def shown(knob: str, v: Value | None) -> str:
        return format_value(knob, v) if v is not None else "-"

    return ", ".join(f"{k} {shown(k, a)} {arrow} {shown(k, b)}" for k, (a, b) in diff.items())
