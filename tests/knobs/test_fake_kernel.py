"""The fake kernel enforces the rules the knobs rely on (so the contract suite means something)."""

from __future__ import annotations

from pathlib import Path

import pytest

from musku.hostfs import HostFSError
from musku.testing.fakehost import FakeHost, intel_host


def test_thp_brackets_and_einval(tmp_path: Path) -> None:
    host = FakeHost(tmp_path).thp()
    fs = host.fs()
    fs.write_bytes("/sys/kernel/mm/transparent_hugepage/enabled", b"never")
    assert host.read("/sys/kernel/mm/transparent_hugepage/enabled") == "always madvise [never]\n"
    with pytest.raises(HostFSError, match="Invalid argument"):
        fs.write_bytes("/sys/kernel/mm/transparent_hugepage/defrag", b"sometimes")
    assert "[madvise]" in host.read("/sys/kernel/mm/transparent_hugepage/defrag")


def test_hugepages_grant_fewer(tmp_path: Path) -> None:
    host = FakeHost(tmp_path).hugepages(limit={2048: 10})
    host.fs().write_bytes("/sys/kernel/mm/hugepages/hugepages-2048kB/nr_hugepages", b"64")
    assert host.read("/sys/kernel/mm/hugepages/hugepages-2048kB/nr_hugepages") == "10\n"
    assert host.read("/proc/sys/vm/nr_hugepages") == "10\n"


def test_cpu_offline_updates_lists_and_cpusets(tmp_path: Path) -> None:
    host = FakeHost(tmp_path).cpus(4).cgroup_v1_cpuset()
    fs = host.fs()
    fs.write_bytes("/sys/devices/system/cpu/cpu2/online", b"0")
    assert host.read("/sys/devices/system/cpu/online") == "0-1,3\n"
    assert host.read("/sys/devices/system/cpu/offline") == "2\n"
    assert host.read("/sys/fs/cgroup/cpuset/cpuset.effective_cpus") == "0-1,3\n"
    fs.mkdir("/sys/fs/cgroup/cpuset/svc")
    with pytest.raises(HostFSError, match="Invalid argument"):
        fs.write_bytes("/sys/fs/cgroup/cpuset/svc/cpuset.cpus", b"2-3")  # cpu2 is offline
    fs.write_bytes("/sys/fs/cgroup/cpuset/svc/cpuset.cpus", b"1,3")
    fs.write_bytes("/sys/devices/system/cpu/cpu3/online", b"0")
    assert host.read("/sys/fs/cgroup/cpuset/svc/cpuset.cpus") == "1\n"  # v1: removed for good
    fs.write_bytes("/sys/devices/system/cpu/cpu3/online", b"1")
    assert host.read("/sys/fs/cgroup/cpuset/svc/cpuset.cpus") == "1\n"
    assert host.read("/sys/fs/cgroup/cpuset/cpuset.cpus") == "0-1,3\n"  # root follows online
    assert not host.p("/sys/devices/system/cpu/cpu0/online").exists()  # cpu0 not hot-pluggable
    with pytest.raises(HostFSError):
        fs.write_bytes("/sys/devices/system/cpu/cpu0/online", b"0")
    with pytest.raises(HostFSError, match="Invalid argument"):
        fs.write_bytes("/sys/devices/system/cpu/cpu1/online", b"2")


def test_cpuset_subset_rule_and_busy_rmdir(tmp_path: Path) -> None:
    host = FakeHost(tmp_path).cpus(4).cgroup_v1_cpuset()
    fs = host.fs()
    fs.mkdir("/sys/fs/cgroup/cpuset/svc")
    assert host.p("/sys/fs/cgroup/cpuset/svc/cpuset.cpus").exists()
    with pytest.raises(HostFSError, match="Invalid argument"):
        fs.write_bytes("/sys/fs/cgroup/cpuset/svc/cpuset.cpus", b"0-7")
    fs.write_bytes("/sys/fs/cgroup/cpuset/svc/cpuset.cpus", b"1-2")
    host.file("/sys/fs/cgroup/cpuset/svc/tasks", "42\n")
    with pytest.raises(HostFSError, match="busy"):
        fs.rmdir("/sys/fs/cgroup/cpuset/svc")
    host.file("/sys/fs/cgroup/cpuset/svc/tasks", "")
    fs.rmdir("/sys/fs/cgroup/cpuset/svc")
    assert not host.p("/sys/fs/cgroup/cpuset/svc").exists()


def test_resctrl_mkdir_and_schemata_rules(tmp_path: Path) -> None:
    host = intel_host(tmp_path)
    fs = host.fs()
    fs.mkdir("/sys/fs/resctrl/g1")
    assert host.read("/sys/fs/resctrl/g1/schemata") == "L3CODE:0=7ff;1=7ff\nL3DATA:0=7ff;1=7ff\n"
    with pytest.raises(HostFSError, match="Invalid argument"):
        fs.write_bytes("/sys/fs/resctrl/g1/schemata", b"L3DATA:0=505\n")
    assert "non-consecutive" in host.read("/sys/fs/resctrl/info/last_cmd_status")
    with pytest.raises(HostFSError):
        fs.write_bytes("/sys/fs/resctrl/g1/schemata", b"L3CODE:0=1000\n")
    assert "out of range" in host.read("/sys/fs/resctrl/info/last_cmd_status")
    fs.write_bytes("/sys/fs/resctrl/g1/schemata", b"L3DATA:1=3\n")  # partial store merges
    assert host.read("/sys/fs/resctrl/g1/schemata") == "L3CODE:0=7ff;1=7ff\nL3DATA:0=7ff;1=3\n"
    assert host.read("/sys/fs/resctrl/info/last_cmd_status") == "ok\n"


def test_resctrl_runs_out_of_closids(tmp_path: Path) -> None:
    host = FakeHost(tmp_path).resctrl(num_closids=2)
    fs = host.fs()
    fs.mkdir("/sys/fs/resctrl/a")
    with pytest.raises(HostFSError, match="No space"):
        fs.mkdir("/sys/fs/resctrl/b")


def test_uncore_min_never_above_max(tmp_path: Path) -> None:
    host = FakeHost(tmp_path).uncore_sysfs()
    fs = host.fs()
    d = "/sys/devices/system/cpu/intel_uncore_frequency/package_00_die_00"
    with pytest.raises(HostFSError):
        fs.write_bytes(d + "/max_freq_khz", b"1000000")  # below initial_min
    fs.write_bytes(d + "/max_freq_khz", b"1500000")
    with pytest.raises(HostFSError):
        fs.write_bytes(d + "/min_freq_khz", b"1600000")  # min > max
