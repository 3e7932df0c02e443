//! SCCS fit time on the bench README's recipe (`bench::sccs_data`, J = 1000, Laplace λ = 3):
//! CPU seconds of the likelihood's setup and of the fit under the default optimality rule and
//! under the objective rule, iterations, objective and the largest scaled KKT violation.
//!
//! `cargo run -p epifusion-core --release --example sccs_speed -- [cases] [threads] [reps]`

mod common;

use epifusion_core::bench::{cpu_seconds, sccs_data};
use epifusion_core::model::ccd::{CcdOptions, Convergence};
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
            let t = common::timed_fit(&pool, lik.as_mut(), &priors, &opts);
            println!(
                "sccs cases={n} threads={threads} rep={rep} {:<11} {}",
                rule.name(),
                t.summary(lambda)
            );
        }
    }
}
