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
pub(super) async fn follow(
    shared: &Shared,
    view: &mut View<'_>,
    mut defer: Option<Instant>,
) -> Option<(LeaseRecord, Instant)> {
    let cfg = &shared.cfg;
    let me = &shared.req.holder;
    let mut watch = shared.store.watch(&shared.req.election);
    // After an ambiguous acquire we must read before we act.
    let mut unresolved = false;
    let mut attempt = true;
    let mut wake_at = shared.clock.now();
    let mut failures = Failures::new(&shared.req.election);
    view.lease_ends = None;
    view.vacant_since = None;
    loop {
        if shared.shutdown.is_cancelled() {
            Box::pin(stop_following(shared, unresolved.then_some(&shared.req.election))).await;
            return None;
        }
        if attempt {
            attempt = false;
            let sent = shared.clock.now();
            let until = sent + cfg.request_timeout;
            let retry_at = sent + cfg.jittered(cfg.retry_period);
            defer = defer.filter(|d| *d > sent);
            if let Some(reserved_until) = defer
                && !unresolved
            {
                match call(shared, "get", until, shared.store.get(&shared.req.election)).await {
                    Ok(Some(rec)) if rec.holder == *me && !rec.evicted => {
                        // Ours (a give-back that did not land, an acquire applied late), and
                        // nothing runs under it: give it back again, and look again later.
                        let _ = call(shared, "release", until, shared.store.release(&rec)).await;
                        wake_at = retry_at.min(reserved_until);
                    }
                    Ok(Some(rec)) => {
                        // Someone leads: the reservation has done its work.
                        defer = None;
                        failures.reset();
                        view.saw_record(Some(&rec));
                        view.live(&rec);
                        wake_at = follower_wake(shared, view, Some(&rec), watch.is_some());
                    }
                    Ok(None) => {
                        // Free: leave it only while it is still reserved for a live candidate.
                        // Boxed: a rare path, and the largest future a follower awaits.
                        let reserved =
                            Box::pin(call(shared, "list", until, Standing::read(&*shared.store, &shared.req.election)))
                                .await
                                .map(|st| matches!(st.successor(me, cfg.priority), Some(Successor::Reserved { .. })));
                        if let Ok(false) = reserved {
                            defer = None;
                            attempt = true;
                        } else {
                            // The successor's presence can end without a word on the
                            // election's watch: look again within a retry period.
                            wake_at = reserved_until.min(retry_at);
                        }
                    }
                    Err(e) => {
                        failures.note(&e, "reading the lease failed", shared.clock.now());
                        wake_at = retry_at.min(reserved_until);
                    }
                }
            } else if unresolved {
                match call(shared, "get", until, shared.store.get(&shared.req.election)).await {
                    Ok(Some(rec)) if rec.holder == *me && !rec.evicted => {
                        // A read cannot tell which of our writes produced this record,
                        // so confirm it with a compare-and-set renewal and date the
                        // term from that request.
                        let sent = shared.clock.now();
                        let until = sent + cfg.request_timeout;
                        match call(shared, "renew", until, shared.store.renew(&rec, cfg.ttl)).await {
                            Ok(Renew::Renewed(lease)) => {
                                view.won();
                                return Some((lease, sent));
                            }
                            Ok(Renew::Lost(cur)) => {
                                unresolved = false;
                                view.saw_record(cur.as_ref());
                                wake_at = follower_wake(shared, view, cur.as_ref(), watch.is_some());
                            }
                            Err(e) => {
                                failures.note(&e, "confirming a maybe-held lease failed", shared.clock.now());
                                wake_at = retry_at;
                            }
                        }
                    }
                    Ok(cur) => {
                        unresolved = false;
                        view.saw_record(cur.as_ref());
                        wake_at = if cur.is_none() {
                            shared.clock.now()
                        } else {
                            follower_wake(shared, view, cur.as_ref(), watch.is_some())
                        };
                        attempt = cur.is_none();
                    }
                    Err(e) => {
                        failures.note(&e, "reading the lease failed", shared.clock.now());
                        wake_at = retry_at;
                    }
                }
            } else {
                match call(shared, "acquire", until, shared.store.try_acquire(&shared.req)).await {
                    Ok(Acquire::Acquired(lease)) => {
                        view.won();
                        return Some((lease, sent));
                    }
                    Ok(Acquire::Held(cur)) => {
                        failures.reset();
                        view.saw_record(Some(&cur));
                        view.live(&cur);
                        wake_at = follower_wake(shared, view, Some(&cur), watch.is_some());
                    }
                    Err(e) if !e.is_retryable() => {
                        tracing::error!(election = %shared.req.election, error = %e, "the store refused; no retry can help, so campaigning stops");
                        let mut f = shared.failure.lock().unwrap_or_else(|p| p.into_inner());
                        *f = Some(ElectError::Store(Arc::new(e)));
                        return None;
                    }
                    Err(e) => {
                        if e.kind() == ErrorKind::Ambiguous {
                            unresolved = true;
                        }
                        failures.note(&e, "acquire failed", shared.clock.now());
                        wake_at = retry_at;
                    }
                }
            }
            if attempt {
                continue;
            }
        }
        tokio::select! {
            biased;
            _ = shared.shutdown.cancelled() => {
                Box::pin(stop_following(shared, unresolved.then_some(&shared.req.election))).await;
                return None;
            }
            _ = shared.clock.sleep_until(wake_at) => attempt = true,
            ev = next_event(&mut watch) => match ev {
                Some(Ok(None)) => {
                    view.saw(None);
                    view.vacant_since.get_or_insert(shared.clock.now());
                    attempt = true;
                }
                Some(Ok(Some(rec))) => {
                    if rec.holder == *me && !rec.evicted {
                        // Ours (a late echo, or a maybe-applied acquire): resolve it.
                        attempt = true;
                        unresolved = true;
                    } else if !unresolved {
                        defer = None;
                        view.saw_record(Some(&rec));
                        view.live(&rec);
                        wake_at = follower_wake(shared, view, Some(&rec), true);
                    }
                }
                Some(Err(e)) => {
                    tracing::debug!(election = %shared.req.election, error = %e, "watch failed; polling");
                    watch = None;
                    wake_at = wake_at.min(shared.clock.now() + cfg.retry_period);
                }
                None => {
                    watch = None;
                    wake_at = wake_at.min(shared.clock.now() + cfg.retry_period);
                }
            },
        }
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
/// and no later than one poll period if the store cannot tell it of changes.
pub(super) fn follower_wake(
    shared: &Shared,
    view: &mut View<'_>,
    rec: Option<&LeaseRecord>,
    watching: bool,
) -> Instant {
    let cfg = &shared.cfg;
    let now = shared.clock.now();
    let floor = now + cfg.retry_period / 10;
    let expiry = match rec {
        Some(r) => view.ends(r),
        None => now,
    };
    let wake = if watching { expiry } else { expiry.min(now + cfg.jittered(cfg.retry_period)) };
    wake.max(floor)
}
