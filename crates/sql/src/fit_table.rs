//! Table functions that fit a model and return one row per coefficient:
//! `sccs_fit`, `cox_fit`, `fine_gray_fit`, `logistic_fit`, `poisson_fit`,
//! `conditional_logistic_fit`.
//!
//! ```sql
//! -- long format: outcomes and covariates as table names or queries, options as JSON
//! SELECT * FROM cox_fit('outcomes', 'covariates', '{"prior": "laplace", "variance": 0.1, "exclude": [1]}');
//! -- wide format: every non-reserved numeric column is a covariate named by its column
//! SELECT covariate, estimate, std_error FROM cox_fit('SELECT time, status - 1 AS y, age, sex FROM lung');
//! ```
//!
//! Arguments: `outcomes` [, `covariates`] [, `options`]. A table argument is a table name or a
//! SQL query; an argument that starts with `{` is the JSON options object (see
//! [`crate::options`]). The inner queries are planned in `scan`; in `execute` their batches
//! stream into the design matrix (partition by partition, in partition order:
//! [`stream_inputs`]) and the model is fitted, on a blocking thread (never on a tokio worker).

use std::fmt;
use std::sync::Arc;

use async_trait::async_trait;
use datafusion::arrow::datatypes::SchemaRef;
use datafusion::arrow::record_batch::RecordBatch;
use datafusion::catalog::{Session, TableFunctionArgs, TableFunctionImpl, TableProvider};
use datafusion::common::tree_node::TreeNodeRecursion;
use datafusion::common::{
    exec_datafusion_err, plan_err, DataFusionError, Result as DfResult, ScalarValue,
};
use datafusion::datasource::TableType;
use datafusion::execution::{SendableRecordBatchStream, TaskContext};
use datafusion::logical_expr::Expr;
use datafusion::physical_expr::{EquivalenceProperties, PhysicalExpr};
use datafusion::physical_plan::execution_plan::{Boundedness, EmissionType};
use datafusion::physical_plan::stream::RecordBatchStreamAdapter;
use datafusion::physical_plan::{
    DisplayAs, DisplayFormatType, ExecutionPlan, Partitioning, PlanProperties,
};
use futures::future::BoxFuture;

use crate::convert::{self, BatchSource, ReadOptions};
use crate::design_table::DesignRegistry;
use crate::exec::{EpiExec, NodeSpec};
use crate::options::{parse_fit_options, parse_result_table, ResultTable};
use epifusion_core::fit::{fit_owned, FitOptions};
use epifusion_core::model::ModelKind;

/// Convert a library error into DataFusion's: option mistakes are planning errors, everything
/// else is an execution (data) error.
pub fn to_df_error(e: epifusion_core::Error) -> DataFusionError {
    match e {
        epifusion_core::Error::BadOption { .. } => DataFusionError::Plan(e.to_string()),
        other => DataFusionError::Execution(other.to_string()),
    }
}

/// The one conversion of core results across the SQL boundary ([`to_df_error`]); the orphan
/// rule forbids `From<epifusion_core::Error> for DataFusionError` in either crate.
pub trait IntoDfResult<T> {
    /// Convert the error: option mistakes are planning errors, the rest execution errors.
    fn into_df(self) -> DfResult<T>;
}

impl<T> IntoDfResult<T> for epifusion_core::Result<T> {
    fn into_df(self) -> DfResult<T> {
        self.map_err(to_df_error)
    }
}

/// A fitting table function for one model.
#[derive(Debug)]
pub struct FitTableFunction {
    name: &'static str,
    model: ModelKind,
    designs: Arc<DesignRegistry>,
}

impl FitTableFunction {
    /// The function for `model`, registered as `name`; `@name` arguments refer to matrices
    /// kept in `designs` by `design_matrix`.
    pub fn new(name: &'static str, model: ModelKind, designs: Arc<DesignRegistry>) -> Self {
        FitTableFunction {
            name,
            model,
            designs,
        }
    }
}

/// SQL for a table argument: a bare (possibly qualified) table name becomes `SELECT * FROM`.
pub fn table_sql(arg: &str) -> String {
    let t = arg.trim();
    let is_name = !t.is_empty()
        && t.split('.').all(|part| {
            let mut ch = part.chars();
            matches!(ch.next(), Some(c) if c.is_ascii_alphabetic() || c == '_')
                && ch.all(|c| c.is_ascii_alphanumeric() || c == '_')
        });
    if is_name {
        format!("SELECT * FROM {t}")
    } else {
        t.to_string()
    }
}

/// Check that a table argument (`position` is 1-based) is a table name or a query, not an
/// empty string or a JSON value that is not an object (options must be a JSON object).
pub fn check_table_arg(function: &str, position: usize, arg: &str) -> DfResult<()> {
    let t = arg.trim();
    if t.is_empty() {
        return plan_err!(
            "{function}: argument {position} is empty; expected a table name, a query or an \
             options JSON object"
        );
    }
    let json_scalar = matches!(t.to_ascii_lowercase().as_str(), "null" | "true" | "false")
        || t.starts_with('[')
        || t.starts_with('"')
        || t.parse::<f64>().is_ok();
    if json_scalar {
        return plan_err!(
            "{function}: argument {position} ({t}) is neither a table name nor a query; \
             options must be a JSON object, e.g. '{{\"prior\": \"laplace\"}}'"
        );
    }
    Ok(())
}

/// Extract string literal arguments, with clear arity and type errors.
pub fn string_args(function: &str, exprs: &[Expr], usage: &str) -> DfResult<Vec<String>> {
    if exprs.is_empty() || exprs.len() > 3 {
        return plan_err!(
            "{function} takes 1 to 3 arguments ({usage}), got {}",
            exprs.len()
        );
    }
    exprs
        .iter()
        .enumerate()
        .map(|(i, e)| match e {
            Expr::Literal(ScalarValue::Utf8(Some(s)), _)
            | Expr::Literal(ScalarValue::LargeUtf8(Some(s)), _)
            | Expr::Literal(ScalarValue::Utf8View(Some(s)), _) => Ok(s.clone()),
            Expr::Literal(v, _) if v.is_null() => {
                plan_err!(
                    "{function}: argument {} is NULL; expected a string ({usage})",
                    i + 1
                )
            }
            other => plan_err!(
                "{function}: argument {} must be a string literal ({usage}), got {other}",
                i + 1
            ),
        })
        .collect()
}

/// The parsed arguments of a fit call.
#[derive(Debug, Clone)]
pub struct FitCall {
    /// Outcome (or wide) query.
    pub outcomes: String,
    /// Covariate query (long format).
    pub covariates: Option<String>,
    /// Options.
    pub options: FitOptions,
    /// Which table to return (option `table`).
    pub table: ResultTable,
    /// The options JSON as written (what a plan node carries).
    pub options_json: String,
}

/// Parse `outcomes [, covariates] [, options]`.
pub fn parse_fit_call(function: &str, model: ModelKind, args: &[String]) -> DfResult<FitCall> {
    for (i, a) in args.iter().enumerate() {
        if !a.trim_start().starts_with('{') {
            check_table_arg(function, i + 1, a)?;
        }
    }
    let (tables, options): (Vec<&String>, Vec<&String>) =
        args.iter().partition(|a| !a.trim_start().starts_with('{'));
    if options.len() > 1 {
        return plan_err!("{function}: more than one options object");
    }
    if args
        .last()
        .is_some_and(|a| !a.trim_start().starts_with('{'))
        && !options.is_empty()
    {
        return plan_err!("{function}: the options object must be the last argument");
    }
    if tables.is_empty() || tables.len() > 2 {
        return plan_err!(
            "{function}: expected an outcomes table or query, optionally a covariates table or query"
        );
    }
    let json = options.first().map_or("", |s| s.as_str());
    let FitWork { options, table, .. } = FitWork::parse(function, model, json)?;
    Ok(FitCall {
        outcomes: table_sql(tables[0]),
        covariates: tables.get(1).map(|s| table_sql(s)),
        options,
        table,
        options_json: json.to_string(),
    })
}

impl TableFunctionImpl for FitTableFunction {
    fn call_with_args(&self, args: TableFunctionArgs) -> DfResult<Arc<dyn TableProvider>> {
        let usage = "outcomes [, covariates] [, options JSON]";
        let strings = string_args(self.name, args.exprs(), usage)?;
        let call = parse_fit_call(self.name, self.model, &strings)?;
        Ok(Arc::new(FitTable {
            function: self.name,
            model: self.model,
            call,
            designs: self.designs.clone(),
        }))
    }
}

/// The table a fit call produces.
#[derive(Debug)]
pub struct FitTable {
    function: &'static str,
    model: ModelKind,
    call: FitCall,
    designs: Arc<DesignRegistry>,
}

pub use crate::planning::plan_sql;

impl FitTable {
    /// The node spec and input queries of the call, for a plan sent to a cluster; a stored
    /// design matrix (`@name`) cannot leave its session.
    pub(crate) fn remote_call(&self) -> DfResult<(NodeSpec, Vec<String>)> {
        if let Some(name) = self.call.outcomes.strip_prefix('@') {
            return plan_err!(
                "{}: the design matrix @{name} lives in one session's memory and cannot be \
                 fitted on a cluster; pass its outcomes and covariates queries instead",
                self.function
            );
        }
        let mut inputs = vec![self.call.outcomes.clone()];
        inputs.extend(self.call.covariates.clone());
        let spec = NodeSpec::Fit {
            function: self.function.to_string(),
            options: self.call.options_json.clone(),
        };
        Ok((spec, inputs))
    }
}

#[async_trait]
impl TableProvider for FitTable {
    fn schema(&self) -> SchemaRef {
        convert::table_schema(self.call.table)
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
        let schema = convert::table_schema(self.call.table);
        let label = format!("{} ({})", self.function, self.model.name());
        let call = self.call.clone();
        // `@name`: a matrix kept by design_matrix(); nothing to plan or collect.
        if let Some(name) = self.call.outcomes.strip_prefix('@') {
            if self.call.covariates.is_some() {
                return plan_err!(
                    "{}: a stored design matrix (@{name}) takes no covariates argument",
                    self.function
                );
            }
            let design = self.designs.get(name).ok_or_else(|| {
                exec_datafusion_err!("no design matrix named `{name}`; create it with design_matrix(outcomes, covariates, '{{\"name\": \"{name}\"}}')")
            })?;
            let producer: BatchProducer = Arc::new(move |_ctx| {
                let (design, options, table) = (design.clone(), call.options.clone(), call.table);
                Box::pin(run_blocking("fit", move || {
                    epifusion_core::fit::fit(&design, &options)
                        .and_then(|r| convert::table_batch(&r, table))
                }))
            });
            return Ok(Arc::new(OneBatchExec::new(
                label, producer, schema, projection,
            )?));
        }
        let mut inputs = vec![plan_sql(state, &self.call.outcomes).await?];
        if let Some(sql) = &self.call.covariates {
            inputs.push(plan_sql(state, sql).await?);
        }
        let spec = NodeSpec::Fit {
            function: self.function.to_string(),
            options: self.call.options_json.clone(),
        };
        Ok(Arc::new(EpiExec::try_new(
            spec,
            inputs,
            projection.cloned(),
            None,
        )?))
    }
}

/// The checked options of a fit node: model, fit options and the table to return.
#[derive(Debug, Clone)]
pub struct FitWork {
    model: ModelKind,
    options: FitOptions,
    table: ResultTable,
}

impl FitWork {
    /// Parse and check `json` (empty: defaults) as `function`'s options for `model`.
    pub fn parse(_function: &str, model: ModelKind, json: &str) -> DfResult<Self> {
        let options = parse_fit_options(model, json).into_df()?;
        let table = parse_result_table(&options, json).into_df()?;
        Ok(FitWork {
            model,
            options,
            table,
        })
    }

    /// The schema of the table the fit returns.
    pub fn schema(&self) -> SchemaRef {
        convert::table_schema(self.table)
    }

    /// Collect the inputs, fit and return the result batch.
    pub async fn run(
        self,
        outcomes: Arc<dyn ExecutionPlan>,
        covariates: Option<Arc<dyn ExecutionPlan>>,
        context: Arc<TaskContext>,
    ) -> DfResult<RecordBatch> {
        fit_from_plans(
            self.model,
            self.options,
            self.table,
            outcomes,
            covariates,
            context,
        )
        .await
    }
}

/// Produces the single result batch of a [`OneBatchExec`].
pub type BatchProducer =
    Arc<dyn Fn(Arc<TaskContext>) -> BoxFuture<'static, DfResult<RecordBatch>> + Send + Sync>;

/// Execution plan with one partition that emits one batch made by a producer: for work that
/// stays in the session that planned it (a fit of a design matrix kept by `design_matrix`,
/// `design_matrix` itself). Everything that can travel is an [`EpiExec`].
pub struct OneBatchExec {
    label: String,
    producer: BatchProducer,
    projection: Option<Vec<usize>>,
    properties: Arc<PlanProperties>,
}

impl fmt::Debug for OneBatchExec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("OneBatchExec")
            .field("label", &self.label)
            .finish()
    }
}

impl OneBatchExec {
    /// What the node computes (for errors and plans).
    pub fn label(&self) -> &str {
        &self.label
    }

    /// A plan emitting `producer`'s batch (of `schema`), projected to `projection`.
    pub fn new(
        label: String,
        producer: BatchProducer,
        schema: SchemaRef,
        projection: Option<&Vec<usize>>,
    ) -> DfResult<Self> {
        let projected = match projection {
            Some(p) => Arc::new(schema.project(p)?),
            None => schema,
        };
        let properties = Arc::new(PlanProperties::new(
            EquivalenceProperties::new(projected),
            Partitioning::UnknownPartitioning(1),
            EmissionType::Final,
            Boundedness::Bounded,
        ));
        Ok(OneBatchExec {
            label,
            producer,
            projection: projection.cloned(),
            properties,
        })
    }
}

impl DisplayAs for OneBatchExec {
    fn fmt_as(&self, _t: DisplayFormatType, f: &mut fmt::Formatter) -> fmt::Result {
        write!(f, "OneBatchExec: {}", self.label)
    }
}

/// One input table of a table function: batches in memory, or a channel its plan's partitions
/// are streamed into ([`stream_inputs`]).
enum InputTable {
    Batches(SchemaRef, Vec<RecordBatch>),
    /// The schema, the channel, and the plan's exact row count when its statistics know it.
    Stream(
        SchemaRef,
        tokio::sync::mpsc::Receiver<ArrowResult<RecordBatch>>,
        Option<usize>,
    ),
}

type ArrowResult<T> = std::result::Result<T, datafusion::arrow::error::ArrowError>;

impl InputTable {
    /// The batches as a [`BatchSource`]; a streamed table is read batch by batch (blocking:
    /// call this on a blocking thread, never on a tokio worker).
    fn source(self, label: &str) -> BatchSource {
        match self {
            InputTable::Batches(schema, batches) => {
                BatchSource::from_batches(label, schema, batches)
            }
            InputTable::Stream(schema, mut rx, rows) => BatchSource::from_iter(
                label,
                schema,
                std::iter::from_fn(move || rx.blocking_recv()),
            )
            .with_rows(rows),
        }
    }
}

/// The inputs of a table function: the outcome (or wide) table and, in the long format, the
/// covariate table — collected in memory, or streamed from their plans ([`stream_inputs`]).
pub struct TableInputs {
    outcomes: InputTable,
    covariates: Option<InputTable>,
}

/// Batches in flight between a streamed plan and the design builder, per input.
const STREAM_BUFFER: usize = 4;

/// Rows per batch an input plan is run with, when the session keeps DataFusion's default batch
/// size (8192) and the input is narrow: the design builder's cost per batch (the scan's page
/// decoding, the hand-over between the plan and the builder, each batch's type checks) is
/// paid 8 times less. The README's 1e5-case SCCS query (two Parquet files, 3M rows) spends
/// ~4 % less CPU time. Capped at [`INPUT_BATCH_BYTES`] per batch, so wide inputs keep the
/// session's batch size; a batch size set in the session (`SET datafusion.execution.batch_size`,
/// `sql --batch-size`) is kept as set.
const INPUT_BATCH_ROWS: usize = 1 << 16;

/// The most bytes (8 per column and row) a batch of [`INPUT_BATCH_ROWS`] may take.
const INPUT_BATCH_BYTES: usize = 4 << 20;

/// The task context `plan` runs with as a streamed input ([`INPUT_BATCH_ROWS`]).
fn input_context(plan: &Arc<dyn ExecutionPlan>, context: &Arc<TaskContext>) -> Arc<TaskContext> {
    use datafusion::prelude::SessionConfig;
    let config = context.session_config();
    let default = SessionConfig::new().batch_size();
    let width = 8 * plan.schema().fields().len().max(1);
    let rows = INPUT_BATCH_ROWS.min(INPUT_BATCH_BYTES / width);
    if config.batch_size() != default || rows <= default {
        return context.clone();
    }
    Arc::new(TaskContext::new(
        context.task_id(),
        context.session_id(),
        config.clone().with_batch_size(rows),
        context.scalar_functions().clone(),
        context.higher_order_functions().clone(),
        context.aggregate_functions().clone(),
        context.window_functions().clone(),
        context.runtime_env(),
    ))
}

/// Stream the input plans into the design instead of collecting them: returns the inputs (to
/// be read on a blocking thread) and the future that runs the plans. Each plan's partitions
/// run one after another, in partition order, so a file stays in its order (row ids that were
/// increasing in the file stay increasing, and the builder resolves them without a hash map);
/// at most [`STREAM_BUFFER`] batches per input wait between the plan and the builder. The
/// outcome plan runs before the covariate plan (the builder reads them in that order). When the
/// builder stops early (a bad value), the plans stop at their next batch.
pub fn stream_inputs(
    outcomes: Arc<dyn ExecutionPlan>,
    covariates: Option<Arc<dyn ExecutionPlan>>,
    context: Arc<TaskContext>,
) -> (TableInputs, BoxFuture<'static, DfResult<()>>) {
    use futures::StreamExt;
    let (tx_o, rx_o) = tokio::sync::mpsc::channel(STREAM_BUFFER);
    // The row count where the plan's statistics know it exactly (a Parquet scan without a
    // filter): the builder reserves room for the rows instead of regrowing.
    let exact_rows = |plan: &Arc<dyn ExecutionPlan>| {
        use datafusion::common::stats::Precision;
        use datafusion::physical_plan::{StatisticsArgs, StatisticsContext};
        let stats = StatisticsContext::new()
            .compute(plan.as_ref(), &StatisticsArgs::new())
            .ok()?;
        match stats.num_rows {
            Precision::Exact(n) => Some(n),
            _ => None,
        }
    };
    let inputs_o = InputTable::Stream(outcomes.schema(), rx_o, exact_rows(&outcomes));
    let (cov, tx_c) = match &covariates {
        Some(plan) => {
            let (tx, rx) = tokio::sync::mpsc::channel(STREAM_BUFFER);
            let rows = exact_rows(plan);
            (Some(InputTable::Stream(plan.schema(), rx, rows)), Some(tx))
        }
        None => (None, None),
    };
    async fn feed(
        plan: Arc<dyn ExecutionPlan>,
        context: Arc<TaskContext>,
        tx: tokio::sync::mpsc::Sender<ArrowResult<RecordBatch>>,
    ) -> DfResult<bool> {
        let context = input_context(&plan, &context);
        for p in 0..plan.properties().partitioning.partition_count() {
            let mut stream = plan.execute(p, context.clone())?;
            while let Some(batch) = stream.next().await {
                let batch = match batch {
                    Ok(b) => b,
                    Err(e) => {
                        let message = e.to_string();
                        let _ = tx
                            .send(Err(datafusion::arrow::error::ArrowError::ExternalError(
                                message.into(),
                            )))
                            .await;
                        return Err(e);
                    }
                };
                if tx.send(Ok(batch)).await.is_err() {
                    // The builder stopped (its error is the one reported).
                    return Ok(false);
                }
            }
        }
        Ok(true)
    }
    let feeder = async move {
        if !feed(outcomes, context.clone(), tx_o).await? {
            return Ok(());
        }
        if let (Some(plan), Some(tx)) = (covariates, tx_c) {
            feed(plan, context, tx).await?;
        }
        Ok(())
    };
    (
        TableInputs {
            outcomes: inputs_o,
            covariates: cov,
        },
        Box::pin(feeder),
    )
}

/// Run `work` on the streamed inputs of `outcomes` and `covariates` ([`stream_inputs`]) on a
/// blocking thread while the plans run; a failing plan's error wins over the builder's (which
/// then only says that its input broke off).
pub async fn with_streamed_inputs<T: Send + 'static>(
    what: &str,
    outcomes: Arc<dyn ExecutionPlan>,
    covariates: Option<Arc<dyn ExecutionPlan>>,
    context: Arc<TaskContext>,
    work: impl FnOnce(TableInputs) -> epifusion_core::Result<T> + Send + 'static,
) -> DfResult<T> {
    let (inputs, feeder) = stream_inputs(outcomes, covariates, context);
    let (result, fed) = futures::join!(run_blocking(what, move || work(inputs)), feeder);
    fed?;
    result
}

impl TableInputs {
    /// Build the design matrix (long format when covariates were given, else wide).
    pub fn design(
        self,
        read: &ReadOptions,
    ) -> epifusion_core::Result<epifusion_core::model::design::DesignMatrix> {
        self.design_with_notes(read).map(|(x, _)| x)
    }

    /// [`Self::design`] and the read's notes ([`convert::ReadReport::notes`]).
    pub fn design_with_notes(
        self,
        read: &ReadOptions,
    ) -> epifusion_core::Result<(epifusion_core::model::design::DesignMatrix, Vec<String>)> {
        let outcomes = self.outcomes.source("outcomes");
        let (builder, report) = match self.covariates {
            Some(covariates) => {
                convert::read_long_from(outcomes, covariates.source("covariates"), read)?
            }
            None => convert::read_wide_from(outcomes, read)?,
        };
        let x = builder.build().map_err(|e| {
            e.hint_unknown_rows(
                "keep only covariate rows whose row_id is in the outcomes (e.g. `WHERE row_id IN \
                 (SELECT row_id FROM …)`), or build the matrix with design_matrix(…, \
                 '{\"name\": …, \"drop_unknown_rows\": true}')",
            )
        })?;
        let notes = report.notes(x.dropped_unknown);
        Ok((x, notes))
    }
}

/// Run `work` on a blocking thread (never on a tokio worker) and convert its error.
pub async fn run_blocking<T: Send + 'static>(
    what: &str,
    work: impl FnOnce() -> epifusion_core::Result<T> + Send + 'static,
) -> DfResult<T> {
    blocking(what, move || work().into_df()).await
}

/// Run `work` (CPU-bound, returning a DataFusion result) on a blocking thread; a panic or
/// cancellation of the thread is the error "`what` task failed: …". The one spawn-blocking
/// helper of the crates (the study builds, the pipeline's cluster tasks and the fits use it).
pub async fn blocking<T: Send + 'static>(
    what: &str,
    work: impl FnOnce() -> DfResult<T> + Send + 'static,
) -> DfResult<T> {
    datafusion::common::runtime::SpawnedTask::spawn_blocking(work)
        .join()
        .await
        .map_err(|e| exec_datafusion_err!("{what} task failed: {e}"))?
}

/// Collect, build the design, fit (on a blocking thread) and return the result batch.
pub async fn fit_from_plans(
    model: ModelKind,
    options: FitOptions,
    table: ResultTable,
    outcomes: Arc<dyn ExecutionPlan>,
    covariates: Option<Arc<dyn ExecutionPlan>>,
    context: Arc<TaskContext>,
) -> DfResult<RecordBatch> {
    let mut options = options;
    let _cancel_on_drop = cancel_on_drop(&mut options);
    with_streamed_inputs("fit", outcomes, covariates, context, move |inputs| {
        Ok(fit_inputs(model, &options, table, inputs)?.batch)
    })
    .await
}

/// What [`fit_batches`] returns: the result table, and for the coefficient table the covariate
/// id of each of its rows (`None` for the intercept), so that callers need not read the table
/// back by column name.
#[derive(Debug, Clone)]
pub struct FitOutput {
    /// The table `SELECT * FROM function(…)` returns.
    pub batch: RecordBatch,
    /// The coefficient table's covariate ids, row by row (`None` for other tables).
    pub covariate_ids: Option<Vec<Option<i64>>>,
}

/// Fit tables already in memory — the Rust entry behind the fitting table functions, for
/// callers that hold the tables (a pipeline's study tables): `function` (e.g. `cox_fit`) with
/// the options JSON `options_json` (empty: defaults) over `outcomes` and, in the long format,
/// `covariates` (each a schema and its batches) returns what `SELECT * FROM
/// function(outcomes, covariates, options_json)` returns.
pub async fn fit_batches(
    function: &str,
    options_json: &str,
    outcomes: (SchemaRef, Vec<RecordBatch>),
    covariates: Option<(SchemaRef, Vec<RecordBatch>)>,
) -> DfResult<FitOutput> {
    let model = match crate::registry::sql_functions()
        .into_iter()
        .find(|f| f.name == function)
        .map(|f| f.role)
    {
        Some(crate::registry::SqlRole::Fit(model)) => model,
        _ => return plan_err!("no fitting table function named `{function}`"),
    };
    let FitWork {
        model,
        options,
        table,
    } = FitWork::parse(function, model, options_json)?;
    let inputs = TableInputs {
        outcomes: InputTable::Batches(outcomes.0, outcomes.1),
        covariates: covariates.map(|(schema, batches)| InputTable::Batches(schema, batches)),
    };
    fit_collected(model, options, table, inputs).await
}

/// Build the design from collected inputs, fit (on a blocking thread) and return the result.
async fn fit_collected(
    model: ModelKind,
    mut options: FitOptions,
    table: ResultTable,
    inputs: TableInputs,
) -> DfResult<FitOutput> {
    let _cancel_on_drop = cancel_on_drop(&mut options);
    run_blocking("fit", move || fit_inputs(model, &options, table, inputs)).await
}

/// Give the fit of `options` a cancel token and return its guard: dropping the guard with the
/// future that holds it (the query's stream: Ctrl-C, a client that goes away) cancels the fit
/// running on the blocking thread.
fn cancel_on_drop(options: &mut FitOptions) -> epifusion_core::cancel::CancelOnDrop {
    let token = epifusion_core::cancel::CancelToken::new();
    options.ccd.cancel = token.clone();
    token.cancel_on_drop()
}

/// Build the design from `inputs`, fit and make the result table (blocking).
fn fit_inputs(
    model: ModelKind,
    options: &FitOptions,
    table: ResultTable,
    inputs: TableInputs,
) -> epifusion_core::Result<FitOutput> {
    let read = ReadOptions {
        require_time: model.needs_time(),
        ..Default::default()
    };
    let (x, read_notes) = inputs.design_with_notes(&read)?;
    let mut result = fit_owned(x, options)?;
    result.notes.splice(0..0, read_notes);
    let batch = convert::table_batch(&result, table)?;
    let covariate_ids = (table == ResultTable::Coefficients).then(|| {
        result
            .coefficients
            .iter()
            .map(|c| {
                (c.covariate_id != epifusion_core::model::design::INTERCEPT_ID)
                    .then_some(c.covariate_id)
            })
            .collect()
    });
    Ok(FitOutput {
        batch,
        covariate_ids,
    })
}

impl ExecutionPlan for OneBatchExec {
    fn name(&self) -> &str {
        "OneBatchExec"
    }

    fn properties(&self) -> &Arc<PlanProperties> {
        &self.properties
    }

    fn children(&self) -> Vec<&Arc<dyn ExecutionPlan>> {
        Vec::new()
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
        if !children.is_empty() {
            return Err(exec_datafusion_err!("OneBatchExec has no children"));
        }
        Ok(self)
    }

    fn execute(
        &self,
        partition: usize,
        context: Arc<TaskContext>,
    ) -> DfResult<SendableRecordBatchStream> {
        if partition != 0 {
            return Err(exec_datafusion_err!(
                "OneBatchExec has one partition, asked for {partition}"
            ));
        }
        let schema = self.properties.eq_properties.schema().clone();
        let batch = (self.producer)(context);
        let projection = self.projection.clone();
        let fut = async move {
            let batch = batch.await?;
            match projection {
                Some(p) => Ok(batch.project(&p)?),
                None => Ok(batch),
            }
        };
        Ok(Box::pin(RecordBatchStreamAdapter::new(
            schema,
            futures::stream::once(fut),
        )))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use datafusion::arrow::array::{ArrayRef, Int64Array};
    use datafusion::prelude::{ParquetReadOptions, SessionContext};

    fn write_parquet(
        path: &std::path::Path,
        batch: &RecordBatch,
        props: Option<parquet::file::properties::WriterProperties>,
    ) {
        let file = std::fs::File::create(path).unwrap();
        let mut w = parquet::arrow::ArrowWriter::try_new(file, batch.schema(), props).unwrap();
        w.write(batch).unwrap();
        w.close().unwrap();
    }

    async fn physical_plan(ctx: &SessionContext, sql: &str) -> Arc<dyn ExecutionPlan> {
        let frame = ctx.sql(sql).await.unwrap();
        frame.create_physical_plan().await.unwrap()
    }

    /// A streamed Parquet scan carries its exact row count (the builder reserves room for the
    /// rows); a filtered one, whose count is only an estimate, carries none.
    #[tokio::test]
    async fn a_parquet_scan_streams_with_its_exact_row_count() {
        let dir =
            std::env::temp_dir().join(format!("epifusion-stream-rows-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let ids: ArrayRef = Arc::new(Int64Array::from(vec![1, 2, 3, 4, 5]));
        let batch = RecordBatch::try_from_iter([("row_id", ids)]).unwrap();
        let path = dir.join("o.parquet");
        write_parquet(&path, &batch, None);
        let ctx = SessionContext::new();
        ctx.register_parquet("o", path.to_str().unwrap(), ParquetReadOptions::default())
            .await
            .unwrap();
        for (sql, expected) in [
            ("SELECT row_id FROM o", Some(5)),
            ("SELECT row_id AS r, row_id + 1 AS s FROM o", Some(5)),
            ("SELECT row_id FROM o WHERE row_id > 2", None),
        ] {
            let plan = physical_plan(&ctx, sql).await;
            let (inputs, _feeder) = stream_inputs(plan, None, ctx.task_ctx());
            let source = inputs.outcomes.source("o");
            assert_eq!(source.rows(), expected, "{sql}");
        }
        let _ = std::fs::remove_dir_all(&dir);
    }

    /// A narrow input of a session that keeps the default batch size is scanned in batches of
    /// `INPUT_BATCH_ROWS`; a wide one, or one whose session sets a batch size, in the
    /// session's.
    #[tokio::test]
    async fn narrow_inputs_are_scanned_in_large_batches() {
        use futures::StreamExt;
        let dir =
            std::env::temp_dir().join(format!("epifusion-input-batches-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let n = 3 * INPUT_BATCH_ROWS;
        let ids: ArrayRef = Arc::new(Int64Array::from_iter_values(0..n as i64));
        let batch = RecordBatch::try_from_iter([("row_id", ids)]).unwrap();
        let path = dir.join("o.parquet");
        let props = parquet::file::properties::WriterProperties::builder()
            .set_max_row_group_row_count(Some(n))
            .build();
        write_parquet(&path, &batch, Some(props));
        let wide: Vec<String> = (0..200).map(|k| format!("row_id + {k} AS c{k}")).collect();
        let wide = format!("SELECT {} FROM o", wide.join(", "));
        let default = datafusion::prelude::SessionConfig::new().batch_size();
        for (set, sql, expected) in [
            (None, "SELECT row_id FROM o", INPUT_BATCH_ROWS),
            (
                None,
                "SELECT row_id AS r, row_id + 1 AS s FROM o",
                INPUT_BATCH_ROWS,
            ),
            (None, wide.as_str(), default),
            (Some(1000), "SELECT row_id FROM o", 1000),
        ] {
            let mut config = datafusion::prelude::SessionConfig::new().with_target_partitions(1);
            if let Some(b) = set {
                config = config.with_batch_size(b);
            }
            let ctx = SessionContext::new_with_config(config);
            ctx.register_parquet("o", path.to_str().unwrap(), ParquetReadOptions::default())
                .await
                .unwrap();
            let plan = physical_plan(&ctx, sql).await;
            let context = input_context(&plan, &ctx.task_ctx());
            let mut stream = plan.execute(0, context).unwrap();
            let mut sizes = Vec::new();
            while let Some(b) = stream.next().await {
                sizes.push(b.unwrap().num_rows());
            }
            assert_eq!(sizes.iter().sum::<usize>(), n, "{sql}");
            assert_eq!(sizes[0], expected, "{set:?} {sql}");
            assert!(
                sizes.iter().all(|&s| s <= expected),
                "{set:?} {sql}: {sizes:?}"
            );
        }
        let _ = std::fs::remove_dir_all(&dir);
    }
}
