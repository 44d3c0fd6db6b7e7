"""The tester's minimum structure (musku/abtest/structure.py): derived from the window, the
swap cost and the cap, so short windows and a small cap still give an interval; a cap that
cannot allow any decision is refused before anything runs; no infinite interval is shown."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import replace
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from musku.abtest import Progress, run_comparison, validate_spec
from musku.abtest.structure import PROBE_FLOOR, PROBE_MAX, derive, feasibility, halfwidth
from musku.domain import ComparisonSpec, Decision, StatsSettings
from musku.errors import InputError
from musku.storage.records import result_to_dict
from musku.strict_json import dumps, loads_strict
from musku.text import interval, interval_note, windows_needed
from tests.abtest.fakes import A, B, FakePair, freq_level

REAL = StatsSettings(
    confidence=0.95, min_effect=0.03, warmup_s=0.0, sample_interval_s=0.4, sample_cap=160
)


def test_the_simulators_settings_keep_their_structure() -> None:
    """1 s windows, a 30,000 cap: the 180-window probe and a sixth of the cap a period, as
    before the structure was derived."""
    s = derive(StatsSettings(sample_interval_s=1.0, sample_cap=30_000, warmup_s=60.0))
    assert s.probe_n == PROBE_MAX == 180
    assert s.period_max == 5000 and s.warm_n == 60
    assert s.period_length(10, 100.0, 3.0) == 300  # 3 x the swap cost, whole batches


def test_a_small_cap_gets_a_short_probe_and_an_early_first_decision() -> None:
    s = derive(replace(REAL, sample_cap=120))
    assert s.probe_n == PROBE_FLOOR and s.max_batch == 5 and s.period_max == 20
    # 20 pilot windows in one role order, then 4 of the other: 12 batches, 4 of each order
    assert s.first_decision(1, s.period_length(1, 0.0, 3.0)) == 24
    assert s.windows_to_first_decision(20, 1, 4) == 4


@settings(max_examples=200, deadline=None)
@given(
    cap=st.integers(min_value=24, max_value=200_000),
    interval_s=st.floats(min_value=0.01, max_value=60.0),
    batch=st.integers(min_value=1, max_value=5000),
    swap_s=st.floats(min_value=0.0, max_value=1e5),
)
def test_the_structure_fits_in_any_cap_that_passes(
    cap: int, interval_s: float, batch: int, swap_s: float
) -> None:
    stats = StatsSettings(sample_interval_s=interval_s, sample_cap=cap, warmup_s=0.0)
    assert feasibility(stats).ok
    s = derive(stats)
    b = min(batch, s.max_batch)
    assert 2 * s.min_batches * s.max_batch <= cap  # the rule's batches fit twice
    assert PROBE_FLOOR <= s.probe_n <= PROBE_MAX
    period = s.period_length(b, swap_s, 3.0)
    assert period % b == 0 and period >= 4 * b
    assert period <= max(4 * b, s.period_max) + b
    # with the shortest periods the first decision always fits in the cap
    assert s.first_decision(1, s.period_length(1, 0.0, 3.0)) <= cap


@pytest.mark.parametrize("cap", [10, 12, 23])
def test_a_cap_too_small_for_any_decision_is_refused_with_the_cap_that_would(cap: int) -> None:
    stats = replace(REAL, sample_cap=cap)
    f = feasibility(stats)
    assert not f.ok and f.cap_needed == 24
    assert "too small for any decision" in f.reason and "at least 24" in f.reason
    with pytest.raises(InputError, match="at least 24"):
        validate_spec(ComparisonSpec(stats=stats))
    validate_spec(ComparisonSpec(stats=replace(stats, sample_cap=24)))


def test_a_cap_the_noise_does_not_allow_names_the_cap_that_would() -> None:
    f = feasibility(replace(REAL, sample_cap=120), noise_sd=0.2)
    assert not f.ok and f.cap_needed is not None and f.cap_needed > 120
    assert f.halfwidth_at_cap is not None and f.halfwidth_at_cap > 0.03
    # the cap named is the smallest whose best-case interval is narrower than min_effect
    assert halfwidth(f.cap_needed, 0.2, REAL) < 0.03 <= halfwidth(f.cap_needed - 1, 0.2, REAL)
    assert f"about {f.cap_needed} windows" in f.reason
    ok = feasibility(replace(REAL, sample_cap=f.cap_needed), noise_sd=0.2)
    assert ok.ok and ok.reason == ""


class SwitchbackPair(FakePair):
    """The FakePair declaring the switchback design (each sub-window settles itself)."""

    def describe(self) -> Mapping[str, Any]:
        return {**super().describe(), "design": "switchback"}


def _short(cap: int) -> ComparisonSpec:
    return ComparisonSpec(stats=replace(REAL, sample_cap=cap, warmup_s=0.8, seed=5))


@pytest.mark.parametrize("switchback", [False, True])
def test_short_windows_and_a_small_cap_still_decide(switchback: bool) -> None:
    """0.4 s windows, cap 120, noisy windows (sd 10 %), a +12 % effect: with the old fixed
    structure (a 180-window probe) the cap filled before the first swap and the result was
    inconclusive with no interval; now it decides within the cap."""
    cls = SwitchbackPair if switchback else FakePair
    pair = cls(freq_level(0.12), seed=5, sigma=0.10, phi=0.2, apply_s=0.05, bias=0.0)
    looks: list[Progress] = []
    r = run_comparison(pair, A, B, _short(120), on_progress=looks.append)
    assert r.decision is Decision.BETTER, r.reason
    assert r.samples <= 120 and math.isfinite(r.ci_low) and r.ci_low > 0
    # before the first interval the progress says how many windows it still needs
    early = [p for p in looks if p.batches and p.windows_needed is not None]
    assert early and all(p.windows_needed > 0 for p in early)
    assert looks[-1].windows_needed is None


def test_a_switchback_pair_skips_the_transient_search() -> None:
    """Its pilot is the structure's probe and nothing after an apply is discarded."""
    rows: list[dict[str, Any]] = []
    pair = SwitchbackPair(freq_level(0.0), seed=2, sigma=0.05, apply_s=0.01, bias=0.0)
    spec = ComparisonSpec(stats=replace(REAL, sample_cap=60, seed=2))
    r = run_comparison(pair, A, A, spec, on_window=rows.extend)
    assert r.decision in (Decision.NO_DIFFERENCE, Decision.INCONCLUSIVE)
    assert not any(row["warmup"] for row in rows)
    assert math.isfinite(r.ci_low) and r.ci_low < 0 < r.ci_high


def test_no_infinite_interval_reaches_a_person() -> None:
    """Stopped before the first possible decision: the reason says how many more windows;
    the text says "no interval yet (...)"; JSON gives null ends and the note."""
    pair = FakePair(freq_level(0.0), seed=1, sigma=0.05, apply_s=0.01)
    spec = ComparisonSpec(stats=replace(REAL, sample_cap=120, seed=1))
    looks: list[Progress] = []
    r = run_comparison(pair, A, B, spec, on_progress=looks.append, should_stop=lambda: pair.t > 8)
    assert r.decision is Decision.ABORTED
    assert math.isinf(r.ci_low) and math.isinf(r.ci_high)
    n = windows_needed(r.reason)
    assert n is not None and 0 < n <= 120 - r.samples, r.reason
    shown = interval(r.ci_low, r.ci_high, r.reason)
    assert shown == f"no interval yet (needs about {n:,} more windows)"
    assert "inf" not in shown
    assert looks[-1].windows_needed == n
    data = loads_strict(dumps(result_to_dict(r)))
    assert data["ci_low"] is None and data["ci_high"] is None
    assert data["interval_note"] == shown
    assert interval_note(0.01, 0.02) is None and interval(0.01, 0.02) == "[+1.00, +2.00] %"
