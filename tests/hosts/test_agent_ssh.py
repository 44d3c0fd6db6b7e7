"""The agent backend over REAL SSH: an sshd on a free loopback port (generated host key,
authorized key for root), two agent daemons on two Unix sockets on this machine (each on its
own fake host tree), driven through apply / window / restore with ``musku agent rpc``."""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path

import pytest

from musku.domain import Configuration
from musku.errors import HostError
from musku.experiment import load_experiment
from tests.agent.helpers import SHP, THP, config, fake_host, spawn_daemon, write_stats
from tests.fixtures.sshd import agent_hosts_toml, needs_sshd

pytestmark = [*needs_sshd, pytest.mark.slow]


class FakeService:
    """A service writing musku-stats/1 at a known request rate."""

    def __init__(self, path: Path, qps: float) -> None:
        self.path, self.qps = path, qps
        self.stop = threading.Event()
        self.t = threading.Thread(target=self.run, daemon=True)

    def run(self) -> None:
        t0 = time.time()
        while not self.stop.is_set():
            now = time.time()
            write_stats(self.path, now, int((now - t0) * self.qps))
            time.sleep(0.02)


def _experiment(tmp: Path, sshd: dict, hosts: list[dict], known_hosts: Path) -> Path:
    p = tmp / "exp.toml"
    p.write_text(
        '[experiment]\nname = "ssh-pair"\n[service]\nname = "svc"\nknobs = ["thp", "shp"]\n'
        '[platform]\ncatalog = "firecracker-vm"\n[metric]\nprimary = "qps"\n'
        + agent_hosts_toml(sshd, hosts, known_hosts, lease_s=30)  # renewals: 1-3 s under load
    )
    return p


def test_pair_over_ssh(tmp_path: Path, sshd: dict) -> None:
    from musku.hosts.agent import open_pair

    agents, services, hosts_opt = [], [], []
    for name, qps in (("a", 1000.0), ("b", 3000.0)):
        host = fake_host(tmp_path / name / "host")
        svc = FakeService(tmp_path / name / "stats.json", qps)
        svc.t.start()
        services.append(svc)
        cfg = config(
            tmp_path / name,
            sample_interval_s=0.1,
            samplers={"service": {"stats_file": str(svc.path)}},
        )
        agents.append((spawn_daemon(cfg, host), host, cfg))
        hosts_opt.append(
            {
                "name": f"host-{name}",
                "host": "127.0.0.1",
                "port": sshd["port"],
                "socket": str(cfg.socket),
            }
        )
    before = [h.tree() for _, h, _ in agents]
    exp = load_experiment(_experiment(tmp_path, sshd, hosts_opt, sshd["dir"] / "known_hosts"))
    try:
        pair = open_pair(exp)
        try:
            assert [h.name for h in pair.hosts] == ["host-a", "host-b"]
            for h in pair.hosts:  # same machine: the clocks agree, to within the estimate's error
                # each round trip starts 'musku agent rpc' over SSH: over a second on a loaded
                # 2-core machine (1.3 s seen at load average 19), so only a sanity bound here
                assert h.offset_rtt < 5.0, h.offset_rtt
                assert abs(h.offset) <= h.offset_rtt / 2 + 0.01, (h.offset, h.offset_rtt)
            base = Configuration.of({"thp": "madvise", "shp": 0})
            cand = Configuration.of({"thp": "always", "shp": 64})
            pair.apply((base, cand))
            assert "[always]" in agents[1][1].read(THP) and agents[1][1].read(SHP).strip() == "64"
            assert "[madvise]" in agents[0][1].read(THP)
            for _ in range(2):
                a, b = pair.window(0.5)
                assert a.valid and b.valid, (a.note, b.note)
                assert a.host == "host-a" and b.host == "host-b"
                assert a.metrics["qps"] == pytest.approx(1000, rel=0.2)
                assert b.metrics["qps"] == pytest.approx(3000, rel=0.2)
            # someone changes host b by hand: that host's window is invalid
            agents[1][2]  # noqa: B018
            from tests.agent.helpers import fs_of

            fs_of(agents[1][1]).write_text(THP, "never")
            a, b = pair.window(0.5)
            assert a.valid and not b.valid and "outside change: thp" in b.note
            pair.restore()
            assert [h.tree() for _, h, _ in agents] == before
        finally:
            pair.close()
    finally:
        for svc in services:
            svc.stop.set()
        for pid, _, _ in agents:
            os.kill(pid, 15)
            os.waitpid(pid, 0)


def test_unknown_host_key_refused(tmp_path: Path, sshd: dict) -> None:
    from musku.hosts.agent import open_pair

    empty = tmp_path / "known_hosts"
    empty.write_text("")
    hosts = [
        {"name": n, "host": "127.0.0.1", "port": sshd["port"], "socket": f"/nonexistent-{n}"}
        for n in ("a", "b")
    ]
    exp = load_experiment(_experiment(tmp_path, sshd, hosts, empty))
    with pytest.raises(HostError, match="cannot connect"):
        open_pair(exp)
