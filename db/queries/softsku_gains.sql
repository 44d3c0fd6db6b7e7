-- Soft SKU gains with confidence intervals, across platforms.
-- Answers: "what does the newest soft SKU of each service buy on each platform, against the
-- production configuration and against the stock one?" Gains are in percent of the primary
-- metric; NULL means that validation was not run. Soft SKUs of failed experiments (a run that
-- crashed after composing its SKU) and of aborted ones (`musku abort`) do not count.
WITH kept AS (
    SELECT s.*
    FROM v_soft_skus s
    JOIN experiments e ON e.id = s.experiment_id
    WHERE e.status NOT IN ('failed', 'aborted')
),
latest AS (
    SELECT service, platform, MAX(soft_sku_id) AS soft_sku_id
    FROM kept
    GROUP BY service, platform
)
SELECT
    s.service,
    s.platform,
    s.soft_sku_id,
    s.configuration_key,
    100.0 * s.vs_production_estimate AS vs_production_pct,
    100.0 * s.vs_production_ci_low AS vs_production_ci_low_pct,
    100.0 * s.vs_production_ci_high AS vs_production_ci_high_pct,
    s.vs_production_decision,
    100.0 * s.vs_stock_estimate AS vs_stock_pct,
    100.0 * s.vs_stock_ci_low AS vs_stock_ci_low_pct,
    100.0 * s.vs_stock_ci_high AS vs_stock_ci_high_pct,
    s.vs_stock_decision,
    s.created_at
FROM kept s
JOIN latest l ON l.soft_sku_id = s.soft_sku_id
ORDER BY s.service, s.platform;
