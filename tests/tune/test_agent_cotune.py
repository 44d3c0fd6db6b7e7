"""Co-tuning through the agent (fake host tree, fake mid-tier): the apply co-tunes after the
knobs are written; a failed co-tuning rolls this request's knob writes back and leaves the
mid-tier on its previous threading; rollback, a lapsed lease and recovery at start restore
the threading the mid-tier had before the experiment. And the agent backend's controller
side: tables offered from and stored in the results DB, both hosts rolled back on failure."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from musku.agent.cotune import AgentRequest
from musku.agent.protocol import raise_for
from musku.domain import Configuration
from musku.errors import HostError
from musku.hosts.agent import AgentHost, AgentPair
from musku.hosts.cotune import ControllerTables
from musku.storage import open_store
from tests.agent.helpers import SHP, THP, err, make_agent, ok
from tests.tune.fakes import FakeMidtier, FakeTrainer, spec

SPEC = spec(admin="127.0.0.1:1")  # the fake mid-tier answers whatever the address


def apply(agent: Any, config: dict, table: dict | None = None, **kw: Any) -> dict:
    req = AgentRequest(SPEC, "vm", table).to_json()
    return agent.handle({"op": "apply", "config": config, "lease_s": 30, "threading": req, **kw})


def cotuned_agent(tmp: Path, mid: FakeMidtier | None = None, trainer: FakeTrainer | None = None):  # type: ignore[no-untyped-def]
    mid = mid or FakeMidtier("vm", cpus=2)
    trainer = trainer or FakeTrainer()
    agent, host = make_agent(tmp, threading_endpoint=lambda s: mid, threading_trainer=trainer)
    return agent, host, mid, trainer


def test_apply_cotunes_after_the_knobs_and_rollback_restores(tmp_path: Path) -> None:
    agent, host, mid, trainer = cotuned_agent(tmp_path)
    pristine, initial = host.tree(), mid.get()
    res = ok(apply(agent, {"thp": "never"}))
    assert res["changed"] == ["thp"] and "[never]" in host.read(THP)
    th = res["threading"]
    assert th["source"] == "trained" and th["threading"].startswith("auto:")
    assert th["trained"]["config_key"] == Configuration.of(thp="never").key()
    assert (
        mid.get().auto_mode and ok(agent.handle({"op": "status"}))["threading"] == th["threading"]
    )
    # the second apply of the same configuration finds the agent's cache
    assert ok(apply(agent, {"thp": "never"}))["threading"]["source"] == "cache"
    assert trainer.calls == 1
    ok(agent.handle({"op": "rollback"}))
    assert host.tree() == pristine and mid.get() == initial


def test_failed_cotuning_undoes_this_requests_knob_writes(tmp_path: Path) -> None:
    agent, host, mid, trainer = cotuned_agent(tmp_path)
    pristine, initial = host.tree(), mid.get()
    # first apply of the experiment fails: nothing left, no experiment open
    trainer.fail = HostError("musku_loadgen failed")
    e = err(apply(agent, {"thp": "never", "shp": 8}))
    assert e["status"] == 6 and "musku_loadgen failed" in e["message"]
    assert "rolled back 2 knob write(s)" in e["message"] and "\n" not in e["message"]
    assert host.tree() == pristine and mid.get() == initial
    assert agent.journal.open_tx() is None
    # a later apply fails: back to the previous apply's knobs and threading
    trainer.fail = None
    ok(apply(agent, {"thp": "never"}))
    after_first, threading_first = host.tree(), mid.get()
    trainer.fail = HostError("the mid-tier stopped answering")
    e = err(apply(agent, {"thp": "always", "shp": 8}))
    assert "rolled back 2 knob write(s)" in e["message"]
    assert host.tree() == after_first and mid.get() == threading_first
    assert agent.journal.open_tx() is not None  # the experiment goes on
    ok(agent.handle({"op": "rollback"}))
    assert host.tree() == pristine and mid.get() == initial


def test_impossible_pools_and_bad_requests_change_nothing(tmp_path: Path) -> None:
    agent, host, mid, trainer = cotuned_agent(tmp_path, FakeMidtier("vm", maxima=(4, 1, 4)))
    pristine, initial = host.tree(), mid.get()
    e = err(apply(agent, {"thp": "never"}))
    assert e["status"] == 3 and "impossible pool sizes" in e["message"]
    assert host.tree() == pristine and mid.get() == initial and trainer.calls == 0
    for bad in (
        {"spec": {"service": "setalgebra", "models": ["nope"], "admin": "h:1"}, "platform": "p"},
        {"spec": {"service": "setalgebra"}, "platform": "p"},
        "auto",
    ):
        e = err(agent.handle({"op": "apply", "config": {"thp": "never"}, "threading": bad}))
        assert e["status"] == 3 and "\n" not in e["message"]
    assert host.tree() == pristine and agent.journal.open_tx() is None


def test_lapsed_lease_and_recovery_restore_the_threading(tmp_path: Path) -> None:
    clock = [1000.0]
    mid = FakeMidtier("vm", cpus=2)
    agent, host = make_agent(tmp_path, threading_endpoint=lambda s: mid,
                             threading_trainer=FakeTrainer(), clock=lambda: clock[0])  # fmt: skip
    initial = mid.get()
    ok(apply(agent, {"shp": 8}))
    assert mid.get().auto_mode
    clock[0] += 31
    agent.tick()
    assert mid.get() == initial and host.read(SHP).strip() == "0"
    # an agent killed mid-experiment: the next one rolls back knobs and threading at start
    ok(apply(agent, {"shp": 8}))
    assert mid.get().auto_mode
    agent2, _ = make_agent(tmp_path, host, threading_endpoint=lambda s: mid)
    msgs = agent2.recover()
    assert any("mid-tier threading restored" in m for m in msgs), msgs
    assert mid.get() == initial and host.read(SHP).strip() == "0"


class InProcess:
    """An agent reached in-process (the Link protocol)."""

    def __init__(self, agent: Any) -> None:
        self.agent = agent
        for _ in range(6):
            agent.sample_once()  # rows for the pair's hello

    def call(self, op: str, **fields: Any) -> Any:
        return raise_for(self.agent.handle({"op": op, **fields}))

    def close(self) -> None:
        pass


@pytest.fixture
def store(tmp_path: Path) -> Iterator[Any]:
    with open_store(f"sqlite:///{tmp_path / 'results.db'}") as s:
        yield s


def test_agent_pair_offers_and_stores_tables(tmp_path: Path, store: Any) -> None:
    agents = [cotuned_agent(tmp_path / n, FakeMidtier(n, cpus=2)) for n in ("a", "b")]
    hosts = (AgentHost("a", InProcess(agents[0][0])), AgentHost("b", InProcess(agents[1][0])))
    pair = AgentPair(hosts, lease_s=30, name="t", cotune=ControllerTables(SPEC, "vm"))
    for h in hosts:  # both agents run on this machine: give them the names of two hosts
        h.info["hostname"] = h.name
    pair.use_store(store)
    base, cand = Configuration.of(thp="madvise"), Configuration.of(thp="never")
    try:
        pair.apply((base, cand))
        ta, tb = pair.threading()
        assert ta.startswith("auto:") and tb.startswith("auto:")
        # the tables the agents trained are in the results DB, under each agent's host name
        assert {r.host for r in store.threading_tables()} == {"a", "b"}
        assert store.threading_table("setalgebra", "b", "vm", cand.key())
        # agent b loses its cache: the controller offers the DB's table, no retraining
        for p in (tmp_path / "b" / "state" / "threading-tables").rglob("*.json"):
            p.unlink()
        pair.apply((cand, base))  # a trains cand, b trains base
        pair.apply((base, cand))
        assert [a[3].calls for a in agents] == [2, 2]
        pair.restore()
        assert pair.threading() == ("", "")
        assert all(not a[2].get().auto_mode for a in agents)
    finally:
        pair.close()


def test_agent_pair_failure_on_one_host_rolls_back_both(tmp_path: Path) -> None:
    agents = [cotuned_agent(tmp_path / n, FakeMidtier(n, cpus=2)) for n in ("a", "b")]
    agents[1][3].fail = HostError("musku_loadgen failed")
    trees = [a[1].tree() for a in agents]
    states = [a[2].get() for a in agents]
    hosts = (AgentHost("a", InProcess(agents[0][0])), AgentHost("b", InProcess(agents[1][0])))
    pair = AgentPair(hosts, lease_s=30, name="t", cotune=ControllerTables(SPEC, "vm"))
    try:
        with pytest.raises(HostError, match="both hosts rolled back"):
            pair.apply((Configuration.of(thp="never"), Configuration.of(thp="never")))
        assert [a[1].tree() for a in agents] == trees
        assert [a[2].get() for a in agents] == states
    finally:
        pair.close()


class OldAgent(InProcess):
    """An agent from before co-tuning: it ignores the request's threading field."""

    def call(self, op: str, **fields: Any) -> Any:
        fields.pop("threading", None)
        return super().call(op, **fields)


def test_an_agent_that_does_not_cotune_is_refused(tmp_path: Path) -> None:
    agents = [cotuned_agent(tmp_path / n, FakeMidtier(n, cpus=2)) for n in ("a", "b")]
    trees = [a[1].tree() for a in agents]
    hosts = (AgentHost("a", InProcess(agents[0][0])), AgentHost("b", OldAgent(agents[1][0])))
    pair = AgentPair(hosts, lease_s=30, name="t", cotune=ControllerTables(SPEC, "vm"))
    try:
        with pytest.raises(HostError, match="did not co-tune.*both hosts rolled back"):
            pair.apply((Configuration.of(thp="never"), Configuration.of(thp="never")))
        assert [a[1].tree() for a in agents] == trees
        assert not agents[0][2].get().auto_mode  # host a's threading restored by its rollback
    finally:
        pair.close()


class Sampling(InProcess):
    """An in-process agent that takes a sample whenever rows are collected."""

    def call(self, op: str, **fields: Any) -> Any:
        if op == "collect":
            self.agent.sample_once()
        return super().call(op, **fields)


def test_local_switchback_puts_each_arm_on_its_own_table(tmp_path: Path, store: Any) -> None:
    from musku.hosts.local import LocalSwitchbackPair

    agent, host, mid, trainer = cotuned_agent(tmp_path)
    initial = mid.get()
    tables = ControllerTables(SPEC, "vm")
    pair = LocalSwitchbackPair(Sampling(agent), settle_s=0.0, lease_s=30, cotune=tables)
    pair.use_store(store)
    a, b = Configuration.of(thp="madvise"), Configuration.of(thp="never")
    try:
        pair.apply((a, b))
        for _ in range(3):
            pair.window(0.02)
        ta, tb = pair.threading()
        assert ta.startswith("auto:") and tb.startswith("auto:")
        assert trainer.calls == 2  # one table per arm, then the agent's cache
        assert len(set(mid.loaded)) == 2  # the mid-tier follows the arms
        assert len(store.threading_tables()) == 2
        pair.restore()
        assert mid.get() == initial
    finally:
        pair.close()
