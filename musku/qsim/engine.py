"""Running a normalised model through the C++ engine (``musku_qsim``, built from services/qsim).

The engine runs under a CPU-time and an address-space bound (``setrlimit`` in the child before
it starts: ``RLIMIT_CPU``, ``RLIMIT_AS``) and a wall-clock backstop, so a model that asks for
more work than it can do in its budget (a week of simulated time at a million requests a
second, a hundred million threads) ends with one clear line and exit status 3, never a run that
does not end or a machine out of memory. The budget is :class:`Limits` (``--cpu-limit``,
``--memory-limit`` on ``musku qsim run | curve``; ``MUSKU_QSIM_CPU_S`` and
``MUSKU_QSIM_MEMORY_MIB`` for every caller).
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import resource
import select
import signal
import time
from collections.abc import Callable
from pathlib import Path

from musku.errors import InputError, MuskuError, UnsupportedError
from musku.services.binaries import binary as services_binary

TYPE_CHECKING = False  # not typing's: the qsim quick path never imports typing
if TYPE_CHECKING:
    from typing import Any

BINARY = "qsim/musku_qsim"

DEFAULT_CPU_S = 600.0
"""CPU seconds one command may spend in the engine (every run of a curve together)."""
DEFAULT_MEMORY_MIB = 2048
"""Address space of one engine process (its peak RSS on the shipped models is under 10 MiB)."""
MAX_CPU_S = 7 * 86_400.0
MIN_MEMORY_MIB = 64
WALL_FACTOR = 10.0
"""A run is stopped after this many times its CPU budget in wall time, plus a minute (an
engine that blocks, or a machine so busy it gets a tenth of a core)."""


def _env_number(name: str, default: float) -> float:
    raw = os.environ.get(name)
    if raw is None or raw == "":
        return default
    try:
        value = float(raw)
    except ValueError:
        raise InputError(f"{name} must be a number, not {raw!r}") from None
    if not math.isfinite(value) or value <= 0:
        raise InputError(f"{name} must be a positive number, not {raw!r}")
    return value


class Limits:
    """The engine's budget for one command: CPU seconds (spent down by every run) and the
    address space of each engine process. (A plain class: ``dataclasses`` costs the qsim quick
    path ~0.03 CPU-s to import.)"""

    __slots__ = ("cpu_s", "memory_mib", "spent_s")

    def __init__(
        self,
        cpu_s: float = DEFAULT_CPU_S,
        memory_mib: int = DEFAULT_MEMORY_MIB,
        spent_s: float = 0.0,
    ) -> None:
        self.cpu_s = cpu_s
        self.memory_mib = memory_mib
        self.spent_s = spent_s
        if not (math.isfinite(self.cpu_s) and 0 < self.cpu_s <= MAX_CPU_S):
            raise InputError(f"--cpu-limit must be in (0, {MAX_CPU_S:g}] s, not {self.cpu_s}")
        if not MIN_MEMORY_MIB <= self.memory_mib <= 1 << 22:
            raise InputError(
                f"--memory-limit must be in {MIN_MEMORY_MIB}..{1 << 22} MiB, not {self.memory_mib}"
            )

    def __repr__(self) -> str:
        return f"Limits(cpu_s={self.cpu_s!r}, memory_mib={self.memory_mib!r}, spent_s={self.spent_s!r})"

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Limits):
            return NotImplemented
        return (self.cpu_s, self.memory_mib, self.spent_s) == (
            other.cpu_s,
            other.memory_mib,
            other.spent_s,
        )

    __hash__ = None  # type: ignore[assignment]  # mutable, as the dataclass was

    @classmethod
    def from_env(cls, cpu_s: float | None = None, memory_mib: int | None = None) -> Limits:
        """Options first, then ``MUSKU_QSIM_CPU_S`` / ``MUSKU_QSIM_MEMORY_MIB``, then the
        defaults."""
        return cls(
            cpu_s=cpu_s if cpu_s is not None else _env_number("MUSKU_QSIM_CPU_S", DEFAULT_CPU_S),
            memory_mib=memory_mib
            if memory_mib is not None
            else int(_env_number("MUSKU_QSIM_MEMORY_MIB", DEFAULT_MEMORY_MIB)),
        )

    @property
    def left_s(self) -> float:
        return self.cpu_s - self.spent_s

    def preexec(self) -> Callable[[], None]:
        """The child's ``preexec_fn``: the CPU bound (SIGXCPU at the soft limit, SIGKILL a
        second later) and the address-space bound (allocations fail: the engine reports
        ``bad_alloc``)."""
        cpu = max(1, math.ceil(self.left_s))
        mem = self.memory_mib << 20

        def limit() -> None:
            resource.setrlimit(resource.RLIMIT_CPU, (cpu, cpu + 1))
            resource.setrlimit(resource.RLIMIT_AS, (mem, mem))
            resource.setrlimit(resource.RLIMIT_CORE, (0, 0))

        return limit

    def wall_s(self) -> float:
        return self.left_s * WALL_FACTOR + 60.0

    def check_left(self) -> None:
        if self.left_s <= 0:
            raise self.over_cpu()

    def over_cpu(self) -> InputError:
        return InputError(
            f"the simulation needed more than its {self.cpu_s:g} CPU-second budget "
            "(--cpu-limit): shorten duration_s (--duration), lower the load or fewer rates, "
            "or raise the budget"
        )

    def over_memory(self) -> InputError:
        return InputError(
            f"the simulation needed more than its {self.memory_mib} MiB of memory "
            "(--memory-limit): lower max_live_requests / max_live_jobs, instances, threads or "
            "connections, or raise the budget"
        )

    def failure(self, returncode: int, stderr: str) -> MuskuError:
        """What an engine that did not succeed means, in one line."""
        lines = stderr.strip().splitlines()
        last = lines[-1] if lines else ""
        if returncode in (-signal.SIGXCPU, -signal.SIGKILL) and self.left_s <= 1.5:
            return self.over_cpu()
        if "bad_alloc" in last or "bad_array_new_length" in last:
            return self.over_memory()
        if returncode == 3:
            return InputError(last or "the engine refused the model")
        if returncode < 0:
            try:
                name = signal.Signals(-returncode).name
            except ValueError:
                name = f"signal {-returncode}"
            return MuskuError(f"musku_qsim was killed by {name}: {last}".rstrip(": "))
        return MuskuError(f"musku_qsim exited with status {returncode}: {last}".rstrip(": "))

    def charge(self, before: resource.struct_rusage) -> None:
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        self.spent_s += (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def binary() -> Path:
    """The engine binary ($MUSKU_QSIM overrides; else the services' release build)."""
    env = os.environ.get("MUSKU_QSIM")
    if env:
        p = Path(env)
        if not (p.is_file() and os.access(p, os.X_OK)):
            raise UnsupportedError(f"MUSKU_QSIM={env} is not an executable file")
        return p
    # musku.services.binaries, not .runtime: runtime pulls numpy and psutil (~0.3 CPU-s a call)
    return services_binary(BINARY)


def encode(doc: dict[str, Any]) -> bytes:
    """The engine's JSON (strict: a NaN or an infinity is refused here, never sent)."""
    try:
        return json.dumps(doc, allow_nan=False).encode()
    except ValueError:
        raise InputError("the model holds a number that is not finite") from None


ProgressFn = Callable[[float, str], None]
"""Called with the run's fraction done (0..1) and a short description (simulated time)."""

PROGRESS_INTERVAL_S = 0.25
"""Wall seconds between two of the engine's progress lines (``musku_qsim --progress``)."""


def progress_fraction(line: str) -> tuple[float, str] | None:
    """The engine's ``progress SIM_T END COMPLETED MAX_REQUESTS`` line as (fraction done,
    description); None for any other line. The fraction is the larger of simulated time over
    the run's duration and completions over ``max_requests`` (when it is set)."""
    parts = line.split()
    if len(parts) != 5 or parts[0] != "progress":
        return None
    try:
        t, end, done, most = float(parts[1]), float(parts[2]), int(parts[3]), int(parts[4])
    except ValueError:
        return None
    frac = t / end if end > 0 else 0.0
    if most > 0:
        frac = max(frac, done / most)
    return min(1.0, max(0.0, frac)), f"simulated {t:.3g} of {end:.3g} s"


class WallTimeout(Exception):
    """The engine ran past its wall-clock bound (and was killed)."""


def _spawn(argv: list[str], preexec: Callable[[], None]) -> tuple[int, int, int, int]:
    """Start the engine: (pid, its stdin's write end, its stdout's and stderr's read ends).
    os.fork and os.execv rather than ``subprocess`` (~0.015 CPU-s to import, with threading and
    selectors, on the qsim quick path). The pipes are non-inheritable, so the engine keeps
    only the three it is given; an exec that fails exits 127 with the reason on stderr."""
    in_r, in_w = os.pipe()
    out_r, out_w = os.pipe()
    err_r, err_w = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: no Python beyond these calls, then the engine
        try:
            os.dup2(in_r, 0)
            os.dup2(out_w, 1)
            os.dup2(err_w, 2)
            preexec()
            os.execv(argv[0], argv)
        except BaseException as exc:  # noqa: BLE001 - the child reports any failure, then exits
            with contextlib.suppress(BaseException):
                os.write(2, f"cannot start {argv[0]}: {exc}\n".encode())
        finally:
            os._exit(127)
    for fd in (in_r, out_w, err_w):
        os.close(fd)
    return pid, in_w, out_r, err_r


def _run_engine(
    argv: list[str],
    data: bytes,
    wall: float,
    on_progress: ProgressFn | None,
    preexec: Callable[[], None],
) -> tuple[int, bytes, str]:
    """Run the engine with ``data`` on stdin: (status as ``subprocess`` gives it: negative for
    a signal, stdout, stderr without the progress lines). Progress lines go to ``on_progress``
    as they come, from this thread. :class:`WallTimeout` after ``wall`` seconds (the engine
    killed and reaped). One thread multiplexes the three pipes with ``poll``."""
    pid, in_w, out_r, err_r = _spawn(argv, preexec)
    reaped = False
    fds = {in_w, out_r, err_r}
    try:
        os.set_blocking(in_w, False)
        out: list[bytes] = []
        err: list[str] = []
        partial = b""
        sent = 0
        view = memoryview(data)
        poll = select.poll()
        poll.register(in_w, select.POLLOUT)
        poll.register(out_r, select.POLLIN)
        poll.register(err_r, select.POLLIN)
        if not data:
            poll.unregister(in_w)
            os.close(in_w)
            fds.discard(in_w)
        deadline = time.monotonic() + wall
        while out_r in fds or err_r in fds:
            left = deadline - time.monotonic()
            if left <= 0:
                raise WallTimeout
            for fd, _ev in poll.poll(max(1, min(int(left * 1000), 1_000_000))):
                if fd == in_w:
                    try:
                        sent += os.write(in_w, view[sent : sent + 65536])
                    except BlockingIOError:
                        continue
                    except OSError:  # the engine ended early (a refused model): its status says why
                        sent = len(data)
                    if sent >= len(data):
                        poll.unregister(in_w)
                        os.close(in_w)
                        fds.discard(in_w)
                    continue
                try:
                    chunk = os.read(fd, 65536)
                except InterruptedError:
                    continue
                if not chunk:
                    poll.unregister(fd)
                    os.close(fd)
                    fds.discard(fd)
                    continue
                if fd == out_r:
                    out.append(chunk)
                    continue
                *whole, partial = (partial + chunk).split(b"\n")
                for raw in whole:
                    text = raw.decode(errors="replace") + "\n"
                    got = progress_fraction(text)
                    if got is None:
                        err.append(text)
                    elif on_progress is not None:
                        on_progress(*got)
        if partial:
            err.append(partial.decode(errors="replace"))
        _, status = os.waitpid(pid, 0)
        reaped = True
        return os.waitstatus_to_exitcode(status), b"".join(out), "".join(err)
    finally:
        for fd in fds:
            with contextlib.suppress(OSError):
                os.close(fd)
        if not reaped:  # a timeout, an interrupt or a bug here: never leave the engine running
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)
            with contextlib.suppress(ChildProcessError):
                os.waitpid(pid, 0)


def simulate(
    doc: dict[str, Any],
    *,
    timeout: float | None = None,
    limits: Limits | None = None,
    on_progress: ProgressFn | None = None,
) -> dict[str, Any]:
    """Run one normalised model document under ``limits`` (default: :meth:`Limits.from_env`,
    a budget of its own); the engine's result document. ``timeout``: wall seconds, at most.
    ``on_progress``: called (from another thread) with the fraction done every
    :data:`PROGRESS_INTERVAL_S` or so while the engine runs."""
    lim = limits if limits is not None else Limits.from_env()
    lim.check_left()
    data = encode(doc)
    wall = lim.wall_s() if timeout is None else min(timeout, lim.wall_s())
    argv = [str(binary()), "-"]
    if on_progress is not None:
        argv.append(f"--progress={PROGRESS_INTERVAL_S:g}")
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.monotonic()
    try:
        code, stdout, stderr = _run_engine(argv, data, wall, on_progress, lim.preexec())
    except WallTimeout:
        lim.charge(before)
        raise MuskuError(
            f"the simulation took longer than {time.monotonic() - started:.0f} s of wall time"
        ) from None
    lim.charge(before)
    if code == 2 and stderr.startswith("usage: musku_qsim"):
        raise UnsupportedError(
            f"{argv[0]} is older than this musku (it has no --progress): rebuild services/qsim "
            "(docs/qsim.md)"
        )
    if code != 0:
        raise lim.failure(code, stderr)
    try:
        result: dict[str, Any] = json.loads(stdout)
    except ValueError:
        raise MuskuError("musku_qsim printed a result that is not JSON") from None
    return result
