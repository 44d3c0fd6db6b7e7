"""Explicit conversion between :mod:`musku.domain` values and storage rows."""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Mapping, Sequence
from datetime import UTC, datetime
from typing import Any

from musku.domain import (
    ComparisonResult,
    Configuration,
    Decision,
    PairCalibration,
    TimeBreakdown,
)
from musku.errors import DatabaseError
from musku.knob_spec import KnobSpec
from musku.storage.models import (
    SAMPLE_METRIC_COLUMNS,
    ConfigurationRow,
    DecisionRow,
    PairCalibrationRow,
)

SAMPLE_COLUMNS: tuple[str, ...] = (
    "comparison_id",
    "seq",
    "host",
    "t",
    "role",
    "period",
    "warmup",
    "valid",
    "value",
    *SAMPLE_METRIC_COLUMNS,
    "extra",
)
"""Column order of bulk sample inserts (``samples`` table)."""


def now() -> datetime:
    return datetime.now(UTC)


def aware(value: datetime | None) -> datetime | None:
    """SQLite gives naive datetimes back; everything musku stores is UTC."""
    if value is None:
        return None
    return value if value.tzinfo is not None else value.replace(tzinfo=UTC)


def jsonable(value: Any) -> Any:
    """A deep copy made of JSON types only (TOML dates and paths become strings)."""
    return json.loads(json.dumps(value, default=str))


def configuration_columns(config: Configuration) -> dict[str, Any]:
    """A ``configuration_keys`` row: the canonical key (the knob values are rows of their own,
    :func:`configuration_settings`)."""
    return {"key": config.key()}


def configuration_settings(config: Configuration) -> list[dict[str, Any]]:
    """One ``configuration_settings`` row per knob (see db/README.md), without the id."""
    return [
        {"knob": knob, "value": KnobSpec.db_text(v), "number": KnobSpec.db_number(v)}
        for knob, v in config.settings
    ]


def configuration_from_row(row: ConfigurationRow) -> Configuration:
    return Configuration.from_key(row.key)


def decision_columns(result: ComparisonResult) -> dict[str, Any]:
    return {
        "decision": result.decision.value,
        "estimate": float(result.estimate),
        "ci_low": float(result.ci_low),
        "ci_high": float(result.ci_high),
        "samples": int(result.samples),
        "host_time_s": float(result.host_time_s),
        "reason": result.reason,
        "method": result.method,
        "guardrail_values": jsonable(dict(result.guardrail_values)),
        "threading_a": result.threading.get("A"),
        "threading_b": result.threading.get("B"),
        **time_columns(result.time),
    }


TIME_COLUMNS = ("time_measuring_s", "time_warmup_s", "time_switching_s", "time_reboot_s")
"""``decisions``' columns of a :class:`TimeBreakdown` (revision 0009), in its order."""


def time_columns(time: TimeBreakdown | None) -> dict[str, float | None]:
    """A comparison's time breakdown as ``decisions`` columns (all NULL: none recorded)."""
    values = (None,) * 4 if time is None else tuple(_num(x) for x in time.seconds())
    return dict(zip(TIME_COLUMNS, values, strict=True))


def time_from_row(row: Any) -> TimeBreakdown | None:
    """The breakdown stored in a ``decisions`` row (None: not recorded)."""
    values = [getattr(row, c, None) for c in TIME_COLUMNS]
    nums = [float(v) for v in values if v is not None]
    if len(nums) != len(TIME_COLUMNS):
        return None
    return TimeBreakdown(*nums)


def result_from_rows(
    baseline: Configuration, candidate: Configuration, row: DecisionRow
) -> ComparisonResult:
    threading = {}
    if row.threading_a is not None:
        threading["A"] = row.threading_a
    if row.threading_b is not None:
        threading["B"] = row.threading_b
    return ComparisonResult(
        baseline=baseline,
        candidate=candidate,
        decision=Decision(row.decision),
        estimate=row.estimate,
        ci_low=row.ci_low,
        ci_high=row.ci_high,
        samples=row.samples,
        host_time_s=row.host_time_s,
        reason=row.reason,
        guardrail_values={str(k): float(v) for k, v in (row.guardrail_values or {}).items()},
        threading=threading,
        method=row.method,
        time=time_from_row(row),
    )


def _num(value: Any) -> float | None:
    if value is None:
        return None
    f = float(value)
    return None if f != f else f  # NaN -> NULL on both backends


_FIXED = frozenset(SAMPLE_METRIC_COLUMNS)


def _host_index(host: Any, host_index: Mapping[str, int]) -> int:
    if host in host_index:
        return host_index[host]
    if isinstance(host, str) and not host.isdigit():
        known = ", ".join(sorted(host_index)) or "none recorded: call add_hosts first"
        raise ValueError(f"unknown host {host!r} (the experiment's hosts: {known})")
    return int(host)


_EMPTY: Mapping[str, Any] = {}


def sample_tuples(
    comparison_id: int,
    metric: str,
    rows: Sequence[Mapping[str, Any]],
    host_index: Mapping[str, int],
    encode_extra: Callable[[dict[str, float | None]], Any] = json.dumps,
) -> list[tuple[Any, ...]]:
    """Rows given to ``Store.add_samples`` -> tuples in :data:`SAMPLE_COLUMNS` order.

    ``host`` is the host's index in the pair (or its name, mapped through ``host_index``).
    NaN metric values are stored as NULL on both backends. Metrics without a column of their
    own go to ``extra``, encoded by ``encode_extra``. This loop is the Python half of the
    ingest path (bench/db_ingest.py), hence written out by hand."""
    out: list[tuple[Any, ...]] = []
    append = out.append
    fixed = _FIXED
    nfixed = len(_FIXED)
    i = 0
    try:
        for i, r in enumerate(rows):  # noqa: B007 (i is used in the error messages)
            m = r.get("metrics") or _EMPTY
            mg = m.get
            host = r["host"]
            if host.__class__ is not int:
                host = _host_index(host, host_index)
            role = r["role"]
            if role != "A" and role != "B":
                raise ValueError(f"role must be 'A' or 'B', not {role!r}")
            extra = None
            if len(m) > nfixed or not fixed.issuperset(m):
                extra = encode_extra({k: _num(v) for k, v in m.items() if k not in fixed})
            v = mg(metric)
            mips = mg("mips")
            qps = mg("qps")
            p99 = mg("p99_ms")
            qos = mg("qos_violation_rate")
            power = mg("power_w")
            append(
                (
                    comparison_id,
                    int(r["seq"]),
                    host,
                    float(r["t"]),
                    role,
                    int(r.get("period", 0)),
                    bool(r.get("warmup", False)),
                    bool(r.get("valid", True)),
                    None if v is None or v != v else float(v),
                    None if mips is None or mips != mips else float(mips),
                    None if qps is None or qps != qps else float(qps),
                    None if p99 is None or p99 != p99 else float(p99),
                    None if qos is None or qos != qos else float(qos),
                    None if power is None or power != power else float(power),
                    extra,
                )
            )
    except KeyError as exc:
        raise DatabaseError(
            f"sample row {i} of comparison {comparison_id} has no {exc.args[0]!r} "
            "(rows need seq, t, host, role; host names must be the experiment's hosts)"
        ) from None
    except (TypeError, ValueError, AttributeError) as exc:
        raise DatabaseError(f"sample row {i} of comparison {comparison_id}: {exc}") from None
    return out


def sample_dict(row: Mapping[Any, Any]) -> dict[str, Any]:
    """A ``samples`` row -> the dict shape ``Store.add_samples`` takes."""
    metrics: dict[str, float] = {}
    for name in SAMPLE_METRIC_COLUMNS:
        v = row[name]
        if v is not None:
            metrics[name] = float(v)
    extra = row["extra"]
    if isinstance(extra, str):
        extra = json.loads(extra)
    if extra:
        metrics.update({k: v for k, v in extra.items() if v is not None})
    return {
        "seq": int(row["seq"]),
        "t": float(row["t"]),
        "host": int(row["host"]),
        "role": row["role"],
        "period": int(row["period"]),
        "warmup": bool(row["warmup"]),
        "valid": bool(row["valid"]),
        "value": None if row["value"] is None else float(row["value"]),
        "metrics": metrics,
    }


def calibration_columns(cal: PairCalibration) -> dict[str, Any]:
    """A ``pair_calibrations`` row from a :class:`PairCalibration`."""
    return {
        "pair": cal.pair,
        "hardware": cal.hardware,
        "metric": cal.metric,
        "bias": float(cal.bias),
        "ci_low": float(cal.ci_low),
        "ci_high": float(cal.ci_high),
        "samples": int(cal.samples),
        "taken_at": cal.taken_at,
        "needs_recalibration": bool(cal.needs_recalibration),
        "note": cal.note,
        "noise_lrv": _finite(cal.noise_lrv),
        "noise_df": _finite(cal.noise_df) if cal.noise_df > 0 else None,
        "window_s": _finite(cal.window_s),
        "wander_sd": _finite(cal.wander_sd),
        "wander_tau_s": _finite(cal.wander_tau_s),
    }


def _finite(x: float) -> float | None:
    """A float column's value: NULL for NaN / inf (not measured)."""
    return float(x) if math.isfinite(x) else None


def calibration_from_row(row: PairCalibrationRow) -> PairCalibration:
    taken = aware(row.taken_at)
    assert taken is not None
    return PairCalibration(
        pair=row.pair,
        hardware=row.hardware,
        metric=row.metric,
        bias=row.bias,
        ci_low=row.ci_low,
        ci_high=row.ci_high,
        samples=row.samples,
        taken_at=taken,
        needs_recalibration=bool(row.needs_recalibration),
        note=row.note or "",
        id=row.id,
        noise_lrv=math.nan if row.noise_lrv is None else float(row.noise_lrv),
        noise_df=0.0 if row.noise_df is None else float(row.noise_df),
        window_s=math.nan if row.window_s is None else float(row.window_s),
        wander_sd=math.nan if row.wander_sd is None else float(row.wander_sd),
        wander_tau_s=math.nan if row.wander_tau_s is None else float(row.wander_tau_s),
    )
