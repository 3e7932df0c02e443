//! The one seam between a pipeline and the study designs: analysis unit → study tables.
//!
//! `design = "sql"` runs the unit's queries. The SCCS and cohort designs will call the study
//! module (issue #4) here:
//!
//! ```text
//! Design::Sccs(t) => {
//!     let d: SccsDesign = t.clone().try_into()?;       // + the unit's concept sets
//!     study::build_sccs(ctx, &d).await.map(Into::into)
//! }
//! ```
//!
//! TODO(#4): wire `build_sccs` / `build_cohort` in once `src/engine/study/` lands; until then
//! those designs fail validation ([`design_available`]) before any work starts.

use std::sync::Arc;

use datafusion::arrow::record_batch::RecordBatch;
use datafusion::common::{not_impl_err, Result as DfResult};
use datafusion::prelude::SessionContext;

use super::plan::{Analysis, Design};
use super::spec::DesignKind;

/// The tables a design produces (the same shape as the study module's `StudyTables`).
#[derive(Debug, Clone, Default)]
pub struct StudyTables {
    /// Outcome rows (DESIGN.md §4).
    pub outcomes: Vec<RecordBatch>,
    /// Covariates (long format).
    pub covariates: Vec<RecordBatch>,
    /// Covariate reference: `covariate_id`, `covariate_name`, ….
    pub covariate_ref: Vec<RecordBatch>,
    /// Attrition: one row per step.
    pub attrition: Vec<RecordBatch>,
}

/// Whether this build can run `design` (the SCCS and cohort designs come with issue #4).
pub fn design_available(design: DesignKind) -> bool {
    matches!(design, DesignKind::Sql)
}

/// Build the study tables of `a` (the SQL design's `setup` has already run in `ctx`).
pub async fn build_tables(ctx: &SessionContext, a: &Analysis) -> DfResult<StudyTables> {
    match &a.design {
        Design::Sql(q) => {
            // An empty result still carries its schema (one empty batch).
            let run = |sql: Option<String>| async move {
                let Some(sql) = sql else {
                    return Ok(Vec::new());
                };
                let df = ctx.sql(&sql).await?;
                let schema = Arc::new(df.schema().as_arrow().clone());
                let mut batches = df.collect().await?;
                if batches.is_empty() {
                    batches.push(RecordBatch::new_empty(schema));
                }
                Ok::<_, datafusion::error::DataFusionError>(batches)
            };
            Ok(StudyTables {
                outcomes: run(Some(q.outcomes.value.clone())).await?,
                covariates: run(q.covariates.as_ref().map(|l| l.value.clone())).await?,
                covariate_ref: run(q.covariate_ref.as_ref().map(|l| l.value.clone())).await?,
                attrition: run(q.attrition.as_ref().map(|l| l.value.clone())).await?,
            })
        }
        // TODO(#4): study::build_sccs / study::build_cohort.
        Design::Sccs(_) | Design::Cohort(_) => not_impl_err!(
            "design `{}` needs the study-design module (issue #4)",
            a.design.kind().name()
        ),
    }
}
