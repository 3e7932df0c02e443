//! Degenerate fits (issue #16, items 2, 3 and 5): no finite MLE (separation, monotone
//! likelihood, all-zero outcomes, one-row fits), data without information, aliased and constant
//! columns, and cross-validation folds / bootstrap replicates without events.
//!
//! Where a number can be checked, it is checked against a computation that does not go through
//! the degenerate path: the limit fit that the diverging coefficient tends to, the same fit
//! without the aliased column, fitted probabilities computed here, or the resampling scheme
//! replayed here.

use epifusion_core::backend::Device;
use epifusion_core::fit::{fit, fit_owned, CiMethod, FitOptions, FitResult};
use epifusion_core::model::bootstrap::BootstrapOptions;
use epifusion_core::model::ccd::{CcdOptions, FitStatus};
use epifusion_core::model::cv::{
    assign_folds, cross_validate, stream_seed, CvOptions, CvSearch, Problem,
};
use epifusion_core::model::design::{DesignBuilder, DesignMatrix, OutcomeRecord, INTERCEPT_ID};
use epifusion_core::model::prior::Prior;
use epifusion_core::model::rng::Rng;
use epifusion_core::model::{LikelihoodOptions, ModelKind};
use epifusion_core::Error;

/// One covariate column: id, name, value per row.
type Col = (i64, &'static str, Vec<f64>);

/// Rows (time, y, stratum, weight) and covariate columns → a design.
struct Data {
    time: Vec<f64>,
    y: Vec<f64>,
    stratum: Option<Vec<i64>>,
    weight: Option<Vec<f64>>,
    cols: Vec<Col>,
}

impl Data {
    fn new(time: Vec<f64>, y: Vec<f64>, cols: Vec<Col>) -> Self {
        Data {
            time,
            y,
            stratum: None,
            weight: None,
            cols,
        }
    }

    fn design(&self) -> DesignMatrix {
        let mut b = DesignBuilder::new();
        for i in 0..self.y.len() {
            b.push_outcome(OutcomeRecord {
                row_id: i as i64,
                stratum_id: self.stratum.as_ref().map(|s| s[i]),
                time: Some(self.time[i]),
                y: self.y[i],
                weight: self.weight.as_ref().map(|w| w[i]),
                ..Default::default()
            });
        }
        for (id, name, v) in &self.cols {
            b.name_covariate(*id, *name);
            for (i, &x) in v.iter().enumerate() {
                b.push_covariate(i as i64, *id, x);
            }
        }
        b.build().unwrap()
    }

    /// The same rows with only the columns whose id is in `ids`.
    fn with_columns(&self, ids: &[i64]) -> Data {
        Data {
            time: self.time.clone(),
            y: self.y.clone(),
            stratum: self.stratum.clone(),
            weight: self.weight.clone(),
            cols: self
                .cols
                .iter()
                .filter(|c| ids.contains(&c.0))
                .cloned()
                .collect(),
        }
    }

    /// The rows where `keep` holds.
    fn rows_where(&self, keep: impl Fn(usize) -> bool) -> Data {
        let idx: Vec<usize> = (0..self.y.len()).filter(|&i| keep(i)).collect();
        let pick = |v: &Vec<f64>| idx.iter().map(|&i| v[i]).collect::<Vec<f64>>();
        Data {
            time: pick(&self.time),
            y: pick(&self.y),
            stratum: self
                .stratum
                .as_ref()
                .map(|s| idx.iter().map(|&i| s[i]).collect()),
            weight: self.weight.as_ref().map(pick),
            cols: self
                .cols
                .iter()
                .map(|(id, n, v)| (*id, *n, pick(v)))
                .collect(),
        }
    }
}

fn opts(model: ModelKind) -> FitOptions {
    let mut o = FitOptions::new(model);
    o.threads = Some(1);
    o.device = Device::Cpu;
    o
}

fn coef(r: &FitResult, id: i64) -> &epifusion_core::fit::Coefficient {
    r.coefficient(id)
        .unwrap_or_else(|| panic!("no coefficient {id}"))
}

fn notes(r: &FitResult) -> String {
    r.notes.join("; ")
}

fn close(a: f64, b: f64, rel: f64) -> bool {
    (a - b).abs() <= rel * (1.0 + a.abs().max(b.abs()))
}

/// The no-finite-MLE note lists exactly `names` (and nothing of `not`).
fn assert_diverging(r: &FitResult, names: &[&str], not: &[&str]) {
    assert_eq!(r.status, FitStatus::NoFiniteMle, "{}", notes(r));
    assert_eq!(r.status.name(), "no_finite_mle");
    let note = r
        .notes
        .iter()
        .find(|n| n.starts_with("no finite MLE"))
        .unwrap_or_else(|| panic!("no note: {}", notes(r)));
    for n in names {
        assert!(note.contains(n), "{n} missing from: {note}");
    }
    for n in not {
        assert!(!note.contains(n), "{n} wrongly in: {note}");
    }
}

// ---------------------------------------------------------------------------------------------
// Item 2: no finite MLE.

/// y = 1 exactly when x > 5: the intercept and x diverge together; every fitted probability is
/// numerically 0 or 1 (R's `glm` warning), checked here from the returned coefficients.
#[test]
fn logistic_complete_separation_is_no_finite_mle() {
    let x: Vec<f64> = (1..=10).map(f64::from).collect();
    let y: Vec<f64> = x.iter().map(|&v| f64::from(u8::from(v > 5.0))).collect();
    let d = Data::new(vec![1.0; 10], y.clone(), vec![(1, "x", x.clone())]);
    let r = fit(&d.design(), &opts(ModelKind::Logistic)).unwrap();
    assert_diverging(&r, &["(Intercept) → −∞", "x (covariate 1) → +∞"], &[]);
    let (b0, b1) = (coef(&r, INTERCEPT_ID).estimate, coef(&r, 1).estimate);
    for (xi, yi) in x.iter().zip(&y) {
        let p = 1.0 / (1.0 + (-(b0 + b1 * xi)).exp());
        assert!((p - yi).abs() < 1e-6, "p = {p} at x = {xi}");
    }
    for c in &r.coefficients {
        assert_eq!(c.std_error, None);
        assert_eq!((c.ci_lower, c.ci_upper), (None, None));
    }
    // Wald intervals: none either.
    let mut o = opts(ModelKind::Logistic);
    o.ci = CiMethod::Wald;
    let w = fit(&d.design(), &o).unwrap();
    assert_eq!(w.status, FitStatus::NoFiniteMle);
    assert!(w.coefficients.iter().all(|c| c.std_error.is_none()));
}

/// Quasi-separation: every row with x1 = 1 is a case. β1 → +∞; the intercept and x2 stay finite
/// and equal the fit on the rows with x1 = 0 (the x1 = 1 rows' likelihood tends to 1), which is
/// computed here on data without any separation.
#[test]
fn logistic_quasi_separation_names_the_separating_covariate() {
    let mut rng = Rng::new(3);
    let n = 80;
    let x1: Vec<f64> = (0..n).map(|i| f64::from(u8::from(i % 4 == 0))).collect();
    let x2: Vec<f64> = (0..n).map(|_| rng.normal()).collect();
    let y: Vec<f64> = (0..n)
        .map(|i| {
            if x1[i] == 1.0 {
                1.0
            } else {
                let p = 1.0 / (1.0 + (-(-0.3 + 0.8 * x2[i])).exp());
                f64::from(u8::from(rng.bernoulli(p)))
            }
        })
        .collect();
    let d = Data::new(vec![1.0; n], y, vec![(1, "x1", x1.clone()), (2, "x2", x2)]);
    let r = fit(&d.design(), &opts(ModelKind::Logistic)).unwrap();
    assert_diverging(&r, &["x1 (covariate 1) → +∞"], &["x2", "(Intercept)"]);
    assert!(coef(&r, 1).std_error.is_none());
    let limit = fit(
        &d.rows_where(|i| x1[i] == 0.0).with_columns(&[2]).design(),
        &opts(ModelKind::Logistic),
    )
    .unwrap();
    assert_eq!(limit.status, FitStatus::Converged);
    assert!(limit.notes.is_empty(), "{}", notes(&limit));
    for id in [INTERCEPT_ID, 2] {
        let (a, b) = (coef(&r, id), coef(&limit, id));
        assert!(close(a.estimate, b.estimate, 1e-6), "{id}: {a:?} vs {b:?}");
        let (sa, sb) = (a.std_error.unwrap(), b.std_error.unwrap());
        assert!(close(sa, sb, 1e-6), "{id}: SE {sa} vs {sb}");
        // Profile intervals (β1 held where it stopped) exist and match too.
        assert!(close(a.ci_lower.unwrap(), b.ci_lower.unwrap(), 1e-5));
        assert!(close(a.ci_upper.unwrap(), b.ci_upper.unwrap(), 1e-5));
    }
}

/// A Cox data set whose x = 1 subjects all fail before anyone with x = 0 has an event: each of
/// their events is the largest x of its risk set, so the partial likelihood increases
/// monotonically in β_x. z stays finite, and tends to the fit stratified by x (at the x = 0
/// event times no x = 1 subject is left), computed here on data without monotone likelihood.
fn monotone_survival(fine_gray: bool) -> Data {
    let mut rng = Rng::new(11);
    let (n1, n0) = (8, 40);
    let mut time = Vec::new();
    let mut y = Vec::new();
    let mut x = Vec::new();
    let mut z = Vec::new();
    for i in 0..n1 {
        time.push(1.0 + i as f64);
        y.push(1.0);
        x.push(1.0);
        z.push(rng.normal());
    }
    for _ in 0..n0 {
        let zi = rng.normal();
        time.push((20.0 + rng.exponential((0.5 * zi).exp() / 10.0)).round());
        let u = rng.uniform();
        y.push(if u < 0.6 {
            1.0
        } else if fine_gray && u < 0.8 {
            2.0
        } else {
            0.0
        });
        x.push(0.0);
        z.push(zi);
    }
    Data::new(time, y, vec![(1, "x", x), (2, "z", z)])
}

#[test]
fn cox_monotone_likelihood_is_no_finite_mle() {
    let d = monotone_survival(false);
    let r = fit(&d.design(), &opts(ModelKind::Cox)).unwrap();
    assert_diverging(&r, &["x (covariate 1) → +∞"], &["z (covariate 2)"]);
    let mut strat = d.with_columns(&[2]);
    strat.stratum = Some(d.cols[0].2.iter().map(|&v| v as i64).collect());
    let limit = fit(&strat.design(), &opts(ModelKind::Cox)).unwrap();
    assert_eq!(limit.status, FitStatus::Converged);
    let (a, b) = (coef(&r, 2), coef(&limit, 2));
    assert!(close(a.estimate, b.estimate, 1e-6), "{a:?} vs {b:?}");
    assert!(close(a.std_error.unwrap(), b.std_error.unwrap(), 1e-6));
    assert!(coef(&r, 1).std_error.is_none() && coef(&r, 1).ci_upper.is_none());
}

#[test]
fn fine_gray_monotone_likelihood_is_no_finite_mle() {
    let d = monotone_survival(true);
    assert!(d.y.contains(&2.0));
    let r = fit(&d.design(), &opts(ModelKind::FineGray)).unwrap();
    assert_diverging(&r, &["x (covariate 1) → +∞"], &["z (covariate 2)"]);
    assert!(coef(&r, 1).std_error.is_none());
    assert!(coef(&r, 2).std_error.is_some());
    // Without the x = 1 subjects the same model is an ordinary, finite fit.
    let rest = fit(
        &d.rows_where(|i| d.cols[0].2[i] == 0.0)
            .with_columns(&[2])
            .design(),
        &opts(ModelKind::FineGray),
    )
    .unwrap();
    assert_eq!(rest.status, FitStatus::Converged, "{}", notes(&rest));
}

/// All-zero (or all-one) outcomes: the intercept goes to ∓∞.
#[test]
fn all_zero_outcome_is_no_finite_mle() {
    let x: Vec<f64> = (0..12).map(|i| f64::from(i % 3)).collect();
    for (model, y, dir) in [
        (ModelKind::Logistic, 0.0, "−∞"),
        (ModelKind::Logistic, 1.0, "+∞"),
        (ModelKind::Poisson, 0.0, "−∞"),
    ] {
        let d = Data::new(vec![2.0; 12], vec![y; 12], vec![(1, "x", x.clone())]);
        let r = fit(&d.design(), &opts(model)).unwrap();
        assert_diverging(&r, &[&format!("(Intercept) → {dir}")], &[]);
        let b0 = coef(&r, INTERCEPT_ID).estimate;
        assert!(if y == 0.0 { b0 < -10.0 } else { b0 > 10.0 }, "{b0}");
    }
}

/// One-row fits: logistic (the covariate is aliased with the intercept, which diverges),
/// Poisson with no event (diverges), Poisson with 3 events (finite: log(3/t)), Cox (no
/// information at all: every coefficient held at 0 with a note).
#[test]
fn one_row_fits() {
    let one = |y: f64| Data::new(vec![2.0], vec![y], vec![(1, "x", vec![1.5])]);
    let r = fit(&one(1.0).design(), &opts(ModelKind::Logistic)).unwrap();
    assert_diverging(&r, &["(Intercept) → +∞"], &["x (covariate 1) →"]);
    assert!(notes(&r)
        .contains("aliased: x (covariate 1) is (nearly) a linear combination of (Intercept)"));
    assert_eq!(coef(&r, 1).estimate, 0.0);
    let r = fit(&one(0.0).design(), &opts(ModelKind::Poisson)).unwrap();
    assert_diverging(&r, &["(Intercept) → −∞"], &[]);
    let r = fit(&one(3.0).design(), &opts(ModelKind::Poisson)).unwrap();
    assert_eq!(r.status, FitStatus::Converged);
    assert!(close(
        coef(&r, INTERCEPT_ID).estimate,
        (3.0f64 / 2.0).ln(),
        1e-9
    ));
    let r = fit(&one(1.0).design(), &opts(ModelKind::Cox)).unwrap();
    assert_eq!(r.status, FitStatus::Converged);
    assert_eq!(coef(&r, 1).estimate, 0.0);
    assert!(
        notes(&r).contains("no information: x (covariate 1) is constant within every stratum"),
        "{}",
        notes(&r)
    );
}

/// Zero-information data is an error, not β = 0.
#[test]
fn zero_information_is_an_error() {
    let x: Vec<f64> = (0..6).map(f64::from).collect();
    let time: Vec<f64> = (1..=6).map(f64::from).collect();
    let mut d = Data::new(
        time.clone(),
        vec![1.0, 0.0, 1.0, 1.0, 0.0, 1.0],
        vec![(1, "x", x.clone())],
    );
    d.weight = Some(vec![0.0; 6]);
    for model in [ModelKind::Cox, ModelKind::Logistic, ModelKind::Poisson] {
        let e = fit(&d.design(), &opts(model)).unwrap_err();
        assert!(matches!(e, Error::Empty(_)), "{model:?}: {e}");
        assert!(e.to_string().contains("row weights are 0"), "{e}");
    }
    // Events only in rows of weight 0.
    d.weight = Some(vec![0.0, 1.0, 0.0, 0.0, 1.0, 0.0]);
    let e = fit(&d.design(), &opts(ModelKind::Cox)).unwrap_err();
    assert!(
        e.to_string()
            .contains("cox: no events (y = 1) in the data (every such row has weight 0)"),
        "{e}"
    );
    // No events at all: Cox, Fine–Gray, conditional logistic — penalized or not.
    let none = Data::new(time.clone(), vec![0.0; 6], vec![(1, "x", x.clone())]);
    for model in [
        ModelKind::Cox,
        ModelKind::FineGray,
        ModelKind::ConditionalLogistic,
    ] {
        let mut o = opts(model);
        o.prior = Prior::Normal { variance: 1.0 };
        let e = fit(&none.design(), &o).unwrap_err();
        assert!(
            e.to_string().contains(&format!(
                "empty input: {}: no events (y = 1) in the data",
                model.name()
            )),
            "{model:?}: {e}"
        );
    }
    let e = fit(&none.design(), &opts(ModelKind::ConditionalPoisson)).unwrap_err();
    assert!(e.to_string().contains("sccs: no cases"), "{e}");
    // A value outside the model's domain is reported as such, before "no events".
    let y2 = Data::new(time, vec![2.0; 6], vec![(1, "x", x)]);
    let e = fit(&y2.design(), &opts(ModelKind::Cox)).unwrap_err();
    assert!(e.to_string().contains("must be 0 or 1 for cox"), "{e}");
}

/// A large but finite coefficient with real curvature, and a tiny Poisson rate (intercept
/// −12), are not flagged.
#[test]
fn large_finite_estimates_are_not_flagged() {
    let mut rng = Rng::new(5);
    let n = 400;
    let x: Vec<f64> = (0..n).map(|_| rng.normal()).collect();
    let y: Vec<f64> = x
        .iter()
        .map(|&v| {
            f64::from(u8::from(
                rng.bernoulli(1.0 / (1.0 + (-(1.0 + 4.0 * v)).exp())),
            ))
        })
        .collect();
    let d = Data::new(vec![1.0; n], y, vec![(1, "x", x.clone())]);
    let r = fit(&d.design(), &opts(ModelKind::Logistic)).unwrap();
    assert_eq!(r.status, FitStatus::Converged, "{}", notes(&r));
    assert!(r.notes.is_empty());
    assert!(coef(&r, 1).estimate > 2.5);
    let time = vec![1e5; n];
    let y: Vec<f64> = x
        .iter()
        .map(|&v| rng.poisson(1e5 * (-12.0 + 0.5 * v).exp()) as f64)
        .collect();
    let d = Data::new(time, y, vec![(1, "x", x)]);
    let r = fit(&d.design(), &opts(ModelKind::Poisson)).unwrap();
    assert_eq!(r.status, FitStatus::Converged, "{}", notes(&r));
    assert!(r.notes.is_empty());
    assert!(coef(&r, INTERCEPT_ID).estimate < -11.0);
}

/// A proper prior always has a finite optimum: penalized separating or duplicated columns are
/// neither flagged nor dropped.
#[test]
fn penalized_columns_are_never_flagged_or_dropped() {
    let x: Vec<f64> = (1..=10).map(f64::from).collect();
    let y: Vec<f64> = x.iter().map(|&v| f64::from(u8::from(v > 5.0))).collect();
    let d = Data::new(
        vec![1.0; 10],
        y,
        vec![(1, "x", x.clone()), (2, "x_copy", x)],
    );
    let mut o = opts(ModelKind::Logistic);
    o.prior = Prior::Normal { variance: 1.0 };
    let r = fit(&d.design(), &o).unwrap();
    assert_eq!(r.status, FitStatus::Converged, "{}", notes(&r));
    assert!(r.notes.is_empty(), "{}", notes(&r));
    // The Normal prior splits a duplicated column equally.
    let (a, b) = (coef(&r, 1).estimate, coef(&r, 2).estimate);
    assert!(a > 0.1 && close(a, b, 1e-6), "{a} {b}");
}

// ---------------------------------------------------------------------------------------------
// Item 3: aliased and constant columns.

fn survival_data(n: usize, seed: u64) -> Data {
    let mut rng = Rng::new(seed);
    let age: Vec<f64> = (0..n)
        .map(|_| (60.0 + 10.0 * rng.normal()).round())
        .collect();
    let sex: Vec<f64> = (0..n)
        .map(|_| f64::from(u8::from(rng.bernoulli(0.4))))
        .collect();
    let time: Vec<f64> = (0..n)
        .map(|i| {
            let rate = (0.03 * (age[i] - 60.0) - 0.5 * sex[i]).exp() / 100.0;
            rng.exponential(rate).ceil()
        })
        .collect();
    let y: Vec<f64> = (0..n)
        .map(|_| f64::from(u8::from(rng.bernoulli(0.7))))
        .collect();
    Data::new(time, y, vec![(1, "age", age), (2, "sex", sex)])
}

/// Compare the coefficients `ids` of two fits: estimates, standard errors and bounds.
fn assert_same(a: &FitResult, b: &FitResult, ids: &[i64], rel: f64) {
    for &id in ids {
        let (x, y) = (coef(a, id), coef(b, id));
        assert!(close(x.estimate, y.estimate, rel), "{id}: {x:?} vs {y:?}");
        for (u, v) in [
            (x.std_error, y.std_error),
            (x.ci_lower, y.ci_lower),
            (x.ci_upper, y.ci_upper),
        ] {
            let (u, v) = (u.expect("present"), v.expect("present"));
            assert!(close(u, v, rel), "{id}: {x:?} vs {y:?}");
        }
    }
}

/// An exact copy of `age` (`age2`) is aliased: fixed at 0 with no SE or interval and a note
/// naming both; age and sex keep the estimates, SEs and profile intervals of the fit without
/// the copy.
#[test]
fn duplicate_column_is_aliased() {
    let mut d = survival_data(80, 1);
    let age = d.cols[0].2.clone();
    d.cols.push((3, "age2", age));
    let r = fit(&d.design(), &opts(ModelKind::Cox)).unwrap();
    let without = fit(&d.with_columns(&[1, 2]).design(), &opts(ModelKind::Cox)).unwrap();
    assert_eq!(r.status, FitStatus::Converged);
    assert_same(&r, &without, &[1, 2], 1e-9);
    // The consuming fit (the CLI's) is the same.
    let owned = fit_owned(d.design(), &opts(ModelKind::Cox)).unwrap();
    assert_eq!(owned.coefficients, r.coefficients);
    assert_eq!(owned.notes, r.notes);
    let a2 = coef(&r, 3);
    assert_eq!(a2.estimate, 0.0);
    assert_eq!((a2.std_error, a2.ci_lower, a2.ci_upper), (None, None, None));
    assert!(
        notes(&r).contains(
            "aliased: age2 (covariate 3) is (nearly) a linear combination of age (covariate 1)"
        ),
        "{}",
        notes(&r)
    );
    // A linear combination of two columns (age + 2·sex) in logistic regression, with Wald
    // intervals.
    let mut l = survival_data(120, 2);
    l.y = l
        .time
        .iter()
        .map(|&t| f64::from(u8::from(t < 60.0)))
        .collect();
    let combo: Vec<f64> = (0..120)
        .map(|i| l.cols[0].2[i] + 2.0 * l.cols[1].2[i])
        .collect();
    l.cols.push((3, "combo", combo));
    let mut o = opts(ModelKind::Logistic);
    o.ci = CiMethod::Wald;
    let r = fit(&l.design(), &o).unwrap();
    let without = fit(&l.with_columns(&[1, 2]).design(), &o).unwrap();
    assert_same(&r, &without, &[INTERCEPT_ID, 1, 2], 1e-9);
    assert!(
        notes(&r).contains("combo (covariate 3) is (nearly) a linear combination of age (covariate 1), sex (covariate 2)"),
        "{}",
        notes(&r)
    );
}

/// An all-zero column no longer blanks the Wald SEs and intervals of every coefficient: the
/// others equal the fit without it.
#[test]
fn all_zero_column_keeps_the_other_standard_errors() {
    for model in [ModelKind::Cox, ModelKind::Logistic] {
        let mut d = survival_data(60, 3);
        if model == ModelKind::Logistic {
            d.y = d
                .time
                .iter()
                .map(|&t| f64::from(u8::from(t < 60.0)))
                .collect();
        }
        d.cols.push((5, "zero", vec![0.0; 60]));
        let mut o = opts(model);
        o.ci = CiMethod::Wald;
        let r = fit(&d.design(), &o).unwrap();
        let without = fit(&d.with_columns(&[1, 2]).design(), &o).unwrap();
        assert_eq!(r.status, FitStatus::Converged);
        let ids: &[i64] = if model == ModelKind::Cox {
            &[1, 2]
        } else {
            &[INTERCEPT_ID, 1, 2]
        };
        assert_same(&r, &without, ids, 1e-12);
        assert!(notes(&r).contains("no information: zero (covariate 5) is 0 in every row"));
        assert_eq!(coef(&r, 5).std_error, None);
    }
}

/// Constant columns: aliased with the intercept in logistic regression; constant within every
/// stratum of a stratified Cox model (but not overall) carries no information.
#[test]
fn constant_columns() {
    let mut d = survival_data(60, 4);
    d.y = d
        .time
        .iter()
        .map(|&t| f64::from(u8::from(t < 60.0)))
        .collect();
    d.cols.push((7, "three", vec![3.0; 60]));
    let mut o = opts(ModelKind::Logistic);
    o.ci = CiMethod::Wald;
    let r = fit(&d.design(), &o).unwrap();
    let without = fit(&d.with_columns(&[1, 2]).design(), &o).unwrap();
    assert_same(&r, &without, &[INTERCEPT_ID, 1, 2], 1e-9);
    assert!(
        notes(&r).contains(
            "aliased: three (covariate 7) is (nearly) a linear combination of (Intercept)"
        ),
        "{}",
        notes(&r)
    );
    // Stratified Cox: `site` is the stratum's own value.
    let mut c = survival_data(90, 5);
    let stratum: Vec<i64> = (0..90).map(|i| (i % 3) as i64).collect();
    c.cols.push((
        9,
        "site",
        stratum.iter().map(|&s| 10.0 + s as f64).collect(),
    ));
    c.stratum = Some(stratum);
    let r = fit(&c.design(), &opts(ModelKind::Cox)).unwrap();
    let without = fit(&c.with_columns(&[1, 2]).design(), &opts(ModelKind::Cox)).unwrap();
    assert_same(&r, &without, &[1, 2], 1e-9);
    assert!(
        notes(&r).contains("no information: site (covariate 9) is constant within every stratum"),
        "{}",
        notes(&r)
    );
    assert_eq!(coef(&r, 9).estimate, 0.0);
    // SCCS: a per-case attribute (constant within every case) beside an exposure.
    let mut rng = Rng::new(12);
    let (mut time, mut y, mut drug, mut sex, mut case) = (vec![], vec![], vec![], vec![], vec![]);
    for c in 0..30 {
        let s = f64::from(u8::from(c % 2 == 0));
        for (t, e) in [(200.0, 0.0f64), (40.0, 1.0)] {
            time.push(t);
            drug.push(e);
            sex.push(s);
            y.push(rng.poisson(0.01 * t * (0.7 * e).exp()) as f64);
            case.push(c as i64);
        }
    }
    let mut d = Data::new(time, y, vec![(1000, "drug", drug), (2, "sex", sex)]);
    d.stratum = Some(case);
    let r = fit(&d.design(), &opts(ModelKind::ConditionalPoisson)).unwrap();
    let without = fit(
        &d.with_columns(&[1000]).design(),
        &opts(ModelKind::ConditionalPoisson),
    )
    .unwrap();
    assert_eq!(r.status, FitStatus::Converged);
    assert_same(&r, &without, &[1000], 1e-9);
    assert!(
        notes(&r).contains("no information: sex (covariate 2) is constant within every case"),
        "{}",
        notes(&r)
    );
    // A column that is non-zero only in rows of weight 0 enters no term of the likelihood.
    let mut w = survival_data(60, 13);
    w.y = w
        .time
        .iter()
        .map(|&t| f64::from(u8::from(t < 60.0)))
        .collect();
    w.weight = Some((0..60).map(|i| if i < 10 { 0.0 } else { 1.0 }).collect());
    w.cols.push((
        4,
        "ghost",
        (0..60)
            .map(|i| if i < 10 { 1.0 + i as f64 } else { 0.0 })
            .collect(),
    ));
    let mut o = opts(ModelKind::Logistic);
    o.ci = CiMethod::Wald;
    let r = fit(&w.design(), &o).unwrap();
    let without = fit(&w.with_columns(&[1, 2]).design(), &o).unwrap();
    assert_same(&r, &without, &[INTERCEPT_ID, 1, 2], 1e-9);
    assert!(
        notes(&r).contains("no information: ghost (covariate 4) has no information"),
        "{}",
        notes(&r)
    );
}

// ---------------------------------------------------------------------------------------------
// Item 5: degenerate resampling.

/// Cox data with only two events (rows `a` and `b`).
fn two_events(n: usize) -> (Data, usize, usize) {
    let mut d = survival_data(n, 6);
    d.y = vec![0.0; n];
    let (a, b) = (3, 17);
    d.y[a] = 1.0;
    d.y[b] = 1.0;
    (d, a, b)
}

/// A fold whose training rows hold both events is skipped; the number skipped is the number of
/// repetitions whose fold assignment (replayed here) puts both events in one fold.
#[test]
fn cv_skips_folds_without_training_events() {
    let n = 40;
    let (d, a, b) = two_events(n);
    let (folds, reps) = (5, 4);
    // A seed whose assignment puts both events together in some, but not all, repetitions.
    let (seed, expected) = (1..200u64)
        .map(|s| {
            let asg = assign_folds(n, folds, reps, s);
            (s, asg.iter().filter(|f| f[a] == f[b]).count())
        })
        .find(|&(_, k)| k > 0 && k < reps)
        .unwrap();
    let mut o = opts(ModelKind::Cox);
    o.prior = Prior::Normal { variance: 1.0 };
    o.cv = Some(CvOptions {
        folds,
        repetitions: reps,
        seed,
        search: CvSearch::Grid(vec![0.1, 1.0]),
        ..CvOptions::default()
    });
    let r = fit(&d.design(), &o).unwrap();
    let cv = r.cv.as_ref().unwrap();
    assert_eq!(cv.skipped.len(), expected, "{:?}", cv.skipped);
    assert!(cv.skipped[0].contains("training set without information"));
    assert!(
        notes(&r).contains(&format!("cv: {expected} of {} folds skipped", folds * reps)),
        "{}",
        notes(&r)
    );
    // Every other fold enters the curve; the held-out sets without events score 0.
    assert_eq!(cv.curve[0].folds.len(), folds * reps - expected);
    assert!(cv.empty_test_folds > 0);
    assert!(notes(&r).contains("no event in the held-out set"));
    // No events at all: every fold is skipped, a clear error.
    let none = Data {
        y: vec![0.0; n],
        ..d.with_columns(&[1, 2])
    };
    let x = none.design();
    let problem = Problem {
        design: &x,
        kind: ModelKind::Cox,
        lik: LikelihoodOptions::default(),
        exclude: &[],
        ccd: CcdOptions::fit_default(),
        fixed: Vec::new(),
    };
    let e = cross_validate(
        &problem,
        Prior::Normal { variance: 1.0 },
        &CvOptions {
            folds,
            search: CvSearch::Grid(vec![1.0]),
            ..CvOptions::default()
        },
    )
    .unwrap_err();
    assert!(e.to_string().contains("all 5 folds were skipped"), "{e}");
}

/// Resamples that miss the only event are skipped and counted; the count equals the number of
/// replicates whose draws (replayed here from the documented scheme: replicate b draws n rows
/// with replacement from the generator seeded by stream_seed(seed, b)) never pick that row.
#[test]
fn bootstrap_skips_replicates_without_events() {
    let n = 30;
    let mut d = survival_data(n, 8);
    d.y = vec![0.0; n];
    let event = 12;
    d.y[event] = 1.0;
    let (replicates, seed) = (60, 4);
    let expected = (0..replicates)
        .filter(|&b| {
            let mut rng = Rng::new(stream_seed(seed, b as u64));
            (0..n).all(|_| rng.int_range(0, n as u64 - 1) as usize != event)
        })
        .count();
    assert!(expected > 0 && expected < replicates);
    let mut o = opts(ModelKind::Cox);
    o.prior = Prior::Normal { variance: 1.0 };
    o.ci = CiMethod::Bootstrap;
    o.bootstrap = Some(BootstrapOptions {
        replicates,
        seed,
        ..BootstrapOptions::default()
    });
    let r = fit(&d.design(), &o).unwrap();
    let b = r.bootstrap.as_ref().unwrap();
    assert_eq!(b.skipped, expected);
    assert_eq!(b.replicates + b.failed + b.skipped, replicates);
    assert_eq!(b.estimates.len(), b.replicates);
    assert!(
        notes(&r).contains(&format!(
            "bootstrap: {expected} of {replicates} replicates skipped"
        )),
        "{}",
        notes(&r)
    );
    assert!(b.skip_reason.as_deref().unwrap().contains("no events"));
    // No resample has an event (the data have none): a clear error, not a summary of nothing.
    let none = Data {
        y: vec![0.0; n],
        ..d.with_columns(&[1, 2])
    };
    let x = none.design();
    let problem = Problem {
        design: &x,
        kind: ModelKind::Cox,
        lik: LikelihoodOptions::default(),
        exclude: &[],
        ccd: CcdOptions::fit_default(),
        fixed: Vec::new(),
    };
    let e = epifusion_core::model::bootstrap::bootstrap(
        &problem,
        Prior::Normal { variance: 1.0 },
        &[0.0, 0.0],
        0.95,
        &BootstrapOptions {
            replicates: 10,
            ..BootstrapOptions::default()
        },
    )
    .unwrap_err();
    assert!(
        e.to_string()
            .contains("only 0 of 10 replicates could be fitted (0 ill-conditioned, 10 skipped"),
        "{e}"
    );
}

#[test]
fn bootstrap_with_few_replicates_warns() {
    let d = survival_data(50, 9);
    let run = |replicates: usize| {
        let mut o = opts(ModelKind::Cox);
        o.ci = CiMethod::Wald;
        o.bootstrap = Some(BootstrapOptions {
            replicates,
            ..BootstrapOptions::default()
        });
        fit(&d.design(), &o).unwrap()
    };
    let few = run(20);
    assert_eq!(few.bootstrap.as_ref().unwrap().replicates, 20);
    assert!(
        notes(&few).contains("bootstrap: only 20 replicates in the summaries (fewer than 50)"),
        "{}",
        notes(&few)
    );
    let enough = run(50);
    assert!(enough.notes.is_empty(), "{}", notes(&enough));
}

/// The bootstrap's replicates hold an aliased column at 0 as the fit does: the other
/// coefficients' replicate estimates and percentile intervals are those of the bootstrap
/// without the copy (same seed, same draws), and the copy gets no interval.
#[test]
fn bootstrap_holds_aliased_columns() {
    let mut d = survival_data(60, 10);
    let age = d.cols[0].2.clone();
    d.cols.push((3, "age2", age));
    let mut o = opts(ModelKind::Cox);
    o.ci = CiMethod::Bootstrap;
    o.bootstrap = Some(BootstrapOptions {
        replicates: 50,
        ..BootstrapOptions::default()
    });
    let r = fit(&d.design(), &o).unwrap();
    let without = fit(&d.with_columns(&[1, 2]).design(), &o).unwrap();
    let (b, w) = (
        r.bootstrap.as_ref().unwrap(),
        without.bootstrap.as_ref().unwrap(),
    );
    assert_eq!(b.replicates, w.replicates);
    for (e, f) in b.estimates.iter().zip(&w.estimates) {
        assert_eq!(e[2], 0.0);
        assert!(
            close(e[0], f[0], 1e-9) && close(e[1], f[1], 1e-9),
            "{e:?} {f:?}"
        );
    }
    for id in [1, 2] {
        let (x, y) = (coef(&r, id), coef(&without, id));
        assert!(close(x.ci_lower.unwrap(), y.ci_lower.unwrap(), 1e-9));
        assert!(close(x.ci_upper.unwrap(), y.ci_upper.unwrap(), 1e-9));
    }
    assert_eq!((coef(&r, 3).ci_lower, coef(&r, 3).ci_upper), (None, None));
}

/// More shapes of a likelihood that increases to infinity, each naming the right covariate:
/// a Poisson covariate whose rows have no event; conditional logistic regression where every
/// matched set's case has the largest x; SCCS with every event in an exposed interval; Cox
/// with Efron ties; a penalized Cox fit whose `exclude`d treatment has a monotone likelihood;
/// the classic coordinate-descent rule.
#[test]
fn more_divergence_shapes() {
    let mut rng = Rng::new(21);
    // Poisson: x = 1 rows never have an event → β_x → −∞.
    let n = 60;
    let x: Vec<f64> = (0..n).map(|i| f64::from(u8::from(i % 5 == 0))).collect();
    let z: Vec<f64> = (0..n).map(|_| rng.normal()).collect();
    let y: Vec<f64> = (0..n)
        .map(|i| {
            if x[i] == 1.0 {
                0.0
            } else {
                rng.poisson((0.5 + 0.3 * z[i]).exp()) as f64
            }
        })
        .collect();
    let d = Data::new(vec![1.0; n], y, vec![(1, "x", x), (2, "z", z.clone())]);
    let r = fit(&d.design(), &opts(ModelKind::Poisson)).unwrap();
    assert_diverging(
        &r,
        &["x (covariate 1) → −∞"],
        &["z (covariate 2)", "(Intercept)"],
    );
    // Conditional logistic: 15 matched sets of 4; the case always has the largest x.
    let mut d = Data::new(vec![1.0; 60], vec![0.0; 60], vec![]);
    let mut xs = vec![0.0; 60];
    let mut ws = vec![0.0; 60];
    for s in 0..15 {
        for k in 0..4 {
            let i = s * 4 + k;
            xs[i] = if k == 0 {
                5.0 + rng.uniform()
            } else {
                rng.uniform() * 4.0
            };
            ws[i] = rng.normal();
        }
        d.y[s * 4] = 1.0;
    }
    d.stratum = Some((0..60).map(|i| (i / 4) as i64).collect());
    d.cols = vec![(1, "x", xs), (2, "w", ws)];
    let r = fit(&d.design(), &opts(ModelKind::ConditionalLogistic)).unwrap();
    assert_diverging(&r, &["x (covariate 1) → +∞"], &[]);
    // SCCS: every case's events fall in its exposed interval.
    let mut time = Vec::new();
    let mut y = Vec::new();
    let mut exposed = Vec::new();
    let mut case = Vec::new();
    for c in 0..12 {
        for (t, e, k) in [(100.0, 0.0, 0.0), (30.0, 1.0, 1.0 + (c % 3) as f64)] {
            time.push(t);
            exposed.push(e);
            y.push(k);
            case.push(c as i64);
        }
    }
    let mut d = Data::new(time, y, vec![(1000, "drug", exposed)]);
    d.stratum = Some(case);
    let r = fit(&d.design(), &opts(ModelKind::ConditionalPoisson)).unwrap();
    assert_diverging(&r, &["drug (covariate 1000) → +∞"], &[]);
    // Cox, Efron ties, and a penalized fit with the treatment excluded from the penalty.
    let d = monotone_survival(false);
    let mut o = opts(ModelKind::Cox);
    o.ties = epifusion_core::model::Ties::Efron;
    assert_diverging(
        &fit(&d.design(), &o).unwrap(),
        &["x (covariate 1)"],
        &["z (covariate 2)"],
    );
    let mut o = opts(ModelKind::Cox);
    o.prior = Prior::Normal { variance: 0.5 };
    o.exclude = vec![1];
    let r = fit(&d.design(), &o).unwrap();
    assert_diverging(&r, &["x (covariate 1)"], &["z (covariate 2)"]);
    assert!(coef(&r, 2).penalized && coef(&r, 2).estimate != 0.0);
    // The classic objective rule (coordinate descent alone) on logistic separation.
    let x: Vec<f64> = (1..=10).map(f64::from).collect();
    let y: Vec<f64> = x.iter().map(|&v| f64::from(u8::from(v > 5.0))).collect();
    let d = Data::new(vec![1.0; 10], y, vec![(1, "x", x)]);
    let mut o = opts(ModelKind::Logistic);
    o.ccd = CcdOptions::default();
    let r = fit(&d.design(), &o).unwrap();
    assert_diverging(&r, &["x (covariate 1) → +∞"], &[]);
}
