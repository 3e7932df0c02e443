//! OMOP store tables for a datafusion-python session.
//!
//! [`omop_tables`] opens the store in an epifusion session of its own (the object stores of
//! [`epifusion_sql::store::EnvObjectStoreRegistry`]: local folders, `file://`, `s3://`, `gs://`,
//! `az://`, `http(s)://`) and returns its tables. A foreign session has a default runtime
//! environment without those stores, so each table plans and executes its scans with the
//! epifusion session's state and runtime ([`OwnRuntimeTable`], sealed with that runtime: [`crate::ffi::SealedExec::with_runtime`]).

use std::sync::Arc;

use async_trait::async_trait;
use datafusion::arrow::datatypes::SchemaRef;
use datafusion::catalog::{Session, TableProvider};
use datafusion::common::Result as DfResult;
use datafusion::datasource::TableType;
use datafusion::execution::SessionState;
use datafusion::logical_expr::{Expr, TableProviderFilterPushDown};
use datafusion::physical_plan::ExecutionPlan;
use datafusion_ffi::table_provider::FFI_TableProvider;
use epifusion_sql::session::{new_session, SessionOptions};
use pyo3::prelude::*;
use pyo3::types::PyCapsule;

/// A table that plans its scans in its own session (`state`) whatever session calls it.
#[derive(Debug)]
pub struct OwnRuntimeTable {
    inner: Arc<dyn TableProvider>,
    state: SessionState,
}

#[async_trait]
impl TableProvider for OwnRuntimeTable {
    fn schema(&self) -> SchemaRef {
        self.inner.schema()
    }

    fn table_type(&self) -> TableType {
        self.inner.table_type()
    }

    async fn scan(
        &self,
        _caller: &dyn Session,
        projection: Option<&Vec<usize>>,
        filters: &[Expr],
        limit: Option<usize>,
    ) -> DfResult<Arc<dyn ExecutionPlan>> {
        let handle = crate::runtime::runtime()
            .map_err(|e| datafusion::common::DataFusionError::External(e.to_string().into()))?
            .handle()
            .clone();
        let scan = self.inner.scan(&self.state, projection, filters, limit);
        let plan = crate::ffi::InRuntime::new(handle, scan).await?;
        Ok(Arc::new(crate::ffi::SealedExec::with_runtime(
            plan,
            self.state.runtime_env().clone(),
        )))
    }

    fn supports_filters_pushdown(
        &self,
        filters: &[&Expr],
    ) -> DfResult<Vec<TableProviderFilterPushDown>> {
        self.inner.supports_filters_pushdown(filters)
    }
}

/// One table of an OMOP store, for `SessionContext.register_table`.
#[pyclass(module = "epifusion._epifusion", frozen)]
pub struct OmopTable {
    provider: Arc<dyn TableProvider>,
}

#[pymethods]
impl OmopTable {
    /// The `FFI_TableProvider` capsule (`datafusion_table_provider`); `session` is the
    /// datafusion-python session (or its logical codec capsule).
    fn __datafusion_table_provider__<'py>(
        &self,
        py: Python<'py>,
        session: &Bound<'py, PyAny>,
    ) -> PyResult<Bound<'py, PyCapsule>> {
        let codec = crate::ffi::session_codec(session)?;
        let handle = crate::runtime::runtime()?.handle().clone();
        let ffi =
            FFI_TableProvider::new_with_ffi_codec(self.provider.clone(), true, Some(handle), codec);
        PyCapsule::new(
            py,
            ffi,
            Some(std::ffi::CString::from(c"datafusion_table_provider")),
        )
    }
}

/// The tables of the OMOP store at `location` (a folder or an object-store URL): a list of
/// `(name, OmopTable)`.
#[pyfunction]
pub fn omop_tables(py: Python<'_>, location: String) -> PyResult<Vec<(String, Py<OmopTable>)>> {
    let rt = crate::runtime::runtime()?;
    let found = py
        .detach(|| {
            rt.block_on(async {
                let ctx = new_session(&SessionOptions::default()).await?;
                let found = epifusion_sql::omop::register_omop(&ctx, &location).await?;
                let state = ctx.state();
                let mut tables = Vec::new();
                for t in found {
                    let provider = ctx.table_provider(t.name.as_str()).await?;
                    tables.push((t.name, provider));
                }
                Ok::<_, datafusion::error::DataFusionError>((tables, state))
            })
        })
        .map_err(|e| crate::session::EpifusionError::new_err(e.strip_backtrace()))?;
    let (tables, state) = found;
    tables
        .into_iter()
        .map(|(name, inner)| {
            let provider: Arc<dyn TableProvider> = Arc::new(OwnRuntimeTable {
                inner,
                state: state.clone(),
            });
            Ok((name, Py::new(py, OmopTable { provider })?))
        })
        .collect()
}
