"""The tester's statistics, checked against data with known properties."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy.signal import lfilter

from musku.abtest import stats


def ar1(n: int, phi: float, seed: int, sigma: float = 1.0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    e = rng.standard_normal(n) * sigma * math.sqrt(1 - phi * phi)
    return lfilter([1.0], [1.0, -phi], e)


@pytest.mark.parametrize("phi", [0.0, 0.3, 0.6, 0.9])
def test_ar1_coefficient_recovers_phi(phi: float) -> None:
    assert stats.ar1_coefficient(ar1(20_000, phi, 1)) == pytest.approx(phi, abs=0.03)


def test_ar1_coefficient_degenerate_inputs() -> None:
    assert stats.ar1_coefficient(np.array([1.0, 2.0])) == 0.0
    assert stats.ar1_coefficient(np.full(50, 3.0)) == 0.0


def test_batch_mean_correlation_matches_simulation() -> None:
    phi, b = 0.7, 10
    x = ar1(400_000, phi, 2)
    means = x.reshape(-1, b).mean(axis=1)
    empirical = np.corrcoef(means[1:], means[:-1])[0, 1]
    assert stats.batch_mean_correlation(phi, b) == pytest.approx(empirical, abs=0.02)
    assert stats.batch_mean_correlation(phi, 40) < stats.batch_mean_correlation(phi, 10)
    assert stats.batch_mean_correlation(0.0, 7) == 0.0


@pytest.mark.parametrize("rho", [0.2, 0.6, 0.85])
def test_choose_batch_size_is_smallest_meeting_target(rho: float) -> None:
    b = stats.choose_batch_size(rho, target=0.05, minimum=1, maximum=10_000)
    assert stats.batch_mean_correlation(rho, b) <= 0.05
    assert b == 1 or stats.batch_mean_correlation(rho, b - 1) > 0.05 or b > 20
    assert stats.choose_batch_size(0.95, target=0.05, maximum=30) == 30


def test_mser_finds_a_step_transient() -> None:
    rng = np.random.default_rng(3)
    x = rng.standard_normal(400)
    x[:60] += 4.0
    k = stats.mser_truncation(x)
    assert 55 <= k <= 70


def test_detect_warmup_keeps_stationary_data() -> None:
    kept = [stats.detect_warmup(ar1(120, 0.6, s)).discard for s in range(20)]
    assert sum(k > 0 for k in kept) <= 2  # the changepoint test guards against noise


def test_detect_warmup_cuts_exponential_transient_and_asks_for_more() -> None:
    t = np.arange(120.0)
    noise = ar1(120, 0.5, 4, sigma=0.01)
    short = -0.06 * np.exp(-t / 8.0) + noise
    v = stats.detect_warmup(short)
    assert v.discard >= 10 and not v.extend
    assert v.shift_t < -3.0
    # a transient still strong at the probe's end: MSER sits at its limit or a trend remains
    long = -0.06 * np.exp(-t / 200.0) + noise
    assert stats.detect_warmup(long).extend


def test_crossover_estimate_removes_host_bias() -> None:
    rng = np.random.default_rng(5)
    sign = np.repeat([1, -1, 1, -1], 25)
    period = np.repeat([0, 1, 2, 3], 25)
    y = 0.01 + 0.05 * sign + 0.002 * rng.standard_normal(100)
    est = stats.crossover_estimate(y, sign, period)
    assert est is not None
    assert est.mean == pytest.approx(0.01, abs=0.001)
    assert est.bias == pytest.approx(0.05, abs=0.001)
    assert est.se == pytest.approx(0.002 / 10, rel=0.3)
    assert est.n_eff == pytest.approx(100)
    plain = stats.plain_estimate(y, period)
    assert plain is not None and plain.mean == pytest.approx(0.01, abs=0.001)
    assert plain.se > 5 * est.se  # the bias shows up as variance when ignored
    assert stats.crossover_estimate(y[:25], sign[:25], period[:25]) is None


def test_cs_radius_shape() -> None:
    alpha = 0.05
    r = [stats.cs_radius(n, alpha, 100) for n in (5, 50, 100, 1000, 100_000)]
    assert all(x > 1.96 for x in r)  # always wider than a fixed-n interval
    assert stats.cs_radius(100, alpha, 100) == pytest.approx(3.0, abs=0.2)
    assert r[-1] > r[2]  # grows like sqrt(log n) after the tuning point
    assert stats.cs_halfwidth(0.01, 100, alpha, 100) == pytest.approx(0.01 * r[2])
    assert stats.cs_radius(0, alpha, 100) == math.inf


def test_confidence_sequence_time_uniform_coverage() -> None:
    """Gaussian paths watched at every step for 2,000 steps: the boundary is crossed in at
    most ~alpha of them (the CS is anytime-valid), while a fixed 95 % interval checked at
    every step is crossed far more often."""
    rng = np.random.default_rng(6)
    paths, steps, alpha = 2000, 2000, 0.05
    n = np.arange(1, steps + 1)
    means = np.cumsum(rng.standard_normal((paths, steps)), axis=1) / n
    se = 1.0 / np.sqrt(n)
    radius = np.array([stats.cs_radius(float(k), alpha, 200.0) for k in n])
    cs_cross = np.mean(np.any(np.abs(means) > radius * se, axis=1))
    naive_cross = np.mean(np.any(np.abs(means[:, 9:]) > 1.96 * se[9:], axis=1))
    assert cs_cross <= alpha + 0.01
    assert naive_cross > 0.3


def test_small_sample_correction_at_the_boundary_level() -> None:
    from scipy.stats import norm, t

    assert stats.t_quantile(0.975, 7) == pytest.approx(float(t.ppf(0.975, 7)))
    r = stats.cs_radius(20, 0.05, 48)
    tail = float(norm.sf(r))
    assert stats.cs_halfwidth(2.0, 20, 0.05, 48, df=15) == pytest.approx(2 * t.isf(tail, 15))
    # wider with fewer degrees of freedom, the normal radius in the limit
    widths = [stats.cs_halfwidth(1.0, 20, 0.05, 48, df=d) for d in (5, 15, 50, 1e9)]
    assert widths == sorted(widths, reverse=True)
    assert widths[-1] == pytest.approx(r)


def test_crossover_standard_error_equals_statsmodels_hac() -> None:
    """The batch-means variance is Newey-West (Bartlett) over the whole sequence with the
    data-driven bandwidth: the same number statsmodels gives for OLS y ~ 1 + sign with
    cov_type='HAC' at that many lags (small-sample corrected)."""
    import statsmodels.api as sm

    rng = np.random.default_rng(7)
    sign = np.repeat(np.tile([1, -1], 6), 20)
    period = np.repeat(np.arange(12), 20)
    y = 0.01 + 0.02 * sign + 0.01 * lfilter([1.0], [1.0, -0.4], rng.standard_normal(240))
    est = stats.crossover_estimate(y, sign, period)
    assert est is not None
    assert est.bandwidth >= 1.0
    fit = sm.OLS(y, sm.add_constant(sign.astype(float))).fit(
        cov_type="HAC", cov_kwds={"maxlags": int(est.bandwidth), "use_correction": True}
    )
    assert est.mean == pytest.approx(fit.params[0], rel=1e-12)
    assert est.bias == pytest.approx(fit.params[1], rel=1e-12)
    assert est.se == pytest.approx(fit.bse[0], rel=1e-6)


def test_autocovariances_equal_statsmodels_acovf() -> None:
    from statsmodels.tsa.stattools import acovf

    x = ar1(500, 0.7, 11)
    assert stats.autocovariances(x, 10) == pytest.approx(acovf(x, nlag=10, fft=False))


@pytest.mark.parametrize("phi", [0.0, 0.6, 0.9])
def test_integrated_autocorrelation_recovers_ar1(phi: float) -> None:
    """The HAC estimate of the integrated autocorrelation time (1 + phi) / (1 - phi): close
    for a long series (Bartlett truncation biases it a little low at phi 0.9)."""
    iact, bw = stats.integrated_autocorrelation(ar1(50_000, phi, 5))
    truth = (1 + phi) / (1 - phi)
    assert iact == pytest.approx(truth, rel=0.15)
    assert stats.ar1_equivalent(iact) == pytest.approx(phi, abs=0.03)
    assert (bw < 5) if phi == 0.0 else (bw > 5)


def test_batch_size_from_short_series_is_not_clamped_to_huge() -> None:
    """At phi 0.9 the pilot-sized estimate gives batches of tens to a few hundred windows, not
    the old upper-bound clamp (1,175 windows, forcing 14,100 samples)."""
    sizes = [stats.batch_size_for(ar1(120, 0.9, seed))[0] for seed in range(40)]
    assert max(sizes) < 600
    assert np.median(sizes) > 40
    # white noise: the minimum
    assert stats.batch_size_for(ar1(120, 0.0, 1))[0] <= 8


def test_one_sided_confidence_sequence_spends_alpha_on_one_side() -> None:
    """The one-sided boundary (the equivalence test's) is narrower than the two-sided one at
    the same alpha, yet a Gaussian path watched at every step for 2,000 steps crosses it on
    its side in at most ~alpha of the paths; half its alpha would leave it far below."""
    rng = np.random.default_rng(7)
    paths, steps, alpha = 2000, 2000, 0.05
    n = np.arange(1, steps + 1)
    means = np.cumsum(rng.standard_normal((paths, steps)), axis=1) / n
    se = 1.0 / np.sqrt(n)
    one = np.array([stats.cs_radius_one_sided(float(k), alpha, 200.0) for k in n])
    two = np.array([stats.cs_radius(float(k), alpha, 200.0) for k in n])
    assert np.all(one < two) and np.all(one > 0.85 * two)
    upper = np.mean(np.any(means > one * se, axis=1))
    lower = np.mean(np.any(means < -one * se, axis=1))
    assert max(upper, lower) <= alpha + 0.01
    assert upper + lower > alpha  # the two-sided sequence at alpha spends about alpha / 2 a side
    assert stats.cs_radius_one_sided(0, alpha, 100) == math.inf
    assert stats.cs_halfwidth(0.01, 100, alpha, 100, one_sided=True) == pytest.approx(
        0.01 * stats.cs_radius_one_sided(100, alpha, 100)
    )


# --------------------------------------------------------------------------- equivalence SPRT


@settings(max_examples=300, deadline=None, derandomize=True)
@given(
    theta=st.floats(-0.05, 0.05),
    var=st.floats(0.0, 1e-3),
    grow=st.floats(1.0, 10.0),
    shift=st.floats(0.0, 0.02),
    m=st.floats(1e-4, 0.05),
    df=st.one_of(st.just(math.inf), st.floats(1.0, 500.0)),
)
def test_sprt_rejection_is_monotone_in_variance_and_distance_and_symmetric(
    theta: float, var: float, grow: float, shift: float, m: float, df: float
) -> None:
    """Each one-sided SPRT rejects exactly when its likelihood-ratio statistic reaches
    log(1 / alpha) (the bound form is the same test); a larger variance or an estimate
    farther from 0 never turns a rejection of "|effect| >= m" (both sides) into more of
    one; flipping the estimate's sign swaps the two sides; more degrees of freedom never
    reject less."""
    alpha = 0.05

    def both(t: float, v: float, f: float = df) -> bool:
        lo, hi = stats.sprt_bounds(t, v, alpha, f)
        return -m < lo and hi < m

    lo, hi = stats.sprt_bounds(theta, var, alpha, df)
    assert lo <= theta <= hi
    v = var * stats.sprt_variance_factor(alpha, df)
    if v > 0 and abs(hi - m) > 1e-12 and abs(lo + m) > 1e-12:  # off the boundary itself
        assert (hi <= m) == (m * (m / 2 - theta) / v >= math.log(1 / alpha))
        assert (lo >= -m) == (m * (m / 2 + theta) / v >= math.log(1 / alpha))
    if both(theta, var * grow) or both(math.copysign(abs(theta) + shift, theta), var):
        assert both(theta, var)
    neg = stats.sprt_bounds(-theta, var, alpha, df)
    assert neg == pytest.approx((-hi, -lo), abs=1e-15)
    assert both(-theta, var) == both(theta, var)
    if both(theta, var, df):
        assert both(theta, var, math.inf)
        assert both(theta, var, df * grow)


def test_sprt_variance_factor() -> None:
    """1 with the variance known, the Student-t correction at the boundary's tightest
    radius otherwise (about 1.09 at 40 df), shrinking with more degrees of freedom."""
    assert stats.sprt_variance_factor(0.05) == 1.0
    f = [stats.sprt_variance_factor(0.05, d) for d in (3.0, 10.0, 40.0, 1000.0)]
    assert f == sorted(f, reverse=True)
    assert 1.05 < f[2] < 1.15 and f[3] < 1.01
    assert stats.sprt_bounds(math.nan, 1.0, 0.05) == (-math.inf, math.inf)


def test_sprt_equivalence_errs_at_most_about_alpha_at_the_margin() -> None:
    """A Gaussian crossover watched after every batch, its variance estimated (the sample
    variance of the batch means, df = batches - 1, as a plug-in): NO_DIFFERENCE (both
    SPRTs rejected, each side staying rejected) at a true effect of exactly +-m happens in
    about alpha of the paths or less (a few hundred paths: not grossly above 5 %), and at a
    true 0 the test stops sooner than the one-sided confidence sequences (TOST) on the
    same paths."""
    rng = np.random.default_rng(30)
    paths, batches, alpha, m, sd = 300, 500, 0.05, math.log1p(0.005), 0.0675 / math.sqrt(16)
    k = np.arange(1, batches + 1)
    start = 12

    def run(delta: float) -> tuple[float, float, float]:
        x = delta + sd * rng.standard_normal((paths, batches))
        mean = np.cumsum(x, axis=1) / k
        var = (np.cumsum(x * x, axis=1) - k * mean * mean) / np.maximum(k - 1, 1) / k
        stop_sprt, stop_cs = [], []
        for p in range(paths):
            lo_seen, hi_seen, s_sprt, s_cs = -math.inf, math.inf, batches, batches
            for j in range(start, batches):
                se = math.sqrt(var[p, j])
                lo, hi = stats.sprt_bounds(mean[p, j], var[p, j], alpha, float(j))
                lo_seen, hi_seen = max(lo_seen, lo), min(hi_seen, hi)
                if s_sprt == batches and -m < lo_seen and hi_seen < m:
                    s_sprt = j + 1
                hw = stats.cs_halfwidth(se, j + 1, alpha, 100.0, df=float(j), one_sided=True)
                if s_cs == batches and -m < mean[p, j] - hw and mean[p, j] + hw < m:
                    s_cs = j + 1
                if s_sprt < batches and s_cs < batches:
                    break
            stop_sprt.append(s_sprt)
            stop_cs.append(s_cs)
        decided = float(np.mean(np.array(stop_sprt) < batches))
        return decided, float(np.median(stop_sprt)), float(np.median(stop_cs))

    for delta in (m, -m):
        wrong, _, _ = run(delta)
        assert wrong <= 0.09, (delta, wrong)  # alpha 5 %; ~1.3 % Monte Carlo sd at 300 paths
    decided, med_sprt, med_cs = run(0.0)
    assert decided > 0.95
    assert med_sprt < 0.85 * med_cs, (med_sprt, med_cs)
