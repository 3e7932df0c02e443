//! SCCS fit time on the bench README's recipe (`bench::sccs_data`, J = 1000, Laplace λ = 3):
//! CPU seconds of the likelihood's setup and of the fit under the default optimality rule and
//! under the objective rule, iterations, objective and the largest scaled KKT violation.
//!
//! `cargo run -p epifusion-core --release --example sccs_speed -- [cases] [threads] [reps]`

use std::time::Instant;

use epifusion_core::bench::{cpu_seconds, sccs_data};
use epifusion_core::model::ccd::{fit, scaled_violation, CcdOptions, Convergence};
use epifusion_core::model::prior::{Prior, PriorSet};
use epifusion_core::model::{cpu_likelihood, LikelihoodOptions, ModelKind};

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let n: usize = args.get(1).map_or(100_000, |s| s.parse().expect("cases"));
    let threads: usize = args.get(2).map_or(1, |s| s.parse().expect("threads"));
    let reps: usize = args.get(3).map_or(1, |s| s.parse().expect("reps"));
    let lambda = 3.0;
    let data = sccs_data(n, 1000, 123).expect("data");
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(threads)
        .build()
        .expect("pool");
    let cpu0 = cpu_seconds().unwrap_or(0.0);
    let lik0 = pool.install(|| {
        cpu_likelihood(
            ModelKind::ConditionalPoisson,
            &data.design,
            LikelihoodOptions::default(),
        )
        .expect("likelihood")
    });
    println!("setup cpu {:.3} s", cpu_seconds().unwrap_or(0.0) - cpu0);
    drop(data);
    let p = lik0.n_coef();
    let priors = PriorSet::new(Prior::Laplace { lambda }, &vec![false; p]);
    for rep in 0..reps {
        for rule in [Convergence::Optimality, Convergence::Objective] {
            let mut lik = lik0.boxed_clone();
            let opts = CcdOptions {
                convergence: rule,
                ..CcdOptions::fit_default()
            };
            let (cpu0, t0) = (cpu_seconds().unwrap_or(0.0), Instant::now());
            let r = pool
                .install(|| fit(lik.as_mut(), &priors, &vec![0.0; p], None, &opts))
                .expect("fit");
            let (cpu, wall) = (
                cpu_seconds().unwrap_or(0.0) - cpu0,
                t0.elapsed().as_secs_f64(),
            );
            lik.set_beta(&r.beta);
            let worst = (0..p)
                .map(|j| {
                    let (g, h) = lik.gradient_hessian(j);
                    scaled_violation(priors.per_coef[j], r.beta[j], g, h)
                })
                .fold(0.0f64, f64::max);
            let l1: f64 = r.beta.iter().map(|b| b.abs()).sum();
            let nz = r.beta.iter().filter(|b| **b != 0.0).count();
            println!(
                "sccs cases={n} threads={threads} rep={rep} {:<11} cpu {cpu:.3} s wall {wall:.3} s  {} it {}  objective {:.6}  nonzero {nz}  max scaled KKT {worst:.1e}",
                rule.name(),
                r.iterations,
                r.status.name(),
                r.log_likelihood - lambda * l1,
            );
        }
    }
}
