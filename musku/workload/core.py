"""The workload's engine (see the package docstring)."""

from __future__ import annotations

import bisect
import json
import mmap
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from musku.errors import InputError
from musku.hostfs import HUGEPAGES_DIR, THP_DIR, HostFS

MAP_HUGETLB = getattr(mmap, "MAP_HUGETLB", 0x40000)  # Linux value on x86 and arm64
HUGE_2M = 2 * 2**20
# batch latency histogram: bucket upper bounds in microseconds, 1 us .. ~16 s, 4 per octave
BOUNDS_US: tuple[float, ...] = tuple(round(2 ** (i / 4), 3) for i in range(0, 97))
FORMAT = "musku-stats/1"


@dataclass(frozen=True)
class WorkloadOptions:
    stats_file: Path
    arena_mib: int = 256
    batch: int = 1 << 16
    hugetlb: bool = True  # use reserved static huge pages when there are any
    madvise: bool = False  # MADV_HUGEPAGE on the regular arena (THP "madvise" mode applies)
    watch_interval_s: float = 0.5
    stats_interval_s: float = 0.1
    duration_s: float = 0.0  # 0 = until stopped
    seed: int = 0

    def __post_init__(self) -> None:
        if not 8 <= self.arena_mib <= 1 << 20:
            raise InputError("arena_mib must be between 8 and 1048576")
        if not 1024 <= self.batch <= 1 << 24:
            raise InputError("batch must be between 1024 and 16777216")


class _Region:
    def __init__(self, size: int, flags: int, *, madvise: bool) -> None:
        self.map = mmap.mmap(-1, size, flags=flags, prot=mmap.PROT_READ | mmap.PROT_WRITE)
        if madvise and hasattr(mmap, "MADV_HUGEPAGE"):
            self.map.madvise(mmap.MADV_HUGEPAGE)
        self.array = np.frombuffer(self.map, dtype=np.int64)
        self.array.fill(1)  # fault every page in now, not during a measurement window
        self.hugetlb = bool(flags & MAP_HUGETLB)

    def close(self) -> None:
        del self.array
        self.map.close()


class Workload:
    def __init__(self, options: WorkloadOptions, fs: HostFS) -> None:
        self.o = options
        self.fs = fs
        self.rng = np.random.default_rng(options.seed)
        self.regions: list[_Region] = []
        self.indices: list[np.ndarray] = []
        self.ops = 0
        self.batches = 0
        self.counts = [0] * len(BOUNDS_US)
        self.state: tuple[str, int] = ("", -1)
        self.rebuilds = 0
        self.checked = 0.0  # wall clock just before the last look at the host's state
        self.stop = False

    # host state --------------------------------------------------------------------

    def host_state(self) -> tuple[str, int]:
        thp = ""
        try:
            text = self.fs.read_text(THP_DIR + "/enabled")
            thp = text[text.index("[") + 1 : text.index("]")] if "[" in text else text.strip()
        except Exception:  # noqa: BLE001 - no THP on this kernel: nothing to watch
            thp = ""
        free = 0
        try:
            free = self.fs.read_int(f"{HUGEPAGES_DIR}/hugepages-2048kB/free_hugepages")
        except Exception:  # noqa: BLE001
            free = 0
        # our own pages are not free: count them back in so the state is stable
        free += sum(len(r.map) // HUGE_2M for r in self.regions if r.hugetlb)
        return thp, free

    def rebuild(self) -> None:
        for r in self.regions:
            r.close()
        self.regions, self.indices = [], []
        size = self.o.arena_mib * 2**20
        thp, free_pages = self.host_state()
        base_flags = mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS
        huge = min(size, free_pages * HUGE_2M) if self.o.hugetlb else 0
        huge -= huge % HUGE_2M
        if huge > 0:
            try:
                self.regions.append(_Region(huge, base_flags | MAP_HUGETLB, madvise=False))
                size -= huge
            except OSError:
                pass  # the pool shrank meanwhile: all regular pages
        if size > 0:
            self.regions.append(_Region(size, base_flags, madvise=self.o.madvise))
        total = sum(len(r.array) for r in self.regions)
        for r in self.regions:
            share = max(1, round(self.o.batch * len(r.array) / total))
            self.indices.append(self.rng.integers(0, len(r.array), size=share, dtype=np.int64))
        self.state = self.host_state()
        self.rebuilds += 1

    # running -----------------------------------------------------------------------

    def _record(self, seconds: float) -> None:
        i = bisect.bisect_left(BOUNDS_US, seconds * 1e6)
        self.counts[min(i, len(self.counts) - 1)] += 1

    def write_stats(self) -> None:
        data: dict[str, Any] = {
            "format": FORMAT,
            "service": "musku-workload",
            "pid": os.getpid(),
            "t": time.time(),
            # cpu_s: the process's CPU seconds, so a reader can give ops per CPU-second
            # (ops_cpu), which a busy host's scheduling delays do not dilute
            "counters": {"ops": self.ops, "requests": self.batches, "cpu_s": time.process_time()},
            "latency_us": {"bounds": list(BOUNDS_US), "counts": list(self.counts)},
            "arena": {
                "mib": self.o.arena_mib,
                "hugetlb_mib": sum(len(r.map) for r in self.regions if r.hugetlb) // 2**20,
                "thp": self.state[0],
                "rebuilds": self.rebuilds,
                # the arena matches the host as it was at this time (or later): a controller
                # that switched the host at time T waits for checked >= T before measuring
                "checked": self.checked,
            },
        }
        tmp = self.o.stats_file.with_name(self.o.stats_file.name + ".tmp")
        tmp.write_text(json.dumps(data, separators=(",", ":")))
        os.replace(tmp, self.o.stats_file)

    def run(self) -> None:
        self.o.stats_file.parent.mkdir(parents=True, exist_ok=True)
        self.checked = time.time()
        self.rebuild()
        start = time.monotonic()
        next_stats = next_watch = start
        key = 0
        while not self.stop:
            t0 = time.perf_counter()
            for region, idx in zip(self.regions, self.indices, strict=True):
                # rotate the index block so successive batches touch different lines
                sel = (idx + key) % len(region.array)
                region.array[sel].sum()
                self.ops += len(idx)
            key += 7919
            self.batches += 1
            self._record(time.perf_counter() - t0)
            now = time.monotonic()
            if now >= next_stats:
                self.write_stats()
                next_stats = now + self.o.stats_interval_s
            if now >= next_watch:
                next_watch = now + self.o.watch_interval_s
                checked = time.time()
                rebuilt = self.host_state() != self.state
                if rebuilt:
                    self.rebuild()
                self.checked = checked
                if rebuilt:  # say so at once: a controller may be waiting for it
                    self.write_stats()
            if self.o.duration_s and now - start >= self.o.duration_s:
                break
        self.write_stats()

    def close(self) -> None:
        for r in self.regions:
            r.close()
        self.regions = []
