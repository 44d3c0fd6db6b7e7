"""Issue 32's rollout items on a simulated fleet: `musku sku watch` across the experiment files
of one service (it crashed on deployments outside the watched file's hosts: `'sim-000' is not
in list`), a deploy that would leave no production host refused up front, refusals that write
no run, and `musku sku rollback DEPLOYMENT` (one line and exit 3 for an unknown, ended or
held deployment)."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path

import pytest
from sqlalchemy import update

from musku.domain import DeploymentStatus
from musku.errors import InputError
from musku.experiment import load_experiment
from musku.rollout import deploy_sku, rollback_deployment, watch_round
from musku.rollout.deploy import fleet_state
from musku.storage import convert, open_store
from musku.storage.models import ExperimentRow
from musku.storage.store import Store
from tests.cli.test_exit_codes import musku, one_error_line
from tests.fixtures.toy import EXPERIMENT
from tests.rollout.test_rollout import GOOD, _experiment, _sku


@pytest.fixture
def store(tmp_path: Path) -> Iterator[Store]:
    s = open_store(f"sqlite:///{tmp_path / 'results.db'}")
    yield s
    s.close()


def _runs(store: Store) -> list[tuple[int, str, object]]:
    return list(store.runs_named("toy"))


def test_watch_covers_deployments_made_with_another_file(tmp_path: Path, store: Store) -> None:
    pool = _experiment(tmp_path, n=6)  # sim-000 .. sim-005
    pair_file = tmp_path / "pair.toml"  # the same service on its default pair sim-a, sim-b
    pair_file.write_text(EXPERIMENT.format(name="toy", mode="independent"))
    pair = load_experiment(pair_file)
    sku_id = _sku(store, pool, GOOD)
    rep = deploy_sku(store, pool, sku_id, ["sim-000", "sim-001"], canary_time_s=4 * 3600)
    assert rep.status is DeploymentStatus.DEPLOYED
    (res,) = watch_round(store, pair, force=True, check_time_s=4 * 3600)
    assert res.deployment_id == rep.deployment_id and res.verdict == "holds"
    (w,) = store.watches(rep.deployment_id)
    assert w.comparison_id is not None and w.verdict == "holds"


def test_a_deploy_leaving_no_production_host_is_refused(tmp_path: Path, store: Store) -> None:
    exp = _experiment(tmp_path, n=4)
    sku_id = _sku(store, exp, GOOD)
    before = _runs(store)
    with pytest.raises(InputError) as info:
        deploy_sku(store, exp, sku_id, ["sim-000", "sim-001", "sim-002", "sim-003"])
    assert "no production hosts left after this deployment" in info.value.one_line()
    assert store.deployments() == [] and _runs(store) == before  # nothing written


def test_watch_refusals_write_no_run(tmp_path: Path, store: Store) -> None:
    exp = _experiment(tmp_path, n=4)
    sku_id = _sku(store, exp, GOOD)
    before = _runs(store)
    with pytest.raises(InputError) as info:
        watch_round(store, exp, force=True)
    assert "no deployed soft SKU of toy" in info.value.one_line()
    assert watch_round(store, exp) == []  # a periodic round: nothing due, no refusal
    deploy_sku(store, exp, sku_id, ["sim-000", "sim-001"], canary_time_s=4 * 3600)
    other = _sku(store, exp, GOOD)
    deploy_sku(store, exp, other, ["sim-002"], canary_time_s=4 * 3600)  # sim-003 left
    runs = _runs(store)
    assert [m for _, m, _ in runs].count("deploy") == 2
    assert "watch" not in [m for _, m, _ in runs]  # the refusal wrote no run
    assert not [st for _, _, st in runs if st.value == "failed"]
    assert len(runs) == len(before) + 3  # the second SKU's run and two deploy runs


def test_rollback_frees_the_hosts(tmp_path: Path, store: Store) -> None:
    exp = _experiment(tmp_path, n=6)
    sku_id = _sku(store, exp, GOOD)
    hosts = ["sim-000", "sim-001", "sim-002"]
    rep = deploy_sku(store, exp, sku_id, hosts, canary_time_s=4 * 3600)
    assert set(fleet_state(store, "sim")) == set(hosts)
    with pytest.raises(InputError) as info:  # the hosts are taken
        deploy_sku(store, exp, sku_id, hosts[:1])
    assert f"live deployment {rep.deployment_id}" in info.value.one_line()
    dep = rollback_deployment(store, rep.deployment_id)
    assert dep.status is DeploymentStatus.ROLLED_BACK and "operator" in dep.reason
    assert dep.applied_hosts() == () and fleet_state(store, "sim") == {}
    again = deploy_sku(store, exp, sku_id, hosts[:2], canary_time_s=4 * 3600)
    assert again.status is DeploymentStatus.DEPLOYED
    with pytest.raises(InputError) as info:
        rollback_deployment(store, rep.deployment_id)
    assert "is rolled_back already" in info.value.one_line()


def test_rollback_from_the_command_line(tmp_path: Path) -> None:
    exp = _experiment(tmp_path, n=4)
    url = f"sqlite:///{tmp_path / 'r.db'}"
    with open_store(url) as db:
        sku_id = _sku(db, exp, GOOD)
        rep = deploy_sku(db, exp, sku_id, ["sim-000"], canary_time_s=4 * 3600)
        # another controller holds the deployment's run (a live heartbeat)
        dep = db.deployment(rep.deployment_id)
        assert dep is not None
        db.claim(dep.experiment_id, "other@elsewhere:7:beef", "elsewhere", 7)
        with db.engine.begin() as conn:  # its heartbeat stays fresh however slow this machine
            conn.execute(
                update(ExperimentRow)
                .where(ExperimentRow.id == dep.experiment_id)
                .values(claim_heartbeat=convert.now() + timedelta(days=1))
            )
    env = {"MUSKU_DB": url}
    held = musku("sku", "rollback", str(rep.deployment_id), env=env)
    assert held.returncode == 3
    assert "held by another controller" in one_error_line(held)
    with open_store(url) as db:
        db.release(dep.experiment_id, "other@elsewhere:7:beef")
        again = db.deployment(rep.deployment_id)
        assert again is not None and again.status is DeploymentStatus.DEPLOYED
    ok = musku("sku", "rollback", str(rep.deployment_id), env=env)
    assert ok.returncode == 0, ok.stderr
    assert f"deployment {rep.deployment_id}: soft SKU {sku_id} rolled_back" in ok.stdout
    for args, words in [
        (["999"], "no deployment 999"),
        ([str(rep.deployment_id)], "rolled_back already"),
    ]:
        proc = musku("sku", "rollback", *args, env=env)
        assert proc.returncode == 3 and words in one_error_line(proc)
    watch = musku("sku", "watch", str(exp.path), "--once", env=env)
    assert watch.returncode == 3 and "no deployed soft SKU" in one_error_line(watch)
