//! SCCS diagnostics in SQL, per exposure–outcome pair, as OHDSI's SelfControlledCaseSeries
//! reports them (the maths and the sources are in [`epifusion_core::sccs_diagnostics`]):
//!
//! ```sql
//! SELECT * FROM sccs_diagnostics('{"outcome": {...}, "exposures": [{..., "risk_windows": [
//!     {"start": 0, "end": 0, "end_anchor": "era_end"}, {"start": -30, "end": -1}]}],
//!   "end_of_observation_probe": 30,
//!   "diagnostics": {"mdrr": 10},                       -- thresholds (optional)
//!   "negative_controls": "SELECT log_rr, se_log_rr FROM nc"}');   -- for EASE (optional)
//! SELECT * FROM sccs_time_to_event('{...the same settings...}');
//! ```
//!
//! The settings are the SCCS study settings ([`super::sccs`]) plus two optional keys:
//! `diagnostics` (the thresholds of [`DiagnosticThresholds`]) and `negative_controls` (a table
//! name or read-only query with `log_rr`, `se_log_rr` of the negative-control estimates of the
//! same analysis, for EASE).
//!
//! `sccs_diagnostics` builds the intervals, fits the SCCS model of the design (no prior,
//! profile intervals; the design's own pre-exposure windows and end-of-observation probe are
//! in it) and returns one row per exposure, diagnostic and (where it is per covariate)
//! covariate: `exposure_index, exposure, covariate_id, diagnostic, value, threshold, status,
//! notes`. Diagnostics:
//!
//! * `mdrr` (one row per covariate of the exposure's risk windows that are not pre-exposure
//!   windows): `r` = days with the covariate / observed days of the informative cases that have
//!   it, `n` = those cases' outcomes (the package's `covariateStatistics` `dayCount /
//!   observedDayCount` and `observedOutcomeCount`, as I read them: not confirmed in source).
//! * `ease`: from `negative_controls` (EmpiricalCalibration's maximum-likelihood `fitNull`; the
//!   package uses `fitMcmcNull`, whose estimate can differ); `not_computed` without them.
//! * `time_stability`: value is the p-value, notes carry the ratio; the expected counts are
//!   adjusted for the fitted season and calendar-time splines when the design has them.
//! * `event_observation` (probe, covariate 99) and `event_exposure` (one row per pre-exposure
//!   covariate: a risk window with `start` < 0 anchored at the era start): value is the IRR,
//!   notes carry its 95 % interval; `not_computed` when the design has no probe / no
//!   pre-exposure window or the fit gives no interval.
//! * `rare_outcome`: value is the proportion of persons with an observation period that have
//!   the outcome in one (the package computes it in `getDbSccsData` over its study population;
//!   this is the whole store's), passing when ≤ the threshold or the analysis keeps every
//!   outcome.
//!
//! `sccs_time_to_event` returns, per exposure, the package's `computeTimeToEvent` (plotted by
//! `plotExposureCentered`): weeks −26 … 25 around each case's first exposure start (eras
//! starting inside the case window), `observed_cases` (cases observed in the week),
//! `outcomes_exposed` / `outcomes_unexposed` (outcomes whose day − first exposure start falls
//! in [7·week, 7·week + 7), exposed when inside one of the case's eras); weeks nobody is
//! observed in are left out.
//!
//! On a cluster both run as distributed queries under one merge node
//! ([`DiagnosticsWork::input_queries`], [`DiagnosticsWork::run_gathered`]): the partitioned SCCS
//! build's four queries (cases rebuilt by [`super::sccs_parts::gathered`]), the prevalence query
//! and the negative controls; the merge computes the local run's table from their results.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex, OnceLock};

use datafusion::arrow::array::{
    Array, ArrayRef, Float64Array, Int64Array, RecordBatch, StringArray,
};
use datafusion::arrow::compute::cast;
use datafusion::arrow::datatypes::{DataType, Field, Schema, SchemaRef};
use datafusion::catalog::{TableFunctionArgs, TableFunctionImpl, TableProvider};
use datafusion::common::{exec_datafusion_err, exec_err, plan_err, Result as DfResult};
use datafusion::prelude::SessionContext;
use epifusion_core::calibration::{ease, fit_null};
use epifusion_core::fit::{fit, FitOptions, FitResult};
use epifusion_core::model::design::{DesignBuilder, OutcomeRecord};
use epifusion_core::model::ModelKind;
use epifusion_core::sccs_diagnostics::{
    ci_intersects, classify_ease, classify_mdrr, classify_rare_outcome, mdrr,
    outcome_rate_per_month, time_stability, CaseMonths, DiagnosticThresholds, MonthCount,
    PreExposureCase, Status, TimeStability, TimeStabilityMemo,
};

use super::functions::StudyTable;
use super::sccs::{load_sccs, Anchor, SccsCases, PROBE_ID};
use super::{civil_from_days, query, Domain, SccsDesign};
use crate::fit_table::{check_table_arg, run_blocking, string_args, table_sql};

/// What a diagnostics function returns.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DiagnosticsPart {
    /// `sccs_diagnostics`: one row per exposure and diagnostic.
    Diagnostics,
    /// `sccs_time_to_event`: weeks around the first exposure start.
    TimeToEvent,
}

/// The diagnostics settings: an SCCS design plus thresholds and negative controls.
#[derive(Debug, Clone)]
pub struct DiagnosticsSettings {
    /// The design.
    pub design: SccsDesign,
    /// Thresholds.
    pub thresholds: DiagnosticThresholds,
    /// Table name or query of the negative-control estimates.
    pub negative_controls: Option<String>,
}

impl DiagnosticsSettings {
    /// Parse and check (planning errors name the key).
    pub fn from_json(function: &str, json: &str) -> DfResult<Self> {
        let mut value: serde_json::Value = serde_json::from_str(json)
            .map_err(|e| exec_datafusion_err!("{function}: settings are not JSON: {e}"))
            .or_else(|e| plan_err!("{e}"))?;
        let Some(obj) = value.as_object_mut() else {
            return plan_err!("{function}: settings must be a JSON object");
        };
        let thresholds: DiagnosticThresholds = match obj.remove("diagnostics") {
            None => DiagnosticThresholds::default(),
            Some(v) => {
                serde_json::from_value(v).or_else(|e| plan_err!("{function}: diagnostics: {e}"))?
            }
        };
        thresholds
            .check()
            .or_else(|e| plan_err!("{function}: {e}"))?;
        let negative_controls = match obj.remove("negative_controls") {
            None | Some(serde_json::Value::Null) => None,
            Some(serde_json::Value::String(s)) => {
                check_table_arg(function, 1, &s)?;
                Some(s)
            }
            Some(_) => {
                return plan_err!(
                    "{function}: negative_controls must be a table name or a query string"
                )
            }
        };
        let design = SccsDesign::from_json(&value.to_string())?;
        design.check()?;
        Ok(DiagnosticsSettings {
            design,
            thresholds,
            negative_controls,
        })
    }
}

/// `sccs_diagnostics` / `sccs_time_to_event`.
#[derive(Debug)]
pub struct SccsDiagnosticsFunction {
    name: &'static str,
    part: DiagnosticsPart,
}

impl SccsDiagnosticsFunction {
    /// The function `name` returning `part`.
    pub fn new(name: &'static str, part: DiagnosticsPart) -> Self {
        SccsDiagnosticsFunction { name, part }
    }
}

/// Schema of `sccs_diagnostics`.
pub fn diagnostics_schema() -> SchemaRef {
    Arc::new(Schema::new(vec![
        Field::new("exposure_index", DataType::Int64, false),
        Field::new("exposure", DataType::Utf8, false),
        Field::new("covariate_id", DataType::Int64, true),
        Field::new("diagnostic", DataType::Utf8, false),
        Field::new("value", DataType::Float64, true),
        Field::new("threshold", DataType::Utf8, false),
        Field::new("status", DataType::Utf8, false),
        Field::new("notes", DataType::Utf8, true),
    ]))
}

/// Schema of `sccs_time_to_event`.
pub fn time_to_event_schema() -> SchemaRef {
    Arc::new(Schema::new(vec![
        Field::new("exposure_index", DataType::Int64, false),
        Field::new("exposure", DataType::Utf8, false),
        Field::new("week", DataType::Int64, false),
        Field::new("start_day", DataType::Int64, false),
        Field::new("end_day", DataType::Int64, false),
        Field::new("observed_cases", DataType::Int64, false),
        Field::new("outcomes_exposed", DataType::Int64, false),
        Field::new("outcomes_unexposed", DataType::Int64, false),
    ]))
}

impl TableFunctionImpl for SccsDiagnosticsFunction {
    fn call_with_args(&self, args: TableFunctionArgs) -> DfResult<Arc<dyn TableProvider>> {
        let strings = string_args(self.name, args.exprs(), "settings JSON")?;
        if strings.len() != 1 {
            return plan_err!(
                "{} takes 1 argument (settings JSON), got {}",
                self.name,
                strings.len()
            );
        }
        let work = DiagnosticsWork::parse(self.name, self.part, &strings[0])?;
        Ok(Arc::new(StudyTable {
            name: self.name,
            schema: work.schema(),
            settings_json: strings[0].clone(),
        }))
    }
}

/// The checked settings of a diagnostics node ([`crate::exec::EpiExec`]).
#[derive(Debug, Clone)]
pub struct DiagnosticsWork {
    settings: Arc<DiagnosticsSettings>,
    part: DiagnosticsPart,
}

impl DiagnosticsWork {
    /// Parse and check `json` as the settings of `function` (`part`).
    pub fn parse(function: &str, part: DiagnosticsPart, json: &str) -> DfResult<Self> {
        Ok(DiagnosticsWork {
            settings: Arc::new(DiagnosticsSettings::from_json(function, json)?),
            part,
        })
    }

    /// The schema of the table returned.
    pub fn schema(&self) -> SchemaRef {
        match self.part {
            DiagnosticsPart::Diagnostics => diagnostics_schema(),
            DiagnosticsPart::TimeToEvent => time_to_event_schema(),
        }
    }

    /// Build the case data in `ctx`, fit and diagnose.
    pub async fn run(self, ctx: SessionContext) -> DfResult<RecordBatch> {
        match self.part {
            DiagnosticsPart::Diagnostics => diagnostics(&ctx, &self.settings).await,
            DiagnosticsPart::TimeToEvent => time_to_event(&ctx, &self.settings.design).await,
        }
    }

    /// The queries the table is computed from on a cluster, (SQL, name) in input order: the
    /// four of a partitioned SCCS build ([`super::sccs_parts::split_queries`]: `cases`,
    /// `outcomes`, `concepts`, `rows`), then for `sccs_diagnostics` the outcome's prevalence
    /// and, when the settings name them, the negative controls. Each runs as a distributed
    /// plan; [`Self::run_gathered`] computes the table from their whole results.
    pub fn input_queries(&self) -> DfResult<Vec<(String, &'static str)>> {
        let d = &self.settings.design;
        let names = ["cases", "outcomes", "concepts", "rows"];
        let mut out: Vec<(String, &'static str)> = super::sccs_parts::split_queries(d)?
            .into_iter()
            .zip(names)
            .collect();
        if self.part == DiagnosticsPart::Diagnostics {
            out.push((prevalence_sql(d), "prevalence"));
            if let Some(arg) = &self.settings.negative_controls {
                out.push((table_sql(arg), "negative_controls"));
            }
        }
        Ok(out)
    }

    /// The table from the whole results of [`Self::input_queries`] (same order): the local
    /// run's, bit for bit.
    pub async fn run_gathered(self, inputs: Vec<Vec<RecordBatch>>) -> DfResult<RecordBatch> {
        let expected = self.input_queries()?.len();
        if inputs.len() != expected {
            return exec_err!(
                "sccs diagnostics: {expected} query results expected, got {}",
                inputs.len()
            );
        }
        let s = self.settings.clone();
        let part = self.part;
        let ease_value = match inputs.get(5) {
            Some(nc) => Some(negative_control_ease(nc)?),
            None => None,
        };
        let prevalence = match (part, inputs.get(4)) {
            (DiagnosticsPart::Diagnostics, Some(p)) => Some(prevalence_of(p)?),
            _ => None,
        };
        let mut inputs = inputs;
        inputs.truncate(4);
        let d = s.design.clone();
        let cases = datafusion::common::runtime::SpawnedTask::spawn_blocking(move || {
            super::sccs_parts::gathered(&d, &inputs[0], &inputs[1], &inputs[2], &inputs[3])
        })
        .join()
        .await
        .map_err(|e| exec_datafusion_err!("sccs diagnostics: the case task failed: {e}"))??;
        match prevalence {
            Some(p) => diagnose(&s, Arc::new(cases), p, ease_value).await,
            None => time_to_event_table(&s.design, &cases),
        }
    }
}

fn exposure_label(d: &SccsDesign, x: usize) -> String {
    d.exposures[x]
        .label
        .clone()
        .unwrap_or_else(|| format!("exposure {}", x + 1))
}

/// A pre-exposure window: starts before the era start.
fn is_pre_exposure(start: i64, anchor: Anchor) -> bool {
    start < 0 && anchor == Anchor::EraStart
}

/// Per covariate: (days with it, observed days and outcomes of the informative cases with it).
type CovariateStats = HashMap<i64, (f64, f64, f64)>;

/// Fit the design's model on the informative cases; also the covariate statistics.
fn fit_cases(cases: &SccsCases) -> epifusion_core::Result<(Option<FitResult>, CovariateStats)> {
    let mut b = DesignBuilder::new();
    let mut stats: CovariateStats = HashMap::new();
    let (mut row, mut stratum) = (0i64, 0i64);
    for case in &cases.data {
        let Some(split) = cases.plan.split_case(case) else {
            continue;
        };
        stratum += 1;
        let (days, events): (i64, i64) = split
            .rows
            .iter()
            .fold((0, 0), |(d, e), r| (d + r.1, e + r.2));
        let mut seen: BTreeMap<i64, f64> = BTreeMap::new();
        for (pattern, d, y) in &split.rows {
            row += 1;
            b.push_outcome(OutcomeRecord {
                row_id: row,
                stratum_id: Some(stratum),
                time: Some(*d as f64),
                y: *y as f64,
                ..Default::default()
            });
            for &(id, v) in pattern {
                b.push_covariate(row, id, v);
                if v != 0.0 {
                    *seen.entry(id).or_default() += *d as f64;
                }
            }
        }
        for (id, d) in seen {
            let s = stats.entry(id).or_default();
            s.0 += d;
            s.1 += days as f64;
            s.2 += events as f64;
        }
    }
    if stratum == 0 {
        return Ok((None, stats));
    }
    let design = b.build()?;
    let mut opts = FitOptions::new(ModelKind::ConditionalPoisson);
    opts.threads = Some(1);
    // The diagnostics read the intervals of the probe and the pre-exposure windows only:
    // profile those (each the interval a full profile run gives), not every spline and
    // window coefficient.
    let mut wanted: Vec<i64> = Vec::new();
    if cases.plan.probe_days().is_some() {
        wanted.push(PROBE_ID);
    }
    for (_, w, ids) in cases.plan.window_ids() {
        if is_pre_exposure(w.start, w.start_anchor) {
            wanted.extend(ids);
        }
    }
    wanted.retain(|&id| design.column_index(id).is_some());
    opts.profile.covariates = wanted;
    opts.profile.only_covariates = true;
    Ok((Some(fit(&design, &opts)?), stats))
}

/// The query of [`prevalence_of`]: persons with the outcome inside an observation period, and
/// persons with an observation period (one row; two aggregates joined, no scalar subquery, so
/// that the plan can travel to a cluster's executors).
fn prevalence_sql(d: &SccsDesign) -> String {
    let outcomes = d.outcome.sql(Domain::ConditionOccurrence);
    format!(
        "SELECT CAST(w.n AS DOUBLE) AS with_outcome, CAST(a.n AS DOUBLE) AS persons FROM \
         (SELECT count(DISTINCT o.person_id) AS n FROM ({outcomes}) AS o \
           JOIN observation_period op ON op.person_id = o.person_id \
           AND o.start_day BETWEEN CAST(op.observation_period_start_date AS INT) \
           AND CAST(op.observation_period_end_date AS INT)) AS w \
         CROSS JOIN (SELECT count(DISTINCT op.person_id) AS n FROM observation_period op \
           JOIN person p ON p.person_id = op.person_id) AS a"
    )
}

/// The proportion of persons with an observation period who have the outcome in one, from the
/// result of [`prevalence_sql`] (NaN when there is nobody).
fn prevalence_of(b: &[RecordBatch]) -> DfResult<f64> {
    let Some(b) = b.iter().find(|b| b.num_rows() > 0) else {
        return exec_err!("prevalence: the query returned no row");
    };
    let col = |name: &str| -> DfResult<f64> {
        let a = b
            .column_by_name(name)
            .ok_or_else(|| exec_datafusion_err!("prevalence: no column {name}"))?;
        let a = cast(a, &DataType::Float64)?;
        let a = a
            .as_any()
            .downcast_ref::<Float64Array>()
            .ok_or_else(|| exec_datafusion_err!("prevalence: {name} is not numeric"))?;
        Ok(if a.is_null(0) { 0.0 } else { a.value(0) })
    };
    let (with, persons) = (col("with_outcome")?, col("persons")?);
    Ok(if persons > 0.0 {
        with / persons
    } else {
        f64::NAN
    })
}

/// EASE of the negative-control estimates in `batches` (`log_rr`, `se_log_rr`).
fn negative_control_ease(batches: &[RecordBatch]) -> DfResult<f64> {
    let (mut lr, mut se) = (Vec::new(), Vec::new());
    for b in batches {
        let get = |name: &str| -> DfResult<ArrayRef> {
            let a = b.column_by_name(name).ok_or_else(|| {
                exec_datafusion_err!("negative_controls: no column `{name}` (log_rr, se_log_rr)")
            })?;
            Ok(cast(a, &DataType::Float64)?)
        };
        let (l, s) = (get("log_rr")?, get("se_log_rr")?);
        let (l, s) = (
            l.as_any().downcast_ref::<Float64Array>(),
            s.as_any().downcast_ref::<Float64Array>(),
        );
        let (Some(l), Some(s)) = (l, s) else {
            return exec_err!("negative_controls: log_rr and se_log_rr must be numeric");
        };
        for i in 0..l.len() {
            if l.is_null(i) || s.is_null(i) {
                return exec_err!(
                    "negative_controls: row {} has a NULL estimate",
                    lr.len() + 1
                );
            }
            lr.push(l.value(i));
            se.push(s.value(i));
        }
    }
    let null = fit_null(&lr, &se).map_err(|e| exec_datafusion_err!("negative_controls: {e}"))?;
    Ok(ease(&null))
}

struct Row {
    exposure: usize,
    covariate_id: Option<i64>,
    diagnostic: &'static str,
    value: Option<f64>,
    threshold: String,
    status: Status,
    notes: Option<String>,
}

fn fmt_bounds(b: [f64; 2]) -> String {
    format!("[{}, {}]", b[0], b[1])
}

/// Interval check of a coefficient (probe or pre-exposure window).
fn interval_row(
    fit: Option<&FitResult>,
    id: i64,
    bounds: [f64; 2],
) -> (Option<f64>, Status, String) {
    let Some(c) = fit.and_then(|f| f.coefficient(id)) else {
        return (
            None,
            Status::NotComputed,
            format!("covariate {id} is not in the fitted model (no informative case has it)"),
        );
    };
    let (lb, ub) = (c.ci_lower.map(f64::exp), c.ci_upper.map(f64::exp));
    if c.aliased || (lb.is_none() && ub.is_none()) {
        return (
            Some(c.estimate.exp()),
            Status::NotComputed,
            format!("covariate {id} has no confidence interval (held at 0 or no finite estimate)"),
        );
    }
    let pass = ci_intersects(lb, ub, bounds);
    let show = |v: Option<f64>| v.map_or("unbounded".to_string(), |v| format!("{v:.4}"));
    (
        Some(c.estimate.exp()),
        if pass { Status::Pass } else { Status::Fail },
        format!(
            "IRR {:.4}, 95% CI {} – {}; passes when the interval intersects the null bounds",
            c.estimate.exp(),
            show(lb),
            show(ub)
        ),
    )
}

async fn diagnostics(ctx: &SessionContext, s: &DiagnosticsSettings) -> DfResult<RecordBatch> {
    let d = &s.design;
    // The negative controls first: a query that is not read-only is refused before any work.
    let ease_value = match &s.negative_controls {
        Some(arg) => Some(negative_control_ease(&query(ctx, &table_sql(arg)).await?)?),
        None => None,
    };
    let cases = Arc::new(load_sccs(ctx, d).await?);
    let prevalence = prevalence_of(&query(ctx, &prevalence_sql(d)).await?)?;
    diagnose(s, cases, prevalence, ease_value).await
}

/// The diagnostics rows from the design's cases, the outcome's prevalence and the negative
/// controls' EASE (`None`: none given).
async fn diagnose(
    s: &DiagnosticsSettings,
    cases: Arc<SccsCases>,
    prevalence: f64,
    ease_value: Option<f64>,
) -> DfResult<RecordBatch> {
    let d = &s.design;
    let t = &s.thresholds;
    let fit_input = cases.clone();
    let (fit_result, stats) =
        run_blocking("sccs_diagnostics fit", move || fit_cases(&fit_input)).await?;
    let fit_ref = fit_result.as_ref();

    // Time stability over every case of the study population.
    let coefs: HashMap<i64, f64> = fit_ref
        .map(|f| {
            f.coefficients
                .iter()
                .map(|c| (c.covariate_id, c.estimate))
                .collect()
        })
        .unwrap_or_default();
    let adjusted = cases.plan.has_time_splines();
    let months = month_counts(&cases, fit_ref.map(|_| &coefs));
    let observed: Vec<u64> = months.iter().map(|m| m.observed).collect();
    let expected: Vec<f64> = months.iter().map(|m| m.expected).collect();
    let stability = time_stability(
        &observed,
        &expected,
        t.time_trend_max_ratio,
        t.time_trend_alpha,
    );

    let plan = &cases.plan;
    let windows = plan.window_ids();
    let mut rows = Vec::new();
    for x in 0..d.exposures.len() {
        // MDRR per covariate of the exposure's (non pre-exposure) windows.
        let mut pre = Vec::new();
        for (e, w, ids) in &windows {
            if *e != x {
                continue;
            }
            if is_pre_exposure(w.start, w.start_anchor) {
                pre.extend(ids.iter().copied());
                continue;
            }
            for &id in ids {
                let (value, status, notes) = match stats.get(&id) {
                    Some(&(days, observed_days, outcomes)) => {
                        let m = mdrr(
                            days / observed_days,
                            outcomes,
                            t.mdrr_alpha,
                            t.mdrr_power,
                            t.mdrr_two_sided,
                        );
                        (
                            Some(m),
                            classify_mdrr(m, t),
                            format!(
                                "SRL1 (Musonda et al. 2006): {days} days exposed of {observed_days} observed days, {outcomes} outcomes, alpha {}{}, power {}",
                                t.mdrr_alpha,
                                if t.mdrr_two_sided { " two-sided" } else { " one-sided" },
                                t.mdrr_power
                            ),
                        )
                    }
                    None => (
                        Some(f64::INFINITY),
                        Status::Fail,
                        "no informative case has this covariate".to_string(),
                    ),
                };
                rows.push(Row {
                    exposure: x,
                    covariate_id: Some(id),
                    diagnostic: "mdrr",
                    value,
                    threshold: t.mdrr.to_string(),
                    status,
                    notes: Some(notes),
                });
            }
        }
        rows.push(match ease_value {
            Some(e) => Row {
                exposure: x,
                covariate_id: None,
                diagnostic: "ease",
                value: Some(e),
                threshold: t.ease.to_string(),
                status: classify_ease(e, t),
                notes: Some(
                    "maximum-likelihood empirical null of the negative controls (fitNull)".into(),
                ),
            },
            None => Row {
                exposure: x,
                covariate_id: None,
                diagnostic: "ease",
                value: None,
                threshold: t.ease.to_string(),
                status: Status::NotComputed,
                notes: Some("no negative_controls in the settings".into()),
            },
        });
        rows.push(Row {
            exposure: x,
            covariate_id: None,
            diagnostic: "time_stability",
            value: Some(stability.p),
            threshold: format!(
                "p > {} (max ratio {})",
                t.time_trend_alpha, t.time_trend_max_ratio
            ),
            status: if stability.stable {
                Status::Pass
            } else {
                Status::Fail
            },
            notes: Some(format!(
                "{} months with outcomes; observed / expected ratio {}{}",
                observed.len(),
                stability
                    .ratio
                    .map_or("not estimated (fewer than 2 months)".into(), |r| format!(
                        "{r:.4}"
                    )),
                if adjusted {
                    "; adjusted for the fitted season / calendar-time splines"
                } else {
                    ""
                }
            )),
        });
        // Probe.
        let (value, status, notes) = match plan.probe_days() {
            Some(_) => interval_row(fit_ref, PROBE_ID, t.event_observation_null_bounds),
            None => (
                None,
                Status::NotComputed,
                "the settings have no end_of_observation_probe".to_string(),
            ),
        };
        rows.push(Row {
            exposure: x,
            covariate_id: Some(PROBE_ID),
            diagnostic: "event_observation",
            value,
            threshold: fmt_bounds(t.event_observation_null_bounds),
            status,
            notes: Some(notes),
        });
        // Pre-exposure windows.
        if pre.is_empty() {
            rows.push(Row {
                exposure: x,
                covariate_id: None,
                diagnostic: "event_exposure",
                value: None,
                threshold: fmt_bounds(t.event_exposure_null_bounds),
                status: Status::NotComputed,
                notes: Some(
                    "the exposure has no pre-exposure window (a risk window with start < 0 at era_start)"
                        .into(),
                ),
            });
        }
        for id in pre {
            let (value, status, notes) = interval_row(fit_ref, id, t.event_exposure_null_bounds);
            rows.push(Row {
                exposure: x,
                covariate_id: Some(id),
                diagnostic: "event_exposure",
                value,
                threshold: fmt_bounds(t.event_exposure_null_bounds),
                status,
                notes: Some(notes),
            });
        }
        rows.push(Row {
            exposure: x,
            covariate_id: None,
            diagnostic: "rare_outcome",
            value: Some(prevalence).filter(|p| !p.is_nan()),
            threshold: t.rare_outcome_max_prevalence.to_string(),
            status: classify_rare_outcome(prevalence, d.first_outcome_only, t),
            notes: Some(if d.first_outcome_only {
                "proportion of persons with an observation period who have the outcome".into()
            } else {
                "passes: the analysis keeps every outcome (first_outcome_only is false)".into()
            }),
        });
    }
    let columns: Vec<ArrayRef> = vec![
        Arc::new(Int64Array::from_iter_values(
            rows.iter().map(|r| r.exposure as i64),
        )),
        Arc::new(StringArray::from_iter_values(
            rows.iter().map(|r| exposure_label(d, r.exposure)),
        )),
        Arc::new(Int64Array::from_iter(rows.iter().map(|r| r.covariate_id))),
        Arc::new(StringArray::from_iter_values(
            rows.iter().map(|r| r.diagnostic),
        )),
        Arc::new(Float64Array::from_iter(rows.iter().map(|r| r.value))),
        Arc::new(StringArray::from_iter_values(
            rows.iter().map(|r| r.threshold.clone()),
        )),
        Arc::new(StringArray::from_iter_values(
            rows.iter().map(|r| r.status.name()),
        )),
        Arc::new(StringArray::from_iter(rows.iter().map(|r| r.notes.clone()))),
    ];
    Ok(RecordBatch::try_new(diagnostics_schema(), columns)?)
}

/// Each case's observation in calendar months, with its outcomes' months (R
/// `computeOutcomeRatePerMonth`'s `cases`).
fn case_months(cases: &SccsCases) -> Vec<CaseMonths> {
    let month_of = |day: i64| {
        let (y, m, _) = civil_from_days(day);
        y * 12 + m - 1
    };
    cases
        .data
        .iter()
        .filter(|c| c.end >= c.start)
        .map(|c| {
            let (_, _, ds) = civil_from_days(c.start);
            let (_, _, de) = civil_from_days(c.end);
            CaseMonths {
                start_month: month_of(c.start),
                start_day_of_month: ds as u32,
                end_month: month_of(c.end),
                end_day_of_month: de as u32,
                outcome_months: c.events.iter().map(|&e| month_of(e)).collect(),
            }
        })
        .collect()
}

/// Observed and expected outcomes per calendar month over every case of the study population
/// ([`outcome_rate_per_month`]); with `coefficients` (a fitted model's estimates by covariate
/// id) the expected counts are adjusted for the model's season and calendar-time splines.
pub fn month_counts(
    cases: &SccsCases,
    coefficients: Option<&HashMap<i64, f64>>,
) -> Vec<MonthCount> {
    counts_of(&case_months(cases), cases, coefficients)
}

/// The coefficients that adjust the expected counts: `coefficients` when the design has season
/// or calendar-time splines, none otherwise (every month's rate ratio is then 1, and the
/// adjusted counts are the plain ones bit for bit: each correction is Σw·1/Σw = 1 exactly).
fn spline_coefficients<'a>(
    cases: &SccsCases,
    coefficients: Option<&'a HashMap<i64, f64>>,
) -> Option<&'a HashMap<i64, f64>> {
    coefficients.filter(|_| cases.plan.has_time_splines())
}

/// [`month_counts`] of the cases' months `months`.
fn counts_of(
    months: &[CaseMonths],
    cases: &SccsCases,
    coefficients: Option<&HashMap<i64, f64>>,
) -> Vec<MonthCount> {
    let Some(coefs) = spline_coefficients(cases, coefficients) else {
        return outcome_rate_per_month(months, None);
    };
    let plan = &cases.plan;
    let rr_of = |month: i64| -> f64 {
        let day = super::days_from_civil(month.div_euclid(12), month.rem_euclid(12) + 1, 1);
        plan.season_calendar_covariates(day)
            .iter()
            .map(|(id, v)| coefs.get(id).copied().unwrap_or(0.0) * v)
            .sum::<f64>()
            .exp()
    };
    // Each month's ratio once (it is asked for every month of every case).
    let first = months.iter().map(|c| c.start_month).min().unwrap_or(0);
    let last = months.iter().map(|c| c.end_month).max().unwrap_or(-1);
    let table: Vec<f64> = (first..=last).map(rr_of).collect();
    let month_rr = |month: i64| -> f64 {
        usize::try_from(month - first)
            .ok()
            .and_then(|i| table.get(i).copied())
            .unwrap_or_else(|| rr_of(month))
    };
    outcome_rate_per_month(months, Some(&month_rr))
}

/// One calendar month of the time trend (the OHDSI results model's `sccs_time_trend`).
#[derive(Debug, Clone, PartialEq)]
pub struct TrendMonth {
    /// Month index (year·12 + month − 1).
    pub month: i64,
    /// Outcomes in the month.
    pub observed: u64,
    /// Cases observed in the month, weighted by the fraction of the month observed.
    pub observation_period_count: f64,
    /// Observed / expected with a constant rate per case.
    pub ratio: f64,
    /// Observed / expected adjusted for the season and calendar-time splines (= `ratio`
    /// without them).
    pub adjusted_ratio: f64,
}

/// What the pairs of one many-pairs unit share in [`time_trend`]: the exposures of one outcome
/// share its cases ([`super::sccs_many::ExposureCases`]), so each distinct case set's months
/// and plain monthly counts are computed once, and each distinct time-stability test once
/// ([`TimeStabilityMemo`]: without time splines every pair asks the same). Results are those
/// of computing each pair on its own, bit for bit.
#[derive(Debug, Default)]
pub struct TrendMemo {
    stability: TimeStabilityMemo,
    /// Per case set (held, so compared by address for as long as the memo lives): its months
    /// and plain counts, formed by the first pair that asks.
    bases: Mutex<Vec<(Arc<SccsCases>, TrendBaseCell)>>,
}

/// The cases' months and their plain (unadjusted) monthly counts, once formed.
type TrendBaseCell = Arc<OnceLock<(Vec<CaseMonths>, Vec<MonthCount>)>>;

impl TrendMemo {
    /// An empty memo.
    pub fn new() -> Self {
        Self::default()
    }

    /// The cell of `cases`' months and plain counts (one per case set; [`trend_base`] fills
    /// it once).
    fn base(&self, cases: &Arc<SccsCases>) -> TrendBaseCell {
        let cell = {
            // A poisoned lock only means another pair panicked while holding it; the list
            // itself is whole (entries are pushed in one step).
            let mut bases = self.bases.lock().unwrap_or_else(|e| e.into_inner());
            match bases.iter().find(|(c, _)| Arc::ptr_eq(c, cases)) {
                Some((_, cell)) => cell.clone(),
                None => {
                    let cell = TrendBaseCell::default();
                    bases.push((cases.clone(), cell.clone()));
                    cell
                }
            }
        };
        cell
    }
}

/// The cases' months and their plain monthly counts.
fn trend_base(cases: &SccsCases) -> (Vec<CaseMonths>, Vec<MonthCount>) {
    let months = case_months(cases);
    let plain = counts_of(&months, cases, None);
    (months, plain)
}

/// The time trend of R `computeOutcomeRatePerMonth(studyPopulation, sccsModel)` (months with
/// at least one outcome) and its stability test (R `computeTimeStability` with `max_ratio`:
/// the adjusted expected counts against the observed). With `memo`, what the pairs of a unit
/// share is looked up there ([`TrendMemo`]; the results are the same).
pub fn time_trend(
    cases: &Arc<SccsCases>,
    coefficients: Option<&HashMap<i64, f64>>,
    max_ratio: f64,
    alpha: f64,
    memo: Option<&TrendMemo>,
) -> (Vec<TrendMonth>, TimeStability) {
    let own;
    let shared;
    let (case_months, plain) = match memo {
        Some(m) => {
            shared = m.base(cases);
            shared.get_or_init(|| trend_base(cases))
        }
        None => {
            own = trend_base(cases);
            &own
        }
    };
    let adjusted = match spline_coefficients(cases, coefficients) {
        Some(c) => counts_of(case_months, cases, Some(c)),
        None => plain.clone(),
    };
    let months: Vec<TrendMonth> = plain
        .iter()
        .zip(&adjusted)
        .map(|(p, a)| TrendMonth {
            month: p.month,
            observed: p.observed,
            observation_period_count: p.observation_period_count,
            ratio: p.observed as f64 / p.expected,
            adjusted_ratio: a.observed as f64 / a.expected,
        })
        .collect();
    let observed: Vec<u64> = adjusted.iter().map(|m| m.observed).collect();
    let expected: Vec<f64> = adjusted.iter().map(|m| m.expected).collect();
    let stability = match memo {
        Some(m) => m
            .stability
            .time_stability(&observed, &expected, max_ratio, alpha),
        None => time_stability(&observed, &expected, max_ratio, alpha),
    };
    (months, stability)
}

/// The cases of R `computePreExposureGain` for one exposure: eras starting inside the case
/// window (`eraStartDay ≥ startDay`, `< endDay`), the first of them, and per case the days
/// observed before it (`min(first − start, 30)`) and from it (`min(end − first, 30)`) with the
/// outcomes whose day − first is in [−30, −1] and [0, 30]; a side with no observed day keeps
/// no outcomes (R drops the row).
pub fn pre_exposure_cases(cases: &SccsCases, exposure: usize) -> Vec<PreExposureCase> {
    cases
        .data
        .iter()
        .filter_map(|c| {
            let first = c
                .eras
                .iter()
                .filter(|e| e.exposure == exposure && e.start >= c.start && e.start < c.end)
                .map(|e| e.start)
                .min()?;
            let days_before = (first - c.start).min(30);
            let days_after = (c.end - first).min(30);
            let (mut before, mut after) = (0u64, 0u64);
            for &day in &c.events {
                let delta = day - first;
                if (-30..0).contains(&delta) {
                    before += 1;
                } else if (0..=30).contains(&delta) {
                    after += 1;
                }
            }
            Some(PreExposureCase {
                days_before: days_before.max(0) as f64,
                outcomes_before: if days_before > 0 { before } else { 0 },
                days_after: days_after.max(0) as f64,
                outcomes_after: if days_after > 0 { after } else { 0 },
            })
        })
        .collect()
}

/// Weeks of `computeTimeToEvent` for one exposure: (week, observed cases, exposed outcomes,
/// unexposed outcomes), weeks with nobody observed left out.
pub fn time_to_event_weeks(cases: &SccsCases, exposure: usize) -> Vec<(i64, i64, i64, i64)> {
    let mut weeks: BTreeMap<i64, (i64, i64, i64)> = BTreeMap::new();
    for c in &cases.data {
        // Eras starting inside the case window (R: eraStartDay ≥ startDay, < endDay).
        let eras: Vec<(i64, i64)> = c
            .eras
            .iter()
            .filter(|e| e.exposure == exposure && e.start >= c.start && e.start < c.end)
            .map(|e| (e.start, e.end))
            .collect();
        let Some(first) = eras.iter().map(|e| e.0).min() else {
            continue;
        };
        let (start_delta, end_delta) = (c.start - first, c.end - first);
        for week in -26..=25i64 {
            let (lo, hi) = (week * 7, week * 7 + 7);
            if end_delta >= lo && start_delta < hi {
                weeks.entry(week).or_default().0 += 1;
            }
        }
        for &day in &c.events {
            let delta = day - first;
            let week = delta.div_euclid(7);
            if !(-26..=25).contains(&week) {
                continue;
            }
            let exposed = eras.iter().any(|&(s, e)| day >= s && day <= e);
            let w = weeks.entry(week).or_default();
            if exposed {
                w.1 += 1;
            } else {
                w.2 += 1;
            }
        }
    }
    weeks
        .into_iter()
        .filter(|(_, w)| w.0 > 0)
        .map(|(week, w)| (week, w.0, w.1, w.2))
        .collect()
}

async fn time_to_event(ctx: &SessionContext, d: &SccsDesign) -> DfResult<RecordBatch> {
    time_to_event_table(d, &load_sccs(ctx, d).await?)
}

/// The `sccs_time_to_event` table of a design's cases.
fn time_to_event_table(d: &SccsDesign, cases: &SccsCases) -> DfResult<RecordBatch> {
    let mut rows = Vec::new();
    for x in 0..d.exposures.len() {
        for w in time_to_event_weeks(cases, x) {
            rows.push((x, w));
        }
    }
    let columns: Vec<ArrayRef> = vec![
        Arc::new(Int64Array::from_iter_values(
            rows.iter().map(|r| r.0 as i64),
        )),
        Arc::new(StringArray::from_iter_values(
            rows.iter().map(|r| exposure_label(d, r.0)),
        )),
        Arc::new(Int64Array::from_iter_values(rows.iter().map(|r| r.1 .0))),
        Arc::new(Int64Array::from_iter_values(
            rows.iter().map(|r| r.1 .0 * 7),
        )),
        Arc::new(Int64Array::from_iter_values(
            rows.iter().map(|r| r.1 .0 * 7 + 6),
        )),
        Arc::new(Int64Array::from_iter_values(rows.iter().map(|r| r.1 .1))),
        Arc::new(Int64Array::from_iter_values(rows.iter().map(|r| r.1 .2))),
        Arc::new(Int64Array::from_iter_values(rows.iter().map(|r| r.1 .3))),
    ];
    Ok(RecordBatch::try_new(time_to_event_schema(), columns)?)
}
