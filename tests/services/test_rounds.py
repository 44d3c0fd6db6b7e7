"""Verdicts from alternating rounds (musku.services.rounds): never a verdict the data do not
support."""

from __future__ import annotations

import pytest

from musku.errors import InputError
from musku.services import rounds


def test_a_clear_gap_is_decided_both_ways() -> None:
    r = rounds.median_ratio([0.30, 0.32, 0.35, 0.31, 0.33, 0.34])
    assert r.low <= r.median <= r.high
    assert r.low >= 0.30 and r.high <= 0.35
    assert rounds.verdict(r, "<=", 0.5) == "met"
    assert rounds.verdict(r, ">=", 0.5) == "NOT met"
    assert rounds.rounds_to_decide(r, 0.5) == 6  # already decided


def test_a_wide_interval_is_undecided_with_the_rounds_needed() -> None:
    r = rounds.median_ratio([0.3, 0.7, 0.45, 0.9, 0.4, 0.6])
    assert rounds.verdict(r, "<=", 0.5) == rounds.UNDECIDED
    need = rounds.rounds_to_decide(r, 0.5)
    assert need is not None and need > r.rounds
    line = rounds.describe(r, "<=", 0.5)
    assert "undecided at this noise" in line and f"about {need} rounds" in line


def test_one_round_is_never_a_verdict() -> None:
    r = rounds.median_ratio([0.1])
    assert (r.low, r.median, r.high) == (0.1, 0.1, 0.1)
    assert rounds.verdict(r, "<=", 0.5) == rounds.UNDECIDED
    assert rounds.rounds_to_decide(r, 0.5) is None
    assert "one round" in rounds.describe(r, "<=", 0.5)


def test_the_bootstrap_is_seeded() -> None:
    xs = [1.1, 0.9, 1.3, 1.0, 1.2, 0.95]
    assert rounds.median_ratio(xs) == rounds.median_ratio(xs)


@pytest.mark.parametrize("bad", [[], [0.0], [-1.0], [float("inf")], [float("nan")]])
def test_bad_ratios_are_refused(bad: list[float]) -> None:
    with pytest.raises(InputError):
        rounds.median_ratio(bad)


def test_too_few_rounds_never_decide_however_clear() -> None:
    r = rounds.median_ratio([0.30, 0.31, 0.32])
    assert r.high < 0.5
    assert rounds.verdict(r, "<=", 0.5) == rounds.UNDECIDED
    assert rounds.rounds_to_decide(r, 0.5) == rounds.MIN_ROUNDS
    assert "about 6 rounds" in rounds.describe(r, "<=", 0.5)


def test_hopeless_noise_is_said_so_not_counted() -> None:
    r = rounds.median_ratio([0.18, 0.5, 0.93, 0.95, 7.6, 10.9])
    need = rounds.rounds_to_decide(r, 1.05)
    assert need is not None and need > rounds.MAX_ROUNDS_SAID
    assert "noise swamps the difference" in rounds.describe(r, "<=", 1.05)
