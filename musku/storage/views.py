"""The analysts' wide ``configurations`` view, generated from the knob specs.

Configurations are stored as generic rows (``configuration_keys`` + ``configuration_settings``,
one row per knob). Analysts' SQL reads the view ``configurations``: one row per configuration,
``id``, ``key`` and the columns each knob's spec declares
(:attr:`musku.knob_spec.KnobSpec.view_columns`: ``core_freq``, ``core_turbo``, ...,
``cdp_data_ways``...), exactly the columns the table had before revision 0004, so queries
written against it keep working. An out-of-tree knob adds its own columns: the Store
regenerates the view when it first stores a configuration with a knob the view lacks.

The SQL is plain and per dialect only where it must be (splitting ``D:C``); it is the same
statement on every musku process, so concurrent regenerations agree.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Iterable, Sequence

from sqlalchemy import text
from sqlalchemy.engine import Connection

from musku.knob_spec import BUILTIN, Column, Kind, KnobSpec, is_knob, sort_key, spec_of

log = logging.getLogger(__name__)

VIEW = "configurations"
BASE_COLUMNS = ("id", "key")
_SQL_TYPES = {"float": "DOUBLE PRECISION", "int": "INTEGER", "text": "TEXT", "bool": "BOOLEAN"}
_NAME = re.compile(r"[a-z][a-z0-9_]{0,62}")


def _literal(value: str) -> str:
    return "'" + value.replace("'", "''") + "'"


def column_sql(column: Column, alias: str, dialect: str) -> str:
    """The SQL expression of one view column, reading the knob's row ``alias``."""
    v, n = f"{alias}.value", f"{alias}.number"
    src = column.source
    if src == "number":
        return n if column.type == "float" else f"CAST({n} AS {_SQL_TYPES[column.type]})"
    if src == "text":
        return v
    if src.startswith("is:"):
        return f"({v} = {_literal(src[3:])})"
    if src in ("part:0", "part:1"):
        if dialect == "postgresql":
            part = f"split_part({v}, ':', {int(src[5:]) + 1})"
            found = f"strpos({v}, ':') > 0"
        else:
            part = (
                f"substr({v}, 1, instr({v}, ':') - 1)"
                if src == "part:0"
                else f"substr({v}, instr({v}, ':') + 1)"
            )
            found = f"instr({v}, ':') > 0"
        return f"CASE WHEN {found} THEN CAST({part} AS INTEGER) END"
    raise ValueError(f"column {column.name!r}: unknown source {src!r}")


def fallback_spec(name: str) -> KnobSpec:
    """A knob found in the database but not registered in this process: one text column."""
    return KnobSpec(name=name, kind=Kind.CHOICE)


def view_specs(stored: Iterable[str] = ()) -> list[KnobSpec]:
    """The knobs the view shows: the built-ins and every knob with stored rows, in sweep
    order (a stored knob this process does not know shows as one text column)."""
    names = set(BUILTIN)
    names.update(k for k in stored if _NAME.fullmatch(k))
    known = sorted((n for n in names if is_knob(n)), key=sort_key)
    unknown = sorted(n for n in names if not is_knob(n))
    return [spec_of(n) for n in known] + [fallback_spec(n) for n in unknown]


def create_view_sql(specs: Sequence[KnobSpec], dialect: str) -> str:
    """``CREATE VIEW configurations AS ...`` for ``specs``."""
    cols = ["k.id AS id", "k.key AS key"]
    joins = []
    seen = set(BASE_COLUMNS)
    for i, spec in enumerate(specs):
        alias = f"s{i}"
        added = False
        for col in spec.view_columns:
            if col.name in seen or not _NAME.fullmatch(col.name):
                log.warning(
                    "knob %s: view column %r skipped (taken or invalid)", spec.name, col.name
                )
                continue
            seen.add(col.name)
            cols.append(f"{column_sql(col, alias, dialect)} AS {col.name}")
            added = True
        if added:
            joins.append(
                f"LEFT JOIN configuration_settings {alias} "
                f"ON {alias}.configuration_id = k.id AND {alias}.knob = {_literal(spec.name)}"
            )
    select = ",\n    ".join(cols)
    return f"CREATE VIEW {VIEW} AS\nSELECT\n    {select}\nFROM configuration_keys k\n" + "\n".join(
        joins
    )


def view_columns(conn: Connection) -> set[str]:
    """The columns the database's ``configurations`` view has now."""
    result = conn.execute(text(f"SELECT * FROM {VIEW} WHERE 1 = 0"))
    return set(result.keys())


def stored_knobs(conn: Connection) -> list[str]:
    return [r[0] for r in conn.execute(text("SELECT DISTINCT knob FROM configuration_settings"))]


def regenerate(conn: Connection) -> None:
    """Drop and create the view again from the specs and the stored knobs (in the caller's
    transaction)."""
    sql = create_view_sql(view_specs(stored_knobs(conn)), conn.dialect.name)
    conn.execute(text(f"DROP VIEW IF EXISTS {VIEW}"))
    conn.execute(text(sql))


def covers(columns: set[str], knobs: Iterable[str]) -> bool:
    """True when a view with ``columns`` shows every one of ``knobs``."""
    for knob in knobs:
        try:
            spec = spec_of(knob)
        except KeyError:
            spec = fallback_spec(knob)
        if not any(c.name in columns for c in spec.view_columns):
            return False
    return True
