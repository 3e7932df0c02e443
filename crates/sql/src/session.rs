//! A DataFusion session with every epifusion function registered.

use std::sync::Arc;

use datafusion::common::Result as DfResult;
use datafusion::execution::runtime_env::RuntimeEnvBuilder;
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
/// GPU).
pub fn register_all(ctx: &SessionContext) {
    epifusion_cuda::install();
    let designs = Arc::new(DesignRegistry::default());
    for f in sql_functions() {
        match f.role {
            SqlRole::Fit(model) => ctx.register_udtf(
                f.name,
                Arc::new(FitTableFunction::new(f.name, model, designs.clone())),
            ),
            SqlRole::FitAggregate(model) => ctx.register_udaf(
                datafusion::logical_expr::AggregateUDF::from(FitAggregate::new(f.name, model)),
            ),
            SqlRole::Study(design, part) => ctx.register_udtf(
                f.name,
                Arc::new(StudyTableFunction::new(f.name, design, part)),
            ),
            SqlRole::SccsDiagnostics(part) => ctx.register_udtf(
                f.name,
                Arc::new(crate::study::diagnostics::SccsDiagnosticsFunction::new(
                    f.name, part,
                )),
            ),
            SqlRole::DesignMatrix => {
                ctx.register_udtf(f.name, Arc::new(DesignMatrixFunction::new(designs.clone())))
            }
            SqlRole::EmpiricalNull => {
                ctx.register_udtf(f.name, Arc::new(crate::calibration::EmpiricalNullFunction))
            }
            SqlRole::CalibrateEstimates => ctx.register_udtf(
                f.name,
                Arc::new(crate::calibration::CalibrateEstimatesFunction),
            ),
            SqlRole::Functions => ctx.register_udtf(f.name, Arc::new(crate::docs::FunctionsTable)),
        }
    }
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
    let ctx = SessionContext::new_with_config_rt(config, runtime);
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
