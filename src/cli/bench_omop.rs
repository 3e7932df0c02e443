//! `epifusion bench-omop`: the study-design builders on a seeded synthetic OMOP store.

use super::*;

#[derive(Args, Debug)]
pub(crate) struct BenchOmopArgs {
    /// Persons in the synthetic store.
    #[arg(long, default_value_t = 100_000)]
    pub(crate) persons: usize,
    /// Drugs (drug_era concepts).
    #[arg(long, default_value_t = 20)]
    pub(crate) drugs: usize,
    /// Seed.
    #[arg(long, default_value_t = 1)]
    pub(crate) seed: u64,
    /// Folder for the store (written there; reused when `--reuse` and already present).
    #[arg(long)]
    pub(crate) dir: Option<PathBuf>,
    /// Reuse a store already in `--dir`.
    #[arg(long)]
    pub(crate) reuse: bool,
    /// Which builders: sccs, cohort or both; or `many`: every drug against an outcome and
    /// `--many-outcomes` negative controls through the pipeline (one unit per outcome) against
    /// a sample of the same pairs run one per unit; or `cm`: a confounded store (true HR 1)
    /// and a PS-matched comparative cohort study on it, step by step.
    #[arg(long, default_value = "both")]
    pub(crate) design: String,
    /// Extra outcomes (RR = 1, every 5th with systematic error) for `--design many`.
    #[arg(long, default_value_t = 50)]
    pub(crate) many_outcomes: usize,
    /// Pairs timed one by one for `--design many`.
    #[arg(long, default_value_t = 20)]
    pub(crate) sample: usize,
    /// Also fit the SCCS intervals (unpenalized) and report drug 1's relative incidence.
    #[arg(long)]
    pub(crate) fit: bool,
    /// `--design cm`: size of the sparse baseline vocabulary (conditions, drugs, procedures).
    #[arg(long, default_value_t = 12_000)]
    pub(crate) covariates: usize,
    /// `--design cm`: negative-control outcomes in the store.
    #[arg(long, default_value_t = 0)]
    pub(crate) negative_controls: usize,
    /// `--design cm`: repetitions of the 10-fold cross-validation of the propensity model.
    #[arg(long, default_value_t = 10)]
    pub(crate) cv_repetitions: usize,
    /// `--design cm`: a fixed prior variance of the propensity model (no cross-validation).
    #[arg(long)]
    pub(crate) ps_variance: Option<f64>,
}

pub(crate) fn run_bench_omop(a: &BenchOmopArgs) -> Result<()> {
    use epifusion::engine::session::{new_session, SessionOptions};
    use epifusion::engine::study::{self, synth};
    if !["sccs", "cohort", "both", "many", "cm"].contains(&a.design.as_str()) {
        bail!(
            "--design: sccs, cohort, both, many or cm (got {})",
            a.design
        );
    }
    if a.design == "cm" {
        return run_bench_cm(a);
    }
    let extra = if a.design == "many" {
        a.many_outcomes
    } else {
        0
    };
    let dir = a.dir.clone().unwrap_or_else(|| {
        std::env::temp_dir().join(format!("epifusion-omop-{}-{}-{extra}", a.persons, a.seed))
    });
    let started = Instant::now();
    let mut out = serde_json::json!({ "persons": a.persons, "drugs": a.drugs, "seed": a.seed,
        "store": dir.display().to_string() });
    if !(a.reuse && dir.join("person.parquet").exists()) {
        let s = synth::write_store_with(&dir, a.persons, a.drugs, a.seed, extra)?;
        out["drug_eras"] = s.drug_eras.into();
        out["conditions"] = s.conditions.into();
        out["outcomes"] = s.outcomes.into();
        out["generate_seconds"] = started.elapsed().as_secs_f64().into();
    }
    let store_bytes: u64 = std::fs::read_dir(&dir)?
        .filter_map(|e| e.ok()?.metadata().ok())
        .map(|m| m.len())
        .sum();
    out["store_bytes"] = store_bytes.into();
    out["rss_after_generate_bytes"] = epifusion::bench::peak_rss_bytes().into();
    if a.design == "many" {
        super::bench_many::bench_many(&dir, a.drugs, extra, a.sample, &mut out)?;
        out["peak_rss_bytes"] = epifusion::bench::peak_rss_bytes().into();
        println!("{}", serde_json::to_string_pretty(&out)?);
        return Ok(());
    }
    let rt = runtime()?;
    rt.block_on(async {
        let ctx = new_session(&SessionOptions {
            omop: Some(dir.display().to_string()),
            batch_size: None,
        })
        .await?;
        let rows = |b: &[datafusion::arrow::array::RecordBatch]| -> usize {
            b.iter().map(|b| b.num_rows()).sum()
        };
        let bytes = |t: &study::StudyTables| -> usize {
            t.outcomes
                .iter()
                .chain(&t.covariates)
                .map(|b| b.get_array_memory_size())
                .sum()
        };
        if a.design != "cohort" {
            let d = study::SccsDesign::from_json(&format!(
                r#"{{"outcome": {{"concept_ids": [{}]}},
                    "exposures": [{{"concept_ids": [{}], "label": "drug 1"}},
                                  {{"concept_ids": [{}], "label": "drug 2", "risk_windows": [{{"start": -30, "end": -1, "end_anchor": "era_start"}}, {{}}]}}],
                    "age_spline": {{"knots": 5}}, "season_spline": {{"knots": 5}},
                    "end_of_observation_probe": 30}}"#,
                synth::OUTCOME_CONCEPT,
                synth::FIRST_DRUG,
                synth::FIRST_DRUG + 1
            ))?;
            let t0 = Instant::now();
            let t = study::build_sccs(&ctx, &d).await?;
            out["sccs_seconds"] = t0.elapsed().as_secs_f64().into();
            out["sccs_rows"] = rows(&t.outcomes).into();
            out["sccs_covariate_entries"] = rows(&t.covariates).into();
            out["sccs_output_bytes"] = bytes(&t).into();
            out["rss_after_sccs_bytes"] = epifusion::bench::peak_rss_bytes().into();
            if !a.fit {
                drop(t);
            } else {
            let fit = datafusion::datasource::MemTable::try_new(
                t.outcomes[0].schema(),
                vec![t.outcomes.clone()],
            )?;
            ctx.register_table("bench_intervals", std::sync::Arc::new(fit))?;
            let cov = datafusion::datasource::MemTable::try_new(
                t.covariates[0].schema(),
                vec![t.covariates.clone()],
            )?;
            ctx.register_table("bench_covariates", std::sync::Arc::new(cov))?;
            let r = ctx
                .sql("SELECT covariate_id, exp_estimate FROM sccs_fit('bench_intervals', 'bench_covariates', '{\"ci\": \"none\"}') WHERE covariate_id = 1000")
                .await?
                .collect()
                .await?;
            let ri = r.first().and_then(|b| {
                b.column(1)
                    .as_any()
                    .downcast_ref::<datafusion::arrow::array::Float64Array>()
                    .map(|a| a.value(0))
            });
            out["sccs_ri_drug1"] = ri.into();
            out["sccs_true_ri"] = synth::TRUE_RI.into();
            }
        }
        if a.design != "sccs" {
            let d = study::CohortDesign::from_json(&format!(
                r#"{{"target": {{"concept_ids": [{}]}}, "comparator": {{"concept_ids": [{}]}},
                    "outcome": {{"concept_ids": [{}]}}, "first_exposure_only": true,
                    "remove_duplicate_subjects": "remove_all", "washout_days": 180,
                    "risk_window_end": 365, "end_anchor": "cohort_start",
                    "competing": {{"death": true}}}}"#,
                synth::FIRST_DRUG,
                synth::FIRST_DRUG + 1,
                synth::OUTCOME_CONCEPT
            ))?;
            let t0 = Instant::now();
            let t = study::build_cohort(&ctx, &d).await?;
            out["cohort_seconds"] = t0.elapsed().as_secs_f64().into();
            out["cohort_rows"] = rows(&t.outcomes).into();
            out["cohort_covariate_entries"] = rows(&t.covariates).into();
            out["cohort_output_bytes"] = bytes(&t).into();
            out["rss_after_cohort_bytes"] = epifusion::bench::peak_rss_bytes().into();
        }
        Ok::<_, anyhow::Error>(())
    })?;
    out["peak_rss_bytes"] = epifusion::bench::peak_rss_bytes().into();
    println!("{}", serde_json::to_string_pretty(&out)?);
    Ok(())
}

/// `--design cm`: generate (or reuse) a confounded store, then the study step by step.
fn run_bench_cm(a: &BenchOmopArgs) -> Result<()> {
    use epifusion::engine::study::synth_cohort::{write_cohort_store, CohortStoreSettings};
    let dir = a.dir.clone().unwrap_or_else(|| {
        std::env::temp_dir().join(format!(
            "epifusion-cm-{}-{}-{}-{}",
            a.persons, a.seed, a.covariates, a.negative_controls
        ))
    });
    let started = Instant::now();
    let mut out = serde_json::json!({ "design": "cm", "persons": a.persons, "seed": a.seed,
        "covariate_vocabulary": a.covariates, "store": dir.display().to_string() });
    if !(a.reuse && dir.join("person.parquet").exists()) {
        let s = write_cohort_store(
            &dir,
            &CohortStoreSettings {
                persons: a.persons,
                seed: a.seed,
                covariates: a.covariates,
                negative_controls: a.negative_controls,
                ..Default::default()
            },
        )?;
        out["target"] = s.target.into();
        out["baseline_records"] = s.baseline_records.into();
        out["baseline_concepts"] = s.baseline_concepts.into();
        out["outcomes"] = s.outcomes.into();
        out["generate_seconds"] = started.elapsed().as_secs_f64().into();
    }
    out["rss_after_generate_bytes"] = epifusion::bench::peak_rss_bytes().into();
    super::bench_cm::bench_cm(&dir, a.cv_repetitions, a.ps_variance, &mut out)?;
    out["peak_rss_bytes"] = epifusion::bench::peak_rss_bytes().into();
    println!("{}", serde_json::to_string_pretty(&out)?);
    Ok(())
}
