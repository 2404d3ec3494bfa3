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
    let mut f = SlotFollower::new(shared);
    loop {
        if shared.shutdown.is_cancelled() {
            Box::pin(f.stop()).await;
            return None;
        }
        if f.due {
            f.due = false;
            let now = shared.clock.now();
            let retry_at = now + shared.cfg.jittered(shared.cfg.retry_period);
            f.wake_at = retry_at;
            let step = match f.unresolved {
                // Boxed: rare (after an acquire with no answer), and larger than the rest.
                Some(i) => Box::pin(f.resolve(i, now, retry_at)).await,
                None => f.round(retry_at).await,
            };
            match step {
                SlotAttempt::Won(i, lease, sent) => return Some((i as u32, lease, sent)),
                SlotAttempt::Refused => return None,
                SlotAttempt::Wait => {}
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
            Some((i, ev)) = tokio_stream::StreamExt::next(&mut f.watches) => f.on_watch(i, ev),
        }
    }
}

/// What an attempt of a follower of slots came to.
pub(super) enum SlotAttempt {
    /// This candidate holds slot `.0`, won by a request sent at `.2`.
    Won(usize, LeaseRecord, Instant),
    /// The store refused in a way no retry can mend: campaigning stops.
    Refused,
    /// Not won: wait until the wake time, or attempt again at once if `due` was set.
    Wait,
}

/// A follower of an election's slots, between its attempts.
pub(super) struct SlotFollower<'a> {
    shared: &'a Shared,
    /// The watch of each slot the store can watch.
    pub(super) watches: tokio_stream::StreamMap<usize, WatchStream>,
    /// When each slot, last seen held by another, would expire; `None`: try it.
    held_until: Vec<Option<Instant>>,
    /// The grant and revision each end was read from: of the readings of one revision,
    /// the earliest end counts (a watch catching up late gives later ones; see `View::ends`).
    read_from: Vec<Option<(HolderId, crate::FencingToken, crate::store::Revision)>>,
    /// A slot whose acquire may have been granted without an answer: read it first.
    pub(super) unresolved: Option<usize>,
    failures: Failures<'a>,
    /// Whether an attempt is due now.
    pub(super) due: bool,
    pub(super) wake_at: Instant,
}

impl<'a> SlotFollower<'a> {
    /// A follower that attempts at once, watching each slot the store can watch.
    pub(super) fn new(shared: &'a Shared) -> Self {
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
        SlotFollower {
            shared,
            watches,
            held_until: vec![None; n],
            read_from: vec![None; n],
            unresolved: None,
            failures: Failures::new(&shared.req.election),
            due: true,
            wake_at: shared.clock.now(),
        }
    }

    fn watching(&self, i: usize) -> bool {
        self.watches.contains_key(&i)
    }

    /// Slot `i` was seen held by `rec`'s holder: it is left alone until the grant would
    /// end, by the earliest reading of this revision.
    fn saw(&mut self, i: usize, rec: &LeaseRecord) {
        let end = self.shared.clock.now() + rec.remaining.unwrap_or(rec.ttl);
        let from = Some((rec.holder.clone(), rec.token, rec.revision));
        self.held_until[i] = match self.held_until[i] {
            Some(earlier) if self.read_from[i] == from => Some(earlier.min(end)),
            _ => Some(end),
        };
        self.read_from[i] = from;
    }

    /// After an acquire of slot `i` whose answer never came: reads the slot, and confirms
    /// it with a compare-and-set renewal if it is this holder's (the term dated from that
    /// renewal). Still unknown: nothing else is tried before a retry period.
    pub(super) async fn resolve(&mut self, i: usize, now: Instant, retry_at: Instant) -> SlotAttempt {
        let shared = self.shared;
        let cfg = &shared.cfg;
        let until = now + cfg.request_timeout;
        match call(shared, "get", until, shared.store.get(&shared.slots[i].election)).await {
            Ok(Some(rec)) if rec.holder == shared.req.holder && !rec.evicted => {
                let sent = shared.clock.now();
                let until = sent + cfg.request_timeout;
                match call(shared, "renew", until, shared.store.renew(&rec, cfg.ttl)).await {
                    Ok(Renew::Renewed(lease)) => return SlotAttempt::Won(i, lease, sent),
                    Ok(Renew::Lost(_)) => self.unresolved = None,
                    Err(e) => self.failures.note(&e, "confirming a maybe-held slot failed", shared.clock.now()),
                }
            }
            Ok(_) => self.unresolved = None,
            Err(e) => self.failures.note(&e, "reading a slot failed", shared.clock.now()),
        }
        if self.unresolved.is_some() {
            self.wake_at = retry_at;
        } else {
            self.due = true;
        }
        SlotAttempt::Wait
    }

    /// One round: tries the slots not known to be held, one at a time from a random one,
    /// until one is won or the store fails; then sets the wake time ([`Self::next_wake`]).
    pub(super) async fn round(&mut self, retry_at: Instant) -> SlotAttempt {
        let shared = self.shared;
        let n = shared.slots.len();
        let first = fastrand::usize(..n);
        for k in 0..n {
            let i = (first + k) % n;
            // A slot seen held waits for its end where a watch would tell of a change. One
            // not watched is asked at each wake (a retry period), as a follower of one
            // lease asks: where the store does not say how long a grant has left (an Azure
            // blob lease), the end is a guess of a TTL from the reading, and a renewal read
            // at that guess would put it off again.
            if self.held_until[i].is_some_and(|t| t > shared.clock.now())
                && (self.watching(i) || crate::mutant("slot-unwatched-unpolled"))
            {
                continue;
            }
            if shared.shutdown.is_cancelled() {
                break;
            }
            let sent = shared.clock.now();
            let until = sent + shared.cfg.request_timeout;
            match call(shared, "acquire", until, shared.store.try_acquire(&shared.slots[i])).await {
                Ok(Acquire::Acquired(lease)) => return SlotAttempt::Won(i, lease, sent),
                Ok(Acquire::Held(cur)) => {
                    self.failures.reset();
                    self.saw(i, &cur);
                }
                Err(e) if !e.is_retryable() => {
                    tracing::error!(election = %shared.req.election, error = %e, "the store refused; no retry can help, so campaigning stops");
                    let mut f = shared.failure.lock().unwrap_or_else(|p| p.into_inner());
                    *f = Some(ElectError::Store(Arc::new(e)));
                    return SlotAttempt::Refused;
                }
                Err(e) => {
                    self.failures.note(&e, "acquire failed", shared.clock.now());
                    if e.kind() == ErrorKind::Ambiguous {
                        self.unresolved = Some(i);
                    }
                    // The store is failing: the other slots wait for the retry, rather
                    // than a request timeout each, now.
                    if !crate::mutant("slot-wake-unfloored") {
                        self.held_until[i] = None;
                    }
                    break;
                }
            }
        }
        self.wake_at = self.next_wake(retry_at);
        SlotAttempt::Wait
    }

    /// When to wake after a round: when the first slot seen held would expire (no later
    /// than `retry_at` for a slot not watched), or at `retry_at` for a slot not seen held
    /// (its acquire failed, or its holder's time ran out); never sooner than a tenth of a
    /// retry period from now.
    fn next_wake(&self, retry_at: Instant) -> Instant {
        let shared = self.shared;
        let n = shared.slots.len();
        let now = shared.clock.now();
        let wake_at = (0..n)
            .map(|i| match self.held_until[i] {
                Some(t) if t > now && self.watching(i) => t,
                Some(t) if t > now => t.min(retry_at),
                _ => retry_at,
            })
            .min()
            .unwrap_or(retry_at)
            .max(now + shared.cfg.retry_period / 10);
        // The planted bug: every slot seen held and watched, wake at the earliest end
        // seen, however long ago it passed.
        if crate::mutant("slot-wake-unfloored")
            && self.held_until.iter().all(|t| t.is_some())
            && self.watches.len() == n
        {
            return self.held_until.iter().flatten().copied().min().unwrap_or(retry_at);
        }
        wake_at
    }

    /// What slot `i`'s watch said: this holder's record (resolve it), another's (wait for
    /// its end), none (attempt now). A watch that fails is dropped, and its slot polled.
    pub(super) fn on_watch(&mut self, i: usize, ev: Result<Option<LeaseRecord>, StoreError>) {
        let shared = self.shared;
        match ev {
            Ok(Some(rec)) if rec.holder == shared.req.holder && !rec.evicted => {
                // Ours (a late echo, or a maybe-applied acquire): resolve it.
                self.unresolved.get_or_insert(i);
                self.due = true;
            }
            Ok(Some(rec)) => self.saw(i, &rec),
            Ok(None) => {
                self.held_until[i] = None;
                self.due = true;
            }
            Err(e) => {
                tracing::debug!(election = %shared.req.election, slot = i, error = %e, "watch failed; polling");
                self.watches.remove(&i);
                self.wake_at = self.wake_at.min(shared.clock.now() + shared.cfg.retry_period);
            }
        }
    }

    /// The follower stops: an acquire left unanswered is read, and given back if granted.
    pub(super) async fn stop(&mut self) {
        let shared = self.shared;
        stop_following(shared, self.unresolved.map(|i| &shared.slots[i].election)).await;
    }
}
