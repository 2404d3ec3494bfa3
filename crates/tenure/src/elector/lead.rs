//! The leader: renews, proclaims and watches until its term ends.

use super::*;

/// What a leader's watch reported.
pub(super) enum LeaderWatch {
    /// This term's record.
    Ours,
    /// Someone else's record, an eviction, or no lease: the store must be asked.
    Ask,
    /// The watch failed or ended.
    Ended,
}

/// The leader's next watch report, judged against its `lease`. Small on purpose: it is
/// what a leader's select keeps between reports, for every election the process leads.
pub(super) async fn leader_watch(watch: &mut Option<WatchStream>, lease: &LeaseRecord) -> LeaderWatch {
    match next_event(watch).await {
        Some(Ok(Some(rec))) if rec.holder == lease.holder && rec.token == lease.token && !rec.evicted => {
            LeaderWatch::Ours
        }
        Some(Ok(_)) => LeaderWatch::Ask,
        Some(Err(_)) | None => LeaderWatch::Ended,
    }
}

/// Why a term ends when the store answers that `lease` is no longer this grant: evicted
/// (then `lease` becomes the record as it now stands, whose revision moved, to release),
/// or lost to `cur`'s holder, or to nobody.
pub(super) fn lost(lease: &mut LeaseRecord, cur: Option<LeaseRecord>) -> StepDownReason {
    match cur {
        Some(r) if r.holder == lease.holder && r.token == lease.token && r.evicted => {
            *lease = r;
            StepDownReason::Evicted
        }
        other => StepDownReason::Lost { to: other.map(|r| r.leader()) },
    }
}

/// The leader phase: leads until the term ends, then steps down and releases. Returns
/// why the term ended, and how long a resigner asked to stand aside.
///
/// The steps: [`TermClock::start`] dates the term; [`vet_win`] may give the lease back
/// before anything is handed out; [`Leading::new`] makes the term; the loop waits for the
/// first of shutdown, an ask of the term's holders ([`Leading::proclaim`]), the end of the
/// cool-down ([`Leading::publish`]), the renewal time ([`Leading::renew`]) and the watch
/// ([`Leading::on_watch`]); [`Leading::step_down`] ends it.
pub(super) async fn lead(
    shared: &Shared,
    view: &mut View<'_>,
    slot: Option<u32>,
    lease: &mut LeaseRecord,
    sent: Instant,
    unhealthy: &mut u32,
) -> (StepDownReason, Duration) {
    // In a block of its own: the clock moves into the term, and a local that lived on would
    // keep its room in the task of every leader.
    let mut term = {
        let clock = TermClock::start(shared, sent);
        if let Some(given_back) = vet_win(shared, slot, lease, &clock).await {
            return given_back;
        }
        Leading::new(shared, slot, lease, clock, sent)
    };
    view.saw_record(Some(&*lease));
    let reason = loop {
        // After a pause (SIGSTOP, a stalled VM) the term may already be over.
        if let Some(over) = term.clock.over(shared.clock.now()) {
            break over;
        }
        let publish_wait = async {
            match term.pending {
                // Without a cool-down it is already due: hand it out now, not at the timer's
                // next tick (up to a millisecond on every handover).
                Some(_) if shared.clock.now() >= term.publish_at => {}
                Some(_) => shared.clock.sleep_until(term.publish_at).await,
                None => std::future::pending().await,
            }
        };
        // One timer for both: the renewal is due no later than the step-down time, and a
        // renewal woken at or past that time steps down instead.
        let renew_due_at = term.clock.times.renew_at.min(term.clock.times.stop_at);
        tokio::select! {
            biased;
            _ = shared.shutdown.cancelled() => break StepDownReason::ShuttingDown,
            // One waiter for both kinds of ask, as it is kept by every leader between
            // renewals. A resignation goes first; a proclamation waits while a renewal is
            // due, so that proclamations that keep failing cannot starve the renewal.
            ask = term.asks.next(|s| {
                s.resign.pop().map(Ask::Resign).or_else(|| {
                    let renewal_due = shared.clock.now() >= renew_due_at;
                    if renewal_due { None } else { s.proclaim.pop_front().map(Ask::Proclaim) }
                })
            }) => match ask {
                Ask::Resign(r) => {
                    term.resigners.push(r);
                    break StepDownReason::Resigned;
                }
                // Boxed: the task of every leader keeps room for its largest await, and a
                // proclamation is rare. The renewal and the step-down are not boxed: with
                // thousands of elections in a process, every elector renews at once on the
                // shared grid and steps down at once at shutdown, and a box each would add
                // to the peak (the step-down borrows the term, which keeps it small).
                Ask::Proclaim(p) => {
                    if let Some(ended) = Box::pin(term.proclaim(p, lease)).await {
                        break ended;
                    }
                }
            },
            _ = publish_wait => term.publish(view),
            _ = shared.clock.sleep_until(renew_due_at) => {
                if let Some(ended) = term.renew(lease).await {
                    break ended;
                }
            }
            seen = leader_watch(&mut term.watch, lease) => term.on_watch(seen),
        }
    };
    term.step_down(view, lease, reason, unhealthy).await
}

/// The clock of one term: when to renew, when to step down, and the local deadline.
///
/// A term is dated from when its acquire or renewal was *sent*. The store dates its expiry
/// from when it *received* the request (store duty 2), which is later, so
/// `sent + ttl·(1 − max_drift) − safety_margin` falls before the store's expiry on any
/// clock within the drift bound (docs/ARCHITECTURE.md, "Why two leaders never overlap",
/// steps 1 and 2). Dating it from the answer's arrival would not. Through a store that
/// gathers renewals, renewals are due early, on the store's grid, so that they meet.
pub(super) struct TermClock<'a> {
    shared: &'a Shared,
    grid: Option<Instant>,
    /// The renewal time, the step-down time and the deadline.
    pub(super) times: TermTimes,
    /// The deadline as the term's holders read it ([`Leadership::deadline`]).
    pub(super) deadline: Arc<Mutex<Instant>>,
}

impl<'a> TermClock<'a> {
    /// The clock of a term won by a request sent at `sent`.
    pub(super) fn start(shared: &'a Shared, sent: Instant) -> Self {
        let grid = shared.store.renewal_grid();
        let times = Self::dated(shared, grid, sent);
        TermClock { shared, grid, deadline: Arc::new(Mutex::new(times.deadline)), times }
    }

    fn dated(shared: &Shared, grid: Option<Instant>, sent: Instant) -> TermTimes {
        // The planted bug: dated from the answer's arrival.
        #[cfg(feature = "mutants")]
        let sent = if shared.cfg.mutation_date_from_response { shared.clock.now() } else { sent };
        let mut t = TermTimes::after_success(&shared.cfg, sent);
        if let Some(origin) = grid {
            t.renew_at = on_grid(t.renew_at, t.sent, origin, shared.cfg.renew_interval);
        }
        t
    }

    /// A renewal (or proclamation) sent at `sent` succeeded: the term runs on from then.
    pub(super) fn renewed(&mut self, sent: Instant) {
        self.times = Self::dated(self.shared, self.grid, sent);
        *self.deadline.lock().unwrap_or_else(|p| p.into_inner()) = self.times.deadline;
        self.shared.metrics.remaining(self.times.deadline.saturating_duration_since(self.shared.clock.now()));
    }

    /// The time limit of a store call sent at `sent`: a request timeout, and never past
    /// the step-down time.
    pub(super) fn call_until(&self, sent: Instant) -> Instant {
        self.times.stop_at.min(sent + self.shared.cfg.request_timeout)
    }

    /// Why the term is over at `now`, if it is: past its deadline, or its step-down time.
    pub(super) fn over(&self, now: Instant) -> Option<StepDownReason> {
        if now >= self.times.deadline {
            Some(StepDownReason::DeadlinePassed)
        } else if now >= self.times.stop_at {
            Some(StepDownReason::RenewFailed)
        } else {
            None
        }
    }
}

/// What a winner checks before its term is handed out; `Some` if the lease went back at
/// once (nothing ran under it), with why and how long to stand aside.
///
/// An announcing winner asks whether the election belongs to someone else: a candidate it
/// is reserved for, or one of higher priority. A winner of one kind (one holder, or
/// several) looks for holders of the other kind, which are different records in the store
/// and would run beside it; if it finds them, it stops campaigning.
pub(super) async fn vet_win(
    shared: &Shared,
    slot: Option<u32>,
    lease: &LeaseRecord,
    clock: &TermClock<'_>,
) -> Option<(StepDownReason, Duration)> {
    let cfg = &shared.cfg;
    let election = &lease.election;
    if cfg.announce && slot.is_none() {
        match Box::pin(successor(shared, clock.call_until(shared.clock.now()))).await {
            Some(Successor::Reserved { to, remaining }) => {
                tracing::info!(%election, successor = %to, "won, but the election is reserved for another candidate; giving it back");
                Box::pin(give_back(shared, lease)).await;
                return Some((StepDownReason::HandedOver { to }, remaining.min(cfg.ttl)));
            }
            Some(Successor::Higher(to)) => {
                tracing::info!(%election, successor = %to, "won, but a candidate of higher priority campaigns; handing over to it");
                Box::pin(reserve(shared, &to)).await;
                Box::pin(give_back(shared, lease)).await;
                return Some((StepDownReason::HandedOver { to }, cfg.ttl));
            }
            None => {}
        }
    }
    if let Some(why) = Box::pin(other_kind(shared, slot, clock.call_until(shared.clock.now()))).await {
        tracing::error!(election = %shared.req.election, "{why}; campaigning stops");
        Box::pin(give_back(shared, lease)).await;
        *shared.failure.lock().unwrap_or_else(|p| p.into_inner()) = Some(ElectError::Unsupported(why));
        return Some((StepDownReason::ShuttingDown, Duration::ZERO));
    }
    None
}

/// A term in progress, as its lead loop keeps it.
pub(super) struct Leading<'a> {
    shared: &'a Shared,
    /// The lease this term holds: the election's, or a slot's.
    election: ElectionName,
    slot: Option<u32>,
    token: crate::FencingToken,
    pub(super) clock: TermClock<'a>,
    cancel: CancellationToken,
    pub(super) asks: Arc<Asks>,
    /// Woken when the last [`Leadership`] clone is dropped.
    gone: Arc<tokio::sync::Notify>,
    /// The leadership, until the cool-down ends and it is handed out.
    pub(super) pending: Option<Leadership>,
    pub(super) publish_at: Instant,
    pub(super) watch: Option<WatchStream>,
    /// Those who asked this term to resign, answered once the lease is released.
    pub(super) resigners: Vec<Resign>,
    /// A proclamation answered by a grant of a new term, to release after the work stops.
    release_new_grant: bool,
    /// The successor to reserve the election for, after the work stops and before the release.
    reserve_for: Option<HolderId>,
}

impl<'a> Leading<'a> {
    /// The term of `lease`, won by a request sent at `sent`: its [`Leadership`] is made
    /// (handed out once the cool-down ends) and its lease watched.
    pub(super) fn new(
        shared: &'a Shared,
        slot: Option<u32>,
        lease: &LeaseRecord,
        clock: TermClock<'a>,
        sent: Instant,
    ) -> Self {
        let cfg = &shared.cfg;
        let token = match slot {
            Some(i) => crate::holders::holder_token(lease.token, i),
            None => lease.token,
        };
        let cancel = CancellationToken::new();
        let asks = Arc::new(Asks::default());
        let gone = Arc::new(tokio::sync::Notify::new());
        let pending = Some(Leadership {
            term: Arc::new(Term {
                election: shared.req.election.clone(),
                holder: shared.req.holder.clone(),
                token,
                index: slot.unwrap_or(0),
                holders: cfg.holders,
                metadata: Mutex::new(lease.metadata.clone()),
                deadline: clock.deadline.clone(),
                clock: shared.clock.clone(),
                ttl: cfg.ttl,
                presence: shared.presence.clone(),
                asks: asks.clone(),
                gone: gone.clone(),
            }),
            cancel: cancel.clone(),
        });
        let watch = shared.store.watch(&lease.election);
        note!(shared, election = %shared.req.election, %token, holder_index = ?slot, "elected");
        Leading {
            shared,
            election: lease.election.clone(),
            slot,
            token,
            clock,
            cancel,
            asks,
            gone,
            pending,
            publish_at: sent + cfg.cool_down,
            watch,
            resigners: Vec::new(),
            release_new_grant: false,
            reserve_for: None,
        }
    }

    /// The cool-down is over: the leadership is handed out, unless the term is already
    /// over (woken late after a pause), which the loop's next turn finds.
    pub(super) fn publish(&mut self, view: &mut View<'_>) {
        let shared = self.shared;
        if shared.clock.now() >= self.clock.times.stop_at {
            return;
        }
        if let Some(l) = self.pending.take() {
            shared.metrics.elected(view.takeover.take());
            shared.metrics.remaining(self.clock.times.deadline.saturating_duration_since(shared.clock.now()));
            shared.send_event(Event::Elected { token: l.token() });
            shared.leadership.replace(Some(l));
        }
    }

    /// Publishes a holder's new metadata with a same-holder acquire, which renews the term
    /// when the store still holds it. `Some` if the term ended.
    pub(super) async fn proclaim(&mut self, p: Proclaim, lease: &mut LeaseRecord) -> Option<StepDownReason> {
        let shared = self.shared;
        let sent = shared.clock.now();
        if sent >= self.clock.times.stop_at {
            let _ = p.done.send(Err(ProclaimError::TermEnded));
            return None;
        }
        let req = AcquireRequest::new(self.election.clone(), shared.req.holder.clone(), shared.cfg.ttl)
            .with_metadata(p.metadata.clone());
        match call(shared, "proclaim", self.clock.call_until(sent), shared.store.try_acquire(&req)).await {
            // A same-holder acquire is a renewal: the same term, dated from its send time.
            Ok(Acquire::Acquired(rec)) if rec.token == lease.token => {
                *lease = rec;
                self.clock.renewed(sent);
                if let Some(l) = shared.leadership.get() {
                    *l.term.metadata.lock().unwrap_or_else(|p| p.into_inner()) = p.metadata;
                }
                let _ = p.done.send(Ok(()));
                None
            }
            Ok(Acquire::Acquired(grant)) => {
                // A new grant: the store had ended this term. This process does not lead
                // in it: the work stops first (the step-down), then the grant, which keeps
                // everyone else out meanwhile, is released.
                let _ = p.done.send(Err(ProclaimError::TermEnded));
                *lease = grant;
                self.release_new_grant = true;
                Some(StepDownReason::Lost { to: None })
            }
            Ok(Acquire::Held(cur)) => {
                let _ = p.done.send(Err(ProclaimError::TermEnded));
                Some(lost(lease, Some(cur)))
            }
            Err(e) => {
                tracing::warn!(election = %self.election, error = %e, "publishing new metadata failed");
                let _ = p.done.send(Err(ProclaimError::Store(e)));
                None
            }
        }
    }

    /// Renews the lease (the renewal time has come). A failure is retried after a retry
    /// period, until the step-down time. An announcing leader then asks whether it should
    /// hand over. `Some` if the term ended.
    pub(super) async fn renew(&mut self, lease: &mut LeaseRecord) -> Option<StepDownReason> {
        let shared = self.shared;
        let cfg = &shared.cfg;
        let sent = shared.clock.now();
        // Woken late (a pause): no time is left to renew in.
        if let Some(over) = self.clock.over(sent) {
            return Some(over);
        }
        match call(shared, "renew", self.clock.call_until(sent), shared.store.renew(lease, cfg.ttl)).await {
            Ok(Renew::Renewed(rec)) => {
                *lease = rec;
                self.clock.renewed(sent);
                if cfg.announce && self.slot.is_none() {
                    return self.hand_over_if_asked(lease).await;
                }
                None
            }
            Ok(Renew::Lost(cur)) => Some(lost(lease, cur)),
            Err(e) => {
                tracing::warn!(election = %self.election, error = %e, "renewal failed; retrying");
                let now = shared.clock.now();
                if now >= self.clock.times.stop_at {
                    return Some(StepDownReason::RenewFailed);
                }
                self.clock.times.renew_at = (now + cfg.jittered(cfg.retry_period)).min(self.clock.times.stop_at);
                None
            }
        }
    }

    /// After a renewal, an announcing leader hands over to the candidate the election was
    /// reserved for during this term (an operator's handover), or to one of higher
    /// priority. `Some` if it does.
    #[cfg_attr(not(feature = "mutants"), allow(unused_variables))]
    async fn hand_over_if_asked(&mut self, lease: &LeaseRecord) -> Option<StepDownReason> {
        let shared = self.shared;
        let election = &self.election;
        match Box::pin(successor(shared, self.clock.call_until(shared.clock.now()))).await {
            Some(Successor::Reserved { to, .. }) => {
                tracing::info!(%election, successor = %to, "the election was reserved for another candidate; handing over");
                Some(StepDownReason::HandedOver { to })
            }
            Some(Successor::Higher(to)) => {
                tracing::info!(%election, successor = %to, "a candidate of higher priority campaigns; handing over to it");
                #[cfg(feature = "mutants")]
                if shared.cfg.mutation_hand_over_without_stepping_down {
                    // The planted bug: give the lease away and lead on.
                    Box::pin(reserve(shared, &to)).await;
                    Box::pin(give_back(shared, lease)).await;
                    return None;
                }
                self.reserve_for = Some(to.clone());
                Some(StepDownReason::HandedOver { to })
            }
            None => None,
        }
    }

    /// What the watch said of this term's lease. Anything but this term's own record (an
    /// eviction, someone else's, none) makes the renewal due now: its answer is
    /// authoritative. A watch that ended is dropped; renewals go on without it.
    pub(super) fn on_watch(&mut self, seen: LeaderWatch) {
        match seen {
            LeaderWatch::Ours => {}
            LeaderWatch::Ask => self.clock.times.renew_at = self.shared.clock.now(),
            LeaderWatch::Ended => self.watch = None,
        }
    }

    /// Steps down: ends the term, waits for the guarded work, stands aside as asked,
    /// releases the lease (unless the store already gave it to another), then answers
    /// the resigners. Returns why, and how long to stand aside.
    pub(super) async fn step_down(
        &mut self,
        view: &mut View<'_>,
        lease: &mut LeaseRecord,
        reason: StepDownReason,
        unhealthy: &mut u32,
    ) -> (StepDownReason, Duration) {
        let shared = self.shared;
        let cfg = &shared.cfg;
        self.end_term(&reason);
        self.wait_for_work(lease).await;
        self.resigners.extend(self.asks.close());
        let mut stand_aside = self.resigners.iter().map(|r| r.stand_aside).max().unwrap_or_default();
        if let Some(to) = &self.reserve_for {
            Box::pin(reserve(shared, to)).await;
        }
        // An unhealthy resignation (one that asked to stand aside) stays away longer each
        // time in a row.
        let resigned_unhealthy = reason == StepDownReason::Resigned && !stand_aside.is_zero();
        *unhealthy = if resigned_unhealthy { unhealthy.saturating_add(1) } else { 0 };
        withdraw_presence(shared, &self.election, &reason, stand_aside, *unhealthy).await;
        if !matches!(reason, StepDownReason::Lost { .. }) || self.release_new_grant {
            match Box::pin(release(shared, lease)).await {
                Ok(true) => view.saw(None),
                Ok(false) => {}
                Err(e) => {
                    tracing::warn!(election = %self.election, error = %e, "release failed or could not be confirmed; the lease will expire on its own")
                }
            }
        }
        if let StepDownReason::Lost { to } = &reason {
            view.saw(to.clone());
        }
        if let StepDownReason::HandedOver { .. } = reason {
            // Leave the election to the successor while it is reserved for it.
            stand_aside = cfg.ttl;
        }
        for r in std::mem::take(&mut self.resigners) {
            let _ = r.done.send(());
        }
        (reason, stand_aside)
    }

    /// Ends the term for its holders: cancels it, answers the proclamations sent meanwhile
    /// (their callers may hold the leadership that the release waits for), takes back the
    /// leadership, and tells of the step-down.
    fn end_term(&mut self, reason: &StepDownReason) {
        let shared = self.shared;
        self.cancel.cancel();
        self.asks.end_proclaims();
        drop(self.pending.take());
        shared.leadership.replace(None);
        note!(shared, election = %shared.req.election, token = %self.token, holder_index = ?self.slot, ?reason, "stepped down");
        shared.metrics.ended(reason);
        shared.send_event(Event::SteppedDown { reason: reason.clone() });
    }

    /// Waits until the last [`Leadership`] clone is dropped. Logs an error if the work
    /// outlives the deadline, unless the process only woke up past it. (`&mut`: a term
    /// holds its watch, which is not `Sync`, and the campaign task must be `Send`.)
    async fn wait_for_work(&mut self, lease: &LeaseRecord) {
        let shared = self.shared;
        let deadline = self.clock.times.deadline;
        let mut warned = shared.clock.now() >= deadline;
        loop {
            tokio::select! {
                biased;
                _ = self.gone.notified() => break,
                _ = shared.clock.sleep_until(deadline), if !warned => {
                    warned = true;
                    tracing::error!(election = %self.election, token = %lease.token,
                        "the guarded work is still running past the lease deadline; drop every Leadership clone when it is cancelled");
                }
            }
        }
    }
}

/// A candidate that stops or stands aside withdraws its presence before the release, so
/// that the next winner does not find it announced and hand the election back to it.
async fn withdraw_presence(
    shared: &Shared,
    election: &ElectionName,
    reason: &StepDownReason,
    stand_aside: Duration,
    unhealthy: u32,
) {
    let cfg = &shared.cfg;
    // Its release and the reads that confirm it (see `release`), a read before them when
    // it stops as a follower with an acquire unanswered (`stop_following`), and a little
    // more.
    let within = cfg.request_timeout * (RELEASE_TIMEOUTS + 2);
    match (reason, &shared.presence) {
        (StepDownReason::ShuttingDown, Some(p)) => {
            p.shared.shutdown.cancel();
            let until = shared.clock.now() + within;
            tokio::select! {
                biased;
                _ = Box::pin(p.stopped()) => {}
                _ = shared.clock.sleep_until(until) => {}
            }
        }
        (StepDownReason::Resigned | StepDownReason::Evicted, Some(p)) => {
            let hold = cfg.resign_backoff.max(stand_aside).saturating_mul(2u32.pow(unhealthy.clamp(1, 7) - 1));
            if let Some(presence) = p.current() {
                tracing::debug!(%election, ?hold, "standing aside: no longer announced meanwhile");
                let until = shared.clock.now() + within;
                tokio::select! {
                    biased;
                    _ = Box::pin(presence.resign_for(hold)) => {}
                    _ = shared.clock.sleep_until(until) => {}
                }
            }
        }
        _ => {}
    }
}

/// The latest instant at or before `due` that is a whole number of `period`s after
/// `origin`, if it comes after `sent`; otherwise `due`. Never later than `due`.
pub(super) fn on_grid(due: Instant, sent: Instant, origin: Instant, period: Duration) -> Instant {
    let period_ns = period.as_nanos();
    if period_ns == 0 || due <= origin {
        return due;
    }
    let since = (due - origin).as_nanos();
    let at = origin + Duration::from_nanos(u64::try_from(since - since % period_ns).unwrap_or(u64::MAX));
    if at > sent && at <= due { at } else { due }
}
