//! One test body per case, run on every device (`on_every_device!`): `cpu::<case>` always,
//! `cuda_f64::<case>` and `cuda_f32::<case>` only where a GPU is found (elsewhere they print
//! `SKIPPED … (why)` and pass). Each body fits through the public API on its device, checks the
//! golden values (f64 runs) and agrees with the CPU fit: 1e-8 with f64 storage, 1e-4 with f32
//! (issue #5). A session with a GPU runs `cargo test --test integration gpu_parity -- --nocapture`.
//!
//! Also here: device selection from the Rust API, SQL options and the CLI (`auto` falls back to
//! the CPU saying why; `cuda` without a usable GPU is a clear error).

use std::process::Command;

use epifusion::backend::{self, Device, Precision};
use epifusion::bench;
use epifusion::fit::{fit, CiMethod, FitOptions, FitResult};
use epifusion::model::ccd::{Convergence, FitStatus};
use epifusion::model::design::{DesignBuilder, DesignMatrix, OutcomeRecord};
use epifusion::model::prior::Prior;
use epifusion::model::{ModelKind, Ties};

use crate::golden_support::{assert_ref, assert_refs};

/// A device (and storage precision) a case runs on, with its agreement tolerance.
#[derive(Debug, Clone, Copy)]
struct Run {
    device: Device,
    precision: Precision,
}

impl Run {
    const CPU: Run = Run {
        device: Device::Cpu,
        precision: Precision::F64,
    };

    /// The GPU run, or None (printing why) when there is no usable GPU.
    fn gpu(precision: Precision, case: &str) -> Option<Run> {
        match backend::gpu() {
            Ok(_) => Some(Run {
                device: Device::Cuda,
                precision,
            }),
            Err(why) => {
                println!(
                    "SKIPPED gpu_parity::cuda_{}::{case}: no GPU ({why})",
                    precision.suffix()
                );
                None
            }
        }
    }

    /// Relative agreement with the CPU fit required of this run.
    fn tolerance(self) -> f64 {
        match self.precision {
            Precision::F64 => 1e-8,
            Precision::F32 => 1e-4,
        }
    }

    /// Golden values are checked on f64 runs (f32 storage rounds the data itself).
    fn golden(self) -> bool {
        self.precision == Precision::F64
    }
}

macro_rules! on_every_device {
    ($($case:ident),* $(,)?) => {
        mod cpu {
            $( #[test] fn $case() { super::$case(super::Run::CPU); } )*
        }
        mod cuda_f64 {
            $( #[test] fn $case() {
                if let Some(r) = super::Run::gpu(epifusion::backend::Precision::F64, stringify!($case)) {
                    super::$case(r);
                }
            } )*
        }
        mod cuda_f32 {
            $( #[test] fn $case() {
                if let Some(r) = super::Run::gpu(epifusion::backend::Precision::F32, stringify!($case)) {
                    super::$case(r);
                }
            } )*
        }
    };
}

on_every_device!(
    lung_breslow,
    lung_efron,
    therneau_test1_breslow,
    therneau_test1_efron,
    therneau_test3_weighted_breslow,
    therneau_test3_weighted_efron,
    cmprsk_fine_gray,
    amdat_sccs,
    synthetic_cox_laplace,
    synthetic_fine_gray_laplace,
    synthetic_sccs_laplace,
    synthetic_stratified_ties_efron,
    synthetic_stratified_fine_gray_efron,
);

fn options(run: Run, model: ModelKind, ties: Ties, prior: Prior) -> FitOptions {
    let mut o = FitOptions::new(model);
    o.ties = ties;
    o.prior = prior;
    o.ci = CiMethod::None;
    o.device = run.device;
    o.precision = run.precision;
    o.ccd.convergence = Convergence::Gradient;
    o.ccd.tolerance = 1e-11;
    o.ccd.max_iterations = 100_000;
    o
}

/// Fit on `run`'s device and check agreement with the CPU fit; returns the run's fit.
fn fit_and_compare(run: Run, x: &DesignMatrix, opts: &FitOptions) -> FitResult {
    let r = fit(x, opts).unwrap_or_else(|e| panic!("fit on {:?}: {e}", run.device));
    assert_eq!(r.status, FitStatus::Converged, "{:?}", run);
    if run.device == Device::Cuda {
        assert!(r.device.starts_with("cuda"), "ran on {}", r.device);
        let cpu = fit(
            x,
            &FitOptions {
                device: Device::Cpu,
                ..opts.clone()
            },
        )
        .expect("cpu fit");
        let tol = run.tolerance();
        let close = |a: f64, b: f64| (a - b).abs() <= tol * (1.0 + a.abs().max(b.abs()));
        for (g, c) in r.coefficients.iter().zip(&cpu.coefficients) {
            assert!(
                close(g.estimate, c.estimate),
                "β[{}]: gpu {} vs cpu {} ({:?})",
                c.covariate_id,
                g.estimate,
                c.estimate,
                run.precision
            );
        }
        assert!(
            close(r.log_likelihood, cpu.log_likelihood),
            "LL: gpu {} vs cpu {}",
            r.log_likelihood,
            cpu.log_likelihood
        );
    } else {
        assert_eq!(r.device, "cpu");
    }
    r
}

fn estimates(r: &FitResult) -> Vec<f64> {
    r.coefficients.iter().map(|c| c.estimate).collect()
}

fn ml(run: Run, x: &DesignMatrix, model: ModelKind, ties: Ties) -> FitResult {
    fit_and_compare(run, x, &options(run, model, ties, Prior::None))
}

// ---------------------------------------------------------------------------------------------
// Golden data (values as in golden_cox / golden_fine_gray / golden_sccs).

fn lung_breslow(run: Run) {
    let r = ml(
        run,
        &crate::golden_cox::lung().design(),
        ModelKind::Cox,
        Ties::Breslow,
    );
    if run.golden() {
        assert_refs(
            "lung breslow β",
            &estimates(&r),
            &["0.01701289", "-0.51256479"],
        );
        assert_ref("lung breslow LL", r.log_likelihood, "-743.0797");
    }
}

fn lung_efron(run: Run) {
    let r = ml(
        run,
        &crate::golden_cox::lung().design(),
        ModelKind::Cox,
        Ties::Efron,
    );
    if run.golden() {
        assert_refs(
            "lung efron β",
            &estimates(&r),
            &["0.01704533", "-0.51321852"],
        );
        assert_ref("lung efron LL", r.log_likelihood, "-742.8482");
    }
}

fn therneau_test1_breslow(run: Run) {
    let r = ml(
        run,
        &crate::golden_cox::test1().design(),
        ModelKind::Cox,
        Ties::Breslow,
    );
    if run.golden() {
        assert_ref("test1 breslow β", r.coefficients[0].estimate, "1.475285");
        assert_ref("test1 breslow LL", r.log_likelihood, "-3.824750");
    }
}

fn therneau_test1_efron(run: Run) {
    let r = ml(
        run,
        &crate::golden_cox::test1().design(),
        ModelKind::Cox,
        Ties::Efron,
    );
    if run.golden() {
        assert_ref("test1 efron β", r.coefficients[0].estimate, "1.676857");
    }
}

fn therneau_test3_weighted_breslow(run: Run) {
    let r = ml(
        run,
        &crate::golden_cox::test3().design(),
        ModelKind::Cox,
        Ties::Breslow,
    );
    if run.golden() {
        assert_ref("test3 breslow β", r.coefficients[0].estimate, "0.8595574");
        assert_ref("test3 breslow LL", r.log_likelihood, "-32.021046");
    }
}

fn therneau_test3_weighted_efron(run: Run) {
    let r = ml(
        run,
        &crate::golden_cox::test3().design(),
        ModelKind::Cox,
        Ties::Efron,
    );
    if run.golden() {
        assert_ref("test3 efron β", r.coefficients[0].estimate, "0.87260425");
        assert_ref("test3 efron LL", r.log_likelihood, "-29.41678");
    }
}

fn cmprsk_fine_gray(run: Run) {
    let x = crate::golden_fine_gray::cmprsk_testdata().design();
    let r = ml(run, &x, ModelKind::FineGray, Ties::Breslow);
    if run.golden() {
        assert_refs(
            "crr β",
            &estimates(&r),
            &["-0.2913250", "-0.0634563", "-0.4751110"],
        );
    }
}

fn amdat_sccs(run: Run) {
    let x = crate::golden_sccs::amdat();
    let r = ml(run, &x, ModelKind::ConditionalPoisson, Ties::Breslow);
    if run.golden() {
        let b = r.coefficient(1000).expect("risk window").estimate;
        assert!((b - 2.487975).abs() <= 1e-6 * 2.487975, "RI coef {b}");
        let age = r.coefficient(101).expect("age group").estimate;
        assert!((age + 1.490576).abs() <= 1e-6 * 1.490576, "age2 coef {age}");
    }
}

// ---------------------------------------------------------------------------------------------
// Synthetic data (the `epifusion bench` generators, small), Laplace prior.

fn laplace(run: Run, x: &DesignMatrix, model: ModelKind, ties: Ties, lambda: f64) {
    let r = fit_and_compare(
        run,
        x,
        &options(run, model, ties, Prior::Laplace { lambda }),
    );
    assert!(r.coefficients.iter().any(|c| c.estimate != 0.0));
}

fn synthetic_cox_laplace(run: Run) {
    let d = bench::cox_data(3000, 60, 0.05, 7).expect("data");
    laplace(run, &d.design, ModelKind::Cox, Ties::Breslow, 10.0);
}

fn synthetic_fine_gray_laplace(run: Run) {
    let d = bench::fine_gray_data(3000, 60, 0.05, 8).expect("data");
    laplace(run, &d.design, ModelKind::FineGray, Ties::Breslow, 10.0);
}

fn synthetic_sccs_laplace(run: Run) {
    let d = bench::sccs_data(500, 40, 9).expect("data");
    laplace(
        run,
        &d.design,
        ModelKind::ConditionalPoisson,
        Ties::Breslow,
        1.0,
    );
}

/// Strata, case weights, heavily tied times, indicator and real-valued columns.
fn stratified(seed: u64, fine_gray: bool) -> DesignMatrix {
    let mut s = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    let mut unif = move || {
        s ^= s >> 12;
        s ^= s << 25;
        s ^= s >> 27;
        (s.wrapping_mul(0x2545_F491_4F6C_DD1D) >> 11) as f64 / (1u64 << 53) as f64
    };
    let mut b = DesignBuilder::new();
    for i in 0..800i64 {
        let u = unif();
        let y = if fine_gray {
            (u * 3.0).floor()
        } else {
            f64::from(u < 0.6)
        };
        b.push_outcome(OutcomeRecord {
            row_id: i,
            stratum_id: Some((unif() * 5.0) as i64),
            time: Some(1.0 + (unif() * 30.0).floor()),
            y,
            weight: Some(0.5 + unif()),
            ..Default::default()
        });
        for j in 0..6i64 {
            if unif() < 0.3 {
                let v = if j < 3 { 1.0 } else { unif() * 2.0 - 1.0 };
                b.push_covariate(i, j + 1, v);
            }
        }
    }
    b.build().expect("valid data")
}

fn synthetic_stratified_ties_efron(run: Run) {
    ml(run, &stratified(11, false), ModelKind::Cox, Ties::Efron);
}

fn synthetic_stratified_fine_gray_efron(run: Run) {
    ml(run, &stratified(12, true), ModelKind::FineGray, Ties::Efron);
}

// ---------------------------------------------------------------------------------------------
// Device selection from the Rust API, SQL options and the CLI.

fn tiny() -> DesignMatrix {
    crate::golden_cox::test1().design()
}

#[test]
fn rust_api_auto_falls_back_and_cuda_is_a_clear_error() {
    let x = tiny();
    let mut o = FitOptions::new(ModelKind::Cox);
    let auto = fit(&x, &o).expect("auto always fits");
    o.device = Device::Cuda;
    let cuda = fit(&x, &o);
    match backend::gpu() {
        Err(why) => {
            assert_eq!(auto.device, "cpu");
            let note = auto.device_note.expect("auto says why it used the CPU");
            assert!(note.contains(&why), "{note}");
            let e = cuda.expect_err("cuda without a GPU").to_string();
            assert!(
                e.contains("device `cuda` requested but") && e.contains(&why),
                "{e}"
            );
        }
        Ok(name) => println!(
            "GPU {name}: device {} / {:?}",
            auto.device,
            cuda.map(|r| r.device)
        ),
    }
    // No kernel for the model: cuda is an error everywhere, auto uses the CPU.
    let mut o = FitOptions::new(ModelKind::Logistic);
    o.device = Device::Cuda;
    let e = fit(&x, &o).expect_err("no logistic kernel").to_string();
    assert!(e.contains("device `cuda` requested but"), "{e}");
}

#[test]
fn sql_device_option() {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let ctx = epifusion::engine::session::new_session(&Default::default())
            .await
            .unwrap();
        ctx.sql(
            "CREATE EXTERNAL TABLE test1 STORED AS CSV LOCATION 'tests/data/therneau_test1.csv' \
             OPTIONS ('format.has_header' 'true')",
        )
        .await
        .unwrap();
        let run = |opts: &'static str| {
            let ctx = ctx.clone();
            async move {
                let q = format!(
                    "SELECT * FROM cox_fit('SELECT time, status AS y, x FROM test1', '{opts}')"
                );
                match ctx.sql(&q).await {
                    Ok(df) => df.collect().await.map(|_| ()).map_err(|e| e.to_string()),
                    Err(e) => Err(e.to_string()),
                }
            }
        };
        run(r#"{"device": "auto"}"#).await.expect("auto fits");
        run(r#"{"device": "cpu", "precision": "f32"}"#)
            .await
            .expect("precision is accepted (and ignored on the CPU)");
        let e = run(r#"{"precision": "f16"}"#).await.unwrap_err();
        assert!(e.contains("precision"), "{e}");
        let cuda = run(r#"{"device": "cuda"}"#).await;
        if let Err(why) = backend::gpu() {
            let e = cuda.unwrap_err();
            assert!(
                e.contains("device `cuda` requested but") && e.contains(&why),
                "{e}"
            );
        }
    });
}

#[test]
fn cli_device_flag() {
    let run = |device: &str| {
        Command::new(env!("CARGO_BIN_EXE_epifusion"))
            .args([
                "fit",
                "--model",
                "cox",
                "--outcomes",
                "tests/data/therneau_test1.csv",
                "--y",
                "status",
                "--covariates-columns",
                "x",
                "--device",
                device,
            ])
            .current_dir(env!("CARGO_MANIFEST_DIR"))
            .output()
            .expect("run epifusion")
    };
    let auto = run("auto");
    let err = String::from_utf8_lossy(&auto.stderr).into_owned();
    assert!(auto.status.success(), "{err}");
    if let Err(why) = backend::gpu() {
        assert!(
            err.contains("device auto: using the CPU") && err.contains(&why),
            "{err}"
        );
        let cuda = run("cuda");
        assert!(!cuda.status.success());
        let e = String::from_utf8_lossy(&cuda.stderr);
        assert!(
            e.contains("device `cuda` requested but") && e.contains(&why),
            "{e}"
        );
    }
}
