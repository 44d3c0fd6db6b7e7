"""The HostPair contract (musku.testing.hostpair) on every backend: the simulator, the queueing
model (needs the C++ engine), the agent backend (two real agent daemons on fake host trees,
over Unix sockets), the local switchback backend (its real agent, on a fake host tree: no real
kernel interface is touched), and the A/B tester's fake pair."""

from __future__ import annotations

import dataclasses
import os
import signal
from collections.abc import Iterator
from pathlib import Path

import pytest

from musku.domain import Configuration
from musku.experiment import load_experiment
from musku.hosts.agent import AgentHost, AgentPair, SocketLink
from musku.hosts.base import HostPair
from musku.hosts.local import LocalSwitchbackPair
from musku.testing.fakehost import FakeHost
from musku.testing.hostpair import Configs, HostPairContract
from musku.testing.knobs import tree
from tests.abtest.fakes import FakePair
from tests.agent.helpers import config, fake_host, spawn_daemon
from tests.hosts.test_agent_ssh import FakeService
from tests.qsim.conftest import engine  # noqa: F401 - the qsim engine fixture
from tests.timing import scaled

ROOT = Path(__file__).resolve().parents[2]
needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="the agent daemon needs root")


class TestSimPair(HostPairContract):
    backend = "sim"
    window_s = 60.0

    @pytest.fixture
    def pair(self) -> Iterator[HostPair]:
        from musku.sim import open_pair

        with open_pair(load_experiment(ROOT / "experiments" / "web-skylake.toml"), seed=7) as p:
            yield p

    @pytest.fixture
    def target(self, pair: HostPair) -> Configs:
        return (Configuration.of(thp="never", cdp="6:5"), Configuration.of(core_freq=1.8))

    @pytest.fixture
    def failing(self, pair: HostPair) -> Configs:
        return (Configuration.of(thp="never"), Configuration.of(shp=50))  # not modelled


@pytest.mark.services
@pytest.mark.usefixtures("engine")  # skips unless the C++ engine is built
class TestQsimPair(HostPairContract):
    backend = "qsim"
    window_s = 2.0

    @pytest.fixture
    def pair(self) -> Iterator[HostPair]:
        from musku.qsim.hosts import open_pair

        exp = load_experiment(ROOT / "experiments" / "qsim" / "2tier-freq.toml")
        # a shorter simulated run per configuration than the file's: the contract needs no
        # precision, and each test simulates two or three configurations
        opts = {**exp.hosts.options, "sim_seconds": 0.05}
        exp = dataclasses.replace(exp, hosts=dataclasses.replace(exp.hosts, options=opts))
        with open_pair(exp, seed=3) as p:
            yield p

    @pytest.fixture
    def target(self, pair: HostPair) -> Configs:
        return (Configuration.of(core_freq=1.6), Configuration.of(core_count=4))

    @pytest.fixture
    def failing(self, pair: HostPair) -> Configs:
        # host B would keep no core for its services: refused before either host changes
        return (Configuration.of(core_freq=1.6), Configuration.of(core_count=0))


class TestFakePair(HostPairContract):
    """The A/B tester's fake (tests/abtest/fakes.py): its apply cannot fail."""

    window_s = 30.0

    @pytest.fixture
    def pair(self) -> HostPair:
        return FakePair(seed=1)

    @pytest.fixture
    def target(self, pair: HostPair) -> Configs:
        return (Configuration.of(thp="never"), Configuration.of(thp="always"))


# ------------------------------------------------------------------ real agents on fake hosts

Daemons = list[tuple[int, FakeHost, FakeService]]


def _spawn(tmp: Path, names: str, limits: dict[str, int]) -> Daemons:
    """One agent daemon per name on a fake VM tree, sampling a service's stats file."""
    out: Daemons = []
    for name in names:
        host = fake_host(tmp / name / "host")
        host.hugepage_limit[2048] = limits.get(name, 1 << 30)
        svc = FakeService(tmp / name / "stats.json", 1000.0)
        svc.t.start()
        cfg = config(
            tmp / name,
            sample_interval_s=0.05,
            samplers={"service": {"stats_file": str(svc.path)}},
        )
        try:
            out.append((spawn_daemon(cfg, host, timeout=scaled(20.0)), host, svc))
        except BaseException:
            svc.stop.set()
            _stop(out)
            raise
    return out


def _stop(daemons: Daemons) -> None:
    for pid, _, svc in daemons:
        svc.stop.set()
        try:
            os.kill(pid, signal.SIGTERM)
            os.waitpid(pid, 0)
        except (ChildProcessError, ProcessLookupError):
            pass


class _RealAgents(HostPairContract):
    """Shared by the agent and local backends: real daemons, fake host trees."""

    window_s = 0.2
    daemons: Daemons

    @property
    def duration_slack_s(self) -> float:  # type: ignore[override]
        return scaled(1.0)

    def observe(self, pair: HostPair) -> object:
        return [tree(host) for _, host, _ in self.daemons]

    @pytest.fixture
    def target(self, pair: HostPair) -> Configs:
        return (Configuration.of(thp="never", shp=64), Configuration.of(thp="always"))


@needs_root
class TestAgentPair(_RealAgents):
    backend = "agent"

    @pytest.fixture
    def pair(self, tmp_path: Path) -> Iterator[HostPair]:
        # host b grants at most 10 huge pages: `failing` asks it for 64
        self.daemons = _spawn(tmp_path, "ab", {"b": 10})
        a, b = (AgentHost(n, SocketLink(tmp_path / n / "agent.sock")) for n in "ab")
        try:
            with AgentPair((a, b), lease_s=scaled(10.0), name="contract") as p:
                yield p
        finally:
            _stop(self.daemons)

    @pytest.fixture
    def failing(self, pair: HostPair) -> Configs:
        return (Configuration.of(shp=64), Configuration.of(shp=64))


@needs_root
class TestLocalPair(_RealAgents):
    """One host (a fake tree under its own agent daemon), arms A and B switched back."""

    backend = "local"

    @pytest.fixture
    def pair(self, tmp_path: Path) -> Iterator[HostPair]:
        self.daemons = _spawn(tmp_path, "h", {})
        link = SocketLink(tmp_path / "h" / "agent.sock")
        try:
            with LocalSwitchbackPair(link, seed=5, settle_s=0.0, lease_s=scaled(10.0)) as p:
                yield p
        finally:
            _stop(self.daemons)

    @pytest.fixture
    def failing(self, pair: HostPair) -> Configs:
        # cdp is not supported on the fake VM: the agent's check refuses arm B
        return (Configuration.of(thp="never"), Configuration.of(cdp="6:5"))


def test_every_registered_backend_runs_the_contract() -> None:
    """A backend added to BACKENDS gets a contract class here (docs/architecture.md)."""
    from musku.registry import BACKENDS

    def classes(cls: type) -> list[type]:
        return [cls, *(c for sub in cls.__subclasses__() for c in classes(sub))]

    here = [c for c in classes(HostPairContract) if c.__module__ == __name__]
    assert set(BACKENDS.names()) <= {c.backend for c in here if c.__name__.startswith("Test")}
