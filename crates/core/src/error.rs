//! The library's error type: one enum with structured variants.

use thiserror::Error;

/// Everything that can go wrong in epifusion's library layer.
#[derive(Debug, Error)]
pub enum Error {
    /// A column is missing, has the wrong type, or is otherwise unusable.
    #[error("column `{column}`: {message}")]
    BadColumn {
        /// Column name.
        column: String,
        /// What is wrong with it.
        message: String,
    },
    /// A value in a given row is outside the model's domain (NaN, time ≤ 0, y ∉ {0,1}, …).
    #[error("outcome row {} (row_id {row_id}), column `{column}`: {message}", .row + 1)]
    BadValue {
        /// Zero-based index of the outcome row, in input order (messages show it 1-based, as
        /// the file readers number rows).
        row: usize,
        /// The row's `row_id`.
        row_id: i64,
        /// Column name.
        column: String,
        /// What is wrong with the value.
        message: String,
    },
    /// The same (row_id, covariate_id) pair appears more than once.
    #[error(
        "duplicate covariate: row_id {row_id}, covariate_id {covariate_id} appears more than once"
    )]
    DuplicateCovariate {
        /// Row id.
        row_id: i64,
        /// Covariate id.
        covariate_id: i64,
    },
    /// The same outcome row id appears more than once.
    #[error("duplicate outcome row: row_id {row_id} appears more than once")]
    DuplicateRow {
        /// Row id.
        row_id: i64,
    },
    /// A covariate refers to a row id with no outcome row.
    #[error("covariates: {count} entries refer to row ids with no outcome row (first: row_id {first_row_id})")]
    UnknownRow {
        /// Number of covariate entries with an unknown row id.
        count: usize,
        /// The first such row id.
        first_row_id: i64,
    },
    /// No usable data.
    #[error("empty input: {0}")]
    Empty(String),
    /// An option has a bad value or an unknown name.
    #[error("option `{option}`: {message}")]
    BadOption {
        /// Option name.
        option: String,
        /// What is wrong.
        message: String,
    },
    /// The fit was cancelled (its query was dropped or interrupted).
    #[error("cancelled")]
    Cancelled,
    /// The fit failed in a way that retries could not fix.
    #[error("fit failed: {0}")]
    FitFailed(String),
    /// Reading or writing data failed.
    #[error("I/O error on {path}: {source}")]
    Io {
        /// The file concerned.
        path: String,
        /// Underlying error.
        #[source]
        source: std::io::Error,
    },
    /// Arrow / Parquet decoding failed.
    #[error("data format error: {0}")]
    Format(String),
    /// An error with advice for the surface it reached (the CLI's flag, SQL's option, …).
    #[error("{source}; {hint}")]
    Hinted {
        /// The error.
        #[source]
        source: Box<Error>,
        /// What the user can do about it, in the words of their surface.
        hint: String,
    },
    /// A propensity model cannot be fitted or trusted (CohortMethod `createPs`'s errors): a
    /// single-arm cohort, no covariates, covariates too highly correlated with treatment or
    /// perfectly predicting it, a fit that did not converge. `covariate_ids` names the
    /// covariates concerned, when there are any.
    #[error("propensity model: {message}")]
    PropensityModel {
        /// Covariates concerned (may be empty).
        covariate_ids: Vec<i64>,
        /// What is wrong.
        message: String,
    },
    /// Device (GPU) problem.
    #[error("device error: {0}")]
    Device(String),
    /// NVRTC could not compile a kernel; `log` is the compiler's log, kept whole.
    #[error("device error: NVRTC could not compile kernels/{kernel}: {message}\n{log}")]
    Nvrtc {
        /// The kernel source file.
        kernel: String,
        /// NVRTC's error.
        message: String,
        /// The compilation log.
        log: String,
    },
}

/// Convenience alias.
pub type Result<T, E = Error> = std::result::Result<T, E>;

impl Error {
    /// Add advice for the user's surface to an [`Error::UnknownRow`] (other errors pass).
    pub fn hint_unknown_rows(self, hint: impl Into<String>) -> Self {
        match self {
            e @ Error::UnknownRow { .. } => Error::Hinted {
                source: Box::new(e),
                hint: hint.into(),
            },
            e => e,
        }
    }

    /// Shorthand for [`Error::BadOption`].
    pub fn option(option: impl Into<String>, message: impl Into<String>) -> Self {
        Error::BadOption {
            option: option.into(),
            message: message.into(),
        }
    }
}
