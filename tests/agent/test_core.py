"""The agent's state machine on fake host trees: validation, journaling, rollback, recovery,
deploy kept across restarts, lease, drift, malformed requests."""

from __future__ import annotations

from pathlib import Path

import pytest

from musku.agent.journal import Journal, TxKind
from musku.knobs import load_knob
from tests.agent.helpers import SHP, THP, Clock, FailingFactory, err, make_agent, ok


def test_apply_then_rollback_restores_bytes(tmp_path: Path) -> None:
    agent, host = make_agent(tmp_path)
    before = host.tree()
    res = ok(agent.handle({"op": "apply", "config": {"thp": "never", "shp": 64}, "lease_s": 30}))
    assert res["changed"] == ["thp", "shp"]
    assert "[never]" in host.read(THP) and host.read(SHP).strip() == "64"
    # applying again changes nothing
    assert (
        ok(agent.handle({"op": "apply", "config": {"thp": "never"}, "lease_s": 30}))["changed"]
        == []
    )
    ok(agent.handle({"op": "rollback"}))
    assert host.tree() == before
    assert agent.journal.open_tx() is None


def test_invalid_value_refused_with_nothing_written(tmp_path: Path) -> None:
    agent, host = make_agent(tmp_path)
    before = host.tree()
    e = err(agent.handle({"op": "apply", "config": {"thp": "never", "shp": 10**9}, "lease_s": 5}))
    assert e["status"] == 3 and "shp" in e["message"]
    e = err(agent.handle({"op": "apply", "config": {"thp": "sometimes"}, "lease_s": 5}))
    assert "thp" in e["message"]
    e = err(agent.handle({"op": "apply", "config": {"cdp": "6:5"}, "lease_s": 5}))
    assert e["status"] == 4  # unsupported on this host: a typed answer
    assert host.tree() == before
    assert agent.journal.open_tx() is None and agent.journal.steps() == []


@pytest.mark.parametrize("after_write", [True, False])
def test_failed_write_rolls_back_what_was_applied(tmp_path: Path, after_write: bool) -> None:
    agent, host = make_agent(tmp_path, knob_factory=FailingFactory("shp", after_write=after_write))
    before = host.tree()
    e = err(agent.handle({"op": "apply", "config": {"thp": "always", "shp": 128}, "lease_s": 5}))
    assert e["status"] == 6 and "rolled back 2 write(s)" in e["message"]
    assert host.tree() == before  # thp (written first) restored, shp restored
    assert agent.journal.open_tx() is None


def test_failure_in_second_apply_returns_to_first(tmp_path: Path) -> None:
    agent, host = make_agent(tmp_path, knob_factory=FailingFactory("shp"))
    ok(agent.handle({"op": "apply", "config": {"thp": "never"}, "lease_s": 5}))
    err(agent.handle({"op": "apply", "config": {"thp": "always", "shp": 64}, "lease_s": 5}))
    assert "[never]" in host.read(THP) and host.read(SHP).strip() == "0"
    ok(agent.handle({"op": "rollback"}))
    assert "[madvise]" in host.read(THP)


def test_shortfall_is_a_failure_and_rolls_back(tmp_path: Path) -> None:
    agent, host = make_agent(tmp_path)
    host.hugepage_limit[2048] = 10  # the kernel grants only 10 pages
    e = err(agent.handle({"op": "apply", "config": {"shp": 64}, "lease_s": 5}))
    assert "granted 10" in e["message"]
    assert host.read(SHP).strip() == "0"


def test_recovery_rolls_back_unfinished_experiment(tmp_path: Path) -> None:
    agent, host = make_agent(tmp_path)
    before = host.tree()
    ok(agent.handle({"op": "apply", "config": {"thp": "never", "shp": 64}, "lease_s": 30}))
    # simulate a crash: journal stays as it is, no close()
    agent.journal.close()
    agent.spool.close()
    agent2, _ = make_agent(tmp_path, host=host)
    msgs = agent2.recover()
    assert any("unfinished experiment (2 write(s)" in m for m in msgs)
    assert host.tree() == before


def test_recovery_of_a_write_journaled_but_not_done(tmp_path: Path) -> None:
    """Killed between journaling the snapshot and the write (or mid-write): restored."""
    agent, host = make_agent(tmp_path)
    before = host.tree()
    knob = load_knob("thp", host.fs())
    agent.journal.begin(TxKind.EXPERIMENT, {})
    agent.journal.record_step("thp", knob.snapshot().to_json(), "never")
    knob.apply("never")  # the write happened, the 'done' mark did not
    agent.journal.close()
    agent.spool.close()
    agent2, _ = make_agent(tmp_path, host=host)
    agent2.recover()
    assert host.tree() == before


def test_deployed_sku_kept_across_restart_and_reapplied_after_reboot(tmp_path: Path) -> None:
    agent, host = make_agent(tmp_path)
    ok(agent.handle({"op": "deploy", "config": {"thp": "always"}}))
    ok(agent.handle({"op": "apply", "config": {"shp": 64}, "lease_s": 30}))
    agent.close()  # clean stop: the experiment goes, the SKU stays (TuneD #416)
    assert "[always]" in host.read(THP) and host.read(SHP).strip() == "0"
    # "reboot": sysfs back at boot defaults
    host.file(THP, "always [madvise] never\n")
    agent2, _ = make_agent(tmp_path, host=host)
    msgs = agent2.recover()
    assert any("re-applied the deployed soft SKU" in m for m in msgs)
    assert "[always]" in host.read(THP)
    # undeploy returns to the pre-musku state
    res = ok(agent2.handle({"op": "rollback", "undeploy": True}))
    assert res["restored_originals"] == ["thp", "shp"]
    assert "[madvise]" in host.read(THP)
    assert agent2.journal.deployed() is None


def test_experiment_over_deployed_sku_rolls_back_to_the_sku(tmp_path: Path) -> None:
    agent, host = make_agent(tmp_path)
    ok(agent.handle({"op": "deploy", "config": {"thp": "never"}}))
    ok(agent.handle({"op": "apply", "config": {"thp": "always"}, "lease_s": 30}))
    ok(agent.handle({"op": "rollback"}))
    assert "[never]" in host.read(THP)


def test_lease_lapse_reverts(tmp_path: Path) -> None:
    clock = Clock()
    agent, host = make_agent(tmp_path, clock=clock)
    ok(agent.handle({"op": "apply", "config": {"thp": "never"}, "lease_s": 10}))
    clock.t += 6
    ok(agent.handle({"op": "renew", "lease_s": 10}))
    clock.t += 9.9
    agent.tick()
    assert "[never]" in host.read(THP)
    clock.t += 0.1
    agent.tick()
    assert "[madvise]" in host.read(THP)
    e = err(agent.handle({"op": "renew", "lease_s": 10}))
    assert "no experiment" in e["message"]


def test_outside_change_marks_samples_invalid(tmp_path: Path) -> None:
    agent, host = make_agent(tmp_path)
    ok(agent.handle({"op": "apply", "config": {"thp": "never"}, "lease_s": 30}))
    agent.sample_once()
    host.fs().write_text(THP, "always")  # someone else
    agent.sample_once()
    rows = ok(agent.handle({"op": "collect", "cursor": 0}))["rows"]
    assert [r["valid"] for r in rows] == [True, False]
    assert "outside change: thp" in rows[1]["note"]


def test_collect_is_idempotent_and_ack_prunes(tmp_path: Path) -> None:
    agent, _ = make_agent(tmp_path)
    for _ in range(5):
        agent.sample_once()
    a = ok(agent.handle({"op": "collect", "cursor": 0, "limit": 3}))
    b = ok(agent.handle({"op": "collect", "cursor": 0, "limit": 3}))
    assert a["rows"] == b["rows"] and len(a["rows"]) == 3
    rest = ok(agent.handle({"op": "collect", "cursor": a["cursor"]}))
    assert [r["id"] for r in rest["rows"]] == [4, 5]
    assert ok(agent.handle({"op": "ack", "cursor": a["cursor"]}))["deleted"] == 3
    assert ok(agent.handle({"op": "collect", "cursor": 0}))["rows"] == rest["rows"]


@pytest.mark.parametrize(
    "request_",
    [
        "not an object",
        {"op": "explode"},
        {"noop": 1},
        {"op": "apply", "config": "thp=never"},
        {"op": "apply", "config": {"turbo": 1}},
        {"op": "apply", "config": {"thp": "never"}, "lease_s": "soon"},
        {"op": "apply", "config": {"thp": "never"}, "lease_s": -1},
        {"op": "collect", "cursor": -5},
        {"op": "ack"},
    ],
)
def test_malformed_requests_get_clear_errors(tmp_path: Path, request_: object) -> None:
    agent, host = make_agent(tmp_path)
    before = host.tree()
    e = err(agent.handle(request_))
    assert e["status"] == 3 and e["message"] and "\n" not in e["message"]
    assert host.tree() == before
    assert ok(agent.handle({"op": "status"}))["experiment"] == ""


def test_journal_survives_reopen(tmp_path: Path) -> None:
    j = Journal(tmp_path / "j.sqlite")
    j.begin(TxKind.DEPLOY, {"x": 1})
    seq = j.record_step("thp", {"knob": "thp", "files": []}, "never")
    j.close()
    j2 = Journal(tmp_path / "j.sqlite")
    assert j2.open_tx() is TxKind.DEPLOY and [s.seq for s in j2.steps()] == [seq]
    assert j2.tx_info() == {"x": 1}
    with pytest.raises(Exception, match="already open"):
        j2.begin(TxKind.EXPERIMENT)


def test_spool_cap_drops_oldest_and_counts(tmp_path: Path) -> None:
    from musku.agent.spool import Spool

    sp = Spool(tmp_path / "s.sqlite", max_rows=100)
    for i in range(150):
        sp.add(float(i), 0.1, {"x": float(i)})
    sp.flush()
    assert sp.count() == 100 and sp.dropped == 50
    rows, cur = sp.collect(0, limit=1000)
    assert [r.metrics["x"] for r in rows][:2] == [50.0, 51.0] and cur == 150
    assert sp.ack(120) == 70 and sp.count() == 30
    sp.close()
    sp2 = Spool(tmp_path / "s.sqlite", max_rows=100)
    assert sp2.count() == 30 and sp2.head() == 150
    sp2.close()


def test_collect_can_acknowledge_in_the_same_round_trip(tmp_path: Path) -> None:
    agent, _ = make_agent(tmp_path)
    for _ in range(4):
        agent.sample_once()
    first = ok(agent.handle({"op": "collect", "cursor": 0, "limit": 2}))
    again = ok(agent.handle({"op": "collect", "cursor": first["cursor"], "ack": first["cursor"]}))
    assert [r["id"] for r in again["rows"]] == [3, 4]
    assert agent.spool.count() == 2
    e = err(agent.handle({"op": "collect", "cursor": 1, "ack": 3}))
    assert "ack must be between" in e["message"]
