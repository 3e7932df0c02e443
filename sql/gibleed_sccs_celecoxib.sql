-- Self-controlled case series on the Eunomia GiBleed store: celecoxib and GI bleed.
--
--   epifusion sql --omop data/gibleed -f sql/gibleed_sccs_celecoxib.sql
--
-- Design (OHDSI SelfControlledCaseSeries conventions, DESIGN.md §3.1): cases are observation
-- periods with a GI bleed (concept 192671 and its descendants, condition_occurrence); exposure
-- = celecoxib drug eras (ingredient 1118084). Risk window from the era start to 30 days after
-- the era end (GiBleed's eras last one day); age and season as quadratic splines, constant
-- within calendar months; the end-of-observation probe (last 30 days). Covariate ids: 1000 risk
-- window, 99 probe, 101+ age, 201+ season (see sccs_covariate_ref). A pre-exposure window
-- (reverse-causality diagnostic) is one more entry of risk_windows:
--   {"start": -30, "end": -1, "end_anchor": "era_start"}
-- (GiBleed's simulation puts no outcome before exposure, so its estimate runs to −∞ here).
--
-- The settings are one JSON document; each table function call builds the design from it, so
-- keep the tables once with CREATE TABLE before fitting.

CREATE TABLE sccs_intervals_celecoxib AS SELECT * FROM sccs_intervals('{
  "outcome": {"concept_ids": [192671], "include_descendants": true},
  "exposures": [{"concept_ids": [1118084], "label": "celecoxib",
                 "risk_windows": [{"start": 0, "end": 30, "label": "exposed (era start to era end + 30 days)"}]}],
  "age_spline": {"knots": 5}, "season_spline": {"knots": 5},
  "end_of_observation_probe": 30}');

CREATE TABLE sccs_covariates_celecoxib AS SELECT * FROM sccs_covariates('{
  "outcome": {"concept_ids": [192671], "include_descendants": true},
  "exposures": [{"concept_ids": [1118084], "label": "celecoxib",
                 "risk_windows": [{"start": 0, "end": 30, "label": "exposed (era start to era end + 30 days)"}]}],
  "age_spline": {"knots": 5}, "season_spline": {"knots": 5},
  "end_of_observation_probe": 30}');

-- Attrition: persons, cases and outcomes left after each step.
SELECT * FROM sccs_attrition('{
  "outcome": {"concept_ids": [192671], "include_descendants": true},
  "exposures": [{"concept_ids": [1118084], "label": "celecoxib",
                 "risk_windows": [{"start": 0, "end": 30, "label": "exposed (era start to era end + 30 days)"}]}],
  "age_spline": {"knots": 5}, "season_spline": {"knots": 5},
  "end_of_observation_probe": 30}');

-- Unpenalized conditional Poisson fit; incidence rate ratios with Wald intervals.
SELECT covariate_id, estimate, exp_estimate AS irr, exp(ci_lower) AS irr_lower,
       exp(ci_upper) AS irr_upper, log_likelihood, status
FROM sccs_fit('sccs_intervals_celecoxib', 'sccs_covariates_celecoxib', '{"ci": "wald"}')
WHERE covariate_id IN (99, 1000)
ORDER BY covariate_id;
