//! `tenure bench`: speed and load of the runtime on one store, measured in one run, with
//! the store's own round trip and a polling baseline as references.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use serde_json::{Value, json};
use tenure::store::{Acquire, AcquireRequest, Renew, WatchStream};
use tenure::{ElectionName, Elector, Event, Evict, HolderId, LeaseRecord, LeaseStore, StoreError};
use tokio::sync::broadcast;

/// What `tenure bench` measures.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, clap::ValueEnum)]
pub enum Scenario {
    /// The store's raw round trip: a `get` of an election nobody holds
    Rtt,
    /// Uncontended acquire latency
    Acquire,
    /// A leader resigns; time until the other candidate leads
    Handover,
    /// A leader stops without releasing; time until the other candidate leads
    Crash,
    /// Store operations in steady state, with watches and with polling (the baseline)
    Load,
    /// Many elections held by one process: renewal latency, missed renewals, CPU, memory
    Scale,
    /// The scale elections, each contested by several processes (--processes)
    Contest,
    /// etcd only: handover and crash takeover of the Debian `etcdctl elect`, as a baseline
    Etcdctl,
}

/// Settings of a run: the arguments of `tenure bench`.
#[derive(clap::Args)]
pub struct Settings {
    /// Scenarios to run (default: all but scale and contest)
    #[arg(long = "scenario", value_name = "SCENARIO", value_enum, value_delimiter = ',', default_values_t = [Scenario::Rtt, Scenario::Acquire, Scenario::Handover, Scenario::Crash, Scenario::Load])]
    pub scenarios: Vec<Scenario>,
    /// Lease TTL of every candidate
    #[arg(long, default_value = "2s", value_parser = crate::duration)]
    pub ttl: Duration,
    /// Samples for round trip and acquire (handover takes at most 50, crash at most 5)
    #[arg(long, default_value_t = 200)]
    pub samples: usize,
    /// Elections in the load scenario
    #[arg(long, default_value_t = 10)]
    pub elections: usize,
    /// Candidates per election in the load scenario (one store handle each)
    #[arg(long, default_value_t = 3)]
    pub candidates: usize,
    /// How long the load, scale and contest scenarios measure
    #[arg(long, default_value = "10s", value_parser = crate::duration)]
    pub duration: Duration,
    /// Elections held by one process in the scale scenario (and contested in contest)
    #[arg(long, default_value_t = 10_000)]
    pub scale: usize,
    /// Processes contesting every election in the contest scenario
    #[arg(long, default_value_t = 3)]
    pub processes: usize,
    /// Internal: be one of the contest's other processes, for this run
    #[arg(long, hide = true)]
    pub contest_peer: Option<String>,
    /// The `--store` given to this process, passed on to the contest's other processes.
    #[arg(skip)]
    pub store_url: Option<String>,
    /// Print JSON
    #[arg(long)]
    pub json: bool,
}

/// A store wrapper that counts the calls made through it and can play dead.
#[derive(Clone)]
struct Probe {
    inner: Arc<dyn LeaseStore>,
    calls: Arc<AtomicU64>,
    watch_events: Arc<AtomicU64>,
    /// Renewal latencies in microseconds (scale scenario).
    renewals: Option<Arc<std::sync::Mutex<Vec<u64>>>>,
    /// Hide the store's watch: followers poll, as client-go-style electors do.
    polling: bool,
    /// Every call fails at once, as if the process were cut off.
    dead: Arc<AtomicBool>,
}

impl Probe {
    fn new(inner: Arc<dyn LeaseStore>, polling: bool) -> Self {
        Self {
            inner,
            calls: Arc::default(),
            watch_events: Arc::default(),
            renewals: None,
            polling,
            dead: Arc::default(),
        }
    }

    fn call(&self) -> Result<(), StoreError> {
        if self.dead.load(Ordering::Relaxed) {
            return Err(StoreError::unavailable("bench: this candidate is cut off"));
        }
        self.calls.fetch_add(1, Ordering::Relaxed);
        Ok(())
    }

    fn reset(&self) -> (u64, u64) {
        (self.calls.swap(0, Ordering::Relaxed), self.watch_events.swap(0, Ordering::Relaxed))
    }
}

#[async_trait::async_trait]
impl LeaseStore for Probe {
    async fn try_acquire(&self, req: &AcquireRequest) -> Result<Acquire, StoreError> {
        self.call()?;
        self.inner.try_acquire(req).await
    }
    async fn renew(&self, held: &LeaseRecord, ttl: Duration) -> Result<Renew, StoreError> {
        self.call()?;
        let t0 = Instant::now();
        let r = self.inner.renew(held, ttl).await;
        if let Some(l) = &self.renewals {
            l.lock().unwrap().push(t0.elapsed().as_micros() as u64);
        }
        r
    }
    async fn renew_many(&self, held: &[LeaseRecord], ttl: Duration) -> Vec<Result<Renew, StoreError>> {
        if let Err(e) = self.call() {
            return held.iter().map(|_| Err(e.duplicate())).collect();
        }
        self.inner.renew_many(held, ttl).await
    }
    async fn release(&self, held: &LeaseRecord) -> Result<(), StoreError> {
        self.call()?;
        self.inner.release(held).await
    }
    async fn get(&self, election: &ElectionName) -> Result<Option<LeaseRecord>, StoreError> {
        self.call()?;
        self.inner.get(election).await
    }
    async fn list(&self, prefix: &str) -> Result<Vec<LeaseRecord>, StoreError> {
        self.call()?;
        self.inner.list(prefix).await
    }
    async fn evict(&self, election: &ElectionName, how: Evict) -> Result<Option<LeaseRecord>, StoreError> {
        self.call()?;
        self.inner.evict(election, how).await
    }
    fn watch(&self, election: &ElectionName) -> Option<WatchStream> {
        if self.polling {
            return None;
        }
        use tokio_stream::StreamExt;
        let events = self.watch_events.clone();
        let dead = self.dead.clone();
        let s = self.inner.watch(election)?;
        // Each event is at least one read the watch made on its own; a dead candidate's
        // watch is cut off too.
        Some(Box::pin(s.take_while(move |_| !dead.load(Ordering::Relaxed)).map(move |ev| {
            events.fetch_add(1, Ordering::Relaxed);
            ev
        })))
    }
    fn expiry(&self) -> tenure::store::ExpiryJudge {
        self.inner.expiry()
    }
    fn describe(&self) -> String {
        self.inner.describe()
    }
}

/// Latency figures of a sample, in seconds.
fn stats(mut v: Vec<Duration>) -> Value {
    v.sort();
    let at = |q: f64| v.get(((v.len() as f64 - 1.0) * q).round() as usize).map_or(0.0, |d| d.as_secs_f64());
    json!({"n": v.len(), "p50": at(0.5), "p99": at(0.99), "max": at(1.0)})
}

fn secs(v: &Value, k: &str) -> f64 {
    v[k].as_f64().unwrap_or(0.0)
}

fn fmt_d(s: f64) -> String {
    if s < 0.001 {
        format!("{:.0} µs", s * 1e6)
    } else if s < 1.0 {
        format!("{:.2} ms", s * 1e3)
    } else {
        format!("{s:.2} s")
    }
}

/// Runs the scenarios against `open()`'s store and prints the figures.
pub async fn bench<F, Fut>(open: F, s: &Settings) -> Result<i32>
where
    F: Fn() -> Fut,
    Fut: std::future::Future<Output = Result<Arc<dyn LeaseStore>>>,
{
    if s.samples == 0 || s.candidates < 2 || s.elections == 0 || s.scale == 0 || s.duration.is_zero() {
        bail!("--samples, --elections, --scale and --duration must be above 0 and --candidates at least 2");
    }
    let run = format!("{:x}", fastrand::u32(..));
    let first = open().await?;
    let mut out = serde_json::Map::new();
    out.insert("store".into(), json!(first.describe()));
    out.insert("ttl_s".into(), json!(s.ttl.as_secs_f64()));
    let mut rtt_p50 = None;
    let mut scenarios = s.scenarios.clone();
    scenarios.sort();
    scenarios.dedup();
    for sc in scenarios {
        if !s.json {
            eprintln!("bench: {sc:?} …");
        }
        let v = match sc {
            Scenario::Rtt => {
                let v = rtt(&*first, s.samples, &run).await?;
                rtt_p50 = Some(secs(&v, "p50"));
                v
            }
            Scenario::Acquire => acquire(&*first, s, &run).await?,
            Scenario::Handover => handover(&open, s, &run).await?,
            Scenario::Crash => crash(&open, s, &run).await?,
            Scenario::Load => {
                let watching = load(&open, s, &run, false).await?;
                let polling = load(&open, s, &run, true).await?;
                json!({"watching": watching, "polling_baseline": polling})
            }
            Scenario::Etcdctl => etcdctl(&first.describe(), &run).await?,
            Scenario::Contest => contest(&open, s, &run).await?,
            Scenario::Scale => {
                let batched = scale(&open, s, &run, true).await?;
                let baseline = scale(&open, s, &run, false).await?;
                json!({"batched": batched, "per_election_baseline": baseline})
            }
        };
        out.insert(format!("{sc:?}").to_lowercase(), v);
    }
    if let Some(r) = rtt_p50.filter(|r| *r > 0.0) {
        for k in ["acquire", "handover"] {
            if let Some(Value::Object(m)) = out.get_mut(k) {
                let p50 = m["p50"].as_f64().unwrap_or(0.0);
                m.insert("p50_in_rtt".into(), json!(p50 / r));
            }
        }
    }
    let out = Value::Object(out);
    if s.json {
        println!("{}", serde_json::to_string_pretty(&out)?);
    } else {
        print_table(&out);
    }
    Ok(0)
}

fn name(s: &str) -> Result<ElectionName> {
    ElectionName::new(s).context("bench election name")
}

async fn rtt(store: &dyn LeaseStore, samples: usize, run: &str) -> Result<Value> {
    let e = name(&format!("bench/{run}/rtt"))?;
    for _ in 0..5.min(samples) {
        store.get(&e).await?;
    }
    let mut v = Vec::with_capacity(samples);
    for _ in 0..samples {
        let t0 = Instant::now();
        store.get(&e).await?;
        v.push(t0.elapsed());
    }
    Ok(stats(v))
}

async fn acquire(store: &dyn LeaseStore, s: &Settings, run: &str) -> Result<Value> {
    let holder = HolderId::new(format!("bench-{run}"))?;
    let mut v = Vec::with_capacity(s.samples);
    for i in 0..s.samples {
        let req = AcquireRequest::new(name(&format!("bench/{run}/acquire/{i}"))?, holder.clone(), s.ttl);
        let t0 = Instant::now();
        let got = store.try_acquire(&req).await?;
        v.push(t0.elapsed());
        match got {
            Acquire::Acquired(l) => store.release(&l).await?,
            Acquire::Held(r) => bail!("{} was held by {} in an uncontended acquire", req.election, r.holder),
        }
    }
    Ok(stats(v))
}

/// Two electors on one election, each with its own store handle.
async fn pair<F, Fut>(open: &F, s: &Settings, election: &str) -> Result<Vec<(Elector, Probe)>>
where
    F: Fn() -> Fut,
    Fut: std::future::Future<Output = Result<Arc<dyn LeaseStore>>>,
{
    let mut v = Vec::new();
    for i in 0..2 {
        let probe = Probe::new(open().await?, false);
        let e = Elector::builder(Arc::new(probe.clone()), election)
            .holder(format!("bench-{i}-{}", fastrand::u32(..)))
            .ttl(s.ttl)
            .build()?;
        v.push((e, probe));
    }
    Ok(v)
}

/// Waits for an `Elected` event on any of `rx`, and says whose.
async fn next_elected(rx: &mut [broadcast::Receiver<Event>], within: Duration) -> Result<usize> {
    let wait = async {
        loop {
            let mut polls: Vec<_> = rx.iter_mut().map(|r| Box::pin(r.recv())).collect();
            let (ev, i) = first_ready(&mut polls).await;
            if let Ok(Event::Elected { .. }) = ev {
                return i;
            }
        }
    };
    tokio::time::timeout(within, wait).await.context("no candidate was elected in time")
}

/// The first of several futures to finish, with its index.
async fn first_ready<T, F: std::future::Future<Output = T> + Unpin>(futs: &mut [F]) -> (T, usize) {
    std::future::poll_fn(|cx| {
        for (i, f) in futs.iter_mut().enumerate() {
            if let std::task::Poll::Ready(v) = std::pin::Pin::new(f).poll(cx) {
                return std::task::Poll::Ready((v, i));
            }
        }
        std::task::Poll::Pending
    })
    .await
}

async fn handover<F, Fut>(open: &F, s: &Settings, run: &str) -> Result<Value>
where
    F: Fn() -> Fut,
    Fut: std::future::Future<Output = Result<Arc<dyn LeaseStore>>>,
{
    let cands = pair(open, s, &format!("bench/{run}/handover")).await?;
    let mut rx: Vec<_> = cands.iter().map(|(e, _)| e.events()).collect();
    cands.iter().for_each(|(e, _)| e.start());
    let mut leader = next_elected(&mut rx, s.ttl * 4).await?;
    let mut v = Vec::new();
    let mut regained = 0;
    for _ in 0..s.samples.min(50) {
        let l = cands[leader].0.current().context("the leader has no leadership")?;
        let t0 = Instant::now();
        tokio::spawn(l.resign());
        let next = next_elected(&mut rx, s.ttl * 4).await?;
        if next == leader {
            // The other candidate did not take over within the resigner's back-off.
            regained += 1;
        } else {
            v.push(t0.elapsed());
        }
        leader = next;
        // Let the one that resigned finish its back-off and follow again.
        tokio::time::sleep(cands[0].0.config().resign_backoff * 2).await;
    }
    for (e, _) in &cands {
        e.shutdown().await;
    }
    let mut st = stats(v);
    if let Value::Object(m) = &mut st {
        m.insert("resigner_won_again".into(), json!(regained));
    }
    Ok(st)
}

async fn crash<F, Fut>(open: &F, s: &Settings, run: &str) -> Result<Value>
where
    F: Fn() -> Fut,
    Fut: std::future::Future<Output = Result<Arc<dyn LeaseStore>>>,
{
    let cands = pair(open, s, &format!("bench/{run}/crash")).await?;
    let mut rx: Vec<_> = cands.iter().map(|(e, _)| e.events()).collect();
    cands.iter().for_each(|(e, _)| e.start());
    let mut leader = next_elected(&mut rx, s.ttl * 4).await?;
    let mut v = Vec::new();
    for _ in 0..s.samples.clamp(1, 5) {
        // The leader is cut off from the store: it cannot renew or release.
        cands[leader].1.dead.store(true, Ordering::Relaxed);
        let t0 = Instant::now();
        let next = loop {
            let i = next_elected(&mut rx, s.ttl * 4).await?;
            if i != leader {
                break i;
            }
        };
        v.push(t0.elapsed());
        cands[leader].1.dead.store(false, Ordering::Relaxed);
        leader = next;
        tokio::time::sleep(s.ttl / 2).await;
    }
    for (e, _) in &cands {
        e.shutdown().await;
    }
    let mut st = stats(v);
    let p50 = secs(&st, "p50");
    if let Value::Object(m) = &mut st {
        m.insert("p50_in_ttl".into(), json!(p50 / s.ttl.as_secs_f64()));
    }
    Ok(st)
}

/// E elections × C candidates; store calls counted per elector for `duration` once every
/// election has a leader.
async fn load<F, Fut>(open: &F, s: &Settings, run: &str, polling: bool) -> Result<Value>
where
    F: Fn() -> Fut,
    Fut: std::future::Future<Output = Result<Arc<dyn LeaseStore>>>,
{
    let mode = if polling { "poll" } else { "watch" };
    let mut electors = Vec::new();
    for c in 0..s.candidates {
        // One store handle per candidate process.
        let handle = open().await?;
        for e in 0..s.elections {
            let probe = Probe::new(handle.clone(), polling);
            let el = Elector::builder(Arc::new(probe.clone()), format!("bench/{run}/load-{mode}/{e}"))
                .holder(format!("bench-{c}-{}", fastrand::u32(..)))
                .ttl(s.ttl)
                .build()?;
            el.start();
            electors.push((el, probe));
        }
    }
    // Settle: every election has a leader, and the losers have followed for a while.
    let t0 = Instant::now();
    while electors.iter().filter(|(e, _)| e.current().is_some()).count() < s.elections {
        if t0.elapsed() > s.ttl * 10 {
            bail!("not every election got a leader");
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    tokio::time::sleep(s.ttl).await;
    electors.iter().for_each(|(_, p)| {
        p.reset();
    });
    let leading_before: Vec<bool> = electors.iter().map(|(e, _)| e.current().is_some()).collect();
    tokio::time::sleep(s.duration).await;
    let d = s.duration.as_secs_f64();
    let (mut lead, mut follow) = ((0u64, 0u64, 0usize), (0u64, 0u64, 0usize));
    let mut changed = 0;
    for ((e, p), was) in electors.iter().zip(&leading_before) {
        let (calls, events) = p.reset();
        let now = e.current().is_some();
        if now != *was {
            changed += 1;
        }
        let slot = if *was { &mut lead } else { &mut follow };
        slot.0 += calls;
        slot.1 += events;
        slot.2 += 1;
    }
    shutdown_all(electors.into_iter().map(|(e, _)| e).collect()).await;
    let per = |(c, _, n): (u64, u64, usize)| if n == 0 { 0.0 } else { c as f64 / n as f64 / d };
    let per_ev = |(_, ev, n): (u64, u64, usize)| if n == 0 { 0.0 } else { ev as f64 / n as f64 / d };
    Ok(json!({
        "elections": s.elections,
        "candidates": s.candidates,
        "seconds": d,
        "calls_per_s": (lead.0 + follow.0) as f64 / d,
        "calls_per_s_per_leader": per(lead),
        "calls_per_s_per_follower": per(follow),
        "watch_reads_per_s_per_follower": per_ev(follow),
        "leadership_changes": changed,
    }))
}

/// One process holds many elections, its renewals gathered by [`tenure::Batched`] or,
/// for the baseline, one store call per renewal.
async fn scale<F, Fut>(open: &F, s: &Settings, run: &str, batched: bool) -> Result<Value>
where
    F: Fn() -> Fut,
    Fut: std::future::Future<Output = Result<Arc<dyn LeaseStore>>>,
{
    // Counts the calls that reach the store (a renew_many is one).
    let counter = Probe::new(open().await?, false);
    let handle: Arc<dyn LeaseStore> =
        if batched { Arc::new(tenure::Batched::new(Arc::new(counter.clone()))) } else { Arc::new(counter.clone()) };
    let mode = if batched { "batched" } else { "single" };
    let latencies = Arc::new(std::sync::Mutex::new(Vec::new()));
    let (cpu0, rss0) = (cpu_time(), rss_bytes());
    let mut electors = Vec::with_capacity(s.scale);
    let mut rx = Vec::with_capacity(s.scale);
    // Started in waves of 250, as a service would bring its shards up, so that the first
    // acquires do not all queue for the store at once.
    let t0 = Instant::now();
    let give_up = s.ttl * 6 + Duration::from_secs(30);
    let mut gave_up = false;
    for i in 0..s.scale {
        let mut probe = Probe::new(handle.clone(), false);
        probe.renewals = Some(latencies.clone());
        let el = Elector::builder(Arc::new(probe), format!("bench/{run}/scale-{mode}/{i}"))
            .holder(format!("bench-scale-{}", fastrand::u32(..)))
            .ttl(s.ttl)
            .build()?;
        rx.push(el.events());
        el.start();
        electors.push(el);
        if electors.len() % WAVE == 0 || electors.len() == s.scale {
            while electors.iter().filter(|e| e.current().is_some()).count() < electors.len() {
                if t0.elapsed() > give_up {
                    gave_up = true;
                    break;
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        }
        if gave_up {
            // The store cannot keep up: measure what the process holds now.
            break;
        }
    }
    let won_in = t0.elapsed();
    let started = electors.len();
    let won = electors.iter().filter(|e| e.current().is_some()).count();
    latencies.lock().unwrap().clear();
    counter.reset();
    // Terms lost while the process was still starting elections are counted apart.
    let mut lost_starting = 0;
    for r in &mut rx {
        while let Ok(ev) = r.try_recv() {
            lost_starting += usize::from(matches!(ev, Event::SteppedDown { .. }));
        }
    }
    let (cpu1, rss1) = (cpu_time(), rss_bytes());
    tokio::time::sleep(s.duration).await;
    let cpu2 = cpu_time();
    let (store_calls, _) = counter.reset();
    // A renewal that missed its deadline ends the term: any SteppedDown is a miss. By reason.
    let mut missed = 0;
    let mut reasons: std::collections::BTreeMap<String, usize> = Default::default();
    for r in &mut rx {
        while let Ok(ev) = r.try_recv() {
            if let Event::SteppedDown { reason } = ev {
                missed += 1;
                let name = format!("{reason:?}");
                let name = name.split([' ', '{', '(']).next().unwrap_or("").to_string();
                *reasons.entry(name).or_default() += 1;
            }
        }
    }
    let still = electors.iter().filter(|e| e.current().is_some()).count();
    let lat: Vec<Duration> = latencies.lock().unwrap().iter().map(|us| Duration::from_micros(*us)).collect();
    let renewals = lat.len();
    let t_stop = Instant::now();
    shutdown_all(electors).await;
    let stop_s = t_stop.elapsed().as_secs_f64();
    // Per election started: after a give-up, fewer than asked for.
    let n = started.max(1) as f64;
    Ok(json!({
        "elections": s.scale,
        "started": started,
        "leading_when_measured": won,
        "all_won": !gave_up,
        "all_won_in_s": won_in.as_secs_f64(),
        "all_released_in_s": stop_s,
        "seconds": s.duration.as_secs_f64(),
        "renewals": renewals,
        "store_calls_per_s": store_calls as f64 / s.duration.as_secs_f64(),
        "renewal_latency": stats(lat),
        "terms_lost": missed,
        "terms_lost_by_reason": reasons,
        "terms_lost_while_starting": lost_starting,
        "still_leading": still,
        "cpu_s_per_election_per_s": (cpu2 - cpu1) / n / s.duration.as_secs_f64(),
        "cpu_s_to_win_all": cpu1 - cpu0,
        "rss_bytes_per_election": (rss1.saturating_sub(rss0)) as f64 / n,
    }))
}

/// Elections of the contest scenario, under `bench/RUN/contest/`.
fn contest_name(run: &str, i: usize) -> String {
    format!("bench/{run}/contest/{:03}/{i}", i / WAVE)
}

/// Electors started at once, in the scale and contest scenarios.
const WAVE: usize = 250;

/// The contest scenario: this process and `processes - 1` others (this program again, in
/// the peer role) each campaign for the same `scale` elections through `Batched`. Each
/// measures itself for the same time; this one gathers their reports.
async fn contest<F, Fut>(open: &F, s: &Settings, run: &str) -> Result<Value>
where
    F: Fn() -> Fut,
    Fut: std::future::Future<Output = Result<Arc<dyn LeaseStore>>>,
{
    use tokio::io::AsyncBufReadExt;
    if s.processes == 0 {
        bail!("--processes must be at least 1");
    }
    let exe = crate::child::own_program().context("cannot find this program to start the contest's other processes")?;
    let mut peers = Vec::new();
    for _ in 1..s.processes {
        let mut cmd = tokio::process::Command::new(&exe);
        // Through the environment: a URL may hold a password, which must not show in `ps`.
        if let Some(url) = &s.store_url {
            cmd.env("TENURE_STORE", url);
        }
        cmd.args(["bench", "--contest-peer", run, "--scale", &s.scale.to_string()])
            .args(["--ttl", &format!("{}ms", s.ttl.as_millis())])
            .args(["--duration", &format!("{}ms", s.duration.as_millis())])
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .kill_on_drop(true);
        peers.push(cmd.spawn().context("cannot start a contest process")?);
    }
    let (mine, electors) = contest_member(open, s, run).await?;
    let mut reports = vec![mine];
    for p in &mut peers {
        let out = p.stdout.take().context("contest process without output")?;
        let mut line = String::new();
        tokio::io::BufReader::new(out).read_line(&mut line).await?;
        reports.push(serde_json::from_str(&line).context("a contest process did not report")?);
    }
    // Everyone has measured: now all may stop.
    for p in &mut peers {
        drop(p.stdin.take());
    }
    shutdown_all(electors).await;
    for p in &mut peers {
        let _ = tokio::time::timeout(Duration::from_secs(60), p.wait()).await;
    }
    let sum = |k: &str| reports.iter().map(|r| r[k].as_f64().unwrap_or(0.0)).sum::<f64>();
    let count = |k: &str| reports.iter().map(|r| r[k].as_u64().unwrap_or(0)).sum::<u64>();
    let max = |k: &str| reports.iter().map(|r| secs(&r["renewal_latency"], k)).fold(0.0, f64::max);
    Ok(json!({
        "processes": s.processes,
        "elections": s.scale,
        "seconds": s.duration.as_secs_f64(),
        "leading_when_measured": count("leading_when_measured"),
        "still_leading": count("still_leading"),
        "terms_lost": count("terms_lost"),
        "leaders_changed": count("leaders_changed"),
        "store_calls_per_s": sum("store_calls_per_s"),
        "renewal_p99_max": max("p99"),
        "cpu_s_per_election_per_s": sum("cpu_s_per_election_per_s"),
        "per_process": reports,
    }))
}

/// The contest's other processes: campaign, report on one line, and hold until this
/// process's input closes (so that no election changes hands while others measure).
pub async fn contest_peer<F, Fut>(open: F, s: &Settings, run: &str) -> Result<i32>
where
    F: Fn() -> Fut,
    Fut: std::future::Future<Output = Result<Arc<dyn LeaseStore>>>,
{
    use tokio::io::AsyncReadExt;
    let (report, electors) = contest_member(&open, s, run).await?;
    println!("{}", serde_json::to_string(&report)?);
    let mut rest = Vec::new();
    let _ = tokio::io::stdin().read_to_end(&mut rest).await;
    shutdown_all(electors).await;
    Ok(0)
}

/// One process of the contest: starts its candidates in waves (each wave waits until all
/// its elections have a leader, in whichever process), waits until every election has one,
/// then measures for the scenario's duration.
async fn contest_member<F, Fut>(open: &F, s: &Settings, run: &str) -> Result<(Value, Vec<Elector>)>
where
    F: Fn() -> Fut,
    Fut: std::future::Future<Output = Result<Arc<dyn LeaseStore>>>,
{
    let counter = Probe::new(open().await?, false);
    let handle: Arc<dyn LeaseStore> = Arc::new(tenure::Batched::new(Arc::new(counter.clone())));
    let latencies = Arc::new(std::sync::Mutex::new(Vec::new()));
    let holder = format!("bench-contest-{}-{}", std::process::id(), fastrand::u32(..));
    let rss0 = rss_bytes();
    let give_up = Instant::now() + s.ttl * 6 + Duration::from_secs(60);
    let mut electors = Vec::with_capacity(s.scale);
    let mut rx = Vec::with_capacity(s.scale);
    for i in 0..s.scale {
        let mut probe = Probe::new(handle.clone(), false);
        probe.renewals = Some(latencies.clone());
        let el = Elector::builder(Arc::new(probe), contest_name(run, i)).holder(&holder).ttl(s.ttl).build()?;
        rx.push(el.events());
        el.start();
        electors.push(el);
        if electors.len() % WAVE == 0 || electors.len() == s.scale {
            let wave = format!("bench/{run}/contest/{:03}/", i / WAVE);
            let want = (i % WAVE) + 1;
            while counter.inner.list(&wave).await.map_or(0, |l| l.len()) < want {
                if Instant::now() > give_up {
                    bail!("the contest's elections did not all get a leader in time; the store cannot keep up");
                }
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
    }
    // Every candidate has heard who leads (its own win or another's) before measuring.
    let mut told = vec![false; rx.len()];
    loop {
        for (r, t) in rx.iter_mut().zip(told.iter_mut()) {
            while let Ok(ev) = r.try_recv() {
                *t |= matches!(ev, Event::Elected { .. } | Event::LeaderChanged(Some(_)));
            }
        }
        if told.iter().all(|t| *t) {
            break;
        }
        if Instant::now() > give_up {
            bail!("the contest's candidates did not all hear of a leader in time");
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    latencies.lock().unwrap().clear();
    counter.reset();
    let leading = electors.iter().filter(|e| e.current().is_some()).count();
    let (cpu1, rss1) = (cpu_time(), rss_bytes());
    tokio::time::sleep(s.duration).await;
    let cpu2 = cpu_time();
    let (store_calls, _) = counter.reset();
    let (mut lost, mut changed) = (0, 0);
    for r in &mut rx {
        while let Ok(ev) = r.try_recv() {
            match ev {
                Event::SteppedDown { .. } => lost += 1,
                Event::LeaderChanged(_) => changed += 1,
                Event::Elected { .. } => {}
            }
        }
    }
    let still = electors.iter().filter(|e| e.current().is_some()).count();
    let lat: Vec<Duration> = latencies.lock().unwrap().iter().map(|us| Duration::from_micros(*us)).collect();
    let n = s.scale as f64;
    let report = json!({
        "pid": std::process::id(),
        "leading_when_measured": leading,
        "still_leading": still,
        "terms_lost": lost,
        "leaders_changed": changed,
        "renewals": lat.len(),
        "renewal_latency": stats(lat),
        "store_calls_per_s": store_calls as f64 / s.duration.as_secs_f64(),
        "cpu_s_per_election_per_s": (cpu2 - cpu1) / n / s.duration.as_secs_f64(),
        "rss_bytes_per_election": rss1.saturating_sub(rss0) as f64 / n,
    });
    Ok((report, electors))
}

/// Two `etcdctl elect` processes: the leader is interrupted (it resigns), then a leader
/// is killed (its session must run out); the time until the other prints its election.
async fn etcdctl(described: &str, run: &str) -> Result<Value> {
    use tokio::io::AsyncBufReadExt;
    let endpoints = described
        .strip_prefix("etcd://")
        .and_then(|r| r.split_whitespace().next())
        .context("the etcdctl scenario needs an etcd:// store without TLS")?
        .to_string();
    let name = format!("bench-{run}-etcdctl");
    let spawn = |proposal: &str| -> Result<(tokio::process::Child, tokio::io::Lines<_>)> {
        let mut c = tokio::process::Command::new("etcdctl")
            .args(["--endpoints", &endpoints, "elect", &name, proposal])
            .env("ETCDCTL_API", "3")
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::null())
            .kill_on_drop(true)
            .spawn()
            .context("cannot start etcdctl (Debian package etcd-client)")?;
        let out = c.stdout.take().context("etcdctl stdout")?;
        Ok((c, tokio::io::BufReader::new(out).lines()))
    };
    // etcdctl prints the election key when it wins.
    async fn won(
        lines: &mut tokio::io::Lines<tokio::io::BufReader<tokio::process::ChildStdout>>,
        within: Duration,
    ) -> Result<()> {
        tokio::time::timeout(within, lines.next_line()).await.context("etcdctl did not win in time")??;
        Ok(())
    }
    let (mut a, mut la) = spawn("a")?;
    won(&mut la, Duration::from_secs(10)).await?;
    let (b, mut lb) = spawn("b")?;
    tokio::time::sleep(Duration::from_millis(500)).await;
    let t0 = Instant::now();
    rustix::process::kill_process(
        rustix::process::Pid::from_raw(a.id().context("etcdctl pid")? as i32).context("etcdctl pid")?,
        rustix::process::Signal::INT,
    )?;
    won(&mut lb, Duration::from_secs(30)).await?;
    let handover = t0.elapsed();
    let _ = a.wait().await;
    let (c, mut lc) = spawn("c")?;
    tokio::time::sleep(Duration::from_millis(500)).await;
    let t0 = Instant::now();
    drop(b); // SIGKILL: its session lease has to run out.
    won(&mut lc, Duration::from_secs(120)).await?;
    let crash = t0.elapsed();
    drop(c);
    Ok(json!({"handover_s": handover.as_secs_f64(), "crash_takeover_s": crash.as_secs_f64()}))
}

/// Stops every elector at once (each releases its lease).
async fn shutdown_all(electors: Vec<Elector>) {
    let mut tasks = tokio::task::JoinSet::new();
    for e in electors {
        tasks.spawn(async move { e.shutdown().await });
    }
    while tasks.join_next().await.is_some() {}
}

/// CPU time (user + system) of this process so far, in seconds (0 where /proc is missing).
fn cpu_time() -> f64 {
    let Ok(stat) = std::fs::read_to_string("/proc/self/stat") else { return 0.0 };
    // Fields after the command name (which is in parentheses and may hold spaces).
    let rest = stat.rsplit_once(')').map_or("", |(_, r)| r);
    let f: Vec<&str> = rest.split_whitespace().collect();
    let ticks = |i: usize| f.get(i).and_then(|v| v.parse::<f64>().ok()).unwrap_or(0.0);
    // utime and stime are fields 14 and 15 of the line, 12 and 13 after the name.
    (ticks(11) + ticks(12)) / rustix::param::clock_ticks_per_second() as f64
}

/// Resident memory of this process, in bytes (0 where /proc is missing).
fn rss_bytes() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines().find(|l| l.starts_with("VmRSS:")).and_then(|l| l.split_whitespace().nth(1)?.parse::<u64>().ok())
        })
        .map_or(0, |kb| kb * 1024)
}

fn print_table(v: &Value) {
    println!("store      {}", v["store"].as_str().unwrap_or(""));
    println!("ttl        {}", fmt_d(secs(v, "ttl_s")));
    let lat = |label: &str, k: &str, extra: &str| {
        if let Some(x) = v.get(k) {
            let ratio = x.get(extra).and_then(Value::as_f64).map_or(String::new(), |r| {
                format!("   p50 = {r:.1} × {}", if extra == "p50_in_ttl" { "TTL" } else { "round trip" })
            });
            println!(
                "{label:<22} p50 {:>10}  p99 {:>10}  max {:>10}  (n={}){ratio}",
                fmt_d(secs(x, "p50")),
                fmt_d(secs(x, "p99")),
                fmt_d(secs(x, "max")),
                x["n"]
            );
        }
    };
    lat("round trip (get)", "rtt", "");
    lat("uncontended acquire", "acquire", "p50_in_rtt");
    lat("graceful handover", "handover", "p50_in_rtt");
    lat("crash takeover", "crash", "p50_in_ttl");
    if let Some(l) = v.get("load") {
        let w = &l["watching"];
        println!(
            "steady load            {} elections × {} candidates for {}",
            w["elections"],
            w["candidates"],
            fmt_d(secs(w, "seconds"))
        );
        println!("  {:<28} {:>12} {:>12}", "", "watching", "polling");
        let p = &l["polling_baseline"];
        for (label, k) in [
            ("store calls/s, all", "calls_per_s"),
            ("calls/s per leader", "calls_per_s_per_leader"),
            ("calls/s per follower", "calls_per_s_per_follower"),
            ("watch events/s per follower", "watch_reads_per_s_per_follower"),
        ] {
            println!("  {label:<28} {:>12.2} {:>12.2}", secs(w, k), secs(p, k));
        }
    }
    if let Some(x) = v.get("etcdctl") {
        println!(
            "etcdctl elect baseline handover {}   crash takeover {}",
            fmt_d(secs(x, "handover_s")),
            fmt_d(secs(x, "crash_takeover_s"))
        );
    }
    if let Some(c) = v.get("contest") {
        println!(
            "contest                {} elections, each contested by {} processes, for {}",
            c["elections"],
            c["processes"],
            fmt_d(secs(c, "seconds"))
        );
        println!(
            "  leading (all processes) {} when measured, {} at the end; terms lost {}; leaders changed {}",
            c["leading_when_measured"], c["still_leading"], c["terms_lost"], c["leaders_changed"]
        );
        println!(
            "  store calls/s (all processes) {:.1}; renewal p99 (worst process) {}; CPU µs/s per election {:.2}",
            secs(c, "store_calls_per_s"),
            fmt_d(secs(c, "renewal_p99_max")),
            secs(c, "cpu_s_per_election_per_s") * 1e6
        );
    }
    if let Some(sc) = v.get("scale") {
        println!(
            "scale                  {} elections in one process for {}",
            sc["batched"]["elections"],
            fmt_d(secs(&sc["batched"], "seconds"))
        );
        println!("  {:<28} {:>12} {:>12}", "", "batched", "per election");
        let (b, p) = (&sc["batched"], &sc["per_election_baseline"]);
        let row = |label: &str, f: &dyn Fn(&Value) -> String| println!("  {label:<28} {:>12} {:>12}", f(b), f(p));
        row("all won in", &|x| fmt_d(secs(x, "all_won_in_s")));
        row("renewals", &|x| x["renewals"].to_string());
        row("store calls/s", &|x| format!("{:.1}", secs(x, "store_calls_per_s")));
        row("renewal p99", &|x| fmt_d(secs(&x["renewal_latency"], "p99")));
        row("terms lost", &|x| x["terms_lost"].to_string());
        row("CPU µs/s per election", &|x| format!("{:.2}", secs(x, "cpu_s_per_election_per_s") * 1e6));
        row("RSS bytes per election", &|x| format!("{:.0}", secs(x, "rss_bytes_per_election")));
    }
}
