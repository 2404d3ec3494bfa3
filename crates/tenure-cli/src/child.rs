//! Running a command as a supervised child whose whole process tree dies with us.
//!
//! `tenure` starts the command through itself (`tenure __child PID DEADLINE_FILE GRACE_MS
//! -- CMD…`). That small supervisor:
//!
//! - is a **child subreaper** (`PR_SET_CHILD_SUBREAPER`): every process the command
//!   starts stays its descendant, whatever process group or session it moves to
//!   (`setsid`, `timeout`, daemons that double-fork), because an orphan is re-parented
//!   to the supervisor instead of to init. Stopping the command means signalling every
//!   descendant (found through `/proc`), not one process group;
//! - **never exits while a descendant lives**: it returns only when it has no child
//!   left, and since it is a subreaper, no child means no descendant. When the command
//!   exits on its own, whatever it left behind is stopped (SIGTERM, grace, SIGKILL)
//!   before the supervisor returns and `tenure` releases the lease;
//! - asks the kernel to signal it when `tenure` dies (`PR_SET_PDEATHSIG`) and then kills
//!   the whole tree with SIGKILL, so a SIGKILL of `tenure run` leaves no orphan that
//!   could keep acting as a second leader;
//! - is a **dead man's switch**: `tenure` writes to DEADLINE_FILE the instant by which
//!   the command must start stopping, on the host's boot-time clock (`CLOCK_BOOTTIME`,
//!   which counts time the host spends suspended, as the store's clock does), and moves
//!   it forward after every renewal. If that instant passes, because `tenure` is frozen
//!   (SIGSTOP, a stalled VM) or stuck, or the file cannot be read, the supervisor sends
//!   SIGTERM to the tree itself, and SIGKILL after the grace period, before the lease
//!   deadline.
//!
//! - has a **guard** beside it (`tenure __guard PID SUPERVISOR DEADLINE_FILE GRACE_MS`), a
//!   third process that does nothing while either of the other two does its part. It reads
//!   the same deadline file; when the command's processes still run past the instant by
//!   which the supervisor should have killed them (the deadline less the kill margin), or
//!   when `tenure` has died and the supervisor has not stopped the tree a moment later,
//!   it kills them itself. So no pair of tenure's processes, frozen or killed together
//!   (`tenure` and its supervisor both stopped, `tenure` stopped and the supervisor killed,
//!   the supervisor stopped and `tenure` killed under a subreaper that keeps the stopped
//!   group from being orphaned), leaves the command running past its term.
//!
//! What can still escape: work handed to a process outside the tree (a request to a
//! system service such as `systemd-run`, `at` or a container daemon, or to another
//! host), and all three of tenure's processes disabled at once. docs/safety.md says how
//! to close those.

use std::collections::HashMap;
use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::process::ExitStatus;
use std::time::Duration;

use anyhow::{Context, Result};
use rustix::process::{Pid, Signal, WaitOptions};
use tokio::process::{Child, Command};
use tokio::signal::unix::{SignalKind, signal};

/// How often the supervisor reads its deadline file (and checks that `tenure` lives).
pub const CHECK_EVERY: Duration = Duration::from_millis(20);

/// How often a standby supervisor checks that `tenure` lives (its parent-death signal
/// is what ends it at once).
const STANDBY_CHECK_EVERY: Duration = Duration::from_millis(500);

/// How long after the grace period [`Supervised::stop`] waits for the supervisor before
/// it kills the tree itself; less than the margin `tenure run` keeps before the deadline.
pub const STOP_SLACK: Duration = Duration::from_millis(100);

/// The host's boot-time clock in nanoseconds (`CLOCK_BOOTTIME`): shared by every process
/// on the host, never stepped, and, unlike `CLOCK_MONOTONIC`, still counting while the
/// host is suspended, as the store's clock does.
pub fn boottime_ns() -> u64 {
    let t = rustix::time::clock_gettime(rustix::time::ClockId::Boottime);
    t.tv_sec as u64 * 1_000_000_000 + t.tv_nsec as u64
}

/// The instant written in the deadline file; `None` when it cannot be read, which the
/// supervisor treats as a deadline already passed (it fails closed).
fn read_stop_at(path: &Path) -> Option<u64> {
    match read_private(path) {
        // `tenure run` rewrites the record in place: a read that met a write half done
        // fails its check, and the next read finds it whole.
        Ok(s) => parse_stop_at(&s).or_else(|| read_private(path).ok().and_then(|s| parse_stop_at(&s))),
        // Planted (with the standby's wait skipped): a deadline file not yet written is
        // taken for no deadline.
        Err(_) if mutant("standby-starts-unbidden") => Some(u64::MAX),
        Err(_) => None,
    }
}

/// The instant stopping was due, if it has come by `now`: the deadline file's instant,
/// or `now` when the file cannot be read.
fn passed_stop_at(path: &Path, now: u64) -> Option<u64> {
    match read_stop_at(path) {
        Some(stop_at) if now < stop_at => None,
        Some(stop_at) => Some(stop_at),
        None => Some(now),
    }
}

/// Why [`passed_stop_at`] said stop, for the log: a deadline that passed, or a deadline
/// file that could not be believed (and what was wrong with it), which is not the same
/// fault and is fixed elsewhere.
fn stop_cause(path: &Path) -> String {
    match read_private(path) {
        Ok(s) if parse_stop_at(&s).is_some() => "the lease was not renewed in time".to_string(),
        Ok(_) => format!("the deadline file {} holds no deadline that tenure wrote", path.display()),
        Err(e) => format!("the deadline file cannot be believed ({e})"),
    }
}

/// When the grace period of a stop asked for now begins: now, or the instant stopping
/// was due if that has passed.
fn stop_due(deadline_file: &Path) -> u64 {
    let now = boottime_ns();
    passed_stop_at(deadline_file, now).unwrap_or(now)
}

/// The file the supervisor creates when it stops the command itself.
fn stopped_marker(deadline_file: &Path) -> PathBuf {
    deadline_file.with_extension("stopped")
}

/// The file the supervisor creates just before it starts the command: without it, a
/// supervisor that ended did not start it.
fn started_marker(deadline_file: &Path) -> PathBuf {
    deadline_file.with_extension("started")
}

/// The file a standby supervisor creates once it can be told to start the command.
fn ready_marker(deadline_file: &Path) -> PathBuf {
    deadline_file.with_extension("ready")
}

/// The file that tells a standby supervisor what to add to the command's environment:
/// `NAME\0VALUE\0` pairs, written before it is told to start.
fn env_file(deadline_file: &Path) -> PathBuf {
    deadline_file.with_extension("env")
}

/// The environment variable that names the store, kept out of every process tenure
/// starts: its URL may carry a password.
pub(crate) const STORE_ENV: &str = "TENURE_STORE";

/// Writes `bytes` to `path` atomically: a reader finds the old content or the new.
fn write_atomically(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    let mut tmp = path.as_os_str().to_owned();
    tmp.push(".new");
    write_private(Path::new(&tmp), bytes)?;
    std::fs::rename(tmp, path)
}

/// Writes `bytes` to `path`, a file only this user may read or write (0600 whatever the
/// umask), never through a symbolic link.
pub(crate) fn write_private(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    use std::io::Write;
    use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .custom_flags(rustix::fs::OFlags::NOFOLLOW.bits() as i32)
        .open(path)?;
    f.set_permissions(std::fs::Permissions::from_mode(0o600))?;
    f.write_all(bytes)
}

/// Reads `path`, but only a file of this user's that nobody else may write, reached
/// without a symbolic link: a deadline or environment file someone else made or could
/// change is not the one `tenure run` wrote, and is not believed (an error, which the
/// readers take as a deadline that has passed).
fn read_private(path: &Path) -> std::io::Result<Vec<u8>> {
    use std::io::Read;
    use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
    let mut f = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(rustix::fs::OFlags::NOFOLLOW.bits() as i32)
        .open(path)
        .map_err(|e| match e.raw_os_error() {
            Some(code) if code == rustix::io::Errno::LOOP.raw_os_error() => std::io::Error::new(
                std::io::ErrorKind::PermissionDenied,
                format!("{} is a symbolic link, not a file tenure wrote", path.display()),
            ),
            _ => e,
        })?;
    let meta = f.metadata()?;
    let own = meta.uid() == rustix::process::geteuid().as_raw() && meta.mode() & 0o022 == 0;
    if !own && !mutant("deadline-file-trusted") {
        return Err(std::io::Error::new(
            std::io::ErrorKind::PermissionDenied,
            format!("{} is not a file of this user's that only it may write", path.display()),
        ));
    }
    let mut buf = Vec::new();
    f.read_to_end(&mut buf)?;
    Ok(buf)
}

/// A deadline record: the instant in 20 digits and a check of it, so that a reader can
/// tell a record rewritten in place under its read (a mix of two) from a whole one. Every
/// record has the same length.
fn stop_at_record(stop_at_ns: u64) -> Vec<u8> {
    format!("{stop_at_ns:020} {:016x}\n", stop_at_check(stop_at_ns)).into_bytes()
}

/// The check of a deadline record (a 64-bit mix of the instant).
fn stop_at_check(stop_at_ns: u64) -> u64 {
    let mut z = stop_at_ns.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// The instant in a deadline record; `None` if it is not whole. A bare number (as
/// written before records had a check) is taken as it is.
fn parse_stop_at(bytes: &[u8]) -> Option<u64> {
    let text = std::str::from_utf8(bytes).ok()?.trim();
    match text.split_once(' ') {
        Some((instant, check)) => {
            let instant: u64 = instant.parse().ok()?;
            (u64::from_str_radix(check, 16).ok()? == stop_at_check(instant)).then_some(instant)
        }
        None => text.parse().ok(),
    }
}

/// Writes the instant by which the command must start stopping, atomically.
fn write_stop_at(path: &Path, stop_at_ns: u64) -> std::io::Result<()> {
    write_atomically(path, &stop_at_record(stop_at_ns))
}

/// Opens the deadline file `tenure run` wrote, to rewrite it in place from then on: moving
/// the deadline then needs no new descriptor (a process out of descriptors, under a flood
/// of connections, still keeps its command's deadline).
fn open_stop_at(path: &Path) -> std::io::Result<std::fs::File> {
    use std::os::unix::fs::OpenOptionsExt;
    std::fs::OpenOptions::new().write(true).custom_flags(rustix::fs::OFlags::NOFOLLOW.bits() as i32).open(path)
}

/// The pairs of an environment file; `None` if it cannot be read or is malformed.
fn read_env(path: &Path) -> Option<Vec<(OsString, OsString)>> {
    use std::os::unix::ffi::OsStringExt;
    let bytes = read_private(path).ok()?;
    if bytes.is_empty() {
        return Some(Vec::new());
    }
    let body = bytes.strip_suffix(b"\0")?;
    let fields: Vec<&[u8]> = body.split(|b| *b == 0).collect();
    if !fields.len().is_multiple_of(2) {
        return None;
    }
    Some(fields.chunks(2).map(|p| (OsString::from_vec(p[0].to_vec()), OsString::from_vec(p[1].to_vec()))).collect())
}

/// Removes the directory `tenure run` made for the deadline file (only one it made:
/// named `tenure-run-…`).
fn remove_deadline_dir(deadline_file: &Path) {
    if let Some(dir) = deadline_file.parent()
        && dir.file_name().and_then(|n| n.to_str()).is_some_and(|n| n.starts_with("tenure-run-"))
    {
        let _ = std::fs::remove_dir_all(dir);
    }
}

/// The directory of this process's cgroup (version 2), under the cgroup2 mount; `None`
/// where there is none.
fn own_cgroup() -> Option<PathBuf> {
    let own = std::fs::read_to_string("/proc/self/cgroup").ok()?;
    let path = own.lines().find_map(|l| l.strip_prefix("0::"))?.to_string();
    let mounts = std::fs::read_to_string("/proc/self/mountinfo").ok()?;
    mounts.lines().find_map(|line| {
        let (left, right) = line.split_once(" - ")?;
        if right.split_whitespace().next() != Some("cgroup2") {
            return None;
        }
        // Fields 4 and 5: the mount's root within the hierarchy, and where it is mounted.
        let mut fields = left.split_whitespace().skip(3);
        let (root, point) = (fields.next()?, fields.next()?);
        let inside = if root == "/" { path.as_str() } else { path.strip_prefix(root)? };
        Some(PathBuf::from(point).join(inside.trim_start_matches('/')))
    })
}

/// The cgroup a term's command runs in, where the host lets tenure's user make one (root,
/// a container's own cgroup, a delegated systemd unit): a child of tenure's own cgroup,
/// named after the supervisor's directory. The kernel keeps every process the command
/// starts in it whatever it does (a new session, a double fork, a chain of forks faster
/// than any look over `/proc`), and `cgroup.kill` kills them all at once.
///
/// Not with `TENURE_CGROUP=off`, and not inside a systemd unit that was not given its
/// cgroup's subtree (`Delegate=yes`): systemd alone manages such a unit's cgroup, and
/// stopping the unit stops every process in it anyway.
fn command_cgroup(deadline_file: &Path) -> Option<PathBuf> {
    let name = deadline_file.parent()?.file_name()?.to_str()?;
    name.starts_with("tenure-run-").then_some(())?;
    if std::env::var_os(CGROUP_ENV).is_some_and(|v| v == "off") {
        return None;
    }
    let own = own_cgroup()?;
    let in_unit = own.components().any(|c| {
        let c = c.as_os_str().to_string_lossy();
        c.ends_with(".service") || c.ends_with(".scope")
    });
    let delegated = || {
        ["trusted.delegate", "user.delegate"].iter().any(|x| {
            let mut buf = [0u8; 8];
            rustix::fs::getxattr(&own, *x, &mut buf).is_ok_and(|n| buf[..n].starts_with(b"1"))
        })
    };
    if in_unit && !delegated() {
        return None;
    }
    Some(own.join(name))
}

/// The environment variable that turns the command's cgroup off (`TENURE_CGROUP=off`; any
/// other value, or none, leaves it on where the host allows one).
pub const CGROUP_ENV: &str = "TENURE_CGROUP";

/// The supervisor's place in the command's cgroup: made, and entered by the supervisor
/// so that the command it starts begins there; left once the command is started, since
/// the supervisor must not be killed with it. A move between cgroups waits on the kernel
/// (several milliseconds on a busy host), so a standby supervisor makes and enters it
/// while it waits, not when its term begins. Removed (when empty) on drop.
struct CgroupSeat {
    cg: PathBuf,
    /// The supervisor's own cgroup, to go back to; `None` once back.
    home: Option<PathBuf>,
}

impl CgroupSeat {
    /// Makes cgroup `cg` and enters it; `None` (nothing left behind) where either fails.
    fn take(cg: Option<PathBuf>) -> Option<Self> {
        let (home, cg) = (own_cgroup()?, cg?);
        std::fs::create_dir(&cg).ok()?;
        if std::fs::write(cg.join("cgroup.procs"), b"0").is_err() {
            let _ = std::fs::remove_dir(&cg);
            return None;
        }
        Some(Self { cg, home: Some(home) })
    }

    /// Goes back to the supervisor's own cgroup; the cgroup, which the supervisor may now
    /// kill whole, or `None` if it could not leave it (the guard, which kills it anyway
    /// when it must act, then kills the supervisor with the command).
    fn leave(&mut self) -> Option<PathBuf> {
        let home = self.home.take()?;
        match std::fs::write(home.join("cgroup.procs"), b"0") {
            Ok(()) => Some(self.cg.clone()),
            Err(e) => {
                eprintln!("tenure: cannot leave the command's cgroup {}: {e}", self.cg.display());
                None
            }
        }
    }
}

impl Drop for CgroupSeat {
    fn drop(&mut self) {
        if self.home.is_some() {
            let _ = self.leave();
        }
        let _ = std::fs::remove_dir(&self.cg);
    }
}

/// Kills every process in cgroup `cg` at once (`cgroup.kill`; nothing if it is gone).
fn kill_cgroup(cg: &Path) {
    let _ = std::fs::write(cg.join("cgroup.kill"), b"1");
}

/// The processes in cgroup `cg` (none if it is gone).
fn cgroup_members(cg: &Path) -> Vec<Pid> {
    let procs = std::fs::read_to_string(cg.join("cgroup.procs")).unwrap_or_default();
    procs.lines().filter_map(|l| l.trim().parse().ok()).filter_map(Pid::from_raw).collect()
}

/// Every live descendant of `root`, found through `/proc` (parents before children).
pub fn descendants(root: Pid) -> Vec<Pid> {
    descendants_of(&[root])
}

/// How often the guard checks the deadline and its parent: it acts at most this much
/// after the grace and [`STOP_SLACK`], well within the margin `tenure run` leaves between
/// that and the lease's end, and costs next to nothing meanwhile.
const GUARD_EVERY: Duration = Duration::from_millis(50);

/// How many checks of the guard go by between its looks over the command's tree (each
/// reads all of `/proc`).
const REMEMBER_EVERY: u32 = 10;

/// Every live descendant of any of `roots`, from one reading of `/proc`.
fn descendants_of(roots: &[Pid]) -> Vec<Pid> {
    let mut children: HashMap<i32, Vec<i32>> = HashMap::new();
    let Ok(dir) = std::fs::read_dir("/proc") else { return Vec::new() };
    for entry in dir.flatten() {
        let Some(pid) = entry.file_name().to_str().and_then(|n| n.parse::<i32>().ok()) else { continue };
        let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else { continue };
        // "PID (COMM) STATE PPID …": COMM may hold spaces and parentheses; the last ')' ends it.
        let Some(rest) = stat.rfind(')').map(|i| &stat[i + 1..]) else { continue };
        let mut fields = rest.split_whitespace();
        let state = fields.next();
        let Some(ppid) = fields.next().and_then(|p| p.parse::<i32>().ok()) else { continue };
        if state == Some("X") || (state == Some("Z") && mutant("zombie-is-dead")) {
            continue; // being removed: nothing to signal
        }
        // A "Z" entry may be dead, or only its main thread may have ended while other
        // threads (and its children) still work: it is kept, signalled (harmless for a
        // real zombie) and walked through.
        children.entry(ppid).or_default().push(pid);
    }
    let mut out = Vec::new();
    let mut queue: Vec<i32> = roots.iter().map(|r| r.as_raw_pid()).collect();
    while let Some(p) = queue.pop() {
        for &c in children.get(&p).map(Vec::as_slice).unwrap_or(&[]) {
            if let Some(pid) = Pid::from_raw(c) {
                out.push(pid);
                queue.push(c);
            }
        }
    }
    out
}

/// Sends `sig` to every live descendant of `root`; returns how many there were.
pub fn signal_tree(root: Pid, sig: Signal) -> usize {
    let all = descendants(root);
    for &p in &all {
        // ESRCH: it exited between the listing and the signal.
        let _ = rustix::process::kill_process(p, sig);
    }
    all.len()
}

pub(crate) use tenure::mutant;

/// The exit code a shell would report for a wait status.
fn wait_code(st: rustix::process::WaitStatus) -> i32 {
    st.exit_status().or_else(|| st.terminating_signal().map(|s| 128 + s)).unwrap_or(1)
}

/// What the supervisor is doing with the tree.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Phase {
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

/// The guard's body (`tenure __guard`), the third process of a term: it acts only when
/// `tenure` (`parent`) and the supervisor both failed to stop the command in time. While
/// `tenure` lives, the deadline file says when stopping was due (`stop_at`): the supervisor
/// sends SIGTERM then and SIGKILL a grace period later, so anything of the tree still
/// alive [`STOP_SLACK`] after that (and before the lease deadline, [`crate::run`]'s kill
/// margin later) is killed here, every descendant of `tenure` but this guard. No deadline
/// file yet (a standby's, before its term): nothing is armed. Once `tenure` is gone, the
/// supervisor kills its tree at once (its parent-death signal); what is left of it
/// [`STOP_SLACK`] later, the supervisor included (frozen), is killed here. It returns when
/// nothing is left to guard; `tenure` kills it sooner when the term ends as it should.
pub fn guard(parent: i32, supervisor: i32, deadline_file: &Path, grace: Duration) -> i32 {
    let me = rustix::process::getpid();
    let Some(supervisor) = Pid::from_raw(supervisor) else { return 2 };
    if rustix::process::getppid().map(Pid::as_raw_pid) != Some(parent) {
        return 125;
    }
    let Some(parent_pid) = Pid::from_raw(parent) else { return 2 };
    let late = (grace + STOP_SLACK).as_nanos() as u64;
    let mut parent_gone_at: Option<u64> = None;
    let mut told = false;
    // The command's processes seen so far (pid and start time): killed with `tenure run`
    // and the supervisor both gone, the processes are re-parented away from either, and
    // only this memory still finds them.
    let mut known: HashMap<i32, u64> = HashMap::new();
    // Once a deadline was read, a file that can no longer be read (removed, replaced by
    // one that is not this user's, garbage) counts as a deadline passed when that was
    // first seen: fail closed, as the supervisor does.
    let mut armed_at: Option<u32> = None;
    let mut unreadable_since: Option<u64> = None;
    if mutant("guard-off") {
        // The planted bug: a guard that does nothing, but stays (one that ended would be
        // replaced, see [`Supervised::exited`]).
        while rustix::process::getppid().map(Pid::as_raw_pid) == Some(parent) {
            std::thread::sleep(GUARD_EVERY);
        }
        return 0;
    }
    let mut round: u32 = 0;
    // The command's cgroup, once the supervisor made it (see `command_cgroup`).
    let cgroup_path = command_cgroup(deadline_file);
    let mut cgroup: Option<PathBuf> = None;
    loop {
        let now = boottime_ns();
        if cgroup.is_none() && !mutant("guard-ignores-cgroup") {
            cgroup = cgroup_path.clone().filter(|cg| cg.is_dir());
        }
        let in_cgroup = || cgroup.as_deref().map(cgroup_members).unwrap_or_default();
        // The tree is looked over every REMEMBER_EVERY, not at every check: a look reads
        // all of /proc, and the guard should cost next to nothing while all is well.
        // Every check for a while after the deadline first appears (the command has just
        // started, and starts its own processes), every REMEMBER_EVERY after that.
        let lately_armed = armed_at.is_some_and(|a| round.saturating_sub(a) < 2 * REMEMBER_EVERY);
        if (lately_armed || round.is_multiple_of(REMEMBER_EVERY)) && alive(supervisor) {
            known.retain(|p, t| Pid::from_raw(*p).and_then(start_time) == Some(*t));
            for p in descendants(supervisor) {
                if let Some(t) = start_time(p) {
                    known.insert(p.as_raw_pid(), t);
                }
            }
        }
        round = round.wrapping_add(1);
        let remembered = || -> Vec<Pid> {
            let alive: Vec<Pid> = known
                .iter()
                .filter(|(p, t)| Pid::from_raw(**p).and_then(start_time) == Some(**t))
                .filter_map(|(p, _)| Pid::from_raw(*p))
                .collect();
            let mut tree = descendants_of(&alive);
            tree.extend(alive);
            tree
        };
        let parent_alive = rustix::process::getppid().map(Pid::as_raw_pid) == Some(parent);
        let tree = if parent_alive {
            // A file that is there but cannot be believed (not this user's alone, garbage)
            // arms the guard as a good one does: it is written whole (renamed into place)
            // at a term's start, so only a term's start puts it there. Rewritten in place
            // after that, a read may meet a write half done: that fails the record's
            // check, and the next read finds it whole.
            let read = read_private(deadline_file);
            let missing = matches!(&read, Err(e) if e.kind() == std::io::ErrorKind::NotFound);
            let parsed = read.ok().and_then(|s| {
                parse_stop_at(&s).or_else(|| read_private(deadline_file).ok().and_then(|s| parse_stop_at(&s)))
            });
            let stop_at = match parsed {
                Some(at) => {
                    armed_at.get_or_insert(round);
                    unreadable_since = None;
                    Some(at)
                }
                None if (armed_at.is_some() || !missing) && !mutant("guard-believes-no-file") => {
                    armed_at.get_or_insert(round);
                    Some(*unreadable_since.get_or_insert(now))
                }
                None => None,
            };
            match stop_at {
                Some(stop_at) if now >= stop_at.saturating_add(late) => {
                    // The cgroup first, before the look over /proc below, which on a host
                    // of thousands of processes takes longer than the margin left.
                    if let Some(cg) = &cgroup {
                        kill_cgroup(cg);
                    }
                    let mut tree: Vec<Pid> = descendants(parent_pid).into_iter().filter(|p| *p != me).collect();
                    tree.extend(remembered());
                    tree.extend(in_cgroup());
                    // What ended already and waits for the frozen `tenure` to reap it (the
                    // supervisor, a finished health check) neither works nor needs killing.
                    unfinished(tree)
                }
                _ => Vec::new(),
            }
        } else {
            let gone_at = *parent_gone_at.get_or_insert(now);
            let mut tree = descendants(supervisor);
            if alive(supervisor) {
                tree.push(supervisor);
            }
            if !mutant("guard-forgets-orphans") {
                tree.extend(remembered());
            }
            tree.extend(in_cgroup());
            // Killed already, and left unreaped by whoever they were re-parented to.
            let tree = unfinished(tree);
            if tree.is_empty() {
                // Nobody else is left to clean up: `tenure run` is gone, and the supervisor
                // too (or it was killed here before it could). The cgroup may still hold a
                // process on its way out for a moment.
                if let Some(cg) = &cgroup {
                    let t0 = std::time::Instant::now();
                    while std::fs::remove_dir(cg).is_err() && cg.is_dir() && t0.elapsed() < Duration::from_secs(2) {
                        std::thread::sleep(Duration::from_millis(10));
                    }
                }
                remove_deadline_dir(deadline_file);
                return 0;
            }
            if now < gone_at.saturating_add(STOP_SLACK.as_nanos() as u64) { Vec::new() } else { tree }
        };
        if !tree.is_empty() {
            if !told {
                told = true;
                eprintln!(
                    "tenure: neither tenure nor the command's supervisor stopped the command in time; killing its {} process(es)",
                    tree.len()
                );
            }
            // The cgroup first: the kernel kills every process in it at once, a chain of
            // forks included, which one signal a process cannot outrun.
            if let Some(cg) = &cgroup {
                kill_cgroup(cg);
            }
            for p in tree {
                let _ = rustix::process::kill_process(p, Signal::KILL);
            }
        }
        std::thread::sleep(GUARD_EVERY);
    }
}

/// The fields of `/proc/PID/stat` from the state on (field 3; COMM, which may hold
/// spaces and parentheses, ends at the last ')'), or `None` if `pid` is gone.
fn stat_fields(pid: Pid) -> Option<Vec<String>> {
    let stat = std::fs::read_to_string(format!("/proc/{}/stat", pid.as_raw_pid())).ok()?;
    stat.rfind(')').map(|i| stat[i + 1..].split_whitespace().map(String::from).collect())
}

/// When `pid` started (clock ticks after boot, field 22), to tell it from a later
/// process that was given the same number; `None` if it is gone.
fn start_time(pid: Pid) -> Option<u64> {
    stat_fields(pid)?.get(19)?.parse().ok()
}

/// Whether `pid` is gone for good: no such process, or a zombie with no thread left
/// (field 20; a process whose main thread ended while others work also shows as a zombie).
fn finished(pid: Pid) -> bool {
    let Some(f) = stat_fields(pid) else { return true };
    let threads: Option<u64> = f.get(17).and_then(|t| t.parse().ok());
    match f.first().map(String::as_str) {
        Some("X") => true,
        Some("Z") => threads.is_none_or(|t| t <= 1),
        _ => false,
    }
}

/// `tree` once over, without what has [`finished`].
fn unfinished(mut tree: Vec<Pid>) -> Vec<Pid> {
    tree.sort_by_key(|p| p.as_raw_pid());
    tree.dedup();
    tree.retain(|p| !finished(*p));
    tree
}

/// Whether `pid` is held stopped (SIGSTOP, or traced).
fn held_stopped(pid: Pid) -> bool {
    stat_fields(pid).is_some_and(|f| matches!(f.first().map(String::as_str), Some("T" | "t")))
}

/// Whether `pid` is a process that runs (not gone, not a zombie).
fn alive(pid: Pid) -> bool {
    stat_fields(pid).is_some_and(|f| !matches!(f.first().map(String::as_str), None | Some("Z") | Some("X")))
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

/// How many guards one term starts at most: one that ends is replaced, but not forever.
const MAX_GUARDS: u32 = 16;

/// Starts the guard of the supervisor `supervisor`, whose deadline file is `deadline_file`.
fn spawn_guard(supervisor: Pid, deadline_file: &Path, grace: Duration) -> Result<Child> {
    let exe = own_program().context("cannot find the tenure executable to guard the command")?;
    let mut command = Command::new(exe);
    command
        .arg0("tenure")
        .env_remove(STORE_ENV)
        .arg("__guard")
        .arg(std::process::id().to_string())
        .arg(supervisor.as_raw_pid().to_string())
        .arg(deadline_file)
        .arg(grace.as_millis().to_string())
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .process_group(0)
        .kill_on_drop(true);
    command.spawn().context("cannot start the command's guard")
}

/// A standby supervisor's wait: ready (it says so with its ready marker), it waits for
/// SIGUSR1 from `tenure`, which first writes the command's environment and deadline.
/// Returns the environment to add, or the code to exit with without starting anything:
/// 0 when `tenure` no longer needs it (SIGTERM, SIGINT), 137 when `tenure` is gone.
async fn wait_to_start(
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

/// Makes this process the subreaper of its descendants, so that if a supervisor itself
/// is killed, the command's processes come to this process instead of escaping to init,
/// and [`Supervised`] can still stop them.
pub fn become_subreaper() -> Result<()> {
    rustix::process::set_child_subreaper(Some(rustix::process::getpid()))
        .context("cannot become a subreaper for the command's processes")
}

/// Whether this process has any child at all, running or waiting to be reaped; none are
/// reaped by asking.
fn has_children() -> bool {
    use rustix::process::{WaitId, WaitIdOptions};
    let peek = WaitIdOptions::EXITED | WaitIdOptions::NOHANG | WaitIdOptions::NOWAIT;
    !matches!(rustix::process::waitid(WaitId::All, peek), Err(rustix::io::Errno::CHILD))
}

/// Kills every descendant of this process with SIGKILL until none is left, and reaps
/// them. Called only when no supervisor runs: anything left is an orphan of a
/// supervisor that was itself killed. An orphan is re-parented to this process (a
/// subreaper) when its parent dies, so with no child left there is nothing to sweep, and
/// the walks through `/proc`, a few milliseconds each on a busy host and on the way from a
/// command's exit to the release, are skipped. That is the usual case: a supervisor that
/// returns on its own has no descendant left.
fn sweep_orphans(spare: Option<Pid>) {
    // The planted bug: orphans of a killed supervisor are left to run.
    if mutant("orphans-not-swept") || !has_children() {
        return;
    }
    let me = rustix::process::getpid();
    for _ in 0..500 {
        let left: Vec<Pid> = descendants(me).into_iter().filter(|p| Some(*p) != spare).collect();
        for &p in &left {
            let _ = rustix::process::kill_process(p, Signal::KILL);
        }
        reap_dead_children(me);
        if left.is_empty() {
            return;
        }
        std::thread::sleep(Duration::from_millis(2));
    }
    tracing::error!("processes of the command are still alive after repeated SIGKILL");
}

/// Reaps the dead (zombie) children of `me` that were re-parented to it.
fn reap_dead_children(me: Pid) {
    let Ok(dir) = std::fs::read_dir("/proc") else { return };
    for entry in dir.flatten() {
        let Some(pid) = entry.file_name().to_str().and_then(|n| n.parse::<i32>().ok()) else { continue };
        let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else { continue };
        let Some(rest) = stat.rfind(')').map(|i| &stat[i + 1..]) else { continue };
        let f: Vec<&str> = rest.split_whitespace().take(2).collect();
        if f.len() == 2 && f[0] == "Z" && f[1].parse::<i32>().ok() == Some(me.as_raw_pid()) {
            let _ = rustix::process::waitpid(Pid::from_raw(pid), WaitOptions::NOHANG);
        }
    }
}

/// The directory for a supervisor's files (its deadline, its marks, the metadata).
fn supervisor_dir() -> Result<tempfile::TempDir> {
    use std::os::unix::fs::PermissionsExt;
    // Only this user may enter it, whatever the umask: what is in it says when the
    // command must stop, and what it runs with.
    tempfile::Builder::new()
        .prefix("tenure-run-")
        .permissions(std::fs::Permissions::from_mode(0o700))
        .tempdir()
        .context("cannot create the command's deadline file")
}

/// Writes `metadata`, if any, into `dir` and names it in `env` as `TENURE_METADATA_FILE`.
fn write_metadata(dir: &Path, metadata: Option<&[u8]>, env: &mut Vec<(&str, String)>) -> Result<Option<PathBuf>> {
    let Some(m) = metadata else { return Ok(None) };
    let file = dir.join("metadata");
    write_private(&file, m).context("cannot write TENURE_METADATA_FILE")?;
    env.push(("TENURE_METADATA_FILE", file.display().to_string()));
    Ok(Some(file))
}

/// Starts the supervisor process (`tenure __child`) for `cmd`, in a process group of
/// its own, with `env` added to its environment.
fn spawn_supervisor(
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
    child: Option<Child>,
    supervisor: Pid,
    /// Its guard, started with it and armed once the deadline file is written.
    guard: Option<Child>,
    deadline_file: PathBuf,
    dir: Option<tempfile::TempDir>,
    grace: Duration,
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
    guard: Option<Child>,
    /// How many guards this term has started (one that ends is replaced, up to
    /// [`MAX_GUARDS`]).
    guards_started: u32,
    /// The grace period, which the guard is given.
    grace: Duration,
    child: Child,
    supervisor: Pid,
    deadline_file: PathBuf,
    /// The deadline file, open for rewriting in place.
    deadline: std::fs::File,
    metadata_file: Option<PathBuf>,
    _dir: tempfile::TempDir,
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
    fn replace_guard(&mut self) {
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
    async fn sweep_then_end_guard(&mut self) {
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
    async fn end_guard(&mut self) {
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

/// The soft descriptor limit this process started with, if [`raise_descriptor_limit`]
/// raised it.
static STARTING_DESCRIPTOR_LIMIT: std::sync::OnceLock<u64> = std::sync::OnceLock::new();

/// Tells the supervisor the soft descriptor limit to give the command back.
const DESCRIPTOR_LIMIT_ENV: &str = "TENURE_INTERNAL_NOFILE";

/// Raises this process's soft limit on open descriptors to its hard limit, so that the
/// connections of `--http` and the dashboard cannot take the descriptors that renewing the
/// lease and keeping the command's deadline need. The command, the hooks and health
/// checks get the limit back as it was: some programs expect the usual soft limit.
pub fn raise_descriptor_limit() {
    use rustix::process::{Resource, Rlimit, getrlimit, setrlimit};
    let start = getrlimit(Resource::Nofile);
    let Some(soft) = start.current else { return };
    if start.maximum.is_some_and(|hard| hard <= soft) {
        return;
    }
    match setrlimit(Resource::Nofile, Rlimit { current: start.maximum, maximum: start.maximum }) {
        Ok(()) => {
            let _ = STARTING_DESCRIPTOR_LIMIT.set(soft);
        }
        Err(e) => tracing::debug!(error = %e, "cannot raise the descriptor limit"),
    }
}

/// The soft descriptor limit this process started with, if it raised it.
pub fn starting_descriptor_limit() -> Option<u64> {
    STARTING_DESCRIPTOR_LIMIT.get().copied()
}

/// In the supervisor: sets the soft descriptor limit back to what `tenure run` started
/// with (passed in [`DESCRIPTOR_LIMIT_ENV`]), before it starts the command.
fn lower_descriptor_limit() {
    use rustix::process::{Resource, Rlimit, getrlimit, setrlimit};
    let Some(soft) = std::env::var(DESCRIPTOR_LIMIT_ENV).ok().and_then(|v| v.parse::<u64>().ok()) else { return };
    let now = getrlimit(Resource::Nofile);
    if let Err(e) = setrlimit(Resource::Nofile, Rlimit { current: Some(soft), maximum: now.maximum }) {
        eprintln!("tenure: warning: cannot set the command's descriptor limit back to {soft}: {e}");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_deadline_record_reads_back_and_a_mix_of_two_is_refused() {
        let (old, new) = (stop_at_record(999_999_999), stop_at_record(1_000_000_000));
        assert_eq!(old.len(), new.len());
        assert_eq!(parse_stop_at(&old), Some(999_999_999));
        assert_eq!(parse_stop_at(&new), Some(1_000_000_000));
        // A read that met the rewrite half done: every mix of the two is refused, never
        // taken for an instant later than either.
        for cut in 1..old.len() {
            let mixed: Vec<u8> = new[..cut].iter().chain(&old[cut..]).copied().collect();
            if mixed != old && mixed != new {
                assert_eq!(parse_stop_at(&mixed), None, "{}", String::from_utf8_lossy(&mixed));
            }
        }
        assert_eq!(parse_stop_at(b"12345\n"), Some(12345));
        assert_eq!(parse_stop_at(b"00000000000000012345 0000000000000000\n"), None);
        assert_eq!(parse_stop_at(b"garbage"), None);
    }

    #[test]
    fn the_descriptor_limit_is_raised_and_the_starting_one_remembered() {
        use rustix::process::{Resource, getrlimit};
        let before = getrlimit(Resource::Nofile);
        raise_descriptor_limit();
        let after = getrlimit(Resource::Nofile);
        assert_eq!(after.current, after.maximum);
        if before.current != before.maximum {
            assert_eq!(starting_descriptor_limit(), before.current);
        }
    }
}
