"""A multi-arm group of real agent daemons on fake hosts (musku.hosts.agent.AgentGroup): one
configuration per host, windows per host, a failure on one host rolls every host back, and a
short Williams scan runs on it end to end."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from musku.design.group import run_scan
from musku.domain import Configuration, Decision, StatsSettings
from musku.errors import HostError
from musku.hosts.agent import AgentGroup, AgentHost, SocketLink
from musku.testing.fakehost import FakeHost
from tests.agent.helpers import SHP, THP, config, fake_host, spawn_daemon
from tests.hosts.test_agent_ssh import FakeService
from tests.hosts.test_hostpair_contract import _stop
from tests.timing import scaled

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="needs root")

Daemons = list[tuple[int, FakeHost, FakeService]]
QPS = (1000.0, 1500.0, 2000.0)


@pytest.fixture
def group(tmp_path: Path) -> Iterator[tuple[AgentGroup, Daemons]]:
    daemons: Daemons = []
    try:
        for name, qps in zip("abc", QPS, strict=True):
            host = fake_host(tmp_path / name / "host")
            host.hugepage_limit[2048] = 10 if name == "c" else 1 << 30
            svc = FakeService(tmp_path / name / "stats.json", qps)
            svc.t.start()
            cfg = config(
                tmp_path / name,
                sample_interval_s=0.05,
                samplers={"service": {"stats_file": str(svc.path)}},
            )
            daemons.append((spawn_daemon(cfg, host, timeout=scaled(20.0)), host, svc))
        hosts = []
        for name, (_, _, _svc) in zip("abc", daemons, strict=True):
            link = SocketLink(tmp_path / name / "agent.sock")
            h = AgentHost(name, link)
            h.hello()
            hosts.append(h)
        g = AgentGroup(hosts, metric="qps", lease_s=5.0, name="grp", tick_s=0.1)
        yield g, daemons
        g.restore()
        g.close()
        for h in hosts:
            h.link.close()
    finally:
        _stop(daemons)


def test_one_configuration_per_host_and_windows_per_host(
    group: tuple[AgentGroup, Daemons],
) -> None:
    g, daemons = group
    configs = [Configuration.of(thp=v) for v in ("never", "always", "madvise")]
    g.apply(configs)
    for (_, host, _), v in zip(daemons, ("never", "always", "madvise"), strict=True):
        assert f"[{v}]" in host.read(THP)
    m = g.measure(4)
    assert m.shape == (4, 3) and np.all(np.isfinite(m)) and np.all(m > 0)
    # each column is its own host's service: the request rates come out in order
    means = m.mean(axis=0)
    assert means[0] < means[1] < means[2]
    assert means == pytest.approx(QPS, rel=0.25)
    g.restore()
    assert all("[madvise]" in host.read(THP) for _, host, _ in daemons)


def test_a_failure_on_one_host_rolls_every_host_back(group: tuple[AgentGroup, Daemons]) -> None:
    g, daemons = group
    before = [h.tree() for _, h, _ in daemons]
    cfg = Configuration.of({"thp": "always", "shp": 64})  # host c grants only 10 huge pages
    with pytest.raises(HostError, match="every host of the group rolled back"):
        g.apply([cfg, cfg, cfg])
    assert [h.tree() for _, h, _ in daemons] == before
    assert all(h.read(SHP).strip() == "0" for _, h, _ in daemons)


def test_a_short_williams_scan_runs_on_agent_hosts(group: tuple[AgentGroup, Daemons]) -> None:
    g, daemons = group
    arms = [Configuration.of(thp=v) for v in ("madvise", "always", "never")]
    periods: list[tuple[int, list[int]]] = []
    st = StatsSettings(warmup_s=0.0, sample_interval_s=0.1, sample_cap=12)
    r = run_scan(
        g,
        arms,
        st,
        pilot_windows=4,
        min_period_windows=4,
        on_period=lambda p, row, t, means: periods.append((p, [int(a) for a in row])),
    )
    # the cap (12 windows a host) ends it after a few periods; the arms rotated over the hosts
    assert r.outcome.stop and r.outcome.decision is Decision.INCONCLUSIVE
    assert len(periods) >= 2 and periods[0][1] != periods[1][1]
    assert sorted(periods[0][1]) == [0, 1, 2]
