//! [`SessionContext`]: an epifusion session for Python.
//!
//! The same session as `epifusion sql` ([`epifusion_sql::session::new_session`]): every
//! function registered, the OMOP store's tables when one is given, object stores from the
//! environment (`s3://`, `gs://`, `az://`, `http(s)://`). Results cross to Python as an Arrow
//! IPC stream (`pyarrow.ipc.open_stream`), so pyarrow / pandas / polars read them; errors are
//! raised as `epifusion.EpifusionError` carrying DataFusion's message (the CLI prints the same
//! message after `error: `).

use std::sync::Arc;

use datafusion::arrow::datatypes::Schema;
use datafusion::arrow::ipc::reader::StreamReader;
use datafusion::arrow::ipc::writer::StreamWriter;
use datafusion::arrow::record_batch::RecordBatch;
use datafusion::common::{exec_datafusion_err, plan_err, DataFusionError, Result as DfResult};
use datafusion::datasource::MemTable;
use epifusion_sql::session::{new_session, SessionOptions};
use epifusion_sql::shell::split_statements;
use pyo3::create_exception;
use pyo3::exceptions::PyRuntimeError;
use pyo3::prelude::*;
use pyo3::types::PyBytes;

use crate::runtime::runtime;

create_exception!(
    _epifusion,
    EpifusionError,
    PyRuntimeError,
    "An error from epifusion or DataFusion (planning, bad input, a failed fit)."
);

fn py_err(e: DataFusionError) -> PyErr {
    EpifusionError::new_err(e.strip_backtrace())
}

/// An epifusion session (see the module documentation).
#[pyclass(module = "epifusion._epifusion", frozen)]
pub struct SessionContext {
    ctx: Arc<datafusion::prelude::SessionContext>,
}

#[pymethods]
impl SessionContext {
    /// A new session; `omop`: an OMOP store (folder or URL) whose tables are registered;
    /// `batch_size`: DataFusion's batch size (default 8192).
    #[new]
    #[pyo3(signature = (omop = None, batch_size = None))]
    fn new(py: Python<'_>, omop: Option<String>, batch_size: Option<usize>) -> PyResult<Self> {
        let opts = SessionOptions { omop, batch_size };
        let rt = runtime()?;
        let ctx = py
            .detach(|| rt.block_on(new_session(&opts)))
            .map_err(py_err)?;
        Ok(Self { ctx: Arc::new(ctx) })
    }

    /// Register the OMOP-CDM tables of the store at `location` (folder or object-store URL);
    /// returns their names.
    fn register_omop(&self, py: Python<'_>, location: String) -> PyResult<Vec<String>> {
        let rt = runtime()?;
        let ctx = self.ctx.clone();
        let found = py
            .detach(|| {
                rt.block_on(
                    async move { epifusion_sql::omop::register_omop(&ctx, &location).await },
                )
            })
            .map_err(py_err)?;
        Ok(found.into_iter().map(|t| t.name).collect())
    }

    /// Run `sql` (one or more `;`-separated statements, as `epifusion sql -c`); returns the
    /// last statement's result as Arrow IPC stream bytes (the Python wrapper reads them with
    /// pyarrow).
    fn sql_ipc<'py>(&self, py: Python<'py>, sql: String) -> PyResult<Bound<'py, PyBytes>> {
        let rt = runtime()?;
        let ctx = self.ctx.clone();
        let bytes = py
            .detach(|| rt.block_on(async move { run_last(&ctx, &sql).await.and_then(to_ipc) }))
            .map_err(py_err)?;
        Ok(PyBytes::new(py, &bytes))
    }

    /// Register the Arrow IPC stream `ipc` (a pyarrow table the wrapper serialized) as the
    /// in-memory table `name`, replacing one of that name.
    fn register_ipc(&self, name: String, ipc: &[u8]) -> PyResult<()> {
        let reader = StreamReader::try_new(std::io::Cursor::new(ipc), None)
            .map_err(|e| py_err(DataFusionError::from(e)))?;
        let schema = reader.schema();
        let batches = reader
            .collect::<Result<Vec<RecordBatch>, _>>()
            .map_err(|e| py_err(DataFusionError::from(e)))?;
        let table = MemTable::try_new(schema, vec![batches]).map_err(py_err)?;
        let _ = self.ctx.deregister_table(name.as_str()).map_err(py_err)?;
        self.ctx
            .register_table(name.as_str(), Arc::new(table))
            .map_err(py_err)?;
        Ok(())
    }

    /// Names of the tables in the session's default schema.
    fn table_names(&self) -> Vec<String> {
        let state = self.ctx.state();
        let opts = &state.config().options().catalog;
        self.ctx
            .catalog(&opts.default_catalog)
            .and_then(|c| c.schema(&opts.default_schema))
            .map(|s| s.table_names())
            .unwrap_or_default()
    }
}

/// Run every statement of `sql`; the last one's schema and batches.
async fn run_last(
    ctx: &datafusion::prelude::SessionContext,
    sql: &str,
) -> DfResult<(Arc<Schema>, Vec<RecordBatch>)> {
    let statements = split_statements(sql);
    let Some((last, first)) = statements.split_last() else {
        return plan_err!("no SQL statement given");
    };
    for stmt in first {
        ctx.sql(stmt).await?.collect().await?;
    }
    let df = ctx.sql(last).await?;
    let schema = Arc::new(df.schema().as_arrow().clone());
    Ok((schema, df.collect().await?))
}

fn to_ipc((schema, batches): (Arc<Schema>, Vec<RecordBatch>)) -> DfResult<Vec<u8>> {
    let mut out = Vec::new();
    {
        let mut w = StreamWriter::try_new(&mut out, &schema)?;
        for b in &batches {
            w.write(b)?;
        }
        w.finish()?;
    }
    if out.is_empty() {
        return Err(exec_datafusion_err!("empty Arrow IPC stream"));
    }
    Ok(out)
}
