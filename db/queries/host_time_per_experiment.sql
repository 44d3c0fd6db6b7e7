-- Host time spent per experiment, split by outcome.
-- Answers: "how many host-hours did each experiment consume, and how much of it went into
-- comparisons that decided something vs. ones that were inconclusive, pruned or aborted?"
SELECT
    e.id AS experiment_id,
    e.name AS experiment,
    e.service,
    e.platform,
    e.status,
    COUNT(c.id) AS comparisons,
    SUM(CASE WHEN d.decision IN ('better', 'worse', 'no_difference') THEN 1 ELSE 0 END)
        AS decided,
    SUM(CASE WHEN d.decision = 'inconclusive' THEN 1 ELSE 0 END) AS inconclusive,
    SUM(CASE WHEN d.decision = 'guardrail' THEN 1 ELSE 0 END) AS pruned,
    SUM(CASE WHEN d.decision = 'aborted' OR c.status = 'aborted' THEN 1 ELSE 0 END) AS aborted,
    COALESCE(SUM(d.host_time_s), 0) / 3600.0 AS host_hours,
    COALESCE(SUM(CASE WHEN d.decision = 'inconclusive' THEN d.host_time_s END), 0) / 3600.0
        AS inconclusive_host_hours
FROM experiments e
LEFT JOIN comparisons c ON c.experiment_id = e.id
LEFT JOIN decisions d ON d.comparison_id = c.id
GROUP BY e.id, e.name, e.service, e.platform, e.status
ORDER BY e.id;
