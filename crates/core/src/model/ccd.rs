//! Cyclic coordinate descent (Genkin, Lewis & Madigan's BBR; Cyclops).
//!
//! Maximizes the log posterior f(β) = LL(β) − Σ_j pen_j(β_j) (see [`crate::model::prior`]).
//! Columns are visited in fixed order; for column j the Newton step on f is
//!
//! Δ = (g_j − pen′(β_j)) / (h_j + pen″(β_j)),
//!
//! clipped to the trust region |Δ| ≤ bound_j, after which bound_j = max(2|Δ|, bound_j/2)
//! (initial bound 2). For the Laplace prior at β_j = 0 the step is tried in each direction with
//! subgradient ±λ and taken only if the directional derivative allows; a step that would cross
//! zero stops at zero.
//!
//! | option | default | range |
//! |---|---|---|
//! | `convergence` | objective | `objective`: relative change \|f_new − f_old\| / (\|f_new\| + 1) after a full cycle (Cyclops' Lange rule); `gradient`: largest optimality (KKT) violation seen in the cycle |
//! | `tolerance` | 1e-6 | > 0; threshold of the convergence rule |
//! | `max_iterations` | 1000 | ≥ 1 full cycles |
//! | `initial_bound` | 2 | > 0 trust-region radius |
//! | `max_retries` | 5 | on NaN/∞ the fit restarts with the initial bound × 0.1 |
//! | `active_set` | true | with a Laplace prior, cycles over the non-zero coefficients only between full cycles (convergence is declared only after a full cycle) |
//!
//! The likelihood's state is recomputed from scratch at the start of every cycle (incremental
//! updates drift) and the reported log-likelihood is always a from-scratch value.

use std::time::Instant;

use super::prior::{Prior, PriorSet};
use super::Likelihood;
use crate::error::{Error, Result};

/// Outcome of a fit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FitStatus {
    /// Relative change of the objective below the tolerance.
    Converged,
    /// Stopped at the iteration limit.
    MaxIterations,
    /// NaN/∞ persisted through every retry.
    IllConditioned,
}

impl FitStatus {
    /// Lower-case name used in result tables.
    pub fn name(self) -> &'static str {
        match self {
            FitStatus::Converged => "converged",
            FitStatus::MaxIterations => "max_iterations",
            FitStatus::IllConditioned => "ill_conditioned",
        }
    }
}

/// Stopping rule.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Convergence {
    /// Relative change of the objective after a full cycle (the default; Cyclops' Lange rule).
    #[default]
    Objective,
    /// Largest violation of the optimality (KKT) conditions over the cycle's coordinates:
    /// |g_j − pen′(β_j)| for β_j ≠ 0 or smooth priors, max(0, |g_j| − λ) at zero. Stricter;
    /// use it when coefficients must be accurate (profiles, golden comparisons).
    Gradient,
}

impl Convergence {
    /// The value compared with the tolerance after a cycle that moved the objective from
    /// `old` to `new` with largest KKT violation `violation`.
    #[inline]
    pub fn criterion(self, old: f64, new: f64, violation: f64) -> f64 {
        match self {
            Convergence::Objective => (new - old).abs() / (new.abs() + 1.0),
            Convergence::Gradient => violation,
        }
    }

    /// Parse `objective` or `gradient`.
    pub fn parse(s: &str) -> Result<Self> {
        match s.to_ascii_lowercase().as_str() {
            "objective" | "lange" => Ok(Convergence::Objective),
            "gradient" | "kkt" => Ok(Convergence::Gradient),
            other => Err(Error::option(
                "convergence",
                format!("unknown `{other}`; expected objective or gradient"),
            )),
        }
    }
}

/// CCD options; see the module docs for defaults and ranges.
#[derive(Debug, Clone)]
pub struct CcdOptions {
    /// Stopping rule.
    pub convergence: Convergence,
    /// Convergence tolerance on the relative change of the objective.
    pub tolerance: f64,
    /// Maximum number of full cycles.
    pub max_iterations: usize,
    /// Initial trust-region bound.
    pub initial_bound: f64,
    /// Retries with a 10× smaller initial bound after NaN/∞.
    pub max_retries: usize,
    /// With a Laplace prior, cycle over the non-zero coefficients between full cycles.
    pub active_set: bool,
    /// Checked once per cycle: a cancelled fit returns [`Error::Cancelled`].
    pub cancel: crate::cancel::CancelToken,
}

impl Default for CcdOptions {
    fn default() -> Self {
        CcdOptions {
            convergence: Convergence::Objective,
            tolerance: 1e-6,
            max_iterations: 1000,
            initial_bound: 2.0,
            max_retries: 5,
            active_set: true,
            cancel: crate::cancel::CancelToken::default(),
        }
    }
}

impl CcdOptions {
    /// Validate the options.
    pub fn check(&self) -> Result<()> {
        if !(self.tolerance.is_finite() && self.tolerance > 0.0) {
            return Err(Error::option(
                "tolerance",
                format!("must be > 0 (got {})", self.tolerance),
            ));
        }
        if self.max_iterations == 0 {
            return Err(Error::option("max_iterations", "must be ≥ 1"));
        }
        if !(self.initial_bound.is_finite() && self.initial_bound > 0.0) {
            return Err(Error::option("initial_bound", "must be > 0"));
        }
        Ok(())
    }
}

/// Result of [`fit`].
#[derive(Debug, Clone)]
pub struct CcdResult {
    /// Coefficients.
    pub beta: Vec<f64>,
    /// Log-likelihood at `beta` (computed from scratch).
    pub log_likelihood: f64,
    /// Log prior at `beta` (without constants).
    pub log_prior: f64,
    /// Full cycles run (in the final attempt).
    pub iterations: usize,
    /// Status.
    pub status: FitStatus,
    /// Objective after each cycle of the final attempt (never decreasing, up to rounding).
    pub objective_trace: Vec<f64>,
    /// Coordinate updates performed (all attempts).
    pub coordinate_updates: u64,
    /// Wall time in seconds.
    pub seconds: f64,
}

/// Maximize LL − penalty by CCD from `beta0`. Coefficients with `fixed[j]` stay at `beta0[j]`
/// (profile likelihood). The likelihood is left at the returned β.
pub fn fit(
    lik: &mut dyn Likelihood,
    priors: &PriorSet,
    beta0: &[f64],
    fixed: Option<&[bool]>,
    opts: &CcdOptions,
) -> Result<CcdResult> {
    opts.check()?;
    let p = lik.n_coef();
    if beta0.len() != p || priors.per_coef.len() != p {
        return Err(Error::FitFailed(format!(
            "internal: {p} coefficients but beta0 has {} and priors {}",
            beta0.len(),
            priors.per_coef.len()
        )));
    }
    let started = Instant::now();
    let mut updates = 0u64;
    let mut bound0 = opts.initial_bound;
    let mut last = None;
    for _attempt in 0..=opts.max_retries {
        let r = attempt(lik, priors, beta0, fixed, opts, bound0, &mut updates);
        opts.cancel.check()?;
        let ill = r.status == FitStatus::IllConditioned;
        last = Some(r);
        if !ill {
            break;
        }
        bound0 *= 0.1;
    }
    let mut r = last.expect("at least one attempt runs");
    if r.status == FitStatus::IllConditioned {
        // Never report NaN with a success status; leave the likelihood at β0.
        lik.set_beta(beta0);
    }
    r.coordinate_updates = updates;
    r.seconds = started.elapsed().as_secs_f64();
    Ok(r)
}

fn attempt(
    lik: &mut dyn Likelihood,
    priors: &PriorSet,
    beta0: &[f64],
    fixed: Option<&[bool]>,
    opts: &CcdOptions,
    bound0: f64,
    updates: &mut u64,
) -> CcdResult {
    let p = beta0.len();
    let mut beta = beta0.to_vec();
    let mut bound = vec![bound0; p];
    lik.set_beta(&beta);
    let mut ll = lik.log_likelihood();
    let mut obj = ll + priors.log_prior(&beta);
    let mut trace = Vec::new();
    let ill = |beta: Vec<f64>, ll: f64, lp: f64, it: usize, trace: Vec<f64>| CcdResult {
        beta,
        log_likelihood: ll,
        log_prior: lp,
        iterations: it,
        status: FitStatus::IllConditioned,
        objective_trace: trace,
        coordinate_updates: 0,
        seconds: 0.0,
    };
    if !obj.is_finite() {
        return ill(beta, ll, f64::NAN, 0, trace);
    }
    let all: Vec<usize> = (0..p).filter(|&j| fixed.is_none_or(|f| !f[j])).collect();
    let has_laplace = all
        .iter()
        .any(|&j| matches!(priors.per_coef[j], Prior::Laplace { .. }));
    let mut status = FitStatus::MaxIterations;
    let mut iterations = 0;
    // Full cycles over every free coordinate; with a Laplace prior, after each full cycle that
    // has not converged, cycles over the coordinates that are non-zero (or not under a Laplace
    // prior) until those converge — a zero coordinate whose |g| ≤ λ takes no step, so visiting
    // it is wasted work until the others have moved. Convergence is only ever declared after a
    // full cycle.
    let mut full = true;
    let mut subset: Vec<usize> = Vec::new();
    while iterations < opts.max_iterations {
        if opts.cancel.is_cancelled() {
            break;
        }
        iterations += 1;
        let coords: &[usize] = if full { &all } else { &subset };
        let mut max_violation = 0.0f64;
        for &j in coords {
            let (g, h) = lik.gradient_hessian(j);
            *updates += 1;
            if !g.is_finite() || !h.is_finite() {
                return ill(beta, f64::NAN, f64::NAN, iterations, trace);
            }
            max_violation = max_violation.max(kkt_violation(priors.per_coef[j], beta[j], g));
            let delta = newton_step(priors.per_coef[j], beta[j], g, h);
            let delta = delta.clamp(-bound[j], bound[j]);
            bound[j] = (2.0 * delta.abs()).max(bound[j] / 2.0);
            if delta != 0.0 {
                beta[j] += delta;
                lik.update(j, delta);
            }
        }
        // From-scratch recomputation once per cycle removes incremental drift.
        lik.set_beta(&beta);
        ll = lik.log_likelihood();
        let new_obj = ll + priors.log_prior(&beta);
        if !new_obj.is_finite() {
            return ill(beta, ll, f64::NAN, iterations, trace);
        }
        trace.push(new_obj);
        let criterion = opts.convergence.criterion(obj, new_obj, max_violation);
        obj = new_obj;
        let small = criterion < opts.tolerance;
        if full && small {
            status = FitStatus::Converged;
            break;
        }
        if full {
            // Work on the non-zero coordinates next, unless that is (nearly) all of them.
            if has_laplace && opts.active_set {
                subset = all
                    .iter()
                    .copied()
                    .filter(|&j| {
                        beta[j] != 0.0 || !matches!(priors.per_coef[j], Prior::Laplace { .. })
                    })
                    .collect();
                full = subset.is_empty() || subset.len() * 10 >= all.len() * 9;
            }
        } else if small {
            full = true;
        }
    }
    CcdResult {
        log_prior: priors.log_prior(&beta),
        beta,
        log_likelihood: ll,
        iterations,
        status,
        objective_trace: trace,
        coordinate_updates: 0,
        seconds: 0.0,
    }
}

/// Violation of the optimality condition of one coordinate with gradient `g` at `beta`.
#[inline]
pub fn kkt_violation(prior: Prior, beta: f64, g: f64) -> f64 {
    match prior {
        Prior::None => g.abs(),
        Prior::Normal { variance } => (g - beta / variance).abs(),
        Prior::Laplace { lambda } => {
            if beta == 0.0 {
                (g.abs() - lambda).max(0.0)
            } else {
                (g - lambda * beta.signum()).abs()
            }
        }
    }
}

/// The (unclipped) Newton step for one coordinate under its prior.
#[inline]
pub fn newton_step(prior: Prior, beta: f64, g: f64, h: f64) -> f64 {
    match prior {
        Prior::None => {
            if h > 0.0 {
                g / h
            } else {
                0.0
            }
        }
        Prior::Normal { variance } => (g - beta / variance) / (h + 1.0 / variance),
        Prior::Laplace { lambda } => {
            if h <= 0.0 {
                return 0.0;
            }
            if beta == 0.0 {
                // Try each direction with subgradient ±λ.
                let up = (g - lambda) / h;
                if up > 0.0 {
                    return up;
                }
                let down = (g + lambda) / h;
                if down < 0.0 {
                    return down;
                }
                0.0
            } else {
                let s = beta.signum();
                let d = (g - lambda * s) / h;
                // Stop at zero rather than crossing it.
                if (beta + d) * s < 0.0 {
                    -beta
                } else {
                    d
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn laplace_step_stops_at_zero() {
        let l = Prior::Laplace { lambda: 1.0 };
        assert_eq!(newton_step(l, 0.0, 0.5, 1.0), 0.0);
        assert!((newton_step(l, 0.0, 3.0, 1.0) - 2.0).abs() < 1e-15);
        assert!((newton_step(l, 0.0, -3.0, 1.0) + 2.0).abs() < 1e-15);
        assert_eq!(newton_step(l, 0.5, -3.0, 1.0), -0.5);
    }
}
