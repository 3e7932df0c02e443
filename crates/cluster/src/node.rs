//! The scheduler and executor processes (`epifusion scheduler`, `epifusion executor`).

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;

use ballista_core::error::BallistaError;
use ballista_core::serde::protobuf::{
    RuntimeStatsReport, ShuffleWritePartition, TaskColumnStats, WindowStateReport,
};
use ballista_core::JobId;
use ballista_executor::execution_engine::{
    DefaultExecutionEngine, ExecutionEngine, QueryStageExecutor,
};
use ballista_executor::executor_process::{start_executor_process, ExecutorProcessConfig};
use ballista_scheduler::cluster::BallistaCluster;
use ballista_scheduler::config::SchedulerConfig;
use ballista_scheduler::scheduler_process::start_server;
use datafusion::execution::TaskContext;
use datafusion::physical_plan::metrics::MetricsSet;
use datafusion::physical_plan::ExecutionPlan;
use datafusion::prelude::SessionConfig;

use crate::codec::{ClusterLogicalCodec, ClusterPhysicalCodec};

/// Run a Ballista scheduler on `bind` with epifusion's session builder and codecs until the
/// process is stopped. Ballista has no authentication: bind to a private address.
pub async fn run_scheduler(bind: SocketAddr) -> Result<(), BallistaError> {
    let mut config = SchedulerConfig::default()
        .with_hostname(bind.ip().to_string())
        .with_port(bind.port())
        .with_override_config_producer(Arc::new(crate::node_config))
        .with_override_session_builder(Arc::new(crate::scheduler_session));
    config.bind_host = bind.ip().to_string();
    config.override_logical_codec = Some(Arc::new(ClusterLogicalCodec::default()));
    config.override_physical_codec = Some(Arc::new(ClusterPhysicalCodec::default()));
    // A lost executor is noticed within seconds (its heartbeats stop), and its tasks rerun.
    config.executor_timeout_seconds = 20;
    config.expire_dead_executor_interval_seconds = 5;
    let cluster = BallistaCluster::new_from_config(&config).await?;
    start_server(cluster, bind, Arc::new(config)).await
}

/// The options of `epifusion executor`.
#[derive(Debug, Clone)]
pub struct ExecutorOptions {
    /// The scheduler's address (HOST:PORT).
    pub scheduler: String,
    /// Where the executor's Arrow Flight service (shuffle and result partitions) listens.
    pub bind: SocketAddr,
    /// The executor's gRPC port (tasks from the scheduler), on the same host as `bind`.
    pub grpc_port: u16,
    /// Tasks run at once (default: the number of CPU cores).
    pub concurrent_tasks: Option<usize>,
    /// Shuffle files (under `shuffle/`) and spills (under `spill/`); both folders are removed
    /// when the executor stops (default: a new folder under the system's temporary folder,
    /// removed when the executor stops).
    pub work_dir: Option<PathBuf>,
    /// Seconds a finished job's shuffle files are kept (checked every minute; all are removed
    /// when the executor stops).
    pub job_data_ttl_seconds: u64,
}

/// Run an executor until it is stopped (Ctrl-C or SIGTERM), registered with the scheduler, with
/// every epifusion function and codec; it removes its jobs' shuffle files when it stops, and
/// its work dir when it made one.
pub async fn run_executor(opts: ExecutorOptions) -> Result<(), BallistaError> {
    let (scheduler_host, scheduler_port) = split_host_port(&opts.scheduler)?;
    let (work_dir, made_work_dir) = match &opts.work_dir {
        Some(dir) => (dir.clone(), false),
        None => (
            std::env::temp_dir().join(format!(
                "epifusion-executor-{}-{}",
                std::process::id(),
                opts.grpc_port
            )),
            true,
        ),
    };
    std::fs::create_dir_all(&work_dir).map_err(|e| {
        BallistaError::General(format!(
            "cannot create the work dir {}: {e}",
            work_dir.display()
        ))
    })?;
    // Ballista's shuffle files and DataFusion's spill files in separate folders: Ballista
    // treats every folder in its work dir as a job's shuffle data (it deletes them by age and
    // when it stops), and DataFusion's spill folders, created and removed by the tasks
    // themselves, raced with that clean-up and made it log errors at every stop.
    let shuffle_dir = work_dir.join("shuffle");
    let spill_dir = work_dir.join("spill");
    for dir in [&shuffle_dir, &spill_dir] {
        std::fs::create_dir_all(dir)
            .map_err(|e| BallistaError::General(format!("cannot create {}: {e}", dir.display())))?;
    }
    let work = shuffle_dir.to_string_lossy().to_string();
    let temp = spill_dir.to_string_lossy().to_string();
    let mut config = ExecutorProcessConfig {
        bind_host: opts.bind.ip().to_string(),
        external_host: Some(opts.bind.ip().to_string()),
        port: opts.bind.port(),
        grpc_port: opts.grpc_port,
        scheduler_host,
        scheduler_port,
        scheduler_connect_timeout_seconds: 30,
        work_dir: Some(work),
        job_data_ttl_seconds: opts.job_data_ttl_seconds,
        job_data_clean_up_interval_seconds: 60,
        executor_heartbeat_interval_seconds: 5,
        print_thread_info: false,
        ..Default::default()
    };
    if let Some(n) = opts.concurrent_tasks {
        config.vcores = n.max(1);
    }
    config.override_function_registry = Some(Arc::new(crate::function_registry()));
    config.override_config_producer = Some(Arc::new(crate::node_config));
    config.override_runtime_producer = Some(Arc::new(move |session_config: &SessionConfig| {
        crate::check_version(session_config, "executor")?;
        crate::node_runtime(Some(&temp))
    }));
    config.override_logical_codec = Some(Arc::new(ClusterLogicalCodec::default()));
    config.override_physical_codec = Some(Arc::new(ClusterPhysicalCodec::default()));
    config.override_execution_engine = Some(Arc::new(StageEngine(DefaultExecutionEngine::new())));
    let result = start_executor_process(Arc::new(config)).await;
    // Ballista has removed the jobs' shuffle data; what a task left behind goes too.
    let _ = std::fs::remove_dir_all(&shuffle_dir);
    let _ = std::fs::remove_dir_all(&spill_dir);
    if made_work_dir {
        let _ = std::fs::remove_dir_all(&work_dir);
    }
    result
}

/// Ballista's default execution engine, whose stages report no operator metrics to the
/// scheduler ([`NoOperatorMetrics`]).
///
/// Why: an executor reports the metrics of the operators of a task's plan that have some
/// (`ballista_core::utils::collect_plan_metrics` skips an operator whose `metrics()` is
/// `None`), and Ballista 55's scheduler keeps the first task's list as the stage's and
/// *rejects* the status of a later task of the same stage whose list has another length
/// ("task metrics array size 7 does not equal with the stage metrics array size 6"): that
/// task never counts as done, so the job neither finishes nor fails. Some plans (SQL designs'
/// joins and window queries) have operators with metrics in one task and none in another. An
/// empty list is what the scheduler skips ("task metrics not set"), so every status is
/// accepted; the scheduler's per-operator metrics display is all that is lost. (The default
/// engine's Flight client pool is private to Ballista; shuffle reads open their own
/// connections, as before Ballista had the pool.)
struct StageEngine(DefaultExecutionEngine);

impl ExecutionEngine for StageEngine {
    fn create_query_stage_exec(
        &self,
        job_id: JobId,
        stage_id: usize,
        task_id: usize,
        global_output_partition_ids: Vec<usize>,
        plan: Arc<dyn ExecutionPlan>,
        work_dir: &str,
        config: &SessionConfig,
    ) -> datafusion::error::Result<Arc<dyn QueryStageExecutor>> {
        let inner = self.0.create_query_stage_exec(
            job_id,
            stage_id,
            task_id,
            global_output_partition_ids,
            plan,
            work_dir,
            config,
        )?;
        Ok(Arc::new(NoOperatorMetrics(inner)))
    }
}

/// A query stage that reports no operator metrics ([`StageEngine`]); everything else is the
/// wrapped stage's.
#[derive(Debug)]
struct NoOperatorMetrics(Arc<dyn QueryStageExecutor>);

impl std::fmt::Display for NoOperatorMetrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        std::fmt::Display::fmt(&self.0, f)
    }
}

#[async_trait::async_trait]
impl QueryStageExecutor for NoOperatorMetrics {
    async fn execute_query_stage(
        &self,
        task_id: usize,
        context: Arc<TaskContext>,
    ) -> datafusion::error::Result<Vec<ShuffleWritePartition>> {
        self.0.execute_query_stage(task_id, context).await
    }

    fn collect_plan_metrics(&self) -> Vec<MetricsSet> {
        Vec::new()
    }

    fn collect_runtime_stats_reports(&self) -> Vec<RuntimeStatsReport> {
        self.0.collect_runtime_stats_reports()
    }

    fn collect_window_state_reports(&self) -> datafusion::error::Result<Vec<WindowStateReport>> {
        self.0.collect_window_state_reports()
    }

    fn collect_column_stats(&self) -> Vec<TaskColumnStats> {
        self.0.collect_column_stats()
    }
}

/// `HOST:PORT` (a `df://` or `http://` prefix is accepted).
fn split_host_port(addr: &str) -> Result<(String, u16), BallistaError> {
    let bare = addr
        .trim()
        .trim_start_matches("df://")
        .trim_start_matches("http://")
        .trim_end_matches('/');
    let bad = || {
        BallistaError::Configuration(format!(
            "--scheduler `{addr}`: give HOST:PORT, e.g. 10.0.0.5:50050"
        ))
    };
    let (host, port) = bare.rsplit_once(':').ok_or_else(bad)?;
    let port: u16 = port.parse().map_err(|_| bad())?;
    if host.is_empty() {
        return Err(bad());
    }
    Ok((host.to_string(), port))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scheduler_addresses() {
        assert_eq!(
            split_host_port("10.0.0.5:50050").unwrap(),
            ("10.0.0.5".to_string(), 50050)
        );
        assert_eq!(
            split_host_port("df://host:1/").unwrap(),
            ("host".to_string(), 1)
        );
        for bad in ["host", "host:", ":50050", "host:port", "host:70000"] {
            let e = split_host_port(bad).unwrap_err().to_string();
            assert!(e.contains("HOST:PORT"), "{bad}: {e}");
        }
    }
}
