"""Report figures the registry refuses when ``musku report --figure`` names them: one line
naming the plug-in, exit 3, before the database is read (tests/report/test_out_of_tree_figure.py)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, ClassVar

from musku.report.data import ReportData
from musku.report.figure import ReportFigure


class _Drawn(ReportFigure):
    name: ClassVar[str] = "drawn"
    title: ClassVar[str] = "a figure"

    def draw(self, sides: Sequence[ReportData], knob: str = "") -> Any:
        return None


class Twice(_Drawn):
    """Takes the built-in knob figure's name."""

    name: ClassVar[str] = "knob"


class NoDraw(ReportFigure):  # abstract on purpose: no draw()
    name: ClassVar[str] = "no-draw"
    title: ClassVar[str] = "no draw"


class Nowhere(_Drawn):
    name: ClassVar[str] = "nowhere"
    section: ClassVar[str] = "appendix"


class NeedsTheMoon(_Drawn):
    name: ClassVar[str] = "needs-moon"
    needs: ClassVar[tuple[str, ...]] = ("comparisons", "moon")


class Crashes(_Drawn):
    """Draws with a bug of its own: one line at draw time, not a traceback."""

    name: ClassVar[str] = "crashes"

    def draw(self, sides: Sequence[ReportData], knob: str = "") -> Any:
        return 1 / 0
