//! Covariate balance before and after propensity-score adjustment: CohortMethod's
//! `computeCovariateBalance` (and its `computeMeansPerGroup`).
//!
//! # Definitions (per covariate, absent entries are 0)
//!
//! **Unweighted** (the population before adjustment; after adjustment by 1:1 matching, i.e.
//! strata all of size 1 per arm; or no adjustment), with `n_a` subjects in arm `a`, `N` in all:
//! `mean_a = Σ x / n_a`, `sd_a = √((Σ x² − (Σ x)²/n_a) / n_a)` (denominator `n_a`).
//!
//! **Weighted** (strata or matched sets with some arm of some stratum holding more than one
//! subject, or IPTW): subject weights `w` — `1/n_{s,a}` (the subject's stratum-and-arm size) for
//! strata, the IPTW otherwise — normalized to sum to 1 within each arm;
//! `mean_a = Σ w x`, `sd_a = √(|Σ w x² − mean_a²| / (1 − Σ_arm w²))`. For strata this is the
//! stratum-weighted mean of Austin (2008): every stratum counts the same in each arm.
//!
//! **Standardized difference of means**: `(mean_T − mean_C) / √((sd_T² + sd_C²)/2)`.
//!
//! **Across both arms** ([`GroupStats::mean`], [`GroupStats::sd`]): overall weights (`1/N`,
//! `1/n_s` for strata, the IPTW) normalized over everyone, `mean = Σ w x`,
//! `sd = √(|Σ w x² − mean²| / (1 − S))`.
//!
//! **Variance of the SDM** ([`GroupStats::sdm_variance`]): unweighted
//! `(n_T + n_C)/(n_T n_C) + d²/(2(n_T + n_C − 2))`; strata
//! `Σ_{s,a} (v_{s,a}/n_{s,a})(N_s/N)² / sd_pooled²` with `v_{s,a}` the (n − 1) variance of the
//! stratum-arm (0 for a single subject); IPTW `Σ_i w_i²(x_i − mean_a)² / sd_pooled²`.
//!
//! **Generalizability** ([`CovariateBalance::target_std_diff`] …): the target (comparator)
//! before vs after adjustment, `(mean_before − mean_after)/√((sd_before² + sd_after²)/2)`, and
//! the whole population before vs after, `(mean_before − mean_after)/sd_before`.
//!
//! A covariate with no entry in a population has no statistics for it (`None`; CohortMethod's
//! `NA`), and the differences involving it are NaN. Standardized differences can be ±∞ (both
//! standard deviations 0, different means) or NaN (0/0) exactly as in R; the maxima
//! ([`Balance::max_abs_std_diff_after`] …) skip NaN (R's `na.rm = TRUE`) and keep ∞.
//!
//! # Quirks of CohortMethod kept for parity
//!
//! * `S` of the across-arm SD is, unweighted, `(number of subjects with an entry)/N²` (the sum
//!   of `1/N²` over the covariate's entries, not over all subjects), and weighted, `Σ w²` over
//!   all subjects **times the number of arms in which the covariate has an entry**.
//! * The IPTW variance of the SDM sums over the subjects with an entry only.
//! * The whole-population generalizability difference divides by `√((sd_before² +
//!   sd_before²)/2)` (the before SD twice).
//!
//! These only affect the across-arm SD, the SDM variance and the whole-population
//! generalizability difference; means, arm SDs and the SDM itself are the textbook ones.
//!
//! # Cost
//!
//! O(n + nnz) per population (plus sorting each covariate's entries by stratum for the strata
//! variance), covariates in parallel (rayon; results do not depend on the thread count). No
//! dense n × p matrix is formed.
//!
//! Reference: Austin PC. Assessing balance in measured baseline covariates when using
//! many-to-one matching on the propensity-score. *Pharmacoepidemiol Drug Saf*
//! 2008;17:1218–1225.

use rayon::prelude::*;

use super::{check_len, SparseCovariates};
use crate::error::{Error, Result};

/// How the population after adjustment is weighted.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Adjustment<'a> {
    /// No weighting (e.g. after trimming only).
    None,
    /// Matched sets or strata: the stratum id of each kept subject (parallel to `kept`).
    Strata(&'a [i64]),
    /// Inverse probability of treatment weights of each kept subject (parallel to `kept`).
    Iptw(&'a [f64]),
}

/// The population after adjustment: a subset of the subjects, with its weighting.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct AdjustedPopulation<'a> {
    /// Kept subjects, strictly increasing indices into the population before adjustment.
    pub kept: &'a [usize],
    /// The weighting.
    pub adjustment: Adjustment<'a>,
}

/// One covariate's statistics in one population (CohortMethod's columns in brackets, prefixed
/// `beforeMatching` / `afterMatching`).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct GroupStats {
    /// (Weighted) mean in the target arm (`MeanTarget`).
    pub mean_target: f64,
    /// (Weighted) mean in the comparator arm (`MeanComparator`).
    pub mean_comparator: f64,
    /// Unweighted sum in the target arm (`SumTarget`).
    pub sum_target: f64,
    /// Unweighted sum in the comparator arm (`SumComparator`).
    pub sum_comparator: f64,
    /// SD in the target arm (`SdTarget`).
    pub sd_target: f64,
    /// SD in the comparator arm (`SdComparator`).
    pub sd_comparator: f64,
    /// Mean across both arms (`Mean`).
    pub mean: f64,
    /// SD across both arms (`Sd`).
    pub sd: f64,
    /// Standardized difference of means (`StdDiff`).
    pub std_diff: f64,
    /// Variance of the standardized difference (`SdmVariance`).
    pub sdm_variance: f64,
}

/// One covariate's balance.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct CovariateBalance {
    /// Covariate id.
    pub covariate_id: i64,
    /// Before adjustment (`None`: no entry in that population).
    pub before: Option<GroupStats>,
    /// After adjustment.
    pub after: Option<GroupStats>,
    /// Target before vs after (`targetStdDiff`).
    pub target_std_diff: f64,
    /// Comparator before vs after (`comparatorStdDiff`).
    pub comparator_std_diff: f64,
    /// Whole population before vs after (`targetComparatorStdDiff`).
    pub target_comparator_std_diff: f64,
}

/// Result of [`covariate_balance`].
#[derive(Debug, Clone, PartialEq)]
pub struct Balance {
    /// One entry per covariate, in the covariates' column order.
    pub covariates: Vec<CovariateBalance>,
    /// max |SDM| before adjustment (NaN skipped; `None` when there is none).
    pub max_abs_std_diff_before: Option<f64>,
    /// max |SDM| after adjustment: the balance diagnostic's `maxSdm`.
    pub max_abs_std_diff_after: Option<f64>,
    /// max |target_std_diff| (generalizability for "att").
    pub max_abs_target_std_diff: Option<f64>,
    /// max |comparator_std_diff| (generalizability for "atu").
    pub max_abs_comparator_std_diff: Option<f64>,
    /// max |target_comparator_std_diff| (generalizability otherwise).
    pub max_abs_target_comparator_std_diff: Option<f64>,
}

/// Strata of a weighted population.
struct StrataInfo {
    /// Dense stratum index per position.
    index: Vec<u32>,
    /// Subjects per (stratum, arm): `[comparator, target]`.
    size: Vec<[f64; 2]>,
    /// Subjects in all.
    total: f64,
}

enum Mode {
    Plain {
        n: [f64; 2],
        total: f64,
    },
    Weighted {
        /// Per-arm normalized weight per position.
        w: Vec<f64>,
        /// Overall normalized weight per position.
        overall_w: Vec<f64>,
        sum_w_sqr: [f64; 2],
        overall_sum_w_sqr: f64,
        strata: Option<StrataInfo>,
    },
}

/// A population prepared for the per-covariate pass.
struct Population {
    /// Position in the population of each covariate row, or `u32::MAX`.
    position: Vec<u32>,
    /// Arm per position (1 = target).
    arm: Vec<u8>,
    mode: Mode,
}

impl Population {
    fn new(
        treatment: &[bool],
        n_rows: usize,
        kept: Option<&[usize]>,
        adjustment: Adjustment<'_>,
    ) -> Result<Self> {
        let all: Vec<usize>;
        let kept = match kept {
            Some(k) => k,
            None => {
                all = (0..n_rows).collect();
                &all
            }
        };
        if kept.windows(2).any(|w| w[1] <= w[0]) || kept.last().is_some_and(|&k| k >= n_rows) {
            return Err(Error::option(
                "kept",
                "must be strictly increasing subject indices below the number of subjects",
            ));
        }
        let mut position = vec![u32::MAX; n_rows];
        for (p, &i) in kept.iter().enumerate() {
            position[i] = p as u32;
        }
        let arm: Vec<u8> = kept.iter().map(|&i| u8::from(treatment[i])).collect();
        let m = kept.len();
        let mut n = [0.0f64; 2];
        for &a in &arm {
            n[a as usize] += 1.0;
        }
        let plain = Mode::Plain { n, total: m as f64 };
        let mode = match adjustment {
            Adjustment::None => plain,
            Adjustment::Strata(ids) => {
                check_len("stratum_id", ids.len(), m)?;
                let mut sorted: Vec<i64> = ids.to_vec();
                sorted.sort_unstable();
                sorted.dedup();
                let index: Vec<u32> = ids
                    .iter()
                    .map(|id| sorted.partition_point(|s| s < id) as u32)
                    .collect();
                let mut size = vec![[0.0f64; 2]; sorted.len()];
                for (p, &s) in index.iter().enumerate() {
                    size[s as usize][arm[p] as usize] += 1.0;
                }
                if size.iter().all(|s| s[0] <= 1.0 && s[1] <= 1.0) {
                    plain
                } else {
                    let w: Vec<f64> = (0..m)
                        .map(|p| 1.0 / size[index[p] as usize][arm[p] as usize])
                        .collect();
                    let overall: Vec<f64> = (0..m)
                        .map(|p| {
                            let s = size[index[p] as usize];
                            1.0 / (s[0] + s[1])
                        })
                        .collect();
                    let strata = StrataInfo {
                        index,
                        size,
                        total: m as f64,
                    };
                    weighted(&arm, w, overall, Some(strata))?
                }
            }
            Adjustment::Iptw(iptw) => {
                check_len("iptw", iptw.len(), m)?;
                if let Some(k) = iptw.iter().position(|w| !(w.is_finite() && *w >= 0.0)) {
                    return Err(Error::option(
                        "iptw",
                        format!("element {k} is {}: weights must be finite and ≥ 0", iptw[k]),
                    ));
                }
                weighted(&arm, iptw.to_vec(), iptw.to_vec(), None)?
            }
        };
        Ok(Population {
            position,
            arm,
            mode,
        })
    }

    /// Statistics of covariate `j` (`None`: no entry in this population).
    fn stats(&self, x: &SparseCovariates, j: usize) -> Option<GroupStats> {
        let mut raw = [0.0f64; 2];
        let mut raw_sq = [0.0f64; 2];
        let mut count = [0usize; 2];
        let mut wm = [0.0f64; 2];
        let mut wsq = [0.0f64; 2];
        let (mut om, mut osq) = (0.0f64, 0.0f64);
        let mut strata_entries: Vec<(u32, f64)> = Vec::new();
        for (r, v) in x.column(j) {
            let p = self.position[r];
            if p == u32::MAX {
                continue;
            }
            let p = p as usize;
            let a = self.arm[p] as usize;
            raw[a] += v;
            raw_sq[a] += v * v;
            count[a] += 1;
            if let Mode::Weighted {
                w,
                overall_w,
                strata,
                ..
            } = &self.mode
            {
                wm[a] += w[p] * v;
                wsq[a] += w[p] * v * v;
                om += overall_w[p] * v;
                osq += overall_w[p] * v * v;
                if let Some(s) = strata {
                    strata_entries.push((s.index[p] * 2 + a as u32, v));
                }
            }
        }
        if count[0] + count[1] == 0 {
            return None;
        }
        let pooled = |sd_t: f64, sd_c: f64| ((sd_t * sd_t + sd_c * sd_c) / 2.0).sqrt();
        match &self.mode {
            Mode::Plain { n, total } => {
                let arm_stats = |a: usize| {
                    if n[a] == 0.0 {
                        (0.0, 0.0)
                    } else {
                        let sd = ((raw_sq[a] - raw[a] * raw[a] / n[a]) / n[a])
                            .max(0.0)
                            .sqrt();
                        (raw[a] / n[a], sd)
                    }
                };
                let (mean_c, sd_c) = arm_stats(0);
                let (mean_t, sd_t) = arm_stats(1);
                let mean = (raw[0] + raw[1]) / total;
                let overall_sum_sqr = (raw_sq[0] + raw_sq[1]) / total;
                let overall_sum_w_sqr = (count[0] + count[1]) as f64 / (total * total);
                let sd = ((overall_sum_sqr - mean * mean).abs() / (1.0 - overall_sum_w_sqr)).sqrt();
                let d = (mean_t - mean_c) / pooled(sd_t, sd_c);
                let (n1, n0) = (n[1], n[0]);
                let sdm_variance = (n1 + n0) / (n1 * n0) + d * d / (2.0 * (n1 + n0 - 2.0));
                Some(GroupStats {
                    mean_target: mean_t,
                    mean_comparator: mean_c,
                    sum_target: raw[1],
                    sum_comparator: raw[0],
                    sd_target: sd_t,
                    sd_comparator: sd_c,
                    mean,
                    sd,
                    std_diff: d,
                    sdm_variance,
                })
            }
            Mode::Weighted {
                w,
                sum_w_sqr,
                overall_sum_w_sqr,
                strata,
                ..
            } => {
                let sd_arm =
                    |a: usize| ((wsq[a] - wm[a] * wm[a]).abs() / (1.0 - sum_w_sqr[a])).sqrt();
                let (sd_c, sd_t) = (sd_arm(0), sd_arm(1));
                let arms_present = (count[0] > 0) as u8 + (count[1] > 0) as u8;
                let s = overall_sum_w_sqr * arms_present as f64;
                let sd = ((osq - om * om).abs() / (1.0 - s)).sqrt();
                let denominator = pooled(sd_t, sd_c);
                let d = (wm[1] - wm[0]) / denominator;
                let numerator = match strata {
                    Some(info) => {
                        strata_entries.sort_unstable_by_key(|e| e.0);
                        let mut num = 0.0f64;
                        for g in strata_entries.chunk_by(|a, b| a.0 == b.0) {
                            let key = g[0].0;
                            let (s, a) = ((key / 2) as usize, (key % 2) as usize);
                            let n = info.size[s][a];
                            if n <= 1.0 {
                                continue;
                            }
                            let sx: f64 = g.iter().map(|e| e.1).sum();
                            let sxx: f64 = g.iter().map(|e| e.1 * e.1).sum();
                            let var = (sxx - sx * sx / n) / (n - 1.0);
                            let share = (info.size[s][0] + info.size[s][1]) / info.total;
                            num += var / n * share * share;
                        }
                        num
                    }
                    None => {
                        let mut num = 0.0f64;
                        for (r, v) in x.column(j) {
                            let p = self.position[r];
                            if p == u32::MAX {
                                continue;
                            }
                            let p = p as usize;
                            let a = self.arm[p] as usize;
                            num += w[p] * w[p] * (v - wm[a]) * (v - wm[a]);
                        }
                        num
                    }
                };
                Some(GroupStats {
                    mean_target: wm[1],
                    mean_comparator: wm[0],
                    sum_target: raw[1],
                    sum_comparator: raw[0],
                    sd_target: sd_t,
                    sd_comparator: sd_c,
                    mean: om,
                    sd,
                    std_diff: d,
                    sdm_variance: numerator / (denominator * denominator),
                })
            }
        }
    }
}

/// A weighted mode: normalize `w` per arm and `overall` over everyone.
fn weighted(
    arm: &[u8],
    mut w: Vec<f64>,
    mut overall: Vec<f64>,
    strata: Option<StrataInfo>,
) -> Result<Mode> {
    let mut sum = [0.0f64; 2];
    for (p, &a) in arm.iter().enumerate() {
        sum[a as usize] += w[p];
    }
    let total: f64 = overall.iter().sum();
    for (a, name) in [(0, "comparator"), (1, "target")] {
        let present = arm.iter().any(|&x| x as usize == a);
        if present && !(sum[a].is_finite() && sum[a] > 0.0) {
            return Err(Error::option(
                "iptw",
                format!("the {name} arm's weights sum to 0"),
            ));
        }
    }
    let mut sum_w_sqr = [0.0f64; 2];
    for (p, &a) in arm.iter().enumerate() {
        w[p] /= sum[a as usize];
        sum_w_sqr[a as usize] += w[p] * w[p];
    }
    let mut overall_sum_w_sqr = 0.0f64;
    for o in &mut overall {
        *o /= total;
        overall_sum_w_sqr += *o * *o;
    }
    Ok(Mode::Weighted {
        w,
        overall_w: overall,
        sum_w_sqr,
        overall_sum_w_sqr,
        strata,
    })
}

/// CohortMethod's `computeMeansPerGroup`: every covariate's statistics in one population —
/// the subjects `kept` (all when `None`), weighted by `adjustment` (parallel to `kept`).
pub fn covariate_means(
    treatment: &[bool],
    covariates: &SparseCovariates,
    kept: Option<&[usize]>,
    adjustment: Adjustment<'_>,
) -> Result<Vec<Option<GroupStats>>> {
    check_len("treatment", treatment.len(), covariates.n_rows())?;
    if kept.is_none() && adjustment != Adjustment::None {
        let m = match adjustment {
            Adjustment::Strata(s) => s.len(),
            Adjustment::Iptw(w) => w.len(),
            Adjustment::None => 0,
        };
        check_len("adjustment", m, treatment.len())?;
    }
    let pop = Population::new(treatment, covariates.n_rows(), kept, adjustment)?;
    Ok((0..covariates.n_covariates())
        .into_par_iter()
        .map(|j| pop.stats(covariates, j))
        .collect())
}

fn max_abs(values: impl Iterator<Item = f64>) -> Option<f64> {
    values
        .filter(|v| !v.is_nan())
        .map(f64::abs)
        .fold(None, |m, v| Some(m.map_or(v, |m: f64| m.max(v))))
}

/// Covariate balance of every covariate before adjustment (all subjects, unweighted) and after
/// (`after`); see the module documentation.
pub fn covariate_balance(
    treatment: &[bool],
    covariates: &SparseCovariates,
    after: &AdjustedPopulation<'_>,
) -> Result<Balance> {
    let before = covariate_means(treatment, covariates, None, Adjustment::None)?;
    let adjusted = covariate_means(treatment, covariates, Some(after.kept), after.adjustment)?;
    let diff = |mb: f64, sb: f64, ma: f64, sa: f64| (mb - ma) / ((sb * sb + sa * sa) / 2.0).sqrt();
    let rows: Vec<CovariateBalance> = before
        .iter()
        .zip(&adjusted)
        .enumerate()
        .map(|(j, (b, a))| {
            let (t, c, tc) = match (b, a) {
                (Some(b), Some(a)) => (
                    diff(b.mean_target, b.sd_target, a.mean_target, a.sd_target),
                    diff(
                        b.mean_comparator,
                        b.sd_comparator,
                        a.mean_comparator,
                        a.sd_comparator,
                    ),
                    diff(b.mean, b.sd, a.mean, b.sd),
                ),
                _ => (f64::NAN, f64::NAN, f64::NAN),
            };
            CovariateBalance {
                covariate_id: covariates.ids()[j],
                before: *b,
                after: *a,
                target_std_diff: t,
                comparator_std_diff: c,
                target_comparator_std_diff: tc,
            }
        })
        .collect();
    Ok(Balance {
        max_abs_std_diff_before: max_abs(rows.iter().filter_map(|r| r.before.map(|s| s.std_diff))),
        max_abs_std_diff_after: max_abs(rows.iter().filter_map(|r| r.after.map(|s| s.std_diff))),
        max_abs_target_std_diff: max_abs(rows.iter().map(|r| r.target_std_diff)),
        max_abs_comparator_std_diff: max_abs(rows.iter().map(|r| r.comparator_std_diff)),
        max_abs_target_comparator_std_diff: max_abs(
            rows.iter().map(|r| r.target_comparator_std_diff),
        ),
        covariates: rows,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::rng::Rng;

    fn close(a: f64, b: f64) -> bool {
        (a - b).abs() <= 1e-10 * (1.0 + a.abs().max(b.abs()))
            || (a.is_nan() && b.is_nan())
            || a == b
    }

    #[test]
    fn unweighted_hand_checked() {
        // Target 4 subjects, covariate present in 2 → mean 0.5, sd √(0.25) = 0.5;
        // comparator 4 subjects, present in 1 → 0.25, sd √(3/16).
        let t = [true, true, true, true, false, false, false, false];
        let x =
            SparseCovariates::from_triplets(8, &[(0, 1, 1.0), (1, 1, 1.0), (4, 1, 1.0)]).unwrap();
        let m = covariate_means(&t, &x, None, Adjustment::None).unwrap();
        let s = m[0].unwrap();
        assert!(close(s.mean_target, 0.5) && close(s.mean_comparator, 0.25));
        assert!(close(s.sd_target, 0.5) && close(s.sd_comparator, (3.0f64 / 16.0).sqrt()));
        let d = 0.25 / ((0.25 + 3.0 / 16.0) / 2.0f64).sqrt();
        assert!(close(s.std_diff, d));
        assert!(close(s.sdm_variance, 8.0 / 16.0 + d * d / 12.0));
        assert!(close(s.mean, 3.0 / 8.0));
        // CohortMethod's across-arm SD: √(|3/8 − 9/64| / (1 − 3/64)).
        assert!(close(
            s.sd,
            ((3.0 / 8.0 - 9.0 / 64.0) / (1.0 - 3.0 / 64.0f64)).sqrt()
        ));
        assert_eq!((s.sum_target, s.sum_comparator), (2.0, 1.0));
    }

    #[test]
    fn strata_weights_are_stratum_weighted_means() {
        // Stratum A: 1 target (x = 1), 3 comparators (x = 1, 0, 0).
        // Stratum B: 1 target (x = 0), 1 comparator (x = 0).
        // Stratum-weighted comparator mean: (1/3·1 + 0)/2 = 1/6; target mean (1 + 0)/2 = 1/2.
        let t = [true, false, false, false, true, false];
        let x = SparseCovariates::from_triplets(6, &[(0, 9, 1.0), (1, 9, 1.0)]).unwrap();
        let kept: Vec<usize> = (0..6).collect();
        let ids = [0, 0, 0, 0, 1, 1];
        let m = covariate_means(&t, &x, Some(&kept), Adjustment::Strata(&ids)).unwrap();
        let s = m[0].unwrap();
        assert!(close(s.mean_target, 0.5));
        assert!(close(s.mean_comparator, 1.0 / 6.0));
        // Comparator normalized weights 1/6, 1/6, 1/6, 1/2: Σw² = 3/36 + 1/4 = 1/3.
        let sd_c = ((1.0 / 6.0 - 1.0 / 36.0) / (1.0 - 1.0 / 3.0f64)).sqrt();
        assert!(close(s.sd_comparator, sd_c), "{} {sd_c}", s.sd_comparator);
        // 1:1 strata are unweighted.
        let ids = [0, 0, 1, 2, 1, 2];
        let kept = [0, 1, 4, 5];
        let ids = &ids[..4];
        let m = covariate_means(&t, &x, Some(&kept), Adjustment::Strata(ids)).unwrap();
        let plain = covariate_means(&t, &x, Some(&kept), Adjustment::None).unwrap();
        assert_eq!(m, plain);
    }

    /// Slow reference of one population: dense vectors, textbook weighted formulas.
    fn dense_stats(x: &[f64], t: &[bool], w: &[f64]) -> (f64, f64, f64, f64, f64) {
        let arm = |a: bool| {
            let sw: f64 = (0..x.len()).filter(|&i| t[i] == a).map(|i| w[i]).sum();
            let mean: f64 = (0..x.len())
                .filter(|&i| t[i] == a)
                .map(|i| w[i] * x[i])
                .sum::<f64>()
                / sw;
            let sw2: f64 = (0..x.len())
                .filter(|&i| t[i] == a)
                .map(|i| (w[i] / sw).powi(2))
                .sum();
            let var: f64 = (0..x.len())
                .filter(|&i| t[i] == a)
                .map(|i| w[i] / sw * (x[i] - mean).powi(2))
                .sum::<f64>()
                / (1.0 - sw2);
            (mean, var.sqrt())
        };
        let (mt, st) = arm(true);
        let (mc, sc) = arm(false);
        (
            mt,
            mc,
            st,
            sc,
            (mt - mc) / ((st * st + sc * sc) / 2.0).sqrt(),
        )
    }

    #[test]
    fn randomized_iptw_and_strata_against_dense_reference() {
        let mut rng = Rng::new(31);
        for case in 0..40 {
            let n = 10 + rng.int_range(0, 60) as usize;
            let mut t: Vec<bool> = (0..n).map(|_| rng.bernoulli(0.4)).collect();
            t[0] = true;
            t[1] = false;
            t[2] = true;
            t[3] = false;
            let mut entries = Vec::new();
            for i in 0..n {
                if rng.bernoulli(0.4) {
                    entries.push((i as u32, 1, 1.0));
                }
                if rng.bernoulli(0.5) {
                    entries.push((i as u32, 2, rng.uniform_range(-3.0, 3.0)));
                }
            }
            entries.push((0, 1, 1.0));
            entries.retain(|e| !(e.0 == 0 && e.1 == 1) || e.2 == 1.0);
            entries.sort_by_key(|e| (e.0, e.1));
            entries.dedup_by_key(|e| (e.0, e.1));
            let x = SparseCovariates::from_triplets(n, &entries).unwrap();
            let kept: Vec<usize> = (0..n).filter(|&i| i < 4 || rng.bernoulli(0.8)).collect();
            let kt: Vec<bool> = kept.iter().map(|&i| t[i]).collect();
            let (weights, adj_w, strata): (Vec<f64>, Vec<f64>, Option<Vec<i64>>) = if case % 2 == 0
            {
                let w: Vec<f64> = kept.iter().map(|_| 0.2 + 3.0 * rng.uniform()).collect();
                (w.clone(), w, None)
            } else {
                // Three strata; make one stratum-arm hold two subjects so weighting is on.
                let mut s: Vec<i64> = kept.iter().map(|_| rng.int_range(0, 3) as i64).collect();
                s[0] = 0;
                s[2] = 0;
                s[1] = 0;
                s[3] = 0;
                let mut size = std::collections::HashMap::new();
                for (p, &id) in s.iter().enumerate() {
                    *size.entry((id, kt[p])).or_insert(0.0) += 1.0;
                }
                let w: Vec<f64> = s
                    .iter()
                    .enumerate()
                    .map(|(p, &id)| 1.0 / size[&(id, kt[p])])
                    .collect();
                (w.clone(), w, Some(s))
            };
            let adj = match &strata {
                Some(s) => Adjustment::Strata(s),
                None => Adjustment::Iptw(&adj_w),
            };
            let got = covariate_means(&t, &x, Some(&kept), adj).unwrap();
            for (j, g) in got.iter().enumerate() {
                let mut dense = vec![0.0; n];
                for (r, v) in x.column(j) {
                    dense[r] = v;
                }
                let xk: Vec<f64> = kept.iter().map(|&i| dense[i]).collect();
                let (mt, mc, st, sc, d) = dense_stats(&xk, &kt, &weights);
                let Some(g) = g else { continue };
                assert!(
                    close(g.mean_target, mt),
                    "case {case}: {} {mt}",
                    g.mean_target
                );
                assert!(close(g.mean_comparator, mc), "case {case}");
                assert!(close(g.sd_target, st), "case {case}: {} {st}", g.sd_target);
                assert!(close(g.sd_comparator, sc), "case {case}");
                assert!(close(g.std_diff, d), "case {case}");
            }
        }
    }

    #[test]
    fn balance_before_after_and_maxima() {
        // Before: covariate 1 in 3 of 4 targets, 1 of 4 comparators. After matching
        // (0,4), (1,5): both arms 1 of 2 … covariate present in 0 and 4.
        let t = [true, true, true, true, false, false, false, false];
        let x = SparseCovariates::from_triplets(
            8,
            &[
                (0, 1, 1.0),
                (2, 1, 1.0),
                (3, 1, 1.0),
                (4, 1, 1.0),
                (6, 2, 1.0),
            ],
        )
        .unwrap();
        let kept = [0, 1, 4, 5];
        let ids = [0, 1, 0, 1];
        let b = covariate_balance(
            &t,
            &x,
            &AdjustedPopulation {
                kept: &kept,
                adjustment: Adjustment::Strata(&ids),
            },
        )
        .unwrap();
        let c1 = b.covariates[0];
        assert!(close(c1.after.unwrap().std_diff, 0.0));
        assert!(c1.before.unwrap().std_diff > 0.5);
        // Covariate 2 has no entry after matching: None and NaN differences.
        assert!(b.covariates[1].after.is_none());
        assert!(b.covariates[1].target_std_diff.is_nan());
        assert_eq!(b.max_abs_std_diff_after, Some(0.0));
        let before_max = b
            .covariates
            .iter()
            .map(|c| c.before.unwrap().std_diff.abs())
            .fold(0.0, f64::max);
        assert_eq!(b.max_abs_std_diff_before, Some(before_max));
        // Target before vs after: (0.75 − 0.5)/√((3/16 + 1/4)/2).
        let want = 0.25 / ((3.0 / 16.0 + 0.25) / 2.0f64).sqrt();
        assert!(close(c1.target_std_diff, want));
    }

    /// Scale check (run with `--release --ignored`): 1,000,000 subjects × 10,000 sparse 0/1
    /// covariates (≈ 20 per subject, 20M entries), strata of 5; prints the time.
    #[test]
    #[ignore = "scale check (1,000,000 × 10,000, 20M entries): opt-in, run with --release"]
    fn scale_one_million_by_ten_thousand() {
        let (n, p, per_subject) = (1_000_000usize, 10_000usize, 20usize);
        let mut rng = Rng::new(1);
        let t: Vec<bool> = (0..n).map(|_| rng.bernoulli(0.4)).collect();
        let mut cols: Vec<Vec<u32>> = vec![Vec::new(); p];
        for i in 0..n {
            for _ in 0..per_subject {
                cols[rng.int_range(0, p as u64 - 1) as usize].push(i as u32);
            }
        }
        let mut col_ptr = vec![0usize];
        let mut rows = Vec::new();
        for c in &mut cols {
            c.dedup();
            rows.extend_from_slice(c);
            col_ptr.push(rows.len());
        }
        let x = SparseCovariates::new(n, (0..p as i64).collect(), col_ptr, rows, None).unwrap();
        let kept: Vec<usize> = (0..n).collect();
        let strata: Vec<i64> = (0..n).map(|i| (i % 5) as i64).collect();
        let started = std::time::Instant::now();
        let b = covariate_balance(
            &t,
            &x,
            &AdjustedPopulation {
                kept: &kept,
                adjustment: Adjustment::Strata(&strata),
            },
        )
        .unwrap();
        eprintln!(
            "balance of {p} covariates × {n} subjects ({} entries): {:.2}s, max |SDM| after {:?}",
            x.nnz(),
            started.elapsed().as_secs_f64(),
            b.max_abs_std_diff_after
        );
        assert_eq!(b.covariates.len(), p);
    }

    #[test]
    fn bad_input() {
        let t = [true, false];
        let x = SparseCovariates::from_triplets(2, &[(0, 1, 1.0)]).unwrap();
        let after = |kept: &'static [usize], w: &'static [f64]| AdjustedPopulation {
            kept,
            adjustment: Adjustment::Iptw(w),
        };
        assert!(covariate_balance(&t, &x, &after(&[1, 0], &[1.0, 1.0])).is_err());
        assert!(covariate_balance(&t, &x, &after(&[0, 1], &[1.0])).is_err());
        assert!(covariate_balance(&t, &x, &after(&[0, 1], &[1.0, f64::NAN])).is_err());
        assert!(covariate_balance(&t, &x, &after(&[0, 1], &[1.0, 0.0])).is_err());
        assert!(covariate_balance(&[true], &x, &after(&[0], &[1.0])).is_err());
    }
}
