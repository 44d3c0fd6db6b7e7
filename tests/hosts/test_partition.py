"""A real network partition between the controller and an agent, in the middle of a comparison.

Host A's agent is reached over SSH through an sshd in a network namespace of its own, behind a
veth pair; host B's agent on its Unix socket. The test cuts A's link (``ip link set ... down``
on the namespace's end: the controller's packets are dropped silently, as on a dead switch
port) while a comparison runs, for longer than the lease, then brings it back. It checks:

- the controller notices in seconds (``rpc_timeout_s`` + ``connect_timeout_s``), not minutes;
- A's agent reverts to its baseline when its lease lapses, during the cut;
- the controller waits for the link, then collects what A spooled during the cut: every window
  of the interrupted comparison, before, during and after the cut, has A's samples in the DB;
- the comparison is marked aborted (interrupted) and runs again from its start.

``tc netem loss 100%`` would cut the link the same way; this kernel has no ``sch_netem``.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from musku.domain import Configuration
from musku.errors import Interrupted
from musku.experiment import load_experiment
from tests.agent.helpers import THP, config, fake_host, spawn_daemon
from tests.fixtures.sshd import needs_sshd, run_sshd
from tests.hosts.test_agent_ssh import FakeService
from tests.timing import scaled, slowdown

pytestmark = [
    *needs_sshd,
    pytest.mark.skipif(shutil.which("ip") is None, reason="no iproute2"),
    pytest.mark.slow,
]

# on an idle machine; the test multiplies all three by the machine's slowdown when it starts
# (a busy machine's SSH handshake alone can take longer than 1.5 s, and a link that is up must
# not look cut)
LEASE_S = 3.0
RPC_TIMEOUT_S = 1.5
CONNECT_TIMEOUT_S = 1.5


def _ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True)


@contextlib.contextmanager
def _namespace() -> Iterator[dict[str, str]]:
    """A network namespace joined to this one by a veth pair (names and a /24 unique to this
    process: CI may run beside another test run)."""
    pid = os.getpid()
    ns, outer, inner = f"musku-p{pid}", f"mkh{pid}", f"mkn{pid}"
    net = f"10.{200 + pid % 50}.{(pid // 50) % 250}"
    try:
        _ip("netns", "add", ns)
    except subprocess.CalledProcessError as exc:
        pytest.skip(f"cannot create a network namespace: {exc.stderr.decode().strip()}")
    try:
        _ip("link", "add", outer, "type", "veth", "peer", "name", inner)
        _ip("link", "set", inner, "netns", ns)
        _ip("addr", "add", f"{net}.1/24", "dev", outer)
        _ip("link", "set", outer, "up")
        _ip("netns", "exec", ns, "ip", "addr", "add", f"{net}.2/24", "dev", inner)
        _ip("netns", "exec", ns, "ip", "link", "set", inner, "up")
        _ip("netns", "exec", ns, "ip", "link", "set", "lo", "up")
        yield {"ns": ns, "inner": inner, "address": f"{net}.2"}
    finally:
        subprocess.run(["ip", "link", "del", outer], capture_output=True)
        subprocess.run(["ip", "netns", "del", ns], capture_output=True)


def _link(ns: dict[str, str], state: str) -> None:
    _ip("netns", "exec", ns["ns"], "ip", "link", "set", ns["inner"], state)


def _experiment(tmp: Path, server: dict, hosts: list[dict], k: float) -> Path:
    def table(h: dict) -> str:
        return "{" + ", ".join(f"{k} = {json.dumps(v)}" for k, v in h.items()) + "}"

    p = tmp / "exp.toml"
    p.write_text(
        '[experiment]\nname = "partition"\n[service]\nname = "svc"\nknobs = ["thp"]\n'
        '[platform]\ncatalog = "firecracker-vm"\n[metric]\nprimary = "qps"\n'
        "[statistics]\nsample_interval_s = 0.25\nwarmup_s = 0.5\nsample_cap = 100000\n"
        '[hosts]\nbackend = "agent"\n'
        f"hosts = [{', '.join(table(h) for h in hosts)}]\n"
        f"identity_file = {json.dumps(str(server['dir'] / 'client_key'))}\n"
        f"known_hosts = {json.dumps(str(server['dir'] / 'known_hosts'))}\n"
        f"remote_command = {json.dumps([sys.executable, '-m', 'musku.agent', 'rpc'])}\n"
        f"lease_s = {LEASE_S * k:g}\nrpc_timeout_s = {RPC_TIMEOUT_S * k:g}\n"
        f"connect_timeout_s = {CONNECT_TIMEOUT_S * k:g}\nreconnect_timeout_s = {120 * k:g}\n"
    )
    return p


class Messages:
    """The runner's progress, with the time each message came."""

    def __init__(self) -> None:
        self.got: list[tuple[float, str]] = []
        self.changed = threading.Condition()

    def comparison_started(self, *args: object) -> None: ...

    def comparison_progress(self, info: object) -> None: ...

    def comparison_finished(self, *args: object) -> None: ...

    def message(self, text: str) -> None:
        with self.changed:
            self.got.append((time.time(), text))
            self.changed.notify_all()

    def wait_for(self, word: str, timeout: float) -> float:
        with self.changed:
            ok = self.changed.wait_for(
                lambda: any(word in m for _, m in self.got), timeout=scaled(timeout)
            )
        assert ok, f"no {word!r} message within {scaled(timeout):.0f}s: {self.got}"
        return next(t for t, m in self.got if word in m)


def test_partition_mid_comparison(tmp_path: Path) -> None:
    from musku.hosts.agent import open_pair
    from musku.storage import open_store
    from musku.sweep.runner import Runner

    with contextlib.ExitStack() as stack:
        ns = stack.enter_context(_namespace())
        server = stack.enter_context(
            run_sshd(
                tmp_path / "sshd",
                address=ns["address"],
                port=2222,
                wrap=["ip", "netns", "exec", ns["ns"]],
            )
        )
        hosts_opt, fakes = [], []
        for name in ("a", "b"):
            (tmp_path / name).mkdir()
            host = fake_host(tmp_path / name / "host")
            svc = FakeService(tmp_path / name / "stats.json", 1000.0)
            svc.t.start()
            stack.callback(svc.stop.set)
            cfg = config(
                tmp_path / name,
                sample_interval_s=0.05,
                samplers={"service": {"stats_file": str(svc.path)}},
            )
            pid = spawn_daemon(cfg, host)
            stack.callback(os.waitpid, pid, 0)
            stack.callback(os.kill, pid, 15)
            fakes.append(host)
            entry = {"name": f"host-{name}", "socket": str(cfg.socket)}
            if name == "a":  # behind the namespace's sshd
                entry |= {"host": ns["address"], "port": server["port"]}
            hosts_opt.append(entry)
        k = slowdown()
        exp = load_experiment(_experiment(tmp_path, server, hosts_opt, k))
        store = open_store(f"sqlite:///{tmp_path / 'results.db'}")
        exp_id = store.create_experiment(exp)
        progress = Messages()
        host_a = fakes[0]
        original = host_a.read(THP)
        pair = open_pair(exp)
        stack.callback(pair.close)
        stack.callback(pair.restore)
        runner = Runner(exp, pair, store=store, experiment_id=exp_id, progress=progress)
        base = Configuration.of({"thp": "always"})
        cand = Configuration.of({"thp": "never"})
        outcome: list[BaseException] = []

        def run() -> None:
            try:
                runner.compare("partition", base, cand)
            except BaseException as exc:
                outcome.append(exc)

        t = threading.Thread(target=run, daemon=True)
        stack.callback(t.join, scaled(60))
        stack.callback(runner.stop.set)
        t.start()
        _wait_until(lambda: host_a.read(THP) != original, "no arm applied on A")
        # measuring: windows measured before the cut (3 s on an idle machine; a busy one's
        # round trips to the agents are slower)
        time.sleep(3.0 * k)
        (first,) = _comparisons(store, exp_id)
        cut_at = time.time()
        _link(ns, "down")
        try:
            noticed = progress.wait_for("interrupted", 30)
            # a silent link is noticed in seconds: one request's timeout, one reconnect
            assert noticed - cut_at <= max(k, slowdown()) * (
                2 * (RPC_TIMEOUT_S + CONNECT_TIMEOUT_S) + 3
            )
            # A's lease lapses while the controller cannot renew it: A reverts by itself
            _wait_until(lambda: host_a.read(THP) == original, "A kept its arm", k * LEASE_S + 10)
            reverted_at = time.time()
            time.sleep(max(0.0, cut_at + 2 * k * LEASE_S - time.time()))
        finally:
            _link(ns, "up")
        back_at = time.time()
        progress.wait_for("link back", 60)
        _wait_until(lambda: len(_comparisons(store, exp_id)) == 2, "no second comparison")
        second = _comparisons(store, exp_id)[1]
        _wait_until(lambda: host_a.read(THP) != original, "A not at an arm again")
        runner.stop.set()
        t.join(scaled(60))
        assert not t.is_alive()
        assert len(outcome) == 1 and isinstance(outcome[0], Interrupted), outcome

        with store.engine.connect() as conn:
            status = dict(conn.exec_driver_sql("SELECT id, status FROM comparisons").fetchall())
            rows = conn.exec_driver_sql(
                "SELECT seq, host, t, valid, qps FROM samples WHERE comparison_id = ? "
                "ORDER BY seq, host",
                (first,),
            ).fetchall()
        assert status[first] == "aborted" and second in status  # interrupted, then run again
        a_rows = [r for r in rows if r[1] == 0]
        b_rows = [r for r in rows if r[1] == 1]
        assert [r[0] for r in a_rows] == [r[0] for r in b_rows]
        assert [r[0] for r in a_rows] == list(range(a_rows[0][0], a_rows[0][0] + len(a_rows)))
        # samples A spooled during the cut, collected after it: windows cover the cut with no
        # gap, and every window of A's has its service's rate (rows were there)
        ts = [r[2] for r in a_rows]
        assert ts[0] < cut_at and ts[-1] >= back_at - scaled(2.0)
        # the windows of the cut are contiguous (the hosts' spools, cut into windows after it),
        # and start where the last window measured before it ended
        cut = [t for t in ts if t > cut_at]
        assert len(cut) >= 2 and ts.index(cut[0]) > 0
        steps = [b - a for a, b in zip(cut, cut[1:], strict=False)]
        assert max(steps) == pytest.approx(0.25, abs=1e-6) == min(steps), steps
        assert cut[0] - ts[ts.index(cut[0]) - 1] <= 0.25 + scaled(1.0)
        during = [r for r in a_rows if cut_at + 0.5 < r[2] < back_at - 0.5]
        assert len(during) >= (back_at - cut_at - 1.0) / 0.25 * 0.8, (len(during), len(a_rows))
        # every window's row carries the service's rate, but for the few where the fake service
        # (a thread of this busy test process, writing every 20 ms) wrote nothing for a whole
        # 0.25 s window: the sampler then has no new count, as with a stalled service
        rated = [r for r in a_rows if r[4] is not None and math.isfinite(r[4]) and r[4] > 0]
        assert len(rated) >= 0.9 * len(a_rows), (len(rated), len(a_rows))
        print(  # the figures (pytest -s): docs/agent.md "Lost links"
            f"partition: cut {back_at - cut_at:.1f} s, noticed after {noticed - cut_at:.1f} s, "
            f"A reverted {reverted_at - cut_at:.1f} s into it; windows of A stored: "
            f"{len(a_rows)}, {len(during)} from inside the cut, all with samples"
        )
        # after the lapse A ran at its baseline, not the arm: those windows are invalid
        assert not any(r[3] for r in a_rows if reverted_at + 0.5 < r[2] < back_at - 0.5)
        assert all(r[3] for r in a_rows if r[2] < cut_at - 0.5 and r[0] > a_rows[0][0] + 2)


def _comparisons(store: object, exp_id: int) -> list[int]:
    with store.engine.connect() as conn:  # type: ignore[attr-defined]
        return [
            r[0]
            for r in conn.exec_driver_sql(
                "SELECT id FROM comparisons WHERE experiment_id = ? ORDER BY id", (exp_id,)
            )
        ]


def _wait_until(ok: Callable[[], bool], what: str, timeout: float = 60) -> None:
    deadline = time.monotonic() + scaled(timeout)
    while not ok():
        assert time.monotonic() < deadline, what
        time.sleep(0.1)
