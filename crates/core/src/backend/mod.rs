//! Compute backends behind one entry point.
//!
//! The CPU backend ([`cpu`]) is complete on its own. A GPU backend implements [`GpuBackend`] and
//! is installed once per process with [`install_gpu_backend`]; this crate never depends on it.
//! The CUDA backend is the `epifusion-cuda` crate (cargo feature `cuda` of `epifusion`, on by
//! default; kernels in `kernels/*.cu` compiled at run time by NVRTC): it fits SCCS, Cox and
//! Fine–Gray with every coordinate on the device. **It has not run on a GPU yet**: until
//! `tests/integration/gpu_parity.rs` passes on one, `device: auto` uses the CPU even when a GPU is
//! found, and says so; `device: cuda` runs the CUDA path (and is a clear error, naming why, where
//! there is no usable GPU). The `epifusion` CLI, SQL sessions and the `epifusion` library's
//! [`gpu`] entry install it.

pub mod cpu;

use std::sync::OnceLock;

use crate::error::{Error, Result};
use crate::model::ccd::{CcdOptions, CcdResult};
use crate::model::design::DesignMatrix;
use crate::model::prior::PriorSet;
use crate::model::{ModelKind, Ties};

/// The device a fit is asked to run on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Device {
    /// A GPU when one is usable, else the CPU (the default).
    #[default]
    Auto,
    /// The CPU (rayon).
    Cpu,
    /// An NVIDIA GPU through CUDA; an error when none is usable.
    Cuda,
}

/// Storage precision of the design's values on the device; all sums are in f64 either way.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum Precision {
    /// f64 values (the default).
    #[default]
    F64,
    /// f32 values, f64 accumulation (half the memory traffic of the values).
    F32,
}

impl Precision {
    /// Parse `f64` (`double`) or `f32` (`float`).
    pub fn parse(s: &str) -> Result<Self> {
        match s.to_ascii_lowercase().as_str() {
            "f64" | "double" => Ok(Precision::F64),
            "f32" | "float" => Ok(Precision::F32),
            other => Err(Error::option(
                "precision",
                format!("unknown `{other}`; expected f64 or f32"),
            )),
        }
    }

    /// Suffix of the kernels' entry points (`_f64`, `_f32`).
    pub fn suffix(self) -> &'static str {
        match self {
            Precision::F64 => "f64",
            Precision::F32 => "f32",
        }
    }
}

/// Where a fit runs, after [`Device::resolve`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Resolved {
    /// "cpu", or the GPU, e.g. "cuda:0 (NVIDIA H200, sm_90, 150 GB)".
    pub name: String,
    /// Why `auto` chose the CPU (None when it did not fall back).
    pub note: Option<String>,
    /// Whether the fit runs on the GPU.
    pub gpu: bool,
}

impl Resolved {
    fn cpu(note: Option<String>) -> Self {
        Resolved {
            name: "cpu".into(),
            note,
            gpu: false,
        }
    }
}

impl Device {
    /// Parse `auto`, `cpu` or `cuda` (also `gpu`).
    pub fn parse(s: &str) -> Result<Self> {
        match s.to_ascii_lowercase().as_str() {
            "auto" => Ok(Device::Auto),
            "cpu" => Ok(Device::Cpu),
            "cuda" | "gpu" => Ok(Device::Cuda),
            other => Err(Error::option(
                "device",
                format!("unknown `{other}`; expected auto, cpu or cuda"),
            )),
        }
    }

    /// Resolve to a concrete device for fitting `kind` on `x`: `auto` takes a usable GPU when
    /// the CUDA path is verified and has kernels for the model, else the CPU with a note saying
    /// why; `cuda` is an error naming why when it cannot run.
    pub fn resolve(self, kind: ModelKind, x: &DesignMatrix) -> Result<Resolved> {
        if self == Device::Cpu {
            return Ok(Resolved::cpu(None));
        }
        let found = gpu().and_then(|name| match gpu_unsupported(kind, x) {
            Some(why) => Err(format!("{name} found, but {why}")),
            None => Ok(name),
        });
        match (self, found) {
            (Device::Cuda, Ok(name)) => Ok(Resolved {
                name,
                note: None,
                gpu: true,
            }),
            (Device::Cuda, Err(why)) => Err(Error::Device(format!(
                "device `cuda` requested but {why}; use `cpu` or `auto`"
            ))),
            (_, Ok(name)) if gpu_verified() => Ok(Resolved {
                name,
                note: None,
                gpu: true,
            }),
            (_, Ok(name)) => Ok(Resolved::cpu(Some(format!(
                "device auto: using the CPU ({name} found, but the CUDA kernels have not been \
                 verified on a GPU yet; `device: cuda` runs them)"
            )))),
            (_, Err(why)) => Ok(Resolved::cpu(Some(format!(
                "device auto: using the CPU ({why})"
            )))),
        }
    }
}

/// A GPU backend: what the core needs of a device to resolve and run a fit.
///
/// Implemented by `epifusion-cuda`; installed with [`install_gpu_backend`].
pub trait GpuBackend: Send + Sync {
    /// The usable GPU's description ("cuda:0 (NVIDIA H200, sm_90, 150 GB)"), or why there is
    /// none. Must not panic when no driver is installed.
    fn probe(&self) -> std::result::Result<String, String>;
    /// Whether the backend's kernels have been verified on a GPU (`auto` uses them only then).
    fn verified(&self) -> bool;
    /// Why this backend cannot fit `kind` on `x` (None when it can).
    fn unsupported(&self, kind: ModelKind, x: &DesignMatrix) -> Option<String>;
    /// Fit `kind` on `x` by CCD on the device from β = 0 (see [`crate::model::ccd::fit`]).
    fn fit(
        &self,
        kind: ModelKind,
        ties: Ties,
        x: &DesignMatrix,
        priors: &PriorSet,
        opts: &CcdOptions,
        precision: Precision,
    ) -> Result<(CcdResult, GpuFitStats)>;
}

static GPU_BACKEND: OnceLock<&'static dyn GpuBackend> = OnceLock::new();

/// Install the process's GPU backend (the first call wins; later calls are ignored, so every
/// entry point may call it).
pub fn install_gpu_backend(backend: &'static dyn GpuBackend) {
    let _ = GPU_BACKEND.set(backend);
}

/// The installed GPU backend, or why there is none.
fn backend() -> std::result::Result<&'static dyn GpuBackend, String> {
    GPU_BACKEND.get().copied().ok_or_else(|| {
        "this build of epifusion has no CUDA backend (cargo feature `cuda` off, or no GPU \
         backend installed in this program)"
            .into()
    })
}

/// The usable GPU's description, or why there is none.
pub fn gpu() -> std::result::Result<String, String> {
    backend()?.probe()
}

fn gpu_verified() -> bool {
    backend().map(|b| b.verified()).unwrap_or(false)
}

fn gpu_unsupported(kind: ModelKind, x: &DesignMatrix) -> Option<String> {
    backend().ok().and_then(|b| b.unsupported(kind, x))
}

/// What a GPU fit reports beside its [`CcdResult`] (for `epifusion bench`).
#[derive(Debug, Clone, Default)]
pub struct GpuFitStats {
    /// The device.
    pub device: String,
    /// Bytes of the design (CSC) on the device.
    pub design_bytes: usize,
    /// Estimated device-memory traffic of one cycle, bytes (from the kernels' access pattern).
    pub bytes_per_cycle: u64,
    /// Seconds to build the layouts and upload them (and compile the kernels on first use).
    pub setup_seconds: f64,
}

/// Fit `kind` on `x` by CCD on the GPU from β = 0 (see [`crate::model::ccd::fit`] for the
/// semantics). An error when the build or the machine has no usable GPU.
pub fn gpu_fit(
    kind: ModelKind,
    ties: Ties,
    x: &DesignMatrix,
    priors: &PriorSet,
    opts: &CcdOptions,
    precision: Precision,
) -> Result<(CcdResult, GpuFitStats)> {
    backend()
        .map_err(Error::Device)?
        .fit(kind, ties, x, priors, opts, precision)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::design::{DesignBuilder, OutcomeRecord};

    fn tiny() -> DesignMatrix {
        let mut b = DesignBuilder::new();
        for i in 0..4 {
            b.push_outcome(OutcomeRecord {
                row_id: i,
                time: Some(1.0 + i as f64),
                y: (i % 2) as f64,
                ..Default::default()
            });
            b.push_covariate(i, 1, 1.0);
        }
        b.build().unwrap()
    }

    #[test]
    fn cpu_needs_no_note() {
        let r = Device::Cpu.resolve(ModelKind::Cox, &tiny()).unwrap();
        assert_eq!(r, Resolved::cpu(None));
    }

    /// Without a GPU (CI, this machine): auto → CPU saying why, cuda → an error saying why.
    /// With one: auto says the kernels are unverified (until `GPU_VERIFIED`), cuda resolves.
    #[test]
    fn auto_falls_back_and_cuda_errors_clearly() {
        let x = tiny();
        let auto = Device::Auto.resolve(ModelKind::Cox, &x).unwrap();
        let cuda = Device::Cuda.resolve(ModelKind::Cox, &x);
        match gpu() {
            Err(why) => {
                println!("no GPU here: {why}");
                assert!(!auto.gpu);
                let note = auto.note.unwrap();
                assert!(note.starts_with("device auto: using the CPU (") && note.contains(&why));
                let e = cuda.unwrap_err().to_string();
                assert!(
                    e.contains("device `cuda` requested but") && e.contains(&why),
                    "{e}"
                );
            }
            Ok(name) => {
                println!("GPU here: {name}");
                assert_eq!(auto.gpu, gpu_verified());
                assert!(cuda.unwrap().gpu);
            }
        }
        // A model with no kernel: auto always lands on the CPU; cuda is an error.
        let auto = Device::Auto.resolve(ModelKind::Logistic, &x).unwrap();
        assert!(!auto.gpu && auto.note.is_some());
        assert!(Device::Cuda.resolve(ModelKind::Logistic, &x).is_err());
    }

    #[test]
    fn precision_parses() {
        assert_eq!(Precision::parse("F32").unwrap(), Precision::F32);
        assert_eq!(Precision::parse("double").unwrap(), Precision::F64);
        assert!(Precision::parse("f16").is_err());
    }
}
