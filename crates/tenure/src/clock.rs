//! The clock the runtime reads time through, so tests and simulations can control it.

use std::future::Future;
use std::pin::Pin;
use std::sync::OnceLock;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

pub use tokio::time::Instant;

/// A monotonic clock. The runtime and the memory store read time only through this.
///
/// [`TokioClock`] follows tokio's clock, so `#[tokio::test(start_paused = true)]`
/// runs the runtime on paused time; a simulation can supply clocks that drift.
pub trait Clock: Send + Sync + 'static {
    /// The current instant.
    fn now(&self) -> Instant;

    /// Completes once [`Clock::now`] has reached `deadline`.
    fn sleep_until(&self, deadline: Instant) -> Pin<Box<dyn Future<Output = ()> + Send + 'static>>;
}

/// tokio's monotonic clock (paused in tests that pause it), plus the time the host has
/// spent suspended since the process started.
///
/// `CLOCK_MONOTONIC`, which tokio's `Instant` reads, stops while the host is suspended
/// (a laptop lid, a VM snapshot, hibernation), but the store's clock does not: a leader
/// that judged its deadline by it would, after a resume, believe it still leads for as
/// long as the host slept, while the store has handed the lease on. This clock adds the
/// growth of `CLOCK_BOOTTIME - CLOCK_MONOTONIC` (the time spent suspended) to tokio's
/// `Instant`, so deadlines judged by it pass during a suspend, as the store's do; a
/// timer set before a suspend still fires late (tokio's timers follow the monotonic
/// clock), but every check of [`Clock::now`] after the resume sees the time that passed.
/// The gap is read between two monotonic readings, taken at once if they lie within a
/// millisecond of each other, else read again (five tries, the narrowest kept): a thread
/// stalled between the readings (a frozen process, a paused vCPU) would otherwise count
/// the stall as a suspend, and the clock would run ahead for good, which for an observer
/// judging expiry by it means taking over early.
/// A frozen VM that the hypervisor does not report as suspended keeps its clocks running
/// or not as the hypervisor chooses: there only fencing tokens protect the resource.
#[derive(Clone, Copy, Debug, Default)]
pub struct TokioClock;

impl Clock for TokioClock {
    fn now(&self) -> Instant {
        Instant::now() + host_suspended()
    }

    fn sleep_until(&self, deadline: Instant) -> Pin<Box<dyn Future<Output = ()> + Send + 'static>> {
        let real = deadline.checked_sub(host_suspended()).unwrap_or_else(Instant::now);
        Box::pin(tokio::time::sleep_until(real))
    }
}

/// How long the host has been suspended since this process first asked (zero where the
/// system cannot tell).
pub fn host_suspended() -> Duration {
    static BASE: OnceLock<u64> = OnceLock::new();
    static COUNTED: AtomicU64 = AtomicU64::new(0);
    let gap = boottime_gap();
    let base = *BASE.get_or_init(|| gap.low);
    let grown = suspended_growth(base, gap.high);
    Duration::from_nanos(COUNTED.fetch_max(grown, Ordering::SeqCst).max(grown))
}

/// The suspend counted from a reading: growth of the gap since `base` (its first reading),
/// only past [`SUSPEND_THRESHOLD_NS`]. Never less than before is kept by the caller, so
/// the clock never steps back.
fn suspended_growth(base: u64, gap: u64) -> u64 {
    let grown = gap.saturating_sub(base);
    if grown < SUSPEND_THRESHOLD_NS { 0 } else { grown }
}

/// Growth of `CLOCK_BOOTTIME - CLOCK_MONOTONIC` below this is reading jitter, not a suspend.
const SUSPEND_THRESHOLD_NS: u64 = 10_000_000;

/// The widest the two monotonic readings around a boot-time reading may lie apart for the
/// gap to be taken at once: a thread descheduled between the readings (a frozen process,
/// a paused vCPU, a busy host) would otherwise add its stall to the gap, and the clock
/// would run ahead for good, by as long as the stall. After a suspend, the count can
/// exceed the true suspend by up to two such widths (the base's bracket and the
/// reading's), which observers add to their wait.
pub(crate) const BRACKET_NS: i128 = 1_000_000;

/// `CLOCK_BOOTTIME - CLOCK_MONOTONIC`, the time the host has spent suspended since it
/// booted, within the width of the bracket around it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Gap {
    /// At most the true gap (what a first reading, counted from, takes).
    low: u64,
    /// At least the true gap (what a later reading counts: deadlines pass early, never late).
    high: u64,
}

/// Reads the gap between a monotonic reading before and one after the boot-time reading,
/// up to [`BRACKET_TRIES`] times, and keeps the narrowest bracket: the first within
/// [`BRACKET_NS`] at once. Both bounds hold however wide it is, so a holder's clock (which
/// counts the high one) never runs behind, and an observer's runs ahead by at most the
/// width kept, which takes every try stalled to be more than a millisecond.
fn bracketed(mut read: impl FnMut(Which) -> i128) -> Gap {
    let mut best: Option<(i128, Gap)> = None;
    for _ in 0..BRACKET_TRIES {
        let before = read(Which::Monotonic);
        let boot = read(Which::Boottime);
        let after = read(Which::Monotonic);
        let gap = |mono: i128| (boot - mono).max(0) as u64;
        let width = (after - before).abs();
        let this = Gap { low: gap(after), high: gap(before) };
        if width <= BRACKET_NS || crate::mutant("clock-unbracketed") {
            return this;
        }
        if best.is_none_or(|(w, _)| width < w) {
            best = Some((width, this));
        }
    }
    best.map_or(Gap { low: 0, high: 0 }, |(_, gap)| gap)
}

/// How many times a stalled reading of the gap is tried again.
const BRACKET_TRIES: usize = 5;

/// Which clock to read.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Which {
    Monotonic,
    Boottime,
}

#[cfg(any(target_os = "linux", target_os = "android"))]
fn boottime_gap() -> Gap {
    use rustix::time::{ClockId, clock_gettime};
    bracketed(|which| {
        let t = clock_gettime(match which {
            Which::Monotonic => ClockId::Monotonic,
            Which::Boottime => ClockId::Boottime,
        });
        t.tv_sec as i128 * 1_000_000_000 + t.tv_nsec as i128
    })
}

#[cfg(not(any(target_os = "linux", target_os = "android")))]
fn boottime_gap() -> Gap {
    Gap { low: 0, high: 0 }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A reader of clocks that tell of a host suspended for `suspended` ns, and that stall
    /// the reading thread for `stall` ns after each monotonic reading on the `stalled`
    /// first tries (a frozen process, a paused vCPU).
    fn reader(suspended: i128, stall: i128, mut stalled: usize) -> impl FnMut(Which) -> i128 {
        let mut now = 5_000_000_000i128;
        let mut reads = 0;
        move |which| {
            reads += 1;
            let t = match which {
                Which::Monotonic => now,
                Which::Boottime => now + suspended,
            };
            // A try is three reads; the stall falls between its first two.
            if reads % 3 == 1 && stalled > 0 {
                stalled -= 1;
                now += stall;
            }
            now += 1_000;
            t
        }
    }

    /// The thread stalls for two seconds between the monotonic and the boot-time reading:
    /// that stall is not time the host spent suspended. Counted as such, the clock would
    /// run two seconds ahead for good, and an observer judging a lease by it (the object
    /// stores) would take it over two seconds before its holder's term ends.
    #[test]
    fn a_stall_between_the_readings_is_not_a_suspend() {
        let second = 1_000_000_000;
        // Stalled once, then read cleanly: the suspend as it was, within the bracket.
        let gap = bracketed(reader(3 * second, 2 * second, 1));
        assert!(gap.low <= (3 * second) as u64 && gap.high >= (3 * second) as u64, "{gap:?}");
        assert!(gap.high - (3 * second) as u64 <= BRACKET_NS as u64, "the stall was counted: {gap:?}");
        // Stalled on every try: the narrowest bracket, whose bounds still hold (a holder
        // counts the high one, so its clock does not fall behind a real suspend).
        let gap = bracketed(reader(3 * second, 2 * second, BRACKET_TRIES));
        assert!(gap.low <= (3 * second) as u64 && gap.high >= (3 * second) as u64, "{gap:?}");
        // A suspend is counted, from the first reading as the base.
        let base = bracketed(reader(0, 0, 0)).low;
        let later = bracketed(reader(3 * second, 0, 0)).high;
        assert!(suspended_growth(base, later).abs_diff((3 * second) as u64) <= BRACKET_NS as u64 * 2);
        // Jitter within the bracket is not.
        assert_eq!(suspended_growth(base, base + BRACKET_NS as u64), 0);
    }

    #[test]
    fn reading_jitter_is_not_a_suspend() {
        // Both clocks run at the same rate while the host is awake: thousands of readings
        // must all say no time was spent suspended, exactly (paused-time tests rely on it).
        for _ in 0..10_000 {
            assert_eq!(host_suspended(), Duration::ZERO);
        }
    }
}
