//! `tenure run` contains the whole process tree of its command, on every path: a
//! command that leaves its process group or session (`timeout`, `setsid`), workers that
//! ignore SIGTERM, a command that exits and leaves its children behind, `tenure run`
//! killed or frozen. And a store that refuses writes for a while (a Redis failover)
//! does not end the campaign.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

mod common;
use common::{Proc, tenure};

const TTL: Duration = Duration::from_secs(2);

fn wall_ns() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).unwrap().as_nanos() as u64
}

/// Whether `pid` is a running process: a zombie (dead, not yet reaped) does not count.
fn alive(pid: i32) -> bool {
    let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else { return false };
    let state = stat.rsplit_once(')').and_then(|(_, rest)| rest.split_whitespace().next());
    !matches!(state, None | Some("Z") | Some("X"))
}

fn signal(pid: u32, sig: rustix::process::Signal) {
    let _ = rustix::process::kill_process(rustix::process::Pid::from_raw(pid as i32).unwrap(), sig);
}

/// Waits for `path` to hold one pid per line, `n` of them.
fn wait_pids(path: &Path, n: usize) -> Vec<i32> {
    let t0 = Instant::now();
    loop {
        let pids: Vec<i32> =
            std::fs::read_to_string(path).unwrap_or_default().lines().filter_map(|l| l.trim().parse().ok()).collect();
        if pids.len() >= n {
            return pids;
        }
        assert!(t0.elapsed() < Duration::from_secs(20), "the command did not start its {n} processes");
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// Waits until none of `pids` runs; panics naming the survivors after `within`.
fn wait_dead(pids: &[i32], within: Duration) -> Duration {
    let t0 = Instant::now();
    loop {
        let left: Vec<i32> = pids.iter().copied().filter(|&p| alive(p)).collect();
        if left.is_empty() {
            return t0.elapsed();
        }
        assert!(t0.elapsed() < within, "processes {left:?} outlived tenure's term by more than {within:?}");
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// Kills whatever of `pids` is still alive when a test fails, so nothing is left behind.
struct Reap(PathBuf);
impl Drop for Reap {
    fn drop(&mut self) {
        for p in
            std::fs::read_to_string(&self.0).unwrap_or_default().lines().filter_map(|l| l.trim().parse::<i32>().ok())
        {
            // Every process still listed in /proc, those that look like zombies too: one
            // whose main thread has ended while another works is not dead (a test failing
            // on the planted zombie-is-dead leaves one), and SIGKILL ends all its threads.
            let state = std::fs::read_to_string(format!("/proc/{p}/stat")).ok();
            let gone = state.as_deref().and_then(|s| s.rsplit_once(')')).and_then(|(_, r)| r.split_whitespace().next());
            if state.is_some() && gone != Some("X") {
                signal(p as u32, rustix::process::Signal::KILL);
            }
        }
    }
}

struct Env {
    dir: tempfile::TempDir,
}

impl Env {
    fn new() -> Self {
        Self { dir: tempfile::tempdir().unwrap() }
    }
    fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }
    fn run(&self, store: &str, id: &str, script: &str) -> Proc {
        self.run_env(store, id, script, &[])
    }
    /// [`Env::run`] with `extra` added to its environment.
    fn run_env(&self, store: &str, id: &str, script: &str, extra: &[(&str, &str)]) -> Proc {
        Command::new(tenure())
            .envs(extra.iter().copied())
            .env("TENURE_STORE", store)
            .env("RUST_LOG", "warn")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .args(["run", "jobs/tree", "--id", id, "--ttl", "2s", "--grace", "300ms", "--", "sh", "-c", script])
            .spawn()
            .map(Proc)
            .unwrap()
    }
    /// `tenure ARGS…` on this test's SQLite store, quiet but for warnings.
    fn spawn(&self, args: &[&str]) -> Proc {
        Command::new(tenure())
            .env("TENURE_STORE", self.sqlite())
            .env("RUST_LOG", "warn")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .args(args)
            .spawn()
            .map(Proc)
            .unwrap()
    }
    /// `tenure run` on SQLite with TTL `ttl` and its temporary files in `tmp`; what it and
    /// its supervisor say goes to the file `stderr`.
    fn run_in(&self, tmp: &Path, ttl: &str, script: &str) -> Proc {
        Command::new(tenure())
            .env("TENURE_STORE", self.sqlite())
            .env("TMPDIR", tmp)
            .env("RUST_LOG", "warn")
            .stdin(Stdio::null())
            .stderr(std::fs::File::create(self.path("stderr")).unwrap())
            .args(["run", "jobs/tmp", "--ttl", ttl, "--grace", "300ms", "--", "sh", "-c", script])
            .spawn()
            .map(Proc)
            .unwrap()
    }
    fn sqlite(&self) -> String {
        format!("sqlite:{}", self.path("t.db").display())
    }
}

/// A process that records its pid in PIDS and then works (appends to LOG) forever,
/// ignoring SIGTERM when `stubborn`.
fn worker(pids: &Path, log: &Path, stubborn: bool) -> String {
    let trap = if stubborn { "trap '' TERM; " } else { "" };
    format!(
        "{trap}echo $$ >> {pids}; while :; do echo $(date +%s%N) >> {log}; sleep 0.05; done",
        pids = pids.display(),
        log = log.display()
    )
}

/// `tenure run ELECTION -- sleep SECS` as candidate `a`, with `health` as its health check
/// every 200 ms and `extra` added to its environment.
fn with_health_check(env: &Env, election: &str, health: &str, secs: &str, extra: &[(&str, &str)]) -> Proc {
    Command::new(tenure())
        .envs(extra.iter().copied())
        .env("TENURE_STORE", env.sqlite())
        .env("RUST_LOG", "warn")
        .stdin(Stdio::null())
        .args(["run", election, "--id", "a", "--ttl", "2s", "--grace", "300ms"])
        .args(["--health-cmd", health, "--health-interval", "200ms", "--health-timeout", "10s"])
        .args(["--", "sleep", secs])
        .spawn()
        .map(Proc)
        .unwrap()
}

/// The instant (ns) a standby's command wrote to `next` when it started, waited for until
/// `until`.
fn first_start(next: &Path, until: Instant) -> u64 {
    loop {
        if let Some(t) = std::fs::read_to_string(next).ok().and_then(|t| t.trim().parse().ok()) {
            return t;
        }
        assert!(Instant::now() < until, "the standby did not take over");
        std::thread::sleep(Duration::from_millis(10));
    }
}

fn sh_quote(s: &str) -> String {
    format!("'{}'", s.replace('\'', r"'\''"))
}

#[test]
fn a_killed_tenure_run_takes_processes_in_other_groups_and_sessions_with_it() {
    let env = Env::new();
    let (pids, log) = (env.path("pids"), env.path("log"));
    let _reap = Reap(pids.clone());
    let w = sh_quote(&worker(&pids, &log, true));
    // `timeout` moves into a process group of its own; `setsid` into a new session.
    let script = format!("timeout 600 sh -c {w} & setsid sh -c {w} & sh -c {w} & wait");
    let mut leader = env.run(&env.sqlite(), "a", &script);
    let started = wait_pids(&pids, 3);
    signal(leader.id(), rustix::process::Signal::KILL);
    leader.wait().unwrap();
    // Nobody renews any more: every process must be gone well before the lease runs out.
    wait_dead(&started, TTL / 2);
}

#[test]
fn a_killed_tenure_run_leaves_nothing_in_the_temporary_directory() {
    let env = Env::new();
    let tmp = env.path("tmp");
    std::fs::create_dir(&tmp).unwrap();
    let (pids, log) = (env.path("pids"), env.path("log"));
    let _reap = Reap(pids.clone());
    let mut leader = env.run_in(&tmp, "2s", &worker(&pids, &log, false));
    let started = wait_pids(&pids, 1);
    assert_eq!(std::fs::read_dir(&tmp).unwrap().count(), 1, "tenure run keeps its deadline file there");
    signal(leader.id(), rustix::process::Signal::KILL);
    leader.wait().unwrap();
    wait_dead(&started, TTL);
    let t0 = Instant::now();
    while std::fs::read_dir(&tmp).unwrap().count() > 0 {
        assert!(t0.elapsed() < TTL, "left behind: {:?}", std::fs::read_dir(&tmp).unwrap().collect::<Vec<_>>());
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// The cgroup (its directory) that process `pid` is in, below `parent`, this test
/// process's own.
fn cgroup_of(pid: i32, parent: &Path) -> PathBuf {
    let name = |text: &str| text.lines().find_map(|l| l.strip_prefix("0::")).unwrap().to_string();
    let ours = name(&std::fs::read_to_string("/proc/self/cgroup").unwrap());
    let theirs = name(&std::fs::read_to_string(format!("/proc/{pid}/cgroup")).unwrap());
    let below = theirs.strip_prefix(ours.trim_end_matches('/')).and_then(|r| r.strip_prefix('/')).unwrap_or("");
    assert!(below.starts_with("tenure-run-"), "process {pid} runs in {theirs}, not in a cgroup of its own in {ours}");
    parent.join(below)
}

#[test]
fn a_killed_supervisor_leaves_no_process_and_no_cgroup_behind() {
    let Some(cgroups) = tenure_testkit::servers::cgroups_can_be_made() else {
        tenure_testkit::servers::skip("this host lets this user make no cgroup (version 2) inside its own");
        return;
    };
    let env = Env::new();
    let (pids, log, sup) = (env.path("pids"), env.path("log"), env.path("supervisor"));
    let _reap = Reap(pids.clone());
    let w = sh_quote(&worker(&pids, &log, true));
    let script = format!("echo $PPID > {}; setsid sh -c {w} & sh -c {w} & wait", sup.display());
    let mut leader = env.run_env(&env.sqlite(), "a", &script, &[("TENURE_CGROUP", "on")]);
    let started = wait_pids(&pids, 2);
    let cg = cgroup_of(started[0], &cgroups);
    assert!(cg.is_dir());
    let supervisor: u32 = std::fs::read_to_string(&sup).unwrap().trim().parse().unwrap();
    signal(supervisor, rustix::process::Signal::KILL);
    leader.wait().unwrap();
    for p in &started {
        assert!(!alive(*p), "process {p} outlived its killed supervisor and tenure run");
    }
    assert!(!cg.exists(), "the command's cgroup {} was left behind", cg.display());
}

/// Starts a 10 s term whose command works, does `spoil` to its supervisor's directory
/// (with `tenure run` frozen while it does), and returns how long the command then ran on
/// and what tenure said.
fn spoil_the_deadline(spoil: impl FnOnce(&Path)) -> (Duration, String) {
    let env = Env::new();
    let tmp = env.path("tmp");
    std::fs::create_dir(&tmp).unwrap();
    let (pids, log) = (env.path("pids"), env.path("log"));
    let _reap = Reap(pids.clone());
    let mut leader = env.run_in(&tmp, "10s", &worker(&pids, &log, false));
    let started = wait_pids(&pids, 1);
    let dir = std::fs::read_dir(&tmp).unwrap().next().unwrap().unwrap().path();
    signal(leader.id(), rustix::process::Signal::STOP);
    spoil(&dir);
    let took = wait_dead(&started[..1], Duration::from_secs(3));
    signal(leader.id(), rustix::process::Signal::CONT);
    signal(leader.id(), rustix::process::Signal::TERM);
    leader.wait().unwrap();
    (took, std::fs::read_to_string(env.path("stderr")).unwrap())
}

#[test]
fn the_supervisor_stops_the_command_when_its_deadline_cannot_be_read() {
    // Fail closed: no readable deadline means the deadline has passed.
    let (took, said) = spoil_the_deadline(|dir| std::fs::remove_file(dir.join("deadline")).unwrap());
    assert!(took < Duration::from_secs(1), "stopped {took:?} after the deadline became unreadable");
    assert!(said.contains("the deadline file cannot be believed") && said.contains("No such file"), "{said}");
}

#[test]
fn a_deadline_file_others_could_write_is_not_believed() {
    // Another local user who could write the deadline file would move the deadline out:
    // the supervisor believes only a file of its user's that nobody else may write.
    use std::os::unix::fs::PermissionsExt;
    let (took, said) = spoil_the_deadline(|dir| {
        let forged = dir.join("forged");
        std::fs::write(&forged, u64::MAX.to_string()).unwrap();
        std::fs::set_permissions(&forged, std::fs::Permissions::from_mode(0o666)).unwrap();
        std::fs::rename(&forged, dir.join("deadline")).unwrap();
    });
    assert!(took < Duration::from_secs(1), "stopped {took:?} after the deadline file became one anyone may write");
    // The cause is named: not a lease that was not renewed, but a file not to be believed.
    assert!(said.contains("is not a file of this user's that only it may write"), "{said}");
    assert!(!said.contains("not renewed in time"), "{said}");
}

#[test]
fn the_files_tenure_makes_are_its_users_alone_whatever_the_umask() {
    use std::os::unix::fs::PermissionsExt;
    let env = Env::new();
    let (tmp, state) = (env.path("tmp"), env.path("state"));
    std::fs::create_dir(&tmp).unwrap();
    let (pids, log) = (env.path("pids"), env.path("log"));
    let _reap = Reap(pids.clone());
    let mut leader = Command::new("sh")
        .args(["-c", r#"umask 000; exec "$0" "$@""#, tenure()])
        .args(["run", "jobs/modes", "--ttl", "10s", "--metadata", "m", "--", "sh", "-c", &worker(&pids, &log, false)])
        .env_remove("TENURE_STORE")
        .env("XDG_STATE_HOME", &state)
        .env("TMPDIR", &tmp)
        .env("RUST_LOG", "warn")
        .stdin(Stdio::null())
        .spawn()
        .map(Proc)
        .unwrap();
    wait_pids(&pids, 1);
    let mode = |p: &Path| std::fs::symlink_metadata(p).unwrap().permissions().mode() & 0o777;
    let supervisor_dir = std::fs::read_dir(&tmp).unwrap().next().unwrap().unwrap().path();
    let mut files: Vec<PathBuf> = std::fs::read_dir(&supervisor_dir).unwrap().map(|e| e.unwrap().path()).collect();
    files.extend(std::fs::read_dir(state.join("tenure")).unwrap().map(|e| e.unwrap().path()));
    let dirs = (mode(&state.join("tenure")), mode(&supervisor_dir));
    let modes: Vec<(PathBuf, Option<u32>)> = files
        .into_iter()
        .map(|f| {
            let m = std::fs::symlink_metadata(&f).ok().map(|m| m.permissions().mode() & 0o777);
            (f, m)
        })
        .collect();
    signal(leader.id(), rustix::process::Signal::TERM);
    leader.wait().unwrap();
    assert_eq!(dirs, (0o700, 0o700), "the state directory and the supervisor's");
    assert!(modes.iter().any(|(f, _)| f.ends_with("tenure.db")) && modes.iter().any(|(f, _)| f.ends_with("deadline")));
    for (f, m) in &modes {
        if let Some(m) = m {
            assert_eq!(*m, 0o600, "{} takes the umask", f.display());
        }
    }
}

#[test]
fn a_frozen_tenure_run_stops_workers_that_ignore_sigterm_before_the_deadline() {
    let env = Env::new();
    let (pids, log) = (env.path("pids"), env.path("log"));
    let _reap = Reap(pids.clone());
    let w = sh_quote(&worker(&pids, &log, true));
    // The command itself exits on SIGTERM; its workers ignore it, one in a new session.
    let script = format!("sh -c {w} & setsid sh -c {w} & echo $$ >> {}; wait", pids.display());
    let mut leader = env.run(&env.sqlite(), "a", &script);
    let started = wait_pids(&pids, 3);
    // The term began before the first process started; freeze `tenure run` at once.
    let frozen_at = wall_ns();
    signal(leader.id(), rustix::process::Signal::STOP);
    let took = wait_dead(&started, TTL * 2);
    let last_work = std::fs::read_to_string(&log).unwrap().lines().filter_map(|l| l.parse::<u64>().ok()).max().unwrap();
    assert!(
        last_work < frozen_at + TTL.as_nanos() as u64,
        "a worker was still working {} ms after tenure froze, with a {TTL:?} lease",
        (last_work - frozen_at) / 1_000_000
    );
    assert!(took < TTL, "the tree was stopped {took:?} after the freeze, past the lease");
    signal(leader.id(), rustix::process::Signal::KILL);
    signal(leader.id(), rustix::process::Signal::CONT);
    leader.wait().unwrap();
}

#[test]
fn a_command_that_exits_leaves_nothing_behind_and_its_code_is_kept() {
    let env = Env::new();
    let (pids, log) = (env.path("pids"), env.path("log"));
    let _reap = Reap(pids.clone());
    let w = sh_quote(&worker(&pids, &log, true));
    let script = format!(
        "setsid sh -c {w} & sh -c {w} & while [ \"$(cat {p} 2>/dev/null | wc -l)\" -lt 2 ]; do sleep 0.01; done; exit 3",
        p = pids.display()
    );
    let mut leader = env.run(&env.sqlite(), "a", &script);
    let status = leader.wait().unwrap();
    assert_eq!(status.code(), Some(3), "the command's exit code is tenure run's");
    let started = wait_pids(&pids, 2);
    // `tenure run` returned (and released the lease) only after its tree was gone.
    for p in &started {
        assert!(!alive(*p), "process {p} outlived the command and tenure run");
    }
}

#[test]
fn the_processes_of_a_killed_supervisor_are_stopped_before_tenure_run_lets_go() {
    // The supervisor itself is killed (the OOM killer, an operator's `kill -9`): its
    // command and every process under it are re-parented to `tenure run`, which must stop
    // them all before it releases the lease, or they would work on beside the next leader.
    // Found through /proc, as on a host that gives the command no cgroup.
    let env = Env::new();
    let (pids, log, sup, next) = (env.path("pids"), env.path("log"), env.path("supervisor"), env.path("next"));
    let _reap = Reap(pids.clone());
    let w = sh_quote(&worker(&pids, &log, true));
    let script = format!(
        "echo $PPID > {sup}; echo $$ >> {p}; setsid sh -c {w} & sh -c {w} & wait",
        sup = sup.display(),
        p = pids.display()
    );
    let mut leader = env.run_env(&env.sqlite(), "a", &script, &[("TENURE_CGROUP", "off")]);
    let started = wait_pids(&pids, 3);
    // A standby, whose command notes when it starts: the next term's work.
    let _standby = env.run(&env.sqlite(), "b", &format!("date +%s%N > {}; sleep 600", next.display()));
    std::thread::sleep(Duration::from_millis(300));
    let supervisor: u32 = std::fs::read_to_string(&sup).unwrap().trim().parse().unwrap();
    signal(supervisor, rustix::process::Signal::KILL);
    let t0 = Instant::now();
    let status = loop {
        if let Some(status) = leader.0.try_wait().unwrap() {
            break status;
        }
        assert!(t0.elapsed() < TTL * 5, "tenure run did not end after its supervisor was killed");
        std::thread::sleep(Duration::from_millis(10));
    };
    assert_eq!(status.code(), Some(137), "the supervisor's death is the command's end, as a shell reports it");
    for p in &started {
        assert!(!alive(*p), "process {p} outlived its killed supervisor and tenure run");
    }
    let next_started = first_start(&next, t0 + TTL * 5);
    let last_work = last_work(&log);
    assert_ne!(last_work, 0, "the workers logged no work");
    assert!(
        last_work < next_started,
        "the killed supervisor's workers still worked after the next term's command started"
    );
}

#[test]
fn what_a_health_check_left_running_is_stopped_before_the_next_leader_starts() {
    // A health check is a child of `tenure run`, not of the supervisor: a process it leaves
    // in a session of its own comes to `tenure run` (a subreaper) when the check ends, and
    // with no cgroup to kill it by, only the look for orphans at the end of the term stops
    // it before the release. The command itself ends cleanly, its supervisor with it.
    let env = Env::new();
    let (pids, log, mark, next) = (env.path("pids"), env.path("log"), env.path("mark"), env.path("next"));
    let _reap = Reap(pids.clone());
    let w = sh_quote(&worker(&pids, &log, true));
    let health = format!("[ -e {m} ] || {{ touch {m}; (setsid sh -c {w} &); sleep 0.3; }}; true", m = mark.display());
    let mut leader = with_health_check(&env, "jobs/tree", &health, "3", &[("TENURE_CGROUP", "off")]);
    let started = wait_pids(&pids, 1);
    let _standby = env.run(&env.sqlite(), "b", &format!("date +%s%N > {}; sleep 600", next.display()));
    let t0 = Instant::now();
    let next_started = first_start(&next, t0 + TTL * 10);
    let status = leader.0.wait().unwrap();
    assert_eq!(status.code(), Some(0), "the command ended on its own");
    for p in &started {
        assert!(!alive(*p), "process {p}, left by a health check, outlived the term");
    }
    let last_work = last_work(&log);
    assert_ne!(last_work, 0, "the workers logged no work");
    assert!(last_work < next_started, "what the health check left still worked after the next term's command started");
}

#[test]
fn a_redis_failover_does_not_end_the_campaign() {
    let Some(server) = tenure_testkit::servers::launch(tenure_testkit::servers::Kind::Redis) else { return };
    let env = Env::new();
    let log = env.path("log");
    let script = format!("echo $TENURE_TOKEN $(date +%s%N) >> {}; exec sleep 600", log.display());
    let store = server.url();
    let mut a = env.run(&store, "a", &script);
    let mut b = env.run(&store, "b", &script);
    let t0 = Instant::now();
    while std::fs::read_to_string(&log).unwrap_or_default().lines().count() < 1 {
        assert!(t0.elapsed() < Duration::from_secs(20), "nobody led");
        std::thread::sleep(Duration::from_millis(10));
    }
    // What a failover does to the old primary: it becomes a replica and refuses writes.
    let cli = |args: &[&str]| {
        let client = redis::Client::open(store.as_str()).unwrap();
        let mut c = client.get_connection().unwrap();
        let mut cmd = redis::cmd(args[0]);
        for x in &args[1..] {
            cmd.arg(*x);
        }
        let _: redis::Value = cmd.query(&mut c).unwrap();
    };
    cli(&["REPLICAOF", "127.0.0.1", "1"]);
    std::thread::sleep(TTL * 2);
    for p in [&mut a, &mut b] {
        assert!(p.try_wait().unwrap().is_none(), "tenure run gave up during the failover");
    }
    let before = std::fs::read_to_string(&log).unwrap().lines().count();
    cli(&["REPLICAOF", "NO", "ONE"]);
    // Once writes are taken again, somebody leads again within a TTL and a few retries.
    let t0 = Instant::now();
    while std::fs::read_to_string(&log).unwrap().lines().count() <= before {
        assert!(t0.elapsed() < TTL * 3, "nobody led within {:?} after the failover ended", TTL * 3);
        for p in [&mut a, &mut b] {
            assert!(p.try_wait().unwrap().is_none(), "tenure run exited after the failover");
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

#[test]
fn a_short_ttl_needs_no_grace_flag_and_its_command_stops_before_the_deadline() {
    let env = Env::new();
    let (pids, log) = (env.path("pids"), env.path("log"));
    let _reap = Reap(pids.clone());
    let ttl = Duration::from_secs(3);
    let mut leader = Command::new(tenure())
        .env("TENURE_STORE", env.sqlite())
        .env("RUST_LOG", "warn")
        .stdin(Stdio::null())
        .args(["run", "jobs/short", "--ttl", "3s", "--", "sh", "-c", &worker(&pids, &log, false)])
        .spawn()
        .map(Proc)
        .unwrap();
    let started = wait_pids(&pids, 1);
    // Frozen right after the start: the supervisor must stop the command within the TTL.
    signal(leader.id(), rustix::process::Signal::STOP);
    let took = wait_dead(&started, ttl * 2);
    assert!(took < ttl, "the command ran {took:?} after tenure froze, with a {ttl:?} lease");
    signal(leader.id(), rustix::process::Signal::KILL);
    signal(leader.id(), rustix::process::Signal::CONT);
    leader.wait().unwrap();
}

#[test]
fn a_leader_whose_health_check_fails_stands_aside_and_another_leads() {
    // The store is fine, but the leader's command is stuck: its health check fails. The
    // leader stops its command, resigns and stands aside; the other replica leads.
    let env = Env::new();
    let log = env.path("log");
    let sick = env.path("sick");
    let script = format!("echo start ${{TENURE_HOLDER%.*}} $(date +%s%N) >> {}; exec sleep 600", log.display());
    let health = format!("test ! -e {}-${{TENURE_HOLDER%.*}}", sick.display());
    let spawn = |id: &str| {
        Command::new(tenure())
            .env("TENURE_STORE", env.sqlite())
            .env("RUST_LOG", "warn")
            .stdin(Stdio::null())
            .args(["run", "jobs/health", "--id", id, "--ttl", "2s", "--grace", "300ms"])
            .args(["--health-cmd", &health, "--health-interval", "200ms", "--health-timeout", "1s"])
            .args(["--health-retries", "2", "--", "sh", "-c", &script])
            .spawn()
            .map(Proc)
            .unwrap()
    };
    let starts = || -> Vec<(String, u64)> {
        std::fs::read_to_string(&log)
            .unwrap_or_default()
            .lines()
            .filter_map(|l| {
                let f: Vec<&str> = l.split(' ').collect();
                Some((f.get(1)?.to_string(), f.get(2)?.parse().ok()?))
            })
            .collect()
    };
    let mut a = spawn("a");
    let t0 = Instant::now();
    while starts().is_empty() {
        assert!(t0.elapsed() < Duration::from_secs(20), "nobody led");
        std::thread::sleep(Duration::from_millis(10));
    }
    let mut b = spawn("b");
    std::thread::sleep(Duration::from_millis(1000));
    assert_eq!(starts().len(), 1, "a healthy leader keeps leading: {:?}", starts());
    // a's command gets stuck.
    std::fs::write(format!("{}-a", sick.display()), "").unwrap();
    let sick_at = wall_ns();
    let t0 = Instant::now();
    while starts().len() < 2 {
        // a renews all along, so only its standing aside lets b in.
        assert!(t0.elapsed() < Duration::from_secs(10), "b did not take over from an unhealthy a: {:?}", starts());
        std::thread::sleep(Duration::from_millis(10));
    }
    let (who, at) = starts()[1].clone();
    assert_eq!(who, "b");
    eprintln!("b led {:?} after a fell sick", Duration::from_nanos(at.saturating_sub(sick_at)));
    // a stands aside for a TTL, then campaigns on: it is still running, following b.
    std::thread::sleep(Duration::from_millis(2500));
    assert_eq!(starts().len(), 2, "{:?}", starts());
    for p in [&mut a, &mut b] {
        assert!(p.0.try_wait().unwrap().is_none(), "tenure run exited");
    }
}

#[test]
fn a_health_check_and_what_it_started_end_with_a_killed_tenure_run() {
    // A health check runs within the term, with its token: it and whatever it started (in
    // its group, or in a session of its own) must not work on past the term.
    let Some(_) = tenure_testkit::servers::cgroups_can_be_made() else {
        tenure_testkit::servers::skip("this host lets this user make no cgroup (version 2) inside its own");
        return;
    };
    let env = Env::new();
    let (pids, log, mark) = (env.path("pids"), env.path("log"), env.path("mark"));
    let _reap = Reap(pids.clone());
    let w = sh_quote(&worker(&pids, &log, true));
    let health = format!("[ -e {m} ] || {{ touch {m}; sh -c {w} & setsid sh -c {w} & }}; sleep 5", m = mark.display());
    let mut leader = with_health_check(&env, "jobs/health", &health, "600", &[]);
    wait_pids(&pids, 2);
    std::thread::sleep(Duration::from_millis(300));
    let pid = leader.id();
    disable_and_check_work_stops(&mut leader, &log, "tenure run was killed", &[], || {
        signal(pid, rustix::process::Signal::KILL)
    });
}

#[test]
fn an_on_stepped_down_hook_and_what_it_started_end_with_a_killed_campaign() {
    // The hook belongs to the term that is ending: it and whatever it started (in its
    // group, or in a session of its own) must not work on once `tenure campaign` is gone,
    // for the next leader's on-elected hook may then already run.
    let env = Env::new();
    let (pids, log) = (env.path("pids"), env.path("log"));
    let _reap = Reap(pids.clone());
    let w = sh_quote(&worker(&pids, &log, true));
    let hook = format!("sh -c {w} & setsid sh -c {w} & wait");
    let mut leader = env.spawn(&[
        "campaign",
        "api/writer",
        "--id",
        "a",
        "--ttl",
        "10s",
        "--grace",
        "4s",
        "--on-stepped-down",
        &hook,
    ]);
    // Elected (it leads at once, alone), then told to stop: the hook starts its workers.
    wait_until_elected(&env, &mut leader);
    signal(leader.id(), rustix::process::Signal::TERM);
    wait_pids(&pids, 2);
    std::thread::sleep(Duration::from_millis(300));
    let pid = leader.id();
    disable_and_check_work_stops(&mut leader, &log, "tenure campaign was killed", &[], || {
        signal(pid, rustix::process::Signal::KILL)
    });
}

#[test]
fn a_campaign_frozen_through_its_deadline_runs_its_stepped_down_hook_late_and_says_so() {
    // Frozen, `tenure campaign` could not step down before the deadline: when it wakes the
    // hook still runs (it undoes what the term did here), and the log says it comes late.
    let env = Env::new();
    let (ran, stderr) = (env.path("ran"), env.path("stderr"));
    let mut leader = Command::new(tenure())
        .env("TENURE_STORE", env.sqlite())
        .env("RUST_LOG", "warn")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&stderr).unwrap())
        .args(["campaign", "api/writer", "--id", "a", "--ttl", "2s", "--grace", "300ms"])
        .args(["--on-stepped-down", &format!("echo $TENURE_TOKEN >> {}", ran.display())])
        .spawn()
        .map(Proc)
        .unwrap();
    wait_until_elected(&env, &mut leader);
    signal(leader.id(), rustix::process::Signal::STOP);
    std::thread::sleep(TTL + Duration::from_secs(1));
    signal(leader.id(), rustix::process::Signal::CONT);
    let t0 = Instant::now();
    while !std::fs::exists(&ran).unwrap() {
        assert!(t0.elapsed() < Duration::from_secs(10), "the stepped-down hook did not run once the campaign woke");
        std::thread::sleep(Duration::from_millis(20));
    }
    signal(leader.id(), rustix::process::Signal::KILL);
    leader.wait().unwrap();
    let log = std::fs::read_to_string(&stderr).unwrap();
    assert!(log.contains("hook runs now, late"), "no warning that the hook ran late: {log}");
}

/// Waits until the `tenure campaign` `leader` (of `api/writer`) leads.
fn wait_until_elected(env: &Env, leader: &mut Proc) {
    let t0 = Instant::now();
    while !leads(env, "api/writer") {
        assert!(leader.try_wait().unwrap().is_none(), "tenure campaign exited");
        assert!(t0.elapsed() < Duration::from_secs(20), "the campaign was not elected");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Whether `election` has a holder, as `tenure status` shows it.
fn leads(env: &Env, election: &str) -> bool {
    let out =
        Command::new(tenure()).env("TENURE_STORE", env.sqlite()).args(["status", election, "--json"]).output().unwrap();
    let status: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap_or_default();
    status["leader"]["holder"].is_string()
}

#[test]
fn no_health_check_of_a_term_starts_once_tenure_run_wakes_past_its_deadline() {
    // Frozen through its deadline, `tenure run` wakes with its check long due: the term is
    // over (the supervisor stopped the command), and a check started now would act with
    // that term's token. Three times: the wake-up is a race between the check's timer
    // and the term's end (seen lost 5 times in 12 by an outside test on a loaded host,
    // never here; the check before each start closes it whatever the order).
    let env = Env::new();
    let checks = env.path("checks");
    let health = format!("echo $TENURE_TOKEN $(date +%s%N) >> {}", checks.display());
    let args = ["run", "jobs/health", "--id", "a", "--ttl", "2s", "--grace", "300ms", "--health-interval", "100ms"];
    let mut leader = env.spawn(&[&args[..], &["--health-cmd", &health, "--", "sleep", "600"]].concat());
    let lines = || -> Vec<(u64, u64)> {
        std::fs::read_to_string(&checks)
            .unwrap_or_default()
            .lines()
            .filter_map(|l| l.split_once(' ').and_then(|(t, at)| Some((t.parse().ok()?, at.parse().ok()?))))
            .collect()
    };
    let mut late = Vec::new();
    for _ in 0..3 {
        // A check of the term of the moment has run.
        let since = wall_ns();
        let t0 = Instant::now();
        let token = loop {
            if let Some((token, _)) = lines().into_iter().find(|(_, at)| *at > since) {
                break token;
            }
            assert!(leader.try_wait().unwrap().is_none(), "tenure run exited");
            assert!(t0.elapsed() < Duration::from_secs(20), "no health check ran");
            std::thread::sleep(Duration::from_millis(20));
        };
        signal(leader.id(), rustix::process::Signal::STOP);
        std::thread::sleep(TTL + Duration::from_secs(1));
        let woke = wall_ns();
        signal(leader.id(), rustix::process::Signal::CONT);
        std::thread::sleep(Duration::from_millis(500));
        late.extend(
            lines().into_iter().filter(|(t, at)| *t == token && *at >= woke).map(|(_, at)| (at - woke) / 1_000_000),
        );
    }
    assert!(late.is_empty(), "checks of a term that had ended started {late:?} ms after tenure run woke");
}

#[test]
fn status_shows_the_health_an_announcing_leader_last_found() {
    let env = Env::new();
    let sick = env.path("sick");
    let health = format!("test ! -e {}", sick.display());
    let _leader = Command::new(tenure())
        .env("TENURE_STORE", env.sqlite())
        .env("RUST_LOG", "warn")
        .stdin(Stdio::null())
        .args(["run", "jobs/health", "--id", "a", "--ttl", "2s", "--grace", "300ms", "--announce"])
        .args(["--health-cmd", &health, "--health-interval", "200ms", "--health-retries", "1000"])
        .args(["--", "sleep", "600"])
        .spawn()
        .map(Proc)
        .unwrap();
    let status = || {
        let out =
            Command::new(tenure()).env("TENURE_STORE", env.sqlite()).args(["status", "jobs/health"]).output().unwrap();
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    let wait_for = |what: &str| {
        let t0 = Instant::now();
        loop {
            let s = status();
            if s.lines().any(|l| l.starts_with("health") && l.contains(what)) {
                return;
            }
            assert!(t0.elapsed() < Duration::from_secs(20), "status never showed health {what}: {s}");
            std::thread::sleep(Duration::from_millis(50));
        }
    };
    wait_for("passing");
    std::fs::write(&sick, "").unwrap();
    wait_for("failing");
    std::fs::remove_file(&sick).unwrap();
    wait_for("passing");
}

/// The latest instant LOG records work at (ns since the epoch).
fn last_work(log: &Path) -> u64 {
    std::fs::read_to_string(log).unwrap_or_default().lines().filter_map(|l| l.parse::<u64>().ok()).max().unwrap_or(0)
}

/// Freezes `leader` once LOG shows work, waits two TTLs, and asserts that nothing worked
/// past the lease deadline (counted from the freeze, which is after the last renewal).
fn freeze_and_check_work_stops(leader: &mut Proc, log: &Path) {
    let t0 = Instant::now();
    while last_work(log) == 0 {
        assert!(t0.elapsed() < Duration::from_secs(20), "the command did not start working");
        std::thread::sleep(Duration::from_millis(10));
    }
    let pid = leader.id();
    disable_and_check_work_stops(leader, log, "tenure froze", &[], || signal(pid, rustix::process::Signal::STOP));
}

/// Does `disable`, waits two TTLs, and checks the command's tree (logging to `log`)
/// stopped working within one TTL of it; then kills `leader` and `others` for good.
fn disable_and_check_work_stops(leader: &mut Proc, log: &Path, what: &str, others: &[u32], disable: impl FnOnce()) {
    let disabled_at = wall_ns();
    disable();
    std::thread::sleep(TTL * 2);
    let last = last_work(log);
    for p in others {
        signal(*p, rustix::process::Signal::KILL);
    }
    signal(leader.id(), rustix::process::Signal::KILL);
    signal(leader.id(), rustix::process::Signal::CONT);
    leader.wait().unwrap();
    assert!(
        last < disabled_at + TTL.as_nanos() as u64,
        "the command's tree was still working {} ms after {what}, with a {TTL:?} lease",
        (last - disabled_at) / 1_000_000
    );
}

#[test]
fn a_frozen_tenure_run_stops_a_process_whose_main_thread_has_ended() {
    // A process whose main thread exits while another thread works shows as a zombie in
    // /proc; it is not one, and it must be stopped like any other.
    let env = Env::new();
    let (pids, log) = (env.path("pids"), env.path("log"));
    let _reap = Reap(pids.clone());
    let py = format!(
        "import ctypes, os, threading, time\n\
         os.setsid()\n\
         open({pids:?}, 'a').write(f'{{os.getpid()}}\\n')\n\
         def work():\n    \
           while True:\n        \
             open({log:?}, 'a').write(f'{{time.time_ns()}}\\n')\n        \
             time.sleep(0.05)\n\
         threading.Thread(target=work).start()\n\
         ctypes.CDLL(None).pthread_exit(None)\n",
        pids = pids.display().to_string(),
        log = log.display().to_string()
    );
    let script = format!("python3 -c {} & wait", sh_quote(&py));
    let mut leader = env.run(&env.sqlite(), "a", &script);
    wait_pids(&pids, 1);
    freeze_and_check_work_stops(&mut leader, &log);
}

#[test]
fn a_command_that_stops_its_own_process_group_does_not_stop_the_supervisor() {
    // `kill -STOP 0` (or a read from the terminal, SIGTTIN) stops the command's process
    // group; the supervisor, in a group of its own, still stops the tree at the deadline.
    let env = Env::new();
    let (pids, log) = (env.path("pids"), env.path("log"));
    let _reap = Reap(pids.clone());
    let w = sh_quote(&worker(&pids, &log, true));
    let script = format!("setsid sh -c {w} & sleep 0.2; kill -STOP 0; wait");
    let mut leader = env.run(&env.sqlite(), "a", &script);
    wait_pids(&pids, 1);
    freeze_and_check_work_stops(&mut leader, &log);
}

#[test]
fn the_supervisor_does_not_start_a_command_whose_term_has_run_out() {
    // `tenure run` decided to start the command, then stalled until the instant its
    // supervisor must stop it had passed: the supervisor does not start it at all.
    let env = Env::new();
    let dir = env.path("tenure-run-x");
    std::fs::create_dir(&dir).unwrap();
    let deadline = dir.join("deadline");
    std::fs::write(&deadline, "1").unwrap();
    let ran = env.path("ran");
    let out = Command::new(tenure())
        .arg("__child")
        .arg(std::process::id().to_string())
        .arg(&deadline)
        .arg("300")
        .args(["--", "touch"])
        .arg(&ran)
        .output()
        .unwrap();
    assert!(!ran.exists(), "the command ran on a term that had run out");
    assert_eq!(out.status.code(), Some(125), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(dir.join("deadline.stopped").exists() || deadline.with_extension("stopped").exists());
}

#[test]
fn no_process_of_the_command_can_gain_privileges() {
    // A setuid program (sudo) in the tree would be beyond the supervisor's signals.
    let env = Env::new();
    let out = env.path("status");
    let script = format!("grep NoNewPrivs /proc/self/status > {}", out.display());
    let mut leader = env.run(&env.sqlite(), "a", &script);
    assert_eq!(leader.wait().unwrap().code(), Some(0));
    let status = std::fs::read_to_string(&out).unwrap();
    assert_eq!(status.split_whitespace().collect::<Vec<_>>(), ["NoNewPrivs:", "1"]);
}

#[test]
fn a_command_that_exits_while_tenure_is_frozen_leaves_no_worker_running() {
    // The command starts a worker in a new session and exits while `tenure run` is
    // frozen: the supervisor must stay and stop the worker, not return with the command.
    let env = Env::new();
    let (pids, log) = (env.path("pids"), env.path("log"));
    let _reap = Reap(pids.clone());
    let w = sh_quote(&worker(&pids, &log, true));
    let script = format!("setsid sh -c {w} & sleep 0.3; exit 0");
    let mut leader = env.run(&env.sqlite(), "a", &script);
    wait_pids(&pids, 1);
    freeze_and_check_work_stops(&mut leader, &log);
}

#[test]
fn a_tenure_run_whose_binary_is_replaced_starts_its_command_again_in_the_next_term() {
    // A package upgrade replaces the tenure binary while `tenure run` leads. The next term
    // (here after an eviction) must still start the command, not end the campaign.
    let env = Env::new();
    let copy = env.path("tenure");
    std::fs::copy(tenure(), &copy).unwrap();
    let log = env.path("log");
    let script = format!("echo start >> {}; exec sleep 600", log.display());
    let mut a = Command::new(&copy)
        .env("TENURE_STORE", env.sqlite())
        .env("RUST_LOG", "warn")
        .stdin(Stdio::null())
        .args(["run", "jobs/upgrade", "--ttl", "2s", "--grace", "300ms", "--", "sh", "-c", &script])
        .spawn()
        .map(Proc)
        .unwrap();
    let starts = || std::fs::read_to_string(&log).unwrap_or_default().lines().count();
    let t0 = Instant::now();
    while starts() == 0 {
        assert!(t0.elapsed() < Duration::from_secs(20), "nobody led");
        std::thread::sleep(Duration::from_millis(10));
    }
    // The upgrade: the file is removed and a new one written in its place.
    std::fs::remove_file(&copy).unwrap();
    std::fs::copy(tenure(), &copy).unwrap();
    let out = Command::new(tenure())
        .env("TENURE_STORE", env.sqlite())
        .args(["evict", "jobs/upgrade", "--yes"])
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let t0 = Instant::now();
    while starts() < 2 {
        if let Some(status) = a.0.try_wait().unwrap() {
            panic!("tenure run exited ({status}) instead of starting its command again");
        }
        assert!(t0.elapsed() < Duration::from_secs(15), "the command was not started again");
        std::thread::sleep(Duration::from_millis(20));
    }
    assert!(a.0.try_wait().unwrap().is_none(), "tenure run exited");
}

/// The processes whose parent is `parent`.
fn children_of(parent: u32) -> Vec<u32> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir("/proc").unwrap().flatten() {
        let Some(pid) = entry.file_name().to_str().and_then(|n| n.parse::<u32>().ok()) else { continue };
        let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else { continue };
        let ppid = stat.rsplit_once(')').and_then(|(_, rest)| rest.split_whitespace().nth(1)?.parse::<u32>().ok());
        if ppid == Some(parent) {
            out.push(pid);
        }
    }
    out
}

/// The supervisors `tenure run` (process `parent`) has started: its live children
/// `tenure __child …`, and whether each is a standby (`--standby`).
fn supervisors_of(parent: u32) -> Vec<(u32, bool)> {
    let mut out = Vec::new();
    for pid in children_of(parent) {
        let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
        let args: Vec<&[u8]> = cmdline.split(|b| *b == 0).collect();
        if args.contains(&&b"__child"[..]) && alive(pid as i32) {
            out.push((pid, args.contains(&&b"--standby"[..])));
        }
    }
    out
}

/// Waits until `tenure run` (process `parent`, its temporary files in `tmp`) has a
/// standby supervisor that is ready to start the command; returns its pid.
fn ready_standby(parent: u32, tmp: &Path) -> u32 {
    let t0 = Instant::now();
    loop {
        let ready = std::fs::read_dir(tmp).unwrap().flatten().any(|d| d.path().join("deadline.ready").exists());
        if let [(pid, true)] = supervisors_of(parent)[..]
            && ready
        {
            return pid;
        }
        assert!(t0.elapsed() < Duration::from_secs(20), "no standby supervisor became ready");
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// `tenure run` for the election `jobs/standby` on SQLite as candidate `id`, with its
/// temporary files in `tmp`. TTL 10 s: a busy machine does not make the leader lose
/// its term while a test relies on it leading.
fn run_standby_test(env: &Env, tmp: &Path, id: &str, script: &str) -> Proc {
    std::fs::create_dir_all(tmp).unwrap();
    Command::new(tenure())
        .env("TENURE_STORE", env.sqlite())
        .env("TMPDIR", tmp)
        .env("RUST_LOG", "warn")
        .stdin(Stdio::null())
        .args(["run", "jobs/standby", "--id", id, "--ttl", "10s", "--grace", "300ms", "--metadata", &format!("m-{id}")])
        .args(["--", "sh", "-c", script])
        .spawn()
        .map(Proc)
        .unwrap()
}

/// A handover on `jobs/standby`: candidate `a` leads once this returns. Its command
/// records its pid in `pids` and its token in `token_a`, and exits 0 once the file `go`
/// exists (`tenure run` then hands over and exits 0). `seen_b` and `tmp_b` are for the
/// test's candidate `b`.
struct Handover {
    env: Env,
    pids: PathBuf,
    go: PathBuf,
    token_a: PathBuf,
    seen_b: PathBuf,
    tmp_b: PathBuf,
    _reap: Reap,
    a: Proc,
}

impl Handover {
    fn new() -> Self {
        let env = Env::new();
        let (pids, go, token_a) = (env.path("pids"), env.path("go"), env.path("token-a"));
        let _reap = Reap(pids.clone());
        let script_a = format!(
            "echo $$ >> {p}; echo $TENURE_TOKEN > {t}; while [ ! -e {g} ]; do sleep 0.01; done",
            p = pids.display(),
            t = token_a.display(),
            g = go.display()
        );
        let a = run_standby_test(&env, &env.path("tmp-a"), "a", &script_a);
        wait_pids(&pids, 1);
        let (seen_b, tmp_b) = (env.path("seen-b"), env.path("tmp-b"));
        Self { env, pids, go, token_a, seen_b, tmp_b, _reap, a }
    }
}

#[test]
fn a_following_tenure_run_starts_nothing_and_a_kill_takes_its_standby_supervisor_and_files() {
    // A follower keeps a supervisor started ahead of its term. It must start nothing
    // before the term, and must not outlive `tenure run`, or leave files behind.
    let env = Env::new();
    let (pids, started, tmp_b) = (env.path("pids"), env.path("started"), env.path("tmp-b"));
    let _reap = Reap(pids.clone());
    let _a = run_standby_test(&env, &env.path("tmp-a"), "a", &format!("echo $$ >> {}; exec sleep 600", pids.display()));
    wait_pids(&pids, 1);
    let mut b = run_standby_test(&env, &tmp_b, "b", &format!("touch {}; exec sleep 600", started.display()));
    let standby = ready_standby(b.id(), &tmp_b);
    // Killed at the end if it is still there (a standby that outlives `tenure run`).
    let mut listed = std::fs::OpenOptions::new().append(true).open(&pids).unwrap();
    std::io::Write::write_all(&mut listed, format!("{standby}\n").as_bytes()).unwrap();
    std::thread::sleep(Duration::from_millis(300));
    // The supervisor marks a start, and forks the command, before the command runs.
    let marked = std::fs::read_dir(&tmp_b).unwrap().flatten().any(|d| d.path().join("deadline.started").exists());
    assert!(!marked, "a follower's standby supervisor went to start the command before its term");
    assert!(children_of(standby).is_empty(), "a follower's standby supervisor started a process before its term");
    assert!(!started.exists(), "a follower's standby supervisor started the command before its term");
    signal(b.id(), rustix::process::Signal::KILL);
    b.wait().unwrap();
    wait_dead(&[standby as i32], TTL / 2);
    let t0 = Instant::now();
    while std::fs::read_dir(&tmp_b).unwrap().count() > 0 {
        assert!(t0.elapsed() < TTL, "left behind: {:?}", std::fs::read_dir(&tmp_b).unwrap().collect::<Vec<_>>());
        std::thread::sleep(Duration::from_millis(10));
    }
    assert!(!started.exists(), "the standby supervisor of a killed tenure run started the command");
}

#[test]
fn a_new_leader_starts_its_command_through_its_standby_supervisor_with_the_terms_environment() {
    let Handover { env, pids: _, go, token_a, seen_b, tmp_b, _reap, mut a } = Handover::new();
    let script_b = format!(
        r#"echo "$TENURE_ELECTION $TENURE_TOKEN ${{TENURE_HOLDER%.*}} $(cat "$TENURE_METADATA_FILE") $PPID" > {s}.new; mv {s}.new {s}; exec sleep 600"#,
        s = seen_b.display()
    );
    let b = run_standby_test(&env, &tmp_b, "b", &script_b);
    let standby = ready_standby(b.id(), &tmp_b);
    std::fs::write(&go, b"").unwrap();
    assert_eq!(a.wait().unwrap().code(), Some(0), "a's command exited 0, and so did tenure run");
    let t0 = Instant::now();
    let seen = loop {
        if let Ok(s) = std::fs::read_to_string(&seen_b) {
            break s;
        }
        assert!(t0.elapsed() < Duration::from_secs(5), "b did not start its command after a handed over");
        std::thread::sleep(Duration::from_millis(10));
    };
    let token_a: u64 = std::fs::read_to_string(&token_a).unwrap().trim().parse().unwrap();
    let f: Vec<&str> = seen.split_whitespace().collect();
    assert_eq!(f.len(), 5, "{seen:?}");
    assert_eq!((f[0], f[2], f[3]), ("jobs/standby", "b", "m-b"), "the term's election, holder and metadata");
    assert!(f[1].parse::<u64>().unwrap() > token_a, "b's token {} is not above a's {token_a}", f[1]);
    assert_eq!(f[4].parse::<u32>().unwrap(), standby, "the command was not started by the standby supervisor");
}

/// A handover to candidate `b` whose standby supervisor is frozen (SIGSTOP) before it is
/// told to start the command; returns once `a` has handed over. `b`'s command records
/// `$TENURE_TOKEN $PPID` in `seen_b`.
fn frozen_standby_told() -> (Handover, Proc, u32) {
    let mut h = Handover::new();
    let script_b = format!(
        r#"echo $$ >> {p}; echo "$TENURE_TOKEN $PPID" > {s}.new; mv {s}.new {s}; exec sleep 600"#,
        p = h.pids.display(),
        s = h.seen_b.display()
    );
    let b = run_standby_test(&h.env, &h.tmp_b, "b", &script_b);
    let standby = ready_standby(b.id(), &h.tmp_b);
    signal(standby, rustix::process::Signal::STOP);
    std::fs::write(&h.go, b"").unwrap();
    assert_eq!(h.a.wait().unwrap().code(), Some(0), "a's command exited 0, and so did tenure run");
    (h, b, standby)
}

#[test]
fn a_standby_supervisor_killed_as_its_term_begins_is_replaced_and_the_command_runs_in_that_term() {
    // The standby is told to start the command, and killed before it does: nothing ran,
    // so its end is not the command's exit. `tenure run` must go on leading, start the
    // command through a new supervisor in the same term, and not exit with the killed
    // supervisor's status.
    let (h, mut b, standby) = frozen_standby_told();
    let (token_a, seen_b, tmp_b) = (h.token_a.clone(), h.seen_b.clone(), h.tmp_b.clone());
    // Held stopped, it could not act on being told; it is killed once it has been told.
    let t0 = Instant::now();
    let env_file = loop {
        let found =
            std::fs::read_dir(&tmp_b).unwrap().flatten().map(|d| d.path().join("deadline.env")).find(|p| p.exists());
        if let Some(f) = found {
            break f;
        }
        assert!(t0.elapsed() < Duration::from_secs(5), "b did not tell its standby supervisor to start the command");
        std::thread::sleep(Duration::from_millis(5));
    };
    // The term the standby was told to start the command in.
    let told = std::fs::read(&env_file).unwrap();
    let told: Vec<&[u8]> = told.split(|b| *b == 0).collect();
    let told_token =
        told.chunks(2).find(|kv| kv[0] == b"TENURE_TOKEN").map(|kv| String::from_utf8_lossy(kv[1]).into_owned());
    assert!(!env_file.with_file_name("deadline.started").exists(), "a stopped supervisor started the command");
    signal(standby, rustix::process::Signal::KILL);
    let t0 = Instant::now();
    let seen = loop {
        if let Ok(s) = std::fs::read_to_string(&seen_b) {
            break s;
        }
        assert!(b.0.try_wait().unwrap().is_none(), "b's tenure run exited when its standby supervisor was killed");
        assert!(t0.elapsed() < Duration::from_secs(5), "b did not start its command after its standby was killed");
        std::thread::sleep(Duration::from_millis(10));
    };
    let token_a: u64 = std::fs::read_to_string(&token_a).unwrap().trim().parse().unwrap();
    let (token_b, parent) = seen.trim().split_once(' ').unwrap();
    assert!(token_b.parse::<u64>().unwrap() > token_a, "b's token {token_b} is not above a's {token_a}");
    assert_eq!(Some(token_b), told_token.as_deref(), "the command did not run in the term its standby was told of");
    assert_ne!(parent.parse::<u32>().unwrap(), standby, "the killed standby supervisor started the command");
    assert!(b.0.try_wait().unwrap().is_none(), "b's tenure run exited");
}

#[test]
fn a_standby_supervisor_frozen_as_its_term_begins_is_replaced_and_the_command_runs_in_that_term() {
    // Told to start the command, the standby stays frozen: the term must not hold the
    // election with nothing running. Within a few seconds the command runs, through a new
    // supervisor, in the same term.
    let (h, mut b, standby) = frozen_standby_told();
    let (token_a, seen_b) = (h.token_a.clone(), h.seen_b.clone());
    let t0 = Instant::now();
    let seen = loop {
        if let Ok(s) = std::fs::read_to_string(&seen_b) {
            break s;
        }
        assert!(b.0.try_wait().unwrap().is_none(), "b's tenure run exited");
        assert!(
            t0.elapsed() < Duration::from_secs(8),
            "b held the election with its standby frozen and nothing running"
        );
        std::thread::sleep(Duration::from_millis(10));
    };
    let token_a: u64 = std::fs::read_to_string(&token_a).unwrap().trim().parse().unwrap();
    let (token_b, parent) = seen.trim().split_once(' ').unwrap();
    assert!(token_b.parse::<u64>().unwrap() > token_a, "b's token {token_b} is not above a's {token_a}");
    assert_ne!(parent.parse::<u32>().unwrap(), standby, "the frozen standby supervisor started the command");
    assert!(!alive(standby as i32), "the frozen standby supervisor was left behind");
    signal(standby, rustix::process::Signal::KILL);
}

/// The supervisor `tenure run` (process `parent`) runs its started command under.
fn running_supervisor_of(parent: u32) -> i32 {
    let t0 = Instant::now();
    loop {
        for entry in std::fs::read_dir("/proc").unwrap().flatten() {
            let Some(pid) = entry.file_name().to_str().and_then(|n| n.parse::<i32>().ok()) else { continue };
            let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else { continue };
            let ppid = stat.rsplit_once(')').and_then(|(_, r)| r.split_whitespace().nth(1)?.parse::<u32>().ok());
            let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
            let args: Vec<&[u8]> = cmdline.split(|b| *b == 0).collect();
            let started =
                args.iter().position(|a| *a == b"__child").and_then(|at| args.get(at + 2)).is_some_and(|f| {
                    Path::new(std::str::from_utf8(f).unwrap_or("")).with_extension("started").exists()
                });
            if ppid == Some(parent) && started && alive(pid) {
                return pid;
            }
        }
        assert!(t0.elapsed() < Duration::from_secs(10), "no supervisor of {parent} runs the command");
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// Starts a tree of workers that ignore SIGTERM (one in a session of its own) under
/// `tenure run` (TTL 2 s), disables `tenure run` and its supervisor together as `disable`
/// says, and asserts that no worker works past the lease deadline.
/// `extra`: more environment for `tenure run` (`TENURE_CGROUP=off`, so that the guard
/// must find the command's processes without a cgroup, as on hosts that give it none).
/// `before` runs first (given `tenure run`'s pid), outside the time measured: the lease
/// deadline counts from the last renewal before `disable`, not from `before`.
fn both_disabled_and_the_work_stops(extra: &[(&str, &str)], before: impl FnOnce(u32), disable: impl FnOnce(u32, i32)) {
    let env = Env::new();
    let (pids, log) = (env.path("pids"), env.path("log"));
    let _reap = Reap(pids.clone());
    let w = sh_quote(&worker(&pids, &log, true));
    let mut leader = env.run_env(&env.sqlite(), "a", &format!("setsid sh -c {w} & sh -c {w} & wait"), extra);
    wait_pids(&pids, 2);
    let supervisor = running_supervisor_of(leader.id());
    before(leader.id());
    // The guard looks over the tree at every check (50 ms) in the command's first second:
    // a tree disabled before its first look is outside what it can find once re-parented.
    std::thread::sleep(Duration::from_millis(300));
    let leader_pid = leader.id();
    disable_and_check_work_stops(
        &mut leader,
        &log,
        "tenure run and its supervisor were disabled",
        &[supervisor as u32],
        || disable(leader_pid, supervisor),
    );
}

#[test]
fn the_guard_stops_the_command_when_tenure_run_and_its_supervisor_are_both_frozen() {
    both_disabled_and_the_work_stops(
        &[],
        |_| {},
        |leader, supervisor| {
            signal(supervisor as u32, rustix::process::Signal::STOP);
            signal(leader, rustix::process::Signal::STOP);
        },
    );
}

#[test]
fn the_guard_stops_the_command_when_tenure_run_is_frozen_and_its_supervisor_killed() {
    both_disabled_and_the_work_stops(
        &[],
        |_| {},
        |leader, supervisor| {
            signal(leader, rustix::process::Signal::STOP);
            signal(supervisor as u32, rustix::process::Signal::KILL);
        },
    );
}

#[test]
fn the_guard_stops_the_command_when_tenure_run_and_its_supervisor_are_both_killed() {
    // The command's processes are re-parented away from both: the guard remembers them
    // (without a cgroup, which would hold them all). Both are frozen first, so that they
    // die together: killed one after the other, a `tenure run` that outlives its
    // supervisor by a moment stops the tree itself, and the guard is not what is tested.
    both_disabled_and_the_work_stops(
        &[("TENURE_CGROUP", "off")],
        |_| {},
        |leader, supervisor| {
            signal(leader, rustix::process::Signal::STOP);
            signal(supervisor as u32, rustix::process::Signal::STOP);
            signal(supervisor as u32, rustix::process::Signal::KILL);
            signal(leader, rustix::process::Signal::KILL);
        },
    );
}

/// The guards `tenure run` (process `parent`) has started: its live children `tenure __guard …`.
fn guards_of(parent: u32) -> Vec<u32> {
    children_of(parent)
        .into_iter()
        .filter(|pid| {
            let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
            cmdline.split(|b| *b == 0).any(|a| a == b"__guard") && alive(*pid as i32)
        })
        .collect()
}

/// Kills the one guard of `tenure run` (process `parent`) and waits for another to run.
fn kill_the_guard_and_see_it_replaced(parent: u32) {
    let t0 = Instant::now();
    let old = loop {
        if let [g] = guards_of(parent)[..] {
            break g;
        }
        assert!(t0.elapsed() < Duration::from_secs(10), "tenure run has no guard");
        std::thread::sleep(Duration::from_millis(10));
    };
    signal(old, rustix::process::Signal::KILL);
    while !guards_of(parent).iter().any(|g| *g != old) {
        assert!(t0.elapsed() < Duration::from_secs(10), "the killed guard {old} was not replaced");
        std::thread::sleep(Duration::from_millis(10));
    }
}

#[test]
fn a_guard_killed_during_the_term_is_replaced_and_a_pair_frozen_later_still_stops_the_work() {
    // One process disabled long before two others are: the term must not be left with
    // two of its three processes, or the later pair leaves nobody to stop the command.
    // The guard is killed (and replaced) before the time measured begins: measured from
    // before it, the pair's lease deadline (a renewal later) could lie past the bound.
    both_disabled_and_the_work_stops(&[], kill_the_guard_and_see_it_replaced, |leader, supervisor| {
        signal(supervisor as u32, rustix::process::Signal::STOP);
        signal(leader, rustix::process::Signal::STOP);
    });
}

#[test]
fn a_guard_killed_while_the_command_is_being_stopped_is_replaced() {
    // Stopping takes up to the grace period, with the command's processes still running:
    // until they are gone the term keeps its three processes, or a pair disabled then
    // would leave nobody to stop them.
    let env = Env::new();
    let (pids, log) = (env.path("pids"), env.path("log"));
    let _reap = Reap(pids.clone());
    let w = sh_quote(&worker(&pids, &log, true));
    let script = format!("sh -c {w} & wait");
    let mut leader =
        env.spawn(&["run", "jobs/tree", "--id", "a", "--ttl", "10s", "--grace", "3s", "--", "sh", "-c", &script]);
    wait_pids(&pids, 1);
    running_supervisor_of(leader.id());
    // Told to stop: the worker ignores SIGTERM, so the stop lasts the grace period.
    signal(leader.id(), rustix::process::Signal::TERM);
    std::thread::sleep(Duration::from_millis(200));
    assert!(leader.try_wait().unwrap().is_none(), "tenure run did not wait for the command to stop");
    kill_the_guard_and_see_it_replaced(leader.id());
    leader.wait().unwrap();
}

#[test]
fn guards_killed_while_following_are_replaced_before_the_term_and_a_pair_frozen_in_it_still_stops_the_work() {
    let env = Env::new();
    let (pids, log, go) = (env.path("pids"), env.path("log"), env.path("go"));
    let _reap = Reap(pids.clone());
    // a leads with a long TTL, so that on a loaded host it keeps its lease while b's
    // guards are killed (a term of b's own would bring a guard that is no standby's).
    let wait_go = format!("while [ ! -e {} ]; do sleep 0.01; done", go.display());
    let mut a =
        env.spawn(&["run", "jobs/tree", "--id", "a", "--ttl", "10s", "--grace", "300ms", "--", "sh", "-c", &wait_go]);
    std::thread::sleep(Duration::from_millis(500));
    let w = sh_quote(&worker(&pids, &log, true));
    let mut b = env.run(&env.sqlite(), "b", &format!("setsid sh -c {w} & sh -c {w} & wait"));
    // b follows, with a standby supervisor and its guard; the guard is killed.
    let t0 = Instant::now();
    while !supervisors_of(b.id()).iter().any(|(_, standby)| *standby) {
        assert!(t0.elapsed() < Duration::from_secs(10), "b keeps no standby supervisor");
        std::thread::sleep(Duration::from_millis(10));
    }
    assert!(!std::fs::exists(&pids).unwrap(), "b started its command while a led");
    // Each time: a follower waits for as long as the leader leads, and a guard killed
    // again (by whatever killed it once) is no rarer than the first.
    for _ in 0..3 {
        kill_the_guard_and_see_it_replaced(b.id());
    }
    assert!(!std::fs::exists(&pids).unwrap(), "b started its command while a led");
    // a hands over; b leads.
    std::fs::write(&go, b"").unwrap();
    assert_eq!(a.wait().unwrap().code(), Some(0));
    wait_pids(&pids, 2);
    let supervisor = running_supervisor_of(b.id());
    assert_eq!(guards_of(b.id()).len(), 1, "b's term runs without its guard");
    std::thread::sleep(Duration::from_millis(300));
    let b_pid = b.id();
    disable_and_check_work_stops(
        &mut b,
        &log,
        "tenure run and its supervisor were frozen",
        &[supervisor as u32],
        || {
            signal(supervisor as u32, rustix::process::Signal::STOP);
            signal(b_pid, rustix::process::Signal::STOP);
        },
    );
}

#[test]
fn a_chain_of_forks_in_new_sessions_stops_when_tenure_run_and_its_supervisor_are_both_killed() {
    // Each process of the command starts the next in a session of its own every few
    // milliseconds and exits: re-parented away from both, no look over /proc keeps up with
    // it. Where the host allows it, the command runs in a cgroup the guard kills whole.
    let Some(cgroups) = tenure_testkit::servers::cgroups_can_be_made() else {
        tenure_testkit::servers::skip("this host lets this user make no cgroup (version 2) inside its own");
        return;
    };
    let env = Env::new();
    let (log, stop, script) = (env.path("log"), env.path("stop"), env.path("chain.sh"));
    std::fs::write(
        &script,
        format!(
            "[ -e {stop} ] && exit 0\necho $(date +%s%N) >> {log}\nsleep 0.005\nsetsid sh {me} &\n",
            stop = stop.display(),
            log = log.display(),
            me = script.display()
        ),
    )
    .unwrap();
    // Whatever happens, the chain ends with the test.
    struct Stop(PathBuf);
    impl Drop for Stop {
        fn drop(&mut self) {
            let _ = std::fs::write(&self.0, b"");
        }
    }
    let _stop = Stop(stop.clone());
    let mut leader =
        env.run_env(&env.sqlite(), "a", &format!("sh {}; sleep 600", script.display()), &[("TENURE_CGROUP", "on")]);
    let t0 = Instant::now();
    while last_work(&log) == 0 {
        assert!(t0.elapsed() < Duration::from_secs(20), "the chain did not start");
        std::thread::sleep(Duration::from_millis(10));
    }
    let supervisor = running_supervisor_of(leader.id());
    // The command's first process (`sh …; sleep 600`) stays: its cgroup is the command's.
    let children = std::fs::read_to_string(format!("/proc/{supervisor}/task/{supervisor}/children")).unwrap();
    let first: i32 = children.split_whitespace().next().expect("the command runs").parse().unwrap();
    let made = cgroup_of(first, &cgroups);
    std::thread::sleep(Duration::from_millis(300));
    let leader_pid = leader.id();
    disable_and_check_work_stops(&mut leader, &log, "tenure run and its supervisor were killed", &[], || {
        signal(leader_pid, rustix::process::Signal::STOP);
        signal(supervisor as u32, rustix::process::Signal::STOP);
        signal(supervisor as u32, rustix::process::Signal::KILL);
        signal(leader_pid, rustix::process::Signal::KILL);
    });
    // The guard leaves no cgroup behind once the chain is gone.
    let t0 = Instant::now();
    while made.exists() {
        assert!(t0.elapsed() < Duration::from_secs(5), "the command's cgroup was left behind");
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn the_guard_takes_a_deadline_file_it_can_no_longer_trust_for_a_deadline_passed() {
    // tenure run and its supervisor frozen, and the deadline file made one anyone may
    // write: only the guard is left, and it must not believe the file either.
    use std::os::unix::fs::PermissionsExt;
    let env = Env::new();
    let tmp = env.path("tmp");
    std::fs::create_dir(&tmp).unwrap();
    let (pids, log) = (env.path("pids"), env.path("log"));
    let _reap = Reap(pids.clone());
    let mut leader = env.run_in(&tmp, "10s", &worker(&pids, &log, true));
    let started = wait_pids(&pids, 1);
    let supervisor = running_supervisor_of(leader.id());
    let dir = std::fs::read_dir(&tmp).unwrap().next().unwrap().unwrap().path();
    signal(supervisor as u32, rustix::process::Signal::STOP);
    signal(leader.id(), rustix::process::Signal::STOP);
    std::fs::set_permissions(dir.join("deadline"), std::fs::Permissions::from_mode(0o666)).unwrap();
    let took = wait_dead(&started[..1], Duration::from_secs(5));
    for sig in [rustix::process::Signal::KILL, rustix::process::Signal::CONT] {
        signal(supervisor as u32, sig);
        signal(leader.id(), sig);
    }
    leader.wait().unwrap();
    assert!(took < Duration::from_secs(2), "stopped {took:?} after the deadline file became one anyone may write");
}

/// Run by the test below, in a process of its own: a subreaper (as tini or `docker
/// --init` is) that starts `tenure run` in its own session, prints its pid, and reaps
/// whatever comes to it until its standard input closes.
#[test]
#[ignore = "run by the_guard_stops_the_command_of_a_killed_tenure_run_whose_supervisor_is_frozen_under_a_subreaper"]
fn subreaper_with_tenure_run() {
    use std::io::{Read, Write};
    rustix::process::set_child_subreaper(Some(rustix::process::getpid())).unwrap();
    let store = std::env::var("HELPER_STORE").unwrap();
    let script = std::env::var("HELPER_SCRIPT").unwrap();
    // Reaped by the loop below, with everything else that comes to this subreaper.
    #[allow(clippy::zombie_processes)]
    let leader = Command::new(tenure())
        .env("TENURE_STORE", store)
        .env("RUST_LOG", "warn")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .args(["run", "jobs/tree", "--id", "a", "--ttl", "2s", "--grace", "300ms", "--", "sh", "-c", &script])
        .spawn()
        .unwrap();
    println!("leader {}", leader.id());
    std::io::stdout().flush().unwrap();
    let done = std::thread::spawn(|| {
        let _ = std::io::stdin().read_to_end(&mut Vec::new());
    });
    while !done.is_finished() {
        let _ = rustix::process::wait(rustix::process::WaitOptions::NOHANG);
        std::thread::sleep(Duration::from_millis(10));
    }
}

#[test]
fn the_guard_stops_the_command_of_a_killed_tenure_run_whose_supervisor_is_frozen_under_a_subreaper() {
    // Under a subreaper in the same session, the frozen supervisor's group is not orphaned
    // when `tenure run` dies, so the kernel never continues it: only the guard is left.
    use std::io::{BufRead, BufReader};
    let env = Env::new();
    let (pids, log, tmp) = (env.path("pids"), env.path("log"), env.path("tmp"));
    std::fs::create_dir(&tmp).unwrap();
    let _reap = Reap(pids.clone());
    let w = sh_quote(&worker(&pids, &log, true));
    // With the command's cgroup where the host gives one: the guard, the last process of
    // the term, removes it, and the term's directory, which nobody else is left to remove.
    let cgroups = tenure_testkit::servers::cgroups_can_be_made();
    let mut helper = Command::new(std::env::current_exe().unwrap())
        .args(["--ignored", "--exact", "subreaper_with_tenure_run", "--nocapture"])
        .env("TENURE_CGROUP", if cgroups.is_some() { "on" } else { "off" })
        .env("TMPDIR", &tmp)
        .env("HELPER_STORE", env.sqlite())
        .env("HELPER_SCRIPT", format!("setsid sh -c {w} & sh -c {w} & wait"))
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(helper.stdout.take().unwrap()).lines();
    let leader: u32 = lines
        .by_ref()
        .map_while(Result::ok)
        .find_map(|l| l.strip_prefix("leader ").map(|p| p.parse().unwrap()))
        .expect("the helper started tenure run");
    let started = wait_pids(&pids, 2);
    let cg = cgroups.map(|c| cgroup_of(started[0], &c));
    let supervisor = running_supervisor_of(leader);
    let disabled_at = wall_ns();
    signal(supervisor as u32, rustix::process::Signal::STOP);
    signal(leader, rustix::process::Signal::KILL);
    std::thread::sleep(TTL * 2);
    let last = last_work(&log);
    let left: Vec<_> = std::fs::read_dir(&tmp).unwrap().flatten().map(|e| e.file_name()).collect();
    let cgroup_left = cg.as_ref().is_some_and(|cg| cg.exists());
    signal(supervisor as u32, rustix::process::Signal::KILL);
    drop(helper.stdin.take());
    lines.for_each(drop);
    helper.wait().unwrap();
    assert!(
        last < disabled_at + TTL.as_nanos() as u64,
        "the command's tree was still working {} ms after tenure run was killed and its supervisor frozen",
        (last - disabled_at) / 1_000_000
    );
    assert!(left.is_empty(), "the term's files were left behind: {left:?}");
    assert!(!cgroup_left, "the command's cgroup {:?} was left behind", cg);
}
