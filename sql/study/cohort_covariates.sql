-- Baseline covariates of a cohort study population, in the spirit of OHDSI FeatureExtraction's
-- default settings: covariate_id = concept_id × 1000 + analysis_id (age group: group × 1000 + 3).
--
--   analysis   1  gender (gender_concept_id)
--   analysis   3  age group (5-year groups of age at cohort start)
--   analysis 102  condition_occurrence starting in [start − lookback, start + end_days]
--   analysis 302  drug_exposure starting in that window
--   analysis 702  procedure_occurrence in that window
--
-- {population}: person_id, entry_seq (the entry's key), start_day, birth_day, gender_concept_id;
-- {excluded}: concept ids never used as covariates (the exposures); {lookback}, {end_days};
-- {use_*}: TRUE / FALSE. Rows are keyed by (person_id, entry_seq); the caller maps them to row_id.
WITH population AS (
  SELECT * FROM {population}
),
excluded AS (
  {excluded}
)
SELECT person_id, entry_seq, gender_concept_id * 1000 + 1 AS covariate_id, 1 AS analysis_id,
       gender_concept_id AS concept_id
FROM population
WHERE {use_gender} AND gender_concept_id IS NOT NULL AND gender_concept_id <> 0
UNION ALL
SELECT person_id, entry_seq, CAST(floor((start_day - birth_day) / 365.25 / 5) AS BIGINT) * 1000 + 3, 3,
       CAST(NULL AS BIGINT)
FROM population
WHERE {use_age_group} AND birth_day IS NOT NULL
UNION ALL
SELECT DISTINCT p.person_id, p.entry_seq, x.condition_concept_id * 1000 + 102, 102, x.condition_concept_id
FROM population p
JOIN condition_occurrence x
  ON x.person_id = p.person_id
 AND CAST(x.condition_start_date AS INT) BETWEEN p.start_day - {lookback} AND p.start_day + {end_days}
LEFT JOIN excluded e ON e.concept_id = x.condition_concept_id
WHERE {use_conditions} AND e.concept_id IS NULL AND x.condition_concept_id <> 0
UNION ALL
SELECT DISTINCT p.person_id, p.entry_seq, x.drug_concept_id * 1000 + 302, 302, x.drug_concept_id
FROM population p
JOIN drug_exposure x
  ON x.person_id = p.person_id
 AND CAST(x.drug_exposure_start_date AS INT) BETWEEN p.start_day - {lookback} AND p.start_day + {end_days}
LEFT JOIN excluded e ON e.concept_id = x.drug_concept_id
WHERE {use_drugs} AND e.concept_id IS NULL AND x.drug_concept_id <> 0
UNION ALL
SELECT DISTINCT p.person_id, p.entry_seq, x.procedure_concept_id * 1000 + 702, 702, x.procedure_concept_id
FROM population p
JOIN procedure_occurrence x
  ON x.person_id = p.person_id
 AND CAST(x.procedure_date AS INT) BETWEEN p.start_day - {lookback} AND p.start_day + {end_days}
LEFT JOIN excluded e ON e.concept_id = x.procedure_concept_id
WHERE {use_procedures} AND e.concept_id IS NULL AND x.procedure_concept_id <> 0
