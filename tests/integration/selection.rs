//! Cross-validation, bootstrap and profile likelihoods (issue #6): reproducibility whatever the
//! thread count, agreement with independent computations built by hand from the public API.

use epifusion::bench;
use epifusion::fit::{fit, CiMethod, FitOptions, FitResult, ProfileOptions};
use epifusion::model::bootstrap::BootstrapOptions;
use epifusion::model::ccd::Convergence;
use epifusion::model::cv::{assign_folds, CvOptions, CvSearch, Resampling};
use epifusion::model::design::{DesignBuilder, DesignMatrix, OutcomeRecord};
use epifusion::model::prior::{Prior, PriorSet};
use epifusion::model::{cpu_likelihood, LikelihoodOptions, ModelKind, Ties};

use crate::golden_support::{pick, Table};

fn cox_design(n: usize, p: usize, seed: u64) -> DesignMatrix {
    bench::cox_data(n, p, 0.1, seed).unwrap().design
}

fn sccs_design(cases: usize, drugs: usize, seed: u64) -> DesignMatrix {
    bench::sccs_data(cases, drugs, seed).unwrap().design
}

fn laplace_cv(model: ModelKind, cv: CvOptions, threads: usize) -> FitOptions {
    let mut o = FitOptions::new(model);
    o.prior = Prior::Laplace { lambda: 1.0 };
    o.ci = CiMethod::None;
    o.cv = Some(cv);
    o.threads = Some(threads);
    o
}

fn betas(r: &FitResult) -> Vec<f64> {
    r.coefficients.iter().map(|c| c.estimate).collect()
}

/// The rows of `x` whose unit (row or stratum) is (not) in `fold`, rebuilt with the public
/// builder — independent of `DesignMatrix::subset_rows`.
fn rebuild(x: &DesignMatrix, keep: impl Fn(usize) -> bool) -> DesignMatrix {
    let mut b = DesignBuilder::new();
    for i in 0..x.n_rows() {
        if keep(i) {
            b.push_outcome(OutcomeRecord {
                row_id: x.rows.row_id.get(i),
                stratum_id: x
                    .rows
                    .has_strata
                    .then(|| x.rows.stratum_ids[x.rows.stratum.get(i) as usize]),
                time: Some(x.rows.time.get(i)),
                y: x.rows.y.get(i),
                ..Default::default()
            });
        }
    }
    for c in &x.columns {
        for (i, v) in c.entries() {
            if keep(i) {
                b.push_covariate(x.rows.row_id.get(i), c.id, v);
            }
        }
    }
    b.build().unwrap()
}

/// Held-out log-likelihood of fold `f` at variance `v`, computed from scratch.
fn held_out_by_hand(
    x: &DesignMatrix,
    model: ModelKind,
    unit: &[u32],
    fold: &[u32],
    f: u32,
    v: f64,
) -> f64 {
    let train = rebuild(x, |i| fold[unit[i] as usize] != f);
    let test = rebuild(x, |i| fold[unit[i] as usize] == f);
    let mut o = FitOptions::new(model);
    o.prior = Prior::Laplace { lambda: 1.0 }.with_variance(v);
    o.ci = CiMethod::None;
    o.ccd.convergence = Convergence::Gradient;
    o.ccd.tolerance = 1e-10;
    let r = fit(&train, &o).unwrap();
    // Columns without entries in a part are absent from the rebuilt design: match by id.
    let beta: Vec<f64> = test
        .columns
        .iter()
        .map(|c| r.coefficient(c.id).map_or(0.0, |k| k.estimate))
        .collect();
    let mut lik = cpu_likelihood(
        model,
        &test,
        LikelihoodOptions {
            ties: Ties::Breslow,
        },
    )
    .unwrap();
    lik.set_beta(&beta);
    lik.log_likelihood()
}

#[test]
fn cv_held_out_likelihoods_match_a_by_hand_computation() {
    for (model, x) in [
        (ModelKind::Cox, cox_design(400, 12, 5)),
        (ModelKind::ConditionalPoisson, sccs_design(150, 10, 6)),
    ] {
        let by = Resampling::Auto.resolve(model);
        let (unit, n_units): (Vec<u32>, usize) = match by {
            Resampling::Stratum => (x.rows.stratum.to_vec(), x.n_strata()),
            _ => ((0..x.n_rows() as u32).collect(), x.n_rows()),
        };
        let folds = assign_folds(n_units, 4, 1, 11);
        let v = 0.05;
        let mut o = laplace_cv(
            model,
            CvOptions {
                folds: 4,
                seed: 11,
                search: CvSearch::Grid(vec![v]),
                ..Default::default()
            },
            2,
        );
        o.ccd.convergence = Convergence::Gradient;
        o.ccd.tolerance = 1e-10;
        let r = fit(&x, &o).unwrap();
        let cv = r.cv.as_ref().unwrap();
        assert_eq!(cv.curve.len(), 1);
        assert_eq!(cv.curve[0].folds.len(), 4);
        for f in 0..4u32 {
            let expect = held_out_by_hand(&x, model, &unit, &folds[0], f, v);
            let got = cv.curve[0].folds[f as usize];
            assert!(
                (got - expect).abs() <= 1e-6 * (1.0 + expect.abs()),
                "{model:?} fold {f}: {got} vs {expect}"
            );
        }
        let mean = cv.curve[0].folds.iter().sum::<f64>() / 4.0;
        assert!((cv.curve[0].mean - mean).abs() < 1e-12);
    }
}

#[test]
fn cv_is_bit_identical_whatever_the_thread_count() {
    for (model, x) in [
        (ModelKind::Cox, cox_design(600, 20, 9)),
        (ModelKind::ConditionalPoisson, sccs_design(300, 15, 3)),
    ] {
        let cv = CvOptions {
            folds: 5,
            repetitions: 2,
            seed: 42,
            ..Default::default()
        };
        let runs: Vec<FitResult> = [1, 2, 3]
            .iter()
            .map(|&t| fit(&x, &laplace_cv(model, cv.clone(), t)).unwrap())
            .collect();
        let c0 = runs[0].cv.as_ref().unwrap();
        assert!(
            c0.curve.len() >= 3,
            "the auto search brackets: {:?}",
            c0.curve
        );
        for r in &runs[1..] {
            let c = r.cv.as_ref().unwrap();
            assert_eq!(c.variance.to_bits(), c0.variance.to_bits(), "{model:?}");
            assert_eq!(c.curve.len(), c0.curve.len());
            for (a, b) in c.curve.iter().zip(&c0.curve) {
                assert_eq!(a.variance.to_bits(), b.variance.to_bits());
                let fa: Vec<u64> = a.folds.iter().map(|v| v.to_bits()).collect();
                let fb: Vec<u64> = b.folds.iter().map(|v| v.to_bits()).collect();
                assert_eq!(fa, fb);
            }
            let ba: Vec<u64> = betas(r).iter().map(|v| v.to_bits()).collect();
            let bb: Vec<u64> = betas(&runs[0]).iter().map(|v| v.to_bits()).collect();
            assert_eq!(ba, bb);
        }
        // The final fit uses the selected variance.
        let v = runs[0].prior.variance();
        assert!(
            (v - c0.variance).abs() <= 1e-12 * v,
            "{v} vs {}",
            c0.variance
        );
        // Another seed gives other folds.
        let mut other = cv.clone();
        other.seed = 43;
        let r = fit(&x, &laplace_cv(model, other, 2)).unwrap();
        assert_ne!(r.cv.unwrap().curve[0].folds, c0.curve[0].folds);
    }
}

#[test]
fn cv_auto_search_selects_near_the_best_grid_value() {
    // The auto search ends at the maximizer of a quadratic through its points; a fine grid
    // over the same folds must not find a held-out likelihood clearly better than the value
    // at the auto selection.
    let x = cox_design(800, 30, 21);
    let auto = fit(
        &x,
        &laplace_cv(
            ModelKind::Cox,
            CvOptions {
                folds: 5,
                seed: 3,
                ..Default::default()
            },
            2,
        ),
    )
    .unwrap();
    let v_auto = auto.cv.as_ref().unwrap().variance;
    let grid: Vec<f64> = (0..25)
        .map(|i| v_auto * 10f64.powf(-1.5 + i as f64 / 8.0))
        .collect();
    let g = fit(
        &x,
        &laplace_cv(
            ModelKind::Cox,
            CvOptions {
                folds: 5,
                seed: 3,
                search: CvSearch::Grid(grid.clone()),
                ..Default::default()
            },
            2,
        ),
    )
    .unwrap();
    let curve = &g.cv.as_ref().unwrap().curve;
    assert_eq!(curve.len(), grid.len());
    let best = curve
        .iter()
        .map(|p| p.mean)
        .fold(f64::NEG_INFINITY, f64::max);
    let at_auto = curve
        .iter()
        .min_by(|a, b| {
            (a.variance / v_auto)
                .ln()
                .abs()
                .total_cmp(&(b.variance / v_auto).ln().abs())
        })
        .unwrap()
        .mean;
    assert!(
        best - at_auto <= 0.01 * best.abs(),
        "auto {v_auto}: {at_auto} vs grid best {best}"
    );
    // The grid search selects its best point.
    let sel = g.cv.as_ref().unwrap().variance;
    assert_eq!(curve.iter().find(|p| p.variance == sel).unwrap().mean, best);
}

#[test]
fn cv_option_errors() {
    let x = cox_design(30, 3, 1);
    let mut o = FitOptions::new(ModelKind::Cox);
    o.cv = Some(CvOptions::default());
    let e = fit(&x, &o).unwrap_err().to_string();
    assert!(e.contains("cv") && e.contains("laplace"), "{e}");
    let mut o = laplace_cv(
        ModelKind::Cox,
        CvOptions {
            folds: 1,
            ..Default::default()
        },
        1,
    );
    let e = fit(&x, &o).unwrap_err().to_string();
    assert!(e.contains("cv.folds"), "{e}");
    o.cv = Some(CvOptions {
        folds: 40,
        ..Default::default()
    });
    let e = fit(&x, &o).unwrap_err().to_string();
    assert!(e.contains("cv.folds") && e.contains("30 rows"), "{e}");
}

fn rossi() -> DesignMatrix {
    let t = Table::read("survival_rossi.csv");
    let cols = ["fin", "age", "race", "wexp", "mar", "paro", "prio"];
    let keep = t.complete(&["week", "arrest"]);
    let time = pick(&t.num("week"), &keep);
    let y = pick(&t.num("arrest"), &keep);
    let mut b = DesignBuilder::new();
    for i in 0..time.len() {
        b.push_outcome(OutcomeRecord {
            row_id: i as i64,
            time: Some(time[i]),
            y: y[i],
            ..Default::default()
        });
    }
    for (j, c) in cols.iter().enumerate() {
        for (i, v) in pick(&t.num(c), &keep).into_iter().enumerate() {
            b.push_covariate(i as i64, j as i64 + 1, v);
        }
    }
    b.build().unwrap()
}

#[test]
fn bootstrap_is_reproducible_and_close_to_the_model_se() {
    let x = rossi();
    let mut o = FitOptions::new(ModelKind::Cox);
    o.ci = CiMethod::Wald;
    o.bootstrap = Some(BootstrapOptions {
        replicates: 200,
        by: Resampling::Auto,
        seed: 7,
    });
    o.threads = Some(1);
    let r1 = fit(&x, &o).unwrap();
    o.threads = Some(2);
    let r2 = fit(&x, &o).unwrap();
    let (b1, b2) = (
        r1.bootstrap.as_ref().unwrap(),
        r2.bootstrap.as_ref().unwrap(),
    );
    assert!(
        b1.estimates == b2.estimates && b1.coefficients == b2.coefficients,
        "same seed, other thread count"
    );
    assert_eq!(b1.replicates + b1.failed, 200);
    assert_eq!(b1.by, Resampling::Row);
    for (c, s) in r1.coefficients.iter().zip(&b1.coefficients) {
        let se = c.std_error.unwrap();
        let ratio = s.std_error / se;
        assert!(
            (0.75..1.33).contains(&ratio),
            "{}: bootstrap se {} vs model se {se}",
            c.name,
            s.std_error
        );
        assert!(s.lower < c.estimate && c.estimate < s.upper, "{}", c.name);
        assert_eq!(s.nonzero, 1.0, "unpenalized");
        assert!(s.bias.abs() < 0.5 * se, "{}: bias {}", c.name, s.bias);
    }
    // Another seed, other replicates.
    o.bootstrap.as_mut().unwrap().seed = 8;
    let r3 = fit(&x, &o).unwrap();
    assert!(r3.bootstrap.unwrap().estimates != b1.estimates);
    // ci = bootstrap puts the percentile intervals in the coefficient table.
    o.ci = CiMethod::Bootstrap;
    o.bootstrap.as_mut().unwrap().seed = 7;
    let r4 = fit(&x, &o).unwrap();
    for (c, s) in r4.coefficients.iter().zip(&b1.coefficients) {
        assert_eq!(c.ci_lower, Some(s.lower));
        assert_eq!(c.ci_upper, Some(s.upper));
    }
}

#[test]
fn bootstrap_replicate_by_stratum_keeps_cases_whole() {
    // SCCS bootstrap resamples cases; with a Laplace prior some drugs are zero in some
    // replicates, and the proportions are between 0 and 1.
    let x = sccs_design(300, 20, 13);
    let mut o = FitOptions::new(ModelKind::ConditionalPoisson);
    o.prior = Prior::Laplace { lambda: 3.0 };
    o.ci = CiMethod::None;
    o.bootstrap = Some(BootstrapOptions {
        replicates: 50,
        by: Resampling::Auto,
        seed: 1,
    });
    let r = fit(&x, &o).unwrap();
    let b = r.bootstrap.unwrap();
    assert_eq!(b.by, Resampling::Stratum);
    assert!(b
        .coefficients
        .iter()
        .all(|c| (0.0..=1.0).contains(&c.nonzero)));
    assert!(b
        .coefficients
        .iter()
        .any(|c| c.nonzero > 0.0 && c.nonzero < 1.0));
    for (k, e) in b.estimates.iter().enumerate().take(3) {
        assert_eq!(e.len(), r.coefficients.len(), "replicate {k}");
    }
}

/// The profile at β_j = b, computed independently: drop column j and put b·x_j in the offset.
fn profile_by_offset(
    x: &DesignMatrix,
    model: ModelKind,
    priors: &PriorSet,
    j: usize,
    b: f64,
) -> (f64, f64) {
    let mut reduced = x.clone();
    let col = reduced.columns.remove(j);
    let mut offset = vec![0.0; x.n_rows()];
    for (i, v) in col.entries() {
        offset[i] += b * v;
    }
    reduced.rows.offset = Some(offset);
    let mut per = priors.per_coef.clone();
    per.remove(j);
    let mut o = FitOptions::new(model);
    o.ci = CiMethod::None;
    o.ccd.convergence = Convergence::Gradient;
    o.ccd.tolerance = 1e-11;
    // Every remaining coefficient carries the same prior in these tests.
    o.prior = per.first().copied().unwrap_or(Prior::None);
    let r = fit(&reduced, &o).unwrap();
    (r.log_likelihood + r.log_prior, r.log_likelihood)
}

#[test]
fn profiles_match_refits_with_an_offset() {
    // Penalized Cox: the profile of coefficient 3 (penalized, penalty kept) on a grid, and its
    // profile interval; both against independent offset fits.
    let x = cox_design(500, 6, 17);
    let prior = Prior::Normal { variance: 0.5 };
    let mut o = FitOptions::new(ModelKind::Cox);
    o.prior = prior;
    o.ccd.convergence = Convergence::Gradient;
    o.ccd.tolerance = 1e-11;
    o.profile = ProfileOptions {
        covariates: vec![3],
        include_penalty: true,
        grid: Some(vec![-1.0, -0.5, 0.0, 0.25, 0.5, 1.0]),
        only_covariates: false,
    };
    let r = fit(&x, &o).unwrap();
    let j = 2;
    let priors = PriorSet::new(prior, &[false; 6]);
    let prof = &r.profiles[0];
    assert_eq!(prof.covariate_id, 3);
    assert_eq!(prof.points.len(), 7, "grid plus the estimate");
    assert!(prof.points.windows(2).all(|w| w[0].value < w[1].value));
    let est = prof.points.iter().find(|p| p.is_estimate).unwrap();
    assert_eq!(est.value, r.coefficients[j].estimate);
    for p in prof.points.iter().filter(|p| !p.is_estimate) {
        let (obj_rest, ll) = profile_by_offset(&x, ModelKind::Cox, &priors, j, p.value);
        let own = prior.penalty(p.value);
        assert!(
            (p.objective - (obj_rest - own)).abs() < 1e-6,
            "{} {} {}",
            p.value,
            p.objective,
            obj_rest - own
        );
        assert!((p.log_likelihood - ll).abs() < 1e-6);
        assert!(p.objective <= est.objective + 1e-9);
    }
    // The interval's ends sit 1.920729 below the optimum.
    let c = &r.coefficients[j];
    assert!(c.penalized && c.std_error.is_none());
    for bound in [c.ci_lower.unwrap(), c.ci_upper.unwrap()] {
        let (obj_rest, _) = profile_by_offset(&x, ModelKind::Cox, &priors, j, bound);
        let drop = r.objective() - (obj_rest - prior.penalty(bound));
        assert!(
            (drop - 1.920729410347062).abs() < 1e-5,
            "bound {bound}: drop {drop}"
        );
    }
    // Without its own penalty the interval is centred on the maximizer of LL + the others'
    // log prior: the ends sit 1.920729 below that maximum.
    o.profile.include_penalty = false;
    o.profile.grid = None;
    let r2 = fit(&x, &o).unwrap();
    let c2 = &r2.coefficients[j];
    let mut unpen = priors.clone();
    unpen.per_coef[j] = Prior::None;
    let mut o3 = o.clone();
    o3.profile = ProfileOptions::default();
    o3.ci = CiMethod::None;
    let mut reduced_opts = o3.clone();
    reduced_opts.exclude = vec![3];
    let top = fit(&x, &reduced_opts).unwrap().objective();
    for bound in [c2.ci_lower.unwrap(), c2.ci_upper.unwrap()] {
        let (obj_rest, _) = profile_by_offset(&x, ModelKind::Cox, &priors, j, bound);
        assert!(
            (top - obj_rest - 1.920729410347062).abs() < 1e-5,
            "bound {bound}"
        );
    }
    assert!(c2.ci_lower.unwrap() != c.ci_lower.unwrap());
}

#[test]
fn profile_intervals_do_not_depend_on_threads() {
    let x = cox_design(400, 5, 23);
    let mut o = FitOptions::new(ModelKind::Cox);
    o.threads = Some(1);
    let r1 = fit(&x, &o).unwrap();
    o.threads = Some(3);
    let r3 = fit(&x, &o).unwrap();
    for (a, b) in r1.coefficients.iter().zip(&r3.coefficients) {
        assert_eq!(a.ci_lower.map(f64::to_bits), b.ci_lower.map(f64::to_bits));
        assert_eq!(a.ci_upper.map(f64::to_bits), b.ci_upper.map(f64::to_bits));
        assert!(a.ci_lower.is_some() && a.ci_upper.is_some());
    }
}
