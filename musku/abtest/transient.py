"""The warm-up transient fitted jointly over all applies of a comparison (issue 30 item 2).

After every apply (a swap) both hosts go through their new configuration's transient. The
tester used to search each apply's own series for the transient's end and discard up to it:
under a slow wander of the host bias the search took the drift for a transient that never
ends (the warm-up cap), and a long transient (tau 300 s) forced hour-long periods of which
half was discarded. Here, instead, the transient is a **regressor**, fitted over every
apply so far with shared parameters, subtracted from the batch means, and its parameter
uncertainty added to the effect's variance (delta method).

The model of the batch means (each the mean of ``count`` windows whose ages since their
period's apply run from ``age0`` to ``age1`` seconds)::

    y_j = c_period(j) + sum_k sum_cfg  s_cfg * changed[period(j), cfg] * a_cfg,k * E_k(j)

with ``E_k(j)`` the batch's mean of ``exp(-age / tau_k)``, ``s_cfg`` +1 for the candidate
(role B, the log-ratio's numerator) and -1 for the baseline, ``changed`` whether the host
running that configuration changed at that period's apply (a host already there does not
warm up), and ``c_period`` a free level per period (the effect, the host bias and the
between-period wander all live there: the transient is identified by its shape inside the
periods, so a between-period change of the bias cannot pass for it). When the candidate's
and the baseline's hosts change at the same applies (every swap after the first) only the
difference of their transients is identified, and one column per time constant carries it.

- **Number of exponentials** (0, 1 or 2) by an information criterion (BIC on the
  effective sample size: the residuals' integrated autocorrelation time divides ``n``,
  so a slowly wandering series does not buy components with its correlated noise).
- **Time constants bounded by what the applies identify**: ``tau <= TAU_SHARE x`` the
  longest age seen after an apply (a curve must visibly decay inside the data). A series
  that does not settle is therefore not a transient: the fit ends at the bound or finds
  none, and what is left is drift, handled by the between-period component of the rule.
  The driver makes periods at least :data:`PERIOD_PER_TAU` x the longest fitted tau, so a
  long transient is seen to its end in later periods.
- **Quiet** (:meth:`TransientFit.quiet`): nothing fitted, nothing open, the best single
  exponential's likelihood ratio below the chi-square 0.95 level and no single exponential
  (time constants up to what other evidence allows: the driver's searched transient) able
  to move the estimate by more than :data:`QUIET` x min_effect at :data:`QUIET_Z` standard
  errors. The driver then holds no decision for the fit: it costs nothing over discarding
  where there is no transient (docs/abtest.md, issue 30 item 2, round 2).
- **Uncertainty**: the Gauss-Newton covariance of the amplitudes and time constants (the
  residual variance inflated by its integrated autocorrelation time) carried to the
  crossover estimate (the mean of the two role orders' batch means) by the delta method.
  The fit uses only within-period variation, the estimate only the period levels, so the
  two errors add (they are uncorrelated for white batch noise).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from itertools import combinations

import numpy as np
from numpy.typing import NDArray

from musku.abtest import stats

FloatArray = NDArray[np.float64]

MODES = ("fit", "discard")  # rule option ``transient``
DEFAULT_MODE = "discard"  # "fit": not yet >= discard on every row (docs/abtest.md)
TAU_SHARE = 0.5  # a time constant at most this share of the longest age seen after an apply
PERIOD_PER_TAU = 3.0  # the driver's periods last at least this many fitted time constants
TAU_GRID = 20  # time constants on the geometric grid
TAU_RATIO = 2.0  # two exponentials' time constants at least this far apart
USE_BELOW = 1.0  # the estimate uses batches where the fitted transient is below this x min_effect
ROUGH = 0.25  # no decision while the fit's sd on the estimate exceeds this x min_effect
TREND_T = 2.0  # a residual slope on the age this many standard errors away: transient open
MIN_BATCHES = 8  # batches in applied periods before anything is fitted
CHI2_999 = (10.83, 13.82, 16.27, 18.47)  # chi-square 0.999 quantiles, 1-4 degrees of freedom
QUIET = 0.25  # quiet: no one exponential could move the estimate by more than this x min_effect
QUIET_Z = 2.0  # ... at this many standard errors (|its fitted shift| + QUIET_Z x its sd)
CHI2_95 = (3.84, 5.99, 7.81, 9.49)  # chi-square 0.95 quantiles, 1-4 degrees of freedom: the
# likelihood ratio of the best single exponential below it is "no transient at all" (quiet)
PENALTY = 2.0  # information criterion per parameter (AIC; BIC's log n under-fitted the second
# exponential and left its bias in the estimate)


@dataclass(frozen=True)
class TransientFit:
    """A transient fitted over all applies; ``k == 0``: none the data need."""

    k: int  # exponentials (0, 1, 2)
    taus: tuple[float, ...]  # seconds
    amplitudes: tuple[tuple[float, ...], ...]  # per exponential: per column (log scale)
    correction: FloatArray  # the fitted transient per batch (subtract from the batch means)
    shift: float  # its crossover average: what the uncorrected estimate was off by
    var: float  # delta-method variance of the effect from the fit's parameters
    tau_max: float  # the bound the applies allowed
    at_bound: bool  # a time constant at the bound: the transient may be longer
    bic: tuple[float, ...] = field(default=())  # likelihood ratio of each k against k - 1
    cov: FloatArray = field(default_factory=lambda: np.zeros((0, 0)))  # amplitudes, then taus
    pattern: tuple[int, ...] = ()  # columns: -1 both hosts' ratio, 0 candidate's, 1 baseline's
    trend_t: float = 0.0  # t of a slope on the age since the apply left after the fit
    excluded: int = 0  # windows of the batches the estimate leaves out (the large part)
    # k == 0: per time constant on the grid, the largest shift of the estimate one
    # exponential could make and still fit the data (|its fitted shift| + QUIET_Z sd)
    bounds: tuple[tuple[float, float], ...] = ()

    @property
    def open(self) -> bool:
        """The transient may be longer than the applies so far show: a time constant at the
        bound, or a slope on the age since the apply that the fit leaves (shared by all
        applies; a wander's slopes differ from period to period and average out)."""
        return self.at_bound or abs(self.trend_t) > TREND_T

    def use_from(self, eps: float) -> float:
        """Age (s) after an apply from which the fitted transient stays below ``eps`` in
        every column (0 without one)."""
        if self.k == 0:
            return 0.0
        out = 0.0
        for tau, amps in zip(self.taus, self.amplitudes, strict=True):
            big = max(abs(a) for a in amps) * self.k  # a share of eps per exponential
            if big > eps:
                out = max(out, tau * math.log(big / eps))
        return out

    def bound(self, tau_upto: float = math.inf) -> float:
        """The largest shift of the estimate one exponential with a time constant up to
        ``tau_upto`` could make and still fit the data (inf: not computed)."""
        if not self.bounds:
            return math.inf
        return max((b for t, b in self.bounds if t <= tau_upto), default=0.0)

    def quiet(self, min_effect_log: float, tau_upto: float = math.inf) -> bool:
        """No transient, and none that matters could hide: nothing fitted, no slope left on
        the age since the apply, the best single exponential's likelihood ratio (its time
        constant searched over the grid) below the chi-square 0.95 level for its
        parameters, and no single exponential with a time constant up to ``tau_upto`` able
        to move the estimate by more than :data:`QUIET` x ``min_effect_log`` (at
        :data:`QUIET_Z` standard errors: a transient as large as the batches' noise but
        seen over a few batches has a likelihood ratio of nothing and a large bound). The
        driver then holds no decision for the fit (no second swap, no precision gate)."""
        if self.k != 0 or self.open or len(self.bic) < 2 or not self.pattern:
            return False
        dp = len(self.pattern) + 1
        if self.bic[1] >= CHI2_95[min(dp, len(CHI2_95)) - 1]:
            return False
        return self.bound(tau_upto) <= QUIET * min_effect_log

    @property
    def longest_age(self) -> float:
        """The longest age after an apply seen when fitted (s)."""
        return self.tau_max / TAU_SHARE

    def describe(self) -> str:
        """One clause for the comparison's method/reason."""
        if self.k == 0:
            still = (
                f", but a slope on the age since the apply ({self.trend_t:+.1f} se): still open"
                if self.open
                else ""
            )
            return f"transient fitted over all applies: none (tau <= {self.tau_max:.0f} s){still}"
        parts = []
        for tau, amps in zip(self.taus, self.amplitudes, strict=True):
            a = " / ".join(f"{x * 100:+.2f} %" for x in amps)
            parts.append(f"{a} tau {tau:.0f} s")
        return (
            f"transient fitted over all applies ({self.k} exponential"
            f"{'s' if self.k > 1 else ''}: {', '.join(parts)}"
            f"{' at the bound: still open' if self.at_bound else ''}"
            f"), {self.excluded:,} windows where it exceeds {USE_BELOW:g} x min_effect left "
            f"out, the rest corrected "
            f"by {-self.shift * 100:+.3f} % on the estimate, "
            f"sd {math.sqrt(max(self.var, 0.0)) * 100:.3f} % added"
        )


def batch_exp(age0: FloatArray, age1: FloatArray, count: FloatArray, tau: float) -> FloatArray:
    """Mean of ``exp(-age / tau)`` over each batch's ``count`` windows, ages evenly spaced
    from ``age0`` to ``age1``."""
    n = np.maximum(count, 1.0)
    step = np.where(n > 1, (age1 - age0) / np.maximum(n - 1.0, 1.0), 0.0)
    r = np.exp(-step / tau)
    with np.errstate(invalid="ignore", divide="ignore"):
        geo = np.where(np.abs(1.0 - r) > 1e-12, (1.0 - r**n) / (n * (1.0 - r)), 1.0)
    return np.asarray(np.exp(-age0 / tau) * geo, dtype=float)


def _demean(x: FloatArray, inv: NDArray[np.intp], counts: FloatArray) -> FloatArray:
    """``x`` (rows: batches) minus each period's mean."""
    if x.ndim == 1:
        return np.asarray(x - (np.bincount(inv, weights=x) / counts)[inv], dtype=float)
    means = np.stack([np.bincount(inv, weights=col) / counts for col in x.T], axis=1)
    return np.asarray(x - means[inv], dtype=float)


def fit(
    y: FloatArray,
    sign: NDArray[np.int8] | FloatArray,
    period: NDArray[np.int64] | FloatArray,
    age0: FloatArray,
    age1: FloatArray,
    count: FloatArray,
    changed: NDArray[np.bool_],
    *,
    tau_min: float,
    max_k: int = 2,
    wander: tuple[float, float] | None = None,
) -> TransientFit | None:
    """Fit the transient model (module docstring) to batch means ``y``.

    ``changed[p]`` = (candidate's host changed, baseline's host changed) at the apply
    before period ``p``'s windows (for a period that applied nothing: the last apply's).
    ``None`` when there is too little to fit (fewer than :data:`MIN_BATCHES` batches after
    a change, or a bound below ``2 tau_min``). ``wander``: the pair's host-bias wander
    (sd, tau s) when known; its slopes inside the periods widen the trend test's error."""
    y = np.asarray(y, dtype=float)
    per = np.asarray(period).astype(np.int64)
    s_arr = np.asarray(sign, dtype=float)
    n = y.size
    ch = np.asarray(changed, dtype=bool).reshape(-1, 2)
    if n == 0 or ch.shape[0] <= int(per.max()):
        return None
    rows = ch[per]  # per batch: (candidate changed, baseline changed)
    live: NDArray[np.bool_] = np.asarray(rows.any(axis=1), dtype=bool)
    if int(live.sum()) < MIN_BATCHES:
        return None
    tau_max = TAU_SHARE * float(np.max(age1[live]))
    # nor shorter than a quarter of the youngest age seen: exp(-age / tau) would be ~0 on
    # every batch and its amplitude unbounded
    tau_min = max(tau_min, 0.25 * float(np.min(age0[live])))
    empty = TransientFit(0, (), (), np.zeros(n), 0.0, 0.0, tau_max, False)
    if tau_max < 2.0 * tau_min:
        return evaluate(empty, s_arr, per, age0, age1, count, ch)
    # columns per time constant: one (the ratio's transient) when both configurations'
    # hosts change at the same applies, else one per configuration that changes
    if np.array_equal(rows[:, 0], rows[:, 1]):
        pattern: tuple[int, ...] = (-1,)
    else:
        pattern = tuple(c for c in (0, 1) if rows[:, c].any())
    mask = _mask(rows, pattern)
    m = len(pattern)
    grid = np.geomspace(tau_min, tau_max, TAU_GRID)
    ids, inv = np.unique(per, return_inverse=True)
    counts = np.bincount(inv).astype(float)
    yt = _demean(y, inv, counts)
    e = np.stack([batch_exp(age0, age1, count, t) for t in grid], axis=1)  # n x G
    # all regressors: column c of tau g at index g * m + c
    z = (e[:, :, None] * mask[:, None, :]).reshape(n, -1)
    zt = _demean(z, inv, counts)
    gram = zt.T @ zt
    zy = zt.T @ yt
    sse0 = float(yt @ yt)
    dof0 = n - ids.size
    if dof0 < 4 or sse0 <= 0.0:
        return empty
    fits: list[tuple[float, tuple[int, ...], FloatArray, FloatArray]] = [
        (sse0, (), np.zeros(0), yt)
    ]
    for k in range(1, max_k + 1):
        if dof0 - k * (m + 1) < 4:
            break
        sets = [
            gs
            for gs in combinations(range(grid.size), k)
            if all(grid[b] / grid[a] >= TAU_RATIO for a, b in zip(gs, gs[1:], strict=False))
        ]
        if not sets:
            break
        idx = np.array([[g * m + c for g in gs for c in range(m)] for gs in sets])
        a_all = gram[idx[:, :, None], idx[:, None, :]]
        q = idx.shape[1]
        ridge = 1e-10 * np.trace(a_all, axis1=1, axis2=2)[:, None, None] * np.eye(q)
        rhs = zy[idx]
        coef_all = np.linalg.solve(a_all + ridge + 1e-300, rhs[:, :, None])[:, :, 0]
        sse_all = sse0 - np.einsum("pq,pq->p", coef_all, rhs)
        i = int(np.argmin(sse_all))
        fits.append((float(sse_all[i]), sets[i], coef_all[i], yt - zt[:, idx[i]] @ coef_all[i]))
    # effective sample size from the richest model's residuals (their autocorrelation: a
    # wander within periods), so correlated noise does not buy components
    iact, _ = stats.integrated_autocorrelation(fits[-1][3])
    n_eff = max(4.0, n / max(1.0, iact))

    # how many exponentials: the first only when its likelihood ratio passes a strict
    # chi-square level (the time constant searched over a grid makes a lenient one find
    # transients in noise), the second when it pays for its parameters (AIC: a second
    # exponential the data show but a penalty of log n refused left its bias in the
    # estimate)
    scores = [0.0]
    j = 0
    for k in range(1, len(fits)):
        lr = n_eff * math.log(max(fits[k - 1][0], 1e-300) / max(fits[k][0], 1e-300))
        scores.append(lr)
        dp = m + 1
        need = CHI2_999[min(dp, len(CHI2_999)) - 1] if k == 1 else PENALTY * dp
        if k == j + 1 and lr > need:
            j = k
    best = [(0.0, f[1], f[2]) for f in fits]
    scores_t = tuple(scores)
    if j == 0:
        trend = _trend_t(yt, age0, age1, live, inv, counts, wander)
        bounds = _quiet_bounds(z, zt, yt, s_arr, grid, m, dof0)
        return replace(empty, bic=scores_t, trend_t=trend, pattern=pattern, bounds=bounds)
    _, gs, coef = best[j]
    taus, coef = _refine(
        tuple(float(grid[g]) for g in gs), coef, yt, mask, age0, age1, count, inv, counts,
        tau_min, tau_max,
    )  # fmt: skip
    amps = coef.reshape(len(taus), m)
    jr = _jacobian(taus, amps, mask, age0, age1, count)
    correction = _curve(taus, amps, mask, age0, age1, count)
    jt = _demean(jr, inv, counts)
    resid = yt - _demean(correction, inv, counts)
    dof = max(1, n - ids.size - jr.shape[1])
    iact_r, _ = stats.integrated_autocorrelation(resid)
    s2 = float(resid @ resid) / dof * max(1.0, iact_r)
    cov = s2 * np.linalg.pinv(jt.T @ jt)
    trend = _trend_t(resid, age0, age1, live, inv, counts, wander)
    got = TransientFit(
        len(taus),
        taus,
        tuple(tuple(float(x) for x in row) for row in amps),
        np.zeros(0),
        0.0,
        0.0,
        tau_max,
        max(taus) >= tau_max * (1 - 1e-6),
        scores_t,
        cov,
        pattern,
        trend,
    )
    return evaluate(got, s_arr, per, age0, age1, count, ch)


def _crossover_weights(sign: FloatArray) -> FloatArray:
    """Weights of the crossover estimate (the mean of the two role orders' batch means)."""
    n = sign.size
    plus = sign > 0
    if plus.any() and not plus.all():
        return np.where(plus, 0.5 / int(plus.sum()), 0.5 / int((~plus).sum()))
    return np.full(n, 1.0 / max(n, 1))


def _quiet_bounds(
    z: FloatArray,
    zt: FloatArray,
    yt: FloatArray,
    sign: FloatArray,
    grid: FloatArray,
    m: int,
    dof0: int,
) -> tuple[tuple[float, float], ...]:
    """Per time constant on the grid, the largest shift of the crossover estimate one
    exponential could make and still fit the batches: its ``m`` columns fitted by least
    squares on the within-period variation, ``|fitted shift| + QUIET_Z x its sd`` (the
    residual variance inflated by its integrated autocorrelation time)."""
    w = _crossover_weights(sign)
    iact, _ = stats.integrated_autocorrelation(yt)
    s2 = float(yt @ yt) / max(1, dof0) * max(1.0, iact)
    out: list[tuple[float, float]] = []
    for k in range(grid.size):
        cols = slice(k * m, (k + 1) * m)
        x = zt[:, cols]
        inv = np.linalg.pinv(x.T @ x)
        a = inv @ (x.T @ yt)
        u = w @ z[:, cols]
        var = s2 * float(u @ inv @ u)
        out.append((float(grid[k]), abs(float(u @ a)) + QUIET_Z * math.sqrt(max(var, 0.0))))
    return tuple(out)


def _trend_t(
    resid: FloatArray,
    age0: FloatArray,
    age1: FloatArray,
    live: NDArray[np.bool_],
    inv: NDArray[np.intp],
    counts: FloatArray,
    wander: tuple[float, float] | None = None,
) -> float:
    """t statistic of one slope on the age since the apply, shared by all periods, in the
    within-period residuals (variance inflated by their integrated autocorrelation time).

    A slow wander of the host bias puts a slope of its own into every period, one that
    differs from period to period (a transient's is the same in each): its variance, from
    the pair's wander (an OU process: covariance ``sd^2 exp(-|dt| / tau)`` between batch
    midpoints of one period) is added, and with three or more periods the slope's error is
    at least the scatter of the periods' own slopes (issue 30 item 2: a wander's slope in
    one or two periods opened the fit, the periods doubled, the fit took the wander inside
    them for a transient at the bound and held the decision to the sample cap)."""
    mid = 0.5 * (age0 + age1)
    x = _demean(np.where(live, mid, 0.0), inv, counts) * live
    sxx = float(x @ x)
    n = resid.size
    if sxx <= 0.0 or n < 8:
        return 0.0
    beta = float(x @ resid) / sxx
    r = resid - beta * x
    iact, _ = stats.integrated_autocorrelation(r)
    s2 = float(r @ r) / max(1, n - int(counts.size) - 1) * max(1.0, iact)
    var = s2 / sxx
    slopes: list[float] = []
    extra = 0.0
    for p in range(int(counts.size)):
        sel = (inv == p) & live
        if int(sel.sum()) < 3:
            continue
        xp = x[sel]
        sp = float(xp @ xp)
        if sp <= 0.0:
            continue
        slopes.append(float(xp @ resid[sel]) / sp)
        if wander is not None and wander[0] > 0.0 and wander[1] > 0.0:
            t = mid[sel]
            cov = wander[0] ** 2 * np.exp(-np.abs(t[:, None] - t[None, :]) / wander[1])
            extra += float(xp @ cov @ xp)
    var += extra / (sxx * sxx)
    if len(slopes) >= 3:
        var = max(var, float(np.var(slopes, ddof=1)) / len(slopes))
    return beta / math.sqrt(var) if var > 0 else 0.0


def _refine(
    taus: tuple[float, ...],
    coef: FloatArray,
    yt: FloatArray,
    mask: FloatArray,
    age0: FloatArray,
    age1: FloatArray,
    count: FloatArray,
    inv: NDArray[np.intp],
    counts: FloatArray,
    lo: float,
    hi: float,
) -> tuple[tuple[float, ...], FloatArray]:
    """The grid's time constants refined (coordinate search on log tau, within the
    bounds), the amplitudes refitted by least squares for each."""

    def solve(ts: tuple[float, ...]) -> tuple[float, FloatArray]:
        cols = [batch_exp(age0, age1, count, t)[:, None] * mask for t in ts]
        x = _demean(np.concatenate(cols, axis=1), inv, counts)
        c, *_ = np.linalg.lstsq(x, yt, rcond=None)
        r = yt - x @ c
        return float(r @ r), np.asarray(c, dtype=float)

    best_sse, best_c = solve(taus)
    cur = list(taus)
    step = math.log(hi / lo) / (TAU_GRID - 1) / 2.0
    for _ in range(8):
        for i in range(len(cur)):
            for sgn in (1.0, -1.0):
                t = min(hi, max(lo, cur[i] * math.exp(sgn * step)))
                trial = cur[:i] + [t] + cur[i + 1 :]
                if any(
                    b / a < TAU_RATIO
                    for a, b in zip(sorted(trial), sorted(trial)[1:], strict=False)
                ):
                    continue
                sse, c = solve(tuple(trial))
                if sse < best_sse:
                    best_sse, best_c, cur = sse, c, trial
                    break
        step /= 2.0
    order = np.argsort(cur)
    m = mask.shape[1]
    c2 = best_c.reshape(len(cur), m)[order].reshape(-1)
    return tuple(float(cur[i]) for i in order), c2


def _mask(rows: NDArray[np.bool_], pattern: tuple[int, ...]) -> FloatArray:
    """Per batch and column: +-1 where that column's host changed at the batch's apply."""
    cols = [
        (rows[:, 0] & rows[:, 1]).astype(float)
        if c < 0
        else (1.0 if c == 0 else -1.0) * rows[:, c].astype(float)
        for c in pattern
    ]
    return np.stack(cols, axis=1) if cols else np.zeros((rows.shape[0], 0))


def _curve(
    taus: tuple[float, ...],
    amps: FloatArray,
    mask: FloatArray,
    age0: FloatArray,
    age1: FloatArray,
    count: FloatArray,
) -> FloatArray:
    raw = np.stack([batch_exp(age0, age1, count, t) for t in taus], axis=1)  # n x k
    return np.asarray(np.einsum("nk,km,nm->n", raw, amps, mask), dtype=float)


def _jacobian(
    taus: tuple[float, ...],
    amps: FloatArray,
    mask: FloatArray,
    age0: FloatArray,
    age1: FloatArray,
    count: FloatArray,
) -> FloatArray:
    """d(curve)/d(amplitudes, then time constants) per batch."""
    out: list[FloatArray] = []
    for t in taus:
        e = batch_exp(age0, age1, count, t)
        out += [e * mask[:, c] for c in range(mask.shape[1])]
    for i, t in enumerate(taus):
        h = 1e-4 * t
        de = (batch_exp(age0, age1, count, t + h) - batch_exp(age0, age1, count, t - h)) / (2 * h)
        out.append(de * (mask @ amps[i]))
    return np.stack(out, axis=1)


def evaluate(
    got: TransientFit,
    sign: NDArray[np.int8] | FloatArray,
    period: NDArray[np.int64] | FloatArray,
    age0: FloatArray,
    age1: FloatArray,
    count: FloatArray,
    changed: NDArray[np.bool_],
) -> TransientFit:
    """``got`` with its correction, shift and variance for these batches (a fit made at an
    earlier look, applied to the batches since: refitting at every look is not needed)."""
    s = np.asarray(sign, dtype=float)
    n = s.size
    if got.k == 0 or n == 0:
        return replace(got, correction=np.zeros(n), shift=0.0, var=0.0)
    per = np.asarray(period).astype(np.int64)
    rows = np.asarray(changed, dtype=bool).reshape(-1, 2)[per]
    mask = _mask(rows, got.pattern)
    amps = np.asarray(got.amplitudes, dtype=float)
    correction = _curve(got.taus, amps, mask, age0, age1, count)
    jr = _jacobian(got.taus, amps, mask, age0, age1, count)
    # the crossover estimate: the mean of the two role orders' batch means
    w = _crossover_weights(s)
    grad = -(w @ jr)
    var = float(grad @ got.cov @ grad) if got.cov.shape == (grad.size, grad.size) else 0.0
    return replace(got, correction=correction, shift=float(w @ correction), var=max(0.0, var))
