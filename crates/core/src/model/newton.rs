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
/// A short step's matrix is reused on new columns (each bordered by its own curvature alone)
/// when at most 1/`BORDER_FRACTION` of the columns are new. On the DESIGN §10 Cox recipe at
/// N = 1e6 the second polish round gains 205 columns on 332 and still converges with a ratio
/// of about 0.06 per step (the new columns come from a coordinate step, near their own
/// optimum), without a fresh matrix.
const BORDER_FRACTION: usize = 2;
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
    /// by the next approximate step on the same columns when that step was short. Packed row
    /// by row ([`pack_lower`]), as every matrix here: the factor and the matrix below take
    /// one k × k matrix's memory together (the 10-fold auto CV of `examples/cv_speed.rs`
    /// polishes up to about 900 columns in each concurrent fold).
    factor: Option<(Vec<usize>, Vec<f64>)>,
    /// The latest fresh approximate information and its (sorted) columns: after a short step
    /// that set coefficients to zero, the next step uses its rows and columns of the rest.
    /// Kept as its lower triangle, row by row ([`pack_lower`]).
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
    /// ratio). After a short step (decrement ≤ [`REUSE_BELOW`]) the previous matrix is used
    /// again — its factor on the same columns, its rows and columns when the step set
    /// coefficients to zero, bordered by each new column's own curvature when a polish round
    /// gained columns (at most half of them new: [`BORDER_FRACTION`]). When a step does not halve the decrement the matrix is recomputed (a reused one
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
        let same_cols = self.last.as_ref().is_some_and(|(c, _)| c == cols);
        let previous = self.last.as_ref().map(|(_, p)| *p);
        // The matrix of the step, cheapest first: the previous approximate step's factor
        // (same columns, and that step was short: the information has hardly changed), a
        // fresh approximate one, the exact information.
        let short = previous.is_some_and(|p| p <= REUSE_BELOW);
        let reusable = self.factor.as_ref().is_some_and(|(c, _)| c == cols) && same_cols && short;
        // What this step cannot read is dropped before the gradients' row weights and this
        // step's matrix are formed (fewer matrices at the peak; the worker's memory is then
        // the view, the matrices it still needs and the step's own buffers): the previous
        // factor unless it is reused, and the previous matrix unless a short approximate
        // step may take its rows and columns (every other step forms a fresh one).
        if !reusable {
            self.factor = None;
        }
        if !(approximate && short) {
            self.matrix = None;
        }
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
        // Columns the latest approximate matrix lacks (a polish round that gained
        // coefficients): their rows and columns are their own curvature on the diagonal. The
        // bordered matrix (sorted columns) replaces the latest one, so that the next steps
        // take plain submatrices of it.
        let mut border: Vec<(usize, f64)> = Vec::new();
        let sub = if approximate && short && !reusable {
            let bordered = self.matrix.as_ref().and_then(|(c, h)| {
                let missing = cols.iter().filter(|j| c.binary_search(j).is_err());
                if missing.clone().count() > cols.len() / BORDER_FRACTION {
                    return None;
                }
                for &j in missing {
                    let (_, hj) = lik.gradient_hessian(j);
                    if !(hj.is_finite() && hj > 0.0) {
                        return None;
                    }
                    border.push((j, hj));
                }
                submatrix(c, h, cols, &border)
            });
            let sorted = cols.windows(2).all(|w| w[0] < w[1]);
            match bordered {
                Some(h) if !border.is_empty() && sorted => {
                    border.clear();
                    let (_, h) = self.matrix.insert((cols.to_vec(), h));
                    Some(h.clone())
                }
                other => other,
            }
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
                    prior_gradient(priors, cols, &at, &mut g);
                    let delta = solve_rows(l, cols.len(), &g, packed_start);
                    let dec2 = dot(&g, &delta).max(0.0);
                    Some((delta, dec2, None))
                }
                Source::Submatrix => {
                    let h = sub.take().expect("submatrix");
                    let (of, packed) = self.matrix.as_ref().expect("submatrix of the matrix");
                    let again = || submatrix(of, packed, cols, &border).expect("a submatrix");
                    direction(priors, cols, &at, &mut g.clone(), h, again)
                }
                Source::Approximate | Source::Exact => {
                    let approx = if source == Source::Approximate {
                        // Both are replaced: drop them before the new matrix is formed.
                        self.factor = None;
                        self.matrix = None;
                        lik.approximate_information(cols)
                    } else {
                        None
                    };
                    let h = approx.unwrap_or_else(|| {
                        source = Source::Exact;
                        pack_lower(&lik.information(cols), cols.len())
                    });
                    if h.iter().any(|v| !v.is_finite()) {
                        return NewtonStep::IllConditioned;
                    }
                    let sorted = cols.windows(2).all(|w| w[0] <= w[1]);
                    if source == Source::Approximate && sorted {
                        // Kept for the next steps' submatrices; its copy is factored.
                        let (_, h) = self.matrix.insert((cols.to_vec(), h));
                        let h: &[f64] = h;
                        direction(priors, cols, &at, &mut g.clone(), h.to_vec(), || h.to_vec())
                    } else {
                        direction(priors, cols, &at, &mut g.clone(), h.clone(), || h)
                    }
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
            let h = pack_lower(&lik.information(&block), block.len());
            let exact = direction(priors, &block, &at, &mut gb, h.clone(), || h)
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

/// The Newton direction Δ = H⁻¹G on `cols` and the squared decrement GᵀH⁻¹G, from the
/// log-likelihood's gradient `g` and information `h` (its lower triangle, packed as
/// [`pack_lower`]) plus the prior's terms, and the factor (packed); `None` when the matrix
/// cannot be factored. `h` is factored in place; `again` gives it once more for the
/// Levenberg–Marquardt regularization when it is not positive definite.
fn direction(
    priors: &PriorSet,
    cols: &[usize],
    at: &Point<'_>,
    g: &mut [f64],
    mut h: Vec<f64>,
    again: impl FnOnce() -> Vec<f64>,
) -> Option<(Vec<f64>, f64, Option<Vec<f64>>)> {
    let k = cols.len();
    prior_gradient(priors, cols, at, g);
    prior_diagonal(priors, cols, &mut h);
    let l = if cholesky_in_place(&mut h, k, packed_start) {
        h
    } else {
        drop(h);
        let mut h = again();
        prior_diagonal(priors, cols, &mut h);
        regularized_factor(&h, k, packed_start)?
    };
    let delta = solve_rows(&l, k, g, packed_start);
    let dec2 = dot(g, &delta).max(0.0);
    Some((delta, dec2, Some(l)))
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

/// The lower triangle of the `k × k` matrix `h` (row-major), row by row: entry (a, b), b ≤ a,
/// at [`packed_start`]`(a) + b`. The Newton matrices are symmetric and factoring reads only
/// the lower triangle: half the memory of the full matrix, and the same factor.
fn pack_lower(h: &[f64], k: usize) -> Vec<f64> {
    let mut out = Vec::with_capacity(k * (k + 1) / 2);
    for a in 0..k {
        out.extend_from_slice(&h[a * k..a * k + a + 1]);
    }
    out
}

/// Where row i of a lower triangle packed row by row ([`pack_lower`]) starts.
#[inline]
fn packed_start(i: usize) -> usize {
    i * (i + 1) / 2
}

/// The rows and columns `cols` (packed as [`pack_lower`]) of the symmetric matrix whose lower
/// triangle is `packed` (over the sorted columns `of`), bordered by the columns of `border`
/// (column, diagonal entry; zero elsewhere in their rows and columns), when every column of
/// `cols` is in `of` or in `border`.
fn submatrix(
    of: &[usize],
    packed: &[f64],
    cols: &[usize],
    border: &[(usize, f64)],
) -> Option<Vec<f64>> {
    enum Entry {
        Old(usize),
        New(f64),
    }
    let idx: Vec<Entry> = cols
        .iter()
        .map(|j| match of.binary_search(j) {
            Ok(a) => Some(Entry::Old(a)),
            Err(_) => border
                .iter()
                .find(|(b, _)| b == j)
                .map(|&(_, h)| Entry::New(h)),
        })
        .collect::<Option<_>>()?;
    let mut out = Vec::with_capacity(cols.len() * (cols.len() + 1) / 2);
    for (r, a) in idx.iter().enumerate() {
        match *a {
            Entry::Old(a) => out.extend(idx[..=r].iter().map(|b| match *b {
                Entry::Old(b) => packed[packed_start(a.max(b)) + a.min(b)],
                Entry::New(_) => 0.0,
            })),
            Entry::New(h) => {
                out.extend(std::iter::repeat_n(0.0, r));
                out.push(h);
            }
        }
    }
    Some(out)
}

/// Add the penalty's first derivative to `g`.
fn prior_gradient(priors: &PriorSet, cols: &[usize], at: &Point<'_>, g: &mut [f64]) {
    for (a, &j) in cols.iter().enumerate() {
        match priors.per_coef[j] {
            Prior::None => {}
            Prior::Normal { variance } => g[a] -= at.beta[j] / variance,
            Prior::Laplace { lambda } => {
                debug_assert!(at.beta[j] != 0.0, "Laplace column {j} at zero");
                g[a] -= lambda * at.beta[j].signum();
            }
        }
    }
}

/// Add the penalty's second derivative to the diagonal of `h` (packed as [`pack_lower`]).
fn prior_diagonal(priors: &PriorSet, cols: &[usize], h: &mut [f64]) {
    for (a, &j) in cols.iter().enumerate() {
        if let Prior::Normal { variance } = priors.per_coef[j] {
            h[packed_start(a) + a] += 1.0 / variance;
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
/// a + μ·max_a(a_aa)·Id (μ = 1e-10 … 1e1) when `a` is not positive definite. Only the lower
/// triangle of `a` is read.
pub(crate) fn factor(a: &[f64], k: usize) -> Option<Vec<f64>> {
    let rows = |i: usize| i * k;
    let mut l = a.to_vec();
    if !cholesky_in_place(&mut l, k, rows) {
        l = regularized_factor(a, k, rows)?;
    }
    clear_upper(&mut l, k);
    Some(l)
}

/// The Levenberg–Marquardt part of [`factor`], on the lower triangle of `a` whose row i starts
/// at `start(i)` (full or packed), in the same layout (the entries above the diagonal of a
/// full one as in `a`).
fn regularized_factor(
    a: &[f64],
    k: usize,
    start: impl Fn(usize) -> usize + Copy,
) -> Option<Vec<f64>> {
    let scale = (0..k)
        .map(|i| a[start(i) + i].abs())
        .fold(0.0, f64::max)
        .max(f64::MIN_POSITIVE);
    let mut mu = 1e-10;
    while mu <= 10.0 {
        let mut m = a.to_vec();
        for i in 0..k {
            m[start(i) + i] += mu * scale;
        }
        if cholesky_in_place(&mut m, k, start) {
            return Some(m);
        }
        mu *= 10.0;
    }
    None
}

/// Lower Cholesky factor L (row-major) with a = L Lᵀ, or `None` when `a` is not positive
/// definite. Only the lower triangle of `a` is read.
pub(crate) fn cholesky(a: &[f64], k: usize) -> Option<Vec<f64>> {
    let mut l = a.to_vec();
    if !cholesky_in_place(&mut l, k, |i| i * k) {
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

/// Overwrite the lower triangle (with the diagonal) of `m`, row i of which starts at
/// `start(i)` (`i·k`: a full row-major matrix; [`packed_start`]: a packed lower triangle), by
/// the Cholesky factor of the matrix whose lower triangle it holds; false when that matrix is
/// not positive definite (`m`'s lower triangle is then partly overwritten). Nothing else is
/// read or written, and the operations do not depend on the layout. Each entry a_ij is read
/// just before L_ij takes its place, and L_ij depends only on a_ij and the entries of L left of
/// it in rows i and j, all already computed.
fn cholesky_in_place(m: &mut [f64], k: usize, start: impl Fn(usize) -> usize) -> bool {
    // Rows in pairs: the whole groups of four entries left of row i's diagonal are computed
    // for rows i and i + 1 together (each row j of those groups is loaded once for both),
    // then each row is finished alone. Every entry gets the operations of the one-row
    // algorithm ([`cholesky_row`]) in the same order, so the pairing changes no bit.
    let mut i = 0;
    while i < k {
        let j = if i + 1 < k {
            cholesky_row_pair_groups(m, i, &start)
        } else {
            0
        };
        if !cholesky_row(m, i, j, &start) {
            return false;
        }
        if i + 1 < k && !cholesky_row(m, i + 1, j, &start) {
            return false;
        }
        i += 2;
    }
    true
}

/// Row i of [`cholesky_in_place`], its entries left of `j0` (a multiple of 4, at most the
/// first whole groups) already computed: the remaining whole groups of four entries left of
/// the diagonal, then the rest one by one; false when the diagonal is not positive.
fn cholesky_row(m: &mut [f64], i: usize, j0: usize, start: &impl Fn(usize) -> usize) -> bool {
    let (done, rest) = m.split_at_mut(start(i));
    let li = &mut rest[..=i];
    let row = |j: usize| &done[start(j)..start(j) + j];
    let mut j = j0;
    // Four entries at a time (j a multiple of 4, all left of the diagonal): their dot
    // products share the chunked part of `dot4` (the first j terms) and load row i
    // once; each keeps its own partial sums and tail, so every bit is as `dot4`'s.
    while j + 4 <= i {
        let rows = [0, 1, 2, 3].map(|t| &done[start(j + t)..start(j + t) + j]);
        let acc = dot4_chunks_x4(&li[..j], rows);
        finish_group(li, j, &acc, done, start);
        j += 4;
    }
    for j in j..=i {
        let s = if j == i {
            li[i] - dot4(&li[..j], &li[..j])
        } else {
            li[j] - dot4(&li[..j], row(j))
        };
        if i == j {
            if !(s > 0.0 && s.is_finite()) {
                return false;
            }
            li[i] = s.sqrt();
        } else {
            li[j] = s / done[start(j) + j];
        }
    }
    true
}

/// The whole groups of four entries left of row i's diagonal (j + 4 ≤ i) of rows i and
/// i + 1 (both exist), as [`cholesky_row`] computes them; returns where the groups end.
fn cholesky_row_pair_groups(m: &mut [f64], i: usize, start: &impl Fn(usize) -> usize) -> usize {
    let (done, rest) = m.split_at_mut(start(i));
    let (ri, rn) = rest.split_at_mut(start(i + 1) - start(i));
    let li = &mut ri[..=i];
    let ln = &mut rn[..=i + 1];
    let mut j = 0;
    while j + 4 <= i {
        let rows = [0, 1, 2, 3].map(|t| &done[start(j + t)..start(j + t) + j]);
        let [acc_i, acc_n] = dot4_chunks_x4_pair(&li[..j], &ln[..j], rows);
        finish_group(li, j, &acc_i, done, start);
        finish_group(ln, j, &acc_n, done, start);
        j += 4;
    }
    j
}

/// Entries j..j + 4 of a row `l` from the chunked partial sums of their dot products with
/// rows j..j + 4 (over the first j terms): the tail terms, then the division.
#[inline(always)]
fn finish_group(
    l: &mut [f64],
    j: usize,
    acc: &[[f64; 4]; 4],
    done: &[f64],
    start: &impl Fn(usize) -> usize,
) {
    for (t, acc) in acc.iter().enumerate() {
        let jt = j + t;
        let row_jt = &done[start(jt)..start(jt) + jt + 1];
        let mut s = (acc[0] + acc[1]) + (acc[2] + acc[3]);
        for m in j..jt {
            s += l[m] * row_jt[m];
        }
        l[jt] = (l[jt] - s) / row_jt[jt];
    }
}

/// [`dot4_chunks_x4`] of two vectors `x` and `z` (same length) with the same four rows, each
/// row loaded once. On x86-64 CPUs with AVX2 the same code runs on 256-bit registers: four
/// lanes are the four partial sums, each with the same multiplications and additions in the
/// same order (no fused multiply-add), so every bit is as on any other CPU.
fn dot4_chunks_x4_pair(x: &[f64], z: &[f64], rows: [&[f64]; 4]) -> [[[f64; 4]; 4]; 2] {
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("avx2") {
        // SAFETY: the CPU supports AVX2 (checked just above).
        return unsafe { dot4_chunks_x4_pair_avx2(x, z, rows) };
    }
    dot4_chunks_x4_pair_portable(x, z, rows)
}

/// [`dot4_chunks_x4_pair`] compiled for AVX2.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
fn dot4_chunks_x4_pair_avx2(x: &[f64], z: &[f64], rows: [&[f64]; 4]) -> [[[f64; 4]; 4]; 2] {
    dot4_chunks_x4_pair_portable(x, z, rows)
}

/// The body of [`dot4_chunks_x4_pair`], inlined into each CPU's version.
#[inline(always)]
fn dot4_chunks_x4_pair_portable(x: &[f64], z: &[f64], rows: [&[f64]; 4]) -> [[[f64; 4]; 4]; 2] {
    let mut ax = [[0.0f64; 4]; 4];
    let mut az = [[0.0f64; 4]; 4];
    let n = x.len() / 4 * 4;
    let (x, z) = (&x[..n], &z[..n]);
    let (r0, r1, r2, r3) = (&rows[0][..n], &rows[1][..n], &rows[2][..n], &rows[3][..n]);
    for c in (0..n).step_by(4) {
        let xs = &x[c..c + 4];
        let zs = &z[c..c + 4];
        for (t, r) in [r0, r1, r2, r3].iter().enumerate() {
            let ys = &r[c..c + 4];
            for l in 0..4 {
                ax[t][l] += xs[l] * ys[l];
                az[t][l] += zs[l] * ys[l];
            }
        }
    }
    [ax, az]
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

/// Solve L Lᵀ x = b (L: `k × k`, row-major).
pub(crate) fn cholesky_solve(l: &[f64], k: usize, b: &[f64]) -> Vec<f64> {
    solve_rows(l, k, b, |i| i * k)
}

/// Solve L Lᵀ x = b with row i of L starting at `start(i)` (as [`cholesky_in_place`]).
fn solve_rows(l: &[f64], k: usize, b: &[f64], start: impl Fn(usize) -> usize) -> Vec<f64> {
    let mut y = b.to_vec();
    for i in 0..k {
        let mut s = y[i];
        let row = &l[start(i)..start(i) + i + 1];
        for m in 0..i {
            s -= row[m] * y[m];
        }
        y[i] = s / row[i];
    }
    for i in (0..k).rev() {
        let mut s = y[i];
        for m in i + 1..k {
            s -= l[start(m) + i] * y[m];
        }
        y[i] = s / l[start(i) + i];
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
        for k in (1..=23).chain([64, 97, 130]) {
            let mut a = spd(k, 0x2545_F491_4F6C_DD1D ^ k as u64);
            let (x, y) = (cholesky(&a, k).unwrap(), plain(&a, k).unwrap());
            let bits = |v: &[f64]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
            assert_eq!(bits(&x), bits(&y), "k = {k}");
            // Not positive definite: both refuse.
            a[(k - 1) * k + k - 1] = -1.0;
            assert!(cholesky(&a, k).is_none() && plain(&a, k).is_none());
        }
    }

    /// Factoring the packed lower triangle in place (regularized from a fresh copy when not
    /// positive definite) gives [`factor`]'s bits, and so does the packed solve: positive
    /// definite, singular and not symmetric (the upper triangle is never read).
    #[test]
    fn packed_factor_is_the_factor() {
        let packed_factor = |a: &[f64], k: usize| {
            let mut l = pack_lower(a, k);
            if cholesky_in_place(&mut l, k, packed_start) {
                Some(l)
            } else {
                regularized_factor(&pack_lower(a, k), k, packed_start)
            }
        };
        let mut unif = uniform(0x9E37_79B9_7F4A_7C15);
        let bits = |v: &[f64]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
        for k in [1, 2, 5, 9, 31, 70] {
            let b: Vec<f64> = (0..k).map(|_| unif()).collect();
            // Rank ≤ k/2 + 1 Gram matrices (singular for k > 2) and full-rank ones.
            for rank in [k / 2 + 1, k + 3] {
                let x: Vec<f64> = (0..k * rank).map(|_| unif()).collect();
                let mut a = vec![0.0; k * k];
                for i in 0..k {
                    for j in 0..=i {
                        let v = (0..rank).map(|m| x[i * rank + m] * x[j * rank + m]).sum();
                        a[i * k + j] = v;
                        a[j * k + i] = v;
                    }
                }
                for asymmetric in [false, true] {
                    if asymmetric && k > 1 {
                        a[1] += 1.0;
                    }
                    let want = factor(&a, k).expect("regularized");
                    let got = packed_factor(&a, k).expect("regularized");
                    assert_eq!(bits(&got), bits(&pack_lower(&want, k)), "k {k} rank {rank}");
                    let x = solve_rows(&got, k, &b, packed_start);
                    assert_eq!(bits(&x), bits(&cholesky_solve(&want, k, &b)), "k {k}");
                }
            }
        }
        // Indefinite beyond any regularization: none, as `factor`.
        let a = vec![1.0, 100.0, 100.0, 1.0];
        assert!(factor(&a, 2).is_none() && packed_factor(&a, 2).is_none());
    }

    /// A submatrix of the packed lower triangle is that of the full symmetric matrix; only the
    /// lower triangle is packed.
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
        let packed = pack_lower(&h, k);
        assert_eq!(packed.len(), k * (k + 1) / 2);
        let cols = [21, 3, 13, 2];
        let got = submatrix(&of, &packed, &cols, &[]).unwrap();
        assert_eq!(got.len(), 10);
        let idx = [5, 1, 4, 0];
        for (r, &a) in idx.iter().enumerate() {
            for (c, &b) in idx.iter().enumerate().take(r + 1) {
                assert_eq!(got[packed_start(r) + c], h[a * k + b]);
            }
        }
        assert!(submatrix(&of, &packed, &[3, 4], &[]).is_none());
        // Only the lower triangle is packed.
        h[1] += 1.0;
        assert_eq!(pack_lower(&h, k), packed);
    }

    /// The one-row-at-a-time factorization that [`cholesky_in_place`] pairs rows of.
    fn cholesky_rows_alone(m: &mut [f64], k: usize, start: impl Fn(usize) -> usize) -> bool {
        (0..k).all(|i| cholesky_row(m, i, 0, &start))
    }

    /// B Bᵀ + 0.1·Id (k × k, row-major): symmetric positive definite.
    fn spd(k: usize, seed: u64) -> Vec<f64> {
        let mut unif = uniform(seed);
        let b: Vec<f64> = (0..k * k).map(|_| unif()).collect();
        let mut a = vec![0.0; k * k];
        for i in 0..k {
            for j in 0..k {
                a[i * k + j] = (0..k).map(|m| b[i * k + m] * b[j * k + m]).sum::<f64>();
            }
            a[i * k + i] += 0.1;
        }
        a
    }

    /// Rows factored in pairs (on this CPU's fastest code: AVX2 where there is one) get the
    /// bits of rows factored one by one on the portable code, and a matrix that is not
    /// positive definite in either row of a pair is refused.
    #[test]
    fn paired_rows_are_rows_alone() {
        let bits = |v: &[f64]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
        let mut unif = uniform(7);
        for n in [0, 4, 8, 36, 900] {
            let v: Vec<Vec<f64>> = (0..6).map(|_| (0..n).map(|_| unif()).collect()).collect();
            let rows = [&v[2][..], &v[3][..], &v[4][..], &v[5][..]];
            let single = [dot4_chunks_x4(&v[0], rows), dot4_chunks_x4(&v[1], rows)];
            for pair in [
                dot4_chunks_x4_pair(&v[0], &v[1], rows),
                dot4_chunks_x4_pair_portable(&v[0], &v[1], rows),
            ] {
                let flat = |p: &[[[f64; 4]; 4]; 2]| bits(&p.concat().concat());
                assert_eq!(flat(&pair), flat(&single), "n = {n}");
            }
        }
        let k = 41;
        let a = spd(k, 3);
        let (mut paired, mut alone) = (a.clone(), a.clone());
        assert!(cholesky_in_place(&mut paired, k, |i| i * k));
        assert!(cholesky_rows_alone(&mut alone, k, |i| i * k));
        assert_eq!(bits(&paired), bits(&alone));
        for bad in [30, 31, 40] {
            let mut a = a.clone();
            a[bad * k + bad] = -1.0;
            assert!(
                !cholesky_in_place(&mut a.clone(), k, |i| i * k),
                "row {bad}"
            );
            assert!(!cholesky_rows_alone(&mut a, k, |i| i * k), "row {bad}");
        }
    }

    /// Timing of the factorization at the size of a cross-validation polish (opt-in):
    /// `cargo test --release -p epifusion-core cholesky_speed -- --ignored --nocapture`.
    #[test]
    #[ignore = "timing, opt-in"]
    fn cholesky_speed() {
        let k = 900;
        let a = pack_lower(&spd(k, 1), k);
        for paired in [true, false, true, false] {
            let t = std::time::Instant::now();
            for _ in 0..5 {
                let mut m = a.clone();
                let ok = if paired {
                    cholesky_in_place(&mut m, k, packed_start)
                } else {
                    cholesky_rows_alone(&mut m, k, packed_start)
                };
                assert!(ok);
            }
            let name = if paired {
                "paired"
            } else {
                "rows alone, portable"
            };
            eprintln!(
                "{name}: {:.1} ms per factor",
                t.elapsed().as_secs_f64() * 200.0
            );
        }
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
