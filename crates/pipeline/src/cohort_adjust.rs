//! Propensity-score adjustment of a cohort analysis, as CohortMethod's `runCmAnalyses` does it
//! (issue #14): `[analysis.cohort.ps]` (the `createPs` settings) and
//! `[analysis.cohort.adjustment]` (trimming, then matching, stratification or IPTW weights).
//!
//! # Settings
//!
//! `[analysis.cohort.ps]`: the keys of [`PsSettings`] (an empty table is `createPs`' defaults:
//! Laplace prior chosen by auto cross-validation, 10 folds × 10 repetitions, starting variance
//! 0.01, tolerance 2e-7, seed 1, no sampling, an error when a covariate's |r| with treatment is
//! ≥ 0.5).
//!
//! `[analysis.cohort.adjustment]`:
//!
//! | key | default | meaning |
//! |---|---|---|
//! | `method` | required | `match`, `stratify`, `weight` or `none` (PS, balance and diagnostics only) |
//! | `trim_fraction` | – | CohortMethod's `trimByPs`: drop this fraction of each arm's tail, in [0, 1] |
//! | `equipoise_bounds` | – | `trimByPsToEquipoise`: keep preference scores in `[lo, hi]` |
//! | `use_covariates` | false | the outcome model also takes the baseline covariates (with the `[analysis.fit]` prior) |
//! | `caliper` | 0.2 | `match`: caliper, ≥ 0 (0: none) |
//! | `caliper_scale` | `standardized_logit` | `match`: `propensity_score`, `standardized` or `standardized_logit` (or R's spelling with spaces) |
//! | `max_ratio` | 1 | `match`: most comparators per target subject (0: no maximum) |
//! | `allow_reverse_match` | false | `match`: swap the arms when the target arm is larger |
//! | `number_of_strata` | 5 | `stratify`: quantile strata |
//! | `base_selection` | `all` | `stratify`: whose scores define the quantiles (`all`, `target`, `comparator`) |
//! | `estimator` | `att` | `weight`: `ate`, `att` or `overlap` (also `ato`) |
//! | `stabilized` | true | `weight`: stabilized weights (ate, att) |
//! | `max_weight` | – | `weight`: truncate weights above this value |
//! | `truncate_quantile` | – | `weight`: truncate weights above this quantile |
//!
//! # What happens in a run
//!
//! The propensity model is fitted **once per analysis, target and comparator** on the study
//! population *before* the outcome-specific removal of subjects with a prior outcome (the same
//! entries for every outcome; CohortMethod's shared PS) and kept in a [`PsCache`] for the run;
//! every outcome unit takes the scores of its own entries. Then trimming, then the method:
//! matched sets or strata become the outcome table's `stratum_id` (a stratified Cox / Fine–Gray
//! outcome model; design strata, if any, are crossed: subjects are matched within them), IPTW
//! weights its `weight` column (with `se = "robust"` unless `[analysis.fit]` says otherwise).
//! The outcome model holds the treatment alone unless `use_covariates = true`. Attrition gains
//! one row per trimming and matching step.

use std::collections::{BTreeSet, HashMap, HashSet};
use std::sync::Arc;
use std::time::Instant;

use datafusion::arrow::array::{
    Array, ArrayRef, BooleanArray, Float64Array, Int64Array, RecordBatch, StringArray,
};
use datafusion::arrow::compute::{cast, concat_batches, filter_record_batch, take_record_batch};
use datafusion::arrow::datatypes::{DataType, Field, Schema};
use datafusion::common::{exec_datafusion_err, exec_err, Result as DfResult};
use datafusion::prelude::SessionContext;
use serde::Deserialize;

use epifusion_core::cohort::balance::{covariate_balance, AdjustedPopulation, Adjustment, Balance};
use epifusion_core::cohort::diagnostics::{
    evaluate, DiagnosticThresholds, DiagnosticValues, Diagnostics,
};
use epifusion_core::cohort::km::{kaplan_meier_by_arm, ArmCurves};
use epifusion_core::cohort::matching::{match_on_ps, MatchSettings};
use epifusion_core::cohort::power::{mdrr_summary, MdrrSettings, MdrrSummary};
use epifusion_core::cohort::preference::{equipoise, preference_scores, EquipoiseSettings};
use epifusion_core::cohort::ps::{fit_propensity, PropensityScoreFit, PsSettings};
use epifusion_core::cohort::stratify::{stratify_by_ps, StratifySettings};
use epifusion_core::cohort::trim::TrimSettings;
use epifusion_core::cohort::weights::{iptw, IptwSettings};
use epifusion_core::cohort::{AttritionStep, SparseCovariates};
use epifusion_sql::fit_table::run_blocking;
use epifusion_sql::study::{self, CohortDesign};

use super::plan::{Analysis, Design};
use super::tables::StudyTables;

/// The keys of `[analysis.cohort]` that this module reads (never passed to `CohortDesign`).
pub const COHORT_KEYS: [&str; 2] = ["ps", "adjustment"];

/// Covariate id of the treatment in the cohort design's covariates.
const TREATMENT_ID: i64 = study::cohort::TREATMENT_ID;

/// The adjustment method.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Method {
    /// Matching on the propensity score; matched sets are the outcome model's strata.
    Match,
    /// Quantile strata of the propensity score.
    Stratify,
    /// Inverse probability of treatment weights.
    Weight,
    /// No adjustment (propensity model, balance and diagnostics only).
    None,
}

impl Method {
    /// The name written in the pipeline.
    pub fn name(self) -> &'static str {
        match self {
            Method::Match => "match",
            Method::Stratify => "stratify",
            Method::Weight => "weight",
            Method::None => "none",
        }
    }
}

const COMMON_KEYS: &[&str] = &[
    "method",
    "trim_fraction",
    "equipoise_bounds",
    "use_covariates",
];
const METHOD_KEYS: &[(Method, &[&str])] = &[
    (
        Method::Match,
        &[
            "caliper",
            "caliper_scale",
            "max_ratio",
            "allow_reverse_match",
        ],
    ),
    (Method::Stratify, &["number_of_strata", "base_selection"]),
    (
        Method::Weight,
        &["estimator", "stabilized", "max_weight", "truncate_quantile"],
    ),
];

/// The checked settings of `[analysis.cohort.ps]` and `[analysis.cohort.adjustment]`.
#[derive(Debug, Clone, PartialEq)]
pub struct AdjustmentSettings {
    /// Propensity model.
    pub ps: PsSettings,
    /// Method.
    pub method: Method,
    /// Trimming before the method.
    pub trim: TrimSettings,
    /// Whether the outcome model takes the baseline covariates.
    pub use_covariates: bool,
    /// `match` settings.
    pub matching: MatchSettings,
    /// `stratify` settings.
    pub stratify: StratifySettings,
    /// `weight` settings.
    pub weights: IptwSettings,
}

/// A settings error: the key path inside `[analysis.cohort]` and the message.
pub type SettingsError = (Vec<String>, String);

fn from_json<T: serde::de::DeserializeOwned>(
    table: &str,
    value: serde_json::Value,
) -> Result<T, SettingsError> {
    serde_path_to_error::deserialize(value).map_err(|e| {
        let mut path: Vec<String> = vec![table.to_string()];
        path.extend(e.path().iter().filter_map(|s| match s {
            serde_path_to_error::Segment::Map { key } => Some(key.clone()),
            _ => None,
        }));
        let message = e.inner().to_string();
        // "unknown field `x`, expected one of …": the key is `x`.
        if let Some(k) = message
            .strip_prefix("unknown field `")
            .and_then(|r| r.split('`').next())
        {
            path.push(k.to_string());
        }
        (path, message)
    })
}

fn checked(table: &str, r: epifusion_core::Result<()>) -> Result<(), SettingsError> {
    r.map_err(|e| match e {
        epifusion_core::Error::BadOption { option, message } => {
            (vec![table.to_string(), option], message)
        }
        other => (vec![table.to_string()], other.to_string()),
    })
}

/// Read and check the adjustment settings of a `[analysis.cohort]` table: `None` when it has
/// neither `ps` nor `adjustment` (the crude design of before).
pub fn settings(cohort: &toml::Table) -> Result<Option<AdjustmentSettings>, SettingsError> {
    let (ps, adjustment) = (cohort.get("ps"), cohort.get("adjustment"));
    if ps.is_none() && adjustment.is_none() {
        return Ok(None);
    }
    let as_json = |key: &str, v: &toml::Value| match v {
        toml::Value::Table(t) => {
            serde_json::to_value(t).map_err(|e| (vec![key.to_string()], e.to_string()))
        }
        _ => Err((
            vec![key.to_string()],
            format!("is a table ([analysis.cohort.{key}])"),
        )),
    };
    let ps: PsSettings = match ps {
        Some(v) => from_json("ps", as_json("ps", v)?)?,
        None => PsSettings::default(),
    };
    checked("ps", ps.check())?;
    let mut adj = match adjustment {
        Some(v) => match as_json("adjustment", v)? {
            serde_json::Value::Object(m) => m,
            _ => serde_json::Map::new(),
        },
        None => {
            let mut m = serde_json::Map::new();
            m.insert("method".into(), "none".into());
            m
        }
    };
    let key_err = |k: &str, m: String| (vec!["adjustment".to_string(), k.to_string()], m);
    let method: Method = match adj.remove("method") {
        Some(v) => serde_json::from_value(v.clone()).map_err(|_| {
            key_err(
                "method",
                format!("unknown method {v}; expected one of match, stratify, weight, none"),
            )
        })?,
        None => {
            return Err(key_err(
                "method",
                "missing `method` (match, stratify, weight or none)".into(),
            ))
        }
    };
    let mut trim = serde_json::Map::new();
    for k in ["trim_fraction", "equipoise_bounds"] {
        if let Some(v) = adj.remove(k) {
            trim.insert(k.into(), v);
        }
    }
    let trim: TrimSettings = from_json("adjustment", serde_json::Value::Object(trim))?;
    checked("adjustment", trim.check())?;
    let use_covariates = match adj.remove("use_covariates") {
        None => false,
        Some(serde_json::Value::Bool(b)) => b,
        Some(v) => return Err(key_err("use_covariates", format!("a bool, got {v}"))),
    };
    if let Some(serde_json::Value::String(e)) = adj.get_mut("estimator") {
        if e == "overlap" {
            *e = "ato".into();
        }
    }
    // Every remaining key belongs to the chosen method.
    let own: &[&str] = METHOD_KEYS
        .iter()
        .find(|(m, _)| *m == method)
        .map_or(&[], |(_, k)| k);
    for k in adj.keys() {
        if own.contains(&k.as_str()) {
            continue;
        }
        let message = match METHOD_KEYS
            .iter()
            .find(|(_, keys)| keys.contains(&k.as_str()))
        {
            Some((m, _)) => format!(
                "`{k}` is a setting of method = \"{}\", not of \"{}\"",
                m.name(),
                method.name()
            ),
            None => {
                let mut known: Vec<&str> = COMMON_KEYS.to_vec();
                known.extend(own);
                format!("unknown key `{k}`; expected one of {}", known.join(", "))
            }
        };
        return Err(key_err(k, message));
    }
    let rest = serde_json::Value::Object(adj);
    let mut s = AdjustmentSettings {
        ps,
        method,
        trim,
        use_covariates,
        matching: MatchSettings::default(),
        stratify: StratifySettings::default(),
        weights: IptwSettings::default(),
    };
    match method {
        Method::Match => {
            s.matching = from_json("adjustment", rest)?;
            checked("adjustment", s.matching.check())?;
        }
        Method::Stratify => {
            s.stratify = from_json("adjustment", rest)?;
            checked("adjustment", s.stratify.check())?;
        }
        Method::Weight => {
            s.weights = from_json("adjustment", rest)?;
            checked("adjustment", s.weights.check())?;
        }
        Method::None => {}
    }
    Ok(Some(s))
}

/// `[analysis.cohort]` without the keys of this module (what `CohortDesign` reads).
pub fn strip(design: &mut serde_json::Map<String, serde_json::Value>) {
    for k in COHORT_KEYS {
        design.remove(k);
    }
}

/// The fit options of the outcome model: IPTW weights take robust standard errors unless the
/// pipeline chose `se`.
pub fn outcome_fit_options(design: &Design, mut options: serde_json::Value) -> serde_json::Value {
    if let Design::Cohort(t) = design {
        if let Ok(Some(s)) = settings(t) {
            if s.method == Method::Weight {
                if let serde_json::Value::Object(m) = &mut options {
                    m.entry("se").or_insert_with(|| "robust".into());
                }
            }
        }
    }
    options
}

/// The propensity model of one analysis, target and comparator, shared by its outcomes.
#[derive(Debug)]
pub struct SharedPs {
    /// Entry ids (`row_id`) of the population the model was fitted on, increasing.
    pub row_ids: Vec<i64>,
    index: HashMap<i64, usize>,
    /// Treatment of each entry.
    pub treatment: Vec<bool>,
    /// Baseline covariates (treatment excluded), one row per entry.
    pub covariates: SparseCovariates,
    /// The fit (scores in `row_ids` order, non-zero coefficients).
    pub fit: PropensityScoreFit,
    /// Seconds to build the population and covariates.
    pub build_seconds: f64,
    /// Seconds of the fit (cross-validation included).
    pub fit_seconds: f64,
}

/// Propensity models fitted in this run, by analysis, target and comparator.
#[derive(Debug, Default)]
pub struct PsCache {
    fitted: tokio::sync::Mutex<HashMap<String, Arc<SharedPs>>>,
}

impl PsCache {
    /// An empty cache.
    pub fn new() -> Self {
        PsCache::default()
    }
}

fn column<'a>(b: &'a RecordBatch, name: &str) -> DfResult<&'a ArrayRef> {
    b.column_by_name(name)
        .ok_or_else(|| exec_datafusion_err!("the cohort outcome table has no `{name}` column"))
}

fn i64s(b: &RecordBatch, name: &str) -> DfResult<Vec<i64>> {
    let c = cast(column(b, name)?, &DataType::Int64)?;
    let c = c
        .as_any()
        .downcast_ref::<Int64Array>()
        .ok_or_else(|| exec_datafusion_err!("`{name}` is not an integer column"))?;
    if c.null_count() > 0 {
        return exec_err!("`{name}` has NULLs");
    }
    Ok(c.values().to_vec())
}

fn f64s(b: &RecordBatch, name: &str) -> DfResult<Vec<f64>> {
    let c = cast(column(b, name)?, &DataType::Float64)?;
    let c = c
        .as_any()
        .downcast_ref::<Float64Array>()
        .ok_or_else(|| exec_datafusion_err!("`{name}` is not a numeric column"))?;
    if c.null_count() > 0 {
        return exec_err!("`{name}` has NULLs");
    }
    Ok(c.values().to_vec())
}

fn core_err(e: epifusion_core::Error) -> datafusion::error::DataFusionError {
    exec_datafusion_err!("{e}")
}

/// The design of unit `a`'s propensity-score population: the cohort before the
/// outcome-specific step (the same entries for every outcome); `None` for a unit without
/// `[analysis.cohort.ps]` / `[analysis.cohort.adjustment]`.
pub(crate) fn ps_design(a: &Analysis) -> DfResult<Option<CohortDesign>> {
    let Design::Cohort(cohort) = &a.design else {
        return Ok(None);
    };
    if !matches!(settings(cohort), Ok(Some(_))) {
        return Ok(None);
    }
    let json = super::tables::cohort_settings(a, cohort)?;
    let mut d = CohortDesign::from_json(&json)?;
    d.remove_subjects_with_prior_outcome = false;
    Ok(Some(d))
}

/// Fit the shared propensity model of unit `a` (see the module documentation) on its
/// population, built here or `prebuilt` (the outcomes and covariates of [`ps_design`], built
/// by a cluster's distributed queries).
async fn fit_shared(
    ctx: &SessionContext,
    a: &Analysis,
    settings: &PsSettings,
    prebuilt: Option<StudyTables>,
) -> DfResult<SharedPs> {
    let t0 = Instant::now();
    let tables = match prebuilt {
        Some(t) => t,
        None => {
            let d = ps_design(a)?
                .ok_or_else(|| exec_datafusion_err!("analysis `{}` has no [cohort.ps]", a.name))?;
            super::tables::from_study(study::build_cohort(ctx, &d).await?)
        }
    };
    let outcomes = concat_all(&tables.outcomes)?;
    let row_ids = i64s(&outcomes, "row_id")?;
    let treatment: Vec<bool> = i64s(&outcomes, "treatment")?
        .into_iter()
        .map(|t| t == 1)
        .collect();
    let index: HashMap<i64, usize> = row_ids.iter().enumerate().map(|(i, &r)| (r, i)).collect();
    if index.len() != row_ids.len() {
        return exec_err!("the cohort population has duplicate row_id values");
    }
    let mut entries = Vec::new();
    for b in &tables.covariates {
        let (rows, ids) = (i64s(b, "row_id")?, i64s(b, "covariate_id")?);
        let values = match b.column_by_name("covariate_value") {
            Some(_) => f64s(b, "covariate_value")?,
            None => vec![1.0; rows.len()],
        };
        for ((r, id), v) in rows.into_iter().zip(ids).zip(values) {
            if id == TREATMENT_ID {
                continue;
            }
            let Some(&i) = index.get(&r) else { continue };
            entries.push((i as u32, id, v));
        }
    }
    let covariates = SparseCovariates::from_triplets(row_ids.len(), &entries).map_err(core_err)?;
    let build_seconds = t0.elapsed().as_secs_f64();
    let t1 = Instant::now();
    let (treatment, covariates, settings) =
        (Arc::new(treatment), Arc::new(covariates), settings.clone());
    let (tr, cv) = (treatment.clone(), covariates.clone());
    let fit = run_blocking("the propensity fit", move || {
        fit_propensity(&tr, &cv, &settings)
    })
    .await?;
    let fit_seconds = t1.elapsed().as_secs_f64();
    Ok(SharedPs {
        row_ids,
        index,
        treatment: Arc::try_unwrap(treatment).unwrap_or_else(|t| (*t).clone()),
        covariates: Arc::try_unwrap(covariates).unwrap_or_else(|c| (*c).clone()),
        fit,
        build_seconds,
        fit_seconds,
    })
}

fn concat_all(batches: &[RecordBatch]) -> DfResult<RecordBatch> {
    let first = batches
        .first()
        .ok_or_else(|| exec_datafusion_err!("the cohort outcome table has no batches"))?;
    Ok(concat_batches(&first.schema(), batches)?)
}

/// Everything the adjustment computed for one unit (the results tables and the report read it).
#[derive(Debug)]
pub struct Adjusted {
    /// The settings.
    pub settings: AdjustmentSettings,
    /// The shared propensity model.
    pub shared: Arc<SharedPs>,
    /// Treatment of the unit's study population (before trimming).
    pub treatment: Vec<bool>,
    /// Propensity scores of the unit's study population.
    pub propensity_score: Vec<f64>,
    /// Preference scores of the unit's study population.
    pub preference_score: Vec<f64>,
    /// Share of the population with a preference score in [0.3, 0.7].
    pub equipoise: f64,
    /// Covariate balance before (the study population) and after adjustment.
    pub balance: Balance,
    /// MDRR of the adjusted population.
    pub mdrr: Option<MdrrSummary>,
    /// The diagnostic values.
    pub values: DiagnosticValues,
    /// Their judgement.
    pub diagnostics: Diagnostics,
    /// Kaplan–Meier curves of both arms (adjusted for matched sets or strata); `Err` says why
    /// there are none.
    pub km: Result<ArmCurves, String>,
    /// Follow-up (days at risk) of each arm of the adjusted population.
    pub follow_up: FollowUp,
    /// Attrition rows added (trimming, matching).
    pub steps: Vec<AttritionStep>,
    /// Matched sets or strata made.
    pub n_strata: Option<usize>,
    /// Seconds of the adjustment, balance and diagnostics of this unit.
    pub seconds: f64,
}

/// The quantiles of [`ArmFollowUp::days`].
pub const FOLLOW_UP_QUANTILES: [f64; 7] = [0.0, 0.1, 0.25, 0.5, 0.75, 0.9, 1.0];

/// One arm's follow-up in the adjusted population (`cm_follow_up_dist`): CohortMethod's follow-up
/// is the time at risk, not censored at the outcome.
#[derive(Debug, Clone, PartialEq)]
pub struct ArmFollowUp {
    /// Days at risk at [`FOLLOW_UP_QUANTILES`] (min, P10, P25, median, P75, P90, max; R's
    /// `quantile`, type 7).
    pub days: [f64; 7],
    /// The earliest and the latest cohort start (days since 1970-01-01).
    pub start_range: (i64, i64),
}

/// Both arms' follow-up; `None` for an arm without subjects.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct FollowUp {
    /// Treatment 1.
    pub target: Option<ArmFollowUp>,
    /// Treatment 0.
    pub comparator: Option<ArmFollowUp>,
}

impl FollowUp {
    /// From each subject's arm, time at risk and cohort start day.
    pub fn of(treatment: &[bool], time_at_risk: &[f64], start_day: &[i64]) -> FollowUp {
        let arm = |want: bool| -> Option<ArmFollowUp> {
            let mut days: Vec<f64> = Vec::new();
            let (mut first, mut last) = (i64::MAX, i64::MIN);
            for ((&t, &d), &s) in treatment.iter().zip(time_at_risk).zip(start_day) {
                if t == want {
                    days.push(d);
                    first = first.min(s);
                    last = last.max(s);
                }
            }
            if days.is_empty() {
                return None;
            }
            days.sort_by(f64::total_cmp);
            Some(ArmFollowUp {
                days: FOLLOW_UP_QUANTILES.map(|p| quantile_type7(&days, p)),
                start_range: (first, last),
            })
        };
        FollowUp {
            target: arm(true),
            comparator: arm(false),
        }
    }
}

/// R's default `quantile` (type 7) of sorted, non-empty `x`: x[⌊h⌋] + (h − ⌊h⌋)(x[⌊h⌋+1] − x[⌊h⌋])
/// with h = (n − 1)p.
fn quantile_type7(x: &[f64], p: f64) -> f64 {
    let h = (x.len() - 1) as f64 * p;
    let lo = h.floor() as usize;
    let hi = (lo + 1).min(x.len() - 1);
    x[lo] + (h - lo as f64) * (x[hi] - x[lo])
}

/// Adjust unit `a`'s study tables in place (see the module documentation): `None` for a unit
/// without `[analysis.cohort.ps]` / `[analysis.cohort.adjustment]`.
pub async fn adjust(
    ctx: &SessionContext,
    a: &Analysis,
    t: &mut StudyTables,
    cache: &PsCache,
    prebuilt: Option<StudyTables>,
) -> DfResult<Option<Adjusted>> {
    let Design::Cohort(cohort) = &a.design else {
        return Ok(None);
    };
    let s = match settings(cohort) {
        Ok(Some(s)) => s,
        Ok(None) => return Ok(None),
        Err((path, m)) => {
            return exec_err!("analysis `{}`: cohort.{}: {m}", a.name, path.join("."))
        }
    };
    let shared = {
        let key = format!(
            "{}\u{0}{}\u{0}{}",
            a.name,
            a.role("target").unwrap_or_default(),
            a.role("comparator").unwrap_or_default()
        );
        let mut fitted = cache.fitted.lock().await;
        match fitted.get(&key) {
            Some(p) => p.clone(),
            None => {
                let p = Arc::new(fit_shared(ctx, a, &s.ps, prebuilt).await?);
                fitted.insert(key, p.clone());
                p
            }
        }
    };
    let t0 = Instant::now();
    // The unit's entries, in the shared population's order.
    let outcomes = concat_all(&t.outcomes)?;
    let rows = i64s(&outcomes, "row_id")?;
    let mut order: Vec<(usize, usize)> = Vec::with_capacity(rows.len());
    for (k, r) in rows.iter().enumerate() {
        match shared.index.get(r) {
            Some(&i) => order.push((i, k)),
            None => {
                return exec_err!(
                    "analysis `{}`: entry row_id {r} of the outcome table is not in the \
                     propensity-score population",
                    a.id
                )
            }
        }
    }
    order.sort_unstable();
    let unit_idx: Vec<usize> = order.iter().map(|o| o.0).collect();
    let take: Vec<u32> = order.iter().map(|o| o.1 as u32).collect();
    let outcomes = take_record_batch(
        &outcomes,
        &datafusion::arrow::array::UInt32Array::from(take),
    )?;
    let treatment: Vec<bool> = unit_idx.iter().map(|&i| shared.treatment[i]).collect();
    let ps: Vec<f64> = unit_idx
        .iter()
        .map(|&i| shared.fit.propensity_score[i])
        .collect();
    let (nt, nc) = epifusion_core::cohort::arm_counts(&treatment);
    if nt == 0 || nc == 0 {
        return exec_err!(
            "analysis `{}`: the study population has {nt} target and {nc} comparator subjects; \
             a comparative analysis needs both arms",
            a.id
        );
    }
    let preference = preference_scores(&treatment, &ps, None).map_err(core_err)?;
    let equipoise_share =
        equipoise(&treatment, &ps, &EquipoiseSettings::default()).map_err(core_err)?;
    let design_strata = match outcomes.column_by_name("stratum_id") {
        Some(_) => Some(i64s(&outcomes, "stratum_id")?),
        None => None,
    };

    // Trimming, then the method: `kept` indexes the unit's rows.
    let (trimmed, mut steps) = s.trim.trim(&treatment, &ps, None).map_err(core_err)?;
    let sub = |x: &[f64]| trimmed.iter().map(|&i| x[i]).collect::<Vec<f64>>();
    let t_trim: Vec<bool> = trimmed.iter().map(|&i| treatment[i]).collect();
    let ps_trim = sub(&ps);
    let strata_trim: Option<Vec<i64>> = design_strata
        .as_ref()
        .map(|d| trimmed.iter().map(|&i| d[i]).collect());
    let (kept, stratum, weight, n_strata): (Vec<usize>, Option<Vec<i64>>, Option<Vec<f64>>, _) =
        match s.method {
            Method::Match => {
                let m = match_on_ps(&t_trim, &ps_trim, strata_trim.as_deref(), &s.matching)
                    .map_err(core_err)?;
                steps.push(m.attrition.clone());
                (
                    m.kept.iter().map(|&k| trimmed[k]).collect(),
                    Some(m.stratum_id),
                    None,
                    Some(m.n_sets),
                )
            }
            Method::Stratify => {
                let st = stratify_by_ps(&t_trim, &ps_trim, strata_trim.as_deref(), &s.stratify)
                    .map_err(core_err)?;
                let n = st.stratum_id.iter().collect::<BTreeSet<_>>().len();
                (trimmed.clone(), Some(st.stratum_id), None, Some(n))
            }
            Method::Weight => {
                let w = iptw(&t_trim, &ps_trim, &s.weights).map_err(core_err)?;
                (trimmed.clone(), strata_trim.clone(), Some(w), None)
            }
            Method::None => (trimmed.clone(), strata_trim.clone(), None, None),
        };
    if kept.is_empty() {
        return exec_err!(
            "analysis `{}`: no subject is left after {} (no overlap of the arms' propensity \
             scores?)",
            a.id,
            steps.last().map_or("trimming", |s| s.description.as_str())
        );
    }

    // The outcome table of the outcome model.
    let idx = datafusion::arrow::array::UInt32Array::from(
        kept.iter().map(|&k| k as u32).collect::<Vec<_>>(),
    );
    let mut adjusted = take_record_batch(&outcomes, &idx)?;
    let mut fields: Vec<Field> = Vec::new();
    let mut cols: Vec<ArrayRef> = Vec::new();
    let replaced =
        |n: &str| (n == "stratum_id" && stratum.is_some()) || (n == "weight" && weight.is_some());
    for (f, c) in adjusted.schema().fields().iter().zip(adjusted.columns()) {
        if !replaced(f.name()) {
            fields.push(f.as_ref().clone());
            cols.push(c.clone());
        }
    }
    if let Some(st) = &stratum {
        fields.push(Field::new("stratum_id", DataType::Int64, false));
        cols.push(Arc::new(Int64Array::from(st.clone())));
    }
    if let Some(w) = &weight {
        fields.push(Field::new("weight", DataType::Float64, false));
        cols.push(Arc::new(Float64Array::from(w.clone())));
    }
    adjusted = RecordBatch::try_new(Arc::new(Schema::new(fields)), cols)?;

    // Covariates of the kept rows (the treatment alone unless `use_covariates`).
    let kept_rows: HashSet<i64> = i64s(&adjusted, "row_id")?.into_iter().collect();
    let mut covariates = Vec::new();
    for b in &t.covariates {
        let (r, id) = (i64s(b, "row_id")?, i64s(b, "covariate_id")?);
        let mask: BooleanArray = r
            .iter()
            .zip(&id)
            .map(|(r, id)| Some(kept_rows.contains(r) && (s.use_covariates || *id == TREATMENT_ID)))
            .collect();
        covariates.push(filter_record_batch(b, &mask)?);
    }

    // Attrition: one row per trimming / matching step, counted on the unit's rows.
    let persons = i64s(&outcomes, "person_id")?;
    let y = f64s(&outcomes, "y")?;
    let mut attrition = t.attrition.clone();
    if let (Some(last), false) = (attrition.last().cloned(), steps.is_empty()) {
        let mut after: Vec<Vec<usize>> = Vec::new();
        // Reconstruct the rows kept after each step: trimming steps shrink `trimmed` in order;
        // the last step of a match is `kept`.
        let trim_steps = steps.len() - usize::from(s.method == Method::Match);
        let mut current: Vec<usize> = (0..treatment.len()).collect();
        let mut remaining = s.trim.clone();
        for _ in 0..trim_steps {
            // Re-run the trimming steps one at a time (cheap) to know each step's rows.
            let one = match (
                remaining.trim_fraction.take(),
                remaining.equipoise_bounds.take(),
            ) {
                (Some(f), eb) => {
                    remaining.equipoise_bounds = eb;
                    TrimSettings {
                        trim_fraction: Some(f),
                        ..Default::default()
                    }
                }
                (None, Some(b)) => TrimSettings {
                    equipoise_bounds: Some(b),
                    ..Default::default()
                },
                (None, None) => break,
            };
            let tt: Vec<bool> = current.iter().map(|&i| treatment[i]).collect();
            let pp: Vec<f64> = current.iter().map(|&i| ps[i]).collect();
            let (k, _) = one.trim(&tt, &pp, None).map_err(core_err)?;
            current = k.iter().map(|&j| current[j]).collect();
            after.push(current.clone());
        }
        if s.method == Method::Match {
            after.push(kept.clone());
        }
        let start = i64s(&last, "step")?.into_iter().max().unwrap_or(0);
        let mut rows_out: Vec<(i64, String, [i64; 4])> = Vec::new();
        for (n, (step, rows_kept)) in steps.iter().zip(&after).enumerate() {
            let mut p = [BTreeSet::new(), BTreeSet::new()];
            let mut o = [0i64; 2];
            for &i in rows_kept {
                let g = usize::from(!treatment[i]);
                p[g].insert(persons[i]);
                o[g] += i64::from(y[i] == 1.0);
            }
            rows_out.push((
                start + 1 + n as i64,
                step.description.clone(),
                [p[0].len() as i64, p[1].len() as i64, o[0], o[1]],
            ));
        }
        let col = |k: usize| -> ArrayRef {
            Arc::new(Int64Array::from_iter_values(
                rows_out.iter().map(|r| r.2[k]),
            ))
        };
        attrition.push(RecordBatch::try_new(
            study::cohort::attrition_schema(),
            vec![
                Arc::new(Int64Array::from_iter_values(rows_out.iter().map(|r| r.0))),
                Arc::new(StringArray::from_iter_values(
                    rows_out.iter().map(|r| r.1.as_str()),
                )),
                col(0),
                col(1),
                col(2),
                col(3),
            ],
        )?);
    }

    // Balance over every baseline covariate, before (the unit's population) and after.
    let unit_cov = shared.covariates.subset_rows(&unit_idx).map_err(core_err)?;
    let mut order_kept: Vec<usize> = (0..kept.len()).collect();
    order_kept.sort_by_key(|&k| kept[k]);
    let kept_sorted: Vec<usize> = order_kept.iter().map(|&k| kept[k]).collect();
    let strata_sorted: Option<Vec<i64>> = stratum
        .as_ref()
        .map(|st| order_kept.iter().map(|&k| st[k]).collect());
    let weight_sorted: Option<Vec<f64>> = weight
        .as_ref()
        .map(|w| order_kept.iter().map(|&k| w[k]).collect());
    let adjustment = match (&strata_sorted, &weight_sorted, s.method) {
        (_, Some(w), _) => Adjustment::Iptw(w),
        (Some(st), None, Method::Match | Method::Stratify) => Adjustment::Strata(st),
        _ => Adjustment::None,
    };
    let (tr2, cov2, kept2) = (treatment.clone(), unit_cov, kept_sorted.clone());
    let adjustment_owned = match adjustment {
        Adjustment::Iptw(w) => Owned::Iptw(w.to_vec()),
        Adjustment::Strata(st) => Owned::Strata(st.to_vec()),
        Adjustment::None => Owned::None,
    };
    let balance = run_blocking("the covariate balance", move || {
        let adjustment = match &adjustment_owned {
            Owned::Iptw(w) => Adjustment::Iptw(w),
            Owned::Strata(st) => Adjustment::Strata(st),
            Owned::None => Adjustment::None,
        };
        covariate_balance(
            &tr2,
            &cov2,
            &AdjustedPopulation {
                kept: &kept2,
                adjustment,
            },
        )
    })
    .await?;

    // MDRR, diagnostics, Kaplan–Meier on the adjusted population.
    let t_k: Vec<bool> = kept.iter().map(|&i| treatment[i]).collect();
    let time = f64s(&outcomes, "time")?;
    let time_k: Vec<f64> = kept.iter().map(|&i| time[i]).collect();
    let event_k: Vec<bool> = kept.iter().map(|&i| y[i] == 1.0).collect();
    let count_k: Vec<u32> = event_k.iter().map(|&e| u32::from(e)).collect();
    let mdrr = mdrr_summary(&t_k, &count_k, &time_k, &MdrrSettings::default()).ok();
    let values = DiagnosticValues {
        max_sdm: balance.max_abs_std_diff_after,
        equipoise: Some(equipoise_share),
        mdrr: mdrr.map(|m| m.mdrr),
        ..Default::default()
    };
    let diagnostics = evaluate(&values, &DiagnosticThresholds::default()).map_err(core_err)?;
    let ps_k: Vec<f64> = kept.iter().map(|&i| ps[i]).collect();
    let km_strata = match s.method {
        Method::Match | Method::Stratify => stratum.as_deref(),
        _ => None,
    };
    let km = kaplan_meier_by_arm(&t_k, &time_k, &event_k, km_strata, Some(&ps_k))
        .map_err(|e| e.to_string());
    let start = i64s(&outcomes, "cohort_start_day")?;
    let start_k: Vec<i64> = kept.iter().map(|&i| start[i]).collect();
    let follow_up = FollowUp::of(&t_k, &time_k, &start_k);

    t.outcomes = vec![adjusted];
    t.covariates = covariates;
    t.attrition = attrition;
    Ok(Some(Adjusted {
        settings: s,
        shared,
        treatment,
        propensity_score: ps,
        preference_score: preference,
        equipoise: equipoise_share,
        balance,
        mdrr,
        values,
        diagnostics,
        km,
        follow_up,
        steps,
        n_strata,
        seconds: t0.elapsed().as_secs_f64(),
    }))
}

enum Owned {
    Iptw(Vec<f64>),
    Strata(Vec<i64>),
    None,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn follow_up_quantiles_are_r_type_7_per_arm() {
        // R: quantile(c(1, 2, 4, 8, 30), c(0, .1, .25, .5, .75, .9, 1))
        //    = 1, 1.4, 2, 4, 8, 21.2, 30
        let t = [true, false, true, true, false, true, true];
        let d = [8.0, 5.0, 1.0, 30.0, 7.0, 2.0, 4.0];
        let s = [10, 3, 12, 11, 9, 15, 14];
        let f = FollowUp::of(&t, &d, &s);
        let target = f.target.unwrap();
        let want = [1.0, 1.4, 2.0, 4.0, 8.0, 21.2, 30.0];
        for (g, w) in target.days.iter().zip(want) {
            assert!((g - w).abs() < 1e-12, "{:?}", target.days);
        }
        assert_eq!(target.start_range, (10, 15));
        let c = f.comparator.unwrap();
        assert_eq!((c.days[0], c.days[6]), (5.0, 7.0));
        assert!((c.days[3] - 6.0).abs() < 1e-12);
        assert_eq!(c.start_range, (3, 9));
        assert_eq!(FollowUp::of(&[true], &[3.0], &[1]).comparator, None);
    }
}
