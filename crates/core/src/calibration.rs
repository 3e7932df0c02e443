//! Empirical calibration of effect estimates with negative controls: the maths of the OHDSI
//! `EmpiricalCalibration` R package (empirical null, calibrated p-values, calibrated confidence
//! intervals, expected absolute systematic error), without its plots or MCMC.
//!
//! # Conventions
//!
//! Every effect is on the **log scale** (natural log): `log_rr` is the estimated log relative
//! risk (log HR, log IRR, log OR …) and `se_log_rr` its standard error. A negative control is an
//! exposure–outcome pair believed to have true relative risk 1 (log RR = 0).
//!
//! # Model
//!
//! * **Empirical null** (Schuemie et al. 2014). The systematic error of a study design is
//!   `N(μ, σ²)`: the estimate of a negative control is `θ_i ~ N(b_i, se_i²)` with bias
//!   `b_i ~ N(μ, σ²)`, so marginally `θ_i ~ N(μ, σ² + se_i²)`. [`fit_null`] maximizes
//!
//!   `ℓ(μ, σ) = −½ Σ_i [ ln(2π(σ² + se_i²)) + (θ_i − μ)² / (σ² + se_i²) ]`
//!
//!   over μ ∈ ℝ, σ ≥ 0 exactly (profile over `t = σ²`: for fixed `t` the best μ is the
//!   weighted mean with weights `1/(t + se_i²)`; the profile is scanned on a grid, the best cell
//!   refined by Brent's method on the profile score, and `σ = 0` is returned when the maximum
//!   lies on the boundary).
//! * **Calibrated p-value** (Schuemie et al. 2014). Under the null hypothesis an estimate with
//!   standard error `se` is `N(μ, σ² + se²)`, so with `z = (θ − μ)/√(σ² + se²)` the two-sided
//!   p-value is `2Φ(−|z|)`, the upper one-sided `Φ(−z)` and the lower one-sided `Φ(z)`.
//! * **Systematic error model** (Schuemie et al. 2018). At true log RR `x` the estimate is
//!   `N(a + b·x, (c + d·|x|)² + se²)`; [`convert_null_to_error_model`] takes `a = μ`, `b = 1`,
//!   `c = σ`, `d = 0` (the error does not depend on the true effect). The calibrated bound at
//!   coverage `w` solves `z + (a + b·x − θ)/√((c + d·|x|)² + se²) = 0` for `x` with
//!   `z = ±Φ⁻¹((1 + w)/2)` (lower bound: `+`, upper bound: `−`), the calibrated point estimate
//!   solves it with `z = 0`, and the calibrated standard error is
//!   `(ub − lb) / (2 Φ⁻¹((1 + w)/2))`.
//! * **EASE** (Schuemie et al. 2020): the expected absolute systematic error of the fitted null,
//!   `E|X|` for `X ~ N(μ, σ²)`, i.e. the mean of the folded normal
//!   `σ √(2/π) e^{−μ²/(2σ²)} + μ (1 − 2Φ(−μ/σ))` (and `|μ|` when `σ = 0`).
//!
//! # Functions
//!
//! | Rust | R (`EmpiricalCalibration`) |
//! |---|---|
//! | [`fit_null`] | `fitNull(logRr, seLogRr)` |
//! | [`EmpiricalNull::new`] | a `null` object built by hand, e.g. `c(mean = 0, sd = 0)` |
//! | [`calibrate_p`], [`calibrate_p_sided`] | `calibrateP(null, logRr, seLogRr, twoSided, upper)` |
//! | [`traditional_p`] | `computeTraditionalP(logRr, seLogRr, twoSided, upper)` |
//! | [`convert_null_to_error_model`], [`SystematicErrorModel::from_null`] | `convertNullToErrorModel(null, meanSlope, sdSlope)` |
//! | [`calibrate_confidence_interval`] | `calibrateConfidenceInterval(logRr, seLogRr, model, ciWidth)` |
//! | [`ease`] | `computeExpectedAbsoluteSystematicError(null)` |
//! | [`drop_non_finite`] | the silent row dropping at the top of `fitNull` |
//! | [`normal_cdf`], [`normal_quantile`], [`normal_pdf`] | `pnorm`, `qnorm`, `dnorm` |
//!
//! # Differences from the R package
//!
//! * **Bad input is an error.** `fitNull` silently drops (with a warning) controls whose log RR
//!   or SE is `NA`/infinite and fits whatever is left (even nothing); [`fit_null`] rejects a NaN
//!   or infinite log RR, a NaN, infinite, zero or negative SE, mismatched lengths and fewer than
//!   5 controls, naming the argument and the element. [`drop_non_finite`] reproduces the R
//!   package's dropping for callers who want it. Likewise `calibrateP` and
//!   `calibrateConfidenceInterval` return `NA` for non-finite input where these functions
//!   return an error.
//! * **Exact optimum.** `fitNull` runs Nelder–Mead from `(μ, 1/σ²) = (0, 100)` on the precision
//!   scale (switching to the `σ = 0` likelihood below `σ = 1e-6`), so its answer is the maximum
//!   only to Nelder–Mead's convergence test (relative 1e-8 on the objective, not on μ and σ), and
//!   a boundary maximum comes out as a small positive σ. [`fit_null`] finds the maximum to
//!   machine precision and reports `σ = 0` exactly on the boundary. Expect agreement with R to
//!   a few decimals, not to the last digit.
//! * **Exact bounds.** `calibrateConfidenceInterval` finds each bound with `uniroot` on
//!   `[−100, 100]` at its default tolerance (about 1.2e-4), returning `NA` when the root is not
//!   bracketed there. [`calibrate_confidence_interval`] uses the closed form when `d = 0` (exact,
//!   any range) and otherwise Brent's method on `[−100, 100]` to machine precision, and returns
//!   an error when the bound is not bracketed.
//! * **Tails.** `computeTraditionalP` computes the upper one-sided p-value as `1 − Φ(z)`;
//!   [`traditional_p`] uses `Φ(−z)`, which keeps its relative accuracy in the far tail.
//! * Only the current (non-legacy) systematic error model, `sd = c + d·|x|`, is implemented; the
//!   MCMC null (`fitMcmcNull`) and non-normal likelihood approximations are not.
//!
//! # References
//!
//! * Schuemie MJ, Ryan PB, DuMouchel W, Suchard MA, Madigan D. Interpreting observational
//!   studies: why empirical calibration is needed to correct p-values. *Statistics in Medicine*
//!   2014;33(2):209–218. doi:10.1002/sim.5925
//! * Schuemie MJ, Hripcsak G, Ryan PB, Madigan D, Suchard MA. Empirical confidence interval
//!   calibration for population-level effect estimation studies in observational healthcare
//!   data. *PNAS* 2018;115(11):2571–2577. doi:10.1073/pnas.1708282114
//! * Schuemie MJ, Cepeda MS, Suchard MA, et al. How confident are we about observational
//!   findings in health care: a benchmark study. *Harvard Data Science Review* 2020;2(1)
//!   (expected absolute systematic error).
//! * Cody WJ. Rational Chebyshev approximations for the error function. *Mathematics of
//!   Computation* 1969;23:631–637 (the algorithm of R's `pnorm`).
//! * Wichura MJ. Algorithm AS 241: the percentage points of the normal distribution. *Applied
//!   Statistics* 1988;37:477–484 (the algorithm of R's `qnorm`).

use crate::error::{Error, Result};

/// Fewest negative controls [`fit_null`] accepts.
pub const MIN_NEGATIVE_CONTROLS: usize = 5;

/// `1/√(2π)`.
const FRAC_1_SQRT_2PI: f64 = 0.398_942_280_401_432_7;
/// `ln(2π)`.
const LN_2PI: f64 = 1.837_877_066_409_345_5;

// ---------------------------------------------------------------------------------------------
// The standard normal distribution
// ---------------------------------------------------------------------------------------------

/// Standard normal density `φ(x) = e^{−x²/2}/√(2π)`.
pub fn normal_pdf(x: f64) -> f64 {
    FRAC_1_SQRT_2PI * (-0.5 * x * x).exp()
}

/// `e^{−y²/2} · r`, with `y²` split as `ysq² + (y − ysq)(y + ysq)` where `ysq` is `y` rounded
/// down to a multiple of 1/16, so that `ysq²` is exact and the exponential keeps full relative
/// accuracy for large `y` (Cody's device).
fn gaussian_tail_scale(y: f64, r: f64) -> f64 {
    let ysq = (y * 16.0).trunc() / 16.0;
    let del = (y - ysq) * (y + ysq);
    (-0.5 * ysq * ysq).exp() * (-0.5 * del).exp() * r
}

/// Standard normal distribution function `Φ(x) = P(Z ≤ x)`.
///
/// W. J. Cody's rational Chebyshev approximations (the algorithm of R's `pnorm`): relative
/// error near machine precision everywhere, including the lower tail down to `Φ(−37.5) ≈ 5e-309`;
/// `0` below `x = −37.5193` and `1` above `8.2924` (where `1 − Φ(x)` is below half an ulp of 1).
/// Upper-tail probabilities are `normal_cdf(−x)`, which is exact by symmetry. NaN gives NaN.
// Cody's published coefficients, kept digit for digit.
#[allow(clippy::excessive_precision)]
pub fn normal_cdf(x: f64) -> f64 {
    const A: [f64; 5] = [
        2.2352520354606839287,
        161.02823106855587881,
        1067.6894854603709582,
        18154.981253343561249,
        0.065682337918207449113,
    ];
    const B: [f64; 4] = [
        47.20258190468824187,
        976.09855173777669322,
        10260.932208618978205,
        45507.789335026729956,
    ];
    const C: [f64; 9] = [
        0.39894151208813466764,
        8.8831497943883759412,
        93.506656132177855979,
        597.27027639480026226,
        2494.5375852903726711,
        6848.1904505362823326,
        11602.651437647350124,
        9842.7148383839780218,
        1.0765576773720192317e-8,
    ];
    const D: [f64; 8] = [
        22.266688044328115691,
        235.38790178262499861,
        1519.377599407554805,
        6485.558298266760755,
        18615.571640885098091,
        34900.952721145977266,
        38912.003286093271411,
        19685.429676859990727,
    ];
    const P: [f64; 6] = [
        0.21589853405795699,
        0.1274011611602473639,
        0.022235277870649807,
        0.001421619193227893466,
        2.9112874951168792e-5,
        0.02307344176494017303,
    ];
    const Q: [f64; 5] = [
        1.28426009614491121,
        0.468238212480865118,
        0.0659881378689285515,
        0.00378239633202758244,
        7.29751555083966205e-5,
    ];
    /// √32: the end of the middle range.
    const SQRT_32: f64 = 5.656854249492380195;

    if x.is_nan() {
        return x;
    }
    let y = x.abs();
    if y <= 0.67448975 {
        // |x| ≤ Φ⁻¹(3/4): Φ(x) = 1/2 + x·R(x²).
        let (num, den) = if y > 0.5 * f64::EPSILON {
            let xsq = x * x;
            let mut num = A[4] * xsq;
            let mut den = xsq;
            for i in 0..3 {
                num = (num + A[i]) * xsq;
                den = (den + B[i]) * xsq;
            }
            (num, den)
        } else {
            (0.0, 0.0)
        };
        return 0.5 + x * (num + A[3]) / (den + B[3]);
    }
    // The tail probability P(Z > |x|).
    let tail = if y <= SQRT_32 {
        let mut num = C[8] * y;
        let mut den = y;
        for i in 0..7 {
            num = (num + C[i]) * y;
            den = (den + D[i]) * y;
        }
        gaussian_tail_scale(y, (num + C[7]) / (den + D[7]))
    } else if y < 37.5193 {
        let xsq = 1.0 / (y * y);
        let mut num = P[5] * xsq;
        let mut den = xsq;
        for i in 0..4 {
            num = (num + P[i]) * xsq;
            den = (den + Q[i]) * xsq;
        }
        let r = xsq * (num + P[4]) / (den + Q[4]);
        gaussian_tail_scale(y, (FRAC_1_SQRT_2PI - r) / y)
    } else {
        0.0
    };
    if x > 0.0 {
        1.0 - tail
    } else {
        tail
    }
}

/// Horner evaluation of `c[0] + c[1]·x + … + c[n]·x^n`.
fn polynomial(c: &[f64], x: f64) -> f64 {
    c.iter().rev().fold(0.0, |acc, &ci| acc * x + ci)
}

/// Standard normal quantile function `Φ⁻¹(p)`.
///
/// Wichura's AS 241 (PPND16, the algorithm of R's `qnorm`, about 1e-16 relative) followed by one
/// Newton step on [`normal_cdf`] taken on the smaller tail (so no `1 − p` cancellation).
/// `p = 0` gives `−∞`, `p = 1` gives `+∞`, and `p` outside `[0, 1]` or NaN gives NaN.
// Wichura's published coefficients, kept digit for digit.
#[allow(clippy::excessive_precision)]
pub fn normal_quantile(p: f64) -> f64 {
    const A: [f64; 8] = [
        3.387132872796366608,
        133.14166789178437745,
        1971.5909503065514427,
        13731.693765509461125,
        45921.953931549871457,
        67265.770927008700853,
        33430.575583588128105,
        2509.0809287301226727,
    ];
    const B: [f64; 8] = [
        1.0,
        42.313330701600911252,
        687.1870074920579083,
        5394.1960214247511077,
        21213.794301586595867,
        39307.89580009271061,
        28729.085735721942674,
        5226.495278852854561,
    ];
    const C: [f64; 8] = [
        1.42343711074968357734,
        4.6303378461565452959,
        5.7694972214606914055,
        3.64784832476320460504,
        1.27045825245236838258,
        0.24178072517745061177,
        0.0227238449892691845833,
        7.7454501427834140764e-4,
    ];
    const D: [f64; 8] = [
        1.0,
        2.05319162663775882187,
        1.6763848301838038494,
        0.68976733498510000455,
        0.14810397642748007459,
        0.0151986665636164571966,
        5.475938084995344946e-4,
        1.05075007164441684324e-9,
    ];
    const E: [f64; 8] = [
        6.6579046435011037772,
        5.4637849111641143699,
        1.7848265399172913358,
        0.29656057182850489123,
        0.026532189526576123093,
        1.2426609473880784386e-3,
        2.71155556874348757815e-5,
        2.01033439929228813265e-7,
    ];
    const F: [f64; 8] = [
        1.0,
        0.5998322065558879377,
        0.13692988092273580531,
        0.0148753612908506148525,
        7.868691311456132591e-4,
        1.8463183175100546818e-5,
        1.4215117583164458887e-7,
        2.04426310338993978564e-15,
    ];

    if p.is_nan() || !(0.0..=1.0).contains(&p) {
        return f64::NAN;
    }
    if p == 0.0 {
        return f64::NEG_INFINITY;
    }
    if p == 1.0 {
        return f64::INFINITY;
    }
    let q = p - 0.5;
    if q == 0.0 {
        return 0.0;
    }
    // The smaller tail probability, exact: for p > 1/2, 1 − p is exact (Sterbenz).
    let tail = if q < 0.0 { p } else { 1.0 - p };
    let magnitude = if q.abs() <= 0.425 {
        let r = 0.180625 - q * q;
        (q * polynomial(&A, r) / polynomial(&B, r)).abs()
    } else {
        let r = (-tail.ln()).sqrt();
        if r <= 5.0 {
            let r = r - 1.6;
            polynomial(&C, r) / polynomial(&D, r)
        } else {
            let r = r - 5.0;
            polynomial(&E, r) / polynomial(&F, r)
        }
    };
    // One Newton step on the lower tail: x = −magnitude solves Φ(x) = tail.
    let x = -magnitude;
    let density = normal_pdf(x);
    let refined = if x > -37.5 && density > 0.0 {
        x - (normal_cdf(x) - tail) / density
    } else {
        x
    };
    if q < 0.0 {
        refined
    } else {
        -refined
    }
}

// ---------------------------------------------------------------------------------------------
// Input checks
// ---------------------------------------------------------------------------------------------

fn check_log_rr(name: &str, index: Option<usize>, value: f64) -> Result<()> {
    if value.is_finite() {
        return Ok(());
    }
    let at = index.map_or(String::new(), |i| format!("element {i} is "));
    Err(Error::option(
        name,
        format!("{at}{value}: a log relative risk must be finite"),
    ))
}

fn check_se(name: &str, index: Option<usize>, value: f64) -> Result<()> {
    if value.is_finite() && value > 0.0 {
        return Ok(());
    }
    let at = index.map_or(String::new(), |i| format!("element {i} is "));
    Err(Error::option(
        name,
        format!("{at}{value}: a standard error must be finite and positive"),
    ))
}

fn check_lengths(log_rr: &[f64], se_log_rr: &[f64]) -> Result<()> {
    if log_rr.len() != se_log_rr.len() {
        return Err(Error::option(
            "se_log_rr",
            format!(
                "has {} elements but log_rr has {}; they must be of equal length",
                se_log_rr.len(),
                log_rr.len()
            ),
        ));
    }
    Ok(())
}

/// The rows the R package would use: drops, as `fitNull` does (with a warning there), every
/// pair whose log RR or SE is NaN or infinite, and returns the remaining `(log_rr, se_log_rr)`.
///
/// Zero or negative standard errors are kept (R keeps them); [`fit_null`] still rejects them.
/// Errors when the lengths differ.
pub fn drop_non_finite(log_rr: &[f64], se_log_rr: &[f64]) -> Result<(Vec<f64>, Vec<f64>)> {
    check_lengths(log_rr, se_log_rr)?;
    Ok(log_rr
        .iter()
        .zip(se_log_rr)
        .filter(|(t, s)| t.is_finite() && s.is_finite())
        .map(|(&t, &s)| (t, s))
        .unzip())
}

// ---------------------------------------------------------------------------------------------
// The empirical null
// ---------------------------------------------------------------------------------------------

/// An empirical null distribution `N(mean, sd²)` of the systematic error (log scale).
///
/// Built by [`fit_null`] (which also records the maximized log-likelihood and the number of
/// controls) or by hand with [`EmpiricalNull::new`].
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct EmpiricalNull {
    mean: f64,
    sd: f64,
    log_likelihood: Option<f64>,
    n: usize,
}

impl EmpiricalNull {
    /// A null given by its parameters (R: `null <- c(mean = …, sd = …); class(null) <- "null"`).
    /// Errors unless `mean` is finite and `sd` is finite and ≥ 0.
    pub fn new(mean: f64, sd: f64) -> Result<Self> {
        if !mean.is_finite() {
            return Err(Error::option(
                "mean",
                format!("{mean}: the null's mean must be finite"),
            ));
        }
        if !(sd.is_finite() && sd >= 0.0) {
            return Err(Error::option(
                "sd",
                format!("{sd}: the null's standard deviation must be finite and ≥ 0"),
            ));
        }
        Ok(EmpiricalNull {
            mean,
            sd,
            log_likelihood: None,
            n: 0,
        })
    }

    /// μ, the mean of the systematic error (log scale).
    pub fn mean(&self) -> f64 {
        self.mean
    }

    /// σ ≥ 0, the standard deviation of the systematic error (log scale).
    pub fn sd(&self) -> f64 {
        self.sd
    }

    /// The maximized log-likelihood `ℓ(μ̂, σ̂)` (see the [module docs](self)); `None` for a null
    /// built with [`EmpiricalNull::new`].
    pub fn log_likelihood(&self) -> Option<f64> {
        self.log_likelihood
    }

    /// Number of negative controls the null was fitted to; 0 for a null built by hand.
    pub fn n(&self) -> usize {
        self.n
    }
}

/// The negative controls' estimates and variances, with the profile likelihood in `t = σ²`.
struct Controls<'a> {
    theta: &'a [f64],
    var: Vec<f64>,
}

impl Controls<'_> {
    /// The maximizing μ for fixed `t`: the mean of θ weighted by `1/(t + se_i²)`.
    fn mean_at(&self, t: f64) -> f64 {
        let (mut sw, mut swt) = (0.0, 0.0);
        for (&th, &v) in self.theta.iter().zip(&self.var) {
            let w = 1.0 / (t + v);
            sw += w;
            swt += w * th;
        }
        swt / sw
    }

    /// `ℓ(μ, σ² = t)`.
    fn log_likelihood(&self, mu: f64, t: f64) -> f64 {
        let mut sum = 0.0;
        for (&th, &v) in self.theta.iter().zip(&self.var) {
            let s2 = t + v;
            let d = th - mu;
            sum += LN_2PI + s2.ln() + d * d / s2;
        }
        -0.5 * sum
    }

    /// The profile log-likelihood `max_μ ℓ(μ, t)`.
    fn profile(&self, t: f64) -> f64 {
        self.log_likelihood(self.mean_at(t), t)
    }

    /// `d/dt` of the profile log-likelihood (`∂ℓ/∂t` at `μ̂(t)`, as `∂ℓ/∂μ = 0` there):
    /// `½ Σ [w_i² (θ_i − μ̂)² − w_i]`.
    fn score(&self, t: f64) -> f64 {
        let mu = self.mean_at(t);
        let mut sum = 0.0;
        for (&th, &v) in self.theta.iter().zip(&self.var) {
            let w = 1.0 / (t + v);
            let d = th - mu;
            sum += w * (w * d * d - 1.0);
        }
        0.5 * sum
    }
}

/// Brent's root finder (Brent 1973, `zeroin`) on `[a, b]` with `f(a)`, `f(b)` of opposite signs
/// (or one of them zero). Converges to within `4·ε·|x| + abs_tol`; NaN when `f` turns NaN.
/// The one implementation is [`crate::model::inference`]'s.
fn brent_root(f: impl Fn(f64) -> f64, a: f64, b: f64, fa: f64, fb: f64, abs_tol: f64) -> f64 {
    if fa == 0.0 {
        return a;
    }
    crate::model::inference::brent(a, fa, b, fb, abs_tol, 500, |x| Ok(f(x)))
        .ok()
        .flatten()
        .unwrap_or(f64::NAN)
}

/// Golden-section search for the maximum of `f` on `[a, b]` (the fallback when the profile
/// score does not change sign across the best grid cell).
fn golden_max(f: impl Fn(f64) -> f64, mut a: f64, mut b: f64) -> f64 {
    let r = 0.5 * (5f64.sqrt() - 1.0);
    let mut x1 = b - r * (b - a);
    let mut x2 = a + r * (b - a);
    let (mut f1, mut f2) = (f(x1), f(x2));
    for _ in 0..200 {
        if (b - a).abs() <= 4.0 * f64::EPSILON * (a.abs() + b.abs()) {
            break;
        }
        if f1 >= f2 {
            b = x2;
            x2 = x1;
            f2 = f1;
            x1 = b - r * (b - a);
            f1 = f(x1);
        } else {
            a = x1;
            x1 = x2;
            f1 = f2;
            x2 = a + r * (b - a);
            f2 = f(x2);
        }
    }
    if f1 >= f2 {
        x1
    } else {
        x2
    }
}

/// Fits the empirical null distribution to negative controls (R: `fitNull(logRr, seLogRr)`).
///
/// Maximizes `ℓ(μ, σ) = −½ Σ_i [ln(2π(σ² + se_i²)) + (θ_i − μ)²/(σ² + se_i²)]` over μ and
/// σ ≥ 0 (see the [module docs](self)). The profile in `t = σ²` is maximized on `[0, R²]`,
/// `R = max θ − min θ` (beyond `R²` every term of its derivative is negative): a scan of 400
/// log-spaced σ values over eight decades below `R` plus σ = 0, then Brent's method on the
/// profile score in the best cell (golden section if the score does not change sign there);
/// `σ = 0` when the boundary is the maximum.
///
/// Errors (naming the argument and element): lengths differ; a log RR that is NaN or infinite;
/// a standard error that is NaN, infinite, zero or negative; fewer than
/// [`MIN_NEGATIVE_CONTROLS`] controls. (The R package drops non-finite rows instead; see
/// [`drop_non_finite`].)
pub fn fit_null(log_rr: &[f64], se_log_rr: &[f64]) -> Result<EmpiricalNull> {
    check_lengths(log_rr, se_log_rr)?;
    for (i, (&t, &s)) in log_rr.iter().zip(se_log_rr).enumerate() {
        check_log_rr("log_rr", Some(i), t)?;
        check_se("se_log_rr", Some(i), s)?;
    }
    let n = log_rr.len();
    if n < MIN_NEGATIVE_CONTROLS {
        return Err(Error::option(
            "log_rr",
            format!(
                "{n} negative controls; at least {MIN_NEGATIVE_CONTROLS} are needed to fit the \
                 empirical null"
            ),
        ));
    }
    let controls = Controls {
        theta: log_rr,
        var: se_log_rr.iter().map(|s| s * s).collect(),
    };
    let (lo, hi) = log_rr
        .iter()
        .fold((f64::INFINITY, f64::NEG_INFINITY), |(lo, hi), &t| {
            (lo.min(t), hi.max(t))
        });
    let range = hi - lo;
    let t_hat = if range > 0.0 {
        maximize_profile(&controls, range)
    } else {
        // All estimates equal: the score is −½ Σ w_i < 0 everywhere.
        0.0
    };
    let mean = controls.mean_at(t_hat);
    let sd = t_hat.sqrt();
    Ok(EmpiricalNull {
        mean,
        sd,
        log_likelihood: Some(controls.log_likelihood(mean, t_hat)),
        n,
    })
}

/// The maximizing `t = σ²` of the profile log-likelihood on `[0, range²]`.
fn maximize_profile(controls: &Controls<'_>, range: f64) -> f64 {
    const STEPS: usize = 400;
    const DECADES: f64 = 8.0;
    // Grid of t: 0, then σ = range·10^(−8 + 8k/STEPS), k = 0..=STEPS.
    let mut grid = Vec::with_capacity(STEPS + 2);
    grid.push(0.0);
    for k in 0..=STEPS {
        let sigma = range * 10f64.powf(-DECADES + DECADES * k as f64 / STEPS as f64);
        grid.push(sigma * sigma);
    }
    let values: Vec<f64> = grid.iter().map(|&t| controls.profile(t)).collect();
    let mut best = 0;
    for (k, &v) in values.iter().enumerate() {
        if v > values[best] {
            best = k;
        }
    }
    let score = |t: f64| controls.score(t);
    let candidate = if best == 0 {
        let g0 = score(0.0);
        if g0 <= 0.0 {
            return 0.0;
        }
        let g1 = score(grid[1]);
        if g1 < 0.0 {
            brent_root(score, 0.0, grid[1], g0, g1, f64::MIN_POSITIVE)
        } else {
            golden_max(|t| controls.profile(t), 0.0, grid[1])
        }
    } else {
        let a = grid[best - 1];
        let b = grid[(best + 1).min(grid.len() - 1)];
        let (ga, gb) = (score(a), score(b));
        if ga > 0.0 && gb < 0.0 {
            brent_root(score, a, b, ga, gb, f64::MIN_POSITIVE)
        } else {
            golden_max(|t| controls.profile(t), a, b)
        }
    };
    // Guard: never return worse than the best grid point.
    if controls.profile(candidate) >= values[best] {
        candidate
    } else {
        grid[best]
    }
}

// ---------------------------------------------------------------------------------------------
// Calibrated p-values
// ---------------------------------------------------------------------------------------------

/// Which p-value to compute (R: the `twoSided` and `upper` arguments).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum PValueSide {
    /// Two-sided, `2·min(Φ(−z), Φ(z))` (R: `twoSided = TRUE`, the default).
    #[default]
    TwoSided,
    /// One-sided against a true effect above the null, `Φ(−z)` (R: `twoSided = FALSE,
    /// upper = TRUE`).
    Upper,
    /// One-sided against a true effect below the null, `Φ(z)` (R: `twoSided = FALSE,
    /// upper = FALSE`).
    Lower,
}

fn p_from_z(z: f64, side: PValueSide) -> f64 {
    match side {
        PValueSide::TwoSided => 2.0 * normal_cdf(-z.abs()),
        PValueSide::Upper => normal_cdf(-z),
        PValueSide::Lower => normal_cdf(z),
    }
}

/// Calibrated two-sided p-value of an estimate against the empirical null (R:
/// `calibrateP(null, logRr, seLogRr)`): `2Φ(−|θ − μ|/√(σ² + se²))`.
///
/// Errors when `log_rr` is not finite or `se_log_rr` is not finite and positive (R returns
/// `NA` there).
pub fn calibrate_p(null: &EmpiricalNull, log_rr: f64, se_log_rr: f64) -> Result<f64> {
    calibrate_p_sided(null, log_rr, se_log_rr, PValueSide::TwoSided)
}

/// Calibrated p-value, two-sided or one-sided (R: `calibrateP(null, logRr, seLogRr, twoSided,
/// upper)`), with `z = (θ − μ)/√(σ² + se²)`: see [`PValueSide`]. Errors as [`calibrate_p`].
pub fn calibrate_p_sided(
    null: &EmpiricalNull,
    log_rr: f64,
    se_log_rr: f64,
    side: PValueSide,
) -> Result<f64> {
    check_log_rr("log_rr", None, log_rr)?;
    check_se("se_log_rr", None, se_log_rr)?;
    let z = (log_rr - null.mean) / null.sd.hypot(se_log_rr);
    Ok(p_from_z(z, side))
}

/// The uncalibrated p-value with `z = θ/se` (R: `computeTraditionalP`; the upper tail as
/// `Φ(−z)` rather than R's `1 − Φ(z)`). Errors as [`calibrate_p`].
pub fn traditional_p(log_rr: f64, se_log_rr: f64, side: PValueSide) -> Result<f64> {
    check_log_rr("log_rr", None, log_rr)?;
    check_se("se_log_rr", None, se_log_rr)?;
    Ok(p_from_z(log_rr / se_log_rr, side))
}

// ---------------------------------------------------------------------------------------------
// Confidence interval calibration
// ---------------------------------------------------------------------------------------------

/// A systematic error model (R: `systematicErrorModel`, non-legacy): at true log RR `x` the
/// estimate is `N(mean_intercept + mean_slope·x, (sd_intercept + sd_slope·|x|)² + se²)`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct SystematicErrorModel {
    mean_intercept: f64,
    mean_slope: f64,
    sd_intercept: f64,
    sd_slope: f64,
}

impl SystematicErrorModel {
    /// A model from its four parameters (R names `meanIntercept`, `meanSlope`, `sdIntercept`,
    /// `sdSlope`). Errors when any is not finite.
    pub fn new(
        mean_intercept: f64,
        mean_slope: f64,
        sd_intercept: f64,
        sd_slope: f64,
    ) -> Result<Self> {
        for (name, v) in [
            ("mean_intercept", mean_intercept),
            ("mean_slope", mean_slope),
            ("sd_intercept", sd_intercept),
            ("sd_slope", sd_slope),
        ] {
            if !v.is_finite() {
                return Err(Error::option(
                    name,
                    format!("{v}: systematic error model parameters must be finite"),
                ));
            }
        }
        Ok(SystematicErrorModel {
            mean_intercept,
            mean_slope,
            sd_intercept,
            sd_slope,
        })
    }

    /// The model implied by an empirical null and an assumed dependence on the true effect
    /// (R: `convertNullToErrorModel(null, meanSlope, sdSlope)`): `(μ, mean_slope, σ, sd_slope)`.
    /// Errors when a slope is not finite.
    pub fn from_null(null: &EmpiricalNull, mean_slope: f64, sd_slope: f64) -> Result<Self> {
        Self::new(null.mean, mean_slope, null.sd, sd_slope)
    }

    /// Intercept of the error mean (R: `meanIntercept`).
    pub fn mean_intercept(&self) -> f64 {
        self.mean_intercept
    }

    /// Slope of the error mean in the true log RR (R: `meanSlope`).
    pub fn mean_slope(&self) -> f64 {
        self.mean_slope
    }

    /// Intercept of the error standard deviation (R: `sdIntercept`).
    pub fn sd_intercept(&self) -> f64 {
        self.sd_intercept
    }

    /// Slope of the error standard deviation in `|true log RR|` (R: `sdSlope`).
    pub fn sd_slope(&self) -> f64 {
        self.sd_slope
    }
}

/// The systematic error model of a null with the package's default assumption that the error
/// does not depend on the true effect (R: `convertNullToErrorModel(null)`): mean intercept μ,
/// mean slope 1, sd intercept σ, sd slope 0.
pub fn convert_null_to_error_model(null: &EmpiricalNull) -> SystematicErrorModel {
    SystematicErrorModel {
        mean_intercept: null.mean,
        mean_slope: 1.0,
        sd_intercept: null.sd,
        sd_slope: 0.0,
    }
}

/// A calibrated estimate and confidence interval (log scale), as the columns of R's
/// `calibrateConfidenceInterval` result.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct CalibratedCi {
    /// Calibrated point estimate (R: `logRr`): the true log RR at which the estimate is the
    /// median of its error distribution.
    pub log_rr: f64,
    /// Lower bound (R: `logLb95Rr`).
    pub log_lb: f64,
    /// Upper bound (R: `logUb95Rr`).
    pub log_ub: f64,
    /// Calibrated standard error (R: `seLogRr`): `(log_ub − log_lb)/(2 Φ⁻¹((1 + level)/2))`.
    pub se_log_rr: f64,
}

/// The true log RR `x` solving `z + (a + b·x − θ)/√((c + d·|x|)² + se²) = 0`.
fn error_model_root(
    model: &SystematicErrorModel,
    log_rr: f64,
    se: f64,
    z: f64,
    what: &str,
) -> Result<f64> {
    let SystematicErrorModel {
        mean_intercept: a,
        mean_slope: b,
        sd_intercept: c,
        sd_slope: d,
    } = *model;
    if d == 0.0 && b != 0.0 {
        // Closed form: a + b·x = θ − z·√(c² + se²).
        return Ok((log_rr - z * c.hypot(se) - a) / b);
    }
    let f = |x: f64| z + (a + b * x - log_rr) / (c + d * x.abs()).hypot(se);
    // R's uniroot interval.
    let (lo, hi) = (-100.0, 100.0);
    let (flo, fhi) = (f(lo), f(hi));
    if (flo < 0.0 && fhi < 0.0) || (flo > 0.0 && fhi > 0.0) || !(flo.is_finite() && fhi.is_finite())
    {
        return Err(Error::FitFailed(format!(
            "calibrated confidence interval: the {what} is not bracketed in [−100, 100] on the \
             log scale under this systematic error model (the R package returns NA)"
        )));
    }
    Ok(brent_root(f, lo, hi, flo, fhi, 0.0))
}

/// Calibrated confidence interval of one estimate (R: `calibrateConfidenceInterval(logRr,
/// seLogRr, model, ciWidth)`), at coverage `ci_level` (R's `ciWidth`; 0.95 for 95%).
///
/// Solves for the true effect at which the observed estimate is the `(1 + level)/2` quantile
/// (lower bound), the median (point estimate) and the `(1 − level)/2` quantile (upper bound) of
/// its distribution under the model; see the [module docs](self). With a model from
/// [`convert_null_to_error_model`] this is `θ − μ ∓ Φ⁻¹((1 + level)/2)·√(σ² + se²)`, point
/// `θ − μ`, standard error `√(σ² + se²)`.
///
/// Errors when `log_rr` is not finite, `se_log_rr` is not finite and positive, `ci_level` is not
/// in (0, 1), or (only when `sd_slope ≠ 0` or `mean_slope = 0`) a bound is not bracketed in
/// `[−100, 100]`, where R returns `NA`.
pub fn calibrate_confidence_interval(
    model: &SystematicErrorModel,
    log_rr: f64,
    se_log_rr: f64,
    ci_level: f64,
) -> Result<CalibratedCi> {
    check_log_rr("log_rr", None, log_rr)?;
    check_se("se_log_rr", None, se_log_rr)?;
    if !(ci_level > 0.0 && ci_level < 1.0) {
        return Err(Error::option(
            "ci_level",
            format!("{ci_level}: the confidence level must be in (0, 1)"),
        ));
    }
    // z = Φ⁻¹((1 + level)/2) > 0, computed on the tail: −Φ⁻¹((1 − level)/2).
    let z = -normal_quantile((1.0 - ci_level) / 2.0);
    let point = error_model_root(model, log_rr, se_log_rr, 0.0, "point estimate")?;
    let log_lb = error_model_root(model, log_rr, se_log_rr, z, "lower bound")?;
    let log_ub = error_model_root(model, log_rr, se_log_rr, -z, "upper bound")?;
    Ok(CalibratedCi {
        log_rr: point,
        log_lb,
        log_ub,
        se_log_rr: (log_ub - log_lb) / (2.0 * z),
    })
}

// ---------------------------------------------------------------------------------------------
// Expected absolute systematic error
// ---------------------------------------------------------------------------------------------

/// Expected absolute systematic error of a null (R:
/// `computeExpectedAbsoluteSystematicError(null)`): `E|X|` for `X ~ N(μ, σ²)`,
///
/// `σ √(2/π) e^{−μ²/(2σ²)} + |μ| (1 − 2Φ(−|μ|/σ))`,
///
/// which is R's `closedFormIntegeralAbsolute(μ, σ)` simplified; `|μ|` when `σ = 0` (R's
/// limit, with `0` for `μ = σ = 0` as R special-cases).
pub fn ease(null: &EmpiricalNull) -> f64 {
    let (mu, sigma) = (null.mean, null.sd);
    if sigma == 0.0 {
        return mu.abs();
    }
    let m = mu.abs();
    2.0 * sigma * normal_pdf(m / sigma) + m * (1.0 - 2.0 * normal_cdf(-m / sigma))
}

#[cfg(test)]
// Reference values are kept with all the digits they were computed to.
#[allow(clippy::excessive_precision)]
mod tests {
    use super::*;

    /// Relative error, or absolute where the reference is 0.
    fn rel(a: f64, b: f64) -> f64 {
        if b == 0.0 {
            a.abs()
        } else {
            ((a - b) / b).abs()
        }
    }

    /// xorshift64* with Box–Muller normals, for seeded simulations.
    struct XorShift(u64);

    impl XorShift {
        fn next_u64(&mut self) -> u64 {
            self.0 ^= self.0 >> 12;
            self.0 ^= self.0 << 25;
            self.0 ^= self.0 >> 27;
            self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
        }
        /// Uniform on (0, 1).
        fn uniform(&mut self) -> f64 {
            ((self.next_u64() >> 11) as f64 + 0.5) / (1u64 << 53) as f64
        }
        fn normal(&mut self) -> f64 {
            let r = (-2.0 * self.uniform().ln()).sqrt();
            r * (2.0 * std::f64::consts::PI * self.uniform()).cos()
        }
    }

    /// Negative controls: θ_i = b_i + ε_i, b_i ~ N(mu, sigma²), ε_i ~ N(0, se_i²),
    /// se_i ~ U(0.1, 0.4).
    fn simulate(n: usize, mu: f64, sigma: f64, seed: u64) -> (Vec<f64>, Vec<f64>) {
        let mut rng = XorShift(seed);
        let mut theta = Vec::with_capacity(n);
        let mut se = Vec::with_capacity(n);
        for _ in 0..n {
            let s = 0.1 + 0.3 * rng.uniform();
            theta.push(mu + sigma * rng.normal() + s * rng.normal());
            se.push(s);
        }
        (theta, se)
    }

    // ------------------------------------------------------------------ normal distribution

    /// Reference values computed with mpmath 1.3.0 at 60 significant digits for the exact
    /// binary64 arguments (Φ(x) = erfc(−x/√2)/2; Φ⁻¹ by `findroot` on log Φ of the smaller tail).
    #[test]
    fn normal_cdf_matches_high_precision_values() {
        let cases = [
            (-1.96, 0.024997895148220436213),
            (-10.0, 7.619853024160526066e-24),
            (-37.0, 5.7255712225245768227e-300),
            (-20.0, 2.7536241186062336951e-89),
            (-5.0, 2.8665157187919391167e-7),
            (-5.65685424949238, 7.7086289501400319403e-9),
            (-1.4, 0.080756659233771059795),
            (-0.5, 0.30853753872598689636),
            (0.3, 0.61791142218895263307),
            (1.0, 0.84134474606854294859),
            (2.0, 0.9772498680518207928),
            (3.0, 0.99865010196836990547),
            (8.0, 0.9999999999999993779),
        ];
        for (x, want) in cases {
            let got = normal_cdf(x);
            assert!(rel(got, want) < 2e-15, "Φ({x}) = {got:e}, want {want:e}");
        }
        assert_eq!(normal_cdf(0.0), 0.5);
        assert_eq!(normal_cdf(-40.0), 0.0);
        assert_eq!(normal_cdf(40.0), 1.0);
        assert!(normal_cdf(f64::NAN).is_nan());
        // Symmetry is exact: Φ(−x) + Φ(x) = 1 up to the rounding of 1 − Φ(x).
        for x in [0.1, 0.7, 1.5, 4.0, 6.0] {
            assert!((normal_cdf(-x) + normal_cdf(x) - 1.0).abs() < 2e-16);
        }
    }

    #[test]
    fn normal_quantile_matches_high_precision_values() {
        let cases = [
            (0.975, 1.959963984540053855604),
            (0.025, -1.95996398454005421178),
            (0.95, 1.644853626951472284276),
            (0.75, 0.6744897501960817432022),
            (0.9, 1.281551565544600593487),
            (0.3, -0.5244005127080408159695),
            (0.01, -2.326347874040841093075),
            (1e-4, -3.719016485455680552288),
            (1e-5, -4.264890793922824610234),
            (1e-10, -6.3613409024040561991),
            (1e-12, -7.034483825301131932614),
            (0.999999, 4.753424308817087765688),
            (1e-20, -9.262340089798407579572),
            (1e-300, -37.04709629936119923655),
        ];
        for (p, want) in cases {
            let got = normal_quantile(p);
            assert!(rel(got, want) < 2e-15, "Φ⁻¹({p:e}) = {got}, want {want}");
        }
        assert_eq!(normal_quantile(0.5), 0.0);
        assert_eq!(normal_quantile(0.0), f64::NEG_INFINITY);
        assert_eq!(normal_quantile(1.0), f64::INFINITY);
        assert!(normal_quantile(1.5).is_nan() && normal_quantile(f64::NAN).is_nan());
        // The brief's values.
        assert!(rel(normal_cdf(-1.96), 0.024997895148220435) < 1e-15);
        assert!(rel(normal_quantile(0.975), 1.959963984540054) < 1e-15);
        assert!(rel(normal_cdf(-10.0), 7.619853024160527e-24) < 1e-14);
    }

    #[test]
    fn normal_quantile_inverts_cdf() {
        let mut p = 1e-300;
        while p < 0.5 {
            let x = normal_quantile(p);
            assert!(rel(normal_cdf(x), p) < 1e-14 * (1.0 + x.abs()), "p = {p:e}");
            // Upper half: 1 − q is the exact tail of q = 1 − p (rounded).
            let q = 1.0 - p;
            if q < 1.0 {
                assert!(
                    rel(normal_quantile(q), -normal_quantile(1.0 - q)) < 1e-15,
                    "q = {q}"
                );
            }
            p *= 3.7;
        }
    }

    // ------------------------------------------------------------------ fit_null

    /// The null's log-likelihood by brute force: each control's marginal density
    /// ∫ N(θ_i; x, se_i²) N(x; μ, σ²) dx by composite Simpson on μ ± 12σ (2000 intervals), and
    /// N(θ_i; μ, se_i²) at σ = 0.
    fn reference_log_likelihood(theta: &[f64], se: &[f64], mu: f64, sigma: f64) -> f64 {
        let dnorm = |x: f64, m: f64, s: f64| normal_pdf((x - m) / s) / s;
        let mut ll = 0.0;
        for (&t, &s) in theta.iter().zip(se) {
            let density = if sigma == 0.0 {
                dnorm(t, mu, s)
            } else {
                let intervals = 2000;
                let (a, b) = (mu - 12.0 * sigma, mu + 12.0 * sigma);
                let h = (b - a) / intervals as f64;
                let g = |x: f64| dnorm(t, x, s) * dnorm(x, mu, sigma);
                let mut sum = g(a) + g(b);
                for k in 1..intervals {
                    let w = if k % 2 == 1 { 4.0 } else { 2.0 };
                    sum += w * g(a + k as f64 * h);
                }
                sum * h / 3.0
            };
            ll += density.ln();
        }
        ll
    }

    /// Maximizes the brute-force log-likelihood on a 9×9 (μ, σ ≥ 0) grid, halving the window
    /// around the best point 40 times.
    fn reference_fit(theta: &[f64], se: &[f64]) -> (f64, f64, f64) {
        let (mut cm, mut cs) = (0.0, 0.5);
        let (mut wm, mut ws) = (2.0, 0.5);
        let mut best = (cm, cs, f64::NEG_INFINITY);
        for _ in 0..40 {
            for i in 0..9 {
                for j in 0..9 {
                    let m = cm + wm * (i as f64 - 4.0) / 4.0;
                    let s = (cs + ws * (j as f64 - 4.0) / 4.0).max(0.0);
                    let ll = reference_log_likelihood(theta, se, m, s);
                    if ll > best.2 {
                        best = (m, s, ll);
                    }
                }
            }
            (cm, cs) = (best.0, best.1);
            wm *= 0.5;
            ws *= 0.5;
        }
        best
    }

    #[test]
    fn fit_null_matches_brute_force_maximum_likelihood() {
        let (theta, se) = simulate(12, 0.3, 0.35, 7);
        let null = fit_null(&theta, &se).unwrap();
        let (m, s, ll) = reference_fit(&theta, &se);
        assert!(
            null.sd() > 0.05,
            "interior optimum expected, got σ = {}",
            null.sd()
        );
        // (Observed: both within 5e-9.)
        assert!((null.mean() - m).abs() < 1e-7, "μ {} vs {m}", null.mean());
        assert!((null.sd() - s).abs() < 1e-7, "σ {} vs {s}", null.sd());
        let ours = reference_log_likelihood(&theta, &se, null.mean(), null.sd());
        let reported = null.log_likelihood().unwrap();
        assert!((reported - ours).abs() < 1e-9, "{reported} vs {ours}");
        // Ours is at least as good as the brute-force maximum.
        assert!(ours >= ll - 1e-10, "{ours} < {ll}");
        assert_eq!(null.n(), 12);
    }

    #[test]
    fn fit_null_boundary_optimum_is_sigma_zero() {
        // Spread far below the standard errors: the likelihood is maximal at σ = 0.
        let theta = [0.1, -0.05, 0.02, 0.08, -0.1, 0.0];
        let se = [0.5, 0.4, 0.6, 0.5, 0.45, 0.55];
        let null = fit_null(&theta, &se).unwrap();
        assert_eq!(null.sd(), 0.0);
        let (m, s, ll) = reference_fit(&theta, &se);
        assert!(s < 1e-6, "brute force σ = {s}");
        assert!((null.mean() - m).abs() < 1e-6);
        // At σ = 0 the MLE of μ is the inverse-variance weighted mean.
        let w: Vec<f64> = se.iter().map(|s| 1.0 / (s * s)).collect();
        let wm = theta.iter().zip(&w).map(|(t, w)| t * w).sum::<f64>() / w.iter().sum::<f64>();
        assert!((null.mean() - wm).abs() < 1e-15);
        assert!(null.log_likelihood().unwrap() >= ll - 1e-10);
    }

    #[test]
    fn fit_null_equal_estimates() {
        let null = fit_null(&[0.2; 6], &[0.1, 0.2, 0.3, 0.1, 0.2, 0.3]).unwrap();
        assert_eq!(null.sd(), 0.0);
        assert!((null.mean() - 0.2).abs() < 1e-15);
    }

    #[test]
    fn fit_null_recovers_simulated_null() {
        for (mu, sigma, seed) in [(0.2, 0.3, 1), (-0.1, 0.15, 2), (0.5, 0.05, 3)] {
            let n = 4000;
            let (theta, se) = simulate(n, mu, sigma, seed);
            let null = fit_null(&theta, &se).unwrap();
            // Standard errors of the estimates are about √((σ² + E se²)/n) ≲ 0.007 for μ and
            // less for σ; allow five of them.
            assert!(
                (null.mean() - mu).abs() < 0.035,
                "μ̂ = {} vs {mu}",
                null.mean()
            );
            assert!(
                (null.sd() - sigma).abs() < 0.035,
                "σ̂ = {} vs {sigma}",
                null.sd()
            );
        }
        // No systematic error: σ̂ near 0.
        let (theta, se) = simulate(4000, 0.0, 0.0, 4);
        let null = fit_null(&theta, &se).unwrap();
        assert!(null.mean().abs() < 0.02 && null.sd() < 0.03, "{null:?}");
    }

    #[test]
    fn fit_null_is_equivariant() {
        let (theta, se) = simulate(30, 0.25, 0.2, 11);
        let null = fit_null(&theta, &se).unwrap();
        let negated: Vec<f64> = theta.iter().map(|t| -t).collect();
        let neg = fit_null(&negated, &se).unwrap();
        assert!((neg.mean() + null.mean()).abs() < 1e-12);
        assert!((neg.sd() - null.sd()).abs() < 1e-9);
        let ll = null.log_likelihood().unwrap();
        assert!((neg.log_likelihood().unwrap() - ll).abs() < 1e-10);
        let shifted: Vec<f64> = theta.iter().map(|t| t + 1.5).collect();
        let sh = fit_null(&shifted, &se).unwrap();
        assert!((sh.mean() - null.mean() - 1.5).abs() < 1e-12);
        assert!((sh.sd() - null.sd()).abs() < 1e-9);

        // Symmetric calibrated results.
        for (t, s) in [(0.7, 0.2), (-0.3, 0.1), (0.05, 0.4)] {
            let p = calibrate_p(&null, t, s).unwrap();
            assert!((calibrate_p(&neg, -t, s).unwrap() - p).abs() < 1e-12);
            let up = calibrate_p_sided(&null, t, s, PValueSide::Upper).unwrap();
            let lo = calibrate_p_sided(&neg, -t, s, PValueSide::Lower).unwrap();
            assert!((up - lo).abs() < 1e-12);
            let ci = calibrate_confidence_interval(&convert_null_to_error_model(&null), t, s, 0.95)
                .unwrap();
            let nci =
                calibrate_confidence_interval(&convert_null_to_error_model(&neg), -t, s, 0.95)
                    .unwrap();
            assert!((nci.log_rr + ci.log_rr).abs() < 1e-12);
            assert!((nci.log_lb + ci.log_ub).abs() < 1e-12);
            assert!((nci.log_ub + ci.log_lb).abs() < 1e-12);
            assert!((nci.se_log_rr - ci.se_log_rr).abs() < 1e-12);
        }
        assert!((ease(&neg) - ease(&null)).abs() < 1e-12);
    }

    #[test]
    fn fit_null_rejects_bad_input() {
        let msg = |r: Result<EmpiricalNull>| r.unwrap_err().to_string();
        let se = [0.1; 6];
        let m = msg(fit_null(&[0.1, 0.2, 0.3, 0.4], &[0.1; 4]));
        assert!(
            m.contains("4 negative controls") && m.contains("at least 5"),
            "{m}"
        );
        let m = msg(fit_null(&[0.1, 0.2, f64::NAN, 0.4, 0.5, 0.6], &se));
        assert!(
            m.contains("log_rr") && m.contains("element 2") && m.contains("NaN"),
            "{m}"
        );
        let m = msg(fit_null(&[0.1, 0.2, f64::INFINITY, 0.4, 0.5, 0.6], &se));
        assert!(
            m.contains("log_rr") && m.contains("element 2") && m.contains("finite"),
            "{m}"
        );
        let theta = [0.1; 6];
        for (bad, what) in [
            (0.0, "0"),
            (-0.2, "-0.2"),
            (f64::NAN, "NaN"),
            (f64::INFINITY, "inf"),
        ] {
            let mut s = se;
            s[4] = bad;
            let m = msg(fit_null(&theta, &s));
            assert!(
                m.contains("se_log_rr") && m.contains(&format!("element 4 is {what}")),
                "{m}"
            );
        }
        let m = msg(fit_null(&theta, &[0.1; 5]));
        assert!(m.contains("se_log_rr") && m.contains("equal length"), "{m}");
        assert!(EmpiricalNull::new(0.0, -1.0).is_err());
        assert!(EmpiricalNull::new(f64::NAN, 0.1).is_err());
        assert!(SystematicErrorModel::new(0.0, 1.0, f64::INFINITY, 0.0).is_err());
    }

    #[test]
    fn drop_non_finite_matches_r_dropping() {
        let (t, s) = drop_non_finite(
            &[0.1, f64::NAN, 0.3, f64::INFINITY, 0.5, 0.6],
            &[0.1, 0.2, f64::NAN, 0.4, 0.0, f64::NEG_INFINITY],
        )
        .unwrap();
        assert_eq!(t, vec![0.1, 0.5]);
        assert_eq!(s, vec![0.1, 0.0]);
        assert!(drop_non_finite(&[0.1], &[]).is_err());
    }

    // ------------------------------------------------------------------ calibrate_p

    #[test]
    fn calibrate_p_with_zero_null_is_traditional_p() {
        let null = EmpiricalNull::new(0.0, 0.0).unwrap();
        for (t, s) in [
            (0.2f64, 0.2f64),
            (0.1, 0.05),
            (-0.3, 0.1),
            (1.2, 0.15),
            (0.0, 0.3),
        ] {
            let want = 2.0 * normal_cdf(-(t / s).abs());
            assert_eq!(calibrate_p(&null, t, s).unwrap(), want);
            assert_eq!(traditional_p(t, s, PValueSide::TwoSided).unwrap(), want);
            for side in [PValueSide::Upper, PValueSide::Lower] {
                assert_eq!(
                    calibrate_p_sided(&null, t, s, side).unwrap(),
                    traditional_p(t, s, side).unwrap()
                );
            }
        }
        // Goldens from the package's tests/testthat/test-EmpiricalCalibrationUsingAsymptotics.R
        // ("calibrateOneP argument requirements", a null with mean 0 and sd 0):
        // calibrateP(null, c(0.1, 0.3), c(0.05, 0.1)) == c(0.045500266, 0.002699796), one-sided
        // upper c(0.022750133, 0.001349898), lower (rounded to 2 places) c(0.98, 1.00). The
        // goldens carry 7–8 significant digits.
        let p = |t, s, side| calibrate_p_sided(&null, t, s, side).unwrap();
        assert!(rel(p(0.1, 0.05, PValueSide::TwoSided), 0.045500266) < 1e-7);
        assert!(rel(p(0.3, 0.1, PValueSide::TwoSided), 0.002699796) < 1e-7);
        assert!(rel(p(0.1, 0.05, PValueSide::Upper), 0.022750133) < 1e-7);
        assert!(rel(p(0.3, 0.1, PValueSide::Upper), 0.001349898) < 1e-7);
        assert_eq!((p(0.1, 0.05, PValueSide::Lower) * 100.0).round(), 98.0);
        assert_eq!((p(0.3, 0.1, PValueSide::Lower) * 100.0).round(), 100.0);
    }

    #[test]
    fn calibrate_p_by_hand() {
        // μ = 0.3, σ = 0.4, θ = 1.0, se = 0.3: z = 0.7/0.5 = 1.4.
        let null = EmpiricalNull::new(0.3, 0.4).unwrap();
        let z = 1.4;
        let two = calibrate_p(&null, 1.0, 0.3).unwrap();
        assert!(rel(two, 2.0 * normal_cdf(-z)) < 1e-14);
        // Φ(−1.4) = 0.080756659233771059795 (mpmath).
        assert!(rel(two, 2.0 * 0.080756659233771059795) < 1e-14);
        let up = calibrate_p_sided(&null, 1.0, 0.3, PValueSide::Upper).unwrap();
        let lo = calibrate_p_sided(&null, 1.0, 0.3, PValueSide::Lower).unwrap();
        assert!(rel(up, 0.080756659233771059795) < 1e-14);
        assert!((up + lo - 1.0).abs() < 1e-15);
        // Calibration widens: the calibrated p exceeds the traditional one for an estimate on the
        // far side of the null mean.
        assert!(two > traditional_p(1.0, 0.3, PValueSide::TwoSided).unwrap());
        assert!(calibrate_p(&null, f64::NAN, 0.3).is_err());
        assert!(calibrate_p(&null, 0.1, 0.0).is_err());
        assert!(traditional_p(0.1, -1.0, PValueSide::Upper).is_err());
    }

    // ------------------------------------------------------------------ confidence intervals

    #[test]
    fn calibrated_ci_with_zero_null_is_traditional_ci() {
        let model = convert_null_to_error_model(&EmpiricalNull::new(0.0, 0.0).unwrap());
        assert_eq!(
            (
                model.mean_intercept(),
                model.mean_slope(),
                model.sd_intercept(),
                model.sd_slope()
            ),
            (0.0, 1.0, 0.0, 0.0)
        );
        for (t, s) in [(0.4, 0.2), (-1.1, 0.05), (0.0, 1.0)] {
            let ci = calibrate_confidence_interval(&model, t, s, 0.95).unwrap();
            let z = 1.959963984540054;
            assert!((ci.log_rr - t).abs() < 1e-15);
            assert!((ci.log_lb - (t - z * s)).abs() < 1e-14);
            assert!((ci.log_ub - (t + z * s)).abs() < 1e-14);
            assert!(rel(ci.se_log_rr, s) < 1e-14);
        }
    }

    #[test]
    fn calibrated_ci_from_null_by_hand() {
        // μ = 0.2, σ = 0.3, θ = 1.0, se = 0.4: √(σ² + se²) = 0.5.
        let null = EmpiricalNull::new(0.2, 0.3).unwrap();
        let model = convert_null_to_error_model(&null);
        let ci = calibrate_confidence_interval(&model, 1.0, 0.4, 0.9).unwrap();
        // Φ⁻¹(0.95) = 1.6448536269514722 (mpmath).
        let z = 1.6448536269514722;
        assert!((ci.log_rr - 0.8).abs() < 1e-15);
        assert!((ci.log_lb - (0.8 - 0.5 * z)).abs() < 1e-14);
        assert!((ci.log_ub - (0.8 + 0.5 * z)).abs() < 1e-14);
        assert!(rel(ci.se_log_rr, 0.5) < 1e-14);
        // The calibrated interval excludes 0 exactly when the calibrated p-value is below 0.1.
        let p = calibrate_p(&null, 1.0, 0.4).unwrap();
        assert_eq!(ci.log_lb > 0.0, p < 0.1);
        assert!(calibrate_confidence_interval(&model, 1.0, 0.4, 1.0).is_err());
        assert!(calibrate_confidence_interval(&model, 1.0, 0.4, 0.0).is_err());
        assert!(calibrate_confidence_interval(&model, f64::INFINITY, 0.4, 0.95).is_err());
    }

    #[test]
    fn calibrated_ci_general_model_solves_its_equation() {
        let model = SystematicErrorModel::new(0.1, 0.8, 0.2, 0.15).unwrap();
        let (t, s, level) = (0.9, 0.25, 0.95);
        let ci = calibrate_confidence_interval(&model, t, s, level).unwrap();
        let z = normal_quantile(0.975);
        let f = |x: f64, z: f64| z + (0.1 + 0.8 * x - t) / (0.2 + 0.15 * x.abs()).hypot(s);
        assert!(f(ci.log_rr, 0.0).abs() < 1e-13);
        assert!(f(ci.log_lb, z).abs() < 1e-13);
        assert!(f(ci.log_ub, -z).abs() < 1e-13);
        assert!(ci.log_lb < ci.log_rr && ci.log_rr < ci.log_ub);
        assert!(rel(ci.se_log_rr, (ci.log_ub - ci.log_lb) / (2.0 * z)) < 1e-15);
        // Brent's path agrees with the closed form as sd_slope → 0.
        let closed = convert_null_to_error_model(&EmpiricalNull::new(0.1, 0.2).unwrap());
        let nearly = SystematicErrorModel::new(0.1, 1.0, 0.2, 1e-15).unwrap();
        let a = calibrate_confidence_interval(&closed, t, s, level).unwrap();
        let b = calibrate_confidence_interval(&nearly, t, s, level).unwrap();
        for (x, y) in [
            (a.log_rr, b.log_rr),
            (a.log_lb, b.log_lb),
            (a.log_ub, b.log_ub),
        ] {
            assert!((x - y).abs() < 1e-12, "{x} vs {y}");
        }
        // A model whose standardized error never reaches z above the estimate: no upper bound
        // (R returns NA).
        let flat = SystematicErrorModel::new(0.0, 0.1, 0.1, 1.0).unwrap();
        let err = calibrate_confidence_interval(&flat, 0.5, 0.2, 0.95).unwrap_err();
        assert!(err.to_string().contains("not bracketed"), "{err}");
    }

    // ------------------------------------------------------------------ EASE

    /// E|X| for X ~ N(μ, σ²) by composite Simpson on [μ − 14σ, 0] and [0, μ + 14σ].
    fn reference_ease(mu: f64, sigma: f64) -> f64 {
        let simpson = |a: f64, b: f64| {
            if b <= a {
                return 0.0;
            }
            let n = 20000;
            let h = (b - a) / n as f64;
            let g = |x: f64| x.abs() * normal_pdf((x - mu) / sigma) / sigma;
            let mut sum = g(a) + g(b);
            for k in 1..n {
                sum += if k % 2 == 1 { 4.0 } else { 2.0 } * g(a + k as f64 * h);
            }
            sum * h / 3.0
        };
        let (lo, hi) = (mu - 14.0 * sigma, mu + 14.0 * sigma);
        // Split at the kink of |x|.
        simpson(lo, hi.min(0.0)) + simpson(lo.max(0.0), hi)
    }

    #[test]
    fn ease_matches_numerical_integration() {
        for (mu, sigma) in [(0.0, 0.3), (0.2, 0.3), (-0.5, 0.1), (0.05, 0.8), (1.0, 0.2)] {
            let null = EmpiricalNull::new(mu, sigma).unwrap();
            let want = reference_ease(mu, sigma);
            assert!(
                rel(ease(&null), want) < 1e-10,
                "μ {mu} σ {sigma}: {} vs {want}",
                ease(&null)
            );
        }
        // Closed forms: σ√(2/π) at μ = 0, |μ| at σ = 0, 0 for the zero null.
        let s = 0.37;
        let at_zero = ease(&EmpiricalNull::new(0.0, s).unwrap());
        assert!(rel(at_zero, s * (2.0 / std::f64::consts::PI).sqrt()) < 1e-15);
        assert_eq!(ease(&EmpiricalNull::new(-0.4, 0.0).unwrap()), 0.4);
        assert_eq!(ease(&EmpiricalNull::new(0.0, 0.0).unwrap()), 0.0);
        // E|X| ≥ |E X|.
        assert!(ease(&EmpiricalNull::new(0.3, 0.2).unwrap()) > 0.3);
    }
}
