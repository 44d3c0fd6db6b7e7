"""Threading tables have one source of truth: the pydantic model
(``musku.schema.threadingtable``), exported as JSON Schema to
``services/framework/schema/threading-table.schema.json``, which the C++ mid-tier embeds and
validates against. The checked-in file is the export; the same invalid tables are refused by
musku's ``check_table``, by the exported schema itself (``jsonschema``), and by the mid-tier's
loader (``threading_table_check``, built with the framework; skipped where absent)."""

from __future__ import annotations

import copy
import json
import os
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from musku.errors import InputError
from musku.schema.threadingtable import SCHEMA_PATH, json_schema, schema_text
from musku.tune.table import TABLE_FORMAT, check_table

ROOT = Path(__file__).resolve().parents[2]
CPUS = os.cpu_count() or 1

VALID: dict[str, Any] = {
    "format": "musku-threading-table/1",
    "service": "fan",
    "cpus": CPUS,
    "host": "trained-here",  # keys the mid-tier does not read are allowed
    "rows": [
        {"max_qps": 50, "model": "sync-inline-block", "pollers": 1, "workers": 0,
         "responders": 0, "loads": [20], "p99_us": 210.5},
        {"max_qps": 1e9, "model": "async-dispatch-block", "pollers": 1, "workers": 2,
         "responders": 1},
    ],
}  # fmt: skip


def _set(path: str, value: Any) -> Callable[[dict[str, Any]], None]:
    def apply(d: dict[str, Any]) -> None:
        *parents, last = path.split(".")
        target: Any = d
        for p in parents:
            target = target[int(p)] if p.isdigit() else target[p]
        if value is _DROP:
            del target[int(last) if last.isdigit() else last]
        else:
            target[int(last) if last.isdigit() else last] = value

    return apply


_DROP = object()

INVALID: dict[str, Callable[[dict[str, Any]], None]] = {
    "format missing": _set("format", _DROP),
    "format other": _set("format", "musku-threading-table/2"),
    "service missing": _set("service", _DROP),
    "service empty": _set("service", ""),
    "service a number": _set("service", 7),
    "cpus a string": _set("cpus", str(CPUS)),
    "cpus a float": _set("cpus", float(CPUS)),
    "cpus zero": _set("cpus", 0),
    "cpus true": _set("cpus", True),
    "transport unknown": _set("leaf_transport", "stream"),
    "transport null": _set("leaf_transport", None),
    "rows missing": _set("rows", _DROP),
    "rows empty": _set("rows", []),
    "rows an object": _set("rows", {"max_qps": 1}),
    "row not an object": _set("rows.0", "sync-inline-block"),
    "row model unknown": _set("rows.0.model", "sync-inline-spin"),
    "row model missing": _set("rows.1.model", _DROP),
    "row workers missing": _set("rows.1.workers", _DROP),
    "row workers a float": _set("rows.1.workers", 2.0),
    "row workers a bool": _set("rows.1.workers", True),
    "row workers negative": _set("rows.1.workers", -1),
    "row pollers huge": _set("rows.0.pollers", 5000),
    "row max_qps a string": _set("rows.0.max_qps", "50"),
    "row max_qps negative": _set("rows.0.max_qps", -5),
    "rows not increasing": _set("rows.1.max_qps", 50),
    "rows decreasing": _set("rows.1.max_qps", 10),
}


def _table(name: str) -> dict[str, Any]:
    d = copy.deepcopy(VALID)
    INVALID[name](d)
    return d


def _binary() -> Path | None:
    build = Path(os.environ.get("MUSKU_SERVICES_BUILD", ROOT / "services" / "build"))
    exe = build / "framework" / "threading_table_check"
    return exe if exe.is_file() and os.access(exe, os.X_OK) else None


def _cxx(tmp: Path, table: dict[str, Any]) -> tuple[bool, str]:
    exe = _binary()
    if exe is None:
        pytest.skip("threading_table_check not built (scripts/build-services)")
    path = tmp / "table.json"
    path.write_text(json.dumps(table))
    out = subprocess.run([str(exe), str(path), "fan"], capture_output=True, text=True, timeout=60)
    assert out.returncode in (0, 3), out.stderr
    return out.returncode == 0, out.stdout.strip()


def _python(table: dict[str, Any]) -> tuple[bool, str]:
    try:
        check_table(table, "fan", cpus=CPUS, leaf_transport="unary")
    except InputError as exc:
        return False, exc.one_line()
    return True, "ok"


def test_the_checked_in_schema_is_the_models_export() -> None:
    assert (ROOT / SCHEMA_PATH).read_text() == schema_text(), (
        f"regenerate: python -m musku.schema.threadingtable > {SCHEMA_PATH}"
    )


def test_the_light_constant_is_the_schemas() -> None:
    assert json_schema()["properties"]["format"]["const"] == TABLE_FORMAT


def test_the_valid_table_passes_everywhere(tmp_path: Path) -> None:
    assert _python(VALID) == (True, "ok")
    jsonschema = pytest.importorskip("jsonschema")
    jsonschema.Draft202012Validator(json_schema()).validate(VALID)
    if _binary() is not None:
        assert _cxx(tmp_path, VALID) == (True, "ok")


@pytest.mark.parametrize("case", sorted(INVALID))
def test_python_refuses_in_one_line(case: str) -> None:
    ok, why = _python(_table(case))
    assert not ok and "\n" not in why and why.startswith("threading table"), why


@pytest.mark.parametrize("case", sorted(INVALID))
def test_the_exported_schema_refuses_the_same(case: str) -> None:
    jsonschema = pytest.importorskip("jsonschema")
    if case in ("rows not increasing", "rows decreasing"):
        pytest.skip("x-increasing is musku's keyword (the two validators of musku check it)")
    if case in ("cpus a float", "row workers a float"):
        pytest.skip("JSON Schema's integer takes 2.0; musku's two validators want 2")
    errors = list(jsonschema.Draft202012Validator(json_schema()).iter_errors(_table(case)))
    assert errors


@pytest.mark.services
@pytest.mark.parametrize("case", sorted(INVALID))
def test_the_mid_tier_refuses_the_same(tmp_path: Path, case: str) -> None:
    ok, why = _cxx(tmp_path, _table(case))
    assert not ok and why.startswith("threading table"), why


@pytest.mark.services
@settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    st.sampled_from(
        ["format", "service", "cpus", "leaf_transport", "rows.0.max_qps", "rows.0.model",
         "rows.1.pollers", "rows.1.workers", "rows.1.responders", "rows.1.max_qps", "rows.0"]
    ),
    st.one_of(
        st.none(), st.booleans(), st.integers(-3, 5000), st.floats(-10, 2e9),
        st.sampled_from(["", "fan", "unary", "batch", "async-inline-poll", "x"]),
        st.lists(st.integers(0, 3), max_size=2),
    ),
)  # fmt: skip
def test_both_sides_agree_on_any_one_change(tmp_path: Path, key: str, value: Any) -> None:
    """Whatever one key is changed to, the mid-tier accepts the table exactly when musku
    does (the rules in the model the schema does not carry, the service and CPU count, are
    the same table's here; pool sizes that the model forbids for a threading model are the
    mid-tier's own check)."""
    table = copy.deepcopy(VALID)
    _set(key, value)(table)
    py_ok, py_why = _python(table)
    cxx_ok, cxx_why = _cxx(tmp_path, table)
    if py_ok and not cxx_ok and cxx_why.split(": ", 1)[1].startswith("row "):
        return  # ValidateThreading: a model's own pool rules (dispatch needs workers...)
    assert py_ok == cxx_ok, (py_why, cxx_why)
