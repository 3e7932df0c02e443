//! Many exposures against one outcome (issue #15 item 4): the case data is built once per
//! outcome and every exposure's tables must equal those of its single-pair design, on the
//! bundled GiBleed store with age groups, a season spline, a probe and split windows.

use std::path::Path;

use datafusion::arrow::compute::concat_batches;
use datafusion::arrow::record_batch::RecordBatch;
use epifusion::engine::study::sccs_many::single_exposure_design;
use epifusion::engine::study::{build_sccs, build_sccs_each_exposure, SccsDesign};

use crate::study::session;

fn one(batches: &[RecordBatch]) -> RecordBatch {
    concat_batches(&batches[0].schema(), batches).unwrap()
}

#[tokio::test]
async fn each_exposure_equals_its_single_pair_design() {
    let store = format!("{}/data/gibleed", env!("CARGO_MANIFEST_DIR"));
    let ctx = session(Path::new(&store)).await;
    // Celecoxib, diclofenac and a set that is never seen (no eras: no exposure covariate).
    let json = r#"{"outcome": {"concept_ids": [192671], "include_descendants": true},
        "exposures": [
          {"concept_ids": [1118084], "include_descendants": true, "label": "celecoxib",
           "risk_windows": [{"start": 0, "end": 30, "split_points": [10]},
                            {"start": -30, "end": -1, "end_anchor": "era_start"}]},
          {"concept_ids": [1124300], "include_descendants": true, "label": "diclofenac",
           "risk_windows": [{"start": 0, "end": 30}]},
          {"concept_ids": [1], "label": "nothing"}],
        "age_group_starts": [18262, 21915],
        "season_spline": {"knots": 3},
        "end_of_observation_probe": 30}"#;
    let d = SccsDesign::from_json(json).unwrap();
    let many = build_sccs_each_exposure(&ctx, &d).await.unwrap();
    assert_eq!(many.len(), 3);
    let mut informative = Vec::new();
    for (x, got) in many.iter().enumerate() {
        let want = build_sccs(&ctx, &single_exposure_design(&d, x))
            .await
            .unwrap();
        for (name, g, w) in [
            ("outcomes", &got.outcomes, &want.outcomes),
            ("covariates", &got.covariates, &want.covariates),
            ("covariate_ref", &got.covariate_ref, &want.covariate_ref),
            ("attrition", &got.attrition, &want.attrition),
        ] {
            assert_eq!(one(g), one(w), "exposure {x}: {name} differ");
        }
        informative.push(one(&got.outcomes).num_rows());
    }
    // The exposures differ (the shared data was filtered per exposure, not pooled).
    assert_ne!(informative[0], informative[1], "{informative:?}");
}

/// The run-wide era cache: two outcomes with the same exposures read the exposures' eras once,
/// and every table equals the uncached build's; a cache too small to keep the eras (0 bytes)
/// reads the store for each outcome and gives the same tables; another exposure list replaces
/// the kept eras (and still gives the uncached tables).
#[tokio::test]
async fn outcomes_share_the_exposure_era_cache() {
    use epifusion::engine::study::{build_sccs_each_exposure_with_cases, ExposureEraCache};
    let store = format!("{}/data/gibleed", env!("CARGO_MANIFEST_DIR"));
    let ctx = session(Path::new(&store)).await;
    let design = |outcome: i64, last: i64| {
        SccsDesign::from_json(&format!(
            r#"{{"outcome": {{"concept_ids": [{outcome}], "include_descendants": true}},
            "exposures": [
              {{"concept_ids": [1118084], "include_descendants": true, "label": "celecoxib",
               "risk_windows": [{{"start": 0, "end": 30}}]}},
              {{"concept_ids": [1124300], "include_descendants": true, "label": "diclofenac",
               "risk_windows": [{{"start": 0, "end": 30}}]}},
              {{"concept_ids": [{last}], "include_descendants": true, "label": "last",
               "risk_windows": [{{"start": 0, "end": 30}}]}}]}}"#
        ))
        .unwrap()
    };
    // GI bleed and a second outcome of the store (different cases), then other exposures
    // (aspirin replaced by acetaminophen).
    let (cached, tiny) = (ExposureEraCache::new(), ExposureEraCache::with_max_bytes(0));
    let mut kept = Vec::new();
    for (outcome, last) in [(192671, 1112807), (28060, 1112807), (28060, 1125315)] {
        let d = design(outcome, last);
        let (want, _) = build_sccs_each_exposure_with_cases(&ctx, &d, None)
            .await
            .unwrap();
        for cache in [&cached, &tiny] {
            let (got, _) = build_sccs_each_exposure_with_cases(&ctx, &d, Some(cache))
                .await
                .unwrap();
            assert_eq!(got.len(), want.len());
            for (x, (g, w)) in got.iter().zip(&want).enumerate() {
                assert!(!w.outcomes.is_empty(), "outcome {outcome}: no intervals");
                for (name, g, w) in [
                    ("outcomes", &g.outcomes, &w.outcomes),
                    ("covariates", &g.covariates, &w.covariates),
                    ("attrition", &g.attrition, &w.attrition),
                ] {
                    assert_eq!(one(g), one(w), "outcome {outcome}, exposure {x}: {name}");
                }
            }
        }
        kept.push((cached.holds(), cached.reads(), tiny.holds(), tiny.reads()));
    }
    // The default cache reads the eras once for both outcomes, then once for the new
    // exposures. The tiny one keeps nothing: it reads each query once, remembers that the
    // result is too large (no second attempt to collect it) and each build joins the store's
    // eras itself.
    assert_eq!(
        kept,
        [
            (true, 1, false, 1),
            (true, 1, false, 1),
            (true, 2, false, 2)
        ]
    );
}

// ---------------------------------------------------------------------------------------------
// The pipeline: one unit per outcome with every exposure, negative controls, OHDSI tables.

use std::path::PathBuf;

use crate::study::cli as epifusion;

/// `sql` over one Parquet file as table `t`, CSV out.
fn parquet_csv(path: &Path, sql: &str) -> String {
    let q = format!(
        "CREATE EXTERNAL TABLE t STORED AS PARQUET LOCATION '{}'; {sql}",
        path.display()
    );
    let (ok, out, err) = epifusion(&["sql", "--format", "csv", "-c", &q]);
    assert!(ok, "{err}");
    out
}

const SETS: &str = r#"
[concept_sets.celecoxib]
concepts = [1118084]
descendants = true
[concept_sets.diclofenac]
concepts = [1124300]
descendants = true
[concept_sets.gi_bleed]
concepts = [192671]
descendants = true
[concept_sets.ankle_sprain]
concepts = [81151]
[concept_sets.concussion]
concepts = [378001]
[concept_sets.whiplash]
concepts = [4218389]
[concept_sets.wrist_sprain]
concepts = [78272]
[concept_sets.otitis_media]
concepts = [372328]
[concept_sets.strep_throat]
concepts = [28060]
"#;

/// A pipeline over the bundled GiBleed store with these lists (TOML arrays).
fn write_pipeline(dir: &Path, exposures: &str, outcomes: &str, negatives: &str) -> PathBuf {
    std::fs::create_dir_all(dir).unwrap();
    let p = dir.join("p.toml");
    std::fs::write(
        &p,
        format!(
            r#"name = "many pairs"
omop = "{store}"
output = "out"
database_id = "gibleed_test"
{SETS}
[[analysis]]
name = "sccs"
design = "sccs"
exposures = {exposures}
outcomes = {outcomes}
negative_controls = {negatives}
[analysis.sccs]
[[analysis.sccs.risk_windows]]
start = 0
end = 30
[analysis.fit]
ci = "wald"
"#,
            store = concat!(env!("CARGO_MANIFEST_DIR"), "/data/gibleed")
        ),
    )
    .unwrap();
    p
}

fn unit_object(out: &Path, unit: &str, object: &str) -> PathBuf {
    let m: serde_json::Value = serde_json::from_slice(
        &std::fs::read(out.join(format!("analyses/{unit}/manifest.json"))).unwrap(),
    )
    .unwrap();
    out.join(m["objects"][object]["path"].as_str().unwrap())
}

#[test]
fn many_pairs_equal_single_pair_runs_and_negative_controls_calibrate() {
    let root = std::env::temp_dir().join(format!("epifusion-sccs-many-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&root);
    let negatives = r#"["ankle_sprain", "concussion", "whiplash", "wrist_sprain", "otitis_media", "strep_throat"]"#;
    let many = write_pipeline(
        &root.join("many"),
        r#"["celecoxib", "diclofenac"]"#,
        r#"["gi_bleed"]"#,
        negatives,
    );
    let (ok, stdout, stderr) = epifusion(&["run", &many.display().to_string()]);
    assert!(ok, "{stdout}\n{stderr}");
    // One unit per outcome (1 + 6 negative controls), each with both exposures.
    assert!(
        stdout.contains("(7 computed, 0 skipped as complete)"),
        "{stdout}"
    );
    // Diclofenac has too few negative controls with an estimate on this store: a warning.
    assert!(
        stdout.contains("exposure diclofenac, covariate 1000: not calibrated"),
        "{stdout}"
    );
    let out = root.join("many/out");

    // Each pair's estimates equal those of a run with that exposure alone.
    let single = write_pipeline(
        &root.join("single"),
        r#"["diclofenac"]"#,
        r#"["gi_bleed", "whiplash"]"#,
        "[]",
    );
    let (ok, stdout, stderr) = epifusion(&["run", &single.display().to_string()]);
    assert!(ok, "{stdout}\n{stderr}");
    let single_out = root.join("single/out");
    for outcome in ["gi_bleed", "whiplash"] {
        let q = "SELECT covariate_id, covariate_name, estimate, std_error, ci_lower, ci_upper, \
                 log_likelihood, iterations FROM t WHERE exposure = 'diclofenac' ORDER BY covariate_id";
        let got = parquet_csv(
            &unit_object(&out, &format!("sccs.{outcome}"), "estimates"),
            q,
        );
        let want = parquet_csv(
            &unit_object(&single_out, &format!("sccs.{outcome}"), "estimates"),
            q,
        );
        assert!(got.lines().count() >= 2, "{got}");
        assert_eq!(got, want, "{outcome}");
        // So are its time trend and time-stability test (shared between the exposures of a
        // unit, computed alone in the single run), to the last digit CSV prints.
        for (object, q) in [
            (
                "sccs_time_trend",
                "SELECT * EXCLUDE (analysis_id) FROM t WHERE exposure = 'diclofenac' \
                 ORDER BY 2, 3",
            ),
            (
                "sccs_pair_diagnostics",
                "SELECT time_trend_months, time_trend_ratio, time_trend_p FROM t \
                 WHERE exposure = 'diclofenac'",
            ),
        ] {
            let got = parquet_csv(&unit_object(&out, &format!("sccs.{outcome}"), object), q);
            let want = parquet_csv(
                &unit_object(&single_out, &format!("sccs.{outcome}"), object),
                q,
            );
            assert!(got.lines().count() >= 2, "{object}: {got}");
            assert_eq!(got, want, "{outcome} {object}");
        }
    }

    // sccs_result: the OHDSI columns, in the specification's names.
    let m: serde_json::Value =
        serde_json::from_slice(&std::fs::read(out.join("manifest.json")).unwrap()).unwrap();
    let result = out.join(m["results"]["sccs_result"]["path"].as_str().unwrap());
    let header = parquet_csv(&result, "SELECT * FROM t LIMIT 1");
    let header = header.lines().next().unwrap();
    for c in [
        "analysis_id",
        "exposures_outcome_set_id",
        "covariate_id",
        "rr",
        "ci_95_lb",
        "ci_95_ub",
        "p",
        "one_sided_p",
        "log_rr",
        "se_log_rr",
        "llr",
        "outcome_subjects",
        "outcome_events",
        "observed_days",
        "calibrated_rr",
        "calibrated_ci_95_lb",
        "calibrated_ci_95_ub",
        "calibrated_p",
        "calibrated_one_sided_p",
        "calibrated_log_rr",
        "calibrated_se_log_rr",
        "database_id",
    ] {
        assert!(header.split(',').any(|h| h == c), "{c} not in {header}");
    }
    // One risk window (1000) × 2 exposures × 7 outcomes.
    let n = parquet_csv(
        &result,
        "SELECT count(*) AS n, count(DISTINCT exposures_outcome_set_id) AS sets, \
         min(database_id) AS db FROM t",
    );
    assert_eq!(n.lines().nth(1).unwrap(), "14,14,gibleed_test", "{n}");

    // Calibration: the pipeline's calibrated values equal those of the SQL functions over the
    // same estimates (celecoxib's window 1000: its negative controls are sets 3, 5, …, 13).
    let sets = parquet_csv(
        &out.join(
            m["results"]["sccs_exposures_outcome_set"]["path"]
                .as_str()
                .unwrap(),
        ),
        "SELECT exposures_outcome_set_id FROM t WHERE exposure = 'celecoxib' AND true_effect_size = 1 ORDER BY 1",
    );
    let nc: Vec<&str> = sets.lines().skip(1).filter(|l| !l.is_empty()).collect();
    assert_eq!(nc.len(), 6, "{sets}");
    let nc = nc.join(", ");
    let ours = parquet_csv(
        &result,
        "SELECT calibrated_p, calibrated_log_rr, calibrated_ci_95_lb FROM t \
         WHERE exposures_outcome_set_id = 1 AND covariate_id = 1000",
    );
    let theirs = parquet_csv(
        &result,
        &format!(
            "SELECT calibrated_p, calibrated_log_rr, calibrated_ci_95_lb FROM calibrate_estimates(\
             'SELECT log_rr, se_log_rr FROM t WHERE exposures_outcome_set_id = 1 AND covariate_id = 1000', \
             'SELECT log_rr, se_log_rr FROM t WHERE covariate_id = 1000 AND se_log_rr IS NOT NULL \
              AND exposures_outcome_set_id IN ({nc})')"
        ),
    );
    let row = |s: &str| -> Vec<f64> {
        s.lines()
            .nth(1)
            .unwrap()
            .split(',')
            .map(|x| x.parse().unwrap_or(f64::NAN))
            .collect()
    };
    let (a, b) = (row(&ours), row(&theirs));
    for (x, y) in a.iter().zip(&b) {
        assert!(
            x.is_finite() && (x - y).abs() <= 1e-12 * y.abs().max(1.0),
            "{ours} vs {theirs}"
        );
    }
    // Diclofenac is not calibrated: NULL calibrated columns.
    let d = parquet_csv(
        &result,
        "SELECT count(*) FROM t WHERE exposures_outcome_set_id % 2 = 0 AND calibrated_p IS NOT NULL",
    );
    assert_eq!(d.lines().nth(1).unwrap(), "0", "{d}");

    // Diagnostics summary and attrition.
    let diag = parquet_csv(
        &out.join(
            m["results"]["sccs_diagnostics_summary"]["path"]
                .as_str()
                .unwrap(),
        ),
        "SELECT count(*), count(mdrr), count(ease), min(ease_diagnostic) FROM t \
         WHERE exposures_outcome_set_id % 2 = 1",
    );
    assert_eq!(
        diag.lines()
            .nth(1)
            .unwrap()
            .split(',')
            .take(3)
            .collect::<Vec<_>>(),
        ["7", "7", "7"],
        "{diag}"
    );
    let att = parquet_csv(
        &out.join(m["results"]["sccs_attrition"]["path"].as_str().unwrap()),
        "SELECT count(DISTINCT exposures_outcome_set_id), min(sequence_number), \
         count(observed_days) FROM t",
    );
    assert_eq!(att.lines().nth(1).unwrap(), "14,1,14", "{att}");

    // The report shows the calibration plots and the diagnostics table, in a real browser.
    chromium_sees_the_calibration(&out.join("report.html"));
    let _ = std::fs::remove_dir_all(&root);
}

/// Open the report in headless chromium (through a probe page) and check the calibration plots
/// (negative controls drawn inside the plot, the null's region where calibrated) and the
/// diagnostics table.
fn chromium_sees_the_calibration(report: &Path) {
    const COLLECT: &str = r#"
    out.text = d.body.innerText;
    out.plots = Array.from(d.querySelectorAll('svg.calibration-plot')).map(function (svg) {
      var sb = svg.getBoundingClientRect();
      var dots = Array.from(svg.querySelectorAll('circle.negative-control')).map(function (c) {
        var b = c.getBoundingClientRect();
        return b.width > 0 && b.x >= sb.x && b.right <= sb.right && b.y >= sb.y && b.bottom <= sb.bottom;
      });
      return {group: svg.parentNode.getAttribute('data-group'), dots: dots,
              region: svg.querySelectorAll('polygon.null-region').length,
              interest: svg.querySelectorAll('polygon.estimate-of-interest').length};
    });
    out.diagnostics = d.querySelectorAll('table.sccs-diagnostics tbody tr').length;
"#;
    let Some(v) = crate::pipeline::chromium_probe(report, "probe.html", 6000, COLLECT) else {
        return;
    };
    let text = v["text"].as_str().unwrap();
    assert!(
        text.contains("SCCS empirical calibration") && text.contains("null mean"),
        "{text}"
    );
    // One plot per exposure (one window); celecoxib's is calibrated (null region), and
    // every negative control with an estimate is a dot inside its plot.
    let plots = v["plots"].as_array().unwrap();
    assert_eq!(plots.len(), 2, "{v}");
    for p in plots {
        let dots = p["dots"].as_array().unwrap();
        assert!(
            dots.len() >= 4 && dots.iter().all(|d| d.as_bool().unwrap()),
            "{p}"
        );
        let calibrated = p["group"].as_str().unwrap().contains("celecoxib");
        assert_eq!(p["region"].as_u64().unwrap() == 1, calibrated, "{p}");
        assert_eq!(p["interest"].as_u64().unwrap(), 1, "{p}");
    }
    assert_eq!(v["diagnostics"].as_u64().unwrap(), 14, "{v}");
}

// ---------------------------------------------------------------------------------------------
// The OHDSI tables beyond the estimates (issue #15 item 5): the likelihood profile and `llr`,
// the time trend, the time to event and the time-trend / pre-exposure diagnostics, on a store
// small enough to check by hand.

/// 2020-01-01 as a day number; every person is observed all of 2020 (a leap year).
const Y2020: i64 = 18_262;
/// Observed days of each case: 2020-01-01 … 2020-12-31.
const OBSERVED_DAYS: f64 = 366.0;
/// Exposed days of each case: the risk window [0, 30] after a one-day era.
const EXPOSED_DAYS: f64 = 31.0;

/// Per person: the day (from 2020-01-01) of the one-day era of concept 5 and the outcomes
/// (concept 7) as offsets from it. Every window lies inside the year, so each case has 31
/// exposed of 366 observed days and 30 observed days on each side of its era for the
/// pre-exposure gain.
fn hand_cases() -> Vec<(i64, Vec<i64>)> {
    vec![
        (152, vec![5, -10, -100]),
        (159, vec![20, 90]),
        (166, vec![-20, -50, 3]),
        (173, vec![1, -5, 150]),
        (180, vec![-120, 60, 12]),
        (187, vec![10, 170]),
        (194, vec![-25, -15, 40]),
        (201, vec![29, -140, 100]),
    ]
}

fn hand_store(dir: &Path) {
    let mut store = crate::study::CsvStore::default();
    for (p, (era_day, outcomes)) in hand_cases().into_iter().enumerate() {
        let p = p as i64 + 1;
        let e = Y2020 + era_day;
        store.person(p, 1960, Y2020, Y2020 + 365);
        store.era(p, e, e);
        for o in outcomes {
            store.outcome(p, e + o);
        }
    }
    let concept = "concept_id,concept_name,domain_id,vocabulary_id,concept_class_id,standard_concept,concept_code\n\
         5,drug,Drug,RxNorm,Ingredient,S,5\n\
         7,event,Condition,SNOMED,Clinical Finding,S,7\n";
    store.write(dir, &[("concept.csv", concept)]);
}

/// The design the pipeline runs, as SQL settings (for the engine's own diagnostics functions).
const HAND_SETTINGS: &str = r#"{"outcome": {"concept_ids": [7]},
  "exposures": [{"concept_ids": [5], "label": "drug", "risk_windows": [{"start": 0, "end": 30}]}]"#;

/// The columns of `table` in the OHDSI results model specification (SelfControlledCaseSeries
/// `inst/csv/resultsDataModelSpecification.csv`), in its order.
fn spec_columns(table: &str) -> &'static [&'static str] {
    match table {
        "sccs_likelihood_profile" => &[
            "analysis_id",
            "exposures_outcome_set_id",
            "covariate_id",
            "log_rr",
            "log_likelihood",
            "database_id",
        ],
        "sccs_time_trend" => &[
            "analysis_id",
            "exposures_outcome_set_id",
            "calendar_year",
            "calendar_month",
            "observed_subjects",
            "ratio",
            "adjusted_ratio",
            "database_id",
        ],
        "sccs_time_to_event" => &[
            "analysis_id",
            "exposures_outcome_set_id",
            "era_id",
            "week",
            "observed_subjects",
            "outcomes",
            "database_id",
        ],
        _ => unreachable!(),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn profile_llr_time_trend_time_to_event_and_pre_exposure_by_hand() {
    use crate::study::{f64s, i64s, session, strings};
    use datafusion::prelude::ParquetReadOptions;

    let root = std::env::temp_dir().join(format!("epifusion-sccs-hand-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&root);
    let store = root.join("store");
    hand_store(&store);
    let pipeline = root.join("p.toml");
    std::fs::write(
        &pipeline,
        format!(
            r#"name = "hand"
omop = "{store}"
output = "out"
database_id = "hand"
[concept_sets.drug]
concepts = [5]
[concept_sets.event]
concepts = [7]
[[analysis]]
name = "sccs"
design = "sccs"
exposures = ["drug"]
outcomes = ["event"]
[analysis.sccs]
[[analysis.sccs.risk_windows]]
start = 0
end = 30
"#,
            store = store.display()
        ),
    )
    .unwrap();
    let (ok, stdout, stderr) = epifusion(&["run", &pipeline.display().to_string()]);
    assert!(ok, "{stdout}\n{stderr}");
    let out = root.join("out");
    let m: serde_json::Value =
        serde_json::from_slice(&std::fs::read(out.join("manifest.json")).unwrap()).unwrap();
    let ctx = session(&store).await;
    for name in [
        "sccs_result",
        "sccs_diagnostics_summary",
        "sccs_likelihood_profile",
        "sccs_time_trend",
        "sccs_time_to_event",
    ] {
        let path = out.join(m["results"][name]["path"].as_str().unwrap());
        ctx.register_parquet(name, path.to_str().unwrap(), ParquetReadOptions::default())
            .await
            .unwrap();
    }
    let q = |sql: String| {
        let ctx = ctx.clone();
        async move { ctx.sql(&sql).await.unwrap().collect().await.unwrap() }
    };
    for name in [
        "sccs_likelihood_profile",
        "sccs_time_trend",
        "sccs_time_to_event",
    ] {
        let schema = ctx.table(name).await.unwrap().schema().clone();
        let got: Vec<&str> = schema.fields().iter().map(|f| f.name().as_str()).collect();
        let want = spec_columns(name);
        assert!(
            want.iter().all(|c| got.contains(c)),
            "{name}: {got:?} lacks some of {want:?}"
        );
    }

    // The closed forms: one binary covariate, every case with the same 31 exposed of 366
    // observed days, so the conditional log-likelihood is, up to a constant,
    // ℓ(β) = Y_e β − N ln(E e^β + L − E), maximized at e^β̂ = (Y_e / E) / (Y_u / (L − E)).
    let offsets: Vec<i64> = hand_cases().into_iter().flat_map(|c| c.1).collect();
    let n = offsets.len() as f64;
    let y_e = offsets.iter().filter(|&&o| (0..=30).contains(&o)).count() as f64;
    let (l, e) = (OBSERVED_DAYS, EXPOSED_DAYS);
    let beta_hat = ((y_e / e) / ((n - y_e) / (l - e))).ln();
    let ll = |b: f64| y_e * b - n * (e * b.exp() + l - e).ln();

    let r = q("SELECT log_rr, llr FROM sccs_result WHERE covariate_id = 1000".into()).await;
    let (log_rr, llr) = (f64s(&r, "log_rr"), f64s(&r, "llr"));
    assert_eq!(log_rr.len(), 1);
    assert!(
        (log_rr[0] - beta_hat).abs() < 1e-6,
        "{log_rr:?} vs {beta_hat}"
    );
    // llr: the SCCS package's `fit$log_likelihood − profile(0)`.
    assert!((llr[0] - (ll(beta_hat) - ll(0.0))).abs() < 1e-8, "{llr:?}");

    // The profile: 201 points on [ln 0.1, ln 10] with 0 on the grid; its differences are ℓ's.
    let p = q(
        "SELECT log_rr, log_likelihood, exposures_outcome_set_id, analysis_id, database_id \
               FROM sccs_likelihood_profile WHERE covariate_id = 1000 ORDER BY log_rr"
            .into(),
    )
    .await;
    let (x, y) = (f64s(&p, "log_rr"), f64s(&p, "log_likelihood"));
    assert_eq!(x.len(), 201);
    assert!((x[0] - 0.1f64.ln()).abs() < 1e-12 && (x[200] - 10f64.ln()).abs() < 1e-12);
    assert_eq!(x[100], 0.0);
    for (xi, yi) in x.iter().zip(&y) {
        let want = ll(*xi) - ll(0.0);
        assert!(
            (yi - y[100] - want).abs() < 1e-8,
            "at {xi}: {} vs {want}",
            yi - y[100]
        );
    }
    assert_eq!(i64s(&p, "exposures_outcome_set_id")[0], 1);
    assert_eq!(i64s(&p, "analysis_id")[0], 1);
    assert_eq!(strings(&p, "database_id")[0], "hand");

    // Time trend: each case is observed all of 2020, Jan 1 to Dec 31, so R's month count is
    // 11 + 31/31 + 31/31 = 13, each case's rate n_i / 13, a month's expected count N / 13 and
    // its weighted observation count 8 (no splines: adjusted = plain).
    let mut per_month: std::collections::BTreeMap<(i64, i64), i64> = Default::default();
    for (era_day, outcomes) in hand_cases() {
        for o in outcomes {
            let (y, mth, _) = epifusion::engine::study::civil_from_days(Y2020 + era_day + o);
            *per_month.entry((y, mth)).or_default() += 1;
        }
    }
    let t = q(
        "SELECT calendar_year, calendar_month, observed_subjects, ratio, adjusted_ratio, \
               outcomes FROM sccs_time_trend ORDER BY calendar_year, calendar_month"
            .into(),
    )
    .await;
    let (years, months) = (i64s(&t, "calendar_year"), i64s(&t, "calendar_month"));
    let got: Vec<(i64, i64)> = years.iter().copied().zip(months.iter().copied()).collect();
    assert_eq!(got, per_month.keys().copied().collect::<Vec<_>>());
    let cases = hand_cases().len() as i64;
    assert!(i64s(&t, "observed_subjects").iter().all(|&s| s == cases));
    let (ratio, adjusted) = (f64s(&t, "ratio"), f64s(&t, "adjusted_ratio"));
    for (k, o) in per_month.values().enumerate() {
        let want = *o as f64 / (n / 13.0);
        assert!(
            (ratio[k] - want).abs() < 1e-12,
            "{k}: {} vs {want}",
            ratio[k]
        );
        assert!((adjusted[k] - want).abs() < 1e-12);
    }
    assert_eq!(
        i64s(&t, "outcomes"),
        per_month.values().copied().collect::<Vec<_>>()
    );

    // Time to event: the engine's own `sccs_time_to_event` over the same design.
    let ours =
        q("SELECT week, observed_subjects, outcomes FROM sccs_time_to_event ORDER BY week".into())
            .await;
    let sql = q(format!(
        "SELECT week, observed_cases, outcomes_exposed + outcomes_unexposed AS outcomes \
         FROM sccs_time_to_event('{HAND_SETTINGS}}}') ORDER BY week"
    ))
    .await;
    assert_eq!(i64s(&ours, "week"), i64s(&sql, "week"));
    assert_eq!(
        i64s(&ours, "observed_subjects"),
        i64s(&sql, "observed_cases")
    );
    assert_eq!(i64s(&ours, "outcomes"), i64s(&sql, "outcomes"));
    // By hand: weeks 0 … 4 (days 0 … 34 after the era) hold the 7 exposed outcomes, and every
    // outcome within 26 weeks either side is counted once.
    let w = i64s(&ours, "week");
    let o = i64s(&ours, "outcomes");
    let first_weeks: i64 = w
        .iter()
        .zip(&o)
        .filter(|(w, _)| (0..5).contains(*w))
        .map(|(_, o)| o)
        .sum();
    assert_eq!(first_weeks, y_e as i64);
    let near = offsets
        .iter()
        .filter(|&&d| (-182..182).contains(&d))
        .count() as i64;
    assert_eq!(o.iter().sum::<i64>(), near);

    // Diagnostics: time_trend_p equals the engine's `sccs_diagnostics` time-stability p with
    // the results model's max ratio 1.25; pre_exposure_p is R `computePreExposureGain` by hand:
    // 30 days each side of every era, B outcomes before and A after, so β̂ = ln(B / A),
    // llr = B β̂ − (A + B) ln((e^β̂ + 1) / 2) and p = 1 − P(χ²₁ > 2 llr) / 2 as β̂ < 0.
    let d = q(
        "SELECT time_trend_p, pre_exposure_p, time_trend_diagnostic, \
               pre_exposure_diagnostic, unblind FROM sccs_diagnostics_summary"
            .into(),
    )
    .await;
    let stability = q(format!(
        "SELECT value FROM sccs_diagnostics('{HAND_SETTINGS}, \
         \"diagnostics\": {{\"time_trend_max_ratio\": 1.25}}}}') WHERE diagnostic = 'time_stability'"
    ))
    .await;
    let tt = f64s(&d, "time_trend_p")[0];
    assert!((tt - f64s(&stability, "value")[0]).abs() < 1e-12, "{tt}");
    assert_eq!(
        strings(&d, "time_trend_diagnostic")[0],
        if tt >= 0.05 { "PASS" } else { "FAIL" }
    );
    let before = offsets.iter().filter(|&&o| (-30..0).contains(&o)).count() as f64;
    let after = offsets.iter().filter(|&&o| (0..=30).contains(&o)).count() as f64;
    let b = (before / after).ln();
    let pre_llr = before * b - (before + after) * ((b.exp() + 1.0) / 2.0).ln();
    let pre_p = 1.0 - 0.5 * epifusion_core::sccs_diagnostics::chi2_1_upper(2.0 * pre_llr);
    let got = f64s(&d, "pre_exposure_p")[0];
    assert!((got - pre_p).abs() < 1e-10, "{got} vs {pre_p}");
    assert_eq!(strings(&d, "pre_exposure_diagnostic")[0], "PASS");
    let _ = std::fs::remove_dir_all(&root);
}
