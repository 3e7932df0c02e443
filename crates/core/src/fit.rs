//! The high-level fitting API: model + prior + options → fit on a design matrix → result.
//!
//! ```
//! use epifusion_core::fit::{fit, FitOptions};
//! use epifusion_core::model::design::{DesignBuilder, OutcomeRecord};
//! use epifusion_core::model::{ModelKind, Ties};
//!
//! // Therneau & Grambsch test 1: time 1,1,6,6,8,9; status 1,0,1,1,0,1; x 1,1,1,0,0,0.
//! let mut b = DesignBuilder::new();
//! let (t, s, x) = ([1., 1., 6., 6., 8., 9.], [1., 0., 1., 1., 0., 1.], [1., 1., 1., 0., 0., 0.]);
//! for i in 0..6 {
//!     b.push_outcome(OutcomeRecord { row_id: i as i64, time: Some(t[i]), y: s[i], ..Default::default() });
//!     b.push_covariate(i as i64, 1, x[i]);
//! }
//! let design = b.build()?;
//! let mut opts = FitOptions::new(ModelKind::Cox);
//! opts.ties = Ties::Breslow;
//! let result = fit(&design, &opts)?;
//! assert!((result.coefficients[0].estimate - 1.475285).abs() < 1e-5);
//! assert!((result.log_likelihood - -3.824750).abs() < 1e-5);
//! # Ok::<(), epifusion_core::Error>(())
//! ```
//!
//! [`fit_owned`] gives the same result but consumes the design matrix, so that the likelihood's
//! own copy of the columns replaces it instead of coexisting with it (peak memory, DESIGN.md
//! §10); the CLI uses it.
//!
//! | option | default | meaning |
//! |---|---|---|
//! | `model` | – | [`ModelKind`] |
//! | `ties` | Breslow | Cox / Fine–Gray ties |
//! | `prior` | none | [`Prior`]: none, Laplace(λ) or Normal(σ²) |
//! | `exclude` | [] | covariate ids never penalized (the intercept never is) |
//! | `ccd` | [`CcdOptions::fit_default`] | convergence `optimality` (Newton–Raphson on the unpenalized coefficients, KKT conditions on the penalized ones; [`crate::model::ccd`]), tolerance 1e-6, max_iterations 1000 |
//! | `se` | robust for Fine–Gray, model otherwise | [`SeMethod`]: the standard error reported as `std_error` and used by Wald intervals: observed information, or the robust sandwich of [`crate::model::robust`] (Fine & Gray's with `crr`'s censoring term; Lin–Wei for Cox; clusters from [`crate::model::design::Rows::cluster`]) |
//! | `ci` | profile (Wald for Fine–Gray) | [`CiMethod`]: profile / Wald intervals of the unpenalized coefficients, or bootstrap percentile intervals of all |
//! | `cv` | none | [`CvOptions`]: choose the prior variance by cross-validation ([`crate::model::cv`]) |
//! | `path` | none | [`PathOptions`]: fit a regularization path of the Laplace prior ([`crate::model::path`]); the result's coefficients are the fit at the path's smallest λ, [`FitResult::path`] holds every point |
//! | `bootstrap` | none | [`BootstrapOptions`] ([`crate::model::bootstrap`]); `ci = bootstrap` implies the defaults |
//! | `profile` | none | [`ProfileOptions`]: profile intervals of chosen (also penalized) coefficients and likelihood profiles on a grid |
//! | `ci_level` | 0.95 | in (0, 1) |
//! | `threads` | all cores | rayon threads for this fit; results do not depend on it |
//! | `device` | auto | [`Device`]: auto, cpu or cuda (see [`crate::backend`]: the CUDA path is not verified on a GPU yet) |
//! | `precision` | f64 | [`Precision`] of the design's values on the GPU: f64, or f32 with f64 accumulation |
//!
//! **Degenerate data** ([`crate::model::degenerate`] has the criteria and tolerances). Data
//! whose likelihood carries no information — every weight 0, no event (Cox, Fine–Gray,
//! conditional logistic), no case (SCCS) — is an [`Error::Empty`]. Among the unpenalized
//! coefficients (penalized ones with a proper prior are always identified):
//!
//! * a column that is 0 everywhere, constant within every stratum (conditional models), or a
//!   linear combination of earlier columns (an exact copy, a constant beside the intercept) is
//!   **held at 0**: its [`Coefficient`] has estimate 0 and no standard error or interval (R
//!   reports `NA`), a note names it and the columns it is aliased with, and the other
//!   coefficients keep the estimates, standard errors and intervals of the fit without it;
//! * a coefficient whose likelihood keeps increasing towards ±∞ (separation, monotone
//!   likelihood, an all-zero outcome) makes the status [`FitStatus::NoFiniteMle`]; a note names
//!   it and the direction; it has no standard error or interval, and the others' are
//!   conditional on it (held where the optimizer left it, also in profile refits and bootstrap
//!   replicates).
//!
//! Cross-validation skips folds whose training rows carry no information, the bootstrap skips
//! such resamples; both say so in the notes, as does a bootstrap with fewer than
//! [`bootstrap::MIN_REPLICATES`] replicates in its summaries.

use std::time::Instant;

use crate::backend::{Device, Precision, Resolved};
use crate::error::{Error, Result};
use crate::model::bootstrap::{self, BootstrapOptions, BootstrapResult};
use crate::model::ccd::{self, CcdOptions, Convergence, FitStatus};
use crate::model::cv::{self, CvOptions, CvResult, Problem};
use crate::model::degenerate::{self, ColumnFacts};
use crate::model::design::{ColumnLabel, DesignMatrix, INTERCEPT_ID};
use crate::model::inference::{self, ProfilePoint, ProfileTarget};
use crate::model::path::{self, PathOptions, PathResult};
use crate::model::prior::{Prior, PriorSet};
use crate::model::{Likelihood, LikelihoodOptions, ModelKind, Ties};

/// How confidence intervals are computed for unpenalized coefficients.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum CiMethod {
    /// Profile likelihood (default).
    #[default]
    Profile,
    /// Wald: estimate ± z·SE.
    Wald,
    /// No intervals (and no standard errors).
    None,
    /// Bootstrap percentile intervals for every coefficient (penalized or not); the standard
    /// errors stay the observed-information ones of the unpenalized coefficients.
    Bootstrap,
}

impl CiMethod {
    /// Parse `profile`, `wald` or `none`.
    pub fn parse(s: &str) -> Result<Self> {
        match s.to_ascii_lowercase().as_str() {
            "profile" => Ok(CiMethod::Profile),
            "wald" => Ok(CiMethod::Wald),
            "none" => Ok(CiMethod::None),
            "bootstrap" => Ok(CiMethod::Bootstrap),
            other => Err(Error::option(
                "ci",
                format!("unknown `{other}`; expected profile, wald, bootstrap or none"),
            )),
        }
    }
}

/// Which standard error a fit reports as [`Coefficient::std_error`] and uses for Wald
/// intervals. Both are over the unpenalized coefficients, the penalized ones held at their
/// estimates.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum SeMethod {
    /// From the observed information (−Hessian of the log-likelihood): the default except for
    /// Fine–Gray.
    #[default]
    Model,
    /// The robust sandwich V⁻¹(Σ_c u_c u_cᵀ)V⁻¹ of [`crate::model::robust`]: for Fine–Gray
    /// (its default) Fine & Gray's variance as `cmprsk::crr` computes it, censoring-weight term
    /// included; for Cox Lin & Wei's (`coxph(robust = TRUE)`, clusters as `cluster()`);
    /// HC0 for logistic and Poisson; by stratum for SCCS and conditional logistic regression.
    Robust,
}

impl SeMethod {
    /// Parse `model` or `robust`.
    pub fn parse(s: &str) -> Result<Self> {
        match s.to_ascii_lowercase().as_str() {
            "model" | "information" => Ok(SeMethod::Model),
            "robust" | "sandwich" => Ok(SeMethod::Robust),
            other => Err(Error::option(
                "se",
                format!("unknown `{other}`; expected model or robust"),
            )),
        }
    }

    /// Lower-case name.
    pub fn name(self) -> &'static str {
        match self {
            SeMethod::Model => "model",
            SeMethod::Robust => "robust",
        }
    }

    /// The default for `model`: robust for Fine–Gray (a weighted pseudo-likelihood, whose
    /// information-based variance is not valid), model-based otherwise.
    pub fn default_for(model: ModelKind) -> Self {
        if model == ModelKind::FineGray {
            SeMethod::Robust
        } else {
            SeMethod::Model
        }
    }
}

/// Profile intervals and likelihood profiles of chosen coefficients (Cyclops'
/// `getCyclopsProfileLogLikelihood` / `confint`).
#[derive(Debug, Clone, PartialEq)]
pub struct ProfileOptions {
    /// Covariate ids that get a profile interval even when penalized (unpenalized coefficients
    /// get one anyway when `ci = profile`).
    pub covariates: Vec<i64>,
    /// Whether the profiled objective keeps the coefficient's own penalty (default true, as
    /// Cyclops). Without it the profile is max over the others of LL + their log prior, and the
    /// interval is centred on that function's own maximum.
    pub include_penalty: bool,
    /// Values of β at which to report the profile of each of `covariates` (plus the estimate).
    pub grid: Option<Vec<f64>>,
    /// With `ci = profile`: only `covariates` get a profile interval (and the other
    /// unpenalized coefficients none), for callers that read a few intervals of a large model
    /// (the SCCS diagnostics read the probe's and the pre-exposure windows'). Their intervals
    /// are the ones a full profile run gives, bit for bit. Not a SQL option.
    pub only_covariates: bool,
}

impl Default for ProfileOptions {
    fn default() -> Self {
        ProfileOptions {
            covariates: Vec::new(),
            include_penalty: true,
            grid: None,
            only_covariates: false,
        }
    }
}

/// CohortMethod's and SelfControlledCaseSeries' default profile grid: 1000 values of log(ratio)
/// from log 0.1 to log 10.
pub fn default_profile_grid() -> Vec<f64> {
    let (a, b) = (0.1f64.ln(), 10f64.ln());
    (0..1000).map(|i| a + (b - a) * i as f64 / 999.0).collect()
}

/// A likelihood profile of one coefficient.
#[derive(Debug, Clone, PartialEq)]
pub struct Profile {
    /// Covariate id.
    pub covariate_id: i64,
    /// Points by increasing value (the estimate included, flagged).
    pub points: Vec<ProfilePoint>,
}

/// Options of a fit. Build with [`FitOptions::new`] and adjust the fields.
#[derive(Debug, Clone)]
pub struct FitOptions {
    /// The model.
    pub model: ModelKind,
    /// Ties (Cox, Fine–Gray).
    pub ties: Ties,
    /// Prior on the (non-excluded) coefficients.
    pub prior: Prior,
    /// Covariate ids excluded from the penalty.
    pub exclude: Vec<i64>,
    /// Optimizer options.
    pub ccd: CcdOptions,
    /// Standard error reported and used by Wald intervals.
    pub se: SeMethod,
    /// Interval method.
    pub ci: CiMethod,
    /// Interval level.
    pub ci_level: f64,
    /// Number of threads (None: rayon's default, all cores).
    pub threads: Option<usize>,
    /// Device to run on.
    pub device: Device,
    /// Storage precision of the design on the GPU (ignored on the CPU).
    pub precision: Precision,
    /// Cross-validation of the prior variance.
    pub cv: Option<CvOptions>,
    /// Bootstrap.
    pub bootstrap: Option<BootstrapOptions>,
    /// Profiles of chosen coefficients.
    pub profile: ProfileOptions,
    /// A regularization path of the Laplace prior (its λ is then the path's, not
    /// [`FitOptions::prior`]'s).
    pub path: Option<PathOptions>,
}

impl FitOptions {
    /// Defaults for `model`: no prior, Breslow ties, the optimality convergence rule
    /// ([`CcdOptions::fit_default`]), 95% intervals: profile-likelihood intervals and
    /// model-based standard errors, except for Fine–Gray: robust standard errors and Wald
    /// intervals on them (as `cmprsk::crr`; a profile of its weighted pseudo-likelihood is not
    /// a valid interval).
    pub fn new(model: ModelKind) -> Self {
        let se = SeMethod::default_for(model);
        FitOptions {
            model,
            ties: Ties::Breslow,
            prior: Prior::None,
            exclude: Vec::new(),
            ccd: CcdOptions::fit_default(),
            se,
            ci: if se == SeMethod::Robust {
                CiMethod::Wald
            } else {
                CiMethod::Profile
            },
            ci_level: 0.95,
            threads: None,
            device: Device::Auto,
            precision: Precision::F64,
            cv: None,
            bootstrap: None,
            profile: ProfileOptions::default(),
            path: None,
        }
    }

    /// Validate everything before any work starts.
    pub fn check(&self) -> Result<()> {
        self.ccd.check()?;
        if !(self.ci_level > 0.0 && self.ci_level < 1.0) {
            return Err(Error::option(
                "ci_level",
                format!("must be in (0, 1) (got {})", self.ci_level),
            ));
        }
        if self.threads == Some(0) {
            return Err(Error::option("threads", "must be ≥ 1"));
        }
        if let Some(cv) = &self.cv {
            cv.check()?;
            if self.prior == Prior::None {
                return Err(Error::option(
                    "cv",
                    "cross-validation selects the prior variance: give `prior` laplace or normal",
                ));
            }
        }
        if let Some(b) = &self.bootstrap {
            b.check()?;
        }
        if let Some(p) = &self.path {
            p.check()?;
            if !matches!(self.prior, Prior::Laplace { .. }) {
                return Err(Error::option(
                    "path",
                    format!(
                        "a regularization path is a path of the Laplace (L1) prior's λ; `prior` \
                         is {} (leave it out, or give laplace)",
                        self.prior.name()
                    ),
                ));
            }
            if self.cv.is_some() {
                return Err(Error::option(
                    "path",
                    "conflicts with `cv`: give one (cross-validation along a path is not \
                     supported yet)",
                ));
            }
            if self.bootstrap.is_some() || self.ci == CiMethod::Bootstrap {
                return Err(Error::option(
                    "path",
                    "conflicts with `bootstrap` (and `ci: bootstrap`): bootstrap one fit at a \
                     chosen `lambda` instead",
                ));
            }
        }
        if let Some(g) = &self.profile.grid {
            if self.profile.covariates.is_empty() {
                return Err(Error::option(
                    "profile.grid",
                    "needs `profile.covariates`: the coefficients to profile",
                ));
            }
            if g.is_empty() || g.iter().any(|v| !v.is_finite()) {
                return Err(Error::option(
                    "profile.grid",
                    "must be a non-empty list of finite numbers",
                ));
            }
        }
        Ok(())
    }
}

/// One coefficient of a fit.
#[derive(Debug, Clone, PartialEq)]
pub struct Coefficient {
    /// Covariate id ([`crate::model::design::INTERCEPT_ID`] for the intercept).
    pub covariate_id: i64,
    /// Name (column name in wide input, `(Intercept)`, else the id).
    pub name: String,
    /// Estimate β̂. 0 for an aliased or constant unpenalized column (held at 0 and named in
    /// [`FitResult::notes`]; R reports `NA`); under [`FitStatus::NoFiniteMle`] the flagged
    /// coefficients are where the optimizer stopped, not estimates.
    pub estimate: f64,
    /// Standard error (unpenalized coefficients only): the one of [`FitOptions::se`], which Wald
    /// intervals use.
    pub std_error: Option<f64>,
    /// Model-based standard error (observed information), when computed.
    pub std_error_model: Option<f64>,
    /// Robust (sandwich) standard error, when computed (`se = robust`).
    pub std_error_robust: Option<f64>,
    /// Lower confidence bound (unpenalized coefficients only; missing if unbounded).
    pub ci_lower: Option<f64>,
    /// Upper confidence bound.
    pub ci_upper: Option<f64>,
    /// Whether the prior applies to this coefficient.
    pub penalized: bool,
    /// An aliased or constant unpenalized column, held at 0 (R's `NA`): result tables show a
    /// NULL estimate.
    pub aliased: bool,
}

/// Result of [`fit`].
#[derive(Debug, Clone)]
pub struct FitResult {
    /// Model.
    pub model: ModelKind,
    /// One entry per column, in column order (intercept first when present).
    pub coefficients: Vec<Coefficient>,
    /// Log-likelihood (without data-independent constants; see each model's docs).
    pub log_likelihood: f64,
    /// Log prior (without normalizing constants).
    pub log_prior: f64,
    /// Solver iterations: Newton iterations of a classical fit; full CCD cycles (each followed
    /// by one Newton iteration on the unpenalized block, if any) of a penalized one (see
    /// [`crate::model::ccd`]). On the GPU: the device's cycles plus the host's iterations.
    pub iterations: usize,
    /// Status.
    pub status: FitStatus,
    /// Coordinate updates.
    pub coordinate_updates: u64,
    /// Wall time of the whole fit (including SEs and CIs), seconds.
    pub seconds: f64,
    /// Wall time of the optimization alone, seconds.
    pub fit_seconds: f64,
    /// Objective after each cycle.
    pub objective_trace: Vec<f64>,
    /// Rows and strata used.
    pub n_rows: usize,
    /// Number of strata.
    pub n_strata: usize,
    /// Interval method used.
    pub ci: CiMethod,
    /// Where the fit ran ("cpu").
    pub device: String,
    /// Why that device was chosen, when `auto` fell back to the CPU.
    pub device_note: Option<String>,
    /// Notes on the fit that a user must see: the `notes` column of the result table. The fit
    /// adds aliased and constant columns held at 0 (`aliased: …`, `no information: …`),
    /// coefficients with no finite estimate (`no finite MLE: …`), skipped cross-validation folds
    /// (`cv: …`), skipped or failed bootstrap replicates and too few of them (`bootstrap: …`)
    /// and the device fallback; the layers above add rows dropped for NULLs, skipped columns, …
    pub notes: Vec<String>,
    /// GPU statistics when the fit ran on a GPU (design bytes, estimated traffic per cycle).
    pub gpu: Option<crate::backend::GpuFitStats>,
    /// The prior used (with the variance chosen by cross-validation, when there was one).
    pub prior: Prior,
    /// Cross-validation result.
    pub cv: Option<CvResult>,
    /// Bootstrap result.
    pub bootstrap: Option<BootstrapResult>,
    /// Likelihood profiles (`profile.grid`).
    pub profiles: Vec<Profile>,
    /// The regularization path (`path`); the coefficients above are its last point's.
    pub path: Option<PathResult>,
}

impl FitResult {
    /// The coefficient with covariate id `id`.
    pub fn coefficient(&self, id: i64) -> Option<&Coefficient> {
        self.coefficients.iter().find(|c| c.covariate_id == id)
    }
    /// log-likelihood + log prior.
    pub fn objective(&self) -> f64 {
        self.log_likelihood + self.log_prior
    }
}

/// Fit `opts.model` to `design`. For logistic and Poisson regression an intercept column is
/// added (without copying the design). [`fit_owned`] does the same in less memory.
///
/// With `opts.cv` the prior variance is chosen by cross-validation first; with `opts.bootstrap`
/// (or `ci = bootstrap`) the fit is bootstrapped afterwards.
pub fn fit(design: &DesignMatrix, opts: &FitOptions) -> Result<FitResult> {
    with_threads(opts, || {
        let started = Instant::now();
        let device = opts.device.resolve(opts.model, design)?;
        degenerate::check_information(opts.model, design)?;
        let mut shape = Shape::of(design, opts.model, |id| unpenalized_id(opts, id));
        let (cols, intercept) = crate::model::columns_for(opts.model, design);
        if intercept {
            shape.prepend_intercept();
        }
        shape.check_exclude(opts)?;
        let mut problem = problem_of(design, opts);
        let (prior, cv) = select_prior(&problem, opts)?;
        let mut lik = crate::model::cpu_likelihood_from(
            opts.model,
            design,
            cols,
            LikelihoodOptions { ties: opts.ties },
        )?;
        let (mut r, held) = finish(
            lik.as_mut(),
            &shape,
            opts,
            prior,
            started,
            device,
            Some(design),
        )?;
        if let Some(c) = &cv {
            r.notes.extend(cv_notes(c));
        }
        r.cv = cv;
        drop(lik);
        // Replicates hold the aliased coefficients (and those with no finite estimate) where
        // the fit left them, as the fit did.
        problem.fixed = held;
        bootstrap_into(&mut r, &problem, opts)?;
        r.seconds = started.elapsed().as_secs_f64();
        Ok(r)
    })
}

/// [`fit`] consuming the design matrix: the likelihood drops each column as soon as it has its
/// own copy, and the row data once it is built, so peak memory stays near one copy of the
/// columns (DESIGN.md §10). Results are identical to [`fit`]. Cross-validation of Cox and
/// Fine–Gray runs its folds as row selections of the final fit's own model (no copy of the
/// design is kept: [`cv::cross_validate_on`]). The bootstrap, robust standard errors
/// (Fine–Gray's default) and the other models' cross-validation need the design beside the
/// likelihood, so with any of them this is [`fit`].
pub fn fit_owned(design: DesignMatrix, opts: &FitOptions) -> Result<FitResult> {
    let risk_set = matches!(opts.model, ModelKind::Cox | ModelKind::FineGray);
    let owned_cv = opts.cv.is_some() && risk_set && !wants_bootstrap(opts) && !wants_robust(opts);
    if !owned_cv && (opts.cv.is_some() || wants_bootstrap(opts) || wants_robust(opts)) {
        return fit(&design, opts);
    }
    opts.check()?;
    let device = opts.device.resolve(opts.model, &design)?;
    if device.gpu {
        // The GPU fit reads the design beside the CPU likelihood (used for intervals).
        return fit(&design, opts);
    }
    with_threads(opts, move || {
        let started = Instant::now();
        let mut design = design;
        if opts.model.has_intercept() && !design.has_intercept() {
            design = design.with_intercept();
        }
        // Checks the rows too (the likelihood's build then does not repeat it).
        degenerate::check_information(opts.model, &design)?;
        let shape = Shape::of(&design, opts.model, |id| unpenalized_id(opts, id));
        shape.check_exclude(opts)?;
        if let (true, Some(c)) = (owned_cv, &opts.cv) {
            return cross_validated_owned(design, opts, c, &shape, started, device);
        }
        let mut lik = crate::backend::cpu::likelihood_owned_checked(
            opts.model,
            design,
            LikelihoodOptions { ties: opts.ties },
        )?;
        finish(
            lik.as_mut(),
            &shape,
            opts,
            opts.prior,
            started,
            device,
            None,
        )
        .map(|(r, _)| r)
    })
}

/// [`fit_owned`] with cross-validation of a Cox or Fine–Gray model (no bootstrap, no robust
/// standard errors), after the checks: the model on every row is built once from the
/// consumed design and is one of the fold workers (the others are clones sharing its
/// columns); cross-validation hands it back with every row selected again and the final fit
/// runs on it. The design's columns are gone before the first fold (only its rows and column
/// ids are kept for the fold plan). The same steps and results as [`fit`].
fn cross_validated_owned(
    design: DesignMatrix,
    opts: &FitOptions,
    c: &CvOptions,
    shape: &Shape,
    started: Instant,
    device: Resolved,
) -> Result<FitResult> {
    let mut cv_opts = c.clone();
    if cv_opts.start_variance.is_none() {
        // The auto search's default start reads the columns: taken now.
        cv_opts.start_variance = Some(cv::default_variance(&design));
    }
    let rows_only = design.without_entries();
    let problem = problem_of(&rows_only, opts);
    let run_cv = |model| cv::cross_validate_on(&problem, opts.prior, &cv_opts, model);
    let ties = opts.ties;
    let (mut lik, cv): (Box<dyn Likelihood>, CvResult) = match opts.model {
        ModelKind::Cox => {
            let m = crate::model::cox::Cox::from_owned(design, ties)?;
            let (cv, m) = run_cv(m.into_model())?;
            (Box::new(crate::model::cox::Cox::from_model(m)), cv)
        }
        _ => {
            let m = crate::model::fine_gray::FineGray::from_owned(design, ties)?;
            let (cv, m) = run_cv(m.into_model())?;
            (
                Box::new(crate::model::fine_gray::FineGray::from_model(m)),
                cv,
            )
        }
    };
    let prior = opts.prior.with_variance(cv.variance);
    let (mut r, _) = finish(lik.as_mut(), shape, opts, prior, started, device, None)?;
    r.notes.extend(cv_notes(&cv));
    r.cv = Some(cv);
    r.seconds = started.elapsed().as_secs_f64();
    Ok(r)
}

fn wants_robust(opts: &FitOptions) -> bool {
    opts.se == SeMethod::Robust && opts.ci != CiMethod::None
}

fn wants_bootstrap(opts: &FitOptions) -> bool {
    opts.bootstrap.is_some() || opts.ci == CiMethod::Bootstrap
}

fn problem_of<'a>(design: &'a DesignMatrix, opts: &'a FitOptions) -> Problem<'a> {
    Problem {
        design,
        kind: opts.model,
        lik: LikelihoodOptions { ties: opts.ties },
        exclude: &opts.exclude,
        ccd: opts.ccd.clone(),
        fixed: Vec::new(),
    }
}

/// The prior to fit with: `opts.prior`, or its family at the cross-validated variance.
fn select_prior(problem: &Problem<'_>, opts: &FitOptions) -> Result<(Prior, Option<CvResult>)> {
    match &opts.cv {
        None => Ok((opts.prior, None)),
        Some(c) => {
            let r = cv::cross_validate(problem, opts.prior, c)?;
            Ok((opts.prior.with_variance(r.variance), Some(r)))
        }
    }
}

/// Bootstrap the fit `r` when asked; with `ci = bootstrap` its intervals become the
/// percentile intervals.
fn bootstrap_into(r: &mut FitResult, problem: &Problem<'_>, opts: &FitOptions) -> Result<()> {
    if !wants_bootstrap(opts) {
        return Ok(());
    }
    let bopts = opts.bootstrap.clone().unwrap_or_default();
    let beta: Vec<f64> = r.coefficients.iter().map(|c| c.estimate).collect();
    let b = bootstrap::bootstrap(problem, r.prior, &beta, opts.ci_level, &bopts)?;
    if opts.ci == CiMethod::Bootstrap {
        for (j, (c, s)) in r.coefficients.iter_mut().zip(&b.coefficients).enumerate() {
            if problem.fixed.get(j).copied().unwrap_or(false) {
                continue;
            }
            c.ci_lower = Some(s.lower);
            c.ci_upper = Some(s.upper);
        }
    }
    r.notes.extend(bootstrap_notes(&b, bopts.replicates));
    r.bootstrap = Some(b);
    Ok(())
}

/// Notes on folds that cross-validation skipped or scored 0.
fn cv_notes(c: &CvResult) -> Vec<String> {
    let total = c.folds * c.repetitions;
    let mut notes = Vec::new();
    if !c.skipped.is_empty() {
        notes.push(format!(
            "cv: {} of {total} folds skipped ({})",
            c.skipped.len(),
            c.skipped.join("; ")
        ));
    }
    if c.empty_test_folds > 0 {
        notes.push(format!(
            "cv: {} of {total} folds have no event in the held-out set (held-out log-likelihood 0)",
            c.empty_test_folds
        ));
    }
    notes
}

/// Notes on replicates that the bootstrap left out, and a warning for too few replicates.
fn bootstrap_notes(b: &BootstrapResult, requested: usize) -> Vec<String> {
    let mut notes = Vec::new();
    if b.skipped > 0 {
        notes.push(format!(
            "bootstrap: {} of {requested} replicates skipped (the resample carries no \
             information: {})",
            b.skipped,
            b.skip_reason.as_deref().unwrap_or("no events")
        ));
    }
    if b.failed > 0 {
        notes.push(format!(
            "bootstrap: {} of {requested} replicates failed (ill-conditioned fit) and were left out",
            b.failed
        ));
    }
    if b.replicates < bootstrap::MIN_REPLICATES {
        notes.push(format!(
            "bootstrap: only {} replicates in the summaries (fewer than {}): standard errors \
             and percentile intervals are unreliable; use more replicates",
            b.replicates,
            bootstrap::MIN_REPLICATES
        ));
    }
    notes
}

/// Run `f` on a pool of `opts.threads` threads (after checking the options).
fn with_threads<T: Send>(opts: &FitOptions, f: impl FnOnce() -> Result<T> + Send) -> Result<T> {
    opts.check()?;
    match opts.threads {
        Some(n) => {
            let pool = rayon::ThreadPoolBuilder::new()
                .num_threads(n)
                .build()
                .map_err(|e| Error::option("threads", e.to_string()))?;
            pool.install(f)
        }
        None => f(),
    }
}

/// Whether covariate `id` is unpenalized under `opts` (the intercept, `exclude`, no prior).
fn unpenalized_id(opts: &FitOptions, id: i64) -> bool {
    id == INTERCEPT_ID || opts.prior == Prior::None || opts.exclude.contains(&id)
}

/// What a fit result needs of the design once the likelihood is built.
struct Shape {
    labels: Vec<ColumnLabel>,
    /// Scales and structural findings of the unpenalized columns ([`degenerate::column_facts`]).
    facts: Vec<ColumnFacts>,
    n_rows: usize,
    n_strata: usize,
}

impl Shape {
    /// The shape of `x`, examining the columns whose id passes `unpenalized`.
    fn of(x: &DesignMatrix, kind: ModelKind, unpenalized: impl Fn(i64) -> bool) -> Self {
        Shape {
            labels: x.column_labels(),
            facts: degenerate::column_facts(kind, x, unpenalized),
            n_rows: x.n_rows(),
            n_strata: x.n_strata(),
        }
    }

    /// An intercept column in front (the likelihood has one that `x` lacks).
    fn prepend_intercept(&mut self) {
        self.labels.insert(
            0,
            ColumnLabel {
                id: INTERCEPT_ID,
                name: "(Intercept)".into(),
            },
        );
        self.facts.insert(0, ColumnFacts::intercept());
    }

    fn check_exclude(&self, opts: &FitOptions) -> Result<()> {
        for &id in &opts.exclude {
            if !self.labels.iter().any(|l| l.id == id) {
                return Err(Error::option(
                    "exclude",
                    format!("covariate id {id} is not a column of the design matrix"),
                ));
            }
        }
        Ok(())
    }
}

fn finish(
    lik: &mut dyn Likelihood,
    shape: &Shape,
    opts: &FitOptions,
    prior: Prior,
    started: Instant,
    device: Resolved,
    design: Option<&DesignMatrix>,
) -> Result<(FitResult, Vec<bool>)> {
    let gpu = device.gpu;
    let excluded: Vec<bool> = shape
        .labels
        .iter()
        .map(|c| c.id == INTERCEPT_ID || opts.exclude.contains(&c.id))
        .collect();
    if let Some(path_opts) = &opts.path {
        return finish_path(
            lik, shape, opts, path_opts, &excluded, started, device, design,
        );
    }
    let priors = PriorSet::new(prior, &excluded);
    let (mut r, held) = fit_shape(lik, shape, &priors, opts, started, design, gpu, None)?;
    r.device = device.name;
    r.notes.extend(device.note.iter().cloned());
    r.device_note = device.note;
    r.prior = prior;
    Ok((r, held))
}

/// A regularization path ([`crate::model::path`]) on the CPU likelihood, then the fit at its
/// smallest λ (warm-started at the path's last point: it only confirms the optimum and adds
/// standard errors and intervals of the unpenalized coefficients).
#[allow(clippy::too_many_arguments)]
fn finish_path(
    lik: &mut dyn Likelihood,
    shape: &Shape,
    opts: &FitOptions,
    path_opts: &PathOptions,
    excluded: &[bool],
    started: Instant,
    device: Resolved,
    design: Option<&DesignMatrix>,
) -> Result<(FitResult, Vec<bool>)> {
    let penalized: Vec<bool> = excluded.iter().map(|e| !e).collect();
    let intercept = shape.labels.iter().position(|l| l.id == INTERCEPT_ID);
    let n_cols = shape.labels.len() - usize::from(intercept.is_some());
    let path = path::fit_path(
        lik,
        &penalized,
        intercept,
        path_opts,
        shape.n_rows,
        n_cols,
        &opts.ccd,
    )?;
    let last = path
        .points
        .last()
        .ok_or_else(|| Error::FitFailed("internal: a path with no points".into()))?;
    let prior = Prior::Laplace {
        lambda: last.lambda,
    };
    let priors = PriorSet::new(prior, excluded);
    let start = last.beta.clone();
    let (mut r, held) = fit_shape(
        lik,
        shape,
        &priors,
        opts,
        started,
        design,
        false,
        Some(&start),
    )?;
    let not_converged = path
        .points
        .iter()
        .filter(|q| q.status != FitStatus::Converged)
        .count();
    if not_converged > 0 {
        r.notes.push(format!(
            "{not_converged} of the path's {} points did not meet the convergence rule \
             (see the `status` column of `table: path`)",
            path.points.len()
        ));
    }
    if device.gpu {
        r.notes
            .push("the regularization path runs on the CPU (no GPU path yet)".into());
    } else {
        r.notes.extend(device.note.iter().cloned());
        r.device_note = device.note;
    }
    r.prior = prior;
    r.path = Some(path);
    Ok((r, held))
}

/// Fit an already-built likelihood on `x` (used by CV, profiles and the SQL layer).
pub fn fit_likelihood(
    lik: &mut dyn Likelihood,
    x: &DesignMatrix,
    priors: &PriorSet,
    opts: &FitOptions,
    started: Instant,
) -> Result<FitResult> {
    degenerate::check_information(opts.model, x)?;
    let labels = x.column_labels();
    let extra = usize::from(lik.n_coef() > labels.len());
    let mut shape = Shape::of(x, opts.model, |id| {
        labels
            .iter()
            .position(|l| l.id == id)
            .is_some_and(|j| priors.is_unpenalized(j + extra))
    });
    if lik.n_coef() == labels.len() + 1 && !x.has_intercept() {
        shape.prepend_intercept();
    }
    fit_shape(lik, &shape, priors, opts, started, Some(x), false, None).map(|(r, _)| r)
}

/// The fit (from `start`, or from 0) with its standard errors, intervals and profiles.
#[allow(clippy::too_many_arguments)]
fn fit_shape(
    lik: &mut dyn Likelihood,
    x: &Shape,
    priors: &PriorSet,
    opts: &FitOptions,
    started: Instant,
    design: Option<&DesignMatrix>,
    gpu: bool,
    start: Option<&[f64]>,
) -> Result<(FitResult, Vec<bool>)> {
    let p = x.labels.len();
    let mut beta0 = match start {
        Some(b) => b.to_vec(),
        None => vec![0.0; p],
    };
    let mut gpu_stats = None;
    let mut notes = Vec::new();
    // Aliased and constant unpenalized columns are held at 0 ([`degenerate`]).
    let unpenalized_all: Vec<usize> = (0..p).filter(|&j| priors.is_unpenalized(j)).collect();
    let aliases = degenerate::find_aliased(lik, &unpenalized_all, &x.facts);
    let mut fixed = vec![false; p];
    for a in &aliases {
        fixed[a.j] = true;
        beta0[a.j] = 0.0;
        notes.push(degenerate::alias_note(a, &x.labels, opts.model));
    }
    let any_fixed = !aliases.is_empty();
    let aliased = fixed.clone();
    if gpu && any_fixed {
        notes.push(
            "the optimization ran on the CPU: the device path cannot hold aliased columns at 0"
                .into(),
        );
    }
    let mut r = match design.filter(|_| gpu && !any_fixed) {
        // The optimization on the GPU; intervals and profiles use the CPU likelihood at its β.
        Some(design) => {
            // The device runs coordinate descent alone. Under the optimality rule it stops at
            // the classic objective rule and the host finishes ([`gpu_then_host`]).
            let optimality = opts.ccd.convergence == Convergence::Optimality;
            let device_opts = if optimality {
                CcdOptions {
                    convergence: Convergence::Objective,
                    ..opts.ccd.clone()
                }
            } else {
                opts.ccd.clone()
            };
            let (r, stats) = crate::backend::gpu_fit(
                opts.model,
                opts.ties,
                design,
                priors,
                &device_opts,
                opts.precision,
            )?;
            gpu_stats = Some(stats);
            if optimality && r.status != FitStatus::IllConditioned {
                gpu_then_host(lik, priors, r, &opts.ccd)?
            } else {
                lik.set_beta(if r.status == FitStatus::IllConditioned {
                    &beta0
                } else {
                    &r.beta
                });
                r
            }
        }
        None => ccd::fit(
            lik,
            priors,
            &beta0,
            any_fixed.then_some(&fixed[..]),
            &opts.ccd,
        )?,
    };
    let fit_seconds = r.seconds;
    // Coefficients with no finite estimate ([`degenerate::diverging`]).
    if matches!(r.status, FitStatus::Converged | FitStatus::MaxIterations) {
        let free: Vec<usize> = unpenalized_all
            .iter()
            .copied()
            .filter(|&j| !fixed[j])
            .collect();
        let scale: Vec<f64> = x.facts.iter().map(|f| f.scale).collect();
        let diverged = degenerate::diverging(lik, priors, &r.beta, &free, &scale);
        if !diverged.is_empty() {
            r.status = FitStatus::NoFiniteMle;
            r.log_likelihood = degenerate::pull_back(lik, priors, &mut r.beta, &diverged);
            notes.push(degenerate::diverging_note(&diverged, &r.beta, &x.labels));
            for j in diverged {
                fixed[j] = true;
            }
        }
    }
    // Standard errors and intervals: the free unpenalized coefficients with a finite estimate.
    let unpenalized: Vec<usize> = unpenalized_all
        .iter()
        .copied()
        .filter(|&j| !fixed[j])
        .collect();
    let mut se_model = vec![None; p];
    let mut se_robust = vec![None; p];
    let mut lower = vec![None; p];
    let mut upper = vec![None; p];
    let mut profiles = Vec::new();
    let ok = r.status != FitStatus::IllConditioned;
    if ok && opts.ci != CiMethod::None && !unpenalized.is_empty() {
        lik.set_beta(&r.beta);
        let k = unpenalized.len();
        let info = lik.information(&unpenalized);
        if let Some(inv) = inference::invert_spd(&info, k) {
            for (a, &j) in unpenalized.iter().enumerate() {
                se_model[j] = Some(inv[a * k + a].sqrt());
            }
        }
        if opts.se == SeMethod::Robust {
            let design = design.ok_or_else(|| {
                Error::FitFailed("internal: robust standard errors need the design".into())
            })?;
            // The fit's columns are the design's, or an intercept and the design's.
            let prepended = p == design.n_cols() + 1;
            if let Some(v) = crate::model::robust::covariance(
                opts.model,
                opts.ties,
                design,
                prepended,
                &r.beta,
                &unpenalized,
                &info,
                true,
            ) {
                for (a, &j) in unpenalized.iter().enumerate() {
                    let var = v[a * k + a];
                    se_robust[j] = (var.is_finite() && var >= 0.0).then(|| var.sqrt());
                }
            }
        }
    }
    let se = match opts.se {
        SeMethod::Model => se_model.clone(),
        SeMethod::Robust => se_robust.clone(),
    };
    if ok && opts.ci == CiMethod::Wald {
        let z = inference::normal_quantile(1.0 - (1.0 - opts.ci_level) / 2.0);
        for &j in &unpenalized {
            if let Some(s) = se[j] {
                lower[j] = Some(r.beta[j] - z * s);
                upper[j] = Some(r.beta[j] + z * s);
            }
        }
    }
    // Profile intervals: the unpenalized coefficients (ci = profile) and the chosen ones.
    let mut chosen = Vec::new();
    for &id in &opts.profile.covariates {
        let j = x.labels.iter().position(|l| l.id == id).ok_or_else(|| {
            Error::option(
                "profile.covariates",
                format!("covariate id {id} is not a column of the design matrix"),
            )
        })?;
        if !chosen.contains(&j) && !fixed[j] {
            chosen.push(j);
        }
    }
    if ok {
        let mut js: Vec<usize> = if opts.ci == CiMethod::Profile && !opts.profile.only_covariates {
            unpenalized.clone()
        } else {
            Vec::new()
        };
        for &j in &chosen {
            if !js.contains(&j) {
                js.push(j);
            }
        }
        let objective = r.log_likelihood + r.log_prior;
        let mut targets = Vec::with_capacity(js.len());
        for &j in &js {
            targets.push(profile_target(
                lik,
                priors,
                &r.beta,
                objective,
                j,
                se_model[j],
                &fixed,
                opts,
            )?);
        }
        if !targets.is_empty() {
            let intervals =
                inference::profile_intervals(&*lik, &targets, opts.ci_level, &opts.ccd)?;
            for (t, pi) in targets.iter().zip(intervals) {
                lower[t.j] = pi.lower;
                upper[t.j] = pi.upper;
            }
        }
        if let Some(grid) = &opts.profile.grid {
            for &j in &chosen {
                let t = targets
                    .iter()
                    .find(|t| t.j == j)
                    .expect("chosen are targets");
                profiles.push(Profile {
                    covariate_id: x.labels[j].id,
                    points: inference::profile_grid(&*lik, t, grid, &opts.ccd)?,
                });
            }
        }
        lik.set_beta(&r.beta);
    }
    let coefficients = x
        .labels
        .iter()
        .enumerate()
        .map(|(j, c)| Coefficient {
            covariate_id: c.id,
            name: c.name.clone(),
            estimate: r.beta[j],
            std_error: se[j],
            std_error_model: se_model[j],
            std_error_robust: se_robust[j],
            ci_lower: lower[j],
            ci_upper: upper[j],
            penalized: !priors.is_unpenalized(j),
            aliased: aliased[j],
        })
        .collect();
    let result = FitResult {
        model: opts.model,
        coefficients,
        log_likelihood: r.log_likelihood,
        log_prior: r.log_prior,
        iterations: r.iterations,
        status: r.status,
        coordinate_updates: r.coordinate_updates,
        seconds: started.elapsed().as_secs_f64(),
        fit_seconds,
        objective_trace: r.objective_trace,
        n_rows: x.n_rows,
        n_strata: x.n_strata,
        ci: opts.ci,
        device: "cpu".into(),
        device_note: None,
        notes,
        gpu: gpu_stats,
        prior: Prior::None,
        cv: None,
        bootstrap: None,
        profiles,
        path: None,
    };
    Ok((result, fixed))
}

/// Finish a GPU fit on the host: [`ccd::fit`] under the optimality rule (the Newton block on the
/// unpenalized coefficients, the KKT check on the others), warm-started from the device's β.
/// Iterations, updates, seconds and the objective trace are those of both runs together.
fn gpu_then_host(
    lik: &mut dyn Likelihood,
    priors: &PriorSet,
    device: ccd::CcdResult,
    opts: &CcdOptions,
) -> Result<ccd::CcdResult> {
    let mut host = ccd::fit(lik, priors, &device.beta, None, opts)?;
    if host.status == FitStatus::IllConditioned {
        lik.set_beta(&device.beta);
        return Ok(device);
    }
    let mut trace = device.objective_trace;
    trace.append(&mut host.objective_trace);
    host.objective_trace = trace;
    host.iterations += device.iterations;
    host.coordinate_updates += device.coordinate_updates;
    host.seconds += device.seconds;
    Ok(host)
}

/// What [`inference::profile_intervals`] needs for coefficient `j`: with its penalty kept, the
/// fit's own optimum; without it (`profile.include_penalty = false`, penalized j), a refit
/// with j unpenalized gives the optimum of the profiled function. Coefficients with `fixed`
/// (aliased ones, those with no finite estimate) stay where they are in every refit.
#[allow(clippy::too_many_arguments)]
fn profile_target(
    lik: &mut dyn Likelihood,
    priors: &PriorSet,
    beta: &[f64],
    objective: f64,
    j: usize,
    se: Option<f64>,
    fixed: &[bool],
    opts: &FitOptions,
) -> Result<ProfileTarget> {
    let fixed = if fixed.iter().any(|&f| f) {
        fixed.to_vec()
    } else {
        Vec::new()
    };
    if priors.is_unpenalized(j) || opts.profile.include_penalty {
        return Ok(ProfileTarget {
            j,
            scale: se.unwrap_or(f64::NAN),
            priors: priors.clone(),
            beta: beta.to_vec(),
            objective,
            fixed,
        });
    }
    let mut own = priors.clone();
    own.per_coef[j] = Prior::None;
    let mut tight = opts.ccd.clone();
    tight.tolerance = (opts.ccd.tolerance * 1e-3).max(1e-13);
    let mask = (!fixed.is_empty()).then_some(&fixed[..]);
    let r = ccd::fit(lik, &own, beta, mask, &tight)?;
    if r.status == FitStatus::IllConditioned {
        return Err(Error::FitFailed(format!(
            "profile of coefficient {j}: the refit without its penalty is ill-conditioned"
        )));
    }
    Ok(ProfileTarget {
        j,
        scale: f64::NAN,
        priors: own,
        objective: r.log_likelihood + r.log_prior,
        beta: r.beta,
        fixed,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::path::PathGrid;

    fn path_opts(model: ModelKind, exclude: Vec<i64>) -> FitOptions {
        let mut o = FitOptions::new(model);
        o.prior = Prior::Laplace { lambda: 1.0 };
        o.exclude = exclude;
        o.ci = CiMethod::Wald;
        o.path = Some(PathOptions {
            grid: PathGrid::Log {
                n: 12,
                min_ratio: Some(0.05),
            },
            strong_rule: true,
        });
        o
    }

    /// `fit_owned` with cross-validation of Cox (both tie methods) and Fine–Gray (model-based
    /// SEs: robust ones need the design) runs its folds on the final fit's own model, with
    /// the design's columns dropped: the same bits as `fit` (coefficients, intervals, the CV
    /// curve and choice, notes) on 1 and 2 threads; Fine–Gray's default (robust SEs) goes
    /// through `fit` and agrees too.
    #[test]
    fn owned_cross_validation_is_fit() {
        let cox = crate::bench::cox_data(400, 12, 0.2, 7).unwrap();
        let fg = crate::bench::fine_gray_data(400, 12, 0.2, 8).unwrap();
        let cases = [
            (ModelKind::Cox, Ties::Breslow, SeMethod::Model, &cox),
            (ModelKind::Cox, Ties::Efron, SeMethod::Model, &cox),
            (ModelKind::FineGray, Ties::Breslow, SeMethod::Model, &fg),
            (ModelKind::FineGray, Ties::Breslow, SeMethod::Robust, &fg),
        ];
        for (model, ties, se, data) in cases {
            for threads in [1, 2] {
                let mut o = FitOptions::new(model);
                o.prior = Prior::Laplace { lambda: 1.0 };
                o.ties = ties;
                o.se = se;
                o.ci = CiMethod::Wald;
                // An unpenalized covariate: its standard error and interval are compared too.
                o.exclude = vec![2];
                o.threads = Some(threads);
                o.cv = Some(CvOptions {
                    folds: 4,
                    ..Default::default()
                });
                let what = format!("{model:?} {ties:?} {se:?} threads {threads}");
                let a = fit(&data.design, &o).unwrap();
                let b = fit_owned(data.design.clone(), &o).unwrap();
                assert_eq!(a.coefficients, b.coefficients, "{what}");
                assert!(b.coefficient(2).unwrap().std_error.is_some(), "{what}");
                assert_eq!(
                    a.log_likelihood.to_bits(),
                    b.log_likelihood.to_bits(),
                    "{what}"
                );
                assert_eq!((a.status, a.iterations), (b.status, b.iterations), "{what}");
                assert_eq!(a.prior, b.prior, "{what}");
                assert_eq!(a.notes, b.notes, "{what}");
                let (ca, cb) = (a.cv.unwrap(), b.cv.unwrap());
                assert_eq!(ca.curve, cb.curve, "{what}");
                assert_eq!(ca.variance.to_bits(), cb.variance.to_bits(), "{what}");
                assert_eq!(
                    (ca.fits, ca.stop_reason),
                    (cb.fits, cb.stop_reason),
                    "{what}"
                );
                assert!(ca.curve.len() >= 2, "{what}: {:?}", ca.curve);
            }
        }
        // A problem the owned path refuses as `fit` does: CV needs a prior.
        let mut o = FitOptions::new(ModelKind::Cox);
        o.prior = Prior::None;
        o.cv = Some(CvOptions::default());
        let a = fit(&cox.design, &o).unwrap_err().to_string();
        let b = fit_owned(cox.design.clone(), &o).unwrap_err().to_string();
        assert_eq!(a, b);
    }

    /// The fit API's path: the coefficients are the last point's, its prior is the smallest
    /// λ, λ_max leaves only the unpenalized coefficients non-zero (the intercept not counted),
    /// and `fit_owned` gives the same path.
    #[test]
    fn path_through_the_fit_api() {
        for (model, exclude, counted) in [
            (ModelKind::Cox, vec![3], 1),
            (ModelKind::Logistic, vec![], 0),
        ] {
            let data = crate::bench::cox_data(600, 20, 0.2, 5).unwrap();
            let o = path_opts(model, exclude.clone());
            let r = fit(&data.design, &o).unwrap();
            let path = r.path.as_ref().expect("a path");
            assert_eq!(path.points.len(), 12);
            assert_eq!(path.points[0].lambda, path.lambda_max);
            assert_eq!(path.points[0].non_zero, counted, "{model:?}");
            let last = path.points.last().unwrap();
            assert_eq!(
                r.prior,
                Prior::Laplace {
                    lambda: last.lambda
                }
            );
            assert_eq!(r.status, FitStatus::Converged);
            for (c, b) in r.coefficients.iter().zip(&last.beta) {
                assert!(
                    (c.estimate - b).abs() < 1e-6,
                    "{model:?} {}",
                    c.covariate_id
                );
            }
            for &id in &exclude {
                assert!(r.coefficient(id).unwrap().std_error.is_some());
            }
            let owned = fit_owned(data.design.clone(), &o).unwrap();
            assert_eq!(owned.path.as_ref().unwrap().points, path.points);
            // A fixed λ with a path is refused by the options model, and a Normal prior here.
            let mut bad = o.clone();
            bad.prior = Prior::Normal { variance: 1.0 };
            let e = fit(&data.design, &bad).unwrap_err().to_string();
            assert!(e.contains("path") && e.contains("Laplace"), "{e}");
        }
    }
}
