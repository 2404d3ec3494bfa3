//! The runtime's steps one at a time, on a [`MemoryStore`](crate::MemoryStore) and paused
//! time: each step's effect on the store and on what the step decides next.

use super::follow::{Attempt, Follower};
use super::lead::{Leading, TermClock, vet_win};
use super::*;
use crate::record::Evict;

const TTL: Duration = Duration::from_secs(10);

fn candidate(store: &Arc<crate::MemoryStore>, holder: &str) -> Elector {
    let store: Arc<dyn LeaseStore> = store.clone();
    Elector::builder(store, "jobs/sweeper").holder(holder).ttl(TTL).jitter(0.0).build().unwrap()
}

fn request(e: &Elector, holder: &str) -> AcquireRequest {
    AcquireRequest::new(e.election().clone(), HolderId::new(holder).unwrap(), TTL)
}

async fn acquired(store: &crate::MemoryStore, req: &AcquireRequest) -> LeaseRecord {
    match store.try_acquire(req).await.unwrap() {
        Acquire::Acquired(rec) => rec,
        Acquire::Held(rec) => panic!("held by {}", rec.holder),
    }
}

fn view(shared: &Shared) -> View<'_> {
    View { shared, leader: None, lease_ends: None, vacant_since: None, takeover: None, seen: None }
}

#[tokio::test(start_paused = true)]
async fn a_term_is_dated_from_its_send_time_and_each_renewal_moves_its_deadline() {
    let store = Arc::new(crate::MemoryStore::new());
    let e = candidate(&store, "a");
    let shared = &*e.shared;
    let sent = shared.clock.now();
    tokio::time::advance(Duration::from_millis(300)).await;
    let mut clock = TermClock::start(shared, sent);
    let first = TermTimes::after_success(&shared.cfg, sent);
    assert_eq!(clock.times.deadline, first.deadline, "dated from the send time, not the answer's");
    assert!(clock.over(shared.clock.now()).is_none());
    tokio::time::advance(Duration::from_secs(3)).await;
    let renewal = shared.clock.now();
    clock.renewed(renewal);
    assert_eq!(clock.times.deadline, first.deadline + Duration::from_millis(3300));
    assert_eq!(*clock.deadline.lock().unwrap(), clock.times.deadline, "the holders read the new deadline");
    assert_eq!(clock.call_until(renewal), renewal + shared.cfg.request_timeout);
    let late = clock.times.stop_at - Duration::from_millis(1);
    assert_eq!(clock.call_until(late), clock.times.stop_at, "a call never runs past the step-down time");
    tokio::time::advance(clock.times.stop_at - shared.clock.now()).await;
    assert_eq!(clock.over(shared.clock.now()), Some(StepDownReason::RenewFailed));
    tokio::time::advance(clock.times.deadline - shared.clock.now()).await;
    assert_eq!(clock.over(shared.clock.now()), Some(StepDownReason::DeadlinePassed));
}

#[tokio::test(start_paused = true)]
async fn a_single_winner_that_finds_slots_held_gives_the_lease_back_and_stops() {
    let store = Arc::new(crate::MemoryStore::new());
    let e = candidate(&store, "a");
    let shared = &*e.shared;
    let slot = crate::holders::slot_name(e.election(), 0).unwrap();
    acquired(&store, &AcquireRequest::new(slot, HolderId::new("b").unwrap(), TTL)).await;
    let lease = acquired(&store, &request(&e, "a")).await;
    let clock = TermClock::start(shared, shared.clock.now());
    let vetted = vet_win(shared, None, &lease, &clock).await;
    assert_eq!(vetted, Some((StepDownReason::ShuttingDown, Duration::ZERO)));
    assert_eq!(store.get(e.election()).await.unwrap(), None, "the lease went back");
    assert!(matches!(e.failure(), Some(ElectError::Unsupported(_))));
    // Nothing held: the win stands.
    let store2 = Arc::new(crate::MemoryStore::new());
    let e2 = candidate(&store2, "a");
    let shared2 = &*e2.shared;
    let lease2 = acquired(&store2, &request(&e2, "a")).await;
    let clock2 = TermClock::start(shared2, shared2.clock.now());
    assert_eq!(vet_win(shared2, None, &lease2, &clock2).await, None);
}

#[tokio::test(start_paused = true)]
async fn a_renewal_answered_with_another_holder_or_an_eviction_ends_the_term() {
    let store = Arc::new(crate::MemoryStore::new());
    let e = candidate(&store, "a");
    let shared = &*e.shared;
    let sent = shared.clock.now();
    let mut lease = acquired(&store, &request(&e, "a")).await;
    let mut term = Leading::new(shared, None, &lease, TermClock::start(shared, sent), sent);
    // A renewal that the store answers: the term runs on from its send time.
    tokio::time::advance(Duration::from_secs(2)).await;
    assert_eq!(term.renew(&mut lease).await, None);
    assert_eq!(
        term.clock.times.deadline,
        TermTimes::after_success(&shared.cfg, sent + Duration::from_secs(2)).deadline
    );
    // Evicted: the term ends, and the record as it stands is the one to release.
    store.evict(e.election(), Evict::AfterTerm).await.unwrap();
    assert_eq!(term.renew(&mut lease).await, Some(StepDownReason::Evicted));
    assert!(lease.evicted);
    // Taken by another after the release: lost to it.
    store.release(&lease).await.unwrap();
    let theirs = acquired(&store, &request(&e, "b")).await;
    let mut old = lease.clone();
    old.evicted = false;
    assert_eq!(term.renew(&mut old).await, Some(StepDownReason::Lost { to: Some(theirs.leader()) }));
}

#[tokio::test(start_paused = true)]
async fn a_step_down_waits_for_the_work_then_releases_and_answers_the_resigner() {
    let store = Arc::new(crate::MemoryStore::new());
    let e = candidate(&store, "a");
    let shared = &*e.shared;
    let mut view = view(shared);
    let sent = shared.clock.now();
    let mut lease = acquired(&store, &request(&e, "a")).await;
    let mut term = Leading::new(shared, None, &lease, TermClock::start(shared, sent), sent);
    term.publish(&mut view);
    let work = e.current().expect("published once the cool-down (none) is over");
    let cancelled = work.cancellation_token();
    // The work winds down for 4 s after it is cancelled; a resigner waits for the release.
    tokio::spawn(async move {
        work.cancelled().await;
        tokio::time::sleep(Duration::from_secs(4)).await;
        drop(work);
    });
    let (tx, mut answered) = oneshot::channel();
    term.resigners.push(Resign { done: tx, stand_aside: Duration::from_secs(7) });
    let started = shared.clock.now();
    let mut unhealthy = 0;
    // While the work winds down, the lease stands and the resigner waits.
    let meanwhile = async {
        cancelled.cancelled().await;
        tokio::time::sleep(Duration::from_secs(3)).await;
        assert!(store.get(e.election()).await.unwrap().is_some(), "released while the work still ran");
        assert!(answered.try_recv().is_err(), "the resigner was answered before the release");
    };
    let ((reason, stand_aside), ()) =
        tokio::join!(term.step_down(&mut view, &mut lease, StepDownReason::Resigned, &mut unhealthy), meanwhile);
    assert!(cancelled.is_cancelled());
    assert_eq!((reason, stand_aside, unhealthy), (StepDownReason::Resigned, Duration::from_secs(7), 1));
    assert!(shared.clock.now() >= started + Duration::from_secs(4), "released only after the work stopped");
    assert!(e.current().is_none());
    assert_eq!(store.get(e.election()).await.unwrap(), None);
    answered.await.expect("the resigner is answered");
}

#[tokio::test(start_paused = true)]
async fn a_follower_waits_for_a_held_lease_to_end_and_then_wins_it() {
    let store = Arc::new(crate::MemoryStore::new());
    let e = candidate(&store, "a");
    let shared = &*e.shared;
    let mut view = view(shared);
    let theirs = acquired(&store, &request(&e, "b")).await;
    let mut f = Follower::new(shared, None);
    let t0 = shared.clock.now();
    assert!(matches!(f.attempt(&mut view).await, Attempt::Wait));
    assert_eq!(f.wake_at, t0 + TTL, "watched: it wakes when the lease would end");
    store.release(&theirs).await.unwrap();
    f.on_watch(&mut view, Some(Ok(None)));
    assert!(f.due, "a lease seen gone is attempted at once");
    assert!(matches!(f.attempt(&mut view).await, Attempt::Won(rec, _) if rec.holder.as_str() == "a"));
}

#[tokio::test(start_paused = true)]
async fn after_an_unanswered_acquire_the_follower_confirms_a_grant_it_finds_with_a_renewal() {
    let store = Arc::new(crate::MemoryStore::new());
    let e = candidate(&store, "a");
    let shared = &*e.shared;
    let mut view = view(shared);
    // The acquire was applied, but its answer never came.
    let granted = acquired(&store, &request(&e, "a")).await;
    let mut f = Follower::new(shared, None);
    f.unresolved = true;
    tokio::time::advance(Duration::from_secs(1)).await;
    match f.attempt(&mut view).await {
        Attempt::Won(rec, _) => {
            assert_eq!(rec.token, granted.token, "the same grant, confirmed");
            assert!(rec.revision != granted.revision, "by a renewal");
        }
        _ => panic!("not won"),
    }
}

/// A [`MemoryStore`](crate::MemoryStore) whose watch, like ZooKeeper's, reports a grant's
/// start, its changes and its end but not its renewals, nor a report that repeats its last
/// (no lease after no lease), and which says so ([`LeaseStore::watch_reports_expiry`]) when
/// `reports` is set. While `blind`, the watch reports nothing (a grant that came and went
/// before the store's feed read it). Counts the looks (`try_acquire` and `get`).
struct RenewalsUnheard {
    inner: Arc<crate::MemoryStore>,
    reports: bool,
    blind: Arc<std::sync::atomic::AtomicBool>,
    looks: std::sync::atomic::AtomicUsize,
}

impl RenewalsUnheard {
    fn new(reports: bool) -> Self {
        RenewalsUnheard {
            inner: Arc::new(crate::MemoryStore::new()),
            reports,
            blind: Default::default(),
            looks: Default::default(),
        }
    }
}

#[async_trait::async_trait]
impl LeaseStore for RenewalsUnheard {
    async fn try_acquire(&self, req: &AcquireRequest) -> Result<Acquire, StoreError> {
        self.looks.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        self.inner.try_acquire(req).await
    }
    async fn renew(&self, held: &LeaseRecord, ttl: Duration) -> Result<Renew, StoreError> {
        self.inner.renew(held, ttl).await
    }
    async fn release(&self, held: &LeaseRecord) -> Result<(), StoreError> {
        self.inner.release(held).await
    }
    async fn get(&self, election: &ElectionName) -> Result<Option<LeaseRecord>, StoreError> {
        self.looks.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        self.inner.get(election).await
    }
    async fn list(&self, prefix: &str) -> Result<Vec<LeaseRecord>, StoreError> {
        self.inner.list(prefix).await
    }
    async fn evict(&self, election: &ElectionName, how: Evict) -> Result<Option<LeaseRecord>, StoreError> {
        self.inner.evict(election, how).await
    }
    fn watch(&self, election: &ElectionName) -> Option<crate::store::WatchStream> {
        // What the last report said: a lease's grant, eviction and metadata, or no lease.
        type Said = Option<(HolderId, crate::FencingToken, bool, Vec<u8>)>;
        let mut last: Option<Said> = None;
        let blind = self.blind.clone();
        Some(Box::pin(self.inner.watch(election)?.filter(move |ev| {
            if blind.load(std::sync::atomic::Ordering::SeqCst) {
                return false;
            }
            let now = match ev {
                Ok(Some(r)) => Some((r.holder.clone(), r.token, r.evicted, r.metadata.clone())),
                _ => None,
            };
            let repeat = last.as_ref() == Some(&now);
            last = Some(now);
            !repeat
        })))
    }
    fn watch_reports_expiry(&self) -> bool {
        self.reports
    }
    fn describe(&self) -> String {
        "renewals-unheard".to_string()
    }
}

#[tokio::test(start_paused = true)]
async fn a_follower_of_a_store_whose_watch_reports_expiry_waits_for_the_watch() {
    use std::sync::atomic::Ordering::SeqCst;
    for reports in [false, true] {
        let store = Arc::new(RenewalsUnheard::new(reports));
        let candidate = |holder: &str| {
            let s: Arc<dyn LeaseStore> = store.clone();
            Elector::builder(s, "jobs/sweeper").holder(holder).ttl(TTL).jitter(0.0).build().unwrap()
        };
        let a = candidate("a");
        a.start();
        while a.current().is_none() {
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        let b = candidate("b");
        b.start();
        tokio::time::sleep(Duration::from_millis(10)).await;
        let first = store.looks.load(SeqCst);
        // The leader renews every TTL/3; none of its renewals reaches the follower's watch.
        tokio::time::sleep(TTL * (crate::store::LOOK_AGAIN_TTLS - 1)).await;
        let looks = store.looks.load(SeqCst) - first;
        if reports {
            assert_eq!(looks, 0, "the follower looked while the watch said nothing");
            tokio::time::sleep(TTL * 2).await;
            assert!(store.looks.load(SeqCst) > first, "the follower never looked again");
        } else {
            assert!(looks >= 5, "without the promise, the follower looks as each lease it saw ends: {looks}");
        }
        assert!(a.current().is_some() && b.current().is_none());
        a.shutdown().await;
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert!(b.current().is_some(), "the follower did not take over on the watch's report of the release");
        b.shutdown().await;
    }
}

#[tokio::test(start_paused = true)]
async fn shutdown_all_stops_every_candidate_and_releases_every_lease() {
    let store = Arc::new(crate::MemoryStore::new());
    let electors: Vec<Elector> = (0..5)
        .map(|i| {
            let s: Arc<dyn LeaseStore> = store.clone();
            Elector::builder(s, format!("jobs/{i}")).holder("a").ttl(TTL).build().unwrap()
        })
        .collect();
    for e in &electors {
        e.start();
    }
    while electors.iter().any(|e| e.current().is_none()) {
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    Elector::shutdown_all(electors.clone()).await;
    for e in &electors {
        assert!(
            e.current().is_none() && e.shared.stopped.set.load(std::sync::atomic::Ordering::SeqCst),
            "{} still campaigns",
            e.election()
        );
        assert_eq!(store.get(e.election()).await.unwrap(), None, "{} was not released", e.election());
    }
}

/// The watch is counted on to report the end only of a grant it reported itself: a grant
/// a follower heard of from its own acquire, which came and went before the watch saw it,
/// is looked at again when it would expire, not ten TTLs later.
#[tokio::test(start_paused = true)]
async fn a_grant_the_watch_never_reported_is_looked_at_again_when_it_would_expire() {
    let store = Arc::new(RenewalsUnheard::new(true));
    let s: Arc<dyn LeaseStore> = store.clone();
    let b = Elector::builder(s, "jobs/sweeper").holder("b").ttl(TTL).jitter(0.0).build().unwrap();
    let x = AcquireRequest::new(b.election().clone(), HolderId::new("x").unwrap(), TTL);
    // x's whole term passes while the watch sees nothing of it.
    store.blind.store(true, std::sync::atomic::Ordering::SeqCst);
    let xs = acquired(&store.inner, &x).await;
    b.start();
    tokio::time::sleep(Duration::from_millis(10)).await;
    assert!(b.current().is_none(), "b won a held lease");
    store.inner.release(&xs).await.unwrap();
    // b's task takes the release from its watch (and drops it) before the watch sees again.
    tokio::time::sleep(Duration::from_millis(10)).await;
    assert!(b.current().is_none(), "b heard of the release");
    store.blind.store(false, std::sync::atomic::Ordering::SeqCst);
    tokio::time::sleep(TTL + Duration::from_secs(1)).await;
    assert!(b.current().is_some(), "b waited past the end of a grant its watch never reported");
    b.shutdown().await;
}
