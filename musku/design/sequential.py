"""Multi-arm sequential inference on a crossover group: always-valid confidence sequences on
every pairwise contrast, successive elimination, and the stopping rules.

Data. In each observation (the group runner passes one per period: the mean of its steady
windows) every arm runs on exactly one host of the group, all at the same time under the same
live load. The procedure receives, per observation ("batch" below), the mean log primary metric of the host running each arm (sign-adjusted: higher is
better) and the batch's *stratum* (the period's position in the design's cycle). A contrast
``j - i`` in one batch is the within-batch difference of two hosts' log metrics: the common load
cancels, the two hosts' bias difference does not. Over one design cycle every arm runs on every
host equally often, so those bias differences sum to zero over the strata: the estimator is the
**mean of the per-stratum means** (equal stratum weights, whatever the batch counts), the
generalisation of the pair tester's two-order crossover estimator
(:func:`musku.abtest.stats.crossover_estimate`) to ``S`` strata. Its variance is the
Bartlett/Newey-West HAC long-run variance (:func:`musku.abtest.stats.nw_bandwidth`,
:func:`musku.abtest.stats.hac_lrv`) of the within-stratum residuals in time order, times
``sum_s 1 / n_s / S^2``.

Error control. Each pairwise contrast gets the pair tester's two-sided asymptotic confidence
sequence (:func:`musku.abtest.stats.cs_halfwidth`, Waudby-Smith et al.; Student-t small-sample
correction) at level ``alpha / M`` with ``M = n (n - 1) / 2`` the number of pairs (Bonferroni).
The sequences hold simultaneously for all pairs and all looks with probability >= 1 - alpha
(asymptotically), whatever the dependence between contrasts, so every claim the procedure makes
(an elimination "j beats i", a contrast against the baseline declared better or worse, the
final choice) is covered by one family-wise error rate. Bonferroni over all pairs rather than
``alpha / K`` over the K baseline contrasts: elimination of an arm that is "not the best"
compares candidates with each other, and those claims need to be in the family too.

Holm's step-down (``fwer = "holm"``, the default) sharpens this without giving up the
family-wise guarantee. The always-valid p-value of a contrast at a look is the smallest level
at which its confidence sequence excludes 0 (anytime-valid: it is a valid p-value at any
stopping time); Holm's procedure on those M p-values rejects "no difference" for a contrast
(the claim "j beats i", or a candidate better / worse than the baseline) when it passes the
step-down thresholds ``alpha / M, alpha / (M - 1), ...``. Holm needs nothing but valid
marginal p-values, so the family-wise error stays at most ``alpha``; every claim Bonferroni
makes, Holm makes too. It is run as the equivalent alpha-spending loop: with ``r`` claims made,
every remaining contrast is tested at ``alpha / (M - r)`` until a round makes no new claim.
The intervals reported (:meth:`MultiArmProcedure.contrast`) and the equivalence claims
(``NO_DIFFERENCE``, "cannot matter") stay at the Bonferroni level ``alpha / M``.

Elimination (checked after every batch, once every stratum has ``min_per_stratum`` batches):

1. *Clearly not the best*: arm ``i`` is out when some arm ``j`` has ``CS(j - i)`` above 0
   (this covers "clearly worse than the baseline", ``j = 0``).
2. *Cannot matter*: a candidate whose ``CS(i - baseline)`` lies below ``+min_effect`` and is
   not above 0 is out while the baseline is still in (it cannot beat the baseline by
   ``min_effect``: adopting it would not be worth a change).

Stopping: (a) one arm left: it is the best at ``1 - alpha``; (b) every pair of the arms still in
lies within ``+-min_effect``: the baseline if it is still in, else the arm with the highest
estimate (within ``min_effect`` of the best); (c) the sample cap: ``INCONCLUSIVE``, choosing the
baseline unless it was eliminated (then the leader).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from itertools import combinations

import numpy as np
from numpy.typing import NDArray

from musku.abtest import stats
from musku.abtest.rules import to_relative
from musku.domain import Decision
from musku.errors import InputError

FloatArray = NDArray[np.float64]

BLOCK_BANDWIDTH = 1.5
"""HAC bandwidth floor in periods: the Bartlett weights reach past one period's batches."""


@dataclass(frozen=True)
class Contrast:
    """One pairwise contrast ``j - i`` (log scale, good direction positive) and its
    confidence sequence at the procedure's per-pair level."""

    i: int
    j: int
    estimate: float
    low: float
    high: float
    n_eff: float

    def relative(self, direction: float = 1.0) -> tuple[float, float, float]:
        """(estimate, low, high) as relative effects of ``j`` over ``i``."""
        return (
            to_relative(self.estimate, direction),
            to_relative(self.low, direction),
            to_relative(self.high, direction),
        )


@dataclass
class ScanOutcome:
    """Where the procedure stands (after :meth:`MultiArmProcedure.look`)."""

    stop: bool
    decision: Decision | None  # BETTER: a candidate chosen; NO_DIFFERENCE: keep the baseline;
    # INCONCLUSIVE: the cap came first; None: keep sampling
    best: int  # the chosen (or currently leading) arm
    reason: str = ""
    active: tuple[int, ...] = ()
    eliminated: dict[int, str] = field(default_factory=dict)  # arm -> why
    vs_baseline: dict[int, Decision | None] = field(default_factory=dict)
    claimed_difference: bool = False  # some sequence excluded 0 at some look so far


def contrast_estimate(
    d: FloatArray,
    strata: NDArray[np.int64],
    n_strata: int,
    *,
    min_per_stratum: int = 2,
    min_bandwidth: float = 1.0,
) -> tuple[float, float, float, int] | None:
    """(mean, standard error, intrinsic time, df) of the mean of per-stratum means of the batch
    contrasts ``d`` (time order), or ``None`` until each of the ``n_strata`` strata has
    ``min_per_stratum`` batches. The intrinsic time is ``S^2 / sum_s 1 / n_s`` batches. The
    HAC bandwidth is the Newey-West one, at least ``min_bandwidth`` lags (the procedure passes
    the batches of one period: slow per-host drifts shift a whole period's batches together)."""
    d = np.asarray(d, dtype=float)
    strata = np.asarray(strata, dtype=np.int64)
    counts = np.bincount(strata, minlength=n_strata)[:n_strata]
    if counts.size < n_strata or int(counts.min()) < max(2, min_per_stratum):
        return None
    sums = np.bincount(strata, weights=d, minlength=n_strata)[:n_strata]
    means = sums / counts
    resid = d - means[strata]
    df = d.size - n_strata
    if df < 1:
        return None
    bw = max(1.0, min_bandwidth, stats.nw_bandwidth(resid))
    lrv = stats.hac_lrv(resid, bw) * d.size / df
    inv = float(np.sum(1.0 / counts))
    var = lrv * inv / (n_strata * n_strata)
    return float(means.mean()), math.sqrt(max(var, 0.0)), n_strata * n_strata / inv, df


class MultiArmProcedure:
    """Sequential best-arm identification on a multi-arm crossover (see the module doc).

    ``n_arms`` arms (0 = baseline), ``n_strata`` strata (periods of the design cycle)."""

    def __init__(
        self,
        n_arms: int,
        n_strata: int,
        *,
        alpha: float = 0.05,
        min_effect: float = 0.005,
        min_per_stratum: int = 2,
        n_opt: float | None = None,
        cap_batches: int | None = None,
        block: int = 1,
        fwer: str = "holm",
    ) -> None:
        if isinstance(n_arms, bool) or not isinstance(n_arms, int) or n_arms < 2:
            raise InputError(f"a multi-arm scan needs >= 2 arms (baseline + 1), not {n_arms!r}")
        if not isinstance(n_strata, int) or n_strata < 1:
            raise InputError(f"n_strata must be an integer >= 1, not {n_strata!r}")
        if not (isinstance(alpha, float | int) and 0.0 < alpha < 0.5):
            raise InputError(f"alpha = {alpha!r} must be in (0, 0.5)")
        if not (isinstance(min_effect, float | int) and 0.0 < min_effect < 0.5):
            raise InputError(f"min_effect = {min_effect!r} must be in (0, 0.5)")
        if fwer not in ("holm", "bonferroni"):
            raise InputError(f"fwer = {fwer!r} must be 'holm' or 'bonferroni'")
        self.fwer = fwer
        self.n_arms = n_arms
        self.n_strata = n_strata
        self.alpha = float(alpha)
        self.min_effect = float(min_effect)
        self.log_min = math.log1p(self.min_effect)
        self.min_per_stratum = int(min_per_stratum)
        self.pairs = list(combinations(range(n_arms), 2))
        self.alpha_pair = self.alpha / len(self.pairs)  # Bonferroni over every pair
        self.n_opt_given = n_opt
        self._n_opt: dict[tuple[int, int], float] = {}
        self.cap_batches = cap_batches
        self.block = max(1, int(block))  # batches per period: the HAC bandwidth's floor
        self._y = np.empty((64, n_arms))  # batch rows, grown by doubling
        self._s = np.empty(64, dtype=np.int64)
        self._count = 0
        self.active: set[int] = set(range(n_arms))
        self.eliminated: dict[int, str] = {}
        self.claimed_difference = False

    # ----------------------------------------------------------------- data

    def add(self, arm_means: FloatArray, stratum: int) -> None:
        """One batch: the mean (sign-adjusted) log metric of each arm's host, and its stratum."""
        row = np.asarray(arm_means, dtype=float)
        if row.shape != (self.n_arms,):
            raise InputError(f"a batch has one value per arm ({self.n_arms}), not {row.shape}")
        if not 0 <= stratum < self.n_strata:
            raise InputError(f"stratum {stratum} outside 0..{self.n_strata - 1}")
        if self._count == self._y.shape[0]:
            self._y = np.concatenate([self._y, np.empty_like(self._y)])
            self._s = np.concatenate([self._s, np.empty_like(self._s)])
        self._y[self._count] = row
        self._s[self._count] = int(stratum)
        self._count += 1

    @property
    def batches(self) -> int:
        return self._count

    def contrast(self, i: int, j: int, alpha: float | None = None) -> Contrast | None:
        """The confidence sequence of ``j - i`` at level ``alpha / M`` (or ``alpha`` when
        given; ``None`` too early)."""
        if not self._count:
            return None
        y = self._y[: self._count]
        strata = self._s[: self._count]
        got = contrast_estimate(
            y[:, j] - y[:, i],
            strata,
            self.n_strata,
            min_per_stratum=self.min_per_stratum,
            min_bandwidth=BLOCK_BANDWIDTH * self.block,
        )
        if got is None:
            return None
        mean, se, n_eff, df = got
        key = (min(i, j), max(i, j))
        n_opt = self._n_opt.get(key)
        if n_opt is None:
            # tightest where the sequence (about 3 standard errors) is as narrow as min_effect:
            # fixed at the first estimate so later looks do not retune it
            if self.n_opt_given is not None:
                n_opt = float(self.n_opt_given)
            else:
                lrv = se * se * n_eff
                n_opt = max(n_eff, lrv * (3.0 / self.log_min) ** 2)
            self._n_opt[key] = n_opt
        level = self.alpha_pair if alpha is None else alpha
        hw = stats.cs_halfwidth(se, n_eff, level, n_opt, df=df)
        return Contrast(i, j, mean, mean - hw, mean + hw, n_eff)

    # ----------------------------------------------------------------- decisions

    def look(self) -> ScanOutcome:
        """Eliminate what the sequences allow, then apply the stopping rules."""
        cs: dict[tuple[int, int], Contrast] = {}
        for i, j in self.pairs:
            c = self.contrast(i, j)
            if c is None:
                if self.cap_batches is not None and self.batches >= self.cap_batches:
                    return self._outcome(True, Decision.INCONCLUSIVE, 0, "sample cap reached")
                return self._outcome(stop=False, decision=None, reason="too few batches")
            cs[(i, j)] = c
        claims = self._claims(cs)
        if claims:
            self.claimed_difference = True

        def diff(i: int, j: int) -> tuple[float, float, float]:
            """(estimate, low, high) of j - i."""
            if i < j:
                c = cs[(i, j)]
                return c.estimate, c.low, c.high
            c = cs[(j, i)]
            return -c.estimate, -c.high, -c.low

        def beats(i: int, j: int) -> bool:
            """A family-wise claim that j is better than i."""
            key = (min(i, j), max(i, j))
            return key in claims and (diff(i, j)[0] > 0)

        # 1. clearly not the best
        for i in sorted(self.active):
            for j in range(self.n_arms):
                if j != i and beats(i, j):
                    self._drop(i, f"arm {j} is better")
                    break
        # 2. cannot beat the baseline by min_effect (while the baseline is in)
        if 0 in self.active:
            for i in sorted(self.active - {0}):
                _, lo, hi = diff(0, i)
                if hi < self.log_min and lo <= 0 and len(self.active) > 1:
                    self._drop(i, "cannot beat the baseline by min_effect")
        self._cs = cs
        self._claimed = claims
        leader = max(self.active, key=lambda a: diff(0, a)[0] if a else 0.0)
        if len(self.active) == 1:
            (only,) = self.active
            decision = Decision.BETTER if only != 0 else Decision.NO_DIFFERENCE
            return self._outcome(True, decision, only, "one arm left: the best at 1 - alpha")
        act = sorted(self.active)
        if all(
            -self.log_min < diff(a, b)[1] and diff(a, b)[2] < self.log_min
            for a, b in combinations(act, 2)
        ):
            best = 0 if 0 in self.active else leader
            decision = Decision.BETTER if best != 0 else Decision.NO_DIFFERENCE
            return self._outcome(True, decision, best, "the arms left are within +-min_effect")
        if self.cap_batches is not None and self.batches >= self.cap_batches:
            best = 0 if 0 in self.active else leader
            return self._outcome(True, Decision.INCONCLUSIVE, best, "sample cap reached")
        return self._outcome(False, None, leader, "")

    def _claims(self, cs: dict[tuple[int, int], Contrast]) -> set[tuple[int, int]]:
        """The pairs whose "no difference" the family rejects at this look: Bonferroni (the
        sequences at ``alpha / M`` exclude 0), or Holm's step-down on the always-valid
        p-values, run as alpha spending (module doc)."""
        claims = {k for k, c in cs.items() if c.low > 0 or c.high < 0}
        self._levels = dict.fromkeys(claims, self.alpha_pair)
        if self.fwer == "bonferroni":
            return claims
        m = len(self.pairs)
        while len(claims) < m:
            level = self.alpha / (m - len(claims))
            new = set()
            for i, j in self.pairs:
                if (i, j) in claims:
                    continue
                c = self.contrast(i, j, alpha=level)
                if c is not None and (c.low > 0 or c.high < 0):
                    new.add((i, j))
            if not new:
                break
            claims |= new
            self._levels.update(dict.fromkeys(new, level))
        return claims

    def level(self, i: int, j: int) -> float:
        """The level of ``j - i``'s interval that goes with its decision at the last look: the
        Holm step at which its difference was claimed, else Bonferroni's ``alpha / M``."""
        levels: dict[tuple[int, int], float] = getattr(self, "_levels", {})
        return levels.get((min(i, j), max(i, j)), self.alpha_pair)

    def p_value(self, i: int, j: int) -> float | None:
        """The always-valid p-value of ``j - i`` at this look (smallest level at which its
        sequence excludes 0, by bisection; 1.0 when none below 1 does; None too early)."""
        c = self.contrast(i, j)
        if c is None:
            return None
        lo, hi = 1e-15, 1.0 - 1e-9
        ex = self.contrast(i, j, alpha=hi)
        if ex is None or not (ex.low > 0 or ex.high < 0):
            return 1.0
        for _ in range(50):
            mid = math.sqrt(lo * hi)
            x = self.contrast(i, j, alpha=mid)
            if x is not None and (x.low > 0 or x.high < 0):
                hi = mid
            else:
                lo = mid
        return hi

    def remove(self, arm: int, why: str) -> None:
        """Eliminate ``arm`` for a reason outside the procedure (a broken guardrail), even when
        it is the last arm left: then the baseline comes back as the only arm. The eliminated
        arm's later observations (its hosts run the baseline instead) still enter the
        contrasts, but it can no longer be chosen."""
        if arm == 0 or arm not in self.active:
            return
        self.active.discard(arm)
        self.eliminated[arm] = why
        if not self.active:
            self.active.add(0)

    def _drop(self, arm: int, why: str) -> None:
        if arm in self.active and len(self.active) > 1:
            self.active.discard(arm)
            self.eliminated[arm] = why

    def vs_baseline(self) -> dict[int, Decision | None]:
        """Each candidate's contrast against the baseline, read off its sequence."""
        out: dict[int, Decision | None] = {}
        claimed: set[tuple[int, int]] = getattr(self, "_claimed", set())
        for k in range(1, self.n_arms):
            c = getattr(self, "_cs", {}).get((0, k))
            if c is None:
                out[k] = None
            elif (0, k) in claimed and c.estimate > 0:
                out[k] = Decision.BETTER
            elif (0, k) in claimed and c.estimate < 0:
                out[k] = Decision.WORSE
            elif -self.log_min < c.low and c.high < self.log_min:
                out[k] = Decision.NO_DIFFERENCE
            else:
                out[k] = Decision.INCONCLUSIVE
        return out

    def _outcome(
        self, stop: bool, decision: Decision | None, best: int = 0, reason: str = ""
    ) -> ScanOutcome:
        return ScanOutcome(
            stop=stop,
            decision=decision,
            best=best,
            reason=reason,
            active=tuple(sorted(self.active)),
            eliminated=dict(self.eliminated),
            vs_baseline=self.vs_baseline(),
            claimed_difference=self.claimed_difference,
        )

    def method(self) -> str:
        return (
            f"multi-arm crossover: mean of {self.n_strata} stratum means, Bartlett HAC, "
            f"asymptotic CS per pair at alpha/{len(self.pairs)} (Bonferroni over all pairs), "
            + (
                "Holm step-down on the always-valid p-values for the claims, "
                if self.fwer == "holm"
                else ""
            )
            + "successive elimination"
        )
