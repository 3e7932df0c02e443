//! A DataFusion session with every epifusion function registered.

use std::sync::Arc;

use datafusion::catalog::TableFunctionImpl;
use datafusion::common::Result as DfResult;
use datafusion::execution::runtime_env::RuntimeEnvBuilder;
use datafusion::execution::SessionState;
use datafusion::prelude::{SessionConfig, SessionContext};

use crate::design_table::{DesignMatrixFunction, DesignRegistry};
use crate::fit_table::FitTableFunction;
use crate::fit_udaf::FitAggregate;
use crate::omop;
use crate::registry::{sql_functions, SqlRole};
use crate::store::EnvObjectStoreRegistry;
use crate::study::functions::StudyTableFunction;

/// Session settings.
#[derive(Debug, Clone, Default)]
pub struct SessionOptions {
    /// OMOP store (folder or URL) whose CDM tables are registered.
    pub omop: Option<String>,
    /// DataFusion batch size (default 8192).
    pub batch_size: Option<usize>,
}

/// Names of every SQL function epifusion registers ([`crate::registry`]).
pub fn function_names() -> Vec<&'static str> {
    sql_functions().iter().map(|f| f.name).collect()
}

/// Register every epifusion function of [`crate::registry::sql_functions`] in `ctx` (and
/// install the CUDA backend for the process, so that fits with `device: auto | cuda` can find a
/// GPU). The session's stored design matrices ([`DesignRegistry`]) live in its configuration's
/// extensions, so that input queries planned through the `Session` trait reach them
/// ([`crate::planning::planning_state`]). The session's optimizer rules get the guard of
/// [`crate::unnest_keys`] (an unnest of a list keeps no functional dependencies).
pub fn register_all(ctx: &SessionContext) {
    epifusion_cuda::install();
    crate::unnest_keys::guard_session(ctx);
    let designs = Arc::new(DesignRegistry::default());
    ctx.state_ref()
        .write()
        .config_mut()
        .set_extension(designs.clone());
    for f in sql_functions() {
        match f.role {
            SqlRole::FitAggregate(model) => ctx.register_udaf(
                datafusion::logical_expr::AggregateUDF::from(FitAggregate::new(f.name, model)),
            ),
            _ => {
                if let Some(t) = table_function(f.name, f.role, &designs) {
                    ctx.register_udtf(f.name, t);
                }
            }
        }
    }
}

/// Register epifusion's table functions in `state`, with the design matrices of its
/// configuration's [`DesignRegistry`] extension (a new, empty one when it has none).
pub fn register_table_functions(state: &mut SessionState) {
    let designs = state
        .config()
        .get_extension::<DesignRegistry>()
        .unwrap_or_default();
    for f in sql_functions() {
        if let Some(t) = table_function(f.name, f.role, &designs) {
            state.register_udtf(f.name, t);
        }
    }
}

/// The table function of a registry entry (`None` for aggregates); `designs` holds the
/// matrices `design_matrix` stores and the fit functions read. Used by [`register_all`] and by
/// embedders that register the functions elsewhere (the Python package's FFI route).
pub fn table_function(
    name: &'static str,
    role: SqlRole,
    designs: &Arc<DesignRegistry>,
) -> Option<Arc<dyn TableFunctionImpl>> {
    Some(match role {
        SqlRole::Fit(model) => Arc::new(FitTableFunction::new(name, model, designs.clone())),
        SqlRole::FitAggregate(_) => return None,
        SqlRole::Study(design, part) => Arc::new(StudyTableFunction::new(name, design, part)),
        SqlRole::SccsDiagnostics(part) => Arc::new(
            crate::study::diagnostics::SccsDiagnosticsFunction::new(name, part),
        ),
        SqlRole::Cohort(part) => Arc::new(crate::cohort_ps::CohortTableFunction::new(name, part)),
        SqlRole::DesignMatrix => Arc::new(DesignMatrixFunction::new(designs.clone())),
        SqlRole::EmpiricalNull => Arc::new(crate::calibration::EmpiricalNullFunction),
        SqlRole::CalibrateEstimates => Arc::new(crate::calibration::CalibrateEstimatesFunction),
        SqlRole::Functions => Arc::new(crate::docs::FunctionsTable),
    })
}

/// A new session: object stores from the environment, epifusion functions, and the OMOP
/// store's tables when one is given.
pub async fn new_session(opts: &SessionOptions) -> DfResult<SessionContext> {
    let mut config = SessionConfig::new().with_information_schema(true);
    if let Some(b) = opts.batch_size {
        config = config.with_batch_size(b.max(1));
    }
    let runtime = RuntimeEnvBuilder::new()
        .with_object_store_registry(Arc::new(EnvObjectStoreRegistry::new()))
        .build_arc()?;
    // Fit aggregates stop when their query is dropped (crate::cancel_scope).
    let state = datafusion::execution::session_state::SessionStateBuilder::new()
        .with_default_features()
        .with_config(config)
        .with_runtime_env(runtime)
        .with_physical_optimizer_rule(Arc::new(crate::cancel_scope::FitCancelRule))
        .build();
    let ctx = SessionContext::new_with_state(state);
    register_all(&ctx);
    if let Some(store) = &opts.omop {
        omop::register_omop(&ctx, store).await?;
    }
    Ok(ctx)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn function_names_are_unique() {
        let mut names = function_names();
        let n = names.len();
        names.sort();
        names.dedup();
        assert_eq!(names.len(), n);
    }

    #[test]
    fn every_function_is_documented_with_an_example() {
        for name in function_names() {
            let d = crate::docs::doc(name).unwrap_or_else(|| panic!("{name} has no documentation"));
            assert!(
                d.sql_example.as_deref().is_some_and(|e| e.contains(name)),
                "{name}"
            );
            assert!(d.syntax_example.starts_with(name), "{name}");
        }
    }
}
