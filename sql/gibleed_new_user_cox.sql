-- New-user cohort study on the Eunomia GiBleed store: celecoxib (target, treatment = 1) vs
-- diclofenac (comparator, treatment = 0), outcome GI bleed (concept 192671 and descendants).
--
--   epifusion sql --omop tests/data/gibleed -f sql/gibleed_new_user_cox.sql
--
-- Design (CohortMethod conventions): first exposure only (first drug_era of either drug),
-- persons exposed to both drugs removed, 365 days of prior observation (washout), subjects with
-- the outcome before cohort start removed, risk window from cohort start (day 0) to day 365
-- after it, censored at the end of observation; at least 1 day at risk. (GiBleed's first drug
-- eras last a single day, so the on-treatment window "0 → 0 at cohort end" holds no outcomes;
-- the fixed 365-day window anchored at the cohort start is the usual alternative.)
-- Time is integer days, both ends inclusive: time = outcome day − risk start + 1 for events,
-- else the window length.

-- Day numbers (days since 1970-01-01) make date arithmetic explicit.
CREATE VIEW exposure_era AS
SELECT person_id,
       drug_concept_id,
       CAST(drug_era_start_date AS INT) AS start_day,
       CAST(drug_era_end_date AS INT) AS end_day
FROM drug_era
WHERE drug_concept_id IN (1118084, 1124300);

-- First exposure per person (either drug); remember whether the person ever took both.
CREATE VIEW first_exposure AS
SELECT person_id, drug_concept_id, start_day, end_day, n_drugs
FROM (
  SELECT person_id, drug_concept_id, start_day, end_day,
         row_number() OVER (PARTITION BY person_id ORDER BY start_day, drug_concept_id) AS rn,
         count(DISTINCT drug_concept_id) OVER (PARTITION BY person_id) AS n_drugs
  FROM exposure_era
) WHERE rn = 1;

CREATE VIEW gi_bleed AS
SELECT co.person_id, CAST(co.condition_start_date AS INT) AS day
FROM condition_occurrence co
JOIN concept_ancestor ca ON ca.descendant_concept_id = co.condition_concept_id
WHERE ca.ancestor_concept_id = 192671;

-- Observation period containing the cohort start (persons without a person row are dropped).
CREATE VIEW exposure_observed AS
SELECT f.*, CAST(op.observation_period_start_date AS INT) AS obs_start,
       CAST(op.observation_period_end_date AS INT) AS obs_end
FROM first_exposure f
JOIN person p ON p.person_id = f.person_id
JOIN observation_period op ON op.person_id = f.person_id
  AND CAST(op.observation_period_start_date AS INT) <= f.start_day
  AND f.start_day <= CAST(op.observation_period_end_date AS INT);

-- Outcomes before the cohort start (prior) and the first one on or after it.
CREATE VIEW outcome_days AS
SELECT e.person_id,
       max(CASE WHEN g.day < e.start_day THEN 1 ELSE 0 END) AS prior_outcome,
       min(CASE WHEN g.day >= e.start_day THEN g.day END) AS next_outcome
FROM exposure_observed e
LEFT JOIN gi_bleed g ON g.person_id = e.person_id
GROUP BY e.person_id;

CREATE VIEW cohort AS
SELECT e.person_id,
       CASE WHEN e.drug_concept_id = 1118084 THEN 1 ELSE 0 END AS treatment,
       e.start_day AS risk_start,
       least(e.start_day + 365, e.obs_end) AS risk_end,
       e.n_drugs,
       e.start_day - e.obs_start AS prior_days,
       o.prior_outcome,
       o.next_outcome
FROM exposure_observed e
JOIN outcome_days o ON o.person_id = e.person_id;

CREATE VIEW study_population AS
SELECT * FROM cohort
WHERE n_drugs = 1 AND prior_days >= 365 AND prior_outcome = 0 AND risk_end - risk_start + 1 >= 1;

-- Attrition: subjects after each step, by treatment group.
CREATE VIEW attrition AS
SELECT 1 AS step, 'first exposure, observed' AS description, treatment, count(*) AS subjects FROM cohort GROUP BY treatment
UNION ALL SELECT 2, 'not in both cohorts', treatment, count(*) FROM cohort WHERE n_drugs = 1 GROUP BY treatment
UNION ALL SELECT 3, '365 days prior observation', treatment, count(*) FROM cohort WHERE n_drugs = 1 AND prior_days >= 365 GROUP BY treatment
UNION ALL SELECT 4, 'no prior outcome', treatment, count(*) FROM study_population GROUP BY treatment;

CREATE VIEW cohort_outcomes AS
SELECT CAST(person_id AS BIGINT) AS row_id,
       CAST(CASE WHEN next_outcome IS NOT NULL AND next_outcome <= risk_end
                 THEN next_outcome - risk_start + 1 ELSE risk_end - risk_start + 1 END AS DOUBLE) AS time,
       CASE WHEN next_outcome IS NOT NULL AND next_outcome <= risk_end THEN 1 ELSE 0 END AS y
FROM study_population;

-- Covariate 1 = treatment (never penalized); baseline: female (2), age groups by decade (10+).
CREATE VIEW cohort_covariates AS
SELECT CAST(s.person_id AS BIGINT) AS row_id, CAST(1 AS BIGINT) AS covariate_id, 1.0 AS covariate_value
FROM study_population s WHERE s.treatment = 1
UNION ALL
SELECT CAST(s.person_id AS BIGINT), CAST(2 AS BIGINT), 1.0
FROM study_population s JOIN person p ON p.person_id = s.person_id WHERE p.gender_concept_id = 8532;

SELECT step, description, treatment, subjects FROM attrition ORDER BY step, treatment;

SELECT covariate_id, estimate, exp_estimate AS hazard_ratio, std_error, exp(ci_lower) AS hr_lower,
       exp(ci_upper) AS hr_upper, log_likelihood, iterations, status
FROM cox_fit('cohort_outcomes', 'cohort_covariates', '{"ci": "profile"}');
