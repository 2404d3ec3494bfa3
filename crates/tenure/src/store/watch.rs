//! Building blocks for store watches: one listener per store ([`ChangeHub::listen`]) reads
//! the store's change notifications ([`ChangeFeed`]), which may carry the record or say
//! only *that* something changed, and routes each to the watchers of its election
//! ([`watch_changes`]), which re-read where the notification did not carry the record.

use std::collections::HashMap;
use std::future::Future;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio_stream::Stream;

use crate::name::ElectionName;
use crate::record::LeaseRecord;
use crate::store::{StoreError, WatchEvent, WatchStream};

/// The loop behind every watch helper: `events` yields `Some(record)` when a notification
/// carried the record as it now stands, `None` when the election must be re-read with
/// `read`. Starts with the record as it stands (read when the stream is first polled), then
/// reports a record when its holder, token, revision or eviction differs from the last
/// report; retryable read errors are retried every `retry`, other errors end the stream
/// after being reported; the stream also ends with `events`.
///
/// It runs as the watcher polls it: no task or channel of its own, which matters with
/// thousands of watching electors in one process. So the first read comes later than the
/// subscription, and a change between the watcher's own read and that first read is
/// reported only because the first read is: a follower that read the record, then saw
/// its release before the stream was first polled, still wakes.
fn watch_loop<S, R, F>(election: ElectionName, events: S, read: R, retry: Duration) -> WatchStream
where
    S: Stream<Item = Option<WatchEvent>> + Send + 'static,
    R: Fn(ElectionName) -> F + Send + Sync + 'static,
    F: Future<Output = Result<Option<LeaseRecord>, StoreError>> + Send + 'static,
{
    let state = Loop { election, events: Box::pin(events), read: Arc::new(read), retry, last: None, started: false };
    Box::pin(Unfold { state: Some(state), reading: None })
}

type Item = Result<Option<LeaseRecord>, StoreError>;
type Key = Option<(crate::HolderId, crate::FencingToken, crate::store::Revision, bool)>;

/// The watch loop's state between two reports.
struct Loop<R> {
    election: ElectionName,
    events: std::pin::Pin<Box<dyn Stream<Item = Option<WatchEvent>> + Send>>,
    read: Arc<R>,
    retry: Duration,
    /// The last record reported, by what a change is judged on.
    last: Key,
    started: bool,
}

fn key(r: &Option<LeaseRecord>) -> Key {
    r.as_ref().map(|r| (r.holder.clone(), r.token, r.revision, r.evicted))
}

impl<R, F> Loop<R>
where
    R: Fn(ElectionName) -> F + Send + Sync + 'static,
    F: Future<Output = Item> + Send + 'static,
{
    /// Reads the election, retrying what can be retried. Owns what it uses: a `Loop` is
    /// not `Sync` (its event stream need not be), so no reference to it is held across an
    /// await.
    ///
    /// Each read runs in a task of its own: the stream only moves while its watcher polls
    /// it, and a watcher busy elsewhere (a leader waiting for its renewal) would otherwise
    /// leave a read paused halfway, holding one of the store's few pooled connections,
    /// which that very renewal may need.
    fn reread(&self) -> impl Future<Output = Item> + Send + 'static {
        let (read, election, retry) = (self.read.clone(), self.election.clone(), self.retry);
        async move {
            loop {
                // Ended with the stream: a dropped watch leaves no read queued for a
                // connection ahead of the store's renewals.
                let mut once = AbortOnDrop(tokio::spawn(read(election.clone())));
                let r = (&mut once.0).await.unwrap_or_else(|e| {
                    Err(StoreError::unavailable("the watch's read failed (its task ended)").with_source(e))
                });
                match r {
                    Err(e) if e.is_retryable() => tokio::time::sleep(retry).await,
                    other => return other,
                }
            }
        }
    }
}

/// A task that is ended when its handle is dropped.
struct AbortOnDrop<T>(tokio::task::JoinHandle<T>);

impl<T> Drop for AbortOnDrop<T> {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// A read under way, boxed: rare next to the waits for a notification.
type Reading = std::pin::Pin<Box<dyn Future<Output = Item> + Send>>;

/// The stream of a [`Loop`], written out by hand: a watcher waiting for its next
/// notification holds no future of its own, only the loop's state (an async step, boxed
/// for each wait, cost about 500 bytes per watcher).
struct Unfold<R> {
    /// None once the stream has ended.
    state: Option<Loop<R>>,
    reading: Option<Reading>,
}

impl<R, F> Stream for Unfold<R>
where
    R: Fn(ElectionName) -> F + Send + Sync + 'static,
    F: Future<Output = Item> + Send + 'static,
{
    type Item = Item;

    fn poll_next(mut self: std::pin::Pin<&mut Self>, cx: &mut std::task::Context<'_>) -> std::task::Poll<Option<Item>> {
        use std::task::Poll;
        let this = &mut *self;
        loop {
            let Some(st) = this.state.as_mut() else { return Poll::Ready(None) };
            let now = if let Some(reading) = this.reading.as_mut() {
                let Poll::Ready(out) = reading.as_mut().poll(cx) else { return Poll::Pending };
                this.reading = None;
                if !st.started {
                    // The first report is the record as it stands, whatever it is.
                    st.started = true;
                    if let Ok(r) = &out {
                        st.last = key(r);
                        return Poll::Ready(Some(out));
                    }
                }
                out
            } else if !st.started {
                this.reading = Some(Box::pin(st.reread()));
                continue;
            } else {
                match st.events.as_mut().poll_next(cx) {
                    Poll::Pending => return Poll::Pending,
                    Poll::Ready(None) => {
                        this.state = None;
                        return Poll::Ready(None);
                    }
                    // A notification that waited behind a newer read is stale: revisions
                    // of an election only grow.
                    Poll::Ready(Some(Some(Some(rec)))) if st.last.as_ref().is_some_and(|k| rec.revision < k.2) => {
                        continue;
                    }
                    Poll::Ready(Some(Some(carried))) => Ok(carried),
                    Poll::Ready(Some(None)) => {
                        this.reading = Some(Box::pin(st.reread()));
                        continue;
                    }
                }
            };
            match now {
                Ok(rec) if key(&rec) == st.last => {}
                Ok(rec) => {
                    st.last = key(&rec);
                    return Poll::Ready(Some(Ok(rec)));
                }
                // Reported once; the stream ends.
                Err(e) => {
                    this.state = None;
                    return Poll::Ready(Some(Err(e)));
                }
            }
        }
    }
}

/// What a change notification says about its election.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Carries {
    /// The record as it now stands: watchers need no read.
    Record(LeaseRecord),
    /// The election has no live lease (released, evicted at once, expired).
    NoLease,
    /// Only *that* it changed: watchers read the record again.
    ReadAgain,
}

/// What a store's change listener saw.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Change {
    /// Anything may have changed (the listener has just connected, or reconnected and may
    /// have missed notifications): every watcher reads again.
    Everything,
    /// One election changed.
    Election {
        /// The election's name.
        name: Arc<str>,
        /// What the notification carried.
        carries: Carries,
    },
}

impl Change {
    /// A change that carries `record`, the election as it now stands.
    pub fn record(record: LeaseRecord) -> Self {
        Change::Election { name: Arc::from(record.election.as_str()), carries: Carries::Record(record) }
    }

    /// A change of `election` that carries its record as it now stands, or that it has none.
    pub fn now(election: &str, record: Option<LeaseRecord>) -> Self {
        let carries = record.map_or(Carries::NoLease, Carries::Record);
        Change::Election { name: Arc::from(election), carries }
    }

    /// A change of `election` whose watchers must read it again.
    pub fn read_again(election: &str) -> Self {
        Change::Election { name: Arc::from(election), carries: Carries::ReadAgain }
    }

    /// Reads a change from a notification's text, the form the PostgreSQL and Redis stores
    /// publish: `ELECTION` alone (the name only: watchers re-read), `ELECTION<TAB>` (no live
    /// lease), or the record, tab separated: election, holder, token, revision, ttl_ms,
    /// remaining_us, evicted (0/1), acquired_ms, renewed_ms (each may be empty), metadata in
    /// hex. A record that cannot be read is treated as the name only, so it is re-read; a
    /// text without a name as [`Change::Everything`].
    pub fn parse(payload: &str) -> Self {
        use crate::record::{FencingToken, Revision};
        use crate::{HolderId, name::ElectionName};
        use std::time::UNIX_EPOCH;
        let fields: Vec<&str> = payload.split('\t').collect();
        // No name (an empty or unreadable message): anything may have changed.
        if fields[0].is_empty() {
            return Change::Everything;
        }
        let carries = match fields.as_slice() {
            [_] => None,
            [_, ""] => Some(None),
            [election, holder, token, revision, ttl_ms, remaining_us, evicted, acquired, renewed, metadata] => (|| {
                let ms = |v: &str| -> Option<Option<std::time::SystemTime>> {
                    if v.is_empty() {
                        Some(None)
                    } else {
                        Some(Some(UNIX_EPOCH + Duration::from_millis(v.parse().ok()?)))
                    }
                };
                let hex = |h: &str| -> Option<Vec<u8>> {
                    (0..h.len()).step_by(2).map(|i| u8::from_str_radix(h.get(i..i + 2)?, 16).ok()).collect()
                };
                Some(Some(LeaseRecord {
                    election: ElectionName::new(election).ok()?,
                    holder: HolderId::new(holder).ok()?,
                    token: FencingToken(token.parse().ok()?),
                    revision: Revision(revision.parse().ok()?),
                    ttl: Duration::from_millis(ttl_ms.parse().ok()?),
                    acquired_at: ms(acquired)?,
                    renewed_at: ms(renewed)?,
                    remaining: Some(Duration::from_micros(remaining_us.parse().ok()?)),
                    evicted: *evicted == "1",
                    metadata: hex(metadata)?,
                }))
            })(
            ),
            _ => None,
        };
        let carries = match carries {
            Some(Some(r)) => Carries::Record(r),
            Some(None) => Carries::NoLease,
            None => Carries::ReadAgain,
        };
        Change::Election { name: Arc::from(fields[0]), carries }
    }
}

/// A store's source of change notifications, opened by the function given to
/// [`ChangeHub::listen`]: a subscription, a watch, a `LISTEN` connection.
#[async_trait::async_trait]
pub trait ChangeFeed: Send {
    /// The next change. `None` when the feed has ended or failed: the listener then opens
    /// a new one (and tells every watcher to read again).
    async fn next(&mut self) -> Option<Change>;

    /// Whether the feed's connection still answers, asked after 5 s without a change (and
    /// given 2 s): a feed on a connection left half-open (a server host that vanished, no
    /// reset) yields nothing and never fails, so its watchers would not hear of releases.
    /// On `false` the listener opens a new feed. The default takes the feed's word.
    async fn answers(&mut self) -> bool {
        true
    }
}

/// Routes a store's change notifications to the watchers of the election each concerns.
///
/// A store with one listener for all elections (a prefix watch, a `LISTEN` channel, a
/// pub/sub subscription) publishes every [`Change`] here; [`watch_changes`] subscribes one
/// watcher. A change wakes only the watchers of its election, so a process that leads
/// 10,000 elections, each watched for eviction, pays one wake-up per change rather than
/// 10,000. Each watcher keeps only the latest notification: one that falls behind skips
/// to the newest state instead of queueing stale ones (a watch reports the record as it
/// now stands, so nothing is lost).
#[derive(Clone, Default)]
pub struct ChangeHub {
    routes: Arc<Mutex<Routes>>,
    /// Whether [`ChangeHub::listen`] has started its listener.
    listening: Arc<AtomicBool>,
}

/// The watchers of each election, by name; each holds the newest notification.
type Routes = HashMap<Arc<str>, Vec<std::sync::Weak<Slot>>>;

/// One watcher's mailbox: the newest notification it has not taken yet (a newer one
/// replaces it), and the waker of the watcher waiting for one. A lock and a waker rather
/// than a channel: a process may watch thousands of elections, and a channel keeps far
/// more per receiver than this.
#[derive(Default)]
struct Slot {
    state: Mutex<SlotState>,
}

#[derive(Default)]
struct SlotState {
    /// `Some(None)`: read the election again; `Some(Some(event))`: the election as it now stands.
    newest: Option<Option<WatchEvent>>,
    waker: Option<std::task::Waker>,
}

impl Slot {
    fn lock(&self) -> std::sync::MutexGuard<'_, SlotState> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Leaves `what` for the watcher, in place of what it has not taken yet.
    fn put(&self, what: Option<WatchEvent>) {
        let waker = {
            let mut s = self.lock();
            s.newest = Some(what);
            s.waker.take()
        };
        if let Some(w) = waker {
            w.wake();
        }
    }
}

/// The watcher's end of a [`Slot`]: yields each notification it finds there, the newest
/// first (older ones it missed are gone, as they are stale). It never ends on its own.
struct SlotStream(Arc<Slot>);

impl Stream for SlotStream {
    type Item = Option<WatchEvent>;

    fn poll_next(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Self::Item>> {
        let mut s = self.0.lock();
        match s.newest.take() {
            Some(what) => std::task::Poll::Ready(Some(what)),
            None => {
                if !s.waker.as_ref().is_some_and(|w| w.will_wake(cx.waker())) {
                    s.waker = Some(cx.waker().clone());
                }
                std::task::Poll::Pending
            }
        }
    }
}

impl std::fmt::Debug for ChangeHub {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ChangeHub").field("elections", &self.lock().len()).finish()
    }
}

impl ChangeHub {
    /// A hub with no watchers.
    pub fn new() -> Self {
        Self::default()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Routes> {
        self.routes.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Tells the watchers of the election that changed, or every watcher. Watchers that
    /// have gone are dropped on the way.
    pub fn publish(&self, change: Change) {
        let mut routes = self.lock();
        let tell = |senders: &mut Vec<std::sync::Weak<Slot>>, what: &Option<WatchEvent>| {
            senders.retain(|s| match s.upgrade() {
                Some(slot) => {
                    slot.put(what.clone());
                    true
                }
                None => false,
            });
            !senders.is_empty()
        };
        match change {
            Change::Everything => routes.retain(|_, senders| tell(senders, &None)),
            Change::Election { name, carries } => {
                let what = match carries {
                    Carries::Record(r) => Some(Some(r)),
                    Carries::NoLease => Some(None),
                    Carries::ReadAgain => None,
                };
                if let Some(senders) = routes.get_mut(&name)
                    && !tell(senders, &what)
                {
                    routes.remove(&name);
                }
            }
        }
    }

    /// Starts, once per hub, the listener that feeds it: it opens a feed with `open`,
    /// publishes [`Change::Everything`] whenever a feed has just opened (notifications may
    /// have been missed before), publishes every change the feed yields, and opens a new
    /// feed when one ends or stops answering ([`ChangeFeed::answers`]), backing off from
    /// 100 ms to 2 s while opening fails. It holds `store` weakly and stops within 7 s of
    /// the store's last handle being dropped, so neither `open`'s result nor the feed may
    /// keep a strong handle on the store.
    pub fn listen<S, F, Fut>(&self, store: &Arc<S>, open: F)
    where
        S: Send + Sync + 'static,
        F: Fn(Arc<S>) -> Fut + Send + 'static,
        Fut: Future<Output = Option<Box<dyn ChangeFeed>>> + Send + 'static,
    {
        if self.listening.swap(true, Ordering::SeqCst) {
            return;
        }
        let weak = Arc::downgrade(store);
        let hub = self.clone();
        tokio::spawn(async move {
            let mut backoff = Duration::from_millis(100);
            loop {
                let Some(store) = weak.upgrade() else { return };
                let Some(mut feed) = open(store).await else {
                    tokio::time::sleep(backoff).await;
                    backoff = (backoff * 2).min(Duration::from_secs(2));
                    continue;
                };
                backoff = Duration::from_millis(100);
                hub.publish(Change::Everything);
                loop {
                    // Quiet feeds are looked at every 5 s: is the store still in use?
                    let next = tokio::time::timeout(Duration::from_secs(5), feed.next()).await;
                    if weak.strong_count() == 0 {
                        return;
                    }
                    match next {
                        Ok(Some(change)) => hub.publish(change),
                        Ok(None) => break,
                        Err(_) => {
                            let answers = tokio::time::timeout(Duration::from_secs(2), feed.answers()).await;
                            if !matches!(answers, Ok(true)) {
                                break;
                            }
                        }
                    }
                }
            }
        });
    }

    /// A watch on `election` for a store whose one listener feeds this hub: subscribes a
    /// watcher as [`watch_changes`] does, then starts the listener with
    /// [`listen`](Self::listen)`(shared, open)` if it has not started yet (subscribed
    /// first, the watcher cannot miss the listener's first "read again"). `store` is the
    /// handle the watcher reads through when a change does not carry the record.
    pub fn watch<S, F, Fut>(
        &self,
        store: Arc<dyn crate::LeaseStore>,
        shared: &Arc<S>,
        election: &ElectionName,
        open: F,
    ) -> WatchStream
    where
        S: Send + Sync + 'static,
        F: Fn(Arc<S>) -> Fut + Send + 'static,
        Fut: Future<Output = Option<Box<dyn ChangeFeed>>> + Send + 'static,
    {
        let stream = watch_changes(store, self, election);
        self.listen(shared, open);
        stream
    }

    /// Whether `election` has a watcher (one may have gone since the last change). A feed
    /// that must read a record to report it can pass by the elections nobody watches: a
    /// watcher that subscribes later starts with the record as it stands.
    pub fn is_watched(&self, election: &str) -> bool {
        self.lock().contains_key(election)
    }

    /// How many elections have a watcher (some may have gone since the last change).
    pub fn watched(&self) -> usize {
        self.lock().len()
    }

    /// Forgets the watchers that have gone and returns how many elections still have
    /// one: a store's listener can stop when this is 0.
    pub fn prune(&self) -> usize {
        let mut routes = self.lock();
        routes.retain(|_, senders| {
            senders.retain(|s| s.strong_count() > 0);
            !senders.is_empty()
        });
        routes.len()
    }

    fn subscribe(&self, election: &ElectionName) -> SlotStream {
        let slot = Arc::new(Slot::default());
        let mut routes = self.lock();
        let senders = routes.entry(Arc::from(election.as_str())).or_default();
        senders.retain(|s| s.strong_count() > 0);
        senders.push(Arc::downgrade(&slot));
        SlotStream(slot)
    }
}

/// A [`WatchStream`] for `election` fed by a store's [`ChangeHub`]: it starts with the
/// record as it stands (one read), then a change that carries the record is reported
/// without a read (so a follower costs the store nothing while the leader renews); one
/// that does not makes it re-read through `store`. Reports only changes of holder, token,
/// revision or eviction.
pub fn watch_changes(store: Arc<dyn crate::LeaseStore>, hub: &ChangeHub, election: &ElectionName) -> WatchStream {
    let events = hub.subscribe(election);
    let read = move |e: ElectionName| {
        let store = store.clone();
        async move { store.get(&e).await }
    };
    watch_loop(election.clone(), events, read, Duration::from_millis(100))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::record::{FencingToken, LeaseRecord, Revision};
    use crate::{HolderId, MemoryStore};
    use tokio_stream::StreamExt;

    fn record(election: &str, revision: u64) -> LeaseRecord {
        LeaseRecord {
            election: ElectionName::new(election).unwrap(),
            holder: HolderId::new("h").unwrap(),
            token: FencingToken(1),
            revision: Revision(revision),
            ttl: Duration::from_secs(10),
            acquired_at: None,
            renewed_at: None,
            remaining: Some(Duration::from_secs(10)),
            evicted: false,
            metadata: Vec::new(),
        }
    }

    fn change(election: &str, revision: u64) -> Change {
        Change::record(record(election, revision))
    }

    /// The first report of a watch: the record as it stands.
    async fn first(w: &mut WatchStream) -> Option<LeaseRecord> {
        tokio::time::timeout(Duration::from_secs(1), w.next()).await.unwrap().unwrap().unwrap()
    }

    #[tokio::test(start_paused = true)]
    async fn a_read_under_way_goes_on_while_the_watcher_is_busy_elsewhere() {
        // The store has one connection: a read holds it while it runs.
        let conn = Arc::new(tokio::sync::Semaphore::new(1));
        let c = conn.clone();
        let read = move |_e: ElectionName| {
            let c = c.clone();
            async move {
                let _held = c.acquire_owned().await.unwrap();
                tokio::time::sleep(Duration::from_millis(10)).await;
                Ok(None)
            }
        };
        let events = tokio_stream::pending::<Option<WatchEvent>>();
        let mut w = watch_loop(ElectionName::new("a").unwrap(), events, read, Duration::from_millis(100));
        // The watcher starts the first read, then turns to something else (its renewal),
        // which needs the connection.
        assert!(tokio::time::timeout(Duration::from_millis(1), w.next()).await.is_err());
        let renewal = tokio::time::timeout(Duration::from_secs(1), conn.acquire()).await;
        assert!(renewal.is_ok(), "the paused read kept the connection from the watcher's own renewal");
        drop(renewal);
        assert_eq!(first(&mut w).await, None);
    }

    #[tokio::test(start_paused = true)]
    async fn a_release_between_the_watcher_s_read_and_the_first_poll_is_reported() {
        // A follower subscribes and finds the lease held (its acquire answered Held); its
        // watch is first polled only after the holder has released. The stream must
        // still say "no lease", or the follower sleeps until the old term would expire.
        let store = Arc::new(MemoryStore::new());
        let hub = ChangeHub::new();
        let a = ElectionName::new("a").unwrap();
        let mut wa = watch_changes(store.clone(), &hub, &a);
        let req = crate::store::AcquireRequest::new(a.clone(), HolderId::new("x").unwrap(), Duration::from_secs(5));
        let crate::store::Acquire::Acquired(held) = crate::LeaseStore::try_acquire(store.as_ref(), &req).await.unwrap()
        else {
            panic!("not acquired")
        };
        crate::LeaseStore::release(store.as_ref(), &held).await.unwrap();
        hub.publish(Change::now("a", None));
        assert_eq!(first(&mut wa).await, None, "the first report is the record as it stands");
    }

    #[tokio::test(start_paused = true)]
    async fn a_change_reaches_only_the_watchers_of_its_election() {
        let store: Arc<dyn crate::LeaseStore> = Arc::new(MemoryStore::new());
        let hub = ChangeHub::new();
        let a = ElectionName::new("a").unwrap();
        let b = ElectionName::new("b").unwrap();
        let mut wa = watch_changes(store.clone(), &hub, &a);
        let mut wb = watch_changes(store.clone(), &hub, &b);
        assert_eq!(hub.watched(), 2);
        // Both start with the (empty) election as it stands.
        assert_eq!(first(&mut wa).await, None);
        assert_eq!(first(&mut wb).await, None);
        hub.publish(change("a", 1));
        let got = tokio::time::timeout(Duration::from_secs(1), wa.next()).await.unwrap().unwrap().unwrap();
        assert_eq!(got.unwrap().revision, Revision(1));
        assert!(tokio::time::timeout(Duration::from_secs(1), wb.next()).await.is_err(), "b heard a's change");
        // Many changes before a watcher looks: it reports the newest, once.
        for r in 2..50 {
            hub.publish(change("a", r));
        }
        let got = tokio::time::timeout(Duration::from_secs(1), wa.next()).await.unwrap().unwrap().unwrap();
        assert_eq!(got.unwrap().revision, Revision(49));
        assert!(tokio::time::timeout(Duration::from_secs(1), wa.next()).await.is_err());
        // A dropped watcher is forgotten at the next change of its election, or by prune.
        drop(wb);
        tokio::time::sleep(Duration::from_millis(1)).await;
        assert_eq!(hub.watched(), 2);
        assert_eq!(hub.prune(), 1);
        let _wb = watch_changes(store.clone(), &hub, &b);
        assert_eq!(hub.watched(), 2);
        drop(_wb);
        tokio::time::sleep(Duration::from_millis(1)).await;
        hub.publish(change("b", 1));
        assert_eq!(hub.watched(), 1);
    }

    #[test]
    fn notifications_carry_the_record_or_ask_for_a_read() {
        use std::time::UNIX_EPOCH;
        let c =
            Change::parse("billing/nightly\tweb-1.42.ab\t7\t31\t10000\t9998000\t0\t1700000000000\t1700000005000\t6869");
        let Change::Election { name, carries: Carries::Record(r) } = c else { panic!("{c:?}") };
        assert_eq!(&*name, "billing/nightly");
        assert_eq!((r.holder.as_str(), r.token, r.revision), ("web-1.42.ab", FencingToken(7), Revision(31)));
        assert_eq!((r.ttl, r.remaining), (Duration::from_secs(10), Some(Duration::from_micros(9_998_000))));
        assert_eq!(r.metadata, b"hi");
        assert_eq!(r.acquired_at, Some(UNIX_EPOCH + Duration::from_millis(1_700_000_000_000)));
        assert!(!r.evicted);
        // No live lease; the name only (an older trigger); something unreadable.
        assert_eq!(Change::parse("a\t"), Change::now("a", None));
        assert_eq!(Change::parse("a"), Change::read_again("a"));
        assert_eq!(Change::parse(""), Change::Everything, "a message without a name wakes every watcher");
        assert_eq!(Change::parse("a\tb\tnot-a-number\t1\t1\t1\t0\t\t\t"), Change::read_again("a"));
        assert_eq!(Change::parse("a\tb\t1\t1\t1\t1\t0\t\t\tzz"), Change::read_again("a"), "bad hex");
    }

    #[tokio::test(start_paused = true)]
    async fn a_carried_record_older_than_the_last_report_is_skipped() {
        let store: Arc<dyn crate::LeaseStore> = Arc::new(MemoryStore::new());
        let hub = ChangeHub::new();
        let a = ElectionName::new("a").unwrap();
        let mut wa = watch_changes(store, &hub, &a);
        assert_eq!(first(&mut wa).await, None);
        hub.publish(change("a", 10));
        let got = tokio::time::timeout(Duration::from_secs(1), wa.next()).await.unwrap().unwrap().unwrap();
        assert_eq!(got.unwrap().revision, Revision(10));
        hub.publish(change("a", 3));
        assert!(tokio::time::timeout(Duration::from_secs(1), wa.next()).await.is_err(), "went back to revision 3");
        hub.publish(change("a", 11));
        let got = tokio::time::timeout(Duration::from_secs(1), wa.next()).await.unwrap().unwrap().unwrap();
        assert_eq!(got.unwrap().revision, Revision(11));
    }

    #[tokio::test(start_paused = true)]
    async fn an_unnamed_change_makes_every_watcher_re_read() {
        let store = Arc::new(MemoryStore::new());
        let hub = ChangeHub::new();
        let a = ElectionName::new("a").unwrap();
        let mut wa = watch_changes(store.clone(), &hub, &a);
        assert_eq!(first(&mut wa).await, None);
        // The store changes without a notification; a reconnect says "anything may have".
        let req = crate::store::AcquireRequest::new(a.clone(), HolderId::new("x").unwrap(), Duration::from_secs(5));
        crate::LeaseStore::try_acquire(store.as_ref(), &req).await.unwrap();
        hub.publish(Change::Everything);
        let got = tokio::time::timeout(Duration::from_secs(1), wa.next()).await.unwrap().unwrap().unwrap();
        assert_eq!(got.unwrap().holder.as_str(), "x");
    }
}
