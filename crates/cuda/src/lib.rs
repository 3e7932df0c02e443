//! The CUDA backend of epifusion: host layouts of the design for the kernels ([`layout`], pure
//! Rust, tested everywhere), and with the cargo feature `cuda` the device driver ([`device`]:
//! run-time discovery through cudarc's dynamic loading, NVRTC compilation of `kernels/*.cu`, the
//! device's coordinate stepper under the core's CCD driver).
//!
//! The core (`epifusion-core`) does not depend on this crate: it reaches the GPU through its
//! [`GpuBackend`] trait, which [`CudaBackend`] implements; [`install`] installs it for the
//! process (the CLI and SQL sessions call it). Without the `cuda` feature, [`install`] does
//! nothing and every fit runs on the CPU (`device: cuda` is then an error saying why).
#![warn(missing_docs)]

#[cfg(feature = "cuda")]
pub mod device;
#[cfg(test)]
mod emulation;
pub mod layout;

#[cfg(feature = "cuda")]
use epifusion_core::backend::{GpuBackend, GpuFitStats, Precision};
#[cfg(feature = "cuda")]
use epifusion_core::error::Result;
#[cfg(feature = "cuda")]
use epifusion_core::model::ccd::{CcdOptions, CcdResult};
#[cfg(feature = "cuda")]
use epifusion_core::model::design::DesignMatrix;
#[cfg(feature = "cuda")]
use epifusion_core::model::prior::PriorSet;
#[cfg(feature = "cuda")]
use epifusion_core::model::{ModelKind, Ties};

/// The CUDA implementation of the core's [`GpuBackend`].
#[cfg(feature = "cuda")]
#[derive(Debug, Clone, Copy, Default)]
pub struct CudaBackend;

#[cfg(feature = "cuda")]
impl GpuBackend for CudaBackend {
    fn probe(&self) -> std::result::Result<String, String> {
        device::probe()
            .as_ref()
            .map(|i| i.describe())
            .map_err(Clone::clone)
    }

    fn verified(&self) -> bool {
        device::GPU_VERIFIED
    }

    fn unsupported(&self, kind: ModelKind, x: &DesignMatrix) -> Option<String> {
        layout::unsupported(kind, x)
    }

    fn fit(
        &self,
        kind: ModelKind,
        ties: Ties,
        x: &DesignMatrix,
        priors: &PriorSet,
        opts: &CcdOptions,
        precision: Precision,
    ) -> Result<(CcdResult, GpuFitStats)> {
        device::fit(kind, ties, x, priors, opts, precision)
    }
}

/// Install the CUDA backend for this process (a no-op without the `cuda` feature; later calls
/// are ignored). Finds no device here: discovery happens on the first fit that asks for one.
pub fn install() {
    #[cfg(feature = "cuda")]
    {
        static BACKEND: CudaBackend = CudaBackend;
        epifusion_core::backend::install_gpu_backend(&BACKEND);
    }
}
