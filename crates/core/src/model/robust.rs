//! Robust (sandwich) variances of the unpenalized coefficients.
//!
//! The covariance is V⁻¹ (Σ_c u_c u_cᵀ) V⁻¹ over the coefficients B: V = I_BB is the observed
//! information ([`crate::model::Likelihood::information`], the same matrix as the model-based
//! standard errors), and u_c = Σ_{i ∈ c} u_i sums the per-row *influence contributions* u_i
//! (the rows' shares of the score, plus the Fine–Gray censoring term) over cluster c. Clusters
//! are the design's [`Rows::cluster`](super::design::Rows::cluster) ids when set; otherwise
//! every row is its own cluster (every stratum for the conditional models, whose rows are not
//! independent). Penalized coefficients are held at their estimates, as for the model-based
//! standard errors. No small-sample factor is applied.
//!
//! | model | u_i | matches |
//! |---|---|---|
//! | Cox | w_i r_i, r_i the score residual (Breslow or Efron; strata, (start, stop] rows) | `coxph(robust = TRUE)` / `cluster()`: Lin & Wei (1989) |
//! | Fine–Gray | w_i η_i + ψ_i: the subdistribution score residual η_i (a competing row stays in later risk sets with weight G(t−)/G(T_i−)) and the censoring-weight term ψ_i | `cmprsk::crr`'s `var`: Fine & Gray (1999) §3 |
//! | logistic, Poisson | w_i x_i (y_i − μ_i) | `sandwich::sandwich` (HC0) |
//! | SCCS, conditional logistic | w_k x_k (y_k − n_s t_k e^{η_k}/D_s), summed by stratum | the stratum (case) as the cluster |
//!
//! **Score residuals** (Cox; the forward part of Fine–Gray). At an event time t with risk-set
//! sums S0 = Σ w e, S1 = Σ w e x and, for Efron's d tied events, E0, E1 over those events and
//! w̄ = W/d (survival's weighted convention), let S0_l = S0 − (l/d)E0 and
//! x̄_l = (S1 − (l/d)E1)/S0_l for l = 0 … d−1 (Breslow: l = 0 only and w̄ = W). A row at risk
//! at t that is not one of its events takes −e_i Σ_l (w̄/S0_l)(x_i − x̄_l); one of the events
//! takes x_i − (1/d)Σ_l x̄_l − e_i Σ_l (1 − l/d)(w̄/S0_l)(x_i − x̄_l). The residuals of all rows,
//! weighted, add up to the score. For Fine–Gray a competing row i (y = 2) is also at risk after
//! T_i with weight G(t−)/G(T_i−).
//!
//! **The censoring term** (Fine–Gray; `crr`'s `crrvv`). With Y(u) the number at risk for
//! censoring and d_c(u) the censorings at u (unweighted, as the Kaplan–Meier estimate G),
//! q(u) = Σ_{t ≥ u} G(t−) Σ_l (w̄/S0_l) Σ_{j competing, T_j < u} (w_j e_j / G(T_j−))(x_j − x̄_l)
//! and ψ_i = 1{i censored} q(T_i)/Y(T_i) − Σ_{u: i at risk for censoring at u} d_c(u) q(u)/Y(u)².
//! At-risk convention: `survfit`'s, as for the computed G
//! ([`crate::model::censoring`]) and in `crr`: Y(u) = #{T ≥ u}, every row with T ≥ u at risk
//! for censoring at u (a failure at u too). With unit weights and one stratum this is `crr`'s
//! variance exactly; with strata everything (risk sets, G, Y) is per stratum, and case weights
//! enter the score residuals and q but not Y, d_c or G.

use std::collections::HashMap;

use super::censoring::censoring_weights;
use super::design::DesignMatrix;
use super::inference::invert_spd;
use super::{ModelKind, Ties};

/// Robust covariance (k×k, row-major) of the fit columns `cols` at `beta` (module docs), from
/// the information `info` over `cols`. `prepended_intercept`: the fit's column 0 is an
/// intercept that `x` does not hold (fit column j is design column j − 1). For Fine–Gray,
/// `censoring_term = false` leaves out ψ (see [`influence`]). `None` when the information is
/// singular.
#[allow(clippy::too_many_arguments)]
pub fn covariance(
    kind: ModelKind,
    ties: Ties,
    x: &DesignMatrix,
    prepended_intercept: bool,
    beta: &[f64],
    cols: &[usize],
    info: &[f64],
    censoring_term: bool,
) -> Option<Vec<f64>> {
    let k = cols.len();
    let inv = invert_spd(info, k)?;
    let u = influence(
        kind,
        ties,
        x,
        prepended_intercept,
        beta,
        cols,
        censoring_term,
    );
    let meat = clustered_outer(x, kind, &u, k);
    Some(sandwich(&inv, &meat, k))
}

/// Per-row influence contributions u_i (n×k, row-major by row) of the fit columns `cols` at
/// `beta` (module docs). For Fine–Gray, `censoring_term = false` leaves out ψ: the robust
/// variance `coxph` reports on `finegray()` data with `cluster(id)`.
pub fn influence(
    kind: ModelKind,
    ties: Ties,
    x: &DesignMatrix,
    prepended_intercept: bool,
    beta: &[f64],
    cols: &[usize],
    censoring_term: bool,
) -> Vec<f64> {
    let eta = linear_predictor(x, prepended_intercept, beta);
    let z: Vec<Vec<f64>> = cols
        .iter()
        .map(|&j| fit_column(x, prepended_intercept, j))
        .collect();
    match kind {
        ModelKind::Cox => survival(x, ties, &eta, &z, None),
        ModelKind::FineGray => {
            let r = &x.rows;
            let g = match &r.censor_weight {
                Some(g) => g.clone(),
                None => censoring_weights(&r.time.as_f64(), &r.y.as_f64(), &r.stratum.as_u32()),
            };
            let c = Censoring {
                g,
                term: censoring_term,
            };
            survival(x, ties, &eta, &z, Some(&c))
        }
        ModelKind::Logistic | ModelKind::Poisson => glm(x, kind, &eta, &z),
        ModelKind::ConditionalPoisson | ModelKind::ConditionalLogistic => {
            conditional(x, kind, &eta, &z)
        }
    }
}

/// V⁻¹ M V⁻¹.
fn sandwich(inv: &[f64], meat: &[f64], k: usize) -> Vec<f64> {
    let mut tmp = vec![0.0; k * k];
    for a in 0..k {
        for b in 0..k {
            tmp[a * k + b] = (0..k).map(|c| inv[a * k + c] * meat[c * k + b]).sum();
        }
    }
    let mut out = vec![0.0; k * k];
    for a in 0..k {
        for b in 0..k {
            out[a * k + b] = (0..k).map(|c| tmp[a * k + c] * inv[c * k + b]).sum();
        }
    }
    out
}

/// Σ_c u_c u_cᵀ with u_c the sum of the rows' contributions over cluster c (clusters in order
/// of first appearance, so the sums do not depend on anything but the row order).
fn clustered_outer(x: &DesignMatrix, kind: ModelKind, u: &[f64], k: usize) -> Vec<f64> {
    let n = x.n_rows();
    let key = |i: usize| -> i64 {
        match &x.rows.cluster {
            Some(c) => c[i],
            None if matches!(
                kind,
                ModelKind::ConditionalPoisson | ModelKind::ConditionalLogistic
            ) =>
            {
                i64::from(x.rows.stratum.get(i))
            }
            None => i as i64,
        }
    };
    let mut index: HashMap<i64, usize> = HashMap::new();
    let mut sums: Vec<f64> = Vec::new();
    for i in 0..n {
        let next = sums.len() / k.max(1);
        let c = *index.entry(key(i)).or_insert(next);
        if c == next {
            sums.extend(std::iter::repeat_n(0.0, k));
        }
        for a in 0..k {
            sums[c * k + a] += u[i * k + a];
        }
    }
    let mut meat = vec![0.0; k * k];
    for s in sums.chunks(k.max(1)) {
        for a in 0..k {
            for b in 0..k {
                meat[a * k + b] += s[a] * s[b];
            }
        }
    }
    meat
}

/// η_i = offset_i + Σ_j β_j x_ij over every fit column.
fn linear_predictor(x: &DesignMatrix, prepended: bool, beta: &[f64]) -> Vec<f64> {
    let n = x.n_rows();
    let mut eta: Vec<f64> = (0..n).map(|i| x.offset(i)).collect();
    for (j, &b) in beta.iter().enumerate() {
        if b == 0.0 {
            continue;
        }
        if prepended && j == 0 {
            eta.iter_mut().for_each(|e| *e += b);
        } else {
            for (i, v) in x.columns[j - usize::from(prepended)].entries() {
                eta[i] += b * v;
            }
        }
    }
    eta
}

/// Fit column j as a dense vector.
fn fit_column(x: &DesignMatrix, prepended: bool, j: usize) -> Vec<f64> {
    let n = x.n_rows();
    if prepended && j == 0 {
        vec![1.0; n]
    } else {
        x.columns[j - usize::from(prepended)].to_dense(n)
    }
}

/// What Fine–Gray adds: G(T_i−) per row and whether ψ is wanted.
struct Censoring {
    g: Vec<f64>,
    term: bool,
}

/// Number of sorted `values` ≤ v.
fn count_le(values: &[f64], v: f64) -> usize {
    values.partition_point(|&t| t <= v)
}

/// Cox score residuals, or Fine–Gray η + ψ (module docs), weighted.
fn survival(
    x: &DesignMatrix,
    ties: Ties,
    eta: &[f64],
    z: &[Vec<f64>],
    fg: Option<&Censoring>,
) -> Vec<f64> {
    let r = &x.rows;
    let row_time = r.time.as_f64();
    let row_y = r.y.as_f64();
    let row_stratum = r.stratum.as_u32();
    let n = x.n_rows();
    let k = z.len();
    let mut out = vec![0.0; n * k];
    let mut by_stratum: Vec<Vec<usize>> = vec![Vec::new(); x.n_strata()];
    for i in 0..n {
        by_stratum[row_stratum[i] as usize].push(i);
    }
    let w = |i: usize| x.weight(i);
    let e: Vec<f64> = eta.iter().map(|v| v.exp()).collect();
    let zi = |i: usize, a: usize| z[a][i];
    let g_of = |i: usize| fg.map_or(1.0, |c| c.g[i]);
    for rows in &by_stratum {
        // Event times (y = 1), ascending.
        let mut times: Vec<f64> = rows
            .iter()
            .filter(|&&i| row_y[i] == 1.0)
            .map(|&i| row_time[i])
            .collect();
        times.sort_by(f64::total_cmp);
        times.dedup();
        let m = times.len();
        // Per event time: weight, count, E0, E1, G(t−).
        let mut wsum = vec![0.0; m];
        let mut d = vec![0usize; m];
        let mut e0 = vec![0.0; m];
        let mut e1 = vec![0.0; m * k];
        let mut gt = vec![1.0; m];
        for &i in rows.iter().filter(|&&i| row_y[i] == 1.0) {
            let ev = count_le(&times, row_time[i]) - 1;
            wsum[ev] += w(i);
            d[ev] += 1;
            e0[ev] += w(i) * e[i];
            for a in 0..k {
                e1[ev * k + a] += w(i) * e[i] * zi(i, a);
            }
            gt[ev] = g_of(i);
        }
        // Risk-set sums: rows at risk for event indices [lo, hi), competing rows (Fine–Gray)
        // also for indices ≥ hi with weight G(t−)/G(T−).
        let hi_of = |i: usize| count_le(&times, row_time[i]);
        let lo_of = |i: usize| r.start_time.as_ref().map_or(0, |s| count_le(&times, s[i]));
        let mut add = vec![0.0; (m + 1) * (k + 1)];
        let mut sub = vec![0.0; (m + 1) * (k + 1)];
        let mut back = vec![0.0; (m + 1) * (k + 1)];
        for &i in rows {
            let v = w(i) * e[i];
            let (hi, lo) = (hi_of(i), lo_of(i));
            if hi > 0 {
                add[(hi - 1) * (k + 1)] += v;
                for a in 0..k {
                    add[(hi - 1) * (k + 1) + 1 + a] += v * zi(i, a);
                }
            }
            if lo > 0 {
                sub[(lo - 1) * (k + 1)] += v;
                for a in 0..k {
                    sub[(lo - 1) * (k + 1) + 1 + a] += v * zi(i, a);
                }
            }
            if fg.is_some() && row_y[i] == 2.0 && hi < m {
                let v = v / g_of(i);
                back[hi * (k + 1)] += v;
                for a in 0..k {
                    back[hi * (k + 1) + 1 + a] += v * zi(i, a);
                }
            }
        }
        // S[e] = suffix(add)[e] − suffix(sub)[e] + G_e·prefix(back)[e].
        let mut s = vec![0.0; m * (k + 1)];
        let mut acc_add = vec![0.0; k + 1];
        let mut acc_sub = vec![0.0; k + 1];
        for ev in (0..m).rev() {
            for c in 0..=k {
                acc_add[c] += add[ev * (k + 1) + c];
                acc_sub[c] += sub[ev * (k + 1) + c];
                s[ev * (k + 1) + c] = acc_add[c] - acc_sub[c];
            }
        }
        // B(<t_e): competing rows with T < t_e, prefix in e (kept for q as well).
        let mut b_before = vec![0.0; (m + 1) * (k + 1)];
        for ev in 0..m {
            for c in 0..=k {
                b_before[(ev + 1) * (k + 1) + c] =
                    b_before[ev * (k + 1) + c] + back[ev * (k + 1) + c];
            }
        }
        for ev in 0..m {
            for c in 0..=k {
                s[ev * (k + 1) + c] += gt[ev] * b_before[(ev + 1) * (k + 1) + c];
            }
        }
        // Efron / Breslow hazard terms per event time.
        let mut h = vec![0.0; m];
        let mut hx = vec![0.0; m * k];
        let mut hd = vec![0.0; m];
        let mut hxd = vec![0.0; m * k];
        let mut xbar_d = vec![0.0; m * k];
        for ev in 0..m {
            let efron = ties == Ties::Efron && d[ev] > 1;
            let (steps, wbar) = if efron {
                (d[ev], wsum[ev] / d[ev] as f64)
            } else {
                (1, wsum[ev])
            };
            let s0 = s[ev * (k + 1)];
            for l in 0..steps {
                let frac = l as f64 / d[ev] as f64;
                let frac = if efron { frac } else { 0.0 };
                let s0l = s0 - frac * e0[ev];
                let a = wbar / s0l;
                h[ev] += a;
                hd[ev] += (1.0 - frac) * a;
                for c in 0..k {
                    let xbar = (s[ev * (k + 1) + 1 + c] - frac * e1[ev * k + c]) / s0l;
                    hx[ev * k + c] += a * xbar;
                    hxd[ev * k + c] += (1.0 - frac) * a * xbar;
                    xbar_d[ev * k + c] += xbar / steps as f64;
                }
            }
        }
        // Prefix sums of (h, hx) over event indices; suffix sums of G·(h, hx).
        let mut ch = vec![0.0; (m + 1) * (k + 1)];
        for ev in 0..m {
            ch[(ev + 1) * (k + 1)] = ch[ev * (k + 1)] + h[ev];
            for c in 0..k {
                ch[(ev + 1) * (k + 1) + 1 + c] = ch[ev * (k + 1) + 1 + c] + hx[ev * k + c];
            }
        }
        let mut gh = vec![0.0; (m + 1) * (k + 1)];
        for ev in (0..m).rev() {
            gh[ev * (k + 1)] = gh[(ev + 1) * (k + 1)] + gt[ev] * h[ev];
            for c in 0..k {
                gh[ev * (k + 1) + 1 + c] = gh[(ev + 1) * (k + 1) + 1 + c] + gt[ev] * hx[ev * k + c];
            }
        }
        // Score residuals.
        for &i in rows {
            let (hi, lo) = (hi_of(i), lo_of(i));
            for a in 0..k {
                let x_i = zi(i, a);
                let hz = ch[hi * (k + 1)] - ch[lo * (k + 1)];
                let hzx = ch[hi * (k + 1) + 1 + a] - ch[lo * (k + 1) + 1 + a];
                let mut res = -e[i] * (x_i * hz - hzx);
                if row_y[i] == 1.0 {
                    let ev = hi - 1;
                    res += x_i - xbar_d[ev * k + a];
                    res += e[i] * (x_i * (h[ev] - hd[ev]) - (hx[ev * k + a] - hxd[ev * k + a]));
                }
                if fg.is_some() && row_y[i] == 2.0 && hi < m {
                    let gz = gh[hi * (k + 1)];
                    let gzx = gh[hi * (k + 1) + 1 + a];
                    res -= e[i] / g_of(i) * (x_i * gz - gzx);
                }
                out[i * k + a] = w(i) * res;
            }
        }
        // The censoring-weight term ψ (Fine–Gray).
        if !fg.is_some_and(|c| c.term) {
            continue;
        }
        if m == 0 {
            continue;
        }
        let mut ctimes: Vec<f64> = rows
            .iter()
            .filter(|&&i| row_y[i] == 0.0)
            .map(|&i| row_time[i])
            .collect();
        ctimes.sort_by(f64::total_cmp);
        ctimes.dedup();
        let nc = ctimes.len();
        if nc == 0 {
            continue;
        }
        let mut dc = vec![0.0; nc];
        for &i in rows.iter().filter(|&&i| row_y[i] == 0.0) {
            dc[count_le(&ctimes, row_time[i]) - 1] += 1.0;
        }
        let mut sorted_t: Vec<f64> = rows.iter().map(|&i| row_time[i]).collect();
        sorted_t.sort_by(f64::total_cmp);
        let total = sorted_t.len();
        // q(u) and the increments d_c q / Y²; competing rows with T < u enter in time order.
        // (A competing row with no event time after it weighs nothing — and its G(T−) may be
        // 0.)
        let mut competing: Vec<usize> = rows
            .iter()
            .copied()
            .filter(|&j| row_y[j] == 2.0 && hi_of(j) < m)
            .collect();
        competing.sort_by(|&p, &q| row_time[p].total_cmp(&row_time[q]));
        let mut next = 0;
        let (mut b0, mut b1) = (0.0, vec![0.0; k]);
        let mut q = vec![0.0; nc * k];
        let mut y_at = vec![0.0; nc];
        let mut cum = vec![0.0; (nc + 1) * k];
        for (u_idx, &u) in ctimes.iter().enumerate() {
            while next < competing.len() && row_time[competing[next]] < u {
                let j = competing[next];
                let v = w(j) * e[j] / g_of(j);
                b0 += v;
                for (a, b) in b1.iter_mut().enumerate() {
                    *b += v * zi(j, a);
                }
                next += 1;
            }
            // `survfit`'s at-risk count, as G's (every row with T ≥ u).
            y_at[u_idx] = (total - sorted_t.partition_point(|&t| t < u)) as f64;
            // Event times t ≥ u: suffix of G·(h, hx) from the first event index at or after u.
            let from = times.partition_point(|&t| t < u) * (k + 1);
            for a in 0..k {
                q[u_idx * k + a] = b1[a] * gh[from] - b0 * gh[from + 1 + a];
                cum[(u_idx + 1) * k + a] =
                    cum[u_idx * k + a] + dc[u_idx] * q[u_idx * k + a] / (y_at[u_idx] * y_at[u_idx]);
            }
        }
        for &i in rows {
            let t = row_time[i];
            let upto = count_le(&ctimes, t);
            // A censored row's own censoring time is the last one ≤ t: index `upto − 1`.
            let censored = row_y[i] == 0.0;
            for a in 0..k {
                let mut psi = -cum[upto * k + a];
                if censored {
                    psi += q[(upto - 1) * k + a] / y_at[upto - 1];
                }
                out[i * k + a] += psi;
            }
        }
    }
    out
}

/// Logistic / Poisson: w_i x_i (y_i − μ_i).
fn glm(x: &DesignMatrix, kind: ModelKind, eta: &[f64], z: &[Vec<f64>]) -> Vec<f64> {
    let n = x.n_rows();
    let k = z.len();
    let mut out = vec![0.0; n * k];
    for i in 0..n {
        let mu = match kind {
            ModelKind::Logistic => 1.0 / (1.0 + (-eta[i]).exp()),
            _ => x.rows.time.get(i) * eta[i].exp(),
        };
        let res = x.weight(i) * (x.rows.y.get(i) - mu);
        for a in 0..k {
            out[i * k + a] = res * z[a][i];
        }
    }
    out
}

/// SCCS / conditional logistic: w_k x_k (y_k − n_s t_k e_k / D_s) with n_s = Σ w y and
/// D_s = Σ w t e over the stratum (t = 1 for conditional logistic).
fn conditional(x: &DesignMatrix, kind: ModelKind, eta: &[f64], z: &[Vec<f64>]) -> Vec<f64> {
    let n = x.n_rows();
    let k = z.len();
    let r = &x.rows;
    let row_time = r.time.as_f64();
    let row_y = r.y.as_f64();
    let row_stratum = r.stratum.as_u32();
    let t = |i: usize| {
        if kind == ModelKind::ConditionalPoisson {
            row_time[i]
        } else {
            1.0
        }
    };
    let s_count = x.n_strata();
    let mut ns = vec![0.0; s_count];
    let mut ds = vec![0.0; s_count];
    for (i, eta_i) in eta.iter().enumerate() {
        let s = row_stratum[i] as usize;
        ns[s] += x.weight(i) * row_y[i];
        ds[s] += x.weight(i) * t(i) * eta_i.exp();
    }
    let mut out = vec![0.0; n * k];
    for i in 0..n {
        let s = row_stratum[i] as usize;
        if ns[s] == 0.0 {
            continue;
        }
        let res = x.weight(i) * (row_y[i] - ns[s] * t(i) * eta[i].exp() / ds[s]);
        for a in 0..k {
            out[i * k + a] = res * z[a][i];
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::risk_set::test_support::{build, random_records, Spec};
    use crate::model::{cpu_likelihood, LikelihoodOptions};

    /// The rows' contributions add up to the score at any β (ψ sums to zero): the residuals
    /// decompose exactly the gradient the likelihood computes, for Breslow and Efron, strata,
    /// weights, offsets, (start, stop] rows, computed and supplied censoring weights.
    #[test]
    fn contributions_add_up_to_the_score() {
        let mut seed = 500;
        for kind in [ModelKind::Cox, ModelKind::FineGray] {
            for (strata, weights, counting) in [
                (1, false, false),
                (3, true, false),
                (1, true, true),
                (4, false, true),
            ] {
                let counting = counting && kind == ModelKind::Cox;
                seed += 1;
                let spec = Spec {
                    n: 80,
                    p: 4,
                    strata,
                    weights,
                    counting,
                    fine_gray: kind == ModelKind::FineGray,
                    offset: true,
                };
                let (recs, covs) = random_records(spec, seed);
                let mut x = build(&recs, &covs);
                let supplied = [false, kind == ModelKind::FineGray];
                for supply in supplied {
                    if supply {
                        let g = censoring_weights(
                            &x.rows.time.as_f64(),
                            &x.rows.y.as_f64(),
                            &x.rows.stratum.as_u32(),
                        );
                        // Any non-increasing function of time per stratum will do.
                        x.rows.censor_weight = Some(g.iter().map(|v| 0.9 * v).collect());
                    }
                    for ties in [Ties::Breslow, Ties::Efron] {
                        let beta = [0.3, -0.2, 0.5, 0.1];
                        let cols = [0, 1, 2, 3];
                        let mut lik = cpu_likelihood(kind, &x, LikelihoodOptions { ties }).unwrap();
                        lik.set_beta(&beta);
                        for term in [false, true] {
                            let u = influence(kind, ties, &x, false, &beta, &cols, term);
                            for a in 0..4 {
                                let sum: f64 = (0..x.n_rows()).map(|i| u[i * 4 + a]).sum();
                                let g = lik.gradient_hessian(a).0;
                                assert!(
                                    (sum - g).abs() < 1e-10 * (1.0 + g.abs()),
                                    "{kind:?} {ties:?} strata {strata} weights {weights} \
                                     counting {counting} supplied {supply} ψ {term}: \
                                     Σu[{a}] = {sum} vs g = {g}"
                                );
                            }
                        }
                    }
                }
            }
        }
    }

    #[test]
    fn glm_and_conditional_contributions_add_up_to_the_score() {
        let spec = Spec {
            n: 90,
            p: 3,
            strata: 6,
            weights: true,
            counting: false,
            fine_gray: false,
            offset: true,
        };
        let (recs, covs) = random_records(spec, 77);
        let x = build(&recs, &covs);
        let beta = [0.2, -0.4, 0.3];
        for kind in [
            ModelKind::Logistic,
            ModelKind::ConditionalLogistic,
            ModelKind::ConditionalPoisson,
        ] {
            let mut lik = cpu_likelihood(kind, &x, LikelihoodOptions::default()).unwrap();
            lik.set_beta(&beta);
            let u = influence(kind, Ties::Breslow, &x, false, &beta, &[0, 1, 2], true);
            for a in 0..3 {
                let sum: f64 = (0..x.n_rows()).map(|i| u[i * 3 + a]).sum();
                let g = lik.gradient_hessian(a).0;
                assert!((sum - g).abs() < 1e-10 * (1.0 + g.abs()), "{kind:?}[{a}]");
            }
        }
        // Poisson with an intercept prepended to the fit columns.
        let xi = x.clone().with_intercept();
        let mut lik =
            cpu_likelihood(ModelKind::Poisson, &xi, LikelihoodOptions::default()).unwrap();
        let beta = [-1.0, 0.2, -0.4, 0.3];
        lik.set_beta(&beta);
        let u = influence(
            ModelKind::Poisson,
            Ties::Breslow,
            &x,
            true,
            &beta,
            &[0, 2],
            true,
        );
        for (a, j) in [0usize, 2].into_iter().enumerate() {
            let sum: f64 = (0..x.n_rows()).map(|i| u[i * 2 + a]).sum();
            let g = lik.gradient_hessian(j).0;
            assert!((sum - g).abs() < 1e-10 * (1.0 + g.abs()), "poisson[{j}]");
        }
    }

    /// Clusters: one cluster holding every row gives a zero meat at the optimum's score sum;
    /// clusters of one row each equal no clusters.
    #[test]
    fn clusters_group_contributions() {
        let spec = Spec {
            n: 40,
            p: 2,
            strata: 1,
            weights: false,
            counting: false,
            fine_gray: false,
            offset: false,
        };
        let (recs, covs) = random_records(spec, 3);
        let mut x = build(&recs, &covs);
        let beta = [0.1, 0.2];
        let u = influence(
            ModelKind::Cox,
            Ties::Breslow,
            &x,
            false,
            &beta,
            &[0, 1],
            true,
        );
        let plain = clustered_outer(&x, ModelKind::Cox, &u, 2);
        x.set_clusters((0..40).map(|i| 1000 - i).collect()).unwrap();
        assert_eq!(clustered_outer(&x, ModelKind::Cox, &u, 2), plain);
        x.set_clusters(vec![7; 40]).unwrap();
        let one = clustered_outer(&x, ModelKind::Cox, &u, 2);
        let s: Vec<f64> = (0..2)
            .map(|a| (0..40).map(|i| u[i * 2 + a]).sum())
            .collect();
        for a in 0..2 {
            for b in 0..2 {
                assert!((one[a * 2 + b] - s[a] * s[b]).abs() < 1e-12);
            }
        }
        assert!(x.set_clusters(vec![1; 3]).is_err());
    }
}
