"""The independent sweep as multi-arm scans on a simulated fleet (musku.design.fleet)."""

from __future__ import annotations

from pathlib import Path

import pytest

from musku.design.fleet import multiarm_sweep
from musku.domain import Configuration, Decision
from musku.errors import InputError
from musku.experiment import load_experiment
from tests.fixtures.toy import EXPERIMENT, MODEL


@pytest.fixture
def toy(tmp_path: Path):  # type: ignore[no-untyped-def]
    (tmp_path / "toy-model.toml").write_text(MODEL)
    path = tmp_path / "toy.toml"
    path.write_text(EXPERIMENT.format(name="toy", mode="independent"))
    return load_experiment(path)


def test_groups_run_side_by_side_and_find_the_best_settings(toy) -> None:  # type: ignore[no-untyped-def]
    big = multiarm_sweep(toy, 10, seed=1)
    # the toy's per-knob best settings (thp and shp help, core_count 2 is the baseline)
    assert big.best == toy.production.merged(Configuration.of(thp="always", shp=128))
    assert all(r.decision is Decision.BETTER for r in big.validation)
    # 10 hosts hold every knob's group (2 + 3 + 5 arms) at once: the clock is the longest
    # knob plus validation, less than the knobs' times summed
    longest = max(k.time_s for k in big.knobs)
    total = sum(k.time_s for k in big.knobs)
    assert all(k.start_s == 0.0 for k in big.knobs)
    assert longest < big.clock_s < total + (big.clock_s - longest) + 1e-9
    # with 3 hosts the shp scan (4 settings) runs in chunks and the knobs queue for hosts
    small = multiarm_sweep(toy, 3, seed=1)
    shp = next(k for k in small.knobs if k.knob == "shp")
    assert shp.hosts == 3 and shp.scans >= 2
    assert any(k.start_s > 0.0 for k in small.knobs)
    assert small.clock_s > big.clock_s


def test_a_two_host_fleet_is_refused(toy) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(InputError, match=">= 3 hosts"):
        multiarm_sweep(toy, 2, seed=0)
