//! The convergence rules side by side on the benchmark recipe of DESIGN.md §10 (paper 001
//! §3.2 data from the project's own generators, N = 1e5, P = 1000, 5 % density; Laplace λ = 100
//! for Cox and Fine–Gray, λ = 3 for SCCS), one thread: iterations, fit seconds, objective and
//! the largest scaled KKT violation at the returned β.
//!
//! `cargo run -p epifusion-core --release --example convergence_rules [cox|fine_gray|sccs]`

use epifusion_core::bench::{cox_data, fine_gray_data, sccs_data, BenchData};
use epifusion_core::fit::{fit, CiMethod, FitOptions};
use epifusion_core::model::ccd::{scaled_violation, Convergence};
use epifusion_core::model::prior::Prior;
use epifusion_core::model::{cpu_likelihood, LikelihoodOptions, ModelKind};

fn run(what: &str, data: &BenchData, model: ModelKind, lambda: f64, exclude: Vec<i64>) {
    for (rule, tol) in [
        (Convergence::Objective, 1e-6),
        (Convergence::Optimality, 1e-6),
    ] {
        let mut opts = FitOptions::new(model);
        opts.prior = Prior::Laplace { lambda };
        opts.exclude = exclude.clone();
        opts.ci = CiMethod::None;
        opts.threads = Some(1);
        opts.ccd.convergence = rule;
        opts.ccd.tolerance = tol;
        let r = fit(&data.design, &opts).unwrap();
        let beta: Vec<f64> = r.coefficients.iter().map(|c| c.estimate).collect();
        let mut lik = cpu_likelihood(model, &data.design, LikelihoodOptions::default()).unwrap();
        lik.set_beta(&beta);
        let mut worst: f64 = 0.0;
        for (j, c) in r.coefficients.iter().enumerate() {
            let (g, h) = lik.gradient_hessian(j);
            let prior = if c.penalized {
                Prior::Laplace { lambda }
            } else {
                Prior::None
            };
            worst = worst.max(scaled_violation(prior, c.estimate, g, h));
        }
        let nz = beta.iter().filter(|b| **b != 0.0).count();
        println!(
            "{what:<28} {:<11} {:>14} {:>5} it {:>8.3} s  objective {:.6}  nonzero {nz}  max scaled KKT {worst:.1e}",
            rule.name(),
            r.status.name(),
            r.iterations,
            r.fit_seconds,
            r.objective()
        );
    }
}

fn cox() {
    let d = cox_data(100_000, 1000, 0.05, 123).unwrap();
    run("cox N=1e5 λ=100", &d, ModelKind::Cox, 100.0, vec![]);
    run("cox N=1e5 λ=100 excl 1", &d, ModelKind::Cox, 100.0, vec![1]);
    run(
        "cox N=1e5 λ=1000 excl 1",
        &d,
        ModelKind::Cox,
        1000.0,
        vec![1],
    );
}

fn fine_gray() {
    let d = fine_gray_data(100_000, 1000, 0.05, 123).unwrap();
    run(
        "fine-gray N=1e5 λ=100",
        &d,
        ModelKind::FineGray,
        100.0,
        vec![],
    );
}

fn sccs() {
    let d = sccs_data(100_000, 1000, 123).unwrap();
    run(
        "sccs 1e5 cases λ=3",
        &d,
        ModelKind::ConditionalPoisson,
        3.0,
        vec![],
    );
}

fn main() {
    let which: Vec<String> = std::env::args().skip(1).collect();
    let wants = |name: &str| which.is_empty() || which.iter().any(|w| w == name);
    if wants("cox") {
        cox();
    }
    if wants("fine_gray") {
        fine_gray();
    }
    if wants("sccs") {
        sccs();
    }
}
