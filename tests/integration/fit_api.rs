//! Invariants of the high-level fitting API on seeded random data, for every model:
//! KKT conditions of L1 fits, a never-decreasing objective, results independent of the row
//! order and of the thread count, option validation.

use epifusion::fit::{fit, fit_owned, CiMethod, FitOptions, FitResult};
use epifusion::model::ccd::{Convergence, FitStatus};
use epifusion::model::design::{DesignBuilder, DesignMatrix, OutcomeRecord};
use epifusion::model::prior::{Prior, PriorSet};
use epifusion::model::{cpu_likelihood, LikelihoodOptions, ModelKind, Ties};

/// splitmix64: a tiny seeded generator for test data.
struct Rng(u64);
impl Rng {
    fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
    fn uniform(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }
}

/// Random data for `model`: `n` rows, `p` covariates (indicator or integer-valued), ties in
/// time, strata where the model uses them. Returns outcome records and covariate triples in a
/// given order.
fn random_data(
    model: ModelKind,
    n: usize,
    p: usize,
    seed: u64,
) -> (Vec<OutcomeRecord>, Vec<(i64, i64, f64)>) {
    let mut rng = Rng(seed);
    let mut outcomes = Vec::new();
    let mut covs = Vec::new();
    for i in 0..n {
        let mut lin = 0.0;
        for j in 0..p {
            if rng.uniform() < 0.3 {
                let v = if j % 3 == 0 {
                    1.0 + (rng.uniform() * 3.0).floor()
                } else {
                    1.0
                };
                covs.push((i as i64, 100 + j as i64, v));
                lin += if j % 2 == 0 { 0.4 } else { -0.3 } * v;
            }
        }
        let u = rng.uniform();
        let stratum = (i % 7) as i64;
        let rec = match model {
            ModelKind::Cox | ModelKind::FineGray => {
                let t = (-(u.max(1e-12)).ln() / f64::exp(lin) * 10.0)
                    .ceil()
                    .min(30.0);
                let c = (rng.uniform() * 30.0).ceil();
                let y = if t <= c {
                    if model == ModelKind::FineGray && rng.uniform() < 0.4 {
                        2.0
                    } else {
                        1.0
                    }
                } else {
                    0.0
                };
                OutcomeRecord {
                    row_id: i as i64 * 3 + 1,
                    stratum_id: (model == ModelKind::Cox).then_some(stratum),
                    time: Some(t.min(c)),
                    y,
                    ..Default::default()
                }
            }
            ModelKind::ConditionalPoisson | ModelKind::Poisson => {
                let t = 1.0 + (rng.uniform() * 20.0).floor();
                let rate = 0.05 * t * lin.exp();
                let y = if u < (-rate).exp() {
                    0.0
                } else if u < (-rate).exp() * (1.0 + rate) {
                    1.0
                } else {
                    2.0
                };
                OutcomeRecord {
                    row_id: i as i64 * 3 + 1,
                    stratum_id: (model == ModelKind::ConditionalPoisson).then_some(stratum),
                    time: Some(t),
                    y,
                    ..Default::default()
                }
            }
            ModelKind::Logistic | ModelKind::ConditionalLogistic => {
                let pr = 1.0 / (1.0 + (-(lin - 0.5)).exp());
                OutcomeRecord {
                    row_id: i as i64 * 3 + 1,
                    stratum_id: (model == ModelKind::ConditionalLogistic).then_some(stratum),
                    y: if u < pr { 1.0 } else { 0.0 },
                    ..Default::default()
                }
            }
        };
        outcomes.push(rec);
    }
    for c in covs.iter_mut() {
        c.0 = c.0 * 3 + 1;
    }
    (outcomes, covs)
}

fn build(outcomes: &[OutcomeRecord], covs: &[(i64, i64, f64)]) -> DesignMatrix {
    let mut b = DesignBuilder::new();
    for o in outcomes {
        b.push_outcome(*o);
    }
    for &(r, c, v) in covs {
        b.push_covariate(r, c, v);
    }
    b.build().unwrap()
}

const MODELS: [ModelKind; 6] = [
    ModelKind::Cox,
    ModelKind::FineGray,
    ModelKind::ConditionalPoisson,
    ModelKind::Logistic,
    ModelKind::Poisson,
    ModelKind::ConditionalLogistic,
];

fn l1_opts(model: ModelKind, lambda: f64) -> FitOptions {
    let mut o = FitOptions::new(model);
    o.prior = Prior::Laplace { lambda };
    // The objective-change rule is loose on the gradient (Δf ≈ g²/2h): stop on the KKT rule.
    o.ccd.convergence = Convergence::Gradient;
    o.ccd.tolerance = 1e-9;
    o.ccd.max_iterations = 10_000;
    o.ci = CiMethod::None;
    o
}

#[test]
fn l1_fits_satisfy_kkt_and_objective_never_decreases() {
    for model in MODELS {
        for ties in [Ties::Breslow, Ties::Efron] {
            if ties == Ties::Efron && !matches!(model, ModelKind::Cox | ModelKind::FineGray) {
                continue;
            }
            let (o, c) = random_data(model, 300, 12, 42);
            let x = build(&o, &c);
            let lambda = 4.0;
            let mut opts = l1_opts(model, lambda);
            opts.ties = ties;
            let r = fit(&x, &opts).unwrap();
            assert_eq!(r.status, FitStatus::Converged, "{model:?}");
            assert!(
                r.coefficients.iter().any(|c| c.estimate == 0.0),
                "{model:?}: λ should zero some"
            );
            assert!(
                r.coefficients
                    .iter()
                    .any(|c| c.estimate != 0.0 && c.penalized),
                "{model:?}: λ too big"
            );
            for w in r.objective_trace.windows(2) {
                assert!(
                    w[1] >= w[0] - 1e-9 * w[0].abs(),
                    "{model:?}: objective decreased {w:?}"
                );
            }
            // KKT at the optimum, evaluated on a fresh likelihood (intercept added as fit does).
            let xi = if model.has_intercept() {
                x.clone().with_intercept()
            } else {
                x.clone()
            };
            let mut lik = cpu_likelihood(model, &xi, LikelihoodOptions { ties }).unwrap();
            let beta: Vec<f64> = r.coefficients.iter().map(|c| c.estimate).collect();
            lik.set_beta(&beta);
            for (j, coef) in r.coefficients.iter().enumerate() {
                let (g, _) = lik.gradient_hessian(j);
                let tol = 1e-6 * lambda.max(1.0);
                if !coef.penalized {
                    assert!(g.abs() < tol, "{model:?} {ties:?} unpenalized {j}: g = {g}");
                } else if coef.estimate == 0.0 {
                    assert!(
                        g.abs() <= lambda + tol,
                        "{model:?} {ties:?} coef {j} at 0: |g| = {} > λ",
                        g.abs()
                    );
                } else {
                    let r = g - lambda * coef.estimate.signum();
                    assert!(
                        r.abs() < tol,
                        "{model:?} {ties:?} coef {j}: g − λ sign β = {r}"
                    );
                }
            }
        }
    }
}

fn estimates(r: &FitResult) -> Vec<f64> {
    r.coefficients.iter().map(|c| c.estimate).collect()
}

#[test]
fn results_do_not_depend_on_row_order_or_threads() {
    for model in MODELS {
        let (mut o, mut c) = random_data(model, 400, 10, 7);
        let mut opts = FitOptions::new(model);
        opts.prior = Prior::Normal { variance: 1.0 };
        opts.ci = CiMethod::None;
        opts.threads = Some(1);
        let base = fit(&build(&o, &c), &opts).unwrap();
        // Reverse and rotate the input order.
        o.reverse();
        c.reverse();
        o.rotate_left(37);
        let shuffled = fit(&build(&o, &c), &opts).unwrap();
        assert_eq!(
            estimates(&base),
            estimates(&shuffled),
            "{model:?}: row order changed the result"
        );
        assert_eq!(base.log_likelihood, shuffled.log_likelihood, "{model:?}");
        for threads in [2, 3] {
            opts.threads = Some(threads);
            let t = fit(&build(&o, &c), &opts).unwrap();
            assert_eq!(
                estimates(&base),
                estimates(&t),
                "{model:?}: {threads} threads changed the result"
            );
            assert_eq!(base.iterations, t.iterations);
        }
    }
}

#[test]
fn owned_fit_matches_borrowed_fit() {
    for model in MODELS {
        let (o, c) = random_data(model, 300, 6, 5);
        let mut opts = FitOptions::new(model);
        opts.prior = Prior::Laplace { lambda: 2.0 };
        opts.ci = CiMethod::Wald;
        opts.threads = Some(2);
        let x = build(&o, &c);
        opts.exclude = vec![x.columns[1].id];
        let borrowed = fit(&x, &opts).unwrap();
        let owned = fit_owned(x, &opts).unwrap();
        assert_eq!(borrowed.coefficients, owned.coefficients, "{model:?}");
        assert_eq!(borrowed.log_likelihood, owned.log_likelihood, "{model:?}");
        assert_eq!(borrowed.iterations, owned.iterations, "{model:?}");
        assert_eq!(
            (borrowed.n_rows, borrowed.n_strata),
            (owned.n_rows, owned.n_strata)
        );
    }
}

#[test]
fn unpenalized_fit_reports_se_and_intervals() {
    for model in MODELS {
        let (o, c) = random_data(model, 300, 3, 11);
        let x = build(&o, &c);
        let mut opts = FitOptions::new(model);
        opts.ccd.tolerance = 1e-10;
        let profile = fit(&x, &opts).unwrap();
        opts.ci = CiMethod::Wald;
        let wald = fit(&x, &opts).unwrap();
        for (p, w) in profile.coefficients.iter().zip(&wald.coefficients) {
            let se = p.std_error.expect("unpenalized SE");
            assert!(se > 0.0 && se.is_finite());
            let (lo, hi) = (p.ci_lower.unwrap(), p.ci_upper.unwrap());
            assert!(
                lo < p.estimate && p.estimate < hi,
                "{model:?}: {lo} {} {hi}",
                p.estimate
            );
            // With moderate n the profile interval is close to the Wald one.
            assert!(
                (lo - w.ci_lower.unwrap()).abs() < 0.5 * se + 0.05,
                "{model:?}"
            );
            assert!(
                (hi - w.ci_upper.unwrap()).abs() < 0.5 * se + 0.05,
                "{model:?}"
            );
            // Profile bound: LL drops by exactly 1.920729 when β_j is fixed there and the rest refit.
        }
    }
}

#[test]
fn options_are_validated_before_work() {
    let (o, c) = random_data(ModelKind::Cox, 50, 3, 1);
    let x = build(&o, &c);
    let mut opts = FitOptions::new(ModelKind::Cox);
    opts.exclude = vec![999];
    let e = fit(&x, &opts).unwrap_err().to_string();
    assert!(e.contains("exclude") && e.contains("999"), "{e}");
    let mut opts = FitOptions::new(ModelKind::Cox);
    opts.threads = Some(0);
    assert!(fit(&x, &opts).unwrap_err().to_string().contains("threads"));
    let mut opts = FitOptions::new(ModelKind::Cox);
    opts.ccd.tolerance = -1.0;
    assert!(fit(&x, &opts)
        .unwrap_err()
        .to_string()
        .contains("tolerance"));
    // y outside the model's domain names the row (counted from 1, as the file readers do).
    let mut bad = o.clone();
    bad[3].y = 2.0;
    let e = fit(&build(&bad, &c), &FitOptions::new(ModelKind::Cox))
        .unwrap_err()
        .to_string();
    assert!(e.contains("outcome row 4") && e.contains("`y`"), "{e}");
    let mut bad = o;
    bad[4].time = Some(0.0);
    let e = fit(&build(&bad, &c), &FitOptions::new(ModelKind::Cox))
        .unwrap_err()
        .to_string();
    assert!(e.contains("outcome row 5") && e.contains("`time`"), "{e}");
}

#[test]
fn overflow_is_never_reported_as_success() {
    // Poisson with huge covariate values overflows exp(η) on the first full step; the driver
    // must retry with a smaller trust region and either converge to finite values or say so.
    let mut b = DesignBuilder::new();
    for i in 0..20 {
        b.push_outcome(OutcomeRecord {
            row_id: i,
            time: Some(1.0),
            y: (i % 3) as f64,
            ..Default::default()
        });
        b.push_covariate(i, 1, 400.0 * (i as f64 - 10.0));
    }
    let x = b.build().unwrap();
    let mut opts = FitOptions::new(ModelKind::Poisson);
    opts.ci = CiMethod::None;
    let r = fit(&x, &opts).unwrap();
    if r.status != FitStatus::IllConditioned {
        assert!(r.log_likelihood.is_finite());
        assert!(r.coefficients.iter().all(|c| c.estimate.is_finite()));
    }
}

#[test]
fn fixed_coefficients_stay_fixed() {
    let (o, c) = random_data(ModelKind::Cox, 200, 4, 3);
    let x = build(&o, &c);
    let mut lik = cpu_likelihood(ModelKind::Cox, &x, LikelihoodOptions::default()).unwrap();
    let p = lik.n_coef();
    let priors = PriorSet::new(Prior::None, &vec![false; p]);
    let mut beta0 = vec![0.0; p];
    beta0[1] = 0.7;
    let mut fixed = vec![false; p];
    fixed[1] = true;
    let r = epifusion::model::ccd::fit(
        lik.as_mut(),
        &priors,
        &beta0,
        Some(&fixed),
        &Default::default(),
    )
    .unwrap();
    assert_eq!(r.beta[1], 0.7);
}
