"""A report figure from outside musku (tests/report/toyfigure.py) plugs in with no edit to
musku: ``musku report RUN --figure module:Class`` (the real CLI on a real sweep's database)
draws it in the "Figures" section and as its own file with ``--format svg``; registered by
name or shipped as a ``musku.figures`` entry point, its short name works. The built-in
figures are laid out from the registry exactly as before it: the page's skeleton equals the
one the pre-registry code wrote on the same sweep (tests/report/toy-report.skeleton), and the
toy figure adds only its section and link. Bad plug-ins (tests/report/badfigures.py): one line
naming them, exit 3, before the database is read (docs/architecture.md "How to add a report
figure")."""

from __future__ import annotations

import base64
import re
from collections.abc import Iterator
from pathlib import Path

import pytest

from musku import __version__
from musku.errors import InputError
from musku.registry import PluginError
from musku.report import data as report_data
from musku.report.figure import FIGURES, select
from musku.report.html import render, write_figures
from musku.storage import open_store
from tests.cli.test_exit_codes import musku, one_error_line
from tests.report.skeleton import skeleton
from tests.report.toyfigure import TARGET, TITLE, DecisionCounts, counts

GOLDEN = Path(__file__).with_name("toy-report.skeleton")
BUILTINS = ["knob", "softsku", "host-time", "time-breakdown"]


@pytest.fixture(autouse=True)
def forget_the_toy() -> Iterator[None]:
    yield
    if "decision-counts" in FIGURES.names():
        FIGURES.unregister("decision-counts")


def _golden() -> list[str]:
    return [ln for ln in GOLDEN.read_text().splitlines() if ln and not ln.startswith("#")]


def test_musku_report_draws_it_when_asked(toy_db: tuple[str, Path], tmp_path: Path) -> None:
    url, _ = toy_db
    out = tmp_path / "toy.html"
    proc = musku("report", "toy", "--db", url, "-o", str(out), "--figure", TARGET)
    assert proc.returncode == 0, proc.stderr
    text = out.read_text(encoding="utf-8")
    m = re.search(
        r'<h2 id="figures">Figures</h2><section class="figure-section"><h3>'
        + TITLE
        + r'</h3><figure class="figure" id="fig-decision-counts"><img src="data:image/svg\+xml;'
        r'base64,([^"]+)" alt="Decisions per run"><figcaption>How many',
        text,
    )
    assert m, "the toy figure is not in the page"
    svg = base64.b64decode(m.group(1)).decode()
    with open_store(url) as store:
        (d,) = [report_data.load(store, "toy", series=False)]
    for decision, n in counts(d).items():  # its legend: what it counted in the real DB
        assert f"{decision.value} ({n})" in svg
    assert '<a href="#figures">figures</a>' in text
    # the rest of the page is the built-ins' page: the toy adds its link and section only
    extra = ["a href=#figures", "h2 id=figures", "section class=figure-section", "h3"]
    extra += ["figure id=fig-decision-counts class=figure", "img src=data:image/svg+xml"]
    extra += ["figcaption"]
    lines = skeleton(text)
    assert [ln for ln in lines if ln not in extra[:1]] != lines  # the link is there
    start = lines.index("h2 id=figures")
    assert lines[start : start + 6] == extra[1:]
    assert [ln for ln in lines[:start] if ln != extra[0]] + lines[start + 6 :] == _golden()


def test_the_builtins_page_is_the_one_before_the_registry(toy_db: tuple[str, Path]) -> None:
    url, _ = toy_db
    with open_store(url) as store:
        sides = [report_data.load(store, "toy")]
    assert [f.name for f in select()] == BUILTINS
    text = render(sides, version=__version__)
    assert skeleton(text) == _golden()
    assert 'id="figures"' not in text  # no toy figure asked for: no section, no link


def test_its_file_and_its_short_name(
    toy_db: tuple[str, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Registered by a ``musku.figures`` entry point (a real dist-info directory on
    sys.path), its short name works, and ``--format svg`` writes it after the built-ins'."""
    url, _ = toy_db
    dist = tmp_path / "toyfigures-1.0.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: toyfigures\nVersion: 1.0\n")
    (dist / "entry_points.txt").write_text(f"[musku.figures]\ndecision-counts = {TARGET}\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(FIGURES, "_entry_points_read", False)
    assert FIGURES.names() == BUILTINS + ["decision-counts"]
    assert [f.name for f in select()] == BUILTINS  # installed, not drawn unless asked for
    figures = select(["decision-counts"])
    assert isinstance(figures[-1], DecisionCounts)
    with open_store(url) as store:
        sides = [report_data.load(store, "toy", series=False)]
    paths = write_figures(sides, tmp_path / "svg", "svg", figures)
    names = [p.name for p in paths]
    assert names[:3] == ["knob-core_count.svg", "knob-thp.svg", "knob-shp.svg"]
    assert names[3:] == ["softsku.svg", "host-time.svg", "decision-counts.svg"]
    assert TITLE in (tmp_path / "svg" / "decision-counts.svg").read_text()


@pytest.mark.parametrize(
    ("target", "needle"),
    [
        ("tests.report.badfigures:Twice", "registers the name 'knob' twice"),
        ("tests.report.badfigures:NoDraw", "lacks required method(s): draw"),
        ("tests.report.badfigures:Nowhere", "section 'appendix' is not one of"),
        ("tests.report.badfigures:NeedsTheMoon", "needs unknown data 'moon'"),
        ("tests.metrics.toysampler:FileHandles", "is not a musku.report.figure.ReportFigure"),
        ("tests.report.nosuch:Figure", "cannot import"),
        ("no-such-figure", "unknown report figure 'no-such-figure'"),
    ],
)
def test_a_bad_plugin_is_one_line_before_the_db_is_read(
    tmp_path: Path, target: str, needle: str
) -> None:
    with pytest.raises(InputError, match=re.escape(needle)):
        select([target])
    db = tmp_path / "absent.db"  # never opened: the figures are checked first
    out = tmp_path / "r.html"
    proc = musku("report", "toy", "--db", f"sqlite:///{db}", "-o", str(out), "--figure", target)
    assert proc.returncode == 3, proc.stderr
    line = one_error_line(proc)
    assert needle in line and target in line, line
    assert not db.exists() and not out.exists()


def test_a_figure_that_fails_to_draw_is_one_line(toy_db: tuple[str, Path], tmp_path: Path) -> None:
    url, _ = toy_db
    with open_store(url) as store:
        sides = [report_data.load(store, "toy", series=False)]
    with pytest.raises(PluginError, match="'crashes' failed to draw: ZeroDivisionError"):
        write_figures(sides, tmp_path / "svg", "svg", select(["tests.report.badfigures:Crashes"]))
    FIGURES.unregister("crashes")
