//! A slow, obviously-correct reference ("oracle") for the Cox and Fine–Gray partial likelihoods.
//!
//! Everything is recomputed from scratch, straight from the definitions (DESIGN.md §5), in every
//! call: O(groups × rows × p²) loops over event groups and their risk sets on a dense copy of x.
//! Gradients and the information matrix are analytic (not finite differences). Nothing here is
//! meant to be fast; it is meant to be easy to check by reading.
//!
//! Definitions (η = xᵀβ + offset, e = exp η, w = case weight):
//!
//! * An **event group** is the set of event rows (y = 1) sharing one stratum s and one time t;
//!   d = its size, W = Σ w over it, E0/E1/E2 = Σ w e (1, x, xxᵀ) over it.
//! * **Cox risk set** of (s, t): rows of stratum s with stop ≥ t and start < t (censored rows tied
//!   at t are in it), each with weight v = w.
//! * **Fine–Gray risk set** of (s, t): rows of s with time ≥ t (weight v = w) plus competing rows
//!   (y = 2) of s with time < t, weight v = w · G(t−)/G(T_j−), G = Kaplan–Meier survival of the
//!   censoring distribution of stratum s with `survfit`'s ties (see [`km_censoring_g_minus`]) or
//!   the supplied `censor_weight` column (= G(T_i−) per row). G(t−) of a group is the value of
//!   its event rows.
//! * S0/S1/S2 = Σ_risk v e (1, x, xxᵀ).
//! * **Breslow**: LL = Σ_events w η − Σ_groups W log S0.
//! * **Efron** (R `survival`'s weighted convention): w̄ = W/d and, for l = 0..d−1,
//!   D_l = S0 − (l/d) E0: LL = Σ_events w η − Σ_groups Σ_l w̄ log D_l (likewise for S1, S2).
//! * Gradient: Σ_events w x − Σ c·D1/D0; information: Σ c·(D2/D0 − D1 D1ᵀ/D0²), with c = W
//!   (Breslow) or w̄ (Efron, per l).
//!
//! The Kaplan–Meier censoring weights are unweighted (case weights do not enter G), as in R
//! `survival::finegray` and `cmprsk::crr`.
// Index loops mirror the formulas (Σ over rows r of the risk set); helpers may go unused.
#![allow(dead_code, clippy::needless_range_loop)]

use epifusion::model::design::DesignMatrix;
use epifusion::model::{Likelihood, ModelKind, Ties};

/// Brute-force Cox / Fine–Gray likelihood implementing [`Likelihood`].
#[derive(Debug, Clone)]
pub struct Oracle {
    fine_gray: bool,
    ties: Ties,
    p: usize,
    /// Dense x, `x[i][j]`.
    x: Vec<Vec<f64>>,
    stratum: Vec<u32>,
    /// Counting-process start (−∞ when absent).
    start: Vec<f64>,
    time: Vec<f64>,
    y: Vec<f64>,
    weight: Vec<f64>,
    offset: Vec<f64>,
    /// Fine–Gray: G(T_i−) per row.
    g_minus: Vec<f64>,
    beta: Vec<f64>,
}

impl Oracle {
    /// Oracle for `kind` (Cox or FineGray) on `design`. For Fine–Gray the supplied
    /// `censor_weight` column is used when present, else [`km_censoring_g_minus`].
    pub fn new(kind: ModelKind, design: &DesignMatrix, ties: Ties) -> Oracle {
        let fine_gray = match kind {
            ModelKind::Cox => false,
            ModelKind::FineGray => true,
            other => panic!("the oracle covers Cox and Fine–Gray only, not {other:?}"),
        };
        let r = &design.rows;
        let n = design.n_rows();
        let p = design.n_cols();
        let mut x = vec![vec![0.0; p]; n];
        for (j, col) in design.columns.iter().enumerate() {
            for (i, v) in col.entries() {
                x[i][j] = v;
            }
        }
        let g_minus = if !fine_gray {
            vec![1.0; n]
        } else if let Some(cw) = &r.censor_weight {
            cw.clone()
        } else {
            km_censoring_g_minus(&r.time.to_vec(), &r.y.to_vec(), &r.stratum.to_vec())
        };
        Oracle {
            fine_gray,
            ties,
            p,
            x,
            stratum: r.stratum.to_vec(),
            start: r
                .start_time
                .clone()
                .unwrap_or_else(|| vec![f64::NEG_INFINITY; n]),
            time: r.time.to_vec(),
            y: r.y.to_vec(),
            weight: (0..n).map(|i| design.weight(i)).collect(),
            offset: (0..n).map(|i| design.offset(i)).collect(),
            g_minus,
            beta: vec![0.0; p],
        }
    }

    /// G(T_i−) per row as used by the Fine–Gray risk sets (all 1 for Cox).
    pub fn g_minus(&self) -> &[f64] {
        &self.g_minus
    }

    /// Current coefficients.
    pub fn beta(&self) -> &[f64] {
        &self.beta
    }

    /// Fine–Gray risk-set weight (without the case weight) of row `r` in the risk set of an
    /// event at time `t` whose G(t−) is `g_t`; Cox weight of row `r` at `t`. 0 = not at risk.
    pub fn risk_weight(&self, r: usize, t: f64, g_t: f64) -> f64 {
        if self.fine_gray {
            if self.time[r] >= t {
                1.0
            } else if self.y[r] == 2.0 {
                g_t / self.g_minus[r]
            } else {
                0.0
            }
        } else if self.time[r] >= t && self.start[r] < t {
            1.0
        } else {
            0.0
        }
    }

    /// The event groups: (stratum, time, event rows), in order of stratum then time.
    pub fn event_groups(&self) -> Vec<(u32, f64, Vec<usize>)> {
        let mut keys: Vec<(u32, f64)> = (0..self.y.len())
            .filter(|&i| self.y[i] == 1.0)
            .map(|i| (self.stratum[i], self.time[i]))
            .collect();
        keys.sort_by(|a, b| a.0.cmp(&b.0).then(a.1.total_cmp(&b.1)));
        keys.dedup();
        keys.into_iter()
            .map(|(s, t)| {
                let rows = (0..self.y.len())
                    .filter(|&i| self.y[i] == 1.0 && self.stratum[i] == s && self.time[i] == t)
                    .collect();
                (s, t, rows)
            })
            .collect()
    }

    /// Log-likelihood, gradient over `cols` and information (−Hessian) over `cols × cols`
    /// (row-major), all from scratch at the current β.
    pub fn evaluate(&self, cols: &[usize]) -> (f64, Vec<f64>, Vec<f64>) {
        let n = self.y.len();
        let k = cols.len();
        let eta: Vec<f64> = (0..n)
            .map(|i| {
                self.offset[i]
                    + (0..self.p)
                        .map(|j| self.x[i][j] * self.beta[j])
                        .sum::<f64>()
            })
            .collect();
        let e: Vec<f64> = eta.iter().map(|v| v.exp()).collect();
        let mut ll = 0.0;
        let mut grad = vec![0.0; k];
        let mut info = vec![0.0; k * k];
        for (s, t, events) in self.event_groups() {
            // Numerator: Σ_events w η, Σ_events w x.
            for &i in &events {
                ll += self.weight[i] * eta[i];
                for a in 0..k {
                    grad[a] += self.weight[i] * self.x[i][cols[a]];
                }
            }
            // Risk-set sums S0, S1, S2.
            let g_t = self.g_minus[events[0]];
            let (mut s0, mut s1, mut s2) = (0.0, vec![0.0; k], vec![0.0; k * k]);
            for r in 0..n {
                if self.stratum[r] != s {
                    continue;
                }
                let v = self.weight[r] * self.risk_weight(r, t, g_t);
                if v == 0.0 {
                    continue;
                }
                add_moments(v * e[r], &self.x[r], cols, &mut s0, &mut s1, &mut s2);
            }
            // Tied-event sums E0, E1, E2.
            let (mut e0, mut e1, mut e2) = (0.0, vec![0.0; k], vec![0.0; k * k]);
            for &i in &events {
                add_moments(
                    self.weight[i] * e[i],
                    &self.x[i],
                    cols,
                    &mut e0,
                    &mut e1,
                    &mut e2,
                );
            }
            let d = events.len();
            let big_w: f64 = events.iter().map(|&i| self.weight[i]).sum();
            // (coefficient c, fraction f of the tied events removed from the risk set).
            let terms: Vec<(f64, f64)> = match self.ties {
                Ties::Breslow => vec![(big_w, 0.0)],
                Ties::Efron => (0..d)
                    .map(|l| (big_w / d as f64, l as f64 / d as f64))
                    .collect(),
            };
            for (c, f) in terms {
                let d0 = s0 - f * e0;
                let d1: Vec<f64> = (0..k).map(|a| s1[a] - f * e1[a]).collect();
                ll -= c * d0.ln();
                for a in 0..k {
                    grad[a] -= c * d1[a] / d0;
                    for b in 0..k {
                        let d2 = s2[a * k + b] - f * e2[a * k + b];
                        info[a * k + b] += c * (d2 / d0 - d1[a] * d1[b] / (d0 * d0));
                    }
                }
            }
        }
        (ll, grad, info)
    }
}

/// Σ u (1, x, xxᵀ) over the selected columns.
fn add_moments(u: f64, x: &[f64], cols: &[usize], m0: &mut f64, m1: &mut [f64], m2: &mut [f64]) {
    let k = cols.len();
    *m0 += u;
    for a in 0..k {
        m1[a] += u * x[cols[a]];
        for b in 0..k {
            m2[a * k + b] += u * x[cols[a]] * x[cols[b]];
        }
    }
}

impl Likelihood for Oracle {
    fn n_coef(&self) -> usize {
        self.p
    }
    fn set_beta(&mut self, beta: &[f64]) {
        assert_eq!(beta.len(), self.p);
        self.beta = beta.to_vec();
    }
    fn log_likelihood(&mut self) -> f64 {
        self.evaluate(&[]).0
    }
    fn gradient_hessian(&mut self, j: usize) -> (f64, f64) {
        let (_, g, h) = self.evaluate(&[j]);
        (g[0], h[0])
    }
    fn update(&mut self, j: usize, delta: f64) {
        self.beta[j] += delta;
    }
    fn information(&mut self, cols: &[usize]) -> Vec<f64> {
        self.evaluate(cols).2
    }
    fn boxed_clone(&self) -> Box<dyn Likelihood> {
        Box::new(self.clone())
    }
}

/// G(T_i−) per row: the Kaplan–Meier survival of the censoring distribution of row i's stratum
/// just before its time, with `survfit`'s usual tie convention, as `cmprsk::crr` and Cyclops'
/// `getFineGrayWeights` use it (`survfit(Surv(ftime, fstatus == 0))` evaluated at
/// `ftime * (1 − 100 ε)`): failures at a censoring time c are still at risk for censoring at c
/// (#at risk = #{time ≥ c}). `status` 0 = censored, anything else = a failure ("not censored").
/// Case weights do not enter. What the engine computes when no `censor_weight` is supplied.
pub fn km_censoring_g_minus(time: &[f64], status: &[f64], stratum: &[u32]) -> Vec<f64> {
    km_g_minus(time, status, stratum, true)
}

/// Like [`km_censoring_g_minus`] but with censorings tied with failures placed **after** them
/// (R `survival::finegray`): at a censoring time c, the number at risk for censoring is
/// #{time > c} + #{censored at c}.
pub fn km_censoring_g_minus_finegray_ties(
    time: &[f64],
    status: &[f64],
    stratum: &[u32],
) -> Vec<f64> {
    km_g_minus(time, status, stratum, false)
}

fn km_g_minus(time: &[f64], status: &[f64], stratum: &[u32], failures_at_risk: bool) -> Vec<f64> {
    let n = time.len();
    (0..n)
        .map(|i| {
            let s = stratum[i];
            let in_s = |r: &usize| stratum[*r] == s;
            // Distinct censoring times of the stratum strictly before T_i.
            let mut ctimes: Vec<f64> = (0..n)
                .filter(in_s)
                .filter(|&r| status[r] == 0.0 && time[r] < time[i])
                .map(|r| time[r])
                .collect();
            ctimes.sort_by(f64::total_cmp);
            ctimes.dedup();
            ctimes
                .iter()
                .map(|&c| {
                    let censored = (0..n)
                        .filter(in_s)
                        .filter(|&r| status[r] == 0.0 && time[r] == c)
                        .count() as f64;
                    let at_risk = if failures_at_risk {
                        (0..n).filter(in_s).filter(|&r| time[r] >= c).count() as f64
                    } else {
                        (0..n).filter(in_s).filter(|&r| time[r] > c).count() as f64 + censored
                    };
                    1.0 - censored / at_risk
                })
                .product()
        })
        .collect()
}

#[cfg(test)]
mod tests {
    //! Self-checks of the oracle: analytic derivatives against finite differences of its own
    //! log-likelihood, and a hand-computed Fine–Gray risk set.
    use super::*;
    use epifusion::model::design::{DesignBuilder, OutcomeRecord};

    /// Small data with ties, strata, weights and (optionally) competing events.
    fn design(fine_gray: bool, counting: bool) -> DesignMatrix {
        let time = [
            2.0, 2.0, 3.0, 3.0, 3.0, 5.0, 6.0, 6.0, 7.0, 9.0, 2.0, 4.0, 4.0, 8.0,
        ];
        let y_cox = [
            1.0, 0.0, 1.0, 1.0, 0.0, 1.0, 0.0, 1.0, 1.0, 0.0, 1.0, 1.0, 0.0, 1.0,
        ];
        let y_fg = [
            1.0, 2.0, 1.0, 2.0, 0.0, 1.0, 0.0, 2.0, 1.0, 0.0, 1.0, 2.0, 0.0, 1.0,
        ];
        let x1 = [
            0.5, -1.0, 1.5, 0.0, 2.0, -0.5, 1.0, 0.3, -1.2, 0.8, 0.1, 1.1, -0.7, 0.4,
        ];
        let x2 = [
            1.0, 0.0, 1.0, 1.0, 0.0, 0.0, 1.0, 1.0, 0.0, 1.0, 0.0, 1.0, 1.0, 0.0,
        ];
        let mut b = DesignBuilder::new();
        for i in 0..time.len() {
            b.push_outcome(OutcomeRecord {
                row_id: i as i64,
                stratum_id: Some(if i < 10 { 1 } else { 2 }),
                time: Some(time[i]),
                start_time: counting.then_some(if i % 3 == 0 { 1.0 } else { 0.0 }),
                y: if fine_gray { y_fg[i] } else { y_cox[i] },
                weight: Some(1.0 + (i % 4) as f64 * 0.5),
                ..Default::default()
            });
            b.push_covariate(i as i64, 1, x1[i]);
            b.push_covariate(i as i64, 2, x2[i]);
        }
        b.build().unwrap()
    }

    fn check_derivatives(kind: ModelKind, x: &DesignMatrix, ties: Ties) {
        let mut o = Oracle::new(kind, x, ties);
        let beta = [0.3, -0.7];
        let h = 1e-5;
        o.set_beta(&beta);
        let (_, g, info) = o.evaluate(&[0, 1]);
        for j in 0..2 {
            let f = |o: &mut Oracle, d: f64| {
                let mut b = beta;
                b[j] += d;
                o.set_beta(&b);
                o.evaluate(&[0, 1])
            };
            let (lp, gp, _) = f(&mut o, h);
            let (lm, gm, _) = f(&mut o, -h);
            let fd = (lp - lm) / (2.0 * h);
            assert!(
                (fd - g[j]).abs() < 1e-7 * (1.0 + g[j].abs()),
                "{kind:?} {ties:?} g{j}: {fd} vs {}",
                g[j]
            );
            for a in 0..2 {
                let fd2 = -(gp[a] - gm[a]) / (2.0 * h);
                let want = info[a * 2 + j];
                assert!(
                    (fd2 - want).abs() < 1e-6 * (1.0 + want.abs()),
                    "{kind:?} {ties:?} I{a}{j}: {fd2} vs {want}"
                );
            }
        }
        // gradient_hessian agrees with the full evaluation; update == set_beta.
        o.set_beta(&[0.3, 0.0]);
        o.update(1, -0.7);
        let (g1, h1) = o.gradient_hessian(1);
        assert!((g1 - g[1]).abs() < 1e-12 && (h1 - info[3]).abs() < 1e-12);
    }

    #[test]
    fn analytic_derivatives_match_finite_differences() {
        for ties in [Ties::Breslow, Ties::Efron] {
            check_derivatives(ModelKind::Cox, &design(false, false), ties);
            check_derivatives(ModelKind::Cox, &design(false, true), ties);
            check_derivatives(ModelKind::FineGray, &design(true, false), ties);
        }
    }

    #[test]
    fn efron_without_ties_is_breslow() {
        let x = design(true, false);
        let groups = Oracle::new(ModelKind::FineGray, &x, Ties::Efron).event_groups();
        assert!(
            groups.iter().all(|g| g.2.len() == 1),
            "fixture has no tied events of type 1"
        );
        let mut a = Oracle::new(ModelKind::FineGray, &x, Ties::Efron);
        let mut b = Oracle::new(ModelKind::FineGray, &x, Ties::Breslow);
        a.set_beta(&[0.2, 0.4]);
        b.set_beta(&[0.2, 0.4]);
        assert!((a.log_likelihood() - b.log_likelihood()).abs() < 1e-13);
    }

    #[test]
    fn fine_gray_risk_set_by_hand() {
        // Stratum 1 of the fixture: censoring times 3 (the 8 rows with time ≥ 3 at risk, the
        // failures at 3 included: `survfit`'s ties, as crr → G drops by 7/8), 6 (at risk 4:
        // times 6 (censored), 6 (competing), 7, 9 → 3/4), 9. (finegray's ties: 5/6 and 2/3.)
        let x = design(true, false);
        let o = Oracle::new(ModelKind::FineGray, &x, Ties::Breslow);
        let g = o.g_minus();
        assert_eq!(&g[..3], &[1.0, 1.0, 1.0]);
        // Rows 5 and 8: times 5 and 7.
        assert!((g[5] - 7.0 / 8.0).abs() < 1e-15);
        assert!((g[8] - 7.0 / 8.0 * 3.0 / 4.0).abs() < 1e-15);
        // Row 1 (competing at 2) in the risk set of the event at 7: G(7−)/G(2−).
        assert!((o.risk_weight(1, 7.0, g[8]) - 21.0 / 32.0).abs() < 1e-15);
        let finegray = km_censoring_g_minus_finegray_ties(
            &x.rows.time.to_vec(),
            &x.rows.y.to_vec(),
            &x.rows.stratum.to_vec(),
        );
        assert!((finegray[5] - 5.0 / 6.0).abs() < 1e-15);
        assert!((finegray[8] - 5.0 / 6.0 * 2.0 / 3.0).abs() < 1e-15);
        // Row 3 (competing at 3) at 3 itself: time ≥ t → weight 1.
        assert_eq!(o.risk_weight(3, 3.0, g[2]), 1.0);
        // Censored row 4 (time 3) is not at risk at 5.
        assert_eq!(o.risk_weight(4, 5.0, g[5]), 0.0);
    }
}
