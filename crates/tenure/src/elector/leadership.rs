//! A term as its holders see it: [`Leadership`], and what they ask of the lead loop.

use super::*;

/// Proof of leadership, handed to the leader's work. Clone it freely.
///
/// The lease is released only after every clone has been dropped, so keep one for
/// exactly as long as the guarded work runs.
#[derive(Clone)]
pub struct Leadership {
    pub(super) term: Arc<Term>,
    pub(super) cancel: CancellationToken,
}

pub(super) struct Term {
    pub(super) election: ElectionName,
    pub(super) holder: HolderId,
    /// The holder's token: the lease's, or with several holders the slot's as
    /// [`crate::holders::holder_token`] makes it.
    pub(super) token: crate::FencingToken,
    /// The slot held, with several holders; 0 with one.
    pub(super) index: u32,
    /// How many hold the election at once ([`Config::holders`]).
    pub(super) holders: u32,
    /// What the leader publishes, as last proclaimed.
    pub(super) metadata: Mutex<Vec<u8>>,
    pub(super) deadline: Arc<Mutex<Instant>>,
    pub(super) clock: Arc<dyn Clock>,
    /// The lease TTL, for how long an unhealthy leader stands aside.
    pub(super) ttl: Duration,
    /// The presence lease's candidate, to publish health with.
    pub(super) presence: Option<Elector>,
    /// Resignations and proclamations for the lead loop.
    pub(super) asks: Arc<Asks>,
    /// Told when the last clone is dropped; the runtime waits for that before releasing.
    pub(super) gone: Arc<tokio::sync::Notify>,
}

impl Drop for Term {
    fn drop(&mut self) {
        // Kept as a permit if the runtime is not waiting yet.
        self.gone.notify_one();
    }
}

/// What the holders of a term ask of its lead loop. A queue under a lock rather than
/// channels: a channel keeps a block of slots, and a process may hold thousands of terms.
#[derive(Default)]
pub(super) struct Asks {
    pub(super) state: Mutex<AsksState>,
    pub(super) changed: tokio::sync::Notify,
}

#[derive(Default)]
pub(super) struct AsksState {
    pub(super) resign: Vec<Resign>,
    pub(super) proclaim: std::collections::VecDeque<Proclaim>,
    /// The term is ending: proclamations are refused.
    pub(super) proclaim_closed: bool,
    /// The lead loop is done with the term: everything is refused.
    pub(super) closed: bool,
}

impl Asks {
    pub(super) fn lock(&self) -> std::sync::MutexGuard<'_, AsksState> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Queues a resignation; gives it back once the lead loop is done with the term.
    pub(super) fn resign(&self, r: Resign) -> Result<(), Resign> {
        let mut s = self.lock();
        if s.closed {
            return Err(r);
        }
        s.resign.push(r);
        drop(s);
        self.changed.notify_waiters();
        Ok(())
    }

    /// Queues a proclamation; gives it back once the term is ending.
    pub(super) fn proclaim(&self, p: Proclaim) -> Result<(), Proclaim> {
        let mut s = self.lock();
        if s.closed || s.proclaim_closed {
            return Err(p);
        }
        s.proclaim.push_back(p);
        drop(s);
        self.changed.notify_waiters();
        Ok(())
    }

    /// Waits until `take` finds something.
    pub(super) async fn next<T>(&self, take: impl Fn(&mut AsksState) -> Option<T>) -> T {
        once_seen(&self.changed, || take(&mut self.lock())).await
    }

    /// Refuses proclamations from now on; answers those still queued.
    pub(super) fn end_proclaims(&self) {
        let queued = {
            let mut s = self.lock();
            s.proclaim_closed = true;
            std::mem::take(&mut s.proclaim)
        };
        for p in queued {
            let _ = p.done.send(Err(ProclaimError::TermEnded));
        }
    }

    /// Refuses everything from now on; the resignations still queued.
    pub(super) fn close(&self) -> Vec<Resign> {
        let mut s = self.lock();
        s.closed = true;
        std::mem::take(&mut s.resign)
    }
}

impl std::fmt::Debug for Leadership {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Leadership")
            .field("election", &self.term.election)
            .field("token", &self.term.token)
            .field("valid", &self.is_valid())
            .finish()
    }
}

impl Leadership {
    /// The fencing token of this term. Pass it with every write to a fenced resource.
    pub fn token(&self) -> crate::FencingToken {
        self.term.token
    }

    /// The election.
    pub fn election(&self) -> &ElectionName {
        &self.term.election
    }

    /// Which of the election's holders this is: 0 to [`Config::holders`] − 1, so that
    /// holders can split the work; always 0 with one holder.
    pub fn holder_index(&self) -> u32 {
        self.term.index
    }

    /// How many hold the election at once ([`Config::holders`]): 1 unless several do.
    pub fn holders(&self) -> u32 {
        self.term.holders
    }

    /// This leader's holder id.
    pub fn holder(&self) -> &HolderId {
        &self.term.holder
    }

    /// Who leads, as observers see it.
    pub fn leader(&self) -> Leader {
        let metadata = self.term.metadata.lock().unwrap_or_else(|p| p.into_inner()).clone();
        Leader { holder: self.term.holder.clone(), token: self.term.token, metadata }
    }

    /// The local deadline: the lease certainly holds before this instant. It moves
    /// forward on every successful renewal.
    pub fn deadline(&self) -> Instant {
        *self.term.deadline.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Time left before [`Leadership::deadline`], zero once it has passed or the term ended.
    pub fn remaining(&self) -> Duration {
        if self.cancel.is_cancelled() {
            return Duration::ZERO;
        }
        self.deadline().saturating_duration_since(self.term.clock.now())
    }

    /// Whether this term still holds: not stepped down and before the deadline.
    /// Check it right before acting; pass the token to the resource as well, since
    /// the process can pause between the check and the act.
    pub fn is_valid(&self) -> bool {
        !self.cancel.is_cancelled() && self.term.clock.now() < self.deadline()
    }

    /// Completes when the term ends (step-down, loss, eviction, shutdown).
    pub async fn cancelled(&self) {
        self.cancel.cancelled().await
    }

    /// A token cancelled when the term ends, for use with tokio-util's cancellation tree.
    pub fn cancellation_token(&self) -> CancellationToken {
        self.cancel.child_token()
    }

    /// Steps down at once and hands over: the term is cancelled, and the lease is
    /// released as soon as every other clone of this leadership has been dropped.
    /// Returns after the release. Do not call it while holding another clone in the
    /// same task: it would wait for that clone forever.
    pub async fn resign(self) {
        self.resign_for(Duration::ZERO).await
    }

    /// Like [`Leadership::resign`], and then stands aside for at least `stand_aside`
    /// (or [`Config::resign_backoff`], if longer) before campaigning again, so that
    /// another candidate takes over: what a leader does when it finds itself unhealthy.
    /// A stand-aside of one TTL lets even candidates that poll find the lease free.
    pub async fn resign_for(self, stand_aside: Duration) {
        let (tx, rx) = oneshot::channel();
        let sent = self.term.asks.resign(Resign { done: tx, stand_aside }).is_ok();
        drop(self);
        if sent {
            let _ = rx.await;
        }
    }
}

impl Leadership {
    /// Publishes `metadata` in place of what this leader published so far, within the
    /// term: the token stays, observers and watchers see the new value (etcd's
    /// `Proclaim`). It is sent to the store as a renewal (a same-holder acquire, store
    /// duty 4), so it also extends the term, dated from its send time like any renewal.
    /// Returns once the store has answered.
    pub async fn set_metadata(&self, metadata: impl Into<Vec<u8>>) -> Result<(), ProclaimError> {
        let metadata = metadata.into();
        if metadata.len() > crate::store::MAX_METADATA {
            return Err(ProclaimError::TooLarge(metadata.len()));
        }
        if self.cancel.is_cancelled() {
            return Err(ProclaimError::TermEnded);
        }
        let (tx, rx) = oneshot::channel();
        self.term.asks.proclaim(Proclaim { metadata, done: tx }).map_err(|_| ProclaimError::TermEnded)?;
        rx.await.unwrap_or(Err(ProclaimError::TermEnded))
    }

    /// Publishes this leader's health with its presence, for `tenure status` and
    /// [`crate::candidates`] (one store call). Without [`Config::announce`] there is no
    /// presence to publish it with, and it does nothing. [`ProclaimError::TermEnded`]
    /// means the presence lease is not held right now (it is being renewed back).
    pub async fn set_health(&self, health: crate::Health) -> Result<(), ProclaimError> {
        let Some(presence) = &self.term.presence else { return Ok(()) };
        let Some(l) = presence.current() else { return Err(ProclaimError::TermEnded) };
        l.set_metadata(crate::presence::with_health(&presence.config().metadata, health)).await
    }

    /// Starts a watchdog over the guarded work, for a leader that keeps renewing while
    /// its work is stuck: unless [`Watchdog::progress`] is called at least every
    /// `within`, the leader resigns and stands aside for one TTL, so that a healthy
    /// replica takes over. Off unless started; dropping the watchdog stops it, and it
    /// ends with the term.
    pub fn watchdog(&self, within: Duration) -> Watchdog {
        let clock = self.term.clock.clone();
        let (tx, mut rx) = tokio::sync::watch::channel(clock.now());
        let l = self.clone();
        let task = tokio::spawn(async move {
            let mut last = *rx.borrow_and_update();
            loop {
                tokio::select! {
                    // The term is over: let the lease go without us.
                    _ = l.cancelled() => return,
                    changed = rx.changed() => match changed {
                        Ok(()) => last = *rx.borrow_and_update(),
                        Err(_) => return,
                    },
                    _ = l.term.clock.sleep_until(last + within) => {
                        tracing::warn!(election = %l.election(), token = %l.token(), ?within,
                            "the guarded work reported no progress in time; resigning so that a healthy replica leads");
                        let ttl = l.term.ttl;
                        l.resign_for(ttl).await;
                        return;
                    }
                }
            }
        });
        Watchdog { clock, progress: tx, task }
    }
}

/// Resigns the leadership it watches unless the guarded work reports progress in time;
/// see [`Leadership::watchdog`].
pub struct Watchdog {
    pub(super) clock: Arc<dyn Clock>,
    pub(super) progress: tokio::sync::watch::Sender<Instant>,
    pub(super) task: tokio::task::JoinHandle<()>,
}

impl Watchdog {
    /// The guarded work is making progress: the time allowed starts again from now.
    pub fn progress(&self) {
        self.progress.send_replace(self.clock.now());
    }
}

impl Drop for Watchdog {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// A request to publish new metadata: answered once the store has.
pub(super) struct Proclaim {
    pub(super) metadata: Vec<u8>,
    pub(super) done: oneshot::Sender<Result<(), ProclaimError>>,
}

/// What the holders of a term asked of its lead loop.
pub(super) enum Ask {
    Resign(Resign),
    Proclaim(Proclaim),
}

/// A request to resign: answered once the lease is released.
pub(super) struct Resign {
    pub(super) done: oneshot::Sender<()>,
    /// How long to stand aside before campaigning again (at least the resign backoff).
    pub(super) stand_aside: Duration,
}
