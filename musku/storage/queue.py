"""The comparison queue (revision 0007, PostgreSQL only): several controllers and ``musku worker``
processes share a sweep's comparisons through ``SELECT ... FOR UPDATE SKIP LOCKED`` claims with
leases. A repository of the results store (:mod:`musku.storage.core`); the
:class:`~musku.storage.store.Store` façade composes it.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import timedelta
from typing import Any

from sqlalchemy import and_, func, or_, select, update
from sqlalchemy.dialects.postgresql import insert
from sqlalchemy.exc import SQLAlchemyError

from musku.domain import ComparisonResult, Configuration, ExperimentStatus
from musku.errors import DatabaseError, UnsupportedError
from musku.storage import convert
from musku.storage.comparisons import Comparisons
from musku.storage.core import Core, Repository, abort_measuring, guard
from musku.storage.engine import first_line
from musku.storage.models import (
    ComparisonRow,
    ConfigurationRow,
    DecisionRow,
    ExperimentRow,
    QueueRow,
)
from musku.storage.records import (
    ClaimInfo,
    ComparisonStatus,
    InvalidTransition,
    QueueItem,
    QueueState,
)


class Queue(Repository):
    """The comparison queue (revision 0007, PostgreSQL only): several controllers and ``musku
    worker`` processes share a sweep's comparisons through ``SELECT ... FOR UPDATE SKIP
    LOCKED`` claims with leases."""

    def __init__(self, core: Core, comparisons: Comparisons) -> None:
        super().__init__(core)
        self._comparisons = comparisons

    @property
    def shared(self) -> bool:
        """True on PostgreSQL: several controllers and ``musku worker`` processes share a sweep
        through the comparison queue. SQLite runs one controller per experiment."""
        return self.dialect == "postgresql"

    def need_queue(self) -> None:
        """Raise :class:`~musku.errors.UnsupportedError` (one line) unless the queue is
        :attr:`shared` (PostgreSQL)."""
        if not self.shared:
            raise UnsupportedError(
                f"the comparison queue needs PostgreSQL ({self.url} is SQLite, which runs one "
                "controller per experiment): use --db postgresql+psycopg://..."
            )

    @guard
    def enqueue(
        self,
        exp_id: int,
        purpose: str,
        baseline: Configuration,
        candidate: Configuration,
        seed: int,
    ) -> int:
        """The queue row of this comparison of the experiment, added ``queued`` if it is not
        there yet (``INSERT ... ON CONFLICT DO NOTHING``): several controllers asking for the
        same comparison get the same row. Returns its id."""
        self.need_queue()
        with self._session() as s, s.begin():
            b, c = self._config_id(s, baseline), self._config_id(s, candidate)
            s.execute(
                insert(QueueRow)
                .values(
                    experiment_id=exp_id,
                    purpose=purpose,
                    baseline_id=b,
                    candidate_id=c,
                    seed=seed,
                    state="queued",
                    attempts=0,
                    enqueued_at=convert.now(),
                )
                .on_conflict_do_nothing(constraint="uq_comparison_queue_comparison")
            )
            found = s.scalar(
                select(QueueRow.id).where(
                    QueueRow.experiment_id == exp_id,
                    QueueRow.purpose == purpose,
                    QueueRow.baseline_id == b,
                    QueueRow.candidate_id == c,
                )
            )
            assert found is not None
            return int(found)

    @guard
    def claim_queued(
        self, exp_id: int, claimer: str, *, lease_s: float, prefer: int | None = None
    ) -> QueueItem | None:
        """Claim one comparison of a running experiment's queue for ``claimer`` (``prefer``
        first when it is claimable), or None: a ``queued`` row, or a ``claimed`` one whose
        claim expired (its claimer died: the comparison it left half-measured is aborted and
        measured again). ``SELECT ... FOR UPDATE SKIP LOCKED``: concurrent claimers never wait
        on each other nor get the same row. The claim lasts ``lease_s``; renew it with
        :meth:`beat_queued`."""
        self.need_queue()
        with self._session() as s, s.begin():
            stamp = convert.now()
            running = select(ExperimentRow.id).where(
                ExperimentRow.id == exp_id, ExperimentRow.status == ExperimentStatus.RUNNING.value
            )
            q = select(QueueRow).where(
                QueueRow.experiment_id.in_(running),
                or_(
                    QueueRow.state == "queued",
                    and_(QueueRow.state == "claimed", QueueRow.expires_at < stamp),
                ),
            )
            row = None
            if prefer is not None:
                row = s.scalars(
                    q.where(QueueRow.id == prefer).with_for_update(skip_locked=True)
                ).first()
            if row is None:
                row = s.scalars(
                    q.order_by(QueueRow.id).limit(1).with_for_update(skip_locked=True)
                ).first()
            if row is None:
                return None
            if row.comparison_id is not None:  # a dead claimer's half-measured comparison
                abort_measuring(s, row.comparison_id, stamp)
            row.state = "claimed"
            row.claimed_by = claimer
            row.claimed_at = row.heartbeat_at = stamp
            row.expires_at = stamp + timedelta(seconds=lease_s)
            row.attempts += 1
            row.comparison_id = None
            configs = {
                r.id: self._configuration_of(s, r)
                for r in s.scalars(
                    select(ConfigurationRow).where(
                        ConfigurationRow.id.in_((row.baseline_id, row.candidate_id))
                    )
                )
            }
            return QueueItem(
                id=row.id,
                experiment_id=row.experiment_id,
                purpose=row.purpose,
                baseline=configs[row.baseline_id],
                candidate=configs[row.candidate_id],
                seed=int(row.seed),
                attempts=row.attempts,
            )

    @guard
    def start_queued(
        self, item: QueueItem, claimer: str, *, hosts: tuple[str, str] | None = None
    ) -> int:
        """Start measuring a claimed queue row on ``hosts``: a new ``running`` comparison,
        linked to the row (so a claimer taking the row over after this one dies aborts it).
        Returns its id."""
        cmp_id = self._comparisons.start_comparison(
            item.experiment_id, item.purpose, item.baseline, item.candidate, hosts=hosts
        )
        with self._session() as s, s.begin():
            s.execute(
                update(QueueRow)
                .where(
                    QueueRow.id == item.id,
                    QueueRow.claimed_by == claimer,
                    QueueRow.state == "claimed",
                )
                .values(comparison_id=cmp_id)
                .execution_options(synchronize_session=False)
            )
        return cmp_id

    @guard
    def finish_queued(
        self, item_id: int, claimer: str, cmp_id: int, result: ComparisonResult
    ) -> bool:
        """Record a claimed row's result in one transaction with the row becoming ``done``:
        True when stored. A claim another claimer took over in the meantime (this one was
        presumed dead), or an ABORTED result (a stop), stores no decision: the comparison is
        aborted and, if the row is still this claimer's, the row goes back to ``queued``."""
        with self._session() as s, s.begin():
            row = s.scalars(
                select(QueueRow).where(QueueRow.id == item_id).with_for_update()
            ).first()
            cmp = s.scalars(
                select(ComparisonRow).where(ComparisonRow.id == cmp_id).with_for_update()
            ).first()
            if row is None or cmp is None:
                raise DatabaseError(f"no queued comparison {item_id} measured as {cmp_id}")
            stamp = convert.now()
            mine = (
                row.state == "claimed" and row.claimed_by == claimer and row.comparison_id == cmp_id
            )
            if not mine or not result.decision.final:
                if cmp.status == ComparisonStatus.RUNNING.value:
                    cmp.status, cmp.finished_at = ComparisonStatus.ABORTED.value, stamp
                if mine:
                    row.state, row.claimed_by, row.expires_at = "queued", None, None
                    row.comparison_id = None
                return False
            if cmp.status != ComparisonStatus.RUNNING.value:
                raise InvalidTransition(f"comparison {cmp_id} is already {cmp.status}")
            s.add(
                DecisionRow(
                    comparison_id=cmp_id, decided_at=stamp, **convert.decision_columns(result)
                )
            )
            cmp.status, cmp.finished_at = ComparisonStatus.FINISHED.value, stamp
            row.state, row.done_at, row.expires_at = "done", stamp, None
        self._cmp_meta.pop(cmp_id, None)
        return True

    @guard
    def queued_result(self, item_id: int) -> ComparisonResult | None:
        """The result of a ``done`` queue row (whoever measured it), else None."""
        with self._reader() as s:
            row = s.get(QueueRow, item_id)
            if row is None:
                raise DatabaseError(f"no queued comparison {item_id}")
            if row.state != "done" or row.comparison_id is None:
                return None
            found = s.execute(
                select(ComparisonRow, DecisionRow)
                .join(DecisionRow, DecisionRow.comparison_id == ComparisonRow.id)
                .where(ComparisonRow.id == row.comparison_id)
            ).first()
            if found is None:
                return None
            cmp, dec = found
            base = self._configuration_of(s, self._config_row(s, cmp.baseline_id))
            cand = self._configuration_of(s, self._config_row(s, cmp.candidate_id))
            return convert.result_from_rows(base, cand, dec)

    def beat_queued(self, claimer: str, lease_s: float) -> int:
        """Renew every claim ``claimer`` holds for another ``lease_s``; returns how many it
        holds. Safe from another thread (the engine only, as :meth:`heartbeat`)."""
        stamp = convert.now()
        try:
            with self.engine.begin() as conn:
                res = conn.execute(
                    update(QueueRow)
                    .where(QueueRow.claimed_by == claimer, QueueRow.state == "claimed")
                    .values(heartbeat_at=stamp, expires_at=stamp + timedelta(seconds=lease_s))
                )
                return int(res.rowcount or 0)
        except SQLAlchemyError as exc:
            raise DatabaseError(f"beat_queued: {first_line(exc)}") from None

    @guard
    def release_queued(self, exp_id: int, claimer: str, *, item_id: int | None = None) -> int:
        """Give back the claims ``claimer`` holds on the experiment's queue (a stop; ``item_id``:
        that row only, its pair failed): the rows become ``queued`` again, comparisons it was
        measuring ``aborted``. Returns how many."""
        with self._session() as s, s.begin():
            rows = s.scalars(
                select(QueueRow)
                .where(
                    QueueRow.experiment_id == exp_id,
                    QueueRow.claimed_by == claimer,
                    QueueRow.state == "claimed",
                    *([QueueRow.id == item_id] if item_id is not None else []),
                )
                .with_for_update()
            ).all()
            stamp = convert.now()
            for row in rows:
                if row.comparison_id is not None:
                    abort_measuring(s, row.comparison_id, stamp)
                row.state, row.claimed_by, row.expires_at, row.comparison_id = (
                    "queued",
                    None,
                    None,
                    None,
                )
            return len(rows)

    @guard
    def queue_states(self, exp_ids: Sequence[int] | None = None) -> dict[int, QueueState]:
        """Each experiment's controller claim, queue counts by state and live queue claims
        (``musku experiments``); all experiments when ``exp_ids`` is None."""
        with self._reader() as s:
            stamp = convert.now()

            def age(beat: Any) -> float | None:
                at = convert.aware(beat)
                return None if at is None else max(0.0, (stamp - at).total_seconds())

            q = select(ExperimentRow)
            if exp_ids is not None:
                q = q.where(ExperimentRow.id.in_(list(exp_ids)))
            out: dict[int, QueueState] = {}
            counts: dict[int, dict[str, int]] = {}
            claims: dict[int, list[ClaimInfo]] = {}
            qq = select(QueueRow.experiment_id, QueueRow.state, func.count()).group_by(
                QueueRow.experiment_id, QueueRow.state
            )
            cq = select(QueueRow).where(QueueRow.state == "claimed")
            if exp_ids is not None:
                qq = qq.where(QueueRow.experiment_id.in_(list(exp_ids)))
                cq = cq.where(QueueRow.experiment_id.in_(list(exp_ids)))
            for eid, state, n in s.execute(qq).all():
                counts.setdefault(int(eid), {})[str(state)] = int(n)
            for row in s.scalars(cq.order_by(QueueRow.id)):
                claims.setdefault(row.experiment_id, []).append(
                    ClaimInfo(str(row.claimed_by), None, None, age(row.heartbeat_at))
                )
            for e in s.scalars(q.order_by(ExperimentRow.id)):
                controller = None
                if e.claim_controller is not None:
                    controller = ClaimInfo(
                        e.claim_controller, e.claim_host, e.claim_pid, age(e.claim_heartbeat)
                    )
                c = counts.get(e.id, {})
                out[e.id] = QueueState(
                    controller=controller,
                    counts={k: c.get(k, 0) for k in ("queued", "claimed", "done")},
                    claims=tuple(claims.get(e.id, [])),
                )
            return out
