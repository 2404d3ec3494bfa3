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

/// The leader phase: renews until the term ends, then steps down and releases.
/// Leads until the term ends; returns why, and how long a resigner asked to stand aside.
pub(super) async fn lead(
    shared: &Shared,
    view: &mut View<'_>,
    slot: Option<u32>,
    lease: &mut LeaseRecord,
    sent: Instant,
    unhealthy: &mut u32,
) -> (StepDownReason, Duration) {
    let cfg = &shared.cfg;
    // The lease this term holds: the election's, or a slot's.
    let election = &lease.election.clone();
    let index = slot.unwrap_or(0);
    let token = match slot {
        Some(i) => crate::holders::holder_token(lease.token, i),
        None => lease.token,
    };
    // The safety rule: a term is dated from when its acquire or renewal was *sent*. The
    // store dates its expiry from when it *received* the request (store duty 2), which is
    // later, so `sent + ttl·(1 − max_drift) − safety_margin` falls before the store's
    // expiry on any clock within the drift bound (docs/ARCHITECTURE.md, "Why two leaders
    // never overlap", steps 1 and 2). Dating it from the answer's arrival would not.
    let dated = |sent: Instant| {
        #[cfg(feature = "mutants")]
        if cfg.mutation_date_from_response {
            return shared.clock.now();
        }
        sent
    };
    // Through a store that gathers renewals, renew early on its grid, so they meet.
    let grid = shared.store.renewal_grid();
    let term_times = |sent: Instant| {
        let mut t = TermTimes::after_success(cfg, dated(sent));
        if let Some(origin) = grid {
            t.renew_at = on_grid(t.renew_at, t.sent, origin, cfg.renew_interval);
        }
        t
    };
    let mut times = term_times(sent);
    let deadline_cell = Arc::new(Mutex::new(times.deadline));
    // A renewal (or proclamation) sent at `sent` succeeded: the term runs on from then.
    let renewed = |times: &mut TermTimes, sent: Instant| {
        *times = term_times(sent);
        *deadline_cell.lock().unwrap_or_else(|p| p.into_inner()) = times.deadline;
        shared.metrics.remaining(times.deadline.saturating_duration_since(shared.clock.now()));
    };
    // An announcing winner first asks whether the election belongs to someone else; nothing
    // has been handed out yet, so if it does, the lease goes back at once.
    if cfg.announce && slot.is_none() {
        let until = times.stop_at.min(shared.clock.now() + cfg.request_timeout);
        match Box::pin(successor(shared, until)).await {
            Some(Successor::Reserved { to, remaining }) => {
                tracing::info!(%election, successor = %to, "won, but the election is reserved for another candidate; giving it back");
                Box::pin(give_back(shared, lease)).await;
                return (StepDownReason::HandedOver { to }, remaining.min(cfg.ttl));
            }
            Some(Successor::Higher(to)) => {
                tracing::info!(%election, successor = %to, "won, but a candidate of higher priority campaigns; handing over to it");
                Box::pin(reserve(shared, &to)).await;
                Box::pin(give_back(shared, lease)).await;
                return (StepDownReason::HandedOver { to }, cfg.ttl);
            }
            None => {}
        }
    }
    // One holder and several are different records in the store, so a winner of the other
    // kind would run beside them: it looks before its term is handed out, and if it finds
    // that kind holding, gives the lease back and stops campaigning.
    let until = times.stop_at.min(shared.clock.now() + cfg.request_timeout);
    if let Some(why) = Box::pin(other_kind(shared, slot, until)).await {
        tracing::error!(election = %shared.req.election, "{why}; campaigning stops");
        Box::pin(give_back(shared, lease)).await;
        *shared.failure.lock().unwrap_or_else(|p| p.into_inner()) = Some(ElectError::Unsupported(why));
        return (StepDownReason::ShuttingDown, Duration::ZERO);
    }
    let cancel = CancellationToken::new();
    let asks = Arc::new(Asks::default());
    let gone = Arc::new(tokio::sync::Notify::new());
    let mut pending = Some(Leadership {
        term: Arc::new(Term {
            election: shared.req.election.clone(),
            holder: shared.req.holder.clone(),
            token,
            index,
            holders: cfg.holders,
            metadata: Mutex::new(lease.metadata.clone()),
            deadline: deadline_cell.clone(),
            clock: shared.clock.clone(),
            ttl: cfg.ttl,
            presence: shared.presence.clone(),
            asks: asks.clone(),
            gone: gone.clone(),
        }),
        cancel: cancel.clone(),
    });
    let publish_at = sent + cfg.cool_down;
    let mut watch = shared.store.watch(election);
    note!(shared, election = %shared.req.election, %token, holder_index = ?slot, "elected");
    view.saw_record(Some(&*lease));
    let mut resigners: Vec<Resign> = Vec::new();
    // A proclamation answered by a grant of a new term, to release after the work stops.
    let mut release_new_grant = false;
    // The successor to reserve the election for, after the work stops and before the release.
    let mut reserve_for: Option<HolderId> = None;

    let reason = loop {
        // After a pause (SIGSTOP, a stalled VM) these may already have passed.
        let now = shared.clock.now();
        if now >= times.deadline {
            break StepDownReason::DeadlinePassed;
        }
        if now >= times.stop_at {
            break StepDownReason::RenewFailed;
        }
        let publish_wait = async {
            match pending {
                // Without a cool-down it is already due: hand it out now, not at the timer's
                // next tick (up to a millisecond on every handover).
                Some(_) if shared.clock.now() >= publish_at => {}
                Some(_) => shared.clock.sleep_until(publish_at).await,
                None => std::future::pending().await,
            }
        };
        // One timer for both: the renewal is due no later than the step-down time, and a
        // renewal woken at or past that time steps down instead.
        let renew_due_at = times.renew_at.min(times.stop_at);
        tokio::select! {
            biased;
            _ = shared.shutdown.cancelled() => break StepDownReason::ShuttingDown,
            // One waiter for both kinds of ask, as it is kept by every leader between
            // renewals. A resignation goes first; a proclamation waits while a renewal is
            // due, so that proclamations that keep failing cannot starve the renewal.
            ask = asks.next(|s| {
                s.resign.pop().map(Ask::Resign).or_else(|| {
                    let renewal_due = shared.clock.now() >= renew_due_at;
                    if renewal_due { None } else { s.proclaim.pop_front().map(Ask::Proclaim) }
                })
            }) => match ask {
                Ask::Resign(tx) => {
                    resigners.push(tx);
                    break StepDownReason::Resigned;
                }
                Ask::Proclaim(p) => {
                    let sent = shared.clock.now();
                    if sent >= times.stop_at {
                        let _ = p.done.send(Err(ProclaimError::TermEnded));
                        continue;
                    }
                    let req = AcquireRequest::new(election.clone(), shared.req.holder.clone(), cfg.ttl)
                        .with_metadata(p.metadata.clone());
                    let until = times.stop_at.min(sent + cfg.request_timeout);
                    match call(shared, "proclaim", until, shared.store.try_acquire(&req)).await {
                        // A same-holder acquire is a renewal: the same term, dated from its send time.
                        Ok(Acquire::Acquired(rec)) if rec.token == lease.token => {
                            *lease = rec;
                            renewed(&mut times, sent);
                            if let Some(l) = shared.leadership.get() {
                                *l.term.metadata.lock().unwrap_or_else(|p| p.into_inner()) = p.metadata;
                            }
                            let _ = p.done.send(Ok(()));
                        }
                        Ok(Acquire::Acquired(grant)) => {
                            // A new grant: the store had ended this term. This process does not
                            // lead in it: the work stops first (the step-down below), then the
                            // grant, which keeps everyone else out meanwhile, is released.
                            let _ = p.done.send(Err(ProclaimError::TermEnded));
                            *lease = grant;
                            release_new_grant = true;
                            break StepDownReason::Lost { to: None };
                        }
                        Ok(Acquire::Held(cur)) => {
                            let _ = p.done.send(Err(ProclaimError::TermEnded));
                            break lost(lease, Some(cur));
                        }
                        Err(e) => {
                            tracing::warn!(%election, error = %e, "publishing new metadata failed");
                            let _ = p.done.send(Err(ProclaimError::Store(e)));
                        }
                    }
                }
            },
            _ = publish_wait => {
                // Woken late (a pause during a cool-down): the top of the loop steps down
                // instead of announcing a term that is already over.
                if shared.clock.now() >= times.stop_at {
                    continue;
                }
                if let Some(l) = pending.take() {
                    shared.metrics.elected(view.takeover.take());
                    shared.metrics.remaining(times.deadline.saturating_duration_since(shared.clock.now()));
                    shared.send_event(Event::Elected { token: l.token() });
                    shared.leadership.replace(Some(l));
                }
            }
            _ = shared.clock.sleep_until(renew_due_at) => {
                let sent = shared.clock.now();
                // Woken late (a pause): no time is left to renew in.
                if sent >= times.deadline {
                    break StepDownReason::DeadlinePassed;
                }
                if sent >= times.stop_at {
                    break StepDownReason::RenewFailed;
                }
                let until = times.stop_at.min(sent + cfg.request_timeout);
                match call(shared, "renew", until, shared.store.renew(lease, cfg.ttl)).await {
                    Ok(Renew::Renewed(rec)) => {
                        *lease = rec;
                        renewed(&mut times, sent);
                        if cfg.announce && slot.is_none() {
                            let until = times.stop_at.min(shared.clock.now() + cfg.request_timeout);
                            match Box::pin(successor(shared, until)).await {
                                // A reservation made during this term: an operator's handover.
                                Some(Successor::Reserved { to, .. }) => {
                                    tracing::info!(%election, successor = %to, "the election was reserved for another candidate; handing over");
                                    break StepDownReason::HandedOver { to };
                                }
                                Some(Successor::Higher(to)) => {
                                    tracing::info!(%election, successor = %to, "a candidate of higher priority campaigns; handing over to it");
                                    #[cfg(feature = "mutants")]
                                    if cfg.mutation_hand_over_without_stepping_down {
                                        // The planted bug: give the lease away and lead on.
                                        Box::pin(reserve(shared, &to)).await;
                                        Box::pin(give_back(shared, lease)).await;
                                        continue;
                                    }
                                    reserve_for = Some(to.clone());
                                    break StepDownReason::HandedOver { to };
                                }
                                None => {}
                            }
                        }
                    }
                    Ok(Renew::Lost(cur)) => break lost(lease, cur),
                    Err(e) => {
                        tracing::warn!(%election, error = %e, "renewal failed; retrying");
                        let now = shared.clock.now();
                        if now >= times.stop_at {
                            break StepDownReason::RenewFailed;
                        }
                        times.renew_at = (now + cfg.jittered(cfg.retry_period)).min(times.stop_at);
                    }
                }
            }
            seen = leader_watch(&mut watch, lease) => match seen {
                LeaderWatch::Ours => {}
                LeaderWatch::Ask => {
                    // Someone else's record, an eviction, or none at all: ask the store
                    // with a renewal, whose answer is authoritative.
                    times.renew_at = shared.clock.now();
                }
                LeaderWatch::Ended => watch = None,
            },
        }
    };

    // Step down: end the term, wait for the guarded work, then release.
    cancel.cancel();
    // A proclamation sent meanwhile is answered now: its caller may hold the leadership
    // that the release below waits for.
    asks.end_proclaims();
    drop(pending);
    shared.leadership.replace(None);
    note!(shared, election = %shared.req.election, %token, holder_index = ?slot, ?reason, "stepped down");
    shared.metrics.ended(&reason);
    shared.send_event(Event::SteppedDown { reason: reason.clone() });
    // Warn if the work outlives the deadline, unless we only woke up past it.
    let mut warned = shared.clock.now() >= times.deadline;
    loop {
        tokio::select! {
            biased;
            _ = gone.notified() => break,
            _ = shared.clock.sleep_until(times.deadline), if !warned => {
                warned = true;
                tracing::error!(%election, token = %lease.token,
                    "the guarded work is still running past the lease deadline; drop every Leadership clone when it is cancelled");
            }
        }
    }
    resigners.extend(asks.close());
    let mut stand_aside = resigners.iter().map(|r| r.stand_aside).max().unwrap_or_default();
    if let Some(to) = &reserve_for {
        Box::pin(reserve(shared, to)).await;
    }
    // A candidate that stops or stands aside withdraws its presence before the release,
    // so that the next winner does not find it announced and hand the election back to it.
    // An unhealthy one stays away longer each time in a row.
    let resigned_unhealthy = reason == StepDownReason::Resigned && !stand_aside.is_zero();
    *unhealthy = if resigned_unhealthy { unhealthy.saturating_add(1) } else { 0 };
    match (&reason, &shared.presence) {
        (StepDownReason::ShuttingDown, Some(p)) => {
            p.shared.shutdown.cancel();
            // Its release and the reads that confirm it (see `release`), a read before them when
            // it stops as a follower with an acquire unanswered (`stop_following`), and a
            // little more.
            let until = shared.clock.now() + cfg.request_timeout * (RELEASE_TIMEOUTS + 2);
            tokio::select! {
                biased;
                _ = Box::pin(p.stopped()) => {}
                _ = shared.clock.sleep_until(until) => {}
            }
        }
        (StepDownReason::Resigned | StepDownReason::Evicted, Some(p)) => {
            let hold = cfg.resign_backoff.max(stand_aside).saturating_mul(2u32.pow((*unhealthy).clamp(1, 7) - 1));
            if let Some(presence) = p.current() {
                tracing::debug!(%election, ?hold, "standing aside: no longer announced meanwhile");
                let until = shared.clock.now() + cfg.request_timeout * (RELEASE_TIMEOUTS + 2);
                tokio::select! {
                    biased;
                    _ = Box::pin(presence.resign_for(hold)) => {}
                    _ = shared.clock.sleep_until(until) => {}
                }
            }
        }
        _ => {}
    }
    if !matches!(reason, StepDownReason::Lost { .. }) || release_new_grant {
        match Box::pin(release(shared, lease)).await {
            Ok(true) => view.saw(None),
            Ok(false) => {}
            Err(e) => {
                tracing::warn!(%election, error = %e, "release failed or could not be confirmed; the lease will expire on its own")
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
    for r in resigners {
        let _ = r.done.send(());
    }
    (reason, stand_aside)
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
