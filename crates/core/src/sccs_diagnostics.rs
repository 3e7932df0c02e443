//! SCCS diagnostics as OHDSI's SelfControlledCaseSeries package (version 6) reports them per
//! exposure–outcome pair, each classified pass / warn / fail / not computed against the
//! package's default thresholds ([`DiagnosticThresholds`], R `createSccsDiagnosticThresholds`).
//!
//! | diagnostic | R function | value | passes when (default) |
//! |---|---|---|---|
//! | MDRR | `computeMdrr(method = "SRL1")` | minimum detectable relative risk ([`mdrr`]) | MDRR ≤ 10 |
//! | EASE | `computeExpectedAbsoluteSystematicError(fitMcmcNull(...))` | expected absolute systematic error of the negative controls | EASE ≤ 0.25 |
//! | time stability | `checkTimeStabilityAssumption` | one-sided p that the observed / expected ratio of the monthly outcome counts exceeds 1.1 ([`time_stability`]) | p > 0.05 |
//! | event-dependent observation end | `checkEventObservationIndependenceAssumption` | IRR of the end-of-observation probe (covariate 99) | its 95 % CI intersects [0.5, 2] |
//! | event-dependent exposure (pre-exposure) | `checkEventExposureIndependenceAssumption` | IRR of the pre-exposure window | its 95 % CI intersects [0.8, 1.25] |
//! | rare outcome | `checkRareOutcomeAssumption` | proportion of the population with the outcome | ≤ 0.1, or the analysis was not restricted to the first outcome |
//!
//! The package (v6) classifies pass or fail only; [`Status::Warn`] is produced only for EASE
//! when the optional [`DiagnosticThresholds::ease_warning`] is set (the older OHDSI rule: EASE <
//! 0.1 pass, < 0.25 warning).
//!
//! Sources read (SelfControlledCaseSeries `R/Diagnostics.R`, `R/Power.R`, `R/Export.R`,
//! `R/Analyses.R` and the package reference pages of version 6.x): the formulas below follow
//! them. Where the source could not be confirmed, the item says so: the per-case correction of
//! the time-stability expectation for season / calendar-time splines (R's `computeCorrections`,
//! compiled code not read) and whether the v6 comparisons against the thresholds are strict.
#![allow(clippy::doc_markdown)]

use std::collections::HashMap;
use std::sync::{Arc, OnceLock};

use serde::Deserialize;

use crate::calibration::{normal_cdf, normal_quantile};
use crate::{Error, Result};

/// Classification of one diagnostic.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Status {
    /// The assumption holds / the study has the power (R `PASS`).
    Pass,
    /// Between the warning and the failure threshold (EASE only, when asked for).
    Warn,
    /// R `FAIL`.
    Fail,
    /// Not computed (R `NOT EVALUATED`): the input it needs is missing; the notes say why.
    NotComputed,
}

impl Status {
    /// `pass`, `warn`, `fail` or `not_computed`.
    pub fn name(self) -> &'static str {
        match self {
            Status::Pass => "pass",
            Status::Warn => "warn",
            Status::Fail => "fail",
            Status::NotComputed => "not_computed",
        }
    }
}

fn default_mdrr() -> f64 {
    10.0
}
fn default_ease() -> f64 {
    0.25
}
fn default_max_ratio() -> f64 {
    1.1
}
fn default_alpha() -> f64 {
    0.05
}
fn default_prevalence() -> f64 {
    0.1
}
fn default_observation_bounds() -> [f64; 2] {
    [0.5, 2.0]
}
fn default_exposure_bounds() -> [f64; 2] {
    [0.8, 1.25]
}
fn default_power() -> f64 {
    0.8
}
fn yes() -> bool {
    true
}

/// Thresholds of the diagnostics (JSON keys; SelfControlledCaseSeries defaults).
///
/// | key | default | range | R |
/// |---|---|---|---|
/// | `mdrr` | 10 | > 1 | `mdrrThreshold` |
/// | `ease` | 0.25 | > 0 | `easeThreshold` |
/// | `ease_warning` | none | (0, `ease`) | – (older OHDSI rule: 0.1) |
/// | `time_trend_max_ratio` | 1.1 | ≥ 1 | `timeTrendMaxRatio` |
/// | `time_trend_alpha` | 0.05 | (0, 1) | `alpha` of `checkTimeStabilityAssumption` |
/// | `rare_outcome_max_prevalence` | 0.1 | (0, 1] | `rareOutcomeMaxPrevalence` |
/// | `event_observation_null_bounds` | [0.5, 2] | 0 < lower ≤ 1 ≤ upper | `eventObservationDependenceNullBounds` |
/// | `event_exposure_null_bounds` | [0.8, 1.25] | 0 < lower ≤ 1 ≤ upper | `eventExposureDependenceNullBounds` |
/// | `mdrr_alpha` | 0.05 | (0, 1) | `computeMdrr(alpha)` |
/// | `mdrr_power` | 0.8 | (0, 1) | `computeMdrr(power)` |
/// | `mdrr_two_sided` | true | – | `computeMdrr(twoSided)` |
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DiagnosticThresholds {
    /// Largest MDRR that passes.
    #[serde(default = "default_mdrr")]
    pub mdrr: f64,
    /// Largest EASE that passes.
    #[serde(default = "default_ease")]
    pub ease: f64,
    /// EASE above which the diagnostic warns (None: no warning level).
    #[serde(default)]
    pub ease_warning: Option<f64>,
    /// Largest observed / expected ratio of the time-stability null.
    #[serde(default = "default_max_ratio")]
    pub time_trend_max_ratio: f64,
    /// α of the time-stability test.
    #[serde(default = "default_alpha")]
    pub time_trend_alpha: f64,
    /// Largest outcome prevalence that passes (first-outcome-only analyses).
    #[serde(default = "default_prevalence")]
    pub rare_outcome_max_prevalence: f64,
    /// Null bounds (IRR scale) of the end-of-observation probe.
    #[serde(default = "default_observation_bounds")]
    pub event_observation_null_bounds: [f64; 2],
    /// Null bounds (IRR scale) of the pre-exposure window.
    #[serde(default = "default_exposure_bounds")]
    pub event_exposure_null_bounds: [f64; 2],
    /// Type I error of the MDRR.
    #[serde(default = "default_alpha")]
    pub mdrr_alpha: f64,
    /// Power of the MDRR.
    #[serde(default = "default_power")]
    pub mdrr_power: f64,
    /// Two-sided test for the MDRR.
    #[serde(default = "yes")]
    pub mdrr_two_sided: bool,
}

impl Default for DiagnosticThresholds {
    fn default() -> Self {
        DiagnosticThresholds {
            mdrr: default_mdrr(),
            ease: default_ease(),
            ease_warning: None,
            time_trend_max_ratio: default_max_ratio(),
            time_trend_alpha: default_alpha(),
            rare_outcome_max_prevalence: default_prevalence(),
            event_observation_null_bounds: default_observation_bounds(),
            event_exposure_null_bounds: default_exposure_bounds(),
            mdrr_alpha: default_alpha(),
            mdrr_power: default_power(),
            mdrr_two_sided: true,
        }
    }
}

fn open_unit(key: &str, v: f64) -> Result<()> {
    if v > 0.0 && v < 1.0 {
        Ok(())
    } else {
        Err(Error::option(key, format!("must be in (0, 1) (got {v})")))
    }
}

fn bounds(key: &str, b: [f64; 2]) -> Result<()> {
    if b[0].is_finite() && b[1].is_finite() && b[0] > 0.0 && b[0] <= 1.0 && b[1] >= 1.0 {
        Ok(())
    } else {
        Err(Error::option(
            key,
            format!(
                "must be [lower, upper] with 0 < lower ≤ 1 ≤ upper on the IRR scale (got [{}, {}])",
                b[0], b[1]
            ),
        ))
    }
}

impl DiagnosticThresholds {
    /// Validate every threshold (errors name the key).
    pub fn check(&self) -> Result<()> {
        let key = |k: &str| format!("diagnostics.{k}");
        if !(self.mdrr.is_finite() && self.mdrr > 1.0) {
            return Err(Error::option(
                key("mdrr"),
                format!("must be a finite number > 1 (got {})", self.mdrr),
            ));
        }
        if !(self.ease.is_finite() && self.ease > 0.0) {
            return Err(Error::option(
                key("ease"),
                format!("must be a finite number > 0 (got {})", self.ease),
            ));
        }
        if let Some(w) = self.ease_warning {
            if !(w > 0.0 && w < self.ease) {
                return Err(Error::option(
                    key("ease_warning"),
                    format!("must be in (0, ease = {}) (got {w})", self.ease),
                ));
            }
        }
        if !(self.time_trend_max_ratio.is_finite() && self.time_trend_max_ratio >= 1.0) {
            return Err(Error::option(
                key("time_trend_max_ratio"),
                format!(
                    "must be a finite number ≥ 1 (got {})",
                    self.time_trend_max_ratio
                ),
            ));
        }
        open_unit(&key("time_trend_alpha"), self.time_trend_alpha)?;
        let p = self.rare_outcome_max_prevalence;
        if !(p > 0.0 && p <= 1.0) {
            return Err(Error::option(
                key("rare_outcome_max_prevalence"),
                format!("must be in (0, 1] (got {p})"),
            ));
        }
        bounds(
            &key("event_observation_null_bounds"),
            self.event_observation_null_bounds,
        )?;
        bounds(
            &key("event_exposure_null_bounds"),
            self.event_exposure_null_bounds,
        )?;
        open_unit(&key("mdrr_alpha"), self.mdrr_alpha)?;
        open_unit(&key("mdrr_power"), self.mdrr_power)?;
        Ok(())
    }
}

// ---------------------------------------------------------------------------------------------
// MDRR (Musonda, Farrington & Whitaker 2006, expression 7: signed root likelihood ratio, SRL1)
// ---------------------------------------------------------------------------------------------

/// Power of the SRL1 test at log RR `b` (R `computePowerSrl`): with `p = e^b r / (e^b r + 1 − r)`,
/// `A = 2 (p b − ln(e^b r + 1 − r))`, `B = b²/A · e^b r (1 − r) / (e^b r + 1 − r)²`,
/// power `Φ((√(nA) − z) / √B)`, floored at α (also when `n < 1`).
pub fn srl1_power(b: f64, z: f64, r: f64, n: f64, alpha: f64) -> f64 {
    let eb = b.exp();
    let d = eb * r + 1.0 - r;
    let a = 2.0 * ((eb * r / d) * b - d.ln());
    let bb = b * b / a * eb * r * (1.0 - r) / (d * d);
    let zb = ((n * a).sqrt() - z) / bb.sqrt();
    let power = normal_cdf(zb);
    // R: `if (power < alpha | n < 1) power <- alpha`; a NaN power (b = 0) is treated alike.
    if power.is_nan() || power < alpha || n < 1.0 {
        alpha
    } else {
        power
    }
}

/// Minimum detectable relative risk of an SCCS exposure (R `computeMdrr`, method `SRL1`).
///
/// `r` is the proportion of observed time exposed (`dayCount / observedDayCount` of the
/// exposure's covariate statistics), `n` the number of outcomes (`observedOutcomeCount`). The
/// log MDRR is found by R's binary search on [0, 10] for the power to within 1e-6 (so the
/// largest value reported is e^10 ≈ 22026 when the power is never reached). `r ≤ 0`, `r ≥ 1`
/// or a non-finite input gives +∞ (R: `Inf` when the exposure has no statistics or `r = 1`).
pub fn mdrr(r: f64, n: f64, alpha: f64, power: f64, two_sided: bool) -> f64 {
    if !(r > 0.0 && r < 1.0 && n.is_finite() && n >= 0.0) {
        return f64::INFINITY;
    }
    let alpha = if two_sided { alpha / 2.0 } else { alpha };
    let z = normal_quantile(1.0 - alpha);
    let (mut lo, mut hi) = (0.0f64, 10.0f64);
    let precision = 1e-6;
    // R loops `while (H >= L)`; bisection reaches adjacent floats in < 100 steps, the cap only
    // guards against a loop R would never leave.
    for _ in 0..2000 {
        if hi < lo {
            break;
        }
        let m = lo + (hi - lo) / 2.0;
        let d = srl1_power(m, z, r, n, alpha) - power;
        if d > precision {
            hi = m;
        } else if -d > precision {
            lo = m;
        } else {
            return m.exp();
        }
        if m == 0.0 || m == 10.0 {
            return m.exp();
        }
    }
    (lo + (hi - lo) / 2.0).exp()
}

// ---------------------------------------------------------------------------------------------
// Time stability (R `computeOutcomeRatePerMonth` + `checkTimeStabilityAssumption`)
// ---------------------------------------------------------------------------------------------

/// A case's observation in calendar months (month index = year·12 + month − 1).
#[derive(Debug, Clone, PartialEq)]
pub struct CaseMonths {
    /// Month of the first observed day.
    pub start_month: i64,
    /// Day of month (1–31) of the first observed day.
    pub start_day_of_month: u32,
    /// Month of the last observed day.
    pub end_month: i64,
    /// Day of month (1–31) of the last observed day.
    pub end_day_of_month: u32,
    /// Month of each outcome of the case.
    pub outcome_months: Vec<i64>,
}

/// Observed and expected outcome counts of one calendar month.
#[derive(Debug, Clone, PartialEq)]
pub struct MonthCount {
    /// Month index (year·12 + month − 1).
    pub month: i64,
    /// Outcomes in the month.
    pub observed: u64,
    /// Expected outcomes, adjusted for the month effects when given.
    pub expected: f64,
    /// Cases observed in the month, weighted by the fraction of the month observed.
    pub observation_period_count: f64,
}

/// Observed and expected outcomes per calendar month (R `computeOutcomeRatePerMonth`).
///
/// Each case's rate is its outcome count over its months of observation, counting the first
/// month as `(31 − d + 1)/31` and the last as `d/31` (R assumes 31-day months; a case within one
/// month counts both fractions, as R does). A month's expected count is the sum over the cases
/// observed in it of `weight · rate · rr(month) / correction`, with weight the start fraction in
/// the case's first month, the end fraction in its last and 1 in between. `month_rr` is the
/// fitted season × calendar-time rate ratio of a month (None: no adjustment, rr = 1 and
/// correction = 1); the correction of a case is then the weighted mean of `rr` over its months
/// (my reading of R's `computeCorrections` — "a person may have seen only part of the spline,
/// so technically has a different intercept" — whose compiled source I did not read).
///
/// Only months with at least one outcome are returned (R inner-joins the observed counts).
pub fn outcome_rate_per_month(
    cases: &[CaseMonths],
    month_rr: Option<&dyn Fn(i64) -> f64>,
) -> Vec<MonthCount> {
    use std::collections::BTreeMap;
    let mut observed: BTreeMap<i64, u64> = BTreeMap::new();
    for c in cases {
        for &m in &c.outcome_months {
            *observed.entry(m).or_default() += 1;
        }
    }
    let mut expected: BTreeMap<i64, (f64, f64)> = BTreeMap::new();
    for c in cases {
        if c.end_month < c.start_month {
            continue;
        }
        let sf = (31.0 - f64::from(c.start_day_of_month) + 1.0) / 31.0;
        let ef = f64::from(c.end_day_of_month) / 31.0;
        let months = (c.end_month - c.start_month) as f64 + sf + ef;
        let rate = c.outcome_months.len() as f64 / months;
        let weight = |m: i64| {
            if m == c.start_month {
                sf
            } else if m == c.end_month {
                ef
            } else {
                1.0
            }
        };
        let correction = match month_rr {
            None => 1.0,
            Some(rr) => {
                let (mut num, mut den) = (0.0, 0.0);
                for m in c.start_month..=c.end_month {
                    num += weight(m) * rr(m);
                    den += weight(m);
                }
                num / den
            }
        };
        for m in c.start_month..=c.end_month {
            if !observed.contains_key(&m) {
                continue;
            }
            let rr = month_rr.map_or(1.0, |f| f(m));
            let e = expected.entry(m).or_default();
            e.0 += weight(m) * rate * rr / correction;
            e.1 += weight(m);
        }
    }
    observed
        .into_iter()
        .filter_map(|(month, o)| {
            expected.get(&month).map(|&(e, w)| MonthCount {
                month,
                observed: o,
                expected: e,
                observation_period_count: w,
            })
        })
        .collect()
}

/// Result of the time-stability test.
#[derive(Debug, Clone, PartialEq)]
pub struct TimeStability {
    /// Estimated ratio between observed and expected counts (≥ 1); None with fewer than 2
    /// months.
    pub ratio: Option<f64>,
    /// One-sided p against the null that the ratio is at most `max_ratio`.
    pub p: f64,
    /// `p > alpha`.
    pub stable: bool,
}

/// ln o! as Σ_{k=2}^{o} ln k (in that order).
fn log_factorial(o: u64) -> f64 {
    (2..=o).map(|k| (k as f64).ln()).sum()
}

/// `ln P(O = o)` for O ~ Poisson(λ), given `log_fact` = [`log_factorial`]`(o)`.
fn log_dpois(o: u64, lambda: f64, log_fact: f64) -> f64 {
    if lambda == 0.0 {
        return if o == 0 { 0.0 } else { f64::NEG_INFINITY };
    }
    o as f64 * lambda.ln() - lambda - log_fact
}

/// R's `smoothMax`: `log(e^x + e^y)` as `x + log(1 + e^(y−x))`, or the larger when they differ
/// by more than 100.
fn smooth_max(x: f64, y: f64) -> f64 {
    if (x - y).abs() > 100.0 || (x - y).is_nan() {
        x.max(y)
    } else {
        x + (1.0 + (y - x).exp()).ln()
    }
}

/// The log-likelihood of the ratio `x` (R: `−logLikelihood(x)`): Σ over months of
/// `log(dpois(o, e·x) + dpois(o, e/x))`.
pub fn time_stability_log_likelihood(observed: &[u64], expected: &[f64], x: f64) -> f64 {
    observed
        .iter()
        .zip(expected)
        .map(|(&o, &e)| {
            let lf = log_factorial(o);
            smooth_max(log_dpois(o, e * x, lf), log_dpois(o, e / x, lf))
        })
        .sum()
}

/// The months of [`time_stability`] with what does not depend on the ratio precomputed (the
/// same log-likelihood as [`time_stability_log_likelihood`] to rounding), so
/// that the log-likelihood at x costs one `ln x` and, per month, one `exp` and one `ln`:
/// ln dpois(o, e x^±1) = o ln e − ln o! ± o ln x − e x^±1.
struct StabilityMonths {
    /// (o, e, o ln e − ln o!) per month with e > 0.
    months: Vec<(f64, f64, f64)>,
    /// The contribution of the months with e = 0 (0, or −∞ when one has an outcome).
    zero: f64,
}

impl StabilityMonths {
    fn new(observed: &[u64], expected: &[f64]) -> Self {
        let mut months = Vec::with_capacity(observed.len());
        let mut zero = 0.0;
        for (&o, &e) in observed.iter().zip(expected) {
            let lf = log_factorial(o);
            if e == 0.0 {
                zero += smooth_max(log_dpois(o, 0.0, lf), log_dpois(o, 0.0, lf));
            } else {
                months.push((o as f64, e, o as f64 * e.ln() - lf));
            }
        }
        StabilityMonths { months, zero }
    }

    fn log_likelihood(&self, x: f64) -> f64 {
        let (ln_x, inv) = (x.ln(), 1.0 / x);
        self.months.iter().fold(self.zero, |acc, &(o, e, c)| {
            let up = c + o * ln_x - e * x;
            let down = c - o * ln_x - e * inv;
            acc + smooth_max(up, down)
        })
    }
}

/// Adaptive Simpson of `f` on [a, b].
fn simpson(f: &dyn Fn(f64) -> f64, a: f64, b: f64, tol: f64) -> f64 {
    // The classic recursive adaptive Simpson: interval, its three values, estimate, tolerance, depth.
    #[allow(clippy::too_many_arguments)]
    fn rec(
        f: &dyn Fn(f64) -> f64,
        a: f64,
        b: f64,
        fa: f64,
        fm: f64,
        fb: f64,
        whole: f64,
        tol: f64,
        depth: u32,
    ) -> f64 {
        let m = 0.5 * (a + b);
        let (lm, rm) = (0.5 * (a + m), 0.5 * (m + b));
        let (flm, frm) = (f(lm), f(rm));
        let left = (m - a) / 6.0 * (fa + 4.0 * flm + fm);
        let right = (b - m) / 6.0 * (fm + 4.0 * frm + fb);
        if depth == 0 || (left + right - whole).abs() <= 15.0 * tol {
            return left + right + (left + right - whole) / 15.0;
        }
        rec(f, a, m, fa, flm, fm, left, tol / 2.0, depth - 1)
            + rec(f, m, b, fm, frm, fb, right, tol / 2.0, depth - 1)
    }
    let (fa, fb, fm) = (f(a), f(b), f(0.5 * (a + b)));
    let whole = (b - a) / 6.0 * (fa + 4.0 * fm + fb);
    rec(f, a, b, fa, fm, fb, whole, tol, 40)
}

/// Integral of `g` over [a, b] as a sum of adaptive Simpson integrals over `pieces` equal cells
/// (so that a narrow peak is not missed).
fn integrate(g: &dyn Fn(f64) -> f64, a: f64, b: f64, pieces: usize, tol: f64) -> f64 {
    let h = (b - a) / pieces as f64;
    (0..pieces)
        .map(|i| simpson(g, a + i as f64 * h, a + (i + 1) as f64 * h, tol))
        .sum()
}

/// Time-stability test (R `checkTimeStabilityAssumption`, formerly `computeTimeStability`).
///
/// `observed[m]`, `expected[m]`: outcome counts and (adjusted) expected counts of the months
/// with at least one outcome ([`outcome_rate_per_month`]). The likelihood of a global ratio
/// `x ≥ 1` lets each month be `x` times too high or too low: `L(x) = Π_m (dpois(o_m, e_m x) +
/// dpois(o_m, e_m / x))`. The ratio reported is its maximizer on [1, 10] (R: `optim` L-BFGS-B
/// from 1.5 on the part of [1, 10] where the log-likelihood is finite; here a grid of step
/// 0.001 refined by golden section). With `l0 = ∫_1^maxRatio L` and `l1 = ∫_maxRatio^∞ L`,
/// `llr = 2 (ln l1 − ln l0)` and `p = P(χ²₁ > llr)` (1 when `llr ≤ 0`); the series is stable
/// when `p > alpha`. Fewer than two months: ratio None, p = 1, stable (as R).
///
/// The integrals are computed relative to the likelihood's maximum, so they do not underflow:
/// R integrates `L` itself, which underflows to 0 over many months and then falls back to
/// `p = 0` if the ratio exceeds `maxRatio`, else 1. Where R's integrals are representable the
/// two agree; where R underflows this reports the p that R's formula means.
pub fn time_stability(
    observed: &[u64],
    expected: &[f64],
    max_ratio: f64,
    alpha: f64,
) -> TimeStability {
    let n = observed.len().min(expected.len());
    if n < 2 {
        return TimeStability {
            ratio: None,
            p: 1.0,
            stable: true,
        };
    }
    let (o, e) = (&observed[..n], &expected[..n]);
    let months = StabilityMonths::new(o, e);
    let ll = |x: f64| months.log_likelihood(x);
    // The ratio: grid on [1, 10], then golden section around the best grid point.
    let mut best = (1.0, ll(1.0));
    for i in 1..=9000 {
        let x = 1.0 + i as f64 * 0.001;
        let v = ll(x);
        if v > best.1 || best.1.is_nan() {
            best = (x, v);
        }
    }
    let (mut a, mut b) = ((best.0 - 0.001).max(1.0), (best.0 + 0.001).min(10.0));
    let g = 0.5 * (5f64.sqrt() - 1.0);
    for _ in 0..60 {
        let (c, d) = (b - g * (b - a), a + g * (b - a));
        if ll(c) > ll(d) {
            b = d;
        } else {
            a = c;
        }
    }
    let x_hat = 0.5 * (a + b);
    // Scale: the largest log-likelihood on [1, ∞) is at most that on a wide grid.
    let mut scale = best.1.max(ll(x_hat));
    for i in 0..=400 {
        scale = scale.max(ll(max_ratio * (1.0 + i as f64 * 0.25)));
    }
    if !scale.is_finite() {
        return TimeStability {
            ratio: Some(x_hat),
            p: if x_hat > max_ratio { 0.0 } else { 1.0 },
            stable: x_hat <= max_ratio && 1.0 > alpha,
        };
    }
    let lik = |x: f64| (ll(x) - scale).exp();
    let l0 = if max_ratio > 1.0 {
        integrate(&lik, 1.0, max_ratio, 64, 1e-12)
    } else {
        0.0
    };
    // ∫_maxRatio^∞ L(x) dx with x = maxRatio / u, dx = maxRatio / u² du, u ∈ (0, 1].
    let tail = |u: f64| {
        if u <= 0.0 {
            0.0
        } else {
            let x = max_ratio / u;
            lik(x) * max_ratio / (u * u)
        }
    };
    let l1 = integrate(&tail, 0.0, 1.0, 256, 1e-12);
    let p = if l0 == 0.0 && l1 == 0.0 {
        if x_hat > max_ratio {
            0.0
        } else {
            1.0
        }
    } else {
        chi2_1_upper(2.0 * (l1.ln() - l0.ln()))
    };
    TimeStability {
        ratio: Some(x_hat),
        p,
        stable: p > alpha,
    }
}

/// The key of one [`time_stability`] call: its inputs, the floats by their bits.
type StabilityKey = (Vec<u64>, Vec<u64>, u64, u64);

/// [`time_stability`] remembered by its inputs, for the pairs of one many-pairs unit: the
/// exposures of one outcome share its cases, so without season or calendar-time splines their
/// observed and expected monthly counts are the same and the test (≈ 10,000 likelihood
/// evaluations) runs once for all of them. A hit returns the result of the identical call, so
/// results are bit for bit those of [`time_stability`]. Threads asking for the same inputs at
/// once wait for the first one's result instead of computing it again.
#[derive(Debug, Default)]
pub struct TimeStabilityMemo {
    results: std::sync::Mutex<HashMap<StabilityKey, Arc<OnceLock<TimeStability>>>>,
}

impl TimeStabilityMemo {
    /// An empty memo.
    pub fn new() -> Self {
        Self::default()
    }

    /// [`time_stability`]`(observed, expected, max_ratio, alpha)`, computed once per distinct
    /// input.
    pub fn time_stability(
        &self,
        observed: &[u64],
        expected: &[f64],
        max_ratio: f64,
        alpha: f64,
    ) -> TimeStability {
        let key = (
            observed.to_vec(),
            expected.iter().map(|e| e.to_bits()).collect(),
            max_ratio.to_bits(),
            alpha.to_bits(),
        );
        let cell = {
            // A poisoned lock only means another thread panicked while holding it; the map
            // itself is still whole (entries are inserted in one step).
            let mut results = self.results.lock().unwrap_or_else(|e| e.into_inner());
            results.entry(key).or_default().clone()
        };
        cell.get_or_init(|| time_stability(observed, expected, max_ratio, alpha))
            .clone()
    }

    /// Distinct inputs seen so far.
    pub fn len(&self) -> usize {
        self.results.lock().unwrap_or_else(|e| e.into_inner()).len()
    }

    /// Whether nothing was asked yet.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// `P(χ²₁ > x)` (R `pchisq(x, 1, lower.tail = FALSE)`): 1 for x ≤ 0, 0 for +∞.
pub fn chi2_1_upper(x: f64) -> f64 {
    if x.is_nan() {
        return f64::NAN;
    }
    if x <= 0.0 {
        return 1.0;
    }
    2.0 * normal_cdf(-x.sqrt())
}

// ---------------------------------------------------------------------------------------------
// The results model's diagnostics (SelfControlledCaseSeries 5.x `exportToCsv`)
// ---------------------------------------------------------------------------------------------

/// `maxRatio` of R `computeTimeStability` (its default), with which the 5.x `exportToCsv` fills
/// `sccs_diagnostics_summary.time_trend_p` ("whether the mean monthly ratio between observed
/// and expected is no greater than 1.25").
pub const RESULTS_TIME_TREND_MAX_RATIO: f64 = 1.25;

/// `timeTrendPThreshold` and `preExposurePThreshold` of R `createSccsDiagnosticThresholds`
/// (5.x): the diagnostic passes when `p ≥` this.
pub const RESULTS_P_THRESHOLD: f64 = 0.05;

/// A p-value diagnostic of the results model (`time_trend_p`, `pre_exposure_p`): pass when
/// `p ≥ threshold`, fail below, not computed when there is no p (R `exportGroup`).
pub fn classify_p(p: Option<f64>, threshold: f64) -> Status {
    match p {
        Some(p) if !p.is_nan() => {
            if p >= threshold {
                Status::Pass
            } else {
                Status::Fail
            }
        }
        _ => Status::NotComputed,
    }
}

/// One-sided p from a log-likelihood ratio (EmpiricalCalibration's `computePFromLlr`, null
/// log RR 0): `P(χ²₁ > 2·llr) / 2` when the estimate is ≥ 0, one minus that when it is below.
pub fn p_from_llr(llr: f64, log_rr: f64) -> f64 {
    let upper = 0.5 * chi2_1_upper(2.0 * llr.max(0.0));
    if log_rr < 0.0 {
        1.0 - upper
    } else {
        upper
    }
}

/// One case of R `computePreExposureGain`: days observed in the 30 days before its first
/// exposure start and from it on (each capped at 30), and the outcomes in them.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct PreExposureCase {
    /// `min(first exposure start − case start, 30)`.
    pub days_before: f64,
    /// Outcomes 1–30 days before the first exposure start.
    pub outcomes_before: u64,
    /// `min(case end − first exposure start, 30)`.
    pub days_after: f64,
    /// Outcomes 0–30 days after the first exposure start.
    pub outcomes_after: u64,
}

/// Result of [`pre_exposure_gain`].
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct PreExposureGain {
    /// ln of the rate ratio before / after the first exposure start (±∞ when every outcome is
    /// on one side).
    pub log_ratio: f64,
    /// `ℓ(β̂) − ℓ(0)`.
    pub llr: f64,
    /// One-sided p against the null that the rate before is at most the rate after
    /// ([`p_from_llr`]).
    pub p: f64,
}

/// Conditional (per-case) Poisson log-likelihood of the pre-exposure indicator, without the
/// terms that do not depend on β: `Σ_i y_before,i·β − n_i·ln(b_i e^β + a_i)`.
fn pre_exposure_log_likelihood(cases: &[PreExposureCase], beta: f64) -> f64 {
    cases
        .iter()
        .map(|c| {
            let n = (c.outcomes_before + c.outcomes_after) as f64;
            let (x, y) = (c.days_before.ln() + beta, c.days_after.ln());
            let log_sum = x.max(y) + (-(x - y).abs()).exp().ln_1p();
            c.outcomes_before as f64 * beta - n * log_sum
        })
        .sum()
}

/// Pre-exposure gain (R `computePreExposureGain`, SelfControlledCaseSeries 5.x, the
/// `pre_exposure_p` of the results model): a conditional Poisson model, one stratum per case,
/// of the outcomes in the 30 days before against the 30 days from the first exposure start,
/// with the indicator "before" as the only covariate; `p` is one-sided
/// ([`p_from_llr`] of `ℓ(β̂) − ℓ(0)`).
///
/// Rows with no observed days are left out (R: `filter(daysObserved > 0)`), so a case
/// observed on one side only, or without outcomes, does not inform β. None when no case
/// informs it (R returns NA: the fit fails). When every informative outcome falls on one
/// side, β̂ is ±∞ and `llr` is the limit of `ℓ(β) − ℓ(0)` (Cyclops would stop at a large
/// finite β with the same p to many digits).
pub fn pre_exposure_gain(cases: &[PreExposureCase]) -> Option<PreExposureGain> {
    let informative: Vec<PreExposureCase> = cases
        .iter()
        .filter(|c| {
            c.days_before > 0.0 && c.days_after > 0.0 && c.outcomes_before + c.outcomes_after > 0
        })
        .copied()
        .collect();
    if informative.is_empty() {
        return None;
    }
    let before: u64 = informative.iter().map(|c| c.outcomes_before).sum();
    let total: u64 = informative
        .iter()
        .map(|c| c.outcomes_before + c.outcomes_after)
        .sum();
    let l0 = pre_exposure_log_likelihood(&informative, 0.0);
    let (log_ratio, l_max) = if before == 0 {
        // ℓ(β) → Σ −n_i ln a_i as β → −∞.
        let lim: f64 = informative
            .iter()
            .map(|c| -((c.outcomes_before + c.outcomes_after) as f64) * c.days_after.ln())
            .sum();
        (f64::NEG_INFINITY, lim)
    } else if before == total {
        // ℓ(β) → Σ −n_i ln b_i as β → +∞ (y_before,i = n_i).
        let lim: f64 = informative
            .iter()
            .map(|c| -((c.outcomes_before + c.outcomes_after) as f64) * c.days_before.ln())
            .sum();
        (f64::INFINITY, lim)
    } else {
        // The score Σ y_b − n·b e^β / (b e^β + a) decreases in β: bisection.
        let score = |beta: f64| -> f64 {
            informative
                .iter()
                .map(|c| {
                    let n = (c.outcomes_before + c.outcomes_after) as f64;
                    let w = 1.0 / (1.0 + (c.days_after.ln() - c.days_before.ln() - beta).exp());
                    c.outcomes_before as f64 - n * w
                })
                .sum()
        };
        let (mut lo, mut hi) = (-50.0f64, 50.0f64);
        for _ in 0..200 {
            let mid = 0.5 * (lo + hi);
            if score(mid) > 0.0 {
                lo = mid;
            } else {
                hi = mid;
            }
            if hi - lo < 1e-14 {
                break;
            }
        }
        let b = 0.5 * (lo + hi);
        (b, pre_exposure_log_likelihood(&informative, b))
    };
    let llr = (l_max - l0).max(0.0);
    Some(PreExposureGain {
        log_ratio,
        llr,
        p: p_from_llr(llr, log_ratio),
    })
}

// ---------------------------------------------------------------------------------------------
// Classification
// ---------------------------------------------------------------------------------------------

/// Whether the confidence interval [lb, ub] (IRR scale) intersects the null bounds (R
/// `checkEventObservationIndependenceAssumption`, `checkEventExposureIndependenceAssumption`:
/// "pass is TRUE if the confidence interval intersects the null bounds"). A missing bound is
/// unbounded on that side.
pub fn ci_intersects(lb: Option<f64>, ub: Option<f64>, null_bounds: [f64; 2]) -> bool {
    let lb = lb.unwrap_or(0.0);
    let ub = ub.unwrap_or(f64::INFINITY);
    lb <= null_bounds[1] && ub >= null_bounds[0]
}

/// MDRR: pass when `mdrr ≤ threshold` (SelfControlledCaseSeries 5 `Export.R`; not computed
/// when NaN).
pub fn classify_mdrr(mdrr: f64, t: &DiagnosticThresholds) -> Status {
    if mdrr.is_nan() {
        Status::NotComputed
    } else if mdrr <= t.mdrr {
        Status::Pass
    } else {
        Status::Fail
    }
}

/// EASE: pass when `ease ≤ threshold` (SelfControlledCaseSeries 5 `Export.R`), warn above
/// `ease_warning` when set.
pub fn classify_ease(ease: f64, t: &DiagnosticThresholds) -> Status {
    if ease.is_nan() {
        Status::NotComputed
    } else if ease > t.ease {
        Status::Fail
    } else if t.ease_warning.is_some_and(|w| ease >= w) {
        Status::Warn
    } else {
        Status::Pass
    }
}

/// Rare outcome (R `checkRareOutcomeAssumption`): passes when the analysis keeps every outcome
/// (not first-outcome-only) or the prevalence is at most the threshold (whether R's comparison
/// is strict was not confirmed).
pub fn classify_rare_outcome(
    prevalence: f64,
    first_outcome_only: bool,
    t: &DiagnosticThresholds,
) -> Status {
    if !first_outcome_only || prevalence <= t.rare_outcome_max_prevalence {
        Status::Pass
    } else if prevalence.is_nan() {
        Status::NotComputed
    } else {
        Status::Fail
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::rng::Rng;

    #[test]
    fn thresholds_defaults_and_checks() {
        let t = DiagnosticThresholds::default();
        t.check().unwrap();
        assert_eq!(t.event_exposure_null_bounds, [0.8, 1.25]);
        let bad = DiagnosticThresholds {
            mdrr: 0.5,
            ..t.clone()
        };
        assert!(bad
            .check()
            .unwrap_err()
            .to_string()
            .contains("diagnostics.mdrr"));
        let bad = DiagnosticThresholds {
            event_observation_null_bounds: [2.0, 0.5],
            ..t.clone()
        };
        assert!(bad
            .check()
            .unwrap_err()
            .to_string()
            .contains("event_observation_null_bounds"));
        let bad = DiagnosticThresholds {
            ease_warning: Some(0.3),
            ..t
        };
        assert!(bad
            .check()
            .unwrap_err()
            .to_string()
            .contains("ease_warning"));
    }

    /// The power at the MDRR found is the target power (the binary search's tolerance), and
    /// the MDRR decreases with more events.
    #[test]
    fn mdrr_hits_the_target_power() {
        let z = normal_quantile(1.0 - 0.025);
        for &(r, n) in &[(0.1, 50.0), (0.01, 200.0), (0.3, 20.0), (0.05, 1000.0)] {
            let m = mdrr(r, n, 0.05, 0.8, true);
            assert!(m > 1.0 && m < 22026.0, "{r} {n} {m}");
            let power = srl1_power(m.ln(), z, r, n, 0.025);
            assert!((power - 0.8).abs() < 1e-5, "{r} {n} {power}");
            assert!(mdrr(r, 2.0 * n, 0.05, 0.8, true) < m);
        }
        // No exposed time, no events, all time exposed.
        assert_eq!(mdrr(0.0, 10.0, 0.05, 0.8, true), f64::INFINITY);
        assert_eq!(mdrr(1.0, 10.0, 0.05, 0.8, true), f64::INFINITY);
        assert!((mdrr(0.1, 0.0, 0.05, 0.8, true) - 10f64.exp()).abs() < 1e-6);
    }

    /// Hand check of SRL1 at b = ln 2, r = 0.5, n = 100, z = 1.959964.
    #[test]
    fn srl1_power_by_hand() {
        let b = 2f64.ln();
        // e^b r + 1 − r = 1.5; p = 2/3; A = 2(2/3 ln 2 − ln 1.5) = 0.113266;
        // B = (ln 2)²/A · 0.5/2.25 = 0.9418...; zb = (√(11.33496) − 1.959964)/√B.
        let a = 2.0 * (2.0 / 3.0 * b - 1.5f64.ln());
        let bb = b * b / a * 0.5 / 2.25;
        let expect = normal_cdf(((100.0 * a).sqrt() - 1.959964) / bb.sqrt());
        let got = srl1_power(b, 1.959964, 0.5, 100.0, 0.025);
        assert!((got - expect).abs() < 1e-12);
        assert!((a - 0.113_266).abs() < 1e-6);
    }

    #[test]
    fn log_dpois_is_the_poisson_log_mass() {
        assert_eq!(log_factorial(0), 0.0);
        assert_eq!(log_factorial(1), 0.0);
        assert!((log_factorial(10) - 3_628_800f64.ln()).abs() < 1e-12);
        for (o, lambda) in [(0u64, 2.5f64), (1, 0.3), (4, 2.5), (12, 7.0)] {
            let fact: f64 = (1..=o).map(|k| k as f64).product();
            let direct = ((-lambda).exp() * lambda.powi(o as i32) / fact).ln();
            let got = log_dpois(o, lambda, log_factorial(o));
            assert!(
                (got - direct).abs() < 1e-12,
                "{o} {lambda}: {got} vs {direct}"
            );
        }
        assert_eq!(log_dpois(0, 0.0, 0.0), 0.0);
        assert_eq!(log_dpois(3, 0.0, log_factorial(3)), f64::NEG_INFINITY);
    }

    #[test]
    fn precomputed_months_give_the_stability_log_likelihood() {
        let o = [0u64, 3, 17, 1, 250, 9];
        let e = [0.4, 2.2, 12.5, 3.0, 231.0, 9.0];
        let months = StabilityMonths::new(&o, &e);
        for x in [1.0, 1.001, 1.37, 2.5, 9.99, 55.0, 1e4] {
            let want = time_stability_log_likelihood(&o, &e, x);
            let got = months.log_likelihood(x);
            assert!(
                (got - want).abs() <= 1e-10 * want.abs().max(1.0),
                "{x}: {got} vs {want}"
            );
        }
        // A month expected to have none: −∞ when it has an outcome, nothing when it has none.
        let m = StabilityMonths::new(&[2, 0], &[0.0, 0.0]);
        assert_eq!(m.log_likelihood(1.5), f64::NEG_INFINITY);
        assert_eq!(
            m.log_likelihood(1.5),
            time_stability_log_likelihood(&[2, 0], &[0.0, 0.0], 1.5)
        );
        let m = StabilityMonths::new(&[0, 4], &[0.0, 2.0]);
        let want = time_stability_log_likelihood(&[0, 4], &[0.0, 2.0], 1.5);
        assert!((m.log_likelihood(1.5) - want).abs() < 1e-12);
    }

    #[test]
    fn time_stability_small_cases() {
        // One month: not testable.
        let t = time_stability(&[3], &[3.0], 1.1, 0.05);
        assert_eq!(t.ratio, None);
        assert!(t.stable);
        // Observed = expected: ratio 1, stable.
        let t = time_stability(&[5, 5, 5, 5], &[5.0; 4], 1.1, 0.05);
        assert!((t.ratio.unwrap() - 1.0).abs() < 1e-3);
        assert!(t.p > 0.05 && t.stable, "{t:?}");
        // Months alternately three times too high and too low: unstable.
        let t = time_stability(&[30, 3, 30, 3, 30, 3], &[10.0; 6], 1.1, 0.05);
        assert!((t.ratio.unwrap() - 3.0).abs() < 0.2, "{t:?}");
        assert!(t.p < 0.05 && !t.stable, "{t:?}");
    }

    /// Slow reference: trapezoid rule on a fine grid up to x = 1000 (the likelihood is
    /// negligible beyond), in log space.
    fn reference_p(o: &[u64], e: &[f64], max_ratio: f64) -> f64 {
        let ll = |x: f64| time_stability_log_likelihood(o, e, x);
        let xs_l0: Vec<f64> = (0..=20_000)
            .map(|i| 1.0 + (max_ratio - 1.0) * i as f64 / 20_000.0)
            .collect();
        let xs_l1: Vec<f64> = (0..=400_000)
            .map(|i| max_ratio * (1000.0 / max_ratio).powf(i as f64 / 400_000.0))
            .collect();
        let scale = xs_l0
            .iter()
            .chain(&xs_l1)
            .map(|&x| ll(x))
            .fold(f64::NEG_INFINITY, f64::max);
        let trap = |xs: &[f64]| {
            xs.windows(2)
                .map(|w| {
                    0.5 * (w[1] - w[0]) * ((ll(w[0]) - scale).exp() + (ll(w[1]) - scale).exp())
                })
                .sum::<f64>()
        };
        let (l0, l1) = (trap(&xs_l0), trap(&xs_l1));
        chi2_1_upper(2.0 * (l1.ln() - l0.ln()))
    }

    #[test]
    fn stability_memo_returns_the_direct_result_once_per_input() {
        let memo = TimeStabilityMemo::new();
        assert!(memo.is_empty());
        let a = (vec![30u64, 3, 30, 3], vec![10.0, 10.0, 10.0, 10.0]);
        let b = (vec![5u64, 6, 5, 6], vec![5.0, 6.0, 5.0, 6.0]);
        // Eight threads ask for the same two inputs (with two thresholds) at once.
        let got: Vec<TimeStability> = std::thread::scope(|s| {
            let handles: Vec<_> = (0..8)
                .map(|t| {
                    let (memo, a, b) = (&memo, &a, &b);
                    s.spawn(move || {
                        let (o, e) = if t % 2 == 0 { a } else { b };
                        memo.time_stability(o, e, if t < 4 { 1.1 } else { 1.25 }, 0.05)
                    })
                })
                .collect();
            handles.into_iter().map(|h| h.join().unwrap()).collect()
        });
        for (t, g) in got.iter().enumerate() {
            let (o, e) = if t % 2 == 0 { &a } else { &b };
            let want = time_stability(o, e, if t < 4 { 1.1 } else { 1.25 }, 0.05);
            assert_eq!(g.ratio.map(f64::to_bits), want.ratio.map(f64::to_bits));
            assert_eq!(g.p.to_bits(), want.p.to_bits());
            assert_eq!(g.stable, want.stable);
        }
        assert_eq!(memo.len(), 4);
        // An expected count differing in the last bit is another input.
        let mut e = a.1.clone();
        e[0] = f64::from_bits(e[0].to_bits() + 1);
        memo.time_stability(&a.0, &e, 1.1, 0.05);
        assert_eq!(memo.len(), 5);
    }

    #[test]
    fn time_stability_matches_a_slow_reference() {
        let mut rng = Rng::new(20261124);
        for case in 0..12 {
            let months = 2 + (rng.next_u64() % 8) as usize;
            let level = 1.0 + 20.0 * rng.uniform();
            let spread = 1.0 + 1.5 * rng.uniform();
            let mut o = Vec::new();
            let mut e = Vec::new();
            for _ in 0..months {
                let ex = level * (0.5 + rng.uniform());
                let f = if rng.uniform() < 0.5 {
                    spread
                } else {
                    1.0 / spread
                };
                o.push(((ex * f).round() as u64).max(1));
                e.push(ex);
            }
            let got = time_stability(&o, &e, 1.1, 0.05);
            let want = reference_p(&o, &e, 1.1);
            assert!(
                (got.p - want).abs() < 1e-4 * want.max(1e-3) + 1e-9,
                "case {case}: o {o:?} e {e:?}: {} vs {want}",
                got.p
            );
            assert_eq!(got.stable, got.p > 0.05);
        }
    }

    #[test]
    fn month_counts_by_hand() {
        // Case A: Jan 17 – Mar 31 (months 0..2), 2 outcomes in Feb;
        // case B: Feb 1 – Feb 28 (one month), 1 outcome in Feb.
        let a = CaseMonths {
            start_month: 0,
            start_day_of_month: 17,
            end_month: 2,
            end_day_of_month: 31,
            outcome_months: vec![1, 1],
        };
        let b = CaseMonths {
            start_month: 1,
            start_day_of_month: 1,
            end_month: 1,
            end_day_of_month: 28,
            outcome_months: vec![1],
        };
        let rows = outcome_rate_per_month(&[a.clone(), b.clone()], None);
        assert_eq!(rows.len(), 1);
        // A: fractions 15/31 and 31/31; months = 2 + 15/31 + 1; rate = 2 / that; Feb weight 1.
        let rate_a = 2.0 / (2.0 + 15.0 / 31.0 + 1.0);
        // B: one month: fractions 31/31 and 28/31, months = 0 + 1 + 28/31; Feb is its start
        // month, weight 31/31.
        let rate_b = 1.0 / (1.0 + 28.0 / 31.0);
        assert_eq!(rows[0].month, 1);
        assert_eq!(rows[0].observed, 3);
        assert!((rows[0].expected - (rate_a + rate_b)).abs() < 1e-12);
        // A constant month effect changes nothing (the correction cancels it).
        let rr = |_m: i64| 2.5;
        let adj = outcome_rate_per_month(&[a, b], Some(&rr));
        assert!((adj[0].expected - rows[0].expected).abs() < 1e-12);
    }

    /// Every case observed 30 days on each side: the MLE is ln(before / after) and
    /// ℓ(β) − ℓ(0) = y_b·β − N·ln((e^β + 1) / 2) by hand.
    #[test]
    fn pre_exposure_gain_by_hand() {
        let case = |b, a| PreExposureCase {
            days_before: 30.0,
            outcomes_before: b,
            days_after: 30.0,
            outcomes_after: a,
        };
        let cases = [case(3, 1), case(2, 0), case(1, 1), case(0, 0)];
        let g = pre_exposure_gain(&cases).unwrap();
        let (yb, n) = (6.0f64, 8.0f64);
        let beta = (yb / (n - yb)).ln();
        assert!((g.log_ratio - beta).abs() < 1e-10, "{g:?}");
        let llr = yb * beta - n * ((beta.exp() + 1.0) / 2.0).ln();
        assert!((g.llr - llr).abs() < 1e-10, "{g:?}");
        let p = 0.5 * chi2_1_upper(2.0 * llr);
        assert!((g.p - p).abs() < 1e-12);
        // Mirrored: the rate is lower before, p above 1/2.
        let mirrored: Vec<_> = cases
            .iter()
            .map(|c| case(c.outcomes_after, c.outcomes_before))
            .collect();
        let m = pre_exposure_gain(&mirrored).unwrap();
        assert!((m.log_ratio + beta).abs() < 1e-10);
        assert!((m.p - (1.0 - p)).abs() < 1e-12);
        // Nothing informs β; everything before: β̂ = +∞, llr = N ln 2.
        assert_eq!(pre_exposure_gain(&[case(0, 0)]), None);
        let all = pre_exposure_gain(&[case(2, 0), case(1, 0)]).unwrap();
        assert_eq!(all.log_ratio, f64::INFINITY);
        assert!((all.llr - 3.0 * 2f64.ln()).abs() < 1e-12);
        assert_eq!(classify_p(Some(0.05), RESULTS_P_THRESHOLD), Status::Pass);
        assert_eq!(classify_p(Some(0.049), RESULTS_P_THRESHOLD), Status::Fail);
        assert_eq!(classify_p(None, RESULTS_P_THRESHOLD), Status::NotComputed);
    }

    #[test]
    fn classifications() {
        let t = DiagnosticThresholds::default();
        assert_eq!(classify_mdrr(9.9, &t), Status::Pass);
        assert_eq!(classify_mdrr(10.1, &t), Status::Fail);
        assert_eq!(classify_mdrr(f64::INFINITY, &t), Status::Fail);
        assert_eq!(classify_ease(0.2, &t), Status::Pass);
        assert_eq!(classify_ease(0.3, &t), Status::Fail);
        let tw = DiagnosticThresholds {
            ease_warning: Some(0.1),
            ..t.clone()
        };
        assert_eq!(classify_ease(0.2, &tw), Status::Warn);
        assert_eq!(classify_rare_outcome(0.5, false, &t), Status::Pass);
        assert_eq!(classify_rare_outcome(0.05, true, &t), Status::Pass);
        assert_eq!(classify_rare_outcome(0.5, true, &t), Status::Fail);
        assert!(ci_intersects(Some(1.5), Some(3.0), [0.5, 2.0]));
        assert!(!ci_intersects(Some(2.5), Some(3.0), [0.5, 2.0]));
        assert!(!ci_intersects(Some(0.1), Some(0.4), [0.5, 2.0]));
        assert!(ci_intersects(None, Some(0.6), [0.5, 2.0]));
        assert!((chi2_1_upper(3.841_458_820_694_124) - 0.05).abs() < 1e-12);
    }
}
