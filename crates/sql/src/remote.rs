//! epifusion's table functions in a plan that another process plans: a Ballista scheduler.
//!
//! A table-function call (`cox_fit('outcomes', 'covariates', '{…}')`, `calibrate_estimates`,
//! `cohort_match`, …) is a [`TableProvider`] holding SQL *text*; its inputs are planned when the
//! table is scanned, in the session that scans it. A Ballista client does not scan: it sends the
//! logical plan to the scheduler, whose session has none of the client's tables. So before the
//! plan leaves the client, [`prepare_for_cluster`] replaces each such call with a
//! [`PlannedEpiTable`]: the call's [`NodeSpec`] plus the **logical plans** of its input queries,
//! planned (read-only) in the client's session, where the tables are registered. Those plans
//! reference their data by location (Parquet / CSV listing tables, object-store URLs), so they
//! can be serialized ([`encode_planned`], nested datafusion-proto plans) and planned again on
//! the scheduler, whose [`PlannedEpiTable::scan`] makes the same [`EpiExec`] the local path
//! makes, with physical children that Ballista cuts into stages and runs on executors.
//!
//! The SCCS study tables are built partitioned by person ([`crate::study::sccs_parts`]): their
//! queries are planned here, in the client session, like a fit's inputs.
//!
//! Any other study build (`cohort_outcomes`, …, `sccs_diagnostics`) runs its own
//! queries against the OMOP tables of the session that calls it. On a cluster it carries the
//! client session's tables with it ([`StudyInputs`]): the logical plan of every table of the
//! default schema that names its data (the OMOP store's Parquet / CSV listing tables and the
//! typed views over them, `CREATE EXTERNAL TABLE`s, views over those). The executor that runs
//! the build registers them in a fresh session and reads the store itself, so the store must be
//! a path every node can read or an object-store URL. The build runs on one executor: its
//! result is one table, as in a local run.
//!
//! Refused with a clear error (planning, before anything runs): `design_matrix` and fits of a
//! stored design (`@name`: the matrix lives in the client session's memory), a study build in
//! a session with no table that can be sent, and `epifusion_functions()`.

use std::collections::HashMap;
use std::sync::Arc;

use async_trait::async_trait;
use datafusion::arrow::datatypes::SchemaRef;
use datafusion::catalog::{Session, TableProvider};
use datafusion::common::tree_node::{Transformed, TreeNodeRecursion};
use datafusion::common::{exec_datafusion_err, plan_datafusion_err, Result as DfResult};
use datafusion::common::{DataFusionError, TableReference};
use datafusion::datasource::{provider_as_source, source_as_provider, TableType, ViewTable};
use datafusion::execution::session_state::SessionStateBuilder;
use datafusion::execution::TaskContext;
use datafusion::logical_expr::LogicalPlanBuilder;
use datafusion::logical_expr::{Expr, LogicalPlan, TableScan};
use datafusion::physical_plan::ExecutionPlan;
use datafusion::prelude::SessionContext;
use datafusion_proto::bytes::{
    logical_plan_from_bytes_with_extension_codec, logical_plan_to_bytes_with_extension_codec,
};
use datafusion_proto::logical_plan::{DefaultLogicalExtensionCodec, LogicalExtensionCodec};
use futures::future::BoxFuture;
use serde::{Deserialize, Serialize};

use crate::exec::{EpiExec, NodeSpec, WIRE_VERSION};

/// A table-function call whose input queries are already logical plans (see the module
/// documentation): what travels to a Ballista scheduler.
#[derive(Debug)]
pub struct PlannedEpiTable {
    spec: NodeSpec,
    inputs: Vec<LogicalPlan>,
    schema: SchemaRef,
}

impl PlannedEpiTable {
    /// A call of `spec` over `inputs` (logical plans, checked read-only when a node decodes
    /// them) with the output `schema`.
    pub fn new(spec: NodeSpec, inputs: Vec<LogicalPlan>, schema: SchemaRef) -> PlannedEpiTable {
        PlannedEpiTable {
            spec,
            inputs,
            schema,
        }
    }

    /// What the call computes.
    pub fn spec(&self) -> &NodeSpec {
        &self.spec
    }

    /// The input plans, in the node's child order.
    pub fn inputs(&self) -> &[LogicalPlan] {
        &self.inputs
    }
}

#[async_trait]
impl TableProvider for PlannedEpiTable {
    fn schema(&self) -> SchemaRef {
        self.schema.clone()
    }

    fn table_type(&self) -> TableType {
        TableType::Temporary
    }

    async fn scan(
        &self,
        state: &dyn Session,
        projection: Option<&Vec<usize>>,
        _filters: &[Expr],
        _limit: Option<usize>,
    ) -> DfResult<Arc<dyn ExecutionPlan>> {
        let mut children = Vec::with_capacity(self.inputs.len());
        for plan in &self.inputs {
            children.push(crate::planning::physical_plan(state, plan).await?);
        }
        if let NodeSpec::SccsMerge { function, settings } = &self.spec {
            // The partitioned build: the pieces node over the four queries, under the merge
            // (crate::study::sccs_parts). Each node gets its own physical plans of the small
            // queries: an execution plan may keep state across its partitions (a file scan's
            // shared work queue), so one instance must not run under two parents.
            if children.len() == 4 {
                let mut inputs = Vec::with_capacity(4);
                for plan in &self.inputs[..3] {
                    inputs.push(crate::planning::physical_plan(state, plan).await?);
                }
                inputs.push(children[3].clone());
                let part = EpiExec::try_new(
                    NodeSpec::SccsPart {
                        function: function.clone(),
                        settings: settings.clone(),
                    },
                    inputs,
                    None,
                    None,
                )?;
                children[3] = Arc::new(part);
            }
        }
        Ok(Arc::new(EpiExec::try_new(
            self.spec.clone(),
            children,
            projection.cloned(),
            None,
        )?))
    }
}

/// The node spec and input queries of an epifusion table provider, `None` for a provider that
/// is not epifusion's; an error for epifusion's tables that cannot leave the session.
fn call_of(provider: &Arc<dyn TableProvider>) -> Option<DfResult<(NodeSpec, Vec<String>)>> {
    if let Some(t) = provider.downcast_ref::<crate::fit_table::FitTable>() {
        return Some(t.remote_call());
    }
    if let Some(t) = provider.downcast_ref::<crate::calibration::CalibrationTable>() {
        return Some(Ok(t.remote_call()));
    }
    if let Some(t) = provider.downcast_ref::<crate::cohort_ps::CohortTable>() {
        return Some(Ok(t.remote_call()));
    }
    if provider
        .downcast_ref::<crate::design_table::DesignTable>()
        .is_some()
    {
        return Some(Err(plan_datafusion_err!(
            "design_matrix cannot run on a cluster: a stored design matrix (@name) lives in \
             one session's memory. Pass the outcomes and covariates queries to the fit instead"
        )));
    }
    if provider.downcast_ref::<crate::docs::DocsTable>().is_some() {
        return Some(Err(plan_datafusion_err!(
            "epifusion_functions() describes this program: run it without --cluster"
        )));
    }
    None
}

/// An SCCS study table (`sccs_intervals`, `sccs_covariates`, `sccs_covariate_ref`,
/// `sccs_attrition`) as a build partitioned by person ([`crate::study::sccs_parts`]): its four
/// queries planned in `session`; `None` for another study function.
async fn partitioned_sccs(
    session: &dyn Session,
    t: &crate::study::functions::StudyTable,
    schema: SchemaRef,
) -> DfResult<Option<PlannedEpiTable>> {
    use crate::study::functions::{Design, Part};
    let Some(part) = study_part(t.name, Design::Sccs) else {
        return Ok(None);
    };
    let d = crate::study::SccsDesign::from_json(&t.settings_json)?;
    d.check()?;
    let queries = crate::study::sccs_parts::split_queries(&d)?;
    let used = if part == Part::CovariateRef { 3 } else { 4 };
    let names = ["cases", "outcomes", "concepts", "rows"];
    let queries: Vec<(&str, &str)> = queries
        .iter()
        .map(String::as_str)
        .zip(names)
        .take(used)
        .collect();
    let inputs = plan_build_queries(session, t.name, &queries).await?;
    Ok(Some(PlannedEpiTable {
        spec: NodeSpec::SccsMerge {
            function: t.name.to_string(),
            settings: t.settings_json.clone(),
        },
        inputs,
        schema,
    }))
}

/// The part of a `design` study function named `name` (`sccs_intervals` → intervals, …);
/// `None` when `name` is not one of that design's functions.
fn study_part(
    name: &str,
    design: crate::study::functions::Design,
) -> Option<crate::study::functions::Part> {
    crate::study::functions::STUDY_FUNCTIONS
        .iter()
        .find(|(n, d, _)| *n == name && *d == design)
        .map(|&(_, _, part)| part)
}

/// `sccs_diagnostics` / `sccs_time_to_event` as distributed queries under a merge
/// ([`crate::study::diagnostics::DiagnosticsWork::input_queries`]), planned in `session`;
/// `None` for another study function.
async fn distributed_diagnostics(
    session: &dyn Session,
    t: &crate::study::functions::StudyTable,
    schema: SchemaRef,
) -> DfResult<Option<PlannedEpiTable>> {
    let part = match crate::registry::sql_functions()
        .into_iter()
        .find(|f| f.name == t.name)
        .map(|f| f.role)
    {
        Some(crate::registry::SqlRole::SccsDiagnostics(part)) => part,
        _ => return Ok(None),
    };
    let work = crate::study::diagnostics::DiagnosticsWork::parse(t.name, part, &t.settings_json)?;
    let sqls = work.input_queries()?;
    let queries: Vec<(&str, &str)> = sqls.iter().map(|(q, n)| (q.as_str(), *n)).collect();
    let inputs = plan_build_queries(session, t.name, &queries).await?;
    Ok(Some(PlannedEpiTable {
        spec: NodeSpec::DiagnosticsMerge {
            function: t.name.to_string(),
            settings: t.settings_json.clone(),
        },
        inputs,
        schema,
    }))
}

/// The queries of a build run as distributed plans ((SQL, name) pairs), planned in `session`
/// and prepared for the cluster.
pub(crate) async fn plan_build_queries(
    session: &dyn Session,
    function: &str,
    queries: &[(&str, &str)],
) -> DfResult<Vec<LogicalPlan>> {
    // The queries read the session's OMOP tables: the same clear error as a one-task build
    // when the session has none that can travel.
    let carried = StudyInputs::from_session(session, function).await?;
    let mut inputs = Vec::with_capacity(queries.len());
    for (sql, name) in queries {
        let what = format!("{function}: the {name} query");
        let input = crate::planning::logical_plan(session, sql, &what).await?;
        // A table of the session that cannot travel (in memory, derived) is named here rather
        // than in the codec's error when the plan is sent.
        let mut stuck: Vec<String> = Vec::new();
        input.apply_with_subqueries(|node| {
            if let LogicalPlan::TableScan(scan) = node {
                let name = scan.table_name.table().to_string();
                if carried.left_out.contains(&name) && !stuck.contains(&name) {
                    stuck.push(name);
                }
            }
            Ok(TreeNodeRecursion::Continue)
        })?;
        if !stuck.is_empty() {
            return Err(plan_datafusion_err!(
                "{what} reads tables of the client session that cannot be sent to the \
                 executors (only tables that name their data — Parquet, CSV or JSON files or \
                 URLs every node can read — can): {}",
                stuck
                    .iter()
                    .map(|n| format!("`{n}`"))
                    .collect::<Vec<_>>()
                    .join(", ")
            ));
        }
        inputs.push(prepare_for_cluster(session, input).await?);
    }
    Ok(inputs)
}

/// A cohort study table (`cohort_outcomes`, `cohort_covariates`, `cohort_covariate_ref`,
/// `cohort_attrition`) as distributed queries under a merge ([`crate::study::cohort_parts`]),
/// planned in `session`; `None` for another study function.
async fn distributed_cohort(
    session: &dyn Session,
    t: &crate::study::functions::StudyTable,
    schema: SchemaRef,
) -> DfResult<Option<PlannedEpiTable>> {
    use crate::study::functions::Design;
    let Some(part) = study_part(t.name, Design::Cohort) else {
        return Ok(None);
    };
    let d = crate::study::CohortDesign::from_json(&t.settings_json)?;
    d.check()?;
    let ctx = crate::planning::session_context(session);
    let sqls = crate::study::cohort_parts::split_queries(&ctx, &d, part)?;
    let names = crate::study::cohort_parts::query_names(&d, part);
    let queries: Vec<(&str, &str)> = sqls
        .iter()
        .map(String::as_str)
        .zip(names.iter().copied())
        .collect();
    let inputs = plan_build_queries(session, t.name, &queries).await?;
    Ok(Some(PlannedEpiTable {
        spec: NodeSpec::CohortMerge {
            function: t.name.to_string(),
            settings: t.settings_json.clone(),
        },
        inputs,
        schema,
    }))
}

/// Replace every epifusion table-function call in `plan` (subqueries and the calls' own input
/// queries included) by a [`PlannedEpiTable`] whose inputs are planned, read-only, in
/// `session`; refuse the calls that cannot leave the session (module documentation).
pub fn prepare_for_cluster(
    session: &dyn Session,
    plan: LogicalPlan,
) -> BoxFuture<'_, DfResult<LogicalPlan>> {
    Box::pin(prepare(session, plan))
}

async fn prepare(session: &dyn Session, plan: LogicalPlan) -> DfResult<LogicalPlan> {
    let plan = unwrap_local_wrappers(plan)?;
    // The scans to replace, keyed by the address of their table source.
    let mut calls: Vec<(usize, Arc<dyn TableProvider>)> = Vec::new();
    plan.apply_with_subqueries(|node| {
        if let LogicalPlan::TableScan(scan) = node {
            if let Ok(provider) = source_as_provider(&scan.source) {
                calls.push((source_key(scan), provider));
            }
        }
        Ok(TreeNodeRecursion::Continue)
    })?;
    let mut planned: HashMap<usize, Arc<dyn TableProvider>> = HashMap::new();
    for (key, provider) in calls {
        if let Some(t) = provider.downcast_ref::<crate::study::functions::StudyTable>() {
            if let Some(table) = partitioned_sccs(session, t, provider.schema()).await? {
                planned.insert(key, Arc::new(table));
                continue;
            }
            if let Some(table) = distributed_cohort(session, t, provider.schema()).await? {
                planned.insert(key, Arc::new(table));
                continue;
            }
            if let Some(table) = distributed_diagnostics(session, t, provider.schema()).await? {
                planned.insert(key, Arc::new(table));
                continue;
            }
            let table = PlannedEpiTable {
                spec: NodeSpec::Study {
                    function: t.name.to_string(),
                    settings: t.settings_json.clone(),
                    tables: StudyInputs::from_session(session, t.name).await?,
                },
                inputs: Vec::new(),
                schema: provider.schema(),
            };
            planned.insert(key, Arc::new(table));
            continue;
        }
        let Some(call) = call_of(&provider) else {
            continue;
        };
        let (spec, sqls) = call?;
        let mut inputs = Vec::with_capacity(sqls.len());
        for sql in &sqls {
            let what = format!("{}: an input query", spec.function());
            let input = crate::planning::logical_plan(session, sql, &what).await?;
            inputs.push(prepare_for_cluster(session, input).await?);
        }
        let table = PlannedEpiTable {
            spec,
            inputs,
            schema: provider.schema(),
        };
        planned.insert(key, Arc::new(table));
    }
    if planned.is_empty() {
        return Ok(plan);
    }
    plan.transform_up_with_subqueries(|node| match node {
        LogicalPlan::TableScan(mut scan) => match planned.get(&source_key(&scan)) {
            Some(table) => {
                scan.source = provider_as_source(table.clone());
                Ok(Transformed::yes(LogicalPlan::TableScan(scan)))
            }
            None => Ok(Transformed::no(LogicalPlan::TableScan(scan))),
        },
        other => Ok(Transformed::no(other)),
    })
    .map(|t| t.data)
}

/// `plan` with the table providers that exist only in this process replaced by what they wrap,
/// inside views too: a [`crate::named_source::NamedSource`] (the label an OMOP table's read
/// errors carry) by its listing table, which datafusion-proto can send.
pub fn unwrap_local_wrappers(plan: LogicalPlan) -> DfResult<LogicalPlan> {
    plan.transform_up_with_subqueries(|node| match node {
        LogicalPlan::TableScan(mut scan) => {
            let unwrapped = match source_as_provider(&scan.source) {
                Ok(provider) => unwrap_provider(&provider)?,
                Err(_) => None,
            };
            match unwrapped {
                Some(provider) => {
                    scan.source = provider_as_source(provider);
                    Ok(Transformed::yes(LogicalPlan::TableScan(scan)))
                }
                None => Ok(Transformed::no(LogicalPlan::TableScan(scan))),
            }
        }
        other => Ok(Transformed::no(other)),
    })
    .map(|t| t.data)
}

/// What [`unwrap_local_wrappers`] puts in place of `provider` (`None`: keep it).
fn unwrap_provider(provider: &Arc<dyn TableProvider>) -> DfResult<Option<Arc<dyn TableProvider>>> {
    if let Some(named) = provider.downcast_ref::<crate::named_source::NamedSource>() {
        let inner = named.inner().clone();
        return Ok(Some(unwrap_provider(&inner)?.unwrap_or(inner)));
    }
    if let Some(view) = provider.downcast_ref::<ViewTable>() {
        let plan = unwrap_local_wrappers(view.logical_plan().clone())?;
        return Ok(Some(Arc::new(ViewTable::new(
            plan,
            view.definition().cloned(),
        ))));
    }
    Ok(None)
}

fn source_key(scan: &TableScan) -> usize {
    Arc::as_ptr(&scan.source) as *const () as usize
}

/// Prefix of an encoded [`PlannedEpiTable`] (tells it from other codecs' bytes).
pub const PLANNED_TABLE_MAGIC: &[u8] = b"epifusion-table:";

/// The JSON head of an encoded [`PlannedEpiTable`].
#[derive(Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct WireTable {
    /// The epifusion version that encoded it: tables of another version are refused.
    version: String,
    spec: NodeSpec,
    /// Byte length of each input plan (datafusion-proto, with the same codec), in order.
    inputs: Vec<usize>,
}

/// Encode `table` into `buf`: [`PLANNED_TABLE_MAGIC`], a length-prefixed JSON head (version,
/// spec, input sizes), then each input plan serialized by datafusion-proto with `codec` (the
/// codec of the whole plan, so nested calls and listing tables encode the same way).
pub fn encode_planned(
    table: &PlannedEpiTable,
    codec: &dyn LogicalExtensionCodec,
    buf: &mut Vec<u8>,
) -> DfResult<()> {
    let mut bodies = Vec::with_capacity(table.inputs.len());
    for plan in &table.inputs {
        bodies.push(logical_plan_to_bytes_with_extension_codec(plan, codec)?);
    }
    let head = WireTable {
        version: WIRE_VERSION.to_string(),
        spec: table.spec.clone(),
        inputs: bodies.iter().map(|b| b.len()).collect(),
    };
    let head = serde_json::to_vec(&head)
        .map_err(|e| exec_datafusion_err!("encoding an epifusion table: {e}"))?;
    buf.extend_from_slice(PLANNED_TABLE_MAGIC);
    buf.extend_from_slice(&(head.len() as u64).to_le_bytes());
    buf.extend_from_slice(&head);
    for b in &bodies {
        buf.extend_from_slice(b);
    }
    Ok(())
}

/// Decode what [`encode_planned`] wrote (`None`: the bytes are not an epifusion table). A table
/// from another epifusion version is refused with an error naming both versions.
pub fn decode_planned(
    buf: &[u8],
    schema: SchemaRef,
    ctx: &TaskContext,
    codec: &dyn LogicalExtensionCodec,
) -> Option<DfResult<PlannedEpiTable>> {
    let rest = buf.strip_prefix(PLANNED_TABLE_MAGIC)?;
    Some(decode_body(rest, schema, ctx, codec))
}

fn decode_body(
    rest: &[u8],
    schema: SchemaRef,
    ctx: &TaskContext,
    codec: &dyn LogicalExtensionCodec,
) -> DfResult<PlannedEpiTable> {
    let truncated = || exec_datafusion_err!("a truncated epifusion table on the wire");
    let (len, rest) = rest.split_at_checked(8).ok_or_else(truncated)?;
    let len = u64::from_le_bytes(len.try_into().map_err(|_| truncated())?) as usize;
    let (head, mut rest) = rest.split_at_checked(len).ok_or_else(truncated)?;
    let head: WireTable = serde_json::from_slice(head)
        .map_err(|e| exec_datafusion_err!("not an epifusion table: {e}"))?;
    if head.version != WIRE_VERSION {
        return Err(exec_datafusion_err!(
            "an epifusion table from version {} cannot be planned by epifusion {}: run the same \
             version on the client and every node",
            head.version,
            WIRE_VERSION
        ));
    }
    let mut inputs = Vec::with_capacity(head.inputs.len());
    for n in head.inputs {
        let (body, tail) = rest.split_at_checked(n).ok_or_else(truncated)?;
        let plan = logical_plan_from_bytes_with_extension_codec(body, ctx, codec)?;
        // The client refused writes when it planned the inputs; a node checks again, so a
        // plan from any other client cannot write through an input either.
        let what = format!("{}: an input query", head.spec.function());
        crate::planning::check_read_only(&plan, &what)?;
        inputs.push(plan);
        rest = tail;
    }
    if !rest.is_empty() {
        return Err(exec_datafusion_err!(
            "an epifusion table on the wire has {} trailing bytes",
            rest.len()
        ));
    }
    Ok(PlannedEpiTable {
        spec: head.spec,
        inputs,
        schema,
    })
}

/// The client session's tables that a study build reads on a cluster (module documentation):
/// each table of the default schema whose scan datafusion-proto can serialize without an
/// extension codec (listing tables over files or URLs, views over them), by name. The plans
/// travel hex-encoded inside the node's JSON spec.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StudyInputs {
    tables: Vec<StudyInput>,
    /// Tables of the session that could not be sent (in-memory tables, views over epifusion
    /// functions): named when the build fails.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    left_out: Vec<String>,
}

/// One carried table.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct StudyInput {
    name: String,
    /// The table's scan, serialized by datafusion-proto, in lower-case hex.
    plan: String,
}

impl StudyInputs {
    /// No table carried (the build reads the session that planned it).
    pub fn is_empty(&self) -> bool {
        self.tables.is_empty()
    }

    /// The tables a call of `function` planned in `session` carries; an error when none can
    /// be sent.
    pub async fn from_session(session: &dyn Session, function: &str) -> DfResult<StudyInputs> {
        let ctx = crate::planning::session_context(session);
        let options = session.config().options();
        let schema = ctx
            .catalog(&options.catalog.default_catalog)
            .and_then(|c| c.schema(&options.catalog.default_schema));
        let mut out = StudyInputs::default();
        if let Some(schema) = schema {
            let mut names = schema.table_names();
            names.sort();
            let codec = DefaultLogicalExtensionCodec {};
            for name in names {
                let Some(provider) = schema.table(&name).await? else {
                    continue;
                };
                let provider = unwrap_provider(&provider)?.unwrap_or(provider);
                let plan = LogicalPlanBuilder::scan(
                    TableReference::bare(name.clone()),
                    provider_as_source(provider),
                    None,
                )?
                .build()?;
                match logical_plan_to_bytes_with_extension_codec(&plan, &codec) {
                    Ok(bytes) => out.tables.push(StudyInput {
                        name,
                        plan: to_hex(&bytes),
                    }),
                    Err(_) => out.left_out.push(name),
                }
            }
        }
        if out.tables.is_empty() {
            return Err(plan_datafusion_err!(
                "{function} on a cluster reads the OMOP tables of this session, and it has none \
                 that can be sent to the executors{}: register the store with --omop (a path \
                 every node can read, or an object-store URL) or with CREATE EXTERNAL TABLE",
                if out.left_out.is_empty() {
                    String::new()
                } else {
                    format!(" (in-memory or derived: {})", out.left_out.join(", "))
                }
            ));
        }
        Ok(out)
    }

    /// A fresh session on the node running the task, with the carried tables registered under
    /// their names and every epifusion function.
    pub fn session(&self, task: &TaskContext) -> DfResult<SessionContext> {
        let state = SessionStateBuilder::new()
            // A fresh catalog (the client's configuration says not to create one: its own
            // exists).
            .with_config(
                task.session_config()
                    .clone()
                    .with_create_default_catalog_and_schema(true),
            )
            .with_runtime_env(task.runtime_env())
            .with_default_features()
            .build();
        let ctx = SessionContext::new_with_state(state);
        crate::session::register_all(&ctx);
        let codec = DefaultLogicalExtensionCodec {};
        for t in &self.tables {
            let bytes = from_hex(&t.plan).ok_or_else(|| {
                exec_datafusion_err!("the table `{}` arrived garbled (not hex)", t.name)
            })?;
            let plan =
                logical_plan_from_bytes_with_extension_codec(&bytes, &ctx.task_ctx(), &codec)?;
            crate::planning::check_read_only(&plan, &format!("the table `{}`", t.name))?;
            // A listing table comes back as its scan; a view may come back as its plan.
            let provider = match plan {
                LogicalPlan::TableScan(scan) => source_as_provider(&scan.source)?,
                other => Arc::new(ViewTable::new(other, None)),
            };
            ctx.register_table(TableReference::bare(t.name.clone()), provider)?;
        }
        Ok(ctx)
    }

    /// `e`, from a build of `function` in [`StudyInputs::session`], with the session tables
    /// that were not sent named (a query of the build may have needed one of them).
    pub fn explain(&self, function: &str, e: DataFusionError) -> DataFusionError {
        if self.left_out.is_empty() {
            return e;
        }
        DataFusionError::Context(
            format!(
                "{function} on the cluster: these tables of the client session were not sent to \
                 the executors (only tables that name their data can be): {}",
                self.left_out.join(", ")
            ),
            Box::new(e),
        )
    }
}

fn to_hex(bytes: &[u8]) -> String {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    let mut s = String::with_capacity(bytes.len() * 2);
    for b in bytes {
        s.push(DIGITS[usize::from(b >> 4)] as char);
        s.push(DIGITS[usize::from(b & 15)] as char);
    }
    s
}

fn from_hex(s: &str) -> Option<Vec<u8>> {
    let digit = |c: u8| (c as char).to_digit(16).map(|d| d as u8);
    let b = s.as_bytes();
    if b.len() % 2 != 0 {
        return None;
    }
    b.chunks_exact(2)
        .map(|p| Some(digit(p[0])? << 4 | digit(p[1])?))
        .collect()
}
