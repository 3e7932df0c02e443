//! Stratification on the propensity score: CohortMethod's `stratifyByPs`.
//!
//! # Definition
//!
//! With `K` = `number_of_strata`, the inner bounds are the quantiles `q_k = quantile(base,
//! k/K)`, `k = 1 … K − 1` (R's type 7), of the scores of the **base selection**: all subjects
//! (`all`, CohortMethod's target estimator "ate"), the target subjects (`target`, "att") or the
//! comparator subjects (`comparator`, "atu"). The breaks are the distinct values of
//! `(0, q_1, …, q_{K−1}, 1)` with the first replaced by −1; stratum `k` (ids from 1) is the
//! right-closed interval `(b_{k−1}, b_k]`. When bounds coincide fewer than `K` strata are
//! created ([`Stratification::n_strata`] says how many; CohortMethod warns). Every subject is
//! kept. An empty base selection gives a single stratum.
//!
//! With additional strata (CohortMethod's `stratificationColumns`), the bounds are the same for
//! every stratum (computed on the whole population); the strata are taken in increasing id order
//! and the ids of each after the first are offset as CohortMethod does: by the previous
//! stratum's largest id + 1, unless that is 0.

use serde::Deserialize;

use super::{check_len, check_ps, quantile_type7};
use crate::error::{Error, Result};

/// Where the bounds of the strata are computed (CohortMethod's `baseSelection`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum BaseSelection {
    /// All subjects (the default; estimand "ate").
    #[default]
    All,
    /// Target subjects ("att").
    Target,
    /// Comparator subjects ("atu").
    Comparator,
}

/// Settings of [`stratify_by_ps`].
///
/// | key | default | meaning |
/// |---|---|---|
/// | `number_of_strata` | 5 | ≥ 1 |
/// | `base_selection` | `all` | `all`, `target` or `comparator` |
#[derive(Debug, Clone, Copy, PartialEq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct StratifySettings {
    /// Number of strata.
    pub number_of_strata: usize,
    /// Base selection of the bounds.
    pub base_selection: BaseSelection,
}

impl Default for StratifySettings {
    fn default() -> Self {
        StratifySettings {
            number_of_strata: 5,
            base_selection: BaseSelection::All,
        }
    }
}

impl StratifySettings {
    /// Validate.
    pub fn check(&self) -> Result<()> {
        if self.number_of_strata == 0 {
            return Err(Error::option("number_of_strata", "must be ≥ 1"));
        }
        Ok(())
    }
}

/// Result of [`stratify_by_ps`].
#[derive(Debug, Clone, PartialEq)]
pub struct Stratification {
    /// Stratum id of every subject (input order).
    pub stratum_id: Vec<i64>,
    /// The inner bounds `q_1 … q_{K−1}` (distinct; CohortMethod's `attr(population, "strata")`).
    pub bounds: Vec<f64>,
    /// Strata created (per additional stratum): fewer than asked when bounds coincide.
    pub n_strata: usize,
}

/// Stratify subjects into quantile strata of the propensity score (see the module
/// documentation). `strata`, when given, holds additional strata to cross with.
pub fn stratify_by_ps(
    treatment: &[bool],
    propensity_score: &[f64],
    strata: Option<&[i64]>,
    settings: &StratifySettings,
) -> Result<Stratification> {
    settings.check()?;
    let n = treatment.len();
    check_len("propensity_score", propensity_score.len(), n)?;
    check_ps(propensity_score)?;
    if let Some(s) = strata {
        check_len("strata", s.len(), n)?;
    }
    let mut base: Vec<f64> = (0..n)
        .filter(|&i| match settings.base_selection {
            BaseSelection::All => true,
            BaseSelection::Target => treatment[i],
            BaseSelection::Comparator => !treatment[i],
        })
        .map(|i| propensity_score[i])
        .collect();
    base.sort_unstable_by(f64::total_cmp);
    let k = settings.number_of_strata;
    let mut bounds: Vec<f64> = if base.is_empty() {
        Vec::new()
    } else {
        (1..k)
            .map(|j| quantile_type7(&base, j as f64 / k as f64))
            .collect()
    };
    bounds.dedup();
    // breaks = unique(c(0, bounds, 1)), first set to −1.
    let mut breaks = vec![0.0];
    breaks.extend(&bounds);
    breaks.push(1.0);
    let mut unique: Vec<f64> = Vec::with_capacity(breaks.len());
    for b in breaks {
        if !unique.contains(&b) {
            unique.push(b);
        }
    }
    unique[0] = -1.0;
    let n_strata = unique.len() - 1;
    // Stratum of p: the smallest k ≥ 1 with p ≤ b_k.
    let inner = &unique[1..unique.len() - 1];
    let stratum_of = |p: f64| 1 + inner.partition_point(|&b| b < p) as i64;
    let mut stratum_id: Vec<i64> = propensity_score.iter().map(|&p| stratum_of(p)).collect();
    if let Some(extra) = strata {
        let mut by_group: Vec<usize> = (0..n).collect();
        by_group.sort_by_key(|&i| (extra[i], i));
        let mut max_id = 0i64;
        for members in by_group.chunk_by(|&a, &b| extra[a] == extra[b]) {
            if max_id != 0 {
                for &i in members {
                    stratum_id[i] += max_id + 1;
                }
            }
            max_id = members
                .iter()
                .map(|&i| stratum_id[i])
                .max()
                .unwrap_or(max_id);
        }
    }
    Ok(Stratification {
        stratum_id,
        bounds,
        n_strata,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::rng::Rng;

    #[test]
    fn equal_size_strata() {
        // 100 distinct scores, 5 strata on all: 20 per stratum.
        let ps: Vec<f64> = (0..100).map(|i| (i as f64 + 0.5) / 100.0).collect();
        let t: Vec<bool> = (0..100).map(|i| i % 3 == 0).collect();
        let s = stratify_by_ps(&t, &ps, None, &StratifySettings::default()).unwrap();
        assert_eq!(s.n_strata, 5);
        for k in 1..=5 {
            assert_eq!(s.stratum_id.iter().filter(|&&x| x == k).count(), 20);
        }
        // Monotone in the score.
        assert!(s.stratum_id.windows(2).all(|w| w[0] <= w[1]));
    }

    #[test]
    fn target_base_and_ties() {
        // Target scores 0.1 0.2 0.3 0.4; 2 strata on target: bound = median 0.25.
        let t = [true, true, true, true, false, false];
        let ps = [0.1, 0.2, 0.3, 0.4, 0.25, 0.9];
        let s = StratifySettings {
            number_of_strata: 2,
            base_selection: BaseSelection::Target,
        };
        let r = stratify_by_ps(&t, &ps, None, &s).unwrap();
        assert_eq!(r.bounds, vec![0.25]);
        // Right-closed: 0.25 is in stratum 1.
        assert_eq!(r.stratum_id, vec![1, 1, 2, 2, 1, 2]);
        // All scores equal: one stratum.
        let r = stratify_by_ps(&t, &[0.5; 6], None, &StratifySettings::default()).unwrap();
        assert_eq!(r.n_strata, 2);
        assert!(r.stratum_id.iter().all(|&x| x == 1));
        // A score of 0 lands in the first stratum.
        let r = stratify_by_ps(
            &[true, false],
            &[0.0, 1.0],
            None,
            &StratifySettings::default(),
        );
        assert_eq!(r.unwrap().stratum_id[0], 1);
    }

    #[test]
    fn extra_strata_offset_as_cohort_method() {
        let t = [true, false, true, false];
        let ps = [0.1, 0.9, 0.1, 0.9];
        let s = StratifySettings {
            number_of_strata: 2,
            ..Default::default()
        };
        let r = stratify_by_ps(&t, &ps, Some(&[7, 7, 3, 3]), &s).unwrap();
        // Group 3 first: ids 1, 2; group 7 offset by 2 + 1: ids 4, 5.
        assert_eq!(r.stratum_id, vec![4, 5, 1, 2]);
    }

    #[test]
    fn randomized_against_counting() {
        let mut rng = Rng::new(23);
        for _ in 0..50 {
            let n = 1 + rng.int_range(0, 80) as usize;
            let t: Vec<bool> = (0..n).map(|_| rng.bernoulli(0.5)).collect();
            let ps: Vec<f64> = (0..n).map(|_| rng.uniform()).collect();
            let k = 1 + rng.int_range(0, 8) as usize;
            let s = StratifySettings {
                number_of_strata: k,
                base_selection: BaseSelection::All,
            };
            let r = stratify_by_ps(&t, &ps, None, &s).unwrap();
            // Slow reference: subject i's stratum = 1 + number of distinct bounds below its
            // score; with distinct scores and base = all, sizes differ by at most 1 + 1.
            for (i, &p) in ps.iter().enumerate() {
                let below = r.bounds.iter().filter(|&&b| b < p).count() as i64;
                assert_eq!(r.stratum_id[i], 1 + below);
            }
            if n >= k {
                let sizes: Vec<usize> = (1..=r.n_strata as i64)
                    .map(|id| r.stratum_id.iter().filter(|&&x| x == id).count())
                    .collect();
                let (lo, hi) = (sizes.iter().min().unwrap(), sizes.iter().max().unwrap());
                assert!(hi - lo <= 2, "{sizes:?}");
            }
        }
        assert!(StratifySettings {
            number_of_strata: 0,
            ..Default::default()
        }
        .check()
        .is_err());
        let s: StratifySettings = serde_json::from_str(r#"{"base_selection": "target"}"#).unwrap();
        assert_eq!(s.base_selection, BaseSelection::Target);
        assert!(serde_json::from_str::<StratifySettings>(r#"{"strata": 3}"#).is_err());
    }
}
