//! The `epifusion` command-line program: `fit` a model to CSV / Parquet files, or `bench` a fit
//! on seeded synthetic (or benchmark) data. See the README for every option.

use std::path::{Path, PathBuf};
use std::time::Instant;

use anyhow::{bail, Context, Result};
use clap::{Args, Parser, Subcommand};

use epifusion::backend::{Device, Precision};
use epifusion::bench;
use epifusion::engine::convert::{self, ReadOptions};
use epifusion::engine::options::ResultTable;
use epifusion::fit::{fit_owned, CiMethod, FitOptions, FitResult, ProfileOptions};
use epifusion::model::bootstrap::BootstrapOptions;
use epifusion::model::ccd::Convergence;
use epifusion::model::cv::{CvOptions, CvSearch, Resampling};
use epifusion::model::design::DesignMatrix;
use epifusion::model::prior::Prior;
use epifusion::model::{ModelKind, Ties};

#[derive(Parser, Debug)]
#[command(
    name = "epifusion",
    version,
    about = "Regularized SCCS, Cox and Fine–Gray regression by cyclic coordinate descent"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Fit a model to a long-format outcome + covariate table pair, or to one wide table.
    Fit(Box<FitArgs>),
    /// Time a Laplace-penalized fit on seeded synthetic data or a benchmark directory.
    Bench(BenchArgs),
    /// Run SQL with every epifusion function registered (`-c`, `-f`, or an interactive shell).
    Sql(SqlArgs),
    /// Convert an OMOP CSV dump to typed Parquet (one file per CDM table).
    Import(ImportArgs),
    /// Time the study-design builders (SCCS intervals, a Cox risk set) on a seeded synthetic
    /// OMOP store.
    BenchOmop(BenchOmopArgs),
    /// Run a pipeline file: validate, fit every analysis, write Parquet results, manifests and
    /// an HTML report (resumable: complete analyses are skipped).
    Run(RunArgs),
}

#[derive(Args, Debug)]
struct RunArgs {
    /// Pipeline file (TOML), e.g. pipelines/gibleed.toml.
    file: PathBuf,
    /// OMOP store (folder or URL), overriding the file's `omop`.
    #[arg(long)]
    omop: Option<String>,
    /// Output folder or URL, overriding the file's `output`.
    #[arg(long)]
    output: Option<String>,
    /// Validate and print the plan (analyses, sizes, what would run); write nothing.
    #[arg(long)]
    dry_run: bool,
    /// Recompute analyses that are already complete.
    #[arg(long)]
    force: bool,
}

#[derive(Args, Debug)]
struct BenchOmopArgs {
    /// Persons in the synthetic store.
    #[arg(long, default_value_t = 100_000)]
    persons: usize,
    /// Drugs (drug_era concepts).
    #[arg(long, default_value_t = 20)]
    drugs: usize,
    /// Seed.
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Folder for the store (written there; reused when `--reuse` and already present).
    #[arg(long)]
    dir: Option<PathBuf>,
    /// Reuse a store already in `--dir`.
    #[arg(long)]
    reuse: bool,
    /// Which builders: sccs, cohort or both.
    #[arg(long, default_value = "both")]
    design: String,
    /// Also fit the SCCS intervals (unpenalized) and report drug 1's relative incidence.
    #[arg(long)]
    fit: bool,
}

#[derive(Args, Debug)]
struct SqlArgs {
    /// SQL to run (several `;`-separated statements allowed).
    #[arg(short = 'c', long = "command")]
    command: Option<String>,
    /// File of SQL statements to run.
    #[arg(short = 'f', long = "file")]
    file: Option<PathBuf>,
    /// OMOP store (folder, file://, s3://, gs://, az://, http(s):// URL) to register.
    #[arg(long)]
    omop: Option<String>,
    /// Output format on stdout: table, csv or json.
    #[arg(long, default_value = "table")]
    format: String,
    /// Write the last statement's result to this file (.parquet, .csv or .json).
    #[arg(long)]
    output: Option<PathBuf>,
    /// DataFusion batch size.
    #[arg(long)]
    batch_size: Option<usize>,
}

#[derive(Args, Debug)]
struct ImportArgs {
    /// Folder (or URL) with the OMOP CSV files.
    source: String,
    /// Destination folder or object-store URL for the Parquet files.
    destination: String,
}

fn parse_model(s: &str) -> std::result::Result<ModelKind, String> {
    ModelKind::parse(s).map_err(|e| e.to_string())
}
fn parse_ties(s: &str) -> std::result::Result<Ties, String> {
    Ties::parse(s).map_err(|e| e.to_string())
}
fn parse_convergence(s: &str) -> std::result::Result<Convergence, String> {
    Convergence::parse(s).map_err(|e| e.to_string())
}
fn parse_ci(s: &str) -> std::result::Result<CiMethod, String> {
    CiMethod::parse(s).map_err(|e| e.to_string())
}
fn parse_device(s: &str) -> std::result::Result<Device, String> {
    Device::parse(s).map_err(|e| e.to_string())
}

fn parse_precision(s: &str) -> std::result::Result<Precision, String> {
    Precision::parse(s).map_err(|e| e.to_string())
}

#[derive(Args, Debug)]
struct FitArgs {
    /// cox, fine_gray, sccs, logistic, poisson or conditional_logistic.
    #[arg(long, value_parser = parse_model)]
    model: ModelKind,
    /// Outcome table (.csv or .parquet): row_id, [stratum_id], time, y, [weight, start_time,
    /// offset, censor_weight]; without --covariates, a wide table (outcome + covariate columns).
    #[arg(long)]
    outcomes: PathBuf,
    /// Covariate table (.csv or .parquet): row_id, covariate_id, [covariate_value].
    #[arg(long)]
    covariates: Option<PathBuf>,
    /// Prior: none, laplace or normal [none; laplace when --lambda or --variance is given].
    #[arg(long)]
    prior: Option<String>,
    /// Prior variance (Laplace λ = √(2/v); Normal σ² = v).
    #[arg(long, conflicts_with = "lambda")]
    variance: Option<f64>,
    /// Penalty λ (Laplace: objective LL − λΣ|β|, not scaled by n; Normal: σ² = 1/λ).
    #[arg(long)]
    lambda: Option<f64>,
    /// Covariates never penalized: ids (or column names in wide form), comma-separated.
    #[arg(long, value_delimiter = ',')]
    exclude: Vec<String>,
    /// Ties for cox / fine_gray: breslow or efron.
    #[arg(long, default_value = "breslow", value_parser = parse_ties)]
    ties: Ties,
    /// Stopping rule: objective (relative change of the objective after a cycle) or gradient
    /// (largest KKT violation in the cycle).
    #[arg(long, default_value = "objective", value_parser = parse_convergence)]
    convergence: Convergence,
    /// Convergence tolerance of the stopping rule.
    #[arg(long, default_value_t = 1e-6)]
    tolerance: f64,
    /// Maximum number of CCD cycles.
    #[arg(long, default_value_t = 1000)]
    max_iterations: usize,
    /// Confidence intervals for unpenalized coefficients: profile, wald or none.
    #[arg(long, default_value = "profile", value_parser = parse_ci)]
    ci: CiMethod,
    /// Confidence level.
    #[arg(long, default_value_t = 0.95)]
    ci_level: f64,
    /// Threads [all cores].
    #[arg(long)]
    threads: Option<usize>,
    /// auto, cpu or cuda (auto uses the CPU until the CUDA kernels are verified on a GPU).
    #[arg(long, default_value = "auto", value_parser = parse_device)]
    device: Device,
    /// Storage precision of the design on the GPU: f64, or f32 with f64 accumulation.
    #[arg(long, default_value = "f64", value_parser = parse_precision)]
    precision: Precision,
    /// Write the result table (.csv, .json or .parquet).
    #[arg(long)]
    output: Option<PathBuf>,
    /// Name of the time column [time].
    #[arg(long)]
    time: Option<String>,
    /// Name of the outcome column [y].
    #[arg(long)]
    y: Option<String>,
    /// Recode the outcome: y = 1 where the outcome column equals this value, else 0
    /// (e.g. `--y status --event-value 2` for R's lung data).
    #[arg(long)]
    event_value: Option<f64>,
    /// Wide form: covariate columns to use, comma-separated [every other numeric column].
    #[arg(long, value_delimiter = ',')]
    covariates_columns: Vec<String>,
    /// Drop covariate entries whose row id has no outcome row (reported) instead of failing.
    #[arg(long)]
    drop_unknown_rows: bool,
    /// Choose the prior variance by cross-validation (prior laplace unless --prior normal).
    #[arg(long)]
    cv: bool,
    /// Cross-validation folds.
    #[arg(long, default_value_t = 10)]
    folds: usize,
    /// Cross-validation repetitions.
    #[arg(long, default_value_t = 1)]
    cv_repetitions: usize,
    /// Grid search over these variances (comma-separated) instead of the auto search.
    #[arg(long, value_delimiter = ',')]
    cv_grid: Vec<f64>,
    /// Folds and bootstrap samples by: auto (strata for sccs / conditional_logistic, rows
    /// otherwise), row or stratum.
    #[arg(long, default_value = "auto")]
    resample_by: String,
    /// Seed of the cross-validation folds and the bootstrap.
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Bootstrap with this many replicates (percentile intervals with --ci bootstrap).
    #[arg(long)]
    bootstrap: Option<usize>,
    /// Profile intervals for these covariate ids (also penalized ones), comma-separated.
    #[arg(long, value_delimiter = ',')]
    profile: Vec<i64>,
    /// Likelihood profiles of the --profile covariates on CohortMethod's grid (1000 values of
    /// log 0.1 … log 10), written to --profile-output.
    #[arg(long)]
    profile_grid: bool,
    /// Profile penalized coefficients without their own penalty.
    #[arg(long)]
    profile_without_penalty: bool,
    /// Write the cross-validation curve (.csv, .json or .parquet).
    #[arg(long)]
    cv_output: Option<PathBuf>,
    /// Write the likelihood profiles.
    #[arg(long)]
    profile_output: Option<PathBuf>,
    /// Write the bootstrap summary per coefficient.
    #[arg(long)]
    bootstrap_output: Option<PathBuf>,
}

#[derive(Args, Debug)]
struct BenchArgs {
    /// cox, fine_gray or sccs.
    #[arg(long, value_parser = parse_model)]
    model: ModelKind,
    /// Rows (cox, fine_gray) or cases (sccs).
    #[arg(long, default_value_t = 100_000)]
    n: usize,
    /// Covariates (drugs for sccs).
    #[arg(long, default_value_t = 1000)]
    p: usize,
    /// Density of the indicator covariates (cox, fine_gray).
    #[arg(long, default_value_t = 0.05)]
    density: f64,
    /// Laplace λ [100 for cox and fine_gray, 3 for sccs].
    #[arg(long)]
    lambda: Option<f64>,
    /// Threads [1].
    #[arg(long, default_value_t = 1)]
    threads: usize,
    /// Ties for cox / fine_gray: breslow or efron.
    #[arg(long, default_value = "breslow", value_parser = parse_ties)]
    ties: Ties,
    /// Stopping rule: objective or gradient.
    #[arg(long, default_value = "objective", value_parser = parse_convergence)]
    convergence: Convergence,
    /// Convergence tolerance.
    #[arg(long, default_value_t = 1e-6)]
    tolerance: f64,
    /// Generator seed.
    #[arg(long, default_value_t = 123)]
    seed: u64,
    /// Load a benchmark directory (outcomes_cox / outcomes_fgr / outcomes + covariates
    /// .parquet) instead of generating data.
    #[arg(long)]
    data: Option<PathBuf>,
    /// auto, cpu or cuda (auto uses the CPU until the CUDA kernels are verified on a GPU).
    #[arg(long, default_value = "auto", value_parser = parse_device)]
    device: Device,
    /// Storage precision of the design on the GPU: f64, or f32 with f64 accumulation.
    #[arg(long, default_value = "f64", value_parser = parse_precision)]
    precision: Precision,
    /// Only generate / load the data and report its size (no fit).
    #[arg(long)]
    generate_only: bool,
    /// Print one JSON object instead of text.
    #[arg(long)]
    json: bool,
    /// Also time a K-fold auto-search cross-validation of the Laplace variance (seed 1)
    /// against the single fit.
    #[arg(long)]
    cv_folds: Option<usize>,
    /// Also time the profile-likelihood 95% interval of this covariate id, fitted unpenalized
    /// (the others keep the Laplace prior), against the single fit.
    #[arg(long)]
    profile_covariate: Option<i64>,
    /// Visit every coordinate in every cycle (no active-set cycles between full cycles).
    #[arg(long)]
    no_active_set: bool,
}

/// glibc gives each thread its own malloc arena, so the memory the main thread frees while a
/// rayon worker builds the likelihood (the loaded design's columns, dropped one by one) is not
/// reused by that worker, and peak RSS holds both copies. One arena keeps the peak near one
/// copy (DESIGN.md §10); fits allocate little after setup, so the shared lock costs nothing.
#[cfg(all(target_os = "linux", target_env = "gnu"))]
fn use_one_malloc_arena() {
    // SAFETY: mallopt only changes allocator tuning; called before any other thread exists.
    unsafe {
        libc::mallopt(libc::M_ARENA_MAX, 1);
    }
}

#[cfg(not(all(target_os = "linux", target_env = "gnu")))]
fn use_one_malloc_arena() {}

fn main() {
    use_one_malloc_arena();
    let cli = Cli::parse();
    let outcome = match cli.command {
        Command::Fit(a) => run_fit(&a),
        Command::Bench(a) => run_bench(&a),
        Command::Sql(a) => run_sql_command(&a),
        Command::Import(a) => run_import(&a),
        Command::BenchOmop(a) => run_bench_omop(&a),
        Command::Run(a) => run_pipeline(&a),
    };
    if let Err(e) = outcome {
        eprintln!("error: {e:#}");
        std::process::exit(1);
    }
}

fn runtime() -> Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("cannot start the async runtime")
}

fn run_sql_command(a: &SqlArgs) -> Result<()> {
    use epifusion::engine::session::{new_session, SessionOptions};
    use epifusion::engine::shell::{self, OutputFormat};
    let format = OutputFormat::parse(&a.format)?;
    let sql = match (&a.command, &a.file) {
        (Some(_), Some(_)) => bail!("give either -c or -f, not both"),
        (Some(c), None) => Some(c.clone()),
        (None, Some(f)) => Some(
            std::fs::read_to_string(f).with_context(|| format!("cannot read {}", f.display()))?,
        ),
        (None, None) => None,
    };
    let rt = runtime()?;
    rt.block_on(async {
        let ctx = new_session(&SessionOptions {
            omop: a.omop.clone(),
            batch_size: a.batch_size,
        })
        .await?;
        match sql {
            Some(sql) => {
                let mut stdout = std::io::stdout();
                shell::run_sql(&ctx, &sql, format, a.output.as_deref(), &mut stdout).await?;
            }
            None => shell::interactive(std::sync::Arc::new(ctx), format).await?,
        }
        Ok::<(), anyhow::Error>(())
    })
}

fn run_import(a: &ImportArgs) -> Result<()> {
    use epifusion::engine::session::{new_session, SessionOptions};
    let rt = runtime()?;
    rt.block_on(async {
        let ctx = new_session(&SessionOptions::default()).await?;
        let written = epifusion::engine::omop::import(&ctx, &a.source, &a.destination).await?;
        for (table, rows) in &written {
            eprintln!("{table}: {rows} rows");
        }
        eprintln!("imported {} tables into {}", written.len(), a.destination);
        Ok::<(), anyhow::Error>(())
    })
}

fn run_pipeline(a: &RunArgs) -> Result<()> {
    use epifusion::pipeline::{plan, progress::Progress, run};
    let pipeline = plan::load(&a.file, a.omop.as_deref(), a.output.as_deref())?;
    let opts = run::RunOptions {
        dry_run: a.dry_run,
        force: a.force,
    };
    let progress = Progress::new(pipeline.analyses.len());
    let rt = runtime()?;
    let summary = rt.block_on(run::run(&pipeline, opts, &progress))?;
    if a.dry_run {
        println!(
            "pipeline {} ({}): OMOP {} → {}",
            pipeline.name,
            a.file.display(),
            pipeline.omop,
            pipeline.output
        );
        println!(
            "{:<48} {:<7} {:<10} {:>12} {:>12}  action",
            "analysis", "design", "model", "outcome rows", "covariates"
        );
        let n = |v: Option<usize>| v.map_or("–".to_string(), |v| v.to_string());
        for r in &summary.plan {
            println!(
                "{:<48} {:<7} {:<10} {:>12} {:>12}  {}",
                r.id,
                r.design,
                r.model,
                n(r.outcome_rows),
                n(r.covariate_entries),
                r.action
            );
        }
        println!("dry run: valid; nothing was written");
        return Ok(());
    }
    println!(
        "run {} complete: {} analyses ({} computed, {} skipped as complete)",
        summary.run_id,
        summary.computed.len() + summary.skipped.len(),
        summary.computed.len(),
        summary.skipped.len()
    );
    if let Some(m) = &summary.manifest {
        println!("manifest: {m}");
    }
    if let Some(r) = &summary.report {
        println!("report: {r}");
    }
    Ok(())
}

fn needs_time(model: ModelKind) -> bool {
    !matches!(model, ModelKind::Logistic | ModelKind::ConditionalLogistic)
}

fn run_fit(a: &FitArgs) -> Result<()> {
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

fn check_output_extension(path: &Path) -> Result<()> {
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
fn resolve_exclude(items: &[String], design: &DesignMatrix) -> Result<Vec<i64>> {
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

fn summary_line(r: &FitResult, load_seconds: f64) -> String {
    format!(
        "model {}: {} rows, {} strata, log-likelihood {:.6}, log prior {:.6}, {} iterations, {}, \
         fit {:.3} s (load {:.3} s), device {}",
        r.model.name(),
        r.n_rows,
        r.n_strata,
        r.log_likelihood,
        r.log_prior + 0.0, // no "-0.000000" without a prior
        r.iterations,
        r.status.name(),
        r.seconds,
        load_seconds,
        r.device
    )
}

/// Reference CPU seconds (DESIGN.md §10 and the bench README) for (model, N), P = 1000.
fn reference_seconds(model: ModelKind, n: usize) -> Option<f64> {
    match (model, n) {
        (ModelKind::Cox, 100_000) => Some(5.2),
        (ModelKind::Cox, 1_000_000) => Some(121.0),
        (ModelKind::FineGray, 100_000) => Some(22.7),
        (ModelKind::FineGray, 1_000_000) => Some(405.0),
        (ModelKind::ConditionalPoisson, 100_000) => Some(0.28),
        (ModelKind::ConditionalPoisson, 1_000_000) => Some(5.6),
        _ => None,
    }
}

fn load_bench_dir(dir: &Path, model: ModelKind) -> Result<DesignMatrix> {
    let outcomes = match model {
        ModelKind::Cox => "outcomes_cox.parquet",
        ModelKind::FineGray => "outcomes_fgr.parquet",
        _ => "outcomes.parquet",
    };
    let read = ReadOptions {
        require_time: true,
        ..Default::default()
    };
    let (b, _) = convert::read_long(&dir.join(outcomes), &dir.join("covariates.parquet"), &read)
        .with_context(|| format!("loading {}", dir.display()))?;
    Ok(b.build()?)
}

fn run_bench_omop(a: &BenchOmopArgs) -> Result<()> {
    use epifusion::engine::session::{new_session, SessionOptions};
    use epifusion::engine::study::{self, synth};
    if !["sccs", "cohort", "both"].contains(&a.design.as_str()) {
        bail!("--design: sccs, cohort or both (got {})", a.design);
    }
    let dir = a.dir.clone().unwrap_or_else(|| {
        std::env::temp_dir().join(format!("epifusion-omop-{}-{}", a.persons, a.seed))
    });
    let started = Instant::now();
    let mut out = serde_json::json!({ "persons": a.persons, "drugs": a.drugs, "seed": a.seed,
        "store": dir.display().to_string() });
    if !(a.reuse && dir.join("person.parquet").exists()) {
        let s = synth::write_store(&dir, a.persons, a.drugs, a.seed)?;
        out["drug_eras"] = s.drug_eras.into();
        out["conditions"] = s.conditions.into();
        out["outcomes"] = s.outcomes.into();
        out["generate_seconds"] = started.elapsed().as_secs_f64().into();
    }
    let store_bytes: u64 = std::fs::read_dir(&dir)?
        .filter_map(|e| e.ok()?.metadata().ok())
        .map(|m| m.len())
        .sum();
    out["store_bytes"] = store_bytes.into();
    out["rss_after_generate_bytes"] = bench::peak_rss_bytes().into();
    let rt = runtime()?;
    rt.block_on(async {
        let ctx = new_session(&SessionOptions {
            omop: Some(dir.display().to_string()),
            batch_size: None,
        })
        .await?;
        let rows = |b: &[datafusion::arrow::array::RecordBatch]| -> usize {
            b.iter().map(|b| b.num_rows()).sum()
        };
        let bytes = |t: &study::StudyTables| -> usize {
            t.outcomes
                .iter()
                .chain(&t.covariates)
                .map(|b| b.get_array_memory_size())
                .sum()
        };
        if a.design != "cohort" {
            let d = study::SccsDesign::from_json(&format!(
                r#"{{"outcome": {{"concept_ids": [{}]}},
                    "exposures": [{{"concept_ids": [{}], "label": "drug 1"}},
                                  {{"concept_ids": [{}], "label": "drug 2", "risk_windows": [{{"start": -30, "end": -1, "end_anchor": "era_start"}}, {{}}]}}],
                    "age_spline": {{"knots": 5}}, "season_spline": {{"knots": 5}},
                    "end_of_observation_probe": 30}}"#,
                synth::OUTCOME_CONCEPT,
                synth::FIRST_DRUG,
                synth::FIRST_DRUG + 1
            ))?;
            let t0 = Instant::now();
            let t = study::build_sccs(&ctx, &d).await?;
            out["sccs_seconds"] = t0.elapsed().as_secs_f64().into();
            out["sccs_rows"] = rows(&t.outcomes).into();
            out["sccs_covariate_entries"] = rows(&t.covariates).into();
            out["sccs_output_bytes"] = bytes(&t).into();
            out["rss_after_sccs_bytes"] = bench::peak_rss_bytes().into();
            if !a.fit {
                drop(t);
            } else {
            let fit = datafusion::datasource::MemTable::try_new(
                t.outcomes[0].schema(),
                vec![t.outcomes.clone()],
            )?;
            ctx.register_table("bench_intervals", std::sync::Arc::new(fit))?;
            let cov = datafusion::datasource::MemTable::try_new(
                t.covariates[0].schema(),
                vec![t.covariates.clone()],
            )?;
            ctx.register_table("bench_covariates", std::sync::Arc::new(cov))?;
            let r = ctx
                .sql("SELECT covariate_id, exp_estimate FROM sccs_fit('bench_intervals', 'bench_covariates', '{\"ci\": \"none\"}') WHERE covariate_id = 1000")
                .await?
                .collect()
                .await?;
            let ri = r.first().and_then(|b| {
                b.column(1)
                    .as_any()
                    .downcast_ref::<datafusion::arrow::array::Float64Array>()
                    .map(|a| a.value(0))
            });
            out["sccs_ri_drug1"] = ri.into();
            out["sccs_true_ri"] = synth::TRUE_RI.into();
            }
        }
        if a.design != "sccs" {
            let d = study::CohortDesign::from_json(&format!(
                r#"{{"target": {{"concept_ids": [{}]}}, "comparator": {{"concept_ids": [{}]}},
                    "outcome": {{"concept_ids": [{}]}}, "first_exposure_only": true,
                    "remove_duplicate_subjects": "remove_all", "washout_days": 180,
                    "risk_window_end": 365, "end_anchor": "cohort_start",
                    "competing": {{"death": true}}}}"#,
                synth::FIRST_DRUG,
                synth::FIRST_DRUG + 1,
                synth::OUTCOME_CONCEPT
            ))?;
            let t0 = Instant::now();
            let t = study::build_cohort(&ctx, &d).await?;
            out["cohort_seconds"] = t0.elapsed().as_secs_f64().into();
            out["cohort_rows"] = rows(&t.outcomes).into();
            out["cohort_covariate_entries"] = rows(&t.covariates).into();
            out["cohort_output_bytes"] = bytes(&t).into();
            out["rss_after_cohort_bytes"] = bench::peak_rss_bytes().into();
        }
        Ok::<_, anyhow::Error>(())
    })?;
    out["peak_rss_bytes"] = bench::peak_rss_bytes().into();
    println!("{}", serde_json::to_string_pretty(&out)?);
    Ok(())
}

fn run_bench(a: &BenchArgs) -> Result<()> {
    let lambda = a.lambda.unwrap_or(match a.model {
        ModelKind::ConditionalPoisson => 3.0,
        _ => 100.0,
    });
    let started = Instant::now();
    let design = match &a.data {
        Some(dir) => load_bench_dir(dir, a.model)?,
        None => {
            let data = match a.model {
                ModelKind::Cox => bench::cox_data(a.n, a.p, a.density, a.seed)?,
                ModelKind::FineGray => bench::fine_gray_data(a.n, a.p, a.density, a.seed)?,
                ModelKind::ConditionalPoisson => bench::sccs_data(a.n, a.p, a.seed)?,
                other => bail!(
                    "bench supports cox, fine_gray and sccs (got {})",
                    other.name()
                ),
            };
            data.design
        }
    };
    let data_seconds = started.elapsed().as_secs_f64();
    let n_units = match a.model {
        ModelKind::ConditionalPoisson => design.n_strata(),
        _ => design.n_rows(),
    };
    let (n_cols, csc_bytes) = (design.n_cols(), design.csc_bytes());
    let mut out = serde_json::json!({
        "model": a.model.name(),
        "source": a.data.as_ref().map_or("generated".to_string(), |d| d.display().to_string()),
        "seed": a.seed,
        "rows": design.n_rows(),
        "strata": design.n_strata(),
        "columns": design.n_cols(),
        "nnz": design.nnz(),
        "csc_bytes": design.csc_bytes(),
        "rows_with_events": design.rows.y.iter().filter(|&&y| y > 0.0).count(),
        "data_seconds": data_seconds,
        "lambda": lambda,
        "ties": format!("{:?}", a.ties).to_lowercase(),
        "threads": a.threads,
    });
    if !a.generate_only {
        let mut opts = FitOptions::new(a.model);
        opts.prior = Prior::Laplace { lambda };
        opts.ties = a.ties;
        opts.ccd.tolerance = a.tolerance;
        opts.ccd.convergence = a.convergence;
        opts.ccd.active_set = !a.no_active_set;
        opts.ci = CiMethod::None;
        opts.threads = Some(a.threads);
        opts.device = a.device;
        opts.precision = a.precision;
        let cpu_before = bench::cpu_seconds();
        let keep = (a.cv_folds.is_some() || a.profile_covariate.is_some()).then(|| design.clone());
        let r = fit_owned(design, &opts)?;
        let fit_seconds = r.fit_seconds;
        // Building the likelihood (sorting the columns etc.) is the rest of the wall time.
        out["setup_seconds"] = (r.seconds - fit_seconds).into();
        if let (Some(a), Some(b)) = (cpu_before, bench::cpu_seconds()) {
            out["cpu_seconds"] = (b - a).into();
        }
        let l1: f64 = r.coefficients.iter().map(|c| c.estimate.abs()).sum();
        let nonzero = r.coefficients.iter().filter(|c| c.estimate != 0.0).count();
        out["fit_seconds"] = fit_seconds.into();
        out["total_fit_seconds"] = r.seconds.into();
        out["cycles"] = r.iterations.into();
        out["coordinate_updates"] = r.coordinate_updates.into();
        out["updates_per_second"] = (r.coordinate_updates as f64 / fit_seconds.max(1e-12)).into();
        out["log_likelihood"] = r.log_likelihood.into();
        out["objective"] = (r.log_likelihood - lambda * l1).into();
        out["nonzero"] = nonzero.into();
        out["status"] = r.status.name().into();
        out["device"] = r.device.clone().into();
        if let Some(g) = &r.gpu {
            // Estimated from the kernels' access pattern (no hardware counters); the fit time
            // stops after the stream is synchronized.
            let bytes = g.bytes_per_cycle as f64 * r.iterations as f64;
            let bandwidth = bytes / fit_seconds.max(1e-12);
            out["precision"] = a.precision.suffix().into();
            out["gpu_design_bytes"] = g.design_bytes.into();
            out["gpu_setup_seconds"] = g.setup_seconds.into();
            out["gpu_bytes_per_cycle"] = g.bytes_per_cycle.into();
            out["gpu_effective_bandwidth_gb_s"] = (bandwidth / 1e9).into();
            out["gpu_bandwidth_fraction_of_4_3_tb_s"] = (bandwidth / 4.3e12).into();
        }
        if let Some(note) = &r.device_note {
            eprintln!("{note}");
        }
        let reference = (n_cols == 1000)
            .then(|| reference_seconds(a.model, n_units))
            .flatten();
        if let Some(ref_s) = reference {
            out["reference_seconds"] = ref_s.into();
            out["speedup_vs_reference"] = (ref_s / fit_seconds.max(1e-12)).into();
        }
        if let (Some(k), Some(design)) = (a.cv_folds, &keep) {
            let mut o = opts.clone();
            o.cv = Some(CvOptions {
                folds: k,
                ..Default::default()
            });
            let t = Instant::now();
            let c = epifusion::fit::fit(design, &o)?;
            let secs = t.elapsed().as_secs_f64();
            let cv = c.cv.as_ref().expect("cv ran");
            out["cv_seconds"] = secs.into();
            out["cv_over_fit"] = (secs / r.seconds.max(1e-12)).into();
            out["cv_variance"] = cv.variance.into();
            out["cv_candidates"] = cv.curve.len().into();
            out["cv_fits"] = cv.fits.into();
            out["cv_stop_reason"] = cv.stop_reason.clone().into();
        }
        if let (Some(id), Some(design)) = (a.profile_covariate, &keep) {
            let mut o = opts.clone();
            o.exclude = vec![id];
            o.ci = CiMethod::None;
            let t = Instant::now();
            epifusion::fit::fit(design, &o)?;
            let plain_s = t.elapsed().as_secs_f64();
            o.ci = CiMethod::Profile;
            let t = Instant::now();
            let p = epifusion::fit::fit(design, &o)?;
            let secs = t.elapsed().as_secs_f64();
            let c = p
                .coefficient(id)
                .context("--profile-covariate: no such covariate id")?;
            out["profile_covariate"] = id.into();
            out["profile_fit_seconds"] = plain_s.into();
            out["profile_total_seconds"] = secs.into();
            out["profile_seconds"] = (secs - plain_s).into();
            out["profile_estimate"] = c.estimate.into();
            out["profile_ci"] = serde_json::json!([c.ci_lower, c.ci_upper]);
        }
    }
    let rss = bench::peak_rss_bytes();
    out["peak_rss_bytes"] = rss.into();
    if let Some(rss) = rss {
        out["peak_rss_over_csc"] = (rss as f64 / csc_bytes.max(1) as f64).into();
    }
    if a.json {
        println!("{}", serde_json::to_string_pretty(&out)?);
    } else {
        print_bench_text(&out);
    }
    Ok(())
}

fn print_bench_text(v: &serde_json::Value) {
    let mib = |b: &serde_json::Value| b.as_f64().map(|b| format!("{:.1} MiB", b / 1048576.0));
    let f = |k: &str| v.get(k).cloned().unwrap_or(serde_json::Value::Null);
    let line = |label: &str, value: Option<String>| {
        if let Some(value) = value {
            println!("{label:<24}{value}");
        }
    };
    let num = |k: &str| f(k).as_f64();
    line("model", f("model").as_str().map(String::from));
    line("source", f("source").as_str().map(String::from));
    line("rows", num("rows").map(|x| format!("{x}")));
    line("strata", num("strata").map(|x| format!("{x}")));
    line("columns", num("columns").map(|x| format!("{x}")));
    line("nnz", num("nnz").map(|x| format!("{x}")));
    line(
        "rows with events",
        num("rows_with_events").map(|x| format!("{x}")),
    );
    line("CSC bytes", mib(&f("csc_bytes")));
    line(
        "generate/load",
        num("data_seconds").map(|s| format!("{s:.3} s")),
    );
    line("λ", num("lambda").map(|x| format!("{x}")));
    line("threads", num("threads").map(|x| format!("{x}")));
    line("ties", f("ties").as_str().map(String::from));
    line("setup", num("setup_seconds").map(|s| format!("{s:.3} s")));
    line("fit", num("fit_seconds").map(|s| format!("{s:.3} s")));
    line(
        "CPU (setup + fit)",
        num("cpu_seconds").map(|s| format!("{s:.3} s")),
    );
    line("cycles", num("cycles").map(|x| format!("{x}")));
    line(
        "coordinate updates/s",
        num("updates_per_second").map(|x| format!("{x:.0}")),
    );
    line(
        "log-likelihood",
        num("log_likelihood").map(|x| format!("{x:.6}")),
    );
    line("objective", num("objective").map(|x| format!("{x:.6}")));
    line("non-zero", num("nonzero").map(|x| format!("{x}")));
    line("status", f("status").as_str().map(String::from));
    line("device", f("device").as_str().map(String::from));
    line(
        "GPU traffic",
        num("gpu_bytes_per_cycle").map(|b| {
            format!(
                "{:.1} MiB/cycle (estimated), {:.1} GB/s = {:.1}% of 4.3 TB/s, precision {}",
                b / 1048576.0,
                num("gpu_effective_bandwidth_gb_s").unwrap_or(0.0),
                100.0 * num("gpu_bandwidth_fraction_of_4_3_tb_s").unwrap_or(0.0),
                f("precision").as_str().unwrap_or("f64")
            )
        }),
    );
    line(
        "CV",
        num("cv_seconds").map(|s| {
            format!(
                "{s:.3} s ({:.1}× the fit)",
                num("cv_over_fit").unwrap_or(0.0)
            )
        }),
    );
    line(
        "CV variance",
        num("cv_variance").map(|x| {
            format!(
                "{x:.6e} ({} candidates, {} fits)",
                num("cv_candidates").unwrap_or(0.0),
                num("cv_fits").unwrap_or(0.0)
            )
        }),
    );
    line(
        "profile CI",
        num("profile_seconds").map(|s| {
            format!(
                "{s:.3} s (fit {:.3} s), interval {}",
                num("profile_fit_seconds").unwrap_or(0.0),
                f("profile_ci")
            )
        }),
    );
    line("peak RSS", mib(&f("peak_rss_bytes")));
    line(
        "peak RSS / CSC",
        num("peak_rss_over_csc").map(|x| format!("{x:.2}")),
    );
    if let (Some(r), Some(s)) = (num("reference_seconds"), num("speedup_vs_reference")) {
        line(
            "vs reference CPU",
            Some(format!("speed-up {s:.2}× (reference {r} CPU-s)")),
        );
    }
}
