//! Fine–Gray subdistribution hazards.
//!
//! y = 1 is the event of interest, y = 2 a competing event, y = 0 censored. With G(t−) the
//! Kaplan–Meier censoring survival just before t (per stratum, `survfit`'s ties as in
//! `cmprsk::crr`; see [`crate::model::censoring::censoring_weights`], or the supplied
//! `censor_weight` column), the
//! risk set of an event at t holds every row with time ≥ t (weight w e) plus every competing row
//! j with time_j < t, weighted w_j e_j · G(t−)/G(T_j−). Only y = 1 rows are events; ties are
//! handled as in [`crate::model::cox`] (Breslow or Efron). Strata have separate risk sets and a
//! separate G. The log-likelihood contains no constants.
//!
//! | option | default | values |
//! |---|---|---|
//! | `ties` | breslow | breslow, efron |

use super::censoring::censoring_weights;
use super::design::{ColumnSource, DesignMatrix};
use super::risk_set::{RiskSetKind, RiskSetModel};
use super::Ties;
use crate::error::Result;

/// Fine–Gray partial likelihood with strata, weights and offsets.
#[derive(Debug, Clone)]
pub struct FineGray {
    model: RiskSetModel,
}

impl FineGray {
    /// Build the likelihood at β = 0. Errors on y ∉ {0, 1, 2}, counting-process rows, no events,
    /// or a competing row whose G(T−) is 0 where its weight is needed.
    pub fn new(x: &DesignMatrix, ties: Ties) -> Result<Self> {
        Self::from_columns(x, x.column_source(), ties)
    }

    /// [`FineGray::new`] on the rows of `x` and the columns `cols` (`x.columns` is not used).
    pub fn from_columns(x: &DesignMatrix, cols: ColumnSource<'_>, ties: Ties) -> Result<Self> {
        let r = &x.rows;
        let computed;
        let censor: &[f64] = match &r.censor_weight {
            Some(c) => c,
            None => {
                computed = censoring_weights(&r.time.as_f64(), &r.y.as_f64(), &r.stratum.as_u32());
                &computed
            }
        };
        Ok(FineGray {
            model: RiskSetModel::from_columns(x, cols, ties, RiskSetKind::FineGray, Some(censor))?,
        })
    }

    /// [`FineGray::new`] consuming the design matrix (less peak memory).
    pub fn from_owned(mut x: DesignMatrix, ties: Ties) -> Result<Self> {
        let censor = match x.rows.censor_weight.take() {
            Some(c) => c,
            None => censoring_weights(
                &x.rows.time.as_f64(),
                &x.rows.y.as_f64(),
                &x.rows.stratum.as_u32(),
            ),
        };
        Ok(FineGray {
            model: RiskSetModel::from_owned(x, ties, RiskSetKind::FineGray, Some(&censor))?,
        })
    }

    /// The risk-set model inside.
    pub(crate) fn into_model(self) -> RiskSetModel {
        self.model
    }

    /// The likelihood of a risk-set model of its kind, as [`FineGray::into_model`] gave it.
    pub(crate) fn from_model(model: RiskSetModel) -> Self {
        FineGray { model }
    }

    /// Force tiny chunks (tests of the chunked walk).
    #[cfg(test)]
    pub(crate) fn with_min_chunk(mut self, entries: usize) -> Self {
        self.model.set_min_chunk(entries);
        self
    }

    /// Number of event groups (distinct (stratum, event time) pairs with a y = 1 event).
    pub fn n_groups(&self) -> usize {
        self.model.n_groups()
    }
}

delegate_likelihood!(FineGray, model);

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::design::{DesignBuilder, OutcomeRecord};
    use crate::model::risk_set::test_support::{build, exercise, random_records, Spec};
    use crate::model::Likelihood;

    fn spec(strata: u64, weights: bool) -> Spec {
        Spec {
            n: 60,
            p: 4,
            strata,
            weights,
            counting: false,
            fine_gray: true,
            offset: true,
        }
    }

    #[test]
    fn matches_brute_force_breslow_and_efron() {
        let mut seed = 100;
        for ties in [Ties::Breslow, Ties::Efron] {
            for (strata, weights) in [(1, false), (3, true), (1, true), (5, false)] {
                seed += 1;
                let (recs, covs) = random_records(spec(strata, weights), seed);
                let x = build(&recs, &covs);
                let g = censoring_weights(
                    &x.rows.time.as_f64(),
                    &x.rows.y.as_f64(),
                    &x.rows.stratum.as_u32(),
                );
                for min_chunk in [usize::MAX, 3, 1] {
                    let mut fg = FineGray::new(&x, ties).unwrap().with_min_chunk(min_chunk);
                    let what =
                        format!("FG {ties:?} strata={strata} weights={weights} chunk={min_chunk}");
                    exercise(&mut fg, &x, ties, Some(&g), seed * 13, &what);
                }
            }
        }
    }

    /// The sparse sweep gives the same information matrix as the dense per-group sums.
    #[test]
    fn information_sweep_matches_dense() {
        let mut seed = 700;
        for ties in [Ties::Breslow, Ties::Efron] {
            for (strata, weights) in [(1, false), (3, true), (1, true), (5, false)] {
                seed += 1;
                let s = Spec {
                    n: 150,
                    p: 6,
                    ..spec(strata, weights)
                };
                let (recs, covs) = random_records(s, seed);
                let x = build(&recs, &covs);
                let mut fg = FineGray::new(&x, ties).unwrap().with_min_chunk(2);
                fg.set_beta(&[0.3, -0.2, 0.5, 0.1, -0.4, 0.2]);
                fg.update(1, -0.3);
                let cols = [5, 1, 3, 0, 2, 4];
                crate::model::risk_set::test_support::assert_information_paths_agree(
                    &mut fg.model,
                    &cols,
                    &format!("FG {ties:?} strata={strata} weights={weights}"),
                );
            }
        }
    }

    #[test]
    fn supplied_censor_weights_are_used() {
        let (mut recs, covs) = random_records(spec(2, true), 9);
        let x = build(&recs, &covs);
        let g = censoring_weights(
            &x.rows.time.as_f64(),
            &x.rows.y.as_f64(),
            &x.rows.stratum.as_u32(),
        );
        // Supplying the computed weights gives the same likelihood bit for bit.
        let mut supplied = recs.clone();
        for (r, &gi) in supplied.iter_mut().zip(&g) {
            r.censor_weight = Some(gi);
        }
        let xs = build(&supplied, &covs);
        let beta = [0.3, -0.2, 0.5, 0.1];
        let mut a = FineGray::new(&x, Ties::Efron).unwrap();
        let mut b = FineGray::new(&xs, Ties::Efron).unwrap();
        a.set_beta(&beta);
        b.set_beta(&beta);
        assert_eq!(a.log_likelihood().to_bits(), b.log_likelihood().to_bits());
        // Other weights change it, and the brute force agrees.
        let other: Vec<f64> = g
            .iter()
            .enumerate()
            .map(|(i, &gi)| gi * (0.5 + 0.5 * ((i % 3) as f64 / 2.0)))
            .collect();
        for (r, &gi) in recs.iter_mut().zip(&other) {
            r.censor_weight = Some(gi);
        }
        let xo = build(&recs, &covs);
        let mut c = FineGray::new(&xo, Ties::Breslow).unwrap();
        exercise(
            &mut c,
            &xo,
            Ties::Breslow,
            Some(&other),
            5,
            "FG supplied weights",
        );
    }

    #[test]
    fn fdata_likelihood_by_hand_structure() {
        // No covariates: the likelihood at β = 0 with fdata's weights, checked against the
        // brute force (which uses the hand-checked G(T−) of the censoring tests).
        // (time, status, x) of /work/shared/data/reference/finegray_fdata.csv.
        let data: [(f64, f64, f64); 14] = [
            (1.0, 1.0, 5.0),
            (2.0, 2.0, 4.0),
            (3.0, 0.0, 3.0),
            (4.0, 1.0, 1.0),
            (4.0, 0.0, 2.0),
            (4.0, 0.0, 1.0),
            (5.0, 2.0, 1.0),
            (5.0, 1.0, 2.0),
            (6.0, 0.0, 2.0),
            (8.0, 0.0, 4.0),
            (8.0, 2.0, 6.0),
            (9.0, 0.0, 1.0),
            (10.0, 1.0, 2.0),
            (12.0, 0.0, 0.0),
        ];
        let mut b = DesignBuilder::new();
        for (i, &(t, s, xv)) in data.iter().enumerate() {
            b.push_outcome(OutcomeRecord {
                row_id: i as i64,
                time: Some(t),
                y: s,
                ..Default::default()
            });
            b.push_covariate(i as i64, 1, xv);
        }
        let x = b.build().unwrap();
        let g = censoring_weights(
            &x.rows.time.as_f64(),
            &x.rows.y.as_f64(),
            &x.rows.stratum.as_u32(),
        );
        for ties in [Ties::Breslow, Ties::Efron] {
            let mut fg = FineGray::new(&x, ties).unwrap().with_min_chunk(2);
            exercise(&mut fg, &x, ties, Some(&g), 3, "fdata");
        }
    }

    #[test]
    fn zero_censoring_survival_on_a_needed_competing_row_is_an_error() {
        // Computed Kaplan–Meier weights cannot be 0 for a row still at risk, and the builder
        // rejects supplied weights outside (0, 1]; a hand-made matrix can still carry one.
        let mut b = DesignBuilder::new();
        for (i, &(t, y)) in [(1.0, 2.0), (2.0, 1.0), (3.0, 0.0)].iter().enumerate() {
            b.push_outcome(OutcomeRecord {
                row_id: i as i64,
                time: Some(t),
                y,
                censor_weight: Some(1.0),
                ..Default::default()
            });
        }
        let mut x = b.build().unwrap();
        assert!(FineGray::new(&x, Ties::Breslow).is_ok());
        x.rows.censor_weight = Some(vec![0.0, 1.0, 1.0]);
        let e = FineGray::new(&x, Ties::Breslow).unwrap_err().to_string();
        assert!(e.contains("censor_weight") && e.contains("row_id 0"), "{e}");
        // Not needed (no later event): fine.
        x.rows.censor_weight = Some(vec![1.0, 0.0, 1.0]);
        assert!(FineGray::new(&x, Ties::Breslow).is_ok());
        // No events of interest at all.
        x.rows.y = vec![2.0, 0.0, 0.0].into();
        assert!(FineGray::new(&x, Ties::Breslow).is_err());
    }
}

#[cfg(test)]
mod invariance_tests {
    use super::*;
    use crate::model::risk_set::test_support::{build, random_records, Spec};
    use crate::model::Likelihood;

    fn fingerprint(fg: &mut FineGray, beta: &[f64]) -> Vec<u64> {
        fg.set_beta(beta);
        let mut out = vec![fg.log_likelihood().to_bits()];
        fg.update(0, -0.2);
        for j in 0..beta.len() {
            let (g, h) = fg.gradient_hessian(j);
            out.push(g.to_bits());
            out.push(h.to_bits());
        }
        out.extend(fg.information(&[1, 3]).iter().map(|v| v.to_bits()));
        out
    }

    #[test]
    fn row_order_and_thread_count_invariance() {
        let spec = Spec {
            n: 80,
            p: 4,
            strata: 3,
            weights: true,
            counting: false,
            fine_gray: true,
            offset: false,
        };
        for ties in [Ties::Breslow, Ties::Efron] {
            let (mut recs, mut covs) = random_records(spec, 5);
            let beta = [0.1, 0.4, -0.3, 0.2];
            let make =
                |r: &[_], c: &[_]| FineGray::new(&build(r, c), ties).unwrap().with_min_chunk(2);
            let reference = fingerprint(&mut make(&recs, &covs), &beta);
            recs.reverse();
            covs.reverse();
            assert_eq!(
                reference,
                fingerprint(&mut make(&recs, &covs), &beta),
                "{ties:?} row order"
            );
            for threads in 1..=3 {
                let pool = rayon::ThreadPoolBuilder::new()
                    .num_threads(threads)
                    .build()
                    .unwrap();
                let got = pool.install(|| fingerprint(&mut make(&recs, &covs), &beta));
                assert_eq!(reference, got, "{ties:?}: {threads} threads");
            }
        }
    }
}
