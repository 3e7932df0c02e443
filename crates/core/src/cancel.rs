//! Cancellation of running fits.
//!
//! A [`CancelToken`] travels in [`crate::model::ccd::CcdOptions`] (so in every fit, CV fold,
//! bootstrap replicate and profile bound that uses them); the CCD loop checks it once per
//! cycle and the fit returns [`Error::Cancelled`]. The SQL layer cancels the token when a
//! query's stream is dropped (Ctrl-C in the shell, a client that goes away), so the work stops
//! instead of running on in a blocking thread.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use crate::error::{Error, Result};

/// A shared flag; the default token is never cancelled.
#[derive(Debug, Clone, Default)]
pub struct CancelToken(Option<Arc<AtomicBool>>);

impl CancelToken {
    /// A token that [`CancelToken::cancel`] can trip.
    pub fn new() -> Self {
        CancelToken(Some(Arc::new(AtomicBool::new(false))))
    }

    /// Ask every holder to stop.
    pub fn cancel(&self) {
        if let Some(flag) = &self.0 {
            flag.store(true, Ordering::Relaxed);
        }
    }

    /// Whether [`CancelToken::cancel`] was called.
    pub fn is_cancelled(&self) -> bool {
        self.0.as_ref().is_some_and(|f| f.load(Ordering::Relaxed))
    }

    /// `Err(Error::Cancelled)` once cancelled.
    pub fn check(&self) -> Result<()> {
        if self.is_cancelled() {
            Err(Error::Cancelled)
        } else {
            Ok(())
        }
    }

    /// A guard that cancels this token when dropped (hold it in the future whose drop means
    /// "the caller is gone").
    pub fn cancel_on_drop(&self) -> CancelOnDrop {
        CancelOnDrop(self.clone())
    }
}

/// Cancels its token when dropped.
#[derive(Debug)]
pub struct CancelOnDrop(CancelToken);

impl Drop for CancelOnDrop {
    fn drop(&mut self) {
        self.0.cancel();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn default_is_never_cancelled_and_guards_cancel() {
        let never = CancelToken::default();
        never.cancel();
        assert!(!never.is_cancelled() && never.check().is_ok());
        let t = CancelToken::new();
        assert!(!t.is_cancelled());
        drop(t.cancel_on_drop());
        assert!(t.is_cancelled());
        assert!(matches!(t.check(), Err(Error::Cancelled)));
    }

    /// A likelihood that cancels `token` at its `after`-th coordinate evaluation (a caller
    /// going away in the middle of a fit, deterministically).
    struct CancelsMidway {
        inner: Box<dyn crate::model::Likelihood>,
        token: CancelToken,
        after: usize,
        calls: usize,
    }

    impl crate::model::Likelihood for CancelsMidway {
        fn n_coef(&self) -> usize {
            self.inner.n_coef()
        }
        fn set_beta(&mut self, beta: &[f64]) {
            self.inner.set_beta(beta)
        }
        fn log_likelihood(&mut self) -> f64 {
            self.inner.log_likelihood()
        }
        fn gradient_hessian(&mut self, j: usize) -> (f64, f64) {
            self.calls += 1;
            if self.calls == self.after {
                self.token.cancel();
            }
            self.inner.gradient_hessian(j)
        }
        fn update(&mut self, j: usize, delta: f64) {
            self.inner.update(j, delta)
        }
        fn information(&mut self, cols: &[usize]) -> Vec<f64> {
            self.inner.information(cols)
        }
        fn boxed_clone(&self) -> Box<dyn crate::model::Likelihood> {
            unreachable!("not cloned in this test")
        }
    }

    /// A fit cancelled in its third coordinate evaluation returns `Error::Cancelled` (not a
    /// result), after at most the cycle it was in.
    #[test]
    fn a_running_fit_stops_when_cancelled() {
        use crate::model::ccd::{self, CcdOptions, Convergence};
        use crate::model::design::{DesignBuilder, OutcomeRecord};
        use crate::model::prior::{Prior, PriorSet};
        use crate::model::{cpu_likelihood, LikelihoodOptions, ModelKind};
        let mut b = DesignBuilder::new();
        for i in 0..40i64 {
            b.push_outcome(OutcomeRecord {
                row_id: i,
                time: Some(1.0 + (i * 7 % 13) as f64),
                y: f64::from(i % 3 == 0),
                ..Default::default()
            });
            b.push_covariate(i, 1, (i % 5) as f64);
            b.push_covariate(i, 2, (i % 2) as f64);
        }
        let x = b.build().unwrap();
        let token = CancelToken::new();
        let opts = CcdOptions {
            convergence: Convergence::Gradient,
            tolerance: 1e-300,
            max_iterations: 1_000_000,
            cancel: token.clone(),
            ..Default::default()
        };
        let priors = PriorSet::new(Prior::None, &[false, false]);
        let mut lik = CancelsMidway {
            inner: cpu_likelihood(ModelKind::Cox, &x, LikelihoodOptions::default()).unwrap(),
            token: token.clone(),
            after: 3,
            calls: 0,
        };
        let r = ccd::fit(&mut lik, &priors, &[0.0, 0.0], None, &opts);
        assert!(matches!(r, Err(Error::Cancelled)), "{r:?}");
        assert!(
            lik.calls <= 4,
            "stopped within its cycle ({} evaluations)",
            lik.calls
        );
        // The same fit without the cancellation runs to its end.
        let mut lik = cpu_likelihood(ModelKind::Cox, &x, LikelihoodOptions::default()).unwrap();
        let done = ccd::fit(
            lik.as_mut(),
            &priors,
            &[0.0, 0.0],
            None,
            &CcdOptions {
                max_iterations: 50,
                cancel: CancelToken::new(),
                ..opts.clone()
            },
        );
        assert!(done.is_ok());
    }
}
