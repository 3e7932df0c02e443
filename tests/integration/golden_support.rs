//! Shared machinery of the golden-value tests (`golden_cox`, `golden_fine_gray`): a small CSV
//! reader for `tests/data/`, design-matrix construction, the two likelihood backends (the
//! brute-force [`Oracle`] and the fast engine), unpenalized fits through `ccd::fit`, and
//! tolerance checks that follow DESIGN.md §9.
#![allow(dead_code)]

use epifusion::model::ccd::{self, CcdOptions, CcdResult, FitStatus};
use epifusion::model::design::{DesignBuilder, DesignMatrix, OutcomeRecord};
use epifusion::model::inference;
use epifusion::model::prior::{Prior, PriorSet};
use epifusion::model::{cpu_likelihood, Likelihood, LikelihoodOptions, ModelKind, Ties};

use crate::oracle::Oracle;

/// Generate one `#[test]` per case and backend: `<module>::oracle::<case>` (passes now) and
/// `<module>::engine::<case>` (the fast engine; fails until it lands). Each case is a function
/// `fn case(backend: Backend)` in the invoking module.
macro_rules! on_both_backends {
    ($($case:ident),* $(,)?) => {
        mod oracle {
            $( #[test] fn $case() { super::$case(crate::golden_support::Backend::Oracle); } )*
        }
        mod engine {
            $( #[test] fn $case() { super::$case(crate::golden_support::Backend::Engine); } )*
        }
    };
}
pub(crate) use on_both_backends;

/// Which likelihood implementation a golden case runs on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Backend {
    /// `tests/integration/oracle.rs`.
    Oracle,
    /// `epifusion::model::cpu_likelihood`.
    Engine,
}

impl Backend {
    /// Build the likelihood of `kind` on `x`.
    pub fn likelihood(self, kind: ModelKind, x: &DesignMatrix, ties: Ties) -> Box<dyn Likelihood> {
        match self {
            Backend::Oracle => Box::new(Oracle::new(kind, x, ties)),
            Backend::Engine => cpu_likelihood(kind, x, LikelihoodOptions { ties })
                .unwrap_or_else(|e| panic!("engine {kind:?} / {ties:?} likelihood: {e}")),
        }
    }
}

// ---------------------------------------------------------------------------------------------
// CSV

/// A CSV file as strings: header names (quotes removed) and cells (quotes removed; "" = NA).
#[derive(Debug, Clone)]
pub struct Table {
    /// Column names.
    pub names: Vec<String>,
    /// Rows of cells.
    pub rows: Vec<Vec<String>>,
}

fn unquote(s: &str) -> String {
    let s = s.trim();
    s.strip_prefix('"')
        .and_then(|t| t.strip_suffix('"'))
        .unwrap_or(s)
        .to_string()
}

impl Table {
    /// Read `tests/data/<name>` (simple CSV: no embedded commas or newlines in fields).
    pub fn read(name: &str) -> Table {
        let path = format!("{}/tests/data/{name}", env!("CARGO_MANIFEST_DIR"));
        let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{path}: {e}"));
        let mut lines = text.lines().filter(|l| !l.trim().is_empty());
        let names: Vec<String> = lines
            .next()
            .expect("header")
            .split(',')
            .map(unquote)
            .collect();
        let rows: Vec<Vec<String>> = lines
            .map(|l| l.split(',').map(unquote).collect::<Vec<_>>())
            .collect();
        for (i, r) in rows.iter().enumerate() {
            assert_eq!(
                r.len(),
                names.len(),
                "{name}: row {} has {} fields",
                i + 1,
                r.len()
            );
        }
        Table { names, rows }
    }

    fn index(&self, col: &str) -> usize {
        self.names
            .iter()
            .position(|n| n == col)
            .unwrap_or_else(|| panic!("no column {col} in {:?}", self.names))
    }

    /// Numeric column; `None` = NA (empty cell or `NA`).
    pub fn num(&self, col: &str) -> Vec<Option<f64>> {
        let j = self.index(col);
        self.rows
            .iter()
            .map(|r| match r[j].as_str() {
                "" | "NA" => None,
                s => Some(s.parse().unwrap_or_else(|e| panic!("{col}: `{s}`: {e}"))),
            })
            .collect()
    }

    /// String column.
    pub fn str(&self, col: &str) -> Vec<String> {
        let j = self.index(col);
        self.rows.iter().map(|r| r[j].clone()).collect()
    }

    /// Rows where every listed numeric column is present (R's `na.omit` on those columns).
    pub fn complete(&self, cols: &[&str]) -> Vec<bool> {
        let cs: Vec<Vec<Option<f64>>> = cols.iter().map(|c| self.num(c)).collect();
        (0..self.rows.len())
            .map(|i| cs.iter().all(|c| c[i].is_some()))
            .collect()
    }
}

/// Unwrap a column known to be complete on the selected rows.
pub fn pick(v: &[Option<f64>], keep: &[bool]) -> Vec<f64> {
    v.iter()
        .zip(keep)
        .filter(|(_, &k)| k)
        .map(|(x, _)| x.expect("NA in a column that should be complete"))
        .collect()
}

/// Select rows of a plain vector.
pub fn select<T: Clone>(v: &[T], keep: &[bool]) -> Vec<T> {
    v.iter()
        .zip(keep)
        .filter(|(_, &k)| k)
        .map(|(x, _)| x.clone())
        .collect()
}

// ---------------------------------------------------------------------------------------------
// Design matrices

/// Survival data in column form; covariates get ids 1..=p in the given order.
#[derive(Debug, Clone, Default)]
pub struct Survival {
    /// Stop time.
    pub time: Vec<f64>,
    /// Start time of (start, stop] rows.
    pub start: Option<Vec<f64>>,
    /// Outcome (Cox 0/1, Fine–Gray 0/1/2).
    pub y: Vec<f64>,
    /// Stratum ids.
    pub stratum: Option<Vec<i64>>,
    /// Case weights.
    pub weight: Option<Vec<f64>>,
    /// Supplied Fine–Gray G(T−).
    pub censor_weight: Option<Vec<f64>>,
    /// Covariate columns.
    pub covariates: Vec<Vec<f64>>,
}

impl Survival {
    /// Build the design matrix (every covariate gets a column, even an all-zero one).
    pub fn design(&self) -> DesignMatrix {
        let mut b = DesignBuilder::new();
        for (j, _) in self.covariates.iter().enumerate() {
            b.name_covariate(j as i64 + 1, format!("x{}", j + 1));
        }
        for i in 0..self.time.len() {
            b.push_outcome(OutcomeRecord {
                row_id: i as i64 + 1,
                stratum_id: self.stratum.as_ref().map(|s| s[i]),
                time: Some(self.time[i]),
                y: self.y[i],
                weight: self.weight.as_ref().map(|w| w[i]),
                start_time: self.start.as_ref().map(|s| s[i]),
                offset: None,
                censor_weight: self.censor_weight.as_ref().map(|c| c[i]),
                cluster_id: None,
            });
            for (j, col) in self.covariates.iter().enumerate() {
                b.push_covariate(i as i64 + 1, j as i64 + 1, col[i]);
            }
        }
        b.build().expect("valid design")
    }
}

// ---------------------------------------------------------------------------------------------
// Fits

/// Optimizer settings for golden fits: far tighter than the default so that the optimum is
/// reached to ~1e-10 in β.
pub fn tight() -> CcdOptions {
    CcdOptions {
        tolerance: 1e-14,
        max_iterations: 20_000,
        ..CcdOptions::default()
    }
}

/// An unpenalized fit with what the golden tests compare.
#[derive(Debug, Clone)]
pub struct MlFit {
    /// β̂.
    pub beta: Vec<f64>,
    /// LL(0).
    pub ll0: f64,
    /// LL(β̂).
    pub ll: f64,
    /// Model-based SEs from `inference::standard_errors` at β̂.
    pub se: Vec<f64>,
    /// Full information matrix at β̂ (row-major).
    pub info: Vec<f64>,
    /// Gradient at β̂.
    pub grad: Vec<f64>,
    /// The CCD result.
    pub ccd: CcdResult,
}

/// Maximum-likelihood fit of `lik` by `ccd::fit` from β = 0 with no prior (tolerance 1e-14),
/// which must converge to within 1e-5 standard errors of the optimum (|g_j|·se_j < 1e-5).
/// Cyclic coordinate descent converges only linearly, so the result is then polished by full
/// Newton steps with the likelihood's own information matrix until |g_j|·se_j < 1e-11, so that
/// the golden comparisons test the likelihood, not the optimizer's stopping rule.
pub fn fit_ml(lik: &mut dyn Likelihood) -> MlFit {
    let p = lik.n_coef();
    let zero = vec![0.0; p];
    lik.set_beta(&zero);
    let ll0 = lik.log_likelihood();
    let priors = PriorSet::new(Prior::None, &vec![false; p]);
    let r = ccd::fit(lik, &priors, &zero, None, &tight()).expect("ccd::fit");
    assert_eq!(r.status, FitStatus::Converged, "{r:?}");
    let all: Vec<usize> = (0..p).collect();
    let mut beta = r.beta.clone();
    let mut newton_steps = 0;
    loop {
        lik.set_beta(&beta);
        let grad: Vec<f64> = (0..p).map(|j| lik.gradient_hessian(j).0).collect();
        let info = lik.information(&all);
        let inv = inference::invert_spd(&info, p).expect("information is positive definite");
        let worst = (0..p)
            .map(|j| (grad[j] * inv[j * p + j].sqrt()).abs())
            .fold(0.0, f64::max);
        if newton_steps == 0 {
            assert!(
                worst < 1e-5,
                "ccd::fit stopped {worst:.2e} SE-units from the optimum"
            );
        }
        if worst < 1e-11 {
            let ll = lik.log_likelihood();
            let se = inference::standard_errors(lik, &all)
                .into_iter()
                .map(|s| s.expect("information is positive definite"))
                .collect();
            return MlFit {
                beta,
                ll0,
                ll,
                se,
                info,
                grad,
                ccd: r,
            };
        }
        assert!(
            newton_steps < 20,
            "Newton polish did not converge ({worst:.2e})"
        );
        for a in 0..p {
            beta[a] += (0..p).map(|b| inv[a * p + b] * grad[b]).sum::<f64>();
        }
        newton_steps += 1;
    }
}

// ---------------------------------------------------------------------------------------------
// Tolerances (DESIGN.md §9)

/// Tolerance for a reference number written as `expected`: 1e-6 relative, or half a unit of
/// its last printed digit when the reference prints fewer digits than that.
pub fn tolerance(expected: &str) -> f64 {
    let v: f64 = expected.parse().expect("numeric reference");
    let decimals = expected.split_once('.').map_or(0, |(_, frac)| {
        frac.trim_end_matches(|c: char| !c.is_ascii_digit()).len()
    });
    let half_unit = 0.5 * 10f64.powi(-(decimals as i32));
    (1e-6 * v.abs()).max(half_unit * (1.0 + 1e-9))
}

/// Assert `got` matches the reference number `expected` (given as printed) within
/// [`tolerance`].
#[track_caller]
pub fn assert_ref(what: &str, got: f64, expected: &str) {
    let v: f64 = expected.parse().expect("numeric reference");
    let tol = tolerance(expected);
    assert!(
        (got - v).abs() <= tol,
        "{what}: got {got:.10}, reference {expected} (|diff| {:.3e} > tol {tol:.3e})",
        (got - v).abs()
    );
}

/// Assert with an explicit absolute tolerance.
#[track_caller]
pub fn assert_abs(what: &str, got: f64, expected: f64, tol: f64) {
    assert!(
        (got - expected).abs() <= tol,
        "{what}: got {got:.12}, expected {expected:.12} (|diff| {:.3e} > {tol:.1e})",
        (got - expected).abs()
    );
}

/// Assert a slice of estimates against references.
#[track_caller]
pub fn assert_refs(what: &str, got: &[f64], expected: &[&str]) {
    assert_eq!(got.len(), expected.len(), "{what}: length");
    for (j, (&g, e)) in got.iter().zip(expected).enumerate() {
        assert_ref(&format!("{what}[{j}]"), g, e);
    }
}

// ---------------------------------------------------------------------------------------------
// Penalized fits: KKT conditions and the objective trace

/// Fit with a Laplace prior of rate `lambda` on every coefficient and check the optimality
/// conditions with `check` (the likelihood whose gradient is trusted, e.g. the oracle) and the
/// monotone objective trace. Returns β̂.
pub fn laplace_fit_and_check(
    lik: &mut dyn Likelihood,
    check: &mut dyn Likelihood,
    lambda: f64,
) -> Vec<f64> {
    let p = lik.n_coef();
    let priors = PriorSet::new(Prior::Laplace { lambda }, &vec![false; p]);
    let r = ccd::fit(lik, &priors, &vec![0.0; p], None, &tight()).expect("ccd::fit");
    assert_eq!(r.status, FitStatus::Converged, "{r:?}");
    for w in r.objective_trace.windows(2) {
        assert!(
            w[1] >= w[0] - 1e-9 * w[0].abs().max(1.0),
            "objective decreased: {} → {}",
            w[0],
            w[1]
        );
    }
    check.set_beta(&r.beta);
    let tol = 1e-6 * lambda.max(1.0);
    for j in 0..p {
        let (g, _) = check.gradient_hessian(j);
        if r.beta[j] == 0.0 {
            assert!(
                g.abs() <= lambda * (1.0 + 1e-6),
                "KKT at zero: |g[{j}]| = {} > λ = {lambda}",
                g.abs()
            );
        } else {
            let s = r.beta[j].signum();
            assert!(
                (g - lambda * s).abs() <= tol,
                "KKT: g[{j}] = {g}, λ·sign β = {} (β = {})",
                lambda * s,
                r.beta[j]
            );
        }
    }
    r.beta
}

/// Compare a likelihood's value, coordinate derivatives and information against the oracle at
/// `beta` (relative 1e-9): the engine-versus-oracle agreement check.
#[track_caller]
pub fn assert_agrees_with_oracle(
    lik: &mut dyn Likelihood,
    oracle: &mut dyn Likelihood,
    beta: &[f64],
    what: &str,
) {
    let close = |a: f64, b: f64| (a - b).abs() <= 1e-9 * (1.0 + a.abs().max(b.abs()));
    lik.set_beta(beta);
    oracle.set_beta(beta);
    let (l, o) = (lik.log_likelihood(), oracle.log_likelihood());
    assert!(close(l, o), "{what}: LL {l} vs oracle {o}");
    let p = beta.len();
    for j in 0..p {
        let (g, h) = lik.gradient_hessian(j);
        let (go, ho) = oracle.gradient_hessian(j);
        assert!(close(g, go), "{what}: g[{j}] {g} vs oracle {go}");
        assert!(close(h, ho), "{what}: h[{j}] {h} vs oracle {ho}");
    }
    let all: Vec<usize> = (0..p).collect();
    let (i, io) = (lik.information(&all), oracle.information(&all));
    for k in 0..p * p {
        assert!(
            close(i[k], io[k]),
            "{what}: information[{k}] {} vs oracle {}",
            i[k],
            io[k]
        );
    }
    // Incremental update lands on the same state as set_beta.
    if p > 0 {
        lik.set_beta(beta);
        lik.update(0, 0.05);
        let mut b = beta.to_vec();
        b[0] += 0.05;
        oracle.set_beta(&b);
        let (l, o) = (lik.log_likelihood(), oracle.log_likelihood());
        assert!(close(l, o), "{what}: LL after update {l} vs oracle {o}");
    }
}

// ---------------------------------------------------------------------------------------------
// Seeded random designs for engine-versus-oracle checks

/// SplitMix64: a tiny seeded generator (no dependency).
#[derive(Debug, Clone)]
pub struct SplitMix(pub u64);

impl SplitMix {
    /// Next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
    /// Uniform in [0, 1).
    pub fn unif(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }
    /// Uniform integer in 0..n.
    pub fn below(&mut self, n: u64) -> u64 {
        self.next_u64() % n
    }
}

/// A random survival data set with heavy ties (integer times 1..=12), up to 3 strata,
/// optional case weights, optional (start, stop] rows (Cox only) and, for Fine–Gray,
/// y ∈ {0, 1, 2}; covariates: a 0/1 indicator, a sparse continuous and a dense column.
pub fn random_survival(rng: &mut SplitMix, fine_gray: bool) -> Survival {
    let n = 20 + rng.below(60) as usize;
    let strata = 1 + rng.below(3) as i64;
    let weighted = rng.below(2) == 1;
    let counting = !fine_gray && rng.below(2) == 1;
    let mut d = Survival {
        start: counting.then(Vec::new),
        stratum: (strata > 1).then(Vec::new),
        weight: weighted.then(Vec::new),
        covariates: vec![Vec::new(); 3],
        ..Default::default()
    };
    for _ in 0..n {
        let time = 1.0 + rng.below(12) as f64;
        d.time.push(time);
        let u = rng.unif();
        d.y.push(if u < 0.45 {
            1.0
        } else if fine_gray && u < 0.7 {
            2.0
        } else {
            0.0
        });
        if let Some(s) = d.start.as_mut() {
            s.push(if rng.below(3) == 0 {
                rng.below(time as u64) as f64
            } else {
                0.0
            });
        }
        if let Some(s) = d.stratum.as_mut() {
            s.push(rng.below(strata as u64) as i64 * 7 - 3);
        }
        if let Some(w) = d.weight.as_mut() {
            w.push([0.5, 1.0, 2.0, 3.0][rng.below(4) as usize]);
        }
        d.covariates[0].push(rng.below(2) as f64);
        d.covariates[1].push(if rng.below(3) == 0 {
            4.0 * rng.unif() - 2.0
        } else {
            0.0
        });
        d.covariates[2].push(rng.unif() * 3.0 - 1.0);
    }
    d
}
