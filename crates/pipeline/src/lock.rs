//! One run at a time per output location: `epifusion run` takes a lock before any analysis work
//! (which also proves that the location is writable) and releases it at the end, on success or
//! error.
//!
//! * **Local folders**: `<output>/epifusion.lock`, created with `create_new` (`O_EXCL`), holding
//!   the run id, process id, host name, process start time and run start time (JSON).
//! * **Object stores**: the same object written with a conditional PUT (`PutMode::Create`,
//!   i.e. `If-None-Match: *`). A store that cannot do conditional writes (`NotImplemented`)
//!   cannot be locked: the run is refused unless `--no-lock` is given, and then warns.
//!
//! **Stale locks.** A lock whose process is not running on this host (or whose process id now
//! belongs to another process) is stale, e.g. after `kill -9`, Ctrl-C or a crash: the next run
//! takes it over and says so (locally after checking that the file is unchanged, on object stores
//! with a conditional PUT on the stale lock's e-tag). A lock written on another host is never
//! considered stale automatically: the error says how to remove it.
//!
//! `--no-lock` takes no lock (a lock held by a running run still stops the run) and checks that
//! the location is writable with a probe object instead.

use std::io::Write as _;
use std::path::PathBuf;
use std::time::SystemTime;

use object_store::{PutMode, PutOptions, PutPayload, UpdateVersion};
use serde::{Deserialize, Serialize};

use super::output::Output;
use super::progress::Progress;
use super::run::utc_string;
use super::PipelineError;

/// Name of the lock object under the output location.
pub const LOCK_NAME: &str = "epifusion.lock";

/// What a lock records about its holder.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LockInfo {
    /// `epifusion-lock/1`.
    pub format: String,
    /// The holder's run id.
    pub run_id: String,
    /// The holder's process id.
    pub pid: u32,
    /// The holder's host name.
    pub host: String,
    /// When the holder started (UTC).
    pub started_at: String,
    /// The holder's process start time (clock ticks after boot, Linux), to tell a process id
    /// that was reused by another process.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pid_start: Option<u64>,
    /// The pipeline file the holder runs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pipeline: Option<String>,
}

impl LockInfo {
    /// The lock of this process for run `run_id`.
    pub fn this_process(run_id: &str, pipeline: &str) -> Self {
        let pid = std::process::id();
        LockInfo {
            format: "epifusion-lock/1".into(),
            run_id: run_id.to_string(),
            pid,
            host: hostname(),
            started_at: utc_string(SystemTime::now()),
            pid_start: process_start(pid),
            pipeline: Some(pipeline.to_string()),
        }
    }

    /// "run R (pid P on host H, started T)".
    pub fn holder(&self) -> String {
        format!(
            "run {} (pid {} on host {}, started {})",
            self.run_id, self.pid, self.host, self.started_at
        )
    }

    /// Why the lock is stale, or None when its holder may still be running (or runs on
    /// another host, where this process cannot tell).
    pub fn stale_reason(&self) -> Option<String> {
        if self.host != hostname() {
            return None;
        }
        if !pid_alive(self.pid) {
            return Some(format!("pid {} is not running on this host", self.pid));
        }
        match (self.pid_start, process_start(self.pid)) {
            (Some(recorded), Some(now)) if recorded != now => Some(format!(
                "pid {} is now another process (started later)",
                self.pid
            )),
            _ => None,
        }
    }
}

/// This machine's host name (empty when unknown).
pub fn hostname() -> String {
    #[cfg(unix)]
    {
        let mut buf = [0u8; 256];
        // SAFETY: `buf` is valid for `buf.len()` bytes; gethostname writes at most that many.
        let rc = unsafe { libc::gethostname(buf.as_mut_ptr().cast(), buf.len()) };
        if rc == 0 {
            let end = buf.iter().position(|&b| b == 0).unwrap_or(buf.len());
            return String::from_utf8_lossy(&buf[..end]).into_owned();
        }
    }
    std::env::var("HOSTNAME")
        .or_else(|_| std::env::var("COMPUTERNAME"))
        .unwrap_or_default()
}

/// Whether process `pid` exists on this host (unknown → true: never stale by accident).
pub fn pid_alive(pid: u32) -> bool {
    #[cfg(unix)]
    {
        let Ok(pid) = libc::pid_t::try_from(pid) else {
            return false;
        };
        if pid <= 0 {
            return false;
        }
        // SAFETY: signal 0 only checks that the process exists and may be signalled.
        let rc = unsafe { libc::kill(pid, 0) };
        rc == 0 || std::io::Error::last_os_error().raw_os_error() != Some(libc::ESRCH)
    }
    #[cfg(not(unix))]
    {
        let _ = pid;
        true
    }
}

/// Start time of process `pid` in clock ticks after boot (Linux `/proc/<pid>/stat` field 22).
pub fn process_start(pid: u32) -> Option<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // Fields after the command name (which may hold spaces and parentheses): state is field 3.
    let (_, rest) = stat.rsplit_once(')')?;
    rest.split_whitespace().nth(19)?.parse().ok()
}

/// A lock held by this run (or the absence of one, with `--no-lock`).
#[derive(Debug)]
pub struct OutputLock {
    info: LockInfo,
    held: Held,
    /// Where the lock is, for messages.
    pub display: String,
}

#[derive(Debug)]
enum Held {
    /// `--no-lock` (or a store without conditional writes): nothing to release.
    Nothing,
    /// The local lock file.
    File(PathBuf),
    /// The lock object.
    Object,
}

fn locked(out: &Output, holder: String) -> PipelineError {
    let lock = out.display(LOCK_NAME);
    let remove = match &out.local_dir {
        Some(_) => format!("rm {lock}"),
        None => format!("delete the object {lock}"),
    };
    PipelineError::Locked {
        lock,
        holder,
        remedy: format!(
            "wait for that run to finish; if it is not running any more (its machine crashed or \
             was stopped), remove the stale lock ({remove}) and run again"
        ),
    }
}

fn lock_err(out: &Output, what: &str, e: impl std::fmt::Display) -> PipelineError {
    PipelineError::Output {
        location: out.location.clone(),
        message: format!("{what} {}: {e}", out.display(LOCK_NAME)),
    }
}

/// The lock cannot be created: the output is not writable (or not reachable).
fn not_writable(out: &Output, e: impl std::fmt::Display) -> PipelineError {
    PipelineError::Output {
        location: out.location.clone(),
        message: format!(
            "cannot create the lock {}: {e}; is the output writable? (nothing was run)",
            out.display(LOCK_NAME)
        ),
    }
}

impl OutputLock {
    /// Take the lock of `out` for run `run_id` (see the module documentation).
    pub async fn acquire(
        out: &Output,
        run_id: &str,
        pipeline: &str,
        no_lock: bool,
        progress: &Progress,
    ) -> Result<Self, PipelineError> {
        let info = LockInfo::this_process(run_id, pipeline);
        let display = out.display(LOCK_NAME);
        if no_lock {
            if let Some((held, _)) = Self::read(out).await? {
                if held.stale_reason().is_none() {
                    return Err(locked(out, held.holder()));
                }
            }
            progress.log(&format!(
                "warning: --no-lock: running without a lock on {}; a concurrent run on this \
                 output is not detected and can leave inconsistent results",
                out.location
            ));
            probe_writable(out).await?;
            return Ok(OutputLock {
                info,
                held: Held::Nothing,
                display,
            });
        }
        let bytes = serde_json::to_vec_pretty(&info)
            .map_err(|e| lock_err(out, "cannot encode the lock", e))?;
        match &out.local_dir {
            Some(dir) => {
                let path = dir.join(LOCK_NAME);
                for _ in 0..3 {
                    match std::fs::OpenOptions::new()
                        .write(true)
                        .create_new(true)
                        .open(&path)
                    {
                        Ok(mut f) => {
                            let written = f.write_all(&bytes).and_then(|()| f.sync_all());
                            if let Err(e) = written {
                                let _ = std::fs::remove_file(&path);
                                return Err(lock_err(out, "cannot write the lock", e));
                            }
                            return Ok(OutputLock {
                                info,
                                held: Held::File(path),
                                display,
                            });
                        }
                        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
                            let seen = std::fs::read(&path).unwrap_or_default();
                            let held = parse(out, &seen)?;
                            let Some(reason) = held.stale_reason() else {
                                return Err(locked(out, held.holder()));
                            };
                            progress.log(&format!(
                                "taking over the stale lock {display} of {} ({reason})",
                                held.holder()
                            ));
                            // Only the lock that was judged stale is removed.
                            if std::fs::read(&path).ok().as_deref() == Some(&seen[..]) {
                                match std::fs::remove_file(&path) {
                                    Ok(()) => {}
                                    Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                                    Err(e) => {
                                        return Err(lock_err(
                                            out,
                                            "cannot remove the stale lock",
                                            e,
                                        ))
                                    }
                                }
                            }
                        }
                        Err(e) => return Err(not_writable(out, e)),
                    }
                }
                match Self::read(out).await? {
                    Some((held, _)) => Err(locked(out, held.holder())),
                    None => Err(lock_err(out, "cannot take the lock", "contended")),
                }
            }
            None => {
                let path = out.object_path(LOCK_NAME);
                let mut mode = PutMode::Create;
                for _ in 0..3 {
                    let opts = PutOptions::from(mode.clone());
                    match out
                        .store()
                        .put_opts(&path, PutPayload::from(bytes.clone()), opts)
                        .await
                    {
                        Ok(_) => {
                            return Ok(OutputLock {
                                info,
                                held: Held::Object,
                                display,
                            })
                        }
                        Err(object_store::Error::NotImplemented { .. })
                            if mode == PutMode::Create =>
                        {
                            return Err(PipelineError::Output {
                                location: out.location.clone(),
                                message: format!(
                                    "this store does not support conditional writes \
                                     (If-None-Match), so the output cannot be locked against a \
                                     concurrent run; give --no-lock to run without a lock (and \
                                     make sure that no other run writes to {})",
                                    out.location
                                ),
                            });
                        }
                        Err(
                            object_store::Error::AlreadyExists { .. }
                            | object_store::Error::Precondition { .. },
                        ) => {
                            let Some((held, version)) = Self::read(out).await? else {
                                mode = PutMode::Create;
                                continue;
                            };
                            let Some(reason) = held.stale_reason() else {
                                return Err(locked(out, held.holder()));
                            };
                            progress.log(&format!(
                                "taking over the stale lock {display} of {} ({reason})",
                                held.holder()
                            ));
                            mode = PutMode::Update(version);
                        }
                        Err(_) if matches!(mode, PutMode::Update(_)) => {
                            // No conditional update here (or no version to match): delete the
                            // stale lock, then create.
                            out.delete(LOCK_NAME).await?;
                            mode = PutMode::Create;
                        }
                        Err(e) => return Err(not_writable(out, e)),
                    }
                }
                match Self::read(out).await? {
                    Some((held, _)) => Err(locked(out, held.holder())),
                    None => Err(lock_err(out, "cannot take the lock", "contended")),
                }
            }
        }
    }

    /// The lock of `out` and its version (object stores), if there is one.
    pub async fn read(out: &Output) -> Result<Option<(LockInfo, UpdateVersion)>, PipelineError> {
        if let Some(dir) = &out.local_dir {
            return match std::fs::read(dir.join(LOCK_NAME)) {
                Ok(bytes) => Ok(Some((
                    parse(out, &bytes)?,
                    UpdateVersion {
                        e_tag: None,
                        version: None,
                    },
                ))),
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
                Err(e) => Err(lock_err(out, "cannot read the lock", e)),
            };
        }
        match out.get_versioned(LOCK_NAME).await? {
            Some((bytes, version)) => Ok(Some((parse(out, &bytes)?, version))),
            None => Ok(None),
        }
    }

    /// Fails unless the lock is still this run's (nobody removed or took it over).
    pub async fn check_held(&self, out: &Output) -> Result<(), PipelineError> {
        if matches!(self.held, Held::Nothing) {
            return Ok(());
        }
        match Self::read(out).await {
            Ok(Some((held, _))) if held.run_id == self.info.run_id => Ok(()),
            Ok(Some((held, _))) => Err(lock_err(
                out,
                "lost the lock",
                format!("it is now held by {}", held.holder()),
            )),
            Ok(None) => Err(lock_err(out, "lost the lock", "it was removed")),
            Err(e) => Err(e),
        }
    }

    /// Remove the lock if it is still this run's; Err names what was left behind.
    pub async fn release(self, out: &Output) -> Result<(), PipelineError> {
        match &self.held {
            Held::Nothing => Ok(()),
            Held::File(path) => match Self::read(out).await {
                Ok(Some((held, _))) if held.run_id == self.info.run_id => {
                    std::fs::remove_file(path)
                        .map_err(|e| lock_err(out, "cannot remove the lock", e))
                }
                _ => Ok(()),
            },
            Held::Object => match Self::read(out).await? {
                Some((held, _)) if held.run_id == self.info.run_id => out.delete(LOCK_NAME).await,
                _ => Ok(()),
            },
        }
    }
}

fn parse(out: &Output, bytes: &[u8]) -> Result<LockInfo, PipelineError> {
    serde_json::from_slice(bytes).map_err(|e| {
        locked(
            out,
            format!(
                "an unknown holder (the lock is being written or is not an epifusion lock: {e})"
            ),
        )
    })
}

/// With `--no-lock`: write and delete a probe object, so that an unwritable output fails
/// before any analysis work.
async fn probe_writable(out: &Output) -> Result<(), PipelineError> {
    let rel = format!(".epifusion-write-check-{}", std::process::id());
    out.put(&rel, b"epifusion".to_vec()).await?;
    out.delete(&rel).await
}

#[cfg(test)]
mod tests {
    use super::*;

    fn temp_output(tag: &str) -> (PathBuf, Output) {
        let dir = std::env::temp_dir().join(format!("epifusion-lock-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let out = Output::open(&dir.display().to_string(), false).unwrap();
        (dir, out)
    }

    #[test]
    fn this_process_is_alive_and_not_stale() {
        let me = LockInfo::this_process("r", "p.toml");
        assert!(pid_alive(me.pid));
        assert_eq!(me.stale_reason(), None);
        assert!(!me.host.is_empty());
        let mut other_host = me.clone();
        other_host.host = format!("{}-elsewhere", me.host);
        other_host.pid = u32::MAX;
        assert_eq!(other_host.stale_reason(), None, "another host: never stale");
        let mut dead = me.clone();
        let mut child = std::process::Command::new("true").spawn().unwrap();
        dead.pid = child.id();
        child.wait().unwrap();
        assert!(dead.stale_reason().unwrap().contains("not running"));
        let mut reused = me;
        reused.pid_start = reused.pid_start.map(|t| t + 1);
        if reused.pid_start.is_some() {
            assert!(reused.stale_reason().unwrap().contains("another process"));
        }
    }

    #[tokio::test]
    async fn a_held_lock_stops_a_second_run_and_is_released() {
        let (dir, out) = temp_output("held");
        let q = Progress::quiet();
        let first = OutputLock::acquire(&out, "run-1", "p.toml", false, &q)
            .await
            .unwrap();
        let e = OutputLock::acquire(&out, "run-2", "p.toml", false, &q)
            .await
            .unwrap_err()
            .to_string();
        assert!(e.contains(LOCK_NAME) && e.contains("run-1"), "{e}");
        let e = OutputLock::acquire(&out, "run-3", "p.toml", true, &q)
            .await
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("run-1"),
            "--no-lock never overrides a held lock: {e}"
        );
        first.check_held(&out).await.unwrap();
        first.release(&out).await.unwrap();
        assert!(!dir.join(LOCK_NAME).exists());
        let second = OutputLock::acquire(&out, "run-2", "p.toml", false, &q)
            .await
            .unwrap();
        second.release(&out).await.unwrap();
        let _ = std::fs::remove_dir_all(&dir);
    }
}
