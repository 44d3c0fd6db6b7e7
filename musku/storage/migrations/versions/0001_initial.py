"""initial schema

Revision ID: 0001_initial
Revises: (none)
Create Date: 2026-11-21

Every table of the results database (documented for analysts in db/README.md).
The schema is written out here, frozen; it does not import musku.storage.models.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

JSON_ = sa.JSON().with_variant(postgresql.JSONB(), "postgresql")

revision: str = "0001_initial"
down_revision: str | None = None
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "configurations",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("key", sa.Text(), nullable=False),
        sa.Column("core_freq", sa.Float(), nullable=True),
        sa.Column("core_turbo", sa.Boolean(), nullable=True),
        sa.Column("uncore_freq", sa.Float(), nullable=True),
        sa.Column("uncore_turbo", sa.Boolean(), nullable=True),
        sa.Column("core_count", sa.Integer(), nullable=True),
        sa.Column("cdp", sa.String(length=20), nullable=True),
        sa.Column("cdp_data_ways", sa.SmallInteger(), nullable=True),
        sa.Column("cdp_code_ways", sa.SmallInteger(), nullable=True),
        sa.Column("prefetch", sa.String(length=50), nullable=True),
        sa.Column("thp", sa.String(length=20), nullable=True),
        sa.Column("shp", sa.Integer(), nullable=True),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_configurations")),
        sa.UniqueConstraint("key", name=op.f("uq_configurations_key")),
    )
    op.create_table(
        "experiments",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("name", sa.String(length=200), nullable=False),
        sa.Column("description", sa.Text(), nullable=False),
        sa.Column("service", sa.String(length=100), nullable=False),
        sa.Column("platform", sa.String(length=100), nullable=False),
        sa.Column("mode", sa.String(length=20), nullable=False),
        sa.Column("baseline", sa.String(length=20), nullable=False),
        sa.Column("metric", sa.String(length=100), nullable=False),
        sa.Column("direction", sa.String(length=10), nullable=False),
        sa.Column("status", sa.String(length=20), nullable=False),
        sa.Column("path", sa.Text(), nullable=False),
        sa.Column("content", JSON_, nullable=False),
        sa.Column("resolved", JSON_, nullable=False),
        sa.Column("musku_version", sa.String(length=40), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("started_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("finished_at", sa.DateTime(timezone=True), nullable=True),
        sa.CheckConstraint(
            "status IN ('created', 'running', 'interrupted', 'done', 'failed')",
            name=op.f("ck_experiments_status"),
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_experiments")),
    )
    op.create_index("ix_experiments_name", "experiments", ["name"])
    op.create_index("ix_experiments_platform", "experiments", ["platform"])
    op.create_index("ix_experiments_service", "experiments", ["service"])

    op.create_table(
        "threading_tables",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("service", sa.String(length=100), nullable=False),
        sa.Column("host", sa.String(length=255), nullable=False),
        sa.Column("platform", sa.String(length=100), nullable=False),
        sa.Column("config_key", sa.Text(), nullable=False),
        sa.Column("data", JSON_, nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_threading_tables")),
    )
    op.create_index(
        "ix_threading_tables_lookup",
        "threading_tables",
        ["service", "host", "platform", "config_key"],
    )

    op.create_table(
        "comparisons",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("experiment_id", sa.Integer(), nullable=False),
        sa.Column("purpose", sa.String(length=100), nullable=False),
        sa.Column("baseline_id", sa.Integer(), nullable=False),
        sa.Column("candidate_id", sa.Integer(), nullable=False),
        sa.Column("status", sa.String(length=20), nullable=False),
        sa.Column("started_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("finished_at", sa.DateTime(timezone=True), nullable=True),
        sa.CheckConstraint(
            "status IN ('running', 'finished', 'aborted')", name=op.f("ck_comparisons_status")
        ),
        sa.ForeignKeyConstraint(
            ["baseline_id"],
            ["configurations.id"],
            name=op.f("fk_comparisons_baseline_id_configurations"),
        ),
        sa.ForeignKeyConstraint(
            ["candidate_id"],
            ["configurations.id"],
            name=op.f("fk_comparisons_candidate_id_configurations"),
        ),
        sa.ForeignKeyConstraint(
            ["experiment_id"],
            ["experiments.id"],
            name=op.f("fk_comparisons_experiment_id_experiments"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_comparisons")),
    )
    op.create_index("ix_comparisons_experiment_id", "comparisons", ["experiment_id"])
    op.create_index("ix_comparisons_purpose", "comparisons", ["purpose"])

    op.create_table(
        "hosts",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("experiment_id", sa.Integer(), nullable=False),
        sa.Column("idx", sa.SmallInteger(), nullable=False),
        sa.Column("name", sa.String(length=255), nullable=False),
        sa.Column("backend", sa.String(length=100), nullable=False),
        sa.Column("facts", JSON_, nullable=False),
        sa.ForeignKeyConstraint(
            ["experiment_id"],
            ["experiments.id"],
            name=op.f("fk_hosts_experiment_id_experiments"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_hosts")),
        sa.UniqueConstraint("experiment_id", "idx", name="uq_hosts_experiment_idx"),
    )
    op.create_index("ix_hosts_experiment_id", "hosts", ["experiment_id"])

    op.create_table(
        "soft_skus",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("experiment_id", sa.Integer(), nullable=False),
        sa.Column("service", sa.String(length=100), nullable=False),
        sa.Column("platform", sa.String(length=100), nullable=False),
        sa.Column("configuration_id", sa.Integer(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(
            ["configuration_id"],
            ["configurations.id"],
            name=op.f("fk_soft_skus_configuration_id_configurations"),
        ),
        sa.ForeignKeyConstraint(
            ["experiment_id"],
            ["experiments.id"],
            name=op.f("fk_soft_skus_experiment_id_experiments"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_soft_skus")),
    )
    op.create_index("ix_soft_skus_experiment_id", "soft_skus", ["experiment_id"])
    op.create_index("ix_soft_skus_platform", "soft_skus", ["platform"])
    op.create_index("ix_soft_skus_service", "soft_skus", ["service"])

    op.create_table(
        "decisions",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("comparison_id", sa.Integer(), nullable=False),
        sa.Column("decision", sa.String(length=20), nullable=False),
        sa.Column("estimate", sa.Float(), nullable=False),
        sa.Column("ci_low", sa.Float(), nullable=False),
        sa.Column("ci_high", sa.Float(), nullable=False),
        sa.Column("samples", sa.Integer(), nullable=False),
        sa.Column("host_time_s", sa.Float(), nullable=False),
        sa.Column("reason", sa.Text(), nullable=False),
        sa.Column("method", sa.String(length=100), nullable=False),
        sa.Column("guardrail_values", JSON_, nullable=False),
        sa.Column("threading_a", sa.String(length=100), nullable=True),
        sa.Column("threading_b", sa.String(length=100), nullable=True),
        sa.Column("decided_at", sa.DateTime(timezone=True), nullable=False),
        sa.CheckConstraint(
            "decision IN ('better', 'worse', 'no_difference', 'inconclusive', 'guardrail', "
            "'aborted')",
            name=op.f("ck_decisions_decision"),
        ),
        sa.ForeignKeyConstraint(
            ["comparison_id"],
            ["comparisons.id"],
            name=op.f("fk_decisions_comparison_id_comparisons"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_decisions")),
        sa.UniqueConstraint("comparison_id", name=op.f("uq_decisions_comparison_id")),
    )
    op.create_index("ix_decisions_decision", "decisions", ["decision"])

    op.create_table(
        "samples",
        sa.Column("comparison_id", sa.Integer(), nullable=False),
        sa.Column("seq", sa.Integer(), nullable=False),
        sa.Column("host", sa.SmallInteger(), nullable=False),
        sa.Column("t", sa.Float(), nullable=False),
        sa.Column("role", sa.String(length=1), nullable=False),
        sa.Column("period", sa.Integer(), nullable=False),
        sa.Column("warmup", sa.Boolean(), nullable=False),
        sa.Column("valid", sa.Boolean(), nullable=False),
        sa.Column("value", sa.Float(), nullable=True),
        sa.Column("mips", sa.Float(), nullable=True),
        sa.Column("qps", sa.Float(), nullable=True),
        sa.Column("p99_ms", sa.Float(), nullable=True),
        sa.Column("qos_violation_rate", sa.Float(), nullable=True),
        sa.Column("power_w", sa.Float(), nullable=True),
        sa.Column("extra", JSON_, nullable=True),
        sa.CheckConstraint("role IN ('A', 'B')", name=op.f("ck_samples_role")),
        # no foreign key to comparisons: see SampleRow in musku/storage/models.py
        sa.PrimaryKeyConstraint("comparison_id", "seq", "host", name=op.f("pk_samples")),
        sqlite_with_rowid=False,
    )
    op.create_table(
        "validations",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("soft_sku_id", sa.Integer(), nullable=False),
        sa.Column("against", sa.String(length=20), nullable=False),
        sa.Column("comparison_id", sa.Integer(), nullable=False),
        sa.Column("decision_id", sa.Integer(), nullable=False),
        sa.CheckConstraint(
            "against IN ('production', 'stock')", name=op.f("ck_validations_against")
        ),
        sa.ForeignKeyConstraint(
            ["comparison_id"],
            ["comparisons.id"],
            name=op.f("fk_validations_comparison_id_comparisons"),
        ),
        sa.ForeignKeyConstraint(
            ["decision_id"], ["decisions.id"], name=op.f("fk_validations_decision_id_decisions")
        ),
        sa.ForeignKeyConstraint(
            ["soft_sku_id"],
            ["soft_skus.id"],
            name=op.f("fk_validations_soft_sku_id_soft_skus"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_validations")),
        sa.UniqueConstraint("soft_sku_id", "against", name="uq_validations_sku_against"),
    )
    op.create_index("ix_validations_comparison_id", "validations", ["comparison_id"])


def downgrade() -> None:
    op.drop_index("ix_validations_comparison_id", table_name="validations")

    op.drop_table("validations")
    op.drop_table("samples")
    op.drop_index("ix_decisions_decision", table_name="decisions")

    op.drop_table("decisions")
    op.drop_index("ix_soft_skus_service", table_name="soft_skus")
    op.drop_index("ix_soft_skus_platform", table_name="soft_skus")
    op.drop_index("ix_soft_skus_experiment_id", table_name="soft_skus")

    op.drop_table("soft_skus")
    op.drop_index("ix_hosts_experiment_id", table_name="hosts")

    op.drop_table("hosts")
    op.drop_index("ix_comparisons_purpose", table_name="comparisons")
    op.drop_index("ix_comparisons_experiment_id", table_name="comparisons")

    op.drop_table("comparisons")
    op.drop_index("ix_threading_tables_lookup", table_name="threading_tables")

    op.drop_table("threading_tables")
    op.drop_index("ix_experiments_service", table_name="experiments")
    op.drop_index("ix_experiments_platform", table_name="experiments")
    op.drop_index("ix_experiments_name", table_name="experiments")

    op.drop_table("experiments")
    op.drop_table("configurations")
