-- Comparisons that ended inconclusive.
-- Answers: "where did the A/B tester hit its sample cap without deciding, and what did that
-- cost?" These are candidates for a re-run with more hosts, a larger min_effect, or a longer
-- cap. The interval width shows how far from a decision each one was.
SELECT
    v.experiment,
    v.service,
    v.platform,
    v.purpose,
    v.candidate_key,
    v.estimate,
    v.ci_low,
    v.ci_high,
    v.ci_high - v.ci_low AS ci_width,
    v.samples,
    v.host_time_s / 3600.0 AS host_hours,
    v.reason,
    v.comparison_id
FROM v_comparisons v
WHERE v.decision = 'inconclusive'
ORDER BY v.host_time_s DESC, v.comparison_id;
