"""scripts/test runs pytest on two xdist workers (``--dist loadgroup``) and relies on
tests/conftest.py's groups: a module's tests on one worker, every real-kernel (``root``) test on
one worker, one at a time. A group that silently stops working (pytest 9.2 moved the node id
xdist 3.8 appends the group to) lets two real THP comparisons run at once; this runs three
tests on two workers and checks each one's group and worker."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import real_kernel_groups
from tests.timing import scaled

ROOT = Path(__file__).resolve().parents[1]
pytest.importorskip("xdist")


def _run(tests: list[str], workers: int, env: dict[str, str] | None = None) -> dict[str, str]:
    """Run ``tests`` under ``-n workers --dist loadgroup -v``: {node id with its group: worker},
    in the order the tests finished."""
    argv = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-n", str(workers)]
    argv += ["--dist", "loadgroup", "-v", "-o", "addopts=", *tests]
    base = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_")}
    r = subprocess.run(
        argv, capture_output=True, text=True, cwd=ROOT, env={**base, **(env or {})},
        timeout=scaled(180),
    )  # fmt: skip
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    return dict(
        (m.group(2), m.group(1))
        for m in re.finditer(r"\[(gw\d)\] \[[ \d%]+\] (?:PASSED|SKIPPED) (\S+)", r.stdout)
    )


def test_modules_and_real_kernel_tests_each_stay_on_one_worker() -> None:
    tests = [
        "tests/sim/test_pair.py::test_registered_backend_and_interface",
        "tests/sim/test_pair.py::test_seeded_and_reproducible",
        "tests/hosts/test_local.py::test_bad_options",  # a real-kernel module: skipped or run
        "tests/knobs/test_real_host.py::test_real_thp",
        "tests/knobs/test_real_host.py::test_real_cpu_hotplug",
        "tests/knobs/test_real_host.py::test_real_swappiness_from_the_vm_catalog",
    ]
    ran = _run(tests, 2)
    module = "tests/sim/test_pair.py"
    # test_local's THP A/B touches THP, huge pages and the CPUs it measures on: one group with
    # the knobs' THP and CPU hotplug tests; swappiness another
    real = "real-cpus-hugepages-thp"
    assert set(ran) == {
        f"{tests[0]}@{module}",
        f"{tests[1]}@{module}",
        f"{tests[2]}@{real}",
        f"{tests[3]}@{real}",
        f"{tests[4]}@{real}",
        f"{tests[5]}@real-swappiness",
    }, ran
    assert ran[f"{tests[0]}@{module}"] == ran[f"{tests[1]}@{module}"], ran
    assert len({ran[f"{t}@{real}"] for t in tests[2:5]}) == 1, ran


def test_the_heaviest_group_is_handed_out_first(tmp_path: Path) -> None:
    """The schedule's order is the groups' weights (tests/durations.json), not xdist's default
    (most tests first) nor the collection's: here the one-test module, collected last and made
    the heaviest by the table, runs first on the single worker, then the module of three."""
    light = [
        f"tests/sim/test_pair.py::test_ar1_autocorrelation_at_the_configured_phi[{p}]"
        for p in ("0.5", "0.7")
    ]
    light.append("tests/sim/test_pair.py::test_seeded_and_reproducible")
    heavy = "tests/test_architecture.py::test_the_cycle_finder_finds_a_cycle"
    table = tmp_path / "durations.json"
    table.write_text(json.dumps({"default_s": 1.0, "seconds": {heavy: 500.0}}))
    ran = list(_run([*light, heavy], 1, {"MUSKU_TEST_DURATIONS": str(table)}))
    assert [n.split("@", 1)[0] for n in ran] == [heavy, *light], ran


def test_real_kernel_groups_join_tests_that_share_an_interface() -> None:
    groups = real_kernel_groups(
        {
            "a": ("thp",),
            "b": ("hugepages", "thp"),
            "c": ("hugepages",),
            "d": ("cpus",),
            "e": ("cpus",),
            "f": ("swappiness",),
        }
    )
    assert groups == {
        "a": "real-hugepages-thp",
        "b": "real-hugepages-thp",
        "c": "real-hugepages-thp",
        "d": "real-cpus",
        "e": "real-cpus",
        "f": "real-swappiness",
    }
    # a bare ``root`` may touch anything: every real-kernel test in one group
    assert set(real_kernel_groups({"a": ("thp",), "d": ("cpus",), "x": ()}).values()) == {
        "real-kernel"
    }
    assert real_kernel_groups({}) == {}
