"""Agent ownership (issue 20 item 3): a lease belongs to one experiment and one controller;
another owner's apply/renew/deploy/rollback is refused naming the owner unless it carries an
operator override; the owner is journaled (it outlives an agent restart); a lapsed lease frees
the agent; the host CLI's ``musku agent rollback`` is refused (exit 6) unless ``--force``."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
from pathlib import Path

import pytest

from musku.agent.client import AgentClient
from tests.agent.helpers import THP, Clock, config, err, fake_host, make_agent, ok, spawn_daemon

A = {"experiment": "exp-a", "controller": "alice@ctl-1:100:aaaa"}
B = {"experiment": "exp-b", "controller": "bob@ctl-2:200:bbbb"}


def apply(agent, owner: dict, value: str = "never", **kw) -> dict:  # type: ignore[no-untyped-def]
    return agent.handle({"op": "apply", "config": {"thp": value}, "lease_s": 30, **owner, **kw})


def test_second_experiment_apply_refused_naming_the_owner(tmp_path: Path) -> None:
    agent, host = make_agent(tmp_path)
    ok(apply(agent, A))
    e = err(apply(agent, B, "always"))
    assert e["status"] == 6
    msg = e["message"]
    assert "\n" not in msg and "exp-a" in msg and A["controller"] in msg and "lease" in msg
    assert "[never]" in host.read(THP)  # nothing of B's written
    # the same controller under another experiment name is another owner too
    err(apply(agent, {**A, "experiment": "exp-other"}, "always"))
    # the owner itself goes on (same experiment, or the experiment left out)
    ok(apply(agent, A, "always"))
    ok(apply(agent, {"controller": A["controller"]}, "never"))
    ok(agent.handle({"op": "renew", "lease_s": 30, **A}))
    assert agent.op_status({})["owner"]["controller"] == A["controller"]


@pytest.mark.parametrize("op", ["renew", "deploy", "rollback"])
def test_non_owner_renew_deploy_rollback_refused(tmp_path: Path, op: str) -> None:
    agent, host = make_agent(tmp_path)
    ok(apply(agent, A))
    req: dict = {"op": op, **B}
    if op == "deploy":
        req["config"] = {"thp": "always"}
    e = err(agent.handle(req))
    assert e["status"] == 6 and "exp-a" in e["message"] and f"{op} refused" in e["message"]
    # an anonymous caller (no controller field: an old controller, or `musku agent rollback`)
    # cannot touch a named controller's lease either
    anon = {k: v for k, v in req.items() if k not in ("experiment", "controller")}
    assert err(agent.handle(anon))["status"] == 6
    assert "[never]" in host.read(THP) and agent.journal.deployed() is None
    ok(agent.handle({"op": "rollback", **A}))  # the owner can
    assert "[madvise]" in host.read(THP)


def test_override_takes_over_and_is_logged(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    agent, host = make_agent(tmp_path)
    ok(apply(agent, A))
    with caplog.at_level(logging.WARNING, logger="musku"):
        res = ok(apply(agent, B, "always", override=True))
    assert res["experiment"] == "exp-b"
    assert any(
        "operator override" in r.getMessage() and "exp-a" in r.getMessage() for r in caplog.records
    )
    assert "[always]" in host.read(THP)
    assert agent.journal.tx_info()["controller"] == B["controller"]
    # B owns it now: A is refused, B's rollback restores the pre-experiment state (A's too)
    assert "exp-b" in err(apply(agent, A))["message"]
    ok(agent.handle({"op": "rollback", **B}))
    assert "[madvise]" in host.read(THP)
    # an override on rollback alone
    ok(apply(agent, A))
    ok(agent.handle({"op": "rollback", "override": True}))
    assert "[madvise]" in host.read(THP) and agent.op_status({})["owner"] is None


def test_owner_survives_agent_restart(tmp_path: Path) -> None:
    agent, host = make_agent(tmp_path)
    ok(apply(agent, A))
    agent.journal.close()  # a crash: the journal stays as it is
    agent.spool.close()
    agent2, _ = make_agent(tmp_path, host=host)
    agent2.recover()
    assert "[madvise]" in host.read(THP)  # the experiment's writes rolled back, as before
    owner = agent2.op_status({})["owner"]
    assert owner is not None and owner["experiment"] == "exp-a"
    assert owner["controller"] == A["controller"] and 0 < owner["lease_remaining_s"] <= 30
    e = err(apply(agent2, B, "always"))
    assert e["status"] == 6 and A["controller"] in e["message"]
    ok(apply(agent2, A, "always"))  # the owner re-applies
    assert agent2.journal.tx_info()["controller"] == A["controller"]


def test_lease_lapse_frees_the_agent(tmp_path: Path) -> None:
    clock = Clock()
    agent, host = make_agent(tmp_path, clock=clock)
    ok(apply(agent, A))
    clock.t += 29
    err(apply(agent, B, "always"))
    clock.t += 1.5
    # lapsed: free even before the tick rolls it back
    ok(apply(agent, B, "always"))
    assert agent.op_status({})["owner"]["experiment"] == "exp-b"
    clock.t += 31
    agent.tick()
    assert "[madvise]" in host.read(THP) and agent.op_status({})["owner"] is None
    ok(apply(agent, A))


def test_bad_owner_fields_are_input_errors(tmp_path: Path) -> None:
    agent, _ = make_agent(tmp_path)
    assert err(apply(agent, {"controller": 7}))["status"] == 3
    assert err(apply(agent, A, override="yes"))["status"] == 3


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    return subprocess.run(
        [sys.executable, "-m", "musku", "agent", *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root (socket ownership)")
def test_cli_rollback_refused_then_forced(tmp_path: Path) -> None:
    host = fake_host(tmp_path / "host")
    cfg = config(tmp_path, sample_interval_s=0.1)
    pid = spawn_daemon(cfg, host)
    try:
        c = AgentClient(cfg.socket)
        c.call("apply", config={"thp": "never"}, lease_s=300, **A)
        c.close()
        r = _cli("rollback", "--socket", str(cfg.socket))
        assert r.returncode == 6, r
        lines = r.stderr.strip().splitlines()
        assert len(lines) == 1 and "exp-a" in lines[0] and A["controller"] in lines[0], r.stderr
        assert "[never]" in host.read(THP)
        st = _cli("status", "--socket", str(cfg.socket))
        assert st.returncode == 0 and A["controller"] in st.stdout, st
        r = _cli("rollback", "--force", "--socket", str(cfg.socket))
        assert r.returncode == 0, r
        assert "[madvise]" in host.read(THP)
    finally:
        import signal

        os.kill(pid, signal.SIGTERM)
        os.waitpid(pid, 0)
