"""HostFS: root-relative paths, the MSR allow-list and read-modify-write, atomic replace."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from musku.errors import InputError, UnsupportedError
from musku.hostfs import (
    BACKUP_SUFFIX,
    THP_DIR,
    HostFS,
    HostFSError,
    MsrNotAllowed,
    MsrUnavailable,
    format_cpulist,
    parse_cpulist,
)
from musku.knobs.core_freq import IA32_MISC_ENABLE
from musku.knobs.prefetch import AMD_PREFETCH_CONTROL, MSR_MISC_FEATURE_CONTROL
from musku.knobs.uncore_freq import MSR_UNCORE_RATIO_LIMIT
from musku.testing.fakehost import FakeHost, FakeKernelFS


def test_paths_stay_under_root(tmp_path: Path) -> None:
    fs = HostFS(tmp_path)
    assert fs.host("/sys/kernel/mm") == tmp_path / "sys/kernel/mm"
    with pytest.raises(InputError, match="absolute"):
        fs.host("sys/kernel")
    with pytest.raises(InputError, match=r"\.\."):
        fs.host("/sys/../../etc/passwd")


def test_missing_file_is_a_typed_error(tmp_path: Path) -> None:
    fs = HostFS(tmp_path)
    with pytest.raises(HostFSError, match="No such file") as e:
        fs.read_bytes("/proc/cmdline")
    assert e.value.path == "/proc/cmdline"
    with pytest.raises(HostFSError):
        fs.write_bytes("/sys/new_attribute", b"1")  # writes never create files
    assert not (tmp_path / "sys/new_attribute").exists()


@pytest.mark.parametrize(
    ("text", "cpus"),
    [("0-3,8,10-11", [0, 1, 2, 3, 8, 10, 11]), ("", []), ("5", [5]), ("0-1\n", [0, 1])],
)
def test_cpulist_round_trip(text: str, cpus: list[int]) -> None:
    assert parse_cpulist(text) == cpus
    assert parse_cpulist(format_cpulist(cpus)) == cpus


@pytest.mark.parametrize("bad", ["a-b", "3-1", "1,,x", "-2"])
def test_cpulist_rejects_garbage(bad: str) -> None:
    with pytest.raises(ValueError):
        parse_cpulist(bad)


def _msr_host(tmp_path: Path, value: int = 0x1_0000_0100) -> tuple[FakeHost, HostFS]:
    host = FakeHost(tmp_path).cpus(2).msr({MSR_MISC_FEATURE_CONTROL: value, 0x10: 0xABC})
    return host, host.fs()


def test_msr_read_modify_write_touches_only_the_mask(tmp_path: Path) -> None:
    host, fs = _msr_host(tmp_path)
    old = fs.write_msr(1, MSR_MISC_FEATURE_CONTROL, 0b1010, 0xF)
    assert old == 0x1_0000_0100
    assert host.msr_value(1, MSR_MISC_FEATURE_CONTROL) == 0x1_0000_010A  # other bits kept
    assert host.msr_value(0, MSR_MISC_FEATURE_CONTROL) == 0x1_0000_0100  # other CPU untouched
    assert fs.read_msr(1, MSR_MISC_FEATURE_CONTROL) == 0x1_0000_010A


def test_msr_outside_allow_list_refused(tmp_path: Path) -> None:
    host, fs = _msr_host(tmp_path)
    before = host.tree()
    with pytest.raises(MsrNotAllowed, match="allow-list"):
        fs.read_msr(0, 0x10)  # TSC: not ours to read
    with pytest.raises(MsrNotAllowed, match="allow-list"):
        fs.write_msr(0, 0x10, 1, 1)
    with pytest.raises(MsrNotAllowed, match="may not be written"):
        fs.write_msr(0, MSR_MISC_FEATURE_CONTROL, 0x10, 0x10)  # bit 4: outside 0x1A4's mask
    with pytest.raises(MsrNotAllowed, match="may not be written"):
        fs.write_msr(0, IA32_MISC_ENABLE, 0, 1 << 38)  # read-only register
    with pytest.raises(MsrNotAllowed, match="outside mask"):
        fs.write_msr(0, MSR_MISC_FEATURE_CONTROL, 0x30, 0xF)  # value bits beyond the mask
    with pytest.raises(MsrNotAllowed):
        fs.write_msr(0, AMD_PREFETCH_CONTROL, 0x10, 0x10)  # reserved bit 4 of C000_0108
    assert host.tree() == before


def test_msr_missing_device_is_unsupported(tmp_path: Path) -> None:
    fs = FakeHost(tmp_path).cpus(2).fs()
    with pytest.raises(MsrUnavailable, match="modprobe msr") as e:
        fs.read_msr(0, MSR_UNCORE_RATIO_LIMIT)
    assert isinstance(e.value, UnsupportedError)


def test_msr_allow_writes_off_refuses_writes(tmp_path: Path) -> None:
    host = FakeHost(tmp_path).cpus(1).msr({MSR_MISC_FEATURE_CONTROL: 0}, allow_writes="off")
    fs = host.fs()
    assert fs.read_msr(0, MSR_MISC_FEATURE_CONTROL) == 0  # reads still work
    with pytest.raises(MsrUnavailable, match="allow_writes"):
        fs.write_msr(0, MSR_MISC_FEATURE_CONTROL, 0xF, 0xF)
    assert host.msr_value(0, MSR_MISC_FEATURE_CONTROL) == 0


def test_atomic_replace_keeps_mode_and_backup(tmp_path: Path) -> None:
    host = FakeHost(tmp_path).grub("quiet")
    real = host.p("/etc/default/grub")
    os.chmod(real, 0o640)
    original = real.read_bytes()
    fs = host.fs()
    backup = fs.atomic_replace("/etc/default/grub", b'GRUB_CMDLINE_LINUX="x"\n')
    assert backup == "/etc/default/grub" + BACKUP_SUFFIX
    assert real.read_bytes() == b'GRUB_CMDLINE_LINUX="x"\n'
    assert host.p(backup).read_bytes() == original
    assert (real.stat().st_mode & 0o777) == 0o640
    assert [p.name for p in real.parent.iterdir() if p.name.startswith(".")] == []  # no temp left


def test_atomic_replace_refuses_symlinks(tmp_path: Path) -> None:
    host = FakeHost(tmp_path).grub("quiet")
    target = host.p("/etc/default/grub")
    managed = tmp_path / "managed-grub"
    managed.write_bytes(target.read_bytes())
    target.unlink()
    target.symlink_to(managed)
    with pytest.raises(HostFSError, match="symbolic link"):
        host.fs().atomic_replace("/etc/default/grub", b"x")
    assert target.is_symlink() and managed.read_bytes().startswith(b"# If you change")


def test_read_only_hostfs_refuses_every_write(tmp_path: Path) -> None:
    host = FakeHost(tmp_path).cpus(2).thp().grub().msr({MSR_MISC_FEATURE_CONTROL: 0})
    before = host.tree()
    for fs in (HostFS(tmp_path, read_only=True), FakeKernelFS(tmp_path, host=host, read_only=True)):
        with pytest.raises(HostFSError, match="read-only"):
            fs.write_bytes("/sys/kernel/mm/transparent_hugepage/enabled", b"never")
        with pytest.raises(HostFSError, match="read-only"):
            fs.mkdir("/sys/fs/resctrl")
        with pytest.raises(HostFSError, match="read-only"):
            fs.atomic_replace("/etc/default/grub", b"")
        with pytest.raises(HostFSError, match="read-only"):
            fs.write_msr(0, MSR_MISC_FEATURE_CONTROL, 1, 1)
        assert fs.read_value("/sys/kernel/mm/transparent_hugepage/enabled")  # reads work
    assert host.tree() == before


def test_write_describe() -> None:
    from musku.knobs.base import Write
    from musku.knobs.helpers import msr_write

    assert Write("/x", b"never").describe() == "write /x <- 'never'"
    assert msr_write("/dev/cpu/0/msr", 0x1A4, 0xB, 0xF).describe() == (
        "msr /dev/cpu/0/msr 0x1a4 &0xf = 0xb"
    )
    assert Write("/g", b"", op="mkdir").describe() == "mkdir /g"


def test_host_facts(tmp_path: Path) -> None:
    fs = FakeHost(tmp_path).cpus(4, vendor="AuthenticAMD").meminfo(1024 * 1024).fs()
    assert fs.cpu_vendor() == "amd"
    assert fs.online_cpus() == [0, 1, 2, 3]
    assert fs.meminfo()["MemTotal"] == 1024 * 1024


# --- symbolic links stay inside the host root (issue 18) -------------------------------------


THP_ENABLED = THP_DIR + "/enabled"


def _escape_setup(tmp_path: Path) -> tuple[Path, Path, Path]:
    """A host root, and outside it a file and a directory a link may try to reach."""
    root = tmp_path / "root"
    outside = tmp_path / "outside"
    (outside / "transparent_hugepage").mkdir(parents=True)
    secret = outside / "transparent_hugepage" / "enabled"
    secret.write_text("outside\n")
    (root / "sys/kernel/mm").mkdir(parents=True)
    return root, outside, secret


@pytest.mark.parametrize("relative", [False, True])
def test_a_file_link_out_of_the_root_is_not_followed(tmp_path: Path, relative: bool) -> None:
    root, outside, secret = _escape_setup(tmp_path)
    thp = root / "sys/kernel/mm/transparent_hugepage"
    thp.mkdir()
    target = os.path.relpath(secret, thp) if relative else str(secret)
    (thp / "enabled").symlink_to(target)
    assert (thp / "enabled").read_text() == "outside\n"  # the plain OS follows it out
    fs = HostFS(root)
    assert not fs.exists(THP_ENABLED)
    with pytest.raises(HostFSError, match="No such file"):
        fs.read_value(THP_ENABLED)
    with pytest.raises(HostFSError):
        fs.write_text(THP_ENABLED, "never")
    assert secret.read_text() == "outside\n"


def test_a_directory_link_out_of_the_root_is_not_followed(tmp_path: Path) -> None:
    root, outside, secret = _escape_setup(tmp_path)
    (root / "sys/kernel/mm/transparent_hugepage").symlink_to(outside / "transparent_hugepage")
    fs = HostFS(root)
    with pytest.raises(HostFSError):
        fs.read_value(THP_ENABLED)
    with pytest.raises(HostFSError):
        fs.write_text(THP_ENABLED, "never")
    with pytest.raises(HostFSError):
        fs.listdir("/sys/kernel/mm/transparent_hugepage")
    with pytest.raises(HostFSError):
        fs.mkdir("/sys/kernel/mm/transparent_hugepage/new")
    with pytest.raises(HostFSError):
        fs.atomic_replace("/sys/kernel/mm/transparent_hugepage/enabled", b"x")
    assert secret.read_text() == "outside\n"
    assert sorted(p.name for p in (outside / "transparent_hugepage").iterdir()) == ["enabled"]


def test_links_inside_the_root_resolve_within_it(tmp_path: Path) -> None:
    """Real sysfs is full of links (cpuN/cpufreq -> ../cpufreq/policyN): they still work,
    and an absolute target means the host's path, i.e. under the root."""
    root = tmp_path / "root"
    policy = root / "sys/devices/system/cpu/cpufreq/policy0"
    policy.mkdir(parents=True)
    (policy / "scaling_max_freq").write_text("2200000\n")
    cpu0 = root / "sys/devices/system/cpu/cpu0"
    cpu0.mkdir()
    (cpu0 / "cpufreq").symlink_to("../cpufreq/policy0")
    (root / "etc").mkdir()
    (root / "etc/freq").symlink_to("/sys/devices/system/cpu/cpu0/cpufreq/scaling_max_freq")
    (root / "etc/loop").symlink_to("/etc/loop")
    fs = HostFS(root)
    assert fs.read_int("/sys/devices/system/cpu/cpu0/cpufreq/scaling_max_freq") == 2200000
    assert fs.read_int("/etc/freq") == 2200000
    fs.write_text("/etc/freq", "1600000")
    assert (policy / "scaling_max_freq").read_text() == "1600000"
    assert fs.is_symlink("/etc/freq") and not fs.is_symlink("/etc")
    with pytest.raises(HostFSError, match="symbolic links"):
        fs.read_value("/etc/loop")
