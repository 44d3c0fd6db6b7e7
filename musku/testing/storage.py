"""The storage contract: one suite every results-store backend passes (SQLite, PostgreSQL).

Subclass :class:`StorageContract` and override its ``db_url`` fixture: the URL of a new, empty
database of your backend, fresh for each test. The suite opens it with its ``open_db`` fixture
(default: :func:`musku.storage.open_store`, which creates the schema; override it to run the
suite on another implementation of the protocols) and talks to it through the protocols of
:mod:`musku.storage.protocols` only, each test annotated with the concerns it exercises
(:class:`~musku.storage.protocols.TableStore`, ... or the whole
:class:`~musku.storage.protocols.ResultStore`)::

    from musku.testing.storage import StorageContract

    pytest_plugins = ["musku.testing.postgres"]  # in your conftest.py: a real PostgreSQL

    class TestSQLite(StorageContract):
        @pytest.fixture
        def db_url(self, tmp_path):
            return f"sqlite:///{tmp_path / 'results.db'}"

    class TestPostgres(StorageContract):
        @pytest.fixture
        def db_url(self, postgres_url):
            return postgres_url

The ``experiment`` fixture defaults to :data:`EXPERIMENT` (a small sweep of web on the
skylake18 catalog); the checks of what is read back assume it.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from pathlib import Path

import pytest

from musku.abtest.calibration import PairCalibration
from musku.domain import (
    ComparisonResult,
    Configuration,
    Decision,
    DeploymentStatus,
    ExperimentStatus,
    SoftSku,
)
from musku.errors import DatabaseError, InputError
from musku.experiment import Experiment, load_experiment
from musku.storage import current_revision, head_revision, open_store
from musku.storage.protocols import CalibrationStore, ResultStore, RunStore, TableStore
from musku.storage.records import (
    ComparisonStatus,
    InvalidTransition,
    result_from_dict,
    result_to_dict,
)

EXPERIMENT = Path(__file__).with_name("storage-experiment.toml")
"""The experiment the suite stores (``web-cdp``: service web, platform skylake18)."""


def comparison_result(
    base: Configuration,
    cand: Configuration,
    decision: Decision = Decision.BETTER,
    estimate: float = 0.031,
) -> ComparisonResult:
    """A finished comparison of ``cand`` against ``base``, every field filled."""
    return ComparisonResult(
        baseline=base,
        candidate=cand,
        decision=decision,
        estimate=estimate,
        ci_low=estimate - 0.012,
        ci_high=estimate + 0.012,
        samples=420,
        host_time_s=5400.5,
        reason=f"{decision.value} at 95%",
        guardrail_values={"p99_ms": 11.2},
        threading={"A": "tp8", "B": "tp12"},
        method="sequential-t",
    )


def sample_rows(n: int, *, start: int = 0) -> list[dict[str, object]]:
    """``n`` paired windows (hosts 0/A and 1/B) as ``Store.add_samples`` takes them; the first
    three are warm-up, window 5 is invalid."""
    rows: list[dict[str, object]] = []
    for i in range(start, start + n):
        for host, role in ((0, "A"), (1, "B")):
            rows.append(
                {
                    "seq": i,
                    "t": 60.0 + i,
                    "host": host,
                    "role": role,
                    "period": i // 10,
                    "warmup": i < 3,
                    "valid": i != 5,
                    "metrics": {
                        "mips": 1000.0 + i + 7 * host,
                        "qps": 2000.0 + host,
                        "p99_ms": 9.5 + 0.01 * i,
                        "qos_violation_rate": 0.001 * host,
                        "power_w": 150.0 + host,
                        "llc_miss_rate": 0.25 + host,
                    },
                }
            )
    return rows


class StorageContract:
    """The shared storage suite; override ``db_url`` (see the module's docstring)."""

    @pytest.fixture
    def db_url(self) -> str:
        """A new, empty database of the backend under test (one per test)."""
        raise NotImplementedError("override the `db_url` fixture: an empty database's URL")

    @pytest.fixture
    def open_db(self) -> Callable[[str], ResultStore]:
        """Opens a database of ``db_url``'s kind, creating the schema of an empty one."""
        return open_store

    @pytest.fixture
    def store(self, db_url: str, open_db: Callable[[str], ResultStore]) -> Iterator[ResultStore]:
        s = open_db(db_url)
        try:
            yield s
        finally:
            s.close()

    @pytest.fixture
    def experiment(self) -> Experiment:
        return load_experiment(EXPERIMENT)

    def test_new_database_is_at_head(self, store: RunStore, db_url: str) -> None:
        assert current_revision(db_url) == head_revision()
        assert store.experiments() == []

    def test_experiment_roundtrip_and_find(self, store: RunStore, experiment: Experiment) -> None:
        first = store.create_experiment(experiment)
        second = store.create_experiment(experiment)
        assert second != first
        rec = store.find_experiment(experiment.name)
        assert rec is not None and rec.id == second  # latest of that name, for --resume
        by_id = store.find_experiment(first)
        assert by_id is not None and by_id.id == first
        assert store.find_experiment(str(first)) is not None
        assert store.find_experiment("no-such-experiment") is None
        assert rec.service == "web" and rec.platform == "skylake18"
        assert rec.mode == "independent" and rec.metric == "mips" and rec.direction == "higher"
        assert rec.status is ExperimentStatus.CREATED
        assert rec.path.endswith("experiment.toml")
        assert rec.content["platform"]["settings"]["cdp"] == ["off", "6:5", "9:2"]
        assert rec.created_at.tzinfo is not None
        # JSON-serialisable
        assert json.loads(json.dumps(rec.to_dict()))["name"] == experiment.name
        assert [e.id for e in store.experiments()] == [first, second]

    def test_status_transitions_enforced(self, store: RunStore, experiment: Experiment) -> None:
        exp = store.create_experiment(experiment)
        with pytest.raises(InvalidTransition, match="is created; it cannot become done"):
            store.set_status(exp, ExperimentStatus.DONE)
        store.set_status(exp, ExperimentStatus.RUNNING)
        started = store.experiment(exp).started_at
        assert started is not None
        store.set_status(exp, ExperimentStatus.INTERRUPTED)
        store.set_status(exp, ExperimentStatus.RUNNING)
        assert store.experiment(exp).started_at == started  # first start is kept
        with pytest.raises(InvalidTransition):
            store.set_status(exp, ExperimentStatus.CREATED)
        store.set_status(exp, ExperimentStatus.DONE)
        rec = store.experiment(exp)
        assert rec.status is ExperimentStatus.DONE and rec.finished_at is not None
        with pytest.raises(InvalidTransition, match="none: it is final"):
            store.set_status(exp, ExperimentStatus.RUNNING)
        with pytest.raises(DatabaseError, match="no experiment with id 9999"):
            store.set_status(9999, ExperimentStatus.RUNNING)

    def test_hosts_from_describe(self, store: RunStore, experiment: Experiment) -> None:
        exp = store.create_experiment(experiment)
        store.add_hosts(exp, {"hosts": ["web-a", {"name": "web-b", "kernel": "6.1"}], "rack": 7})
        hosts = store.experiment(exp).hosts
        assert [(h.index, h.name, h.backend) for h in hosts] == [
            (0, "web-a", "sim"),
            (1, "web-b", "sim"),
        ]
        assert hosts[0].facts == {"rack": 7} and hosts[1].facts == {"rack": 7, "kernel": "6.1"}
        # on resume with other machines: rows are updated by index, not duplicated
        store.add_hosts(exp, {"hosts": ["web-c", "web-d"], "backend": "agent"})
        hosts = store.experiment(exp).hosts
        assert [(h.name, h.backend) for h in hosts] == [("web-c", "agent"), ("web-d", "agent")]

    def test_comparison_samples_and_decision(
        self, store: ResultStore, experiment: Experiment
    ) -> None:
        exp = store.create_experiment(experiment)
        store.add_hosts(exp, {"hosts": ["web-a", "web-b"]})
        base = experiment.production
        cand = base.with_("cdp", "6:5")
        cmp_id = store.start_comparison(exp, "knob:cdp", base, cand)
        assert store.add_samples(cmp_id, sample_rows(20)) == 40
        assert store.add_samples(cmp_id, []) == 0
        # host names are accepted too, and NaN is stored as NULL on every backend
        named = [
            {"seq": 20, "t": 80.0, "host": "web-a", "role": "A", "metrics": {"mips": math.nan}},
            {"seq": 20, "t": 80.0, "host": "web-b", "role": "B", "metrics": {"mips": 1.5}},
        ]
        store.add_samples(cmp_id, named)
        got = store.samples(cmp_id)
        assert len(got) == 42
        first = got[0]
        assert first["seq"] == 0 and first["host"] == 0 and first["role"] == "A"
        assert first["warmup"] is True and first["valid"] is True and first["period"] == 0
        assert first["value"] == pytest.approx(1000.0)  # the experiment's primary metric (mips)
        assert first["metrics"]["llc_miss_rate"] == pytest.approx(0.25)  # in extra
        assert first["metrics"]["power_w"] == pytest.approx(150.0)
        invalid = [r for r in got if not r["valid"]]
        assert {(r["seq"], r["host"]) for r in invalid} == {(5, 0), (5, 1)}
        nan_row = next(r for r in got if r["seq"] == 20 and r["host"] == 0)
        assert nan_row["value"] is None and "mips" not in nan_row["metrics"]

        result = comparison_result(base, cand)
        store.finish_comparison(cmp_id, result)
        assert store.completed(exp) == [("knob:cdp", result)]
        (rec,) = store.comparisons(exp)
        assert rec.status is ComparisonStatus.FINISHED and rec.sample_count == 42
        assert rec.result == result and rec.finished_at is not None
        assert json.loads(json.dumps(rec.to_dict()))["result"]["decision"] == "better"
        assert result_from_dict(result_to_dict(result)) == result

        with pytest.raises(InvalidTransition, match="already finished"):
            store.finish_comparison(cmp_id, result)
        with pytest.raises(DatabaseError, match="finished; it takes no samples"):
            store.add_samples(cmp_id, sample_rows(1, start=100))

    def test_sample_errors_are_one_line(self, store: ResultStore, experiment: Experiment) -> None:
        exp = store.create_experiment(experiment)
        base = experiment.production
        cmp_id = store.start_comparison(exp, "knob:thp", base, base.with_("thp", "never"))
        store.add_samples(cmp_id, sample_rows(2))
        with pytest.raises(DatabaseError) as dup:
            store.add_samples(cmp_id, sample_rows(1))  # (seq 0, host 0) again
        assert "\n" not in str(dup.value) and "add_samples" in str(dup.value)
        assert len(store.samples(cmp_id)) == 4  # the failed batch left nothing behind
        with pytest.raises(DatabaseError, match="has no 'role'"):
            store.add_samples(cmp_id, [{"seq": 9, "t": 1.0, "host": 0}])
        with pytest.raises(DatabaseError, match="role must be 'A' or 'B'"):
            store.add_samples(cmp_id, [{"seq": 9, "t": 1.0, "host": 0, "role": "C"}])
        with pytest.raises(DatabaseError, match="no comparison with id 424242"):
            store.add_samples(424242, sample_rows(1))

    def test_completed_skips_aborted_and_running(
        self, store: ResultStore, experiment: Experiment
    ) -> None:
        exp = store.create_experiment(experiment)
        base = experiment.production
        done = store.start_comparison(exp, "knob:cdp", base, base.with_("cdp", "6:5"))
        aborted = store.start_comparison(exp, "knob:cdp", base, base.with_("cdp", "9:2"))
        left_running = store.start_comparison(exp, "knob:thp", base, base.with_("thp", "never"))
        nodiff = store.start_comparison(exp, "knob:thp", base, base.with_("thp", "always"))
        r_done = comparison_result(base, base.with_("cdp", "6:5"))
        store.finish_comparison(done, r_done)
        store.finish_comparison(
            aborted, comparison_result(base, base.with_("cdp", "9:2"), Decision.ABORTED)
        )
        r_nodiff = comparison_result(
            base, base.with_("thp", "always"), Decision.NO_DIFFERENCE, 0.001
        )
        store.finish_comparison(nodiff, r_nodiff)
        assert store.completed(exp) == [("knob:cdp", r_done), ("knob:thp", r_nodiff)]
        statuses = {c.id: c.status for c in store.comparisons(exp)}
        assert statuses[aborted] is ComparisonStatus.ABORTED
        assert statuses[left_running] is ComparisonStatus.RUNNING
        assert store.abort_running(exp) == 1
        assert {c.id: c.status for c in store.comparisons(exp)}[
            left_running
        ] is ComparisonStatus.ABORTED
        with pytest.raises(DatabaseError, match="compares"):
            other = store.start_comparison(exp, "knob:cdp", base, base.with_("cdp", "6:5"))
            store.finish_comparison(other, r_nodiff)  # a result of other configurations

    def test_a_futility_stop_is_stored_and_read_back(
        self, store: ResultStore, experiment: Experiment
    ) -> None:
        """Revision 0013: a comparison the futility stop ended (``not_better``) is a
        completed result like the others (a resumed sweep does not measure it again)."""
        exp = store.create_experiment(experiment)
        base = experiment.production
        cand = base.with_("thp", "never")
        cmp_id = store.start_comparison(exp, "knob:thp", base, cand)
        r = comparison_result(base, cand, Decision.NOT_BETTER, -0.001)
        store.finish_comparison(cmp_id, r)
        assert store.completed(exp) == [("knob:thp", r)]

    def test_comparisons_name_the_pair_they_ran_on(
        self, store: ResultStore, experiment: Experiment
    ) -> None:
        """A pool's comparisons (revision 0006): each names its pair; its samples are filed
        under the pool's host indices; one comparison is aborted alone."""
        exp = store.create_experiment(experiment)
        store.add_hosts(exp, {"hosts": ["h0", "h1", "h2", "h3"]})
        base = experiment.production
        one = store.start_comparison(
            exp, "knob:cdp", base, base.with_("cdp", "6:5"), hosts=("h0", "h1")
        )
        two = store.start_comparison(
            exp, "knob:thp", base, base.with_("thp", "never"), hosts=("h2", "h3")
        )
        old = store.start_comparison(exp, "knob:thp", base, base.with_("thp", "always"))
        assert store.comparison_hosts(exp) == {
            one: ("h0", "h1"),
            two: ("h2", "h3"),
            old: (None, None),
        }
        rows = [{**r, "host": int(str(r["host"])) + 2} for r in sample_rows(3)]
        store.add_samples(two, rows)
        assert {s["host"] for s in store.samples(two)} == {2, 3}
        assert store.abort_running(exp, only=two) == 1
        statuses = {c.id: c.status for c in store.comparisons(exp)}
        assert statuses[two] is ComparisonStatus.ABORTED
        assert statuses[one] is ComparisonStatus.RUNNING  # the others' pairs go on

    def test_threading_tables(self, store: TableStore, experiment: Experiment) -> None:
        key = experiment.production.key()
        assert store.threading_table("router", "web-a", "skylake18", key) is None
        store.save_threading_table("router", "web-a", "skylake18", key, {"1000": "tp4"})
        newer = {"1000": "tp8", "5000": {"model": "tmp", "threads": 12}}
        store.save_threading_table("router", "web-a", "skylake18", experiment.production, newer)
        assert store.threading_table("router", "web-a", "skylake18", key) == newer
        assert store.threading_table("router", "web-b", "skylake18", key) is None
        assert len(store.threading_tables(service="router")) == 2
        assert store.threading_tables(platform="broadwell16") == []

    def test_two_stores_share_one_database(
        self, db_url: str, open_db: Callable[[str], ResultStore], experiment: Experiment
    ) -> None:
        one, two = open_db(db_url), open_db(db_url)
        try:
            exp = one.create_experiment(experiment)
            base = experiment.production
            cmp_id = two.start_comparison(exp, "knob:cdp", base, base.with_("cdp", "6:5"))
            one.add_samples(cmp_id, sample_rows(3))
            assert len(two.samples(cmp_id)) == 6
            # both caches resolve the same configuration to the same row
            other = one.start_comparison(exp, "knob:cdp", base, base.with_("cdp", "6:5"))
            ids = {c.id for c in two.comparisons(exp)}
            assert ids == {cmp_id, other}
        finally:
            one.close()
            two.close()

    def test_resume_after_interrupt_or_crash(
        self, store: ResultStore, experiment: Experiment
    ) -> None:
        exp = store.create_experiment(experiment)
        base = experiment.production
        store.set_status(exp, ExperimentStatus.RUNNING)
        done = store.start_comparison(exp, "knob:cdp", base, base.with_("cdp", "6:5"))
        store.finish_comparison(done, comparison_result(base, base.with_("cdp", "6:5")))
        store.start_comparison(exp, "knob:cdp", base, base.with_("cdp", "9:2"))  # then a crash
        assert store.resume(exp) == 1  # stale 'running' -> interrupted -> running
        assert store.experiment(exp).status is ExperimentStatus.RUNNING
        assert [p for p, _ in store.completed(exp)] == ["knob:cdp"]
        store.set_status(exp, ExperimentStatus.INTERRUPTED)  # Ctrl-C
        assert store.resume(exp) == 0
        store.set_status(exp, ExperimentStatus.FAILED)
        with pytest.raises(InvalidTransition, match="is failed: only an interrupted"):
            store.resume(exp)

    def test_one_validation_comparison_serves_both_when_stock_is_production(
        self, store: ResultStore, experiment: Experiment
    ) -> None:
        exp = store.create_experiment(experiment)
        base = experiment.production
        sku_config = base.with_("cdp", "6:5")
        result = comparison_result(base, sku_config, Decision.BETTER, 0.05)
        cmp_id = store.start_comparison(exp, "validate:production", base, sku_config)
        store.finish_comparison(cmp_id, result)
        sku_id = store.save_softsku(
            exp, SoftSku("web", "skylake18", sku_config, vs_production=result, vs_stock=result)
        )
        assert [c.id for c in store.comparisons(exp)] == [cmp_id]  # nothing synthesised
        assert len(store.completed(exp)) == 1
        rec = store.softsku(sku_id)
        assert rec is not None and rec.sku.vs_stock == result and rec.sku.vs_production == result

    def test_pair_calibrations(self, store: CalibrationStore) -> None:
        """Issue 19: a pair's calibration is stored with its interval, hardware and time; the
        newest one is in force; a breach marks it for recalibration."""

        assert store.calibration("sim-a+sim-b") is None
        assert store.mark_recalibration("sim-a+sim-b", "breach") is False
        taken = datetime(2026, 11, 23, 12, 0, tzinfo=UTC)
        old = PairCalibration("sim-a+sim-b", '{"platform": "x"}', "mips", 0.01, 0.008, 0.012, 900,
                              taken)  # fmt: skip
        store.save_calibration(old)
        new = PairCalibration("sim-a+sim-b", '{"platform": "x"}', "mips", 0.02, 0.017, 0.023, 1200,
                              taken)  # fmt: skip
        cid = store.save_calibration(new)
        got = store.calibration("sim-a+sim-b")
        assert got is not None and got.id == cid
        assert (got.bias, got.ci_low, got.ci_high, got.samples) == (0.02, 0.017, 0.023, 1200)
        assert got.taken_at == taken and got.hardware == '{"platform": "x"}'
        assert got.bound == 0.023 and not got.needs_recalibration
        assert store.mark_recalibration("sim-a+sim-b", "bias +3 % beyond +-2.3 %") is True
        flagged = store.calibration("sim-a+sim-b")
        assert flagged is not None and flagged.needs_recalibration
        assert flagged.note.startswith("bias +3 %")
        assert store.calibration("other") is None

    def test_config_transients(self, store: CalibrationStore) -> None:
        """Per-configuration warm-up transients: the median of the three newest measurements."""
        assert store.transient("p", "hw", "cfg") is None
        store.save_transient("p", "hw", "cfg", 120.0)
        assert store.transient("p", "hw", "cfg") == 120.0
        store.save_transient("p", "hw", "cfg", 900.0)  # one spurious long one
        store.save_transient("p", "hw", "cfg", 150.0)
        assert store.transient("p", "hw", "cfg") == 150.0
        store.save_transient("p", "hw", "cfg", 130.0)
        assert store.transient("p", "hw", "cfg") == 150.0  # 900, 150, 130
        assert store.transient("p", "other-hw", "cfg") is None
        mem = store.transients("p", "hw")
        assert mem.get("cfg") == 150.0 and mem.get("new") is None
        mem["new"] = 60.0
        assert store.transient("p", "hw", "new") == 60.0

    def test_deployments(self, store: ResultStore, experiment: Experiment) -> None:
        """Revision 0008: a deployment's life cycle, its waves, the live-host conflict, watches."""
        exp_id = store.create_experiment(experiment)
        sku = SoftSku(
            experiment.service.name, experiment.platform.name, Configuration.of(thp="always")
        )
        sku_id = store.save_softsku(exp_id, sku)
        dep_id = store.create_deployment(
            sku_id, exp_id, backend="sim", hosts=["a", "b", "c"], canary_hosts=["a"],
            controller="me", code_version="v1",
        )  # fmt: skip
        dep = store.deployment(dep_id)
        assert dep is not None and dep.status is DeploymentStatus.CANARY
        assert (dep.hosts, dep.canary_hosts, dep.code_version) == (("a", "b", "c"), ("a",), "v1")
        with pytest.raises(InputError, match="host b already runs soft SKU"):
            store.create_deployment(sku_id, exp_id, backend="sim", hosts=["b"], canary_hosts=["b"],
                                    controller="me")  # fmt: skip
        # another backend's hosts of the same name are other hosts
        other = store.create_deployment(sku_id, exp_id, backend="agent", hosts=["b"],
                                        canary_hosts=["b"], controller="me")  # fmt: skip
        cmp_id = store.start_comparison(
            exp_id, "deploy:canary:a", experiment.production, sku.configuration
        )
        waves = [{"kind": "canary", "hosts": ["a"], "state": "applied"}]
        store.update_deployment(dep_id, canary_comparison_id=cmp_id, waves=waves)
        store.update_deployment(dep_id, status=DeploymentStatus.ROLLING)
        with pytest.raises(InvalidTransition):
            store.update_deployment(dep_id, status=DeploymentStatus.CANARY)
        store.update_deployment(dep_id, status=DeploymentStatus.DEPLOYED)
        dep = store.deployment(dep_id)
        assert dep is not None and dep.status is DeploymentStatus.DEPLOYED
        assert dep.canary_comparison_id == cmp_id and dep.applied_hosts() == ("a",)
        assert dep.finished_at is not None
        assert [d.id for d in store.deployments(live=True)] == [dep_id, other]
        store.update_deployment(other, status=DeploymentStatus.ROLLED_BACK, reason="canary lost")
        assert [d.id for d in store.deployments(live=True)] == [dep_id]
        assert store.deployment(other).reason == "canary lost"  # type: ignore[union-attr]
        w = store.add_watch(dep_id, verdict="gone", code_version="v2", comparison_id=cmp_id,
                            reason="no_difference")  # fmt: skip
        (got,) = store.watches(dep_id)
        assert (got.id, got.verdict, got.code_version, got.comparison_id) == (
            w,
            "gone",
            "v2",
            cmp_id,
        )
        with pytest.raises(DatabaseError):
            store.add_watch(dep_id, verdict="maybe", code_version=None, comparison_id=None)
