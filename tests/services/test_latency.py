"""Pooled latency histograms and bootstrap intervals for a ratio of p99s (musku.services.latency),
on histograms bucketed like the load generator's (128 linear sub-buckets per power of two)."""

from __future__ import annotations

import math

import numpy as np
import pytest

from musku.errors import InputError
from musku.services.latency import Latencies, quantile_ratio


def upper_bound_ns(v: int) -> int:
    """The load generator's bucket upper bound for a value in ns (histogram.cc's layout)."""
    if v < 128:
        return v
    shift = v.bit_length() - 7  # 7 significant bits: 64 buckets per power of two
    return (((v >> shift) + 1) << shift) - 1


def run_of(samples_us: np.ndarray) -> dict:
    """A load generator result's ``total`` for these latencies."""
    buckets: dict[int, int] = {}
    for v in (samples_us * 1e3).astype(np.int64):
        ub = upper_bound_ns(int(v))
        buckets[ub] = buckets.get(ub, 0) + 1
    rows = [[k / 1e3, n] for k, n in sorted(buckets.items())]
    return {"ok": len(samples_us), "latency_us": {"buckets": rows}}


def test_quantile_is_the_bucket_of_the_ceil_rank() -> None:
    lat = Latencies.of({"latency_us": {"buckets": [[10.0, 50], [20.0, 49], [300.0, 1]]}})
    assert lat.n == 100
    assert lat.quantile(0.5) == 10.0  # the 50th value
    assert lat.quantile(0.51) == 20.0
    assert lat.quantile(0.99) == 20.0  # the 99th
    assert lat.quantile(0.995) == 300.0 and lat.quantile(1.0) == 300.0


def test_pooling_runs_adds_their_buckets() -> None:
    rng = np.random.default_rng(1)
    a, b = rng.lognormal(6, 0.5, 3000), rng.lognormal(6.3, 0.5, 1000)
    pooled = Latencies.of(run_of(a), run_of(b))
    assert pooled.n == 4000
    parts = Latencies.pool([Latencies.of(run_of(a)), Latencies.of(run_of(b))])
    assert np.array_equal(parts.upper_us, pooled.upper_us)
    assert np.array_equal(parts.counts, pooled.counts)
    both = np.concatenate([a, b])
    for q in (0.5, 0.9, 0.99):
        exact = float(np.sort(both)[math.ceil(q * len(both)) - 1])
        assert exact <= pooled.quantile(q) <= exact * 1.017  # bucket upper bound: <= 1.6 % over


def test_missing_buckets_are_an_input_error() -> None:
    with pytest.raises(InputError, match="without latency buckets"):
        Latencies.of({"latency_us": {"p99": 1.0}})
    with pytest.raises(InputError):
        quantile_ratio(Latencies.of(run_of(np.ones(5))), Latencies.of(run_of(np.ones(5))), q=0)


def test_interval_covers_the_true_ratio_about_95_percent_of_the_time() -> None:
    """Two runs of the same tail-heavy distribution, 600 requests each (a 20 QPS training point
    of 30 s): the 95 % interval for p99(a)/p99(b) must contain 1 in about 95 % of trials."""
    rng = np.random.default_rng(7)
    trials, covered, widths = 200, 0, []
    for t in range(trials):
        a = rng.lognormal(0, 0.6, 600) * 500
        b = rng.lognormal(0, 0.6, 600) * 500
        r = quantile_ratio(Latencies.of(run_of(a)), Latencies.of(run_of(b)), draws=400, seed=t)
        covered += r.low <= 1.0 <= r.high
        widths.append(r.high - r.low)
    assert 0.88 <= covered / trials <= 0.995, covered
    # and that is wide: a 5 % difference cannot be resolved at this size
    assert float(np.median(widths)) > 0.2


def test_a_real_difference_is_resolved_with_enough_requests() -> None:
    rng = np.random.default_rng(3)
    a = rng.lognormal(0, 0.5, 20000) * 1.3 * 400
    b = rng.lognormal(0, 0.5, 20000) * 400
    r = quantile_ratio(Latencies.of(run_of(a)), Latencies.of(run_of(b)))
    assert r.low > 1.1 and r.value == pytest.approx(1.3, rel=0.06) and r.high < 1.5
    assert str(r).startswith(f"{r.value:.2f} [")


def test_quantile_interval_covers_the_true_p99_about_95_percent_of_the_time() -> None:
    """The order-statistic interval a training point carries: 600 requests of a tail-heavy
    distribution; it must hold the distribution's true p99 in about 95 % of trials and narrow
    as requests grow."""
    rng = np.random.default_rng(11)
    true_p99 = 500 * math.exp(0.6 * 2.3263478740408408)  # lognormal(0, 0.6) x 500
    trials, covered, widths = 300, 0, []
    for _ in range(trials):
        lo, hi = Latencies.of(run_of(rng.lognormal(0, 0.6, 600) * 500)).quantile_interval(0.99)
        covered += lo <= true_p99 <= hi
        widths.append((hi - lo) / true_p99)
    assert 0.9 <= covered / trials <= 0.995, covered
    lo, hi = Latencies.of(run_of(rng.lognormal(0, 0.6, 60000) * 500)).quantile_interval(0.99)
    assert lo <= true_p99 * 1.01 and hi >= true_p99 * 0.99
    assert (hi - lo) / true_p99 < float(np.median(widths)) / 4
    assert all(math.isnan(x) for x in Latencies.pool([]).quantile_interval(0.99))
