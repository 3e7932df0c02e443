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
