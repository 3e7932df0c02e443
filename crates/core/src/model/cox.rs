//! Cox proportional hazards (partial likelihood).
//!
//! With η = xᵀβ + offset, e = exp η and case weights w, the risk set of an event time t in
//! stratum s is every row of s with time ≥ t (and start < t for counting-process (start, stop]
//! rows); censored rows at t are in it. Events tied at t form one group with total weight W_g:
//!
//! * **Breslow** (default, Cyclops): LL = Σ_events w η − Σ_g W_g log S0(g), S0 = Σ_{risk set} w e.
//! * **Efron** (R `survival`'s weighted convention): with d tied events, E0 = Σ_{events} w e and
//!   w̄ = W_g/d, LL = Σ_events w η − Σ_g Σ_{l<d} w̄ log(S0(g) − (l/d)·E0(g)).
//!
//! The log-likelihood contains no constants. Per-coordinate cost is O(G + nnz_j) after an update
//! and O(nnz_j) otherwise (see [`crate::model::risk_set`]).
//!
//! | option | default | values |
//! |---|---|---|
//! | `ties` | breslow | breslow, efron |

use super::design::{ColumnSource, DesignMatrix};
use super::risk_set::{RiskSetKind, RiskSetModel};
use super::Ties;
use crate::error::Result;

/// Cox partial likelihood with strata, weights, offsets and (start, stop] rows.
#[derive(Debug, Clone)]
pub struct Cox {
    model: RiskSetModel,
}

impl Cox {
    /// Build the likelihood at β = 0. Errors on y ∉ {0, 1}, bad weights/times, or no events.
    pub fn new(x: &DesignMatrix, ties: Ties) -> Result<Self> {
        Self::from_columns(x, x.column_source(), ties)
    }

    /// [`Cox::new`] on the rows of `x` and the columns `cols` (`x.columns` is not used).
    pub fn from_columns(x: &DesignMatrix, cols: ColumnSource<'_>, ties: Ties) -> Result<Self> {
        Ok(Cox {
            model: RiskSetModel::from_columns(x, cols, ties, RiskSetKind::Cox, None)?,
        })
    }

    /// [`Cox::new`] consuming the design matrix (less peak memory).
    pub fn from_owned(x: DesignMatrix, ties: Ties) -> Result<Self> {
        Ok(Cox {
            model: RiskSetModel::from_owned(x, ties, RiskSetKind::Cox, None)?,
        })
    }

    /// The risk-set model inside.
    pub(crate) fn into_model(self) -> RiskSetModel {
        self.model
    }

    /// The likelihood of a risk-set model of its kind, as [`Cox::into_model`] gave it.
    pub(crate) fn from_model(model: RiskSetModel) -> Self {
        Cox { model }
    }

    /// Force tiny chunks (tests of the chunked walk).
    #[cfg(test)]
    pub(crate) fn with_min_chunk(mut self, entries: usize) -> Self {
        self.model.set_min_chunk(entries);
        self
    }

    /// Number of event groups (distinct (stratum, event time) pairs).
    pub fn n_groups(&self) -> usize {
        self.model.n_groups()
    }
}

delegate_likelihood!(Cox, model);

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::ccd::{fit, CcdOptions};
    use crate::model::design::{DesignBuilder, OutcomeRecord};
    use crate::model::prior::{Prior, PriorSet};
    use crate::model::risk_set::test_support::{build, exercise, random_records, Spec};
    use crate::model::Likelihood;

    fn spec(strata: u64, weights: bool, counting: bool) -> Spec {
        Spec {
            n: 60,
            p: 4,
            strata,
            weights,
            counting,
            fine_gray: false,
            offset: true,
        }
    }

    #[test]
    fn matches_brute_force_breslow_and_efron() {
        let mut seed = 1;
        for ties in [Ties::Breslow, Ties::Efron] {
            for (strata, weights, counting) in [
                (1, false, false),
                (3, true, false),
                (1, false, true),
                (4, true, true),
            ] {
                seed += 1;
                let (recs, covs) = random_records(spec(strata, weights, counting), seed);
                let x = build(&recs, &covs);
                for min_chunk in [usize::MAX, 3, 1] {
                    let mut cox = Cox::new(&x, ties).unwrap().with_min_chunk(min_chunk);
                    let what = format!("{ties:?} strata={strata} weights={weights} counting={counting} chunk={min_chunk}");
                    exercise(&mut cox, &x, ties, None, seed * 31, &what);
                }
            }
        }
    }

    /// The sparse sweep gives the same information matrix as the dense per-group sums, with
    /// strata, weights, offsets, (start, stop] rows and both tie methods, on several threads.
    #[test]
    fn information_sweep_matches_dense() {
        let mut seed = 500;
        for ties in [Ties::Breslow, Ties::Efron] {
            for (strata, weights, counting) in [
                (1, false, false),
                (3, true, false),
                (1, false, true),
                (4, true, true),
            ] {
                seed += 1;
                let spec = Spec {
                    n: 120,
                    p: 6,
                    ..spec(strata, weights, counting)
                };
                let (recs, covs) = random_records(spec, seed);
                let x = build(&recs, &covs);
                let mut cox = Cox::new(&x, ties).unwrap().with_min_chunk(2);
                cox.set_beta(&[0.3, -0.2, 0.5, 0.1, -0.4, 0.2]);
                cox.update(2, 0.25);
                let cols = [4, 0, 2, 5, 3, 1];
                crate::model::risk_set::test_support::assert_information_paths_agree(
                    &mut cox.model,
                    &cols,
                    &format!("{ties:?} strata={strata} weights={weights} counting={counting}"),
                );
            }
        }
    }

    fn therneau_test1() -> DesignMatrix {
        let time = [1.0, 1.0, 6.0, 6.0, 8.0, 9.0];
        let status = [1.0, 0.0, 1.0, 1.0, 0.0, 1.0];
        let xv = [1.0, 1.0, 1.0, 0.0, 0.0, 0.0];
        let mut b = DesignBuilder::new();
        for i in 0..6 {
            b.push_outcome(OutcomeRecord {
                row_id: i as i64,
                time: Some(time[i]),
                y: status[i],
                ..Default::default()
            });
            b.push_covariate(i as i64, 1, xv[i]);
        }
        b.build().unwrap()
    }

    /// Therneau's test 1 (survival's validation document). Efron's LL(β̂) computed by hand:
    /// β̂ − log(3e^β̂ + 3) + β̂ − log(e^β̂ + 3) − log((e^β̂ + 3) − (e^β̂ + 1)/2) = −3.35897484.
    #[test]
    fn therneau_test1_by_hand() {
        let x = therneau_test1();
        for (ties, bhat, ll_hat, ll0) in [
            (Ties::Breslow, 1.475285, -3.824750, -4.564348),
            (Ties::Efron, 1.676857, -3.358975, -4.276666),
        ] {
            let mut cox = Cox::new(&x, ties).unwrap();
            assert!(
                (cox.log_likelihood() - ll0).abs() < 1e-6,
                "{ties:?} LL(0) {}",
                cox.log_likelihood()
            );
            let opts = CcdOptions {
                tolerance: 1e-12,
                ..Default::default()
            };
            let r = fit(
                &mut cox,
                &PriorSet::new(Prior::None, &[false]),
                &[0.0],
                None,
                &opts,
            )
            .unwrap();
            assert!(
                (r.beta[0] - bhat).abs() < 1e-5,
                "{ties:?} beta {}",
                r.beta[0]
            );
            assert!(
                (r.log_likelihood - ll_hat).abs() < 1e-6,
                "{ties:?} LL {}",
                r.log_likelihood
            );
            assert!(cox.gradient_hessian(0).0.abs() < 1e-7);
        }
    }

    /// Everything the fit sees, as bits.
    fn fingerprint(cox: &mut Cox, beta: &[f64]) -> Vec<u64> {
        cox.set_beta(beta);
        let mut out = vec![cox.log_likelihood().to_bits()];
        for j in 0..beta.len() {
            let (g, h) = cox.gradient_hessian(j);
            out.push(g.to_bits());
            out.push(h.to_bits());
        }
        cox.update(1, 0.3);
        for j in 0..beta.len() {
            let (g, h) = cox.gradient_hessian(j);
            out.push(g.to_bits());
            out.push(h.to_bits());
        }
        out.extend(cox.information(&[0, 2]).iter().map(|v| v.to_bits()));
        out
    }

    #[test]
    fn row_order_and_thread_count_invariance() {
        for (ties, counting) in [
            (Ties::Breslow, true),
            (Ties::Efron, true),
            (Ties::Breslow, false),
            (Ties::Efron, false),
        ] {
            let (mut recs, mut covs) = random_records(spec(3, true, counting), 77);
            let beta = [0.2, -0.4, 0.1, 0.3];
            // Tiny chunks so that the parallel walk really runs on several threads.
            let make = |recs: &[OutcomeRecord], covs: &[(i64, i64, f64)]| {
                Cox::new(&build(recs, covs), ties)
                    .unwrap()
                    .with_min_chunk(2)
            };
            let reference = fingerprint(&mut make(&recs, &covs), &beta);
            recs.reverse();
            covs.reverse();
            recs.swap(3, 17);
            let shuffled = fingerprint(&mut make(&recs, &covs), &beta);
            assert_eq!(
                reference, shuffled,
                "{ties:?}: row order changed the results"
            );
            for threads in 1..=3 {
                let pool = rayon::ThreadPoolBuilder::new()
                    .num_threads(threads)
                    .build()
                    .unwrap();
                let got = pool.install(|| fingerprint(&mut make(&recs, &covs), &beta));
                assert_eq!(
                    reference, got,
                    "{ties:?}: {threads} threads changed the results"
                );
            }
        }
    }

    #[test]
    fn unusable_data_is_an_error() {
        let mut b = DesignBuilder::new();
        b.push_outcome(OutcomeRecord {
            row_id: 1,
            time: Some(1.0),
            y: 0.0,
            ..Default::default()
        });
        let x = b.build().unwrap();
        assert!(Cox::new(&x, Ties::Breslow).is_err());
        let mut b = DesignBuilder::new();
        b.push_outcome(OutcomeRecord {
            row_id: 1,
            time: Some(1.0),
            y: 2.0,
            ..Default::default()
        });
        assert!(Cox::new(&b.build().unwrap(), Ties::Breslow).is_err());
    }
}
