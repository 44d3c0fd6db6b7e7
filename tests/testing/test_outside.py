"""The contract suites run from outside musku's repository, as docs/testing.md shows: a test
folder of its own (its own rootdir, no musku test helpers importable), pytest in a subprocess."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import musku

ROOT = Path(__file__).resolve().parents[2]

CONFTEST = 'pytest_plugins = ["musku.testing.postgres"]\n'

TESTS = """
import pytest

from musku.domain import Configuration
from musku.testing.fakehost import vm_host
from musku.testing.hostpair import HostPairContract
from musku.testing.knobs import KnobCase, KnobContract
from musku.testing.storage import StorageContract


class TestThp(KnobContract):
    @pytest.fixture
    def case(self, tmp_path):
        return KnobCase("thp", vm_host(tmp_path / "host"), target="never", other="always")


class TestSQLite(StorageContract):
    @pytest.fixture
    def db_url(self, tmp_path):
        return f"sqlite:///{tmp_path / 'results.db'}"


class TestSim(HostPairContract):
    backend, window_s = "sim", 60.0

    @pytest.fixture
    def pair(self):
        from musku.experiment import load_experiment
        from musku.sim import open_pair

        with open_pair(load_experiment(EXPERIMENT), seed=1) as p:
            yield p

    @pytest.fixture
    def target(self, pair):
        return (Configuration.of(thp="never"), Configuration.of(thp="always"))

    @pytest.fixture
    def failing(self, pair):
        return (Configuration.of(thp="never"), Configuration.of(shp=50))
"""


def test_suites_run_from_outside(tmp_path: Path) -> None:
    (tmp_path / "conftest.py").write_text(CONFTEST)
    experiment = ROOT / "experiments" / "web-skylake.toml"
    (tmp_path / "test_mine.py").write_text(f"EXPERIMENT = {str(experiment)!r}\n" + TESTS)
    (tmp_path / "pytest.ini").write_text("[pytest]\nfilterwarnings = error\n")
    env = {**os.environ, "PYTHONPATH": str(Path(musku.__file__).parents[1])}
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-v", "-p", "no:cacheprovider", str(tmp_path)],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-3000:]
    # every suite ran, each check passed (none skipped)
    for suite in ("TestThp", "TestSQLite", "TestSim"):
        assert f"test_mine.py::{suite}::test_" in out, suite
    assert " SKIPPED" not in out and " PASSED" in out, out[-1000:]
