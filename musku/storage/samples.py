"""Measurement windows of running comparisons: bulk ingest (binary COPY on PostgreSQL), warm-up
marks, and reading them back (whole or streamed in batches). A repository of the results store
(:mod:`musku.storage.core`); the :class:`~musku.storage.store.Store` façade composes it.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from typing import Any

from sqlalchemy import select, update
from sqlalchemy.exc import SQLAlchemyError

from musku.errors import DatabaseError
from musku.storage import convert
from musku.storage.core import Repository, guard
from musku.storage.engine import first_line
from musku.storage.models import ComparisonRow, HostRow, SampleRow
from musku.storage.records import ComparisonStatus

_PG_SAMPLE_TYPES = [
    "int4",  # comparison_id
    "int4",  # seq
    "int2",  # host
    "float8",  # t
    "varchar",  # role
    "int4",  # period
    "bool",  # warmup
    "bool",  # valid
    "float8",  # value
    "float8",  # mips
    "float8",  # qps
    "float8",  # p99_ms
    "float8",  # qos_violation_rate
    "float8",  # power_w
    "jsonb",  # extra
]
"""Binary COPY types of :data:`musku.storage.convert.SAMPLE_COLUMNS`, in order."""


class Samples(Repository):
    """Measurement windows of running comparisons: bulk ingest (binary COPY on PostgreSQL), warm-
    up marks, and reading them back (whole or streamed in batches)."""

    def _meta(self, cmp_id: int) -> tuple[str, dict[str, int]]:
        meta = self._cmp_meta.get(cmp_id)
        if meta is None:
            with self._reader() as s:
                cmp = self._comparison(s, cmp_id)
                if cmp.status != ComparisonStatus.RUNNING.value:
                    raise DatabaseError(f"comparison {cmp_id} is {cmp.status}; it takes no samples")
                exp = self._experiment(s, cmp.experiment_id)
                hosts = {
                    h.name: h.idx
                    for h in s.scalars(select(HostRow).where(HostRow.experiment_id == exp.id))
                }
                meta = (exp.metric, hosts)
            self._cmp_meta[cmp_id] = meta
        return meta

    @guard
    def add_samples(self, cmp_id: int, rows: Sequence[Mapping[str, Any]]) -> int:
        """Bulk-insert measurement windows: ``{seq, t, host, role, period, warmup, valid,
        metrics: {name: value}}`` each (host = index in the pair, or its name). Uses COPY on
        PostgreSQL and one executemany on SQLite. Returns the number of rows stored."""
        if not rows:
            return 0
        metric, hosts = self._meta(cmp_id)
        cols = ", ".join(convert.SAMPLE_COLUMNS)
        with self.engine.begin() as conn:
            if self.dialect == "postgresql":
                import psycopg.types.json  # lazy: the [postgres] extra, PostgreSQL only

                tuples = convert.sample_tuples(
                    cmp_id, metric, rows, hosts, psycopg.types.json.Jsonb
                )
                raw = conn.connection.driver_connection
                assert raw is not None
                try:
                    with (
                        raw.cursor() as cur,
                        cur.copy(f"COPY samples ({cols}) FROM STDIN (FORMAT BINARY)") as copy,
                    ):
                        copy.set_types(_PG_SAMPLE_TYPES)
                        write = copy.write_row
                        for t in tuples:
                            write(t)
                except psycopg.Error as exc:
                    conn.rollback()
                    raise DatabaseError(f"add_samples: {first_line(exc)}") from None
            else:
                tuples = convert.sample_tuples(cmp_id, metric, rows, hosts)
                marks = ", ".join("?" for _ in convert.SAMPLE_COLUMNS)
                conn.exec_driver_sql(f"INSERT INTO samples ({cols}) VALUES ({marks})", tuples)
        return len(tuples)

    @guard
    def mark_warmup(
        self, cmp_id: int, seqs: Sequence[int], *, hosts: Sequence[int] | None = None
    ) -> int:
        """Set ``warmup`` on the windows ``seqs`` (both hosts, or only ``hosts``: one pair of
        a comparison pooled over several) of a running comparison: the A/B driver's windows
        that went out as steady and were dropped later as warm-up (a longer transient
        measured at a later swap). Returns the number of rows changed."""
        if not seqs:
            return 0
        self._meta(cmp_id)  # a running comparison, as for add_samples
        changed = 0
        todo = sorted({int(q) for q in seqs})
        with self.engine.begin() as conn:
            for i in range(0, len(todo), 500):  # within SQLite's bound-parameter limit
                stmt = (
                    update(SampleRow)
                    .where(SampleRow.comparison_id == cmp_id)
                    .where(SampleRow.seq.in_(todo[i : i + 500]))
                )
                if hosts is not None:
                    stmt = stmt.where(SampleRow.host.in_([int(h) for h in hosts]))
                res = conn.execute(stmt.values(warmup=True))
                changed += int(res.rowcount or 0)
        return changed

    @guard
    def samples(self, cmp_id: int) -> list[dict[str, Any]]:
        """A comparison's samples in ``(host, seq)`` order, shaped like ``add_samples`` rows
        (plus ``value``, the experiment's primary metric)."""
        with self._reader_engine.connect() as conn:
            result = conn.execute(
                select(SampleRow.__table__)
                .where(SampleRow.comparison_id == cmp_id)
                .order_by(SampleRow.host, SampleRow.seq)
            )
            return [convert.sample_dict(r) for r in result.mappings()]

    def sample_batches(
        self,
        exp_id: int,
        *,
        comparison_ids: Sequence[int] | None = None,
        columns: Sequence[str] | None = None,
        batch_rows: int = 50_000,
    ) -> Iterator[list[tuple[Any, ...]]]:
        """An experiment's samples (or those of ``comparison_ids``) as lists of at most
        ``batch_rows`` tuples of ``columns`` (default: every column of ``samples``), in
        ``(comparison_id, seq, host)`` order -- the primary key's, so nothing is sorted.

        Streams: a server-side cursor on PostgreSQL, the cursor's own fetches on SQLite;
        memory stays at one batch however many samples there are."""
        table = SampleRow.__table__
        names = list(columns) if columns is not None else [c.name for c in table.columns]
        unknown = [n for n in names if n not in table.c]
        if unknown:
            raise DatabaseError(f"sample_batches: no column {', '.join(unknown)} in samples")
        q = select(*(table.c[n] for n in names))
        if comparison_ids is not None:
            q = q.where(table.c.comparison_id.in_(list(comparison_ids)))
        else:
            q = q.where(
                table.c.comparison_id.in_(
                    select(ComparisonRow.id).where(ComparisonRow.experiment_id == exp_id)
                )
            )
        q = q.order_by(table.c.comparison_id, table.c.seq, table.c.host)
        try:
            with self.engine.connect() as conn:
                result = conn.execution_options(stream_results=True, yield_per=batch_rows).execute(
                    q
                )
                for part in result.partitions(batch_rows):
                    yield [tuple(r) for r in part]
        except SQLAlchemyError as exc:
            raise DatabaseError(f"sample_batches: {first_line(exc)}") from None
