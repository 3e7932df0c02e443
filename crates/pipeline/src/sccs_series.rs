//! The per-pair tables of an SCCS unit that the OHDSI results model needs beyond the
//! estimates ([`crate::sccs_results`] turns them into `sccs_likelihood_profile`,
//! `sccs_time_trend`, `sccs_time_to_event`, `sccs_result.llr` and the time-trend and
//! pre-exposure columns of `sccs_diagnostics_summary`). Written beside the unit's other objects,
//! one row set per exposure:
//!
//! | object | rows | from |
//! |---|---|---|
//! | `sccs_profile` | exposure × covariate of interest × grid point (and the estimate) | a second fit of the pair's tables with the same options plus `profile` on [`profile_grid`] (`table = "profile"`), so the estimates are exactly those without it |
//! | `sccs_time_trend` | exposure × calendar month with an outcome | [`epifusion_sql::study::diagnostics::time_trend`] (R `computeOutcomeRatePerMonth`) |
//! | `sccs_time_to_event` | exposure × week −26 … 25 with someone observed | [`epifusion_sql::study::diagnostics::time_to_event_weeks`] (R `computeTimeToEvent`) |
//! | `sccs_pair_diagnostics` | exposure | the time-stability test (R `computeTimeStability`, max ratio 1.25) and the pre-exposure gain (R `computePreExposureGain`) |

use std::collections::{BTreeSet, HashMap};
use std::sync::Arc;

use datafusion::arrow::array::{Array, ArrayRef, AsArray, Float64Array, Int64Array, StringArray};
use datafusion::arrow::compute::cast;
use datafusion::arrow::datatypes::{DataType, Field, Float64Type, Int64Type, Schema, SchemaRef};
use datafusion::arrow::record_batch::RecordBatch;
use datafusion::common::{exec_datafusion_err, Result as DfResult};
use epifusion_core::sccs_diagnostics::{
    pre_exposure_gain, PreExposureGain, TimeStability, RESULTS_P_THRESHOLD,
    RESULTS_TIME_TREND_MAX_RATIO,
};
use epifusion_sql::study::diagnostics::{
    pre_exposure_cases, time_to_event_weeks, time_trend, TrendMemo, TrendMonth,
};
use epifusion_sql::study::ExposureCases;

use super::many::EXPOSURE_BASE;
use super::plan::Analysis;
use super::tables::StudyTables;

/// Grid points on each side of 0 of the likelihood profiles.
pub const PROFILE_STEPS_PER_SIDE: i32 = 100;

/// The β values of the likelihood profiles: `k · ln 10 / 100` for k = −100 … 100, i.e. 201
/// equally spaced points over the SCCS package's default `profileBounds` [ln 0.1, ln 10]
/// (the package samples that range adaptively; a fixed grid makes the rows reproducible),
/// with 0 exactly on it so that `llr` is read from the profile.
pub fn profile_grid() -> Vec<f64> {
    let step = 10f64.ln() / f64::from(PROFILE_STEPS_PER_SIDE);
    (-PROFILE_STEPS_PER_SIDE..=PROFILE_STEPS_PER_SIDE)
        .map(|k| f64::from(k) * step)
        .collect()
}

fn column<'a>(b: &'a RecordBatch, name: &str) -> DfResult<&'a ArrayRef> {
    b.column_by_name(name)
        .ok_or_else(|| exec_datafusion_err!("SCCS unit: a table without `{name}`"))
}

/// The covariates of interest (ids ≥ 1000) that the pair's covariates table has entries for
/// (a window nobody is in is not a column of the design, so it has no profile).
fn covariates_of_interest(t: &StudyTables) -> DfResult<Vec<i64>> {
    let mut ids = BTreeSet::new();
    for b in &t.covariates {
        let c = cast(column(b, "covariate_id")?, &DataType::Int64)?;
        let c = c.as_primitive::<Int64Type>();
        for i in 0..c.len() {
            if !c.is_null(i) && c.value(i) >= EXPOSURE_BASE {
                ids.insert(c.value(i));
            }
        }
    }
    Ok(ids.into_iter().collect())
}

/// The likelihood profiles of the pair's covariates of interest on [`profile_grid`]: the fit's
/// `profile` table (`covariate_id, value, profile, log_likelihood, is_estimate`, where
/// `profile` is the profiled objective with the coefficient's own penalty, as Cyclops'
/// `getCyclopsProfileLogLikelihood(includePenalty = TRUE)` that the SCCS package calls).
/// The second fit drops `bootstrap` and sets `ci = "none"` (nothing it would add is read).
/// None when the pair has no covariate of interest in its design.
pub async fn likelihood_profile(a: &Analysis, t: &StudyTables) -> DfResult<Option<RecordBatch>> {
    let ids = covariates_of_interest(t)?;
    if ids.is_empty() || t.outcomes.is_empty() {
        return Ok(None);
    }
    let mut options = match &a.fit_options {
        serde_json::Value::Object(m) => m.clone(),
        _ => serde_json::Map::new(),
    };
    options.remove("bootstrap");
    options.insert("ci".into(), serde_json::json!("none"));
    options.insert(
        "profile".into(),
        serde_json::json!({"covariates": ids, "grid": profile_grid()}),
    );
    options.insert("table".into(), serde_json::json!("profile"));
    let out = epifusion_sql::fit_table::fit_batches(
        a.model.descriptor().table_function,
        &serde_json::Value::Object(options).to_string(),
        (t.outcomes[0].schema(), t.outcomes.clone()),
        Some((t.covariates[0].schema(), t.covariates.clone())),
    )
    .await?;
    Ok(Some(out.batch))
}

/// The fitted coefficients of a pair by covariate id (its `estimates` batches).
pub fn coefficients(estimates: &[RecordBatch]) -> DfResult<HashMap<i64, f64>> {
    let mut out = HashMap::new();
    for b in estimates {
        let id = cast(column(b, "covariate_id")?, &DataType::Int64)?;
        let est = cast(column(b, "estimate")?, &DataType::Float64)?;
        let (id, est) = (
            id.as_primitive::<Int64Type>(),
            est.as_primitive::<Float64Type>(),
        );
        for i in 0..b.num_rows() {
            if !id.is_null(i) && !est.is_null(i) {
                out.insert(id.value(i), est.value(i));
            }
        }
    }
    Ok(out)
}

/// What one pair's time-based diagnostics compute.
#[derive(Debug, Clone)]
pub struct PairSeries {
    /// Months with an outcome.
    pub trend: Vec<TrendMonth>,
    /// The time-stability test of the adjusted trend (max ratio 1.25).
    pub stability: TimeStability,
    /// `(week, observed cases, exposed outcomes, unexposed outcomes)`.
    pub weeks: Vec<(i64, i64, i64, i64)>,
    /// The pre-exposure gain (None: no case informs it).
    pub pre_exposure: Option<PreExposureGain>,
}

/// The time trend (adjusted by the pair's fitted season / calendar-time splines when the
/// design has them; `coefficients` empty: unadjusted), the time to event and the pre-exposure
/// gain of one pair. What the pairs of one unit share is looked up in `memo` (see
/// [`TrendMemo`]). CPU work: call it on a blocking thread.
pub fn pair_series(
    cases: &ExposureCases,
    coefficients: &HashMap<i64, f64>,
    memo: &TrendMemo,
) -> PairSeries {
    let (trend, stability) = time_trend(
        &cases.cases,
        Some(coefficients),
        RESULTS_TIME_TREND_MAX_RATIO,
        RESULTS_P_THRESHOLD,
        Some(memo),
    );
    PairSeries {
        trend,
        stability,
        weeks: time_to_event_weeks(&cases.cases, cases.exposure),
        pre_exposure: pre_exposure_gain(&pre_exposure_cases(&cases.cases, cases.exposure)),
    }
}

fn strings(v: Vec<String>) -> ArrayRef {
    Arc::new(StringArray::from(v))
}

fn schema(fields: Vec<(&str, DataType)>) -> SchemaRef {
    Arc::new(Schema::new(
        fields
            .into_iter()
            .map(|(n, t)| Field::new(n, t, true))
            .collect::<Vec<_>>(),
    ))
}

fn batch(fields: Vec<(&str, DataType)>, columns: Vec<ArrayRef>) -> DfResult<RecordBatch> {
    Ok(RecordBatch::try_new(schema(fields), columns)?)
}

/// The unit's `sccs_profile`, `sccs_time_trend`, `sccs_time_to_event` and
/// `sccs_pair_diagnostics` objects from each exposure's profile and series (see the
/// [module docs](self)); each has `analysis_id` (the unit) and `exposure` first.
pub fn unit_tables(
    a: &Analysis,
    pairs: &[(String, Option<RecordBatch>, Option<PairSeries>)],
) -> DfResult<Vec<(String, Vec<RecordBatch>)>> {
    use DataType::{Boolean, Float64, Int64, Utf8};
    let unit = |n: usize| strings(vec![a.id.clone(); n]);
    // Profiles.
    let profile_fields = || {
        vec![
            ("analysis_id", Utf8),
            ("exposure", Utf8),
            ("covariate_id", Int64),
            ("log_rr", Float64),
            ("profile", Float64),
            ("log_likelihood", Float64),
            ("is_estimate", Boolean),
        ]
    };
    let mut profile = Vec::new();
    for (exposure, p, _) in pairs {
        let Some(p) = p else { continue };
        let n = p.num_rows();
        profile.push(batch(
            profile_fields(),
            vec![
                unit(n),
                strings(vec![exposure.clone(); n]),
                cast(column(p, "covariate_id")?, &Int64)?,
                cast(column(p, "value")?, &Float64)?,
                cast(column(p, "profile")?, &Float64)?,
                cast(column(p, "log_likelihood")?, &Float64)?,
                cast(column(p, "is_estimate")?, &Boolean)?,
            ],
        )?);
    }
    if profile.is_empty() {
        profile.push(RecordBatch::new_empty(schema(profile_fields())));
    }
    let series: Vec<(&String, &PairSeries)> = pairs
        .iter()
        .filter_map(|(e, _, s)| s.as_ref().map(|s| (e, s)))
        .collect();
    // Time trend.
    let rows: Vec<(&String, &TrendMonth)> = series
        .iter()
        .flat_map(|(e, s)| s.trend.iter().map(move |m| (*e, m)))
        .collect();
    let trend = batch(
        vec![
            ("analysis_id", Utf8),
            ("exposure", Utf8),
            ("calendar_year", Int64),
            ("calendar_month", Int64),
            ("observed_subjects", Int64),
            ("observation_period_count", Float64),
            ("outcomes", Int64),
            ("ratio", Float64),
            ("adjusted_ratio", Float64),
        ],
        vec![
            unit(rows.len()),
            strings(rows.iter().map(|r| r.0.clone()).collect()),
            Arc::new(Int64Array::from_iter_values(
                rows.iter().map(|r| r.1.month.div_euclid(12)),
            )),
            Arc::new(Int64Array::from_iter_values(
                rows.iter().map(|r| r.1.month.rem_euclid(12) + 1),
            )),
            // R: `observedSubjects = round(observationPeriodCount)`.
            Arc::new(Int64Array::from_iter_values(
                rows.iter()
                    .map(|r| r.1.observation_period_count.round() as i64),
            )),
            Arc::new(Float64Array::from_iter_values(
                rows.iter().map(|r| r.1.observation_period_count),
            )),
            Arc::new(Int64Array::from_iter_values(
                rows.iter().map(|r| r.1.observed as i64),
            )),
            Arc::new(Float64Array::from_iter_values(
                rows.iter().map(|r| r.1.ratio),
            )),
            Arc::new(Float64Array::from_iter_values(
                rows.iter().map(|r| r.1.adjusted_ratio),
            )),
        ],
    )?;
    // Time to event.
    type WeekRow<'a> = (&'a String, (i64, i64, i64, i64));
    let weeks: Vec<WeekRow> = series
        .iter()
        .flat_map(|(e, s)| s.weeks.iter().map(move |w| (*e, *w)))
        .collect();
    let tte = batch(
        vec![
            ("analysis_id", Utf8),
            ("exposure", Utf8),
            ("week", Int64),
            ("observed_subjects", Int64),
            ("outcomes_exposed", Int64),
            ("outcomes_unexposed", Int64),
            ("outcomes", Int64),
        ],
        vec![
            unit(weeks.len()),
            strings(weeks.iter().map(|w| w.0.clone()).collect()),
            Arc::new(Int64Array::from_iter_values(weeks.iter().map(|w| w.1 .0))),
            Arc::new(Int64Array::from_iter_values(weeks.iter().map(|w| w.1 .1))),
            Arc::new(Int64Array::from_iter_values(weeks.iter().map(|w| w.1 .2))),
            Arc::new(Int64Array::from_iter_values(weeks.iter().map(|w| w.1 .3))),
            Arc::new(Int64Array::from_iter_values(
                weeks.iter().map(|w| w.1 .2 + w.1 .3),
            )),
        ],
    )?;
    // Per-pair diagnostics.
    let n = series.len();
    let finite = |v: Option<f64>| v.filter(|x| x.is_finite());
    let diagnostics = batch(
        vec![
            ("analysis_id", Utf8),
            ("exposure", Utf8),
            ("time_trend_months", Int64),
            ("time_trend_ratio", Float64),
            ("time_trend_p", Float64),
            ("pre_exposure_log_ratio", Float64),
            ("pre_exposure_llr", Float64),
            ("pre_exposure_p", Float64),
        ],
        vec![
            unit(n),
            strings(series.iter().map(|s| s.0.clone()).collect()),
            Arc::new(Int64Array::from_iter_values(
                series.iter().map(|s| s.1.trend.len() as i64),
            )),
            Arc::new(Float64Array::from_iter(
                series.iter().map(|s| s.1.stability.ratio),
            )),
            Arc::new(Float64Array::from_iter(
                series.iter().map(|s| Some(s.1.stability.p)),
            )),
            Arc::new(Float64Array::from_iter(
                series
                    .iter()
                    .map(|s| finite(s.1.pre_exposure.map(|g| g.log_ratio))),
            )),
            Arc::new(Float64Array::from_iter(
                series.iter().map(|s| s.1.pre_exposure.map(|g| g.llr)),
            )),
            Arc::new(Float64Array::from_iter(
                series.iter().map(|s| s.1.pre_exposure.map(|g| g.p)),
            )),
        ],
    )?;
    Ok(vec![
        ("sccs_profile".into(), profile),
        ("sccs_time_trend".into(), vec![trend]),
        ("sccs_time_to_event".into(), vec![tte]),
        ("sccs_pair_diagnostics".into(), vec![diagnostics]),
    ])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_profile_grid_spans_the_package_bounds_with_zero_on_it() {
        let g = profile_grid();
        assert_eq!(g.len(), 2 * PROFILE_STEPS_PER_SIDE as usize + 1);
        assert!((g[0] - 0.1f64.ln()).abs() < 1e-12);
        assert!((g[g.len() - 1] - 10f64.ln()).abs() < 1e-12);
        assert_eq!(g[PROFILE_STEPS_PER_SIDE as usize], 0.0);
        assert!(g.windows(2).all(|w| w[1] > w[0]));
    }
}
