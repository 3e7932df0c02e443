-- New-user cohort study on the Eunomia GiBleed store: celecoxib (target, treatment = 1) vs
-- diclofenac (comparator, treatment = 0), outcome GI bleed (concept 192671 and descendants).
--
--   epifusion sql --omop data/gibleed -f sql/gibleed_new_user_cox.sql
--
-- Design (OHDSI CohortMethod conventions, DESIGN.md §3.2; the population SQL is
-- sql/study/cohort_population.sql): first exposure only (first drug era of each drug), persons
-- in both cohorts removed, 365 days of prior observation (washout), subjects with the outcome
-- before the risk window removed, risk window from cohort start (day 0) to day 365 after it,
-- censored at the end of observation, at least 1 day at risk. (GiBleed's drug eras are short,
-- so the on-treatment window "0 → 0 at cohort end" holds almost no outcomes; the fixed 365-day
-- window anchored at the cohort start is the usual alternative.) Time is integer days, both
-- ends inclusive: time = outcome day − risk start + 1 for events, else the window length.
-- Covariates: 1 = treatment (never penalized); baseline covariates in the 365 days before
-- cohort start, FeatureExtraction-style ids concept_id × 1000 + analysis id (1 gender,
-- 3 age group, 102 conditions, 302 drugs, 702 procedures; see cohort_covariate_ref).

CREATE TABLE cox_outcomes AS SELECT * FROM cohort_outcomes('{
  "target": {"concept_ids": [1118084]}, "comparator": {"concept_ids": [1124300]},
  "outcome": {"concept_ids": [192671], "include_descendants": true},
  "first_exposure_only": true, "remove_duplicate_subjects": "remove_all", "washout_days": 365,
  "risk_window_start": 0, "start_anchor": "cohort_start",
  "risk_window_end": 365, "end_anchor": "cohort_start"}');

CREATE TABLE cox_covariates AS SELECT * FROM cohort_covariates('{
  "target": {"concept_ids": [1118084]}, "comparator": {"concept_ids": [1124300]},
  "outcome": {"concept_ids": [192671], "include_descendants": true},
  "first_exposure_only": true, "remove_duplicate_subjects": "remove_all", "washout_days": 365,
  "risk_window_start": 0, "start_anchor": "cohort_start",
  "risk_window_end": 365, "end_anchor": "cohort_start"}');

-- Attrition: persons and outcomes per group after each step.
SELECT * FROM cohort_attrition('{
  "target": {"concept_ids": [1118084]}, "comparator": {"concept_ids": [1124300]},
  "outcome": {"concept_ids": [192671], "include_descendants": true},
  "first_exposure_only": true, "remove_duplicate_subjects": "remove_all", "washout_days": 365,
  "risk_window_start": 0, "start_anchor": "cohort_start",
  "risk_window_end": 365, "end_anchor": "cohort_start"}');

-- Unadjusted hazard ratio (treatment only), profile-likelihood interval.
SELECT covariate_id, estimate, exp_estimate AS hazard_ratio, std_error, exp(ci_lower) AS hr_lower,
       exp(ci_upper) AS hr_upper, log_likelihood, iterations, status
FROM cox_fit('cox_outcomes', 'SELECT * FROM cox_covariates WHERE covariate_id = 1', '{"ci": "profile"}');

-- Adjusted: baseline covariates under a Laplace prior, the treatment never penalized.
SELECT covariate_id, estimate, exp_estimate AS hazard_ratio, log_likelihood, iterations, status
FROM cox_fit('cox_outcomes', 'cox_covariates',
             '{"prior": "laplace", "variance": 0.1, "exclude": [1], "ci": "none"}')
WHERE covariate_id = 1;
