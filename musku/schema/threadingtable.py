"""The threading decision table (``musku tune train``'s output, the mid-tier's
``--threading-table``), declared once as a pydantic model.

The model is the one source of truth: :func:`musku.tune.table.check_table` validates with it,
and its JSON Schema (:func:`json_schema`) is checked in as
``services/framework/schema/threading-table.schema.json``, which the C++ mid-tier embeds at
build time and validates every table against (``services/framework/src/table_schema.cc``)
before its own host checks. ``tests/tune/test_table_schema.py`` checks that the file is the
export and feeds the same invalid tables to both sides.

JSON Schema keywords used (the C++ validator knows these and no others): ``type``,
``const``, ``enum``, ``required``, ``properties``, ``additionalProperties``, ``items``,
``minItems``, ``minLength``, ``minimum``, ``maximum``, ``$ref`` to ``#/$defs/...``, plus
musku's ``x-increasing`` (the named field of an array's items strictly increases); an
``integer`` is written without a fraction (``2``, not ``2.0``, which JSON Schema would take).
Keys the
mid-tier does not read (``host``, ``created``, ``grid``...) are allowed: a table records its
training.
"""

from __future__ import annotations

import json
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from musku.cotune_spec import MODELS

TABLE_FORMAT = "musku-threading-table/1"
SCHEMA_PATH = "services/framework/schema/threading-table.schema.json"
"""Where the exported schema is checked in (relative to the repository)."""
MAX_POOL = 4096
"""Most threads a pool may have in a table (the mid-tier checks its own, smaller, maxima)."""
MAX_CPUS = 1 << 20

ModelName = Literal[MODELS]  # type: ignore[valid-type]


class _Base(BaseModel):
    model_config = ConfigDict(strict=True, extra="allow", frozen=True)


class TableRow(_Base):
    """A row: the threading configuration serving loads up to ``max_qps``."""

    max_qps: float = Field(ge=0, description="this row serves loads up to this QPS")
    model: ModelName = Field(description="the threading model, e.g. async-dispatch-block")
    pollers: int = Field(ge=0, le=MAX_POOL, description="poller threads")
    workers: int = Field(ge=0, le=MAX_POOL, description="worker threads")
    responders: int = Field(ge=0, le=MAX_POOL, description="responder threads")


class ThreadingTableDoc(_Base):
    """A threading decision table (docs/threading.md)."""

    model_config = ConfigDict(
        strict=True,
        extra="allow",
        frozen=True,
        title="musku threading decision table",
        json_schema_extra={
            "$schema": "https://json-schema.org/draft/2020-12/schema",
            "$id": "https://musku.dev/schema/threading-table.schema.json",
        },
    )

    format: Literal["musku-threading-table/1"] = Field(description="the format and its version")
    service: str = Field(min_length=1, description="the mid-tier it was trained for")
    cpus: int = Field(ge=1, le=MAX_CPUS, description="CPUs of the host it was trained on")
    leaf_transport: Literal["unary", "batch"] = Field(
        default="unary", description="the leaf transport it was trained over"
    )
    rows: list[TableRow] = Field(
        min_length=1,
        description="rows by increasing max_qps",
        json_schema_extra={"x-increasing": "max_qps"},
    )

    @model_validator(mode="after")
    def _increasing(self) -> ThreadingTableDoc:
        for i in range(1, len(self.rows)):
            if not self.rows[i].max_qps > self.rows[i - 1].max_qps:
                raise ValueError(f"rows[{i}].max_qps must be greater than rows[{i - 1}].max_qps")
        return self


def first_error(data: dict[str, Any]) -> str | None:
    """None when ``data`` (a parsed table) passes the schema, else one line for the first
    error: where (``rows[1].workers``) and why (``has no rows`` for an empty table)."""
    try:
        ThreadingTableDoc.model_validate(data)
    except ValidationError as exc:
        return _error_line(exc, data)
    return None


def _error_line(exc: ValidationError, data: dict[str, Any]) -> str:
    """One line for the first schema error: where (``rows[1].workers``) and why; a bad row
    is quoted."""
    err = exc.errors()[0]
    loc = err["loc"]
    at = "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in loc).lstrip(".")
    why = str(err["msg"]).removeprefix("Value error, ")
    if loc[:1] == ("rows",) and len(loc) == 1 and err["type"] == "too_short":
        return "has no rows"
    if len(loc) >= 2 and loc[0] == "rows" and isinstance(loc[1], int):
        return f"bad row {data['rows'][loc[1]]}: {at}: {why}"
    return f"{at}: {why}" if at else why


def json_schema() -> dict[str, Any]:
    """The table's JSON Schema, as checked in at :data:`SCHEMA_PATH`."""
    schema = ThreadingTableDoc.model_json_schema()
    # pydantic writes "default" for the optional key; keep it (validators ignore it)
    return schema


def schema_text() -> str:
    """The checked-in file's exact text."""
    return json.dumps(json_schema(), indent=2, sort_keys=True) + "\n"


if __name__ == "__main__":  # python -m musku.schema.threadingtable > SCHEMA_PATH
    print(schema_text(), end="")
