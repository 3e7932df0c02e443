//! Non-parametric bootstrap of a (regularized) fit (paper 000 §3; Efron & Tibshirani 1986).
//!
//! Each replicate draws, with replacement, as many units as the data has — rows, or whole
//! strata for the conditional models (every drawn copy of a stratum becomes its own stratum) —
//! and refits with the same prior (the variance chosen by cross-validation, when there was
//! one), warm-started at the full-data estimate β̂. Per coefficient it reports the mean of the
//! replicates, the bias (mean − β̂), the standard error (sd over replicates, n − 1), the
//! percentile interval (R's quantile type 7 at (1 ± level)/2) and the proportion of replicates
//! with β_j ≠ 0 (under a Laplace prior, paper 000's "poor man's" posterior probability of a
//! non-zero effect).
//!
//! Replicate b draws from its own generator seeded by (`seed`, b), and replicates run in
//! parallel but are collected in order, so the results are the same whatever the thread count.
//! Coefficients in [`Problem::fixed`] (aliased columns and those with no finite estimate, as
//! the fit API sets it) stay at β̂ in every replicate.
//!
//! A replicate whose fit is ill-conditioned is counted and left out ([`BootstrapResult::failed`]);
//! so is a resample whose rows carry no information (no events, every weight 0:
//! [`crate::model::degenerate::check_information`]; [`BootstrapResult::skipped`]). The fit API
//! says so in its notes, and warns when fewer than [`MIN_REPLICATES`] replicates enter the
//! summaries. When fewer than 2 replicates are left, the bootstrap fails with a clear error.

use rayon::prelude::*;

use super::ccd::{self, FitStatus};
use super::cv::{stream_seed, Problem, Resampling};
use super::prior::Prior;
use super::rng::Rng;
use crate::error::{Error, Result};

/// Fewer replicates than this in the summaries make the fit API add a warning note: percentile
/// intervals from so few draws are unreliable (Efron & Tibshirani suggest ≥ 1000 for them).
pub const MIN_REPLICATES: usize = 50;

/// Bootstrap options.
///
/// | option | default | meaning |
/// |---|---|---|
/// | `replicates` | 200 | number of resamples (paper 000) |
/// | `by` | auto | [`Resampling`]: strata for SCCS and conditional logistic, rows otherwise |
/// | `seed` | 1 | seed |
#[derive(Debug, Clone, PartialEq)]
pub struct BootstrapOptions {
    /// Replicates.
    pub replicates: usize,
    /// Resampling units.
    pub by: Resampling,
    /// Seed.
    pub seed: u64,
}

impl Default for BootstrapOptions {
    fn default() -> Self {
        BootstrapOptions {
            replicates: 200,
            by: Resampling::Auto,
            seed: 1,
        }
    }
}

impl BootstrapOptions {
    /// Validate.
    pub fn check(&self) -> Result<()> {
        if self.replicates < 2 {
            return Err(Error::option("bootstrap.replicates", "must be ≥ 2"));
        }
        Ok(())
    }
}

/// Bootstrap summary of one coefficient.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct BootstrapCoef {
    /// Mean over replicates.
    pub mean: f64,
    /// mean − β̂.
    pub bias: f64,
    /// Standard deviation over replicates.
    pub std_error: f64,
    /// Lower percentile bound.
    pub lower: f64,
    /// Upper percentile bound.
    pub upper: f64,
    /// Proportion of replicates with β_j ≠ 0.
    pub nonzero: f64,
}

/// Result of [`bootstrap`].
#[derive(Debug, Clone, PartialEq)]
pub struct BootstrapResult {
    /// Replicates that converged and enter the summaries.
    pub replicates: usize,
    /// Replicates left out (ill-conditioned fits).
    pub failed: usize,
    /// Replicates left out because the resample carries no information (no events, every
    /// weight 0).
    pub skipped: usize,
    /// Why the first skipped replicate was skipped.
    pub skip_reason: Option<String>,
    /// Units resampled.
    pub by: Resampling,
    /// Seed.
    pub seed: u64,
    /// Interval level.
    pub level: f64,
    /// One summary per coefficient, in fit order.
    pub coefficients: Vec<BootstrapCoef>,
    /// The replicate estimates (replicate-major; failed replicates omitted).
    pub estimates: Vec<Vec<f64>>,
    /// Wall time, seconds.
    pub seconds: f64,
}

/// R's quantile type 7 of sorted `x` at probability `p`.
pub fn quantile_sorted(x: &[f64], p: f64) -> f64 {
    let h = (x.len() - 1) as f64 * p;
    let lo = h.floor() as usize;
    let hi = (lo + 1).min(x.len() - 1);
    x[lo] + (h - lo as f64) * (x[hi] - x[lo])
}

/// Units drawn for replicate `b`: rows (sorted) and, by stratum, each row's new stratum.
fn draw(
    unit_of_row: &[u32],
    n_units: usize,
    by_stratum: bool,
    seed: u64,
    b: usize,
) -> (Vec<u32>, Option<Vec<u32>>) {
    let mut rng = Rng::new(stream_seed(seed, b as u64));
    let mut count = vec![0u32; n_units];
    for _ in 0..n_units {
        count[rng.int_range(0, n_units as u64 - 1) as usize] += 1;
    }
    let mut rows = Vec::with_capacity(unit_of_row.len());
    if !by_stratum {
        for (i, &c) in count.iter().enumerate() {
            rows.extend(std::iter::repeat_n(i as u32, c as usize));
        }
        return (rows, None);
    }
    // Each copy of a stratum gets its own dense stratum index, numbered in row order.
    let mut base = vec![u32::MAX; n_units];
    let mut next = 0u32;
    let mut strata = Vec::with_capacity(unit_of_row.len());
    for (i, &s) in unit_of_row.iter().enumerate() {
        let c = count[s as usize];
        if c == 0 {
            continue;
        }
        if base[s as usize] == u32::MAX {
            base[s as usize] = next;
            next += c;
        }
        for copy in 0..c {
            rows.push(i as u32);
            strata.push(base[s as usize] + copy);
        }
    }
    (rows, Some(strata))
}

/// Bootstrap `problem` under `prior`, warm-starting every replicate at `beta_hat`.
pub fn bootstrap(
    problem: &Problem<'_>,
    prior: Prior,
    beta_hat: &[f64],
    level: f64,
    opts: &BootstrapOptions,
) -> Result<BootstrapResult> {
    opts.check()?;
    let started = std::time::Instant::now();
    let by = opts.by.resolve(problem.kind);
    let (unit_of_row, n_units) = problem.units(by);
    if n_units < 2 {
        return Err(Error::option(
            "bootstrap",
            format!(
                "needs at least 2 {}",
                if by == Resampling::Stratum {
                    "strata"
                } else {
                    "rows"
                }
            ),
        ));
    }
    let priors = problem.priors(prior);
    /// What became of one replicate.
    enum Replicate {
        Fitted(Vec<f64>),
        Failed,
        Skipped(String),
    }
    let results: Vec<Replicate> = (0..opts.replicates)
        .into_par_iter()
        .map(|b| {
            let (rows, strata) = draw(
                &unit_of_row,
                n_units,
                by == Resampling::Stratum,
                opts.seed,
                b,
            );
            let mut lik = match problem.likelihood_on(&rows, strata.as_deref()) {
                Ok(l) => l,
                Err(Error::Empty(why)) => return Ok(Replicate::Skipped(why)),
                Err(e) => {
                    return Err(Error::FitFailed(format!(
                        "bootstrap replicate {}: {e}",
                        b + 1
                    )))
                }
            };
            let r = ccd::fit(
                lik.as_mut(),
                &priors,
                beta_hat,
                problem.fixed_mask(),
                &problem.ccd,
            )?;
            Ok(if r.status == FitStatus::IllConditioned {
                Replicate::Failed
            } else {
                Replicate::Fitted(r.beta)
            })
        })
        .collect::<Result<_>>()?;
    let mut failed = 0;
    let mut skipped = 0;
    let mut skip_reason = None;
    let mut estimates: Vec<Vec<f64>> = Vec::with_capacity(results.len());
    for r in results {
        match r {
            Replicate::Fitted(beta) => estimates.push(beta),
            Replicate::Failed => failed += 1,
            Replicate::Skipped(why) => {
                skipped += 1;
                skip_reason.get_or_insert(why);
            }
        }
    }
    if estimates.len() < 2 {
        return Err(Error::FitFailed(format!(
            "bootstrap: only {} of {} replicates could be fitted ({failed} ill-conditioned, \
             {skipped} skipped{})",
            estimates.len(),
            opts.replicates,
            skip_reason
                .as_deref()
                .map(|w| format!(": resamples without information, e.g. {w}"))
                .unwrap_or_default()
        )));
    }
    let n = estimates.len() as f64;
    let coefficients = (0..beta_hat.len())
        .map(|j| {
            let mut x: Vec<f64> = estimates.iter().map(|e| e[j]).collect();
            let mean = x.iter().sum::<f64>() / n;
            let var = x.iter().map(|v| (v - mean) * (v - mean)).sum::<f64>() / (n - 1.0);
            let nonzero = x.iter().filter(|&&v| v != 0.0).count() as f64 / n;
            x.sort_by(f64::total_cmp);
            let a = (1.0 - level) / 2.0;
            BootstrapCoef {
                mean,
                bias: mean - beta_hat[j],
                std_error: var.sqrt(),
                lower: quantile_sorted(&x, a),
                upper: quantile_sorted(&x, 1.0 - a),
                nonzero,
            }
        })
        .collect();
    Ok(BootstrapResult {
        replicates: estimates.len(),
        failed,
        skipped,
        skip_reason,
        by,
        seed: opts.seed,
        level,
        coefficients,
        estimates,
        seconds: started.elapsed().as_secs_f64(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn type7_quantiles() {
        let x = [1.0, 2.0, 3.0, 4.0, 5.0];
        assert_eq!(quantile_sorted(&x, 0.5), 3.0);
        assert!((quantile_sorted(&x, 0.025) - 1.1).abs() < 1e-12);
        assert!((quantile_sorted(&x, 0.975) - 4.9).abs() < 1e-12);
    }

    #[test]
    fn stratum_draws_copy_whole_strata() {
        // rows 0,1 in stratum 0; rows 2,3,4 in stratum 1; row 5 in stratum 2.
        let units = [0u32, 0, 1, 1, 1, 2];
        for b in 0..20 {
            let (rows, strata) = draw(&units, 3, true, 42, b);
            let strata = strata.unwrap();
            assert_eq!(rows.len(), strata.len());
            assert!(rows.windows(2).all(|w| w[0] <= w[1]));
            // Every new stratum holds a whole original stratum.
            let n_new = strata.iter().max().map_or(0, |m| m + 1);
            assert_eq!(n_new, 3, "3 strata drawn");
            for s in 0..n_new {
                let members: Vec<u32> = rows
                    .iter()
                    .zip(&strata)
                    .filter(|(_, &t)| t == s)
                    .map(|(&r, _)| r)
                    .collect();
                let orig = units[members[0] as usize];
                let expect: Vec<u32> = (0..6u32).filter(|&r| units[r as usize] == orig).collect();
                assert_eq!(members, expect);
            }
        }
        let (rows, strata) = draw(&units, 6, false, 42, 0);
        assert!(strata.is_none());
        assert_eq!(rows.len(), 6);
        assert_eq!(draw(&units, 6, false, 42, 0), draw(&units, 6, false, 42, 0));
    }
}
