"""comparison hosts: which pair of a host pool each comparison ran on

Revision ID: 0006
Revises: 0005
Create Date: 2026-11-24

``comparisons.host_a`` / ``host_b``: the names of the two hosts (``hosts.name``) of the pair the
comparison ran on; ``host_a`` starts on the baseline, the tester swaps the roles each period
(``samples.host``/``role`` say who ran what in each window). A sweep on a pool of hosts
(docs/fleet.md) runs its comparisons on several pairs at once. NULL: stored before this
revision (one pair: the experiment's two hosts). The analysts' view ``v_comparisons`` gains
the two columns.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Sequence
from pathlib import Path
from types import ModuleType

import sqlalchemy as sa
from alembic import op

revision: str = "0006"
down_revision: str | None = "0005"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def _v0002() -> ModuleType:
    """Revision 0002's module (its CREATE VIEW statements); version files are not a package."""
    path = Path(__file__).with_name("0002_analyst_views.py")
    spec = importlib.util.spec_from_file_location("musku_migration_0002_for_0006", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _v_comparisons(with_hosts: bool) -> str:
    """v_comparisons as revision 0004 left it (reading configuration_keys), with or without
    the host columns."""
    sql: str = _v0002().V_COMPARISONS.replace("JOIN configurations ", "JOIN configuration_keys ")
    if with_hosts:
        sql = sql.replace(
            "    c.finished_at AS finished_at\n",
            "    c.finished_at AS finished_at,\n    c.host_a AS host_a,\n    c.host_b AS host_b\n",
        )
        assert "host_a" in sql
    return sql


def upgrade() -> None:
    # plain ADD COLUMN (nullable): native on SQLite and PostgreSQL
    op.add_column("comparisons", sa.Column("host_a", sa.String(255), nullable=True))
    op.add_column("comparisons", sa.Column("host_b", sa.String(255), nullable=True))
    op.execute("DROP VIEW v_comparisons")
    op.execute(_v_comparisons(True))


def downgrade() -> None:
    op.execute("DROP VIEW v_comparisons")
    op.execute(_v_comparisons(False))
    op.drop_column("comparisons", "host_b")
    op.drop_column("comparisons", "host_a")
