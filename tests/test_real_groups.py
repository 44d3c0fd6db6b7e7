"""The real-kernel groups (tests/conftest.py ``real_kernel_groups``) run at once without
colliding: the knobs' real tests and the agent's real THP test, each repeated
(``tests/fixtures/repeat.py``), under ``-n 2 --dist loadgroup``, several rounds. Four groups
here (``real-thp``, ``real-hugepages``, ``real-cpus``, ``real-swappiness``: without the THP
A/Bs of test_local, which join them, these tests share no interface), two at a time, one on
each worker; every test must pass in every round, and the rounds must have run two groups at
once (tests of two groups finished on different workers, interleaved).

It changes THP, huge pages, CPU hotplug, cpusets and swappiness (each test restores them), for
about a minute a round: run it alone, ``MUSKU_TEST_REAL_GROUPS=1 pytest
tests/test_real_groups.py`` as root (skipped otherwise, and in the suite's run: there it
would run beside the suite's own real-kernel groups)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.timing import scaled

ROOT = Path(__file__).resolve().parents[1]
ROUNDS = 3
REPEAT = 10
TESTS = ["tests/knobs/test_real_host.py", "tests/agent/test_real_thp.py"]
GROUPS = {"real-thp", "real-hugepages", "real-cpus", "real-swappiness"}

if os.environ.get("MUSKU_TEST_REAL_GROUPS") == "1":
    pytestmark = [
        pytest.mark.root("thp", "hugepages", "cpus", "swappiness"),
        pytest.mark.slow,
        pytest.mark.skipif(os.geteuid() != 0, reason="needs root"),
        pytest.mark.timeout(1800),
    ]
else:
    pytestmark = [pytest.mark.skip(reason="run alone: MUSKU_TEST_REAL_GROUPS=1 (docs/testing.md)")]


def test_real_kernel_groups_run_two_at_once_and_every_test_passes() -> None:
    pytest.importorskip("xdist")
    argv = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-p", "tests.fixtures.repeat"]
    argv += ["-n", "2", "--dist", "loadgroup", "-v", "-o", "addopts=", *TESTS]
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTEST_", "MUSKU_TEST_"))}
    env["MUSKU_TEST_REPEAT"] = str(REPEAT)
    for round_ in range(ROUNDS):
        r = subprocess.run(
            argv, capture_output=True, text=True, cwd=ROOT, env=env, timeout=scaled(600)
        )
        assert r.returncode == 0, f"round {round_}: " + r.stdout[-3000:] + r.stderr[-2000:]
        ran = [
            (m.group(1), m.group(2), m.group(3))
            for m in re.finditer(r"\[(gw\d)\] \[[ \d%]+\] (PASSED|SKIPPED) \S+@(\S+)", r.stdout)
        ]
        assert {g for _, _, g in ran} == GROUPS, ran
        assert all(status == "PASSED" for _, status, _ in ran), r.stdout[-3000:]
        assert len(ran) == REPEAT * 7, len(ran)  # 6 knob tests, 1 agent test
        # two groups at once: somewhere a test of one group finished between two of another's
        # on the other worker
        by_worker = [(w, g) for w, _, g in ran]
        switches = sum(1 for a, b in zip(by_worker, by_worker[1:], strict=False) if a[0] != b[0])
        assert switches >= 2, by_worker
        print(f"round {round_}: {len(ran)} tests, {switches} switches between the workers")
