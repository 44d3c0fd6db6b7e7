"""pair calibrations and per-configuration warm-up transients

Revision ID: 0003
Revises: 0002_analyst_views
Create Date: 2026-11-23

``pair_calibrations``: a host pair's bias measured by ``musku pair calibrate`` (an A/A), with
its interval, hardware identity and time; the tester allows early decisions only within a
usable calibration's bound, and a comparison whose bias estimate breaches it sets
``needs_recalibration``. ``config_transients``: each configuration's warm-up transient measured
on a pair, discarded at least that long after later applies (docs/abtest.md).
``decisions.method`` becomes TEXT: the tester's method string now records the final batch size
and HAC bandwidth and outgrew VARCHAR(100) (PostgreSQL refused it). The analyst views read
that column, so they are dropped and created again around the change (same SQL as 0002).
"""

from __future__ import annotations

import importlib.util
from collections.abc import Sequence
from pathlib import Path
from types import ModuleType

import sqlalchemy as sa
from alembic import op

revision: str = "0003"
down_revision: str | None = "0002_analyst_views"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def _views() -> ModuleType:
    """Revision 0002's module (its CREATE VIEW statements); version files are not a package."""
    path = Path(__file__).with_name("0002_analyst_views.py")
    spec = importlib.util.spec_from_file_location("musku_migration_0002", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _method_type(new: sa.types.TypeEngine[str], old: sa.types.TypeEngine[str]) -> None:
    views = _views()
    op.execute("DROP VIEW v_soft_skus")
    op.execute("DROP VIEW v_comparisons")
    with op.batch_alter_table("decisions") as batch:
        batch.alter_column(
            "method",
            type_=new,
            existing_type=old,
            existing_nullable=False,
            postgresql_using="left(method, 100)"
            if isinstance(new, sa.String) and new.length
            else None,
        )
    op.execute(views.V_COMPARISONS)
    op.execute(views.V_SOFT_SKUS)


def upgrade() -> None:
    _method_type(sa.Text(), sa.String(length=100))
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
    _method_type(sa.String(length=100), sa.Text())
