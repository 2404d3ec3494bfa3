//! A term's deadline and the processes bound to it.
//!
//! The deadline arithmetic is here, at the root: the grace periods that fit a TTL
//! ([`default_grace`], [`renew_deadline`]), the instant written for the supervisor by
//! which the command must start stopping ([`stop_at_ns`]: the lease deadline less the
//! grace and [`KILL_MARGIN`]), and the slack kept so that a renewal reaches the
//! supervisor before its switch fires ([`SWITCH_SLACK`]). The processes that obey it are
//! in the files below: the deadline file, the process tree, the supervisor, its guard,
//! and `tenure`'s handles on them.
//!
//! ## Running a command as a supervised child whose whole process tree dies with us
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

use anyhow::{Context, Result, bail};
use rustix::process::{Pid, Signal, WaitOptions};
use tenure::{Config, Leadership};
use tokio::process::{Child, Command};
use tokio::signal::unix::{SignalKind, signal};

mod deadline_file;
mod guard;
mod handle;
mod limits;
mod supervisor;
mod tree;

pub use guard::guard;
pub use handle::{Standby, Supervised, own_program};
pub use limits::{raise_descriptor_limit, starting_descriptor_limit};
pub use supervisor::{in_term, supervisor};
pub use tree::become_subreaper;

/// Time kept between killing the command and the lease deadline, for the kill itself.
pub(crate) const KILL_MARGIN: Duration = Duration::from_millis(200);

const _: () = assert!(crate::term::STOP_SLACK.as_millis() < KILL_MARGIN.as_millis());

/// How often `tenure run` passes a renewal on to the supervisor's deadline file.
pub(crate) const EXTEND_EVERY: Duration = Duration::from_millis(10);

/// How long before the supervisor's own stop instant the runtime stops taking renewals
/// (it steps down then). A renewal that lands at the last instant the runtime takes it
/// must still reach the supervisor before its switch fires: tenure run's tick, an atomic
/// file write and the supervisor's next read, twice over for a loaded host.
pub(crate) const SWITCH_SLACK: Duration = Duration::from_millis(2 * (10 + 20));
const _: () =
    assert!(SWITCH_SLACK.as_millis() >= 2 * (EXTEND_EVERY.as_millis() + crate::term::CHECK_EVERY.as_millis()));

/// The grace periods that fit `cfg`'s TTL lie below this: after the first renewal
/// attempt, at least two retries must fit before the step-down (or one slow answer would
/// end every term), and the step-down must leave the grace and the kill margin.
pub(crate) fn grace_budget(cfg: &Config) -> Duration {
    cfg.deadline_offset().saturating_sub(cfg.renew_interval + KILL_MARGIN + SWITCH_SLACK + cfg.retry_period * 2)
}

/// The shortest TTL (in whole tens of milliseconds) whose [`grace_budget`] leaves a
/// grace period of more than a millisecond.
pub(crate) fn shortest_ttl() -> Duration {
    (1..=6000u64)
        .map(|n| Duration::from_millis(n * 10))
        .find(|ttl| {
            let cfg = Config::new(*ttl);
            cfg.validate().is_ok() && grace_budget(&cfg) > Duration::from_millis(1)
        })
        .unwrap_or(Duration::from_secs(60))
}

/// The grace period when none is given: 3 s, or for a TTL too short for that, three
/// quarters of the most that fits (in whole milliseconds).
pub fn default_grace(ttl: Duration) -> Duration {
    let budget = grace_budget(&Config::new(ttl));
    Duration::from_millis((budget.as_millis() as u64).saturating_mul(3) / 4)
        .max(Duration::from_millis(1))
        .min(Duration::from_secs(3))
}

/// Checks that `ttl` is valid and that `grace` fits inside it; returns when to step down
/// (the runtime's renew deadline): the command's stop instant less [`SWITCH_SLACK`].
pub fn renew_deadline(ttl: Duration, grace: Duration) -> Result<Duration> {
    let cfg = Config::new(ttl);
    if let Err(e) = cfg.validate() {
        bail!("invalid --ttl {}: {}", humantime::format_duration(ttl), e.reason);
    }
    let budget = grace_budget(&cfg);
    if budget <= Duration::from_millis(1) {
        bail!(
            "--ttl {} is too short for a command: stopping it (SIGTERM, a grace period, SIGKILL) and retrying \
             renewals must fit before the lease runs out; the shortest TTL that leaves room is {}",
            humantime::format_duration(ttl),
            humantime::format_duration(shortest_ttl())
        );
    }
    if grace.is_zero() || grace >= budget {
        bail!(
            "--grace {} does not fit inside --ttl {}: the command must be stopped before the lease \
             runs out, and renewals need time to retry, so --grace must be above zero and below {} for this TTL \
             (or choose a longer --ttl)",
            humantime::format_duration(grace),
            humantime::format_duration(ttl),
            humantime::format_duration(Duration::from_millis(budget.as_millis() as u64)),
        );
    }
    Ok(cfg.deadline_offset() - grace - KILL_MARGIN - SWITCH_SLACK)
}

/// The instant (ns on the host's boot-time clock) by which the command must start
/// stopping: the local deadline less the grace period and the kill margin.
pub(crate) fn stop_at_ns(l: &Leadership, grace: Duration) -> u64 {
    let left = l.remaining().saturating_sub(grace + KILL_MARGIN);
    crate::term::boottime_ns() + left.as_nanos() as u64
}

/// Whether `l` has time left to start the command and still stop it (SIGTERM, `grace`,
/// SIGKILL) before the lease deadline. A term handed out late (this process was frozen
/// between the renewal and now) must not start work it cannot stop in time.
pub(crate) fn can_start(l: &Leadership, grace: Duration) -> bool {
    l.remaining() > grace + KILL_MARGIN + MIN_RUN
}

/// The least time a command gets before its supervisor must start stopping it.
pub(crate) const MIN_RUN: Duration = Duration::from_millis(100);

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

/// The environment variable that names the store, kept out of every process tenure
/// starts: its URL may carry a password.
pub(crate) const STORE_ENV: &str = "TENURE_STORE";

/// The environment variable that turns the command's cgroup off (`TENURE_CGROUP=off`; any
/// other value, or none, leaves it on where the host allows one).
pub const CGROUP_ENV: &str = "TENURE_CGROUP";

pub(crate) use tenure::mutant;

#[cfg(test)]
mod tests {
    use super::deadline_file::{parse_stop_at, stop_at_record};
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
