//! The module's tokio runtime: queries run on it, with the GIL released.

use std::sync::OnceLock;

use pyo3::exceptions::PyRuntimeError;
use pyo3::PyResult;
use tokio::runtime::Runtime;

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
