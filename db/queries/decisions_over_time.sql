-- Decisions over time.
-- Answers: "how many comparisons finished per day (UTC) and with what outcome, per service?"
-- A rising share of inconclusive or guardrail outcomes points at noisy hosts or a too-small
-- min_effect; a falling rate of decisions at fleet capacity taken away from the tuner.
SELECT
    SUBSTR(CAST(d.decided_at AS VARCHAR(40)), 1, 10) AS day,
    e.service,
    d.decision,
    COUNT(*) AS comparisons,
    AVG(d.estimate) AS mean_estimate,
    SUM(d.host_time_s) / 3600.0 AS host_hours
FROM decisions d
JOIN comparisons c ON c.id = d.comparison_id
JOIN experiments e ON e.id = c.experiment_id
GROUP BY SUBSTR(CAST(d.decided_at AS VARCHAR(40)), 1, 10), e.service, d.decision
ORDER BY day, e.service, d.decision;
