//! Fit options given as a JSON object (the SQL functions' `options` argument).
//!
//! | key | type | default | meaning |
//! |---|---|---|---|
//! | `prior` | string | `"none"` | `none`, `laplace` or `normal` |
//! | `variance` | number | – | prior variance (Laplace λ = √(2/v)) |
//! | `lambda` | number | – | Laplace λ (objective LL − λΣ\|β\|), or the ridge λ (σ² = 1/λ) |
//! | `exclude` | array of ints | `[]` | covariate ids never penalized |
//! | `ties` | string | `"breslow"` | `breslow` or `efron` |
//! | `convergence` | string | `"objective"` | `objective` (relative change) or `gradient` (KKT violation) |
//! | `tolerance` | number | `1e-6` | threshold of the convergence rule |
//! | `max_iterations` | int | `1000` | full CCD cycles |
//! | `ci` | string | `"profile"` | `profile`, `wald` or `none` |
//! | `ci_level` | number | `0.95` | interval level |
//! | `device` | string | `"auto"` | `auto`, `cpu` or `cuda` |
//! | `threads` | int | all cores | rayon threads |
//!
//! Unknown keys and wrong types are errors that name the key.

use serde_json::{Map, Value};

use crate::backend::Device;
use crate::error::{Error, Result};
use crate::fit::{CiMethod, FitOptions};
use crate::model::prior::Prior;
use crate::model::{ModelKind, Ties};

/// Keys accepted by [`parse_fit_options`].
pub const FIT_OPTION_KEYS: &[&str] = &[
    "prior",
    "variance",
    "lambda",
    "exclude",
    "ties",
    "convergence",
    "tolerance",
    "max_iterations",
    "ci",
    "ci_level",
    "device",
    "threads",
];

/// Parse a JSON options string (empty string or `{}` for the defaults) for `model`.
pub fn parse_fit_options(model: ModelKind, json: &str) -> Result<FitOptions> {
    let mut opts = FitOptions::new(model);
    let json = json.trim();
    if json.is_empty() {
        return Ok(opts);
    }
    let value: Value = serde_json::from_str(json)
        .map_err(|e| Error::option("options", format!("not valid JSON: {e}")))?;
    let Value::Object(map) = value else {
        return Err(Error::option(
            "options",
            "must be a JSON object, e.g. '{\"prior\": \"laplace\", \"variance\": 0.1}'",
        ));
    };
    for key in map.keys() {
        if !FIT_OPTION_KEYS.contains(&key.as_str()) {
            return Err(Error::option(
                key,
                format!(
                    "unknown option; expected one of {}",
                    FIT_OPTION_KEYS.join(", ")
                ),
            ));
        }
    }
    let family = get_str(&map, "prior")?.unwrap_or("none");
    let variance = get_f64(&map, "variance")?;
    let lambda = get_f64(&map, "lambda")?;
    opts.prior = Prior::from_parts(family, variance, lambda)?;
    if let Some(v) = map.get("exclude") {
        let arr = v
            .as_array()
            .ok_or_else(|| Error::option("exclude", "must be an array of covariate ids"))?;
        opts.exclude = arr
            .iter()
            .map(|x| {
                x.as_i64().ok_or_else(|| {
                    Error::option("exclude", format!("`{x}` is not an integer covariate id"))
                })
            })
            .collect::<Result<_>>()?;
    }
    if let Some(t) = get_str(&map, "ties")? {
        opts.ties = Ties::parse(t)?;
    }
    if let Some(c) = get_str(&map, "convergence")? {
        opts.ccd.convergence = crate::model::ccd::Convergence::parse(c)?;
    }
    if let Some(t) = get_f64(&map, "tolerance")? {
        opts.ccd.tolerance = t;
    }
    if let Some(n) = get_usize(&map, "max_iterations")? {
        opts.ccd.max_iterations = n;
    }
    if let Some(c) = get_str(&map, "ci")? {
        opts.ci = CiMethod::parse(c)?;
    }
    if let Some(l) = get_f64(&map, "ci_level")? {
        opts.ci_level = l;
    }
    if let Some(d) = get_str(&map, "device")? {
        opts.device = Device::parse(d)?;
    }
    if let Some(t) = get_usize(&map, "threads")? {
        opts.threads = Some(t);
    }
    opts.check()?;
    Ok(opts)
}

fn get_str<'a>(map: &'a Map<String, Value>, key: &str) -> Result<Option<&'a str>> {
    match map.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(s)) => Ok(Some(s)),
        Some(other) => Err(Error::option(
            key,
            format!("must be a string (got {other})"),
        )),
    }
}

fn get_f64(map: &Map<String, Value>, key: &str) -> Result<Option<f64>> {
    match map.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::Number(n)) => Ok(n.as_f64()),
        Some(other) => Err(Error::option(
            key,
            format!("must be a number (got {other})"),
        )),
    }
}

fn get_usize(map: &Map<String, Value>, key: &str) -> Result<Option<usize>> {
    match map.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::Number(n)) => n
            .as_u64()
            .map(|v| Some(v as usize))
            .ok_or_else(|| Error::option(key, format!("must be a non-negative integer (got {n})"))),
        Some(other) => Err(Error::option(
            key,
            format!("must be an integer (got {other})"),
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
}
