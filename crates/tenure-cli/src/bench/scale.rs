//! The scale and contest scenarios: many elections in one process through
//! [`tenure::Batched`] (with one store call per renewal as the baseline), and the same
//! elections contested by several processes.

use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use serde_json::{Value, json};
use tenure::faults::{FaultyStore, RenewalTimes};
use tenure::{Elector, Event, LeaseStore};

use super::{Opener, Settings, secs, stats};

/// One process holds many elections, its renewals gathered by [`tenure::Batched`] or,
/// for the baseline, one store call per renewal.
pub(super) async fn scale(open: &Opener<'_>, s: &Settings, run: &str, batched: bool) -> Result<Value> {
    // Counts the calls that reach the store (a renew_many is one).
    let raw = open.open().await?;
    let counter = FaultyStore::new(raw.clone());
    let handle: Arc<dyn LeaseStore> =
        if batched { Arc::new(tenure::Batched::new(Arc::new(counter.clone()))) } else { Arc::new(counter.clone()) };
    let mode = if batched { "batched" } else { "single" };
    let latencies = RenewalTimes::default();
    // Times every elector's renewals as each sees them (above the batching): one probe for
    // all, so that the process's memory per election is the runtime's, not the probe's.
    let probe: Arc<dyn LeaseStore> = Arc::new(FaultyStore::new(handle.clone()).timing_renewals(latencies.clone()));
    let (cpu0, rss0) = (cpu_time(), rss_bytes());
    let mut electors = Vec::with_capacity(s.scale);
    // The token each election was first won with: a term lost shows as no leadership, or
    // another token. (No event subscriptions: their buffers would be measured too.)
    let mut first: Vec<Option<tenure::FencingToken>> = Vec::with_capacity(s.scale);
    let token = |e: &Elector| e.current().map(|l| l.token());
    // Started in waves of 250, as a service would bring its shards up, so that the first
    // acquires do not all queue for the store at once.
    let t0 = Instant::now();
    let give_up = s.ttl * 6 + Duration::from_secs(30);
    let mut gave_up = false;
    for i in 0..s.scale {
        let el = Elector::builder(probe.clone(), format!("bench/{run}/scale-{mode}/{i}"))
            .holder(format!("bench-scale-{}", fastrand::u32(..)))
            .ttl(s.ttl)
            .build()?;
        el.start();
        electors.push(el);
        first.push(None);
        if electors.len() % WAVE == 0 || electors.len() == s.scale {
            loop {
                for (e, f) in electors.iter().zip(first.iter_mut()) {
                    if f.is_none() {
                        *f = token(e);
                    }
                }
                if first.iter().all(Option::is_some) {
                    break;
                }
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
    counter.take_counts();
    // Terms lost while the process was still starting elections are counted apart.
    let measured: Vec<Option<tenure::FencingToken>> = electors.iter().map(token).collect();
    let lost_starting = first.iter().zip(&measured).filter(|(f, m)| f.is_some() && f != m).count();
    let (cpu1, rss1) = (cpu_time(), rss_bytes());
    tokio::time::sleep(s.duration).await;
    let cpu2 = cpu_time();
    let (store_calls, _) = counter.take_counts();
    // A renewal that missed its deadline ends the term: a term lost while measuring shows
    // as no leadership, or another token (the runtime logs each step-down with its reason).
    let missed = electors.iter().zip(&measured).filter(|(e, m)| m.is_some() && token(e) != **m).count();
    let still = electors.iter().filter(|e| e.current().is_some()).count();
    let lat = std::mem::take(&mut *latencies.lock().unwrap());
    let renewals = lat.len();
    let t_stop = Instant::now();
    Elector::shutdown_all(electors).await;
    let stop_s = t_stop.elapsed().as_secs_f64();
    // A release that failed leaves its lease to expire: standbys would wait a TTL.
    let unreleased = raw.list(&format!("bench/{run}/scale-{mode}/")).await.map(|l| l.len()).ok();
    // Per election started: after a give-up, fewer than asked for.
    let n = started.max(1) as f64;
    Ok(json!({
        "elections": s.scale,
        "started": started,
        "leading_when_measured": won,
        "all_won": !gave_up,
        "all_won_in_s": won_in.as_secs_f64(),
        "all_released_in_s": stop_s,
        "left_unreleased": unreleased,
        "seconds": s.duration.as_secs_f64(),
        "renewals": renewals,
        "store_calls_per_s": store_calls as f64 / s.duration.as_secs_f64(),
        "renewal_latency": stats(lat),
        "terms_lost": missed,
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
pub(super) async fn contest(open: &Opener<'_>, s: &Settings, run: &str) -> Result<Value> {
    use tokio::io::AsyncBufReadExt;
    if s.processes == 0 {
        bail!("--processes must be at least 1");
    }
    let exe = crate::term::own_program().context("cannot find this program to start the contest's other processes")?;
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
    Elector::shutdown_all(electors).await;
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
pub async fn contest_peer(open: Opener<'_>, s: &Settings, run: &str) -> Result<i32> {
    use tokio::io::AsyncReadExt;
    let (report, electors) = contest_member(&open, s, run).await?;
    println!("{}", serde_json::to_string(&report)?);
    let mut rest = Vec::new();
    let _ = tokio::io::stdin().read_to_end(&mut rest).await;
    Elector::shutdown_all(electors).await;
    Ok(0)
}

/// One process of the contest: starts its candidates in waves (each wave waits until all
/// its elections have a leader, in whichever process), waits until every election has one,
/// then measures for the scenario's duration.
async fn contest_member(open: &Opener<'_>, s: &Settings, run: &str) -> Result<(Value, Vec<Elector>)> {
    let raw = open.open().await?;
    let counter = FaultyStore::new(raw.clone());
    let handle: Arc<dyn LeaseStore> = Arc::new(tenure::Batched::new(Arc::new(counter.clone())));
    let latencies = RenewalTimes::default();
    let probe: Arc<dyn LeaseStore> = Arc::new(FaultyStore::new(handle.clone()).timing_renewals(latencies.clone()));
    let holder = format!("bench-contest-{}-{}", std::process::id(), fastrand::u32(..));
    let rss0 = rss_bytes();
    let give_up = Instant::now() + s.ttl * 6 + Duration::from_secs(60);
    let mut electors = Vec::with_capacity(s.scale);
    let mut rx = Vec::with_capacity(s.scale);
    for i in 0..s.scale {
        let el = Elector::builder(probe.clone(), contest_name(run, i)).holder(&holder).ttl(s.ttl).build()?;
        rx.push(el.events());
        el.start();
        electors.push(el);
        if electors.len() % WAVE == 0 || electors.len() == s.scale {
            let wave = format!("bench/{run}/contest/{:03}/", i / WAVE);
            let want = (i % WAVE) + 1;
            while raw.list(&wave).await.map_or(0, |l| l.len()) < want {
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
    counter.take_counts();
    let leading = electors.iter().filter(|e| e.current().is_some()).count();
    let (cpu1, rss1) = (cpu_time(), rss_bytes());
    tokio::time::sleep(s.duration).await;
    let cpu2 = cpu_time();
    let (store_calls, _) = counter.take_counts();
    let (mut lost, mut changed) = (0, 0);
    for r in &mut rx {
        while let Ok(ev) = r.try_recv() {
            match ev {
                Event::SteppedDown { .. } => lost += 1,
                Event::LeaderChanged(_) => changed += 1,
                _ => {}
            }
        }
    }
    let still = electors.iter().filter(|e| e.current().is_some()).count();
    let lat = std::mem::take(&mut *latencies.lock().unwrap());
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
