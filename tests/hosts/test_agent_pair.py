"""The agent backend over Unix sockets (two real daemons on fake hosts): a failure on one host
rolls both back; a lost experiment (agent restarted) fails the next window; bad options."""

from __future__ import annotations

import dataclasses
import os
import signal
import time
from pathlib import Path

import pytest

from musku.agent.spool import Row
from musku.domain import Configuration
from musku.errors import HostError, InputError
from musku.experiment import load_experiment
from musku.hosts.agent import AgentHost, AgentPair, SocketLink, aggregate, open_pair
from tests.agent.helpers import SHP, THP, config, fake_host, spawn_daemon
from tests.timing import scaled

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="needs root")


def _pair(tmp: Path, limits: tuple[int, int] = (1 << 30, 1 << 30)):  # type: ignore[no-untyped-def]
    daemons = []
    for name, limit in zip("ab", limits, strict=True):
        host = fake_host(tmp / name / "host")
        host.hugepage_limit[2048] = limit
        cfg = config(tmp / name, sample_interval_s=0.05)
        daemons.append((spawn_daemon(cfg, host), host, cfg))
    hosts = (
        AgentHost("a", SocketLink(daemons[0][2].socket)),
        AgentHost("b", SocketLink(daemons[1][2].socket)),
    )
    return AgentPair(hosts, lease_s=5.0, name="t"), daemons


def _stop(daemons: list) -> None:  # type: ignore[type-arg]
    for pid, _, _ in daemons:
        try:
            os.kill(pid, signal.SIGTERM)
            os.waitpid(pid, 0)
        except ChildProcessError:
            pass


def test_failure_on_one_host_rolls_back_both(tmp_path: Path) -> None:
    pair, daemons = _pair(tmp_path, limits=(1 << 30, 10))  # host b grants only 10 huge pages
    before = [h.tree() for _, h, _ in daemons]
    try:
        cfg = Configuration.of({"thp": "always", "shp": 64})
        with pytest.raises(HostError, match="both hosts rolled back"):
            pair.apply((cfg, cfg))
        assert [h.tree() for _, h, _ in daemons] == before
    finally:
        pair.close()
        _stop(daemons)


def test_restarted_agent_fails_the_next_window(tmp_path: Path) -> None:
    pair, daemons = _pair(tmp_path)
    try:
        pair.apply((Configuration.of({"thp": "never"}), Configuration.of({"thp": "always"})))
        a, b = pair.window(0.3)
        assert a.valid and b.valid and "[always]" in daemons[1][1].read(THP)
        # host b's agent is killed and restarted: it rolls its experiment back at start
        pid, host, cfg = daemons[1]
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
        daemons[1] = (spawn_daemon(cfg, host), host, cfg)
        assert "[madvise]" in host.read(THP)
        time.sleep(pair.lease_s / 3 + 0.5)  # the lease keeper notices at its next renewal
        with pytest.raises(HostError, match="no experiment is running"):
            pair.window(0.1)
        pair.restore()
        assert "[madvise]" in daemons[0][1].read(THP) and daemons[0][1].read(SHP).strip() == "0"
    finally:
        pair.close()
        _stop(daemons)


class CountingLink(SocketLink):
    """The real Unix-socket link, counting the requests it sends by op."""

    def __init__(self, path: Path) -> None:
        super().__init__(path)
        self.ops: dict[str, int] = {}

    def call(self, op: str, **fields: object) -> object:
        self.ops[op] = self.ops.get(op, 0) + 1
        return super().call(op, **fields)


def test_windows_are_contiguous_and_collected_at_once(tmp_path: Path) -> None:
    """A batch of windows is one wait and one collection per host, cut into contiguous
    windows (window by window, each window's round trips came on top of it: a 50 ms window
    behind a 0.3 s round trip took 7x its length)."""
    daemons = []
    for name in "ab":
        cfg = config(tmp_path / name, sample_interval_s=0.01)
        daemons.append((spawn_daemon(cfg, fake_host(tmp_path / name / "host")), None, cfg))
    links = [CountingLink(c.socket) for _, _, c in daemons]
    hosts = (AgentHost("a", links[0]), AgentHost("b", links[1]))
    pair = AgentPair(hosts, lease_s=scaled(10.0), name="t")
    try:
        pair.apply((Configuration.of(thp="never"), Configuration.of(thp="always")))
        for link in links:
            link.ops.clear()
        got = pair.windows(0.05, 20)
        assert len(got) == 20
        for h in (0, 1):
            ws = [ab[h] for ab in got]
            assert all(w.duration >= 0.05 for w in ws), [w.duration for w in ws]
            # the rows are in their windows (a busy machine may leave one without a row)
            assert sum(w.valid for w in ws) >= len(ws) // 2, [w.note for w in ws]
            assert all(w.note in ("", "no samples in the window") for w in ws)
            # each window starts where the one before it ended
            assert all(b.t - b.duration == a.t for a, b in zip(ws, ws[1:], strict=False))
        for link in links:  # one collection (and a few polls while the spool catches up)
            assert link.ops.get("collect", 0) <= 5, link.ops
        # the next batch starts when it is asked for: after this one, never inside it
        (a, _), *_ = pair.windows(0.05, 2)
        assert a.t - a.duration >= got[-1][0].t
    finally:
        pair.close()
        _stop(daemons)


def test_aggregate_rules() -> None:
    arm = Configuration.of({"thp": "never"})
    key = arm.key()
    rows = [
        Row(1, 10.1, 0.1, {"ops": 100.0}, True, "", key),
        Row(2, 10.2, 0.1, {"ops": 300.0}, True, "", key),
        Row(3, 10.45, 0.25, {"ops": 1000.0}, True, "", key),  # midpoint 10.325: inside
        Row(4, 11.0, 0.1, {"ops": 5.0}, True, "", key),  # outside
    ]
    s = aggregate(rows, host="h", t0=10.0, t1=10.5, arm=arm, expect={"ops", "qps"})
    assert s.metrics["ops"] == pytest.approx((10 + 30 + 250) / 0.45)
    assert not s.valid and "no data for qps" in s.note  # a source went quiet
    s = aggregate(rows[:2], host="h", t0=10.0, t1=10.5, arm=Configuration.of({"thp": "always"}))
    assert not s.valid and "arm's configuration" in s.note
    assert not aggregate([], host="h", t0=0, t1=1).valid
    # a row taken while a request held the agent's state (a lease renewal): skipped, not
    # "another configuration"
    busy = Row(5, 10.3, 0.1, {"ops": 7.0}, True, "busy", "")
    s = aggregate([*rows[:2], busy], host="h", t0=10.0, t1=10.5, arm=arm)
    assert s.valid and s.metrics["ops"] == pytest.approx(200.0), s
    s = aggregate([busy], host="h", t0=10.0, t1=10.5, arm=arm)
    assert not s.valid and "no samples" in s.note


def test_bad_host_options(tmp_path: Path) -> None:
    e = load_experiment(ROOT / "experiments" / "local-vm.toml")

    def with_opts(**opts: object):  # type: ignore[no-untyped-def]
        return dataclasses.replace(
            e, hosts=dataclasses.replace(e.hosts, backend="agent", options=opts)
        )

    with pytest.raises(InputError, match="two hosts"):
        open_pair(with_opts(hosts=["one"]))
    with pytest.raises(InputError, match="listed twice"):
        open_pair(with_opts(hosts=["x", "x"]))
    with pytest.raises(InputError, match="unknown host key"):
        open_pair(with_opts(hosts=[{"host": "a", "colour": 1}, "b"]))
    with pytest.raises(InputError, match="remote_command"):
        open_pair(with_opts(hosts=["a", "b"], remote_command="musku agent rpc; rm -rf /"))
    with pytest.raises(HostError, match="cannot reach"):
        open_pair(
            with_opts(
                hosts=[
                    {"name": "a", "socket": str(tmp_path / "none.sock")},
                    {"name": "b", "socket": str(tmp_path / "none2.sock")},
                ]
            )
        )


def test_clock_offset_comes_from_the_tightest_round_trip(monkeypatch: pytest.MonkeyPatch) -> None:
    """A host clock 5 s ahead; the first call (a new SSH connection) takes 3 s, the next ones
    10-40 ms with the reply's clock read at asymmetric points. The offset is the tightest
    round trip's, off by at most half of it."""
    now = [1000.0]
    monkeypatch.setattr(time, "time", lambda: now[0])

    class Scripted:
        def __init__(self, trips: list[tuple[float, float]]) -> None:
            self.trips = trips  # (seconds to the host's clock read, seconds after it)

        def call(self, op: str, **fields: object) -> dict:
            before, after = self.trips.pop(0) if self.trips else (0.2, 0.2)
            now[0] += before
            reply = {"time": now[0] + 5.0, "spool_head": 0, "rows": [], "cursor": 0}
            now[0] += after
            return reply

        def close(self) -> None:
            pass

    link = Scripted([(2.9, 0.1), (0.03, 0.01), (0.005, 0.005), (0.002, 0.038)])
    h = AgentHost("a", link)
    monkeypatch.setattr(AgentHost, "_learn_metrics", lambda self, wait_s=5.0: None)
    h.hello()
    assert h.offset_rtt == pytest.approx(0.010)
    assert h.offset == pytest.approx(5.0, abs=h.offset_rtt / 2)
    assert h.offset == pytest.approx(5.0)  # that trip was symmetric
    # The first trip alone would have been 1.4 s off.
    h.note_time(1000.0, 1002.9 + 5.0, 1003.0, force=True)
    assert abs(h.offset - 5.0) == pytest.approx(1.4)
