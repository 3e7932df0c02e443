//! `epifusion bench-omop --design many`: many SCCS exposure–outcome pairs through the pipeline,
//! one unit per outcome (every drug against the outcome of interest and `--many-outcomes`
//! negative controls), against a sample of the same pairs run one pair per unit.
//!
//! Both runs are pipelines over the same store with the same settings (a 0–30-day risk window
//! after each era start, Wald intervals): the many-pairs run has one analysis (all drugs ×
//! outcome + negative controls, so one unit per outcome); the one-by-one run has one analysis
//! per sampled pair, each a unit of its own (the population, the outcome and the one exposure
//! read for that pair alone: what a unit was before the many-pairs design). Its time per pair,
//! times the number of pairs, is the one-by-one estimate. Every sampled pair's estimate must be
//! identical in both runs (checked, reported as `sampled_pairs_identical`).

use super::*;

fn concept_sets(drugs: usize, extra: usize) -> String {
    use epifusion::engine::study::synth;
    let mut s = String::new();
    for k in 0..drugs {
        s.push_str(&format!(
            "[concept_sets.drug_{k}]\nsql = \"SELECT person_id, drug_era_start_date AS start_date, drug_era_end_date AS end_date FROM drug_era WHERE drug_concept_id = {}\"\n",
            synth::FIRST_DRUG + k as i64
        ));
    }
    for j in 0..=extra {
        s.push_str(&format!(
            "[concept_sets.outcome_{j}]\nsql = \"SELECT person_id, condition_start_date AS start_date, condition_start_date AS end_date FROM condition_occurrence WHERE condition_concept_id = {}\"\n",
            synth::OUTCOME_CONCEPT + j as i64
        ));
    }
    s
}

const SETTINGS: &str = "[analysis.sccs]\n[[analysis.sccs.risk_windows]]\nstart = 0\nend = 30\nend_anchor = \"era_start\"\n[analysis.fit]\nci = \"wald\"\n";

fn list(names: impl Iterator<Item = String>) -> String {
    format!(
        "[{}]",
        names
            .map(|n| format!("\"{n}\""))
            .collect::<Vec<_>>()
            .join(", ")
    )
}

/// Run a pipeline file; seconds.
fn run_file(file: &Path, rt: &tokio::runtime::Runtime) -> Result<f64> {
    use epifusion::pipeline::{plan, progress::Progress, run};
    let p = plan::load(file, None, None)?;
    let t0 = Instant::now();
    rt.block_on(run::run(
        &p,
        run::RunOptions {
            dry_run: false,
            force: true,
            no_lock: false,
        },
        &Progress::quiet(),
    ))?;
    Ok(t0.elapsed().as_secs_f64())
}

/// The many-pairs benchmark on the store in `dir`; results into `out`.
pub(crate) fn bench_many(
    dir: &Path,
    drugs: usize,
    extra: usize,
    sample: usize,
    out: &mut serde_json::Value,
) -> Result<()> {
    let rt = runtime()?;
    let sets = concept_sets(drugs, extra);
    // Outputs beside the store (not inside it).
    let output = |tag: &str| {
        let mut o = dir.as_os_str().to_owned();
        o.push(format!("-{tag}"));
        PathBuf::from(o)
    };
    let (many_out, single_out) = (output("bench_many_out"), output("bench_single_out"));
    let pairs = drugs * (extra + 1);
    // Many pairs: one analysis, one unit per outcome.
    let many = dir.join("bench_many.toml");
    std::fs::write(
        &many,
        format!(
            "name = \"many pairs\"\nomop = \".\"\noutput = \"{}\"\n{sets}\n[[analysis]]\nname = \"many\"\ndesign = \"sccs\"\nexposures = {}\noutcomes = [\"outcome_0\"]\nnegative_controls = {}\n{SETTINGS}",
            many_out.display(),
            list((0..drugs).map(|k| format!("drug_{k}"))),
            list((1..=extra).map(|j| format!("outcome_{j}"))),
        ),
    )?;
    let many_seconds = run_file(&many, &rt)?;
    out["many_pairs"] = pairs.into();
    out["many_units"] = (extra + 1).into();
    out["many_seconds"] = many_seconds.into();
    out["many_models_per_second"] = (pairs as f64 / many_seconds).into();

    // A sample of the same pairs, one unit per pair.
    let step = (pairs / sample.max(1)).max(1);
    let sampled: Vec<(usize, usize)> = (0..pairs)
        .step_by(step)
        .take(sample)
        .map(|i| (i % drugs, i / drugs))
        .collect();
    let mut single = format!(
        "name = \"one by one\"\nomop = \".\"\noutput = \"{}\"\n{sets}\n",
        single_out.display()
    );
    for (k, j) in &sampled {
        single.push_str(&format!(
            "[[analysis]]\nname = \"pair_{k}_{j}\"\ndesign = \"sccs\"\nexposures = [\"drug_{k}\"]\noutcomes = [\"outcome_{j}\"]\n{SETTINGS}\n"
        ));
    }
    let single_file = dir.join("bench_single.toml");
    std::fs::write(&single_file, single)?;
    let single_seconds = run_file(&single_file, &rt)?;
    let per_pair = single_seconds / sampled.len() as f64;
    out["single_sampled_pairs"] = sampled.len().into();
    out["single_seconds"] = single_seconds.into();
    out["single_seconds_per_pair"] = per_pair.into();
    out["single_extrapolated_seconds"] = (per_pair * pairs as f64).into();
    out["single_models_per_second"] = (1.0 / per_pair).into();
    out["speedup"] = (per_pair * pairs as f64 / many_seconds).into();

    // The sampled pairs' estimates in both runs.
    let identical = rt.block_on(async {
        let ctx = datafusion::prelude::SessionContext::new();
        for (name, folder) in [("m", &many_out), ("s", &single_out)] {
            let m: serde_json::Value =
                serde_json::from_slice(&std::fs::read(folder.join("manifest.json"))?)?;
            for (t, key) in [("r", "sccs_result"), ("e", "sccs_exposures_outcome_set")] {
                let path = folder.join(m["results"][key]["path"].as_str().unwrap_or_default());
                ctx.register_parquet(
                    format!("{name}{t}"),
                    path.display().to_string(),
                    Default::default(),
                )
                .await?;
            }
        }
        let b = ctx
            .sql(
                "SELECT count(*) AS n, \
                 sum(CASE WHEN (mr.log_rr IS NOT DISTINCT FROM sr.log_rr) \
                      AND (mr.se_log_rr IS NOT DISTINCT FROM sr.se_log_rr) THEN 1 ELSE 0 END) AS same \
                 FROM sr JOIN se ON sr.analysis_id = se.analysis_id \
                   AND sr.exposures_outcome_set_id = se.exposures_outcome_set_id \
                 JOIN me ON me.exposure = se.exposure AND me.outcome = se.outcome \
                 JOIN mr ON mr.analysis_id = me.analysis_id \
                   AND mr.exposures_outcome_set_id = me.exposures_outcome_set_id \
                   AND mr.covariate_id = sr.covariate_id",
            )
            .await?
            .collect()
            .await?;
        let get = |c: usize| {
            datafusion::arrow::compute::cast(b[0].column(c), &datafusion::arrow::datatypes::DataType::Int64)
                .map(|a| {
                    a.as_any()
                        .downcast_ref::<datafusion::arrow::array::Int64Array>()
                        .map_or(0, |a| a.value(0))
                })
        };
        Ok::<_, anyhow::Error>((get(0)?, get(1)?))
    })?;
    out["sampled_pairs_compared"] = identical.0.into();
    out["sampled_pairs_identical"] = (identical.0 == identical.1 && identical.0 > 0).into();
    if identical.0 != identical.1 || identical.0 == 0 {
        bail!(
            "many-pairs estimates differ from the one-by-one run: {} of {} sampled pairs identical",
            identical.1,
            identical.0
        );
    }
    Ok(())
}
