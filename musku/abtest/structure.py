"""The tester's minimum structure, derived from what a comparison is configured with.

The driver (:mod:`musku.abtest.driver`) needs a few lengths before it has seen any data: how
many windows it searches for the end of the warm-up transient (the probe), the largest batch,
the longest period, and where the first crossover decision can come. They used to be constants
tuned for the simulator's settings (1 s windows, a 30,000-window cap): a 180-window probe, a
batch of up to a twelfth of the cap. With short windows and a small cap (a real host, where
every window costs seconds) the probe alone filled the cap before the first swap, and every
comparison ended ``inconclusive`` with no crossover interval at all.

Here each length is derived from the window length, the swap cost and the sample cap, so that
the cap always holds a probe, both role orders and the rule's minimum number of batches:

- **probe** ``min(PROBE_MAX, max(PROBE_FLOOR, period_max / 2))`` windows: 180 at a big cap
  (unchanged), at least the 20 points MSER-5 and the transient fit need;
- **batch** at most ``cap / (2 x min_batches)`` windows: the rule's minimum batches fit twice;
- **period** at most ``cap / PERIODS_IN_CAP`` windows (and at least 4 batches), so the cap
  holds several swaps;
- **first decision**: the steady windows by which the rule has ``min_batches`` batches with
  ``min_per_order`` of each role order (:meth:`Structure.first_decision`).

:func:`feasibility` says, before anything runs, whether the cap can allow a decision at
``min_effect`` at all: structurally (the first decision point must fit in the cap) and, when
a per-window noise figure is known (the simulator's model, or a backend's documented guess),
statistically (the confidence sequence's half-width at the cap must be below ``min_effect``),
and with which cap it would.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

from musku.domain import StatsSettings

PROBE_MAX = 180  # windows searched for the end of the transient, at most (the simulator's)
PROBE_FLOOR = 20  # ... and at least: MSER-5 needs 4 batches of 5, the transient fit 20 points
PERIODS_IN_CAP = 6  # a period is at most this fraction of the cap: several swaps fit in it
MIN_BATCHES = 12  # the cs rule's defaults (musku.abtest.rules.ConfidenceSequenceRule)
MIN_PER_ORDER = 4
FIRST_PERIOD_SHARE = 0.5  # the first period's length / a full period's (A-B-B-A half-periods)
CS_RADIUS = 3.0  # a confidence sequence is ~3 standard errors wide where it is tightest


@dataclass(frozen=True)
class Structure:
    """The lengths (in windows) a comparison starts with; see the module docstring."""

    interval_s: float
    cap: int
    warm_n: int  # blind minimum warm-up after every apply
    probe_n: int  # windows searched for the end of the transient after it
    max_batch: int  # the batch size never exceeds this
    period_max: int  # a full period's steady windows, at most
    min_batches: int
    min_per_order: int

    def period_length(self, batch: int, swap_cost_s: float, overhead: float) -> int:
        """Steady windows per full period: ``overhead`` x the swap cost in windows, at least
        four batches, at most :attr:`period_max` (rounded up to whole batches)."""
        b = max(1, batch)
        lo = 4 * b
        hi = max(lo, self.period_max)
        n = min(max(overhead * swap_cost_s / self.interval_s, lo), hi)
        return int(math.ceil(n / b) * b)

    def first_period(self, batch: int, period_len: int) -> int:
        """Steady windows of the first (half) period, whole batches, at least two."""
        b = max(1, batch)
        first = FIRST_PERIOD_SHARE * period_len
        return max(2 * b, int(math.ceil(first / b) * b))

    def first_decision(self, batch: int, period_len: int) -> int:
        """Steady windows at the first look where the crossover rule may decide: ``batch``
        windows a batch, the first period at least the probe's length (the probe's steady
        windows all count in it), then full periods alternating the role order."""
        b = max(1, batch)
        per = [max(self.first_period(b, period_len), b * (self.probe_n // b)), period_len]
        counts = [0, 0]
        windows = 0
        p = 0
        while True:
            room = per[min(p, 1)] // b
            own, other = counts[p % 2], counts[1 - p % 2]
            if room > 0 and other >= self.min_per_order:
                # the first batch of this period that completes both counts (a period per
                # step, not a batch: the period search asks this for hundreds of lengths)
                k = max(1, self.min_batches - own - other, self.min_per_order - own)
                if k <= room:
                    return windows + k * b
            counts[p % 2] += room
            windows += room * b
            p += 1

    def windows_to_first_decision(self, samples: int, batch: int, period_len: int) -> int:
        """About how many more steady windows before the rule can first decide."""
        return max(0, self.first_decision(batch, period_len) - samples)


def derive(
    stats: StatsSettings,
    *,
    cap: int | None = None,
    min_batches: int = MIN_BATCHES,
    min_per_order: int = MIN_PER_ORDER,
) -> Structure:
    """The structure for ``stats`` (``cap`` overrides the spec's sample cap, e.g. a rule's)."""
    interval = float(stats.sample_interval_s)
    n = int(cap if cap is not None else stats.sample_cap)
    warm_n = int(math.ceil(float(stats.warmup_s) / interval - 1e-9))
    period_max = max(4, n // PERIODS_IN_CAP)
    probe_n = min(PROBE_MAX, max(PROBE_FLOOR, period_max // 2))
    max_batch = max(1, n // (2 * max(1, min_batches)))
    return Structure(
        interval_s=interval,
        cap=n,
        warm_n=warm_n,
        probe_n=probe_n,
        max_batch=max_batch,
        period_max=period_max,
        min_batches=min_batches,
        min_per_order=min_per_order,
    )


@dataclass(frozen=True)
class Feasibility:
    """Whether a comparison's cap can allow a decision at ``min_effect`` (``ok``), why not
    (``reason``, one line), and the smallest cap that would (``cap_needed``; None: the
    structure alone was checked and it fits)."""

    ok: bool
    reason: str
    first_decision: int  # steady windows at the earliest possible decision (batch 1)
    cap_needed: int | None = None
    noise_sd: float | None = None  # per-window sd of the log-ratio assumed (None: unknown)
    halfwidth_at_cap: float | None = None  # relative half-width at the cap (noise known)

    def to_json(self) -> dict[str, object]:
        return {
            "ok": self.ok,
            "reason": self.reason,
            "first_decision_windows": self.first_decision,
            "cap_needed": self.cap_needed,
            "noise_sd": self.noise_sd,
            "halfwidth_at_cap": self.halfwidth_at_cap,
        }


def halfwidth(n: int, noise_sd: float, stats: StatsSettings) -> float:
    """Relative half-width of the cs rule's crossover confidence sequence after ``n`` windows
    of per-window log-ratio sd ``noise_sd`` (independent windows, batch 1): what the
    interval is at best at ``n``; real windows correlate and batch, so it is wider."""
    from musku.abtest import stats as st  # lazy: scipy

    if n < 3:
        return math.inf
    alpha = (1.0 - stats.confidence) * 0.8  # the crossover sequence's share with an early path
    me = math.log1p(stats.min_effect)
    n_opt = min(max((CS_RADIUS * noise_sd / me) ** 2, float(MIN_BATCHES)), float(n))
    hw = st.cs_halfwidth(noise_sd / math.sqrt(n), float(n), alpha, n_opt, df=n - 2)
    return math.expm1(hw)


def feasibility(stats: StatsSettings, noise_sd: float | None = None) -> Feasibility:
    """Can ``stats.sample_cap`` allow a decision at ``stats.min_effect``? Structurally: the
    rule's first decision point (batch 1, the shortest periods) must fit in the cap. With a
    per-window noise figure: the best-case interval at the cap must be narrower than
    ``min_effect`` (the width that decides ``no_difference`` for no effect, and ``better`` /
    ``worse`` for an effect of twice ``min_effect``); else the cap that would."""
    s = derive(stats)
    first = s.first_decision(1, s.period_length(1, 0.0, 1.0))
    me = stats.min_effect
    if first > s.cap:
        need = stats.sample_cap
        while derive(_with_cap(stats, need)).first_decision(1, 4) > need:
            need += 1
        return Feasibility(
            False,
            f"sample_cap = {stats.sample_cap} is too small for any decision: the first "
            f"possible decision needs {first} windows (both role orders, "
            f"{s.min_batches} batches); a cap of at least {need} would allow one",
            first,
            need,
        )
    if noise_sd is None or not math.isfinite(noise_sd) or noise_sd <= 0:
        return Feasibility(True, "", first)
    hw = halfwidth(s.cap, noise_sd, stats)
    if hw < me:
        return Feasibility(True, "", first, None, noise_sd, hw)
    # the smallest cap whose best-case half-width is below min_effect (doubling, then bisect)
    lo, hi = s.cap, s.cap
    while halfwidth(hi, noise_sd, stats) >= me and hi < 10**9:
        lo, hi = hi, hi * 2
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if halfwidth(mid, noise_sd, stats) >= me:
            lo = mid
        else:
            hi = mid
    return Feasibility(
        False,
        f"sample_cap = {stats.sample_cap} cannot decide effects near min_effect "
        f"{me * 100:.2f} %: with a noise of about {noise_sd * 100:.1f} % per "
        f"{stats.sample_interval_s:g} s window the interval at the cap is at best "
        f"±{hw * 100:.1f} %, so only effects beyond about that get a decision; a cap of "
        f"about {hi} windows would decide at min_effect",
        first,
        hi,
        noise_sd,
        hw,
    )


def _with_cap(stats: StatsSettings, cap: int) -> StatsSettings:
    return replace(stats, sample_cap=cap)
