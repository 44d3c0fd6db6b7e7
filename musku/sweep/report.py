"""Plain (JSON-able) forms of results, shared by the CLI's --json output and the report."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from musku.domain import ComparisonResult, SoftSku

if TYPE_CHECKING:
    from musku.sweep.runner import SweepReport


def result_dict(r: ComparisonResult) -> dict[str, Any]:
    return {
        "baseline": r.baseline.as_dict(),
        "candidate": r.candidate.as_dict(),
        "changed": {k: [a, b] for k, (a, b) in r.baseline.diff(r.candidate).items()},
        "decision": r.decision.value,
        "estimate": r.estimate,
        "ci_low": r.ci_low,
        "ci_high": r.ci_high,
        "samples": r.samples,
        "host_time_s": r.host_time_s,
        "reason": r.reason,
        "method": r.method,
        "guardrail_values": dict(r.guardrail_values),
        "threading": dict(r.threading),
    }


def sku_dict(sku: SoftSku) -> dict[str, Any]:
    return {
        "service": sku.service,
        "platform": sku.platform,
        "configuration": sku.configuration.as_dict(),
        "vs_production": result_dict(sku.vs_production) if sku.vs_production else None,
        "vs_stock": result_dict(sku.vs_stock) if sku.vs_stock else None,
    }


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
