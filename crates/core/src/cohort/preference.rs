//! Preference score and equipoise (Walker et al. 2013): CohortMethod's `computePreferenceScore`
//! and `computeEquipoise`.
//!
//! The preference score `F` removes the overall treatment share `P` from the propensity score
//! `S`: `ln(F/(1 − F)) = ln(S/(1 − S)) − ln(P/(1 − P))`, with `S` capped at `0.9999999` first
//! (as CohortMethod). `P` is the proportion of target subjects in the population given, or in
//! an unfiltered population (`unfilteredData`) when the scores are those of a trimmed or
//! matched subset. A subject is **in equipoise** when its preference score lies in the closed
//! interval `[lower, upper]` (default `[0.3, 0.7]`); equipoise is the share of subjects (both
//! arms together) in equipoise.
//!
//! Reference: Walker AM, Patrick AR, Lauer MS, et al. A tool for assessing the feasibility of
//! comparative effectiveness research. *Comparative Effectiveness Research* 2013;3:11–20.

use serde::Deserialize;

use super::{arm_counts, check_bounds, check_len, check_ps};
use crate::error::{Error, Result};

/// CohortMethod's cap on the propensity score before the logit.
pub const PS_CAP: f64 = 0.9999999;

/// Settings of [`equipoise`] and [`super::trim::trim_by_ps_to_equipoise`].
///
/// | key | default | meaning |
/// |---|---|---|
/// | `bounds` | `[0.3, 0.7]` | preference-score interval (closed) of equipoise, 0 ≤ lower ≤ upper ≤ 1 |
#[derive(Debug, Clone, Copy, PartialEq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct EquipoiseSettings {
    /// `[lower, upper]`.
    pub bounds: [f64; 2],
}

impl Default for EquipoiseSettings {
    fn default() -> Self {
        EquipoiseSettings { bounds: [0.3, 0.7] }
    }
}

impl EquipoiseSettings {
    /// Validate.
    pub fn check(&self) -> Result<()> {
        check_bounds("bounds", self.bounds)
    }
}

/// The preference score of one propensity score `ps` given the treated share `proportion`.
pub fn preference_score(ps: f64, proportion: f64) -> f64 {
    let s = ps.min(PS_CAP);
    let x = (s / (1.0 - s)).ln() - (proportion / (1.0 - proportion)).ln();
    super::ps::logistic(x)
}

/// Preference scores of every subject (input order). `proportion` is the treated share `P`;
/// `None` takes it from `treatment` (CohortMethod's default; pass the unfiltered population's
/// share after trimming or matching). Errors: lengths differ, a score outside [0, 1], a single
/// arm (P = 0 or 1), `proportion` outside (0, 1).
pub fn preference_scores(
    treatment: &[bool],
    propensity_score: &[f64],
    proportion: Option<f64>,
) -> Result<Vec<f64>> {
    let p = treated_share(treatment, propensity_score, proportion)?;
    Ok(propensity_score
        .iter()
        .map(|&s| preference_score(s, p))
        .collect())
}

fn treated_share(treatment: &[bool], ps: &[f64], proportion: Option<f64>) -> Result<f64> {
    check_len("propensity_score", ps.len(), treatment.len())?;
    check_ps(ps)?;
    let p = match proportion {
        Some(p) => p,
        None => {
            if treatment.is_empty() {
                return Err(Error::Empty("no subjects".into()));
            }
            arm_counts(treatment).0 as f64 / treatment.len() as f64
        }
    };
    if !(p > 0.0 && p < 1.0) {
        return Err(Error::option(
            "proportion",
            format!(
                "the treated share must be in (0, 1) (got {p}): both arms are needed for a \
                 preference score"
            ),
        ));
    }
    Ok(p)
}

/// Share of subjects whose preference score is in `settings.bounds` (CohortMethod's
/// `computeEquipoise`), with `P` from `treatment`.
pub fn equipoise(
    treatment: &[bool],
    propensity_score: &[f64],
    settings: &EquipoiseSettings,
) -> Result<f64> {
    settings.check()?;
    let f = preference_scores(treatment, propensity_score, None)?;
    let [lo, hi] = settings.bounds;
    let inside = f.iter().filter(|&&x| x >= lo && x <= hi).count();
    Ok(inside as f64 / f.len() as f64)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::rng::Rng;

    #[test]
    fn hand_checked_values() {
        // P = 1/2: the preference score is the propensity score.
        let t = [true, false, true, false];
        let ps = [0.2, 0.4, 0.6, 0.8];
        let f = preference_scores(&t, &ps, None).unwrap();
        for (a, b) in f.iter().zip(ps) {
            assert!((a - b).abs() < 1e-15);
        }
        assert_eq!(
            equipoise(&t, &ps, &EquipoiseSettings::default()).unwrap(),
            0.5
        );
        // P = 1/4, S = 1/4: odds ratio 1 → F = 1/2. S = 1/2 → F = 3/4.
        let t = [true, false, false, false];
        let f = preference_scores(&t, &[0.25, 0.5, 0.0, 1.0], None).unwrap();
        assert!((f[0] - 0.5).abs() < 1e-15);
        assert!((f[1] - 0.75).abs() < 1e-15);
        assert_eq!(f[2], 0.0);
        // S = 1 is capped at 0.9999999: odds 9999999 / (1/3).
        let x = 9_999_999.0f64 * 3.0;
        assert!((f[3] - x / (x + 1.0)).abs() < 1e-12);
    }

    #[test]
    fn errors() {
        assert!(preference_scores(&[true, true], &[0.5, 0.5], None).is_err());
        assert!(preference_scores(&[true, false], &[0.5], None).is_err());
        assert!(preference_scores(&[true, false], &[0.5, 1.5], None).is_err());
        assert!(preference_scores(&[true, false], &[0.5, f64::NAN], None).is_err());
        let bad = EquipoiseSettings { bounds: [0.7, 0.3] };
        assert!(equipoise(&[true, false], &[0.5, 0.5], &bad).is_err());
        let s: EquipoiseSettings = serde_json::from_str(r#"{"bounds": [0.2, 0.8]}"#).unwrap();
        assert_eq!(s.bounds, [0.2, 0.8]);
        assert!(serde_json::from_str::<EquipoiseSettings>(r#"{"bound": [0.2, 0.8]}"#).is_err());
    }

    #[test]
    fn randomized_against_the_definition() {
        let mut rng = Rng::new(5);
        for _ in 0..50 {
            let n = 2 + rng.int_range(0, 50) as usize;
            let mut t: Vec<bool> = (0..n).map(|_| rng.bernoulli(0.3)).collect();
            t[0] = true;
            t[1] = false;
            let ps: Vec<f64> = (0..n).map(|_| rng.uniform()).collect();
            let p = t.iter().filter(|&&b| b).count() as f64 / n as f64;
            let f = preference_scores(&t, &ps, None).unwrap();
            for (s, fi) in ps.iter().zip(&f) {
                // Odds of F = odds of S / odds of P.
                let want = (s / (1.0 - s)) / (p / (1.0 - p));
                assert!((fi / (1.0 - fi) - want).abs() <= 1e-9 * want.max(1.0));
            }
            let e = equipoise(&t, &ps, &EquipoiseSettings::default()).unwrap();
            let slow = f.iter().filter(|x| (0.3..=0.7).contains(*x)).count() as f64 / n as f64;
            assert_eq!(e, slow);
        }
    }
}
