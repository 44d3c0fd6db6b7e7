"""A pooled sweep's timeline and the chain that set its host-clock (issue 31 item 1's
measurement: what the clock waits on, and how many pairs sit idle)."""

from __future__ import annotations

from pathlib import Path

import pytest

from musku.experiment import load_experiment
from musku.sweep import run_sweep
from musku.sweep.runner import NullProgress, Span, critical_path
from tests.sweep.test_schedule import _fleet


def _span(tag: str, task: int, start: float, end: float, **kw: object) -> Span:
    return Span(
        tag=tag,
        task=task,
        label=f"{tag}{task}",
        released_s=float(kw.pop("released", 0.0)),  # type: ignore[arg-type]
        start_s=start,
        end_s=end,
        pairs=int(kw.pop("pairs", 1)),  # type: ignore[call-overload]
        **kw,  # type: ignore[arg-type]
    )


def test_the_critical_path_follows_dependencies_pairs_and_phases() -> None:
    """Task 2 waits on task 0 (a dependency) though task 1 is longer; task 3 was released at
    0 but started when task 2's pair came free; the validation phase waits on the scans'
    end. Task 1 ends before the chain's tasks need it: off the path."""
    spans = [
        _span("scan", 0, 0.0, 10.0),
        _span("scan", 1, 0.0, 12.0),
        _span("scan", 2, 10.0, 20.0, released=10.0, deps=(0,)),
        _span("scan", 3, 20.0, 25.0, released=0.0),
        _span("validate", 0, 25.0, 40.0, released=25.0, pairs=3, joins=((30.0, 2),)),
    ]
    path = critical_path(spans)
    assert [(s.tag, s.task) for s, _ in path] == [
        ("scan", 0),
        ("scan", 2),
        ("scan", 3),
        ("validate", 0),
    ]
    assert [why for _, why in path] == ["dependency", "pair", "phase", "end"]
    assert spans[-1].pair_seconds() == pytest.approx(3 * 15.0 + 2 * 10.0)
    assert spans[-1].pair_seconds(until=30.0) == pytest.approx(3 * 5.0)
    assert critical_path([]) == []


def test_a_pool_sweeps_timeline_accounts_for_its_clock(tmp_path: Path) -> None:
    """The toy sweep on 8 hosts: every task of both phases is in the timeline with its
    comparisons; the critical path starts at 0, each link starts when the one before ends
    (nothing else held it up), and the last ends at the sweep's host-clock; the pairs' busy
    time is at most the pool's, and the report's JSON form carries it."""
    exp = load_experiment(_fleet(tmp_path, 8))
    rep = run_sweep(exp)
    tl = rep.timeline
    assert {s.tag for s in tl} == {"independent-scans", "validate"}
    assert sum(len(s.results) for s in tl) == rep.comparisons
    path = critical_path(tl)
    assert path[0][0].start_s == pytest.approx(0.0)
    assert path[-1][0].end_s == pytest.approx(rep.clock_s)
    for (a, _), (b, _) in zip(path, path[1:], strict=False):
        assert b.start_s == pytest.approx(a.end_s)
    busy = sum(s.pair_seconds() for s in tl)
    assert 0 < busy <= rep.pairs * rep.clock_s + 1e-6
    assert all(s.start_s >= s.released_s - 1e-9 and s.end_s >= s.start_s for s in tl)
    assert rep.to_dict()["timeline"][0]["comparisons"]


class Said(NullProgress):
    def __init__(self) -> None:
        self.lines: list[str] = []

    def message(self, text: str) -> None:
        self.lines.append(text)


def test_the_last_choice_starts_the_validations_with_its_confirmation(tmp_path: Path) -> None:
    """The toy sweep on 16 hosts: shp's choice is the last (every other knob's choice ended
    before it started) and the pool has the idle pairs, so the composed configuration's
    validation runs with shp's run-offs and confirmation (said once); the soft SKU's
    validation is that very measurement, counted once (comparisons, host-hours), and the
    validation phase after the scans takes no host time: the sweep ends with the choice."""
    exp = load_experiment(_fleet(tmp_path, 16))
    said = Said()
    rep = run_sweep(exp, progress=said)
    ahead = [line for line in said.lines if "validations started with" in line]
    assert len(ahead) == 1 and ahead[0].startswith("knob:shp:")
    choice = next(s for s in rep.timeline if s.label == "shp choice")
    measured = [r for p, r in choice.results if p == "validate:production"]
    assert rep.sku is not None and measured == [rep.sku.vs_production]
    assert rep.sku.vs_production.candidate == rep.best
    assert sum(len(s.results) for s in rep.timeline) == rep.comparisons
    validate = [s for s in rep.timeline if s.tag == "validate"]
    assert all(s.end_s == s.start_s and not s.results for s in validate)
    assert critical_path(rep.timeline)[-1][0].end_s == pytest.approx(rep.clock_s)
    assert choice.end_s == pytest.approx(rep.clock_s)
