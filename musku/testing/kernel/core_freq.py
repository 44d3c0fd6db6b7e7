"""cpufreq: ``scaling_{min,max}_freq`` within ``cpuinfo_{min,max}_freq`` (else EINVAL);
the turbo switches (``intel_pstate/no_turbo``, ``cpufreq/boost``) take 0 or 1."""

from __future__ import annotations

import re

from musku.hostfs import CPUFREQ, INTEL_PSTATE
from musku.testing.fakehost import FakeKernelFS, KernelRule, einval


def scaling(kernel: FakeKernelFS, path: str, text: str, match: re.Match[str]) -> None:
    d = path.rsplit("/", 1)[0]
    lo = kernel.read_int(d + "/cpuinfo_min_freq")
    hi = kernel.read_int(d + "/cpuinfo_max_freq")
    if not text.isdigit() or not lo <= int(text) <= hi:
        raise einval(path)
    kernel.store(path, text + "\n")


def switch(kernel: FakeKernelFS, path: str, text: str, match: re.Match[str]) -> None:
    if text not in ("0", "1"):
        raise einval(path)
    kernel.store(path, text + "\n")


RULES = (
    KernelRule(re.escape(CPUFREQ) + r"/policy\d+/scaling_(min|max)_freq", scaling, "cpufreq"),
    KernelRule(
        re.escape(INTEL_PSTATE + "/no_turbo") + "|" + re.escape(CPUFREQ + "/boost"),
        switch,
        "turbo switch",
    ),
)
