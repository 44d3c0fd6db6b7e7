"""``musku results ID --format csv|parquet|json``: an experiment's comparisons, decisions or
samples as a file, streamed.

Samples are read in batches (:meth:`musku.storage.store.Store.sample_batches`: a server-side
cursor on PostgreSQL) and written batch by batch -- CSV rows, JSON array items, Parquet row
groups (pyarrow's ``ParquetWriter``) -- so a million samples never sit in memory at once.

Conventions: JSON is strict (a non-finite number is ``null``); CSV writes an absent value as an
empty field and infinities as ``inf``/``-inf``; booleans are ``true``/``false`` in CSV and JSON
and booleans in Parquet; timestamps are ISO 8601 UTC; ``extra`` (metrics without a column of
their own) is a JSON object (a JSON string in CSV and Parquet).
"""

from __future__ import annotations

import csv
import io
import json
import sys
from collections.abc import Callable, Iterable, Iterator
from datetime import datetime
from pathlib import Path
from typing import IO, Any, Protocol

from musku import outputs
from musku.domain import format_value
from musku.errors import InputError
from musku.storage.protocols import ComparisonStore, SampleStore
from musku.strict_json import finite

FORMATS = ("csv", "parquet", "json")
TABLES = ("comparisons", "decisions", "samples")
BATCH_ROWS = 50_000

# column -> pyarrow type name; the order is the files' column order
COMPARISON_COLUMNS: dict[str, str] = {
    "comparison_id": "int64",
    "purpose": "string",
    "status": "string",
    "changed": "string",
    "baseline": "string",
    "candidate": "string",
    "decision": "string",
    "estimate": "float64",
    "ci_low": "float64",
    "ci_high": "float64",
    "samples": "int64",
    "host_time_s": "float64",
    "sample_count": "int64",
    "started_at": "timestamp",
    "finished_at": "timestamp",
    "reason": "string",
    "method": "string",
}
DECISION_COLUMNS: dict[str, str] = {
    "id": "int64",
    "comparison_id": "int64",
    "purpose": "string",
    "decision": "string",
    "estimate": "float64",
    "ci_low": "float64",
    "ci_high": "float64",
    "samples": "int64",
    "host_time_s": "float64",
    "reason": "string",
    "method": "string",
    "guardrail_values": "json",
    "threading_a": "string",
    "threading_b": "string",
    "decided_at": "timestamp",
}
SAMPLE_COLUMNS: dict[str, str] = {
    "comparison_id": "int64",
    "seq": "int64",
    "host": "int64",
    "t": "float64",
    "role": "string",
    "period": "int64",
    "warmup": "bool",
    "valid": "bool",
    "value": "float64",
    "mips": "float64",
    "qps": "float64",
    "p99_ms": "float64",
    "qos_violation_rate": "float64",
    "power_w": "float64",
    "extra": "json",
}


class Exported(ComparisonStore, SampleStore, Protocol):
    """What an export reads: comparisons and decisions, and samples in batches."""


def _comparison_rows(store: ComparisonStore, exp_id: int) -> Iterator[tuple[Any, ...]]:
    for c in store.comparisons(exp_id):
        r = c.result
        changed = "; ".join(
            f"{k} {format_value(k, a) if a is not None else '-'} -> "
            f"{format_value(k, b) if b is not None else '-'}"
            for k, (a, b) in c.baseline.diff(c.candidate).items()
        )
        yield (
            c.id,
            c.purpose,
            c.status.value,
            changed,
            c.baseline.key(),
            c.candidate.key(),
            r.decision.value if r else None,
            r.estimate if r else None,
            r.ci_low if r else None,
            r.ci_high if r else None,
            r.samples if r else None,
            r.host_time_s if r else None,
            c.sample_count,
            c.started_at,
            c.finished_at,
            r.reason if r else None,
            r.method if r else None,
        )


def batches(
    store: Exported, exp_id: int, table: str
) -> tuple[dict[str, str], Iterator[list[tuple[Any, ...]]]]:
    """(columns, batches of row tuples) of ``table`` for the experiment."""
    if table == "samples":
        cols = SAMPLE_COLUMNS
        return cols, store.sample_batches(exp_id, columns=list(cols), batch_rows=BATCH_ROWS)
    if table == "decisions":
        cols = DECISION_COLUMNS
        rows = [tuple(d.get(k) for k in cols) for d in store.decision_rows(exp_id)]
        return cols, iter([rows])
    cols = COMPARISON_COLUMNS
    return cols, iter([list(_comparison_rows(store, exp_id))])


def _cell(kind: str, v: Any) -> Any:
    """A value as the JSON/CSV forms take it."""
    if v is None:
        return None
    if kind == "bool":
        return bool(v)
    if kind == "timestamp":
        return v.isoformat() if isinstance(v, datetime) else str(v)
    if kind == "json":
        return json.loads(v) if isinstance(v, str) else v
    return v


def write(
    store: Exported,
    exp_id: int,
    table: str,
    fmt: str,
    out: Path | None,
    *,
    stdout: IO[bytes] | None = None,
) -> int:
    """Export ``table`` of experiment ``exp_id`` as ``fmt`` to ``out`` (written atomically, only
    over a regular file or a new path) or to standard output (``out`` None or ``-``). Returns
    the number of rows."""
    if fmt not in FORMATS:
        raise InputError(f"--format {fmt!r}: choose one of {', '.join(FORMATS)}")
    if table not in TABLES:
        raise InputError(f"--table {table!r}: choose one of {', '.join(TABLES)}")
    cols, parts = batches(store, exp_id, table)
    writer: Callable[[dict[str, str], Iterable[list[tuple[Any, ...]]], IO[bytes]], int] = {
        "csv": _csv,
        "json": _json,
        "parquet": _parquet,
    }[fmt]
    if out is None or outputs.is_stdout(out):
        sink = stdout if stdout is not None else sys.stdout.buffer
        if fmt == "parquet" and sink.isatty():
            raise InputError("Parquet is binary: give -o FILE (or redirect the output)")
        return writer(cols, parts, sink)
    return _atomic(out, lambda f: writer(cols, parts, f))


def _atomic(out: Path, body: Callable[[IO[bytes]], int]) -> int:
    """Written atomically, only over a regular file or a new path (musku/outputs.py)."""
    return outputs.write_atomic(out, body)


def _csv(cols: dict[str, str], parts: Iterable[list[tuple[Any, ...]]], sink: IO[bytes]) -> int:
    text = io.TextIOWrapper(sink, encoding="utf-8", newline="", write_through=True)
    w = csv.writer(text, lineterminator="\n")
    w.writerow(cols)
    kinds = list(cols.values())
    n = 0

    def fmt(kind: str, v: Any) -> Any:
        v = _cell(kind, v)
        if v is None:
            return ""
        if kind == "bool":
            return "true" if v else "false"
        if kind == "json":
            return json.dumps(finite(v), allow_nan=False)
        return v

    for part in parts:
        w.writerows([fmt(k, v) for k, v in zip(kinds, row, strict=True)] for row in part)
        n += len(part)
    text.flush()
    text.detach()
    return n


def _json(cols: dict[str, str], parts: Iterable[list[tuple[Any, ...]]], sink: IO[bytes]) -> int:
    """A JSON array of objects, one line each, written as the rows arrive."""
    names = list(cols)
    kinds = list(cols.values())
    n = 0
    sink.write(b"[")
    for part in parts:
        chunk = []
        for row in part:
            obj = {k: _cell(kind, v) for k, kind, v in zip(names, kinds, row, strict=True)}
            chunk.append(("\n" if n == 0 else ",\n") + json.dumps(finite(obj), allow_nan=False))
            n += 1
        sink.write("".join(chunk).encode("utf-8"))
    sink.write(b"\n]\n" if n else b"]\n")
    return n


def _parquet(cols: dict[str, str], parts: Iterable[list[tuple[Any, ...]]], sink: IO[bytes]) -> int:
    # lazy: pyarrow (~0.3 s) only for --format parquet
    import pyarrow as pa
    import pyarrow.parquet as pq

    types = {
        "int64": pa.int64(),
        "float64": pa.float64(),
        "string": pa.string(),
        "bool": pa.bool_(),
        "json": pa.string(),
        "timestamp": pa.timestamp("us", tz="UTC"),
    }
    schema = pa.schema([(k, types[v]) for k, v in cols.items()])
    names, kinds = list(cols), list(cols.values())
    n = 0
    with pq.ParquetWriter(sink, schema, compression="zstd") as writer:
        for part in parts:
            if not part:
                continue
            arrays = []
            for j, kind in enumerate(kinds):
                column = [row[j] for row in part]
                if kind == "json":
                    column = [
                        None if v is None else v if isinstance(v, str) else json.dumps(finite(v))
                        for v in column
                    ]
                elif kind == "bool":
                    column = [None if v is None else bool(v) for v in column]
                elif kind == "float64":
                    column = [None if v is None else float(v) for v in column]
                arrays.append(pa.array(column, type=schema.field(names[j]).type))
            writer.write_batch(pa.record_batch(arrays, schema=schema))  # one row group a batch
            n += len(part)
    return n
