"""a pair calibration remembers the slow wander of the pair's host bias

Revision ID: 0012
Revises: 0011
Create Date: 2026-11-28

``pair_calibrations`` gains ``wander_sd`` (the OU standard deviation of the two hosts'
log-ratio the calibration's A/A measured, relative) and ``wander_tau_s`` (its time constant):
later comparisons on the pair use it as the between-period variance component's prior where
it is larger than the rule's default (issue 30 item 1, docs/abtest.md). NULL in older rows:
not measured.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0012"
down_revision: str | None = "0011"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_COLUMNS = ("wander_sd", "wander_tau_s")


def upgrade() -> None:
    with op.batch_alter_table("pair_calibrations") as batch:
        for name in _COLUMNS:
            batch.add_column(sa.Column(name, sa.Float(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("pair_calibrations") as batch:
        for name in reversed(_COLUMNS):
            batch.drop_column(name)
