"""Latency histograms from ``musku_loadgen`` results: pooled across runs, quantiles computed as
the load generator computes them, and bootstrap confidence intervals for a ratio of quantiles.

A p99 from a few hundred requests rests on its few slowest ones: two runs of the same
configuration can differ by a third. Comparing configurations by such figures needs the runs
pooled (interleaved rounds of each) and the sampling error said, which is what this does.

The load generator's JSON carries every non-empty bucket of its HDR-style histogram
(``latency_us.buckets``: ``[upper bound in us, count]``, buckets at most 1.6 % wide); a
quantile is the upper bound of the bucket holding the ceil(q * n)-th value.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from musku.errors import InputError


@dataclass(frozen=True)
class Latencies:
    """One or more runs' latencies: bucket upper bounds (us, ascending) and counts."""

    upper_us: np.ndarray
    counts: np.ndarray

    @classmethod
    def of(cls, *runs: Mapping[str, Any]) -> Latencies:
        """Pool the runs (each a load generator result's ``total`` or one of its ``phases``;
        InputError when one has no buckets, e.g. from an older load generator)."""
        parts = []
        for run in runs:
            buckets = run.get("latency_us", {}).get("buckets")
            if buckets is None:
                raise InputError("load generator result without latency buckets (rebuild it)")
            b = np.array(buckets, dtype=float).reshape(-1, 2)
            parts.append(cls(b[:, 0], b[:, 1].astype(np.int64)))
        return cls.pool(parts)

    @classmethod
    def pool(cls, parts: Iterable[Latencies]) -> Latencies:
        """All the parts' requests together (counts of equal bucket bounds added)."""
        parts = list(parts)
        if not parts:
            return cls(np.zeros(0), np.zeros(0, dtype=np.int64))
        upper = np.concatenate([p.upper_us for p in parts])
        counts = np.concatenate([p.counts for p in parts])
        keys, inverse = np.unique(upper, return_inverse=True)
        return cls(keys, np.bincount(inverse, weights=counts).astype(np.int64))

    @property
    def n(self) -> int:
        return int(self.counts.sum())

    def quantile(self, q: float) -> float:
        """The load generator's quantile (0 < q <= 1); nan when empty."""
        return float(_quantiles(self.upper_us, self.counts[None, :], q)[0])

    def quantile_interval(self, q: float, level: float = 0.95) -> tuple[float, float]:
        """Distribution-free confidence interval of the q-quantile: the values at the ranks
        that bound the Binomial(n, q) count of requests below it (nan when empty). Needs no
        resampling, so it is cheap enough for every point of a training grid."""
        n = self.n
        if n == 0:
            return math.nan, math.nan
        from scipy.stats import binom  # lazy: ~0.9 CPU-s to import (every CLI start paid it)

        a = (1 - level) / 2
        lo_rank = max(1, int(binom.ppf(a, n, q)))
        hi_rank = min(n, int(binom.ppf(1 - a, n, q)) + 1)
        return self.quantile(lo_rank / n), self.quantile(hi_rank / n)

    def resampled_quantiles(self, q: float, draws: int, rng: np.random.Generator) -> np.ndarray:
        """``draws`` bootstrap replicates of the q-quantile (multinomial resampling of the
        requests)."""
        n = self.n
        if n == 0:
            return np.full(draws, np.nan)
        counts = rng.multinomial(n, self.counts / n, size=draws)
        return _quantiles(self.upper_us, counts, q)


def _quantiles(upper: np.ndarray, counts: np.ndarray, q: float) -> np.ndarray:
    """Row-wise quantiles of ``counts`` (draws x buckets) over the buckets ``upper``."""
    total = counts.sum(axis=1)
    out = np.full(counts.shape[0], np.nan)
    ok = total > 0
    if not ok.any():
        return out
    target = np.maximum(1, np.ceil(q * total[ok]))
    cum = np.cumsum(counts[ok], axis=1)
    idx = (cum < target[:, None]).sum(axis=1)
    out[ok] = upper[np.minimum(idx, len(upper) - 1)]
    return out


@dataclass(frozen=True)
class Ratio:
    """``a``'s quantile over ``b``'s, with a bootstrap confidence interval."""

    value: float
    low: float
    high: float
    level: float

    def __str__(self) -> str:
        return f"{self.value:.2f} [{self.low:.2f}, {self.high:.2f}]"


def quantile_ratio(
    a: Latencies,
    b: Latencies,
    q: float = 0.99,
    *,
    level: float = 0.95,
    draws: int = 2000,
    seed: int = 0,
) -> Ratio:
    """a's q-quantile / b's, and the percentile-bootstrap interval at ``level`` (requests
    resampled independently in a and b)."""
    if not 0 < q <= 1 or not 0 < level < 1:
        raise InputError("quantile_ratio needs 0 < q <= 1 and 0 < level < 1")
    rng = np.random.default_rng(seed)
    ra = a.resampled_quantiles(q, draws, rng)
    rb = b.resampled_quantiles(q, draws, rng)
    ratios = ra / rb
    tail = (1 - level) / 2
    lo, hi = np.nanquantile(ratios, [tail, 1 - tail])
    return Ratio(a.quantile(q) / b.quantile(q), float(lo), float(hi), level)
