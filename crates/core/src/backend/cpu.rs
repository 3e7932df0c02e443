//! The CPU backend: the likelihoods of [`crate::model`], parallelized with rayon.

use crate::error::Result;
use crate::model::design::DesignMatrix;
use crate::model::{Likelihood, LikelihoodOptions, ModelKind};

/// The CPU likelihood of `kind` on `x` (checks the rows for the model first).
pub fn likelihood(
    kind: ModelKind,
    x: &DesignMatrix,
    opts: LikelihoodOptions,
) -> Result<Box<dyn Likelihood>> {
    crate::model::cpu_likelihood(kind, x, opts)
}

/// [`likelihood`] consuming the design matrix (see [`crate::model::cpu_likelihood_owned`]).
pub fn likelihood_owned(
    kind: ModelKind,
    x: DesignMatrix,
    opts: LikelihoodOptions,
) -> Result<Box<dyn Likelihood>> {
    crate::model::cpu_likelihood_owned(kind, x, opts)
}

/// [`likelihood_owned`] on rows already checked with
/// [`crate::model::ModelKind::check_rows`] (the check is not repeated).
pub(crate) fn likelihood_owned_checked(
    kind: ModelKind,
    x: DesignMatrix,
    opts: LikelihoodOptions,
) -> Result<Box<dyn Likelihood>> {
    crate::model::cpu_likelihood_owned_checked(kind, x, opts)
}
