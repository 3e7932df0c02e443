//! Compute backends behind one entry point.
//!
//! The CPU backend ([`cpu`]) is complete on its own. A CUDA backend (kernels in `kernels/`,
//! compiled at run time by NVRTC) is planned; until it lands, `device: auto` resolves to the CPU
//! and says why, and `device: cuda` is a clear error.

pub mod cpu;
pub mod layout;

use crate::error::{Error, Result};

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

    /// Resolve to a concrete device: `(name, note)` where `note` says why the CPU was chosen
    /// under `auto`.
    pub fn resolve(self) -> Result<(&'static str, Option<String>)> {
        const WHY: &str = "this build of epifusion has no CUDA backend yet";
        match self {
            Device::Cpu => Ok(("cpu", None)),
            Device::Auto => Ok(("cpu", Some(format!("device auto: using the CPU ({WHY})")))),
            Device::Cuda => Err(Error::Device(format!(
                "device `cuda` requested but {WHY}; use `cpu` or `auto`"
            ))),
        }
    }
}
