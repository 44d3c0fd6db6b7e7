"""scripts/test runs pytest on two xdist workers (``--dist loadgroup``) and relies on
tests/conftest.py's groups: a module's tests on one worker, every real-kernel (``root``) test on
one worker, one at a time, per group of kernel interfaces; the heaviest groups first. A group
that silently stops working (pytest 9.2 moved the node id xdist 3.8 appends the group to) lets
two real THP comparisons run at once; this runs seven tests on two workers and checks each
one's group and worker, and the order the groups are handed out."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

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


def test_groups_stay_on_one_worker_and_the_heaviest_goes_first(tmp_path: Path) -> None:
    """One run, four groups: a module of two tests, the real-kernel group of three, the
    swappiness group, and a one-test module the weights table (tests/durations.json's form)
    makes the heaviest. Each group's tests run on one worker; the heavy one, collected last,
    is handed out first, so it is the first test its worker runs. xdist's default order (the
    most tests first) hands it out last, when a worker has run a test of another group."""
    heavy = "tests/test_architecture.py::test_the_cycle_finder_finds_a_cycle"
    tests = [
        "tests/sim/test_pair.py::test_registered_backend_and_interface",
        "tests/sim/test_pair.py::test_seeded_and_reproducible",
        "tests/hosts/test_local.py::test_bad_options",  # a real-kernel module: skipped or run
        "tests/knobs/test_real_host.py::test_real_thp",
        "tests/knobs/test_real_host.py::test_real_cpu_hotplug",
        "tests/knobs/test_real_host.py::test_real_swappiness_from_the_vm_catalog",
        heavy,
    ]
    table = tmp_path / "durations.json"
    table.write_text(json.dumps({"default_s": 1.0, "seconds": {heavy: 500.0}}))
    ran = _run(tests, 2, {"MUSKU_TEST_DURATIONS": str(table)})
    module = "tests/sim/test_pair.py"
    # test_local's THP A/B touches THP, huge pages and the CPUs it measures on: one group with
    # the knobs' THP and CPU hotplug tests; swappiness another
    real = "real-cpus-hugepages-thp"
    assert list(ran) and set(ran) == {
        f"{tests[0]}@{module}",
        f"{tests[1]}@{module}",
        f"{tests[2]}@{real}",
        f"{tests[3]}@{real}",
        f"{tests[4]}@{real}",
        f"{tests[5]}@real-swappiness",
        f"{heavy}@tests/test_architecture.py",
    }, ran
    assert ran[f"{tests[0]}@{module}"] == ran[f"{tests[1]}@{module}"], ran
    assert len({ran[f"{t}@{real}"] for t in tests[2:5]}) == 1, ran
    worker = ran[f"{heavy}@tests/test_architecture.py"]
    first = next(n for n, w in ran.items() if w == worker)
    assert first == f"{heavy}@tests/test_architecture.py", ran


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


@given(
    st.dictionaries(
        st.text("abcdefgh", min_size=1, max_size=3),
        st.lists(st.sampled_from(["thp", "hugepages", "cpus", "swappiness", "msr", "resctrl"]),
                 min_size=1, max_size=3, unique=True).map(tuple),
        max_size=12,
    )
)  # fmt: skip
def test_real_kernel_groups_never_split_a_shared_interface(
    touched: dict[str, tuple[str, ...]],
) -> None:
    """Two tests that touch one interface are in one group; two groups share no interface;
    a group is named after exactly the interfaces its tests touch."""
    groups = real_kernel_groups(touched)
    assert set(groups) == set(touched)
    for a in touched:
        for b in touched:
            if set(touched[a]) & set(touched[b]):
                assert groups[a] == groups[b], (a, b, groups)
    for group in set(groups.values()):
        used = {i for t, g in groups.items() if g == group for i in touched[t]}
        assert group == "real-" + "-".join(sorted(used)), (group, used)
    names = {
        g: {i for t, h in groups.items() if h == g for i in touched[t]} for g in groups.values()
    }
    for g, used in names.items():
        for h, other in names.items():
            assert g == h or not used & other, (g, h)
