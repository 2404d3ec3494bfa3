//! Logging a run of store failures without flooding the log.

use super::*;

/// Logs store failures: a warning for the first of a run, then at debug level, so that a
/// long outage does not flood the log, with a reminder at warning level after 10 s, 1 min
/// and 5 min of failing, and every 5 min after that, so that a replica waiting on a store
/// it cannot reach does not fall silent.
pub(super) struct Failures<'a> {
    pub(super) election: &'a ElectionName,
    pub(super) run: u32,
    /// When the run began, and the next reminder's place in [`REMINDERS`].
    pub(super) since: Option<crate::Instant>,
    pub(super) reminded: usize,
}

/// When a run of failures is reminded of, after it began (the last one again and again).
pub(super) const REMINDERS: [Duration; 3] =
    [Duration::from_secs(10), Duration::from_secs(60), Duration::from_secs(300)];

impl<'a> Failures<'a> {
    pub(super) fn new(election: &'a ElectionName) -> Self {
        Self { election, run: 0, since: None, reminded: 0 }
    }

    /// A failure of `what` at `now`.
    pub(super) fn note(&mut self, e: &StoreError, what: &str, now: crate::Instant) {
        self.run += 1;
        let since = *self.since.get_or_insert(now);
        let due = self.reminder_after();
        // With its causes: "cannot connect" alone does not say "connection refused".
        let error = error_chain(e);
        if self.run == 1 {
            tracing::warn!(election = %self.election, %error, "{what}; retrying (further failures are logged at debug level)");
        } else if now.saturating_duration_since(since) >= due {
            self.reminded += 1;
            tracing::warn!(
                election = %self.election, %error, failures = self.run,
                "{what}; still failing after {} (retrying)",
                humanize(now.saturating_duration_since(since))
            );
        } else {
            tracing::debug!(election = %self.election, %error, failures = self.run, "{what}");
        }
    }

    /// How long after the run began the next reminder is due.
    pub(super) fn reminder_after(&self) -> Duration {
        match REMINDERS.get(self.reminded) {
            Some(d) => *d,
            None => REMINDERS[REMINDERS.len() - 1] * (self.reminded as u32 - REMINDERS.len() as u32 + 2),
        }
    }

    pub(super) fn reset(&mut self) {
        if self.run > 1 {
            tracing::info!(election = %self.election, failures = self.run, "the store answers again");
        }
        self.run = 0;
        self.since = None;
        self.reminded = 0;
    }
}

/// `d` in whole seconds, or minutes past a minute, for log lines.
pub(super) fn humanize(d: Duration) -> String {
    match d.as_secs() {
        s if s < 60 => format!("{s} s"),
        s => format!("{} min {} s", s / 60, s % 60),
    }
}

/// `e` and its sources, as one line.
pub(super) fn error_chain(e: &StoreError) -> String {
    let mut out = e.to_string();
    let mut cur = std::error::Error::source(e);
    while let Some(c) = cur {
        let m = c.to_string();
        if !out.contains(&m) {
            out.push_str(": ");
            out.push_str(&m);
        }
        cur = c.source();
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_run_of_store_failures_is_reminded_of_after_10_s_1_min_5_min_and_every_5_min() {
        let e = ElectionName::new("e").unwrap();
        let mut f = Failures::new(&e);
        let t0 = crate::Instant::now();
        let err = StoreError::unavailable("down");
        let mut reminders = Vec::new();
        for s in 0..1300u64 {
            let before = f.reminded;
            f.note(&err, "acquire failed", t0 + Duration::from_secs(s));
            if f.reminded > before {
                reminders.push(s);
            }
        }
        assert_eq!(reminders, [10, 60, 300, 600, 900, 1200]);
        f.reset();
        assert_eq!((f.run, f.reminded, f.since), (0, 0, None));
    }
}
