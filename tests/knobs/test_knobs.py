"""Knob-specific behaviour and bad input: refused with a typed error, nothing written."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from musku.errors import InputError, UnsupportedError
from musku.knobs import REGISTRY, knob_class, load_knob, probe_all
from musku.knobs.base import InvalidSetting, KnobError, Shortfall
from musku.knobs.core_count import CoreCountKnob, GrubFormatError, isolcpus_of, set_isolcpus
from musku.knobs.prefetch import MSR_MISC_FEATURE_CONTROL
from musku.knobs.uncore_freq import MSR_UNCORE_RATIO_LIMIT
from musku.testing.fakehost import FakeHost, amd_host, intel_host, vm_host

# --- registry ---------------------------------------------------------------------------------


def test_registry_and_loading(tmp_path: Path) -> None:
    fs = vm_host(tmp_path).fs()
    for name in REGISTRY:
        assert knob_class(name).name == name
    assert type(load_knob("musku.knobs.thp:ThpKnob", fs)).__name__ == "ThpKnob"
    with pytest.raises(InputError, match="unknown knob"):
        load_knob("turbo_boost", fs)
    with pytest.raises(InputError, match="not name a musku.knobs.base.Knob"):
        load_knob("musku.hostfs:HostFS", fs)
    support = probe_all(fs, thp={"defrag": "bogus"})
    assert not support["thp"].supported and "bogus" in support["thp"].reason


def test_light_import() -> None:
    # the registry of specs (musku.knob_spec) is loaded, no plugin module is
    code = (
        "import sys, musku.knobs; "
        "print(any(m.startswith('musku.knobs.') and m != 'musku.knob_spec' for m in sys.modules))"
    )
    import subprocess

    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


# --- thp --------------------------------------------------------------------------------------


def test_thp_defrag_options(tmp_path: Path) -> None:
    host = FakeHost(tmp_path).thp()
    k = load_knob("thp", host.fs(), defrag="keep")
    k.apply("always")
    assert host.read("/sys/kernel/mm/transparent_hugepage/enabled") == "[always] madvise never\n"
    assert "[madvise]" in host.read("/sys/kernel/mm/transparent_hugepage/defrag")
    k2 = load_knob("thp", host.fs(), defrag="defer+madvise")
    k2.apply("never")
    assert "[defer+madvise]" in host.read("/sys/kernel/mm/transparent_hugepage/defrag")
    assert k2.verify("never") and not load_knob("thp", host.fs()).verify("never")


@pytest.mark.parametrize("bad", ["sometimes", "", 1, "[always]"])
def test_thp_bad_value(tmp_path: Path, bad: object) -> None:
    host = FakeHost(tmp_path).thp()
    before = host.tree()
    with pytest.raises(InvalidSetting):
        load_knob("thp", host.fs()).apply(bad)  # type: ignore[arg-type]
    assert host.tree() == before


def test_thp_missing_is_unsupported(tmp_path: Path) -> None:
    s = load_knob("thp", FakeHost(tmp_path).cpus(1).fs()).probe()
    assert not s.supported and "TRANSPARENT_HUGEPAGE" in s.reason


# --- shp --------------------------------------------------------------------------------------


def test_shp_shortfall_reports_granted(tmp_path: Path) -> None:
    host = FakeHost(tmp_path).meminfo().hugepages(limit={2048: 37})
    k = load_knob("shp", host.fs())
    with pytest.raises(Shortfall, match="granted 37") as e:
        k.apply(100)
    assert (e.value.requested, e.value.granted) == (100, 37)
    assert k.read() == 37 and not k.verify(100)


def test_shp_refuses_more_than_memory(tmp_path: Path) -> None:
    host = FakeHost(tmp_path).meminfo(total_kb=1024 * 1024).hugepages()
    before = host.tree()
    k = load_knob("shp", host.fs())
    for bad in (513, -1, 1.5, "4", True):
        with pytest.raises(InvalidSetting):
            k.apply(bad)  # type: ignore[arg-type]
    assert host.tree() == before
    assert k.apply(512)


def test_shp_gigantic_pages(tmp_path: Path) -> None:
    host = FakeHost(tmp_path).meminfo(8 * 1024 * 1024).hugepages(sizes_kb=(2048,))
    s = load_knob("shp", host.fs(), page_size="1G").probe()
    assert not s.supported and "1048576" in s.reason
    host.hugepages(sizes_kb=(2048, 1048576))
    k = load_knob("shp", host.fs(), page_size="1G")
    k.apply(2)
    assert host.read("/sys/kernel/mm/hugepages/hugepages-1048576kB/nr_hugepages") == "2\n"
    with pytest.raises(InvalidSetting, match="at most 8"):
        k.apply(9)


# --- core_count: reboot mode (GRUB) -------------------------------------------------------------


def test_isolcpus_editing() -> None:
    assert set_isolcpus("quiet isolcpus=domain,nohz,4-7 x=1", [2, 3]) == (
        "quiet x=1 isolcpus=domain,nohz,2-3"
    )
    assert set_isolcpus("quiet isolcpus=4-7", []) == "quiet"
    assert isolcpus_of("ro isolcpus=managed_irq,1,3-4") == [1, 3, 4]
    assert isolcpus_of("ro quiet") is None


def test_core_count_reboot_mode(tmp_path: Path) -> None:
    host = intel_host(tmp_path)  # 2 packages x 2 cores x 2 threads: cores {0,4} {1,5} {2,6} {3,7}
    marker = tmp_path / "rebooted"
    k = load_knob(
        "core_count",
        host.fs(),
        update_command=[sys.executable, "-c", "pass"],
        reboot_command=[sys.executable, "-c", f"open({str(marker)!r}, 'w').write('x')"],
    )
    assert isinstance(k, CoreCountKnob)
    s = k.probe()
    assert s.supported and s.reboot and s.settings == (1, 2, 3, 4)
    k.apply(2)
    grub = host.read("/etc/default/grub")
    assert 'GRUB_CMDLINE_LINUX="console=ttyS0 isolcpus=2-3,6-7"' in grub
    assert 'GRUB_CMDLINE_LINUX_DEFAULT="quiet"' in grub  # the rest untouched
    assert host.p("/etc/default/grub.musku.bak").read_text().count("isolcpus") == 0
    assert k.pending_reboot() and not k.verify(2)
    k.reboot()
    assert marker.read_text() == "x"
    host.reboot()
    assert host.read("/sys/devices/system/cpu/isolated") == "2-3,6-7\n"
    assert k.verify(2) and k.read() == 2 and not k.pending_reboot()


def test_core_count_hook_failure_is_typed(tmp_path: Path) -> None:
    host = intel_host(tmp_path)
    grub = host.read("/etc/default/grub")
    k = load_knob("core_count", host.fs(), update_command=[sys.executable, "-c", "exit(3)"])
    with pytest.raises(KnobError, match="exited 3"):
        k.apply(1)
    assert host.read("/etc/default/grub") == grub  # the edit was undone
    k2 = load_knob("core_count", host.fs(), reboot_command="systemctl reboot")
    assert isinstance(k2, CoreCountKnob)
    with pytest.raises(InputError, match="argv list"):
        k2.reboot()


@pytest.mark.parametrize(
    "grub",
    [
        "GRUB_DEFAULT=0\n",  # no GRUB_CMDLINE_LINUX
        'GRUB_CMDLINE_LINUX="a"\nGRUB_CMDLINE_LINUX="b"\n',  # duplicated
        'GRUB_CMDLINE_LINUX="quiet\n',  # unbalanced quotes
        'GRUB_CMDLINE_LINUX="$EXTRA quiet"\n',  # shell expansion
        "GRUB_CMDLINE_LINUX=quiet splash\n",  # unquoted
    ],
)
def test_core_count_refuses_odd_grub(tmp_path: Path, grub: str) -> None:
    host = intel_host(tmp_path)
    host.file("/etc/default/grub", grub)
    before = host.tree()
    k = load_knob("core_count", host.fs(), update_command=[])
    s = k.probe()
    assert not s.supported and "GRUB_CMDLINE_LINUX" in s.reason
    with pytest.raises(UnsupportedError):
        k.apply(2)
    with pytest.raises(GrubFormatError):
        k.plan(2)
    assert host.tree() == before


# --- core_count: live mode --------------------------------------------------------------------


def test_core_count_live_cgroup_created_and_removed(tmp_path: Path) -> None:
    host = intel_host(tmp_path)
    before = host.tree()
    k = load_knob("core_count", host.fs(), mode="live", cgroup="musku/svc", create_cgroup=True)
    assert not k.probe().supported  # parent "musku" missing
    k = load_knob("core_count", host.fs(), mode="live", cgroup="musku", create_cgroup=True)
    assert k.probe().backend == "cpuset-v1"
    snap = k.snapshot()
    k.apply(2)
    assert host.read("/sys/fs/cgroup/cpuset/musku/cpuset.cpus") == "0-1,4-5\n"
    assert host.read("/sys/fs/cgroup/cpuset/musku/cpuset.mems") == "0\n"
    assert host.read("/sys/devices/system/cpu/online") == "0-7\n"  # no hotplug with a cgroup
    assert k.verify(2) and k.read() == 2
    k.rollback(snap)
    assert host.tree() == before


def test_core_count_live_hotplug_never_cpu0(tmp_path: Path) -> None:
    host = vm_host(tmp_path)
    k = load_knob("core_count", host.fs())
    writes = k.apply(1)
    assert [(w.path, w.data) for w in writes] == [("/sys/devices/system/cpu/cpu1/online", b"0")]
    assert host.read("/sys/devices/system/cpu/online") == "0\n"
    for bad in (0, 3, "2", 1.5):
        with pytest.raises(InvalidSetting):
            k.apply(bad)  # type: ignore[arg-type]
    with pytest.raises(InputError, match="cgroup path"):
        load_knob("core_count", host.fs(), mode="live", cgroup="../../etc").probe()


# --- cdp --------------------------------------------------------------------------------------


def test_cdp_masks_and_bounds(tmp_path: Path) -> None:
    host = intel_host(tmp_path)
    k = load_knob("cdp", host.fs())
    s = k.probe()
    assert s.settings[0] == "off" and "1:10" in s.settings and "10:1" in s.settings
    assert len(s.settings) == 11
    k.apply("6:5")
    assert host.read("/sys/fs/resctrl/musku/schemata") == ("L3CODE:0=7c0;1=7c0\nL3DATA:0=3f;1=3f\n")
    before = host.tree()
    for bad in ("0:11", "6:6", "4:4", "x:y", "6", 6):
        with pytest.raises(InvalidSetting):
            k.apply(bad)  # type: ignore[arg-type]
    assert host.tree() == before
    k.apply("off")
    assert not host.p("/sys/fs/resctrl/musku").exists()


def test_cdp_min_cbm_bits(tmp_path: Path) -> None:
    host = FakeHost(tmp_path).cpus(2, flags="cdp_l3 cat_l3").resctrl(ways=12, min_cbm_bits=2)
    k = load_knob("cdp", host.fs())
    assert "1:11" not in k.probe().settings
    with pytest.raises(InvalidSetting, match="at least 2"):
        k.apply("1:11")
    k.apply("2:10")
    assert host.read("/sys/fs/resctrl/musku/schemata") == "L3CODE:0=ffc\nL3DATA:0=3\n"


def test_cdp_kernel_refusal_reports_last_cmd_status(tmp_path: Path) -> None:
    host = intel_host(tmp_path)
    k = load_knob("cdp", host.fs())
    k.apply("6:5")
    from musku.knobs.base import Write

    with pytest.raises(KnobError, match="non-consecutive"):
        k._perform([Write("/sys/fs/resctrl/musku/schemata", b"L3DATA:0=5\n")])


def test_cdp_unsupported_reasons(tmp_path: Path) -> None:
    nocdp = FakeHost(tmp_path / "a").cpus(2, flags="cat_l3 cdp_l3").resctrl(cdp=False)
    assert "-o cdp" in load_knob("cdp", nocdp.fs()).probe().reason
    amd = amd_host(tmp_path / "b")
    assert "no CDP" in load_knob("cdp", amd.fs()).probe().reason
    bare = FakeHost(tmp_path / "c").cpus(2, flags="fpu")
    assert "RDT" in load_knob("cdp", bare.fs()).probe().reason


# --- prefetch ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("config", "bits"),
    [
        ("all_on", 0b0000),
        ("all_off", 0b1111),
        ("dcu_dcuip", 0b0011),
        ("dcu", 0b1011),
        ("l2hw_dcu", 0b1010),
    ],
)
def test_prefetch_intel_bits(tmp_path: Path, config: str, bits: int) -> None:
    host = FakeHost(tmp_path).cpus(4).msr({MSR_MISC_FEATURE_CONTROL: 0xAB00})
    k = load_knob("prefetch", host.fs())
    k.apply(config)
    for cpu in range(4):
        assert host.msr_value(cpu, MSR_MISC_FEATURE_CONTROL) == 0xAB00 | bits
    assert k.read() == config


@pytest.mark.parametrize(
    ("config", "bits"),
    [("all_on", 0), ("all_off", 0x2F), ("l1_only", 0x28), ("l2_only", 0x07)],
)
def test_prefetch_amd_bits(tmp_path: Path, config: str, bits: int) -> None:
    host = amd_host(tmp_path)
    k = load_knob("prefetch", host.fs())
    k.apply(config)
    assert host.msr_value(5, 0xC0000108) == bits
    with pytest.raises(InvalidSetting):
        k.apply("dcu")  # an Intel configuration


def test_prefetch_unsupported_and_mixed(tmp_path: Path) -> None:
    off = FakeHost(tmp_path / "a").cpus(2).msr({MSR_MISC_FEATURE_CONTROL: 0}, allow_writes="off")
    assert "allow_writes" in load_knob("prefetch", off.fs()).probe().reason
    nodev = FakeHost(tmp_path / "b").cpus(2)
    assert "no msr device" in load_knob("prefetch", nodev.fs()).probe().reason
    host = FakeHost(tmp_path / "c").cpus(2).msr({MSR_MISC_FEATURE_CONTROL: 0})
    host.fs().write_msr(1, MSR_MISC_FEATURE_CONTROL, 0xF, 0xF)
    assert load_knob("prefetch", host.fs()).read() == "mixed"


# --- core_freq --------------------------------------------------------------------------------


def test_core_freq_cpufreq_order_and_range(tmp_path: Path) -> None:
    host = FakeHost(tmp_path).cpus(2).cpufreq("acpi-cpufreq", 1_200_000, 3_000_000)
    host.file("/sys/devices/system/cpu/cpufreq/policy0/scaling_min_freq", "2500000\n")
    fs = host.fs()
    k = load_knob("core_freq", fs)
    writes = k.apply(2.0)
    paths = [w.path.rsplit("/", 1)[1] for w in writes if "policy0" in w.path]
    assert paths == ["scaling_min_freq", "scaling_max_freq"]  # floor lowered first
    assert host.read("/sys/devices/system/cpu/cpufreq/policy0/scaling_max_freq") == "2000000\n"
    before = host.tree()
    for bad in (3.5, 0.5, "fast", True):
        with pytest.raises(InvalidSetting):
            k.apply(bad)  # type: ignore[arg-type]
    assert host.tree() == before
    k.apply("turbo")
    assert host.read("/sys/devices/system/cpu/cpufreq/boost") == "1\n"
    assert k.read() == "turbo"


def test_core_freq_intel_pstate_turbo(tmp_path: Path) -> None:
    host = FakeHost(tmp_path).cpus(2).cpufreq("intel_pstate", 800_000, 3_700_000)
    host.file("/sys/devices/system/cpu/intel_pstate/no_turbo", "1\n")
    k = load_knob("core_freq", host.fs())
    snap = k.snapshot()
    before = host.tree()
    k.apply("turbo")
    assert host.read("/sys/devices/system/cpu/intel_pstate/no_turbo") == "0\n"
    k.apply(2.2)
    k.rollback(snap)
    assert host.tree() == before


def test_core_freq_hwp_on_is_unsupported(tmp_path: Path) -> None:
    host = intel_host(tmp_path, hwp=True)
    s = load_knob("core_freq", host.fs()).probe()
    assert not s.supported and "HWP" in s.reason


def test_core_freq_hwp_host_uses_cpufreq(tmp_path: Path) -> None:
    host = intel_host(tmp_path, cpufreq=True, hwp=True)
    k = load_knob("core_freq", host.fs())
    s = k.probe()
    assert s.supported and s.backend == "cpufreq" and s.details["driver"] == "intel_pstate"
    k.apply(2.2)
    assert host.read("/sys/devices/system/cpu/cpufreq/policy7/scaling_max_freq") == "2200000\n"
    assert host.msr_value(0, 0x199) == 30 << 8  # PERF_CTL untouched


def test_core_freq_perf_ctl(tmp_path: Path) -> None:
    host = intel_host(tmp_path)
    k = load_knob("core_freq", host.fs())
    assert k.probe().backend == "msr"
    k.apply(1.7)
    assert host.msr_value(3, 0x199) == 17 << 8
    with pytest.raises(InvalidSetting, match="100 MHz"):
        k.apply(1.75)
    with pytest.raises(InvalidSetting, match="turbo"):
        k.apply("turbo")


# --- uncore_freq ------------------------------------------------------------------------------


def test_uncore_msr_fields(tmp_path: Path) -> None:
    host = FakeHost(tmp_path).cpus(4, packages=2).msr({MSR_UNCORE_RATIO_LIMIT: 0x5_0000_0C18})
    k = load_knob("uncore_freq", host.fs())
    s = k.probe()
    assert s.backend == "msr" and s.details["min_ghz"] == 1.2 and s.details["max_ghz"] == 2.4
    k.apply(1.8)
    # one CPU per package, min and max ratio both 18, bits above 14 untouched
    assert host.msr_value(0, MSR_UNCORE_RATIO_LIMIT) == 0x5_0000_1212
    assert host.msr_value(2, MSR_UNCORE_RATIO_LIMIT) == 0x5_0000_1212  # package 1
    assert host.msr_value(1, MSR_UNCORE_RATIO_LIMIT) == 0x5_0000_0C18  # package 0, not written
    with pytest.raises(InvalidSetting, match="outside"):
        k.apply(2.6)


def test_uncore_sysfs_and_amd(tmp_path: Path) -> None:
    host = intel_host(tmp_path / "i")
    k = load_knob("uncore_freq", host.fs())
    k.apply(2.0)
    d = "/sys/devices/system/cpu/intel_uncore_frequency/package_01_die_00"
    assert host.read(d + "/min_freq_khz") == "2000000\n"
    assert host.read(d + "/max_freq_khz") == "2000000\n"
    amd = amd_host(tmp_path / "a")
    s = load_knob("uncore_freq", amd.fs()).probe()
    assert not s.supported and "AMD" in s.reason


# --- all-or-nothing apply ---------------------------------------------------------------------


def test_partial_failure_is_undone(tmp_path: Path) -> None:
    # this kernel's defrag does not offer "never": enabled is written, then defrag is refused
    host = FakeHost(tmp_path).thp("always [madvise] never", "always defer [madvise]")
    before = host.tree()
    with pytest.raises(KnobError, match="partial change undone"):
        load_knob("thp", host.fs()).apply("never")
    assert host.tree() == before


def test_cdp_group_removed_when_schemata_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    host = intel_host(tmp_path)
    for res in ("L3CODE", "L3DATA"):
        host.file(f"/sys/fs/resctrl/info/{res}/min_cbm_bits", "8\n")
    k = load_knob("cdp", host.fs())
    monkeypatch.setattr(k, "validate", lambda v: v)  # let a bad split reach the kernel
    before = host.tree()
    with pytest.raises(KnobError, match=r"Need at least 8 .*partial change undone"):
        k.apply("6:5")
    after = host.tree()
    assert after.pop("sys/fs/resctrl/info/last_cmd_status") == b"Need at least 8 bits in the mask\n"
    before.pop("sys/fs/resctrl/info/last_cmd_status")
    assert after == before  # the group musku created is gone again


def test_core_count_live_cgroup_v2(tmp_path: Path) -> None:
    host = FakeHost(tmp_path).cpus(4).cgroup_v2()
    before = host.tree()
    k = load_knob("core_count", host.fs(), cgroup="musku.slice", create_cgroup=True)
    assert k.probe().backend == "cpuset-v2"
    snap = k.snapshot()
    k.apply(3)
    assert host.read("/sys/fs/cgroup/musku.slice/cpuset.cpus") == "0-2\n"
    assert host.read("/sys/fs/cgroup/musku.slice/cpuset.cpus.effective") == "0-2\n"
    assert k.verify(3) and not k.verify(2)
    k.rollback(snap)
    assert host.tree() == before
    off = FakeHost(tmp_path / "off").cpus(4).cgroup_v2(subtree="cpu memory")
    s = load_knob("core_count", off.fs(), cgroup="svc", create_cgroup=True).probe()
    assert not s.supported and "+cpuset" in s.reason


def test_core_count_live_cgroup_and_hotplug_order(tmp_path: Path) -> None:
    host = intel_host(tmp_path)
    host.fs().mkdir("/sys/fs/cgroup/cpuset/svc")
    host.fs().write_bytes("/sys/fs/cgroup/cpuset/svc/cpuset.cpus", b"0-7")
    before = host.tree()
    k = load_knob("core_count", host.fs(), mode="live", cgroup="svc", hotplug=True)
    assert k.probe().backend == "cpuset-v1+hotplug"
    snap = k.snapshot()
    k.apply(1)  # shrink: cpuset first, then offline
    assert host.read("/sys/devices/system/cpu/online") == "0,4\n"
    assert host.read("/sys/fs/cgroup/cpuset/svc/cpuset.cpus") == "0,4\n"
    k.apply(3)  # grow: online first, then the cpuset may use them
    assert host.read("/sys/devices/system/cpu/online") == "0-2,4-6\n"
    assert host.read("/sys/fs/cgroup/cpuset/svc/cpuset.cpus") == "0-2,4-6\n"
    assert k.verify(3) and k.read() == 3
    k.rollback(snap)  # CPUs back online before the cpuset gets its original CPUs back
    assert host.tree() == before


def test_core_freq_per_policy_boost(tmp_path: Path) -> None:
    host = FakeHost(tmp_path).cpus(2).cpufreq("amd-pstate-epp", 400_000, 3_500_000)
    host.p("/sys/devices/system/cpu/cpufreq/boost").unlink()
    for cpu in (0, 1):
        host.file(f"/sys/devices/system/cpu/cpufreq/policy{cpu}/boost", "0\n")
    k = load_knob("core_freq", host.fs())
    before = host.tree()
    snap = k.snapshot()
    assert k.probe().details["turbo"] is False
    k.apply("turbo")
    assert host.read("/sys/devices/system/cpu/cpufreq/policy1/boost") == "1\n"
    assert k.read() == "turbo" and k.verify("turbo")
    k.rollback(snap)
    assert host.tree() == before


def test_core_count_refuses_grub_d_override(tmp_path: Path) -> None:
    host = intel_host(tmp_path)
    host.file("/etc/default/grub.d/50-cloudimg.cfg", 'GRUB_CMDLINE_LINUX="console=ttyS1"\n')
    s = load_knob("core_count", host.fs()).probe()
    assert not s.supported and "50-cloudimg.cfg" in s.reason
    host.file("/etc/default/grub.d/50-cloudimg.cfg", "GRUB_TIMEOUT=1\n")
    assert load_knob("core_count", host.fs()).probe().supported


def test_garbage_kernel_file_is_a_typed_answer(tmp_path: Path) -> None:
    host = vm_host(tmp_path)
    host.file("/sys/devices/system/cpu/present", "zero-one\n")
    support = probe_all(host.fs())["core_count"]
    assert not support.supported and "not a cpu list" in support.reason


def test_msr_allow_list_is_the_knobs_registers() -> None:
    """The HostFS allow-list is gathered from the knob specs: every register a knob declares,
    writable in exactly the bits it declares, and nothing else."""
    from musku.hostfs import HostFS, default_msr_allow
    from musku.knob_spec import knob_names, spec_of

    allow = default_msr_allow()
    declared = {m.register: m for k in knob_names() for m in spec_of(k).msrs}
    assert set(allow) == set(declared) and len(allow) >= 8
    assert allow[MSR_UNCORE_RATIO_LIMIT].write_mask == 0x7F7F
    assert allow[0xCE].write_mask == 0  # MSR_PLATFORM_INFO: read-only
    assert HostFS("/").msr_allow == allow
