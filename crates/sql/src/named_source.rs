//! Errors that name their file: a table provider wrapper whose scans add the source file to
//! every error they raise.
//!
//! DataFusion's Parquet and CSV readers report a corrupt page or footer without saying which
//! file it came from; in a store of twenty tables that leaves the user guessing. An OMOP table
//! is one file, so [`NamedSource`] wraps its provider and [`NamedErrorsExec`] wraps each scan,
//! prefixing errors with `reading <table> (<file>)`. Everything else (schema, filter
//! push-down, statistics, partitioning, ordering) is the wrapped provider's and plan's.

use std::fmt;
use std::sync::Arc;

use async_trait::async_trait;
use datafusion::arrow::datatypes::SchemaRef;
use datafusion::catalog::{Session, TableProvider};
use datafusion::common::config::ConfigOptions;
use datafusion::common::tree_node::TreeNodeRecursion;
use datafusion::common::{exec_datafusion_err, DataFusionError, Result as DfResult, Statistics};
use datafusion::datasource::TableType;
use datafusion::execution::{SendableRecordBatchStream, TaskContext};
use datafusion::logical_expr::{Expr, TableProviderFilterPushDown};
use datafusion::physical_expr::PhysicalExpr;
use datafusion::physical_plan::filter_pushdown::{
    ChildPushdownResult, FilterDescription, FilterPushdownPhase, FilterPushdownPropagation,
};
use datafusion::physical_plan::statistics::{ChildStats, StatisticsArgs};
use datafusion::physical_plan::stream::RecordBatchStreamAdapter;
use datafusion::physical_plan::{DisplayAs, DisplayFormatType, ExecutionPlan, PlanProperties};
use futures::TryStreamExt;

/// Add `label` to an error (once).
pub fn with_source(label: &str, e: DataFusionError) -> DataFusionError {
    let prefix = format!("reading {label}");
    if e.to_string().contains(&prefix) {
        e
    } else {
        e.context(prefix)
    }
}

/// A table provider whose scans name `label` (e.g. `person (s3://bucket/cdm/person.parquet)`)
/// in their errors.
#[derive(Debug)]
pub struct NamedSource {
    inner: Arc<dyn TableProvider>,
    label: String,
}

impl NamedSource {
    /// Wrap `inner`.
    pub fn new(inner: Arc<dyn TableProvider>, label: impl Into<String>) -> Self {
        NamedSource {
            inner,
            label: label.into(),
        }
    }

    /// The wrapped provider.
    pub fn inner(&self) -> &Arc<dyn TableProvider> {
        &self.inner
    }
}

#[async_trait]
impl TableProvider for NamedSource {
    fn schema(&self) -> SchemaRef {
        self.inner.schema()
    }

    fn table_type(&self) -> TableType {
        self.inner.table_type()
    }

    async fn scan(
        &self,
        state: &dyn Session,
        projection: Option<&Vec<usize>>,
        filters: &[Expr],
        limit: Option<usize>,
    ) -> DfResult<Arc<dyn ExecutionPlan>> {
        let plan = self
            .inner
            .scan(state, projection, filters, limit)
            .await
            .map_err(|e| with_source(&self.label, e))?;
        Ok(Arc::new(NamedErrorsExec::new(plan, self.label.clone())))
    }

    fn supports_filters_pushdown(
        &self,
        filters: &[&Expr],
    ) -> DfResult<Vec<TableProviderFilterPushDown>> {
        self.inner.supports_filters_pushdown(filters)
    }

    fn statistics(&self) -> Option<Statistics> {
        self.inner.statistics()
    }
}

/// A plan node that passes its input through and names `label` in the input's errors.
#[derive(Debug)]
pub struct NamedErrorsExec {
    input: Arc<dyn ExecutionPlan>,
    label: String,
}

impl NamedErrorsExec {
    /// Wrap `input`.
    pub fn new(input: Arc<dyn ExecutionPlan>, label: String) -> Self {
        NamedErrorsExec { input, label }
    }
}

impl DisplayAs for NamedErrorsExec {
    fn fmt_as(&self, _t: DisplayFormatType, f: &mut fmt::Formatter) -> fmt::Result {
        write!(f, "NamedErrorsExec: {}", self.label)
    }
}

impl ExecutionPlan for NamedErrorsExec {
    fn name(&self) -> &str {
        "NamedErrorsExec"
    }

    fn properties(&self) -> &Arc<PlanProperties> {
        self.input.properties()
    }

    fn children(&self) -> Vec<&Arc<dyn ExecutionPlan>> {
        vec![&self.input]
    }

    fn apply_expressions(
        &self,
        _f: &mut dyn FnMut(&Arc<dyn PhysicalExpr>) -> DfResult<TreeNodeRecursion>,
    ) -> DfResult<TreeNodeRecursion> {
        Ok(TreeNodeRecursion::Continue)
    }

    fn maintains_input_order(&self) -> Vec<bool> {
        vec![true]
    }

    fn benefits_from_input_partitioning(&self) -> Vec<bool> {
        vec![false]
    }

    fn with_new_children(
        self: Arc<Self>,
        mut children: Vec<Arc<dyn ExecutionPlan>>,
    ) -> DfResult<Arc<dyn ExecutionPlan>> {
        if children.len() != 1 {
            return Err(exec_datafusion_err!(
                "NamedErrorsExec has one child, got {}",
                children.len()
            ));
        }
        Ok(Arc::new(NamedErrorsExec::new(
            children.remove(0),
            self.label.clone(),
        )))
    }

    fn execute(
        &self,
        partition: usize,
        context: Arc<TaskContext>,
    ) -> DfResult<SendableRecordBatchStream> {
        let label = self.label.clone();
        let stream = self
            .input
            .execute(partition, context)
            .map_err(|e| with_source(&label, e))?;
        let schema = stream.schema();
        Ok(Box::pin(RecordBatchStreamAdapter::new(
            schema,
            stream.map_err(move |e| with_source(&label, e)),
        )))
    }

    fn child_stats_requests(&self, partition: Option<usize>) -> Vec<ChildStats> {
        vec![ChildStats::At(partition)]
    }

    fn statistics_from_inputs(
        &self,
        input_stats: &[Arc<Statistics>],
        _args: &StatisticsArgs,
    ) -> DfResult<Arc<Statistics>> {
        Ok(input_stats[0].clone())
    }

    // Filters pass through to the scan (Parquet row-group and page pruning).
    fn gather_filters_for_pushdown(
        &self,
        _phase: FilterPushdownPhase,
        parent_filters: Vec<Arc<dyn PhysicalExpr>>,
        _config: &ConfigOptions,
    ) -> DfResult<FilterDescription> {
        FilterDescription::from_children(parent_filters, &self.children())
    }

    fn handle_child_pushdown_result(
        &self,
        _phase: FilterPushdownPhase,
        child_pushdown_result: ChildPushdownResult,
        _config: &ConfigOptions,
    ) -> DfResult<FilterPushdownPropagation<Arc<dyn ExecutionPlan>>> {
        Ok(FilterPushdownPropagation::if_all(child_pushdown_result))
    }
}
