"""Fake host trees that behave like the kernel, for the knob tests.

``FakeHost(tmp).cpus(8).thp("always [madvise] never")...`` builds a tree of plain files under a
tmp dir; ``host.fs()`` returns a :class:`FakeKernelFS`, a :class:`musku.hostfs.HostFS` whose
write/mkdir/rmdir primitives enforce the kernel's rules where a plain file cannot. The write
rules are a registry (:class:`KernelRule`: a path pattern and a handler): each knob's spec
names its own (``KnobSpec.fake_kernel``; the built-ins' are in :mod:`musku.testing.kernel`),
so a knob from outside musku brings its kernel's rules with it. The built-in ones:

* THP ``enabled``/``defrag``: a store takes one offered word (else EINVAL) and reads back in
  ``a [b] c`` format;
* ``nr_hugepages``: the pool grows only up to what memory allows (``grant_limit``), reads back the
  number granted; ``/proc/sys/vm/nr_hugepages`` and ``meminfo`` follow;
* CPU hotplug: ``cpuN/online`` takes 0/1, updates ``online``/``offline`` lists; cpu0 has no online
  file; offlining removes the CPU from every cpuset's effective cpus;
* cpuset cgroup v1: ``mkdir`` creates the control files; ``cpuset.cpus`` must be a subset of the
  parent's (else EINVAL); ``rmdir`` fails with EBUSY while tasks remain;
* resctrl: ``mkdir`` creates ``schemata``/``tasks``/``cpus`` with full default masks (ENOSPC when
  CLOSIDs run out); a schemata store with a non-contiguous, too short, or out-of-range CBM fails
  with EINVAL and explains itself in ``info/last_cmd_status``; partial stores merge;
* cpufreq ``scaling_{min,max}_freq``: within ``cpuinfo_{min,max}_freq`` (else EINVAL);
* intel_uncore_frequency ``{min,max}_freq_khz``: within the initial limits and min <= max;
* MSR devices are sparse regular files, read and written with the real ``os.pread``/
  ``os.pwrite`` code path at offset ``8 * register`` (see :data:`MSR_STRIDE`).
"""

from __future__ import annotations

import errno
import functools
import json
import os
import re
import shutil
import struct
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from musku.errors import InputError
from musku.hostfs import (
    CGROUP_ROOT,
    CGROUP_V1_CPUSET,
    CPUFREQ,
    GRUB_DEFAULT,
    HUGEPAGES_DIR,
    INTEL_PSTATE,
    INTEL_UNCORE,
    MSR_ALLOW_WRITES,
    PROC_CMDLINE,
    PROC_CPUINFO,
    PROC_MEMINFO,
    PROC_MOUNTS,
    PROC_NR_HUGEPAGES,
    PROC_SYS,
    RESCTRL,
    SYS_CPU,
    SYSFS,
    THP_DIR,
    HostFS,
    format_cpulist,
    msr_path,
    parse_cpulist,
)
from musku.knob_spec import knob_names, spec_of
from musku.registry import load

FIXTURES = Path(__file__).parent / "fixtures"

MSR_STRIDE = 8
"""A fake MSR device is a sparse file read and written with the real ``os.pread``/``os.pwrite``
of 8 bytes, but at offset ``8 * register``: on the real device the offset selects a register,
while in a plain file registers closer than 8 bytes (0x199, 0x1A0, 0x1A4) would overlap."""


def einval(path: str) -> OSError:
    """The kernel's refusal of a store (a rule raises it; HostFS turns it into HostFSError)."""
    return OSError(errno.EINVAL, os.strerror(errno.EINVAL), path)


RuleWrite = Callable[["FakeKernelFS", str, str, "re.Match[str]"], None]
"""A rule's write handler: ``(kernel, path, text, match)``; ``text`` is the stored bytes
decoded and stripped, ``match`` the rule's pattern on ``path``. It validates like the kernel
(raises :func:`einval` or another ``OSError``, changing nothing) and makes the store's side
effects on related files with ``kernel.store(path, text)``."""


@dataclass(frozen=True)
class KernelRule:
    """How the fake kernel takes a store to the attributes ``pattern`` matches (a regular
    expression matched in full against the host path, ``/sys/...``)."""

    pattern: str
    write: RuleWrite
    name: str = ""

    @property
    def regex(self) -> re.Pattern[str]:
        return _compiled(self.pattern)


@functools.lru_cache(maxsize=256)
def _compiled(pattern: str) -> re.Pattern[str]:
    return re.compile(pattern)


_rules_lock = threading.Lock()
_rules_cache: dict[tuple[str, ...], tuple[KernelRule, ...]] = {}


def kernel_rules() -> tuple[KernelRule, ...]:
    """The fake kernel's rules: those every registered knob's spec names
    (``KnobSpec.fake_kernel``, ``"module:attr"`` of a sequence of :class:`KernelRule`), in
    the knobs' sweep order; the first rule matching a path takes the store. An out-of-tree
    knob's rules apply once it is registered. A target that does not load, or holds
    anything but rules, is an :class:`~musku.errors.InputError` naming the knob."""
    names = knob_names()
    with _rules_lock:
        cached = _rules_cache.get(names)
        if cached is not None:
            return cached
        rules: list[KernelRule] = []
        for name in names:
            target = spec_of(name).fake_kernel
            if not target:
                continue
            loaded = load(target, {}, kind=f"knob {name}'s fake-kernel rules")
            if isinstance(loaded, KernelRule):
                loaded = (loaded,)
            if not isinstance(loaded, list | tuple) or not all(
                isinstance(r, KernelRule) for r in loaded
            ):
                raise InputError(
                    f"knob {name}'s fake-kernel rules {target!r} are not KernelRule objects"
                )
            rules.extend(loaded)
        _rules_cache[names] = out = tuple(rules)
        return out


class FakeHost:
    """Builder of a fake host tree under ``root``."""

    def __init__(self, root: Path | str) -> None:
        self.root = Path(root)
        self.root.mkdir(parents=True, exist_ok=True)
        self.hugepage_limit: dict[int, int] = {}  # page kB -> most pages the kernel will grant
        self.rules: tuple[KernelRule, ...] = ()  # this tree's own rules, before the knobs'
        self.reboots: list[list[str]] = []

    # plain files

    def p(self, path: str) -> Path:
        return self.root / path.lstrip("/")

    def file(self, path: str, content: str | bytes) -> FakeHost:
        target = self.p(path)
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(content.encode() if isinstance(content, str) else content)
        return self

    def read(self, path: str) -> str:
        return self.p(path).read_text()

    def rule(self, rule: KernelRule) -> FakeHost:
        """A kernel rule of this tree only, tried before the knobs' rules."""
        self.rules = (*self.rules, rule)
        return self

    def fs(self) -> FakeKernelFS:
        return FakeKernelFS(self.root, host=self)

    def tree(self) -> dict[str, bytes | None]:
        """Every file (bytes) and directory (None) under the root, for before/after comparison."""
        out: dict[str, bytes | None] = {}
        for dirpath, dirnames, filenames in os.walk(self.root):
            rel = os.path.relpath(dirpath, self.root)
            for d in dirnames:
                out[os.path.join(rel, d)] = None
            for f in filenames:
                out[os.path.join(rel, f)] = _file_content(Path(dirpath) / f)
        return out

    # cpus

    def cpus(
        self,
        n: int,
        *,
        threads_per_core: int = 1,
        packages: int = 1,
        vendor: str = "GenuineIntel",
        model_name: str = "Intel(R) Xeon(R) Gold 6154 CPU @ 3.00GHz",
        flags: str = "fpu msr",
    ) -> FakeHost:
        cores = n // threads_per_core
        per_pkg = max(1, cores // packages)
        allcpus = format_cpulist(range(n))
        self.file(SYS_CPU + "/online", allcpus + "\n")
        self.file(SYS_CPU + "/present", allcpus + "\n")
        self.file(SYS_CPU + "/possible", allcpus + "\n")
        self.file(SYS_CPU + "/offline", "\n")
        self.file(SYS_CPU + "/isolated", "\n")
        info = []
        for cpu in range(n):
            core = cpu % cores
            thread_sibs = [core + t * cores for t in range(threads_per_core)]
            d = f"{SYS_CPU}/cpu{cpu}"
            if cpu != 0:
                self.file(d + "/online", "1\n")
            self.file(d + "/topology/core_id", f"{core % per_pkg}\n")
            self.file(d + "/topology/physical_package_id", f"{core // per_pkg}\n")
            self.file(d + "/topology/die_id", "0\n")
            self.file(d + "/topology/thread_siblings_list", format_cpulist(thread_sibs) + "\n")
            info.append(
                f"processor\t: {cpu}\nvendor_id\t: {vendor}\nmodel name\t: {model_name}\n"
                f"physical id\t: {core // per_pkg}\ncore id\t\t: {core % per_pkg}\n"
                f"flags\t\t: {flags}\n\n"
            )
        self.file(PROC_CPUINFO, "".join(info))
        return self

    def cmdline(self, text: str) -> FakeHost:
        return self.file(PROC_CMDLINE, text + "\n")

    def meminfo(self, total_kb: int = 16 * 1024 * 1024) -> FakeHost:
        return self.file(
            PROC_MEMINFO,
            f"MemTotal:       {total_kb} kB\nMemFree:        {total_kb // 2} kB\n"
            "HugePages_Total:       0\nHugePages_Free:        0\nHugepagesize:       2048 kB\n",
        )

    def thp(
        self,
        enabled: str = "always [madvise] never",
        defrag: str = "always defer defer+madvise [madvise] never",
    ) -> FakeHost:
        self.file(THP_DIR + "/enabled", enabled + "\n")
        self.file(THP_DIR + "/defrag", defrag + "\n")
        return self

    def hugepages(
        self, sizes_kb: tuple[int, ...] = (2048, 1048576), limit: dict[int, int] | None = None
    ) -> FakeHost:
        for kb in sizes_kb:
            d = f"{HUGEPAGES_DIR}/hugepages-{kb}kB"
            for name in ("nr_hugepages", "free_hugepages", "resv_hugepages", "surplus_hugepages"):
                self.file(f"{d}/{name}", "0\n")
        self.file(PROC_NR_HUGEPAGES, "0\n")
        self.hugepage_limit.update(limit or {})
        return self

    def cgroup_v1_cpuset(self) -> FakeHost:
        cpus = self.read(SYS_CPU + "/online")
        self.file(CGROUP_V1_CPUSET + "/cpuset.cpus", cpus)
        self.file(CGROUP_V1_CPUSET + "/cpuset.effective_cpus", cpus)
        self.file(CGROUP_V1_CPUSET + "/cpuset.mems", "0\n")
        self.file(CGROUP_V1_CPUSET + "/tasks", "1\n")
        self.file(CGROUP_V1_CPUSET + "/cgroup.procs", "1\n")
        return self

    def cgroup_v2(self, subtree: str = "cpuset cpu memory") -> FakeHost:
        """A cgroup v2 unified hierarchy mounted at the cgroup root."""
        cpus = self.read(SYS_CPU + "/online")
        self.file(CGROUP_ROOT + "/cgroup.controllers", "cpuset cpu io memory pids\n")
        self.file(CGROUP_ROOT + "/cgroup.subtree_control", subtree + "\n")
        self.file(CGROUP_ROOT + "/cpuset.cpus.effective", cpus)
        self.file(CGROUP_ROOT + "/cgroup.procs", "1\n")
        return self

    def grub(self, cmdline_linux: str = "quiet", extra: str = "") -> FakeHost:
        text = (
            "# If you change this file, run 'update-grub' afterwards to update\n"
            "# /boot/grub/grub.cfg.\n\n"
            "GRUB_DEFAULT=0\nGRUB_TIMEOUT=5\n"
            "GRUB_DISTRIBUTOR=`lsb_release -i -s 2> /dev/null || echo Debian`\n"
            'GRUB_CMDLINE_LINUX_DEFAULT="quiet"\n'
            f'GRUB_CMDLINE_LINUX="{cmdline_linux}"\n' + extra
        )
        return self.file(GRUB_DEFAULT, text)

    def msr(self, values: dict[int, int], *, allow_writes: str | None = "on") -> FakeHost:
        """A sparse /dev/cpu/N/msr for every present CPU, with ``values`` at their offsets."""
        for cpu in parse_cpulist(self.read(SYS_CPU + "/present")):
            target = self.p(msr_path(cpu))
            target.parent.mkdir(parents=True, exist_ok=True)
            with open(target, "wb") as f:
                for reg, value in values.items():
                    f.seek(reg * MSR_STRIDE)
                    f.write(struct.pack("<Q", value))
        if allow_writes is not None:
            self.file(MSR_ALLOW_WRITES, allow_writes + "\n")
        return self

    def msr_value(self, cpu: int, reg: int) -> int:
        with open(self.p(msr_path(cpu)), "rb") as f:
            f.seek(reg * MSR_STRIDE)
            data = f.read(8)
        return int(struct.unpack("<Q", data.ljust(8, b"\0"))[0])

    def cpufreq(
        self,
        driver: str = "intel_pstate",
        min_khz: int = 1_000_000,
        max_khz: int = 3_700_000,
        base_khz: int = 3_000_000,
    ) -> FakeHost:
        for cpu in parse_cpulist(self.read(SYS_CPU + "/present")):
            d = f"{CPUFREQ}/policy{cpu}"
            self.file(d + "/affected_cpus", f"{cpu}\n")
            self.file(d + "/related_cpus", f"{cpu}\n")
            self.file(d + "/cpuinfo_min_freq", f"{min_khz}\n")
            self.file(d + "/cpuinfo_max_freq", f"{max_khz}\n")
            self.file(d + "/scaling_min_freq", f"{min_khz}\n")
            self.file(d + "/scaling_max_freq", f"{max_khz}\n")
            self.file(d + "/scaling_driver", driver + "\n")
            self.file(d + "/scaling_governor", "performance\n")
            if driver != "intel_pstate":
                self.file(d + "/base_frequency", f"{base_khz}\n")
        if driver == "intel_pstate":
            self.file(INTEL_PSTATE + "/no_turbo", "0\n")
            self.file(INTEL_PSTATE + "/status", "active\n")
        else:
            self.file(CPUFREQ + "/boost", "1\n")
        return self

    def uncore_sysfs(
        self, packages: int = 1, min_khz: int = 1_200_000, max_khz: int = 2_400_000
    ) -> FakeHost:
        for pkg in range(packages):
            d = f"{INTEL_UNCORE}/package_{pkg:02d}_die_00"
            for name, v in (
                ("initial_min_freq_khz", min_khz),
                ("initial_max_freq_khz", max_khz),
                ("min_freq_khz", min_khz),
                ("max_freq_khz", max_khz),
                ("current_freq_khz", max_khz),
            ):
                self.file(f"{d}/{name}", f"{v}\n")
        return self

    def resctrl(
        self,
        *,
        cdp: bool = True,
        ways: int = 11,
        cache_ids: tuple[int, ...] = (0,),
        min_cbm_bits: int = 1,
        shareable_bits: int = 0,
        num_closids: int = 8,
    ) -> FakeHost:
        full = (1 << ways) - 1
        resources = ("L3CODE", "L3DATA") if cdp else ("L3",)
        for res in resources:
            d = f"{RESCTRL}/info/{res}"
            self.file(d + "/cbm_mask", f"{full:x}\n")
            self.file(d + "/min_cbm_bits", f"{min_cbm_bits}\n")
            self.file(d + "/shareable_bits", f"{shareable_bits:x}\n")
            self.file(d + "/num_closids", f"{num_closids}\n")
        self.file(RESCTRL + "/info/last_cmd_status", "ok\n")
        self.file(
            RESCTRL + "/schemata",
            schemata_text({r: dict.fromkeys(cache_ids, full) for r in resources}),
        )
        self.file(RESCTRL + "/tasks", "1\n")
        opts = "rw,relatime,cdp" if cdp else "rw,relatime"
        mounts = self.read(PROC_MOUNTS) if self.p(PROC_MOUNTS).exists() else ""
        self.file(PROC_MOUNTS, mounts + f"resctrl /sys/fs/resctrl resctrl {opts} 0 0\n")
        return self

    def reboot(self) -> None:
        """Boot the kernel command line that /etc/default/grub now configures."""
        text = self.read(GRUB_DEFAULT)
        m = re.search(r'^GRUB_CMDLINE_LINUX="([^"]*)"', text, re.M)
        cmdline = m.group(1) if m else ""
        self.cmdline(f"BOOT_IMAGE=/boot/vmlinuz root=/dev/sda1 ro {cmdline}".strip())
        isolated = ""
        for word in cmdline.split():
            if word.startswith("isolcpus="):
                isolated = format_cpulist(_cpus_of_isolcpus(word))
        self.file(SYS_CPU + "/isolated", isolated + "\n")

    # snapshots of real machines

    @classmethod
    def from_fixture(cls, root: Path, name: str) -> FakeHost:
        """Rebuild a captured fixture tree (``musku/testing/fixtures/NAME``) under ``root``."""
        src = FIXTURES / name
        shutil.copytree(
            src, root, dirs_exist_ok=True, ignore=shutil.ignore_patterns("msr.json", "expect.json")
        )
        host = cls(root)
        limits = fixture_expect(name).get("hugepage_limit_kb", {})
        assert isinstance(limits, dict)
        for kb, limit in limits.items():
            host.hugepage_limit[int(kb)] = int(limit)
        # the capture skips the (host-specific) task lists of the root cpuset
        for member in ("tasks", "cgroup.procs"):
            target = host.p(CGROUP_V1_CPUSET + "/" + member)
            if target.parent.is_dir() and not target.exists():
                host.file(CGROUP_V1_CPUSET + "/" + member, "1\n")
        msr_file = src / "msr.json"
        if msr_file.exists():
            regs_by_cpu = json.loads(msr_file.read_text())
            for cpu, regs in regs_by_cpu.items():
                target = host.p(msr_path(int(cpu)))
                target.parent.mkdir(parents=True, exist_ok=True)
                with open(target, "wb") as f:
                    for reg, value in regs.items():
                        f.seek(int(reg, 16) * MSR_STRIDE)
                        f.write(struct.pack("<Q", int(value)))
        return host


def _file_content(path: Path) -> bytes:
    """A file's bytes; for a sparse file (a fake MSR device at offsets up to 0xC0000108) only
    its data extents, each prefixed by its offset, so that a comparison stays cheap."""
    size = path.stat().st_size
    if size < 1 << 20:
        return path.read_bytes()
    chunks: list[bytes] = []
    fd = os.open(path, os.O_RDONLY)
    try:
        pos = 0
        while pos < size:
            try:
                start = os.lseek(fd, pos, os.SEEK_DATA)
            except OSError:
                break
            end = os.lseek(fd, start, os.SEEK_HOLE)
            chunks.append(start.to_bytes(8, "little") + os.pread(fd, end - start, start))
            pos = end
    finally:
        os.close(fd)
    return b"".join(chunks)


def _cpus_of_isolcpus(word: str) -> list[int]:
    """``isolcpus=[flags,]cpulist`` -> cpus (flags are words like ``domain``, ``nohz``)."""
    value = word.split("=", 1)[1]
    parts = [p for p in value.split(",") if p and not p[0].isalpha()]
    return parse_cpulist(",".join(parts))


def schemata_text(resources: dict[str, dict[int, int]]) -> str:
    width = max(len(r) for r in resources)
    lines = []
    for res, doms in resources.items():
        body = ";".join(f"{d}={m:x}" for d, m in sorted(doms.items()))
        lines.append(f"{res:>{width}}:{body}")
    return "\n".join(lines) + "\n"


def parse_schemata(text: str) -> dict[str, dict[int, str]]:
    out: dict[str, dict[int, str]] = {}
    for line in text.splitlines():
        line = line.strip()
        if not line:
            continue
        res, _, body = line.partition(":")
        doms: dict[int, str] = {}
        for item in body.split(";"):
            d, _, m = item.partition("=")
            doms[int(d.strip())] = m.strip()
        out[res.strip()] = doms
    return out


class FakeKernelFS(HostFS):
    """HostFS over a fake tree that enforces the kernel's rules on writes and mkdir/rmdir."""

    def __init__(self, root: Path | str, *, host: FakeHost, read_only: bool = False) -> None:
        super().__init__(root, read_only=read_only)
        self.fake = host
        self.writes: list[tuple[str, bytes]] = []

    def _msr_offset(self, reg: int) -> int:
        return reg * MSR_STRIDE

    def write_bytes(self, path: str, data: bytes) -> None:
        self._writable(path)
        self.writes.append((path, data))
        if not self.exists(path):
            super().write_bytes(path, data)  # raises ENOENT like the kernel
        try:
            handled = self._kernel_write(path, data)
        except OSError as exc:
            raise self._error("write", path, exc) from None
        if not handled:
            super().write_bytes(path, data)

    def store(self, path: str, text: str) -> None:
        """Set a file's content as the kernel would show it (no rule, no journal).

        Atomically, as a kernel attribute reads: a reader in another process (a test polling
        the tree while a forked agent writes it) sees the old or the new text, never the
        empty file between a truncation and its write."""
        target = self.host(path)
        tmp = target.with_name(f".{target.name}.{os.getpid()}.store")
        tmp.write_text(text)
        os.replace(tmp, target)

    _store = store  # its earlier name, which fake kernels of the tests still override/call

    def _kernel_write(self, path: str, data: bytes) -> bool:
        """Apply the first rule matching ``path`` (False: none, a plain file write)."""
        text = data.decode(errors="replace").strip()
        for rule in self.fake.rules + kernel_rules():
            m = rule.regex.fullmatch(path)
            if m:
                rule.write(self, path, text, m)
                return True
        if path.startswith((SYSFS, PROC_SYS)):
            self.store(path, text + "\n")  # an attribute's show() prints the value and a newline
            return True
        return False

    def mkdir(self, path: str) -> None:
        self._writable(path)
        parent = path.rsplit("/", 1)[0]
        if parent == RESCTRL:
            groups = [
                d
                for d in self.listdir(RESCTRL)
                if d != "info" and self.exists(f"{RESCTRL}/{d}/schemata")
            ]
            res = self._resctrl_resources()[0]
            closids = self.read_int(f"{RESCTRL}/info/{res}/num_closids")
            if len(groups) + 1 >= closids:
                raise self._error("mkdir", path, OSError(errno.ENOSPC, "no CLOSID", path))
            super().mkdir(path)
            full = {
                r: {d: int(self.read_value(f"{RESCTRL}/info/{r}/cbm_mask"), 16) for d in doms}
                for r, doms in parse_schemata(self.read_text(RESCTRL + "/schemata")).items()
            }
            self.store(path + "/schemata", schemata_text(full))
            for name in ("tasks", "cpus"):
                self.store(f"{path}/{name}", "\n")
            self.store(path + "/mode", "shareable\n")
            return
        if self.is_cgroup_v2(path):
            super().mkdir(path)
            subtree = self.read_value(parent + "/cgroup.subtree_control")
            self.store(path + "/cgroup.controllers", subtree + "\n")
            self.store(path + "/cgroup.subtree_control", "\n")
            self.store(path + "/cgroup.procs", "")
            if "cpuset" in subtree.split():
                peff = self.read_value(parent + "/cpuset.cpus.effective")
                self.store(path + "/cpuset.cpus", "\n")
                self.store(path + "/cpuset.cpus.effective", peff + "\n")
            return
        if path.startswith(CGROUP_V1_CPUSET + "/") and self.exists(parent + "/cpuset.cpus"):
            super().mkdir(path)
            for name in (
                "cpuset.cpus",
                "cpuset.mems",
                "cpuset.effective_cpus",
                "tasks",
                "cgroup.procs",
            ):
                self.store(f"{path}/{name}", "\n")
            return
        super().mkdir(path)

    def is_cgroup_v2(self, path: str) -> bool:
        return (
            path.startswith(CGROUP_ROOT + "/")
            and not path.startswith(CGROUP_V1_CPUSET + "/")
            and self.exists(CGROUP_ROOT + "/cgroup.controllers")
        )

    def _resctrl_resources(self) -> list[str]:
        return [r for r in self.listdir(RESCTRL + "/info") if self.is_dir(f"{RESCTRL}/info/{r}")]

    def rmdir(self, path: str) -> None:
        self._writable(path)
        real = self.host(path)
        is_resctrl = path.startswith(RESCTRL + "/") and (real / "schemata").exists()
        is_cpuset = (path.startswith(CGROUP_V1_CPUSET + "/") or self.is_cgroup_v2(path)) and (
            (real / "cgroup.procs").exists()
        )
        members = [real / f for f in ("tasks", "cgroup.procs")]
        if is_cpuset and any(m.exists() and m.read_text().strip() for m in members):
            raise self._error("rmdir", path, OSError(errno.EBUSY, "busy", path))
        if is_resctrl or is_cpuset:
            for child in real.iterdir():
                if child.is_dir():
                    raise self._error("rmdir", path, OSError(errno.EBUSY, "busy", path))
            shutil.rmtree(real)
            return
        super().rmdir(path)


# --- the three reference hosts ----------------------------------------------------------------

SKYLAKE_MSRS = {
    0xCE: (30 << 8) | (10 << 40),  # MSR_PLATFORM_INFO: max non-turbo 3.0 GHz, min 1.0 GHz
    0x199: 30 << 8,  # IA32_PERF_CTL: ratio 30
    0x1A0: 0x850089,  # IA32_MISC_ENABLE: turbo enabled (bit 38 clear)
    0x1A4: 0x0,  # prefetchers all enabled
    0x620: (12 << 8) | 24,  # uncore ratio: min 1.2 GHz, max 2.4 GHz
    0x770: 0x0,  # HWP off
}


def intel_host(root: Path, *, cpufreq: bool = False, hwp: bool = False) -> FakeHost:
    """A two-socket Intel Xeon Skylake-SP shape (8 logical CPUs kept small for speed) with MSRs,
    resctrl mounted with cdp (11 ways), intel_uncore_frequency, cpuset v1 and GRUB."""
    msrs = dict(SKYLAKE_MSRS)
    if hwp:
        msrs[0x770] = 1
    h = (
        FakeHost(root)
        .cpus(
            8,
            threads_per_core=2,
            packages=2,
            flags="fpu msr rdt_a cat_l3 cdp_l3 pdpe1gb" + (" hwp" if hwp else ""),
        )
        .meminfo(64 * 1024 * 1024)
        .thp("[always] madvise never", "always defer defer+madvise [madvise] never")
        .hugepages(limit={2048: 500, 1048576: 2})
        .msr(msrs)
        .resctrl(cdp=True, ways=11, cache_ids=(0, 1), min_cbm_bits=1, shareable_bits=0x600)
        .uncore_sysfs(packages=2)
        .cgroup_v1_cpuset()
        .grub("console=ttyS0")
        .cmdline("BOOT_IMAGE=/boot/vmlinuz root=/dev/sda1 ro console=ttyS0")
    )
    if cpufreq:
        h.cpufreq("intel_pstate", 1_000_000, 3_700_000)
    return h


AMD_MSRS = {0xC0000108: 0x0}


def amd_host(root: Path) -> FakeHost:
    """An AMD EPYC Zen 3 shape: acpi-cpufreq with boost, MSR 0xC0000108, no resctrl CDP,
    no intel_uncore_frequency."""
    return (
        FakeHost(root)
        .cpus(
            8,
            threads_per_core=2,
            vendor="AuthenticAMD",
            model_name="AMD EPYC 7763 64-Core Processor",
            flags="fpu msr pdpe1gb rdt_a cat_l3",
        )
        .meminfo(32 * 1024 * 1024)
        .thp("[always] madvise never", "always defer defer+madvise [madvise] never")
        .hugepages(limit={2048: 1024})
        .msr(AMD_MSRS)
        .cpufreq("acpi-cpufreq", 1_500_000, 2_450_000, 2_450_000)
        .resctrl(cdp=False, ways=16, cache_ids=(0,), min_cbm_bits=1)
        .cgroup_v1_cpuset()
        .grub("quiet")
        .cmdline("BOOT_IMAGE=/boot/vmlinuz root=/dev/nvme0n1p1 ro quiet")
    )


def vm_host(root: Path) -> FakeHost:
    """This development VM, from the snapshot captured on it (fixtures/firecracker-vm)."""
    return FakeHost.from_fixture(root, "firecracker-vm")


def fixture_names() -> list[str]:
    """Captured host snapshots: every fixtures/NAME with an expect.json."""
    return sorted(d.name for d in FIXTURES.iterdir() if (d / "expect.json").is_file())


def fixture_expect(name: str) -> dict[str, object]:
    """A fixture's expectations: supported knobs, (target, other) values, huge page limits."""
    path = FIXTURES / name / "expect.json"
    return dict(json.loads(path.read_text())) if path.exists() else {}
