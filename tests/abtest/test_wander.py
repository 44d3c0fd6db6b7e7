"""Issue 30: the between-period variance component (a host bias that wanders between
periods, which the crossover does not remove) in the crossover estimate and the cs rule."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st
from scipy.signal import lfilter

from musku.abtest import stats
from musku.abtest.rules import ConfidenceSequenceRule, Evidence, RuleSetup
from musku.domain import Decision
from musku.errors import InputError


def brute_ou_cov(spans: np.ndarray, tau: float, steps: int = 2000) -> np.ndarray:
    """The OU kernel's double integrals by the midpoint rule on a fine grid."""
    pts = [a + (np.arange(steps) + 0.5) * (b - a) / steps for a, b in spans]
    return np.array(
        [[float(np.exp(-np.abs(p[:, None] - q[None, :]) / tau).mean()) for q in pts] for p in pts]
    )


@settings(max_examples=30, deadline=None)
@given(
    tau=st.floats(10.0, 10_000.0),
    l1=st.floats(1.0, 5_000.0),
    gap=st.floats(0.0, 5_000.0),
    l2=st.floats(1.0, 5_000.0),
)
def test_ou_mean_covariance_is_the_kernels_double_integral(
    tau: float, l1: float, gap: float, l2: float
) -> None:
    assume(max(l1, l2) <= 40.0 * tau)  # the grid resolves the kernel (<= tau / 50)
    spans = np.array([[0.0, l1], [l1 + gap, l1 + gap + l2]])
    got = stats.ou_mean_covariance(spans, tau)
    want = brute_ou_cov(spans, tau)
    assert got == pytest.approx(want, rel=2e-3, abs=1e-9)
    assert np.all(np.linalg.eigvalsh(got) > -1e-12)


def ou_path(n: int, tau: float, sd: float, rng: np.random.Generator) -> np.ndarray:
    rho = math.exp(-1.0 / tau)
    e = rng.standard_normal(n) * sd * math.sqrt(1 - rho * rho)
    x, _ = lfilter([1.0], [1.0, -rho], e, zi=[rho * rng.standard_normal() * sd])
    return np.asarray(x)


def test_the_wander_prior_is_the_variance_of_the_estimates_wander_part() -> None:
    """Two periods, one per role order (A-B then B-A), 1,500 s each with a 400 s swap
    between: the host bias's OU wander (sd 0.3 %, tau 1 h) enters the crossover estimate as
    half the difference of the two period means; its variance over 4,000 simulated paths is
    the prior's variance (within Monte Carlo error), and it is what the within-period
    variance alone misses."""
    rng = np.random.default_rng(7)
    sd, tau = 0.003, 3600.0
    b = 50
    n = 1500 // b * b
    wander = stats.Wander(sd, tau)
    spans = np.array([[0.0, n], [n + 400.0, 2 * n + 400.0]])
    sign = np.r_[np.ones(n // b), -np.ones(n // b)]
    per = np.r_[np.zeros(n // b), np.ones(n // b)]
    errs = []
    for _ in range(4000):
        w = ou_path(2 * n + 400, tau, sd, rng)
        d = np.r_[w[:n], -w[n + 400 :]]  # the bias enters with the role order's sign
        errs.append(0.5 * (float(d[:n].mean()) + float(d[n:].mean())))
    comp = stats.period_component(np.zeros(sign.size), sign, per, spans, wander, lrv_within=0.0)
    emp = float(np.var(errs))
    assert comp.prior_var == pytest.approx(emp, rel=0.1)
    assert comp.periods_plus == comp.periods_minus == 1 and comp.df == math.inf


def crossover_ci(
    y: np.ndarray, sign: np.ndarray, per: np.ndarray, spans: np.ndarray | None
) -> tuple[float, float]:
    est = stats.crossover_estimate(y, sign, per, spans=spans, wander=None, measure_periods=True)
    assert est is not None
    q = stats.t_quantile(0.975, est.df)
    return est.mean - q * est.se, est.mean + q * est.se


def test_period_effects_are_measured_from_the_spread_of_the_period_means() -> None:
    """Batch means with an independent period effect (sd 2x the within-period standard
    error of a period mean) over 8 periods of alternating role order: the 95 % interval
    covers the true effect about 95 % of the time with the between-period component (its
    random-effects estimate, 6 degrees of freedom), far less without it."""
    rng = np.random.default_rng(11)
    k, m = 8, 10
    sign = np.repeat(np.where(np.arange(k) % 2 == 0, 1.0, -1.0), m)
    per = np.repeat(np.arange(k), m)
    spans = np.stack([np.arange(k) * 100.0, np.arange(k) * 100.0 + 90.0], axis=1)
    within, between = 1.0, 2.0 / math.sqrt(m)
    hit_with = hit_without = 0
    reps = 1000
    for _ in range(reps):
        y = 0.5 * sign + rng.normal(0, between, k)[per] + rng.normal(0, within, k * m)
        lo, hi = crossover_ci(y, sign, per, spans)
        hit_with += lo <= 0.0 <= hi
        lo, hi = crossover_ci(y, sign, per, None)
        hit_without += lo <= 0.0 <= hi
    assert hit_with / reps >= 0.92  # DerSimonian-Laird on 8 periods: a little optimistic
    assert hit_without / reps < 0.85


def test_without_period_effects_the_component_costs_little() -> None:
    """No period effect: the random-effects estimate is mostly 0 and the intervals are
    about as wide as the within-only ones (median ratio < 1.15)."""
    rng = np.random.default_rng(12)
    k, m = 8, 10
    sign = np.repeat(np.where(np.arange(k) % 2 == 0, 1.0, -1.0), m)
    per = np.repeat(np.arange(k), m)
    spans = np.stack([np.arange(k) * 100.0, np.arange(k) * 100.0 + 90.0], axis=1)
    ratios = []
    for _ in range(300):
        y = rng.normal(0, 1.0, k * m)
        a = crossover_ci(y, sign, per, spans)
        b = crossover_ci(y, sign, per, None)
        ratios.append((a[1] - a[0]) / (b[1] - b[0]))
    assert float(np.median(ratios)) < 1.15


def evidence(
    periods: int,
    per_period: int,
    length_s: float,
    effect: float,
    noise: float = 0.01,
    gap: float = 300.0,
) -> Evidence:
    """Batch means of a clear effect (sd ``noise`` each) over ``periods`` periods of
    alternating role order, each ``length_s`` host seconds."""
    rng = np.random.default_rng(3)
    sign = np.repeat(np.where(np.arange(periods) % 2 == 0, 1, -1), per_period).astype(np.int8)
    per = np.repeat(np.arange(periods), per_period).astype(np.int64)
    y = effect + noise * rng.standard_normal(sign.size)
    starts = np.arange(periods) * (length_s + gap)
    return Evidence(
        batch_d=y,
        batch_sign=sign,
        batch_period=per,
        log_a=np.zeros(1),
        log_b=np.zeros(1),
        direction=1.0,
        samples=sign.size * 10,
        batch_size=10,
        period_span=np.stack([starts, starts + length_s], axis=1),
    )


def started_rule(**options: float) -> ConfidenceSequenceRule:
    rule = ConfidenceSequenceRule(seed=1, early=False, **options)  # type: ignore[arg-type]
    rule.start(RuleSetup(0.05, 0.005, 30_000, 10, 0.01, 0.0))
    return rule


def test_long_periods_need_two_of_each_role_order_before_a_decision() -> None:
    """Periods of 4,000 s against the prior's one-hour wander (``PERIOD_SHARE_OF_WANDER``
    x tau or more): one period per role order leaves the bias change between them
    unmeasured, so even a clear +3 % waits; with two of each it is decided. Periods below
    the share (3,000 s) and short ones (60 s, 10 s apart) need no second pair."""
    rule = started_rule()
    v = rule.look(evidence(2, 20, 4000.0, 0.03))
    assert v.decision is None and v.ci_low > 0.0
    assert "between-period (wander) sd" in v.detail and "(prior)" in v.detail
    assert rule.look(evidence(4, 20, 4000.0, 0.03)).decision is Decision.BETTER
    assert started_rule().look(evidence(2, 20, 3000.0, 0.03)).decision is Decision.BETTER
    assert started_rule().look(evidence(2, 20, 60.0, 0.03, gap=10.0)).decision is Decision.BETTER
    # the prior off (wander_sd 0): the data alone, one period per order is enough
    assert started_rule(wander_sd=0.0).look(evidence(2, 20, 4000.0, 0.03)).decision is (
        Decision.BETTER
    )


@pytest.mark.parametrize(
    ("key", "bad"), [("wander_sd", -0.1), ("wander_sd", 0.5), ("wander_tau_s", 0.0),
                     ("wander_sd", math.nan), ("wander_tau_s", True)],
)  # fmt: skip
def test_wander_options_are_checked(key: str, bad: object) -> None:
    with pytest.raises(InputError, match=f"cs rule: {key} = "):
        ConfidenceSequenceRule(**{key: bad})  # type: ignore[arg-type]


def test_the_bias_interval_includes_the_wanders_average() -> None:
    """A calibration's bias estimate is the host bias's *average* over its periods, which a
    slow wander moves (nothing cancels it, unlike in the effect). Ten ABBA periods of 800 s
    with 100 s swaps, OU wander sd 0.3 % / tau 1 h, per-batch noise: the 95 % interval
    (fixed-n, so the check is sharp) from ``bias_se`` covers the constant bias in ~95 % of
    1,000 paths; from the within-period noise alone (the calibration before issue 30 item
    5) far fewer. ``bias_var`` is the variance of the wander's average (Monte Carlo)."""
    rng = np.random.default_rng(11)
    sd, tau, bias, b, per_len, gap = 0.003, 3600.0, 0.004, 20, 800, 100
    wander = stats.Wander(sd, tau)
    k = 10
    nb = per_len // b
    order = [1, -1, -1, 1] * 3
    sign = np.repeat(np.array(order[:k], dtype=float), nb)
    per = np.repeat(np.arange(k), nb)
    starts = np.arange(k) * (per_len + gap)
    spans = np.c_[starts, starts + per_len].astype(float)
    total = int(spans[-1, 1])
    inside, inside_within, avgs = 0, 0, []
    comp = None
    for _ in range(1000):
        w = bias + ou_path(total, tau, sd, rng)
        y = np.concatenate(
            [s * w[a:e].reshape(nb, b).mean(axis=1) for s, (a, e) in
             zip(order[:k], spans.astype(int), strict=True)]
        ) + 0.0015 * rng.standard_normal(k * nb)  # fmt: skip
        est = stats.crossover_estimate(y, sign, per, spans=spans, wander=wander)
        assert est is not None
        comp = est.period
        avgs.append(est.bias)
        inside += abs(est.bias - bias) <= 1.96 * est.bias_se
        inside_within += abs(est.bias - bias) <= 1.96 * est.bias_se_within
    assert comp is not None
    assert 0.93 <= inside / 1000 <= 0.985
    assert inside_within / 1000 < 0.8
    noise = (0.0015**2) / (k * nb)
    assert comp.bias_var + noise == pytest.approx(float(np.var(avgs)), rel=0.15)
