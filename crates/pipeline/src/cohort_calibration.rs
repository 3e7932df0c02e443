//! Empirical calibration of cohort analyses by their negative-control outcomes (issue #14, as
//! CohortMethod's results are calibrated): the run-level `cm_result` with `calibrated_*`
//! columns, `cm_target_comparator_outcome`, and the report's calibration plots.
//!
//! A `design = "cohort"` analysis may list `negative_controls` (outcomes believed not caused by
//! the target or the comparator, true HR = 1; the same key and rules as for SCCS analyses): each
//! is one more outcome unit of every target–comparator pair, run exactly as the outcomes of
//! interest (with a PS adjustment, the pair's shared propensity model). After every unit is
//! complete, and only when some cohort analysis has negative controls, the cohort units are
//! read back and, per analysis, target and comparator:
//!
//! * each unit's estimate is its `cm_result` row (PS-adjusted units) or, for a unit without
//!   adjustment, the treatment coefficient (`covariate_id` 1) of its `estimates`;
//! * the **empirical null** is fitted from the negative controls' estimates
//!   ([`epifusion_core::calibration::fit_null`]; at least
//!   [`MIN_NEGATIVE_CONTROLS`] with a finite estimate and standard error, else the calibrated
//!   columns are NULL and a warning says why);
//! * each estimate gets `calibrated_p`, `calibrated_one_sided_p` (upper tail) and the
//!   calibrated interval and point estimate through the systematic-error model
//!   (`convert_null_to_error_model` + `calibrate_confidence_interval`, 95 %), as the SCCS
//!   results do ([`crate::sccs_results`]).
//!
//! Written under `runs/<run_id>/` (listed in the run manifest's `results`):
//!
//! | object | rows | columns |
//! |---|---|---|
//! | `cm_result.parquet` | cohort unit | the unit's `cm_result` columns (NULL where the unit has none) with `calibrated_rr`, `calibrated_ci_95_lb`, `calibrated_ci_95_ub`, `calibrated_p`, `calibrated_one_sided_p`, `calibrated_log_rr`, `calibrated_se_log_rr` filled |
//! | `cm_target_comparator_outcome.parquet` | cohort unit | OHDSI `target_id`, `comparator_id`, `outcome_id`, `outcome_of_interest` (1 / 0), `true_effect_size` (1 for negative controls, else NULL), plus `analysis_id`, `analysis_name`, `target`, `comparator`, `outcome` (the pipeline's names) |
//!
//! The units' own `cm_result` objects keep NULL `calibrated_*` columns: a unit is complete on
//! its own, and calibration needs all of its analysis' units.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::sync::Arc;

use datafusion::arrow::array::{Array, ArrayRef, Float64Array, Int64Array, StringArray};
use datafusion::arrow::compute::cast;
use datafusion::arrow::datatypes::{DataType, Field, Schema};
use datafusion::arrow::record_batch::RecordBatch;
use datafusion::common::{exec_datafusion_err, Result as DfResult};
use datafusion::prelude::SessionContext;
use epifusion_core::calibration::{
    calibrate_confidence_interval, calibrate_p, calibrate_p_sided, convert_null_to_error_model,
    ease, fit_null, normal_cdf, EmpiricalNull, PValueSide, MIN_NEGATIVE_CONTROLS,
};

use super::output::{ObjectRef, Output};
use super::plan::{Analysis, Design, Pipeline};
use super::report::escape;
use super::run::{parquet_batches, parquet_bytes, AnalysisManifest};
use super::PipelineError;

/// The count columns of `cm_result`, copied from the unit's row.
const COUNTS: [&str; 6] = [
    "target_subjects",
    "comparator_subjects",
    "target_days",
    "comparator_days",
    "target_outcomes",
    "comparator_outcomes",
];

/// One cohort unit's estimate.
#[derive(Debug, Clone)]
struct Row {
    analysis_index: usize,
    target: String,
    comparator: String,
    outcome: String,
    negative_control: bool,
    ids: [i64; 3],
    log_rr: Option<f64>,
    se_log_rr: Option<f64>,
    log_lb: Option<f64>,
    log_ub: Option<f64>,
    llr: Option<f64>,
    counts: [Option<i64>; 6],
}

/// The calibrated values of one estimate.
#[derive(Debug, Clone, Copy)]
struct Calibrated {
    p: f64,
    one_sided_p: f64,
    log_rr: f64,
    se_log_rr: f64,
    log_lb: f64,
    log_ub: f64,
}

/// A null per (analysis, target, comparator), with what it was fitted from.
struct NullGroup {
    null: Result<EmpiricalNull, String>,
    controls: Vec<(f64, f64)>,
}

/// What the run writes and shows for its calibrated cohort analyses.
#[derive(Debug, Default)]
pub struct CohortCalibration {
    /// Objects written, by table name.
    pub objects: BTreeMap<String, ObjectRef>,
    /// Report sections (HTML).
    pub sections: Vec<String>,
    /// Warnings (e.g. too few negative controls to calibrate).
    pub warnings: Vec<String>,
}

fn column(b: &RecordBatch, name: &str, to: &DataType) -> DfResult<Option<ArrayRef>> {
    b.column_by_name(name)
        .map(|c| cast(c, to))
        .transpose()
        .map_err(Into::into)
}

fn f64_at(b: &RecordBatch, name: &str, i: usize) -> DfResult<Option<f64>> {
    Ok(column(b, name, &DataType::Float64)?.and_then(|c| {
        let c = c.as_any().downcast_ref::<Float64Array>()?;
        (!c.is_null(i) && c.value(i).is_finite()).then(|| c.value(i))
    }))
}

fn i64_at(b: &RecordBatch, name: &str, i: usize) -> DfResult<Option<i64>> {
    Ok(column(b, name, &DataType::Int64)?.and_then(|c| {
        let c = c.as_any().downcast_ref::<Int64Array>()?;
        (!c.is_null(i)).then(|| c.value(i))
    }))
}

/// The unit's estimate: its `cm_result` row, else the treatment row of its `estimates`.
fn unit_row(
    p: &Pipeline,
    a: &Analysis,
    cm_result: &[RecordBatch],
    estimates: &[RecordBatch],
) -> DfResult<Row> {
    let role = |r: &str| a.role(r).unwrap_or_default().to_string();
    let mut row = Row {
        analysis_index: a.index,
        target: role("target"),
        comparator: role("comparator"),
        outcome: role("outcome"),
        negative_control: a.negative_control,
        ids: [
            super::cohort_results::role_id(p, a, "target"),
            super::cohort_results::role_id(p, a, "comparator"),
            super::cohort_results::role_id(p, a, "outcome"),
        ],
        log_rr: None,
        se_log_rr: None,
        log_lb: None,
        log_ub: None,
        llr: None,
        counts: [None; 6],
    };
    if let Some(b) = cm_result.iter().find(|b| b.num_rows() > 0) {
        row.log_rr = f64_at(b, "log_rr", 0)?;
        row.se_log_rr = f64_at(b, "se_log_rr", 0)?.filter(|s| *s > 0.0);
        row.log_lb = f64_at(b, "ci_95_lb", 0)?.map(f64::ln);
        row.log_ub = f64_at(b, "ci_95_ub", 0)?.map(f64::ln);
        row.llr = f64_at(b, "llr", 0)?;
        for (k, name) in COUNTS.iter().enumerate() {
            row.counts[k] = i64_at(b, name, 0)?;
        }
        return Ok(row);
    }
    for b in estimates {
        for i in 0..b.num_rows() {
            if i64_at(b, "covariate_id", i)? != Some(1) {
                continue;
            }
            let converged = match column(b, "status", &DataType::Utf8)? {
                Some(s) => s
                    .as_any()
                    .downcast_ref::<StringArray>()
                    .is_some_and(|s| !s.is_null(i) && s.value(i) == "converged"),
                None => true,
            };
            if converged {
                row.log_rr = f64_at(b, "estimate", i)?;
                row.se_log_rr = f64_at(b, "std_error", i)?.filter(|s| *s > 0.0);
                row.log_lb = f64_at(b, "ci_lower", i)?;
                row.log_ub = f64_at(b, "ci_upper", i)?;
            }
        }
    }
    Ok(row)
}

/// Read the cohort units back, calibrate each analysis' target–comparator pairs by their
/// negative controls, write the run-level tables under `runs/<run>/` and make the report
/// section. Nothing to do unless some cohort analysis has negative controls.
pub async fn write(
    ctx: &SessionContext,
    p: &Pipeline,
    out: &Output,
    manifests: &[(&Analysis, AnalysisManifest)],
    run: &str,
) -> Result<CohortCalibration, PipelineError> {
    let units: Vec<_> = manifests
        .iter()
        .filter(|(a, _)| matches!(a.design, Design::Cohort(_)))
        .filter(|(a, _)| !p.file.analyses[a.index].negative_controls.is_empty())
        .collect();
    if units.is_empty() {
        return Ok(CohortCalibration::default());
    }
    let err = |e: datafusion::error::DataFusionError| PipelineError::Output {
        location: p.output.clone(),
        message: format!("cohort calibration: {e}"),
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
    let mut rows = Vec::with_capacity(units.len());
    for (a, m) in &units {
        let cm = read(m, "cm_result").await?;
        let est = if cm.is_empty() {
            read(m, "estimates").await?
        } else {
            Vec::new()
        };
        rows.push(unit_row(p, a, &cm, &est).map_err(err)?);
    }

    // Empirical nulls per (analysis, target, comparator).
    let key = |r: &Row| (r.analysis_index, r.target.clone(), r.comparator.clone());
    let mut groups: BTreeMap<(usize, String, String), NullGroup> = BTreeMap::new();
    for r in rows.iter().filter(|r| r.negative_control) {
        let g = groups.entry(key(r)).or_insert(NullGroup {
            null: Err(String::new()),
            controls: Vec::new(),
        });
        if let (Some(lr), Some(se)) = (r.log_rr, r.se_log_rr) {
            g.controls.push((lr, se));
        }
    }
    let mut warnings = Vec::new();
    for ((ai, t, c), g) in groups.iter_mut() {
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
            warnings.push(format!(
                "analysis `{}`: {t} vs {c}: not calibrated: {why}",
                p.file.analyses[*ai].name.get_ref()
            ));
        }
    }
    let null_of = |r: &Row| groups.get(&key(r)).and_then(|g| g.null.as_ref().ok());
    let calibrated: Vec<Option<Calibrated>> = rows
        .iter()
        .map(|r| {
            let (null, lr, se) = (null_of(r)?, r.log_rr?, r.se_log_rr?);
            let ci =
                calibrate_confidence_interval(&convert_null_to_error_model(null), lr, se, 0.95)
                    .ok()?;
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

    // cm_result.
    let db = super::sccs_results::database_id(ctx, p).await;
    let n = rows.len();
    let f = |v: Vec<Option<f64>>| {
        Arc::new(Float64Array::from(
            v.into_iter()
                .map(|x| x.filter(|x| x.is_finite()))
                .collect::<Vec<_>>(),
        )) as ArrayRef
    };
    let i = |v: Vec<Option<i64>>| Arc::new(Int64Array::from(v)) as ArrayRef;
    let s = |v: Vec<String>| Arc::new(StringArray::from(v)) as ArrayRef;
    let by = |g: &dyn Fn(&Row) -> Option<f64>| f(rows.iter().map(g).collect());
    let cal = |g: fn(&Calibrated) -> f64| f(calibrated.iter().map(|c| c.as_ref().map(g)).collect());
    let z = |r: &Row| Some(r.log_rr? / r.se_log_rr?);
    let mut cols: Vec<(&str, ArrayRef)> = vec![
        (
            "analysis_id",
            i(rows
                .iter()
                .map(|r| Some(r.analysis_index as i64 + 1))
                .collect()),
        ),
        (
            "target_id",
            i(rows.iter().map(|r| Some(r.ids[0])).collect()),
        ),
        (
            "comparator_id",
            i(rows.iter().map(|r| Some(r.ids[1])).collect()),
        ),
        (
            "outcome_id",
            i(rows.iter().map(|r| Some(r.ids[2])).collect()),
        ),
        ("rr", by(&|r| r.log_rr.map(f64::exp))),
        ("ci_95_lb", by(&|r| r.log_lb.map(f64::exp))),
        ("ci_95_ub", by(&|r| r.log_ub.map(f64::exp))),
        (
            "p",
            by(&|r| z(r).map(|z| 2.0 * (1.0 - normal_cdf(z.abs())))),
        ),
        ("one_sided_p", by(&|r| z(r).map(|z| 1.0 - normal_cdf(z)))),
    ];
    for (k, name) in COUNTS.iter().enumerate() {
        cols.push((*name, i(rows.iter().map(|r| r.counts[k]).collect())));
    }
    cols.extend([
        ("log_rr", by(&|r| r.log_rr)),
        ("se_log_rr", by(&|r| r.se_log_rr)),
        ("llr", by(&|r| r.llr)),
        ("calibrated_rr", cal(|c| c.log_rr.exp())),
        ("calibrated_ci_95_lb", cal(|c| c.log_lb.exp())),
        ("calibrated_ci_95_ub", cal(|c| c.log_ub.exp())),
        ("calibrated_p", cal(|c| c.p)),
        ("calibrated_one_sided_p", cal(|c| c.one_sided_p)),
        ("calibrated_log_rr", cal(|c| c.log_rr)),
        ("calibrated_se_log_rr", cal(|c| c.se_log_rr)),
        ("database_id", s(vec![db; n])),
    ]);
    let result = batch(cols).map_err(err)?;
    let tco = batch(vec![
        (
            "target_id",
            i(rows.iter().map(|r| Some(r.ids[0])).collect()),
        ),
        (
            "comparator_id",
            i(rows.iter().map(|r| Some(r.ids[1])).collect()),
        ),
        (
            "outcome_id",
            i(rows.iter().map(|r| Some(r.ids[2])).collect()),
        ),
        (
            "outcome_of_interest",
            i(rows
                .iter()
                .map(|r| Some(i64::from(!r.negative_control)))
                .collect()),
        ),
        (
            "true_effect_size",
            f(rows
                .iter()
                .map(|r| r.negative_control.then_some(1.0))
                .collect()),
        ),
        (
            "analysis_id",
            i(rows
                .iter()
                .map(|r| Some(r.analysis_index as i64 + 1))
                .collect()),
        ),
        (
            "analysis_name",
            s(rows
                .iter()
                .map(|r| p.file.analyses[r.analysis_index].name.get_ref().clone())
                .collect()),
        ),
        ("target", s(rows.iter().map(|r| r.target.clone()).collect())),
        (
            "comparator",
            s(rows.iter().map(|r| r.comparator.clone()).collect()),
        ),
        (
            "outcome",
            s(rows.iter().map(|r| r.outcome.clone()).collect()),
        ),
    ])
    .map_err(err)?;
    let mut objects = BTreeMap::new();
    for (name, b) in [("cm_result", result), ("cm_target_comparator_outcome", tco)] {
        let bytes = parquet_bytes(&[b]).map_err(err)?;
        let rel = format!("runs/{run}/{name}.parquet");
        objects.insert(name.to_string(), out.put(&rel, bytes).await?);
    }

    // The report section: one calibration plot per target–comparator pair.
    let mut html = String::from(
        "<h2 id=\"cohort-calibration\">Cohort empirical calibration</h2>\n<p>Negative-control \
         outcomes (true HR = 1) of each target–comparator pair against their standard errors, \
         with the fitted empirical null's 95 % region (shaded) and the traditional p &lt; 0.05 \
         boundary (dashed); outcomes of interest in orange. The run's <code>cm_result</code> \
         holds the calibrated estimates.</p>\n",
    );
    for ((ai, t, c), g) in &groups {
        let interest: Vec<(f64, f64)> = rows
            .iter()
            .filter(|r| !r.negative_control && key(r) == (*ai, t.clone(), c.clone()))
            .filter_map(|r| Some((r.log_rr?, r.se_log_rr?)))
            .collect();
        let title = format!("{} · {t} vs {c}", p.file.analyses[*ai].name.get_ref());
        let _ = writeln!(
            html,
            "<figure class=\"calibration\" data-group=\"{}\">{}<figcaption>{}: {}</figcaption></figure>",
            escape(&title),
            super::sccs_results::calibration_svg(&g.controls, &interest, g.null.as_ref().ok()),
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
    Ok(CohortCalibration {
        objects,
        sections: vec![html],
        warnings,
    })
}

fn batch(cols: Vec<(&str, ArrayRef)>) -> DfResult<RecordBatch> {
    let fields: Vec<Field> = cols
        .iter()
        .map(|(n, a)| Field::new(*n, a.data_type().clone(), true))
        .collect();
    RecordBatch::try_new(
        Arc::new(Schema::new(fields)),
        cols.into_iter().map(|(_, a)| a).collect(),
    )
    .map_err(|e| exec_datafusion_err!("{e}"))
}
