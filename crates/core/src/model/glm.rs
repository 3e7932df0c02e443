//! Logistic, Poisson and conditional logistic regression (propensity scores, matched designs).
//!
//! η_k = x_kᵀβ + offset_k, w_k = row weight (1 when absent). The intercept is **not** added
//! here: the caller adds a dense column of ones with
//! [`DesignMatrix::with_intercept`](super::design::DesignMatrix::with_intercept) for logistic
//! and Poisson regression.
//!
//! | model | log-likelihood reported | constants left out |
//! |---|---|---|
//! | [`Logistic`] | Σ w [y η − log(1 + e^η)] | none |
//! | [`Poisson`] | Σ w [y η − t e^η] (mean μ = t·e^η: log(time) offset) | Σ w [y log t − log y!] |
//! | [`ConditionalLogistic`] | Σ y η − Σ_s n_s log Σ_{k∈s} e^{η_k} (strata = matched sets) | none for one case per set |
//!
//! Gradient and curvature per column: logistic g_j = Σ w x (y − p), h_j = Σ w x² p(1 − p);
//! Poisson g_j = Σ w x (y − μ), h_j = Σ w x² μ. Rows are kept internally in row-id order and
//! column sums are formed in fixed chunks added in order, so results depend neither on the
//! input row order nor on the number of threads.

use std::borrow::Cow;

use rayon::prelude::*;

use super::design::{ColumnSource, DesignMatrix};
use super::sccs::{internal_entries, ordered_sum2, ConditionalPoisson, CHUNK_ENTRIES, DROPPED};

use crate::error::{Error, Result};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Family {
    Logistic,
    Poisson,
}

/// A column in internal (row-id) order.
#[derive(Debug, Clone)]
struct GlmColumn {
    pos: Vec<u32>,
    val: Option<Vec<f64>>,
}

impl GlmColumn {
    fn n_chunks(&self) -> usize {
        self.pos.len().div_ceil(CHUNK_ENTRIES)
    }
}

/// [`RowGlm::polish_max_block`]: the largest active set polished by Newton–Raphson.
const GLM_POLISH_MAX_BLOCK: usize = 2048;

/// Shared state of the unconditional GLMs.
#[derive(Debug, Clone)]
struct RowGlm {
    family: Family,
    /// Row weights (internal order), when supplied.
    w: Option<Vec<f64>>,
    y: Vec<f64>,
    /// Poisson time (1 for logistic).
    t: Vec<f64>,
    offset: Option<Vec<f64>>,
    eta: Vec<f64>,
    /// Logistic: p = 1/(1 + e^{−η}); Poisson: μ = t e^η.
    mu: Vec<f64>,
    cols: Vec<GlmColumn>,
    beta: Vec<f64>,
}

impl RowGlm {
    /// [`Likelihood::polish_max_block`]: the information over k columns costs one pass over
    /// their entries plus Σ_rows a_r² for a_r active entries in row r ([`RowGlm::information`]),
    /// about a coordinate-descent cycle over the same columns; its k³/3 factorization is the
    /// limit. Above 32 this turns on [`crate::model::ccd`]'s active-set Newton, which needs a
    /// few Newton steps where coordinate descent needs tens to hundreds of cycles at a tight
    /// tolerance (createPs' 2e-7: 100 cycles → 9 iterations on a 90,000 × 12,000 propensity
    /// model with 120 non-zero coefficients, `examples/ps_speed.rs`).
    fn polish_max_block(&self) -> usize {
        GLM_POLISH_MAX_BLOCK
    }

    /// The gradients one coordinate at a time ([`Likelihood::gradients`]).
    fn gradients(&mut self, cols: &[usize]) -> Vec<f64> {
        cols.iter().map(|&j| self.gradient_hessian(j).0).collect()
    }

    /// The curvatures one coordinate at a time ([`Likelihood::gradient_hessians`]).
    fn gradient_hessians(&mut self, cols: &[usize]) -> Vec<(f64, f64)> {
        cols.iter().map(|&j| self.gradient_hessian(j)).collect()
    }

    /// No scratch kept ([`Likelihood::release_scratch`]).
    fn release_scratch(&mut self) {}

    /// None ([`Likelihood::approximate_information`]): the active-set Newton steps on the exact
    /// information, which is cheap here. (Returning it as its own upper bound, so that
    /// factors are reused after short steps, took 16–29 iterations instead of 9–11 on the
    /// `ps_speed` example at N = 1e6, for about 10 % less time: not worth the less regular
    /// convergence.)
    fn approximate_information(&mut self, _cols: &[usize]) -> Option<Vec<f64>> {
        None
    }

    fn new(x: &DesignMatrix, cols: ColumnSource<'_>, family: Family) -> Result<Self> {
        let r = &x.rows;
        let row_time = r.time.as_f64();
        let row_y = r.y.as_f64();
        let row_ids = r.row_id.as_i64();
        let n = x.n_rows();
        for i in 0..n {
            let (y, t) = (row_y[i], row_time[i]);
            let message = match family {
                Family::Logistic if !(0.0..=1.0).contains(&y) => {
                    Some(("y", format!("must be 0 or 1 for logistic (got {y})")))
                }
                Family::Poisson if !(y >= 0.0 && y.is_finite()) => {
                    Some(("y", format!("must be a count ≥ 0 for poisson (got {y})")))
                }
                Family::Poisson if !(t > 0.0 && t.is_finite()) => {
                    Some(("time", format!("must be > 0 for poisson (got {t})")))
                }
                _ => None,
            };
            if let Some((column, message)) = message {
                return Err(Error::BadValue {
                    row: i,
                    row_id: row_ids[i],
                    column: column.into(),
                    message,
                });
            }
        }
        let mut order: Vec<u32> = (0..n as u32).collect();
        order.sort_unstable_by_key(|&i| row_ids[i as usize]);
        let mut pos_of_row = vec![DROPPED; n];
        for (p, &i) in order.iter().enumerate() {
            pos_of_row[i as usize] = p as u32;
        }
        let permute = |v: &[f64]| order.iter().map(|&i| v[i as usize]).collect::<Vec<f64>>();
        let cols = cols.map(|c| {
            let (pos, val) = internal_entries(Cow::Borrowed(c), |i| pos_of_row[i]);
            GlmColumn { pos, val }
        });
        let mut me = RowGlm {
            family,
            w: r.weight.as_deref().map(permute),
            y: permute(&r.y.as_f64()),
            t: match family {
                Family::Logistic => vec![1.0; n],
                Family::Poisson => permute(&r.time.as_f64()),
            },
            offset: r.offset.as_deref().map(permute),
            eta: vec![0.0; n],
            mu: vec![0.0; n],
            beta: vec![0.0; cols.len()],
            cols,
        };
        let beta = me.beta.clone();
        me.set_beta(&beta);
        Ok(me)
    }

    #[inline]
    fn mean(family: Family, eta: f64, t: f64) -> f64 {
        match family {
            Family::Logistic => 1.0 / (1.0 + (-eta).exp()),
            Family::Poisson => t * eta.exp(),
        }
    }

    #[inline]
    fn variance(family: Family, mu: f64) -> f64 {
        match family {
            Family::Logistic => mu * (1.0 - mu),
            Family::Poisson => mu,
        }
    }

    #[inline]
    fn weight(&self, p: usize) -> f64 {
        self.w.as_ref().map_or(1.0, |w| w[p])
    }

    fn n_coef(&self) -> usize {
        self.beta.len()
    }

    fn set_beta(&mut self, beta: &[f64]) {
        assert_eq!(beta.len(), self.cols.len(), "beta has the wrong length");
        self.beta.copy_from_slice(beta);
        match &self.offset {
            Some(o) => self.eta.copy_from_slice(o),
            None => self.eta.fill(0.0),
        }
        for (col, &b) in self.cols.iter().zip(beta) {
            if b == 0.0 {
                continue;
            }
            match &col.val {
                None => col.pos.iter().for_each(|&p| self.eta[p as usize] += b),
                Some(v) => {
                    for (&p, &x) in col.pos.iter().zip(v) {
                        self.eta[p as usize] += b * x;
                    }
                }
            }
        }
        let family = self.family;
        self.mu
            .par_iter_mut()
            .with_min_len(4096)
            .zip(self.eta.par_iter().zip(self.t.par_iter()))
            .for_each(|(m, (&e, &t))| *m = Self::mean(family, e, t));
    }

    fn log_likelihood(&self) -> f64 {
        let n = self.y.len();
        let blocks = n.div_ceil(CHUNK_ENTRIES);
        ordered_sum2(blocks, |c| {
            let mut s = 0.0;
            for p in c * CHUNK_ENTRIES..((c + 1) * CHUNK_ENTRIES).min(n) {
                let (y, eta) = (self.y[p], self.eta[p]);
                let term = match self.family {
                    // log(1 + e^η) from p = 1/(1 + e^{−η}) with one logarithm and without
                    // overflow: η − ln p for η > 0 (p ≥ ½), −ln(1 − p) otherwise.
                    Family::Logistic => {
                        let p_k = self.mu[p];
                        y * eta
                            - if eta > 0.0 {
                                eta - p_k.ln()
                            } else {
                                -(-p_k).ln_1p()
                            }
                    }
                    Family::Poisson => y * eta - self.mu[p],
                };
                s += self.weight(p) * term;
            }
            (s, 0.0)
        })
        .0
    }

    fn gradient_hessian(&self, j: usize) -> (f64, f64) {
        let col = &self.cols[j];
        let family = self.family;
        ordered_sum2(col.n_chunks(), |c| {
            let range = c * CHUNK_ENTRIES..((c + 1) * CHUNK_ENTRIES).min(col.pos.len());
            let (mut g, mut h) = (0.0, 0.0);
            for e in range {
                let p = col.pos[e] as usize;
                let x = col.val.as_ref().map_or(1.0, |v| v[e]);
                let wx = self.weight(p) * x;
                let mu = self.mu[p];
                g += wx * (self.y[p] - mu);
                h += wx * x * Self::variance(family, mu);
            }
            (g, h)
        })
    }

    fn update(&mut self, j: usize, delta: f64) {
        if delta == 0.0 {
            return;
        }
        self.beta[j] += delta;
        let col = &self.cols[j];
        for (e, &p) in col.pos.iter().enumerate() {
            let p = p as usize;
            let x = col.val.as_ref().map_or(1.0, |v| v[e]);
            self.eta[p] += delta * x;
            self.mu[p] = Self::mean(self.family, self.eta[p], self.t[p]);
        }
    }

    /// The observed information over `cols`, Σ_r w_r v(μ_r) x_r x_rᵀ, as its lower triangle
    /// packed row by row (entry (a, b), b ≤ a, at a(a + 1)/2 + b), summed row by row in
    /// increasing row order (then column order within a row): the entries of `cols` are
    /// bucketed by row (a counting sort, O(N + nnz)), then each row adds its a_r(a_r + 1)/2
    /// products.
    fn information_packed(&self, cols: &[usize]) -> Vec<f64> {
        let k = cols.len();
        let n = self.y.len();
        let mut info = vec![0.0; k * (k + 1) / 2];
        let mut start = vec![0u32; n + 1];
        for &j in cols {
            for &p in &self.cols[j].pos {
                start[p as usize + 1] += 1;
            }
        }
        for p in 0..n {
            start[p + 1] += start[p];
        }
        let total = start[n] as usize;
        let mut next = start.clone();
        let mut entries: Vec<(u32, f64)> = vec![(0, 0.0); total];
        for (a, &j) in cols.iter().enumerate() {
            let col = &self.cols[j];
            for (e, &p) in col.pos.iter().enumerate() {
                let slot = &mut next[p as usize];
                entries[*slot as usize] = (a as u32, col.val.as_ref().map_or(1.0, |v| v[e]));
                *slot += 1;
            }
        }
        drop(next);
        for p in 0..n {
            let row = &entries[start[p] as usize..start[p + 1] as usize];
            if row.is_empty() {
                continue;
            }
            let wv = self.weight(p) * Self::variance(self.family, self.mu[p]);
            for (q, &(a, va)) in row.iter().enumerate() {
                let wva = wv * va;
                let a = a as usize;
                let info_a = &mut info[a * (a + 1) / 2..];
                for &(b, vb) in &row[..=q] {
                    info_a[b as usize] += wva * vb;
                }
            }
        }
        info
    }

    /// [`RowGlm::information_packed`] as the full row-major matrix.
    fn information(&self, cols: &[usize]) -> Vec<f64> {
        let k = cols.len();
        let packed = self.information_packed(cols);
        let mut info = vec![0.0; k * k];
        for a in 0..k {
            for b in 0..=a {
                let v = packed[a * (a + 1) / 2 + b];
                info[a * k + b] = v;
                info[b * k + a] = v;
            }
        }
        info
    }
}

/// Logistic regression: LL = Σ w [y η − log(1 + e^η)], y ∈ {0, 1} (values in [0, 1] accepted).
#[derive(Debug, Clone)]
pub struct Logistic(RowGlm);

impl Logistic {
    /// Build from a design matrix (add the intercept column first if wanted).
    pub fn new(x: &DesignMatrix) -> Result<Self> {
        Self::from_columns(x, x.column_source())
    }

    /// [`Logistic::new`] on the rows of `x` and the columns `cols` (`x.columns` is not used).
    pub fn from_columns(x: &DesignMatrix, cols: ColumnSource<'_>) -> Result<Self> {
        RowGlm::new(x, cols, Family::Logistic).map(Logistic)
    }
}

delegate_likelihood!(Logistic, 0);

/// Poisson regression with log(time) offset: y ~ Poisson(t·e^η),
/// LL = Σ w [y η − t e^η] without the constants Σ w [y log t − log y!].
#[derive(Debug, Clone)]
pub struct Poisson(RowGlm);

impl Poisson {
    /// Build from a design matrix (add the intercept column first if wanted).
    pub fn new(x: &DesignMatrix) -> Result<Self> {
        Self::from_columns(x, x.column_source())
    }

    /// [`Poisson::new`] on the rows of `x` and the columns `cols` (`x.columns` is not used).
    pub fn from_columns(x: &DesignMatrix, cols: ColumnSource<'_>) -> Result<Self> {
        RowGlm::new(x, cols, Family::Poisson).map(Poisson)
    }
}

delegate_likelihood!(Poisson, 0);

/// Conditional logistic regression, strata = matched sets: the conditional Poisson likelihood
/// of [`ConditionalPoisson`] with every t = 1,
/// LL = Σ_k y_k η_k − Σ_s n_s log Σ_{k∈s} e^{η_k}.
///
/// Exact for one case per set. Sets with several cases get the Breslow-type approximation, as
/// in Cyclops `clr` (the exact conditional likelihood would sum over all case subsets). Row
/// weights replicate rows within their set; sets without cases are dropped.
#[derive(Debug, Clone)]
pub struct ConditionalLogistic(ConditionalPoisson);

impl ConditionalLogistic {
    /// Build from a design matrix (strata = `rows.stratum`; `time` is ignored).
    pub fn new(x: &DesignMatrix) -> Result<Self> {
        Self::from_columns(x, x.column_source())
    }

    /// [`ConditionalLogistic::new`] on the rows of `x` and the columns `cols`.
    pub fn from_columns(x: &DesignMatrix, cols: ColumnSource<'_>) -> Result<Self> {
        ConditionalPoisson::with_unit_time(x, cols).map(ConditionalLogistic)
    }

    /// [`ConditionalLogistic::new`] consuming the design matrix (less peak memory).
    pub fn from_owned(x: DesignMatrix) -> Result<Self> {
        ConditionalPoisson::with_unit_time_owned(x).map(ConditionalLogistic)
    }
}

delegate_likelihood!(ConditionalLogistic, 0, checkpoint);

#[cfg(test)]
// The dense reference implementations read best with explicit indices.
#[allow(clippy::needless_range_loop)]
mod tests {
    use super::*;
    use crate::model::ccd::{self, CcdOptions, FitStatus};
    use crate::model::design::{DesignBuilder, OutcomeRecord};
    use crate::model::inference::invert_spd;
    use crate::model::prior::{Prior, PriorSet};
    use crate::model::Likelihood;

    struct Rng(u64);
    impl Rng {
        fn unif(&mut self) -> f64 {
            self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
            let mut z = self.0;
            z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
            ((z ^ (z >> 31)) >> 11) as f64 / (1u64 << 53) as f64
        }
    }

    /// Random data: 3 covariates (0/1, 0/1, real), weights, offsets; y from the model.
    fn data(family: Family, n: usize, seed: u64, weighted: bool) -> DesignMatrix {
        let mut rng = Rng(seed);
        let mut b = DesignBuilder::new();
        for i in 0..n {
            let x1 = f64::from(rng.unif() < 0.4);
            let x2 = f64::from(rng.unif() < 0.3);
            let x3 = rng.unif() * 2.0 - 1.0;
            let t = 1.0 + (rng.unif() * 5.0).floor();
            let eta = -0.5 + 0.8 * x1 - 0.6 * x2 + 0.5 * x3;
            let y = match family {
                Family::Logistic => f64::from(rng.unif() < 1.0 / (1.0 + (-eta).exp())),
                Family::Poisson => {
                    // Inverse-transform Poisson draw.
                    let lam = t * eta.exp();
                    let (mut k, mut p, u) = (0.0, (-lam).exp(), rng.unif());
                    let mut c = p;
                    while u > c && k < 50.0 {
                        k += 1.0;
                        p *= lam / k;
                        c += p;
                    }
                    k
                }
            };
            let id = (i as i64 * 7919) % 100_003;
            b.push_outcome(OutcomeRecord {
                row_id: id,
                time: Some(t),
                y,
                weight: weighted.then(|| 0.5 + rng.unif()),
                offset: Some(0.1 * (rng.unif() - 0.5)),
                ..Default::default()
            });
            for (c, v) in [(1, x1), (2, x2), (3, x3)] {
                if v != 0.0 {
                    b.push_covariate(id, c, v);
                }
            }
        }
        b.build().unwrap().with_intercept()
    }

    /// Independent dense Newton–Raphson on the same likelihood (no CCD, no incremental state).
    fn newton(x: &DesignMatrix, family: Family) -> Vec<f64> {
        let n = x.n_rows();
        let p = x.n_cols();
        let dense: Vec<Vec<f64>> = x.columns.iter().map(|c| c.to_dense(n)).collect();
        let mut beta = vec![0.0; p];
        for _ in 0..100 {
            let mut g = vec![0.0; p];
            let mut hm = vec![0.0; p * p];
            for i in 0..n {
                let eta: f64 = x.offset(i) + (0..p).map(|j| dense[j][i] * beta[j]).sum::<f64>();
                let (mu, v) = match family {
                    Family::Logistic => {
                        let m = 1.0 / (1.0 + (-eta).exp());
                        (m, m * (1.0 - m))
                    }
                    Family::Poisson => {
                        let m = x.rows.time.get(i) * eta.exp();
                        (m, m)
                    }
                };
                let w = x.weight(i);
                for a in 0..p {
                    g[a] += w * dense[a][i] * (x.rows.y.get(i) - mu);
                    for b in 0..p {
                        hm[a * p + b] += w * v * dense[a][i] * dense[b][i];
                    }
                }
            }
            let inv = invert_spd(&hm, p).unwrap();
            let step: Vec<f64> = (0..p)
                .map(|a| (0..p).map(|b| inv[a * p + b] * g[b]).sum())
                .collect();
            for a in 0..p {
                beta[a] += step[a];
            }
            if step.iter().map(|s| s.abs()).fold(0.0, f64::max) < 1e-13 {
                break;
            }
        }
        beta
    }

    fn build(family: Family, x: &DesignMatrix) -> Box<dyn Likelihood> {
        match family {
            Family::Logistic => Box::new(Logistic::new(x).unwrap()),
            Family::Poisson => Box::new(Poisson::new(x).unwrap()),
        }
    }

    fn tight() -> CcdOptions {
        CcdOptions {
            tolerance: 1e-16,
            max_iterations: 100_000,
            ..Default::default()
        }
    }

    #[test]
    fn unpenalized_fit_matches_newton_raphson() {
        for family in [Family::Logistic, Family::Poisson] {
            for weighted in [false, true] {
                let x = data(family, 400, 17, weighted);
                let reference = newton(&x, family);
                let mut lik = build(family, &x);
                let p = lik.n_coef();
                let priors = PriorSet::new(Prior::None, &vec![false; p]);
                let r = ccd::fit(lik.as_mut(), &priors, &vec![0.0; p], None, &tight()).unwrap();
                assert_eq!(r.status, FitStatus::Converged);
                for j in 0..p {
                    let (a, b) = (r.beta[j], reference[j]);
                    assert!(
                        (a - b).abs() < 1e-6 * b.abs().max(1e-3),
                        "{family:?} β{j}: {a} vs {b}"
                    );
                }
                // The information at the optimum inverts to a sane covariance.
                let cols: Vec<usize> = (0..p).collect();
                let info = lik.information(&cols);
                for j in 0..p {
                    let (_, h) = lik.gradient_hessian(j);
                    assert!((info[j * p + j] - h).abs() < 1e-9 * h);
                }
                assert!(invert_spd(&info, p).is_some());
            }
        }
    }

    #[test]
    fn derivatives_match_finite_differences() {
        for family in [Family::Logistic, Family::Poisson] {
            let x = data(family, 200, 5, true);
            let mut lik = build(family, &x);
            let beta = vec![0.1, 0.3, -0.2, 0.4];
            lik.update(1, 0.3);
            lik.update(0, 0.1);
            lik.update(2, -0.2);
            lik.update(3, 0.4);
            let mut fresh = build(family, &x);
            let mut ll = |b: &[f64]| {
                fresh.set_beta(b);
                fresh.log_likelihood()
            };
            assert!((lik.log_likelihood() - ll(&beta)).abs() < 1e-10);
            let eps = 1e-4;
            let info = lik.information(&[0, 1, 2, 3]);
            for j in 0..4 {
                let (g, h) = lik.gradient_hessian(j);
                let mut bp = beta.clone();
                bp[j] += eps;
                let mut bm = beta.clone();
                bm[j] -= eps;
                let g_fd = (ll(&bp) - ll(&bm)) / (2.0 * eps);
                let h_fd = -(ll(&bp) - 2.0 * ll(&beta) + ll(&bm)) / (eps * eps);
                assert!((g - g_fd).abs() < 1e-6 * g.abs().max(1.0), "{g} {g_fd}");
                assert!((h - h_fd).abs() < 1e-4 * h.abs().max(1.0), "{h} {h_fd}");
                for k in 0..4 {
                    let mut bpk = bp.clone();
                    bpk[k] += eps;
                    let mut bmk = bm.clone();
                    bmk[k] += eps;
                    let gk_p = (ll(&bpk) - ll(&bp)) / eps;
                    let gk_m = (ll(&bmk) - ll(&bm)) / eps;
                    let fd = -(gk_p - gk_m) / (2.0 * eps);
                    assert!((info[j * 4 + k] - fd).abs() < 1e-3 * fd.abs().max(1.0));
                }
            }
        }
    }

    /// 60 sparse columns (0/1 and real values) plus the intercept, weights and offsets.
    fn wide(family: Family, n: usize, seed: u64) -> DesignMatrix {
        let mut rng = Rng(seed);
        let mut b = DesignBuilder::new();
        for i in 0..n {
            let mut eta = -0.3;
            let mut entries = Vec::new();
            for c in 1..=60i64 {
                if rng.unif() < 0.15 {
                    let v = if c % 3 == 0 {
                        rng.unif() * 2.0 - 1.0
                    } else {
                        1.0
                    };
                    eta += v * 0.4 * (((c * 37) % 11) as f64 / 5.0 - 1.0);
                    entries.push((c, v));
                }
            }
            let t = 1.0 + (rng.unif() * 3.0).floor();
            let y = match family {
                Family::Logistic => f64::from(rng.unif() < 1.0 / (1.0 + (-eta).exp())),
                Family::Poisson => {
                    f64::from(rng.unif() < 0.5 * t * eta.exp() / 4.0) + f64::from(rng.unif() < 0.2)
                }
            };
            b.push_outcome(OutcomeRecord {
                row_id: i as i64,
                time: Some(t),
                y,
                weight: Some(0.5 + rng.unif()),
                offset: Some(0.1 * (rng.unif() - 0.5)),
                ..Default::default()
            });
            for (c, v) in entries {
                b.push_covariate(i as i64, c, v);
            }
        }
        b.build().unwrap().with_intercept()
    }

    /// The information over many columns (any order) is the dense Σ_r w_r v_r x_r x_rᵀ, and
    /// exactly symmetric.
    #[test]
    fn wide_information_is_the_dense_sum() {
        for family in [Family::Logistic, Family::Poisson] {
            let x = wide(family, 300, 3);
            let mut lik = build(family, &x);
            let p = lik.n_coef();
            for j in 0..p {
                lik.update(j, 0.01 * ((j % 7) as f64 - 3.0));
            }
            let cols: Vec<usize> = (0..p).rev().step_by(2).chain([1, 4]).collect();
            let info = lik.information(&cols);
            let k = cols.len();
            let n = x.n_rows();
            let dense: Vec<Vec<f64>> = x.columns.iter().map(|c| c.to_dense(n)).collect();
            let mut eta = vec![0.0; n];
            let beta: Vec<f64> = (0..p).map(|j| 0.01 * ((j % 7) as f64 - 3.0)).collect();
            for i in 0..n {
                eta[i] = x.offset(i) + (0..p).map(|j| dense[j][i] * beta[j]).sum::<f64>();
            }
            for (a, &ja) in cols.iter().enumerate() {
                for (b, &jb) in cols.iter().enumerate() {
                    let mut s = 0.0;
                    for i in 0..n {
                        let v = match family {
                            Family::Logistic => {
                                let m = 1.0 / (1.0 + (-eta[i]).exp());
                                m * (1.0 - m)
                            }
                            Family::Poisson => x.rows.time.get(i) * eta[i].exp(),
                        };
                        s += x.weight(i) * v * dense[ja][i] * dense[jb][i];
                    }
                    let got = info[a * k + b];
                    assert!((got - s).abs() <= 1e-10 * s.abs().max(1.0), "{got} vs {s}");
                    assert_eq!(got.to_bits(), info[b * k + a].to_bits());
                }
            }
        }
    }

    /// Logistic and Poisson polish active sets beyond 32 columns by Newton–Raphson
    /// ([`RowGlm::polish_max_block`]): the same optimum as coordinate descent with the classic
    /// polish, converged, KKT met at the default tolerance, bit-identical for 1 and 3 threads.
    #[test]
    fn active_set_newton_reaches_the_classic_optimum() {
        for family in [Family::Logistic, Family::Poisson] {
            for lambda in [0.05, 2.0] {
                let x = wide(family, 800, 11);
                let p = x.n_cols();
                let mut excluded = vec![false; p];
                excluded[0] = true;
                let priors = PriorSet::new(Prior::Laplace { lambda }, &excluded);
                let tight = CcdOptions {
                    tolerance: 1e-10,
                    ..CcdOptions::fit_default()
                };
                let classic = CcdOptions {
                    active_newton: false,
                    ..tight.clone()
                };
                let what = format!("{family:?} λ={lambda}");
                let old = ccd::fit(
                    build(family, &x).as_mut(),
                    &priors,
                    &vec![0.0; p],
                    None,
                    &classic,
                )
                .unwrap();
                let new = ccd::fit(
                    build(family, &x).as_mut(),
                    &priors,
                    &vec![0.0; p],
                    None,
                    &tight,
                )
                .unwrap();
                assert_eq!(old.status, FitStatus::Converged, "{what}");
                assert_eq!(new.status, FitStatus::Converged, "{what}");
                for (a, b) in old.beta.iter().zip(&new.beta) {
                    assert!((a - b).abs() <= 1e-6, "{what}: {a} vs {b}");
                }
                let (fo, fn_) = (
                    old.log_likelihood + old.log_prior,
                    new.log_likelihood + new.log_prior,
                );
                assert!(fn_ >= fo - 1e-9 * fo.abs(), "{what}: {fn_} < {fo}");
                if lambda < 1.0 {
                    let active = new.beta.iter().filter(|b| **b != 0.0).count();
                    assert!(active > 32, "{what}: only {active} active columns");
                }
                let mut bits = Vec::new();
                for threads in [1, 3] {
                    let pool = rayon::ThreadPoolBuilder::new()
                        .num_threads(threads)
                        .build()
                        .unwrap();
                    let mut lik = build(family, &x);
                    let r = pool
                        .install(|| {
                            ccd::fit(
                                lik.as_mut(),
                                &priors,
                                &vec![0.0; p],
                                None,
                                &CcdOptions::fit_default(),
                            )
                        })
                        .unwrap();
                    assert_eq!(r.status, FitStatus::Converged, "{what}");
                    lik.set_beta(&r.beta);
                    for j in 0..p {
                        let (g, h) = lik.gradient_hessian(j);
                        let v = ccd::scaled_violation(priors.per_coef[j], r.beta[j], g, h);
                        assert!(v <= 1e-6, "{what}: coefficient {j} violation {v}");
                    }
                    bits.push(r.beta.iter().map(|b| b.to_bits()).collect::<Vec<_>>());
                }
                assert_eq!(bits[0], bits[1], "{what}: thread count changed the fit");
            }
        }
    }

    /// Two copies of one large-valued column under a Laplace prior: the active-set Newton's
    /// joint matrix (intercept and both copies) is singular and regularized, so its decrement
    /// says little about the intercept. The fit must still meet the intercept's rule
    /// |g| ≤ tol·√I before it says converged (`fuzz_fit_api` seed 1406).
    #[test]
    fn aliased_columns_leave_the_intercept_at_its_optimum() {
        let rows: [(f64, f64, f64, f64); 21] = [
            (4.0, 1.0, 0.5, 310281.6701424991),
            (5.0, 0.0, 1.0, -278095.3768331179),
            (7.0, 0.0, 0.5, -63040.69242353238),
            (7.0, 0.0, 0.5, 330706.98771898256),
            (5.0, 0.0, 2.0, 170945.26160787605),
            (4.0, 0.0, 2.0, -145921.14944845313),
            (8.0, 1.0, 0.5, 206814.902904508),
            (1.0, 0.0, 1.0, 76388.12871330492),
            (5.0, 1.0, 0.0, 55704.187306362284),
            (4.0, 1.0, 2.0, 443006.0546182658),
            (2.0, 0.0, 1.0, 480443.5917343515),
            (6.0, 0.0, 1.0, 239618.93674417477),
            (2.0, 0.0, 1.0, -5764.4947745684185),
            (11.0, 0.0, 0.5, -341039.58514153655),
            (4.0, 1.0, 1.0, 237655.09653670015),
            (10.0, 1.0, 1.0, 284721.98986500676),
            (2.0, 1.0, 0.0, 9452.637309517064),
            (11.0, 0.0, 2.0, -274397.27991191053),
            (4.0, 1.0, 2.0, 165011.64040544291),
            (5.0, 0.0, 0.0, 355454.35995592887),
            (12.0, 0.0, 2.0, 418541.18388566084),
        ];
        let mut b = DesignBuilder::new();
        for (i, &(time, y, w, x)) in rows.iter().enumerate() {
            let r = i as i64 + 1;
            b.push_outcome(OutcomeRecord {
                row_id: r,
                time: Some(time),
                y,
                weight: Some(w),
                ..Default::default()
            });
            b.push_covariate(r, 1, x);
            b.push_covariate(r, 2, x);
        }
        let design = b.build().unwrap();
        let mut opts = crate::fit::FitOptions::new(crate::model::ModelKind::Poisson);
        opts.prior = Prior::Laplace { lambda: 20.0 };
        let r = crate::fit::fit(&design, &opts).unwrap();
        assert_eq!(r.status, FitStatus::Converged);
        let beta: Vec<f64> = r.coefficients.iter().map(|c| c.estimate).collect();
        let mut lik = build(Family::Poisson, &design.with_intercept());
        lik.set_beta(&beta);
        let (g, h) = lik.gradient_hessian(0);
        let tol = opts.ccd.tolerance;
        assert!(g.abs() <= tol * h.sqrt(), "intercept: g = {g}, I = {h}");
    }

    #[test]
    fn laplace_fit_satisfies_kkt() {
        for family in [Family::Logistic, Family::Poisson] {
            for lambda in [0.5, 5.0, 200.0] {
                let x = data(family, 500, 23, false);
                let mut lik = build(family, &x);
                let p = lik.n_coef();
                // Intercept (column 0) unpenalized.
                let mut excluded = vec![false; p];
                excluded[0] = true;
                let priors = PriorSet::new(Prior::Laplace { lambda }, &excluded);
                let r = ccd::fit(lik.as_mut(), &priors, &vec![0.0; p], None, &tight()).unwrap();
                assert_eq!(r.status, FitStatus::Converged);
                lik.set_beta(&r.beta);
                let tol = 1e-6 * lambda.max(1.0);
                for j in 0..p {
                    let (g, _) = lik.gradient_hessian(j);
                    let b = r.beta[j];
                    if j == 0 {
                        assert!(g.abs() < tol, "intercept gradient {g}");
                    } else if b == 0.0 {
                        assert!(
                            g.abs() <= lambda + tol,
                            "{family:?} λ={lambda} j={j}: |{g}| > λ"
                        );
                    } else {
                        assert!(
                            (g - lambda * b.signum()).abs() < tol,
                            "{family:?} λ={lambda} j={j}: {g}"
                        );
                    }
                }
                if lambda == 200.0 {
                    assert!(r.beta[1..].contains(&0.0), "{:?}", r.beta);
                }
            }
        }
    }

    #[test]
    fn conditional_logistic_is_conditional_poisson_with_unit_time() {
        // Matched sets of 1 case + 3 controls; times are arbitrary and must be ignored.
        let mut rng = Rng(8);
        let mut b = DesignBuilder::new();
        for s in 0..50i64 {
            for k in 0..4i64 {
                let id = s * 10 + k;
                b.push_outcome(OutcomeRecord {
                    row_id: id,
                    stratum_id: Some(s),
                    time: Some(1.0 + (rng.unif() * 9.0).floor()),
                    y: f64::from(k == 0),
                    ..Default::default()
                });
                if rng.unif() < 0.5 + 0.2 * f64::from(k == 0) {
                    b.push_covariate(id, 1, 1.0);
                }
                b.push_covariate(id, 2, rng.unif());
            }
        }
        let x = b.build().unwrap();
        let mut clr = ConditionalLogistic::new(&x).unwrap();
        let beta = [0.4, -0.7];
        clr.set_beta(&beta);
        // Direct: Σ_s [η_case − log Σ_k e^{η_k}].
        let dense: Vec<Vec<f64>> = x.columns.iter().map(|c| c.to_dense(x.n_rows())).collect();
        let mut ll = 0.0;
        let mut sums = vec![0.0; 50];
        for i in 0..x.n_rows() {
            let eta = dense[0][i] * beta[0] + dense[1][i] * beta[1];
            sums[x.rows.stratum.get(i) as usize] += eta.exp();
            ll += x.rows.y.get(i) * eta;
        }
        ll -= sums.iter().map(|d| d.ln()).sum::<f64>();
        assert!((clr.log_likelihood() - ll).abs() < 1e-10);
        // It keeps checkpoints as the conditional Poisson it wraps does: a rejected trial
        // point returns the state at β bit for bit.
        let at_beta = clr.log_likelihood();
        assert!(clr.checkpoint());
        clr.set_beta(&[1.5, 0.2]);
        assert_ne!(clr.log_likelihood().to_bits(), at_beta.to_bits());
        clr.end_checkpoint(true);
        assert_eq!(clr.log_likelihood().to_bits(), at_beta.to_bits());
        assert_eq!(clr.gradient_hessian(0).0.to_bits(), {
            let mut fresh = ConditionalLogistic::new(&x).unwrap();
            fresh.set_beta(&beta);
            fresh.gradient_hessian(0).0.to_bits()
        });
        let priors = PriorSet::new(Prior::None, &[false, false]);
        let r = ccd::fit(&mut clr, &priors, &[0.0, 0.0], None, &tight()).unwrap();
        assert_eq!(r.status, FitStatus::Converged);
        for j in 0..2 {
            assert!(clr.gradient_hessian(j).0.abs() < 1e-8);
        }
    }

    #[test]
    fn row_order_and_thread_count_do_not_matter() {
        // 100k rows: several parallel chunks per column.
        let x = data(Family::Logistic, 100_000, 31, true);
        let mut rows: Vec<usize> = (0..x.n_rows()).collect();
        rows.reverse();
        // The same data with the outcome rows in reverse order.
        let mut b = DesignBuilder::new();
        for &i in &rows {
            b.push_outcome(OutcomeRecord {
                row_id: x.rows.row_id.get(i),
                time: Some(x.rows.time.get(i)),
                y: x.rows.y.get(i),
                weight: Some(x.weight(i)),
                offset: Some(x.offset(i)),
                ..Default::default()
            });
        }
        for c in &x.columns[1..] {
            for (i, v) in c.entries() {
                b.push_covariate(x.rows.row_id.get(i), c.id, v);
            }
        }
        let reversed = b.build().unwrap().with_intercept();
        for family in [Family::Logistic, Family::Poisson] {
            let mut results = Vec::new();
            for (threads, design) in [(1, &x), (2, &x), (3, &x), (2, &reversed)] {
                let pool = rayon::ThreadPoolBuilder::new()
                    .num_threads(threads)
                    .build()
                    .unwrap();
                results.push(pool.install(|| {
                    let mut lik = build(family, design);
                    let p = lik.n_coef();
                    let mut excluded = vec![false; p];
                    excluded[0] = true;
                    let priors = PriorSet::new(Prior::Laplace { lambda: 3.0 }, &excluded);
                    let opts = CcdOptions::default();
                    let r = ccd::fit(lik.as_mut(), &priors, &vec![0.0; p], None, &opts).unwrap();
                    let mut bits: Vec<u64> = r.beta.iter().map(|b| b.to_bits()).collect();
                    bits.push(r.log_likelihood.to_bits());
                    bits
                }));
            }
            assert!(results.iter().all(|r| *r == results[0]), "{family:?}");
        }
    }

    #[test]
    fn built_through_cpu_likelihood() {
        use crate::model::{cpu_likelihood, LikelihoodOptions, ModelKind};
        let x = data(Family::Logistic, 50, 2, false);
        for kind in [ModelKind::Logistic, ModelKind::Poisson] {
            let lik = cpu_likelihood(kind, &x, LikelihoodOptions::default()).unwrap();
            assert_eq!(lik.n_coef(), 4);
        }
        let mut b = DesignBuilder::new();
        for i in 0..6i64 {
            b.push_outcome(OutcomeRecord {
                row_id: i,
                stratum_id: Some(i / 2),
                time: Some(2.0),
                y: f64::from(i % 2 == 0),
                ..Default::default()
            });
            b.push_covariate(i, 7, 1.0 + i as f64);
        }
        let x = b.build().unwrap();
        for kind in [
            ModelKind::ConditionalLogistic,
            ModelKind::ConditionalPoisson,
        ] {
            let mut lik = cpu_likelihood(kind, &x, LikelihoodOptions::default()).unwrap();
            assert_eq!(lik.n_coef(), 1);
            // β = 0: each set contributes −log Σ t (t = 1 for conditional logistic).
            let t: f64 = if kind == ModelKind::ConditionalLogistic {
                1.0
            } else {
                2.0
            };
            assert!((lik.log_likelihood() + 3.0 * (2.0 * t).ln()).abs() < 1e-12);
        }
    }

    #[test]
    fn rejects_bad_outcomes() {
        let mut b = DesignBuilder::new();
        b.push_outcome(OutcomeRecord {
            row_id: 1,
            y: 2.0,
            ..Default::default()
        });
        let x = b.build().unwrap();
        assert!(Logistic::new(&x).is_err());
        assert!(Poisson::new(&x).is_ok());
        let mut b = DesignBuilder::new();
        b.push_outcome(OutcomeRecord {
            row_id: 1,
            y: 1.0,
            time: Some(0.0),
            ..Default::default()
        });
        assert!(Poisson::new(&b.build().unwrap()).is_err());
    }
}
