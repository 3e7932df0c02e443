//! Cancellation of `GROUP BY` fits (`*_fit_agg`) when their query goes away.
//!
//! A table-function fit runs on a blocking thread inside a future whose drop cancels it
//! ([`crate::fit_table`]). An aggregate cannot do that: DataFusion calls an accumulator's
//! `evaluate` synchronously inside a poll of the aggregate's stream, so while a group's model is
//! fitted, nothing above it can drop that stream, and a task abort only lands at the next await.
//! Two plan nodes, inserted by [`FitCancelRule`] (the last physical optimizer rule of local
//! sessions, only into plans that contain a fit aggregate), close the gap:
//!
//! * [`QueryScopeExec`] at the root: each `execute` makes a [`CancelToken`], hands it to the
//!   plan below in the task context's configuration ([`QueryCancel`]), runs the plan below on a
//!   spawned task (so that the consumer's task stays free to drop the stream even when the fit
//!   would otherwise run inside the consumer's own poll) and cancels the token when its stream
//!   is dropped — Ctrl-C, a Flight SQL client that disconnects, a Python iterator let go;
//! * [`FitScopeExec`] above every aggregate with a fit: while it polls the aggregate's stream it
//!   makes the token the thread's current one ([`current_token`]); the accumulator's `evaluate`
//!   fits with it, so the coordinate-descent loop stops within one cycle and the query's tasks
//!   end with an error saying the fit was cancelled.
//!
//! Cluster sessions do not get the rule (Ballista cancels its own tasks, and the nodes would
//! have to travel in plans). Without a scope (a plan built elsewhere) fits run uncancellable,
//! as before.

use std::any::Any;
use std::cell::RefCell;
use std::fmt;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use datafusion::arrow::datatypes::SchemaRef;
use datafusion::arrow::record_batch::RecordBatch;
use datafusion::common::config::ConfigOptions;
use datafusion::common::tree_node::{Transformed, TreeNode, TreeNodeRecursion};
use datafusion::common::Result as DfResult;
use datafusion::execution::{RecordBatchStream, SendableRecordBatchStream, TaskContext};
use datafusion::physical_expr::PhysicalExpr;
use datafusion::physical_optimizer::PhysicalOptimizerRule;
use datafusion::physical_plan::aggregates::AggregateExec;
use datafusion::physical_plan::stream::RecordBatchReceiverStream;
use datafusion::physical_plan::{DisplayAs, DisplayFormatType, ExecutionPlan, PlanProperties};
use epifusion_core::cancel::{CancelOnDrop, CancelToken};
use futures::{Stream, StreamExt};

use crate::fit_udaf::FitAggregate;

thread_local! {
    static CURRENT: RefCell<Option<CancelToken>> = const { RefCell::new(None) };
}

/// The cancel token of the query whose fit aggregate this thread is polling (the default,
/// never-cancelled token outside a [`FitScopeExec`]).
pub fn current_token() -> CancelToken {
    CURRENT.with(|c| c.borrow().clone()).unwrap_or_default()
}

/// The query's cancel token in a task context's configuration (set by [`QueryScopeExec`]).
#[derive(Debug, Clone, Default)]
pub struct QueryCancel(pub CancelToken);

/// Whether `plan` is an aggregate with at least one epifusion fit aggregate.
fn is_fit_aggregate(plan: &dyn ExecutionPlan) -> bool {
    let Some(agg) = (plan as &dyn Any).downcast_ref::<AggregateExec>() else {
        return false;
    };
    agg.aggr_expr().iter().any(|e| {
        let inner: &dyn Any = e.fun().inner().as_ref();
        inner.is::<FitAggregate>()
    })
}

/// Physical optimizer rule: wraps every aggregate with a fit in [`FitScopeExec`] and the root in
/// [`QueryScopeExec`]; plans without fit aggregates are left as they are.
#[derive(Debug, Default)]
pub struct FitCancelRule;

impl PhysicalOptimizerRule for FitCancelRule {
    fn optimize(
        &self,
        plan: Arc<dyn ExecutionPlan>,
        _config: &ConfigOptions,
    ) -> DfResult<Arc<dyn ExecutionPlan>> {
        let mut found = false;
        plan.apply(|p| {
            if (p.as_ref() as &dyn Any).is::<QueryScopeExec>() {
                // Already scoped (the rule ran before on this plan).
                return Ok(TreeNodeRecursion::Stop);
            }
            found |= is_fit_aggregate(p.as_ref());
            Ok(TreeNodeRecursion::Continue)
        })?;
        if !found {
            return Ok(plan);
        }
        let wrapped = plan
            .transform_up(|p| {
                if is_fit_aggregate(p.as_ref()) {
                    Ok(Transformed::yes(
                        Arc::new(FitScopeExec::new(p)) as Arc<dyn ExecutionPlan>
                    ))
                } else {
                    Ok(Transformed::no(p))
                }
            })?
            .data;
        Ok(Arc::new(QueryScopeExec::new(wrapped)))
    }

    fn name(&self) -> &str {
        "epifusion_fit_cancel"
    }

    fn schema_check(&self) -> bool {
        true
    }
}

/// Implements the parts of [`ExecutionPlan`] both scope nodes share: they have one child whose
/// properties, ordering and partitioning they keep.
macro_rules! pass_through_plan {
    ($name:literal) => {
        fn name(&self) -> &str {
            $name
        }

        fn properties(&self) -> &Arc<PlanProperties> {
            self.input.properties()
        }

        fn children(&self) -> Vec<&Arc<dyn ExecutionPlan>> {
            vec![&self.input]
        }

        fn maintains_input_order(&self) -> Vec<bool> {
            vec![true]
        }

        fn benefits_from_input_partitioning(&self) -> Vec<bool> {
            vec![false]
        }

        fn apply_expressions(
            &self,
            _f: &mut dyn FnMut(&Arc<dyn PhysicalExpr>) -> DfResult<TreeNodeRecursion>,
        ) -> DfResult<TreeNodeRecursion> {
            Ok(TreeNodeRecursion::Continue)
        }

        fn with_new_children(
            self: Arc<Self>,
            mut children: Vec<Arc<dyn ExecutionPlan>>,
        ) -> DfResult<Arc<dyn ExecutionPlan>> {
            if children.len() != 1 {
                return Err(datafusion::common::internal_datafusion_err!(
                    "{} takes one child, got {}",
                    $name,
                    children.len()
                ));
            }
            Ok(Arc::new(Self::new(children.remove(0))))
        }
    };
}

/// The root of a plan with fit aggregates: one cancel token per execution, cancelled when the
/// output stream is dropped (module docs).
#[derive(Debug)]
pub struct QueryScopeExec {
    input: Arc<dyn ExecutionPlan>,
}

impl QueryScopeExec {
    /// Scope `input`.
    pub fn new(input: Arc<dyn ExecutionPlan>) -> Self {
        Self { input }
    }
}

impl DisplayAs for QueryScopeExec {
    fn fmt_as(&self, _t: DisplayFormatType, f: &mut fmt::Formatter) -> fmt::Result {
        write!(f, "QueryScopeExec")
    }
}

impl ExecutionPlan for QueryScopeExec {
    pass_through_plan!("QueryScopeExec");

    fn execute(
        &self,
        partition: usize,
        context: Arc<TaskContext>,
    ) -> DfResult<SendableRecordBatchStream> {
        let token = CancelToken::new();
        let config = context
            .session_config()
            .clone()
            .with_extension(Arc::new(QueryCancel(token.clone())));
        let context = Arc::new(TaskContext::new(
            context.task_id(),
            context.session_id(),
            config,
            context.scalar_functions().clone(),
            context.higher_order_functions().clone(),
            context.aggregate_functions().clone(),
            context.window_functions().clone(),
            context.runtime_env(),
        ));
        let schema = self.input.schema();
        let mut builder = RecordBatchReceiverStream::builder(schema.clone(), 2);
        let tx = builder.tx();
        let input = self.input.clone();
        builder.spawn(async move {
            let mut stream = match input.execute(partition, context) {
                Ok(s) => s,
                Err(e) => {
                    tx.send(Err(e)).await.ok();
                    return Ok(());
                }
            };
            while let Some(item) = stream.next().await {
                let stop = item.is_err();
                if tx.send(item).await.is_err() || stop {
                    break;
                }
            }
            Ok(())
        });
        Ok(Box::pin(GuardedStream {
            inner: builder.build(),
            schema,
            _cancel: token.cancel_on_drop(),
        }))
    }
}

/// A stream that cancels its query's token when dropped.
struct GuardedStream {
    inner: SendableRecordBatchStream,
    schema: SchemaRef,
    _cancel: CancelOnDrop,
}

impl Stream for GuardedStream {
    type Item = DfResult<RecordBatch>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        self.inner.poll_next_unpin(cx)
    }
}

impl RecordBatchStream for GuardedStream {
    fn schema(&self) -> SchemaRef {
        self.schema.clone()
    }
}

/// Above an aggregate with fits: polls it with the query's token as the thread's current one.
#[derive(Debug)]
pub struct FitScopeExec {
    input: Arc<dyn ExecutionPlan>,
}

impl FitScopeExec {
    /// Scope `input` (an aggregate).
    pub fn new(input: Arc<dyn ExecutionPlan>) -> Self {
        Self { input }
    }
}

impl DisplayAs for FitScopeExec {
    fn fmt_as(&self, _t: DisplayFormatType, f: &mut fmt::Formatter) -> fmt::Result {
        write!(f, "FitScopeExec")
    }
}

impl ExecutionPlan for FitScopeExec {
    pass_through_plan!("FitScopeExec");

    fn execute(
        &self,
        partition: usize,
        context: Arc<TaskContext>,
    ) -> DfResult<SendableRecordBatchStream> {
        let token = context
            .session_config()
            .get_extension::<QueryCancel>()
            .map(|q| q.0.clone())
            .unwrap_or_default();
        Ok(Box::pin(ScopedStream {
            inner: self.input.execute(partition, context)?,
            token,
        }))
    }
}

/// Polls its inner stream with `token` as the thread's current token.
struct ScopedStream {
    inner: SendableRecordBatchStream,
    token: CancelToken,
}

impl Stream for ScopedStream {
    type Item = DfResult<RecordBatch>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        let previous = CURRENT.with(|c| c.replace(Some(self.token.clone())));
        let out = self.inner.poll_next_unpin(cx);
        CURRENT.with(|c| *c.borrow_mut() = previous);
        out
    }
}

impl RecordBatchStream for ScopedStream {
    fn schema(&self) -> SchemaRef {
        self.inner.schema()
    }
}
