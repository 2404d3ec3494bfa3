//! The runtime on paused time: renewal, step-down, ambiguity, handover, events.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use tenure::{Elector, Event, Evict, Instant, LeaseStore, MemoryStore, StepDownReason, observe};
use tenure_testkit::faults::{Fault, FaultyStore, Op};

const TTL: Duration = Duration::from_secs(3);

fn elector(store: Arc<dyn LeaseStore>, holder: &str) -> Elector {
    Elector::builder(store, "jobs/sweeper").holder(holder).ttl(TTL).jitter(0.0).build().unwrap()
}

type Log = Arc<Mutex<Vec<(Instant, Event)>>>;

/// Records every event of `e` with the (paused) time it arrived.
fn record(e: &Elector) -> Log {
    let log: Log = Arc::default();
    let mut rx = e.events();
    let l = log.clone();
    tokio::spawn(async move {
        while let Ok(ev) = rx.recv().await {
            l.lock().unwrap().push((Instant::now(), ev));
        }
    });
    log
}

fn events(log: &Log) -> Vec<Event> {
    log.lock().unwrap().iter().map(|(_, e)| e.clone()).collect()
}

async fn settle() {
    tokio::time::sleep(Duration::from_millis(1)).await;
}

#[tokio::test(start_paused = true)]
async fn leader_renews_every_third_of_the_ttl() {
    let store = FaultyStore::new(Arc::new(MemoryStore::new()));
    let a = elector(Arc::new(store.clone()), "a");
    let l = a.leadership().await.unwrap();
    let first_deadline = l.deadline();
    let before = store.calls();
    tokio::time::sleep(TTL * 3 + Duration::from_millis(1)).await;
    let renewals = store.calls() - before;
    assert_eq!(renewals, 9, "three TTLs at one renewal per TTL/3");
    assert!(l.is_valid(), "a leader that renews stays valid");
    assert!(l.deadline() > first_deadline + TTL * 2, "each renewal moves the deadline");
    assert!(l.deadline() <= Instant::now() + TTL, "the deadline never lies a whole TTL ahead");
}

#[tokio::test(start_paused = true)]
async fn steps_down_before_the_deadline_when_the_store_hangs() {
    let store = FaultyStore::new(Arc::new(MemoryStore::new()));
    let a = elector(Arc::new(store.clone()), "a");
    let log = record(&a);
    let l = a.leadership().await.unwrap();
    store.set(Fault::Hang);
    let deadline_then = l.deadline();
    l.cancelled().await;
    let stepped = Instant::now();
    assert!(!l.is_valid());
    assert!(stepped < deadline_then, "step-down at {stepped:?} must come before the deadline {deadline_then:?}");
    let cfg = a.config();
    assert!(
        deadline_then - stepped >= cfg.deadline_offset() - cfg.renew_deadline,
        "the work gets the whole gap between renew_deadline and the deadline to stop"
    );
    drop(l);
    settle().await;
    assert!(events(&log).contains(&Event::SteppedDown { reason: StepDownReason::RenewFailed }));
}

#[tokio::test(start_paused = true)]
async fn two_candidates_never_overlap_when_the_leader_is_cut_off() {
    let shared = Arc::new(MemoryStore::new());
    let a_store = FaultyStore::new(shared.clone());
    let a = elector(Arc::new(a_store.clone()), "a");
    let b = elector(shared.clone(), "b");
    let la = a.leadership().await.unwrap();
    b.start();
    settle().await;
    a_store.set(Fault::Hang);
    let lb = b.leadership().await.unwrap();
    let b_elected = Instant::now();
    assert!(!la.is_valid(), "A must have stepped down before B was elected");
    assert!(la.deadline() <= b_elected, "A's deadline {:?} outlives B's election {b_elected:?}", la.deadline());
    assert!(lb.token() > la.token());
    let took = b_elected.duration_since(la.deadline());
    assert!(took < TTL, "B took over {took:?} after A's deadline");
}

#[tokio::test(start_paused = true)]
async fn a_watch_that_catches_up_late_does_not_delay_the_takeover() {
    // B reads the lease itself, then its watch delivers the renewals it missed while cut
    // off, each saying a whole TTL is left: the earliest end B read for a revision counts.
    let shared = Arc::new(MemoryStore::new());
    let a_store = FaultyStore::new(shared.clone());
    let b_store = FaultyStore::new(shared.clone());
    let a = elector(Arc::new(a_store.clone()), "a");
    let b = elector(Arc::new(b_store.clone()), "b");
    let start = Instant::now();
    b_store.hold_watch_until(tokio::time::Instant::now() + TTL + TTL / 6);
    let la = a.leadership().await.unwrap();
    b.start();
    // A renews at a third and two thirds of the TTL; B reads the second renewal itself
    // when the first lease it saw would have ended, and A stops renewing after that.
    tokio::time::sleep(TTL * 5 / 6).await;
    a_store.set(Fault::Hang);
    let lb = b.leadership().await.unwrap();
    let expired = start + TTL * 2 / 3 + TTL;
    let took = Instant::now().duration_since(expired);
    assert!(lb.token() > la.token());
    assert!(
        took < TTL / 5,
        "B was elected {took:?} after A's lease ran out: the late watch events put its takeover off"
    );
}

#[tokio::test(start_paused = true)]
async fn ambiguous_acquire_is_never_acted_on() {
    let inner = Arc::new(MemoryStore::new());
    let store = FaultyStore::new(inner.clone());
    store.set(Fault::LoseResponse);
    let a = elector(Arc::new(store.clone()), "a");
    let log = record(&a);
    a.start();
    tokio::time::sleep(TTL / 2).await;
    let rec = inner.get(&"jobs/sweeper".parse().unwrap()).await.unwrap();
    assert_eq!(rec.map(|r| r.holder.to_string()), Some("a".into()), "the acquire was applied");
    assert!(a.current().is_none(), "but its answer was lost, so the candidate must not lead");
    assert!(!events(&log).iter().any(|e| matches!(e, Event::Elected { .. })));
    store.set(Fault::None);
    let l = a.leadership().await.unwrap();
    assert!(l.is_valid());
}

#[tokio::test(start_paused = true)]
async fn graceful_shutdown_hands_over_at_once() {
    let store = Arc::new(MemoryStore::new());
    let a = elector(store.clone(), "a");
    let b = elector(store.clone(), "b");
    let a_log = record(&a);
    let la = a.leadership().await.unwrap();
    b.start();
    settle().await;
    let token = la.token();
    drop(la);
    let stopped = Instant::now();
    a.shutdown().await;
    let lb = b.leadership().await.unwrap();
    let handover = Instant::now() - stopped;
    assert!(handover < Duration::from_millis(50), "handover took {handover:?}, not a TTL");
    assert!(lb.token() > token);
    assert!(events(&a_log).contains(&Event::LeaderChanged(None)), "the releasing leader reports no leader");
    assert!(
        events(&a_log).contains(&Event::SteppedDown { reason: StepDownReason::ShuttingDown }),
        "the leader reports why it stepped down"
    );
}

#[tokio::test(start_paused = true)]
async fn resign_hands_over_and_campaigns_again() {
    let store = Arc::new(MemoryStore::new());
    let a = elector(store.clone(), "a");
    let b = elector(store.clone(), "b");
    let la = a.leadership().await.unwrap();
    b.start();
    settle().await;
    la.resign().await;
    let lb = b.leadership().await.unwrap();
    drop(lb);
    b.shutdown().await;
    let la2 = a.leadership().await.unwrap();
    assert!(la2.is_valid(), "the resigned candidate leads again without a restart");
}

#[tokio::test(start_paused = true)]
async fn recampaigns_after_losing_to_an_eviction() {
    let store = Arc::new(MemoryStore::new());
    let a = elector(store.clone(), "a");
    let log = record(&a);
    let l1 = a.leadership().await.unwrap();
    store.evict(&"jobs/sweeper".parse().unwrap(), Evict::AfterTerm).await.unwrap();
    l1.cancelled().await;
    drop(l1);
    let l2 = a.leadership().await.unwrap();
    assert!(events(&log).contains(&Event::SteppedDown { reason: StepDownReason::Evicted }));
    assert!(l2.is_valid());
}

#[tokio::test(start_paused = true)]
async fn eviction_moves_leadership_to_another_candidate() {
    let inner = Arc::new(MemoryStore::new());
    let a = elector(inner.clone(), "a");
    let la = a.leadership().await.unwrap();
    // B polls (no watch): it must still win before A campaigns again.
    let b = elector(Arc::new(FaultyStore::new(inner.clone()).without_watch()), "b");
    b.start();
    settle().await;
    inner.evict(&"jobs/sweeper".parse().unwrap(), Evict::AfterTerm).await.unwrap();
    la.cancelled().await;
    drop(la);
    let lb = b.leadership().await.unwrap();
    assert_eq!(lb.holder().as_str(), "b");
}

#[tokio::test(start_paused = true)]
async fn run_while_leader_cancels_the_task_and_runs_it_again() {
    let store = Arc::new(MemoryStore::new());
    let a = elector(store.clone(), "a");
    let runs = Arc::new(Mutex::new(Vec::new()));
    let r = runs.clone();
    let name = "jobs/sweeper".parse().unwrap();
    let store2 = store.clone();
    let driver = tokio::spawn(async move {
        // Evict the first term; then shut down during the second.
        tokio::time::sleep(TTL).await;
        store2.evict(&name, Evict::AfterTerm).await.unwrap();
        tokio::time::sleep(TTL * 3).await;
    });
    let a2 = a.clone();
    let out = a
        .run_while_leader(move |l| {
            let r = r.clone();
            let a2 = a2.clone();
            let store = store.clone();
            async move {
                let n = {
                    let mut runs = r.lock().unwrap();
                    runs.push(l.token());
                    runs.len()
                };
                if n == 2 {
                    tokio::spawn(async move { a2.shutdown().await });
                }
                l.cancelled().await;
                // The work is still running: nobody else may hold the lease yet.
                let rec = store.get(l.election()).await.unwrap();
                assert!(rec.is_none_or(|r| r.holder.as_str() == "a"), "another leader while the task ran");
            }
        })
        .await;
    driver.abort();
    assert!(out.is_err(), "shut down, not finished");
    let runs = runs.lock().unwrap();
    assert_eq!(runs.len(), 2, "the task ran once per term");
    assert!(runs[1] > runs[0]);
}

#[tokio::test(start_paused = true)]
async fn run_while_leader_returns_the_output_and_releases() {
    let store = Arc::new(MemoryStore::new());
    let a = elector(store.clone(), "a");
    let out = a.run_while_leader(|l| async move { l.token().0 * 10 }).await.unwrap();
    assert_eq!(out, 10);
    assert_eq!(store.get(&"jobs/sweeper".parse().unwrap()).await.unwrap(), None, "released on completion");
}

#[tokio::test(start_paused = true)]
async fn release_waits_for_the_guarded_work() {
    let store = Arc::new(MemoryStore::new());
    let a = elector(store.clone(), "a");
    let l = a.leadership().await.unwrap();
    let work = l.clone();
    drop(l);
    let stopping = tokio::spawn({
        let a = a.clone();
        async move { a.shutdown().await }
    });
    work.cancelled().await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(
        store.get(&"jobs/sweeper".parse().unwrap()).await.unwrap().is_some(),
        "the lease must not be released while a Leadership clone is held"
    );
    drop(work);
    stopping.await.unwrap();
    assert_eq!(store.get(&"jobs/sweeper".parse().unwrap()).await.unwrap(), None);
}

#[tokio::test(start_paused = true)]
async fn observers_see_leaders_and_no_leader() {
    let store = Arc::new(MemoryStore::new());
    let mut obs = observe(store.clone(), "jobs/sweeper".parse().unwrap());
    assert_eq!(obs.changed().await, Some(None), "first reading: nobody leads");
    let a = elector(store.clone(), "a");
    let la = a.leadership().await.unwrap();
    let seen = obs.changed().await.unwrap().unwrap();
    assert_eq!((seen.holder.as_str(), seen.token), ("a", la.token()));
    drop(la);
    a.shutdown().await;
    assert_eq!(obs.changed().await, Some(None), "a release is reported as no leader");
}

#[tokio::test(start_paused = true)]
async fn observers_see_a_silent_expiry() {
    // A store that cannot watch: the observer must wake up when the record expires.
    let inner = Arc::new(MemoryStore::new());
    let store = Arc::new(FaultyStore::new(inner.clone()).without_watch());
    let a_store = FaultyStore::new(inner.clone());
    let a = elector(Arc::new(a_store.clone()), "a");
    let _la = a.leadership().await.unwrap();
    let mut obs = tenure::observe_with(
        store,
        "jobs/sweeper".parse().unwrap(),
        Duration::from_secs(3600),
        Arc::new(tenure::TokioClock),
    );
    assert!(obs.changed().await.unwrap().is_some());
    a_store.set(Fault::Hang);
    let t0 = Instant::now();
    assert_eq!(obs.changed().await, Some(None));
    assert!(Instant::now() - t0 <= TTL + Duration::from_millis(10), "seen at expiry, not at the next hourly poll");
}

#[tokio::test(start_paused = true)]
async fn followers_on_a_watching_store_make_no_requests_in_steady_state() {
    let inner = Arc::new(MemoryStore::new());
    let a = elector(inner.clone(), "a");
    let _la = a.leadership().await.unwrap();
    let b_store = FaultyStore::new(inner.clone());
    let b = elector(Arc::new(b_store.clone()), "b");
    let b_log = record(&b);
    b.start();
    tokio::time::sleep(Duration::from_millis(10)).await;
    let before = b_store.calls();
    tokio::time::sleep(TTL * 10).await;
    assert_eq!(b_store.calls() - before, 0, "a watching follower polls nothing while the leader renews");
    assert!(events(&b_log).iter().any(|e| matches!(e, Event::LeaderChanged(Some(l)) if l.holder.as_str() == "a")));
}

#[tokio::test(start_paused = true)]
async fn cool_down_delays_the_leadership() {
    let store = Arc::new(MemoryStore::new());
    let a = Elector::builder(store, "jobs/sweeper").ttl(TTL).cool_down(Duration::from_millis(700)).build().unwrap();
    let t0 = Instant::now();
    let _l = a.leadership().await.unwrap();
    assert!(Instant::now() - t0 >= Duration::from_millis(700));
}

#[test]
fn bad_settings_name_the_setting() {
    let store = Arc::new(MemoryStore::new());
    let err = Elector::builder(store.clone(), "jobs/x")
        .ttl(Duration::from_secs(10))
        .renew_deadline(Duration::from_secs(11))
        .build()
        .err()
        .unwrap();
    assert!(err.to_string().contains("renew_deadline"), "{err}");
    let err = Elector::builder(store, "jobs//x").build().err().unwrap();
    assert!(err.to_string().contains("empty path segment"), "{err}");
}

#[tokio::test(start_paused = true)]
async fn a_store_that_refuses_ends_the_campaign_with_its_error() {
    let store = FaultyStore::new(Arc::new(MemoryStore::new()));
    store.set(Fault::Refuse);
    let a = elector(Arc::new(store), "a");
    let err = a.leadership().await.unwrap_err();
    assert!(matches!(err, tenure::ElectError::Store(_)), "{err:?}");
    let chain = format!("{err}: {}", std::error::Error::source(&err).unwrap());
    assert!(chain.contains("injected refusal"), "{chain}");
}

#[tokio::test(start_paused = true)]
async fn a_panicking_store_does_not_leave_waiters_hanging() {
    let store = FaultyStore::new(Arc::new(MemoryStore::new()));
    let a = elector(Arc::new(store.clone()), "a");
    let l = a.leadership().await.unwrap();
    store.set(Fault::Panic);
    // The next renewal panics inside the campaign task: the term must end at once.
    l.cancelled().await;
    assert!(!l.is_valid());
    drop(l);
    assert!(matches!(a.leadership().await, Err(tenure::ElectError::Crashed)));
    a.shutdown().await;
}

#[tokio::test(start_paused = true)]
async fn release_after_renewals_that_were_applied_but_unanswered_still_clears_the_lease() {
    let inner = Arc::new(MemoryStore::new());
    let store = FaultyStore::new(inner.clone());
    let a = elector(Arc::new(store.clone()), "a");
    let l = a.leadership().await.unwrap();
    // Renewals land but their answers are lost: the store's revision moves on unseen.
    store.set(Fault::LoseResponse);
    l.cancelled().await;
    store.set(Fault::None);
    drop(l);
    a.shutdown().await;
    assert_eq!(
        inner.get(&"jobs/sweeper".parse().unwrap()).await.unwrap(),
        None,
        "the release must clear the lease, not leave it to expire"
    );
}

/// An acquire that was applied but whose answer was lost, then a shutdown before the
/// runtime read the record to resolve it: the grant is nobody's work. It is released, so
/// the next candidate need not wait a TTL for it (nor, on a store whose elections share
/// one lease per process, as long as the process lives).
#[tokio::test(start_paused = true)]
async fn a_shutdown_while_an_acquire_is_unresolved_releases_what_it_was_granted() {
    let inner = Arc::new(MemoryStore::new());
    let store = FaultyStore::new(inner.clone()).only(&[Op::Acquire]).without_watch();
    store.set(Fault::LoseResponse);
    let a = elector(Arc::new(store.clone()), "a");
    a.start();
    while store.calls_of(Op::Acquire) == 0 {
        tokio::task::yield_now().await;
    }
    for _ in 0..10 {
        tokio::task::yield_now().await;
    }
    let election: tenure::ElectionName = "jobs/sweeper".parse().unwrap();
    assert!(inner.get(&election).await.unwrap().is_some(), "the acquire was applied");
    a.shutdown().await;
    assert_eq!(inner.get(&election).await.unwrap(), None, "the unanswered grant was left to expire");
}

/// tokio's paused clock plus an offset that a test moves forward at once, as a process
/// sees time after it was frozen (SIGSTOP, a stalled VM): the runtime did not run
/// while the time passed.
#[derive(Default)]
struct JumpClock {
    offset_ms: std::sync::atomic::AtomicU64,
}

impl JumpClock {
    fn offset(&self) -> Duration {
        Duration::from_millis(self.offset_ms.load(std::sync::atomic::Ordering::SeqCst))
    }
    fn jump(&self, by: Duration) {
        self.offset_ms.fetch_add(by.as_millis() as u64, std::sync::atomic::Ordering::SeqCst);
    }
}

impl tenure::Clock for JumpClock {
    fn now(&self) -> Instant {
        Instant::now() + self.offset()
    }
    fn sleep_until(&self, deadline: Instant) -> std::pin::Pin<Box<dyn Future<Output = ()> + Send + 'static>> {
        let at = deadline.checked_sub(self.offset()).unwrap_or_else(Instant::now);
        Box::pin(tokio::time::sleep_until(at))
    }
}

#[tokio::test(start_paused = true)]
async fn a_term_past_its_deadline_is_never_handed_out() {
    let clock = Arc::new(JumpClock::default());
    let store: Arc<dyn LeaseStore> = Arc::new(MemoryStore::new());
    let a =
        Elector::builder(store, "jobs/sweeper").holder("a").ttl(TTL).jitter(0.0).clock(clock.clone()).build().unwrap();
    let first = a.leadership().await.unwrap();
    // Frozen past the deadline: the term is over before the runtime has stepped down.
    clock.jump(TTL * 2);
    assert!(!first.is_valid());
    assert!(a.current().is_none(), "current() handed out a term past its deadline");
    drop(first); // the runtime releases only once the old term's work has stopped
    let next = tokio::time::timeout(TTL * 3, a.leadership()).await.expect("no new term").unwrap();
    assert!(next.is_valid(), "leadership() handed out a term past its deadline");
    assert!(next.remaining() > TTL / 2, "a renewed term has most of a TTL left");
}

#[tokio::test(start_paused = true)]
async fn a_term_that_ends_during_its_cool_down_is_never_announced() {
    // Frozen while waiting out the cool-down, past the deadline: when the process runs
    // again, the term is over, and nobody may hear that it began.
    let clock = Arc::new(JumpClock::default());
    let store: Arc<dyn LeaseStore> = Arc::new(MemoryStore::new());
    let a = Elector::builder(store, "jobs/sweeper")
        .holder("a")
        .ttl(TTL)
        .jitter(0.0)
        .cool_down(Duration::from_millis(700))
        .clock(clock.clone())
        .build()
        .unwrap();
    let log = record(&a);
    a.start();
    settle().await;
    assert!(events(&log).iter().all(|e| !matches!(e, Event::Elected { .. })), "announced during the cool-down");
    clock.jump(TTL * 2);
    tokio::time::sleep(Duration::from_millis(800)).await;
    let seen = events(&log);
    let stepped = seen.iter().position(|e| matches!(e, Event::SteppedDown { .. })).expect("the term did not end");
    assert_eq!(seen[stepped], Event::SteppedDown { reason: StepDownReason::DeadlinePassed });
    assert!(
        seen[..stepped].iter().all(|e| !matches!(e, Event::Elected { .. })),
        "a term that ended during its cool-down was announced: {seen:?}"
    );
}

#[tokio::test(start_paused = true)]
async fn a_task_that_ends_with_its_term_runs_again_on_the_next_one() {
    let clock = Arc::new(JumpClock::default());
    let store: Arc<dyn LeaseStore> = Arc::new(MemoryStore::new());
    let a =
        Elector::builder(store, "jobs/sweeper").holder("a").ttl(TTL).jitter(0.0).clock(clock.clone()).build().unwrap();
    let runs = Arc::new(std::sync::atomic::AtomicU32::new(0));
    let r = runs.clone();
    let task = tokio::spawn(async move {
        a.run_while_leader(|l| {
            let r = r.clone();
            async move {
                r.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                // README's loop: work while the term is valid.
                while l.is_valid() {
                    tokio::time::sleep(Duration::from_millis(10)).await;
                }
            }
        })
        .await
    });
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert_eq!(runs.load(std::sync::atomic::Ordering::SeqCst), 1);
    // Frozen past the deadline: the loop sees the term is over before the runtime does.
    clock.jump(TTL * 2);
    tokio::time::sleep(TTL * 3).await;
    assert!(!task.is_finished(), "run_while_leader took the end of a term for the end of the work and gave up");
    assert!(runs.load(std::sync::atomic::Ordering::SeqCst) >= 2, "the task was not started again on the next term");
}

#[tokio::test(start_paused = true)]
async fn a_leader_whose_work_stops_reporting_progress_resigns_and_stands_aside_a_ttl() {
    let store = Arc::new(MemoryStore::new());
    let a = elector(store.clone(), "a");
    let b = elector(store.clone(), "b");
    let la = a.leadership().await.unwrap();
    b.start();
    settle().await;
    let dog = la.watchdog(Duration::from_secs(1));
    let ended = la.cancellation_token();
    // The guarded work: it lets go of its leadership when the term ends.
    let work = tokio::spawn(async move { la.cancelled().await });
    // Progress in time keeps the term, across many renewals.
    for _ in 0..10 {
        tokio::time::sleep(Duration::from_millis(900)).await;
        dog.progress();
        assert!(!ended.is_cancelled(), "a leader whose work reports progress keeps leading");
    }
    // The work gets stuck: within a second the leader resigns, and b takes over.
    let stuck = Instant::now();
    let lb = b.leadership().await.unwrap();
    assert!(Instant::now() - stuck <= Duration::from_millis(1100), "took {:?}", Instant::now() - stuck);
    assert!(ended.is_cancelled());
    work.await.unwrap();
    drop(dog);
    // a stands aside for a whole TTL: b can resign within it and a does not take over.
    lb.resign().await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(a.current().is_none(), "the unhealthy leader campaigned again within a TTL");
    let lb2 = b.leadership().await.unwrap();
    drop(lb2);
    b.shutdown().await;
    let la2 = a.leadership().await.unwrap();
    assert!(la2.is_valid(), "after standing aside it campaigns again");
    assert!(Instant::now() - stuck >= TTL, "a came back after {:?}", Instant::now() - stuck);
}

#[tokio::test(start_paused = true)]
async fn an_elector_reports_leadership_terms_takeovers_and_store_calls_as_metrics() {
    let recorder = metrics_exporter_prometheus::PrometheusBuilder::new().build_recorder();
    let handle = recorder.handle();
    let _local = metrics::set_default_local_recorder(&recorder);
    let store = Arc::new(MemoryStore::new());
    let a = elector(store.clone(), "a");
    let la = a.leadership().await.unwrap();
    tokio::time::sleep(TTL + Duration::from_millis(1)).await;
    let text = handle.render();
    let line = |name: &str| text.lines().find(|l| l.starts_with(name)).map(str::to_string);
    assert_eq!(line("tenure_is_leader{").as_deref(), Some(r#"tenure_is_leader{election="jobs/sweeper"} 1"#), "{text}");
    assert_eq!(
        line("tenure_elections_won_total{").as_deref(),
        Some(r#"tenure_elections_won_total{election="jobs/sweeper"} 1"#)
    );
    let left: f64 = line("tenure_term_remaining_seconds{").unwrap().rsplit(' ').next().unwrap().parse().unwrap();
    assert!(left > 0.0 && left <= TTL.as_secs_f64(), "{left}");
    assert!(
        text.contains(r#"tenure_store_request_duration_seconds_count{election="jobs/sweeper",operation="renew"} 3"#),
        "one renewal per third of a TTL: {text}"
    );
    // The leader resigns; the next one records how long the election had no leader.
    let b = elector(store.clone(), "b");
    b.start();
    settle().await;
    la.resign().await;
    let lb = b.leadership().await.unwrap();
    let text = handle.render();
    assert!(text.contains(r#"tenure_terms_ended_total{election="jobs/sweeper",reason="resigned"} 1"#), "{text}");
    assert!(text.contains(r#"tenure_takeover_seconds_count{election="jobs/sweeper"} 1"#), "{text}");
    assert!(text.contains(r#"tenure_elections_won_total{election="jobs/sweeper"} 2"#), "{text}");
    drop(lb);
    b.shutdown().await;
    a.shutdown().await;
    let text = handle.render();
    assert!(text.contains(r#"tenure_is_leader{election="jobs/sweeper"} 0"#), "{text}");
    assert!(text.contains(r#"tenure_terms_ended_total{election="jobs/sweeper",reason="shutting_down"} 1"#), "{text}");
}

/// A clock that can be made to jump ahead while the runtime's timers stay where they
/// were: a runtime that is stuck (its timers not firing) while time goes on.
struct Jumping(Mutex<Duration>);

impl tenure::Clock for Jumping {
    fn now(&self) -> Instant {
        Instant::now() + *self.0.lock().unwrap()
    }
    fn sleep_until(&self, deadline: Instant) -> std::pin::Pin<Box<dyn std::future::Future<Output = ()> + Send>> {
        Box::pin(tokio::time::sleep_until(deadline))
    }
}

#[tokio::test(start_paused = true)]
async fn a_leader_held_past_its_deadline_without_stepping_down_is_unhealthy() {
    let clock = Arc::new(Jumping(Mutex::new(Duration::ZERO)));
    let a = Elector::builder(Arc::new(MemoryStore::new()), "jobs/sweeper")
        .holder("a")
        .ttl(TTL)
        .clock(clock.clone())
        .build()
        .unwrap();
    let l = a.leadership().await.unwrap();
    assert!(a.is_healthy());
    // Time goes past the deadline while the runtime has not run: stuck.
    *clock.0.lock().unwrap() = TTL * 2;
    assert!(!a.is_healthy(), "a leader past its deadline that has not stepped down is not healthy");
    assert!(a.current().is_none(), "and its term is not handed out");
    // Once the runtime runs, it steps down, and the campaign is healthy again.
    l.cancelled().await;
    drop(l);
    assert!(a.is_healthy());
    a.shutdown().await;
    assert!(a.is_healthy(), "shut down is not stuck");
}

#[tokio::test(start_paused = true)]
async fn a_leader_proclaims_new_metadata_within_its_term_and_observers_see_it() {
    let store: Arc<dyn LeaseStore> = Arc::new(MemoryStore::new());
    let a = Elector::builder(store.clone(), "jobs/sweeper")
        .holder("a")
        .ttl(TTL)
        .jitter(0.0)
        .metadata(b"10.0.0.7:8080".to_vec())
        .build()
        .unwrap();
    let log = record(&a);
    let l = a.leadership().await.unwrap();
    let mut seen = observe(store.clone(), tenure::ElectionName::new("jobs/sweeper").unwrap());
    assert_eq!(seen.changed().await.unwrap().unwrap().metadata, b"10.0.0.7:8080");
    tokio::time::sleep(TTL / 6).await;
    let deadline_before = l.deadline();
    l.set_metadata(b"10.0.0.7:9090".to_vec()).await.unwrap();
    let rec = store.get(l.election()).await.unwrap().unwrap();
    assert_eq!((rec.token, rec.metadata.as_slice()), (l.token(), &b"10.0.0.7:9090"[..]), "same term, new metadata");
    assert_eq!(l.leader().metadata, b"10.0.0.7:9090", "the leadership tells what it publishes");
    assert!(l.deadline() > deadline_before, "a proclamation is a renewal and moves the deadline");
    let now =
        tokio::time::timeout(TTL, seen.changed()).await.expect("observers are told of new metadata").unwrap().unwrap();
    assert_eq!((now.token, now.metadata.as_slice()), (l.token(), &b"10.0.0.7:9090"[..]), "observers see it");
    // Renewals keep it.
    tokio::time::sleep(TTL * 2).await;
    assert_eq!(store.get(l.election()).await.unwrap().unwrap().metadata, b"10.0.0.7:9090");
    assert!(!events(&log).iter().any(|e| matches!(e, Event::SteppedDown { .. })), "no new term: {:?}", events(&log));
    let too_big = vec![b'x'; tenure::store::MAX_METADATA + 1];
    assert!(matches!(l.set_metadata(too_big).await, Err(tenure::ProclaimError::TooLarge(_))));
    // Resigning ends the term at once; the release waits for every clone.
    let kept = l.clone();
    tokio::spawn(l.resign());
    settle().await;
    assert!(matches!(kept.set_metadata(b"late".to_vec()).await, Err(tenure::ProclaimError::TermEnded)));
}

#[tokio::test(start_paused = true)]
async fn a_proclamation_the_store_refuses_leaves_the_term_as_it_was() {
    let store = FaultyStore::new(Arc::new(MemoryStore::new()));
    let a = elector(Arc::new(store.clone()), "a");
    let l = a.leadership().await.unwrap();
    store.set(Fault::Unavailable);
    let err = l.set_metadata(b"new".to_vec()).await.unwrap_err();
    assert!(matches!(err, tenure::ProclaimError::Store(_)), "{err:?}");
    store.set(Fault::None);
    assert!(l.is_valid(), "the term goes on");
    let rec = store.get(l.election()).await.unwrap().unwrap();
    assert!(rec.metadata.is_empty(), "nothing was published");
    l.set_metadata(b"new".to_vec()).await.unwrap();
    assert_eq!(store.get(l.election()).await.unwrap().unwrap().metadata, b"new");
}

#[tokio::test(start_paused = true)]
async fn proclamations_that_keep_hanging_do_not_keep_a_due_renewal_waiting() {
    // Proclamations (same-holder acquires) hang until their request timeout, while
    // renewals go through. Two holders of the term keep one always queued: the renewals
    // must still be made when due, or the leader steps down for nothing.
    let store = FaultyStore::new(Arc::new(MemoryStore::new())).only(&[Op::Acquire]);
    let a = elector(Arc::new(store.clone()), "a");
    let log = record(&a);
    let l = a.leadership().await.unwrap();
    store.set(Fault::Hang);
    for _ in 0..2 {
        let l = l.clone();
        tokio::spawn(async move {
            while l.is_valid() {
                let _ = l.set_metadata(b"x".to_vec()).await;
            }
        });
    }
    tokio::time::sleep(TTL * 3).await;
    assert!(l.is_valid(), "the leader stepped down: {:?}", events(&log));
    assert!(!events(&log).iter().any(|e| matches!(e, Event::SteppedDown { .. })), "{:?}", events(&log));
    drop(l);
}

#[tokio::test(start_paused = true)]
async fn a_proclamation_that_finds_another_holder_ends_the_term() {
    let inner: Arc<dyn LeaseStore> = Arc::new(MemoryStore::new());
    // Without a watch, the leader learns of the new holder only from the store's answer.
    let a = elector(Arc::new(FaultyStore::new(inner.clone()).without_watch()), "a");
    let log = record(&a);
    let l = a.leadership().await.unwrap();
    inner.evict(l.election(), Evict::Now).await.unwrap();
    let b = elector(inner.clone(), "b");
    let lb = b.leadership().await.unwrap();
    assert!(matches!(l.set_metadata(b"x".to_vec()).await, Err(tenure::ProclaimError::TermEnded)));
    settle().await;
    assert!(!l.is_valid());
    assert!(
        events(&log).iter().any(|e| matches!(e, Event::SteppedDown { reason: StepDownReason::Lost { to: Some(t) } } if t.token == lb.token())),
        "{:?}",
        events(&log)
    );
}

#[tokio::test(start_paused = true)]
async fn announcing_candidates_are_listed_until_they_stop_or_their_presence_runs_out() {
    let inner: Arc<dyn LeaseStore> = Arc::new(MemoryStore::new());
    let announcing = |store: Arc<dyn LeaseStore>, holder: &str, priority: i32| {
        Elector::builder(store, "jobs/sweeper")
            .holder(holder)
            .ttl(TTL)
            .announce(true)
            .priority(priority)
            .metadata(format!("{holder}:8080").into_bytes())
            .build()
            .unwrap()
    };
    let cut = FaultyStore::new(inner.clone());
    let a = announcing(Arc::new(cut.clone()), "a", 1);
    let b = announcing(inner.clone(), "b", 5);
    let quiet = elector(inner.clone(), "c");
    a.start();
    b.start();
    quiet.start();
    tokio::time::sleep(TTL).await;
    let listed = b.candidates().await.unwrap();
    let seen: Vec<(&str, i32, &[u8])> =
        listed.iter().map(|c| (c.holder.as_str(), c.priority, c.metadata.as_slice())).collect();
    assert_eq!(seen, [("a", 1, &b"a:8080"[..]), ("b", 5, &b"b:8080"[..])], "only those that announce");
    let name = tenure::ElectionName::new("jobs/sweeper").unwrap();
    assert_eq!(tenure::candidates(&*inner, &name).await.unwrap(), listed, "observers list the same");
    // A candidate cut off from the store is listed until its presence runs out.
    cut.set(Fault::Unavailable);
    tokio::time::sleep(TTL / 2).await;
    assert_eq!(b.candidates().await.unwrap().len(), 2);
    tokio::time::sleep(TTL).await;
    let left: Vec<String> = b.candidates().await.unwrap().iter().map(|c| c.holder.to_string()).collect();
    assert_eq!(left, ["b"], "a crashed candidate drops out within a TTL");
    // One that shuts down drops out at once.
    b.shutdown().await;
    assert!(tenure::candidates(&*inner, &name).await.unwrap().is_empty());
    assert!(
        inner
            .list("")
            .await
            .unwrap()
            .iter()
            .all(|r| r.election.as_str() == "jobs/sweeper" || r.election.as_str().starts_with(tenure::RESERVED_PREFIX)),
        "presence leases live under the reserved prefix"
    );
}

#[tokio::test(start_paused = true)]
async fn a_proclamation_sent_as_the_term_ends_is_answered_and_does_not_hold_up_the_release() {
    let store: Arc<dyn LeaseStore> = Arc::new(MemoryStore::new());
    let a = elector(store.clone(), "a");
    let l = a.leadership().await.unwrap();
    // The guarded work proclaims without pause until told the term has ended.
    let work = tokio::spawn(async move {
        let mut n = 0u64;
        while l.set_metadata(format!("n={n}")).await.is_ok() {
            n += 1;
        }
    });
    // Let it get going (no time passes while it proclaims without pause).
    for _ in 0..10 {
        tokio::task::yield_now().await;
    }
    tokio::time::timeout(TTL, a.shutdown()).await.expect("the shutdown is not held up by a proclamation");
    work.await.unwrap();
    assert_eq!(store.get(a.election()).await.unwrap(), None, "released");
}

/// A memory store without a watch that notes, at each release, whether the term it was
/// told of had already ended, refuses the first `refuse_releases` releases, and applies a
/// renewal of the record as it stands just before each of the next `renewed_before_releases`
/// releases (a renewal whose caller gave up, landing late).
#[derive(Default)]
struct ReleaseOrder {
    inner: MemoryStore,
    term: Mutex<Option<tenure::CancellationToken>>,
    released_while_valid: Mutex<Vec<bool>>,
    refuse_releases: Mutex<u32>,
    renewed_before_releases: Mutex<u32>,
    /// A grant of the same holder (a proclamation's acquire, landing late) just after the
    /// next release.
    granted_after_release: Mutex<bool>,
}

impl ReleaseOrder {
    /// A store with a candidate that has led once and whose work has stopped: its
    /// shutdown is the release to watch.
    async fn led() -> (Arc<Self>, Elector, tenure::ElectionName) {
        let store = Arc::new(Self::default());
        let a = elector(store.clone(), "a");
        let election = a.leadership().await.unwrap().election().clone();
        (store, a, election)
    }
}

#[async_trait::async_trait]
impl LeaseStore for ReleaseOrder {
    async fn try_acquire(
        &self,
        req: &tenure::store::AcquireRequest,
    ) -> Result<tenure::store::Acquire, tenure::StoreError> {
        self.inner.try_acquire(req).await
    }
    async fn renew(
        &self,
        held: &tenure::LeaseRecord,
        ttl: Duration,
    ) -> Result<tenure::store::Renew, tenure::StoreError> {
        self.inner.renew(held, ttl).await
    }
    async fn release(&self, held: &tenure::LeaseRecord) -> Result<(), tenure::StoreError> {
        let valid = self.term.lock().unwrap().as_ref().is_some_and(|t| !t.is_cancelled());
        self.released_while_valid.lock().unwrap().push(valid);
        let refused = {
            let mut refuse = self.refuse_releases.lock().unwrap();
            let r = *refuse > 0;
            *refuse = refuse.saturating_sub(1);
            r
        };
        if refused {
            return Err(tenure::StoreError::unavailable("refused by the test"));
        }
        let late = {
            let mut late = self.renewed_before_releases.lock().unwrap();
            let l = *late > 0;
            *late = late.saturating_sub(1);
            l
        };
        if late && let Some(cur) = self.inner.get(&held.election).await? {
            self.inner.renew(&cur, cur.ttl).await?;
        }
        self.inner.release(held).await?;
        if std::mem::take(&mut *self.granted_after_release.lock().unwrap()) {
            let req = tenure::store::AcquireRequest::new(held.election.clone(), held.holder.clone(), held.ttl);
            self.inner.try_acquire(&req).await?;
        }
        Ok(())
    }
    async fn get(&self, election: &tenure::ElectionName) -> Result<Option<tenure::LeaseRecord>, tenure::StoreError> {
        self.inner.get(election).await
    }
    async fn list(&self, prefix: &str) -> Result<Vec<tenure::LeaseRecord>, tenure::StoreError> {
        self.inner.list(prefix).await
    }
    async fn evict(
        &self,
        election: &tenure::ElectionName,
        how: Evict,
    ) -> Result<Option<tenure::LeaseRecord>, tenure::StoreError> {
        self.inner.evict(election, how).await
    }
    fn describe(&self) -> String {
        "release order".into()
    }
}

/// A release that fails (a store that timed out, a batch that failed) is not the end of
/// it: the record is read, and released if it is still this term, so standbys need not
/// wait a TTL (nor, on a store whose processes share one lease, as long as it lives).
#[tokio::test(start_paused = true)]
async fn a_failed_release_is_followed_by_a_read_and_a_release_of_the_record_as_it_stands() {
    let (store, a, election) = ReleaseOrder::led().await;
    *store.refuse_releases.lock().unwrap() = 1;
    a.shutdown().await;
    assert_eq!(store.released_while_valid.lock().unwrap().len(), 2, "released, refused, then released again");
    assert_eq!(store.get(&election).await.unwrap(), None, "the election is free at once");
}

/// Renewals whose caller gave up can land late, more than one of them (a batch goes on
/// with its rounds without its caller): here one just before the release, and another
/// just before the release of the record as read. Each moves the revision, so each of
/// those releases matches nothing; the runtime reads again and releases again until the
/// record is gone, so standbys need not wait a TTL (nor, on a store whose processes share
/// one lease, as long as that lives).
#[tokio::test(start_paused = true)]
async fn renewals_landing_just_before_each_release_do_not_keep_the_lease() {
    let (store, a, election) = ReleaseOrder::led().await;
    *store.renewed_before_releases.lock().unwrap() = 3;
    a.shutdown().await;
    assert_eq!(
        store.get(&election).await.unwrap().map(|r| r.holder),
        None,
        "the election is free at once, though a late renewal moved the record before each release"
    );
    assert_eq!(store.released_while_valid.lock().unwrap().len(), 4, "released, then read and released three times");
}

/// A grant of this holder's that lands after its release (a proclamation's acquire that
/// timed out as the term ended) is a term nobody works in: the runtime releases it too.
#[tokio::test(start_paused = true)]
async fn a_grant_of_its_own_landing_after_the_release_is_released_too() {
    let (store, a, election) = ReleaseOrder::led().await;
    *store.granted_after_release.lock().unwrap() = true;
    a.shutdown().await;
    assert_eq!(store.get(&election).await.unwrap().map(|r| r.token), None, "the late grant was left to expire");
    assert_eq!(store.released_while_valid.lock().unwrap().len(), 2, "the term released, then the late grant");
}

#[tokio::test(start_paused = true)]
async fn a_proclamation_granted_a_new_term_stops_the_work_before_giving_the_grant_back() {
    let store = Arc::new(ReleaseOrder::default());
    let a = elector(store.clone(), "a");
    let log = record(&a);
    let l = a.leadership().await.unwrap();
    *store.term.lock().unwrap() = Some(l.cancellation_token());
    // The record is lost (evicted at once, a store restored without it): the proclamation,
    // an acquire, is granted a new term, in which this process does not lead.
    store.evict(l.election(), Evict::Now).await.unwrap();
    assert!(matches!(l.set_metadata(b"x".to_vec()).await, Err(tenure::ProclaimError::TermEnded)));
    assert!(!l.is_valid(), "the term has ended");
    drop(l);
    settle().await;
    assert_eq!(
        store.released_while_valid.lock().unwrap().first(),
        Some(&false),
        "the new grant was given back, after the work stopped"
    );
    assert!(events(&log).contains(&Event::SteppedDown { reason: StepDownReason::Lost { to: None } }));
}

fn announcing(store: Arc<dyn LeaseStore>, holder: &str, priority: i32) -> Elector {
    Elector::builder(store, "jobs/sweeper")
        .holder(holder)
        .ttl(TTL)
        .jitter(0.0)
        .announce(true)
        .priority(priority)
        .build()
        .unwrap()
}

/// Each term's token, when its work started, and when it had stopped.
type Terms = Arc<Mutex<Vec<(u64, Instant, Option<Instant>)>>>;

/// Runs `e`'s work while it leads: notes when each term's work started and when it had
/// stopped, winding down for `wind_down` after its term ends.
fn worker(e: &Elector, wind_down: Duration) -> (Terms, tokio::task::JoinHandle<()>) {
    let terms: Terms = Arc::default();
    let (t, e) = (terms.clone(), e.clone());
    let task = tokio::spawn(async move {
        let _ = e
            .run_while_leader(|l| {
                let t = t.clone();
                async move {
                    t.lock().unwrap().push((l.token().0, Instant::now(), None));
                    l.cancelled().await;
                    tokio::time::sleep(wind_down).await;
                    t.lock().unwrap().last_mut().unwrap().2 = Some(Instant::now());
                }
            })
            .await;
    });
    (terms, task)
}

#[tokio::test(start_paused = true)]
async fn a_candidate_of_higher_priority_takes_over_once_the_leaders_work_has_stopped() {
    let store: Arc<dyn LeaseStore> = Arc::new(MemoryStore::new());
    let a = announcing(store.clone(), "a", 0);
    let log_a = record(&a);
    let (terms_a, _wa) = worker(&a, Duration::from_millis(400));
    tokio::time::sleep(TTL).await;
    assert_eq!(terms_a.lock().unwrap().len(), 1, "a leads alone");
    let b = announcing(store.clone(), "b", 5);
    let (terms_b, _wb) = worker(&b, Duration::ZERO);
    let joined = Instant::now();
    tokio::time::timeout(TTL, async {
        while terms_b.lock().unwrap().is_empty() {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
    .await
    .expect("the candidate of higher priority leads within a renew interval and the wind-down");
    let (a_token, _, a_stopped) = terms_a.lock().unwrap()[0];
    let (b_token, b_started, _) = terms_b.lock().unwrap()[0];
    let a_stopped = a_stopped.expect("a's work stopped");
    assert!(a_stopped <= b_started, "b's work starts only after a's has stopped ({a_stopped:?} > {b_started:?})");
    assert!(b_token > a_token);
    assert!(b_started - joined <= TTL / 3 + Duration::from_millis(500), "took {:?}", b_started - joined);
    assert!(events(&log_a).contains(&Event::SteppedDown {
        reason: StepDownReason::HandedOver { to: tenure::HolderId::new("b").unwrap() }
    }));
    // An equal priority never preempts, and a lower one never takes it back.
    let c = announcing(store.clone(), "c", 5);
    let (terms_c, _wc) = worker(&c, Duration::ZERO);
    tokio::time::sleep(TTL * 4).await;
    assert_eq!(terms_b.lock().unwrap().len(), 1, "b still leads in its first term");
    assert!(terms_b.lock().unwrap()[0].2.is_none());
    assert!(terms_c.lock().unwrap().is_empty() && terms_a.lock().unwrap().len() == 1);
}

#[tokio::test(start_paused = true)]
async fn a_winner_gives_back_an_election_reserved_for_another_candidate() {
    let store: Arc<dyn LeaseStore> = Arc::new(MemoryStore::new());
    let name = tenure::ElectionName::new("jobs/sweeper").unwrap();
    let c = announcing(store.clone(), "c", 0);
    c.leadership().await.unwrap();
    // x announces itself, but its acquires fail: it will not come for the election.
    let x_store = FaultyStore::new(store.clone()).only(&[Op::Acquire]);
    let x = announcing(Arc::new(x_store.clone()), "x", 0);
    x.start();
    let d = announcing(store.clone(), "d", 0);
    let log_d = record(&d);
    let (terms_d, _wd) = worker(&d, Duration::ZERO);
    tokio::time::sleep(TTL / 2).await;
    x_store.set(Fault::Unavailable);
    let (x_id, op) = (tenure::HolderId::new("x").unwrap(), tenure::HolderId::new("operator").unwrap());
    let reserved = Instant::now();
    tenure::reserve(&*store, &name, &x_id, &op, TTL).await.unwrap();
    c.shutdown().await;
    tokio::time::sleep(TTL / 2).await;
    assert!(terms_d.lock().unwrap().is_empty(), "no work under a lease reserved for someone else");
    assert_eq!(store.get(&name).await.unwrap(), None, "the lease was given back");
    assert!(!events(&log_d).iter().any(|e| matches!(e, Event::Elected { .. })), "and no term was handed out");
    // The reservation lasts a TTL; then anyone may lead.
    tokio::time::timeout(TTL * 2, async {
        while terms_d.lock().unwrap().is_empty() {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
    .await
    .expect("d leads once the reservation has run out");
    assert!(terms_d.lock().unwrap()[0].1 >= reserved + TTL);
}

#[tokio::test(start_paused = true)]
async fn a_reservation_for_a_candidate_that_does_not_announce_itself_is_ignored() {
    let store: Arc<dyn LeaseStore> = Arc::new(MemoryStore::new());
    let name = tenure::ElectionName::new("jobs/sweeper").unwrap();
    let (gone, op) = (tenure::HolderId::new("gone").unwrap(), tenure::HolderId::new("operator").unwrap());
    tenure::reserve(&*store, &name, &gone, &op, TTL).await.unwrap();
    let c = announcing(store.clone(), "c", 0);
    tokio::time::timeout(TTL / 10, c.leadership()).await.expect("c leads at once").unwrap();
}

#[tokio::test(start_paused = true)]
async fn an_eviction_with_a_reservation_hands_over_to_the_named_candidate() {
    let store: Arc<dyn LeaseStore> = Arc::new(MemoryStore::new());
    let name = tenure::ElectionName::new("jobs/sweeper").unwrap();
    let a = announcing(store.clone(), "a", 0);
    let (terms_a, _wa) = worker(&a, Duration::from_millis(300));
    tokio::time::sleep(TTL / 10).await;
    let others: Vec<_> = ["b", "c", "d"].iter().map(|h| announcing(store.clone(), h, 0)).collect();
    let work: Vec<_> = others.iter().map(|e| worker(e, Duration::ZERO)).collect();
    tokio::time::sleep(TTL).await;
    assert_eq!(terms_a.lock().unwrap().len(), 1);
    let (c, op) = (tenure::HolderId::new("c").unwrap(), tenure::HolderId::new("operator").unwrap());
    tenure::reserve(&*store, &name, &c, &op, TTL).await.unwrap();
    store.evict(&name, Evict::AfterTerm).await.unwrap();
    tokio::time::sleep(TTL).await;
    let a_stopped = terms_a.lock().unwrap()[0].2.expect("a stopped");
    let led: Vec<usize> = work.iter().map(|(t, _)| t.lock().unwrap().len()).collect();
    assert_eq!(led, [0, 1, 0], "only the named candidate leads");
    assert!(work[1].0.lock().unwrap()[0].1 >= a_stopped, "after the evicted leader's work stopped");
}

#[tokio::test(start_paused = true)]
async fn an_unhealthy_candidate_of_higher_priority_stops_drawing_the_election_back() {
    let store: Arc<dyn LeaseStore> = Arc::new(MemoryStore::new());
    let name = tenure::ElectionName::new("jobs/sweeper").unwrap();
    let a = announcing(store.clone(), "a", 5);
    let l = a.leadership().await.unwrap();
    let b = announcing(store.clone(), "b", 0);
    let (terms_b, _wb) = worker(&b, Duration::ZERO);
    tokio::time::sleep(TTL).await;
    // a finds itself unhealthy: it resigns and stands aside for a TTL.
    let listed = |s: Arc<dyn LeaseStore>, n: tenure::ElectionName| async move {
        tenure::candidates(&*s, &n).await.unwrap().iter().map(|c| c.holder.to_string()).collect::<Vec<_>>()
    };
    l.resign_for(TTL).await;
    tokio::time::sleep(TTL / 2).await;
    assert_eq!(terms_b.lock().unwrap().len(), 1, "b leads");
    assert_eq!(listed(store.clone(), name.clone()).await, ["b"], "a is not announced while it stands aside");
    // Back after its stand-aside: healthy again, a gets the election back.
    tokio::time::sleep(TTL * 2).await;
    let l = a.current().expect("a leads again once announced");
    let first_b = terms_b.lock().unwrap()[0];
    assert!(first_b.2.unwrap() - first_b.1 >= TTL, "b led for at least a's stand-aside");
    // Unhealthy twice in a row: it stays away twice as long.
    l.resign_for(TTL).await;
    tokio::time::sleep(TTL * 2 - TTL / 4).await;
    assert_eq!(listed(store.clone(), name.clone()).await, ["b"], "the second absence lasts two TTLs");
    assert_eq!(terms_b.lock().unwrap().len(), 2);
    assert!(terms_b.lock().unwrap()[1].2.is_none(), "b leads all the while");
}

#[tokio::test(start_paused = true)]
async fn a_leader_of_higher_priority_that_stops_is_not_handed_the_election_on_its_way_out() {
    let inner: Arc<dyn LeaseStore> = Arc::new(MemoryStore::new());
    // The departing leader's store is slow, so its releases take a while to land.
    let slow = FaultyStore::new(inner.clone());
    let a = announcing(Arc::new(slow.clone()), "a", 5);
    a.leadership().await.unwrap();
    let b = announcing(inner.clone(), "b", 0);
    let log_b = record(&b);
    b.start();
    tokio::time::sleep(TTL).await;
    slow.set(Fault::Delay(50));
    a.shutdown().await;
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert!(b.current().is_some(), "b leads at once: {:?}", events(&log_b));
    assert!(!events(&log_b).iter().any(|e| matches!(e, Event::SteppedDown { .. })));
}

#[tokio::test(start_paused = true)]
async fn a_leader_that_handed_over_takes_over_at_once_when_its_successor_stops() {
    let store: Arc<dyn LeaseStore> = Arc::new(MemoryStore::new());
    let a = announcing(store.clone(), "a", 0);
    a.leadership().await.unwrap();
    let b = announcing(store.clone(), "b", 5);
    let l = tokio::time::timeout(TTL, b.leadership()).await.expect("b takes over").unwrap();
    drop(l);
    // Within the reservation's TTL, the successor stops: a needs no reservation to end.
    b.shutdown().await;
    let stopped = Instant::now();
    let l = tokio::time::timeout(TTL, a.leadership()).await.expect("a leads again").unwrap();
    assert!(Instant::now() - stopped < Duration::from_millis(100), "took {:?}", Instant::now() - stopped);
    drop(l);
}

#[tokio::test(start_paused = true)]
async fn a_leader_of_higher_priority_that_is_dropped_or_resigns_unhealthy_is_not_handed_the_election_back() {
    for how in ["unhealthy", "dropped"] {
        let inner: Arc<dyn LeaseStore> = Arc::new(MemoryStore::new());
        // The departing leader's store is slow, so its releases take a while to land.
        let slow = FaultyStore::new(inner.clone());
        let a = announcing(Arc::new(slow.clone()), "a", 5);
        let l = a.leadership().await.unwrap();
        let b = announcing(inner.clone(), "b", 0);
        let log_b = record(&b);
        b.start();
        tokio::time::sleep(TTL).await;
        slow.set(Fault::Delay(50));
        if how == "dropped" {
            drop(l);
            drop(a);
        } else {
            tokio::spawn(l.resign_for(TTL));
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
        assert!(b.current().is_some(), "{how}: b leads at once: {:?}", events(&log_b));
        tokio::time::sleep(TTL / 2).await;
        assert!(b.current().is_some(), "{how}: and goes on leading");
        assert!(!events(&log_b).iter().any(|e| matches!(e, Event::SteppedDown { .. })), "{how}");
    }
}

#[tokio::test(start_paused = true)]
async fn what_announcing_costs_in_store_calls_per_candidate() {
    // Three candidates, each through a counting store of its own; the same again with
    // announcing switched on. Steady state, ten TTLs, on a store that notifies.
    async fn calls_per_interval(announce: bool) -> Vec<(String, f64)> {
        let inner: Arc<dyn LeaseStore> = Arc::new(MemoryStore::new());
        let mut counted = Vec::new();
        for (holder, priority) in [("a", 2), ("b", 1), ("c", 0)] {
            let store = FaultyStore::new(inner.clone());
            let e = Elector::builder(Arc::new(store.clone()), "jobs/sweeper")
                .holder(holder)
                .ttl(TTL)
                .jitter(0.0)
                .announce(announce)
                .priority(priority)
                .build()
                .unwrap();
            e.start();
            counted.push((holder, store, e));
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        tokio::time::sleep(TTL * 2).await;
        let before: Vec<u64> = counted.iter().map(|(_, s, _)| s.calls()).collect();
        tokio::time::sleep(TTL * 10).await;
        // Renew intervals (TTL/3) in ten TTLs: 30.
        let out = counted
            .iter()
            .zip(before)
            .map(|((h, s, e), b)| {
                let role = if e.current().is_some() { "leader" } else { "follower" };
                (format!("{h} ({role})"), (s.calls() - b) as f64 / 30.0)
            })
            .collect();
        for (_, _, e) in &counted {
            e.shutdown().await;
        }
        out
    }
    let plain = calls_per_interval(false).await;
    let announcing = calls_per_interval(true).await;
    eprintln!("store calls per renew interval, plain: {plain:?}; announcing: {announcing:?}");
    // Plain: the leader renews once an interval; followers that watch make no calls.
    assert_eq!(plain.iter().map(|(_, c)| *c).sum::<f64>(), 1.0, "{plain:?}");
    // Announcing: each candidate renews its presence once an interval, and the leader
    // also lists the candidates once an interval: 1 + 1 + 1 for the leader, 1 per follower.
    assert!(announcing.iter().any(|(h, c)| h.starts_with("a (leader") && *c <= 3.0), "{announcing:?}");
    for (h, c) in announcing.iter().filter(|(h, _)| h.contains("follower")) {
        assert!(*c <= 1.0, "{h}: {c} calls per renew interval");
    }
}
