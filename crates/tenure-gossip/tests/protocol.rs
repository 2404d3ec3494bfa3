//! The protocol on an in-process hub, under paused time.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use tenure_gossip::{Client, Config, Event, GossipError, Handler, Handlers, Job, MemoryHub, Transport, Worker};
use tokio::sync::broadcast;
use tokio::task::JoinHandle;
use tokio::time::Instant;

/// Records every job it is asked to start.
#[derive(Clone, Default)]
struct Recorder(Arc<Mutex<Vec<Job>>>);

#[async_trait]
impl Handler for Recorder {
    async fn start(&self, job: &Job) -> Result<Option<JoinHandle<()>>, String> {
        self.0.lock().unwrap().push(job.clone());
        Ok(None)
    }
}

impl Recorder {
    fn runs(&self) -> BTreeMap<String, Vec<String>> {
        let mut by_id: BTreeMap<String, Vec<String>> = BTreeMap::new();
        for j in self.0.lock().unwrap().iter() {
            by_id.entry(j.election.clone()).or_default().push(j.worker.clone());
        }
        by_id
    }
}

fn config(id: &str) -> Config {
    Config { id: id.into(), ..Config::default() }
}

async fn worker(hub: &MemoryHub, id: &str, recorder: &Recorder) -> Worker {
    let mut handlers = Handlers::new();
    handlers.insert("job", recorder.clone()).unwrap();
    Worker::start(Arc::new(hub.clone()), config(id), handlers, None).await.unwrap()
}

/// The winner each worker decided, per election, from its events so far.
fn decisions(events: &mut broadcast::Receiver<Event>) -> BTreeMap<String, Option<String>> {
    let mut out = BTreeMap::new();
    while let Ok(e) = events.try_recv() {
        if let Event::Decided(d) = e {
            assert!(out.insert(d.election.clone(), d.winner).is_none(), "{} decided twice", d.election);
        }
    }
    out
}

const WAIT: Duration = Duration::from_secs(30);

/// The events a worker emitted since the last call.
fn received(events: &mut broadcast::Receiver<Event>) -> Vec<Event> {
    std::iter::from_fn(|| events.try_recv().ok()).collect()
}

#[tokio::test(start_paused = true)]
async fn a_lone_worker_elects_itself() {
    let hub = MemoryHub::new();
    let rec = Recorder::default();
    let w = worker(&hub, "solo.1", &rec).await;
    let client = Client::connect(Arc::new(hub.clone())).await.unwrap();
    let t0 = Instant::now();
    let outcome = client.elect("nightly", "job", "go", WAIT).await.unwrap();
    assert_eq!(outcome.winner.as_deref(), Some("solo.1"));
    assert!(outcome.started && outcome.error.is_none(), "{outcome:?}");
    assert!(t0.elapsed() < Duration::from_millis(10), "a lone worker waits for nobody: {:?}", t0.elapsed());
    assert_eq!(rec.runs()["nightly"], ["solo.1"]);
    w.shutdown().await.unwrap();
}

#[tokio::test(start_paused = true)]
async fn five_workers_agree_and_each_election_runs_once() {
    let hub = MemoryHub::new();
    let rec = Recorder::default();
    let mut workers = Vec::new();
    let mut events = Vec::new();
    for i in 1..=5 {
        let mut w = worker(&hub, &format!("host-{i}.{}", 100 + i), &rec).await;
        events.push(w.events());
        workers.push(w);
    }
    assert_eq!(workers[0].members().await.unwrap().len(), 5);
    let client = Client::connect(Arc::new(hub.clone())).await.unwrap();
    let mut winners = BTreeMap::new();
    for n in 0..60 {
        let id = format!("job-{n}");
        let outcome = client.elect(&id, "job", "go", WAIT).await.unwrap();
        assert!(outcome.started, "{outcome:?}");
        winners.insert(id, outcome.winner);
    }
    // Every worker decided every election, and all the same way.
    for ev in &mut events {
        assert_eq!(decisions(ev), winners);
    }
    let runs = rec.runs();
    assert_eq!(runs.len(), 60);
    for (id, ran_on) in &runs {
        assert_eq!(ran_on.len(), 1, "{id} ran on {ran_on:?}");
        assert_eq!(Some(&ran_on[0]), winners[id].as_ref());
    }
}

#[tokio::test(start_paused = true)]
async fn a_dead_worker_is_waited_for_until_lost_then_left_out() {
    let hub = MemoryHub::new();
    let rec = Recorder::default();
    let mut a = worker(&hub, "a.1", &rec).await;
    let b = worker(&hub, "b.2", &rec).await;
    let c = worker(&hub, "c.3", &rec).await;
    let mut events = a.events();
    drop(c); // dies without a word
    let client = Client::connect(Arc::new(hub.clone())).await.unwrap();
    let t0 = Instant::now();
    let outcome = client.elect("after-crash", "job", "go", WAIT).await.unwrap();
    let took = t0.elapsed();
    let cfg = Config::default();
    assert!(outcome.started, "{outcome:?}");
    assert_ne!(outcome.winner.as_deref(), Some("c.3"));
    // Not before the timeout, and not much after the dead worker was lost.
    assert!(took >= cfg.election_timeout, "{took:?}");
    assert!(took <= cfg.lost_after + cfg.heartbeat, "{took:?}");
    let mut lost = false;
    let mut without = None;
    while let Ok(e) = events.try_recv() {
        match e {
            Event::MemberLost(m) if m == "c.3" => lost = true,
            Event::Decided(d) => without = Some(d.without),
            _ => {}
        }
    }
    assert!(lost);
    assert_eq!(without, Some(vec!["c.3".to_string()]));
    // Later elections no longer wait.
    let t0 = Instant::now();
    client.elect("later", "job", "go", WAIT).await.unwrap();
    assert!(t0.elapsed() < Duration::from_millis(10));
    assert_eq!(rec.runs().values().map(Vec::len).sum::<usize>(), 2);
    drop(b);
}

#[tokio::test(start_paused = true)]
async fn a_worker_that_leaves_is_not_waited_for() {
    let hub = MemoryHub::new();
    let rec = Recorder::default();
    let mut a = worker(&hub, "a.1", &rec).await;
    let b = worker(&hub, "b.2", &rec).await;
    let mut events = a.events();
    b.shutdown().await.unwrap();
    tokio::time::sleep(Duration::from_millis(1)).await;
    assert!(std::iter::from_fn(|| events.try_recv().ok()).any(|e| e == Event::MemberLeft("b.2".into())));
    assert_eq!(a.members().await.unwrap(), ["a.1"]);
    let client = Client::connect(Arc::new(hub.clone())).await.unwrap();
    let t0 = Instant::now();
    let outcome = client.elect("x", "job", "go", WAIT).await.unwrap();
    assert_eq!(outcome.winner.as_deref(), Some("a.1"));
    assert!(t0.elapsed() < Duration::from_millis(10));
}

#[tokio::test(start_paused = true)]
async fn an_unknown_topic_is_a_clear_error_at_the_initiator() {
    let hub = MemoryHub::new();
    let rec = Recorder::default();
    let _a = worker(&hub, "a.1", &rec).await;
    let _b = worker(&hub, "b.2", &rec).await;
    let client = Client::connect(Arc::new(hub.clone())).await.unwrap();
    let outcome = client.elect("x", "no-such-topic", "go", WAIT).await.unwrap();
    assert_eq!(outcome.winner, None);
    assert!(!outcome.started);
    let error = outcome.error.unwrap();
    assert!(error.contains("no live worker has a handler for topic \"no-such-topic\""), "{error}");
    assert!(rec.runs().is_empty());
}

#[tokio::test(start_paused = true)]
async fn only_workers_with_the_handler_can_win() {
    let hub = MemoryHub::new();
    let rec = Recorder::default();
    // "a.1" would win every tie, but it has no handler for "job".
    let _a = Worker::start(Arc::new(hub.clone()), config("a.1"), Handlers::new(), None).await.unwrap();
    let _b = worker(&hub, "b.2", &rec).await;
    let client = Client::connect(Arc::new(hub.clone())).await.unwrap();
    for n in 0..10 {
        let outcome = client.elect(&format!("e{n}"), "job", "go", WAIT).await.unwrap();
        assert_eq!(outcome.winner.as_deref(), Some("b.2"));
    }
}

#[tokio::test(start_paused = true)]
async fn a_repeated_id_answers_the_first_outcome_and_runs_nothing() {
    let hub = MemoryHub::new();
    let rec = Recorder::default();
    let _a = worker(&hub, "a.1", &rec).await;
    let _b = worker(&hub, "b.2", &rec).await;
    let client = Client::connect(Arc::new(hub.clone())).await.unwrap();
    let first = client.elect("once", "job", "go", WAIT).await.unwrap();
    assert!(!first.repeat);
    let again = client.elect("once", "job", "go", WAIT).await.unwrap();
    assert!(again.repeat, "{again:?}");
    assert_eq!(again.winner, first.winner);
    assert_eq!(rec.runs()["once"].len(), 1);
}

#[tokio::test(start_paused = true)]
async fn decided_ids_are_forgotten_after_the_retention() {
    let hub = MemoryHub::new();
    let rec = Recorder::default();
    let cfg = Config { retention: Duration::from_secs(60), ..config("a.1") };
    let mut handlers = Handlers::new();
    handlers.insert("job", rec.clone()).unwrap();
    let _a = Worker::start(Arc::new(hub.clone()), cfg, handlers, None).await.unwrap();
    let client = Client::connect(Arc::new(hub.clone())).await.unwrap();
    client.elect("daily", "job", "go", WAIT).await.unwrap();
    tokio::time::sleep(Duration::from_secs(30)).await;
    assert!(client.elect("daily", "job", "go", WAIT).await.unwrap().repeat);
    tokio::time::sleep(Duration::from_secs(31)).await;
    assert!(!client.elect("daily", "job", "go", WAIT).await.unwrap().repeat);
    assert_eq!(rec.runs()["daily"].len(), 2);
}

/// Publishes raw messages as a fake member.
async fn raw(hub: &MemoryHub, body: serde_json::Value) {
    let link = hub.open().await.unwrap();
    link.publisher.publish(serde_json::to_vec(&body).unwrap()).await.unwrap();
}

#[tokio::test(start_paused = true)]
async fn an_election_a_live_member_never_answers_is_given_up_and_forgotten() {
    let hub = MemoryHub::new();
    let rec = Recorder::default();
    let mut a = worker(&hub, "a.1", &rec).await;
    let mut events = a.events();
    // "mute.9" heartbeats but never answers elections (its messages are lost).
    let beats = {
        let hub = hub.clone();
        tokio::spawn(async move {
            for clock in 1.. {
                raw(&hub, serde_json::json!({"v":3,"from":"mute.9","incarnation":1,"clock":clock,"type":"heartbeat"}))
                    .await;
                tokio::time::sleep(Duration::from_secs(1)).await;
            }
        })
    };
    tokio::time::sleep(Duration::from_millis(10)).await;
    assert_eq!(a.members().await.unwrap(), ["a.1", "mute.9"]);
    let client = Client::connect(Arc::new(hub.clone())).await.unwrap();
    let t0 = Instant::now();
    let err = client.elect("stuck", "job", "go", Duration::from_secs(60)).await.unwrap_err();
    assert!(matches!(&err, GossipError::NoOutcome { answered, .. } if answered == &["a.1"]), "{err}");
    let abandoned = std::iter::from_fn(|| events.try_recv().ok())
        .any(|e| e == Event::Abandoned { election: "stuck".into(), waiting: vec!["mute.9".into()] });
    assert!(abandoned);
    assert!(t0.elapsed() >= Config::default().give_up_after());
    assert!(rec.runs().is_empty(), "a given-up election runs nothing");
    beats.abort();
}

#[tokio::test(start_paused = true)]
async fn duplicate_and_late_messages_change_nothing() {
    let hub = MemoryHub::new();
    let rec = Recorder::default();
    let mut a = worker(&hub, "a.1", &rec).await;
    let mut b = worker(&hub, "b.2", &rec).await;
    let (mut ea, mut eb) = (a.events(), b.events());
    // Record every message of one election, then play them all again, twice.
    let mut tap = hub.open().await.unwrap();
    let client = Client::connect(Arc::new(hub.clone())).await.unwrap();
    let first = client.elect("dup", "job", "go", WAIT).await.unwrap();
    tokio::time::sleep(Duration::from_millis(10)).await;
    let mut seen = Vec::new();
    while let Ok(m) = tap.messages.try_recv() {
        seen.push(m);
    }
    assert!(seen.len() >= 4, "{} messages", seen.len());
    for _ in 0..2 {
        for m in &seen {
            tap.publisher.publish(m.clone()).await.unwrap();
        }
    }
    // A candidate for the election from a worker that was never in it, arriving late.
    raw(
        &hub,
        serde_json::json!({"v":3,"from":"late.0","incarnation":1,"clock":0,"type":"candidate",
            "election":{"id":"dup","digest":first.digest},"handles":true}),
    )
    .await;
    tokio::time::sleep(Duration::from_secs(10)).await;
    assert_eq!(rec.runs()["dup"].len(), 1);
    assert_eq!(decisions(&mut ea), BTreeMap::from([("dup".to_string(), first.winner.clone())]));
    assert_eq!(decisions(&mut eb), BTreeMap::from([("dup".to_string(), first.winner)]));
}

#[tokio::test(start_paused = true)]
async fn a_joining_worker_moves_its_clock_past_the_members() {
    let hub = MemoryHub::new();
    let rec = Recorder::default();
    let mut a = worker(&hub, "a.1", &rec).await;
    let events = a.events();
    let client = Client::connect(Arc::new(hub.clone())).await.unwrap();
    for n in 0..30 {
        client.elect(&format!("warm-{n}"), "job", "go", WAIT).await.unwrap();
    }
    let before = client.members(Duration::from_millis(100)).await.unwrap();
    assert_eq!(before.len(), 1);
    let a_clock = before[0].clock;
    assert!(a_clock > 30);
    let b = worker(&hub, "b.2", &rec).await;
    let mut events = events.resubscribe();
    // Started by b itself, so that b's bid owes nothing to a clock carried by the request.
    b.elect("first-with-b", "job", "go").await.unwrap();
    tokio::time::sleep(Duration::from_millis(10)).await;
    let bids = std::iter::from_fn(|| events.try_recv().ok())
        .find_map(|e| match e {
            Event::Decided(d) if d.election == "first-with-b" => Some(d.bids),
            _ => None,
        })
        .unwrap();
    let b_bid = bids.iter().find(|b| b.worker == "b.2").expect("b stood").clock;
    assert!(b_bid > a_clock, "b's bid {b_bid} is not past a's clock {a_clock} when b joined");
}

#[tokio::test(start_paused = true)]
async fn bad_ids_and_settings_are_refused() {
    let hub = MemoryHub::new();
    let client = Client::connect(Arc::new(hub.clone())).await.unwrap();
    let e = client.elect("bad id!", "job", "", WAIT).await.unwrap_err().to_string();
    assert!(e.contains("invalid election id"), "{e}");
    let e = client.elect("ok", "", "", WAIT).await.unwrap_err().to_string();
    assert!(e.contains("invalid topic"), "{e}");
    let cfg = Config { lost_after: Duration::from_secs(1), heartbeat: Duration::from_secs(2), ..config("a.1") };
    let e = Worker::start(Arc::new(hub.clone()), cfg, Handlers::new(), None).await.err().unwrap().to_string();
    assert!(e.contains("lost-after"), "{e}");
    // Nobody in the group: the initiator says so.
    let e = client.elect("alone", "job", "", Duration::from_secs(3)).await.unwrap_err();
    assert!(matches!(e, GossipError::NoWorkers { .. }), "{e}");
}

/// Faults one worker's link to the hub: its publishes hang (the worker is stuck, as a
/// frozen process is, while messages queue for it), or fail, or its link is down (the
/// subscription closes and reconnecting fails).
#[derive(Clone)]
struct Faults {
    hang: Arc<std::sync::atomic::AtomicBool>,
    fail: Arc<std::sync::atomic::AtomicBool>,
    down: Arc<tokio::sync::watch::Sender<bool>>,
    /// Every publish takes this long (ms): a slow link or an overloaded host.
    slow_ms: Arc<std::sync::atomic::AtomicU64>,
    /// Every message reaches the worker this long (ms) after the hub sent it, in order: a
    /// worker behind its queue.
    lag_ms: Arc<std::sync::atomic::AtomicU64>,
    /// Messages of these types the broker loses (the publish succeeds).
    lose: Arc<Mutex<Vec<&'static str>>>,
}

impl Faults {
    fn new() -> Self {
        Self {
            hang: Default::default(),
            fail: Default::default(),
            down: Arc::new(tokio::sync::watch::channel(false).0),
            slow_ms: Default::default(),
            lag_ms: Default::default(),
            lose: Default::default(),
        }
    }
    fn set(flag: &std::sync::atomic::AtomicBool, on: bool) {
        flag.store(on, std::sync::atomic::Ordering::SeqCst);
    }
    fn get(flag: &std::sync::atomic::AtomicBool) -> bool {
        flag.load(std::sync::atomic::Ordering::SeqCst)
    }
}

struct Faulty {
    hub: MemoryHub,
    faults: Faults,
}

struct FaultyPublisher {
    inner: Arc<dyn tenure_gossip::Publisher>,
    faults: Faults,
}

#[async_trait]
impl tenure_gossip::Publisher for FaultyPublisher {
    async fn publish(&self, payload: Vec<u8>) -> Result<(), GossipError> {
        while Faults::get(&self.faults.hang) {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        let slow = self.faults.slow_ms.load(std::sync::atomic::Ordering::SeqCst);
        if slow > 0 {
            tokio::time::sleep(Duration::from_millis(slow)).await;
        }
        let kind = serde_json::from_slice::<serde_json::Value>(&payload).unwrap_or_default()["type"].clone();
        if self.faults.lose.lock().unwrap().iter().any(|t| kind == *t) {
            return Ok(());
        }
        if Faults::get(&self.faults.fail) || *self.faults.down.borrow() {
            return Err(GossipError::Broker { message: "publish failed (injected)".into(), source: None });
        }
        self.inner.publish(payload).await
    }
}

#[async_trait]
impl Transport for Faulty {
    async fn open(&self) -> Result<tenure_gossip::Link, GossipError> {
        if *self.faults.down.borrow() {
            return Err(GossipError::Broker { message: "the broker is down (injected)".into(), source: None });
        }
        let mut inner = self.hub.open().await?;
        let (tx, rx) = tokio::sync::mpsc::channel(4096);
        let mut down = self.faults.down.subscribe();
        // Each message is handed on at its time (now + lag), in order.
        let (lagged, mut due) = tokio::sync::mpsc::unbounded_channel::<(Instant, Vec<u8>)>();
        let lag_ms = self.faults.lag_ms.clone();
        tokio::spawn(async move {
            loop {
                tokio::select! {
                    m = inner.messages.recv() => match m {
                        Some(m) => {
                            let lag = Duration::from_millis(lag_ms.load(std::sync::atomic::Ordering::SeqCst));
                            if lagged.send((Instant::now() + lag, m)).is_err() { break }
                        }
                        None => break,
                    },
                    _ = down.changed() => if *down.borrow() { break },
                }
            }
        });
        tokio::spawn(async move {
            while let Some((at, m)) = due.recv().await {
                tokio::time::sleep_until(at).await;
                if tx.send(m).await.is_err() {
                    break;
                }
            }
        });
        let publisher = Arc::new(FaultyPublisher { inner: inner.publisher, faults: self.faults.clone() });
        Ok(tenure_gossip::Link { publisher, messages: rx })
    }
    fn describe(&self) -> String {
        "a faulty hub".into()
    }
}

/// Three workers `w0.0`, `w1.1`, `w2.2`, each behind its own faults.
async fn faulty_group(hub: &MemoryHub, rec: &Recorder) -> (Vec<Worker>, Vec<Faults>) {
    let faults: Vec<Faults> = (0..3).map(|_| Faults::new()).collect();
    let mut workers = Vec::new();
    for (i, f) in faults.iter().enumerate() {
        workers.push(faulty_worker(hub, &format!("w{i}.{i}"), rec, f).await);
    }
    (workers, faults)
}

/// Takes every link in `faults` down after `after`, for `length`.
fn outage(faults: Vec<Faults>, after: Duration, length: Duration) -> JoinHandle<()> {
    tokio::spawn(async move {
        tokio::time::sleep(after).await;
        for f in &faults {
            f.down.send_replace(true);
        }
        tokio::time::sleep(length).await;
        for f in &faults {
            f.down.send_replace(false);
        }
    })
}

async fn faulty_worker(hub: &MemoryHub, id: &str, recorder: &Recorder, faults: &Faults) -> Worker {
    let mut handlers = Handlers::new();
    handlers.insert("job", recorder.clone()).unwrap();
    let transport = Arc::new(Faulty { hub: hub.clone(), faults: faults.clone() });
    Worker::start(transport, config(id), handlers, None).await.unwrap()
}

/// Starts `n` elections at once from a client, and returns each one's result.
async fn burst(hub: &MemoryHub, prefix: &str, n: usize, wait: Duration) -> Vec<Result<tenure_gossip::Outcome, String>> {
    let client = Arc::new(Client::connect(Arc::new(hub.clone())).await.unwrap());
    let tasks: Vec<_> = (0..n)
        .map(|i| {
            let client = client.clone();
            let id = format!("{prefix}{i}");
            tokio::spawn(async move { client.elect(&id, "job", "go", wait).await.map_err(|e| e.to_string()) })
        })
        .collect();
    let mut out = Vec::new();
    for t in tasks {
        out.push(t.await.unwrap());
    }
    out
}

/// No election ran twice, and every one the initiator was told started did run, on the
/// worker named.
fn at_most_once_and_started_means_ran(
    rec: &Recorder,
    prefix: &str,
    results: &[Result<tenure_gossip::Outcome, String>],
) {
    let runs = rec.runs();
    for (id, ran_on) in &runs {
        assert!(ran_on.len() <= 1, "{id} ran {} times, on {ran_on:?}", ran_on.len());
    }
    for (i, r) in results.iter().enumerate() {
        let id = format!("{prefix}{i}");
        if let Ok(o) = r
            && o.started
        {
            assert_eq!(runs.get(&id), Some(&vec![o.winner.clone().unwrap()]), "{id}: told started by {:?}", o.winner);
        }
        if let Ok(o) = r
            && !o.started
        {
            assert!(!runs.contains_key(&id), "{id} was reported not started, yet it ran on {:?}", runs[&id]);
        }
    }
}

#[tokio::test(start_paused = true)]
async fn a_stalled_worker_gives_up_and_rejoins_instead_of_deciding_alone() {
    let hub = MemoryHub::new();
    let rec = Recorder::default();
    let fa = Faults::new();
    let mut a = faulty_worker(&hub, "a.1", &rec, &fa).await;
    let _b = worker(&hub, "b.2", &rec).await;
    let _c = worker(&hub, "c.3", &rec).await;
    let mut events = a.events();
    tokio::time::sleep(Duration::from_millis(100)).await;
    // a freezes at its next publish (its answer to the first election), for 8 s, while
    // messages queue for it; b and c lose it and decide without it.
    Faults::set(&fa.hang, true);
    let thaw = {
        let fa = fa.clone();
        tokio::spawn(async move {
            tokio::time::sleep(Duration::from_secs(8)).await;
            Faults::set(&fa.hang, false);
        })
    };
    let results = burst(&hub, "p", 5, Duration::from_secs(20)).await;
    thaw.await.unwrap();
    tokio::time::sleep(Duration::from_secs(10)).await;
    at_most_once_and_started_means_ran(&rec, "p", &results);
    // b and c decided every one without a, once they lost it.
    assert!(results.iter().all(|r| r.as_ref().is_ok_and(|o| o.started)), "{results:?}");
    let rejoined = std::iter::from_fn(|| events.try_recv().ok()).any(|e| matches!(e, Event::Rejoining { .. }));
    assert!(rejoined, "a did not notice it had been stalled");
    // And a stands again afterwards.
    assert_eq!(a.members().await.unwrap().len(), 3);
}

#[tokio::test(start_paused = true)]
async fn a_late_leave_from_before_a_restart_does_not_remove_the_restarted_worker() {
    let hub = MemoryHub::new();
    let rec = Recorder::default();
    let b = worker(&hub, "b.2", &rec).await;
    let say = |incarnation: u64, clock: u64, kind: &str| {
        raw(&hub, serde_json::json!({"v":3,"from":"a.1","incarnation":incarnation,"clock":clock,"type":kind}))
    };
    // a.1 runs, stops (its leave is delayed), and starts again with the same id.
    say(7, 1, "hello").await;
    say(7, 2, "heartbeat").await;
    say(8, 1, "hello").await;
    say(8, 2, "heartbeat").await;
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert_eq!(b.members().await.unwrap(), ["a.1", "b.2"]);
    say(7, 3, "leave").await;
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert_eq!(b.members().await.unwrap(), ["a.1", "b.2"], "the running a.1 was taken for gone");
    // Its own leave counts.
    say(8, 3, "leave").await;
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert_eq!(b.members().await.unwrap(), ["b.2"]);
}

#[tokio::test(start_paused = true)]
async fn a_winner_that_hears_of_another_winner_of_its_election_reports_it() {
    let hub = MemoryHub::new();
    let rec = Recorder::default();
    let mut a = worker(&hub, "a.1", &rec).await;
    let mut events = a.events();
    let client = Client::connect(Arc::new(hub.clone())).await.unwrap();
    let o = client.elect("x", "job", "go", WAIT).await.unwrap();
    assert_eq!((o.winner.as_deref(), o.started), (Some("a.1"), true));
    // A worker a never counted (the other side of a split that healed) ran x too.
    raw(
        &hub,
        serde_json::json!({"v":3,"from":"z.9","incarnation":1,"clock":100,"type":"outcome","id":"x","topic":"job",
            "digest":o.digest,"winner":"z.9","started":true,"error":null}),
    )
    .await;
    tokio::time::sleep(Duration::from_millis(100)).await;
    let reported = received(&mut events).into_iter().any(|e| {
        matches!(e, Event::Disagreement { ref election, ref ours, ref theirs, .. }
            if election == "x" && ours.as_deref() == Some("a.1") && theirs.as_deref() == Some("z.9"))
    });
    assert!(reported, "a.1 ran x and heard z.9 ran it too, and said nothing");
}

/// Waits until the hub carries a message of `kind` from `from`, read through `tap`.
async fn next_from(tap: &mut tenure_gossip::Link, from: &str, kind: &str) {
    while let Some(m) = tap.messages.recv().await {
        let v: serde_json::Value = serde_json::from_slice(&m).unwrap_or_default();
        if v["from"] == from && v["type"] == kind {
            return;
        }
    }
    panic!("the hub closed");
}

#[tokio::test(start_paused = true)]
async fn a_member_is_lost_only_after_a_silence_it_would_have_noticed_itself() {
    // p's publish hangs 2.3 s (less than a stall) and o's 2 s (idem), so that when o wakes,
    // p has been silent at the broker for more than 3 s of o's own messages and for 5 s of
    // o's time, while p's late heartbeat waits unread behind o's stall. p never cut itself
    // off (nothing of its own was missing for echo_limit), so it went on answering and
    // deciding: o must not lose it, or the two would decide elections with different
    // member sets (each could run the same one).
    let hub = MemoryHub::new();
    let rec = Recorder::default();
    let (fp, fo) = (Faults::new(), Faults::new());
    let mut p = faulty_worker(&hub, "a.1", &rec, &fp).await;
    let mut o = faulty_worker(&hub, "b.2", &rec, &fo).await;
    let (mut p_events, mut o_events) = (p.events(), o.events());
    let probe = || raw(&hub, serde_json::json!({"v":3,"from":"client.9","incarnation":1,"clock":1,"type":"probe"}));
    // Both joined. p's next heartbeat is its last word before the hang.
    let mut tap = hub.open().await.unwrap();
    next_from(&mut tap, "a.1", "heartbeat").await;
    drop(tap);
    let t0 = Instant::now();
    let at = move |secs: f64| tokio::time::sleep_until(t0 + Duration::from_secs_f64(secs));
    assert_eq!(p.members().await.unwrap(), ["a.1", "b.2"]);
    at(1.0).await;
    Faults::set(&fp.hang, true);
    probe().await; // p's answer hangs
    at(3.05).await;
    probe().await; // o's answer comes back: o has heard itself 3.05 s after p's last word
    at(3.1).await;
    Faults::set(&fo.hang, true);
    probe().await; // o's answer hangs, with p's late messages queued behind it
    at(3.3).await;
    Faults::set(&fp.hang, false);
    at(5.1).await;
    Faults::set(&fo.hang, false);
    at(10.0).await;
    let (p_saw, o_saw) = (received(&mut p_events), received(&mut o_events));
    assert!(
        !p_saw.iter().any(|e| matches!(e, Event::Rejoining { .. })),
        "the test's premise: p never noticed: {p_saw:?}"
    );
    assert!(
        !o_saw.iter().any(|e| matches!(e, Event::MemberLost(m) if m == "a.1")),
        "o lost p, which never noticed a silence: {o_saw:?}"
    );
    assert_eq!(o.members().await.unwrap(), ["a.1", "b.2"]);
}

#[tokio::test(start_paused = true)]
async fn a_worker_whose_answers_fail_to_publish_and_whose_link_drops_decides_nothing() {
    // A broker outage for one worker, longer than lost_after: its candidates fail to
    // publish, then its link drops and it cannot reconnect for 8 s. It must not count
    // its own unpublished candidates, nor decide on what it had when the link dropped.
    let hub = MemoryHub::new();
    let rec = Recorder::default();
    let fa = Faults::new();
    let _a = faulty_worker(&hub, "a.1", &rec, &fa).await;
    let _b = worker(&hub, "b.2", &rec).await;
    let _c = worker(&hub, "c.3", &rec).await;
    tokio::time::sleep(Duration::from_millis(100)).await;
    Faults::set(&fa.fail, true);
    let outage = {
        let fa = fa.clone();
        tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(50)).await;
            fa.down.send_replace(true);
            tokio::time::sleep(Duration::from_secs(8)).await;
            fa.down.send_replace(false);
            Faults::set(&fa.fail, false);
        })
    };
    let results = burst(&hub, "q", 20, Duration::from_secs(30)).await;
    outage.await.unwrap();
    tokio::time::sleep(Duration::from_secs(10)).await;
    at_most_once_and_started_means_ran(&rec, "q", &results);
    assert_eq!(rec.runs().len(), 20, "b and c decide every one without a");
}

#[tokio::test(start_paused = true)]
async fn a_broker_outage_for_everyone_longer_than_lost_after_runs_nothing_twice() {
    let hub = MemoryHub::new();
    let rec = Recorder::default();
    let (_workers, faults) = faulty_group(&hub, &rec).await;
    tokio::time::sleep(Duration::from_millis(100)).await;
    // One worker (the first by the tie rule) is slow to answer (its publishes hang), so
    // elections are under way when every link drops for 8 s.
    Faults::set(&faults[0].hang, true);
    let outage = {
        let faults = faults.clone();
        tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(500)).await;
            for f in &faults {
                f.down.send_replace(true);
            }
            Faults::set(&faults[0].hang, false);
            tokio::time::sleep(Duration::from_secs(8)).await;
            for f in &faults {
                f.down.send_replace(false);
            }
        })
    };
    let results = burst(&hub, "r", 10, Duration::from_secs(30)).await;
    outage.await.unwrap();
    tokio::time::sleep(Duration::from_secs(10)).await;
    at_most_once_and_started_means_ran(&rec, "r", &results);
    // After the outage the group works again.
    let after = burst(&hub, "s", 5, Duration::from_secs(30)).await;
    at_most_once_and_started_means_ran(&rec, "s", &after);
    assert!(after.iter().all(|r| r.as_ref().is_ok_and(|o| o.started)), "{after:?}");
}

#[tokio::test(start_paused = true)]
async fn a_joining_worker_never_reports_an_outcome() {
    let hub = MemoryHub::new();
    let rec = Recorder::default();
    let fa = Faults::new();
    let _a = faulty_worker(&hub, "a.1", &rec, &fa).await;
    let client = Client::connect(Arc::new(hub.clone())).await.unwrap();
    let mut tap = hub.open().await.unwrap();
    for n in 0..20 {
        // b starts, and the election is asked for as soon as its hello is out, while a's
        // heartbeat in answer is held back: b hears the request before any member's
        // heartbeat, while joining; a counts b as a member and waits for its answer.
        Faults::set(&fa.hang, true);
        let joining = {
            let hub = hub.clone();
            let rec = rec.clone();
            tokio::spawn(async move { worker(&hub, &format!("b{n}.2"), &rec).await })
        };
        loop {
            let m = String::from_utf8(tap.messages.recv().await.unwrap()).unwrap();
            if m.contains(&format!("\"from\":\"b{n}.2\"")) && m.contains("\"hello\"") {
                break;
            }
        }
        let release = {
            let fa = fa.clone();
            tokio::spawn(async move {
                tokio::time::sleep(Duration::from_millis(10)).await;
                Faults::set(&fa.hang, false);
            })
        };
        let id = format!("j{n}");
        let outcome = client.elect(&id, "job", "go", WAIT).await.unwrap();
        release.await.unwrap();
        assert!(outcome.started && outcome.error.is_none(), "{id}: {outcome:?}");
        let b = joining.await.unwrap();
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert_eq!(rec.runs()[&id].len(), 1);
        b.shutdown().await.unwrap();
    }
}

#[tokio::test(start_paused = true)]
async fn a_late_answer_for_a_forgotten_election_starts_nothing() {
    let hub = MemoryHub::new();
    let rec = Recorder::default();
    let cfg = Config { retention: Duration::from_secs(60), ..config("a.1") };
    let mut handlers = Handlers::new();
    handlers.insert("job", rec.clone()).unwrap();
    let _a = Worker::start(Arc::new(hub.clone()), cfg, handlers, None).await.unwrap();
    let client = Client::connect(Arc::new(hub.clone())).await.unwrap();
    let first = client.elect("old", "job", "go", WAIT).await.unwrap();
    tokio::time::sleep(Duration::from_secs(61)).await;
    // A candidate for it, delayed past the retention (and one heard before any request).
    raw(
        &hub,
        serde_json::json!({"v":3,"from":"late.0","incarnation":1,"clock":1,"type":"candidate",
            "election":{"id":"old","digest":first.digest},"handles":true}),
    )
    .await;
    tokio::time::sleep(Duration::from_secs(30)).await;
    assert_eq!(rec.runs()["old"].len(), 1, "a late answer started the election again");
}

#[tokio::test(start_paused = true)]
async fn an_id_used_for_another_action_is_a_clear_error_and_runs_nothing() {
    let hub = MemoryHub::new();
    let rec = Recorder::default();
    let _a = worker(&hub, "a.1", &rec).await;
    let _b = worker(&hub, "b.2", &rec).await;
    let client = Client::connect(Arc::new(hub.clone())).await.unwrap();
    let first = client.elect("shared", "job", "one thing", WAIT).await.unwrap();
    assert!(first.started);
    let err = client.elect("shared", "job", "another thing", WAIT).await.unwrap_err();
    assert!(matches!(&err, GossipError::IdInUse { id, .. } if id == "shared"), "{err}");
    assert!(err.to_string().contains("used before for another action"), "{err}");
    let runs = rec.0.lock().unwrap().clone();
    assert_eq!(runs.len(), 1);
    assert_eq!(runs[0].action, "one thing");
    // The same action again is a plain repeat.
    assert!(client.elect("shared", "job", "one thing", WAIT).await.unwrap().repeat);
}

#[tokio::test(start_paused = true)]
async fn workers_that_fall_behind_their_queues_never_lose_each_other_and_decide_alone() {
    // Two workers whose every publish takes 400 ms get an election every 100 ms: each
    // falls further behind its queue, reading the other's heartbeats later and later,
    // with no stall, link loss or split. Silence read late is not silence sent.
    let hub = MemoryHub::new();
    let rec = Recorder::default();
    let faults: Vec<Faults> = (0..2).map(|_| Faults::new()).collect();
    let mut workers = Vec::new();
    for (i, f) in faults.iter().enumerate() {
        workers.push(faulty_worker(&hub, &format!("w{i}.{i}"), &rec, f).await);
    }
    tokio::time::sleep(Duration::from_millis(100)).await;
    for (f, ms) in faults.iter().zip([400, 2000]) {
        f.slow_ms.store(ms, std::sync::atomic::Ordering::SeqCst);
    }
    let client = Arc::new(Client::connect(Arc::new(hub.clone())).await.unwrap());
    let mut tasks = Vec::new();
    for i in 0..150 {
        let client = client.clone();
        tasks.push(tokio::spawn(async move {
            client.elect(&format!("b{i}"), "job", "go", Duration::from_secs(120)).await.map_err(|e| e.to_string())
        }));
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let mut results = Vec::new();
    for t in tasks {
        results.push(t.await.unwrap());
    }
    tokio::time::sleep(Duration::from_secs(30)).await;
    at_most_once_and_started_means_ran(&rec, "b", &results);
    // Once the load is gone, the two work together again.
    for f in &faults {
        f.slow_ms.store(0, std::sync::atomic::Ordering::SeqCst);
    }
    tokio::time::sleep(Duration::from_secs(10)).await;
    let after = burst(&hub, "c", 5, Duration::from_secs(30)).await;
    at_most_once_and_started_means_ran(&rec, "c", &after);
    assert!(after.iter().all(|r| r.as_ref().is_ok_and(|o| o.started)), "{after:?}");
}

#[tokio::test(start_paused = true)]
async fn a_worker_that_hears_another_already_ran_the_election_does_not_run_it_too() {
    // A worker decides on a view that left out a member which meanwhile won and ran the
    // action (the worker was paused, or a split healed): the winner's outcome reached it
    // before its own decision. It must not run the action a second time.
    let hub = MemoryHub::new();
    let rec = Recorder::default();
    let mut a = worker(&hub, "a.1", &rec).await;
    let mut events = a.events();
    let client = Client::connect(Arc::new(hub.clone())).await.unwrap();
    let digest = client.elect("warm", "job", "go", WAIT).await.unwrap().digest;
    raw(&hub, serde_json::json!({"v":3,"from":"c","incarnation":1,"clock":100,"type":"elect","id":"x","topic":"job","action":"go"}))
        .await;
    raw(
        &hub,
        serde_json::json!({"v":3,"from":"b.2","incarnation":1,"clock":101,"type":"outcome","id":"x","topic":"job",
            "digest":digest,"winner":"b.2","started":true,"error":null}),
    )
    .await;
    tokio::time::sleep(Duration::from_secs(5)).await;
    assert!(!rec.runs().contains_key("x"), "ran again on a.1 after b.2 reported it had started it");
    let not_started = std::iter::from_fn(|| events.try_recv().ok())
        .any(|e| matches!(e, Event::NotStarted { ref election, .. } if election == "x"));
    assert!(not_started, "a.1 did not say why it did not start x");
}

#[tokio::test(start_paused = true)]
async fn a_joined_worker_knows_every_member_the_others_count_as_live() {
    // m is slow to answer the newcomer's hello (its publishes hang for 1.5 s, less than a
    // stall): n must not stand in elections with a member set that lacks m, which a and m
    // still count (n could then pick a different winner from the same answers).
    let hub = MemoryHub::new();
    let rec = Recorder::default();
    let _a = worker(&hub, "a.1", &rec).await;
    let fm = Faults::new();
    let _m = faulty_worker(&hub, "m.3", &rec, &fm).await;
    tokio::time::sleep(Duration::from_millis(100)).await;
    Faults::set(&fm.hang, true);
    let release = {
        let fm = fm.clone();
        tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(1500)).await;
            Faults::set(&fm.hang, false);
        })
    };
    let n = worker(&hub, "n.2", &rec).await;
    assert_eq!(n.members().await.unwrap(), ["a.1", "m.3", "n.2"], "joined without knowing every live member");
    release.await.unwrap();
}

#[tokio::test(start_paused = true)]
async fn a_worker_whose_requests_come_back_but_whose_answers_are_lost_cuts_itself_off() {
    // The broker loses b's heartbeats and answers, not the requests b itself sends: a
    // loses b, and b must notice (its requests coming back do not tell it the others
    // hear it as a member) instead of going on standing with a.
    let hub = MemoryHub::new();
    let rec = Recorder::default();
    let mut a = worker(&hub, "a.1", &rec).await;
    let fb = Faults::new();
    let mut b = faulty_worker(&hub, "b.2", &rec, &fb).await;
    let (mut a_events, mut b_events) = (a.events(), b.events());
    fb.lose.lock().unwrap().extend(["heartbeat", "candidate", "abstain", "outcome"]);
    for i in 0..10 {
        b.elect(&format!("from-b-{i}"), "job", "go").await.unwrap();
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    let (a_saw, b_saw) = (received(&mut a_events), received(&mut b_events));
    assert!(b_saw.iter().any(|e| matches!(e, Event::Rejoining { .. })), "b never noticed: {b_saw:?}; a saw {a_saw:?}");
}

#[tokio::test(start_paused = true)]
async fn a_worker_that_falls_behind_its_queue_joins_only_once_it_has_read_lost_after_past_its_hello() {
    // m's publishes hang for 2.4 s (less than a stall) from just before n's hello, so its
    // answer reaches the hub 2.35 s after the hello (m silent at the hub for 3.85 s, less
    // than its echo limit); and n, which heard itself 2 s after its hello, falls 3 s
    // behind its queue just then (less than its echo limit too). When lost_after has
    // passed by n's own clock, n has read only 2 s past its hello, not m's answer. n must
    // not stand in elections with a member set that lacks m, which a and m still count.
    let t0 = Instant::now();
    let at = move |secs: f64| tokio::time::sleep_until(t0 + Duration::from_secs_f64(secs));
    let hub = MemoryHub::new();
    let rec = Recorder::default();
    let _a = worker(&hub, "a.1", &rec).await;
    let fm = Faults::new();
    // Joined at 5 s, m says a heartbeat at 7 s, 9 s, 11 s, 13 s, ...
    let _m = faulty_worker(&hub, "m.3", &rec, &fm).await;
    let fn_ = Faults::new();
    let faults = {
        let (fm, fn_) = (fm.clone(), fn_.clone());
        tokio::spawn(async move {
            at(12.45).await;
            Faults::set(&fm.hang, true);
            at(14.7).await; // n's first heartbeat (14.5 s) has come back
            fn_.lag_ms.store(3000, std::sync::atomic::Ordering::SeqCst);
            at(14.85).await;
            Faults::set(&fm.hang, false);
            at(18.0).await;
            fn_.lag_ms.store(0, std::sync::atomic::Ordering::SeqCst);
        })
    };
    at(12.5).await;
    let n = faulty_worker(&hub, "n.2", &rec, &fn_).await;
    assert_eq!(n.members().await.unwrap(), ["a.1", "m.3", "n.2"], "joined without knowing every live member");
    faults.await.unwrap();
}

#[tokio::test(start_paused = true)]
async fn a_message_with_an_absurd_clock_does_not_stop_the_group() {
    // A buggy client sends a clock near the end of the range: the workers' clocks must
    // go on growing, and their own messages must still count.
    let hub = MemoryHub::new();
    let rec = Recorder::default();
    let _a = worker(&hub, "a.1", &rec).await;
    let _b = worker(&hub, "b.2", &rec).await;
    for clock in [(1u64 << 62) - 1, u64::MAX] {
        raw(&hub, serde_json::json!({"v":3,"from":"bad","incarnation":1,"clock":clock,"type":"probe"})).await;
    }
    tokio::time::sleep(Duration::from_secs(1)).await;
    let client = Client::connect(Arc::new(hub.clone())).await.unwrap();
    for i in 0..3 {
        let id = format!("after{i}");
        let o = client.elect(&id, "job", "go", WAIT).await.unwrap();
        assert!(o.started, "{id}: {o:?}");
    }
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert_eq!(rec.runs().len(), 3);
}

/// One round of [`random_publish_hangs_never_run_an_election_twice`]: three workers whose
/// publishes hang at random (mostly shorter than a stall, sometimes longer), and one broker
/// outage for all of them, while a client asks for an election every 300 ms; returns what
/// went wrong, if anything.
async fn hang_round(seed: u64) -> Result<(), String> {
    let mut rng = fastrand::Rng::with_seed(seed);
    let hub = MemoryHub::new();
    let rec = Recorder::default();
    let ids = ["a.1", "b.2", "c.3"];
    let faults: Vec<Faults> = ids.iter().map(|_| Faults::new()).collect();
    let mut workers = Vec::new();
    for (id, f) in ids.iter().zip(&faults) {
        workers.push(faulty_worker(&hub, id, &rec, f).await);
    }
    tokio::time::sleep(Duration::from_secs(6)).await;
    // The hangs: each worker on its own schedule, for 40 s.
    let end = Instant::now() + Duration::from_secs(40);
    for f in &faults {
        let f = f.clone();
        let mut rng = fastrand::Rng::with_seed(rng.u64(..));
        tokio::spawn(async move {
            while Instant::now() < end {
                tokio::time::sleep(Duration::from_millis(rng.u64(100..3000))).await;
                let hang = if rng.u8(..8) == 0 { rng.u64(2600..8000) } else { rng.u64(300..2450) };
                Faults::set(&f.hang, true);
                tokio::time::sleep(Duration::from_millis(hang)).await;
                Faults::set(&f.hang, false);
            }
        });
    }
    // And once per round the broker goes away for everyone (a restart), for 0.5 to 4 s:
    // every worker reconnects and joins again, deferring what it is asked meanwhile.
    let (at, length) = (rng.u64(2000..30_000), rng.u64(500..4000));
    let outage = outage(faults.clone(), Duration::from_millis(at), Duration::from_millis(length));
    let client = Arc::new(Client::connect(Arc::new(hub.clone())).await.unwrap());
    let mut asked = Vec::new();
    let mut i = 0;
    while Instant::now() < end {
        let (client, id) = (client.clone(), format!("r{i}"));
        asked.push(tokio::spawn(async move { client.elect(&id, "job", "go", Duration::from_secs(20)).await }));
        i += 1;
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    for a in asked {
        let _ = a.await;
    }
    outage.await.unwrap();
    tokio::time::sleep(Duration::from_secs(15)).await;
    for (id, ran_on) in rec.runs() {
        if ran_on.len() > 1 {
            return Err(format!("{id} ran on {ran_on:?}"));
        }
    }
    drop(workers);
    Ok(())
}

#[tokio::test(start_paused = true)]
async fn random_publish_hangs_never_run_an_election_twice() {
    let seeds: u64 = std::env::var("TENURE_GOSSIP_SEEDS").ok().and_then(|s| s.parse().ok()).unwrap_or(40);
    for seed in 0..seeds {
        if let Err(e) = hang_round(seed).await {
            panic!("seed {seed}: {e}");
        }
    }
}

/// Starts a worker without waiting for it to join.
fn start_joining(hub: &MemoryHub, id: &str, rec: &Recorder) -> JoinHandle<Worker> {
    let (hub, id, rec) = (hub.clone(), id.to_string(), rec.clone());
    tokio::spawn(async move { worker(&hub, &id, &rec).await })
}

#[tokio::test(start_paused = true)]
async fn an_election_asked_one_second_after_the_workers_start_runs_once() {
    let hub = MemoryHub::new();
    let rec = Recorder::default();
    let starting: Vec<_> = ["a.1", "b.2", "c.3"].iter().map(|id| start_joining(&hub, id, &rec)).collect();
    tokio::time::sleep(Duration::from_secs(1)).await;
    // Every worker is still joining (5 s with the default settings): each defers the
    // election, stands once joined, and the group decides it then.
    let client = Client::connect(Arc::new(hub.clone())).await.unwrap();
    let outcome = client.elect("early", "job", "go", Duration::from_secs(10)).await.unwrap();
    assert!(outcome.started, "{outcome:?}");
    for s in starting {
        s.await.unwrap();
    }
    tokio::time::sleep(Duration::from_secs(10)).await;
    assert_eq!(rec.runs()["early"], vec![outcome.winner.unwrap()]);
}

#[tokio::test(start_paused = true)]
async fn an_election_deferred_by_a_joining_worker_waits_for_no_worker_that_started_after_it() {
    let hub = MemoryHub::new();
    let rec = Recorder::default();
    let a = start_joining(&hub, "a.1", &rec);
    tokio::time::sleep(Duration::from_secs(1)).await;
    let client = Arc::new(Client::connect(Arc::new(hub.clone())).await.unwrap());
    let asked = {
        let client = client.clone();
        tokio::spawn(async move { client.elect("first", "job", "go", Duration::from_secs(10)).await })
    };
    // b and c start after the request: they never hear it, and a, which deferred it, must
    // not wait for their answers.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let later: Vec<_> = ["b.2", "c.3"].iter().map(|id| start_joining(&hub, id, &rec)).collect();
    let outcome = asked.await.unwrap().unwrap();
    assert_eq!(outcome.winner.as_deref(), Some("a.1"), "{outcome:?}");
    assert!(outcome.started, "{outcome:?}");
    a.await.unwrap();
    for s in later {
        s.await.unwrap();
    }
    tokio::time::sleep(Duration::from_secs(10)).await;
    assert_eq!(rec.runs()["first"], vec!["a.1".to_string()]);
}

#[tokio::test(start_paused = true)]
async fn a_worker_that_hears_a_request_before_its_own_hello_never_stands_in_it() {
    // The group restarts (a deploy, a broker restart): a and b subscribe, then a request
    // reaches them before their hellos do. Each counts only members whose hello came
    // before the request; had they deferred it, each would stand alone and run it.
    for round in 0..5 {
        let hub = MemoryHub::new();
        let rec = Recorder::default();
        let faults: Vec<Faults> = (0..2).map(|_| Faults::new()).collect();
        let mut starting = Vec::new();
        for (i, f) in faults.iter().enumerate() {
            Faults::set(&f.hang, true);
            let (hub, rec, f) = (hub.clone(), rec.clone(), f.clone());
            starting.push(tokio::spawn(async move { faulty_worker(&hub, &format!("w{i}.{i}"), &rec, &f).await }));
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
        raw(&hub, serde_json::json!({"v":3,"from":"client.9","incarnation":1,"clock":1,"type":"elect","id":"x","topic":"job","action":"go"}))
            .await;
        tokio::time::sleep(Duration::from_millis(20 * round)).await;
        for f in &faults {
            Faults::set(&f.hang, false);
        }
        for s in starting {
            s.await.unwrap();
        }
        tokio::time::sleep(Duration::from_secs(20)).await;
        let runs = rec.runs();
        assert!(runs.get("x").is_none_or(|r| r.len() <= 1), "round {round}: x ran on {:?}", runs["x"]);
    }
}

/// Elections asked every 300 ms while the broker goes away for everyone and comes back:
/// each runs exactly once, if its wait outlasts the outage and the rejoin.
#[tokio::test(start_paused = true)]
async fn elections_asked_around_a_broker_outage_each_run_exactly_once() {
    let hub = MemoryHub::new();
    let rec = Recorder::default();
    let (_workers, mut faults) = faulty_group(&hub, &rec).await;
    // The client's own link goes down with the broker too.
    let client_faults = Faults::new();
    let client =
        Arc::new(Client::connect(Arc::new(Faulty { hub: hub.clone(), faults: client_faults.clone() })).await.unwrap());
    faults.push(client_faults);
    let outage = outage(faults, Duration::from_millis(3050), Duration::from_secs(3));
    let mut asked = Vec::new();
    for i in 0..30 {
        let (client, id) = (client.clone(), format!("o{i}"));
        asked.push(tokio::spawn(async move { client.elect(&id, "job", "go", Duration::from_secs(20)).await }));
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    let mut results = Vec::new();
    for a in asked {
        results.push(a.await.unwrap().map_err(|e| e.to_string()));
    }
    outage.await.unwrap();
    tokio::time::sleep(Duration::from_secs(10)).await;
    at_most_once_and_started_means_ran(&rec, "o", &results);
    let runs = rec.runs();
    let lost: Vec<String> = (0..30).map(|i| format!("o{i}")).filter(|id| !runs.contains_key(id)).collect();
    assert!(lost.is_empty(), "never ran: {lost:?}; results: {results:?}");
}

#[tokio::test(start_paused = true)]
async fn an_id_asked_again_after_a_broker_restart_waits_for_the_workers_that_decided_it() {
    let hub = MemoryHub::new();
    let rec = Recorder::default();
    let (fa, fb, fc) = (Faults::new(), Faults::new(), Faults::new());
    let _a = faulty_worker(&hub, "a.1", &rec, &fa).await;
    let _b = faulty_worker(&hub, "b.2", &rec, &fb).await;
    let client = Client::connect(Arc::new(hub.clone())).await.unwrap();
    let first = client.elect("x", "job", "go", WAIT).await.unwrap();
    assert!(first.started);
    // c joins after x was decided: it never heard of x.
    let _c = faulty_worker(&hub, "c.3", &rec, &fc).await;
    tokio::time::sleep(Duration::from_millis(100)).await;
    // The broker restarts; c is back first, a and b (which decided x) 4 s later, still
    // reconnecting when x is asked again. c defers it; a and b must be heard first.
    let back_c = outage(vec![fc.clone()], Duration::ZERO, Duration::from_secs(2));
    let back_ab = outage(vec![fa.clone(), fb.clone()], Duration::ZERO, Duration::from_secs(6));
    back_c.await.unwrap();
    // c reconnects with backoff (its try at 3.1 s), and joins again.
    tokio::time::sleep(Duration::from_millis(2500)).await;
    let again = client.elect("x", "job", "go", Duration::from_secs(30)).await;
    back_ab.await.unwrap();
    tokio::time::sleep(Duration::from_secs(20)).await;
    assert_eq!(rec.runs()["x"].len(), 1, "x ran again: {:?} (asked again: {again:?})", rec.runs()["x"]);
    let again = again.expect("the worker that ran x answers the repeat");
    assert!(again.repeat && again.winner == first.winner, "{again:?}");
}

#[tokio::test(start_paused = true)]
async fn a_client_waits_its_whole_wait_for_a_broker_that_is_down() {
    let hub = MemoryHub::new();
    let rec = Recorder::default();
    let _a = worker(&hub, "a.1", &rec).await;
    let f = Faults::new();
    f.down.send_replace(true);
    let client = Client::new(Arc::new(Faulty { hub: hub.clone(), faults: f.clone() }));
    // Down for the whole wait: a broker error, at the end of the wait, not before.
    let t0 = Instant::now();
    let e = client.elect("x", "job", "go", Duration::from_secs(3)).await.unwrap_err();
    assert!(t0.elapsed() >= Duration::from_secs(3), "gave up after {:?}: {e}", t0.elapsed());
    assert!(matches!(e, GossipError::Broker { .. }), "{e}");
    // Back within the wait: the election runs.
    let back = outage(vec![f.clone()], Duration::ZERO, Duration::from_secs(2));
    let outcome = client.elect("y", "job", "go", Duration::from_secs(10)).await.unwrap();
    back.await.unwrap();
    assert!(outcome.started, "{outcome:?}");
    assert_eq!(rec.runs()["y"].len(), 1);
}
