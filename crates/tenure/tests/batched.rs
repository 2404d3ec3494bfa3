//! Renewals gathered by `Batched`: many electors, few store calls, every answer to its
//! own caller.

use std::sync::Arc;
use std::time::Duration;

use tenure::faults::{FaultyStore, Op};
use tenure::store::{Acquire, AcquireRequest, Renew};
use tenure::{Batched, ElectionName, Elector, Event, Evict, HolderId, LeaseStore, MemoryStore};

const TTL: Duration = Duration::from_secs(3);

/// A `Batched` store over a memory store, and the counting store between them (a
/// `renew_many` or a `release_many` is one call).
fn batched() -> (FaultyStore, Arc<dyn LeaseStore>) {
    let counting = FaultyStore::new(Arc::new(MemoryStore::new()));
    let store: Arc<dyn LeaseStore> = Arc::new(Batched::new(Arc::new(counting.clone())));
    (counting, store)
}

/// Builds the candidate of election `shard/i` on `store`.
fn shard(store: &Arc<dyn LeaseStore>, i: usize) -> Elector {
    Elector::builder(store.clone(), format!("shard/{i}")).holder("p1").ttl(TTL).build().unwrap()
}

#[tokio::test(start_paused = true)]
async fn a_thousand_elections_renew_in_a_few_calls_and_none_is_lost() {
    let (counting, store) = batched();
    let ttl = TTL;
    let mut electors = Vec::new();
    let mut events = Vec::new();
    for i in 0..1000 {
        let e = shard(&store, i);
        events.push(e.events());
        e.start();
        electors.push(e);
    }
    tokio::time::sleep(ttl * 10).await;
    assert!(electors.iter().all(|e| e.current().is_some()), "every election is still led");
    let (renews, batches) = (counting.calls_of(Op::Renew), counting.calls_of(Op::RenewMany));
    assert_eq!(renews, 0, "no renewal went around the batcher");
    // Ten TTLs at three renewals per TTL: about 30,000 renewals, in far fewer calls.
    assert!(batches > 0 && batches <= 300, "{batches} renew_many calls for ~30,000 renewals");
    for rx in &mut events {
        while let Ok(ev) = rx.try_recv() {
            assert!(!matches!(ev, Event::SteppedDown { .. }), "a term was lost: {ev:?}");
        }
    }
    for e in &electors {
        e.shutdown().await;
    }
}

#[tokio::test(start_paused = true)]
async fn electors_started_at_different_times_renew_together_on_the_grid() {
    let (counting, store) = batched();
    let ttl = TTL;
    let mut electors = Vec::new();
    // Started over a whole renew interval, 10 ms apart: without the grid their renewals
    // would fall in a hundred different windows.
    for i in 0..100 {
        let e = shard(&store, i);
        e.start();
        electors.push(e);
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    // One renew interval for the first (early) renewals to land on the grid.
    tokio::time::sleep(ttl).await;
    let before = counting.calls_of(Op::RenewMany);
    tokio::time::sleep(ttl * 3).await;
    let batches = counting.calls_of(Op::RenewMany) - before;
    assert!(electors.iter().all(|e| e.current().is_some()), "every election is still led");
    // Three TTLs at one renewal per TTL/3: nine rounds, each one call.
    assert!(batches <= 10, "{batches} renew_many calls for nine rounds of renewals");
    for e in &electors {
        e.shutdown().await;
    }
}

#[tokio::test(start_paused = true)]
async fn each_caller_gets_its_own_answer() {
    let memory = MemoryStore::new();
    let batched = Batched::new(Arc::new(memory.clone()));
    let ttl = Duration::from_secs(5);
    let mut leases = Vec::new();
    for i in 0..3 {
        let req = AcquireRequest::new(
            ElectionName::new(format!("b/{i}")).unwrap(),
            HolderId::new(format!("h{i}")).unwrap(),
            ttl,
        );
        match memory.try_acquire(&req).await.unwrap() {
            Acquire::Acquired(l) => leases.push(l),
            Acquire::Held(_) => unreachable!("fresh elections"),
        }
    }
    // The middle one is taken over by someone else.
    memory.evict(&leases[1].election, Evict::Now).await.unwrap();
    let other = AcquireRequest::new(leases[1].election.clone(), HolderId::new("other").unwrap(), ttl);
    memory.try_acquire(&other).await.unwrap();
    let (a, b, c) =
        tokio::join!(batched.renew(&leases[0], ttl), batched.renew(&leases[1], ttl), batched.renew(&leases[2], ttl));
    assert!(matches!(a, Ok(Renew::Renewed(r)) if r.holder == leases[0].holder));
    assert!(matches!(b, Ok(Renew::Lost(Some(r))) if r.holder.as_str() == "other"));
    assert!(matches!(c, Ok(Renew::Renewed(r)) if r.holder == leases[2].holder));
}

#[tokio::test(start_paused = true)]
async fn a_thousand_leaders_that_stop_together_release_in_a_few_calls() {
    let (counting, store) = batched();
    let electors: Vec<Elector> = (0..1000).map(|i| shard(&store, i)).collect();
    electors.iter().for_each(Elector::start);
    tokio::time::sleep(TTL).await;
    assert!(electors.iter().all(|e| e.current().is_some()), "every election is led");
    // The process stops: every elector shuts down at once.
    let mut stops = tokio::task::JoinSet::new();
    for e in electors {
        stops.spawn(async move { e.shutdown().await });
    }
    stops.join_all().await;
    assert_eq!(counting.calls_of(Op::Release), 0, "no release went around the batcher");
    let batches = counting.calls_of(Op::ReleaseMany);
    assert!((1..=10).contains(&batches), "{batches} release_many calls for 1,000 releases");
    assert!(counting.list("shard/").await.unwrap().is_empty(), "every lease was released, none left to expire");
}

/// A release whose caller stopped waiting before its batch went out (its request timed
/// out) is still sent: the election is free at once instead of a TTL later. A renewal
/// whose caller stopped waiting is not.
#[tokio::test(start_paused = true)]
async fn a_release_is_sent_even_when_its_caller_stopped_waiting() {
    let (counting, store) = batched();
    let holder = HolderId::new("p").unwrap();
    let mut leases = Vec::new();
    for name in ["given-up/release", "given-up/renewal"] {
        let req = AcquireRequest::new(ElectionName::new(name).unwrap(), holder.clone(), TTL);
        let Acquire::Acquired(l) = store.try_acquire(&req).await.unwrap() else { panic!("{name} is free") };
        leases.push(l);
    }
    // Each caller gives up before the batch's window has passed.
    let quick = Duration::from_millis(1);
    assert!(tokio::time::timeout(quick, store.release(&leases[0])).await.is_err());
    assert!(tokio::time::timeout(quick, store.renew(&leases[1], TTL)).await.is_err());
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert_eq!(counting.calls_of(Op::ReleaseMany), 1, "the release went out");
    assert!(counting.get(&leases[0].election).await.unwrap().is_none(), "the election is free");
    assert_eq!(counting.calls_of(Op::RenewMany), 0, "a renewal nobody waits for is not sent");
}

#[tokio::test(start_paused = true)]
async fn calls_that_go_straight_to_the_store_take_turns_and_every_one_is_answered() {
    // Each call takes 10 ms at the store; 4 may run at once.
    let slow = FaultyStore::new(Arc::new(MemoryStore::new()));
    slow.set(tenure::faults::Fault::Delay(10));
    let store: Arc<dyn LeaseStore> = Arc::new(Batched::new(Arc::new(slow.clone())).max_in_flight(4));
    let reads: Vec<_> = (0..40)
        .map(|i| {
            let store = store.clone();
            tokio::spawn(async move { store.get(&ElectionName::new(format!("read/{i}")).unwrap()).await })
        })
        .collect();
    tokio::time::sleep(Duration::from_millis(5)).await;
    assert_eq!(slow.calls_of(Op::Get), 4, "reads beyond the limit reached the store");
    tokio::time::sleep(Duration::from_millis(10)).await;
    assert_eq!(slow.calls_of(Op::Get), 8, "the next reads did not take the turns that came free");
    for r in reads {
        assert_eq!(r.await.unwrap().unwrap(), None);
    }
    assert_eq!(slow.calls_of(Op::Get), 40);
}
