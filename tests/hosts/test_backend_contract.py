"""Every built-in host backend passes the backend contract (musku/testing/backend.py): sim
(one pair and a fleet), qsim, local and agent (one pair and a pool). The hosts of qsim, local
and agent are not opened here (a built engine, this machine's workload and agent, real agent
daemons): their pairs pass HostPairContract in tests/hosts/test_hostpair_contract.py and
tests/qsim; their registration, options, planning, dry-run check and refusals are checked
here."""

from __future__ import annotations

from pathlib import Path

import pytest

from musku.experiment import Experiment, load_experiment
from musku.registry import BACKENDS
from musku.testing.backend import BackendContract

ROOT = Path(__file__).resolve().parents[2]
SIM = '[hosts]\nbackend = "sim"\nmodel = "sim/web-skylake18.toml"'


def _agents(tmp_path: Path, n: int) -> Experiment:
    hosts = ", ".join(f'{{ name = "h{i}", socket = "{tmp_path}/h{i}.sock" }}' for i in range(n))
    text = (ROOT / "experiments" / "web-skylake.toml").read_text()
    assert SIM in text
    path = tmp_path / "agents.toml"
    path.write_text(text.replace(SIM, f'[hosts]\nbackend = "agent"\nhosts = [{hosts}]'))
    return load_experiment(path)


class TestSim(BackendContract):
    name = "sim"

    @pytest.fixture
    def experiment(self) -> Experiment:
        return load_experiment(ROOT / "experiments" / "web-skylake.toml")


class TestSimFleet(BackendContract):
    name = "sim"

    @pytest.fixture
    def experiment(self) -> Experiment:
        return load_experiment(ROOT / "experiments" / "web-skylake-fleet16.toml")


class TestQsim(BackendContract):
    name = "qsim"
    opens = False  # the C++ engine: tests/qsim/test_hosts.py

    @pytest.fixture
    def experiment(self) -> Experiment:
        return load_experiment(ROOT / "experiments" / "qsim" / "2tier-freq.toml")


class TestLocal(BackendContract):
    name = "local"
    opens = False  # starts this machine's workload and agent: tests/hosts/test_local.py

    @pytest.fixture
    def experiment(self) -> Experiment:
        return load_experiment(ROOT / "experiments" / "local-vm.toml")


class TestAgent(BackendContract):
    name = "agent"
    opens = False  # real agent daemons: tests/hosts/test_hostpair_contract.py

    @pytest.fixture
    def experiment(self, tmp_path: Path) -> Experiment:
        return _agents(tmp_path, 2)


class TestAgentPool(TestAgent):
    @pytest.fixture
    def experiment(self, tmp_path: Path) -> Experiment:
        return _agents(tmp_path, 5)


def test_every_registered_backend_runs_the_contract() -> None:
    """A backend added to the registry gets a contract class here (docs/architecture.md)."""

    def classes(cls: type) -> list[type]:
        return [cls, *(c for sub in cls.__subclasses__() for c in classes(sub))]

    here = [c for c in classes(BackendContract) if c.__module__ == __name__]
    assert set(BACKENDS.names()) <= {c.name for c in here}
