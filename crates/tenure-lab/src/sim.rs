//! Deterministic simulation: the real [`Elector`] on simulated time, against a store
//! that loses requests and answers, stalls, restarts, jumps its clock and refuses writes
//! for a while (a failover), with candidates whose clocks drift, whose hosts suspend
//! (their monotonic clock stops while the store's runs on), that crash, stop, and pause
//! between checking `is_valid()` and writing to a fenced resource.
//!
//! Each seed runs on its own single-threaded tokio runtime with paused time; every
//! random choice (the runtime's jitter included) comes from the seed, and the runtime's
//! `select!`s are biased, so a seed replays exactly. The history is checked with
//! [`tenure_testkit::history::check`].

use std::collections::BTreeMap;
use std::hash::{Hash, Hasher};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tenure::store::{Acquire, AcquireRequest, Renew, WatchStream};
use tenure::{
    Clock, Config, ElectionName, Elector, Event, Evict, HolderId, Instant, LeaseRecord, LeaseStore, MemoryStore,
    StoreError,
};

use tenure_testkit::history::{self, Liveness, Record, Summary};

/// A deliberate bug, to show that the simulation catches it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mutant {
    /// Safety margin zero (and no allowance for drift): store clock jumps go uncovered.
    ZeroSafetyMargin,
    /// Terms dated from when the answer arrived, not when the request was sent.
    DeadlineFromResponse,
    /// The store renews without comparing holder and token.
    RenewWithoutCas,
    /// Deadlines judged by a clock that stops while the host is suspended
    /// (`CLOCK_MONOTONIC`), not one that counts the suspend.
    MonotonicDeadlines,
    /// A store refusal that clears by itself (read-only after a failover) reported as
    /// fatal, so the campaign ends.
    RefusalIsFatal,
    /// A leader handing over to a candidate of higher priority releases the lease but
    /// leads on.
    HandOverWithoutSteppingDown,
    /// An election with N holders has one slot more, so that N + 1 hold at once.
    ExtraHolder,
}

impl Mutant {
    /// Whether this build can plant it. The bugs planted in the runtime itself
    /// ([`Mutant::DeadlineFromResponse`], [`Mutant::HandOverWithoutSteppingDown`],
    /// [`Mutant::ExtraHolder`]) exist only with this crate's `mutants` feature, which its
    /// own tests turn on; the others are the simulation's and always can.
    pub fn available(self) -> bool {
        cfg!(feature = "mutants")
            || !matches!(self, Mutant::DeadlineFromResponse | Mutant::HandOverWithoutSteppingDown | Mutant::ExtraHolder)
    }
}

/// What one seed covered and found.
#[derive(Clone, Debug)]
pub struct SeedReport {
    /// The seed.
    pub seed: u64,
    /// Simulated time.
    pub simulated: Duration,
    /// Faults injected (lost requests and answers, stalls, restarts, clock jumps, crashes, pauses).
    pub faults: u64,
    /// The checker's findings.
    pub summary: Summary,
    /// A hash of the whole event log, to show that a seed replays exactly.
    pub log_hash: u64,
    /// The event log itself, when [`SimConfig::keep_log`] is set.
    pub log: Vec<String>,
}

/// Simulated time from the start of the seed, in nanoseconds.
fn ns(origin: Instant) -> u64 {
    Instant::now().duration_since(origin).as_nanos() as u64
}

/// A candidate's clock: runs at `rate` times real (simulated) time. With
/// `stops_in_suspend`, it stands still while its host is suspended, as
/// `CLOCK_MONOTONIC` does; otherwise it counts the suspend, as the runtime's clock does.
struct DriftClock {
    origin: Instant,
    rate: f64,
    stops_in_suspend: bool,
    /// The host's suspend, in real ns since `origin`: (from, until).
    suspend: Mutex<Option<(u64, u64)>>,
}

impl DriftClock {
    /// Real time the clock did not count by `real` (ns since origin).
    fn lost(&self, real: u64) -> u64 {
        match *self.suspend.lock().unwrap() {
            Some((from, until)) if self.stops_in_suspend => real.clamp(from, until) - from,
            _ => 0,
        }
    }
}

impl Clock for DriftClock {
    fn now(&self) -> Instant {
        let real = ns(self.origin);
        self.origin + Duration::from_nanos(real - self.lost(real)).mul_f64(self.rate)
    }
    fn sleep_until(&self, deadline: Instant) -> std::pin::Pin<Box<dyn Future<Output = ()> + Send>> {
        let counted = deadline.saturating_duration_since(self.origin).div_f64(self.rate).as_nanos() as u64;
        // Back to real time: past a suspend's start, the clock stood still for its length.
        let real = match *self.suspend.lock().unwrap() {
            Some((from, until)) if self.stops_in_suspend && counted > from => counted + (until - from),
            _ => counted,
        };
        Box::pin(tokio::time::sleep_until(self.origin + Duration::from_nanos(real) + Duration::from_micros(1)))
    }
}

/// The store's clock: real time plus forward jumps.
struct JumpClock {
    jumped: AtomicU64,
}

impl Clock for JumpClock {
    fn now(&self) -> Instant {
        Instant::now() + Duration::from_nanos(self.jumped.load(Ordering::SeqCst))
    }
    fn sleep_until(&self, deadline: Instant) -> std::pin::Pin<Box<dyn Future<Output = ()> + Send>> {
        let real = deadline - Duration::from_nanos(self.jumped.load(Ordering::SeqCst));
        Box::pin(tokio::time::sleep_until(real))
    }
}

/// Shared state of the simulated store and the history.
struct World {
    origin: Instant,
    rng: Mutex<fastrand::Rng>,
    store: MemoryStore,
    store_clock: Arc<JumpClock>,
    /// Until when (ns) the store is down.
    down_until: AtomicU64,
    /// Until when (ns) the store refuses writes (read-only, as after a failover).
    refusing_until: AtomicU64,
    /// How hard faults hit, 0 (calm) to 1; set to 0 at the end of a run.
    chaos: Mutex<f64>,
    ttl: Duration,
    mutant: Option<Mutant>,
    max_latency: Duration,
    records: Mutex<Vec<Record>>,
    log: Mutex<Vec<String>>,
    faults: AtomicU64,
    /// The fenced resources, one per election (per holder index with several holders):
    /// the highest token each accepted.
    fence: Mutex<BTreeMap<String, u64>>,
}

impl World {
    fn rand(&self) -> f64 {
        self.rng.lock().unwrap().f64()
    }
    fn chance(&self, p: f64) -> bool {
        self.rand() < p
    }
    fn record(&self, r: Record) {
        self.log.lock().unwrap().push(format!("{r:?}"));
        self.records.lock().unwrap().push(r);
    }
    fn note(&self, what: String) {
        self.log.lock().unwrap().push(format!("{} {what}", ns(self.origin)));
    }
    fn fault(&self, what: &str) {
        self.faults.fetch_add(1, Ordering::SeqCst);
        self.note(format!("fault {what}"));
    }
    fn chaos(&self) -> f64 {
        *self.chaos.lock().unwrap()
    }
    /// One leg of a request's trip (there or back).
    fn latency(&self) -> Duration {
        let chaos = self.chaos();
        if self.chance(0.01 * chaos) {
            self.fault("very slow");
            return self.ttl.mul_f64(1.5 * self.rand());
        }
        if self.chance(0.05 * chaos) {
            self.fault("slow");
            return self.max_latency.mul_f64(4.0 * self.rand());
        }
        self.max_latency.mul_f64(self.rand())
    }
    /// The fenced resource: accepts a write unless a higher token was accepted before.
    fn write(&self, election: &str, token: u64) {
        let mut fence = self.fence.lock().unwrap();
        let highest = fence.entry(election.to_string()).or_insert(0);
        let accepted = token >= *highest;
        *highest = (*highest).max(token);
        drop(fence);
        self.record(Record::Write { election: election.into(), token, at: ns(self.origin), accepted });
    }
}

/// One candidate's handle on the store: adds latency and faults; dies with its candidate.
struct SimStore {
    world: Arc<World>,
    /// The candidate's name, and whether its calls are logged ([`SimConfig::trace_calls`]).
    name: String,
    trace: bool,
    dead: Arc<AtomicBool>,
    /// Until when (ns) this candidate is cut off from the store.
    cut_until: Arc<AtomicU64>,
}

impl SimStore {
    /// Logs an answer as the candidate sees it, when its calls are traced.
    fn note_answer(&self, what: &str) {
        if self.trace {
            self.world.note(what.to_string());
        }
    }

    fn cut(&self) -> bool {
        ns(self.world.origin) < self.cut_until.load(Ordering::SeqCst)
    }

    /// Sends `op`, a write, to the store: refused while the store takes no writes.
    async fn write<T: Send + 'static>(
        &self,
        what: &'static str,
        op: impl Future<Output = Result<T, StoreError>> + Send + 'static,
    ) -> Result<T, StoreError> {
        let w = self.world.clone();
        self.call(what, async move {
            if ns(w.origin) < w.refusing_until.load(Ordering::SeqCst) {
                let why = format!("{what}: the store is read-only (a failover)");
                return Err(if w.mutant == Some(Mutant::RefusalIsFatal) {
                    StoreError::new(tenure::ErrorKind::Misconfigured, why)
                } else {
                    StoreError::unavailable(why)
                });
            }
            op.await
        })
        .await
    }

    /// Sends `op` to the store. It travels in a task of its own, so a request the
    /// caller gave up on (timed out) may still be applied later, as on a real network.
    async fn call<T: Send + 'static>(
        &self,
        what: &'static str,
        op: impl Future<Output = Result<T, StoreError>> + Send + 'static,
    ) -> Result<T, StoreError> {
        if self.dead.load(Ordering::SeqCst) {
            return std::future::pending().await;
        }
        if self.cut() {
            if self.world.chance(0.5) {
                return Err(StoreError::unavailable(format!("{what}: connection refused")));
            }
            return std::future::pending().await;
        }
        let (tx, rx) = tokio::sync::oneshot::channel();
        let w = self.world.clone();
        let cut_until = self.cut_until.clone();
        let trace = self.trace.then(|| self.name.clone());
        if let Some(name) = &trace {
            w.note(format!("{name} {what} sent"));
        }
        tokio::spawn(async move {
            tokio::time::sleep(w.latency()).await;
            if ns(w.origin) < w.down_until.load(Ordering::SeqCst) {
                if w.chance(0.5) {
                    let _ = tx.send(Err(StoreError::unavailable(format!("{what}: store restarting"))));
                }
                return;
            }
            if w.chance(0.03 * w.chaos()) {
                w.fault("lost request");
                return;
            }
            let out = op.await;
            if let Some(name) = &trace {
                w.note(format!("{name} {what} applied: {}", if out.is_ok() { "ok" } else { "error" }));
            }
            if w.chance(0.03 * w.chaos()) {
                w.fault("lost answer");
                return;
            }
            tokio::time::sleep(w.latency()).await;
            if ns(w.origin) < cut_until.load(Ordering::SeqCst) {
                return; // the answer is lost in the partition
            }
            let _ = tx.send(out);
        });
        match rx.await {
            Ok(out) if !self.dead.load(Ordering::SeqCst) => {
                if self.trace {
                    self.world.note(format!("{} {what} answered", self.name));
                }
                out
            }
            _ => std::future::pending().await,
        }
    }
}

#[async_trait::async_trait]
impl LeaseStore for SimStore {
    async fn try_acquire(&self, req: &AcquireRequest) -> Result<Acquire, StoreError> {
        let w = self.world.clone();
        let req = req.clone();
        let requested = ns(w.origin);
        self.write("acquire", async move {
            let before = w.store.get(&req.election).await?;
            let r = w.store.try_acquire(&req).await?;
            if let Acquire::Acquired(l) = &r
                && before.as_ref().is_none_or(|b| b.token != l.token)
            {
                w.record(Record::Grant {
                    election: req.election.to_string(),
                    holder: req.holder.to_string(),
                    token: l.token.0,
                    requested,
                    completed: ns(w.origin),
                });
            }
            Ok(r)
        })
        .await
        .inspect(|r| self.note_answer(&format!("acquire {}: {r:?}", self.name)))
    }

    async fn renew(&self, held: &LeaseRecord, ttl: Duration) -> Result<Renew, StoreError> {
        let w = self.world.clone();
        let held = held.clone();
        self.write("renew", async move {
            match w.store.renew(&held, ttl).await? {
                Renew::Lost(_) if w.mutant == Some(Mutant::RenewWithoutCas) => {
                    // The bug: overwrite whatever is there with the caller's lease.
                    w.store.evict(&held.election, Evict::Now).await?;
                    let req = AcquireRequest::new(held.election.clone(), held.holder.clone(), ttl);
                    w.store.try_acquire(&req).await?;
                    Ok(Renew::Renewed(held))
                }
                other => Ok(other),
            }
        })
        .await
    }

    async fn release(&self, held: &LeaseRecord) -> Result<(), StoreError> {
        let (store, held) = (self.world.store.clone(), held.clone());
        self.write("release", async move { store.release(&held).await }).await
    }

    async fn get(&self, election: &ElectionName) -> Result<Option<LeaseRecord>, StoreError> {
        let (store, e) = (self.world.store.clone(), election.clone());
        self.call("get", async move { store.get(&e).await })
            .await
            .inspect(|r| self.note_answer(&format!("get {} {election}: {r:?}", self.name)))
    }

    async fn list(&self, prefix: &str) -> Result<Vec<LeaseRecord>, StoreError> {
        let (store, p) = (self.world.store.clone(), prefix.to_string());
        self.call("list", async move { store.list(&p).await }).await
    }

    async fn evict(&self, election: &ElectionName, how: Evict) -> Result<Option<LeaseRecord>, StoreError> {
        let (store, e) = (self.world.store.clone(), election.clone());
        self.write("evict", async move { store.evict(&e, how).await }).await
    }

    fn watch(&self, election: &ElectionName) -> Option<WatchStream> {
        // A partitioned candidate hears nothing; it finds out by renewing.
        let cut_until = self.cut_until.clone();
        let origin = self.world.origin;
        let stream = self.world.store.watch(election)?;
        Some(Box::pin(tokio_stream::StreamExt::filter(stream, move |_| ns(origin) >= cut_until.load(Ordering::SeqCst))))
    }

    fn describe(&self) -> String {
        "sim".into()
    }
}

/// Settings of a simulation run.
#[derive(Clone, Debug)]
pub struct SimConfig {
    /// Simulated time per seed.
    pub duration: Duration,
    /// The mutant to plant, if any.
    pub mutant: Option<Mutant>,
    /// Keep the event log in the report (for replaying one seed).
    pub keep_log: bool,
    /// Log every store call (sent, applied, answered) with the candidate, for reading a
    /// seed's failure; slower.
    pub trace_calls: bool,
}

impl Default for SimConfig {
    fn default() -> Self {
        Self { duration: Duration::from_secs(60), mutant: None, keep_log: false, trace_calls: false }
    }
}

const ELECTION: &str = "sim/job";

/// How many hold the election at once in the seeds with several holders.
const HOLDERS: u32 = 3;

struct Candidate {
    name: String,
    clock: Arc<DriftClock>,
    elector: Elector,
    dead: Arc<AtomicBool>,
    cut_until: Arc<AtomicU64>,
    work: tokio::task::JoinHandle<()>,
    /// When its guarded work last stopped (ns): a graceful handover starts there.
    work_stopped: Arc<AtomicU64>,
}

/// Runs one seed and checks its history.
pub fn run_seed(seed: u64, cfg: &SimConfig) -> SeedReport {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .start_paused(true)
        .build()
        .expect("a current-thread runtime");
    fastrand::seed(seed);
    rt.block_on(simulate(seed, cfg))
}

async fn simulate(seed: u64, cfg: &SimConfig) -> SeedReport {
    let mut rng = fastrand::Rng::with_seed(seed);
    let origin = Instant::now();
    let ttl = Duration::from_millis([500, 1000, 2000, 3000][rng.usize(0..4)]);
    let store_clock = Arc::new(JumpClock { jumped: AtomicU64::new(0) });
    // Calm seeds have no store faults, so that liveness can be judged on them.
    let calm = seed.is_multiple_of(4);
    let chaos = if calm { 0.0 } else { 0.3 + 0.7 * rng.f64() };
    let max_latency = ttl / [20, 50, 200, 1000][rng.usize(0..4)];
    let world = Arc::new(World {
        origin,
        rng: Mutex::new(fastrand::Rng::with_seed(seed ^ 0x5eed)),
        store: MemoryStore::with_clock(store_clock.clone()),
        store_clock,
        down_until: AtomicU64::new(0),
        refusing_until: AtomicU64::new(0),
        chaos: Mutex::new(chaos),
        ttl,
        mutant: cfg.mutant,
        max_latency,
        records: Mutex::new(Vec::new()),
        log: Mutex::new(Vec::new()),
        faults: AtomicU64::new(0),
        fence: Mutex::new(BTreeMap::new()),
    });
    let mut runtime_cfg = Config::new(ttl);
    // Step down only at the deadline, so the deadline rule itself is what keeps terms apart.
    runtime_cfg.renew_deadline = runtime_cfg.deadline_offset();
    let max_drift = runtime_cfg.max_drift;
    let margin = runtime_cfg.safety_margin;
    match cfg.mutant {
        Some(Mutant::ZeroSafetyMargin) => {
            runtime_cfg.safety_margin = Duration::ZERO;
            runtime_cfg.max_drift = 0.0;
            runtime_cfg.renew_deadline = runtime_cfg.deadline_offset();
        }
        #[cfg(feature = "mutants")]
        Some(Mutant::DeadlineFromResponse) => runtime_cfg.mutation_date_from_response = true,
        #[cfg(feature = "mutants")]
        Some(Mutant::HandOverWithoutSteppingDown) => runtime_cfg.mutation_hand_over_without_stepping_down = true,
        #[cfg(feature = "mutants")]
        Some(Mutant::ExtraHolder) => runtime_cfg.mutation_extra_holder = true,
        Some(m) if !m.available() => {
            panic!("{m:?} is planted in the runtime, which only a build with the `mutants` feature of tenure-lab has")
        }
        _ => {}
    }

    // One seed in four: a winner waits out a cool-down before the term is handed out
    // (renewing meanwhile), so that pauses and clock jumps also land inside one.
    if seed % 4 == 3 {
        runtime_cfg.cool_down = ttl / 5;
    }
    // One seed in three: every candidate announces itself with a priority of 0 to 2, so
    // leaders hand over to higher priorities and winners defer to reservations.
    let prioritised = seed % 3 == 1;
    // One seed in five of the rest: three hold at once (`Config::holders`). Each holder
    // index is an election of its own to the checker (one holder at a time, tokens that
    // grow, a fenced resource per index), and no more than three terms may believe they
    // hold at once (I7). Liveness is not judged: a stopped holder's slot may have no free
    // candidate to take it.
    let holders: u32 = if seed % 5 == 2 && !prioritised { HOLDERS } else { 1 };
    // The election a belief, a write or an election of `token` counts in.
    let counted = move |token: u64| -> String {
        if holders > 1 {
            format!("{ELECTION}#{}", tenure::holders::holder_index(tenure::FencingToken(token)))
        } else {
            ELECTION.into()
        }
    };
    let mut candidates: BTreeMap<u32, Candidate> = BTreeMap::new();
    let mut next_id = 0u32;
    let spawn = |id: u32, rng: &mut fastrand::Rng| -> Candidate {
        let name = format!("c{id}");
        let dead = Arc::new(AtomicBool::new(false));
        let cut_until = Arc::new(AtomicU64::new(0));
        let rate = 1.0 + max_drift * (rng.f64() * 2.0 - 1.0);
        let clock = Arc::new(DriftClock {
            origin,
            rate,
            stops_in_suspend: cfg.mutant == Some(Mutant::MonotonicDeadlines),
            suspend: Mutex::new(None),
        });
        let store = Arc::new(SimStore {
            world: world.clone(),
            name: name.clone(),
            trace: cfg.trace_calls,
            dead: dead.clone(),
            cut_until: cut_until.clone(),
        });
        let mut builder =
            Elector::builder(store, ELECTION).holder(&name).config(runtime_cfg.clone()).clock(clock.clone());
        if prioritised {
            builder = builder.announce(true).priority(rng.i32(0..3));
        }
        builder = builder.holders(holders);
        let elector = builder.build().expect("a valid simulation config");
        let w = world.clone();
        let e = elector.clone();
        let holder = name.clone();
        let work_stopped = Arc::new(AtomicU64::new(0));
        let stopped = work_stopped.clone();
        let mut events = elector.events();
        let w2 = world.clone();
        let h2 = name.clone();
        tokio::spawn(async move {
            loop {
                let ev = match events.recv().await {
                    Ok(ev) => ev,
                    // Behind by more than the buffer: say so, and go on recording.
                    Err(tokio::sync::broadcast::error::RecvError::Lagged(n)) => {
                        w2.note(format!("{h2} missed {n} events"));
                        continue;
                    }
                    Err(tokio::sync::broadcast::error::RecvError::Closed) => break,
                };
                w2.note(format!("{h2} {ev:?}"));
                if let Event::Elected { token } = ev {
                    w2.record(Record::Elected {
                        election: counted(token.0),
                        holder: h2.clone(),
                        token: token.0,
                        at: ns(w2.origin),
                    });
                }
            }
        });
        let work = tokio::spawn(async move {
            let _ = e
                .run_while_leader(|l| {
                    let w = w.clone();
                    let holder = holder.clone();
                    let stopped = stopped.clone();
                    async move {
                        loop {
                            if !l.is_valid() {
                                break;
                            }
                            let token = l.token().0;
                            w.record(Record::Belief {
                                election: counted(token),
                                holder: holder.clone(),
                                token,
                                at: ns(w.origin),
                            });
                            if w.chance(0.002) {
                                // A pause (GC, SIGSTOP) between the check and the write.
                                w.fault("pause before write");
                                let from = ns(w.origin);
                                tokio::time::sleep(ttl.mul_f64(2.0 * w.rand())).await;
                                w.record(Record::Paused {
                                    election: counted(token),
                                    holder: holder.clone(),
                                    from,
                                    until: ns(w.origin),
                                });
                            }
                            w.write(&counted(token), token);
                            if w.chance(0.02) {
                                // Proclaim new metadata: a same-holder acquire, which the
                                // runtime dates from its send time like a renewal.
                                let _ = l.set_metadata(format!("after write {token}")).await;
                            }
                            let nap = Duration::from_millis(5 + (w.rand() * 45.0) as u64);
                            tokio::select! {
                                biased;
                                _ = l.cancelled() => break,
                                _ = tokio::time::sleep(nap) => {}
                            }
                        }
                        stopped.store(ns(w.origin), Ordering::SeqCst);
                    }
                })
                .await;
        });
        Candidate { name, clock, elector, dead, cut_until, work, work_stopped }
    };
    let n = 2 + rng.usize(0..3) + holders as usize - 1;
    for _ in 0..n {
        candidates.insert(next_id, spawn(next_id, &mut rng));
        next_id += 1;
    }

    // TTL on the slowest clock, the store's answer, the follower's expiry wake-up.
    let crash_bound = ttl.mul_f64(1.0 + 2.0 * max_drift) + world.max_latency * 2 + ttl / 10;
    // The last crash or stop (ns): a refusal of writes right after it would leave the
    // candidates no chance to take over in time, so none starts within the bound.
    let mut last_stop = 0u64;
    // The fault schedule: every so often, one event.
    let end = origin + cfg.duration;
    while Instant::now() < end {
        tokio::time::sleep(ttl.mul_f64(0.5 + 2.0 * rng.f64())).await;
        // With several holders, the holder of one slot, by chance.
        let target = match holders {
            1 => ElectionName::new(ELECTION).unwrap(),
            n => tenure::holders::slot_name(&ElectionName::new(ELECTION).unwrap(), rng.u32(0..n)).unwrap(),
        };
        let leader = world.store.get(&target).await.ok().flatten();
        let leader_id = leader
            .as_ref()
            .and_then(|l| candidates.iter().find(|(_, c)| c.name == l.holder.as_str()).map(|(id, _)| *id));
        let stopped_in = |l: &Option<LeaseRecord>| match (holders, l) {
            (1, _) | (_, None) => ELECTION.to_string(),
            (_, Some(l)) => {
                let index = tenure::holders::parse_slot(&l.election).map_or(0, |(_, i)| i);
                counted(tenure::holders::holder_token(l.token, index).0)
            }
        };
        let now = ns(origin);
        let refusing = now < world.refusing_until.load(Ordering::SeqCst);
        // Liveness is judged only when some other candidate can take over: one whose host
        // is not suspended, or, after a crash or stop, the fresh one started when fewer
        // than two remain.
        let others: Vec<&Candidate> =
            candidates.iter().filter(|(id, _)| Some(**id) != leader_id).map(|(_, c)| c).collect();
        let other_awake = others.iter().any(|c| c.cut_until.load(Ordering::SeqCst) <= now);
        let judged = others.len() < 2 || other_awake;
        let anyone_cut = candidates.values().any(|c| c.cut_until.load(Ordering::SeqCst) > now);
        let fault = rng.usize(0..12);
        if refusing && matches!(fault, 0..=2 | 8) {
            continue; // nobody could take over while the store refuses writes
        }
        if matches!(fault, 0..=2 | 8) && leader_id.is_some() {
            last_stop = now;
        }
        match fault {
            0 | 1 => {
                // Crash the leader: no release, its work stops at once.
                if let Some(id) = leader_id {
                    let c = candidates.remove(&id).unwrap();
                    c.dead.store(true, Ordering::SeqCst);
                    c.work.abort();
                    world.fault("crash");
                    if judged {
                        world.record(Record::Stop {
                            election: stopped_in(&leader),
                            holder: c.name.clone(),
                            at: ns(origin),
                            graceful: false,
                        });
                    }
                    drop(c.elector);
                }
            }
            2 => {
                // Stop the leader gracefully.
                if let Some(id) = leader_id {
                    let c = candidates.remove(&id).unwrap();
                    world.note(format!("stop {}", c.name));
                    let asked = ns(origin);
                    // A host that is suspended (cut off) cannot hand over at once.
                    let reachable = c.cut_until.load(Ordering::SeqCst) <= asked;
                    c.elector.shutdown().await;
                    let _ = c.work.await;
                    // The handover starts once the guarded work has stopped (a paused
                    // task delays it); judged for liveness only without store faults.
                    if calm && reachable && judged {
                        let at = asked.max(c.work_stopped.load(Ordering::SeqCst));
                        world.record(Record::Stop {
                            election: stopped_in(&leader),
                            holder: c.name.clone(),
                            at,
                            graceful: true,
                        });
                    }
                }
            }
            3 if !calm => {
                world.fault("store restart");
                let down = ttl.mul_f64(rng.f64());
                world.down_until.store(ns(origin) + down.as_nanos() as u64, Ordering::SeqCst);
            }
            4 if !calm => {
                // The store's clock steps forward by up to half the default safety margin.
                world.fault("store clock jump");
                let jump = margin.mul_f64(0.5 * rng.f64()).as_nanos() as u64;
                world.store_clock.jumped.fetch_add(jump, Ordering::SeqCst);
            }
            8 => {
                // The leader's host suspends for longer than a TTL: nothing of it runs, its
                // monotonic clock stands still, the store's clock runs on.
                if let Some(c) = leader_id.and_then(|id| candidates.get(&id))
                    && c.clock.suspend.lock().unwrap().is_none()
                {
                    world.fault("host suspend");
                    let until = now + ttl.mul_f64(1.2 + 1.8 * rng.f64()).as_nanos() as u64;
                    *c.clock.suspend.lock().unwrap() = Some((now, until));
                    c.cut_until.store(until, Ordering::SeqCst);
                    if other_awake {
                        world.record(Record::Stop {
                            election: stopped_in(&leader),
                            holder: c.name.clone(),
                            at: now,
                            graceful: false,
                        });
                    }
                }
            }
            // Not within the bound after a crash, a stop or the end of the last refusal,
            // each of which is still being judged for liveness.
            9 if !anyone_cut
                && now
                    >= last_stop.max(world.refusing_until.load(Ordering::SeqCst)) + crash_bound.as_nanos() as u64 =>
            {
                // The store takes no writes for longer than a TTL (a primary that became a
                // replica in a failover); then every candidate must campaign on.
                world.fault("store refuses writes");
                let until = now + ttl.mul_f64(1.2 + 1.3 * rng.f64()).as_nanos() as u64;
                world.refusing_until.store(until, Ordering::SeqCst);
                let w = world.clone();
                tokio::spawn(async move {
                    tokio::time::sleep_until(origin + Duration::from_nanos(until)).await;
                    w.record(Record::Recovered { election: ELECTION.into(), at: until });
                });
            }
            5..=7 if !calm => {
                // A partition: the leader (or, in one case of three, anyone) loses the store.
                let target = match (leader_id, rng.usize(0..3)) {
                    (Some(id), 0 | 1) => Some(id),
                    _ => candidates.keys().nth(rng.usize(0..candidates.len())).copied(),
                };
                if let Some(c) = target.and_then(|id| candidates.get(&id)) {
                    world.fault("partition");
                    let until = ns(origin) + ttl.mul_f64(0.5 + 2.5 * rng.f64()).as_nanos() as u64;
                    c.cut_until.store(until, Ordering::SeqCst);
                }
            }
            10 if prioritised && !refusing => {
                // `tenure evict --to`: an operator reserves the election for a named
                // candidate and evicts the leader, which stops its work and releases.
                let others: Vec<&Candidate> =
                    candidates.iter().filter(|(id, _)| Some(**id) != leader_id).map(|(_, c)| c).collect();
                if leader_id.is_some() && !others.is_empty() {
                    let to = others[rng.usize(0..others.len())].name.clone();
                    world.note(format!("evict --to {to}"));
                    let e = ElectionName::new(ELECTION).unwrap();
                    let (to, by) = (HolderId::new(&to).unwrap(), HolderId::new("operator").unwrap());
                    let _ = tenure::reserve(&world.store, &e, &to, &by, ttl).await;
                    let _ = world.store.evict(&e, Evict::AfterTerm).await;
                }
            }
            _ => {}
        }
        while candidates.len() < 1 + holders as usize {
            candidates.insert(next_id, spawn(next_id, &mut rng));
            next_id += 1;
        }
    }
    for (_, c) in std::mem::take(&mut candidates) {
        c.dead.store(true, Ordering::SeqCst);
        c.work.abort();
    }
    *world.chaos.lock().unwrap() = 0.0;

    let records = world.records.lock().unwrap().clone();
    let until = ns(origin);
    let liveness = (calm && holders == 1).then_some(Liveness {
        after_crash: crash_bound.as_nanos() as u64,
        // The release and the next acquire (four legs), plus, for a leader stopped while
        // its grant was still on its way back, that answer and its shutdown (two more).
        // An announcing leader withdraws its presence before it releases the election: a
        // release and a read (four more legs); or, when the presence's acquire went
        // unanswered, the call it has in flight, then a read, a release and a read (eight).
        after_stop: (world.max_latency * if prioritised { 14 } else { 6 } + Duration::from_millis(5)).as_nanos() as u64,
        until,
    });
    let mut summary = history::check(&records, liveness);
    if holders > 1 {
        summary.violations.extend(history::check_at_most(&records, &format!("{ELECTION}#"), holders as usize));
    }
    let mut hasher = std::collections::hash_map::DefaultHasher::new();
    world.log.lock().unwrap().hash(&mut hasher);
    SeedReport {
        seed,
        simulated: cfg.duration,
        faults: world.faults.load(Ordering::SeqCst),
        summary,
        log_hash: hasher.finish(),
        log: if cfg.keep_log { world.log.lock().unwrap().clone() } else { Vec::new() },
    }
}
