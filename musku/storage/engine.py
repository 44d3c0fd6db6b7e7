"""Engines for the two supported backends, and SQLAlchemy errors turned into one-line
:class:`~musku.errors.DatabaseError` messages that never show a password."""

from __future__ import annotations

import os
import re
import sqlite3
import time
from typing import TYPE_CHECKING, Any
from urllib.parse import quote

from sqlalchemy import create_engine, event
from sqlalchemy.engine import make_url
from sqlalchemy.exc import ArgumentError, NoSuchModuleError
from sqlalchemy.pool import StaticPool

from musku.errors import BadDatabaseURL, DatabaseError

if TYPE_CHECKING:
    from sqlalchemy.engine import URL, Engine

SUPPORTED = ("sqlite", "postgresql")

_PASSWORD_IN_URL = re.compile(r"(://[^:/@\s]*:)[^@\s]*@")


def redact(text: str) -> str:
    """``postgresql://u:secret@h/db`` -> ``postgresql://u:***@h/db`` anywhere in ``text``."""
    return _PASSWORD_IN_URL.sub(r"\1***@", text)


def parse_url(url: str) -> URL:
    """Parse and check a database URL; ``postgresql://`` means psycopg 3."""
    try:
        parsed = make_url(url)
    except (ArgumentError, ValueError):
        hint = (
            f"for that SQLite file: sqlite:///{url}"
            if url.strip() and "://" not in url and " " not in url.strip()
            else "use sqlite:///path/results.db or postgresql://user@host:port/dbname"
        )
        raise BadDatabaseURL(f"not a database URL: {redact(url)!r} ({hint})") from None
    backend = parsed.get_backend_name()
    if backend not in SUPPORTED:
        raise DatabaseError(
            f"unsupported database {backend!r} in {redact(url)!r}: musku stores results in "
            "sqlite or postgresql"
        )
    if parsed.drivername in ("postgresql", "postgres"):
        parsed = parsed.set(drivername="postgresql+psycopg")
    elif backend == "postgresql" and parsed.drivername != "postgresql+psycopg":
        raise DatabaseError(
            f"unsupported PostgreSQL driver {parsed.get_driver_name()!r} in {redact(url)!r}: "
            "musku uses psycopg 3 (postgresql:// or postgresql+psycopg://)"
        )
    elif backend == "sqlite" and parsed.drivername != "sqlite":
        raise DatabaseError(
            f"unsupported SQLite driver {parsed.get_driver_name()!r} in {redact(url)!r}: "
            "use sqlite:///path/results.db"
        )
    return parsed


def display(url: URL | str) -> str:
    """A URL safe to print (password hidden)."""
    if isinstance(url, str):
        return redact(url)
    return url.render_as_string(hide_password=True)


def _sqlite_pragmas(dbapi_conn: Any, _record: Any) -> None:
    # let SQLAlchemy's "begin" event issue BEGIN itself: pysqlite would otherwise run DDL
    # outside any transaction, so a failed migration could leave half a schema behind
    dbapi_conn.isolation_level = None
    cur = dbapi_conn.cursor()
    try:
        cur.execute("PRAGMA foreign_keys=ON")
        cur.execute("PRAGMA busy_timeout=30000")
        cur.execute("PRAGMA cache_size=-32768")  # 32 MiB page cache (grown lazily): bulk ingest
        mode = cur.execute("PRAGMA journal_mode").fetchone()
        if mode and str(mode[0]).lower() != "memory":
            if str(mode[0]).lower() != "wal":
                _switch_to_wal(cur)
            cur.execute("PRAGMA synchronous=NORMAL")  # per connection
    finally:
        cur.close()


def _switch_to_wal(cur: Any, timeout_s: float = 30.0) -> None:
    """Put a database into WAL mode (a property of the file: the first connection to do it
    wins). Switching needs the file to itself, and SQLite reports "database is locked" at once,
    without its busy timeout, while another connection of a brand-new file is in a transaction
    (several sweeps opening one new database together): retry until the mode is WAL."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            row = cur.execute("PRAGMA journal_mode=WAL").fetchone()
        except sqlite3.OperationalError as exc:
            if "locked" not in str(exc) or time.monotonic() > deadline:
                raise
            time.sleep(0.005)
            continue
        if row and str(row[0]).lower() == "wal" or time.monotonic() > deadline:
            return
        time.sleep(0.005)  # still locked by another connection (some versions answer "delete")


def _read_only_sqlite(path: str) -> Any:
    """A connection that can only read the SQLite file at ``path``: ``mode=ro``, so nothing is
    created or written, not even the file. A WAL database whose ``-shm`` cannot be created
    (a read-only directory, or a file the user may not write) is opened ``immutable=1`` when
    it has no write-ahead log pending; with one, it cannot be read consistently: refused."""
    uri = "file:" + quote(os.path.abspath(path))
    if not os.path.exists(path):
        raise sqlite3.OperationalError(f"no such file: {path}")
    conn = sqlite3.connect(uri + "?mode=ro", uri=True, check_same_thread=False)
    try:
        conn.execute("SELECT count(*) FROM sqlite_master").fetchone()
        return conn
    except sqlite3.OperationalError as exc:
        conn.close()
        if "readonly" not in str(exc) and "unable to open" not in str(exc):
            raise
    wal = path + "-wal"
    if os.path.exists(wal) and os.path.getsize(wal) > 0:
        raise sqlite3.OperationalError(
            f"its write-ahead log {wal} is pending and the directory is read-only: "
            "read it where it can be written, or checkpoint it first"
        )
    return sqlite3.connect(uri + "?immutable=1", uri=True, check_same_thread=False)


def make_engine(url: str, *, read_only: bool = False) -> Engine:
    """An engine for ``url`` (not yet connected). Raises DatabaseError for bad URLs.

    ``read_only``: an engine for commands that only read (``results``, ``report``, ``sku
    show``...). On SQLite it opens the file read-only (``mode=ro``; see
    :func:`_read_only_sqlite`), so a read-only file or directory serves them and a missing
    file is not created; it never switches the journal mode. Every transaction begins
    deferred."""
    parsed = parse_url(url)
    kwargs: dict[str, Any] = {}
    if parsed.get_backend_name() == "sqlite":
        if parsed.database in (None, "", ":memory:"):
            # one shared connection, or every checkout would see a fresh empty DB
            kwargs.update(poolclass=StaticPool, connect_args={"check_same_thread": False})
        elif read_only:
            path = str(parsed.database)
            kwargs["creator"] = lambda: _read_only_sqlite(path)
    else:
        kwargs.update(pool_pre_ping=True)
        if "connect_timeout" not in parsed.query:
            # a black-holed host fails in seconds, not after the kernel's TCP timeout
            kwargs["connect_args"] = {"connect_timeout": 10}
    try:
        engine = create_engine(parsed, **kwargs)
    except NoSuchModuleError:
        raise DatabaseError(
            f"unknown database driver {parsed.drivername!r} in {display(parsed)!r}"
        ) from None
    except ImportError as exc:
        raise DatabaseError(
            f"the driver for {parsed.drivername!r} is not installed ({exc.name}): "
            "pip install 'musku[postgres]'"
        ) from None
    except ArgumentError as exc:
        raise DatabaseError(f"bad database URL {display(parsed)!r}: {exc}") from None
    if parsed.get_backend_name() == "sqlite":
        if read_only:
            event.listen(engine, "connect", _sqlite_read_only_pragmas)
            event.listen(engine, "begin", _sqlite_begin_deferred)
        else:
            event.listen(engine, "connect", _sqlite_pragmas)
            event.listen(engine, "begin", _sqlite_begin)
    elif read_only:
        event.listen(engine, "connect", _postgres_read_only)
    return engine


def _sqlite_read_only_pragmas(dbapi_conn: Any, _record: Any) -> None:
    dbapi_conn.isolation_level = None  # BEGIN issued by the "begin" event, as for writers
    cur = dbapi_conn.cursor()
    try:
        cur.execute("PRAGMA busy_timeout=30000")
        cur.execute("PRAGMA query_only=ON")
    finally:
        cur.close()


def _sqlite_begin_deferred(conn: Any) -> None:
    conn.exec_driver_sql("BEGIN")


def _postgres_read_only(dbapi_conn: Any, _record: Any) -> None:
    dbapi_conn.read_only = True  # psycopg 3: every transaction READ ONLY


READ_ONLY = "musku_read_only"
"""Execution option marking a connection whose transactions only read (see :func:`reader`)."""


def reader(engine: Engine) -> Engine:
    """The same engine (same pool) for transactions that only read: on SQLite they begin
    deferred, so readers never queue behind a writer (WAL lets them read beside it)."""
    return engine.execution_options(**{READ_ONLY: True})


def _sqlite_begin(conn: Any) -> None:
    # A deferred BEGIN takes the write lock only at the first write; if another connection
    # holds it then, SQLite answers "database is locked" at once, without waiting for the busy
    # timeout (waiting could deadlock two read-then-write transactions), and in WAL mode a
    # snapshot older than the last commit can never be upgraded at all. So every transaction
    # that may write takes the write lock up front (BEGIN IMMEDIATE), where the busy timeout
    # applies: concurrent sweeps on one file queue for a few milliseconds instead of failing.
    if conn.get_execution_options().get(READ_ONLY):
        conn.exec_driver_sql("BEGIN")
    else:
        conn.exec_driver_sql("BEGIN IMMEDIATE")


def first_line(exc: BaseException) -> str:
    """The driver's own first line of an exception, without SQLAlchemy's decorations."""
    orig = getattr(exc, "orig", None)
    text = str(orig if orig is not None else exc)
    for line in text.splitlines():
        line = line.strip()
        if line:
            return redact(line)
    return type(exc).__name__


def connect_error(engine: Engine, exc: BaseException) -> DatabaseError:
    message = first_line(exc)
    password = engine.url.password
    if password:
        message = message.replace(str(password), "***")
    return DatabaseError(f"cannot open database {display(engine.url)}: {message}")
