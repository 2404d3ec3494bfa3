//! `tenure`'s side of a term's processes: a standby supervisor made ready before the term,
//! and the supervised command, whose deadline `tenure` moves and which it stops.

use super::deadline_file::{
    env_file, open_stop_at, ready_marker, started_marker, stop_at_record, stopped_marker, supervisor_dir,
    write_atomically, write_metadata, write_stop_at,
};
use super::guard::{MAX_GUARDS, spawn_guard};
use super::limits::{DESCRIPTOR_LIMIT_ENV, starting_descriptor_limit};
use super::supervisor::exit_code;
use super::tree::{command_cgroup, held_stopped, kill_cgroup, signal_tree, sweep_orphans};
use super::*;

/// Starts the supervisor process (`tenure __child`) for `cmd`, in a process group of
/// its own, with `env` added to its environment.
pub(super) fn spawn_supervisor(
    cmd: &[String],
    deadline_file: &Path,
    grace: Duration,
    standby: bool,
    env: &[(&str, String)],
) -> Result<(Child, Pid)> {
    let exe = own_program().context("cannot find the tenure executable to supervise the command")?;
    let mut command = Command::new(exe);
    if let Some(soft) = starting_descriptor_limit() {
        command.env(DESCRIPTOR_LIMIT_ENV, soft.to_string());
    }
    // The store's URL (and its password) stays with tenure: neither the supervisor nor
    // the command needs it.
    command.env_remove(STORE_ENV);
    command.arg0("tenure").arg("__child").arg(std::process::id().to_string()).arg(deadline_file);
    command.arg(grace.as_millis().to_string());
    if standby {
        command.arg("--standby");
    }
    let child = command
        .arg("--")
        .args(cmd)
        .envs(env.iter().map(|(k, v)| (*k, v.as_str())))
        .process_group(0)
        .spawn()
        .with_context(|| format!("cannot start {:?}", cmd.first().map(String::as_str).unwrap_or("")))?;
    let pid = child.id().context("the command exited before it could be supervised")?;
    let supervisor = Pid::from_raw(pid as i32).context("the command has an invalid process id")?;
    Ok((child, supervisor))
}

/// A supervisor started ahead of a term, waiting, ready, to be told to start the
/// command: a new leader's command then starts without waiting for the supervisor's own
/// start, a few milliseconds of every handover. `tenure run` keeps one while it
/// follows. It starts nothing until [`Standby::start`], and exits without starting
/// anything when `tenure` stops it or dies.
pub struct Standby {
    pub(super) child: Option<Child>,
    pub(super) supervisor: Pid,
    /// Its guard, started with it and armed once the deadline file is written.
    pub(super) guard: Option<Child>,
    pub(super) deadline_file: PathBuf,
    pub(super) dir: Option<tempfile::TempDir>,
    pub(super) grace: Duration,
}

impl Standby {
    /// Starts a standby supervisor for `cmd`.
    pub fn prepare(cmd: &[String], grace: Duration) -> Result<Self> {
        let dir = supervisor_dir()?;
        let deadline_file = dir.path().join("deadline");
        let (child, supervisor) = spawn_supervisor(cmd, &deadline_file, grace, true, &[])?;
        let guard = spawn_guard(supervisor, &deadline_file, grace)?;
        Ok(Self { child: Some(child), supervisor, guard: Some(guard), deadline_file, dir: Some(dir), grace })
    }

    /// Whether it runs and is ready to start the command, waiting up to `within` for it
    /// to become ready (it was started moments ago).
    pub async fn ready(&mut self, within: Duration) -> bool {
        let until = tokio::time::Instant::now() + within;
        loop {
            // A standby whose guard is gone is not ready: its term would have two of its
            // three processes, and a pair of them disabled would leave nobody to stop it.
            if !matches!(self.child.as_mut().map(Child::try_wait), Some(Ok(None)))
                || !matches!(self.guard.as_mut().map(Child::try_wait), Some(Ok(None)))
            {
                return false;
            }
            if ready_marker(&self.deadline_file).exists() {
                return true;
            }
            if tokio::time::Instant::now() >= until {
                return false;
            }
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
    }

    /// Tells it to start the command, as [`Supervised::spawn`] would have started it. If
    /// it cannot be told, it is discarded, and the error says why.
    pub async fn start(
        mut self,
        env: &[(&str, String)],
        stop_at_ns: u64,
        metadata: Option<&[u8]>,
    ) -> Result<Supervised> {
        let told = (|| -> Result<(Option<PathBuf>, std::fs::File)> {
            let dir = self.deadline_file.parent().context("the deadline file has no directory")?;
            let mut env = env.to_vec();
            let metadata_file = write_metadata(dir, metadata, &mut env)?;
            let mut pairs = Vec::new();
            for (k, v) in &env {
                anyhow::ensure!(
                    !k.contains('\0') && !v.contains('\0'),
                    "the environment variable {k} holds a NUL byte"
                );
                pairs.extend_from_slice(k.as_bytes());
                pairs.push(0);
                pairs.extend_from_slice(v.as_bytes());
                pairs.push(0);
            }
            // The environment file last: it is what a SIGUSR1 must find to start anything,
            // so a stray one in between finds nothing rather than a start without a deadline.
            write_stop_at(&self.deadline_file, stop_at_ns).context("cannot write the command's deadline file")?;
            let deadline = open_stop_at(&self.deadline_file).context("cannot open the command's deadline file")?;
            write_atomically(&env_file(&self.deadline_file), &pairs)
                .context("cannot write the command's environment")?;
            rustix::process::kill_process(self.supervisor, Signal::USR1)
                .context("cannot tell the supervisor to start the command")?;
            Ok((metadata_file, deadline))
        })();
        match (told, self.child.take(), self.dir.take()) {
            (Ok((metadata_file, deadline)), Some(child), Some(dir)) => Ok(Supervised {
                guard: self.guard.take(),
                guards_started: 1,
                grace: self.grace,
                child,
                supervisor: self.supervisor,
                deadline_file: self.deadline_file.clone(),
                deadline,
                metadata_file,
                _dir: dir,
            }),
            (told, child, dir) => {
                (self.child, self.dir) = (child, dir);
                self.discard().await;
                Err(told.err().unwrap_or_else(|| anyhow::anyhow!("the standby supervisor was already used")))
            }
        }
    }

    /// Waits until the standby in `standby`, if any, or its guard has ended (killed, or
    /// stopped by someone else); never returns while there is none. Either way the
    /// standby is of no use: a term must begin with all three of its processes.
    pub async fn ended(standby: &mut Option<Standby>) {
        let Some(s) = standby.as_mut() else { return std::future::pending().await };
        let supervisor = async {
            match s.child.as_mut() {
                Some(child) => drop(child.wait().await),
                None => std::future::pending().await,
            }
        };
        let guard = async {
            match s.guard.as_mut() {
                Some(guard) if !mutant("guard-end-unseen") => drop(guard.wait().await),
                _ => std::future::pending().await,
            }
        };
        tokio::select! {
            () = supervisor => {}
            () = guard => tracing::warn!("the standby supervisor's guard ended; starting another standby"),
        }
    }

    /// Stops it (it started nothing), waits until it has exited, and removes its files.
    pub async fn discard(mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill().await;
            // The cgroup it waited in, empty now.
            if let Some(cg) = command_cgroup(&self.deadline_file) {
                let _ = std::fs::remove_dir(cg);
            }
        }
        if let Some(mut guard) = self.guard.take() {
            let _ = guard.kill().await;
        }
    }
}

impl Drop for Standby {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            // Told to go (SIGTERM), a standby leaves and removes the cgroup it waited in;
            // one that has not gone within half a second is killed, and its cgroup
            // removed here. If this process ends first, the standby's parent-death signal
            // makes it go the same way.
            let _ = rustix::process::kill_process(self.supervisor, Signal::TERM);
            let cg = command_cgroup(&self.deadline_file);
            std::thread::spawn(move || {
                let gone = |cg: &Option<PathBuf>| cg.as_ref().is_none_or(|cg| !cg.exists());
                for _ in 0..50 {
                    if gone(&cg) {
                        break;
                    }
                    std::thread::sleep(Duration::from_millis(10));
                }
                let _ = child.start_kill();
                for _ in 0..50 {
                    if gone(&cg) || cg.as_ref().is_some_and(|cg| std::fs::remove_dir(cg).is_ok()) {
                        break;
                    }
                    std::thread::sleep(Duration::from_millis(10));
                }
            });
        }
        if let Some(guard) = &mut self.guard {
            let _ = guard.start_kill();
        }
    }
}

/// A command running under the supervisor, in its own process group.
pub struct Supervised {
    /// The guard, killed (on drop) before the directory of the deadline file it reads goes.
    pub(super) guard: Option<Child>,
    /// How many guards this term has started (one that ends is replaced, up to
    /// [`MAX_GUARDS`]).
    pub(super) guards_started: u32,
    /// The grace period, which the guard is given.
    pub(super) grace: Duration,
    pub(super) child: Child,
    pub(super) supervisor: Pid,
    pub(super) deadline_file: PathBuf,
    /// The deadline file, open for rewriting in place.
    pub(super) deadline: std::fs::File,
    pub(super) metadata_file: Option<PathBuf>,
    pub(super) _dir: tempfile::TempDir,
}

/// This very program, to start another process of it: `/proc/self/exe` where there is
/// one, which still runs this build after a package upgrade has replaced or removed its
/// file (the path `current_exe` names is then gone, and the next term could not start).
pub fn own_program() -> std::io::Result<PathBuf> {
    let proc = Path::new("/proc/self/exe");
    if proc.exists() { Ok(proc.to_path_buf()) } else { std::env::current_exe() }
}

impl Supervised {
    /// Starts `cmd` with `env` added to our environment. The supervisor stops it on its
    /// own at `stop_at_ns` (on [`boottime_ns`]'s clock) unless [`Supervised::extend`]
    /// moves that on.
    ///
    /// With `metadata`, the command also finds `TENURE_METADATA_FILE` holding it, in the
    /// same directory as the deadline file (removed with it, even if `tenure run` is killed).
    pub fn spawn(
        cmd: &[String],
        env: &[(&str, String)],
        stop_at_ns: u64,
        grace: Duration,
        metadata: Option<&[u8]>,
    ) -> Result<Self> {
        let dir = supervisor_dir()?;
        let deadline_file = dir.path().join("deadline");
        write_stop_at(&deadline_file, stop_at_ns).context("cannot write the command's deadline file")?;
        let deadline = open_stop_at(&deadline_file).context("cannot open the command's deadline file")?;
        let mut env = env.to_vec();
        let metadata_file = write_metadata(dir.path(), metadata, &mut env)?;
        let (child, supervisor) = spawn_supervisor(cmd, &deadline_file, grace, false, &env)?;
        let guard = spawn_guard(supervisor, &deadline_file, grace)
            .map_err(|e| tracing::warn!(error = format!("{e:#}"), "the command runs without its guard"))
            .ok();
        Ok(Self {
            guard,
            guards_started: 1,
            grace,
            child,
            supervisor,
            deadline_file,
            deadline,
            metadata_file,
            _dir: dir,
        })
    }

    /// Where the command's cgroup is, or will be once the supervisor has made it (see
    /// `command_cgroup`): a health check of the term enters it when it exists by then, so
    /// that what kills the term's processes kills it.
    pub fn cgroup(&self) -> Option<PathBuf> {
        command_cgroup(&self.deadline_file)
    }

    /// `TENURE_METADATA_FILE`, if the command was given one.
    pub fn metadata_file(&self) -> Option<PathBuf> {
        self.metadata_file.clone()
    }

    /// Moves the instant at which the supervisor stops the command on its own.
    pub fn extend(&self, stop_at_ns: u64) {
        use std::os::unix::fs::FileExt;
        // In place, through the descriptor kept open: no new descriptor needed. Every
        // record has the same length, so the file never holds a shorter one's tail.
        if let Err(e) = self.deadline.write_all_at(&stop_at_record(stop_at_ns), 0) {
            tracing::warn!(error = %e, "cannot extend the command's deadline; it may be stopped early");
        }
    }

    /// Whether the supervisor stopped the command itself (its deadline passed unextended).
    pub fn stopped_by_supervisor(&self) -> bool {
        stopped_marker(&self.deadline_file).exists()
    }

    /// Whether the supervisor went as far as starting the command.
    pub fn command_started(&self) -> bool {
        started_marker(&self.deadline_file).exists()
    }

    /// The supervisor's process id (also its process group id).
    pub fn pid(&self) -> i32 {
        self.supervisor.as_raw_pid()
    }

    /// Waits until the supervisor has returned: the command and every process of its tree
    /// that stayed below the supervisor have ended. Cancel-safe; [`Supervised::clean_up`]
    /// must follow.
    ///
    /// Meanwhile, a guard that ends (killed: it ends on its own only once this process is
    /// gone) is replaced at once, so that the term keeps its three processes and any two
    /// of them disabled still leave one to stop the command by the deadline.
    pub async fn exited(&mut self) -> i32 {
        loop {
            let slot = &mut self.guard;
            let guard = async {
                match slot.as_mut() {
                    Some(guard) if !mutant("guard-end-unseen") => drop(guard.wait().await),
                    _ => std::future::pending().await,
                }
            };
            tokio::select! {
                biased;
                status = self.child.wait() => return status.map(exit_code).unwrap_or(1),
                () = guard => self.replace_guard(),
            }
        }
    }

    /// Starts a guard in place of one that ended, up to [`MAX_GUARDS`] in a term.
    pub(super) fn replace_guard(&mut self) {
        self.guard = None;
        if self.guards_started >= MAX_GUARDS {
            tracing::error!(
                pid = self.pid(),
                "the command's guard ended {MAX_GUARDS} times in this term; the command runs on without one"
            );
            return;
        }
        self.guards_started += 1;
        match spawn_guard(self.supervisor, &self.deadline_file, self.grace) {
            Ok(g) => {
                tracing::warn!(pid = self.pid(), "the command's guard ended while the command ran; started another");
                self.guard = Some(g);
            }
            Err(e) => {
                tracing::error!(error = format!("{e:#}"), "the command's guard ended and cannot be started again")
            }
        }
    }

    /// After [`Supervised::exited`]: kills what a killed supervisor left behind (its
    /// orphans, its cgroup) and stops the guard.
    pub async fn clean_up(&mut self) {
        self.sweep_then_end_guard().await;
    }

    /// Kills what is left of the command's tree, then stops the guard: if this process
    /// dies during the sweep (killed with the supervisor), the guard finishes it.
    pub(super) async fn sweep_then_end_guard(&mut self) {
        // Made on every term, even when the supervisor returned with no child left: the
        // orphans of a health check (a child of this process, not of the supervisor) come
        // here too, and a supervisor's report of its own tree can be forged by the command
        // (the same user: a file it writes, a debugger that makes it exit).
        let guard = self.guard.as_ref().and_then(|g| g.id()).and_then(|p| Pid::from_raw(p as i32));
        sweep_orphans(guard);
        // The command's cgroup, which a killed supervisor left: whatever is still in it
        // (outside this tree: it moved itself out) goes, then the cgroup.
        if let Some(cg) = command_cgroup(&self.deadline_file).filter(|cg| cg.is_dir()) {
            kill_cgroup(&cg);
            let t0 = std::time::Instant::now();
            while std::fs::remove_dir(&cg).is_err() && cg.is_dir() && t0.elapsed() < STOP_SLACK {
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        }
        self.end_guard().await;
    }

    /// Stops the guard: the tree is gone.
    pub(super) async fn end_guard(&mut self) {
        if let Some(mut guard) = self.guard.take() {
            let _ = guard.kill().await;
        }
    }

    /// Ends a supervisor that has not started the command and is held stopped (SIGSTOP):
    /// it cannot act on SIGTERM, and has nothing to stop gracefully, so waiting a grace
    /// period for it would only keep the term from its command. Does nothing, and returns
    /// `false`, unless both hold.
    pub async fn end_if_frozen_before_start(&mut self) -> bool {
        if self.command_started() || !held_stopped(self.supervisor) {
            return false;
        }
        let _ = rustix::process::kill_process(self.supervisor, Signal::KILL);
        let _ = self.child.wait().await;
        // Woken and started a moment before the kill after all: its orphans go here.
        self.sweep_then_end_guard().await;
        true
    }

    /// Stops the command: SIGTERM to its whole tree (through the supervisor), SIGKILL
    /// after `grace`. Returns once nothing of the tree is left.
    pub async fn stop(&mut self, grace: Duration) -> i32 {
        let _ = rustix::process::kill_process(self.supervisor, Signal::TERM);
        // The supervisor sends SIGKILL itself at `grace`; STOP_SLACK is for the kill.
        // Through `exited`, so that a guard killed while the command is being stopped is
        // replaced as during the term.
        let waited = if mutant("stop-guard-unseen") {
            // The planted bug: a guard that ends during the stop is not replaced.
            tokio::time::timeout(grace + STOP_SLACK, async { self.child.wait().await.map(exit_code).unwrap_or(1) })
                .await
        } else {
            tokio::time::timeout(grace + STOP_SLACK, self.exited()).await
        };
        let code = match waited {
            Ok(code) => code,
            Err(_) => {
                // The supervisor is stopped or stuck: kill the whole tree from here, the
                // supervisor with it (everything below this process, a subreaper).
                tracing::warn!(
                    pid = self.pid(),
                    ?grace,
                    "the command's supervisor did not stop in time; killing its tree"
                );
                signal_tree(rustix::process::getpid(), Signal::KILL);
                self.child.wait().await.map(exit_code).unwrap_or(1)
            }
        };
        self.sweep_then_end_guard().await;
        code
    }
}
