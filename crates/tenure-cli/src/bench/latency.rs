//! Latency scenarios: the store's round trip, an uncontended acquire, a graceful
//! handover and a crash takeover between two candidates.

use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use serde_json::{Value, json};
use tenure::faults::{Fault, FaultyStore};
use tenure::store::{Acquire, AcquireRequest, ExpiryJudge, Renew, StoreError, WatchStream};
use tenure::{ElectionName, Elector, Event, Evict, HolderId, LeaseRecord, LeaseStore};
use tokio::sync::broadcast;

use super::{Opener, Settings, name, secs, stats};

pub(super) async fn rtt(store: &dyn LeaseStore, samples: usize, run: &str) -> Result<Value> {
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

pub(super) async fn acquire(store: &dyn LeaseStore, s: &Settings, run: &str) -> Result<Value> {
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

/// Two electors on one election, each with its own store handle; their calls and watch
/// events are noted in `stamps`.
async fn pair(open: &Opener<'_>, s: &Settings, election: &str, stamps: &Stamps) -> Result<Vec<(Elector, FaultyStore)>> {
    let mut v = Vec::new();
    for i in 0..2 {
        let stamped = Stamped { inner: open.open().await?, who: i, stamps: stamps.clone() };
        let probe = FaultyStore::new(Arc::new(stamped));
        let e = Elector::builder(Arc::new(probe.clone()), election)
            .holder(format!("bench-{i}-{}", fastrand::u32(..)))
            .ttl(s.ttl)
            .build()?;
        v.push((e, probe));
    }
    Ok(v)
}

/// What a candidate's store handle did, and when.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Mark {
    ReleaseSent,
    ReleaseDone,
    /// A watch event reached the candidate.
    Heard,
    AcquireSent,
    AcquireDone,
}

/// Marks noted by the candidates of a scenario: when, what, and by which candidate.
#[derive(Clone, Default)]
struct Stamps(Arc<std::sync::Mutex<Vec<(Instant, Mark, usize)>>>);

impl Stamps {
    fn note(&self, mark: Mark, who: usize) {
        let now = Instant::now();
        self.0.lock().unwrap_or_else(|p| p.into_inner()).push((now, mark, who));
    }

    /// Forgets every mark so far.
    fn clear(&self) {
        self.0.lock().unwrap_or_else(|p| p.into_inner()).clear();
    }

    /// The last `mark` by `who` at or before `until`.
    fn last_before(&self, mark: Mark, who: usize, until: Instant) -> Option<Instant> {
        let v = self.0.lock().unwrap_or_else(|p| p.into_inner());
        v.iter().rev().find(|(t, m, w)| *m == mark && *w == who && *t <= until).map(|(t, ..)| *t)
    }

    /// The first `mark` by `who` at or after `from`.
    fn first(&self, mark: Mark, who: usize, from: Instant) -> Option<Instant> {
        let v = self.0.lock().unwrap_or_else(|p| p.into_inner());
        v.iter().find(|(t, m, w)| *m == mark && *w == who && *t >= from).map(|(t, ..)| *t)
    }
}

/// A store handle that notes in [`Stamps`] when its releases and acquires are sent and
/// answered, and when its watch events arrive.
struct Stamped {
    inner: Arc<dyn LeaseStore>,
    who: usize,
    stamps: Stamps,
}

#[async_trait::async_trait]
impl LeaseStore for Stamped {
    async fn try_acquire(&self, req: &AcquireRequest) -> Result<Acquire, StoreError> {
        self.stamps.note(Mark::AcquireSent, self.who);
        let r = self.inner.try_acquire(req).await;
        self.stamps.note(Mark::AcquireDone, self.who);
        r
    }
    async fn renew(&self, held: &LeaseRecord, ttl: Duration) -> Result<Renew, StoreError> {
        self.inner.renew(held, ttl).await
    }
    async fn renew_many(&self, held: &[LeaseRecord], ttl: Duration) -> Vec<Result<Renew, StoreError>> {
        self.inner.renew_many(held, ttl).await
    }
    async fn release(&self, held: &LeaseRecord) -> Result<(), StoreError> {
        self.stamps.note(Mark::ReleaseSent, self.who);
        let r = self.inner.release(held).await;
        self.stamps.note(Mark::ReleaseDone, self.who);
        r
    }
    async fn release_many(&self, held: &[LeaseRecord]) -> Vec<Result<(), StoreError>> {
        self.inner.release_many(held).await
    }
    async fn get(&self, election: &ElectionName) -> Result<Option<LeaseRecord>, StoreError> {
        self.inner.get(election).await
    }
    async fn list(&self, prefix: &str) -> Result<Vec<LeaseRecord>, StoreError> {
        self.inner.list(prefix).await
    }
    async fn evict(&self, election: &ElectionName, how: Evict) -> Result<Option<LeaseRecord>, StoreError> {
        self.inner.evict(election, how).await
    }
    fn watch(&self, election: &ElectionName) -> Option<WatchStream> {
        use tokio_stream::StreamExt;
        let (stamps, who) = (self.stamps.clone(), self.who);
        Some(Box::pin(self.inner.watch(election)?.map(move |ev| {
            stamps.note(Mark::Heard, who);
            ev
        })))
    }
    fn expiry(&self) -> ExpiryJudge {
        self.inner.expiry()
    }
    fn renewal_grid(&self) -> Option<tenure::Instant> {
        self.inner.renewal_grid()
    }
    fn watch_reports_expiry(&self) -> bool {
        self.inner.watch_reports_expiry()
    }
    fn describe(&self) -> String {
        self.inner.describe()
    }
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

/// A graceful handover, `--handovers` times: from `resign()` until the other
/// candidate's `Elected`. Each sample is also cut into its steps, from the candidates'
/// own calls and watch events: until the leader sends its release, the release's round
/// trip, until the follower hears of it (from the release being sent: a store may tell
/// watchers before the releaser has its answer), until the follower sends its acquire,
/// the acquire's round trip, and until `Elected` is seen.
pub(super) async fn handover(open: &Opener<'_>, s: &Settings, run: &str) -> Result<Value> {
    let stamps = Stamps::default();
    let cands = pair(open, s, &format!("bench/{run}/handover"), &stamps).await?;
    let mut rx: Vec<_> = cands.iter().map(|(e, _)| e.events()).collect();
    cands.iter().for_each(|(e, _)| e.start());
    let mut leader = next_elected(&mut rx, s.ttl * 4).await?;
    // The other candidate's first acquire may still be under way: let it settle into
    // following, as it has before every later sample.
    tokio::time::sleep(cands[0].0.config().resign_backoff * 2).await;
    let mut v = Vec::new();
    let mut steps: [Vec<Duration>; STEPS.len()] = Default::default();
    let mut regained = 0;
    for _ in 0..s.handovers {
        let l = cands[leader].0.current().context("the leader has no leadership")?;
        stamps.clear();
        let t0 = Instant::now();
        tokio::spawn(l.resign());
        let next = next_elected(&mut rx, s.ttl * 4).await?;
        let elected = Instant::now();
        // Let the one that resigned finish its back-off and follow again (and its
        // release's answer, which may come after the successor has won, arrive).
        tokio::time::sleep(cands[0].0.config().resign_backoff * 2).await;
        if next == leader {
            // The other candidate did not take over within the resigner's back-off.
            regained += 1;
        } else {
            v.push(elected - t0);
            let release_sent = stamps.first(Mark::ReleaseSent, leader, t0);
            let release_done = release_sent.and_then(|rs| stamps.first(Mark::ReleaseDone, leader, rs));
            let heard = release_sent.and_then(|rs| stamps.first(Mark::Heard, next, rs));
            // The acquire that won: the follower's last before `Elected`.
            let won = stamps.last_before(Mark::AcquireSent, next, elected);
            let won_done = won.and_then(|w| stamps.first(Mark::AcquireDone, next, w));
            if let (Some(rs), Some(rd), Some(heard), Some(won), Some(won_done)) =
                (release_sent, release_done, heard, won, won_done)
            {
                let at = [(t0, rs), (rs, rd), (rs, heard), (heard, won), (won, won_done), (won_done, elected)];
                for (step, (from, to)) in steps.iter_mut().zip(at) {
                    step.push(to.saturating_duration_since(from));
                }
            }
        }
        leader = next;
    }
    for (e, _) in &cands {
        e.shutdown().await;
    }
    let mut st = stats(v);
    if let Value::Object(m) = &mut st {
        m.insert("resigner_won_again".into(), json!(regained));
        let by_step = STEPS.iter().zip(steps).map(|(k, v)| ((*k).to_string(), stats(v))).collect();
        m.insert("steps".into(), Value::Object(by_step));
    }
    Ok(st)
}

/// The steps of a handover, in the order they happen; see [`handover`].
pub(super) const STEPS: [&str; 6] =
    ["to_release_sent", "release", "release_sent_to_heard", "heard_to_acquire_sent", "acquire", "to_elected_seen"];

pub(super) async fn crash(open: &Opener<'_>, s: &Settings, run: &str) -> Result<Value> {
    let cands = pair(open, s, &format!("bench/{run}/crash"), &Stamps::default()).await?;
    let mut rx: Vec<_> = cands.iter().map(|(e, _)| e.events()).collect();
    cands.iter().for_each(|(e, _)| e.start());
    let mut leader = next_elected(&mut rx, s.ttl * 4).await?;
    let mut v = Vec::new();
    for _ in 0..s.samples.clamp(1, 5) {
        // The leader is cut off from the store: it cannot renew or release.
        cands[leader].1.set(Fault::Unavailable);
        let t0 = Instant::now();
        let next = loop {
            let i = next_elected(&mut rx, s.ttl * 4).await?;
            if i != leader {
                break i;
            }
        };
        v.push(t0.elapsed());
        cands[leader].1.set(Fault::None);
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
