"""Revision 0004: configurations as generic rows, the wide ``configurations`` view generated
from the knob specs, and a database written before 0004 carried over without loss (every
table, the view in place of the old table, every db/queries answer, what the Store reads),
on SQLite and on a real PostgreSQL."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from alembic import command
from sqlalchemy import inspect, text

from musku.domain import Configuration
from musku.experiment import Experiment
from musku.knob_spec import BUILTIN, is_knob, spec_of, unregister_knob
from musku.storage import head_revision, open_store, upgrade
from musku.storage.engine import make_engine
from musku.storage.migrate import alembic_config
from musku.storage.views import create_view_sql, view_specs

from .populate import populate
from .test_storage_queries import ALL, _strip_comments

# the 0001 columns of `configurations`, in their order
WIDE = (
    "id",
    "key",
    "core_freq",
    "core_turbo",
    "uncore_freq",
    "uncore_turbo",
    "core_count",
    "cdp",
    "cdp_data_ways",
    "cdp_code_ways",
    "prefetch",
    "thp",
    "shp",
)

# a configuration as musku before 0004 stored it (hand-written here, not by the code under test)
OLD_ROW = {
    "key": json.dumps(
        {
            "core_freq": "turbo",
            "uncore_freq": 1.8,
            "core_count": 18,
            "cdp": "6:5",
            "prefetch": "dcu",
            "thp": "never",
            "shp": 512,
        },
        separators=(",", ":"),
    ),
    "core_freq": None,
    "core_turbo": True,
    "uncore_freq": 1.8,
    "uncore_turbo": False,
    "core_count": 18,
    "cdp": "6:5",
    "cdp_data_ways": 6,
    "cdp_code_ways": 5,
    "prefetch": "dcu",
    "thp": "never",
    "shp": 512,
}


def _norm(value: Any) -> Any:
    """Booleans are 1/0 on SQLite and true/false on PostgreSQL; floats compared exactly."""
    if isinstance(value, bool):
        return int(value)
    if isinstance(value, float) and math.isnan(value):
        return "NaN"
    return value


def _rows(conn: Any, sql: str, **params: Any) -> list[tuple[Any, ...]]:
    return [tuple(_norm(v) for v in r) for r in conn.execute(text(sql), params)]


def _dump(conn: Any) -> dict[str, list[tuple[Any, ...]]]:
    """Every table's rows (but the configuration storage), ordered by all columns."""
    out = {}
    insp = inspect(conn)
    for table in sorted(insp.get_table_names()):
        if table in ("alembic_version", "configurations", "configuration_keys", "knobs"):
            continue
        if table == "configuration_settings":
            continue
        if table in ("comparison_queue", "deployments", "deployment_watches"):
            continue  # revisions 0007 and 0008's tables: empty on carried-over data
        # columns later revisions add (0005: experiment claims, 0006: comparison hosts, 0009:
        # the decisions' time breakdown; NULL on carried-over rows)
        later = ("claim_", "host_a", "host_b", "time_")
        cols = [c["name"] for c in insp.get_columns(table) if not c["name"].startswith(later)]
        # JSON columns compare as text on both backends
        select = ", ".join(f"CAST({c} AS TEXT)" for c in cols)
        order = ", ".join(str(i + 1) for i in range(len(cols)))
        out[table] = _rows(conn, f"SELECT {select} FROM {table} ORDER BY {order}")
    return out


def _queries(conn: Any, comparison_id: int) -> dict[str, list[tuple[Any, ...]]]:
    out = {}
    for path in ALL:
        sql = _strip_comments(path.read_text(encoding="utf-8"))
        params = {"comparison_id": comparison_id} if ":comparison_id" in sql else {}
        # floats to 12 significant digits: an aggregate's summation order follows the plan,
        # which may change when a later revision recreates a view (0006: v_comparisons)
        out[path.name] = [
            tuple(float(f"{v:.12g}") if isinstance(v, float) else v for v in row)
            for row in _rows(conn, sql, **params)
        ]
    return out


def _wide(conn: Any) -> list[tuple[Any, ...]]:
    return _rows(conn, f"SELECT {', '.join(WIDE)} FROM configurations ORDER BY id")


def _alembic(url: str, how: str, target: str) -> None:
    engine = make_engine(url)
    try:
        with engine.begin() as conn:
            getattr(command, how)(alembic_config(conn), target)
    finally:
        engine.dispose()


def test_a_0003_database_is_carried_over_without_loss(
    db_url: str, experiment: Experiment, tmp_path: Path
) -> None:
    # a realistic database written by the Store, then taken back to 0003 (the old wide table)
    with open_store(db_url) as store:
        data = populate(store, experiment, samples_per_host=20)
        exp_ids = sorted(data.experiments.values())
        read_before = [(store.experiment(i), store.completed(i)) for i in exp_ids]
        skus_before = [store.softsku(i) for i in sorted(data.softskus.values())]
    any_cmp = min(data.results)
    _alembic(db_url, "downgrade", "0003")
    engine = make_engine(db_url)
    try:
        with engine.begin() as conn:
            assert "configuration_settings" not in inspect(conn).get_table_names()
            cols = ", ".join(OLD_ROW)
            conn.execute(
                text(f"INSERT INTO configurations ({cols}) VALUES (:{', :'.join(OLD_ROW)})"),
                OLD_ROW,
            )
        with engine.connect() as conn:
            tables_0003 = _dump(conn)
            wide_0003 = _wide(conn)
            queries_0003 = _queries(conn, any_cmp)
    finally:
        engine.dispose()
    assert len(wide_0003) > 2 and any(r[3] == 1 for r in wide_0003)  # the turbo row is there
    assert any(rows for rows in queries_0003.values())

    assert upgrade(db_url) == ("0003", head_revision()) and head_revision() >= "0004"
    engine = make_engine(db_url)
    try:
        with engine.connect() as conn:
            assert _dump(conn) == tables_0003
            assert _wide(conn) == wide_0003  # the view shows what the table held
            assert _queries(conn, any_cmp) == queries_0003
            assert "configurations" in inspect(conn).get_view_names()
            # one row per knob, its value as text and as a number
            old_id = wide_0003[-1][0]
            settings = _rows(
                conn,
                "SELECT knob, value, number FROM configuration_settings "
                "WHERE configuration_id = :i ORDER BY knob",
                i=old_id,
            )
            assert settings == sorted(
                [
                    ("core_freq", "turbo", None),
                    ("uncore_freq", "1.8", 1.8),
                    ("core_count", "18", 18.0),
                    ("cdp", "6:5", None),
                    ("prefetch", "dcu", None),
                    ("thp", "never", None),
                    ("shp", "512", 512.0),
                ]
            )
    finally:
        engine.dispose()
    with open_store(db_url) as store:
        assert [(store.experiment(i), store.completed(i)) for i in exp_ids] == read_before
        assert [store.softsku(i) for i in sorted(data.softskus.values())] == skus_before
        # a configuration stored after the upgrade writes the same rows the upgrade wrote
        exp = store.create_experiment(experiment)
        cfg = Configuration.from_key(str(OLD_ROW["key"]))
        cfg2 = cfg.with_("core_freq", 2.0)
        store.start_comparison(exp, "bench", cfg, cfg2)
        with store.engine.connect() as conn:
            assert _rows(
                conn, "SELECT COUNT(*) FROM configuration_keys WHERE key = :k", k=cfg.key()
            ) == [(1,)]
            row = _rows(
                conn,
                "SELECT s.value, s.number, v.core_freq, v.core_turbo FROM configuration_settings s "
                "JOIN configuration_keys k ON k.id = s.configuration_id "
                "JOIN configurations v ON v.id = k.id "
                "WHERE k.key = :k AND s.knob = 'core_freq'",
                k=cfg2.key(),
            )
            assert row == [("2.0", 2.0, 2.0, 0)]

    # and back down: 0003's wide table holds the same rows again
    _alembic(db_url, "downgrade", "0003")
    engine = make_engine(db_url)
    try:
        with engine.connect() as conn:
            wide = _wide(conn)
    finally:
        engine.dispose()
    assert wide[: len(wide_0003)] == wide_0003


def test_view_columns_come_from_the_specs() -> None:
    specs = view_specs()
    assert [s.name for s in specs] == list(BUILTIN)
    sql = create_view_sql(specs, "sqlite")
    cols = [c.name for s in specs for c in s.view_columns]
    assert ["id", "key", *cols] == list(WIDE)
    for col in cols:
        assert f" AS {col}" in sql
    assert spec_of("cdp").view_columns[1].source == "part:0"
    assert "split_part" in create_view_sql(specs, "postgresql") and "split_part" not in sql


def test_an_out_of_tree_knob_gets_rows_a_view_column_and_is_reloaded(
    db_url: str, experiment: Experiment
) -> None:
    from tests.knobs.toyknob import TARGET

    base = Configuration.of(thp="madvise")
    try:
        cand = Configuration.of({"thp": "madvise", TARGET: 512})
        with open_store(db_url) as store:
            exp = store.create_experiment(experiment)
            store.start_comparison(exp, "knob:readahead", base, cand)
            with store.engine.connect() as conn:
                rows = _rows(conn, "SELECT thp, readahead, shp FROM configurations ORDER BY id")
                knobs = _rows(conn, "SELECT name, target, kind FROM knobs")
        assert rows == [("madvise", None, None), ("madvise", 512, None)]
        assert knobs == [("readahead", TARGET, "count")]
    finally:
        unregister_knob("readahead")
    # a process that never heard of the knob reads the comparison back: the knobs table
    # tells it where the knob lives
    assert not is_knob("readahead")
    try:
        with open_store(db_url) as store:
            (cmp,) = store.comparisons(exp)
            assert cmp.candidate == cand and cmp.candidate["readahead"] == 512
        assert is_knob("readahead")
    finally:
        unregister_knob("readahead")
