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
    /// Prior: none, laplace or normal [none; laplace when --lambda or --variance is given].
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
    /// Ties for cox / fine_gray: breslow or efron.
    #[arg(long, default_value = "breslow", value_parser = parse_ties)]
    pub(crate) ties: Ties,
    /// Stopping rule: objective (relative change of the objective after a cycle) or gradient
    /// (largest KKT violation in the cycle).
    #[arg(long, default_value = "objective", value_parser = parse_convergence)]
    pub(crate) convergence: Convergence,
    /// Convergence tolerance of the stopping rule.
    #[arg(long, default_value_t = 1e-6)]
    pub(crate) tolerance: f64,
    /// Maximum number of CCD cycles.
    #[arg(long, default_value_t = 1000)]
    pub(crate) max_iterations: usize,
    /// Confidence intervals for unpenalized coefficients: profile, wald or none.
    #[arg(long, default_value = "profile", value_parser = parse_ci)]
    pub(crate) ci: CiMethod,
    /// Confidence level.
    #[arg(long, default_value_t = 0.95)]
    pub(crate) ci_level: f64,
    /// Threads [all cores].
    #[arg(long)]
    pub(crate) threads: Option<usize>,
    /// auto, cpu or cuda (auto uses the CPU until the CUDA kernels are verified on a GPU).
    #[arg(long, default_value = "auto", value_parser = parse_device)]
    pub(crate) device: Device,
    /// Storage precision of the design on the GPU: f64, or f32 with f64 accumulation.
    #[arg(long, default_value = "f64", value_parser = parse_precision)]
    pub(crate) precision: Precision,
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
    /// Cross-validation folds.
    #[arg(long, default_value_t = 10)]
    pub(crate) folds: usize,
    /// Cross-validation repetitions.
    #[arg(long, default_value_t = 1)]
    pub(crate) cv_repetitions: usize,
    /// Grid search over these variances (comma-separated) instead of the auto search.
    #[arg(long, value_delimiter = ',')]
    pub(crate) cv_grid: Vec<f64>,
    /// Folds and bootstrap samples by: auto (strata for sccs / conditional_logistic, rows
    /// otherwise), row or stratum.
    #[arg(long, default_value = "auto")]
    pub(crate) resample_by: String,
    /// Seed of the cross-validation folds and the bootstrap.
    #[arg(long, default_value_t = 1)]
    pub(crate) seed: u64,
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
}

pub(crate) fn run_fit(a: &FitArgs) -> Result<()> {
    let family = match (&a.prior, a.variance.or(a.lambda)) {
        (Some(p), _) => p.clone(),
        (None, Some(_)) => "laplace".into(),
        (None, None) => "none".into(),
    };
    let prior = if a.cv && a.variance.is_none() && a.lambda.is_none() {
        // The variance is chosen by cross-validation; 1 is a placeholder.
        let family = if a.prior.is_none() {
            "laplace"
        } else {
            family.as_str()
        };
        Prior::from_parts(family, Some(1.0), None)?
    } else {
        Prior::from_parts(&family, a.variance, a.lambda)?
    };
    let mut opts = FitOptions::new(a.model);
    let by = Resampling::parse("--resample-by", &a.resample_by)?;
    if a.cv {
        opts.cv = Some(CvOptions {
            folds: a.folds,
            repetitions: a.cv_repetitions,
            seed: a.seed,
            search: if a.cv_grid.is_empty() {
                CvSearch::Auto
            } else {
                CvSearch::Grid(a.cv_grid.clone())
            },
            by,
            ..Default::default()
        });
    } else if !a.cv_grid.is_empty() || a.cv_output.is_some() {
        bail!("--cv-grid and --cv-output need --cv");
    }
    if let Some(n) = a.bootstrap {
        opts.bootstrap = Some(BootstrapOptions {
            replicates: n,
            by,
            seed: a.seed,
        });
    } else if a.bootstrap_output.is_some() {
        bail!("--bootstrap-output needs --bootstrap N");
    }
    opts.profile = ProfileOptions {
        covariates: a.profile.clone(),
        include_penalty: !a.profile_without_penalty,
        grid: a.profile_grid.then(epifusion::fit::default_profile_grid),
    };
    if a.profile_output.is_some() && !a.profile_grid {
        bail!("--profile-output needs --profile-grid (and --profile ids)");
    }
    opts.ties = a.ties;
    opts.prior = prior;
    opts.ccd.tolerance = a.tolerance;
    opts.ccd.convergence = a.convergence;
    opts.ccd.max_iterations = a.max_iterations;
    opts.ci = a.ci;
    opts.ci_level = a.ci_level;
    opts.threads = a.threads;
    opts.device = a.device;
    opts.precision = a.precision;
    opts.check()?;
    for out in [
        &a.output,
        &a.cv_output,
        &a.profile_output,
        &a.bootstrap_output,
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
    let design = builder.build()?;
    let load_seconds = started.elapsed().as_secs_f64();
    if report.dropped_null_rows > 0 {
        eprintln!(
            "note: dropped {} of {} rows with NULL in a used column",
            report.dropped_null_rows, report.input_rows
        );
    }
    if !report.skipped_columns.is_empty() {
        eprintln!(
            "note: skipped non-numeric columns: {}",
            report.skipped_columns.join(", ")
        );
    }
    if design.dropped_unknown > 0 {
        eprintln!(
            "note: dropped {} covariate entries with unknown row ids",
            design.dropped_unknown
        );
    }
    opts.exclude = resolve_exclude(&a.exclude, &design)?;

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
    print!("{}", convert::format_result_table(&result));
    println!("{}", summary_line(&result, load_seconds));
    let outputs = [
        (&a.output, ResultTable::Coefficients),
        (&a.cv_output, ResultTable::Cv),
        (&a.profile_output, ResultTable::Profile),
        (&a.bootstrap_output, ResultTable::Bootstrap),
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
