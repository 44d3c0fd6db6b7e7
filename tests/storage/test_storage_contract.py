"""The storage contract (musku.testing.storage) on every backend (SQLite, a real PostgreSQL),
and the checks of musku's own schema that look below the Store interface."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from sqlalchemy import text

from musku.domain import (
    Configuration,
    Decision,
    SoftSku,
)
from musku.experiment import Experiment
from musku.storage.store import Store
from musku.testing.storage import StorageContract
from musku.testing.storage import comparison_result as _result
from musku.testing.storage import sample_rows as _rows
from tests.storage.conftest import BACKENDS, empty_database


class TestStorageContract(StorageContract):
    """musku.testing.storage.StorageContract on SQLite and on a real PostgreSQL."""

    @pytest.fixture(params=BACKENDS)
    def db_url(self, request: pytest.FixtureRequest, tmp_path: Path) -> str:
        return empty_database(request, tmp_path)


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


def test_comparisons_view_names_the_pair(store: Store, experiment: Experiment) -> None:
    """The analysts' ``v_comparisons`` view lists each comparison's pair (revision 0006;
    below the protocols, so not in the contract)."""
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
    with store.engine.connect() as conn:
        got = conn.execute(
            text("SELECT comparison_id, host_a, host_b FROM v_comparisons ORDER BY 1")
        ).all()
    assert [tuple(r) for r in got] == [(one, "h0", "h1"), (two, "h2", "h3"), (old, None, None)]
