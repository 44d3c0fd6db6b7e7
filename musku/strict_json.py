"""JSON every strict parser accepts: no ``NaN``, ``Infinity`` or ``-Infinity``.

Python's :func:`json.dumps` writes non-finite floats as the bare words ``NaN`` and ``Infinity``,
which are not JSON (RFC 8259): ``JSON.parse``, ``jq`` and most typed parsers reject them. musku's
``--json`` outputs and exports encode a non-finite number as ``null`` instead (documented in
docs/cli.md): an unbounded interval end (``ci_low = -inf`` of a guardrail decision) and an
estimate not yet available (NaN) both read as "no value".
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from datetime import date, datetime
from enum import Enum
from typing import Any


def finite(data: Any) -> Any:
    """``data`` with every non-finite float replaced by None (containers copied, recursively);
    tuples become lists, enums their values, datetimes ISO strings."""
    if isinstance(data, float):
        return data if math.isfinite(data) else None
    if isinstance(data, bool | int | str) or data is None:
        return data
    if isinstance(data, Mapping):
        return {str(k): finite(v) for k, v in data.items()}
    if isinstance(data, list | tuple | set | frozenset):
        return [finite(v) for v in data]
    if isinstance(data, Enum):
        return finite(data.value)
    if isinstance(data, datetime | date):
        return data.isoformat()
    if hasattr(data, "item") and callable(data.item):  # numpy scalars
        try:
            return finite(data.item())
        except (TypeError, ValueError):
            pass
    return str(data)


def dumps(data: Any, **kwargs: Any) -> str:
    """:func:`json.dumps` of :func:`finite` ``(data)``; raises if anything non-finite slips by."""
    return json.dumps(finite(data), allow_nan=False, **kwargs)


def _refuse(name: str) -> Any:
    raise ValueError(f"not strict JSON: {name}")


def loads_strict(text: str) -> Any:
    """Parse JSON refusing ``NaN``/``Infinity`` (what the tests and a strict consumer do)."""
    return json.loads(text, parse_constant=_refuse)
