"""scripts/test runs pytest on two xdist workers (``--dist loadgroup``) and relies on
tests/conftest.py's groups: a module's tests on one worker, every real-kernel (``root``) test on
one worker, one at a time. A group that silently stops working (pytest 9.2 moved the node id
xdist 3.8 appends the group to) lets two real THP comparisons run at once; this runs three
tests on two workers and checks each one's group and worker."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.timing import scaled

ROOT = Path(__file__).resolve().parents[1]
pytest.importorskip("xdist")


def test_modules_and_real_kernel_tests_each_stay_on_one_worker() -> None:
    tests = [
        "tests/sim/test_pair.py::test_registered_backend_and_interface",
        "tests/sim/test_pair.py::test_seeded_and_reproducible",
        "tests/hosts/test_local.py::test_bad_options",  # a real-kernel module: skipped or run
    ]
    argv = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-n", "2"]
    argv += ["--dist", "loadgroup", "-v", "-o", "addopts=", *tests]
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_")}
    r = subprocess.run(argv, capture_output=True, text=True, cwd=ROOT, env=env, timeout=scaled(180))
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    ran = dict(
        (m.group(2), m.group(1))
        for m in re.finditer(r"\[(gw\d)\] \[[ \d%]+\] (?:PASSED|SKIPPED) (\S+)", r.stdout)
    )
    module = "tests/sim/test_pair.py"
    assert set(ran) == {
        f"{tests[0]}@{module}",
        f"{tests[1]}@{module}",
        f"{tests[2]}@real-kernel",
    }, r.stdout[-2000:]
    assert ran[f"{tests[0]}@{module}"] == ran[f"{tests[1]}@{module}"], ran
