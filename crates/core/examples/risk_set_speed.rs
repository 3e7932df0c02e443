//! Cox and Fine–Gray fit time on the DESIGN.md §10 recipe (paper 001 §3.2 data from the
//! project's generators, P = 1000, 5 % density, Laplace λ = 100, default optimality rule),
//! the active-set Newton polish against the classic polish side by side (alternating, so
//! that load on the machine hits both alike): CPU seconds of the fit alone (the likelihood
//! is built beforehand), wall seconds, iterations, objective and the largest scaled KKT
//! violation, and a fingerprint of the coefficients' bits. `threads` may list several counts
//! (`1,2`): each repetition then fits once per count, alternating in one process, so that the
//! counts are compared on the same memory layout and the same load (this machine's timings
//! differ by up to 1.5× from process to process). Alternating pools disturb each other, though:
//! the idle workers of one pool spin while the other pool's fit starts, and on a 2-core machine
//! about half the 2-thread fits of an alternating run lose their second core for part of the
//! fit (Fine–Gray N = 1e5: 0.070 s or 0.085 s, bimodal). For the gain of a second core, run
//! one count per process (`… fine_gray 100000 1 8`, then `… 2 8`) and compare the medians.
//!
//! `cargo run -p epifusion-core --release --example risk_set_speed -- [cox|fine_gray] [N] [threads] [reps]`

mod common;

use epifusion_core::bench::{cox_data, fine_gray_data};
use epifusion_core::model::ccd::CcdOptions;
use epifusion_core::model::prior::{Prior, PriorSet};
use epifusion_core::model::{cpu_likelihood, LikelihoodOptions, ModelKind};

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let model = match args.get(1).map_or("cox", String::as_str) {
        "fine_gray" | "fg" => ModelKind::FineGray,
        _ => ModelKind::Cox,
    };
    let n: usize = args.get(2).map_or(100_000, |s| s.parse().expect("N"));
    let thread_counts: Vec<usize> = args.get(3).map_or(vec![1], |s| {
        s.split(',').map(|t| t.parse().expect("threads")).collect()
    });
    let reps: usize = args.get(4).map_or(2, |s| s.parse().expect("reps"));
    let lambda = 100.0;
    let data = match model {
        ModelKind::Cox => cox_data(n, 1000, 0.05, 123),
        _ => fine_gray_data(n, 1000, 0.05, 123),
    }
    .expect("data");
    let pools: Vec<(usize, rayon::ThreadPool)> = thread_counts
        .iter()
        .map(|&t| {
            let pool = rayon::ThreadPoolBuilder::new()
                .num_threads(t)
                .build()
                .expect("pool");
            (t, pool)
        })
        .collect();
    let lik0 = pools[0].1.install(|| {
        cpu_likelihood(model, &data.design, LikelihoodOptions::default()).expect("likelihood")
    });
    drop(data);
    let p = lik0.n_coef();
    let priors = PriorSet::new(Prior::Laplace { lambda }, &vec![false; p]);
    for rep in 0..reps {
        for ((threads, pool), active_newton) in pools
            .iter()
            .flat_map(|p| [false, true].map(move |a| (p, a)))
        {
            if std::env::var("SPEED_ONLY").is_ok_and(|v| v != active_newton.to_string()) {
                continue;
            }
            let mut lik = lik0.boxed_clone();
            let opts = CcdOptions {
                active_newton,
                ..CcdOptions::fit_default()
            };
            let t = common::timed_fit(pool, lik.as_mut(), &priors, &opts);
            // A fingerprint of the coefficients' bits (thread-count independence).
            let bits = t
                .result
                .beta
                .iter()
                .fold(0u64, |h, b| h.rotate_left(5) ^ b.to_bits());
            println!(
                "{} N={n} threads={threads} rep={rep} {:<14} {}  β bits {bits:016x}",
                model.name(),
                if active_newton {
                    "active-newton"
                } else {
                    "classic"
                },
                t.summary(lambda),
            );
        }
    }
}
