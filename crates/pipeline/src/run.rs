//! The runner: validate everything, then for each analysis unit either skip it (complete and
//! unchanged) or build its tables, fit, and write its results and manifest; finally the report
//! and the run manifest.
//!
//! **Resume rule.** A unit is complete when `analyses/<id>/manifest.json` exists, says
//! `complete`, has the unit's current fingerprint (see [`super::plan::fingerprint`]) and every
//! object it lists is present with the recorded size and e-tag. Complete units are skipped
//! unless `--force`, which writes new run-scoped objects: the run manifest, written last in one
//! PUT, is the switch, and what it no longer points to is deleted only after it (see
//! [`super::output`]). The whole run holds the output's lock ([`super::lock`]). A unit whose data or fit fails is reported and the others still run; the
//! run is then incomplete (exit status 1, no new run manifest). A failure of the output store
//! (after the retries of [`epifusion_sql::store::retry_config`]) stops the run at once.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use datafusion::arrow::array::{Array, ArrayRef, AsArray, StringArray};
use datafusion::arrow::compute::cast;
use datafusion::arrow::datatypes::{DataType, Field, Int64Type, Schema};
use datafusion::arrow::record_batch::RecordBatch;
use datafusion::common::{exec_datafusion_err, Result as DfResult, ScalarValue};
use datafusion::datasource::MemTable;
use datafusion::prelude::SessionContext;
use parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder;
use parquet::arrow::ArrowWriter;
use serde::{Deserialize, Serialize};

use super::lock::OutputLock;
use super::output::{ObjectRef, Output};
use super::plan::{self, Analysis, Design, Pipeline};
use super::progress::Progress;
use super::report::{self, ForestRow, Report, ReportAnalysis};
use super::tables::{self, StudyTables};
use super::PipelineError;
use epifusion_core::model::ModelKind;
use epifusion_sql::session::{new_session, SessionOptions};

/// Options of `epifusion run`.
#[derive(Debug, Clone, Copy, Default)]
pub struct RunOptions {
    /// Validate and print the plan; write nothing.
    pub dry_run: bool,
    /// Recompute complete analyses too.
    pub force: bool,
    /// Take no lock on the output (for stores without conditional writes; see [`super::lock`]).
    pub no_lock: bool,
}

/// The manifest of one analysis unit (`analyses/<id>/manifest.json`).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct AnalysisManifest {
    /// `epifusion-analysis/1`.
    pub format: String,
    /// `complete`.
    pub status: String,
    /// Unit id.
    pub analysis_id: String,
    /// Analysis name.
    pub name: String,
    /// Design.
    pub design: String,
    /// Model.
    pub model: String,
    /// Role → concept set.
    pub roles: BTreeMap<String, String>,
    /// Fingerprint of the unit's definition.
    pub fingerprint: String,
    /// The run that computed it.
    pub run_id: String,
    /// When it was completed (UTC).
    pub completed_at: String,
    /// Result objects by table name.
    pub objects: BTreeMap<String, ObjectRef>,
    /// Fit status, sizes and timings.
    pub summary: serde_json::Value,
}

/// One analysis in the run manifest.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct RunEntry {
    /// Unit id.
    pub id: String,
    /// Its manifest.
    pub manifest: ObjectRef,
    /// The run that computed it.
    pub run_id: String,
    /// Whether this run skipped it as complete.
    pub skipped: bool,
}

/// The run manifest (`manifest.json`), written last.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct RunManifest {
    /// `epifusion-run/1`.
    pub format: String,
    /// `complete`.
    pub status: String,
    /// Pipeline name.
    pub pipeline: String,
    /// Pipeline file as given.
    pub pipeline_file: String,
    /// Hash of the pipeline file's text.
    pub pipeline_hash: String,
    /// Run id.
    pub run_id: String,
    /// Start (UTC).
    pub started_at: String,
    /// End (UTC).
    pub finished_at: String,
    /// Wall seconds.
    pub seconds: f64,
    /// Source store.
    pub omop: String,
    /// Output location.
    pub output: String,
    /// Software versions.
    pub versions: BTreeMap<String, String>,
    /// Every analysis of the pipeline.
    pub analyses: Vec<RunEntry>,
    /// The report.
    pub report: ObjectRef,
    /// Run-level result tables (the SCCS results data model, [`crate::sccs_results`]; the
    /// calibrated cohort results, [`crate::cohort_calibration`]), by name.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub results: BTreeMap<String, ObjectRef>,
}

/// What a dry run would do with one unit.
#[derive(Debug, Clone)]
pub struct PlanRow {
    /// Unit id.
    pub id: String,
    /// Design.
    pub design: String,
    /// Model.
    pub model: String,
    /// `run`, `skip (complete, run …)`, `rerun (--force)`, `rerun (changed)`.
    pub action: String,
    /// Rows of the outcome table (SQL designs).
    pub outcome_rows: Option<usize>,
    /// Covariate entries (SQL designs).
    pub covariate_entries: Option<usize>,
}

/// What a run did.
#[derive(Debug, Clone, Default)]
pub struct RunSummary {
    /// Run id (empty for a dry run).
    pub run_id: String,
    /// Units computed.
    pub computed: Vec<String>,
    /// Units skipped as complete.
    pub skipped: Vec<String>,
    /// The plan (dry run).
    pub plan: Vec<PlanRow>,
    /// Where the report is.
    pub report: Option<String>,
    /// Where the run manifest is.
    pub manifest: Option<String>,
    /// Warnings (also logged and, for the analyses, shown in the report).
    pub warnings: Vec<String>,
    /// Dry run: who holds the output's lock, when someone does.
    pub lock: Option<String>,
}

/// Software versions recorded with the results.
pub fn versions() -> BTreeMap<String, String> {
    BTreeMap::from([
        (
            "epifusion".to_string(),
            env!("CARGO_PKG_VERSION").to_string(),
        ),
        (
            "datafusion".to_string(),
            datafusion::DATAFUSION_VERSION.to_string(),
        ),
        (
            "parquet".to_string(),
            parquet::file::properties::DEFAULT_CREATED_BY.to_string(),
        ),
    ])
}

/// (year, month, day) of a day number since 1970-01-01 (proleptic Gregorian).
fn civil_from_days(days: i64) -> (i64, u32, u32) {
    let z = days + 719_468;
    let era = (if z >= 0 { z } else { z - 146_096 }) / 146_097;
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let m = (if mp < 10 { mp + 3 } else { mp - 9 }) as u32;
    let y = yoe + era * 400 + i64::from(m <= 2);
    (y, m, d)
}

/// `2026-11-21T10:15:00Z` for `t`.
pub fn utc_string(t: SystemTime) -> String {
    let s = t.duration_since(UNIX_EPOCH).unwrap_or_default().as_secs() as i64;
    let (y, m, d) = civil_from_days(s.div_euclid(86_400));
    let r = s.rem_euclid(86_400);
    format!(
        "{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}Z",
        r / 3600,
        r % 3600 / 60,
        r % 60
    )
}

fn run_id(t: SystemTime) -> String {
    let s = utc_string(t).replace(['-', ':'], "");
    format!("{s}-{}", std::process::id())
}

pub(crate) fn analysis_err(a: &Analysis, e: impl std::fmt::Display) -> PipelineError {
    PipelineError::Analysis {
        analysis: a.id.clone(),
        message: e.to_string(),
    }
}

/// The complete, unchanged manifest of `a` (and its bytes), if there is one.
async fn complete_manifest(
    out: &Output,
    a: &Analysis,
) -> Result<Option<(AnalysisManifest, bytes::Bytes)>, PipelineError> {
    let rel = format!("analyses/{}/manifest.json", a.id);
    let Some(bytes) = out.get(&rel).await? else {
        return Ok(None);
    };
    let Ok(m) = serde_json::from_slice::<AnalysisManifest>(&bytes) else {
        return Ok(None);
    };
    if m.status != "complete" || m.fingerprint != a.fingerprint || m.analysis_id != a.id {
        return Ok(None);
    }
    for o in m.objects.values() {
        if !out.verify(o).await? {
            return Ok(None);
        }
    }
    Ok(Some((m, bytes)))
}

/// `analyses/<id>/<run_id>/manifest.json`: the run-scoped copy of a unit's manifest, which run
/// manifests point to (the unit's `analyses/<id>/manifest.json` is replaced by later runs).
fn run_manifest_path(id: &str, run_id: &str) -> String {
    format!("analyses/{id}/{run_id}/manifest.json")
}

/// The run-scoped manifest of a complete unit, written when missing (results written by
/// versions that kept only `analyses/<id>/manifest.json`).
async fn run_scoped_manifest(
    out: &Output,
    m: &AnalysisManifest,
    bytes: &bytes::Bytes,
) -> Result<ObjectRef, PipelineError> {
    let want = ObjectRef {
        path: run_manifest_path(&m.analysis_id, &m.run_id),
        size: bytes.len() as u64,
        e_tag: None,
    };
    if out.verify(&want).await? {
        return Ok(want);
    }
    out.put(&want.path, bytes.to_vec()).await
}

/// Whether the output holds results of `a` that are not complete-and-current.
async fn has_stale_results(out: &Output, a: &Analysis) -> Result<bool, PipelineError> {
    Ok(out
        .get(&format!("analyses/{}/manifest.json", a.id))
        .await?
        .is_some())
}

/// Run (or, with `dry_run`, plan) the pipeline.
pub async fn run(
    p: &Pipeline,
    opts: RunOptions,
    progress: &Progress,
) -> Result<RunSummary, PipelineError> {
    run_on(p, opts, progress, None).await
}

/// [`run`], with each unit's build and fit on the cluster of the session `cluster` when given
/// (a Ballista client session holding the store's tables, and the number of units sent at once:
/// [`crate::remote`]). The client still checks the store and writes the output.
pub async fn run_on(
    p: &Pipeline,
    opts: RunOptions,
    progress: &Progress,
    cluster: Option<(&SessionContext, usize)>,
) -> Result<RunSummary, PipelineError> {
    let started = SystemTime::now();
    let clock = Instant::now();
    for a in &p.analyses {
        if !tables::design_available(a.design.kind()) {
            return Err(p.source.error(
                a.span.clone(),
                format!("analysis `{}`: design", a.name),
                format!(
                    "design `{}` is not available in this build",
                    a.design.kind().name()
                ),
            ));
        }
        // The design settings were checked when the file was loaded (plan::check_design).
    }
    progress.step(&format!("opening the OMOP store {}", p.omop));
    let ctx = new_session(&SessionOptions {
        omop: Some(p.omop.clone()),
        batch_size: None,
    })
    .await
    .map_err(|e| PipelineError::Source {
        location: p.omop.clone(),
        message: e
            .to_string()
            .trim_start_matches("Error during planning: ")
            .to_string(),
    })?;
    progress.step("checking tables, concepts and queries");
    plan::check_store(&ctx, p).await?;
    let out = Output::open(&p.output, opts.dry_run)?;

    if opts.dry_run {
        let mut done = Vec::new();
        for a in &p.analyses {
            done.push(complete_manifest(&out, a).await?);
        }
        let lock = OutputLock::read(&out)
            .await
            .ok()
            .flatten()
            .map(|(held, _)| match held.stale_reason() {
                Some(reason) => format!(
                    "{} holds a stale lock ({reason}); a run takes it over",
                    held.holder()
                ),
                None => format!(
                    "{} holds the lock {}; a run now would stop",
                    held.holder(),
                    out.display(super::lock::LOCK_NAME)
                ),
            });
        let mut plan_rows = Vec::new();
        for (a, d) in p.analyses.iter().zip(&done) {
            let stale = d.is_none() && has_stale_results(&out, a).await?;
            let action = match (d, opts.force) {
                (Some((m, _)), false) => format!("skip (complete, run {})", m.run_id),
                (Some(_), true) => "rerun (--force)".into(),
                (None, _) if stale => "rerun (changed or incomplete)".into(),
                (None, _) => "run".into(),
            };
            let (rows, covs) = sizes(&ctx, p, a).await?;
            plan_rows.push(PlanRow {
                id: a.id.clone(),
                design: a.design.kind().name().into(),
                model: a.model.name().into(),
                action,
                outcome_rows: rows,
                covariate_entries: covs,
            });
        }
        progress.finish();
        return Ok(RunSummary {
            plan: plan_rows,
            lock,
            ..Default::default()
        });
    }

    // The lock, before any analysis work (taking it also shows that the output is writable);
    // released at the end whatever happens (a killed run leaves it stale: see `lock`).
    let run = run_id(started);
    let lock = OutputLock::acquire(&out, &run, &p.source.name, opts.no_lock, progress).await?;
    let result = run_locked(
        &ctx, p, opts, progress, &out, &lock, &run, started, clock, cluster,
    )
    .await;
    let display = lock.display.clone();
    match (lock.release(&out).await, result) {
        (Ok(()), result) => result,
        (Err(e), Ok(mut summary)) => {
            let w = format!("the lock {display} was not removed ({e}); remove it by hand");
            progress.log(&format!("warning: {w}"));
            summary.warnings.push(w);
            Ok(summary)
        }
        (Err(e), Err(run_error)) => {
            progress.log(&format!(
                "warning: the lock {display} was not removed ({e}); the next run on this host \
                 takes it over, elsewhere remove it by hand"
            ));
            Err(run_error)
        }
    }
}

/// The run proper, under the output's lock.
#[allow(clippy::too_many_arguments)]
async fn run_locked(
    ctx: &SessionContext,
    p: &Pipeline,
    opts: RunOptions,
    progress: &Progress,
    out: &Output,
    lock: &OutputLock,
    run: &str,
    started: SystemTime,
    clock: Instant,
    cluster: Option<(&SessionContext, usize)>,
) -> Result<RunSummary, PipelineError> {
    let mut done = Vec::new();
    for a in &p.analyses {
        done.push(complete_manifest(out, a).await?);
    }
    let run = run.to_string();
    let n = p.analyses.len();
    // On a cluster the units to compute are sent ahead, in the order the loop below takes them;
    // the concept sets' views (defined in `ctx` by the store check) go with them.
    if let Some((session, _)) = cluster {
        crate::remote::share_views(ctx, session, p).await?;
    }
    let mut remote = cluster.map(|(session, in_flight)| {
        let todo = p
            .analyses
            .iter()
            .zip(&done)
            .enumerate()
            .filter(|(_, (_, d))| d.is_none() || opts.force)
            .map(|(i, (a, _))| (a.clone(), format!("[{}/{n}] {}", i + 1, a.id)))
            .collect();
        crate::remote::RemoteUnits::new(session, p, todo, in_flight)
    });
    let mut summary = RunSummary {
        run_id: run.clone(),
        ..Default::default()
    };
    let mut entries = Vec::new();
    let mut failures = Vec::new();
    let ps_cache = super::cohort_adjust::PsCache::new();
    // The SCCS units of one analysis (one per outcome) share its exposures' eras.
    let era_cache = epifusion_sql::study::ExposureEraCache::new();
    let pause = std::env::var("EPIFUSION_TEST_PAUSE_MS")
        .ok()
        .and_then(|v| v.parse::<u64>().ok());
    progress.log(&format!(
        "run {run}: {n} analyses, OMOP {} → {}",
        p.omop, p.output
    ));
    for (i, (a, d)) in p.analyses.iter().zip(done).enumerate() {
        let tag = format!("[{}/{n}] {}", i + 1, a.id);
        if let (Some((m, bytes)), false) = (d, opts.force) {
            let mref = run_scoped_manifest(out, &m, &bytes).await?;
            progress.log(&format!("{tag}: skipped (complete, run {})", m.run_id));
            entries.push(RunEntry {
                id: a.id.clone(),
                manifest: mref,
                run_id: m.run_id.clone(),
                skipped: true,
            });
            summary.skipped.push(a.id.clone());
            progress.advance();
            continue;
        }
        match run_unit(
            ctx,
            p,
            a,
            out,
            &run,
            &tag,
            progress,
            &ps_cache,
            &era_cache,
            remote.as_mut(),
        )
        .await
        {
            Ok((m, mref)) => {
                progress.log(&format!(
                    "{tag}: complete ({}, {:.1} s)",
                    m.summary["status"].as_str().unwrap_or("?"),
                    m.summary["seconds"].as_f64().unwrap_or(0.0)
                ));
                entries.push(RunEntry {
                    id: a.id.clone(),
                    manifest: mref,
                    run_id: run.clone(),
                    skipped: false,
                });
                summary.computed.push(a.id.clone());
            }
            Err(e @ PipelineError::Output { .. }) => {
                progress.finish();
                return Err(PipelineError::Output {
                    location: p.output.clone(),
                    message: format!(
                        "{tag}: {e}; the run stopped and is not complete (analyses without a \
                         manifest were not written; rerun to resume)"
                    ),
                });
            }
            Err(e) => {
                progress.log(&format!("{tag}: FAILED: {e}"));
                failures.push(format!("  {}: {e}", a.id));
            }
        }
        progress.advance();
        if let Some(ms) = pause {
            progress.log(&format!("{tag}: pausing {ms} ms (EPIFUSION_TEST_PAUSE_MS)"));
            tokio::time::sleep(Duration::from_millis(ms)).await;
        }
    }
    if !failures.is_empty() {
        progress.finish();
        return Err(PipelineError::Incomplete {
            failed: failures.len(),
            total: n,
            details: failures.join("\n"),
        });
    }

    // SCCS results across units (calibration needs every negative control's unit).
    let mut sccs_units = Vec::new();
    for (a, e) in p.analyses.iter().zip(&entries) {
        if a.exposures.is_empty() {
            continue;
        }
        if let Some(m) = out.get_json::<AnalysisManifest>(&e.manifest.path).await? {
            sccs_units.push((a, m));
        }
    }
    progress.step("writing the SCCS results tables");
    let sccs = crate::sccs_results::write(ctx, p, out, &sccs_units, &run).await?;
    for w in &sccs.warnings {
        progress.log(&format!("warning: {w}"));
        summary.warnings.push(w.clone());
    }

    // Cohort analyses with negative controls: the calibrated run-level cm_result.
    let mut cohort_units = Vec::new();
    for (a, e) in p.analyses.iter().zip(&entries) {
        if !matches!(a.design, Design::Cohort(_)) {
            continue;
        }
        if let Some(m) = out.get_json::<AnalysisManifest>(&e.manifest.path).await? {
            cohort_units.push((a, m));
        }
    }
    progress.step("calibrating the cohort analyses");
    let cm = crate::cohort_calibration::write(ctx, p, out, &cohort_units, &run).await?;
    for w in &cm.warnings {
        progress.log(&format!("warning: {w}"));
        summary.warnings.push(w.clone());
    }
    let mut results = sccs.objects;
    results.extend(cm.objects);

    // The report, then the run manifest (last), then the convenience copy of the report.
    progress.step("writing the report");
    let finished = SystemTime::now();
    let mut manifest = RunManifest {
        format: "epifusion-run/1".into(),
        status: "complete".into(),
        pipeline: p.name.clone(),
        pipeline_file: p.source.name.clone(),
        pipeline_hash: format!("{:016x}", plan::fnv1a(p.source.text.as_bytes())),
        run_id: run.clone(),
        started_at: utc_string(started),
        finished_at: utc_string(finished),
        seconds: clock.elapsed().as_secs_f64(),
        omop: p.omop.clone(),
        output: p.output.clone(),
        versions: versions(),
        analyses: entries,
        report: ObjectRef {
            path: String::new(),
            size: 0,
            e_tag: None,
        },
        results,
    };
    let mut report = build_report(p, out, &manifest).await?;
    report.extra_sections = sccs.sections;
    report.extra_sections.extend(cm.sections);
    for w in report.analyses.iter().flat_map(|a| &a.warnings) {
        progress.log(&format!("warning: {w}"));
        summary.warnings.push(w.clone());
    }
    let html = report::render(&report);
    let report_rel = format!("runs/{run}/report.html");
    manifest.report = out.put(&report_rel, html.clone().into_bytes()).await?;
    // The switch: the new run manifest replaces the old one in one PUT, and only if this run
    // still holds the lock. Until here, nothing the old manifest points to was touched.
    lock.check_held(out).await?;
    out.put_json("manifest.json", &manifest).await?;
    out.put("report.html", html.into_bytes()).await?;
    collect_garbage(out, p, &manifest, progress).await;
    progress.finish();
    summary.report = Some(out.display(&report_rel));
    summary.manifest = Some(out.display("manifest.json"));
    Ok(summary)
}

/// Delete, under each unit's folder, what the new run manifest does not point to: results of
/// earlier runs and leftovers of failed or killed ones. Only after the new run manifest is in
/// place, so that a run stopped at any point leaves the previous manifest's objects intact.
/// Failures are warnings (the results are complete; the next run tries again).
async fn collect_garbage(out: &Output, p: &Pipeline, manifest: &RunManifest, progress: &Progress) {
    for (a, entry) in p.analyses.iter().zip(&manifest.analyses) {
        let m = match out.get_json::<AnalysisManifest>(&entry.manifest.path).await {
            Ok(Some(m)) => m,
            _ => continue,
        };
        let mut keep: std::collections::BTreeSet<String> =
            m.objects.values().map(|o| o.path.clone()).collect();
        keep.insert(entry.manifest.path.clone());
        keep.insert(format!("analyses/{}/manifest.json", a.id));
        let all = match out.list(&format!("analyses/{}/", a.id)).await {
            Ok(all) => all,
            Err(e) => {
                progress.log(&format!("warning: {e}"));
                continue;
            }
        };
        for path in all.iter().filter(|path| !keep.contains(*path)) {
            if let Err(e) = out.delete(path).await {
                progress.log(&format!("warning: {e}"));
            }
        }
    }
}

/// Outcome rows and covariate entries of a SQL unit (dry run).
async fn sizes(
    ctx: &SessionContext,
    p: &Pipeline,
    a: &Analysis,
) -> Result<(Option<usize>, Option<usize>), PipelineError> {
    let Design::Sql(q) = &a.design else {
        return Ok((None, None));
    };
    plan::run_setup(ctx, q, &p.source).await?;
    let count = |sql: String| async move {
        ctx.sql(&sql)
            .await?
            .count()
            .await
            .map_err(|e| analysis_err(a, e))
    };
    let rows = count(q.outcomes.value.clone()).await?;
    let covs = match &q.covariates {
        Some(c) => Some(count(c.value.clone()).await?),
        None => None,
    };
    Ok((Some(rows), covs))
}

/// Build, fit and write one unit; returns its manifest.
#[allow(clippy::too_many_arguments)] // the run's shared state (output, progress, caches), one argument each
async fn run_unit(
    ctx: &SessionContext,
    p: &Pipeline,
    a: &Analysis,
    out: &Output,
    run: &str,
    tag: &str,
    progress: &Progress,
    ps_cache: &super::cohort_adjust::PsCache,
    era_cache: &epifusion_sql::study::ExposureEraCache,
    remote: Option<&mut crate::remote::RemoteUnits>,
) -> Result<(AnalysisManifest, ObjectRef), PipelineError> {
    let started = SystemTime::now();
    let t0 = Instant::now();
    let staged = match remote {
        Some(remote) => {
            progress.step(&format!("{tag}: building and fitting on the cluster"));
            remote.next(a).await?
        }
        None => {
            stage(
                ctx,
                p,
                a,
                tag,
                progress,
                ps_cache,
                era_cache,
                Prebuilt::default(),
            )
            .await?
        }
    };
    let Staged {
        fitted,
        diagnostics,
        status,
        rows,
        build_seconds,
        fit_seconds,
        extra,
    } = staged;
    let metadata = one_row(&[
        ("analysis_id", utf8(&a.id)),
        ("run_id", utf8(run)),
        ("pipeline", utf8(&p.name)),
        ("pipeline_file", utf8(&p.source.name)),
        ("omop", utf8(&p.omop)),
        ("design", utf8(a.design.kind().name())),
        ("model", utf8(a.model.name())),
        (
            "roles",
            utf8(&serde_json::to_string(&a.roles).unwrap_or_default()),
        ),
        ("fit_options", utf8(&a.fit_options.to_string())),
        ("fingerprint", utf8(&a.fingerprint)),
        (
            "versions",
            utf8(&serde_json::to_string(&versions()).unwrap_or_default()),
        ),
        ("started_at", utf8(&utc_string(started))),
        ("build_seconds", ScalarValue::Float64(Some(build_seconds))),
        ("fit_seconds", ScalarValue::Float64(Some(fit_seconds))),
    ])
    .map_err(|e| analysis_err(a, e))?;

    progress.step(&format!("{tag}: writing results"));
    let t2 = Instant::now();
    let mut tables_out: Vec<(String, Vec<RecordBatch>)> = vec![
        ("estimates".into(), fitted.estimates),
        ("attrition".into(), fitted.attrition),
        ("covariate_ref".into(), fitted.covariate_ref),
        ("diagnostics".into(), diagnostics),
        ("metadata".into(), vec![metadata]),
    ];
    tables_out.extend(extra);
    let mut objects = BTreeMap::new();
    for (name, batches) in tables_out {
        let bytes = parquet_bytes(&batches).map_err(|e| analysis_err(a, e))?;
        let rel = format!("analyses/{}/{run}/{name}.parquet", a.id);
        objects.insert(name.to_string(), out.put(&rel, bytes).await?);
    }
    let mut roles: BTreeMap<String, String> = a
        .roles
        .iter()
        .map(|(r, s)| (r.to_string(), s.clone()))
        .collect();
    if !a.exposures.is_empty() {
        roles.insert("exposures".into(), a.exposures.join(","));
    }
    let manifest = AnalysisManifest {
        format: "epifusion-analysis/1".into(),
        status: "complete".into(),
        analysis_id: a.id.clone(),
        name: a.name.clone(),
        design: a.design.kind().name().into(),
        model: a.model.name().into(),
        roles,
        fingerprint: a.fingerprint.clone(),
        run_id: run.to_string(),
        completed_at: utc_string(SystemTime::now()),
        objects,
        summary: serde_json::json!({
            "status": status.to_string(),
            "outcome_rows": rows,
            "build_seconds": build_seconds,
            "fit_seconds": fit_seconds,
            "write_seconds": t2.elapsed().as_secs_f64(),
            "seconds": t0.elapsed().as_secs_f64(),
        }),
    };
    // The run-scoped manifest (what run manifests point to), then the unit's manifest (what the
    // next run resumes from). Earlier results stay until a run manifest no longer needs them.
    let bytes = serde_json::to_vec_pretty(&manifest).map_err(|e| analysis_err(a, e))?;
    let mref = out
        .put(&run_manifest_path(&a.id, run), bytes.clone())
        .await?;
    out.put(&format!("analyses/{}/manifest.json", a.id), bytes)
        .await?;
    Ok((manifest, mref))
}

/// What building and fitting a unit gives, before it is written.
#[derive(Clone)]
pub(crate) struct Staged {
    pub(crate) fitted: Fitted,
    pub(crate) diagnostics: Vec<RecordBatch>,
    pub(crate) status: ScalarValue,
    pub(crate) rows: usize,
    pub(crate) build_seconds: f64,
    pub(crate) fit_seconds: f64,
    /// More tables of the unit, by name (written beside the others).
    pub(crate) extra: Vec<(String, Vec<RecordBatch>)>,
}

/// What a unit's build reads that was computed before the unit ran (on a cluster, by the
/// distributed queries of [`crate::remote`]); each part absent is built by the unit itself.
#[derive(Default)]
pub(crate) struct Prebuilt {
    /// The study tables of a unit of one fit.
    pub(crate) tables: Option<StudyTables>,
    /// The case data of an SCCS unit of one outcome over several exposures.
    pub(crate) sccs_cases: Option<PrebuiltCases>,
    /// The propensity-score population's tables of a cohort unit with `[cohort.ps]`.
    pub(crate) ps: Option<StudyTables>,
}

/// The case data of an SCCS unit of one outcome over several exposures, built elsewhere.
pub(crate) enum PrebuiltCases {
    /// Shared by the exposures (their eras in the cases).
    Shared(Box<epifusion_sql::study::sccs::SccsCases>),
    /// With `restrict_time_to_exposure`: each exposure's own population, in the order of the
    /// unit's exposures.
    EachExposure(Vec<epifusion_sql::study::sccs::SccsCases>),
}

/// Build and fit the unit `a` in `ctx` (a unit of one fit, or of one outcome over several
/// exposures), from what `prebuilt` holds and the store.
#[allow(clippy::too_many_arguments)]
pub(crate) async fn stage(
    ctx: &SessionContext,
    p: &Pipeline,
    a: &Analysis,
    tag: &str,
    progress: &Progress,
    ps_cache: &super::cohort_adjust::PsCache,
    era_cache: &epifusion_sql::study::ExposureEraCache,
    prebuilt: Prebuilt,
) -> Result<Staged, PipelineError> {
    if a.exposures.is_empty() {
        single_stage(ctx, p, a, tag, progress, ps_cache, prebuilt).await
    } else {
        crate::many::outcome_stage(ctx, a, tag, progress, era_cache, prebuilt.sccs_cases).await
    }
}

/// Build and fit a unit of one fit.
async fn single_stage(
    ctx: &SessionContext,
    p: &Pipeline,
    a: &Analysis,
    tag: &str,
    progress: &Progress,
    ps_cache: &super::cohort_adjust::PsCache,
    prebuilt: Prebuilt,
) -> Result<Staged, PipelineError> {
    let t0 = Instant::now();
    progress.step(&format!("{tag}: building the study tables"));
    let mut t = match prebuilt.tables {
        Some(t) => t,
        None => {
            if let Design::Sql(q) = &a.design {
                plan::run_setup(ctx, q, &p.source).await?;
            }
            tables::build_tables(ctx, a)
                .await
                .map_err(|e| analysis_err(a, e))?
        }
    };
    // Cohort designs with [analysis.cohort.ps] / [analysis.cohort.adjustment].
    progress.step(&format!("{tag}: propensity scores and adjustment"));
    let adjusted = super::cohort_adjust::adjust(ctx, a, &mut t, ps_cache, prebuilt.ps)
        .await
        .map_err(|e| analysis_err(a, e))?;
    if let Some(adj) = &adjusted {
        progress.log(&format!(
            "{tag}: propensity model on {} subjects ({} non-zero coefficients, variance {:.4}): \
             population {:.2} s, fit {:.2} s (shared by the analysis' outcomes); matching, balance \
             and diagnostics {:.2} s",
            adj.shared.row_ids.len(),
            adj.shared.fit.coefficients.len(),
            adj.shared.fit.variance,
            adj.shared.build_seconds,
            adj.shared.fit_seconds,
            adj.seconds
        ));
    }
    let build_seconds = t0.elapsed().as_secs_f64();
    let rows: usize = t.outcomes.iter().map(RecordBatch::num_rows).sum();
    progress.step(&format!("{tag}: fitting {} ({rows} rows)", a.model.name()));
    let t1 = Instant::now();
    let fitted = fit(ctx, a, &t).await.map_err(|e| analysis_err(a, e))?;
    let fit_seconds = t1.elapsed().as_secs_f64();

    let first = |name: &str| {
        fitted
            .estimates
            .first()
            .and_then(|b| b.column_by_name(name).cloned())
            .and_then(|c| ScalarValue::try_from_array(&c, 0).ok())
            .unwrap_or(ScalarValue::Null)
    };
    let (status, iterations, ll) = (
        first("status"),
        first("iterations"),
        first("log_likelihood"),
    );
    let mut diag = vec![
        ("analysis_id", utf8(&a.id)),
        ("model", utf8(a.model.name())),
    ];
    diag.extend(fitted.sizes.iter().map(|(k, v)| (k.as_str(), v.clone())));
    diag.extend([
        ("status", status.clone()),
        ("iterations", iterations),
        ("log_likelihood", ll),
        ("build_seconds", ScalarValue::Float64(Some(build_seconds))),
        ("fit_seconds", ScalarValue::Float64(Some(fit_seconds))),
    ]);
    let diagnostics = one_row(&diag).map_err(|e| analysis_err(a, e))?;
    let mut extra = Vec::new();
    if let Some(adj) = &adjusted {
        let (cm, note) = super::cohort_results::cm_outputs(ctx, p, a, adj, &t, &fitted.estimates)
            .await
            .map_err(|e| analysis_err(a, e))?;
        if let Some(note) = note {
            progress.log(&format!("{tag}: {note}"));
        }
        extra.extend(cm.into_iter().map(|(n, b)| (n.to_string(), vec![b])));
    }
    Ok(Staged {
        fitted,
        diagnostics: vec![diagnostics],
        status,
        rows,
        build_seconds,
        fit_seconds,
        extra,
    })
}

pub(crate) fn utf8(s: &str) -> ScalarValue {
    ScalarValue::Utf8(Some(s.to_string()))
}

/// A one-row batch from (column, value) pairs.
pub(crate) fn one_row(values: &[(&str, ScalarValue)]) -> DfResult<RecordBatch> {
    let arrays: Vec<ArrayRef> = values
        .iter()
        .map(|(_, v)| v.to_array())
        .collect::<DfResult<_>>()?;
    let fields: Vec<Field> = values
        .iter()
        .zip(&arrays)
        .map(|((k, _), a)| Field::new(*k, a.data_type().clone(), true))
        .collect();
    Ok(RecordBatch::try_new(Arc::new(Schema::new(fields)), arrays)?)
}

/// `batches` with `columns` (one value each, repeated) put in front.
pub(crate) fn prepend(
    batches: &[RecordBatch],
    columns: &[(&str, Option<String>)],
) -> DfResult<Vec<RecordBatch>> {
    batches
        .iter()
        .map(|b| {
            let mut fields: Vec<Field> = columns
                .iter()
                .map(|(k, _)| Field::new(*k, DataType::Utf8, true))
                .collect();
            let mut arrays: Vec<ArrayRef> = columns
                .iter()
                .map(|(_, v)| {
                    Arc::new(StringArray::from(vec![v.clone(); b.num_rows()])) as ArrayRef
                })
                .collect();
            for (f, c) in b.schema().fields().iter().zip(b.columns()) {
                if columns.iter().any(|(k, _)| k == f.name()) {
                    continue;
                }
                fields.push(f.as_ref().clone().with_nullable(true));
                arrays.push(c.clone());
            }
            Ok(RecordBatch::try_new(Arc::new(Schema::new(fields)), arrays)?)
        })
        .collect()
}

/// Encode batches (of one schema) as a Parquet file.
pub(crate) fn parquet_bytes(batches: &[RecordBatch]) -> DfResult<Vec<u8>> {
    let first = batches
        .first()
        .ok_or_else(|| exec_datafusion_err!("nothing to write"))?;
    let mut w = ArrowWriter::try_new(Vec::new(), first.schema(), None)?;
    for b in batches {
        w.write(b)?;
    }
    Ok(w.into_inner()?)
}

/// Decode a Parquet file.
pub(crate) fn parquet_batches(bytes: bytes::Bytes) -> DfResult<Vec<RecordBatch>> {
    let reader = ParquetRecordBatchReaderBuilder::try_new(bytes)?.build()?;
    Ok(reader.collect::<Result<Vec<_>, _>>()?)
}

/// What the fit step produces.
#[derive(Clone)]
pub(crate) struct Fitted {
    pub(crate) estimates: Vec<RecordBatch>,
    pub(crate) attrition: Vec<RecordBatch>,
    pub(crate) covariate_ref: Vec<RecordBatch>,
    pub(crate) sizes: Vec<(String, ScalarValue)>,
}

const OUTCOMES_TABLE: &str = "__epifusion_pipeline_outcomes";
const COVARIATES_TABLE: &str = "__epifusion_pipeline_covariates";

fn mem_table(name: &str, batches: &[RecordBatch]) -> DfResult<Arc<MemTable>> {
    let first = batches
        .first()
        .ok_or_else(|| exec_datafusion_err!("the {name} table has no schema (no batches)"))?;
    Ok(Arc::new(MemTable::try_new(
        first.schema(),
        vec![batches.to_vec()],
    )?))
}

/// Fit the unit's model over the study tables through the Rust entry of its `*_fit` table
/// function ([`epifusion_sql::fit_table::fit_batches`]: every fit option, `cv` included, means
/// what it means in SQL), plus the sizes for the diagnostics (queries over the registered
/// tables).
pub(crate) async fn fit(ctx: &SessionContext, a: &Analysis, t: &StudyTables) -> DfResult<Fitted> {
    let rows: usize = t.outcomes.iter().map(RecordBatch::num_rows).sum();
    if rows == 0 {
        return Err(exec_datafusion_err!("the outcomes table has no rows"));
    }
    let covariates = if t.covariates.is_empty() {
        vec![RecordBatch::new_empty(Arc::new(Schema::new(vec![
            Field::new("row_id", DataType::Int64, false),
            Field::new("covariate_id", DataType::Int64, false),
            Field::new("covariate_value", DataType::Float64, true),
        ])))]
    } else {
        t.covariates.clone()
    };
    ctx.register_table(OUTCOMES_TABLE, mem_table("outcomes", &t.outcomes)?)?;
    ctx.register_table(COVARIATES_TABLE, mem_table("covariates", &covariates)?)?;
    let r = fit_registered(ctx, a, t, &covariates).await;
    let _ = ctx.deregister_table(OUTCOMES_TABLE);
    let _ = ctx.deregister_table(COVARIATES_TABLE);
    r
}

async fn fit_registered(
    ctx: &SessionContext,
    a: &Analysis,
    t: &StudyTables,
    covariates: &[RecordBatch],
) -> DfResult<Fitted> {
    // The fit: the Rust entry of the fitting table function, on the study tables in memory.
    let function = a.model.descriptor().table_function;
    let schema_of = |b: &[RecordBatch]| b[0].schema();
    let result = epifusion_sql::fit_table::fit_batches(
        function,
        &a.fit_options.to_string(),
        (schema_of(&t.outcomes), t.outcomes.clone()),
        Some((schema_of(covariates), covariates.to_vec())),
    )
    .await?;
    let ids = result.covariate_ids.ok_or_else(|| {
        exec_datafusion_err!(
            "analysis `{}`: a pipeline fit returns the coefficient table (fit option `table`)",
            a.name
        )
    })?;
    let estimates = result.batch;

    // Sizes for the diagnostics.
    let schema = t.outcomes[0].schema();
    let col = |name: &str| {
        schema
            .fields()
            .iter()
            .find(|f| f.name().eq_ignore_ascii_case(name))
            .map(|f| format!("\"{}\"", f.name().replace('"', "\"\"")))
    };
    let strata = col("stratum_id").map_or("CAST(NULL AS BIGINT)".into(), |c| {
        format!("CAST(count(DISTINCT {c}) AS BIGINT)")
    });
    let (events, competing) = match (col("y"), a.model) {
        (Some(y), ModelKind::FineGray) => (
            format!("CAST(sum(CASE WHEN {y} = 1 THEN 1 ELSE 0 END) AS DOUBLE)"),
            format!("CAST(sum(CASE WHEN {y} = 2 THEN 1 ELSE 0 END) AS DOUBLE)"),
        ),
        (Some(y), _) => (
            format!("CAST(sum({y}) AS DOUBLE)"),
            "CAST(NULL AS DOUBLE)".into(),
        ),
        (None, _) => ("CAST(NULL AS DOUBLE)".into(), "CAST(NULL AS DOUBLE)".into()),
    };
    let time = col("time").map_or("CAST(NULL AS DOUBLE)".into(), |c| {
        format!("CAST(sum({c}) AS DOUBLE)")
    });
    let mut sizes = Vec::new();
    for sql in [
        format!(
            "SELECT CAST(count(*) AS BIGINT) AS outcome_rows, {strata} AS strata, {events} AS events, \
             {competing} AS competing_events, {time} AS total_time FROM {OUTCOMES_TABLE}"
        ),
        format!(
            "SELECT CAST(count(*) AS BIGINT) AS covariate_entries, \
             CAST(count(DISTINCT covariate_id) AS BIGINT) AS covariates FROM {COVARIATES_TABLE}"
        ),
    ] {
        let b = ctx.sql(&sql).await?.collect().await?;
        let b = b
            .first()
            .ok_or_else(|| exec_datafusion_err!("no size row"))?;
        for (f, c) in b.schema().fields().iter().zip(b.columns()) {
            sizes.push((f.name().clone(), ScalarValue::try_from_array(c, 0)?));
        }
    }

    let covariate_ref = if t.covariate_ref.is_empty() {
        ctx.sql(&format!(
            "SELECT DISTINCT covariate_id, CAST(covariate_id AS VARCHAR) AS covariate_name \
             FROM {COVARIATES_TABLE} ORDER BY covariate_id"
        ))
        .await?
        .collect()
        .await?
    } else {
        t.covariate_ref.clone()
    };
    let attrition = if t.attrition.is_empty() {
        vec![one_row(&[
            ("step", ScalarValue::Int64(Some(1))),
            ("description", utf8("outcome rows")),
            (
                "rows",
                ScalarValue::Int64(Some(rows_of(&t.outcomes) as i64)),
            ),
        ])?]
    } else {
        t.attrition.clone()
    };

    // Estimates: unit columns, the fit result, and covariate names from the reference.
    let names = covariate_names(&covariate_ref)?;
    let mut unit_cols: Vec<(&str, Option<String>)> = vec![
        ("analysis_id", Some(a.id.clone())),
        ("analysis", Some(a.name.clone())),
        ("design", Some(a.design.kind().name().to_string())),
    ];
    for (_, role) in super::spec::ROLES {
        unit_cols.push((role, a.role(role).map(str::to_string)));
    }
    let mut out = Vec::new();
    for b in prepend(&[estimates], &unit_cols)? {
        let name: StringArray = ids
            .iter()
            .map(|id| id.and_then(|id| names.get(&id).cloned()))
            .collect();
        let mut fields: Vec<Field> = b
            .schema()
            .fields()
            .iter()
            .map(|f| f.as_ref().clone())
            .collect();
        fields.push(Field::new("covariate_name", DataType::Utf8, true));
        let mut cols = b.columns().to_vec();
        cols.push(Arc::new(name));
        out.push(RecordBatch::try_new(Arc::new(Schema::new(fields)), cols)?);
    }
    let id_col = [("analysis_id", Some(a.id.clone()))];
    Ok(Fitted {
        estimates: out,
        attrition: prepend(&attrition, &id_col)?,
        covariate_ref: prepend(&covariate_ref, &id_col)?,
        sizes,
    })
}

fn rows_of(b: &[RecordBatch]) -> usize {
    b.iter().map(RecordBatch::num_rows).sum()
}

/// covariate_id → covariate_name from a covariate reference table.
fn covariate_names(batches: &[RecordBatch]) -> DfResult<BTreeMap<i64, String>> {
    let mut names = BTreeMap::new();
    for b in batches {
        let (Some(id), Some(name)) = (
            b.column_by_name("covariate_id"),
            b.column_by_name("covariate_name"),
        ) else {
            continue;
        };
        let id = cast(id, &DataType::Int64)?;
        let name = cast(name, &DataType::Utf8)?;
        let (id, name) = (id.as_primitive::<Int64Type>(), name.as_string::<i32>());
        for i in 0..b.num_rows() {
            if !id.is_null(i) && !name.is_null(i) {
                names.insert(id.value(i), name.value(i).to_string());
            }
        }
    }
    Ok(names)
}

/// Read a unit's results back from the output and assemble the report.
async fn build_report(
    p: &Pipeline,
    out: &Output,
    run: &RunManifest,
) -> Result<Report, PipelineError> {
    let mut report = Report {
        title: p.name.clone(),
        description: p.file.description.clone(),
        ..Default::default()
    };
    for (a, entry) in p.analyses.iter().zip(&run.analyses) {
        let m: AnalysisManifest = out
            .get_json(&entry.manifest.path)
            .await?
            .ok_or_else(|| analysis_err(a, "its manifest disappeared during the run"))?;
        let read = |name: &'static str| {
            let o = m.objects.get(name).cloned();
            async move {
                let Some(o) = o else {
                    return Ok(Vec::new());
                };
                let bytes = out
                    .get(&o.path)
                    .await?
                    .ok_or_else(|| analysis_err(a, format!("{} is missing", o.path)))?;
                parquet_batches(bytes).map_err(|e| analysis_err(a, e))
            }
        };
        let estimates = read("estimates").await?;
        report
            .forest
            .extend(forest_rows(a, &estimates).map_err(|e| analysis_err(a, e))?);
        let warnings = report_warnings(p, a, &estimates).map_err(|e| analysis_err(a, e))?;
        report.analyses.push(ReportAnalysis {
            id: a.id.clone(),
            description: a.description.clone(),
            design: a.design.kind().name().into(),
            model: a.model.name().into(),
            roles: a
                .roles
                .iter()
                .map(|(r, s)| (r.to_string(), s.clone()))
                .collect(),
            provenance: if entry.skipped {
                format!("Complete from run {} (skipped in this run)", m.run_id)
            } else {
                "Computed in this run".into()
            },
            attrition: read("attrition").await?,
            diagnostics: read("diagnostics").await?,
            warnings,
            cohort: if m.objects.contains_key("cm_diagnostics_summary") {
                Some(
                    super::cohort_results::report_plots(
                        read("cm_preference_score_dist").await?,
                        read("cm_covariate_balance").await?,
                        read("cm_kaplan_meier_dist").await?,
                        read("cm_diagnostics_summary").await?,
                    )
                    .map_err(|e| analysis_err(a, e))?,
                )
            } else {
                None
            },
        });
    }
    let computed = run.analyses.iter().filter(|e| !e.skipped).count();
    report.metadata = vec![
        ("pipeline".into(), p.name.clone()),
        ("pipeline file".into(), p.source.name.clone()),
        ("pipeline hash".into(), run.pipeline_hash.clone()),
        ("run id".into(), run.run_id.clone()),
        ("started (UTC)".into(), run.started_at.clone()),
        ("finished (UTC)".into(), run.finished_at.clone()),
        ("seconds".into(), format!("{:.1}", run.seconds)),
        ("OMOP store".into(), p.omop.clone()),
        ("output".into(), p.output.clone()),
        (
            "analyses".into(),
            format!(
                "{} ({computed} computed, {} skipped as complete)",
                run.analyses.len(),
                run.analyses.len() - computed
            ),
        ),
    ];
    for (k, v) in &run.versions {
        report.metadata.push((format!("{k} version"), v.clone()));
    }
    for a in &p.analyses {
        report
            .metadata
            .push((format!("options of {}", a.id), a.fit_options.to_string()));
    }
    Ok(report)
}

/// The `report` ids for which the unit's fit has no coefficient (a typo, or an id that this
/// design does not produce). Which ids a fit produces depends on the data (baseline
/// covariates, `stratify_by_id`, SQL designs), so this is known only after the fit: a warning
/// in the run's output and in the report, naming the file and line of `report`.
fn report_warnings(p: &Pipeline, a: &Analysis, estimates: &[RecordBatch]) -> DfResult<Vec<String>> {
    let Some(wanted) = &a.report else {
        return Ok(Vec::new());
    };
    let mut fitted = std::collections::BTreeSet::new();
    for b in estimates {
        let Some(ids) = b.column_by_name("covariate_id") else {
            continue;
        };
        let ids = cast(ids, &DataType::Int64)?;
        let ids = ids.as_primitive::<Int64Type>();
        fitted.extend(
            (0..ids.len())
                .filter(|&i| !ids.is_null(i))
                .map(|i| ids.value(i)),
        );
    }
    let missing: Vec<String> = wanted
        .iter()
        .filter(|id| !fitted.contains(*id))
        .map(i64::to_string)
        .collect();
    if missing.is_empty() {
        return Ok(Vec::new());
    }
    let mut have: Vec<String> = fitted.iter().take(12).map(i64::to_string).collect();
    if fitted.len() > 12 {
        have.push("…".into());
    }
    let (line, column) = p
        .source
        .line_col(p.source.key_span(&a.span, "report").start);
    Ok(vec![format!(
        "{}:{line}:{column}: analysis `{}`: report: {} {} not among the coefficients of {} ({}); \
         nothing is plotted for {}",
        p.source.name,
        a.name,
        if missing.len() == 1 {
            "covariate"
        } else {
            "covariates"
        },
        missing.join(", ") + if missing.len() == 1 { " is" } else { " are" },
        a.id,
        if have.is_empty() {
            "none".into()
        } else {
            have.join(", ")
        },
        if missing.len() == 1 { "it" } else { "them" },
    )])
}

/// Forest-plot rows of a unit: the covariates listed in `report`, else the unpenalized ones.
fn forest_rows(a: &Analysis, estimates: &[RecordBatch]) -> DfResult<Vec<ForestRow>> {
    let mut rows = Vec::new();
    for b in estimates {
        let get = |n: &str, t: &DataType| -> DfResult<ArrayRef> {
            let c = b
                .column_by_name(n)
                .ok_or_else(|| exec_datafusion_err!("estimates without `{n}`"))?;
            Ok(cast(c, t)?)
        };
        let id = get("covariate_id", &DataType::Int64)?;
        let id = id.as_primitive::<Int64Type>();
        let est = get("estimate", &DataType::Float64)?;
        let est = est.as_primitive::<datafusion::arrow::datatypes::Float64Type>();
        let lo = get("ci_lower", &DataType::Float64)?;
        let lo = lo.as_primitive::<datafusion::arrow::datatypes::Float64Type>();
        let hi = get("ci_upper", &DataType::Float64)?;
        let hi = hi.as_primitive::<datafusion::arrow::datatypes::Float64Type>();
        let pen = get("penalized", &DataType::Boolean)?;
        let pen = pen.as_boolean();
        let label = get("covariate", &DataType::Utf8)?;
        let label = label.as_string::<i32>();
        let name = get("covariate_name", &DataType::Utf8)?;
        let name = name.as_string::<i32>();
        for i in 0..b.num_rows() {
            // The intercept, and aliased columns (NULL estimate) have nothing to plot.
            if id.is_null(i) || est.is_null(i) {
                continue;
            }
            let wanted = match &a.report {
                Some(ids) => ids.contains(&id.value(i)),
                None => !pen.is_null(i) && !pen.value(i),
            };
            if !wanted {
                continue;
            }
            let opt = |arr: &datafusion::arrow::array::Float64Array| {
                (!arr.is_null(i)).then(|| arr.value(i).exp())
            };
            rows.push(ForestRow {
                analysis: a.id.clone(),
                label: if name.is_null(i) {
                    label.value(i).to_string()
                } else {
                    name.value(i).to_string()
                },
                ratio: est.value(i).exp(),
                lower: opt(lo),
                upper: opt(hi),
            });
        }
    }
    Ok(rows)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn utc_strings() {
        assert_eq!(utc_string(UNIX_EPOCH), "1970-01-01T00:00:00Z");
        let t = UNIX_EPOCH + Duration::from_secs(1_795_252_500); // 2026-11-21T09:15:00Z
        assert_eq!(utc_string(t), "2026-11-21T09:15:00Z");
        assert_eq!(civil_from_days(-1), (1969, 12, 31));
        assert_eq!(civil_from_days(11_016), (2000, 2, 29));
    }
}
