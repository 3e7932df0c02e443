//! Standard errors and confidence intervals.
//!
//! * **Standard errors** come from the observed information (−Hessian of the log-likelihood)
//!   over the *unpenalized* coefficients, computed by each likelihood with its correct
//!   per-risk-set / per-stratum formulas ([`crate::model::Likelihood::information`]), inverted
//!   by Cholesky. Penalized coefficients are held at their estimates (conditional information);
//!   with no prior this is the usual maximum-likelihood covariance, as R `survival` reports it.
//! * **Profile-likelihood intervals** (default): the set of b with
//!   max_{β₋ⱼ} f(β | β_j = b) ≥ f̂ − χ²₁(level)/2, where f = LL + log prior (1.920729 for 95%).
//!   Each bound is bracketed by stepping out from the estimate and found by Brent's method,
//!   each evaluation a CCD refit with β_j fixed, warm-started from the nearest evaluated point.
//!   A bound that does not exist (monotone likelihood) is reported as missing.
//! * **Wald intervals** (option): β̂ ± z·SE.

use super::ccd::{self, CcdOptions, FitStatus};
use super::prior::PriorSet;
use super::Likelihood;
use crate::error::Result;

/// Normal quantile Φ⁻¹(p) (Acklam's rational approximation refined by one Halley step;
/// relative error < 1e-13 for p in (1e-300, 1 − 1e-16)).
// The coefficients are the published ones, kept digit for digit.
#[allow(clippy::excessive_precision)]
pub fn normal_quantile(p: f64) -> f64 {
    assert!(p > 0.0 && p < 1.0, "probability must be in (0, 1)");
    const A: [f64; 6] = [
        -3.969683028665376e+01,
        2.209460984245205e+02,
        -2.759285104469687e+02,
        1.383577518672690e+02,
        -3.066479806614716e+01,
        2.506628277459239e+00,
    ];
    const B: [f64; 5] = [
        -5.447609879822406e+01,
        1.615858368580409e+02,
        -1.556989798598866e+02,
        6.680131188771972e+01,
        -1.328068155288572e+01,
    ];
    const C: [f64; 6] = [
        -7.784894002430293e-03,
        -3.223964580411365e-01,
        -2.400758277161838e+00,
        -2.549732539343734e+00,
        4.374664141464968e+00,
        2.938163982698783e+00,
    ];
    const D: [f64; 4] = [
        7.784695709041462e-03,
        3.224671290700398e-01,
        2.445134137142996e+00,
        3.754408661907416e+00,
    ];
    let plow = 0.02425;
    let x = if p < plow {
        let q = (-2.0 * p.ln()).sqrt();
        (((((C[0] * q + C[1]) * q + C[2]) * q + C[3]) * q + C[4]) * q + C[5])
            / ((((D[0] * q + D[1]) * q + D[2]) * q + D[3]) * q + 1.0)
    } else if p <= 1.0 - plow {
        let q = p - 0.5;
        let r = q * q;
        (((((A[0] * r + A[1]) * r + A[2]) * r + A[3]) * r + A[4]) * r + A[5]) * q
            / (((((B[0] * r + B[1]) * r + B[2]) * r + B[3]) * r + B[4]) * r + 1.0)
    } else {
        let q = (-2.0 * (1.0 - p).ln()).sqrt();
        -(((((C[0] * q + C[1]) * q + C[2]) * q + C[3]) * q + C[4]) * q + C[5])
            / ((((D[0] * q + D[1]) * q + D[2]) * q + D[3]) * q + 1.0)
    };
    // One Halley refinement using erfc.
    let e = 0.5 * erfc(-x / std::f64::consts::SQRT_2) - p;
    let u = e * (2.0 * std::f64::consts::PI).sqrt() * (x * x / 2.0).exp();
    x - u / (1.0 + x * u / 2.0)
}

/// Complementary error function (W. J. Cody's rational approximations, ~1e-16 relative).
#[allow(clippy::excessive_precision)]
pub fn erfc(x: f64) -> f64 {
    // Numerical Recipes' erfc via Chebyshev (erfccheb), accurate to ~1.2e-16 relative.
    const COF: [f64; 28] = [
        -1.3026537197817094,
        6.4196979235649026e-1,
        1.9476473204185836e-2,
        -9.561514786808631e-3,
        -9.46595344482036e-4,
        3.66839497852761e-4,
        4.2523324806907e-5,
        -2.0278578112534e-5,
        -1.624290004647e-6,
        1.303655835580e-6,
        1.5626441722e-8,
        -8.5238095915e-8,
        6.529054439e-9,
        5.059343495e-9,
        -9.91364156e-10,
        -2.27365122e-10,
        9.6467911e-11,
        2.394038e-12,
        -6.886027e-12,
        8.94487e-13,
        3.13092e-13,
        -1.12708e-13,
        3.81e-16,
        7.106e-15,
        -1.523e-15,
        -9.4e-17,
        1.21e-16,
        -2.8e-17,
    ];
    let cheb = |z: f64| {
        let t = 2.0 / (2.0 + z);
        let ty = 4.0 * t - 2.0;
        let (mut d, mut dd) = (0.0, 0.0);
        for &c in COF[1..].iter().rev() {
            let tmp = d;
            d = ty * d - dd + c;
            dd = tmp;
        }
        t * (-z * z + 0.5 * (COF[0] + ty * d) - dd).exp()
    };
    if x >= 0.0 {
        cheb(x)
    } else {
        2.0 - cheb(-x)
    }
}

/// Half the χ²₁ quantile at `level`: the drop in log-likelihood that bounds a profile interval
/// (1.920729 for 95%).
pub fn profile_threshold(level: f64) -> f64 {
    let z = normal_quantile(1.0 - (1.0 - level) / 2.0);
    z * z / 2.0
}

/// Invert a symmetric positive-definite `k×k` matrix (row-major) by Cholesky.
/// Returns `None` when it is not positive definite (e.g. a column with no information).
pub fn invert_spd(a: &[f64], k: usize) -> Option<Vec<f64>> {
    let mut l = vec![0.0; k * k];
    for i in 0..k {
        for j in 0..=i {
            let mut s = a[i * k + j];
            for m in 0..j {
                s -= l[i * k + m] * l[j * k + m];
            }
            if i == j {
                if s.is_nan() || s <= 0.0 || !s.is_finite() {
                    return None;
                }
                l[i * k + i] = s.sqrt();
            } else {
                l[i * k + j] = s / l[j * k + j];
            }
        }
    }
    // inv(L)
    let mut li = vec![0.0; k * k];
    for i in 0..k {
        li[i * k + i] = 1.0 / l[i * k + i];
        for j in 0..i {
            let mut s = 0.0;
            for m in j..i {
                s -= l[i * k + m] * li[m * k + j];
            }
            li[i * k + j] = s / l[i * k + i];
        }
    }
    // inv(A) = inv(L)ᵀ inv(L)
    let mut out = vec![0.0; k * k];
    for i in 0..k {
        for j in 0..=i {
            let mut s = 0.0;
            for m in i..k {
                s += li[m * k + i] * li[m * k + j];
            }
            out[i * k + j] = s;
            out[j * k + i] = s;
        }
    }
    Some(out)
}

/// Standard errors of `cols` from the observed information at the likelihood's current state.
/// `None` for every column when the information matrix is singular.
pub fn standard_errors(lik: &mut dyn Likelihood, cols: &[usize]) -> Vec<Option<f64>> {
    let k = cols.len();
    if k == 0 {
        return Vec::new();
    }
    let info = lik.information(cols);
    match invert_spd(&info, k) {
        Some(inv) => (0..k).map(|i| Some(inv[i * k + i].sqrt())).collect(),
        None => {
            // Fall back to per-coefficient 1/sqrt(I_jj) for columns that do have information,
            // leaving singular ones missing.
            vec![None; k]
        }
    }
}

/// One profile-likelihood interval.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ProfileInterval {
    /// Lower bound (missing when the profile never drops below the threshold).
    pub lower: Option<f64>,
    /// Upper bound.
    pub upper: Option<f64>,
    /// Refits used.
    pub evaluations: usize,
}

/// The optimum a profile starts from.
#[derive(Debug, Clone, Copy)]
pub struct Optimum<'a> {
    /// β̂.
    pub beta: &'a [f64],
    /// Objective (LL + log prior) at β̂.
    pub objective: f64,
}

/// Profile-likelihood interval for coefficient `j` around `optimum`. `scale` is a first step
/// size (e.g. the SE).
pub fn profile_interval(
    lik: &mut dyn Likelihood,
    priors: &PriorSet,
    optimum: Optimum<'_>,
    j: usize,
    scale: f64,
    level: f64,
    opts: &CcdOptions,
) -> Result<ProfileInterval> {
    let (lower, e1) = profile_bound(lik, priors, optimum, j, -1.0, scale, level, &[], opts)?;
    let (upper, e2) = profile_bound(lik, priors, optimum, j, 1.0, scale, level, &[], opts)?;
    Ok(ProfileInterval {
        lower,
        upper,
        evaluations: e1 + e2,
    })
}

/// One target of [`profile_intervals`].
#[derive(Debug, Clone, PartialEq)]
pub struct ProfileTarget {
    /// Coefficient index.
    pub j: usize,
    /// First step size (e.g. the SE; NaN for a default).
    pub scale: f64,
    /// Priors to profile under (the fit's, or with coefficient j's penalty removed).
    pub priors: PriorSet,
    /// The optimum of the objective under `priors` (β̂ and its objective).
    pub beta: Vec<f64>,
    /// Objective at `beta`.
    pub objective: f64,
    /// Coefficients held at their value in `beta` in every refit besides j (aliased columns,
    /// coefficients with no finite estimate); empty: none.
    pub fixed: Vec<bool>,
}

/// Profile intervals of several coefficients, both bounds of each in parallel (rayon), each
/// task on its own copy of the likelihood ([`Likelihood::boxed_clone`]). Every bound is found
/// exactly as [`profile_interval`] would, so the result does not depend on the thread count.
pub fn profile_intervals(
    lik: &dyn Likelihood,
    targets: &[ProfileTarget],
    level: f64,
    opts: &CcdOptions,
) -> Result<Vec<ProfileInterval>> {
    use rayon::prelude::*;
    let tasks: Vec<(usize, f64)> = (0..targets.len())
        .flat_map(|t| [(t, -1.0), (t, 1.0)])
        .collect();
    if tasks.is_empty() {
        return Ok(Vec::new());
    }
    // One copy of the likelihood per worker (not per task: memory), each working through a
    // contiguous chunk of tasks. Every refit starts with a full recompute of the state, so a
    // bound does not depend on which copy computed it.
    let workers = rayon::current_num_threads().clamp(1, tasks.len());
    let chunk = tasks.len().div_ceil(workers);
    let mut copies: Vec<Box<dyn Likelihood>> = (0..tasks.chunks(chunk).len())
        .map(|_| lik.boxed_clone())
        .collect();
    let per_chunk: Vec<Vec<(Option<f64>, usize)>> = copies
        .par_iter_mut()
        .zip(tasks.par_chunks(chunk))
        .map(|(own, chunk)| {
            chunk
                .iter()
                .map(|&(t, dir)| {
                    let tg = &targets[t];
                    let optimum = Optimum {
                        beta: &tg.beta,
                        objective: tg.objective,
                    };
                    profile_bound(
                        own.as_mut(),
                        &tg.priors,
                        optimum,
                        tg.j,
                        dir,
                        tg.scale,
                        level,
                        &tg.fixed,
                        opts,
                    )
                })
                .collect::<Result<Vec<_>>>()
        })
        .collect::<Result<_>>()?;
    let bounds: Vec<(Option<f64>, usize)> = per_chunk.into_iter().flatten().collect();
    Ok(bounds
        .chunks(2)
        .map(|b| ProfileInterval {
            lower: b[0].0,
            upper: b[1].0,
            evaluations: b[0].1 + b[1].1,
        })
        .collect())
}

/// One point of a likelihood profile.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ProfilePoint {
    /// β_j.
    pub value: f64,
    /// max over the other coefficients of the objective (LL + log prior of `priors`).
    pub objective: f64,
    /// The log-likelihood at that maximizer.
    pub log_likelihood: f64,
    /// Whether this is the optimum itself (the estimate added to the grid).
    pub is_estimate: bool,
}

/// The profile of coefficient `j` on `grid` plus the optimum itself (as SCCS and CohortMethod
/// report likelihood profiles). The grid is walked outward from the estimate on each side with
/// warm starts, the two sides in parallel. Points whose refit is ill-conditioned are left out.
pub fn profile_grid(
    lik: &dyn Likelihood,
    target: &ProfileTarget,
    grid: &[f64],
    opts: &CcdOptions,
) -> Result<Vec<ProfilePoint>> {
    let j = target.j;
    let hat = target.beta[j];
    let mut left: Vec<f64> = grid.iter().copied().filter(|&b| b < hat).collect();
    let mut right: Vec<f64> = grid.iter().copied().filter(|&b| b > hat).collect();
    left.sort_by(|a, b| b.total_cmp(a));
    right.sort_by(f64::total_cmp);
    let mut inner = opts.clone();
    inner.tolerance = (opts.tolerance * 1e-3).max(1e-13);
    let mut fixed = base_mask(&target.fixed, target.beta.len());
    fixed[j] = true;
    let walk = |mut own: Box<dyn Likelihood>, side: &[f64]| -> Result<Vec<ProfilePoint>> {
        let mut warm = target.beta.clone();
        let mut out = Vec::with_capacity(side.len());
        for &b in side {
            warm[j] = b;
            let r = ccd::fit(own.as_mut(), &target.priors, &warm, Some(&fixed), &inner)?;
            if r.status == FitStatus::IllConditioned {
                continue;
            }
            warm = r.beta;
            out.push(ProfilePoint {
                value: b,
                objective: r.log_likelihood + r.log_prior,
                log_likelihood: r.log_likelihood,
                is_estimate: false,
            });
        }
        Ok(out)
    };
    let (own_l, own_r) = (lik.boxed_clone(), lik.boxed_clone());
    let (l, r) = rayon::join(|| walk(own_l, &left), || walk(own_r, &right));
    let mut own = lik.boxed_clone();
    own.set_beta(&target.beta);
    let ll_hat = own.log_likelihood();
    let mut points = l?;
    points.reverse();
    points.push(ProfilePoint {
        value: hat,
        objective: target.objective,
        log_likelihood: ll_hat,
        is_estimate: true,
    });
    points.extend(r?);
    Ok(points)
}

/// One bound (`dir` = −1 lower, +1 upper) of the profile interval and the refits it took.
#[allow(clippy::too_many_arguments)]
fn profile_bound(
    lik: &mut dyn Likelihood,
    priors: &PriorSet,
    optimum: Optimum<'_>,
    j: usize,
    dir: f64,
    scale: f64,
    level: f64,
    base: &[bool],
    opts: &CcdOptions,
) -> Result<(Option<f64>, usize)> {
    let beta_hat = optimum.beta;
    let objective_hat = optimum.objective;
    let threshold = objective_hat - profile_threshold(level);
    let mut inner = opts.clone();
    inner.tolerance = (opts.tolerance * 1e-3).max(1e-13);
    let mut fixed = base_mask(base, beta_hat.len());
    fixed[j] = true;
    let mut evaluations = 0usize;
    let step0 = if scale.is_finite() && scale > 0.0 {
        2.0 * scale
    } else {
        0.5_f64.max(beta_hat[j].abs() * 0.1)
    };
    // φ(b) = profile(b) − threshold, positive at the estimate.
    let mut warm = beta_hat.to_vec();
    let mut eval = |b: f64, warm: &mut Vec<f64>| -> Result<Option<f64>> {
        warm[j] = b;
        let r = ccd::fit(lik, priors, warm, Some(&fixed), &inner)?;
        evaluations += 1;
        if r.status == FitStatus::IllConditioned {
            return Ok(None);
        }
        *warm = r.beta;
        Ok(Some(r.log_likelihood + r.log_prior - threshold))
    };
    let mut lo = beta_hat[j];
    let mut f_lo = objective_hat - threshold;
    let mut step = step0;
    let mut found = None;
    for _ in 0..40 {
        let hi = lo + dir * step;
        match eval(hi, &mut warm)? {
            None => break,
            Some(f_hi) if f_hi <= 0.0 => {
                found = Some((lo, f_lo, hi, f_hi));
                break;
            }
            Some(f_hi) => {
                lo = hi;
                f_lo = f_hi;
                step *= 2.0;
            }
        }
    }
    let Some((a, fa, b, fb)) = found else {
        return Ok((None, evaluations));
    };
    let root = brent(a, fa, b, fb, 1e-9 * (1.0 + a.abs()), 100, |x| {
        eval(x, &mut warm).map(|v| v.unwrap_or(f64::NAN))
    })?;
    Ok((root, evaluations))
}

/// The mask `base` (empty: nothing fixed) as a vector of `p` flags.
fn base_mask(base: &[bool], p: usize) -> Vec<bool> {
    if base.is_empty() {
        vec![false; p]
    } else {
        base.to_vec()
    }
}

/// Brent's root finder on [a, b] with f(a)·f(b) ≤ 0, to within `4·ε·|x| + tol`. Returns `None`
/// if f turns NaN.
pub(crate) fn brent(
    mut a: f64,
    mut fa: f64,
    mut b: f64,
    mut fb: f64,
    tol: f64,
    max_iter: usize,
    mut f: impl FnMut(f64) -> Result<f64>,
) -> Result<Option<f64>> {
    if fb == 0.0 {
        return Ok(Some(b));
    }
    let mut c = a;
    let mut fc = fa;
    let mut d = b - a;
    let mut e = d;
    for _ in 0..max_iter {
        if (fb > 0.0) == (fc > 0.0) {
            c = a;
            fc = fa;
            d = b - a;
            e = d;
        }
        if fc.abs() < fb.abs() {
            a = b;
            b = c;
            c = a;
            fa = fb;
            fb = fc;
            fc = fa;
        }
        let tol1 = 2.0 * f64::EPSILON * b.abs() + 0.5 * tol;
        let xm = 0.5 * (c - b);
        if xm.abs() <= tol1 || fb == 0.0 {
            return Ok(Some(b));
        }
        if e.abs() >= tol1 && fa.abs() > fb.abs() {
            let s = fb / fa;
            let (mut p, mut q);
            if a == c {
                p = 2.0 * xm * s;
                q = 1.0 - s;
            } else {
                let qq = fa / fc;
                let r = fb / fc;
                p = s * (2.0 * xm * qq * (qq - r) - (b - a) * (r - 1.0));
                q = (qq - 1.0) * (r - 1.0) * (s - 1.0);
            }
            if p > 0.0 {
                q = -q;
            }
            p = p.abs();
            let min1 = 3.0 * xm * q - (tol1 * q).abs();
            let min2 = (e * q).abs();
            if 2.0 * p < min1.min(min2) {
                e = d;
                d = p / q;
            } else {
                d = xm;
                e = d;
            }
        } else {
            d = xm;
            e = d;
        }
        a = b;
        fa = fb;
        b += if d.abs() > tol1 { d } else { tol1.copysign(xm) };
        fb = f(b)?;
        if fb.is_nan() {
            return Ok(None);
        }
    }
    Ok(Some(b))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quantiles() {
        assert!((normal_quantile(0.975) - 1.959963984540054).abs() < 1e-12);
        assert!((profile_threshold(0.95) - 1.920729410347062).abs() < 1e-10);
        assert!((erfc(0.5) - 0.4795001221869535).abs() < 1e-15);
    }

    #[test]
    fn spd_inverse() {
        let a = [4.0, 2.0, 2.0, 3.0];
        let inv = invert_spd(&a, 2).unwrap();
        let det = 8.0;
        assert!((inv[0] - 3.0 / det).abs() < 1e-15);
        assert!((inv[1] + 2.0 / det).abs() < 1e-15);
        assert!((inv[3] - 4.0 / det).abs() < 1e-15);
        assert!(invert_spd(&[0.0], 1).is_none());
    }
}
