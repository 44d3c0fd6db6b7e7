"""a pair calibration remembers the pair's noise

Revision ID: 0011
Revises: 0010
Create Date: 2026-11-28

``pair_calibrations`` gains ``noise_lrv`` (the long-run variance of one window's CUPED-adjusted
log-ratio the calibration's A/A measured), ``noise_df`` (its degrees of freedom) and
``window_s`` (the window it was measured in): the tester pools it with each later
comparison's own variance (issue 30 item 4, docs/abtest.md). NULL in older rows: not measured.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0011"
down_revision: str | None = "0010"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_COLUMNS = ("noise_lrv", "noise_df", "window_s")


def upgrade() -> None:
    with op.batch_alter_table("pair_calibrations") as batch:
        for name in _COLUMNS:
            batch.add_column(sa.Column(name, sa.Float(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("pair_calibrations") as batch:
        for name in reversed(_COLUMNS):
            batch.drop_column(name)
