//! Comparative cohort studies in SQL (issue #14) on a seeded confounded cohort with a known null
//! effect: the crude Cox hazard ratio is biased away from 1; propensity-score matching (with a
//! stratified Cox model on the matched sets) and stratification remove the bias, and balance
//! after matching is within 0.1 SDM.
//!
//! The generator: 4,000 subjects, 20 binary baseline covariates (ids 1–20, prevalence
//! 0.2–0.58). Covariates 1–3 raise both the odds of treatment and the outcome hazard
//! (confounders), 4 the odds of treatment only (an instrument), 5 the hazard only. The true
//! treatment hazard ratio is exactly 1: event times are exponential with a hazard that does not
//! depend on treatment, censored by an exponential drop-out and at 365 days.

use std::collections::{BTreeMap, HashSet};
use std::sync::Arc;

use datafusion::arrow::array::{Float64Array, Int64Array, RecordBatch};
use datafusion::arrow::datatypes::{DataType, Field, Schema};
use datafusion::datasource::MemTable;
use datafusion::prelude::SessionContext;
use epifusion::engine::session::{new_session, SessionOptions};
use epifusion_core::model::rng::Rng;

use crate::study::{f64s, i64s};

/// The cohort: subjects (row_id, treatment), outcomes (row_id, time, y) and long covariates.
struct Cohort {
    subjects: RecordBatch,
    outcomes: RecordBatch,
    covariates: RecordBatch,
}

fn logistic(x: f64) -> f64 {
    1.0 / (1.0 + (-x).exp())
}

fn generate(n: usize, seed: u64) -> Cohort {
    let mut rng = Rng::new(seed);
    let (mut row_id, mut treatment, mut time, mut y) = (vec![], vec![], vec![], vec![]);
    let (mut cov_row, mut cov_id) = (vec![], vec![]);
    for i in 0..n {
        let id = i as i64 + 1;
        let x: Vec<bool> = (0..20)
            .map(|j| rng.bernoulli(0.2 + 0.02 * j as f64))
            .collect();
        for (j, &on) in x.iter().enumerate() {
            if on {
                cov_row.push(id);
                cov_id.push(j as i64 + 1);
            }
        }
        let f = |j: usize| if x[j] { 1.0 } else { 0.0 };
        let eta = -1.0 + 1.0 * f(0) + 0.8 * f(1) + 0.6 * f(2) + 0.5 * f(3);
        let t = rng.bernoulli(logistic(eta));
        // Hazard per day: no treatment term (true HR = 1).
        let hazard = 0.0006 * (0.9 * f(0) + 0.7 * f(1) + 0.6 * f(2) + 0.5 * f(4)).exp();
        let event = rng.exponential(hazard);
        let censor = rng.exponential(1.0 / 1000.0).min(365.0);
        row_id.push(id);
        treatment.push(i64::from(t));
        time.push(event.min(censor));
        y.push(i64::from(event <= censor));
    }
    let batch = |fields: Vec<(&str, DataType)>,
                 columns: Vec<Arc<dyn datafusion::arrow::array::Array>>| {
        let schema = Schema::new(
            fields
                .into_iter()
                .map(|(n, t)| Field::new(n, t, false))
                .collect::<Vec<_>>(),
        );
        RecordBatch::try_new(Arc::new(schema), columns).unwrap()
    };
    Cohort {
        subjects: batch(
            vec![("row_id", DataType::Int64), ("treatment", DataType::Int64)],
            vec![
                Arc::new(Int64Array::from(row_id.clone())),
                Arc::new(Int64Array::from(treatment)),
            ],
        ),
        outcomes: batch(
            vec![
                ("row_id", DataType::Int64),
                ("time", DataType::Float64),
                ("y", DataType::Int64),
            ],
            vec![
                Arc::new(Int64Array::from(row_id)),
                Arc::new(Float64Array::from(time)),
                Arc::new(Int64Array::from(y)),
            ],
        ),
        covariates: batch(
            vec![
                ("row_id", DataType::Int64),
                ("covariate_id", DataType::Int64),
            ],
            vec![
                Arc::new(Int64Array::from(cov_row)),
                Arc::new(Int64Array::from(cov_id)),
            ],
        ),
    }
}

async fn session(c: &Cohort) -> SessionContext {
    let ctx = new_session(&SessionOptions::default()).await.unwrap();
    for (name, b) in [
        ("subjects", &c.subjects),
        ("outcomes", &c.outcomes),
        ("covariates", &c.covariates),
    ] {
        ctx.register_table(
            name,
            Arc::new(MemTable::try_new(b.schema(), vec![vec![b.clone()]]).unwrap()),
        )
        .unwrap();
    }
    ctx
}

async fn query(ctx: &SessionContext, sql: &str) -> Vec<RecordBatch> {
    ctx.sql(sql)
        .await
        .unwrap_or_else(|e| panic!("{sql}: {e}"))
        .collect()
        .await
        .unwrap_or_else(|e| panic!("{sql}: {e}"))
}

async fn query_error(ctx: &SessionContext, sql: &str) -> String {
    match ctx.sql(sql).await {
        Err(e) => e.to_string(),
        Ok(df) => df
            .collect()
            .await
            .err()
            .unwrap_or_else(|| panic!("{sql} did not fail"))
            .to_string(),
    }
}

/// The treatment coefficient of a Cox fit of `outcomes_sql` (wide: [stratum_id,] time, y,
/// treatment): (log HR, CI lower, CI upper), Wald 95%.
async fn cox_treatment(ctx: &SessionContext, outcomes_sql: &str) -> (f64, f64, f64) {
    let sql = format!(
        "SELECT estimate, ci_lower, ci_upper FROM cox_fit('{}', '{{\"ci\": \"wald\"}}') \
         WHERE covariate = 'treatment'",
        outcomes_sql.replace('\'', "''")
    );
    let r = query(ctx, &sql).await;
    let (b, lo, hi) = (
        f64s(&r, "estimate"),
        f64s(&r, "ci_lower"),
        f64s(&r, "ci_upper"),
    );
    assert_eq!(b.len(), 1, "{sql}");
    (b[0], lo[0], hi[0])
}

const PS: &str = "CREATE TABLE ps AS SELECT * FROM cohort_propensity_scores('subjects', \
                  'covariates', '{\"variance\": 1}')";

#[tokio::test(flavor = "multi_thread")]
async fn matching_on_the_propensity_score_removes_confounding() {
    let cohort = generate(4000, 20261124);
    let ctx = session(&cohort).await;

    // Crude: biased away from 1 (confounders raise both treatment and hazard).
    let crude = cox_treatment(
        &ctx,
        "SELECT o.time, o.y, s.treatment FROM outcomes o JOIN subjects s USING (row_id)",
    )
    .await;
    eprintln!("crude log HR {crude:?}, HR {:.3}", crude.0.exp());
    assert!(crude.1 > 0.0, "the crude CI should exclude 1: {crude:?}");

    query(&ctx, PS).await;
    let ps = query(&ctx, "SELECT * FROM ps ORDER BY row_id").await;
    let scores = f64s(&ps, "propensity_score");
    assert_eq!(scores.len(), 4000);
    assert!(scores.iter().all(|&p| p > 0.0 && p < 1.0));
    assert!(f64s(&ps, "preference_score")
        .iter()
        .all(|&p| p > 0.0 && p < 1.0));

    // 1:1 matching within 0.2 SD of the logit (the defaults).
    query(
        &ctx,
        "CREATE TABLE matched AS SELECT * FROM cohort_match('SELECT row_id, treatment, \
         propensity_score FROM ps')",
    )
    .await;
    let m = query(&ctx, "SELECT * FROM matched").await;
    let (ids, arms, sets, mps) = (
        i64s(&m, "row_id"),
        i64s(&m, "treatment"),
        i64s(&m, "stratum_id"),
        f64s(&m, "propensity_score"),
    );
    // Invariants: no subject twice; every set one target and one comparator, within the
    // caliper (0.2 SD of the logit of every subject's score).
    assert_eq!(ids.iter().collect::<HashSet<_>>().len(), ids.len());
    let logit = |p: f64| (p / (1.0 - p)).ln();
    let l: Vec<f64> = scores.iter().map(|&p| logit(p)).collect();
    let mean = l.iter().sum::<f64>() / l.len() as f64;
    let sd = (l.iter().map(|v| (v - mean).powi(2)).sum::<f64>() / (l.len() - 1) as f64).sqrt();
    let mut by_set: BTreeMap<i64, Vec<(i64, f64)>> = BTreeMap::new();
    for k in 0..ids.len() {
        by_set.entry(sets[k]).or_default().push((arms[k], mps[k]));
    }
    for (set, members) in &by_set {
        assert_eq!(members.len(), 2, "set {set}: {members:?}");
        assert_eq!(members[0].0 + members[1].0, 1, "set {set}: {members:?}");
        let gap = (logit(members[0].1) - logit(members[1].1)).abs();
        assert!(
            gap <= 0.2 * sd * (1.0 + 1e-9),
            "set {set}: {gap} > {}",
            0.2 * sd
        );
    }
    let n_pairs = by_set.len();
    eprintln!("{n_pairs} matched pairs");
    assert!(n_pairs > 800, "{n_pairs}");

    // Stratified Cox on the matched sets: covers the true HR of 1.
    let matched = cox_treatment(
        &ctx,
        "SELECT m.stratum_id, o.time, o.y, m.treatment FROM matched m JOIN outcomes o USING \
         (row_id)",
    )
    .await;
    eprintln!("matched log HR {matched:?}, HR {:.3}", matched.0.exp());
    assert!(
        matched.1 < 0.0 && matched.2 > 0.0,
        "the matched CI should cover 1: {matched:?}"
    );
    assert!(
        matched.0.abs() < crude.0.abs() / 2.0,
        "{matched:?} vs {crude:?}"
    );

    // Balance: before = every subject, after = the matched sets.
    let b = query(
        &ctx,
        "SELECT max(abs(std_diff_before)) AS before, max(abs(std_diff_after)) AS after FROM \
         cohort_balance('SELECT row_id, treatment, stratum_id FROM matched', 'covariates', \
         '{\"before\": \"subjects\"}')",
    )
    .await;
    let (before, after) = (f64s(&b, "before")[0], f64s(&b, "after")[0]);
    eprintln!("max |SDM| before {before:.3}, after matching {after:.3}");
    assert!(before > 0.2, "{before}");
    assert!(after <= 0.1, "{after}");
    let rows = query(
        &ctx,
        "SELECT * FROM cohort_balance('SELECT row_id, treatment, stratum_id FROM matched', \
         'covariates', '{\"before\": \"subjects\"}')",
    )
    .await;
    assert_eq!(i64s(&rows, "covariate_id").len(), 20);

    // CohortMethod's diagnostics: balance, equipoise and MDRR pass after matching.
    let d = query(
        &ctx,
        "SELECT diagnostic, status FROM cohort_diagnostics('SELECT m.row_id, m.treatment, \
         m.stratum_id, o.y AS outcome_count, o.time AS time_at_risk FROM matched m JOIN \
         outcomes o USING (row_id)', 'covariates', '{\"before\": \"ps\"}')",
    )
    .await;
    let status = crate::study::strings(&d, "status");
    assert_eq!(
        crate::study::strings(&d, "diagnostic"),
        ["balance", "equipoise", "mdrr", "unblind"]
    );
    assert_eq!(status, ["PASS", "PASS", "PASS", "PASS"], "{d:?}");

    // Stratification into 5 quantile strata removes most of the crude bias.
    let stratified = cox_treatment(
        &ctx,
        "SELECT s.stratum_id, o.time, o.y, s.treatment FROM cohort_stratify('SELECT row_id, \
         treatment, propensity_score FROM ps') s JOIN outcomes o USING (row_id)",
    )
    .await;
    eprintln!(
        "stratified log HR {stratified:?}, HR {:.3}",
        stratified.0.exp()
    );
    assert!(
        stratified.0.abs() < crude.0.abs() / 2.0,
        "{stratified:?} vs {crude:?}"
    );
    let strata = query(
        &ctx,
        "SELECT stratum_id, count(*) AS n FROM cohort_stratify('SELECT row_id, treatment, \
         propensity_score FROM ps') GROUP BY stratum_id",
    )
    .await;
    assert_eq!(i64s(&strata, "stratum_id").len(), 5);

    // IPTW (ATT): weighted balance also within 0.1.
    let w = query(
        &ctx,
        "SELECT max(abs(std_diff_after)) AS after FROM cohort_balance('SELECT row_id, \
         treatment, weight FROM cohort_weights(''SELECT row_id, treatment, propensity_score \
         FROM ps'')', 'covariates', '{\"before\": \"subjects\"}')",
    )
    .await;
    let after_iptw = f64s(&w, "after")[0];
    eprintln!("max |SDM| after IPTW {after_iptw:.3}");
    assert!(after_iptw <= 0.1, "{after_iptw}");
}

#[tokio::test(flavor = "multi_thread")]
async fn the_prior_variance_is_cross_validated_without_one() {
    let cohort = generate(600, 7);
    let ctx = session(&cohort).await;
    let model = query(
        &ctx,
        "SELECT covariate_id, coefficient, variance, status FROM cohort_propensity_scores(\
         'subjects', 'covariates', '{\"cv_folds\": 3, \"cv_repetitions\": 1, \"table\": \
         \"model\"}')",
    )
    .await;
    let variance = f64s(&model, "variance");
    eprintln!("CV variance {}", variance[0]);
    assert!(variance[0] > 0.0 && variance[0].is_finite());
    // The intercept comes first (NULL id), then the non-zero coefficients; the strongest
    // confounder (covariate 1) is among them.
    let ids = model[0]
        .column_by_name("covariate_id")
        .unwrap()
        .as_any()
        .downcast_ref::<Int64Array>()
        .unwrap()
        .clone();
    assert!(datafusion::arrow::array::Array::is_null(&ids, 0));
    assert!((1..ids.len()).any(|k| ids.value(k) == 1));
    let scores = query(
        &ctx,
        "SELECT propensity_score FROM cohort_propensity_scores('subjects', 'covariates', \
         '{\"cv_folds\": 3, \"cv_repetitions\": 1}')",
    )
    .await;
    assert_eq!(f64s(&scores, "propensity_score").len(), 600);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_perfect_predictor_or_a_single_arm_is_a_clear_error() {
    let cohort = generate(300, 3);
    let ctx = session(&cohort).await;
    // Covariate 99 is the treatment itself.
    let leaky = "SELECT row_id, covariate_id, 1 AS covariate_value FROM covariates UNION ALL \
                 SELECT row_id, 99 AS covariate_id, 1 AS covariate_value FROM subjects WHERE \
                 treatment = 1";
    let sql = format!(
        "SELECT * FROM cohort_propensity_scores('subjects', '{}', '{{\"variance\": 1}}')",
        leaky.replace('\'', "''")
    );
    let e = query_error(&ctx, &sql).await;
    assert!(
        e.contains("cohort_propensity_scores") && e.contains("99"),
        "{e}"
    );
    assert!(e.contains("high correlation"), "{e}");
    let sql = format!(
        "SELECT * FROM cohort_propensity_scores('subjects', '{}', '{{\"variance\": 1, \
         \"error_on_high_correlation\": false}}')",
        leaky.replace('\'', "''")
    );
    let e = query_error(&ctx, &sql).await;
    assert!(e.contains("[99] perfectly predict treatment"), "{e}");

    let e = query_error(
        &ctx,
        "SELECT * FROM cohort_propensity_scores('SELECT row_id, 1 AS treatment FROM subjects', \
         'covariates', '{\"variance\": 1}')",
    )
    .await;
    assert!(e.contains("target or comparator cohort empty"), "{e}");
}
