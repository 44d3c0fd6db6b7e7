-- Sample distribution of one comparison, per role and period.
-- Answers: "what did the raw windows of comparison :comparison_id look like?" Per role
-- (A = baseline, B = candidate) and crossover period: how many windows were kept, dropped as
-- warm-up or invalid (knob state changed outside musku), and the mean, spread and range of
-- the primary metric over the kept ones.
-- Parameter :comparison_id (sqlite3: .param set :comparison_id 3; psql: \set comparison_id 3).
SELECT
    s.role,
    s.period,
    COUNT(*) AS windows,
    SUM(CASE WHEN s.warmup THEN 1 ELSE 0 END) AS warmup,
    SUM(CASE WHEN NOT s.valid THEN 1 ELSE 0 END) AS invalid,
    SUM(CASE WHEN s.valid AND NOT s.warmup THEN 1 ELSE 0 END) AS kept,
    AVG(CASE WHEN s.valid AND NOT s.warmup THEN s.value END) AS mean_value,
    MIN(CASE WHEN s.valid AND NOT s.warmup THEN s.value END) AS min_value,
    MAX(CASE WHEN s.valid AND NOT s.warmup THEN s.value END) AS max_value,
    AVG(CASE WHEN s.valid AND NOT s.warmup THEN s.value * s.value END)
      - AVG(CASE WHEN s.valid AND NOT s.warmup THEN s.value END)
      * AVG(CASE WHEN s.valid AND NOT s.warmup THEN s.value END) AS variance,
    AVG(CASE WHEN s.valid AND NOT s.warmup THEN s.p99_ms END) AS mean_p99_ms,
    MIN(s.t) AS first_t,
    MAX(s.t) AS last_t
FROM samples s
WHERE s.comparison_id = :comparison_id
GROUP BY s.role, s.period
ORDER BY s.role, s.period;
