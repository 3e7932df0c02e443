//! `epifusion scheduler` and `epifusion executor`: the processes of a Ballista cluster.

use std::net::SocketAddr;

use super::*;

#[derive(Args, Debug)]
pub(crate) struct SchedulerArgs {
    /// Address to listen on (HOST:PORT). Ballista has no authentication: use a private address.
    #[arg(long, default_value = "127.0.0.1:50050")]
    pub(crate) bind: SocketAddr,
}

#[derive(Args, Debug)]
pub(crate) struct ExecutorArgs {
    /// The scheduler (HOST:PORT).
    #[arg(long)]
    pub(crate) scheduler: String,
    /// Address of this executor's Arrow Flight service (HOST:PORT): other executors and clients
    /// fetch shuffle and result partitions from it, so use an address they can reach.
    #[arg(long, default_value = "127.0.0.1:50051")]
    pub(crate) bind: SocketAddr,
    /// Port of this executor's gRPC service (tasks from the scheduler), on the --bind host.
    #[arg(long, default_value_t = 50052)]
    pub(crate) grpc_port: u16,
    /// Tasks run at once (default: the number of CPU cores).
    #[arg(long)]
    pub(crate) concurrent_tasks: Option<usize>,
    /// Folder for shuffle files (DIR/shuffle) and spills (DIR/spill), both removed on exit
    /// (default: a new temporary folder, removed on exit).
    #[arg(long)]
    pub(crate) work_dir: Option<PathBuf>,
    /// Seconds a finished job's shuffle files are kept (all are removed when the executor stops).
    #[arg(long, default_value_t = 3600)]
    pub(crate) job_data_ttl: u64,
}

pub(crate) fn run_scheduler(a: &SchedulerArgs) -> Result<()> {
    epifusion::cluster::install_node_logger().map_err(|e| anyhow::anyhow!(e))?;
    let rt = runtime()?;
    eprintln!(
        "epifusion {} scheduler on {} (Ballista; no authentication: keep it on a private network)",
        env!("CARGO_PKG_VERSION"),
        a.bind
    );
    rt.block_on(epifusion::cluster::run_scheduler(a.bind))
        .map_err(|e| anyhow::anyhow!("scheduler: {e}"))
}

pub(crate) fn run_executor(a: &ExecutorArgs) -> Result<()> {
    if a.concurrent_tasks == Some(0) {
        bail!("--concurrent-tasks must be at least 1");
    }
    epifusion::cluster::install_node_logger().map_err(|e| anyhow::anyhow!(e))?;
    let rt = runtime()?;
    eprintln!(
        "epifusion {} executor on {} (gRPC port {}), scheduler {}",
        env!("CARGO_PKG_VERSION"),
        a.bind,
        a.grpc_port,
        a.scheduler
    );
    let opts = epifusion::cluster::ExecutorOptions {
        scheduler: a.scheduler.clone(),
        bind: a.bind,
        grpc_port: a.grpc_port,
        concurrent_tasks: a.concurrent_tasks,
        work_dir: a.work_dir.clone(),
        job_data_ttl_seconds: a.job_data_ttl,
    };
    rt.block_on(epifusion::cluster::run_executor(opts))
        .map_err(|e| anyhow::anyhow!("executor: {e}"))
}
