//! Several holders of one election (`Config::holders`), on paused time.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

use tenure::holders::{holder_index, holders};
use tenure::{ElectionName, Elector, LeaseStore, MemoryStore};
use tenure_testkit::faults::{Fault, FaultyStore};

const TTL: Duration = Duration::from_secs(3);

fn candidate(store: Arc<dyn LeaseStore>, holder: &str, n: u32) -> Elector {
    let e = Elector::builder(store, "jobs/consumers").holder(holder).ttl(TTL).holders(n).build().unwrap();
    e.start();
    e
}

/// The candidates that hold a valid term now, as (holder index, token).
fn leading(cands: &[Elector]) -> Vec<(u32, u64)> {
    cands.iter().filter_map(|c| c.current().filter(|l| l.is_valid())).map(|l| (l.holder_index(), l.token().0)).collect()
}

/// Cuts off one of two holders of `cands` (each on its own of `faulty`), then checks for
/// four TTLs that never more than two hold at once; answers how long after the cut
/// another candidate took the cut-off holder's slot.
async fn replaced_after_cutting_one_off(cands: &[Elector], faulty: &[FaultyStore]) -> Duration {
    let cut = cands.iter().position(|c| c.current().is_some()).unwrap();
    faulty[cut].set(Fault::Hang);
    let cut_at = tokio::time::Instant::now();
    let mut replaced = None;
    while cut_at.elapsed() < TTL * 4 {
        let now = leading(cands);
        assert!(now.len() <= 2, "at most two hold at once: {now:?}");
        let others = cands.iter().enumerate().filter(|(i, c)| *i != cut && c.current().is_some()).count();
        if others == 2 && replaced.is_none() {
            replaced = Some(cut_at.elapsed());
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    replaced.expect("another candidate took the cut-off holder's slot")
}

#[tokio::test(start_paused = true)]
async fn two_of_five_hold_each_with_its_own_index_and_token_and_a_freed_slot_is_taken_again() {
    let store: Arc<dyn LeaseStore> = Arc::new(MemoryStore::new());
    let cands: Vec<Elector> = (0..5).map(|i| candidate(store.clone(), &format!("c{i}"), 2)).collect();
    tokio::time::sleep(Duration::from_millis(50)).await;
    let now = leading(&cands);
    assert_eq!(now.len(), 2, "two hold: {now:?}");
    let indices: BTreeSet<u32> = now.iter().map(|l| l.0).collect();
    assert_eq!(indices, BTreeSet::from([0, 1]), "one holder per index");
    assert_ne!(now[0].1, now[1].1, "each holder has its own token");
    for (i, t) in &now {
        assert_eq!(holder_index(tenure::FencingToken(*t)), *i, "the token tells its index");
    }
    let listed = holders(&*store, &ElectionName::new("jobs/consumers").unwrap()).await.unwrap();
    assert_eq!(listed.iter().map(|h| (h.index, h.token.0)).collect::<BTreeSet<_>>(), now.iter().copied().collect());

    // A holder that stops hands its slot over at once; the new term's token is larger.
    let stopping = cands.iter().position(|c| c.current().is_some()).unwrap();
    let old = cands[stopping].current().unwrap();
    let (old_index, old_token) = (old.holder_index(), old.token());
    drop(old);
    cands[stopping].shutdown().await;
    tokio::time::sleep(Duration::from_millis(50)).await;
    let after = leading(&cands);
    assert_eq!(after.len(), 2, "the freed slot was taken again: {after:?}");
    let (_, t) = after.iter().find(|l| l.0 == old_index).expect("its index is held again");
    assert!(*t > old_token.0, "the slot's new token {t} is above the old one {old_token}");
}

#[tokio::test(start_paused = true)]
async fn a_holder_cut_off_is_replaced_within_a_ttl_and_never_three_hold() {
    let inner: Arc<dyn LeaseStore> = Arc::new(MemoryStore::new());
    let faulty: Vec<FaultyStore> = (0..5).map(|_| FaultyStore::new(inner.clone())).collect();
    let cands: Vec<Elector> =
        faulty.iter().enumerate().map(|(i, f)| candidate(Arc::new(f.clone()), &format!("c{i}"), 2)).collect();
    tokio::time::sleep(Duration::from_millis(50)).await;
    let took = replaced_after_cutting_one_off(&cands, &faulty).await;
    assert!(took <= TTL + Duration::from_millis(500), "replaced {took:?} after the cut, within a TTL");
}

#[tokio::test(start_paused = true)]
async fn a_candidate_whose_acquires_lose_their_answers_never_holds_two_slots() {
    let inner = Arc::new(MemoryStore::new());
    let lossy = FaultyStore::new(inner.clone());
    lossy.set(Fault::LoseResponse);
    let a = candidate(Arc::new(lossy.clone()), "a", 3);
    tokio::time::sleep(TTL / 2).await;
    let e = ElectionName::new("jobs/consumers").unwrap();
    let held = holders(&*inner, &e).await.unwrap();
    assert_eq!(held.len(), 1, "one acquire applied, and no other tried before it was read: {held:?}");
    assert!(a.current().is_none(), "its answer was lost, so the candidate does not lead");
    lossy.set(Fault::None);
    let l = a.leadership().await.unwrap();
    assert_eq!(l.holder_index(), held[0].index, "it resolves the slot it was granted");
    assert_eq!(holders(&*inner, &e).await.unwrap().len(), 1);
}

#[tokio::test]
async fn settings_that_several_holders_cannot_have_are_refused() {
    let store: Arc<dyn LeaseStore> = Arc::new(MemoryStore::new());
    let err = |b: tenure::ElectorBuilder| b.build().err().map(|e| e.to_string()).unwrap_or_default();
    assert!(err(Elector::builder(store.clone(), "x").holders(0)).contains("holders"));
    assert!(err(Elector::builder(store.clone(), "x").holders(1001)).contains("holders"));
    assert!(err(Elector::builder(store.clone(), "x").holders(2).priority(3)).contains("priority"));
    let long = "a".repeat(190);
    assert!(err(Elector::builder(store.clone(), &long).holders(2)).contains("at most"));
    assert!(Elector::builder(store.clone(), &long).holders(1).build().is_ok(), "one holder has no such limit");
    // A unit of work is done by one holder: `run_once` refuses, and runs nothing.
    let e = Elector::builder(store, "x").holders(2).build().unwrap();
    let key = tenure::WorkKey::new("k").unwrap();
    let ran = std::sync::atomic::AtomicBool::new(false);
    let r = e
        .run_once(&key, tenure::ledger::Policy::default(), |_, _| {
            ran.store(true, std::sync::atomic::Ordering::SeqCst);
            async { Ok::<(), ()>(()) }
        })
        .await;
    assert!(matches!(&r, Err(tenure::ElectError::Unsupported(m)) if m.contains("one holder")), "{r:?}");
    assert!(!ran.load(std::sync::atomic::Ordering::SeqCst));
}

/// On real time: a follower whose acquires fail at once (a store refusing writes after a
/// failover) while a slot it saw held has run out retries once a retry period, not in a
/// loop with no pause.
#[tokio::test]
async fn a_follower_whose_acquires_fail_retries_at_its_pace() {
    use tenure::store::AcquireRequest;
    let inner: Arc<dyn LeaseStore> = Arc::new(MemoryStore::new());
    let e = ElectionName::new("jobs/consumers").unwrap();
    let slot = |i| tenure::holders::slot_name(&e, i).unwrap();
    let grant = |i, who: &str, ttl| AcquireRequest::new(slot(i), tenure::HolderId::new(who).unwrap(), ttl);
    inner.try_acquire(&grant(0, "x", Duration::from_millis(200))).await.unwrap();
    inner.try_acquire(&grant(1, "y", Duration::from_secs(30))).await.unwrap();
    let faulty = FaultyStore::new(inner.clone());
    let c = candidate(Arc::new(faulty.clone()), "c", 2);
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert!(c.current().is_none(), "both slots are held");
    faulty.set(Fault::Unavailable);
    let before = faulty.calls();
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let calls = faulty.calls() - before;
    // A retry period is TTL / 10 = 300 ms: about five tries, with jitter.
    assert!(calls <= 20, "{calls} store calls in 1.5 s while the store refused");
    c.shutdown().await;
}

/// A candidate of one holder and one of several on one election never both run: whichever
/// wins second finds the other kind holding before its term is handed out, gives its
/// lease back and stops with an error; started together, or one after the other.
#[tokio::test(start_paused = true)]
async fn one_holder_and_several_never_run_beside_each_other() {
    for (first, gap) in [(1u32, Duration::ZERO), (2, Duration::ZERO), (1, TTL), (2, TTL)] {
        let store: Arc<dyn LeaseStore> = Arc::new(MemoryStore::new());
        let second = if first == 1 { 2 } else { 1 };
        let a = candidate(store.clone(), "a", first);
        tokio::time::sleep(gap).await;
        let b = candidate(store.clone(), "b", second);
        for _ in 0..200 {
            tokio::time::sleep(Duration::from_millis(10)).await;
            let (la, lb) = (a.current().is_some(), b.current().is_some());
            assert!(!(la && lb), "both kinds lead (first {first} holder(s), then {second}, {gap:?} apart)");
        }
        let refused = |e: &Elector| e.current().is_none() && !e.is_healthy();
        assert!(refused(&a) || refused(&b), "one of them stopped (first {first}, then {second}, {gap:?} apart)");
        if !gap.is_zero() {
            assert!(refused(&b) && a.current().is_some(), "the later one is refused, the first leads on");
        }
        let err = if refused(&b) { b.leadership().await } else { a.leadership().await };
        assert!(
            matches!(&err, Err(tenure::ElectError::Unsupported(m)) if m.contains("needs the same number of holders")),
            "{err:?}"
        );
    }
}

/// Followers of slots on a store that cannot watch ask at each retry period, as a
/// follower of one lease does: the end a reading gives (a TTL from the reading) is only a
/// guess there, and a renewal seen at that guess would put the next try off by a TTL.
#[tokio::test(start_paused = true)]
async fn on_a_store_that_cannot_watch_a_cut_off_holder_is_replaced_within_a_ttl_and_a_retry_period() {
    let inner: Arc<dyn LeaseStore> = Arc::new(MemoryStore::new());
    // A store that cannot watch and does not say how long a grant has left (an Azure blob
    // lease): a follower learns that a slot is free only by asking.
    let faulty: Vec<FaultyStore> =
        (0..5).map(|_| FaultyStore::new(inner.clone()).without_watch().without_remaining()).collect();
    let cands: Vec<Elector> =
        faulty.iter().enumerate().map(|(i, f)| candidate(Arc::new(f.clone()), &format!("c{i}"), 2)).collect();
    // Past a renewal, and past the followers' first readings by half a TTL: their guesses
    // of the end then fall before the real one.
    tokio::time::sleep(TTL / 2).await;
    assert_eq!(leading(&cands).len(), 2, "two hold");
    let took = replaced_after_cutting_one_off(&cands, &faulty).await;
    // The last renewal came before the cut, so the grant ends within a TTL of it; a
    // follower then asks within a retry period (a tenth of the TTL, jittered).
    assert!(took <= TTL + TTL / 5, "replaced {took:?} after the cut");
}
