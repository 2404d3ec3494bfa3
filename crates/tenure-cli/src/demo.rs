//! `tenure demo`: five `tenure run` processes on a temporary SQLite store, a crash
//! takeover and a graceful handover, measured.

use std::io::Write;
use std::path::Path;
use std::process::Stdio;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use rustix::process::{Pid, Signal};
use tenure::{ElectionName, Leader};
use tokio::process::{Child, Command};
use tokio_stream::StreamExt;

const ELECTION: &str = "demo/job";

struct Demo {
    started: Instant,
}

impl Demo {
    fn say(&self, what: impl AsRef<str>) {
        let t = self.started.elapsed().as_secs_f64();
        let mut out = std::io::stdout().lock();
        let _ = writeln!(out, "[{t:6.2}s] {}", what.as_ref());
        let _ = out.flush();
    }
}

fn signal(child: &Child, sig: Signal) {
    if let Some(pid) = child.id().and_then(|p| Pid::from_raw(p as i32)) {
        let _ = rustix::process::kill_process(pid, sig);
    }
}

/// Whether `pid` is a running process: a zombie (dead, not yet reaped) does not count.
fn alive(pid: i32) -> bool {
    let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else { return false };
    // The state follows the command name, which is in parentheses and may hold spaces.
    let state = stat.rsplit_once(')').and_then(|(_, rest)| rest.split_whitespace().next());
    !matches!(state, None | Some("Z") | Some("X"))
}

/// Runs the demo; returns an error if anything it shows did not happen.
pub async fn demo(candidates: usize, ttl: Duration) -> Result<()> {
    if !(2..=20).contains(&candidates) {
        bail!("--candidates {candidates}: the demo needs 2 to 20 candidates");
    }
    // The candidates stop their job within 300 ms: the TTL must leave room for that.
    let campaign = crate::run::Campaign::new(ELECTION, ttl, Duration::from_millis(300));
    if let Err(e) = campaign.renew_deadline() {
        bail!("--ttl {} is too short for the demo (try 1s or more): {e}", humantime::format_duration(ttl));
    }
    let dir = tempfile::tempdir().context("cannot create a temporary directory for the demo store")?;
    let db = dir.path().join("demo.db");
    let url = format!("sqlite:{}", db.display());
    let exe = crate::term::own_program().context("cannot find the tenure executable")?;
    let d = Demo { started: Instant::now() };
    let store = crate::store_url::open(Some(&url)).await?;
    let mut leaders = Box::pin(tenure::observe(store, ElectionName::new(ELECTION)?).into_stream());

    d.say(format!(
        "starting {candidates} candidates: tenure run {ELECTION} --store {url} --ttl {} -- <job that prints while it leads>",
        humantime::format_duration(ttl)
    ));
    let t0 = Instant::now();
    let mut procs: Vec<(String, Child)> = Vec::new();
    for i in 1..=candidates {
        let id = format!("candidate-{i}");
        let child = Command::new(&exe)
            .args(["run", ELECTION, "--store", &url, "--ttl", &humantime::format_duration(ttl).to_string()])
            .args([
                "--grace",
                &format!("{}ms", campaign.grace.as_millis()),
                "--id",
                &id,
                "--",
                &exe.to_string_lossy(),
                "__demo-job",
            ])
            .arg(dir.path())
            .env("RUST_LOG", "error")
            .stdin(Stdio::null())
            .kill_on_drop(true)
            .spawn()
            .with_context(|| format!("cannot start {id}"))?;
        procs.push((id, child));
    }

    let next_leader = async |leaders: &mut (dyn tokio_stream::Stream<Item = Option<Leader>> + Unpin),
                             within: Duration|
           -> Result<Leader> {
        let deadline = tokio::time::Instant::now() + within;
        loop {
            match tokio::time::timeout_at(deadline, leaders.next()).await {
                Ok(Some(Some(l))) => return Ok(l),
                Ok(Some(None)) => continue,
                Ok(None) => bail!("the observer stopped"),
                Err(_) => bail!("no leader within {within:?}"),
            }
        }
    };

    let first = next_leader(&mut leaders, Duration::from_secs(10)).await?;
    d.say(format!(
        "{} leads with fencing token {} ({} ms after the candidates were started)",
        first.holder,
        first.token,
        t0.elapsed().as_millis()
    ));
    tokio::time::sleep(Duration::from_millis(1500)).await;

    // Crash: SIGKILL the leading `tenure run`.
    let ours = |holder: &tenure::HolderId| {
        procs
            .iter()
            .position(|(id, _)| holder.instance_name() == Some(id.as_str()))
            .context("the leader is not one of ours")
    };
    let (crashed_id, mut crashed) = procs.remove(ours(&first.holder)?);
    let job_pid: i32 = std::fs::read_to_string(dir.path().join(format!("{}.pid", first.holder)))
        .ok()
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or(0);
    d.say(format!("killing the leader {crashed_id} with SIGKILL (no chance to release its lease)"));
    let killed = Instant::now();
    signal(&crashed, Signal::KILL);
    let _ = crashed.wait().await;
    let second = next_leader(&mut leaders, ttl + Duration::from_secs(5)).await?;
    let takeover = killed.elapsed();
    d.say(format!(
        "{} took over with token {}, {} ms after the kill (TTL {} ms)",
        second.holder,
        second.token,
        takeover.as_millis(),
        ttl.as_millis()
    ));
    let job_gone = {
        let t = Instant::now();
        while job_pid > 0 && alive(job_pid) && t.elapsed() < Duration::from_secs(2) {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        job_pid > 0 && !alive(job_pid)
    };
    d.say(if job_gone {
        format!("the crashed leader's job (pid {job_pid}) died with it: no orphan keeps working")
    } else {
        format!("WARNING: the crashed leader's job (pid {job_pid}) is still alive")
    });
    tokio::time::sleep(Duration::from_millis(1500)).await;

    // Graceful: SIGTERM the new leader; it stops its job and releases.
    let i = procs
        .iter()
        .position(|(id, _)| second.holder.instance_name() == Some(id.as_str()))
        .context("the leader is not one of ours")?;
    let (stopped_id, mut stopped) = procs.remove(i);
    d.say(format!("stopping the leader {stopped_id} gracefully (SIGTERM): it stops its job, then releases the lease"));
    let term = Instant::now();
    signal(&stopped, Signal::TERM);
    let third = next_leader(&mut leaders, ttl + Duration::from_secs(5)).await?;
    let handover = term.elapsed();
    let _ = stopped.wait().await;
    d.say(format!("{} took over with token {}, {} ms after the stop", third.holder, third.token, handover.as_millis()));
    tokio::time::sleep(Duration::from_millis(1000)).await;

    d.say("stopping every candidate");
    for (_, c) in &procs {
        signal(c, Signal::TERM);
    }
    for (_, c) in &mut procs {
        let _ = tokio::time::timeout(Duration::from_secs(5), c.wait()).await;
    }

    let grew = first.token < second.token && second.token < third.token;
    println!();
    println!("summary");
    println!(
        "  leaders          {} (token {}) -> {} (token {}) -> {} (token {})",
        first.holder, first.token, second.holder, second.token, third.holder, third.token
    );
    println!("  crash takeover   {} ms after SIGKILL, TTL {} ms", takeover.as_millis(), ttl.as_millis());
    println!("  clean handover   {} ms after SIGTERM", handover.as_millis());
    println!("  orphaned jobs    {}", if job_gone { "none" } else { "ONE: the crashed leader's job survived" });
    println!("  tokens grew      {}", if grew { "yes" } else { "NO" });
    if !grew || !job_gone {
        bail!("the demo saw something wrong (see the summary)");
    }
    Ok(())
}

/// The job each demo candidate runs while it leads: prints, until SIGTERM.
pub async fn job(dir: &Path) -> Result<i32> {
    let holder = std::env::var("TENURE_HOLDER").unwrap_or_default();
    let token = std::env::var("TENURE_TOKEN").unwrap_or_default();
    std::fs::write(dir.join(format!("{holder}.pid")), std::process::id().to_string())?;
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
    loop {
        println!("         [{holder}] working with fencing token {token}");
        tokio::select! {
            _ = term.recv() => {
                println!("         [{holder}] stopping: leadership is ending");
                return Ok(0);
            }
            _ = tokio::time::sleep(Duration::from_millis(500)) => {}
        }
    }
}
