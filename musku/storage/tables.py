"""Threading tables trained by ``musku.tune`` (co-tuning), looked up per service, host, platform
and configuration. A repository of the results store (:mod:`musku.storage.core`); the
:class:`~musku.storage.store.Store` façade composes it.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from sqlalchemy import select

from musku.domain import Configuration
from musku.storage import convert
from musku.storage.core import Repository, guard
from musku.storage.models import ThreadingTableRow
from musku.storage.records import ThreadingTableRecord


class ThreadingTables(Repository):
    """Threading tables trained by ``musku.tune`` (co-tuning), looked up per service, host,
    platform and configuration."""

    @guard
    def save_threading_table(
        self,
        service: str,
        host: str,
        platform: str,
        config_key: str | Configuration,
        table: Mapping[str, Any],
    ) -> int:
        """Store a threading table trained by ``musku.tune``; the newest one wins on lookup."""
        key = config_key.key() if isinstance(config_key, Configuration) else config_key
        with self._session() as s, s.begin():
            row = ThreadingTableRow(
                service=service,
                host=host,
                platform=platform,
                config_key=key,
                data=convert.jsonable(dict(table)),
                created_at=convert.now(),
            )
            s.add(row)
            s.flush()
            return row.id

    @guard
    def threading_table(
        self, service: str, host: str, platform: str, config_key: str | Configuration
    ) -> dict[str, Any] | None:
        """The newest threading table for exactly this service, host, platform and
        configuration; None if none was trained."""
        key = config_key.key() if isinstance(config_key, Configuration) else config_key
        with self._reader() as s:
            row = s.scalars(
                select(ThreadingTableRow)
                .where(
                    ThreadingTableRow.service == service,
                    ThreadingTableRow.host == host,
                    ThreadingTableRow.platform == platform,
                    ThreadingTableRow.config_key == key,
                )
                .order_by(ThreadingTableRow.id.desc())
                .limit(1)
            ).first()
            return dict(row.data) if row is not None else None

    @guard
    def threading_tables(
        self, service: str | None = None, platform: str | None = None
    ) -> list[ThreadingTableRecord]:
        q = select(ThreadingTableRow).order_by(ThreadingTableRow.id)
        if service is not None:
            q = q.where(ThreadingTableRow.service == service)
        if platform is not None:
            q = q.where(ThreadingTableRow.platform == platform)
        with self._reader() as s:
            out = []
            for r in s.scalars(q):
                created = convert.aware(r.created_at)
                assert created is not None
                out.append(
                    ThreadingTableRecord(
                        id=r.id,
                        service=r.service,
                        host=r.host,
                        platform=r.platform,
                        config_key=r.config_key,
                        table=r.data,
                        created_at=created,
                    )
                )
            return out
