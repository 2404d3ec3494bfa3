//! The etcdctl scenario: the Debian `etcdctl elect` on the same etcd, as a baseline for
//! handover and crash takeover.

use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use serde_json::{Value, json};

/// Two `etcdctl elect` processes: the leader is interrupted (it resigns), then a leader
/// is killed (its session must run out); the time until the other prints its election.
pub(super) async fn etcdctl(described: &str, run: &str) -> Result<Value> {
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
