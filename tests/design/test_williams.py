"""Williams designs: every arm once per host and per period in each square, and every ordered
pair of distinct successive arms equally often (first-order carry-over balance)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from musku.design.williams import squares, successions, williams
from musku.errors import InputError

PROPS = settings(max_examples=40, deadline=None)


@PROPS
@given(n=st.integers(min_value=2, max_value=16))
def test_each_arm_once_per_host_and_period_in_every_square(n: int) -> None:
    d = williams(n)
    assert d.shape == ((n if n % 2 == 0 else 2 * n), n)
    for sq in squares(d):
        assert sq.shape == (n, n)
        for p in range(n):
            assert sorted(sq[p].tolist()) == list(range(n))  # a period runs every arm once
        for h in range(n):
            assert sorted(sq[:, h].tolist()) == list(range(n))  # a host runs every arm once


@PROPS
@given(n=st.integers(min_value=2, max_value=16))
def test_carry_over_balanced(n: int) -> None:
    counts = successions(williams(n))
    pairs = {(a, b) for a in range(n) for b in range(n) if a != b}
    assert set(counts) == pairs  # never the same arm twice inside a square, every pair seen
    assert len(set(counts.values())) == 1  # ... equally often
    assert next(iter(counts.values())) == (1 if n % 2 == 0 else 2)


@PROPS
@given(n=st.integers(min_value=2, max_value=12))
def test_host_bias_and_period_effects_cancel(n: int) -> None:
    """Additive host + period effects: the difference of two arms' means over the design is
    exactly the arm effect."""
    rng = np.random.default_rng(n)
    d = williams(n)
    host = rng.normal(0, 1, n)
    period = rng.normal(0, 1, d.shape[0])
    effect = rng.normal(0, 1, n)
    y = host[None, :] + period[:, None] + effect[d]
    means = np.array([y[d == a].mean() for a in range(n)])
    np.testing.assert_allclose(means - means[0], effect - effect[0], atol=1e-12)


@pytest.mark.parametrize("bad", [0, 1, -3, 2.5, True, "4"])
def test_bad_arm_count(bad: object) -> None:
    with pytest.raises(InputError, match="Williams design"):
        williams(bad)  # type: ignore[arg-type]
