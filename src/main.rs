//! The `epifusion` command-line program: `fit` a model to CSV / Parquet files, or `bench` a fit
//! on seeded synthetic (or benchmark) data. See the README for every option.

use std::path::{Path, PathBuf};
use std::time::Instant;

use anyhow::{bail, Context, Result};
use clap::{Args, Parser, Subcommand};

use epifusion::backend::Device;
use epifusion::bench;
use epifusion::engine::convert::{self, ReadOptions};
use epifusion::fit::{fit_owned, CiMethod, FitOptions, FitResult};
use epifusion::model::ccd::Convergence;
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
    /// auto, cpu or cuda.
    #[arg(long, default_value = "auto", value_parser = parse_device)]
    device: Device,
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
    /// auto, cpu or cuda.
    #[arg(long, default_value = "auto", value_parser = parse_device)]
    device: Device,
    /// Only generate / load the data and report its size (no fit).
    #[arg(long)]
    generate_only: bool,
    /// Print one JSON object instead of text.
    #[arg(long)]
    json: bool,
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
    let prior = Prior::from_parts(&family, a.variance, a.lambda)?;
    let mut opts = FitOptions::new(a.model);
    opts.ties = a.ties;
    opts.prior = prior;
    opts.ccd.tolerance = a.tolerance;
    opts.ccd.convergence = a.convergence;
    opts.ccd.max_iterations = a.max_iterations;
    opts.ci = a.ci;
    opts.ci_level = a.ci_level;
    opts.threads = a.threads;
    opts.device = a.device;
    opts.check()?;
    if let Some(out) = &a.output {
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
    print!("{}", convert::format_result_table(&result));
    println!("{}", summary_line(&result, load_seconds));
    if let Some(out) = &a.output {
        convert::write_result(&result, out)?;
        eprintln!("wrote {}", out.display());
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
        opts.ci = CiMethod::None;
        opts.threads = Some(a.threads);
        opts.device = a.device;
        let cpu_before = bench::cpu_seconds();
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
