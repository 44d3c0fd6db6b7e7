"""A pooled comparison against a concurrent pre-period (``design="pre"`` of
:func:`musku.abtest.pooled.run_pooled_comparison`; issue 30's pooled goal, design (b)).

Before the comparison both hosts of every pair run the baseline (the fleet's production
state: the agent's spool already holds those windows), so each pair's host bias is the
pre-period's mean log-ratio, measured without a warm-up. Then the candidate goes on one
host of each pair, the host chosen at random with the roles balanced over the pairs (half
the pairs on their first host, half on their second), and, after the blind minimum
warm-up, each pair's estimate is

    y_i = s_i * dir * (mean post log-ratio - mean pre log-ratio)        (s_i = +-1: the role)

(both CUPED-adjusted on the offered load's log-ratio with one coefficient per pair): the
host bias cancels up to how much it drifts between the two means, and as the roles are
randomised the drift enters with a random sign: mean zero, a between-pair variance the
random-effects combination (:func:`musku.abtest.stats.pool_strata`, DerSimonian-Laird and
Hartung-Knapp where heterogeneity shows) measures together with the effect's own
heterogeneity. One apply per pair, no swap, no second warm-up.

- **The candidate's transient, found jointly** (design (a) in its discard form). Every pair
  applied the same change at the same host time, so the mean over the pairs of ``y_i(t)``
  by age since the apply holds the common transient with ``1/sqrt(k)`` of one pair's noise.
  At every look the exponential fit and MSER (:func:`musku.abtest.stats.fit_transient`,
  :func:`~musku.abtest.stats.detect_warmup`, the driver's level ``TRANSIENT_EPS``) run on
  that mean series; every pair's windows count from the end found, and no decision comes
  while the fit is at its longest time constant, the end has less than
  ``max(PRE_MIN_POST, end / 2)`` windows after it, or fewer than ``PRE_MIN_SPAN`` windows
  were measured since the blind minimum (a transient the search misses is diluted). A
  fitted transient counts from one standard error (the driver's: two), as the transient
  is on one host only; an A/A whose candidate is the baseline applies nothing and has no
  transient to search.
- **Always valid.** The pooled estimate's interval is the crossover's confidence sequence
  (:func:`~musku.abtest.stats.cs_halfwidth`) at the intrinsic time ``sum 1 / (1/L_i + 1/P_i)``
  (post and pre windows), with ``alpha_pre = PRE_ALPHA_SHARE x alpha`` of the comparison's
  alpha; each pair's standard error from batch means (``PRE_BATCH`` windows) of its pre and
  post series, Satterthwaite degrees of freedom.
- **The crossover only where needed.** With no decision after ``PRE_HORIZON_S`` of post
  host time, or as soon as the pairs' estimates differ so much that this stage cannot
  decide however long it measures (the crossover pool's heterogeneity test; here the
  spread may also be the hosts' drift since the pre-period), the pairs go on as the
  ordinary pooled crossover (new data, the rest of alpha): the heterogeneous pools and
  the hard cases get the design that tells the effect's heterogeneity from drift. Also
  as soon as the interval projected to the horizon (the between-pair sd at its 90 % lower
  bound) could neither fit inside ±min_effect nor exclude 0: handing over is never a
  decision (the alpha split is fixed), so a point estimate may choose when.
- **Clock.** The result's ``host_time_s`` is counted from the apply: the pre-period is
  production history the spool already holds (free only when the pair served the baseline
  for ``pre_s`` before; inside a sweep's sequence of comparisons it is not free). The
  reason says how long it was.

Not yet: guardrails (a spec with guardrails is refused: exit 4), pairs joining, stored
windows (``on_window``) and reading the pre-period from the agents' spool (it is measured
here, before the apply)."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace

import numpy as np
from numpy.typing import NDArray

from musku.abtest import stats
from musku.abtest.rules import pct, to_relative
from musku.domain import (
    ComparisonResult,
    ComparisonSpec,
    Configuration,
    Decision,
    Direction,
    Sample,
)
from musku.errors import HostError, UnsupportedError
from musku.hosts.base import HostPair

PRE_S = 1800.0  # default pre-period (host seconds of baseline on both hosts)
PRE_BATCH = 20  # windows per batch mean (the model's AR(1) 0.6: neighbours' correlation ~0)
PRE_MIN_POST = 120  # steady post windows (after the transient found) before a decision
# post windows since the blind minimum before a decision, found transient or not: a
# transient the joint search misses (one host's 5 %, tau 45 s after the blind minimum)
# biases 120 windows by ~0.45 %, 240 by ~0.24 % (two A/As of a real 0 % change decided
# WORSE at 180 and 220 s with 120; both no_difference with 240)
PRE_MIN_SPAN = 240
PRE_HORIZON_S = 900.0  # post host time before handing over to the crossover
PRE_ALPHA_SHARE = 0.5  # the pre stage's share of alpha (the crossover after it: the rest)
PRE_MIN_STRATA = 3  # strata a decision needs (every pair of a smaller pool)
TRANSIENT_EPS = 0.1  # as the driver's: the transient ends below this x min_effect
# a fitted transient counts beyond this many standard errors: lower than the driver's 2.0,
# as the candidate's transient is on one host only here (a crossover's swap changes both)
# and one undetected after the blind minimum biases the first looks by 0.2-0.5 %
TRANSIENT_T = 1.0

FloatArray = NDArray[np.float64]


@dataclass
class _PrePair:
    index: int
    pair: HostPair
    sign: float  # +1: the candidate on hosts[1]; -1: on hosts[0]
    d_pre: FloatArray = field(default_factory=lambda: np.zeros(0))
    c_pre: FloatArray | None = None
    d_post: list[float] = field(default_factory=list)
    c_post: list[float] = field(default_factory=list)
    t_apply: float = 0.0
    failed: str = ""


@dataclass(frozen=True)
class PreLook:
    """One look of the pre-period design (relative effects, like a verdict)."""

    decision: Decision | None
    estimate: float
    ci_low: float
    ci_high: float
    strata: int
    discard: int  # post windows the joint transient search dropped
    open: bool  # the transient search holds the decision
    pooled: stats.PooledEstimate | None = None
    # why this stage cannot decide however long it measures (the pairs' estimates differ
    # beyond their errors: the effect or the hosts' drift since the pre-period); "" if not
    futile: str = ""


def balanced_signs(k: int, seed: int) -> list[float]:
    """The candidate's host per pair: +1 (hosts[1]) on half the pairs, -1 on the others,
    at random (an odd pool's extra one at random too)."""
    rng = np.random.default_rng([int(seed), 0x9E5])
    signs = np.array([1.0 if i < k // 2 else -1.0 for i in range(k)])
    if k % 2:
        signs[-1] = float(rng.choice([-1.0, 1.0]))
    return [float(x) for x in rng.permutation(signs)]


def _columns(
    got: Sequence[tuple[Sample, Sample]], metric: str
) -> tuple[FloatArray, FloatArray | None]:
    """The windows' log-ratio hosts[1] / hosts[0] of ``metric`` and of the offered load
    (None when a host does not report it); invalid windows dropped."""
    ok = [(a, b) for a, b in got if a.valid and b.valid]
    d = np.array([math.log(b.metrics[metric]) - math.log(a.metrics[metric]) for a, b in ok])
    if all("offered_qps" in a.metrics and "offered_qps" in b.metrics for a, b in ok):
        c = np.array(
            [math.log(b.metrics["offered_qps"]) - math.log(a.metrics["offered_qps"]) for a, b in ok]
        )
        return d, c
    return d, None


def _batch_var(x: FloatArray, b: int) -> tuple[float, float]:
    """(variance of the mean of ``x`` from its batch means of ``b``, its degrees of
    freedom); (inf, 0) with fewer than two batches."""
    nb = x.size // b
    if nb < 2:
        return math.inf, 0.0
    # the newest windows in whole batches (the oldest leftover dropped from the variance only)
    m = x[x.size - nb * b :].reshape(nb, b).mean(axis=1)
    return float(m.var(ddof=1)) / nb, float(nb - 1)


class _PreDesign:
    def __init__(
        self,
        pairs: Sequence[HostPair],
        baseline: Configuration,
        candidate: Configuration,
        spec: ComparisonSpec,
        seed: int,
        pre_s: float,
        horizon_s: float,
        should_stop: Callable[[], bool] | None,
    ) -> None:
        if spec.guardrails:
            raise UnsupportedError(
                "the pre-period pooled design does not check guardrails yet: use "
                "design='crossover' for a spec with guardrails"
            )
        self.spec = spec
        self.baseline, self.candidate = baseline, candidate
        self.interval = float(spec.stats.sample_interval_s)
        self.dir = 1.0 if spec.direction is Direction.HIGHER else -1.0
        self.alpha = (1.0 - spec.stats.confidence) * PRE_ALPHA_SHARE
        self.pre_n = max(2 * PRE_BATCH, int(round(pre_s / self.interval)))
        self.blind_n = int(math.ceil(spec.stats.warmup_s / self.interval - 1e-9))
        self.horizon_n = max(PRE_MIN_POST, int(round(horizon_s / self.interval)))
        self.cap = int(spec.stats.sample_cap)
        self.should_stop = should_stop
        signs = balanced_signs(len(pairs), seed)
        self.pairs = [_PrePair(i, p, signs[i]) for i, p in enumerate(pairs)]
        self.look = PreLook(None, math.nan, -math.inf, math.inf, 0, 0, True)

    # ------------------------------------------------------------ measuring

    def _live(self) -> list[_PrePair]:
        return [p for p in self.pairs if not p.failed]

    def _each(self, ex: ThreadPoolExecutor, fn: Callable[[_PrePair], None]) -> None:
        futures = [ex.submit(self._guard, fn, p) for p in self._live()]
        for f in futures:
            f.result()
        if not self._live():
            raise HostError(f"every pair of the pooled comparison failed: {self.pairs[0].failed}")

    @staticmethod
    def _guard(fn: Callable[[_PrePair], None], p: _PrePair) -> None:
        try:
            fn(p)
        except HostError as exc:
            p.failed = str(exc)

    def _pre(self, p: _PrePair) -> None:
        d, c = _columns(p.pair.windows(self.interval, self.pre_n), self.spec.metric)
        p.d_pre, p.c_pre = d, c

    def _apply(self, p: _PrePair) -> None:
        configs = (self.baseline, self.candidate) if p.sign > 0 else (self.candidate, self.baseline)
        p.pair.apply(configs)
        p.t_apply = float(p.pair.now())
        if self.blind_n:
            p.pair.windows(self.interval, self.blind_n)

    def _batch(self, p: _PrePair) -> None:
        d, c = _columns(p.pair.windows(self.interval, PRE_BATCH), self.spec.metric)
        p.d_post.extend(d.tolist())
        if c is not None and p.c_pre is not None:
            p.c_post.extend(c.tolist())

    # ------------------------------------------------------------ judging

    def _series(self, p: _PrePair) -> tuple[FloatArray, FloatArray]:
        """The pair's CUPED-adjusted pre and post log-ratio series, signed so that positive
        is the candidate better (one coefficient over both, each centred on its own mean)."""
        d0, d1 = p.d_pre, np.asarray(p.d_post, dtype=float)
        if p.c_pre is not None and len(p.c_post) == d1.size and d1.size > 1:
            c0, c1 = p.c_pre, np.asarray(p.c_post, dtype=float)
            cc = np.r_[c0 - c0.mean(), c1 - c1.mean()]
            dd = np.r_[d0 - d0.mean(), d1 - d1.mean()]
            s = float(cc @ cc)
            theta = float(dd @ cc) / s if s > 0 else 0.0
            d0, d1 = d0 - theta * c0, d1 - theta * c1
        k = p.sign * self.dir
        return k * d0, k * d1

    def judge(self) -> PreLook:
        live = [p for p in self._live() if p.d_post]
        if not live:
            return PreLook(None, math.nan, -math.inf, math.inf, 0, 0, True)
        n = min(len(p.d_post) for p in live)
        series = [self._series(p) for p in live]
        # the common transient: the pairs' post series minus their pre means, averaged
        mean_post = np.mean([s1[:n] - s0.mean() for s0, s1 in series], axis=0)
        eps = TRANSIENT_EPS * math.log1p(self.spec.stats.min_effect)
        end, still = 0, False
        if self.baseline != self.candidate:  # nothing applied, no transient (an A/A)
            fit = stats.fit_transient(mean_post, eps=eps, threshold=TRANSIENT_T)
            mser = stats.detect_warmup(mean_post)
            end = max(fit.end, mser.discard)
            still = fit.at_limit or (mser.extend and fit.end == 0)
        is_open = still or n < PRE_MIN_SPAN or n - end < max(PRE_MIN_POST, end / 2)
        means, ses, dfs, n_eff = [], [], [], 0.0
        for s0, s1 in series:
            post = s1[end:n]
            v1, f1 = _batch_var(post, PRE_BATCH)
            v0, f0 = _batch_var(s0, PRE_BATCH)
            if not (math.isfinite(v1) and math.isfinite(v0)):
                continue
            var = v0 + v1
            means.append(float(post.mean() - s0.mean()))
            ses.append(math.sqrt(var))
            dfs.append(var * var / (v0 * v0 / f0 + v1 * v1 / f1))
            n_eff += 1.0 / (1.0 / post.size + 1.0 / s0.size)
        pe = stats.pool_strata(means, ses, dfs)
        if pe is None:
            return PreLook(None, math.nan, -math.inf, math.inf, 0, end, True)
        n_opt = len(means) * 4.0 * PRE_MIN_POST  # tightest around the expected decision
        hw = stats.cs_halfwidth(pe.se, n_eff, self.alpha, n_opt, df=pe.df)
        est = to_relative(pe.mean, self.dir)
        lo = to_relative(pe.mean - hw, self.dir)
        hi = to_relative(pe.mean + hw, self.dir)
        decision: Decision | None = None
        need = max(1, min(PRE_MIN_STRATA, len(self._live())))
        if not is_open and len(means) >= need:
            m = self.spec.stats.min_effect
            if lo > 0:
                decision = Decision.BETTER
            elif hi < 0:
                decision = Decision.WORSE
            elif -m < lo and hi < m:
                decision = Decision.NO_DIFFERENCE
        futile = ""
        if decision is None and not is_open and len(means) >= need:
            if pe.tau > 0.0:
                futile = self._futile(pe, means, ses, n_eff, n_opt)
            if not futile:
                futile = self._hopeless(pe, means, ses, n - end, n_eff, n_opt)
        return PreLook(decision, est, lo, hi, len(means), end, is_open, pe, futile)

    def _hopeless(
        self,
        pe: stats.PooledEstimate,
        means: list[float],
        ses: list[float],
        post: int,
        n_eff: float,
        n_opt: float,
    ) -> str:
        """Whether this stage, measured on to its horizon, would still end undecided: the
        interval projected to the horizon (each pair's error shrunk as ``1/L + 1/P``, the
        between-pair variance kept at its 90 % lower bound, the same degrees of freedom:
        a between-pair sd barely estimated early on must not hand over a +1 %) neither fits
        inside ±min_effect nor excludes 0 around today's estimate. Handing over is never a
        decision (the alpha split is fixed beforehand), so a point estimate may choose it:
        an A/A whose pairs drift apart goes to the crossover without the rest of the
        horizon first."""
        left = self.horizon_n - post
        tau = stats.tau_lower(means, ses, 0.9)
        if left <= 0 or post <= 0 or tau <= 0.0:
            return ""
        k = len(ses)
        shrink = (1.0 / self.horizon_n + 1.0 / self.pre_n) / (1.0 / post + 1.0 / self.pre_n)
        fe = 1.0 / sum(1.0 / (x * x) for x in ses)
        var = tau**2 / k + fe * shrink
        hw = stats.cs_halfwidth(math.sqrt(var), n_eff / shrink, self.alpha, n_opt, df=pe.df)
        m = math.log1p(self.spec.stats.min_effect)
        if hw < m or abs(pe.mean) > hw:
            return ""
        return (
            f"its interval projected to the horizon ({self.horizon_n * self.interval:,.0f} s) "
            f"stays wider than ±{math.expm1(m) * 100:.2f} % around {pct(math.expm1(pe.mean))}"
        )

    def _futile(
        self,
        pe: stats.PooledEstimate,
        means: list[float],
        ses: list[float],
        n_eff: float,
        n_opt: float,
    ) -> str:
        """As the crossover pool's: a 99 % lower bound on the between-pair sd above 0 that
        keeps the interval (its variance >= tau^2 / k) from excluding 0 and from fitting
        inside ±min_effect however long the pairs measure. Here that sd may be the hosts'
        drift since the pre-period as well as the effect's heterogeneity, so it hands over
        to the crossover (which tells them apart) instead of ending the comparison."""
        tau = stats.tau_lower(means, ses, 0.99)
        if tau <= 0.0:
            return ""
        k = len(means)
        floor = stats.cs_halfwidth(tau / math.sqrt(k), n_eff, self.alpha, n_opt, df=k - 1)
        if abs(pe.mean) >= floor or floor < math.log1p(self.spec.stats.min_effect):
            return ""
        return (
            f"the pairs' estimates differ beyond their errors (between-pair sd "
            f"{pe.tau * 100:.2f} %, at least {tau * 100:.2f} % at 99 %)"
        )

    # ------------------------------------------------------------ the run

    def run(self) -> tuple[PreLook, float, int]:
        """Pre-period, apply, then batches and looks until a decision, the horizon or a
        pair's sample cap; returns (the last look, the clock since the apply, post windows
        measured per pair)."""
        with ThreadPoolExecutor(len(self.pairs), thread_name_prefix="musku-pre") as ex:
            self._each(ex, self._pre)
            self._each(ex, self._apply)
            while True:
                if self.should_stop is not None and self.should_stop():
                    break
                self._each(ex, self._batch)
                self.look = self.judge()
                n = max(len(p.d_post) for p in self._live())
                if (
                    self.look.decision is not None
                    or self.look.futile
                    or n >= min(self.horizon_n, self.cap)
                ):
                    break
        live = self._live()
        clock = max(float(p.pair.now()) - p.t_apply for p in live)
        return self.look, clock, max(len(p.d_post) for p in live)

    def reason(self, look: PreLook, clock: float, n_post: int) -> str:
        k = len(self.pairs)
        interval = f"interval [{pct(look.ci_low)}, {pct(look.ci_high)}]"
        on = (
            f"on {look.strata} of {k} pairs, {n_post - look.discard:,} post windows each "
            f"after a joint transient of {look.discard} (pre-period {self.pre_n:,} windows "
            f"on the baseline, not in the clock)"
        )
        failed = [
            f"{'+'.join(h.name for h in p.pair.hosts)} failed ({p.failed})"
            for p in self.pairs
            if p.failed
        ]
        tail = f"; {'; '.join(failed)}" if failed else ""
        if look.decision in (Decision.BETTER, Decision.WORSE):
            return f"{interval} excludes 0 {on}{tail}"
        if look.decision is Decision.NO_DIFFERENCE:
            m = self.spec.stats.min_effect
            return f"{interval} lies inside ±{m * 100:.2f} % {on}{tail}"
        why = f"{look.futile}: " if look.futile else ""
        return f"{why}no decision within {clock:,.0f} s after the apply: {interval} {on}{tail}"


def run_pre_pooled(
    pairs: Sequence[HostPair],
    baseline: Configuration,
    candidate: Configuration,
    spec: ComparisonSpec,
    *,
    seed: int,
    pre_s: float = PRE_S,
    horizon_s: float = PRE_HORIZON_S,
    should_stop: Callable[[], bool] | None = None,
    then: Callable[[ComparisonSpec], ComparisonResult] | None = None,
) -> ComparisonResult:
    """The pre-period design (module doc) on ``pairs``; ``then(spec)`` runs the crossover
    pool with the rest of alpha when the pre stage has not decided by ``horizon_s`` (None:
    end INCONCLUSIVE there)."""
    design = _PreDesign(pairs, baseline, candidate, spec, seed, pre_s, horizon_s, should_stop)
    look, clock, n_post = design.run()
    k = len(design.pairs)
    n = sum(len(p.d_post) for p in design.pairs)
    method = (
        f"pooled over {k} pairs against a concurrent pre-period ({design.pre_n:,} windows "
        f"of the baseline on both hosts; candidate on one host, roles balanced at random; "
        f"CUPED on the offered load; the candidate's transient found jointly over the "
        f"pairs; random effects, DerSimonian-Laird / Hartung-Knapp; confidence sequence at "
        f"{PRE_ALPHA_SHARE:.0%} of alpha)"
    )
    stopped = design.should_stop is not None and design.should_stop()
    if look.decision is None and not stopped and then is not None:
        conf = 1.0 - (1.0 - spec.stats.confidence) * (1.0 - PRE_ALPHA_SHARE)
        rest = then(_with_confidence(spec, conf))

        return replace(
            rest,
            host_time_s=clock + rest.host_time_s,
            samples=n + rest.samples,
            reason=(
                f"pre-period design: {design.reason(look, clock, n_post)}; then the "
                f"crossover: {rest.reason}"
            ),
            method=f"{method}, then {rest.method}",
            time=None,
        )
    if look.decision is None:
        decision = Decision.ABORTED if stopped else Decision.INCONCLUSIVE
    else:
        decision = look.decision
    return ComparisonResult(
        baseline=baseline,
        candidate=candidate,
        decision=decision,
        estimate=look.estimate if math.isfinite(look.estimate) else 0.0,
        ci_low=look.ci_low,
        ci_high=look.ci_high,
        samples=n,
        host_time_s=clock,
        reason=design.reason(look, clock, n_post),
        method=method,
    )


def _with_confidence(spec: ComparisonSpec, confidence: float) -> ComparisonSpec:

    return replace(spec, stats=replace(spec.stats, confidence=confidence))
