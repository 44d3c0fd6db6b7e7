"""Plain-text forms of sweep results (no display library): the words the CLI, the live
progress view, the sweep's own messages and the HTML report share."""

from __future__ import annotations

import math
import re

from musku.domain import Configuration, TimeBreakdown, Value, format_value

_NEEDS = re.compile(r"needs about ([\d,]+) more windows")


def pct(x: float) -> str:
    """A relative change: ``+4.67 %``."""
    return f"{x * 100:+.2f} %"


def windows_needed(reason: str | None) -> int | None:
    """The "needs about N more windows" a comparison's reason gives (None: it gives none)."""
    m = _NEEDS.search(reason or "")
    return int(m.group(1).replace(",", "")) if m else None


def no_interval(reason: str | None = None, needed: int | None = None) -> str:
    """What a person sees instead of an unbounded interval: ``no interval yet (needs about 12
    more windows)``; the count from ``needed`` or the comparison's ``reason``."""
    n = needed if needed is not None else windows_needed(reason)
    return "no interval yet" + (f" (needs about {n:,} more windows)" if n is not None else "")


def interval_note(
    lo: float | None, hi: float | None, reason: str | None = None, needed: int | None = None
) -> str | None:
    """:func:`no_interval` when the interval is missing or unbounded, else None (JSON gives
    the interval's ends as null and this as its reason)."""
    if lo is None or hi is None or not (math.isfinite(lo) and math.isfinite(hi)):
        return no_interval(reason, needed)
    return None


def interval(
    lo: float | None, hi: float | None, reason: str | None = None, needed: int | None = None
) -> str:
    """A relative interval: ``[+0.06, +9.50] %``; never an infinite one: ``no interval yet
    (needs about N more windows)`` instead (:func:`no_interval`)."""
    note = interval_note(lo, hi, reason, needed)
    if note is not None or lo is None or hi is None:
        return note or no_interval(reason, needed)
    return f"[{lo * 100:+.2f}, {hi * 100:+.2f}] %"


def hours(seconds: float) -> str:
    """A duration in the largest unit that reads well: ``8.53 h``, ``12.5 min``, ``40 s``."""
    if seconds >= 3600:
        return f"{seconds / 3600:.2f} h"
    if seconds >= 60:
        return f"{seconds / 60:.1f} min"
    return f"{seconds:.0f} s"


def time_text(time: TimeBreakdown, missing: int = 0) -> str:
    """A time breakdown in host hours: ``host time: measuring 9.10 h, warm-up 5.20 h,
    switching 0.10 h, reboots 1.40 h``, and how many comparisons recorded none."""
    text = "host time: " + ", ".join(
        f"{name} {secs / 3600:.2f} h" for name, secs in zip(TIME_WORDS, time.seconds(), strict=True)
    )
    if missing:
        text += f" ({missing} comparison(s) without a breakdown)"
    return text


def time_short(time: TimeBreakdown | None) -> str:
    """One comparison's overhead for a table cell: ``warm-up 4.9 min, switching 4 s`` (the
    parts other than measuring that took any time; ``-`` when none recorded)."""
    if time is None:
        return "-"
    parts = [
        f"{name} {hours(secs)}"
        for name, secs in zip(TIME_WORDS[1:], time.seconds()[1:], strict=True)
        if secs > 0
    ]
    return ", ".join(parts) or "none"


TIME_WORDS = ("measuring", "warm-up", "switching", "reboots")


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
