"""Plain (JSON-able) forms of results and soft SKUs, shared by the CLI's ``--json`` output and
the sweep runner (a JSON helper, not a report: it was ``musku/sweep/report.py``)."""

from __future__ import annotations

from typing import Any

from musku.domain import ComparisonResult, SoftSku
from musku.storage.records import result_to_dict, softsku_to_dict


def result_dict(r: ComparisonResult) -> dict[str, Any]:
    """The stored JSON form of a result, plus the knobs it changed."""
    return {
        **result_to_dict(r),
        "changed": {k: [a, b] for k, (a, b) in r.baseline.diff(r.candidate).items()},
    }


def sku_dict(sku: SoftSku) -> dict[str, Any]:
    return softsku_to_dict(sku)
