//! Kaplan–Meier curves per arm, adjusted as CohortMethod's `plotKaplanMeier` adjusts them (its
//! C++ `adjustedKm`), and the follow-up distribution (`getFollowUpDistribution`).
//!
//! # Kaplan–Meier
//!
//! At every distinct time `t` (event or censoring, ascending), with `d_t` the (weighted) events
//! at `t` and `Y_t` the (weighted) subjects with time ≥ `t`: `S(t) = Π_{u ≤ t} (1 − d_u/Y_u)`.
//!
//! * **Unweighted** (as `survival::survfit`): Greenwood's variance
//!   `S² Σ d/(Y(Y − d))` and the "log" interval `S·exp(±z·√(Σ d/(Y(Y − d))))`, capped at 1.
//! * **Weighted** (as `adjustedKm`): Xie & Liu's variance `S² Σ (d/Y)/M` with effective size
//!   `M = Y²/Σ w²` over the risk set (Xie & Liu 2005, eq. 4), and the log–log interval
//!   `S^{exp(z·√var/(S ln S))}` (the lower bound is `S` itself while `S > 0.9999`).
//!
//! `z = Φ⁻¹(0.975)`. Where R gives `NA` (e.g. the interval once `S = 0`) the bounds are NaN.
//!
//! # Adjustment ([`km_adjustment_weights`])
//!
//! * no strata, or exactly two subjects per stratum (`#strata = n/2`, 1:1 matching): unadjusted;
//! * every stratum has one target subject (variable-ratio matching): comparator weight
//!   `m_s/(1 − m_s)` with `m_s` the mean propensity score of the stratum (both arms); an error
//!   when some `m_s > 0.99999` (CohortMethod draws no plot);
//! * otherwise (stratification): comparator weight `n_{T,s}/n_{C,s}`; subjects of strata
//!   without both arms are left out (an error when no stratum has both).
//!
//! Target subjects weigh 1. At-risk counts are unweighted subject counts.
//!
//! Reference: Xie J, Liu C. Adjusted Kaplan–Meier estimator and log-rank test with inverse
//! probability of treatment weighting for survival data. *Stat Med* 2005;24:3089–3110.

use serde::Deserialize;

use super::{check_len, check_ps, quantile_type7};
use crate::calibration::normal_quantile;
use crate::error::{Error, Result};

/// A Kaplan–Meier curve at every distinct time.
#[derive(Debug, Clone, PartialEq)]
pub struct KmCurve {
    /// Distinct times, ascending.
    pub time: Vec<f64>,
    /// Survival just after each time.
    pub survival: Vec<f64>,
    /// Variance of the survival estimate.
    pub variance: Vec<f64>,
    /// Lower 95% bound.
    pub lower: Vec<f64>,
    /// Upper 95% bound.
    pub upper: Vec<f64>,
    /// Subjects at risk (time ≥ t), unweighted.
    pub at_risk: Vec<usize>,
    /// Events at t (weighted).
    pub events: Vec<f64>,
}

/// Kaplan–Meier estimate of one group: unweighted (`weight = None`) or weighted (see the module
/// documentation). Times must be finite, weights finite and ≥ 0.
pub fn kaplan_meier(time: &[f64], event: &[bool], weight: Option<&[f64]>) -> Result<KmCurve> {
    let n = time.len();
    check_len("event", event.len(), n)?;
    if let Some(k) = time.iter().position(|t| !t.is_finite()) {
        return Err(Error::option(
            "time",
            format!("element {k} is {}: times must be finite", time[k]),
        ));
    }
    if let Some(w) = weight {
        check_len("weight", w.len(), n)?;
        if let Some(k) = w.iter().position(|w| !(w.is_finite() && *w >= 0.0)) {
            return Err(Error::option(
                "weight",
                format!("element {k} is {}: weights must be finite and ≥ 0", w[k]),
            ));
        }
    }
    let w = |i: usize| weight.map_or(1.0, |w| w[i]);
    let mut order: Vec<usize> = (0..n).collect();
    order.sort_by(|&a, &b| time[a].total_cmp(&time[b]));
    // Suffix sums over the sorted order give the risk sets.
    let mut groups: Vec<(f64, usize, usize)> = Vec::new(); // (time, start, end) in `order`
    for (k, &i) in order.iter().enumerate() {
        match groups.last_mut() {
            Some(g) if g.0 == time[i] => g.2 = k + 1,
            _ => groups.push((time[i], k, k + 1)),
        }
    }
    let z = normal_quantile(0.975);
    let mut curve = KmCurve {
        time: Vec::with_capacity(groups.len()),
        survival: Vec::with_capacity(groups.len()),
        variance: Vec::with_capacity(groups.len()),
        lower: Vec::with_capacity(groups.len()),
        upper: Vec::with_capacity(groups.len()),
        at_risk: Vec::with_capacity(groups.len()),
        events: Vec::with_capacity(groups.len()),
    };
    // Risk-set sums from the end.
    let m = groups.len();
    let mut y = vec![0.0f64; m];
    let mut y2 = vec![0.0f64; m];
    let (mut acc, mut acc2) = (0.0f64, 0.0f64);
    for g in (0..m).rev() {
        for &i in &order[groups[g].1..groups[g].2] {
            acc += w(i);
            acc2 += w(i) * w(i);
        }
        y[g] = acc;
        y2[g] = acc2;
    }
    let (mut s, mut part) = (1.0f64, 0.0f64);
    for (g, &(t, a, b)) in groups.iter().enumerate() {
        let d: f64 = order[a..b]
            .iter()
            .filter(|&&i| event[i])
            .map(|&i| w(i))
            .sum();
        let rate = if y[g] > 0.0 { 1.0 - d / y[g] } else { 1.0 };
        s *= rate;
        let (var, lower, upper) = if weight.is_none() {
            part += if d > 0.0 {
                d / (y[g] * (y[g] - d))
            } else {
                0.0
            };
            let se = part.sqrt();
            let (lo, hi) = if s > 0.0 {
                (s * (-z * se).exp(), (s * (z * se).exp()).min(1.0))
            } else {
                (f64::NAN, f64::NAN)
            };
            (s * s * part, lo, hi)
        } else {
            let effective = if y2[g] > 0.0 {
                y[g] * y[g] / y2[g]
            } else {
                f64::INFINITY
            };
            part += (1.0 - rate) / effective;
            let var = s * s * part;
            let bound = |zq: f64| s.powf((zq / s.ln() * var.sqrt() / s).exp());
            let upper = bound(z);
            let lower = if s > 0.9999 { s } else { bound(-z) };
            (var, lower, upper)
        };
        curve.time.push(t);
        curve.survival.push(s);
        curve.variance.push(var);
        curve.lower.push(lower);
        curve.upper.push(upper);
        curve.at_risk.push(n - a);
        curve.events.push(d);
    }
    Ok(curve)
}

/// How [`km_adjustment_weights`] adjusted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KmAdjustment {
    /// No adjustment (no strata, or 1:1 matching).
    Unadjusted,
    /// Variable-ratio matching: comparator weights from the stratum's mean propensity score.
    VariableRatio,
    /// Stratification: comparator weights `n_T/n_C` of the stratum.
    Stratified,
}

/// Per-subject weights of the adjusted curves (see the module documentation): `None` for a
/// subject left out.
pub fn km_adjustment_weights(
    treatment: &[bool],
    stratum_id: Option<&[i64]>,
    propensity_score: Option<&[f64]>,
) -> Result<(KmAdjustment, Vec<Option<f64>>)> {
    let n = treatment.len();
    let Some(strata) = stratum_id else {
        return Ok((KmAdjustment::Unadjusted, vec![Some(1.0); n]));
    };
    check_len("stratum_id", strata.len(), n)?;
    let mut ids: Vec<i64> = strata.to_vec();
    ids.sort_unstable();
    ids.dedup();
    if 2 * ids.len() == n {
        return Ok((KmAdjustment::Unadjusted, vec![Some(1.0); n]));
    }
    let index: Vec<usize> = strata
        .iter()
        .map(|s| ids.partition_point(|x| x < s))
        .collect();
    let mut size = vec![[0usize; 2]; ids.len()];
    for (i, &s) in index.iter().enumerate() {
        size[s][usize::from(treatment[i])] += 1;
    }
    let max_target = size.iter().map(|s| s[1]).max().unwrap_or(0);
    if max_target == 1 {
        let ps = propensity_score.ok_or_else(|| {
            Error::option(
                "propensity_score",
                "variable ratio matching detected, but no propensity score given",
            )
        })?;
        check_len("propensity_score", ps.len(), n)?;
        check_ps(ps)?;
        let mut sum = vec![0.0f64; ids.len()];
        for (i, &s) in index.iter().enumerate() {
            sum[s] += ps[i];
        }
        let mean: Vec<f64> = sum
            .iter()
            .zip(&size)
            .map(|(s, c)| s / (c[0] + c[1]) as f64)
            .collect();
        if let Some(k) = mean.iter().position(|&m| m > 0.99999) {
            return Err(Error::option(
                "propensity_score",
                format!(
                    "matched set {} has a mean propensity score above 0.99999: no adjusted curve \
                     (CohortMethod draws none)",
                    ids[k]
                ),
            ));
        }
        let w = (0..n)
            .map(|i| {
                Some(if treatment[i] {
                    1.0
                } else {
                    let m = mean[index[i]];
                    m / (1.0 - m)
                })
            })
            .collect();
        return Ok((KmAdjustment::VariableRatio, w));
    }
    if !size.iter().any(|s| s[0] > 0 && s[1] > 0) {
        return Err(Error::option(
            "stratum_id",
            "no stratum holds both target and comparator subjects",
        ));
    }
    let w = (0..n)
        .map(|i| {
            let s = size[index[i]];
            (s[0] > 0 && s[1] > 0).then(|| {
                if treatment[i] {
                    1.0
                } else {
                    s[1] as f64 / s[0] as f64
                }
            })
        })
        .collect();
    Ok((KmAdjustment::Stratified, w))
}

/// Kaplan–Meier curves of both arms.
#[derive(Debug, Clone, PartialEq)]
pub struct ArmCurves {
    /// The adjustment used.
    pub adjustment: KmAdjustment,
    /// Target arm.
    pub target: KmCurve,
    /// Comparator arm.
    pub comparator: KmCurve,
}

/// Kaplan–Meier curves per arm, adjusted for `stratum_id` (matched sets or strata) as
/// `plotKaplanMeier` does; `event[i]` is whether subject `i` had the outcome by `time[i]`.
pub fn kaplan_meier_by_arm(
    treatment: &[bool],
    time: &[f64],
    event: &[bool],
    stratum_id: Option<&[i64]>,
    propensity_score: Option<&[f64]>,
) -> Result<ArmCurves> {
    let n = treatment.len();
    check_len("time", time.len(), n)?;
    check_len("event", event.len(), n)?;
    let (adjustment, w) = km_adjustment_weights(treatment, stratum_id, propensity_score)?;
    let arm = |a: bool| {
        let idx: Vec<usize> = (0..n)
            .filter(|&i| treatment[i] == a && w[i].is_some())
            .collect();
        let t: Vec<f64> = idx.iter().map(|&i| time[i]).collect();
        let e: Vec<bool> = idx.iter().map(|&i| event[i]).collect();
        let wt: Vec<f64> = idx.iter().map(|&i| w[i].unwrap_or(0.0)).collect();
        let weighted = adjustment != KmAdjustment::Unadjusted;
        kaplan_meier(&t, &e, weighted.then_some(&wt[..]))
    };
    Ok(ArmCurves {
        adjustment,
        target: arm(true)?,
        comparator: arm(false)?,
    })
}

/// Settings of [`follow_up_distribution`].
///
/// | key | default | meaning |
/// |---|---|---|
/// | `quantiles` | `[0, 0.1, 0.25, 0.5, 0.75, 0.9, 1]` | probabilities in [0, 1] |
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct FollowUpSettings {
    /// Probabilities of the quantiles.
    pub quantiles: Vec<f64>,
}

impl Default for FollowUpSettings {
    fn default() -> Self {
        FollowUpSettings {
            quantiles: vec![0.0, 0.1, 0.25, 0.5, 0.75, 0.9, 1.0],
        }
    }
}

/// Follow-up (time at risk) quantiles per arm (R type 7): min, p10, p25, median, p75, p90, max
/// by default. CohortMethod's `getFollowUpDistribution` labels the same numbers in reverse
/// (`100%` on the minimum: the follow-up that 100% of subjects reach). An empty arm gives NaN.
#[derive(Debug, Clone, PartialEq)]
pub struct FollowUpDistribution {
    /// The probabilities.
    pub quantiles: Vec<f64>,
    /// Target arm's quantiles.
    pub target: Vec<f64>,
    /// Comparator arm's quantiles.
    pub comparator: Vec<f64>,
}

/// See [`FollowUpDistribution`].
pub fn follow_up_distribution(
    treatment: &[bool],
    time_at_risk: &[f64],
    settings: &FollowUpSettings,
) -> Result<FollowUpDistribution> {
    check_len("time_at_risk", time_at_risk.len(), treatment.len())?;
    if let Some(k) = time_at_risk.iter().position(|t| !t.is_finite()) {
        return Err(Error::option(
            "time_at_risk",
            format!("element {k} is not finite"),
        ));
    }
    if settings.quantiles.is_empty() || settings.quantiles.iter().any(|q| !(0.0..=1.0).contains(q))
    {
        return Err(Error::option(
            "quantiles",
            "must be a non-empty list of numbers in [0, 1]",
        ));
    }
    let arm = |a: bool| {
        let mut v: Vec<f64> = treatment
            .iter()
            .zip(time_at_risk)
            .filter(|(&t, _)| t == a)
            .map(|(_, &x)| x)
            .collect();
        v.sort_unstable_by(f64::total_cmp);
        settings
            .quantiles
            .iter()
            .map(|&q| {
                if v.is_empty() {
                    f64::NAN
                } else {
                    quantile_type7(&v, q)
                }
            })
            .collect::<Vec<f64>>()
    };
    Ok(FollowUpDistribution {
        quantiles: settings.quantiles.clone(),
        target: arm(true),
        comparator: arm(false),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::rng::Rng;

    #[test]
    fn unweighted_hand_checked() {
        // Times 1, 2, 2, 3, 4 with events at 1, 2 (one of the two), 4:
        // S(1) = 4/5, S(2) = 4/5 · 3/4 = 3/5, S(3) = 3/5, S(4) = 0.
        let time = [1.0, 2.0, 2.0, 3.0, 4.0];
        let event = [true, true, false, false, true];
        let c = kaplan_meier(&time, &event, None).unwrap();
        assert_eq!(c.time, vec![1.0, 2.0, 3.0, 4.0]);
        let want = [0.8, 0.6, 0.6, 0.0];
        for (s, w) in c.survival.iter().zip(want) {
            assert!((s - w).abs() < 1e-15);
        }
        assert_eq!(c.at_risk, vec![5, 4, 2, 1]);
        // Greenwood at 2: 1/(5·4) + 1/(4·3) = 0.05 + 1/12.
        let g = 0.05 + 1.0 / 12.0;
        assert!((c.variance[1] - 0.36 * g).abs() < 1e-15);
        let z = normal_quantile(0.975);
        assert!((c.lower[1] - 0.6 * (-z * g.sqrt()).exp()).abs() < 1e-12);
        assert!(c.lower[3].is_nan());
    }

    #[test]
    fn unit_weights_give_the_same_survival_and_xie_variance() {
        let time = [1.0, 2.0, 2.0, 3.0, 4.0];
        let event = [true, true, false, false, true];
        let c = kaplan_meier(&time, &event, Some(&[1.0; 5])).unwrap();
        let u = kaplan_meier(&time, &event, None).unwrap();
        assert_eq!(c.survival, u.survival);
        // Xie with unit weights: S² Σ d/Y².
        let x = 1.0 / 25.0 + 1.0 / 16.0;
        assert!((c.variance[1] - 0.36 * x).abs() < 1e-15);
    }

    /// Slow reference: the product-limit estimate straight from its definition.
    fn reference(time: &[f64], event: &[bool], w: &[f64], t: f64) -> f64 {
        let mut times: Vec<f64> = time.to_vec();
        times.sort_by(f64::total_cmp);
        times.dedup();
        let mut s = 1.0;
        for &u in times.iter().filter(|&&u| u <= t) {
            let y: f64 = (0..time.len())
                .filter(|&i| time[i] >= u)
                .map(|i| w[i])
                .sum();
            let d: f64 = (0..time.len())
                .filter(|&i| time[i] == u && event[i])
                .map(|i| w[i])
                .sum();
            s *= 1.0 - d / y;
        }
        s
    }

    #[test]
    fn randomized_weighted_against_reference() {
        let mut rng = Rng::new(41);
        for _ in 0..30 {
            let n = 1 + rng.int_range(0, 50) as usize;
            let time: Vec<f64> = (0..n).map(|_| rng.int_range(1, 20) as f64).collect();
            let event: Vec<bool> = (0..n).map(|_| rng.bernoulli(0.4)).collect();
            let w: Vec<f64> = (0..n).map(|_| 0.1 + 2.0 * rng.uniform()).collect();
            let c = kaplan_meier(&time, &event, Some(&w)).unwrap();
            for (k, &t) in c.time.iter().enumerate() {
                assert!((c.survival[k] - reference(&time, &event, &w, t)).abs() < 1e-12);
                assert_eq!(c.at_risk[k], time.iter().filter(|&&x| x >= t).count());
            }
        }
    }

    #[test]
    fn adjustment_weights() {
        // 1:1 matching: unadjusted.
        let t = [true, false, true, false];
        let (a, _) = km_adjustment_weights(&t, Some(&[0, 0, 1, 1]), None).unwrap();
        assert_eq!(a, KmAdjustment::Unadjusted);
        // Variable ratio: set 0 = T + 2 C (mean ps 0.2 → weight 0.25), set 1 = T + 1 C.
        let t = [true, false, false, true, false];
        let ps = [0.3, 0.2, 0.1, 0.5, 0.5];
        let (a, w) = km_adjustment_weights(&t, Some(&[0, 0, 0, 1, 1]), Some(&ps)).unwrap();
        assert_eq!(a, KmAdjustment::VariableRatio);
        assert!((w[1].unwrap() - 0.25).abs() < 1e-12);
        assert_eq!(w[0], Some(1.0));
        assert!((w[4].unwrap() - 1.0).abs() < 1e-12);
        assert!(km_adjustment_weights(&t, Some(&[0, 0, 0, 1, 1]), None).is_err());
        // Stratification: stratum 1 = 2 T + 1 C (weight 2), strata 2 (1 C) and 4 (1 T) have a
        // single arm (left out), stratum 3 = 1 T + 1 C. (Six subjects in three strata would
        // read as 1:1 matching.)
        let t = [true, true, false, false, true, false, true];
        let strata = [1, 1, 1, 2, 3, 3, 4];
        let (a, w) = km_adjustment_weights(&t, Some(&strata), None).unwrap();
        assert_eq!(a, KmAdjustment::Stratified);
        assert_eq!(
            w,
            vec![
                Some(1.0),
                Some(1.0),
                Some(2.0),
                None,
                Some(1.0),
                Some(1.0),
                None
            ]
        );
        let time = [1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0];
        let curves = kaplan_meier_by_arm(&t, &time, &[true; 7], Some(&strata), None).unwrap();
        assert_eq!(curves.comparator.time, vec![3.0, 6.0]);
        assert_eq!(curves.target.time.len(), 3);
    }

    #[test]
    fn follow_up() {
        let t = [true, true, true, false];
        let d = follow_up_distribution(&t, &[10.0, 20.0, 30.0, 5.0], &FollowUpSettings::default())
            .unwrap();
        assert_eq!(d.target[0], 10.0);
        assert_eq!(d.target[3], 20.0);
        assert_eq!(d.target[6], 30.0);
        assert!((d.target[1] - 12.0).abs() < 1e-12);
        assert_eq!(d.comparator, vec![5.0; 7]);
        let s = FollowUpSettings {
            quantiles: vec![1.5],
        };
        assert!(follow_up_distribution(&t, &[1.0; 4], &s).is_err());
        assert!(kaplan_meier(&[1.0, f64::NAN], &[true, false], None).is_err());
        assert!(kaplan_meier(&[1.0], &[true], Some(&[-1.0])).is_err());
    }
}
