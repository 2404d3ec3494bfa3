//! `Elector::run_once` on paused time: a key runs once across candidates, again after a
//! run cut short (with a larger token), never again with at most once, and failures use
//! up attempts.

use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use tenure::ledger::{Guarantee, Policy, Refusal, WorkState};
use tenure::{Elector, LeaseStore, MemoryStore, Once, WorkKey};
use tenure_testkit::faults::{Fault, FaultyStore};

const TTL: Duration = Duration::from_secs(3);

fn elector(store: Arc<dyn LeaseStore>, holder: &str) -> Elector {
    Elector::builder(store, "jobs/report").holder(holder).ttl(TTL).jitter(0.0).build().unwrap()
}

fn key() -> WorkKey {
    WorkKey::new("2026-11-27").unwrap()
}

#[tokio::test(start_paused = true)]
async fn a_key_runs_once_across_candidates_and_later_calls() {
    let store = Arc::new(MemoryStore::new());
    let runs = Arc::new(AtomicU32::new(0));
    let mut tasks = Vec::new();
    for h in ["a", "b", "c"] {
        let (e, runs) = (elector(store.clone(), h), runs.clone());
        tasks.push(tokio::spawn(async move {
            e.run_once(&key(), Policy::default(), |_, _| {
                let runs = runs.clone();
                async move {
                    runs.fetch_add(1, Ordering::SeqCst);
                    tokio::time::sleep(Duration::from_secs(1)).await;
                    Ok::<_, ()>(())
                }
            })
            .await
            .unwrap()
        }));
    }
    let mut ran = 0;
    for t in tasks {
        match t.await.unwrap() {
            Once::Ran { recorded: true, attempt: 1, .. } => ran += 1,
            Once::AlreadyDone(entry) => assert_eq!(entry.state, WorkState::Done),
            other => panic!("{other:?}"),
        }
    }
    assert_eq!((ran, runs.load(Ordering::SeqCst)), (1, 1), "one run, by one candidate");
    // A later call (a restart) answers at once, without campaigning.
    let late = elector(store.clone(), "d");
    let before = tokio::time::Instant::now();
    assert!(matches!(
        late.run_once(&key(), Policy::default(), |_, _| async { Ok::<_, ()>(()) }).await,
        Ok(Once::AlreadyDone(_))
    ));
    assert_eq!(before.elapsed(), Duration::ZERO);
    assert_eq!(runs.load(Ordering::SeqCst), 1);
}

/// Candidate a runs the key until its store connection hangs (its term ends); b waits.
/// Answers what b's run_once came to and the tokens of a's and b's runs.
async fn cut_short(policy: Policy) -> (Once<(), ()>, Vec<u64>) {
    let shared = Arc::new(MemoryStore::new());
    let a_store = FaultyStore::new(shared.clone());
    let a = elector(Arc::new(a_store.clone()), "a");
    let b = elector(shared.clone(), "b");
    let tokens = Arc::new(std::sync::Mutex::new(Vec::new()));
    let t = tokens.clone();
    let a_run = tokio::spawn(async move {
        a.run_once(&key(), policy, |l, _| {
            let t = t.clone();
            async move {
                t.lock().unwrap().push(l.token().0);
                l.cancelled().await; // works until its term ends
                Err::<(), ()>(())
            }
        })
        .await
    });
    tokio::time::sleep(Duration::from_millis(100)).await;
    a_store.set(Fault::Hang);
    let t = tokens.clone();
    let b_out = b
        .run_once(&key(), policy, |l, _| {
            let t = t.clone();
            async move {
                t.lock().unwrap().push(l.token().0);
                Ok::<_, ()>(())
            }
        })
        .await
        .unwrap();
    a_run.abort();
    let tokens = tokens.lock().unwrap().clone();
    (b_out, tokens)
}

#[tokio::test(start_paused = true)]
async fn a_run_cut_short_runs_again_in_a_later_term_with_a_larger_token() {
    let (out, tokens) = cut_short(Policy::default()).await;
    match out {
        Once::Ran { attempt: 2, recorded: true, token, .. } => assert_eq!(token.0, tokens[1]),
        other => panic!("the key must run again: {other:?}"),
    }
    assert_eq!(tokens.len(), 2);
    assert!(tokens[1] > tokens[0], "the rerun's token is larger: {tokens:?}");
}

#[tokio::test(start_paused = true)]
async fn at_most_once_never_runs_a_key_again() {
    let (out, tokens) = cut_short(Policy { guarantee: Guarantee::AtMostOnce, ..Policy::default() }).await;
    assert!(matches!(out, Once::Refused { why: Refusal::MayHaveRun, .. }), "{out:?}");
    assert_eq!(tokens.len(), 1, "one run only: {tokens:?}");
}

#[tokio::test(start_paused = true)]
async fn failures_leave_the_key_open_until_the_attempts_are_used_up() {
    let store = Arc::new(MemoryStore::new());
    let policy = Policy { attempts: 2, ..Policy::default() };
    for attempt in 1..=2 {
        let e = elector(store.clone(), "a");
        match e.run_once(&key(), policy, |_, n| async move { Err::<(), u32>(n) }).await.unwrap() {
            Once::Failed { error, attempt: a, .. } => assert_eq!((error, a), (attempt, attempt)),
            other => panic!("{other:?}"),
        }
    }
    let e = elector(store.clone(), "a");
    let out = e.run_once(&key(), policy, |_, _| async { Ok::<_, ()>(()) }).await.unwrap();
    assert!(matches!(out, Once::Refused { why: Refusal::NoAttemptsLeft, .. }), "{out:?}");
}

#[tokio::test(start_paused = true)]
async fn a_store_without_a_ledger_is_an_error_not_a_run() {
    struct NoLedger(MemoryStore);
    #[async_trait::async_trait]
    impl LeaseStore for NoLedger {
        async fn try_acquire(
            &self,
            r: &tenure::store::AcquireRequest,
        ) -> Result<tenure::store::Acquire, tenure::StoreError> {
            self.0.try_acquire(r).await
        }
        async fn renew(
            &self,
            h: &tenure::LeaseRecord,
            ttl: Duration,
        ) -> Result<tenure::store::Renew, tenure::StoreError> {
            self.0.renew(h, ttl).await
        }
        async fn release(&self, h: &tenure::LeaseRecord) -> Result<(), tenure::StoreError> {
            self.0.release(h).await
        }
        async fn get(&self, e: &tenure::ElectionName) -> Result<Option<tenure::LeaseRecord>, tenure::StoreError> {
            self.0.get(e).await
        }
        async fn list(&self, p: &str) -> Result<Vec<tenure::LeaseRecord>, tenure::StoreError> {
            self.0.list(p).await
        }
        async fn evict(
            &self,
            e: &tenure::ElectionName,
            how: tenure::Evict,
        ) -> Result<Option<tenure::LeaseRecord>, tenure::StoreError> {
            self.0.evict(e, how).await
        }
        fn describe(&self) -> String {
            "no-ledger".into()
        }
    }
    let e = elector(Arc::new(NoLedger(MemoryStore::new())), "a");
    let ran = Arc::new(AtomicU32::new(0));
    let r = ran.clone();
    let out = e
        .run_once(&key(), Policy::default(), move |_, _| {
            r.fetch_add(1, Ordering::SeqCst);
            async { Ok::<_, ()>(()) }
        })
        .await;
    let err = out.unwrap_err();
    assert!(format!("{:?}", err).contains("keeps no work ledger"), "{err:?}");
    assert_eq!(ran.load(Ordering::SeqCst), 0);
}
