"""The agent under a flood of unauthenticated connections (issue 18, "Must show").

A real agent daemon (forked, ``musku.agent.daemon.run``) on a fake host tree, with its Unix
socket and its HMAC-authenticated TCP port. After a baseline (the daemon's RSS and threads, a
controller's request latency), this process opens ``--idle`` (1,000) unauthenticated TCP
connections that send nothing and ``--slow`` (100) that trickle an endless first line
(``--chunk`` 64 bytes every 0.1 s); every connection the agent drops is reopened at once. Meanwhile an
authenticated controller (``AgentClient`` over TCP, timeout 5 s) sends ``status`` every 0.1 s
and a local one does the same on the Unix socket.

    python bench/agent_server_load.py [--idle 1000] [--slow 100] [--seconds 30]

Prints the daemon's RSS and thread count (baseline, peak, ratio), the controllers' latencies
(baseline, under load, ratio) and the drops; exits 1 if a bound is broken. Bounds: RSS peak at
most the baseline + 64 MiB, threads at most the baseline + the request pool (4), every
controller request answered within its 5 s timeout.
"""

from __future__ import annotations

import argparse
import os
import resource
import selectors
import shutil
import signal
import socket
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from musku.agent.client import AgentClient  # noqa: E402
from musku.agent.server import DEFAULT_LIMITS  # noqa: E402
from musku.errors import MuskuError  # noqa: E402
from tests.agent.helpers import spawn_tcp_daemon  # noqa: E402

TOKEN = b"musku-bench-token-0123456789abcdef"
TIMEOUT_S = 5.0
RSS_BOUND_MIB = 64.0


def proc_status(pid: int) -> dict[str, float]:
    out: dict[str, float] = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        key, _, value = line.partition(":")
        if key in ("VmRSS", "VmHWM"):
            out[key] = int(value.split()[0]) / 1024
        elif key == "Threads":
            out[key] = int(value)
    out["fds"] = len(list(Path(f"/proc/{pid}/fd").iterdir()))
    return out


class Flood:
    """``idle`` silent and ``slow`` trickling unauthenticated connections on one thread,
    reopened whenever the agent drops one."""

    def __init__(self, port: int, idle: int, slow: int, gap: float = 0.1, chunk: int = 64) -> None:
        self.port, self.gap, self.chunk = port, gap, chunk
        self.sel = selectors.DefaultSelector()
        self.drops = 0
        self.connects = 0
        self.conns: dict[socket.socket, bool] = {}  # socket -> slow sender?
        for i in range(idle + slow):
            self._open(i >= idle)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="flood", daemon=True)
        self._thread.start()

    def _open(self, slow: bool) -> None:
        while True:
            try:
                s = socket.create_connection(("127.0.0.1", self.port), timeout=TIMEOUT_S)
                break
            except OSError:
                time.sleep(0.05)
        s.setblocking(False)
        self.sel.register(s, selectors.EVENT_READ)
        self.conns[s] = slow
        self.connects += 1

    def _drop(self, s: socket.socket) -> None:
        slow = self.conns.pop(s)
        self.sel.unregister(s)
        s.close()
        self.drops += 1
        self._open(slow)

    def _run(self) -> None:
        next_send = time.monotonic()
        while not self._stop.is_set():
            for key, _ in self.sel.select(timeout=self.gap):
                s = key.fileobj
                assert isinstance(s, socket.socket)
                try:
                    if s.recv(65536):
                        continue  # the agent's refusal line; EOF follows
                except BlockingIOError:
                    continue
                except OSError:
                    pass
                self._drop(s)
            if time.monotonic() >= next_send:
                next_send += self.gap
                for s, slow in list(self.conns.items()):
                    if slow:
                        try:
                            s.send(b"x" * self.chunk)
                        except BlockingIOError:
                            pass
                        except OSError:
                            self._drop(s)

    def close(self) -> None:
        self._stop.set()
        self._thread.join()
        for s in list(self.conns):
            s.close()


def controller_loop(
    client: AgentClient, seconds: float, out: list[float], errors: list[str]
) -> None:
    t_end = time.monotonic() + seconds
    while time.monotonic() < t_end:
        t0 = time.monotonic()
        try:
            client.call("status")
            out.append(time.monotonic() - t0)
        except MuskuError as exc:
            errors.append(exc.one_line())
        time.sleep(0.1)


def quantiles(xs: list[float]) -> dict[str, float]:
    if not xs:
        return {"n": 0, "p50": float("nan"), "p99": float("nan"), "max": float("nan")}
    xs = sorted(xs)
    return {
        "n": len(xs),
        "p50": statistics.median(xs),
        "p99": xs[min(len(xs) - 1, int(0.99 * len(xs)))],
        "max": xs[-1],
    }


def run(idle: int, slow: int, seconds: float, chunk: int = 64) -> dict[str, Any]:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    need = idle + slow + 256
    if soft < need:
        resource.setrlimit(resource.RLIMIT_NOFILE, (min(hard, max(need, soft)), hard))
    tmp = Path(tempfile.mkdtemp(prefix="musku-agent-load-"))
    cfg, host, port, pid = spawn_tcp_daemon(tmp, TOKEN)
    tcp = AgentClient(tcp=f"127.0.0.1:{port}", token=TOKEN, timeout=TIMEOUT_S)
    unix = AgentClient(cfg.socket, timeout=TIMEOUT_S)
    try:
        base_lat: list[float] = []
        base_unix: list[float] = []
        errors: list[str] = []
        controller_loop(tcp, 3.0, base_lat, errors)
        controller_loop(unix, 1.0, base_unix, errors)
        base = proc_status(pid)
        t0 = time.monotonic()
        flood = Flood(port, idle, slow, chunk=chunk)
        opened_s = time.monotonic() - t0
        lat: list[float] = []
        lat_unix: list[float] = []
        peak = dict(base)
        stop = threading.Event()

        def sample() -> None:
            while not stop.wait(0.5):
                st = proc_status(pid)
                for k, v in st.items():
                    peak[k] = max(peak[k], v)

        sampler = threading.Thread(target=sample, daemon=True)
        sampler.start()
        u = threading.Thread(target=controller_loop, args=(unix, seconds, lat_unix, errors))
        u.start()
        controller_loop(tcp, seconds, lat, errors)
        u.join()
        stop.set()
        sampler.join()
        during = proc_status(pid)
        flood.close()
        return {
            "idle": idle,
            "slow": slow,
            "chunk": chunk,
            "seconds": seconds,
            "opened_s": opened_s,
            "base": base,
            "during": during,
            "peak": peak,
            "connects": flood.connects,
            "drops": flood.drops,
            "latency_base": quantiles(base_lat),
            "latency": quantiles(lat),
            "latency_unix_base": quantiles(base_unix),
            "latency_unix": quantiles(lat_unix),
            "errors": errors,
        }
    finally:
        tcp.close()
        unix.close()
        os.kill(pid, signal.SIGTERM)
        os.waitpid(pid, 0)
        shutil.rmtree(tmp, ignore_errors=True)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--idle", type=int, default=1000)
    ap.add_argument("--slow", type=int, default=100)
    ap.add_argument("--seconds", type=float, default=30.0)
    ap.add_argument(
        "--chunk",
        type=int,
        default=64,
        help="bytes a slow sender sends every 0.1 s (65536: 100 clients each pushing a 4 MiB line)",
    )
    a = ap.parse_args()
    r = run(a.idle, a.slow, a.seconds, a.chunk)
    b, p = r["base"], r["peak"]
    print(
        f"flood: {r['idle']} idle + {r['slow']} slow ({r['chunk']} B every 0.1 s) "
        "unauthenticated TCP connections "
        f"(opened in {r['opened_s']:.1f} s), {r['seconds']:g} s; the agent dropped "
        f"{r['drops']} (reopened at once)"
    )
    print(
        f"agent RSS: baseline {b['VmRSS']:.1f} MiB, peak {p['VmRSS']:.1f} MiB "
        f"({p['VmRSS'] / b['VmRSS']:.2f}x; bound +{RSS_BOUND_MIB:g} MiB)"
    )
    print(
        f"agent threads: baseline {b['Threads']:.0f}, peak {p['Threads']:.0f} "
        f"(bound baseline + {DEFAULT_LIMITS.workers}); open fds peak {p['fds']:.0f}"
    )
    for name, key in (("TCP (HMAC)", "latency"), ("Unix socket", "latency_unix")):
        q0, q = r[f"{key}_base"], r[key]
        print(
            f"controller over {name}: {q['n']} requests, p50 {q['p50'] * 1e3:.1f} ms "
            f"(baseline {q0['p50'] * 1e3:.1f} ms, {q['p50'] / q0['p50']:.2f}x), "
            f"p99 {q['p99'] * 1e3:.1f} ms, max {q['max'] * 1e3:.1f} ms (timeout {TIMEOUT_S:g} s)"
        )
    if r["errors"]:
        print(f"controller errors: {len(r['errors'])}, first: {r['errors'][0]}")
    ok = (
        p["VmRSS"] <= b["VmRSS"] + RSS_BOUND_MIB
        and p["Threads"] <= b["Threads"] + DEFAULT_LIMITS.workers
        and not r["errors"]
        and max(r["latency"]["max"], r["latency_unix"]["max"]) < TIMEOUT_S
    )
    print("bounds: " + ("all held" if ok else "BROKEN"))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
