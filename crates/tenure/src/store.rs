//! For those who write a store: the contract ([`LeaseStore`], with what an implementation
//! owes), its requests and answers, its errors, and helpers: [`ChangeHub`] and
//! [`watch_changes`] for stores that can notify, [`observed`] for stores that have no
//! clock of their own, [`StoredValue`] for stores that keep a lease in one value, and
//! [`url`] for reading store URLs.

pub mod observed;
pub mod url;
mod value;
mod watch;

use std::error::Error as StdError;
use std::fmt;
use std::pin::Pin;
use std::time::Duration;

use tokio_stream::Stream;

use crate::name::{ElectionName, WorkKey};
use crate::record::{Evict, LeaseRecord};

pub use crate::record::{
    Acquire, AcquireRequest, ExpiryJudge, MAX_METADATA, MAX_TTL, MIN_TTL, Renew, Revision, check_ttl,
};
pub use observed::{Judgement, ObservedExpiry};
pub use value::StoredValue;
pub use watch::{Carries, Change, ChangeFeed, ChangeHub, watch_changes};

/// On a store whose watch reports expiry ([`LeaseStore::watch_reports_expiry`]), a
/// follower that watches looks at a lease again after this many TTLs without an event.
pub const LOOK_AGAIN_TTLS: u32 = 10;

/// A change to one election's record: the record as it now stands, or `None` when
/// the election has no record (released, evicted at once, or deleted on expiry).
pub type WatchEvent = Option<LeaseRecord>;

/// A stream of changes to one election, from [`LeaseStore::watch`].
pub type WatchStream = Pin<Box<dyn Stream<Item = Result<WatchEvent, StoreError>> + Send>>;

/// Boxed error source.
pub type BoxError = Box<dyn StdError + Send + Sync + 'static>;

/// What kind of failure a [`StoreError`] is, and so whether a retry can help.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum ErrorKind {
    /// The store could not be reached or refused for now (down, busy, locked); the
    /// request was not applied. Retrying can help.
    Unavailable,
    /// The request may or may not have been applied (a timeout, a connection lost
    /// after sending). The runtime never acts on it; it resolves the state by reading.
    Ambiguous,
    /// The request itself is wrong (bad TTL, oversized metadata). Retrying cannot help.
    Invalid,
    /// The store refused our credentials or permissions. Retrying cannot help.
    Unauthorized,
    /// The store holds data this version cannot read, or is misconfigured.
    Misconfigured,
}

impl ErrorKind {
    /// Whether retrying the same request later can succeed.
    pub fn is_retryable(self) -> bool {
        matches!(self, ErrorKind::Unavailable | ErrorKind::Ambiguous)
    }
}

/// A failure of a store operation. Losing a race is not an error: see [`Acquire`] and [`Renew`].
#[derive(Debug)]
pub struct StoreError {
    kind: ErrorKind,
    message: String,
    source: Option<BoxError>,
}

impl StoreError {
    /// A new error of `kind`.
    pub fn new(kind: ErrorKind, message: impl Into<String>) -> Self {
        Self { kind, message: message.into(), source: None }
    }

    /// Attaches the underlying cause.
    pub fn with_source(mut self, source: impl Into<BoxError>) -> Self {
        self.source = Some(source.into());
        self
    }

    /// An [`ErrorKind::Unavailable`] error.
    pub fn unavailable(message: impl Into<String>) -> Self {
        Self::new(ErrorKind::Unavailable, message)
    }

    /// An [`ErrorKind::Ambiguous`] error.
    pub fn ambiguous(message: impl Into<String>) -> Self {
        Self::new(ErrorKind::Ambiguous, message)
    }

    /// An [`ErrorKind::Invalid`] error.
    pub fn invalid(message: impl Into<String>) -> Self {
        Self::new(ErrorKind::Invalid, message)
    }

    /// The request timed out after `after`: it may have been applied.
    pub fn timed_out(operation: &str, after: Duration) -> Self {
        Self::ambiguous(format!("{operation} got no answer within {after:?}; it may or may not have been applied"))
    }

    /// The same kind and message, without the source: for answering one failure to
    /// several callers (a batch that failed as a whole).
    pub fn duplicate(&self) -> Self {
        let mut message = self.message.clone();
        if let Some(src) = &self.source {
            message = format!("{message}: {src}");
        }
        Self { kind: self.kind, message, source: None }
    }

    /// What kind of failure this is.
    pub fn kind(&self) -> ErrorKind {
        self.kind
    }

    /// Whether a retry can help.
    pub fn is_retryable(&self) -> bool {
        self.kind.is_retryable()
    }
}

impl fmt::Display for StoreError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

impl StdError for StoreError {
    fn source(&self) -> Option<&(dyn StdError + 'static)> {
        self.source.as_deref().map(|e| e as &(dyn StdError + 'static))
    }
}

/// A shared store of leases, one record per election.
///
/// Every implementation passes the conformance suite in `tenure-testkit`.
///
/// # To ensure correctness, an implementation owes:
///
/// 1. **Atomic decisions.** `try_acquire`, `renew`, `release` and `evict` each read and
///    write the record in one atomic step (a transaction, a compare-and-set, a script).
///    *Checked by* `racing_candidates_one_winner`.
/// 2. **Expiry by one clock that is not a client's wall clock.** With
///    [`ExpiryJudge::ByStore`] the store dates expiry from when it *received* the
///    request (`received + ttl`), on its own clock, and judges expiry on that same
///    clock. A clock that can step backwards or forwards (a wall clock under NTP) is
///    not good enough. With [`ExpiryJudge::ByObserver`] the store never judges expiry;
///    it only compares revisions. *Checked by* `expiry_then_takeover`,
///    `renew_after_expiry_fails`, `held_by_another` (the time left it reports).
/// 3. **Losing is not an error.** A lost race is `Ok(Acquire::Held)` or
///    `Ok(Renew::Lost)`; `Err` is for failures, with an [`ErrorKind`] that says
///    whether a retry can help. A request whose outcome is unknown (timeout,
///    connection lost after sending) is [`ErrorKind::Ambiguous`], never `Unavailable`.
///    *Checked by* `held_by_another`, `release_by_non_holder_is_harmless`,
///    `evict_without_holder`, `invalid_requests_are_refused`.
/// 4. **Tokens only grow.** Every new grant of an election gets a token strictly
///    greater than every token granted for it before, across release, eviction,
///    expiry and, for durable stores, restarts. A renewal (including a same-holder
///    `try_acquire`) keeps the token. A same-holder `try_acquire` also publishes its
///    request's metadata (how a leader proclaims new metadata within its term), and
///    later renewals keep it. *Checked by* `tokens_increase_across_release_evict_expiry`,
///    `tokens_increase_across_restart`, `same_holder_reacquire_renews`,
///    `reacquire_publishes_new_metadata`, `renew_keeps_token_and_moves_revision`.
/// 5. **Renew is a compare-and-set on (holder, token)** and never succeeds once the
///    record belongs to another grant or has expired, or the holder was evicted.
///    **Release is a compare-and-set on (holder, token, revision).** The `_many` forms
///    decide each lease on its own. *Checked by* `renew_after_takeover_fails`,
///    `renew_many_answers_each_lease_in_order`, `release_clears_and_is_idempotent`,
///    `delayed_release_of_an_earlier_term_is_harmless`, `release_many_releases_each_lease_on_its_own`.
/// 6. **Eviction never makes two leaders.** [`Evict::AfterTerm`] stops renewal and
///    blocks every other candidate until the holder releases or its term runs out;
///    only [`Evict::Now`] clears the record at once. *Checked by*
///    `evict_after_term_blocks_until_release`, `evict_after_term_blocks_until_term_ends`,
///    `evict_now_frees_at_once`.
/// 7. **Watches tell of writes.** If `watch` returns a stream, every write to the
///    election (acquire, renew, release, evict) is followed by an event carrying
///    the record as it then stands. Expiry may be silent. *Checked by*
///    `watch_tells_of_changes`.
/// 8. **The work ledger is a compare-and-set register per (election, key)**, apart from
///    the lease records. [`LeaseStore::ledger_write`] writes only if the entry still
///    stands at the version the writer read (or, with `None`, only if there is none), in
///    one atomic step; a version never comes back for an entry, not even after the entry
///    was let go and written anew, so a writer holding an old version never matches a
///    later value; an entry is kept at least `keep` after its last write (by the store's
///    clock, or a wall clock where the store has none: retention is days, not a safety
///    bound) and may be let go after that, when a read reports it absent. Values are
///    opaque bytes, at most [`MAX_LEDGER_VALUE`]; [`crate::ledger`] gives them meaning
///    (which term claimed a key, whether it finished), so that its rules are written once.
///    *Checked by* `ledger_writes_compare_versions`, `ledger_entries_are_kept_apart`,
///    `ledger_claims_follow_the_terms`.
///
/// Every case of the suite (`tenure_testkit::conformance::CASES`) names the duty it checks;
/// `list_by_prefix` and `metadata_round_trips` check `list` and the record's fields;
/// `announced_candidates_are_listed` and `priority_handover_and_reservations` run the
/// runtime's presence leases, priority handover and reservations (ordinary leases,
/// `list`, `evict`) on the store.
///
/// # Cancellation
///
/// The runtime drops a store future when its request timeout passes and treats the call
/// as [`ErrorKind::Ambiguous`]: it may or may not have been applied, and the runtime
/// finds out by reading. A call dropped at any await point must therefore leave no half
/// decision: the store's one atomic step (duty 1) has either happened or not, and nothing
/// the store keeps for itself (a cached version, a connection) may then claim more than
/// that step did.
#[async_trait::async_trait]
pub trait LeaseStore: Send + Sync + 'static {
    /// Takes the lease if nobody holds it, if the record has expired by the store's
    /// judgement, or if `req.holder` already holds it (then it is a renewal that keeps
    /// the token and writes `req.metadata`). Otherwise answers `Held` with the current
    /// record.
    async fn try_acquire(&self, req: &AcquireRequest) -> Result<Acquire, StoreError>;

    /// Extends `held` by `ttl` from now, if the record is still the same grant
    /// (same holder and token), not expired and not evicted.
    async fn renew(&self, held: &LeaseRecord, ttl: Duration) -> Result<Renew, StoreError>;

    /// Clears the record if it is still exactly `held`: same holder, token **and
    /// revision**; otherwise does nothing. Idempotent. The token counter survives.
    ///
    /// Comparing the revision matters: a holder that re-acquires its own live record
    /// keeps the token, so a release delayed in the network from its earlier term would
    /// otherwise clear the lease of its current term.
    async fn release(&self, held: &LeaseRecord) -> Result<(), StoreError>;

    /// Renews each of `held` exactly as [`LeaseStore::renew`] would, answering one result
    /// per lease, in order. Stores that can renew many leases in one round trip (one
    /// transaction, one pipeline) override it; the default runs the renewals concurrently,
    /// [`MANY_AT_ONCE`] at a time. [`crate::Batched`] gathers the renewals of many
    /// electors into such calls.
    async fn renew_many(&self, held: &[LeaseRecord], ttl: Duration) -> Vec<Result<Renew, StoreError>> {
        join_all(held.len(), &|i| self.renew(&held[i], ttl)).await
    }

    /// Releases each of `held` exactly as [`LeaseStore::release`] would, answering one
    /// result per lease, in order. Stores that can release many leases in one round trip
    /// (one transaction, one statement) override it; the default runs the releases
    /// concurrently, [`MANY_AT_ONCE`] at a time. [`crate::Batched`] gathers the releases of
    /// many electors into such calls, so that a process that leads thousands of elections
    /// hands them all over at once when it stops.
    async fn release_many(&self, held: &[LeaseRecord]) -> Vec<Result<(), StoreError>> {
        join_all(held.len(), &|i| self.release(&held[i])).await
    }

    /// The current record of `election`, or `None` if nobody holds it (never an
    /// expired record).
    async fn get(&self, election: &ElectionName) -> Result<Option<LeaseRecord>, StoreError>;

    /// The current records of every election whose name starts with `prefix`, by name.
    async fn list(&self, prefix: &str) -> Result<Vec<LeaseRecord>, StoreError>;

    /// Forces the holder of `election` to stand down; see [`Evict`]. Answers the
    /// record that was evicted, or `None` if nobody held the election.
    async fn evict(&self, election: &ElectionName, how: Evict) -> Result<Option<LeaseRecord>, StoreError>;

    /// A stream of changes to `election`, or `None` if this store cannot notify (then
    /// the runtime polls). The stream may end or fail; the runtime then falls back to
    /// polling.
    fn watch(&self, election: &ElectionName) -> Option<WatchStream> {
        let _ = election;
        None
    }

    /// Where this handle gathers the renewals of many leases into few calls
    /// ([`crate::Batched`]), the origin of a shared grid: electors renew early, at a
    /// whole number of renew intervals after it, so that electors with the same TTL renew
    /// together and their renewals meet in one call. Renewing early is safe (a term is
    /// dated from its renewal's send time). `None`, the default: renew when due.
    fn renewal_grid(&self) -> Option<crate::Instant> {
        None
    }

    /// Whether this store's [`watch`](LeaseStore::watch) reports the end of every grant it
    /// has shown, however it ends (released, evicted at once, or expired: the store deletes
    /// an expired grant itself and tells its watchers), and reports each change of what a
    /// grant says, but not necessarily its renewals. A follower that watches such a store
    /// waits for the watch rather than looking again when the lease it saw would expire
    /// (it still looks every [`LOOK_AGAIN_TTLS`] TTLs, in case an event was lost). `false`,
    /// the default: a follower looks when the lease would expire.
    fn watch_reports_expiry(&self) -> bool {
        false
    }

    /// Whose clock judges expiry.
    fn expiry(&self) -> ExpiryJudge {
        ExpiryJudge::ByStore
    }

    /// A short description for logs, e.g. `sqlite:/var/lib/app/tenure.db`, never
    /// containing credentials.
    fn describe(&self) -> String;

    /// The entry `key` of `election`'s work ledger (duty 8), or `None` if there is none or
    /// the store has let it go. The default answers that this store keeps no ledger.
    async fn ledger_read(&self, election: &ElectionName, key: &WorkKey) -> Result<Option<LedgerEntry>, StoreError> {
        let _ = (election, key);
        Err(no_ledger(&self.describe()))
    }

    /// Writes `value` as the entry `key` of `election`'s work ledger if the entry still
    /// stands at version `expected` (`None`: only if there is none), and keeps it at least
    /// `keep` after this write (duty 8). Answers the new version, or
    /// [`LedgerWrite::Conflict`] if the entry stands elsewhere; a write that may or may
    /// not have been applied is [`ErrorKind::Ambiguous`], and the caller reads to find
    /// out. The default answers that this store keeps no ledger.
    async fn ledger_write(
        &self,
        election: &ElectionName,
        key: &WorkKey,
        value: &[u8],
        expected: Option<&str>,
        keep: Duration,
    ) -> Result<LedgerWrite, StoreError> {
        let _ = (election, key, value, expected, keep);
        Err(no_ledger(&self.describe()))
    }
}

/// The largest value a work-ledger entry holds ([`LeaseStore::ledger_write`]).
pub const MAX_LEDGER_VALUE: usize = 1024;

/// One entry of a work ledger as a store keeps it ([`LeaseStore::ledger_read`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LedgerEntry {
    /// What was written (opaque to the store; [`crate::ledger`] reads it).
    pub value: Vec<u8>,
    /// What a conditional write compares: a revision, an ETag, a version number, as text.
    pub version: String,
}

/// What [`LeaseStore::ledger_write`] did.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum LedgerWrite {
    /// The value was written; the entry now stands at this version.
    Written(String),
    /// The entry no longer stands at the expected version (or exists, where none was
    /// expected): nothing was written.
    Conflict,
}

/// The error of a store that keeps no work ledger.
fn no_ledger(store: &str) -> StoreError {
    StoreError::new(
        ErrorKind::Misconfigured,
        format!("{store} keeps no work ledger, which once-per-key runs and schedules need"),
    )
}

/// Checks a ledger value's size (stores call it before writing).
pub fn check_ledger_value(value: &[u8]) -> Result<(), StoreError> {
    if value.len() > MAX_LEDGER_VALUE {
        return Err(StoreError::invalid(format!(
            "a work-ledger entry of {} bytes is larger than the {MAX_LEDGER_VALUE} a store keeps",
            value.len()
        )));
    }
    Ok(())
}

/// How many calls the default [`LeaseStore::renew_many`] and [`LeaseStore::release_many`]
/// run at once. A store client's call can take several KiB while it runs: 10,000 of them
/// at once took 90 MB on NATS, and every wake-up polled them all. A batch answers when
/// its last call does, so a full [`crate::Batched`] batch (4,096) takes four rounds of
/// calls: four round trips, well inside a request timeout unless the store is far away.
pub const MANY_AT_ONCE: usize = 1024;

/// A call's future, as [`LeaseStore`]'s methods answer it.
type Call<'a, T> = Pin<Box<dyn std::future::Future<Output = T> + Send + 'a>>;

/// Runs the futures `make(0)` to `make(n - 1)`, each made as it is started, at most
/// [`MANY_AT_ONCE`] at once; answers their outputs in order.
async fn join_all<'a, T: Send>(n: usize, make: &(dyn Fn(usize) -> Call<'a, T> + Sync + 'a)) -> Vec<T> {
    let mut futs = (0..n).map(|i| (i, make(i))).peekable();
    let mut out: Vec<Option<T>> = (0..n).map(|_| None).collect();
    let mut running: Vec<(usize, Call<'a, T>)> = Vec::new();
    std::future::poll_fn(|cx| {
        loop {
            while running.len() < MANY_AT_ONCE
                && let Some(next) = futs.next()
            {
                running.push(next);
            }
            let before = running.len();
            running.retain_mut(|(i, f)| match f.as_mut().poll(cx) {
                std::task::Poll::Ready(v) => {
                    if let Some(slot) = out.get_mut(*i) {
                        *slot = Some(v);
                    }
                    false
                }
                std::task::Poll::Pending => true,
            });
            if running.is_empty() && futs.peek().is_none() {
                return std::task::Poll::Ready(());
            }
            // Turns came free: start the next futures and poll them now.
            if running.len() == before {
                return std::task::Poll::Pending;
            }
        }
    })
    .await;
    out.into_iter().map(|v| v.expect("every future finished")).collect()
}

/// Checks a table name that will be written into SQL (the PostgreSQL and MySQL stores):
/// 1 to `max` lowercase letters, digits and underscores, not starting with a digit.
/// Nothing else can reach the statement text, and lowercase names mean the same thing
/// quoted or not, on every server.
pub fn check_table_name(name: &str, max: usize) -> Result<(), StoreError> {
    let valid = !name.is_empty()
        && name.len() <= max
        && name.starts_with(|c: char| c.is_ascii_lowercase() || c == '_')
        && name.chars().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_');
    if valid {
        Ok(())
    } else {
        Err(StoreError::invalid(format!(
            "table name {name:?} is not allowed: use 1 to {max} lowercase letters, digits and underscores, not starting with a digit"
        )))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A store whose renewals and releases take 10 ms each and count how many run at once.
    #[derive(Default)]
    struct Slow {
        running: std::sync::atomic::AtomicUsize,
        most: std::sync::atomic::AtomicUsize,
    }

    impl Slow {
        async fn call(&self) {
            use std::sync::atomic::Ordering::SeqCst;
            let now = self.running.fetch_add(1, SeqCst) + 1;
            self.most.fetch_max(now, SeqCst);
            tokio::time::sleep(Duration::from_millis(10)).await;
            self.running.fetch_sub(1, SeqCst);
        }
    }

    #[async_trait::async_trait]
    impl LeaseStore for Slow {
        async fn try_acquire(&self, _: &AcquireRequest) -> Result<Acquire, StoreError> {
            Err(StoreError::unavailable("not used"))
        }
        async fn renew(&self, held: &LeaseRecord, _: Duration) -> Result<Renew, StoreError> {
            self.call().await;
            Ok(Renew::Renewed(held.clone()))
        }
        async fn release(&self, _: &LeaseRecord) -> Result<(), StoreError> {
            self.call().await;
            Ok(())
        }
        async fn get(&self, _: &ElectionName) -> Result<Option<LeaseRecord>, StoreError> {
            Ok(None)
        }
        async fn list(&self, _: &str) -> Result<Vec<LeaseRecord>, StoreError> {
            Ok(Vec::new())
        }
        async fn evict(&self, _: &ElectionName, _: Evict) -> Result<Option<LeaseRecord>, StoreError> {
            Ok(None)
        }
        fn describe(&self) -> String {
            "slow".into()
        }
    }

    fn held(i: usize) -> LeaseRecord {
        LeaseRecord {
            election: ElectionName::new(format!("many/{i}")).unwrap(),
            holder: crate::HolderId::new("h").unwrap(),
            token: crate::FencingToken(i as u64 + 1),
            revision: crate::record::Revision(1),
            ttl: Duration::from_secs(10),
            acquired_at: None,
            renewed_at: None,
            remaining: None,
            evicted: false,
            metadata: Vec::new(),
        }
    }

    #[tokio::test(start_paused = true)]
    async fn the_default_batch_calls_run_a_bounded_number_at_once_and_answer_in_order() {
        let store = Slow::default();
        let all: Vec<_> = (0..2500).map(held).collect();
        let t0 = tokio::time::Instant::now();
        let renewed = store.renew_many(&all, Duration::from_secs(10)).await;
        let tokens: Vec<u64> = renewed
            .into_iter()
            .map(|r| match r {
                Ok(Renew::Renewed(rec)) => rec.token.0,
                other => panic!("{other:?}"),
            })
            .collect();
        assert_eq!(tokens, (1..=2500).collect::<Vec<u64>>(), "answers out of order");
        assert_eq!(store.most.load(std::sync::atomic::Ordering::SeqCst), MANY_AT_ONCE);
        // 2,500 calls of 10 ms, 1,024 at a time: three rounds.
        assert_eq!(t0.elapsed(), Duration::from_millis(30));
        assert_eq!(store.release_many(&all[..3]).await.len(), 3);
        assert!(store.release_many(&[]).await.is_empty());
    }

    #[test]
    fn table_names_are_checked() {
        assert!(check_table_name("tenure_leases", 63).is_ok());
        for bad in ["", "1t", "a-b", "a;drop", "Leases", &"x".repeat(64)] {
            assert!(check_table_name(bad, 63).is_err(), "{bad}");
        }
    }
}
