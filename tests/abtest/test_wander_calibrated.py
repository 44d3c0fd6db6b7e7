"""Issue 30 item 1: the slow wander of a pair's host bias measured by its calibration
(``stats.measure_wander``), remembered with it, and used by later comparisons as the
between-period component's prior where it is larger than the rule's."""

from __future__ import annotations

import math
from dataclasses import replace
from datetime import UTC, datetime

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from musku.abtest import run_comparison, stats
from musku.abtest.calibrate import calibrate_pair
from musku.abtest.calibration import PairMemory, pair_identity
from musku.abtest.rules import ConfidenceSequenceRule
from musku.domain import ComparisonSpec, Decision, PairCalibration, StatsSettings
from musku.errors import InputError
from tests.abtest.fakes import A, B, FakePair, freq_level
from tests.abtest.test_wander import evidence, started_rule


def ou_at(t: np.ndarray, sd: float, tau: float, rng: np.random.Generator) -> np.ndarray:
    """An exact stationary OU path (sd, tau) sampled at the sorted times ``t``."""
    x = np.empty(t.size)
    x[0] = rng.standard_normal() * sd
    for i in range(1, t.size):
        a = math.exp(-(t[i] - t[i - 1]) / tau)
        x[i] = a * x[i - 1] + math.sqrt(1.0 - a * a) * sd * rng.standard_normal()
    return x


def batches(
    sd: float, tau: float, noise: float, seed: int, n: int = 360, step: float = 24.0
) -> tuple[np.ndarray, np.ndarray]:
    """A calibration's host-frame batch means: a constant bias, the OU wander, white noise."""
    rng = np.random.default_rng(seed)
    t = (np.arange(n) + 0.5) * step
    return t, 0.003 + ou_at(t, sd, tau, rng) + noise * rng.standard_normal(n)


@pytest.mark.parametrize(("sd", "tau", "tau_ok"), [(0.007, 1000.0, True), (0.014, 1000.0, True),
                                                  (0.003, 2000.0, False)])  # fmt: skip
def test_measure_wander_recovers_the_ous_size_and_time_scale(
    sd: float, tau: float, tau_ok: bool
) -> None:
    """Over 2.4 h of 24 s batches (a calibration's length), 16 paths: the median measured
    sd is within 20 % of the truth and tau within a factor of 1.6 (at tau = 1,000 s; at
    2,000 s, a quarter of the span, tau is hardly identified: the sd still is); a wander of
    0 measures far below the smallest of them."""
    got = [stats.measure_wander(*batches(sd, tau, 0.002, seed)) for seed in range(16)]
    assert all(w is not None for w in got)
    sds = np.array([w.sd for w in got if w is not None])
    taus = np.array([w.tau_s for w in got if w is not None])
    assert float(np.median(sds)) == pytest.approx(sd, rel=0.2)
    assert not tau_ok or tau / 1.6 <= float(np.median(taus)) <= tau * 1.6
    flat = [stats.measure_wander(*batches(0.0, tau, 0.002, seed)) for seed in range(16)]
    assert float(np.median([w.sd for w in flat if w is not None])) < 0.001


@settings(max_examples=25, deadline=None)
@given(
    shift=st.floats(-0.05, 0.05),
    seed=st.integers(0, 10_000),
    n=st.integers(64, 1500),
)
def test_measure_wander_ignores_a_constant_bias_and_the_order_of_the_points(
    shift: float, seed: int, n: int
) -> None:
    """A constant host bias drops out of every difference: adding one changes nothing, and
    nor does the order the batches come in (they are sorted by time); beyond
    ``WANDER_MAX_POINTS`` the points are averaged in groups, not refused."""
    t, z = batches(0.005, 800.0, 0.002, seed, n=n, step=10.0)
    w = stats.measure_wander(t, z)
    assert w is not None and w.sd >= 0.0 and w.tau_s > 0.0
    perm = np.random.default_rng(seed).permutation(n)
    w2 = stats.measure_wander(t[perm], z[perm] + shift)
    assert w2 is not None
    assert w2.sd == pytest.approx(w.sd, rel=1e-6, abs=1e-9)
    assert w2.tau_s == pytest.approx(w.tau_s, rel=1e-9)


def test_measure_wander_needs_enough_points_and_span() -> None:
    t, z = batches(0.005, 800.0, 0.002, 1, n=15)
    assert stats.measure_wander(t, z) is None
    t, z = batches(0.005, 800.0, 0.002, 1, n=20)  # span 480 s < 2 x 8 spacings x 2
    assert stats.measure_wander(t, z) is None
    assert stats.measure_wander(np.zeros(40), np.zeros(40)) is None  # no span


@settings(max_examples=30, deadline=None)
@given(
    sd1=st.floats(0.0, 0.02),
    tau1=st.floats(100.0, 10_000.0),
    sd2=st.floats(0.0, 0.02),
    tau2=st.floats(100.0, 10_000.0),
)
def test_several_wander_priors_count_as_the_largest(
    sd1: float, tau1: float, sd2: float, tau2: float
) -> None:
    """Given the rule's prior and a calibration's, the component is the larger of the two
    alone, for the effect and for the bias's average alike."""
    ev = evidence(6, 10, 900.0, 0.0)
    w1, w2 = stats.Wander(sd1, tau1), stats.Wander(sd2, tau2)

    def comp(w: stats.Wander | list[stats.Wander]) -> stats.PeriodComponent:
        assert ev.period_span is not None
        return stats.period_component(
            ev.batch_d, ev.batch_sign, ev.batch_period, ev.period_span, w, 1e-4, measure=False
        )

    both, one, two = comp([w1, w2]), comp(w1), comp(w2)
    assert both.var == pytest.approx(max(one.var, two.var), rel=1e-12, abs=1e-18)
    assert both.bias_var == pytest.approx(max(one.bias_var, two.bias_var), rel=1e-12, abs=1e-18)


def test_a_calibrated_wander_larger_than_the_prior_widens_and_asks_for_more_periods() -> None:
    """Periods of 1,200 s: short against the prior's 1 h, so one period per role order may
    decide a clear +3 %; with the pair's measured wander (1.4 %, 1,000 s) they are long
    against its time scale, so two of each are needed, and its between-period variance
    widens the interval. A measured wander smaller than the prior changes nothing."""
    ev2, ev4 = evidence(2, 20, 1200.0, 0.03), evidence(4, 20, 1200.0, 0.03)
    plain = started_rule().look(ev2)
    assert plain.decision is Decision.BETTER
    rule = started_rule()
    rule.use_wander(0.014, 1000.0, "calibration 7")
    v = rule.look(ev2)
    assert v.decision is None
    assert v.ci_high - v.ci_low > 1.5 * (plain.ci_high - plain.ci_low)
    assert "calibration 7's wander sd 1.40 %, tau 17 min" in v.detail
    assert rule.look(ev4).decision is Decision.BETTER
    small = started_rule()
    small.use_wander(0.001, 300.0, "calibration 8")
    s = small.look(ev2)
    assert s.decision is Decision.BETTER
    assert (s.ci_low, s.ci_high) == pytest.approx((plain.ci_low, plain.ci_high), rel=1e-12)


@pytest.mark.parametrize(
    ("sd", "tau"), [(-0.01, 100.0), (0.5, 100.0), (0.01, 0.0), (math.nan, 1.0)]
)
def test_a_bad_measured_wander_is_refused(sd: float, tau: float) -> None:
    with pytest.raises(InputError, match="measured wander"):
        ConfidenceSequenceRule(seed=1).use_wander(sd, tau, "x")


SPEC = ComparisonSpec(stats=StatsSettings(warmup_s=10.0, min_effect=0.005, sample_cap=30_000))


def cal_for(pair: FakePair, **changes: object) -> PairCalibration:
    _, hw = pair_identity(pair.describe())
    base = PairCalibration(
        pair="fake0+fake1", hardware=hw, metric="mips", bias=0.0, ci_low=-0.004, ci_high=0.004,
        samples=5000, taken_at=datetime.now(UTC), id=3, wander_sd=0.02, wander_tau_s=600.0,
    )  # fmt: skip
    return replace(base, **changes)  # type: ignore[arg-type]


def test_a_comparison_uses_its_pairs_calibrated_wander_only_when_usable() -> None:
    """Through ``run_comparison``: a usable calibration's wander (2 %, 10 min: far above the
    prior) enters the reason and widens the interval; the same calibration from other
    hardware, or one without a measured wander (before revision 0012), does not."""
    opts = {"early": False}

    def run(cal: PairCalibration | None) -> tuple[str, float]:
        pair = FakePair(freq_level(0.03), seed=5)
        mem = PairMemory(calibration=cal, hardware=pair_identity(pair.describe())[1])
        r = run_comparison(pair, A, B, SPEC, seed=5, memory=mem, rule_options=opts)
        return r.reason, r.ci_high - r.ci_low

    pair = FakePair(seed=5)
    used, width = run(cal_for(pair))
    assert "calibration 3's wander sd 2.00 %, tau 10 min" in used
    plain, width0 = run(None)
    assert "calibration 3's" not in plain
    assert width > width0
    other, _ = run(replace(cal_for(pair), hardware='{"other": 1}'))
    assert "calibration 3's" not in other
    old, _ = run(cal_for(pair, wander_sd=math.nan, wander_tau_s=math.nan))
    assert "calibration 3's" not in old


def test_calibrate_pair_measures_and_stores_the_wander() -> None:
    """A real calibration on a fake pair whose bias does not wander measures a small
    wander (well below the prior's 0.3 %), so its interval keeps the prior's part; the
    calibration carries what it measured."""
    pair = FakePair(seed=33, bias=0.02)
    cal, result = calibrate_pair(pair, A, SPEC, precision=0.005, seed=33)
    assert cal is not None and cal.wander() is not None
    assert 0.0 <= cal.wander_sd < 0.003 and cal.wander_tau_s > 0
    assert cal.ci_low <= 0.02 <= cal.ci_high
    assert "wander (prior: sd 0.30 %" in result.reason


def test_the_measured_wander_is_stored_with_the_calibration(tmp_path: object) -> None:
    """Revision 0012: the wander goes into the results DB and comes back; a calibration
    without one (NaN) reads back as not measured."""
    from pathlib import Path

    from musku.storage import open_store

    store = open_store(f"sqlite:///{Path(str(tmp_path)) / 'r.db'}")
    try:
        cal = cal_for(FakePair(seed=1), wander_sd=0.012, wander_tau_s=400.0)
        store.save_calibration(replace(cal, id=None))
        got = store.calibration("fake0+fake1")
        assert got is not None and got.wander() == (0.012, 400.0)
        store.save_calibration(replace(cal, id=None, wander_sd=math.nan, wander_tau_s=math.nan))
        newest = store.calibration("fake0+fake1")
        assert newest is not None and newest.wander() is None
    finally:
        store.close()
