//! `epifusion run --cluster`: each analysis unit's study build and fit run on a cluster
//! executor.
//!
//! The client loads and checks the pipeline, takes the output lock, and for each unit to
//! compute sends one task ([`epifusion_sql::remote_task`], kind [`TASK`]) to the cluster: the
//! pipeline file's text, the resolved store and output locations and the unit's id. The task
//! carries the client's OMOP tables as plans; the executor that runs it registers them in a
//! fresh session, reads the store itself (so the store must be a path every node can read, or
//! an object-store URL), loads the same file, and runs the unit's fit with the code of a local
//! run ([`crate::run`]'s stages). The unit's tables (estimates, attrition, covariate reference,
//! diagnostics and the design's extra tables) come back to the client, which writes them, the
//! manifests and the report as a local run does: the output is written by the client alone,
//! so it need not be shared with the executors.
//!
//! **The study build is distributed** ([`unit_inputs`]): the queries that read the store for
//! the unit's design are the task's input queries, planned by the client and run by Ballista
//! as distributed plans (their scans, joins and aggregates hash-partitioned by person over
//! the executors); the task receives their results and does only the per-case Rust part and
//! the fit, as the SQL study functions' merge nodes do:
//!
//! * SCCS (a unit is one outcome over every exposure of its analysis): the four queries of the
//!   partitioned build ([`epifusion_sql::study::sccs_parts::split_queries`]) for the first
//!   exposure, gathered into the case data ([`epifusion_sql::study::sccs_parts::gathered`]),
//!   plus one query of the other exposures' eras of the persons with the outcome
//!   ([`epifusion_sql::study::sccs_many::add_other_exposures`]); with
//!   `restrict_time_to_exposure` (each exposure its own study period, so its own population),
//!   the four queries of each exposure's own design, gathered into each exposure's case data
//!   ([`epifusion_sql::study::sccs_many::each_exposure_of_own`]);
//! * cohort: the population, covariate and covariate-reference queries
//!   ([`epifusion_sql::study::cohort_parts::all_queries`]), and with `[cohort.ps]` the
//!   population and covariate queries of the propensity-score population;
//! * SQL designs whose `setup` only defines views (`CREATE [OR REPLACE] VIEW`, or no setup):
//!   the client runs the setup in the cluster session (one unit at a time: units may define
//!   the same names differently) and plans the unit's queries there, the views inlined; the
//!   task sorts the rows as a local build does ([`tables::canonical`]).
//!
//! The tables are the local build's, bit for bit. One kind of unit still builds inside the
//! task, from the store (as before): SQL designs whose setup does more than define views (a
//! table, a setting: the user's statements run in the executor's session, then the queries).
//!
//! Up to `--cluster-units` units (default [`UNITS_IN_FLIGHT`]) are on the cluster at once, each
//! as one job on one executor (a unit's fit is one model), sent in file order ([`RemoteUnits`]);
//! the client takes their results in file order, so the output, the log and a stopped run are
//! as in a sequential run, and a unit's tables wait at most for the units before it. The
//! propensity model that a local run shares between the outcomes of one comparison is refitted
//! by each unit's task (the same data and settings give the same model).

use std::collections::VecDeque;
use std::path::Path;
use std::sync::Arc;

use datafusion::arrow::array::{ArrayRef, Float64Array, UInt64Array};
use datafusion::arrow::datatypes::{DataType, Field, Schema};
use datafusion::arrow::record_batch::RecordBatch;
use datafusion::common::runtime::SpawnedTask;
use datafusion::common::{exec_datafusion_err, Result as DfResult, ScalarValue};
use datafusion::prelude::{DataFrame, SessionContext};
use serde::{Deserialize, Serialize};

use epifusion_sql::remote_task::Parts;
use epifusion_sql::study::functions::Part;
use epifusion_sql::study::{cohort_parts, sccs_many, sccs_parts, CohortDesign, SccsDesign};

use crate::plan::{self, Analysis, Design, Pipeline, SqlQueries};
use crate::progress::Progress;
use crate::run::{Fitted, Prebuilt, PrebuiltCases, Staged};
use crate::spec::Source;
use crate::tables::{self, StudyTables};
use crate::{many, PipelineError};

/// The task's name in [`epifusion_sql::remote_task`]'s registry.
pub const TASK: &str = "pipeline_unit";

/// Register the task runner in this process (every node of a cluster must: the `epifusion`
/// binary does at start).
pub fn register() {
    epifusion_sql::remote_task::register(TASK, run_task);
}

/// Units on the cluster at once by default (`epifusion run --cluster-units`).
pub const UNITS_IN_FLIGHT: usize = 4;

/// The units a run computes on the cluster, sent ahead in file order: at most `in_flight` are
/// on the cluster or waiting to be taken; [`RemoteUnits::next`] takes them in the same order.
/// Dropping it (a run that stops) aborts the units not taken.
pub(crate) struct RemoteUnits {
    cluster: SessionContext,
    pipeline: Arc<Pipeline>,
    in_flight: usize,
    pending: VecDeque<(Analysis, String)>,
    running: VecDeque<(String, SpawnedTask<Result<Staged, PipelineError>>)>,
}

impl RemoteUnits {
    /// The units `todo` (each with its progress tag), in the order the run takes them.
    pub(crate) fn new(
        cluster: &SessionContext,
        p: &Pipeline,
        todo: Vec<(Analysis, String)>,
        in_flight: usize,
    ) -> Self {
        RemoteUnits {
            cluster: cluster.clone(),
            pipeline: Arc::new(p.clone()),
            in_flight: in_flight.max(1),
            pending: todo.into(),
            running: VecDeque::new(),
        }
    }

    /// Send units until `in_flight` are out.
    fn fill(&mut self) {
        while self.running.len() < self.in_flight {
            let Some((a, tag)) = self.pending.pop_front() else {
                break;
            };
            let (cluster, p) = (self.cluster.clone(), self.pipeline.clone());
            let id = a.id.clone();
            let task =
                SpawnedTask::spawn(async move { remote_stage(&cluster, &p, &a, &tag).await });
            self.running.push_back((id, task));
        }
    }

    /// The staged tables of `a`, the next unit in order (the next units are sent first).
    pub(crate) async fn next(&mut self, a: &Analysis) -> Result<Staged, PipelineError> {
        self.fill();
        let Some((id, task)) = self.running.pop_front() else {
            return Err(crate::run::analysis_err(
                a,
                "this unit was not sent to the cluster",
            ));
        };
        if id != a.id {
            return Err(crate::run::analysis_err(
                a,
                format!("the cluster returned the unit `{id}` in its place"),
            ));
        }
        self.fill();
        task.join()
            .await
            .map_err(|e| crate::run::analysis_err(a, format!("the cluster task stopped: {e}")))?
    }
}

/// Define in the cluster session `cluster` the views of `p`'s concept sets that the store check
/// ([`plan::check_store`]) defined in the local session `local` (each concept set is a view
/// named after its key, which SQL designs read as `{target}`, `{outcome}`, …): a unit's task
/// carries the cluster session's views with it, and its queries are planned there.
pub(crate) async fn share_views(
    local: &SessionContext,
    cluster: &SessionContext,
    p: &Pipeline,
) -> Result<(), PipelineError> {
    for name in p.file.concept_sets.keys() {
        let Ok(view) = local.table_provider(name.as_str()).await else {
            continue;
        };
        cluster
            .register_table(name.as_str(), view)
            .map_err(PipelineError::DataFusion)?;
    }
    Ok(())
}

/// What travels: enough to load the same pipeline and find the unit.
#[derive(Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct UnitTask {
    /// The file's name, as the client read it.
    file: String,
    /// The file's text.
    text: String,
    /// The store and output as the client resolved them.
    omop: String,
    output: String,
    /// The unit's id.
    analysis: String,
    /// The unit's progress tag (`[i/n] id`).
    tag: String,
}

/// Build and fit `a` on an executor of the cluster session `cluster` (which holds the store's
/// tables); the staged tables, as a local stage returns them.
pub(crate) async fn remote_stage(
    cluster: &SessionContext,
    p: &Pipeline,
    a: &Analysis,
    tag: &str,
) -> Result<Staged, PipelineError> {
    let task = UnitTask {
        file: p.source.name.clone(),
        text: p.source.text.clone(),
        omop: p.omop.clone(),
        output: p.output.clone(),
        analysis: a.id.clone(),
        tag: tag.to_string(),
    };
    let payload = serde_json::to_string(&task).map_err(|e| crate::run::analysis_err(a, e))?;
    let mut attrition = None;
    let inputs = {
        // A SQL unit's views are defined, and its queries planned over them, under the lock;
        // its attrition query is planned there too, and run by the client.
        let sql_setup = match (&a.design, unit_build(a)) {
            (Design::Sql(q), Ok(UnitBuild::Sql)) => Some(q),
            _ => None,
        };
        let _views = match sql_setup {
            Some(q) => {
                let guard = SQL_SETUP.lock().await;
                plan::run_setup(cluster, q, &p.source).await?;
                if let Some(sql) = &q.attrition {
                    attrition = Some(
                        cluster
                            .sql(&sql.value)
                            .await
                            .map_err(|e| crate::run::analysis_err(a, e))?,
                    );
                }
                Some(guard)
            }
            None => None,
        };
        let sqls = unit_inputs(cluster, a).map_err(|e| crate::run::analysis_err(a, e))?;
        epifusion_sql::remote_task::plan_inputs(cluster, TASK, &sqls)
            .await
            .map_err(|e| crate::run::analysis_err(a, format!("on the cluster: {e}")))?
    };
    let on_cluster = |e| crate::run::analysis_err(a, format!("on the cluster: {e}"));
    let task = epifusion_sql::remote_task::run_on_cluster(cluster, TASK, payload, inputs);
    let (parts, attrition) = match attrition {
        Some(df) => {
            let (parts, rows) = futures::join!(task, client_attrition(df, a));
            (parts.map_err(on_cluster)?, Some(rows.map_err(on_cluster)?))
        }
        None => (task.await.map_err(on_cluster)?, None),
    };
    let mut staged = decode_staged(parts).map_err(|e| crate::run::analysis_err(a, e))?;
    if let Some(rows) = attrition {
        staged.fitted.attrition = rows;
    }
    Ok(staged)
}

/// The attrition table of SQL unit `a` from its planned attrition query `df` (run by the
/// client as a query of its own: the rows keep the query's `ORDER BY`, which a task's input
/// on Ballista 55 may lose — partitions of a sorted union read one after the other), as the
/// unit's stage writes it ([`crate::run`]: `analysis_id` first). An empty result keeps its
/// schema.
async fn client_attrition(df: DataFrame, a: &Analysis) -> DfResult<Vec<RecordBatch>> {
    let schema = Arc::new(df.schema().as_arrow().clone());
    let mut batches = df.collect().await?;
    if batches.is_empty() {
        batches.push(RecordBatch::new_empty(schema));
    }
    crate::run::prepend(&batches, &[("analysis_id", Some(a.id.clone()))])
}

/// The input queries' names (the SCCS build's, the other exposures' eras, the cohort build's
/// and the propensity-score population's).
const SCCS_QUERIES: [&str; 4] = ["sccs:cases", "sccs:outcomes", "sccs:concepts", "sccs:rows"];
const OTHER_EXPOSURES: &str = "sccs:other_exposures";

/// The name of query `name` of exposure `x`'s own design (a unit with
/// `restrict_time_to_exposure`): `sccs:cases` → `sccs2:cases`.
fn each_name(x: usize, name: &str) -> String {
    name.replacen("sccs:", &format!("sccs{x}:"), 1)
}
const COHORT_QUERIES: [&str; 3] = [
    "cohort:population",
    "cohort:covariates",
    "cohort:covariate_ref",
];
const PS_QUERIES: [&str; 2] = ["ps:population", "ps:covariates"];
/// A SQL design's task inputs are `sql:outcomes`, `sql:covariates` and `sql:covariate_ref`
/// ([`SqlQueries::tables`]; the attrition query is the client's, [`remote_stage`]).
const SQL_PREFIX: &str = "sql:";

/// How a unit's study build runs on a cluster (module documentation).
enum UnitBuild {
    /// An SCCS unit (one outcome, every exposure of its analysis): its first exposure's four
    /// queries and the others' eras.
    SccsMany(SccsDesign),
    /// An SCCS unit with `restrict_time_to_exposure`: the four queries of each exposure's own
    /// design ([`sccs_many::single_exposure_design`]).
    SccsEach(SccsDesign),
    /// A cohort design, from its three queries (and its propensity-score population's).
    Cohort(CohortDesign),
    /// A SQL design whose `setup` only defines views (or that has none): its queries, planned
    /// by the client after its setup ran in the cluster session.
    Sql,
    /// Built inside the task, from the store.
    InTask,
}

/// How unit `a` is built (the client and the executor derive it from the same file).
fn unit_build(a: &Analysis) -> DfResult<UnitBuild> {
    Ok(match &a.design {
        // Every SCCS unit lists its analysis' exposures (crate::many); none is built alone.
        Design::Sccs(_) if a.exposures.is_empty() => UnitBuild::InTask,
        Design::Sccs(_) => {
            let pairs: Vec<Analysis> = a.exposures.iter().map(|e| many::pair(a, e)).collect();
            let d = many::outcome_design(a, &pairs)?;
            if d.restrict_time_to_exposure.is_some() {
                UnitBuild::SccsEach(d)
            } else {
                UnitBuild::SccsMany(d)
            }
        }
        Design::Cohort(t) => {
            UnitBuild::Cohort(CohortDesign::from_json(&tables::cohort_settings(a, t)?)?)
        }
        // A setup that only defines views runs in the client's cluster session (the views
        // are inlined into the queries' plans); any other statement (a table, an insert, a
        // setting) runs in the task's session, with the queries (module documentation).
        Design::Sql(q) if setup_only_views(q) => UnitBuild::Sql,
        Design::Sql(_) => UnitBuild::InTask,
    })
}

/// Whether every statement of `q`'s `setup` is a `CREATE [OR REPLACE] VIEW` (not
/// materialized); true without a setup. A setup that does not parse is left to the task, which
/// reports its error as a local run does.
fn setup_only_views(q: &SqlQueries) -> bool {
    use datafusion::sql::parser::{DFParser, Statement};
    use datafusion::sql::sqlparser::ast::Statement as Sql;
    let Some(setup) = &q.setup else {
        return true;
    };
    epifusion_sql::shell::split_statements(&setup.value)
        .iter()
        .all(|stmt| match DFParser::parse_sql(stmt) {
            Ok(parsed) => parsed.iter().all(|s| {
                matches!(s, Statement::Statement(b)
                    if matches!(b.as_ref(), Sql::CreateView(v) if !v.materialized))
            }),
            Err(_) => false,
        })
}

/// Held while a SQL unit's `setup` runs in the cluster session and its queries are planned
/// there: units on the cluster at once may define the same view names differently.
static SQL_SETUP: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// The input queries of unit `a`'s task, (name, SQL), to plan in the cluster session `ctx`
/// (module documentation); none for a unit built inside its task.
fn unit_inputs(ctx: &SessionContext, a: &Analysis) -> DfResult<Vec<(String, String)>> {
    let named = |names: &[&str], sqls: Vec<String>| -> Vec<(String, String)> {
        names.iter().map(|n| n.to_string()).zip(sqls).collect()
    };
    let mut inputs = match unit_build(a)? {
        UnitBuild::SccsMany(d) => {
            let first = sccs_many::first_exposure_design(&d);
            let mut q = named(&SCCS_QUERIES, sccs_parts::split_queries(&first)?.to_vec());
            if let Some(sql) = sccs_many::other_exposures_sql(&d) {
                q.push((OTHER_EXPOSURES.to_string(), sql));
            }
            q
        }
        UnitBuild::SccsEach(d) => {
            let mut q = Vec::new();
            for x in 0..d.exposures.len() {
                let dx = sccs_many::single_exposure_design(&d, x);
                for (name, sql) in SCCS_QUERIES.iter().zip(sccs_parts::split_queries(&dx)?) {
                    q.push((each_name(x, name), sql));
                }
            }
            q
        }
        UnitBuild::Cohort(d) => named(
            &COHORT_QUERIES,
            cohort_parts::all_queries(ctx, &d)?.to_vec(),
        ),
        // The attrition query is the client's ([`remote_stage`]).
        UnitBuild::Sql => match &a.design {
            Design::Sql(q) => q
                .tables()
                .into_iter()
                .filter(|(name, _)| *name != "attrition")
                .map(|(name, sql)| (format!("{SQL_PREFIX}{name}"), sql.value.clone()))
                .collect(),
            _ => Vec::new(),
        },
        UnitBuild::InTask => Vec::new(),
    };
    if let Some(ps) = crate::cohort_adjust::ps_design(a)? {
        inputs.extend(named(
            &PS_QUERIES,
            cohort_parts::split_queries(ctx, &ps, Part::Covariates)?,
        ));
    }
    Ok(inputs)
}

/// What the task's input results (`inputs`, named as [`unit_inputs`] names them) give unit
/// `a`'s stage: its study tables or shared SCCS case data, and its propensity-score
/// population's tables.
async fn prebuilt_of(a: &Analysis, inputs: Parts) -> DfResult<Prebuilt> {
    let mut inputs: std::collections::HashMap<String, Vec<RecordBatch>> =
        inputs.into_iter().collect();
    let mut take = |name: &str| {
        inputs.remove(name).ok_or_else(|| {
            exec_datafusion_err!("analysis `{}`: the task lacks its `{name}` query", a.id)
        })
    };
    let mut out = Prebuilt::default();
    match unit_build(a)? {
        UnitBuild::SccsMany(d) => {
            let [c, o, k, r] = SCCS_QUERIES.map(&mut take);
            let (c, o, k, r) = (c?, o?, k?, r?);
            let others = match sccs_many::other_exposures_sql(&d) {
                Some(_) => Some(take(OTHER_EXPOSURES)?),
                None => None,
            };
            let cases = blocking(move || {
                let first = sccs_many::first_exposure_design(&d);
                let mut cases = sccs_parts::gathered(&first, &c, &o, &k, &r)?;
                if let Some(others) = others {
                    sccs_many::add_other_exposures(&mut cases, &others)?;
                }
                Ok(cases)
            })
            .await?;
            out.sccs_cases = Some(PrebuiltCases::Shared(Box::new(cases)));
        }
        UnitBuild::SccsEach(d) => {
            let mut own = Vec::with_capacity(d.exposures.len());
            for x in 0..d.exposures.len() {
                let [c, o, k, r] = SCCS_QUERIES.map(|name| take(&each_name(x, name)));
                let (c, o, k, r) = (c?, o?, k?, r?);
                let dx = sccs_many::single_exposure_design(&d, x);
                own.push(blocking(move || sccs_parts::gathered(&dx, &c, &o, &k, &r)).await?);
            }
            out.sccs_cases = Some(PrebuiltCases::EachExposure(own));
        }
        UnitBuild::Cohort(d) => {
            let [p, c, r] = COHORT_QUERIES.map(&mut take);
            let queries = [p?, c?, r?];
            let t = blocking(move || cohort_parts::tables_of(&d, queries)).await?;
            out.tables = Some(tables::from_study(t));
        }
        UnitBuild::Sql => {
            if let Design::Sql(q) = &a.design {
                // As `tables::build_tables`: the rows in one order; a query the design lacks
                // gives no batches.
                let mut get = |name: &str, present: bool| {
                    if present {
                        take(&format!("{SQL_PREFIX}{name}"))
                    } else {
                        Ok(Vec::new())
                    }
                };
                let outcomes = get("outcomes", true)?;
                let covariates = get("covariates", q.covariates.is_some())?;
                let covariate_ref = get("covariate_ref", q.covariate_ref.is_some())?;
                // The attrition comes from the client (`remote_stage`), which replaces what
                // the stage makes of none.
                out.tables = Some(
                    blocking(move || {
                        Ok(StudyTables {
                            outcomes: tables::canonical(outcomes)?,
                            covariates: tables::canonical(covariates)?,
                            covariate_ref: tables::canonical(covariate_ref)?,
                            attrition: Vec::new(),
                        })
                    })
                    .await?,
                );
            }
        }
        UnitBuild::InTask => {}
    }
    if let Some(ps) = crate::cohort_adjust::ps_design(a)? {
        let [p, c] = PS_QUERIES.map(&mut take);
        let (p, c) = (p?, c?);
        out.ps = Some(
            blocking(move || {
                Ok(StudyTables {
                    outcomes: vec![cohort_parts::merge(
                        &ps,
                        Part::Outcomes,
                        std::slice::from_ref(&p),
                    )?],
                    covariates: vec![cohort_parts::merge(&ps, Part::Covariates, &[p, c])?],
                    covariate_ref: Vec::new(),
                    attrition: Vec::new(),
                })
            })
            .await?,
        );
    }
    Ok(out)
}

/// Run CPU work on a blocking thread.
async fn blocking<T: Send + 'static>(
    work: impl FnOnce() -> DfResult<T> + Send + 'static,
) -> DfResult<T> {
    epifusion_sql::fit_table::blocking("a pipeline unit's build", work).await
}

fn run_task(
    ctx: SessionContext,
    payload: String,
    inputs: Parts,
) -> epifusion_sql::remote_task::TaskFuture {
    Box::pin(async move {
        let task: UnitTask = serde_json::from_str(&payload)
            .map_err(|e| exec_datafusion_err!("a pipeline unit task arrived garbled: {e}"))?;
        let fail = |e: PipelineError| exec_datafusion_err!("{e}");
        let p = plan::load_source(
            Source {
                name: task.file.clone(),
                text: task.text.clone(),
            },
            Path::new(&task.file),
            Some(&task.omop),
            Some(&task.output),
        )
        .map_err(fail)?;
        let a = p
            .analyses
            .iter()
            .find(|a| a.id == task.analysis)
            .ok_or_else(|| {
                exec_datafusion_err!(
                    "the pipeline {} has no analysis unit `{}` on this node (a different file?)",
                    task.file,
                    task.analysis
                )
            })?;
        let prebuilt = prebuilt_of(a, inputs)
            .await
            .map_err(|e| fail(crate::run::analysis_err(a, e)))?;
        let staged = crate::run::stage(
            &ctx,
            &p,
            a,
            &task.tag,
            &Progress::quiet(),
            &crate::cohort_adjust::PsCache::new(),
            &epifusion_sql::study::ExposureEraCache::new(),
            prebuilt,
        )
        .await
        .map_err(fail)?;
        encode_staged(staged)
    })
}

const ESTIMATES: &str = "estimates";
const ATTRITION: &str = "attrition";
const COVARIATE_REF: &str = "covariate_ref";
const DIAGNOSTICS: &str = "diagnostics";
const META: &str = "meta";
const EXTRA: &str = "extra:";
const SIZE: &str = "size:";

/// The staged tables as named parts; the scalars (status, rows, seconds, sizes) in a one-row
/// `meta` table.
fn encode_staged(s: Staged) -> DfResult<epifusion_sql::remote_task::Parts> {
    let mut fields = vec![
        Field::new("rows", DataType::UInt64, false),
        Field::new("build_seconds", DataType::Float64, false),
        Field::new("fit_seconds", DataType::Float64, false),
        Field::new("status", s.status.data_type(), true),
    ];
    let mut columns: Vec<ArrayRef> = vec![
        Arc::new(UInt64Array::from(vec![s.rows as u64])),
        Arc::new(Float64Array::from(vec![s.build_seconds])),
        Arc::new(Float64Array::from(vec![s.fit_seconds])),
        s.status.to_array()?,
    ];
    for (name, v) in &s.fitted.sizes {
        fields.push(Field::new(format!("{SIZE}{name}"), v.data_type(), true));
        columns.push(v.to_array()?);
    }
    let meta = RecordBatch::try_new(Arc::new(Schema::new(fields)), columns)?;
    let mut parts = vec![
        (META.to_string(), vec![meta]),
        (ESTIMATES.to_string(), s.fitted.estimates),
        (ATTRITION.to_string(), s.fitted.attrition),
        (COVARIATE_REF.to_string(), s.fitted.covariate_ref),
        (DIAGNOSTICS.to_string(), s.diagnostics),
    ];
    parts.extend(s.extra.into_iter().map(|(n, b)| (format!("{EXTRA}{n}"), b)));
    Ok(parts)
}

fn decode_staged(parts: epifusion_sql::remote_task::Parts) -> DfResult<Staged> {
    let mut staged = Staged {
        fitted: Fitted {
            estimates: Vec::new(),
            attrition: Vec::new(),
            covariate_ref: Vec::new(),
            sizes: Vec::new(),
        },
        diagnostics: Vec::new(),
        status: ScalarValue::Null,
        rows: 0,
        build_seconds: 0.0,
        fit_seconds: 0.0,
        extra: Vec::new(),
    };
    let mut has_meta = false;
    for (name, batches) in parts {
        match name.as_str() {
            META => {
                let b = batches
                    .first()
                    .filter(|b| b.num_rows() == 1)
                    .ok_or_else(|| exec_datafusion_err!("a unit's result without its summary"))?;
                let scalar = |i: usize| ScalarValue::try_from_array(b.column(i), 0);
                let number = |i: usize| -> DfResult<f64> {
                    match scalar(i)? {
                        ScalarValue::UInt64(Some(v)) => Ok(v as f64),
                        ScalarValue::Float64(Some(v)) => Ok(v),
                        other => Err(exec_datafusion_err!("a unit's summary holds {other:?}")),
                    }
                };
                staged.rows = number(0)? as usize;
                staged.build_seconds = number(1)?;
                staged.fit_seconds = number(2)?;
                staged.status = scalar(3)?;
                for (i, f) in b.schema().fields().iter().enumerate().skip(4) {
                    let name = f.name().strip_prefix(SIZE).unwrap_or(f.name());
                    staged.fitted.sizes.push((name.to_string(), scalar(i)?));
                }
                has_meta = true;
            }
            ESTIMATES => staged.fitted.estimates = batches,
            ATTRITION => staged.fitted.attrition = batches,
            COVARIATE_REF => staged.fitted.covariate_ref = batches,
            DIAGNOSTICS => staged.diagnostics = batches,
            other => match other.strip_prefix(EXTRA) {
                Some(n) => staged.extra.push((n.to_string(), batches)),
                None => return Err(exec_datafusion_err!("a unit's result has a part `{other}`")),
            },
        }
    }
    if !has_meta {
        return Err(exec_datafusion_err!("a unit's result without its summary"));
    }
    Ok(staged)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::plan::Located;
    use datafusion::arrow::array::Int64Array;

    /// A staged table without the columns that time the run.
    fn untimed(batches: &[RecordBatch]) -> Vec<RecordBatch> {
        batches
            .iter()
            .map(|b| {
                let keep: Vec<usize> = (0..b.num_columns())
                    .filter(|&i| !b.schema().field(i).name().ends_with("seconds"))
                    .collect();
                b.project(&keep).unwrap()
            })
            .collect()
    }

    fn concat(batches: &[RecordBatch]) -> Option<RecordBatch> {
        let first = batches.first()?;
        Some(datafusion::arrow::compute::concat_batches(first.schema_ref(), batches).unwrap())
    }

    /// Stage `a` with caches of its own (nothing shared with another stage).
    async fn stage_alone(
        ctx: &SessionContext,
        p: &Pipeline,
        a: &Analysis,
        prebuilt: Prebuilt,
    ) -> Staged {
        let (ps, eras) = (
            crate::cohort_adjust::PsCache::new(),
            epifusion_sql::study::ExposureEraCache::new(),
        );
        crate::run::stage(ctx, p, a, "test", &Progress::quiet(), &ps, &eras, prebuilt)
            .await
            .unwrap()
    }

    /// Every unit of the bundled design pipelines staged from the results of its task's input
    /// queries (what a cluster task receives; here run in a local session) gives the tables of
    /// the unit built from the store, bit for bit: SCCS units over several exposures (also with
    /// `restrict_time_to_exposure`), cohort units with and without a propensity-score
    /// population, SQL designs.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn units_staged_from_their_input_queries_match_the_local_build() {
        let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
        let store = root.join("data/gibleed").display().to_string();
        let (mut many, mut each, mut cohort, mut ps, mut sql) = (0, 0, 0, 0, 0);
        // gibleed.toml with `restrict_time_to_exposure` (each exposure's own population).
        let restricted =
            std::env::temp_dir().join(format!("epifusion_restricted_{}.toml", std::process::id()));
        let text = std::fs::read_to_string(root.join("pipelines/gibleed.toml")).unwrap();
        assert!(text.contains("[analysis.sccs]\n"));
        std::fs::write(
            &restricted,
            text.replace(
                "[analysis.sccs]\n",
                "[analysis.sccs]\nrestrict_time_to_exposure = 0\n",
            ),
        )
        .unwrap();
        // gibleed.toml: two cohort units and an SCCS unit over two exposures; cohort.toml:
        // its propensity-score unit (its other units are gibleed's with cross-validation);
        // gibleed_sql.toml: SQL designs whose setups define views.
        for (path, only_ps) in [
            (root.join("pipelines/gibleed.toml"), false),
            (root.join("pipelines/cohort.toml"), true),
            (root.join("pipelines/gibleed_sql.toml"), false),
            (restricted.clone(), false),
        ] {
            let file = path.display().to_string();
            let p = plan::load(&path, Some(&store), Some("unused")).unwrap();
            let ctx =
                epifusion_sql::session::new_session(&epifusion_sql::session::SessionOptions {
                    omop: Some(p.omop.clone()),
                    batch_size: None,
                })
                .await
                .unwrap();
            plan::check_store(&ctx, &p).await.unwrap();
            for a in &p.analyses {
                let has_ps = crate::cohort_adjust::ps_design(a).unwrap().is_some();
                if only_ps && !has_ps {
                    continue;
                }
                match (unit_build(a).unwrap(), &a.design) {
                    (UnitBuild::SccsMany(_), _) => many += 1,
                    (UnitBuild::SccsEach(_), _) => each += 1,
                    (UnitBuild::Cohort(_), _) => cohort += 1,
                    (UnitBuild::Sql, Design::Sql(q)) => {
                        // As `remote_stage`: the setup's views, then the queries.
                        plan::run_setup(&ctx, q, &p.source).await.unwrap();
                        sql += 1;
                    }
                    (UnitBuild::Sql, _) => panic!("{}: a SQL build of another design", a.id),
                    (UnitBuild::InTask, _) => continue,
                }
                let inputs = unit_inputs(&ctx, a).unwrap();
                assert!(!inputs.is_empty(), "{file}: {}", a.id);
                if has_ps {
                    ps += 1;
                }
                let mut parts = Parts::new();
                for (name, sql) in &inputs {
                    let batches = ctx.sql(sql).await.unwrap().collect().await.unwrap();
                    parts.push((name.clone(), batches));
                }
                let local = stage_alone(&ctx, &p, a, Prebuilt::default()).await;
                let prebuilt = prebuilt_of(a, parts).await.unwrap();
                let mut built = stage_alone(&ctx, &p, a, prebuilt).await;
                if let (Design::Sql(q), UnitBuild::Sql) = (&a.design, unit_build(a).unwrap()) {
                    if let Some(sql) = &q.attrition {
                        // The client's attrition (`remote_stage`).
                        let df = ctx.sql(&sql.value).await.unwrap();
                        built.fitted.attrition = client_attrition(df, a).await.unwrap();
                    }
                }
                let what = format!("{file}: {}", a.id);
                for (name, l, b) in [
                    (
                        "estimates",
                        &local.fitted.estimates,
                        &built.fitted.estimates,
                    ),
                    (
                        "attrition",
                        &local.fitted.attrition,
                        &built.fitted.attrition,
                    ),
                    (
                        "covariate_ref",
                        &local.fitted.covariate_ref,
                        &built.fitted.covariate_ref,
                    ),
                    ("diagnostics", &local.diagnostics, &built.diagnostics),
                ] {
                    assert!(!l.is_empty(), "{what}: {name} is empty");
                    assert_eq!(concat(&untimed(l)), concat(&untimed(b)), "{what}: {name}");
                }
                assert_eq!(local.status, built.status, "{what}");
                assert_eq!(local.rows, built.rows, "{what}");
                assert_eq!(local.fitted.sizes, built.fitted.sizes, "{what}");
                assert_eq!(
                    local.extra.iter().map(|(n, _)| n).collect::<Vec<_>>(),
                    built.extra.iter().map(|(n, _)| n).collect::<Vec<_>>(),
                    "{what}"
                );
                for ((n, l), (_, b)) in local.extra.iter().zip(&built.extra) {
                    assert_eq!(concat(&untimed(l)), concat(&untimed(b)), "{what}: {n}");
                }
            }
        }
        let _ = std::fs::remove_file(&restricted);
        assert!(many >= 1, "{many} SCCS units");
        assert!(each >= 1, "{each} SCCS units restricted to each exposure");
        assert!(sql >= 3, "{sql} SQL units");
        assert!(
            cohort >= 3 && ps >= 1,
            "{cohort} cohort units, {ps} with ps"
        );
    }

    /// Only a setup of plain views (or none) is run by the client.
    #[test]
    fn only_view_setups_run_in_the_client_session() {
        let located = |text: &str| Located {
            value: text.to_string(),
            span: 0..0,
            key: "sql.setup".into(),
        };
        let q = |setup: Option<&str>| SqlQueries {
            setup: setup.map(located),
            outcomes: located("SELECT 1"),
            covariates: None,
            attrition: None,
            covariate_ref: None,
        };
        assert!(setup_only_views(&q(None)));
        assert!(setup_only_views(&q(Some(
            "CREATE VIEW a AS SELECT 1 AS x; CREATE OR REPLACE VIEW b AS SELECT x FROM a;"
        ))));
        for not_only in [
            "CREATE VIEW a AS SELECT 1 AS x; CREATE TABLE b AS SELECT 2 AS y;",
            "SET datafusion.execution.batch_size = 10",
            "CREATE MATERIALIZED VIEW a AS SELECT 1",
            "CREATE VIEW a AS SELEC 1",
        ] {
            assert!(!setup_only_views(&q(Some(not_only))), "{not_only}");
        }
    }

    fn batch(v: Vec<i64>) -> RecordBatch {
        let s = Arc::new(Schema::new(vec![Field::new("x", DataType::Int64, false)]));
        RecordBatch::try_new(s, vec![Arc::new(Int64Array::from(v))]).unwrap()
    }

    #[test]
    fn staged_tables_round_trip() {
        let staged = Staged {
            fitted: Fitted {
                estimates: vec![batch(vec![1, 2]), batch(vec![3])],
                attrition: vec![],
                covariate_ref: vec![batch(vec![4])],
                sizes: vec![
                    ("persons".into(), ScalarValue::Int64(Some(27))),
                    ("note".into(), ScalarValue::Utf8(None)),
                ],
            },
            diagnostics: vec![batch(vec![5])],
            status: ScalarValue::Utf8(Some("converged".into())),
            rows: 12,
            build_seconds: 0.25,
            fit_seconds: 1.5,
            extra: vec![("balance".into(), vec![batch(vec![6, 7])])],
        };
        let parts = encode_staged(staged.clone()).unwrap();
        let wire = epifusion_sql::remote_task::encode(&parts).unwrap();
        let back = decode_staged(epifusion_sql::remote_task::decode(&[wire]).unwrap()).unwrap();
        assert_eq!(back.fitted.estimates, staged.fitted.estimates);
        assert_eq!(back.fitted.attrition, staged.fitted.attrition);
        assert_eq!(back.fitted.covariate_ref, staged.fitted.covariate_ref);
        assert_eq!(back.fitted.sizes, staged.fitted.sizes);
        assert_eq!(back.diagnostics, staged.diagnostics);
        assert_eq!(back.status, staged.status);
        assert_eq!(back.rows, 12);
        assert_eq!(back.build_seconds, 0.25);
        assert_eq!(back.fit_seconds, 1.5);
        assert_eq!(back.extra, staged.extra);
    }
}
