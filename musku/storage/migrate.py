"""Schema revisions: alembic run in-process with a ``Config`` built in code.

The migrations ship inside the package (``musku/storage/migrations``), so an installed musku
can create and upgrade its database without an alembic.ini. Developers add a revision with::

    python -m musku.storage.migrate revision -m "what changed" --db sqlite:///tmp/dev.db

(the DB must be at head; autogenerate diffs it against ``musku.storage.models``).
"""

from __future__ import annotations

import argparse
import fcntl
import functools
import os
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING

from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import inspect, text
from sqlalchemy.exc import SQLAlchemyError

from musku import __version__
from musku.errors import DatabaseError, SchemaOutOfDate
from musku.storage.engine import connect_error, display, make_engine

if TYPE_CHECKING:
    from alembic.config import Config
    from alembic.script import ScriptDirectory
    from sqlalchemy.engine import Connection, Engine

MIGRATIONS = Path(__file__).resolve().parent / "migrations"


def alembic_config(connection: Connection | None = None, url: str | None = None) -> Config:
    cfg = Config()
    cfg.set_main_option("script_location", str(MIGRATIONS))
    cfg.set_main_option("path_separator", "os")
    if url is not None:
        cfg.set_main_option("sqlalchemy.url", url.replace("%", "%%"))
    if connection is not None:
        cfg.attributes["connection"] = connection
    return cfg


def script_directory() -> ScriptDirectory:
    return ScriptDirectory.from_config(alembic_config())


@functools.cache
def head_revision() -> str:
    head = script_directory().get_current_head()
    assert head is not None, "musku ships at least one migration"
    return head


@functools.cache
def known_revisions() -> frozenset[str]:
    return frozenset(rev.revision for rev in script_directory().walk_revisions())


def revision_of(connection: Connection) -> str | None:
    """The revision a database is stamped at (None for a database without musku's schema)."""
    return MigrationContext.configure(connection).get_current_revision()


def user_tables(connection: Connection) -> list[str]:
    return [t for t in inspect(connection).get_table_names() if t != "alembic_version"]


def upgrade_hint(url_text: str | None) -> str:
    return "run `musku db upgrade`" + (f" --db {url_text}" if url_text else "")


def newer_message(rev: str, head: str) -> str:
    return (
        f"database at revision {rev}, which this musku ({__version__}, schema {head}) does not "
        "know: it was written by a newer musku; upgrade musku to use it"
    )


MIGRATION_LOCK = 0x6D75736B75  # "musku": PostgreSQL advisory lock key

_ALEMBIC = threading.Lock()  # alembic's ``context``/``op`` are module globals: one at a time


@contextmanager
def migration_lock(engine: Engine) -> Iterator[None]:
    """Held while creating or upgrading a schema: in-process (alembic is not thread-safe) and,
    for a SQLite file, across processes with ``flock`` on its directory (PostgreSQL uses
    :func:`lock_schema` inside the transaction instead)."""
    with _ALEMBIC:
        database = engine.url.database
        if engine.dialect.name != "sqlite" or database in (None, "", ":memory:"):
            yield
            return
        # lock the database's directory: no lock file left behind, and never an fd on the
        # database file itself (closing one would drop SQLite's own POSIX locks)
        fd = os.open(Path(database).resolve().parent, os.O_RDONLY)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield
        finally:
            os.close(fd)  # releases the flock


def lock_schema(connection: Connection) -> None:
    """Serialise schema checks/upgrades of concurrent musku processes (PostgreSQL; held until
    the transaction ends). Two sweeps opening a brand-new database at once must not both
    create the tables."""
    if connection.dialect.name == "postgresql":
        connection.execute(text("SELECT pg_advisory_xact_lock(:key)"), {"key": MIGRATION_LOCK})


def check(connection: Connection, url_text: str | None) -> str | None:
    """Raise unless the database is at head. Returns the revision (None: empty database)."""
    rev = revision_of(connection)
    head = head_revision()
    if rev == head:
        return rev
    if rev is None:
        tables = user_tables(connection)
        if tables:
            raise DatabaseError(
                f"database has tables ({', '.join(sorted(tables)[:4])}...) but no musku schema "
                "revision: not a musku results database"
            )
        return None
    if rev not in known_revisions():
        raise SchemaOutOfDate(newer_message(rev, head))
    raise SchemaOutOfDate(
        f"database at revision {rev}, this musku needs {head}: {upgrade_hint(url_text)}"
    )


def upgrade_connection(connection: Connection, target: str = "head") -> tuple[str | None, str]:
    """Upgrade the database behind ``connection`` (committed by the caller)."""
    lock_schema(connection)
    before = revision_of(connection)
    if before is not None and before not in known_revisions():
        raise SchemaOutOfDate(newer_message(before, head_revision()))
    if before is None and user_tables(connection):
        raise DatabaseError("database has tables but no musku schema revision: not upgrading it")
    command.upgrade(alembic_config(connection), target)
    after = revision_of(connection)
    assert after is not None
    return before, after


def upgrade_engine(engine: Engine, target: str = "head") -> tuple[str | None, str]:
    try:
        with migration_lock(engine), engine.begin() as conn:
            return upgrade_connection(conn, target)
    except OSError as exc:
        raise DatabaseError(f"cannot lock {display(engine.url)} for the upgrade: {exc}") from None
    except SQLAlchemyError as exc:
        raise connect_error(engine, exc) from None


def _main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m musku.storage.migrate")
    sub = parser.add_subparsers(dest="cmd", required=True)
    up = sub.add_parser("upgrade")
    up.add_argument("--db", required=True)
    up.add_argument("target", nargs="?", default="head")
    rv = sub.add_parser("revision")
    rv.add_argument("--db", required=True)
    rv.add_argument("-m", "--message", required=True)
    args = parser.parse_args(argv)
    engine = make_engine(args.db)
    try:
        if args.cmd == "upgrade":
            before, after = upgrade_engine(engine, args.target)
            print(f"{before or '(empty)'} -> {after}")
        else:
            with engine.begin() as conn:
                command.revision(alembic_config(conn), message=args.message, autogenerate=True)
    except DatabaseError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 5
    finally:
        engine.dispose()
    return 0


if __name__ == "__main__":
    sys.exit(_main())
