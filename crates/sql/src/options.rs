//! Fit options given as a JSON object (the SQL functions' `options` argument): deserialized
//! into [`epifusion_core::options::FitSpec`] and checked once by its `check` (the same model the
//! pipeline TOML and the CLI flags use). The keys, defaults and meanings are the one table
//! [`epifusion_core::options::FIT_OPTIONS`]:
//!
#![doc = include_str!("../../core/fit_options.md")]
//!
//! Unknown keys and wrong types are errors that name the key (`cv.folds`, …).

use serde_json::Value;

use epifusion_core::error::{Error, Result};
use epifusion_core::fit::{CiMethod, FitOptions};
use epifusion_core::model::ModelKind;
use epifusion_core::options::{FitSpec, FIT_OPTIONS};

/// Top-level keys accepted by [`parse_fit_options`] (from
/// [`epifusion_core::options::FIT_OPTIONS`]).
pub fn fit_option_keys() -> Vec<&'static str> {
    FIT_OPTIONS
        .iter()
        .map(|d| d.key)
        .filter(|k| !k.contains('.'))
        .collect()
}

/// Which table a `*_fit` table function returns (option `table`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum ResultTable {
    /// One row per coefficient.
    #[default]
    Coefficients,
    /// The cross-validation curve.
    Cv,
    /// Likelihood profiles.
    Profile,
    /// Bootstrap summaries per coefficient.
    Bootstrap,
    /// Every bootstrap replicate's estimates.
    Replicates,
    /// The regularization path: one row per (λ, coefficient).
    Path,
}

impl ResultTable {
    /// Parse the option value.
    pub fn parse(s: &str) -> Result<Self> {
        Ok(match s.to_ascii_lowercase().as_str() {
            "coefficients" | "estimates" => ResultTable::Coefficients,
            "cv" | "cv_curve" => ResultTable::Cv,
            "profile" | "profiles" => ResultTable::Profile,
            "bootstrap" => ResultTable::Bootstrap,
            "replicates" | "bootstrap_replicates" => ResultTable::Replicates,
            "path" | "lambda_path" => ResultTable::Path,
            other => {
                return Err(Error::option(
                    "table",
                    format!(
                        "unknown `{other}`; expected coefficients, cv, profile, bootstrap, \
                         replicates or path"
                    ),
                ))
            }
        })
    }
}

/// The `table` option of a JSON options string (the default when absent), checked against
/// the options `opts` parsed from the same string: `cv` needs `cv`, `profile` needs
/// `profile.grid`, `bootstrap` and `replicates` need `bootstrap` or `ci = bootstrap`, `path`
/// needs `path`.
pub fn parse_result_table(opts: &FitOptions, json: &str) -> Result<ResultTable> {
    let json = json.trim();
    if json.is_empty() {
        return Ok(ResultTable::Coefficients);
    }
    let value: Value = serde_json::from_str(json)
        .map_err(|e| Error::option("options", format!("not valid JSON: {e}")))?;
    let t = match value.get("table") {
        None | Some(Value::Null) => return Ok(ResultTable::Coefficients),
        Some(Value::String(s)) => ResultTable::parse(s)?,
        Some(other) => {
            return Err(Error::option(
                "table",
                format!("must be a string (got {other})"),
            ))
        }
    };
    let missing = match t {
        ResultTable::Cv if opts.cv.is_none() => Some("`table: cv` needs a `cv` option"),
        ResultTable::Profile if opts.profile.grid.is_none() => {
            Some("`table: profile` needs `profile` with `covariates` and `grid`")
        }
        ResultTable::Bootstrap | ResultTable::Replicates
            if opts.bootstrap.is_none() && opts.ci != CiMethod::Bootstrap =>
        {
            Some("this table needs a `bootstrap` option (or `ci: bootstrap`)")
        }
        ResultTable::Path if opts.path.is_none() => {
            Some("`table: path` needs a `path` option, e.g. `\"path\": {\"n\": 50}`")
        }
        _ => None,
    };
    match missing {
        Some(m) => Err(Error::option("table", m)),
        None => Ok(t),
    }
}

/// Deserialize a JSON options string (empty for the defaults) into a [`FitSpec`]; errors name
/// the key (`cv.folds: invalid type: …`).
pub fn parse_fit_spec(json: &str) -> Result<FitSpec> {
    let json = json.trim();
    if json.is_empty() {
        return Ok(FitSpec::default());
    }
    let value: Value = serde_json::from_str(json)
        .map_err(|e| Error::option("options", format!("not valid JSON: {e}")))?;
    if !value.is_object() {
        return Err(Error::option(
            "options",
            "must be a JSON object, e.g. '{\"prior\": \"laplace\", \"variance\": 0.1}'",
        ));
    }
    serde_path_to_error::deserialize(value).map_err(|e| {
        let path = e.path().to_string();
        let mut message = e.into_inner().to_string();
        // serde says "unknown field `x`, expected one of `a`, `b`": say it as the other
        // option errors do.
        if let Some(rest) = message.strip_prefix("unknown field `") {
            if let Some((_, expected)) = rest.split_once("`, expected ") {
                message = format!("unknown option; expected {}", expected.replace('`', ""));
            }
        }
        let key = if path.is_empty() || path == "." {
            "options".to_string()
        } else {
            path
        };
        Error::option(key, message)
    })
}

/// Parse and check a JSON options string (empty string or `{}` for the defaults) for `model`.
pub fn parse_fit_options(model: ModelKind, json: &str) -> Result<FitOptions> {
    parse_fit_spec(json)?.check(model)
}

#[cfg(test)]
mod tests {
    use super::*;
    use epifusion_core::model::prior::Prior;
    use epifusion_core::model::Ties;

    #[test]
    fn parses_and_validates() {
        let o = parse_fit_options(
            ModelKind::Cox,
            r#"{"prior":"laplace","variance":0.02,"exclude":[1000],"ties":"efron","ci":"wald","threads":2}"#,
        )
        .unwrap();
        assert_eq!(o.prior, Prior::Laplace { lambda: 10.0 });
        assert_eq!(o.exclude, vec![1000]);
        assert_eq!(o.ties, Ties::Efron);
        assert_eq!(o.ci, CiMethod::Wald);
        assert_eq!(o.threads, Some(2));
        assert!(parse_fit_options(ModelKind::Cox, "").is_ok());
        let e = parse_fit_options(ModelKind::Cox, r#"{"varience": 1}"#)
            .unwrap_err()
            .to_string();
        assert!(e.contains("varience"), "{e}");
        let e = parse_fit_options(ModelKind::Cox, r#"{"tolerance": "x"}"#)
            .unwrap_err()
            .to_string();
        assert!(e.contains("tolerance"), "{e}");
        let e = parse_fit_options(ModelKind::Cox, r#"{"max_iterations": 0}"#)
            .unwrap_err()
            .to_string();
        assert!(e.contains("max_iterations"), "{e}");
        assert!(parse_fit_options(ModelKind::Cox, "[1]").is_err());
        assert!(parse_fit_options(ModelKind::Cox, "{").is_err());
    }

    #[test]
    fn path_options_and_table() {
        let json = r#"{"path": {"n": 50, "min_ratio": 0.01}, "exclude": [7], "table": "path"}"#;
        let o = parse_fit_options(ModelKind::Cox, json).unwrap();
        assert!(o.path.is_some());
        assert_eq!(parse_result_table(&o, json).unwrap(), ResultTable::Path);
        let json = r#"{"path": [2.0, 1.0, 0.5]}"#;
        assert!(parse_fit_options(ModelKind::Cox, json)
            .unwrap()
            .path
            .is_some());
        let json = r#"{"lambda": 2, "table": "path"}"#;
        let o = parse_fit_options(ModelKind::Cox, json).unwrap();
        let e = parse_result_table(&o, json).unwrap_err().to_string();
        assert!(e.contains("table") && e.contains("path"), "{e}");
        for (json, key) in [
            (r#"{"path": {"n": "x"}}"#, "path.n"),
            (r#"{"path": {"steps": 3}}"#, "steps"),
            (r#"{"path": true, "lambda": 3}"#, "lambda"),
            (r#"{"path": true, "prior": "normal"}"#, "prior"),
            (r#"{"path": true, "cv": true}"#, "cv"),
        ] {
            let e = parse_fit_options(ModelKind::Cox, json)
                .unwrap_err()
                .to_string();
            assert!(e.contains(key), "{json}: {e}");
        }
    }
}

#[cfg(test)]
mod spec_tests {
    use super::*;

    #[test]
    fn nested_errors_name_the_key() {
        for (json, key) in [
            (r#"{"cv": {"folds": "x"}}"#, "cv.folds"),
            (r#"{"cv": {"fold": 3}}"#, "fold"),
            (r#"{"cv": {"threads": 2}}"#, "threads"),
            (
                r#"{"bootstrap": {"replicates": -1}}"#,
                "bootstrap.replicates",
            ),
            (
                r#"{"profile": {"grid": {"from": 1, "to": 0}}}"#,
                "profile.grid",
            ),
            (r#"{"threads": 100000}"#, "threads"),
            (r#"{"cv": 3}"#, "cv"),
        ] {
            let e = parse_fit_options(ModelKind::Cox, json)
                .unwrap_err()
                .to_string();
            assert!(e.contains(key), "{json}: {e}");
        }
        // `variance` without a prior is a Laplace prior (as on the CLI).
        let o = parse_fit_options(ModelKind::Cox, r#"{"variance": 0.5}"#).unwrap();
        assert_eq!(
            o.prior,
            epifusion_core::model::prior::Prior::Laplace { lambda: 2.0 }
        );
        assert!(fit_option_keys().contains(&"cv") && !fit_option_keys().contains(&"cv.folds"));
    }
}
