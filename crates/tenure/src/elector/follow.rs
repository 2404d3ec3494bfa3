//! The follower of one lease: campaigns until this candidate holds it.

use super::*;

pub(super) async fn next_event(watch: &mut Option<WatchStream>) -> Option<Result<Option<LeaseRecord>, StoreError>> {
    match watch {
        Some(w) => w.next().await,
        None => std::future::pending().await,
    }
}

/// The follower phase: campaigns until this candidate holds the lease. `None` on shutdown.
/// Until `defer`, it leaves a free lease to the successor it was reserved for, reading
/// instead of acquiring, until it sees anyone hold the lease.
///
/// Each turn makes one [`Follower::attempt`] when one is due, then waits for the first of
/// shutdown, the wake time the attempt set, and the watch ([`Follower::on_watch`]).
pub(super) async fn follow(
    shared: &Shared,
    view: &mut View<'_>,
    defer: Option<Instant>,
) -> Option<(LeaseRecord, Instant)> {
    let mut f = Follower::new(shared, defer);
    view.lease_ends = None;
    view.vacant_since = None;
    loop {
        if shared.shutdown.is_cancelled() {
            Box::pin(f.stop()).await;
            return None;
        }
        if f.due {
            f.due = false;
            // Boxed: a follower waits in the select below, and an attempt's calls would
            // otherwise size its task.
            match Box::pin(f.attempt(view)).await {
                Attempt::Won(lease, sent) => return Some((lease, sent)),
                Attempt::Refused => return None,
                Attempt::Wait => {}
            }
            if f.due {
                continue;
            }
        }
        tokio::select! {
            biased;
            _ = shared.shutdown.cancelled() => {
                Box::pin(f.stop()).await;
                return None;
            }
            _ = shared.clock.sleep_until(f.wake_at) => f.due = true,
            ev = next_event(&mut f.watch) => f.on_watch(view, ev),
        }
    }
}

/// What an attempt of a follower came to.
pub(super) enum Attempt {
    /// This candidate holds the lease, won by a request sent then.
    Won(LeaseRecord, Instant),
    /// The store refused in a way no retry can mend: campaigning stops.
    Refused,
    /// Not won: the follower waits until its wake time, or attempts again at once if it
    /// set `due`.
    Wait,
}

/// A follower of one lease, between its attempts.
pub(super) struct Follower<'a> {
    shared: &'a Shared,
    pub(super) watch: Option<WatchStream>,
    /// After an acquire whose answer never came, the lease must be read before anything
    /// else is done.
    pub(super) unresolved: bool,
    /// Whether an attempt is due now.
    pub(super) due: bool,
    pub(super) wake_at: Instant,
    failures: Failures<'a>,
    /// Until when the election is reserved for the successor of this candidate's term.
    pub(super) defer: Option<Instant>,
    /// The grant the watch last reported (holder and token); `None` after it reported no
    /// lease, or before it reported anything. A watch that reports expiry reports the end
    /// of that grant, but not always of one it never reported: a grant this follower heard
    /// of from its own acquire may come and go before the watch reads it, and a watch
    /// passes by a report of no lease that repeats its last.
    heard: Option<(HolderId, crate::FencingToken)>,
}

impl<'a> Follower<'a> {
    /// A follower that attempts at once, watching the lease where the store can.
    pub(super) fn new(shared: &'a Shared, defer: Option<Instant>) -> Self {
        Follower {
            shared,
            watch: shared.store.watch(&shared.req.election),
            unresolved: false,
            due: true,
            wake_at: shared.clock.now(),
            failures: Failures::new(&shared.req.election),
            defer,
            heard: None,
        }
    }

    /// When to look again after seeing `rec` ([`follower_wake`]): the watch is counted
    /// on to report the end of `rec` only if it reported `rec` itself.
    fn wake(&self, view: &mut View<'_>, rec: Option<&LeaseRecord>) -> Instant {
        let heard = rec.is_some_and(|r| {
            self.heard.as_ref().is_some_and(|(h, t)| *h == r.holder && *t == r.token)
                || crate::mutant("acquire-answer-trusted")
        });
        follower_wake(self.shared, view, rec, self.watch.is_some(), heard)
    }

    /// One attempt: while the election is reserved for a successor, a look
    /// ([`Follower::look_while_reserved`]); after an unanswered acquire, a read
    /// ([`Follower::resolve`]); otherwise an acquire ([`Follower::acquire`]).
    pub(super) async fn attempt(&mut self, view: &mut View<'_>) -> Attempt {
        let cfg = &self.shared.cfg;
        let sent = self.shared.clock.now();
        let until = sent + cfg.request_timeout;
        let retry_at = sent + cfg.jittered(cfg.retry_period);
        self.defer = self.defer.filter(|d| *d > sent);
        match self.defer {
            Some(reserved_until) if !self.unresolved => {
                self.look_while_reserved(view, reserved_until, until, retry_at).await;
                Attempt::Wait
            }
            _ if self.unresolved => self.resolve(view, until, retry_at).await,
            _ => self.acquire(view, sent, until, retry_at).await,
        }
    }

    /// While the election is reserved for the successor (until `reserved_until`): reads
    /// the lease instead of acquiring it, and acquires only once it is free and no longer
    /// reserved for a live candidate.
    pub(super) async fn look_while_reserved(
        &mut self,
        view: &mut View<'_>,
        reserved_until: Instant,
        until: Instant,
        retry_at: Instant,
    ) {
        let shared = self.shared;
        let me = &shared.req.holder;
        match call(shared, "get", until, shared.store.get(&shared.req.election)).await {
            Ok(Some(rec)) if rec.holder == *me && !rec.evicted => {
                // Ours (a give-back that did not land, an acquire applied late), and
                // nothing runs under it: give it back again, and look again later.
                let _ = call(shared, "release", until, shared.store.release(&rec)).await;
                self.wake_at = retry_at.min(reserved_until);
            }
            Ok(Some(rec)) => {
                // Someone leads: the reservation has done its work.
                self.defer = None;
                self.failures.reset();
                view.saw_record(Some(&rec));
                view.live(&rec);
                self.wake_at = self.wake(view, Some(&rec));
            }
            Ok(None) => {
                // Free: leave it only while it is still reserved for a live candidate.
                // Boxed: a rare path, and the largest future a follower awaits.
                let reserved =
                    Box::pin(call(shared, "list", until, Standing::read(&*shared.store, &shared.req.election)))
                        .await
                        .map(|st| matches!(st.successor(me, shared.cfg.priority), Some(Successor::Reserved { .. })));
                if let Ok(false) = reserved {
                    self.defer = None;
                    self.due = true;
                } else {
                    // The successor's presence can end without a word on the election's
                    // watch: look again within a retry period.
                    self.wake_at = reserved_until.min(retry_at);
                }
            }
            Err(e) => {
                self.failures.note(&e, "reading the lease failed", shared.clock.now());
                self.wake_at = retry_at.min(reserved_until);
            }
        }
    }

    /// After an acquire whose answer never came: reads the lease. If it is this holder's,
    /// a compare-and-set renewal confirms it (a read cannot tell which of our writes made
    /// the record), and the term is dated from that renewal's send time.
    pub(super) async fn resolve(&mut self, view: &mut View<'_>, until: Instant, retry_at: Instant) -> Attempt {
        let shared = self.shared;
        let cfg = &shared.cfg;
        match call(shared, "get", until, shared.store.get(&shared.req.election)).await {
            Ok(Some(rec)) if rec.holder == shared.req.holder && !rec.evicted => {
                let sent = shared.clock.now();
                let until = sent + cfg.request_timeout;
                match call(shared, "renew", until, shared.store.renew(&rec, cfg.ttl)).await {
                    Ok(Renew::Renewed(lease)) => {
                        view.won();
                        return Attempt::Won(lease, sent);
                    }
                    Ok(Renew::Lost(cur)) => {
                        self.unresolved = false;
                        view.saw_record(cur.as_ref());
                        self.wake_at = self.wake(view, cur.as_ref());
                    }
                    Err(e) => {
                        self.failures.note(&e, "confirming a maybe-held lease failed", shared.clock.now());
                        self.wake_at = retry_at;
                    }
                }
            }
            Ok(cur) => {
                self.unresolved = false;
                view.saw_record(cur.as_ref());
                self.wake_at = if cur.is_none() { shared.clock.now() } else { self.wake(view, cur.as_ref()) };
                self.due = cur.is_none();
            }
            Err(e) => {
                self.failures.note(&e, "reading the lease failed", shared.clock.now());
                self.wake_at = retry_at;
            }
        }
        Attempt::Wait
    }

    /// Tries to acquire the lease with a request sent at `sent`. Held by another: wait for
    /// its end. An ambiguous failure leaves the follower unresolved; a refusal no retry can
    /// mend stops the campaign.
    pub(super) async fn acquire(
        &mut self,
        view: &mut View<'_>,
        sent: Instant,
        until: Instant,
        retry_at: Instant,
    ) -> Attempt {
        let shared = self.shared;
        match call(shared, "acquire", until, shared.store.try_acquire(&shared.req)).await {
            Ok(Acquire::Acquired(lease)) => {
                view.won();
                return Attempt::Won(lease, sent);
            }
            Ok(Acquire::Held(cur)) => {
                self.failures.reset();
                view.saw_record(Some(&cur));
                view.live(&cur);
                self.wake_at = self.wake(view, Some(&cur));
            }
            Err(e) if !e.is_retryable() => {
                tracing::error!(election = %shared.req.election, error = %e, "the store refused; no retry can help, so campaigning stops");
                let mut f = shared.failure.lock().unwrap_or_else(|p| p.into_inner());
                *f = Some(ElectError::Store(Arc::new(e)));
                return Attempt::Refused;
            }
            Err(e) => {
                if e.kind() == ErrorKind::Ambiguous {
                    self.unresolved = true;
                }
                self.failures.note(&e, "acquire failed", shared.clock.now());
                self.wake_at = retry_at;
            }
        }
        Attempt::Wait
    }

    /// What the watch said: the lease is gone (attempt now), this holder's (a late echo,
    /// or an acquire applied without an answer: resolve it), or another's (wait for its
    /// end). A watch that fails or ends is dropped, and the follower polls.
    pub(super) fn on_watch(&mut self, view: &mut View<'_>, ev: Option<Result<Option<LeaseRecord>, StoreError>>) {
        let shared = self.shared;
        match ev {
            Some(Ok(None)) => {
                self.heard = None;
                view.saw(None);
                view.vacant_since.get_or_insert(shared.clock.now());
                self.due = true;
            }
            Some(Ok(Some(rec))) => {
                self.heard = Some((rec.holder.clone(), rec.token));
                if rec.holder == shared.req.holder && !rec.evicted {
                    self.due = true;
                    self.unresolved = true;
                } else if !self.unresolved {
                    self.defer = None;
                    view.saw_record(Some(&rec));
                    view.live(&rec);
                    self.wake_at = self.wake(view, Some(&rec));
                }
            }
            Some(Err(e)) => {
                tracing::debug!(election = %shared.req.election, error = %e, "watch failed; polling");
                self.watch = None;
                self.wake_at = self.wake_at.min(shared.clock.now() + shared.cfg.retry_period);
            }
            None => {
                self.watch = None;
                self.wake_at = self.wake_at.min(shared.clock.now() + shared.cfg.retry_period);
            }
        }
    }

    /// The follower stops: an acquire left unanswered is read, and given back if granted.
    pub(super) async fn stop(&mut self) {
        let shared = self.shared;
        stop_following(shared, self.unresolved.then_some(&shared.req.election)).await;
    }
}

/// A follower stops. With an acquire whose answer never came (`unresolved`: the election
/// or slot it was for; it may have been granted, and nothing runs under it), the record is
/// read, and released if it is this holder's,
/// so that the next candidate need not wait a TTL for it (nor, on a store whose elections
/// share one lease per process, as long as the process keeps that alive).
pub(super) async fn stop_following(shared: &Shared, unresolved: Option<&ElectionName>) {
    if let Some(election) = unresolved
        && !crate::mutant("stop-leaves-unresolved-grant")
    {
        let until = shared.clock.now() + shared.cfg.request_timeout;
        match call(shared, "get", until, shared.store.get(election)).await {
            Ok(Some(rec)) if rec.holder == shared.req.holder => give_back(shared, &rec).await,
            Ok(_) => {}
            Err(e) => tracing::debug!(election = %shared.req.election, error = %e,
                "stopping: could not read what an unanswered acquire did; a grant it made will expire on its own"),
        }
    }
}

/// When a follower that saw `rec` should try again: when the record would expire,
/// and no later than one poll period if the store cannot tell it of changes. A follower
/// that watches a store whose watch reports expiry, and whose watch reported `rec`
/// (`heard`), waits for the watch, and looks again only after
/// [`crate::store::LOOK_AGAIN_TTLS`] TTLs.
pub(super) fn follower_wake(
    shared: &Shared,
    view: &mut View<'_>,
    rec: Option<&LeaseRecord>,
    watching: bool,
    heard: bool,
) -> Instant {
    let cfg = &shared.cfg;
    let now = shared.clock.now();
    let floor = now + cfg.retry_period / 10;
    let expiry = match rec {
        Some(r) => view.ends(r),
        None => now,
    };
    let wake = if !watching {
        expiry.min(now + cfg.jittered(cfg.retry_period))
    } else if heard && shared.store.watch_reports_expiry() {
        expiry.max(now + cfg.ttl * crate::store::LOOK_AGAIN_TTLS)
    } else {
        expiry
    };
    wake.max(floor)
}
