"""a deployment can be retired (``musku sku retire``)

Revision ID: 0010
Revises: 0009
Create Date: 2026-11-28

``deployments.status`` takes ``retired``: a ``deployed`` deployment ended as planned by an
operator (its hosts back at production and free for another deployment), told apart from
``rolled_back`` (the soft SKU taken off: a lost canary, a failed wave, an operator's
rollback). Only the CHECK constraint changes; SQLite rebuilds the table (batch mode), the rows
are copied as they are.
"""

from __future__ import annotations

from collections.abc import Sequence

from alembic import op

revision: str = "0010"
down_revision: str | None = "0009"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_OLD = ("canary", "rolling", "deployed", "rolled_back", "failed")
_NEW = (*_OLD, "retired")


def _status_check(values: tuple[str, ...]) -> None:
    with op.batch_alter_table("deployments", recreate="auto") as batch:
        batch.drop_constraint(op.f("ck_deployments_status"), type_="check")
        batch.create_check_constraint(
            op.f("ck_deployments_status"), f"status IN ({', '.join(repr(v) for v in values)})"
        )


def upgrade() -> None:
    _status_check(_NEW)


def downgrade() -> None:
    op.execute("UPDATE deployments SET status = 'rolled_back' WHERE status = 'retired'")
    _status_check(_OLD)
