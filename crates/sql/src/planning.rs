//! Read-only planning of the SQL that users pass *into* epifusion's functions: the `outcomes` /
//! `covariates` queries of the fit table functions and `design_matrix`, the concept-set and
//! study-setting queries of the study designs, and a pipeline's concept-set and analysis queries.
//!
//! Such a query is a data source, never an action: DML (`INSERT`, `UPDATE`, `DELETE`), `COPY`,
//! DDL (`CREATE`, `DROP`, …) and statements (`SET`, transactions, …) are refused **before
//! anything executes** (DataFusion's [`SQLOptions::verify_plan`] on the logical plan), with an
//! error saying so. The CLI's own statements (`epifusion sql -c`), a pipeline's
//! `[analysis.sql] setup` and the Flight SQL server's `--allow-writes` mode are outside this
//! rule.

use std::sync::Arc;

use datafusion::catalog::Session;
use datafusion::common::{exec_datafusion_err, plan_datafusion_err};
use datafusion::error::Result as DfResult;
use datafusion::execution::SessionState;
use datafusion::logical_expr::LogicalPlan;
use datafusion::physical_plan::ExecutionPlan;
use datafusion::prelude::{DataFrame, SQLOptions, SessionContext};

/// The options of an input query: no DDL, no DML or COPY, no statements.
pub fn read_only() -> SQLOptions {
    SQLOptions::new()
        .with_allow_ddl(false)
        .with_allow_dml(false)
        .with_allow_statements(false)
}

/// Refuse `plan` unless it is read-only; `what` names the input in the error.
pub fn check_read_only(plan: &LogicalPlan, what: &str) -> DfResult<()> {
    read_only().verify_plan(plan).map_err(|e| {
        plan_datafusion_err!(
            "{what} must be a read-only query (no INSERT, UPDATE, DELETE, COPY, CREATE, DROP or \
             SET): {}",
            e.strip_backtrace()
        )
    })
}

/// The logical plan of `sql` in the calling session, refused unless read-only.
pub async fn logical_plan(state: &dyn Session, sql: &str, what: &str) -> DfResult<LogicalPlan> {
    // SQL planning needs the session's table functions and expression planners, which the
    // `Session` trait does not expose (DataFusion 55): plan through the concrete state.
    let state = state
        .as_any()
        .downcast_ref::<SessionState>()
        .ok_or_else(|| {
            exec_datafusion_err!("epifusion table functions need a DataFusion SessionState")
        })?;
    let plan = state.create_logical_plan(sql).await?;
    check_read_only(&plan, what)?;
    Ok(plan)
}

/// Plan `sql` (read-only) into an execution plan in the calling session.
pub async fn plan_sql(state: &dyn Session, sql: &str) -> DfResult<Arc<dyn ExecutionPlan>> {
    let plan = logical_plan(state, sql, "an input query").await?;
    state.create_physical_plan(&plan).await
}

/// `ctx.sql(sql)` for an input query: refused unless read-only.
pub async fn read_only_sql(ctx: &SessionContext, sql: &str) -> DfResult<DataFrame> {
    ctx.sql_with_options(sql, read_only()).await.map_err(|e| {
        if e.to_string().contains("not supported") {
            plan_datafusion_err!(
                "an input query must be a read-only query (no INSERT, UPDATE, DELETE, COPY, \
                 CREATE, DROP or SET): {}",
                e.strip_backtrace()
            )
        } else {
            e
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn writes_and_ddl_are_refused_before_running() {
        let dir = std::env::temp_dir().join(format!("epi_read_only_{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let ctx = SessionContext::new();
        let out = dir.join("x.csv");
        let state = ctx.state();
        for sql in [
            format!("COPY (SELECT 1 AS a) TO '{}' STORED AS CSV", out.display()),
            "CREATE TABLE t AS SELECT 1 AS a".to_string(),
            "CREATE VIEW v AS SELECT 1 AS a".to_string(),
            "SET datafusion.execution.batch_size = 1".to_string(),
            "DROP TABLE IF EXISTS t".to_string(),
        ] {
            let e = plan_sql(&state, &sql).await.unwrap_err().to_string();
            assert!(e.contains("read-only"), "{sql}: {e}");
            let e = read_only_sql(&ctx, &sql).await.unwrap_err().to_string();
            assert!(e.contains("read-only"), "{sql}: {e}");
        }
        assert!(!out.exists(), "COPY wrote {}", out.display());
        assert!(!ctx.table_exist("t").unwrap_or(false));
        // A plain query plans.
        assert!(plan_sql(&state, "SELECT 1 AS a").await.is_ok());
        let _ = std::fs::remove_dir_all(&dir);
    }
}
