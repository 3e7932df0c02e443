//! Regularization paths of the Laplace (L1) prior: a decreasing grid of λ fitted with warm
//! starts, the sequential strong rule and KKT re-checks (glmnet's `lambda` sequence; Tibshirani
//! et al. 2012, "Strong rules for discarding predictors in lasso-type problems").
//!
//! **Objective and λ.** Each point maximizes LL(β) − λ Σ_{j penalized} |β_j| (DESIGN.md §6): λ
//! is *our* λ, **not scaled by the number of rows** — glmnet's λ is this λ / N (N rows, or the
//! sum of weights). The unpenalized coefficients (the intercept and the `exclude` ids) are free
//! at every point.
//!
//! **λ_max.** With every penalized coefficient at 0 and the unpenalized ones fitted (the "null"
//! fit), the KKT conditions hold for every λ ≥ max_j |g_j| (g_j = ∂LL/∂β_j at that point), and
//! for no smaller λ: that maximum is λ_max, the first point of a generated grid, where every
//! penalized coefficient is 0. Points with λ ≥ λ_max are the null fit itself (as glmnet's first
//! point), not refitted.
//!
//! **The grid** ([`PathGrid::Log`]): `n` values log-spaced from λ_max down to
//! `min_ratio`·λ_max, both ends included: λ_k = λ_max · min_ratio^{k/(n−1)}. Defaults as
//! glmnet's: n = 100; `min_ratio` 1e-4 when there are more rows than covariate columns, else
//! 0.01. [`PathGrid::Lambdas`] fits given values instead (sorted decreasing, duplicates dropped).
//!
//! **Screening.** Before fitting λ_k, the sequential strong rule discards penalized coordinate j
//! when β̂_j(λ_{k−1}) = 0 and |g_j(β̂(λ_{k−1}))| < 2λ_k − λ_{k−1} (λ_{−1} = λ_max); the
//! discarded coordinates are held at 0 and the rest are fitted by [`ccd::fit`] warm-started at
//! β̂(λ_{k−1}). Then the KKT condition |g_j| ≤ λ_k(1 + tolerance) (the optimality rule's own
//! test at zero, [`ccd::scaled_violation`]) is checked at the new β̂ over every discarded
//! coordinate; violators join the fitted set and the point is refitted (warm) until none is
//! left. The result is therefore the same optimum as without screening (`strong_rule =
//! false`), to the solver's tolerance. The gradients of that check (over the zero coefficients
//! only) serve the next point's rule, so screening costs one gradient pass over the zeros per
//! point (plus one per refit).
//!
//! **Cost.** Each point is one [`ccd::fit`] under the caller's rule and tolerance, without the
//! Newton polish of the active set (`polish_max_block = 0`: from a warm start a few cycles
//! suffice, and the information matrix of the densest columns, which enter first, costs more
//! than it saves). Points with λ ≥ λ_max cost nothing beyond the null fit.
//!
//! | option | default | meaning |
//! |---|---|---|
//! | `grid` | `Log { n: 100, min_ratio: None }` | [`PathGrid`] |
//! | `strong_rule` | true | screen with the sequential strong rule (with KKT re-checks) |
//!
//! Everything here is sequential over λ (each point starts from the previous one) and uses the
//! likelihood's thread-independent sums, so paths do not depend on the thread count.

use std::time::Instant;

use super::ccd::{self, CcdOptions, FitStatus};
use super::prior::{Prior, PriorSet};
use super::Likelihood;
use crate::error::{Error, Result};

/// glmnet's default number of λ values.
pub const DEFAULT_N: usize = 100;
/// Most λ values in one path.
pub const MAX_LAMBDAS: usize = 10_000;

/// Which λ values a path fits.
#[derive(Debug, Clone, PartialEq)]
pub enum PathGrid {
    /// `n` log-spaced values from λ_max down to `min_ratio`·λ_max (module docs).
    Log {
        /// Number of values, 1–[`MAX_LAMBDAS`].
        n: usize,
        /// λ_min / λ_max in (0, 1); `None`: 1e-4 when rows > columns, else 0.01 (glmnet).
        min_ratio: Option<f64>,
    },
    /// These λ values (our convention: not divided by N), fitted from the largest down.
    Lambdas(Vec<f64>),
}

/// Options of a regularization path; see the module docs.
#[derive(Debug, Clone, PartialEq)]
pub struct PathOptions {
    /// The λ values.
    pub grid: PathGrid,
    /// Screen coordinates with the sequential strong rule (and re-check KKT).
    pub strong_rule: bool,
}

impl Default for PathOptions {
    fn default() -> Self {
        PathOptions {
            grid: PathGrid::Log {
                n: DEFAULT_N,
                min_ratio: None,
            },
            strong_rule: true,
        }
    }
}

impl PathOptions {
    /// Validate the options (errors name `path.n`, `path.min_ratio` or `path.lambdas`).
    pub fn check(&self) -> Result<()> {
        match &self.grid {
            PathGrid::Log { n, min_ratio } => {
                if *n == 0 || *n > MAX_LAMBDAS {
                    return Err(Error::option(
                        "path.n",
                        format!("must be in 1..={MAX_LAMBDAS} (got {n})"),
                    ));
                }
                if let Some(r) = min_ratio {
                    if !(*r > 0.0 && *r < 1.0) {
                        return Err(Error::option(
                            "path.min_ratio",
                            format!("must be in (0, 1) (got {r})"),
                        ));
                    }
                }
            }
            PathGrid::Lambdas(l) => {
                if l.is_empty() || l.len() > MAX_LAMBDAS {
                    return Err(Error::option(
                        "path.lambdas",
                        format!("needs 1 to {MAX_LAMBDAS} values (got {})", l.len()),
                    ));
                }
                if let Some(bad) = l.iter().find(|v| !(v.is_finite() && **v > 0.0)) {
                    return Err(Error::option(
                        "path.lambdas",
                        format!("every λ must be a finite number > 0 (got {bad})"),
                    ));
                }
            }
        }
        Ok(())
    }

    /// The `min_ratio` used for a design with `n_rows` rows and `n_cols` covariate columns
    /// (`None` for given λ values).
    pub fn min_ratio(&self, n_rows: usize, n_cols: usize) -> Option<f64> {
        match &self.grid {
            PathGrid::Log { min_ratio, .. } => {
                Some(min_ratio.unwrap_or(if n_rows > n_cols { 1e-4 } else { 0.01 }))
            }
            PathGrid::Lambdas(_) => None,
        }
    }

    /// The λ values to fit, largest first, given λ_max and the design's size.
    pub fn lambdas(&self, lambda_max: f64, n_rows: usize, n_cols: usize) -> Vec<f64> {
        match &self.grid {
            PathGrid::Log { n, .. } => {
                let ratio = self.min_ratio(n_rows, n_cols).unwrap_or(1e-4);
                log_lambdas(lambda_max, ratio, *n)
            }
            PathGrid::Lambdas(l) => {
                let mut l = l.clone();
                l.sort_by(|a, b| b.total_cmp(a));
                l.dedup();
                l
            }
        }
    }
}

/// `n` values from `lambda_max` down to `min_ratio`·`lambda_max`, log-spaced, ends included
/// (one value: `lambda_max`).
pub fn log_lambdas(lambda_max: f64, min_ratio: f64, n: usize) -> Vec<f64> {
    if n <= 1 {
        return vec![lambda_max; n];
    }
    let step = min_ratio.ln() / (n - 1) as f64;
    (0..n)
        .map(|k| {
            if k == 0 {
                lambda_max
            } else {
                lambda_max * (step * k as f64).exp()
            }
        })
        .collect()
}

/// One point of a path.
#[derive(Debug, Clone, PartialEq)]
pub struct PathPoint {
    /// λ (our convention: objective LL − λΣ|β|, not scaled by N).
    pub lambda: f64,
    /// Coefficients, one per column of the fit.
    pub beta: Vec<f64>,
    /// Log-likelihood at `beta` (from scratch).
    pub log_likelihood: f64,
    /// Log prior −λΣ|β_j| over the penalized coefficients.
    pub log_prior: f64,
    /// Non-zero coefficients, the intercept not counted (glmnet's `df`).
    pub non_zero: usize,
    /// Solver iterations of this point (all refits).
    pub iterations: usize,
    /// Status of the point's last fit.
    pub status: FitStatus,
    /// Penalized coordinates fitted (not discarded) in the last fit.
    pub strong_set: usize,
    /// Refits after a KKT violation among the discarded coordinates.
    pub kkt_refits: usize,
}

/// A fitted path.
#[derive(Debug, Clone, PartialEq)]
pub struct PathResult {
    /// λ_max: the smallest λ at which every penalized coefficient is 0.
    pub lambda_max: f64,
    /// The `min_ratio` of a generated grid (`None` for given λ values).
    pub min_ratio: Option<f64>,
    /// Whether the strong rule screened coordinates.
    pub strong_rule: bool,
    /// The points, λ decreasing.
    pub points: Vec<PathPoint>,
    /// Coordinate updates of all fits.
    pub coordinate_updates: u64,
    /// Wall time of the path (null fit included), seconds.
    pub seconds: f64,
}

/// The null fit: every penalized coefficient held at 0, the others fitted (from 0).
#[derive(Debug, Clone, PartialEq)]
pub struct NullFit {
    /// λ_max = max over penalized j of |g_j| at [`NullFit::beta`].
    pub lambda_max: f64,
    /// The coefficients (0 for every penalized one).
    pub beta: Vec<f64>,
    /// g_j = ∂LL/∂β_j at `beta` for the penalized columns (0 for the others).
    pub gradient: Vec<f64>,
    /// Log-likelihood at `beta`.
    pub log_likelihood: f64,
    /// Iterations of the fit of the unpenalized coefficients.
    pub iterations: usize,
    /// Its status.
    pub status: FitStatus,
}

/// The [`NullFit`] and λ_max. The likelihood is left at its β.
pub fn null_fit(
    lik: &mut dyn Likelihood,
    penalized: &[bool],
    opts: &CcdOptions,
) -> Result<NullFit> {
    let p = lik.n_coef();
    check_mask(p, penalized)?;
    if !penalized.iter().any(|&b| b) {
        return Err(Error::option(
            "path",
            "a regularization path needs penalized coefficients: every column is excluded",
        ));
    }
    let excluded: Vec<bool> = penalized.iter().map(|b| !b).collect();
    let priors = PriorSet::new(Prior::Laplace { lambda: 1.0 }, &excluded);
    let r = ccd::fit(lik, &priors, &vec![0.0; p], Some(penalized), opts)?;
    if r.status == FitStatus::IllConditioned {
        return Err(Error::FitFailed(
            "path: the fit of the unpenalized coefficients (λ = ∞) is ill-conditioned".into(),
        ));
    }
    let gradient = gradients(lik, penalized)?;
    let lambda_max = gradient.iter().fold(0.0f64, |m, v| m.max(v.abs()));
    if !(lambda_max > 0.0 && lambda_max.is_finite()) {
        return Err(Error::FitFailed(format!(
            "path: λ_max = {lambda_max}: no penalized coefficient moves the likelihood at the \
             fit of the unpenalized ones"
        )));
    }
    Ok(NullFit {
        lambda_max,
        beta: r.beta,
        gradient,
        log_likelihood: r.log_likelihood,
        iterations: r.iterations,
        status: r.status,
    })
}

/// Fit the path of `opts` on `lik` (see the module docs). `penalized[j]` says whether the
/// Laplace prior applies to column j; `intercept` is the intercept's column, if any (not
/// counted in [`PathPoint::non_zero`]); `n_rows` and `n_cols` (covariate columns) choose the
/// default `min_ratio`. The likelihood is left at the last point's β.
pub fn fit_path(
    lik: &mut dyn Likelihood,
    penalized: &[bool],
    intercept: Option<usize>,
    opts: &PathOptions,
    n_rows: usize,
    n_cols: usize,
    ccd_opts: &CcdOptions,
) -> Result<PathResult> {
    let strong = |lambda: f64, previous: f64| 2.0 * lambda - previous;
    fit_path_screened(
        lik, penalized, intercept, opts, n_rows, n_cols, ccd_opts, strong,
    )
}

/// [`fit_path`] with the screening threshold `threshold(λ_k, λ_{k−1})` (a penalized zero is
/// discarded when its |g| is below it; tests use a rule that discards too much).
#[allow(clippy::too_many_arguments)]
fn fit_path_screened(
    lik: &mut dyn Likelihood,
    penalized: &[bool],
    intercept: Option<usize>,
    opts: &PathOptions,
    n_rows: usize,
    n_cols: usize,
    ccd_opts: &CcdOptions,
    threshold: impl Fn(f64, f64) -> f64,
) -> Result<PathResult> {
    opts.check()?;
    let started = Instant::now();
    let null = null_fit(lik, penalized, ccd_opts)?;
    let lambda_max = null.lambda_max;
    let (mut beta, mut grad) = (null.beta.clone(), null.gradient.clone());
    let lambdas = opts.lambdas(lambda_max, n_rows, n_cols);
    let excluded: Vec<bool> = penalized.iter().map(|b| !b).collect();
    let p = beta.len();
    let tol = ccd_opts.tolerance;
    // No Newton polish of the active set: from a warm start coordinate descent needs a few
    // cycles, and the information matrix of the first (densest) columns to enter costs more
    // than they save (SCCS paths ran 40% longer with it).
    let ccd_opts = &CcdOptions {
        polish_max_block: 0,
        ..ccd_opts.clone()
    };
    let mut updates = 0u64;
    let mut points = Vec::with_capacity(lambdas.len());
    let mut previous = lambda_max.max(lambdas[0]);
    for &lambda in &lambdas {
        ccd_opts.cancel.check()?;
        let priors = PriorSet::new(Prior::Laplace { lambda }, &excluded);
        if lambda >= lambda_max {
            // The null fit is the optimum (glmnet's first point): no refit, whose Newton step
            // on the unpenalized block could nudge a gradient past λ_max by rounding.
            points.push(PathPoint {
                lambda,
                beta: null.beta.clone(),
                log_likelihood: null.log_likelihood,
                log_prior: 0.0,
                non_zero: (0..p)
                    .filter(|&j| Some(j) != intercept && null.beta[j] != 0.0)
                    .count(),
                iterations: null.iterations,
                status: null.status,
                strong_set: 0,
                kkt_refits: 0,
            });
            previous = lambda;
            continue;
        }
        // The strong set: every unpenalized or non-zero coefficient, and the penalized zeros
        // whose gradient at the previous point is at least 2λ − λ_prev.
        let threshold = threshold(lambda, previous);
        let mut keep: Vec<bool> = (0..p)
            .map(|j| {
                !penalized[j] || !opts.strong_rule || beta[j] != 0.0 || grad[j].abs() >= threshold
            })
            .collect();
        let mut iterations = 0;
        let mut kkt_refits = 0;
        let (status, log_likelihood) = loop {
            let fixed: Vec<bool> = keep.iter().map(|k| !k).collect();
            let r = ccd::fit(lik, &priors, &beta, Some(&fixed), ccd_opts)?;
            updates += r.coordinate_updates;
            iterations += r.iterations;
            if r.status == FitStatus::IllConditioned {
                return Err(Error::FitFailed(format!(
                    "path: the fit at λ = {lambda} is ill-conditioned"
                )));
            }
            beta = r.beta;
            // Only the zeros matter: to the KKT check (discarded ones) and the next point's
            // strong rule (non-zero coefficients are kept whatever their gradient).
            let zeros: Vec<bool> = (0..p).map(|j| penalized[j] && beta[j] == 0.0).collect();
            grad = gradients(lik, &zeros)?;
            let mut violated = false;
            for j in 0..p {
                if !keep[j] && grad[j].abs() > lambda * (1.0 + tol) {
                    keep[j] = true;
                    violated = true;
                }
            }
            if !violated {
                // The gradient pass moved nothing: the likelihood is still at β.
                break (r.status, r.log_likelihood);
            }
            kkt_refits += 1;
        };
        points.push(PathPoint {
            lambda,
            log_prior: priors.log_prior(&beta),
            non_zero: (0..p)
                .filter(|&j| Some(j) != intercept && beta[j] != 0.0)
                .count(),
            beta: beta.clone(),
            log_likelihood,
            iterations,
            status,
            strong_set: (0..p).filter(|&j| penalized[j] && keep[j]).count(),
            kkt_refits,
        });
        previous = lambda;
    }
    Ok(PathResult {
        lambda_max,
        min_ratio: opts.min_ratio(n_rows, n_cols),
        strong_rule: opts.strong_rule,
        points,
        coordinate_updates: updates,
        seconds: started.elapsed().as_secs_f64(),
    })
}

fn check_mask(p: usize, penalized: &[bool]) -> Result<()> {
    if penalized.len() != p {
        return Err(Error::FitFailed(format!(
            "internal: {p} coefficients but a penalty mask of {}",
            penalized.len()
        )));
    }
    Ok(())
}

/// g_j = ∂LL/∂β_j at the likelihood's current β for the columns with `which[j]` (0 for the
/// others).
fn gradients(lik: &mut dyn Likelihood, which: &[bool]) -> Result<Vec<f64>> {
    let mut g = vec![0.0; which.len()];
    for (j, gj) in g.iter_mut().enumerate() {
        if which[j] {
            let (v, _) = lik.gradient_hessian(j);
            if !v.is_finite() {
                return Err(Error::FitFailed(format!(
                    "path: the gradient of column {j} is not finite"
                )));
            }
            *gj = v;
        }
    }
    Ok(g)
}

#[cfg(test)]
mod tests {
    use super::*;

    use crate::model::cox::Cox;
    use crate::model::risk_set::test_support::{build, random_records, Spec};
    use crate::model::Ties;

    fn cox(p: usize, seed: u64) -> Cox {
        let spec = Spec {
            n: 400,
            p,
            strata: 2,
            weights: false,
            counting: false,
            fine_gray: false,
            offset: false,
        };
        let (recs, covs) = random_records(spec, seed);
        Cox::new(&build(&recs, &covs), Ties::Breslow).unwrap()
    }

    fn tight() -> CcdOptions {
        CcdOptions {
            tolerance: 1e-10,
            ..CcdOptions::fit_default()
        }
    }

    #[test]
    fn log_grid_ends_and_spacing() {
        let l = log_lambdas(10.0, 0.01, 5);
        assert_eq!(l.len(), 5);
        assert_eq!(l[0], 10.0);
        assert!((l[4] - 0.1).abs() < 1e-12);
        for w in l.windows(2) {
            assert!((w[1] / w[0] - 0.01f64.powf(0.25)).abs() < 1e-12);
        }
        assert_eq!(log_lambdas(3.0, 0.5, 1), vec![3.0]);
        let o = PathOptions::default();
        assert_eq!(o.min_ratio(1000, 10), Some(1e-4));
        assert_eq!(o.min_ratio(10, 1000), Some(0.01));
        let given = PathOptions {
            grid: PathGrid::Lambdas(vec![1.0, 5.0, 1.0, 3.0]),
            strong_rule: true,
        };
        assert_eq!(given.lambdas(100.0, 1, 1), vec![5.0, 3.0, 1.0]);
        assert_eq!(given.min_ratio(1, 1), None);
    }

    #[test]
    fn bad_options_name_the_key() {
        for (o, key) in [
            (
                PathGrid::Log {
                    n: 0,
                    min_ratio: None,
                },
                "path.n",
            ),
            (
                PathGrid::Log {
                    n: 10,
                    min_ratio: Some(1.5),
                },
                "path.min_ratio",
            ),
            (PathGrid::Lambdas(vec![]), "path.lambdas"),
            (PathGrid::Lambdas(vec![1.0, -2.0]), "path.lambdas"),
        ] {
            let e = PathOptions {
                grid: o,
                strong_rule: true,
            }
            .check()
            .unwrap_err()
            .to_string();
            assert!(e.contains(key), "{e}");
        }
    }

    /// At λ_max every penalized coefficient is 0; just below it exactly one (the column with
    /// the largest gradient) moves.
    #[test]
    fn lambda_max_is_the_first_knot() {
        let mut lik = cox(6, 3);
        let mut penalized = vec![true; 6];
        penalized[0] = false;
        let null = null_fit(&mut lik, &penalized, &tight()).unwrap();
        let (lmax, g) = (null.lambda_max, null.gradient);
        let top = (1..6)
            .max_by(|&a, &b| g[a].abs().total_cmp(&g[b].abs()))
            .unwrap();
        let opts = PathOptions {
            grid: PathGrid::Lambdas(vec![lmax, lmax * 0.999]),
            strong_rule: true,
        };
        let r = fit_path(&mut lik, &penalized, None, &opts, 400, 6, &tight()).unwrap();
        assert_eq!(r.lambda_max, lmax);
        let at = &r.points[0].beta;
        assert!(at[0] != 0.0, "the unpenalized coefficient is fitted");
        assert!((1..6).all(|j| at[j] == 0.0), "{at:?}");
        let below = &r.points[1].beta;
        let moved: Vec<usize> = (1..6).filter(|&j| below[j] != 0.0).collect();
        assert_eq!(moved, vec![top], "{below:?}");
        assert_eq!(r.points[1].non_zero, 2);
    }

    /// Each point equals an independent fit from zero at its λ; screening changes nothing;
    /// the number of non-zero coefficients grows (almost) monotonically as λ falls.
    #[test]
    fn path_points_are_the_fits_at_their_lambda() {
        let p = 12;
        let mut penalized = vec![true; p];
        penalized[2] = false;
        let opts = PathOptions {
            grid: PathGrid::Log {
                n: 15,
                min_ratio: Some(0.02),
            },
            strong_rule: true,
        };
        let mut lik = cox(p, 8);
        let screened = fit_path(&mut lik, &penalized, None, &opts, 400, p, &tight()).unwrap();
        let plain = fit_path(
            &mut cox(p, 8),
            &penalized,
            None,
            &PathOptions {
                strong_rule: false,
                ..opts.clone()
            },
            400,
            p,
            &tight(),
        )
        .unwrap();
        assert_eq!(screened.points.len(), 15);
        let excluded: Vec<bool> = penalized.iter().map(|b| !b).collect();
        let mut drops = 0;
        for (k, (a, b)) in screened.points.iter().zip(&plain.points).enumerate() {
            assert_eq!(a.lambda, b.lambda);
            assert_eq!(a.status, FitStatus::Converged);
            for j in 0..p {
                assert!((a.beta[j] - b.beta[j]).abs() < 1e-6, "k {k} j {j}");
            }
            let priors = PriorSet::new(Prior::Laplace { lambda: a.lambda }, &excluded);
            let mut fresh = cox(p, 8);
            let single = ccd::fit(&mut fresh, &priors, &vec![0.0; p], None, &tight()).unwrap();
            for j in 0..p {
                assert!(
                    (a.beta[j] - single.beta[j]).abs() < 1e-6,
                    "λ {} j {j}: {} vs {}",
                    a.lambda,
                    a.beta[j],
                    single.beta[j]
                );
            }
            assert!((a.log_likelihood - single.log_likelihood).abs() < 1e-6);
            if k > 0 && a.non_zero < screened.points[k - 1].non_zero {
                drops += 1;
            }
            // KKT at every point, over all coordinates.
            lik.set_beta(&a.beta);
            for j in (0..p).filter(|&j| penalized[j]) {
                let (g, h) = lik.gradient_hessian(j);
                let v = ccd::scaled_violation(priors.per_coef[j], a.beta[j], g, h);
                assert!(v < 1e-6, "λ {} j {j}: violation {v}", a.lambda);
            }
        }
        assert!(drops <= 2, "{drops} drops of the non-zero count");
        let first = &screened.points[0];
        assert_eq!(first.non_zero, 1);
        assert!(screened.points.last().unwrap().non_zero > 5);
        // Screening fits fewer coordinates on average.
        let mean = |r: &PathResult| r.points.iter().map(|q| q.strong_set).sum::<usize>();
        assert!(mean(&screened) < mean(&plain));
    }

    /// A screening rule that discards too much (here: every zero, whatever its gradient) is
    /// caught by the KKT re-check and refitted to the same optimum as the strong rule's.
    #[test]
    fn kkt_recheck_repairs_a_screen_that_discards_too_much() {
        let p = 10;
        let penalized = vec![true; p];
        let opts = PathOptions {
            grid: PathGrid::Log {
                n: 8,
                min_ratio: Some(0.05),
            },
            strong_rule: true,
        };
        let greedy = fit_path_screened(
            &mut cox(p, 21),
            &penalized,
            None,
            &opts,
            400,
            p,
            &tight(),
            |_, _| f64::INFINITY,
        )
        .unwrap();
        let strong = fit_path(&mut cox(p, 21), &penalized, None, &opts, 400, p, &tight()).unwrap();
        assert!(greedy.points.iter().map(|q| q.kkt_refits).sum::<usize>() >= 1);
        for (a, b) in greedy.points.iter().zip(&strong.points) {
            assert_eq!(a.non_zero, b.non_zero);
            for j in 0..p {
                assert!((a.beta[j] - b.beta[j]).abs() < 1e-6, "λ {} j {j}", a.lambda);
            }
        }
    }

    /// Paths are bit-identical for any thread count (tiny chunks, so that the likelihood's
    /// walks really run in parallel).
    #[test]
    fn paths_do_not_depend_on_threads() {
        let p = 8;
        let penalized = vec![true; p];
        let opts = PathOptions {
            grid: PathGrid::Log {
                n: 6,
                min_ratio: Some(0.05),
            },
            strong_rule: true,
        };
        let mut bits = Vec::new();
        for threads in 1..=3 {
            let pool = rayon::ThreadPoolBuilder::new()
                .num_threads(threads)
                .build()
                .unwrap();
            let r = pool.install(|| {
                let mut lik = cox(p, 5).with_min_chunk(2);
                fit_path(&mut lik, &penalized, None, &opts, 400, p, &tight()).unwrap()
            });
            let b: Vec<u64> = r
                .points
                .iter()
                .flat_map(|q| {
                    q.beta
                        .iter()
                        .chain([&q.log_likelihood])
                        .map(|v| v.to_bits())
                })
                .collect();
            bits.push(b);
        }
        assert!(bits.iter().all(|b| *b == bits[0]));
    }

    #[test]
    fn every_column_excluded_is_an_error() {
        let e = null_fit(&mut cox(3, 1), &[false; 3], &tight())
            .unwrap_err()
            .to_string();
        assert!(e.contains("path"), "{e}");
    }
}
