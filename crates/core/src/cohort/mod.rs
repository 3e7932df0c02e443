//! Comparative cohort studies as the OHDSI `CohortMethod` R package runs them (issue #14): the
//! propensity model, preference score and equipoise, trimming, matching, stratification, IPTW
//! weights, covariate balance, power (MDRR), study diagnostics and Kaplan–Meier curves.
//!
//! Everything here is plain maths on slices: the SQL table functions and pipelines wire it to
//! tables. Each function's rustdoc states its definition and the `CohortMethod` function (file
//! `R/PsFunctions.R`, `R/Balance.R`, `R/Power.R`, `src/Match.cpp`, `src/AdjustedKm.cpp` of
//! OHDSI/CohortMethod 5.x) it follows, and where it deliberately differs.
//!
//! # Conventions
//!
//! * **Subjects** are indexed `0..n` in input order; every per-subject slice (`treatment`,
//!   `propensity_score`, `stratum_id`, `time`, …) has length `n`, and every per-subject output
//!   is in input order too.
//! * **Treatment** is a `bool` per subject: `true` = target (CohortMethod's `treatment = 1`),
//!   `false` = comparator (`treatment = 0`).
//! * **Covariates** are sparse, column by column ([`SparseCovariates`]): per covariate the rows
//!   where it is non-zero and (unless it is a 0/1 indicator) their values. An absent entry is 0,
//!   exactly as in `CohortMethodData$covariates`.
//! * Settings structs deserialize (serde, `deny_unknown_fields`, every key optional with the
//!   CohortMethod default) from SQL JSON options and pipeline TOML, and are validated by their
//!   `check()` before any work starts; bad settings and bad input are
//!   [`Error::BadOption`] errors naming the argument (and the element).
//! * Sums are accumulated in `f64`.
//!
//! # Example
//!
//! ```
//! use epifusion_core::cohort::{balance, matching, ps, SparseCovariates};
//!
//! // Eight subjects, covariate 7 more frequent among the target subjects (r = 0.26: below
//! // the 0.5 of the high-correlation check, which would otherwise stop the fit).
//! let treatment = [true, true, true, true, false, false, false, false];
//! let entries = [(0, 7, 1.0), (1, 7, 1.0), (2, 7, 1.0), (4, 7, 1.0), (5, 7, 1.0), (3, 9, 1.0)];
//! let x = SparseCovariates::from_triplets(8, &entries)?;
//! let settings = ps::PsSettings { variance: Some(1.0), ..Default::default() };
//! let model = ps::fit_propensity(&treatment, &x, &settings)?;
//! let matched = matching::match_on_ps(
//!     &treatment,
//!     &model.propensity_score,
//!     None,
//!     &matching::MatchSettings { caliper: 0.0, ..Default::default() },
//! )?;
//! let after = balance::AdjustedPopulation {
//!     kept: &matched.kept,
//!     adjustment: balance::Adjustment::Strata(&matched.stratum_id),
//! };
//! let b = balance::covariate_balance(&treatment, &x, &after)?;
//! assert!(b.max_abs_std_diff_before.is_some());
//! assert_eq!(matched.attrition.target, matched.attrition.comparator);
//! # Ok::<(), epifusion_core::Error>(())
//! ```
//!
//! # Functions
//!
//! | Rust | CohortMethod |
//! |---|---|
//! | [`ps::fit_propensity`] | `createPs` (without `tidyCovariateData` and down-sampling) |
//! | [`ps::univariable_correlations`] | Cyclops' `getUnivariableCorrelation` (the `errorOnHighCorrelation` check) |
//! | [`preference::preference_scores`], [`preference::equipoise`] | `computePreferenceScore`, `computeEquipoise` |
//! | [`trim::trim_by_ps`], [`trim::trim_by_ps_to_equipoise`], [`trim::trim_by_iptw`] | `trimByPs`, `trimByPsToEquipoise`, `trimByIptw` |
//! | [`matching::match_on_ps`] | `matchOnPs` (C++ `Match.cpp`) |
//! | [`stratify::stratify_by_ps`] | `stratifyByPs` |
//! | [`weights::iptw`], [`weights::truncate_iptw`] | `computeIptw` (in `createPs`), `truncateIptw` |
//! | [`balance::covariate_balance`], [`balance::covariate_means`] | `computeCovariateBalance`, `computeMeansPerGroup` |
//! | [`power::mdrr`], [`power::mdrr_summary`] | `computeMdrrFromAggregateStats`, `computeMdrr` |
//! | [`diagnostics::evaluate`] | the diagnostics of `runCmAnalyses` with `createCmDiagnosticThresholds` |
//! | [`km::kaplan_meier_by_arm`], [`km::kaplan_meier`], [`km::km_adjustment_weights`], [`km::follow_up_distribution`] | `plotKaplanMeier` (C++ `AdjustedKm.cpp`), `getFollowUpDistribution` |
//! | [`Attrition`] | the `attrition` table of the population's metadata (`getAttritionTable`) |

pub mod balance;
pub mod diagnostics;
pub mod km;
pub mod matching;
pub mod power;
pub mod preference;
pub mod ps;
pub mod stratify;
pub mod trim;
pub mod weights;

use crate::error::{Error, Result};

/// Sparse baseline covariates in compressed-column form: covariate `j` has id `ids[j]` and is
/// non-zero in rows `rows[col_ptr[j]..col_ptr[j + 1]]` (strictly increasing, each `< n_rows`)
/// with values `values[col_ptr[j]..col_ptr[j + 1]]`, or 1 when `values` is `None` (0/1
/// indicator covariates). Every other entry is 0. Build with [`SparseCovariates::new`] (which
/// validates) or [`SparseCovariates::from_triplets`].
#[derive(Debug, Clone, PartialEq)]
pub struct SparseCovariates {
    n_rows: usize,
    ids: Vec<i64>,
    col_ptr: Vec<usize>,
    rows: Vec<u32>,
    values: Option<Vec<f64>>,
}

impl SparseCovariates {
    /// Validate and wrap compressed-column data (see the type's documentation). Errors name the
    /// argument: a `col_ptr` that is not `ids.len() + 1` non-decreasing offsets ending at
    /// `rows.len()`, a row index out of range or not strictly increasing within its column,
    /// a duplicate covariate id, `values` of the wrong length or not finite.
    pub fn new(
        n_rows: usize,
        ids: Vec<i64>,
        col_ptr: Vec<usize>,
        rows: Vec<u32>,
        values: Option<Vec<f64>>,
    ) -> Result<Self> {
        if col_ptr.len() != ids.len() + 1 || col_ptr.first() != Some(&0) {
            return Err(Error::option(
                "col_ptr",
                format!(
                    "must hold ids.len() + 1 = {} offsets starting at 0 (got {})",
                    ids.len() + 1,
                    col_ptr.len()
                ),
            ));
        }
        if col_ptr.windows(2).any(|w| w[1] < w[0]) || col_ptr.last() != Some(&rows.len()) {
            return Err(Error::option(
                "col_ptr",
                format!(
                    "offsets must be non-decreasing and end at rows.len() = {}",
                    rows.len()
                ),
            ));
        }
        if let Some(v) = &values {
            if v.len() != rows.len() {
                return Err(Error::option(
                    "values",
                    format!("has {} elements but rows has {}", v.len(), rows.len()),
                ));
            }
            if let Some(k) = v.iter().position(|x| !x.is_finite()) {
                return Err(Error::option(
                    "values",
                    format!("element {k} is {}: covariate values must be finite", v[k]),
                ));
            }
        }
        for (j, w) in col_ptr.windows(2).enumerate() {
            let r = &rows[w[0]..w[1]];
            if let Some(&bad) = r.iter().find(|&&i| i as usize >= n_rows) {
                return Err(Error::option(
                    "rows",
                    format!(
                        "covariate {}: row {bad} is out of range (n_rows = {n_rows})",
                        ids[j]
                    ),
                ));
            }
            if r.windows(2).any(|p| p[1] <= p[0]) {
                return Err(Error::option(
                    "rows",
                    format!(
                        "covariate {}: row indices must be strictly increasing (a duplicate \
                         (row, covariate) pair?)",
                        ids[j]
                    ),
                ));
            }
        }
        let mut sorted = ids.clone();
        sorted.sort_unstable();
        if let Some(w) = sorted.windows(2).find(|w| w[0] == w[1]) {
            return Err(Error::option(
                "ids",
                format!("covariate id {} appears more than once", w[0]),
            ));
        }
        Ok(SparseCovariates {
            n_rows,
            ids,
            col_ptr,
            rows,
            values,
        })
    }

    /// Build from `(row, covariate_id, value)` entries in any order (CohortMethod's long
    /// `covariates` table). Zero values are dropped; columns come out in increasing id order.
    /// A duplicate (row, covariate_id) pair, a row out of range or a non-finite value is an
    /// error.
    pub fn from_triplets(n_rows: usize, entries: &[(u32, i64, f64)]) -> Result<Self> {
        if let Some(k) = entries.iter().position(|e| !e.2.is_finite()) {
            return Err(Error::option(
                "entries",
                format!(
                    "element {k} has value {}: covariate values must be finite",
                    entries[k].2
                ),
            ));
        }
        let mut e: Vec<(i64, u32, f64)> = entries
            .iter()
            .filter(|e| e.2 != 0.0)
            .map(|&(r, id, v)| (id, r, v))
            .collect();
        e.sort_unstable_by_key(|a| (a.0, a.1));
        let indicator = e.iter().all(|x| x.2 == 1.0);
        let mut ids = Vec::new();
        let mut col_ptr = vec![0usize];
        let mut rows = Vec::with_capacity(e.len());
        let mut values = Vec::with_capacity(if indicator { 0 } else { e.len() });
        for (k, &(id, r, v)) in e.iter().enumerate() {
            if k > 0 && e[k - 1].0 == id && e[k - 1].1 == r {
                return Err(Error::DuplicateCovariate {
                    row_id: i64::from(r),
                    covariate_id: id,
                });
            }
            if ids.last() != Some(&id) {
                if !ids.is_empty() {
                    col_ptr.push(rows.len());
                }
                ids.push(id);
            }
            rows.push(r);
            if !indicator {
                values.push(v);
            }
        }
        if !ids.is_empty() {
            col_ptr.push(rows.len());
        }
        SparseCovariates::new(n_rows, ids, col_ptr, rows, (!indicator).then_some(values))
    }

    /// Number of subjects (rows).
    pub fn n_rows(&self) -> usize {
        self.n_rows
    }

    /// Number of covariates (columns).
    pub fn n_covariates(&self) -> usize {
        self.ids.len()
    }

    /// Stored (non-zero) entries.
    pub fn nnz(&self) -> usize {
        self.rows.len()
    }

    /// Covariate ids, by column.
    pub fn ids(&self) -> &[i64] {
        &self.ids
    }

    /// Whether every stored value is 1 (no values are stored).
    pub fn is_indicator(&self) -> bool {
        self.values.is_none()
    }

    /// Covariate `j`'s non-zero entries as `(row, value)`.
    pub fn column(&self, j: usize) -> impl Iterator<Item = (usize, f64)> + '_ {
        let (a, b) = (self.col_ptr[j], self.col_ptr[j + 1]);
        self.rows[a..b].iter().enumerate().map(move |(k, &r)| {
            let v = self.values.as_ref().map_or(1.0, |v| v[a + k]);
            (r as usize, v)
        })
    }

    /// The same covariates restricted to the subjects `keep` (indices into `0..n_rows`,
    /// strictly increasing), renumbered `0..keep.len()` in that order.
    pub fn subset_rows(&self, keep: &[usize]) -> Result<Self> {
        if keep.windows(2).any(|w| w[1] <= w[0]) || keep.last().is_some_and(|&k| k >= self.n_rows) {
            return Err(Error::option(
                "keep",
                "must be strictly increasing subject indices below n_rows",
            ));
        }
        let mut map = vec![u32::MAX; self.n_rows];
        for (new, &old) in keep.iter().enumerate() {
            map[old] = new as u32;
        }
        let mut col_ptr = vec![0usize];
        let mut rows = Vec::new();
        let mut values = self.values.as_ref().map(|_| Vec::new());
        for j in 0..self.ids.len() {
            for (r, v) in self.column(j) {
                let m = map[r];
                if m != u32::MAX {
                    rows.push(m);
                    if let Some(vals) = values.as_mut() {
                        vals.push(v);
                    }
                }
            }
            col_ptr.push(rows.len());
        }
        Ok(SparseCovariates {
            n_rows: keep.len(),
            ids: self.ids.clone(),
            col_ptr,
            rows,
            values,
        })
    }
}

/// One row of an attrition table: the subjects left after a step (CohortMethod's `getCounts`:
/// `description`, `targetPersons`, `comparatorPersons`, counting subjects, one row each).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AttritionStep {
    /// What the step did (`"Trimmed by PS"`, `"Matched on propensity score"`, …).
    pub description: String,
    /// Target subjects left.
    pub target: usize,
    /// Comparator subjects left.
    pub comparator: usize,
}

/// An attrition table: counts after each filter step, in order (DESIGN.md §2: carry attrition
/// through every design). Trimming and matching append their step.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Attrition {
    /// The steps, first to last.
    pub steps: Vec<AttritionStep>,
}

impl Attrition {
    /// An empty table.
    pub fn new() -> Self {
        Attrition::default()
    }

    /// Append a step with the target/comparator counts of `treatment`.
    pub fn push(&mut self, description: impl Into<String>, treatment: &[bool]) {
        let (target, comparator) = arm_counts(treatment);
        self.push_counts(description, target, comparator);
    }

    /// Append a step with given counts.
    pub fn push_counts(
        &mut self,
        description: impl Into<String>,
        target: usize,
        comparator: usize,
    ) {
        self.steps.push(AttritionStep {
            description: description.into(),
            target,
            comparator,
        });
    }

    /// The last step, if any.
    pub fn last(&self) -> Option<&AttritionStep> {
        self.steps.last()
    }
}

/// Subjects kept by a trimming or matching step: indices into the input (increasing), with the
/// attrition row of the step.
#[derive(Debug, Clone, PartialEq)]
pub struct Selection {
    /// Kept subjects, as increasing indices into the input.
    pub kept: Vec<usize>,
    /// The step's attrition row (counts after the step).
    pub attrition: AttritionStep,
}

/// (target, comparator) counts.
pub fn arm_counts(treatment: &[bool]) -> (usize, usize) {
    let t = treatment.iter().filter(|&&t| t).count();
    (t, treatment.len() - t)
}

/// R's default `quantile(x, p)` (type 7): with `x` sorted ascending and `h = (n − 1)p`,
/// `x[⌊h⌋] + (h − ⌊h⌋)(x[⌊h⌋ + 1] − x[⌊h⌋])`. `sorted` must be non-empty and sorted.
pub(crate) fn quantile_type7(sorted: &[f64], p: f64) -> f64 {
    let n = sorted.len();
    let h = (n - 1) as f64 * p;
    let lo = h.floor() as usize;
    let hi = (lo + 1).min(n - 1);
    let frac = h - lo as f64;
    if frac == 0.0 {
        sorted[lo]
    } else {
        sorted[lo] + frac * (sorted[hi] - sorted[lo])
    }
}

/// Check that a per-subject slice has `n` elements.
pub(crate) fn check_len(name: &str, len: usize, n: usize) -> Result<()> {
    if len != n {
        return Err(Error::option(
            name,
            format!("has {len} elements but there are {n} subjects"),
        ));
    }
    Ok(())
}

/// Check that every propensity score is a number in [0, 1].
pub(crate) fn check_ps(ps: &[f64]) -> Result<()> {
    if let Some(k) = ps.iter().position(|p| !(*p >= 0.0 && *p <= 1.0)) {
        return Err(Error::option(
            "propensity_score",
            format!(
                "element {k} is {}: a propensity score must be in [0, 1]",
                ps[k]
            ),
        ));
    }
    Ok(())
}

/// Check a pair of bounds `lower ≤ upper` in [0, 1].
pub(crate) fn check_bounds(name: &str, b: [f64; 2]) -> Result<()> {
    if !(b[0] >= 0.0 && b[1] <= 1.0 && b[0] <= b[1]) {
        return Err(Error::option(
            name,
            format!(
                "must be [lower, upper] with 0 ≤ lower ≤ upper ≤ 1 (got [{}, {}])",
                b[0], b[1]
            ),
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn triplets_build_sorted_columns() {
        let x = SparseCovariates::from_triplets(4, &[(3, 20, 1.0), (0, 10, 1.0), (1, 20, 1.0)])
            .unwrap();
        assert_eq!(x.ids(), &[10, 20]);
        assert!(x.is_indicator());
        assert_eq!(x.column(1).collect::<Vec<_>>(), vec![(1, 1.0), (3, 1.0)]);
        let y = SparseCovariates::from_triplets(4, &[(2, 5, 2.5), (0, 5, 0.0)]).unwrap();
        assert!(!y.is_indicator());
        assert_eq!(y.column(0).collect::<Vec<_>>(), vec![(2, 2.5)]);
        assert!(SparseCovariates::from_triplets(4, &[(1, 5, 1.0), (1, 5, 2.0)]).is_err());
        assert!(SparseCovariates::from_triplets(4, &[(4, 5, 1.0)]).is_err());
        assert!(SparseCovariates::from_triplets(4, &[(1, 5, f64::NAN)]).is_err());
    }

    #[test]
    fn new_validates() {
        assert!(SparseCovariates::new(3, vec![1], vec![0, 2], vec![0, 2], None).is_ok());
        assert!(SparseCovariates::new(3, vec![1], vec![0, 2], vec![2, 0], None).is_err());
        assert!(SparseCovariates::new(3, vec![1, 1], vec![0, 1, 2], vec![0, 1], None).is_err());
        assert!(SparseCovariates::new(3, vec![1], vec![0, 3], vec![0, 1], None).is_err());
        assert!(SparseCovariates::new(3, vec![1], vec![0, 1], vec![0], Some(vec![])).is_err());
    }

    #[test]
    fn subset_renumbers() {
        let x =
            SparseCovariates::from_triplets(4, &[(0, 1, 1.0), (2, 1, 1.0), (3, 2, 1.0)]).unwrap();
        let s = x.subset_rows(&[2, 3]).unwrap();
        assert_eq!(s.n_rows(), 2);
        assert_eq!(s.column(0).collect::<Vec<_>>(), vec![(0, 1.0)]);
        assert_eq!(s.column(1).collect::<Vec<_>>(), vec![(1, 1.0)]);
        assert!(x.subset_rows(&[3, 2]).is_err());
    }

    #[test]
    fn quantile_matches_r() {
        // R: quantile(c(1, 2, 3, 4, 10), c(0, 0.1, 0.5, 0.95, 1)) = 1, 1.4, 3, 8.8, 10
        let x = [1.0, 2.0, 3.0, 4.0, 10.0];
        let got: Vec<f64> = [0.0, 0.1, 0.5, 0.95, 1.0]
            .iter()
            .map(|&p| quantile_type7(&x, p))
            .collect();
        let want = [1.0, 1.4, 3.0, 8.8, 10.0];
        for (g, w) in got.iter().zip(want) {
            assert!((g - w).abs() < 1e-12, "{g} vs {w}");
        }
    }

    /// The whole CohortMethod flow on a simulated confounded cohort: fit the propensity model,
    /// trim to equipoise, match 1:1 and with variable ratio, stratify, weight; balance improves
    /// after each adjustment and the attrition table follows the subjects.
    #[test]
    fn end_to_end_adjustment_improves_balance() {
        use crate::model::rng::Rng;
        let mut rng = Rng::new(2024);
        let n = 3000;
        let mut entries = Vec::new();
        let mut treatment = Vec::with_capacity(n);
        for i in 0..n {
            let mut eta = -0.2;
            for (j, b) in [1.2, -0.9, 0.7, 0.0, 0.0, 0.0].iter().enumerate() {
                if rng.bernoulli(0.3) {
                    entries.push((i as u32, 10 + j as i64, 1.0));
                    eta += b;
                }
            }
            treatment.push(rng.bernoulli(ps::logistic(eta)));
        }
        let x = SparseCovariates::from_triplets(n, &entries).unwrap();
        let settings = ps::PsSettings {
            variance: Some(1.0),
            ..Default::default()
        };
        let fit = ps::fit_propensity(&treatment, &x, &settings).unwrap();
        let score = &fit.propensity_score;
        let mut attrition = Attrition::new();
        attrition.push("Original cohorts", &treatment);

        let eq = preference::equipoise(&treatment, score, &Default::default()).unwrap();
        assert!(eq > 0.2 && eq <= 1.0, "{eq}");
        let trimmed =
            trim::trim_by_ps_to_equipoise(&treatment, score, &Default::default()).unwrap();
        attrition.steps.push(trimmed.attrition.clone());

        let matched = matching::match_on_ps(&treatment, score, None, &Default::default()).unwrap();
        attrition.steps.push(matched.attrition.clone());
        assert_eq!(attrition.steps.len(), 3);
        assert_eq!(matched.attrition.target, matched.attrition.comparator);
        let after = balance::AdjustedPopulation {
            kept: &matched.kept,
            adjustment: balance::Adjustment::Strata(&matched.stratum_id),
        };
        let b = balance::covariate_balance(&treatment, &x, &after).unwrap();
        let before = b.max_abs_std_diff_before.unwrap();
        let after_1to1 = b.max_abs_std_diff_after.unwrap();
        assert!(before > 0.3, "{before}");
        assert!(after_1to1 < 0.1, "{after_1to1}");

        let vr = matching::MatchSettings {
            max_ratio: 4,
            ..Default::default()
        };
        let matched = matching::match_on_ps(&treatment, score, None, &vr).unwrap();
        let after = balance::AdjustedPopulation {
            kept: &matched.kept,
            adjustment: balance::Adjustment::Strata(&matched.stratum_id),
        };
        let b = balance::covariate_balance(&treatment, &x, &after).unwrap();
        assert!(b.max_abs_std_diff_after.unwrap() < 0.1, "{b:?}");

        let strata =
            stratify::stratify_by_ps(&treatment, score, None, &Default::default()).unwrap();
        let all: Vec<usize> = (0..n).collect();
        let after = balance::AdjustedPopulation {
            kept: &all,
            adjustment: balance::Adjustment::Strata(&strata.stratum_id),
        };
        let b = balance::covariate_balance(&treatment, &x, &after).unwrap();
        assert!(b.max_abs_std_diff_after.unwrap() < before / 2.0, "{b:?}");

        let w = weights::iptw(
            &treatment,
            score,
            &weights::IptwSettings {
                estimator: weights::Estimator::Ate,
                ..Default::default()
            },
        )
        .unwrap();
        let after = balance::AdjustedPopulation {
            kept: &all,
            adjustment: balance::Adjustment::Iptw(&w),
        };
        let b = balance::covariate_balance(&treatment, &x, &after).unwrap();
        assert!(b.max_abs_std_diff_after.unwrap() < 0.1, "{b:?}");
    }

    #[test]
    fn empty_inputs_do_not_panic() {
        let x = SparseCovariates::from_triplets(0, &[]).unwrap();
        assert!(ps::fit_propensity(&[], &x, &Default::default()).is_err());
        assert!(preference::equipoise(&[], &[], &Default::default()).is_err());
        assert!(trim::trim_by_ps(&[], &[], 0.05).unwrap().kept.is_empty());
        assert!(weights::iptw(&[], &[], &Default::default())
            .unwrap()
            .is_empty());
        let s = stratify::stratify_by_ps(&[], &[], None, &Default::default()).unwrap();
        assert!(s.stratum_id.is_empty());
        let after = balance::AdjustedPopulation {
            kept: &[],
            adjustment: balance::Adjustment::None,
        };
        let b = balance::covariate_balance(&[], &x, &after).unwrap();
        assert!(b.covariates.is_empty() && b.max_abs_std_diff_after.is_none());
        let c = km::kaplan_meier(&[], &[], None).unwrap();
        assert!(c.time.is_empty());
        let d = km::follow_up_distribution(&[], &[], &Default::default()).unwrap();
        assert!(d.target[0].is_nan());
        assert!(power::mdrr_summary(&[], &[], &[], &Default::default()).is_err());
    }

    #[test]
    fn attrition_counts() {
        let mut a = Attrition::new();
        a.push("start", &[true, false, false]);
        assert_eq!(a.last().unwrap().target, 1);
        assert_eq!(a.last().unwrap().comparator, 2);
    }
}
