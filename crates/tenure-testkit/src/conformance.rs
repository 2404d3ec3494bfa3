//! The contract tests every [`LeaseStore`] passes.
//!
//! Implement [`Harness`] for your store and call [`run_all`] from a test:
//!
//! ```no_run
//! use std::sync::Arc;
//! use tenure::{LeaseStore, MemoryStore};
//! use tenure_testkit::conformance::{self, Harness};
//!
//! struct Memory(MemoryStore);
//!
//! #[async_trait::async_trait]
//! impl Harness for Memory {
//!     async fn open(&self) -> Arc<dyn LeaseStore> {
//!         Arc::new(self.0.clone())
//!     }
//! }
//!
//! # async fn t() {
//! conformance::run_all(Memory(MemoryStore::new())).await;
//! # }
//! ```
//!
//! A store on a server: [`crate::harness::Served`] is the harness of a store on one
//! throwaway server (behind the fault proxy, or direct), and
//! [`store_suite!`](crate::store_suite) writes its two standard tests, this suite and
//! the five-candidate [`scenario`](crate::scenario). [`a_wrong_password_is_refused`] and
//! [`an_unreachable_server_is_retryable`] are the checks of a store's errors that every
//! store with a server runs.
//!
//! Expiry is judged by the store, so the expiry cases wait in real time (a few
//! multiples of [`Harness::short_ttl`]); with a store on tokio's clock, run the suite
//! on paused time and they take no time at all. For a store that judges expiry as an
//! observer ([`ExpiryJudge::ByObserver`]), every case that takes over after an expiry
//! lets the new candidate see the lease first: it times the TTL from that sighting.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use tenure::store::{Acquire, AcquireRequest, ExpiryJudge, LedgerWrite, MAX_LEDGER_VALUE, MAX_METADATA, Renew};
use tenure::{ElectionName, ErrorKind, Evict, FencingToken, HolderId, LeaseRecord, LeaseStore, WorkKey};
use tokio_stream::StreamExt;

use crate::unique;

pub use crate::harness::{Harness, LONG_TTL, Served};

type Case = fn(Arc<dyn Harness>) -> Pin<Box<dyn Future<Output = ()> + Send>>;

macro_rules! cases {
    (concurrent: [$($name:ident),* $(,)?], alone: [$($alone:ident),* $(,)?] $(,)?) => {
        /// The names of every case, in the order [`run_all`] starts them.
        pub const CASES: &[&str] = &[$(stringify!($name),)* $(stringify!($alone)),*];
        /// The cases that restart the store, which [`run_all`] runs one at a time after
        /// the others.
        pub const RESTARTING: &[&str] = &[$(stringify!($alone)),*];
        fn table() -> Vec<(&'static str, Case)> {
            vec![$((stringify!($name), (|h| Box::pin($name(h))) as Case),)* $((stringify!($alone), (|h| Box::pin($alone(h))) as Case)),*]
        }
    };
}

cases!(
    concurrent: [
        acquire_on_empty,
        held_by_another,
        same_holder_reacquire_renews,
        reacquire_publishes_new_metadata,
        renew_keeps_token_and_moves_revision,
        renew_many_answers_each_lease_in_order,
        expiry_then_takeover,
        renew_after_expiry_fails,
        renew_after_takeover_fails,
        release_clears_and_is_idempotent,
        release_by_non_holder_is_harmless,
        delayed_release_of_an_earlier_term_is_harmless,
        release_many_releases_each_lease_on_its_own,
        evict_after_term_blocks_until_release,
        evict_after_term_blocks_until_term_ends,
        evict_now_frees_at_once,
        evict_without_holder,
        tokens_increase_across_release_evict_expiry,
        racing_candidates_one_winner,
        list_by_prefix,
        watch_tells_of_changes,
        metadata_round_trips,
        invalid_requests_are_refused,
        announced_candidates_are_listed,
        priority_handover_and_reservations,
        several_holders,
        ledger_writes_compare_versions,
        ledger_entries_are_kept_apart,
        ledger_claims_follow_the_terms,
    ],
    alone: [tokens_increase_across_restart, watch_goes_on_after_a_restart],
);

/// The environment variable that names the cases [`run_all`] runs, separated by commas
/// (e.g. `TENURE_CONFORMANCE_CASES=several_holders cargo test -p tenure-redis
/// redis_store_conforms`); unset or empty, it runs all of them.
pub const CASES_ENV: &str = "TENURE_CONFORMANCE_CASES";

/// A store whose server does not answer (`store`, made for a port nobody listens on): its
/// first read fails with an error that [`tenure::StoreError::is_retryable`] calls
/// retryable, so that a candidate waits for the server instead of giving up, and that
/// names the kind of server (`names`), where the store says it.
pub async fn an_unreachable_server_is_retryable(store: &dyn LeaseStore, names: Option<&str>) {
    let err = store.get(&ElectionName::new("x").expect("a valid name")).await.expect_err("a read of nothing");
    assert!(err.is_retryable(), "{err}");
    if let Some(name) = names {
        assert!(err.to_string().contains(name), "{err}");
    }
}

/// A store given a wrong password: its first read fails as [`ErrorKind::Unauthorized`]
/// with `hint` in the message, the `password` shows neither in the error nor in
/// [`LeaseStore::describe`], and `right` (the same server with the right password) reads.
/// Every store with a password runs it against a throwaway server.
pub async fn a_wrong_password_is_refused(wrong: &dyn LeaseStore, password: &str, hint: &str, right: &dyn LeaseStore) {
    let e = ElectionName::new("x").expect("a valid name");
    let err = wrong.get(&e).await.expect_err("a wrong password read");
    assert_eq!(err.kind(), ErrorKind::Unauthorized, "{err}");
    assert!(err.to_string().contains(hint), "{err}");
    assert!(!format!("{err:?}").contains(password), "the password shows in the error");
    let described = wrong.describe();
    assert!(
        !described.contains(password) && !described.contains("password"),
        "the description shows a password: {described}"
    );
    assert_eq!(right.get(&e).await.expect("the right password reads"), None);
}

/// Runs every case against the store `harness` opens (or those [`CASES_ENV`] names), each
/// in its own task: the cases that leave the store alone all at once (each on elections
/// of its own; most of their time is waiting for leases to run out), then the
/// [`RESTARTING`] ones one at a time. Panics at the end, naming every case that failed,
/// and at the start on a name in [`CASES_ENV`] that is no case's.
pub async fn run_all(harness: impl Harness) {
    let harness: Arc<dyn Harness> = Arc::new(harness);
    let wanted: Vec<String> = std::env::var(CASES_ENV)
        .unwrap_or_default()
        .split(',')
        .map(str::trim)
        .filter(|n| !n.is_empty())
        .map(String::from)
        .collect();
    if let Some(unknown) = wanted.iter().find(|n| !CASES.contains(&n.as_str())) {
        panic!("{CASES_ENV} names {unknown:?}, which is no conformance case; the cases: {}", CASES.join(", "));
    }
    let chosen = table().into_iter().filter(|(name, _)| wanted.is_empty() || wanted.iter().any(|w| w == name));
    let (alone, together): (Vec<_>, Vec<_>) = chosen.partition(|(name, _)| RESTARTING.contains(name));
    let mut failed = Vec::new();
    let started: Vec<_> =
        together.into_iter().map(|(name, case)| (name, tokio::spawn(case(harness.clone())))).collect();
    for (name, task) in started {
        note(name, task.await, &mut failed);
    }
    for (name, case) in alone {
        note(name, tokio::spawn(case(harness.clone())).await, &mut failed);
    }
    assert!(failed.is_empty(), "{} conformance case(s) failed:\n{}", failed.len(), failed.join("\n"));
}

/// Reports how the case `name` ended, adding it to `failed` if it panicked.
fn note(name: &str, ended: Result<(), tokio::task::JoinError>, failed: &mut Vec<String>) {
    match ended {
        Ok(()) => eprintln!("conformance: {name} ... ok"),
        Err(e) => {
            let msg = match e.try_into_panic() {
                Ok(p) => p
                    .downcast_ref::<String>()
                    .cloned()
                    .or_else(|| p.downcast_ref::<&str>().map(|s| s.to_string()))
                    .unwrap_or_default(),
                Err(e) => e.to_string(),
            };
            eprintln!("conformance: {name} ... FAILED: {msg}");
            failed.push(format!("{name}: {msg}"));
        }
    }
}

fn election(case: &str) -> ElectionName {
    ElectionName::new(format!("conformance/{}", unique(case))).unwrap()
}

fn holder(name: &str) -> HolderId {
    HolderId::new(unique(name)).unwrap()
}

fn req(e: &ElectionName, h: &HolderId, ttl: Duration) -> AcquireRequest {
    AcquireRequest::new(e.clone(), h.clone(), ttl)
}

async fn acquired(store: &dyn LeaseStore, r: &AcquireRequest) -> LeaseRecord {
    match store.try_acquire(r).await.expect("try_acquire failed") {
        Acquire::Acquired(l) => {
            assert_eq!(l.holder, r.holder, "the acquired record names the requester");
            assert_eq!(l.election, r.election);
            assert!(!l.evicted);
            l
        }
        Acquire::Held(rec) => panic!("expected to acquire {}, but {} holds it", r.election, rec.holder),
    }
}

async fn held(store: &dyn LeaseStore, r: &AcquireRequest) -> LeaseRecord {
    match store.try_acquire(r).await.expect("try_acquire failed") {
        Acquire::Held(rec) => rec,
        Acquire::Acquired(l) => {
            panic!("{} acquired {} (token {}) but it should be held", r.holder, r.election, l.token)
        }
    }
}

/// Waits out a short lease: twice its TTL, so the store's clock has passed it.
async fn outlive(h: &Arc<dyn Harness>) {
    outlive_ttl(h.short_ttl()).await;
}

/// Waits out a lease of `ttl`: twice it, so the store's clock has passed it.
async fn outlive_ttl(ttl: Duration) {
    tokio::time::sleep(ttl * 2 + Duration::from_millis(50)).await;
}

/// The TTLs a case that must see a short lease still held tries in turn: the short TTL,
/// then twice and four times it where the store serves them. On a machine so busy that
/// the steps between a grant and the check take a whole TTL, the check says nothing
/// (see [`held_if_young`]) and the case tries again with a longer one.
fn young_ttls(h: &Arc<dyn Harness>) -> Vec<Duration> {
    let short = h.short_ttl();
    [short, short * 2, short * 4].into_iter().filter(|ttl| *ttl == short || *ttl < h.long_ttl()).collect()
}

/// Tries `r` on `store` where a lease asked for at `sent` with `ttl` must still be held:
/// the record if it is; `None` if `r` was granted but the TTL had run out since `sent`
/// by the time the answer came (too slow a machine for the check to say anything);
/// panics if `r` was granted within the TTL.
async fn held_if_young(
    store: &dyn LeaseStore,
    r: &AcquireRequest,
    sent: std::time::Instant,
    ttl: Duration,
) -> Option<LeaseRecord> {
    match store.try_acquire(r).await.expect("try_acquire failed") {
        Acquire::Held(rec) => Some(rec),
        Acquire::Acquired(_) if sent.elapsed() >= ttl => None,
        Acquire::Acquired(l) => panic!(
            "{} acquired {} (token {}) {:?} after a lease of {ttl:?} was granted, but it should be held",
            r.holder,
            r.election,
            l.token,
            sent.elapsed()
        ),
    }
}

/// Checks duties 3 and 4 (a grant on an empty election; tokens start above zero).
async fn acquire_on_empty(h: Arc<dyn Harness>) {
    let s = h.open().await;
    let e = election("empty");
    let a = holder("a");
    assert_eq!(s.get(&e).await.unwrap(), None, "a fresh election has no record");
    let l = acquired(&*s, &req(&e, &a, h.long_ttl())).await;
    assert!(l.token >= FencingToken(1), "tokens start above zero");
    assert_eq!(l.ttl, h.long_ttl());
    let got = s.get(&e).await.unwrap().expect("get sees the new lease");
    assert_eq!((got.holder, got.token), (a, l.token));
}

/// Checks duties 2 and 3 (a lost race is `Held`, naming the holder, with at most a TTL left).
async fn held_by_another(h: Arc<dyn Harness>) {
    let (s1, s2) = (h.open().await, h.open().await);
    let e = election("held");
    let (a, b) = (holder("a"), holder("b"));
    let l = acquired(&*s1, &req(&e, &a, h.long_ttl())).await;
    let rec = held(&*s2, &req(&e, &b, h.long_ttl())).await;
    assert_eq!((rec.holder, rec.token), (a.clone(), l.token), "Held names the current holder");
    let remaining = rec.remaining.unwrap_or(rec.ttl);
    // An observer-judged store counts the TTL plus its margin from when it first saw the
    // version; a store with a clock counts at most the TTL.
    let most = match s2.expiry() {
        ExpiryJudge::ByStore => h.long_ttl(),
        ExpiryJudge::ByObserver => h.long_ttl().mul_f64(1.0 + 2.0 * tenure::store::observed::MAX_RATE_BOUND),
    };
    assert!(remaining <= most, "remaining {remaining:?} exceeds the TTL");
    let got = s2.get(&e).await.unwrap().unwrap();
    assert_eq!(got.holder, a, "a lost race leaves the record alone");
}

/// Checks duty 4 (a same-holder acquire is a renewal: same token, new revision).
async fn same_holder_reacquire_renews(h: Arc<dyn Harness>) {
    let s = h.open().await;
    let e = election("reacquire");
    let a = holder("a");
    let first = acquired(&*s, &req(&e, &a, h.long_ttl())).await;
    let again = acquired(&*s, &req(&e, &a, h.long_ttl())).await;
    assert_eq!(again.token, first.token, "re-acquiring by the same holder is a renewal and keeps the token");
    assert!(again.revision > first.revision, "a renewal moves the revision");
}

/// Checks duties 4 and 7 for a proclamation: a same-holder `try_acquire` with new
/// metadata keeps the term (its token), publishes the metadata to readers and watchers,
/// and later renewals keep it.
async fn reacquire_publishes_new_metadata(h: Arc<dyn Harness>) {
    let (s1, s2) = (h.open().await, h.open().await);
    let e = election("proclaim");
    let a = holder("a");
    let mut w = s2.watch(&e);
    if w.is_some() {
        // Some stores need a moment before the subscription is live.
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let first = acquired(&*s1, &req(&e, &a, h.long_ttl()).with_metadata(b"v1".to_vec())).await;
    let again = acquired(&*s1, &req(&e, &a, h.long_ttl()).with_metadata(b"v2".to_vec())).await;
    assert_eq!(again.token, first.token, "a proclamation keeps the term and its token");
    assert!(again.revision > first.revision, "a proclamation moves the revision");
    assert_eq!(again.metadata, b"v2", "the answer carries the new metadata");
    assert_eq!(s2.get(&e).await.unwrap().unwrap().metadata, b"v2", "readers see the new metadata");
    assert_eq!(held(&*s2, &req(&e, &holder("b"), h.long_ttl())).await.metadata, b"v2");
    if let Some(w) = &mut w {
        wait_for(w, "the proclamation", |ev| ev.as_ref().is_some_and(|r| r.metadata == b"v2")).await;
    }
    match s1.renew(&again, h.long_ttl()).await.unwrap() {
        Renew::Renewed(r) => assert_eq!(r.metadata, b"v2", "a renewal keeps the proclaimed metadata"),
        Renew::Lost(cur) => panic!("renewing after a proclamation failed: {cur:?}"),
    }
    assert_eq!(s2.get(&e).await.unwrap().unwrap().metadata, b"v2", "a renewal keeps the proclaimed metadata");
}

/// Checks duties 4 and 5 (renewal keeps the token; the compare is on holder and token).
async fn renew_keeps_token_and_moves_revision(h: Arc<dyn Harness>) {
    let s = h.open().await;
    let e = election("renew");
    let a = holder("a");
    let l = acquired(&*s, &req(&e, &a, h.long_ttl())).await;
    let r = match s.renew(&l, h.long_ttl()).await.unwrap() {
        Renew::Renewed(r) => r,
        Renew::Lost(cur) => panic!("renewing a live lease failed: {cur:?}"),
    };
    assert_eq!(r.token, l.token);
    assert!(r.revision > l.revision);
    // Renewing from the older copy still works: the compare is on holder and token.
    assert!(matches!(s.renew(&l, h.long_ttl()).await.unwrap(), Renew::Renewed(_)));
}

/// Checks duty 5 (each renewal of a batch is its own compare-and-set).
async fn renew_many_answers_each_lease_in_order(h: Arc<dyn Harness>) {
    let (s1, s2) = (h.open().await, h.open().await);
    let root = unique("many");
    let a = holder("a");
    let mut leases = Vec::new();
    for i in 0..6 {
        let e = ElectionName::new(format!("conformance/{root}/{i}")).unwrap();
        leases.push(acquired(&*s1, &req(&e, &a, h.long_ttl())).await);
    }
    // The third is evicted and taken over by b; the fifth is evicted and left free; the
    // sixth is evicted after its term (its holder must see its own evicted record, to
    // release it).
    s2.evict(&leases[5].election, Evict::AfterTerm).await.unwrap();
    s2.evict(&leases[2].election, Evict::Now).await.unwrap();
    let b = holder("b");
    let lb = acquired(&*s2, &req(&leases[2].election, &b, h.long_ttl())).await;
    s2.evict(&leases[4].election, Evict::Now).await.unwrap();
    let answers = s1.renew_many(&leases, h.long_ttl()).await;
    assert_eq!(answers.len(), leases.len(), "one answer per lease");
    for (i, (l, ans)) in leases.iter().zip(answers).enumerate() {
        match (i, ans.expect("renew_many failed")) {
            (2, Renew::Lost(Some(cur))) => assert_eq!((cur.holder, cur.token), (b.clone(), lb.token)),
            (2, other) => panic!("the taken-over lease must be Lost naming b, got {other:?}"),
            (4, Renew::Lost(None)) => {}
            (4, other) => panic!("the evicted lease nobody took must be Lost with no holder, got {other:?}"),
            (5, Renew::Lost(Some(cur))) => {
                assert!(cur.evicted && (&cur.holder, cur.token) == (&a, l.token), "Lost shows our own evicted record")
            }
            (5, other) => panic!("a lease evicted after its term must be Lost showing it, got {other:?}"),
            (_, Renew::Renewed(r)) => {
                assert_eq!((&r.election, r.token), (&l.election, l.token), "answers come in the order asked");
                assert!(r.revision > l.revision);
            }
            (_, other) => panic!("lease {i} should have been renewed, got {other:?}"),
        }
    }
    assert!(s1.renew_many(&[], h.long_ttl()).await.is_empty());
}

/// Checks duties 2 and 4 (expiry by the store; the next grant has a larger token).
async fn expiry_then_takeover(h: Arc<dyn Harness>) {
    let (s1, s2) = (h.open().await, h.open().await);
    let (a, b) = (holder("a"), holder("b"));
    for ttl in young_ttls(&h) {
        let e = election("expiry");
        let sent = std::time::Instant::now();
        let la = acquired(&*s1, &req(&e, &a, ttl)).await;
        if held_if_young(&*s2, &req(&e, &b, h.long_ttl()), sent, ttl).await.is_none() {
            continue;
        }
        outlive_ttl(ttl).await;
        assert_eq!(s2.get(&e).await.unwrap(), None, "an expired lease is not reported by get");
        let lb = acquired(&*s2, &req(&e, &b, h.long_ttl())).await;
        assert!(lb.token > la.token, "takeover after expiry must raise the token ({} then {})", la.token, lb.token);
        return;
    }
    panic!("the machine was too slow to check a lease within its TTL, whatever the TTL tried");
}

/// Checks duties 2 and 5 (an expired lease cannot be renewed back to life).
async fn renew_after_expiry_fails(h: Arc<dyn Harness>) {
    let s = h.open().await;
    let e = election("late-renew");
    let a = holder("a");
    let l = acquired(&*s, &req(&e, &a, h.short_ttl())).await;
    outlive(&h).await;
    assert!(
        matches!(s.renew(&l, h.long_ttl()).await.unwrap(), Renew::Lost(None)),
        "a lease that has expired cannot be renewed back to life"
    );
}

/// Checks duty 5 (renewal of a replaced grant is `Lost`, naming the new holder).
async fn renew_after_takeover_fails(h: Arc<dyn Harness>) {
    let (s1, s2) = (h.open().await, h.open().await);
    let e = election("takeover");
    let (a, b) = (holder("a"), holder("b"));
    let la = acquired(&*s1, &req(&e, &a, h.short_ttl())).await;
    // The other candidate has seen the lease (an observer-judged store times from there).
    s2.get(&e).await.unwrap().expect("the lease is live");
    outlive(&h).await;
    let lb = acquired(&*s2, &req(&e, &b, h.long_ttl())).await;
    match s1.renew(&la, h.long_ttl()).await.unwrap() {
        Renew::Lost(Some(cur)) => assert_eq!((cur.holder, cur.token), (b.clone(), lb.token)),
        other => {
            panic!("the old holder's renewal must be Lost naming the new holder, got {other:?}")
        }
    }
    // Same holder id, old token: still refused (a different grant).
    let stale = LeaseRecord { holder: b.clone(), token: la.token, ..lb.clone() };
    assert!(matches!(s1.renew(&stale, h.long_ttl()).await.unwrap(), Renew::Lost(_)), "renew compares the token too");
    assert_eq!(s1.get(&e).await.unwrap().unwrap().holder, b);
}

/// Checks duties 4 and 5 (release clears only its own grant, any number of times).
async fn release_clears_and_is_idempotent(h: Arc<dyn Harness>) {
    let (s1, s2) = (h.open().await, h.open().await);
    let e = election("release");
    let (a, b) = (holder("a"), holder("b"));
    let la = acquired(&*s1, &req(&e, &a, h.long_ttl())).await;
    s1.release(&la).await.unwrap();
    assert_eq!(s1.get(&e).await.unwrap(), None);
    s1.release(&la).await.unwrap();
    let lb = acquired(&*s2, &req(&e, &b, h.long_ttl())).await;
    assert!(lb.token > la.token, "a grant after release gets a larger token");
    assert!(matches!(s1.renew(&la, h.long_ttl()).await.unwrap(), Renew::Lost(_)), "a released lease cannot be renewed");
    s1.release(&la).await.unwrap();
    assert_eq!(s2.get(&e).await.unwrap().unwrap().holder, b, "a stale release leaves the new holder alone");
}

/// Checks duties 3 and 5 (a release that does not match changes nothing and is not an error).
async fn release_by_non_holder_is_harmless(h: Arc<dyn Harness>) {
    let (s1, s2) = (h.open().await, h.open().await);
    let e = election("foreign-release");
    let (a, b) = (holder("a"), holder("b"));
    let la = acquired(&*s1, &req(&e, &a, h.long_ttl())).await;
    let forged = LeaseRecord { holder: b.clone(), ..la.clone() };
    s2.release(&forged).await.expect("a release that does not match is not an error");
    let wrong_token = LeaseRecord { token: FencingToken(la.token.0 + 1000), ..la.clone() };
    s2.release(&wrong_token).await.unwrap();
    let got = s2.get(&e).await.unwrap().expect("the record must survive");
    assert_eq!((got.holder, got.token), (a, la.token));
    held(&*s2, &req(&e, &b, h.long_ttl())).await;
}

/// Checks duty 5 (each release of a batch is its own compare-and-set on holder, token
/// and revision).
async fn release_many_releases_each_lease_on_its_own(h: Arc<dyn Harness>) {
    let (s1, s2) = (h.open().await, h.open().await);
    let root = unique("release-many");
    let (a, b) = (holder("a"), holder("b"));
    let mut leases = Vec::new();
    for i in 0..5 {
        let e = ElectionName::new(format!("conformance/{root}/{i}")).unwrap();
        leases.push(acquired(&*s1, &req(&e, &a, h.long_ttl())).await);
    }
    // 1 was renewed since (its copy has an older revision); 2 was taken over by b.
    let Renew::Renewed(renewed) = s1.renew(&leases[1], h.long_ttl()).await.unwrap() else {
        panic!("lease 1 must renew")
    };
    s2.evict(&leases[2].election, Evict::Now).await.unwrap();
    let lb = acquired(&*s2, &req(&leases[2].election, &b, h.long_ttl())).await;
    let answers = s1.release_many(&leases).await;
    assert_eq!(answers.len(), leases.len(), "one answer per lease");
    for (i, (l, ans)) in leases.iter().zip(answers).enumerate() {
        ans.unwrap_or_else(|e| panic!("release {i} failed: {e}"));
        let now = s2.get(&l.election).await.unwrap().map(|r| (r.holder, r.token, r.revision));
        match i {
            1 => assert_eq!(
                now,
                Some((a.clone(), l.token, renewed.revision)),
                "a release of an older revision keeps the term"
            ),
            2 => {
                assert_eq!(now, Some((b.clone(), lb.token, lb.revision)), "a release of another's term changes nothing")
            }
            _ => assert_eq!(now, None, "lease {i} must be released"),
        }
    }
    assert!(s1.release_many(&[]).await.is_empty());
    // Released elections are free again, with larger tokens.
    let again = acquired(&*s2, &req(&leases[0].election, &b, h.long_ttl())).await;
    assert!(again.token > leases[0].token);
}

/// A holder that re-acquires its own live record keeps the token; a release sent in
/// its earlier term and delivered late must not clear the current term.
/// Checks duty 5 (release compares the revision too).
async fn delayed_release_of_an_earlier_term_is_harmless(h: Arc<dyn Harness>) {
    let s = h.open().await;
    let e = election("late-release");
    let a = holder("a");
    let first = acquired(&*s, &req(&e, &a, h.long_ttl())).await;
    let second = acquired(&*s, &req(&e, &a, h.long_ttl())).await;
    assert_eq!(second.token, first.token);
    s.release(&first).await.unwrap();
    let got = s.get(&e).await.unwrap().expect("a release carrying an older revision leaves the record");
    assert_eq!(got.token, second.token);
    s.release(&second).await.unwrap();
    assert_eq!(s.get(&e).await.unwrap(), None, "the release of the current revision clears it");
}

/// Checks duty 6 (eviction after term blocks others until the holder releases).
async fn evict_after_term_blocks_until_release(h: Arc<dyn Harness>) {
    let (s1, s2, op) = (h.open().await, h.open().await, h.open().await);
    let e = election("evict-release");
    let (a, b) = (holder("a"), holder("b"));
    let la = acquired(&*s1, &req(&e, &a, h.long_ttl())).await;
    let ev = op.evict(&e, Evict::AfterTerm).await.unwrap().expect("evict names who it evicted");
    assert_eq!((ev.holder, ev.token), (a.clone(), la.token));
    let shown = op.get(&e).await.unwrap().expect("an evicted lease stays until its holder releases");
    assert!(shown.evicted, "get shows the eviction");
    let evicted = match s1.renew(&la, h.long_ttl()).await.unwrap() {
        Renew::Lost(Some(cur)) => {
            assert!(cur.evicted && cur.holder == a && cur.token == la.token, "Lost shows our own evicted record");
            cur
        }
        other => panic!("an evicted holder must not renew, got {other:?}"),
    };
    let blocked = held(&*s2, &req(&e, &b, h.long_ttl())).await;
    assert!(blocked.evicted && blocked.holder == a, "nobody else may acquire while the evicted holder may still act");
    held(&*s1, &req(&e, &a, h.long_ttl())).await;
    // The eviction moved the revision: the holder releases the record as Lost showed it.
    s1.release(&evicted).await.unwrap();
    let lb = acquired(&*s2, &req(&e, &b, h.long_ttl())).await;
    assert!(lb.token > la.token);
}

/// Checks duty 6 (eviction after term blocks others until the term runs out).
async fn evict_after_term_blocks_until_term_ends(h: Arc<dyn Harness>) {
    let (s1, s2, op) = (h.open().await, h.open().await, h.open().await);
    let (a, b) = (holder("a"), holder("b"));
    for ttl in young_ttls(&h) {
        let e = election("evict-term");
        let sent = std::time::Instant::now();
        let la = acquired(&*s1, &req(&e, &a, ttl)).await;
        op.evict(&e, Evict::AfterTerm).await.unwrap().unwrap();
        if held_if_young(&*s2, &req(&e, &b, h.long_ttl()), sent, ttl).await.is_none() {
            continue;
        }
        outlive_ttl(ttl).await;
        let lb = acquired(&*s2, &req(&e, &b, h.long_ttl())).await;
        assert!(lb.token > la.token, "the term ran out; the next grant gets a larger token");
        return;
    }
    panic!("the machine was too slow to check a lease within its TTL, whatever the TTL tried");
}

/// Checks duties 4 and 6 (eviction now frees the election; the token counter survives).
async fn evict_now_frees_at_once(h: Arc<dyn Harness>) {
    let (s1, s2, op) = (h.open().await, h.open().await, h.open().await);
    let e = election("evict-now");
    let (a, b) = (holder("a"), holder("b"));
    let la = acquired(&*s1, &req(&e, &a, h.long_ttl())).await;
    op.evict(&e, Evict::Now).await.unwrap().unwrap();
    assert_eq!(op.get(&e).await.unwrap(), None);
    let lb = acquired(&*s2, &req(&e, &b, h.long_ttl())).await;
    assert!(lb.token > la.token, "the token counter survives an eviction");
    assert!(matches!(s1.renew(&la, h.long_ttl()).await.unwrap(), Renew::Lost(_)));
}

/// Checks duty 3 (evicting an empty election answers `None`).
async fn evict_without_holder(h: Arc<dyn Harness>) {
    let s = h.open().await;
    let e = election("evict-empty");
    assert_eq!(s.evict(&e, Evict::AfterTerm).await.unwrap(), None);
    assert_eq!(s.evict(&e, Evict::Now).await.unwrap(), None);
    acquired(&*s, &req(&e, &holder("a"), h.long_ttl())).await;
}

/// Checks duty 4 (tokens only grow across release, eviction and expiry).
async fn tokens_increase_across_release_evict_expiry(h: Arc<dyn Harness>) {
    let s = h.open().await;
    let e = election("tokens");
    let mut last = FencingToken(0);
    let mut check = |t: FencingToken, how: &str| {
        assert!(t > last, "token {t} after {how} is not above {last}");
        last = t;
    };
    for round in 0..3 {
        let l = acquired(&*s, &req(&e, &holder("r"), h.long_ttl())).await;
        check(l.token, "release");
        s.release(&l).await.unwrap();
        let l = acquired(&*s, &req(&e, &holder("n"), h.long_ttl())).await;
        check(l.token, "a release");
        s.evict(&e, Evict::Now).await.unwrap();
        let l = acquired(&*s, &req(&e, &holder("t"), h.long_ttl())).await;
        check(l.token, "an eviction now");
        s.evict(&e, Evict::AfterTerm).await.unwrap();
        let evicted = s.get(&e).await.unwrap().expect("evicted, not yet released");
        s.release(&evicted).await.unwrap();
        let l = acquired(&*s, &req(&e, &holder("x"), h.short_ttl())).await;
        check(l.token, "an eviction after term");
        if round == 0 {
            outlive(&h).await;
        } else {
            s.release(&l).await.unwrap();
        }
    }
}

/// Checks duty 4 (tokens only grow across a restart of a durable store).
async fn tokens_increase_across_restart(h: Arc<dyn Harness>) {
    let s = h.open().await;
    let e = election("restart");
    let l = acquired(&*s, &req(&e, &holder("a"), h.long_ttl())).await;
    s.release(&l).await.unwrap();
    // The work ledger is as durable as the tokens (duty 8): a key done before a restart
    // stays done.
    let k = key("restart");
    let written = match s.ledger_write(&e, &k, b"kept", None, Duration::from_secs(3600)).await.unwrap() {
        LedgerWrite::Written(v) => v,
        LedgerWrite::Conflict => panic!("a first ledger write must succeed"),
    };
    drop(s);
    if !h.restart().await {
        eprintln!("conformance: the store cannot be restarted; skipping the restart case");
        return;
    }
    let s = h.open().await;
    let l2 = acquired(&*s, &req(&e, &holder("b"), h.long_ttl())).await;
    assert!(l2.token > l.token, "token {} after a restart is not above {}", l2.token, l.token);
    if h.durable() {
        let kept = s.ledger_read(&e, &k).await.unwrap().expect("a ledger entry survives a restart");
        assert_eq!((kept.value.as_slice(), kept.version.as_str()), (&b"kept"[..], written.as_str()));
    }
}

/// Checks duty 1 (concurrent acquires: exactly one wins, the others see it).
async fn racing_candidates_one_winner(h: Arc<dyn Harness>) {
    const N: usize = 8;
    let e = election("race");
    let mut stores = Vec::new();
    for _ in 0..N {
        stores.push(h.open().await);
    }
    let start = Arc::new(tokio::sync::Barrier::new(N));
    let mut tasks = Vec::new();
    for (i, s) in stores.into_iter().enumerate() {
        let r = req(&e, &holder(&format!("c{i}")), h.long_ttl());
        let start = start.clone();
        tasks.push(tokio::spawn(async move {
            start.wait().await;
            loop {
                match s.try_acquire(&r).await {
                    Ok(a) => return a,
                    Err(err) if err.is_retryable() => tokio::time::sleep(Duration::from_millis(5)).await,
                    Err(err) => panic!("racing acquire failed: {err}"),
                }
            }
        }));
    }
    let mut winners = Vec::new();
    let mut named = Vec::new();
    for t in tasks {
        match t.await.unwrap() {
            Acquire::Acquired(l) => winners.push(l),
            Acquire::Held(rec) => named.push(rec),
        }
    }
    assert_eq!(winners.len(), 1, "exactly one racer wins, got {}", winners.len());
    for rec in named {
        assert_eq!((&rec.holder, rec.token), (&winners[0].holder, winners[0].token), "losers see the winner");
    }
}

/// Checks `list` (a prefix is literal text, released elections are not listed).
async fn list_by_prefix(h: Arc<dyn Harness>) {
    let s = h.open().await;
    let root = format!("conformance/{}", unique("list"));
    let names = ["jobs/a", "jobs/b", "jobsx", "other/c"].map(|n| ElectionName::new(format!("{root}/{n}")).unwrap());
    let mut leases = Vec::new();
    for n in &names {
        leases.push(acquired(&*s, &req(n, &holder("l"), h.long_ttl())).await);
    }
    let listed: Vec<_> = s.list(&format!("{root}/jobs/")).await.unwrap().into_iter().map(|r| r.election).collect();
    assert_eq!(listed, vec![names[0].clone(), names[1].clone()], "list returns the prefix's elections, by name");
    s.release(&leases[1]).await.unwrap();
    let listed: Vec<_> = s.list(&format!("{root}/")).await.unwrap().into_iter().map(|r| r.election).collect();
    assert_eq!(listed, vec![names[0].clone(), names[2].clone(), names[3].clone()], "released elections are not listed");
    // Characters that are wildcards in SQL LIKE or globs are literal in a prefix.
    assert!(s.list(&format!("{root}/jobs%")).await.unwrap().is_empty());
    assert!(s.list(&format!("{root}/job_")).await.unwrap().is_empty());
    assert!(s.list(&format!("{root}/jobs*")).await.unwrap().is_empty());
}

/// Checks duty 7 (a watch tells of acquire, release and eviction).
async fn watch_tells_of_changes(h: Arc<dyn Harness>) {
    let (s1, s2) = (h.open().await, h.open().await);
    let e = election("watch");
    let Some(mut w) = s2.watch(&e) else {
        eprintln!("conformance: the store cannot watch; skipping the watch case");
        return;
    };
    let (a, b) = (holder("a"), holder("b"));
    // Settle: some stores need a moment before the subscription is live.
    tokio::time::sleep(Duration::from_millis(100)).await;
    let la = acquired(&*s1, &req(&e, &a, h.long_ttl())).await;
    wait_for(&mut w, "the acquire", |ev| ev.as_ref().is_some_and(|r| r.holder == a && r.token == la.token)).await;
    s1.release(&la).await.unwrap();
    wait_for(&mut w, "the release", |ev| ev.is_none()).await;
    let lb = acquired(&*s1, &req(&e, &b, h.long_ttl())).await;
    wait_for(&mut w, "the next acquire", |ev| ev.as_ref().is_some_and(|r| r.holder == b && r.token == lb.token)).await;
    s1.evict(&e, Evict::AfterTerm).await.unwrap();
    wait_for(&mut w, "the eviction", |ev| ev.as_ref().is_some_and(|r| r.evicted)).await;
}

/// Checks that a watch opened before the store restarts (its server stopped and started
/// again, every connection dropped and made anew) goes on telling of changes after it,
/// so that followers are still woken at once instead of finding out by polling.
async fn watch_goes_on_after_a_restart(h: Arc<dyn Harness>) {
    let (s1, s2) = (h.open().await, h.open().await);
    let e = election("watch-restart");
    let Some(mut w) = s2.watch(&e) else {
        eprintln!("conformance: the store cannot watch; skipping the watch-after-restart case");
        return;
    };
    let a = holder("a");
    tokio::time::sleep(Duration::from_millis(100)).await;
    let la = acquired(&*s1, &req(&e, &a, h.long_ttl())).await;
    wait_for(&mut w, "the acquire", |ev| ev.as_ref().is_some_and(|r| r.holder == a && r.token == la.token)).await;
    if !h.restart().await {
        eprintln!("conformance: the store cannot be restarted; skipping the watch-after-restart case");
        return;
    }
    // Both handles reconnect on their own; until they have, calls fail as retryable. The
    // watcher's handle serves again before the next acquire, so that a lease with a short
    // TTL cannot run out before the watcher could have seen it. A store that keeps nothing
    // across a restart has lost the lease: releasing it is harmless.
    until_served(|| s2.get(&e)).await;
    until_served(|| s1.release(&la)).await;
    let b = holder("b");
    let rb = req(&e, &b, h.long_ttl());
    let lb = match until_served(|| s1.try_acquire(&rb)).await {
        Acquire::Acquired(l) => l,
        Acquire::Held(cur) => panic!("after the restart and a release, {} still holds {e}", cur.holder),
    };
    let mut reopened = 0;
    let pred = |ev: &Option<LeaseRecord>| ev.as_ref().is_some_and(|r| r.holder == b && r.token == lb.token);
    wait_rewatching(&*s2, &e, &mut w, &mut reopened, "an acquire after the restart", pred).await;
    s1.release(&lb).await.unwrap();
    wait_rewatching(&*s2, &e, &mut w, &mut reopened, "a release after the restart", |ev| ev.is_none()).await;
}

/// Calls `op` until it does not fail as retryable (for 30 s at most).
async fn until_served<T, F, Fut>(op: F) -> T
where
    F: Fn() -> Fut,
    Fut: Future<Output = Result<T, tenure::StoreError>>,
{
    let t0 = std::time::Instant::now();
    loop {
        match op().await {
            Ok(v) => return v,
            Err(err) if err.is_retryable() && t0.elapsed() < Duration::from_secs(30) => {
                tokio::time::sleep(Duration::from_millis(50)).await
            }
            Err(err) => panic!("the store did not serve again after its restart: {err}"),
        }
    }
}

/// Like [`wait_for`], but a watch that fails or ends is opened again, as the runtime does
/// (a watch ends at its first error); at most twice over the case, each counted in
/// `reopened`. A new watch starts with the record as it stands.
async fn wait_rewatching(
    store: &dyn LeaseStore,
    e: &ElectionName,
    w: &mut tenure::store::WatchStream,
    reopened: &mut usize,
    what: &str,
    pred: impl Fn(&Option<LeaseRecord>) -> bool,
) {
    let found = tokio::time::timeout(Duration::from_secs(10), async {
        loop {
            match w.next().await {
                Some(Ok(ev)) if pred(&ev) => return true,
                Some(Ok(_)) => {}
                Some(Err(_)) | None => {
                    *reopened += 1;
                    assert!(*reopened <= 2, "the watch failed or ended {reopened} times after the restart");
                    *w = store.watch(e).expect("the store watched before");
                }
            }
        }
    })
    .await;
    assert_eq!(found, Ok(true), "the watch did not tell of {what}");
}

async fn wait_for(w: &mut tenure::store::WatchStream, what: &str, pred: impl Fn(&Option<LeaseRecord>) -> bool) {
    let found = tokio::time::timeout(Duration::from_secs(10), async {
        while let Some(ev) = w.next().await {
            if pred(&ev.expect("the watch failed")) {
                return true;
            }
        }
        false
    })
    .await;
    assert_eq!(found, Ok(true), "the watch did not tell of {what}");
}

fn key(name: &str) -> WorkKey {
    WorkKey::new(unique(name)).unwrap()
}

/// Checks duty 8 (a ledger write compares the version read; versions never come back;
/// values are opaque bytes up to the limit).
async fn ledger_writes_compare_versions(h: Arc<dyn Harness>) {
    let (s1, s2) = (h.open().await, h.open().await);
    let (e, k) = (election("ledger-cas"), key("k"));
    let keep = Duration::from_secs(3600);
    assert_eq!(s1.ledger_read(&e, &k).await.unwrap(), None, "a fresh key has no entry");
    let v1 = match s1.ledger_write(&e, &k, b"one", None, keep).await.unwrap() {
        LedgerWrite::Written(v) => v,
        LedgerWrite::Conflict => panic!("a first write where no entry exists must succeed"),
    };
    let read = s2.ledger_read(&e, &k).await.unwrap().expect("another handle reads the entry");
    assert_eq!((read.value.as_slice(), read.version.as_str()), (&b"one"[..], v1.as_str()));
    assert_eq!(
        s2.ledger_write(&e, &k, b"two", None, keep).await.unwrap(),
        LedgerWrite::Conflict,
        "create over an entry"
    );
    let bytes: Vec<u8> = (0..MAX_LEDGER_VALUE).map(|i| (i % 256) as u8).collect();
    let v2 = match s2.ledger_write(&e, &k, &bytes, Some(&v1), keep).await.unwrap() {
        LedgerWrite::Written(v) => v,
        LedgerWrite::Conflict => panic!("a write at the version read must succeed"),
    };
    assert_ne!(v2, v1, "a write moves the version");
    assert_eq!(
        s1.ledger_write(&e, &k, b"late", Some(&v1), keep).await.unwrap(),
        LedgerWrite::Conflict,
        "a stale version"
    );
    assert_eq!(s1.ledger_read(&e, &k).await.unwrap().unwrap().value, bytes, "values are opaque bytes");
    // Writing the same value again still moves the version: a writer that read the
    // entry before cannot match it afterwards.
    let v3 = match s1.ledger_write(&e, &k, &bytes, Some(&v2), keep).await.unwrap() {
        LedgerWrite::Written(v) => v,
        LedgerWrite::Conflict => panic!("a write at the version read must succeed"),
    };
    assert!(v3 != v2 && v3 != v1, "versions never come back ({v1}, {v2}, {v3})");
    assert_eq!(s2.ledger_write(&e, &k, b"x", Some(&v2), keep).await.unwrap(), LedgerWrite::Conflict);
    let too_big = vec![b'x'; MAX_LEDGER_VALUE + 1];
    let err = s1.ledger_write(&e, &k, &too_big, Some(&v3), keep).await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Invalid, "an oversized value is refused: {err}");
}

/// Checks duty 8 (entries of different keys and elections are apart from each other and
/// from the lease; an entry past its keep reads as absent only if a create can then
/// write it, so that a key let go can be claimed again).
async fn ledger_entries_are_kept_apart(h: Arc<dyn Harness>) {
    let s = h.open().await;
    let (e1, e2) = (election("ledger-a"), election("ledger-b"));
    let (k1, k2) = (key("k1"), key("k2"));
    let keep = Duration::from_secs(3600);
    for (e, k, v) in [(&e1, &k1, "11"), (&e1, &k2, "12"), (&e2, &k1, "21")] {
        assert!(matches!(s.ledger_write(e, k, v.as_bytes(), None, keep).await.unwrap(), LedgerWrite::Written(_)));
    }
    for (e, k, v) in [(&e1, &k1, "11"), (&e1, &k2, "12"), (&e2, &k1, "21")] {
        assert_eq!(s.ledger_read(e, k).await.unwrap().unwrap().value, v.as_bytes(), "{e} {k}");
    }
    // The ledger is not the lease: the election has no leader, and a grant leaves it be.
    assert_eq!(s.get(&e1).await.unwrap(), None, "a ledger entry is not a lease");
    let l = acquired(&*s, &req(&e1, &holder("a"), h.long_ttl())).await;
    s.release(&l).await.unwrap();
    assert_eq!(s.ledger_read(&e1, &k1).await.unwrap().unwrap().value, b"11");
    assert!(s.list(e1.as_str()).await.unwrap().is_empty(), "ledger entries are not listed as leases");
    // A short keep: once it has passed, the entry may be let go, and if a read says so,
    // a create must succeed.
    let k3 = key("k3");
    let sent = std::time::Instant::now();
    assert!(matches!(s.ledger_write(&e2, &k3, b"short", None, h.short_ttl()).await.unwrap(), LedgerWrite::Written(_)));
    let kept = s.ledger_read(&e2, &k3).await.unwrap().is_some();
    assert!(kept || sent.elapsed() >= h.short_ttl(), "an entry is kept at least its keep");
    outlive(&h).await;
    match s.ledger_read(&e2, &k3).await.unwrap() {
        None => assert!(
            matches!(s.ledger_write(&e2, &k3, b"again", None, h.long_ttl()).await.unwrap(), LedgerWrite::Written(_)),
            "an entry read as absent must take a create"
        ),
        Some(kept) => assert_eq!(kept.value, b"short", "an entry kept longer is unchanged"),
    }
}

/// Checks duty 8 through the ledger's rules ([`tenure::ledger`]) with the store's own
/// tokens: a key runs once; a later term reruns a key whose term ended first, with a larger
/// token; an earlier term's late report or claim is refused; at most once never reruns.
async fn ledger_claims_follow_the_terms(h: Arc<dyn Harness>) {
    use tenure::ledger::{self, Claim, Guarantee, Policy, Refusal};
    let s = h.open().await;
    let e = election("ledger-terms");
    let (a, b) = (holder("a"), holder("b"));
    let policy = Policy::default();
    let keep = policy.keep;
    let la = acquired(&*s, &req(&e, &a, h.long_ttl())).await;
    let done_key = key("done");
    let cut_key = key("cut");
    let once_key = key("once");
    for k in [&done_key, &cut_key] {
        assert_eq!(
            ledger::claim(&*s, &e, k, la.token, &a, &policy).await.unwrap(),
            Claim::Run { attempt: 1, after: None }
        );
    }
    let at_most_once = Policy { guarantee: Guarantee::AtMostOnce, ..policy };
    assert!(matches!(ledger::claim(&*s, &e, &once_key, la.token, &a, &at_most_once).await.unwrap(), Claim::Run { .. }));
    assert!(ledger::complete(&*s, &e, &done_key, la.token, keep).await.unwrap(), "the claiming term completes");
    s.release(&la).await.unwrap();
    let lb = acquired(&*s, &req(&e, &b, h.long_ttl())).await;
    assert!(lb.token > la.token);
    match ledger::claim(&*s, &e, &done_key, lb.token, &b, &policy).await.unwrap() {
        Claim::Done(entry) => assert_eq!((entry.token, entry.holder), (la.token, a.clone()), "the run that finished"),
        other => panic!("a done key was claimed again: {other:?}"),
    }
    match ledger::claim(&*s, &e, &cut_key, lb.token, &b, &policy).await.unwrap() {
        Claim::Run { attempt: 2, after: Some(prev) } => assert_eq!(prev.token, la.token, "the rerun names the cut run"),
        other => panic!("a key whose term ended first must run again: {other:?}"),
    }
    assert!(
        !ledger::complete(&*s, &e, &cut_key, la.token, keep).await.unwrap(),
        "the earlier term's late report is refused"
    );
    match ledger::claim(&*s, &e, &cut_key, la.token, &a, &policy).await.unwrap() {
        Claim::Refused(entry, Refusal::LaterTerm) => assert_eq!(entry.token, lb.token),
        other => panic!("an earlier term's claim after a later one must be refused: {other:?}"),
    }
    assert!(ledger::complete(&*s, &e, &cut_key, lb.token, keep).await.unwrap());
    assert!(matches!(
        ledger::claim(&*s, &e, &once_key, lb.token, &b, &at_most_once).await.unwrap(),
        Claim::Refused(_, Refusal::MayHaveRun)
    ));
    // Failures leave the key open until the attempts are used up.
    let failing = key("failing");
    let one_try = Policy { attempts: 2, ..policy };
    assert!(matches!(
        ledger::claim(&*s, &e, &failing, lb.token, &b, &one_try).await.unwrap(),
        Claim::Run { attempt: 1, .. }
    ));
    assert!(ledger::fail(&*s, &e, &failing, lb.token, keep).await.unwrap());
    assert!(matches!(
        ledger::claim(&*s, &e, &failing, lb.token, &b, &one_try).await.unwrap(),
        Claim::Run { attempt: 2, .. }
    ));
    assert!(ledger::fail(&*s, &e, &failing, lb.token, keep).await.unwrap());
    assert!(matches!(
        ledger::claim(&*s, &e, &failing, lb.token, &b, &one_try).await.unwrap(),
        Claim::Refused(_, Refusal::NoAttemptsLeft)
    ));
    let entry = ledger::read(&*s, &e, &cut_key).await.unwrap().expect("the entry");
    assert_eq!((entry.state, entry.token, entry.attempts), (ledger::WorkState::Done, lb.token, 2));
}

/// Checks the record (metadata of up to 4 KiB, binary-safe, reaches observers).
async fn metadata_round_trips(h: Arc<dyn Harness>) {
    let (s1, s2) = (h.open().await, h.open().await);
    let e = election("metadata");
    let meta = b"host=10.0.0.7:8080 \x00\xff binary-safe".to_vec();
    let r = req(&e, &holder("a"), h.long_ttl()).with_metadata(meta.clone());
    let l = acquired(&*s1, &r).await;
    assert_eq!(l.metadata, meta);
    assert_eq!(s2.get(&e).await.unwrap().unwrap().metadata, meta, "observers see the metadata");
    assert_eq!(held(&*s2, &req(&e, &holder("b"), h.long_ttl())).await.metadata, meta);
    let e2 = election("metadata-max");
    let full = vec![b'x'; MAX_METADATA];
    assert_eq!(acquired(&*s1, &req(&e2, &holder("a"), h.long_ttl()).with_metadata(full.clone())).await.metadata, full);
}

/// Checks duty 3 (bad requests are `Invalid` errors and write nothing).
async fn invalid_requests_are_refused(h: Arc<dyn Harness>) {
    let s = h.open().await;
    let e = election("invalid");
    let big = req(&e, &holder("a"), h.long_ttl()).with_metadata(vec![0u8; MAX_METADATA + 1]);
    let err = s.try_acquire(&big).await.expect_err("oversized metadata must be refused");
    assert_eq!(err.kind(), ErrorKind::Invalid);
    assert!(err.to_string().contains("metadata"), "the error says what is wrong: {err}");
    let zero = req(&e, &holder("a"), Duration::ZERO);
    let err = s.try_acquire(&zero).await.expect_err("a zero TTL must be refused");
    assert_eq!(err.kind(), ErrorKind::Invalid);
    assert!(err.to_string().contains("TTL"), "{err}");
    assert_eq!(s.get(&e).await.unwrap(), None, "refused requests write nothing");
    for bad in ["", "a//b", "../x", "a b", "x/./y"] {
        let err = ElectionName::new(bad).expect_err("bad names never reach a store");
        assert!(err.to_string().contains("1 to 200 characters"), "{err}");
    }
}

/// The TTL of the runtime cases' electors: short enough that a handover, which waits for
/// a renewal, comes within seconds; the store's only TTL where it serves one.
/// The candidates of `all` that hold a valid term now, as (holder index, token).
fn holding(all: &[tenure::Elector]) -> Vec<(u32, FencingToken)> {
    all.iter().filter_map(|c| c.current().filter(|l| l.is_valid())).map(|l| (l.holder_index(), l.token())).collect()
}

/// Waits until `done` says so of what of `all` holds, checking that never more than two
/// hold; panics after ten TTLs.
async fn until_holding(
    all: &[tenure::Elector],
    ttl: Duration,
    what: &str,
    done: impl Fn(&[(u32, FencingToken)]) -> bool,
) -> Vec<(u32, FencingToken)> {
    let t0 = tokio::time::Instant::now();
    loop {
        let now = holding(all);
        assert!(now.len() <= 2, "{} of two holders hold at once: {now:?}", now.len());
        if done(&now) {
            return now;
        }
        assert!(t0.elapsed() < ttl * 10, "{what} within {:?}: {now:?}", ttl * 10);
        tokio::time::sleep(ttl / 50).await;
    }
}

/// Checks the slots of an election with several holders (`Config::holders`), which are
/// ordinary leases under names of their own: of three candidates of two holders, two
/// hold, never three, each with its own index and token; `holders` lists them; a slot
/// freed by a release is granted again under a larger token, and so is one whose lease
/// expired.
async fn several_holders(h: Arc<dyn Harness>) {
    let ttl = elector_ttl(&*h);
    let e = election("holders");
    let candidate = |store: Arc<dyn LeaseStore>, name: &str| {
        let c = tenure::Elector::builder(store, e.as_str())
            .holder(holder(name).as_str())
            .ttl(ttl)
            .holders(2)
            .build()
            .expect("a valid elector");
        c.start();
        c
    };
    let mut all = Vec::new();
    for name in ["a", "b", "c"] {
        all.push(candidate(h.open().await, name));
    }
    let two = until_holding(&all, ttl, "two hold", |now| now.len() == 2).await;
    let indices: std::collections::BTreeSet<u32> = two.iter().map(|(i, _)| *i).collect();
    assert_eq!(indices, [0, 1].into(), "one holder per index");
    let observer = h.open().await;
    let listed = tenure::holders::holders(&*observer, &e).await.expect("listing the holders failed");
    let listed: std::collections::BTreeSet<(u32, FencingToken)> = listed.iter().map(|h| (h.index, h.token)).collect();
    assert_eq!(listed, two.iter().copied().collect(), "holders lists both, with their tokens");
    // A release: the third takes the freed index at once, under a larger token.
    let leaving = all.iter().position(|c| c.current().is_some()).expect("a holder");
    let (index, token) = all[leaving].current().map(|l| (l.holder_index(), l.token())).unwrap();
    all.remove(leaving).shutdown().await;
    let again = until_holding(&all, ttl, "the released slot is held again, and two hold", |now| {
        now.len() == 2 && now.iter().any(|(i, t)| *i == index && *t > token)
    })
    .await;
    assert_eq!(again.len(), 2, "two hold again: {again:?}");
    for c in all {
        c.shutdown().await;
    }
    // An expiry: a slot whose holder never renews is granted again once it runs out.
    let e2 = election("holders-expiry");
    let slot0 = tenure::holders::slot_name(&e2, 0).unwrap();
    let slot1 = tenure::holders::slot_name(&e2, 1).unwrap();
    let s = h.open().await;
    let short = h.short_ttl();
    let gone = acquired(&*s, &req(&slot0, &holder("gone"), short)).await;
    // Slot 1 stays held, where the store serves a longer TTL; a store of one TTL (a NATS
    // bucket) lets both expire, and either is then granted again.
    let one_ttl = h.long_ttl() <= short;
    let other = acquired(&*s, &req(&slot1, &holder("stays"), h.long_ttl())).await;
    let late = tenure::Elector::builder(h.open().await, e2.as_str())
        .holder(holder("late").as_str())
        .ttl(ttl)
        .holders(2)
        .build()
        .expect("a valid elector");
    let l = tokio::time::timeout(short * 4 + ttl * 10, late.leadership())
        .await
        .expect("the expired slot is granted again")
        .expect("the candidate leads");
    let index = l.holder_index();
    if !one_ttl {
        assert_eq!(index, 0, "it holds the slot that expired");
    }
    let before = if index == 0 { gone.token } else { other.token };
    assert!(l.token() > tenure::holders::holder_token(before, index), "under a larger token");
    drop(l);
    late.shutdown().await;
}

fn elector_ttl(h: &dyn Harness) -> Duration {
    h.long_ttl().min(Duration::from_secs(3)).max(h.short_ttl())
}

fn announcing(
    store: Arc<dyn LeaseStore>,
    e: &ElectionName,
    holder: &HolderId,
    priority: i32,
    ttl: Duration,
) -> tenure::Elector {
    tenure::Elector::builder(store, e.as_str())
        .holder(holder.as_str())
        .ttl(ttl)
        .announce(true)
        .priority(priority)
        .metadata(format!("{holder}:8080").into_bytes())
        .build()
        .expect("a valid elector")
}

/// Checks `list` and `release` as the runtime's presence uses them: announcing
/// candidates are listed with their priority and metadata, and one that stops is not.
async fn announced_candidates_are_listed(h: Arc<dyn Harness>) {
    let ttl = elector_ttl(&*h);
    let e = election("announce");
    let (a, b) = (holder("a"), holder("b"));
    let ea = announcing(h.open().await, &e, &a, 1, ttl);
    let eb = announcing(h.open().await, &e, &b, -2, ttl);
    ea.start();
    eb.start();
    let observer = h.open().await;
    let listed = tokio::time::timeout(ttl * 10, async {
        loop {
            let c = tenure::candidates(&*observer, &e).await.expect("listing the candidates failed");
            if c.len() == 2 {
                return c;
            }
            tokio::time::sleep(ttl / 20).await;
        }
    })
    .await
    .expect("both candidates are listed");
    let mut seen: Vec<(HolderId, i32, Vec<u8>)> =
        listed.into_iter().map(|c| (c.holder, c.priority, c.metadata)).collect();
    seen.sort();
    let mut want =
        vec![(a.clone(), 1, format!("{a}:8080").into_bytes()), (b.clone(), -2, format!("{b}:8080").into_bytes())];
    want.sort();
    assert_eq!(seen, want, "holder, priority and metadata as announced");
    eb.shutdown().await;
    // The one that stopped withdrew its presence. The other's can be missing from a
    // reading while a slow store keeps its renewal from landing in time (a presence
    // that is not renewed is not live), so the reading is taken again until it shows
    // the other, or the time runs out.
    let mut left = Vec::new();
    let settled = tokio::time::timeout(ttl * 10, async {
        loop {
            left = tenure::candidates(&*observer, &e).await.unwrap().into_iter().map(|c| c.holder).collect();
            if left.contains(&a) {
                return;
            }
            tokio::time::sleep(ttl / 20).await;
        }
    })
    .await;
    assert!(settled.is_ok(), "the candidate still running is listed again within ten TTLs: {left:?}");
    assert_eq!(left, [a], "a candidate that stopped is not listed");
    ea.shutdown().await;
}

/// Checks `list`, `release`, `evict` and watches (or polling) as priority handover uses
/// them: a candidate of higher priority takes over once the leader's work has stopped,
/// and a reservation keeps every other announcing candidate out until it ends.
async fn priority_handover_and_reservations(h: Arc<dyn Harness>) {
    let ttl = elector_ttl(&*h);
    let e = election("priority");
    let (a, b) = (holder("a"), holder("b"));
    let ea = announcing(h.open().await, &e, &a, 0, ttl);
    let la = tokio::time::timeout(ttl * 10, ea.leadership()).await.expect("a leads in time").expect("a leads");
    // a's work: runs until its term ends, then takes a moment to stop.
    let a_work = tokio::spawn(async move {
        la.cancelled().await;
        tokio::time::sleep(Duration::from_millis(100)).await;
        let stopped = tokio::time::Instant::now();
        drop(la);
        stopped
    });
    let eb = announcing(h.open().await, &e, &b, 5, ttl);
    let lb = tokio::time::timeout(ttl * 10, eb.leadership()).await.expect("b takes over in time").expect("b leads");
    let b_started = tokio::time::Instant::now();
    let a_stopped = tokio::time::timeout(ttl, a_work).await.expect("a's work stopped").unwrap();
    assert!(a_stopped <= b_started, "b's term began only after a's work had stopped");
    // An operator hands over to x, which announces itself but whose acquires fail: the
    // reservation keeps a out until it ends.
    let x = holder("x");
    let x_store = tenure::faults::FaultyStore::new(h.open().await).only(&[tenure::faults::Op::Acquire]);
    let ex = announcing(Arc::new(x_store.clone()), &e, &x, 0, ttl);
    ex.start();
    tokio::time::timeout(ttl * 10, async {
        while !tenure::candidates(&*h.open().await, &e).await.unwrap().iter().any(|c| c.holder == x) {
            tokio::time::sleep(ttl / 20).await;
        }
    })
    .await
    .expect("x is listed");
    x_store.set(tenure::faults::Fault::Unavailable);
    let mut a_events = ea.events();
    let reserved = tokio::time::Instant::now();
    tenure::reserve(&*h.open().await, &e, &x, &holder("operator"), ttl).await.expect("reserving failed");
    let b_token = lb.token();
    let b_work = tokio::spawn(async move { lb.cancelled().await });
    h.open().await.evict(&e, Evict::AfterTerm).await.expect("evict failed");
    tokio::time::timeout(ttl * 2, b_work).await.expect("b stepped down").unwrap();
    eb.shutdown().await;
    // Until the reservation ends, a may win the lease but gives it back before any work.
    let elected = tokio::time::timeout(ttl * 10, async {
        loop {
            match a_events.recv().await {
                Ok(tenure::Event::Elected { token }) => return token,
                Ok(_) => {}
                Err(err) => panic!("a's events ended: {err}"),
            }
        }
    })
    .await
    .expect("a leads once the reservation has run out");
    // The store times the reservation from when it received it (a moment after `reserved`),
    // on a clock that may run a little fast.
    assert!(reserved.elapsed() >= ttl.mul_f64(0.97), "a led {:?} into a reservation of {ttl:?}", reserved.elapsed());
    assert!(elected > b_token);
    ea.shutdown().await;
    ex.shutdown().await;
}
