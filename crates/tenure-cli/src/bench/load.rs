//! The load scenario: store calls per second in steady state, with watches and with
//! polling followers (the baseline client-go-style electors pay).

use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Result, bail};
use serde_json::{Value, json};
use tenure::Elector;
use tenure::faults::FaultyStore;

use super::{Opener, Settings};

/// E elections × C candidates; store calls counted per elector for `duration` once every
/// election has a leader.
pub(super) async fn load(open: &Opener<'_>, s: &Settings, run: &str, polling: bool) -> Result<Value> {
    let mode = if polling { "poll" } else { "watch" };
    let mut electors = Vec::new();
    for c in 0..s.candidates {
        // One store handle per candidate process.
        let handle = open.open().await?;
        for e in 0..s.elections {
            let probe = FaultyStore::new(handle.clone());
            let probe = if polling { probe.without_watch() } else { probe };
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
        p.take_counts();
    });
    let leading_before: Vec<bool> = electors.iter().map(|(e, _)| e.current().is_some()).collect();
    tokio::time::sleep(s.duration).await;
    let d = s.duration.as_secs_f64();
    let (mut lead, mut follow) = ((0u64, 0u64, 0usize), (0u64, 0u64, 0usize));
    let mut changed = 0;
    for ((e, p), was) in electors.iter().zip(&leading_before) {
        let (calls, events) = p.take_counts();
        let now = e.current().is_some();
        if now != *was {
            changed += 1;
        }
        let slot = if *was { &mut lead } else { &mut follow };
        slot.0 += calls;
        slot.1 += events;
        slot.2 += 1;
    }
    Elector::shutdown_all(electors.into_iter().map(|(e, _)| e)).await;
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
