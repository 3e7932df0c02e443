//! Trimming: CohortMethod's `trimByPs`, `trimByPsToEquipoise` and `trimByIptw`.
//!
//! | function | keeps | attrition step |
//! |---|---|---|
//! | [`trim_by_ps`] | target subjects with `ps ≥ q_T(f)` and comparator subjects with `ps ≤ q_C(1 − f)`, where `q_T`, `q_C` are R's default (type 7) quantiles of the target's and the comparator's scores and `f` the trim fraction | `Trimmed by PS` |
//! | [`trim_by_ps_to_equipoise`] | subjects whose preference score ([`super::preference`], `P` from this population) is in `[lower, upper]` | `Trimmed to equipoise` |
//! | [`trim_by_iptw`] | subjects with `iptw ≤ max_weight` | `Trimmed by IPTW` |
//!
//! `trimByPs` thus removes the fraction `f` of target subjects with the **lowest** scores and
//! the fraction `f` of comparator subjects with the **highest** scores (its code does this;
//! its help text says the opposite). An arm with no subjects stays empty.
//!
//! [`TrimSettings`] applies any of the three, in the order of the table.

use serde::Deserialize;

use super::preference::{preference_scores, EquipoiseSettings};
use super::{check_bounds, check_len, check_ps, quantile_type7, AttritionStep, Selection};
use crate::error::{Error, Result};

fn selection(treatment: &[bool], kept: Vec<usize>, description: &str) -> Selection {
    let target = kept.iter().filter(|&&i| treatment[i]).count();
    Selection {
        attrition: AttritionStep {
            description: description.into(),
            target,
            comparator: kept.len() - target,
        },
        kept,
    }
}

fn sorted_scores(treatment: &[bool], ps: &[f64], arm: bool) -> Vec<f64> {
    let mut v: Vec<f64> = treatment
        .iter()
        .zip(ps)
        .filter(|(&t, _)| t == arm)
        .map(|(_, &p)| p)
        .collect();
    v.sort_unstable_by(f64::total_cmp);
    v
}

/// CohortMethod's `trimByPs(population, trimFraction)`; see the module documentation.
/// `trim_fraction` must be in [0, 1].
pub fn trim_by_ps(
    treatment: &[bool],
    propensity_score: &[f64],
    trim_fraction: f64,
) -> Result<Selection> {
    check_len("propensity_score", propensity_score.len(), treatment.len())?;
    check_ps(propensity_score)?;
    if !(0.0..=1.0).contains(&trim_fraction) {
        return Err(Error::option(
            "trim_fraction",
            format!("must be in [0, 1] (got {trim_fraction})"),
        ));
    }
    let target = sorted_scores(treatment, propensity_score, true);
    let comparator = sorted_scores(treatment, propensity_score, false);
    let cut_target = (!target.is_empty()).then(|| quantile_type7(&target, trim_fraction));
    let cut_comparator =
        (!comparator.is_empty()).then(|| quantile_type7(&comparator, 1.0 - trim_fraction));
    let kept = (0..treatment.len())
        .filter(|&i| {
            let p = propensity_score[i];
            if treatment[i] {
                cut_target.is_some_and(|c| p >= c)
            } else {
                cut_comparator.is_some_and(|c| p <= c)
            }
        })
        .collect();
    Ok(selection(treatment, kept, "Trimmed by PS"))
}

/// CohortMethod's `trimByPsToEquipoise(population, bounds)`; see the module documentation.
pub fn trim_by_ps_to_equipoise(
    treatment: &[bool],
    propensity_score: &[f64],
    settings: &EquipoiseSettings,
) -> Result<Selection> {
    settings.check()?;
    let f = preference_scores(treatment, propensity_score, None)?;
    let [lo, hi] = settings.bounds;
    let kept = (0..treatment.len())
        .filter(|&i| f[i] >= lo && f[i] <= hi)
        .collect();
    Ok(selection(treatment, kept, "Trimmed to equipoise"))
}

/// CohortMethod's `trimByIptw(population, maxWeight)`: keep subjects with `iptw ≤ max_weight`.
pub fn trim_by_iptw(treatment: &[bool], iptw: &[f64], max_weight: f64) -> Result<Selection> {
    check_len("iptw", iptw.len(), treatment.len())?;
    if max_weight.is_nan() || max_weight < 0.0 {
        return Err(Error::option(
            "max_weight",
            format!("must be ≥ 0 (got {max_weight})"),
        ));
    }
    if let Some(k) = iptw.iter().position(|w| w.is_nan()) {
        return Err(Error::option("iptw", format!("element {k} is NaN")));
    }
    let kept = (0..treatment.len())
        .filter(|&i| iptw[i] <= max_weight)
        .collect();
    Ok(selection(treatment, kept, "Trimmed by IPTW"))
}

/// Settings of [`TrimSettings::trim`] (every key optional; none given: nothing is trimmed).
///
/// | key | default | meaning |
/// |---|---|---|
/// | `trim_fraction` | – | [`trim_by_ps`]'s fraction, in [0, 1] (CohortMethod's `trimByPs` default is 0.05) |
/// | `equipoise_bounds` | – | [`trim_by_ps_to_equipoise`]'s bounds (CohortMethod's default `[0.3, 0.7]`) |
/// | `max_weight` | – | [`trim_by_iptw`]'s bound, ≥ 0 (CohortMethod's default 10) |
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct TrimSettings {
    /// Trim fraction.
    pub trim_fraction: Option<f64>,
    /// Equipoise bounds.
    pub equipoise_bounds: Option<[f64; 2]>,
    /// Largest IPTW kept.
    pub max_weight: Option<f64>,
}

impl TrimSettings {
    /// Validate.
    pub fn check(&self) -> Result<()> {
        if let Some(f) = self.trim_fraction {
            if !(0.0..=1.0).contains(&f) {
                return Err(Error::option(
                    "trim_fraction",
                    format!("must be in [0, 1] (got {f})"),
                ));
            }
        }
        if let Some(b) = self.equipoise_bounds {
            check_bounds("equipoise_bounds", b)?;
        }
        if let Some(w) = self.max_weight {
            if w.is_nan() || w < 0.0 {
                return Err(Error::option(
                    "max_weight",
                    format!("must be ≥ 0 (got {w})"),
                ));
            }
        }
        Ok(())
    }

    /// Apply the configured steps in order (fraction, equipoise, IPTW), each on the subjects the
    /// previous one kept; `iptw` is needed only with `max_weight`. Returns the kept subjects
    /// (increasing indices into the input) and one attrition row per step applied.
    pub fn trim(
        &self,
        treatment: &[bool],
        propensity_score: &[f64],
        iptw: Option<&[f64]>,
    ) -> Result<(Vec<usize>, Vec<AttritionStep>)> {
        self.check()?;
        check_len("propensity_score", propensity_score.len(), treatment.len())?;
        let mut kept: Vec<usize> = (0..treatment.len()).collect();
        let mut steps = Vec::new();
        let sub = |kept: &[usize], x: &[f64]| kept.iter().map(|&i| x[i]).collect::<Vec<f64>>();
        let mut apply = |kept: &mut Vec<usize>, s: Selection| {
            *kept = s.kept.iter().map(|&k| kept[k]).collect();
            steps.push(s.attrition);
        };
        if let Some(f) = self.trim_fraction {
            let t: Vec<bool> = kept.iter().map(|&i| treatment[i]).collect();
            let s = trim_by_ps(&t, &sub(&kept, propensity_score), f)?;
            apply(&mut kept, s);
        }
        if let Some(bounds) = self.equipoise_bounds {
            let t: Vec<bool> = kept.iter().map(|&i| treatment[i]).collect();
            let s = trim_by_ps_to_equipoise(
                &t,
                &sub(&kept, propensity_score),
                &EquipoiseSettings { bounds },
            )?;
            apply(&mut kept, s);
        }
        if let Some(w) = self.max_weight {
            let iptw = iptw.ok_or_else(|| {
                Error::option("max_weight", "trimming by IPTW needs the subjects' weights")
            })?;
            check_len("iptw", iptw.len(), treatment.len())?;
            let t: Vec<bool> = kept.iter().map(|&i| treatment[i]).collect();
            let s = trim_by_iptw(&t, &sub(&kept, iptw), w)?;
            apply(&mut kept, s);
        }
        Ok((kept, steps))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::rng::Rng;

    #[test]
    fn trim_by_ps_hand_checked() {
        // Target scores 0.1..1.0 (10), comparator 0.05..0.5 (10). f = 0.1:
        // target cut = quantile(0.1) = 0.1 + 0.9·0.1 = 0.19 → drops 0.1;
        // comparator cut = quantile(0.9) = 0.455 → drops 0.5.
        let mut t = vec![true; 10];
        t.extend(vec![false; 10]);
        let mut ps: Vec<f64> = (1..=10).map(|k| k as f64 / 10.0).collect();
        ps.extend((1..=10).map(|k| k as f64 / 20.0));
        let s = trim_by_ps(&t, &ps, 0.1).unwrap();
        assert_eq!(s.kept.len(), 18);
        assert!(!s.kept.contains(&0) && !s.kept.contains(&19));
        assert_eq!((s.attrition.target, s.attrition.comparator), (9, 9));
        assert_eq!(s.attrition.description, "Trimmed by PS");
        // f = 0 keeps everyone.
        assert_eq!(trim_by_ps(&t, &ps, 0.0).unwrap().kept.len(), 20);
        assert!(trim_by_ps(&t, &ps, 1.5).is_err());
    }

    #[test]
    fn trim_by_ps_randomized_against_sorting() {
        let mut rng = Rng::new(9);
        for _ in 0..50 {
            let n = 2 + rng.int_range(0, 60) as usize;
            let t: Vec<bool> = (0..n).map(|_| rng.bernoulli(0.5)).collect();
            let ps: Vec<f64> = (0..n).map(|_| rng.uniform()).collect();
            let f = rng.uniform() * 0.5;
            let s = trim_by_ps(&t, &ps, f).unwrap();
            // Slow reference: kept target scores are exactly those ≥ the type-7 quantile.
            for arm in [true, false] {
                let mut v: Vec<f64> = (0..n).filter(|&i| t[i] == arm).map(|i| ps[i]).collect();
                if v.is_empty() {
                    continue;
                }
                v.sort_by(f64::total_cmp);
                let p = if arm { f } else { 1.0 - f };
                let h = (v.len() - 1) as f64 * p;
                let (lo, hi) = (
                    h.floor() as usize,
                    (h.floor() as usize + 1).min(v.len() - 1),
                );
                let cut = v[lo] + (h - h.floor()) * (v[hi] - v[lo]);
                for i in (0..n).filter(|&i| t[i] == arm) {
                    let keep = if arm { ps[i] >= cut } else { ps[i] <= cut };
                    assert_eq!(s.kept.contains(&i), keep);
                }
            }
        }
    }

    #[test]
    fn equipoise_and_iptw_trimming() {
        let t = [true, false, true, false];
        let ps = [0.2, 0.4, 0.6, 0.8];
        let s = trim_by_ps_to_equipoise(&t, &ps, &EquipoiseSettings::default()).unwrap();
        assert_eq!(s.kept, vec![1, 2]);
        let s = trim_by_iptw(&t, &[1.0, 12.0, 10.0, 3.0], 10.0).unwrap();
        assert_eq!(s.kept, vec![0, 2, 3]);
        assert_eq!(s.attrition.description, "Trimmed by IPTW");
    }

    #[test]
    fn settings_chain_steps() {
        let t = [true, false, true, false, true, false];
        let ps = [0.1, 0.35, 0.5, 0.55, 0.65, 0.95];
        let s: TrimSettings =
            serde_json::from_str(r#"{"equipoise_bounds": [0.3, 0.7], "max_weight": 5}"#).unwrap();
        let w = [1.0, 1.0, 9.0, 1.0, 1.0, 1.0];
        let (kept, steps) = s.trim(&t, &ps, Some(&w)).unwrap();
        assert_eq!(kept, vec![1, 3, 4]);
        assert_eq!(steps.len(), 2);
        assert!(s.trim(&t, &ps, None).is_err());
        assert!(serde_json::from_str::<TrimSettings>(r#"{"fraction": 0.1}"#).is_err());
        assert!(TrimSettings {
            trim_fraction: Some(-0.1),
            ..Default::default()
        }
        .check()
        .is_err());
    }
}
