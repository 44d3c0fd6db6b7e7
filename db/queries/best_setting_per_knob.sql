-- Best setting per knob per service and platform.
-- Answers: "for each knob we swept on a service/platform, which setting won, by how much and
-- how sure are we?" Only settings the A/B tester judged BETTER than the baseline count; knobs
-- with no better setting do not appear (keep the baseline there). Effects are relative gains
-- of the primary metric (+0.042 = 4.2 % better), with the confidence interval. Only the knob's
-- own comparisons against the baseline count (purpose `knob:<knob>`): the sweep's run-offs and
-- confirmations (`knob:<knob>:runoff`, `knob:<knob>:confirm`) compare settings with each other.
-- Runs stopped by `musku abort` do not count.
WITH ranked AS (
    SELECT
        e.service,
        e.platform,
        SUBSTR(c.purpose, 6) AS knob,
        CASE SUBSTR(c.purpose, 6)
            WHEN 'core_freq' THEN
                CASE WHEN cc.core_turbo THEN 'turbo' ELSE CAST(cc.core_freq AS VARCHAR(20)) END
            WHEN 'uncore_freq' THEN
                CASE WHEN cc.uncore_turbo THEN 'turbo' ELSE CAST(cc.uncore_freq AS VARCHAR(20)) END
            WHEN 'core_count' THEN CAST(cc.core_count AS VARCHAR(20))
            WHEN 'cdp' THEN cc.cdp
            WHEN 'prefetch' THEN cc.prefetch
            WHEN 'thp' THEN cc.thp
            WHEN 'shp' THEN CAST(cc.shp AS VARCHAR(20))
        END AS setting,
        d.estimate,
        d.ci_low,
        d.ci_high,
        d.samples,
        e.name AS experiment,
        c.id AS comparison_id,
        ROW_NUMBER() OVER (
            PARTITION BY e.service, e.platform, c.purpose
            ORDER BY d.estimate DESC, c.id DESC
        ) AS place
    FROM comparisons c
    JOIN experiments e ON e.id = c.experiment_id
    JOIN decisions d ON d.comparison_id = c.id
    JOIN configurations cc ON cc.id = c.candidate_id
    WHERE c.purpose LIKE 'knob:%'
      AND c.purpose NOT LIKE 'knob:%:%'
      AND d.decision = 'better'
      AND e.status <> 'aborted'  -- an aborted run's findings rank nowhere
)
SELECT service, platform, knob, setting, estimate, ci_low, ci_high, samples, experiment,
       comparison_id
FROM ranked
WHERE place = 1
ORDER BY service, platform, knob;
