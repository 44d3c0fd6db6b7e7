"""An experiment's comparisons (pairs of configurations measured against each other) and their
decisions. A repository of the results store (:mod:`musku.storage.core`); the
:class:`~musku.storage.store.Store` façade composes it.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import func, select, update
from sqlalchemy.orm import Session

from musku.domain import ComparisonResult, Configuration
from musku.errors import DatabaseError
from musku.storage import convert
from musku.storage.core import Repository, guard
from musku.storage.models import ComparisonRow, ConfigurationRow, DecisionRow, QueueRow, SampleRow
from musku.storage.records import ComparisonRecord, ComparisonStatus, InvalidTransition


class Comparisons(Repository):
    """An experiment's comparisons (pairs of configurations measured against each other) and their
    decisions."""

    @guard
    def start_comparison(
        self,
        exp_id: int,
        purpose: str,
        baseline: Configuration,
        candidate: Configuration,
        *,
        hosts: tuple[str, str] | None = None,
    ) -> int:
        """A new ``running`` comparison; ``purpose`` is e.g. 'knob:cdp', 'exhaustive',
        'search', 'validate:production', 'validate:stock'; ``hosts`` the pair it runs on
        (``host_a`` starts on the baseline)."""
        with self._session() as s, s.begin():
            self._experiment(s, exp_id)
            row = ComparisonRow(
                experiment_id=exp_id,
                purpose=purpose,
                baseline_id=self._config_id(s, baseline),
                candidate_id=self._config_id(s, candidate),
                status=ComparisonStatus.RUNNING.value,
                started_at=convert.now(),
                host_a=hosts[0] if hosts else None,
                host_b=hosts[1] if hosts else None,
            )
            s.add(row)
            s.flush()
            return row.id

    @guard
    def comparison_hosts(self, exp_id: int) -> dict[int, tuple[str | None, str | None]]:
        """Comparison id -> the pair of hosts it ran on (``(host_a, host_b)``; ``None`` for a
        comparison stored before revision 0006)."""
        with self._reader() as s:
            rows = s.execute(
                select(ComparisonRow.id, ComparisonRow.host_a, ComparisonRow.host_b).where(
                    ComparisonRow.experiment_id == exp_id
                )
            )
            return {r.id: (r.host_a, r.host_b) for r in rows}

    @guard
    def finish_comparison(self, cmp_id: int, result: ComparisonResult) -> None:
        """Record the decision; the comparison becomes ``finished`` (``aborted`` when the
        decision is ABORTED)."""
        with self._session() as s, s.begin():
            cmp = s.scalars(
                select(ComparisonRow).where(ComparisonRow.id == cmp_id).with_for_update()
            ).first()
            if cmp is None:
                raise DatabaseError(f"no comparison with id {cmp_id}")
            if cmp.status != ComparisonStatus.RUNNING.value:
                raise InvalidTransition(f"comparison {cmp_id} is already {cmp.status}")
            keys = {
                r.id: r.key
                for r in s.scalars(
                    select(ConfigurationRow).where(
                        ConfigurationRow.id.in_((cmp.baseline_id, cmp.candidate_id))
                    )
                )
            }
            if (keys[cmp.baseline_id], keys[cmp.candidate_id]) != (
                result.baseline.key(),
                result.candidate.key(),
            ):
                raise DatabaseError(
                    f"finish_comparison: comparison {cmp_id} compares {keys[cmp.baseline_id]} "
                    f"with {keys[cmp.candidate_id]}, the result {result.baseline.key()} with "
                    f"{result.candidate.key()}"
                )
            stamp = convert.now()
            if result.decision.final:  # an aborted comparison is not a result: no decision row
                s.add(
                    DecisionRow(
                        comparison_id=cmp_id, decided_at=stamp, **convert.decision_columns(result)
                    )
                )
            cmp.status = (
                ComparisonStatus.FINISHED.value
                if result.decision.final
                else ComparisonStatus.ABORTED.value
            )
            cmp.finished_at = stamp
        self._cmp_meta.pop(cmp_id, None)

    @guard
    def abort_running(self, exp_id: int, *, only: int | None = None) -> int:
        """Mark comparisons a crashed run left ``running`` as ``aborted`` (call on resume),
        except those a live claimer of the comparison queue is measuring; ``only``: just
        that comparison (a pool's failed pair, whoever claims it). Returns how many."""
        with self._session() as s, s.begin():
            # a comparison a live claimer of the queue is measuring (revision 0007) goes on
            live = select(QueueRow.comparison_id).where(
                QueueRow.experiment_id == exp_id,
                QueueRow.state == "claimed",
                QueueRow.expires_at >= convert.now(),
                QueueRow.comparison_id.is_not(None),
            )
            res = s.execute(
                update(ComparisonRow)
                .where(
                    ComparisonRow.experiment_id == exp_id,
                    ComparisonRow.status == ComparisonStatus.RUNNING.value,
                    *(
                        [ComparisonRow.id == only]
                        if only is not None
                        else [ComparisonRow.id.not_in(live)]
                    ),
                )
                .values(status=ComparisonStatus.ABORTED.value, finished_at=convert.now())
            )
            count = int(getattr(res, "rowcount", 0) or 0)
        self._cmp_meta.clear()
        return count

    def _comparison_records(
        self, s: Session, exp_id: int, *, finished_only: bool
    ) -> list[ComparisonRecord]:
        q = (
            select(ComparisonRow, DecisionRow)
            .outerjoin(DecisionRow, DecisionRow.comparison_id == ComparisonRow.id)
            .where(ComparisonRow.experiment_id == exp_id)
            .order_by(ComparisonRow.id)
        )
        if finished_only:
            q = q.where(ComparisonRow.status == ComparisonStatus.FINISHED.value)
        pairs = s.execute(q).all()
        ids = {c.baseline_id for c, _ in pairs} | {c.candidate_id for c, _ in pairs}
        configs = {
            r.id: self._configuration_of(s, r)
            for r in s.scalars(select(ConfigurationRow).where(ConfigurationRow.id.in_(ids)))
        }
        counts: dict[int, int] = {}
        if not finished_only and pairs:
            counts = {
                int(cid): int(n)
                for cid, n in s.execute(
                    select(SampleRow.comparison_id, func.count())
                    .where(SampleRow.comparison_id.in_([c.id for c, _ in pairs]))
                    .group_by(SampleRow.comparison_id)
                ).all()
            }
        out = []
        for cmp, dec in pairs:
            base, cand = configs[cmp.baseline_id], configs[cmp.candidate_id]
            started = convert.aware(cmp.started_at)
            assert started is not None
            out.append(
                ComparisonRecord(
                    id=cmp.id,
                    experiment_id=cmp.experiment_id,
                    purpose=cmp.purpose,
                    baseline=base,
                    candidate=cand,
                    status=ComparisonStatus(cmp.status),
                    started_at=started,
                    finished_at=convert.aware(cmp.finished_at),
                    result=convert.result_from_rows(base, cand, dec) if dec is not None else None,
                    sample_count=counts.get(cmp.id, 0),
                    hosts=(cmp.host_a, cmp.host_b) if cmp.host_a and cmp.host_b else None,
                )
            )
        return out

    @guard
    def comparisons(self, exp_id: int) -> list[ComparisonRecord]:
        """Every comparison of an experiment, oldest first, with decisions and sample counts."""
        with self._reader() as s:
            self._experiment(s, exp_id)
            return self._comparison_records(s, exp_id, finished_only=False)

    @guard
    def completed(self, exp_id: int) -> list[tuple[str, ComparisonResult]]:
        """(purpose, result) of every finished, non-aborted comparison, oldest first: what a
        resumed sweep does not need to measure again."""
        with self._reader() as s:
            self._experiment(s, exp_id)
            recs = self._comparison_records(s, exp_id, finished_only=True)
            return [(r.purpose, r.result) for r in recs if r.result is not None]

    @guard
    def decision_rows(self, exp_id: int) -> list[dict[str, Any]]:
        """One flat row per decision of the experiment (for exports): comparison id and
        purpose, both configurations' keys, and every ``decisions`` column."""
        with self._session() as s:
            self._experiment(s, exp_id)
            out = []
            for cmp, dec in s.execute(
                select(ComparisonRow, DecisionRow)
                .join(DecisionRow, DecisionRow.comparison_id == ComparisonRow.id)
                .where(ComparisonRow.experiment_id == exp_id)
                .order_by(ComparisonRow.id)
            ).all():
                row = {c.name: getattr(dec, c.key) for c in DecisionRow.__table__.columns}
                row["decided_at"] = convert.aware(dec.decided_at)
                row["purpose"] = cmp.purpose
                out.append(row)
            return out

    @guard
    def comparison_id_of(self, exp_id: int, purpose: str) -> int | None:
        """The newest finished comparison of experiment ``exp_id`` with that purpose."""
        with self._reader() as s:
            return s.scalars(
                select(ComparisonRow.id)
                .where(ComparisonRow.experiment_id == exp_id, ComparisonRow.purpose == purpose)
                .order_by(ComparisonRow.id.desc())
                .limit(1)
            ).first()
