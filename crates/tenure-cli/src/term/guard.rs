//! The guard (`tenure __guard`): kills the command's processes when both `tenure` and
//! the supervisor have failed to stop them in time.

use super::deadline_file::{parse_stop_at, read_private, remove_deadline_dir};
use super::tree::{
    REMEMBER_EVERY, alive, cgroup_members, command_cgroup, descendants, descendants_of, kill_cgroup, start_time,
    unfinished,
};
use super::*;

/// How often the guard checks the deadline and its parent: it acts at most this much
/// after the grace and [`STOP_SLACK`], well within the margin `tenure run` leaves between
/// that and the lease's end, and costs next to nothing meanwhile.
pub(super) const GUARD_EVERY: Duration = Duration::from_millis(50);

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

/// How many guards one term starts at most: one that ends is replaced, but not forever.
pub(super) const MAX_GUARDS: u32 = 16;

/// Starts the guard of the supervisor `supervisor`, whose deadline file is `deadline_file`.
pub(super) fn spawn_guard(supervisor: Pid, deadline_file: &Path, grace: Duration) -> Result<Child> {
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
