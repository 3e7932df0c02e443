//! Kaplan–Meier censoring weights for Fine–Gray.
//!
//! G(t) is the Kaplan–Meier estimate of the *censoring* distribution: a row with y = 0 is a
//! "censoring event", any failure (y = 1 or 2) counts as not censored. Ties follow `survfit`'s
//! usual convention, as `cmprsk::crr` and Cyclops' `getFineGrayWeights` use it (both run
//! `survfit(Surv(ftime, fstatus == cencode) ~ 1)`): failures at a censoring time c are still at
//! risk for censoring at c, so the number at risk is n_c = #{time ≥ c}:
//!
//! G(t) = Π_{c ≤ t} (1 − d_c / n_c),
//!
//! and the Fine–Gray weight of a row is G(T−) = Π_{c < T} (…) (crr evaluates G at
//! T·(1 − 100ε)), computed separately within each stratum (unweighted, as crr and Cyclops do).
//!
//! R `survival::finegray` places censorings tied with failures *after* them instead
//! (n_c = #{time > c} + d_c); the two differ only where a censoring time equals a failure time
//! (common with times in days or months). Its weights can be supplied as the `censor_weight`
//! column.

/// G(T_i−) for every row (same order as the input), Kaplan–Meier censoring survival just
/// before each row's time (`survfit`'s ties, module docs), computed within each stratum.
///
/// `time`, `y` and `stratum` must have the same length (a shorter `y`/`stratum` is treated as
/// censored / stratum 0 for the missing rows rather than panicking).
pub fn censoring_weights(time: &[f64], y: &[f64], stratum: &[u32]) -> Vec<f64> {
    let n = time.len();
    let stratum_of = |i: usize| stratum.get(i).copied().unwrap_or(0);
    let y_of = |i: usize| y.get(i).copied().unwrap_or(0.0);
    let mut order: Vec<usize> = (0..n).collect();
    order.sort_by(|&a, &b| {
        stratum_of(a)
            .cmp(&stratum_of(b))
            .then(time[a].total_cmp(&time[b]))
            .then(a.cmp(&b))
    });
    let mut out = vec![1.0; n];
    let mut i = 0;
    while i < n {
        // One stratum: order[i..end].
        let s = stratum_of(order[i]);
        let mut end = i;
        while end < n && stratum_of(order[end]) == s {
            end += 1;
        }
        let mut at_risk = (end - i) as f64;
        let mut g = 1.0f64;
        let mut k = i;
        while k < end {
            let t = time[order[k]];
            let mut block_end = k;
            let mut censored = 0.0f64;
            while block_end < end && time[order[block_end]] == t {
                let r = order[block_end];
                out[r] = g;
                if y_of(r) == 0.0 {
                    censored += 1.0;
                }
                block_end += 1;
            }
            // Every row with time ≥ t is at risk for the censorings at t (the failures at t
            // too: `survfit`'s convention).
            if censored > 0.0 {
                g *= 1.0 - censored / at_risk;
            }
            at_risk -= (block_end - k) as f64;
            k = block_end;
        }
        i = end;
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// survival's `finegray` test data (`/work/shared/data/reference/finegray_fdata.csv`).
    const FDATA: [(f64, f64); 14] = [
        (1.0, 1.0),
        (2.0, 2.0),
        (3.0, 0.0),
        (4.0, 1.0),
        (4.0, 0.0),
        (4.0, 0.0),
        (5.0, 2.0),
        (5.0, 1.0),
        (6.0, 0.0),
        (8.0, 0.0),
        (8.0, 2.0),
        (9.0, 0.0),
        (10.0, 1.0),
        (12.0, 0.0),
    ];

    /// `survfit(Surv(time, status == 0) ~ 1)` on FDATA: censorings at 3, 4 (two), 6, 8, 9, 12
    /// with 12, 11, 6, 5, 3, 1 rows at risk (time ≥ c: the failures at 4 and the competing
    /// event at 8 included), G = cumprod(11/12, 9/11, 5/6, 4/5, 2/3, 0). survival's
    /// `finegray` (censorings after tied failures) has 8/10 at 4 and 3/4 at 8 instead.
    fn expected_g_minus(t: f64) -> f64 {
        let steps = [
            (3.0, 11.0 / 12.0),
            (4.0, 9.0 / 11.0),
            (6.0, 5.0 / 6.0),
            (8.0, 4.0 / 5.0),
            (9.0, 2.0 / 3.0),
            (12.0, 0.0),
        ];
        steps
            .iter()
            .filter(|(u, _)| *u < t)
            .map(|(_, f)| f)
            .product()
    }

    #[test]
    fn fdata_weights_match_survfit() {
        let time: Vec<f64> = FDATA.iter().map(|r| r.0).collect();
        let y: Vec<f64> = FDATA.iter().map(|r| r.1).collect();
        let g = censoring_weights(&time, &y, &[0; 14]);
        for (i, &t) in time.iter().enumerate() {
            assert!(
                (g[i] - expected_g_minus(t)).abs() < 1e-15,
                "row {i}: {} vs {}",
                g[i],
                expected_g_minus(t)
            );
        }
        // Order invariance.
        let mut rev_t = time.clone();
        let mut rev_y = y.clone();
        rev_t.reverse();
        rev_y.reverse();
        let mut g2 = censoring_weights(&rev_t, &rev_y, &[0; 14]);
        g2.reverse();
        assert_eq!(g, g2);
    }

    #[test]
    fn strata_are_separate() {
        let time: Vec<f64> = FDATA
            .iter()
            .map(|r| r.0)
            .chain(FDATA.iter().map(|r| r.0 * 2.0))
            .collect();
        let y: Vec<f64> = FDATA
            .iter()
            .map(|r| r.1)
            .chain(FDATA.iter().map(|r| r.1))
            .collect();
        let s: Vec<u32> = (0..28).map(|i| u32::from(i >= 14)).collect();
        let g = censoring_weights(&time, &y, &s);
        for i in 0..14 {
            assert_eq!(g[i], g[i + 14]);
            assert!((g[i] - expected_g_minus(time[i])).abs() < 1e-15);
        }
    }
}
