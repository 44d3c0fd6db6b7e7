"""Verdicts from alternating rounds: the median of per-round ratios (A over B, run back to back
in each round so the host's drift cancels), its bootstrap interval over rounds, and whether a
goal on the ratio is met, not met, or undecided at this noise (with the rounds that would
likely decide it).

A goal is decided only when the whole interval is on one side of its bound; a median alone is
never a verdict, nor is anything from fewer than MIN_ROUNDS rounds. The rounds needed assume the interval narrows as 1/sqrt(rounds), from the
half-width measured now to the distance between the median and the bound.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from musku.errors import InputError

UNDECIDED = "undecided at this noise"
# Fewer rounds cannot decide at 95 %: with n rounds all on one side of the bound, a sign test's
# two-sided p is 2 * 0.5^n, below 0.05 from n = 6 (the bootstrap interval of a median of 3 or 4
# rounds is just their range, and would claim more than it knows).
MIN_ROUNDS = 6
MAX_ROUNDS_SAID = 1000  # beyond this an extrapolated count means nothing but "far too noisy"


@dataclass(frozen=True)
class RoundsRatio:
    """The median of per-round ratios and its percentile-bootstrap interval."""

    ratios: tuple[float, ...]
    median: float
    low: float
    high: float
    level: float

    @property
    def rounds(self) -> int:
        return len(self.ratios)

    def __str__(self) -> str:
        return f"{self.median:.2f} [{self.low:.2f}, {self.high:.2f}]"


def median_ratio(
    ratios: Sequence[float], *, level: float = 0.95, draws: int = 4000, seed: int = 0
) -> RoundsRatio:
    """Median of ``ratios`` with the ``level`` percentile-bootstrap interval (rounds resampled
    with replacement). One round: the interval is that round alone (nothing to resample)."""
    xs = [float(x) for x in ratios]
    if not xs or not all(math.isfinite(x) and x > 0 for x in xs):
        raise InputError(f"ratios must be positive and finite, not {xs}")
    if not 0 < level < 1:
        raise InputError("level must be in (0, 1)")
    med = statistics.median(xs)
    if len(xs) == 1:
        return RoundsRatio(tuple(xs), med, med, med, level)
    rng = np.random.default_rng(seed)
    arr = np.asarray(xs)
    meds = np.median(arr[rng.integers(0, len(arr), size=(draws, len(arr)))], axis=1)
    tail = (1 - level) / 2
    lo, hi = np.quantile(meds, [tail, 1 - tail])
    return RoundsRatio(tuple(xs), med, float(lo), float(hi), level)


def verdict(r: RoundsRatio, direction: str, bound: float) -> str:
    """``met`` when the whole interval satisfies ``ratio <direction> bound`` (``<=`` or
    ``>=``), ``NOT met`` when none of it does, else ``undecided at this noise``."""
    if direction not in ("<=", ">="):
        raise InputError(f"direction is <= or >=, not {direction!r}")

    def ok(x: float) -> bool:
        return x <= bound if direction == "<=" else x >= bound

    if r.rounds < MIN_ROUNDS:
        return UNDECIDED
    if ok(r.low) and ok(r.high):
        return "met"
    if not ok(r.low) and not ok(r.high):
        return "NOT met"
    return UNDECIDED


def rounds_to_decide(r: RoundsRatio, bound: float) -> int | None:
    """Rounds that would likely put the interval on one side of ``bound`` (None: the median
    sits on the bound, or fewer than two rounds give no spread to extrapolate from)."""
    gap = abs(r.median - bound)
    if r.rounds < 2 or gap == 0:
        return None
    side = r.high - r.median if bound > r.median else r.median - r.low  # the side facing it
    if side < gap:
        return max(MIN_ROUNDS, r.rounds)  # decided by the interval (given enough rounds)
    return max(MIN_ROUNDS, r.rounds + 1, math.ceil(r.rounds * (side / gap) ** 2))


def describe(r: RoundsRatio, direction: str, bound: float) -> str:
    """One line: the ratio, the goal and the verdict (with the rounds needed when undecided)."""
    v = verdict(r, direction, bound)
    text = f"{r} over {r.rounds} rounds, goal {direction} {bound:g}x: {v}"
    if v == UNDECIDED:
        need = rounds_to_decide(r, bound)
        text += (
            f" (more than {MAX_ROUNDS_SAID} rounds: the noise swamps the difference)"
            if need is not None and need > MAX_ROUNDS_SAID
            else f" (about {need} rounds would decide it)"
            if need is not None and need > r.rounds
            else f" (fewer than {MIN_ROUNDS} rounds never decide)"
            if need is not None
            else " (the median sits on the bound: no number of rounds decides it)"
            if r.rounds >= 2
            else " (one round: no spread to judge by)"
        )
    return text
