//! Inverse probability of treatment weights: CohortMethod's `computeIptw` (called by
//! `createPs` with its `estimator`) and `truncateIptw`.
//!
//! With `e` the propensity score, `t` the treatment and `P = mean(t)` the treated share:
//!
//! | estimator | target weight | comparator weight | stabilized (CohortMethod's) |
//! |---|---|---|---|
//! | `ate` (average treatment effect) | `1/e` | `1/(1 − e)` | `P/e`, `(1 − P)/(1 − e)` |
//! | `att` (… in the treated; `createPs`' default) | `1` | `e/(1 − e)` | `P`, `(1 − P)·e/(1 − e)` |
//! | `ato` (… in the overlap population) | `1 − e` | `e` | never stabilized |
//!
//! CohortMethod always uses the stabilized weights (Xu et al. 2010); `stabilized = false` gives
//! the plain ones. A weight that is not finite (a target score of 0 under `ate`, a comparator
//! score of 1 under `ate` or `att`) is an error naming the subject.
//!
//! Truncation: `truncateIptw(maxWeight)` sets every weight above `max_weight` to `max_weight`.
//! `truncate_quantile` (not in CohortMethod) truncates at a quantile of the weights instead
//! (R's type-7 quantile of all subjects' weights, e.g. 0.99 for the 99th percentile). Weights
//! are truncated after stabilization.
//!
//! Reference: Xu S, Ross C, Raebel MA, et al. Use of stabilized inverse propensity scores as
//! weights to directly estimate relative risk and its confidence intervals. *Value Health*
//! 2010;13(2):273–277.

use serde::Deserialize;

use super::{arm_counts, check_len, check_ps, quantile_type7};
use crate::error::{Error, Result};

/// The estimand of the weights (CohortMethod's `estimator`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Estimator {
    /// Average treatment effect.
    Ate,
    /// Average treatment effect in the treated (`createPs`' default).
    #[default]
    Att,
    /// Average treatment effect in the overlap population.
    Ato,
}

/// Settings of [`iptw`].
///
/// | key | default | meaning |
/// |---|---|---|
/// | `estimator` | `att` | `ate`, `att` or `ato` |
/// | `stabilized` | true | CohortMethod's stabilized weights (ate, att) |
/// | `max_weight` | – | truncate weights above this (> 0) |
/// | `truncate_quantile` | – | truncate weights above this quantile of the weights, in (0, 1] |
#[derive(Debug, Clone, Copy, PartialEq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct IptwSettings {
    /// Estimand.
    pub estimator: Estimator,
    /// Stabilize (ate, att).
    pub stabilized: bool,
    /// Truncation bound.
    pub max_weight: Option<f64>,
    /// Truncation quantile.
    pub truncate_quantile: Option<f64>,
}

impl Default for IptwSettings {
    fn default() -> Self {
        IptwSettings {
            estimator: Estimator::Att,
            stabilized: true,
            max_weight: None,
            truncate_quantile: None,
        }
    }
}

impl IptwSettings {
    /// Validate.
    pub fn check(&self) -> Result<()> {
        if let Some(w) = self.max_weight {
            if !(w.is_finite() && w > 0.0) {
                return Err(Error::option(
                    "max_weight",
                    format!("must be > 0 (got {w})"),
                ));
            }
        }
        if let Some(q) = self.truncate_quantile {
            if !(q > 0.0 && q <= 1.0) {
                return Err(Error::option(
                    "truncate_quantile",
                    format!("must be in (0, 1] (got {q})"),
                ));
            }
        }
        Ok(())
    }
}

/// Weights of every subject (input order); see the module documentation.
pub fn iptw(
    treatment: &[bool],
    propensity_score: &[f64],
    settings: &IptwSettings,
) -> Result<Vec<f64>> {
    settings.check()?;
    check_len("propensity_score", propensity_score.len(), treatment.len())?;
    check_ps(propensity_score)?;
    if treatment.is_empty() {
        return Ok(Vec::new());
    }
    let (nt, _) = arm_counts(treatment);
    let p = nt as f64 / treatment.len() as f64;
    let (st, sc) = if settings.stabilized {
        (p, 1.0 - p)
    } else {
        (1.0, 1.0)
    };
    let mut w = Vec::with_capacity(treatment.len());
    for (i, (&t, &e)) in treatment.iter().zip(propensity_score).enumerate() {
        let v = match (settings.estimator, t) {
            (Estimator::Ate, true) => st / e,
            (Estimator::Ate, false) => sc / (1.0 - e),
            (Estimator::Att, true) => st,
            (Estimator::Att, false) => sc * e / (1.0 - e),
            (Estimator::Ato, true) => 1.0 - e,
            (Estimator::Ato, false) => e,
        };
        if !v.is_finite() {
            return Err(Error::option(
                "propensity_score",
                format!(
                    "element {i} is {e} for a {} subject: its weight is not finite",
                    if t { "target" } else { "comparator" }
                ),
            ));
        }
        w.push(v);
    }
    if let Some(q) = settings.truncate_quantile {
        let mut sorted = w.clone();
        sorted.sort_unstable_by(f64::total_cmp);
        truncate_iptw(&mut w, quantile_type7(&sorted, q))?;
    }
    if let Some(m) = settings.max_weight {
        truncate_iptw(&mut w, m)?;
    }
    Ok(w)
}

/// CohortMethod's `truncateIptw`: set weights above `max_weight` to it; returns how many were
/// truncated.
pub fn truncate_iptw(weights: &mut [f64], max_weight: f64) -> Result<usize> {
    if max_weight.is_nan() || max_weight < 0.0 {
        return Err(Error::option(
            "max_weight",
            format!("must be ≥ 0 (got {max_weight})"),
        ));
    }
    let mut n = 0;
    for w in weights.iter_mut().filter(|w| **w > max_weight) {
        *w = max_weight;
        n += 1;
    }
    Ok(n)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::rng::Rng;

    #[test]
    fn hand_checked() {
        let t = [true, true, false, false];
        let ps = [0.5, 0.25, 0.5, 0.75];
        let s = |estimator, stabilized| IptwSettings {
            estimator,
            stabilized,
            ..Default::default()
        };
        assert_eq!(
            iptw(&t, &ps, &s(Estimator::Ate, false)).unwrap(),
            vec![2.0, 4.0, 2.0, 4.0]
        );
        assert_eq!(
            iptw(&t, &ps, &s(Estimator::Ate, true)).unwrap(),
            vec![1.0, 2.0, 1.0, 2.0]
        );
        assert_eq!(
            iptw(&t, &ps, &s(Estimator::Att, false)).unwrap(),
            vec![1.0, 1.0, 1.0, 3.0]
        );
        assert_eq!(
            iptw(&t, &ps, &s(Estimator::Att, true)).unwrap(),
            vec![0.5, 0.5, 0.5, 1.5]
        );
        assert_eq!(
            iptw(&t, &ps, &s(Estimator::Ato, true)).unwrap(),
            vec![0.5, 0.75, 0.5, 0.75]
        );
        let trunc = IptwSettings {
            estimator: Estimator::Ate,
            stabilized: false,
            max_weight: Some(3.0),
            truncate_quantile: None,
        };
        assert_eq!(iptw(&t, &ps, &trunc).unwrap(), vec![2.0, 3.0, 2.0, 3.0]);
        let q = IptwSettings {
            max_weight: None,
            truncate_quantile: Some(0.5),
            ..trunc
        };
        // Median of (2, 4, 2, 4) = 3.
        assert_eq!(iptw(&t, &ps, &q).unwrap(), vec![2.0, 3.0, 2.0, 3.0]);
    }

    #[test]
    fn infinite_weights_and_bad_settings_are_errors() {
        let e = iptw(
            &[true, false],
            &[0.0, 0.5],
            &IptwSettings {
                estimator: Estimator::Ate,
                ..Default::default()
            },
        )
        .unwrap_err();
        assert!(e.to_string().contains("element 0"), "{e}");
        assert!(iptw(&[true, false], &[0.5, 1.0], &IptwSettings::default()).is_err());
        let s: IptwSettings = serde_json::from_str(r#"{"estimator": "ato"}"#).unwrap();
        assert_eq!(s.estimator, Estimator::Ato);
        assert!(serde_json::from_str::<IptwSettings>(r#"{"estimator": "atx"}"#).is_err());
        assert!(IptwSettings {
            truncate_quantile: Some(0.0),
            ..Default::default()
        }
        .check()
        .is_err());
    }

    #[test]
    fn randomized_weighted_arms_balance_the_score() {
        // ATE weights (unstabilized) make Σ_target w·1 = Σ_target 1/e ≈ n in expectation; more
        // exactly, for any function g: Σ_i t_i g(e_i)/e_i and Σ_i (1−t_i) g(e_i)/(1−e_i) are
        // both unbiased for Σ g(e_i). Check the identity w_t·e = P (stabilized) exactly.
        let mut rng = Rng::new(3);
        let n = 200;
        let ps: Vec<f64> = (0..n).map(|_| 0.05 + 0.9 * rng.uniform()).collect();
        let t: Vec<bool> = ps.iter().map(|&e| rng.bernoulli(e)).collect();
        let p = t.iter().filter(|&&b| b).count() as f64 / n as f64;
        let w = iptw(
            &t,
            &ps,
            &IptwSettings {
                estimator: Estimator::Ate,
                ..Default::default()
            },
        )
        .unwrap();
        for i in 0..n {
            let back = if t[i] {
                w[i] * ps[i]
            } else {
                w[i] * (1.0 - ps[i])
            };
            let want = if t[i] { p } else { 1.0 - p };
            assert!((back - want).abs() < 1e-12);
        }
    }
}
