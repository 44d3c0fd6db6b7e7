"""CPU hotplug and cpusets: ``cpuN/online`` takes 0/1 and updates the ``online``/``offline``
lists (offlining removes the CPU from every v1 cpuset for good); a v1 ``cpuset.cpus`` must be
a subset of the parent's and of the online CPUs (else EINVAL) and sets
``cpuset.effective_cpus``; a v2 ``cpuset.cpus`` must parse and sets ``cpuset.cpus.effective``
(the parent's where they do not meet)."""

from __future__ import annotations

import os
import re
from pathlib import Path

from musku.hostfs import (
    CGROUP_ROOT,
    CGROUP_V1_CPUSET,
    SYS_CPU,
    format_cpulist,
    parse_cpulist,
)
from musku.testing.fakehost import FakeKernelFS, KernelRule, einval


def hotplug(kernel: FakeKernelFS, path: str, text: str, match: re.Match[str]) -> None:
    cpu = int(match.group(1))
    if text not in ("0", "1"):
        raise einval(path)
    online = set(parse_cpulist(kernel.read_value(SYS_CPU + "/online")))
    if text == "0":
        online.discard(cpu)
    else:
        online.add(cpu)
    present = parse_cpulist(kernel.read_value(SYS_CPU + "/present"))
    kernel.store(SYS_CPU + "/online", format_cpulist(online) + "\n")
    kernel.store(SYS_CPU + "/offline", format_cpulist(set(present) - online) + "\n")
    kernel.store(path, text + "\n")
    _cpuset_effective(kernel, online)


def _cpuset_effective(kernel: FakeKernelFS, online: set[int]) -> None:
    """cgroup v1 hotplug: the root cpuset follows the online CPUs; an offlined CPU is
    removed from every child's cpuset.cpus for good (onlining does not give it back)."""
    base = kernel.host(CGROUP_V1_CPUSET)
    if not base.is_dir():
        return
    for dirpath, _, files in os.walk(base):
        if "cpuset.cpus" not in files:
            continue
        d = Path(dirpath)
        if d == base:
            cpus = set(online)
        else:
            cpus = set(parse_cpulist((d / "cpuset.cpus").read_text())) & online
        (d / "cpuset.cpus").write_text(format_cpulist(cpus) + "\n")
        (d / "cpuset.effective_cpus").write_text(format_cpulist(cpus) + "\n")


def cpuset_cpus(kernel: FakeKernelFS, path: str, text: str, match: re.Match[str]) -> None:
    parent = path.rsplit("/", 2)[0]
    if path.startswith(CGROUP_V1_CPUSET + "/"):
        cpus = set(parse_cpulist(text)) if text else set()
        allowed = set(parse_cpulist(kernel.read_value(parent + "/cpuset.cpus")))
        online = set(parse_cpulist(kernel.read_value(SYS_CPU + "/online")))
        if not cpus <= allowed & online:
            raise einval(path)
        kernel.store(path, format_cpulist(cpus) + "\n")
        kernel.store(
            path.replace("cpuset.cpus", "cpuset.effective_cpus"),
            format_cpulist(cpus & online) + "\n",
        )
        return
    if not kernel.is_cgroup_v2(path):
        kernel.store(path, text + "\n")
        return
    try:
        cpus = set(parse_cpulist(text))
    except ValueError:
        raise einval(path) from None
    peff = set(parse_cpulist(kernel.read_value(parent + "/cpuset.cpus.effective")))
    kernel.store(path, format_cpulist(cpus) + "\n")
    kernel.store(path + ".effective", format_cpulist((cpus & peff) or peff) + "\n")


def cpuset_mems(kernel: FakeKernelFS, path: str, text: str, match: re.Match[str]) -> None:
    kernel.store(path, text + "\n")


RULES = (
    KernelRule(re.escape(SYS_CPU) + r"/cpu(\d+)/online", hotplug, "CPU hotplug"),
    KernelRule(re.escape(CGROUP_ROOT) + r"/(?:.+/)?cpuset\.cpus", cpuset_cpus, "cpuset.cpus"),
    KernelRule(re.escape(CGROUP_V1_CPUSET) + r"/(?:.+/)?cpuset\.mems", cpuset_mems, "cpuset.mems"),
)
