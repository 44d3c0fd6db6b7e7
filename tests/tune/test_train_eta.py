"""``musku tune train``'s plan and ETA (the C++ services are not needed: the plan is the
grid's arithmetic, the ETA the plan scaled by the points measured so far)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from musku.tune import train as tr


def _cands(n: int) -> list[tr.Candidate]:
    return tr.default_candidates(2)[:n]


def test_the_default_grid_is_the_eight_minutes_the_issue_saw() -> None:
    cands = tr.default_candidates(2)
    planned = tr.planned_points([20, 100, 500, 1000, 2000], cands, duration_s=3.0, warmup_s=0.5,
                                min_samples=300, rounds=3, contenders=tr.CONTENDERS)  # fmt: skip
    # 12 configurations at 5 loads, then 2 more rounds of the 3 best per load
    assert len(cands) == 12 and len(planned) == 5 * 12 + 5 * 2 * 3
    # 20 QPS needs 15 s per point for 300 requests: the low load dominates
    assert planned[0] == pytest.approx(15.5)
    assert 8 * 60 < sum(planned) < 9 * 60


@given(
    loads=st.lists(
        st.sampled_from([20.0, 100.0, 500.0, 2000.0]), min_size=1, max_size=4, unique=True
    ),  # fmt: skip
    n=st.integers(1, 12),
    rounds=st.integers(1, 4),
    contenders=st.integers(1, 5),
    slowdown=st.floats(1.0, 5.0),
)
def test_eta_counts_down_to_zero_scaled_by_how_slow_the_points_are(
    loads: list[float], n: int, rounds: int, contenders: int, slowdown: float
) -> None:
    planned = tr.planned_points(loads, _cands(n), duration_s=1.0, warmup_s=0.5, min_samples=100,
                                rounds=rounds, contenders=contenders)  # fmt: skip
    assert len(planned) == len(loads) * (n + (rounds - 1) * min(contenders, n))
    now = [0.0]
    eta = tr.TrainingEta(planned, clock=lambda: now[0])
    assert eta.eta_s(0.0) == pytest.approx(sum(planned))  # before any point: the plan
    last = float("inf")
    for i, seconds in enumerate(planned):
        now[0] += seconds * slowdown  # every point takes `slowdown` times its plan
        elapsed, left = eta.point_done()
        assert eta.done == i + 1 and elapsed == pytest.approx(now[0])
        # the time left is the plan's rest, as much slower as the points so far were
        assert left == pytest.approx(sum(planned[i + 1 :]) * slowdown)
        assert left <= last
        last = left
    assert last == 0.0


def test_a_faster_than_planned_point_does_not_shrink_the_plan() -> None:
    now = [0.0]
    eta = tr.TrainingEta([10.0, 10.0], clock=lambda: now[0])
    now[0] = 2.0
    assert eta.point_done() == (2.0, 10.0)


@pytest.mark.parametrize(
    ("seconds", "text"),
    [(0, "0 s"), (9.4, "9 s"), (60, "1 min 00 s"), (75, "1 min 15 s"), (4000, "1 h 06 min")],
)
def test_format_duration(seconds: float, text: str) -> None:
    assert tr.format_duration(seconds) == text
