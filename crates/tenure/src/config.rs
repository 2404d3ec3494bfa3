//! Runtime configuration, its validation, and the pure timing rules of a term.

use std::time::Duration;

use crate::clock::Instant;
use crate::record::{MAX_METADATA, MAX_TTL, MIN_TTL};

/// A configuration value was refused: says which setting and why.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid {setting}: {reason}")]
pub struct ConfigError {
    /// The setting, named as in [`Config`] (e.g. `renew_deadline`).
    pub setting: &'static str,
    /// Why it was refused, with the values involved.
    pub reason: String,
}

/// How an [`crate::Elector`] campaigns and leads.
///
/// Build it with [`Config::new`], which derives every interval from the TTL, then
/// adjust fields and call [`Config::validate`] (the elector builder does that). New
/// settings may be added in any release, so it cannot be written as a struct literal.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub struct Config {
    /// Lease length granted by the store on every acquire and renew. Default 10 s.
    pub ttl: Duration,
    /// How often the leader renews. Default `ttl / 3`.
    pub renew_interval: Duration,
    /// How long after the *send* time of the last successful renewal the leader keeps
    /// retrying before it steps down. The time between this and [`Config::deadline_offset`]
    /// is what the guarded work has to stop. Default `2 * ttl / 3`.
    pub renew_deadline: Duration,
    /// Pause between retries after a failed store call, and between polls for stores
    /// that cannot watch. Default `ttl / 10`, at most 2 s.
    pub retry_period: Duration,
    /// Longest wait for one store call; a call with no answer by then is ambiguous.
    /// Default `ttl / 5`.
    pub request_timeout: Duration,
    /// Largest rate difference between this host's monotonic clock and the store's
    /// clock, as a fraction (0.01 = 1 %). Default 0.01.
    pub max_drift: f64,
    /// Extra time subtracted from every local deadline. Default `ttl / 50`.
    pub safety_margin: Duration,
    /// Wait this long after winning before the leadership is handed out (renewing
    /// meanwhile), e.g. to let an old leader's in-flight writes land. Default 0.
    pub cool_down: Duration,
    /// Random spread, as a fraction of the period, added to polls and retries so that
    /// standby candidates do not hit the store in step. Default 0.2.
    pub jitter: f64,
    /// Random delay, up to this, before the first campaign, so that a fleet started at
    /// once does not hit the store at once. Default 0.
    pub splay: Duration,
    /// After resigning or being evicted, wait this long before campaigning again, so
    /// that another candidate takes over (one that polls included). Default
    /// `2 * retry_period`.
    pub resign_backoff: Duration,
    /// Metadata published with the lease (at most 4096 bytes).
    pub metadata: Vec<u8>,
    /// Publish this candidate's presence (holder id, priority, metadata) in a lease of
    /// its own, so that [`crate::candidates`] lists it beside the leader. One more store
    /// call per renew interval. Default off.
    pub announce: bool,
    /// This candidate's priority, published with its presence (so it counts only with
    /// [`Config::announce`]). An announcing leader that sees a live announcing candidate
    /// of higher priority hands over to it gracefully: it checks when it wins, before its
    /// term is handed out, and after each renewal (one `list` per renew interval); its
    /// work stops, the election is reserved for the successor for one TTL, and the lease
    /// is released. Equal priorities never preempt each other. Default 0.
    pub priority: i32,
    /// How many candidates hold the election at once, each with its own fencing token and
    /// holder index (see [`crate::holders`]). Default 1. With more than one, priorities
    /// and reservations do not apply (a `priority` other than 0 is refused) and
    /// [`Event::LeaderChanged`](crate::Event::LeaderChanged) is not sent: several lead.
    pub holders: u32,
    /// A planted bug, only in builds with the `mutants` feature (the test kit's): date
    /// each term from when the store's answer *arrived* instead of when the request was
    /// sent, so that the simulation can show that it catches this mistake.
    #[cfg(feature = "mutants")]
    pub mutation_date_from_response: bool,
    /// A planted bug, only with the `mutants` feature: a leader handing over to a
    /// candidate of higher priority releases the lease but leads on.
    #[cfg(feature = "mutants")]
    pub mutation_hand_over_without_stepping_down: bool,
    /// A planted bug, only with the `mutants` feature: one slot more than
    /// [`Config::holders`], so that N + 1 hold at once.
    #[cfg(feature = "mutants")]
    pub mutation_extra_holder: bool,
}

impl Config {
    /// Defaults derived from `ttl`.
    pub fn new(ttl: Duration) -> Self {
        let retry = (ttl / 10).clamp(Duration::from_millis(1), Duration::from_secs(2));
        Self {
            ttl,
            renew_interval: ttl / 3,
            // Without overflow for any TTL: one past MAX_TTL is refused by validate.
            renew_deadline: ttl.checked_mul(2).map_or(ttl, |d| d / 3),
            retry_period: retry,
            request_timeout: ttl / 5,
            max_drift: 0.01,
            safety_margin: ttl / 50,
            cool_down: Duration::ZERO,
            jitter: 0.2,
            splay: Duration::ZERO,
            resign_backoff: retry * 2,
            metadata: Vec::new(),
            announce: false,
            priority: 0,
            holders: 1,
            #[cfg(feature = "mutants")]
            mutation_date_from_response: false,
            #[cfg(feature = "mutants")]
            mutation_hand_over_without_stepping_down: false,
            #[cfg(feature = "mutants")]
            mutation_extra_holder: false,
        }
    }

    /// How long after the send time of a successful acquire or renew the lease
    /// certainly still holds: `ttl * (1 - max_drift) - safety_margin`.
    pub fn deadline_offset(&self) -> Duration {
        self.ttl.mul_f64(1.0 - self.max_drift.clamp(0.0, 1.0)).saturating_sub(self.safety_margin)
    }

    /// The local deadline of a lease whose last successful acquire or renew was sent at `sent`.
    ///
    /// The store dates expiry from when it *received* the request, which is later,
    /// and a clock running at most `max_drift` slower than the store's cannot make
    /// this instant fall after the store's expiry.
    pub fn deadline_after(&self, sent: Instant) -> Instant {
        sent + self.deadline_offset()
    }

    /// Checks every setting and how they fit together.
    pub fn validate(&self) -> Result<(), ConfigError> {
        let err = |setting, reason: String| Err(ConfigError { setting, reason });
        if self.ttl < MIN_TTL || self.ttl > MAX_TTL {
            return err("ttl", format!("{:?} must lie between {MIN_TTL:?} and {MAX_TTL:?}", self.ttl));
        }
        if !(0.0..0.5).contains(&self.max_drift) {
            return err("max_drift", format!("{} must be at least 0 and below 0.5", self.max_drift));
        }
        if !(0.0..1.0).contains(&self.jitter) {
            return err("jitter", format!("{} must be at least 0 and below 1", self.jitter));
        }
        let offset = self.deadline_offset();
        if offset.is_zero() {
            return err(
                "safety_margin",
                format!("{:?} leaves no lease time out of a {:?} TTL", self.safety_margin, self.ttl),
            );
        }
        if self.renew_interval.is_zero() || self.renew_interval >= self.renew_deadline {
            return err(
                "renew_interval",
                format!(
                    "{:?} must be above zero and below renew_deadline ({:?})",
                    self.renew_interval, self.renew_deadline
                ),
            );
        }
        if self.renew_deadline > offset {
            return err(
                "renew_deadline",
                format!("{:?} must not exceed ttl * (1 - max_drift) - safety_margin = {offset:?}", self.renew_deadline),
            );
        }
        if self.retry_period.is_zero() || self.retry_period > self.renew_deadline {
            return err(
                "retry_period",
                format!("{:?} must be above zero and at most renew_deadline", self.retry_period),
            );
        }
        for (setting, value) in
            [("request_timeout", self.request_timeout), ("splay", self.splay), ("resign_backoff", self.resign_backoff)]
        {
            if value > MAX_TTL {
                return err(setting, format!("{value:?} is longer than {MAX_TTL:?}"));
            }
        }
        if self.request_timeout.is_zero() {
            return err("request_timeout", "must be above zero".into());
        }
        if self.cool_down >= self.renew_deadline {
            return err(
                "cool_down",
                format!("{:?} must be below renew_deadline ({:?})", self.cool_down, self.renew_deadline),
            );
        }
        if self.metadata.len() > MAX_METADATA {
            return err("metadata", format!("{} bytes; at most {MAX_METADATA} are allowed", self.metadata.len()));
        }
        if !(1..=crate::holders::MAX_HOLDERS).contains(&self.holders) {
            return err("holders", format!("{} must lie between 1 and {}", self.holders, crate::holders::MAX_HOLDERS));
        }
        if self.holders > 1 && self.priority != 0 {
            return err("priority", format!("{} is not supported with {} holders", self.priority, self.holders));
        }
        Ok(())
    }

    /// `period` spread by up to ±`jitter` of itself.
    pub(crate) fn jittered(&self, period: Duration) -> Duration {
        if self.jitter <= 0.0 {
            return period;
        }
        let spread = (fastrand::f64() * 2.0 - 1.0) * self.jitter;
        period.mul_f64(1.0 + spread)
    }
}

/// The timing of one term, from the send time of its last successful acquire or renew.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TermTimes {
    /// Send time of the last successful acquire or renew.
    pub sent: Instant,
    /// When to renew next.
    pub renew_at: Instant,
    /// When to give up renewing and step down.
    pub stop_at: Instant,
    /// The local deadline: the lease certainly holds before it.
    pub deadline: Instant,
}

impl TermTimes {
    /// The timing after a successful acquire or renew sent at `sent`.
    pub fn after_success(cfg: &Config, sent: Instant) -> Self {
        Self {
            sent,
            renew_at: sent + cfg.renew_interval,
            stop_at: sent + cfg.renew_deadline,
            deadline: cfg.deadline_after(sent),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn defaults_are_valid_across_ttls() {
        for ms in [10, 50, 100, 1000, 10_000, 60_000, 3_600_000] {
            Config::new(Duration::from_millis(ms)).validate().unwrap();
        }
    }

    #[test]
    fn names_the_bad_setting() {
        let mut c = Config::new(Duration::from_secs(10));
        c.renew_deadline = Duration::from_secs(10);
        assert_eq!(c.validate().unwrap_err().setting, "renew_deadline");
        let mut c = Config::new(Duration::from_secs(10));
        c.renew_interval = Duration::from_secs(8);
        assert_eq!(c.validate().unwrap_err().setting, "renew_interval");
        let mut c = Config::new(Duration::from_secs(10));
        c.safety_margin = Duration::from_secs(11);
        assert_eq!(c.validate().unwrap_err().setting, "safety_margin");
        let mut c = Config::new(Duration::from_secs(10));
        c.metadata = vec![0; 5000];
        assert_eq!(c.validate().unwrap_err().setting, "metadata");
    }

    proptest! {
        /// The local deadline never lies after the store's expiry, for any request
        /// delay and any clock-rate difference within the configured bound.
        #[test]
        fn deadline_never_outlives_the_store(
            ttl_ms in 10u64..600_000,
            drift in 0.0f64..0.2,
            margin_permille in 0u64..100,
            delay_us in 0u64..5_000_000,
            rate in 0.0f64..1.0,
        ) {
            let ttl = Duration::from_millis(ttl_ms);
            let mut cfg = Config::new(ttl);
            cfg.max_drift = drift;
            cfg.safety_margin = ttl * margin_permille as u32 / 1000;
            prop_assume!(!cfg.deadline_offset().is_zero());
            let sent = Instant::now();
            // The store receives the request after `delay` and grants `ttl` on its clock.
            // Our clock may run slower than the store's by up to `drift`: the store's
            // `ttl` lasts at least ttl * (1 - drift) of our time.
            let received = sent + Duration::from_micros(delay_us);
            let local_rate = 1.0 - drift * rate;
            let store_expiry_local = received + ttl.mul_f64(local_rate);
            prop_assert!(cfg.deadline_after(sent) <= store_expiry_local);
        }

        /// Renewal and step-down come, in that order, before the deadline.
        #[test]
        fn term_times_are_ordered(ttl_ms in 10u64..600_000) {
            let cfg = Config::new(Duration::from_millis(ttl_ms));
            let t = TermTimes::after_success(&cfg, Instant::now());
            prop_assert!(t.sent < t.renew_at && t.renew_at < t.stop_at && t.stop_at <= t.deadline);
        }
    }
}
