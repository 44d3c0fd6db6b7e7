"""Fixtures of the storage suites: every backend-parametrised test runs on SQLite and on a
REAL PostgreSQL server started by musku.testing.postgres (one per session, one
fresh database per test). Without PostgreSQL binaries the PostgreSQL cases skip locally and
FAIL when ``CI`` is set, so CI can never pass without exercising PostgreSQL."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from musku.experiment import Experiment, load_experiment
from musku.storage import open_store
from musku.storage.store import Store
from musku.testing.postgres import fresh_pg_database, pg_server  # noqa: F401 - fixtures
from musku.testing.storage import EXPERIMENT

ROOT = Path(__file__).resolve().parents[2]
DATA = Path(__file__).resolve().parent / "data"


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
    return load_experiment(EXPERIMENT)
