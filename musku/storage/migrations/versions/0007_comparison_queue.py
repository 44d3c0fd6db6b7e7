"""the comparison queue (several controllers and workers per sweep) and aborted experiments

Revision ID: 0007
Revises: 0006
Create Date: 2026-11-24

``comparison_queue``: on PostgreSQL a sweep is a queue of comparisons. Each comparison the
sweep's strategy needs is a row (unique per experiment, purpose, baseline and candidate, with
the seed the strategy gives it), ``queued -> claimed -> done``. Controllers and ``musku
worker`` processes claim rows with ``SELECT ... FOR UPDATE SKIP LOCKED``, renew
``expires_at`` while they measure (``heartbeat_at`` records the last renewal), and link the
comparison they measure (``comparison_id``); a row whose claim expired (its claimer died) is
claimed again (``attempts`` counts the claims) and its half-measured comparison is aborted.

``experiments.status`` may be ``aborted`` (``musku abort``): the CHECK constraint is widened.
On SQLite the constraint is part of the table's stored SQL; it is widened in place
(``PRAGMA writable_schema``, the procedure SQLite documents for constraint changes that leave
the stored rows valid): a table copy would break the analyst views over ``experiments``.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import context, op

revision: str = "0007"
down_revision: str | None = "0006"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_OLD = "status IN ('created', 'running', 'interrupted', 'done', 'failed')"
_NEW = "status IN ('created', 'running', 'interrupted', 'done', 'failed', 'aborted')"


def _status_check(old: str, new: str) -> None:
    if op.get_context().dialect.name == "postgresql":
        op.drop_constraint(op.f("ck_experiments_status"), "experiments", type_="check")
        op.create_check_constraint(op.f("ck_experiments_status"), "experiments", new)
        return
    if context.is_offline_mode():
        raise RuntimeError("revision 0007 cannot be rendered as SQL for SQLite")
    conn = op.get_bind()
    table_sql = conn.exec_driver_sql(
        "SELECT sql FROM sqlite_master WHERE type = 'table' AND name = 'experiments'"
    ).scalar_one()
    if old not in table_sql:
        raise RuntimeError(f"experiments' status constraint is not {old!r}: {table_sql}")
    version = conn.exec_driver_sql("PRAGMA schema_version").scalar_one()
    conn.exec_driver_sql("PRAGMA writable_schema = ON")
    conn.exec_driver_sql(
        "UPDATE sqlite_master SET sql = replace(sql, ?, ?) "
        "WHERE type = 'table' AND name = 'experiments'",
        (old, new),
    )
    conn.exec_driver_sql(f"PRAGMA schema_version = {int(version) + 1}")
    conn.exec_driver_sql("PRAGMA writable_schema = OFF")


def upgrade() -> None:
    _status_check(_OLD, _NEW)
    op.create_table(
        "comparison_queue",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("experiment_id", sa.Integer(), nullable=False),
        sa.Column("purpose", sa.String(length=100), nullable=False),
        sa.Column("baseline_id", sa.Integer(), nullable=False),
        sa.Column("candidate_id", sa.Integer(), nullable=False),
        sa.Column("seed", sa.BigInteger(), nullable=False),
        sa.Column("state", sa.String(length=10), nullable=False),
        sa.Column("claimed_by", sa.String(length=255), nullable=True),
        sa.Column("claimed_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("heartbeat_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("expires_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("attempts", sa.Integer(), nullable=False),
        sa.Column("comparison_id", sa.Integer(), nullable=True),
        sa.Column("enqueued_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("done_at", sa.DateTime(timezone=True), nullable=True),
        sa.CheckConstraint(
            "state IN ('queued', 'claimed', 'done')", name=op.f("ck_comparison_queue_state")
        ),
        sa.ForeignKeyConstraint(
            ["experiment_id"],
            ["experiments.id"],
            name=op.f("fk_comparison_queue_experiment_id_experiments"),
            ondelete="CASCADE",
        ),
        sa.ForeignKeyConstraint(
            ["baseline_id"],
            ["configuration_keys.id"],
            name=op.f("fk_comparison_queue_baseline_id_configuration_keys"),
        ),
        sa.ForeignKeyConstraint(
            ["candidate_id"],
            ["configuration_keys.id"],
            name=op.f("fk_comparison_queue_candidate_id_configuration_keys"),
        ),
        sa.ForeignKeyConstraint(
            ["comparison_id"],
            ["comparisons.id"],
            name=op.f("fk_comparison_queue_comparison_id_comparisons"),
            ondelete="SET NULL",
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_comparison_queue")),
        sa.UniqueConstraint(
            "experiment_id",
            "purpose",
            "baseline_id",
            "candidate_id",
            name="uq_comparison_queue_comparison",
        ),
    )
    op.create_index(
        "ix_comparison_queue_experiment_id", "comparison_queue", ["experiment_id"], unique=False
    )


def downgrade() -> None:
    op.drop_index("ix_comparison_queue_experiment_id", table_name="comparison_queue")
    op.drop_table("comparison_queue")
    op.execute("UPDATE experiments SET status = 'failed' WHERE status = 'aborted'")
    _status_check(_NEW, _OLD)
