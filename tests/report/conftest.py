"""Fixtures of the report tests: a results DB holding a real sweep on simulated hosts."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from musku.experiment import load_experiment
from musku.storage import open_store
from musku.storage.store import Store
from musku.sweep import run_sweep
from tests.fixtures.toy import EXPERIMENT, MODEL

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="session")
def toy_db(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, Path]:
    """(URL, experiment file) of an SQLite DB with one finished independent toy sweep."""
    d = tmp_path_factory.mktemp("toydb")
    (d / "toy-model.toml").write_text(MODEL)
    exp = d / "toy.toml"
    exp.write_text(EXPERIMENT.format(name="toy", mode="independent"))
    url = f"sqlite:///{d}/results.db"
    with open_store(url) as store:
        run_sweep(load_experiment(exp), store=store)
    return url, exp


@pytest.fixture(scope="session")
def web_db(tmp_path_factory: pytest.TempPathFactory) -> str:
    """URL of an SQLite DB holding the shipped Web/Skylake sweep (34-37 comparisons)."""
    url = f"sqlite:///{tmp_path_factory.mktemp('webdb')}/results.db"
    with open_store(url) as store:
        run_sweep(load_experiment(ROOT / "experiments" / "web-skylake.toml"), store=store)
    return url


@pytest.fixture
def store(toy_db: tuple[str, Path]) -> Iterator[Store]:
    with open_store(toy_db[0]) as s:
        yield s
