"""``nr_hugepages``: the pool grows only up to what memory allows (``FakeHost.hugepage_limit``)
and reads back the number granted; ``free_hugepages`` and ``/proc/sys/vm/nr_hugepages``
follow."""

from __future__ import annotations

import re

from musku.hostfs import HUGEPAGES_DIR, PROC_NR_HUGEPAGES
from musku.testing.fakehost import FakeKernelFS, KernelRule, einval


def pool(kernel: FakeKernelFS, path: str, text: str, match: re.Match[str]) -> None:
    kb = int(match.group(1)) if match.group(1) else 2048
    if not text.isdigit():
        raise einval(path)
    granted = min(int(text), kernel.fake.hugepage_limit.get(kb, 1 << 62))
    d = f"{HUGEPAGES_DIR}/hugepages-{kb}kB"
    kernel.store(d + "/nr_hugepages", f"{granted}\n")
    kernel.store(d + "/free_hugepages", f"{granted}\n")
    if kb == 2048 and kernel.exists(PROC_NR_HUGEPAGES):
        kernel.store(PROC_NR_HUGEPAGES, f"{granted}\n")


RULES = (
    KernelRule(
        re.escape(HUGEPAGES_DIR) + r"/hugepages-(\d+)kB/nr_hugepages"
        "|" + re.escape(PROC_NR_HUGEPAGES),
        pool,
        "huge page pool",
    ),
)
