//! Latency scenarios: the store's round trip, an uncontended acquire, a graceful
//! handover and a crash takeover between two candidates.

use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use serde_json::{Value, json};
use tenure::faults::{Fault, FaultyStore};
use tenure::store::{Acquire, AcquireRequest};
use tenure::{Elector, Event, HolderId, LeaseStore};
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

/// Two electors on one election, each with its own store handle.
async fn pair(open: &Opener<'_>, s: &Settings, election: &str) -> Result<Vec<(Elector, FaultyStore)>> {
    let mut v = Vec::new();
    for i in 0..2 {
        let probe = FaultyStore::new(open.open().await?);
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

pub(super) async fn handover(open: &Opener<'_>, s: &Settings, run: &str) -> Result<Value> {
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

pub(super) async fn crash(open: &Opener<'_>, s: &Settings, run: &str) -> Result<Value> {
    let cands = pair(open, s, &format!("bench/{run}/crash")).await?;
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
