"""`musku report` of pool sweeps (issue 32): a pairwise sweep on a pool of simulated hosts and a
multi-arm sweep report without error (the figures used to expect hosts 0 and 1: `Axis limits
cannot be NaN or Inf`), each comparison's figure names the hosts that measured it and draws
the relative difference, series are binned (a bounded figure whatever the comparison's length),
PNG figures come at 200 dpi, and --compare marks each side with its own shape."""

from __future__ import annotations

import base64
import re
import struct
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from musku.experiment import load_experiment
from musku.report import figures as F
from musku.storage import open_store
from musku.sweep import run_sweep
from musku.sweep.runner import NullProgress
from tests.cli.test_exit_codes import musku
from tests.fixtures.toy import EXPERIMENT, MODEL


def _pool(text: str, fleet: int) -> str:
    return text.replace('model = "toy-model.toml"', f'model = "toy-model.toml"\nfleet = {fleet}')


@pytest.fixture(scope="module")
def pool_db(tmp_path_factory: pytest.TempPathFactory) -> str:
    """A pairwise sweep on 6 hosts (3 pairs) and a multi-arm sweep on 5 hosts of the toy."""
    d = tmp_path_factory.mktemp("pooldb")
    (d / "toy-model.toml").write_text(MODEL)
    (d / "pool.toml").write_text(_pool(EXPERIMENT.format(name="pool", mode="independent"), 6))
    (d / "multi.toml").write_text(_pool(EXPERIMENT.format(name="multi", mode="multiarm"), 5))
    url = f"sqlite:///{d}/results.db"
    with open_store(url) as store:
        run_sweep(load_experiment(d / "pool.toml"), store=store, progress=Messages())
        run_sweep(load_experiment(d / "multi.toml"), store=store, progress=Messages())
    return url


class Messages(NullProgress):
    """The sweep's progress lines, kept (MESSAGES)."""

    def message(self, text: str) -> None:
        MESSAGES.append(text)

    def comparison_started(self, purpose: str, baseline: object, candidate: object) -> None:
        STARTED.append(purpose)


MESSAGES: list[str] = []
STARTED: list[str] = []


def test_pool_progress_names_each_comparisons_pair(pool_db: str) -> None:
    """Issue 32: pool progress lines did not say which pair ran the comparison."""
    knob_lines = [p for p in STARTED if p.startswith("knob:")]
    assert knob_lines
    pairs = set()
    for p in knob_lines:
        # one pair, or a comparison pooled over several (issue 31): every pair named
        m = re.search(r" on ((?:sim-\d{3}\+sim-\d{3})(?:, sim-\d{3}\+sim-\d{3})*)$", p)
        assert m is not None, p
        for a_, b_ in re.findall(r"sim-(\d{3})\+sim-(\d{3})", m.group(1)):
            a, b = int(a_), int(b_)
            assert b == a + 1 and a % 2 == 0  # a pair of the pool: (0, 1), (2, 3), ...
            pairs.add(a)
    assert len(pairs) > 1  # several pairs ran at once


def test_multiarm_progress_formats_settings(pool_db: str) -> None:
    """Issue 32: multi-arm progress printed `6:5` and `1.8 -> 1.8`."""
    lines = [m for m in MESSAGES if m.startswith("multiarm ") and " stopped: " not in m]
    assert lines, MESSAGES
    # an arm the guarded probe stops (issue 31): named as knob=setting, never a raw tuple
    for line in (m for m in MESSAGES if m.startswith("multiarm ") and " stopped: " in m):
        assert re.match(r"multiarm \w+=[^\s:]+ stopped: \S", line), line
    for line in lines:
        m = re.match(r"multiarm (\w+): (?:stays at (\S+)|(\S+) -> (\S+)) \(", line)
        assert m is not None, line
        assert m.group(2) or m.group(3) != m.group(4), line  # unchanged: "stays at"
    thp = next(m for m in lines if m.startswith("multiarm thp:"))
    assert "madvise" in thp


def _figures(text: str) -> list[str]:
    return [
        base64.b64decode(m).decode()
        for m in re.findall(
            r'<figure class="comparison"><img src="data:image/svg\+xml;base64,([^"]+)"', text
        )
    ]


@pytest.mark.parametrize(("name", "hosts"), [("pool", 6), ("multi", 5)])
def test_pool_and_multiarm_sweeps_report(
    pool_db: str, tmp_path: Path, name: str, hosts: int
) -> None:
    out = tmp_path / f"{name}.html"
    proc = musku("report", name, "--db", pool_db, "-o", str(out))
    assert proc.returncode == 0, proc.stderr
    text = out.read_text(encoding="utf-8")
    with open_store(pool_db) as store:
        rec = store.find_experiment(name)
        assert rec is not None
        comps = store.comparisons(rec.id)
    figs = _figures(text)
    # a multi-arm row a guardrail pruned at its first look has one period (two samples): no
    # time series to draw
    assert len(figs) == sum(1 for c in comps if c.sample_count > 2) > 0
    names = {f"sim-{i:03d}" for i in range(hosts)}
    # every figure's legend names the hosts that measured it, and only hosts of the pool
    for svg in figs:
        shown = set(re.findall(r"sim-\d{3}", svg))
        assert len(shown) >= 2 and shown <= names, shown
    # the pairwise pool uses every pair; the multi-arm groups their hosts (core_count's group
    # measured only the first look: its one arm broke the QoS guardrail, nothing to draw)
    drawn = {h for c in comps if c.sample_count > 2 for h in c.hosts}
    assert set().union(*(set(re.findall(r"sim-\d{3}", s)) for s in figs)) - {"sim-005"} >= (
        names - {"sim-005"} if name == "pool" else drawn
    )
    if name == "multi":
        assert "multiarm:" in text and "Multi-arm scan on" in text
        # the knob figures show the scan's arms: a tested setting is drawn, not "not tested"
        assert text.count('class="knob"') >= 3
    assert "B vs A (%)" in figs[0]  # the relative difference, not the raw metric only


def test_figures_are_binned_and_pngs_at_200_dpi(pool_db: str, tmp_path: Path) -> None:
    out = tmp_path / "png"
    proc = musku("report", "pool", "--db", pool_db, "--format", "png", "-o", str(out))
    assert proc.returncode == 0, proc.stderr
    png = (out / "softsku.png").read_bytes()
    # pHYs chunk: pixels per metre, 200 dpi = 7874
    i = png.index(b"pHYs")
    ppm = struct.unpack(">I", png[i + 4 : i + 8])[0]
    assert round(ppm * 0.0254) == 200
    width = struct.unpack(">I", png[16:20])[0]
    assert width >= 1200  # 7.4 in at 200 dpi


def test_compare_marks_sides_by_shape_and_labels_untested_once(
    pool_db: str, tmp_path: Path
) -> None:
    out = tmp_path / "svg"
    proc = musku("report", "--compare", "pool", "multi", "--db", pool_db, "--format", "svg",
                 "-o", str(out))  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    svg = (out / "knob-core_count.svg").read_text()
    assert re.search(r"#\d+ pool \(dots\)", svg)
    assert re.search(r"#\d+ multi \(squares\)", svg)
    # "not tested" at most once per setting
    assert svg.count(">not<") <= len(load_experiment_space(pool_db, "core_count"))


def load_experiment_space(url: str, knob: str) -> list[object]:
    with open_store(url) as store:
        rec = store.find_experiment("pool")
        assert rec is not None
        return list(store.experiment_meta(rec.id)["resolved"]["space"][knob])


@settings(deadline=None, suppress_health_check=[HealthCheck.too_slow], max_examples=60)
@given(
    st.integers(1, 5000),
    st.integers(10, 400),
    st.floats(0, 0.5),
)
def test_binned_keeps_at_most_points_and_the_mean(n: int, points: int, nan_share: float) -> None:
    rng = np.random.default_rng(n)
    t = np.cumsum(rng.uniform(0.5, 1.5, n))
    v = rng.normal(100, 5, n)
    v[rng.uniform(size=n) < nan_share] = np.nan
    tb, vb = F.binned(t, v, points)
    assert tb.size == vb.size <= max(points, 1) or n <= points
    assert tb.size <= max(n, points)
    assert np.all(np.diff(tb) > 0)
    finite = vb[np.isfinite(vb)]
    if finite.size:
        assert np.nanmin(v) - 1e-9 <= finite.min() and finite.max() <= np.nanmax(v) + 1e-9


def test_compact_svg_rounds_path_coordinates_only() -> None:
    svg = b'<path d="M 1.234567 2.345678 \nL 3.5 4.25 \n" style="opacity: 0.123456"/>'
    assert F.compact_svg(svg) == b'<path d="M 1.2 2.3 L 3.5 4.2 " style="opacity: 0.123456"/>'
