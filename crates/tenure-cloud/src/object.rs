//! The lease logic shared by the stores that can only compare versions (S3, GCS,
//! DynamoDB): one object per election, written only conditionally on the version read,
//! never deleted (so the token survives), with expiry judged by the observer.

use std::time::{Duration, UNIX_EPOCH};

use serde::{Deserialize, Serialize};
use tenure::store::{
    Acquire, AcquireRequest, ExpiryJudge, Judgement, LedgerEntry, LedgerWrite, ObservedExpiry, Renew, Revision,
    check_ledger_value, check_ttl,
};
use tenure::{ElectionName, ErrorKind, Evict, FencingToken, HolderId, LeaseRecord, LeaseStore, StoreError, WorkKey};

use crate::http::{hex, unhex, wall_ms};

/// How many conditional writes one call tries before it gives up on a busy election.
const MAX_TRIES: usize = 6;

/// One version of an object: the service's version tag and the content.
#[derive(Clone, Debug)]
pub struct Stored {
    /// What a conditional write compares: an ETag, a generation, a version number.
    pub version: String,
    /// The object's content.
    pub body: Vec<u8>,
}

/// A service that keeps objects and writes them only if they are still at the version
/// the writer read: the part of S3, GCS and DynamoDB the observed-expiry store needs.
#[async_trait::async_trait]
pub trait Objects: Send + Sync + 'static {
    /// The object at `key`, or `None` if there is none. A strongly consistent read.
    async fn read(&self, key: &str) -> Result<Option<Stored>, StoreError>;

    /// Writes `body` at `key` if the object is still at version `at` (`None`: only if no
    /// object exists). `rev` is the record revision the body carries, for services
    /// that version items by a number. Answers the new version, or `None` if the
    /// condition failed.
    async fn write(&self, key: &str, at: Option<&str>, rev: u64, body: &[u8]) -> Result<Option<String>, StoreError>;

    /// Every object whose key starts with `prefix`, with its key (see `read_each` for
    /// services whose listing gives keys only).
    async fn list(&self, prefix: &str) -> Result<Vec<(String, Stored)>, StoreError>;

    /// A short description without credentials, e.g. `s3://bucket/prefix`.
    fn describe(&self) -> String;
}

/// Reads each of `keys`, for services whose listing gives keys only; an object deleted
/// since the listing is skipped.
pub(crate) async fn read_each<O: Objects + ?Sized>(
    objects: &O,
    keys: Vec<String>,
) -> Result<Vec<(String, Stored)>, StoreError> {
    let mut out = Vec::with_capacity(keys.len());
    for key in keys {
        if let Some(s) = objects.read(&key).await? {
            out.push((key, s));
        }
    }
    Ok(out)
}

/// A lease record as an object holds it (JSON). `holder: None` is an election nobody
/// holds, kept so that the token survives.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
pub(crate) struct Body {
    pub tenure: u32,
    pub holder: Option<String>,
    pub token: u64,
    pub rev: u64,
    pub ttl_ms: u64,
    #[serde(default)]
    pub evicted: bool,
    #[serde(default)]
    pub acquired_ms: u64,
    #[serde(default)]
    pub renewed_ms: u64,
    #[serde(default)]
    pub metadata: String,
}

impl Body {
    /// The version of the format this build writes.
    const FORMAT: u32 = 1;

    /// An empty election whose next grant gets a token above `token`.
    pub fn vacant(token: u64, rev: u64) -> Self {
        Self {
            tenure: Self::FORMAT,
            holder: None,
            token,
            rev,
            ttl_ms: 0,
            evicted: false,
            acquired_ms: 0,
            renewed_ms: 0,
            metadata: String::new(),
        }
    }

    /// A new grant to `req`.
    pub fn grant(req: &AcquireRequest, token: u64, rev: u64) -> Self {
        let now = wall_ms();
        Self {
            tenure: Self::FORMAT,
            holder: Some(req.holder.as_str().to_string()),
            token,
            rev,
            ttl_ms: req.ttl.as_millis() as u64,
            evicted: false,
            acquired_ms: now,
            renewed_ms: now,
            metadata: hex(&req.metadata),
        }
    }

    /// The same grant, renewed for `ttl` (with new metadata, if given).
    pub fn renewed(&self, ttl: Duration, metadata: Option<&[u8]>) -> Self {
        let mut next = self.clone();
        next.rev += 1;
        next.ttl_ms = ttl.as_millis() as u64;
        next.renewed_ms = wall_ms();
        if let Some(m) = metadata {
            next.metadata = hex(m);
        }
        next
    }

    pub fn parse(key: &str, bytes: &[u8]) -> Result<Self, StoreError> {
        let body: Body = serde_json::from_slice(bytes).map_err(|e| {
            StoreError::new(ErrorKind::Misconfigured, format!("object {key:?} does not hold a tenure lease record"))
                .with_source(e)
        })?;
        if body.tenure != Self::FORMAT {
            return Err(StoreError::new(
                ErrorKind::Misconfigured,
                format!("object {key:?} holds a lease record of format {}; this tenure reads format 1", body.tenure),
            ));
        }
        Ok(body)
    }

    pub fn encode(&self) -> Vec<u8> {
        serde_json::to_vec(self).expect("a lease record serializes")
    }

    pub fn ttl(&self) -> Duration {
        Duration::from_millis(self.ttl_ms)
    }

    /// The record this body describes, if it names a holder.
    pub fn record(
        &self,
        election: &ElectionName,
        remaining: Option<Duration>,
    ) -> Result<Option<LeaseRecord>, StoreError> {
        let Some(holder) = &self.holder else { return Ok(None) };
        let bad = |what: &str| StoreError::new(ErrorKind::Misconfigured, format!("the lease of {election} has {what}"));
        let at = |ms: u64| (ms > 0).then(|| UNIX_EPOCH + Duration::from_millis(ms));
        Ok(Some(LeaseRecord {
            election: election.clone(),
            holder: HolderId::new(holder.clone()).map_err(|_| bad("an invalid holder id"))?,
            token: FencingToken(self.token),
            revision: Revision(self.rev),
            ttl: self.ttl(),
            acquired_at: at(self.acquired_ms),
            renewed_at: at(self.renewed_ms),
            remaining,
            evicted: self.evicted,
            metadata: unhex(&self.metadata).ok_or_else(|| bad("unreadable metadata"))?,
        }))
    }
}

/// A work-ledger entry as an object or blob holds it (JSON): the value (hex), when it may
/// be let go (wall clock, ms: these services have no clock of their own for it), and a
/// write number that grows with every write, for services that version items by a
/// number (DynamoDB). Entries are never deleted: one past its keep reads as absent and
/// is written over conditionally on its version, so versions never come back.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
pub(crate) struct WorkBody {
    pub tenure_work: u32,
    pub rev: u64,
    pub keep_until_ms: u64,
    pub value: String,
}

impl WorkBody {
    const FORMAT: u32 = 1;

    /// The entry written after one at `rev` (0: none), kept `keep` from now.
    pub fn new(rev: u64, keep: Duration, value: &[u8]) -> Self {
        let keep_ms = keep.as_millis().min(u64::MAX as u128) as u64;
        Self {
            tenure_work: Self::FORMAT,
            rev: rev + 1,
            keep_until_ms: wall_ms().saturating_add(keep_ms),
            value: hex(value),
        }
    }

    pub fn parse(key: &str, bytes: &[u8]) -> Result<Self, StoreError> {
        let body: Self = serde_json::from_slice(bytes).map_err(|e| {
            StoreError::new(
                ErrorKind::Misconfigured,
                format!("object {key:?} does not hold a tenure work-ledger entry"),
            )
            .with_source(e)
        })?;
        if body.tenure_work != Self::FORMAT {
            return Err(StoreError::new(
                ErrorKind::Misconfigured,
                format!(
                    "object {key:?} holds a work-ledger entry of format {}; this tenure reads format 1",
                    body.tenure_work
                ),
            ));
        }
        Ok(body)
    }

    pub fn encode(&self) -> Vec<u8> {
        serde_json::to_vec(self).expect("a work-ledger entry serializes")
    }

    /// Whether the entry is still kept.
    pub fn kept(&self) -> bool {
        self.keep_until_ms > wall_ms()
    }

    /// The entry as the store contract hands it out, if it is still kept.
    pub fn entry(&self, key: &str, version: String) -> Result<Option<LedgerEntry>, StoreError> {
        if !self.kept() {
            return Ok(None);
        }
        let value = unhex(&self.value).ok_or_else(|| {
            StoreError::new(ErrorKind::Misconfigured, format!("object {key:?} holds an unreadable work-ledger value"))
        })?;
        Ok(Some(LedgerEntry { value, version }))
    }
}

/// What a conditional write of a work-ledger entry compares, given the entry as it
/// stands (`current`: its version and body) and the version the writer expects: the
/// version to write at (`None`: only if no object exists) and the write number of the
/// body before, or `None` if the entry no longer stands as expected.
pub(crate) fn work_write_at(
    current: Option<(&str, &WorkBody)>,
    expected: Option<&str>,
) -> Option<(Option<String>, u64)> {
    match (current, expected) {
        (None, None) => Some((None, 0)),
        (None, Some(_)) => None,
        // Past its keep: absent to readers, written over at its version.
        (Some((v, b)), None) if !b.kept() => Some((Some(v.to_string()), b.rev)),
        (Some(_), None) => None,
        (Some((v, b)), Some(e)) if v == e => Some((Some(v.to_string()), b.rev)),
        (Some(_), Some(_)) => None,
    }
}

/// The key of a work-ledger entry under `prefix` (which ends with `/` or is empty):
/// `tenure:work/ELECTION/KEY`; `:` is in no election name, so listings pass it by.
pub(crate) fn work_key(prefix: &str, election: &ElectionName, key: &WorkKey) -> String {
    format!("{prefix}tenure:work/{election}/{key}")
}

/// What a handle remembers a sighting by: the service's version, and the term and write
/// the body names. A version alone can come back: DynamoDB numbers an item's writes from 1
/// again after the item is deleted and made anew, and a handle that saw that number long
/// ago (and missed the deletion) would count a new term as seen for as long, and take it
/// over at once.
fn sighting(version: &str, body: &Body) -> String {
    if crate::mutant("sighting-is-version") {
        return version.to_string();
    }
    let holder = body.holder.as_deref().unwrap_or("");
    format!("{version}/{}/{}/{}/{holder}", body.token, body.rev, body.acquired_ms)
}

/// A lease store over [`Objects`], judging expiry as an observer
/// ([`ExpiryJudge::ByObserver`]): see [`ObservedExpiry`].
pub struct ObservedStore<O> {
    objects: O,
    prefix: String,
    seen: ObservedExpiry,
}

impl<O: Objects> ObservedStore<O> {
    /// A store keeping election `E` at key `PREFIX/E` (or `E` with an empty prefix).
    pub fn new(objects: O, prefix: &str, seen: ObservedExpiry) -> Self {
        let prefix = prefix.trim_matches('/');
        let prefix = if prefix.is_empty() { String::new() } else { format!("{prefix}/") };
        Self { objects, prefix, seen }
    }

    fn key(&self, election: &ElectionName) -> String {
        format!("{}{}", self.prefix, election.as_str())
    }

    async fn read(&self, election: &ElectionName) -> Result<Option<(String, Body)>, StoreError> {
        let key = self.key(election);
        match self.objects.read(&key).await? {
            Some(s) => Ok(Some((s.version, Body::parse(&key, &s.body)?))),
            None => {
                // No object (deleted): whatever comes next is new to this handle.
                self.seen.forget(election);
                Ok(None)
            }
        }
    }

    /// The live record in `body` (version `version`), judged by what this handle has seen.
    fn judge(&self, election: &ElectionName, version: &str, body: &Body) -> Result<Option<LeaseRecord>, StoreError> {
        if body.holder.is_none() {
            self.seen.forget(election);
            return Ok(None);
        }
        match self.seen.saw(election, &sighting(version, body), body.ttl()) {
            Judgement::Expired => Ok(None),
            Judgement::Live { remaining } => body.record(election, Some(remaining)),
        }
    }

    async fn write(
        &self,
        election: &ElectionName,
        expected: Option<&str>,
        body: &Body,
    ) -> Result<Option<String>, StoreError> {
        let sent = self.seen.now();
        let version = self.objects.write(&self.key(election), expected, body.rev, &body.encode()).await?;
        if let Some(v) = &version {
            if body.holder.is_some() {
                self.seen.wrote(election, &sighting(v, body), sent);
            } else {
                self.seen.forget(election);
            }
        }
        Ok(version)
    }

    fn busy(election: &ElectionName) -> StoreError {
        StoreError::unavailable(format!(
            "{election}: every conditional write lost to another writer {MAX_TRIES} times in a row; try again"
        ))
    }
}

#[async_trait::async_trait]
impl<O: Objects> LeaseStore for ObservedStore<O> {
    async fn try_acquire(&self, req: &AcquireRequest) -> Result<Acquire, StoreError> {
        req.validate()?;
        let e = &req.election;
        for _ in 0..MAX_TRIES {
            let (expected, next) = match self.read(e).await? {
                None => (None, Body::grant(req, 1, 1)),
                Some((version, body)) => match self.judge(e, &version, &body)? {
                    Some(rec) if rec.holder == req.holder && !rec.evicted => {
                        (Some(version), body.renewed(req.ttl, Some(&req.metadata)))
                    }
                    Some(rec) => return Ok(Acquire::Held(rec)),
                    None => (Some(version), Body::grant(req, body.token + 1, body.rev + 1)),
                },
            };
            if self.write(e, expected.as_deref(), &next).await?.is_some() {
                let rec = next.record(e, Some(req.ttl))?.expect("a grant names its holder");
                return Ok(Acquire::Acquired(rec));
            }
        }
        Err(Self::busy(e))
    }

    async fn renew(&self, held: &LeaseRecord, ttl: Duration) -> Result<Renew, StoreError> {
        check_ttl(ttl)?;
        let e = &held.election;
        for _ in 0..MAX_TRIES {
            let Some((version, body)) = self.read(e).await? else { return Ok(Renew::Lost(None)) };
            let Some(rec) = self.judge(e, &version, &body)? else { return Ok(Renew::Lost(None)) };
            if rec.holder != held.holder || rec.token != held.token || rec.evicted {
                return Ok(Renew::Lost(Some(rec)));
            }
            let next = body.renewed(ttl, None);
            if self.write(e, Some(&version), &next).await?.is_some() {
                return Ok(Renew::Renewed(next.record(e, Some(ttl))?.expect("a renewal names its holder")));
            }
        }
        Err(Self::busy(e))
    }

    async fn release(&self, held: &LeaseRecord) -> Result<(), StoreError> {
        let e = &held.election;
        for _ in 0..MAX_TRIES {
            let Some((version, body)) = self.read(e).await? else { return Ok(()) };
            let ours = body.holder.as_deref() == Some(held.holder.as_str())
                && body.token == held.token.0
                && body.rev == held.revision.0;
            if !ours {
                return Ok(());
            }
            if self.write(e, Some(&version), &Body::vacant(body.token, body.rev + 1)).await?.is_some() {
                return Ok(());
            }
        }
        Err(Self::busy(e))
    }

    async fn get(&self, election: &ElectionName) -> Result<Option<LeaseRecord>, StoreError> {
        match self.read(election).await? {
            Some((version, body)) => self.judge(election, &version, &body),
            None => Ok(None),
        }
    }

    async fn list(&self, prefix: &str) -> Result<Vec<LeaseRecord>, StoreError> {
        let mut out = Vec::new();
        for (key, stored) in self.objects.list(&format!("{}{prefix}", self.prefix)).await? {
            let Some(name) = key.strip_prefix(&self.prefix) else { continue };
            // Objects whose names are not election names are not ours.
            let Ok(election) = ElectionName::new(name) else { continue };
            let body = Body::parse(&key, &stored.body)?;
            if let Some(rec) = self.judge(&election, &stored.version, &body)? {
                out.push(rec);
            }
        }
        out.sort_by(|a, b| a.election.cmp(&b.election));
        Ok(out)
    }

    async fn evict(&self, election: &ElectionName, how: Evict) -> Result<Option<LeaseRecord>, StoreError> {
        for _ in 0..MAX_TRIES {
            let Some((version, body)) = self.read(election).await? else { return Ok(None) };
            let Some(rec) = self.judge(election, &version, &body)? else { return Ok(None) };
            let next = match how {
                Evict::AfterTerm if body.evicted => return Ok(Some(rec)),
                Evict::AfterTerm => Body { evicted: true, rev: body.rev + 1, ..body.clone() },
                Evict::Now => Body::vacant(body.token, body.rev + 1),
            };
            if self.write(election, Some(&version), &next).await?.is_some() {
                return Ok(Some(rec));
            }
        }
        Err(Self::busy(election))
    }

    fn expiry(&self) -> ExpiryJudge {
        ExpiryJudge::ByObserver
    }

    fn describe(&self) -> String {
        self.objects.describe()
    }

    async fn ledger_read(&self, election: &ElectionName, key: &WorkKey) -> Result<Option<LedgerEntry>, StoreError> {
        let k = work_key(&self.prefix, election, key);
        match self.objects.read(&k).await? {
            Some(s) => WorkBody::parse(&k, &s.body)?.entry(&k, s.version),
            None => Ok(None),
        }
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
        let k = work_key(&self.prefix, election, key);
        let stored = self.objects.read(&k).await?;
        let current =
            stored.as_ref().map(|s| WorkBody::parse(&k, &s.body).map(|b| (s.version.clone(), b))).transpose()?;
        let Some((at, rev)) = work_write_at(current.as_ref().map(|(v, b)| (v.as_str(), b)), expected) else {
            return Ok(LedgerWrite::Conflict);
        };
        let body = WorkBody::new(rev, keep, value);
        match self.objects.write(&k, at.as_deref(), body.rev, &body.encode()).await? {
            Some(version) => Ok(LedgerWrite::Written(version)),
            None => Ok(LedgerWrite::Conflict),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;
    use std::sync::{Arc, Mutex};

    /// Objects versioned by the record's revision number, as DynamoDB's items are, in
    /// memory, shared by every handle made on them; `delete` removes one as an operator
    /// (or a lifecycle rule) would.
    #[derive(Clone, Default)]
    struct Numbered(Arc<Mutex<HashMap<String, KeptObject>>>);

    /// One object: its version number and its content.
    type KeptObject = (u64, Vec<u8>);

    impl Numbered {
        fn delete(&self, key: &str) {
            self.0.lock().unwrap().remove(key);
        }
    }

    #[async_trait::async_trait]
    impl Objects for Numbered {
        async fn read(&self, key: &str) -> Result<Option<Stored>, StoreError> {
            let objects = self.0.lock().unwrap();
            Ok(objects.get(key).map(|(v, b)| Stored { version: v.to_string(), body: b.clone() }))
        }
        async fn write(
            &self,
            key: &str,
            at: Option<&str>,
            rev: u64,
            body: &[u8],
        ) -> Result<Option<String>, StoreError> {
            let mut objects = self.0.lock().unwrap();
            if objects.get(key).map(|(v, _)| v.to_string()).as_deref() != at {
                return Ok(None);
            }
            objects.insert(key.to_string(), (rev, body.to_vec()));
            Ok(Some(rev.to_string()))
        }
        async fn list(&self, _: &str) -> Result<Vec<(String, Stored)>, StoreError> {
            Ok(Vec::new())
        }
        fn describe(&self) -> String {
            "numbered objects".into()
        }
    }

    /// A handle saw version 1 of an election a TTL ago and nothing since. Meanwhile the
    /// object was deleted and a new term granted, which a service that numbers versions
    /// numbers 1 again. That handle must count the new term from now, not take it over.
    #[tokio::test(start_paused = true)]
    async fn a_version_number_that_comes_back_after_a_deletion_is_a_new_sighting() {
        let objects = Numbered::default();
        let handle = || ObservedStore::new(objects.clone(), "", ObservedExpiry::new());
        let (holder, observer, newcomer) = (handle(), handle(), handle());
        let e = ElectionName::new("jobs/a").unwrap();
        let ttl = Duration::from_secs(2);
        let req = |h: &str| AcquireRequest::new(e.clone(), HolderId::new(h).unwrap(), ttl);
        assert!(matches!(holder.try_acquire(&req("h")).await.unwrap(), Acquire::Acquired(_)));
        assert!(observer.get(&e).await.unwrap().is_some(), "the observer sees the term");
        tokio::time::advance(ttl * 2).await;
        objects.delete("jobs/a");
        let Acquire::Acquired(granted) = newcomer.try_acquire(&req("n")).await.unwrap() else {
            panic!("the newcomer should be granted the deleted election")
        };
        assert_eq!(granted.revision, Revision(1), "the new term is numbered 1 again");
        match observer.try_acquire(&req("o")).await.unwrap() {
            Acquire::Held(r) => assert_eq!(r.holder.as_str(), "n"),
            Acquire::Acquired(_) => panic!("the observer took over a term granted a moment ago"),
        }
    }

    #[test]
    fn bodies_round_trip_and_foreign_objects_are_refused() {
        let e = ElectionName::new("jobs/a").unwrap();
        let req = AcquireRequest::new(e.clone(), HolderId::new("h1").unwrap(), Duration::from_secs(5))
            .with_metadata(vec![0u8, 255, 10]);
        let b = Body::grant(&req, 7, 3);
        let back = Body::parse("k", &b.encode()).unwrap();
        assert_eq!(back, b);
        let rec = back.record(&e, None).unwrap().unwrap();
        assert_eq!((rec.token, rec.revision, rec.metadata.clone()), (FencingToken(7), Revision(3), vec![0, 255, 10]));
        assert_eq!(rec.acquired_at, Some(UNIX_EPOCH + Duration::from_millis(b.acquired_ms)));
        assert_eq!(Body::vacant(7, 4).record(&e, None).unwrap(), None);
        let err = Body::parse("k", b"hello").unwrap_err();
        assert_eq!(err.kind(), ErrorKind::Misconfigured);
        let later = br#"{"tenure":2,"holder":null,"token":1,"rev":1,"ttl_ms":0}"#;
        assert!(Body::parse("k", later).unwrap_err().to_string().contains("format 2"));
    }
}

#[cfg(test)]
mod fuzz {
    //! Fuzz targets for the records the object stores read back: arbitrary and hostile
    //! JSON never panics, and a record as written reads back as it was.
    use proptest::prelude::*;

    fn json_value() -> impl Strategy<Value = serde_json::Value> {
        prop_oneof![
            Just(serde_json::Value::Null),
            any::<bool>().prop_map(serde_json::Value::from),
            any::<u64>().prop_map(serde_json::Value::from),
            any::<i64>().prop_map(serde_json::Value::from),
            any::<f64>().prop_map(serde_json::Value::from),
            "[ -~]{0,20}".prop_map(serde_json::Value::from),
        ]
    }

    proptest! {
        #[test]
        fn records_never_panic(
            raw in prop::collection::vec(any::<u8>(), 0..200),
            fields in prop::collection::vec(
                (prop::sample::select(vec!["tenure", "holder", "token", "rev", "ttl_ms", "evicted", "acquired_ms",
                    "renewed_ms", "metadata", "tenure_work", "keep_until_ms", "value"]), json_value()),
                0..12,
            ),
        ) {
            let election = tenure::ElectionName::new("e").unwrap();
            let _ = super::Body::parse("k", &raw);
            let mut object: serde_json::Map<String, serde_json::Value> =
                fields.into_iter().map(|(k, v)| (k.to_string(), v)).collect();
            object.insert("tenure".into(), 1.into());
            object.insert("tenure_work".into(), 1.into());
            let bytes = serde_json::to_vec(&object).unwrap();
            if let Ok(body) = super::Body::parse("k", &bytes) {
                let _ = body.record(&election, None);
                prop_assert_eq!(super::Body::parse("k", &body.encode()).ok(), Some(body));
            }
            if let Ok(w) = super::WorkBody::parse("k", &bytes) {
                let _ = w.entry("k", "1".into());
            }
        }
    }
}
