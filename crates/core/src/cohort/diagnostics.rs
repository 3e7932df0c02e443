//! Study diagnostics: the pass/fail rules CohortMethod applies to each analysis
//! (`runCmAnalyses`' export of `cm_diagnostics_summary`, thresholds from
//! `createCmDiagnosticThresholds`).
//!
//! | diagnostic | value | passes when | default threshold |
//! |---|---|---|---|
//! | balance | max \|SDM\| after adjustment | `max_sdm < sdm_threshold` | 0.1 |
//! | shared balance | max \|SDM\| of the shared covariates | `shared_max_sdm < sdm_threshold` | 0.1 |
//! | equipoise | share in preference [0.3, 0.7] | `equipoise ≥ equipoise_threshold` | 0.2 |
//! | MDRR | minimum detectable relative risk | `mdrr < mdrr_threshold` | 10 |
//! | generalizability | max \|SDM\| before vs after adjustment | `generalizability_max_sdm < generalizability_sdm_threshold` | 1 |
//! | EASE | expected absolute systematic error | `\|ease\| < ease_threshold` | 0.25 |
//!
//! A value that was not computed is `NOT EVALUATED` (and never blocks). The study may be
//! unblinded when none of the six fails; it may enter evidence synthesis when none but the MDRR
//! fails. (CohortMethod's default equipoise threshold is 0.2, not 0.1: older OHDSI study
//! templates used 0.1 as a warning level.) The generalizability value is the maximum absolute
//! target / comparator / whole-population difference of [`super::balance::Balance`] for the
//! estimands "att" / "atu" / others.

use serde::Deserialize;

use crate::error::{Error, Result};

/// CohortMethod's `createCmDiagnosticThresholds`.
///
/// | key | default |
/// |---|---|
/// | `mdrr_threshold` | 10 |
/// | `ease_threshold` | 0.25 |
/// | `sdm_threshold` | 0.1 |
/// | `equipoise_threshold` | 0.2 |
/// | `generalizability_sdm_threshold` | 1 |
#[derive(Debug, Clone, Copy, PartialEq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct DiagnosticThresholds {
    /// Largest MDRR allowed.
    pub mdrr_threshold: f64,
    /// Largest |EASE| allowed.
    pub ease_threshold: f64,
    /// Largest max |SDM| allowed.
    pub sdm_threshold: f64,
    /// Smallest equipoise required.
    pub equipoise_threshold: f64,
    /// Largest generalizability max |SDM| allowed.
    pub generalizability_sdm_threshold: f64,
}

impl Default for DiagnosticThresholds {
    fn default() -> Self {
        DiagnosticThresholds {
            mdrr_threshold: 10.0,
            ease_threshold: 0.25,
            sdm_threshold: 0.1,
            equipoise_threshold: 0.2,
            generalizability_sdm_threshold: 1.0,
        }
    }
}

impl DiagnosticThresholds {
    /// Validate: every threshold a number ≥ 0.
    pub fn check(&self) -> Result<()> {
        for (name, v) in [
            ("mdrr_threshold", self.mdrr_threshold),
            ("ease_threshold", self.ease_threshold),
            ("sdm_threshold", self.sdm_threshold),
            ("equipoise_threshold", self.equipoise_threshold),
            (
                "generalizability_sdm_threshold",
                self.generalizability_sdm_threshold,
            ),
        ] {
            if v.is_nan() || v < 0.0 {
                return Err(Error::option(
                    name,
                    format!("must be a number ≥ 0 (got {v})"),
                ));
            }
        }
        Ok(())
    }
}

/// The values the diagnostics judge (`None`: not computed).
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct DiagnosticValues {
    /// max |SDM| after adjustment.
    pub max_sdm: Option<f64>,
    /// max |SDM| of the shared covariate balance.
    pub shared_max_sdm: Option<f64>,
    /// Equipoise.
    pub equipoise: Option<f64>,
    /// MDRR.
    pub mdrr: Option<f64>,
    /// Generalizability max |SDM|.
    pub generalizability_max_sdm: Option<f64>,
    /// Expected absolute systematic error.
    pub ease: Option<f64>,
}

/// One diagnostic's outcome.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// Passed.
    Pass,
    /// Failed.
    Fail,
    /// No value.
    NotEvaluated,
}

impl Outcome {
    /// CohortMethod's label: `PASS`, `FAIL` or `NOT EVALUATED`.
    pub fn label(self) -> &'static str {
        match self {
            Outcome::Pass => "PASS",
            Outcome::Fail => "FAIL",
            Outcome::NotEvaluated => "NOT EVALUATED",
        }
    }

    fn of(value: Option<f64>, pass: impl Fn(f64) -> bool) -> Self {
        match value {
            None => Outcome::NotEvaluated,
            Some(v) if v.is_nan() => Outcome::NotEvaluated,
            Some(v) if pass(v) => Outcome::Pass,
            Some(_) => Outcome::Fail,
        }
    }
}

/// The diagnostics of one analysis.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Diagnostics {
    /// Balance.
    pub balance: Outcome,
    /// Shared balance.
    pub shared_balance: Outcome,
    /// Equipoise.
    pub equipoise: Outcome,
    /// MDRR.
    pub mdrr: Outcome,
    /// Generalizability.
    pub generalizability: Outcome,
    /// EASE.
    pub ease: Outcome,
    /// No diagnostic failed.
    pub unblind: bool,
    /// No diagnostic but the MDRR failed.
    pub unblind_for_evidence_synthesis: bool,
}

/// Judge `values` against `thresholds` (see the module documentation).
pub fn evaluate(
    values: &DiagnosticValues,
    thresholds: &DiagnosticThresholds,
) -> Result<Diagnostics> {
    thresholds.check()?;
    let t = thresholds;
    let balance = Outcome::of(values.max_sdm, |v| v < t.sdm_threshold);
    let shared_balance = Outcome::of(values.shared_max_sdm, |v| v < t.sdm_threshold);
    let equipoise = Outcome::of(values.equipoise, |v| v >= t.equipoise_threshold);
    let mdrr = Outcome::of(values.mdrr, |v| v < t.mdrr_threshold);
    let generalizability = Outcome::of(values.generalizability_max_sdm, |v| {
        v < t.generalizability_sdm_threshold
    });
    let ease = Outcome::of(values.ease, |v| v.abs() < t.ease_threshold);
    let others = [generalizability, ease, equipoise, balance, shared_balance];
    let synthesis = others.iter().all(|&o| o != Outcome::Fail);
    Ok(Diagnostics {
        balance,
        shared_balance,
        equipoise,
        mdrr,
        generalizability,
        ease,
        unblind: synthesis && mdrr != Outcome::Fail,
        unblind_for_evidence_synthesis: synthesis,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn thresholds_and_outcomes() {
        let d = evaluate(
            &DiagnosticValues {
                max_sdm: Some(0.1),
                shared_max_sdm: Some(0.09),
                equipoise: Some(0.2),
                mdrr: Some(12.0),
                generalizability_max_sdm: None,
                ease: Some(-0.3),
            },
            &DiagnosticThresholds::default(),
        )
        .unwrap();
        assert_eq!(d.balance, Outcome::Fail); // 0.1 is not < 0.1
        assert_eq!(d.shared_balance, Outcome::Pass);
        assert_eq!(d.equipoise, Outcome::Pass); // 0.2 ≥ 0.2
        assert_eq!(d.mdrr, Outcome::Fail);
        assert_eq!(d.generalizability, Outcome::NotEvaluated);
        assert_eq!(d.ease, Outcome::Fail); // |−0.3| ≥ 0.25
        assert!(!d.unblind && !d.unblind_for_evidence_synthesis);
        let ok = evaluate(
            &DiagnosticValues {
                max_sdm: Some(0.05),
                equipoise: Some(0.5),
                mdrr: Some(20.0),
                ..Default::default()
            },
            &DiagnosticThresholds::default(),
        )
        .unwrap();
        assert!(!ok.unblind && ok.unblind_for_evidence_synthesis);
        assert_eq!(Outcome::NotEvaluated.label(), "NOT EVALUATED");
        let t: DiagnosticThresholds =
            serde_json::from_str(r#"{"equipoise_threshold": 0.1}"#).unwrap();
        assert_eq!(t.sdm_threshold, 0.1);
        assert!(serde_json::from_str::<DiagnosticThresholds>(r#"{"sdm": 0.1}"#).is_err());
        assert!(DiagnosticThresholds {
            sdm_threshold: f64::NAN,
            ..Default::default()
        }
        .check()
        .is_err());
    }
}
