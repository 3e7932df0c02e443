//! Many exposure–outcome pairs in one run (SCCS): **one analysis unit per outcome**, holding
//! every exposure of the analysis.
//!
//! An `[[analysis]]` with `design = "sccs"` lists `exposures`, `outcomes` and optionally
//! `negative_controls` (outcomes believed not caused by any of the exposures, true RR = 1).
//! Each outcome and each negative control is one unit `<analysis>.<outcome>`; within it:
//!
//! 1. the study population, the outcome days and the eras of every exposure are read from the
//!    store once ([`epifusion_sql::study::build_sccs_each_exposure`]), and each exposure's
//!    intervals are cut from that shared case data exactly as its single-pair design cuts them
//!    (a test checks table equality);
//! 2. the exposures' models are fitted concurrently (each fit runs on its own blocking thread,
//!    through the same Rust entry of `sccs_fit` as any pipeline unit);
//! 3. one set of result objects is written: `estimates`, `attrition`, `covariate_ref` and
//!    `diagnostics` with an `exposure` column (one diagnostics row per exposure), plus
//!    `sccs_stats` (per exposure and risk-window covariate: the counts of the OHDSI
//!    `sccs_result` table and what the MDRR needs), and the likelihood profiles, time trend,
//!    time to event and pre-exposure gain of each pair ([`crate::sccs_series`]).
//!
//! The unit is the unit of resume and of the manifest: it is complete when all its exposures
//! are written (the atomicity rules of `pipelines/README.md`). A pair whose fit fails (e.g. no
//! case has the exposure) is a diagnostics row with status `error: …` and no estimates; the
//! unit fails only when every pair fails. Calibration by the negative controls happens after
//! all units, in [`crate::sccs_results`].

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Instant;

use datafusion::arrow::array::{Array, AsArray, Int64Array, StringArray};
use datafusion::arrow::compute::cast;
use datafusion::arrow::datatypes::{DataType, Field, Float64Type, Int64Type, Schema};
use datafusion::arrow::record_batch::RecordBatch;
use datafusion::common::{Result as DfResult, ScalarValue};
use datafusion::prelude::SessionContext;
use epifusion_core::model::ModelKind;
use epifusion_sql::study::diagnostics::TrendMemo;
use epifusion_sql::study::{self, SccsDesign};
use toml::Spanned;

use super::plan::{fingerprint, Analysis, Design};
use super::progress::Progress;
use super::run::{analysis_err, fit, one_row, prepend, utf8, Staged};
use super::sccs_series;
use super::spec::{AnalysisSpec, PipelineFile, Source};
use super::tables::{sccs_settings, StudyTables};
use super::PipelineError;

/// First covariate id of the exposures' risk windows (the covariates of interest).
pub const EXPOSURE_BASE: i64 = epifusion_sql::study::sccs::EXPOSURE_BASE;

/// `negative_controls`: SCCS and cohort analyses only, defined concept sets, not also outcomes
/// of interest.
pub fn check_negative_controls(
    a: &AnalysisSpec,
    file: &PipelineFile,
    src: &Source,
) -> Result<(), PipelineError> {
    let name = a.name.get_ref();
    let key = format!("analysis `{name}`: negative_controls");
    let first = |l: &[Spanned<String>]| l.first().map(Spanned::span);
    if let Some(span) = first(&a.negative_controls) {
        if *a.design.get_ref() == super::spec::DesignKind::Sql {
            return Err(src.error(
                span,
                key,
                "negative controls are outcomes of SCCS or cohort analyses: give them in a \
                 `design = \"sccs\"` or `design = \"cohort\"` analysis",
            ));
        }
    }
    for nc in &a.negative_controls {
        let n = nc.get_ref();
        if !file.concept_sets.contains_key(n) {
            return Err(src.error(
                nc.span(),
                key,
                format!("no concept set `{n}` (define it as [concept_sets.{n}])"),
            ));
        }
        if a.outcomes.iter().any(|o| o.get_ref() == n) {
            return Err(src.error(
                nc.span(),
                key,
                format!("`{n}` is also an outcome of interest; list it in one of the two"),
            ));
        }
    }
    let mut seen = BTreeSet::new();
    for o in a.outcomes.iter().chain(&a.negative_controls) {
        if !seen.insert(o.get_ref()) {
            return Err(src.error(
                o.span(),
                key.clone(),
                format!("`{}` is listed twice", o.get_ref()),
            ));
        }
    }
    Ok(())
}

/// The units of an SCCS analysis: one per outcome, then one per negative control, each with
/// every exposure.
pub fn expand_sccs(
    index: usize,
    a: &AnalysisSpec,
    file: &PipelineFile,
    model: ModelKind,
    fit_options: serde_json::Value,
    omop: &str,
) -> Vec<Analysis> {
    let name = a.name.get_ref();
    let exposures: Vec<String> = a.exposures.iter().map(|e| e.get_ref().clone()).collect();
    let outcomes = a
        .outcomes
        .iter()
        .map(|o| (o, false))
        .chain(a.negative_controls.iter().map(|o| (o, true)));
    let mut units = Vec::new();
    for (outcome, negative_control) in outcomes {
        let outcome = outcome.get_ref().clone();
        let concept_sets = exposures
            .iter()
            .chain(std::iter::once(&outcome))
            .map(|s| (s.clone(), file.concept_sets[s].get_ref().clone()))
            .collect();
        let mut unit = Analysis {
            id: format!("{name}.{outcome}"),
            name: name.clone(),
            description: a.description.clone(),
            design: Design::Sccs(
                a.sccs
                    .as_ref()
                    .map(|t| t.get_ref().clone())
                    .unwrap_or_default(),
            ),
            model,
            roles: vec![("outcome", outcome)],
            concept_sets,
            fit_options: fit_options.clone(),
            report: a.report.clone(),
            fingerprint: String::new(),
            span: a.name.span(),
            index,
            exposures: exposures.clone(),
            negative_control,
        };
        unit.fingerprint = fingerprint(&unit, omop);
        units.push(unit);
    }
    units
}

/// The single exposure–outcome pair `exposure` of a unit of many exposures, as a unit of its
/// own (what a pipeline with that one exposure would run).
pub fn pair(a: &Analysis, exposure: &str) -> Analysis {
    let mut p = a.clone();
    p.roles = vec![("exposure", exposure.to_string())];
    p.roles.extend(a.roles.iter().cloned());
    p.exposures = Vec::new();
    p.concept_sets
        .retain(|k, _| k == exposure || a.role("outcome") == Some(k.as_str()));
    p
}

/// The design with every exposure of the unit (each as its single-pair design has it).
pub(crate) fn outcome_design(a: &Analysis, pairs: &[Analysis]) -> DfResult<SccsDesign> {
    let Design::Sccs(t) = &a.design else {
        return datafusion::common::plan_err!("analysis `{}` is not an SCCS analysis", a.name);
    };
    let mut designs = pairs
        .iter()
        .map(|p| SccsDesign::from_json(&sccs_settings(p, t)?))
        .collect::<DfResult<Vec<_>>>()?;
    let exposures = designs
        .iter_mut()
        .flat_map(|d| std::mem::take(&mut d.exposures))
        .collect();
    let mut d = designs
        .into_iter()
        .next()
        .ok_or_else(|| datafusion::common::plan_datafusion_err!("no exposures"))?;
    d.exposures = exposures;
    Ok(d)
}

/// Build one outcome's case data once, cut every exposure's intervals, fit them concurrently.
pub(crate) async fn outcome_stage(
    ctx: &SessionContext,
    a: &Analysis,
    tag: &str,
    progress: &Progress,
    era_cache: &study::ExposureEraCache,
    prebuilt: Option<crate::run::PrebuiltCases>,
) -> Result<Staged, PipelineError> {
    let t0 = Instant::now();
    let n = a.exposures.len();
    progress.step(&format!(
        "{tag}: building the case data once for {n} exposures"
    ));
    let pairs: Vec<Analysis> = a.exposures.iter().map(|e| pair(a, e)).collect();
    let d = outcome_design(a, &pairs).map_err(|e| analysis_err(a, e))?;
    let built = match prebuilt {
        Some(crate::run::PrebuiltCases::Shared(shared)) => {
            study::sccs_many::each_exposure_of_shared(&d, *shared).await
        }
        Some(crate::run::PrebuiltCases::EachExposure(own)) => {
            study::sccs_many::each_exposure_of_own(&d, own).await
        }
        None => study::build_sccs_each_exposure_with_cases(ctx, &d, Some(era_cache)).await,
    };
    let (tables, exposure_cases) = built.map_err(|e| analysis_err(a, e))?;
    let build_seconds = t0.elapsed().as_secs_f64();
    let rows: usize = tables
        .iter()
        .flat_map(|t| &t.outcomes)
        .map(RecordBatch::num_rows)
        .sum();
    progress.step(&format!(
        "{tag}: fitting {n} {} models ({rows} rows)",
        a.model.name()
    ));
    let t1 = Instant::now();
    let tables: Vec<StudyTables> = tables
        .into_iter()
        .map(|t| StudyTables {
            outcomes: t.outcomes,
            covariates: t.covariates,
            covariate_ref: t.covariate_ref,
            attrition: t.attrition,
        })
        .collect();
    // Each fit registers its tables in a session of its own, so the fits can run at once.
    // After a pair's fit: its likelihood profiles (a second fit) and its time-based
    // diagnostics (on a blocking thread), for the OHDSI results tables.
    // The exposures share the outcome's cases: their monthly counts, and without time splines
    // their time-stability tests, are one computation (remembered here; results identical to
    // computing each pair on its own).
    let trend_memo = Arc::new(TrendMemo::new());
    let fits = futures::future::join_all(pairs.iter().zip(&tables).zip(&exposure_cases).map(
        |((p, t), cases)| {
            let memo = trend_memo.clone();
            async move {
                let t_fit = Instant::now();
                let r = fit(&SessionContext::new(), p, t).await;
                let seconds = t_fit.elapsed().as_secs_f64();
                let (profile, series) = match &r {
                    Ok(f) => {
                        let profile = sccs_series::likelihood_profile(p, t).await;
                        let coefficients = sccs_series::coefficients(&f.estimates);
                        let cases = cases.clone();
                        let series = match coefficients {
                            Ok(c) => datafusion::common::runtime::SpawnedTask::spawn_blocking(
                                move || sccs_series::pair_series(&cases, &c, &memo),
                            )
                            .join()
                            .await
                            .ok(),
                            Err(_) => None,
                        };
                        (profile, series)
                    }
                    Err(_) => (Ok(None), None),
                };
                (r, seconds, profile, series)
            }
        },
    ))
    .await;
    let fit_seconds = t1.elapsed().as_secs_f64();

    let mut estimates = Vec::new();
    let mut attrition = Vec::new();
    let mut covariate_ref = Vec::new();
    let mut diagnostics = Vec::new();
    let mut stats = Vec::new();
    let mut failures = Vec::new();
    let mut series = Vec::new();
    for ((p, t), (result, seconds, profile, pair_series)) in pairs.iter().zip(&tables).zip(fits) {
        let exposure = p.role("exposure").unwrap_or_default().to_string();
        let profile = match profile {
            Ok(profile) => profile,
            Err(err) => {
                progress.step(&format!(
                    "{tag}: {exposure}: no likelihood profile ({err}); llr is NULL"
                ));
                None
            }
        };
        series.push((exposure.clone(), profile, pair_series));
        let e = |x| analysis_err(a, x);
        let with_exposure = |b: &[RecordBatch]| {
            prepend(
                b,
                &[
                    ("analysis_id", Some(a.id.clone())),
                    ("exposure", Some(exposure.clone())),
                ],
            )
        };
        stats.push(pair_stats(a, &exposure, t).map_err(e)?);
        match result {
            Ok(f) => {
                let status = first_value(&f.estimates, "status");
                diagnostics.push(
                    diagnostics_row(a, &exposure, &f.sizes, status, &f.estimates, seconds)
                        .map_err(e)?,
                );
                estimates.extend(f.estimates);
                attrition.extend(with_exposure(&f.attrition).map_err(e)?);
                covariate_ref.extend(with_exposure(&f.covariate_ref).map_err(e)?);
            }
            Err(err) => {
                let status = utf8(&format!("error: {err}"));
                failures.push(format!("{exposure}: {err}"));
                diagnostics
                    .push(diagnostics_row(a, &exposure, &[], status, &[], seconds).map_err(e)?);
                attrition.extend(with_exposure(&t.attrition).map_err(e)?);
            }
        }
    }
    if estimates.is_empty() {
        return Err(analysis_err(
            a,
            format!(
                "no exposure could be fitted:\n    {}",
                failures.join("\n    ")
            ),
        ));
    }
    let status = if failures.is_empty() {
        utf8("converged")
    } else {
        utf8(&format!("{} of {n} exposures failed", failures.len()))
    };
    Ok(Staged {
        fitted: super::run::Fitted {
            estimates,
            attrition: unify(&attrition).map_err(|e| analysis_err(a, e))?,
            covariate_ref: unify(&covariate_ref).map_err(|e| analysis_err(a, e))?,
            sizes: Vec::new(),
        },
        diagnostics,
        status,
        rows,
        build_seconds,
        fit_seconds,
        extra: {
            let mut extra = vec![("sccs_stats".into(), stats)];
            extra.extend(sccs_series::unit_tables(a, &series).map_err(|e| analysis_err(a, e))?);
            extra
        },
    })
}

/// Batches of one table brought to the columns of the first (the pairs' tables share their
/// columns; a failed pair's attrition has `exposure` where a fitted one has it too).
fn unify(batches: &[RecordBatch]) -> DfResult<Vec<RecordBatch>> {
    let Some(first) = batches.first() else {
        return Ok(Vec::new());
    };
    let schema = first.schema();
    batches
        .iter()
        .map(|b| {
            let cols = schema
                .fields()
                .iter()
                .map(|f| match b.column_by_name(f.name()) {
                    Some(c) => Ok(cast(c, f.data_type())?),
                    None => Ok(datafusion::arrow::array::new_null_array(
                        f.data_type(),
                        b.num_rows(),
                    )),
                })
                .collect::<DfResult<Vec<_>>>()?;
            Ok(RecordBatch::try_new(schema.clone(), cols)?)
        })
        .collect()
}

fn first_value(batches: &[RecordBatch], name: &str) -> ScalarValue {
    batches
        .first()
        .and_then(|b| b.column_by_name(name).cloned())
        .and_then(|c| ScalarValue::try_from_array(&c, 0).ok())
        .unwrap_or(ScalarValue::Null)
}

/// One diagnostics row of a pair, with fixed column types (a failed pair has NULL sizes).
fn diagnostics_row(
    a: &Analysis,
    exposure: &str,
    sizes: &[(String, ScalarValue)],
    status: ScalarValue,
    estimates: &[RecordBatch],
    fit_seconds: f64,
) -> DfResult<RecordBatch> {
    let size = |k: &str, t: &DataType| -> DfResult<ScalarValue> {
        match sizes.iter().find(|(n, _)| n == k) {
            Some((_, v)) if !v.is_null() => v.cast_to(t),
            _ => ScalarValue::try_from(t),
        }
    };
    let status = match status {
        ScalarValue::Utf8(_) => status,
        ScalarValue::Null => ScalarValue::Utf8(None),
        other => utf8(&other.to_string()),
    };
    let i64t = DataType::Int64;
    let f64t = DataType::Float64;
    let iterations = match first_value(estimates, "iterations") {
        ScalarValue::Null => ScalarValue::Int64(None),
        v => v.cast_to(&i64t)?,
    };
    let ll = match first_value(estimates, "log_likelihood") {
        ScalarValue::Null => ScalarValue::Float64(None),
        v => v.cast_to(&f64t)?,
    };
    one_row(&[
        ("analysis_id", utf8(&a.id)),
        ("exposure", utf8(exposure)),
        ("outcome", utf8(a.role("outcome").unwrap_or_default())),
        (
            "negative_control",
            ScalarValue::Boolean(Some(a.negative_control)),
        ),
        ("model", utf8(a.model.name())),
        ("outcome_rows", size("outcome_rows", &i64t)?),
        ("strata", size("strata", &i64t)?),
        ("events", size("events", &f64t)?),
        ("total_time", size("total_time", &f64t)?),
        ("covariate_entries", size("covariate_entries", &i64t)?),
        ("covariates", size("covariates", &i64t)?),
        ("status", status),
        ("iterations", iterations),
        ("log_likelihood", ll),
        ("fit_seconds", ScalarValue::Float64(Some(fit_seconds))),
    ])
}

/// Per risk-window covariate of a pair (ids ≥ [`EXPOSURE_BASE`]): the counts of the OHDSI
/// `sccs_result` table and what the MDRR needs, from the pair's study tables. Cases are strata
/// (observation periods with the outcome).
///
/// Columns: `analysis_id`, `exposure`, `outcome`, `covariate_id`, `outcome_subjects` (persons),
/// `outcome_events`, `outcome_observation_periods` (cases), `observed_days` (all informative
/// cases), `covariate_subjects` (persons with the covariate), `covariate_days`,
/// `covariate_outcomes` (outcomes during covariate time), `covariate_case_days` and
/// `covariate_case_outcomes` (observed days and outcomes of the cases having the covariate:
/// the MDRR's `r = covariate_days / covariate_case_days` and `n = covariate_case_outcomes`).
fn pair_stats(a: &Analysis, exposure: &str, t: &StudyTables) -> DfResult<RecordBatch> {
    // row → (stratum, person, days, events)
    let mut rows: BTreeMap<i64, (i64, i64, f64, f64)> = BTreeMap::new();
    for b in &t.outcomes {
        let col = |n: &str, dt: &DataType| -> DfResult<Arc<dyn Array>> {
            let c = b.column_by_name(n).ok_or_else(|| {
                datafusion::common::exec_datafusion_err!("SCCS outcomes without `{n}`")
            })?;
            Ok(cast(c, dt)?)
        };
        let (row, stratum, person) = (
            col("row_id", &DataType::Int64)?,
            col("stratum_id", &DataType::Int64)?,
            col("person_id", &DataType::Int64)?,
        );
        let (time, y) = (
            col("time", &DataType::Float64)?,
            col("y", &DataType::Float64)?,
        );
        let (row, stratum, person) = (
            row.as_primitive::<Int64Type>(),
            stratum.as_primitive::<Int64Type>(),
            person.as_primitive::<Int64Type>(),
        );
        let (time, y) = (
            time.as_primitive::<Float64Type>(),
            y.as_primitive::<Float64Type>(),
        );
        for i in 0..b.num_rows() {
            rows.insert(
                row.value(i),
                (stratum.value(i), person.value(i), time.value(i), y.value(i)),
            );
        }
    }
    // stratum → (days, events)
    let mut strata: BTreeMap<i64, (f64, f64)> = BTreeMap::new();
    for &(s, _, d, y) in rows.values() {
        let e = strata.entry(s).or_default();
        e.0 += d;
        e.1 += y;
    }
    let persons: BTreeSet<i64> = rows.values().map(|r| r.1).collect();
    let events: f64 = rows.values().map(|r| r.3).sum();
    let days: f64 = rows.values().map(|r| r.2).sum();
    // covariate → (strata, persons, days, outcomes)
    #[derive(Default)]
    struct Cov {
        strata: BTreeSet<i64>,
        persons: BTreeSet<i64>,
        days: f64,
        outcomes: f64,
    }
    let mut covs: BTreeMap<i64, Cov> = BTreeMap::new();
    for b in &t.covariates {
        let row = cast(
            b.column_by_name("row_id").ok_or_else(|| {
                datafusion::common::exec_datafusion_err!("SCCS covariates without `row_id`")
            })?,
            &DataType::Int64,
        )?;
        let id = cast(
            b.column_by_name("covariate_id").ok_or_else(|| {
                datafusion::common::exec_datafusion_err!("SCCS covariates without `covariate_id`")
            })?,
            &DataType::Int64,
        )?;
        let (row, id) = (
            row.as_primitive::<Int64Type>(),
            id.as_primitive::<Int64Type>(),
        );
        for i in 0..b.num_rows() {
            if id.value(i) < EXPOSURE_BASE {
                continue;
            }
            if let Some(&(s, person, d, y)) = rows.get(&row.value(i)) {
                let c = covs.entry(id.value(i)).or_default();
                c.strata.insert(s);
                c.persons.insert(person);
                c.days += d;
                c.outcomes += y;
            }
        }
    }
    // Covariates of interest from the reference too (a window nobody is in has no entries).
    for b in &t.covariate_ref {
        if let Some(c) = b.column_by_name("covariate_id") {
            let c = cast(c, &DataType::Int64)?;
            let c = c.as_primitive::<Int64Type>();
            for i in 0..c.len() {
                if !c.is_null(i) && c.value(i) >= EXPOSURE_BASE {
                    covs.entry(c.value(i)).or_default();
                }
            }
        }
    }
    let n = covs.len();
    // (covariate ids, persons) and (days, outcomes, case days, case outcomes) per covariate.
    type Counts = (Vec<i64>, Vec<i64>, Vec<f64>, Vec<f64>, Vec<f64>, Vec<f64>);
    let mut cols: Counts = Default::default();
    for (id, c) in &covs {
        let (case_days, case_outcomes) = c.strata.iter().fold((0.0, 0.0), |acc, s| {
            let (d, y) = strata[s];
            (acc.0 + d, acc.1 + y)
        });
        cols.0.push(*id);
        cols.1.push(c.persons.len() as i64);
        cols.2.push(c.days);
        cols.3.push(c.outcomes);
        cols.4.push(case_days);
        cols.5.push(case_outcomes);
    }
    let s = |v: &str| Arc::new(StringArray::from(vec![v.to_string(); n])) as Arc<dyn Array>;
    let i = |v: i64| Arc::new(Int64Array::from(vec![v; n])) as Arc<dyn Array>;
    let schema = Schema::new(vec![
        Field::new("analysis_id", DataType::Utf8, false),
        Field::new("exposure", DataType::Utf8, false),
        Field::new("outcome", DataType::Utf8, false),
        Field::new("negative_control", DataType::Boolean, false),
        Field::new("covariate_id", DataType::Int64, false),
        Field::new("outcome_subjects", DataType::Int64, false),
        Field::new("outcome_events", DataType::Int64, false),
        Field::new("outcome_observation_periods", DataType::Int64, false),
        Field::new("observed_days", DataType::Int64, false),
        Field::new("covariate_subjects", DataType::Int64, false),
        Field::new("covariate_days", DataType::Int64, false),
        Field::new("covariate_outcomes", DataType::Int64, false),
        Field::new("covariate_case_days", DataType::Int64, false),
        Field::new("covariate_case_outcomes", DataType::Int64, false),
    ]);
    let f2i = |v: &[f64]| {
        Arc::new(Int64Array::from_iter_values(
            v.iter().map(|x| x.round() as i64),
        )) as Arc<dyn Array>
    };
    Ok(RecordBatch::try_new(
        Arc::new(schema),
        vec![
            s(&a.id),
            s(exposure),
            s(a.role("outcome").unwrap_or_default()),
            Arc::new(datafusion::arrow::array::BooleanArray::from(vec![
                a.negative_control;
                n
            ])),
            Arc::new(Int64Array::from(cols.0)),
            i(persons.len() as i64),
            i(events.round() as i64),
            i(strata.len() as i64),
            i(days.round() as i64),
            Arc::new(Int64Array::from(cols.1)),
            f2i(&cols.2),
            f2i(&cols.3),
            f2i(&cols.4),
            f2i(&cols.5),
        ],
    )?)
}

#[cfg(test)]
mod tests {
    use super::super::spec::{check, parse, Source};

    const SCCS: &str = r#"name = "t"
[concept_sets.drug]
concepts = [1]
[concept_sets.event]
concepts = [2]
[concept_sets.nc]
concepts = [3]

[[analysis]]
name = "a"
design = "sccs"
exposures = ["drug"]
outcomes = ["event"]
negative_controls = ["nc"]
[analysis.sccs]
"#;

    fn err(text: &str) -> String {
        let s = Source {
            name: "p.toml".into(),
            text: text.into(),
        };
        match parse(&s).and_then(|f| check(&f, &s)) {
            Ok(()) => panic!("no error for:\n{text}"),
            Err(e) => e.to_string(),
        }
    }

    #[test]
    fn negative_controls_are_checked_at_their_line() {
        let s = Source {
            name: "p.toml".into(),
            text: SCCS.into(),
        };
        check(&parse(&s).unwrap(), &s).unwrap();
        let e = err(&SCCS.replace(
            "negative_controls = [\"nc\"]",
            "negative_controls = [\"ncc\"]",
        ));
        assert!(
            e.contains("p.toml:14:") && e.contains("no concept set `ncc`"),
            "{e}"
        );
        let e = err(&SCCS.replace(
            "negative_controls = [\"nc\"]",
            "negative_controls = [\"event\"]",
        ));
        assert!(
            e.contains("p.toml:14:") && e.contains("also an outcome"),
            "{e}"
        );
        let e = err(&SCCS.replace(
            "negative_controls = [\"nc\"]",
            "negative_controls = [\"nc\", \"nc\"]",
        ));
        assert!(e.contains("listed twice"), "{e}");
        let e = err(&SCCS
            .replace("design = \"sccs\"", "design = \"sql\"\nmodel = \"cox\"")
            .replace("[analysis.sccs]", "[analysis.sql]\noutcomes = \"SELECT 1\""));
        assert!(e.contains("negative_controls") && e.contains("SCCS"), "{e}");
    }
}
