//! Lease records, fencing tokens and the requests and answers of the store contract.

use std::fmt;
use std::time::{Duration, SystemTime};

use crate::name::{ElectionName, HolderId};
use crate::store::StoreError;

/// Largest metadata a lease may carry, in bytes.
pub const MAX_METADATA: usize = 4096;
/// Shortest TTL a store accepts.
pub const MIN_TTL: Duration = Duration::from_millis(10);
/// Longest TTL a store accepts.
pub const MAX_TTL: Duration = Duration::from_secs(24 * 3600);

/// A fencing token: issued by the store, strictly greater for every new grant of an
/// election than any token granted before. Renewals keep the token.
///
/// Hand it to the resource you write to; the resource rejects any token lower than
/// the highest it has accepted, so a paused old leader cannot overwrite a newer one.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct FencingToken(pub u64);

impl fmt::Display for FencingToken {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0)
    }
}

/// The store's version of a record; changes on every write (acquire, renew, evict).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Revision(pub u64);

impl fmt::Display for Revision {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0)
    }
}

/// The current lease of one election, as the store holds it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LeaseRecord {
    /// The election.
    pub election: ElectionName,
    /// Who holds it.
    pub holder: HolderId,
    /// The fencing token of this grant.
    pub token: FencingToken,
    /// The store's revision of the record.
    pub revision: Revision,
    /// The TTL the holder asked for.
    pub ttl: Duration,
    /// When the lease was granted, on the store's wall clock (for display only).
    pub acquired_at: Option<SystemTime>,
    /// When the lease was last renewed, on the store's wall clock (for display only).
    pub renewed_at: Option<SystemTime>,
    /// Time left before the store judges the lease expired, as the store saw it when it
    /// answered, if the store can tell. A hint for waking up, never a basis for safety.
    pub remaining: Option<Duration>,
    /// The holder was evicted by an operator: it can no longer renew, and nobody else
    /// may take over before it releases or its term runs out.
    pub evicted: bool,
    /// What the holder wants observers to see (at most [`MAX_METADATA`] bytes).
    pub metadata: Vec<u8>,
}

impl LeaseRecord {
    /// Who leads according to this record.
    pub fn leader(&self) -> Leader {
        Leader { holder: self.holder.clone(), token: self.token, metadata: self.metadata.clone() }
    }
}

/// Who leads an election: the part of a [`LeaseRecord`] that does not change on renewal
/// (the metadata changes only when the leader proclaims new metadata).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Leader {
    /// The leader's holder id.
    pub holder: HolderId,
    /// The leader's fencing token.
    pub token: FencingToken,
    /// The leader's metadata.
    pub metadata: Vec<u8>,
}

impl fmt::Display for Leader {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} (token {})", self.holder, self.token)
    }
}

/// A request to take (or, for its own holder, extend) an election's lease.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AcquireRequest {
    /// The election.
    pub election: ElectionName,
    /// The candidate.
    pub holder: HolderId,
    /// How long the lease lasts, judged by the store, from when the store receives the request.
    pub ttl: Duration,
    /// Metadata for observers, at most [`MAX_METADATA`] bytes.
    pub metadata: Vec<u8>,
}

impl AcquireRequest {
    /// A request with no metadata.
    pub fn new(election: ElectionName, holder: HolderId, ttl: Duration) -> Self {
        Self { election, holder, ttl, metadata: Vec::new() }
    }

    /// Sets the metadata.
    pub fn with_metadata(mut self, metadata: impl Into<Vec<u8>>) -> Self {
        self.metadata = metadata.into();
        self
    }

    /// Checks the TTL and metadata size; every store calls this before it writes.
    pub fn validate(&self) -> Result<(), StoreError> {
        check_ttl(self.ttl)?;
        if self.metadata.len() > MAX_METADATA {
            return Err(StoreError::invalid(format!(
                "metadata is {} bytes; a lease carries at most {MAX_METADATA} bytes",
                self.metadata.len()
            )));
        }
        Ok(())
    }
}

/// Checks that a TTL lies between [`MIN_TTL`] and [`MAX_TTL`].
pub fn check_ttl(ttl: Duration) -> Result<(), StoreError> {
    if ttl < MIN_TTL || ttl > MAX_TTL {
        return Err(StoreError::invalid(format!(
            "TTL {ttl:?} is out of range: it must lie between {MIN_TTL:?} and {MAX_TTL:?}"
        )));
    }
    Ok(())
}

/// The answer to [`crate::LeaseStore::try_acquire`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Acquire {
    /// The lease is now ours (a new grant, or a renewal if it already was ours).
    Acquired(LeaseRecord),
    /// Someone else holds it (or we hold it but were evicted).
    Held(LeaseRecord),
}

/// The answer to [`crate::LeaseStore::renew`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Renew {
    /// Still ours; the record carries the new revision.
    Renewed(LeaseRecord),
    /// No longer ours: the current record, if any (ours with `evicted` set after an eviction).
    Lost(Option<LeaseRecord>),
}

/// How [`crate::LeaseStore::evict`] removes a leader.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Evict {
    /// The safe default: the holder can no longer renew and stands down when it
    /// sees that; nobody else may acquire before it releases or its term runs out.
    AfterTerm,
    /// Clear the record at once, for a holder known to be dead. If the holder is in
    /// fact alive, it may act until its own deadline while a new leader acts too.
    Now,
}

/// Whose clock decides that a lease has expired.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ExpiryJudge {
    /// The store's own clock (SQL `now()`, Redis `PX`, etcd leases, a shared monotonic clock).
    ByStore,
    /// The store has no clock: a follower takes over only after it has seen the same
    /// revision unchanged for a whole TTL plus margin on its own monotonic clock.
    ByObserver,
}
