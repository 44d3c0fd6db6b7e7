"""The rollout's agent side (musku/hosts/agent_backend.py ``AgentFleet``) on real agent daemons over
Unix sockets on fake hosts: the canary pair applies under the deployment's lease, a kept soft
SKU becomes the agent's deployed one (kept across a restart), waves deploy and read back,
undeploy puts the pre-musku state back."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest

from musku.domain import Configuration
from musku.experiment import load_experiment
from musku.hosts.agent_backend import AgentFleet
from musku.rollout.fleet import open_fleet
from tests.agent.helpers import SHP, THP, config, fake_host, spawn_daemon
from tests.fixtures.toy import EXPERIMENT

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="needs root")


def _stop(pids: list[int]) -> None:
    for pid in pids:
        try:
            os.kill(pid, signal.SIGTERM)
            os.waitpid(pid, 0)
        except ChildProcessError:
            pass


def test_agent_fleet_deploys_reads_back_and_undeploys(tmp_path: Path) -> None:
    hosts, cfgs, pids = {}, {}, []
    try:
        for name in ("a", "b", "c"):
            host = fake_host(tmp_path / name / "host")
            host.hugepage_limit[2048] = 1 << 30
            cfg = config(tmp_path / name, sample_interval_s=0.05)
            pids.append(spawn_daemon(cfg, host))
            hosts[name], cfgs[name] = host, cfg
        entries = ", ".join(f'{{ name = "{n}", socket = "{cfgs[n].socket}" }}' for n in "abc")
        path = tmp_path / "toy.toml"
        path.write_text(
            EXPERIMENT.format(name="toy", mode="independent").split("[hosts]")[0]
            + f'[hosts]\nbackend = "agent"\nlease_s = 5\nhosts = [{entries}]\n'
        )
        exp = load_experiment(path)
        fleet = open_fleet(exp, seed=1, state={}, code_version="build-7")
        assert isinstance(fleet, AgentFleet) and fleet.names == ["a", "b", "c"]
        assert fleet.code_version() == "build-7"
        sku = exp.production.merged(Configuration.of(thp="always", shp=64))
        owner = "deployment-1"
        # the canary pair: production host a, canary c, under the deployment's lease
        pair = fleet.open_pair("a", "c", owner, seed=1)
        pair.apply((exp.production, sku))
        assert "[always]" in hosts["c"].read(THP) and "[madvise]" in hosts["a"].read(THP)
        fleet.settle(pair, owner, sku)  # kept: c's agent deploys it, a's experiment ends
        assert fleet.deployed("c") == sku and fleet.deployed("a") == Configuration()
        assert "[always]" in hosts["c"].read(THP) and hosts["c"].read(SHP).strip() == "64"
        # a wave host
        fleet.deploy("b", sku, owner)
        assert fleet.deployed("b") == sku and "[always]" in hosts["b"].read(THP)
        # the agent keeps its deployed soft SKU across a restart
        os.kill(pids[2], signal.SIGTERM)
        os.waitpid(pids[2], 0)
        pids[2] = spawn_daemon(cfgs["c"], hosts["c"])
        fleet.close()
        fleet = open_fleet(exp, seed=1, state={})
        assert fleet.deployed("c") == sku and "[always]" in hosts["c"].read(THP)
        # rollback of the deployment: both hosts back at their pre-musku state
        for name in ("b", "c"):
            fleet.undeploy(name, owner)
            assert fleet.deployed(name) == Configuration()
            assert "[madvise]" in hosts[name].read(THP) and hosts[name].read(SHP).strip() == "0"
        fleet.close()
    finally:
        _stop(pids)
