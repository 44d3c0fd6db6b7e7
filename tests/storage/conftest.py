"""Fixtures of the storage suites: every backend-parametrised test runs on SQLite and on a
REAL PostgreSQL server started here with ``scripts/pg-test-server`` (one per session, one
fresh database per test). Without PostgreSQL binaries the PostgreSQL cases skip locally and
FAIL when ``CI`` is set, so CI can never pass without exercising PostgreSQL."""

from __future__ import annotations

import itertools
import os
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from musku.experiment import Experiment, load_experiment
from musku.storage import open_store
from musku.storage.store import Store

ROOT = Path(__file__).resolve().parents[2]
PG_SCRIPT = ROOT / "scripts" / "pg-test-server"
DATA = Path(__file__).resolve().parent / "data"

_db_numbers = itertools.count(1)


def _pg_binaries_present() -> bool:
    if os.environ.get("PG_BIN"):
        return (Path(os.environ["PG_BIN"]) / "initdb").exists()
    return (
        any(Path("/usr/lib/postgresql").glob("*/bin/initdb")) or shutil.which("initdb") is not None
    )


def _in_ci() -> bool:
    return os.environ.get("CI", "").lower() in ("1", "true", "yes")


@pytest.fixture(scope="session")
def pg_server() -> Iterator[str]:
    """URL of the maintenance database of a throwaway PostgreSQL server."""
    if not _pg_binaries_present():
        reason = "PostgreSQL server binaries not found (apt-get install postgresql, or PG_BIN)"
        if _in_ci():
            pytest.fail(f"CI=true but {reason}: the PostgreSQL contract suite must run in CI")
        pytest.skip(reason)
    workdir = tempfile.mkdtemp(prefix="musku-pg-")
    os.chmod(workdir, 0o755)  # the postgres user must reach it
    try:
        proc = subprocess.run(
            [str(PG_SCRIPT), "start", workdir],
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        if proc.returncode != 0:
            pytest.fail(f"scripts/pg-test-server start failed: {proc.stderr.strip()}")
        url = proc.stdout.strip().splitlines()[-1]
        yield url
    finally:
        subprocess.run([str(PG_SCRIPT), "stop", workdir], capture_output=True, timeout=120)
        shutil.rmtree(workdir, ignore_errors=True)


def fresh_pg_database(server_url: str) -> str:
    """CREATE DATABASE on the test server; returns its URL."""
    import psycopg

    base, _, _ = server_url.rpartition("/")
    name = f"t{os.getpid()}_{next(_db_numbers)}"
    libpq = server_url.replace("postgresql+psycopg://", "postgresql://")
    with psycopg.connect(libpq, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    return f"{base}/{name}"


BACKENDS = ["sqlite", pytest.param("postgresql", marks=pytest.mark.postgres)]


def empty_database(request: pytest.FixtureRequest, directory: Path) -> str:
    """URL of a new, empty database of the backend ``request.param``."""
    if request.param == "sqlite":
        return f"sqlite:///{directory / 'results.db'}"
    server: str = request.getfixturevalue("pg_server")
    return fresh_pg_database(server)


@pytest.fixture(params=BACKENDS)
def db_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """An empty database on each backend."""
    return empty_database(request, tmp_path)


@pytest.fixture
def store(db_url: str) -> Iterator[Store]:
    s = open_store(db_url)
    try:
        yield s
    finally:
        s.close()


@pytest.fixture(scope="session")
def experiment() -> Experiment:
    return load_experiment(DATA / "experiment.toml")
