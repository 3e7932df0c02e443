//! Cross-validation of the prior variance (DESIGN.md §7; Cyclops' `cvType = "auto"` / `"grid"`).
//!
//! **Folds.** The units — strata for the conditional models (SCCS, conditional logistic: whole
//! cases are held out), rows otherwise — are permuted by a seeded generator and dealt round-robin
//! into k folds; each repetition draws a new permutation from the same stream. The folds are
//! fixed before the search starts, so every candidate variance sees the same folds.
//!
//! **Held-out log-likelihood.** For fold f the model is fitted on the other folds; the predictive
//! log-likelihood is the model's log-likelihood of the held-out units alone at that fit's β:
//! for Cox and Fine–Gray the risk sets (and Fine–Gray's censoring weights) are rebuilt from the
//! held-out rows (Cyclops' convention); for SCCS it is the conditional likelihood of the held-out
//! cases. A candidate variance scores the mean over the k × repetitions folds; the curve also
//! reports their standard deviation (n − 1 denominator).
//!
//! **Auto search** (Cyclops' `UniModalSearch(10, 0.01, log 1.5)`): start at v₀ = Σ_j‖x_j‖²/(J·N)
//! (J covariate columns, intercept excluded; N rows) unless a start is given; the second point is
//! v₀/10; then step ×10 (or ÷10) beyond the best point until the best is bracketed; then fit a
//! quadratic in log v to all points, weighted by 1/sd, and move to its maximum. Stop when the
//! predicted gain over the best point is < 1% (relative) or the step in log v is < log 1.5; the
//! selected variance is the quadratic's maximizer (as Cyclops), clamped to the tried range.
//! **Grid search** evaluates the given variances from the smallest (strongest penalty) up and
//! selects the best mean.
//!
//! **Degenerate folds.** A fold whose training rows carry no information (no events, every
//! weight 0 — [`crate::model::degenerate::check_information`]) is skipped for every candidate,
//! counted and named in [`CvResult::skipped`]; a fold whose held-out rows have no event (a Cox
//! or Fine–Gray partial likelihood over no event is the empty product) scores a held-out
//! log-likelihood of 0, as any held-out set without events would, and is counted in
//! [`CvResult::empty_test_folds`]. When every fold is skipped cross-validation fails with a
//! clear error.
//!
//! **Memory: folds as row selections.** For Cox and Fine–Gray one risk-set model is built on
//! every row and a fold is a selection of its rows ([`crate::model::risk_set::FoldBase`]: the
//! rows left out get weight 0; the groups, entry positions, ties, censoring weights and event
//! sums are rebuilt for the selection, as in a copy of the fold's rows). The sorted columns are
//! shared, so k folds cost one structure plus one row state per worker thread, not k copies of
//! the data; each fold's training and held-out likelihoods are the same worker, selected in
//! turn. The other models build a fold's likelihoods (copies of its training rows, then of its
//! held-out rows) when that fold is fitted and drop them after: memory is about one copy of the
//! design per worker thread whatever the number of folds × repetitions (CohortMethod's default
//! 10 × 10 would otherwise hold 100 copies); only each fold's β is kept between candidates. The
//! fits start from that β and rebuild their state from it, so the result is the same as with
//! kept copies.
//!
//! **Warm starts and reproducibility.** Each fold keeps its last β, which starts the next
//! candidate's fit. The auto search's first candidate — the least penalty of the search, so
//! the costliest fits — starts every fold from one fit on every row at that variance (a
//! training set is nine tenths of the rows, so its optimum is near; the optimum does not
//! depend on the start, only the cycles to reach it do: on the DESIGN §10 Cox recipe the
//! 10-fold auto CV takes about a fifth less CPU). That fit is not counted in
//! [`CvResult::fits`]; when it fails the folds start from zero. Folds run in parallel
//! (rayon); each fold's computation is sequential in candidate order, starts from a state rebuilt from scratch, and the likelihoods' own parallel
//! sums use data-determined chunks, so **results are bit-identical whatever the thread count**
//! (Cyclops issue #56).

use std::borrow::Cow;
use std::time::Instant;

use rayon::prelude::*;

use super::ccd::{self, CcdOptions, FitStatus};
use super::censoring::censoring_weights;
use super::degenerate::{check_information, check_information_of};
use super::design::{DesignMatrix, INTERCEPT_ID};
use super::prior::{Prior, PriorSet};
use super::risk_set::{FoldBase, FoldCensor, FoldSums, RiskSetKind, RiskSetModel};
use super::rng::Rng;
use super::{cpu_likelihood_owned_checked, Likelihood, LikelihoodOptions, ModelKind};
use crate::error::{Error, Result};

/// What the folds (and bootstrap draws) are made of.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Resampling {
    /// Strata for conditional models (SCCS, conditional logistic), rows otherwise.
    #[default]
    Auto,
    /// Rows.
    Row,
    /// Whole strata.
    Stratum,
}

impl Resampling {
    /// Parse `auto`, `row` or `stratum`.
    pub fn parse(key: &str, s: &str) -> Result<Self> {
        match s.to_ascii_lowercase().as_str() {
            "auto" => Ok(Resampling::Auto),
            "row" | "rows" => Ok(Resampling::Row),
            "stratum" | "strata" | "case" | "cases" => Ok(Resampling::Stratum),
            other => Err(Error::option(
                key,
                format!("unknown `{other}`; expected auto, row or stratum"),
            )),
        }
    }

    /// `Row` or `Stratum` for `kind`.
    pub fn resolve(self, kind: ModelKind) -> Resampling {
        match self {
            Resampling::Auto => kind.descriptor().resampling_unit,
            other => other,
        }
    }

    /// Lower-case name.
    pub fn name(self) -> &'static str {
        match self {
            Resampling::Auto => "auto",
            Resampling::Row => "row",
            Resampling::Stratum => "stratum",
        }
    }
}

/// How candidate variances are chosen.
#[derive(Debug, Clone, PartialEq)]
pub enum CvSearch {
    /// Bracket by ×10 steps, then a weighted quadratic in log variance.
    Auto,
    /// These variances (any order; evaluated from the smallest up).
    Grid(Vec<f64>),
}

/// Cross-validation options; see the module docs.
///
/// | option | default | meaning |
/// |---|---|---|
/// | `folds` | 10 | k ≥ 2 |
/// | `repetitions` | 1 | full k-fold repetitions, each with a new permutation |
/// | `seed` | 1 | seed of the fold assignment |
/// | `search` | auto | [`CvSearch`]: auto, or grid (default grid: 10 log-spaced values 0.01–20, Cyclops') |
/// | `by` | auto | [`Resampling`] |
/// | `start_variance` | Σ‖x_j‖²/(J·N) | first candidate of the auto search |
/// | `max_steps` | 20 | candidates evaluated at most by the auto search |
#[derive(Debug, Clone, PartialEq)]
pub struct CvOptions {
    /// Number of folds.
    pub folds: usize,
    /// Repetitions of the whole k-fold split.
    pub repetitions: usize,
    /// Seed.
    pub seed: u64,
    /// Search strategy.
    pub search: CvSearch,
    /// Fold units.
    pub by: Resampling,
    /// First variance of the auto search.
    pub start_variance: Option<f64>,
    /// Maximum candidates of the auto search.
    pub max_steps: usize,
}

impl Default for CvOptions {
    fn default() -> Self {
        CvOptions {
            folds: 10,
            repetitions: 1,
            seed: 1,
            search: CvSearch::Auto,
            by: Resampling::Auto,
            start_variance: None,
            max_steps: 20,
        }
    }
}

/// Cyclops' default grid: `steps` log-spaced variances from `lower` to `upper` inclusive.
pub fn log_grid(lower: f64, upper: f64, steps: usize) -> Vec<f64> {
    if steps <= 1 {
        return vec![lower];
    }
    let (a, b) = (lower.ln(), upper.ln());
    (0..steps)
        .map(|i| (a + (b - a) * i as f64 / (steps - 1) as f64).exp())
        .collect()
}

impl CvOptions {
    /// Validate.
    pub fn check(&self) -> Result<()> {
        if self.folds < 2 {
            return Err(Error::option("cv.folds", "must be ≥ 2"));
        }
        if self.repetitions < 1 {
            return Err(Error::option("cv.repetitions", "must be ≥ 1"));
        }
        if self.max_steps < 3 {
            return Err(Error::option("cv.max_steps", "must be ≥ 3"));
        }
        if let Some(v) = self.start_variance {
            if !(v.is_finite() && v > 0.0) {
                return Err(Error::option(
                    "cv.start_variance",
                    format!("must be a finite number > 0 (got {v})"),
                ));
            }
        }
        if let CvSearch::Grid(g) = &self.search {
            if g.is_empty() {
                return Err(Error::option("cv.grid", "needs at least one variance"));
            }
            if let Some(v) = g.iter().find(|v| !(v.is_finite() && **v > 0.0)) {
                return Err(Error::option(
                    "cv.grid",
                    format!("variances must be finite and > 0 (got {v})"),
                ));
            }
        }
        Ok(())
    }
}

/// One evaluated candidate.
#[derive(Debug, Clone, PartialEq)]
pub struct CvPoint {
    /// Prior variance.
    pub variance: f64,
    /// Mean held-out log-likelihood over all folds and repetitions.
    pub mean: f64,
    /// Its standard deviation over the folds (n − 1 denominator).
    pub sd: f64,
    /// Held-out log-likelihood per fold, repetition-major.
    pub folds: Vec<f64>,
    /// Position in the search (0 = first evaluated).
    pub step: usize,
}

/// Result of [`cross_validate`].
#[derive(Debug, Clone, PartialEq)]
pub struct CvResult {
    /// Selected variance.
    pub variance: f64,
    /// Every evaluated candidate, by increasing variance.
    pub curve: Vec<CvPoint>,
    /// Fold units used.
    pub by: Resampling,
    /// Folds.
    pub folds: usize,
    /// Repetitions.
    pub repetitions: usize,
    /// Seed.
    pub seed: u64,
    /// Why the search stopped.
    pub stop_reason: String,
    /// CCD fits run (folds × candidates).
    pub fits: usize,
    /// Folds left out, each as "fold f of repetition r: reason" (module docs).
    pub skipped: Vec<String>,
    /// Folds whose held-out rows have no event (held-out log-likelihood 0).
    pub empty_test_folds: usize,
    /// Wall time, seconds.
    pub seconds: f64,
}

/// The fitting problem shared by cross-validation and the bootstrap: a design (without the
/// intercept column, which is added for the models that have one), the model and the
/// optimizer options. `exclude` lists covariate ids never penalized (the intercept never is).
#[derive(Debug, Clone)]
pub struct Problem<'a> {
    /// The data.
    pub design: &'a DesignMatrix,
    /// Model.
    pub kind: ModelKind,
    /// Likelihood options (ties).
    pub lik: LikelihoodOptions,
    /// Covariate ids excluded from the penalty.
    pub exclude: &'a [i64],
    /// Optimizer options.
    pub ccd: CcdOptions,
    /// Coefficients held at their starting value in every fit (empty: none). The fit API sets
    /// it for the bootstrap to the aliased columns and those with no finite estimate, which
    /// its own fit held fixed ([`crate::model::degenerate`]); cross-validation runs before
    /// that is known, and an aliased column does not change any held-out prediction.
    pub fixed: Vec<bool>,
}

impl Problem<'_> {
    /// [`Problem::fixed`] as the mask [`ccd::fit`] takes.
    pub fn fixed_mask(&self) -> Option<&[bool]> {
        self.fixed.iter().any(|&f| f).then_some(&self.fixed[..])
    }

    /// Covariate ids of the coefficients, in fit order (intercept first when the model has one).
    pub fn coefficient_ids(&self) -> Vec<i64> {
        let mut ids: Vec<i64> = self.design.columns.iter().map(|c| c.id).collect();
        if self.kind.has_intercept() && !self.design.has_intercept() {
            ids.insert(0, INTERCEPT_ID);
        }
        ids
    }

    /// The priors of every coefficient for `prior`.
    pub fn priors(&self, prior: Prior) -> PriorSet {
        let excluded: Vec<bool> = self
            .coefficient_ids()
            .iter()
            .map(|&id| id == INTERCEPT_ID || self.exclude.contains(&id))
            .collect();
        PriorSet::new(prior, &excluded)
    }

    /// The likelihood of the rows `rows` (see [`DesignMatrix::subset_rows`]). Rows that carry
    /// no information (no events, every weight 0: [`check_information`]) give
    /// [`Error::Empty`], which cross-validation and the bootstrap count and skip.
    pub fn likelihood_on(
        &self,
        rows: &[u32],
        strata: Option<&[u32]>,
    ) -> Result<Box<dyn Likelihood>> {
        let mut sub = self.design.subset_rows(rows, strata);
        check_information(self.kind, &sub)?;
        if self.kind.has_intercept() && !sub.has_intercept() {
            sub = sub.with_intercept();
        }
        // `check_information` checked the rows.
        cpu_likelihood_owned_checked(self.kind, sub, self.lik)
    }

    /// The resampling unit of every row: its dense stratum (by stratum) or itself (by row),
    /// and the number of units.
    pub fn units(&self, by: Resampling) -> (Vec<u32>, usize) {
        let x = self.design;
        match by.resolve(self.kind) {
            Resampling::Stratum => (x.rows.stratum.to_vec(), x.n_strata()),
            _ => ((0..x.n_rows() as u32).collect(), x.n_rows()),
        }
    }
}

/// Cyclops' starting variance Σ_j‖x_j‖²/(J·N) over the covariate columns (not the intercept).
pub fn default_variance(x: &DesignMatrix) -> f64 {
    let cols: Vec<_> = x.columns.iter().filter(|c| c.id != INTERCEPT_ID).collect();
    let ss: f64 = cols.iter().map(|c| c.sum_squares()).sum();
    let v = ss / (cols.len().max(1) as f64 * x.n_rows().max(1) as f64);
    if v.is_finite() && v > 0.0 {
        v
    } else {
        1.0
    }
}

/// A seed for stream `k` derived from `seed` (splitmix64 finalizer of both).
pub fn stream_seed(seed: u64, k: u64) -> u64 {
    let mix = |mut z: u64| {
        z = z.wrapping_add(0x9E37_79B9_7F4A_7C15);
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    };
    mix(seed ^ mix(k.wrapping_add(0x5851_F42D_4C95_7F2D)))
}

/// Fold of each of `n_units` units for every repetition (repetition-major): a seeded
/// Fisher–Yates permutation dealt round-robin, so fold sizes differ by at most one.
pub fn assign_folds(n_units: usize, folds: usize, repetitions: usize, seed: u64) -> Vec<Vec<u32>> {
    let mut rng = Rng::new(seed);
    (0..repetitions)
        .map(|_| {
            let mut perm: Vec<u32> = (0..n_units as u32).collect();
            for i in (1..n_units).rev() {
                let j = rng.int_range(0, i as u64) as usize;
                perm.swap(i, j);
            }
            let mut fold = vec![0u32; n_units];
            for (pos, &u) in perm.iter().enumerate() {
                fold[u as usize] = (pos % folds) as u32;
            }
            fold
        })
        .collect()
}

/// One fold of the copies path: its likelihoods are built from copies of its rows when it is
/// fitted ([`copy_side`]) and dropped after.
struct FoldState {
    rep: usize,
    fold: u32,
    /// `false`: the held-out rows have no event (held-out log-likelihood 0).
    has_test: bool,
    beta: Vec<f64>,
    label: String,
}

/// A likelihood on a copy of fold `fold`'s training rows (`test` false) or held-out rows of
/// repetition `rep`; `Err(Error::Empty)` when those rows carry no information.
fn copy_side(
    problem: &Problem<'_>,
    assignment: &[Vec<u32>],
    unit_of_row: &[u32],
    rep: usize,
    fold: u32,
    test: bool,
) -> Result<Box<dyn Likelihood>> {
    let of = &assignment[rep];
    let rows: Vec<u32> = unit_of_row
        .iter()
        .enumerate()
        .filter(|&(_, &u)| (of[u as usize] == fold) == test)
        .map(|(i, _)| i as u32)
        .collect();
    problem.likelihood_on(&rows, None)
}

/// One fold of the shared path (a row selection of the shared model).
struct SharedFold {
    rep: usize,
    fold: u32,
    /// The held-out rows have an event (else the held-out log-likelihood is 0).
    test_events: bool,
    beta: Vec<f64>,
    label: String,
}

/// How the folds' likelihoods are held (module docs).
enum Folds {
    /// One likelihood per fold side (copies of the rows).
    Copies(Vec<FoldState>),
    /// Row selections of one risk-set model, one worker per thread.
    Shared {
        shared: SharedFolds,
        workers: Vec<FoldModel>,
        folds: Vec<SharedFold>,
    },
}

/// The fold of every row (by its unit) for repetition `r`.
fn fold_of_rows(assignment: &[Vec<u32>], unit_of_row: &[u32], r: usize) -> Vec<u32> {
    unit_of_row
        .iter()
        .map(|&u| assignment[r][u as usize])
        .collect()
}

/// A fold's new β and held-out log-likelihood at one candidate.
type FoldOutcome = Result<(Vec<f64>, f64)>;

/// A fold worker: the shared risk-set model as a [`Likelihood`].
#[derive(Debug, Clone)]
struct FoldModel(RiskSetModel);

delegate_likelihood!(FoldModel, 0);

/// Cox and Fine–Gray folds as row selections of one model on every row.
struct SharedFolds {
    kind: ModelKind,
    base: FoldBase,
    /// Fold of every input row, per repetition.
    fold_of_input: Vec<Vec<u32>>,
    /// Fold of every sorted row, per repetition.
    fold_of_sorted: Vec<Vec<u32>>,
    /// The events' column sums per repetition and fold.
    sums: Vec<Vec<FoldSums>>,
    /// The events' column sums of every row (the model as built), for [`SharedFolds::restore`].
    all_sums: Vec<f64>,
}

impl SharedFolds {
    /// The model on every row and the fold plan; `None` when the model is not a risk-set
    /// model or cannot be built on all rows (the copies path then reports per fold).
    ///
    /// `given`: the model on every row, built by the caller from the design's rows and
    /// columns ([`cross_validate_on`]); it becomes a worker instead of a model built here.
    fn new(
        problem: &Problem<'_>,
        assignment: &[Vec<u32>],
        unit_of_row: &[u32],
        folds: usize,
        given: Option<RiskSetModel>,
    ) -> Option<(Self, FoldModel)> {
        let x = problem.design;
        let rk = match problem.kind {
            ModelKind::Cox => RiskSetKind::Cox,
            ModelKind::FineGray => RiskSetKind::FineGray,
            _ => return None,
        };
        if problem.kind.has_intercept() || problem.kind.check_rows(x).is_err() {
            return None;
        }
        let model = match given {
            Some(m) if m.kind() == rk => m,
            Some(_) => return None,
            None => {
                let censor = all_rows_censoring(x, rk == RiskSetKind::FineGray);
                RiskSetModel::new(x, problem.lik.ties, rk, censor.as_deref()).ok()?
            }
        };
        let base = model.fold_base();
        let all_sums = model.event_sums().to_vec();
        let fold_of_input: Vec<Vec<u32>> = (0..assignment.len())
            .map(|r| fold_of_rows(assignment, unit_of_row, r))
            .collect();
        let fold_of_sorted: Vec<Vec<u32>> = fold_of_input
            .iter()
            .map(|f| model.input_rows().iter().map(|&o| f[o as usize]).collect())
            .collect();
        let sums = fold_of_sorted
            .iter()
            .map(|f| model.fold_event_sums(&base, f, folds))
            .collect();
        Some((
            SharedFolds {
                kind: problem.kind,
                base,
                fold_of_input,
                fold_of_sorted,
                sums,
                all_sums,
            },
            FoldModel(model),
        ))
    }

    /// Select fold `s`'s training rows (`test` false) or held-out rows in `lik`.
    fn select(
        &self,
        x: &DesignMatrix,
        lik: &mut FoldModel,
        s: &SharedFold,
        test: bool,
    ) -> Result<()> {
        let keep: Vec<bool> = self.fold_of_sorted[s.rep]
            .iter()
            .map(|&f| (f == s.fold) == test)
            .collect();
        let g_minus = censoring_of(x, self.kind == ModelKind::FineGray, || {
            fold_censoring(x, &self.fold_of_input[s.rep], s.fold, test)
        });
        let censor = g_minus.as_deref().map(|g_minus| FoldCensor {
            g_minus,
            row_id: &x.rows.row_id,
        });
        let sums = &self.sums[s.rep][s.fold as usize];
        let event_sum = if test { &sums.test } else { &sums.train };
        lik.0.refold(&self.base, &keep, censor, event_sum)
    }

    /// Select every row again in `lik`: the model as built on every row (the same groups,
    /// positions, ties, censoring weights — G(T−) of all rows, as the build computed them —
    /// and event sums; `fit::tests::owned_cross_validation_is_fit` checks the bits against a
    /// fresh build through the fit API).
    fn restore(&self, x: &DesignMatrix, lik: &mut FoldModel) -> Result<()> {
        let keep = vec![true; self.base_rows()];
        let g_minus = all_rows_censoring(x, self.kind == ModelKind::FineGray);
        let censor = g_minus.as_deref().map(|g_minus| FoldCensor {
            g_minus,
            row_id: &x.rows.row_id,
        });
        lik.0.refold(&self.base, &keep, censor, &self.all_sums)
    }

    /// Sorted rows of the model.
    fn base_rows(&self) -> usize {
        self.fold_of_sorted.first().map_or(0, Vec::len)
    }
}

/// Fine–Gray's G(T−) by input row: the design's censoring weights, or `compute`d from the
/// rows when it has none; `None` for Cox.
fn censoring_of(
    x: &DesignMatrix,
    fine_gray: bool,
    compute: impl FnOnce() -> Vec<f64>,
) -> Option<Cow<'_, [f64]>> {
    if !fine_gray {
        return None;
    }
    Some(match &x.rows.censor_weight {
        Some(c) => Cow::Borrowed(&c[..]),
        None => Cow::Owned(compute()),
    })
}

/// [`censoring_of`] every row, as the model on every row is built with it.
fn all_rows_censoring(x: &DesignMatrix, fine_gray: bool) -> Option<Cow<'_, [f64]>> {
    censoring_of(x, fine_gray, || {
        censoring_weights(
            &x.rows.time.as_f64(),
            &x.rows.y.as_f64(),
            &x.rows.stratum.as_u32(),
        )
    })
}

/// G(T−) of the rows of fold `fold` (`test`) or of the other folds, computed from those rows
/// alone (as a copy of them would), by input row (1 elsewhere).
fn fold_censoring(x: &DesignMatrix, fold_of: &[u32], fold: u32, test: bool) -> Vec<f64> {
    let rows: Vec<usize> = (0..x.n_rows())
        .filter(|&i| (fold_of[i] == fold) == test)
        .collect();
    let pick = |v: &[f64]| -> Vec<f64> { rows.iter().map(|&i| v[i]).collect() };
    let stratum: Vec<u32> = rows.iter().map(|&i| x.rows.stratum.get(i)).collect();
    let g = censoring_weights(
        &pick(&x.rows.time.as_f64()),
        &pick(&x.rows.y.as_f64()),
        &stratum,
    );
    let mut out = vec![1.0; x.n_rows()];
    for (&i, &v) in rows.iter().zip(&g) {
        out[i] = v;
    }
    out
}

/// Fit fold `label`'s training likelihood at variance `v` from `beta0`.
fn fit_fold(
    problem: &Problem<'_>,
    priors: &PriorSet,
    v: f64,
    label: &str,
    train: &mut dyn Likelihood,
    beta0: &[f64],
) -> Result<Vec<f64>> {
    let r = ccd::fit(train, priors, beta0, problem.fixed_mask(), &problem.ccd)?;
    if r.status == FitStatus::IllConditioned {
        return Err(Error::FitFailed(format!(
            "cross-validation, {label}: the fit at variance {v} is ill-conditioned"
        )));
    }
    Ok(r.beta)
}

/// The fit on every row at variance `v` from zero (the warm start of the auto search's first
/// candidate), on a fold worker with every row selected (shared folds) or on the design's
/// columns (copies); `None` when it fails or is not finite (the folds then start from zero, as
/// without it).
fn all_rows_fit(
    problem: &Problem<'_>,
    prior: Prior,
    v: f64,
    folds: &mut Folds,
) -> Option<Vec<f64>> {
    let priors = problem.priors(prior.with_variance(v));
    let p = problem.coefficient_ids().len();
    let zero = vec![0.0; p];
    let beta = match folds {
        Folds::Shared {
            shared, workers, ..
        } => {
            let w = workers.last_mut()?;
            shared.restore(problem.design, w).ok()?;
            fit_fold(problem, &priors, v, "all rows", w, &zero).ok()?
        }
        Folds::Copies(_) => {
            let x = problem.design;
            let (cols, _) = super::columns_for(problem.kind, x);
            let mut lik = super::cpu_likelihood_from(problem.kind, x, cols, problem.lik).ok()?;
            fit_fold(problem, &priors, v, "all rows", lik.as_mut(), &zero).ok()?
        }
    };
    (beta.len() == p && beta.iter().all(|b| b.is_finite())).then_some(beta)
}

/// The held-out log-likelihood of fold `label` at `beta`.
fn held_out(label: &str, v: f64, test: &mut dyn Likelihood, beta: &[f64]) -> Result<f64> {
    test.set_beta(beta);
    let ll = test.log_likelihood();
    if !ll.is_finite() {
        return Err(Error::FitFailed(format!(
            "cross-validation, {label}: held-out log-likelihood at variance {v} is {ll}"
        )));
    }
    Ok(ll)
}

/// Choose the prior variance of `prior`'s family by cross-validation.
pub fn cross_validate(problem: &Problem<'_>, prior: Prior, opts: &CvOptions) -> Result<CvResult> {
    cross_validate_with(problem, prior, opts, Share::Build).map(|(r, _)| r)
}

/// [`cross_validate`] of a Cox or Fine–Gray problem whose folds are row selections of
/// `model`, the risk-set model on every row of `problem.design` as built (by the caller, with
/// the problem's ties and, for Fine–Gray, the design's censoring weights): `model` is one of
/// the fold workers (the others are clones sharing its columns) and comes back with every row
/// selected again, the model as built, for the final fit. Only the design's rows and column
/// ids are read, so its columns may have been dropped ([`DesignMatrix::without_entries`]) once
/// the model was built; give [`CvOptions::start_variance`] then (the default start,
/// [`default_variance`], reads the columns). Errors (internal) when `model` is not of the
/// problem's kind.
pub fn cross_validate_on(
    problem: &Problem<'_>,
    prior: Prior,
    opts: &CvOptions,
    model: RiskSetModel,
) -> Result<(CvResult, RiskSetModel)> {
    let (r, m) = cross_validate_with(problem, prior, opts, Share::Given(Box::new(model)))?;
    let m =
        m.ok_or_else(|| Error::FitFailed("internal: cross-validation lost its model".into()))?;
    Ok((r, m))
}

/// How [`cross_validate_with`] holds the folds.
enum Share {
    /// Row selections of a risk-set model built here (Cox, Fine–Gray), copies otherwise.
    Build,
    /// Row selections of this model (an error when the problem cannot use it), returned with
    /// every row selected.
    Given(Box<RiskSetModel>),
    /// One likelihood per fold for every model (the reference the shared path is tested
    /// against).
    #[cfg(test)]
    Copies,
}

/// [`cross_validate`] with the folds held as `share` says.
fn cross_validate_with(
    problem: &Problem<'_>,
    prior: Prior,
    opts: &CvOptions,
    share: Share,
) -> Result<(CvResult, Option<RiskSetModel>)> {
    opts.check()?;
    problem.ccd.check()?;
    if prior == Prior::None {
        return Err(Error::option(
            "cv",
            "cross-validation selects the prior variance: give `prior` laplace or normal",
        ));
    }
    let started = Instant::now();
    let by = opts.by.resolve(problem.kind);
    let (unit_of_row, n_units) = problem.units(by);
    if n_units < opts.folds {
        return Err(Error::option(
            "cv.folds",
            format!(
                "{} folds but only {n_units} {}",
                opts.folds,
                if by == Resampling::Stratum {
                    "strata"
                } else {
                    "rows"
                }
            ),
        ));
    }
    let assignment = assign_folds(n_units, opts.folds, opts.repetitions, opts.seed);
    let p = problem.coefficient_ids().len();
    let tasks: Vec<(usize, usize)> = (0..opts.repetitions)
        .flat_map(|r| (0..opts.folds).map(move |f| (r, f)))
        .collect();
    let label_of = |r: usize, f: usize| format!("fold {} of repetition {}", f + 1, r + 1);
    let mut skipped = Vec::new();
    let given = matches!(share, Share::Given(_));
    let shared = match share {
        Share::Build => SharedFolds::new(problem, &assignment, &unit_of_row, opts.folds, None),
        Share::Given(m) => Some(
            SharedFolds::new(problem, &assignment, &unit_of_row, opts.folds, Some(*m)).ok_or_else(
                || {
                    Error::FitFailed(format!(
                        "internal: cross-validation of a {} fit on a risk-set model it cannot use",
                        problem.kind.name()
                    ))
                },
            )?,
        ),
        #[cfg(test)]
        Share::Copies => None,
    };
    let mut folds = if let Some((shared, model)) = shared {
        let x = problem.design;
        let mut kept = Vec::new();
        for &(r, f) in &tasks {
            let label = label_of(r, f);
            let fold_of = &shared.fold_of_input[r];
            let fold = f as u32;
            if let Err(e) = check_information_of(problem.kind, x, &|i| fold_of[i] != fold) {
                match e {
                    Error::Empty(why) => {
                        skipped.push(format!("{label}: training set without information ({why})"));
                        continue;
                    }
                    e => return Err(Error::FitFailed(format!("cross-validation, {label}: {e}"))),
                }
            }
            let test_events =
                check_information_of(problem.kind, x, &|i| fold_of[i] == fold).is_ok();
            kept.push(SharedFold {
                rep: r,
                fold,
                test_events,
                beta: vec![0.0; p],
                label,
            });
        }
        let n_workers = rayon::current_num_threads().clamp(1, kept.len().max(1));
        let mut workers = Vec::with_capacity(n_workers);
        for _ in 1..n_workers {
            workers.push(model.clone());
        }
        workers.push(model);
        Folds::Shared {
            shared,
            workers,
            folds: kept,
        }
    } else {
        // Build every fold once to find the skipped ones and the empty held-out sets; the
        // copies are dropped at once (module docs, memory).
        let built: Vec<std::result::Result<FoldState, String>> = tasks
            .par_iter()
            .map(|&(r, f)| {
                let label = label_of(r, f);
                let wrap = |e: Error| Error::FitFailed(format!("cross-validation, {label}: {e}"));
                let fold = f as u32;
                match copy_side(problem, &assignment, &unit_of_row, r, fold, false) {
                    Ok(_) => {}
                    Err(Error::Empty(why)) => {
                        return Ok(Err(format!(
                            "{label}: training set without information ({why})"
                        )))
                    }
                    Err(e) => return Err(wrap(e)),
                }
                let has_test = match copy_side(problem, &assignment, &unit_of_row, r, fold, true) {
                    Ok(_) => true,
                    Err(Error::Empty(_)) => false,
                    Err(e) => return Err(wrap(e)),
                };
                Ok(Ok(FoldState {
                    rep: r,
                    fold,
                    has_test,
                    beta: vec![0.0; p],
                    label,
                }))
            })
            .collect::<Result<_>>()?;
        let mut states: Vec<FoldState> = Vec::with_capacity(built.len());
        for b in built {
            match b {
                Ok(s) => states.push(s),
                Err(why) => skipped.push(why),
            }
        }
        Folds::Copies(states)
    };
    let (n_kept, empty_test_folds) = match &folds {
        Folds::Copies(states) => (states.len(), states.iter().filter(|s| !s.has_test).count()),
        Folds::Shared { folds, .. } => {
            (folds.len(), folds.iter().filter(|s| !s.test_events).count())
        }
    };
    if n_kept == 0 {
        return Err(Error::FitFailed(format!(
            "cross-validation: all {} folds were skipped ({})",
            tasks.len(),
            skipped.join("; ")
        )));
    }
    // The auto search's first candidate is the costliest (the least penalty, every fold from
    // zero): its folds start from the fit on every row at that variance instead (module docs).
    if let CvSearch::Auto = &opts.search {
        let v = opts
            .start_variance
            .unwrap_or_else(|| default_variance(problem.design));
        if let Some(beta) = all_rows_fit(problem, prior, v, &mut folds) {
            match &mut folds {
                Folds::Copies(states) => states.iter_mut().for_each(|s| s.beta.clone_from(&beta)),
                Folds::Shared { folds, .. } => {
                    folds.iter_mut().for_each(|s| s.beta.clone_from(&beta))
                }
            }
        }
    }
    let mut fits = 0usize;
    let mut evaluate = |v: f64, step: usize, folds: &mut Folds| -> Result<CvPoint> {
        let priors = problem.priors(prior.with_variance(v));
        let lls: Vec<f64> = match folds {
            Folds::Copies(states) => states
                .par_iter_mut()
                .map(|s| {
                    let side = |test: bool| {
                        copy_side(problem, &assignment, &unit_of_row, s.rep, s.fold, test).map_err(
                            |e| Error::FitFailed(format!("cross-validation, {}: {e}", s.label)),
                        )
                    };
                    let mut train = side(false)?;
                    s.beta = fit_fold(problem, &priors, v, &s.label, train.as_mut(), &s.beta)?;
                    drop(train);
                    if !s.has_test {
                        return Ok(0.0);
                    }
                    held_out(&s.label, v, side(true)?.as_mut(), &s.beta)
                })
                .collect::<Result<_>>()?,
            Folds::Shared {
                shared,
                workers,
                folds,
            } => {
                // Worker w takes folds w, w + W, …; every fold starts from a state rebuilt
                // from scratch, so which worker runs it does not matter.
                let n_workers = workers.len();
                let x = problem.design;
                let folds_ro: &[SharedFold] = folds;
                let shared_ro: &SharedFolds = shared;
                let priors = &priors;
                let outs: Vec<Vec<(usize, FoldOutcome)>> = workers
                    .par_iter_mut()
                    .enumerate()
                    .map(|(w, lik)| {
                        (w..folds_ro.len())
                            .step_by(n_workers)
                            .map(|i| {
                                let s = &folds_ro[i];
                                let mut run = || -> Result<(Vec<f64>, f64)> {
                                    shared_ro.select(x, lik, s, false)?;
                                    let beta =
                                        fit_fold(problem, priors, v, &s.label, lik, &s.beta)?;
                                    if !s.test_events {
                                        return Ok((beta, 0.0));
                                    }
                                    shared_ro.select(x, lik, s, true)?;
                                    let ll = held_out(&s.label, v, lik, &beta)?;
                                    Ok((beta, ll))
                                };
                                let wrap = |e: Error| match e {
                                    Error::FitFailed(m) => Error::FitFailed(m),
                                    e => Error::FitFailed(format!(
                                        "cross-validation, {}: {e}",
                                        s.label
                                    )),
                                };
                                (i, run().map_err(wrap))
                            })
                            .collect()
                    })
                    .collect();
                let mut outs: Vec<(usize, FoldOutcome)> = outs.into_iter().flatten().collect();
                outs.sort_by_key(|o| o.0);
                let mut lls = Vec::with_capacity(outs.len());
                for (i, out) in outs {
                    let (beta, ll) = out?;
                    folds[i].beta = beta;
                    lls.push(ll);
                }
                lls
            }
        };
        fits += lls.len();
        let n = lls.len() as f64;
        let mean = lls.iter().sum::<f64>() / n;
        let sd = if lls.len() > 1 {
            (lls.iter().map(|x| (x - mean) * (x - mean)).sum::<f64>() / (n - 1.0)).sqrt()
        } else {
            0.0
        };
        Ok(CvPoint {
            variance: v,
            mean,
            sd,
            folds: lls,
            step,
        })
    };
    let mut curve: Vec<CvPoint> = Vec::new();
    let (variance, stop_reason) = match &opts.search {
        CvSearch::Grid(grid) => {
            let mut g = grid.clone();
            g.sort_by(f64::total_cmp);
            g.dedup();
            for (step, &v) in g.iter().enumerate() {
                curve.push(evaluate(v, step, &mut folds)?);
            }
            let best = best_point(&curve);
            (curve[best].variance, "grid evaluated".to_string())
        }
        CvSearch::Auto => {
            let mut v = opts
                .start_variance
                .unwrap_or_else(|| default_variance(problem.design));
            let mut outcome = None;
            for step in 0..opts.max_steps {
                curve.push(evaluate(v, step, &mut folds)?);
                curve.sort_by(|a, b| a.variance.total_cmp(&b.variance));
                match next_candidate(&curve) {
                    Next::Try(next) => v = next,
                    Next::Stop(selected, why) => {
                        outcome = Some((selected, why));
                        break;
                    }
                }
            }
            outcome.unwrap_or_else(|| {
                let best = best_point(&curve);
                (
                    curve[best].variance,
                    format!(
                        "max_steps ({}) reached; best evaluated variance selected",
                        opts.max_steps
                    ),
                )
            })
        }
    };
    curve.sort_by(|a, b| a.variance.total_cmp(&b.variance));
    let model = match folds {
        Folds::Shared {
            shared,
            mut workers,
            ..
        } if given => {
            let mut w = workers.pop().ok_or_else(|| {
                Error::FitFailed("internal: cross-validation without a fold worker".into())
            })?;
            drop(workers);
            shared.restore(problem.design, &mut w)?;
            Some(w.0)
        }
        _ => None,
    };
    let result = CvResult {
        variance,
        curve,
        by,
        folds: opts.folds,
        repetitions: opts.repetitions,
        seed: opts.seed,
        stop_reason,
        fits,
        skipped,
        empty_test_folds,
        seconds: started.elapsed().as_secs_f64(),
    };
    Ok((result, model))
}

/// Index of the largest mean (the first of equal ones).
fn best_point(curve: &[CvPoint]) -> usize {
    let mut best = 0;
    for (i, c) in curve.iter().enumerate() {
        if c.mean > curve[best].mean {
            best = i;
        }
    }
    best
}

enum Next {
    Try(f64),
    Stop(f64, String),
}

const STEP: f64 = 10.0;
const STOP_BY_Y: f64 = 0.01;

/// Cyclops' `UniModalSearch::step` on the points so far (sorted by variance).
fn next_candidate(curve: &[CvPoint]) -> Next {
    let first = &curve[0];
    let last = &curve[curve.len() - 1];
    match curve.len() {
        1 => Next::Try(first.variance / STEP),
        2 => {
            if first.mean > last.mean {
                Next::Try(first.variance / STEP)
            } else {
                Next::Try(last.variance * STEP)
            }
        }
        _ => {
            let b = best_point(curve);
            let best = &curve[b];
            if b == 0 {
                let next = best.variance / STEP;
                if next.is_nan() || next <= f64::MIN_POSITIVE {
                    return Next::Stop(best.variance, "variance underflow at the left end".into());
                }
                return Next::Try(next);
            }
            if b == curve.len() - 1 {
                let next = best.variance * STEP;
                if !next.is_finite() || next > 1e300 {
                    return Next::Stop(best.variance, "variance overflow at the right end".into());
                }
                return Next::Try(next);
            }
            let Some((c0, c1, c2)) = quadratic_log_fit(curve) else {
                return Next::Stop(
                    best.variance,
                    "quadratic fit singular; best point selected".into(),
                );
            };
            if c2.is_nan() || c2 >= 0.0 {
                return Next::Stop(
                    best.variance,
                    "quadratic fit not concave; best point selected".into(),
                );
            }
            let log_argmax = -c1 / (2.0 * c2);
            let expected = c0 - c1 * c1 / (4.0 * c2);
            let lo = curve[0].variance.ln();
            let hi = curve[curve.len() - 1].variance.ln();
            let x = log_argmax.clamp(lo, hi);
            let maxval = best.mean;
            if maxval == 0.0 {
                return Next::Stop(x.exp(), "held-out log-likelihood is 0".into());
            }
            if (expected - maxval) / maxval.abs() < STOP_BY_Y {
                return Next::Stop(x.exp(), "predicted gain < 1%".into());
            }
            if (x - best.variance.ln()).abs() < 1.5f64.ln() {
                return Next::Stop(x.exp(), "step in log variance < log 1.5".into());
            }
            Next::Try(x.exp())
        }
    }
}

/// Weighted least squares of mean ~ c0 + c1·log v + c2·(log v)², weights 1/sd (a zero sd gets
/// 100 / the smallest positive sd, or 1 if none is positive), as Cyclops' `QuadrLogFit`.
fn quadratic_log_fit(curve: &[CvPoint]) -> Option<(f64, f64, f64)> {
    let min_sd = curve
        .iter()
        .map(|c| c.sd)
        .filter(|&s| s > 0.0)
        .fold(f64::INFINITY, f64::min);
    let zero_w = if min_sd.is_finite() {
        100.0 / min_sd
    } else {
        1.0
    };
    let mut a = [[0.0f64; 3]; 3];
    let mut rhs = [0.0f64; 3];
    for c in curve {
        let w = if c.sd > 0.0 { 1.0 / c.sd } else { zero_w };
        let x = c.variance.ln();
        let row = [1.0, x, x * x];
        for i in 0..3 {
            for j in 0..3 {
                a[i][j] += w * row[i] * row[j];
            }
            rhs[i] += w * row[i] * c.mean;
        }
    }
    solve3(a, rhs).map(|s| (s[0], s[1], s[2]))
}

/// Gaussian elimination with partial pivoting on a 3×3 system.
fn solve3(mut a: [[f64; 3]; 3], mut b: [f64; 3]) -> Option<[f64; 3]> {
    for col in 0..3 {
        let piv = (col..3).max_by(|&i, &j| a[i][col].abs().total_cmp(&a[j][col].abs()))?;
        if a[piv][col].abs() < 1e-300 {
            return None;
        }
        a.swap(col, piv);
        b.swap(col, piv);
        for r in col + 1..3 {
            let f = a[r][col] / a[col][col];
            let pivot_row = a[col];
            for (x, p) in a[r].iter_mut().zip(pivot_row).skip(col) {
                *x -= f * p;
            }
            b[r] -= f * b[col];
        }
    }
    let mut x = [0.0; 3];
    for r in (0..3).rev() {
        let s: f64 = (r + 1..3).map(|c| a[r][c] * x[c]).sum();
        x[r] = (b[r] - s) / a[r][r];
    }
    x.iter().all(|v| v.is_finite()).then_some(x)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::Ties;

    fn pt(v: f64, m: f64, s: f64) -> CvPoint {
        CvPoint {
            variance: v,
            mean: m,
            sd: s,
            folds: vec![],
            step: 0,
        }
    }

    #[test]
    fn folds_are_balanced_and_seeded() {
        let a = assign_folds(103, 10, 2, 7);
        let b = assign_folds(103, 10, 2, 7);
        assert_eq!(a, b);
        assert_ne!(a[0], a[1]);
        for rep in &a {
            let mut counts = [0usize; 10];
            for &f in rep {
                counts[f as usize] += 1;
            }
            assert!(counts.iter().all(|&c| c == 10 || c == 11), "{counts:?}");
        }
        assert_ne!(assign_folds(103, 10, 1, 8)[0], a[0]);
    }

    #[test]
    fn quadratic_fit_recovers_a_parabola() {
        // mean = -3 - 2 (log v - log 0.05)^2, equal sds.
        let c = [0.001, 0.01, 0.1, 1.0]
            .iter()
            .map(|&v: &f64| pt(v, -3.0 - 2.0 * (v.ln() - 0.05f64.ln()).powi(2), 1.0))
            .collect::<Vec<_>>();
        let (c0, c1, c2) = quadratic_log_fit(&c).unwrap();
        let argmax = (-c1 / (2.0 * c2)).exp();
        assert!((argmax - 0.05).abs() < 1e-9, "{argmax}");
        assert!((c0 - c1 * c1 / (4.0 * c2) + 3.0).abs() < 1e-9);
    }

    #[test]
    fn search_brackets_then_stops() {
        // Best at the left end: step left.
        let c = vec![pt(0.01, -5.0, 1.0), pt(0.1, -6.0, 1.0), pt(1.0, -7.0, 1.0)];
        match next_candidate(&c) {
            Next::Try(v) => assert!((v - 0.001).abs() < 1e-15),
            Next::Stop(..) => panic!("should step left"),
        }
        // Two points, the larger variance better: go right.
        let c = vec![pt(0.1, -6.0, 1.0), pt(1.0, -5.0, 1.0)];
        match next_candidate(&c) {
            Next::Try(v) => assert!((v - 10.0).abs() < 1e-12),
            Next::Stop(..) => panic!("should step right"),
        }
        // Bracketed and flat near the top: stop at the quadratic maximum.
        let f = |v: f64| -100.0 - 0.1 * (v.ln() - 0.3f64.ln()).powi(2);
        let c = vec![
            pt(0.01, f(0.01), 1.0),
            pt(0.1, f(0.1), 1.0),
            pt(1.0, f(1.0), 1.0),
        ];
        match next_candidate(&c) {
            Next::Stop(v, _) => assert!((v - 0.3).abs() < 1e-9, "{v}"),
            Next::Try(v) => panic!("should stop, got {v}"),
        }
    }

    /// Cox and Fine–Gray data for the shared-folds tests.
    /// `censor`: a supplied `censor_weight` column (Fine–Gray), used by every fold as given.
    fn risk_set_data(
        fine_gray: bool,
        strata: u64,
        counting: bool,
        censor: bool,
        seed: u64,
    ) -> DesignMatrix {
        use crate::model::risk_set::test_support::{build, random_records, Spec};
        let (mut recs, covs) = random_records(
            Spec {
                n: 240,
                p: 40,
                strata,
                weights: true,
                counting,
                fine_gray,
                offset: false,
            },
            seed,
        );
        for (i, r) in recs.iter_mut().enumerate() {
            if i % 2 == 0 {
                r.time = r.time.map(|t| t + 0.1 * (i % 5) as f64);
            }
            if censor {
                r.censor_weight = Some(0.3 + 0.1 * (i % 7) as f64);
            }
        }
        build(&recs, &covs)
    }

    fn without_seconds(mut r: CvResult) -> CvResult {
        r.seconds = 0.0;
        r
    }

    /// Folds as row selections of one shared model give the cross-validation of one copy of
    /// the rows per fold: the same candidates, fits, skipped folds and selected variance, and
    /// held-out log-likelihoods equal to 1e-9 (the fits stop at the same iterations; sums over
    /// data-determined chunks are split by the shared structure's sizes, so they differ in
    /// the last bits). Cox (Breslow, Efron, strata, (start, stop]) and Fine–Gray, Laplace and
    /// Normal priors, auto and grid search, two repetitions.
    #[test]
    fn shared_folds_match_copies() {
        let mut seed = 40;
        for (kind, ties, strata, counting, censor) in [
            (ModelKind::Cox, Ties::Breslow, 1, false, false),
            (ModelKind::Cox, Ties::Efron, 3, false, false),
            (ModelKind::Cox, Ties::Breslow, 2, true, false),
            (ModelKind::FineGray, Ties::Breslow, 1, false, false),
            (ModelKind::FineGray, Ties::Efron, 2, false, false),
            (ModelKind::FineGray, Ties::Breslow, 2, false, true),
        ] {
            seed += 1;
            let x = risk_set_data(kind == ModelKind::FineGray, strata, counting, censor, seed);
            let problem = Problem {
                design: &x,
                kind,
                lik: LikelihoodOptions { ties },
                exclude: &[],
                ccd: CcdOptions::fit_default(),
                fixed: Vec::new(),
            };
            for (prior, search) in [
                (Prior::Laplace { lambda: 1.0 }, CvSearch::Auto),
                (
                    Prior::Normal { variance: 1.0 },
                    CvSearch::Grid(vec![0.01, 0.1, 1.0]),
                ),
            ] {
                let opts = CvOptions {
                    folds: 4,
                    repetitions: 2,
                    search,
                    ..CvOptions::default()
                };
                let what = format!(
                    "{kind:?} {ties:?} strata={strata} counting={counting} censor={censor} {prior:?}"
                );
                let (units, n_units) = problem.units(Resampling::Auto);
                let asg = assign_folds(n_units, 4, 2, 1);
                assert!(
                    SharedFolds::new(&problem, &asg, &units, 4, None).is_some(),
                    "{what}"
                );
                let shared = cross_validate_with(&problem, prior, &opts, Share::Build)
                    .unwrap()
                    .0;
                let copies = cross_validate_with(&problem, prior, &opts, Share::Copies)
                    .unwrap()
                    .0;
                let close = |a: f64, b: f64| (a - b).abs() <= 1e-9 * (1.0 + a.abs().max(b.abs()));
                assert!(
                    close(shared.variance, copies.variance),
                    "{what}: {} vs {}",
                    shared.variance,
                    copies.variance
                );
                assert_eq!(shared.curve.len(), copies.curve.len(), "{what}");
                assert_eq!(shared.fits, copies.fits, "{what}");
                assert_eq!(shared.skipped, copies.skipped, "{what}");
                assert_eq!(shared.empty_test_folds, copies.empty_test_folds, "{what}");
                for (a, b) in shared.curve.iter().zip(&copies.curve) {
                    assert!(close(a.variance, b.variance), "{what}");
                    for (fa, fb) in a.folds.iter().zip(&b.folds) {
                        assert!(close(*fa, *fb), "{what} at {}: {fa} vs {fb}", a.variance);
                    }
                }
            }
        }
    }

    /// The shared-folds path gives bit-identical results on 1, 2 and 3 threads (the workers
    /// take different folds, each rebuilt from scratch).
    #[test]
    fn shared_folds_are_thread_independent() {
        for kind in [ModelKind::Cox, ModelKind::FineGray] {
            let x = risk_set_data(kind == ModelKind::FineGray, 2, false, false, 77);
            let problem = Problem {
                design: &x,
                kind,
                lik: LikelihoodOptions { ties: Ties::Efron },
                exclude: &[],
                ccd: CcdOptions::fit_default(),
                fixed: Vec::new(),
            };
            let opts = CvOptions {
                folds: 5,
                ..CvOptions::default()
            };
            let run = |threads: usize| {
                let pool = rayon::ThreadPoolBuilder::new()
                    .num_threads(threads)
                    .build()
                    .unwrap();
                pool.install(|| {
                    without_seconds(
                        cross_validate(&problem, Prior::Laplace { lambda: 1.0 }, &opts).unwrap(),
                    )
                })
            };
            let one = run(1);
            assert_eq!(one, run(2), "{kind:?}: 2 threads");
            assert_eq!(one, run(3), "{kind:?}: 3 threads");
        }
    }

    /// Logistic data (the copies path): 0/1 covariates, an intercept.
    fn logistic_data(n: usize, seed: u64) -> DesignMatrix {
        use crate::model::design::{DesignBuilder, OutcomeRecord};
        let mut rng = Rng::new(seed);
        let mut b = DesignBuilder::new();
        for i in 0..n {
            let x: Vec<bool> = (0..8).map(|_| rng.bernoulli(0.3)).collect();
            let eta: f64 = -0.4 + if x[0] { 0.9 } else { 0.0 } - if x[1] { 0.7 } else { 0.0 };
            b.push_outcome(OutcomeRecord {
                row_id: i as i64,
                y: f64::from(rng.bernoulli(1.0 / (1.0 + (-eta).exp()))),
                ..Default::default()
            });
            for (c, &on) in x.iter().enumerate() {
                if on {
                    b.push_covariate(i as i64, c as i64 + 1, 1.0);
                }
            }
        }
        b.build().unwrap().with_intercept()
    }

    /// The copies path builds each fold's likelihoods when it is fitted and drops them: the
    /// result does not depend on the thread count, and the first candidate's held-out
    /// log-likelihoods are those of fits on copies of each fold's rows made here, each from
    /// the fit on every row (the auto search's warm start), itself from zero.
    #[test]
    fn rebuilt_fold_copies_are_thread_independent_and_exact() {
        let x = logistic_data(300, 5);
        let problem = Problem {
            design: &x,
            kind: ModelKind::Logistic,
            lik: LikelihoodOptions::default(),
            exclude: &[],
            ccd: CcdOptions::fit_default(),
            fixed: Vec::new(),
        };
        let opts = CvOptions {
            folds: 5,
            repetitions: 2,
            seed: 3,
            ..CvOptions::default()
        };
        let prior = Prior::Laplace { lambda: 1.0 };
        let run = |threads: usize| {
            let pool = rayon::ThreadPoolBuilder::new()
                .num_threads(threads)
                .build()
                .unwrap();
            pool.install(|| without_seconds(cross_validate(&problem, prior, &opts).unwrap()))
        };
        let one = run(1);
        assert_eq!(one, run(2), "2 threads");
        assert_eq!(one, run(3), "3 threads");
        assert_eq!(one.fits % 10, 0);
        let first = one.curve.iter().find(|c| c.step == 0).unwrap();
        assert_eq!(first.folds.len(), 10);
        let (unit_of_row, n_units) = problem.units(Resampling::Row);
        let assignment = assign_folds(n_units, 5, 2, 3);
        let priors = problem.priors(prior.with_variance(first.variance));
        let p = problem.coefficient_ids().len();
        let all: Vec<u32> = (0..x.n_rows() as u32).collect();
        let mut whole = problem.likelihood_on(&all, None).unwrap();
        let start = fit_fold(
            &problem,
            &priors,
            first.variance,
            "all",
            whole.as_mut(),
            &vec![0.0; p],
        )
        .unwrap();
        assert!(start.iter().any(|&b| b != 0.0));
        assert_eq!(assignment.len(), 2);
        for (r, fold_of) in assignment.iter().enumerate() {
            for f in 0..5u32 {
                let rows = |test: bool| -> Vec<u32> {
                    (0..x.n_rows() as u32)
                        .filter(|&i| (fold_of[unit_of_row[i as usize] as usize] == f) == test)
                        .collect()
                };
                let mut train = problem.likelihood_on(&rows(false), None).unwrap();
                let beta = fit_fold(
                    &problem,
                    &priors,
                    first.variance,
                    "t",
                    train.as_mut(),
                    &start,
                )
                .unwrap();
                let mut test = problem.likelihood_on(&rows(true), None).unwrap();
                let ll = held_out("t", first.variance, test.as_mut(), &beta).unwrap();
                assert_eq!(
                    ll,
                    first.folds[r * 5 + f as usize],
                    "repetition {r}, fold {f}"
                );
            }
        }
    }

    #[test]
    fn stream_seeds_differ() {
        assert_ne!(stream_seed(1, 0), stream_seed(1, 1));
        assert_ne!(stream_seed(1, 0), stream_seed(2, 0));
        assert_eq!(stream_seed(5, 9), stream_seed(5, 9));
    }
}
