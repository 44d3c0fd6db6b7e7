"""configurations as generic rows (configuration_keys + configuration_settings)

Revision ID: 0004
Revises: 0003
Create Date: 2026-11-23

Knob values move from one column per knob in ``configurations`` to one row per knob in
``configuration_settings`` (configuration_id, knob, value, number), Optuna-style, so a new knob
(an out-of-tree one too) needs no schema change. The table keeps its ids and keys and becomes
``configuration_keys`` (a rename: the foreign keys of ``comparisons`` and ``soft_skus`` follow
it on SQLite and PostgreSQL). ``knobs`` records the ``module:Class`` of each out-of-tree knob a stored configuration uses,
so another process can load its spec. ``configurations`` becomes a view with the same columns as the
old table, generated from the knob specs (``musku.storage.views``), so analysts' SQL keeps
working. The rows are filled from each configuration's canonical key (its JSON), which holds
every value the old columns held; the SQL is per dialect (``json_each`` / ``jsonb_each_text``)
and runs offline too. ``v_comparisons`` and ``v_soft_skus`` now read ``configuration_keys``.
"""

from __future__ import annotations

import importlib.util
import json
from collections.abc import Sequence
from pathlib import Path
from types import ModuleType
from typing import Any

import sqlalchemy as sa
from alembic import op

from musku.storage import views

revision: str = "0004"
down_revision: str | None = "0003"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

# the columns of ``configurations`` before this revision (0001), frozen
OLD_COLUMNS: tuple[tuple[str, sa.types.TypeEngine[Any]], ...] = (
    ("core_freq", sa.Float()),
    ("core_turbo", sa.Boolean()),
    ("uncore_freq", sa.Float()),
    ("uncore_turbo", sa.Boolean()),
    ("core_count", sa.Integer()),
    ("cdp", sa.String(length=20)),
    ("cdp_data_ways", sa.SmallInteger()),
    ("cdp_code_ways", sa.SmallInteger()),
    ("prefetch", sa.String(length=50)),
    ("thp", sa.String(length=20)),
    ("shp", sa.Integer()),
)

FILL_SQLITE = """
INSERT INTO configuration_settings (configuration_id, knob, value, number)
SELECT c.id, j.key, CAST(j.value AS TEXT),
       CASE WHEN j.type IN ('integer', 'real') THEN CAST(j.value AS REAL) END
FROM configuration_keys c, json_each(c.key) j
"""

FILL_POSTGRESQL = """
INSERT INTO configuration_settings (configuration_id, knob, value, number)
SELECT c.id, j.key, j.value,
       CASE WHEN jsonb_typeof(CAST(c.key AS JSONB) -> j.key) = 'number'
            THEN CAST(j.value AS DOUBLE PRECISION) END
FROM configuration_keys c, jsonb_each_text(CAST(c.key AS JSONB)) j
"""


def _v0002() -> ModuleType:
    """Revision 0002's module (its CREATE VIEW statements); version files are not a package."""
    path = Path(__file__).with_name("0002_analyst_views.py")
    spec = importlib.util.spec_from_file_location("musku_migration_0002", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _analyst_views(table: str) -> tuple[str, str]:
    v = _v0002()
    return tuple(  # type: ignore[return-value]
        sql.replace("JOIN configurations ", f"JOIN {table} ")
        for sql in (v.V_COMPARISONS, v.V_SOFT_SKUS)
    )


def upgrade() -> None:
    dialect = op.get_context().dialect.name
    op.execute("DROP VIEW v_soft_skus")
    op.execute("DROP VIEW v_comparisons")
    op.rename_table("configurations", "configuration_keys")
    op.create_table(
        "configuration_settings",
        sa.Column("configuration_id", sa.Integer(), nullable=False),
        sa.Column("knob", sa.String(length=100), nullable=False),
        sa.Column("value", sa.Text(), nullable=False),
        sa.Column("number", sa.Float(), nullable=True),
        sa.ForeignKeyConstraint(
            ["configuration_id"],
            ["configuration_keys.id"],
            name=op.f("fk_configuration_settings_configuration_id_configuration_keys"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("configuration_id", "knob", name=op.f("pk_configuration_settings")),
    )
    op.create_index("ix_configuration_settings_knob", "configuration_settings", ["knob"])
    op.create_table(
        "knobs",
        sa.Column("name", sa.String(length=100), nullable=False),
        sa.Column("target", sa.Text(), nullable=False),
        sa.Column("kind", sa.String(length=20), nullable=False),
        sa.Column("description", sa.Text(), nullable=False),
        sa.PrimaryKeyConstraint("name", name=op.f("pk_knobs")),
    )
    op.execute(FILL_POSTGRESQL if dialect == "postgresql" else FILL_SQLITE)
    for name, _ in OLD_COLUMNS:
        op.drop_column("configuration_keys", name)  # SQLite >= 3.35 drops in place
    op.execute(views.create_view_sql(views.view_specs(), dialect))
    for sql in _analyst_views("configuration_keys"):
        op.execute(sql)


def _old_columns(key: str) -> dict[str, Any]:
    """The 0001 columns of a configuration, from its key (frozen copy of 0001's conversion)."""
    d = json.loads(key)
    cols: dict[str, Any] = {}
    for knob, turbo in (("core_freq", "core_turbo"), ("uncore_freq", "uncore_turbo")):
        v = d.get(knob)
        if v is None:
            cols[knob], cols[turbo] = None, None
        elif v == "turbo":
            cols[knob], cols[turbo] = None, True
        else:
            cols[knob], cols[turbo] = float(v), False
    cdp = d.get("cdp")
    data = code = None
    if isinstance(cdp, str) and cdp != "off":
        a, _, b = cdp.partition(":")
        data, code = int(a), int(b)
    cols.update(
        core_count=d.get("core_count"),
        cdp=cdp,
        cdp_data_ways=data,
        cdp_code_ways=code,
        prefetch=d.get("prefetch"),
        thp=d.get("thp"),
        shp=d.get("shp"),
    )
    return cols


def downgrade() -> None:
    op.execute(f"DROP VIEW {views.VIEW}")
    op.execute("DROP VIEW v_soft_skus")
    op.execute("DROP VIEW v_comparisons")
    for name, type_ in OLD_COLUMNS:
        op.add_column("configuration_keys", sa.Column(name, type_, nullable=True))
    table = sa.table(
        "configuration_keys",
        sa.column("id", sa.Integer()),
        sa.column("key", sa.Text()),
        *(sa.column(name, type_) for name, type_ in OLD_COLUMNS),
    )
    bind = op.get_bind()
    for row_id, key in bind.execute(sa.text("SELECT id, key FROM configuration_keys")).all():
        bind.execute(table.update().where(table.c.id == row_id).values(**_old_columns(key)))
    op.drop_table("knobs")
    op.drop_index("ix_configuration_settings_knob", table_name="configuration_settings")
    op.drop_table("configuration_settings")
    op.rename_table("configuration_keys", "configurations")
    for sql in _analyst_views("configurations"):
        op.execute(sql)
