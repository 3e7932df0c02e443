//! A GPU fit under the default (optimality) rule: the device runs coordinate descent alone
//! under the classic `objective` rule, and the host finishes with the Newton block and the
//! KKT check (`fit.rs`, `gpu_then_host`). Checked with a stand-in device that runs the CPU
//! likelihood (installed for this test binary only), on Therneau's test 1 and rossi.

use epifusion_core::backend::{install_gpu_backend, Device, GpuBackend, GpuFitStats, Precision};
use epifusion_core::fit::{fit, FitOptions};
use epifusion_core::model::ccd::{self, CcdOptions, CcdResult, Convergence, FitStatus};
use epifusion_core::model::design::{DesignBuilder, DesignMatrix, OutcomeRecord};
use epifusion_core::model::prior::{Prior, PriorSet};
use epifusion_core::model::{cpu_likelihood, LikelihoodOptions, ModelKind, Ties};
use epifusion_core::Result;

/// A "device" that runs coordinate descent on the CPU and records the rule it was given.
struct StandIn;

static RULES: std::sync::Mutex<Vec<Convergence>> = std::sync::Mutex::new(Vec::new());

impl GpuBackend for StandIn {
    fn probe(&self) -> std::result::Result<String, String> {
        Ok("stand-in device".into())
    }
    fn verified(&self) -> bool {
        true
    }
    fn unsupported(&self, _: ModelKind, _: &DesignMatrix) -> Option<String> {
        None
    }
    fn fit(
        &self,
        kind: ModelKind,
        ties: Ties,
        x: &DesignMatrix,
        priors: &PriorSet,
        opts: &CcdOptions,
        _: Precision,
    ) -> Result<(CcdResult, GpuFitStats)> {
        RULES.lock().unwrap().push(opts.convergence);
        let mut lik = cpu_likelihood(kind, x, LikelihoodOptions { ties })?;
        let beta0 = vec![0.0; lik.n_coef()];
        let r = ccd::fit(lik.as_mut(), priors, &beta0, None, opts)?;
        Ok((r, GpuFitStats::default()))
    }
}

fn rossi() -> DesignMatrix {
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../tests/data/survival_rossi.csv"
    );
    let text = std::fs::read_to_string(path).unwrap();
    let mut b = DesignBuilder::new();
    for (i, line) in text.lines().skip(1).enumerate() {
        let v: Vec<f64> = line.split(',').map(|c| c.parse().unwrap()).collect();
        b.push_outcome(OutcomeRecord {
            row_id: i as i64,
            time: Some(v[0]),
            y: v[1],
            ..Default::default()
        });
        for j in 0..7 {
            b.push_covariate(i as i64, j as i64 + 1, v[2 + j]);
        }
    }
    b.build().unwrap()
}

#[test]
fn device_runs_a_classic_rule_and_the_host_finishes() {
    install_gpu_backend(&StandIn);
    let x = rossi();
    for (prior, exclude) in [
        (Prior::None, vec![]),
        (Prior::Laplace { lambda: 5.0 }, vec![1]),
    ] {
        let mut opts = FitOptions::new(ModelKind::Cox);
        opts.ties = Ties::Efron;
        opts.prior = prior;
        opts.exclude = exclude;
        let cpu = fit(&x, &opts).unwrap();
        opts.device = Device::Cuda;
        RULES.lock().unwrap().clear();
        let gpu = fit(&x, &opts).unwrap();
        assert_eq!(*RULES.lock().unwrap(), vec![Convergence::Objective]);
        assert_eq!(gpu.device, "stand-in device");
        assert_eq!(gpu.status, FitStatus::Converged);
        // Both fits meet the same rule: the same optimum to well within the tolerance.
        for (a, b) in cpu.coefficients.iter().zip(&gpu.coefficients) {
            assert!(
                (a.estimate - b.estimate).abs() < 1e-8,
                "{prior:?}: {a:?} vs {b:?}"
            );
        }
        assert!(
            gpu.iterations > cpu.iterations.min(3),
            "device cycles are counted"
        );
        assert_eq!(gpu.objective_trace.len(), gpu.iterations);
        // Asking for a classic rule passes it to the device unchanged, with no host finish.
        opts.ccd.convergence = Convergence::Gradient;
        RULES.lock().unwrap().clear();
        let classic = fit(&x, &opts).unwrap();
        assert_eq!(*RULES.lock().unwrap(), vec![Convergence::Gradient]);
        assert_eq!(classic.status, FitStatus::Converged);
    }
}
