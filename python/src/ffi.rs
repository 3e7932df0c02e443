//! The FFI route: epifusion's functions and OMOP tables exported to
//! datafusion-python 55 sessions as PyCapsules of `datafusion-ffi` 55.2 objects.
//!
//! * [`TableFunction`]: one table function (`cox_fit`, `sccs_intervals`, …) as
//!   `__datafusion_table_function__` (an `FFI_TableFunction`), for `register_udtf`;
//! * [`AggregateFunction`]: one `*_fit_agg` aggregate as `__datafusion_aggregate_udf__` (an
//!   `FFI_AggregateUDF`), for `register_udaf`;
//! * [`crate::omop::OmopTable`]: one OMOP table as `__datafusion_table_provider__`.
//!
//! **Sessions across the FFI.** A table function called from datafusion-python receives the
//! caller's session as `datafusion_ffi`'s `ForeignSession`: its catalogs, configuration options
//! and scalar / aggregate / window functions cross the boundary, so input queries see the
//! Python session's tables. What does not cross: configuration *extensions* (so
//! `design_matrix` matrices are shared by the functions of one `functions` call), and the
//! runtime environment (a foreign session has a default one; OMOP tables scan with their own).
//!
//! **Runtimes.** datafusion-python polls futures and streams on its own executor, in another
//! shared library whose tokio thread-locals this library cannot see. `datafusion-ffi` enters
//! the runtime handle given to it around `execute` and each stream poll, not around a
//! provider's `scan`; the study designs run queries there, so [`InRuntimeFunction`] /
//! [`InRuntimeTable`] enter the module's runtime around every poll of a scan ([`InRuntime`]).
//!
//! Needs arrow's `ffi` feature (datafusion-ffi enables it); the workspace's `arrow` dependency
//! enables it too, so that every crate sees one arrow feature set.

use std::ffi::CString;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use async_trait::async_trait;
use datafusion::arrow::datatypes::SchemaRef;
use datafusion::catalog::{Session, TableFunctionArgs, TableFunctionImpl, TableProvider};
use datafusion::common::tree_node::TreeNodeRecursion;
use datafusion::common::Result as DfResult;
use datafusion::datasource::TableType;
use datafusion::execution::runtime_env::RuntimeEnv;
use datafusion::execution::{SendableRecordBatchStream, TaskContext};
use datafusion::logical_expr::{AggregateUDF, Expr, TableProviderFilterPushDown};
use datafusion::physical_expr::PhysicalExpr;
use datafusion::physical_plan::ExecutionPlan;
use datafusion::physical_plan::{DisplayAs, DisplayFormatType, PlanProperties};
use datafusion_ffi::proto::logical_extension_codec::FFI_LogicalExtensionCodec;
use datafusion_ffi::udaf::FFI_AggregateUDF;
use datafusion_ffi::udtf::FFI_TableFunction;
use epifusion_sql::design_table::DesignRegistry;
use epifusion_sql::fit_udaf::FitAggregate;
use epifusion_sql::registry::{sql_functions, SqlRole};
use pyo3::exceptions::PyTypeError;
use pyo3::prelude::*;
use pyo3::types::PyCapsule;
use tokio::runtime::Handle;

use crate::runtime::runtime;

/// The logical extension codec of a datafusion-python session: `session` is a
/// `SessionContext` (anything with `__datafusion_logical_extension_codec__`) or that method's
/// capsule itself.
pub(crate) fn session_codec(session: &Bound<'_, PyAny>) -> PyResult<FFI_LogicalExtensionCodec> {
    const NAME: &str = "datafusion_logical_extension_codec";
    let capsule = if session.is_instance_of::<PyCapsule>() {
        session.clone()
    } else if session.hasattr("__datafusion_logical_extension_codec__")? {
        session
            .getattr("__datafusion_logical_extension_codec__")?
            .call0()?
    } else {
        return Err(PyTypeError::new_err(format!(
            "expected a datafusion.SessionContext (with __datafusion_logical_extension_codec__), \
             got {}",
            session.get_type().name()?
        )));
    };
    let capsule = capsule.cast_into::<PyCapsule>().map_err(|_| {
        PyTypeError::new_err("__datafusion_logical_extension_codec__ did not return a PyCapsule")
    })?;
    let pointer = capsule
        .pointer_checked(Some(c"datafusion_logical_extension_codec"))
        .map_err(|e| PyTypeError::new_err(format!("expected a PyCapsule named {NAME}: {e}")))?;
    // SAFETY: the capsule's name says it holds an FFI_LogicalExtensionCodec (datafusion-python's
    // contract for this name); it is cloned (the FFI clone) while the capsule is alive.
    let codec = unsafe { &*(pointer.as_ptr() as *const FFI_LogicalExtensionCodec) };
    Ok(codec.clone())
}

/// One epifusion table function, for `SessionContext.register_udtf`.
#[pyclass(module = "epifusion._epifusion", frozen)]
pub struct TableFunction {
    name: &'static str,
    udtf: Arc<dyn TableFunctionImpl>,
    codec: FFI_LogicalExtensionCodec,
}

#[pymethods]
impl TableFunction {
    /// SQL name.
    #[getter]
    fn name(&self) -> &'static str {
        self.name
    }

    /// The `FFI_TableFunction` capsule (`datafusion_table_function`); datafusion-python passes
    /// the registering session (its logical codec is used), else the codec of the session given
    /// to `functions` is.
    #[pyo3(signature = (session = None))]
    fn __datafusion_table_function__<'py>(
        &self,
        py: Python<'py>,
        session: Option<&Bound<'py, PyAny>>,
    ) -> PyResult<Bound<'py, PyCapsule>> {
        let codec = match session {
            Some(s) if !s.is_none() => session_codec(s)?,
            _ => self.codec.clone(),
        };
        let handle = runtime()?.handle().clone();
        let udtf = Arc::new(InRuntimeFunction::new(self.udtf.clone(), handle.clone()));
        let ffi = FFI_TableFunction::new_with_ffi_codec(udtf, Some(handle), codec);
        PyCapsule::new(py, ffi, Some(CString::from(c"datafusion_table_function")))
    }

    fn __repr__(&self) -> String {
        format!("epifusion.TableFunction({})", self.name)
    }
}

/// One `*_fit_agg` aggregate, for `SessionContext.register_udaf`.
#[pyclass(module = "epifusion._epifusion", frozen)]
pub struct AggregateFunction {
    udaf: Arc<AggregateUDF>,
}

#[pymethods]
impl AggregateFunction {
    /// SQL name.
    #[getter]
    fn name(&self) -> String {
        self.udaf.name().to_string()
    }

    /// The `FFI_AggregateUDF` capsule (`datafusion_aggregate_udf`).
    fn __datafusion_aggregate_udf__<'py>(
        &self,
        py: Python<'py>,
    ) -> PyResult<Bound<'py, PyCapsule>> {
        let ffi = FFI_AggregateUDF::from(self.udaf.clone());
        PyCapsule::new(py, ffi, Some(CString::from(c"datafusion_aggregate_udf")))
    }

    fn __repr__(&self) -> String {
        format!("epifusion.AggregateFunction({})", self.udaf.name())
    }
}

/// Every epifusion function for the datafusion-python session `session`: a list of
/// [`TableFunction`] and [`AggregateFunction`] objects, in the registry's order. The table
/// functions share one store of design matrices (`design_matrix`).
#[pyfunction]
pub fn functions(py: Python<'_>, session: &Bound<'_, PyAny>) -> PyResult<Vec<Py<PyAny>>> {
    epifusion_cuda::install();
    let codec = session_codec(session)?;
    let designs = Arc::new(DesignRegistry::default());
    let mut out = Vec::new();
    for f in sql_functions() {
        let obj = match f.role {
            SqlRole::FitAggregate(model) => Py::new(
                py,
                AggregateFunction {
                    udaf: Arc::new(AggregateUDF::from(FitAggregate::new(f.name, model))),
                },
            )?
            .into_any(),
            role => {
                let Some(udtf) = epifusion_sql::session::table_function(f.name, role, &designs)
                else {
                    continue;
                };
                Py::new(
                    py,
                    TableFunction {
                        name: f.name,
                        udtf,
                        codec: codec.clone(),
                    },
                )?
                .into_any()
            }
        };
        out.push(obj);
    }
    Ok(out)
}

/// A future polled with `handle` entered (so that what it spawns runs on that runtime).
pub struct InRuntime<'a, T> {
    future: Pin<Box<dyn Future<Output = T> + Send + 'a>>,
    handle: Handle,
}

impl<'a, T> InRuntime<'a, T> {
    /// Wrap `future`.
    pub fn new(handle: Handle, future: impl Future<Output = T> + Send + 'a) -> Self {
        Self {
            future: Box::pin(future),
            handle,
        }
    }
}

impl<T> Future for InRuntime<'_, T> {
    type Output = T;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<T> {
        let this = self.get_mut();
        let _guard = this.handle.enter();
        this.future.as_mut().poll(cx)
    }
}

/// A table function whose tables scan inside `handle`'s runtime.
#[derive(Debug)]
pub struct InRuntimeFunction {
    inner: Arc<dyn TableFunctionImpl>,
    handle: Handle,
}

impl InRuntimeFunction {
    /// Wrap `inner`.
    pub fn new(inner: Arc<dyn TableFunctionImpl>, handle: Handle) -> Self {
        Self { inner, handle }
    }
}

impl TableFunctionImpl for InRuntimeFunction {
    /// The FFI's session-less entry point (a caller that implements only the deprecated
    /// `TableFunctionImpl::call`): the function gets an empty session. Only `cohort_*` and
    /// `calibrate_estimates`, which read their input tables' schemas when called, need the
    /// caller's catalog there; the others plan their inputs when scanned, with the caller's
    /// session.
    #[allow(deprecated)]
    fn call(&self, exprs: &[Expr]) -> DfResult<Arc<dyn TableProvider>> {
        let empty = datafusion::execution::session_state::SessionStateBuilder::new()
            .with_default_features()
            .build();
        self.call_with_args(TableFunctionArgs::new(exprs, &empty))
    }

    fn call_with_args(&self, args: TableFunctionArgs) -> DfResult<Arc<dyn TableProvider>> {
        Ok(Arc::new(InRuntimeTable {
            inner: self.inner.call_with_args(args)?,
            handle: self.handle.clone(),
        }))
    }
}

/// A table whose scans run inside `handle`'s runtime.
#[derive(Debug)]
pub struct InRuntimeTable {
    inner: Arc<dyn TableProvider>,
    handle: Handle,
}

#[async_trait]
impl TableProvider for InRuntimeTable {
    fn schema(&self) -> SchemaRef {
        self.inner.schema()
    }

    fn table_type(&self) -> TableType {
        self.inner.table_type()
    }

    async fn scan(
        &self,
        session: &dyn Session,
        projection: Option<&Vec<usize>>,
        filters: &[Expr],
        limit: Option<usize>,
    ) -> DfResult<Arc<dyn ExecutionPlan>> {
        let plan = InRuntime::new(
            self.handle.clone(),
            self.inner.scan(session, projection, filters, limit),
        )
        .await?;
        Ok(Arc::new(SealedExec::new(plan)))
    }

    fn supports_filters_pushdown(
        &self,
        filters: &[&Expr],
    ) -> DfResult<Vec<TableProviderFilterPushDown>> {
        self.inner.supports_filters_pushdown(filters)
    }
}

/// An epifusion plan handed to the caller's engine as a leaf: the caller's physical optimizer
/// cannot see (and rebuild) its children. Rebuilt by a datafusion-python optimizer, a child
/// that scans one of the caller's own tables would come back wrapped without a runtime and
/// then run on one of epifusion's threads, where the caller's library has no tokio context
/// (an abort, not an error). Sealed, the whole subtree runs in epifusion's runtime, which the
/// FFI enters when the caller executes the leaf.
///
/// With a runtime environment ([`SealedExec::with_runtime`]) the subtree also executes with
/// it in place of the caller's (a foreign task context carries a default one, without
/// epifusion's object stores).
#[derive(Debug)]
pub struct SealedExec {
    inner: Arc<dyn ExecutionPlan>,
    runtime: Option<Arc<RuntimeEnv>>,
}

impl SealedExec {
    /// Seal `inner`.
    pub fn new(inner: Arc<dyn ExecutionPlan>) -> Self {
        Self {
            inner,
            runtime: None,
        }
    }

    /// Seal `inner`, executed with `runtime`.
    pub fn with_runtime(inner: Arc<dyn ExecutionPlan>, runtime: Arc<RuntimeEnv>) -> Self {
        Self {
            inner,
            runtime: Some(runtime),
        }
    }
}

impl DisplayAs for SealedExec {
    fn fmt_as(&self, _t: DisplayFormatType, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        write!(f, "EpifusionSealedExec")
    }
}

impl ExecutionPlan for SealedExec {
    fn name(&self) -> &str {
        "EpifusionSealedExec"
    }

    fn properties(&self) -> &Arc<PlanProperties> {
        self.inner.properties()
    }

    fn children(&self) -> Vec<&Arc<dyn ExecutionPlan>> {
        vec![]
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
        if children.is_empty() {
            Ok(self)
        } else {
            Err(datafusion::common::internal_datafusion_err!(
                "EpifusionSealedExec has no children, got {}",
                children.len()
            ))
        }
    }

    fn execute(
        &self,
        partition: usize,
        context: Arc<TaskContext>,
    ) -> DfResult<SendableRecordBatchStream> {
        let Some(runtime) = &self.runtime else {
            return self.inner.execute(partition, context);
        };
        let context = Arc::new(TaskContext::new(
            context.task_id(),
            context.session_id(),
            context.session_config().clone(),
            context.scalar_functions().clone(),
            context.higher_order_functions().clone(),
            context.aggregate_functions().clone(),
            context.window_functions().clone(),
            runtime.clone(),
        ));
        self.inner.execute(partition, context)
    }
}
