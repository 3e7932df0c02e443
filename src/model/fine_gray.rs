//! Placeholder: being written.
use super::design::DesignMatrix;
use super::{Likelihood, Ties};
use crate::error::{Error, Result};

/// Placeholder.
#[derive(Clone)]
pub struct FineGray;

impl FineGray {
    /// Placeholder.
    pub fn new(_x: &DesignMatrix, _ties: Ties) -> Result<Self> {
        Err(Error::FitFailed("not implemented yet".into()))
    }
}

impl Likelihood for FineGray {
    fn n_coef(&self) -> usize {
        0
    }
    fn set_beta(&mut self, _beta: &[f64]) {}
    fn log_likelihood(&mut self) -> f64 {
        0.0
    }
    fn gradient_hessian(&mut self, _j: usize) -> (f64, f64) {
        (0.0, 0.0)
    }
    fn update(&mut self, _j: usize, _delta: f64) {}
    fn information(&mut self, _cols: &[usize]) -> Vec<f64> {
        Vec::new()
    }
    fn boxed_clone(&self) -> Box<dyn Likelihood> {
        Box::new(self.clone())
    }
}
