"""Deployments of soft SKUs (``musku sku deploy``, revision 0008): their life cycle, waves and re-
validations (watches). A repository of the results store (:mod:`musku.storage.core`); the
:class:`~musku.storage.store.Store` façade composes it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from sqlalchemy import select, text

from musku.domain import DeploymentStatus
from musku.errors import InputError
from musku.storage import convert
from musku.storage.core import Repository, guard
from musku.storage.models import DeploymentRow, DeploymentWatchRow, SoftSkuRow
from musku.storage.records import (
    DEPLOYMENT_TRANSITIONS,
    DeploymentRecord,
    InvalidTransition,
    WatchRecord,
)


class DeploymentConflict(InputError):
    """A host is in another live deployment (exit status 3, bad input)."""


class Deployments(Repository):
    """Deployments of soft SKUs (``musku sku deploy``, revision 0008): their life cycle, waves and
    re-validations (watches)."""

    @guard
    def create_deployment(
        self,
        soft_sku_id: int,
        experiment_id: int,
        *,
        backend: str,
        hosts: Sequence[str],
        canary_hosts: Sequence[str],
        controller: str,
        code_version: str | None = None,
    ) -> int:
        """Record a new deployment (status ``canary``); returns its id. Refused with
        :class:`DeploymentConflict` (one line, exit 3) when a host is in another live
        deployment (``canary``, ``rolling`` or ``deployed``) of the same backend; the check
        and the insert are one transaction (on PostgreSQL under a lock on the table)."""
        with self._session() as s, s.begin():
            if self.dialect == "postgresql":
                s.execute(text("LOCK TABLE deployments IN SHARE ROW EXCLUSIVE MODE"))
            if s.get(SoftSkuRow, soft_sku_id) is None:
                raise InputError(f"no soft SKU with id {soft_sku_id}")
            live = [st.value for st in DeploymentStatus if st.live]
            wanted = set(hosts)
            for other in s.scalars(
                select(DeploymentRow)
                .where(DeploymentRow.status.in_(live), DeploymentRow.backend == backend)
                .order_by(DeploymentRow.id)
            ):
                taken = sorted(wanted.intersection(other.hosts))
                if taken:
                    raise DeploymentConflict(
                        f"host {taken[0]} already runs soft SKU {other.soft_sku_id} of live "
                        f"deployment {other.id} ({other.status})"
                    )
            stamp = convert.now()
            row = DeploymentRow(
                soft_sku_id=soft_sku_id,
                experiment_id=experiment_id,
                backend=backend,
                hosts=list(hosts),
                canary_hosts=list(canary_hosts),
                status=DeploymentStatus.CANARY.value,
                waves=[],
                code_version=code_version,
                controller=controller,
                reason="",
                created_at=stamp,
                updated_at=stamp,
            )
            s.add(row)
            s.flush()
            return row.id

    @guard
    def update_deployment(
        self,
        dep_id: int,
        *,
        status: DeploymentStatus | None = None,
        canary_comparison_id: int | None = None,
        waves: Sequence[Mapping[str, Any]] | None = None,
        reason: str | None = None,
    ) -> None:
        """Change a deployment: its status along :data:`DEPLOYMENT_TRANSITIONS` (any other
        change raises :class:`InvalidTransition`), its canary comparison, waves, reason."""
        with self._session() as s, s.begin():
            row = s.get(DeploymentRow, dep_id)
            if row is None:
                raise InputError(f"no deployment with id {dep_id}")
            stamp = convert.now()
            if status is not None and status.value != row.status:
                current = DeploymentStatus(row.status)
                if status not in DEPLOYMENT_TRANSITIONS[current]:
                    raise InvalidTransition(
                        f"deployment {dep_id} is {current.value}; it cannot become {status.value}"
                    )
                row.status = status.value
                if not status.live or status is DeploymentStatus.DEPLOYED:
                    row.finished_at = stamp
            if canary_comparison_id is not None:
                row.canary_comparison_id = canary_comparison_id
            if waves is not None:
                row.waves = [convert.jsonable(dict(w)) for w in waves]
            if reason is not None:
                row.reason = reason
            row.updated_at = stamp

    @staticmethod
    def _deployment_record(row: DeploymentRow) -> DeploymentRecord:
        created, updated = convert.aware(row.created_at), convert.aware(row.updated_at)
        assert created is not None and updated is not None
        return DeploymentRecord(
            id=row.id,
            soft_sku_id=row.soft_sku_id,
            experiment_id=row.experiment_id,
            backend=row.backend,
            hosts=tuple(row.hosts),
            canary_hosts=tuple(row.canary_hosts),
            status=DeploymentStatus(row.status),
            canary_comparison_id=row.canary_comparison_id,
            waves=tuple(dict(w) for w in row.waves),
            code_version=row.code_version,
            controller=row.controller,
            reason=row.reason,
            created_at=created,
            updated_at=updated,
            finished_at=convert.aware(row.finished_at),
        )

    @guard
    def deployment(self, dep_id: int) -> DeploymentRecord | None:
        with self._reader() as s:
            row = s.get(DeploymentRow, dep_id)
            return self._deployment_record(row) if row is not None else None

    @guard
    def deployments(
        self, *, live: bool = False, soft_sku_id: int | None = None
    ) -> list[DeploymentRecord]:
        """Deployments, oldest first; ``live``: only ``canary``, ``rolling`` and ``deployed``."""
        q = select(DeploymentRow).order_by(DeploymentRow.id)
        if live:
            q = q.where(DeploymentRow.status.in_([st.value for st in DeploymentStatus if st.live]))
        if soft_sku_id is not None:
            q = q.where(DeploymentRow.soft_sku_id == soft_sku_id)
        with self._reader() as s:
            return [self._deployment_record(r) for r in s.scalars(q)]

    @guard
    def add_watch(
        self,
        dep_id: int,
        *,
        verdict: str,
        code_version: str | None,
        comparison_id: int | None,
        reason: str = "",
    ) -> int:
        """Record one re-validation of deployment ``dep_id``; returns its id."""
        with self._session() as s, s.begin():
            if s.get(DeploymentRow, dep_id) is None:
                raise InputError(f"no deployment with id {dep_id}")
            row = DeploymentWatchRow(
                deployment_id=dep_id,
                checked_at=convert.now(),
                code_version=code_version,
                comparison_id=comparison_id,
                verdict=verdict,
                reason=reason,
            )
            s.add(row)
            s.flush()
            return row.id

    @guard
    def watches(self, dep_id: int) -> list[WatchRecord]:
        """Deployment ``dep_id``'s re-validations, oldest first."""
        with self._reader() as s:
            rows = s.scalars(
                select(DeploymentWatchRow)
                .where(DeploymentWatchRow.deployment_id == dep_id)
                .order_by(DeploymentWatchRow.id)
            ).all()
            out = []
            for r in rows:
                at = convert.aware(r.checked_at)
                assert at is not None
                out.append(
                    WatchRecord(
                        id=r.id,
                        deployment_id=r.deployment_id,
                        checked_at=at,
                        code_version=r.code_version,
                        comparison_id=r.comparison_id,
                        verdict=r.verdict,
                        reason=r.reason,
                    )
                )
            return out
