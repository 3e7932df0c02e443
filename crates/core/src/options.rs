//! Fit options: one model for SQL JSON, pipeline TOML and CLI flags.
//!
//! What users write is a [`FitSpec`]: every key optional, unknown keys and wrong types are
//! errors naming the key. It deserializes (serde, `deny_unknown_fields`) from the JSON `options`
//! argument of the SQL functions, from a pipeline's `[analysis.fit]` / `[analysis.cv]` tables,
//! and the CLI builds one from its flags. [`FitSpec::check`] validates it **once** into the
//! checked [`FitOptions`] (linfa's `ParamGuard` pattern), resource caps included; the defaults
//! live in [`FitOptions::new`] and the sub-options' `Default`s, and are documented in one table,
//! [`FIT_OPTIONS`], from which the README, `pipelines/README.md`, `epifusion_functions()` and
//! the CLI help are generated (a test fails when a document drifts from it).
//!
//! **A variance or λ with no prior means a Laplace prior, everywhere**, and so do `path` and
//! `cv` with no prior (cross-validation chooses a Laplace variance unless `prior` says `normal`;
//! a path is always one of the Laplace prior's λ).
#![doc = include_str!("../fit_options.md")]

use serde::de::{self, Deserializer, MapAccess, SeqAccess, Visitor};
use serde::Deserialize;

use crate::backend::{Device, Precision};
use crate::error::{Error, Result};
use crate::fit::{default_profile_grid, CiMethod, FitOptions, ProfileOptions, SeMethod};
use crate::model::bootstrap::BootstrapOptions;
use crate::model::ccd::Convergence;
use crate::model::cv::{log_grid, CvOptions, CvSearch, Resampling};
use crate::model::path::{PathGrid, PathOptions};
use crate::model::prior::Prior;
use crate::model::{ModelKind, Ties};

/// Most rayon threads a fit may ask for.
pub const MAX_THREADS: usize = 1024;
/// Most points of a likelihood-profile grid or a CV variance grid.
pub const MAX_GRID_STEPS: usize = 100_000;
/// Most bootstrap replicates.
pub const MAX_REPLICATES: usize = 100_000;
/// Most CV folds × repetitions.
pub const MAX_CV_FITS: usize = 100_000;

/// One documented option key.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OptionDoc {
    /// Key (`cv.folds` for a nested one).
    pub key: &'static str,
    /// Type as users write it.
    pub ty: &'static str,
    /// Default.
    pub default: &'static str,
    /// Meaning.
    pub meaning: &'static str,
}

const fn doc(
    key: &'static str,
    ty: &'static str,
    default: &'static str,
    meaning: &'static str,
) -> OptionDoc {
    OptionDoc {
        key,
        ty,
        default,
        meaning,
    }
}

/// Every fit option key (nested keys as `cv.folds`): the one table the documents are generated
/// from.
pub const FIT_OPTIONS: &[OptionDoc] = &[
    doc("prior", "string", "`none` (`laplace` when `variance`, `lambda`, `cv` or `path` is given)", "`none`, `laplace` or `normal`"),
    doc("variance", "number", "–", "prior variance (Laplace λ = √(2/v), Normal σ² = v)"),
    doc("lambda", "number", "–", "Laplace λ (objective LL − λΣ\\|β\\|, not scaled by n), or the ridge λ (σ² = 1/λ)"),
    doc("exclude", "array of ints", "`[]`", "covariate ids never penalized (the intercept never is)"),
    doc("ties", "string", "`breslow`", "`breslow` or `efron` (Cox, Fine–Gray)"),
    doc("convergence", "string", "`optimality`", "`optimality`: unpenalized coefficients solved by Newton–Raphson on the exact information (step-halving) until the Newton decrement √(gᵀI⁻¹g) ≤ `tolerance`, penalized ones by CCD until the KKT conditions hold at the returned β to `tolerance` (\\|g\\| ≤ λ(1 + tol) at 0, \\|g − λ sign β\\| ≤ tol·max(1, λ) elsewhere); `objective`: relative change of the objective after a CCD cycle (Cyclops' `lange` type; stops early); `gradient`: largest KKT violation in a CCD cycle"),
    doc("tolerance", "number", "`1e-6`", "threshold of the convergence rule"),
    doc("max_iterations", "int", "`1000`", "solver iterations: Newton iterations of a classical fit, CCD cycles (each with one Newton step on the unpenalized coefficients) of a penalized one"),
    doc("se", "string", "`robust` for `fine_gray`, `model` otherwise", "standard error reported as `std_error` and used by Wald intervals: `model` (observed information) or `robust` (sandwich: Fine & Gray's with the censoring-weight term, as `cmprsk::crr`, for `fine_gray`; Lin–Wei, as `coxph(robust = TRUE)`, for `cox`; HC0 for `logistic` / `poisson`; by stratum for `sccs` / `conditional_logistic`; clusters from the `cluster_id` column). Both are returned as `std_error_model` and `std_error_robust` where computed"),
    doc("ci", "string", "`profile` (`wald` for `fine_gray`)", "`profile`, `wald`, `bootstrap` (percentile intervals of every coefficient) or `none`"),
    doc("ci_level", "number", "`0.95`", "interval level, in (0, 1)"),
    doc("device", "string", "`auto`", "`auto`, `cpu` or `cuda` (`auto` uses the CPU until the CUDA kernels are verified on a GPU; `cuda` without a usable GPU is an error)"),
    doc("precision", "string", "`f64`", "design storage on the GPU: `f64`, or `f32` with f64 accumulation"),
    doc("threads", "int", "all cores", "rayon threads, 1–1024; results do not depend on it"),
    doc("cv", "object or `true`", "–", "choose the prior variance by cross-validation (keys below)"),
    doc("cv.folds", "int", "`10`", "folds, ≥ 2 (at most the number of units)"),
    doc("cv.repetitions", "int", "`1`", "repetitions of the whole k-fold split"),
    doc("cv.seed", "int", "`1`", "seed of the fold assignment"),
    doc("cv.search", "string", "`auto`", "`auto` (Cyclops' bracketing search) or `grid`"),
    doc("cv.grid", "array or object", "`{lower = 0.01, upper = 20, steps = 10}`", "variances of the grid search: an array, or `lower`, `upper`, `steps` (log-spaced, ≤ 100,000)"),
    doc("cv.by", "string", "`auto`", "fold units: `auto` (strata for SCCS / conditional logistic, rows otherwise), `row` or `stratum`"),
    doc("cv.start_variance", "number", "Σ‖x_j‖²/(J·N)", "first variance of the auto search"),
    doc("cv.max_steps", "int", "`20`", "most candidates of the auto search, ≥ 3"),
    doc("bootstrap", "object or `true`", "–", "bootstrap the fit (keys below)"),
    doc("bootstrap.replicates", "int", "`200`", "replicates, 1–100,000"),
    doc("bootstrap.by", "string", "`auto`", "resampling units, as `cv.by`"),
    doc("bootstrap.seed", "int", "`1`", "seed"),
    doc("profile", "object or array", "–", "profile intervals / likelihood profiles of chosen coefficients; an array is `covariates`"),
    doc("profile.covariates", "array of ints", "`[]`", "covariate ids that get a profile interval even when penalized"),
    doc("profile.include_penalty", "bool", "`true`", "whether the profiled objective keeps the coefficient's own penalty"),
    doc("profile.grid", "`true`, array or object", "–", "β values of the likelihood profiles: `true` for CohortMethod's 1000 values of log 0.1 … log 10, an array, or `from`, `to`, `steps` (≤ 100,000)"),
    doc("path", "object, array or `true`", "–", "fit a regularization path of the Laplace prior, λ from λ_max (the smallest λ at which every penalized coefficient is 0, given the unpenalized ones) down, with warm starts and the sequential strong rule (KKT re-checked); the coefficients returned are the fit at the smallest λ, `table: path` returns every point. An array is `lambdas`; conflicts with `lambda`, `variance`, `cv` and `bootstrap`; `prior` must be laplace or left out"),
    doc("path.n", "int", "`100`", "number of λ values, log-spaced from λ_max to `min_ratio`·λ_max (glmnet's `nlambda`), 1–10,000"),
    doc("path.min_ratio", "number", "`1e-4` if rows > covariates, else `0.01`", "smallest λ / λ_max, in (0, 1) (glmnet's `lambda.min.ratio`)"),
    doc("path.lambdas", "array of numbers", "–", "these λ values instead of a grid (our λ: objective LL − λΣ\\|β\\|, not scaled by n; glmnet's λ = this λ / n), fitted from the largest down"),
    doc("path.strong_rule", "bool", "`true`", "screen coefficients with the sequential strong rule (discarded ones are re-checked against the KKT conditions, so the result is the same)"),
    doc("table", "string", "`coefficients`", "what a `*_fit` table function returns: `coefficients`, `cv`, `profile`, `bootstrap`, `replicates` or `path` (one row per λ and coefficient: lambda, covariate_id, estimate, log_likelihood, non_zero, …)"),
];

/// The option table as Markdown (`| key | type | default | meaning |`), the block the README,
/// `pipelines/README.md` and this module's documentation contain.
pub fn options_markdown() -> String {
    let mut s = String::from("| key | type | default | meaning |\n|---|---|---|---|\n");
    for d in FIT_OPTIONS {
        s.push_str(&format!(
            "| `{}` | {} | {} | {} |\n",
            d.key, d.ty, d.default, d.meaning
        ));
    }
    s
}

/// The option table as plain text for the CLI's help.
pub fn options_text() -> String {
    let width = FIT_OPTIONS.iter().map(|d| d.key.len()).max().unwrap_or(0);
    let mut s = String::new();
    for d in FIT_OPTIONS {
        s.push_str(&format!(
            "  {:<width$}  {} [default {}]\n",
            d.key,
            d.meaning.replace('`', "").replace("\\|", "|"),
            d.default.replace('`', "")
        ));
    }
    s
}

/// `true` / `false` / `null`, or the option's own object.
#[derive(Debug, Clone, PartialEq)]
pub enum Toggle<T> {
    /// `true` (the defaults) or `false` (off).
    On(bool),
    /// An object.
    Spec(T),
}

impl<T: Default> Toggle<T> {
    /// The spec when on.
    pub fn into_spec(self) -> Option<T> {
        match self {
            Toggle::On(false) => None,
            Toggle::On(true) => Some(T::default()),
            Toggle::Spec(s) => Some(s),
        }
    }
}

impl<'de, T: Deserialize<'de>> Deserialize<'de> for Toggle<T> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> std::result::Result<Self, D::Error> {
        struct V<T>(std::marker::PhantomData<T>);
        impl<'de, T: Deserialize<'de>> Visitor<'de> for V<T> {
            type Value = Toggle<T>;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("true, false or an object")
            }
            fn visit_bool<E: de::Error>(self, v: bool) -> std::result::Result<Self::Value, E> {
                Ok(Toggle::On(v))
            }
            fn visit_unit<E: de::Error>(self) -> std::result::Result<Self::Value, E> {
                Ok(Toggle::On(false))
            }
            fn visit_map<A: MapAccess<'de>>(
                self,
                map: A,
            ) -> std::result::Result<Self::Value, A::Error> {
                T::deserialize(de::value::MapAccessDeserializer::new(map)).map(Toggle::Spec)
            }
        }
        d.deserialize_any(V(std::marker::PhantomData))
    }
}

/// A list, or an object describing one.
#[derive(Debug, Clone, PartialEq)]
pub enum ListOr<T, O> {
    /// `true` (where it means a default list) or `false`.
    Flag(bool),
    /// The list.
    List(Vec<T>),
    /// The object.
    Object(O),
}

impl<'de, T: Deserialize<'de>, O: Deserialize<'de>> Deserialize<'de> for ListOr<T, O> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> std::result::Result<Self, D::Error> {
        struct V<T, O>(std::marker::PhantomData<(T, O)>);
        impl<'de, T: Deserialize<'de>, O: Deserialize<'de>> Visitor<'de> for V<T, O> {
            type Value = ListOr<T, O>;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("an array or an object")
            }
            fn visit_bool<E: de::Error>(self, v: bool) -> std::result::Result<Self::Value, E> {
                Ok(ListOr::Flag(v))
            }
            fn visit_unit<E: de::Error>(self) -> std::result::Result<Self::Value, E> {
                Ok(ListOr::Flag(false))
            }
            fn visit_seq<A: SeqAccess<'de>>(
                self,
                seq: A,
            ) -> std::result::Result<Self::Value, A::Error> {
                Vec::<T>::deserialize(de::value::SeqAccessDeserializer::new(seq)).map(ListOr::List)
            }
            fn visit_map<A: MapAccess<'de>>(
                self,
                map: A,
            ) -> std::result::Result<Self::Value, A::Error> {
                O::deserialize(de::value::MapAccessDeserializer::new(map)).map(ListOr::Object)
            }
        }
        d.deserialize_any(V(std::marker::PhantomData))
    }
}

/// `cv.grid = {lower, upper, steps}`.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LogGridSpec {
    /// Smallest variance [0.01].
    pub lower: Option<f64>,
    /// Largest variance [20].
    pub upper: Option<f64>,
    /// Number of log-spaced values [10].
    pub steps: Option<usize>,
}

/// `profile.grid = {from, to, steps}`.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LinearGridSpec {
    /// First β.
    pub from: Option<f64>,
    /// Last β.
    pub to: Option<f64>,
    /// Number of equally spaced values [100].
    pub steps: Option<usize>,
}

/// The `cv` object.
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CvSpec {
    /// `cv.folds`.
    pub folds: Option<usize>,
    /// `cv.repetitions`.
    pub repetitions: Option<usize>,
    /// `cv.seed`.
    pub seed: Option<u64>,
    /// `cv.search`.
    pub search: Option<String>,
    /// `cv.grid`.
    pub grid: Option<ListOr<f64, LogGridSpec>>,
    /// `cv.by`.
    pub by: Option<String>,
    /// `cv.start_variance`.
    pub start_variance: Option<f64>,
    /// `cv.max_steps`.
    pub max_steps: Option<usize>,
}

/// The `bootstrap` object.
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BootstrapSpec {
    /// `bootstrap.replicates`.
    pub replicates: Option<usize>,
    /// `bootstrap.by`.
    pub by: Option<String>,
    /// `bootstrap.seed`.
    pub seed: Option<u64>,
}

/// The `profile` object.
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ProfileSpec {
    /// `profile.covariates`.
    pub covariates: Option<Vec<i64>>,
    /// `profile.include_penalty`.
    pub include_penalty: Option<bool>,
    /// `profile.grid`.
    pub grid: Option<ListOr<f64, LinearGridSpec>>,
}

/// The `path` object.
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PathSpec {
    /// `path.n`.
    pub n: Option<usize>,
    /// `path.min_ratio`.
    pub min_ratio: Option<f64>,
    /// `path.lambdas`.
    pub lambdas: Option<Vec<f64>>,
    /// `path.strong_rule`.
    pub strong_rule: Option<bool>,
}

impl PathSpec {
    /// Validate into [`PathOptions`].
    pub fn check(self) -> Result<PathOptions> {
        let d = PathOptions::default();
        let grid = match (self.lambdas, self.n, self.min_ratio) {
            (Some(l), None, None) => PathGrid::Lambdas(l),
            (Some(_), _, _) => {
                return Err(Error::option(
                    "path.lambdas",
                    "give either `lambdas` or a grid (`n`, `min_ratio`), not both",
                ))
            }
            (None, n, min_ratio) => PathGrid::Log {
                n: n.unwrap_or(crate::model::path::DEFAULT_N),
                min_ratio,
            },
        };
        let o = PathOptions {
            grid,
            strong_rule: self.strong_rule.unwrap_or(d.strong_rule),
        };
        o.check()?;
        Ok(o)
    }
}

/// Fit options as written (see the module documentation and [`FIT_OPTIONS`]).
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FitSpec {
    /// `prior`.
    pub prior: Option<String>,
    /// `variance`.
    pub variance: Option<f64>,
    /// `lambda`.
    pub lambda: Option<f64>,
    /// `exclude`.
    pub exclude: Option<Vec<i64>>,
    /// `ties`.
    pub ties: Option<String>,
    /// `convergence`.
    pub convergence: Option<String>,
    /// `tolerance`.
    pub tolerance: Option<f64>,
    /// `max_iterations`.
    pub max_iterations: Option<usize>,
    /// `se`.
    pub se: Option<String>,
    /// `ci`.
    pub ci: Option<String>,
    /// `ci_level`.
    pub ci_level: Option<f64>,
    /// `device`.
    pub device: Option<String>,
    /// `precision`.
    pub precision: Option<String>,
    /// `threads`.
    pub threads: Option<usize>,
    /// `cv`.
    pub cv: Option<Toggle<CvSpec>>,
    /// `bootstrap`.
    pub bootstrap: Option<Toggle<BootstrapSpec>>,
    /// `profile` (an array is shorthand for `covariates`).
    pub profile: Option<ListOr<i64, ProfileSpec>>,
    /// `path` (an array is shorthand for `lambdas`).
    pub path: Option<ListOr<f64, PathSpec>>,
    /// `table` (checked by the SQL layer, which returns the table).
    pub table: Option<String>,
}

impl CvSpec {
    /// Validate into [`CvOptions`].
    pub fn check(self) -> Result<CvOptions> {
        let d = CvOptions::default();
        let grid = match self.grid {
            None | Some(ListOr::Flag(false)) => None,
            Some(ListOr::Flag(true)) => Some(log_grid(0.01, 20.0, 10)),
            Some(ListOr::List(g)) => Some(g),
            Some(ListOr::Object(g)) => {
                let lower = g.lower.unwrap_or(0.01);
                let upper = g.upper.unwrap_or(20.0);
                let steps = g.steps.unwrap_or(10);
                if !(lower > 0.0 && upper >= lower && upper.is_finite() && steps >= 1) {
                    return Err(Error::option(
                        "cv.grid",
                        "needs 0 < lower ≤ upper and steps ≥ 1",
                    ));
                }
                if steps > MAX_GRID_STEPS {
                    return Err(Error::option(
                        "cv.grid.steps",
                        format!("at most {MAX_GRID_STEPS} (got {steps})"),
                    ));
                }
                Some(log_grid(lower, upper, steps))
            }
        };
        if grid.as_ref().is_some_and(|g| g.len() > MAX_GRID_STEPS) {
            return Err(Error::option(
                "cv.grid",
                format!("at most {MAX_GRID_STEPS} variances"),
            ));
        }
        let keyword = self.search.as_deref().map(str::to_ascii_lowercase);
        let search = match (keyword.as_deref(), grid) {
            (None | Some("grid"), Some(g)) => CvSearch::Grid(g),
            (Some("grid"), None) => CvSearch::Grid(log_grid(0.01, 20.0, 10)),
            (None | Some("auto"), None) => CvSearch::Auto,
            (Some("auto"), Some(_)) => {
                return Err(Error::option(
                    "cv.grid",
                    "a grid is only used with `search: grid`",
                ))
            }
            (Some(s), _) => {
                return Err(Error::option(
                    "cv.search",
                    format!("unknown `{s}`; expected auto or grid"),
                ))
            }
        };
        let o = CvOptions {
            folds: self.folds.unwrap_or(d.folds),
            repetitions: self.repetitions.unwrap_or(d.repetitions),
            seed: self.seed.unwrap_or(d.seed),
            search,
            by: match &self.by {
                Some(b) => Resampling::parse("cv.by", b)?,
                None => d.by,
            },
            start_variance: self.start_variance,
            max_steps: self.max_steps.unwrap_or(d.max_steps),
        };
        o.check()?;
        if o.folds.saturating_mul(o.repetitions) > MAX_CV_FITS {
            return Err(Error::option(
                "cv.folds",
                format!("folds × repetitions at most {MAX_CV_FITS}"),
            ));
        }
        Ok(o)
    }
}

impl BootstrapSpec {
    /// Validate into [`BootstrapOptions`].
    pub fn check(self) -> Result<BootstrapOptions> {
        let d = BootstrapOptions::default();
        let o = BootstrapOptions {
            replicates: self.replicates.unwrap_or(d.replicates),
            by: match &self.by {
                Some(b) => Resampling::parse("bootstrap.by", b)?,
                None => d.by,
            },
            seed: self.seed.unwrap_or(d.seed),
        };
        o.check()?;
        if o.replicates > MAX_REPLICATES {
            return Err(Error::option(
                "bootstrap.replicates",
                format!("at most {MAX_REPLICATES} (got {})", o.replicates),
            ));
        }
        Ok(o)
    }
}

impl ProfileSpec {
    /// Validate into [`ProfileOptions`].
    pub fn check(self) -> Result<ProfileOptions> {
        let d = ProfileOptions::default();
        let grid = match self.grid {
            None | Some(ListOr::Flag(false)) => None,
            Some(ListOr::Flag(true)) => Some(default_profile_grid()),
            Some(ListOr::List(g)) => Some(g),
            Some(ListOr::Object(g)) => {
                let from = g
                    .from
                    .ok_or_else(|| Error::option("profile.grid.from", "is required"))?;
                let to =
                    g.to.ok_or_else(|| Error::option("profile.grid.to", "is required"))?;
                let steps = g.steps.unwrap_or(100);
                if !(to > from && to.is_finite() && from.is_finite() && steps >= 2) {
                    return Err(Error::option(
                        "profile.grid",
                        "needs from < to and steps ≥ 2",
                    ));
                }
                if steps > MAX_GRID_STEPS {
                    return Err(Error::option(
                        "profile.grid.steps",
                        format!("at most {MAX_GRID_STEPS} (got {steps})"),
                    ));
                }
                Some(
                    (0..steps)
                        .map(|i| from + (to - from) * i as f64 / (steps - 1) as f64)
                        .collect(),
                )
            }
        };
        if grid.as_ref().is_some_and(|g| g.len() > MAX_GRID_STEPS) {
            return Err(Error::option(
                "profile.grid",
                format!("at most {MAX_GRID_STEPS} values"),
            ));
        }
        Ok(ProfileOptions {
            covariates: self.covariates.unwrap_or(d.covariates),
            include_penalty: self.include_penalty.unwrap_or(d.include_penalty),
            grid,
            only_covariates: false,
        })
    }
}

impl FitSpec {
    /// Validate once into [`FitOptions`] for `model`: every value, the combinations and the
    /// resource caps ([`MAX_THREADS`], [`MAX_GRID_STEPS`], [`MAX_REPLICATES`]). `table` is not
    /// interpreted here.
    pub fn check(self, model: ModelKind) -> Result<FitOptions> {
        let mut o = FitOptions::new(model);
        o.cv = match self.cv {
            Some(t) => t.into_spec().map(CvSpec::check).transpose()?,
            None => None,
        };
        o.path = match self.path {
            None | Some(ListOr::Flag(false)) => None,
            Some(ListOr::Flag(true)) => Some(PathOptions::default()),
            Some(ListOr::List(l)) => Some(
                PathSpec {
                    lambdas: Some(l),
                    ..Default::default()
                }
                .check()?,
            ),
            Some(ListOr::Object(p)) => Some(p.check()?),
        };
        if o.path.is_some() {
            // The path chooses λ: a fixed one, or a variance, contradicts it.
            for (given, key) in [
                (self.lambda.is_some(), "lambda"),
                (self.variance.is_some(), "variance"),
            ] {
                if given {
                    return Err(Error::option(
                        key,
                        "conflicts with `path`, which fits a grid of λ values (give chosen \
                         values as `path.lambdas`)",
                    ));
                }
            }
            if o.cv.is_some() {
                return Err(Error::option(
                    "path",
                    "conflicts with `cv`: give one (cross-validation along a path is not \
                     supported yet)",
                ));
            }
            match self.prior.as_deref() {
                None => {}
                Some(f)
                    if ["laplace", "l1", "lasso"].contains(&f.to_ascii_lowercase().as_str()) => {}
                Some(f) => {
                    return Err(Error::option(
                        "prior",
                        format!(
                            "`path` is a path of the Laplace (L1) prior's λ; `{f}` has none \
                             (leave `prior` out, or give laplace)"
                        ),
                    ))
                }
            }
        }
        // A variance, λ, cross-validation or a path with no prior means a Laplace prior.
        let penalty_given =
            self.variance.is_some() || self.lambda.is_some() || o.cv.is_some() || o.path.is_some();
        let family = match self.prior.as_deref() {
            Some(f) => f.to_string(),
            None if penalty_given => "laplace".into(),
            None => "none".into(),
        };
        o.prior = if o.path.is_some() {
            // λ comes from the path; 1 is a placeholder.
            Prior::Laplace { lambda: 1.0 }
        } else if o.cv.is_some() && self.variance.is_none() && self.lambda.is_none() {
            // The variance is chosen by cross-validation; 1 is a placeholder.
            if family.eq_ignore_ascii_case("none") {
                return Err(Error::option(
                    "cv",
                    "cross-validation selects the prior variance: `prior` must be laplace or \
                     normal (or left out: laplace)",
                ));
            }
            Prior::from_parts(&family, Some(1.0), None)?
        } else {
            Prior::from_parts(&family, self.variance, self.lambda)?
        };
        o.bootstrap = match self.bootstrap {
            Some(t) => t.into_spec().map(BootstrapSpec::check).transpose()?,
            None => None,
        };
        o.profile = match self.profile {
            None | Some(ListOr::Flag(false)) => ProfileOptions::default(),
            Some(ListOr::Flag(true)) => {
                return Err(Error::option(
                    "profile",
                    "must be an array of covariate ids or an object",
                ))
            }
            Some(ListOr::List(ids)) => ProfileOptions {
                covariates: ids,
                ..Default::default()
            },
            Some(ListOr::Object(p)) => p.check()?,
        };
        if let Some(e) = self.exclude {
            o.exclude = e;
        }
        if let Some(t) = &self.ties {
            o.ties = Ties::parse(t)?;
        }
        if let Some(c) = &self.convergence {
            o.ccd.convergence = Convergence::parse(c)?;
        }
        if let Some(t) = self.tolerance {
            o.ccd.tolerance = t;
        }
        if let Some(n) = self.max_iterations {
            o.ccd.max_iterations = n;
        }
        if let Some(s) = &self.se {
            o.se = SeMethod::parse(s)?;
        }
        if let Some(c) = &self.ci {
            o.ci = CiMethod::parse(c)?;
        }
        if let Some(l) = self.ci_level {
            o.ci_level = l;
        }
        if let Some(d) = &self.device {
            o.device = Device::parse(d)?;
        }
        if let Some(p) = &self.precision {
            o.precision = Precision::parse(p)?;
        }
        if let Some(t) = self.threads {
            if t > MAX_THREADS {
                return Err(Error::option(
                    "threads",
                    format!("at most {MAX_THREADS} (got {t})"),
                ));
            }
            o.threads = Some(t);
        }
        o.check()?;
        Ok(o)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(pairs: FitSpec) -> Result<FitOptions> {
        pairs.check(ModelKind::Cox)
    }

    #[test]
    fn defaults_are_fit_options_new() {
        let o = spec(FitSpec::default()).unwrap();
        let d = FitOptions::new(ModelKind::Cox);
        assert_eq!(o.prior, d.prior);
        assert_eq!(o.ties, d.ties);
        assert_eq!(o.ci, d.ci);
        assert_eq!(o.ccd.tolerance, d.ccd.tolerance);
        assert_eq!(o.ccd.convergence, Convergence::Optimality);
        assert_eq!(d.ccd.convergence, Convergence::Optimality);
        assert_eq!(o.ccd.max_iterations, d.ccd.max_iterations);
        assert!(o.cv.is_none() && o.bootstrap.is_none());
        assert_eq!((o.se, o.ci), (SeMethod::Model, CiMethod::Profile));
        // Fine–Gray: robust standard errors and Wald intervals on them, as crr.
        let fg = FitSpec::default().check(ModelKind::FineGray).unwrap();
        assert_eq!((fg.se, fg.ci), (SeMethod::Robust, CiMethod::Wald));
        let fg = FitSpec {
            se: Some("model".into()),
            ..Default::default()
        }
        .check(ModelKind::FineGray)
        .unwrap();
        assert_eq!(fg.se, SeMethod::Model);
        let e = spec(FitSpec {
            se: Some("jackknife".into()),
            ..Default::default()
        })
        .unwrap_err()
        .to_string();
        assert!(e.contains("se"), "{e}");
    }

    #[test]
    fn a_variance_lambda_or_cv_without_prior_means_laplace() {
        let o = spec(FitSpec {
            variance: Some(0.02),
            ..Default::default()
        })
        .unwrap();
        assert_eq!(o.prior, Prior::Laplace { lambda: 10.0 });
        let o = spec(FitSpec {
            lambda: Some(3.0),
            ..Default::default()
        })
        .unwrap();
        assert_eq!(o.prior, Prior::Laplace { lambda: 3.0 });
        let o = spec(FitSpec {
            cv: Some(Toggle::On(true)),
            ..Default::default()
        })
        .unwrap();
        assert!(matches!(o.prior, Prior::Laplace { .. }) && o.cv.is_some());
        let e = spec(FitSpec {
            prior: Some("none".into()),
            variance: Some(1.0),
            ..Default::default()
        })
        .unwrap_err();
        assert!(e.to_string().contains("prior"), "{e}");
    }

    #[test]
    fn caps_are_errors_naming_the_key() {
        let e = spec(FitSpec {
            threads: Some(100_000),
            ..Default::default()
        })
        .unwrap_err()
        .to_string();
        assert!(e.contains("threads") && e.contains("1024"), "{e}");
        let e = spec(FitSpec {
            bootstrap: Some(Toggle::Spec(BootstrapSpec {
                replicates: Some(1_000_000_000),
                ..Default::default()
            })),
            ..Default::default()
        })
        .unwrap_err()
        .to_string();
        assert!(e.contains("bootstrap.replicates"), "{e}");
        let e = spec(FitSpec {
            profile: Some(ListOr::Object(ProfileSpec {
                covariates: Some(vec![1]),
                grid: Some(ListOr::Object(LinearGridSpec {
                    from: Some(-1.0),
                    to: Some(1.0),
                    steps: Some(100_000_000),
                })),
                ..Default::default()
            })),
            ..Default::default()
        })
        .unwrap_err()
        .to_string();
        assert!(e.contains("profile.grid.steps"), "{e}");
    }

    #[test]
    fn the_table_lists_every_field() {
        // Every top-level key of the table is a field of FitSpec (and the reverse) — checked
        // through Debug output of a default spec.
        let debug = format!("{:?}", FitSpec::default());
        let top: Vec<&str> = FIT_OPTIONS
            .iter()
            .map(|d| d.key)
            .filter(|k| !k.contains('.'))
            .collect();
        for k in &top {
            assert!(debug.contains(&format!("{k}: None")), "{k} not in FitSpec");
        }
        assert_eq!(debug.matches(": None").count(), top.len());
        let cv = format!("{:?}", CvSpec::default());
        let bs = format!("{:?}", BootstrapSpec::default());
        let pr = format!("{:?}", ProfileSpec::default());
        let pa = format!("{:?}", PathSpec::default());
        for d in FIT_OPTIONS {
            if let Some((group, key)) = d.key.split_once('.') {
                let s = match group {
                    "cv" => &cv,
                    "bootstrap" => &bs,
                    "profile" => &pr,
                    "path" => &pa,
                    other => panic!("unknown group {other}"),
                };
                assert!(s.contains(&format!("{key}: None")), "{}", d.key);
            }
        }
        for (s, group) in [
            (&cv, "cv"),
            (&bs, "bootstrap"),
            (&pr, "profile"),
            (&pa, "path"),
        ] {
            let n = FIT_OPTIONS
                .iter()
                .filter(|d| d.key.starts_with(&format!("{group}.")))
                .count();
            assert_eq!(s.matches(": None").count(), n, "{group}");
        }
    }

    #[test]
    fn path_options_and_their_conflicts() {
        let o = spec(FitSpec {
            path: Some(ListOr::Flag(true)),
            ..Default::default()
        })
        .unwrap();
        assert_eq!(o.path, Some(PathOptions::default()));
        assert!(matches!(o.prior, Prior::Laplace { .. }));
        let o = spec(FitSpec {
            path: Some(ListOr::List(vec![3.0, 1.0])),
            exclude: Some(vec![1]),
            ..Default::default()
        })
        .unwrap();
        assert_eq!(o.path.unwrap().grid, PathGrid::Lambdas(vec![3.0, 1.0]));
        let o = spec(FitSpec {
            path: Some(ListOr::Object(PathSpec {
                n: Some(50),
                min_ratio: Some(0.01),
                ..Default::default()
            })),
            prior: Some("laplace".into()),
            ..Default::default()
        })
        .unwrap();
        assert_eq!(
            o.path.unwrap().grid,
            PathGrid::Log {
                n: 50,
                min_ratio: Some(0.01)
            }
        );
        let path = || {
            Some(ListOr::Object(PathSpec {
                n: Some(10),
                ..Default::default()
            }))
        };
        for (s, key) in [
            (
                FitSpec {
                    path: path(),
                    lambda: Some(1.0),
                    ..Default::default()
                },
                "lambda",
            ),
            (
                FitSpec {
                    path: path(),
                    variance: Some(1.0),
                    ..Default::default()
                },
                "variance",
            ),
            (
                FitSpec {
                    path: path(),
                    cv: Some(Toggle::On(true)),
                    ..Default::default()
                },
                "cv",
            ),
            (
                FitSpec {
                    path: path(),
                    prior: Some("normal".into()),
                    ..Default::default()
                },
                "prior",
            ),
            (
                FitSpec {
                    path: path(),
                    bootstrap: Some(Toggle::On(true)),
                    ..Default::default()
                },
                "bootstrap",
            ),
            (
                FitSpec {
                    path: Some(ListOr::Object(PathSpec {
                        n: Some(10),
                        lambdas: Some(vec![1.0]),
                        ..Default::default()
                    })),
                    ..Default::default()
                },
                "path.lambdas",
            ),
            (
                FitSpec {
                    path: Some(ListOr::Object(PathSpec {
                        min_ratio: Some(2.0),
                        ..Default::default()
                    })),
                    ..Default::default()
                },
                "path.min_ratio",
            ),
            (
                FitSpec {
                    path: Some(ListOr::Object(PathSpec {
                        n: Some(1_000_000),
                        ..Default::default()
                    })),
                    ..Default::default()
                },
                "path.n",
            ),
        ] {
            let e = spec(s).unwrap_err().to_string();
            assert!(e.contains(key), "{key}: {e}");
        }
    }

    /// The rustdoc table (`crates/core/fit_options.md`, included above) is generated from
    /// [`FIT_OPTIONS`]; `EPIFUSION_WRITE_DOCS=1 cargo test` rewrites it.
    #[test]
    fn the_rustdoc_table_is_current() {
        let path = concat!(env!("CARGO_MANIFEST_DIR"), "/fit_options.md");
        let want = options_markdown();
        if std::env::var_os("EPIFUSION_WRITE_DOCS").is_some() {
            std::fs::write(path, &want).unwrap();
        }
        assert_eq!(
            include_str!("../fit_options.md"),
            want,
            "crates/core/fit_options.md drifted from FIT_OPTIONS: regenerate it with \
             `EPIFUSION_WRITE_DOCS=1 cargo test -p epifusion-core options`"
        );
    }
}
