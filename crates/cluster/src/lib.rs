//! epifusion on an Apache DataFusion Ballista cluster: the scheduler and executor processes of
//! `epifusion scheduler` / `epifusion executor`, and the client session of
//! `epifusion sql --cluster df://HOST:PORT`.
//!
//! **What runs where.** The client plans a statement in its own session (its tables, its
//! OMOP store) and sends the logical plan to the scheduler; epifusion's table-function calls
//! are first replaced by [`epifusion_sql::remote::PlannedEpiTable`]s carrying the logical plans
//! of their input queries ([`epifusion_sql::remote::prepare_for_cluster`]). The scheduler
//! (a session with every epifusion function, [`scheduler_session`]) makes the physical plan and
//! cuts it into stages at every repartition; executors (with every epifusion function in their
//! registry, [`function_registry`]) run the stages, reading the data themselves — so every
//! table a statement reads must name files or URLs that all nodes can read. A `GROUP BY` fit
//! (`*_fit_agg`) is a hash aggregate: partial states are built where the data is read, shuffled
//! by group key and each group's model is fitted on the executor its key hashes to. A
//! table-function fit (`cox_fit(…)`) is one [`epifusion_sql::exec::EpiExec`]: its inputs are
//! gathered into one partition and the fit runs on one executor.
//!
//! **Ballista's static planner.** Clients and nodes turn Ballista 55's adaptive query planner
//! off (`ballista.planner.adaptive.enabled = false`; a session may set it back): with it, a
//! job as plain as `SELECT … GROUP BY … UNION ALL SELECT … GROUP BY … ORDER BY …` never ended
//! (the scheduler's rebuild of the last stage failed its sanity check, "does not satisfy
//! order requirements", and the task's status was dropped), and a remote task's input with
//! that shape arrived in the wrong order. The static planner cuts the stages once, before the
//! job runs.
//!
//! **Versions.** The client declares its epifusion version in the session configuration
//! (`epifusion.version`, [`ClusterConfig`]), which Ballista sends with every job: the scheduler
//! refuses a job from another version and executors refuse its tasks, each with an error naming
//! both versions; every encoded epifusion plan node and table carries the version too.

use std::any::Any;
use std::sync::Arc;

use ballista_core::registry::BallistaFunctionRegistry;
use datafusion::common::config::{ConfigEntry, ConfigExtension, ExtensionOptions};
use datafusion::common::{config_err, plan_datafusion_err, Result as DfResult};
use datafusion::execution::runtime_env::{RuntimeEnv, RuntimeEnvBuilder};
use datafusion::execution::session_state::SessionStateBuilder;
use datafusion::execution::SessionState;
use datafusion::prelude::{SessionConfig, SessionContext};
use epifusion_sql::exec::WIRE_VERSION;
use epifusion_sql::store::EnvObjectStoreRegistry;

pub mod client;
pub mod codec;
pub mod logging;
pub mod node;

pub use client::{cluster_session, scheduler_url};
pub use codec::{ClusterLogicalCodec, ClusterPhysicalCodec};
pub use logging::install_node_logger;
pub use node::{run_executor, run_scheduler, ExecutorOptions};

/// epifusion's entries in a cluster session's configuration (`epifusion.*`), sent by Ballista
/// from the client to the scheduler and with every task to the executors.
#[derive(Debug, Clone, Default)]
pub struct ClusterConfig {
    /// `epifusion.version`: the epifusion version of the client that submitted the job (empty:
    /// not an epifusion client).
    pub version: String,
}

impl ConfigExtension for ClusterConfig {
    const PREFIX: &'static str = "epifusion";
}

// By hand rather than with `extensions_options!`, whose entries lack the `epifusion.` prefix
// (Ballista sends the entries' keys as they are, and a key without it is dropped on arrival).
impl ExtensionOptions for ClusterConfig {
    fn as_any(&self) -> &dyn Any {
        self
    }

    fn as_any_mut(&mut self) -> &mut dyn Any {
        self
    }

    fn cloned(&self) -> Box<dyn ExtensionOptions> {
        Box::new(self.clone())
    }

    fn set(&mut self, key: &str, value: &str) -> DfResult<()> {
        match key {
            "version" => {
                self.version = value.to_string();
                Ok(())
            }
            _ => {
                config_err!("no epifusion setting `epifusion.{key}` (there is `epifusion.version`)")
            }
        }
    }

    fn entries(&self) -> Vec<ConfigEntry> {
        vec![ConfigEntry {
            key: format!("{}.version", Self::PREFIX),
            value: Some(self.version.clone()),
            description: "the epifusion version of the client that submitted the job",
        }]
    }
}

/// Refuse a job whose client declared another epifusion version; `node` names the refusing
/// node in the error. A client that declares none (a plain Ballista client) is served.
pub fn check_version(config: &SessionConfig, node: &str) -> DfResult<()> {
    let declared = config
        .options()
        .extensions
        .get::<ClusterConfig>()
        .map(|c| c.version.clone())
        .unwrap_or_default();
    if !declared.is_empty() && declared != WIRE_VERSION {
        return Err(plan_datafusion_err!(
            "this epifusion {node} runs version {WIRE_VERSION} and refuses a job from an \
             epifusion {declared} client: run the same epifusion version on the client, the \
             scheduler and every executor"
        ));
    }
    Ok(())
}

/// The configuration every node starts from: Ballista's defaults plus [`ClusterConfig`] (the
/// client's values replace these when a job arrives).
pub fn node_config() -> SessionConfig {
    use ballista_core::extension::SessionConfigExt;
    SessionConfig::new_with_ballista()
        .with_ballista_adaptive_query_planner(false)
        .with_option_extension(ClusterConfig::default())
}

/// A runtime whose object stores come from the environment (`s3://`, `gs://`, `az://`,
/// `http(s)://`, as in a local session), spilling under `temp` when given.
pub fn node_runtime(temp: Option<&str>) -> DfResult<Arc<RuntimeEnv>> {
    let mut builder = RuntimeEnvBuilder::new()
        .with_object_store_registry(Arc::new(EnvObjectStoreRegistry::new()));
    if let Some(dir) = temp {
        builder = builder.with_temp_file_path(dir);
    }
    builder.build_arc()
}

/// The scheduler's session for a job (Ballista's `override_session_builder`): the job's
/// configuration, Ballista's optimizer rules and functions, and every epifusion function.
/// Refuses a job from another epifusion version ([`check_version`]).
pub fn scheduler_session(config: SessionConfig) -> DfResult<SessionState> {
    use ballista_core::extension::{
        ballista_aggregate_functions, ballista_scalar_functions, ballista_window_functions,
    };
    check_version(&config, "scheduler")?;
    let mut config = config;
    // A UNION ALL stays a union on a cluster. DataFusion would make a union of identically
    // hash-partitioned inputs an `InterleaveExec`, which requires its inputs to keep that
    // partitioning whenever it is rebuilt; Ballista's scheduler rebuilds stage plans as their
    // inputs finish, and the rebuild failed ("new children can not be interleaved"), leaving
    // the job waiting forever (seen with the person-partitioned SCCS build's row union). The
    // cost is a repartition after such a union.
    config.options_mut().optimizer.prefer_existing_union = true;
    let state = SessionStateBuilder::new()
        .with_default_features()
        .with_config(config)
        .with_runtime_env(node_runtime(None)?)
        .with_optimizer_rules(ballista_core::optimizer::ballista_default_optimizer_rules())
        .with_scalar_functions(ballista_scalar_functions())
        .with_aggregate_functions(ballista_aggregate_functions())
        .with_window_functions(ballista_window_functions())
        .build();
    let ctx = SessionContext::new_with_state(state);
    epifusion_sql::session::register_all(&ctx);
    Ok(ctx.state())
}

/// Every function an executor may meet in a plan: DataFusion's defaults and every epifusion
/// function (Ballista's `override_function_registry`).
pub fn function_registry() -> BallistaFunctionRegistry {
    let ctx = SessionContext::new();
    epifusion_sql::session::register_all(&ctx);
    let state = ctx.state();
    let mut registry = BallistaFunctionRegistry::default();
    for (name, f) in state.scalar_functions() {
        registry.scalar_functions.insert(name.clone(), f.clone());
    }
    for (name, f) in state.aggregate_functions() {
        registry.aggregate_functions.insert(name.clone(), f.clone());
    }
    for (name, f) in state.window_functions() {
        registry.window_functions.insert(name.clone(), f.clone());
    }
    registry
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_fit_aggregate_is_in_the_executor_registry() {
        let registry = function_registry();
        let names = epifusion_sql::session::function_names();
        let aggregates: Vec<_> = names.iter().filter(|n| n.ends_with("_fit_agg")).collect();
        assert!(!aggregates.is_empty());
        for name in aggregates {
            assert!(
                registry.aggregate_functions.contains_key(*name),
                "{name} missing from the executor registry"
            );
        }
        // DataFusion's own functions stay.
        assert!(registry.aggregate_functions.contains_key("sum"));
    }

    /// A node refuses a planned call whose input writes (COPY, INSERT), even one from a client
    /// that skipped the read-only check: nothing is written.
    #[tokio::test]
    async fn a_node_refuses_input_plans_that_write() {
        use datafusion::logical_expr::LogicalPlan;
        use datafusion_proto::logical_plan::LogicalExtensionCodec;
        use epifusion_sql::exec::NodeSpec;
        use epifusion_sql::remote::PlannedEpiTable;

        let dir = std::env::temp_dir().join(format!("epi_node_ro_{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(dir.join("sink")).unwrap();
        let ctx = datafusion::prelude::SessionContext::new();
        ctx.sql(&format!(
            "CREATE EXTERNAL TABLE sink (a BIGINT) STORED AS CSV LOCATION '{}/sink/'",
            dir.display()
        ))
        .await
        .unwrap();
        let copied = dir.join("x.csv");
        let codec = crate::codec::ClusterLogicalCodec::default();
        let task = ctx.task_ctx();
        let spec = NodeSpec::Fit {
            function: "cox_fit".into(),
            options: String::new(),
        };
        let schema = std::sync::Arc::new(datafusion::arrow::datatypes::Schema::empty());
        let read = ctx
            .state()
            .create_logical_plan("SELECT 1 AS row_id")
            .await
            .unwrap();
        let mut refused = 0;
        for sql in [
            format!(
                "COPY (SELECT 1 AS a) TO '{}' STORED AS CSV",
                copied.display()
            ),
            "INSERT INTO sink VALUES (1)".to_string(),
        ] {
            let write: LogicalPlan = ctx.state().create_logical_plan(&sql).await.unwrap();
            let table =
                PlannedEpiTable::new(spec.clone(), vec![read.clone(), write], schema.clone());
            let mut buf = Vec::new();
            let table_ref = datafusion::common::TableReference::bare("t");
            codec
                .try_encode_table_provider(&table_ref, std::sync::Arc::new(table), &mut buf)
                .unwrap_or_else(|e| panic!("{sql}: {e}"));
            let e = codec
                .try_decode_table_provider(&buf, &table_ref, schema.clone(), &task)
                .map(|_| ())
                .unwrap_err()
                .to_string();
            assert!(
                e.contains("cox_fit: an input query must be a read-only query"),
                "{sql}: {e}"
            );
            refused += 1;
        }
        assert!(
            refused >= 1,
            "neither write plan could be encoded: the test checks nothing"
        );
        assert!(!copied.exists());
        assert_eq!(std::fs::read_dir(dir.join("sink")).unwrap().count(), 0);
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn another_version_is_refused_and_none_is_served() {
        let mut config = node_config();
        check_version(&config, "scheduler").unwrap();
        config
            .options_mut()
            .set("epifusion.version", WIRE_VERSION)
            .unwrap();
        check_version(&config, "scheduler").unwrap();
        config
            .options_mut()
            .set("epifusion.version", "0.0.0-other")
            .unwrap();
        let e = check_version(&config, "executor").unwrap_err().to_string();
        assert!(e.contains("0.0.0-other") && e.contains(WIRE_VERSION), "{e}");
        assert!(scheduler_session(config.clone()).is_err());
        // What Ballista sends (the entries' keys) sets the same value on arrival.
        let sent: Vec<_> = config
            .options()
            .entries()
            .into_iter()
            .filter(|e| e.key.starts_with("epifusion."))
            .collect();
        assert_eq!(sent.len(), 1);
        let mut arrived = node_config();
        arrived
            .options_mut()
            .set(&sent[0].key, sent[0].value.as_deref().unwrap_or_default())
            .unwrap();
        assert!(check_version(&arrived, "scheduler").is_err());
    }
}
