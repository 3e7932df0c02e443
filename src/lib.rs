//! # epifusion
//!
//! Large-scale regularized regression for drug-safety and comparative-effectiveness research:
//! self-controlled case series (conditional Poisson), Cox and Fine–Gray models (plus logistic,
//! Poisson and conditional logistic regression) fitted by cyclic coordinate descent.
//!
//! This crate is the `epifusion` binary and a façade over the workspace's layers (one direction
//! of dependency):
//!
//! | module | crate | what |
//! |---|---|---|
//! | [`model`], [`fit`], [`bench`], [`error`] | `epifusion-core` | pure numerics, the CPU backend, the fit API |
//! | [`backend`] | `epifusion-core` + `epifusion-cuda` | devices; the CUDA backend behind the core's `GpuBackend` trait |
//! | [`engine`] | `epifusion-sql` | Arrow / Parquet / CSV glue, SQL functions, OMOP stores, study designs |
//! | [`pipeline`] | `epifusion-pipeline` | study files run by `epifusion run` |
//! | [`flight`] | `epifusion-flight` | the Arrow Flight SQL server of `epifusion serve` |
//!
//! The CLI (`src/main.rs`, one module per subcommand in `src/cli/`) sits on top.
#![warn(missing_docs)]

pub use epifusion_cluster as cluster;
pub use epifusion_core::{bench, error, fit, model, options, Error, Result};
pub use epifusion_flight as flight;
pub use epifusion_pipeline as pipeline;
pub use epifusion_sql as engine;

/// Devices: the core's [`epifusion_core::backend`] with the CUDA backend installed.
pub mod backend {
    pub use epifusion_core::backend::*;

    /// The usable GPU's description, or why there is none (installs the CUDA backend first, see
    /// [`crate::init`]).
    pub fn gpu() -> std::result::Result<String, String> {
        crate::init();
        epifusion_core::backend::gpu()
    }
}

/// Install the CUDA backend (cargo feature `cuda`) for this process, so that `device: auto` and
/// `device: cuda` can use a GPU. The CLI, SQL sessions and [`backend::gpu`] call it; library
/// users fitting through [`fit`] directly call it once first. Cheap and idempotent. It also
/// registers the cluster tasks this program runs ([`pipeline::remote`]: a pipeline unit sent by
/// `epifusion run --cluster`), so that every node started from this binary can run them.
pub fn init() {
    epifusion_cuda::install();
    epifusion_pipeline::remote::register();
}
