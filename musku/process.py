"""Processes musku starts (the services' servers, memcached, the local backend's agent and
workload): their output goes to a log file, and they are stopped by their own pid only
(SIGTERM for an orderly shutdown, SIGKILL only if they hang)."""

from __future__ import annotations

import os
import signal
import subprocess
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path


def tail(log: Path, lines: int = 3, sep: str = "\n") -> str:
    """The last ``lines`` lines of a log file ("" if it cannot be read)."""
    try:
        return sep.join(log.read_text(errors="replace").strip().splitlines()[-lines:])
    except OSError:
        return ""


def spawn(
    argv: Sequence[str],
    log: Path,
    *,
    append: bool = False,
    cpus: Sequence[int] | None = None,
    preexec: Callable[[], None] | None = None,
    new_session: bool = False,
    cwd: Path | None = None,
) -> subprocess.Popen[bytes]:
    """Start ``argv`` with stdin from /dev/null and stdout and stderr into ``log`` (appended
    to, or truncated); pinned to ``cpus``, ``preexec`` run in the child before the exec, in a
    session of its own with ``new_session`` (a terminal's Ctrl-C then reaches only us)."""
    affinity = set(cpus) if cpus else None

    def before_exec() -> None:  # runs in the child between fork and exec
        if affinity:
            os.sched_setaffinity(0, affinity)
        if preexec is not None:
            preexec()

    with open(log, "ab" if append else "wb") as out:  # the child keeps its own descriptor
        return subprocess.Popen(
            list(argv),
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            preexec_fn=before_exec if affinity or preexec is not None else None,
            start_new_session=new_session,
            close_fds=True,
            cwd=cwd,
        )


@dataclass
class Child:
    """A process we started, with its log."""

    name: str
    popen: subprocess.Popen[bytes]
    log: Path

    @property
    def pid(self) -> int:
        return self.popen.pid

    def alive(self) -> bool:
        return self.popen.poll() is None

    def stop(self, timeout: float = 10.0) -> int:
        """SIGTERM, wait (orderly shutdown), SIGKILL only if it hangs. Returns the exit status."""
        if self.popen.poll() is None:
            self.popen.send_signal(signal.SIGTERM)
            try:
                self.popen.wait(timeout)
            except subprocess.TimeoutExpired:
                self.popen.kill()
                self.popen.wait()
        return self.popen.returncode

    def log_tail(self, lines: int = 5) -> str:
        return tail(self.log, lines)
