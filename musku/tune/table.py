"""Threading decision tables as files: the format the mid-tier reads (``--threading auto
--threading-table PATH``), written atomically and checked with the rules the C++ side applies.
Light on purpose (no numpy, no scipy): the agent and the co-tuner check tables without the
training code (:mod:`musku.tune.train`)."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from musku import outputs
from musku.cotune_spec import MODELS
from musku.errors import InputError

TABLE_FORMAT = "musku-threading-table/1"


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
    """The C++ side's rules on a parsed table: format, service, CPU count (``cpus``, default
    this host's: another count means the table is stale), the leaf transport it was trained
    over (when ``leaf_transport`` is given; none recorded = unary), increasing rows of known
    models."""
    name = f"threading table {where}" if not where.startswith("threading table") else where
    here = cpus if cpus is not None else os.cpu_count()
    if not isinstance(data, dict) or data.get("format") != TABLE_FORMAT:
        raise InputError(f"{name} has no format {TABLE_FORMAT!r}")
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
    rows = data.get("rows")
    if not isinstance(rows, list) or not rows:
        raise InputError(f"{name} has no rows")
    prev = -1.0
    for r in rows:
        if (
            not isinstance(r, dict)
            or r.get("model") not in MODELS
            or not isinstance(r.get("max_qps"), int | float)
            or not r["max_qps"] > prev
            or not all(isinstance(r.get(k), int) for k in ("pollers", "workers", "responders"))
        ):
            raise InputError(f"{name}: bad row {r}")
        prev = r["max_qps"]
    return data
