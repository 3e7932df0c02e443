//! A PS-adjusted cohort unit's results in the OHDSI CohortMethod 5.x results data model
//! (`inst/csv/resultsDataModelSpecification.csv`: table and column names), written as Parquet
//! beside the unit's estimates: `cm_result`, `cm_analysis`, `cm_covariate_balance`,
//! `cm_diagnostics_summary`, `cm_propensity_model`, `cm_preference_score_dist`,
//! `cm_kaplan_meier_dist`, `cm_follow_up_dist`, `cm_attrition` and `cm_likelihood_profile`.
//!
//! Conventions:
//! * `database_id`: see [`database_id`].
//! * `analysis_id`: the 1-based position of the `[[analysis]]` table in the pipeline file;
//!   `cm_analysis.description` is the analysis name, `definition` its `[analysis.cohort]`
//!   settings as JSON.
//! * `target_id`, `comparator_id`, `outcome_id`: the concept set's `cohort` id, else its first
//!   concept id, else its 1-based position among the pipeline's concept sets (by name).
//! * `cm_result`: the treatment coefficient of the outcome model; `rr = exp(log_rr)`, the CI is
//!   the fit's (`ci` option) on the exp scale, `p` two-sided and `one_sided_p = 1 − Φ(log_rr /
//!   se_log_rr)` (the extra column; CohortMethod 5.x writes it in later versions) from
//!   the Wald statistic, `llr = LL(β̂) − LL(0)` from the likelihood profile; subjects, days and
//!   outcomes count the adjusted population (matched or trimmed); the estimate columns are
//!   NULL unless the outcome model converged. `calibrated_*` are NULL in the unit's table:
//!   calibration needs every negative control of the analysis, and the run-level `cm_result`
//!   of [`crate::cohort_calibration`] fills them when the analysis has `negative_controls`.
//! * `cm_likelihood_profile`: CohortMethod's grid of 1000 values of log RR in [log 0.1, log
//!   10] (plus 0 and the estimate), `log_likelihood` normalized to 0 at its maximum.
//! * `cm_preference_score_dist`: Gaussian kernel densities (R `density()`'s default bandwidth
//!   `bw.nrd0`) of each arm's preference scores at 100 points on [0, 1], each normalized to a
//!   maximum of 1 as CohortMethod's export does.
//! * `cm_kaplan_meier_dist`: both arms' (adjusted) curves at the union of their event and
//!   censoring times; `*_at_risk` unweighted.
//! * `cm_follow_up_dist`: per arm of the adjusted population, the time at risk (days; not
//!   censored at the outcome, as CohortMethod defines follow-up) at its minimum, 10th, 25th,
//!   50th, 75th, 90th percentile and maximum (R `quantile` type 7), and the first and last
//!   cohort start dates; NULL for an arm without subjects.

use std::sync::Arc;

use datafusion::arrow::array::{ArrayRef, Float64Array, Int64Array, RecordBatch, StringArray};
use datafusion::arrow::compute::cast;
use datafusion::arrow::datatypes::{DataType, Field, Schema};
use datafusion::common::{exec_datafusion_err, Result as DfResult};
use datafusion::prelude::SessionContext;

use epifusion_core::cohort::km::KmCurve;

use super::cohort_adjust::Adjusted;
use super::plan::{Analysis, Design, Pipeline};

/// The result tables' names, in write order.
pub const CM_TABLES: [&str; 10] = [
    "cm_result",
    "cm_analysis",
    "cm_covariate_balance",
    "cm_diagnostics_summary",
    "cm_propensity_model",
    "cm_preference_score_dist",
    "cm_kaplan_meier_dist",
    "cm_follow_up_dist",
    "cm_attrition",
    "cm_likelihood_profile",
];

/// The pipeline's `database_id`: the top-level key when given, else the store's
/// `cdm_source.cdm_source_name`, else the store's folder name (the last segment of its path).
pub async fn database_id(ctx: &SessionContext, given: Option<&str>, omop: &str) -> String {
    if let Some(id) = given {
        return id.to_string();
    }
    if let Ok(true) = ctx.table_exist("cdm_source") {
        let sql = "SELECT CAST(cdm_source_name AS VARCHAR) AS n FROM cdm_source \
                   WHERE cdm_source_name IS NOT NULL LIMIT 1";
        if let Ok(df) = ctx.sql(sql).await {
            if let Ok(batches) = df.collect().await {
                if let Some(name) = batches.iter().find(|b| b.num_rows() > 0).and_then(|b| {
                    b.column(0)
                        .as_any()
                        .downcast_ref::<StringArray>()
                        .map(|s| s.value(0).to_string())
                }) {
                    if !name.trim().is_empty() {
                        return name;
                    }
                }
            }
        }
    }
    omop.trim_end_matches('/')
        .rsplit('/')
        .next()
        .unwrap_or(omop)
        .to_string()
}

/// The integer id of the unit's concept set for `role` (see the module documentation).
pub fn role_id(p: &Pipeline, a: &Analysis, role: &str) -> i64 {
    let Some(name) = a.role(role) else { return 0 };
    let c = &a.concept_sets[name];
    if let Some(id) = c.cohort {
        return id;
    }
    if let Some(&first) = c.concepts.as_ref().and_then(|v| v.first()) {
        return first;
    }
    p.file
        .concept_sets
        .keys()
        .position(|k| k == name)
        .map_or(0, |i| i as i64 + 1)
}

/// The keys every table starts with.
struct Keys {
    database_id: String,
    analysis_id: i64,
    target_id: i64,
    comparator_id: i64,
    outcome_id: i64,
}

/// Columns of one table under construction.
#[derive(Default)]
struct Table {
    fields: Vec<Field>,
    columns: Vec<ArrayRef>,
}

impl Table {
    fn i64(mut self, name: &str, v: Vec<i64>) -> Self {
        self.fields.push(Field::new(name, DataType::Int64, false));
        self.columns.push(Arc::new(Int64Array::from(v)));
        self
    }
    fn f64(mut self, name: &str, v: Vec<Option<f64>>) -> Self {
        let v: Vec<Option<f64>> = v.into_iter().map(|x| x.filter(|x| x.is_finite())).collect();
        self.fields.push(Field::new(name, DataType::Float64, true));
        self.columns.push(Arc::new(Float64Array::from(v)));
        self
    }
    /// A DATE column from days since 1970-01-01 (NULL where `None` or out of range).
    fn date(mut self, name: &str, v: Vec<Option<i64>>) -> Self {
        let v: Vec<Option<i32>> = v
            .into_iter()
            .map(|d| d.and_then(|d| i32::try_from(d).ok()))
            .collect();
        self.fields.push(Field::new(name, DataType::Date32, true));
        self.columns
            .push(Arc::new(datafusion::arrow::array::Date32Array::from(v)));
        self
    }
    fn str(mut self, name: &str, v: Vec<String>) -> Self {
        self.fields.push(Field::new(name, DataType::Utf8, false));
        self.columns.push(Arc::new(StringArray::from(v)));
        self
    }
    /// The key columns named in `which` (`d` database, `a` analysis, `t`, `c`, `o`), n rows.
    fn keys(self, k: &Keys, which: &str, n: usize) -> Self {
        let mut t = self;
        for ch in which.chars() {
            t = match ch {
                'd' => t.str("database_id", vec![k.database_id.clone(); n]),
                'a' => t.i64("analysis_id", vec![k.analysis_id; n]),
                't' => t.i64("target_id", vec![k.target_id; n]),
                'c' => t.i64("comparator_id", vec![k.comparator_id; n]),
                'o' => t.i64("outcome_id", vec![k.outcome_id; n]),
                _ => t,
            };
        }
        t
    }
    fn batch(self) -> DfResult<RecordBatch> {
        Ok(RecordBatch::try_new(
            Arc::new(Schema::new(self.fields)),
            self.columns,
        )?)
    }
}

fn column_f64(b: &RecordBatch, name: &str) -> DfResult<Vec<Option<f64>>> {
    let c = b
        .column_by_name(name)
        .ok_or_else(|| exec_datafusion_err!("no `{name}` column"))?;
    let c = cast(c, &DataType::Float64)?;
    let c = c
        .as_any()
        .downcast_ref::<Float64Array>()
        .ok_or_else(|| exec_datafusion_err!("`{name}` is not numeric"))?;
    Ok(c.iter().collect())
}

fn column_i64(b: &RecordBatch, name: &str) -> DfResult<Vec<Option<i64>>> {
    let c = b
        .column_by_name(name)
        .ok_or_else(|| exec_datafusion_err!("no `{name}` column"))?;
    let c = cast(c, &DataType::Int64)?;
    let c = c
        .as_any()
        .downcast_ref::<Int64Array>()
        .ok_or_else(|| exec_datafusion_err!("`{name}` is not an integer"))?;
    Ok(c.iter().collect())
}

use epifusion_core::calibration::normal_cdf;

/// Gaussian kernel density of `x` at `at` with R's `bw.nrd0` bandwidth.
fn density(x: &[f64], at: &[f64]) -> Vec<f64> {
    let n = x.len();
    if n == 0 {
        return vec![0.0; at.len()];
    }
    let mean = x.iter().sum::<f64>() / n as f64;
    let sd = if n > 1 {
        (x.iter().map(|v| (v - mean).powi(2)).sum::<f64>() / (n - 1) as f64).sqrt()
    } else {
        0.0
    };
    let mut sorted = x.to_vec();
    sorted.sort_unstable_by(f64::total_cmp);
    let q = |p: f64| {
        let h = (n - 1) as f64 * p;
        let (lo, hi) = (h.floor() as usize, h.ceil() as usize);
        sorted[lo] + (h - lo as f64) * (sorted[hi] - sorted[lo])
    };
    let iqr = (q(0.75) - q(0.25)) / 1.34;
    let mut lo = sd.min(iqr);
    if lo <= 0.0 {
        lo = if sd > 0.0 {
            sd
        } else if mean != 0.0 {
            mean.abs()
        } else {
            1.0
        };
    }
    let bw = 0.9 * lo * (n as f64).powf(-0.2);
    let norm = 1.0 / (n as f64 * bw * (2.0 * std::f64::consts::PI).sqrt());
    at.iter()
        .map(|&a| {
            x.iter()
                .map(|&v| (-0.5 * ((a - v) / bw).powi(2)).exp())
                .sum::<f64>()
                * norm
        })
        .collect()
}

/// Survival, bounds and at-risk of a step curve at time `t`.
fn km_at(c: &KmCurve, t: f64) -> (f64, f64, f64, i64) {
    let k = c.time.partition_point(|&x| x <= t);
    let (s, lo, hi) = if k == 0 {
        (1.0, 1.0, 1.0)
    } else {
        (c.survival[k - 1], c.lower[k - 1], c.upper[k - 1])
    };
    let r = c.time.partition_point(|&x| x < t);
    let at_risk = c.at_risk.get(r).map_or(0, |&n| n as i64);
    (s, lo, hi, at_risk)
}

/// Inputs of the result tables of one unit.
pub struct UnitResults<'a> {
    /// The pipeline.
    pub pipeline: &'a Pipeline,
    /// The unit.
    pub analysis: &'a Analysis,
    /// Its `database_id`.
    pub database_id: String,
    /// The adjustment.
    pub adjusted: &'a Adjusted,
    /// The outcome model's outcome table (after adjustment).
    pub outcomes: &'a [RecordBatch],
    /// The outcome model's coefficient table.
    pub estimates: &'a [RecordBatch],
    /// The unit's attrition (design steps, then trimming and matching).
    pub attrition: &'a [RecordBatch],
    /// The treatment's likelihood profile (`*_fit` with `table = "profile"`), if computed.
    pub profile: Option<&'a [RecordBatch]>,
}

/// The `cm_*` tables of one unit, in [`CM_TABLES`] order.
pub fn cm_tables(u: &UnitResults<'_>) -> DfResult<Vec<(&'static str, RecordBatch)>> {
    let (p, a, adj) = (u.pipeline, u.analysis, u.adjusted);
    let k = Keys {
        database_id: u.database_id.clone(),
        analysis_id: a.index as i64 + 1,
        target_id: role_id(p, a, "target"),
        comparator_id: role_id(p, a, "comparator"),
        outcome_id: role_id(p, a, "outcome"),
    };
    let mut out = Vec::new();

    // cm_result: the treatment coefficient.
    let mut est: (Option<f64>, Option<f64>, Option<f64>, Option<f64>) = (None, None, None, None);
    for b in u.estimates {
        let ids = column_i64(b, "covariate_id")?;
        let (e, se, lo, hi) = (
            column_f64(b, "estimate")?,
            column_f64(b, "std_error")?,
            column_f64(b, "ci_lower")?,
            column_f64(b, "ci_upper")?,
        );
        let status = b
            .column_by_name("status")
            .map(|c| cast(c, &DataType::Utf8))
            .transpose()?;
        let status = status
            .as_ref()
            .and_then(|c| c.as_any().downcast_ref::<StringArray>());
        if let Some(i) = ids.iter().position(|&id| id == Some(1)) {
            // No estimate unless the outcome model converged (e.g. `no_finite_mle` when one
            // arm has no outcome): CohortMethod's NA, never a number that looks like one.
            if status.is_none_or(|s| s.value(i) == "converged") {
                est = (e[i], se[i], lo[i], hi[i]);
            }
        }
    }
    let (log_rr, se, lo, hi) = est;
    let z = match (log_rr, se) {
        (Some(b), Some(s)) if s > 0.0 => Some(b / s),
        _ => None,
    };
    let mut counts = [[0f64; 3]; 2]; // [arm][subjects, days, outcomes]
    for b in u.outcomes {
        let (tr, time, y) = (
            column_i64(b, "treatment")?,
            column_f64(b, "time")?,
            column_f64(b, "y")?,
        );
        for i in 0..b.num_rows() {
            let g = usize::from(tr[i] != Some(1));
            counts[g][0] += 1.0;
            counts[g][1] += time[i].unwrap_or(0.0);
            counts[g][2] += f64::from(u8::from(y[i] == Some(1.0)));
        }
    }
    let (llr, profile_rows) = match u.profile {
        Some(batches) => {
            let mut pts: Vec<(f64, f64)> = Vec::new();
            for b in batches {
                let (v, ll) = (column_f64(b, "value")?, column_f64(b, "log_likelihood")?);
                pts.extend(
                    v.into_iter()
                        .zip(ll)
                        .filter_map(|(v, ll)| Some((v?, ll?)))
                        .filter(|(_, ll)| ll.is_finite()),
                );
            }
            pts.sort_by(|x, y| x.0.total_cmp(&y.0));
            let max = pts.iter().map(|p| p.1).fold(f64::NEG_INFINITY, f64::max);
            let at_zero = pts.iter().find(|p| p.0 == 0.0).map(|p| p.1);
            (
                at_zero.map(|l0| max - l0),
                pts.into_iter()
                    .map(|(v, ll)| (v, ll - max))
                    .collect::<Vec<_>>(),
            )
        }
        None => (None, Vec::new()),
    };
    let exp = |x: Option<f64>| x.map(f64::exp);
    let nulls = vec![None; 1];
    out.push((
        "cm_result",
        Table::default()
            .keys(&k, "atco", 1)
            .f64("rr", vec![exp(log_rr)])
            .f64("ci_95_lb", vec![exp(lo)])
            .f64("ci_95_ub", vec![exp(hi)])
            .f64("p", vec![z.map(|z| 2.0 * (1.0 - normal_cdf(z.abs())))])
            .f64("one_sided_p", vec![z.map(|z| 1.0 - normal_cdf(z))])
            .i64("target_subjects", vec![counts[0][0] as i64])
            .i64("comparator_subjects", vec![counts[1][0] as i64])
            .i64("target_days", vec![counts[0][1] as i64])
            .i64("comparator_days", vec![counts[1][1] as i64])
            .i64("target_outcomes", vec![counts[0][2] as i64])
            .i64("comparator_outcomes", vec![counts[1][2] as i64])
            .f64("log_rr", vec![log_rr])
            .f64("se_log_rr", vec![se])
            .f64("llr", vec![llr])
            .f64("calibrated_rr", nulls.clone())
            .f64("calibrated_ci_95_lb", nulls.clone())
            .f64("calibrated_ci_95_ub", nulls.clone())
            .f64("calibrated_p", nulls.clone())
            .f64("calibrated_one_sided_p", nulls.clone())
            .f64("calibrated_log_rr", nulls.clone())
            .f64("calibrated_se_log_rr", nulls)
            .keys(&k, "d", 1)
            .batch()?,
    ));

    // cm_analysis.
    let definition = match &a.design {
        Design::Cohort(t) => serde_json::to_string(t).unwrap_or_default(),
        _ => String::new(),
    };
    out.push((
        "cm_analysis",
        Table::default()
            .keys(&k, "a", 1)
            .str("description", vec![a.name.clone()])
            .str("definition", vec![definition])
            .batch()?,
    ));

    // cm_covariate_balance.
    let rows = &adj.balance.covariates;
    let n = rows.len();
    let before = |f: fn(&epifusion_core::cohort::balance::GroupStats) -> f64| {
        rows.iter()
            .map(|r| r.before.map(|s| f(&s)))
            .collect::<Vec<_>>()
    };
    let after = |f: fn(&epifusion_core::cohort::balance::GroupStats) -> f64| {
        rows.iter()
            .map(|r| r.after.map(|s| f(&s)))
            .collect::<Vec<_>>()
    };
    out.push((
        "cm_covariate_balance",
        Table::default()
            .keys(&k, "dtcoa", n)
            .i64(
                "covariate_id",
                rows.iter().map(|r| r.covariate_id).collect(),
            )
            .f64("target_mean_before", before(|s| s.mean_target))
            .f64("comparator_mean_before", before(|s| s.mean_comparator))
            .f64("std_diff_before", before(|s| s.std_diff))
            .f64("target_mean_after", after(|s| s.mean_target))
            .f64("comparator_mean_after", after(|s| s.mean_comparator))
            .f64("std_diff_after", after(|s| s.std_diff))
            .batch()?,
    ));

    // cm_diagnostics_summary.
    let mut first_target = None;
    let mut last_target = None;
    for b in u.attrition {
        if let Ok(t) = column_i64(b, "target_persons") {
            first_target = first_target.or(t.first().copied().flatten());
            last_target = t.last().copied().flatten().or(last_target);
        }
    }
    let attrition_fraction = match (first_target, last_target) {
        (Some(f), Some(l)) if f > 0 => Some(1.0 - l as f64 / f as f64),
        _ => None,
    };
    let d = &adj.diagnostics;
    let v = &adj.values;
    out.push((
        "cm_diagnostics_summary",
        Table::default()
            .keys(&k, "atcod", 1)
            .f64("max_sdm", vec![v.max_sdm])
            .f64("shared_max_sdm", vec![v.shared_max_sdm])
            .f64("equipoise", vec![v.equipoise])
            .f64("mdrr", vec![v.mdrr])
            .f64("attrition_fraction", vec![attrition_fraction])
            .f64("ease", vec![v.ease])
            .str("balance_diagnostic", vec![d.balance.label().into()])
            .str(
                "shared_balance_diagnostic",
                vec![d.shared_balance.label().into()],
            )
            .str("equipoise_diagnostic", vec![d.equipoise.label().into()])
            .str("mdrr_diagnostic", vec![d.mdrr.label().into()])
            .str("attrition_diagnostic", vec!["NOT EVALUATED".into()])
            .str("ease_diagnostic", vec![d.ease.label().into()])
            .i64("unblind", vec![i64::from(d.unblind)])
            .batch()?,
    ));

    // cm_propensity_model: the intercept (covariate_id 0) and the non-zero coefficients.
    let fit = &adj.shared.fit;
    let mut ids = vec![0];
    let mut coef = vec![Some(fit.intercept)];
    for &(id, b) in &fit.coefficients {
        ids.push(id);
        coef.push(Some(b));
    }
    out.push((
        "cm_propensity_model",
        Table::default()
            .keys(&k, "tcad", ids.len())
            .i64("covariate_id", ids)
            .f64("coefficient", coef)
            .batch()?,
    ));

    // cm_preference_score_dist.
    let at: Vec<f64> = (0..100).map(|i| i as f64 / 99.0).collect();
    let arm = |treated: bool| {
        let x: Vec<f64> = adj
            .preference_score
            .iter()
            .zip(&adj.treatment)
            .filter(|(_, &t)| t == treated)
            .map(|(&f, _)| f)
            .collect();
        let d = density(&x, &at);
        let max = d.iter().copied().fold(0.0, f64::max);
        d.into_iter()
            .map(|v| Some(if max > 0.0 { v / max } else { 0.0 }))
            .collect::<Vec<_>>()
    };
    out.push((
        "cm_preference_score_dist",
        Table::default()
            .keys(&k, "atcd", at.len())
            .f64("preference_score", at.iter().map(|&x| Some(x)).collect())
            .f64("target_density", arm(true))
            .f64("comparator_density", arm(false))
            .batch()?,
    ));

    // cm_kaplan_meier_dist.
    let km = Table::default();
    let km = match &adj.km {
        Ok(c) => {
            let mut times: Vec<f64> = c
                .target
                .time
                .iter()
                .chain(&c.comparator.time)
                .copied()
                .collect();
            times.push(0.0);
            times.sort_unstable_by(f64::total_cmp);
            times.dedup();
            let t: Vec<_> = times.iter().map(|&x| km_at(&c.target, x)).collect();
            let cc: Vec<_> = times.iter().map(|&x| km_at(&c.comparator, x)).collect();
            km.i64("time_day", times.iter().map(|&x| x as i64).collect())
                .f64("target_survival", t.iter().map(|r| Some(r.0)).collect())
                .f64("target_survival_lb", t.iter().map(|r| Some(r.1)).collect())
                .f64("target_survival_ub", t.iter().map(|r| Some(r.2)).collect())
                .f64(
                    "comparator_survival",
                    cc.iter().map(|r| Some(r.0)).collect(),
                )
                .f64(
                    "comparator_survival_lb",
                    cc.iter().map(|r| Some(r.1)).collect(),
                )
                .f64(
                    "comparator_survival_ub",
                    cc.iter().map(|r| Some(r.2)).collect(),
                )
                .i64("target_at_risk", t.iter().map(|r| r.3).collect())
                .i64("comparator_at_risk", cc.iter().map(|r| r.3).collect())
                .keys(&k, "tcoad", times.len())
        }
        Err(_) => km
            .i64("time_day", vec![])
            .f64("target_survival", vec![])
            .f64("target_survival_lb", vec![])
            .f64("target_survival_ub", vec![])
            .f64("comparator_survival", vec![])
            .f64("comparator_survival_lb", vec![])
            .f64("comparator_survival_ub", vec![])
            .i64("target_at_risk", vec![])
            .i64("comparator_at_risk", vec![])
            .keys(&k, "tcoad", 0),
    };
    out.push(("cm_kaplan_meier_dist", km.batch()?));

    // cm_follow_up_dist: one row.
    let mut fu = Table::default().keys(&k, "tcoa", 1);
    for (arm, f) in [
        ("target", &adj.follow_up.target),
        ("comparator", &adj.follow_up.comparator),
    ] {
        for (i, q) in ["min", "p10", "p25", "median", "p75", "p90", "max"]
            .iter()
            .enumerate()
        {
            fu = fu.f64(
                &format!("{arm}_{q}_days"),
                vec![f.as_ref().map(|f| f.days[i])],
            );
        }
    }
    for (arm, f) in [
        ("target", &adj.follow_up.target),
        ("comparator", &adj.follow_up.comparator),
    ] {
        fu = fu
            .date(
                &format!("{arm}_min_date"),
                vec![f.as_ref().map(|f| f.start_range.0)],
            )
            .date(
                &format!("{arm}_max_date"),
                vec![f.as_ref().map(|f| f.start_range.1)],
            );
    }
    out.push(("cm_follow_up_dist", fu.keys(&k, "d", 1).batch()?));

    // cm_attrition: one row per step and arm.
    let mut seq = Vec::new();
    let mut desc = Vec::new();
    let mut subjects = Vec::new();
    let mut exposure = Vec::new();
    for b in u.attrition {
        let (tp, cp) = (
            column_i64(b, "target_persons")?,
            column_i64(b, "comparator_persons")?,
        );
        let d = b
            .column_by_name("description")
            .map(|c| cast(c, &DataType::Utf8))
            .transpose()?;
        let d = d
            .as_ref()
            .and_then(|c| c.as_any().downcast_ref::<StringArray>());
        for i in 0..b.num_rows() {
            let s = seq.len() as i64 / 2 + 1;
            let text = d.map_or(String::new(), |d| d.value(i).to_string());
            for (id, count) in [(k.target_id, tp[i]), (k.comparator_id, cp[i])] {
                seq.push(s);
                desc.push(text.clone());
                subjects.push(count.unwrap_or(0));
                exposure.push(id);
            }
        }
    }
    let n = seq.len();
    out.push((
        "cm_attrition",
        Table::default()
            .i64("sequence_number", seq)
            .str("description", desc)
            .i64("subjects", subjects)
            .i64("exposure_id", exposure)
            .keys(&k, "tcaod", n)
            .batch()?,
    ));

    // cm_likelihood_profile.
    let n = profile_rows.len();
    out.push((
        "cm_likelihood_profile",
        Table::default()
            .f64("log_rr", profile_rows.iter().map(|r| Some(r.0)).collect())
            .f64(
                "log_likelihood",
                profile_rows.iter().map(|r| Some(r.1)).collect(),
            )
            .keys(&k, "tcoad", n)
            .batch()?,
    ));
    Ok(out)
}

/// The likelihood-profile grid: CohortMethod's 1000 values of log RR in [log 0.1, log 10],
/// plus 0 (for the LLR).
pub fn profile_grid() -> Vec<f64> {
    let (lo, hi) = (0.1f64.ln(), 10f64.ln());
    let mut g: Vec<f64> = (0..1000)
        .map(|i| lo + (hi - lo) * i as f64 / 999.0)
        .collect();
    g.push(0.0);
    g.sort_unstable_by(f64::total_cmp);
    g
}

/// The `*_fit` options of the treatment's likelihood profile, from the unit's fit options.
pub fn profile_options(fit_options: &serde_json::Value) -> serde_json::Value {
    let mut o = match fit_options {
        serde_json::Value::Object(m) => m.clone(),
        _ => serde_json::Map::new(),
    };
    o.insert("table".into(), "profile".into());
    o.insert(
        "profile".into(),
        serde_json::json!({"covariates": [1], "grid": profile_grid()}),
    );
    // The profile does not need intervals or the CV again when the variance is fixed.
    o.insert("ci".into(), "wald".into());
    serde_json::Value::Object(o)
}

/// The `cm_*` tables of a PS-adjusted cohort unit after its outcome model was fitted: resolves
/// the `database_id`, fits the treatment's likelihood profile (a failed profile leaves `llr`
/// and `cm_likelihood_profile` empty and says why in the returned note) and builds the tables.
pub async fn cm_outputs(
    ctx: &SessionContext,
    p: &Pipeline,
    a: &Analysis,
    adjusted: &Adjusted,
    t: &super::tables::StudyTables,
    estimates: &[RecordBatch],
) -> DfResult<(Vec<(&'static str, RecordBatch)>, Option<String>)> {
    let (outcomes, covariates, attrition) = (&t.outcomes, &t.covariates, &t.attrition);
    let given = p.file.database_id.as_ref().map(|s| s.get_ref().as_str());
    let database_id = database_id(ctx, given, &p.omop).await;
    let function = a.model.descriptor().table_function;
    let (profile, note) = match (outcomes.first(), covariates.first()) {
        (Some(o), Some(c)) => match epifusion_sql::fit_table::fit_batches(
            function,
            &profile_options(&a.fit_options).to_string(),
            (o.schema(), outcomes.to_vec()),
            Some((c.schema(), covariates.to_vec())),
        )
        .await
        {
            Ok(r) => (Some(vec![r.batch]), None),
            Err(e) => (None, Some(format!("no likelihood profile: {e}"))),
        },
        _ => (
            None,
            Some("no likelihood profile: empty tables".to_string()),
        ),
    };
    let tables = cm_tables(&UnitResults {
        pipeline: p,
        analysis: a,
        database_id,
        adjusted,
        outcomes,
        estimates,
        attrition,
        profile: profile.as_deref(),
    })?;
    Ok((tables, note))
}

/// The report's plots of a unit from its `cm_*` tables (read back from the output).
pub fn report_plots(
    preference: Vec<RecordBatch>,
    balance: Vec<RecordBatch>,
    km: Vec<RecordBatch>,
    diagnostics: Vec<RecordBatch>,
) -> DfResult<super::report::CohortPlots> {
    let mut plots = super::report::CohortPlots {
        diagnostics,
        ..Default::default()
    };
    for b in &preference {
        let (x, t, c) = (
            column_f64(b, "preference_score")?,
            column_f64(b, "target_density")?,
            column_f64(b, "comparator_density")?,
        );
        for i in 0..b.num_rows() {
            if let (Some(x), Some(t), Some(c)) = (x[i], t[i], c[i]) {
                plots.preference.push((x, t, c));
            }
        }
    }
    for b in &balance {
        let (before, after) = (
            column_f64(b, "std_diff_before")?,
            column_f64(b, "std_diff_after")?,
        );
        for i in 0..b.num_rows() {
            if let (Some(x), Some(y)) = (before[i], after[i]) {
                plots.balance.push((x.abs(), y.abs()));
            }
        }
    }
    for b in &km {
        let (d, t, c) = (
            column_i64(b, "time_day")?,
            column_f64(b, "target_survival")?,
            column_f64(b, "comparator_survival")?,
        );
        for i in 0..b.num_rows() {
            if let (Some(d), Some(t), Some(c)) = (d[i], t[i], c[i]) {
                plots.km.push((d as f64, t, c));
            }
        }
    }
    Ok(plots)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kernel_density_integrates_to_one_and_peaks_at_the_data() {
        let x: Vec<f64> = (0..200).map(|i| 0.3 + 0.002 * f64::from(i % 50)).collect();
        let at: Vec<f64> = (0..=4000).map(|i| -1.0 + f64::from(i) * 0.00075).collect();
        let d = density(&x, &at);
        let integral: f64 = d.iter().sum::<f64>() * 0.00075;
        assert!((integral - 1.0).abs() < 1e-3, "{integral}");
        let peak = at[d
            .iter()
            .enumerate()
            .max_by(|a, b| a.1.total_cmp(b.1))
            .unwrap()
            .0];
        assert!((0.3..=0.4).contains(&peak), "{peak}");
        assert_eq!(density(&[], &[0.5]), vec![0.0]);
    }

    #[test]
    fn km_steps_are_read_at_and_after_each_time() {
        let c = KmCurve {
            time: vec![2.0, 5.0],
            survival: vec![0.9, 0.5],
            variance: vec![0.0, 0.0],
            lower: vec![0.8, 0.4],
            upper: vec![1.0, 0.6],
            at_risk: vec![10, 4],
            events: vec![1.0, 2.0],
        };
        assert_eq!(km_at(&c, 0.0), (1.0, 1.0, 1.0, 10));
        assert_eq!(km_at(&c, 2.0), (0.9, 0.8, 1.0, 10));
        assert_eq!(km_at(&c, 3.0), (0.9, 0.8, 1.0, 4));
        assert_eq!(km_at(&c, 6.0), (0.5, 0.4, 0.6, 0));
    }

    #[test]
    fn the_profile_grid_is_cohortmethods_plus_zero() {
        let g = profile_grid();
        assert_eq!(g.len(), 1001);
        assert!((g[0] - 0.1f64.ln()).abs() < 1e-12 && (g[1000] - 10f64.ln()).abs() < 1e-12);
        assert!(g.contains(&0.0) && g.windows(2).all(|w| w[0] < w[1]));
    }
}
