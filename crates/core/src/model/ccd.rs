//! Cyclic coordinate descent (Genkin, Lewis & Madigan's BBR; Cyclops), with Newton–Raphson on
//! the unpenalized block.
//!
//! Maximizes the log posterior f(β) = LL(β) − Σ_j pen_j(β_j) (see [`crate::model::prior`]).
//!
//! **Coordinate descent.** Columns are visited in fixed order; for column j the Newton step on f
//! is
//!
//! Δ = (g_j − pen′(β_j)) / (h_j + pen″(β_j)),
//!
//! clipped to the trust region |Δ| ≤ bound_j, after which bound_j = max(2|Δ|, bound_j/2)
//! (initial bound 2). For the Laplace prior at β_j = 0 the step is tried in each direction with
//! subgradient ±λ and taken only if the directional derivative allows; a step that would cross
//! zero stops at zero.
//!
//! **The default: [`Convergence::Optimality`].** Coordinate descent converges linearly, and
//! slowly on correlated unpenalized covariates (age groups, a treatment with its interactions),
//! so a small change per cycle does not mean a small distance to the optimum. Under the
//! optimality rule (the default of the fit API, [`CcdOptions::fit_default`]):
//!
//! * the free unpenalized coefficients — all of them in a classical fit, the intercept and the
//!   `exclude` ids in a penalized one — form a block solved by **Newton–Raphson on the exact
//!   information matrix with step-halving** (never a step that lowers f), when there are at
//!   most [`CcdOptions::newton_max_block`] of them (500: a dense k×k solve is then cheap); see
//!   `model/newton.rs` for the iteration;
//! * the penalized coefficients (and the unpenalized ones of a larger block) are updated by
//!   coordinate descent as above;
//! * one **iteration** is a CCD cycle over the penalized coefficients followed by one Newton
//!   iteration on the block (the first iteration of a fit with both is a Newton iteration
//!   alone, so that CCD starts from the fitted unpenalized block); a classical fit is therefore
//!   plain Newton–Raphson and its `iterations` are Newton iterations;
//! * **Newton polish**: once a cycle leaves the zero pattern and the signs of the
//!   coordinate-descent coefficients unchanged, and the active set — the block plus the
//!   non-zero Laplace and all Normal-prior coefficients — has at most 32 members, that
//!   iteration's Newton step runs on the whole active set (signs fixed: the objective is smooth
//!   there; a coefficient that would cross zero is set to zero and left to the next cycle).
//!   Coordinate descent then only has to settle the zero pattern; beyond 32 columns the
//!   information matrix costs more than the cycles it saves;
//! * **Active-set Newton** (likelihoods whose information is cheap:
//!   [`Likelihood::polish_max_block`] above 32 — Cox and Fine–Gray, up to 16√G columns for G event
//!   groups, clamped to 64..2048; logistic and Poisson regression, up to 2048 columns, on the
//!   exact information): the
//!   first cycle is one *simultaneous* step (every coordinate's step from the same state,
//!   taken together with step-halving on the objective: one risk-set refresh instead of one
//!   per moving coordinate), the polish runs after *every* cycle, and its Newton iteration
//!   is repeated on the active set
//!   (a coefficient that a step sets to zero leaves it) until the decrement is at most
//!   `tolerance`; then every coordinate-descent coefficient is checked at the returned β
//!   (gradients only, [`Likelihood::gradients`]), and so is the unpenalized block (its
//!   |g_j| ≤ tolerance·√I_jj: a joint matrix that is singular — copies of a column — and
//!   regularized bounds the block's gradient only loosely; a block that fails is solved alone
//!   next). If the check passes the fit has converged;
//!   otherwise one simultaneous step on the violators alone (at most 8 times, then full
//!   cycles again) and the polish follows. The Newton matrix is the likelihood's cheap upper bound
//!   Ĥ ≽ I of the information ([`Likelihood::approximate_information`]; for Cox and
//!   Fine–Gray the risk sets' mean covariate vector averaged over segments of event times),
//!   and after a short step (decrement ≤ 10, `newton::REUSE_BELOW`) the previous step's
//!   factor, or, when a polish round gains columns (at most half of them new), the previous
//!   matrix bordered with the new columns' own curvature on the diagonal. The gradient and the
//!   objective are always exact and step-halving never lowers the objective, so this is an
//!   inexact Newton iteration on a smooth function (signs fixed), which converges linearly
//!   with the ratio ‖I − Ĥ⁻¹I‖ (about 0.02 on the DESIGN §10 data); when a step does not
//!   halve the decrement the matrix is recomputed (approximate, then exact), and unpenalized
//!   coefficients are only declared converged on the exact information. The optimum and
//!   the stopping rule are those of the classic path; what changes is the cost: a cycle with
//!   m moving coordinates costs O(m·G + nnz) in risk-set refreshes, a Newton step
//!   O(N + G + nnz_active + segments·k²) with no refresh at all. (`active_newton: false`
//!   keeps the classic polish, for comparisons.)
//! * **Anderson acceleration** of the coordinate-descent coefficients (Bertrand & Massias,
//!   2021): after every three cycles with the same zero pattern and signs that have not yet
//!   met the tolerance, the iterates β₀, β₁, β₂ are combined as c₀β₁ + c₁β₂ with the weights
//!   (c₀ + c₁ = 1) that minimize ‖c₀(β₁ − β₀) + c₁(β₂ − β₁)‖, and the combination replaces β
//!   only when it raises the objective (one extra likelihood evaluation). On the DESIGN §10
//!   Cox recipe it halves the cycles the KKT tolerance needs. No trial is made when the last
//!   step is shorter than a tenth of the one before (‖β₂ − β₁‖ < 0.1‖β₁ − β₀‖): the next cycle
//!   then gains nearly all an extrapolation could, and the trial point (a full state
//!   computation and a log-likelihood) costs more than it saves — on the DESIGN §10 SCCS fit
//!   both trials were of that kind and rejected, 20 % of the fit's time;
//! * the fit has **converged** when, in the same iteration, (a) the block's Newton decrement
//!   δ = √(gᵀI⁻¹g) was at most `tolerance` — every unpenalized coefficient then is within
//!   `tolerance` standard errors of its optimum given the others, and the final Newton step
//!   (taken) brings it to O(δ²) — and (b) a full CCD cycle saw no scaled optimality violation
//!   ([`scaled_violation`]) above `tolerance`, or its largest violation v, times its ratio
//!   r = v / v_prev to the previous full cycle's, predicts that the next would see none
//!   (v·r ≤ `tolerance`: linear convergence leaves about that much at the cycle's end), and
//!   (c) a check of every coordinate descent coefficient at the returned β (gradients
//!   recomputed, nothing moved) finds no violation above `tolerance` — (c) alone decides; the
//!   prediction only runs it one cycle earlier (on the DESIGN §10 SCCS fit: 5 cycles instead
//!   of 6, and a failed check costs one gradient pass) —
//!   under the active-set Newton polish, (a) on the block and the whole active set plus (c)
//!   alone, (c) being the KKT conditions themselves. For a
//!   Laplace prior the scaled violation is max(0, |g_j| − λ)/λ at β_j = 0 and
//!   |g_j − λ sign β_j| / max(1, λ) otherwise: converged means |g_j| ≤ λ(1 + tol) at zero and
//!   |g_j − λ sign β_j| ≤ tol·max(1, λ) elsewhere, DESIGN.md §9's KKT conditions.
//!
//! A fit that cannot meet its rule reports [`FitStatus::MaxIterations`] (also when the Newton
//! block stalls: no step length increases f), never `Converged`; non-finite values report
//! [`FitStatus::IllConditioned`]. The fit API ([`crate::fit`]) then checks the unpenalized
//! coefficients for estimates that are not finite (separation, monotone likelihood) and reports
//! [`FitStatus::NoFiniteMle`] for them ([`crate::model::degenerate`]).
//!
//! **The classic rules** (`objective`, `gradient`) run coordinate descent alone on every free
//! coefficient, exactly as before the optimality rule existed. They are the one driver of every
//! backend, [`drive`], over a [`CoordinateStepper`] (`model/stepper.rs`: the CPU's
//! [`LikelihoodStepper`], the CUDA device's stepper, its host emulation), which also runs
//! [`Convergence::Optimality`] as `gradient` (it has no Newton block):
//!
//! * [`Convergence::Objective`]: relative change |f_new − f_old| / (|f_new| + 1) of the log
//!   posterior after a full cycle. This is Cyclops' `"lange"` convergence type. (Cyclops'
//!   *default* type, `"gradient"`, applies the same relative change to Σ_k y_k η_k instead of
//!   the log posterior — `getGradientObjective` in its `ModelSpecifics` — and is not
//!   implemented here.) It stops early: a cycle that changes f by 1e-6 relative can leave
//!   coefficients 1e-3 from the optimum.
//! * [`Convergence::Gradient`]: the largest unscaled KKT violation seen in the cycle
//!   ([`kkt_violation`]), confirmed at the returned β (gradients recomputed, nothing moved:
//!   later steps of a cycle move the gradients of earlier coordinates).
//!
//! | option | default (fit API) | range |
//! |---|---|---|
//! | `convergence` | optimality | `optimality` (Newton block + scaled KKT, above), `objective`, `gradient` |
//! | `tolerance` | 1e-6 | > 0; threshold of the convergence rule |
//! | `max_iterations` | 1000 | ≥ 1 iterations (Newton iterations and/or full CCD cycles) |
//! | `newton_max_block` | 500 | largest unpenalized block solved by Newton–Raphson (0: never) |
//! | `polish_max_block` | 32 | largest active set polished by Newton–Raphson (0: never; regularization paths, whose warm starts leave little to polish, use 0) |
//! | `initial_bound` | 2 | > 0 trust-region radius |
//! | `max_retries` | 5 | on NaN/∞ the fit restarts with the initial bound × 0.1 |
//! | `active_set` | true | with a Laplace prior, cycles over the non-zero coefficients only between full cycles (convergence is declared only after a full cycle), when that saves enough (below) |
//! | `active_newton` | true | the active-set Newton polish where the likelihood supports it (above); false: the classic polish |
//!
//! **When the active set is used.** A cycle over the active set skips the zero coefficients'
//! gradients, but a coefficient that should leave zero is only found at the next full cycle,
//! and the active set is then fitted again: on the DESIGN §10 SCCS benchmark (178 of 1000
//! coefficients non-zero, the zero ones the small columns) that took 11 cycles where full
//! cycles take 5. Under [`Convergence::Optimality`] the active set is therefore used only when
//! its zero coordinates carry at least [`ACTIVE_SET_MIN_SAVING`] of a full cycle's gradient
//! work, weighed by [`Likelihood::coordinate_cost`] (entries per column where the likelihood
//! knows them, else one per coordinate); otherwise every cycle is full.
//!
//! [`CcdOptions::default`] is the classic configuration (`objective` rule) that drivers and
//! tests running coordinate descent alone start from; the fit API starts from
//! [`CcdOptions::fit_default`] (`optimality`).
//!
//! The likelihood's state is recomputed from scratch at the start of every cycle (incremental
//! updates drift; the conditional Poisson likelihood re-sums its denominators instead, and
//! skips that after cycles of small steps, whose additive updates cannot cancel — see
//! `model/sccs.rs`, "Denominators"), and the reported log-likelihood is computed from that
//! state. Nothing here
//! depends on the number of threads: the Newton block uses the likelihood's own
//! (thread-independent) gradient and information and a sequential dense solve.

use std::time::Instant;

use super::newton::{self, Newton, NewtonStep, Point};
use super::prior::{Prior, PriorSet};
use super::stepper::{trust_region_step, CoordinateStepper, LikelihoodStepper};
use super::Likelihood;
use crate::error::{Error, Result};

/// Outcome of a fit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FitStatus {
    /// The convergence rule is met (see the module docs for each rule).
    Converged,
    /// Stopped at the iteration limit.
    MaxIterations,
    /// NaN/∞ persisted through every retry.
    IllConditioned,
    /// The optimizer stopped, but some unpenalized coefficient has no finite maximum-likelihood
    /// estimate: the likelihood keeps increasing as it goes to ±∞ (separation in logistic
    /// regression, monotone likelihood in Cox / Fine–Gray, an all-zero outcome). Set by the fit
    /// API after the optimization ([`crate::model::degenerate`]); the result's notes name the
    /// coefficients.
    NoFiniteMle,
}

impl FitStatus {
    /// Lower-case name used in result tables.
    pub fn name(self) -> &'static str {
        match self {
            FitStatus::Converged => "converged",
            FitStatus::MaxIterations => "max_iterations",
            FitStatus::IllConditioned => "ill_conditioned",
            FitStatus::NoFiniteMle => "no_finite_mle",
        }
    }
}

/// Stopping rule (see the module docs).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Convergence {
    /// Relative change of the objective after a full cycle: Cyclops' `"lange"` convergence
    /// type (Cyclops' default `"gradient"` type measures the change of Σ y η instead). The
    /// default of [`CcdOptions::default`], the classic coordinate-descent configuration; it
    /// can stop far from the optimum.
    #[default]
    Objective,
    /// Largest violation of the optimality (KKT) conditions over the cycle's coordinates:
    /// |g_j − pen′(β_j)| for β_j ≠ 0 or smooth priors, max(0, |g_j| − λ) at zero (coordinate
    /// descent alone, unscaled).
    Gradient,
    /// The fit API's default: Newton–Raphson on the unpenalized block (decrement ≤ tolerance)
    /// plus scaled KKT conditions of the coordinate-descent coefficients, checked at the
    /// returned β ([`scaled_violation`]). Drivers that have no Newton block (the CUDA
    /// backend) read it, through [`Convergence::criterion`], as `gradient` and must finish
    /// with [`fit`] on the host.
    Optimality,
}

impl Convergence {
    /// The value compared with the tolerance after a cycle that moved the objective from
    /// `old` to `new` with largest KKT violation `violation`.
    /// [`Convergence::Optimality`] gives the violation too (a driver without a Newton block
    /// runs it as `gradient`).
    #[inline]
    pub fn criterion(self, old: f64, new: f64, violation: f64) -> f64 {
        match self {
            Convergence::Objective => (new - old).abs() / (new.abs() + 1.0),
            Convergence::Gradient | Convergence::Optimality => violation,
        }
    }

    /// Parse `optimality`, `objective` or `gradient`.
    pub fn parse(s: &str) -> Result<Self> {
        match s.to_ascii_lowercase().as_str() {
            "optimality" | "newton" => Ok(Convergence::Optimality),
            "objective" | "lange" => Ok(Convergence::Objective),
            "gradient" | "kkt" => Ok(Convergence::Gradient),
            other => Err(Error::option(
                "convergence",
                format!("unknown `{other}`; expected optimality, objective or gradient"),
            )),
        }
    }

    /// Lower-case name (as parsed).
    pub fn name(self) -> &'static str {
        match self {
            Convergence::Objective => "objective",
            Convergence::Gradient => "gradient",
            Convergence::Optimality => "optimality",
        }
    }
}

/// CCD options; see the module docs for defaults and ranges.
#[derive(Debug, Clone)]
pub struct CcdOptions {
    /// Stopping rule.
    pub convergence: Convergence,
    /// Threshold of the convergence rule.
    pub tolerance: f64,
    /// Maximum number of iterations (full CCD cycles; Newton iterations of the block).
    pub max_iterations: usize,
    /// Initial trust-region bound.
    pub initial_bound: f64,
    /// Retries with a 10× smaller initial bound after NaN/∞.
    pub max_retries: usize,
    /// With a Laplace prior, cycle over the non-zero coefficients between full cycles.
    pub active_set: bool,
    /// Under [`Convergence::Optimality`], the largest number of free unpenalized coefficients
    /// solved as one block by Newton–Raphson (above it, and with 0, they join coordinate
    /// descent). Ignored by the other rules.
    pub newton_max_block: usize,
    /// Under [`Convergence::Optimality`], the largest active set (block plus non-zero
    /// coordinate-descent coefficients) that the Newton polish runs on (0: no polish).
    pub polish_max_block: usize,
    /// Checked once per cycle: a cancelled fit returns [`Error::Cancelled`].
    pub cancel: crate::cancel::CancelToken,
    /// Under [`Convergence::Optimality`], on likelihoods with a cheap information matrix
    /// ([`Likelihood::polish_max_block`] above 32: Cox, Fine–Gray), the **active-set Newton**
    /// polish: Newton–Raphson on the whole active set (up to the likelihood's limit), repeated
    /// until it converges, then one check of every coordinate (module docs). `false` keeps the
    /// classic polish (at most 32 columns, one Newton step per cycle) — for comparisons.
    pub active_newton: bool,
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
            newton_max_block: 500,
            polish_max_block: newton::POLISH_MAX_BLOCK,
            cancel: crate::cancel::CancelToken::default(),
            active_newton: true,
        }
    }
}

impl CcdOptions {
    /// The fit API's defaults ([`crate::fit::FitOptions::new`]): [`Convergence::Optimality`],
    /// tolerance 1e-6, 1000 iterations, Newton block up to 500 coefficients. (The `Default`
    /// impl keeps the classic `objective` rule for drivers and tests of coordinate descent
    /// alone.)
    pub fn fit_default() -> Self {
        CcdOptions {
            convergence: Convergence::Optimality,
            ..CcdOptions::default()
        }
    }

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
    /// Iterations run (in the final attempt): full CCD cycles, and under
    /// [`Convergence::Optimality`] Newton iterations of the unpenalized block (one per
    /// iteration; a classical fit is all Newton iterations).
    pub iterations: usize,
    /// Status.
    pub status: FitStatus,
    /// Objective after each iteration of the final attempt (never decreasing, up to rounding).
    pub objective_trace: Vec<f64>,
    /// Coordinate updates performed (all attempts).
    pub coordinate_updates: u64,
    /// Wall time in seconds.
    pub seconds: f64,
}

/// Maximize LL − penalty from `beta0` under `opts.convergence` (module docs: coordinate descent,
/// plus Newton–Raphson on the unpenalized block under [`Convergence::Optimality`]).
/// Coefficients with `fixed[j]` stay at `beta0[j]` (profile likelihood); warm starts are any
/// `beta0`. The likelihood is left at the returned β.
pub fn fit(
    lik: &mut dyn Likelihood,
    priors: &PriorSet,
    beta0: &[f64],
    fixed: Option<&[bool]>,
    opts: &CcdOptions,
) -> Result<CcdResult> {
    let mut stepper = LikelihoodStepper::new(lik, priors);
    if opts.convergence == Convergence::Optimality {
        check(&stepper, priors, beta0, opts)?;
        return with_retries(&mut stepper, beta0, opts, |s, bound0, updates| {
            Ok(optimality_attempt(
                &mut *s.lik,
                priors,
                beta0,
                fixed,
                opts,
                bound0,
                updates,
            ))
        });
    }
    drive(&mut stepper, priors, beta0, fixed, opts)
}

/// The coordinate-descent driver of every backend: maximize LL − penalty from `beta0` by
/// cycles of `stepper` under the classic rules (module docs; [`Convergence::Optimality`],
/// which needs a Newton block, is read as `gradient`), with the active set, retries on NaN/∞,
/// cancellation and the final status. Coefficients with `fixed[j]` stay at `beta0[j]`.
/// `stepper` must have been made with `priors`; it is left at the returned β (at `beta0`
/// after an ill-conditioned fit).
pub fn drive(
    stepper: &mut dyn CoordinateStepper,
    priors: &PriorSet,
    beta0: &[f64],
    fixed: Option<&[bool]>,
    opts: &CcdOptions,
) -> Result<CcdResult> {
    check(stepper, priors, beta0, opts)?;
    with_retries(stepper, beta0, opts, |s, bound0, updates| {
        attempt(s, priors, beta0, fixed, opts, bound0, updates)
    })
}

/// The options and the sizes of `beta0` and `priors`.
fn check(
    stepper: &dyn CoordinateStepper,
    priors: &PriorSet,
    beta0: &[f64],
    opts: &CcdOptions,
) -> Result<()> {
    opts.check()?;
    let p = stepper.n_coef();
    if beta0.len() != p || priors.per_coef.len() != p {
        return Err(Error::FitFailed(format!(
            "internal: {p} coefficients but beta0 has {} and priors {}",
            beta0.len(),
            priors.per_coef.len()
        )));
    }
    Ok(())
}

/// Attempts until one is not ill-conditioned, the initial bound × 0.1 each time (at most
/// `max_retries` retries); a cancelled fit stops after its attempt. Leaves `stepper` at the
/// result (at `beta0` when every attempt was ill-conditioned: never NaN with a success
/// status) and fills in the updates (all attempts) and the wall time.
fn with_retries<S: CoordinateStepper + ?Sized>(
    stepper: &mut S,
    beta0: &[f64],
    opts: &CcdOptions,
    mut attempt: impl FnMut(&mut S, f64, &mut u64) -> Result<CcdResult>,
) -> Result<CcdResult> {
    let started = Instant::now();
    let mut updates = 0u64;
    let mut bound0 = opts.initial_bound;
    let mut last = None;
    for _attempt in 0..=opts.max_retries {
        let r = attempt(stepper, bound0, &mut updates)?;
        opts.cancel.check()?;
        let ill = r.status == FitStatus::IllConditioned;
        last = Some(r);
        if !ill {
            break;
        }
        bound0 *= 0.1;
    }
    let mut r = last.ok_or_else(|| Error::FitFailed("internal: no attempt ran".into()))?;
    let ill = r.status == FitStatus::IllConditioned;
    stepper.finish(ill.then_some(beta0))?;
    r.coordinate_updates = updates;
    r.seconds = started.elapsed().as_secs_f64();
    Ok(r)
}

/// One attempt under the classic rules (module docs), from `beta0` with initial bound
/// `bound0`.
fn attempt(
    stepper: &mut dyn CoordinateStepper,
    priors: &PriorSet,
    beta0: &[f64],
    fixed: Option<&[bool]>,
    opts: &CcdOptions,
    bound0: f64,
    updates: &mut u64,
) -> Result<CcdResult> {
    let p = beta0.len();
    let mut beta = beta0.to_vec();
    let mut ll = stepper.start(&beta, bound0)?;
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
        return Ok(ill(beta, ll, f64::NAN, 0, trace));
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
        let Some(max_violation) = stepper.cycle(coords, &mut beta, updates)? else {
            return Ok(ill(beta, f64::NAN, f64::NAN, iterations, trace));
        };
        // From-scratch recomputation once per cycle removes incremental drift.
        ll = stepper.refresh()?;
        let new_obj = ll + priors.log_prior(&beta);
        if !new_obj.is_finite() {
            return Ok(ill(beta, ll, f64::NAN, iterations, trace));
        }
        trace.push(new_obj);
        let criterion = opts.convergence.criterion(obj, new_obj, max_violation);
        obj = new_obj;
        let small = criterion < opts.tolerance;
        // The gradient rule's violations were seen before each step of the cycle; the ones at
        // the returned β (later steps move earlier gradients) must meet it too.
        if full && small {
            let confirmed = if opts.convergence == Convergence::Objective {
                Some(true)
            } else {
                let g = stepper.gradients(&all)?;
                let mut worst = 0.0f64;
                let mut finite = true;
                for (&j, &gj) in all.iter().zip(&g) {
                    if !gj.is_finite() {
                        finite = false;
                        break;
                    }
                    worst = worst.max(kkt_violation(priors.per_coef[j], beta[j], gj));
                }
                finite.then_some(worst < opts.tolerance)
            };
            match confirmed {
                Some(true) => {
                    status = FitStatus::Converged;
                    break;
                }
                Some(false) => {}
                None => return Ok(ill(beta, ll, f64::NAN, iterations, trace)),
            }
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
    Ok(CcdResult {
        log_prior: priors.log_prior(&beta),
        beta,
        log_likelihood: ll,
        iterations,
        status,
        objective_trace: trace,
        coordinate_updates: 0,
        seconds: 0.0,
    })
}

/// One pass of coordinate updates over `coords` (trust region, priors; module docs). Returns the
/// largest `measure(prior, β_j, g_j, h_j)` seen before each coordinate's step, or `None` when a
/// derivative is not finite.
pub(crate) fn cycle(
    lik: &mut dyn Likelihood,
    priors: &PriorSet,
    beta: &mut [f64],
    bound: &mut [f64],
    coords: &[usize],
    updates: &mut u64,
    measure: impl Fn(Prior, f64, f64, f64) -> f64,
) -> Option<f64> {
    let mut worst = 0.0f64;
    for &j in coords {
        let (g, h) = lik.gradient_hessian(j);
        *updates += 1;
        if !g.is_finite() || !h.is_finite() {
            return None;
        }
        let prior = priors.per_coef[j];
        worst = worst.max(measure(prior, beta[j], g, h));
        let delta = trust_region_step(prior, beta[j], g, h, &mut bound[j]);
        if delta != 0.0 {
            beta[j] += delta;
            lik.update(j, delta);
        }
    }
    Some(worst)
}

/// The first pass of the active-set Newton polish: every coordinate's step (trust region,
/// priors: as in [`cycle`]) from the same state, taken together with step-halving on the
/// objective (never lowering it) — one refresh instead of one per moving coordinate. The
/// gradients come from [`Likelihood::gradients`]; curvatures are computed for the
/// coordinates that move and those whose violation needs it. Returns the largest scaled
/// violation before the step (as [`cycle`] does); the likelihood is left at the new β.
fn simultaneous_step(
    lik: &mut dyn Likelihood,
    priors: &PriorSet,
    beta: &mut [f64],
    bound: &mut [f64],
    coords: &[usize],
    obj: f64,
    updates: &mut u64,
) -> Option<f64> {
    let g = lik.gradients(coords);
    let needs_h = |j: usize, gj: f64| match priors.per_coef[j] {
        Prior::Laplace { lambda } => beta[j] != 0.0 || gj.abs() > lambda,
        Prior::Normal { .. } | Prior::None => true,
    };
    // The curvatures, all at the same state: one batch (the likelihood may walk the columns
    // in parallel).
    let curved: Vec<usize> = coords
        .iter()
        .zip(&g)
        .filter(|&(&j, &gj)| needs_h(j, gj))
        .map(|(&j, _)| j)
        .collect();
    let mut hs = lik.gradient_hessians(&curved).into_iter().map(|(_, h)| h);
    let mut worst = 0.0f64;
    let mut moves: Vec<(usize, f64)> = Vec::new();
    for (&j, &gj) in coords.iter().zip(&g) {
        *updates += 1;
        if !gj.is_finite() {
            return None;
        }
        let prior = priors.per_coef[j];
        let needs_h = needs_h(j, gj);
        let h = if needs_h {
            let h = hs.next().unwrap_or(f64::NAN);
            if !h.is_finite() {
                return None;
            }
            h
        } else {
            0.0
        };
        worst = worst.max(scaled_violation(prior, beta[j], gj, h));
        if !needs_h {
            continue;
        }
        let delta = trust_region_step(prior, beta[j], gj, h, &mut bound[j]);
        if delta != 0.0 {
            moves.push((j, delta));
        }
    }
    let mut t = 1.0;
    for _ in 0..30 {
        let mut trial = beta.to_vec();
        for &(j, d) in &moves {
            trial[j] += t * d;
        }
        lik.set_beta(&trial);
        let f = lik.log_likelihood() + priors.log_prior(&trial);
        if f.is_finite() && f >= obj {
            beta.copy_from_slice(&trial);
            return Some(worst);
        }
        t *= 0.5;
    }
    lik.set_beta(beta);
    Some(worst)
}

/// The block's largest scaled violation when its last Newton step was `joint` with active-set
/// columns (0 otherwise: alone, its exact decrement bounds every |g_j| / √I_jj by
/// Cauchy–Schwarz, which a joint, possibly regularized, matrix does not).
fn block_violation(
    lik: &mut dyn Likelihood,
    priors: &PriorSet,
    beta: &[f64],
    block: &[usize],
    joint: bool,
) -> Option<f64> {
    if joint {
        worst_scaled_violation(lik, priors, beta, block)
    } else {
        Some(0.0)
    }
}

/// The largest [`scaled_violation`] over `coords` at the likelihood's current state (which must
/// be at `beta`), nothing moved; `None` when a derivative is not finite.
fn worst_scaled_violation(
    lik: &mut dyn Likelihood,
    priors: &PriorSet,
    beta: &[f64],
    coords: &[usize],
) -> Option<f64> {
    scaled_violations(
        lik,
        priors,
        beta,
        coords,
        f64::INFINITY,
        &mut Vec::new(),
        false,
    )
}

/// [`worst_scaled_violation`], also collecting the coordinates whose violation exceeds `tol`.
/// With `batch`, the gradients of the Laplace-prior coordinates (whose violation needs no
/// curvature) come from [`Likelihood::gradients`].
fn scaled_violations(
    lik: &mut dyn Likelihood,
    priors: &PriorSet,
    beta: &[f64],
    coords: &[usize],
    tol: f64,
    violators: &mut Vec<usize>,
    batch: bool,
) -> Option<f64> {
    let laplace = |j: usize| matches!(priors.per_coef[j], Prior::Laplace { .. });
    let batched: Vec<usize> = if batch {
        coords.iter().copied().filter(|&j| laplace(j)).collect()
    } else {
        Vec::new()
    };
    let mut batched_g = lik.gradients(&batched).into_iter();
    let mut worst = 0.0f64;
    for &j in coords {
        let (g, h) = if batch && laplace(j) {
            (batched_g.next().unwrap_or(f64::NAN), 0.0)
        } else {
            lik.gradient_hessian(j)
        };
        if !g.is_finite() || !h.is_finite() {
            return None;
        }
        let v = scaled_violation(priors.per_coef[j], beta[j], g, h);
        if v > tol {
            violators.push(j);
        }
        worst = worst.max(v);
    }
    Some(worst)
}

/// One attempt under [`Convergence::Optimality`] (module docs).
fn optimality_attempt(
    lik: &mut dyn Likelihood,
    priors: &PriorSet,
    beta0: &[f64],
    fixed: Option<&[bool]>,
    opts: &CcdOptions,
    bound0: f64,
    updates: &mut u64,
) -> CcdResult {
    let p = beta0.len();
    let tol = opts.tolerance;
    let mut beta = beta0.to_vec();
    let mut bound = vec![bound0; p];
    lik.set_beta(&beta);
    let mut ll = lik.log_likelihood();
    let mut obj = ll + priors.log_prior(&beta);
    let mut trace = Vec::new();
    let ill = |beta: Vec<f64>, it: usize, trace: Vec<f64>| CcdResult {
        beta,
        log_likelihood: f64::NAN,
        log_prior: f64::NAN,
        iterations: it,
        status: FitStatus::IllConditioned,
        objective_trace: trace,
        coordinate_updates: 0,
        seconds: 0.0,
    };
    if !obj.is_finite() {
        return ill(beta, 0, trace);
    }
    let block = newton::block_of(priors, fixed, opts);
    let mut newton = Newton::default();
    // Coordinate descent on every other free coefficient.
    let coords: Vec<usize> = (0..p)
        .filter(|&j| fixed.is_none_or(|f| !f[j]) && !block.contains(&j))
        .collect();
    let mut anderson = Anderson::default();
    // Signs of the coordinate-descent coefficients after the previous cycle.
    let mut last_signs: Option<Vec<i8>> = None;
    let has_laplace = coords
        .iter()
        .any(|&j| matches!(priors.per_coef[j], Prior::Laplace { .. }));
    let mut status = FitStatus::MaxIterations;
    let mut iterations = 0;
    let mut full = true;
    let mut subset: Vec<usize> = Vec::new();
    // The active-set Newton polish (module docs) where the likelihood makes it cheap.
    let repeat_polish = opts.active_newton && lik.polish_max_block() > newton::POLISH_MAX_BLOCK;
    // Polish rounds whose final check found violations.
    let mut failed_rounds = 0usize;
    // The largest scaled violation of the last cycle when it was full (`None` after a cycle
    // over a subset): with the current one, it predicts the next (below).
    let mut last_full_violation: Option<f64> = None;
    // Whether a cycle has run (the first one, under the active-set Newton polish, is one
    // simultaneous step).
    let mut cycled = false;
    // The next cycle visits the violators of a polish round's check.
    let mut violators_next = false;
    // The next Newton step solves the block alone: a final check found it off its optimum
    // after a joint step with the active set (whose matrix can be singular — copies of a
    // column — and regularized: its decrement then says little about the block).
    let mut block_alone_next = false;
    // The active-set Newton's own limit where it runs; else the options' (paths turn the
    // classic polish off).
    let polish_max = if repeat_polish {
        lik.polish_max_block()
    } else {
        opts.polish_max_block
    };
    while iterations < opts.max_iterations {
        if opts.cancel.is_cancelled() {
            break;
        }
        iterations += 1;
        // With a block, the first iteration fits the block alone (CCD then starts from it).
        let run_cycle = !coords.is_empty() && (iterations > 1 || block.is_empty());
        let cycle_was_full = full;
        let mut cycle_violation = 0.0;
        if run_cycle {
            let cs: &[usize] = if full { &coords } else { &subset };
            let simultaneous = repeat_polish && (!cycled || violators_next);
            cycled = true;
            violators_next = false;
            let step = if simultaneous {
                simultaneous_step(lik, priors, &mut beta, &mut bound, cs, obj, updates)
            } else {
                cycle(
                    lik,
                    priors,
                    &mut beta,
                    &mut bound,
                    cs,
                    updates,
                    scaled_violation,
                )
            };
            let Some(v) = step else {
                return ill(beta, iterations, trace);
            };
            cycle_violation = v;
            lik.set_beta(&beta);
            ll = lik.log_likelihood();
            obj = ll + priors.log_prior(&beta);
            if !obj.is_finite() {
                return ill(beta, iterations, trace);
            }
            if ANDERSON_DEPTH > 0 && cycle_violation > tol {
                anderson.push(&coords, &beta);
                if let Some(extra) = anderson.extrapolate(&coords, &beta) {
                    // The state at β is kept where the likelihood can (a rejected point then
                    // costs one state computation, not two).
                    let kept = lik.checkpoint();
                    lik.set_beta(&extra);
                    let ll_e = lik.log_likelihood();
                    let obj_e = ll_e + priors.log_prior(&extra);
                    let accept = obj_e.is_finite() && obj_e > obj;
                    lik.end_checkpoint(!accept);
                    if accept {
                        beta = extra;
                        ll = ll_e;
                        obj = obj_e;
                    } else if !kept {
                        lik.set_beta(&beta);
                    }
                    anderson.clear();
                }
            }
        }
        // The Newton columns: the block, plus the active set (polish) once a cycle has left
        // the zero pattern and the signs unchanged, when that set is small — after every
        // cycle under the active-set Newton polish.
        let mut cols = block.clone();
        let mut polishing = false;
        if run_cycle {
            let signs: Vec<i8> = coords
                .iter()
                .map(|&j| {
                    if beta[j] == 0.0 {
                        0
                    } else {
                        beta[j].signum() as i8
                    }
                })
                .collect();
            let stable = last_signs.as_ref() == Some(&signs) || repeat_polish;
            last_signs = Some(signs);
            if stable && !std::mem::take(&mut block_alone_next) {
                let active = coords
                    .iter()
                    .copied()
                    .filter(|&j| match priors.per_coef[j] {
                        Prior::Laplace { .. } => beta[j] != 0.0,
                        Prior::Normal { .. } | Prior::None => true,
                    });
                let mut all: Vec<usize> = block.iter().copied().chain(active).collect();
                if all.len() > block.len() && all.len() <= polish_max {
                    all.sort_unstable();
                    cols = all;
                    polishing = repeat_polish;
                }
            }
        }
        let mut block_done = true;
        let mut polished = false;
        let mut stop = false;
        // Whether the block is solved together with active-set columns.
        let joint = !block.is_empty() && cols.len() > block.len();
        while !cols.is_empty() {
            let at = Point {
                beta: &mut beta,
                ll: &mut ll,
                obj: &mut obj,
            };
            let step = newton.step(lik, priors, &cols, at, tol, polishing);
            *updates += cols.len() as u64;
            match step {
                NewtonStep::IllConditioned if trace.is_empty() => {
                    return ill(beta, iterations, trace)
                }
                NewtonStep::IllConditioned => {
                    // The objective is finite at β (an accepted point) but its derivatives
                    // overflow there: a coefficient has run off towards infinity (monotone
                    // likelihood). Stop at β; the rule cannot be met (the fit API then checks
                    // for estimates that are not finite, `model/degenerate.rs`).
                    block_done = false;
                    stop = true;
                    break;
                }
                NewtonStep::Converged => {
                    block_done = true;
                    polished = polishing;
                    break;
                }
                NewtonStep::Moved => block_done = false,
                NewtonStep::Stalled => {
                    block_done = false;
                    // Nothing else can move: the rule cannot be met.
                    stop = coords.is_empty();
                    break;
                }
            }
            if !polishing || iterations >= opts.max_iterations || opts.cancel.is_cancelled() {
                break;
            }
            // Active-set Newton: another iteration on the active set, which loses the
            // coefficients the step set to zero (the final check decides about them).
            iterations += 1;
            trace.push(obj);
            cols.retain(|&j| {
                beta[j] != 0.0 || !matches!(priors.per_coef[j], Prior::Laplace { .. })
            });
        }
        trace.push(obj);
        if stop {
            break;
        }
        if polished {
            // Newton converged on the block and every non-zero coefficient: check every
            // coordinate-descent coefficient at the returned β (nothing moved).
            let mut violators = Vec::new();
            let Some(v) = scaled_violations(lik, priors, &beta, &coords, tol, &mut violators, true)
            else {
                return ill(beta, iterations, trace);
            };
            let Some(vb) = block_violation(lik, priors, &beta, &block, joint) else {
                return ill(beta, iterations, trace);
            };
            if v <= tol && vb <= tol {
                status = FitStatus::Converged;
                break;
            }
            block_alone_next = vb > tol;
            failed_rounds += 1;
            if failed_rounds <= MAX_REPOLISH {
                // One simultaneous step on the violators, then the polish again.
                subset = violators;
                full = false;
                violators_next = true;
            } else {
                full = true;
            }
            continue;
        }
        // A full cycle's violation v, shrunk once more by its ratio r to the previous full
        // cycle's, predicts what the next cycle would see: when v·r is within `tol`, the exact
        // check at the returned β (below) runs now instead of after one more cycle. A check
        // that fails costs one gradient pass; one that passes saves a cycle.
        let predicted_within = run_cycle
            && cycle_was_full
            && last_full_violation.is_some_and(|prev| {
                prev > 0.0
                    && cycle_violation < prev
                    && cycle_violation * (cycle_violation / prev) <= tol
            });
        if run_cycle {
            last_full_violation = cycle_was_full.then_some(cycle_violation);
        }
        let cycle_done = coords.is_empty()
            || (run_cycle && cycle_was_full && (cycle_violation <= tol || predicted_within));
        if block_done && cycle_done {
            // Confirm at the returned β (the block's final step and the cycle's own steps
            // moved it after the violations were measured).
            let Some(v) = worst_scaled_violation(lik, priors, &beta, &coords) else {
                return ill(beta, iterations, trace);
            };
            let Some(vb) = block_violation(lik, priors, &beta, &block, joint) else {
                return ill(beta, iterations, trace);
            };
            if v <= tol && vb <= tol {
                status = FitStatus::Converged;
                break;
            }
            block_alone_next = vb > tol;
            full = true;
            continue;
        }
        if !run_cycle {
            continue;
        }
        if full {
            if has_laplace && opts.active_set {
                subset = coords
                    .iter()
                    .copied()
                    .filter(|&j| {
                        beta[j] != 0.0 || !matches!(priors.per_coef[j], Prior::Laplace { .. })
                    })
                    .collect();
                full = subset.is_empty() || !active_set_pays(lik, &coords, &subset);
            }
        } else if cycle_violation <= tol {
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

/// The least fraction of a full cycle's gradient work ([`Likelihood::coordinate_cost`]) the
/// zero coordinates must carry for cycles over the active set to be used (module docs).
pub const ACTIVE_SET_MIN_SAVING: f64 = 1.0 / 3.0;

/// Whether cycling over `subset` (the active set, a subset of `coords`) saves at least
/// [`ACTIVE_SET_MIN_SAVING`] of a full cycle's gradient work.
fn active_set_pays(lik: &dyn Likelihood, coords: &[usize], subset: &[usize]) -> bool {
    let cost = |cs: &[usize]| -> f64 { cs.iter().map(|&j| lik.coordinate_cost(j)).sum() };
    let (all, active) = (cost(coords), cost(subset));
    // Not finite or not positive (no costs): the classic rule, by count.
    if !(all.is_finite() && all > 0.0) {
        return subset.len() * 10 < coords.len() * 9;
    }
    all - active >= ACTIVE_SET_MIN_SAVING * all
}

/// Polish rounds whose final check failed after which the violators are visited alone and
/// the polish repeated at once; beyond it, full cycles as usual.
const MAX_REPOLISH: usize = 8;

/// Iterates kept for Anderson extrapolation of the coordinate-descent coefficients (0: off).
const ANDERSON_DEPTH: usize = 2;

/// No Anderson trial when the last coordinate-descent step is shorter than this fraction of
/// the step before it ([`Anderson::extrapolate`]).
const ANDERSON_FAST: f64 = 0.1;

/// Anderson acceleration of coordinate descent (Bertrand & Massias 2021): after
/// `ANDERSON_DEPTH` + 1 cycles with the same zero pattern and signs, the iterates β_0 … β_m are
/// combined as Σ c_i β_{i+1} with the weights c (Σ c_i = 1) that minimize ‖Σ c_i (β_{i+1} −
/// β_i)‖; the combination is kept only when it raises the objective.
#[derive(Debug, Default)]
struct Anderson {
    history: Vec<Vec<f64>>,
    signs: Vec<i8>,
}

impl Anderson {
    fn clear(&mut self) {
        self.history.clear();
    }

    fn push(&mut self, coords: &[usize], beta: &[f64]) {
        let signs: Vec<i8> = coords
            .iter()
            .map(|&j| {
                if beta[j] == 0.0 {
                    0
                } else {
                    beta[j].signum() as i8
                }
            })
            .collect();
        if signs != self.signs {
            self.history.clear();
            self.signs = signs;
        }
        self.history.push(coords.iter().map(|&j| beta[j]).collect());
        if self.history.len() > ANDERSON_DEPTH + 1 {
            self.history.remove(0);
        }
    }

    /// The extrapolated β (all coefficients; only `coords` change), when the history is full.
    fn extrapolate(&self, coords: &[usize], beta: &[f64]) -> Option<Vec<f64>> {
        let m = ANDERSON_DEPTH;
        if self.history.len() < m + 1 {
            return None;
        }
        let active: Vec<usize> = (0..coords.len()).filter(|&a| self.signs[a] != 0).collect();
        if active.is_empty() {
            return None;
        }
        let r: Vec<Vec<f64>> = (0..m)
            .map(|i| {
                active
                    .iter()
                    .map(|&a| self.history[i + 1][a] - self.history[i][a])
                    .collect()
            })
            .collect();
        let mut gram = vec![0.0; m * m];
        for i in 0..m {
            for j in 0..m {
                gram[i * m + j] = r[i].iter().zip(&r[j]).map(|(a, b)| a * b).sum();
            }
        }
        let scale = (0..m).map(|i| gram[i * m + i]).fold(0.0, f64::max);
        if !(scale > 0.0 && scale.is_finite()) {
            return None;
        }
        // Steps that shrink by more than ANDERSON_FAST per cycle: the next cycle alone gains
        // nearly all an extrapolation could, for less than the trial point costs.
        if gram[(m - 1) * m + m - 1] < (ANDERSON_FAST * ANDERSON_FAST) * gram[(m - 2) * m + m - 2] {
            return None;
        }
        for i in 0..m {
            gram[i * m + i] += 1e-10 * scale;
        }
        let l = super::newton::cholesky(&gram, m)?;
        let z = super::newton::cholesky_solve(&l, m, &vec![1.0; m]);
        let total: f64 = z.iter().sum();
        if !(total.abs() > 0.0 && total.is_finite()) {
            return None;
        }
        let mut out = beta.to_vec();
        for &a in &active {
            let v: f64 = (0..m).map(|i| z[i] / total * self.history[i + 1][a]).sum();
            out[coords[a]] = v;
        }
        out.iter().all(|v| v.is_finite()).then_some(out)
    }
}

/// Scale-free violation of the optimality condition of one coordinate (gradient `g`, curvature
/// `h` of the log-likelihood at `beta`), the measure of [`Convergence::Optimality`]:
///
/// | prior | violation |
/// |---|---|
/// | none | \|g\| / √h (the one-coordinate Newton decrement: the step in standard errors) |
/// | Normal σ² | \|g − β/σ²\| / √(h + 1/σ²) |
/// | Laplace λ, β = 0 | max(0, \|g\| − λ) / λ |
/// | Laplace λ, β ≠ 0 | \|g − λ sign β\| / max(1, λ) |
///
/// The Laplace rows are DESIGN.md §9's KKT conditions: a violation ≤ tol means
/// \|g\| ≤ λ(1 + tol) at zero and \|g − λ sign β\| ≤ tol·max(1, λ) elsewhere.
#[inline]
pub fn scaled_violation(prior: Prior, beta: f64, g: f64, h: f64) -> f64 {
    match prior {
        Prior::None => {
            if h > 0.0 {
                g.abs() / h.sqrt()
            } else {
                g.abs()
            }
        }
        Prior::Normal { variance } => (g - beta / variance).abs() / (h + 1.0 / variance).sqrt(),
        Prior::Laplace { lambda } => {
            if beta == 0.0 {
                (g.abs() - lambda).max(0.0) / lambda
            } else {
                (g - lambda * beta.signum()).abs() / lambda.max(1.0)
            }
        }
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

    use crate::model::cox::Cox;
    use crate::model::fine_gray::FineGray;
    use crate::model::risk_set::test_support::{build, random_records, Spec};
    use crate::model::Ties;

    /// Only its coordinate costs matter ([`active_set_pays`]).
    #[derive(Clone)]
    struct Costs(Vec<f64>);

    impl Likelihood for Costs {
        fn n_coef(&self) -> usize {
            self.0.len()
        }
        fn set_beta(&mut self, _beta: &[f64]) {}
        fn log_likelihood(&mut self) -> f64 {
            0.0
        }
        fn gradient_hessian(&mut self, _j: usize) -> (f64, f64) {
            (0.0, 1.0)
        }
        fn update(&mut self, _j: usize, _delta: f64) {}
        fn information(&mut self, cols: &[usize]) -> Vec<f64> {
            vec![0.0; cols.len() * cols.len()]
        }
        fn coordinate_cost(&self, j: usize) -> f64 {
            self.0[j]
        }
        fn boxed_clone(&self) -> Box<dyn Likelihood> {
            Box::new(self.clone())
        }
    }

    #[test]
    fn the_active_set_is_used_only_when_its_zero_coordinates_carry_a_third_of_the_work() {
        let all = [0, 1, 2, 3, 4, 5];
        // Two large active columns, four small zero ones: 4 of 24 units skipped.
        let small_zeros = Costs(vec![10.0, 10.0, 1.0, 1.0, 1.0, 1.0]);
        assert!(!active_set_pays(&small_zeros, &all, &[0, 1]));
        // One large active column: 14 of 24 units skipped.
        assert!(active_set_pays(&small_zeros, &all, &[0]));
        // Exactly a third (8 of 24) pays; just below does not.
        let third = Costs(vec![8.0, 8.0, 2.0, 2.0, 2.0, 2.0]);
        assert!(active_set_pays(&third, &all, &[0, 1]));
        let below = Costs(vec![8.0, 8.5, 2.0, 2.0, 2.0, 1.5]);
        assert!(!active_set_pays(&below, &all, &[0, 1]));
        // Equal costs: by count.
        let equal = Costs(vec![1.0; 6]);
        assert!(active_set_pays(&equal, &all, &[0, 1, 2, 3]));
        assert!(!active_set_pays(&equal, &all, &[0, 1, 2, 3, 4]));
        // No usable costs: the classic rule (active set unless it holds 90 % of the coordinates).
        let zero = Costs(vec![0.0; 6]);
        assert!(active_set_pays(&zero, &all, &[0, 1, 2, 3, 4]));
        let nan = Costs(vec![f64::NAN; 6]);
        assert!(active_set_pays(&nan, &all, &[0, 1, 2, 3, 4]));
        assert!(!active_set_pays(&nan, &all, &all));
    }

    #[test]
    fn laplace_step_stops_at_zero() {
        let l = Prior::Laplace { lambda: 1.0 };
        assert_eq!(newton_step(l, 0.0, 0.5, 1.0), 0.0);
        assert!((newton_step(l, 0.0, 3.0, 1.0) - 2.0).abs() < 1e-15);
        assert!((newton_step(l, 0.0, -3.0, 1.0) + 2.0).abs() < 1e-15);
        assert_eq!(newton_step(l, 0.5, -3.0, 1.0), -0.5);
    }

    fn cox(min_chunk: usize) -> Cox {
        let spec = Spec {
            n: 300,
            p: 4,
            strata: 3,
            weights: true,
            counting: false,
            fine_gray: false,
            offset: true,
        };
        let (recs, covs) = random_records(spec, 11);
        Cox::new(&build(&recs, &covs), Ties::Efron)
            .unwrap()
            .with_min_chunk(min_chunk)
    }

    /// Under the optimality rule (Newton block + polish + CCD) results are bit-identical for
    /// any thread count, with tiny chunks so that the likelihood's walks really run in
    /// parallel.
    #[test]
    fn optimality_rule_is_thread_independent() {
        let mut excluded = vec![false; 4];
        excluded[1] = true;
        for prior in [
            Prior::None,
            Prior::Laplace { lambda: 4.0 },
            Prior::Normal { variance: 0.3 },
        ] {
            let priors = PriorSet::new(prior, &excluded);
            let mut bits = Vec::new();
            for threads in 1..=3 {
                let pool = rayon::ThreadPoolBuilder::new()
                    .num_threads(threads)
                    .build()
                    .unwrap();
                let r = pool.install(|| {
                    fit(
                        &mut cox(2),
                        &priors,
                        &[0.0; 4],
                        None,
                        &CcdOptions::fit_default(),
                    )
                    .unwrap()
                });
                assert_eq!(r.status, FitStatus::Converged, "{prior:?}");
                let mut b: Vec<u64> = r.beta.iter().map(|v| v.to_bits()).collect();
                b.push(r.log_likelihood.to_bits());
                b.push(r.iterations as u64);
                bits.push(b);
            }
            assert!(bits.iter().all(|b| *b == bits[0]), "{prior:?}");
        }
    }

    /// A risk-set likelihood with 40 columns (so that the active-set Newton polish runs on
    /// the approximate information, which starts at 33 columns).
    fn wide(
        fine_gray: bool,
        ties: Ties,
        strata: u64,
        weights: bool,
        seed: u64,
    ) -> Box<dyn Likelihood> {
        let spec = Spec {
            n: 700,
            p: 40,
            strata,
            weights,
            counting: false,
            fine_gray,
            offset: true,
        };
        let (recs, covs) = random_records(spec, seed);
        let x = build(&recs, &covs);
        if fine_gray {
            Box::new(FineGray::new(&x, ties).unwrap().with_min_chunk(16))
        } else {
            Box::new(Cox::new(&x, ties).unwrap().with_min_chunk(16))
        }
    }

    /// The active-set Newton polish reaches the optimum of the classic path: same
    /// coefficients to 1e-6 and an objective at least as good (to rounding), for Cox with
    /// Breslow and Efron ties, strata and weights, and Fine–Gray, with a Laplace prior (an
    /// active set beyond 32 columns), a Laplace prior with an unpenalized column, and a
    /// Normal prior.
    #[test]
    fn active_newton_reaches_the_classic_optimum() {
        let mut excluded = vec![false; 40];
        excluded[3] = true;
        let mut seed = 40;
        let mut big_active = 0;
        for (fine_gray, ties, strata, weights) in [
            (false, Ties::Breslow, 1, false),
            (false, Ties::Efron, 3, true),
            (false, Ties::Breslow, 4, true),
            (true, Ties::Breslow, 1, true),
            (true, Ties::Efron, 3, false),
        ] {
            for (prior, excl) in [
                (Prior::Laplace { lambda: 0.5 }, false),
                (Prior::Laplace { lambda: 3.0 }, true),
                (Prior::Normal { variance: 0.5 }, false),
            ] {
                seed += 1;
                let priors = if excl {
                    PriorSet::new(prior, &excluded)
                } else {
                    PriorSet::new(prior, &[false; 40])
                };
                let what =
                    format!("fg={fine_gray} {ties:?} strata={strata} weights={weights} {prior:?}");
                let tight = CcdOptions {
                    tolerance: 1e-9,
                    ..CcdOptions::fit_default()
                };
                let mut lik = wide(fine_gray, ties, strata, weights, seed);
                let classic = CcdOptions {
                    active_newton: false,
                    ..tight.clone()
                };
                let old = fit(lik.as_mut(), &priors, &[0.0; 40], None, &classic).unwrap();
                let mut lik = wide(fine_gray, ties, strata, weights, seed);
                let new = fit(lik.as_mut(), &priors, &[0.0; 40], None, &tight).unwrap();
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
                big_active += usize::from(new.beta.iter().filter(|b| **b != 0.0).count() > 32);
                // At the default tolerance too: converged, KKT met at the returned β.
                let mut lik = wide(fine_gray, ties, strata, weights, seed);
                let r = fit(
                    lik.as_mut(),
                    &priors,
                    &[0.0; 40],
                    None,
                    &CcdOptions::fit_default(),
                )
                .unwrap();
                assert_eq!(r.status, FitStatus::Converged, "{what}");
                lik.set_beta(&r.beta);
                for j in 0..40 {
                    let (g, h) = lik.gradient_hessian(j);
                    let v = scaled_violation(priors.per_coef[j], r.beta[j], g, h);
                    assert!(v <= 1e-6, "{what}: coefficient {j} violation {v}");
                }
                assert!(
                    r.log_likelihood + r.log_prior >= fo - 1e-6 * fo.abs(),
                    "{what}: default-tolerance objective"
                );
            }
        }
        assert!(
            big_active >= 3,
            "the approximate information was not exercised"
        );
    }

    /// The active-set Newton polish (approximate information, batched gradients, parallel
    /// walks with tiny chunks) gives bit-identical fits for any thread count.
    #[test]
    fn active_newton_is_thread_independent() {
        for fine_gray in [false, true] {
            let priors = PriorSet::new(Prior::Laplace { lambda: 0.5 }, &[false; 40]);
            let mut bits = Vec::new();
            for threads in 1..=3 {
                let pool = rayon::ThreadPoolBuilder::new()
                    .num_threads(threads)
                    .build()
                    .unwrap();
                let r = pool.install(|| {
                    let mut lik = wide(fine_gray, Ties::Efron, 2, true, 7);
                    fit(
                        lik.as_mut(),
                        &priors,
                        &[0.0; 40],
                        None,
                        &CcdOptions::fit_default(),
                    )
                    .unwrap()
                });
                assert_eq!(r.status, FitStatus::Converged);
                assert!(r.beta.iter().filter(|b| **b != 0.0).count() > 32);
                let mut b: Vec<u64> = r.beta.iter().map(|v| v.to_bits()).collect();
                b.push(r.log_likelihood.to_bits());
                b.push(r.iterations as u64);
                bits.push(b);
            }
            assert!(bits.iter().all(|b| *b == bits[0]), "fine_gray={fine_gray}");
        }
    }

    /// Warm starts and fixed coefficients (profile, CV and bootstrap callers): a fixed
    /// coefficient stays where it is, and the others reach their optimum given it.
    #[test]
    fn fixed_coefficients_and_warm_starts() {
        let mut lik = cox(usize::MAX);
        let priors = PriorSet::new(Prior::None, &[false; 4]);
        let opts = CcdOptions::fit_default();
        let full = fit(&mut lik, &priors, &[0.0; 4], None, &opts).unwrap();
        let mut start = full.beta.clone();
        start[2] += 0.3;
        let fixed = [false, false, true, false];
        let r = fit(&mut lik, &priors, &start, Some(&fixed), &opts).unwrap();
        assert_eq!(r.status, FitStatus::Converged);
        assert_eq!(r.beta[2], start[2]);
        assert!(r.log_likelihood < full.log_likelihood);
        lik.set_beta(&r.beta);
        for j in [0, 1, 3] {
            let (g, h) = lik.gradient_hessian(j);
            assert!(g.abs() / h.sqrt() < 1e-6, "g[{j}] = {g}");
        }
        // A warm start at the optimum converges at once.
        let again = fit(&mut lik, &priors, &full.beta, None, &opts).unwrap();
        assert_eq!(again.status, FitStatus::Converged);
        assert_eq!(again.iterations, 1);
    }

    /// Anderson extrapolation of a geometric sequence lands on its limit (Aitken's Δ²), and a
    /// change of sign pattern restarts the history.
    #[test]
    fn anderson_extrapolates_a_geometric_sequence() {
        let mut a = Anderson::default();
        let coords = [1];
        for b in [0.5, 0.75, 0.875] {
            a.push(&coords, &[9.0, b]);
        }
        let e = a.extrapolate(&coords, &[9.0, 0.875]).unwrap();
        assert_eq!(e[0], 9.0);
        assert!((e[1] - 1.0).abs() < 1e-6, "{e:?}");
        a.push(&coords, &[9.0, -0.1]);
        assert_eq!(a.history.len(), 1);
        assert!(a.extrapolate(&coords, &[9.0, -0.1]).is_none());
    }

    /// The classic rules run coordinate descent alone, whatever `newton_max_block` says.
    #[test]
    fn classic_rules_ignore_the_newton_block() {
        let priors = PriorSet::new(Prior::None, &[false; 4]);
        let classic = CcdOptions {
            convergence: Convergence::Gradient,
            tolerance: 1e-8,
            ..CcdOptions::default()
        };
        let no_block = CcdOptions {
            newton_max_block: 0,
            ..classic.clone()
        };
        let a = fit(&mut cox(usize::MAX), &priors, &[0.0; 4], None, &classic).unwrap();
        let b = fit(&mut cox(usize::MAX), &priors, &[0.0; 4], None, &no_block).unwrap();
        assert_eq!(a.beta, b.beta);
        assert_eq!(a.iterations, b.iterations);
        assert!(a.iterations > 5, "CCD cycles, not Newton iterations");
    }
}
