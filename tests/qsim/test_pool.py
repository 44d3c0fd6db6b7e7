"""Blocking (http/1.1-style) connection pools on a path node (``pool = N``), against closed forms."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from musku.qsim.engine import simulate
from musku.qsim.model import load

POOLED = """\
[run]
duration_s = {duration}
warmup_s = 0.1
seed = 11

[[machines]]
name = "m"
cores = 1

[[services]]
name = "backend"
execution = "simple"   # a thread per call: only the connections limit concurrency
threads = 10000

  [[services.stages]]
  name = "work"
  time = {{ dist = "{dist}", mean_us = 10 }}

[[paths]]
  [[paths.nodes]]
  name = "call"
  service = "backend"
  pool = {pool}

[client]
{client}
"""


def _erlang_c(c: int, a: float) -> float:
    """Probability of waiting in an M/M/c queue with offered load a = lambda / mu."""
    top = a**c / math.factorial(c) * c / (c - a)
    return top / (sum(a**k / math.factorial(k) for k in range(c)) + top)


def _run(tmp_path: Path, **kw: object) -> dict:
    p = tmp_path / "m.toml"
    p.write_text(POOLED.format(**kw))
    return simulate(load(p).engine)


def test_a_pool_of_c_connections_is_an_mmc_queue(engine: str, tmp_path: Path) -> None:
    # 4 connections in front of an unbounded exp(10 us) server: M/M/4, rho = 0.75
    c, s_us, rho = 4, 10.0, 0.75
    lam = rho * c / (s_us * 1e-6)
    res = _run(tmp_path, duration=2.0, dist="exp", pool=c, client=f"qps = {lam}")
    a = lam * s_us * 1e-6
    w = _erlang_c(c, a) / (c / s_us - lam * 1e-6) + s_us  # mean sojourn, us
    assert res["latency"]["count"] > 500_000
    assert res["latency"]["mean_us"] == pytest.approx(w, rel=0.04)
    assert not res["saturated"]


def test_closed_loop_throughput_is_bounded_by_the_connections(engine: str, tmp_path: Path) -> None:
    # 16 users, no think time, 3 connections to a constant 10-us call: exactly 3 / 10 us;
    # each call waits for 16 / 3 - 1 others (Little's law)
    res = _run(tmp_path, duration=0.5, dist="const", pool=3,
               client='kind = "closed"\nusers = 16')  # fmt: skip
    assert res["throughput_qps"] == pytest.approx(3 / 10e-6, rel=0.01)
    assert res["latency"]["mean_us"] == pytest.approx(16 / 3 * 10, rel=0.01)
    # without the pool every user has its own thread: 16 / 10 us
    free = _run(tmp_path, duration=0.5, dist="const", pool=10000,
                client='kind = "closed"\nusers = 16')  # fmt: skip
    assert free["throughput_qps"] == pytest.approx(16 / 10e-6, rel=0.01)


def test_pool_must_be_positive(tmp_path: Path) -> None:
    from musku.errors import InputError

    p = tmp_path / "m.toml"
    p.write_text(POOLED.format(duration=1, dist="exp", pool=0, client="qps = 10"))
    with pytest.raises(InputError, match=r"m.toml:\d+"):
        load(p)
