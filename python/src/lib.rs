//! `epifusion._epifusion`: the extension module of the Python package (`python/epifusion`).
//!
//! * [`session::SessionContext`]: an epifusion session (every function registered, optional
//!   OMOP store, object stores from the environment) that runs SQL and returns results to Python
//!   as Arrow IPC streams (read by pyarrow without copying through Python objects).
//! * [`ffi`], [`omop`]: the functions and OMOP tables exported
//!   to datafusion-python 55 sessions through DataFusion's FFI (`datafusion-ffi` 55.2).
//!
//! Queries run on the module's tokio runtime ([`runtime::runtime`]) with the GIL released.

mod ffi;
mod omop;
mod runtime;
mod session;

use pyo3::prelude::*;

/// Names of every epifusion SQL function.
#[pyfunction]
fn function_names() -> Vec<&'static str> {
    epifusion_sql::session::function_names()
}

/// Whether the module can register into datafusion-python sessions (always: kept for scripts
/// written against builds where the FFI route was optional).
#[pyfunction]
fn has_ffi() -> bool {
    true
}

/// The Python module `epifusion._epifusion`.
#[pymodule]
fn _epifusion(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<session::SessionContext>()?;
    m.add(
        "EpifusionError",
        m.py().get_type::<session::EpifusionError>(),
    )?;
    m.add_function(wrap_pyfunction!(function_names, m)?)?;
    m.add_function(wrap_pyfunction!(has_ffi, m)?)?;
    m.add_class::<ffi::TableFunction>()?;
    m.add_class::<ffi::AggregateFunction>()?;
    m.add_class::<omop::OmopTable>()?;
    m.add_function(wrap_pyfunction!(ffi::functions, m)?)?;
    m.add_function(wrap_pyfunction!(omop::omop_tables, m)?)?;
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    Ok(())
}
