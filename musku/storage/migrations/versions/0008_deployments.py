"""deployments of soft SKUs and their re-validations (``musku sku deploy`` / ``watch``)

Revision ID: 0008
Revises: 0007
Create Date: 2026-11-26

``deployments``: one rollout of a soft SKU to a list of hosts: its canary hosts, status
(``canary -> rolling -> deployed | rolled_back | failed``), the canary comparison, the waves
as JSON, the code version the hosts ran, the controller, timestamps. ``deployment_watches``:
one row per re-validation of a deployment (time, code version, comparison, verdict
``holds | gone | lost``). Both are new tables: nothing to migrate, same on SQLite and
PostgreSQL.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = "0008"
down_revision: str | None = "0007"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_JSON = sa.JSON().with_variant(postgresql.JSONB(), "postgresql")


def upgrade() -> None:
    op.create_table(
        "deployments",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("soft_sku_id", sa.Integer(), nullable=False),
        sa.Column("experiment_id", sa.Integer(), nullable=False),
        sa.Column("backend", sa.String(length=100), nullable=False),
        sa.Column("hosts", _JSON, nullable=False),
        sa.Column("canary_hosts", _JSON, nullable=False),
        sa.Column("status", sa.String(length=20), nullable=False),
        sa.Column("canary_comparison_id", sa.Integer(), nullable=True),
        sa.Column("waves", _JSON, nullable=False),
        sa.Column("code_version", sa.String(length=255), nullable=True),
        sa.Column("controller", sa.String(length=255), nullable=False),
        sa.Column("reason", sa.Text(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("finished_at", sa.DateTime(timezone=True), nullable=True),
        sa.CheckConstraint(
            "status IN ('canary', 'rolling', 'deployed', 'rolled_back', 'failed')",
            name=op.f("ck_deployments_status"),
        ),
        sa.ForeignKeyConstraint(
            ["soft_sku_id"], ["soft_skus.id"], name=op.f("fk_deployments_soft_sku_id_soft_skus")
        ),
        sa.ForeignKeyConstraint(
            ["experiment_id"],
            ["experiments.id"],
            name=op.f("fk_deployments_experiment_id_experiments"),
            ondelete="CASCADE",
        ),
        sa.ForeignKeyConstraint(
            ["canary_comparison_id"],
            ["comparisons.id"],
            name=op.f("fk_deployments_canary_comparison_id_comparisons"),
            ondelete="SET NULL",
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_deployments")),
    )
    op.create_index("ix_deployments_soft_sku_id", "deployments", ["soft_sku_id"], unique=False)
    op.create_index("ix_deployments_experiment_id", "deployments", ["experiment_id"], unique=False)
    op.create_index("ix_deployments_status", "deployments", ["status"], unique=False)
    op.create_table(
        "deployment_watches",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("deployment_id", sa.Integer(), nullable=False),
        sa.Column("checked_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("code_version", sa.String(length=255), nullable=True),
        sa.Column("comparison_id", sa.Integer(), nullable=True),
        sa.Column("verdict", sa.String(length=10), nullable=False),
        sa.Column("reason", sa.Text(), nullable=False),
        sa.CheckConstraint(
            "verdict IN ('holds', 'gone', 'lost')", name=op.f("ck_deployment_watches_verdict")
        ),
        sa.ForeignKeyConstraint(
            ["deployment_id"],
            ["deployments.id"],
            name=op.f("fk_deployment_watches_deployment_id_deployments"),
            ondelete="CASCADE",
        ),
        sa.ForeignKeyConstraint(
            ["comparison_id"],
            ["comparisons.id"],
            name=op.f("fk_deployment_watches_comparison_id_comparisons"),
            ondelete="SET NULL",
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_deployment_watches")),
    )
    op.create_index(
        "ix_deployment_watches_deployment_id",
        "deployment_watches",
        ["deployment_id"],
        unique=False,
    )


def downgrade() -> None:
    op.drop_index("ix_deployment_watches_deployment_id", table_name="deployment_watches")
    op.drop_table("deployment_watches")
    op.drop_index("ix_deployments_status", table_name="deployments")
    op.drop_index("ix_deployments_experiment_id", table_name="deployments")
    op.drop_index("ix_deployments_soft_sku_id", table_name="deployments")
    op.drop_table("deployments")
