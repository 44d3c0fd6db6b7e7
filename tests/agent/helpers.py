"""Agents on fake host trees (musku/testing/fakehost.py) for the agent tests and the fault bench."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from musku.agent.config import AgentConfig
from musku.agent.core import Agent
from musku.hostfs import HUGEPAGES_DIR, THP_DIR
from musku.knobs import load_knob
from musku.knobs.base import Knob
from musku.testing.fakehost import FakeHost, FakeKernelFS, vm_host

THP = THP_DIR + "/enabled"
SHP = HUGEPAGES_DIR + "/hugepages-2048kB/nr_hugepages"


def fake_host(root: Path) -> FakeHost:
    return vm_host(root)


class AtomicFakeFS(FakeKernelFS):
    """The fake kernel, with attribute updates atomic as in the kernel: a SIGKILL of the agent
    mid-write must not leave a half-written sysfs file (the plain fake truncates, then writes:
    an artifact no kernel attribute shows)."""

    def _store(self, path: str, text: str) -> None:
        import os

        real = self.host(path)
        tmp = real.with_name(real.name + ".fake-tmp")
        tmp.write_text(text)
        os.replace(tmp, real)


def fs_of(host: FakeHost) -> AtomicFakeFS:
    return AtomicFakeFS(host.root, host=host)


def config(tmp: Path, **over: Any) -> AgentConfig:
    base: dict[str, Any] = {
        "root": str(tmp / "host"),
        "state_dir": tmp / "state",
        "socket": tmp / "agent.sock",
        "sample_interval_s": 0.05,
        "samplers": {},
    }
    base.update(over)
    return AgentConfig(**base)


class FailingFactory:
    """Real knobs, except that ``fail`` raises on apply after writing (a refused write)."""

    def __init__(self, fail: str = "", *, after_write: bool = True) -> None:
        self.fail = fail
        self.after_write = after_write

    def __call__(self, name: str, fs: Any, **options: object) -> Knob:
        knob = load_knob(name, fs, **options)
        if name != self.fail:
            return knob
        orig = knob.apply
        after = self.after_write

        def apply(value: Any, *, dry_run: bool = False) -> Any:
            if dry_run:
                return orig(value, dry_run=True)
            if after:
                orig(value)
            raise OSError(5, "Input/output error (injected)")

        knob.apply = apply  # type: ignore[method-assign]
        return knob


def make_agent(tmp: Path, host: FakeHost | None = None, **kw: Any) -> tuple[Agent, FakeHost]:
    host = host or fake_host(tmp / "host")
    cfg_over = kw.pop("config", {})
    agent = Agent(config(tmp, **cfg_over), fs=fs_of(host), **kw)
    return agent, host


def state(host: FakeHost) -> tuple[str, str]:
    return host.read(THP), host.read(SHP)


def spawn_daemon(cfg: AgentConfig, host: FakeHost, *, timeout: float = 20.0) -> int:
    """Fork a real agent daemon (``musku.agent.daemon.run``) on the fake host; returns its pid
    once its socket answers. Stop it with os.kill(pid, ...) and reap with os.waitpid."""
    import os
    import time

    from musku.agent.client import AgentClient
    from musku.errors import HostError

    pid = os.fork()
    if pid == 0:  # child: the daemon
        code = 1
        try:
            import logging

            from musku.agent.daemon import run

            logging.disable(logging.WARNING)
            code = run(cfg, fs=fs_of(host))
        finally:
            os._exit(code)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            raise RuntimeError(f"agent daemon exited at start (status {status})")
        if cfg.socket.exists():
            c = AgentClient(cfg.socket, timeout=5)
            try:
                c.call("hello")
                return pid
            except HostError:
                pass
            finally:
                c.close()
        time.sleep(0.02)
    os.kill(pid, 9)
    os.waitpid(pid, 0)
    raise RuntimeError("agent daemon did not answer")


def write_stats(path: Path, t: float, requests: int) -> None:
    """A fake service's musku-stats/1 file (read by the agent's service sampler), replaced
    atomically as a real service does."""
    import json
    import os

    tmp = path.with_suffix(".tmp")
    tmp.write_text(
        json.dumps(
            {"format": "musku-stats/1", "pid": 1, "t": t, "counters": {"requests": requests}}
        )
    )
    os.replace(tmp, path)


def wait_for_real_host(timeout: float = 240.0, *, hold: bool = True) -> Any:
    """Serialise tests that change this machine's real knobs with any agent on "/" (and with
    other engineers' real-host tests that take the same lock). Returns the held lock (call
    ``.release()``), or None with ``hold=False`` (waited until free, then let go)."""
    import time

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
        locks = _Locks([fd])
        if hold:
            return locks
        locks.release()
        return None


def spawn_tcp_daemon(tmp: Path, token: bytes) -> tuple[AgentConfig, FakeHost, int, int]:
    """A daemon on a fake host under ``tmp`` that also listens on a free loopback TCP port
    with HMAC ``token``: (config, host, port, pid)."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    (tmp / "token").write_bytes(token)
    host = fake_host(tmp / "host")
    cfg = config(tmp, tcp_listen=f"127.0.0.1:{port}", token_file=tmp / "token")
    return cfg, host, port, spawn_daemon(cfg, host)


def ok(reply: dict[str, Any]) -> Any:
    """The result of a successful agent reply (fails the test otherwise)."""
    assert reply["ok"], reply
    return reply["result"]


def err(reply: dict[str, Any]) -> Any:
    """The error of a refused agent reply (fails the test otherwise)."""
    assert not reply["ok"], reply
    return reply["error"]


class Clock:
    """A monotonic clock the test moves by hand (``clock.t += 61``)."""

    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t
