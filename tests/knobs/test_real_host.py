"""The knobs on this machine's real kernel interfaces (root; skipped where absent).

Each test saves the original state, changes it through the knob, checks the kernel's answer,
rolls back through the knob, and in a ``finally`` restores the original directly as well.
"""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest

from musku.hostfs import CGROUP_V1_CPUSET, HUGEPAGES_DIR, SYS_CPU, THP_DIR, HostFS
from musku.knobs import load_knob
from musku.knobs.base import Shortfall
from musku.knobs.thp import ENABLED

pytestmark = pytest.mark.root

REAL = HostFS("/")


def _need(path: str) -> None:
    if os.geteuid() != 0:
        pytest.skip("needs root")
    if not REAL.exists(path):
        pytest.skip(f"{path} absent on this host")
    if not os.access(REAL.host(path), os.W_OK):
        pytest.skip(f"{path} not writable here")


@pytest.fixture
def real_fs() -> Iterator[HostFS]:
    yield REAL


def _active(path: str) -> str:
    text = REAL.read_text(path)
    return next(w.strip("[]") for w in text.split() if w.startswith("["))


@pytest.mark.root("thp")
def test_real_thp(real_fs: HostFS) -> None:
    _need(ENABLED)
    defrag = THP_DIR + "/defrag"
    orig_enabled = _active(ENABLED)
    orig_defrag = _active(defrag) if real_fs.exists(defrag) else None
    raw = real_fs.read_bytes(ENABLED), real_fs.read_bytes(defrag)
    try:
        knob = load_knob("thp", real_fs)
        target = "never" if orig_enabled != "never" else "madvise"
        snap = knob.snapshot()
        assert knob.apply(target, dry_run=True)
        assert _active(ENABLED) == orig_enabled  # dry run wrote nothing
        knob.apply(target)
        assert _active(ENABLED) == target and _active(defrag) == target
        assert knob.verify(target) and knob.read() == target
        assert knob.apply(target) == []
        knob.rollback(snap)
        assert (real_fs.read_bytes(ENABLED), real_fs.read_bytes(defrag)) == raw
    finally:
        real_fs.write_bytes(ENABLED, orig_enabled.encode())
        if orig_defrag is not None:
            real_fs.write_bytes(defrag, orig_defrag.encode())


@pytest.mark.root("hugepages")
def test_real_static_hugepages(real_fs: HostFS) -> None:
    pool = HUGEPAGES_DIR + "/hugepages-2048kB/nr_hugepages"
    _need(pool)
    original = real_fs.read_bytes(pool)
    try:
        knob = load_knob("shp", real_fs)
        snap = knob.snapshot()
        want = int(original) + 4
        try:
            knob.apply(want)
            granted = want
        except Shortfall as exc:  # the kernel may grant fewer: reported, not hidden
            granted = int(exc.granted)
            assert granted < want
        assert real_fs.read_int(pool) == granted
        assert real_fs.meminfo()["HugePages_Total"] == granted
        knob.rollback(snap)
        assert real_fs.read_bytes(pool) == original
    finally:
        real_fs.write_bytes(pool, original.strip())


@pytest.mark.root("cpus")
def test_real_cpu_hotplug(real_fs: HostFS) -> None:
    online_file = SYS_CPU + "/cpu1/online"
    _need(online_file)
    if real_fs.online_cpus() != [0, 1]:
        pytest.skip("expects exactly cpus 0-1 online")
    original = real_fs.read_bytes(online_file)
    try:
        knob = load_knob("core_count", real_fs, mode="live", hotplug=True)
        assert knob.read() == 2
        snap = knob.snapshot()
        knob.apply(1)
        assert real_fs.online_cpus() == [0]
        assert knob.read() == 1 and knob.verify(1)
        knob.rollback(snap)
        assert real_fs.online_cpus() == [0, 1]
        assert knob.read() == 2
    finally:
        if real_fs.read_value(online_file) != "1":
            real_fs.write_bytes(online_file, original.strip())


@pytest.mark.root("cpus")
def test_real_cpuset_cgroup_v1(real_fs: HostFS) -> None:
    _need(CGROUP_V1_CPUSET + "/cpuset.cpus")
    name = f"musku-test-{os.getpid()}"
    path = f"{CGROUP_V1_CPUSET}/{name}"
    try:
        knob = load_knob(
            "core_count",
            real_fs,
            mode="live",
            cgroup=name,
            create_cgroup=True,
            hotplug=False,
            cgroup_version="1",
        )
        assert knob.probe().backend == "cpuset-v1"
        snap = knob.snapshot()
        knob.apply(1)
        assert real_fs.read_value(path + "/cpuset.cpus") == "0"
        assert real_fs.read_value(path + "/cpuset.mems") == real_fs.read_value(
            CGROUP_V1_CPUSET + "/cpuset.mems"
        )
        assert knob.verify(1) and not knob.verify(2)
        knob.rollback(snap)
        assert not real_fs.exists(path)
    finally:
        if real_fs.exists(path):
            real_fs.rmdir(path)


@pytest.mark.root("hugepages")
def test_real_shrinking_a_pool_still_in_use(real_fs: HostFS) -> None:
    """Shrinking the pool below the pages a process maps: the kernel keeps them as surplus until
    they are unmapped. The pool is at the new size (no Shortfall), and the pages go back to the
    kernel when the process lets them go."""
    import mmap

    pool = HUGEPAGES_DIR + "/hugepages-2048kB/nr_hugepages"
    _need(pool)
    original = real_fs.read_bytes(pool)
    if int(original) != 0:
        pytest.skip("the host has static huge pages reserved already")
    knob = load_knob("shp", real_fs)
    snap = knob.snapshot()
    try:
        try:
            knob.apply(4)
        except Shortfall:
            pytest.skip("the kernel could not reserve 4 huge pages")
        flags = mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS | getattr(mmap, "MAP_HUGETLB", 0x40000)
        region = mmap.mmap(-1, 4 * 2**21, flags=flags)
        region[:: 2**21] = b"\x01" * 4  # touch every page: now in use
        knob.apply(0)  # no Shortfall: the persistent pool is 0
        assert knob.verify(0)
        assert real_fs.read_int(pool) == 4  # still counted, as surplus, while mapped
        region.close()
        assert real_fs.read_int(pool) == 0  # released with the mapping
    finally:
        knob.rollback(snap)
        assert real_fs.read_bytes(pool) == original


@pytest.mark.root("swappiness")
def test_real_swappiness_from_the_vm_catalog(real_fs: HostFS) -> None:
    """vm.swappiness through the generic sysfs knob knobs/firecracker-vm.toml defines: set,
    read back by the kernel, rolled back; the original restored directly as well."""
    from musku.experiment import load_platform
    from musku.knob_spec import unregister_knob

    path = "/proc/sys/vm/swappiness"
    _need(path)
    raw = real_fs.read_bytes(path)
    vm = load_platform("firecracker-vm")  # defines the knob
    try:
        knob = load_knob("swappiness", real_fs)
        original = knob.read()
        assert original == int(raw.strip())
        target = next(v for v in vm.settings["swappiness"] if v != original)
        snap = knob.snapshot()
        assert knob.apply(target, dry_run=True) and real_fs.read_bytes(path) == raw
        knob.apply(target)
        assert int(real_fs.read_text(path)) == target  # the kernel's own read-back
        assert knob.verify(target) and knob.apply(target) == []
        knob.rollback(snap)
        assert real_fs.read_bytes(path) == raw and knob.verify(original)
    finally:
        real_fs.write_bytes(path, raw)
        unregister_knob("swappiness")
