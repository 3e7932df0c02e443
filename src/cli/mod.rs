//! The `epifusion` subcommands, one module each; `main.rs` only dispatches.

pub(crate) use std::path::{Path, PathBuf};
pub(crate) use std::time::Instant;

pub(crate) use anyhow::{bail, Context, Result};
pub(crate) use clap::{Args, Parser, Subcommand};

pub(crate) use epifusion::backend::{Device, Precision};
pub(crate) use epifusion::engine::convert::{self, ReadOptions};
pub(crate) use epifusion::engine::options::ResultTable;
pub(crate) use epifusion::fit::{fit_owned, CiMethod, FitOptions, FitResult};
pub(crate) use epifusion::model::ccd::Convergence;
pub(crate) use epifusion::model::cv::CvOptions;
pub(crate) use epifusion::model::design::DesignMatrix;
pub(crate) use epifusion::model::prior::Prior;
pub(crate) use epifusion::model::{ModelKind, Ties};
pub(crate) use epifusion::options::FitSpec;

pub(crate) mod bench;
pub(crate) mod bench_cm;
pub(crate) mod bench_many;
pub(crate) mod bench_omop;
pub(crate) mod cluster;
pub(crate) mod fit;
pub(crate) mod import;
pub(crate) mod run;
pub(crate) mod serve;
pub(crate) mod sql;

pub(crate) use bench::BenchArgs;
pub(crate) use bench_omop::BenchOmopArgs;
pub(crate) use cluster::{ExecutorArgs, SchedulerArgs};
pub(crate) use fit::FitArgs;
pub(crate) use import::ImportArgs;
pub(crate) use run::RunArgs;
pub(crate) use serve::ServeArgs;
pub(crate) use sql::SqlArgs;

#[derive(Parser, Debug)]
#[command(
    name = "epifusion",
    version,
    about = "Regularized SCCS, Cox and Fine–Gray regression by cyclic coordinate descent"
)]
pub(crate) struct Cli {
    #[command(subcommand)]
    pub(crate) command: Command,
}

#[derive(Subcommand, Debug)]
pub(crate) enum Command {
    /// Fit a model to a long-format outcome + covariate table pair, or to one wide table.
    #[command(after_long_help = fit_options_help())]
    Fit(Box<FitArgs>),
    /// Time a Laplace-penalized fit on seeded synthetic data or a benchmark directory.
    Bench(BenchArgs),
    /// Run SQL with every epifusion function registered (`-c`, `-f`, or an interactive shell).
    Sql(SqlArgs),
    /// Serve SQL with every epifusion function over Arrow Flight SQL (ADBC, JDBC); read-only
    /// unless --allow-writes, a bearer token unless --insecure on loopback.
    Serve(Box<ServeArgs>),
    /// Convert an OMOP CSV dump to typed Parquet (one file per CDM table).
    Import(ImportArgs),
    /// Time the study-design builders (SCCS intervals, a Cox risk set) on a seeded synthetic
    /// OMOP store.
    BenchOmop(BenchOmopArgs),
    /// Run a pipeline file: validate, fit every analysis, write Parquet results, manifests and
    /// an HTML report (resumable: complete analyses are skipped).
    Run(RunArgs),
    /// Start a Ballista scheduler with every epifusion function (clients: `sql --cluster`).
    Scheduler(SchedulerArgs),
    /// Start a Ballista executor with every epifusion function, registered with a scheduler.
    Executor(ExecutorArgs),
}

/// The fit options table (`epifusion_core::options::FIT_OPTIONS`) for `epifusion fit --help`.
fn fit_options_help() -> String {
    format!(
        "Fit options (--options JSON keys; the flags above set the same keys):\n{}",
        epifusion::options::options_text()
    )
}

pub(crate) fn parse_model(s: &str) -> std::result::Result<ModelKind, String> {
    ModelKind::parse(s).map_err(|e| e.to_string())
}
pub(crate) fn parse_ties(s: &str) -> std::result::Result<Ties, String> {
    Ties::parse(s).map_err(|e| e.to_string())
}
pub(crate) fn parse_convergence(s: &str) -> std::result::Result<Convergence, String> {
    Convergence::parse(s).map_err(|e| e.to_string())
}
pub(crate) fn parse_device(s: &str) -> std::result::Result<Device, String> {
    Device::parse(s).map_err(|e| e.to_string())
}

pub(crate) fn parse_precision(s: &str) -> std::result::Result<Precision, String> {
    Precision::parse(s).map_err(|e| e.to_string())
}

pub(crate) fn runtime() -> Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("cannot start the async runtime")
}

pub(crate) fn needs_time(model: ModelKind) -> bool {
    model.needs_time()
}

pub(crate) fn summary_line(r: &FitResult, load_seconds: f64) -> String {
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
