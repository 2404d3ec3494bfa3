//! A building block for stores whose change notifications say only *that* something
//! may have changed: re-read the election on each signal and report real changes.

use std::future::Future;
use std::time::Duration;

use tokio::sync::mpsc;
use tokio_stream::{Stream, StreamExt};

use crate::name::ElectionName;
use crate::record::LeaseRecord;
use crate::store::{StoreError, WatchStream};

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
        let mut signals = Box::pin(signals);
        let mut last = match reread().await {
            None => return,
            Some(Ok(r)) => key(&r),
            Some(Err(e)) => {
                let _ = tx.send(Err(e)).await;
                return;
            }
        };
        loop {
            tokio::select! {
                biased;
                _ = tx.closed() => return,
                s = signals.next() => if s.is_none() { return },
            }
            match reread().await {
                None => return,
                Some(Ok(rec)) if key(&rec) == last => {}
                Some(Ok(rec)) => {
                    last = key(&rec);
                    if tx.send(Ok(rec)).await.is_err() {
                        return;
                    }
                }
                Some(Err(e)) => {
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
    mut changes: tokio::sync::broadcast::Receiver<Change>,
    election: &ElectionName,
) -> WatchStream {
    use tokio::sync::broadcast::error::RecvError;
    let (tx, rx) = mpsc::channel(16);
    let election = election.clone();
    tokio::spawn(async move {
        let key = |r: &Option<LeaseRecord>| r.as_ref().map(|r| (r.holder.clone(), r.token, r.revision, r.evicted));
        let reread = async || loop {
            match store.get(&election).await {
                Err(e) if e.is_retryable() => tokio::select! {
                    _ = tx.closed() => return None,
                    _ = tokio::time::sleep(Duration::from_millis(100)) => {}
                },
                other => return Some(other),
            }
        };
        let mut last = match reread().await {
            None => return,
            Some(Ok(r)) => key(&r),
            Some(Err(e)) => {
                let _ = tx.send(Err(e)).await;
                return;
            }
        };
        loop {
            let change = tokio::select! {
                biased;
                _ = tx.closed() => return,
                c = changes.recv() => c,
            };
            let now = match change {
                Err(RecvError::Closed) => return,
                Ok(Change { election: n, .. }) if !n.is_empty() && *n != *election.as_str() => continue,
                Ok(Change { record: Some(rec), .. }) => Ok(rec),
                Ok(_) | Err(RecvError::Lagged(_)) => match reread().await {
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
