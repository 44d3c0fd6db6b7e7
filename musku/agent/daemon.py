"""``musku agent run``: the daemon's main loop.

Signal handlers only set flags (uvicorn ``capture_signals``); the main loop notices them
within one tick. SIGTERM/SIGINT stop the agent: a running experiment is rolled back (nobody
could honour its lease while the agent is down), a deployed soft SKU is kept (TuneD #416).
"""

from __future__ import annotations

import fcntl
import logging
import os
import signal
import socket
import sys
import time
from pathlib import Path
from types import FrameType
from typing import TYPE_CHECKING

from musku.agent.core import Agent
from musku.agent.server import Listeners
from musku.errors import HostError
from musku.hostfs import HostFS
from musku.metrics import check_samplers

if TYPE_CHECKING:
    from musku.agent.config import AgentConfig

log = logging.getLogger("musku.agent")
_PRIORITY = {
    logging.DEBUG: 7,
    logging.INFO: 6,
    logging.WARNING: 4,
    logging.ERROR: 3,
    logging.CRITICAL: 2,
}


class _JournaldFormatter(logging.Formatter):
    """Plain lines, no timestamps (journald adds them); under systemd the ``<N>`` syslog
    priority prefix so journald records the level."""

    def __init__(self, prefix: bool) -> None:
        super().__init__("%(levelname)s %(message)s")
        self.prefix = prefix

    def format(self, record: logging.LogRecord) -> str:
        text = super().format(record)
        if self.prefix:
            return "\n".join(
                f"<{_PRIORITY.get(record.levelno, 6)}>{line}" for line in text.splitlines()
            )
        return text


def setup_logging(level: str) -> None:
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(_JournaldFormatter(prefix="JOURNAL_STREAM" in os.environ))
    logger = logging.getLogger("musku")
    logger.handlers[:] = [handler]
    logger.setLevel(level.upper())
    logger.propagate = False


def sd_notify(state: str) -> None:
    """Tell systemd (Type=notify) about our state; a no-op outside systemd."""
    addr = os.environ.get("NOTIFY_SOCKET")
    if not addr:
        return
    if addr.startswith("@"):
        addr = "\0" + addr[1:]
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as s:
        try:
            s.sendto(state.encode(), addr)
        except OSError as exc:
            log.debug("sd_notify: %s", exc)


class _Flags:
    stop = False
    signum = 0


def host_lock_path(root: str) -> Path:
    """One lock per host root: two agents (say the system agent and a private one started by
    the local backend) must never own the same host's knobs at once. For the real root it lives
    in /run/lock; for a test tree, next to the tree (not inside it)."""
    real = Path(root).resolve()
    if str(real) == "/":
        base = Path("/run/lock") if Path("/run/lock").is_dir() else Path("/tmp")
        return base / "musku-agent.lock"
    return real.parent / f".{real.name}.musku-agent.lock"


def _flock(path: Path, what: str) -> int:
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        raise HostError(f"another agent is running on {what} (lock {path} held)") from None
    return fd


class _Locks:
    def __init__(self, fds: list[int]) -> None:
        self.fds = fds

    def release(self) -> None:
        for fd in self.fds:
            os.close(fd)
        self.fds = []


def _lock(config: AgentConfig) -> _Locks:
    """The agent's locks: its state directory, and the host root it manages."""
    config.state_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
    state = _flock(config.state_dir / "agent.lock", str(config.state_dir))
    try:
        host = _flock(host_lock_path(config.root), f"host root {config.root}")
    except HostError:
        os.close(state)
        raise
    return _Locks([state, host])


def serve(agent: Agent, flags: _Flags) -> None:
    """The loop: lease checks, sampling at the configured rate, spool flushes."""
    interval = agent.config.sample_interval_s
    tick = min(0.2, interval)
    now = time.monotonic()
    next_sample, next_flush = now + interval, now + 1.0
    while not flags.stop:
        now = time.monotonic()
        agent.tick()
        if now >= next_sample:
            agent.sample_once()
            next_sample += interval
            if next_sample < now:  # fell behind (suspended, overloaded): skip, do not burst
                next_sample = now + interval
        if now >= next_flush:
            agent.spool.flush()
            next_flush = now + 1.0
        lease = agent.lease_deadline
        wake = min(next_sample, next_flush, now + tick)
        if lease is not None:
            wake = min(wake, max(now, lease))
        time.sleep(max(0.0, wake - time.monotonic()))


def run(config: AgentConfig, *, fs: HostFS | None = None) -> int:
    """Run until SIGTERM/SIGINT. ``fs``: the host (default ``HostFS(config.root)``).

    Every configured sampler is resolved and built with its options first: a plug-in that
    cannot load (a name registered twice, a missing method, not a ``Sampler``) or refuses its
    options is one line, exit 3, before anything runs."""
    fs = fs if fs is not None else HostFS(config.root)
    check_samplers(config.samplers, fs)
    setup_logging(config.log_level)
    flags = _Flags()

    def on_signal(signum: int, frame: FrameType | None) -> None:
        flags.stop = True
        flags.signum = signum

    locks = _lock(config)
    agent = Agent(config, fs=fs)
    listeners = Listeners(agent)
    try:
        agent.recover()
        agent.start_samplers()
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, on_signal)
        signal.signal(signal.SIGHUP, signal.SIG_IGN)  # no reload: restart to change settings
        listeners.start()
        sd_notify("READY=1")
        log.info("agent ready (root %s, sampling every %gs)", config.root, config.sample_interval_s)
        serve(agent, flags)
        log.info("stopping on signal %d", flags.signum)
        sd_notify("STOPPING=1")
    finally:
        listeners.stop()
        agent.close(rollback_experiment=True)
        locks.release()
    return 0
