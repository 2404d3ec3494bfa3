//! The process-level handover: `tenure run` processes hand a command over from one to the
//! next, and on etcd `etcdctl lock` does the same with the same commands, as a baseline.
//!
//! Each command is a small bash script that writes `$EPOCHREALTIME` to a file when it
//! starts, waits for a line on its own FIFO, and writes the time again just before it
//! exits. The handover is the next command's start less the previous command's end:
//! what a user of `tenure run CMD` waits between one replica's job ending and the
//! next one's starting. Both times come from the same host's wall clock, microseconds.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use anyhow::{Context, Result, bail};
use serde_json::Value;

use super::{Settings, stats};

/// Processes started for one sample: the tool (`tenure run` or `etcdctl lock`) and the
/// command it runs, which can be told to exit.
struct Replica {
    child: tokio::process::Child,
    started: PathBuf,
    ended: PathBuf,
    fifo: PathBuf,
    /// The command's process id, written before its start time.
    pid: PathBuf,
    /// The tool's standard error.
    log: PathBuf,
}

/// How one tool runs a command under an election: the program and its arguments
/// before the command.
struct Tool {
    program: PathBuf,
    args: Vec<String>,
    env: Vec<(String, String)>,
}

/// `samples` handovers of `tenure run` (and on etcd of `etcdctl lock`, in the same run).
pub(super) async fn run(described: &str, s: &Settings, run: &str) -> Result<Value> {
    let dir = tempfile::Builder::new().prefix("tenure-bench-run-").tempdir().context("a temporary directory")?;
    let samples = s.samples.clamp(1, 20);
    let me = std::env::current_exe().context("the tenure binary")?;
    let mut args = Vec::new();
    if let Some(url) = &s.store_url {
        args.extend(["--store".to_string(), url.clone()]);
    }
    let ttl = format!("{}ms", s.ttl.as_millis());
    args.extend(["run".into(), format!("bench-{run}-tenure-run"), "--ttl".into(), ttl, "--".into()]);
    let tenure = Tool { program: me, args, env: Vec::new() };
    let mut out = serde_json::Map::new();
    out.insert("tenure_run".into(), handovers(&tenure, dir.path(), "t", samples).await?);
    if let Some(endpoints) = described.strip_prefix("etcd://").and_then(|r| r.split_whitespace().next()) {
        let lock = Tool {
            program: "etcdctl".into(),
            args: vec![
                "--endpoints".into(),
                endpoints.to_string(),
                "lock".into(),
                "--ttl".into(),
                s.ttl.as_secs().max(1).to_string(),
                format!("bench-{run}-etcdctl-lock"),
                // Without it, etcdctl would read the command's `-c` as a flag of its own.
                "--".into(),
            ],
            env: vec![("ETCDCTL_API".into(), "3".into())],
        };
        out.insert("etcdctl_lock".into(), handovers(&lock, dir.path(), "e", samples).await?);
    }
    Ok(Value::Object(out))
}

/// Starts a leader and a standby, then `samples` times: tells the leader's command to
/// exit, waits for the standby's command to start, and starts the next standby.
///
/// On a loaded machine a short TTL can run out under the leader (a renewal that did not
/// land in time): its command is stopped and the standby's starts, with no handover to
/// time. Such a sample is counted in `lost_terms` and taken again; the previous leader,
/// which then campaigns again, is stopped. Two commands alive at once fail the run.
async fn handovers(tool: &Tool, dir: &Path, prefix: &str, samples: usize) -> Result<Value> {
    let mut times = Vec::new();
    let mut lost = 0;
    let mut leader = start(tool, dir, &format!("{prefix}0"))?;
    wait_for(&leader.started, Duration::from_secs(30)).await.context("the first command did not start")?;
    let mut i = 0;
    while times.len() < samples {
        i += 1;
        let mut standby = start(tool, dir, &format!("{prefix}{i}"))?;
        // Time for the standby to start campaigning and to follow the leader.
        tokio::time::sleep(Duration::from_millis(700)).await;
        let told = if standby.started.exists() { false } else { tell_to_exit(&leader).await? };
        if !told {
            // The leader's command is gone without being told: its term ran out.
            wait_for(&standby.started, Duration::from_secs(60)).await.context("the standby's command did not start")?;
            if command_alive(&leader) {
                bail!("two commands ran at once: {} started while the leader's ran", standby.started.display());
            }
            lost += 1;
            if lost > samples {
                bail!(
                    "the leader's term ran out {lost} times before its command was told to exit: this machine is too \
                     loaded for this TTL; choose a longer --ttl"
                );
            }
            stop(&mut leader).await;
            std::mem::swap(&mut leader, &mut standby);
            continue;
        }
        wait_for(&standby.started, Duration::from_secs(60)).await.context("the standby's command did not start")?;
        let ended = read_time(&leader.ended).await?;
        let started = read_time(&standby.started).await?;
        times.push(Duration::from_secs_f64((started - ended).max(0.0)));
        let status = match tokio::time::timeout(Duration::from_secs(30), leader.child.wait()).await {
            Ok(status) => status?,
            Err(_) => bail!(
                "{} did not exit within 30 s after its command; what it wrote:\n{}",
                tool.program.display(),
                std::fs::read_to_string(&leader.log).unwrap_or_default()
            ),
        };
        if !status.success() {
            bail!("{} exited with {status} after its command ended", tool.program.display());
        }
        std::mem::swap(&mut leader, &mut standby);
    }
    if tell_to_exit(&leader).await? {
        let _ = tokio::time::timeout(Duration::from_secs(30), leader.child.wait()).await;
    }
    let mut out = stats(times);
    out["lost_terms"] = lost.into();
    Ok(out)
}

/// Starts `tool` with the command of replica `id`. The command makes its FIFO before it
/// writes its start time, so the FIFO exists once the start time does.
fn start(tool: &Tool, dir: &Path, id: &str) -> Result<Replica> {
    let path = |what: &str| dir.join(format!("{id}.{what}"));
    let (started, ended, fifo, pid, log) = (path("started"), path("ended"), path("fifo"), path("pid"), path("log"));
    // The start time goes to a temporary name first, so a reader never sees half of it.
    let script = format!(
        "t=$EPOCHREALTIME; mkfifo '{f}' && echo $$ > '{p}' && echo $t > '{s}.tmp' && mv '{s}.tmp' '{s}' && \
         read -r _ < '{f}'; echo $EPOCHREALTIME > '{e}'",
        s = started.display(),
        f = fifo.display(),
        p = pid.display(),
        e = ended.display()
    );
    let stderr = std::fs::File::create(&log).with_context(|| format!("cannot create {}", log.display()))?;
    let child = tokio::process::Command::new(&tool.program)
        .args(&tool.args)
        .args(["bash", "-c", &script])
        .envs(tool.env.iter().map(|(k, v)| (k, v)))
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(stderr)
        .kill_on_drop(true)
        .spawn()
        .with_context(|| format!("cannot start {}", tool.program.display()))?;
    Ok(Replica { child, started, ended, fifo, pid, log })
}

/// Stops the replica's tool (SIGTERM, SIGKILL after 10 s) and waits for it.
async fn stop(r: &mut Replica) {
    if let Some(pid) = r.child.id().and_then(|p| rustix::process::Pid::from_raw(p as i32)) {
        let _ = rustix::process::kill_process(pid, rustix::process::Signal::TERM);
    }
    if tokio::time::timeout(Duration::from_secs(10), r.child.wait()).await.is_err() {
        let _ = r.child.kill().await;
    }
}

/// Whether the replica's command still runs (a zombie does not).
fn command_alive(r: &Replica) -> bool {
    let Some(pid) = std::fs::read_to_string(&r.pid).ok().and_then(|p| p.trim().parse::<u32>().ok()) else {
        return false;
    };
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|s| s.rfind(')').map(|i| s[i + 1..].trim_start().starts_with('Z')))
        .is_some_and(|zombie| !zombie)
}

/// Writes a line to the replica's FIFO (its command reads it and exits); `false` if the
/// command is gone (its term ran out), so that nobody will read it.
async fn tell_to_exit(r: &Replica) -> Result<bool> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let t0 = std::time::Instant::now();
    loop {
        // Without blocking: with no reader, the open fails (ENXIO) instead of waiting.
        match std::fs::OpenOptions::new()
            .write(true)
            .custom_flags(rustix::fs::OFlags::NONBLOCK.bits() as i32)
            .open(&r.fifo)
        {
            Ok(mut f) => {
                f.write_all(b"exit\n").with_context(|| format!("writing to {}", r.fifo.display()))?;
                return Ok(true);
            }
            Err(e) if e.raw_os_error() == Some(rustix::io::Errno::NXIO.raw_os_error()) => {
                if !command_alive(r) {
                    return Ok(false);
                }
                if t0.elapsed() > Duration::from_secs(30) {
                    bail!("the command of {} never read its FIFO", r.fifo.display());
                }
                tokio::time::sleep(Duration::from_millis(1)).await;
            }
            Err(e) => return Err(e).with_context(|| format!("opening {}", r.fifo.display())),
        }
    }
}

/// Waits (looking every millisecond) until `path` exists.
async fn wait_for(path: &Path, within: Duration) -> Result<()> {
    let t0 = std::time::Instant::now();
    while !path.exists() {
        if t0.elapsed() > within {
            bail!("{} did not appear within {within:?}", path.display());
        }
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    Ok(())
}

/// Reads a time written by `echo $EPOCHREALTIME` (seconds, with a decimal point or comma).
async fn read_time(path: &Path) -> Result<f64> {
    let text = std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    text.trim().replace(',', ".").parse().with_context(|| format!("{} holds no time: {text:?}", path.display()))
}
