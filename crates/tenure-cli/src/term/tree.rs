//! The command's process tree: its cgroup, its descendants, signalling and reaping them.

use super::*;

/// The directory of this process's cgroup (version 2), under the cgroup2 mount; `None`
/// where there is none.
pub(super) fn own_cgroup() -> Option<PathBuf> {
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
pub(super) fn command_cgroup(deadline_file: &Path) -> Option<PathBuf> {
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

/// The supervisor's place in the command's cgroup: made, and entered by the supervisor
/// so that the command it starts begins there; left once the command is started, since
/// the supervisor must not be killed with it. A move between cgroups waits on the kernel
/// (several milliseconds on a busy host), so a standby supervisor makes and enters it
/// while it waits, not when its term begins. Removed (when empty) on drop.
pub(super) struct CgroupSeat {
    pub(super) cg: PathBuf,
    /// The supervisor's own cgroup, to go back to; `None` once back.
    pub(super) home: Option<PathBuf>,
}

impl CgroupSeat {
    /// Makes cgroup `cg` and enters it; `None` (nothing left behind) where either fails.
    pub(super) fn take(cg: Option<PathBuf>) -> Option<Self> {
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
    pub(super) fn leave(&mut self) -> Option<PathBuf> {
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
pub(super) fn kill_cgroup(cg: &Path) {
    let _ = std::fs::write(cg.join("cgroup.kill"), b"1");
}

/// The processes in cgroup `cg` (none if it is gone).
pub(super) fn cgroup_members(cg: &Path) -> Vec<Pid> {
    let procs = std::fs::read_to_string(cg.join("cgroup.procs")).unwrap_or_default();
    procs.lines().filter_map(|l| l.trim().parse().ok()).filter_map(Pid::from_raw).collect()
}

/// Every live descendant of `root`, found through `/proc` (parents before children).
pub fn descendants(root: Pid) -> Vec<Pid> {
    descendants_of(&[root])
}

/// How many checks of the guard go by between its looks over the command's tree (each
/// reads all of `/proc`).
pub(super) const REMEMBER_EVERY: u32 = 10;

/// Every live descendant of any of `roots`, from one reading of `/proc`.
pub(super) fn descendants_of(roots: &[Pid]) -> Vec<Pid> {
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

/// The exit code a shell would report for a wait status.
pub(super) fn wait_code(st: rustix::process::WaitStatus) -> i32 {
    st.exit_status().or_else(|| st.terminating_signal().map(|s| 128 + s)).unwrap_or(1)
}

/// The fields of `/proc/PID/stat` from the state on (field 3; COMM, which may hold
/// spaces and parentheses, ends at the last ')'), or `None` if `pid` is gone.
pub(super) fn stat_fields(pid: Pid) -> Option<Vec<String>> {
    let stat = std::fs::read_to_string(format!("/proc/{}/stat", pid.as_raw_pid())).ok()?;
    stat.rfind(')').map(|i| stat[i + 1..].split_whitespace().map(String::from).collect())
}

/// When `pid` started (clock ticks after boot, field 22), to tell it from a later
/// process that was given the same number; `None` if it is gone.
pub(super) fn start_time(pid: Pid) -> Option<u64> {
    stat_fields(pid)?.get(19)?.parse().ok()
}

/// Whether `pid` is gone for good: no such process, or a zombie with no thread left
/// (field 20; a process whose main thread ended while others work also shows as a zombie).
pub(super) fn finished(pid: Pid) -> bool {
    let Some(f) = stat_fields(pid) else { return true };
    let threads: Option<u64> = f.get(17).and_then(|t| t.parse().ok());
    match f.first().map(String::as_str) {
        Some("X") => true,
        Some("Z") => threads.is_none_or(|t| t <= 1),
        _ => false,
    }
}

/// `tree` once over, without what has [`finished`].
pub(super) fn unfinished(mut tree: Vec<Pid>) -> Vec<Pid> {
    tree.sort_by_key(|p| p.as_raw_pid());
    tree.dedup();
    tree.retain(|p| !finished(*p));
    tree
}

/// Whether `pid` is held stopped (SIGSTOP, or traced).
pub(super) fn held_stopped(pid: Pid) -> bool {
    stat_fields(pid).is_some_and(|f| matches!(f.first().map(String::as_str), Some("T" | "t")))
}

/// Whether `pid` is a process that runs (not gone, not a zombie).
pub(super) fn alive(pid: Pid) -> bool {
    stat_fields(pid).is_some_and(|f| !matches!(f.first().map(String::as_str), None | Some("Z") | Some("X")))
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
pub(super) fn has_children() -> bool {
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
pub(super) fn sweep_orphans(spare: Option<Pid>) {
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
pub(super) fn reap_dead_children(me: Pid) {
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
