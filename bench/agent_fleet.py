"""One controller driving a fleet of REAL agent daemons over REAL SSH (issue 32 item 8).

Each host is a real ``musku agent`` daemon on a fake host tree of its own (the real host is
untouched; tests/agent/helpers.py), reached through a real sshd in a network namespace of its
own behind a veth pair (tests/hosts/test_partition.py), with a service writing musku-stats/1 for
its sampler. The controller opens the hosts as a pool of pairs with the sweeps' code
(``musku.hosts.pool.open_pool`` -> ``musku.hosts.agent.AgentPair``, the SSH transport
``SshLink``) and runs a pool sweep's cycle on every pair at once, one thread per pair as
``Runner.map`` does: apply an arm to both hosts, measure windows (collect), and at the end
roll every host back. In the middle wave the links of ``--cut`` hosts are cut
(``ip link set ... down`` on the namespace's side): their pairs lose the link, wait for it
(``reconnect_timeout_s``), are marked failed with one line each, and the rest go on.

Printed: set-up time, controller CPU and RSS, open file descriptors, time per apply wave,
requests per second, controller and host CPU per request; and, as the baseline in the same
run on the same daemons, the older transport (one SSH exec of ``musku agent rpc`` per request)
against the long-lived ``musku agent rpc --stream`` channel: requests per second and CPU per
request on both sides, as ratios. Checks (exit 1 when one fails): every host's tree is back
at its baseline (rolled back, or reverted by its agent when the lease of a cut host lapsed),
the cut pairs and only they failed, the stream relay started once per host.

    sudo python bench/agent_fleet.py [--hosts 64] [--quick] [--waves 3] [--cut 8]

``--quick``: 8 hosts, 2 cut, 2 waves (the smoke test, tests/hosts/test_agent_fleet.py). Needs
root, iproute2 and sshd. Everything it starts (namespaces ``mkaf<pid>-N``, veths, sshds,
agents, the stats writer, its temporary directory) is removed at the end, also on Ctrl-C or
SIGTERM; a SIGKILLed run leaves them: ``ip netns list | grep mkaf<pid>-``.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import resource
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import musku.agent.daemon  # noqa: E402,F401  (imported once, before the agents are forked)
from musku.domain import Configuration  # noqa: E402
from musku.errors import HostError, LinkDown, MuskuError  # noqa: E402
from tests.agent.helpers import config, fake_host, spawn_daemon  # noqa: E402
from tests.fixtures.sshd import stop_sshd  # noqa: E402
from tests.timing import slowdown  # noqa: E402

SSHD = "/usr/sbin/sshd"
TICK = os.sysconf("SC_CLK_TCK")
RELAY = ["env", f"PYTHONPATH={ROOT}", sys.executable, "-m", "musku.agent", "rpc"]
STATS_WRITER = """
import json, os, sys, time
paths = sys.argv[1:]
t0 = time.time()
while True:
    now = time.time()
    for i, p in enumerate(paths):
        doc = {"format": "musku-stats/1", "pid": 1, "t": now,
               "counters": {"requests": int((now - t0) * 1000 * (1 + i % 4))}}
        with open(p + ".tmp", "w") as f:
            json.dump(doc, f)
        os.replace(p + ".tmp", p)
    time.sleep(0.25)
"""


def _ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True)


class Fleet:
    """The hosts: namespace, veth, sshd and agent daemon each; torn down by :meth:`close`."""

    def __init__(self, n: int, tmp: Path, sample_interval_s: float) -> None:
        self.n, self.tmp = n, tmp
        self.pid = os.getpid()
        self.prefix = f"mkaf{self.pid}-"
        self.net = 150 + self.pid % 50
        self.namespaces: list[str] = []
        self.veths: list[str] = []
        self.sshd: list[subprocess.Popen[bytes]] = []
        self.agents: list[int] = []
        self.hosts: list[Any] = []  # FakeHost per host
        self.sockets: list[Path] = []
        self.addresses = [f"10.{self.net}.{i}.2" for i in range(n)]
        self.writer: subprocess.Popen[bytes] | None = None
        self.sample_interval_s = sample_interval_s

    def ns(self, i: int) -> str:
        return f"{self.prefix}{i}"

    def inner(self, i: int) -> str:
        return f"mkf{self.pid}i{i}"

    # ---- set-up
    def start_agents(self) -> None:
        """Fork the agent daemons first, while this process has no other threads."""
        stats = []
        for i in range(self.n):
            d = self.tmp / f"h{i}"
            d.mkdir()
            host = fake_host(d / "host")
            cfg = config(
                d,
                sample_interval_s=self.sample_interval_s,
                samplers={"service": {"stats_file": str(d / "stats.json")}},
            )
            stats.append(str(d / "stats.json"))
            self.hosts.append(host)
            self.sockets.append(Path(cfg.socket))
            self.agents.append(spawn_daemon(cfg, host, timeout=60 * slowdown()))
        self.writer = subprocess.Popen(
            [sys.executable, "-c", STATS_WRITER, *stats], start_new_session=True
        )

    def start_network(self) -> None:
        keys = self.tmp / "keys"
        keys.mkdir()
        for name in ("host_key", "client_key"):
            subprocess.run(
                ["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(keys / name)],
                check=True,
            )
        (keys / "authorized_keys").write_text((keys / "client_key.pub").read_text())
        kind, key = (keys / "host_key.pub").read_text().split()[:2]
        (keys / "known_hosts").write_text("".join(f"{a} {kind} {key}\n" for a in self.addresses))
        Path("/run/sshd").mkdir(mode=0o755, exist_ok=True)
        for i, address in enumerate(self.addresses):
            ns, outer, inner = self.ns(i), f"mkf{self.pid}o{i}", self.inner(i)
            _ip("netns", "add", ns)
            self.namespaces.append(ns)
            _ip("link", "add", outer, "type", "veth", "peer", "name", inner)
            self.veths.append(outer)
            _ip("link", "set", inner, "netns", ns)
            _ip("addr", "add", f"10.{self.net}.{i}.1/24", "dev", outer)
            _ip("link", "set", outer, "up")
            _ip("-n", ns, "addr", "add", f"{address}/24", "dev", inner)
            _ip("-n", ns, "link", "set", inner, "up")
            _ip("-n", ns, "link", "set", "lo", "up")
            cfg = self.tmp / f"h{i}" / "sshd_config"
            cfg.write_text(
                f"Port 22\nListenAddress {address}\nHostKey {keys / 'host_key'}\n"
                f"PidFile {self.tmp / f'h{i}' / 'sshd.pid'}\n"
                f"AuthorizedKeysFile {keys / 'authorized_keys'}\n"
                "PermitRootLogin prohibit-password\nPasswordAuthentication no\n"
                "KbdInteractiveAuthentication no\nUsePAM no\nStrictModes no\nLogLevel ERROR\n"
            )
            self.sshd.append(
                subprocess.Popen(  # own session: a Ctrl-C reaches them through close() only
                    ["ip", "netns", "exec", ns, SSHD, "-D", "-f", str(cfg)],
                    start_new_session=True,
                )
            )
        deadline = time.monotonic() + 30 * slowdown()
        for i, address in enumerate(self.addresses):
            while True:
                try:
                    socket.create_connection((address, 22), timeout=1).close()
                    break
                except OSError:
                    if time.monotonic() > deadline or self.sshd[i].poll() is not None:
                        raise RuntimeError(f"sshd {i} did not start") from None
                    time.sleep(0.05)

    def cut(self, i: int) -> None:
        _ip("-n", self.ns(i), "link", "set", self.inner(i), "down")

    # ---- the hosts' CPU
    def host_cpu(self, hosts: range | list[int]) -> float:
        """CPU seconds of these hosts' sshd trees so far (every live process, plus what each
        reaped): the transport's cost on the hosts (sshd, the relays); the agents' own work is
        the same for both transports and left out (it includes their sampling)."""
        stat: dict[int, tuple[int, float]] = {}
        for entry in os.listdir("/proc"):
            if entry.isdigit():
                with contextlib.suppress(OSError):
                    f = Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()
                    stat[int(entry)] = (int(f[1]), sum(int(x) for x in f[11:15]) / TICK)
        children: dict[int, list[int]] = {}
        for pid, (ppid, _) in stat.items():
            children.setdefault(ppid, []).append(pid)
        total = 0.0
        for i in hosts:
            todo = [self.sshd[i].pid]
            while todo:
                pid = todo.pop()
                total += stat.get(pid, (0, 0.0))[1]
                todo.extend(children.get(pid, []))
        return total

    def sessions(self, hosts: range | list[int]) -> int:
        """Live connection handlers of these hosts' sshds (once they are gone, all their CPU
        is in the sshds' reaped-children times)."""
        n = 0
        for i in hosts:
            with contextlib.suppress(OSError):
                pid = self.sshd[i].pid
                n += len(Path(f"/proc/{pid}/task/{pid}/children").read_text().split())
        return n

    # ---- tear-down
    def close(self) -> None:
        if self.writer is not None:
            self.writer.terminate()
            self.writer.wait(10)
        for p in self.sshd:  # and their sessions: a cut host's never hear their client go
            stop_sshd(p)
        for pid in self.agents:  # SIGTERM: an agent rolls its experiment back and exits
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGTERM)
        for pid in self.agents:
            with contextlib.suppress(ChildProcessError):
                os.waitpid(pid, 0)
        for v in self.veths:
            subprocess.run(["ip", "link", "del", v], capture_output=True)
        for ns in self.namespaces:
            subprocess.run(["ip", "netns", "del", ns], capture_output=True)


def _experiment(fleet: Fleet, opts: dict[str, float]) -> Any:
    from musku.experiment import load_experiment

    keys = fleet.tmp / "keys"
    hosts = ", ".join(
        "{" + f'name = "h{i:03d}", host = "{a}", port = 22, socket = "{fleet.sockets[i]}"' + "}"
        for i, a in enumerate(fleet.addresses)
    )
    p = fleet.tmp / "fleet.toml"
    p.write_text(
        '[experiment]\nname = "agent-fleet"\n[service]\nname = "svc"\nknobs = ["thp"]\n'
        '[platform]\ncatalog = "firecracker-vm"\n[metric]\nprimary = "qps"\n'
        f'[hosts]\nbackend = "agent"\nhosts = [{hosts}]\n'
        f"identity_file = {json.dumps(str(keys / 'client_key'))}\n"
        f"known_hosts = {json.dumps(str(keys / 'known_hosts'))}\n"
        f"remote_command = {json.dumps(RELAY)}\n"
        + "".join(f"{k} = {v:g}\n" for k, v in opts.items())
    )
    return load_experiment(p)


def _cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def _rss_mib() -> tuple[float, float]:
    """(current, peak) resident set of this process, MiB."""
    fields = dict(line.split(":", 1) for line in Path("/proc/self/status").read_text().splitlines())
    return int(fields["VmRSS"].split()[0]) / 1024, int(fields["VmHWM"].split()[0]) / 1024


def _fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def _wait(ok: Callable[[], bool], timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while not ok():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


# --------------------------------------------------------------------------- the baseline


def transport(fleet: Fleet, hosts: list[int], requests: int, stream: bool) -> dict[str, float]:
    """``requests`` status requests per host, the hosts at once (one thread each), over
    one link per host: requests/s and CPU per request on the controller and the hosts. The
    SSH handshake is done before the clock starts; the stream relay's start is counted."""
    from musku.hosts.agent import SshLink

    keys = fleet.tmp / "keys"
    links = [
        SshLink(
            fleet.addresses[i],
            identity_file=str(keys / "client_key"),
            known_hosts=str(keys / "known_hosts"),
            remote_command=RELAY,
            agent_socket=str(fleet.sockets[i]),
            connect_timeout=30 * slowdown(),
            timeout=120 * slowdown(),
            rpc_timeout=60 * slowdown(),
            stream=stream,
        )
        for i in hosts
    ]
    with ThreadPoolExecutor(len(links)) as pool:
        list(pool.map(lambda link: link._connection(), links))
    host0, cpu0, t0 = fleet.host_cpu(hosts), _cpu(), time.monotonic()

    def run(link: SshLink) -> None:
        for _ in range(requests):
            link.call("status")

    with ThreadPoolExecutor(len(links)) as pool:
        list(pool.map(run, links))
    wall, cpu = time.monotonic() - t0, _cpu() - cpu0
    relays = max(link.channels for link in links)
    # the hosts' CPU with the relays alive (a stream relay's own), and once the sessions are
    # gone (reaped into the sshds' children times); the larger: an sshd session process may
    # exit before reaping its relay, whose CPU then leaves the tree
    alive = fleet.host_cpu(hosts)
    for link in links:
        link.close()
    _wait(lambda: fleet.sessions(hosts) == 0, 20 * slowdown())
    host = max(alive, fleet.host_cpu(hosts)) - host0
    total = requests * len(links)
    return {
        "rps": total / wall,
        "ctl_ms": 1000 * cpu / total,
        "host_ms": 1000 * host / total,
        "processes": relays,
    }


# --------------------------------------------------------------------------- the sweep cycle


class Cycle:
    def __init__(self, fleet: Fleet, args: argparse.Namespace, k: float) -> None:
        self.fleet, self.args, self.k = fleet, args, k
        self.apply_s: list[float] = []  # wall time of each apply wave (every pair at once)
        self.failed_lines: list[str] = []
        self.lock = threading.Lock()

    def run(self) -> dict[str, Any]:
        from musku.hosts.pool import open_pool

        fleet, args, k = self.fleet, self.args, self.k
        exp = _experiment(
            fleet,
            {
                "lease_s": args.lease * k,
                "rpc_timeout_s": args.rpc_timeout * k,
                "connect_timeout_s": args.rpc_timeout * k,
                "reconnect_timeout_s": args.reconnect * k,
            },
        )
        cpu0, fds0, rss0 = _cpu(), _fds(), _rss_mib()[0]
        t0 = time.monotonic()
        pool = open_pool(exp, seed=1)
        open_s = time.monotonic() - t0
        out: dict[str, Any] = {"open_s": open_s, "open_cpu": _cpu() - cpu0}
        links = [getattr(h, "link", None) for pair in pool.pairs for h in pair.hosts]
        try:
            assert not pool.failed, pool.failed
            out["fds_open"] = _fds()
            # every host's link at once (the pool's own links, their relays running):
            # the fleet's request rate when nothing waits for a window
            cpu_b, req_b, t_b = _cpu(), _req(links), time.monotonic()
            with ThreadPoolExecutor(len(links)) as ex:
                list(ex.map(lambda link: [link.call("status") for _ in range(args.burst)], links))
            out["burst_s"] = time.monotonic() - t_b
            out["burst_req"] = _req(links) - req_b
            out["burst_cpu"] = _cpu() - cpu_b
            cut_hosts = [2 * (len(pool) - 1 - j) for j in range(args.cut)]  # host A of the last
            cut_pairs = {i // 2 for i in cut_hosts}
            # host CPU per request on the hosts neither cut (their sessions hang until the
            # tree is torn down) nor used by the baseline (its closed sessions may be reaped
            # meanwhile)
            live_hosts = [i for i in range(fleet.n) if i // 2 not in cut_pairs]
            cpu_hosts = [i for i in live_hosts if i >= args.baseline_hosts]
            cpu_links = [links[i] for i in cpu_hosts]
            cpu1, req1 = _cpu(), _req(links)
            host1, host_req1 = fleet.host_cpu(cpu_hosts), _req(cpu_links)
            t1 = time.monotonic()
            peak_fds = 0
            for w in range(args.waves):
                arm = Configuration.of({"thp": ("always", "never")[w % 2]})
                base = Configuration.of({"thp": "madvise"})
                self.wave(pool, (base, arm), cut=cut_hosts if w == args.waves // 2 else [])
                peak_fds = max(peak_fds, _fds())
                print(
                    f"wave {w + 1}: apply {self.apply_s[-1]:.2f} s, live pairs "
                    f"{len(pool.live())}/{len(pool)}",
                    flush=True,
                )
            t_restore = time.monotonic()
            pool.restore()
            out["restore_s"] = time.monotonic() - t_restore
            out["cycle_s"] = time.monotonic() - t1
            out["requests"] = _req(links) - req1
            out["cpu"] = _cpu() - cpu1
            out["host_cpu_live"] = fleet.host_cpu(cpu_hosts) - host1
            out["requests_live"] = _req(cpu_links) - host_req1
            out["fds_peak"], out["fds_before"] = peak_fds, fds0
            out["rss"], out["rss_before"] = _rss_mib(), rss0
            out["failed"] = dict(pool.failed)
            out["cut_pairs"] = cut_pairs
            out["channels"] = [getattr(link, "channels", 0) for link in links]
            out["live_hosts"] = live_hosts
        finally:
            pool.close()
        return out

    def wave(self, pool: Any, configs: Any, cut: list[int]) -> None:
        """Every live pair at once, one thread each: apply, then ``--windows`` windows (a
        lost link: wait for it, as the runner does; a pair that stays away fails)."""
        live = pool.live()
        applying = [len(live)]
        applied = threading.Condition()

        def done_applying() -> None:
            with applied:
                applying[0] -= 1
                applied.notify_all()

        def lane(p: int) -> None:
            pair = pool.pairs[p]
            arrived = False
            try:
                pair.apply(configs)
                arrived = True
                done_applying()
                try:
                    for _ in range(self.args.windows):
                        pair.window(self.args.window)
                except LinkDown as exc:
                    print(f"  pair {p}: {exc.one_line()}; waiting for the link", flush=True)
                    pair.recover()  # HostError when it stays away
            except HostError as exc:
                with self.lock:
                    self.failed_lines.append(f"{'+'.join(pool.host_names(p))}: {exc.one_line()}")
                pool.fail(p, exc.one_line())
            finally:
                if not arrived:
                    done_applying()

        t0 = time.monotonic()
        threads = [threading.Thread(target=lane, args=(p,), daemon=True) for p in live]
        for t in threads:
            t.start()
        with applied:
            applied.wait_for(lambda: applying[0] == 0)
        self.apply_s.append(time.monotonic() - t0)
        if cut:  # mid-window: the agents hold their arms, the controller is collecting
            time.sleep(self.args.window / 2)
            for i in cut:
                self.fleet.cut(i)
            print(f"  cut the links of {len(cut)} host(s): {cut}", flush=True)
        for t in threads:
            t.join()


def _req(links: list[Any]) -> int:
    return sum(getattr(link, "requests", 0) for link in links)


# --------------------------------------------------------------------------- main


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--hosts", type=int, default=64)
    ap.add_argument("--quick", action="store_true", help="8 hosts, 2 cut, 2 waves")
    ap.add_argument("--waves", type=int, default=3)
    ap.add_argument("--cut", type=int, default=8, help="hosts whose link is cut mid-sweep")
    ap.add_argument("--windows", type=int, default=2, help="windows per pair and wave")
    ap.add_argument("--window", type=float, default=2.0, help="window length, s")
    ap.add_argument("--lease", type=float, default=15.0, help="lease_s (idle machine)")
    ap.add_argument("--reconnect", type=float, default=10.0, help="reconnect_timeout_s")
    ap.add_argument(
        "--rpc-timeout", type=float, default=5.0, help="rpc_timeout_s and connect_timeout_s"
    )
    ap.add_argument("--baseline-hosts", type=int, default=4)
    ap.add_argument("--burst", type=int, default=10, help="status requests per host at once")
    ap.add_argument("--baseline-requests", type=int, default=20, help="per host and transport")
    args = ap.parse_args(argv)
    if args.quick:
        args.hosts, args.cut, args.waves, args.window = 8, 2, 2, 1.0
        args.reconnect, args.lease, args.baseline_hosts = 3.0, 8.0, 2
        args.baseline_requests, args.rpc_timeout, args.burst = 6, 2.0, 5
    if os.geteuid() != 0 or shutil.which("ip") is None or not os.path.exists(SSHD):
        print("agent_fleet: needs root, iproute2 and sshd", file=sys.stderr)
        return 4
    if not 4 <= args.hosts <= 250 or args.hosts % 2:
        print("agent_fleet: --hosts must be even, 4..250", file=sys.stderr)
        return 2
    if not 0 <= args.cut < args.hosts // 2:
        print("agent_fleet: --cut must leave a pair whole", file=sys.stderr)
        return 2

    def on_term(signum: int, frame: object) -> None:
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, on_term)
    # Ctrl-C stops the run even when this process was started with SIGINT ignored (a
    # background job of a non-interactive shell, such as a CI script, inherits SIG_IGN, and
    # Python then installs no handler of its own: the interrupt was silently lost)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    logging.disable(logging.ERROR)  # the pairs that fail are printed below, one line each
    k = slowdown()
    tmp = Path(tempfile.mkdtemp(prefix="musku-agent-fleet-"))
    # agents sample at 2 Hz (5 Hz with --quick: opening a pair waits for 5 rows per host)
    fleet = Fleet(args.hosts, tmp, sample_interval_s=0.2 if args.quick else 0.5)
    print(f"agent_fleet: {args.hosts} hosts, namespaces {fleet.prefix}N, slowdown {k:.1f}")
    try:
        t0 = time.monotonic()
        fleet.start_agents()
        fleet.start_network()
        print(f"hosts up: {time.monotonic() - t0:.1f} s (agents, namespaces, sshds)", flush=True)
        before = [h.tree() for h in fleet.hosts]
        nb = min(args.baseline_hosts, args.hosts)
        base = list(range(nb))
        one = transport(fleet, base, args.baseline_requests, stream=False)
        streamed = transport(fleet, base, args.baseline_requests, stream=True)
        print(f"transport, {nb} hosts x {args.baseline_requests} status requests:")
        for name, r in (("exec per request", one), ("stream channel", streamed)):
            print(
                f"  {name:17s} {r['rps']:7.1f} req/s  controller {r['ctl_ms']:6.2f} ms CPU/req"
                f"  host {r['host_ms']:6.2f} ms CPU/req  relay processes per host "
                f"{r['processes']:g}"
            )
        print(
            f"  stream/exec: {streamed['rps'] / one['rps']:.1f}x req/s, controller CPU "
            f"{streamed['ctl_ms'] / one['ctl_ms']:.2f}x, host CPU "
            f"{streamed['host_ms'] / one['host_ms']:.3f}x per request"
        )
        cycle = Cycle(fleet, args, k)
        res = cycle.run()
        pairs = args.hosts // 2
        rss, peak = res["rss"]
        print(
            f"pool of {pairs} pairs opened in {res['open_s']:.1f} s "
            f"({res['open_cpu']:.1f} s controller CPU, SSH handshakes and hellos)"
        )
        print(
            f"burst: {res['burst_req']} status requests, every host's link at once: "
            f"{res['burst_req'] / res['burst_s']:.0f} req/s "
            f"({res['burst_req'] / res['burst_s'] / one['rps']:.0f}x the exec baseline's, "
            f"{res['burst_req'] / res['burst_s'] / streamed['rps']:.1f}x the stream "
            f"baseline's on {nb} hosts); controller "
            f"{1000 * res['burst_cpu'] / res['burst_req']:.2f} ms CPU/request"
        )
        print(
            f"sweep cycle: {args.waves} waves x (apply + {args.windows} x {args.window:g} s "
            f"windows) + rollback in {res['cycle_s']:.1f} s; apply waves "
            + ", ".join(f"{s:.2f}" for s in cycle.apply_s)
            + f" s; rollback {res['restore_s']:.2f} s"
        )
        rps = res["requests"] / res["cycle_s"]
        print(
            f"requests: {res['requests']} ({rps:.1f}/s); controller CPU {res['cpu']:.1f} s "
            f"({100 * res['cpu'] / res['cycle_s']:.0f} % of one core, "
            f"{1000 * res['cpu'] / max(1, res['requests']):.2f} ms/request = "
            f"{res['cpu'] / max(1, res['requests']) * 1000 / one['ctl_ms']:.2f}x the exec "
            "baseline's); host CPU "
            f"{1000 * res['host_cpu_live'] / max(1, res['requests_live']):.2f} ms/request "
            f"(sshd + relay; hosts not cut) = "
            f"{res['host_cpu_live'] / max(1, res['requests_live']) * 1000 / one['host_ms']:.3f}x"
        )
        print(
            f"controller: RSS {rss:.0f} MiB (peak {peak:.0f}, {res['rss_before']:.0f} before "
            f"the pool), open fds {res['fds_open']} with the pool open (peak "
            f"{res['fds_peak']}, {res['fds_before']} before)"
        )
        print(f"link cut on {args.cut} host(s) mid-sweep; pairs failed, one line each:")
        for line in cycle.failed_lines:
            print(f"  {line}")
        # checks
        problems = []
        if set(res["failed"]) != res["cut_pairs"]:
            problems.append(f"failed pairs {sorted(res['failed'])} != cut {res['cut_pairs']}")
        extra = [c for i, c in enumerate(res["channels"]) if i in res["live_hosts"] and c != 1]
        if extra:
            problems.append(f"stream relays started more than once on a host: {extra}")
        # a cut host reverts by itself when its lease lapses (its agent never heard the
        # rollback)
        back = _wait(
            lambda: (
                sum(h.tree() == b for h, b in zip(fleet.hosts, before, strict=True)) == args.hosts
            ),
            args.lease * k + 15 * slowdown(),
        )
        same = sum(h.tree() == b for h, b in zip(fleet.hosts, before, strict=True))
        print(f"hosts back at their baseline: {same}/{args.hosts}")
        if not back:
            problems.append(f"{args.hosts - same} host(s) not at their baseline")
        if one["processes"] < args.baseline_requests or streamed["processes"] != 1:
            problems.append(f"relay processes: exec {one['processes']}, stream {streamed}")
        for p in problems:
            print(f"FAILED: {p}")
        return 1 if problems else 0
    except KeyboardInterrupt:
        print("agent_fleet: interrupted; cleaning up", file=sys.stderr)
        return 130
    except (MuskuError, RuntimeError, subprocess.CalledProcessError) as exc:
        msg = exc.one_line() if isinstance(exc, MuskuError) else str(exc)
        print(f"agent_fleet: error: {msg}", file=sys.stderr)
        return 1
    finally:
        signal.signal(signal.SIGINT, signal.SIG_IGN)  # a second Ctrl-C must not stop the clean-up
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        fleet.close()
        shutil.rmtree(tmp, ignore_errors=True)
        left = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
        if fleet.prefix in left:
            print(f"agent_fleet: namespaces left: {fleet.prefix}*", file=sys.stderr)
        else:
            print(f"cleaned up: namespaces {fleet.prefix}*, sshds, agents, {tmp}", flush=True)


if __name__ == "__main__":
    code = main()
    if code == 130:
        # interrupted mid-sweep, everything the run started is gone: pair threads may still
        # wait on links to the torn-down hosts (a long op's timeout, minutes), and the
        # interpreter's exit would join their request threads first
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
    sys.exit(code)
