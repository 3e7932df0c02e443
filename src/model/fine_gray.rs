//! Fine–Gray subdistribution hazards.
//!
//! y = 1 is the event of interest, y = 2 a competing event, y = 0 censored. With G(t−) the
//! Kaplan–Meier censoring survival just before t (per stratum; see
//! [`crate::model::censoring::censoring_weights`], or the supplied `censor_weight` column), the
//! risk set of an event at t holds every row with time ≥ t (weight w e) plus every competing row
//! j with time_j < t, weighted w_j e_j · G(t−)/G(T_j−). Only y = 1 rows are events; ties are
//! handled as in [`crate::model::cox`] (Breslow or Efron). Strata have separate risk sets and a
//! separate G. The log-likelihood contains no constants.
//!
//! | option | default | values |
//! |---|---|---|
//! | `ties` | breslow | breslow, efron |

use super::censoring::censoring_weights;
use super::design::DesignMatrix;
use super::risk_set::{RiskSetKind, RiskSetModel};
use super::{Likelihood, Ties};
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
        let r = &x.rows;
        let computed;
        let censor: &[f64] = match &r.censor_weight {
            Some(c) => c,
            None => {
                computed = censoring_weights(&r.time, &r.y, &r.stratum);
                &computed
            }
        };
        Ok(FineGray {
            model: RiskSetModel::new(x, ties, RiskSetKind::FineGray, Some(censor))?,
        })
    }

    /// Number of event groups (distinct (stratum, event time) pairs with a y = 1 event).
    pub fn n_groups(&self) -> usize {
        self.model.n_groups()
    }
}

impl Likelihood for FineGray {
    fn n_coef(&self) -> usize {
        self.model.n_coef()
    }
    fn set_beta(&mut self, beta: &[f64]) {
        self.model.set_beta(beta)
    }
    fn log_likelihood(&mut self) -> f64 {
        self.model.log_likelihood()
    }
    fn gradient_hessian(&mut self, j: usize) -> (f64, f64) {
        self.model.gradient_hessian(j)
    }
    fn update(&mut self, j: usize, delta: f64) {
        self.model.update(j, delta)
    }
    fn information(&mut self, cols: &[usize]) -> Vec<f64> {
        self.model.information(cols)
    }
    fn boxed_clone(&self) -> Box<dyn Likelihood> {
        Box::new(self.clone())
    }
}
