"""Whole real A/B comparisons on this machine: switchback through the local backend (an agent
and the built-in memory workload), decided by musku.abtest, the host restored after each.

    python bench/agent_local_ab.py                      # THP madvise -> always, once
    python bench/agent_local_ab.py --knob shp --runs 5  # SHP 0 -> 128, five times
    python bench/agent_local_ab.py --aa --runs 20       # A/A: THP madvise vs madvise, SHP 0 vs 0
    python bench/agent_local_ab.py --socket /run/musku/agent.sock  # through a running agent
    python bench/agent_local_ab.py --via ssh-netns      # the agent over sshd in a netns

Statistics and host options come from experiments/local-vm.toml (flags override them). Each
run prints one line: decision, estimate and interval, windows, minutes, and whether THP
(enabled, defrag) and nr_hugepages read back byte for byte as before; ``--jsonl FILE`` appends
the same as JSON. At the end, one summary line per knob: runs, decisions, and for an A/A the
false-positive rate (better or worse) with its Clopper-Pearson 95 % interval, the largest
|estimate| and how many intervals covered 0. ``--load FILE...`` prints that summary from saved
``--jsonl`` files (several chunks merged) without running anything.

Each run first waits until no agent owns the real host (the lock every agent on "/" and the
real-host tests take: /run/lock/musku-agent.lock); the run's agent then holds it, and a run
whose agent lost the race to another one is retried. The private agent's state lives in a
fresh temporary directory unless ``--state-dir`` names one.

``--via ssh-netns``: the path a fleet uses. The bench starts a ``musku agent`` on this
machine's real root (it holds the real-host lock for the whole bench), a network namespace
joined to this one by a veth pair, and a real sshd inside it (generated host and client keys,
host key checked); the comparison reaches the agent as a controller reaches a remote host, one
SSH exec of ``musku agent rpc`` per request, over the veth. Needs root, ``ip`` and sshd.

Exit status 1 when a run left the host changed; 3 when --load finds nothing; 4 when
``--via ssh-netns`` cannot be set up here (no netns, no sshd), with the reason.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import math
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

SETTINGS: dict[str, tuple[Any, Any]] = {"thp": ("madvise", "always"), "shp": (0, 128)}


def host_state() -> dict[str, bytes]:
    """The bytes of every file the two knobs write (the huge page pool through sysfs: a
    read of /proc/sys/vm/nr_hugepages with HostFS's large buffer fails with ENOMEM)."""
    from musku.hostfs import HUGEPAGES_DIR, THP_DIR, HostFS

    fs = HostFS("/")
    paths = [
        THP_DIR + "/enabled",
        THP_DIR + "/defrag",
        HUGEPAGES_DIR + "/hugepages-2048kB/nr_hugepages",
    ]
    return {p: fs.read_bytes(p) for p in paths if fs.exists(p)}


def wait_for_host(timeout: float) -> None:
    """Wait until no agent (nor a real-host test) holds this machine's host lock, then let go:
    the run's own agent takes it (an flock cannot be handed to another process)."""
    from musku.agent.daemon import _flock, _Locks, host_lock_path
    from musku.errors import HostError

    deadline = time.monotonic() + timeout
    while True:
        try:
            fd = _flock(host_lock_path("/"), "host root /")
        except HostError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.5)
            continue
        _Locks([fd]).release()
        return


def _lost_race(exc: BaseException) -> bool:
    return "another agent is running" in str(exc)


def one_run(args: argparse.Namespace, knob: str, seed: int, via: Any = None) -> dict[str, Any]:
    """One comparison; retried (host state read again) while its agent loses the host lock
    to another agent started between our wait and its start. ``via``: an
    :class:`SshNetnsAgent` (its agent holds the lock already) or None."""
    from musku.errors import HostError

    for attempt in range(args.lock_tries):
        if not args.socket and via is None:
            wait_for_host(args.lock_timeout)
        try:
            return _one_run(args, knob, seed, via)
        except HostError as exc:
            if not _lost_race(exc) or attempt + 1 == args.lock_tries:
                raise
            print(f"# the host lock was taken first ({exc}); waiting", file=sys.stderr)
    raise AssertionError("unreachable")


def _one_run(args: argparse.Namespace, knob: str, seed: int, via: Any) -> dict[str, Any]:
    from musku.abtest import run_comparison
    from musku.domain import Configuration
    from musku.experiment import load_experiment
    from musku.hosts.local import open_pair

    e = load_experiment(ROOT / "experiments" / "local-vm.toml")
    opts = dict(e.hosts.options)
    for key, value in (
        ("settle_s", args.settle),
        ("arena_mib", args.arena_mib),
        ("socket", args.socket),
        ("state_dir", args.state_dir or tempfile.mkdtemp(prefix="musku-ab-")),
    ):
        if value is not None:
            opts[key] = value
    e = dataclasses.replace(e, hosts=dataclasses.replace(e.hosts, options=opts))
    st = e.spec.stats
    st = dataclasses.replace(
        st,
        sample_interval_s=args.interval or st.sample_interval_s,
        sample_cap=args.cap or st.sample_cap,
        min_effect=args.min_effect or st.min_effect,
        seed=seed,
    )
    spec = dataclasses.replace(e.spec, stats=st)
    a, b = SETTINGS[knob]
    base = Configuration.of({knob: a})
    cand = Configuration.of({knob: a if args.aa else b})
    before = host_state()
    t0 = time.monotonic()
    pair = open_pair(e, seed=seed, link=None if via is None else via.link())
    try:
        link_kind = type(pair.agent.link).__name__
        r = run_comparison(pair, base, cand, spec)
        pair.restore()
    finally:
        pair.close()
    wall = time.monotonic() - t0
    after = host_state()
    finite = math.isfinite(r.ci_low) and math.isfinite(r.ci_high)
    return {
        "knob": knob,
        "A": str(base),
        "B": str(cand),
        "seed": seed,
        "decision": r.decision.value,
        "estimate": r.estimate,
        "ci_low": r.ci_low if finite else None,
        "ci_high": r.ci_high if finite else None,
        "covers_0": (r.ci_low <= 0.0 <= r.ci_high) if finite else None,
        "windows": r.samples,
        "minutes": wall / 60.0,
        "switches": pair.switches,
        "restored": after == before,
        "reason": r.reason,
        "via": via.label if via is not None else (args.socket or "private agent"),
        "transport": {} if via is None else via.describe(link_kind),
    }


def line(row: dict[str, Any]) -> str:
    if row["ci_low"] is None:
        iv = "no interval"
    else:
        iv = f"[{100 * row['ci_low']:+.2f}, {100 * row['ci_high']:+.2f}] %"
    return (
        f"{row['knob']:4} {row['A']:>12} -> {row['B']:<12} {row['decision']:14} "
        f"{100 * row['estimate']:+7.2f} % {iv:24} n={row['windows']:<4} "
        f"{row['minutes']:5.1f} min  {'restored' if row['restored'] else 'NOT RESTORED'}"
    )


class SetupError(Exception):
    """The transport cannot be built on this machine (the reason is the message)."""


def _run(*argv: str) -> None:
    r = subprocess.run(argv, capture_output=True, text=True)
    if r.returncode:
        raise SetupError(f"{' '.join(argv)}: {(r.stderr or r.stdout).strip()[:200]}")


def _listening(ns: str, address: str, port: int) -> bool:
    probe = "import socket,sys; socket.create_connection((sys.argv[1], int(sys.argv[2])), 1)"
    argv = ["ip", "netns", "exec", ns, sys.executable, "-c", probe, address, str(port)]
    return subprocess.run(argv, capture_output=True).returncode == 0


class SshNetnsAgent:
    """A ``musku agent`` on this machine's real root, reached over a real sshd listening in a
    network namespace behind a veth pair: the controller's requests cross the veth as a
    fleet's cross the network. ``link()`` is a fresh :class:`~musku.hosts.agent.SshLink` for
    one pair (the pair closes it)."""

    SSHD = "/usr/sbin/sshd"

    def __init__(self, work: Path, stats_file: Path) -> None:
        self.work, self.stats_file = work, stats_file
        pid = os.getpid()
        self.ns, self.outer, self.inner = f"musku-ab{pid}", f"mab{pid}", f"mabn{pid}"
        net = f"10.{150 + pid % 50}.{(pid // 50) % 250}"
        self.address, self.port = f"{net}.2", 2222
        self.label = "musku agent over sshd in a netns"
        self._stack = contextlib.ExitStack()
        self.agent_pid = 0

    @staticmethod
    def unavailable() -> str | None:
        """Why this transport cannot run here, or None."""
        if os.geteuid() != 0:
            return "needs root (a network namespace, sshd for root, the real host's knobs)"
        if shutil.which("ip") is None:
            return "no iproute2 (ip)"
        if not os.path.exists(SshNetnsAgent.SSHD) or shutil.which("ssh-keygen") is None:
            return "no sshd"
        return None

    def __enter__(self) -> SshNetnsAgent:
        try:
            self._namespace()
            self._sshd()
            self._agent()
        except BaseException:
            self._stack.close()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self._stack.close()

    def _namespace(self) -> None:
        _run("ip", "netns", "add", self.ns)
        self._stack.callback(subprocess.run, ["ip", "netns", "del", self.ns], capture_output=True)
        _run("ip", "link", "add", self.outer, "type", "veth", "peer", "name", self.inner)
        self._stack.callback(subprocess.run, ["ip", "link", "del", self.outer], capture_output=True)
        net = self.address.rsplit(".", 1)[0]
        _run("ip", "link", "set", self.inner, "netns", self.ns)
        _run("ip", "addr", "add", f"{net}.1/24", "dev", self.outer)
        _run("ip", "link", "set", self.outer, "up")
        inside = ("ip", "netns", "exec", self.ns)
        _run(*inside, "ip", "addr", "add", f"{self.address}/24", "dev", self.inner)
        _run(*inside, "ip", "link", "set", self.inner, "up")
        _run(*inside, "ip", "link", "set", "lo", "up")

    def _sshd(self) -> None:
        d = self.work / "sshd"
        d.mkdir(parents=True, exist_ok=True)
        for key in ("host_key", "client_key"):  # fresh keys (a retried set-up: new ones)
            for old in (d / key, d / f"{key}.pub"):
                old.unlink(missing_ok=True)
            _run("ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(d / key))
        (d / "authorized_keys").write_text((d / "client_key.pub").read_text())
        (d / "sshd_config").write_text(
            f"Port {self.port}\nListenAddress {self.address}\nHostKey {d / 'host_key'}\n"
            f"PidFile {d / 'sshd.pid'}\nAuthorizedKeysFile {d / 'authorized_keys'}\n"
            "PermitRootLogin prohibit-password\nPasswordAuthentication no\n"
            "KbdInteractiveAuthentication no\nUsePAM no\nStrictModes no\nLogLevel ERROR\n"
            "MaxStartups 100\nMaxSessions 100\n"
        )
        kind, key = (d / "host_key.pub").read_text().split()[:2]
        (d / "known_hosts").write_text(f"[{self.address}]:{self.port} {kind} {key}\n")
        Path("/run/sshd").mkdir(mode=0o755, exist_ok=True)
        argv = ["ip", "netns", "exec", self.ns, self.SSHD, "-D", "-f", str(d / "sshd_config")]
        proc = subprocess.Popen([*argv, "-E", str(d / "sshd.log")])

        def stop() -> None:  # the listener and its sessions (tests/fixtures/sshd.py)
            from tests.fixtures.sshd import stop_sshd

            stop_sshd(proc, 20)

        self._stack.callback(stop)
        deadline = time.monotonic() + 60
        while not _listening(self.ns, self.address, self.port):
            if time.monotonic() > deadline or proc.poll() is not None:
                log = (d / "sshd.log").read_text()[-300:] if (d / "sshd.log").exists() else ""
                raise SetupError(f"sshd did not start in {self.ns}: {log.strip()}")
            time.sleep(0.1)

    def _agent(self) -> None:
        from musku.hosts.local import ChildProcess, _wait_for_socket

        self.socket = self.work / "agent.sock"
        # the service sampler needs the stats file's directory at its start
        self.stats_file.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        cfg = self.work / "agent.toml"
        cfg.write_text(
            "[agent]\n"
            'root = "/"\n'
            f"state_dir = {str(self.work / 'agent')!r}\n"
            f"socket = {str(self.socket)!r}\n"
            "sample_interval_s = 0.1\n"
            "default_lease_s = 30.0\n"
            "[samplers.perf]\n[samplers.psutil]\n"
            f"[samplers.service]\nstats_file = {str(self.stats_file)!r}\n"
        )
        os.chmod(cfg, 0o600)
        argv = [sys.executable, "-m", "musku.agent", "run", "--config", str(cfg)]
        agent = ChildProcess.start(argv, self.work / "agent.log", "agent")
        self.agent_pid = agent.pid
        self._stack.callback(agent.stop)
        _wait_for_socket(self.socket, agent).close()

    def describe(self, link_kind: str) -> dict[str, Any]:
        return {
            "link": link_kind,
            "netns": self.ns,
            "address": self.address,
            "port": self.port,
            "agent_pid": self.agent_pid,
        }

    def link(self) -> Any:
        from musku.hosts.agent import SshLink

        d = self.work / "sshd"
        # the remote command runs this checkout's musku (sshd's environment has no PYTHONPATH)
        command = ["env", f"PYTHONPATH={ROOT}", sys.executable, "-m", "musku.agent", "rpc"]
        return SshLink(
            self.address,
            port=self.port,
            identity_file=str(d / "client_key"),
            known_hosts=str(d / "known_hosts"),
            remote_command=command,
            agent_socket=str(self.socket),
            connect_timeout=30.0,
            timeout=120.0,
            rpc_timeout=60.0,
        )


def clopper_pearson(k: int, n: int, conf: float = 0.95) -> tuple[float, float]:
    from scipy.stats import beta

    a = 1 - conf
    lo = 0.0 if k == 0 else float(beta.ppf(a / 2, k, n - k + 1))
    hi = 1.0 if k == n else float(beta.ppf(1 - a / 2, k + 1, n - k))
    return lo, hi


def summary(rows: list[dict[str, Any]]) -> list[str]:
    """One line per (knob, A, B): runs, decisions; for an A/A (A == B) the false-positive
    rate with its Clopper-Pearson 95 % interval, the largest |estimate| and the coverage of 0."""
    out = []
    groups: dict[tuple[str, str, str, str], list[dict[str, Any]]] = {}
    for r in rows:
        groups.setdefault((r["knob"], r["A"], r["B"], r.get("via", "")), []).append(r)
    for (knob, a, b, via), rs in groups.items():
        n = len(rs)
        counts: dict[str, int] = {}
        for r in rs:
            counts[r["decision"]] = counts.get(r["decision"], 0) + 1
        decisions = ", ".join(f"{k} {v}" for k, v in sorted(counts.items()))
        restored = sum(bool(r["restored"]) for r in rs)
        mins = sum(r["minutes"] for r in rs)
        head = f"{knob} {a} vs {b} via {via}: {n} runs ({decisions}); restored {restored}/{n}"
        if a == b:
            fp = sum(r["decision"] in ("better", "worse") for r in rs)
            lo, hi = clopper_pearson(fp, n)
            with_iv = [r for r in rs if r["covers_0"] is not None]
            cov = sum(bool(r["covers_0"]) for r in with_iv)
            big = max(abs(r["estimate"]) for r in rs)
            head += (
                f"; false positives {fp}/{n} = {100 * fp / n:.1f} % "
                f"[CP 95 % {100 * lo:.1f}, {100 * hi:.1f}]; max |estimate| {100 * big:.1f} %; "
                f"interval covers 0 in {cov}/{len(with_iv)}"
            )
        out.append(head + f"; {mins:.1f} min in all")
    return out


def main() -> int:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--knob", choices=["thp", "shp", "both"], default=None)
    p.add_argument("--aa", action="store_true", help="A/A: the baseline against itself")
    p.add_argument("--runs", type=int, default=1)
    p.add_argument("--interval", type=float, default=None)
    p.add_argument("--settle", type=float, default=None)
    p.add_argument("--cap", type=int, default=None)
    p.add_argument("--arena-mib", type=int, default=None)
    p.add_argument("--socket", default=None, help="a running agent's Unix socket")
    p.add_argument(
        "--via",
        choices=["private", "ssh-netns"],
        default="private",
        help="private: the local backend's own agent (or --socket); ssh-netns: see above",
    )
    p.add_argument("--min-effect", type=float, default=None)
    p.add_argument("--state-dir", default=None)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--jsonl", type=Path, default=None, help="append each run as JSON")
    p.add_argument("--load", type=Path, nargs="+", default=None, help="summarise saved runs")
    p.add_argument("--lock-timeout", type=float, default=1800.0, help="wait for the host lock")
    p.add_argument("--lock-tries", type=int, default=50, help="starts lost to another agent")
    a = p.parse_args()
    if a.via == "ssh-netns" and a.socket:
        p.error("--socket and --via ssh-netns name two different agents: give one")
    if a.load:
        try:
            saved = [json.loads(ln) for f in a.load for ln in f.read_text().splitlines() if ln]
        except (OSError, ValueError) as exc:
            print(f"--load: {exc}", file=sys.stderr)
            return 3
        for ln in summary(saved):
            print(ln)
        return 0 if saved else 3
    knobs = ["thp", "shp"] if (a.knob or ("both" if a.aa else "thp")) == "both" else [a.knob]
    with contextlib.ExitStack() as stack:
        via = None
        if a.via == "ssh-netns":
            why = SshNetnsAgent.unavailable()
            if why:
                print(f"--via ssh-netns: {why}", file=sys.stderr)
                return 4
            work = Path(tempfile.mkdtemp(prefix="musku-ab-ssh-"))
            a.state_dir = a.state_dir or str(work / "state")
            try:
                via = _ssh_netns_agent(a, work)  # entered
                stack.callback(via.__exit__, None, None, None)
            except SetupError as exc:
                print(f"--via ssh-netns: {exc}", file=sys.stderr)
                return 4
        ok, rows = _runs(a, knobs, via)
    for ln in summary(rows):
        print(ln, flush=True)
    return 0 if ok else 1


def _ssh_netns_agent(a: argparse.Namespace, work: Path) -> SshNetnsAgent:
    """Set up and enter the transport once the host lock is free (again when its agent lost
    the lock to another one started meanwhile)."""
    from musku.errors import HostError

    for attempt in range(a.lock_tries):
        wait_for_host(a.lock_timeout)
        via = SshNetnsAgent(work, Path(a.state_dir) / "workload.json")
        try:
            return via.__enter__()
        except HostError as exc:
            if attempt + 1 == a.lock_tries or "exited at start" not in str(exc):
                raise
    raise AssertionError("unreachable")


def _runs(a: argparse.Namespace, knobs: list[str], via: Any) -> tuple[bool, list[dict[str, Any]]]:
    ok = True
    rows: list[dict[str, Any]] = []
    for i in range(a.runs):
        for knob in knobs:
            row = one_run(a, knob, a.seed + i, via)
            print(line(row), flush=True)
            ok &= bool(row["restored"])
            rows.append(row)
            if a.jsonl is not None:
                with a.jsonl.open("a") as f:
                    f.write(json.dumps(row) + "\n")
    return ok, rows


if __name__ == "__main__":
    sys.exit(main())
