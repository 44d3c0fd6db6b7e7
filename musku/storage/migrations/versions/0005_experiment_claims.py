"""experiment claims: which controller process runs an experiment, and its heartbeat

Revision ID: 0005
Revises: 0004
Create Date: 2026-11-23

``experiments.claim_controller`` / ``claim_host`` / ``claim_pid`` / ``claim_heartbeat``: the
controller (``musku.owner.controller_id()``) running the experiment, where, and when it last
said it is alive. ``musku sweep`` claims the experiment, heartbeats it and releases it at the
end; a second controller (``--resume`` or a new run of the same experiment) is refused while
the heartbeat is fresh and takes a stale claim over atomically (docs/cli.md "Several
controllers"). All NULL: unclaimed (every experiment before this revision).
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0005"
down_revision: str | None = "0004"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_COLUMNS = ("claim_controller", "claim_host", "claim_pid", "claim_heartbeat")


def upgrade() -> None:
    # plain ADD COLUMN (nullable, no default): native on SQLite and PostgreSQL, and the analyst
    # views over experiments stay valid
    op.add_column("experiments", sa.Column("claim_controller", sa.String(255), nullable=True))
    op.add_column("experiments", sa.Column("claim_host", sa.String(255), nullable=True))
    op.add_column("experiments", sa.Column("claim_pid", sa.Integer(), nullable=True))
    op.add_column(
        "experiments", sa.Column("claim_heartbeat", sa.DateTime(timezone=True), nullable=True)
    )


def downgrade() -> None:
    # plain DROP COLUMN (SQLite >= 3.35): a batch copy of experiments would break the views
    for name in reversed(_COLUMNS):
        op.drop_column("experiments", name)
