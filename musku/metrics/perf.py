"""Perf counters through ``perf_event_open(2)`` (ctypes; no subprocess).

Hardware events (instructions, cycles -> ``mips``, ``ipc``) are used where the PMU exposes them.
Where it does not (virtual machines such as Firecracker: ``perf stat -e instructions`` says
"not supported") the sampler falls back to software events and says so (``backend`` =
``"software"``): task-clock -> ``cpu_busy`` (CPUs' worth of time spent running), context
switches and page faults per second (task-clock only for ``scope = "pid"``: system-wide it
counts idle time too).

Scope: ``scope = "system"`` (default) opens one counter per online CPU (``pid=-1``) and re-opens
them when the online set changes (CPU hotplug); ``scope = "pid"`` counts one process and its
children (``pid`` option, inherit=1). Counts are scaled by time_enabled/time_running when the
kernel multiplexes counters.
"""

from __future__ import annotations

import ctypes
import errno
import os
import platform
import struct
import time
from typing import TYPE_CHECKING

from musku.knobs.base import Support
from musku.metrics.base import Sampler

if TYPE_CHECKING:
    from musku.hostfs import HostFS

PERF_TYPE_HARDWARE = 0
PERF_TYPE_SOFTWARE = 1
HW_CPU_CYCLES = 0
HW_INSTRUCTIONS = 1
SW_TASK_CLOCK = 1
SW_PAGE_FAULTS = 2
SW_CONTEXT_SWITCHES = 3
FORMAT_TOTAL_TIME_ENABLED = 1
FORMAT_TOTAL_TIME_RUNNING = 2
FLAG_FD_CLOEXEC = 8
ATTR_SIZE = 128  # bytes passed; the kernel accepts any size it knows with zeroed tail
ATTR_FLAG_INHERIT = 1 << 1

_SYSCALL = {"x86_64": 298, "aarch64": 241, "i386": 336, "ppc64le": 319}

HARDWARE_EVENTS: dict[str, tuple[int, int]] = {
    "instructions": (PERF_TYPE_HARDWARE, HW_INSTRUCTIONS),
    "cycles": (PERF_TYPE_HARDWARE, HW_CPU_CYCLES),
}
SOFTWARE_EVENTS: dict[str, tuple[int, int]] = {
    "task_clock": (PERF_TYPE_SOFTWARE, SW_TASK_CLOCK),
    "context_switches": (PERF_TYPE_SOFTWARE, SW_CONTEXT_SWITCHES),
    "page_faults": (PERF_TYPE_SOFTWARE, SW_PAGE_FAULTS),
}


class PerfUnavailable(Exception):
    def __init__(self, err: int, what: str) -> None:
        self.err = err
        super().__init__(f"{what}: {os.strerror(err)}")


def _libc() -> ctypes.CDLL:
    return ctypes.CDLL(None, use_errno=True)


def perf_event_open(type_: int, config: int, pid: int, cpu: int, *, inherit: bool = False) -> int:
    """Open one counting event (disabled=0: counts from now); returns the fd."""
    nr = _SYSCALL.get(platform.machine())
    if nr is None:
        raise PerfUnavailable(errno.ENOSYS, f"perf_event_open on {platform.machine()}")
    flags = ATTR_FLAG_INHERIT if inherit else 0
    read_format = FORMAT_TOTAL_TIME_ENABLED | FORMAT_TOTAL_TIME_RUNNING
    head = struct.pack("<IIQQQQQ", type_, ATTR_SIZE, config, 0, 0, read_format, flags)
    buf = ctypes.create_string_buffer(head + b"\0" * (ATTR_SIZE - len(head)), ATTR_SIZE)
    libc = _libc()
    fd = int(libc.syscall(nr, buf, pid, cpu, -1, FLAG_FD_CLOEXEC))
    if fd < 0:
        err = ctypes.get_errno()
        raise PerfUnavailable(err, f"perf_event_open(type={type_}, config={config})")
    return fd


def read_scaled(fd: int) -> float:
    value, enabled, running = struct.unpack("<QQQ", os.read(fd, 24))
    if running == 0:
        return 0.0
    return value * (enabled / running) if running < enabled else float(value)


class PerfSampler(Sampler):
    name = "perf"

    def __init__(self, fs: HostFS, **options: object) -> None:
        super().__init__(fs, **options)
        self.scope = str(options.get("scope", "system"))
        pid = options.get("pid", 0)
        self.pid = int(pid) if isinstance(pid, int) else 0
        self.backend = ""
        self.events: dict[str, tuple[int, int]] = {}
        self._fds: dict[str, list[int]] = {}
        self._cpus: list[int] = []
        self._last: dict[str, float] = {}
        self._t = 0.0
        self._next_cpu_check = 0.0

    # targets -------------------------------------------------------------------------

    def _targets(self) -> list[tuple[int, int]]:
        if self.scope == "pid":
            return [(self.pid, -1)]
        return [(-1, c) for c in self._cpus]

    def _open_set(self, events: dict[str, tuple[int, int]]) -> dict[str, list[int]]:
        fds: dict[str, list[int]] = {}
        try:
            for name, (t, c) in events.items():
                fds[name] = [
                    perf_event_open(t, c, pid, cpu, inherit=self.scope == "pid")
                    for pid, cpu in self._targets()
                ]
        except PerfUnavailable:
            for lst in fds.values():
                for fd in lst:
                    os.close(fd)
            raise
        return fds

    def _choose(self) -> tuple[str, dict[str, tuple[int, int]], dict[str, list[int]]]:
        if self.scope not in ("system", "pid"):
            raise PerfUnavailable(errno.EINVAL, f"scope {self.scope!r} (system or pid)")
        if self.scope == "pid" and self.pid <= 0:
            raise PerfUnavailable(errno.ESRCH, "scope 'pid' needs a pid option")
        self._cpus = self.fs.online_cpus() if self.scope == "system" else []
        wanted = str(self.options.get("events", "auto"))
        hw_err: PerfUnavailable | None = None
        if wanted in ("auto", "hardware"):
            try:
                return "hardware", HARDWARE_EVENTS, self._open_set(HARDWARE_EVENTS)
            except PerfUnavailable as exc:
                hw_err = exc
                if wanted == "hardware":
                    raise
        soft = dict(SOFTWARE_EVENTS)
        if self.scope == "system":
            # system-wide task-clock counts wall time on every CPU (idle included, and
            # exclude_idle is not honoured for software events): busy time comes from the
            # psutil sampler instead.
            del soft["task_clock"]
        try:
            return "software", soft, self._open_set(soft)
        except PerfUnavailable as exc:
            raise exc from hw_err

    def probe(self) -> Support:
        try:
            backend, events, fds = self._choose()
        except PerfUnavailable as exc:
            return Support(False, f"perf events unavailable: {exc}")
        except Exception as exc:  # noqa: BLE001 - a typed answer, not a crash
            return Support(False, f"perf events unavailable: {exc}")
        for lst in fds.values():
            for fd in lst:
                os.close(fd)
        return Support(
            True, backend=backend, details={"events": sorted(events), "scope": self.scope}
        )

    def start(self) -> None:
        self.close()
        self.backend, self.events, self._fds = self._choose()
        self._last = self._read()
        self._t = time.monotonic()

    def _read(self) -> dict[str, float]:
        return {name: sum(read_scaled(fd) for fd in fds) for name, fds in self._fds.items()}

    def sample(self) -> dict[str, float]:
        if not self._fds:
            self.start()
            return {}
        now = time.monotonic()
        if self.scope == "system" and now >= self._next_cpu_check:
            self._next_cpu_check = now + 1.0  # hotplug is rare: look once a second
            if self.fs.online_cpus() != self._cpus:
                self.start()  # CPU hotplug: counters re-opened on the new online set
                return {}
        cur = self._read()
        dt = now - self._t
        delta = {k: cur[k] - self._last.get(k, 0.0) for k in cur}
        self._last, self._t = cur, now
        if dt <= 0:
            return {}
        out: dict[str, float] = {}
        if self.backend == "hardware":
            out["mips"] = delta["instructions"] / dt / 1e6
            if delta["cycles"] > 0:
                out["ipc"] = delta["instructions"] / delta["cycles"]
        else:
            if "task_clock" in delta:
                out["cpu_busy"] = delta["task_clock"] / 1e9 / dt
            out["ctx_switches_per_s"] = delta["context_switches"] / dt
            out["page_faults_per_s"] = delta["page_faults"] / dt
        return out

    def close(self) -> None:
        for lst in self._fds.values():
            for fd in lst:
                os.close(fd)
        self._fds = {}
