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
//!
//! **Portable planning.** Input queries are planned through the [`Session`] trait only — no
//! downcast to DataFusion's `SessionState` — so the functions work in any session that
//! implements it (a Ballista executor's, datafusion-python's through the FFI).
//! [`planning_state`] builds a planning state from what the trait exposes: the session's
//! configuration (with its extensions, e.g. the session's stored design matrices), runtime,
//! catalogs, scalar / aggregate / window functions, table options and physical optimizers,
//! DataFusion's default expression planners, file formats and table functions, and
//! epifusion's own table functions. A table function registered in the calling session by
//! someone else (not DataFusion's, not epifusion's) cannot be called *inside* an input query:
//! the trait does not list table functions.
//!
//! **Planners.** The query planner and physical optimizer rules are the session's own when it is
//! a DataFusion `SessionState` (epifusion's sessions, a Ballista client's or executor's);
//! any other session — datafusion-python's, seen through the FFI as a foreign session — gets
//! DataFusion's defaults, run in this process: a foreign session's planner crosses the FFI
//! by serializing the logical plan with *its* extension codec, which cannot carry epifusion's
//! tables (nor a table function's planned inputs). [`physical_plan`] follows the same rule.

use std::sync::Arc;

use datafusion::catalog::Session;
use datafusion::common::plan_datafusion_err;
use datafusion::error::Result as DfResult;
use datafusion::execution::session_state::SessionStateBuilder;
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

/// A state for planning SQL in the calling session, built through the [`Session`] trait (no
/// downcast; see the module documentation for what it carries).
pub fn planning_state(session: &dyn Session) -> SessionState {
    let native = session.as_any().is::<SessionState>();
    let mut builder = SessionStateBuilder::new()
        .with_session_id(session.session_id().to_string())
        .with_config(shared_catalog_config(
            session.config(),
            session.catalog_list().as_ref(),
        ))
        .with_runtime_env(session.runtime_env().clone())
        .with_default_features()
        .with_catalog_list(session.catalog_list())
        .with_table_options(session.table_options().clone())
        .with_execution_props(session.execution_props().clone());
    builder = if native {
        builder
            .with_scalar_functions(session.scalar_functions().values().cloned().collect())
            .with_higher_order_functions(
                session.higher_order_functions().values().cloned().collect(),
            )
            .with_aggregate_functions(session.aggregate_functions().values().cloned().collect())
            .with_window_functions(session.window_functions().values().cloned().collect())
    } else {
        // DataFusion's own functions stay this process's (a foreign `coalesce` cannot be
        // simplified across the FFI, and the physical planner insists it was); the caller's
        // other functions (its UDFs) are added.
        use datafusion::execution::SessionStateDefaults as D;
        builder
            .with_scalar_functions(with_foreign(
                D::default_scalar_functions(),
                session.scalar_functions(),
                |f| f.name().to_string(),
                |f| f.aliases().to_vec(),
            ))
            .with_aggregate_functions(with_foreign(
                D::default_aggregate_functions(),
                session.aggregate_functions(),
                |f| f.name().to_string(),
                |f| f.aliases().to_vec(),
            ))
            .with_window_functions(with_foreign(
                D::default_window_functions(),
                session.window_functions(),
                |f| f.name().to_string(),
                |f| f.aliases().to_vec(),
            ))
    };
    if native {
        builder = builder
            .with_query_planner(session.query_planner())
            .with_physical_optimizer_rules(session.physical_optimizers().to_vec());
    }
    let mut state = crate::unnest_keys::guard_state(builder.build());
    crate::session::register_table_functions(&mut state);
    state
}

/// `own` plus the functions of `foreign` whose names (or aliases) are not among `own`'s.
fn with_foreign<F: Clone>(
    own: Vec<F>,
    foreign: &std::collections::HashMap<String, F>,
    name: impl Fn(&F) -> String,
    aliases: impl Fn(&F) -> Vec<String>,
) -> Vec<F> {
    let mut taken: std::collections::HashSet<String> = std::collections::HashSet::new();
    for f in &own {
        taken.insert(name(f));
        taken.extend(aliases(f));
    }
    let mut out = own;
    let mut extra: Vec<(&String, &F)> = foreign
        .iter()
        .filter(|(key, f)| !taken.contains(*key) && !taken.contains(&name(f)))
        .collect();
    extra.sort_by(|a, b| a.0.cmp(b.0));
    out.extend(extra.into_iter().map(|(_, f)| f.clone()));
    out
}

/// `config` for a state built over an existing catalog list: building a state with
/// `create_default_catalog_and_schema` *replaces* the default catalog in the list it is given,
/// which would drop the calling session's tables; off when that catalog exists.
pub fn shared_catalog_config(
    config: &datafusion::prelude::SessionConfig,
    catalogs: &dyn datafusion::catalog::CatalogProviderList,
) -> datafusion::prelude::SessionConfig {
    let exists = catalogs
        .catalog(&config.options().catalog.default_catalog)
        .is_some();
    let create = config.options().catalog.create_default_catalog_and_schema && !exists;
    config
        .clone()
        .with_create_default_catalog_and_schema(create)
}

/// A [`SessionContext`] over [`planning_state`]: the calling session's catalogs and
/// functions, for the study designs, which run several queries of their own.
pub fn session_context(session: &dyn Session) -> SessionContext {
    SessionContext::new_with_state(planning_state(session))
}

/// The logical plan of `sql` in the calling session, refused unless read-only.
pub async fn logical_plan(session: &dyn Session, sql: &str, what: &str) -> DfResult<LogicalPlan> {
    let plan = planning_state(session).create_logical_plan(sql).await?;
    check_read_only(&plan, what)?;
    Ok(plan)
}

/// Plan `sql` (read-only) into an execution plan in the calling session.
pub async fn plan_sql(state: &dyn Session, sql: &str) -> DfResult<Arc<dyn ExecutionPlan>> {
    let plan = logical_plan(state, sql, "an input query").await?;
    physical_plan(state, &plan).await
}

/// The execution plan of `plan` in the calling session: by the session itself when it is a
/// DataFusion `SessionState`, else by [`planning_state`] (module documentation, "Planners").
pub async fn physical_plan(
    session: &dyn Session,
    plan: &LogicalPlan,
) -> DfResult<Arc<dyn ExecutionPlan>> {
    if session.as_any().is::<SessionState>() {
        session.create_physical_plan(plan).await
    } else {
        planning_state(session).create_physical_plan(plan).await
    }
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

    #[tokio::test]
    async fn planning_through_the_session_trait_sees_and_keeps_the_sessions_tables() {
        let ctx = crate::session::new_session(&Default::default())
            .await
            .unwrap();
        ctx.sql("CREATE TABLE kept AS SELECT 1 AS a").await.unwrap();
        let state = ctx.state();
        // An input query sees the session's table, and epifusion's and DataFusion's table
        // functions inside it; planning leaves the session's catalog as it was.
        for sql in [
            "SELECT a FROM kept",
            "SELECT * FROM generate_series(1, 3)",
            "SELECT * FROM epifusion_functions()",
        ] {
            plan_sql(&state, sql).await.unwrap();
        }
        assert!(
            ctx.table_exist("kept").unwrap(),
            "the session lost its table"
        );
        let n = ctx
            .sql("SELECT count(*) FROM kept")
            .await
            .unwrap()
            .collect()
            .await
            .unwrap();
        assert_eq!(n[0].num_rows(), 1);
    }
}
