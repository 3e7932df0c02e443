//! What the speed examples share: one fit from β = 0, timed, and its checks.

use std::time::Instant;

use epifusion_core::bench::cpu_seconds;
use epifusion_core::model::ccd::{fit, scaled_violation, CcdOptions, CcdResult};
use epifusion_core::model::prior::PriorSet;
use epifusion_core::model::Likelihood;

/// A timed fit: the result, CPU and wall seconds of the fit alone, the largest scaled KKT
/// violation at the returned β, the non-zero count and Σ|β|.
pub struct TimedFit {
    pub result: CcdResult,
    pub cpu: f64,
    pub wall: f64,
    pub worst_kkt: f64,
    pub nonzero: usize,
    pub l1: f64,
}

impl TimedFit {
    /// "cpu … s wall … s  k it status  objective …  nonzero …  max scaled KKT …", with the
    /// objective LL − λΣ|β| of a Laplace prior of parameter `lambda`.
    pub fn summary(&self, lambda: f64) -> String {
        let r = &self.result;
        format!(
            "cpu {:.3} s wall {:.3} s  {} it {}  objective {:.6}  nonzero {}  max scaled KKT {:.1e}",
            self.cpu,
            self.wall,
            r.iterations,
            r.status.name(),
            r.log_likelihood - lambda * self.l1,
            self.nonzero,
            self.worst_kkt,
        )
    }
}

/// Fit `lik` from β = 0 on `pool` and check the KKT conditions at the result.
pub fn timed_fit(
    pool: &rayon::ThreadPool,
    lik: &mut dyn Likelihood,
    priors: &PriorSet,
    opts: &CcdOptions,
) -> TimedFit {
    let p = lik.n_coef();
    let (cpu0, t0) = (cpu_seconds().unwrap_or(0.0), Instant::now());
    let result = pool
        .install(|| fit(lik, priors, &vec![0.0; p], None, opts))
        .expect("fit");
    let (cpu, wall) = (
        cpu_seconds().unwrap_or(0.0) - cpu0,
        t0.elapsed().as_secs_f64(),
    );
    // The check runs in the same pool (a column walk outside it would start rayon's global
    // pool, whose idle threads then compete with the next fit's).
    let worst_kkt = pool.install(|| {
        lik.set_beta(&result.beta);
        (0..p)
            .map(|j| {
                let (g, h) = lik.gradient_hessian(j);
                scaled_violation(priors.per_coef[j], result.beta[j], g, h)
            })
            .fold(0.0f64, f64::max)
    });
    let l1 = result.beta.iter().map(|b| b.abs()).sum();
    let nonzero = result.beta.iter().filter(|b| **b != 0.0).count();
    TimedFit {
        result,
        cpu,
        wall,
        worst_kkt,
        nonzero,
        l1,
    }
}
