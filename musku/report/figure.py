"""A report figure is one registered object: :class:`ReportFigure`, in :data:`FIGURES`.

The report's page (:mod:`musku.report.html`) and its figure files (``--format png|svg``) are
laid out from the registry: each figure says its name, its title, which of
:class:`~musku.report.data.ReportData`'s fields it reads (``needs``), whether it applies to
the runs at hand (``applies``), how it draws (``draw(sides) -> Figure | None``; per knob for a
``per_knob`` figure), and where it goes (``section``, then ``order`` within it). The built-ins
(``knob``, ``softsku``, ``host-time``, ``time-breakdown``: :mod:`musku.report.builtin`) are
aliases, so matplotlib loads only when a report is drawn. An out-of-tree figure is
``"package.module:Class"`` given to ``musku report --figure``, a ``musku.figures`` entry point,
or ``FIGURES.register(target)``; it is checked when it is resolved (before the report reads
the database): a name registered twice, a missing method, an unknown section or data field is
one line naming it, exit 3 (:class:`~musku.registry.PluginError`).

Light on purpose: nothing here imports matplotlib or numpy.
"""

from __future__ import annotations

import re
from abc import ABC, abstractmethod
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Any, ClassVar

from musku.errors import MuskuError
from musku.registry import PluginError, Registry

if TYPE_CHECKING:
    from matplotlib.figure import Figure

    from musku.report.data import ReportData

SECTIONS = ("knob", "softsku", "host-time", "figures")
"""Where a figure goes on the page, in page order: inside each knob's section (a ``per_knob``
figure, before the knob's decisions), the soft SKU's section, the host-time section (after
its totals), or the "Figures" section after it (the out-of-tree figures' place; its heading
and navigation link appear only when one of its figures is drawn)."""

DATA = ("experiment", "meta", "comparisons", "softskus", "series", "calibrations")
"""The :class:`~musku.report.data.ReportData` fields a figure may need."""

FIGURE_METHODS = ("applies", "draw", "attributes", "alt", "stem")
"""What the report calls on every figure."""


class ReportFigure(ABC):
    """One figure of ``musku report``. Subclass it, set the class attributes, write
    :meth:`draw`; override the rest only to change the defaults."""

    name: ClassVar[str]
    """Its registered name, and its file's name (``NAME.svg``; ``NAME-KNOB.svg`` per knob)."""
    title: ClassVar[str]
    """One line: the image's alternative text, and its heading in the "figures" section."""
    caption: ClassVar[str] = ""
    """What the figure shows, under it (HTML: escape what you put in it)."""
    needs: ClassVar[tuple[str, ...]] = ("comparisons",)
    """The :data:`DATA` fields it reads; by default it applies when each is non-empty on
    at least one side."""
    section: ClassVar[str] = "figures"
    """One of :data:`SECTIONS`."""
    order: ClassVar[int] = 100
    """Its place within its section (lower first; then by name)."""
    default: ClassVar[bool] = False
    """Drawn in every report (the built-ins); otherwise only when asked for by name
    (``musku report --figure NAME``)."""
    per_knob: ClassVar[bool] = False
    """One figure per knob the runs varied (``draw(sides, knob)``), in that knob's section."""
    file: ClassVar[bool] = True
    """Written as a file by ``musku report --format png|svg``."""

    def applies(self, sides: Sequence[ReportData]) -> bool:
        """Whether to draw it for these runs (default: the data it needs is there)."""
        return all(any(_present(getattr(d, field)) for d in sides) for field in self.needs)

    @abstractmethod
    def draw(self, sides: Sequence[ReportData], knob: str = "") -> Figure | None:
        """The figure (a :class:`matplotlib.figure.Figure`, drawn with the object API, no
        pyplot), or None when these runs have nothing to show. ``knob``: a ``per_knob``
        figure's knob."""

    def attributes(self, knob: str = "") -> tuple[tuple[str, str], ...]:
        """The ``<figure>`` element's attributes, in order (its id is the page's anchor)."""
        return (("class", "figure"), ("id", f"fig-{self.name}" + (f"-{knob}" if knob else "")))

    def alt(self, knob: str = "") -> str:
        """The image's alternative text."""
        return f"{knob}: {self.title}" if knob else self.title

    def stem(self, knob: str = "") -> str:
        """Its file's name without the extension (``--format png|svg``)."""
        return f"{self.name}-{slug(knob)}" if knob else self.name


def _present(value: Any) -> bool:
    return value is not None and (not hasattr(value, "__len__") or len(value) > 0)


def slug(text: str) -> str:
    """``text`` as a file name part."""
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", text)


def _figure_shape(target: str, obj: Any) -> None:
    """A figure's title, section, order and data fields."""

    def refuse(what: str) -> PluginError:
        return PluginError(f"report figure {target!r} ({obj.name}): {what}")

    title = getattr(obj, "title", None)
    if not isinstance(title, str) or not title.strip() or "\n" in title:
        raise refuse("title must be one line of text")
    if obj.section not in SECTIONS:
        raise refuse(f"section {obj.section!r} is not one of {', '.join(SECTIONS)}")
    if obj.per_knob != (obj.section == "knob"):
        raise refuse("per_knob figures, and only they, go in the 'knob' section")
    if isinstance(obj.order, bool) or not isinstance(obj.order, int):
        raise refuse(f"order must be an integer, not {obj.order!r}")
    needs = obj.needs
    if isinstance(needs, str) or not all(isinstance(n, str) for n in needs):
        raise refuse("needs must be a tuple of ReportData field names")
    unknown = [n for n in needs if n not in DATA]
    if unknown:
        raise refuse(f"needs unknown data {unknown[0]!r} (ReportData has: {', '.join(DATA)})")
    if not isinstance(obj.caption, str):
        raise refuse("caption must be text")


FIGURES = Registry(
    "report figure",
    {
        "knob": "musku.report.builtin:KnobFigure",
        "softsku": "musku.report.builtin:SoftSkuFigure",
        "host-time": "musku.report.builtin:HostTimeFigure",
        "time-breakdown": "musku.report.builtin:TimeBreakdownFigure",
    },
    group="musku.figures",
    required=FIGURE_METHODS,
    verify=_figure_shape,
    base=ReportFigure,
)
"""Report figures (``musku report --figure NAME``): :mod:`musku.report.figure`."""


def select(names: Iterable[str] = ()) -> list[ReportFigure]:
    """The figures a report draws, in page order: every registered figure that is drawn by
    default, plus ``names`` (registered names or ``module:Class``), each loaded and checked
    (one line naming a bad one, exit 3)."""
    chosen: dict[str, ReportFigure] = {}
    for name in FIGURES.names():
        fig: ReportFigure = FIGURES.get(name)
        if fig.default:
            chosen[fig.name] = fig
    for name in names:
        fig = FIGURES.get(name)
        chosen[fig.name] = fig
    return sorted(chosen.values(), key=lambda f: (SECTIONS.index(f.section), f.order, f.name))


def draw(figure: ReportFigure, sides: Sequence[ReportData], knob: str = "") -> Figure | None:
    """``figure.draw``, with a plug-in's own failure as one line naming it (exit 3)."""
    try:
        return figure.draw(sides, knob)
    except MuskuError:
        raise
    except Exception as exc:  # a plug-in's own bug: its one line, not a traceback
        raise PluginError(
            f"report figure {figure.name!r} failed to draw: {type(exc).__name__}: {exc}"
        ) from None


__all__ = ["DATA", "FIGURES", "SECTIONS", "ReportFigure", "draw", "select", "slug"]
