"""decisions: where each comparison's host time went (issue 31 item 5)

Revision ID: 0009
Revises: 0008
Create Date: 2026-11-28

``decisions.time_measuring_s``, ``time_warmup_s``, ``time_switching_s``, ``time_reboot_s``:
the comparison's host seconds (``host_time_s``) split into windows the test used, warm-up
discarded, applies without a reboot and applies that rebooted a host (they add up to
``host_time_s``; :class:`musku.domain.TimeBreakdown`). NULL: stored before this revision, or a
row with no breakdown (a multi-arm scan's per-arm rows). Plain nullable ``ADD COLUMN``: native
on SQLite and PostgreSQL, nothing to migrate.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0009"
down_revision: str | None = "0008"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

COLUMNS = ("time_measuring_s", "time_warmup_s", "time_switching_s", "time_reboot_s")


def upgrade() -> None:
    for name in COLUMNS:
        op.add_column("decisions", sa.Column(name, sa.Float(), nullable=True))


def downgrade() -> None:
    for name in reversed(COLUMNS):
        op.drop_column("decisions", name)  # SQLite >= 3.35 drops in place
