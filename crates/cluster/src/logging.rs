//! The node processes' log: Ballista's scheduler and executor report failed stages, refused
//! tasks and lost executors through the `log` crate; without a logger those messages are lost.
//! [`install_node_logger`] writes them to standard error, one line each:
//! `<UTC time> <LEVEL> <module>: <message>`.
//!
//! The level comes from `EPIFUSION_LOG` (or, if unset, `RUST_LOG`): one of `off`, `error`,
//! `warn` (the default), `info`, `debug`, `trace`. Only the level is read; a value with module
//! filters (`RUST_LOG=ballista=debug`) is refused with a message naming the variable.

use std::io::Write;
use std::time::{SystemTime, UNIX_EPOCH};

use log::{LevelFilter, Log, Metadata, Record};

struct StderrLogger;

impl Log for StderrLogger {
    fn enabled(&self, metadata: &Metadata) -> bool {
        metadata.level() <= log::max_level()
    }

    fn log(&self, record: &Record) {
        let level = level_of(record);
        if level > log::max_level() {
            return;
        }
        let now = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap_or_default();
        let secs = now.as_secs();
        let (h, m, s) = ((secs / 3600) % 24, (secs / 60) % 60, secs % 60);
        let line = format!(
            "{h:02}:{m:02}:{s:02}.{:03} {:<5} {}: {}\n",
            now.subsec_millis(),
            level,
            record.target(),
            record.args()
        );
        // One write per line so lines of concurrent tasks do not interleave; a failed write to
        // standard error has nowhere to be reported.
        let _ = std::io::stderr().lock().write_all(line.as_bytes());
    }

    fn flush(&self) {
        let _ = std::io::stderr().flush();
    }
}

static LOGGER: StderrLogger = StderrLogger;

/// The level a record is written at: its own, except two messages about the scheduler's
/// per-operator metrics, written at `debug`:
/// * the stage-metrics display (a debug aid, written at `debug` when it works), whose failure
///   to line a stage's metrics up with its plan is logged by Ballista as an error. It says
///   nothing about the job or its results (seen on every person-partitioned SCCS build, whose
///   results match the local run bit for bit);
/// * "The metrics for stage N should not be none", a warning at every stage: epifusion's
///   executors report no operator metrics (`node.rs`, `StageEngine`: Ballista 55's scheduler
///   otherwise stalls jobs whose tasks report lists of different lengths).
fn level_of(record: &Record) -> log::Level {
    let demoted = match record.target() {
        "ballista_scheduler::display" => true,
        "ballista_scheduler::state::execution_stage" => record
            .args()
            .to_string()
            .starts_with("The metrics for stage"),
        _ => false,
    };
    if demoted {
        log::Level::Debug.max(record.level())
    } else {
        record.level()
    }
}

/// Parse a log level as `EPIFUSION_LOG` / `RUST_LOG` take it (case-insensitive).
pub fn parse_level(value: &str) -> Option<LevelFilter> {
    match value.trim().to_ascii_lowercase().as_str() {
        "off" => Some(LevelFilter::Off),
        "error" => Some(LevelFilter::Error),
        "warn" | "warning" => Some(LevelFilter::Warn),
        "info" => Some(LevelFilter::Info),
        "debug" => Some(LevelFilter::Debug),
        "trace" => Some(LevelFilter::Trace),
        _ => None,
    }
}

/// Install the standard-error logger at the level of `EPIFUSION_LOG` / `RUST_LOG` (default
/// `warn`). An unknown level is an error naming the variable and the accepted values; a second
/// call (a logger already installed) changes nothing.
pub fn install_node_logger() -> Result<(), String> {
    let (name, value) = match std::env::var("EPIFUSION_LOG") {
        Ok(v) => ("EPIFUSION_LOG", Some(v)),
        Err(_) => ("RUST_LOG", std::env::var("RUST_LOG").ok()),
    };
    let level = match value {
        None => LevelFilter::Warn,
        Some(v) if v.trim().is_empty() => LevelFilter::Warn,
        Some(v) => parse_level(&v).ok_or_else(|| {
            format!(
                "{name}={v:?} is not a log level: use one of off, error, warn, info, debug, trace"
            )
        })?,
    };
    if log::set_logger(&LOGGER).is_ok() {
        log::set_max_level(level);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn levels_parse_and_module_filters_are_refused() {
        assert_eq!(parse_level("WARN"), Some(LevelFilter::Warn));
        assert_eq!(parse_level(" debug "), Some(LevelFilter::Debug));
        assert_eq!(parse_level("off"), Some(LevelFilter::Off));
        assert_eq!(parse_level("ballista=debug"), None);
        assert_eq!(parse_level("loud"), None);
    }
}
