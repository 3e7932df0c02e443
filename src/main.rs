//! The `epifusion` command-line program: `fit` a model to CSV / Parquet files, or `bench` a fit
//! on seeded synthetic (or benchmark) data. See the README for every option.

mod cli;

use clap::Parser;

use cli::{Cli, Command};

/// glibc gives each thread its own malloc arena, so the memory the main thread frees while a
/// rayon worker builds the likelihood (the loaded design's columns, dropped one by one) is not
/// reused by that worker, and peak RSS holds both copies. One arena keeps the peak near one
/// copy (DESIGN.md §10); fits allocate little after setup, so the shared lock costs nothing.
#[cfg(all(target_os = "linux", target_env = "gnu"))]
fn use_one_malloc_arena() {
    // SAFETY: mallopt only changes allocator tuning; called before any other thread exists.
    unsafe {
        libc::mallopt(libc::M_ARENA_MAX, 1);
    }
}

#[cfg(not(all(target_os = "linux", target_env = "gnu")))]
fn use_one_malloc_arena() {}

/// glibc serves blocks from 128 KiB up with fresh mappings until the first such block is freed,
/// then raises that threshold to the freed size (at most 32 MiB) and its heap-trim threshold to
/// twice that. A fit frees and allocates many such blocks (Parquet pages, Arrow batches, the
/// design's columns), so until then each one is mapped, faulted in page by page and unmapped
/// again. Starting at the thresholds glibc's own rule ends at (32 MiB and 64 MiB) saves that:
/// 5 % of the CPU time of the README's 1e5-case SCCS query; the 1e6-case peak RSS is unchanged
/// (its large blocks are mapped either way, and large SCCS builds trim the heap themselves,
/// `epifusion_core::memory::release_free_memory`).
#[cfg(all(target_os = "linux", target_env = "gnu"))]
fn start_malloc_at_its_limits() {
    // SAFETY: mallopt only changes allocator tuning; called before any other thread exists.
    unsafe {
        libc::mallopt(libc::M_MMAP_THRESHOLD, 32 << 20);
        libc::mallopt(libc::M_TRIM_THRESHOLD, 64 << 20);
    }
}

#[cfg(not(all(target_os = "linux", target_env = "gnu")))]
fn start_malloc_at_its_limits() {}

fn main() {
    let cli = Cli::parse();
    // Not for the cluster's nodes: an executor runs several tasks at once, each allocating
    // freely (a person-partitioned SCCS build's partitions), and one arena made them queue on
    // its lock — the two partitions of a 1,000,000-person build took twice the time of one
    // local build, most of it in futex waits. Parsing the command line starts no thread.
    if !matches!(cli.command, Command::Scheduler(_) | Command::Executor(_)) {
        use_one_malloc_arena();
    }
    start_malloc_at_its_limits();
    epifusion::init();
    let outcome = match cli.command {
        Command::Fit(a) => cli::fit::run_fit(&a),
        Command::Bench(a) => cli::bench::run_bench(&a),
        Command::Sql(a) => cli::sql::run_sql_command(&a),
        Command::Serve(a) => cli::serve::run_serve(&a),
        Command::Import(a) => cli::import::run_import(&a),
        Command::BenchOmop(a) => cli::bench_omop::run_bench_omop(&a),
        Command::Run(a) => cli::run::run_pipeline(&a),
        Command::Scheduler(a) => cli::cluster::run_scheduler(&a),
        Command::Executor(a) => cli::cluster::run_executor(&a),
    };
    if let Err(e) = outcome {
        eprintln!("error: {}", describe(&e));
        std::process::exit(1);
    }
}

/// An error and its causes on one line, `a: b: c`, each cause written once: a cause whose text
/// an earlier message already holds is left out (DataFusion's errors repeat their source's
/// text in their own, so `{e:#}` would print a schema error three times).
fn describe(e: &anyhow::Error) -> String {
    let mut out = String::new();
    for cause in e.chain() {
        let text = cause.to_string();
        if text.is_empty() || out.contains(text.trim()) {
            continue;
        }
        if !out.is_empty() {
            out.push_str(": ");
        }
        out.push_str(&text);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::describe;

    #[test]
    fn an_error_chain_names_each_cause_once() {
        let inner = std::io::Error::other("No field named stratum");
        let e = anyhow::Error::new(inner)
            .context("Schema error: No field named stratum")
            .context("reading the query");
        assert_eq!(
            describe(&e),
            "reading the query: Schema error: No field named stratum"
        );
        let e = anyhow::anyhow!("disk full").context("writing out.parquet");
        assert_eq!(describe(&e), "writing out.parquet: disk full");
    }
}
