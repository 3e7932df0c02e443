//! Priors (penalties) on the coefficients.
//!
//! Cyclops parameterizes both priors by their variance v:
//!
//! | prior | penalty on β_j | from variance v | notes |
//! |---|---|---|---|
//! | none | 0 | – | maximum likelihood |
//! | Laplace (L1) | λ\|β_j\| | λ = √(2/v) | **not** scaled by n: objective LL − λΣ\|β\|; glmnet's λ is this λ / N |
//! | Normal (L2) | β_j² / (2σ²) | σ² = v | ridge |
//!
//! The log prior is reported **without normalizing constants**: −λΣ|β| or −Σβ²/(2σ²).
//! Covariates listed in `exclude` (and the intercept) are never penalized.

use crate::error::{Error, Result};

/// Prior family and strength.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub enum Prior {
    /// No penalty (maximum likelihood).
    #[default]
    None,
    /// Laplace / L1 with rate λ > 0.
    Laplace {
        /// λ in the objective LL − λΣ|β_j|.
        lambda: f64,
    },
    /// Normal / L2 with variance σ² > 0.
    Normal {
        /// σ² in the objective LL − Σβ_j²/(2σ²).
        variance: f64,
    },
}

impl Prior {
    /// Build from a family name (`none`, `laplace`, `normal`) and either a variance or a λ.
    ///
    /// For Laplace, `variance` v gives λ = √(2/v); for Normal, `lambda` gives σ² = 1/λ
    /// (the ridge penalty λβ²/2).
    pub fn from_parts(family: &str, variance: Option<f64>, lambda: Option<f64>) -> Result<Self> {
        let positive = |name: &str, v: f64| {
            if v.is_finite() && v > 0.0 {
                Ok(v)
            } else {
                Err(Error::option(
                    name,
                    format!("must be a finite number > 0 (got {v})"),
                ))
            }
        };
        if variance.is_some() && lambda.is_some() {
            return Err(Error::option(
                "variance",
                "give either `variance` or `lambda`, not both",
            ));
        }
        match family.to_ascii_lowercase().as_str() {
            "none" | "" => {
                if variance.is_some() || lambda.is_some() {
                    return Err(Error::option("prior", "`none` takes no variance or lambda"));
                }
                Ok(Prior::None)
            }
            "laplace" | "l1" | "lasso" => {
                let lambda = match (variance, lambda) {
                    (Some(v), None) => (2.0 / positive("variance", v)?).sqrt(),
                    (None, Some(l)) => positive("lambda", l)?,
                    _ => {
                        return Err(Error::option(
                            "prior",
                            "laplace needs `variance` or `lambda`",
                        ))
                    }
                };
                Ok(Prior::Laplace { lambda })
            }
            "normal" | "l2" | "ridge" | "gaussian" => {
                let variance = match (variance, lambda) {
                    (Some(v), None) => positive("variance", v)?,
                    (None, Some(l)) => 1.0 / positive("lambda", l)?,
                    _ => {
                        return Err(Error::option(
                            "prior",
                            "normal needs `variance` or `lambda`",
                        ))
                    }
                };
                Ok(Prior::Normal { variance })
            }
            other => Err(Error::option(
                "prior",
                format!("unknown prior `{other}`; expected none, laplace or normal"),
            )),
        }
    }

    /// The same family with a new variance (cross-validation).
    pub fn with_variance(self, v: f64) -> Self {
        match self {
            Prior::None => Prior::None,
            Prior::Laplace { .. } => Prior::Laplace {
                lambda: (2.0 / v).sqrt(),
            },
            Prior::Normal { .. } => Prior::Normal { variance: v },
        }
    }

    /// Variance of the prior (∞ for none).
    pub fn variance(self) -> f64 {
        match self {
            Prior::None => f64::INFINITY,
            Prior::Laplace { lambda } => 2.0 / (lambda * lambda),
            Prior::Normal { variance } => variance,
        }
    }

    /// Family name.
    pub fn name(self) -> &'static str {
        match self {
            Prior::None => "none",
            Prior::Laplace { .. } => "laplace",
            Prior::Normal { .. } => "normal",
        }
    }

    /// Penalty (negative log prior without constants) of one coefficient.
    #[inline]
    pub fn penalty(self, beta: f64) -> f64 {
        match self {
            Prior::None => 0.0,
            Prior::Laplace { lambda } => lambda * beta.abs(),
            Prior::Normal { variance } => beta * beta / (2.0 * variance),
        }
    }
}

/// The prior for every coefficient of a fit.
#[derive(Debug, Clone, PartialEq)]
pub struct PriorSet {
    /// Per-coefficient prior (`Prior::None` for excluded coefficients).
    pub per_coef: Vec<Prior>,
}

impl PriorSet {
    /// `prior` on every coefficient except those with `excluded[j] == true`.
    pub fn new(prior: Prior, excluded: &[bool]) -> Self {
        PriorSet {
            per_coef: excluded
                .iter()
                .map(|&ex| if ex { Prior::None } else { prior })
                .collect(),
        }
    }

    /// Log prior without constants: −Σ penalty_j(β_j).
    pub fn log_prior(&self, beta: &[f64]) -> f64 {
        -self
            .per_coef
            .iter()
            .zip(beta)
            .map(|(p, &b)| p.penalty(b))
            .sum::<f64>()
    }

    /// Whether coefficient `j` is unpenalized.
    pub fn is_unpenalized(&self, j: usize) -> bool {
        self.per_coef[j] == Prior::None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn variance_and_lambda() {
        let p = Prior::from_parts("laplace", Some(0.02), None).unwrap();
        assert_eq!(p, Prior::Laplace { lambda: 10.0 });
        assert!((p.variance() - 0.02).abs() < 1e-15);
        let p = Prior::from_parts("normal", None, Some(4.0)).unwrap();
        assert_eq!(p, Prior::Normal { variance: 0.25 });
        assert!(Prior::from_parts("laplace", Some(-1.0), None).is_err());
        assert!(Prior::from_parts("laplace", None, None).is_err());
        assert!(Prior::from_parts("cauchy", Some(1.0), None).is_err());
        assert!(Prior::from_parts("laplace", Some(1.0), Some(1.0)).is_err());
    }
}
