//! `epifusion bench-omop --design cm`: a comparative cohort study (issue #14) end to end on a
//! confounded synthetic store ([`epifusion::engine::study::synth_cohort`]), timing each step:
//!
//! 1. `population`: the new-user cohort and every baseline covariate (`build_cohort`: SQL over
//!    the store), gathered into the sparse covariate matrix of the propensity model;
//! 2. `ps`: the L1 propensity model (`createPs` defaults: Laplace prior chosen by auto
//!    cross-validation, 10 folds × `--cv-repetitions`; or `--ps-variance` fixed), no sampling;
//! 3. `match`: 1:1 matching on the standardized logit, caliper 0.2;
//! 4. `balance`: means and standardized differences of every covariate before and after;
//! 5. `outcome`: the stratified Cox model on the matched sets (`cox_fit`), Wald CI; and the
//!    crude Cox model for comparison.
//!
//! Each step reports its seconds and the process's peak resident memory at its end (`VmHWM`,
//! what `/usr/bin/time -v` reports as "Maximum resident set size" for the whole run).

use std::collections::HashMap;
use std::sync::Arc;

use datafusion::arrow::array::{Array, Float64Array, Int64Array, RecordBatch};
use datafusion::arrow::compute::{cast, concat_batches};
use datafusion::arrow::datatypes::{DataType, Field, Schema};
use datafusion::datasource::MemTable;
use datafusion::prelude::SessionContext;
use epifusion_core::cohort::balance::{covariate_balance, AdjustedPopulation, Adjustment};
use epifusion_core::cohort::matching::{match_on_ps, MatchSettings};
use epifusion_core::cohort::ps::{fit_propensity, PsSettings};
use epifusion_core::cohort::SparseCovariates;

use super::*;

fn i64s(b: &RecordBatch, name: &str) -> Result<Vec<i64>> {
    let c = cast(
        b.column_by_name(name)
            .with_context(|| format!("no column {name}"))?,
        &DataType::Int64,
    )?;
    let c = c
        .as_any()
        .downcast_ref::<Int64Array>()
        .context("not an integer")?;
    Ok(c.values().to_vec())
}

fn f64s(b: &RecordBatch, name: &str) -> Result<Vec<f64>> {
    let c = cast(
        b.column_by_name(name)
            .with_context(|| format!("no column {name}"))?,
        &DataType::Float64,
    )?;
    let c = c
        .as_any()
        .downcast_ref::<Float64Array>()
        .context("not numeric")?;
    Ok(c.values().to_vec())
}

/// The treatment's (HR, lower, upper) of a Cox fit of `sql` (wide: [stratum_id,] time, y,
/// treatment).
async fn cox_hr(ctx: &SessionContext, sql: &str) -> Result<(f64, f64, f64)> {
    let q = format!(
        "SELECT estimate, ci_lower, ci_upper FROM cox_fit('{}', '{{\"ci\": \"wald\"}}') \
         WHERE covariate = 'treatment'",
        sql.replace('\'', "''")
    );
    let r = ctx.sql(&q).await?.collect().await?;
    let b = r.iter().find(|b| b.num_rows() > 0).context("no estimate")?;
    let (e, l, u) = (
        f64s(b, "estimate")?,
        f64s(b, "ci_lower")?,
        f64s(b, "ci_upper")?,
    );
    Ok((e[0].exp(), l[0].exp(), u[0].exp()))
}

/// Run the study on the store in `dir`; results into `out`.
pub(crate) fn bench_cm(
    dir: &Path,
    cv_repetitions: usize,
    ps_variance: Option<f64>,
    out: &mut serde_json::Value,
) -> Result<()> {
    use epifusion::engine::session::{new_session, SessionOptions};
    use epifusion::engine::study::{self, synth_cohort as synth};
    let rt = runtime()?;
    let mut steps = serde_json::Map::new();
    let mut step = |name: &str, t0: Instant, extra: serde_json::Value| {
        let mut v = serde_json::json!({
            "seconds": t0.elapsed().as_secs_f64(),
            "peak_rss_bytes": epifusion::bench::peak_rss_bytes(),
        });
        if let (Some(m), serde_json::Value::Object(e)) = (v.as_object_mut(), extra) {
            m.extend(e);
        }
        eprintln!("{name}: {v}");
        steps.insert(name.to_string(), v);
    };
    rt.block_on(async {
        let ctx = new_session(&SessionOptions {
            omop: Some(dir.display().to_string()),
            batch_size: None,
        })
        .await?;
        // 1. The population and its covariates.
        let t0 = Instant::now();
        let d = study::CohortDesign::from_json(&format!(
            r#"{{"target": {{"concept_ids": [{}]}}, "comparator": {{"concept_ids": [{}]}},
                "outcome": {{"concept_ids": [{}]}}, "first_exposure_only": true,
                "washout_days": 365, "risk_window_end": 365, "end_anchor": "cohort_start"}}"#,
            synth::TARGET_DRUG,
            synth::COMPARATOR_DRUG,
            synth::OUTCOME_CONCEPT
        ))?;
        let t = study::build_cohort(&ctx, &d).await?;
        let outcomes = concat_batches(&t.outcomes[0].schema(), &t.outcomes)?;
        let row_ids = i64s(&outcomes, "row_id")?;
        let treatment: Vec<bool> = i64s(&outcomes, "treatment")?
            .into_iter()
            .map(|x| x == 1)
            .collect();
        let index: HashMap<i64, u32> = row_ids
            .iter()
            .enumerate()
            .map(|(i, &r)| (r, i as u32))
            .collect();
        let mut entries = Vec::new();
        for b in &t.covariates {
            let (rows, ids) = (i64s(b, "row_id")?, i64s(b, "covariate_id")?);
            for (r, id) in rows.into_iter().zip(ids) {
                if id == study::cohort::TREATMENT_ID {
                    continue;
                }
                if let Some(&i) = index.get(&r) {
                    entries.push((i, id, 1.0));
                }
            }
        }
        let covariates = SparseCovariates::from_triplets(row_ids.len(), &entries)?;
        let n_covariates = entries
            .iter()
            .map(|e| e.1)
            .collect::<std::collections::BTreeSet<_>>()
            .len();
        step(
            "population",
            t0,
            serde_json::json!({"subjects": row_ids.len(),
                "target": treatment.iter().filter(|&&x| x).count(),
                "covariates": n_covariates, "covariate_entries": entries.len()}),
        );
        drop(entries);
        drop(t);

        // 2. The propensity model.
        let t0 = Instant::now();
        let settings = PsSettings {
            variance: ps_variance,
            cv_repetitions,
            ..Default::default()
        };
        let fit = fit_propensity(&treatment, &covariates, &settings)?;
        step(
            "ps",
            t0,
            serde_json::json!({"cv_folds": settings.cv_folds,
                "cv_repetitions": if ps_variance.is_some() { 0 } else { cv_repetitions },
                "variance": fit.variance, "non_zero_coefficients": fit.coefficients.len()}),
        );

        // 3. Matching.
        let t0 = Instant::now();
        let m = match_on_ps(
            &treatment,
            &fit.propensity_score,
            None,
            &MatchSettings::default(),
        )?;
        step(
            "match",
            t0,
            serde_json::json!({"matched": m.kept.len(), "sets": m.n_sets}),
        );

        // 4. Balance over every covariate.
        let t0 = Instant::now();
        let balance = covariate_balance(
            &treatment,
            &covariates,
            &AdjustedPopulation {
                kept: &m.kept,
                adjustment: Adjustment::Strata(&m.stratum_id),
            },
        )?;
        step(
            "balance",
            t0,
            serde_json::json!({"covariates": balance.covariates.len(),
                "max_abs_sdm_before": balance.max_abs_std_diff_before,
                "max_abs_sdm_after": balance.max_abs_std_diff_after}),
        );

        // 5. The outcome model on the matched sets (and the crude one).
        let t0 = Instant::now();
        let (time, y) = (f64s(&outcomes, "time")?, f64s(&outcomes, "y")?);
        let tr: Vec<i64> = treatment.iter().map(|&x| i64::from(x)).collect();
        let take = |v: &[f64]| m.kept.iter().map(|&k| v[k]).collect::<Vec<f64>>();
        let schema = Arc::new(Schema::new(vec![
            Field::new("stratum_id", DataType::Int64, false),
            Field::new("time", DataType::Float64, false),
            Field::new("y", DataType::Float64, false),
            Field::new("treatment", DataType::Int64, false),
        ]));
        let matched = RecordBatch::try_new(
            schema.clone(),
            vec![
                Arc::new(Int64Array::from(m.stratum_id.clone())),
                Arc::new(Float64Array::from(take(&time))),
                Arc::new(Float64Array::from(take(&y))),
                Arc::new(Int64Array::from(
                    m.kept.iter().map(|&k| tr[k]).collect::<Vec<_>>(),
                )),
            ],
        )?;
        ctx.register_table(
            "bench_matched",
            Arc::new(MemTable::try_new(schema, vec![vec![matched]])?),
        )?;
        let hr = cox_hr(
            &ctx,
            "SELECT stratum_id, time, y, treatment FROM bench_matched",
        )
        .await?;
        step(
            "outcome",
            t0,
            serde_json::json!({"hr": hr.0, "ci_95_lb": hr.1, "ci_95_ub": hr.2,
                "true_hr": synth::TRUE_HR}),
        );
        let all = RecordBatch::try_new(
            Arc::new(Schema::new(vec![
                Field::new("time", DataType::Float64, false),
                Field::new("y", DataType::Float64, false),
                Field::new("treatment", DataType::Int64, false),
            ])),
            vec![
                Arc::new(Float64Array::from(time)),
                Arc::new(Float64Array::from(y)),
                Arc::new(Int64Array::from(tr)),
            ],
        )?;
        ctx.register_table(
            "bench_all",
            Arc::new(MemTable::try_new(all.schema(), vec![vec![all]])?),
        )?;
        let crude = cox_hr(&ctx, "SELECT time, y, treatment FROM bench_all").await?;
        out["crude_hr"] = serde_json::json!([crude.0, crude.1, crude.2]);
        Ok::<_, anyhow::Error>(())
    })?;
    out["steps"] = serde_json::Value::Object(steps);
    Ok(())
}
