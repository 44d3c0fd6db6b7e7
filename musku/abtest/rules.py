"""Decision rules: seeded strategy objects turning the evidence so far into a verdict.

A rule is looked at after every batch (continuous monitoring); it also declares the design
it needs from the driver (crossover or not, data-driven warm-up detection or a fixed one,
a fixed look interval or the autocorrelation-derived batch size). Rules are chosen by name
from :data:`RULES` (``"module:Class"`` strings, built-ins as aliases) or passed as objects:

==============  ==============================================================================
``cs``          musku's rule: crossover design (ABBA periods), paired log-ratios in batch means,
                two-sided asymptotic confidence sequence (Waudby-Smith et al. 2021/2023);
                stops BETTER/WORSE when the sequence excludes 0, NO_DIFFERENCE when two
                one-sided sequential probability ratio tests (Wald, against the point
                alternative 0, each at alpha) reject "effect beyond +-min_effect"
                (``equivalence = "sprt"``; ``"tost"``: the two one-sided bounds of the
                sequence inside). Opt-in per comparison (``futility = bar``): also stops
                NOT_BETTER when a one-sided SPRT rejects "effect >= bar" (the futility
                stop; the sweep's walks ask it). Valid under continuous monitoring. The host bias's
                change between periods (slow wander) is a variance component
                (``wander_sd`` / ``wander_tau_s`` prior, or measured from the periods).
                Before the first
                swap, a large effect may be decided on one role order when the sequence
                widened by the host-bias bound (``max_host_bias``, default 1 %) excludes 0.
``naive-paired`` the same sequence on paired log-ratios *without* crossover: the two hosts'
                fixed bias is taken for an effect. Kept to show why crossover is needed.
``welch``       the original muSKU method: unpaired two-sample Welch t-test at 95 %, re-checked
                after every batch of windows, no crossover, fixed warm-up, cap 30,000.
==============  ==============================================================================
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from dataclasses import dataclass, replace
from typing import Any, ClassVar

import numpy as np
from numpy.typing import NDArray

from musku.abtest import stats
from musku.abtest import transient as transient_mod
from musku.domain import Decision
from musku.errors import InputError
from musku.registry import load

FloatArray = NDArray[np.float64]

COVARIATE = "offered_qps"
"""Per-host metric the knobs do not change, used for the CUPED-style regression adjustment of
the log-ratios when both hosts report it (the request rate the load balancer offers each host).
``rule_options={"covariate": None}`` turns the adjustment off."""

WANDER_SD = 0.003
WANDER_TAU_S = 3600.0
"""Default prior on the slow wander of a pair's host bias (the two hosts' log-throughput
ratio): a stationary OU process with sd 0.3 % and time constant one hour (two hosts with
0.2 % per-host drifts over about an hour, thermals and co-tenant daemons: the shipped
simulator models). The crossover removes only a constant bias; this prior's variance of the
periods' bias changes enters every crossover interval (the data's own estimate replaces it
when larger). Override with ``rule_options={"wander_sd": ..., "wander_tau_s": ...}``;
``wander_sd = 0`` trusts the data alone."""

PERIOD_SHARE_OF_WANDER = 1.0
"""Two periods of each role order before a decision once a period lasts this share of the
wander's time constant (``wander_tau_s``) or more: one period per role order would leave the
change of host bias between them unmeasured (no degree of freedom), with only the prior to
size it. Shorter periods see little of the wander change between them, and the prior's
between-period variance is in their interval anyway. Measured on the README's main job
(Web/Skylake, one pair, 2026-11-28): a share of 0.25 took the host-clock to the soft SKU from
22.8 h to 40.7 h and 0.5 to 47.4 h (warm-up-heavy knobs' periods of 15-60 min then need 3.5+
periods), 1.0 left it at 22.8 h; the A/A rows could not tell the shares apart."""

EQUIVALENCE = ("sprt", "tost", "interval")
"""How the cs rule decides NO_DIFFERENCE (rule option ``equivalence``; default
:data:`EQUIVALENCE_DEFAULT`). ``"tost"`` (the default before "Equivalence by SPRT"):
once the two **one-sided** always-valid bounds, each at the crossover sequence's alpha, lie
inside +-min_effect (two one-sided tests, Schuirmann 1987, as confidence sequences: the
chance of NO_DIFFERENCE when the true effect is min_effect or more stays <= alpha, the
standard equivalence error control). ``"interval"``: once the two-sided (1 - alpha) sequence
lies inside (each side then spends at most alpha / 2 of a one-sided error: about 1.2x the
samples for the same guarantee; the rule before issue 30 item 4). ``"sprt"``: two one-sided
sequential probability ratio tests against the point alternative 0
(:func:`musku.abtest.stats.sprt_bounds`: "effect >= +min_effect" and "effect <=
-min_effect" each rejected at alpha by Wald's likelihood-ratio boundary, anytime-valid by
Ville's inequality); NO_DIFFERENCE once both are rejected. A side once rejected stays
rejected while the batch means are only appended to (a rebuild, i.e. a new batch size or
windows trimmed as warm-up, forgets both: a rejection on data since judged contaminated does
not stand). Issue 30's goal for a true 0 needs it (docs/abtest.md, "Equivalence by SPRT":
median samples of a true 0 2,326 -> 1,816 on the shipped model, same 300 seeds).
The reported interval is the two-sided one whichever is used, so its coverage does not
change; BETTER / WORSE do not depend on this option."""

EQUIVALENCE_DEFAULT = "sprt"
"""The cs rule's default ``equivalence``: measured honest on the shipped model (false
NO_DIFFERENCE at a true +-min_effect within alpha; A/A false positives and +1 % decisions
the same seed for seed), docs/abtest.md "Equivalence by SPRT"."""

NOISE_DF_DEFAULT = 100.0
"""Degrees of freedom of a noise prior given in ``rule_options`` (``noise_lrv``) without
``noise_df``; a calibration's own are its batches less its periods."""

CALIBRATED_NOISE = False
"""Whether a comparison pools its pair's calibrated noise by default (rule option
``calibrated_noise``). Off: measured on the shipped model (docs/abtest.md, "Issue 30 item 4,
round 2"), it saved ~4 % of the samples of a true 0 (median 2,461 -> 2,364, A/A 4.0 %
either way), while a calibration understating the noise 1.5x took the A/A false positives
to 10 % (100 runs each, same seeds): no gain worth that risk. ``noise_lrv`` given explicitly is always used."""

NOISE_CHECK = 0.05
"""Two-sided level of the check that a comparison's own long-run variance agrees with its
calibration's (an F test of the ratio on their degrees of freedom): beyond it the
calibration's noise is not pooled (rule option ``noise_check``; 0 never rejects)."""


def _check_level(x: Any) -> float:
    if not (isinstance(x, int | float) and not isinstance(x, bool) and 0.0 <= x < 1.0):
        raise InputError(f"cs rule: noise_check = {x!r} must be in [0, 1)")
    return float(x)


MAX_HOST_BIAS = 0.01
"""Default bound on the relative bias between the two "identical" hosts of a pair (1 %): the
early decision before the first crossover swap is only taken when the interval, widened by
this much on both sides, still excludes 0. Override per pair with ``max_host_bias`` in
``HostPair.describe()`` or per comparison with ``rule_options={"max_host_bias": ...}``."""


@dataclass(frozen=True)
class RuleSetup:
    """What the driver knows when the rule starts (after the pilot windows)."""

    alpha: float  # 1 - confidence
    min_effect: float  # relative minimum effect of interest
    sample_cap: int  # samples per host
    batch_size: int  # windows per batch (one look per batch)
    pilot_sd: float  # sd of one window's log-ratio in the pilot (nan when unknown)
    pilot_rho: float  # lag-1 autocorrelation of the pilot's log-ratios


@dataclass(frozen=True)
class Evidence:
    """Steady-state data so far. Log-ratios ``d`` are sign-adjusted: positive = B better."""

    batch_d: FloatArray  # mean log-ratio of each completed batch
    batch_sign: NDArray[np.int8]  # +1: host 0 ran A in that batch, -1: roles swapped
    batch_period: NDArray[np.int64]  # period index of each batch
    log_a: FloatArray  # per steady window: log primary metric of the host in role A
    log_b: FloatArray  # ... and of the host in role B
    direction: float  # +1 higher is better, -1 lower is better
    samples: int  # steady windows per host
    batch_size: int  # windows per batch (may grow when the autocorrelation is re-estimated)
    # per period index: host seconds (since the start) of its first batched window's start and
    # its last's end; None: unknown (no between-period component is modelled)
    period_span: FloatArray | None = None
    # the delta-method variance of the effect from a warm-up transient fitted over all
    # applies and subtracted from ``batch_d`` (musku.abtest.transient), and what was done
    transient_var: float = 0.0
    transient_note: str = ""
    # the fitted transient's time constant is at the bound the applies allow: it may be
    # longer than seen, so no decision yet (the driver lengthens the periods)
    transient_open: bool = False


@dataclass(frozen=True)
class Verdict:
    """A rule's answer at one look. Effects are relative (exp(log effect) - 1)."""

    decision: Decision | None  # None: keep sampling
    estimate: float
    ci_low: float
    ci_high: float
    detail: str = ""
    early: bool = False  # decided before crossover: one role order, interval widened by the bias
    # the equivalence bounds (one-sided, each at alpha) NO_DIFFERENCE is decided on; NaN: none
    eq_low: float = math.nan
    eq_high: float = math.nan
    # the futility stop's bound (rule option ``futility``): the smallest bar a one-sided SPRT
    # rejects "effect >= bar" for at this look (relative); NaN: no futility question
    fut_bound: float = math.nan

    @classmethod
    def undecided(cls, estimate: float = math.nan) -> Verdict:
        return cls(None, estimate, -math.inf, math.inf)


def to_relative(x: float, direction: float) -> float:
    """Relative effect from a sign-adjusted log-ratio ``x`` (``dir * log(B / A)``), in the
    metric's good direction and the simulator's convention: ``B/A - 1`` when higher is better,
    ``1 - B/A`` when lower is better. Increasing in ``x``; +-inf map to the scale's ends."""
    if x > 700.0:  # exp() overflows: a boundary that wide is as good as unbounded
        return math.inf if direction > 0 else 1.0
    if x < -700.0:
        return -1.0 if direction > 0 else -math.inf
    return math.expm1(x) if direction > 0 else -math.expm1(-x)


def pct(x: float) -> str:
    """``+3.90 %``: a relative effect for humans."""
    if math.isnan(x):
        return "n/a"
    if math.isinf(x):
        return "+inf" if x > 0 else "-inf"
    return f"{x * 100:+.2f} %"


class DecisionRule(ABC):
    """Base of decision rules. Subclasses set the class attributes and implement ``look``."""

    name: ClassVar[str] = ""
    crossover: bool = True  # swap the hosts' roles every period
    detect_warmup: bool = True  # find the end of the transient from the data
    fixed_batch: int | None = None  # look every this many windows instead of the AR(1) batch
    sample_cap: int | None = None  # overrides the spec's cap when set

    def __init__(self, *, seed: int | None = None) -> None:
        self.seed = seed
        self.rng = np.random.default_rng(seed)
        self.setup: RuleSetup | None = None

    def first_order(self) -> int:
        """Role order of the first period: +1 host 0 runs A, -1 host 0 runs B (randomised
        by the seed for crossover designs, so neither host is systematically first)."""
        if not self.crossover:
            return 1
        return 1 if self.rng.random() < 0.5 else -1

    def start(self, setup: RuleSetup) -> None:
        self.setup = setup

    @abstractmethod
    def look(self, ev: Evidence) -> Verdict:
        """The verdict after the latest batch."""

    def method(self) -> str:
        return self.name


class ConfidenceSequenceRule(DecisionRule):
    """Crossover + batch means + asymptotic confidence sequence.

    The confidence sequence is Robbins' normal-mixture boundary on the CLT-approximated sum
    (Waudby-Smith et al.), tuned to be tightest where the interval first becomes as narrow as
    ``min_effect``; the intrinsic time is the information of the crossover estimator in
    batches. Small-sample honesty: the boundary's normal radius is replaced by the Student-t
    quantile of the same tail probability (``df`` = batches - 2), and no decision is taken
    before ``min_batches`` batches (and ``min_per_order`` of each role order)."""

    name = "cs"
    check_bias = True  # the driver holds each comparison's bias estimate to the bound
    pools_noise = True  # the driver hands it the pair's calibrated noise (use_noise)

    def __init__(
        self,
        *,
        seed: int | None = None,
        crossover: bool = True,
        min_batches: int = 12,
        min_per_order: int = 4,
        max_host_bias: float | None = None,
        early_min_batches: int = 6,
        early: bool = True,
        early_alpha_share: float = 0.2,
        covariate: str | None = COVARIATE,
        wander_sd: float = WANDER_SD,
        wander_tau_s: float = WANDER_TAU_S,
        equivalence: str = EQUIVALENCE_DEFAULT,
        noise_lrv: float | None = None,
        noise_df: float = NOISE_DF_DEFAULT,
        noise_check: float = NOISE_CHECK,
        calibrated_noise: bool = CALIBRATED_NOISE,
        transient: str = transient_mod.DEFAULT_MODE,
        futility: float | None = None,
    ) -> None:
        super().__init__(seed=seed)
        if futility is not None and not (
            isinstance(futility, int | float)
            and not isinstance(futility, bool)
            and math.isfinite(futility)
            and 0.0 <= futility < 1.0
        ):
            raise InputError(
                f"cs rule: futility = {futility!r} must be a relative bar in [0, 1) "
                "(the effect the candidate must beat)"
            )
        # the comparison's question (opt-in): only "is the candidate better by >= this bar?"
        # A one-sided SPRT that rejects "effect >= bar" stops it NOT_BETTER (FUTILITY)
        self.futility = None if futility is None else float(futility)
        if transient not in transient_mod.MODES:
            raise InputError(
                f"cs rule: transient = {transient!r} must be one of "
                f"{', '.join(transient_mod.MODES)}"
            )
        # "fit": the warm-up transient fitted over all applies and subtracted (its
        # uncertainty in the interval); "discard": each apply's transient searched for its
        # end and discarded (before issue 30 item 2)
        self.transient = transient
        self.transient_note = ""
        self.calibrated_noise = bool(calibrated_noise)
        self.noise: stats.NoisePrior | None = None
        self.noise_source = ""
        self.noise_check = _check_level(noise_check)
        if noise_lrv is not None:
            self.use_noise(noise_lrv, noise_df, "rule options")
        if equivalence not in EQUIVALENCE:
            raise InputError(
                f"cs rule: equivalence = {equivalence!r} must be one of {', '.join(EQUIVALENCE)}"
            )
        self.equivalence = equivalence
        # sprt: the tightest equivalence bounds (log scale) at a mature look since the batch
        # means were last rebuilt, and the batch means (and batch size) they were seen on
        self.eq_seen: tuple[float, float] = (-math.inf, math.inf)
        self.eq_data: tuple[int, FloatArray] | None = None
        for key, val, lo in (("wander_sd", wander_sd, 0.0), ("wander_tau_s", wander_tau_s, 1e-9)):
            if not (
                isinstance(val, int | float)
                and not isinstance(val, bool)
                and math.isfinite(val)
                and lo <= val
                and (key != "wander_sd" or val < 0.5)
            ):
                why = "a relative sd in [0, 0.5)" if key == "wander_sd" else "seconds > 0"
                raise InputError(f"cs rule: {key} = {val!r} must be {why}")
        self.wander = stats.Wander(float(wander_sd), float(wander_tau_s))
        # the pair's wander its calibration measured (use_wander): used where larger
        self.wander_cal: stats.Wander | None = None
        self.wander_source = ""
        if not (isinstance(early_alpha_share, int | float) and 0.0 < early_alpha_share < 1.0):
            raise InputError(
                f"cs rule: early_alpha_share = {early_alpha_share!r} must be in (0, 1)"
            )
        if covariate is not None and not isinstance(covariate, str):
            raise InputError(f"cs rule: covariate = {covariate!r} must be a metric name")
        self.early_alpha_share = float(early_alpha_share)
        self.covariate = covariate or None
        self.last_batch_size = 0
        self.last_bandwidth = 0.0
        self.last_estimate: stats.CrossoverEstimate | None = None
        self.crossover = crossover
        self.min_batches = min_batches
        self.min_per_order = min_per_order
        if max_host_bias is not None and not (
            isinstance(max_host_bias, int | float)
            and not isinstance(max_host_bias, bool)
            and 0.0 <= max_host_bias < 0.5
        ):
            raise InputError(
                f"cs rule: max_host_bias = {max_host_bias!r} must be a relative bias in [0, 0.5)"
            )
        self.max_host_bias = MAX_HOST_BIAS if max_host_bias is None else float(max_host_bias)
        # explicitly given (rule_options) wins over the pair's describe()["max_host_bias"]
        self.max_host_bias_given = max_host_bias is not None
        self.early_min_batches = max(4, int(early_min_batches))
        self.early = bool(early) and crossover
        self.n_opt_windows = 32.0

    def use_noise(self, lrv: float, df: float, source: str) -> None:
        """Pool the pair's measured noise (a calibration's long-run variance per window of
        the log-ratio, on ``df`` degrees of freedom) into every look's variance
        (:func:`musku.abtest.stats.pool_variance`); ``source`` names it in the method."""
        for key, val, lo in (("noise_lrv", lrv, 0.0), ("noise_df", df, 1.0)):
            if not (
                isinstance(val, int | float)
                and not isinstance(val, bool)
                and math.isfinite(val)
                and val > lo - (0.0 if key == "noise_lrv" else 1e-12)
            ):
                why = "a variance > 0" if key == "noise_lrv" else "degrees of freedom >= 1"
                raise InputError(f"cs rule: {key} = {val!r} must be {why}")
        self.noise = stats.NoisePrior(float(lrv), float(df), self.noise_check)
        self.noise_source = source

    def use_wander(self, sd: float, tau_s: float, source: str) -> None:
        """The pair's measured wander of its host bias (a calibration's OU sd and time
        constant, :func:`musku.abtest.stats.measure_wander`): a second prior of the
        between-period component, used where it is larger than the rule's own (``wander_sd``
        / ``wander_tau_s``), and its time constant for the two-periods-per-order rule.
        ``source`` names it in the reason."""
        if not (math.isfinite(sd) and 0.0 <= sd < 0.5 and math.isfinite(tau_s) and tau_s > 0.0):
            raise InputError(
                f"cs rule: the measured wander (sd {sd!r}, tau {tau_s!r} s) must be a relative "
                "sd in [0, 0.5) and seconds > 0"
            )
        self.wander_cal = stats.Wander(float(sd), float(tau_s))
        self.wander_source = source

    def wanders(self) -> list[stats.Wander]:
        """The wander priors in use: the rule's, and the pair's measured one when larger."""
        cal = self.wander_cal
        if cal is not None and cal.sd > self.wander.sd:
            return [self.wander, cal]
        return [self.wander]

    def start(self, setup: RuleSetup) -> None:
        super().start(setup)
        # tightest where a CS (~3 standard errors wide) reaches min_effect; fixed in windows
        # at the start so later re-batching does not retune it. With the pair's measured
        # noise, from it (the pilot's few windows are a noisy guess of it)
        sd = setup.pilot_sd
        b = setup.batch_size
        if self.noise is not None:
            n = self.noise.lrv * (3.0 / math.log1p(setup.min_effect)) ** 2
        elif math.isfinite(sd) and sd > 0:
            lrv = sd * sd * stats.long_run_variance_factor(setup.pilot_rho)
            n = lrv * (3.0 / math.log1p(setup.min_effect)) ** 2
        else:
            n = 32.0 * b
        self.n_opt_windows = float(
            min(max(n, float(self.min_batches * b)), float(setup.sample_cap))
        )

    def n_opt(self, batch_size: int) -> float:
        """Intrinsic time (in batches of ``batch_size``) where the sequence is tightest."""
        return max(float(self.min_batches), self.n_opt_windows / batch_size)

    def alpha_crossover(self) -> float:
        """The crossover sequence's share of alpha: all of it without the early path, else
        what the early sequence leaves (a fixed split: together they spend at most alpha)."""
        assert self.setup is not None
        a = self.setup.alpha
        return a * (1.0 - self.early_alpha_share) if self.early else a

    def alpha_equivalence(self) -> float:
        """The equivalence (TOST) bounds' alpha: all of it, early path or not. Its error is
        NO_DIFFERENCE when the true effect is min_effect or more, which only the crossover
        sequence can decide (the early path decides BETTER / WORSE only), so the early
        path's share need not be taken from it; the split protects the other error (BETTER
        / WORSE at a true 0), which both sequences can make."""
        assert self.setup is not None
        return self.setup.alpha

    def alpha_early(self) -> float:
        assert self.setup is not None
        return self.setup.alpha * self.early_alpha_share

    def look(self, ev: Evidence) -> Verdict:
        assert self.setup is not None, "start() first"
        self.last_batch_size = ev.batch_size
        long_periods = self.long_periods(ev)
        if self.crossover:
            est = stats.crossover_estimate(
                ev.batch_d,
                ev.batch_sign,
                ev.batch_period,
                spans=ev.period_span,
                wander=self.wanders(),
                noise=self.noise,
                batch_size=ev.batch_size,
            )
        else:
            est = stats.plain_estimate(ev.batch_d, ev.batch_period)
        rel = ev.direction
        if self.early and ev.batch_d.size and bool(np.all(ev.batch_sign == ev.batch_sign[0])):
            # one role order so far (before the first swap): the early path
            return self._look_early(ev)
        if est is None:
            mean = float(np.mean(ev.batch_d)) if ev.batch_d.size else math.nan
            return Verdict.undecided(to_relative(mean, rel) if math.isfinite(mean) else math.nan)
        if ev.transient_var > 0.0:
            est = replace(est, se=math.sqrt(est.se * est.se + ev.transient_var))
        self.transient_note = ev.transient_note
        self.last_estimate = est
        self.last_bandwidth = est.bandwidth
        hw = stats.cs_halfwidth(
            est.se, est.n_eff, self.alpha_crossover(), self.n_opt(ev.batch_size), df=est.df
        )
        lo, hi = est.mean - hw, est.mean + hw
        v_est, v_lo, v_hi = to_relative(est.mean, rel), to_relative(lo, rel), to_relative(hi, rel)
        enough = self.mature(est, long_periods) and not ev.transient_open
        if self.equivalence == "sprt":
            eq_lo, eq_hi = self.sprt_bounds(ev, est, enough)
        else:
            if self.equivalence == "tost":
                hw_eq = stats.cs_halfwidth(
                    est.se,
                    est.n_eff,
                    self.alpha_equivalence(),
                    self.n_opt(ev.batch_size),
                    df=est.df,
                    one_sided=True,
                )
            else:
                hw_eq = hw
            eq_lo, eq_hi = est.mean - hw_eq, est.mean + hw_eq
        e_lo, e_hi = to_relative(eq_lo, rel), to_relative(eq_hi, rel)
        comp = est.period
        # est.bias = dir * log(host1 / host0) in the primary metric
        detail = (
            f"host 1 vs host 0 bias {pct(math.expm1(est.bias * rel))}" if self.crossover else ""
        )
        if comp is not None and comp.var > 0:
            source = "prior"
            if comp.var > comp.prior_var:
                source = "measured"
            elif len(self.wanders()) > 1:
                cal = self.wanders()[1]
                source = (
                    f"{self.wander_source}'s wander sd {cal.sd * 100:.2f} %, tau "
                    f"{cal.tau_s / 60:.0f} min"
                )
            detail += (
                f"{'; ' if detail else ''}between-period (wander) sd "
                f"{math.sqrt(comp.var) * 100:.3f} % of the estimate's "
                f"{est.se * 100:.3f} % ({source})"
            )
        decision: Decision | None = None
        if enough:
            if v_lo > 0:
                decision = Decision.BETTER
            elif v_hi < 0:
                decision = Decision.WORSE
            elif self.equivalent(eq_lo, eq_hi, e_lo, e_hi):
                decision = Decision.NO_DIFFERENCE
        fut = math.nan
        if self.futility is not None:
            f_log = stats.futility_bound(
                est.mean,
                est.se * est.se,
                self.futility_margin(),
                self.alpha_equivalence(),
                est.df,
            )
            fut = to_relative(f_log, rel)
            if enough and decision is None and self.futile(f_log):
                decision = Decision.NOT_BETTER
        return Verdict(
            decision, v_est, v_lo, v_hi, detail, eq_low=e_lo, eq_high=e_hi, fut_bound=fut
        )

    def futility_margin(self) -> float:
        """How far below the futility bar the SPRT's point alternative sits (log scale):
        ``log(1 + min_effect)``, the equivalence's margin, so a bar of ``min_effect`` is the
        equivalence's upper side exactly."""
        assert self.setup is not None
        return math.log1p(self.setup.min_effect)

    def futile(self, bound: float) -> bool:
        """Whether a futility bound (log scale, :func:`musku.abtest.stats.futility_bound`)
        rejects "effect >= the bar" (rule option ``futility``): the bound at or below the
        bar's ``log(1 + futility)``."""
        return self.futility is not None and bound <= math.log1p(self.futility)

    def equivalent(self, lo: float, hi: float, rel_lo: float, rel_hi: float) -> bool:
        """Whether equivalence bounds (``lo``, ``hi`` on the log scale; ``rel_*`` the same
        relative) lie inside +-min_effect. ``sprt`` tests the log-scale margin
        ``log(1 + min_effect)`` on both sides (its alternative hypotheses are on the log
        scale; on the relative scale the lower side is then stricter by a factor 1 / (1 +
        min_effect): -0.4975 % at min_effect 0.5 %); the confidence-sequence bounds are
        compared relative, as before."""
        assert self.setup is not None
        if self.equivalence == "sprt":
            m = math.log1p(self.setup.min_effect)
            return -m < lo and hi < m
        return -self.setup.min_effect < rel_lo and rel_hi < self.setup.min_effect

    def sprt_bounds(
        self, ev: Evidence, est: stats.CrossoverEstimate, mature: bool
    ) -> tuple[float, float]:
        """The ``sprt`` equivalence bounds (log scale) at this look: this look's
        (:func:`musku.abtest.stats.sprt_bounds` at the equivalence alpha, the estimate's
        variance and degrees of freedom), tightened by those of every earlier mature look
        on the same batch means (each side's test, once rejected, stays rejected: each is
        anytime-valid on its own, and NO_DIFFERENCE is their intersection-union). When the
        driver rebuilt the batch means (a new batch size, windows trimmed as warm-up, a
        refitted transient subtracted), the earlier looks' bounds are forgotten. Only mature
        looks are remembered."""
        lo, hi = stats.sprt_bounds(est.mean, est.se * est.se, self.alpha_equivalence(), est.df)
        prev = self.eq_data
        same = (
            prev is not None
            and prev[0] == ev.batch_size
            and ev.batch_d.size >= prev[1].size
            and bool(np.array_equal(ev.batch_d[: prev[1].size], prev[1]))
        )
        if not same:
            self.eq_seen = (-math.inf, math.inf)
        if mature:
            self.eq_seen = (max(self.eq_seen[0], lo), min(self.eq_seen[1], hi))
        self.eq_data = (ev.batch_size, np.array(ev.batch_d, dtype=float, copy=True))
        return max(self.eq_seen[0], lo), min(self.eq_seen[1], hi)

    def mature(self, est: stats.CrossoverEstimate, long_periods: bool) -> bool:
        """Whether an estimate has the structure a decision needs: enough batches in all,
        and per role order; with periods long against the wander's time scale, two periods of
        each order (the wander between one period of each is only assumed, not measured)."""
        enough = est.n_plus + est.n_minus >= self.min_batches and (
            not self.crossover or min(est.n_plus, est.n_minus) >= self.min_per_order
        )
        comp = est.period
        if comp is not None and enough and min(comp.periods_plus, comp.periods_minus) < 2:
            enough = not (long_periods and any(w.sd > 0 for w in self.wanders()))
        return enough

    def long_periods(self, ev: Evidence) -> bool:
        """Whether the periods so far are long against the wander's time scale."""
        taus = [w.tau_s for w in self.wanders() if w.sd > 0]
        if ev.period_span is None or not taus:
            return True
        span = ev.period_span[:, 1] - ev.period_span[:, 0]
        longest = float(np.nanmax(span)) if np.isfinite(span).any() else 0.0
        return longest >= PERIOD_SHARE_OF_WANDER * min(taus)

    def early_interval(self, ev: Evidence) -> tuple[float, float, float, float] | None:
        """(mean, half-width, widening, batches) of the one-role-order estimate on the log
        scale: the mean of the batch means estimates effect + host bias; its confidence
        sequence is widened by the bias bound on both sides. ``None`` when too few batches."""
        assert self.setup is not None, "start() first"
        est = stats.plain_estimate(ev.batch_d, ev.batch_period)
        if est is None:
            return None
        self.last_bandwidth = est.bandwidth
        hw = stats.cs_halfwidth(
            est.se, est.n_eff, self.alpha_early(), self.n_opt(ev.batch_size), df=est.df
        )
        return est.mean, hw, math.log1p(self.max_host_bias), float(ev.batch_d.size)

    def _look_early(self, ev: Evidence) -> Verdict:
        rel = ev.direction
        got = self.early_interval(ev)
        if got is None:
            return Verdict.undecided(to_relative(float(np.mean(ev.batch_d)), rel))
        mean, hw, widen, n = got
        lo, hi = mean - hw - widen, mean + hw + widen
        v_est, v_lo, v_hi = to_relative(mean, rel), to_relative(lo, rel), to_relative(hi, rel)
        decision: Decision | None = None
        if n >= self.early_min_batches:
            if v_lo > 0:
                decision = Decision.BETTER
            elif v_hi < 0:
                decision = Decision.WORSE
        if decision is None:
            # not decided: report the one-order interval unbounded, as before the crossover
            return Verdict(None, v_est, -math.inf, math.inf)
        detail = (
            f"no crossover: estimate includes the host bias, assumed within "
            f"±{self.max_host_bias * 100:.2f} %"
        )
        return Verdict(decision, v_est, v_lo, v_hi, detail, early=True)

    def early_promising(self, ev: Evidence, max_batches: int) -> bool:
        """Whether the early path could decide if the first period ran to ``max_batches``
        batches: the point estimate lies beyond the bias bound and the interval, shrinking
        like 1/sqrt(batches), would then clear it. The driver extends the first period (up
        to a full period) only while this holds; the confidence sequence is valid at any
        data-dependent stopping time, so extending on this criterion costs no coverage."""
        if not self.early or self.setup is None or ev.batch_d.size >= max_batches:
            return False
        assert self.setup is not None
        est = stats.plain_estimate(ev.batch_d, ev.batch_period)
        if est is None:
            return False
        n = float(ev.batch_d.size)
        # projected half-width at max_batches: the standard error shrinking like
        # 1/sqrt(batches), the boundary (and its Student-t correction) at that time
        hw = stats.cs_halfwidth(
            est.se * math.sqrt(n / max_batches),
            float(max_batches),
            self.alpha_early(),
            self.n_opt(ev.batch_size),
            df=max_batches - 1,
        )
        return abs(est.mean) - math.log1p(self.max_host_bias) > hw

    def bias_interval(
        self, alpha: float = 0.05, *, wander: bool = False
    ) -> tuple[float, float, float] | None:
        """(bias, low, high) on the log scale (``dir * log(host 1 / host 0)``) from the latest
        crossover estimate, with a confidence sequence (valid over the looks) at ``alpha``.
        With ``wander``, the interval of the constant bias under the slow wander (its average
        over the periods moves with it: what a calibration reports); without, of the bias
        during this comparison (the host-bias check against the bound, as before)."""
        est = self.last_estimate
        se = est.bias_se if wander and est is not None else (est.bias_se_within if est else 0.0)
        if est is None or not math.isfinite(se):
            return None
        hw = stats.cs_halfwidth(
            se, est.n_eff, alpha, self.n_opt(self.last_batch_size or 1), df=est.df
        )
        return est.bias, est.bias - hw, est.bias + hw

    def method(self) -> str:
        design = "crossover-abba" if self.crossover else "no-crossover"
        b = self.last_batch_size or (self.setup.batch_size if self.setup else 0)
        alpha = (
            f"alpha split early {self.early_alpha_share:g} / crossover "
            f"{1 - self.early_alpha_share:g}"
            if self.early
            else "no early path"
        )
        cov = f", CUPED on {self.covariate}" if self.covariate else ""
        if self.equivalence == "sprt":
            cov += ", equivalence by two one-sided SPRTs"
        if self.futility is not None:
            cov += f", futility stop at {pct(self.futility)} (one-sided SPRT)"
        if self.noise is not None:
            cov += (
                f", noise pooled with {self.noise_source}'s (lrv {self.noise.lrv:.3g} per "
                f"window, {self.noise.df:.0f} df)"
            )
        return (
            f"{self.name}: asymptotic confidence sequence, {design}, batch means b={b} (final), "
            f"Bartlett HAC bandwidth {self.last_bandwidth:.2f} (Newey-West 1994), {alpha}"
            f"{cov}, {self._warmup_method()}"
        )

    def _warmup_method(self) -> str:
        if self.transient == "fit" and self.crossover:
            note = f": {self.transient_note}" if self.transient_note else ""
            return f"warm-up: minimum discarded, transient fitted jointly over all applies{note}"
        return "warm-up mser5 per host, discarded to its end"


class CalibrationRule(ConfidenceSequenceRule):
    """A/A pair calibration (:func:`musku.abtest.calibrate.calibrate_pair`): crossover, no
    early path, no effect decision. The host bias's interval includes the slow wander's part
    (the bias's *average* over the calibration moves with it; the ``wander_sd`` /
    ``wander_tau_s`` prior's exact OU variance of that average over the periods' spans: without
    it the 95 % interval covered the true bias in 65-76 % of simulated calibrations). Stops
    (NO_DIFFERENCE) after ``min_batches`` once the interval is within ``precision``
    (relative) of the estimate, or once its within-period noise alone is (what is left is the
    wander's average, which only hours more narrow: said in the detail)."""

    name = "calibrate"
    check_bias = False  # it measures the bias; there is no bound to hold it to yet
    pools_noise = False  # it measures the noise too

    def __init__(
        self,
        *,
        seed: int | None = None,
        precision: float = 0.0025,
        wander_sd: float = WANDER_SD,
        wander_tau_s: float = WANDER_TAU_S,
    ) -> None:
        super().__init__(
            seed=seed,
            early=False,
            covariate=COVARIATE,
            wander_sd=wander_sd,
            wander_tau_s=wander_tau_s,
            # an A/A swaps nothing after its first apply: its warm-up is discarded as before
            transient="discard",
        )
        if not (isinstance(precision, int | float) and 0.0 < precision < 0.5):
            raise InputError(f"calibrate: precision = {precision!r} must be in (0, 0.5)")
        self.precision = float(precision)
        self.last_evidence: Evidence | None = None
        self.last_detail = ""
        self.wander_part = 0.0  # relative half-width the wander adds at the last look

    def noise_measured(self) -> tuple[float, float] | None:
        """(long-run variance of one window's log-ratio, degrees of freedom) the A/A
        measured: the Bartlett HAC variance (Newey-West bandwidth) of its batch means around
        each **period's** mean, times the batch size, on the batches less the periods. Around
        each period's mean, not each role order's as a comparison's own estimate is: over
        the calibration's hours the role orders' residuals hold the host bias's slow wander
        (0.0061 per window on the shipped model against a 40-minute comparison's 0.0047),
        which the between-period component accounts for separately. None before an
        estimate."""
        ev = self.last_evidence
        if ev is None or ev.batch_d.size < 8:
            return None
        y = np.asarray(ev.batch_d, dtype=float)
        ids, inv = np.unique(np.asarray(ev.batch_period), return_inverse=True)
        df = y.size - ids.size
        if df < 1:
            return None
        resid = y - (np.bincount(inv, weights=y) / np.bincount(inv))[inv]
        bw = max(1.0, stats.nw_bandwidth(resid))
        lrv = stats.hac_lrv(resid, bw) * y.size / df * ev.batch_size
        return (float(lrv), float(df)) if lrv > 0 else None

    def wander_measured(self) -> stats.Wander | None:
        """The slow wander of the host bias this A/A measured
        (:func:`musku.abtest.stats.measure_wander`) from its batch means' host-frame
        residuals ``sign * (y - effect)``, each batch placed at its share of its period's
        span (a period's batches are consecutive windows). None before an estimate."""
        ev, est = self.last_evidence, self.last_estimate
        if ev is None or est is None or ev.period_span is None or ev.batch_d.size < 16:
            return None
        y = np.asarray(ev.batch_d, dtype=float)
        sign = np.asarray(ev.batch_sign, dtype=float)
        per = np.asarray(ev.batch_period, dtype=np.int64)
        t = np.full(y.size, np.nan)
        for p in np.unique(per):
            idx = np.flatnonzero(per == p)
            t0, t1 = ev.period_span[p]
            t[idx] = t0 + (np.arange(idx.size) + 0.5) * (t1 - t0) / idx.size
        return stats.measure_wander(t, sign * (y - est.mean))

    def look(self, ev: Evidence) -> Verdict:
        self.last_evidence = ev
        v = super().look(ev)
        alpha = self.setup.alpha if self.setup else 0.05
        got = self.bias_interval(alpha, wander=True)
        est = self.last_estimate
        if got is None or est is None:
            return Verdict(None, v.estimate, v.ci_low, v.ci_high)
        bias, lo, hi = got
        enough = est.n_plus + est.n_minus >= self.min_batches and (
            min(est.n_plus, est.n_minus) >= self.min_per_order
        )
        hw = (hi - lo) / 2
        hw_within = stats.cs_halfwidth(
            est.bias_se_within, est.n_eff, alpha, self.n_opt(self.last_batch_size or 1), df=est.df
        )
        self.wander_part = max(0.0, math.expm1(hw) - math.expm1(hw_within))
        detail = f"host 1 vs host 0 bias {pct(math.expm1(bias * ev.direction))}"
        wd = self.wanders()[-1]
        if self.wander_part > 0:
            detail += (
                f", ±{math.expm1(hw) * 100:.2f} % of which the host bias's wander "
                f"({self.wander_source + ' ' if len(self.wanders()) > 1 else 'prior: '}sd "
                f"{wd.sd * 100:.2f} %, tau {wd.tau_s / 3600:.2f} h) adds "
                f"±{self.wander_part * 100:.2f} % to the noise's ±{math.expm1(hw_within) * 100:.2f} %"
            )
        self.last_detail = detail
        limit = math.log1p(self.precision)
        if enough and (hw <= limit or hw_within <= limit):
            return Verdict(Decision.NO_DIFFERENCE, v.estimate, v.ci_low, v.ci_high, detail)
        return Verdict(None, v.estimate, v.ci_low, v.ci_high, detail)


class NaivePairedRule(ConfidenceSequenceRule):
    """The confidence-sequence rule without crossover (host roles never swapped)."""

    name = "naive-paired"

    def __init__(self, *, seed: int | None = None, min_batches: int = 12) -> None:
        super().__init__(seed=seed, crossover=False, min_batches=min_batches)


class PaperWelchRule(DecisionRule):
    """The original muSKU method: unpaired Welch t-test on the A and B windows' (log) metric,
    95 %, re-checked every ``check_every`` windows, no crossover, fixed warm-up, cap 30,000.
    Its repeated looks and ignored host bias / autocorrelation are what musku fixes."""

    name = "welch"
    crossover = False
    detect_warmup = False

    def __init__(
        self,
        *,
        seed: int | None = None,
        check_every: int = 50,
        cap: int = 30_000,
        min_samples: int = 30,
    ) -> None:
        super().__init__(seed=seed)
        if check_every < 2 or cap < 10:
            raise InputError("welch rule: check_every must be >= 2 and cap >= 10")
        self.fixed_batch = check_every
        self.sample_cap = cap
        self.min_samples = min_samples

    def look(self, ev: Evidence) -> Verdict:
        assert self.setup is not None, "start() first"
        alpha = self.setup.alpha
        a = ev.direction * ev.log_a
        b = ev.direction * ev.log_b
        na, nb = a.size, b.size
        if na < 2 or nb < 2:
            return Verdict.undecided()
        va, vb = float(a.var(ddof=1)) / na, float(b.var(ddof=1)) / nb
        diff = float(b.mean() - a.mean())
        se = math.sqrt(va + vb)
        if se == 0.0:
            return Verdict.undecided(to_relative(diff, ev.direction))
        df = (va + vb) ** 2 / (va * va / (na - 1) + vb * vb / (nb - 1))
        q = stats.t_quantile(1 - alpha / 2, df)
        lo, hi = diff - q * se, diff + q * se
        decision: Decision | None = None
        if min(na, nb) >= self.min_samples:
            if lo > 0:
                decision = Decision.BETTER
            elif hi < 0:
                decision = Decision.WORSE
        r = ev.direction
        return Verdict(
            decision, to_relative(diff, r), to_relative(lo, r), to_relative(hi, r), "unpaired Welch"
        )

    def method(self) -> str:
        return f"{self.name}: unpaired Welch t-test, checked every {self.fixed_batch} windows"


RULES: dict[str, str] = {
    "cs": "musku.abtest.rules:ConfidenceSequenceRule",
    "naive-paired": "musku.abtest.rules:NaivePairedRule",
    "welch": "musku.abtest.rules:PaperWelchRule",
    "calibrate": "musku.abtest.rules:CalibrationRule",
}
"""Decision rule name -> ``module:Class``; any ``module:Class`` naming a
:class:`DecisionRule` subclass works too."""


def make_rule(rule: str | DecisionRule, *, seed: int | None = None, **options: Any) -> DecisionRule:
    """A fresh rule object from a registry name / ``module:Class``, or ``rule`` itself."""
    if isinstance(rule, DecisionRule):
        return rule
    cls = load(rule, RULES, kind="decision rule")
    if not (isinstance(cls, type) and issubclass(cls, DecisionRule)):
        raise InputError(f"decision rule {rule!r} is not a DecisionRule subclass")
    try:
        obj = cls(seed=seed, **options)
    except TypeError as exc:
        raise InputError(f"decision rule {rule!r}: {exc}") from None
    return obj
