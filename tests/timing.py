"""Deadlines that scale with a slow (busy, shared, tiny) machine.

A test that waits for something real (a process, a sampler, the kernel) states how long that
takes on an idle machine and waits :func:`scaled` of it: the seconds times :func:`slowdown`.
The factor is ``MUSKU_TEST_SLOWDOWN`` when set (CI on a known-slow runner), else this
machine's run-queue pressure right now, the 1-minute load average per CPU (at load 20 on 2 CPUs
a runnable process gets about a tenth of a CPU: 10x). It only ever lengthens deadlines: a test
never passes *because* the machine is slow, it just waits long enough for a correct result.

Use it for deadlines and readiness polls, never to loosen what a test measures.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable

MAX_SLOWDOWN = 30.0


def slowdown() -> float:
    """How many times slower than an idle machine to allow for (>= 1)."""
    env = os.environ.get("MUSKU_TEST_SLOWDOWN", "").strip()
    if env:
        try:
            return min(MAX_SLOWDOWN, max(1.0, float(env)))
        except ValueError:
            raise ValueError(f"MUSKU_TEST_SLOWDOWN must be a number, not {env!r}") from None
    try:
        load = os.getloadavg()[0]
    except OSError:
        return 1.0
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return min(MAX_SLOWDOWN, max(1.0, load / max(1, cpus or 1)))


def scaled(seconds: float) -> float:
    """``seconds`` on an idle machine, as a deadline on this one now."""
    return seconds * slowdown()


def wait_for(
    predicate: Callable[[], object], seconds: float, *, poll: float = 0.01, what: str = ""
) -> object:
    """Poll ``predicate`` until it returns something truthy (returned) or ``scaled(seconds)``
    pass (AssertionError naming ``what``)."""
    deadline = time.monotonic() + scaled(seconds)
    while True:
        got = predicate()
        if got:
            return got
        if time.monotonic() >= deadline:
            raise AssertionError(f"timed out after {scaled(seconds):.1f} s waiting for {what}")
        time.sleep(poll)
