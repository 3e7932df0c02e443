//! Degenerate fits: data without information, unidentifiable (aliased or constant) columns, and
//! coefficients whose maximum-likelihood estimate is infinite.
//!
//! Only **unpenalized** coefficients (no prior, the intercept, `exclude`d ids) are concerned:
//! with a proper prior (Laplace, Normal) the objective LL − penalty has a finite optimum and its
//! coefficients are identified, so penalized columns are never dropped or flagged here.
//!
//! **Zero information is an error** ([`check_information`]): every row weight 0; no event
//! (a row with y = 1 and a positive weight) for Cox, Fine–Gray and conditional logistic
//! regression; no case (y > 0 with a positive weight) for SCCS. The likelihood is then constant
//! in β and no estimate means anything.
//!
//! **Aliased and constant columns** ([`find_aliased`]), before the fit, on the unpenalized block
//! U (at most [`MAX_CHECKED_BLOCK`] columns; beyond it only the structural checks run):
//!
//! 1. structural checks on the design ([`column_facts`]): a column that is 0 in every row, and,
//!    for the conditional models (Cox, Fine–Gray, SCCS, conditional logistic: the likelihood
//!    compares rows within a stratum only), a column constant within every stratum;
//! 2. an **ordered Cholesky** factorization of the observed information I_UU at β = 0, columns
//!    in fit order (intercept first, then by covariate id), as R's `lm`/`glm` QR keeps the first
//!    of collinear columns and reports the later ones as `NA`. Column a is dropped when its
//!    information is not positive (it enters no term of the likelihood), or when the part of it
//!    not explained by the kept earlier columns — the Schur complement
//!    d_a = I_aa − I_aK I_KK⁻¹ I_Ka — is at most [`ALIAS_TOLERANCE`] · I_aa, i.e. when 1 − R² of
//!    the column on the kept ones (in the information metric) is below 1e-10. R uses 1e-7 on
//!    the QR diagonal of the design (1e-14 on this squared scale) for `glm` and
//!    ε^¾ ≈ 1.8e-12 on the information for `coxph`; 1e-10 is safely above the rounding of exact
//!    copies (≈ 1e-15) and far below any column that a model can estimate (a relative
//!    variance inflation of 1e10). The information's null space does not depend on β while β
//!    is finite (every weight and risk-set probability is positive), so β = 0 is as good as any
//!    point and is where the fit starts anyway.
//!
//! The dropped columns are held at 0 during the fit (and in profile refits), get no standard
//! error or interval, and are named in the result's notes; the other coefficients keep their
//! standard errors (the information is inverted over the kept columns only).
//!
//! **No finite maximum** ([`diverging`]), after the fit: separation in logistic regression,
//! monotone likelihood in Cox / Fine–Gray, an all-zero outcome for logistic or Poisson
//! regression. There the likelihood increases towards a finite supremum along a direction d
//! ("to infinity"), its curvature along d vanishes, and Newton–Raphson "converges" because its
//! decrement √(gᵀI⁻¹g) ~ e^{−|η|/2} vanishes too, at |η| ≈ 30 — estimates like 34 ± 2000.
//! The signature is that the next Newton step Δ = I⁻¹g at the returned β̂ is still of order 1
//! on the scale of the linear predictor (at a finite optimum it is O(δ²), quadratically small),
//! and that the objective does not decrease along it: at a finite optimum moving the linear
//! predictor by [`RAY_ETA`] = 10 units costs about ½(10/SE_η)² of log-likelihood, which is
//! large for any estimable coefficient. The check, on the unpenalized free columns U:
//!
//! 1. skipped when Σ_{j∈U} |β̂_j|·s_j ≤ [`SUSPECT_ETA`] (s_j = max_i |x_ij|): a divergent
//!    direction has |η| ≳ 25 where the solver stops, so nothing can be infinite;
//! 2. the Newton direction: Δ on U, restricted to the columns whose move |Δ_j|·s_j on the
//!    linear predictor is at least 1% of the largest; when it is an ascent direction and
//!    f(β̂ + tΔ) ≥ f(β̂) − ρ with t scaling the largest move to 10 units of η (ρ the
//!    objective's rounding level, 1000·ε·(1 + |f|), as in the Newton block), those columns
//!    have no finite estimate;
//! 3. otherwise each column with |β̂_j|·s_j > [`SUSPECT_ETA`] alone: β̂_j moved by 10/s_j
//!    further from 0; if f does not drop, j has no finite estimate (this catches a divergence
//!    whose information collapsed so far that the Newton step is regularized away).
//!
//! The flagged coefficients are then halved while the objective stays within ρ ([`pull_back`]):
//! a Newton step along a collapsed curvature can run them to hundreds, where exp(η)² overflows.
//!
//! Flagged fits report [`crate::model::ccd::FitStatus::NoFiniteMle`] (R's `glm` warns
//! "fitted probabilities numerically 0 or 1 occurred", `coxph` "Loglik converged before
//! variable j; coefficient may be infinite"). The flagged coefficients are where the optimizer
//! stopped, not estimates; they get no standard error or interval. The other coefficients are
//! their maximum given the flagged ones (R reports the same numbers) and their standard errors
//! are conditional on the flagged ones.

use super::design::{ColumnLabel, DesignMatrix, INTERCEPT_ID};
use super::newton;
use super::prior::PriorSet;
use super::{Likelihood, ModelKind};
use crate::error::{Error, Result};

/// Relative tolerance of the ordered Cholesky: column a is aliased when its Schur complement is
/// at most this fraction of its own information (module docs).
pub const ALIAS_TOLERANCE: f64 = 1e-10;
/// Largest unpenalized block on which the information-based checks (aliasing, divergence) run:
/// the size up to which the solver's Newton block factors the same matrix every iteration.
pub const MAX_CHECKED_BLOCK: usize = 500;
/// Below this total |β̂_j|·max|x_j| over the unpenalized columns no coefficient can be diverging.
pub const SUSPECT_ETA: f64 = 5.0;
/// How far (in units of the linear predictor) the divergence check moves along a direction.
pub const RAY_ETA: f64 = 10.0;
/// The objective's rounding level, in units of ε·(1 + |f|) (as the Newton block's).
const NOISE_ULPS: f64 = 1000.0;

/// Refuse data whose likelihood carries no information about any coefficient (module docs),
/// after the model's own row checks ([`ModelKind::check_rows`]: a value outside the model's
/// domain is the better message). Errors are [`Error::Empty`].
pub fn check_information(kind: ModelKind, x: &DesignMatrix) -> Result<()> {
    kind.check_rows(x)?;
    check_information_of(kind, x, &|_| true)
}

/// [`check_information`] on the rows `i` of `x` with `keep(i)` (a fold of cross-validation),
/// without the row checks (run them once on `x`).
pub fn check_information_of(
    kind: ModelKind,
    x: &DesignMatrix,
    keep: &(dyn Fn(usize) -> bool + Sync),
) -> Result<()> {
    let rows = || (0..x.n_rows()).filter(|&i| keep(i));
    if let Some(w) = &x.rows.weight {
        if rows().all(|i| w[i] == 0.0) {
            // Counted only here: the scans below stop at the first row that passes.
            let n = rows().count();
            return Err(Error::Empty(format!(
                "{}: all {n} row weights are 0, so the data carry no information",
                kind.name()
            )));
        }
    }
    let y = &x.rows.y;
    let has = |f: &dyn Fn(f64) -> bool| rows().any(|i| f(y.get(i)));
    let has_weighted = |f: &dyn Fn(f64) -> bool| rows().any(|i| f(y.get(i)) && x.weight(i) > 0.0);
    let zero_weight = " (every such row has weight 0)";
    match kind {
        ModelKind::Cox | ModelKind::FineGray | ModelKind::ConditionalLogistic => {
            let event = |v: f64| v == 1.0;
            if !has_weighted(&event) {
                return Err(Error::Empty(format!(
                    "{}: no events (y = 1) in the data{}",
                    kind.name(),
                    if has(&event) { zero_weight } else { "" }
                )));
            }
        }
        ModelKind::ConditionalPoisson => {
            let case = |v: f64| v > 0.0;
            if !has_weighted(&case) {
                return Err(Error::Empty(format!(
                    "{}: no cases: no stratum has an event (all n_s = 0){}",
                    kind.name(),
                    if has(&case) { zero_weight } else { "" }
                )));
            }
        }
        ModelKind::Logistic | ModelKind::Poisson => {}
    }
    Ok(())
}

/// Why a column carries no information, from the design alone.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Structural {
    /// 0 in every row.
    AllZero,
    /// Constant within every stratum (conditional models).
    ConstantInStrata,
}

/// What the degeneracy checks need to know about one column of the design.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ColumnFacts {
    /// max_i |x_ij|: the largest move of the linear predictor per unit of β_j.
    pub scale: f64,
    /// A structural reason for no information, if any.
    pub structural: Option<Structural>,
}

impl ColumnFacts {
    /// The intercept's facts.
    pub fn intercept() -> Self {
        ColumnFacts {
            scale: 1.0,
            structural: None,
        }
    }
}

/// [`ColumnFacts`] of every column of `x` (intercept included when `x` has one); columns for
/// which `wanted(id)` is false (penalized ones) are not examined (scale 1, no structural
/// finding). O(nnz + strata) per examined column.
pub fn column_facts(
    kind: ModelKind,
    x: &DesignMatrix,
    wanted: impl Fn(i64) -> bool,
) -> Vec<ColumnFacts> {
    let conditional = matches!(
        kind,
        ModelKind::Cox
            | ModelKind::FineGray
            | ModelKind::ConditionalPoisson
            | ModelKind::ConditionalLogistic
    );
    let n_strata = x.n_strata();
    let size = if conditional {
        x.rows.stratum.sizes(n_strata)
    } else {
        vec![0u32; n_strata]
    };
    // Per stratum: the column this slot was last used for, the first non-zero value, the count
    // of non-zero values and whether they differ.
    let mut stamp = vec![usize::MAX; n_strata];
    let mut value = vec![0.0f64; n_strata];
    let mut count = vec![0u32; n_strata];
    let mut mixed = vec![false; n_strata];
    let mut touched: Vec<u32> = Vec::new();
    x.columns
        .iter()
        .enumerate()
        .map(|(j, c)| {
            if c.id == INTERCEPT_ID {
                return ColumnFacts::intercept();
            }
            if !wanted(c.id) {
                return ColumnFacts {
                    scale: 1.0,
                    structural: None,
                };
            }
            let mut scale = 0.0f64;
            touched.clear();
            // A column's entries come in increasing row order.
            let mut strata = x.rows.stratum.cursor();
            for (i, v) in c.entries() {
                if v == 0.0 {
                    continue;
                }
                scale = scale.max(v.abs());
                if conditional {
                    let s = strata.get(i) as usize;
                    if stamp[s] != j {
                        stamp[s] = j;
                        value[s] = v;
                        count[s] = 0;
                        mixed[s] = false;
                        touched.push(s as u32);
                    }
                    count[s] += 1;
                    mixed[s] |= v != value[s];
                }
            }
            let structural = if scale == 0.0 {
                Some(Structural::AllZero)
            } else if conditional
                && touched.iter().all(|&s| {
                    let s = s as usize;
                    !mixed[s] && count[s] == size[s]
                })
            {
                Some(Structural::ConstantInStrata)
            } else {
                None
            };
            ColumnFacts {
                scale: if scale > 0.0 { scale } else { 1.0 },
                structural,
            }
        })
        .collect()
}

/// Why an unpenalized column was left out of the fit.
#[derive(Debug, Clone, PartialEq)]
pub enum AliasReason {
    /// A structural finding on the design.
    Structural(Structural),
    /// Its observed information is 0: it enters no term of the likelihood.
    NoInformation,
    /// (Nearly) a linear combination of these earlier kept columns (fit indices).
    Combination(Vec<usize>),
}

/// One column left out of the fit.
#[derive(Debug, Clone, PartialEq)]
pub struct Alias {
    /// Fit index of the column.
    pub j: usize,
    /// Why.
    pub reason: AliasReason,
}

/// The aliased and constant columns among the unpenalized `cols` (fit indices, in fit order)
/// of the likelihood `lik` (module docs). The likelihood is left at β = 0.
pub fn find_aliased(lik: &mut dyn Likelihood, cols: &[usize], facts: &[ColumnFacts]) -> Vec<Alias> {
    let mut out: Vec<Alias> = Vec::new();
    let mut rest = Vec::with_capacity(cols.len());
    for &j in cols {
        match facts.get(j).and_then(|f| f.structural) {
            Some(s) => out.push(Alias {
                j,
                reason: AliasReason::Structural(s),
            }),
            None => rest.push(j),
        }
    }
    if rest.is_empty() || rest.len() > MAX_CHECKED_BLOCK {
        return out;
    }
    lik.set_beta(&vec![0.0; lik.n_coef()]);
    let k = rest.len();
    let info = lik.information(&rest);
    if info.iter().any(|v| !v.is_finite()) {
        return out;
    }
    // Ordered Cholesky: rows of L for the kept columns only.
    let mut kept: Vec<usize> = Vec::new(); // positions in `rest`
    let mut l: Vec<Vec<f64>> = Vec::new(); // l[r][c]: row r of L over kept columns 0..=r
    for a in 0..k {
        let iaa = info[a * k + a];
        if iaa <= 0.0 {
            out.push(Alias {
                j: rest[a],
                reason: AliasReason::NoInformation,
            });
            continue;
        }
        // Row a of L against the kept columns.
        let mut row = Vec::with_capacity(kept.len() + 1);
        for (c, &b) in kept.iter().enumerate() {
            let mut s = info[a * k + b];
            for m in 0..c {
                s -= row[m] * l[c][m];
            }
            row.push(s / l[c][c]);
        }
        let d = iaa - row.iter().map(|v| v * v).sum::<f64>();
        if d <= ALIAS_TOLERANCE * iaa {
            // The combination: solve L_Kᵀ c = row (c = I_KK⁻¹ I_Ka); name the kept columns that
            // contribute (|c_b|·√I_bb ≥ 1e-6·√I_aa).
            let m = kept.len();
            let mut coef = row.clone();
            for r in (0..m).rev() {
                let mut s = coef[r];
                for q in r + 1..m {
                    s -= l[q][r] * coef[q];
                }
                coef[r] = s / l[r][r];
            }
            let with: Vec<usize> = kept
                .iter()
                .zip(&coef)
                .filter(|(&b, &cb)| cb.abs() * info[b * k + b].sqrt() >= 1e-6 * iaa.sqrt())
                .map(|(&b, _)| rest[b])
                .collect();
            out.push(Alias {
                j: rest[a],
                reason: AliasReason::Combination(with),
            });
            continue;
        }
        row.push(d.sqrt());
        l.push(row);
        kept.push(a);
    }
    out.sort_by_key(|a| a.j);
    out
}

/// The coefficients among `cols` (fit indices of the free unpenalized coefficients) that have no
/// finite maximum-likelihood estimate at the fit's `beta` (module docs), by increasing index.
/// `scale[j]` is [`ColumnFacts::scale`]. The likelihood is left at `beta`.
pub fn diverging(
    lik: &mut dyn Likelihood,
    priors: &PriorSet,
    beta: &[f64],
    cols: &[usize],
    scale: &[f64],
) -> Vec<usize> {
    let k = cols.len();
    if k == 0 || k > MAX_CHECKED_BLOCK {
        return Vec::new();
    }
    let eta: f64 = cols.iter().map(|&j| beta[j].abs() * scale[j]).sum();
    if eta.is_nan() || eta <= SUSPECT_ETA {
        return Vec::new();
    }
    lik.set_beta(beta);
    let f0 = lik.log_likelihood() + priors.log_prior(beta);
    if !f0.is_finite() {
        return Vec::new();
    }
    let noise = NOISE_ULPS * f64::EPSILON * (1.0 + f0.abs());
    // The objective at β̂ + moves on `cols` (likelihood put back at β̂).
    let objective_at = |lik: &mut dyn Likelihood, moves: &[(usize, f64)]| {
        let mut trial = beta.to_vec();
        for &(j, d) in moves {
            trial[j] += d;
        }
        lik.set_beta(&trial);
        let f = lik.log_likelihood() + priors.log_prior(&trial);
        lik.set_beta(beta);
        f
    };
    // 2. The Newton direction.
    let g: Vec<f64> = cols.iter().map(|&j| lik.gradient_hessian(j).0).collect();
    let h = lik.information(cols);
    if g.iter().chain(&h).all(|v| v.is_finite()) {
        if let Some(l) = newton::factor(&h, k) {
            let delta = newton::cholesky_solve(&l, k, &g);
            let moves: Vec<f64> = cols
                .iter()
                .zip(&delta)
                .map(|(&j, d)| d.abs() * scale[j])
                .collect();
            let top = moves.iter().copied().fold(0.0, f64::max);
            if top > 0.0 && top.is_finite() {
                let t = RAY_ETA / top;
                let chosen: Vec<usize> = (0..k).filter(|&a| moves[a] >= 0.01 * top).collect();
                let ascent: f64 = chosen.iter().map(|&a| g[a] * delta[a]).sum();
                if ascent > 0.0 {
                    let ray: Vec<(usize, f64)> =
                        chosen.iter().map(|&a| (cols[a], t * delta[a])).collect();
                    let f = objective_at(lik, &ray);
                    if f.is_finite() && f >= f0 - noise {
                        return chosen.iter().map(|&a| cols[a]).collect();
                    }
                }
            }
        }
    }
    // 3. One coordinate at a time.
    cols.iter()
        .copied()
        .filter(|&j| beta[j].abs() * scale[j] > SUSPECT_ETA)
        .filter(|&j| {
            let f = objective_at(lik, &[(j, beta[j].signum() * RAY_ETA / scale[j])]);
            f.is_finite() && f >= f0 - noise
        })
        .collect()
}

/// Move the diverging coefficients `cols` (from [`diverging`]) back towards 0 along their own
/// direction — β_C ← β_C / 2, repeatedly — while the objective stays within its rounding level
/// ρ of the objective at `beta`. Along a direction to infinity the likelihood is flat there, so
/// nothing measurable changes, but the coefficients stay far from overflow: a Newton step along
/// a collapsed curvature can run a coefficient to hundreds, where exp(η) squared overflows and
/// no standard error of the other coefficients could be computed. Returns the log-likelihood at
/// the returned `beta`; the likelihood is left there.
pub fn pull_back(
    lik: &mut dyn Likelihood,
    priors: &PriorSet,
    beta: &mut [f64],
    cols: &[usize],
) -> f64 {
    lik.set_beta(beta);
    let ll0 = lik.log_likelihood();
    let f0 = ll0 + priors.log_prior(beta);
    let noise = NOISE_ULPS * f64::EPSILON * (1.0 + f0.abs());
    let mut ll = ll0;
    for _ in 0..64 {
        let mut trial = beta.to_vec();
        for &j in cols {
            trial[j] *= 0.5;
        }
        lik.set_beta(&trial);
        let ll_t = lik.log_likelihood();
        let f = ll_t + priors.log_prior(&trial);
        if !(f.is_finite() && f >= f0 - noise) {
            break;
        }
        beta.copy_from_slice(&trial);
        ll = ll_t;
    }
    lik.set_beta(beta);
    ll
}

/// How notes name a column: `name (covariate id)`, `covariate id` when it has no name, or
/// `(Intercept)`.
pub fn describe(label: &ColumnLabel) -> String {
    if label.id == INTERCEPT_ID {
        "(Intercept)".into()
    } else if label.name == label.id.to_string() {
        format!("covariate {}", label.id)
    } else {
        format!("{} (covariate {})", label.name, label.id)
    }
}

/// The note for one column left out of the fit (R reports these coefficients as `NA`).
pub fn alias_note(a: &Alias, labels: &[ColumnLabel], kind: ModelKind) -> String {
    let who = describe(&labels[a.j]);
    let why = match &a.reason {
        AliasReason::Structural(Structural::AllZero) => "is 0 in every row".to_string(),
        AliasReason::Structural(Structural::ConstantInStrata) => {
            if kind == ModelKind::ConditionalPoisson {
                "is constant within every case (stratum)".to_string()
            } else {
                "is constant within every stratum".to_string()
            }
        }
        AliasReason::NoInformation => {
            "has no information (it varies only in rows that do not enter the likelihood)"
                .to_string()
        }
        AliasReason::Combination(with) if with.is_empty() => {
            "is (nearly) a linear combination of earlier columns".to_string()
        }
        AliasReason::Combination(with) => format!(
            "is (nearly) a linear combination of {}",
            with.iter()
                .map(|&b| describe(&labels[b]))
                .collect::<Vec<_>>()
                .join(", ")
        ),
    };
    let what = if matches!(a.reason, AliasReason::Combination(_)) {
        "aliased"
    } else {
        "no information"
    };
    format!(
        "{what}: {who} {why}; its coefficient is not identifiable and was fixed at 0, with no \
         standard error or interval (R: NA)"
    )
}

/// The note for coefficients with no finite estimate.
pub fn diverging_note(js: &[usize], beta: &[f64], labels: &[ColumnLabel]) -> String {
    let list = js
        .iter()
        .map(|&j| {
            format!(
                "{} → {}∞",
                describe(&labels[j]),
                if beta[j] < 0.0 { "−" } else { "+" }
            )
        })
        .collect::<Vec<_>>()
        .join(", ");
    format!(
        "no finite MLE: the likelihood keeps increasing as {list} (separation or monotone \
         likelihood; coefficient may be infinite): these estimates are where the optimizer \
         stopped and have no standard error or interval; the others are conditional on them"
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::design::{DesignBuilder, OutcomeRecord};

    #[test]
    fn structural_facts() {
        // Two strata of 3 rows: column 1 constant (2) in stratum 0 and 0 in stratum 1; column 2
        // varies; column 3 is absent (all zero) but named; column 4 is 5 in every row.
        let mut b = DesignBuilder::new();
        for i in 0..6i64 {
            b.push_outcome(OutcomeRecord {
                row_id: i,
                stratum_id: Some(i / 3),
                time: Some(1.0 + i as f64),
                y: (i % 2) as f64,
                ..Default::default()
            });
            if i < 3 {
                b.push_covariate(i, 1, 2.0);
            }
            b.push_covariate(i, 2, i as f64);
            b.push_covariate(i, 3, 0.0);
            b.push_covariate(i, 4, 5.0);
        }
        let x = b.build().unwrap();
        let f = column_facts(ModelKind::Cox, &x, |_| true);
        let s: Vec<_> = f.iter().map(|c| c.structural).collect();
        assert_eq!(
            s,
            [
                Some(Structural::ConstantInStrata),
                None,
                Some(Structural::AllZero),
                Some(Structural::ConstantInStrata)
            ]
        );
        assert_eq!(f[1].scale, 5.0);
        // For logistic regression only the all-zero column is structural (the intercept
        // catches constants).
        let f = column_facts(ModelKind::Logistic, &x, |_| true);
        let s: Vec<_> = f.iter().map(|c| c.structural).collect();
        assert_eq!(s, [None, None, Some(Structural::AllZero), None]);
        // Penalized columns are not examined.
        let f = column_facts(ModelKind::Cox, &x, |id| id != 3);
        assert_eq!(f[2].structural, None);
    }
}
