"""`musku abort` against a finishing sweep (issue 32 bullet 6, issue 29 item 4): the abort and
the soft SKU are serialised on the experiment's row, so an abort is either refused ("already
finished") or wins cleanly -- never "aborted" in the DB and a live soft SKU. A soft SKU stored
again by a resumed run is the same row. Aborted runs' soft SKUs are not listed, not
deployable (`musku sku deploy`: exit 3) and not ranked by db/queries/best_setting_per_knob.sql.
On every backend."""

from __future__ import annotations

from pathlib import Path

import pytest
from sqlalchemy import text, update

from musku.domain import Decision, ExperimentStatus, SoftSku
from musku.experiment import Experiment
from musku.storage import InvalidTransition
from musku.storage.models import ExperimentRow
from musku.storage.store import Store
from musku.testing.storage import comparison_result
from tests.cli.test_exit_codes import musku, one_error_line

QUERIES = Path(__file__).resolve().parents[2] / "db" / "queries"


def _sku(store: Store, experiment: Experiment, exp_id: int) -> SoftSku:
    base = experiment.production
    cfg = base.with_("thp", "never")
    result = comparison_result(base, cfg, Decision.BETTER, 0.05)
    cmp_id = store.start_comparison(exp_id, "validate:production", base, cfg)
    store.finish_comparison(cmp_id, result)
    return SoftSku("web", experiment.platform.name, cfg, vs_production=result)


def _running(store: Store, experiment: Experiment) -> int:
    exp_id = store.create_experiment(experiment)
    store.set_status(exp_id, ExperimentStatus.RUNNING)
    return exp_id


def _count(store: Store, sql: str) -> int:
    with store.engine.connect() as conn:
        return int(conn.execute(text(sql)).scalar_one())


def test_abort_first_wins_cleanly(store: Store, experiment: Experiment) -> None:
    exp_id = _running(store, experiment)
    sku = _sku(store, experiment, exp_id)
    store.abort_experiment(exp_id)
    with pytest.raises(InvalidTransition, match="was aborted"):
        store.save_softsku(exp_id, sku)
    assert store.status_of(exp_id) is ExperimentStatus.ABORTED
    assert _count(store, "SELECT count(*) FROM soft_skus") == 0
    assert _count(store, "SELECT count(*) FROM validations") == 0


def test_soft_sku_first_refuses_the_abort(store: Store, experiment: Experiment) -> None:
    exp_id = _running(store, experiment)
    sku_id = store.save_softsku(exp_id, _sku(store, experiment, exp_id))
    with pytest.raises(InvalidTransition, match=rf"already finished: its soft SKU {sku_id}"):
        store.abort_experiment(exp_id)
    assert store.status_of(exp_id) is ExperimentStatus.RUNNING
    store.set_status(exp_id, ExperimentStatus.DONE)
    assert [s.id for s in store.softskus()] == [sku_id]


def test_the_same_soft_sku_is_stored_once(store: Store, experiment: Experiment) -> None:
    exp_id = _running(store, experiment)
    sku = _sku(store, experiment, exp_id)
    first = store.save_softsku(exp_id, sku)
    again = store.save_softsku(exp_id, sku)  # a run resumed after a kill right after it
    assert again == first
    assert _count(store, "SELECT count(*) FROM soft_skus") == 1
    assert _count(store, "SELECT count(*) FROM validations") == 1
    rec = store.softsku(first)
    assert rec is not None and rec.sku == sku


def test_aborted_runs_soft_skus_are_not_listed_or_ranked(
    store: Store, experiment: Experiment, db_url: str
) -> None:
    """A soft SKU an older musku stored before the abort landed: hidden, not deployable, and
    the aborted run's knob comparisons rank nowhere."""
    base = experiment.production
    exp_id = _running(store, experiment)
    cand = base.with_("thp", "always")
    cmp_id = store.start_comparison(exp_id, "knob:thp", base, cand)
    store.finish_comparison(cmp_id, comparison_result(base, cand, Decision.BETTER, 0.09))
    sku_id = store.save_softsku(exp_id, _sku(store, experiment, exp_id))
    sql = (QUERIES / "best_setting_per_knob.sql").read_text()
    sql = "\n".join(line.split("--", 1)[0] for line in sql.splitlines())

    def ranked() -> list[int]:
        with store.engine.connect() as conn:
            return [r.comparison_id for r in conn.execute(text(sql))]

    assert ranked() == [cmp_id]
    with store.engine.begin() as conn:  # as the race once left it
        conn.execute(
            update(ExperimentRow)
            .where(ExperimentRow.id == exp_id)
            .values(status=ExperimentStatus.ABORTED.value)
        )
    assert store.softskus() == []
    assert [s.id for s in store.softskus(include_aborted=True)] == [sku_id]
    assert ranked() == []
    gains = (QUERIES / "softsku_gains.sql").read_text()
    gains = "\n".join(line.split("--", 1)[0] for line in gains.splitlines())
    with store.engine.connect() as conn:
        assert [r.soft_sku_id for r in conn.execute(text(gains))] == []
    if not db_url.startswith("sqlite"):
        return
    proc = musku("sku", "deploy", str(sku_id), "--hosts", "a,b", "--db", db_url)
    assert proc.returncode == 3, proc.stderr
    assert "was aborted: not deployable" in one_error_line(proc)
