//! `epifusion fit`: a model on long-format or wide CSV / Parquet tables.

use super::*;

#[derive(Args, Debug)]
pub(crate) struct FitArgs {
    /// cox, fine_gray, sccs, logistic, poisson or conditional_logistic.
    #[arg(long, value_parser = parse_model)]
    pub(crate) model: ModelKind,
    /// Outcome table (.csv or .parquet): row_id, [stratum_id], time, y, [weight, start_time,
    /// offset, censor_weight]; without --covariates, a wide table (outcome + covariate columns).
    #[arg(long)]
    pub(crate) outcomes: PathBuf,
    /// Covariate table (.csv or .parquet): row_id, covariate_id, [covariate_value].
    #[arg(long)]
    pub(crate) covariates: Option<PathBuf>,
    /// Fit options as the SQL functions' JSON document (`'{"prior": "laplace", "cv": true}'`);
    /// the flags below set keys on top of it. Keys and defaults: see the table below.
    #[arg(long)]
    pub(crate) options: Option<String>,
    /// Prior: none, laplace or normal [none; laplace when --lambda, --variance or --cv is given].
    #[arg(long)]
    pub(crate) prior: Option<String>,
    /// Prior variance (Laplace λ = √(2/v); Normal σ² = v).
    #[arg(long, conflicts_with = "lambda")]
    pub(crate) variance: Option<f64>,
    /// Penalty λ (Laplace: objective LL − λΣ|β|, not scaled by n; Normal: σ² = 1/λ).
    #[arg(long)]
    pub(crate) lambda: Option<f64>,
    /// Covariates never penalized: ids (or column names in wide form), comma-separated.
    #[arg(long, value_delimiter = ',')]
    pub(crate) exclude: Vec<String>,
    /// Ties for cox / fine_gray: breslow or efron [breslow].
    #[arg(long)]
    pub(crate) ties: Option<String>,
    /// Stopping rule: optimality (Newton–Raphson on the unpenalized coefficients until the
    /// Newton decrement ≤ tolerance, KKT conditions of the penalized ones at the returned β),
    /// objective (relative change of the objective after a CCD cycle; Cyclops' `lange` type)
    /// or gradient (largest KKT violation in a CCD cycle) [optimality].
    #[arg(long)]
    pub(crate) convergence: Option<String>,
    /// Convergence tolerance of the stopping rule [1e-6].
    #[arg(long)]
    pub(crate) tolerance: Option<f64>,
    /// Maximum number of solver iterations (Newton iterations / CCD cycles) [1000].
    #[arg(long)]
    pub(crate) max_iterations: Option<usize>,
    /// Confidence intervals: profile, wald, bootstrap or none [profile].
    #[arg(long)]
    pub(crate) ci: Option<String>,
    /// Confidence level [0.95].
    #[arg(long)]
    pub(crate) ci_level: Option<f64>,
    /// Threads, 1–1024 [all cores].
    #[arg(long)]
    pub(crate) threads: Option<usize>,
    /// auto, cpu or cuda (auto uses the CPU until the CUDA kernels are verified on a GPU) [auto].
    #[arg(long)]
    pub(crate) device: Option<String>,
    /// Storage precision of the design on the GPU: f64, or f32 with f64 accumulation [f64].
    #[arg(long)]
    pub(crate) precision: Option<String>,
    /// Write the result table (.csv, .json or .parquet).
    #[arg(long)]
    pub(crate) output: Option<PathBuf>,
    /// Name of the time column [time].
    #[arg(long)]
    pub(crate) time: Option<String>,
    /// Name of the outcome column [y].
    #[arg(long)]
    pub(crate) y: Option<String>,
    /// Recode the outcome: y = 1 where the outcome column equals this value, else 0
    /// (e.g. `--y status --event-value 2` for R's lung data).
    #[arg(long)]
    pub(crate) event_value: Option<f64>,
    /// Wide form: covariate columns to use, comma-separated [every other numeric column].
    #[arg(long, value_delimiter = ',')]
    pub(crate) covariates_columns: Vec<String>,
    /// Drop covariate entries whose row id has no outcome row (reported) instead of failing.
    #[arg(long)]
    pub(crate) drop_unknown_rows: bool,
    /// Choose the prior variance by cross-validation (prior laplace unless --prior normal).
    #[arg(long)]
    pub(crate) cv: bool,
    /// Cross-validation folds [10] (`cv.folds`).
    #[arg(long)]
    pub(crate) folds: Option<usize>,
    /// Cross-validation repetitions [1] (`cv.repetitions`).
    #[arg(long)]
    pub(crate) cv_repetitions: Option<usize>,
    /// Grid search over these variances (comma-separated) instead of the auto search.
    #[arg(long, value_delimiter = ',')]
    pub(crate) cv_grid: Vec<f64>,
    /// Folds and bootstrap samples by: auto (strata for sccs / conditional_logistic, rows
    /// otherwise), row or stratum [auto] (`cv.by`, `bootstrap.by`).
    #[arg(long)]
    pub(crate) resample_by: Option<String>,
    /// Seed of the cross-validation folds and the bootstrap [1] (`cv.seed`, `bootstrap.seed`).
    #[arg(long)]
    pub(crate) seed: Option<u64>,
    /// Bootstrap with this many replicates (percentile intervals with --ci bootstrap).
    #[arg(long)]
    pub(crate) bootstrap: Option<usize>,
    /// Profile intervals for these covariate ids (also penalized ones), comma-separated.
    #[arg(long, value_delimiter = ',')]
    pub(crate) profile: Vec<i64>,
    /// Likelihood profiles of the --profile covariates on CohortMethod's grid (1000 values of
    /// log 0.1 … log 10), written to --profile-output.
    #[arg(long)]
    pub(crate) profile_grid: bool,
    /// Profile penalized coefficients without their own penalty.
    #[arg(long)]
    pub(crate) profile_without_penalty: bool,
    /// Write the cross-validation curve (.csv, .json or .parquet).
    #[arg(long)]
    pub(crate) cv_output: Option<PathBuf>,
    /// Write the likelihood profiles.
    #[arg(long)]
    pub(crate) profile_output: Option<PathBuf>,
    /// Write the bootstrap summary per coefficient.
    #[arg(long)]
    pub(crate) bootstrap_output: Option<PathBuf>,
    /// Fit a regularization path of the Laplace prior with this many λ values, log-spaced from
    /// λ_max down (`path.n`; glmnet's default is 100); the printed coefficients are the fit at
    /// the smallest λ, --path-output writes every point.
    #[arg(long, conflicts_with_all = ["lambda", "variance", "cv"])]
    pub(crate) path: Option<usize>,
    /// Smallest λ / λ_max of the path [1e-4 if rows > covariates, else 0.01]
    /// (`path.min_ratio`).
    #[arg(long)]
    pub(crate) path_min_ratio: Option<f64>,
    /// Fit the path at these λ values (comma-separated; our λ, not divided by n) instead of
    /// a grid (`path.lambdas`).
    #[arg(long, value_delimiter = ',', conflicts_with_all = ["lambda", "variance", "cv", "path"])]
    pub(crate) path_lambdas: Vec<f64>,
    /// Write the regularization path: one row per λ and coefficient (.csv, .json or .parquet).
    #[arg(long)]
    pub(crate) path_output: Option<PathBuf>,
}

/// The options model ([`epifusion::options::FitSpec`]) from `--options` and the flags, the
/// flags setting keys on top of the JSON document.
pub(crate) fn fit_spec(a: &FitArgs) -> Result<FitSpec> {
    use epifusion::options::{BootstrapSpec, CvSpec, ListOr, PathSpec, ProfileSpec, Toggle};
    let mut spec = match &a.options {
        Some(json) => epifusion::engine::options::parse_fit_spec(json)?,
        None => FitSpec::default(),
    };
    let set = |slot: &mut Option<String>, v: &Option<String>| {
        if v.is_some() {
            *slot = v.clone();
        }
    };
    set(&mut spec.prior, &a.prior);
    set(&mut spec.ties, &a.ties);
    set(&mut spec.convergence, &a.convergence);
    set(&mut spec.ci, &a.ci);
    set(&mut spec.device, &a.device);
    set(&mut spec.precision, &a.precision);
    if a.variance.is_some() || a.lambda.is_some() {
        spec.variance = a.variance;
        spec.lambda = a.lambda;
    }
    spec.tolerance = a.tolerance.or(spec.tolerance);
    spec.max_iterations = a.max_iterations.or(spec.max_iterations);
    spec.ci_level = a.ci_level.or(spec.ci_level);
    spec.threads = a.threads.or(spec.threads);
    let cv_flags = a.folds.is_some() || a.cv_repetitions.is_some() || !a.cv_grid.is_empty();
    if a.cv {
        let mut cv = match spec.cv.take() {
            Some(t) => t.into_spec().unwrap_or_default(),
            None => CvSpec::default(),
        };
        cv.folds = a.folds.or(cv.folds);
        cv.repetitions = a.cv_repetitions.or(cv.repetitions);
        if !a.cv_grid.is_empty() {
            cv.grid = Some(ListOr::List(a.cv_grid.clone()));
        }
        cv.by = a.resample_by.clone().or(cv.by);
        cv.seed = a.seed.or(cv.seed);
        spec.cv = Some(Toggle::Spec(cv));
    } else if cv_flags || a.cv_output.is_some() {
        bail!("--folds, --cv-repetitions, --cv-grid and --cv-output need --cv");
    }
    if let Some(n) = a.bootstrap {
        let mut b = match spec.bootstrap.take() {
            Some(t) => t.into_spec().unwrap_or_default(),
            None => BootstrapSpec::default(),
        };
        b.replicates = Some(n);
        b.by = a.resample_by.clone().or(b.by);
        b.seed = a.seed.or(b.seed);
        spec.bootstrap = Some(Toggle::Spec(b));
    } else if a.bootstrap_output.is_some() {
        bail!("--bootstrap-output needs --bootstrap N");
    }
    if !a.profile.is_empty() || a.profile_grid || a.profile_without_penalty {
        spec.profile = Some(ListOr::Object(ProfileSpec {
            covariates: Some(a.profile.clone()),
            include_penalty: Some(!a.profile_without_penalty),
            grid: a.profile_grid.then_some(ListOr::Flag(true)),
        }));
    }
    if a.profile_output.is_some() && !a.profile_grid {
        bail!("--profile-output needs --profile-grid (and --profile ids)");
    }
    if a.path.is_some() || a.path_min_ratio.is_some() || !a.path_lambdas.is_empty() {
        let mut p = match spec.path.take() {
            None | Some(ListOr::Flag(_)) => PathSpec::default(),
            Some(ListOr::List(l)) => PathSpec {
                lambdas: Some(l),
                ..Default::default()
            },
            Some(ListOr::Object(p)) => p,
        };
        p.n = a.path.or(p.n);
        p.min_ratio = a.path_min_ratio.or(p.min_ratio);
        if !a.path_lambdas.is_empty() {
            p.lambdas = Some(a.path_lambdas.clone());
        }
        spec.path = Some(ListOr::Object(p));
    }
    let has_path = !matches!(spec.path, None | Some(ListOr::Flag(false)));
    if a.path_output.is_some() && !has_path {
        bail!("--path-output needs a path (--path N, --path-lambdas or `path` in --options)");
    }
    if spec.table.is_some() {
        bail!("--options: `table` is for the SQL table functions; use --cv-output, --profile-output, --bootstrap-output or --path-output");
    }
    Ok(spec)
}

pub(crate) fn run_fit(a: &FitArgs) -> Result<()> {
    let mut opts: FitOptions = fit_spec(a)?.check(a.model)?;
    for out in [
        &a.output,
        &a.cv_output,
        &a.profile_output,
        &a.bootstrap_output,
        &a.path_output,
    ]
    .into_iter()
    .flatten()
    {
        check_output_extension(out)?;
    }

    let read = ReadOptions {
        time_column: a.time.clone(),
        y_column: a.y.clone(),
        event_value: a.event_value,
        covariate_columns: (!a.covariates_columns.is_empty()).then(|| a.covariates_columns.clone()),
        require_time: needs_time(a.model),
        drop_unknown_rows: a.drop_unknown_rows,
        ..Default::default()
    };
    let started = Instant::now();
    let (builder, report) = match &a.covariates {
        Some(cov) => {
            if read.covariate_columns.is_some() {
                bail!("--covariates-columns applies to the wide form (no --covariates)");
            }
            convert::read_long(&a.outcomes, cov, &read)?
        }
        None => convert::read_wide(&a.outcomes, &read)?,
    };
    let design = builder
        .build()
        .map_err(|e| e.hint_unknown_rows("pass --drop-unknown-rows to drop them"))?;
    let load_seconds = started.elapsed().as_secs_f64();
    for note in report.notes(design.dropped_unknown) {
        eprintln!("note: {note}");
    }
    if !a.exclude.is_empty() {
        opts.exclude = resolve_exclude(&a.exclude, &design)?;
    }

    let result = fit_owned(design, &opts)?;
    if let Some(note) = &result.device_note {
        eprintln!("{note}");
    }
    if let Some(cv) = &result.cv {
        eprintln!(
            "cross-validation: variance {:.6e} selected ({} folds × {} by {}, {} candidates, {} \
             fits, {:.2} s; {})",
            cv.variance,
            cv.folds,
            cv.repetitions,
            cv.by.name(),
            cv.curve.len(),
            cv.fits,
            cv.seconds,
            cv.stop_reason
        );
    }
    if let Some(b) = &result.bootstrap {
        eprintln!(
            "bootstrap: {} replicates by {} ({} failed), {:.2} s",
            b.replicates,
            b.by.name(),
            b.failed,
            b.seconds
        );
    }
    if let Some(p) = &result.path {
        let last = p.points.last().map_or(f64::NAN, |q| q.lambda);
        eprintln!(
            "path: {} λ from {:.6e} to {:.6e} (λ_max {:.6e}; strong rule {}), {} coordinate \
             updates, {:.3} s; the coefficients below are the fit at λ = {:.6e}",
            p.points.len(),
            p.points.first().map_or(f64::NAN, |q| q.lambda),
            last,
            p.lambda_max,
            if p.strong_rule { "on" } else { "off" },
            p.coordinate_updates,
            p.seconds,
            last
        );
    }
    print!("{}", convert::format_result_table(&result));
    println!("{}", summary_line(&result, load_seconds));
    let outputs = [
        (&a.output, ResultTable::Coefficients),
        (&a.cv_output, ResultTable::Cv),
        (&a.profile_output, ResultTable::Profile),
        (&a.bootstrap_output, ResultTable::Bootstrap),
        (&a.path_output, ResultTable::Path),
    ];
    for (out, table) in outputs {
        if let Some(out) = out {
            convert::write_batch(&convert::table_batch(&result, table)?, out)?;
            eprintln!("wrote {}", out.display());
        }
    }
    Ok(())
}

pub(crate) fn check_output_extension(path: &Path) -> Result<()> {
    let ext = path
        .extension()
        .and_then(|e| e.to_str())
        .map(str::to_ascii_lowercase)
        .unwrap_or_default();
    if !matches!(ext.as_str(), "csv" | "json" | "parquet" | "pq") {
        bail!(
            "--output {}: unknown file type; expected .csv, .json or .parquet",
            path.display()
        );
    }
    Ok(())
}

/// `--exclude` entries are covariate ids, or column names (wide form).
pub(crate) fn resolve_exclude(items: &[String], design: &DesignMatrix) -> Result<Vec<i64>> {
    items
        .iter()
        .map(|s| {
            let s = s.trim();
            if let Ok(id) = s.parse::<i64>() {
                return Ok(id);
            }
            design
                .columns
                .iter()
                .find(|c| c.name.as_deref() == Some(s))
                .map(|c| c.id)
                .with_context(|| {
                    format!("--exclude: `{s}` is neither a covariate id nor a covariate name")
                })
        })
        .collect()
}
