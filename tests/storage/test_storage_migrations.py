"""Migrations: head equals the models on every backend; older/newer databases are refused at
open with an actionable one-line message; ``upgrade`` brings an older database to head."""

from __future__ import annotations

from pathlib import Path

import pytest
from alembic import command
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext
from sqlalchemy import inspect, text

from musku.domain import Decision, ExperimentStatus
from musku.errors import DatabaseError, SchemaOutOfDate
from musku.storage import current_revision, head_revision, open_store, upgrade
from musku.storage.migrate import alembic_config, known_revisions
from musku.storage.models import metadata

FIRST = "0001_initial"


def _engine(url: str):  # type: ignore[no-untyped-def]
    from musku.storage.engine import make_engine

    return make_engine(url)


def _migrate_to(url: str, target: str) -> None:
    engine = _engine(url)
    try:
        with engine.begin() as conn:
            command.upgrade(alembic_config(conn), target)
    finally:
        engine.dispose()


def test_upgrade_from_empty_matches_models(db_url: str) -> None:
    assert current_revision(db_url) is None
    assert upgrade(db_url) == (None, head_revision())
    engine = _engine(db_url)
    try:
        with engine.connect() as conn:
            ctx = MigrationContext.configure(conn, opts={"compare_type": True})
            diff = compare_metadata(ctx, metadata)
            assert diff == [], f"migrations and models differ: {diff}"
            tables = set(inspect(conn).get_table_names())
            views = set(inspect(conn).get_view_names())
    finally:
        engine.dispose()
    assert tables == set(metadata.tables) | {"alembic_version"}
    assert {"v_comparisons", "v_soft_skus"} <= views
    # a second upgrade is a no-op
    assert upgrade(db_url) == (head_revision(), head_revision())


def test_every_revision_downgrades_and_upgrades_again(db_url: str) -> None:
    upgrade(db_url)
    engine = _engine(db_url)
    try:
        with engine.begin() as conn:
            command.downgrade(alembic_config(conn), "base")
        with engine.connect() as conn:
            left = [t for t in inspect(conn).get_table_names() if t != "alembic_version"]
        assert left == []
    finally:
        engine.dispose()
    assert upgrade(db_url) == (None, head_revision())


def test_older_database_is_refused_then_upgraded(db_url: str) -> None:
    assert FIRST in known_revisions() and head_revision() != FIRST
    _migrate_to(db_url, FIRST)
    # data written at the older revision survives the upgrade
    engine = _engine(db_url)
    try:
        with engine.begin() as conn:
            conn.execute(
                text(
                    "INSERT INTO experiments (name, description, service, platform, mode, "
                    "baseline, metric, direction, status, path, content, resolved, "
                    "musku_version, created_at) VALUES ('old', '', 'web', 'skylake18', "
                    "'independent', 'production', 'mips', 'higher', 'interrupted', "
                    "'/x.toml', '{}', '{}', '0.0.1', CURRENT_TIMESTAMP)"
                )
            )
    finally:
        engine.dispose()

    with pytest.raises(SchemaOutOfDate) as info:
        open_store(db_url)
    message = str(info.value)
    assert "\n" not in message
    assert f"database at revision {FIRST}, this musku needs {head_revision()}" in message
    assert "run `musku db upgrade` --db " in message

    assert upgrade(db_url) == (FIRST, head_revision())
    with open_store(db_url) as store:
        old = store.find_experiment("old")
        assert old is not None and old.status is ExperimentStatus.INTERRUPTED
        store.set_status(old.id, ExperimentStatus.RUNNING)  # resumable after the upgrade
        with store.engine.connect() as conn:
            assert conn.execute(text("SELECT COUNT(*) FROM v_comparisons")).scalar_one() == 0


def test_newer_database_is_refused(db_url: str) -> None:
    upgrade(db_url)
    engine = _engine(db_url)
    try:
        with engine.begin() as conn:
            conn.execute(text("UPDATE alembic_version SET version_num = '0099_from_the_future'"))
    finally:
        engine.dispose()
    with pytest.raises(SchemaOutOfDate, match="revision 0099_from_the_future, which this musku"):
        open_store(db_url)
    with pytest.raises(SchemaOutOfDate, match="newer musku"):
        upgrade(db_url)


def test_empty_database_not_created_without_create(db_url: str) -> None:
    with pytest.raises(DatabaseError, match="no musku database at .*musku db upgrade"):
        open_store(db_url, create=False)
    assert current_revision(db_url) is None
    with open_store(db_url):
        pass
    with open_store(db_url, create=False) as store:
        assert store.experiments() == []


def test_foreign_database_is_refused(db_url: str) -> None:
    engine = _engine(db_url)
    try:
        with engine.begin() as conn:
            conn.execute(text("CREATE TABLE payroll (id INTEGER PRIMARY KEY)"))
    finally:
        engine.dispose()
    with pytest.raises(DatabaseError, match="not a musku results database"):
        open_store(db_url)
    with pytest.raises(DatabaseError, match="not upgrading it"):
        upgrade(db_url)


def test_decision_values_match_domain() -> None:
    """The CHECK constraint lists exactly the domain's decisions."""
    from musku.storage.models import DECISIONS, EXPERIMENT_STATUSES

    assert set(DECISIONS) == {d.value for d in Decision}
    assert set(EXPERIMENT_STATUSES) == {s.value for s in ExperimentStatus}


def test_offline_sql_renders_for_postgresql() -> None:
    """``alembic upgrade --sql`` works (DBAs who apply migrations by hand)."""
    import io

    buf = io.StringIO()
    cfg = alembic_config(url="postgresql+psycopg://u@h/db")
    cfg.output_buffer = buf
    command.upgrade(cfg, "head", sql=True)
    sql = buf.getvalue()
    assert "CREATE TABLE samples" in sql and "JSONB" in sql and "CREATE VIEW v_soft_skus" in sql


def test_concurrent_first_opens_create_the_schema_once(db_url: str) -> None:
    """Several sweeps starting at once on a brand-new database all get a working store."""
    from concurrent.futures import ThreadPoolExecutor

    def opener(_: int) -> str | None:
        with open_store(db_url) as store:
            store.experiments()
        return current_revision(db_url)

    with ThreadPoolExecutor(max_workers=4) as pool:
        revisions = list(pool.map(opener, range(4)))
    assert revisions == [head_revision()] * 4


def test_threads_opening_new_sqlite_files_together_never_see_locked(tmp_path: Path) -> None:
    """Switching a new file to WAL is refused at once ("database is locked", no busy timeout)
    while another connection is in a transaction; it failed about 1 in 25 of these rounds before
    open_store retried it."""
    from concurrent.futures import ThreadPoolExecutor

    def opener(url: str) -> str:
        with open_store(url) as store:
            store.experiments()
        return current_revision(url)

    with ThreadPoolExecutor(max_workers=4) as pool:
        for i in range(40):
            url = f"sqlite:///{tmp_path / f'r{i}.db'}"
            assert list(pool.map(opener, [url] * 4)) == [head_revision()] * 4


def test_concurrent_processes_create_a_new_sqlite_file_once(tmp_path: Path) -> None:
    import subprocess
    import sys

    url = f"sqlite:///{tmp_path / 'shared.db'}"
    code = "import sys; from musku.storage import open_store; open_store(sys.argv[1]).close()"
    procs = [
        subprocess.Popen([sys.executable, "-c", code, url], stderr=subprocess.PIPE, text=True)
        for _ in range(3)
    ]
    errors = [p.communicate(timeout=120)[1] for p in procs]
    assert [p.returncode for p in procs] == [0, 0, 0], errors
    assert current_revision(url) == head_revision()
    assert sorted(p.name for p in tmp_path.iterdir() if not p.name.startswith("shared.db-")) == [
        "shared.db"
    ]  # no lock file left behind
