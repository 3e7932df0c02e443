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

// ---------------------------------------------------------------------------------------------
// The pipeline: one unit per outcome with every exposure, negative controls, OHDSI tables.

use std::path::PathBuf;
use std::process::Command;

fn epifusion(args: &[&str]) -> (bool, String, String) {
    let o = Command::new(env!("CARGO_BIN_EXE_epifusion"))
        .args(args)
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
        .expect("run epifusion");
    (
        o.status.success(),
        String::from_utf8_lossy(&o.stdout).into_owned(),
        String::from_utf8_lossy(&o.stderr).into_owned(),
    )
}

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
    let Some(browser) = crate::pipeline::chromium() else {
        return;
    };
    let probe = report.parent().unwrap().join("probe.html");
    std::fs::write(
        &probe,
        r#"<!DOCTYPE html><html><body><iframe id="f" src="report.html" width="1400" height="6000"></iframe>
<pre id="probe">waiting</pre>
<script>
document.getElementById('f').addEventListener('load', function () {
  var out = {};
  try {
    var d = this.contentDocument;
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
  } catch (e) { out.error = String(e); }
  document.getElementById('probe').textContent = JSON.stringify(out);
});
</script></body></html>"#,
    )
    .unwrap();
    let o = Command::new(&browser)
        .args([
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--allow-file-access-from-files",
            "--virtual-time-budget=15000",
            "--dump-dom",
        ])
        .arg(format!("file://{}", probe.display()))
        .output()
        .expect("run chromium");
    let dom = String::from_utf8_lossy(&o.stdout);
    let json = dom
        .split("<pre id=\"probe\">")
        .nth(1)
        .and_then(|s| s.split("</pre>").next())
        .unwrap_or_else(|| panic!("no probe output: {dom}"))
        .replace("&lt;", "<")
        .replace("&gt;", ">")
        .replace("&quot;", "\"")
        .replace("&amp;", "&");
    let v: serde_json::Value =
        serde_json::from_str(&json).unwrap_or_else(|e| panic!("{e}: {json}"));
    assert!(v.get("error").is_none(), "{v}");
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
    let _ = std::fs::remove_file(&probe);
}
