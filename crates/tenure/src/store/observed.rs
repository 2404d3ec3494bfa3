//! Expiry judged by the observer, for stores that have no clock of their own.
//!
//! Object stores and DynamoDB can compare versions but cannot time a lease. There a
//! candidate may treat a record as expired only after it has seen the *same version*
//! unchanged for a whole TTL plus a margin on its own monotonic clock, and may then
//! take over only by a write that is conditional on that version.
//!
//! Why that is safe: the holder dates its term from when it *sent* the write that made
//! the version, and that write was applied before anybody could read its result. So the
//! moment an observer first sees a version comes after the start of the holder's term,
//! and the observer's TTL plus margin outlasts the holder's own deadline as long as the
//! two monotonic clocks differ in rate by less than [`ObservedExpiry::rate_bound`].

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::clock::{Clock, Instant, TokioClock};
use crate::name::ElectionName;

/// The default bound on how much two hosts' monotonic clocks may differ in rate: 1 %.
/// Clocks under NTP slew by at most 0.05 %; a free-running quartz is within 0.01 %.
pub const DEFAULT_RATE_BOUND: f64 = 0.01;

/// The largest rate bound a memory accepts: 10 %.
pub const MAX_RATE_BOUND: f64 = 0.1;

/// One handle's memory of the versions it has seen, per election.
///
/// Share one per store handle: every elector using the handle then profits from what
/// the others read.
pub struct ObservedExpiry {
    clock: Arc<dyn Clock>,
    rate_bound: f64,
    seen: Mutex<HashMap<ElectionName, Seen>>,
}

#[derive(Clone)]
struct Seen {
    version: String,
    since: Instant,
}

/// What an observer can say about a version it has just read.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Judgement {
    /// The version may still be live; it can be judged expired after this much longer.
    Live {
        /// Time left before the version counts as expired, on this observer's clock.
        remaining: Duration,
    },
    /// The version has been seen unchanged for the TTL plus margin: a write conditional
    /// on it may take over.
    Expired,
}

impl ObservedExpiry {
    /// A memory on tokio's clock with [`DEFAULT_RATE_BOUND`].
    pub fn new() -> Self {
        Self::with_clock(Arc::new(TokioClock), DEFAULT_RATE_BOUND)
    }

    /// A memory on `clock`, assuming no two clocks differ in rate by more than
    /// `rate_bound` (a fraction, clamped to 0..=[`MAX_RATE_BOUND`]).
    pub fn with_clock(clock: Arc<dyn Clock>, rate_bound: f64) -> Self {
        Self { clock, rate_bound: rate_bound.clamp(0.0, MAX_RATE_BOUND), seen: Mutex::new(HashMap::new()) }
    }

    /// The assumed bound on the rate difference between clocks.
    pub fn rate_bound(&self) -> f64 {
        self.rate_bound
    }

    /// How long a version must be seen unchanged before it counts as expired:
    /// `ttl * (1 + rate_bound) / (1 - rate_bound)`, rounded up, plus 2 ms. The holder's
    /// deadline, at most a TTL on a clock that may run `rate_bound` slow, passes within
    /// `ttl / (1 - rate_bound)` of real time; this wait, on a clock that may run
    /// `rate_bound` fast, lasts at least that long. (About `ttl * (1 + 2 * rate_bound)`,
    /// which falls short by `2 * rate_bound²` of a TTL when the holder keeps no margin.)
    /// The 2 ms: after a suspend of its host, an observer's clock can count up to two
    /// readings' brackets more than the suspend lasted (see [`crate::TokioClock`]).
    pub fn wait(&self, ttl: Duration) -> Duration {
        let rho = self.rate_bound;
        let brackets = Duration::from_nanos(2 * crate::clock::BRACKET_NS as u64);
        ttl.mul_f64((1.0 + rho) / (1.0 - rho)) + Duration::from_nanos(1) + brackets
    }

    /// The current instant on this memory's clock: take it before sending a write.
    pub fn now(&self) -> Instant {
        self.clock.now()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<ElectionName, Seen>> {
        self.seen.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Notes that a read of `election`, answered just now, showed `version` of a record
    /// with `ttl`, and judges it. A version seen before keeps its first sighting; a new
    /// one starts counting now.
    pub fn saw(&self, election: &ElectionName, version: &str, ttl: Duration) -> Judgement {
        let now = self.clock.now();
        let mut seen = self.lock();
        let since = match seen.get(election) {
            Some(s) if s.version == version => s.since,
            _ => {
                seen.insert(election.clone(), Seen { version: version.to_string(), since: now });
                now
            }
        };
        let until = since + self.wait(ttl);
        if now >= until { Judgement::Expired } else { Judgement::Live { remaining: until - now } }
    }

    /// Notes that this handle wrote `version` of `election` with a request sent at
    /// `sent`: the version cannot have existed before then, so it counts from then.
    pub fn wrote(&self, election: &ElectionName, version: &str, sent: Instant) {
        self.lock().insert(election.clone(), Seen { version: version.to_string(), since: sent });
    }

    /// Forgets `election` (it has no record any more).
    pub fn forget(&self, election: &ElectionName) {
        self.lock().remove(election);
    }
}

impl Default for ObservedExpiry {
    fn default() -> Self {
        Self::new()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn e() -> ElectionName {
        ElectionName::new("jobs/a").unwrap()
    }

    #[tokio::test(start_paused = true)]
    async fn a_version_expires_only_after_being_seen_unchanged_for_the_ttl_plus_margin() {
        let m = ObservedExpiry::new();
        let ttl = Duration::from_secs(10);
        let wait = m.wait(ttl);
        // TTL × 1.01 / 0.99 + 2 ms: 10,204.02 ms.
        assert!(wait > Duration::from_micros(10_204_020) && wait < Duration::from_micros(10_204_021), "{wait:?}");
        assert_eq!(m.saw(&e(), "v1", ttl), Judgement::Live { remaining: wait });
        tokio::time::advance(Duration::from_secs(10)).await;
        assert_eq!(m.saw(&e(), "v1", ttl), Judgement::Live { remaining: wait - Duration::from_secs(10) });
        tokio::time::advance(wait - Duration::from_secs(10)).await;
        assert_eq!(m.saw(&e(), "v1", ttl), Judgement::Expired);
        // A new version starts the count again.
        assert_eq!(m.saw(&e(), "v2", ttl), Judgement::Live { remaining: wait });
    }

    #[tokio::test(start_paused = true)]
    async fn own_writes_count_from_when_they_were_sent() {
        let m = ObservedExpiry::new();
        let ttl = Duration::from_secs(1);
        let sent = m.now();
        tokio::time::advance(Duration::from_millis(300)).await;
        m.wrote(&e(), "v7", sent);
        assert_eq!(m.saw(&e(), "v7", ttl), Judgement::Live { remaining: m.wait(ttl) - Duration::from_millis(300) });
        // Forgotten, the same version is new again.
        m.forget(&e());
        assert_eq!(m.saw(&e(), "v7", ttl), Judgement::Live { remaining: m.wait(ttl) });
    }
}
