//! Running epifusion's async work on this module's tokio runtime.
//!
//! datafusion-python polls the futures and streams it receives through the FFI on its own
//! executor, in another shared library whose tokio thread-locals this library cannot see.
//! `datafusion-ffi` enters the runtime handle given to it around `execute` and each stream
//! poll, but not around a table provider's `scan`; the study designs plan and run queries of
//! their own there (DataFusion spawns tasks), so [`InRuntimeFunction`] / [`InRuntimeTable`]
//! enter the module's runtime around every poll of a scan ([`InRuntime`]).

use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, OnceLock};
use std::task::{Context, Poll};

use async_trait::async_trait;
use datafusion::arrow::datatypes::SchemaRef;
use datafusion::catalog::{Session, TableFunctionArgs, TableFunctionImpl, TableProvider};
use datafusion::common::Result as DfResult;
use datafusion::datasource::TableType;
use datafusion::logical_expr::{Expr, TableProviderFilterPushDown};
use datafusion::physical_plan::ExecutionPlan;
use pyo3::exceptions::PyRuntimeError;
use pyo3::PyResult;
use tokio::runtime::{Handle, Runtime};

/// The module's tokio runtime (multi-threaded, created on first use).
pub fn runtime() -> PyResult<&'static Runtime> {
    static RUNTIME: OnceLock<Result<Runtime, String>> = OnceLock::new();
    RUNTIME
        .get_or_init(|| {
            tokio::runtime::Builder::new_multi_thread()
                .thread_name("epifusion-python")
                .enable_all()
                .build()
                .map_err(|e| e.to_string())
        })
        .as_ref()
        .map_err(|e| PyRuntimeError::new_err(format!("cannot start the tokio runtime: {e}")))
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
        InRuntime::new(
            self.handle.clone(),
            self.inner.scan(session, projection, filters, limit),
        )
        .await
    }

    fn supports_filters_pushdown(
        &self,
        filters: &[&Expr],
    ) -> DfResult<Vec<TableProviderFilterPushDown>> {
        self.inner.supports_filters_pushdown(filters)
    }
}
