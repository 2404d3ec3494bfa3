//! An in-memory [`LeaseStore`] for one process: tests, examples, simulations.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, SystemTime};

use tokio::sync::broadcast;
use tokio_stream::StreamExt;
use tokio_stream::wrappers::BroadcastStream;
use tokio_stream::wrappers::errors::BroadcastStreamRecvError;

use crate::clock::{Clock, Instant, TokioClock};
use crate::name::{ElectionName, WorkKey};
use crate::record::{Acquire, AcquireRequest, Evict, FencingToken, LeaseRecord, Renew, Revision, check_ttl};
use crate::store::{LeaseStore, LedgerEntry, LedgerWrite, StoreError, WatchStream, check_ledger_value};

/// A lease store in this process's memory. Expiry is judged by its [`Clock`].
///
/// Cloning gives another handle on the same store.
#[derive(Clone)]
pub struct MemoryStore {
    inner: Arc<Inner>,
}

struct Inner {
    clock: Arc<dyn Clock>,
    elections: Mutex<BTreeMap<ElectionName, Slot>>,
    /// The work ledger: each entry with its version and the instant it may be let go.
    ledger: Mutex<Ledger>,
}

#[derive(Default)]
struct Ledger {
    entries: BTreeMap<(ElectionName, WorkKey), (Vec<u8>, u64, Instant)>,
    /// The last version given; versions are never given twice.
    version: u64,
}

struct Slot {
    /// The current grant, if any (possibly expired: judged on read).
    current: Option<(LeaseRecord, Instant)>,
    last_token: u64,
    revision: u64,
    /// A broadcast rather than a watch channel: its waiters wake in a fixed order, which
    /// keeps simulations deterministic.
    changes: broadcast::Sender<Option<LeaseRecord>>,
}

impl Default for MemoryStore {
    fn default() -> Self {
        Self::new()
    }
}

impl MemoryStore {
    /// A store judging expiry on tokio's clock.
    pub fn new() -> Self {
        Self::with_clock(Arc::new(TokioClock))
    }

    /// A store judging expiry on `clock`.
    pub fn with_clock(clock: Arc<dyn Clock>) -> Self {
        Self { inner: Arc::new(Inner { clock, elections: Mutex::new(BTreeMap::new()), ledger: Mutex::default() }) }
    }

    fn lock(&self) -> MutexGuard<'_, BTreeMap<ElectionName, Slot>> {
        // A poisoned lock only means another thread panicked mid-test; the map stays consistent
        // because every update below is a single assignment.
        self.inner.elections.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn slot<'a>(map: &'a mut BTreeMap<ElectionName, Slot>, election: &ElectionName) -> &'a mut Slot {
        map.entry(election.clone()).or_insert_with(|| Slot {
            current: None,
            last_token: 0,
            revision: 0,
            changes: broadcast::channel(8).0,
        })
    }
}

impl Slot {
    /// The live record, with `remaining` filled in, dropping an expired one.
    fn live(&mut self, now: Instant) -> Option<LeaseRecord> {
        match &self.current {
            Some((rec, expires)) if *expires > now => {
                let mut rec = rec.clone();
                rec.remaining = Some(*expires - now);
                Some(rec)
            }
            Some(_) => {
                self.current = None;
                None
            }
            None => None,
        }
    }

    fn write(&mut self, rec: Option<(LeaseRecord, Instant)>, now: Instant) -> Option<LeaseRecord> {
        self.current = rec;
        let live = self.live(now);
        let _ = self.changes.send(live.clone());
        live
    }
}

#[async_trait::async_trait]
impl LeaseStore for MemoryStore {
    async fn try_acquire(&self, req: &AcquireRequest) -> Result<Acquire, StoreError> {
        req.validate()?;
        let now = self.inner.clock.now();
        let wall = SystemTime::now();
        let mut map = self.lock();
        let slot = Self::slot(&mut map, &req.election);
        let rec = match slot.live(now) {
            Some(cur) if cur.holder != req.holder || cur.evicted => return Ok(Acquire::Held(cur)),
            Some(cur) => LeaseRecord { renewed_at: Some(wall), ttl: req.ttl, metadata: req.metadata.clone(), ..cur },
            None => {
                slot.last_token += 1;
                LeaseRecord {
                    election: req.election.clone(),
                    holder: req.holder.clone(),
                    token: FencingToken(slot.last_token),
                    revision: Revision(0),
                    ttl: req.ttl,
                    acquired_at: Some(wall),
                    renewed_at: Some(wall),
                    remaining: None,
                    evicted: false,
                    metadata: req.metadata.clone(),
                }
            }
        };
        slot.revision += 1;
        let rec = LeaseRecord { revision: Revision(slot.revision), ..rec };
        let live = slot.write(Some((rec, now + req.ttl)), now);
        Ok(Acquire::Acquired(live.expect("a fresh grant is live")))
    }

    async fn renew(&self, held: &LeaseRecord, ttl: Duration) -> Result<Renew, StoreError> {
        check_ttl(ttl)?;
        let now = self.inner.clock.now();
        let mut map = self.lock();
        let slot = Self::slot(&mut map, &held.election);
        match slot.live(now) {
            Some(cur) if cur.holder == held.holder && cur.token == held.token && !cur.evicted => {
                slot.revision += 1;
                let rec =
                    LeaseRecord { revision: Revision(slot.revision), renewed_at: Some(SystemTime::now()), ttl, ..cur };
                let live = slot.write(Some((rec, now + ttl)), now);
                Ok(Renew::Renewed(live.expect("a renewed grant is live")))
            }
            other => Ok(Renew::Lost(other)),
        }
    }

    async fn release(&self, held: &LeaseRecord) -> Result<(), StoreError> {
        let now = self.inner.clock.now();
        let mut map = self.lock();
        let slot = Self::slot(&mut map, &held.election);
        if let Some(cur) = slot.live(now)
            && cur.holder == held.holder
            && cur.token == held.token
            && cur.revision == held.revision
        {
            slot.revision += 1;
            slot.write(None, now);
        }
        Ok(())
    }

    async fn get(&self, election: &ElectionName) -> Result<Option<LeaseRecord>, StoreError> {
        let now = self.inner.clock.now();
        let mut map = self.lock();
        Ok(map.get_mut(election).and_then(|s| s.live(now)))
    }

    async fn list(&self, prefix: &str) -> Result<Vec<LeaseRecord>, StoreError> {
        let now = self.inner.clock.now();
        let mut map = self.lock();
        Ok(map
            .iter_mut()
            .filter(|(name, _)| name.as_str().starts_with(prefix))
            .filter_map(|(_, slot)| slot.live(now))
            .collect())
    }

    async fn evict(&self, election: &ElectionName, how: Evict) -> Result<Option<LeaseRecord>, StoreError> {
        let now = self.inner.clock.now();
        let mut map = self.lock();
        let slot = Self::slot(&mut map, election);
        let Some(cur) = slot.live(now) else {
            return Ok(None);
        };
        let expires = slot.current.as_ref().map(|(_, e)| *e).unwrap_or(now);
        slot.revision += 1;
        match how {
            Evict::Now => {
                slot.write(None, now);
            }
            Evict::AfterTerm => {
                let rec = LeaseRecord { evicted: true, revision: Revision(slot.revision), ..cur.clone() };
                slot.write(Some((rec, expires)), now);
            }
        }
        Ok(Some(cur))
    }

    fn watch(&self, election: &ElectionName) -> Option<WatchStream> {
        let mut map = self.lock();
        let rx = Self::slot(&mut map, election).changes.subscribe();
        let store = self.clone();
        let election = election.clone();
        Some(Box::pin(BroadcastStream::new(rx).map(move |ev| match ev {
            Ok(rec) => Ok(rec),
            // A watcher that fell behind gets the record as it stands now.
            Err(BroadcastStreamRecvError::Lagged(_)) => {
                let now = store.inner.clock.now();
                Ok(store.lock().get_mut(&election).and_then(|s| s.live(now)))
            }
        })))
    }

    fn describe(&self) -> String {
        "memory".to_string()
    }

    async fn ledger_read(&self, election: &ElectionName, key: &WorkKey) -> Result<Option<LedgerEntry>, StoreError> {
        let now = self.inner.clock.now();
        let ledger = self.inner.ledger.lock().unwrap_or_else(|p| p.into_inner());
        Ok(ledger
            .entries
            .get(&(election.clone(), key.clone()))
            .filter(|(_, _, until)| *until > now)
            .map(|(value, version, _)| LedgerEntry { value: value.clone(), version: version.to_string() }))
    }

    async fn ledger_write(
        &self,
        election: &ElectionName,
        key: &WorkKey,
        value: &[u8],
        expected: Option<&str>,
        keep: Duration,
    ) -> Result<LedgerWrite, StoreError> {
        check_ledger_value(value)?;
        let now = self.inner.clock.now();
        let mut ledger = self.inner.ledger.lock().unwrap_or_else(|p| p.into_inner());
        let at = (election.clone(), key.clone());
        let current = ledger.entries.get(&at).filter(|(_, _, until)| *until > now).map(|(_, v, _)| v.to_string());
        if current.as_deref() != expected {
            return Ok(LedgerWrite::Conflict);
        }
        ledger.version += 1;
        let version = ledger.version;
        ledger.entries.insert(at, (value.to_vec(), version, now + keep));
        Ok(LedgerWrite::Written(version.to_string()))
    }
}
