"""Threading decision tables as files: the format the mid-tier reads (``--threading auto
--threading-table PATH``), written atomically and checked against the schema the C++ side
validates with too (:mod:`musku.schema.threadingtable`, the one source of truth).
Light on purpose (no numpy, no scipy): the agent and the co-tuner check tables without the
training code (:mod:`musku.tune.train`)."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from musku import outputs
from musku.errors import InputError

TABLE_FORMAT = "musku-threading-table/1"
"""The schema's ``format`` (tests/tune/test_table_schema.py checks that they agree)."""


def service_name(service: str) -> str:
    """The name the mid-tier reports (and checks in a table)."""
    return {"setalgebra": "setalgebra"}.get(service, service)


def write_table(table: dict[str, Any], path: Path) -> None:
    """Written atomically, only over a regular file or a new path (musku/outputs.py)."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise InputError(f"cannot write {path}: {exc.strerror or exc}") from None
    outputs.write_text(path, json.dumps(table, indent=2) + "\n")


def validate_table(path: Path, service: str, *, cpus: int | None = None) -> dict[str, Any]:
    """Read a table back with the rules the C++ side applies; InputError with the reason."""
    try:
        data = json.loads(Path(path).read_text())
    except (OSError, ValueError) as e:
        raise InputError(f"threading table {path} is unreadable or corrupt: {e}") from e
    return check_table(data, service, cpus=cpus, where=str(path))


def check_table(
    data: Any,
    service: str,
    *,
    cpus: int | None = None,
    leaf_transport: str | None = None,
    where: str = "threading table",
) -> dict[str, Any]:
    """The C++ side's rules on a parsed table: the schema both sides validate against
    (:class:`musku.schema.threadingtable.ThreadingTableDoc`: format, types, known models,
    pool sizes, rows of increasing ``max_qps``), then the host's: service, CPU count
    (``cpus``, default this host's: another count means the table is stale), the leaf
    transport it was trained over (when ``leaf_transport`` is given; none recorded =
    unary)."""
    name = f"threading table {where}" if not where.startswith("threading table") else where
    here = cpus if cpus is not None else os.cpu_count()
    if not isinstance(data, dict) or data.get("format") != TABLE_FORMAT:
        raise InputError(f"{name} has no format {TABLE_FORMAT!r}")
    # lazy: pydantic and the model cost ~0.3 s to import, and the agent imports this module at
    # start (through the co-tuner) but checks a table only when it co-tunes
    from musku.schema.threadingtable import first_error

    why = first_error(data)
    if why is not None:
        raise InputError(f"{name} {why}" if why == "has no rows" else f"{name}: {why}")
    if data.get("service") != service_name(service):
        raise InputError(f"{name} is for {data.get('service')!r}, not {service!r}")
    if data.get("cpus") != here:
        raise InputError(
            f"{name} is stale: trained on {data.get('cpus')} CPUs, this host has {here}"
        )
    trained = data.get("leaf_transport") or "unary"
    if leaf_transport is not None and trained != leaf_transport:
        raise InputError(
            f"{name} is stale: trained with leaf transport {trained!r}, the mid-tier uses "
            f"{leaf_transport!r}"
        )
    return data
