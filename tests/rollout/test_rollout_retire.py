"""`musku sku retire DEPLOYMENT` (issue 32 item 3) on a simulated fleet: a deployed soft SKU's
deployment ended as planned, its hosts back at production and free, the row `retired` (not
`rolled_back`: a retirement says nothing against the soft SKU); one line and exit 3 for an
unknown, ended, still rolling or held deployment, nothing changed; the revision that lets the
status be `retired` keeps the rows it carries over."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path

import pytest
from sqlalchemy import create_engine, text, update

from musku.domain import DeploymentStatus
from musku.errors import HostError, InputError
from musku.experiment import Experiment
from musku.rollout import deploy_sku, retire_deployment, rollback_deployment, watch_round
from musku.rollout.deploy import fleet_state
from musku.sim.backend import SimFleet
from musku.storage import convert, open_store
from musku.storage.migrate import alembic_config
from musku.storage.models import ExperimentRow
from musku.storage.store import Store
from tests.cli.test_exit_codes import musku, one_error_line
from tests.rollout.test_rollout import GOOD, _experiment, _sku


@pytest.fixture
def store(tmp_path: Path) -> Iterator[Store]:
    s = open_store(f"sqlite:///{tmp_path / 'results.db'}")
    yield s
    s.close()


def test_retire_puts_the_hosts_back_and_frees_them(tmp_path: Path, store: Store) -> None:
    exp = _experiment(tmp_path, n=6)
    sku_id = _sku(store, exp, GOOD)
    hosts = ["sim-000", "sim-001", "sim-002"]
    rep = deploy_sku(store, exp, sku_id, hosts, canary_time_s=4 * 3600, wave_size=2)
    assert rep.status is DeploymentStatus.DEPLOYED
    assert set(fleet_state(store, "sim")) == set(hosts)
    dep = retire_deployment(store, rep.deployment_id, reason="superseded by a newer sweep")
    assert dep.status is DeploymentStatus.RETIRED
    assert dep.reason.startswith("retired by an operator (musku sku retire, controller ")
    assert dep.reason.endswith("): superseded by a newer sweep")
    assert dep.finished_at is not None
    # no host is recorded as running it any more: every wave retired, the fleet at production
    assert dep.applied_hosts() == () and fleet_state(store, "sim") == {}
    assert {w["state"] for w in dep.waves} == {"retired"}
    with pytest.raises(InputError) as info:  # not watched any more
        watch_round(store, exp, force=True)
    assert "no deployed soft SKU of toy" in info.value.one_line()
    again = deploy_sku(store, exp, sku_id, hosts[:2], canary_time_s=4 * 3600)
    assert again.status is DeploymentStatus.DEPLOYED  # the hosts are free
    for end in (retire_deployment, rollback_deployment):
        with pytest.raises(InputError) as info:
            end(store, rep.deployment_id)
        assert f"deployment {rep.deployment_id} is retired already" in info.value.one_line()


def test_a_rollout_under_way_is_not_retired(tmp_path: Path, store: Store) -> None:
    exp = _experiment(tmp_path, n=4)
    sku_id = _sku(store, exp, GOOD)
    rep = deploy_sku(store, exp, sku_id, ["sim-000"], canary_time_s=4 * 3600)
    run = store.create_experiment(exp)
    rolling = store.create_deployment(sku_id, run, backend="sim", hosts=["sim-001"],
                                      canary_hosts=["sim-001"], controller="c@h:1:ab")  # fmt: skip
    store.update_deployment(rolling, status=DeploymentStatus.ROLLING)
    before = [(d.id, d.status, d.reason, d.waves) for d in store.deployments()]
    with pytest.raises(InputError) as info:
        retire_deployment(store, rolling)
    line = info.value.one_line()
    assert f"deployment {rolling} is still rolling (controller c@h:1:ab)" in line
    assert f"`musku sku rollback {rolling}` stops a rollout" in line
    with pytest.raises(InputError) as info:
        retire_deployment(store, 999)
    assert "no deployment 999" in info.value.one_line()
    assert [(d.id, d.status, d.reason, d.waves) for d in store.deployments()] == before
    assert rep.deployment_id in {d.id for d in store.deployments(live=True)}


def test_retire_from_the_command_line(tmp_path: Path) -> None:
    exp = _experiment(tmp_path, n=4)
    url = f"sqlite:///{tmp_path / 'r.db'}"
    with open_store(url) as db:
        sku_id = _sku(db, exp, GOOD)
        rep = deploy_sku(db, exp, sku_id, ["sim-000", "sim-001"], canary_time_s=4 * 3600)
        dep = db.deployment(rep.deployment_id)
        assert dep is not None
        # another controller holds the deployment's run (a rollback under way elsewhere)
        db.claim(dep.experiment_id, "other@elsewhere:7:beef", "elsewhere", 7)
        with db.engine.begin() as conn:  # its heartbeat stays fresh however slow this machine
            conn.execute(
                update(ExperimentRow)
                .where(ExperimentRow.id == dep.experiment_id)
                .values(claim_heartbeat=convert.now() + timedelta(days=1))
            )
    env = {"MUSKU_DB": url}
    held = musku("sku", "retire", str(rep.deployment_id), env=env)
    assert held.returncode == 3
    assert "held by another controller" in one_error_line(held)
    with open_store(url) as db:
        still = db.deployment(rep.deployment_id)
        assert still is not None and still.status is DeploymentStatus.DEPLOYED
        assert still.applied_hosts() == ("sim-000", "sim-001")  # nothing changed
        db.release(dep.experiment_id, "other@elsewhere:7:beef")
    ok = musku("sku", "retire", str(rep.deployment_id), "--reason", "trial over", env=env)
    assert ok.returncode == 0, ok.stderr
    assert f"deployment {rep.deployment_id}: soft SKU {sku_id} retired on sim-000, sim-001" in (
        ok.stdout
    )
    assert ok.stdout.rstrip().endswith(": trial over)")
    listed = musku("sku", "deployments", env=env)
    assert f"deployment {rep.deployment_id}: soft SKU {sku_id} retired (retired by" in listed.stdout
    for args, words in [(["999"], "no deployment 999"), (["1"], "is retired already")]:
        proc = musku("sku", "retire", *args, env=env)
        assert proc.returncode == 3 and words in one_error_line(proc)


def test_revision_0010_carries_deployments_over_and_back(tmp_path: Path) -> None:
    from alembic import command

    url = f"sqlite:///{tmp_path / 'm.db'}"
    exp = _experiment(tmp_path, n=4)
    with open_store(url) as db:
        sku_id = _sku(db, exp, GOOD)
        rep = deploy_sku(db, exp, sku_id, ["sim-000"], canary_time_s=4 * 3600)
        retire_deployment(db, rep.deployment_id)
    engine = create_engine(url)
    try:
        with engine.begin() as conn:
            command.downgrade(alembic_config(conn), "0009")
        with engine.begin() as conn:  # 0009 knows no `retired`: the row reads rolled_back
            assert conn.execute(text("SELECT status FROM deployments")).scalars().all() == [
                "rolled_back"
            ]
            with pytest.raises(Exception, match="CHECK constraint failed"):
                conn.execute(text("UPDATE deployments SET status = 'retired'"))
        with engine.begin() as conn:
            command.upgrade(alembic_config(conn), "head")
        with engine.begin() as conn:
            conn.execute(text("UPDATE deployments SET status = 'retired'"))
            with pytest.raises(Exception, match="CHECK constraint failed"):
                conn.execute(text("UPDATE deployments SET status = 'gone'"))
    finally:
        engine.dispose()
    with open_store(url) as db:
        (dep,) = db.deployments()
        assert dep.status is DeploymentStatus.RETIRED and dep.hosts == ("sim-000",)


class StuckFleet(SimFleet):
    """A fleet whose host sim-001 cannot be put back (an agent that refuses the undeploy)."""

    def undeploy(self, name: str, owner: str) -> None:
        if name == "sim-001":
            raise HostError("rollback refused: lease held")
        super().undeploy(name, owner)


def test_a_host_that_cannot_be_put_back_leaves_failed_not_retired(
    tmp_path: Path, store: Store
) -> None:
    exp = _experiment(tmp_path, n=6)
    sku_id = _sku(store, exp, GOOD)
    rep = deploy_sku(store, exp, sku_id, ["sim-000", "sim-001", "sim-002"],
                     canary_time_s=4 * 3600)  # fmt: skip
    fleets: list[SimFleet] = []

    def opener(experiment: Experiment, *, seed: int, state: dict, code_version: object) -> SimFleet:  # type: ignore[type-arg]
        fleets.append(StuckFleet(experiment, seed, state))
        return fleets[-1]

    with pytest.raises(HostError) as info:
        retire_deployment(store, rep.deployment_id, fleet_opener=opener)
    assert "not put back: sim-001: rollback refused: lease held" in info.value.one_line()
    dep = store.deployment(rep.deployment_id)
    assert dep is not None and dep.status is DeploymentStatus.FAILED  # never "retired"
    fleet = fleets[0]
    # the others were put back (newest first), the stuck one named in the row
    assert (
        fleet.deployed("sim-000") == fleet.baseline and fleet.deployed("sim-002") == fleet.baseline
    )
    assert "sim-001" in dep.reason
