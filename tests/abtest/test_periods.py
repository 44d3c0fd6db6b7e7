"""The crossover period's cost model (musku/abtest/periods.py): its optimum where it is known,
its wander term against the exact OU covariance, and ``[statistics] period`` end to end."""

from __future__ import annotations

import math
from dataclasses import replace

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from musku.abtest import run_comparison, validate_spec
from musku.abtest.periods import (
    AUTO_WANDER_SHARE,
    PeriodCost,
    candidates,
    check_mode,
    choose_in,
    summary,
    wander_per_period,
)
from musku.abtest.stats import ou_mean_covariance
from musku.abtest.structure import Structure, derive
from musku.domain import ComparisonResult, ComparisonSpec, StatsSettings
from musku.errors import InputError

SIM = derive(StatsSettings(sample_interval_s=1.0, sample_cap=30_000, warmup_s=60.0))


def cost(**kw: float) -> PeriodCost:
    base = {
        "interval_s": 1.0,
        "noise_lrv": 0.03**2,
        "min_effect": 0.005,
        "swap_s": 300.0,
        "wander_sd": 0.003,
        "wander_tau_s": 3600.0,
    }
    base.update(kw)
    return PeriodCost(**base)


def test_without_swap_cost_the_shortest_period_wins() -> None:
    got = choose_in(SIM, 10, cost(swap_s=0.0), fixed=300)
    assert got.windows == 40  # four batches: the structure's shortest
    assert got.host_s < got.fixed_host_s


def test_without_wander_the_longest_period_wins() -> None:
    """When the decision needs several of even the longest periods (noise 20 % a window:
    about 14,000 windows), only the swaps depend on the length: the fewer the better."""
    got = choose_in(SIM, 10, cost(wander_sd=0.0, noise_lrv=0.2**2), fixed=300)
    assert got.windows == SIM.period_max == 5000
    assert got.host_s < got.fixed_host_s
    assert "no wander" in got.why
    # a quiet pair decides within the first two periods: longer ones only delay the swap
    quiet = choose_in(SIM, 10, cost(wander_sd=0.0), fixed=300)
    assert quiet.windows < SIM.period_max


def test_the_optimum_lies_between_when_both_count_and_beats_the_fixed_rule() -> None:
    c = cost()
    got = choose_in(SIM, 10, c, fixed=900)
    assert 40 < got.windows < SIM.period_max
    # a brute-force check over every whole-batch length: nothing is cheaper
    probe = 10 * (SIM.probe_n // 10)
    for n in range(40, SIM.period_max + 1, 10):
        first = max(SIM.first_period(10, n), probe)
        assert c.host_s(n, first, SIM.first_decision(10, n)) >= got.host_s * (1 - 1e-9)
    assert got.host_s <= got.fixed_host_s


def test_a_costlier_swap_lengthens_the_period() -> None:
    short = choose_in(SIM, 10, cost(swap_s=60.0), fixed=180).windows
    long = choose_in(SIM, 10, cost(swap_s=1800.0), fixed=5000).windows
    assert short < long


def test_a_dear_swap_does_not_lengthen_the_period_past_the_wander_share() -> None:
    """Swaps of 10 minutes: without wander the model would take far longer periods than the
    fixed rule's 180 s; with the wander prior, auto stops at max(fixed, 5 % of tau)."""
    free = choose_in(SIM, 10, cost(swap_s=600.0, wander_sd=0.0), fixed=180)
    assert free.windows > 400
    capped = choose_in(SIM, 10, cost(swap_s=600.0), fixed=180)
    assert capped.windows <= max(180, AUTO_WANDER_SHARE * 3600.0)
    # a fixed period already longer than the share: auto may go up to it, not past it
    assert choose_in(SIM, 10, cost(swap_s=1800.0), fixed=2000).windows <= 2000


@settings(max_examples=80, deadline=None)
@given(
    swap=st.floats(min_value=0.0, max_value=7200.0),
    noise=st.floats(min_value=0.002, max_value=0.3),
    wander=st.floats(min_value=1e-4, max_value=0.02),
    tau=st.floats(min_value=300.0, max_value=40_000.0),
    fixed_k=st.integers(min_value=4, max_value=500),
    b=st.integers(min_value=1, max_value=10),
)
def test_auto_is_the_cheapest_period_no_longer_than_its_limit(
    swap: float, noise: float, wander: float, tau: float, fixed_k: int, b: int
) -> None:
    """Whatever the noise, swap and wander: the chosen period is no longer than the fixed
    rule's or AUTO_WANDER_SHARE x tau (the longer of the two), and no allowed whole-batch
    length is cheaper (brute force over the same candidates)."""
    c = cost(swap_s=swap, noise_lrv=noise**2, wander_sd=wander, wander_tau_s=tau)
    fixed = min(fixed_k * b, SIM.period_max)
    got = choose_in(SIM, b, c, fixed)
    limit = max(float(fixed), AUTO_WANDER_SHARE * tau)
    assert got.windows <= max(limit, 4 * b)
    probe = b * (SIM.probe_n // b)
    for n in candidates(4 * b, SIM.period_max, b) + [fixed]:
        if n <= limit:
            first = max(SIM.first_period(b, n), probe)
            assert c.host_s(n, first, SIM.first_decision(b, n)) >= got.host_s * (1 - 1e-9)


@settings(max_examples=40, deadline=None)
@given(
    x=st.floats(min_value=0.1, max_value=4.0),
    y=st.floats(min_value=0.0, max_value=2.0),
)
def test_the_wander_term_is_the_exact_ou_variance_of_an_alternating_chain(
    x: float, y: float
) -> None:
    """g against the exact double integrals: a long A-B-A-B chain's alternating sum of OU
    period means, per period; the chain's two ends add c / periods, removed by taking two
    lengths (Richardson: g = 2 v(2p) - v(p)), both chains tens of time constants long.
    Short periods: g ~ x / 6 (the series the docstring gives)."""

    def per_period(p: int) -> float:
        spans = np.array([[k * (x + y), k * (x + y) + x] for k in range(p)])
        s = np.array([(-1.0) ** k for k in range(p)])
        return float(s @ ou_mean_covariance(spans, 1.0) @ s) / p

    exact = 2.0 * per_period(400) - per_period(200)
    assert wander_per_period(x, y) == pytest.approx(exact, rel=0.01, abs=1e-6)
    for short in (1e-6, 1e-3, 0.02):
        assert wander_per_period(short, 0.0) == pytest.approx(short / 6.0, rel=0.01)


@settings(max_examples=60, deadline=None)
@given(
    x=st.floats(min_value=1e-6, max_value=50.0),
    k=st.floats(min_value=1.01, max_value=10.0),
)
def test_the_wander_per_window_grows_with_the_period(x: float, k: float) -> None:
    """x g(x): the wander's share of a window's variance only grows with the period's length
    (so without swap cost a shorter period never costs more)."""
    assert x * k * wander_per_period(x * k, 0.0) >= x * wander_per_period(x, 0.0) * (1 - 1e-9)


def test_candidates_are_whole_batches_within_the_limits() -> None:
    every = candidates(40, 400, 10)
    assert every == list(range(40, 401, 10))
    grid = candidates(4, 30_000, 1)
    assert grid[0] == 4 and grid[-1] == 30_000 and len(grid) <= 240
    assert grid == sorted(set(grid))


@pytest.mark.parametrize("bad", ["often", "", "AUTO", 5, None, True])
def test_bad_period_settings_are_one_line_input_errors(bad: object) -> None:
    with pytest.raises(InputError, match=r"statistics period = .* must be one of swap, auto"):
        check_mode(bad)
    spec = ComparisonSpec(stats=replace(StatsSettings(), period=bad))  # type: ignore[arg-type]
    with pytest.raises(InputError) as got:
        validate_spec(spec)
    assert "\n" not in str(got.value)


def _sim_pair(seed: int) -> tuple[object, object, object]:
    from pathlib import Path

    from musku.sim import SimModel, SimPair

    root = Path(__file__).resolve().parents[2]
    model = SimModel.load(root / "experiments" / "sim" / "web-skylake18.toml")
    assert model.reference_config is not None
    base = model.reference_config.with_("prefetch", "l2hw_dcu")
    cand = base.with_("prefetch", "all_on")
    return SimPair(model, seed=seed, initial=(base, base)), base, cand


@pytest.mark.parametrize("mode", ["swap", "auto"])
def test_a_comparison_reports_its_period_and_expected_host_time(mode: str) -> None:
    pair, base, cand = _sim_pair(4242)
    spec = ComparisonSpec(
        stats=StatsSettings(min_effect=0.005, warmup_s=60.0, sample_cap=30_000, period=mode)
    )
    r = run_comparison(pair, base, cand, spec, seed=4242)  # type: ignore[arg-type]
    assert r.period_s is not None and r.period_s > 0
    assert r.expected_s is not None and math.isfinite(r.expected_s) and r.expected_s > 0
    if mode == "auto":
        assert r.period_why.startswith(f"period {r.period_s:,.0f} s (auto)")
        assert "(auto): expected" in r.reason
    else:
        assert r.period_why == "" and "(auto)" not in r.reason


def test_an_a_a_comparison_prices_its_swaps_at_zero_and_keeps_periods_short() -> None:
    """A/A: the swaps apply nothing and discard no warm-up, so auto's cost model prices them
    at 0 s (not the first apply's 60 s warm-up) and takes the structure's shortest period
    (four batches), never longer than the fixed rule's."""
    pair, base, _ = _sim_pair(4243)
    spec = ComparisonSpec(
        stats=StatsSettings(min_effect=0.005, warmup_s=60.0, sample_cap=30_000, period="auto")
    )
    r = run_comparison(pair, base, base, spec, seed=4243)  # type: ignore[arg-type]
    assert r.period_s is not None and "(swap 0 s," in r.period_why
    pair2, _, _ = _sim_pair(4243)
    fixed = run_comparison(  # type: ignore[arg-type]
        pair2, base, base, replace(spec, stats=replace(spec.stats, period="swap")), seed=4243
    )
    assert fixed.period_s is not None and r.period_s <= fixed.period_s


def test_the_summary_line_names_the_rule_and_why() -> None:
    def res(period: float, why: str = "") -> ComparisonResult:
        from musku.domain import Configuration, Decision

        c = Configuration.of(thp="always")
        return ComparisonResult(
            c, c, Decision.BETTER, 0.0, 0.0, 0.0, 1, 1.0, "", period_s=period, period_why=why
        )

    assert summary("swap", []) == ""
    line = summary("swap", [res(300.0), res(900.0)])
    assert "median 600 s, 300-900 s over 2 comparisons" in line and "3x the swap cost" in line
    line = summary(
        "auto", [res(300.0, "period 300 s (auto): x"), res(900.0, "period 900 s (auto): y")]
    )
    assert "chosen to minimise the expected host time" in line and "period 900 s (auto)" in line


def _first_decision_by_batch(s: Structure, b: int, period_len: int) -> int:
    """The batch-by-batch walk ``Structure.first_decision`` was before it stepped by period."""
    per = [max(s.first_period(b, period_len), b * (s.probe_n // b)), period_len]
    counts, windows, p = [0, 0], 0, 0
    while True:
        for _ in range(per[min(p, 1)] // b):
            counts[p % 2] += 1
            windows += b
            if sum(counts) >= s.min_batches and min(counts) >= s.min_per_order:
                return windows
        p += 1


@settings(max_examples=200, deadline=None)
@given(
    cap=st.integers(min_value=60, max_value=40_000),
    interval=st.sampled_from([0.1, 0.4, 1.0, 5.0]),
    batch=st.integers(min_value=1, max_value=60),
    share=st.floats(min_value=0.0, max_value=1.0),
    min_batches=st.integers(min_value=2, max_value=30),
    min_per_order=st.integers(min_value=1, max_value=8),
)
def test_first_decision_by_period_equals_the_batch_walk(
    cap: int, interval: float, batch: int, share: float, min_batches: int, min_per_order: int
) -> None:
    s = derive(
        StatsSettings(sample_interval_s=interval, sample_cap=cap, warmup_s=0.0),
        min_batches=min_batches,
        min_per_order=min(min_per_order, min_batches),
    )
    b = min(batch, s.max_batch)
    n = s.period_length(b, share * s.period_max * interval, 1.0)
    assert s.first_decision(b, n) == _first_decision_by_batch(s, b, n)
