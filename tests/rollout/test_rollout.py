"""``musku sku deploy`` / ``watch`` on a simulated fleet (docs/rollout.md): a good soft SKU is
deployed in waves, a bad one rolled back at the canary, a gone advantage flagged by watch."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import select, update

from musku.domain import Configuration, DeploymentStatus, ExperimentStatus, SoftSku
from musku.errors import HostError, InputError, RolledBack
from musku.experiment import Experiment, load_experiment
from musku.rollout import deploy_sku, watch_round
from musku.rollout.deploy import fleet_state
from musku.rollout.fleet import open_fleet
from musku.sim.backend import SimFleet
from musku.storage import convert, open_store
from musku.storage.models import ExperimentRow
from musku.storage.store import Store
from musku.sweep.runner import NullProgress
from musku.testing.postgres import fresh_pg_database, pg_server  # noqa: F401 - fixtures
from tests.fixtures.toy import EXPERIMENT, MODEL
from tests.timing import scaled

GOOD = Configuration.of(thp="always", shp=256)  # the toy model's +6.6 %
BAD = Configuration.of(core_count=1)  # 0.55x throughput


def _experiment(tmp_path: Path, n: int = 6, model: str = MODEL) -> Experiment:
    (tmp_path / "toy-model.toml").write_text(model)
    path = tmp_path / "toy.toml"
    path.write_text(
        EXPERIMENT.format(name="toy", mode="independent").replace(
            "[hosts]\n", f"[hosts]\nfleet = {n}\n"
        )
    )
    return load_experiment(path)


def _sku(store: Store, exp: Experiment, config: Configuration) -> int:
    exp_id = store.create_experiment(exp)
    return store.save_softsku(
        exp_id, SoftSku(service=exp.service.name, platform=exp.platform.name, configuration=config)
    )


@pytest.fixture
def store(tmp_path: Path) -> Iterator[Store]:
    s = open_store(f"sqlite:///{tmp_path / 'results.db'}")
    yield s
    s.close()


HOSTS = ["sim-000", "sim-001", "sim-002", "sim-003", "sim-004"]


def test_good_sku_deployed_in_waves(tmp_path: Path, store: Store) -> None:
    exp = _experiment(tmp_path)
    sku_id = _sku(store, exp, GOOD)
    rep = deploy_sku(store, exp, sku_id, HOSTS, canary=1, canary_time_s=4 * 3600, wave_size=2)
    assert rep.status is DeploymentStatus.DEPLOYED
    assert rep.canary[0]["decision"] == "better" and rep.canary[0]["production"] == "sim-005"
    assert rep.waves == [["sim-001", "sim-002"], ["sim-003", "sim-004"]]
    dep = store.deployment(rep.deployment_id)
    assert dep is not None and dep.status is DeploymentStatus.DEPLOYED
    assert dep.hosts == tuple(HOSTS) and dep.canary_hosts == ("sim-000",)
    assert dep.applied_hosts() == tuple(HOSTS) and dep.finished_at is not None
    assert dep.canary_comparison_id == rep.canary[0]["comparison_id"]
    assert dep.code_version is not None and dep.code_version.startswith("sim:toy@")
    comps = store.comparisons(dep.experiment_id)
    assert [c.purpose for c in comps] == ["deploy:canary:sim-000"]
    assert comps[0].hosts == ("sim-005", "sim-000")
    assert store.experiment(dep.experiment_id).mode == "deploy"
    # what the hosts run now, as the next process sees them
    state = fleet_state(store, "sim")
    assert set(state) == set(HOSTS) and all(c == GOOD for c in state.values())


def test_bad_sku_rolled_back_at_the_canary(tmp_path: Path, store: Store) -> None:
    exp = _experiment(tmp_path)
    sku_id = _sku(store, exp, BAD)
    with pytest.raises(RolledBack) as info:
        deploy_sku(store, exp, sku_id, HOSTS, canary=1, canary_time_s=4 * 3600, wave_size=2)
    assert "canary sim-000" in info.value.one_line() and "rolled back" in info.value.one_line()
    (dep,) = store.deployments()
    assert dep.status is DeploymentStatus.ROLLED_BACK and dep.reason
    assert dep.applied_hosts() == ()  # no host runs it
    assert dep.waves[0]["decision"] in ("worse", "guardrail")
    assert dep.canary_comparison_id is not None
    assert fleet_state(store, "sim") == {}  # every host back at baseline
    assert store.deployments(live=True) == []
    # the hosts are free for another deployment
    good = _sku(store, exp, GOOD)
    rep = deploy_sku(store, exp, good, HOSTS[:2], canary=1, canary_time_s=4 * 3600)
    assert rep.status is DeploymentStatus.DEPLOYED


class FailingFleet(SimFleet):
    """A fleet whose host sim-003 refuses a deploy (an agent that fails to apply)."""

    def deploy(self, name: str, config: Configuration, owner: str) -> None:
        if name == "sim-003":
            raise HostError("apply failed: thp write refused")
        super().deploy(name, config, owner)


def test_a_failing_wave_rolls_every_host_back(tmp_path: Path, store: Store) -> None:
    exp = _experiment(tmp_path)
    sku_id = _sku(store, exp, GOOD)
    fleets: list[SimFleet] = []

    def opener(experiment: Experiment, *, seed: int, state: dict, code_version: object) -> SimFleet:
        fleets.append(FailingFleet(experiment, seed, state))
        return fleets[-1]

    with pytest.raises(HostError) as info:
        deploy_sku(store, exp, sku_id, HOSTS, canary=1, canary_time_s=4 * 3600, wave_size=2,
                   fleet_opener=opener)  # fmt: skip
    assert "wave 2: sim-003: deploy failed" in info.value.one_line()
    (dep,) = store.deployments()
    assert dep.status is DeploymentStatus.ROLLED_BACK
    assert dep.applied_hosts() == ()
    assert all(fleets[0].deployed(h) == fleets[0].baseline for h in fleets[0].names)


def test_bad_requests(tmp_path: Path, store: Store) -> None:
    exp = _experiment(tmp_path, n=4)
    sku_id = _sku(store, exp, GOOD)
    cases = [
        (dict(sku_id=999, hosts=["sim-000"]), "no soft SKU with id 999"),
        (dict(sku_id=sku_id, hosts=["sim-000", "sim-001", "sim-000"]), "listed twice"),
        (dict(sku_id=sku_id, hosts=["sim-000"], canary=2), "bigger than the 1 host"),
        (dict(sku_id=sku_id, hosts=["sim-009"]), "not one of the experiment's hosts"),
        (
            dict(sku_id=sku_id, hosts=["sim-000", "sim-001", "sim-002", "sim-003"], canary=4),
            "no production hosts left",
        ),
    ]
    for kwargs, words in cases:
        with pytest.raises(InputError) as info:
            deploy_sku(store, exp, **kwargs)  # type: ignore[arg-type]
        assert words in info.value.one_line()
    assert store.deployments() == []  # nothing written
    rep = deploy_sku(store, exp, sku_id, ["sim-000", "sim-001"], canary_time_s=4 * 3600)
    assert rep.status is DeploymentStatus.DEPLOYED
    with pytest.raises(InputError) as info:
        deploy_sku(store, exp, sku_id, ["sim-001", "sim-002"])
    assert f"live deployment {rep.deployment_id}" in info.value.one_line()


def test_watch_flags_a_gone_advantage_after_a_code_push(tmp_path: Path, store: Store) -> None:
    exp = _experiment(tmp_path)
    sku_id = _sku(store, exp, GOOD)
    rep = deploy_sku(store, exp, sku_id, HOSTS[:3], canary=1, canary_time_s=4 * 3600)
    (first,) = watch_round(store, exp, force=True, check_time_s=4 * 3600)
    assert first.verdict == "holds" and not first.flagged
    # nothing pushed, checked a moment ago: nothing is due
    assert watch_round(store, exp, every_s=3600.0, check_time_s=4 * 3600) == []
    # a code push: the new build gains nothing from huge pages any more
    pushed = (
        MODEL.replace("always = 1.02", "always = 1.0")
        .replace('"256" = 1.015', '"256" = 1.0')
        .replace("throughput = 1.03", "throughput = 1.0")
    )
    (tmp_path / "toy-model.toml").write_text(pushed)
    exp = load_experiment(exp.path)
    (second,) = watch_round(store, exp, every_s=3600.0, check_time_s=4 * 3600)
    assert second.flagged and second.verdict in ("gone", "lost")
    assert second.code_version != first.code_version
    rows = store.watches(rep.deployment_id)
    assert [w.verdict for w in rows] == ["holds", second.verdict]
    assert rows[1].code_version == second.code_version and rows[1].comparison_id is not None


def test_stop_during_the_canary_rolls_back(tmp_path: Path, store: Store) -> None:
    exp = _experiment(tmp_path)
    sku_id = _sku(store, exp, GOOD)
    stop = threading.Event()
    stop.set()
    from musku.errors import Interrupted

    with pytest.raises(Interrupted):
        deploy_sku(store, exp, sku_id, HOSTS, canary_time_s=4 * 3600, stop=stop)
    (dep,) = store.deployments()
    assert dep.status is DeploymentStatus.ROLLED_BACK and dep.applied_hosts() == ()


def test_deploy_and_watch_on_postgresql(tmp_path: Path, request: pytest.FixtureRequest) -> None:
    """The same rollout on a real PostgreSQL: rows, the conflict check under its lock, watch."""
    url = fresh_pg_database(request.getfixturevalue("pg_server"))
    with open_store(url) as store:
        exp = _experiment(tmp_path)
        sku_id = _sku(store, exp, GOOD)
        rep = deploy_sku(store, exp, sku_id, HOSTS[:3], canary_time_s=4 * 3600, wave_size=2)
        assert rep.status is DeploymentStatus.DEPLOYED
        with pytest.raises(InputError):
            deploy_sku(store, exp, sku_id, ["sim-002"])
        (res,) = watch_round(store, exp, force=True, check_time_s=4 * 3600)
        assert res.verdict == "holds"
        dep = store.deployment(rep.deployment_id)
        assert dep is not None and dep.applied_hosts() == tuple(HOSTS[:3])
        assert [w.verdict for w in store.watches(dep.id)] == ["holds"]
        store.delete_experiment(dep.experiment_id)  # takes its deployment and watches along
        assert store.deployments() == []


def test_watch_loop_revalidates_after_a_push(tmp_path: Path, store: Store) -> None:
    """``musku sku watch`` without ``--once``: a forced round, then rounds that re-validate
    only what is due; a push between rounds (the model file rewritten) is due at once."""
    from musku.rollout import watch

    exp = _experiment(tmp_path)
    sku_id = _sku(store, exp, GOOD)
    deploy_sku(store, exp, sku_id, HOSTS[:2], canary_time_s=4 * 3600)
    stop = threading.Event()
    rounds: list[list[str]] = []

    def on_round(results: list) -> None:  # type: ignore[type-arg]
        rounds.append([r.verdict for r in results])
        if len(rounds) == 2:  # a quiet round: push now
            (tmp_path / "toy-model.toml").write_text(MODEL.replace("always = 1.02", "always = 0.9"))
        if len(rounds) == 3:
            stop.set()

    flagged = watch(store, exp, every_s=3600.0, poll_s=0.01, stop=stop, on_round=on_round,
                    check_time_s=4 * 3600)  # fmt: skip
    assert rounds == [["holds"], [], ["lost"]]
    assert [f.verdict for f in flagged] == ["lost"]


def _crashed_deployment(store: Store, exp: Experiment, sku_id: int, beat_age_s: float) -> int:
    """A deployment left ``rolling`` by controller ``dead@gone:1:dead``: canary sim-000 and
    wave sim-001 applied, wave sim-002 recorded as pending; its heartbeat ``beat_age_s`` old."""
    exp_id = store.create_experiment(exp, mode="deploy")
    store.claim(exp_id, "dead@gone:1:dead", "gone", 1)
    store.set_status(exp_id, ExperimentStatus.RUNNING)
    with store.engine.begin() as conn:
        conn.execute(
            update(ExperimentRow)
            .where(ExperimentRow.id == exp_id)
            .values(claim_heartbeat=convert.now() - timedelta(seconds=beat_age_s))
        )
    dep_id = store.create_deployment(
        sku_id,
        exp_id,
        backend="sim",
        hosts=["sim-000", "sim-001", "sim-002"],
        canary_hosts=["sim-000"],
        controller="dead@gone:1:dead",
    )
    waves = [
        {"kind": "canary", "hosts": ["sim-000"], "production": "sim-005", "state": "applied"},
        {"kind": "wave", "hosts": ["sim-001"], "state": "applied"},
        {"kind": "wave", "hosts": ["sim-002"], "state": "pending"},
    ]
    store.update_deployment(dep_id, status=DeploymentStatus.ROLLING, waves=waves)
    return dep_id


def _take_over(tmp_path: Path, store: Store) -> None:
    exp = _experiment(tmp_path)
    sku_id = _sku(store, exp, GOOD)
    fleets: list[SimFleet] = []

    def opener(*args: Any, **kwargs: Any) -> Any:
        fleets.append(open_fleet(*args, **kwargs))
        return fleets[-1]

    # a live controller's deployment (heartbeat 5 s old) is refused, one line, exit 3
    live = _crashed_deployment(store, exp, sku_id, beat_age_s=5)
    with pytest.raises(InputError) as info:
        deploy_sku(store, exp, sku_id, ["sim-001", "sim-003"], canary_time_s=4 * 3600)
    msg = info.value.one_line()
    assert f"deployment {live} (rolling)" in msg and "dead@gone:1:dead" in msg
    assert "\n" not in msg and info.value.status == 3
    assert store.deployment(live).status is DeploymentStatus.ROLLING  # untouched
    store.update_deployment(live, status=DeploymentStatus.FAILED, reason="test: cleared")

    # a stale one (heartbeat 10 min old) is taken over: rolled back, then the deploy goes on
    dead = _crashed_deployment(store, exp, sku_id, beat_age_s=600)
    assert set(fleet_state(store, "sim")) == {"sim-000", "sim-001"}
    rep = deploy_sku(
        store,
        exp,
        sku_id,
        ["sim-001", "sim-003"],
        canary_time_s=4 * 3600,
        fleet_opener=opener,
    )
    assert rep.status is DeploymentStatus.DEPLOYED
    old = store.deployment(dead)
    assert old.status is DeploymentStatus.ROLLED_BACK and old.finished_at is not None
    assert "dead@gone:1:dead" in old.reason and "taken over" in old.reason
    assert old.applied_hosts() == () and store.experiment(old.experiment_id).status.value == (
        "failed"
    )
    (fleet,) = fleets
    # the old deployment's hosts outside the new one are back at production
    assert fleet._config["sim-000"] == fleet.baseline
    assert fleet._config["sim-002"] == fleet.baseline
    assert fleet_state(store, "sim") == {"sim-001": GOOD, "sim-003": GOOD}
    # the new deployment's own claim is released at the end
    assert _claim_holder(store, store.deployment(rep.deployment_id).experiment_id) is None


def _claim_holder(store: Store, exp_id: int) -> str | None:
    with store.engine.connect() as conn:
        row = conn.execute(
            select(ExperimentRow.claim_controller).where(ExperimentRow.id == exp_id)
        ).one()
    return row[0]


def test_a_crashed_controllers_deployment_is_taken_over(tmp_path: Path, store: Store) -> None:
    _take_over(tmp_path, store)


def test_take_over_on_postgresql(tmp_path: Path, request: pytest.FixtureRequest) -> None:
    url = fresh_pg_database(request.getfixturevalue("pg_server"))
    with open_store(url) as store:
        _take_over(tmp_path, store)


def test_a_controller_whose_claim_was_taken_over_stops(tmp_path: Path, store: Store) -> None:
    """Its heartbeat stalled past the stale age and another controller took the claim: at its
    next write it stops (HostError) and leaves the row to the controller that took it over."""
    exp = _experiment(tmp_path)
    sku_id = _sku(store, exp, GOOD)
    took = threading.Event()

    class Thief(NullProgress):
        def message(self, text: str) -> None:
            if "canary" in text and not took.is_set():
                (dep,) = store.deployments(live=True)
                store.claim(dep.experiment_id, "thief@elsewhere:2:beef", "elsewhere", 2, stale_s=0)
                took.set()

    def waiting_opener(*args: Any, **kwargs: Any) -> Any:
        fleet = open_fleet(*args, **kwargs)
        orig = fleet.open_pair

        def open_pair(*a: Any, **kw: Any) -> Any:
            pair = orig(*a, **kw)
            # the keeper's thread ends at its first beat after the claim is gone
            deadline = time.monotonic() + scaled(10.0)
            while any(t.name == "musku-claim" for t in threading.enumerate()):
                assert time.monotonic() < deadline, "the claim keeper did not notice"
                time.sleep(0.01)
            return pair

        fleet.open_pair = open_pair
        return fleet

    with pytest.raises(HostError, match="taken over by another controller"):
        deploy_sku(
            store,
            exp,
            sku_id,
            HOSTS[:3],
            canary_time_s=4 * 3600,
            progress=Thief(),
            fleet_opener=waiting_opener,
            heartbeat_s=0.02,
        )
    (dep,) = store.deployments()
    assert dep.status is DeploymentStatus.CANARY  # untouched: the thief's to end
