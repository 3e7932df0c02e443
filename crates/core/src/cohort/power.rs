//! Power: the minimum detectable relative risk, CohortMethod's `computeMdrr`.
//!
//! With `p` the share of target subjects, `E` the number of subjects with at least one outcome,
//! `N` the number of subjects, `z_α = Φ⁻¹(1 − α/2)` (two-sided) or `Φ⁻¹(1 − α)` and
//! `z_β = Φ⁻¹(power)`:
//!
//! * **Cox** (Schoenfeld 1983): `MDRR = exp(√((z_α + z_β)² / (E p (1 − p))))`;
//! * **logistic** (Wald's z-test): `MDRR = exp((z_α + z_β) · se)` with `se = √(1/(E(1 − E/N)))`.
//!   CohortMethod finds `z` with `uniroot(pnorm(z − z_α) − power)`, whose exact root is
//!   `z_α + z_β`; we use the closed form.
//!
//! `E = 0` gives an MDRR of +∞. [`mdrr_summary`] also reports CohortMethod's expected standard
//! error `1/√(E p (1 − p))` and the subject and day counts per arm.
//!
//! Reference: Schoenfeld DA. Sample-size formula for the proportional-hazards regression model.
//! *Biometrics* 1983;39(2):499–503.

use serde::Deserialize;

use super::check_len;
use crate::calibration::normal_quantile;
use crate::error::{Error, Result};

/// The outcome model the MDRR is computed for (CohortMethod's `modelType`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum PowerModel {
    /// Cox regression (Schoenfeld).
    #[default]
    Cox,
    /// Logistic regression (Wald).
    Logistic,
}

/// Settings of [`mdrr`].
///
/// | key | default | meaning |
/// |---|---|---|
/// | `alpha` | 0.05 | type I error, in (0, 1) |
/// | `power` | 0.8 | 1 − type II error, in (0, 1) |
/// | `two_sided` | true | two-sided test |
/// | `model_type` | `cox` | `cox` or `logistic` |
#[derive(Debug, Clone, Copy, PartialEq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct MdrrSettings {
    /// Type I error.
    pub alpha: f64,
    /// Power.
    pub power: f64,
    /// Two-sided test.
    pub two_sided: bool,
    /// Outcome model.
    pub model_type: PowerModel,
}

impl Default for MdrrSettings {
    fn default() -> Self {
        MdrrSettings {
            alpha: 0.05,
            power: 0.8,
            two_sided: true,
            model_type: PowerModel::Cox,
        }
    }
}

impl MdrrSettings {
    /// Validate.
    pub fn check(&self) -> Result<()> {
        for (name, v) in [("alpha", self.alpha), ("power", self.power)] {
            if !(v > 0.0 && v < 1.0) {
                return Err(Error::option(name, format!("must be in (0, 1) (got {v})")));
            }
        }
        Ok(())
    }
}

/// CohortMethod's `computeMdrrFromAggregateStats`: the MDRR from the target share `p_target`,
/// the subjects with an outcome `total_events` and all subjects `total_subjects`.
pub fn mdrr(
    p_target: f64,
    total_events: usize,
    total_subjects: usize,
    settings: &MdrrSettings,
) -> Result<f64> {
    settings.check()?;
    if !(p_target > 0.0 && p_target < 1.0) {
        return Err(Error::option(
            "p_target",
            format!("the target share must be in (0, 1) (got {p_target})"),
        ));
    }
    if total_events > total_subjects {
        return Err(Error::option(
            "total_events",
            format!("{total_events} subjects with an outcome out of {total_subjects}"),
        ));
    }
    if total_events == 0 {
        return Ok(f64::INFINITY);
    }
    let z_alpha = if settings.two_sided {
        normal_quantile(1.0 - settings.alpha / 2.0)
    } else {
        normal_quantile(1.0 - settings.alpha)
    };
    let z_beta = -normal_quantile(1.0 - settings.power);
    let e = total_events as f64;
    Ok(match settings.model_type {
        PowerModel::Cox => ((z_beta + z_alpha).powi(2) / (e * p_target * (1.0 - p_target)))
            .sqrt()
            .exp(),
        PowerModel::Logistic => {
            let baseline = e / total_subjects as f64;
            let se = (1.0 / (e * (1.0 - baseline))).sqrt();
            ((z_alpha + z_beta) * se).exp()
        }
    })
}

/// CohortMethod's `computeMdrr` result.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct MdrrSummary {
    /// Target subjects.
    pub target_subjects: usize,
    /// Comparator subjects.
    pub comparator_subjects: usize,
    /// Target days at risk.
    pub target_days: f64,
    /// Comparator days at risk.
    pub comparator_days: f64,
    /// Subjects with at least one outcome.
    pub total_outcomes: usize,
    /// Minimum detectable relative risk.
    pub mdrr: f64,
    /// Expected standard error of the log hazard ratio, `1/√(E p (1 − p))`.
    pub se: f64,
}

/// CohortMethod's `computeMdrr(population)` from per-subject treatment, outcome counts and days
/// at risk.
pub fn mdrr_summary(
    treatment: &[bool],
    outcome_count: &[u32],
    time_at_risk: &[f64],
    settings: &MdrrSettings,
) -> Result<MdrrSummary> {
    let n = treatment.len();
    check_len("outcome_count", outcome_count.len(), n)?;
    check_len("time_at_risk", time_at_risk.len(), n)?;
    if let Some(k) = time_at_risk.iter().position(|t| !t.is_finite()) {
        return Err(Error::option(
            "time_at_risk",
            format!("element {k} is not finite"),
        ));
    }
    let target_subjects = treatment.iter().filter(|&&t| t).count();
    let comparator_subjects = n - target_subjects;
    let total_outcomes = outcome_count.iter().filter(|&&c| c != 0).count();
    let (mut target_days, mut comparator_days) = (0.0f64, 0.0f64);
    for (&t, &d) in treatment.iter().zip(time_at_risk) {
        if t {
            target_days += d;
        } else {
            comparator_days += d;
        }
    }
    let p = target_subjects as f64 / n as f64;
    let m = mdrr(p, total_outcomes, n, settings)?;
    Ok(MdrrSummary {
        target_subjects,
        comparator_subjects,
        target_days,
        comparator_days,
        total_outcomes,
        mdrr: m,
        se: 1.0 / (total_outcomes as f64 * p * (1.0 - p)).sqrt(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cox_hand_checked() {
        // z_α = 1.959964, z_β = 0.841621: (z_α + z_β)² = 7.848861; E = 100, p = 0.5:
        // MDRR = exp(√(7.848861 / 25)) = exp(0.560316) = 1.751.
        let m = mdrr(0.5, 100, 1000, &MdrrSettings::default()).unwrap();
        let z: f64 = 1.959_963_984_540_054 + 0.841_621_233_572_914_3;
        assert!((m - (z * z / 25.0).sqrt().exp()).abs() < 1e-12);
        assert!((m - 1.751).abs() < 1e-3);
        assert_eq!(
            mdrr(0.5, 0, 10, &MdrrSettings::default()).unwrap(),
            f64::INFINITY
        );
        // One-sided uses z_{1−α}.
        let one = MdrrSettings {
            two_sided: false,
            ..Default::default()
        };
        let z1: f64 = 1.644_853_626_951_472_2 + 0.841_621_233_572_914_3;
        assert!(
            (mdrr(0.5, 100, 1000, &one).unwrap() - (z1 * z1 / 25.0).sqrt().exp()).abs() < 1e-12
        );
    }

    #[test]
    fn logistic_is_the_root_of_the_power_equation() {
        let s = MdrrSettings {
            model_type: PowerModel::Logistic,
            ..Default::default()
        };
        let m = mdrr(0.3, 50, 1000, &s).unwrap();
        let se = (1.0 / (50.0 * (1.0 - 0.05f64))).sqrt();
        let z = m.ln() / se;
        // pnorm(z − z_α) = power.
        let p = crate::calibration::normal_cdf(z - 1.959_963_984_540_054);
        assert!((p - 0.8).abs() < 1e-12);
    }

    #[test]
    fn summary_and_errors() {
        let t = [true, true, false, false];
        let s = mdrr_summary(
            &t,
            &[1, 0, 2, 0],
            &[10.0, 20.0, 5.0, 5.0],
            &MdrrSettings::default(),
        )
        .unwrap();
        assert_eq!(
            (s.target_subjects, s.comparator_subjects, s.total_outcomes),
            (2, 2, 2)
        );
        assert_eq!((s.target_days, s.comparator_days), (30.0, 10.0));
        assert!((s.se - 1.0 / (0.5f64).sqrt()).abs() < 1e-12);
        assert!(mdrr(0.0, 1, 2, &MdrrSettings::default()).is_err());
        assert!(mdrr(0.5, 3, 2, &MdrrSettings::default()).is_err());
        let bad = MdrrSettings {
            power: 1.0,
            ..Default::default()
        };
        assert!(bad.check().is_err());
        let s: MdrrSettings = serde_json::from_str(r#"{"model_type": "logistic"}"#).unwrap();
        assert_eq!(s.model_type, PowerModel::Logistic);
        assert!(serde_json::from_str::<MdrrSettings>(r#"{"model": "cox"}"#).is_err());
    }
}
