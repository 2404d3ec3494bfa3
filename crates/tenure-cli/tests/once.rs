//! A unit of work done once across replicas: `tenure run --once KEY` started on every
//! host (as cron does), crashes and failures in the middle of a run, `--no-wait` and
//! `--wait-timeout`, and `tenure schedule` slots across takeovers and skewed clocks.

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

mod common;
use common::{Proc, tenure};

struct Env {
    dir: tempfile::TempDir,
}

impl Env {
    fn new() -> Self {
        Self { dir: tempfile::tempdir().unwrap() }
    }
    fn store(&self) -> String {
        format!("sqlite:{}", self.dir.path().join("t.db").display())
    }
    fn log(&self) -> PathBuf {
        self.dir.path().join("runs.log")
    }
    fn cmd(&self) -> Command {
        let mut c = Command::new(tenure());
        c.env("TENURE_STORE", self.store()).env("RUST_LOG", "info").stdin(Stdio::null());
        c
    }
    /// `tenure run ARGS -- sh -c SCRIPT`, where SCRIPT first logs
    /// `run HOLDER TOKEN KEY ATTEMPT WALL_NS`.
    fn run(&self, args: &[&str], script: &str) -> Command {
        let mut c = self.cmd();
        let logged = format!(
            "echo run ${{TENURE_HOLDER%.*}} $TENURE_TOKEN ${{TENURE_ONCE_KEY:--}} ${{TENURE_ONCE_ATTEMPT:-0}} $(date +%s%N) >> {}; {script}",
            self.log().display()
        );
        c.arg("run").args(args).args(["--", "sh", "-c", &logged]);
        c
    }
}

/// One `run` line of the log.
#[derive(Debug)]
struct Run {
    holder: String,
    token: u64,
    key: String,
    attempt: u32,
}

fn runs(log: &Path) -> Vec<Run> {
    std::fs::read_to_string(log)
        .unwrap_or_default()
        .lines()
        .filter_map(|l| {
            let p: Vec<&str> = l.split(' ').collect();
            (p.first() == Some(&"run")).then_some(())?;
            Some(Run {
                holder: p.get(1)?.to_string(),
                token: p.get(2)?.parse().ok()?,
                key: p.get(3)?.to_string(),
                attempt: p.get(4)?.parse().ok()?,
            })
        })
        .collect()
}

fn wait_runs(log: &Path, n: usize, within: Duration) -> Vec<Run> {
    let t0 = Instant::now();
    loop {
        let r = runs(log);
        if r.len() >= n {
            return r;
        }
        assert!(t0.elapsed() < within, "expected {n} runs within {within:?}, saw {r:?}");
        std::thread::sleep(Duration::from_millis(10));
    }
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

fn wait_exit(p: &mut Proc, within: Duration) -> std::process::ExitStatus {
    let t0 = Instant::now();
    loop {
        if let Some(st) = p.try_wait().unwrap() {
            return st;
        }
        assert!(t0.elapsed() < within, "the process did not exit within {within:?}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn three_replicas_started_at_once_run_the_key_once_and_a_later_start_does_nothing() {
    // README's cron pattern, on three "hosts" at the same minute.
    let env = Env::new();
    let mut replicas: Vec<Proc> = (1..=3)
        .map(|i| {
            let id = format!("host-{i}");
            env.run(&["jobs/nightly", "--once", "2026-11-27", "--id", &id, "--ttl", "2s"], "sleep 0.3")
                .stderr(Stdio::null())
                .spawn()
                .map(Proc)
                .unwrap()
        })
        .collect();
    for r in &mut replicas {
        assert_eq!(wait_exit(r, Duration::from_secs(30)).code(), Some(0), "every replica exits 0");
    }
    let done = runs(&env.log());
    assert_eq!(done.len(), 1, "the report ran once: {done:?}");
    assert_eq!((done[0].key.as_str(), done[0].attempt), ("2026-11-27", 1));
    // A start after the key was done runs nothing and says who did it.
    let out = env.run(&["jobs/nightly", "--once", "2026-11-27"], "true").output().unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert!(stderr(&out).contains(&format!("2026-11-27 was done by {}", done[0].holder)), "{}", stderr(&out));
    assert_eq!(runs(&env.log()).len(), 1, "a later start ran it again");
    // Another key is another unit of work.
    let out = env.run(&["jobs/nightly", "--once", "2026-11-28"], "true").output().unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert_eq!(runs(&env.log()).len(), 2);
}

/// Two replicas on one key whose first run never ends; the leader is SIGKILLed mid-run.
/// Answers the log's runs and the second replica's exit.
fn crash_mid_run(env: &Env, extra: &[&str]) -> (Vec<Run>, Output) {
    let script = "if [ \"$TENURE_ONCE_ATTEMPT\" = 1 ]; then sleep 60; fi";
    let mut args = vec!["jobs/report", "--once", "k-1", "--ttl", "2s", "--grace", "300ms"];
    args.extend_from_slice(extra);
    let mut first =
        env.run(&[&args[..], &["--id", "a"]].concat(), script).stderr(Stdio::null()).spawn().map(Proc).unwrap();
    wait_runs(&env.log(), 1, Duration::from_secs(20));
    let second = env.run(&[&args[..], &["--id", "b"]].concat(), script).stderr(Stdio::piped()).spawn().unwrap();
    std::thread::sleep(Duration::from_millis(300));
    first.kill().unwrap();
    first.wait().unwrap();
    let out = second.wait_with_output().unwrap();
    (runs(&env.log()), out)
}

#[test]
fn a_run_cut_short_by_a_crash_runs_again_under_the_next_leader_with_a_larger_token() {
    let env = Env::new();
    let (runs, out) = crash_mid_run(&env, &[]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert_eq!(runs.len(), 2, "run again after the crash: {runs:?}");
    assert_eq!((runs[0].holder.as_str(), runs[1].holder.as_str()), ("a", "b"));
    assert!(runs[1].token > runs[0].token, "the rerun has a larger token: {runs:?}");
    assert_eq!((runs[0].attempt, runs[1].attempt), (1, 2));
    assert!(stderr(&out).contains("ended with its term"), "{}", stderr(&out));
}

#[test]
fn at_most_once_never_starts_a_key_again_after_a_crash() {
    let env = Env::new();
    let (runs, out) = crash_mid_run(&env, &["--at-most-once"]);
    assert_eq!(runs.len(), 1, "at most once: {runs:?}");
    assert_eq!(out.status.code(), Some(1), "a key that will not run is an error: {}", stderr(&out));
    assert!(stderr(&out).contains("k-1 will not run: a run of it may have started before"), "{}", stderr(&out));
}

#[test]
fn a_failed_run_leaves_the_key_open_until_its_attempts_are_used_up() {
    let env = Env::new();
    let args = ["jobs/flaky", "--once", "k", "--attempts", "2"];
    for attempt in 1..=2 {
        let out = env.run(&args, "exit 3").output().unwrap();
        assert_eq!(out.status.code(), Some(3), "the command's own code: {}", stderr(&out));
        assert!(stderr(&out).contains("stays open for another attempt"), "{}", stderr(&out));
        assert_eq!(runs(&env.log()).last().unwrap().attempt, attempt);
    }
    let out = env.run(&args, "true").output().unwrap();
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    assert!(stderr(&out).contains("k will not run: it has used up its attempts"), "{}", stderr(&out));
    assert_eq!(runs(&env.log()).len(), 2);
    // --attempts does not go with --at-most-once, and both want --once.
    let out = env.run(&["jobs/flaky", "--once", "k", "--attempts", "2", "--at-most-once"], "true").output().unwrap();
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    let out = env.run(&["jobs/flaky", "--at-most-once"], "true").output().unwrap();
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    let out = env.run(&["jobs/flaky", "--once", "a/b"], "true").output().unwrap();
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    assert!(stderr(&out).contains("invalid work key"), "{}", stderr(&out));
}

#[test]
fn no_wait_and_wait_timeout_give_up_with_the_documented_code() {
    let env = Env::new();
    let mut leader =
        env.run(&["jobs/x", "--id", "leader"], "sleep 60").stderr(Stdio::null()).spawn().map(Proc).unwrap();
    wait_runs(&env.log(), 1, Duration::from_secs(20));
    let t0 = Instant::now();
    let out = env.run(&["jobs/x", "--no-wait"], "true").output().unwrap();
    assert_eq!(out.status.code(), Some(75), "{}", stderr(&out));
    assert!(t0.elapsed() < Duration::from_secs(5), "--no-wait gives up at once, took {:?}", t0.elapsed());
    assert!(stderr(&out).contains("giving up: leader.") && stderr(&out).contains(" leads (token "), "{}", stderr(&out));
    let out = env.run(&["jobs/x", "--no-wait", "--conflict-exit-code", "9"], "true").output().unwrap();
    assert_eq!(out.status.code(), Some(9), "{}", stderr(&out));
    let t0 = Instant::now();
    let out = env.run(&["jobs/x", "--wait-timeout", "1s"], "true").output().unwrap();
    assert_eq!(out.status.code(), Some(75), "{}", stderr(&out));
    assert!(t0.elapsed() >= Duration::from_secs(1), "gave up before the timeout");
    assert!(stderr(&out).contains("no term within --wait-timeout 1s"), "{}", stderr(&out));
    assert_eq!(runs(&env.log()).len(), 1, "nobody else ran");
    // Free again: --no-wait runs the command.
    rustix::process::kill_process(
        rustix::process::Pid::from_raw(leader.id() as i32).unwrap(),
        rustix::process::Signal::TERM,
    )
    .unwrap();
    leader.wait().unwrap();
    let out = env.run(&["jobs/x", "--no-wait"], "exit 4").output().unwrap();
    assert_eq!(out.status.code(), Some(4), "{}", stderr(&out));
}

/// `tenure schedule --every PERIOD` logging `slot HOLDER TOKEN TENURE_SLOT WALL_NS`.
fn scheduler(env: &Env, id: &str, period: &str, skew: Option<(&Path, &str)>) -> Proc {
    let script =
        format!("echo slot ${{TENURE_HOLDER%.*}} $TENURE_TOKEN $TENURE_SLOT $(date +%s%N) >> {}", env.log().display());
    let mut c = env.cmd();
    if let Some((lib, by)) = skew {
        c.env("LD_PRELOAD", lib).env("FAKETIME", by);
    }
    c.args(["schedule", "jobs/tick", "--every", period, "--id", id, "--ttl", "2s", "--grace", "300ms"])
        .args(["--", "sh", "-c", &script])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .map(Proc)
        .unwrap()
}

/// The slot lines of the log: (holder, TENURE_SLOT, wall ns when it ran).
fn slots(log: &Path) -> Vec<(String, u64, u64)> {
    std::fs::read_to_string(log)
        .unwrap_or_default()
        .lines()
        .filter_map(|l| {
            let p: Vec<&str> = l.split(' ').collect();
            (p.first() == Some(&"slot")).then_some(())?;
            Some((p.get(1)?.to_string(), p.get(3)?.parse().ok()?, p.get(4)?.parse().ok()?))
        })
        .collect()
}

fn wall_secs() -> f64 {
    SystemTime::now().duration_since(UNIX_EPOCH).unwrap().as_secs_f64()
}

/// Sleeps until `offset` seconds past a multiple of `period` seconds (wall clock).
fn sleep_to_phase(period: f64, offset: f64) {
    let now = wall_secs();
    let mut at = (now / period).floor() * period + offset;
    if at <= now + 0.05 {
        at += period;
    }
    std::thread::sleep(Duration::from_secs_f64(at - now));
}

#[test]
fn a_slot_due_while_nobody_leads_runs_late_on_the_next_leader() {
    let env = Env::new();
    let mut a = scheduler(&env, "a", "4s", None);
    // a leads (it started alone); b follows.
    while slots(&env.log()).is_empty() {
        std::thread::sleep(Duration::from_millis(20));
    }
    let b = scheduler(&env, "b", "4s", None);
    // a dies half a second before a slot: nobody leads when it comes due (TTL 2 s).
    sleep_to_phase(4.0, 3.5);
    let killed = wall_secs();
    a.kill().unwrap();
    a.wait().unwrap();
    let missed = ((killed / 4.0).floor() as u64 + 1) * 4;
    let t0 = Instant::now();
    let late = loop {
        if let Some(s) = slots(&env.log()).into_iter().find(|s| s.1 == missed) {
            break s;
        }
        assert!(t0.elapsed() < Duration::from_secs(15), "the slot due during the takeover never ran");
        std::thread::sleep(Duration::from_millis(20));
    };
    assert_eq!(late.0, "b", "the next leader runs it");
    let late_by = late.2 as f64 / 1e9 - missed as f64;
    assert!(late_by > 0.5, "it ran late, {late_by:.2} s after its time, with TENURE_SLOT naming its time");
    std::thread::sleep(Duration::from_secs(1));
    drop(b);
    let all = slots(&env.log());
    let mut seen: Vec<u64> = all.iter().map(|s| s.1).collect();
    seen.sort();
    let n = seen.len();
    seen.dedup();
    assert_eq!(seen.len(), n, "a slot ran twice: {all:?}");
}

#[test]
fn no_slot_runs_twice_across_a_handover_to_a_replica_whose_clock_is_behind() {
    let Some(lib) = tenure_testkit::servers::libfaketime() else {
        tenure_testkit::servers::skip("libfaketime is not installed; install faketime");
        return;
    };
    let env = Env::new();
    let mut ahead = scheduler(&env, "ahead", "3s", None);
    while slots(&env.log()).is_empty() {
        std::thread::sleep(Duration::from_millis(20));
    }
    // The follower's clock is 2 s behind: when the leader stops just after a slot, that
    // slot is still 2 s away on the follower's clock.
    let behind = scheduler(&env, "behind", "3s", Some((&lib, "-2s")));
    std::thread::sleep(Duration::from_millis(1500));
    sleep_to_phase(3.0, 0.3);
    rustix::process::kill_process(
        rustix::process::Pid::from_raw(ahead.id() as i32).unwrap(),
        rustix::process::Signal::TERM,
    )
    .unwrap();
    ahead.wait().unwrap();
    std::thread::sleep(Duration::from_secs(7));
    drop(behind);
    let all = slots(&env.log());
    let holders: std::collections::BTreeSet<&str> = all.iter().map(|s| s.0.as_str()).collect();
    assert!(holders.contains("behind"), "the replica behind took over and ran slots: {all:?}");
    let mut seen: Vec<u64> = all.iter().map(|s| s.1).collect();
    let n = seen.len();
    seen.sort();
    seen.dedup();
    assert_eq!(seen.len(), n, "a slot ran twice: {all:?}");
    // And none was lost from the first to the last.
    let (first, last) = (seen[0], seen[seen.len() - 1]);
    assert_eq!(seen.len() as u64, (last - first) / 3 + 1, "a slot was lost: {all:?}");
}
