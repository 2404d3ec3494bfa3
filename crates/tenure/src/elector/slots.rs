//! The follower with several holders: campaigns until this candidate holds one slot.

use super::*;

/// The follower phase with several holders ([`Config::holders`]): campaigns until this
/// candidate holds one of the slots, and answers its index. `None` on shutdown.
///
/// It holds at most one slot: it tries the slots that are not known to be held one at a
/// time, from a random one on (so that candidates started together spread over them),
/// and after an acquire whose answer never came it tries no other slot before a read has
/// told whether that one was granted. Between rounds it waits for a slot's watch to
/// report a change, or for the earliest moment a slot it saw held would expire.
pub(super) async fn follow_slots(shared: &Shared) -> Option<(u32, LeaseRecord, Instant)> {
    let cfg = &shared.cfg;
    let me = &shared.req.holder;
    let n = shared.slots.len();
    let mut watches = tokio_stream::StreamMap::new();
    for (i, slot) in shared.slots.iter().enumerate() {
        if let Some(w) = shared.store.watch(&slot.election) {
            // A watch that ends says so, as an error, so that its slot is polled from then
            // on (the map would drop it without a word).
            let ended = tokio_stream::once(Err(StoreError::unavailable("the watch ended")));
            let w: WatchStream = Box::pin(tokio_stream::StreamExt::chain(w, ended));
            watches.insert(i, w);
        }
    }
    let watching = |w: &tokio_stream::StreamMap<usize, WatchStream>, i: usize| w.contains_key(&i);
    // When each slot, last seen held by another, would expire; `None`: try it.
    let mut held_until: Vec<Option<Instant>> = vec![None; n];
    // The grant and revision each end was read from: of the readings of one revision,
    // the earliest end counts (a watch catching up late gives later ones; see `View::ends`).
    let mut read_from: Vec<Option<(HolderId, crate::FencingToken, crate::store::Revision)>> = vec![None; n];
    let mut saw = |i: usize, rec: &LeaseRecord, held_until: &mut Vec<Option<Instant>>| {
        let end = shared.clock.now() + rec.remaining.unwrap_or(rec.ttl);
        let from = Some((rec.holder.clone(), rec.token, rec.revision));
        held_until[i] = match held_until[i] {
            Some(earlier) if read_from[i] == from => Some(earlier.min(end)),
            _ => Some(end),
        };
        read_from[i] = from;
    };
    // A slot whose acquire may have been granted without an answer: read it first.
    let mut unresolved: Option<usize> = None;
    let mut failures = Failures::new(&shared.req.election);
    let mut attempt = true;
    let mut wake_at = shared.clock.now();
    loop {
        if shared.shutdown.is_cancelled() {
            Box::pin(stop_following(shared, unresolved.map(|i| &shared.slots[i].election))).await;
            return None;
        }
        if attempt {
            attempt = false;
            let now = shared.clock.now();
            let retry_at = now + cfg.jittered(cfg.retry_period);
            wake_at = retry_at;
            if let Some(i) = unresolved {
                let until = now + cfg.request_timeout;
                match call(shared, "get", until, shared.store.get(&shared.slots[i].election)).await {
                    Ok(Some(rec)) if rec.holder == *me && !rec.evicted => {
                        // Confirm it with a compare-and-set renewal, and date the term from it.
                        let sent = shared.clock.now();
                        let until = sent + cfg.request_timeout;
                        match call(shared, "renew", until, shared.store.renew(&rec, cfg.ttl)).await {
                            Ok(Renew::Renewed(lease)) => return Some((i as u32, lease, sent)),
                            Ok(Renew::Lost(_)) => unresolved = None,
                            Err(e) => failures.note(&e, "confirming a maybe-held slot failed", shared.clock.now()),
                        }
                    }
                    Ok(_) => unresolved = None,
                    Err(e) => failures.note(&e, "reading a slot failed", shared.clock.now()),
                }
                if unresolved.is_some() {
                    // Still unknown: try again after a retry period, and nothing else meanwhile.
                    wake_at = retry_at;
                } else {
                    attempt = true;
                }
            } else {
                let first = fastrand::usize(..n);
                for k in 0..n {
                    let i = (first + k) % n;
                    // A slot seen held waits for its end where a watch would tell of a
                    // change. One not watched is asked at each wake (a retry period), as a
                    // follower of one lease asks: where the store does not say how long a
                    // grant has left (an Azure blob lease), the end is a guess of a TTL from
                    // the reading, and a renewal read at that guess would put it off again.
                    if held_until[i].is_some_and(|t| t > shared.clock.now())
                        && (watching(&watches, i) || crate::mutant("slot-unwatched-unpolled"))
                    {
                        continue;
                    }
                    if shared.shutdown.is_cancelled() {
                        break;
                    }
                    let sent = shared.clock.now();
                    let until = sent + cfg.request_timeout;
                    match call(shared, "acquire", until, shared.store.try_acquire(&shared.slots[i])).await {
                        Ok(Acquire::Acquired(lease)) => return Some((i as u32, lease, sent)),
                        Ok(Acquire::Held(cur)) => {
                            failures.reset();
                            saw(i, &cur, &mut held_until);
                        }
                        Err(e) if !e.is_retryable() => {
                            tracing::error!(election = %shared.req.election, error = %e, "the store refused; no retry can help, so campaigning stops");
                            let mut f = shared.failure.lock().unwrap_or_else(|p| p.into_inner());
                            *f = Some(ElectError::Store(Arc::new(e)));
                            return None;
                        }
                        Err(e) => {
                            failures.note(&e, "acquire failed", shared.clock.now());
                            if e.kind() == ErrorKind::Ambiguous {
                                unresolved = Some(i);
                            }
                            // The store is failing: the other slots wait for the retry,
                            // rather than a request timeout each, now.
                            if !crate::mutant("slot-wake-unfloored") {
                                held_until[i] = None;
                            }
                            break;
                        }
                    }
                }
                // Wake when the first slot seen held would expire (no later than a poll
                // period for a slot not watched), or after a retry period for a slot not
                // seen held: one whose acquire failed, or whose holder's time ran out.
                let now = shared.clock.now();
                wake_at = (0..n)
                    .map(|i| match held_until[i] {
                        Some(t) if t > now && watching(&watches, i) => t,
                        Some(t) if t > now => t.min(retry_at),
                        _ => retry_at,
                    })
                    .min()
                    .unwrap_or(retry_at)
                    .max(now + cfg.retry_period / 10);
                // The planted bug: every slot seen held and watched, wake at the earliest
                // end seen, however long ago it passed.
                if crate::mutant("slot-wake-unfloored") && held_until.iter().all(|t| t.is_some()) && watches.len() == n
                {
                    wake_at = held_until.iter().flatten().copied().min().unwrap_or(retry_at);
                }
            }
            if attempt {
                continue;
            }
        }
        tokio::select! {
            biased;
            _ = shared.shutdown.cancelled() => {
                Box::pin(stop_following(shared, unresolved.map(|i| &shared.slots[i].election))).await;
                return None;
            }
            _ = shared.clock.sleep_until(wake_at) => attempt = true,
            Some((i, ev)) = tokio_stream::StreamExt::next(&mut watches) => match ev {
                Ok(Some(rec)) if rec.holder == *me && !rec.evicted => {
                    // Ours (a late echo, or a maybe-applied acquire): resolve it.
                    unresolved.get_or_insert(i);
                    attempt = true;
                }
                Ok(Some(rec)) => saw(i, &rec, &mut held_until),
                Ok(None) => {
                    held_until[i] = None;
                    attempt = true;
                }
                Err(e) => {
                    tracing::debug!(election = %shared.req.election, slot = i, error = %e, "watch failed; polling");
                    watches.remove(&i);
                    wake_at = wake_at.min(shared.clock.now() + cfg.retry_period);
                }
            },
        }
    }
}
