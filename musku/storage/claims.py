"""Which controller runs an experiment (docs/cli.md "Several controllers"): its claim, heartbeat
and release, the status a heartbeat thread reads, and ``musku abort``, which takes a run from
its controller. A repository of the results store (:mod:`musku.storage.core`); the
:class:`~musku.storage.store.Store` façade composes it.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from sqlalchemy import or_, select, update
from sqlalchemy.exc import SQLAlchemyError

from musku.domain import ExperimentStatus
from musku.errors import DatabaseError
from musku.storage import convert
from musku.storage.core import Repository, guard, locked_experiment
from musku.storage.engine import first_line
from musku.storage.models import ComparisonRow, ExperimentRow, QueueRow, SoftSkuRow
from musku.storage.records import (
    EXPERIMENT_TRANSITIONS,
    ComparisonStatus,
    ExperimentRecord,
    InvalidTransition,
)


def _held_message(row: ExperimentRow, stamp: Any) -> str:
    beat = convert.aware(row.claim_heartbeat)
    ago = f"{max(0.0, (stamp - beat).total_seconds()):.0f}s ago" if beat else "never"
    return (
        f"experiment {row.id} is held by controller {row.claim_controller} on host "
        f"{row.claim_host} (pid {row.claim_pid}), heartbeat {ago}"
    )


class ClaimHeld(DatabaseError):
    """Another live controller holds the experiment (exit status 5, database)."""


class Claims(Repository):
    """Which controller runs an experiment (docs/cli.md "Several controllers"): its claim,
    heartbeat and release, the status a heartbeat thread reads, and ``musku abort``, which
    takes a run from its controller."""

    @guard
    def claim(
        self, exp_id: int, controller: str, host: str, pid: int, *, stale_s: float = 60.0
    ) -> None:
        """Claim experiment ``exp_id`` for this controller (docs/cli.md "Several controllers").

        Refused with :class:`ClaimHeld` (one line naming the holder) while another controller's
        heartbeat is younger than ``stale_s``; an unclaimed experiment, this controller's own,
        or a stale claim is taken atomically: the row is locked (``SELECT ... FOR UPDATE`` on
        PostgreSQL; on SQLite the write transaction begins IMMEDIATE) and the conditional
        ``UPDATE ... WHERE claim_heartbeat < cutoff`` must change exactly one row."""
        with self._session() as s, s.begin():
            row = locked_experiment(s, exp_id)
            stamp = convert.now()
            cutoff = stamp - timedelta(seconds=stale_s)
            free = or_(
                ExperimentRow.claim_controller.is_(None),
                ExperimentRow.claim_controller == controller,
                ExperimentRow.claim_heartbeat.is_(None),
                ExperimentRow.claim_heartbeat < cutoff,
            )
            res = s.execute(
                update(ExperimentRow)
                .where(ExperimentRow.id == exp_id, free)
                .values(
                    claim_controller=controller,
                    claim_host=host,
                    claim_pid=pid,
                    claim_heartbeat=stamp,
                )
                .execution_options(synchronize_session=False)
            )
            if res.rowcount != 1:  # type: ignore[attr-defined]
                raise ClaimHeld(_held_message(row, stamp))

    def heartbeat(self, exp_id: int, controller: str) -> bool:
        """Refresh this controller's claim; False when it no longer holds it (taken over).
        Safe from another thread: it uses the engine only, not this Store's sessions."""
        try:
            with self.engine.begin() as conn:
                res = conn.execute(
                    update(ExperimentRow)
                    .where(
                        ExperimentRow.id == exp_id,
                        ExperimentRow.claim_controller == controller,
                    )
                    .values(claim_heartbeat=convert.now())
                )
                return bool(res.rowcount == 1)
        except SQLAlchemyError as exc:
            raise DatabaseError(f"heartbeat: {first_line(exc)}") from None

    @guard
    def release(self, exp_id: int, controller: str) -> None:
        """Give the claim up (the end of a run); a claim another controller took is left alone."""
        with self._session() as s, s.begin():
            s.execute(
                update(ExperimentRow)
                .where(ExperimentRow.id == exp_id, ExperimentRow.claim_controller == controller)
                .values(
                    claim_controller=None, claim_host=None, claim_pid=None, claim_heartbeat=None
                )
                .execution_options(synchronize_session=False)
            )

    def status_of(self, exp_id: int) -> ExperimentStatus:
        """The experiment's status, read from another thread (the engine only)."""
        try:
            with self._reader_engine.connect() as conn:
                value = conn.execute(
                    select(ExperimentRow.status).where(ExperimentRow.id == exp_id)
                ).scalar()
        except SQLAlchemyError as exc:
            raise DatabaseError(f"status_of: {first_line(exc)}") from None
        if value is None:
            raise DatabaseError(f"no experiment with id {exp_id}")
        return ExperimentStatus(value)

    @guard
    def abort_experiment(self, exp_id: int, *, stale_s: float = 60.0) -> ExperimentRecord:
        """``musku abort``: the experiment becomes ``aborted`` (final) and its queue claims are
        released (rows back to ``queued``; nobody claims them again). A live controller
        (heartbeat younger than ``stale_s``) notices at its next heartbeat, stops, aborts the
        comparison it is measuring, rolls its hosts back and releases its claim; a dead one's
        claim is released here and the comparisons it left ``running`` are aborted. A finished
        experiment (done, failed, aborted), or one whose soft SKU is stored already (the abort
        came after its last comparison), raises :class:`InvalidTransition`: an abort is
        refused or wins cleanly, never "aborted" with a soft SKU (:meth:`save_softsku`)."""
        with self._session() as s, s.begin():
            row = locked_experiment(s, exp_id)
            current = ExperimentStatus(row.status)
            if ExperimentStatus.ABORTED not in EXPERIMENT_TRANSITIONS[current]:
                raise InvalidTransition(
                    f"experiment {exp_id} ({row.name}) is already {current.value}: "
                    "only a running or interrupted experiment can be aborted"
                )
            sku = s.scalars(
                select(SoftSkuRow.id).where(SoftSkuRow.experiment_id == exp_id).limit(1)
            ).first()
            if sku is not None:  # the abort came after the last comparison: too late
                raise InvalidTransition(
                    f"experiment {exp_id} ({row.name}) is already finished: its soft SKU "
                    f"{sku} is stored (the run ends as done; `musku sku show {sku}`)"
                )
            stamp = convert.now()
            beat = convert.aware(row.claim_heartbeat)
            live = (
                row.claim_controller is not None
                and beat is not None
                and beat > stamp - timedelta(seconds=stale_s)
            )
            row.status, row.finished_at = ExperimentStatus.ABORTED.value, stamp
            if not live:  # a live controller releases its claim as it stops
                row.claim_controller = row.claim_host = None
                row.claim_pid = row.claim_heartbeat = None
            s.execute(
                update(QueueRow)
                .where(QueueRow.experiment_id == exp_id, QueueRow.state == "claimed")
                .values(state="queued", claimed_by=None, expires_at=None)
                .execution_options(synchronize_session=False)
            )
            if not live:
                s.execute(
                    update(ComparisonRow)
                    .where(
                        ComparisonRow.experiment_id == exp_id,
                        ComparisonRow.status == ComparisonStatus.RUNNING.value,
                    )
                    .values(status=ComparisonStatus.ABORTED.value, finished_at=stamp)
                    .execution_options(synchronize_session=False)
                )
            s.flush()
            return self._experiment_record(s, row)
