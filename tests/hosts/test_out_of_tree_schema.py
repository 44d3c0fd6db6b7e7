"""An out-of-tree backend's ``[hosts]`` options are an input-file kind with no edit to musku:
once ``tests/hosts/toybackend.py`` is registered, ``musku schema`` knows ``hosts-toy`` (its
options model as a JSON Schema, bounds included) and the experiment schema offers it as one of
the ``[hosts]`` tables (docs/architecture.md, "Registries")."""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest

from musku.registry import BACKENDS
from musku.schema import json_schema, kinds
from tests.hosts.toybackend import TARGET


@pytest.fixture
def toy() -> Iterator[None]:
    assert "hosts-toy" not in kinds()
    BACKENDS.register(TARGET)
    yield
    BACKENDS.unregister("toy")


def test_a_registered_backend_is_a_schema_kind(toy: None) -> None:
    assert "hosts-toy" in kinds()
    schema = json_schema("hosts-toy")
    props = schema["properties"]
    assert set(props) >= {"backend", "speedup", "noise"}
    assert props["speedup"]["minimum"] == 0.0 and props["speedup"]["maximum"] == 1.0
    assert props["noise"]["maximum"] == 0.5


def test_the_experiment_schema_offers_its_hosts_table(toy: None) -> None:
    text = json.dumps(json_schema("experiment"))
    assert '"toy"' in text and "how much faster THP" in text
