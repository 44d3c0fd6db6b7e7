"""The SHP knob while a process lets its huge pages go: the kernel's two counters
(``nr_hugepages``, ``surplus_hugepages``) move together as each surplus page is freed, and the
knob reads them one after the other. On a real switchback (SHP 128 -> 0 with the workload's
pages still mapped) the old read printed "the kernel granted -64"."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from musku.hostfs import HUGEPAGES_DIR
from musku.knobs import load_knob
from musku.testing.fakehost import FakeHost, FakeKernelFS

POOL = HUGEPAGES_DIR + "/hugepages-2048kB"


class FreeingKernelFS(FakeKernelFS):
    """The fake tree with the kernel's surplus accounting: ``persistent`` pages reserved (what
    ``nr_hugepages`` was set to), ``mapped`` pages a process holds. The files read
    ``nr_hugepages = max(persistent, mapped)``, ``surplus = max(0, mapped - persistent)``.
    After each read of either file the process unmaps the next number of pages of ``frees``:
    a free falls between any two reads, as it can on the real kernel."""

    def __init__(self, host: FakeHost, persistent: int, mapped: int, frees: list[int]) -> None:
        super().__init__(host.root, host=host)
        self.persistent, self.mapped, self.frees = persistent, mapped, list(frees)
        self._publish()

    def _publish(self) -> None:
        self._store(POOL + "/nr_hugepages", f"{max(self.persistent, self.mapped)}\n")
        self._store(POOL + "/surplus_hugepages", f"{max(0, self.mapped - self.persistent)}\n")

    def read_bytes(self, path: str, **kw: object) -> bytes:
        data = super().read_bytes(path, **kw)  # type: ignore[arg-type]
        if path.startswith(POOL + "/") and self.frees:
            self.mapped = max(0, self.mapped - self.frees.pop(0))
            self._publish()
        return data

    def _kernel_write(self, path: str, data: bytes) -> bool:
        if path == POOL + "/nr_hugepages":
            self.persistent = int(data)
            self._publish()
            return True
        return super()._kernel_write(path, data)


def _host(tmp: Path) -> FakeHost:
    return FakeHost(tmp).meminfo().hugepages(sizes_kb=(2048,))


def test_the_race_seen_on_the_real_switchback(tmp_path: Path) -> None:
    """Pool shrunk to 0 with 64 pages still mapped; the process frees them all right after the
    surplus is read: the pool is 0, not -64."""
    fs = FreeingKernelFS(_host(tmp_path), persistent=0, mapped=64, frees=[64])
    assert load_knob("shp", fs).read() == 0
    assert fs.read_int(POOL + "/nr_hugepages") == 0


@settings(max_examples=100, deadline=None)
@given(
    persistent=st.integers(0, 256),
    mapped=st.integers(0, 256),
    frees=st.lists(st.integers(0, 64), max_size=12),
)
def test_read_is_the_persistent_pool_whenever_pages_are_freed(
    tmp_path_factory: pytest.TempPathFactory, persistent: int, mapped: int, frees: list[int]
) -> None:
    tmp = tmp_path_factory.mktemp("shp")
    fs = FreeingKernelFS(_host(tmp), persistent, mapped, frees)
    knob = load_knob("shp", fs)
    assert knob.read() == persistent
    assert knob.verify(persistent)


def test_snapshot_restores_the_persistent_pool_not_the_surplus(tmp_path: Path) -> None:
    """A snapshot taken while 64 surplus pages are still mapped (persistent pool 0) restores 0:
    writing back the raw ``nr_hugepages`` (64) would have made them persistent."""
    fs = FreeingKernelFS(_host(tmp_path), persistent=0, mapped=64, frees=[])
    knob = load_knob("shp", fs)
    snap = knob.snapshot()
    knob.apply(128)
    assert fs.read_int(POOL + "/nr_hugepages") == 128
    fs.mapped = 0  # the process lets its pages go
    knob.rollback(snap)
    assert fs.persistent == 0 and knob.read() == 0
    assert fs.read_bytes(POOL + "/nr_hugepages") == b"0\n"
