//! The propensity model: CohortMethod's `createPs`.
//!
//! # Model
//!
//! L1-regularized (Laplace prior) logistic regression of treatment (target = 1) on the baseline
//! covariates, fitted by the crate's engine ([`crate::fit::fit`], model
//! [`ModelKind::Logistic`]): maximize
//!
//! `Σ_i [t_i η_i − log(1 + e^{η_i})] − λ Σ_j |β_j|`, `η_i = β_0 + Σ_j x_ij β_j`, `λ = √(2/v)`
//!
//! with the intercept `β_0` unpenalized (Cyclops' `exclude = c(0)`). The prior variance `v` is
//! chosen by Cyclops' auto cross-validation search (10 folds × 10 repetitions, starting variance
//! 0.01, seed 1) unless [`PsSettings::variance`] fixes it. The propensity score of subject `i`
//! is `1/(1 + e^{−η_i})`, **rounded to 10 decimals** as `createPs` does.
//!
//! # Checks before fitting (each an [`Error::PropensityModel`])
//!
//! * both arms must be present (`createPs`: "Target or comparator cohort empty");
//! * at least one covariate must remain after `include_covariate_ids` /
//!   `exclude_covariate_ids` ("No covariate data");
//! * `errorOnHighCorrelation` (Cyclops' `getUnivariableCorrelation(threshold = 0.5)`): any
//!   covariate whose Pearson correlation with treatment (absent entries are 0) has
//!   `|r| ≥ correlation_threshold` is an error naming every such covariate id; constant
//!   covariates (undefined `r`) are skipped, as Cyclops returns `NA` for them;
//! * **always**, even with the correlation check off: a covariate that on its own perfectly
//!   separates the arms (every target value above every comparator value, or below) is an
//!   error — such a covariate gives no usable score.
//!
//! After the fit, any status other than `converged` is an error (CohortMethod stops when
//! Cyclops' `return_flag` is not `SUCCESS`; the engine's `no_finite_mle` status is named). When
//! the fitted scores still separate the arms completely (every target score above every
//! comparator score, possible under a finite prior), [`PropensityScoreFit::arms_separated`] is
//! set and a note says so.
//!
//! # Differences from `createPs`
//!
//! * No `FeatureExtraction::tidyCovariateData` (removal of covariates in fewer than 0.1% of
//!   subjects, removal of redundant covariates, normalization of continuous ones by their
//!   maximum): the caller prepares the covariates.
//! * No down-sampling of arms above `maxCohortSizeForFitting` (and so no King–Zeng intercept
//!   correction): every subject is used.
//! * Cross-validation and convergence are the engine's ([`crate::model::cv`]: the same search,
//!   its own fold assignment and the `optimality` convergence rule at `tolerance`), so the
//!   chosen variance and the coefficients agree with Cyclops to the optimizer's tolerance, not
//!   digit for digit.
//! * `stopOnError = FALSE` (scores set to the treatment indicator) is not offered: a failed
//!   model is an error.

use serde::Deserialize;

use super::{check_len, SparseCovariates};
use crate::error::{Error, Result};
use crate::fit::{fit, CiMethod, FitOptions};
use crate::model::ccd::FitStatus;
use crate::model::cv::{CvOptions, CvSearch, Resampling};
use crate::model::design::{DesignBuilder, OutcomeRecord, INTERCEPT_ID};
use crate::model::prior::Prior;
use crate::model::ModelKind;

/// Settings of [`fit_propensity`] (every key optional; defaults are `createPs`'s).
///
/// | key | default | meaning |
/// |---|---|---|
/// | `variance` | – (cross-validate) | fixed Laplace prior variance `v > 0` (λ = √(2/v)); no cross-validation |
/// | `cv_folds` | 10 | folds of the auto search, ≥ 2 |
/// | `cv_repetitions` | 10 | repetitions of the k-fold split, ≥ 1 |
/// | `starting_variance` | 0.01 | first variance of the auto search, > 0 |
/// | `seed` | 1 | seed of the fold assignment |
/// | `tolerance` | 2e-7 | convergence tolerance, > 0 |
/// | `max_iterations` | 1000 | CCD cycles, ≥ 1 |
/// | `error_on_high_correlation` | true | error when a covariate's \|r\| with treatment ≥ `correlation_threshold` |
/// | `correlation_threshold` | 0.5 | in (0, 1] |
/// | `include_covariate_ids` | [] (all) | use only these covariates |
/// | `exclude_covariate_ids` | [] | leave these covariates out |
/// | `threads` | all cores | rayon threads of the fit (results do not depend on it) |
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct PsSettings {
    /// Fixed prior variance (no cross-validation).
    pub variance: Option<f64>,
    /// Cross-validation folds.
    pub cv_folds: usize,
    /// Cross-validation repetitions.
    pub cv_repetitions: usize,
    /// First variance of the auto search.
    pub starting_variance: f64,
    /// Seed of the fold assignment.
    pub seed: u64,
    /// Convergence tolerance.
    pub tolerance: f64,
    /// Most CCD cycles.
    pub max_iterations: usize,
    /// Whether a covariate highly correlated with treatment is an error.
    pub error_on_high_correlation: bool,
    /// The |r| at or above which a covariate is "highly correlated".
    pub correlation_threshold: f64,
    /// Use only these covariates (empty: all).
    pub include_covariate_ids: Vec<i64>,
    /// Leave these covariates out.
    pub exclude_covariate_ids: Vec<i64>,
    /// Rayon threads of the fit.
    pub threads: Option<usize>,
}

impl Default for PsSettings {
    fn default() -> Self {
        PsSettings {
            variance: None,
            cv_folds: 10,
            cv_repetitions: 10,
            starting_variance: 0.01,
            seed: 1,
            tolerance: 2e-7,
            max_iterations: 1000,
            error_on_high_correlation: true,
            correlation_threshold: 0.5,
            include_covariate_ids: Vec::new(),
            exclude_covariate_ids: Vec::new(),
            threads: None,
        }
    }
}

impl PsSettings {
    /// Validate every setting.
    pub fn check(&self) -> Result<()> {
        if let Some(v) = self.variance {
            if !(v.is_finite() && v > 0.0) {
                return Err(Error::option(
                    "variance",
                    format!("must be a finite number > 0 (got {v})"),
                ));
            }
        }
        if self.cv_folds < 2 {
            return Err(Error::option("cv_folds", "must be ≥ 2"));
        }
        if self.cv_repetitions < 1 {
            return Err(Error::option("cv_repetitions", "must be ≥ 1"));
        }
        if !(self.starting_variance.is_finite() && self.starting_variance > 0.0) {
            return Err(Error::option(
                "starting_variance",
                format!(
                    "must be a finite number > 0 (got {})",
                    self.starting_variance
                ),
            ));
        }
        if !(self.tolerance.is_finite() && self.tolerance > 0.0) {
            return Err(Error::option(
                "tolerance",
                format!("must be a finite number > 0 (got {})", self.tolerance),
            ));
        }
        if self.max_iterations == 0 {
            return Err(Error::option("max_iterations", "must be ≥ 1"));
        }
        if !(self.correlation_threshold > 0.0 && self.correlation_threshold <= 1.0) {
            return Err(Error::option(
                "correlation_threshold",
                format!("must be in (0, 1] (got {})", self.correlation_threshold),
            ));
        }
        if self.threads == Some(0) {
            return Err(Error::option("threads", "must be ≥ 1"));
        }
        Ok(())
    }

    /// The fit options [`fit_propensity`] fits the design with (logistic, Laplace prior, auto
    /// cross-validation unless `variance` is fixed).
    pub fn fit_options(&self) -> FitOptions {
        let mut o = FitOptions::new(ModelKind::Logistic);
        let v = self.variance.unwrap_or(self.starting_variance);
        o.prior = Prior::Laplace {
            lambda: (2.0 / v).sqrt(),
        };
        if self.variance.is_none() {
            o.cv = Some(CvOptions {
                folds: self.cv_folds,
                repetitions: self.cv_repetitions,
                seed: self.seed,
                search: CvSearch::Auto,
                by: Resampling::Auto,
                start_variance: Some(self.starting_variance),
                ..CvOptions::default()
            });
        }
        o.ci = CiMethod::None;
        o.ccd.tolerance = self.tolerance;
        o.ccd.max_iterations = self.max_iterations;
        o.threads = self.threads;
        o
    }
}

/// Result of [`fit_propensity`].
#[derive(Debug, Clone, PartialEq)]
pub struct PropensityScoreFit {
    /// Propensity score per subject, in input order (rounded to 10 decimals, as `createPs`).
    pub propensity_score: Vec<f64>,
    /// The intercept β₀.
    pub intercept: f64,
    /// The non-zero coefficients `(covariate_id, β)`, in increasing id order.
    pub coefficients: Vec<(i64, f64)>,
    /// The prior variance used (chosen by cross-validation, or the fixed one).
    pub variance: f64,
    /// The fit's status (always [`FitStatus::Converged`]: any other status is an error).
    pub status: FitStatus,
    /// CCD iterations of the final fit.
    pub iterations: usize,
    /// Log-likelihood at the estimate.
    pub log_likelihood: f64,
    /// Every target score is above every comparator score (or below): the arms are completely
    /// separated by the fitted model, so matching, stratification and weighting cannot adjust.
    pub arms_separated: bool,
    /// Notes (the engine's, and the separation flag).
    pub notes: Vec<String>,
}

/// Pearson correlation of each covariate with treatment (absent entries 0); `None` where a
/// covariate is constant (Cyclops' `NA`). O(nnz).
pub fn univariable_correlations(
    treatment: &[bool],
    covariates: &SparseCovariates,
) -> Result<Vec<Option<f64>>> {
    let n = treatment.len();
    check_len("treatment", n, covariates.n_rows())?;
    let nf = n as f64;
    let p = treatment.iter().filter(|&&t| t).count() as f64 / nf;
    let var_t = p * (1.0 - p);
    Ok((0..covariates.n_covariates())
        .map(|j| {
            let (mut sx, mut sxx, mut sxt) = (0.0f64, 0.0f64, 0.0f64);
            for (r, v) in covariates.column(j) {
                sx += v;
                sxx += v * v;
                if treatment[r] {
                    sxt += v;
                }
            }
            let mean = sx / nf;
            let var_x = sxx / nf - mean * mean;
            if var_t <= 0.0 || var_x.is_nan() || var_x <= 1e-12 * (sxx / nf) {
                return None;
            }
            let cov = sxt / nf - mean * p;
            Some((cov / (var_x * var_t).sqrt()).clamp(-1.0, 1.0))
        })
        .collect())
}

/// Whether covariate `j` on its own completely separates the arms (absent entries 0).
fn separates(treatment: &[bool], covariates: &SparseCovariates, j: usize, n_target: usize) -> bool {
    let n_comparator = treatment.len() - n_target;
    let (mut min_t, mut max_t, mut min_c, mut max_c) = (
        f64::INFINITY,
        f64::NEG_INFINITY,
        f64::INFINITY,
        f64::NEG_INFINITY,
    );
    let (mut seen_t, mut seen_c) = (0usize, 0usize);
    for (r, v) in covariates.column(j) {
        if treatment[r] {
            seen_t += 1;
            min_t = min_t.min(v);
            max_t = max_t.max(v);
        } else {
            seen_c += 1;
            min_c = min_c.min(v);
            max_c = max_c.max(v);
        }
    }
    if seen_t < n_target {
        min_t = min_t.min(0.0);
        max_t = max_t.max(0.0);
    }
    if seen_c < n_comparator {
        min_c = min_c.min(0.0);
        max_c = max_c.max(0.0);
    }
    min_t > max_c || max_t < min_c
}

/// Fit the propensity model (see the module documentation for the model, the checks and the
/// differences from `createPs`). `treatment[i]` is subject `i`'s arm (`true` = target);
/// `covariates` has one row per subject in the same order.
pub fn fit_propensity(
    treatment: &[bool],
    covariates: &SparseCovariates,
    settings: &PsSettings,
) -> Result<PropensityScoreFit> {
    settings.check()?;
    let n = treatment.len();
    check_len("covariates", covariates.n_rows(), n)?;
    if n == 0 {
        return Err(Error::Empty(
            "no subjects, so cannot fit a propensity model".into(),
        ));
    }
    let n_target = treatment.iter().filter(|&&t| t).count();
    if n_target == 0 || n_target == n {
        return Err(Error::PropensityModel {
            covariate_ids: Vec::new(),
            message: format!(
                "target or comparator cohort empty ({n_target} target, {} comparator subjects), \
                 so cannot fit model",
                n - n_target
            ),
        });
    }
    let use_column = |id: i64| {
        (settings.include_covariate_ids.is_empty() || settings.include_covariate_ids.contains(&id))
            && !settings.exclude_covariate_ids.contains(&id)
    };
    let columns: Vec<usize> = (0..covariates.n_covariates())
        .filter(|&j| use_column(covariates.ids()[j]) && covariates.column(j).next().is_some())
        .collect();
    if columns.is_empty() {
        return Err(Error::PropensityModel {
            covariate_ids: Vec::new(),
            message: "no covariate data, so cannot fit model".into(),
        });
    }

    if settings.error_on_high_correlation {
        let r = univariable_correlations(treatment, covariates)?;
        let suspect: Vec<(i64, f64)> = columns
            .iter()
            .filter_map(|&j| {
                r[j].filter(|r| r.abs() >= settings.correlation_threshold)
                    .map(|r| (covariates.ids()[j], r))
            })
            .collect();
        if !suspect.is_empty() {
            let list: Vec<String> = suspect
                .iter()
                .map(|(id, r)| format!("{id} (r = {r:.4})"))
                .collect();
            return Err(Error::PropensityModel {
                covariate_ids: suspect.iter().map(|s| s.0).collect(),
                message: format!(
                    "high correlation between covariate(s) and treatment detected: {}. Perhaps \
                     you forgot to exclude part of the exposure definition from the covariates?",
                    list.join(", ")
                ),
            });
        }
    }
    let separating: Vec<i64> = columns
        .iter()
        .filter(|&&j| separates(treatment, covariates, j, n_target))
        .map(|&j| covariates.ids()[j])
        .collect();
    if !separating.is_empty() {
        return Err(Error::PropensityModel {
            message: format!(
                "covariate(s) {separating:?} perfectly predict treatment; exclude them (part of \
                 the exposure definition?)"
            ),
            covariate_ids: separating,
        });
    }

    let mut b = DesignBuilder::new();
    for (i, &t) in treatment.iter().enumerate() {
        b.push_outcome(OutcomeRecord {
            row_id: i as i64,
            y: if t { 1.0 } else { 0.0 },
            ..Default::default()
        });
    }
    for &j in &columns {
        let id = covariates.ids()[j];
        for (r, v) in covariates.column(j) {
            b.push_covariate(r as i64, id, v);
        }
    }
    let design = b.build()?;
    let result = fit(&design, &settings.fit_options())?;
    match result.status {
        FitStatus::Converged => {}
        FitStatus::NoFiniteMle => {
            return Err(Error::PropensityModel {
                covariate_ids: Vec::new(),
                message: format!(
                    "no finite maximum-likelihood estimate (status no_finite_mle): {}",
                    result.notes.join("; ")
                ),
            })
        }
        other => {
            return Err(Error::PropensityModel {
                covariate_ids: Vec::new(),
                message: format!(
                    "the fit did not converge (status {}){}",
                    other.name(),
                    if result.notes.is_empty() {
                        String::new()
                    } else {
                        format!(": {}", result.notes.join("; "))
                    }
                ),
            })
        }
    }

    let mut intercept = 0.0;
    let mut beta_of = std::collections::HashMap::new();
    for c in &result.coefficients {
        if c.covariate_id == INTERCEPT_ID {
            intercept = c.estimate;
        } else if c.estimate != 0.0 {
            beta_of.insert(c.covariate_id, c.estimate);
        }
    }
    let mut eta = vec![intercept; n];
    let mut coefficients = Vec::with_capacity(beta_of.len());
    for &j in &columns {
        let id = covariates.ids()[j];
        if let Some(&beta) = beta_of.get(&id) {
            coefficients.push((id, beta));
            for (r, v) in covariates.column(j) {
                eta[r] += beta * v;
            }
        }
    }
    coefficients.sort_unstable_by_key(|c| c.0);
    let propensity_score: Vec<f64> = eta.iter().map(|&e| round10(logistic(e))).collect();

    let (mut min_t, mut max_t, mut min_c, mut max_c) = (
        f64::INFINITY,
        f64::NEG_INFINITY,
        f64::INFINITY,
        f64::NEG_INFINITY,
    );
    for (&t, &p) in treatment.iter().zip(&propensity_score) {
        if t {
            min_t = min_t.min(p);
            max_t = max_t.max(p);
        } else {
            min_c = min_c.min(p);
            max_c = max_c.max(p);
        }
    }
    let arms_separated = min_t > max_c || max_t < min_c;
    let mut notes = result.notes.clone();
    if arms_separated {
        notes.push(
            "propensity scores completely separate target from comparator: no overlap to adjust \
             on"
            .into(),
        );
    }
    Ok(PropensityScoreFit {
        propensity_score,
        intercept,
        coefficients,
        variance: result.prior.variance(),
        status: result.status,
        iterations: result.iterations,
        log_likelihood: result.log_likelihood,
        arms_separated,
        notes,
    })
}

/// `1/(1 + e^{−η})`, computed without overflow.
pub fn logistic(eta: f64) -> f64 {
    if eta >= 0.0 {
        1.0 / (1.0 + (-eta).exp())
    } else {
        let e = eta.exp();
        e / (1.0 + e)
    }
}

/// `round(p, 10)` as R does it for scores in [0, 1].
fn round10(p: f64) -> f64 {
    (p * 1e10).round() / 1e10
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::rng::Rng;

    /// Simulated cohort: `p` binary covariates with prevalence 0.2, treatment logit
    /// `−0.3 + Σ_j b_j x_j` with `b = 0.8, −0.6, 0.5, 0, 0, …`.
    fn simulate(n: usize, p: usize, seed: u64) -> (Vec<bool>, SparseCovariates) {
        let mut rng = Rng::new(seed);
        let mut entries = Vec::new();
        let mut t = Vec::with_capacity(n);
        let b = [0.8, -0.6, 0.5];
        for i in 0..n {
            let mut eta = -0.3;
            for j in 0..p {
                if rng.bernoulli(0.2) {
                    entries.push((i as u32, 100 + j as i64, 1.0));
                    eta += b.get(j).copied().unwrap_or(0.0);
                }
            }
            t.push(rng.bernoulli(logistic(eta)));
        }
        (t, SparseCovariates::from_triplets(n, &entries).unwrap())
    }

    /// Slow reference: dense Pearson correlation.
    fn dense_r(t: &[bool], x: &[f64]) -> Option<f64> {
        let n = t.len() as f64;
        let y: Vec<f64> = t.iter().map(|&b| if b { 1.0 } else { 0.0 }).collect();
        let (mx, my) = (x.iter().sum::<f64>() / n, y.iter().sum::<f64>() / n);
        let sxy: f64 = x.iter().zip(&y).map(|(a, b)| (a - mx) * (b - my)).sum();
        let sxx: f64 = x.iter().map(|a| (a - mx) * (a - mx)).sum();
        let syy: f64 = y.iter().map(|b| (b - my) * (b - my)).sum();
        (sxx > 1e-12).then(|| sxy / (sxx * syy).sqrt())
    }

    #[test]
    fn correlations_match_dense_reference() {
        let mut rng = Rng::new(7);
        for _ in 0..20 {
            let n = 5 + rng.int_range(0, 40) as usize;
            let mut t: Vec<bool> = (0..n).map(|_| rng.bernoulli(0.4)).collect();
            t[0] = true;
            t[1] = false;
            let mut entries = Vec::new();
            for j in 0..4i64 {
                for i in 0..n {
                    if rng.bernoulli(0.3) {
                        let v = if j == 3 {
                            rng.uniform_range(-2.0, 2.0)
                        } else {
                            1.0
                        };
                        entries.push((i as u32, j, v));
                    }
                }
            }
            let x = SparseCovariates::from_triplets(n, &entries).unwrap();
            let r = univariable_correlations(&t, &x).unwrap();
            for (j, rj) in r.iter().enumerate() {
                let mut dense = vec![0.0; n];
                for (i, v) in x.column(j) {
                    dense[i] = v;
                }
                match (rj, dense_r(&t, &dense)) {
                    (Some(a), Some(b)) => assert!((a - b).abs() < 1e-12, "{a} vs {b}"),
                    (a, b) => assert_eq!(a.is_some(), b.is_some()),
                }
            }
        }
    }

    #[test]
    fn single_arm_and_no_covariates_are_errors() {
        let x = SparseCovariates::from_triplets(3, &[(0, 1, 1.0)]).unwrap();
        let s = PsSettings {
            variance: Some(1.0),
            ..Default::default()
        };
        let e = fit_propensity(&[true, true, true], &x, &s).unwrap_err();
        assert!(e.to_string().contains("cohort empty"), "{e}");
        let s2 = PsSettings {
            exclude_covariate_ids: vec![1],
            ..s.clone()
        };
        let e = fit_propensity(&[true, false, true], &x, &s2).unwrap_err();
        assert!(e.to_string().contains("no covariate"), "{e}");
        assert!(fit_propensity(&[true, false], &x, &s).is_err());
    }

    #[test]
    fn high_correlation_names_the_covariate() {
        // Covariate 42 is present in 9 of 10 target and 1 of 10 comparator subjects: r = 0.8.
        let t: Vec<bool> = (0..20).map(|i| i < 10).collect();
        let mut e = vec![];
        for i in 0..9 {
            e.push((i as u32, 42, 1.0));
        }
        e.push((15, 42, 1.0));
        e.push((3, 7, 1.0));
        e.push((12, 7, 1.0));
        let x = SparseCovariates::from_triplets(20, &e).unwrap();
        let s = PsSettings {
            variance: Some(1.0),
            ..Default::default()
        };
        match fit_propensity(&t, &x, &s).unwrap_err() {
            Error::PropensityModel { covariate_ids, .. } => assert_eq!(covariate_ids, vec![42]),
            other => panic!("{other}"),
        }
        // With the check off the model fits (42 does not separate the arms on its own).
        let off = PsSettings {
            error_on_high_correlation: false,
            ..s
        };
        let f = fit_propensity(&t, &x, &off).unwrap();
        assert_eq!(f.propensity_score.len(), 20);
        assert!(f.coefficients.iter().any(|c| c.0 == 42 && c.1 > 0.0));
    }

    #[test]
    fn perfect_predictor_is_an_error_even_without_the_correlation_check() {
        let t: Vec<bool> = (0..10).map(|i| i % 2 == 0).collect();
        let e: Vec<(u32, i64, f64)> = (0..10).step_by(2).map(|i| (i as u32, 5, 1.0)).collect();
        let x = SparseCovariates::from_triplets(10, &e).unwrap();
        let s = PsSettings {
            variance: Some(1.0),
            error_on_high_correlation: false,
            ..Default::default()
        };
        match fit_propensity(&t, &x, &s).unwrap_err() {
            Error::PropensityModel { covariate_ids, .. } => assert_eq!(covariate_ids, vec![5]),
            other => panic!("{other}"),
        }
    }

    #[test]
    fn fixed_variance_fit_recovers_the_simulated_signs_and_scores_are_in_order() {
        let (t, x) = simulate(2000, 8, 3);
        let s = PsSettings {
            variance: Some(1.0),
            ..Default::default()
        };
        let f = fit_propensity(&t, &x, &s).unwrap();
        assert_eq!(f.status, FitStatus::Converged);
        assert!((f.variance - 1.0).abs() < 1e-12);
        let beta = |id| {
            f.coefficients
                .iter()
                .find(|c| c.0 == id)
                .map_or(0.0, |c| c.1)
        };
        assert!(
            beta(100) > 0.4 && beta(101) < -0.3 && beta(102) > 0.2,
            "{f:?}"
        );
        // Scores recomputed from the returned coefficients, subject by subject.
        for i in 0..t.len() {
            let mut eta = f.intercept;
            for j in 0..x.n_covariates() {
                if x.column(j).any(|(r, _)| r == i) {
                    eta += beta(x.ids()[j]);
                }
            }
            assert!((f.propensity_score[i] - logistic(eta)).abs() < 1e-10);
        }
        assert!(!f.arms_separated);
        // Mean score ≈ share treated (the intercept is unpenalized: the score equation holds).
        let mean = f.propensity_score.iter().sum::<f64>() / t.len() as f64;
        let share = t.iter().filter(|&&b| b).count() as f64 / t.len() as f64;
        assert!((mean - share).abs() < 1e-4, "{mean} vs {share}");
    }

    #[test]
    fn cross_validated_fit_chooses_a_variance() {
        let (t, x) = simulate(400, 5, 11);
        let s = PsSettings {
            cv_repetitions: 1,
            ..Default::default()
        };
        let f = fit_propensity(&t, &x, &s).unwrap();
        assert!(f.variance.is_finite() && f.variance > 0.0);
        assert_eq!(f.status, FitStatus::Converged);
        // Deterministic for the seed.
        let g = fit_propensity(&t, &x, &s).unwrap();
        assert_eq!(f, g);
    }

    /// createPs' defaults (auto CV, 10 folds × 10 repetitions); run with `--release --ignored`.
    #[test]
    #[ignore = "slow (auto CV, 10 folds × 10 repetitions, 5,000 subjects): opt-in, run with --release"]
    fn default_settings_cross_validate_ten_by_ten() {
        let (t, x) = simulate(5000, 50, 13);
        let started = std::time::Instant::now();
        let f = fit_propensity(&t, &x, &PsSettings::default()).unwrap();
        eprintln!(
            "createPs defaults, 5000 × 50: variance {:.4}, {} non-zero, {:.2}s",
            f.variance,
            f.coefficients.len(),
            started.elapsed().as_secs_f64()
        );
        assert_eq!(f.status, FitStatus::Converged);
    }

    #[test]
    fn settings_deserialize_and_check() {
        let s: PsSettings = serde_json::from_str(r#"{"variance": 0.5, "cv_folds": 5}"#).unwrap();
        assert_eq!(s.variance, Some(0.5));
        assert_eq!(s.cv_repetitions, 10);
        assert!(serde_json::from_str::<PsSettings>(r#"{"varaince": 0.5}"#).is_err());
        let bad = PsSettings {
            correlation_threshold: 0.0,
            ..Default::default()
        };
        assert!(bad.check().is_err());
        assert!(PsSettings::default().check().is_ok());
    }
}
