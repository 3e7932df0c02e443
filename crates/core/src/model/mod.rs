//! Pure numerics: design matrix, priors, likelihoods, cyclic coordinate descent, inference.
//!
//! This layer imports no `arrow`, `datafusion`, `tokio` or `cudarc`: solvers see plain slices.
//!
//! Conventions shared by every likelihood (η = xᵀβ + offset, e = exp η, w = row weight):
//!
//! * `log_likelihood` is reported **without data-independent constants** (no `log y!` for
//!   Poisson, no normalizing constants); each model's rustdoc says exactly what it includes.
//! * `gradient_hessian(j)` returns `(g_j, h_j)` with g_j = ∂LL/∂β_j and the curvature
//!   h_j = −∂²LL/∂β_j² ≥ 0.
//! * All accumulation is in `f64`.

/// Implements [`Likelihood`] for a wrapper type by delegating every method to its field
/// `$field` (a type with the same methods, inherent or through the trait); with `checkpoint`
/// also [`Likelihood::checkpoint`] and [`Likelihood::end_checkpoint`] (else the wrapper keeps
/// no checkpoints).
macro_rules! delegate_likelihood {
    ($t:ty, $field:tt { $($extra:tt)* }) => {
        impl $crate::model::Likelihood for $t {
            fn n_coef(&self) -> usize {
                self.$field.n_coef()
            }
            fn set_beta(&mut self, beta: &[f64]) {
                self.$field.set_beta(beta)
            }
            fn log_likelihood(&mut self) -> f64 {
                self.$field.log_likelihood()
            }
            fn gradient_hessian(&mut self, j: usize) -> (f64, f64) {
                self.$field.gradient_hessian(j)
            }
            fn update(&mut self, j: usize, delta: f64) {
                self.$field.update(j, delta)
            }
            fn information(&mut self, cols: &[usize]) -> Vec<f64> {
                self.$field.information(cols)
            }
            fn polish_max_block(&self) -> usize {
                self.$field.polish_max_block()
            }
            fn approximate_information(&mut self, cols: &[usize]) -> Option<Vec<f64>> {
                self.$field.approximate_information(cols)
            }
            fn gradients(&mut self, cols: &[usize]) -> Vec<f64> {
                self.$field.gradients(cols)
            }
            fn gradient_hessians(&mut self, cols: &[usize]) -> Vec<(f64, f64)> {
                self.$field.gradient_hessians(cols)
            }
            fn release_scratch(&mut self) {
                self.$field.release_scratch()
            }
            fn boxed_clone(&self) -> Box<dyn $crate::model::Likelihood> {
                Box::new(self.clone())
            }
            $($extra)*
        }
    };
    // `checkpoint`: the field keeps checkpoints too ([`Likelihood::checkpoint`]) and is a
    // likelihood over the same columns (its [`Likelihood::coordinate_cost`] is the wrapper's).
    ($t:ty, $field:tt, checkpoint) => {
        delegate_likelihood!($t, $field {
            fn checkpoint(&mut self) -> bool {
                self.$field.checkpoint()
            }
            fn end_checkpoint(&mut self, restore: bool) {
                self.$field.end_checkpoint(restore)
            }
            fn coordinate_cost(&self, j: usize) -> f64 {
                self.$field.coordinate_cost(j)
            }
        });
    };
    ($t:ty, $field:tt) => {
        delegate_likelihood!($t, $field {});
    };
}

pub mod bootstrap;
pub mod ccd;
pub mod censoring;
pub mod cox;
pub mod cv;
pub mod degenerate;
pub mod design;
pub mod fine_gray;
pub mod glm;
pub mod inference;
pub(crate) mod newton;
pub mod path;
pub mod prior;
pub mod registry;
pub mod risk_set;
pub mod rng;
pub mod robust;
pub(crate) mod row_blocks;
pub mod row_values;
pub mod sccs;
pub mod stepper;

use crate::error::{Error, Result};
use design::DesignMatrix;

/// The models the engine fits.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ModelKind {
    /// Conditional Poisson with log(time) offset, strata = cases (SCCS; Cyclops `cpr`).
    ConditionalPoisson,
    /// Cox proportional hazards (partial likelihood), optional strata, weights, (start, stop].
    Cox,
    /// Fine–Gray subdistribution hazards; y = 1 event of interest, 2 competing, 0 censored.
    FineGray,
    /// Logistic regression with intercept.
    Logistic,
    /// Poisson regression with intercept and log(time) offset.
    Poisson,
    /// Conditional logistic regression (matched sets = strata).
    ConditionalLogistic,
}

impl ModelKind {
    /// Parse the names used by the CLI, the SQL options and pipelines (canonical names and
    /// aliases of [`registry::MODELS`]).
    pub fn parse(s: &str) -> Result<Self> {
        registry::lookup(s).map(|d| d.kind).ok_or_else(|| {
            Error::option(
                "model",
                format!(
                    "unknown model `{}`; expected one of {}",
                    s.to_ascii_lowercase().replace('-', "_"),
                    registry::names()
                ),
            )
        })
    }

    /// The model's registry entry.
    pub fn descriptor(self) -> &'static registry::ModelDescriptor {
        registry::descriptor(self)
    }

    /// Canonical name.
    pub fn name(self) -> &'static str {
        self.descriptor().name
    }

    /// Whether the model gets an intercept column (logistic and Poisson regression).
    pub fn has_intercept(self) -> bool {
        self.descriptor().intercept
    }

    /// Whether rows need a `time` column.
    pub fn needs_time(self) -> bool {
        self.descriptor().needs_time
    }

    /// Model-specific row checks: time > 0 where required and the domain of y.
    pub fn check_rows(self, x: &DesignMatrix) -> Result<()> {
        let r = &x.rows;
        let bad = |i: usize, column: &str, message: String| Error::BadValue {
            row: i,
            row_id: r.row_id.get(i),
            column: column.into(),
            message,
        };
        let needs_positive_time = matches!(
            self,
            ModelKind::ConditionalPoisson
                | ModelKind::Poisson
                | ModelKind::Cox
                | ModelKind::FineGray
        ) && r.start_time.is_none();
        // The first row (in row order) whose time or y is outside the model's domain; within
        // a row the time is reported first. One typed scan per column.
        let bad_time = if needs_positive_time {
            r.time.position(|t| t <= 0.0)
        } else {
            None
        };
        let bad_y = match self {
            ModelKind::Cox | ModelKind::Logistic | ModelKind::ConditionalLogistic => {
                r.y.position(|y| !(y == 0.0 || y == 1.0))
            }
            ModelKind::FineGray => r.y.position(|y| !(y == 0.0 || y == 1.0 || y == 2.0)),
            ModelKind::ConditionalPoisson | ModelKind::Poisson => {
                if r.y.is_unsigned_integer_form() {
                    None
                } else {
                    r.y.position(|y| !(y >= 0.0 && y.fract() == 0.0))
                }
            }
        };
        match (bad_time, bad_y) {
            (Some(i), yi) if yi.is_none_or(|yi| i <= yi) => {
                let t = r.time.get(i);
                return Err(bad(
                    i,
                    "time",
                    format!("must be > 0 for {} (got {t})", self.name()),
                ));
            }
            (_, Some(i)) => {
                let y = r.y.get(i);
                let domain = self.descriptor().y_domain;
                return Err(bad(
                    i,
                    "y",
                    format!("must be {domain} for {} (got {y})", self.name()),
                ));
            }
            _ => {}
        }
        if r.start_time.is_some() && self != ModelKind::Cox {
            return Err(Error::BadColumn {
                column: "start_time".into(),
                message: format!(
                    "counting-process rows are only supported for cox, not {}",
                    self.name()
                ),
            });
        }
        if r.censor_weight.is_some() && self != ModelKind::FineGray {
            return Err(Error::BadColumn {
                column: "censor_weight".into(),
                message: format!("only used by fine_gray, not {}", self.name()),
            });
        }
        Ok(())
    }
}

/// Handling of tied event times in Cox and Fine–Gray partial likelihoods.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Ties {
    /// Breslow (Cyclops' convention; the default).
    #[default]
    Breslow,
    /// Efron (R `survival`'s default; weighted with the mean case weight of the tied events).
    Efron,
}

impl Ties {
    /// Parse `breslow` / `efron`.
    pub fn parse(s: &str) -> Result<Self> {
        match s.to_ascii_lowercase().as_str() {
            "breslow" => Ok(Ties::Breslow),
            "efron" => Ok(Ties::Efron),
            other => Err(Error::option(
                "ties",
                format!("unknown `{other}`; expected breslow or efron"),
            )),
        }
    }
}

/// A likelihood with incrementally maintained state, as cyclic coordinate descent needs it.
///
/// The state corresponds to a coefficient vector β that the likelihood keeps internally;
/// [`Likelihood::set_beta`] recomputes everything from scratch and [`Likelihood::update`]
/// changes one coefficient incrementally.
pub trait Likelihood: Send {
    /// Number of coefficients (= design-matrix columns).
    fn n_coef(&self) -> usize;
    /// Set all coefficients and recompute the state from scratch (also used periodically to
    /// remove the drift of incremental updates).
    fn set_beta(&mut self, beta: &[f64]);
    /// Log-likelihood at the current state (without data-independent constants).
    fn log_likelihood(&mut self) -> f64;
    /// `(g_j, h_j)`: first derivative and curvature (−second derivative) of the log-likelihood
    /// along coordinate `j` at the current state.
    fn gradient_hessian(&mut self, j: usize) -> (f64, f64);
    /// β_j += delta, updating the state incrementally.
    fn update(&mut self, j: usize, delta: f64);
    /// Observed information matrix (−Hessian of the log-likelihood) restricted to `cols`,
    /// row-major `cols.len() × cols.len()`, at the current state.
    fn information(&mut self, cols: &[usize]) -> Vec<f64>;
    /// The largest active set (unpenalized block plus non-zero coefficients) for which a
    /// Newton–Raphson step on the exact information is cheaper than coordinate-descent
    /// cycles ([`crate::model::ccd`]'s polish). Likelihoods whose information over k columns
    /// costs about k coordinate walks (Cox, Fine–Gray) allow hundreds.
    fn polish_max_block(&self) -> usize {
        newton::POLISH_MAX_BLOCK
    }
    /// A matrix at least as large as the information over `cols` (in the positive
    /// semidefinite order) and close to it, much cheaper to compute, when the likelihood has
    /// one: the Newton matrix of the active-set polish. Symmetric, returned as its lower
    /// triangle row by row (entry (a, b), b ≤ a, at a(a + 1)/2 + b: half the memory of the
    /// full matrix). `None`: use the exact information.
    fn approximate_information(&mut self, _cols: &[usize]) -> Option<Vec<f64>> {
        None
    }
    /// g_j = ∂LL/∂β_j for every j in `cols` at the current state (the first half of
    /// [`Likelihood::gradient_hessian`], to rounding; likelihoods may compute it faster).
    fn gradients(&mut self, cols: &[usize]) -> Vec<f64> {
        cols.iter().map(|&j| self.gradient_hessian(j).0).collect()
    }
    /// [`Likelihood::gradient_hessian`] of every j in `cols` at the current state (no update
    /// between them; the same values, bit for bit — likelihoods may compute the columns in
    /// parallel).
    fn gradient_hessians(&mut self, cols: &[usize]) -> Vec<(f64, f64)> {
        cols.iter().map(|&j| self.gradient_hessian(j)).collect()
    }
    /// The relative work of one gradient of coordinate `j` (its column's entries, say): what
    /// coordinate descent weighs when it decides whether cycles over the active set pay
    /// ([`crate::model::ccd`]). Default 1 (every coordinate alike).
    fn coordinate_cost(&self, _j: usize) -> f64 {
        1.0
    }
    /// Free scratch memory kept between calls (the end of a fit).
    fn release_scratch(&mut self) {}
    /// Keep a copy of the current state (β and what is derived from it) for
    /// [`Likelihood::end_checkpoint`]; `false` when the likelihood keeps none (the caller then
    /// returns to β with [`Likelihood::set_beta`]). For a trial point that may be rejected
    /// (Anderson extrapolation): going back is a copy instead of a recomputation.
    fn checkpoint(&mut self) -> bool {
        false
    }
    /// Drop the copy of [`Likelihood::checkpoint`], after returning the state to it when
    /// `restore` (no effect when none is kept).
    fn end_checkpoint(&mut self, _restore: bool) {}
    /// An independent copy (profile likelihood, bootstrap, CV folds).
    fn boxed_clone(&self) -> Box<dyn Likelihood>;
}

/// Options for building a likelihood.
#[derive(Debug, Clone, Copy, Default)]
pub struct LikelihoodOptions {
    /// Ties for Cox / Fine–Gray.
    pub ties: Ties,
}

/// Build the CPU likelihood of `kind` on `x` (rows already checked with
/// [`ModelKind::check_rows`]).
pub fn cpu_likelihood(
    kind: ModelKind,
    x: &DesignMatrix,
    opts: LikelihoodOptions,
) -> Result<Box<dyn Likelihood>> {
    cpu_likelihood_from(kind, x, x.column_source(), opts)
}

/// [`cpu_likelihood`] consuming the design matrix: each column is dropped as soon as the
/// likelihood has its own copy, and the row data when the likelihood is built, so peak memory
/// stays near one copy of the columns (DESIGN.md §10).
pub fn cpu_likelihood_owned(
    kind: ModelKind,
    x: DesignMatrix,
    opts: LikelihoodOptions,
) -> Result<Box<dyn Likelihood>> {
    kind.check_rows(&x)?;
    cpu_likelihood_owned_checked(kind, x, opts)
}

/// [`cpu_likelihood_owned`] on rows already checked with [`ModelKind::check_rows`] (as
/// [`degenerate::check_information`] does before every fit): the check is not repeated.
pub(crate) fn cpu_likelihood_owned_checked(
    kind: ModelKind,
    mut x: DesignMatrix,
    opts: LikelihoodOptions,
) -> Result<Box<dyn Likelihood>> {
    // The row data is dropped before the columns are converted.
    match kind {
        ModelKind::Cox => return Ok(Box::new(cox::Cox::from_owned(x, opts.ties)?)),
        ModelKind::FineGray => return Ok(Box::new(fine_gray::FineGray::from_owned(x, opts.ties)?)),
        ModelKind::ConditionalPoisson => {
            return Ok(Box::new(sccs::ConditionalPoisson::from_owned(x)?))
        }
        ModelKind::ConditionalLogistic => {
            return Ok(Box::new(glm::ConditionalLogistic::from_owned(x)?))
        }
        _ => {}
    }
    let cols = x.take_columns();
    likelihood_of(kind, &x, cols, opts)
}

/// Borrow every column of `x` for a likelihood of `kind`, with an intercept column first
/// when `kind` has one and `x` lacks it (without copying the design); true when it was added.
pub(crate) fn columns_for(kind: ModelKind, x: &DesignMatrix) -> (design::ColumnSource<'_>, bool) {
    let cols = x.column_source();
    if kind.has_intercept() && !x.has_intercept() {
        (cols.prepend(design::Column::intercept(x.n_rows())), true)
    } else {
        (cols, false)
    }
}

/// Build the CPU likelihood of `kind` from the row data of `x` and the columns `cols`
/// (`x.columns` is not used; it may have been taken).
pub fn cpu_likelihood_from(
    kind: ModelKind,
    x: &DesignMatrix,
    cols: design::ColumnSource<'_>,
    opts: LikelihoodOptions,
) -> Result<Box<dyn Likelihood>> {
    kind.check_rows(x)?;
    likelihood_of(kind, x, cols, opts)
}

/// [`cpu_likelihood_from`] without the row check.
fn likelihood_of(
    kind: ModelKind,
    x: &DesignMatrix,
    cols: design::ColumnSource<'_>,
    opts: LikelihoodOptions,
) -> Result<Box<dyn Likelihood>> {
    Ok(match kind {
        ModelKind::ConditionalPoisson => Box::new(sccs::ConditionalPoisson::from_columns(x, cols)?),
        ModelKind::Cox => Box::new(cox::Cox::from_columns(x, cols, opts.ties)?),
        ModelKind::FineGray => Box::new(fine_gray::FineGray::from_columns(x, cols, opts.ties)?),
        ModelKind::Logistic => Box::new(glm::Logistic::from_columns(x, cols)?),
        ModelKind::Poisson => Box::new(glm::Poisson::from_columns(x, cols)?),
        ModelKind::ConditionalLogistic => {
            Box::new(glm::ConditionalLogistic::from_columns(x, cols)?)
        }
    })
}
