//! Kaplan–Meier censoring weights for Fine–Gray.
//!
//! G(t) is the Kaplan–Meier estimate of the *censoring* distribution: a row with y = 0 is a
//! "censoring event", any failure (y = 1 or 2) counts as not censored. At a tied time the
//! censorings are placed after the failures, so the number at risk for the censorings at t is
//! #{time ≥ t} − #{failures at t}:
//!
//! G(t) = Π_{u ≤ t} (1 − c_u / (n_u − d_u)),
//!
//! and the Fine–Gray weight of a row is G(T−) = Π_{u < T} (…), computed separately within each
//! stratum (unweighted, as R `survival::finegray` does without case weights).

/// G(T_i−) for every row (same order as the input), Kaplan–Meier censoring survival just
/// before each row's time, computed within each stratum.
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
            let (mut failures, mut censored) = (0.0f64, 0.0f64);
            while block_end < end && time[order[block_end]] == t {
                let r = order[block_end];
                out[r] = g;
                if y_of(r) == 0.0 {
                    censored += 1.0;
                } else {
                    failures += 1.0;
                }
                block_end += 1;
            }
            let denom = at_risk - failures;
            if censored > 0.0 && denom > 0.0 {
                g *= 1.0 - censored / denom;
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

    fn expected_g_minus(t: f64) -> f64 {
        // G drops after 3, 4, 6, 8, 9: cumprod(1, 11/12, 8/10, 5/6, 3/4, 2/3).
        let steps = [
            (3.0, 11.0 / 12.0),
            (4.0, 0.8),
            (6.0, 5.0 / 6.0),
            (8.0, 0.75),
            (9.0, 2.0 / 3.0),
        ];
        steps
            .iter()
            .filter(|(u, _)| *u < t)
            .map(|(_, f)| f)
            .product()
    }

    #[test]
    fn fdata_weights_match_survival() {
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
