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
    let gap = boottime_gap_ns();
    let base = *BASE.get_or_init(|| gap);
    let grown = gap.saturating_sub(base);
    // Reading two clocks one after the other makes the gap jitter by the time between the
    // readings (well under a millisecond); a suspend lasts seconds. Count growth only past
    // a threshold, and never less than before, so the clock never steps back.
    let grown = if grown < SUSPEND_THRESHOLD_NS { 0 } else { grown };
    Duration::from_nanos(COUNTED.fetch_max(grown, Ordering::SeqCst).max(grown))
}

/// Growth of `CLOCK_BOOTTIME - CLOCK_MONOTONIC` below this is reading jitter, not a suspend.
const SUSPEND_THRESHOLD_NS: u64 = 10_000_000;

/// `CLOCK_BOOTTIME - CLOCK_MONOTONIC` in nanoseconds: the time the host has spent
/// suspended since it booted.
#[cfg(any(target_os = "linux", target_os = "android"))]
fn boottime_gap_ns() -> u64 {
    use rustix::time::{ClockId, clock_gettime};
    let ns = |id| {
        let t = clock_gettime(id);
        t.tv_sec as i128 * 1_000_000_000 + t.tv_nsec as i128
    };
    // The monotonic clock first: a suspend between the two readings then makes the gap
    // look larger, never smaller (deadlines pass early, never late).
    let mono = ns(ClockId::Monotonic);
    let boot = ns(ClockId::Boottime);
    (boot - mono).max(0) as u64
}

#[cfg(not(any(target_os = "linux", target_os = "android")))]
fn boottime_gap_ns() -> u64 {
    0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reading_jitter_is_not_a_suspend() {
        // Both clocks run at the same rate while the host is awake: thousands of readings
        // must all say no time was spent suspended, exactly (paused-time tests rely on it).
        for _ in 0..10_000 {
            assert_eq!(host_suspended(), Duration::ZERO);
        }
    }
}
