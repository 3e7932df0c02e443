//! The coordinate step of cyclic coordinate descent, behind one trait, so that one driver
//! ([`crate::model::ccd::drive`]: retries, the active set, convergence rules, statuses,
//! cancellation) runs on every backend.
//!
//! A [`CoordinateStepper`] owns β, the trust-region bounds and the likelihood's state; the
//! driver decides which coordinates a cycle visits and when the fit stops. One cycle is one
//! call ([`CoordinateStepper::cycle`]), so a device runs every coordinate's
//! gradient → step → update without a host round trip and returns β and the cycle's
//! largest violation once per cycle (DESIGN.md §8).
//!
//! Implementations:
//!
//! | stepper | where |
//! |---|---|
//! | [`LikelihoodStepper`] | the CPU: any [`Likelihood`] (`model/ccd.rs`'s `cycle`) |
//! | `DeviceStepper` | the CUDA kernels (`crates/cuda/src/device.rs`) |
//! | `EmulatedStepper` | the same kernels on host threads (`kernels/host_emulation/ccd.cpp`, tests of `epifusion-cuda`) |
//!
//! Every stepper computes, for each coordinate j of a cycle in order: g_j and h_j at the
//! current state; the violation [`kkt_violation`] before the step (the cycle returns the
//! largest); Δ = [`newton_step`] clipped to |Δ| ≤ bound_j, then
//! bound_j = max(2|Δ|, bound_j/2); β_j += Δ and the state updated incrementally.

use super::ccd::{cycle, kkt_violation, newton_step};
use super::prior::PriorSet;
use super::Likelihood;
use crate::error::Result;

/// The coordinate step (module docs). Errors are the backend's own (a device error); a
/// non-finite value is not an error but `None` from [`CoordinateStepper::cycle`] or a
/// non-finite number, which the driver turns into [`super::ccd::FitStatus::IllConditioned`].
pub trait CoordinateStepper {
    /// Number of coefficients.
    fn n_coef(&self) -> usize;
    /// Start an attempt: β = `beta`, every trust-region bound = `bound0`, the state computed
    /// from scratch. Returns the log-likelihood there.
    fn start(&mut self, beta: &[f64], bound0: f64) -> Result<f64>;
    /// One pass over `coords`, in order (module docs), with the priors the stepper was made
    /// with. Writes β after the pass into `beta` (also when it fails), adds the coordinate
    /// updates done to `updates`, and returns the largest [`kkt_violation`] seen before each
    /// step, or `None` when a derivative was not finite.
    fn cycle(
        &mut self,
        coords: &[usize],
        beta: &mut [f64],
        updates: &mut u64,
    ) -> Result<Option<f64>>;
    /// Recompute the state from scratch at the current β (incremental updates drift) and
    /// return the log-likelihood.
    fn refresh(&mut self) -> Result<f64>;
    /// g_j for every j in `coords` at the current state; nothing moves.
    fn gradients(&mut self, coords: &[usize]) -> Result<Vec<f64>>;
    /// The fit is over: free scratch and, with `Some(beta)`, leave the state at `beta`
    /// (after an ill-conditioned fit, β0).
    fn finish(&mut self, beta: Option<&[f64]>) -> Result<()>;
}

/// The CPU stepper: coordinate descent on a [`Likelihood`] (rayon inside the likelihood).
pub struct LikelihoodStepper<'a> {
    /// The likelihood, left at the stepper's β.
    pub lik: &'a mut dyn Likelihood,
    priors: &'a PriorSet,
    beta: Vec<f64>,
    bound: Vec<f64>,
}

impl<'a> LikelihoodStepper<'a> {
    /// A stepper on `lik` under `priors`.
    pub fn new(lik: &'a mut dyn Likelihood, priors: &'a PriorSet) -> Self {
        LikelihoodStepper {
            lik,
            priors,
            beta: Vec::new(),
            bound: Vec::new(),
        }
    }
}

impl CoordinateStepper for LikelihoodStepper<'_> {
    fn n_coef(&self) -> usize {
        self.lik.n_coef()
    }

    fn start(&mut self, beta: &[f64], bound0: f64) -> Result<f64> {
        self.beta = beta.to_vec();
        self.bound = vec![bound0; beta.len()];
        self.lik.set_beta(&self.beta);
        Ok(self.lik.log_likelihood())
    }

    fn cycle(
        &mut self,
        coords: &[usize],
        beta: &mut [f64],
        updates: &mut u64,
    ) -> Result<Option<f64>> {
        let measure = |prior, b, g, _h| kkt_violation(prior, b, g);
        let v = cycle(
            &mut *self.lik,
            self.priors,
            &mut self.beta,
            &mut self.bound,
            coords,
            updates,
            measure,
        );
        beta.copy_from_slice(&self.beta);
        Ok(v)
    }

    fn refresh(&mut self) -> Result<f64> {
        self.lik.set_beta(&self.beta);
        Ok(self.lik.log_likelihood())
    }

    fn gradients(&mut self, coords: &[usize]) -> Result<Vec<f64>> {
        Ok(coords
            .iter()
            .map(|&j| self.lik.gradient_hessian(j).0)
            .collect())
    }

    fn finish(&mut self, beta: Option<&[f64]>) -> Result<()> {
        self.lik.release_scratch();
        if let Some(beta) = beta {
            self.lik.set_beta(beta);
        }
        Ok(())
    }
}

/// [`newton_step`] clipped to the trust region, with the bound's update: the step every
/// stepper takes (returns Δ; `bound` is updated in place).
#[inline]
pub fn trust_region_step(
    prior: super::prior::Prior,
    beta: f64,
    g: f64,
    h: f64,
    bound: &mut f64,
) -> f64 {
    let delta = newton_step(prior, beta, g, h).clamp(-*bound, *bound);
    *bound = (2.0 * delta.abs()).max(*bound / 2.0);
    delta
}
