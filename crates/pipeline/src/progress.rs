//! Progress of a run on stderr: a bar over the analyses with a spinner for the current step when
//! stderr is a terminal, plain time-stamped log lines otherwise (cron, CI, orchestrators).

use std::io::IsTerminal;
use std::time::{Duration, Instant};

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};

/// Progress reporting for one run.
pub struct Progress {
    bar: Option<ProgressBar>,
    started: Instant,
    quiet: bool,
}

impl Progress {
    /// A progress display over `total` analyses (a bar only when stderr is a terminal).
    pub fn new(total: usize) -> Self {
        let bar = std::io::stderr().is_terminal().then(|| {
            let bar =
                ProgressBar::with_draw_target(Some(total as u64), ProgressDrawTarget::stderr());
            bar.set_style(
                ProgressStyle::with_template(
                    "{spinner} [{elapsed_precise}] {bar:30} {pos}/{len} {msg}",
                )
                .unwrap_or_else(|_| ProgressStyle::default_bar()),
            );
            bar.enable_steady_tick(Duration::from_millis(120));
            bar
        });
        Progress {
            bar,
            started: Instant::now(),
            quiet: false,
        }
    }

    /// No output at all (tests of the library).
    pub fn quiet() -> Self {
        Progress {
            bar: None,
            started: Instant::now(),
            quiet: true,
        }
    }

    /// A line that stays (above the bar on a terminal).
    pub fn log(&self, line: &str) {
        if self.quiet {
            return;
        }
        match &self.bar {
            Some(bar) => bar.println(line),
            None => eprintln!("[{:>7.1}s] {line}", self.started.elapsed().as_secs_f64()),
        }
    }

    /// The current step of a long operation (the spinner's message; a log line otherwise).
    pub fn step(&self, message: &str) {
        match &self.bar {
            Some(bar) => bar.set_message(message.to_string()),
            None => self.log(message),
        }
    }

    /// One analysis done (or skipped).
    pub fn advance(&self) {
        if let Some(bar) = &self.bar {
            bar.inc(1);
        }
    }

    /// Remove the bar.
    pub fn finish(&self) {
        if let Some(bar) = &self.bar {
            bar.finish_and_clear();
        }
    }
}
