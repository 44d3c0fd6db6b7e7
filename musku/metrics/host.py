"""Host and process figures through psutil.

psutil reads ``/proc`` itself; on a HostFS whose root is not ``/`` (a fake host tree) it would
read the wrong host, so the sampler reports itself unsupported there.

Host metrics: ``host_cpu_util`` (0..1 of all online CPUs), ``host_cpu_busy`` (CPUs' worth),
``mem_used_frac``. With a ``pid`` option (or ``pid_file``), the process and its children:
``proc_cpu`` (CPUs' worth), ``proc_rss_mib``.
"""

from __future__ import annotations

import contextlib
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import psutil

from musku.knobs.base import Support
from musku.metrics.base import Sampler

if TYPE_CHECKING:
    from musku.hostfs import HostFS


class PsutilSampler(Sampler):
    name = "psutil"

    def __init__(self, fs: HostFS, **options: object) -> None:
        super().__init__(fs, **options)
        self._t = 0.0
        self._busy = 0.0
        self._total = 0.0
        self._proc_cpu = 0.0
        self._proc: Any = None  # psutil.Process of the target, once found
        self._pid = 0
        self._mem = 0.0
        self._next_mem = 0.0

    def probe(self) -> Support:
        if str(self.fs.root) != "/":
            return Support(False, f"psutil reads the running host's /proc, not {self.fs.root}")
        return Support(True, backend="psutil", details={"version": psutil.__version__})

    def _target_pid(self) -> int:
        pid = self.options.get("pid")
        if isinstance(pid, int) and pid > 0:
            return pid
        pid_file = self.options.get("pid_file")
        if isinstance(pid_file, str):
            try:
                return int(Path(pid_file).read_text().strip() or 0)
            except (OSError, ValueError):
                return 0
        return 0

    @staticmethod
    def _cpu() -> tuple[float, float]:
        t = psutil.cpu_times()
        idle = t.idle + getattr(t, "iowait", 0.0)
        total = sum(t)
        # guest time is already included in user time on Linux
        total -= getattr(t, "guest", 0.0) + getattr(t, "guest_nice", 0.0)
        return total - idle, total

    def _proc_times(self) -> float:
        pid = self._target_pid()
        if pid <= 0:
            self._proc = None
            return 0.0
        try:
            if self._proc is None or self._pid != pid:
                self._proc, self._pid = psutil.Process(pid), pid
            t = self._proc.cpu_times()
            return float(t.user + t.system + t.children_user + t.children_system)
        except psutil.Error:
            self._proc = None
            return 0.0

    def start(self) -> None:
        self._busy, self._total = self._cpu()
        self._proc_cpu = self._proc_times()
        self._t = time.monotonic()

    def sample(self) -> dict[str, float]:
        now = time.monotonic()
        busy, total = self._cpu()
        proc = self._proc_times()
        dt = now - self._t
        out: dict[str, float] = {}
        if total > self._total and dt > 0:
            util = (busy - self._busy) / (total - self._total)
            out["host_cpu_util"] = max(0.0, min(1.0, util))
            out["host_cpu_busy"] = (busy - self._busy) / dt
        if now >= self._next_mem:  # memory use moves slowly: read it once a second
            vm = psutil.virtual_memory()
            self._mem = 1.0 - vm.available / vm.total
            self._next_mem = now + 1.0
        out["mem_used_frac"] = self._mem
        if self._proc is not None and dt > 0 and proc >= self._proc_cpu:
            out["proc_cpu"] = (proc - self._proc_cpu) / dt
            with contextlib.suppress(psutil.Error):
                out["proc_rss_mib"] = self._proc.memory_info().rss / 2**20
        self._busy, self._total, self._proc_cpu, self._t = busy, total, proc, now
        return out
