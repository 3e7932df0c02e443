//! The SQL function registry: every function epifusion registers, derived from the model
//! registry ([`epifusion_core::model::registry::MODELS`]: a table function and a `GROUP BY`
//! aggregate per model) and the study designs ([`crate::study::functions::STUDY_FUNCTIONS`]),
//! plus the SCCS diagnostics, the comparative-cohort functions ([`crate::cohort_ps`]), `design_matrix`, the calibration functions and `epifusion_functions`. Registration ([`crate::session::register_all`]),
//! documentation ([`crate::docs`]) and the name list derive from [`sql_functions`].

use epifusion_core::model::registry::MODELS;
use epifusion_core::model::ModelKind;

use crate::cohort_ps::{CohortPart, COHORT_FUNCTIONS};
use crate::study::diagnostics::DiagnosticsPart;
use crate::study::functions::{Design, Part, STUDY_FUNCTIONS};

/// What a SQL function does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SqlRole {
    /// `<model>_fit(outcomes [, covariates] [, options])`: a table function.
    Fit(ModelKind),
    /// `<model>_fit_agg(…)`: an aggregate, one model per group.
    FitAggregate(ModelKind),
    /// A study-design table function.
    Study(Design, Part),
    /// `sccs_diagnostics(settings)` / `sccs_time_to_event(settings)`.
    SccsDiagnostics(DiagnosticsPart),
    /// A comparative-cohort table function (`cohort_propensity_scores`, `cohort_match`, …).
    Cohort(CohortPart),
    /// `design_matrix(…)`.
    DesignMatrix,
    /// `empirical_null(negatives)`.
    EmpiricalNull,
    /// `calibrate_estimates(estimates, negatives)`.
    CalibrateEstimates,
    /// `epifusion_functions()`.
    Functions,
}

/// One registered SQL function.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SqlFunction {
    /// SQL name.
    pub name: &'static str,
    /// Role.
    pub role: SqlRole,
}

impl SqlFunction {
    /// Whether it is an aggregate (else a table function).
    pub fn is_aggregate(&self) -> bool {
        matches!(self.role, SqlRole::FitAggregate(_))
    }
}

/// Every SQL function, fits first in the models' order.
pub fn sql_functions() -> Vec<SqlFunction> {
    let fits = MODELS.iter().map(|d| SqlFunction {
        name: d.table_function,
        role: SqlRole::Fit(d.kind),
    });
    let aggregates = MODELS.iter().map(|d| SqlFunction {
        name: d.aggregate,
        role: SqlRole::FitAggregate(d.kind),
    });
    let studies = STUDY_FUNCTIONS
        .iter()
        .map(|&(name, design, part)| SqlFunction {
            name,
            role: SqlRole::Study(design, part),
        });
    let cohort = COHORT_FUNCTIONS.iter().map(|&(name, part)| SqlFunction {
        name,
        role: SqlRole::Cohort(part),
    });
    fits.chain(aggregates)
        .chain(studies)
        .chain(cohort)
        .chain([
            SqlFunction {
                name: "sccs_diagnostics",
                role: SqlRole::SccsDiagnostics(DiagnosticsPart::Diagnostics),
            },
            SqlFunction {
                name: "sccs_time_to_event",
                role: SqlRole::SccsDiagnostics(DiagnosticsPart::TimeToEvent),
            },
            SqlFunction {
                name: "design_matrix",
                role: SqlRole::DesignMatrix,
            },
            SqlFunction {
                name: "empirical_null",
                role: SqlRole::EmpiricalNull,
            },
            SqlFunction {
                name: "calibrate_estimates",
                role: SqlRole::CalibrateEstimates,
            },
            SqlFunction {
                name: "epifusion_functions",
                role: SqlRole::Functions,
            },
        ])
        .collect()
}

/// The fitting table functions: (name, model).
pub fn fit_functions() -> impl Iterator<Item = (&'static str, ModelKind)> {
    MODELS.iter().map(|d| (d.table_function, d.kind))
}

/// The fitting aggregates: (name, model).
pub fn fit_aggregates() -> impl Iterator<Item = (&'static str, ModelKind)> {
    MODELS.iter().map(|d| (d.aggregate, d.kind))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_unique() {
        let mut names: Vec<&str> = sql_functions().iter().map(|f| f.name).collect();
        let n = names.len();
        names.sort_unstable();
        names.dedup();
        assert_eq!(names.len(), n);
        assert_eq!(
            n,
            2 * MODELS.len() + STUDY_FUNCTIONS.len() + COHORT_FUNCTIONS.len() + 6
        );
    }
}
