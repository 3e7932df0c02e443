//! Pipelines: declarative study files that `epifusion run` executes safely and repeatably.
//!
//! * [`spec`]: the TOML file format and the checks that need no data;
//! * [`plan`]: analysis units (every combination of an analysis' concept sets), placeholders,
//!   fingerprints, and the checks against the OMOP store;
//! * [`tables`]: the seam analysis → study tables (SQL today; SCCS and cohort designs, #4);
//! * [`output`]: the output location, manifests, atomic writes;
//! * [`lock`]: one run at a time per output location (lock file or conditional PUT);
//! * [`run`]: the runner (dry run, resume, fits, Parquet results, manifests, report);
//! * [`report`]: the HTML report with the SVG forest plot;
//! * [`progress`]: progress bars on a terminal, log lines otherwise.
//!
//! The file format, output layout and the atomicity, resume and retry rules are in the README
//! and in `pipelines/README.md`.

pub mod cohort_adjust;
pub mod cohort_calibration;
pub mod cohort_results;
pub mod lock;
pub mod many;
pub mod output;
pub mod plan;
pub mod progress;
pub mod remote;
pub mod report;
pub mod run;
pub mod sccs_results;
pub mod sccs_series;
pub mod spec;
pub mod tables;

/// Everything that can go wrong in a pipeline.
#[derive(Debug, thiserror::Error)]
pub enum PipelineError {
    /// TOML syntax, unknown key or wrong type.
    #[error("{file}:{line}:{column}: {message}")]
    Parse {
        /// Pipeline file.
        file: String,
        /// 1-based line.
        line: usize,
        /// 1-based column.
        column: usize,
        /// The parser's message (names the key).
        message: String,
    },
    /// A value that parses but is not valid (names, references, options, store contents).
    #[error("{file}:{line}:{column}: {key}: {message}")]
    Invalid {
        /// Pipeline file.
        file: String,
        /// 1-based line.
        line: usize,
        /// 1-based column.
        column: usize,
        /// The key.
        key: String,
        /// What is wrong.
        message: String,
    },
    /// A file could not be read.
    #[error("{path}: {message}")]
    Io {
        /// Path.
        path: String,
        /// Reason.
        message: String,
    },
    /// The source store could not be opened or read.
    #[error("OMOP store {location}: {message}")]
    Source {
        /// Store location.
        location: String,
        /// Reason.
        message: String,
    },
    /// Writing or reading the output location failed (after the retries).
    #[error("output {location}: {message}")]
    Output {
        /// Output location.
        location: String,
        /// Reason.
        message: String,
    },
    /// Another run holds the output location's lock.
    #[error("output locked: {lock} is held by {holder}; {remedy}")]
    Locked {
        /// The lock (path or URL).
        lock: String,
        /// Who holds it (run id, pid, host, start time).
        holder: String,
        /// What to do about it.
        remedy: String,
    },
    /// Building the tables or fitting one analysis failed.
    #[error("analysis `{analysis}`: {message}")]
    Analysis {
        /// Unit id.
        analysis: String,
        /// Reason.
        message: String,
    },
    /// Some analyses failed; the others are complete (see the log).
    #[error("{failed} of {total} analyses failed; the run is not complete (rerun to resume):\n{details}")]
    Incomplete {
        /// Failed units.
        failed: usize,
        /// All units.
        total: usize,
        /// One line per failure.
        details: String,
    },
    /// A DataFusion error outside any analysis.
    #[error(transparent)]
    DataFusion(#[from] datafusion::error::DataFusionError),
}
