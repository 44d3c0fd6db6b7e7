"""A throwaway, real PostgreSQL server for tests: a pytest plugin.

Load it with ``pytest_plugins = ["musku.testing.postgres"]`` (in a ``conftest.py``); then

- ``pg_server`` (session): the URL of the maintenance database of a server started for the
  session (``initdb`` into a temporary directory, ``127.0.0.1`` on a free port, trust
  authentication, ``fsync=off``: throwaway data only), stopped and deleted at the end;
- ``postgres_url``: a fresh, empty database on it for each test (``fresh_pg_database``).

Binaries: ``$PG_BIN``, else the newest ``/usr/lib/postgresql/*/bin``, else ``PATH``. Run as
root, the server runs as the ``postgres`` user (PostgreSQL refuses root). Without the
binaries the fixtures skip, and fail when ``CI`` is set (a CI run must exercise PostgreSQL).
It does what ``scripts/pg-test-server`` does in musku's repository, for users who have only
the package.
"""

from __future__ import annotations

import itertools
import os
import shutil
import socket
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

_db_numbers = itertools.count(1)


def pg_bin() -> Path | None:
    """The directory of ``initdb``/``pg_ctl``, or None."""
    if os.environ.get("PG_BIN"):
        d = Path(os.environ["PG_BIN"])
        return d if (d / "initdb").exists() else None
    found = sorted(
        Path("/usr/lib/postgresql").glob("*/bin/initdb"),
        key=lambda p: [int(x) if x.isdigit() else 0 for x in p.parent.parent.name.split(".")],
    )
    if found:
        return found[-1].parent
    initdb = shutil.which("initdb")
    return Path(initdb).parent if initdb else None


def in_ci() -> bool:
    return os.environ.get("CI", "").lower() in ("1", "true", "yes")


class PostgresServer:
    """``initdb`` + ``pg_ctl start`` in ``workdir``; :meth:`stop` stops it."""

    def __init__(self, workdir: Path, *, bin_dir: Path, db: str = "musku") -> None:
        self.workdir, self.bin, self.db = workdir, bin_dir, db
        self.data = workdir / "data"
        self.url = ""

    def _run(self, *argv: str | Path, timeout: float = 120.0) -> subprocess.CompletedProcess[str]:
        cmd = [str(a) for a in argv]
        if os.geteuid() == 0:
            cmd = ["runuser", "-u", "postgres", "--", *cmd]
        return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, check=False)

    def start(self) -> str:
        self.workdir.mkdir(parents=True, exist_ok=True)
        os.chmod(self.workdir, 0o755)  # the postgres user must reach it
        if os.geteuid() == 0:
            shutil.chown(self.workdir, "postgres")
        init = self._run(self.bin / "initdb", "-D", self.data, "-U", "postgres", "-A", "trust",
                         "-E", "UTF8", "--no-sync")  # fmt: skip
        if init.returncode != 0:
            raise RuntimeError(f"initdb failed: {init.stderr.strip()[-300:]}")
        for _ in range(3):  # a free port may be taken between the probe and the start
            port = _free_port()
            opts = (f"-c listen_addresses=127.0.0.1 -p {port} -k {self.workdir} -c fsync=off "
                    "-c synchronous_commit=off -c full_page_writes=off -c max_connections=50 "
                    "-c shared_buffers=64MB")  # fmt: skip
            started = self._run(self.bin / "pg_ctl", "-D", self.data, "-l",
                                self.workdir / "server.log", "-w", "-t", "60", "-o", opts, "start")  # fmt: skip
            if started.returncode == 0:
                break
        else:
            log = (self.workdir / "server.log").read_text(errors="replace").strip()
            raise RuntimeError(f"PostgreSQL did not start: {log[-300:]}")
        made = self._run(self.bin / "createdb", "-h", "127.0.0.1", "-p", str(port),
                         "-U", "postgres", self.db)  # fmt: skip
        if made.returncode != 0:
            raise RuntimeError(f"createdb failed: {made.stderr.strip()[-300:]}")
        self.url = f"postgresql+psycopg://postgres@127.0.0.1:{port}/{self.db}"
        return self.url

    def stop(self) -> None:
        if self.data.is_dir():
            self._run(self.bin / "pg_ctl", "-D", self.data, "-m", "immediate", "-w", "stop")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def fresh_pg_database(server_url: str) -> str:
    """``CREATE DATABASE`` on the server; returns the new database's URL."""
    import psycopg  # the [postgres] extra; only PostgreSQL tests need it

    base, _, _ = server_url.rpartition("/")
    name = f"t{os.getpid()}_{next(_db_numbers)}"
    libpq = server_url.replace("postgresql+psycopg://", "postgresql://")
    with psycopg.connect(libpq, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    return f"{base}/{name}"


@pytest.fixture(scope="session")
def pg_server() -> Iterator[str]:
    """URL of the maintenance database of a throwaway PostgreSQL server (one per session)."""
    bin_dir = pg_bin()
    if bin_dir is None:
        reason = "PostgreSQL server binaries not found (apt-get install postgresql, or PG_BIN)"
        if in_ci():
            pytest.fail(f"CI=true but {reason}: the PostgreSQL contract suite must run in CI")
        pytest.skip(reason)
    workdir = Path(tempfile.mkdtemp(prefix="musku-pg-"))
    server = PostgresServer(workdir, bin_dir=bin_dir)
    try:
        try:
            url = server.start()
        except (RuntimeError, OSError, subprocess.TimeoutExpired) as exc:
            pytest.fail(f"the throwaway PostgreSQL server did not start: {exc}")
        yield url
    finally:
        server.stop()
        shutil.rmtree(workdir, ignore_errors=True)


@pytest.fixture
def postgres_url(pg_server: str) -> str:
    """A fresh, empty database on the session's server."""
    return fresh_pg_database(pg_server)
