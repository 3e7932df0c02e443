//! SCCS results of a run in the OHDSI SelfControlledCaseSeries 5.x results data model
//! (`inst/csv/resultsDataModelSpecification.csv`), calibrated by the negative controls, plus
//! the report's calibration plots and diagnostics table.
//!
//! After every unit is complete, the SCCS units of many exposures ([`crate::many`]) are read
//! back and, per `[[analysis]]`, exposure and risk-window covariate (the covariates of interest,
//! ids ≥ 1000):
//!
//! * the **empirical null** is fitted from the negative-control outcomes' estimates
//!   ([`epifusion_core::calibration::fit_null`], maximum likelihood with the estimates' own
//!   standard errors; at least 5 controls with a finite estimate and standard error, else the
//!   calibrated columns are NULL and the report says why);
//! * each estimate gets `calibrated_p` (`calibrate_p`), `calibrated_one_sided_p` (upper tail),
//!   and the calibrated interval and point estimate through the systematic-error model
//!   (`convert_null_to_error_model` + `calibrate_confidence_interval`, 95 %);
//! * EASE of the null feeds `sccs_diagnostics_summary.ease`.
//!
//! Written under `runs/<run_id>/` (listed in the run manifest's `results`), in one PUT each:
//!
//! | object | rows | columns |
//! |---|---|---|
//! | `sccs_result.parquet` | pair × covariate of interest | OHDSI `sccs_result` (`analysis_id`, `exposures_outcome_set_id`, `covariate_id`, `rr`, `ci_95_lb`, `ci_95_ub`, `p`, `one_sided_p`, `outcome_subjects`, `outcome_events`, `outcome_observation_periods`, `covariate_subjects`, `covariate_days`, `covariate_eras` (NULL), `covariate_outcomes`, `observed_days`, `log_rr`, `se_log_rr`, `llr`, `calibrated_*`, `database_id`); `llr` is the SCCS package's `fit$log_likelihood − getCyclopsProfileLogLikelihood(fit, covariate, x = 0)$value`: the profiled objective at the estimate minus at log RR 0 (the others re-fitted), read from the likelihood profile (NULL when the profile has no point at 0) |
//! | `sccs_diagnostics_summary.parquet` | pair × covariate of interest | OHDSI columns, as the 5.x `exportToCsv` fills them: `mdrr` (`computeMdrr`, α 0.05, power 0.8, two-sided), `ease`, `time_trend_p` (`computeTimeStability`, max ratio 1.25, per pair), `pre_exposure_p` (`computePreExposureGain`, per pair); each diagnostic PASS / FAIL / NOT EVALUATED against `createSccsDiagnosticThresholds()` (MDRR ≤ 10, EASE ≤ 0.25, p ≥ 0.05); `unblind` when none fails, `unblind_for_evidence_synthesis` ignoring the MDRR |
//! | `sccs_likelihood_profile.parquet` | pair × covariate of interest × grid point | OHDSI `sccs_likelihood_profile` (`analysis_id`, `exposures_outcome_set_id`, `covariate_id`, `log_rr`, `log_likelihood` (the profiled objective, penalty included, as `getCyclopsProfileLogLikelihood(includePenalty = TRUE)`), `database_id`) on the 201 points of [`crate::sccs_series::profile_grid`] |
//! | `sccs_time_trend.parquet` | pair × calendar month with an outcome | OHDSI `sccs_time_trend` (`analysis_id`, `exposures_outcome_set_id`, `calendar_year`, `calendar_month`, `observed_subjects`, `ratio`, `adjusted_ratio`, `database_id`) plus `outcomes` (the month's observed count): R `computeOutcomeRatePerMonth` |
//! | `sccs_time_to_event.parquet` | pair × week −26 … 25 with someone observed | OHDSI `sccs_time_to_event` (`analysis_id`, `exposures_outcome_set_id`, `era_id` (as in `sccs_covariate`), `week`, `observed_subjects`, `outcomes`, `database_id`): R `computeTimeToEvent` (`outcomes` = exposed + unexposed) |
//! | `sccs_attrition.parquet` | pair × covariate × step | OHDSI `sccs_attrition` (`sequence_number`, `description`, `analysis_id`, `exposures_outcome_set_id`, `covariate_id`, `database_id`, `outcome_subjects`, `outcome_events`, `outcome_observation_periods`, `observed_days` (NULL except on the last step)) |
//! | `sccs_covariate.parquet` | pair × covariate | OHDSI `sccs_covariate` (`analysis_id`, `exposures_outcome_set_id`, `covariate_id`, `covariate_name`, `era_id` (the concept id when the set has one), `covariate_analysis_id`, `database_id`) |
//! | `sccs_exposures_outcome_set.parquet` | pair | `exposures_outcome_set_id`, `outcome_id` (NULL: outcomes are concept sets, not cohorts), `nesting_cohort_id` (NULL), plus `analysis_id`, `analysis_name`, `exposure`, `outcome`, `true_effect_size` (1 for negative controls) to map the ids to the pipeline's names |
//!
//! Ids: `analysis_id` is the 1-based position of the `[[analysis]]` table in the file;
//! `exposures_outcome_set_id` numbers the analysis' pairs from 1 in the order outcome (the
//! `outcomes`, then the `negative_controls`) → exposure. `database_id` is the pipeline's
//! `database_id`, else the store's `cdm_source.cdm_source_name`, else the store's folder name.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::sync::Arc;

use datafusion::arrow::array::{
    Array, ArrayRef, AsArray, BooleanArray, Float64Array, Int64Array, StringArray,
};
use datafusion::arrow::compute::cast;
use datafusion::arrow::datatypes::{DataType, Field, Float64Type, Int64Type, Schema};
use datafusion::arrow::record_batch::RecordBatch;
use datafusion::common::{exec_datafusion_err, Result as DfResult};
use datafusion::prelude::SessionContext;
use epifusion_core::calibration::{
    calibrate_confidence_interval, calibrate_p, calibrate_p_sided, convert_null_to_error_model,
    ease, fit_null, traditional_p, EmpiricalNull, PValueSide, MIN_NEGATIVE_CONTROLS,
};
use epifusion_core::sccs_diagnostics::{
    classify_ease, classify_mdrr, classify_p, mdrr, DiagnosticThresholds, RESULTS_P_THRESHOLD,
};

use super::output::{ObjectRef, Output};
use super::plan::{Analysis, Pipeline};
use super::report::escape;
use super::run::{parquet_batches, parquet_bytes, AnalysisManifest};
use super::PipelineError;

/// One estimate of interest (a pair's risk-window covariate).
#[derive(Debug, Clone)]
struct Estimate {
    analysis_index: usize,
    analysis: String,
    eos_id: i64,
    exposure: String,
    outcome: String,
    negative_control: bool,
    covariate_id: i64,
    covariate_name: Option<String>,
    log_rr: Option<f64>,
    se_log_rr: Option<f64>,
    log_lb: Option<f64>,
    log_ub: Option<f64>,
    llr: Option<f64>,
    stats: Option<Stats>,
}

#[derive(Debug, Clone, Copy, Default)]
struct Stats {
    outcome_subjects: i64,
    outcome_events: i64,
    outcome_periods: i64,
    observed_days: i64,
    covariate_subjects: i64,
    covariate_days: i64,
    covariate_outcomes: i64,
    case_days: i64,
    case_outcomes: i64,
}

/// The calibrated values of one estimate.
#[derive(Debug, Clone, Copy, Default)]
struct Calibrated {
    p: f64,
    one_sided_p: f64,
    log_rr: f64,
    se_log_rr: f64,
    log_lb: f64,
    log_ub: f64,
}

/// A null per (analysis, exposure, covariate), with what it was fitted from.
struct NullGroup {
    null: Result<EmpiricalNull, String>,
    controls: Vec<(f64, f64)>,
}

/// Key of a pair: (analysis index, exposures_outcome_set_id).
type PairKey = (usize, i64);
/// The key of one profiled coefficient, as the units' series objects spell it.
type CovariateKey = (usize, i64, i64);

/// What the units' [`crate::sccs_series`] objects hold, by pair.
#[derive(Debug, Default)]
struct Series {
    /// Profile points (not the estimate): ((pair, covariate), log RR, profiled objective).
    profile: Vec<(CovariateKey, f64, f64)>,
    /// Per (pair, covariate): the profiled objective at the estimate and at log RR 0.
    profile_ends: BTreeMap<CovariateKey, (Option<f64>, Option<f64>)>,
    /// Time trend: [year, month, observed subjects, outcomes], [ratio, adjusted ratio].
    trend: Vec<(PairKey, [i64; 4], [f64; 2])>,
    /// Time to event: [week, observed subjects, outcomes].
    weeks: Vec<(PairKey, [i64; 3])>,
    /// Per pair: time-trend p, pre-exposure p.
    pair_p: BTreeMap<PairKey, (Option<f64>, Option<f64>)>,
}

/// What the run writes and shows for its SCCS analyses.
#[derive(Debug, Default)]
pub struct SccsOutputs {
    /// Objects written, by table name.
    pub objects: BTreeMap<String, ObjectRef>,
    /// Report sections (HTML).
    pub sections: Vec<String>,
    /// Warnings (e.g. too few negative controls to calibrate).
    pub warnings: Vec<String>,
}

/// The `database_id`: the pipeline's, else `cdm_source.cdm_source_name`, else the folder name
/// (one rule for every results model: [`crate::cohort_results::database_id`]).
pub async fn database_id(ctx: &SessionContext, p: &Pipeline) -> String {
    let given = p.file.database_id.as_ref().map(|s| s.get_ref().as_str());
    crate::cohort_results::database_id(ctx, given, &p.omop).await
}

fn col<'a>(b: &'a RecordBatch, name: &str) -> DfResult<&'a ArrayRef> {
    b.column_by_name(name)
        .ok_or_else(|| exec_datafusion_err!("SCCS results: a table without `{name}`"))
}

fn f64_col(b: &RecordBatch, name: &str) -> DfResult<Float64Array> {
    Ok(cast(col(b, name)?, &DataType::Float64)?
        .as_primitive::<Float64Type>()
        .clone())
}

fn i64_col(b: &RecordBatch, name: &str) -> DfResult<Int64Array> {
    Ok(cast(col(b, name)?, &DataType::Int64)?
        .as_primitive::<Int64Type>()
        .clone())
}

fn str_col(b: &RecordBatch, name: &str) -> DfResult<StringArray> {
    Ok(cast(col(b, name)?, &DataType::Utf8)?
        .as_string::<i32>()
        .clone())
}

fn opt(a: &Float64Array, i: usize) -> Option<f64> {
    (!a.is_null(i) && a.value(i).is_finite()).then(|| a.value(i))
}

/// Read the SCCS units back, calibrate, write the OHDSI tables under `runs/<run>/`, and make
/// the report sections. Units without many exposures are not SCCS units: nothing to do.
pub async fn write(
    ctx: &SessionContext,
    p: &Pipeline,
    out: &Output,
    manifests: &[(&Analysis, AnalysisManifest)],
    run: &str,
) -> Result<SccsOutputs, PipelineError> {
    let units: Vec<_> = manifests
        .iter()
        .filter(|(a, _)| !a.exposures.is_empty())
        .collect();
    if units.is_empty() {
        return Ok(SccsOutputs::default());
    }
    let db = database_id(ctx, p).await;
    let err = |e: datafusion::error::DataFusionError| PipelineError::Output {
        location: p.output.clone(),
        message: format!("SCCS results: {e}"),
    };
    let read = |m: &AnalysisManifest, name: &str| {
        let o = m.objects.get(name).cloned();
        async move {
            let Some(o) = o else {
                return Ok::<_, PipelineError>(Vec::new());
            };
            let bytes = out
                .get(&o.path)
                .await?
                .ok_or_else(|| PipelineError::Output {
                    location: p.output.clone(),
                    message: format!("{} is missing", o.path),
                })?;
            parquet_batches(bytes).map_err(err)
        }
    };
    // exposures_outcome_set ids: per analysis, outcome → exposure in unit order.
    let mut next_eos: BTreeMap<usize, i64> = BTreeMap::new();
    let mut eos: BTreeMap<(usize, String, String), i64> = BTreeMap::new();
    let mut estimates: Vec<Estimate> = Vec::new();
    let mut attrition: Vec<(usize, i64, String, RecordBatch)> = Vec::new();
    let mut covariates: Vec<(usize, i64, i64, String, Option<i64>, i64)> = Vec::new();
    let mut series = Series::default();
    for (a, m) in &units {
        let outcome = a.role("outcome").unwrap_or_default().to_string();
        for e in &a.exposures {
            let n = next_eos.entry(a.index).or_insert(0);
            *n += 1;
            eos.insert((a.index, e.clone(), outcome.clone()), *n);
        }
        let eos_of = |e: &str| eos.get(&(a.index, e.to_string(), outcome.clone())).copied();
        // Stats per (exposure, covariate).
        let mut stats: BTreeMap<(String, i64), Stats> = BTreeMap::new();
        for b in read(m, "sccs_stats").await? {
            let ex = str_col(&b, "exposure").map_err(err)?;
            let id = i64_col(&b, "covariate_id").map_err(err)?;
            let g = |n: &str| i64_col(&b, n).map_err(err);
            let (os, oe, op, od, cs, cd, co, kd, ko) = (
                g("outcome_subjects")?,
                g("outcome_events")?,
                g("outcome_observation_periods")?,
                g("observed_days")?,
                g("covariate_subjects")?,
                g("covariate_days")?,
                g("covariate_outcomes")?,
                g("covariate_case_days")?,
                g("covariate_case_outcomes")?,
            );
            for i in 0..b.num_rows() {
                stats.insert(
                    (ex.value(i).to_string(), id.value(i)),
                    Stats {
                        outcome_subjects: os.value(i),
                        outcome_events: oe.value(i),
                        outcome_periods: op.value(i),
                        observed_days: od.value(i),
                        covariate_subjects: cs.value(i),
                        covariate_days: cd.value(i),
                        covariate_outcomes: co.value(i),
                        case_days: kd.value(i),
                        case_outcomes: ko.value(i),
                    },
                );
            }
        }
        let mut seen: BTreeMap<(String, i64), ()> = BTreeMap::new();
        for b in read(m, "estimates").await? {
            let ex = str_col(&b, "exposure").map_err(err)?;
            let id = i64_col(&b, "covariate_id").map_err(err)?;
            let name = str_col(&b, "covariate_name").map_err(err)?;
            let (est, se, lo, hi) = (
                f64_col(&b, "estimate").map_err(err)?,
                f64_col(&b, "std_error").map_err(err)?,
                f64_col(&b, "ci_lower").map_err(err)?,
                f64_col(&b, "ci_upper").map_err(err)?,
            );
            for i in 0..b.num_rows() {
                if id.is_null(i) || id.value(i) < super::many::EXPOSURE_BASE {
                    continue;
                }
                let (e, c) = (ex.value(i).to_string(), id.value(i));
                seen.insert((e.clone(), c), ());
                estimates.push(Estimate {
                    analysis_index: a.index,
                    analysis: a.name.clone(),
                    eos_id: eos_of(&e).unwrap_or(0),
                    exposure: e.clone(),
                    outcome: outcome.clone(),
                    negative_control: a.negative_control,
                    covariate_id: c,
                    covariate_name: (!name.is_null(i)).then(|| name.value(i).to_string()),
                    log_rr: opt(&est, i),
                    se_log_rr: opt(&se, i).filter(|s| *s > 0.0),
                    log_lb: opt(&lo, i),
                    log_ub: opt(&hi, i),
                    llr: None,
                    stats: stats.get(&(e, c)).copied(),
                });
            }
        }
        // Covariates of interest of pairs without a fit (no estimates): rows with NULLs.
        for ((e, c), s) in &stats {
            if seen.contains_key(&(e.clone(), *c)) {
                continue;
            }
            estimates.push(Estimate {
                analysis_index: a.index,
                analysis: a.name.clone(),
                eos_id: eos_of(e).unwrap_or(0),
                exposure: e.clone(),
                outcome: outcome.clone(),
                negative_control: a.negative_control,
                covariate_id: *c,
                covariate_name: None,
                log_rr: None,
                se_log_rr: None,
                log_lb: None,
                log_ub: None,
                llr: None,
                stats: Some(*s),
            });
        }
        for b in read(m, "attrition").await? {
            let ex = str_col(&b, "exposure").map_err(err)?;
            for e in a.exposures.iter() {
                let mask: BooleanArray = (0..b.num_rows())
                    .map(|i| Some(ex.value(i) == e.as_str()))
                    .collect();
                let rows = datafusion::arrow::compute::filter_record_batch(&b, &mask)
                    .map_err(|e| err(e.into()))?;
                if rows.num_rows() > 0 {
                    attrition.push((a.index, eos_of(e).unwrap_or(0), e.clone(), rows));
                }
            }
        }
        for b in read(m, "covariate_ref").await? {
            let ex = str_col(&b, "exposure").map_err(err)?;
            let id = i64_col(&b, "covariate_id").map_err(err)?;
            let name = str_col(&b, "covariate_name").map_err(err)?;
            let concept = b
                .column_by_name("concept_id")
                .map(|c| cast(c, &DataType::Int64))
                .transpose()
                .map_err(|e| err(e.into()))?;
            for i in 0..b.num_rows() {
                let concept = concept
                    .as_ref()
                    .map(|c| c.as_primitive::<Int64Type>())
                    .and_then(|c| (!c.is_null(i)).then(|| c.value(i)));
                covariates.push((
                    a.index,
                    eos_of(ex.value(i)).unwrap_or(0),
                    id.value(i),
                    name.value(i).to_string(),
                    concept,
                    if id.value(i) >= super::many::EXPOSURE_BASE {
                        1
                    } else {
                        id.value(i) / 100
                    },
                ));
            }
        }
        for b in read(m, "sccs_profile").await? {
            let ex = str_col(&b, "exposure").map_err(err)?;
            let (cov, lr, prof) = (
                i64_col(&b, "covariate_id").map_err(err)?,
                f64_col(&b, "log_rr").map_err(err)?,
                f64_col(&b, "profile").map_err(err)?,
            );
            let est = cast(col(&b, "is_estimate").map_err(err)?, &DataType::Boolean)
                .map_err(|e| err(e.into()))?;
            let est = est.as_boolean();
            for i in 0..b.num_rows() {
                let Some(eos_id) = eos_of(ex.value(i)) else {
                    continue;
                };
                let key = (a.index, eos_id, cov.value(i));
                let (x, y) = (lr.value(i), prof.value(i));
                let entry = series.profile_ends.entry(key).or_default();
                if est.value(i) {
                    entry.0 = Some(y);
                } else {
                    if x == 0.0 {
                        entry.1 = Some(y);
                    }
                    series.profile.push((key, x, y));
                }
            }
        }
        for b in read(m, "sccs_time_trend").await? {
            let ex = str_col(&b, "exposure").map_err(err)?;
            let g = |n: &str| i64_col(&b, n).map_err(err);
            let (year, month, subjects, outcomes) = (
                g("calendar_year")?,
                g("calendar_month")?,
                g("observed_subjects")?,
                g("outcomes")?,
            );
            let (ratio, adjusted) = (
                f64_col(&b, "ratio").map_err(err)?,
                f64_col(&b, "adjusted_ratio").map_err(err)?,
            );
            for i in 0..b.num_rows() {
                let Some(eos_id) = eos_of(ex.value(i)) else {
                    continue;
                };
                series.trend.push((
                    (a.index, eos_id),
                    [
                        year.value(i),
                        month.value(i),
                        subjects.value(i),
                        outcomes.value(i),
                    ],
                    [ratio.value(i), adjusted.value(i)],
                ));
            }
        }
        for b in read(m, "sccs_time_to_event").await? {
            let ex = str_col(&b, "exposure").map_err(err)?;
            let g = |n: &str| i64_col(&b, n).map_err(err);
            let (week, subjects, outcomes) = (g("week")?, g("observed_subjects")?, g("outcomes")?);
            for i in 0..b.num_rows() {
                let Some(eos_id) = eos_of(ex.value(i)) else {
                    continue;
                };
                series.weeks.push((
                    (a.index, eos_id),
                    [week.value(i), subjects.value(i), outcomes.value(i)],
                ));
            }
        }
        for b in read(m, "sccs_pair_diagnostics").await? {
            let ex = str_col(&b, "exposure").map_err(err)?;
            let (tt, pe) = (
                f64_col(&b, "time_trend_p").map_err(err)?,
                f64_col(&b, "pre_exposure_p").map_err(err)?,
            );
            for i in 0..b.num_rows() {
                let Some(eos_id) = eos_of(ex.value(i)) else {
                    continue;
                };
                let value =
                    |v: &Float64Array| (!v.is_null(i) && !v.value(i).is_nan()).then(|| v.value(i));
                series
                    .pair_p
                    .insert((a.index, eos_id), (value(&tt), value(&pe)));
            }
        }
    }
    // llr = profile at the estimate − profile at 0 (the SCCS package's
    // `fit$log_likelihood − getCyclopsProfileLogLikelihood(fit, parm, x = 0)$value`).
    for e in &mut estimates {
        e.llr = series
            .profile_ends
            .get(&(e.analysis_index, e.eos_id, e.covariate_id))
            .and_then(|(at_estimate, at_zero)| Some(at_estimate.as_ref()? - at_zero.as_ref()?));
    }

    // Empirical nulls per (analysis, exposure, covariate).
    let mut groups: BTreeMap<(usize, String, i64), NullGroup> = BTreeMap::new();
    for e in estimates.iter().filter(|e| e.negative_control) {
        let g = groups
            .entry((e.analysis_index, e.exposure.clone(), e.covariate_id))
            .or_insert(NullGroup {
                null: Err(String::new()),
                controls: Vec::new(),
            });
        if let (Some(lr), Some(se)) = (e.log_rr, e.se_log_rr) {
            g.controls.push((lr, se));
        }
    }
    let mut warnings = Vec::new();
    for ((ai, ex, c), g) in groups.iter_mut() {
        let (lr, se): (Vec<f64>, Vec<f64>) = g.controls.iter().copied().unzip();
        g.null = if lr.len() < MIN_NEGATIVE_CONTROLS {
            Err(format!(
                "{} negative controls with an estimate (at least {MIN_NEGATIVE_CONTROLS} needed)",
                lr.len()
            ))
        } else {
            fit_null(&lr, &se).map_err(|e| e.to_string())
        };
        if let Err(why) = &g.null {
            let name = &p.file.analyses[*ai].name;
            warnings.push(format!(
                "analysis `{}`: exposure {ex}, covariate {c}: not calibrated: {why}",
                name.get_ref()
            ));
        }
    }
    let null_of = |e: &Estimate| {
        groups
            .get(&(e.analysis_index, e.exposure.clone(), e.covariate_id))
            .and_then(|g| g.null.as_ref().ok())
    };
    let calibrated: Vec<Option<Calibrated>> = estimates
        .iter()
        .map(|e| {
            let (null, lr, se) = (null_of(e)?, e.log_rr?, e.se_log_rr?);
            let model = convert_null_to_error_model(null);
            let ci = calibrate_confidence_interval(&model, lr, se, 0.95).ok()?;
            Some(Calibrated {
                p: calibrate_p(null, lr, se).ok()?,
                one_sided_p: calibrate_p_sided(null, lr, se, PValueSide::Upper).ok()?,
                log_rr: ci.log_rr,
                se_log_rr: ci.se_log_rr,
                log_lb: ci.log_lb,
                log_ub: ci.log_ub,
            })
        })
        .collect();

    // sccs_result.
    let n = estimates.len();
    let f = |v: Vec<Option<f64>>| Arc::new(Float64Array::from(v)) as ArrayRef;
    let i = |v: Vec<Option<i64>>| Arc::new(Int64Array::from(v)) as ArrayRef;
    let stat =
        |g: fn(&Stats) -> i64| i(estimates.iter().map(|e| e.stats.as_ref().map(g)).collect());
    let exp = |v: Option<f64>| v.map(f64::exp);
    let p_of = |e: &Estimate, side| match (e.log_rr, e.se_log_rr) {
        (Some(lr), Some(se)) => traditional_p(lr, se, side).ok(),
        _ => None,
    };
    let cal = |g: fn(&Calibrated) -> f64| f(calibrated.iter().map(|c| c.as_ref().map(g)).collect());
    let cal_exp = |g: fn(&Calibrated) -> f64| {
        f(calibrated
            .iter()
            .map(|c| c.as_ref().map(|c| g(c).exp()))
            .collect())
    };
    let ids = |g: fn(&Estimate) -> i64| i(estimates.iter().map(|e| Some(g(e))).collect());
    let db_col = Arc::new(StringArray::from(vec![db.clone(); n])) as ArrayRef;
    let result = batch(vec![
        ("analysis_id", ids(|e| e.analysis_index as i64 + 1)),
        ("exposures_outcome_set_id", ids(|e| e.eos_id)),
        ("covariate_id", ids(|e| e.covariate_id)),
        ("rr", f(estimates.iter().map(|e| exp(e.log_rr)).collect())),
        (
            "ci_95_lb",
            f(estimates.iter().map(|e| exp(e.log_lb)).collect()),
        ),
        (
            "ci_95_ub",
            f(estimates.iter().map(|e| exp(e.log_ub)).collect()),
        ),
        (
            "p",
            f(estimates
                .iter()
                .map(|e| p_of(e, PValueSide::TwoSided))
                .collect()),
        ),
        (
            "one_sided_p",
            f(estimates
                .iter()
                .map(|e| p_of(e, PValueSide::Upper))
                .collect()),
        ),
        ("outcome_subjects", stat(|s| s.outcome_subjects)),
        ("outcome_events", stat(|s| s.outcome_events)),
        ("outcome_observation_periods", stat(|s| s.outcome_periods)),
        ("covariate_subjects", stat(|s| s.covariate_subjects)),
        ("covariate_days", stat(|s| s.covariate_days)),
        ("covariate_eras", i(vec![None; n])),
        ("covariate_outcomes", stat(|s| s.covariate_outcomes)),
        ("observed_days", stat(|s| s.observed_days)),
        ("log_rr", f(estimates.iter().map(|e| e.log_rr).collect())),
        (
            "se_log_rr",
            f(estimates.iter().map(|e| e.se_log_rr).collect()),
        ),
        ("llr", f(estimates.iter().map(|e| e.llr).collect())),
        ("calibrated_rr", cal_exp(|c| c.log_rr)),
        ("calibrated_ci_95_lb", cal_exp(|c| c.log_lb)),
        ("calibrated_ci_95_ub", cal_exp(|c| c.log_ub)),
        ("calibrated_p", cal(|c| c.p)),
        ("calibrated_one_sided_p", cal(|c| c.one_sided_p)),
        ("calibrated_log_rr", cal(|c| c.log_rr)),
        ("calibrated_se_log_rr", cal(|c| c.se_log_rr)),
        ("database_id", db_col.clone()),
    ])
    .map_err(err)?;

    // sccs_diagnostics_summary.
    let t = DiagnosticThresholds::default();
    let mut diag_rows: Vec<[String; 8]> = Vec::new();
    let mut mdrrs = Vec::with_capacity(n);
    let mut eases = Vec::with_capacity(n);
    let (mut md_s, mut ea_s, mut unblind, mut unblind_es) =
        (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    let (mut tt_p, mut pe_p, mut tt_s, mut pe_s) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    for e in &estimates {
        let (tp, pp) = series
            .pair_p
            .get(&(e.analysis_index, e.eos_id))
            .copied()
            .unwrap_or_default();
        let (ts, ps) = (
            classify_p(tp, RESULTS_P_THRESHOLD),
            classify_p(pp, RESULTS_P_THRESHOLD),
        );
        let m = e.stats.map(|s| {
            let r = s.covariate_days as f64 / s.case_days as f64;
            mdrr(
                r,
                s.case_outcomes as f64,
                t.mdrr_alpha,
                t.mdrr_power,
                t.mdrr_two_sided,
            )
        });
        let ea = null_of(e).map(ease);
        let ms = m.map_or(epifusion_core::sccs_diagnostics::Status::NotComputed, |m| {
            classify_mdrr(m, &t)
        });
        let es = ea.map_or(epifusion_core::sccs_diagnostics::Status::NotComputed, |x| {
            classify_ease(x, &t)
        });
        let label = |s: epifusion_core::sccs_diagnostics::Status| {
            match s.name() {
                "pass" => "PASS",
                "warn" => "WARNING",
                "fail" => "FAIL",
                _ => "NOT EVALUATED",
            }
            .to_string()
        };
        let fail = |s: epifusion_core::sccs_diagnostics::Status| s.name() == "fail";
        // R `exportGroup`: unblind when no diagnostic fails; for evidence synthesis the MDRR
        // is ignored.
        unblind.push(Some(i64::from(
            !fail(ms) && !fail(es) && !fail(ts) && !fail(ps),
        )));
        unblind_es.push(Some(i64::from(!fail(es) && !fail(ts) && !fail(ps))));
        let p_cell = |p: Option<f64>, s| {
            format!(
                "{} {}",
                p.map_or("–".into(), |p| format!("p {p:.3}")),
                label(s)
            )
        };
        diag_rows.push([
            e.analysis.clone(),
            e.exposure.clone(),
            format!(
                "{}{}",
                e.outcome,
                if e.negative_control {
                    " (negative control)"
                } else {
                    ""
                }
            ),
            e.covariate_name
                .clone()
                .unwrap_or_else(|| e.covariate_id.to_string()),
            format!(
                "{} {}",
                m.map_or("–".into(), |m| format!("{m:.2}")),
                label(ms)
            ),
            format!(
                "{} {}",
                ea.map_or("–".into(), |x| format!("{x:.3}")),
                label(es)
            ),
            p_cell(tp, ts),
            p_cell(pp, ps),
        ]);
        mdrrs.push(m.filter(|m| m.is_finite()));
        eases.push(ea);
        md_s.push(label(ms));
        ea_s.push(label(es));
        tt_p.push(tp);
        pe_p.push(pp);
        tt_s.push(label(ts));
        pe_s.push(label(ps));
    }
    let s = |v: Vec<String>| Arc::new(StringArray::from(v)) as ArrayRef;
    let diagnostics = batch(vec![
        ("analysis_id", ids(|e| e.analysis_index as i64 + 1)),
        ("exposures_outcome_set_id", ids(|e| e.eos_id)),
        ("covariate_id", ids(|e| e.covariate_id)),
        ("database_id", db_col.clone()),
        ("mdrr", f(mdrrs)),
        ("ease", f(eases)),
        ("time_trend_p", f(tt_p)),
        ("pre_exposure_p", f(pe_p)),
        ("mdrr_diagnostic", s(md_s)),
        ("ease_diagnostic", s(ea_s)),
        ("time_trend_diagnostic", s(tt_s)),
        ("pre_exposure_diagnostic", s(pe_s)),
        ("unblind", i(unblind)),
        ("unblind_for_evidence_synthesis", i(unblind_es)),
    ])
    .map_err(err)?;

    // sccs_attrition: each step for each covariate of interest of the pair.
    let mut att: Vec<RecordBatch> = Vec::new();
    for (ai, eos_id, ex, b) in &attrition {
        let covs: Vec<i64> = estimates
            .iter()
            .filter(|e| e.analysis_index == *ai && e.eos_id == *eos_id && &e.exposure == ex)
            .map(|e| e.covariate_id)
            .collect();
        let last = estimates
            .iter()
            .find(|e| e.analysis_index == *ai && e.eos_id == *eos_id)
            .and_then(|e| e.stats)
            .map(|s| s.observed_days);
        let steps = b.num_rows();
        let desc = str_col(b, "description").map_err(err)?;
        let (persons, cases, outcomes) = (
            i64_col(b, "persons").map_err(err)?,
            i64_col(b, "cases").map_err(err)?,
            i64_col(b, "outcomes").map_err(err)?,
        );
        for c in covs {
            att.push(
                batch(vec![
                    ("sequence_number", i((1..=steps as i64).map(Some).collect())),
                    (
                        "description",
                        s((0..steps).map(|k| desc.value(k).to_string()).collect()),
                    ),
                    ("analysis_id", i(vec![Some(*ai as i64 + 1); steps])),
                    ("exposures_outcome_set_id", i(vec![Some(*eos_id); steps])),
                    ("covariate_id", i(vec![Some(c); steps])),
                    ("database_id", s(vec![db.clone(); steps])),
                    (
                        "outcome_subjects",
                        i((0..steps).map(|k| Some(persons.value(k))).collect()),
                    ),
                    (
                        "outcome_events",
                        i((0..steps).map(|k| Some(outcomes.value(k))).collect()),
                    ),
                    (
                        "outcome_observation_periods",
                        i((0..steps).map(|k| Some(cases.value(k))).collect()),
                    ),
                    (
                        "observed_days",
                        i((0..steps)
                            .map(|k| if k + 1 == steps { last } else { None })
                            .collect()),
                    ),
                ])
                .map_err(err)?,
            );
        }
    }

    // sccs_covariate and the exposures–outcome sets.
    let nc = covariates.len();
    let covariate = batch(vec![
        (
            "analysis_id",
            i(covariates.iter().map(|c| Some(c.0 as i64 + 1)).collect()),
        ),
        (
            "exposures_outcome_set_id",
            i(covariates.iter().map(|c| Some(c.1)).collect()),
        ),
        (
            "covariate_id",
            i(covariates.iter().map(|c| Some(c.2)).collect()),
        ),
        (
            "covariate_name",
            s(covariates.iter().map(|c| c.3.clone()).collect()),
        ),
        ("era_id", i(covariates.iter().map(|c| c.4).collect())),
        (
            "covariate_analysis_id",
            i(covariates.iter().map(|c| Some(c.5)).collect()),
        ),
        ("database_id", s(vec![db.clone(); nc])),
    ])
    .map_err(err)?;
    let sets: Vec<_> = eos.iter().collect();
    let ns = sets.len();
    let exposures_outcome_set = batch(vec![
        (
            "exposures_outcome_set_id",
            i(sets.iter().map(|(_, v)| Some(**v)).collect()),
        ),
        ("outcome_id", i(vec![None; ns])),
        ("nesting_cohort_id", i(vec![None; ns])),
        (
            "analysis_id",
            i(sets
                .iter()
                .map(|((a, _, _), _)| Some(*a as i64 + 1))
                .collect()),
        ),
        (
            "analysis_name",
            s(sets
                .iter()
                .map(|((a, _, _), _)| p.file.analyses[*a].name.get_ref().clone())
                .collect()),
        ),
        (
            "exposure",
            s(sets.iter().map(|((_, e, _), _)| e.clone()).collect()),
        ),
        (
            "outcome",
            s(sets.iter().map(|((_, _, o), _)| o.clone()).collect()),
        ),
        (
            "true_effect_size",
            f(sets
                .iter()
                .map(|((a, _, o), _)| {
                    p.file.analyses[*a]
                        .negative_controls
                        .iter()
                        .any(|n| n.get_ref() == o)
                        .then_some(1.0)
                })
                .collect()),
        ),
    ])
    .map_err(err)?;

    // sccs_likelihood_profile, sccs_time_trend, sccs_time_to_event.
    let np = series.profile.len();
    let likelihood_profile = batch(vec![
        (
            "analysis_id",
            i(series
                .profile
                .iter()
                .map(|r| Some(r.0 .0 as i64 + 1))
                .collect()),
        ),
        (
            "exposures_outcome_set_id",
            i(series.profile.iter().map(|r| Some(r.0 .1)).collect()),
        ),
        (
            "covariate_id",
            i(series.profile.iter().map(|r| Some(r.0 .2)).collect()),
        ),
        (
            "log_rr",
            f(series.profile.iter().map(|r| Some(r.1)).collect()),
        ),
        (
            "log_likelihood",
            f(series.profile.iter().map(|r| Some(r.2)).collect()),
        ),
        ("database_id", s(vec![db.clone(); np])),
    ])
    .map_err(err)?;
    let nt = series.trend.len();
    let trend_i = |k: usize| i(series.trend.iter().map(|r| Some(r.1[k])).collect());
    let time_trend = batch(vec![
        (
            "analysis_id",
            i(series
                .trend
                .iter()
                .map(|r| Some(r.0 .0 as i64 + 1))
                .collect()),
        ),
        (
            "exposures_outcome_set_id",
            i(series.trend.iter().map(|r| Some(r.0 .1)).collect()),
        ),
        ("calendar_year", trend_i(0)),
        ("calendar_month", trend_i(1)),
        ("observed_subjects", trend_i(2)),
        (
            "ratio",
            f(series.trend.iter().map(|r| Some(r.2[0])).collect()),
        ),
        (
            "adjusted_ratio",
            f(series.trend.iter().map(|r| Some(r.2[1])).collect()),
        ),
        ("outcomes", trend_i(3)),
        ("database_id", s(vec![db.clone(); nt])),
    ])
    .map_err(err)?;
    // era_id: the concept of the pair's first covariate of interest (sccs_covariate's era_id).
    let era_of = |key: &PairKey| {
        covariates
            .iter()
            .find(|c| (c.0, c.1) == *key && c.2 >= super::many::EXPOSURE_BASE)
            .and_then(|c| c.4)
    };
    let nw = series.weeks.len();
    let time_to_event = batch(vec![
        (
            "analysis_id",
            i(series
                .weeks
                .iter()
                .map(|r| Some(r.0 .0 as i64 + 1))
                .collect()),
        ),
        (
            "exposures_outcome_set_id",
            i(series.weeks.iter().map(|r| Some(r.0 .1)).collect()),
        ),
        (
            "era_id",
            i(series.weeks.iter().map(|r| era_of(&r.0)).collect()),
        ),
        (
            "week",
            i(series.weeks.iter().map(|r| Some(r.1[0])).collect()),
        ),
        (
            "observed_subjects",
            i(series.weeks.iter().map(|r| Some(r.1[1])).collect()),
        ),
        (
            "outcomes",
            i(series.weeks.iter().map(|r| Some(r.1[2])).collect()),
        ),
        ("database_id", s(vec![db.clone(); nw])),
    ])
    .map_err(err)?;

    let mut objects = BTreeMap::new();
    for (name, batches) in [
        ("sccs_result", vec![result]),
        ("sccs_diagnostics_summary", vec![diagnostics]),
        ("sccs_attrition", att),
        ("sccs_covariate", vec![covariate]),
        ("sccs_exposures_outcome_set", vec![exposures_outcome_set]),
        ("sccs_likelihood_profile", vec![likelihood_profile]),
        ("sccs_time_trend", vec![time_trend]),
        ("sccs_time_to_event", vec![time_to_event]),
    ] {
        if batches.is_empty() {
            continue;
        }
        let bytes = parquet_bytes(&batches).map_err(err)?;
        let rel = format!("runs/{run}/{name}.parquet");
        objects.insert(name.to_string(), out.put(&rel, bytes).await?);
    }

    // Report sections.
    let mut sections = Vec::new();
    let mut html = String::from(
        "<h2 id=\"sccs-calibration\">SCCS empirical calibration</h2>\n<p>Negative controls \
         (true RR = 1) against their standard errors, with the fitted empirical null's 95 % \
         region (shaded) and the traditional p &lt; 0.05 boundary (dashed), as \
         EmpiricalCalibration's <code>plotCalibrationEffect</code>; estimates of interest in \
         orange.</p>\n",
    );
    for ((ai, ex, c), g) in &groups {
        let interest: Vec<(f64, f64)> = estimates
            .iter()
            .filter(|e| {
                !e.negative_control
                    && e.analysis_index == *ai
                    && &e.exposure == ex
                    && e.covariate_id == *c
            })
            .filter_map(|e| Some((e.log_rr?, e.se_log_rr?)))
            .collect();
        let title = format!(
            "{} · {ex} · covariate {c}",
            p.file.analyses[*ai].name.get_ref()
        );
        let _ = writeln!(
            html,
            "<figure class=\"calibration\" data-group=\"{}\">{}<figcaption>{}: {}</figcaption></figure>",
            escape(&title),
            calibration_svg(&g.controls, &interest, g.null.as_ref().ok()),
            escape(&title),
            match &g.null {
                Ok(n) => format!(
                    "null mean {:.3}, sd {:.3}, EASE {:.3} ({} negative controls)",
                    n.mean(),
                    n.sd(),
                    ease(n),
                    g.controls.len()
                ),
                Err(why) => format!("not calibrated: {}", escape(why)),
            }
        );
    }
    sections.push(html);
    let mut table = String::from(
        "<h2 id=\"sccs-diagnostics\">SCCS diagnostics</h2>\n<table class=\"sccs-diagnostics\">\
         <thead><tr><th>analysis</th><th>exposure</th><th>outcome</th><th>covariate</th>\
         <th>MDRR</th><th>EASE</th><th>time trend</th><th>pre-exposure</th></tr></thead><tbody>",
    );
    for r in &diag_rows {
        let cell = |v: &str| {
            let class = if v.ends_with("PASS") {
                "pass"
            } else if v.ends_with("FAIL") {
                "fail"
            } else if v.ends_with("WARNING") {
                "warn"
            } else {
                "none"
            };
            format!("<td class=\"{class}\">{}</td>", escape(v))
        };
        let _ = write!(
            table,
            "<tr><td>{}</td><td>{}</td><td>{}</td><td>{}</td>{}{}{}{}</tr>",
            escape(&r[0]),
            escape(&r[1]),
            escape(&r[2]),
            escape(&r[3]),
            cell(&r[4]),
            cell(&r[5]),
            cell(&r[6]),
            cell(&r[7]),
        );
    }
    table.push_str("</tbody></table>\n");
    sections.push(table);
    Ok(SccsOutputs {
        objects,
        sections,
        warnings,
    })
}

fn batch(cols: Vec<(&str, ArrayRef)>) -> DfResult<RecordBatch> {
    let fields: Vec<Field> = cols
        .iter()
        .map(|(n, a)| Field::new(*n, a.data_type().clone(), true))
        .collect();
    Ok(RecordBatch::try_new(
        Arc::new(Schema::new(fields)),
        cols.into_iter().map(|(_, a)| a).collect(),
    )?)
}

/// The calibration plot (inline SVG): x = log RR (RR axis), y = standard error (0 at the top,
/// as EmpiricalCalibration draws it); the null's 95 % region `μ ± 1.96·√(σ² + se²)` shaded,
/// the traditional `±1.96·se` boundary dashed; negative controls as blue dots, estimates of
/// interest as orange diamonds.
pub fn calibration_svg(
    controls: &[(f64, f64)],
    interest: &[(f64, f64)],
    null: Option<&EmpiricalNull>,
) -> String {
    const W: f64 = 420.0;
    const H: f64 = 300.0;
    const L: f64 = 50.0;
    const B: f64 = 40.0;
    let (xmin, xmax) = (0.25f64.ln(), 10f64.ln());
    let ymax = controls
        .iter()
        .chain(interest)
        .map(|p| p.1)
        .fold(1.0f64, f64::max)
        .min(1.5);
    let x = |lr: f64| L + (lr.clamp(xmin, xmax) - xmin) / (xmax - xmin) * (W - L - 10.0);
    let y = |se: f64| 10.0 + se.clamp(0.0, ymax) / ymax * (H - B - 10.0);
    let mut s = format!(
        "<svg xmlns=\"http://www.w3.org/2000/svg\" class=\"calibration-plot\" width=\"{W}\" \
         height=\"{H}\" viewBox=\"0 0 {W} {H}\" role=\"img\" aria-label=\"calibration plot\">"
    );
    let steps = 40;
    let se_at = |k: usize| ymax * k as f64 / steps as f64;
    if let Some(n) = null {
        // Region between the lower and upper bound over the SE axis.
        let mut pts = Vec::new();
        for k in 0..=steps {
            let se = se_at(k);
            pts.push(format!(
                "{:.1},{:.1}",
                x(n.mean() - 1.96 * n.sd().hypot(se)),
                y(se)
            ));
        }
        for k in (0..=steps).rev() {
            let se = se_at(k);
            pts.push(format!(
                "{:.1},{:.1}",
                x(n.mean() + 1.96 * n.sd().hypot(se)),
                y(se)
            ));
        }
        let _ = write!(
            s,
            "<polygon class=\"null-region\" points=\"{}\" fill=\"#fbe3c9\" stroke=\"none\"/>",
            pts.join(" ")
        );
    }
    for sign in [-1.0, 1.0] {
        let _ = write!(
            s,
            "<line class=\"p05\" x1=\"{:.1}\" y1=\"{:.1}\" x2=\"{:.1}\" y2=\"{:.1}\" stroke=\"#555\" stroke-dasharray=\"4 3\"/>",
            x(0.0),
            y(0.0),
            x(sign * 1.96 * ymax),
            y(ymax)
        );
    }
    let _ = write!(
        s,
        "<line x1=\"{x0:.1}\" y1=\"10\" x2=\"{x0:.1}\" y2=\"{yb:.1}\" stroke=\"#999\"/>\
         <line x1=\"{L}\" y1=\"{yb:.1}\" x2=\"{xr:.1}\" y2=\"{yb:.1}\" stroke=\"#333\"/>",
        x0 = x(0.0),
        yb = H - B,
        xr = W - 10.0
    );
    for rr in [0.25, 0.5, 1.0, 2.0, 4.0, 10.0] {
        let _ = write!(
            s,
            "<text x=\"{:.1}\" y=\"{:.1}\" font-size=\"11\" text-anchor=\"middle\">{rr}</text>",
            x(f64::ln(rr)),
            H - B + 15.0
        );
    }
    let _ = write!(
        s,
        "<text x=\"{:.1}\" y=\"{:.1}\" font-size=\"11\" text-anchor=\"middle\">relative risk</text>\
         <text x=\"12\" y=\"{:.1}\" font-size=\"11\" transform=\"rotate(-90 12 {:.1})\" text-anchor=\"middle\">standard error</text>",
        (L + W) / 2.0,
        H - 8.0,
        H / 2.0,
        H / 2.0
    );
    for &(lr, se) in controls {
        let _ = write!(
            s,
            "<circle class=\"negative-control\" cx=\"{:.1}\" cy=\"{:.1}\" r=\"3.5\" fill=\"#1f77b4\" fill-opacity=\"0.7\"/>",
            x(lr),
            y(se)
        );
    }
    for &(lr, se) in interest {
        let (cx, cy) = (x(lr), y(se));
        let _ = write!(
            s,
            "<polygon class=\"estimate-of-interest\" points=\"{:.1},{:.1} {:.1},{:.1} {:.1},{:.1} {:.1},{:.1}\" fill=\"#ff7f0e\"/>",
            cx,
            cy - 5.0,
            cx + 5.0,
            cy,
            cx,
            cy + 5.0,
            cx - 5.0,
            cy
        );
    }
    s.push_str("</svg>");
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_calibration_plot_draws_controls_interest_and_the_null() {
        let controls: Vec<(f64, f64)> = (0..6).map(|k| (0.1 * k as f64 - 0.2, 0.2)).collect();
        let null = EmpiricalNull::new(0.05, 0.1).unwrap();
        let svg = calibration_svg(&controls, &[(0.7, 0.3)], Some(&null));
        assert_eq!(svg.matches("class=\"negative-control\"").count(), 6);
        assert_eq!(svg.matches("class=\"estimate-of-interest\"").count(), 1);
        assert_eq!(svg.matches("class=\"null-region\"").count(), 1);
        let none = calibration_svg(&controls, &[], None);
        assert!(!none.contains("null-region"));
    }
}
