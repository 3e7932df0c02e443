//! `epifusion._epifusion`: epifusion's SQL functions and OMOP stores for datafusion-python,
//! through DataFusion's FFI (`datafusion-ffi`, the PyCapsule protocol).
//!
//! The Python package (`python/epifusion/__init__.py`) registers what this module exports:
//!
//! * [`TableFunction`]: one epifusion table function (`cox_fit`, `sccs_intervals`, …) exported
//!   as `__datafusion_table_function__` (an `FFI_TableFunction`), registered with
//!   `SessionContext.register_udtf`;
//! * [`AggregateFunction`]: one `*_fit_agg` aggregate exported as
//!   `__datafusion_aggregate_udf__` (an `FFI_AggregateUDF`), registered with
//!   `SessionContext.register_udaf`;
//! * [`OmopTable`]: one table of an OMOP store exported as `__datafusion_table_provider__`
//!   (an `FFI_TableProvider`), registered with `SessionContext.register_table`.
//!
//! **Sessions across the FFI.** A table function called from datafusion-python receives the
//! caller's session as `datafusion_ffi`'s `ForeignSession`: its catalogs (the Python session's
//! tables), configuration options and scalar / aggregate / window functions cross the boundary,
//! so input queries such as `cox_fit('SELECT … FROM lung')` see the Python session's tables.
//! What does not cross: configuration *extensions* (so `design_matrix` matrices are shared by
//! the functions of one `register` call, not read from the session), and the runtime
//! environment (a foreign session has a default one). OMOP tables therefore scan with their
//! own runtime ([`omop::OwnRuntimeTable`]): the object stores of epifusion's environment
//! registry (`s3://`, `gs://`, `az://`, `http(s)://` from the usual variables).
//!
//! Async work (scans, planning) runs on this module's own tokio runtime: the Python side's
//! runtime lives in another shared library, whose tokio thread-locals this one cannot see.

mod omop;
mod runtime;

pub(crate) use runtime::runtime;

use std::ffi::CString;
use std::sync::Arc;

use datafusion::catalog::TableFunctionImpl;
use datafusion::logical_expr::AggregateUDF;
use datafusion_ffi::proto::logical_extension_codec::FFI_LogicalExtensionCodec;
use datafusion_ffi::udaf::FFI_AggregateUDF;
use datafusion_ffi::udtf::FFI_TableFunction;
use epifusion_sql::design_table::DesignRegistry;
use epifusion_sql::fit_udaf::FitAggregate;
use epifusion_sql::registry::{sql_functions, SqlRole};
use pyo3::exceptions::PyTypeError;
use pyo3::prelude::*;
use pyo3::types::PyCapsule;

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
        let udtf = Arc::new(runtime::InRuntimeFunction::new(
            self.udtf.clone(),
            handle.clone(),
        ));
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
fn functions(py: Python<'_>, session: &Bound<'_, PyAny>) -> PyResult<Vec<Py<PyAny>>> {
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

/// Names of every epifusion SQL function.
#[pyfunction]
fn function_names() -> Vec<&'static str> {
    epifusion_sql::session::function_names()
}

/// The Python module `epifusion._epifusion`.
#[pymodule]
fn _epifusion(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<TableFunction>()?;
    m.add_class::<AggregateFunction>()?;
    m.add_class::<omop::OmopTable>()?;
    m.add_function(wrap_pyfunction!(functions, m)?)?;
    m.add_function(wrap_pyfunction!(function_names, m)?)?;
    m.add_function(wrap_pyfunction!(omop::omop_tables, m)?)?;
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    Ok(())
}
