//! Building blocks for store watches: turn a store's change notifications (which may say
//! only *that* something changed, or carry the record) into a [`WatchStream`] that reports
//! real changes, re-reading the election where the notification did not carry it.

use std::future::Future;
use std::time::Duration;

use tokio::sync::mpsc;
use tokio_stream::{Stream, StreamExt};

use crate::name::ElectionName;
use crate::record::LeaseRecord;
use crate::store::{StoreError, WatchEvent, WatchStream};

/// A [`WatchStream`] for `election` that re-reads the record (with `read`) whenever
/// `signals` yields, and reports it when its holder, token, revision or eviction differs
/// from the last report. Retryable read errors are retried every `retry`; other errors
/// end the stream after being reported. The stream also ends when `signals` ends.
///
/// The store decides what a signal is: a `NOTIFY`, a pub/sub message, a changed
/// `data_version`, a reconnect after which anything may have changed.
pub fn rereading_watch<S, R, F>(election: ElectionName, signals: S, read: R, retry: Duration) -> WatchStream
where
    S: Stream<Item = ()> + Send + 'static,
    R: Fn(ElectionName) -> F + Send + Sync + 'static,
    F: Future<Output = Result<Option<LeaseRecord>, StoreError>> + Send + 'static,
{
    watch_loop(election, signals.map(|()| None), read, retry)
}

/// The loop behind every watch helper: `events` yields `Some(record)` when a notification
/// carried the record as it now stands, `None` when the election must be re-read with
/// `read`. Reports a record when its holder, token, revision or eviction differs from the
/// last report; retryable read errors are retried every `retry`, other errors end the
/// stream after being reported; the stream also ends with `events`.
fn watch_loop<S, R, F>(election: ElectionName, events: S, read: R, retry: Duration) -> WatchStream
where
    S: Stream<Item = Option<WatchEvent>> + Send + 'static,
    R: Fn(ElectionName) -> F + Send + Sync + 'static,
    F: Future<Output = Result<Option<LeaseRecord>, StoreError>> + Send + 'static,
{
    let (tx, rx) = mpsc::channel(16);
    tokio::spawn(async move {
        let key = |r: &Option<LeaseRecord>| r.as_ref().map(|r| (r.holder.clone(), r.token, r.revision, r.evicted));
        // None when nobody listens any more.
        let reread = async || loop {
            match read(election.clone()).await {
                Err(e) if e.is_retryable() => tokio::select! {
                    _ = tx.closed() => return None,
                    _ = tokio::time::sleep(retry) => {}
                },
                other => return Some(other),
            }
        };
        let mut events = Box::pin(events);
        let mut last = match reread().await {
            None => return,
            Some(Ok(r)) => key(&r),
            Some(Err(e)) => {
                let _ = tx.send(Err(e)).await;
                return;
            }
        };
        loop {
            let event = tokio::select! {
                biased;
                _ = tx.closed() => return,
                ev = events.next() => match ev {
                    None => return,
                    Some(ev) => ev,
                },
            };
            let now = match event {
                Some(carried) => Ok(carried),
                None => match reread().await {
                    None => return,
                    Some(r) => r,
                },
            };
            match now {
                Ok(rec) if key(&rec) == last => {}
                Ok(rec) => {
                    last = key(&rec);
                    if tx.send(Ok(rec)).await.is_err() {
                        return;
                    }
                }
                Err(e) => {
                    let _ = tx.send(Err(e)).await;
                    return;
                }
            }
        }
    });
    Box::pin(tokio_stream::wrappers::ReceiverStream::new(rx))
}

/// A [`WatchStream`] for stores that broadcast the names of elections that changed (an
/// empty name meaning "anything may have changed", e.g. after a reconnect): re-reads
/// `election` through `store` whenever its name, an empty name, or a lag comes by.
pub fn watch_by_name(
    store: std::sync::Arc<dyn crate::LeaseStore>,
    changes: tokio::sync::broadcast::Receiver<std::sync::Arc<str>>,
    election: &ElectionName,
) -> WatchStream {
    let name: std::sync::Arc<str> = std::sync::Arc::from(election.as_str());
    let signals = tokio_stream::wrappers::BroadcastStream::new(changes).filter_map(move |m| match m {
        Ok(n) if !n.is_empty() && n != name => None,
        _ => Some(()),
    });
    let read = move |e: ElectionName| {
        let store = store.clone();
        async move { store.get(&e).await }
    };
    rereading_watch(election.clone(), signals, read, Duration::from_millis(100))
}

/// What a store's change listener saw happen to one election: its name (empty: anything
/// may have changed, e.g. after a reconnect) and, when the notification carried it, the
/// record as it now stands (`Some(None)`: the election has no record). `record: None`
/// means the notification said only *that* it changed, so watchers re-read.
#[derive(Clone, Debug)]
pub struct Change {
    /// The election that changed, or empty for "any".
    pub election: std::sync::Arc<str>,
    /// The record carried by the notification, if it carried one.
    pub record: Option<crate::store::WatchEvent>,
}

/// A [`WatchStream`] for `election` fed by a store's broadcast of [`Change`]s: a change
/// that carries the record is reported without a read (so a follower costs the store
/// nothing while the leader renews), one that does not, or a lag, makes it re-read
/// through `store`. Reports only changes of holder, token, revision or eviction.
pub fn watch_changes(
    store: std::sync::Arc<dyn crate::LeaseStore>,
    changes: tokio::sync::broadcast::Receiver<Change>,
    election: &ElectionName,
) -> WatchStream {
    let name: std::sync::Arc<str> = std::sync::Arc::from(election.as_str());
    // A change of another election is skipped; a lag, like an unnamed change, re-reads.
    let events = tokio_stream::wrappers::BroadcastStream::new(changes).filter_map(move |m| match m {
        Ok(Change { election: n, .. }) if !n.is_empty() && n != name => None,
        Ok(Change { record, .. }) => Some(record),
        Err(_) => Some(None),
    });
    let read = move |e: ElectionName| {
        let store = store.clone();
        async move { store.get(&e).await }
    };
    watch_loop(election.clone(), events, read, Duration::from_millis(100))
}
