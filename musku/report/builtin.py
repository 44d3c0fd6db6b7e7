"""The built-in report figures as registered objects (:data:`musku.report.figure.FIGURES`):
each wraps its drawing function in :mod:`musku.report.figures` and says where it goes and how
its ``<figure>`` element reads (ids and captions the page has always had)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, ClassVar

from musku.report import figures as F
from musku.report.figure import ReportFigure

if TYPE_CHECKING:
    from matplotlib.figure import Figure

    from musku.report.data import ReportData


class KnobFigure(ReportFigure):
    """The paper's Figs. 14-18, one per knob (:func:`musku.report.figures.knob_figure`)."""

    name: ClassVar[str] = "knob"
    title: ClassVar[str] = "relative throughput per setting with 95 % intervals"
    caption: ClassVar[str] = (
        "Each tested setting's effect against the baseline (dot, with its interval); "
        "◆ the baseline, ✕ pruned by a guardrail, ☆ the setting the soft SKU took; "
        "the grey band is ±min_effect (no difference)."
    )
    section: ClassVar[str] = "knob"
    order: ClassVar[int] = 0
    default: ClassVar[bool] = True
    per_knob: ClassVar[bool] = True

    def draw(self, sides: Sequence[ReportData], knob: str = "") -> Figure | None:
        return F.knob_figure(knob, sides)

    def attributes(self, knob: str = "") -> tuple[tuple[str, str], ...]:
        return (("class", "knob"), ("id", f"knob-{knob}"), ("data-knob", knob))


class SoftSkuFigure(ReportFigure):
    """The paper's Fig. 19 (:func:`musku.report.figures.softsku_figure`)."""

    name: ClassVar[str] = "softsku"
    title: ClassVar[str] = "soft SKU against production and stock"
    caption: ClassVar[str] = (
        "The soft SKU's gain (solid bar) with its interval (whiskers), validated "
        "by A/B against the production and the stock configuration; the hatched bar under "
        "it is the paper's gain for this service and platform, where the paper has one "
        "(Sriraman et al., ISCA 2019, Fig. 19)."
    )
    needs: ClassVar[tuple[str, ...]] = ("softskus",)
    section: ClassVar[str] = "softsku"
    order: ClassVar[int] = 0
    default: ClassVar[bool] = True

    def draw(self, sides: Sequence[ReportData], knob: str = "") -> Figure | None:
        return F.softsku_figure(sides)

    def attributes(self, knob: str = "") -> tuple[tuple[str, str], ...]:
        return (("class", "softsku"), ("id", "fig-softsku"))


class HostTimeFigure(ReportFigure):
    """Host time per knob against the paper's 5-10 h
    (:func:`musku.report.figures.host_time_figure`)."""

    name: ClassVar[str] = "host-time"
    title: ClassVar[str] = "host time per knob against the paper"
    caption: ClassVar[str] = (
        "Host time the comparisons took, summed (warm-up and reboots included; "
        "virtual time on simulated hosts), by knob; the hatched band is the paper's 5-10 h a "
        "sweep. On a pool, pairs run at once: the wait is shorter (host-clock, "
        "docs/fleet.md)."
    )
    section: ClassVar[str] = "host-time"
    order: ClassVar[int] = 0
    default: ClassVar[bool] = True

    def draw(self, sides: Sequence[ReportData], knob: str = "") -> Figure | None:
        return F.host_time_figure(sides)

    def attributes(self, knob: str = "") -> tuple[tuple[str, str], ...]:
        return (("id", "fig-host-time"),)


class TimeBreakdownFigure(ReportFigure):
    """Where the host time went (:func:`musku.report.figures.time_breakdown_figure`); none
    without recorded breakdowns. Shown in the page only, as before the registry (no file)."""

    name: ClassVar[str] = "time-breakdown"
    title: ClassVar[str] = "host time by measuring, warm-up, switching, reboots"
    caption: ClassVar[str] = (
        "The same host time by what it was spent on: windows the tests used "
        "(measuring), windows discarded as warm-up after each apply, applies without a reboot "
        "(switching), applies that rebooted a host (reboots); docs/cli.md."
    )
    section: ClassVar[str] = "host-time"
    order: ClassVar[int] = 10
    default: ClassVar[bool] = True
    file: ClassVar[bool] = False

    def draw(self, sides: Sequence[ReportData], knob: str = "") -> Figure | None:
        return F.time_breakdown_figure(sides)

    def attributes(self, knob: str = "") -> tuple[tuple[str, str], ...]:
        return (("id", "fig-time-breakdown"),)
