//! The supervisor (`tenure __child`): starts the command, stops its tree at the deadline
//! written for it or when `tenure` dies, and never exits while a descendant lives.

use super::deadline_file::{
    env_file, passed_stop_at, read_env, ready_marker, remove_deadline_dir, started_marker, stop_cause, stop_due,
    stopped_marker, write_private,
};
use super::limits::{DESCRIPTOR_LIMIT_ENV, lower_descriptor_limit};
use super::tree::{CgroupSeat, command_cgroup, kill_cgroup, signal_tree, wait_code};
use super::*;

/// What the supervisor is doing with the tree.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Phase {
    /// The command runs inside its term.
    Running,
    /// SIGTERM went to the whole tree at this instant (boot-time ns); SIGKILL follows
    /// after the grace period.
    Terminating(u64),
    /// SIGKILL to the whole tree until nothing of it is left.
    Killing,
}

/// The hidden subcommand's body: supervise `cmd` and return its exit code once no
/// process of its tree is left. A `standby` supervisor first waits, ready, until `tenure`
/// tells it to start (see [`Standby`]).
pub async fn supervisor(parent: i32, deadline_file: &Path, grace: Duration, standby: bool, cmd: &[String]) -> i32 {
    // Ask for SIGUSR2 when our parent dies, then check it has not died already.
    if let Err(e) = rustix::process::set_parent_process_death_signal(Some(Signal::USR2)) {
        eprintln!("tenure: cannot arrange to stop with the parent process: {e}");
        return 125;
    }
    if rustix::process::getppid().map(Pid::as_raw_pid) != Some(parent) {
        return 125;
    }
    let me = rustix::process::getpid();
    if let Err(e) = rustix::process::set_child_subreaper(Some(me)) {
        eprintln!("tenure: cannot become the command's subreaper, so its orphans could escape: {e}");
        return 125;
    }
    // A handler, not SIG_IGN (which the command would inherit), for SIGHUP: the kernel
    // sends it when `tenure` dies and leaves this process group orphaned.
    let (Ok(mut parent_died), Ok(mut term), Ok(mut int), Ok(mut chld), Ok(mut hup)) = (
        signal(SignalKind::user_defined2()),
        signal(SignalKind::terminate()),
        signal(SignalKind::interrupt()),
        signal(SignalKind::child()),
        signal(SignalKind::hangup()),
    ) else {
        eprintln!("tenure: cannot install signal handlers");
        return 125;
    };
    let Some((program, args)) = cmd.split_first() else {
        eprintln!("tenure: no command given");
        return 2;
    };
    // No process of the tree may gain privileges (setuid programs such as sudo): the
    // supervisor could not signal it, and it would outlive the term.
    if let Err(e) = rustix::thread::set_no_new_privs(true) {
        eprintln!("tenure: cannot stop the command's processes from gaining privileges: {e}");
        return 125;
    }
    // A standby takes its seat in the command's cgroup now, while it waits.
    let mut seat = if standby { CgroupSeat::take(command_cgroup(deadline_file)) } else { None };
    let added_env = if standby {
        match wait_to_start(parent, deadline_file, &mut parent_died, &mut term, &mut int).await {
            Ok(env) => env,
            Err(code) => return code,
        }
    } else {
        Vec::new()
    };
    // A term may have run out between the decision to start and now (`tenure` frozen
    // or slow): work must not start on a term that cannot stop it in time.
    // A standby told nothing has no deadline file yet, which fails closed here too.
    if passed_stop_at(deadline_file, boottime_ns()).is_some() {
        let _ = write_private(&stopped_marker(deadline_file), b"");
        eprintln!("tenure: the term ran out before the command could start; not starting it");
        return 125;
    }
    // Started with std, not tokio: this process reaps every child itself (`waitpid(-1)`),
    // including orphans re-parented to it, and tokio's reaper must not take part. In a
    // process group of its own: a `kill -STOP 0` in the command, or a read from the
    // terminal (SIGTTIN), stops the command's group, never the supervisor.
    use std::os::unix::process::CommandExt;
    lower_descriptor_limit();
    let mut command = std::process::Command::new(program);
    command.args(args).envs(added_env).env_remove(STORE_ENV).env_remove(DESCRIPTOR_LIMIT_ENV);
    if !mutant("command-in-supervisor-group") {
        command.process_group(0);
    }
    if let Err(e) = write_private(&started_marker(deadline_file), b"") {
        eprintln!("tenure: cannot start the command: {e}");
        return 125;
    }
    if seat.is_none() && !standby {
        seat = CgroupSeat::take(command_cgroup(deadline_file));
    }
    let spawned = command.spawn();
    let cgroup = seat.as_mut().and_then(CgroupSeat::leave);
    let command = match spawned {
        Ok(c) => c.id() as i32,
        Err(e) => {
            eprintln!("tenure: cannot start {program:?}: {e}");
            return if e.kind() == std::io::ErrorKind::NotFound { 127 } else { 126 };
        }
    };
    let grace_ns = grace.as_nanos() as u64;
    let mut code: Option<i32> = None;
    let mut phase = Phase::Running;
    let mut parent_gone = false;
    let mut check = tokio::time::interval(CHECK_EVERY);
    loop {
        // Reap whatever ended; no child left means no descendant left (we are a subreaper).
        loop {
            // `wait`, not `waitpid(None)`: that waits only for children in our own process
            // group, and the command and orphans from other sessions are in others.
            match rustix::process::wait(WaitOptions::NOHANG) {
                Ok(Some((pid, st))) => {
                    if pid.as_raw_pid() == command {
                        code = Some(wait_code(st));
                        if mutant("supervisor-exits-with-command") {
                            // Planted: what the supervisor did before it was a subreaper.
                            return wait_code(st);
                        }
                    }
                }
                Ok(None) => break,
                Err(rustix::io::Errno::CHILD) => {
                    // Nothing of the command is left: its cgroup, if it had one, is empty.
                    drop(seat.take());
                    if parent_gone {
                        // `tenure run` cannot clean up after itself: its directory goes too.
                        remove_deadline_dir(deadline_file);
                        return 137;
                    }
                    return code.unwrap_or(1);
                }
                Err(rustix::io::Errno::INTR) => {}
                Err(_) => break,
            }
        }
        let now = boottime_ns();
        // Checked on every pass, not only on the timer: a stream of SIGCHLD must not keep
        // the checks from running.
        if !parent_gone && rustix::process::getppid().map(Pid::as_raw_pid) != Some(parent) {
            parent_gone = true;
            phase = Phase::Killing;
        }
        if phase == Phase::Running
            && let Some(at) = passed_stop_at(deadline_file, now)
        {
            // `tenure` did not extend the deadline: it is frozen or stuck. Leave a mark,
            // so that it reads the exit as a stop, not a finish. The grace period counts
            // from the instant stopping was due, not from now.
            let _ = write_private(&stopped_marker(deadline_file), b"");
            eprintln!("tenure: {}; stopping the command", stop_cause(deadline_file));
            signal_tree(me, Signal::TERM);
            phase = Phase::Terminating(at);
        }
        if code.is_some() && phase == Phase::Running {
            // The command ended but left processes behind: they would outlive the term.
            signal_tree(me, Signal::TERM);
            phase = Phase::Terminating(now);
        }
        if let Phase::Terminating(at) = phase
            && now >= at.saturating_add(grace_ns)
        {
            phase = Phase::Killing;
        }
        if phase == Phase::Killing {
            // The cgroup too: a chain of forks can keep ahead of a look over /proc.
            if let Some(cg) = &cgroup {
                kill_cgroup(cg);
            }
            signal_tree(me, Signal::KILL);
        }
        tokio::select! {
            biased;
            _ = parent_died.recv() => {
                // `tenure` is gone: nobody renews the lease. Kill everything now.
                parent_gone = true;
                phase = Phase::Killing;
            }
            // `tenure` asks the command to stop: pass it on to the whole tree. The grace
            // period counts from now, or from the instant stopping was due if that has
            // passed (a host frozen with both processes in it, resumed).
            _ = term.recv() => if phase == Phase::Running {
                signal_tree(me, Signal::TERM);
                phase = Phase::Terminating(stop_due(deadline_file));
            },
            _ = int.recv() => if phase == Phase::Running {
                signal_tree(me, Signal::INT);
                phase = Phase::Terminating(stop_due(deadline_file));
            },
            _ = chld.recv() => {}
            _ = hup.recv() => {}
            // Wakes the loop, whose top checks the parent and the deadline.
            _ = check.tick() => {}
        }
    }
}

/// `tenure __in-term PARENT [--cgroup CG] -- CMD…`: becomes `cmd` (exec) after asking to
/// be killed when `tenure` (`parent`) dies and entering the command's cgroup `cg` (where
/// the term has one, and the kernel lets it), so that a shell command of the term (a
/// health check, with the term's token) ends with `tenure run`, and whatever it leaves in
/// new sessions is killed with the command's processes. Returns only on failure.
pub fn in_term(parent: i32, cg: Option<&Path>, cmd: &[String]) -> i32 {
    use std::os::unix::process::CommandExt;
    if !mutant("health-leftovers-kept") {
        if let Err(e) = rustix::process::set_parent_process_death_signal(Some(Signal::KILL)) {
            eprintln!("tenure: cannot ask to end with tenure: {e}");
            return 125;
        }
        // `tenure` died before the signal was asked for: nothing of the term may start.
        if rustix::process::getppid().map(Pid::as_raw_pid) != Some(parent) {
            return 137;
        }
        if let Some(cg) = cg {
            // Outside it if refused (the cgroup went with a term that ended meanwhile).
            let _ = std::fs::write(cg.join("cgroup.procs"), b"0");
        }
    }
    let Some((program, args)) = cmd.split_first() else { return 2 };
    let e = std::process::Command::new(program).args(args).exec();
    eprintln!("tenure: cannot start {program}: {e}");
    127
}

/// A standby supervisor's wait: ready (it says so with its ready marker), it waits for
/// SIGUSR1 from `tenure`, which first writes the command's environment and deadline.
/// Returns the environment to add, or the code to exit with without starting anything:
/// 0 when `tenure` no longer needs it (SIGTERM, SIGINT), 137 when `tenure` is gone.
pub(super) async fn wait_to_start(
    parent: i32,
    deadline_file: &Path,
    parent_died: &mut tokio::signal::unix::Signal,
    term: &mut tokio::signal::unix::Signal,
    int: &mut tokio::signal::unix::Signal,
) -> Result<Vec<(OsString, OsString)>, i32> {
    let Ok(mut go) = signal(SignalKind::user_defined1()) else {
        eprintln!("tenure: cannot install signal handlers");
        return Err(125);
    };
    if let Err(e) = write_private(&ready_marker(deadline_file), b"") {
        eprintln!("tenure: cannot prepare to start the command: {e}");
        return Err(125);
    }
    let gone = || {
        // `tenure run` cannot clean up after itself: its directory goes too.
        remove_deadline_dir(deadline_file);
        Err(137)
    };
    // Its parent-death signal ends it; the look at its parent is the fallback, and an
    // idle standby should cost next to nothing.
    let mut check = tokio::time::interval(STANDBY_CHECK_EVERY);
    loop {
        if mutant("standby-starts-unbidden") {
            // The planted bug: the command starts before its term does (and, in
            // `read_stop_at`, its missing deadline file is taken for no deadline, or
            // that would keep it from starting).
            return Ok(Vec::new());
        }
        // The planted bug `standby-outlives-parent`: both ways of seeing `tenure` gone ignored.
        let blind = mutant("standby-outlives-parent");
        if !blind && rustix::process::getppid().map(Pid::as_raw_pid) != Some(parent) {
            return gone();
        }
        tokio::select! {
            biased;
            _ = parent_died.recv() => if !blind {
                return gone();
            },
            _ = term.recv() => return Err(0),
            _ = int.recv() => return Err(0),
            // Anyone may send SIGUSR1; only `tenure`, which writes the file first, starts it.
            _ = go.recv() => if let Some(env) = read_env(&env_file(deadline_file)) {
                return Ok(env);
            },
            _ = check.tick() => {}
        }
    }
}

/// The exit code a shell would report for `status`.
pub fn exit_code(status: ExitStatus) -> i32 {
    use std::os::unix::process::ExitStatusExt;
    status.code().or_else(|| status.signal().map(|s| 128 + s)).unwrap_or(1)
}
