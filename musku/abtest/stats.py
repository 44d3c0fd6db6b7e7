"""Statistics of the sequential A/B tester: pure functions on numpy arrays.

Nothing here knows about hosts or configurations. The driver (:mod:`musku.abtest.driver`)
feeds these with per-window log-ratios and the decision rules (:mod:`musku.abtest.rules`)
turn them into verdicts.

- :func:`ar1_coefficient` / :func:`choose_batch_size`: batch means whose neighbours are
  nearly uncorrelated, from the estimated lag-1 autocorrelation of the window series.
- :func:`mser_truncation` / :func:`detect_warmup`: the end of the transient after a
  configuration change, found from the data (MSER-5, White 1997, confirmed by a
  changepoint t-test and a residual-trend test, both with AR(1)-corrected variances).
- :func:`crossover_estimate`: the period-balanced crossover estimator of the effect with
  a batch-means / Newey-West (Bartlett, lag 1) long-run variance.
- :func:`cs_halfwidth`: the two-sided asymptotic confidence sequence of Waudby-Smith,
  Arnold, Wu, McAuliffe and Ramdas ("Time-uniform central limit theory and asymptotic
  confidence sequences", 2021/2023), i.e. Robbins' normal-mixture boundary applied to the
  CLT-approximated sum, tuned to be tightest at a chosen intrinsic time.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from types import ModuleType

import numpy as np
from numpy.typing import NDArray

FloatArray = NDArray[np.float64]


# --------------------------------------------------------------------------- autocorrelation


def ar1_coefficient(x: FloatArray) -> float:
    """Lag-1 autocorrelation of ``x`` (the Yule-Walker AR(1) coefficient), in [-0.99, 0.99].

    Returns 0.0 for series too short (< 4 points) or constant."""
    x = np.asarray(x, dtype=float)
    if x.size < 4:
        return 0.0
    c = x - x.mean()
    denom = float(c @ c)
    if denom <= 0.0:
        return 0.0
    rho = float(c[1:] @ c[:-1]) / denom
    return float(min(0.99, max(-0.99, rho)))


def batch_mean_correlation(rho: float, b: int) -> float:
    """Correlation between neighbouring means of ``b`` consecutive points of an AR(1) with
    lag-1 coefficient ``rho``."""
    if b < 1:
        raise ValueError("batch size must be >= 1")
    if rho <= 0.0:
        return 0.0
    q = 1.0 - rho**b
    cov = rho * q * q / (1.0 - rho) ** 2  # sum_{i<=b<j<=2b} rho^(j-i)
    var = b * (1.0 + rho) / (1.0 - rho) - 2.0 * rho * q / (1.0 - rho) ** 2
    return float(cov / var)


def choose_batch_size(
    rho: float, *, target: float = 0.1, minimum: int = 5, maximum: int = 500
) -> int:
    """Smallest batch size whose neighbouring AR(1) batch means correlate at most ``target``."""
    rho = min(0.99, max(0.0, rho))
    b = max(1, minimum)
    while b < maximum and batch_mean_correlation(rho, b) > target:
        b += 1 if b < 20 else max(1, b // 10)
    return int(min(b, maximum))


def autocovariances(x: FloatArray, lags: int) -> FloatArray:
    """Sample autocovariances ``g[j] = sum_t x_t x_{t-j} / n`` of ``x`` (demeaned), j = 0..lags
    (statsmodels' ``acovf(x, nlag=lags)``, without its import cost)."""
    x = np.asarray(x, dtype=float)
    n = x.size
    c = x - x.mean()
    lags = max(0, min(int(lags), n - 1))
    if lags > 32 or (lags > 2 and n > 512):
        # many lags or a long series: by FFT, O(n log n)
        nfft = 1 << int(2 * n - 1).bit_length()
        f = np.fft.rfft(c, nfft)
        return np.asarray(np.fft.irfft(f * np.conj(f), nfft)[: lags + 1] / n, dtype=float)
    return np.array([float(c[j:] @ c[: n - j]) / n for j in range(lags + 1)])


def nw_bandwidth(x: FloatArray) -> float:
    """Newey-West (1994) data-driven bandwidth of the Bartlett kernel for the long-run
    variance of ``x``: ``1.1447 (s1 / s0)^(2/3) n^(1/3)`` from the autocovariances up to lag
    ``4 (n / 100)^(2/9)``; at most ``n / 2``. 0 for series too short (< 8) or constant."""
    x = np.asarray(x, dtype=float)
    n = x.size
    if n < 8:
        return 0.0
    lags = max(1, min(int(4.0 * (n / 100.0) ** (2.0 / 9.0)), n - 2))
    g = autocovariances(x, lags)
    j = np.arange(1, lags + 1)
    s0 = g[0] + 2.0 * float(g[1:].sum())
    s1 = 2.0 * float((j * g[1:]).sum())
    if s0 <= 0.0 or g[0] <= 0.0:
        return 0.0
    gamma = 1.1447 * abs(s1 / s0) ** (2.0 / 3.0)
    return float(min(gamma * n ** (1.0 / 3.0), n / 2.0))


def hac_lrv(x: FloatArray, bandwidth: float) -> float:
    """Bartlett-kernel (Newey-West) long-run variance of ``x`` (demeaned) with ``L =
    floor(bandwidth)`` lags, weights ``1 - j / (L + 1)``: statsmodels' ``cov_hac`` with
    ``nlags=L`` on a mean. Never below the plain variance (a negative weighted sum of
    autocovariances carries no information a variance bound could use)."""
    lags = int(math.floor(max(0.0, bandwidth)))
    g = autocovariances(x, lags)
    if g.size == 0:
        return 0.0
    w = 1.0 - np.arange(1, g.size) / (lags + 1.0)
    return float(max(g[0], g[0] + 2.0 * float(w @ g[1:])))


def integrated_autocorrelation(x: FloatArray) -> tuple[float, float]:
    """(integrated autocorrelation time, bandwidth) of ``x``: its HAC long-run variance over
    its variance, with the Newey-West data-driven bandwidth (1.0 for white noise)."""
    x = np.asarray(x, dtype=float)
    if x.size < 8:
        return 1.0, 0.0
    g0 = float(autocovariances(x, 0)[0])
    if g0 <= 0.0:
        return 1.0, 0.0
    bw = nw_bandwidth(x)
    return hac_lrv(x, bw) / g0, bw


def batch_size_for(
    x: FloatArray, *, target: float = 0.05, maximum: int = 100_000
) -> tuple[int, float]:
    """(batch size, bandwidth) for the window series ``x``: the smallest batch whose
    neighbouring means correlate at most ``target`` for the AR(1) with the same integrated
    autocorrelation time, estimated as the larger of the HAC one (Newey-West bandwidth) and
    the lag-1 AR(1) one ``(1 + rho) / (1 - rho)`` (the truncated HAC sum is biased low on
    short strongly autocorrelated series, the lag-1 one misses longer memory). No upper-bound
    margin: a short pilot's noisy estimate is corrected by the re-estimates at every period
    and, in between, by the HAC variance over the batch means."""
    x = np.asarray(x, dtype=float)
    if x.size < 8:
        return choose_batch_size(0.5, target=target, maximum=maximum), 0.0
    iact, bw = integrated_autocorrelation(x)
    rho = max(0.0, ar1_coefficient(x))
    phi = max(ar1_equivalent(iact), min(rho, 0.995))
    return choose_batch_size(phi, target=target, maximum=maximum), bw


def ar1_equivalent(iact: float) -> float:
    """The AR(1) coefficient with integrated autocorrelation time ``iact``
    (``(1 + phi) / (1 - phi) = iact``), in [0, 0.995]."""
    if not math.isfinite(iact) or iact <= 1.0:
        return 0.0
    return float(min(0.995, (iact - 1.0) / (iact + 1.0)))


def long_run_variance_factor(rho: float) -> float:
    """Variance inflation of a mean of AR(1) points: (1 + rho) / (1 - rho), rho clamped >= 0."""
    rho = min(0.99, max(0.0, rho))
    return (1.0 + rho) / (1.0 - rho)


# --------------------------------------------------------------------------- warm-up


def mser_truncation(x: FloatArray, batch: int = 5) -> int:
    """MSER-``batch`` truncation point: the number of leading points to discard.

    Groups ``x`` in consecutive means of ``batch`` points ``z_0..z_{m-1}`` and returns
    ``batch * k`` for the ``k`` in ``[0, m // 2]`` minimising the marginal standard error
    ``sum_{i>=k} (z_i - mean(z_k..))^2 / (m - k)^2`` (White 1997; Franklin & White 2008)."""
    x = np.asarray(x, dtype=float)
    m = x.size // batch
    if m < 4:
        return 0
    z = x[: m * batch].reshape(m, batch).mean(axis=1)
    # tail sums from the end: S1[k] = sum z[k:], S2[k] = sum z[k:]^2
    s1 = np.cumsum(z[::-1])[::-1]
    s2 = np.cumsum((z * z)[::-1])[::-1]
    kmax = m // 2
    k = np.arange(kmax + 1)
    cnt = (m - k).astype(float)
    sse = s2[: kmax + 1] - s1[: kmax + 1] ** 2 / cnt
    stat = np.maximum(sse, 0.0) / cnt**2
    return int(np.argmin(stat)) * batch


@dataclass(frozen=True)
class WarmupVerdict:
    """What :func:`detect_warmup` found in a probe of post-minimum-warm-up windows."""

    discard: int  # leading points of the probe that are still transient
    extend: bool  # the transient may continue past the probe: measure more and look again
    shift_t: float  # changepoint t statistic (transient mean vs the rest)
    trend_t: float  # trend t statistic of the kept part


def detect_warmup(x: FloatArray, *, threshold: float = 3.0, batch: int = 5) -> WarmupVerdict:
    """Find the end of the transient at the start of ``x`` (the windows right after the
    minimum warm-up).

    MSER-5 proposes a truncation point; it is accepted only when the discarded head's mean
    differs from the kept tail's by more than ``threshold`` AR(1)-corrected standard errors
    (so stationary noise does not cost data). The kept part is then tested for a residual
    linear trend (slope t statistic, AR(1)-corrected). ``extend`` asks for more data when
    the accepted truncation point sits at MSER's search limit (half the probe) or a trend
    remains: the transient is longer than the probe."""
    x = np.asarray(x, dtype=float)
    n = x.size
    if n < 4 * batch:
        return WarmupVerdict(0, False, 0.0, 0.0)
    k = mser_truncation(x, batch)
    shift_t = 0.0
    discard = 0
    if k > 0:
        head, tail = x[:k], x[k:]
        rho = max(0.0, ar1_coefficient(tail))
        var = float(tail.var(ddof=1)) * long_run_variance_factor(rho)
        se = math.sqrt(var * (1.0 / k + 1.0 / tail.size)) if var > 0 else 0.0
        diff = float(head.mean() - tail.mean())
        shift_t = diff / se if se > 0 else (math.inf if diff else 0.0)
        if abs(shift_t) > threshold:
            discard = k
    kept = x[discard:]
    trend_t = _trend_t(kept)
    at_limit = discard > 0 and discard >= batch * ((n // batch) // 2) - batch
    extend = at_limit or abs(trend_t) > threshold
    return WarmupVerdict(discard, extend, shift_t, trend_t)


@dataclass(frozen=True)
class TransientFit:
    """An exponential transient ``x(t) = c + a exp(-t / tau)`` fitted to a series."""

    amplitude: float  # a (log scale; the sign says which way the series settles)
    tau: float  # time constant, in points
    t_stat: float  # a over its AR(1)-corrected standard error
    end: int  # points after which |a| exp(-t / tau) < eps (0: no significant transient)
    at_limit: bool  # tau at the search limit: the probe is too short to see the end


def fit_transient(
    x: FloatArray,
    *,
    eps: float,
    threshold: float = 2.0,
    taus: FloatArray | None = None,
) -> TransientFit:
    """Least-squares fit of ``c + a exp(-t / tau)`` to ``x`` over a geometric grid of ``tau``
    (2 points to the series' length; linear least squares in (c, a) for each), and the
    point where the fitted transient falls below ``eps``. A transient counts only when its
    amplitude is ``threshold`` AR(1)-corrected standard errors away from 0. Hypothesis
    tests alone (MSER, changepoint) cannot see the long small tail of a slow transient that
    still biases an estimate by a fraction of a percent; the fitted curve can."""
    x = np.asarray(x, dtype=float)
    n = x.size
    if n < 20:
        return TransientFit(0.0, 0.0, 0.0, 0, False)
    t = np.arange(n, dtype=float)
    grid = np.asarray(taus if taus is not None else np.geomspace(2.0, float(n), 40), dtype=float)
    xc = x - x.mean()
    # every tau at once: columns of centred exponentials
    e = np.exp(-t[:, None] / grid[None, :])
    ec = e - e.mean(axis=0)
    see = np.einsum("ij,ij->j", ec, ec)
    ok = see > 1e-12
    if not ok.any():
        return TransientFit(0.0, 0.0, 0.0, 0, False)
    a_all = np.where(ok, (ec.T @ xc) / np.where(ok, see, 1.0), 0.0)
    sse_all = np.where(ok, float(xc @ xc) - a_all * a_all * see, np.inf)
    j = int(np.argmin(sse_all))
    sse, tau, a = float(sse_all[j]), float(grid[j]), float(a_all[j])
    if not math.isfinite(sse):
        return TransientFit(0.0, 0.0, 0.0, 0, False)
    resid = xc - a * ec[:, j]
    rho = max(0.0, ar1_coefficient(resid))
    s2_lr = max(sse, 0.0) / (n - 3) * long_run_variance_factor(rho)
    se = math.sqrt(s2_lr / float(see[j]))
    t_stat = a / se if se > 0 else 0.0
    at_limit = tau >= float(grid[-2])
    if abs(t_stat) < threshold or abs(a) <= eps:
        return TransientFit(a, tau, t_stat, 0, False)
    end = int(math.ceil(tau * math.log(abs(a) / eps)))
    return TransientFit(a, tau, t_stat, end, at_limit)


def _trend_t(y: FloatArray) -> float:
    """t statistic of the OLS slope of ``y`` on time, residual variance AR(1)-corrected."""
    n = y.size
    if n < 10:
        return 0.0
    t = np.arange(n, dtype=float)
    t -= t.mean()
    sxx = float(t @ t)
    yc = y - y.mean()
    slope = float(t @ yc) / sxx
    resid = yc - slope * t
    s2 = float(resid @ resid) / (n - 2)
    if s2 <= 0.0:
        return 0.0
    rho = max(0.0, ar1_coefficient(resid))
    se = math.sqrt(s2 * long_run_variance_factor(rho) / sxx)
    return slope / se


# --------------------------------------------------------------------------- estimation


@dataclass(frozen=True)
class CrossoverEstimate:
    """The effect estimated from batch means (log scale, good direction positive)."""

    mean: float  # effect estimate
    se: float  # its standard error (batch means, Newey-West lag 1, small-sample inflated)
    n_eff: float  # intrinsic time in batches: long-run variance / se^2
    bias: float  # estimated host bias (half the difference of the two role orders)
    n_plus: int
    n_minus: int
    df: int
    bandwidth: float = 1.0  # Bartlett HAC bandwidth over the batch means (lags)
    bias_se: float = math.nan  # standard error of ``bias`` (the wander's part included)
    bias_se_within: float = math.nan  # ... of its within-period noise alone
    period: PeriodComponent | None = None  # the between-period component (None: not modelled)
    noise_prior: bool = False  # the calibration's noise was pooled into ``se`` (and ``df``)


def crossover_estimate(
    y: FloatArray,
    sign: NDArray[np.int8] | FloatArray,
    period: NDArray[np.int64] | FloatArray,
    *,
    spans: FloatArray | None = None,
    wander: Wander | Sequence[Wander] | None = None,
    measure_periods: bool = False,
    noise: NoisePrior | None = None,
    batch_size: int = 1,
) -> CrossoverEstimate | None:
    """Crossover estimate from batch means ``y`` of sign-adjusted log-ratios.

    ``sign[j]`` is +1 when host 0 ran A during batch ``j`` and -1 when the roles were swapped;
    the host bias ``delta`` enters as ``y = mu + sign * delta + noise``, so the OLS fit of that
    model (the mean of the two role orders' means) removes it. The variance of the batch
    means is the Bartlett (Newey-West) HAC long-run variance of the residuals over the whole
    sequence, periods included (a slow per-host wander correlates batches across them), with
    the Newey-West data-driven bandwidth, at least one lag, never less than the plain
    variance. Returns ``None`` until both role orders have at least two batches.

    With ``spans`` (each period's time span, indexed by period) the model of the batch means
    gets a between-period component (``y = mu + s delta + u_period + e``): the within
    variance comes from the residuals around each *period's* mean, and
    :func:`period_component` adds the variance of the periods' host-bias changes (the
    ``wander`` prior's, or the spread of the period means', the larger), with Satterthwaite
    degrees of freedom.

    With ``noise`` (the pair's calibration: a long-run variance per window measured over
    thousands of windows, on ``noise.df`` degrees of freedom) the within variance per batch
    of ``batch_size`` windows is the pooled one, :func:`pool_variance`: the calibration's
    ``noise.lrv / batch_size`` and the running HAC estimate weighted by their degrees of
    freedom (a scaled inverse chi-square prior updated by the comparison's own), on their
    sum of degrees of freedom; unless the two disagree beyond chance (then the comparison's
    own alone: a calibration that is wrong for this comparison is not trusted)."""
    y = np.asarray(y, dtype=float)
    s = np.asarray(sign, dtype=float)
    plus = s > 0
    n_plus = int(plus.sum())
    n_minus = int(y.size - n_plus)
    if n_plus < 2 or n_minus < 2:
        return None
    m_plus = float(y[plus].mean())
    m_minus = float(y[~plus].mean())
    comp: PeriodComponent | None = None
    if spans is None or not measure_periods:
        # residuals around each role order's mean: with several periods per order the HAC
        # over the whole sequence sees (part of) the bias's change between them too
        resid = np.where(plus, y - m_plus, y - m_minus)
        df = y.size - 2
    else:
        per = np.asarray(period).astype(np.int64)
        ids, inv = np.unique(per, return_inverse=True)
        means = np.bincount(inv, weights=y) / np.bincount(inv)
        resid = y - means[inv]
        df = max(1, y.size - ids.size)
    bw = max(1.0, nw_bandwidth(resid))
    # autocovariances divide by n; the residual variance has df = n - 2 (n - periods)
    lrv = hac_lrv(resid, bw) * y.size / df
    prior_used = False
    if noise is not None:
        lrv, df_pooled, prior_used = pool_variance(
            lrv, df, noise.lrv / max(1, batch_size), noise.df, noise.check
        )
        df = int(min(df_pooled, 1e9))
    var = 0.25 * lrv * (1.0 / n_plus + 1.0 / n_minus)
    within = var
    bias_var = var
    dof: float = df
    if spans is not None:
        comp = period_component(
            y, s, np.asarray(period), spans, wander, lrv, measure=measure_periods
        )
        bias_var = var + comp.bias_var
        if comp.var > 0:
            tot = var + comp.var
            dof = (
                tot
                * tot
                / (var * var / df + (comp.var**2 / comp.df if comp.df < math.inf else 0.0))
            )
            var = tot
    return CrossoverEstimate(
        mean=0.5 * (m_plus + m_minus),
        se=math.sqrt(var),
        n_eff=4.0 / (1.0 / n_plus + 1.0 / n_minus),
        bias=0.5 * (m_plus - m_minus),
        n_plus=n_plus,
        n_minus=n_minus,
        df=int(min(dof, 1e9)),
        bandwidth=bw,
        bias_se=math.sqrt(bias_var),
        bias_se_within=math.sqrt(within),
        period=comp,
        noise_prior=prior_used,
    )


@dataclass(frozen=True)
class NoisePrior:
    """What a pair's calibration measured of its noise: the long-run variance ``lrv`` of one
    window's (CUPED-adjusted) log-ratio, on ``df`` degrees of freedom (its batches less its
    periods). ``check``: the two-sided level of the test that the comparison's own variance
    agrees with it (beyond it, the calibration is not used)."""

    lrv: float
    df: float
    check: float = 0.05


def pool_variance(
    lrv: float, df: float, prior_lrv: float, prior_df: float, check: float = 0.05
) -> tuple[float, float, bool]:
    """(variance, degrees of freedom, prior used) pooling a running variance estimate
    ``lrv`` on ``df`` degrees of freedom with a prior one ``prior_lrv`` on ``prior_df``.

    The prior is a scaled inverse chi-square on the variance (what ``prior_df`` degrees of
    freedom of the same noise measured), so the posterior's scale is the df-weighted mean
    of the two and its degrees of freedom their sum: the Student-t at the boundary then has
    ``prior_df + df`` degrees of freedom instead of the comparison's few. Only while the two
    agree: when ``lrv / prior_lrv`` lies outside the central ``1 - check`` of its F(df,
    prior_df) distribution (the calibration's noise is not this comparison's: another load,
    a drift), the running estimate alone is returned. ``check = 0`` never rejects."""
    if not (
        math.isfinite(prior_lrv) and prior_lrv > 0 and math.isfinite(prior_df) and prior_df > 0
    ):
        return lrv, df, False
    if df < 1 or not math.isfinite(lrv):
        return lrv, df, False
    if check > 0:
        ratio = lrv / prior_lrv
        lo = float(_special().fdtri(df, prior_df, check / 2.0))
        hi = float(_special().fdtri(df, prior_df, 1.0 - check / 2.0))
        if not lo <= ratio <= hi:
            return lrv, df, False
    tot = prior_df + df
    return (prior_df * prior_lrv + df * lrv) / tot, tot, True


def ou_mean_covariance(spans: FloatArray, tau: float) -> FloatArray:
    """Covariance matrix of the means of a stationary Ornstein-Uhlenbeck process (unit
    variance, correlation ``exp(-|t - s| / tau)``) over the disjoint, time-ordered intervals
    ``spans[p] = (start, end)``: the exact double integrals of the kernel. A slow per-host
    wander of the host bias is such a process; its period means then covary by this matrix
    times the wander's variance."""
    spans = np.asarray(spans, dtype=float).reshape(-1, 2)
    a, b = spans[:, 0], spans[:, 1]
    length = np.maximum(b - a, 1e-9)
    x = length / tau
    # 2 (x - 1 + e^-x) / x^2, with its series near 0 (1 - x / 3 + x^2 / 12)
    with np.errstate(over="ignore", invalid="ignore"):
        diag = np.where(
            x > 1e-4, 2.0 * (x - 1.0 + np.exp(-x)) / np.maximum(x, 1e-300) ** 2, 1.0 - x / 3.0
        )
    f = -np.expm1(-x) / x  # (1 - e^-x) / x: one interval's share of the kernel's reach
    gap = np.maximum(a[None, :] - b[:, None], 0.0)  # start of q - end of p
    gap = np.maximum(gap, gap.T)
    cov = f[:, None] * f[None, :] * np.exp(-gap / tau)
    np.fill_diagonal(cov, diag)
    return cov


@dataclass(frozen=True)
class Wander:
    """What is known in advance of the slow wander of a pair's host bias (the log-ratio of
    the two hosts' throughput): a stationary OU process with standard deviation ``sd``
    (relative) and time constant ``tau_s`` (seconds)."""

    sd: float
    tau_s: float


WANDER_MAX_POINTS = 600
"""At most this many points enter :func:`measure_wander` (consecutive batches averaged in
groups beyond it): the variogram's pairs grow with the square of the points."""


WANDER_MIN_LAG = 8
"""The shortest lag :func:`measure_wander` fits, in median batch spacings: shorter lags hold
the batches' own short-range correlation (what the within-period HAC variance accounts for;
fitted, it passed for a fast "wander" of 0.8-1.1 % with tau 16-33 s on the shipped model,
whose real wander is 0.28 % over an hour)."""


def measure_wander(t: FloatArray, z: FloatArray, *, bins: int = 20) -> Wander | None:
    """The slow wander of a pair's host bias measured from an A/A's batch means: ``z[j]``
    the host-frame residual of batch ``j`` (``sign * (y - mu)``: the host bias plus its
    wander plus the batch's noise), ``t[j]`` its mid-time (host seconds).

    The empirical semivariogram ``g(h) = E (z(t + h) - z(t))^2 / 2`` over geometric lag
    bins from :data:`WANDER_MIN_LAG` batch spacings up to half the series' span is fitted by the stationary OU model with a nugget,
    ``g(h) = n + sd^2 (1 - exp(-h / tau))`` (the batches' own noise is the nugget; a constant
    bias drops out of every difference): least squares with equal weight per bin, ``n`` and
    ``sd^2`` non-negative, over a geometric grid of ``tau`` from the shortest fitted lag to twice
    the span (a wander slower than that is not told apart from a trend: ``tau`` then sits at
    the grid's end and ``sd`` is what the span shows). None with fewer than 16 points or a
    span too short for three lag bins."""
    t = np.asarray(t, dtype=float).ravel()
    z = np.asarray(z, dtype=float).ravel()
    ok = np.isfinite(t) & np.isfinite(z)
    t, z = t[ok], z[ok]
    order = np.argsort(t, kind="stable")
    t, z = t[order], z[order]
    if t.size > WANDER_MAX_POINTS:
        k = -(-t.size // WANDER_MAX_POINTS)
        m = t.size // k * k
        t = t[:m].reshape(-1, k).mean(axis=1)
        z = z[:m].reshape(-1, k).mean(axis=1)
    if t.size < 16:
        return None
    span = float(t[-1] - t[0])
    iu = np.triu_indices(t.size, 1)
    h = (t[None, :] - t[:, None])[iu]
    g = 0.5 * ((z[None, :] - z[:, None])[iu]) ** 2
    pos = h > 0
    h, g = h[pos], g[pos]
    if h.size == 0:
        return None
    h_lo = max(float(h.min()), WANDER_MIN_LAG * float(np.median(np.diff(t))))
    h_hi = 0.5 * span
    if not h_hi > 2.0 * h_lo:
        return None
    edges = np.geomspace(h_lo, h_hi, bins + 1)
    edges[-1] *= 1.0 + 1e-12
    idx = np.searchsorted(edges, h, side="right") - 1
    use = (idx >= 0) & (idx < bins)
    cnt = np.bincount(idx[use], minlength=bins).astype(float)
    have = cnt > 0
    if int(have.sum()) < 3:
        return None
    hb = (np.bincount(idx[use], weights=h[use], minlength=bins) / np.maximum(cnt, 1.0))[have]
    gb = (np.bincount(idx[use], weights=g[use], minlength=bins) / np.maximum(cnt, 1.0))[have]
    best: tuple[float, float, float] | None = None  # (sse, sill, tau)
    for tau in np.geomspace(max(h_lo, 1e-9), 2.0 * span, 48):
        x = -np.expm1(-hb / tau)
        xm, gm = float(x.mean()), float(gb.mean())
        sxx = float(((x - xm) ** 2).sum())
        sill = float(((x - xm) * (gb - gm)).sum()) / sxx if sxx > 0 else 0.0
        nug = gm - sill * xm
        if sill < 0.0:
            sill, nug = 0.0, gm
        elif nug < 0.0:
            nug, sill = 0.0, float(x @ gb) / float(x @ x)
        sse = float(((gb - nug - sill * x) ** 2).sum())
        if best is None or sse < best[0]:
            best = (sse, sill, float(tau))
    assert best is not None
    return Wander(math.sqrt(max(0.0, best[1])), best[2])


@dataclass(frozen=True)
class PeriodComponent:
    """The between-period variance component of a crossover estimate (log scale squared)."""

    var: float  # its variance in the estimate
    prior_var: float  # what the wander prior alone gives
    data_var: float  # what the spread of the period means gives (random effects, moments)
    periods_plus: int  # periods with batches in each role order
    periods_minus: int
    df: float  # degrees of freedom of ``var`` (inf: the prior, taken as known)
    # the prior's variance of the host bias's *average* over the periods (the bias estimate's
    # wander part: unlike the effect's, nothing cancels it; what a calibration must include)
    bias_var: float = 0.0


def period_component(
    y: FloatArray,
    sign: FloatArray,
    period: FloatArray,
    spans: FloatArray,
    wander: Wander | Sequence[Wander] | None,
    lrv_within: float,
    measure: bool = True,
) -> PeriodComponent:
    """The between-period part of the crossover estimate's variance, for the model of the
    batch means ``y = mu + s delta + u_period + e`` (``u`` the host bias's change between
    periods, which the crossover does not remove: only a constant bias cancels).

    Two estimates, the larger counts: the ``wander`` prior's exact OU covariance (with
    several priors, e.g. the rule's default and the pair's calibrated wander, the largest) of the
    period means over their time ``spans`` (``spans[p]``: the first window's start and the
    last's end of period ``p``), weighted as the estimator weighs them; and, from three
    periods on, a random-effects (method of moments, DerSimonian-Laird) estimate from the
    spread of the period means around their role order's mean beyond what the within-period
    variance ``lrv_within`` (per batch) explains, with ``periods - 2`` degrees of freedom;
    only with ``measure`` (the rule sets it when periods are long against the wander's time
    scale: over many short periods a smooth drift, which the ABBA balance cancels, would
    pass for independent period effects and widen the interval for nothing)."""
    y = np.asarray(y, dtype=float)
    s = np.asarray(sign, dtype=float)
    per = np.asarray(period).astype(np.int64)
    ids, first, inv = np.unique(per, return_index=True, return_inverse=True)
    n_p = np.bincount(inv).astype(float)
    s_p = s[first]
    y_p = np.bincount(inv, weights=y) / n_p
    plus = s_p > 0
    big_n = np.where(plus, n_p[plus].sum(), n_p[~plus].sum())
    w = n_p / (2.0 * big_n)  # the estimate is sum(w * y_p)
    c = w * s_p  # ... and holds sum(c * u_p) of the host bias's period means
    prior = 0.0
    bias_prior = 0.0
    wanders = [wander] if isinstance(wander, Wander) else list(wander or ())
    wanders = [wd for wd in wanders if wd.sd > 0 and wd.tau_s > 0]
    sp = np.asarray(spans, dtype=float).reshape(-1, 2)[ids] if wanders else np.zeros((0, 2))
    for wd in wanders:  # several priors (the rule's, a calibration's): the larger counts
        if np.all(np.isfinite(sp)):
            cov = ou_mean_covariance(sp, wd.tau_s)
            prior = max(prior, float(wd.sd**2 * (c @ cov @ c)))
            # the bias estimate holds sum(w * u_p): the wander's average over the periods
            bias_prior = max(bias_prior, float(wd.sd**2 * (w @ cov @ w)))
    data = 0.0
    k = ids.size
    df = math.inf
    if k >= 3:
        m = np.where(plus, (n_p * y_p)[plus].sum(), (n_p * y_p)[~plus].sum()) / big_n
        r = y_p - m
        ss = float((n_p * r * r).sum())
        h = n_p / big_n  # each period mean's leverage in its role order's mean
        denom = float((n_p * (1.0 - h)).sum())
        tau2 = max(0.0, (ss - lrv_within * (k - 2)) / denom) if denom > 0 else 0.0
        data = tau2 * float(c @ c)
    var = max(prior, data) if measure else prior
    if measure and data > prior:
        df = float(k - 2)
    return PeriodComponent(
        var, prior, data, int(plus.sum()), int((~plus).sum()), df, bias_var=bias_prior
    )


def plain_estimate(
    y: FloatArray, period: NDArray[np.int64] | FloatArray
) -> CrossoverEstimate | None:
    """Mean of batch means without crossover correction (the naive paired estimator)."""
    y = np.asarray(y, dtype=float)
    if y.size < 3:
        return None
    resid = y - y.mean()
    df = y.size - 1
    bw = max(1.0, nw_bandwidth(resid))
    lrv = hac_lrv(resid, bw) * y.size / df
    return CrossoverEstimate(
        mean=float(y.mean()),
        se=math.sqrt(lrv / y.size),
        n_eff=float(y.size),
        bias=0.0,
        n_plus=int(y.size),
        n_minus=0,
        df=df,
        bandwidth=bw,
    )


# --------------------------------------------------------------------------- confidence sequence


def _special() -> ModuleType:
    """scipy.special, imported on first use: the module's one import of scipy."""
    # lazy: scipy.special (its import: ~3.5x numpy's); the report and the sweep's schedule
    # import this module and compute no quantile
    import scipy.special

    return scipy.special


def t_quantile(p: float, df: float) -> float:
    """Student-t quantile (scipy.special.stdtrit: microseconds, unlike scipy.stats.t.ppf)."""
    if not math.isfinite(df) or df > 1e7:
        return float(_special().ndtri(p))
    return float(_special().stdtrit(df, p))


def cs_rho2(alpha: float, n_opt: float) -> float:
    """Mixture precision making the boundary tightest near intrinsic time ``n_opt``
    (Waudby-Smith et al., the approximately optimal choice for a two-sided CS)."""
    la = math.log(1.0 / alpha)
    return (2.0 * la + math.log(2.0 * la + 1.0)) / max(n_opt, 1.0)


def cs_radius(n: float, alpha: float, n_opt: float) -> float:
    """Radius of the two-sided (1 - alpha) asymptotic confidence sequence in standard errors.

    With ``S_n`` a sum of ``n`` unit-variance terms, ``|S_n / n - mu| <=
    sqrt(2 (n rho^2 + 1) / (n^2 rho^2) * log(sqrt(n rho^2 + 1) / alpha))`` holds for all ``n``
    at once with probability ``-> 1 - alpha``; dividing by the standard error ``1 / sqrt(n)``
    gives the multiplier returned here (about 3.0 at ``n_opt`` for alpha = 0.05, growing
    like sqrt(log n) after it)."""
    if n <= 0:
        return math.inf
    rho2 = cs_rho2(alpha, n_opt)
    v = n * rho2 + 1.0
    return math.sqrt(2.0 * v / rho2 / n * math.log(math.sqrt(v) / alpha))


def cs_radius_one_sided(n: float, alpha: float, n_opt: float) -> float:
    """Radius (in standard errors) of a **one-sided** (1 - alpha) asymptotic confidence
    sequence: the one-sided normal-mixture boundary of Howard, Ramdas, McAuliffe and Sekhon
    (Time-uniform, nonparametric, nonasymptotic confidence sequences, 2021, eq. 14),
    ``S_n <= sqrt(2 (n + 1 / rho^2) log(sqrt(n rho^2 + 1) / (2 alpha) + 1))``, with the
    mixture precision tuned like the two-sided one at level ``2 alpha``. About 0.92 x the
    two-sided radius at the same alpha (2.78 against 3.04 at ``n_opt``, alpha = 0.05): each
    side of a two-sided sequence spends alpha / 2 at most, a one-sided bound all of it.
    What an equivalence test needs (two one-sided tests, each at alpha: the TOST rule)."""
    if n <= 0:
        return math.inf
    rho2 = cs_rho2(min(0.5, 2.0 * alpha), n_opt)
    v = n * rho2 + 1.0
    return math.sqrt(2.0 * v / rho2 / n * math.log(math.sqrt(v) / (2.0 * alpha) + 1.0))


def cs_halfwidth(
    se: float,
    n: float,
    alpha: float,
    n_opt: float,
    df: float = math.inf,
    *,
    one_sided: bool = False,
) -> float:
    """Half-width of the asymptotic confidence sequence around an estimate with standard
    error ``se`` at intrinsic time ``n`` (two-sided at ``alpha``; with ``one_sided``, the
    distance of a one-sided bound at ``alpha``: :func:`cs_radius_one_sided`).

    With ``df`` finite (``se`` estimated from ``df`` degrees of freedom) the boundary's
    normal radius ``r`` is replaced by the Student-t quantile of the same two-sided tail
    probability ``2 * (1 - Phi(r))``: the small-sample correction at the boundary's own
    (small) level, not at ``alpha``, which matters at the early looks of a sequential test."""
    r = cs_radius_one_sided(n, alpha, n_opt) if one_sided else cs_radius(n, alpha, n_opt)
    if math.isfinite(df) and math.isfinite(r):
        tail = float(_special().ndtr(-r))  # one-sided
        if tail > 0.0:
            r = t_quantile(1.0 - tail, df)
    return se * r


def sprt_variance_factor(alpha: float, df: float = math.inf) -> float:
    """Inflation of a plug-in variance for the equivalence SPRT (:func:`sprt_bounds`) when
    it is estimated on ``df`` degrees of freedom: ``(t / z)^2`` with ``z = sqrt(2 log(1 /
    alpha))``, the normal radius (in standard errors) where the SPRT's boundary is tightest
    (the look at which a true 0 typically stops), and ``t`` the Student-t quantile of the
    same one-sided tail. The same correction :func:`cs_halfwidth` applies at each look, but
    as one factor per ``df``: mapping each look's own radius through the t tail would make
    a tiny variance (a radius of many standard errors) *harder* to reject with, and the
    test must be monotone in the variance. 1 for ``df`` infinite; decreasing in ``df``."""
    if not math.isfinite(df):
        return 1.0
    z = math.sqrt(2.0 * math.log(1.0 / alpha))
    tail = float(_special().ndtr(-z))
    t = t_quantile(1.0 - tail, max(df, 1.0))
    return max(1.0, (t / z) ** 2)


def sprt_bounds(
    theta: float, var: float, alpha: float, df: float = math.inf
) -> tuple[float, float]:
    """Equivalence bounds (log scale) of two one-sided **sequential probability ratio
    tests** against the point alternative 0 (Wald), for an estimate ``theta`` with variance
    ``var`` (on ``df`` degrees of freedom: :func:`sprt_variance_factor`).

    For a margin ``m > 0`` the Gaussian likelihood ratio of ``delta = 0`` against ``delta =
    m`` is ``exp(m (m / 2 - theta) / var)``; under ``delta >= m`` it is a nonnegative
    (super)martingale in the information, so by Ville's inequality it exceeds ``1 / alpha``
    at *any* look with probability at most ``alpha``: "``delta >= m``" is rejected at level
    alpha, valid under continuous monitoring, when ``m (m / 2 - theta) / var >= log(1 /
    alpha)`` (and "``delta <= -m``" when ``m (m / 2 + theta) / var >= log(1 / alpha)``).
    The smallest margin each test rejects is the bound returned: ``theta +- sqrt(theta^2
    + 2 var log(1 / alpha))``; "``delta >= m``" is rejected exactly when the upper bound is
    ``<= m``. Not a confidence interval (each margin's test is anytime-valid on its own,
    the family is not simultaneously): the equivalence decision at one margin is what it is
    for (two one-sided tests, Schuirmann 1987: intersection-union, each at alpha). Unlike
    a confidence sequence's radius it does not grow with the looks: at ``theta = 0`` it is
    ``sqrt(2 log(1 / alpha))`` = 2.45 standard errors at alpha = 0.05, against the
    one-sided normal-mixture sequence's ~2.8 at its tuning point and more after it."""
    if not (math.isfinite(theta) and math.isfinite(var) and var >= 0.0):
        return -math.inf, math.inf
    c = 2.0 * var * sprt_variance_factor(alpha, df) * math.log(1.0 / alpha)
    h = math.sqrt(theta * theta + c)
    return theta - h, theta + h


def futility_bound(
    theta: float, var: float, margin: float, alpha: float, df: float = math.inf
) -> float:
    """The futility stop's bound (log scale): the smallest bar ``b`` for which a one-sided
    **SPRT** rejects "``delta >= b``" at level ``alpha``, given the estimate ``theta`` with
    variance ``var`` (on ``df`` degrees of freedom: :func:`sprt_variance_factor`).

    The test of "``delta >= b``" is Wald's likelihood ratio of the point alternative ``b -
    margin`` against ``b`` (Gaussian): ``exp(margin (b - theta - margin / 2) / var)``, a
    nonnegative martingale in the information under ``delta = b`` and a supermartingale
    beyond it, so by Ville's inequality it reaches ``1 / alpha`` at *any* look with
    probability at most ``alpha``: valid under continuous monitoring, for a bar fixed before
    the comparison's data. It rejects exactly when ``b >= theta + margin / 2 + var log(1 /
    alpha) / margin``, the bound returned. With ``b = margin`` it is the equivalence's upper
    side (:func:`sprt_bounds`: "``delta >= margin``" rejected against the alternative 0);
    a higher bar moves the alternative with it (the alternative is always ``margin`` below
    the bar), so "not better than the walk's best" is as quick to show as "not better than
    ``margin``" when the candidate sits equally far below each. Not a confidence bound
    (each bar's test is valid on its own). ``+inf`` without a finite estimate."""
    if not (math.isfinite(theta) and math.isfinite(var) and var >= 0.0 and margin > 0.0):
        return math.inf
    c = var * sprt_variance_factor(alpha, df) * math.log(1.0 / alpha)
    return theta + margin / 2.0 + c / margin


@dataclass(frozen=True)
class PooledEstimate:
    """Several pairs' crossover estimates of one effect combined (log scale)."""

    mean: float  # the average effect over the pairs (random-effects weights)
    se: float  # its standard error, the between-pair heterogeneity included
    df: float  # Satterthwaite degrees of freedom of ``se``
    tau: float  # between-pair standard deviation of the effect (DerSimonian-Laird, >= 0)
    q: float  # Cochran's Q
    k: int  # strata combined


def pool_strata(
    means: FloatArray | list[float], ses: FloatArray | list[float], dfs: FloatArray | list[float]
) -> PooledEstimate | None:
    """Random-effects combination of ``k`` strata (one per pair): each pair's crossover
    estimate ``means[i]`` (its own host bias removed within it) with standard error
    ``ses[i]`` on ``dfs[i]`` degrees of freedom.

    The effect may differ between pairs (a knob that helps on some hosts and not on
    others): ``mu_i = mu + u_i``, ``u_i ~ (0, tau^2)``, and the estimand is the fleet's
    average effect ``mu``. ``tau^2`` is the DerSimonian-Laird moment estimate from Cochran's
    Q, the weights ``1 / (se_i^2 + tau^2)``. Where heterogeneity is seen (``tau^2 > 0``) the
    variance is the larger of the random-effects one and the Hartung-Knapp one (the weighted
    spread of the strata around the pooled mean), on ``k - 1`` degrees of freedom (the
    "modified Knapp-Hartung" interval: DL alone under-covers with few pairs); without it,
    the inverse-variance (fixed-effect) variance on the strata's Satterthwaite-combined
    degrees of freedom. So the interval widens with heterogeneity rather than looking more
    certain for it. With two pairs the heterogeneity is hardly identifiable (docs/abtest.md:
    pools of >= 4 pairs are honest for it). With one stratum this is that stratum. None
    when no stratum has a finite estimate."""
    m = np.asarray(means, dtype=float)
    s = np.asarray(ses, dtype=float)
    f = np.asarray(dfs, dtype=float)
    ok = np.isfinite(m) & np.isfinite(s) & (s > 0) & (f > 0)
    m, s, f = m[ok], s[ok], f[ok]
    k = int(m.size)
    if k == 0:
        return None
    v = s * s
    if k == 1:
        return PooledEstimate(float(m[0]), float(s[0]), float(f[0]), 0.0, 0.0, 1)
    w = 1.0 / v
    mu_fe = float(np.sum(w * m) / np.sum(w))
    q = float(np.sum(w * (m - mu_fe) ** 2))
    c = float(np.sum(w) - np.sum(w * w) / np.sum(w))
    tau2 = max(0.0, (q - (k - 1)) / c) if c > 0 else 0.0
    if tau2 <= 0.0:
        var = 1.0 / float(np.sum(w))
        part = w * w * v * var * var  # each stratum's share of var
        denom = float(np.sum(part * part / f))
        df = var * var / denom if denom > 0 else math.inf
        return PooledEstimate(mu_fe, math.sqrt(var), float(df), 0.0, q, k)
    ws = 1.0 / (v + tau2)
    sw = float(np.sum(ws))
    mu = float(np.sum(ws * m) / sw)
    var_hk = float(np.sum(ws * (m - mu) ** 2)) / ((k - 1) * sw)
    var = max(1.0 / sw, var_hk)
    return PooledEstimate(mu, math.sqrt(var), float(k - 1), math.sqrt(tau2), q, k)


def tau_lower(
    means: FloatArray | list[float], ses: FloatArray | list[float], level: float = 0.99
) -> float:
    """A one-sided ``level`` lower confidence bound on the between-strata sd of the effect:
    the DerSimonian-Laird moment estimate with Cochran's Q replaced by what Q exceeds its
    chi-square quantile (``k - 1`` df) by; 0 unless Q shows heterogeneity at ``1 - level``."""
    m = np.asarray(means, dtype=float)
    s = np.asarray(ses, dtype=float)
    ok = np.isfinite(m) & np.isfinite(s) & (s > 0)
    m, s = m[ok], s[ok]
    k = int(m.size)
    if k < 2:
        return 0.0
    w = 1.0 / (s * s)
    mu = float(np.sum(w * m) / np.sum(w))
    q = float(np.sum(w * (m - mu) ** 2))
    c = float(np.sum(w) - np.sum(w * w) / np.sum(w))
    crit = float(_special().chdtri(k - 1, 1.0 - level))
    return math.sqrt(max(0.0, (q - crit) / c)) if c > 0 else 0.0
