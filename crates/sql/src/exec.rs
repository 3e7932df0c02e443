//! epifusion's execution-plan node and its extension codec.
//!
//! A fit, an empirical null, a calibration, a comparative-cohort step or a study build is one [`EpiExec`]: a plan node whose
//! work is described by a serializable [`NodeSpec`] (the function's name and its JSON options or
//! settings — the same text the user wrote) and whose inputs are ordinary child plans (the
//! planned `outcomes` / `covariates` / `negatives` / `estimates` queries). Nothing in it is a
//! closure, so [`EpiCodec`] (a datafusion-proto [`PhysicalExtensionCodec`]) can send it to
//! another process — a Ballista executor — with its children encoded by datafusion-proto, and
//! rebuild it there: the spec is parsed and checked again on the receiving side.
//!
//! The node has one output partition and asks for each input as a single partition; it collects
//! its inputs, runs the work on a blocking thread (never on a tokio worker) and emits one batch.
//! Dropping its stream (Ctrl-C, a client that goes away) cancels a running fit.
//!
//! Two things stay with the session that planned them and are refused by the codec with a clear
//! error: fits of a design matrix stored by `design_matrix` (`@name`; the matrix lives in that
//! session's memory), and study builds that carry no tables ([`crate::remote::StudyInputs`], what
//! a cluster client sends) on a node whose codec was given no catalog (a study runs its own
//! queries against the OMOP tables, so the receiving node needs them).

use std::fmt;
use std::sync::Arc;

use datafusion::arrow::datatypes::SchemaRef;
use datafusion::arrow::record_batch::RecordBatch;
use datafusion::catalog::CatalogProviderList;
use datafusion::common::tree_node::TreeNodeRecursion;
use datafusion::common::{exec_datafusion_err, plan_datafusion_err, Result as DfResult};
use datafusion::execution::session_state::SessionStateBuilder;
use datafusion::execution::{SendableRecordBatchStream, TaskContext};
use datafusion::physical_expr::{
    Distribution, EquivalenceProperties, LexOrdering, OrderingRequirements, PhysicalExpr,
};
use datafusion::physical_plan::execution_plan::{Boundedness, EmissionType};
use datafusion::physical_plan::stream::RecordBatchStreamAdapter;
use datafusion::physical_plan::{
    DisplayAs, DisplayFormatType, ExecutionPlan, ExecutionPlanProperties, Partitioning,
    PlanProperties,
};
use datafusion::prelude::SessionContext;
use datafusion_proto::physical_plan::{PhysicalExtensionCodec, PhysicalProtoConverterExtension};
use serde::{Deserialize, Serialize};

use crate::registry::{sql_functions, SqlRole};
use crate::remote::StudyInputs;
use crate::study::functions::{Design, Part};
use datafusion::physical_expr::expressions::Column;

/// What an [`EpiExec`] computes: serializable, and checked again when a node is rebuilt from it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "node", rename_all = "snake_case", deny_unknown_fields)]
pub enum NodeSpec {
    /// A fitting table function (`cox_fit`, …): children `outcomes` [, `covariates`].
    Fit {
        /// The SQL function, e.g. `cox_fit` (names the model).
        function: String,
        /// The options JSON as written (empty: defaults).
        options: String,
    },
    /// `empirical_null`: child `negatives`.
    EmpiricalNull,
    /// `calibrate_estimates`: children `negatives`, `estimates`.
    CalibrateEstimates,
    /// A comparative-cohort function (`cohort_propensity_scores`, `cohort_match`, …): children
    /// its table arguments in order (and `cohort_balance`'s `before` query last).
    Cohort {
        /// The SQL function, e.g. `cohort_match`.
        function: String,
        /// The settings JSON as written (empty: defaults).
        settings: String,
    },
    /// A study table function (`sccs_intervals`, …, `sccs_diagnostics`): no children.
    Study {
        /// The SQL function, e.g. `sccs_intervals` (names the design and the table).
        function: String,
        /// The settings JSON as written.
        settings: String,
        /// On a cluster: the client session's tables the build may read, as serialized logical
        /// plans ([`crate::remote::StudyInputs`]); empty when the build runs in the session
        /// that planned it.
        #[serde(default, skip_serializing_if = "StudyInputs::is_empty")]
        tables: StudyInputs,
    },
    /// One partition of an SCCS study table built partitioned by person (on a cluster;
    /// [`crate::study::sccs_parts`]): children `cases`, `outcomes`, `concepts` (each read
    /// whole) and `rows` (hash-partitioned by `person_id`); one output partition per `rows`
    /// partition, holding the pieces of its persons' cases.
    SccsPart {
        /// The SQL function, e.g. `sccs_intervals`.
        function: String,
        /// The design JSON as written.
        settings: String,
    },
    /// The merge of an SCCS build partitioned by person: children `cases`, `outcomes`,
    /// `concepts` and the [`NodeSpec::SccsPart`] pieces (`sccs_covariate_ref` needs no
    /// pieces: three children); returns the function's table.
    SccsMerge {
        /// The SQL function, e.g. `sccs_intervals`.
        function: String,
        /// The design JSON as written.
        settings: String,
    },
    /// The merge of a cohort build run as distributed queries (on a cluster;
    /// [`crate::study::cohort_parts`]): children the queries of
    /// `cohort_parts::split_queries` (one to three), each read whole; returns the function's
    /// table.
    CohortMerge {
        /// The SQL function, e.g. `cohort_outcomes`.
        function: String,
        /// The design JSON as written.
        settings: String,
    },
    /// `sccs_diagnostics` / `sccs_time_to_event` on a cluster: children the queries of
    /// [`DiagnosticsWork::input_queries`](crate::study::diagnostics::DiagnosticsWork::input_queries)
    /// (four to six), each read whole; returns the function's table.
    DiagnosticsMerge {
        /// The SQL function, e.g. `sccs_diagnostics`.
        function: String,
        /// The settings JSON as written.
        settings: String,
    },
    /// Work of a crate above this one, run by the runner registered as `kind` in the process
    /// that executes the node ([`crate::remote_task`]): children the task's input queries
    /// (distributed plans), one per name of `inputs`, each read whole.
    Task {
        /// The runner's name, e.g. `pipeline_unit`.
        kind: String,
        /// Its input (JSON).
        payload: String,
        /// The client session's tables the task reads (as for a study build).
        #[serde(default, skip_serializing_if = "StudyInputs::is_empty")]
        tables: StudyInputs,
        /// The names of the input queries, in child order (what the runner receives them as).
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        inputs: Vec<String>,
    },
}

impl NodeSpec {
    /// The function's SQL name.
    pub fn function(&self) -> &str {
        match self {
            NodeSpec::Fit { function, .. }
            | NodeSpec::Study { function, .. }
            | NodeSpec::SccsPart { function, .. }
            | NodeSpec::SccsMerge { function, .. }
            | NodeSpec::CohortMerge { function, .. }
            | NodeSpec::DiagnosticsMerge { function, .. }
            | NodeSpec::Cohort { function, .. } => function,
            NodeSpec::Task { kind, .. } => kind,
            NodeSpec::EmpiricalNull => "empirical_null",
            NodeSpec::CalibrateEstimates => "calibrate_estimates",
        }
    }

    fn role(&self) -> DfResult<SqlRole> {
        let name = self.function();
        sql_functions()
            .into_iter()
            .find(|f| f.name == name)
            .map(|f| f.role)
            .ok_or_else(|| plan_datafusion_err!("no epifusion function named `{name}`"))
    }

    /// The number of input plans the node takes.
    fn inputs(&self) -> std::ops::RangeInclusive<usize> {
        match self {
            NodeSpec::Fit { .. } => 1..=2,
            NodeSpec::EmpiricalNull => 1..=1,
            NodeSpec::CalibrateEstimates => 2..=2,
            NodeSpec::Study { .. } => 0..=0,
            NodeSpec::Task { inputs, .. } => inputs.len()..=inputs.len(),
            NodeSpec::Cohort { .. } => 1..=3,
            NodeSpec::SccsPart { .. } => 4..=4,
            NodeSpec::SccsMerge { .. } => 3..=4,
            NodeSpec::CohortMerge { .. } => 1..=3,
            NodeSpec::DiagnosticsMerge { .. } => 4..=6,
        }
    }
}

/// The checked form of a spec: what `execute` needs.
#[derive(Debug, Clone)]
enum Work {
    Fit(Box<crate::fit_table::FitWork>),
    EmpiricalNull,
    CalibrateEstimates,
    Study(crate::study::functions::StudyWork),
    Diagnostics(crate::study::diagnostics::DiagnosticsWork),
    Cohort(crate::cohort_ps::CohortWork),
    /// A registered runner, its payload and the names of its inputs.
    Task(String, String, Vec<String>),
    /// One partition of an SCCS build partitioned by person.
    SccsPart(Arc<crate::study::SccsDesign>, Part),
    /// The merge of an SCCS build partitioned by person.
    SccsMerge(Arc<crate::study::SccsDesign>, Part),
    /// The merge of a cohort build run as distributed queries.
    CohortMerge(Arc<crate::study::CohortDesign>, Part),
    /// SCCS diagnostics from distributed queries.
    DiagnosticsMerge(crate::study::diagnostics::DiagnosticsWork),
}

/// An epifusion plan node (see the module documentation).
pub struct EpiExec {
    spec: NodeSpec,
    work: Work,
    children: Vec<Arc<dyn ExecutionPlan>>,
    /// The unprojected output schema.
    schema: SchemaRef,
    projection: Option<Vec<usize>>,
    /// Study builds: the session whose tables they read (not serialized).
    study_context: Option<SessionContext>,
    properties: Arc<PlanProperties>,
    /// An SCCS pieces node: the global part of the build, computed once for all of this
    /// instance's partitions (its small inputs run once).
    global: SharedGlobal,
    /// The children's output orderings when the node was planned: a remote task requires them
    /// of its inputs ([`ExecutionPlan::required_input_ordering`]), so that the optimizer keeps
    /// a query's `ORDER BY` (a sort under a node that needs no order is dropped as unneeded)
    /// and merges its partitions in order rather than concatenating them. (Ballista 55 can
    /// still concatenate the sorted partitions of a `UNION ALL … ORDER BY` stage: the pipeline
    /// runs a SQL design's attrition query on the client, `crates/pipeline/src/remote.rs`.)
    input_orderings: Vec<Option<LexOrdering>>,
}

/// The global part of a partitioned SCCS build, shared by one node's partitions.
/// The result is kept even when it is an error: the small inputs' plans may be run only once
/// (a repartition hands out each output partition once), so a second partition must not
/// retry them.
type SharedGlobal = Arc<
    tokio::sync::OnceCell<
        Result<Arc<crate::study::sccs_parts::Global>, Arc<datafusion::error::DataFusionError>>,
    >,
>;

impl fmt::Debug for EpiExec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("EpiExec").field("spec", &self.spec).finish()
    }
}

impl EpiExec {
    /// The node computing `spec` over `children`, projected to `projection`; `study_context`
    /// is the session a study build runs its queries in (required for [`NodeSpec::Study`]).
    pub fn try_new(
        spec: NodeSpec,
        children: Vec<Arc<dyn ExecutionPlan>>,
        projection: Option<Vec<usize>>,
        study_context: Option<SessionContext>,
    ) -> DfResult<Self> {
        if !spec.inputs().contains(&children.len()) {
            return Err(plan_datafusion_err!(
                "{} takes {:?} input plans, got {}",
                spec.function(),
                spec.inputs(),
                children.len()
            ));
        }
        let (work, schema) = match (&spec, spec.role()) {
            (
                NodeSpec::Task {
                    kind,
                    payload,
                    inputs,
                    ..
                },
                _,
            ) => (
                Work::Task(kind.clone(), payload.clone(), inputs.clone()),
                crate::remote_task::schema(),
            ),
            (_, Err(e)) => return Err(e),
            (_, Ok(role)) => Self::work_of(&spec, role, &children)?,
        };
        let carries_tables = matches!(&spec, NodeSpec::Study { tables, .. } | NodeSpec::Task { tables, .. } if !tables.is_empty());
        if matches!(work, Work::Study(_) | Work::Diagnostics(_) | Work::Task(..))
            && study_context.is_none()
            && !carries_tables
        {
            return Err(plan_datafusion_err!(
                "{}: a study build, diagnostics or remote task needs a session with the OMOP \
                 tables (plan it in an epifusion session, or send the tables with it)",
                spec.function()
            ));
        }
        let projected = match &projection {
            Some(p) => Arc::new(schema.project(p)?),
            None => schema.clone(),
        };
        let partitions = match work {
            Work::SccsPart(..) => children[3].output_partitioning().partition_count(),
            _ => 1,
        };
        let properties = Arc::new(PlanProperties::new(
            EquivalenceProperties::new(projected),
            Partitioning::UnknownPartitioning(partitions),
            EmissionType::Final,
            Boundedness::Bounded,
        ));
        let input_orderings = children
            .iter()
            .map(|c| c.output_ordering().cloned())
            .collect();
        Ok(EpiExec {
            spec,
            work,
            children,
            schema,
            projection,
            study_context,
            properties,
            global: SharedGlobal::default(),
            input_orderings,
        })
    }

    /// The work and full output schema of a node that is a SQL function's.
    fn work_of(
        spec: &NodeSpec,
        role: SqlRole,
        children: &[Arc<dyn ExecutionPlan>],
    ) -> DfResult<(Work, SchemaRef)> {
        Ok(match (spec, role) {
            (NodeSpec::Fit { function, options }, SqlRole::Fit(model)) => {
                let work = crate::fit_table::FitWork::parse(function, model, options)?;
                let schema = work.schema();
                (Work::Fit(Box::new(work)), schema)
            }
            (NodeSpec::EmpiricalNull, SqlRole::EmpiricalNull) => {
                (Work::EmpiricalNull, crate::calibration::null_schema())
            }
            (NodeSpec::CalibrateEstimates, SqlRole::CalibrateEstimates) => (
                Work::CalibrateEstimates,
                crate::calibration::calibrated_schema(&children[1].schema())?,
            ),
            (NodeSpec::Cohort { function, settings }, SqlRole::Cohort(part)) => {
                let work = crate::cohort_ps::CohortWork::parse(function, part, settings)?;
                if children.len() != work.inputs() {
                    return Err(plan_datafusion_err!(
                        "{function} takes {} input plans, got {}",
                        work.inputs(),
                        children.len()
                    ));
                }
                let schema = work.schema(&children[0].schema())?;
                (Work::Cohort(work), schema)
            }
            (
                NodeSpec::Study {
                    function, settings, ..
                },
                SqlRole::Study(design, part),
            ) => {
                let work =
                    crate::study::functions::StudyWork::parse(function, design, part, settings)?;
                let schema = work.schema();
                (Work::Study(work), schema)
            }
            (
                NodeSpec::Study {
                    function, settings, ..
                },
                SqlRole::SccsDiagnostics(part),
            ) => {
                let work =
                    crate::study::diagnostics::DiagnosticsWork::parse(function, part, settings)?;
                let schema = work.schema();
                (Work::Diagnostics(work), schema)
            }
            (
                NodeSpec::SccsPart { settings, .. } | NodeSpec::SccsMerge { settings, .. },
                SqlRole::Study(Design::Sccs, part),
            ) => {
                let d = crate::study::SccsDesign::from_json(settings)?;
                d.check()?;
                let d = Arc::new(d);
                if let NodeSpec::SccsPart { .. } = spec {
                    (
                        Work::SccsPart(d, part),
                        crate::study::sccs_parts::pieces_schema(),
                    )
                } else {
                    let needs = if part == Part::CovariateRef { 3 } else { 4 };
                    if children.len() != needs {
                        return Err(plan_datafusion_err!(
                            "{}: the merge takes {needs} input plans, got {}",
                            spec.function(),
                            children.len()
                        ));
                    }
                    (
                        Work::SccsMerge(d, part),
                        crate::study::sccs_parts::part_schema(part),
                    )
                }
            }
            (NodeSpec::DiagnosticsMerge { function, settings }, SqlRole::SccsDiagnostics(part)) => {
                let work =
                    crate::study::diagnostics::DiagnosticsWork::parse(function, part, settings)?;
                let needs = work.input_queries()?.len();
                if children.len() != needs {
                    return Err(plan_datafusion_err!(
                        "{function}: the merge takes {needs} input plans, got {}",
                        children.len()
                    ));
                }
                let schema = work.schema();
                (Work::DiagnosticsMerge(work), schema)
            }
            (NodeSpec::CohortMerge { settings, .. }, SqlRole::Study(Design::Cohort, part)) => {
                let d = crate::study::CohortDesign::from_json(settings)?;
                d.check()?;
                let needs = crate::study::cohort_parts::input_count(&d, part);
                if children.len() != needs {
                    return Err(plan_datafusion_err!(
                        "{}: the merge takes {needs} input plans, got {}",
                        spec.function(),
                        children.len()
                    ));
                }
                let schema = crate::study::cohort_parts::part_schema(&d, part);
                (Work::CohortMerge(Arc::new(d), part), schema)
            }
            _ => {
                return Err(plan_datafusion_err!(
                    "`{}` is not a function of this node kind",
                    spec.function()
                ))
            }
        })
    }

    /// What the node computes.
    pub fn spec(&self) -> &NodeSpec {
        &self.spec
    }

    /// The output projection (indices into the function's full table).
    pub fn projection(&self) -> Option<&Vec<usize>> {
        self.projection.as_ref()
    }

    async fn run(
        work: Work,
        children: Vec<Arc<dyn ExecutionPlan>>,
        schema: SchemaRef,
        study_context: Option<SessionContext>,
        tables: Option<(String, StudyInputs)>,
        (partition, global): (usize, SharedGlobal),
        context: Arc<TaskContext>,
    ) -> DfResult<RecordBatch> {
        match work {
            Work::Fit(w) => {
                let covariates = children.get(1).cloned();
                w.run(children[0].clone(), covariates, context).await
            }
            Work::EmpiricalNull => {
                crate::calibration::run_empirical_null(&schema, children[0].clone(), context).await
            }
            Work::CalibrateEstimates => {
                crate::calibration::run_calibration(
                    &schema,
                    children[0].clone(),
                    children[1].clone(),
                    context,
                )
                .await
            }
            Work::Study(w) => {
                in_build_session(tables, study_context, &context, |ctx| w.run(ctx)).await
            }
            Work::Diagnostics(w) => {
                in_build_session(tables, study_context, &context, |ctx| w.run(ctx)).await
            }
            Work::Cohort(w) => w.run(&schema, children, context).await,
            Work::SccsPart(d, part) => {
                let g = global
                    .get_or_init(|| async {
                        let small = match read_small(&children[..3], &context).await {
                            Ok(small) => small,
                            Err(e) => return Err(Arc::new(e)),
                        };
                        run_blocking(move || {
                            crate::study::sccs_parts::global(&d, &small[0], &small[1], &small[2])
                                .map(Arc::new)
                        })
                        .await
                        .map_err(Arc::new)
                    })
                    .await
                    .clone()
                    .map_err(datafusion::error::DataFusionError::Shared)?;
                let rows = read_partition(&children[3], partition, &context).await?;
                let pieces = run_blocking(move || {
                    crate::study::sccs_parts::split_partition(&g, &rows, part == Part::Covariates)
                })
                .await?;
                Ok(datafusion::arrow::compute::concat_batches(
                    &crate::study::sccs_parts::pieces_schema(),
                    &pieces,
                )?)
            }
            Work::SccsMerge(d, part) => {
                let small = read_small(&children[..3], &context).await?;
                let pieces = match children.get(3) {
                    Some(c) => read_partition(c, 0, &context).await?,
                    None => Vec::new(),
                };
                run_blocking(move || {
                    let g = crate::study::sccs_parts::global(&d, &small[0], &small[1], &small[2])?;
                    crate::study::sccs_parts::merge(g, part, &pieces)
                })
                .await
            }
            Work::DiagnosticsMerge(w) => {
                let inputs = read_small(&children, &context).await?;
                w.run_gathered(inputs).await
            }
            Work::CohortMerge(d, part) => {
                let inputs = read_small(&children, &context).await?;
                run_blocking(move || crate::study::cohort_parts::merge(&d, part, &inputs)).await
            }
            Work::Task(kind, payload, names) => {
                let runner = crate::remote_task::runner(&kind)?;
                // A result without rows still has its query's schema (one empty batch).
                let results = read_small(&children, &context).await?;
                let inputs: crate::remote_task::Parts = names
                    .into_iter()
                    .zip(children.iter().zip(results))
                    .map(|(name, (child, mut batches))| {
                        if batches.is_empty() {
                            batches.push(RecordBatch::new_empty(child.schema()));
                        }
                        (name, batches)
                    })
                    .collect();
                let parts = in_build_session(tables, study_context, &context, |ctx| {
                    runner(ctx, payload, inputs)
                })
                .await?;
                crate::remote_task::encode(&parts)
            }
        }
    }
}

/// Every batch of partition `partition` of `plan`.
async fn read_partition(
    plan: &Arc<dyn ExecutionPlan>,
    partition: usize,
    context: &Arc<TaskContext>,
) -> DfResult<Vec<RecordBatch>> {
    let stream = plan.execute(partition, context.clone())?;
    datafusion::physical_plan::common::collect(stream).await
}

/// The whole result of each of `plans` (each has one partition: the node asks for that).
async fn read_small(
    plans: &[Arc<dyn ExecutionPlan>],
    context: &Arc<TaskContext>,
) -> DfResult<Vec<Vec<RecordBatch>>> {
    let mut out = Vec::with_capacity(plans.len());
    for p in plans {
        let n = p.output_partitioning().partition_count();
        let mut batches = Vec::new();
        for i in 0..n {
            batches.extend(read_partition(p, i, context).await?);
        }
        out.push(batches);
    }
    Ok(out)
}

/// Run CPU work on a blocking thread (never on a tokio worker).
async fn run_blocking<T: Send + 'static>(
    work: impl FnOnce() -> DfResult<T> + Send + 'static,
) -> DfResult<T> {
    crate::fit_table::blocking("epifusion", work).await
}

/// Run a study build, diagnostics or remote task in its session: one over the tables that a
/// cluster client sent with it (carried as plans; errors then say which table of the client's
/// session broke), otherwise the session that planned it.
async fn in_build_session<T, F, Fut>(
    tables: Option<(String, StudyInputs)>,
    study_context: Option<SessionContext>,
    context: &Arc<TaskContext>,
    run: F,
) -> DfResult<T>
where
    F: FnOnce(SessionContext) -> Fut,
    Fut: std::future::Future<Output = DfResult<T>>,
{
    match tables {
        Some((function, tables)) => run(tables.session(context)?)
            .await
            .map_err(|e| tables.explain(&function, e)),
        None => {
            let ctx = study_context.ok_or_else(|| {
                exec_datafusion_err!(
                    "a study build, diagnostics or remote task needs a session with the OMOP tables"
                )
            })?;
            run(ctx).await
        }
    }
}

impl DisplayAs for EpiExec {
    fn fmt_as(&self, _t: DisplayFormatType, f: &mut fmt::Formatter) -> fmt::Result {
        write!(f, "EpiExec: {}", self.spec.function())?;
        match self.spec {
            NodeSpec::SccsPart { .. } => write!(f, " (pieces by person)")?,
            NodeSpec::SccsMerge { .. }
            | NodeSpec::CohortMerge { .. }
            | NodeSpec::DiagnosticsMerge { .. } => write!(f, " (merge)")?,
            _ => {}
        }
        if let Some(p) = &self.projection {
            write!(f, ", projection={p:?}")?;
        }
        Ok(())
    }
}

impl ExecutionPlan for EpiExec {
    fn name(&self) -> &str {
        "EpiExec"
    }

    fn properties(&self) -> &Arc<PlanProperties> {
        &self.properties
    }

    fn children(&self) -> Vec<&Arc<dyn ExecutionPlan>> {
        self.children.iter().collect()
    }

    /// A fit streams its inputs' partitions one after another in partition order
    /// ([`crate::fit_table::stream_inputs`]): no coalescing node in front, which would
    /// interleave the partitions' batches (a file's increasing row ids would arrive out of
    /// order, and the design builder would fall back to a hash map). Every other node collects
    /// its inputs whole.
    fn required_input_distribution(&self) -> Vec<Distribution> {
        let each = match self.work {
            Work::Fit(_) => Distribution::UnspecifiedDistribution,
            _ => Distribution::SinglePartition,
        };
        let mut all = vec![each; self.children.len()];
        if let (Work::SccsPart(..), Some(rows)) = (&self.work, self.children.get(3)) {
            // Every row of a person in one partition.
            if let Ok(person) = Column::new_with_schema("person_id", &rows.schema()) {
                all[3] = Distribution::KeyPartitioned(vec![Arc::new(person)]);
            }
        }
        all
    }

    /// No round-robin repartitioning in front of a fit either (it would reorder rows).
    fn benefits_from_input_partitioning(&self) -> Vec<bool> {
        vec![false; self.children.len()]
    }

    fn required_input_ordering(&self) -> Vec<Option<OrderingRequirements>> {
        match self.work {
            Work::Task(..) => self
                .input_orderings
                .iter()
                .map(|o| o.clone().map(OrderingRequirements::from))
                .collect(),
            _ => vec![None; self.children.len()],
        }
    }

    fn apply_expressions(
        &self,
        _f: &mut dyn FnMut(&Arc<dyn PhysicalExpr>) -> DfResult<TreeNodeRecursion>,
    ) -> DfResult<TreeNodeRecursion> {
        Ok(TreeNodeRecursion::Continue)
    }

    fn with_new_children(
        self: Arc<Self>,
        children: Vec<Arc<dyn ExecutionPlan>>,
    ) -> DfResult<Arc<dyn ExecutionPlan>> {
        let mut node = EpiExec::try_new(
            self.spec.clone(),
            children,
            self.projection.clone(),
            self.study_context.clone(),
        )?;
        // The orderings the node was planned with stay its requirement (an optimizer that
        // swaps a child keeps its order, or adds a sort for it).
        if node.input_orderings.len() == self.input_orderings.len() {
            node.input_orderings = self.input_orderings.clone();
        }
        Ok(Arc::new(node))
    }

    fn execute(
        &self,
        partition: usize,
        context: Arc<TaskContext>,
    ) -> DfResult<SendableRecordBatchStream> {
        let partitions = self.properties.output_partitioning().partition_count();
        if partition >= partitions {
            return Err(exec_datafusion_err!(
                "EpiExec has {partitions} partition(s), asked for partition {partition}"
            ));
        }
        let out_schema = self.properties.eq_properties.schema().clone();
        let tables = match &self.spec {
            NodeSpec::Study {
                function, tables, ..
            }
            | NodeSpec::Task {
                kind: function,
                tables,
                ..
            } if !tables.is_empty() => Some((function.clone(), tables.clone())),
            _ => None,
        };
        let batch = Self::run(
            self.work.clone(),
            self.children.clone(),
            self.schema.clone(),
            self.study_context.clone(),
            tables,
            (partition, self.global.clone()),
            context,
        );
        let projection = self.projection.clone();
        let fut = async move {
            let batch = batch.await?;
            match projection {
                Some(p) => Ok(batch.project(&p)?),
                None => Ok(batch),
            }
        };
        Ok(Box::pin(RecordBatchStreamAdapter::new(
            out_schema,
            futures::stream::once(fut),
        )))
    }
}

/// The wire form of an [`EpiExec`] (its children travel as datafusion-proto inputs).
#[derive(Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct WireNode {
    /// The epifusion version that encoded it: nodes of another version are refused.
    version: String,
    spec: NodeSpec,
    projection: Option<Vec<usize>>,
}

/// The datafusion-proto extension codec of epifusion's plan nodes: an [`EpiExec`] is encoded as
/// JSON (its [`NodeSpec`], projection and the epifusion version); decoding refuses a node from
/// another epifusion version with an error naming both versions.
#[derive(Debug, Default, Clone)]
pub struct EpiCodec {
    /// The catalogs study builds read on the decoding side (none: study nodes are refused).
    catalog: Option<Arc<dyn CatalogProviderList>>,
}

impl EpiCodec {
    /// A codec whose decoded study builds read the tables of `catalog`.
    pub fn with_catalog(catalog: Arc<dyn CatalogProviderList>) -> Self {
        EpiCodec {
            catalog: Some(catalog),
        }
    }

    fn study_context(&self, task: &TaskContext) -> DfResult<SessionContext> {
        let catalog = self.catalog.clone().ok_or_else(|| {
            exec_datafusion_err!(
                "a study build was sent to a node without the OMOP tables (this node's codec has \
                 no catalog)"
            )
        })?;
        let mut state = SessionStateBuilder::new()
            .with_config(crate::planning::shared_catalog_config(
                task.session_config(),
                catalog.as_ref(),
            ))
            .with_runtime_env(task.runtime_env())
            .with_default_features()
            .with_catalog_list(catalog)
            .build();
        state = crate::unnest_keys::guard_state(state);
        crate::session::register_table_functions(&mut state);
        Ok(SessionContext::new_with_state(state))
    }
}

/// This build's version string, carried by every encoded node.
pub const WIRE_VERSION: &str = env!("CARGO_PKG_VERSION");

impl PhysicalExtensionCodec for EpiCodec {
    fn try_decode(
        &self,
        buf: &[u8],
        inputs: &[Arc<dyn ExecutionPlan>],
        ctx: &TaskContext,
        _proto_converter: &dyn PhysicalProtoConverterExtension,
    ) -> DfResult<Arc<dyn ExecutionPlan>> {
        let wire: WireNode = serde_json::from_slice(buf)
            .map_err(|e| exec_datafusion_err!("not an epifusion plan node: {e}"))?;
        if wire.version != WIRE_VERSION {
            return Err(exec_datafusion_err!(
                "an epifusion plan node from version {} cannot run on epifusion {}: run the \
                 same version on every node",
                wire.version,
                WIRE_VERSION
            ));
        }
        // A study build reads the tables it carries (a cluster client's), else this node's
        // catalog.
        let study_context = match &wire.spec {
            NodeSpec::Study { tables, .. } if tables.is_empty() => Some(self.study_context(ctx)?),
            _ => None,
        };
        Ok(Arc::new(EpiExec::try_new(
            wire.spec,
            inputs.to_vec(),
            wire.projection,
            study_context,
        )?))
    }

    fn try_encode(
        &self,
        node: Arc<dyn ExecutionPlan>,
        buf: &mut Vec<u8>,
        _proto_converter: &dyn PhysicalProtoConverterExtension,
    ) -> DfResult<()> {
        if let Some(n) = node.downcast_ref::<EpiExec>() {
            let wire = WireNode {
                version: WIRE_VERSION.to_string(),
                spec: n.spec.clone(),
                projection: n.projection.clone(),
            };
            serde_json::to_writer(buf, &wire)
                .map_err(|e| exec_datafusion_err!("encoding an epifusion plan node: {e}"))?;
            return Ok(());
        }
        if let Some(n) = node.downcast_ref::<crate::fit_table::OneBatchExec>() {
            return Err(exec_datafusion_err!(
                "{} runs in the session that planned it and cannot be sent to another node \
                 (a design matrix kept by design_matrix lives in that session's memory)",
                n.label()
            ));
        }
        Err(exec_datafusion_err!(
            "not an epifusion plan node: {}",
            node.name()
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::session::{new_session, SessionOptions};
    use datafusion::physical_plan::collect;
    use datafusion_proto::bytes::{
        physical_plan_from_bytes_with_extension_codec, physical_plan_to_bytes_with_extension_codec,
    };

    async fn session() -> SessionContext {
        let ctx = new_session(&SessionOptions::default()).await.unwrap();
        ctx.sql(
            "CREATE TABLE d AS SELECT * FROM (VALUES \
             (0, 1.0, 0.5), (1, 2.0, 1.5), (0, 0.5, 2.0), (1, 1.5, 0.2), (1, 3.0, 1.0), \
             (0, 0.2, 0.1), (1, 2.5, 2.5), (0, 1.1, 0.3), (0, 0.7, 1.7), (1, 1.9, 0.9)) \
             AS t(y, x1, x2)",
        )
        .await
        .unwrap();
        ctx
    }

    /// Encode `plan` with `codec`, decode it in `ctx` and return the decoded plan.
    fn round_trip(
        plan: Arc<dyn ExecutionPlan>,
        ctx: &SessionContext,
        codec: &EpiCodec,
    ) -> DfResult<Arc<dyn ExecutionPlan>> {
        let bytes = physical_plan_to_bytes_with_extension_codec(plan, codec)?;
        physical_plan_from_bytes_with_extension_codec(&bytes, &ctx.task_ctx(), codec)
    }

    /// The batches without the `seconds` column (a wall-clock time).
    fn without_timing(batches: &[RecordBatch]) -> Vec<RecordBatch> {
        batches
            .iter()
            .map(|b| {
                let keep: Vec<usize> = (0..b.num_columns())
                    .filter(|&i| b.schema().field(i).name() != "seconds")
                    .collect();
                b.project(&keep).unwrap()
            })
            .collect()
    }

    async fn plan_of(ctx: &SessionContext, sql: &str) -> Arc<dyn ExecutionPlan> {
        ctx.sql(sql)
            .await
            .unwrap()
            .create_physical_plan()
            .await
            .unwrap()
    }

    #[tokio::test]
    async fn fits_and_calibrations_travel_through_the_codec() {
        let ctx = session().await;
        let codec = EpiCodec::default();
        for sql in [
            "SELECT covariate, estimate, std_error FROM logistic_fit('SELECT y, x1, x2 FROM d', \
             '{\"prior\": \"normal\", \"variance\": 4}')",
            "SELECT * FROM logistic_fit('SELECT y, x1 FROM d WHERE x2 > 0.2')",
            "SELECT mean, sd FROM empirical_null('SELECT x1 - 1.2 AS log_rr, x2 + 0.1 AS \
             se_log_rr FROM d')",
            "SELECT calibrated_p FROM calibrate_estimates('SELECT x1 AS log_rr, x2 + 0.1 AS \
             se_log_rr FROM d', 'SELECT x1 - 1.2 AS log_rr, x2 + 0.1 AS se_log_rr FROM d')",
            "SELECT row_id, propensity_score, preference_score FROM cohort_propensity_scores(\
             'SELECT CAST(x1 * 10 AS BIGINT) AS row_id, y AS treatment FROM d', 'SELECT \
             CAST(x1 * 10 AS BIGINT) AS row_id, 1 AS covariate_id FROM d WHERE x2 > 1', \
             '{\"variance\": 1}')",
            "SELECT * FROM cohort_match('SELECT CAST(x1 * 10 AS BIGINT) AS row_id, y AS \
             treatment, x2 / 3 AS propensity_score, x1 FROM d', '{\"caliper\": 0}')",
            "SELECT row_id, stratum_id FROM cohort_stratify('SELECT CAST(x1 * 10 AS BIGINT) AS \
             row_id, y AS treatment, x2 / 3 AS propensity_score FROM d')",
            "SELECT * FROM cohort_balance('SELECT CAST(x1 * 10 AS BIGINT) AS row_id, y AS \
             treatment, x2 AS weight FROM d WHERE x1 > 0.5', 'SELECT CAST(x1 * 10 AS BIGINT) AS \
             row_id, 1 AS covariate_id FROM d WHERE x2 > 1', '{\"before\": \"SELECT CAST(x1 * \
             10 AS BIGINT) AS row_id, y AS treatment FROM d\"}')",
        ] {
            let plan = plan_of(&ctx, sql).await;
            let here = collect(plan.clone(), ctx.task_ctx()).await.unwrap();
            let back = round_trip(plan, &ctx, &codec).unwrap();
            // The decoded plan holds an EpiExec rebuilt from its spec.
            let shown = datafusion::physical_plan::displayable(back.as_ref())
                .indent(false)
                .to_string();
            assert!(shown.contains("EpiExec"), "{shown}");
            let there = collect(back, ctx.task_ctx()).await.unwrap();
            assert_eq!(without_timing(&here), without_timing(&there), "{sql}");
        }
    }

    /// An SCCS outcome table in `parts` partitions (rows 1..=n in order, split evenly) and its
    /// covariates, registered as `o{parts}` and `c{parts}`.
    fn register_split_sccs(ctx: &SessionContext, parts: usize) {
        use datafusion::arrow::array::{Float64Array, Int64Array};
        use datafusion::arrow::datatypes::{DataType, Field, Schema};
        use datafusion::datasource::MemTable;
        let n = 24i64;
        let schema = Arc::new(Schema::new(vec![
            Field::new("row_id", DataType::Int64, false),
            Field::new("stratum_id", DataType::Int64, false),
            Field::new("time", DataType::Float64, false),
            Field::new("y", DataType::Float64, false),
        ]));
        let cov_schema = Arc::new(Schema::new(vec![
            Field::new("row_id", DataType::Int64, false),
            Field::new("covariate_id", DataType::Int64, false),
        ]));
        let per = n as usize / parts;
        let (mut outcomes, mut covariates) = (Vec::new(), Vec::new());
        for p in 0..parts {
            let ids: Vec<i64> = (1 + (p * per) as i64..=((p + 1) * per) as i64).collect();
            let col = |f: &dyn Fn(i64) -> f64| {
                Arc::new(Float64Array::from(
                    ids.iter().map(|&i| f(i)).collect::<Vec<_>>(),
                ))
            };
            outcomes.push(vec![RecordBatch::try_new(
                schema.clone(),
                vec![
                    Arc::new(Int64Array::from(ids.clone())),
                    Arc::new(Int64Array::from(
                        ids.iter().map(|i| (i - 1) / 4).collect::<Vec<_>>(),
                    )),
                    col(&|i| (10 + i % 7) as f64),
                    col(&|i| f64::from(i % 3 == 0)),
                ],
            )
            .unwrap()]);
            // Covariates in reverse order within each partition.
            let cov_rows: Vec<i64> = ids.iter().rev().filter(|&&i| i % 2 == 0).copied().collect();
            covariates.push(vec![RecordBatch::try_new(
                cov_schema.clone(),
                vec![
                    Arc::new(Int64Array::from(cov_rows.clone())),
                    Arc::new(Int64Array::from(
                        cov_rows.iter().map(|i| 1 + i % 4 / 2).collect::<Vec<_>>(),
                    )),
                ],
            )
            .unwrap()]);
        }
        let table = |schema, parts| Arc::new(MemTable::try_new(schema, parts).unwrap());
        ctx.register_table(format!("o{parts}"), table(schema, outcomes))
            .unwrap();
        ctx.register_table(format!("c{parts}"), table(cov_schema, covariates))
            .unwrap();
    }

    #[tokio::test]
    async fn fits_stream_their_inputs_in_partition_order() {
        let ctx = session().await;
        register_split_sccs(&ctx, 1);
        register_split_sccs(&ctx, 3);
        let sql = |parts: usize| {
            format!(
                "SELECT * FROM sccs_fit('o{parts}', 'c{parts}', '{{\"variance\": 1, \"ci\": \
                 \"wald\"}}')"
            )
        };
        // No coalescing or repartitioning node in front of the fit: its children keep their
        // partitions, which the fit reads one after another.
        let plan = plan_of(&ctx, &sql(3)).await;
        let shown = datafusion::physical_plan::displayable(plan.as_ref())
            .indent(false)
            .to_string();
        assert!(shown.contains("EpiExec"), "{shown}");
        assert!(!shown.contains("Coalesce"), "{shown}");
        assert!(!shown.contains("Repartition"), "{shown}");
        let child = plan
            .children()
            .first()
            .map(|c| (*c).clone())
            .expect("the fit reads its outcomes");
        assert_eq!(child.properties().partitioning.partition_count(), 3);
        // The streamed outcomes arrive in partition order: row ids 1..=24, increasing.
        let (inputs, feeder) = crate::fit_table::stream_inputs(child, None, ctx.task_ctx());
        let reader = datafusion::common::runtime::SpawnedTask::spawn_blocking(move || {
            let read = crate::convert::ReadOptions::default();
            inputs.design(&read).map(|x| x.rows.row_id.to_vec())
        });
        feeder.await.unwrap();
        let ids = reader.join().await.unwrap().unwrap();
        assert_eq!(ids, (1..=24).collect::<Vec<i64>>());
        // Same fit, bit for bit, from one partition.
        let split = collect(plan, ctx.task_ctx()).await.unwrap();
        let whole = collect(plan_of(&ctx, &sql(1)).await, ctx.task_ctx())
            .await
            .unwrap();
        assert_eq!(without_timing(&split), without_timing(&whole));
        assert_eq!(split[0].num_rows(), 2);
    }

    #[tokio::test]
    async fn a_failing_input_plan_fails_the_streamed_fit() {
        let ctx = session().await;
        register_split_sccs(&ctx, 3);
        // The covariate query fails on its last partition (a cast of a non-number), after the
        // outcomes were read: the fit reports the query's error.
        let e = collect(
            plan_of(
                &ctx,
                "SELECT * FROM sccs_fit('o3', 'SELECT row_id, CAST(CASE WHEN row_id > 20 THEN \
                 ''x'' ELSE ''1'' END AS BIGINT) AS covariate_id FROM c3', '{\"variance\": 1}')",
            )
            .await,
            ctx.task_ctx(),
        )
        .await
        .unwrap_err()
        .to_string();
        assert!(e.contains("Cast") || e.contains("cast"), "{e}");
    }

    #[tokio::test]
    async fn a_decoded_node_checks_its_options_again() {
        let ctx = session().await;
        let plan = plan_of(&ctx, "SELECT * FROM logistic_fit('SELECT y, x1 FROM d')").await;
        let bytes = physical_plan_to_bytes_with_extension_codec(plan, &EpiCodec::default())
            .unwrap()
            .to_vec();
        // Tamper with the options inside the encoded node: the receiving side refuses them.
        let text = String::from_utf8_lossy(&bytes).to_string();
        assert!(text.contains("\"options\":\"\""), "{text}");
        let tampered = text.replace("\"options\":\"\"", "\"options\":\"{\\\"priorr\\\": 1}\"");
        let e = physical_plan_from_bytes_with_extension_codec(
            tampered.as_bytes(),
            &ctx.task_ctx(),
            &EpiCodec::default(),
        );
        // (The lengths inside the protobuf no longer match, or the options are refused: either
        // way, nothing runs.)
        assert!(e.is_err());
        let wire = WireNode {
            version: WIRE_VERSION.to_string(),
            spec: NodeSpec::Fit {
                function: "logistic_fit".into(),
                options: "{\"priorr\": 1}".into(),
            },
            projection: None,
        };
        let codec = EpiCodec::default();
        let conv = datafusion_proto::physical_plan::DefaultPhysicalProtoConverter {};
        let child = plan_of(&ctx, "SELECT y, x1 FROM d").await;
        let e = codec
            .try_decode(
                &serde_json::to_vec(&wire).unwrap(),
                &[child],
                &ctx.task_ctx(),
                &conv,
            )
            .unwrap_err()
            .to_string();
        assert!(e.contains("priorr"), "{e}");
    }

    #[tokio::test]
    async fn another_version_is_refused() {
        let ctx = session().await;
        let wire = WireNode {
            version: "0.0.1-other".into(),
            spec: NodeSpec::EmpiricalNull,
            projection: None,
        };
        let child = plan_of(&ctx, "SELECT x1 AS log_rr, x2 AS se_log_rr FROM d").await;
        let conv = datafusion_proto::physical_plan::DefaultPhysicalProtoConverter {};
        let e = EpiCodec::default()
            .try_decode(
                &serde_json::to_vec(&wire).unwrap(),
                &[child],
                &ctx.task_ctx(),
                &conv,
            )
            .unwrap_err()
            .to_string();
        assert!(e.contains("0.0.1-other") && e.contains(WIRE_VERSION), "{e}");
    }

    #[tokio::test]
    async fn stored_design_matrices_stay_in_their_session() {
        let ctx = session().await;
        ctx.sql("SELECT * FROM design_matrix('SELECT y, x1 FROM d', '{\"name\": \"m\"}')")
            .await
            .unwrap()
            .collect()
            .await
            .unwrap();
        let plan = plan_of(&ctx, "SELECT * FROM logistic_fit('@m')").await;
        let e = physical_plan_to_bytes_with_extension_codec(plan, &EpiCodec::default())
            .unwrap_err()
            .to_string();
        assert!(e.contains("design_matrix"), "{e}");
    }

    #[tokio::test]
    async fn study_nodes_need_a_catalog_on_the_receiving_side() {
        let ctx = session().await;
        let plan = plan_of(
            &ctx,
            "SELECT * FROM sccs_attrition('{\"outcome\": {\"concept_ids\": [1]}, \
             \"exposures\": [{\"concept_ids\": [2]}]}')",
        )
        .await;
        let e = round_trip(plan.clone(), &ctx, &EpiCodec::default())
            .unwrap_err()
            .to_string();
        assert!(e.contains("OMOP tables"), "{e}");
        let codec = EpiCodec::with_catalog(ctx.state().catalog_list().clone());
        let back = round_trip(plan, &ctx, &codec).unwrap();
        assert!(datafusion::physical_plan::displayable(back.as_ref())
            .indent(false)
            .to_string()
            .contains("EpiExec: sccs_attrition"));
    }
}
