"""The storage contract: every backend (SQLite, a real PostgreSQL) passes this one suite."""

from __future__ import annotations

import json
import math

import pytest
from sqlalchemy import text

from musku.domain import (
    ComparisonResult,
    Configuration,
    Decision,
    ExperimentStatus,
    SoftSku,
)
from musku.errors import DatabaseError
from musku.experiment import Experiment
from musku.storage import head_revision, open_store
from musku.storage.records import ComparisonStatus, result_from_dict, result_to_dict
from musku.storage.store import InvalidTransition, Store


def _result(
    base: Configuration,
    cand: Configuration,
    decision: Decision = Decision.BETTER,
    estimate: float = 0.031,
) -> ComparisonResult:
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


def _rows(n: int, *, start: int = 0) -> list[dict[str, object]]:
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


def test_new_database_is_at_head(store: Store, db_url: str) -> None:
    from musku.storage import current_revision

    assert current_revision(db_url) == head_revision()
    assert store.experiments() == []


def test_experiment_roundtrip_and_find(store: Store, experiment: Experiment) -> None:
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


def test_status_transitions_enforced(store: Store, experiment: Experiment) -> None:
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


def test_hosts_from_describe(store: Store, experiment: Experiment) -> None:
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


def test_configurations_have_one_column_per_knob(store: Store, experiment: Experiment) -> None:
    exp = store.create_experiment(experiment)
    base = experiment.production
    cand = base.with_("cdp", "6:5").with_("core_freq", "turbo")
    store.start_comparison(exp, "knob:cdp", base, cand)
    store.start_comparison(exp, "knob:cdp", base, cand)  # same configurations: reused rows
    with store.engine.connect() as conn:
        assert conn.execute(text("SELECT COUNT(*) FROM configurations")).scalar_one() == 2
        row = conn.execute(
            text(
                "SELECT core_freq, core_turbo, cdp, cdp_data_ways, cdp_code_ways, thp, shp, "
                "uncore_freq, core_count, prefetch FROM configurations WHERE cdp = '6:5'"
            )
        ).one()
        assert tuple(row) == (None, True, "6:5", 6, 5, "madvise", 0, 1.8, 18, "all_on")
        base_row = conn.execute(
            text(
                "SELECT core_freq, core_turbo, cdp_data_ways, key FROM configurations "
                "WHERE cdp = 'off'"
            )
        ).one()
        assert base_row[0] == pytest.approx(2.2)
        assert base_row[1] in (False, 0)  # SQLite hands booleans back as 0/1
        assert base_row[2] is None
        assert Configuration.from_key(base_row[3]) == base


def test_comparison_samples_and_decision(store: Store, experiment: Experiment) -> None:
    exp = store.create_experiment(experiment)
    store.add_hosts(exp, {"hosts": ["web-a", "web-b"]})
    base = experiment.production
    cand = base.with_("cdp", "6:5")
    cmp_id = store.start_comparison(exp, "knob:cdp", base, cand)
    assert store.add_samples(cmp_id, _rows(20)) == 40
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

    result = _result(base, cand)
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
        store.add_samples(cmp_id, _rows(1, start=100))


def test_sample_errors_are_one_line(store: Store, experiment: Experiment) -> None:
    exp = store.create_experiment(experiment)
    base = experiment.production
    cmp_id = store.start_comparison(exp, "knob:thp", base, base.with_("thp", "never"))
    store.add_samples(cmp_id, _rows(2))
    with pytest.raises(DatabaseError) as dup:
        store.add_samples(cmp_id, _rows(1))  # (seq 0, host 0) again
    assert "\n" not in str(dup.value) and "add_samples" in str(dup.value)
    assert len(store.samples(cmp_id)) == 4  # the failed batch left nothing behind
    with pytest.raises(DatabaseError, match="has no 'role'"):
        store.add_samples(cmp_id, [{"seq": 9, "t": 1.0, "host": 0}])
    with pytest.raises(DatabaseError, match="role must be 'A' or 'B'"):
        store.add_samples(cmp_id, [{"seq": 9, "t": 1.0, "host": 0, "role": "C"}])
    with pytest.raises(DatabaseError, match="no comparison with id 424242"):
        store.add_samples(424242, _rows(1))


def test_completed_skips_aborted_and_running(store: Store, experiment: Experiment) -> None:
    exp = store.create_experiment(experiment)
    base = experiment.production
    done = store.start_comparison(exp, "knob:cdp", base, base.with_("cdp", "6:5"))
    aborted = store.start_comparison(exp, "knob:cdp", base, base.with_("cdp", "9:2"))
    left_running = store.start_comparison(exp, "knob:thp", base, base.with_("thp", "never"))
    nodiff = store.start_comparison(exp, "knob:thp", base, base.with_("thp", "always"))
    r_done = _result(base, base.with_("cdp", "6:5"))
    store.finish_comparison(done, r_done)
    store.finish_comparison(aborted, _result(base, base.with_("cdp", "9:2"), Decision.ABORTED))
    r_nodiff = _result(base, base.with_("thp", "always"), Decision.NO_DIFFERENCE, 0.001)
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


def test_softsku_with_validations(store: Store, experiment: Experiment) -> None:
    exp = store.create_experiment(experiment)
    sku_config = experiment.production.with_("cdp", "6:5").with_("thp", "never")
    vs_prod = _result(experiment.production, sku_config, Decision.BETTER, 0.04)
    vs_stock = _result(experiment.stock, sku_config, Decision.BETTER, 0.06)
    # the sweep ran the production validation as a comparison; the stock one it did not store
    cmp_id = store.start_comparison(exp, "validate:production", experiment.production, sku_config)
    store.finish_comparison(cmp_id, vs_prod)
    sku = SoftSku("web", "skylake18", sku_config, vs_production=vs_prod, vs_stock=vs_stock)
    sku_id = store.save_softsku(exp, sku)
    rec = store.softsku(sku_id)
    assert rec is not None and rec.sku == sku and rec.experiment_id == exp
    with store.engine.connect() as conn:
        linked = conn.execute(
            text("SELECT against, comparison_id FROM validations ORDER BY against")
        ).all()
    assert linked[0] == ("production", cmp_id)  # linked to the measured comparison
    assert linked[1][0] == "stock" and linked[1][1] != cmp_id  # recorded for it
    bare = store.save_softsku(exp, SoftSku("web", "zen3-epyc64", sku_config))
    assert [r.id for r in store.softskus(service="web")] == [sku_id, bare]
    assert [r.id for r in store.softskus(platform="zen3-epyc64")] == [bare]
    assert store.softskus(service="other") == []
    assert store.softsku(999) is None
    assert json.loads(json.dumps(rec.to_dict()))["vs_stock"]["estimate"] == pytest.approx(0.06)


def test_threading_tables(store: Store, experiment: Experiment) -> None:
    key = experiment.production.key()
    assert store.threading_table("router", "web-a", "skylake18", key) is None
    store.save_threading_table("router", "web-a", "skylake18", key, {"1000": "tp4"})
    newer = {"1000": "tp8", "5000": {"model": "tmp", "threads": 12}}
    store.save_threading_table("router", "web-a", "skylake18", experiment.production, newer)
    assert store.threading_table("router", "web-a", "skylake18", key) == newer
    assert store.threading_table("router", "web-b", "skylake18", key) is None
    assert len(store.threading_tables(service="router")) == 2
    assert store.threading_tables(platform="broadwell16") == []


def test_two_stores_share_one_database(db_url: str, experiment: Experiment) -> None:
    with open_store(db_url) as one, open_store(db_url) as two:
        exp = one.create_experiment(experiment)
        base = experiment.production
        cmp_id = two.start_comparison(exp, "knob:cdp", base, base.with_("cdp", "6:5"))
        one.add_samples(cmp_id, _rows(3))
        assert len(two.samples(cmp_id)) == 6
        # both caches resolve the same configuration to the same row
        other = one.start_comparison(exp, "knob:cdp", base, base.with_("cdp", "6:5"))
        ids = {c.id for c in two.comparisons(exp)}
        assert ids == {cmp_id, other}


def test_delete_experiment(store: Store, experiment: Experiment) -> None:
    keep = store.create_experiment(experiment)
    gone = store.create_experiment(experiment)
    base = experiment.production
    for exp in (keep, gone):
        c = store.start_comparison(exp, "knob:cdp", base, base.with_("cdp", "6:5"))
        store.add_samples(c, _rows(2))
        store.finish_comparison(c, _result(base, base.with_("cdp", "6:5")))
        store.save_softsku(exp, SoftSku("web", "skylake18", base, vs_production=None))
    store.delete_experiment(gone)
    assert [e.id for e in store.experiments()] == [keep]
    with store.engine.connect() as conn:
        assert conn.execute(text("SELECT COUNT(*) FROM samples")).scalar_one() == 4
        assert conn.execute(text("SELECT COUNT(*) FROM soft_skus")).scalar_one() == 1


def test_resume_after_interrupt_or_crash(store: Store, experiment: Experiment) -> None:
    exp = store.create_experiment(experiment)
    base = experiment.production
    store.set_status(exp, ExperimentStatus.RUNNING)
    done = store.start_comparison(exp, "knob:cdp", base, base.with_("cdp", "6:5"))
    store.finish_comparison(done, _result(base, base.with_("cdp", "6:5")))
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
    store: Store, experiment: Experiment
) -> None:
    exp = store.create_experiment(experiment)
    base = experiment.production
    sku_config = base.with_("cdp", "6:5")
    result = _result(base, sku_config, Decision.BETTER, 0.05)
    cmp_id = store.start_comparison(exp, "validate:production", base, sku_config)
    store.finish_comparison(cmp_id, result)
    sku_id = store.save_softsku(
        exp, SoftSku("web", "skylake18", sku_config, vs_production=result, vs_stock=result)
    )
    assert [c.id for c in store.comparisons(exp)] == [cmp_id]  # nothing synthesised
    assert len(store.completed(exp)) == 1
    rec = store.softsku(sku_id)
    assert rec is not None and rec.sku.vs_stock == result and rec.sku.vs_production == result


def test_pair_calibrations(store: Store) -> None:
    """Issue 19: a pair's calibration is stored with its interval, hardware and time; the
    newest one is in force; a breach marks it for recalibration."""
    from datetime import UTC, datetime

    from musku.abtest.calibration import PairCalibration

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


def test_config_transients(store: Store) -> None:
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
