//! `epifusion run`: a pipeline file.

use super::*;

#[derive(Args, Debug)]
pub(crate) struct RunArgs {
    /// Pipeline file (TOML), e.g. pipelines/gibleed.toml.
    pub(crate) file: PathBuf,
    /// OMOP store (folder or URL), overriding the file's `omop`.
    #[arg(long)]
    pub(crate) omop: Option<String>,
    /// Output folder or URL, overriding the file's `output`.
    #[arg(long)]
    pub(crate) output: Option<String>,
    /// Validate and print the plan (analyses, sizes, what would run); write nothing.
    #[arg(long)]
    pub(crate) dry_run: bool,
    /// Recompute analyses that are already complete. New results go to new run-scoped
    /// objects; the run manifest switches to them last (a stopped run leaves the old results).
    #[arg(long)]
    pub(crate) force: bool,
    /// Run without locking the output (only for object stores without conditional writes,
    /// where a run is otherwise refused). A lock held by a running run still stops the run; a
    /// concurrent run without a lock is not detected.
    #[arg(long)]
    pub(crate) no_lock: bool,
    /// Build and fit each analysis unit on a Ballista cluster (`df://HOST:PORT`, the scheduler
    /// of `epifusion scheduler`): the OMOP store must be a path every node can read or an
    /// object-store URL; this process checks the store and writes the output.
    #[arg(long)]
    pub(crate) cluster: Option<String>,
    /// With --cluster: analysis units on the cluster at once (each one job on one executor;
    /// results are written in file order).
    #[arg(long, default_value_t = epifusion::pipeline::remote::UNITS_IN_FLIGHT)]
    pub(crate) cluster_units: usize,
}

pub(crate) fn run_pipeline(a: &RunArgs) -> Result<()> {
    use epifusion::pipeline::{plan, progress::Progress, run};
    let pipeline = plan::load(&a.file, a.omop.as_deref(), a.output.as_deref())?;
    let opts = run::RunOptions {
        dry_run: a.dry_run,
        force: a.force,
        no_lock: a.no_lock,
    };
    let progress = Progress::new(pipeline.analyses.len());
    if a.cluster_units == 0 {
        bail!("--cluster-units must be at least 1");
    }
    let rt = runtime()?;
    let summary = rt.block_on(async {
        let cluster = match &a.cluster {
            Some(url) if !a.dry_run => Some(
                epifusion::cluster::cluster_session(
                    url,
                    &epifusion::engine::session::SessionOptions {
                        omop: Some(pipeline.omop.clone()),
                        batch_size: None,
                    },
                )
                .await
                .with_context(|| format!("cannot open the cluster {url}"))?,
            ),
            _ => None,
        };
        let cluster = cluster.as_ref().map(|c| (c, a.cluster_units));
        anyhow::Ok(run::run_on(&pipeline, opts, &progress, cluster).await?)
    })?;
    if a.dry_run {
        println!(
            "pipeline {} ({}): OMOP {} → {}",
            pipeline.name,
            a.file.display(),
            pipeline.omop,
            pipeline.output
        );
        println!(
            "{:<48} {:<7} {:<10} {:>12} {:>12}  action",
            "analysis", "design", "model", "outcome rows", "covariates"
        );
        let n = |v: Option<usize>| v.map_or("–".to_string(), |v| v.to_string());
        for r in &summary.plan {
            println!(
                "{:<48} {:<7} {:<10} {:>12} {:>12}  {}",
                r.id,
                r.design,
                r.model,
                n(r.outcome_rows),
                n(r.covariate_entries),
                r.action
            );
        }
        if let Some(lock) = &summary.lock {
            println!("lock: {lock}");
        }
        println!("dry run: valid; nothing was written");
        return Ok(());
    }
    println!(
        "run {} complete: {} analyses ({} computed, {} skipped as complete)",
        summary.run_id,
        summary.computed.len() + summary.skipped.len(),
        summary.computed.len(),
        summary.skipped.len()
    );
    if let Some(m) = &summary.manifest {
        println!("manifest: {m}");
    }
    if let Some(r) = &summary.report {
        println!("report: {r}");
    }
    if !summary.warnings.is_empty() {
        println!("{} warnings (also in the report):", summary.warnings.len());
        for w in &summary.warnings {
            println!("  warning: {w}");
        }
    }
    Ok(())
}
