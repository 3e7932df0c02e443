-- Self-controlled case series on the Eunomia GiBleed store: diclofenac and GI bleed.
--
--   epifusion sql --omop data/gibleed -f sql/gibleed_sccs_diclofenac.sql
--
-- Design (OHDSI SelfControlledCaseSeries conventions, DESIGN.md §3.1): cases are observation
-- periods with a GI bleed (concept 192671 and its descendants, condition_occurrence); exposure
-- = diclofenac drug eras (ingredient 1124300). Risk window from the era start to 30 days after
-- the era end (GiBleed's eras last one day); age groups in the SCCS R package / Stata convention
-- (age_group_starts in days of age); season as a cyclic quadratic spline, constant within
-- calendar months; the end-of-observation probe (last 30 days). Covariate ids: 1000 risk
-- window, 99 probe, 101 age group, 201+ season (see sccs_covariate_ref).
--
-- Ages: GiBleed's simulated bleeds all fall between ages 30 and 49, so an age group outside
-- that range has person-time but no outcome, and its effect has no finite estimate (age groups
-- from 20, 40, 60 and 80 years fit with status no_finite_mle, the notes naming the groups). The
-- study population is therefore ages 30–49 (min_age, max_age), with ages 40–49 as one age group
-- against 30–39. A pre-exposure window
-- (reverse-causality diagnostic) is one more entry of risk_windows:
--   {"start": -30, "end": -1, "end_anchor": "era_start"}
-- (GiBleed's simulation puts no outcome before exposure, so its estimate runs to −∞ here).
--
-- The settings are one JSON document; each table function call builds the design from it, so
-- keep the tables once with CREATE TABLE before fitting.

CREATE TABLE sccs_intervals_diclofenac AS SELECT * FROM sccs_intervals('{
  "outcome": {"concept_ids": [192671], "include_descendants": true},
  "exposures": [{"concept_ids": [1124300], "label": "diclofenac",
                 "risk_windows": [{"start": 0, "end": 30, "label": "exposed (era start to era end + 30 days)"}]}],
  "min_age": 30, "max_age": 49, "age_group_starts": [14610], "season_spline": {"knots": 5},
  "end_of_observation_probe": 30}');

CREATE TABLE sccs_covariates_diclofenac AS SELECT * FROM sccs_covariates('{
  "outcome": {"concept_ids": [192671], "include_descendants": true},
  "exposures": [{"concept_ids": [1124300], "label": "diclofenac",
                 "risk_windows": [{"start": 0, "end": 30, "label": "exposed (era start to era end + 30 days)"}]}],
  "min_age": 30, "max_age": 49, "age_group_starts": [14610], "season_spline": {"knots": 5},
  "end_of_observation_probe": 30}');

-- Attrition: persons, cases and outcomes left after each step.
SELECT * FROM sccs_attrition('{
  "outcome": {"concept_ids": [192671], "include_descendants": true},
  "exposures": [{"concept_ids": [1124300], "label": "diclofenac",
                 "risk_windows": [{"start": 0, "end": 30, "label": "exposed (era start to era end + 30 days)"}]}],
  "min_age": 30, "max_age": 49, "age_group_starts": [14610], "season_spline": {"knots": 5},
  "end_of_observation_probe": 30}');

-- Unpenalized conditional Poisson fit; incidence rate ratios with Wald intervals.
SELECT covariate_id, estimate, exp_estimate AS irr, exp(ci_lower) AS irr_lower,
       exp(ci_upper) AS irr_upper, log_likelihood, status
FROM sccs_fit('sccs_intervals_diclofenac', 'sccs_covariates_diclofenac', '{"ci": "wald"}')
WHERE covariate_id IN (99, 1000)
ORDER BY covariate_id;
