"""Samplers: service stats (interval percentiles from cumulative histograms), RAPL on fake
powercap trees (wrap-around), perf events on this machine (software fallback reported), psutil."""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable
from pathlib import Path

import psutil
import pytest

from musku.errors import InputError
from musku.hostfs import HostFS
from musku.metrics import SAMPLERS, load_sampler
from musku.metrics.rapl import POWERCAP
from musku.metrics.service import quantile_from_hist
from tests.timing import scaled


def _stats(path: Path, t: float, requests: int, ops: int, counts: list[int], pid: int = 7) -> None:
    path.write_text(
        json.dumps(
            {
                "format": "musku-stats/1",
                "pid": pid,
                "t": t,
                "counters": {"requests": requests, "ops": ops, "qos_violations": requests // 100},
                "latency_us": {"bounds": [100, 200, 400, 800, 1600], "counts": counts},
            }
        )
    )


def test_service_sampler_interval_rates_and_percentiles(tmp_path: Path) -> None:
    f = tmp_path / "stats.json"
    _stats(f, 100.0, 1000, 50_000, [500, 500, 0, 0, 0])
    s = load_sampler("service", HostFS(tmp_path), stats_file=str(f))
    assert s.probe().supported
    s.start()
    assert s.sample() == {}  # the file has not advanced: no data, not zero
    # next 2 s: 1000 more requests, all slow (800 us bucket): interval percentiles see only them
    _stats(f, 102.0, 2000, 150_000, [500, 500, 0, 1000, 0])
    m = s.sample()
    assert m["qps"] == pytest.approx(500.0)
    assert m["ops"] == pytest.approx(50_000.0)
    assert m["p50_ms"] == pytest.approx(0.8) and m["p99_ms"] == pytest.approx(0.8)
    assert m["qos_violation_rate"] == pytest.approx(0.01)
    # a restarted service (new pid): counters started over, no bogus negative rates
    _stats(f, 103.0, 10, 10, [10, 0, 0, 0, 0], pid=8)
    assert s.sample() == {}


def test_service_sampler_needs_a_path(tmp_path: Path) -> None:
    with pytest.raises(InputError, match="stats_file"):
        load_sampler("service", HostFS(tmp_path))


def test_quantiles() -> None:
    assert quantile_from_hist([1, 2, 3], [0, 0, 0], 0.5) is None
    assert quantile_from_hist([1, 2, 3], [98, 1, 1], 0.5) == 1
    assert quantile_from_hist([1, 2, 3], [98, 1, 1], 0.99) == 2
    assert quantile_from_hist([1, 2, 3], [98, 1, 1], 1.0) == 3


def _rapl(root: Path, pkg: int, energy: int, rng: int = 1000_000_000) -> None:
    d = root / POWERCAP.lstrip("/") / f"intel-rapl:{pkg}"
    d.mkdir(parents=True, exist_ok=True)
    (d / "name").write_text(f"package-{pkg}\n")
    (d / "energy_uj").write_text(f"{energy}\n")
    (d / "max_energy_range_uj").write_text(f"{rng}\n")
    sub = root / POWERCAP.lstrip("/") / f"intel-rapl:{pkg}:0"  # core subdomain: not summed
    sub.mkdir(exist_ok=True)
    (sub / "energy_uj").write_text("5\n")


def test_rapl_sums_packages_and_handles_wrap(tmp_path: Path) -> None:
    s = load_sampler("rapl", HostFS(tmp_path))
    sup = s.probe()
    assert not sup.supported and "no RAPL" in sup.reason
    _rapl(tmp_path, 0, 999_000_000)
    _rapl(tmp_path, 1, 10_000_000)
    assert s.probe().supported
    s.start()
    t0 = time.monotonic()
    time.sleep(0.2)
    _rapl(tmp_path, 0, 1_000_000)  # wrapped: +2 J
    _rapl(tmp_path, 1, 12_000_000)  # +2 J
    m = s.sample()
    dt = time.monotonic() - t0
    assert m["power_w"] == pytest.approx(4.0 / dt, rel=0.15)


def test_perf_sampler_reports_which_events_it_uses() -> None:
    if os.geteuid() != 0:
        pytest.skip("system-wide perf events need root")
    s = load_sampler("perf", HostFS("/"))
    sup = s.probe()
    assert sup.supported, sup.reason
    assert sup.backend in ("hardware", "software")
    s.start()
    assert s.backend == sup.backend
    x = 0
    end = time.monotonic() + 0.2
    while time.monotonic() < end:
        x += 1
    m = s.sample()
    s.close()
    if sup.backend == "hardware":
        assert m["mips"] > 0
    else:
        assert "mips" not in m and m["ctx_switches_per_s"] > 0


def _unaccounted() -> float:
    """CPU seconds (all CPUs) the scheduler's task clock leaves out: time stolen by the
    hypervisor and interrupt time. perf's task-clock runs on the raw clock while the task is
    current, so it includes them; the process CPU clock excludes them."""
    t = psutil.cpu_times()
    return float(t.steal + t.irq + t.softirq)


def _busy_share(
    start: Callable[[], None],
    sample: Callable[[], dict[str, float]],
    *,
    tick: float = 0.0,
    raw_clock: bool = False,
) -> tuple[float, float, dict[str, float]]:
    """Spin this thread for 0.15 s of CPU time between a sampler's start and sample, and bound
    the share of a CPU the sampler must report with this process's own CPU clock: at least the
    CPU spun over the longest the sampler's interval can be, at most all CPU used over the
    shortest (for a ``raw_clock`` sampler, plus the steal and interrupt time of the machine
    meanwhile: on a loaded VM perf's task-clock ran 8 % over the process clock). Independent
    of how busy the machine is (a busy machine just spins longer)."""
    u0 = _unaccounted() if raw_clock else 0.0
    c0, w0 = time.process_time(), time.monotonic()
    start()
    w1, c1 = time.monotonic(), time.process_time()
    deadline = w1 + scaled(5.0)
    while time.process_time() - c1 < 0.15 and time.monotonic() < deadline:
        pass
    c2, w2 = time.process_time(), time.monotonic()
    m = sample()
    w3, c3 = time.monotonic(), time.process_time()
    extra = _unaccounted() - u0 + 0.02 if raw_clock else 0.0  # + two clock ticks of /proc/stat
    assert c2 - c1 >= 0.15, "this process got no CPU for the whole deadline"
    return 0.95 * (c2 - c1 - tick) / (w3 - w0), 1.05 * (c3 - c0 + tick + extra) / (w2 - w1), m


def test_perf_pid_scope_counts_this_process_cpu_time() -> None:
    s = load_sampler("perf", HostFS("/"), scope="pid", pid=os.getpid(), events="software")
    if not s.probe().supported:
        pytest.skip(s.probe().reason)
    lo, hi, m = _busy_share(s.start, s.sample, raw_clock=True)
    s.close()
    assert lo <= m["cpu_busy"] <= hi and m["cpu_busy"] <= 1.05, (lo, m["cpu_busy"], hi)


def test_psutil_sampler(tmp_path: Path) -> None:
    assert not load_sampler("psutil", HostFS(tmp_path)).probe().supported  # fake root
    s = load_sampler("psutil", HostFS("/"), pid=os.getpid())
    assert s.probe().supported
    lo, hi, m = _busy_share(s.start, s.sample, tick=0.01)  # psutil: clock-tick resolution
    assert 0 < m["host_cpu_util"] <= 1 and m["proc_rss_mib"] > 1
    assert lo <= m["proc_cpu"] <= hi, (lo, m["proc_cpu"], hi)


def test_registry() -> None:
    assert SAMPLERS.names()[:4] == ["perf", "psutil", "service", "rapl"]
    with pytest.raises(InputError, match="unknown metric sampler 'nope'"):
        load_sampler("nope", HostFS("/"))
