"""``deploy_sku`` and ``watch_round`` end to end on real agent daemons over Unix sockets on fake
host trees, with a real canary A/B: each host runs a fake service (musku-stats/1, read by the
agent's service sampler) whose request rate depends on the THP mode of its own host tree, so a
soft SKU that sets THP ``always`` is really better (canary, waves, ``deployed``; watch: holds)
or really worse (rolled back at the canary, every host's tree as it was)."""

from __future__ import annotations

import os
import random
import re
import signal
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from musku.domain import Configuration, DeploymentStatus, SoftSku
from musku.errors import RolledBack
from musku.experiment import Experiment, load_experiment
from musku.rollout import deploy_sku, watch_round
from musku.rollout.fleet import open_fleet
from musku.storage import open_store
from musku.storage.store import Store
from musku.testing.fakehost import FakeHost
from tests.agent.helpers import THP, config, fake_host, spawn_daemon, write_stats

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="needs root")

NAMES = ("a", "b", "c")
BASE_QPS = 2000.0
SKU = Configuration.of(thp="always")


class ThpService:
    """A service writing musku-stats/1 whose request rate is ``BASE_QPS`` x ``factor`` while
    its host's THP mode (the bracketed word of ``enabled``) is ``always``, ``BASE_QPS``
    otherwise, with 3 % noise per 10 ms step."""

    def __init__(self, path: Path, host: FakeHost, factor: float, seed: int) -> None:
        self.path, self.host, self.factor = path, host, factor
        self.rng = random.Random(seed)
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self.run, daemon=True)
        self.thread.start()

    def mode(self) -> str:
        m = re.search(r"\[(\w+)\]", self.host.read(THP))
        return m.group(1) if m else ""

    def run(self) -> None:
        count, last = 0.0, time.time()
        while not self.stop.is_set():
            now = time.time()
            qps = BASE_QPS * (self.factor if self.mode() == "always" else 1.0)
            count += (now - last) * qps * max(0.0, 1.0 + self.rng.gauss(0.0, 0.03))
            last = now
            write_stats(self.path, now, int(count))
            self.stop.wait(0.01)


class Fleet:
    """Three agent daemons on fake hosts, each with its service."""

    def __init__(self, tmp: Path, factor: float) -> None:
        self.hosts: dict[str, FakeHost] = {}
        self.sockets: dict[str, Path] = {}
        self.pids: list[int] = []
        self.services: list[ThpService] = []
        for i, name in enumerate(NAMES):
            host = fake_host(tmp / name / "host")
            svc = ThpService(tmp / name / "stats.json", host, factor, seed=i)
            self.services.append(svc)
            cfg = config(
                tmp / name,
                sample_interval_s=0.01,
                samplers={"service": {"stats_file": str(svc.path)}},
            )
            self.pids.append(spawn_daemon(cfg, host))
            self.hosts[name], self.sockets[name] = host, cfg.socket

    def close(self) -> None:
        for svc in self.services:
            svc.stop.set()
        for pid in self.pids:
            try:
                os.kill(pid, signal.SIGTERM)
                os.waitpid(pid, 0)
            except (ChildProcessError, ProcessLookupError):
                pass

    def modes(self) -> dict[str, str]:
        return {n: s.mode() for n, s in zip(NAMES, self.services, strict=True)}


def _experiment(tmp: Path, fleet: Fleet) -> Experiment:
    entries = ", ".join(f'{{ name = "{n}", socket = "{fleet.sockets[n]}" }}' for n in NAMES)
    path = tmp / "svc.toml"
    path.write_text(
        '[experiment]\nname = "svc-deploy"\n'
        '[service]\nname = "svc"\nknobs = ["thp"]\n'
        '[platform]\ncatalog = "firecracker-vm"\n'
        '[production]\nthp = "madvise"\n'
        '[metric]\nprimary = "qps"\n'
        "[statistics]\nconfidence = 0.95\nmin_effect = 0.05\nwarmup_s = 0.2\n"
        "sample_interval_s = 0.01\nsample_cap = 200\nseed = 3\n"
        f'[hosts]\nbackend = "agent"\nlease_s = 10\nhosts = [{entries}]\n'
    )
    return load_experiment(path)


@pytest.fixture
def store(tmp_path: Path) -> Iterator[Store]:
    s = open_store(f"sqlite:///{tmp_path / 'results.db'}")
    yield s
    s.close()


def _sku(store: Store, exp: Experiment) -> int:
    exp_id = store.create_experiment(exp)
    return store.save_softsku(
        exp_id, SoftSku(service="svc", platform=exp.platform.name, configuration=SKU)
    )


def test_a_better_sku_is_deployed_and_holds(tmp_path: Path, store: Store) -> None:
    fleet = Fleet(tmp_path, factor=1.3)
    try:
        exp = _experiment(tmp_path, fleet)
        sku_id = _sku(store, exp)
        rep = deploy_sku(store, exp, sku_id, ["c", "b"], canary=1, wave_size=1)
        assert rep.status is DeploymentStatus.DEPLOYED
        (canary,) = rep.canary
        assert canary["host"] == "c" and canary["production"] == "a"
        assert canary["decision"] == "better", canary
        assert 0.15 < canary["estimate"] < 0.45, canary
        assert rep.waves == [["b"]]
        assert fleet.modes() == {"a": "madvise", "b": "always", "c": "always"}
        # what the agents hold as deployed
        agents = open_fleet(exp, seed=1, state={})
        try:
            assert agents.deployed("b") == exp.production.merged(SKU)
            assert agents.deployed("c") == exp.production.merged(SKU)
            assert agents.deployed("a") == Configuration()
        finally:
            agents.close()
        # the watch compares a deployed host against production a: the advantage holds
        (res,) = watch_round(store, exp, force=True)
        assert res.verdict == "holds" and res.decision == "better", res
        assert fleet.modes() == {"a": "madvise", "b": "always", "c": "always"}
    finally:
        fleet.close()


def test_a_worse_sku_is_rolled_back_at_the_canary(tmp_path: Path, store: Store) -> None:
    fleet = Fleet(tmp_path, factor=0.7)
    try:
        before = {n: h.tree() for n, h in fleet.hosts.items()}
        exp = _experiment(tmp_path, fleet)
        sku_id = _sku(store, exp)
        with pytest.raises(RolledBack) as info:
            deploy_sku(store, exp, sku_id, ["c", "b"], canary=1, wave_size=1)
        assert "canary c against a: worse" in info.value.one_line()
        dep = store.deployments()[0]
        assert dep.status is DeploymentStatus.ROLLED_BACK and dep.applied_hosts() == ()
        assert {n: h.tree() for n, h in fleet.hosts.items()} == before
        assert fleet.modes() == {n: "madvise" for n in NAMES}
    finally:
        fleet.close()
