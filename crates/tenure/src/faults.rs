//! A [`LeaseStore`] wrapper that injects failures on command and counts what passes:
//! to test how a service behaves when its store is down, slow, refuses or loses answers,
//! and to measure what an election asks of its store (`tenure bench` counts through it).
//!
//! ```
//! use std::sync::Arc;
//! use tenure::MemoryStore;
//! use tenure::faults::{Fault, FaultyStore};
//!
//! let store = FaultyStore::new(Arc::new(MemoryStore::new()));
//! store.set(Fault::Unavailable); // every request fails as if the store were down
//! # let _ = store;
//! ```

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::store::{Acquire, AcquireRequest, ExpiryJudge, LedgerEntry, LedgerWrite, Renew, StoreError, WatchStream};
use crate::{ElectionName, Evict, LeaseRecord, LeaseStore, WorkKey};

/// Where a [`FaultyStore`] notes how long each renewal took.
pub type RenewalTimes = Arc<Mutex<Vec<Duration>>>;

/// What the wrapped store does with the next requests.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum Fault {
    /// Pass every request through.
    #[default]
    None,
    /// Refuse every request without applying it (a store that is down).
    Unavailable,
    /// Never answer (a store that hangs or a network that black-holes).
    Hang,
    /// Apply the request, then lose the answer: the caller gets an ambiguous error.
    LoseResponse,
    /// Delay every request by this many milliseconds before passing it through.
    Delay(u64),
    /// Refuse every request as unauthorized (a wrong password): no retry can help.
    Refuse,
    /// Panic inside the store call (a buggy store implementation).
    Panic,
}

/// A store operation, to count calls by ([`FaultyStore::calls_of`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Op {
    /// [`LeaseStore::try_acquire`]
    Acquire,
    /// [`LeaseStore::renew`]
    Renew,
    /// [`LeaseStore::renew_many`]
    RenewMany,
    /// [`LeaseStore::release`]
    Release,
    /// [`LeaseStore::release_many`]
    ReleaseMany,
    /// [`LeaseStore::get`]
    Get,
    /// [`LeaseStore::list`]
    List,
    /// [`LeaseStore::evict`]
    Evict,
    /// [`LeaseStore::ledger_read`]
    LedgerRead,
    /// [`LeaseStore::ledger_write`]
    LedgerWrite,
}

impl Op {
    /// The operation's name in errors.
    fn name(self) -> &'static str {
        match self {
            Op::Acquire => "acquire",
            Op::Renew => "renew",
            Op::RenewMany => "renew_many",
            Op::Release => "release",
            Op::ReleaseMany => "release_many",
            Op::Get => "get",
            Op::List => "list",
            Op::Evict => "evict",
            Op::LedgerRead => "ledger_read",
            Op::LedgerWrite => "ledger_write",
        }
    }
}

/// Wraps a store and injects the [`Fault`] currently set. Counts the calls it sees (a
/// [`renew_many`](LeaseStore::renew_many) or a [`release_many`](LeaseStore::release_many)
/// is one) and the watch events it passes on.
/// Clones share the fault and the counts.
#[derive(Clone)]
pub struct FaultyStore {
    inner: Arc<dyn LeaseStore>,
    fault: Arc<Mutex<Fault>>,
    calls: Arc<AtomicU64>,
    /// Calls by operation, indexed by `Op as usize`.
    by_op: Arc<[AtomicU64; 10]>,
    watch_events: Arc<AtomicU64>,
    watchable: bool,
    /// Whether records read through it say how long they have left ([`LeaseRecord::remaining`]).
    tells_remaining: bool,
    /// Watch events are held until then, and delivered late ([`FaultyStore::hold_watch_until`]).
    watch_held_until: Arc<Mutex<Option<tokio::time::Instant>>>,
    renewal_times: Option<RenewalTimes>,
    /// The operations the fault applies to; every one if `None`.
    only: Option<Arc<[Op]>>,
}

impl FaultyStore {
    /// Wraps `inner`, passing everything through at first.
    pub fn new(inner: Arc<dyn LeaseStore>) -> Self {
        Self {
            inner,
            fault: Arc::default(),
            calls: Arc::default(),
            by_op: Arc::default(),
            watch_events: Arc::default(),
            watchable: true,
            tells_remaining: true,
            watch_held_until: Arc::default(),
            renewal_times: None,
            only: None,
        }
    }

    /// Applies the fault to `ops` only; every other operation passes through (say, a
    /// candidate whose acquires fail while its renewals go through).
    pub fn only(mut self, ops: &[Op]) -> Self {
        self.only = Some(ops.into());
        self
    }

    /// Notes how long each [`renew`](LeaseStore::renew) through this wrapper took in
    /// `times` (which many wrappers may share).
    pub fn timing_renewals(mut self, times: RenewalTimes) -> Self {
        self.renewal_times = Some(times);
        self
    }

    /// Hides the inner store's watch, so the runtime must poll.
    pub fn without_watch(mut self) -> Self {
        self.watchable = false;
        self
    }

    /// Leaves out how long a record has left ([`LeaseRecord::remaining`]) from every record
    /// read through it, as a store does that cannot tell (an Azure blob lease): a reader
    /// learns that a lease ended only by asking again.
    pub fn without_remaining(mut self) -> Self {
        self.tells_remaining = false;
        self
    }

    /// The record as this wrapper passes it on.
    fn told(&self, rec: LeaseRecord) -> LeaseRecord {
        if self.tells_remaining { rec } else { LeaseRecord { remaining: None, ..rec } }
    }

    /// Holds the watch events that come before `until` and delivers them then, late and
    /// in order (a watch stream that catches up after a partition).
    pub fn hold_watch_until(&self, until: tokio::time::Instant) {
        *self.watch_held_until.lock().unwrap_or_else(|p| p.into_inner()) = Some(until);
    }

    /// Sets the fault for the following requests.
    pub fn set(&self, fault: Fault) {
        *self.fault.lock().unwrap_or_else(|p| p.into_inner()) = fault;
    }

    /// How many store calls (not watches) went through this wrapper.
    pub fn calls(&self) -> u64 {
        self.calls.load(Ordering::SeqCst)
    }

    /// How many calls of `op` went through this wrapper.
    pub fn calls_of(&self, op: Op) -> u64 {
        self.by_op[op as usize].load(Ordering::SeqCst)
    }

    /// The calls and watch events counted since the last time, counting again from 0.
    pub fn take_counts(&self) -> (u64, u64) {
        (self.calls.swap(0, Ordering::SeqCst), self.watch_events.swap(0, Ordering::SeqCst))
    }

    async fn run<T>(
        &self,
        op: Op,
        f: impl std::future::Future<Output = Result<T, StoreError>>,
    ) -> Result<T, StoreError> {
        self.calls.fetch_add(1, Ordering::SeqCst);
        self.by_op[op as usize].fetch_add(1, Ordering::SeqCst);
        let what = op.name();
        let fault = match &self.only {
            Some(ops) if !ops.contains(&op) => Fault::None,
            _ => *self.fault.lock().unwrap_or_else(|p| p.into_inner()),
        };
        match fault {
            Fault::None => f.await,
            Fault::Unavailable => Err(StoreError::unavailable(format!("{what}: injected outage"))),
            Fault::Hang => std::future::pending().await,
            Fault::LoseResponse => {
                let _ = f.await;
                Err(StoreError::ambiguous(format!("{what}: injected lost response")))
            }
            Fault::Refuse => Err(StoreError::new(crate::ErrorKind::Unauthorized, format!("{what}: injected refusal"))),
            Fault::Panic => panic!("{what}: injected panic"),
            Fault::Delay(ms) => {
                tokio::time::sleep(Duration::from_millis(ms)).await;
                f.await
            }
        }
    }
}

#[async_trait::async_trait]
impl LeaseStore for FaultyStore {
    async fn try_acquire(&self, req: &AcquireRequest) -> Result<Acquire, StoreError> {
        Ok(match self.run(Op::Acquire, self.inner.try_acquire(req)).await? {
            Acquire::Held(cur) => Acquire::Held(self.told(cur)),
            won => won,
        })
    }
    async fn renew(&self, held: &LeaseRecord, ttl: Duration) -> Result<Renew, StoreError> {
        let t0 = std::time::Instant::now();
        let r = self.run(Op::Renew, self.inner.renew(held, ttl)).await;
        if let Some(times) = &self.renewal_times {
            times.lock().unwrap_or_else(|p| p.into_inner()).push(t0.elapsed());
        }
        r
    }
    async fn renew_many(&self, held: &[LeaseRecord], ttl: Duration) -> Vec<Result<Renew, StoreError>> {
        match self.run(Op::RenewMany, async { Ok(self.inner.renew_many(held, ttl).await) }).await {
            Ok(answers) => answers,
            Err(e) => held.iter().map(|_| Err(e.duplicate())).collect(),
        }
    }
    async fn release(&self, held: &LeaseRecord) -> Result<(), StoreError> {
        self.run(Op::Release, self.inner.release(held)).await
    }
    async fn release_many(&self, held: &[LeaseRecord]) -> Vec<Result<(), StoreError>> {
        match self.run(Op::ReleaseMany, async { Ok(self.inner.release_many(held).await) }).await {
            Ok(answers) => answers,
            Err(e) => held.iter().map(|_| Err(e.duplicate())).collect(),
        }
    }
    async fn get(&self, election: &ElectionName) -> Result<Option<LeaseRecord>, StoreError> {
        Ok(self.run(Op::Get, self.inner.get(election)).await?.map(|r| self.told(r)))
    }
    async fn list(&self, prefix: &str) -> Result<Vec<LeaseRecord>, StoreError> {
        Ok(self.run(Op::List, self.inner.list(prefix)).await?.into_iter().map(|r| self.told(r)).collect())
    }
    async fn evict(&self, election: &ElectionName, how: Evict) -> Result<Option<LeaseRecord>, StoreError> {
        self.run(Op::Evict, self.inner.evict(election, how)).await
    }
    fn watch(&self, election: &ElectionName) -> Option<WatchStream> {
        use tokio_stream::StreamExt;
        if !self.watchable {
            return None;
        }
        let events = self.watch_events.clone();
        let held = self.watch_held_until.clone();
        Some(Box::pin(self.inner.watch(election)?.then(move |ev| {
            events.fetch_add(1, Ordering::SeqCst);
            let until = *held.lock().unwrap_or_else(|p| p.into_inner());
            // Boxed, once per event: the stream keeps only a pointer between events, so a
            // process watching thousands of elections through this wrapper (the bench's
            // probe) is not measured as the runtime's memory.
            let next: Pin<Box<dyn Future<Output = _> + Send>> = Box::pin(async move {
                if let Some(until) = until {
                    tokio::time::sleep_until(until).await;
                }
                ev
            });
            next
        })))
    }
    fn expiry(&self) -> ExpiryJudge {
        self.inner.expiry()
    }
    fn renewal_grid(&self) -> Option<crate::Instant> {
        self.inner.renewal_grid()
    }
    fn watch_reports_expiry(&self) -> bool {
        self.inner.watch_reports_expiry()
    }
    fn describe(&self) -> String {
        format!("faulty({})", self.inner.describe())
    }
    async fn ledger_read(&self, election: &ElectionName, key: &WorkKey) -> Result<Option<LedgerEntry>, StoreError> {
        self.run(Op::LedgerRead, self.inner.ledger_read(election, key)).await
    }
    async fn ledger_write(
        &self,
        election: &ElectionName,
        key: &WorkKey,
        value: &[u8],
        expected: Option<&str>,
        keep: Duration,
    ) -> Result<LedgerWrite, StoreError> {
        self.run(Op::LedgerWrite, self.inner.ledger_write(election, key, value, expected, keep)).await
    }
}
