"""analyst views: v_comparisons, v_soft_skus

Revision ID: 0002_analyst_views
Revises: 0001_initial
Create Date: 2026-11-21

Two read-only views that flatten the joins analysts write most (db/README.md). Plain portable
SQL: the same statement creates them on SQLite and PostgreSQL. Views are not part of
``musku.storage.models`` (they are not written to), so schema comparison ignores them.
"""

from __future__ import annotations

from collections.abc import Sequence

from alembic import op

revision: str = "0002_analyst_views"
down_revision: str | None = "0001_initial"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

V_COMPARISONS = """
CREATE VIEW v_comparisons AS
SELECT
    c.id AS comparison_id,
    e.id AS experiment_id,
    e.name AS experiment,
    e.service AS service,
    e.platform AS platform,
    e.metric AS metric,
    c.purpose AS purpose,
    cb.key AS baseline_key,
    cc.key AS candidate_key,
    c.status AS status,
    d.decision AS decision,
    d.estimate AS estimate,
    d.ci_low AS ci_low,
    d.ci_high AS ci_high,
    d.samples AS samples,
    d.host_time_s AS host_time_s,
    d.method AS method,
    d.reason AS reason,
    c.started_at AS started_at,
    c.finished_at AS finished_at
FROM comparisons c
JOIN experiments e ON e.id = c.experiment_id
JOIN configurations cb ON cb.id = c.baseline_id
JOIN configurations cc ON cc.id = c.candidate_id
LEFT JOIN decisions d ON d.comparison_id = c.id
"""

V_SOFT_SKUS = """
CREATE VIEW v_soft_skus AS
SELECT
    s.id AS soft_sku_id,
    s.experiment_id AS experiment_id,
    s.service AS service,
    s.platform AS platform,
    cfg.key AS configuration_key,
    s.created_at AS created_at,
    dp.decision AS vs_production_decision,
    dp.estimate AS vs_production_estimate,
    dp.ci_low AS vs_production_ci_low,
    dp.ci_high AS vs_production_ci_high,
    ds.decision AS vs_stock_decision,
    ds.estimate AS vs_stock_estimate,
    ds.ci_low AS vs_stock_ci_low,
    ds.ci_high AS vs_stock_ci_high
FROM soft_skus s
JOIN configurations cfg ON cfg.id = s.configuration_id
LEFT JOIN validations vp ON vp.soft_sku_id = s.id AND vp.against = 'production'
LEFT JOIN decisions dp ON dp.id = vp.decision_id
LEFT JOIN validations vs ON vs.soft_sku_id = s.id AND vs.against = 'stock'
LEFT JOIN decisions ds ON ds.id = vs.decision_id
"""


def upgrade() -> None:
    op.execute(V_COMPARISONS)
    op.execute(V_SOFT_SKUS)


def downgrade() -> None:
    op.execute("DROP VIEW v_soft_skus")
    op.execute("DROP VIEW v_comparisons")
