-- Raw A/B effect from the samples next to the tester's estimate.
-- Answers: "does the simple ratio of means of the kept windows (B over A) agree with the
-- decision the sequential tester recorded?" A large gap flags a comparison worth a look
-- (drift between hosts, a bad warm-up cut, outliers). For a LOWER-is-better metric the
-- tester's estimate has the opposite sign of raw_effect.
SELECT
    v.comparison_id,
    v.experiment,
    v.purpose,
    v.decision,
    v.estimate,
    AVG(CASE WHEN s.role = 'B' THEN s.value END) / AVG(CASE WHEN s.role = 'A' THEN s.value END)
        - 1.0 AS raw_effect,
    SUM(CASE WHEN s.role = 'A' THEN 1 ELSE 0 END) AS kept_a,
    SUM(CASE WHEN s.role = 'B' THEN 1 ELSE 0 END) AS kept_b
FROM v_comparisons v
JOIN samples s ON s.comparison_id = v.comparison_id
WHERE s.valid AND NOT s.warmup
GROUP BY v.comparison_id, v.experiment, v.purpose, v.decision, v.estimate
ORDER BY v.comparison_id;
