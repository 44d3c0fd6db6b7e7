"""An out-of-tree report figure, as a user would write one outside musku: how many comparisons
of each run ended in each decision (a stacked bar per run). Nothing in musku names it:
``musku report RUN --figure tests.report.toyfigure:DecisionCounts`` draws it in the report's
"Figures" section and, with ``--format svg``, as ``decision-counts.svg``
(tests/report/test_out_of_tree_figure.py)."""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from typing import ClassVar

from matplotlib.figure import Figure

from musku.domain import Decision
from musku.report.data import ReportData
from musku.report.figure import ReportFigure

TARGET = "tests.report.toyfigure:DecisionCounts"
TITLE = "Decisions per run"


def counts(d: ReportData) -> Counter[Decision]:
    return Counter(c.result.decision for c in d.comparisons if c.result is not None)


class DecisionCounts(ReportFigure):
    name: ClassVar[str] = "decision-counts"
    title: ClassVar[str] = TITLE
    caption: ClassVar[str] = "How many comparisons of each run ended in each decision."
    needs: ClassVar[tuple[str, ...]] = ("comparisons",)

    def applies(self, sides: Sequence[ReportData]) -> bool:
        return any(counts(d) for d in sides)

    def draw(self, sides: Sequence[ReportData], knob: str = "") -> Figure | None:
        fig = Figure(figsize=(6.0, 0.6 * len(sides) + 1.4), layout="constrained")
        ax = fig.add_subplot()
        labels = [f"#{d.experiment.id} {d.experiment.name}" for d in sides]
        left = [0] * len(sides)
        for decision in Decision:
            n = [counts(d)[decision] for d in sides]
            if any(n):
                ax.barh(labels, n, left=left, label=f"{decision.value} ({sum(n)})")
                left = [a + b for a, b in zip(left, n, strict=True)]
        ax.set_xlabel("comparisons")
        ax.set_title(TITLE, fontsize=10, loc="left")
        ax.legend(fontsize=7, loc="lower right")
        return fig
