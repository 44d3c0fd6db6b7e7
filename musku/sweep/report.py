"""Plain (JSON-able) forms of results, shared by the CLI's --json output and the report."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from musku.domain import ComparisonResult, SoftSku
from musku.storage.records import result_to_dict, softsku_to_dict

if TYPE_CHECKING:
    from musku.sweep.runner import SweepReport


def result_dict(r: ComparisonResult) -> dict[str, Any]:
    """The stored JSON form of a result, plus the knobs it changed."""
    return {
        **result_to_dict(r),
        "changed": {k: [a, b] for k, (a, b) in r.baseline.diff(r.candidate).items()},
    }


def sku_dict(sku: SoftSku) -> dict[str, Any]:
    return softsku_to_dict(sku)


def report_dict(rep: SweepReport) -> dict[str, Any]:
    return {
        "experiment": rep.experiment,
        "experiment_id": rep.experiment_id,
        "mode": rep.mode,
        "baseline": rep.baseline.as_dict(),
        "best": rep.best.as_dict(),
        "knobs": [
            {
                "knob": o.knob,
                "baseline": o.baseline_value,
                "best": o.best_value,
                "pruned": o.pruned,
                "skipped": o.skipped,
                "comparisons": [result_dict(r) for r in o.results],
            }
            for o in rep.knobs
        ],
        "soft_sku": sku_dict(rep.sku) if rep.sku else None,
        "comparisons": rep.comparisons,
        "measured": rep.measured,
        "host_time_s": rep.host_time_s,
    }
