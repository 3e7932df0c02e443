//! Newton–Raphson with step-halving on a block of coefficients.
//!
//! Used by [`crate::model::ccd::fit`] under [`Convergence::Optimality`]: the unpenalized
//! coefficients (all of them in a classical fit; the intercept and the `exclude` ids in a
//! penalized one), when there are at most [`CcdOptions::newton_max_block`] of them, are solved
//! by Newton–Raphson on the likelihood's exact observed information
//! ([`Likelihood::information`]), the other coefficients held fixed. The same iteration
//! *polishes* a small active set (the unpenalized block plus the non-zero Laplace and the
//! Normal-prior coefficients) once coordinate descent has settled which coefficients are zero:
//! with the signs of the non-zero Laplace coefficients fixed the objective is smooth there.
//!
//! One iteration from β on the columns B, with f = LL + log prior, G = ∂f/∂β_B (g_j; g_j − β_j/σ²
//! under a Normal prior; g_j − λ sign β_j under a Laplace prior, β_j ≠ 0) and H = I_BB (+ 1/σ²
//! on the diagonal of Normal-prior coefficients), I the observed information:
//!
//! 1. Δ = H⁻¹G by Cholesky (when H is not positive definite — a column with no information,
//!    collinear columns — by Levenberg–Marquardt: H + μ·max_a(H_aa)·Id with μ = 1e-10, 1e-9, …);
//! 2. the **Newton decrement** δ = √(GᵀH⁻¹G). By Cauchy–Schwarz every coordinate's Newton step
//!    is at most δ standard errors: |Δ_a| ≤ δ·√((H⁻¹)_aa). Trial points are projected: a
//!    Laplace coefficient that would reach or cross zero is set to zero (it leaves the active
//!    set; the next coordinate-descent cycle decides whether it re-enters);
//! 3. if δ ≤ `tolerance` the step Δ is taken (the final *polish*: Newton converges
//!    quadratically, so the returned β is within O(δ²) standard errors of the optimum) and the
//!    block has converged;
//! 4. otherwise the largest t in 1, ½, ¼, … (30 halvings) with f(β + tΔ) ≥ f(β) is taken,
//!    f = LL + log prior: a step that lowers the objective is never accepted. Where the gain
//!    that Newton predicts, δ²(t − t²/2), is below the objective's rounding level
//!    ρ = 1000·ε·(1 + |f|), the objective cannot tell a gain from rounding, and a step that
//!    lowers it by at most ρ is accepted.
//!
//! **Floating-point floor.** A decrement below `tolerance` cannot always be reached in f64
//! (the gradient is a sum of many rounded terms). When δ²/2 ≤ ρ and the last full Newton step
//! did not halve δ, the iteration is at the floor of what f64 resolves: the final step is taken
//! and the block reported converged, as close to the optimum as the arithmetic allows.

use super::ccd::{CcdOptions, Convergence};
use super::prior::{Prior, PriorSet};
use super::Likelihood;

/// Relative rounding level of the objective, in units of ε: ρ = NOISE_ULPS·ε·(1 + |f|).
const NOISE_ULPS: f64 = 1000.0;
/// An approximate-information step that does not reduce the decrement below this fraction of
/// the previous one is recomputed with the exact information.
const APPROXIMATE_RATIO: f64 = 0.5;
/// Largest active set on which a slow approximate step falls back to the exact information
/// (beyond it the exact matrix costs more than the steps it would save).
const EXACT_FALLBACK_MAX: usize = 64;
/// An approximate step reuses the previous step's matrix when that step's decrement was at
/// most this (the coefficients moved by at most this many standard errors). A reused factor
/// whose step does not halve the decrement is replaced by a fresh one ([`APPROXIMATE_RATIO`]),
/// and the stopping rule is the KKT rule at the returned β either way, so the bound trades
/// matrix builds against a few more cheap steps only: at 10 (was 1) the 10-fold auto CV of the
/// DESIGN §10 Cox recipe (`examples/cv_speed.rs`) builds 110 instead of 142 approximate
/// information matrices (the sparse Gram part was half of its time), same selected variance.
const REUSE_BELOW: f64 = 10.0;
/// Most step halvings in one iteration.
const MAX_HALVINGS: usize = 30;
/// Largest active set (unpenalized block plus non-zero / Normal-prior coefficients) that
/// [`crate::model::ccd::fit`] polishes by Newton–Raphson once the zero pattern is stable: the
/// information over k columns costs about k² times a coordinate's gradient, so beyond a few
/// dozen columns coordinate descent cycles are cheaper.
pub(crate) const POLISH_MAX_BLOCK: usize = 32;

/// What one Newton iteration did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum NewtonStep {
    /// The decrement was at most the tolerance (or at the floating-point floor): the final
    /// step was taken.
    Converged,
    /// A (possibly halved) step that does not lower the objective was taken.
    Moved,
    /// No step length increases the objective (or the information could not be factored).
    Stalled,
    /// The gradient or the information is not finite.
    IllConditioned,
}

/// Newton–Raphson state: the columns and decrement of the latest iteration (for the
/// floating-point floor test, which compares iterations on the same columns).
#[derive(Debug, Clone, Default)]
pub(crate) struct Newton {
    last: Option<(Vec<usize>, f64)>,
    /// The Cholesky factor of the latest approximate step's matrix and its columns, reused
    /// by the next approximate step on the same columns when that step was short.
    factor: Option<(Vec<usize>, Vec<f64>)>,
    /// The latest fresh approximate information and its (sorted) columns: after a short step
    /// that set coefficients to zero, the next step uses its rows and columns of the rest.
    /// Kept as its lower triangle, row by row ([`pack_lower`]; the matrices are exactly
    /// symmetric, and one that is not is not kept): half the memory of the full matrix.
    matrix: Option<(Vec<usize>, Vec<f64>)>,
}

/// The state a Newton iteration works on: β, its log-likelihood and objective.
pub(crate) struct Point<'a> {
    pub beta: &'a mut [f64],
    pub ll: &'a mut f64,
    pub obj: &'a mut f64,
}

impl Newton {
    /// One Newton–Raphson iteration (module docs) on the columns `cols` from the likelihood's
    /// current state, which must be at `at.beta`; on return the likelihood is at the (possibly
    /// new) `at.beta`. Laplace-prior columns must be non-zero.
    ///
    /// With `approximate`, the likelihood's cheap upper bound of the information
    /// ([`Likelihood::approximate_information`]) gives the step's direction where it has one
    /// (the gradient and the objective are always exact, and step-halving still never lowers
    /// the objective: an inexact Newton iteration, which converges linearly with a small
    /// ratio). After a short step (decrement ≤ 1) the previous matrix is used again — its
    /// factor on the same columns, its rows and columns when the step set coefficients to
    /// zero. When a step does not halve the decrement the matrix is recomputed (a reused one
    /// from the approximate information, an approximate one from the exact
    /// information up to 64 columns), and unpenalized coefficients are only declared
    /// converged when their own exact decrement (the block's rule) is at most `tolerance`.
    pub fn step(
        &mut self,
        lik: &mut dyn Likelihood,
        priors: &PriorSet,
        cols: &[usize],
        at: Point<'_>,
        tolerance: f64,
        approximate: bool,
    ) -> NewtonStep {
        let g: Vec<f64> = if approximate {
            lik.gradients(cols)
        } else {
            cols.iter().map(|&j| lik.gradient_hessian(j).0).collect()
        };
        if g.iter().any(|v| !v.is_finite()) {
            return NewtonStep::IllConditioned;
        }
        let has_unpenalized = cols.iter().any(|&j| priors.is_unpenalized(j));
        let noise = NOISE_ULPS * f64::EPSILON * (1.0 + at.obj.abs());
        let same_cols = self.last.as_ref().is_some_and(|(c, _)| c == cols);
        let previous = self.last.as_ref().map(|(_, p)| *p);
        // The matrix of the step, cheapest first: the previous approximate step's factor
        // (same columns, and that step was short: the information has hardly changed), a
        // fresh approximate one, the exact information.
        let short = previous.is_some_and(|p| p <= REUSE_BELOW);
        let reusable = self.factor.as_ref().is_some_and(|(c, _)| c == cols) && same_cols && short;
        let sub = if approximate && short && !reusable {
            self.matrix
                .as_ref()
                .and_then(|(c, h)| submatrix(c, h, cols))
        } else {
            None
        };
        let mut source = match (approximate, reusable, sub.is_some()) {
            (false, _, _) => Source::Exact,
            (true, true, _) => Source::Reused,
            (true, false, true) => Source::Submatrix,
            (true, false, false) => Source::Approximate,
        };
        let mut sub = sub;
        if !approximate {
            self.factor = None;
            self.matrix = None;
        }
        let (delta, dec2, dec) = loop {
            let step = match source {
                Source::Reused => {
                    let l = &self.factor.as_ref().expect("reusable").1;
                    let mut g = g.clone();
                    prior_terms(priors, cols, &at, &mut g, None);
                    let delta = cholesky_solve(l, cols.len(), &g);
                    let dec2 = dot(&g, &delta).max(0.0);
                    Some((delta, dec2, None))
                }
                Source::Submatrix => {
                    // This step's factor replaces the previous one: drop that first (one k × k
                    // matrix less at the peak; when the new one cannot be formed the step falls
                    // back to the exact information, which keeps no factor either).
                    self.factor = None;
                    let h = sub.take().expect("submatrix");
                    self.direction(priors, cols, &at, &mut g.clone(), h)
                }
                Source::Approximate | Source::Exact => {
                    let approx = if source == Source::Approximate {
                        self.factor = None;
                        let h = lik.approximate_information(cols);
                        let mut sorted = cols.to_vec();
                        sorted.sort_unstable();
                        self.matrix = match &h {
                            Some(h) if sorted == cols => {
                                pack_lower(h, cols.len()).map(|packed| (sorted, packed))
                            }
                            _ => None,
                        };
                        h
                    } else {
                        None
                    };
                    if approx.is_none() {
                        source = Source::Exact;
                    }
                    let h = approx.unwrap_or_else(|| lik.information(cols));
                    if h.iter().any(|v| !v.is_finite()) {
                        return NewtonStep::IllConditioned;
                    }
                    self.direction(priors, cols, &at, &mut g.clone(), h)
                }
            };
            let Some((delta, dec2, l)) = step else {
                if source != Source::Exact {
                    source = Source::Exact;
                    continue;
                }
                return NewtonStep::Stalled;
            };
            if matches!(source, Source::Approximate | Source::Submatrix) {
                self.factor = l.map(|l| (cols.to_vec(), l));
            }
            let dec = dec2.sqrt();
            if source != Source::Exact {
                let slow = same_cols && previous.is_some_and(|p| dec > APPROXIMATE_RATIO * p);
                if slow && matches!(source, Source::Reused | Source::Submatrix) {
                    source = Source::Approximate;
                    continue;
                }
                if slow && cols.len() <= EXACT_FALLBACK_MAX {
                    source = Source::Exact;
                    continue;
                }
            }
            break (delta, dec2, dec);
        };
        // Unpenalized coefficients are declared converged on their own exact decrement (the
        // block's rule), not on an approximate one.
        let mut may_converge = true;
        if source != Source::Exact && has_unpenalized && (dec <= tolerance || dec2 / 2.0 <= noise) {
            let (idx, block): (Vec<usize>, Vec<usize>) = cols
                .iter()
                .enumerate()
                .filter(|&(_, &j)| priors.is_unpenalized(j))
                .unzip();
            let mut gb: Vec<f64> = idx.iter().map(|&a| g[a]).collect();
            let h = lik.information(&block);
            let exact = self
                .direction(priors, &block, &at, &mut gb, h)
                .map_or(f64::INFINITY, |(_, d2, _)| d2.sqrt());
            may_converge = exact <= tolerance;
        }
        let at_floor = dec2 / 2.0 <= noise
            && same_cols
            && self.last.as_ref().is_some_and(|(_, p)| dec > 0.5 * p);
        self.last = Some((cols.to_vec(), dec));
        let converged = may_converge && (dec <= tolerance || at_floor);
        self.finish(lik, priors, cols, at, delta, dec2, converged)
    }

    /// The Newton direction Δ = H⁻¹G on `cols` and the squared decrement GᵀH⁻¹G, from the
    /// log-likelihood's gradient `g` and information `h` plus the prior's terms; `None` when
    /// the matrix cannot be factored.
    fn direction(
        &self,
        priors: &PriorSet,
        cols: &[usize],
        at: &Point<'_>,
        g: &mut [f64],
        mut h: Vec<f64>,
    ) -> Option<(Vec<f64>, f64, Option<Vec<f64>>)> {
        let k = cols.len();
        prior_terms(priors, cols, at, g, Some(&mut h));
        let l = factor_owned(h, k)?;
        let delta = cholesky_solve(&l, k, g);
        let dec2 = dot(g, &delta).max(0.0);
        Some((delta, dec2, Some(l)))
    }

    /// Take the step (module docs, items 3 and 4).
    #[allow(clippy::too_many_arguments)]
    fn finish(
        &mut self,
        lik: &mut dyn Likelihood,
        priors: &PriorSet,
        cols: &[usize],
        at: Point<'_>,
        delta: Vec<f64>,
        dec2: f64,
        converged: bool,
    ) -> NewtonStep {
        let noise = NOISE_ULPS * f64::EPSILON * (1.0 + at.obj.abs());
        if converged {
            // The polish: below the objective's resolution it cannot be verified; take it
            // unless it visibly lowers the objective. When even that fails, β stays (it is
            // within `tolerance` standard errors).
            try_step(lik, priors, cols, at, &delta, 1.0, |f, f0| f >= f0 - noise);
            return NewtonStep::Converged;
        }
        let mut t = 1.0;
        let Point { beta, ll, obj } = at;
        for _ in 0..=MAX_HALVINGS {
            let predicted = dec2 * (t - t * t / 2.0);
            let accept = |f: f64, f0: f64| f >= f0 || (predicted <= noise && f >= f0 - noise);
            let here = Point {
                beta: &mut *beta,
                ll: &mut *ll,
                obj: &mut *obj,
            };
            if try_step(lik, priors, cols, here, &delta, t, accept) {
                return NewtonStep::Moved;
            }
            t *= 0.5;
        }
        lik.set_beta(beta);
        NewtonStep::Stalled
    }
}

/// Where a Newton step's matrix comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Source {
    /// The previous approximate step's factor.
    Reused,
    /// Rows and columns of the latest approximate information.
    Submatrix,
    /// [`Likelihood::approximate_information`].
    Approximate,
    /// [`Likelihood::information`].
    Exact,
}

/// The lower triangle of the symmetric `k × k` matrix `h`, row by row (entry (a, b), b ≤ a, at
/// a(a + 1)/2 + b); `None` when `h` is not exactly symmetric.
fn pack_lower(h: &[f64], k: usize) -> Option<Vec<f64>> {
    let mut out = Vec::with_capacity(k * (k + 1) / 2);
    for a in 0..k {
        for b in 0..=a {
            if h[a * k + b].to_bits() != h[b * k + a].to_bits() {
                return None;
            }
            out.push(h[a * k + b]);
        }
    }
    Some(out)
}

/// The rows and columns `cols` (full, row-major) of the symmetric matrix whose lower triangle
/// is `packed` ([`pack_lower`], over the sorted columns `of`), when `cols` ⊆ `of`.
fn submatrix(of: &[usize], packed: &[f64], cols: &[usize]) -> Option<Vec<f64>> {
    let idx: Vec<usize> = cols
        .iter()
        .map(|j| of.binary_search(j).ok())
        .collect::<Option<_>>()?;
    let mut out = Vec::with_capacity(cols.len() * cols.len());
    for &a in &idx {
        for &b in &idx {
            let (hi, lo) = (a.max(b), a.min(b));
            out.push(packed[hi * (hi + 1) / 2 + lo]);
        }
    }
    Some(out)
}

/// Add the penalty's first derivative to `g` (and its second to the diagonal of `h`).
fn prior_terms(
    priors: &PriorSet,
    cols: &[usize],
    at: &Point<'_>,
    g: &mut [f64],
    mut h: Option<&mut Vec<f64>>,
) {
    let k = cols.len();
    for (a, &j) in cols.iter().enumerate() {
        match priors.per_coef[j] {
            Prior::None => {}
            Prior::Normal { variance } => {
                g[a] -= at.beta[j] / variance;
                if let Some(h) = h.as_deref_mut() {
                    h[a * k + a] += 1.0 / variance;
                }
            }
            Prior::Laplace { lambda } => {
                debug_assert!(at.beta[j] != 0.0, "Laplace column {j} at zero");
                g[a] -= lambda * at.beta[j].signum();
            }
        }
    }
}

fn dot(a: &[f64], b: &[f64]) -> f64 {
    a.iter().zip(b).map(|(x, y)| x * y).sum()
}

/// Evaluate β + t·Δ on `cols` (a Laplace coefficient that reaches or passes zero is set to
/// zero); keep it when `accept(f_new, f_old)`. The likelihood is left at the accepted point,
/// or back at β.
fn try_step(
    lik: &mut dyn Likelihood,
    priors: &PriorSet,
    cols: &[usize],
    at: Point<'_>,
    delta: &[f64],
    t: f64,
    accept: impl Fn(f64, f64) -> bool,
) -> bool {
    let mut trial = at.beta.to_vec();
    for (a, &j) in cols.iter().enumerate() {
        let b = trial[j];
        trial[j] += t * delta[a];
        if matches!(priors.per_coef[j], Prior::Laplace { .. }) && trial[j] * b.signum() <= 0.0 {
            trial[j] = 0.0;
        }
    }
    lik.set_beta(&trial);
    let ll = lik.log_likelihood();
    let f = ll + priors.log_prior(&trial);
    if f.is_finite() && accept(f, *at.obj) {
        at.beta.copy_from_slice(&trial);
        *at.ll = ll;
        *at.obj = f;
        true
    } else {
        lik.set_beta(at.beta);
        false
    }
}

/// The coefficients that Newton–Raphson solves under `opts`: the free (not `fixed`)
/// unpenalized ones, when the rule is [`Convergence::Optimality`] and there are at most
/// `opts.newton_max_block` of them; otherwise none.
pub(crate) fn block_of(priors: &PriorSet, fixed: Option<&[bool]>, opts: &CcdOptions) -> Vec<usize> {
    if opts.convergence != Convergence::Optimality {
        return Vec::new();
    }
    let cols: Vec<usize> = (0..priors.per_coef.len())
        .filter(|&j| fixed.is_none_or(|f| !f[j]) && priors.is_unpenalized(j))
        .collect();
    if cols.len() <= opts.newton_max_block {
        cols
    } else {
        Vec::new()
    }
}

/// Cholesky factor of `a` (`k×k`, row-major), or of a Levenberg–Marquardt regularization
/// a + μ·max_a(a_aa)·Id (μ = 1e-10 … 1e1) when `a` is not positive definite.
pub(crate) fn factor(a: &[f64], k: usize) -> Option<Vec<f64>> {
    if let Some(l) = cholesky(a, k) {
        return Some(l);
    }
    regularized_factor(a, k)
}

/// [`factor`] of `a`, reusing its storage for the factor when `a` is exactly symmetric (the
/// upper triangle then restores the lower one if `a` is not positive definite): one k × k
/// matrix at a time instead of two. The same factor, bit for bit.
pub(crate) fn factor_owned(mut a: Vec<f64>, k: usize) -> Option<Vec<f64>> {
    let symmetric =
        (0..k).all(|i| (0..i).all(|j| a[i * k + j].to_bits() == a[j * k + i].to_bits()));
    if !symmetric {
        return factor(&a, k);
    }
    let diagonal: Vec<f64> = (0..k).map(|i| a[i * k + i]).collect();
    if cholesky_in_place(&mut a, k) {
        clear_upper(&mut a, k);
        return Some(a);
    }
    for i in 0..k {
        for j in 0..i {
            a[i * k + j] = a[j * k + i];
        }
        a[i * k + i] = diagonal[i];
    }
    regularized_factor(&a, k)
}

/// The Levenberg–Marquardt part of [`factor`].
fn regularized_factor(a: &[f64], k: usize) -> Option<Vec<f64>> {
    let scale = (0..k)
        .map(|i| a[i * k + i].abs())
        .fold(0.0, f64::max)
        .max(f64::MIN_POSITIVE);
    let mut mu = 1e-10;
    while mu <= 10.0 {
        let mut m = a.to_vec();
        for i in 0..k {
            m[i * k + i] += mu * scale;
        }
        if let Some(l) = cholesky(&m, k) {
            return Some(l);
        }
        mu *= 10.0;
    }
    None
}

/// Lower Cholesky factor L (row-major) with a = L Lᵀ, or `None` when `a` is not positive
/// definite. Only the lower triangle of `a` is read.
pub(crate) fn cholesky(a: &[f64], k: usize) -> Option<Vec<f64>> {
    let mut l = a.to_vec();
    if !cholesky_in_place(&mut l, k) {
        return None;
    }
    clear_upper(&mut l, k);
    Some(l)
}

/// Zero the entries above the diagonal.
fn clear_upper(m: &mut [f64], k: usize) {
    for i in 0..k {
        m[i * k + i + 1..(i + 1) * k].fill(0.0);
    }
}

/// Overwrite the lower triangle (with the diagonal) of `m` by the Cholesky factor of the
/// matrix whose lower triangle it holds; false when that matrix is not positive definite
/// (`m`'s lower triangle is then partly overwritten). The upper triangle is neither read nor
/// written. Each entry a_ij is read just before L_ij takes its place, and L_ij depends only on
/// a_ij and the entries of L left of it in rows i and j, all already computed.
fn cholesky_in_place(m: &mut [f64], k: usize) -> bool {
    for i in 0..k {
        let (done, rest) = m.split_at_mut(i * k);
        let li = &mut rest[..k];
        let mut j = 0;
        // Four entries at a time (j a multiple of 4, all left of the diagonal): their dot
        // products share the chunked part of `dot4` (the first j terms) and load row i
        // once; each keeps its own partial sums and tail, so every bit is as `dot4`'s.
        while j + 4 <= i {
            let rows = [0, 1, 2, 3].map(|t| &done[(j + t) * k..(j + t) * k + j]);
            let acc = dot4_chunks_x4(&li[..j], rows);
            for (t, acc) in acc.iter().enumerate() {
                let jt = j + t;
                let mut s = (acc[0] + acc[1]) + (acc[2] + acc[3]);
                for m in j..jt {
                    s += li[m] * done[jt * k + m];
                }
                li[jt] = (li[jt] - s) / done[jt * k + jt];
            }
            j += 4;
        }
        for j in j..=i {
            let s = if j == i {
                li[i] - dot4(&li[..j], &li[..j])
            } else {
                li[j] - dot4(&li[..j], &done[j * k..j * k + j])
            };
            if i == j {
                if !(s > 0.0 && s.is_finite()) {
                    return false;
                }
                li[i] = s.sqrt();
            } else {
                li[j] = s / done[j * k + j];
            }
        }
    }
    true
}

/// The four partial sums of `dot4` (over whole chunks of 4; `x.len()` a multiple of 4) of `x`
/// with each of four rows.
fn dot4_chunks_x4(x: &[f64], rows: [&[f64]; 4]) -> [[f64; 4]; 4] {
    let mut acc = [[0.0f64; 4]; 4];
    let n = x.len() / 4 * 4;
    let (r0, r1, r2, r3) = (&rows[0][..n], &rows[1][..n], &rows[2][..n], &rows[3][..n]);
    for c in (0..n).step_by(4) {
        let xs = &x[c..c + 4];
        for (t, r) in [r0, r1, r2, r3].iter().enumerate() {
            let ys = &r[c..c + 4];
            for l in 0..4 {
                acc[t][l] += xs[l] * ys[l];
            }
        }
    }
    acc
}

/// Σ a_m b_m in four interleaved partial sums (m mod 4), added pairwise, then the tail: a
/// fixed order (the same result on every run and thread count) that the compiler can
/// vectorize, unlike one running sum.
fn dot4(a: &[f64], b: &[f64]) -> f64 {
    let n = a.len().min(b.len());
    let mut acc = [0.0f64; 4];
    let (ca, cb) = (a[..n].chunks_exact(4), b[..n].chunks_exact(4));
    let (ta, tb) = (ca.remainder(), cb.remainder());
    for (x, y) in ca.zip(cb) {
        for l in 0..4 {
            acc[l] += x[l] * y[l];
        }
    }
    let mut s = (acc[0] + acc[1]) + (acc[2] + acc[3]);
    for (x, y) in ta.iter().zip(tb) {
        s += x * y;
    }
    s
}

/// Solve L Lᵀ x = b.
pub(crate) fn cholesky_solve(l: &[f64], k: usize, b: &[f64]) -> Vec<f64> {
    let mut y = b.to_vec();
    for i in 0..k {
        let mut s = y[i];
        for m in 0..i {
            s -= l[i * k + m] * y[m];
        }
        y[i] = s / l[i * k + i];
    }
    for i in (0..k).rev() {
        let mut s = y[i];
        for m in i + 1..k {
            s -= l[m * k + i] * y[m];
        }
        y[i] = s / l[i * k + i];
    }
    y
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Seeded xorshift draws, uniform on [−0.5, 0.5).
    fn uniform(seed: u64) -> impl FnMut() -> f64 {
        let mut state = seed;
        move || {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            (state >> 11) as f64 / (1u64 << 53) as f64 - 0.5
        }
    }

    /// The blocked factorization gives every bit of the plain one (one `dot4` per entry).
    #[test]
    fn blocked_cholesky_is_bit_identical() {
        let plain = |a: &[f64], k: usize| -> Option<Vec<f64>> {
            let mut l = vec![0.0; k * k];
            for i in 0..k {
                for j in 0..=i {
                    let s = a[i * k + j] - dot4(&l[i * k..i * k + j], &l[j * k..j * k + j]);
                    if i == j {
                        if !(s > 0.0 && s.is_finite()) {
                            return None;
                        }
                        l[i * k + i] = s.sqrt();
                    } else {
                        l[i * k + j] = s / l[j * k + j];
                    }
                }
            }
            Some(l)
        };
        let mut unif = uniform(0x2545_F491_4F6C_DD1D);
        for k in (1..=23).chain([64, 97, 130]) {
            // B Bᵀ + diagonal: symmetric positive definite.
            let b: Vec<f64> = (0..k * k).map(|_| unif()).collect();
            let mut a = vec![0.0; k * k];
            for i in 0..k {
                for j in 0..k {
                    a[i * k + j] = (0..k).map(|m| b[i * k + m] * b[j * k + m]).sum::<f64>();
                }
                a[i * k + i] += 0.1;
            }
            let (x, y) = (cholesky(&a, k).unwrap(), plain(&a, k).unwrap());
            let bits = |v: &[f64]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
            assert_eq!(bits(&x), bits(&y), "k = {k}");
            // Not positive definite: both refuse.
            a[(k - 1) * k + k - 1] = -1.0;
            assert!(cholesky(&a, k).is_none() && plain(&a, k).is_none());
        }
    }

    /// Factoring in place gives [`factor`]'s bits: positive definite, regularized (the lower
    /// triangle restored from the upper one) and not symmetric (factored from a copy).
    #[test]
    fn owned_factor_is_the_factor() {
        let mut unif = uniform(0x9E37_79B9_7F4A_7C15);
        let bits = |v: &[f64]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
        for k in [1, 2, 5, 9, 31, 70] {
            // Rank ≤ k/2 + 1 Gram matrices (singular for k > 2) and full-rank ones.
            for rank in [k / 2 + 1, k + 3] {
                let b: Vec<f64> = (0..k * rank).map(|_| unif()).collect();
                let mut a = vec![0.0; k * k];
                for i in 0..k {
                    for j in 0..=i {
                        let v = (0..rank).map(|m| b[i * rank + m] * b[j * rank + m]).sum();
                        a[i * k + j] = v;
                        a[j * k + i] = v;
                    }
                }
                let want = factor(&a, k).map(|l| bits(&l));
                assert_eq!(
                    factor_owned(a.clone(), k).map(|l| bits(&l)),
                    want,
                    "k {k} rank {rank}"
                );
                if k > 1 {
                    // Not symmetric: an upper entry that the factor must not read.
                    a[1] += 1.0;
                    let want = factor(&a, k).map(|l| bits(&l));
                    assert_eq!(
                        factor_owned(a, k).map(|l| bits(&l)),
                        want,
                        "k {k} rank {rank}"
                    );
                }
            }
        }
        // Indefinite beyond any regularization: none, as `factor`.
        let a = vec![1.0, 100.0, 100.0, 1.0];
        assert!(factor(&a, 2).is_none() && factor_owned(a, 2).is_none());
    }

    /// A submatrix of the packed lower triangle is that of the full symmetric matrix; a matrix
    /// that is not symmetric is not packed.
    #[test]
    fn packed_submatrix_is_the_full_one() {
        let k = 7;
        let mut h = vec![0.0; k * k];
        for a in 0..k {
            for b in 0..=a {
                let v = (a * 10 + b) as f64 + 0.25;
                h[a * k + b] = v;
                h[b * k + a] = v;
            }
        }
        let of = [2, 3, 5, 8, 13, 21, 34];
        let packed = pack_lower(&h, k).unwrap();
        assert_eq!(packed.len(), k * (k + 1) / 2);
        let cols = [21, 3, 13, 2];
        let got = submatrix(&of, &packed, &cols).unwrap();
        let idx = [5, 1, 4, 0];
        for (r, &a) in idx.iter().enumerate() {
            for (c, &b) in idx.iter().enumerate() {
                assert_eq!(got[r * 4 + c], h[a * k + b]);
            }
        }
        assert!(submatrix(&of, &packed, &[3, 4]).is_none());
        h[k] += 1.0;
        assert!(pack_lower(&h, k).is_none());
    }

    #[test]
    fn cholesky_solves_and_regularizes() {
        let a = [4.0, 2.0, 2.0, 3.0];
        let l = cholesky(&a, 2).unwrap();
        let x = cholesky_solve(&l, 2, &[2.0, 1.0]);
        // [4 2; 2 3] x = [2, 1] → x = [0.5, 0].
        assert!((x[0] - 0.5).abs() < 1e-15 && x[1].abs() < 1e-15, "{x:?}");
        // Singular (collinear) information: factored after regularization, and the step
        // stays in the range of the matrix.
        let s = [1.0, 1.0, 1.0, 1.0];
        assert!(cholesky(&s, 2).is_none());
        let l = factor(&s, 2).unwrap();
        let x = cholesky_solve(&l, 2, &[1.0, 1.0]);
        assert!(
            (x[0] - x[1]).abs() < 1e-9 && (x[0] - 0.5).abs() < 1e-6,
            "{x:?}"
        );
    }
}
