//! The issue #14 checks on a confounded OMOP store with a known null effect
//! (`engine::study::synth_cohort`: measured confounders raise both the odds of the target and
//! the outcome hazard, a 12,000-concept sparse baseline vocabulary, a true HR of exactly 1, and
//! negative-control outcomes, two of ten with systematic error from an unmeasured confounder),
//! run through the pipeline as a user would:
//!
//! * the crude Cox HR (treatment only) is far from 1 and its CI excludes 1;
//! * after 1:1 PS matching (caliper 0.2 on the standardized logit, stratified Cox on the
//!   matched sets) the HR's CI covers 1 and max |SDM| over every baseline covariate is ≤ 0.1;
//! * stratification into 5 PS quintiles removes most of the crude bias (not all: coarse strata
//!   keep some, as the literature says);
//! * IPTW (ATE, stabilized weights truncated at 20, robust variance) gives a CI covering 1;
//! * the negative controls declared for the matched analysis calibrate it: the run-level
//!   `cm_result` has `calibrated_*` for every unit, the biased controls stand out, and the
//!   report draws the calibration plot.

use std::path::{Path, PathBuf};

use datafusion::arrow::record_batch::RecordBatch;
use datafusion::prelude::{ParquetReadOptions, SessionContext};
use epifusion::engine::study::synth_cohort::{
    self, write_cohort_store, CohortStoreSettings, COMPARATOR_DRUG, OUTCOME_CONCEPT, TARGET_DRUG,
};
use epifusion::pipeline::{plan, progress::Progress, run};

use crate::study::{f64s, i64s};

const NEGATIVE_CONTROLS: usize = 10;

fn pipeline_text(store: &Path, out: &Path) -> String {
    let mut s = format!(
        r#"name = "confounded null"
omop = "{}"
output = "{}"
database_id = "synth"

[concept_sets.target]
concepts = [{TARGET_DRUG}]
[concept_sets.comparator]
concepts = [{COMPARATOR_DRUG}]
[concept_sets.outcome]
concepts = [{OUTCOME_CONCEPT}]
"#,
        store.display(),
        out.display()
    );
    for j in 0..NEGATIVE_CONTROLS {
        s.push_str(&format!(
            "[concept_sets.nc_{j}]\nconcepts = [{}]\n",
            OUTCOME_CONCEPT + 1 + j as i64
        ));
    }
    let design = "[analysis.cohort]\nwashout_days = 365\nfirst_exposure_only = true\n\
                  risk_window_end = 365\nend_anchor = \"cohort_start\"\n";
    let analysis = |name: &str, extra: &str| {
        format!(
            "\n[[analysis]]\nname = \"{name}\"\ndesign = \"cohort\"\nmodel = \"cox\"\n\
             targets = [\"target\"]\ncomparators = [\"comparator\"]\noutcomes = [\"outcome\"]\n{extra}"
        )
    };
    // Crude: the treatment alone.
    s.push_str(&analysis(
        "crude",
        &format!(
            "{design}[analysis.cohort.covariates]\ngender = false\nage_group = false\n\
             conditions = false\ndrugs = false\nprocedures = false\n[analysis.fit]\nci = \"wald\"\n"
        ),
    ));
    // The PS (every baseline covariate, a fixed prior variance: no CV in a debug test).
    let ps = "[analysis.cohort.ps]\nvariance = 0.1\n";
    let controls: Vec<String> = (0..NEGATIVE_CONTROLS)
        .map(|j| format!("\"nc_{j}\""))
        .collect();
    s.push_str(&analysis(
        "matched",
        &format!(
            "negative_controls = [{}]\n{design}{ps}[analysis.cohort.adjustment]\n\
             method = \"match\"\n[analysis.fit]\nci = \"wald\"\n",
            controls.join(", ")
        ),
    ));
    s.push_str(&analysis(
        "weighted",
        &format!(
            "{design}{ps}[analysis.cohort.adjustment]\nmethod = \"weight\"\n\
             estimator = \"ate\"\nmax_weight = 20\n[analysis.fit]\nci = \"wald\"\n"
        ),
    ));
    s.push_str(&analysis(
        "stratified",
        &format!(
            "{design}{ps}[analysis.cohort.adjustment]\nmethod = \"stratify\"\n\
             number_of_strata = 5\n[analysis.fit]\nci = \"wald\"\n"
        ),
    ));
    s
}

async fn parquet(path: &Path) -> Vec<RecordBatch> {
    let ctx = SessionContext::new();
    ctx.read_parquet(path.to_str().unwrap(), ParquetReadOptions::default())
        .await
        .unwrap_or_else(|e| panic!("{}: {e}", path.display()))
        .collect()
        .await
        .unwrap()
}

fn json(path: &Path) -> serde_json::Value {
    serde_json::from_slice(&std::fs::read(path).unwrap_or_else(|e| panic!("{path:?}: {e}")))
        .unwrap()
}

/// The object `name` of unit `id`.
fn unit_object(out: &Path, id: &str, name: &str) -> PathBuf {
    let m = json(&out.join("manifest.json"));
    let entry = m["analyses"]
        .as_array()
        .unwrap()
        .iter()
        .find(|a| a["id"] == id)
        .unwrap_or_else(|| panic!("no unit {id} in {m}"));
    let am = json(&out.join(entry["manifest"]["path"].as_str().unwrap()));
    out.join(
        am["objects"][name]["path"]
            .as_str()
            .unwrap_or_else(|| panic!("no {name} in {am}")),
    )
}

/// (log HR, CI lower, CI upper) of the treatment (covariate 1) of a unit.
async fn treatment(out: &Path, id: &str) -> (f64, f64, f64) {
    let e = parquet(&unit_object(out, id, "estimates")).await;
    let ids = i64s(&e, "covariate_id");
    let k = ids.iter().position(|&c| c == 1).expect("treatment row");
    (
        f64s(&e, "estimate")[k],
        f64s(&e, "ci_lower")[k],
        f64s(&e, "ci_upper")[k],
    )
}

#[tokio::test(flavor = "multi_thread")]
async fn ps_adjustment_recovers_the_null_on_a_confounded_store() {
    let dir = std::env::temp_dir().join(format!("epifusion-cm-synth-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let (store, out) = (dir.join("store"), dir.join("out"));
    let summary = write_cohort_store(
        &store,
        &CohortStoreSettings {
            persons: 12_000,
            seed: 14,
            negative_controls: NEGATIVE_CONTROLS,
            ..Default::default()
        },
    )
    .unwrap();
    eprintln!("{summary:?}");
    let file = dir.join("p.toml");
    std::fs::write(&file, pipeline_text(&store, &out)).unwrap();
    let p = plan::load(&file, None, None).unwrap();
    run::run(
        &p,
        run::RunOptions {
            dry_run: false,
            force: true,
            no_lock: false,
        },
        &Progress::quiet(),
    )
    .await
    .unwrap();

    // Crude: far from the true HR of 1.
    let crude = treatment(&out, "crude.target.comparator.outcome").await;
    eprintln!(
        "crude HR {:.3} ({:.3}, {:.3})",
        crude.0.exp(),
        crude.1.exp(),
        crude.2.exp()
    );
    assert!(crude.0.exp() > 1.5 && crude.1 > 0.0, "crude {crude:?}");

    // Matched: the CI covers 1, every covariate balanced.
    let matched = treatment(&out, "matched.target.comparator.outcome").await;
    eprintln!(
        "matched HR {:.3} ({:.3}, {:.3})",
        matched.0.exp(),
        matched.1.exp(),
        matched.2.exp()
    );
    assert!(matched.1 < 0.0 && 0.0 < matched.2, "matched {matched:?}");
    let d = parquet(&unit_object(
        &out,
        "matched.target.comparator.outcome",
        "cm_diagnostics_summary",
    ))
    .await;
    let max_sdm = f64s(&d, "max_sdm")[0];
    let balance = parquet(&unit_object(
        &out,
        "matched.target.comparator.outcome",
        "cm_covariate_balance",
    ))
    .await;
    let before = f64s(&balance, "std_diff_before");
    let max_before = before
        .iter()
        .filter(|v| v.is_finite())
        .fold(0f64, |m, v| m.max(v.abs()));
    eprintln!(
        "balance over {} covariates: max |SDM| {max_before:.3} before, {max_sdm:.3} after matching",
        before.len()
    );
    assert!(before.len() > 8_000, "{} covariates", before.len());
    assert!(max_before > 0.2, "confounded before matching: {max_before}");
    assert!(max_sdm <= 0.1, "max |SDM| after matching {max_sdm}");

    // IPTW (ATE, stabilized, truncated at 20) with a robust variance: the CI covers 1 and most
    // of the crude bias is gone.
    let weighted = treatment(&out, "weighted.target.comparator.outcome").await;
    eprintln!(
        "weighted HR {:.3} ({:.3}, {:.3})",
        weighted.0.exp(),
        weighted.1.exp(),
        weighted.2.exp()
    );
    assert!(
        weighted.1 < 0.0 && 0.0 < weighted.2,
        "weighted {weighted:?}"
    );
    assert!(
        weighted.0.abs() < 0.35 * crude.0.abs(),
        "weighted {weighted:?} vs crude {crude:?}"
    );

    // Stratified: most of the crude bias removed.
    let strat = treatment(&out, "stratified.target.comparator.outcome").await;
    eprintln!(
        "stratified HR {:.3} ({:.3}, {:.3}): {:.0} % of the crude log HR left",
        strat.0.exp(),
        strat.1.exp(),
        strat.2.exp(),
        100.0 * strat.0 / crude.0
    );
    assert!(
        strat.0.abs() < 0.35 * crude.0.abs(),
        "stratified {strat:?} vs crude {crude:?}"
    );

    // Calibration by the negative controls: the run-level cm_result.
    let m = json(&out.join("manifest.json"));
    let path = |name: &str| {
        out.join(
            m["results"][name]["path"]
                .as_str()
                .unwrap_or_else(|| panic!("no run-level {name} in {m}")),
        )
    };
    let r = parquet(&path("cm_result")).await;
    let tco = parquet(&path("cm_target_comparator_outcome")).await;
    let outcome_ids = i64s(&r, "outcome_id");
    assert_eq!(
        outcome_ids.len(),
        1 + NEGATIVE_CONTROLS,
        "matched units only"
    );
    assert_eq!(i64s(&tco, "outcome_id"), outcome_ids);
    let interest = i64s(&tco, "outcome_of_interest");
    let log_rr = f64s(&r, "log_rr");
    for c in [
        "calibrated_rr",
        "calibrated_ci_95_lb",
        "calibrated_ci_95_ub",
        "calibrated_p",
        "calibrated_one_sided_p",
        "calibrated_log_rr",
        "calibrated_se_log_rr",
    ] {
        assert!(f64s(&r, c).iter().all(|v| v.is_finite()), "{c} has NULLs");
    }
    let k = interest.iter().position(|&i| i == 1).unwrap();
    assert!((log_rr[k] - matched.0).abs() < 1e-12);
    let (lb, ub) = (
        f64s(&r, "calibrated_ci_95_lb")[k],
        f64s(&r, "calibrated_ci_95_ub")[k],
    );
    eprintln!(
        "calibrated HR {:.3} ({lb:.3}, {ub:.3})",
        f64s(&r, "calibrated_rr")[k]
    );
    assert!(lb < 1.0 && 1.0 < ub, "calibrated CI ({lb}, {ub})");
    // The controls with systematic error stand out from the others.
    let (mut biased, mut unbiased) = (Vec::new(), Vec::new());
    for (i, &o) in outcome_ids.iter().enumerate() {
        if interest[i] == 1 {
            continue;
        }
        let j = (o - OUTCOME_CONCEPT - 1) as usize;
        if synth_cohort::is_biased(j) {
            biased.push(log_rr[i]);
        } else {
            unbiased.push(log_rr[i]);
        }
    }
    let mean = |v: &[f64]| v.iter().sum::<f64>() / v.len() as f64;
    eprintln!("negative controls: biased {biased:?}, unbiased {unbiased:?}");
    assert!(
        mean(&biased) > mean(&unbiased) + 0.1,
        "{biased:?} vs {unbiased:?}"
    );
    let report = std::fs::read_to_string(out.join("report.html")).unwrap();
    assert!(
        report.contains("Cohort empirical calibration")
            && report.contains("matched · target vs comparator"),
        "no calibration section in the report"
    );
    let _ = std::fs::remove_dir_all(&dir);
}
