"""a comparison's decision may be ``not_better`` (the futility stop)

Revision ID: 0013
Revises: 0012
Create Date: 2026-11-29

``decisions.decision`` takes ``not_better``: a comparison asked only "is the candidate better
by at least a bar?" (rule option ``futility``, the sweep's walk steps after the first and a
knob's single settings, docs/abtest.md "The futility stop") ended when a one-sided SPRT
rejected "effect >= bar" at alpha. Only the CHECK constraint changes; on SQLite it is rewritten
in the table's stored SQL (as revision 0007 does), no row is touched. Downgrading rewrites ``not_better`` rows
to ``inconclusive`` (the nearest older decision: no effect shown either way).
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from alembic import context, op

revision: str = "0013"
down_revision: str | None = "0012"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_OLD = ("better", "worse", "no_difference", "inconclusive", "guardrail", "aborted")
_NEW = (*_OLD, "not_better")


def _decision_check(values: tuple[str, ...]) -> None:
    check = f"decision IN ({', '.join(repr(v) for v in values)})"
    if op.get_context().dialect.name != "sqlite":
        op.drop_constraint(op.f("ck_decisions_decision"), "decisions", type_="check")
        op.create_check_constraint(op.f("ck_decisions_decision"), "decisions", check)
        return
    # SQLite: the constraint is part of the table's stored SQL; it is rewritten in place
    # (``PRAGMA writable_schema``, as revision 0007 does for experiments' status), the stored
    # rows being valid under both lists. A table copy would have to drop ``decisions``, which
    # ``validations`` references (a foreign key: the drop's implicit delete fails), and would
    # break the analysts' views over it.
    if context.is_offline_mode():
        raise RuntimeError("revision 0013 cannot be rendered as SQL for SQLite")
    conn = op.get_bind()
    table_sql = conn.exec_driver_sql(
        "SELECT sql FROM sqlite_master WHERE type = 'table' AND name = 'decisions'"
    ).scalar_one()
    found = re.search(r"decision\s+IN\s*\([^)]*\)", table_sql)
    if found is None:
        raise RuntimeError(f"decisions' decision constraint not found: {table_sql}")
    version = conn.exec_driver_sql("PRAGMA schema_version").scalar_one()
    conn.exec_driver_sql("PRAGMA writable_schema = ON")
    conn.exec_driver_sql(
        "UPDATE sqlite_master SET sql = ? WHERE type = 'table' AND name = 'decisions'",
        (table_sql[: found.start()] + check + table_sql[found.end() :],),
    )
    conn.exec_driver_sql(f"PRAGMA schema_version = {int(version) + 1}")
    conn.exec_driver_sql("PRAGMA writable_schema = OFF")


def upgrade() -> None:
    _decision_check(_NEW)


def downgrade() -> None:
    op.execute("UPDATE decisions SET decision = 'inconclusive' WHERE decision = 'not_better'")
    _decision_check(_OLD)
