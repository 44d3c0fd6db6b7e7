"""How long a crossover period should be: the expected host time to a decision, minimised.

A comparison alternates the hosts' roles every period (:mod:`musku.abtest.driver`). Each swap
costs host time that measures nothing (the re-apply, reboots, the warm-up discarded); longer
periods mean fewer swaps. But the crossover cancels only a *constant* host bias: the bias's
slow wander (an Ornstein-Uhlenbeck process of sd ``w`` and time constant ``tau``,
:class:`musku.abtest.stats.Wander`) changes between periods, and that change lands in the
estimate, more of it the longer the periods. This module weighs the two.

The model (log scale; one window is ``dt`` seconds; a period ``L`` steady windows; a swap
``G`` host seconds)::

    Var(estimate) = sigma^2 / N + w^2 g(L) L / N        (N steady windows, N / L periods)

``sigma^2`` is the per-window long-run variance of the log-ratio (the pilot's), and
``g(L)`` the variance per period of the alternating sum of the wander's period means, in
units of ``w^2`` (an infinite A-B-A-B chain of periods ``L dt`` long, ``G`` apart; exact
for the OU kernel, :func:`musku.abtest.stats.ou_mean_covariance`)::

    g = D(x) - 2 F(x)^2 e^-y / (1 + e^-(x + y)),   x = L dt / tau,  y = G / tau,
    D(x) = 2 (x - 1 + e^-x) / x^2,  F(x) = (1 - e^-x) / x

(``g ~ x / 6`` for short periods: the wander's change between neighbours grows with their
length; the ABBA balance cancels the rest). A decision at an effect of twice ``min_effect``
needs the interval's half-width, about :data:`musku.abtest.structure.CS_RADIUS` standard
errors, below ``min_effect``: ``N(L) = (sigma^2 + w^2 g(L) L) / v``, ``v = (ln(1 +
min_effect) / CS_RADIUS)^2``, and at least the rule's first decision point (both role
orders, its minimum batches) and, for periods long against ``tau``, two periods per role
order (:data:`musku.abtest.rules.PERIOD_SHARE_OF_WANDER`). Then::

    host time(L) = N(L) dt + G (1 + max(0, N(L) - first(L)) / L)

(the first apply and warm-up, then a swap per full period after the half-length first one,
counted continuously: the decision falls anywhere in a period). :func:`choose` searches ``L``
over whole batches between the structure's limits (at least four batches, at most a sixth
of the sample cap), no longer than the fixed rule's period or :data:`AUTO_WANDER_SHARE` of
the wander's time constant, whichever is longer (the wander prior does not license longer
periods: measured), and takes the cheapest, the shortest among equals. An A/A comparison's
swaps apply nothing and wait for no transient: the driver prices them at 0 s (the shortest
period then wins). Known optima: without
swap cost (``G = 0``) the shortest period (the wander term only grows with ``L``); without
wander (``w = 0``) the longest (``N`` is fixed, the swaps only fall).

``[statistics] period = "auto"`` uses it; ``"swap"`` (the default) keeps the fixed rule,
periods of :data:`musku.abtest.driver.SWAP_OVERHEAD` x the swap cost.
"""

from __future__ import annotations

import functools
import math
import statistics
from collections.abc import Iterable
from dataclasses import dataclass

from musku.abtest.structure import Structure
from musku.errors import InputError

PERIOD_MODES = ("swap", "auto")
"""``[statistics] period``: ``swap`` (periods of SWAP_OVERHEAD x the swap cost: the rule
before issue 30 item 4) or ``auto`` (the length that minimises the expected host time)."""

GRID_MAX = 240  # candidate lengths searched, at most (whole batches, geometric beyond it)

AUTO_WANDER_SHARE = 0.05
"""The longest period ``auto`` may choose, as a share of the wander's time constant, unless
the fixed rule's own period is longer (then up to that: ``auto`` never lengthens a period
past ``max(fixed, share x tau)``). The cost model's wander is the prior's one OU process;
the bench's A/A rows (docs/abtest.md, "Period length from a cost model") showed periods of
~0.18 tau (640-680 s at the 1 h prior) letting faster host-bias changes than the prior
describes into the estimate (16.7 % false positives in two rows) while the fixed rule's
~190 s (0.05 tau) periods stayed honest: so ``auto`` shortens periods where swaps are dear
(long warm-ups, reboots) but lengthens them no further than the fixed rule's measured
honest length."""
CS_RADIUS = 3.0  # half-width / standard error where the sequence decides (structure.CS_RADIUS)


def check_mode(value: object) -> str:
    """``value`` if it is a period mode, else a one-line :class:`~musku.errors.InputError`."""
    if isinstance(value, str) and value in PERIOD_MODES:
        return value
    raise InputError(
        f"statistics period = {value!r} is invalid: must be one of {', '.join(PERIOD_MODES)}"
    )


def wander_per_period(x: float, y: float) -> float:
    """``g``: the variance per period (units of the wander's variance) of an alternating
    chain of OU period means, periods ``x`` time constants long and ``y`` apart."""
    if x <= 0.0:
        d, f = 1.0, 1.0
    elif x < 1e-4:
        d, f = 1.0 - x / 3.0 + x * x / 12.0, 1.0 - x / 2.0 + x * x / 6.0
    else:
        d = 2.0 * (x - 1.0 + math.exp(-x)) / (x * x)
        f = -math.expm1(-x) / x
    return max(0.0, d - 2.0 * f * f * math.exp(-y) / (1.0 + math.exp(-(x + y))))


@dataclass(frozen=True)
class PeriodCost:
    """What the expected host time of one comparison depends on (see the module docstring).

    ``noise_lrv``: per-window long-run variance of the log-ratio; ``swap_s``: host seconds a
    swap costs (apply, reboots, warm-up discarded); ``wander_sd`` (relative) and
    ``wander_tau_s``: the host bias's slow wander; ``first`` maps a period length to the
    first (half) period's steady windows, ``minimum`` to the steady windows of the rule's
    first possible decision (both from :class:`musku.abtest.structure.Structure`)."""

    interval_s: float
    noise_lrv: float
    min_effect: float
    swap_s: float
    wander_sd: float
    wander_tau_s: float
    long_share: float = 1.0  # periods >= this x tau need two periods per role order
    max_share: float = AUTO_WANDER_SHARE  # no longer than max(fixed, this x tau): see there

    def windows(self, period: int, minimum: int = 0) -> float:
        """Steady windows expected to a decision with periods of ``period`` windows."""
        v = (math.log1p(self.min_effect) / CS_RADIUS) ** 2
        n = self.noise_lrv / v
        if self.wander_sd > 0.0 and self.wander_tau_s > 0.0:
            x = period * self.interval_s / self.wander_tau_s
            y = self.swap_s / self.wander_tau_s
            n += self.wander_sd**2 * wander_per_period(x, y) * period / v
        return max(n, float(minimum))

    def longest(self, fixed: int) -> float:
        """The longest period (windows) :func:`choose` may take: the fixed rule's, or
        :attr:`max_share` of the wander's time constant when that is longer; unbounded
        without wander."""
        if not (self.wander_sd > 0.0 and self.wander_tau_s > 0.0):
            return math.inf
        return max(float(fixed), self.max_share * self.wander_tau_s / self.interval_s)

    def long(self, period: int) -> bool:
        """Whether the rule needs two periods per role order at this length."""
        return (
            self.wander_sd > 0.0 and period * self.interval_s >= self.long_share * self.wander_tau_s
        )

    def host_s(self, period: int, first: int, minimum: int = 0) -> float:
        """Expected host seconds to a decision: steady windows plus every swap's cost."""
        floor = minimum
        if self.long(period):
            floor = max(floor, first + 3 * period + 1)
        n = self.windows(period, floor)
        swaps = 1.0 + max(0.0, n - first) / max(1, period)
        return n * self.interval_s + self.swap_s * swaps


@dataclass(frozen=True)
class PeriodChoice:
    """The period chosen (steady windows), its expected host seconds, the fixed rule's
    period and expected host seconds for comparison, and why (one line)."""

    windows: int
    host_s: float
    fixed_windows: int
    fixed_host_s: float
    why: str


def candidates(lo: int, hi: int, batch: int) -> list[int]:
    """Whole batches from ``lo`` to ``hi`` (both rounded up to batches): every one, or a
    geometric grid of about :data:`GRID_MAX` when there are more."""
    b = max(1, batch)
    lo_k = max(1, math.ceil(lo / b))
    hi_k = max(lo_k, math.ceil(hi / b))
    if hi_k - lo_k + 1 <= GRID_MAX:
        return [k * b for k in range(lo_k, hi_k + 1)]
    ratio = (hi_k / lo_k) ** (1.0 / (GRID_MAX - 1))
    ks = sorted({min(hi_k, max(lo_k, round(lo_k * ratio**i))) for i in range(GRID_MAX)})
    return [k * b for k in ks]


def choose(
    cost: PeriodCost,
    lengths: Iterable[int],
    first: dict[int, int],
    minimum: dict[int, int],
    fixed: int,
) -> PeriodChoice:
    """The cheapest of ``lengths`` under ``cost`` (the shortest among equals) no longer than
    :meth:`PeriodCost.longest` (the fixed rule's length or a small share of the wander's time
    constant: the wander prior does not license longer ones); ``first`` and ``minimum`` give
    each length's first period and first decision point (steady windows), ``fixed`` is the
    fixed rule's length (in ``lengths`` or not) for the comparison."""
    best: tuple[float, int] | None = None
    limit = cost.longest(fixed)
    allowed = [n for n in lengths if n <= limit]
    if not allowed:  # every candidate longer: the shortest of them
        allowed = sorted(lengths)[:1]
    for n in allowed:
        t = cost.host_s(n, first[n], minimum[n])
        if best is None or t < best[0] * (1.0 - 1e-12):
            best = (t, n)
    if best is None:
        raise ValueError("no period lengths to choose from")
    t_fixed = cost.host_s(fixed, first[fixed], minimum[fixed])
    t, n = best
    dt = cost.interval_s
    wander = (
        f"wander {cost.wander_sd * 100:.2f} % over {cost.wander_tau_s / 60:.0f} min"
        if cost.wander_sd > 0 and cost.wander_tau_s > 0
        else "no wander"
    )
    why = (
        f"period {n * dt:,.0f} s (auto): expected {t / 3600:.2f} h to a decision vs "
        f"{t_fixed / 3600:.2f} h at the 3x-swap {fixed * dt:,.0f} s (swap {cost.swap_s:,.0f} s, "
        f"noise {math.sqrt(cost.noise_lrv) * 100:.2f} %/window, {wander})"
    )
    return PeriodChoice(n, t, fixed, t_fixed, why)


def choose_in(structure: Structure, batch: int, cost: PeriodCost, fixed: int) -> PeriodChoice:
    """The cheapest period for a comparison of ``structure`` with batches of ``batch``
    windows: every whole-batch length from four batches to the structure's longest period
    (:func:`candidates`), each with its first (half) period (at least the probe) and the
    rule's first decision point; ``fixed`` is the fixed rule's length, reported beside it."""
    b = max(1, batch)
    lengths, first, minimum = _layout(structure, b)
    if fixed not in first:
        lengths, first, minimum = _layout(structure, b, fixed)
    return choose(cost, lengths, first, minimum, fixed)


@functools.lru_cache(maxsize=64)
def _layout(
    structure: Structure, b: int, extra: int | None = None
) -> tuple[tuple[int, ...], dict[int, int], dict[int, int]]:
    """The candidate lengths of :func:`choose_in` and each one's first period and first
    decision point: they depend on the structure and the batch only (a comparison asks
    again at every period start), so they are computed once (the caller never mutates)."""
    lo = 4 * b
    lengths = candidates(lo, max(lo, structure.period_max), b)
    if extra is not None and extra not in lengths:
        lengths.append(extra)
    probe = b * (structure.probe_n // b)
    first = {n: max(structure.first_period(b, n), probe) for n in lengths}
    minimum = {n: structure.first_decision(b, n) for n in lengths}
    return tuple(lengths), first, minimum


def summary(mode: str, results: Iterable[object]) -> str:
    """One line for a sweep's summary: the period rule, the lengths its comparisons used and,
    under ``auto``, the expected host time against the fixed rule's (the median comparison's
    reason); empty when no result recorded a period."""
    got = [r for r in results if getattr(r, "period_s", None) is not None]
    if not got:
        return ""
    secs = sorted(float(getattr(r, "period_s", 0.0)) for r in got)
    span = f"{secs[0]:,.0f}-{secs[-1]:,.0f} s" if secs[0] != secs[-1] else f"{secs[0]:,.0f} s"
    line = (
        f"crossover periods ({mode}): median {statistics.median(secs):,.0f} s, {span} over "
        f"{len(secs)} comparisons"
    )
    if mode != "auto":
        return line + '; periods of 3x the swap cost (statistics period = "swap")'
    whys = [str(getattr(r, "period_why", "")) for r in got if getattr(r, "period_why", "")]
    if whys:
        mid = sorted(got, key=lambda r: float(getattr(r, "period_s", 0.0)))[len(got) // 2]
        why = str(getattr(mid, "period_why", "")) or whys[0]
        line += f"; chosen to minimise the expected host time to a decision, e.g. {why}"
    return line
