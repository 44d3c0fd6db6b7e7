"""pair calibrations and per-configuration warm-up transients

Revision ID: 0003
Revises: 0002_analyst_views
Create Date: 2026-11-23

``pair_calibrations``: a host pair's bias measured by ``musku pair calibrate`` (an A/A), with
its interval, hardware identity and time; the tester allows early decisions only within a
usable calibration's bound, and a comparison whose bias estimate breaches it sets
``needs_recalibration``. ``config_transients``: each configuration's warm-up transient measured
on a pair, discarded at least that long after later applies (docs/abtest.md).
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0003"
down_revision: str | None = "0002_analyst_views"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "pair_calibrations",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("pair", sa.String(length=255), nullable=False),
        sa.Column("hardware", sa.Text(), nullable=False),
        sa.Column("metric", sa.String(length=100), nullable=False),
        sa.Column("bias", sa.Float(), nullable=False),
        sa.Column("ci_low", sa.Float(), nullable=False),
        sa.Column("ci_high", sa.Float(), nullable=False),
        sa.Column("samples", sa.Integer(), nullable=False),
        sa.Column("taken_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("needs_recalibration", sa.Boolean(), nullable=False),
        sa.Column("note", sa.Text(), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_pair_calibrations")),
    )
    op.create_index("ix_pair_calibrations_pair", "pair_calibrations", ["pair"])
    op.create_table(
        "config_transients",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("pair", sa.String(length=255), nullable=False),
        sa.Column("hardware", sa.Text(), nullable=False),
        sa.Column("config_key", sa.Text(), nullable=False),
        sa.Column("seconds", sa.Float(), nullable=False),
        sa.Column("measured_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_config_transients")),
    )
    op.create_index(
        "ix_config_transients_lookup", "config_transients", ["pair", "hardware", "config_key"]
    )


def downgrade() -> None:
    op.drop_index("ix_config_transients_lookup", table_name="config_transients")
    op.drop_table("config_transients")
    op.drop_index("ix_pair_calibrations_pair", table_name="pair_calibrations")
    op.drop_table("pair_calibrations")
