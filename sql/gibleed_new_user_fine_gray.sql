-- New-user cohort study with a competing event on the Eunomia GiBleed store: celecoxib
-- (treatment = 1) vs diclofenac (0), outcome GI bleed (192671 and descendants), competing
-- event diverticular disease (4266809), whichever comes first; Fine–Gray subdistribution hazards.
--
--   epifusion sql --omop data/gibleed -f sql/gibleed_new_user_fine_gray.sql
--
-- GiBleed's `death` table is empty, so the competing event here is another outcome; on stores
-- with deaths (MIMIC-IV demo, Synthea27Nj) use "competing": {"death": true} (both may be given).
-- Same population as sql/gibleed_new_user_cox.sql; y = 1 GI bleed, 2 diverticular disease first,
-- 0 censored (end of the 365-day window or of observation); time in days, both ends inclusive.

CREATE TABLE fg_outcomes AS SELECT * FROM cohort_outcomes('{
  "target": {"concept_ids": [1118084]}, "comparator": {"concept_ids": [1124300]},
  "outcome": {"concept_ids": [192671], "include_descendants": true},
  "competing": {"death": true, "outcome": {"concept_ids": [4266809]}}, "model": "fine_gray",
  "first_exposure_only": true, "remove_duplicate_subjects": "remove_all", "washout_days": 365,
  "risk_window_end": 365, "end_anchor": "cohort_start",
  "covariates": {"conditions": false, "drugs": false, "procedures": false}}');

CREATE TABLE fg_covariates AS SELECT * FROM cohort_covariates('{
  "target": {"concept_ids": [1118084]}, "comparator": {"concept_ids": [1124300]},
  "outcome": {"concept_ids": [192671], "include_descendants": true},
  "competing": {"death": true, "outcome": {"concept_ids": [4266809]}}, "model": "fine_gray",
  "first_exposure_only": true, "remove_duplicate_subjects": "remove_all", "washout_days": 365,
  "risk_window_end": 365, "end_anchor": "cohort_start",
  "covariates": {"conditions": false, "drugs": false, "procedures": false}}');

-- Attrition: persons and outcomes per group after each step.
SELECT * FROM cohort_attrition('{
  "target": {"concept_ids": [1118084]}, "comparator": {"concept_ids": [1124300]},
  "outcome": {"concept_ids": [192671], "include_descendants": true},
  "competing": {"death": true, "outcome": {"concept_ids": [4266809]}}, "model": "fine_gray",
  "first_exposure_only": true, "remove_duplicate_subjects": "remove_all", "washout_days": 365,
  "risk_window_end": 365, "end_anchor": "cohort_start",
  "covariates": {"conditions": false, "drugs": false, "procedures": false}}');

-- Events by group: censored (0), GI bleed (1), diverticular disease first (2).
SELECT treatment, y, count(*) AS subjects FROM fg_outcomes GROUP BY treatment, y ORDER BY treatment, y;

-- Subdistribution hazard ratio of celecoxib vs diclofenac, adjusted for female gender
-- (covariate 8532001). The baseline covariates come FeatureExtraction-style, one indicator per
-- level (both genders, every age group), so an unpenalized fit must leave a reference level
-- out; under a prior (as in gibleed_new_user_cox.sql) all of them can stay.
SELECT covariate_id, estimate, exp_estimate AS subdistribution_hr, std_error,
       exp(ci_lower) AS shr_lower, exp(ci_upper) AS shr_upper, log_likelihood, iterations, status
FROM fine_gray_fit('fg_outcomes', 'SELECT * FROM fg_covariates WHERE covariate_id IN (1, 8532001)',
                   '{"ci": "wald"}')
ORDER BY covariate_id;
