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
//! | `ci` | string | `"profile"` | `profile`, `wald`, `bootstrap` (percentile intervals of every coefficient) or `none` |
//! | `ci_level` | number | `0.95` | interval level |
//! | `device` | string | `"auto"` | `auto`, `cpu` or `cuda` (`auto` uses the CPU until the CUDA kernels are verified on a GPU; `cuda` without a usable GPU is an error) |
//! | `precision` | string | `"f64"` | design storage on the GPU: `f64`, or `f32` with f64 accumulation |
//! | `threads` | int | all cores | rayon threads |
//! | `cv` | object or `true` | – | choose the prior variance by cross-validation (below) |
//! | `bootstrap` | object or `true` | – | bootstrap the fit (below) |
//! | `profile` | object or array | – | profile intervals / likelihood profiles of chosen coefficients (below) |
//! | `table` | string | `"coefficients"` | what a `*_fit` table function returns: `coefficients`, `cv` (the CV curve), `profile` (likelihood profiles), `bootstrap` (per-coefficient bootstrap summary) or `replicates` (every bootstrap estimate) |
//!
//! `cv` keys (Cyclops' defaults): `folds` [10], `repetitions` [1], `seed` [1], `search`
//! [`"auto"`] or `"grid"`, `grid` (an array of variances, or `{"lower": 0.01, "upper": 20,
//! "steps": 10}`), `by` [`"auto"`: strata for SCCS / conditional logistic, rows otherwise] or
//! `"row"` / `"stratum"`, `start_variance` [Σ‖x_j‖²/(J·N)], `max_steps` [20]. Needs `prior`
//! `laplace` or `normal`; `variance`/`lambda` may then be omitted.
//!
//! `bootstrap` keys: `replicates` [200], `by` [`"auto"`], `seed` [1].
//!
//! `profile` keys: `covariates` (ids; an array alone is shorthand for this), `include_penalty`
//! [true], `grid` (`true` for CohortMethod's 1000 values of log 0.1 … log 10, an array of β
//! values, or `{"from": a, "to": b, "steps": n}`).
//!
//! Unknown keys and wrong types are errors that name the key.

use serde_json::{Map, Value};

use epifusion_core::backend::{Device, Precision};
use epifusion_core::error::{Error, Result};
use epifusion_core::fit::{CiMethod, FitOptions, ProfileOptions};
use epifusion_core::model::bootstrap::BootstrapOptions;
use epifusion_core::model::cv::{log_grid, CvOptions, CvSearch, Resampling};
use epifusion_core::model::prior::Prior;
use epifusion_core::model::{ModelKind, Ties};

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
    "precision",
    "threads",
    "cv",
    "bootstrap",
    "profile",
    "table",
];

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
            other => {
                return Err(Error::option(
                    "table",
                    format!(
                        "unknown `{other}`; expected coefficients, cv, profile, bootstrap or \
                         replicates"
                    ),
                ))
            }
        })
    }
}

/// The `table` option of a JSON options string (the default when absent), checked against
/// the options `opts` parsed from the same string: `cv` needs `cv`, `profile` needs
/// `profile.grid`, `bootstrap` and `replicates` need `bootstrap` or `ci = bootstrap`.
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
        _ => None,
    };
    match missing {
        Some(m) => Err(Error::option("table", m)),
        None => Ok(t),
    }
}

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
    if let Some(cv) = map.get("cv") {
        opts.cv = parse_cv(cv)?;
    }
    // With cross-validation the variance is chosen; a given one is only a placeholder.
    let placeholder = opts.cv.is_some() && variance.is_none() && lambda.is_none();
    opts.prior = if placeholder && family != "none" {
        Prior::from_parts(family, Some(1.0), None)?
    } else {
        Prior::from_parts(family, variance, lambda)?
    };
    if let Some(b) = map.get("bootstrap") {
        opts.bootstrap = parse_bootstrap(b)?;
    }
    if let Some(p) = map.get("profile") {
        opts.profile = parse_profile(p)?;
    }
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
        opts.ccd.convergence = epifusion_core::model::ccd::Convergence::parse(c)?;
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
    if let Some(p) = get_str(&map, "precision")? {
        opts.precision = Precision::parse(p)?;
    }
    if let Some(t) = get_usize(&map, "threads")? {
        opts.threads = Some(t);
    }
    opts.check()?;
    Ok(opts)
}

/// `true`/`false`/`null` or an object with only `keys`; returns the object (empty for `true`).
fn sub_object(value: &Value, name: &str, keys: &[&str]) -> Result<Option<Map<String, Value>>> {
    match value {
        Value::Null | Value::Bool(false) => Ok(None),
        Value::Bool(true) => Ok(Some(Map::new())),
        Value::Object(m) => {
            for k in m.keys() {
                if !keys.contains(&k.as_str()) {
                    return Err(Error::option(
                        format!("{name}.{k}"),
                        format!("unknown option; expected one of {}", keys.join(", ")),
                    ));
                }
            }
            Ok(Some(
                m.iter()
                    .map(|(k, v)| (format!("{name}.{k}"), v.clone()))
                    .collect(),
            ))
        }
        other => Err(Error::option(
            name,
            format!("must be an object or true (got {other})"),
        )),
    }
}

fn get_u64(map: &Map<String, Value>, key: &str) -> Result<Option<u64>> {
    get_usize(map, key).map(|v| v.map(|v| v as u64))
}

fn f64_array(v: &Value, key: &str) -> Result<Vec<f64>> {
    let arr = v
        .as_array()
        .ok_or_else(|| Error::option(key, format!("must be an array of numbers (got {v})")))?;
    arr.iter()
        .map(|x| {
            x.as_f64()
                .ok_or_else(|| Error::option(key, format!("`{x}` is not a number")))
        })
        .collect()
}

fn parse_cv(value: &Value) -> Result<Option<CvOptions>> {
    const KEYS: &[&str] = &[
        "folds",
        "repetitions",
        "seed",
        "search",
        "grid",
        "by",
        "start_variance",
        "max_steps",
    ];
    let Some(m) = sub_object(value, "cv", KEYS)? else {
        return Ok(None);
    };
    let mut o = CvOptions::default();
    if let Some(k) = get_usize(&m, "cv.folds")? {
        o.folds = k;
    }
    if let Some(k) = get_usize(&m, "cv.repetitions")? {
        o.repetitions = k;
    }
    if let Some(k) = get_u64(&m, "cv.seed")? {
        o.seed = k;
    }
    if let Some(k) = get_usize(&m, "cv.max_steps")? {
        o.max_steps = k;
    }
    o.start_variance = get_f64(&m, "cv.start_variance")?;
    if let Some(b) = get_str(&m, "cv.by")? {
        o.by = Resampling::parse("cv.by", b)?;
    }
    let grid = match m.get("cv.grid") {
        None | Some(Value::Null) => None,
        Some(v @ Value::Array(_)) => Some(f64_array(v, "cv.grid")?),
        Some(Value::Object(g)) => {
            let g: Map<String, Value> = g
                .iter()
                .map(|(k, v)| (format!("cv.grid.{k}"), v.clone()))
                .collect();
            for k in g.keys() {
                if !["cv.grid.lower", "cv.grid.upper", "cv.grid.steps"].contains(&k.as_str()) {
                    return Err(Error::option(
                        k,
                        "unknown option; expected lower, upper, steps",
                    ));
                }
            }
            let lower = get_f64(&g, "cv.grid.lower")?.unwrap_or(0.01);
            let upper = get_f64(&g, "cv.grid.upper")?.unwrap_or(20.0);
            let steps = get_usize(&g, "cv.grid.steps")?.unwrap_or(10);
            if !(lower > 0.0 && upper >= lower && steps >= 1) {
                return Err(Error::option(
                    "cv.grid",
                    "needs 0 < lower ≤ upper and steps ≥ 1",
                ));
            }
            Some(log_grid(lower, upper, steps))
        }
        Some(other) => {
            return Err(Error::option(
                "cv.grid",
                format!("must be an array of variances or {{lower, upper, steps}} (got {other})"),
            ))
        }
    };
    let search = get_str(&m, "cv.search")?.map(|s| s.to_ascii_lowercase());
    match (search.as_deref(), grid) {
        (None | Some("grid"), Some(g)) => o.search = CvSearch::Grid(g),
        (Some("grid"), None) => o.search = CvSearch::Grid(log_grid(0.01, 20.0, 10)),
        (None | Some("auto"), None) => {}
        (Some("auto"), Some(_)) => {
            return Err(Error::option(
                "cv.grid",
                "a grid is only used with `search: grid`",
            ))
        }
        (Some(s), _) => {
            return Err(Error::option(
                "cv.search",
                format!("unknown `{s}`; expected auto or grid"),
            ))
        }
    }
    o.check()?;
    Ok(Some(o))
}

fn parse_bootstrap(value: &Value) -> Result<Option<BootstrapOptions>> {
    let Some(m) = sub_object(value, "bootstrap", &["replicates", "by", "seed"])? else {
        return Ok(None);
    };
    let mut o = BootstrapOptions::default();
    if let Some(k) = get_usize(&m, "bootstrap.replicates")? {
        o.replicates = k;
    }
    if let Some(k) = get_u64(&m, "bootstrap.seed")? {
        o.seed = k;
    }
    if let Some(b) = get_str(&m, "bootstrap.by")? {
        o.by = Resampling::parse("bootstrap.by", b)?;
    }
    o.check()?;
    Ok(Some(o))
}

fn parse_profile(value: &Value) -> Result<ProfileOptions> {
    let mut o = ProfileOptions::default();
    let ids = |v: &Value| -> Result<Vec<i64>> {
        let arr = v.as_array().ok_or_else(|| {
            Error::option("profile.covariates", "must be an array of covariate ids")
        })?;
        arr.iter()
            .map(|x| {
                x.as_i64().ok_or_else(|| {
                    Error::option(
                        "profile.covariates",
                        format!("`{x}` is not an integer covariate id"),
                    )
                })
            })
            .collect()
    };
    if value.is_array() {
        o.covariates = ids(value)?;
        return Ok(o);
    }
    let Some(m) = sub_object(value, "profile", &["covariates", "include_penalty", "grid"])? else {
        return Ok(o);
    };
    if let Some(v) = m.get("profile.covariates") {
        o.covariates = ids(v)?;
    }
    match m.get("profile.include_penalty") {
        None | Some(Value::Null) => {}
        Some(Value::Bool(b)) => o.include_penalty = *b,
        Some(other) => {
            return Err(Error::option(
                "profile.include_penalty",
                format!("must be true or false (got {other})"),
            ))
        }
    }
    o.grid = match m.get("profile.grid") {
        None | Some(Value::Null) | Some(Value::Bool(false)) => None,
        Some(Value::Bool(true)) => Some(epifusion_core::fit::default_profile_grid()),
        Some(v @ Value::Array(_)) => Some(f64_array(v, "profile.grid")?),
        Some(Value::Object(g)) => {
            let g: Map<String, Value> = g
                .iter()
                .map(|(k, v)| (format!("profile.grid.{k}"), v.clone()))
                .collect();
            for k in g.keys() {
                if !["profile.grid.from", "profile.grid.to", "profile.grid.steps"]
                    .contains(&k.as_str())
                {
                    return Err(Error::option(k, "unknown option; expected from, to, steps"));
                }
            }
            let from = get_f64(&g, "profile.grid.from")?
                .ok_or_else(|| Error::option("profile.grid.from", "is required"))?;
            let to = get_f64(&g, "profile.grid.to")?
                .ok_or_else(|| Error::option("profile.grid.to", "is required"))?;
            let steps = get_usize(&g, "profile.grid.steps")?.unwrap_or(100);
            if !(to > from && steps >= 2) {
                return Err(Error::option(
                    "profile.grid",
                    "needs from < to and steps ≥ 2",
                ));
            }
            Some(
                (0..steps)
                    .map(|i| from + (to - from) * i as f64 / (steps - 1) as f64)
                    .collect(),
            )
        }
        Some(other) => {
            return Err(Error::option(
                "profile.grid",
                format!("must be true, an array or {{from, to, steps}} (got {other})"),
            ))
        }
    };
    Ok(o)
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
