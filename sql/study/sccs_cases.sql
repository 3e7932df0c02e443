-- SCCS study population (OHDSI SelfControlledCaseSeries conventions, DESIGN.md §3.1).
--
-- One row per candidate case = observation period (of a person with a `person` row) holding at
-- least one outcome. Days are integers since 1970-01-01, both ends inclusive. The columns
-- n_* count the outcomes left after each study-population step, and `dropped_at` names the
-- first step that removes the case (0 = kept), which gives the attrition table in one pass:
--   2 first outcome only (the person's first outcome ever must lie in this period),
--   3 gender, 4 study period, 5 minimum / maximum age, 6 naive period.
-- The case's window is [start_day, end_day]; outcomes outside it are not counted.
--
-- Placeholders: {outcome} (person_id, concept_id, start_day, end_day), {first_only_pass}
-- (TRUE, or `e.is_first` for "first outcome only"), {study_start} / {study_end} (day numbers),
-- {min_age_days} / {max_age_end_days} (age limits in days), {naive_period} (days),
-- {gender_ok} (a condition on gender_concept_id), {range_columns} / {range_join} (empty, or the
-- columns `era_first_day` / `era_last_day` of one exposure's calendar range and its cross join,
-- which {study_start} / {study_end} then refer to as `o.era_first_day` / `o.era_last_day`).
WITH outcome AS (
  {outcome}
),
outcome_numbered AS (
  SELECT person_id, start_day AS day,
         row_number() OVER (PARTITION BY person_id ORDER BY start_day) = 1 AS is_first
  FROM outcome
),
observed AS (
  SELECT op.person_id, op.observation_period_id,
         CAST(op.observation_period_start_date AS INT) AS obs_start,
         CAST(op.observation_period_end_date AS INT) AS obs_end,
         CAST(make_date(CAST(p.year_of_birth AS INT), CAST(coalesce(p.month_of_birth, 1) AS INT),
                        CAST(coalesce(p.day_of_birth, 1) AS INT)) AS INT) AS birth_day,
         p.gender_concept_id{range_columns}
  FROM observation_period op
  JOIN person p ON p.person_id = op.person_id{range_join}
),
windowed AS (
  SELECT o.*,
         greatest(o.obs_start, {study_start}) AS study_start_day,
         least(o.obs_end, {study_end}) AS study_end_day,
         greatest(o.obs_start, {study_start}, o.birth_day + {min_age_days}) AS age_start_day,
         least(o.obs_end, {study_end}, o.birth_day + {max_age_end_days}) AS end_day,
         greatest(o.obs_start, {study_start}, o.birth_day + {min_age_days},
                  o.obs_start + {naive_period}) AS start_day
  FROM observed o
),
counted AS (
  SELECT w.person_id, w.observation_period_id, w.obs_start, w.obs_end, w.birth_day,
         w.gender_concept_id, w.start_day, w.end_day,
         count(*) AS n_observed,
         sum(CASE WHEN {first_only_pass} THEN 1 ELSE 0 END) AS n_first,
         sum(CASE WHEN {first_only_pass}
                   AND e.day BETWEEN w.study_start_day AND w.study_end_day THEN 1 ELSE 0 END) AS n_study,
         sum(CASE WHEN {first_only_pass}
                   AND e.day BETWEEN w.age_start_day AND w.end_day THEN 1 ELSE 0 END) AS n_age,
         sum(CASE WHEN {first_only_pass}
                   AND e.day BETWEEN w.start_day AND w.end_day THEN 1 ELSE 0 END) AS n_naive
  FROM windowed w
  JOIN outcome_numbered e
    ON e.person_id = w.person_id AND e.day BETWEEN w.obs_start AND w.obs_end
  GROUP BY w.person_id, w.observation_period_id, w.obs_start, w.obs_end, w.birth_day,
           w.gender_concept_id, w.start_day, w.end_day
)
SELECT person_id, observation_period_id, obs_start, obs_end, birth_day, gender_concept_id,
       start_day, end_day, n_observed, n_first, n_study, n_age, n_naive,
       CASE WHEN n_first = 0 THEN 2
            WHEN NOT ({gender_ok}) THEN 3
            WHEN n_study = 0 THEN 4
            WHEN n_age = 0 THEN 5
            WHEN n_naive = 0 THEN 6
            ELSE 0 END AS dropped_at
FROM counted
ORDER BY person_id, obs_start
