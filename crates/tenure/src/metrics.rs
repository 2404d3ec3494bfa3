//! What an elector reports through the [`metrics`] facade, labelled by election.
//!
//! Nothing is recorded unless the application installs a recorder (for example
//! `metrics-exporter-prometheus`, as `tenure run --http` does): without one every call
//! below is a call into the facade's no-op recorder, on handles made once per elector.
//!
//! | name | type | labels | what |
//! |---|---|---|---|
//! | `tenure_is_leader` | gauge | election | 1 while this candidate leads, else 0 |
//! | `tenure_elections_won_total` | counter | election | terms won |
//! | `tenure_terms_ended_total` | counter | election, reason | terms ended, by why |
//! | `tenure_term_remaining_seconds` | gauge | election | time left before the local deadline, after each renewal; 0 when not leading |
//! | `tenure_takeover_seconds` | histogram | election | from the end of the previous term as this candidate saw it (its lease expired, or it was released) to this candidate's election |
//! | `tenure_store_request_duration_seconds` | histogram | election, operation | each store call's duration (acquire, renew, release, get) |
//! | `tenure_store_errors_total` | counter | election, operation, kind | failed store calls, by [`crate::ErrorKind`] |
//!
//! tenure's own elections (names under [`crate::RESERVED_PREFIX`]: a candidate's
//! presence, a reservation) report nothing, so that `tenure_is_leader == 1` finds the
//! leaders of the user's elections only.

use std::time::Duration;

use metrics::{
    Counter, Gauge, Histogram, Unit, counter, describe_counter, describe_gauge, describe_histogram, gauge, histogram,
};

use crate::{ErrorKind, StepDownReason};

/// The store operations an elector makes.
const OPERATIONS: [&str; 4] = ["acquire", "renew", "release", "get"];

/// Describes every metric to the recorder installed (the `# HELP` lines of Prometheus
/// text): call it once, after installing one.
pub fn describe() {
    describe_gauge!("tenure_is_leader", "1 while this candidate leads the election, else 0");
    describe_counter!("tenure_elections_won_total", "Terms this candidate won");
    describe_counter!("tenure_terms_ended_total", "Terms of this candidate that ended, by why");
    describe_gauge!(
        "tenure_term_remaining_seconds",
        Unit::Seconds,
        "Time left before the term's local deadline, after each renewal; 0 when not leading"
    );
    describe_histogram!(
        "tenure_takeover_seconds",
        Unit::Seconds,
        "From the end of the previous term, as this candidate saw it, to this candidate's election"
    );
    describe_histogram!("tenure_store_request_duration_seconds", Unit::Seconds, "Each store call's duration");
    describe_counter!("tenure_store_errors_total", "Failed store calls, by operation and kind of error");
}

/// One elector's metric handles.
pub(crate) struct ElectorMetrics {
    election: String,
    /// One of tenure's own elections: nothing is reported.
    internal: bool,
    is_leader: Gauge,
    won: Counter,
    remaining: Gauge,
    takeover: Histogram,
    durations: [Histogram; 4],
}

impl ElectorMetrics {
    pub(crate) fn new(election: &str) -> Self {
        let e = election.to_string();
        if election.starts_with(crate::RESERVED_PREFIX) {
            return Self {
                election: e,
                internal: true,
                is_leader: Gauge::noop(),
                won: Counter::noop(),
                remaining: Gauge::noop(),
                takeover: Histogram::noop(),
                durations: [const { Histogram::noop() }; 4],
            };
        }
        let is_leader = gauge!("tenure_is_leader", "election" => e.clone());
        is_leader.set(0.0);
        Self {
            is_leader,
            won: counter!("tenure_elections_won_total", "election" => e.clone()),
            remaining: gauge!("tenure_term_remaining_seconds", "election" => e.clone()),
            takeover: histogram!("tenure_takeover_seconds", "election" => e.clone()),
            durations: OPERATIONS.map(
                |op| histogram!("tenure_store_request_duration_seconds", "election" => e.clone(), "operation" => op),
            ),
            election: e,
            internal: false,
        }
    }

    /// This candidate leads; `takeover` is how long the election had no live leader as
    /// it saw it, when it had seen one before.
    pub(crate) fn elected(&self, takeover: Option<Duration>) {
        self.is_leader.set(1.0);
        self.won.increment(1);
        if let Some(t) = takeover {
            self.takeover.record(t.as_secs_f64());
        }
    }

    /// The term ended.
    pub(crate) fn ended(&self, reason: &StepDownReason) {
        self.is_leader.set(0.0);
        self.remaining.set(0.0);
        let reason = reason.name();
        if !self.internal {
            counter!("tenure_terms_ended_total", "election" => self.election.clone(), "reason" => reason).increment(1);
        }
    }

    /// Time left on the current term, after a renewal.
    pub(crate) fn remaining(&self, left: Duration) {
        self.remaining.set(left.as_secs_f64());
    }

    /// A store call of `operation` took `took` and ended with `error`, if any.
    pub(crate) fn store_call(&self, operation: &str, took: Duration, error: Option<ErrorKind>) {
        if let Some(i) = OPERATIONS.iter().position(|o| *o == operation) {
            self.durations[i].record(took.as_secs_f64());
        }
        if let Some(kind) = error.filter(|_| !self.internal) {
            let kind = match kind {
                ErrorKind::Unavailable => "unavailable",
                ErrorKind::Ambiguous => "ambiguous",
                ErrorKind::Unauthorized => "unauthorized",
                ErrorKind::Misconfigured => "misconfigured",
                ErrorKind::Invalid => "invalid",
            };
            counter!("tenure_store_errors_total", "election" => self.election.clone(), "operation" => operation.to_string(), "kind" => kind)
                .increment(1);
        }
    }
}
