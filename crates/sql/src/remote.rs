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
//! Refused with a clear error (planning, before anything runs): `design_matrix` and fits of a
//! stored design (`@name`: the matrix lives in the client session's memory), the study builds
//! and SCCS diagnostics (they run their own queries against the client's OMOP tables) and
//! `epifusion_functions()`.

use std::collections::HashMap;
use std::sync::Arc;

use async_trait::async_trait;
use datafusion::arrow::datatypes::SchemaRef;
use datafusion::catalog::{Session, TableProvider};
use datafusion::common::tree_node::{Transformed, TreeNodeRecursion};
use datafusion::common::{exec_datafusion_err, plan_datafusion_err, Result as DfResult};
use datafusion::datasource::{provider_as_source, source_as_provider, TableType};
use datafusion::execution::TaskContext;
use datafusion::logical_expr::{Expr, LogicalPlan, TableScan};
use datafusion::physical_plan::ExecutionPlan;
use datafusion_proto::bytes::{
    logical_plan_from_bytes_with_extension_codec, logical_plan_to_bytes_with_extension_codec,
};
use datafusion_proto::logical_plan::LogicalExtensionCodec;
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
    if let Some(t) = provider.downcast_ref::<crate::study::functions::StudyTable>() {
        return Some(Err(plan_datafusion_err!(
            "{} cannot run on a cluster yet: a study build runs its own queries against the \
             OMOP tables of the client's session. Build the table without --cluster (e.g. \
             COPY (SELECT * FROM {}(…)) TO 'intervals.parquet') and fit it on the cluster",
            t.name,
            t.name
        )));
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
