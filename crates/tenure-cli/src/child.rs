//! Running a command as a supervised child whose whole process group dies with us.
//!
//! `tenure` starts the command through itself (`tenure __child PID DEADLINE_FILE GRACE_MS
//! -- CMD…`): that small supervisor asks the kernel to signal it when its parent dies
//! (`PR_SET_PDEATHSIG`), starts CMD in its own process group, and on that signal kills
//! the whole group with SIGKILL. So even a SIGKILL of `tenure run` leaves no orphan
//! that could keep acting as a second leader.
//!
//! It is also a dead man's switch: `tenure` writes to DEADLINE_FILE the instant (on the
//! host's monotonic clock) by which the command must start stopping, and moves it
//! forward after every renewal. If that instant passes, because `tenure` is frozen
//! (SIGSTOP, a stalled VM) or stuck, the supervisor itself sends SIGTERM to the group,
//! and SIGKILL after the grace period, before the lease deadline.

use std::path::{Path, PathBuf};
use std::process::ExitStatus;
use std::time::Duration;

use anyhow::{Context, Result};
use rustix::process::{Pid, Signal};
use tokio::process::{Child, Command};
use tokio::signal::unix::{SignalKind, signal};

/// The host's monotonic clock in nanoseconds: the clock of tokio's `Instant`, shared by
/// every process on the host.
pub fn monotonic_ns() -> u64 {
    let t = rustix::time::clock_gettime(rustix::time::ClockId::Monotonic);
    t.tv_sec as u64 * 1_000_000_000 + t.tv_nsec as u64
}

/// The instant written in the deadline file (0 if unreadable: no limit).
fn read_stop_at(path: &Path) -> u64 {
    std::fs::read_to_string(path).ok().and_then(|s| s.trim().parse().ok()).unwrap_or(0)
}

/// The file the supervisor creates when it stops the command itself.
fn stopped_marker(deadline_file: &Path) -> PathBuf {
    deadline_file.with_extension("stopped")
}

/// Writes the instant by which the command must start stopping, atomically.
fn write_stop_at(path: &Path, stop_at_ns: u64) -> std::io::Result<()> {
    let tmp = path.with_extension("new");
    std::fs::write(&tmp, stop_at_ns.to_string())?;
    std::fs::rename(tmp, path)
}

/// The hidden subcommand's body: supervise `cmd` and return its exit code.
pub async fn supervisor(parent: i32, deadline_file: &Path, grace: Duration, cmd: &[String]) -> i32 {
    // Ask for SIGUSR2 when our parent dies, then check it has not died already.
    if let Err(e) = rustix::process::set_parent_process_death_signal(Some(Signal::USR2)) {
        eprintln!("tenure: cannot arrange to stop with the parent process: {e}");
        return 125;
    }
    if rustix::process::getppid().map(Pid::as_raw_pid) != Some(parent) {
        return 125;
    }
    let (Ok(mut parent_died), Ok(mut term), Ok(mut int)) =
        (signal(SignalKind::user_defined2()), signal(SignalKind::terminate()), signal(SignalKind::interrupt()))
    else {
        eprintln!("tenure: cannot install signal handlers");
        return 125;
    };
    let Some((program, args)) = cmd.split_first() else {
        eprintln!("tenure: no command given");
        return 2;
    };
    let mut child = match Command::new(program).args(args).spawn() {
        Ok(c) => c,
        Err(e) => {
            eprintln!("tenure: cannot start {program:?}: {e}");
            return if e.kind() == std::io::ErrorKind::NotFound { 127 } else { 126 };
        }
    };
    let group = rustix::process::getpgrp();
    let mut check = tokio::time::interval(Duration::from_millis(20));
    let mut terminated_at: Option<u64> = None;
    loop {
        tokio::select! {
            biased;
            status = child.wait() => return status.map(exit_code).unwrap_or(1),
            _ = parent_died.recv() => {
                // `tenure` is gone: nobody renews the lease. Kill everything now.
                let _ = rustix::process::kill_process_group(group, Signal::KILL);
                return 137;
            }
            // The whole group received these from `tenure`; the command decides.
            _ = term.recv() => {}
            _ = int.recv() => {}
            _ = check.tick() => {
                let now = monotonic_ns();
                match terminated_at {
                    None => {
                        let stop_at = read_stop_at(deadline_file);
                        if stop_at > 0 && now >= stop_at {
                            // `tenure` did not extend the deadline: it is frozen or stuck.
                            // Leave a mark, so that it reads the exit as a stop, not a finish.
                            let _ = std::fs::write(stopped_marker(deadline_file), b"");
                            eprintln!("tenure: the lease was not renewed in time; stopping the command");
                            let _ = rustix::process::kill_process_group(group, Signal::TERM);
                            terminated_at = Some(now);
                        }
                    }
                    Some(t) if now >= t + grace.as_nanos() as u64 => {
                        let _ = rustix::process::kill_process_group(group, Signal::KILL);
                        return 137;
                    }
                    Some(_) => {}
                }
            }
        }
    }
}

/// The exit code a shell would report for `status`.
pub fn exit_code(status: ExitStatus) -> i32 {
    use std::os::unix::process::ExitStatusExt;
    status.code().or_else(|| status.signal().map(|s| 128 + s)).unwrap_or(1)
}

/// A command running under the supervisor, in its own process group.
pub struct Supervised {
    child: Child,
    group: Pid,
    deadline_file: PathBuf,
    _dir: tempfile::TempDir,
}

impl Supervised {
    /// Starts `cmd` with `env` added to our environment. The supervisor stops it on its
    /// own at `stop_at_ns` (monotonic) unless [`Supervised::extend`] moves that on.
    pub fn spawn(cmd: &[String], env: &[(&str, String)], stop_at_ns: u64, grace: Duration) -> Result<Self> {
        let exe = std::env::current_exe().context("cannot find the tenure executable to supervise the command")?;
        let dir = tempfile::Builder::new()
            .prefix("tenure-run-")
            .tempdir()
            .context("cannot create the command's deadline file")?;
        let deadline_file = dir.path().join("deadline");
        write_stop_at(&deadline_file, stop_at_ns).context("cannot write the command's deadline file")?;
        let child = Command::new(exe)
            .arg("__child")
            .arg(std::process::id().to_string())
            .arg(&deadline_file)
            .arg(grace.as_millis().to_string())
            .arg("--")
            .args(cmd)
            .envs(env.iter().map(|(k, v)| (*k, v.as_str())))
            .process_group(0)
            .spawn()
            .with_context(|| format!("cannot start {:?}", cmd.first().map(String::as_str).unwrap_or("")))?;
        let pid = child.id().context("the command exited before it could be supervised")?;
        let group = Pid::from_raw(pid as i32).context("the command has an invalid process id")?;
        Ok(Self { child, group, deadline_file, _dir: dir })
    }

    /// Moves the instant at which the supervisor stops the command on its own.
    pub fn extend(&self, stop_at_ns: u64) {
        if let Err(e) = write_stop_at(&self.deadline_file, stop_at_ns) {
            tracing::warn!(error = %e, "cannot extend the command's deadline; it may be stopped early");
        }
    }

    /// Whether the supervisor stopped the command itself (its deadline passed unextended).
    pub fn stopped_by_supervisor(&self) -> bool {
        stopped_marker(&self.deadline_file).exists()
    }

    /// The process group id (the supervisor's pid).
    pub fn pid(&self) -> i32 {
        self.group.as_raw_pid()
    }

    /// Waits for the command to exit on its own, then clears its process group.
    pub async fn wait(&mut self) -> i32 {
        let code = self.child.wait().await.map(exit_code).unwrap_or(1);
        self.kill_group(Signal::KILL);
        code
    }

    /// Stops the command: SIGTERM to its whole group, SIGKILL after `grace`.
    /// Returns once the supervisor has exited and the group has been killed.
    pub async fn stop(&mut self, grace: Duration) -> i32 {
        self.kill_group(Signal::TERM);
        let code = match tokio::time::timeout(grace, self.child.wait()).await {
            Ok(status) => status.map(exit_code).unwrap_or(1),
            Err(_) => {
                tracing::warn!(
                    pid = self.pid(),
                    ?grace,
                    "the command did not stop within the grace period; killing it"
                );
                self.kill_group(Signal::KILL);
                self.child.wait().await.map(exit_code).unwrap_or(1)
            }
        };
        self.kill_group(Signal::KILL);
        code
    }

    fn kill_group(&self, sig: Signal) {
        // ESRCH (the group is already gone) is the expected answer after an exit.
        let _ = rustix::process::kill_process_group(self.group, sig);
    }
}
