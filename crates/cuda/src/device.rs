//! The CUDA backend: device discovery, NVRTC compilation of `kernels/*.cu`, device buffers of the
//! design and a coordinate stepper ([`CoordinateStepper`]) that runs every coordinate on the
//! device; cycles, the active set, retries, convergence and statuses are the core's one driver
//! ([`ccd::drive`]), as on the CPU.
//!
//! **Status: nothing here has run on a GPU yet.** The session that wrote it had no GPU and no
//! CUDA toolkit; the host layouts are checked against the brute-force references on the CPU
//! ([`crate::layout`]), the kernels compile wherever NVRTC is found, and
//! `tests/integration/gpu_parity.rs` runs the CPU golden checks on the GPU when one is found.
//! Until those pass on a GPU, `device: auto` keeps using the CPU even when a GPU is present
//! ([`GPU_VERIFIED`]); `device: cuda` runs this code.
//!
//! Everything is loaded at run time (cudarc with `dynamic-loading`): the driver library is
//! probed before any CUDA call (cudarc panics on a call without it), then the device count,
//! then NVRTC. Kernels are compiled once per process and precision for the found device's
//! architecture.
//!
//! # Work per coordinate (no host round-trip)
//!
//! | model | launches for coordinate j |
//! |---|---|
//! | SCCS | `sccs_gradient` (per-stratum transform–reduce over column j's runs) → `ccd_step` → `sccs_update` (η, t·e, D_s on the runs) |
//! | Cox, Fine–Gray | `risk_set_scatter` (column j into a dense scratch column) → `risk_set_gradient` (fused segmented scan, Breslow/Efron groups, Fine–Gray backward sums, reduction) → `ccd_step` → `risk_set_update` (η, w·e; clears the scratch) |
//!
//! β, the trust-region bounds, Δ and the KKT violation live on the device. The driver asks for
//! one cycle at a time (all coordinates, or the active set); after it β, the KKT violation and
//! the NaN flag are copied back, η is rebuilt from scratch on the device (incremental updates
//! drift) and the log-likelihood partials are copied back for the convergence check. The
//! `gradient` rule's confirmation at the returned β runs the gradient kernels alone (one small
//! copy per coordinate, once per converging cycle).
//!
//! The Cox/Fine–Gray scan is one block per coordinate (simple and deterministic); a multi-block
//! decoupled look-back scan is the next step for large N once this version is verified.
//!
//! # Verification so far (no GPU)
//!
//! * [`crate::layout`]'s unit tests: the arrays the kernels read, with the kernels' formulas
//!   evaluated serially, against the brute-force references.
//! * `kernels/host_emulation/run.sh`: the `.cu` sources themselves, compiled by g++ with a shim
//!   (one host thread per CUDA thread, a barrier for `__syncthreads`), run the fused risk-set
//!   scan on 24 cases (Cox and Fine–Gray, strata, weights, Breslow and Efron, 1 and 8 rows per
//!   thread), and `ccd.cpp` — this stepper's launches per operation — is driven by the core's
//!   driver (`crates/cuda/src/emulation.rs`): SCCS, Cox, Fine–Gray; no prior, Laplace, Normal;
//!   the active set and retries; statuses, iterations and iterates as on the CPU.
//! * Not verified: NVRTC compilation (no NVRTC here), the cudarc launches (argument lists were
//!   checked against the kernel signatures by reading), timing and the GPU memory model.
//!
//! # Batched cross-validation folds (designed, not built)
//!
//! One copy of X on the device; per fold f a row-weight vector (held-out rows weight 0) and
//! fold-major state: η, w·e and the scratch column as `[F × N]`, β, bounds and Δ as `[F × P]`,
//! partials as `[F × blocks × 3]`. Every kernel gains `blockIdx.y` = fold and offsets its state
//! pointers by it; `risk_set_gradient` runs F blocks (one per fold), `sccs_gradient` a
//! (blocks, F) grid, `ccd_step` F blocks. What depends on the weights is per fold: the group
//! event weights and counts (`grp_wsum`, `grp_d`: Efron counts in-fold events only) and, for
//! Fine–Gray, the Kaplan–Meier censoring weights of the training rows (`comp_scale`, `grp_G`).
//! Once per cycle F×P coefficients and F log-likelihoods come back; folds that converged are
//! masked out of later launches.

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Instant;

use cudarc::driver::{
    CudaContext, CudaFunction, CudaModule, CudaSlice, CudaStream, DeviceRepr, LaunchConfig,
    PushKernelArg, ValidAsZeroBits,
};
use cudarc::nvrtc::{CompileError, CompileOptions, Ptx};

use crate::layout::{CscLayout, RiskSetLayout, SccsLayout};
use epifusion_core::backend::{GpuFitStats, Precision};
use epifusion_core::error::{Error, Result};
use epifusion_core::model::ccd::{self, CcdOptions, CcdResult};
use epifusion_core::model::design::DesignMatrix;
use epifusion_core::model::prior::{Prior, PriorSet};
use epifusion_core::model::stepper::CoordinateStepper;
use epifusion_core::model::{ModelKind, Ties};

/// Whether the CUDA path has passed `gpu_parity` on a GPU. Until it has, `device: auto` uses the
/// CPU even when a GPU is found (and says so); flip it in the session that verifies the kernels.
pub const GPU_VERIFIED: bool = false;

/// Threads per block of every kernel (`EPI_BLOCK` in `kernels/common.cuh`).
const BLOCK: u32 = 256;
/// Most blocks of a grid-stride kernel (and of gradient partials).
const MAX_BLOCKS: u32 = 1024;

/// A CUDA device found at run time.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GpuInfo {
    /// Device ordinal.
    pub ordinal: usize,
    /// Device name, e.g. "NVIDIA H200".
    pub name: String,
    /// Global memory in bytes.
    pub total_memory: usize,
    /// Compute capability (major, minor).
    pub compute_capability: (i32, i32),
}

impl GpuInfo {
    /// "cuda:0 (NVIDIA H200, sm_90, 141 GB)".
    pub fn describe(&self) -> String {
        format!(
            "cuda:{} ({}, sm_{}{}, {:.0} GB)",
            self.ordinal,
            self.name,
            self.compute_capability.0,
            self.compute_capability.1,
            self.total_memory as f64 / 1e9
        )
    }
}

/// Probe the machine once: the first usable GPU, or why there is none.
pub fn probe() -> &'static std::result::Result<GpuInfo, String> {
    static PROBE: OnceLock<std::result::Result<GpuInfo, String>> = OnceLock::new();
    PROBE.get_or_init(|| {
        catch_unwind(probe_uncached)
            .unwrap_or_else(|_| Err("the CUDA driver library panicked while being probed".into()))
    })
}

fn probe_uncached() -> std::result::Result<GpuInfo, String> {
    // SAFETY: only tries to dlopen the library; no CUDA call is made.
    if !unsafe { cudarc::driver::sys::is_culib_present() } {
        return Err("no CUDA driver library (libcuda.so) was found".into());
    }
    let count = CudaContext::device_count()
        .map_err(|e| format!("the CUDA driver could not be initialized ({e})"))?;
    if count < 1 {
        return Err("the CUDA driver reports no device".into());
    }
    nvrtc_missing()?;
    let ctx = CudaContext::new(0).map_err(|e| format!("cannot open CUDA device 0 ({e})"))?;
    let err = |e: cudarc::driver::DriverError| format!("cannot query CUDA device 0 ({e})");
    Ok(GpuInfo {
        ordinal: 0,
        name: ctx.name().map_err(err)?,
        total_memory: ctx.total_mem().map_err(err)?,
        compute_capability: ctx.compute_capability().map_err(err)?,
    })
}

/// `Err(why)` when the NVRTC library (which compiles the kernels at run time) is not found.
pub fn nvrtc_missing() -> std::result::Result<(), String> {
    // SAFETY: only tries to dlopen the library.
    if unsafe { cudarc::nvrtc::sys::is_culib_present() } {
        Ok(())
    } else {
        Err(
            "no NVRTC library (libnvrtc.so, part of the CUDA toolkit) was found; it compiles the \
             kernels at run time"
                .into(),
        )
    }
}

/// The kernel sources, one per model operation, embedded in the binary.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Kernel {
    /// `kernels/ccd.cu`: the coordinate step and η from scratch.
    Ccd,
    /// `kernels/sccs.cu`: conditional Poisson.
    Sccs,
    /// `kernels/cox.cu`: Cox and Fine–Gray risk sets.
    RiskSet,
}

impl Kernel {
    /// Every kernel source.
    pub const ALL: [Kernel; 3] = [Kernel::Ccd, Kernel::Sccs, Kernel::RiskSet];

    /// File name under `kernels/`.
    pub fn file(self) -> &'static str {
        match self {
            Kernel::Ccd => "ccd.cu",
            Kernel::Sccs => "sccs.cu",
            Kernel::RiskSet => "cox.cu",
        }
    }

    fn source(self) -> &'static str {
        match self {
            Kernel::Ccd => include_str!("../../../kernels/ccd.cu"),
            Kernel::Sccs => include_str!("../../../kernels/sccs.cu"),
            Kernel::RiskSet => include_str!("../../../kernels/cox.cu"),
        }
    }

    /// Entry points (without the precision suffix).
    pub fn entry_points(self) -> &'static [&'static str] {
        match self {
            Kernel::Ccd => &["ccd_step", "eta_reset", "eta_add_column"],
            Kernel::Sccs => &["sccs_gradient", "sccs_update", "sccs_recompute"],
            Kernel::RiskSet => &[
                "risk_set_scatter",
                "risk_set_update",
                "risk_set_recompute",
                "risk_set_gradient",
            ],
        }
    }

    /// The full program NVRTC compiles: precision prelude, `common.cuh`, the kernel.
    pub fn program(self, precision: Precision) -> String {
        let val = match precision {
            Precision::F64 => "double",
            Precision::F32 => "float",
        };
        format!(
            "#define VAL_T {val}\n#define PREC(name) name##_{}\n{}\n{}",
            precision.suffix(),
            include_str!("../../../kernels/common.cuh"),
            self.source()
        )
    }
}

/// NVRTC options, all in one place. `arch` = (major, minor) of the target device; `None`
/// compiles for NVRTC's default virtual architecture (syntax checks without a device).
fn nvrtc_options(arch: Option<(i32, i32)>) -> CompileOptions {
    let mut options = vec!["--std=c++17".to_string()];
    if let Some((major, minor)) = arch {
        options.push(format!("--gpu-architecture=compute_{major}{minor}"));
    }
    CompileOptions {
        // Exact IEEE arithmetic: results are compared with the CPU to 1e-8.
        ftz: Some(false),
        prec_div: Some(true),
        prec_sqrt: Some(true),
        fmad: Some(true),
        options,
        ..Default::default()
    }
}

/// Compile one kernel to PTX with NVRTC (the caller checked [`nvrtc_missing`]).
pub fn compile(kernel: Kernel, precision: Precision, arch: Option<(i32, i32)>) -> Result<Ptx> {
    let opts = CompileOptions {
        name: Some(kernel.file().to_string()),
        ..nvrtc_options(arch)
    };
    let program = kernel.program(precision);
    let compiled = catch_unwind(AssertUnwindSafe(|| {
        cudarc::nvrtc::compile_ptx_with_opts(program, opts)
    }))
    .map_err(|_| Error::Device("NVRTC panicked (incompatible libnvrtc?)".into()))?;
    compiled.map_err(|e| {
        let log = match &e {
            CompileError::CompileError { log, .. } => log.to_string_lossy().into_owned(),
            _ => String::new(),
        };
        Error::Nvrtc {
            kernel: kernel.file().into(),
            message: e.to_string(),
            log,
        }
    })
}

/// A device context with the kernels of one precision loaded.
struct Gpu {
    stream: Arc<CudaStream>,
    functions: std::collections::HashMap<&'static str, CudaFunction>,
}

impl Gpu {
    /// The process-wide instance for `precision` (compiled and loaded on first use).
    fn get(precision: Precision) -> Result<Arc<Gpu>> {
        static CACHE: Mutex<Vec<(Precision, Arc<Gpu>)>> = Mutex::new(Vec::new());
        let mut cache = CACHE
            .lock()
            .map_err(|_| Error::Device("CUDA kernel cache poisoned".into()))?;
        if let Some((_, g)) = cache.iter().find(|(p, _)| *p == precision) {
            return Ok(g.clone());
        }
        let info = probe().as_ref().map_err(|why| Error::Device(why.clone()))?;
        let ctx = CudaContext::new(info.ordinal).map_err(driver)?;
        let mut functions = std::collections::HashMap::new();
        for kernel in Kernel::ALL {
            let ptx = compile(kernel, precision, Some(info.compute_capability))?;
            let module: Arc<CudaModule> = ctx.load_module(ptx).map_err(driver)?;
            for name in kernel.entry_points() {
                let f = module
                    .load_function(&format!("{name}_{}", precision.suffix()))
                    .map_err(driver)?;
                functions.insert(*name, f);
            }
        }
        let g = Arc::new(Gpu {
            stream: ctx.default_stream(),
            functions,
        });
        cache.push((precision, g.clone()));
        Ok(g)
    }

    fn f(&self, name: &str) -> Result<&CudaFunction> {
        self.functions
            .get(name)
            .ok_or_else(|| Error::Device(format!("internal: kernel `{name}` not loaded")))
    }

    fn upload<T: DeviceRepr + Default + Clone>(&self, host: &[T]) -> Result<CudaSlice<T>> {
        // Zero-length allocations are avoided: one padding element.
        if host.is_empty() {
            return self.stream.clone_htod(&[T::default()]).map_err(driver);
        }
        self.stream.clone_htod(host).map_err(driver)
    }

    fn zeros<T: DeviceRepr + ValidAsZeroBits>(&self, n: usize) -> Result<CudaSlice<T>> {
        self.stream.alloc_zeros(n.max(1)).map_err(driver)
    }
}

fn driver(e: cudarc::driver::DriverError) -> Error {
    Error::Device(format!("CUDA driver: {e}"))
}

/// A null device pointer for an absent optional array (the kernels test for `nullptr`).
const NULL: u64 = 0;

fn grid(work: usize) -> LaunchConfig {
    let blocks = work.div_ceil(BLOCK as usize).clamp(1, MAX_BLOCKS as usize) as u32;
    LaunchConfig {
        grid_dim: (blocks, 1, 1),
        block_dim: (BLOCK, 1, 1),
        shared_mem_bytes: 0,
    }
}

const ONE_BLOCK: LaunchConfig = LaunchConfig {
    grid_dim: (1, 1, 1),
    block_dim: (BLOCK, 1, 1),
    shared_mem_bytes: 0,
};

/// The design's columns on the device.
struct DeviceCsc {
    col_ptr: CudaSlice<i64>,
    row_idx: CudaSlice<i32>,
    val_off: CudaSlice<i64>,
    /// Values of the non-indicator columns (f64 or f32), or none when all are indicators.
    vals: Option<DeviceValues>,
    /// Host copy of the column pointers (launch sizes).
    host_col_ptr: Vec<i64>,
    bytes: usize,
}

enum DeviceValues {
    F64(CudaSlice<f64>),
    F32(CudaSlice<f32>),
}

impl DeviceCsc {
    fn upload(gpu: &Gpu, csc: &CscLayout, precision: Precision) -> Result<Self> {
        let vals = match (csc.vals.is_empty(), precision) {
            (true, _) => None,
            (false, Precision::F64) => Some(DeviceValues::F64(gpu.upload(&csc.vals)?)),
            (false, Precision::F32) => {
                let v: Vec<f32> = csc.vals.iter().map(|&v| v as f32).collect();
                Some(DeviceValues::F32(gpu.upload(&v)?))
            }
        };
        let value_bytes = match precision {
            Precision::F64 => 8,
            Precision::F32 => 4,
        };
        Ok(DeviceCsc {
            col_ptr: gpu.upload(&csc.col_ptr)?,
            row_idx: gpu.upload(&csc.row_idx)?,
            val_off: gpu.upload(&csc.val_off)?,
            vals,
            host_col_ptr: csc.col_ptr.clone(),
            bytes: 8 * csc.col_ptr.len()
                + 4 * csc.row_idx.len()
                + 8 * csc.val_off.len()
                + value_bytes * csc.vals.len(),
        })
    }

    fn nnz(&self, j: usize) -> usize {
        (self.host_col_ptr[j + 1] - self.host_col_ptr[j]) as usize
    }
}

/// Pushes the values argument (absent: null).
macro_rules! arg_vals {
    ($b:expr, $csc:expr) => {
        match &$csc.vals {
            Some(DeviceValues::F64(v)) => $b.arg(v),
            Some(DeviceValues::F32(v)) => $b.arg(v),
            None => $b.arg(&NULL),
        }
    };
}

/// Pushes an optional slice argument (absent: null).
macro_rules! arg_opt {
    ($b:expr, $o:expr) => {
        match &$o {
            Some(v) => $b.arg(v),
            None => $b.arg(&NULL),
        }
    };
}

/// CCD state on the device, shared by every model.
struct CcdState {
    beta: CudaSlice<f64>,
    bound: CudaSlice<f64>,
    prior_kind: CudaSlice<i32>,
    prior_param: CudaSlice<f64>,
    delta: CudaSlice<f64>,
    max_violation: CudaSlice<f64>,
    state: CudaSlice<i32>,
    partials: CudaSlice<f64>,
    eta: CudaSlice<f64>,
    offset: Option<CudaSlice<f64>>,
}

impl CcdState {
    fn new(gpu: &Gpu, priors: &PriorSet, n_rows: usize, offset: &[f64]) -> Result<Self> {
        let (kind, param): (Vec<i32>, Vec<f64>) = priors
            .per_coef
            .iter()
            .map(|p| match *p {
                Prior::None => (0, 0.0),
                Prior::Laplace { lambda } => (1, lambda),
                Prior::Normal { variance } => (2, variance),
            })
            .unzip();
        let p = kind.len();
        Ok(CcdState {
            beta: gpu.zeros(p)?,
            bound: gpu.zeros(p)?,
            prior_kind: gpu.upload(&kind)?,
            prior_param: gpu.upload(&param)?,
            delta: gpu.zeros(1)?,
            max_violation: gpu.zeros(1)?,
            state: gpu.zeros(1)?,
            partials: gpu.zeros(3 * MAX_BLOCKS as usize)?,
            eta: gpu.zeros(n_rows)?,
            offset: if offset.is_empty() {
                None
            } else {
                Some(gpu.upload(offset)?)
            },
        })
    }

    /// η = offset + Xβ from scratch.
    fn rebuild_eta(&mut self, gpu: &Gpu, csc: &DeviceCsc, n: usize) -> Result<()> {
        let n_i = n as i32;
        let f = gpu.f("eta_reset")?;
        let mut b = gpu.stream.launch_builder(f);
        b.arg(&n_i);
        arg_opt!(b, self.offset);
        b.arg(&mut self.eta);
        // SAFETY: eta has n elements; offset is null or has n elements.
        unsafe { b.launch(grid(n)) }.map_err(driver)?;
        let f = gpu.f("eta_add_column")?;
        for j in 0..csc.host_col_ptr.len() - 1 {
            let j_i = j as i32;
            let mut b = gpu.stream.launch_builder(f);
            b.arg(&j_i).arg(&csc.col_ptr).arg(&csc.row_idx);
            arg_vals!(b, csc);
            b.arg(&csc.val_off).arg(&self.beta).arg(&mut self.eta);
            // SAFETY: j < number of columns; the CSC row indices are < n.
            unsafe { b.launch(grid(csc.nnz(j))) }.map_err(driver)?;
        }
        Ok(())
    }

    /// The coordinate step from the gradient partials of `n_partials` blocks.
    fn step(
        &mut self,
        gpu: &Gpu,
        j: usize,
        gconst: Option<&CudaSlice<f64>>,
        n_partials: u32,
    ) -> Result<()> {
        let (j_i, np) = (j as i32, n_partials as i32);
        let mut b = gpu.stream.launch_builder(gpu.f("ccd_step")?);
        b.arg(&j_i);
        match gconst {
            Some(g) => b.arg(g),
            None => b.arg(&NULL),
        };
        b.arg(&self.partials)
            .arg(&np)
            .arg(&self.prior_kind)
            .arg(&self.prior_param)
            .arg(&mut self.beta)
            .arg(&mut self.bound)
            .arg(&mut self.delta)
            .arg(&mut self.max_violation)
            .arg(&mut self.state);
        // SAFETY: j < p; partials hold ≥ 3·n_partials values; scalars have one element.
        unsafe { b.launch(ONE_BLOCK) }.map_err(driver)?;
        Ok(())
    }

    /// Σ of the log-likelihood parts of the first `blocks` partials (host, fixed order).
    fn log_likelihood(&self, gpu: &Gpu, blocks: usize) -> Result<f64> {
        let parts = gpu
            .stream
            .clone_dtoh(&self.partials.slice(0..3 * blocks))
            .map_err(driver)?;
        Ok(parts.chunks(3).map(|c| c[2]).sum())
    }
}

/// A model's device data and kernels.
enum DeviceModel {
    Sccs {
        l: SccsLayout,
        col_run_ptr: CudaSlice<i64>,
        run_lo: CudaSlice<i64>,
        run_hi: CudaSlice<i64>,
        run_stratum: CudaSlice<i32>,
        strat_ptr: CudaSlice<i64>,
        tw: CudaSlice<f64>,
        yw: CudaSlice<f64>,
        nsum: CudaSlice<f64>,
        te: CudaSlice<f64>,
        den: CudaSlice<f64>,
        gconst: CudaSlice<f64>,
    },
    RiskSet {
        l: RiskSetLayout,
        efron: i32,
        stratum: CudaSlice<i32>,
        y: CudaSlice<i32>,
        w: CudaSlice<f64>,
        we: CudaSlice<f64>,
        xcol: CudaSlice<f64>,
        comp_scale: Option<CudaSlice<f64>>,
        grp: CudaSlice<i32>,
        grp_first: CudaSlice<i64>,
        grp_d: CudaSlice<i32>,
        grp_wsum: CudaSlice<f64>,
        grp_g: Option<CudaSlice<f64>>,
        ctot: CudaSlice<f64>,
    },
}

impl DeviceModel {
    fn n_rows(&self) -> usize {
        match self {
            DeviceModel::Sccs { l, .. } => l.tw.len(),
            DeviceModel::RiskSet { l, .. } => l.w.len(),
        }
    }

    /// Recompute the state from η (already rebuilt) and return LL (one small copy).
    fn recompute(&mut self, gpu: &Gpu, st: &mut CcdState) -> Result<f64> {
        match self {
            DeviceModel::Sccs {
                l,
                strat_ptr,
                tw,
                yw,
                nsum,
                te,
                den,
                ..
            } => {
                let s = l.n_strata() as i32;
                let cfg = grid(l.n_strata());
                let mut b = gpu.stream.launch_builder(gpu.f("sccs_recompute")?);
                b.arg(&s)
                    .arg(&*strat_ptr)
                    .arg(&*tw)
                    .arg(&*yw)
                    .arg(&*nsum)
                    .arg(&st.eta)
                    .arg(te)
                    .arg(den)
                    .arg(&mut st.partials);
                // SAFETY: strat_ptr has S+1 entries bounding the row arrays; partials ≥ 3·grid.
                unsafe { b.launch(cfg) }.map_err(driver)?;
                st.log_likelihood(gpu, cfg.grid_dim.0 as usize)
            }
            DeviceModel::RiskSet { l, w, we, .. } => {
                let n = l.w.len() as i32;
                let mut b = gpu.stream.launch_builder(gpu.f("risk_set_recompute")?);
                b.arg(&n).arg(&*w).arg(&st.eta).arg(we);
                // SAFETY: w, eta and we have n elements.
                unsafe { b.launch(grid(l.w.len())) }.map_err(driver)?;
                // xcol is all zero between coordinates: the fused kernel gives LL alone.
                self.risk_set_gradient(gpu, st)?;
                st.log_likelihood(gpu, 1)
            }
        }
    }

    fn risk_set_gradient(&mut self, gpu: &Gpu, st: &mut CcdState) -> Result<()> {
        let DeviceModel::RiskSet {
            l,
            efron,
            stratum,
            y,
            w,
            we,
            xcol,
            comp_scale,
            grp,
            grp_first,
            grp_d,
            grp_wsum,
            grp_g,
            ctot,
        } = self
        else {
            return Err(Error::Device("internal: not a risk-set model".into()));
        };
        let n = l.w.len() as i32;
        let mut b = gpu.stream.launch_builder(gpu.f("risk_set_gradient")?);
        b.arg(&n)
            .arg(&*efron)
            .arg(&*stratum)
            .arg(&*y)
            .arg(&*w)
            .arg(&st.eta)
            .arg(&*we)
            .arg(&*xcol);
        arg_opt!(b, comp_scale);
        b.arg(&*grp).arg(&*grp_first).arg(&*grp_d).arg(&*grp_wsum);
        arg_opt!(b, grp_g);
        b.arg(ctot).arg(&mut st.partials);
        // SAFETY: row arrays have n elements, group arrays one per group index in grp, ctot
        // 3 per stratum; one block writes partials[0..3].
        unsafe { b.launch(ONE_BLOCK) }.map_err(driver)?;
        Ok(())
    }

    /// One coordinate: gradient → step → update, all on the device.
    fn coordinate(
        &mut self,
        gpu: &Gpu,
        st: &mut CcdState,
        csc: &DeviceCsc,
        j: usize,
    ) -> Result<()> {
        let n_partials = self.launch_gradient(gpu, st, csc, j)?;
        let gconst = match self {
            DeviceModel::Sccs { gconst, .. } => Some(&*gconst),
            DeviceModel::RiskSet { .. } => None,
        };
        st.step(gpu, j, gconst, n_partials)?;
        self.launch_update(gpu, csc, j, &st.delta, &mut st.eta)
    }

    /// g_j at the current state, nothing moved (the driver's check at the returned β): the
    /// gradient launch, its partials summed on the host in block order (not the device's
    /// order: a check, not a step), and for risk sets an update with Δ = `zero` that only
    /// clears the scratch column.
    fn gradient(
        &mut self,
        gpu: &Gpu,
        st: &mut CcdState,
        csc: &DeviceCsc,
        zero: &CudaSlice<f64>,
        j: usize,
    ) -> Result<f64> {
        let n_partials = self.launch_gradient(gpu, st, csc, j)? as usize;
        let parts = gpu
            .stream
            .clone_dtoh(&st.partials.slice(0..3 * n_partials))
            .map_err(driver)?;
        let g: f64 = parts.chunks(3).map(|c| c[0]).sum();
        match self {
            DeviceModel::Sccs { l, .. } => Ok(l.gconst[j] + g),
            DeviceModel::RiskSet { .. } => {
                self.launch_update(gpu, csc, j, zero, &mut st.eta)?;
                Ok(g)
            }
        }
    }

    /// The gradient partials of column j into `st.partials`; returns the number of blocks
    /// that wrote them.
    fn launch_gradient(
        &mut self,
        gpu: &Gpu,
        st: &mut CcdState,
        csc: &DeviceCsc,
        j: usize,
    ) -> Result<u32> {
        let j_i = j as i32;
        match self {
            DeviceModel::Sccs {
                l,
                col_run_ptr,
                run_lo,
                run_hi,
                run_stratum,
                te,
                den,
                nsum,
                ..
            } => {
                let runs = (l.col_run_ptr[j + 1] - l.col_run_ptr[j]) as usize;
                let cfg = grid(runs);
                let mut b = gpu.stream.launch_builder(gpu.f("sccs_gradient")?);
                b.arg(&j_i).arg(&csc.col_ptr);
                arg_vals!(b, csc);
                b.arg(&csc.val_off)
                    .arg(&csc.row_idx)
                    .arg(&*col_run_ptr)
                    .arg(&*run_lo)
                    .arg(&*run_hi)
                    .arg(&*run_stratum)
                    .arg(&*te)
                    .arg(&*den)
                    .arg(&*nsum)
                    .arg(&mut st.partials);
                // SAFETY: runs index the CSC of column j; partials ≥ 3·grid blocks.
                unsafe { b.launch(cfg) }.map_err(driver)?;
                Ok(cfg.grid_dim.0)
            }
            DeviceModel::RiskSet { xcol, .. } => {
                let cfg = grid(csc.nnz(j));
                let mut b = gpu.stream.launch_builder(gpu.f("risk_set_scatter")?);
                b.arg(&j_i).arg(&csc.col_ptr).arg(&csc.row_idx);
                arg_vals!(b, csc);
                b.arg(&csc.val_off).arg(xcol);
                // SAFETY: row indices of column j are < n = len(xcol).
                unsafe { b.launch(cfg) }.map_err(driver)?;
                self.risk_set_gradient(gpu, st)?;
                Ok(1)
            }
        }
    }

    /// β_j's change by the device value `delta` into the model's state (η and the sums); for
    /// risk sets it also clears the scratch column.
    fn launch_update(
        &mut self,
        gpu: &Gpu,
        csc: &DeviceCsc,
        j: usize,
        delta: &CudaSlice<f64>,
        eta: &mut CudaSlice<f64>,
    ) -> Result<()> {
        let j_i = j as i32;
        match self {
            DeviceModel::Sccs {
                l,
                col_run_ptr,
                run_lo,
                run_hi,
                run_stratum,
                tw,
                te,
                den,
                ..
            } => {
                let runs = (l.col_run_ptr[j + 1] - l.col_run_ptr[j]) as usize;
                let mut b = gpu.stream.launch_builder(gpu.f("sccs_update")?);
                b.arg(&j_i).arg(delta).arg(&csc.col_ptr);
                arg_vals!(b, csc);
                b.arg(&csc.val_off)
                    .arg(&csc.row_idx)
                    .arg(&*col_run_ptr)
                    .arg(&*run_lo)
                    .arg(&*run_hi)
                    .arg(&*run_stratum)
                    .arg(&*tw)
                    .arg(eta)
                    .arg(te)
                    .arg(den);
                // SAFETY: as for sccs_gradient; each run (one stratum) is owned by one thread.
                unsafe { b.launch(grid(runs)) }.map_err(driver)?;
            }
            DeviceModel::RiskSet { w, we, xcol, .. } => {
                let mut b = gpu.stream.launch_builder(gpu.f("risk_set_update")?);
                b.arg(&j_i).arg(delta).arg(&csc.col_ptr).arg(&csc.row_idx);
                arg_vals!(b, csc);
                b.arg(&csc.val_off).arg(&*w).arg(eta).arg(we).arg(xcol);
                // SAFETY: row indices of column j are < n; rows of one column are distinct.
                unsafe { b.launch(grid(csc.nnz(j))) }.map_err(driver)?;
            }
        }
        Ok(())
    }

    /// Estimated device-memory traffic of one full cycle over `active` columns, bytes (reads
    /// plus writes of the kernels' arrays; an estimate from the access pattern, not a counter).
    fn bytes_per_cycle(&self, csc: &DeviceCsc, active: &[usize], value_bytes: usize) -> u64 {
        let entry = |j: usize| {
            let vb = if csc.vals.is_some() { value_bytes } else { 0 };
            csc.nnz(j) as u64 * (4 + vb as u64)
        };
        let per_col: u64 = match self {
            DeviceModel::Sccs { l, .. } => active
                .iter()
                .map(|&j| {
                    let runs = (l.col_run_ptr[j + 1] - l.col_run_ptr[j]) as u64;
                    // gradient: entries + te; runs: bounds, stratum, D, n. update: eta, te rw.
                    2 * entry(j) + csc.nnz(j) as u64 * (8 + 8 * 5) + runs * (8 + 8 + 4 + 16) * 2
                })
                .sum(),
            DeviceModel::RiskSet { l, comp_scale, .. } => {
                let n = l.w.len() as u64;
                // Row bytes read per pass: stratum, we, xcol (+ comp_scale); pass D also y, w,
                // eta, grp. Passes: A, D (+ C for Fine–Gray).
                let fg = comp_scale.is_some();
                let pass = 4 + 8 + 8 + if fg { 8 } else { 0 };
                let scan = n * (pass * if fg { 3 } else { 2 } + 4 + 8 + 8 + 4);
                active
                    .iter()
                    .map(|&j| scan + 3 * entry(j) + csc.nnz(j) as u64 * (8 * 5))
                    .sum()
            }
        };
        per_col + 8 * self.n_rows() as u64 * 3
    }
}

/// Fit `kind` on `x` by CCD on the GPU from β = 0: the core's driver
/// ([`epifusion_core::model::ccd::drive`]: trust region, priors, the active set, retries on
/// NaN/∞, the classic convergence rules, cancellation) with every coordinate stepped on the
/// device (`DeviceStepper`); returns its result and stats.
pub fn fit(
    kind: ModelKind,
    ties: Ties,
    x: &DesignMatrix,
    priors: &PriorSet,
    opts: &CcdOptions,
    precision: Precision,
) -> Result<(CcdResult, GpuFitStats)> {
    opts.check()?;
    if let Some(why) = crate::layout::unsupported(kind, x) {
        return Err(Error::Device(why));
    }
    let setup = Instant::now();
    let gpu = Gpu::get(precision)?;
    let info = probe().as_ref().map_err(|w| Error::Device(w.clone()))?;
    let (csc_layout, model, offset) = upload_model(&gpu, kind, ties, x)?;
    let csc = DeviceCsc::upload(&gpu, &csc_layout, precision)?;
    drop(csc_layout);
    let p = csc.host_col_ptr.len() - 1;
    if priors.per_coef.len() != p {
        return Err(Error::FitFailed(format!(
            "internal: {p} columns but {} priors",
            priors.per_coef.len()
        )));
    }
    let st = CcdState::new(&gpu, priors, model.n_rows(), &offset)?;
    let all: Vec<usize> = (0..p).collect();
    let value_bytes = if precision == Precision::F32 { 4 } else { 8 };
    let stats = GpuFitStats {
        device: info.describe(),
        design_bytes: csc.bytes,
        bytes_per_cycle: model.bytes_per_cycle(&csc, &all, value_bytes),
        setup_seconds: setup.elapsed().as_secs_f64(),
    };
    let mut stepper = DeviceStepper {
        zero: gpu.zeros(1)?,
        gpu: &gpu,
        st,
        model,
        csc,
        p,
    };
    let r = ccd::drive(&mut stepper, priors, &vec![0.0; p], None, opts)?;
    Ok((r, stats))
}

/// The device's [`CoordinateStepper`]: β, the trust-region bounds and the model's state live
/// on the device; a cycle launches gradient → `ccd_step` → update for each coordinate with no
/// host round trip and copies back β, the NaN flag and the largest KKT violation once.
struct DeviceStepper<'a> {
    gpu: &'a Gpu,
    st: CcdState,
    model: DeviceModel,
    csc: DeviceCsc,
    p: usize,
    /// A device Δ = 0: `risk_set_update` with it only clears the scratch column.
    zero: CudaSlice<f64>,
}

impl CoordinateStepper for DeviceStepper<'_> {
    fn n_coef(&self) -> usize {
        self.p
    }

    fn start(&mut self, beta: &[f64], bound0: f64) -> Result<f64> {
        let s = &self.gpu.stream;
        s.memcpy_htod(beta, &mut self.st.beta).map_err(driver)?;
        s.memcpy_htod(&vec![bound0; self.p], &mut self.st.bound)
            .map_err(driver)?;
        s.memset_zeros(&mut self.st.state).map_err(driver)?;
        self.refresh()
    }

    fn cycle(
        &mut self,
        coords: &[usize],
        beta: &mut [f64],
        updates: &mut u64,
    ) -> Result<Option<f64>> {
        let s = &self.gpu.stream;
        s.memset_zeros(&mut self.st.max_violation).map_err(driver)?;
        for &j in coords {
            self.model
                .coordinate(self.gpu, &mut self.st, &self.csc, j)?;
        }
        *updates += coords.len() as u64;
        // The once-per-cycle transfer: β, the NaN flag and the KKT violation.
        let b = s.clone_dtoh(&self.st.beta).map_err(driver)?;
        beta.copy_from_slice(&b[..self.p]);
        let flags = s.clone_dtoh(&self.st.state).map_err(driver)?;
        let violation = s.clone_dtoh(&self.st.max_violation).map_err(driver)?[0];
        Ok((flags[0] == 0).then_some(violation))
    }

    fn refresh(&mut self) -> Result<f64> {
        let n = self.model.n_rows();
        self.st.rebuild_eta(self.gpu, &self.csc, n)?;
        self.model.recompute(self.gpu, &mut self.st)
    }

    fn gradients(&mut self, coords: &[usize]) -> Result<Vec<f64>> {
        coords
            .iter()
            .map(|&j| {
                self.model
                    .gradient(self.gpu, &mut self.st, &self.csc, &self.zero, j)
            })
            .collect()
    }

    fn finish(&mut self, _beta: Option<&[f64]>) -> Result<()> {
        // The device state is dropped with the stepper: nothing to leave anywhere.
        self.gpu.stream.synchronize().map_err(driver)
    }
}

type Uploaded = (CscLayout, DeviceModel, Vec<f64>);

fn upload_model(gpu: &Gpu, kind: ModelKind, ties: Ties, x: &DesignMatrix) -> Result<Uploaded> {
    kind.check_rows(x)?;
    Ok(match kind {
        ModelKind::ConditionalPoisson => {
            let mut l = SccsLayout::build(x)?;
            let csc = std::mem::take(&mut l.csc);
            let offset = std::mem::take(&mut l.offset);
            let n = l.tw.len();
            let m = DeviceModel::Sccs {
                col_run_ptr: gpu.upload(&l.col_run_ptr)?,
                run_lo: gpu.upload(&l.run_lo)?,
                run_hi: gpu.upload(&l.run_hi)?,
                run_stratum: gpu.upload(&l.run_stratum)?,
                strat_ptr: gpu.upload(&l.strat_ptr)?,
                tw: gpu.upload(&l.tw)?,
                yw: gpu.upload(&l.yw)?,
                nsum: gpu.upload(&l.nsum)?,
                te: gpu.zeros(n)?,
                den: gpu.zeros(l.n_strata())?,
                gconst: gpu.upload(&l.gconst)?,
                l,
            };
            (csc, m, offset)
        }
        ModelKind::Cox | ModelKind::FineGray => {
            let mut l = RiskSetLayout::build(x, kind)?;
            let csc = std::mem::take(&mut l.csc);
            let offset = std::mem::take(&mut l.offset);
            let n = l.w.len();
            let m = DeviceModel::RiskSet {
                efron: i32::from(ties == Ties::Efron),
                stratum: gpu.upload(&l.stratum)?,
                y: gpu.upload(&l.y)?,
                w: gpu.upload(&l.w)?,
                we: gpu.zeros(n)?,
                xcol: gpu.zeros(n)?,
                comp_scale: if l.comp_scale.is_empty() {
                    None
                } else {
                    Some(gpu.upload(&l.comp_scale)?)
                },
                grp: gpu.upload(&l.grp)?,
                grp_first: gpu.upload(&l.grp_first)?,
                grp_d: gpu.upload(&l.grp_d)?,
                grp_wsum: gpu.upload(&l.grp_wsum)?,
                grp_g: if l.grp_g.is_empty() {
                    None
                } else {
                    Some(gpu.upload(&l.grp_g)?)
                },
                ctot: gpu.zeros(3 * l.n_strata.max(1))?,
                l,
            };
            (csc, m, offset)
        }
        other => {
            return Err(Error::Device(format!(
                "{} has no CUDA kernel yet",
                other.name()
            )))
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn probe_never_panics_and_explains_itself() {
        match probe() {
            Ok(info) => println!("GPU found: {}", info.describe()),
            Err(why) => {
                println!("no GPU: {why}");
                assert!(!why.is_empty());
            }
        }
    }

    /// Whether a missing tool fails the test: under CI (`CI` set) NVRTC and ptxas must be there.
    fn required() -> bool {
        std::env::var_os("CI").is_some()
    }

    /// `ptxas` from `EPIFUSION_PTXAS` or `PATH`, when it runs.
    fn ptxas() -> Option<String> {
        let ptxas = std::env::var("EPIFUSION_PTXAS").unwrap_or_else(|_| "ptxas".into());
        let ok = std::process::Command::new(&ptxas)
            .arg("--version")
            .output()
            .map(|o| o.status.success())
            .unwrap_or(false);
        ok.then_some(ptxas)
    }

    /// Assemble `ptx` for `sm_<arch>` with ptxas; panics on an error or on any register spill.
    fn assemble_without_spills(ptxas: &str, ptx: &str, arch: (i32, i32), what: &str) {
        let dir = std::env::temp_dir().join(format!("epi_ptxas_{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let file = dir.join(format!("{}.ptx", what.replace([' ', '(', ')', ','], "_")));
        std::fs::write(&file, ptx).unwrap();
        let out = std::process::Command::new(ptxas)
            .arg(format!("-arch=sm_{}{}", arch.0, arch.1))
            .arg("-v")
            .arg(&file)
            .arg("-o")
            .arg(file.with_extension("cubin"))
            .output()
            .unwrap();
        let log = String::from_utf8_lossy(&out.stderr).to_string();
        assert!(out.status.success(), "ptxas {what}:\n{log}");
        // "ptxas info    : Used 40 registers, …" and "0 bytes stack frame, 0 bytes spill stores,
        // 0 bytes spill loads" per entry point.
        let mut entries = 0;
        for line in log.lines().filter(|l| l.contains("spill stores")) {
            entries += 1;
            let spilled = line
                .split(',')
                .filter(|part| part.contains("spill"))
                .any(|part| !part.trim().starts_with("0 bytes"));
            assert!(!spilled, "{what}: register spill: {line}\n{log}");
        }
        assert!(
            entries > 0,
            "{what}: ptxas reported no entry points:\n{log}"
        );
        let _ = std::fs::remove_file(file.with_extension("cubin"));
        let _ = std::fs::remove_file(&file);
    }

    /// Every kernel in both precisions, for sm_80 and sm_90 (and the found GPU's architecture):
    /// compiled by the real NVRTC, every entry point present, and assembled by `ptxas` with no
    /// register spill. NVRTC is found through the dynamic loader (`LD_LIBRARY_PATH`), ptxas
    /// through `EPIFUSION_PTXAS` or `PATH` (pip packages `nvidia-cuda-nvrtc-cu12` and
    /// `nvidia-cuda-nvcc-cu12`; `.ci/run` sets both). Where they are missing it says SKIPPED,
    /// except under CI, where it fails.
    #[test]
    fn every_kernel_compiles_with_nvrtc_and_assembles_without_spills() {
        if let Err(why) = nvrtc_missing() {
            assert!(!required(), "CI needs NVRTC for the kernel check: {why}");
            println!("SKIPPED every_kernel_compiles_with_nvrtc: {why}");
            return;
        }
        let ptxas = ptxas();
        match &ptxas {
            Some(p) => println!("assembling with {p}"),
            None => {
                assert!(!required(), "CI needs ptxas (EPIFUSION_PTXAS or PATH)");
                println!("SKIPPED ptxas (not found): the PTX is compiled but not assembled");
            }
        }
        let mut archs = vec![(8, 0), (9, 0)];
        if let Ok(info) = probe() {
            if !archs.contains(&info.compute_capability) {
                archs.push(info.compute_capability);
            }
        }
        let mut assembled = 0;
        for arch in archs {
            for kernel in Kernel::ALL {
                for precision in [Precision::F64, Precision::F32] {
                    let what = format!("{} {precision:?} sm_{}{}", kernel.file(), arch.0, arch.1);
                    let ptx = compile(kernel, precision, Some(arch))
                        .unwrap_or_else(|e| panic!("{what}: {e}"));
                    let text = ptx.to_src();
                    for name in kernel.entry_points() {
                        let entry = format!("{name}_{}", precision.suffix());
                        assert!(
                            text.contains(&entry),
                            "{entry} missing from the PTX of {what}"
                        );
                    }
                    if let Some(p) = &ptxas {
                        assemble_without_spills(p, &text, arch, &what);
                        assembled += 1;
                    }
                }
            }
        }
        println!("{assembled} kernel builds assembled without spills");
    }

    #[test]
    fn programs_name_their_precision() {
        let p = Kernel::Sccs.program(Precision::F32);
        assert!(p.starts_with("#define VAL_T float\n#define PREC(name) name##_f32\n"));
        assert!(p.contains("ccd_newton_step") && p.contains("sccs_gradient"));
        for k in Kernel::ALL {
            for name in k.entry_points() {
                assert!(k.program(Precision::F64).contains(&format!("PREC({name})")));
            }
        }
    }
}
