"""Capture the knob-relevant kernel files of a host into a fixture tree.

    python -m tests.knobs.capture DEST [--root /]

Copies the small text attributes musku's knobs read (cpu topology and hotplug, cpufreq,
intel_pstate, intel_uncore_frequency, THP, huge pages, resctrl info and schemata, the cpuset
cgroup root, /proc/cmdline, cpuinfo, meminfo, mounts, msr.allow_writes, /etc/default/grub) and
the allow-listed MSRs of every CPU into ``msr.json``. Run it on a real host to add a fixture;
``fakehost.FakeHost.from_fixture`` rebuilds a tree from it.
"""

from __future__ import annotations

import argparse
import fnmatch
import json
import os
import shutil
from pathlib import Path

from musku.errors import MuskuError
from musku.hostfs import HostFS, default_msr_allow

GLOBS = [
    "/sys/devices/system/cpu/online",
    "/sys/devices/system/cpu/offline",
    "/sys/devices/system/cpu/possible",
    "/sys/devices/system/cpu/present",
    "/sys/devices/system/cpu/isolated",
    "/sys/devices/system/cpu/cpu*/online",
    "/sys/devices/system/cpu/cpu*/topology/core_id",
    "/sys/devices/system/cpu/cpu*/topology/physical_package_id",
    "/sys/devices/system/cpu/cpu*/topology/die_id",
    "/sys/devices/system/cpu/cpu*/topology/thread_siblings_list",
    "/sys/devices/system/cpu/cpufreq/boost",
    "/sys/devices/system/cpu/cpufreq/policy*/*",
    "/sys/devices/system/cpu/intel_pstate/*",
    "/sys/devices/system/cpu/intel_uncore_frequency/*/*",
    "/sys/kernel/mm/transparent_hugepage/enabled",
    "/sys/kernel/mm/transparent_hugepage/defrag",
    "/sys/kernel/mm/hugepages/*/*",
    "/proc/sys/vm/nr_hugepages",
    "/sys/fs/resctrl/schemata",
    "/sys/fs/resctrl/info/*/*",
    "/sys/fs/resctrl/info/last_cmd_status",
    "/sys/fs/cgroup/cpuset/cpuset.cpus",
    "/sys/fs/cgroup/cpuset/cpuset.mems",
    "/sys/fs/cgroup/cpuset/cpuset.effective_cpus",
    "/sys/fs/cgroup/cpuset/cpuset.effective_mems",
    "/sys/fs/cgroup/cgroup.controllers",
    "/sys/fs/cgroup/cgroup.subtree_control",
    "/sys/fs/cgroup/cpuset.cpus.effective",
    "/sys/module/msr/parameters/allow_writes",
    "/proc/cmdline",
    "/proc/cpuinfo",
    "/proc/meminfo",
    "/proc/mounts",
    "/etc/default/grub",
]


def _expand(fs: HostFS, pattern: str) -> list[str]:
    parts = pattern.strip("/").split("/")
    paths = ["/"]
    for part in parts:
        nxt: list[str] = []
        for base in paths:
            if any(c in part for c in "*?["):
                if fs.is_dir(base):
                    for name in fs.listdir(base):
                        if fnmatch.fnmatch(name, part):
                            nxt.append(base.rstrip("/") + "/" + name)
            else:
                nxt.append(base.rstrip("/") + "/" + part)
        paths = nxt
    return [p for p in paths if fs.is_file(p)]


def capture(fs: HostFS, dest: Path) -> list[str]:
    """Copy the relevant files of ``fs`` under ``dest``; returns the host paths copied."""
    copied: list[str] = []
    for pattern in GLOBS:
        for path in _expand(fs, pattern):
            try:
                data = fs.read_bytes(path)
            except MuskuError:
                continue  # write-only or permission-denied attributes
            target = dest / path.lstrip("/")
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(data)
            copied.append(path)
    for d in ("/sys/fs/cgroup/cpuset", "/sys/fs/resctrl"):
        if fs.is_dir(d):
            (dest / d.lstrip("/")).mkdir(parents=True, exist_ok=True)
    msrs: dict[str, dict[str, int]] = {}
    if fs.is_dir("/dev/cpu"):
        for name in fs.listdir("/dev/cpu"):
            if name.isdigit() and fs.has_msr(int(name)):
                regs: dict[str, int] = {}
                for reg in default_msr_allow():
                    try:
                        regs[hex(reg)] = fs.read_msr(int(name), reg)
                    except MuskuError:
                        continue
                msrs[name] = regs
    (dest / "msr.json").write_text(json.dumps(msrs, indent=1, sort_keys=True) + "\n")
    return copied


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("dest", type=Path)
    ap.add_argument("--root", default="/")
    args = ap.parse_args()
    if args.dest.exists():
        shutil.rmtree(args.dest)
    args.dest.mkdir(parents=True)
    n = capture(HostFS(args.root), args.dest)
    print(f"captured {len(n)} files into {args.dest} ({os.cpu_count()} cpus)")


if __name__ == "__main__":
    main()
