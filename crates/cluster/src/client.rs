//! The client side: an epifusion session whose queries run on a Ballista cluster.

use std::sync::Arc;

use async_trait::async_trait;
use ballista_core::extension::{SessionConfigExt, SessionStateExt};
use datafusion::catalog::Session;
use datafusion::common::{plan_datafusion_err, Result as DfResult};
use datafusion::execution::context::QueryPlanner;
use datafusion::execution::session_state::SessionStateBuilder;
use datafusion::logical_expr::LogicalPlan;
use datafusion::physical_plan::ExecutionPlan;
use datafusion::prelude::SessionContext;
use epifusion_sql::exec::WIRE_VERSION;
use epifusion_sql::session::{new_session, SessionOptions};

use crate::codec::{ClusterLogicalCodec, ClusterPhysicalCodec};

/// The scheduler's gRPC URL for a cluster address: `df://HOST:PORT` (or `HOST:PORT`) →
/// `http://HOST:PORT`.
pub fn scheduler_url(cluster: &str) -> DfResult<String> {
    let bare = cluster.trim().trim_end_matches('/');
    let bare = bare.strip_prefix("df://").unwrap_or(bare);
    let bad =
        || plan_datafusion_err!("--cluster `{cluster}`: give the scheduler as df://HOST:PORT");
    let (host, port) = bare.rsplit_once(':').ok_or_else(bad)?;
    if host.is_empty() || host.contains('/') || port.parse::<u16>().is_err() {
        return Err(bad());
    }
    Ok(format!("http://{host}:{port}"))
}

/// A session like [`new_session`]'s (epifusion's functions, object stores from the
/// environment, the OMOP store's tables) whose queries run on the cluster at `cluster`
/// (`df://HOST:PORT`). DDL (`CREATE EXTERNAL TABLE`, `CREATE VIEW`) stays in this session;
/// queries are planned here, sent to the scheduler and their results fetched from the
/// executors.
pub async fn cluster_session(cluster: &str, opts: &SessionOptions) -> DfResult<SessionContext> {
    let url = scheduler_url(cluster)?;
    let local = new_session(opts).await?;
    let state = local.state();
    // The default catalog exists (the OMOP store's tables are in it): keep it rather than
    // let each rebuild of the state replace it with an empty one.
    let mut config = state
        .config()
        .clone()
        .with_create_default_catalog_and_schema(false)
        .with_ballista_logical_extension_codec(Arc::new(ClusterLogicalCodec::default()))
        .with_ballista_physical_extension_codec(Arc::new(ClusterPhysicalCodec::default()))
        .with_option_extension(crate::ClusterConfig::default());
    config
        .options_mut()
        .set("epifusion.version", WIRE_VERSION)?;
    let state = SessionStateBuilder::new_from_existing(state)
        .with_config(config)
        .build()
        .upgrade_for_ballista(url)?;
    // Ballista's planner sends the plan; ours first replaces epifusion's table-function calls
    // with their planned form.
    let planner = ClusterPlanner {
        ballista: state.query_planner().clone(),
    };
    // Ballista's static distributed planner, not its adaptive one (module documentation of
    // the crate: with the adaptive planner, a `UNION ALL … ORDER BY` job stalls).
    let config = state
        .config()
        .clone()
        .with_ballista_adaptive_query_planner(false);
    let state = SessionStateBuilder::new_from_existing(state)
        .with_config(config)
        .with_query_planner(Arc::new(planner))
        .build();
    let ctx = SessionContext::new_with_state(state);
    // `upgrade_for_ballista` replaces the scalar and aggregate functions with Ballista's
    // defaults: register epifusion's again.
    epifusion_sql::session::register_all(&ctx);
    Ok(ctx)
}

/// Prepares a plan for the cluster ([`epifusion_sql::remote::prepare_for_cluster`]), then
/// hands it to Ballista's planner.
#[derive(Debug)]
struct ClusterPlanner {
    ballista: Arc<dyn QueryPlanner + Send + Sync>,
}

#[async_trait]
impl QueryPlanner for ClusterPlanner {
    async fn create_physical_plan(
        &self,
        plan: &LogicalPlan,
        session: &dyn Session,
    ) -> DfResult<Arc<dyn ExecutionPlan>> {
        let plan = epifusion_sql::remote::prepare_for_cluster(session, plan.clone()).await?;
        self.ballista.create_physical_plan(&plan, session).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cluster_addresses() {
        assert_eq!(
            scheduler_url("df://10.0.0.5:50050").unwrap(),
            "http://10.0.0.5:50050"
        );
        assert_eq!(scheduler_url("host:7").unwrap(), "http://host:7");
        for bad in ["df://host", "df://:1", "http://h/x:1", "df://h:port"] {
            let e = scheduler_url(bad).unwrap_err().to_string();
            assert!(e.contains("df://HOST:PORT"), "{bad}: {e}");
        }
    }
}
