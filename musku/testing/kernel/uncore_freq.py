"""intel_uncore_frequency ``{min,max}_freq_khz``: within the initial limits, min <= max."""

from __future__ import annotations

import re

from musku.hostfs import INTEL_UNCORE
from musku.testing.fakehost import FakeKernelFS, KernelRule, einval


def limit(kernel: FakeKernelFS, path: str, text: str, match: re.Match[str]) -> None:
    d = path.rsplit("/", 1)[0]
    lo = kernel.read_int(d + "/initial_min_freq_khz")
    hi = kernel.read_int(d + "/initial_max_freq_khz")
    if not text.isdigit() or not lo <= int(text) <= hi:
        raise einval(path)
    is_min = match.group(1) == "min"
    other = kernel.read_int(d + ("/max_freq_khz" if is_min else "/min_freq_khz"))
    if (is_min and int(text) > other) or (not is_min and int(text) < other):
        raise einval(path)
    kernel.store(path, text + "\n")


RULES = (KernelRule(re.escape(INTEL_UNCORE) + r"/[^/]+/(min|max)_freq_khz", limit, "uncore"),)
