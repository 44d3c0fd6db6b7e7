"""a comparison's decision may be ``not_better`` (the futility stop)

Revision ID: 0013
Revises: 0012
Create Date: 2026-11-29

``decisions.decision`` takes ``not_better``: a comparison asked only "is the candidate better
by at least a bar?" (rule option ``futility``, the sweep's walk steps after the first and a
knob's single settings, docs/abtest.md "The futility stop") ended when a one-sided SPRT
rejected "effect >= bar" at alpha. Only the CHECK constraint changes; SQLite rebuilds the
table (batch mode), the rows are copied as they are. Downgrading rewrites ``not_better`` rows
to ``inconclusive`` (the nearest older decision: no effect shown either way).
"""

from __future__ import annotations

from collections.abc import Sequence

from alembic import op

revision: str = "0013"
down_revision: str | None = "0012"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_OLD = ("better", "worse", "no_difference", "inconclusive", "guardrail", "aborted")
_NEW = (*_OLD, "not_better")


def _decision_check(values: tuple[str, ...]) -> None:
    # SQLite rebuilds the table and renames the copy to ``decisions``; the analysts' views
    # read it (v_comparisons, v_soft_skus), and a rename that rewrites the views' references
    # fails while the old table is gone: the legacy rename leaves the views' text as it is
    # (the same name again), as SQLite documents for this rebuild
    sqlite = op.get_bind().dialect.name == "sqlite"
    if sqlite:
        op.execute("PRAGMA legacy_alter_table = ON")
    with op.batch_alter_table("decisions", recreate="auto") as batch:
        batch.drop_constraint(op.f("ck_decisions_decision"), type_="check")
        batch.create_check_constraint(
            op.f("ck_decisions_decision"), f"decision IN ({', '.join(repr(v) for v in values)})"
        )
    if sqlite:
        op.execute("PRAGMA legacy_alter_table = OFF")


def upgrade() -> None:
    _decision_check(_NEW)


def downgrade() -> None:
    op.execute("UPDATE decisions SET decision = 'inconclusive' WHERE decision = 'not_better'")
    _decision_check(_OLD)
