//! Watching who leads, for programs that do not campaign.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;
use tokio_stream::{Stream, StreamExt};
use tokio_util::sync::{CancellationToken, DropGuard};

use crate::clock::{Clock, TokioClock};
use crate::name::ElectionName;
use crate::record::Leader;
use crate::store::LeaseStore;

/// Who leads one election, kept current in the background. Made by [`observe`].
///
/// It wakes on the store's watch where the store has one (and at the moment the
/// record it last saw would expire, since expiries can be silent), and polls
/// otherwise. Dropping it stops the background task.
pub struct Observer {
    rx: watch::Receiver<Option<Leader>>,
    first: bool,
    _guard: DropGuard,
}

impl Observer {
    /// The leader as last seen (`None` before the first read completes, or when nobody leads).
    pub fn current(&self) -> Option<Leader> {
        self.rx.borrow().clone()
    }

    /// Waits for the first reading, then for each change (of leader, or of the
    /// metadata the leader publishes); returns the leader then in force. `None` from the outer option means the observer stopped.
    pub async fn changed(&mut self) -> Option<Option<Leader>> {
        if self.first {
            self.first = false;
            // The first reading always counts as a change.
            self.rx.changed().await.ok()?;
            return Some(self.rx.borrow_and_update().clone());
        }
        self.rx.changed().await.ok()?;
        Some(self.rx.borrow_and_update().clone())
    }

    /// The readings as a stream: the first reading, then every change of leader or of
    /// its metadata.
    pub fn into_stream(self) -> impl Stream<Item = Option<Leader>> + Send {
        tokio_stream::wrappers::WatchStream::from_changes(self.rx.clone()).map(move |v| {
            let _keep = &self._guard;
            v
        })
    }
}

/// Observes `election` on `store`, polling every second where the store cannot watch.
pub fn observe(store: Arc<dyn LeaseStore>, election: ElectionName) -> Observer {
    observe_with(store, election, Duration::from_secs(1), Arc::new(TokioClock))
}

/// Observes `election`, polling every `poll` where the store cannot watch, on `clock`.
pub fn observe_with(
    store: Arc<dyn LeaseStore>,
    election: ElectionName,
    poll: Duration,
    clock: Arc<dyn Clock>,
) -> Observer {
    let (tx, rx) = watch::channel(None);
    let stop = CancellationToken::new();
    let token = stop.clone();
    tokio::spawn(async move {
        let mut watch = store.watch(&election);
        let mut watch_failed_at = None;
        let mut first = true;
        loop {
            let read_at = clock.now();
            // A failed watch is tried again after a poll period; polling covers the gap.
            if watch.is_none() && watch_failed_at.is_some_and(|t| read_at >= t + poll) {
                watch = store.watch(&election);
                watch_failed_at = None;
            }
            let wake_at = match store.get(&election).await {
                Ok(rec) => {
                    let leader = rec.as_ref().map(|r| r.leader());
                    if first {
                        first = false;
                        tx.send_replace(leader);
                    } else {
                        // A new leader, or new metadata proclaimed by the same one.
                        tx.send_if_modified(|cur| {
                            let changed = *cur != leader;
                            if changed {
                                *cur = leader;
                            }
                            changed
                        });
                    }
                    let expiry =
                        rec.as_ref().map(|r| read_at + r.remaining.unwrap_or(r.ttl) + Duration::from_millis(1));
                    match (&watch, expiry) {
                        (Some(_), Some(e)) => e,
                        (Some(_), None) => read_at + Duration::from_secs(3600),
                        (None, Some(e)) => e.min(read_at + poll),
                        (None, None) => read_at + poll,
                    }
                }
                Err(e) => {
                    tracing::warn!(%election, error = %e, "observer could not read the lease");
                    read_at + poll
                }
            };
            let event = async {
                match &mut watch {
                    Some(w) => w.next().await,
                    None => std::future::pending().await,
                }
            };
            tokio::select! {
                biased;
                _ = token.cancelled() => return,
                _ = clock.sleep_until(wake_at) => {}
                ev = event => if !matches!(ev, Some(Ok(_))) {
                    tracing::debug!(%election, "the watch failed; polling until it can be renewed");
                    watch = None;
                    watch_failed_at = Some(clock.now());
                },
            }
        }
    });
    Observer { rx, first: true, _guard: stop.drop_guard() }
}
