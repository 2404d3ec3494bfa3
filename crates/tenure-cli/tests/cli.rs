//! The `tenure` binary as users run it: several `tenure run` processes on one SQLite
//! file, crashes, eviction, inspection, schedules, bad input.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

mod common;
use common::{Proc, name_of, tenure};

struct Env {
    dir: tempfile::TempDir,
    store: Option<String>,
}

impl Env {
    fn new() -> Self {
        Self { dir: tempfile::tempdir().unwrap(), store: None }
    }
    fn with_store(url: String) -> Self {
        Self { dir: tempfile::tempdir().unwrap(), store: Some(url) }
    }
    fn store(&self) -> String {
        self.store.clone().unwrap_or_else(|| format!("sqlite:{}", self.dir.path().join("t.db").display()))
    }
    fn log(&self) -> PathBuf {
        self.dir.path().join("children.log")
    }
    fn cmd(&self) -> Command {
        let mut c = Command::new(tenure());
        c.env("TENURE_STORE", self.store()).env("RUST_LOG", "warn").stdin(Stdio::null());
        // Credentials the cloud emulators accept (any AWS key for moto; Azurite's published account).
        c.env("AWS_ACCESS_KEY_ID", "cli")
            .env("AWS_SECRET_ACCESS_KEY", "cli")
            .env("AZURE_STORAGE_CONNECTION_STRING", "UseDevelopmentStorage=true");
        c
    }
    fn tenure(&self, args: &[&str]) -> Output {
        self.cmd().args(args).output().unwrap()
    }
    /// `tenure run` whose child logs `start|tick HOLDER TOKEN PID WALL_NS` lines.
    fn run(&self, id: &str, ttl: &str) -> Proc {
        let script = format!(
            "echo start ${{TENURE_HOLDER%.*}} $TENURE_TOKEN $$ $(date +%s%N) >> {log}; \
             while true; do echo tick ${{TENURE_HOLDER%.*}} $TENURE_TOKEN $$ $(date +%s%N) >> {log}; sleep 0.05; done",
            log = self.log().display()
        );
        self.cmd()
            .args(["run", "jobs/report", "--id", id, "--ttl", ttl, "--grace", "300ms", "--", "sh", "-c", &script])
            .stdout(Stdio::null())
            .spawn()
            .map(Proc)
            .unwrap()
    }
}

#[derive(Debug, Clone)]
struct Line {
    what: String,
    holder: String,
    token: u64,
    pid: i32,
    ns: u64,
}

fn read_log(path: &Path) -> Vec<Line> {
    std::fs::read_to_string(path)
        .unwrap_or_default()
        .lines()
        .filter_map(|l| {
            let p: Vec<&str> = l.split(' ').collect();
            Some(Line {
                what: p.first()?.to_string(),
                holder: p.get(1)?.to_string(),
                token: p.get(2)?.parse().ok()?,
                pid: p.get(3)?.parse().ok()?,
                ns: p.get(4)?.parse().ok()?,
            })
        })
        .collect()
}

fn wall_ns() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).unwrap().as_nanos() as u64
}

fn starts(log: &Path) -> Vec<Line> {
    read_log(log).into_iter().filter(|l| l.what == "start").collect()
}

fn wait_starts(log: &Path, n: usize, within: Duration) -> Vec<Line> {
    let t0 = Instant::now();
    loop {
        let s = starts(log);
        if s.len() >= n {
            return s;
        }
        assert!(t0.elapsed() < within, "expected {n} leaders within {within:?}, saw {}", s.len());
        std::thread::sleep(Duration::from_millis(10));
    }
}

fn signal(pid: u32, sig: rustix::process::Signal) {
    let _ = rustix::process::kill_process(rustix::process::Pid::from_raw(pid as i32).unwrap(), sig);
}

/// Whether `pid` is a running process: a zombie (dead, not yet reaped) does not count.
fn alive(pid: i32) -> bool {
    let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else { return false };
    // The state follows the command name, which is in parentheses and may hold spaces.
    let state = stat.rsplit_once(')').and_then(|(_, rest)| rest.split_whitespace().next());
    !matches!(state, None | Some("Z") | Some("X"))
}

/// No two children's activity overlaps, and tokens grow in the order terms start.
fn assert_no_overlap(log: &Path) {
    let mut terms: Vec<(u64, u64, u64)> = Vec::new();
    for l in read_log(log) {
        match terms.iter_mut().find(|t| t.0 == l.token) {
            Some(t) => t.2 = t.2.max(l.ns),
            None => terms.push((l.token, l.ns, l.ns)),
        }
    }
    terms.sort_by_key(|t| t.1);
    for w in terms.windows(2) {
        assert!(w[0].0 < w[1].0, "tokens must grow: {terms:?}");
        assert!(w[0].2 < w[1].1, "the child with token {} still ran when token {} started", w[0].0, w[1].0);
    }
}

fn stop_all(children: Vec<Proc>) {
    for mut c in children {
        signal(c.id(), rustix::process::Signal::TERM);
        let _ = c.wait();
    }
}

#[test]
fn two_runs_given_one_id_never_lead_at_once_and_the_second_names_the_clash() {
    // `--id $(hostname)` on two hosts with one name, or a copied configuration.
    let env = Env::new();
    let mut first = env.run("web", "2s");
    wait_starts(&env.log(), 1, Duration::from_secs(20));
    let err = env.dir.path().join("second.err");
    let script = format!(
        "echo start ${{TENURE_HOLDER%.*}} $TENURE_TOKEN $$ $(date +%s%N) >> {log}; exec sleep 600",
        log = env.log().display()
    );
    let second = env
        .cmd()
        .args(["run", "jobs/report", "--id", "web", "--ttl", "2s", "--grace", "300ms", "--", "sh", "-c", &script])
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&err).unwrap())
        .spawn()
        .map(Proc)
        .unwrap();
    let t0 = Instant::now();
    let said = loop {
        let said = std::fs::read_to_string(&err).unwrap_or_default();
        if said.contains("another process given --id web leads") {
            break said;
        }
        assert!(t0.elapsed() < Duration::from_secs(10), "the second process did not name the clash: {said:?}");
        std::thread::sleep(Duration::from_millis(20));
    };
    assert!(said.contains("ERROR"), "{said}");
    // A TTL and more: the first still leads, and the second has started nothing.
    std::thread::sleep(Duration::from_millis(2500));
    let s = starts(&env.log());
    assert_eq!(s.len(), 1, "two processes given one --id both started their command: {s:?}");
    // The first stops: the second takes over, with a token of its own.
    signal(first.id(), rustix::process::Signal::TERM);
    first.wait().unwrap();
    let s = wait_starts(&env.log(), 2, Duration::from_secs(10));
    assert!(s[1].token > s[0].token && s[1].pid != s[0].pid, "{s:?}");
    stop_all(vec![second]);
    assert_no_overlap(&env.log());
}

#[test]
fn a_run_and_a_campaign_whose_output_nobody_reads_still_stop_on_sigterm_and_release() {
    // A supervisor that went away, `| head -1`: stdout and stderr are pipes with no reader.
    let env = Env::new();
    for args in [
        vec!["run", "jobs/deaf", "--id", "deaf", "--ttl", "2s", "--grace", "300ms", "--", "sleep", "100"],
        vec!["campaign", "jobs/deaf", "--id", "deaf", "--ttl", "2s"],
    ] {
        let mut child = env
            .cmd()
            .env("RUST_LOG", "info")
            .args(&args)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .map(Proc)
            .unwrap();
        let t0 = Instant::now();
        let holder = loop {
            let v: serde_json::Value =
                serde_json::from_slice(&env.tenure(&["status", "jobs/deaf", "--json"]).stdout).unwrap_or_default();
            if let Some(h) = v["leader"]["holder"].as_str() {
                break h.to_string();
            }
            assert!(t0.elapsed() < Duration::from_secs(20), "{args:?} did not lead");
            std::thread::sleep(Duration::from_millis(20));
        };
        assert_eq!(name_of(&holder), "deaf");
        drop(child.stdout.take());
        drop(child.stderr.take());
        signal(child.id(), rustix::process::Signal::TERM);
        let t0 = Instant::now();
        while child.try_wait().unwrap().is_none() {
            assert!(
                t0.elapsed() < Duration::from_secs(10),
                "{args:?} went on after SIGTERM with nobody reading its output"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        let v: serde_json::Value =
            serde_json::from_slice(&env.tenure(&["status", "jobs/deaf", "--json"]).stdout).unwrap();
        assert!(v["leader"].is_null(), "{args:?} did not release: {v}");
    }
}

#[test]
fn log_lines_can_be_json_one_object_a_line() {
    let env = Env::new();
    let out = env
        .cmd()
        .env("RUST_LOG", "info")
        .args(["--log-format", "json", "run", "jobs/json", "--id", "j", "--ttl", "2s", "--", "true"])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let lines: Vec<serde_json::Value> = String::from_utf8(out.stderr)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("not JSON ({e}): {l}")))
        .collect();
    let elected = lines.iter().find(|v| v["message"] == "elected").expect("an elected line");
    assert_eq!(elected["election"], "jobs/json");
    assert!(
        elected["level"] == "INFO" && elected["timestamp"].is_string() && elected["token"].is_string(),
        "{elected}"
    );
    let bad = env.cmd().env("TENURE_LOG_FORMAT", "xml").args(["status", "jobs/json"]).output().unwrap();
    assert_eq!(bad.status.code(), Some(2), "{}", String::from_utf8_lossy(&bad.stderr));
}

#[test]
fn three_runs_one_child_at_a_time_and_sigkill_takes_the_child_along() {
    let env = Env::new();
    let mut runs: Vec<(String, Proc)> =
        (1..=3).map(|i| (format!("run-{i}"), env.run(&format!("run-{i}"), "2s"))).collect();
    let first = wait_starts(&env.log(), 1, Duration::from_secs(20)).remove(0);
    std::thread::sleep(Duration::from_millis(700));
    assert_eq!(starts(&env.log()).len(), 1, "exactly one child runs");

    let i = runs.iter().position(|(id, _)| *id == first.holder).unwrap();
    let (_, mut leader) = runs.remove(i);
    let killed = wall_ns();
    leader.kill().unwrap();
    leader.wait().unwrap();
    let second = wait_starts(&env.log(), 2, Duration::from_secs(10)).remove(1);
    let takeover = Duration::from_nanos(second.ns.saturating_sub(killed));
    eprintln!("takeover after SIGKILL of tenure run: {takeover:?}");
    assert!(takeover <= Duration::from_secs(3), "another child must start within TTL + 1 s, took {takeover:?}");
    assert!(second.token > first.token);
    assert!(!alive(first.pid), "the SIGKILLed tenure run's child (pid {}) must die with it", first.pid);
    let late =
        read_log(&env.log()).into_iter().filter(|l| l.token == first.token && l.ns > killed + 200_000_000).count();
    assert_eq!(late, 0, "the orphaned child kept working after its tenure run was killed");

    stop_all(runs.into_iter().map(|(_, c)| c).collect());
    assert_no_overlap(&env.log());
}

#[test]
fn a_frozen_tenure_run_still_stops_its_command_before_the_deadline() {
    let env = Env::new();
    let mut runs: Vec<(String, Proc)> =
        (1..=2).map(|i| (format!("run-{i}"), env.run(&format!("run-{i}"), "2s"))).collect();
    let first = wait_starts(&env.log(), 1, Duration::from_secs(20)).remove(0);
    let i = runs.iter().position(|(id, _)| *id == first.holder).unwrap();
    // Freeze the leader's tenure process (not its command) for longer than the TTL.
    signal(runs[i].1.id(), rustix::process::Signal::STOP);
    let second = wait_starts(&env.log(), 2, Duration::from_secs(10)).remove(1);
    assert_ne!(second.holder, first.holder);
    assert!(!alive(first.pid), "the frozen leader's command was stopped by its supervisor");
    std::thread::sleep(Duration::from_millis(1500));
    signal(runs[i].1.id(), rustix::process::Signal::CONT);
    std::thread::sleep(Duration::from_millis(500));
    let (_, thawed) = &mut runs[i];
    assert!(thawed.0.try_wait().unwrap().is_none(), "a thawed tenure run keeps campaigning instead of exiting");
    stop_all(runs.into_iter().map(|(_, c)| c).collect());
    assert_no_overlap(&env.log());
}

#[test]
fn evict_moves_leadership_and_status_list_watch_show_it() {
    let env = Env::new();
    let mut watch = Proc(env.cmd().args(["watch", "jobs/report", "--json"]).stdout(Stdio::piped()).spawn().unwrap());
    let runs = vec![env.run("run-a", "3s"), env.run("run-b", "3s")];
    let first = wait_starts(&env.log(), 1, Duration::from_secs(20)).remove(0);

    let out = env.tenure(&["status", "jobs/report", "--json"]);
    assert!(out.status.success());
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["election"], "jobs/report");
    assert_eq!(v["leader"]["holder"].as_str().map(name_of), Some(first.holder.as_str()));
    assert_eq!(v["leader"]["token"], first.token);
    assert!(v["leader"]["expires_in_ms"].as_u64().unwrap() <= 3000);
    let human = String::from_utf8(env.tenure(&["status", "jobs/report"]).stdout).unwrap();
    assert!(human.contains(&first.holder) && human.contains("token"), "{human}");

    let out = env.tenure(&["list", "--json"]);
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v.as_array().unwrap().len(), 1);
    assert_eq!(v[0]["leader"]["holder"].as_str().map(name_of), Some(first.holder.as_str()));
    let table = String::from_utf8(env.tenure(&["list", "jobs/"]).stdout).unwrap();
    assert!(table.contains("jobs/report") && table.contains(&first.holder), "{table}");

    let evicted = wall_ns();
    let out = env.tenure(&["evict", "jobs/report", "--yes"]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let second = wait_starts(&env.log(), 2, Duration::from_secs(10)).remove(1);
    assert_ne!(second.holder, first.holder, "the other candidate leads after the eviction");
    assert!(second.token > first.token);
    eprintln!("leadership moved {:?} after evict", Duration::from_nanos(second.ns - evicted));
    assert!(!alive(first.pid), "the evicted leader stopped its child");

    let v: serde_json::Value =
        serde_json::from_slice(&env.tenure(&["status", "jobs/report", "--json"]).stdout).unwrap();
    assert_eq!(v["leader"]["holder"].as_str().map(name_of), Some(second.holder.as_str()));

    // Give watchers a moment: a leadership shorter than the store's notification
    // interval (20 ms for SQLite) may be coalesced away.
    std::thread::sleep(Duration::from_millis(300));
    stop_all(runs);
    // After every candidate stopped cleanly, nobody leads.
    let v: serde_json::Value =
        serde_json::from_slice(&env.tenure(&["status", "jobs/report", "--json"]).stdout).unwrap();
    assert_eq!(v["leader"], serde_json::Value::Null);

    std::thread::sleep(Duration::from_millis(300));
    signal(watch.id(), rustix::process::Signal::INT);
    let status = watch.wait().unwrap();
    assert!(status.success(), "watch exits 0 when interrupted");
    let lines: Vec<serde_json::Value> = BufReader::new(watch.stdout.take().unwrap())
        .lines()
        .map(|l| serde_json::from_str(&l.unwrap()).unwrap())
        .collect();
    let holders: Vec<Option<String>> =
        lines.iter().map(|v| v["leader"]["holder"].as_str().map(|h| name_of(h).to_string())).collect();
    let a = holders.iter().position(|h| h.as_deref() == Some(&first.holder)).expect("watch showed the first leader");
    let b = holders.iter().position(|h| h.as_deref() == Some(&second.holder)).unwrap_or_else(|| {
        panic!(
            "watch showed the second leader {} (started {}): {lines:?} {:?}",
            second.holder,
            second.ns,
            starts(&env.log())
        )
    });
    assert!(a < b, "in order: {holders:?}");
    assert_eq!(holders.last().unwrap(), &None, "watch showed that nobody leads at the end: {holders:?}");
    assert_no_overlap(&env.log());
}

#[test]
fn the_store_url_reaches_neither_the_command_nor_its_health_check() {
    // TENURE_STORE may carry the store's password: it stays with tenure.
    let env = Env::new();
    let (cmd_env, health_env) = (env.dir.path().join("cmd.env"), env.dir.path().join("health.env"));
    // Written whole or not at all: a check cut short when the term ends leaves the last one.
    let dump = |f: &std::path::Path| format!("env > {f}.new && mv {f}.new {f}", f = f.display());
    let out = env.tenure(&[
        "run",
        "jobs/secret",
        "--health-cmd",
        &dump(&health_env),
        "--health-interval",
        "50ms",
        "--",
        "sh",
        "-c",
        &format!("{}; sleep 0.5", dump(&cmd_env)),
    ]);
    assert_eq!(out.status.code(), Some(0), "{}", String::from_utf8_lossy(&out.stderr));
    for f in [cmd_env, health_env] {
        let seen = std::fs::read_to_string(&f).unwrap_or_else(|e| panic!("{}: {e}", f.display()));
        assert!(seen.contains("TENURE_TOKEN="), "{} holds the term's environment", f.display());
        assert!(!seen.contains("TENURE_STORE"), "{} holds the store's URL:\n{seen}", f.display());
    }
}

#[test]
fn a_state_directory_reached_through_another_users_link_is_refused() {
    // Another user's link in a directory anyone may write (sticky, as /tmp is), pointing
    // into this user's own private directory: everything it reaches is this user's, but
    // its owner may point it elsewhere at any time.
    use std::os::unix::fs::PermissionsExt;
    if !rustix::process::geteuid().is_root() {
        eprintln!("skipped: making a link owned by another user needs root");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let own = dir.path().join("own");
    std::fs::create_dir(&own).unwrap();
    let shared = dir.path().join("shared");
    std::fs::create_dir(&shared).unwrap();
    std::fs::set_permissions(&shared, std::fs::Permissions::from_mode(0o1777)).unwrap();
    let base = shared.join("state");
    std::os::unix::fs::symlink(&own, &base).unwrap();
    let run = || {
        Command::new(tenure())
            .env_remove("TENURE_STORE")
            .env("XDG_STATE_HOME", &base)
            .args(["run", "jobs/x", "--", "true"])
            .output()
            .unwrap()
    };
    std::os::unix::fs::lchown(&base, Some(65534), Some(65534)).unwrap();
    let out = run();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(err.contains("a symbolic link owned by uid 65534"), "{err}");
    assert!(!own.join("tenure").exists(), "a state directory was made through the link");
    // A directory others may write without the sticky bit, on the way: refused too.
    std::os::unix::fs::lchown(&base, Some(0), Some(0)).unwrap();
    std::fs::set_permissions(&shared, std::fs::Permissions::from_mode(0o777)).unwrap();
    let out = run();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(err.contains("a directory others may write (mode 777, no sticky bit)"), "{err}");
    // The link this user's own, in a sticky directory: followed.
    std::fs::set_permissions(&shared, std::fs::Permissions::from_mode(0o1777)).unwrap();
    let out = run();
    assert_eq!(out.status.code(), Some(0), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(own.join("tenure/tenure.db").exists());
}

#[test]
fn a_state_directory_others_may_write_is_refused() {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("tenure");
    std::fs::create_dir(&state).unwrap();
    std::fs::set_permissions(&state, std::fs::Permissions::from_mode(0o777)).unwrap();
    let out = Command::new(tenure())
        .env_remove("TENURE_STORE")
        .env("XDG_STATE_HOME", dir.path())
        .args(["run", "jobs/x", "--", "true"])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(err.contains("is not yours alone") && err.contains("chmod 700"), "{err}");
    assert!(!state.join("tenure.db").exists(), "a database was made there");
}

#[test]
fn a_store_file_names_the_store_and_must_be_private() {
    use std::os::unix::fs::PermissionsExt;
    let env = Env::new();
    let file = env.dir.path().join("store-url");
    std::fs::write(&file, format!("# the lease store\n{}\n", env.store())).unwrap();
    std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o644)).unwrap();
    let mut c = Command::new(tenure());
    c.env_remove("TENURE_STORE").env("TENURE_STORE_FILE", &file).env("RUST_LOG", "warn").stdin(Stdio::null());
    let out = c.args(["run", "jobs/filed", "--", "true"]).output().unwrap();
    assert!(!env.dir.path().join("t.db").exists());
    let err = String::from_utf8_lossy(&out.stderr);
    assert_ne!(out.status.code(), Some(0));
    assert!(err.contains("may be read or written by others") && err.contains("chmod 600"), "{err}");
    std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o600)).unwrap();
    let out = Command::new(tenure())
        .env_remove("TENURE_STORE")
        .args(["--store-file", file.to_str().unwrap(), "run", "jobs/filed", "--", "sh", "-c", "exit 3"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(3), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(env.dir.path().join("t.db").exists(), "the run used the database the file names");
}

#[test]
fn a_hostile_record_is_shown_without_a_panic_or_a_control_character() {
    // A record whose times lie past year 9999 and whose metadata sets the terminal's title.
    let env = Env::new();
    let mut leader = env
        .cmd()
        .args(["run", "jobs/hostile", "--ttl", "30s", "--", "sleep", "30"])
        .stdout(Stdio::null())
        .spawn()
        .map(Proc)
        .unwrap();
    let t0 = std::time::Instant::now();
    while !String::from_utf8_lossy(&env.tenure(&["status", "jobs/hostile"]).stdout).contains("token") {
        assert!(t0.elapsed() < Duration::from_secs(10), "no leader");
        std::thread::sleep(Duration::from_millis(20));
    }
    let db = rusqlite::Connection::open(env.dir.path().join("t.db")).unwrap();
    db.busy_timeout(Duration::from_secs(5)).unwrap();
    db.execute(
        "UPDATE tenure_leases SET acquired_ms = ?1, renewed_ms = ?1, metadata = ?2 WHERE election = 'jobs/hostile'",
        // C1's CSI and a right-to-left override too, which JSON itself does not escape.
        rusqlite::params![i64::MAX, b"\x1b]0;pwned\x07\x1b[31mred\xc2\x9b31m\xe2\x80\xaeevil".to_vec()],
    )
    .unwrap();
    // And beside it a row no build can read (its token is text): the list leaves that one
    // out, not every election with it.
    db.execute_batch(
        "CREATE TEMP TABLE bad AS SELECT * FROM tenure_leases WHERE election = 'jobs/hostile';
         UPDATE bad SET election = 'jobs/corrupt', token = 'abc';
         INSERT INTO tenure_leases SELECT * FROM bad;
         UPDATE bad SET election = 'jobs/negative', token = -1;
         INSERT INTO tenure_leases SELECT * FROM bad;",
    )
    .unwrap();
    // A negative token is no token: named as it is, never shown as a huge one.
    let out = env.tenure(&["status", "jobs/negative"]);
    let all = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert_ne!(out.status.code(), Some(0), "{all}");
    assert!(all.contains("token -1") && !all.contains("18446744073709551615"), "{all}");
    let watch = env.cmd().args(["watch", "jobs/hostile"]).stdout(Stdio::null()).stderr(Stdio::piped()).spawn().unwrap();
    for args in [&["status", "jobs/hostile"][..], &["status", "jobs/hostile", "--json"], &["list"], &["list", "--json"]]
    {
        let out = env.tenure(args);
        let (stdout, stderr) = (String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
        assert_eq!(out.status.code(), Some(0), "{args:?}: {stderr}");
        assert!(
            !stdout.contains(['\x1b', '\x07', '\u{9b}', '\u{202e}']),
            "{args:?} printed a control character: {stdout:?}"
        );
        assert!(!stdout.contains("jobs/negative") && !stdout.contains("18446744073709551615"), "{args:?}: {stdout}");
        assert!(stdout.contains("pwned"), "{args:?} shows what can be shown: {stdout}");
    }
    // Neither output writable (both on a full disk): an error exit, not a panic's 101.
    let full = || std::fs::OpenOptions::new().write(true).open("/dev/full").unwrap();
    let out = env.cmd().args(["list"]).stdout(full()).stderr(full()).status().unwrap();
    assert_eq!(out.code(), Some(1));
    std::thread::sleep(Duration::from_millis(300));
    signal(watch.id(), rustix::process::Signal::TERM);
    let watched = watch.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&watched.stderr);
    assert!(!stderr.contains("panicked"), "watch: {stderr}");
    signal(leader.0.id(), rustix::process::Signal::TERM);
    leader.0.wait().unwrap();
}

#[test]
fn run_exits_with_the_commands_code_and_releases() {
    let env = Env::new();
    let out = env.tenure(&["run", "jobs/once", "--", "sh", "-c", "test \"$TENURE_TOKEN\" -ge 1 && exit 7"]);
    assert_eq!(out.status.code(), Some(7), "{}", String::from_utf8_lossy(&out.stderr));
    let human = String::from_utf8(env.tenure(&["status", "jobs/once"]).stdout).unwrap();
    assert!(human.contains("no leader"), "released on exit: {human}");
    // A command that cannot start is said before campaigning (127, as the shell says):
    // with --keep-going it would otherwise win and hand over for ever.
    for keep_going in [false, true] {
        let mut args = vec!["run", "jobs/once"];
        if keep_going {
            args.push("--keep-going");
        }
        args.extend(["--", "/nonexistent/program"]);
        let out = env.tenure(&args);
        assert_eq!(out.status.code(), Some(127));
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(stderr.contains("cannot run \"/nonexistent/program\"") && !stderr.contains("elected"), "{stderr}");
    }
}

#[test]
fn usage_errors_exit_2_with_a_hint_and_every_help_lists_the_exit_codes() {
    let env = Env::new();
    let out = env.tenure(&["run", "jobs/x", "./report.sh"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("the command goes after --"));
    for bad in [["--cron", "bad cron"], ["--every", "0s"]] {
        let out = env.tenure(&["schedule", "jobs/y", bad[0], bad[1], "--", "true"]);
        assert_eq!(out.status.code(), Some(2), "{bad:?}: {}", String::from_utf8_lossy(&out.stderr));
    }
    for sub in ["run", "schedule", "status", "evict"] {
        let help = String::from_utf8(env.tenure(&[sub, "--help"]).stdout).unwrap();
        assert!(help.contains("Exit codes:") && help.contains("usage error"), "{sub} --help: {help}");
    }
}

#[test]
fn sigterm_stops_the_command_releases_and_exits_zero() {
    let env = Env::new();
    let mut run = env.run("run-t", "5s");
    let first = wait_starts(&env.log(), 1, Duration::from_secs(20)).remove(0);
    signal(run.id(), rustix::process::Signal::TERM);
    let status = run.wait().unwrap();
    assert_eq!(status.code(), Some(0));
    assert!(!alive(first.pid), "the command was stopped");
    let human = String::from_utf8(env.tenure(&["status", "jobs/report"]).stdout).unwrap();
    assert!(human.contains("no leader"), "{human}");
}

#[test]
fn schedule_runs_ticks_on_the_leader_only() {
    let env = Env::new();
    let log = env.log();
    let script = format!("echo tick ${{TENURE_HOLDER%.*}} $TENURE_TOKEN $$ $(date +%s%N) >> {}", log.display());
    let scheds: Vec<Proc> = ["s-1", "s-2"]
        .iter()
        .map(|id| {
            env.cmd()
                .args(["schedule", "jobs/tick", "--every", "1s", "--id", id, "--ttl", "3s", "--grace", "300ms"])
                .args(["--", "sh", "-c", &script])
                .spawn()
                .map(Proc)
                .unwrap()
        })
        .collect();
    std::thread::sleep(Duration::from_millis(4500));
    stop_all(scheds);
    let ticks = read_log(&log);
    assert!(ticks.len() >= 3, "expected a tick per second, got {}", ticks.len());
    // One holder runs them, each under its own token; a term lost on a loaded host hands
    // the next ticks to the other, under a larger token, never back to an older one.
    let mut ordered: Vec<&Line> = ticks.iter().collect();
    ordered.sort_by_key(|t| t.ns);
    for w in ordered.windows(2) {
        assert!(w[0].token <= w[1].token, "a tick ran under an older term after a newer one: {:?}", w);
        assert!(w[0].token != w[1].token || w[0].holder == w[1].holder, "two holders shared a token: {:?}", w);
    }
    let lines = std::fs::read_to_string(&log).unwrap().lines().count();
    assert_eq!(lines, ticks.len(), "every tick ran with a token and a holder");
    let seconds: std::collections::BTreeSet<_> = ticks.iter().map(|t| t.ns / 1_000_000_000).collect();
    assert_eq!(seconds.len(), ticks.len(), "no tick ran twice");
}

#[test]
fn bad_input_gets_clear_errors_and_documented_codes() {
    let env = Env::new();
    let out = env.tenure(&["status", "a//b"]);
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("empty path segment") && err.contains("1 to 200 characters"), "{err}");

    let out = env.cmd().args(["status", "x", "--store", "ftp://user:hunter2@host/x"]).output().unwrap();
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("unknown store scheme") && err.contains("sqlite:PATH"), "{err}");
    assert!(!err.contains("hunter2"), "credentials are never printed: {err}");

    let out = env.tenure(&["run", "x", "--ttl", "10s", "--grace", "9s", "--", "true"]);
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("--grace 9s does not fit inside --ttl 10s"), "{err}");

    let out = env.tenure(&["run", "x", "--ttl", "soon", "--", "true"]);
    assert_eq!(out.status.code(), Some(2));

    let out = env.tenure(&["run", "x", "--ttl", "3s", "--grace", "300ms", "--cool-down", "5s", "--", "true"]);
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("invalid --cool-down") && err.contains("5s"), "{err}");

    let out = env.cmd().args(["status", "x", "--store", "sqlite:/nonexistent-dir/sub/t.db"]).output().unwrap();
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("tenure: error: cannot open the SQLite store at /nonexistent-dir/sub/t.db"), "{err}");

    // Evict asks for confirmation; off a terminal it needs --yes.
    let _l = env.tenure(&["run", "jobs/e", "--", "true"]);
    let mut holder = env.run("run-e", "5s");
    wait_starts(&env.log(), 1, Duration::from_secs(20));
    let out = env.tenure(&["evict", "jobs/report"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("--yes"));
    signal(holder.id(), rustix::process::Signal::TERM);
    holder.wait().unwrap();
}

#[test]
fn demo_runs_and_reports() {
    let out = Command::new(tenure()).args(["demo", "--candidates", "3"]).stdin(Stdio::null()).output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{text}\n{}", String::from_utf8_lossy(&out.stderr));
    assert!(text.contains("tokens grew      yes") && text.contains("orphaned jobs    none"), "{text}");
}

/// The same two-replica crash takeover on a server store, through `--store URL`, with a
/// 2 s TTL: the new leader starts within 3 s.
fn crash_takeover_on(url: String) {
    crash_takeover_with(url, "2s", Duration::from_secs(3));
}

fn crash_takeover_with(url: String, ttl: &str, bound: Duration) {
    let env = Env::with_store(url);
    let mut runs: Vec<(String, Proc)> =
        (1..=2).map(|i| (format!("run-{i}"), env.run(&format!("run-{i}"), ttl))).collect();
    let first = wait_starts(&env.log(), 1, Duration::from_secs(20)).remove(0);
    let v: serde_json::Value =
        serde_json::from_slice(&env.tenure(&["status", "jobs/report", "--json"]).stdout).unwrap();
    assert_eq!(v["leader"]["holder"].as_str().map(name_of), Some(first.holder.as_str()));
    let i = runs.iter().position(|(id, _)| *id == first.holder).unwrap();
    let (_, mut leader) = runs.remove(i);
    let killed = wall_ns();
    leader.kill().unwrap();
    let second = wait_starts(&env.log(), 2, bound + Duration::from_secs(7)).remove(1);
    let takeover = Duration::from_nanos(second.ns.saturating_sub(killed));
    assert!(takeover <= bound, "takeover took {takeover:?}");
    assert!(second.token > first.token);
    assert!(!alive(first.pid));
    stop_all(runs.into_iter().map(|(_, c)| c).collect());
    assert_no_overlap(&env.log());
}

/// `--holders 2` with five candidates on `url`: two commands run, each with its own
/// index and token; a SIGKILLed holder's index is taken again within `bound`, under a
/// larger token; never three run at once.
fn holders_on(url: String, ttl: &str, bound: Duration) {
    let env = Env::with_store(url);
    let log = env.log();
    let script = format!(
        "echo start ${{TENURE_HOLDER%.*}} $TENURE_TOKEN $$ $(date +%s%N) $TENURE_HOLDER_INDEX >> {log}; \
         while true; do echo tick ${{TENURE_HOLDER%.*}} $TENURE_TOKEN $$ $(date +%s%N) $TENURE_HOLDER_INDEX >> {log}; sleep 0.05; done",
        log = log.display()
    );
    let mut runs: Vec<(String, Proc)> = (1..=5)
        .map(|i| {
            let id = format!("h{i}");
            let args = ["run", "jobs/pool", "--holders", "2", "--id", &id, "--ttl", ttl, "--grace", "300ms"];
            let p = env.cmd().args(args).args(["--", "sh", "-c", &script]).stdout(Stdio::null()).spawn().map(Proc);
            (id, p.unwrap())
        })
        .collect();
    // The holder index is the sixth field of each line.
    let index_of = |l: &Line| -> u32 {
        let text = std::fs::read_to_string(&log).unwrap();
        let line = text.lines().find(|t| t.split(' ').nth(2) == Some(&l.token.to_string())).unwrap().to_string();
        line.split(' ').nth(5).and_then(|i| i.parse().ok()).expect("TENURE_HOLDER_INDEX is set")
    };
    // Each term's span, from its first line to its last: never three at once.
    let never_three = || {
        let mut spans: Vec<(u64, u64, u64)> = Vec::new();
        for l in read_log(&log) {
            match spans.iter_mut().find(|t| t.0 == l.token) {
                Some(t) => t.2 = t.2.max(l.ns),
                None => spans.push((l.token, l.ns, l.ns)),
            }
        }
        for s in &spans {
            let at_once = spans.iter().filter(|o| o.1 <= s.1 && s.1 <= o.2).count();
            assert!(at_once <= 2, "{at_once} commands ran at once when token {} started: {spans:?}", s.0);
        }
    };
    let first = wait_starts(&log, 2, Duration::from_secs(20));
    std::thread::sleep(Duration::from_secs(1));
    // Two of five run, and the other three wait. (On a loaded host a holder whose renewals
    // go unanswered loses its term and a standby takes its index: a third start then, but
    // never a third command at once.)
    never_three();
    let indices: std::collections::BTreeSet<u32> = first.iter().map(index_of).collect();
    assert_eq!(indices, [0, 1].into(), "one holder per index");
    assert_ne!(first[0].token, first[1].token, "each holder has its own token");
    let v: serde_json::Value = serde_json::from_slice(&env.tenure(&["status", "jobs/pool", "--json"]).stdout).unwrap();
    let shown: Vec<&str> =
        v["holders"].as_array().unwrap().iter().filter_map(|h| h["holder"].as_str()).map(name_of).collect();
    assert_eq!(shown.len(), 2, "status shows both holders: {v}");
    let victim = &first[0];
    let i = runs.iter().position(|(id, _)| *id == victim.holder).unwrap();
    let (_, mut killed_run) = runs.remove(i);
    let killed = wall_ns();
    killed_run.kill().unwrap();
    // The first start at the freed index. (On a loaded host the other holder may lose its
    // term meanwhile, and its own index be taken again first: that start is not this one.)
    let freed = index_of(victim);
    let give_up = Instant::now() + bound + Duration::from_secs(7);
    let next = loop {
        if let Some(l) = starts(&log).into_iter().skip(2).find(|l| index_of(l) == freed) {
            break l;
        }
        assert!(Instant::now() < give_up, "index {freed} was not taken again: {:?}", starts(&log));
        std::thread::sleep(Duration::from_millis(50));
    };
    let took = Duration::from_nanos(next.ns.saturating_sub(killed));
    assert!(took <= bound, "the killed holder's index was taken again {took:?} after the kill");
    assert!(next.token > victim.token, "under a larger token");
    // No single leader to evict: evict names the holders' slots instead, and does nothing.
    let out = env.tenure(&["evict", "jobs/pool", "--yes"]);
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("has 2 holders") && err.contains(".tenure/holders/jobs/pool/"), "{err}");
    assert!(!alive(victim.pid), "the killed holder's command is gone");
    std::thread::sleep(Duration::from_millis(500));
    stop_all(runs.into_iter().map(|(_, c)| c).collect());
    never_three();
}

#[test]
fn two_holders_of_five_candidates_run_and_a_killed_one_is_replaced_within_a_ttl() {
    let db = Env::new();
    holders_on(db.store(), "2s", Duration::from_secs(4));
}

#[test]
fn one_holder_and_several_are_refused_beside_each_other_with_a_clear_error() {
    let env = Env::new();
    let mut one = env.run("single", "3s");
    wait_starts(&env.log(), 1, Duration::from_secs(20));
    let out = env.tenure(&["run", "jobs/report", "--holders", "2", "--", "true"]);
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("cannot campaign with --holders 2") && err.contains("the same --holders"), "{err}");
    let out = env.tenure(&["run", "jobs/report", "--holders", "2", "--once", "k", "--", "true"]);
    assert!(String::from_utf8_lossy(&out.stderr).contains("cannot be combined with --holders 2"));
    let out = env.tenure(&["run", "jobs/x", "--holders", "2", "--priority", "1", "--", "true"]);
    assert!(String::from_utf8_lossy(&out.stderr).contains("invalid --priority"));
    let out = env.tenure(&["run", "jobs/x", "--holders", "0", "--", "true"]);
    assert_eq!(out.status.code(), Some(2));
    // tenure's own names are not campaigned for: a slot taken by hand would be a holder.
    let out = env.tenure(&["run", ".tenure/holders/jobs/pool/0", "--", "true"]);
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("are tenure's own"));
    signal(one.id(), rustix::process::Signal::TERM);
    one.wait().unwrap();
}

#[test]
fn tenure_run_on_postgres() {
    let Some(server) = tenure_testkit::servers::launch(tenure_testkit::servers::Kind::Postgres) else {
        return;
    };
    crash_takeover_on(server.url());
    holders_on(server.url(), "2s", Duration::from_secs(4));
}

#[test]
fn a_postgres_password_can_come_from_pgpassword_or_a_pgpass_file_instead_of_the_url() {
    use std::os::unix::fs::PermissionsExt;
    let secret = "pg-secret-7f3a";
    let Some(server) = tenure_testkit::servers::launch_with(tenure_testkit::servers::Kind::Postgres, Some(secret))
    else {
        return;
    };
    let env = Env::with_store(format!("postgres://postgres@127.0.0.1:{}/postgres", server.port()));
    let status = |cmd: &mut Command| cmd.args(["status", "jobs/pg", "--json"]).output().unwrap();
    let out = status(&mut env.cmd());
    assert_ne!(out.status.code(), Some(0), "no password, yet: {}", String::from_utf8_lossy(&out.stdout));
    let out = status(env.cmd().env("PGPASSWORD", secret));
    assert_eq!(out.status.code(), Some(0), "PGPASSWORD: {}", String::from_utf8_lossy(&out.stderr));
    let file = env.dir.path().join("pgpass");
    std::fs::write(&file, format!("127.0.0.1:{}:*:postgres:{secret}\n", server.port())).unwrap();
    std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o600)).unwrap();
    let out = status(env.cmd().env("PGPASSFILE", &file));
    assert_eq!(out.status.code(), Some(0), "PGPASSFILE: {}", String::from_utf8_lossy(&out.stderr));
    for out in [status(&mut env.cmd()), status(env.cmd().env("PGPASSWORD", "wrong"))] {
        assert!(!String::from_utf8_lossy(&out.stderr).contains(secret));
    }
}

#[test]
fn tenure_run_on_redis() {
    let Some(server) = tenure_testkit::servers::launch(tenure_testkit::servers::Kind::Redis) else { return };
    crash_takeover_on(server.url());
    holders_on(server.url(), "2s", Duration::from_secs(4));
}

#[test]
fn tenure_run_on_mariadb() {
    let Some(server) = tenure_testkit::servers::launch(tenure_testkit::servers::Kind::MariaDb) else { return };
    crash_takeover_on(server.url());
    holders_on(server.url(), "2s", Duration::from_secs(4));
}

#[test]
fn tenure_run_on_etcd() {
    let Some(server) = tenure_testkit::servers::launch(tenure_testkit::servers::Kind::Etcd) else { return };
    crash_takeover_on(server.url());
    holders_on(server.url(), "2s", Duration::from_secs(4));
}

#[test]
fn tenure_run_on_nats() {
    let Some(server) = tenure_testkit::servers::launch(tenure_testkit::servers::Kind::Nats) else { return };
    let url = format!("{}/cli", server.url());
    crash_takeover_on(url.clone());
    holders_on(url, "2s", Duration::from_secs(4));
}

#[test]
fn tenure_run_on_zookeeper() {
    let Some(server) = tenure_testkit::servers::launch(tenure_testkit::servers::Kind::ZooKeeper) else { return };
    crash_takeover_on(server.url());
    holders_on(server.url(), "2s", Duration::from_secs(4));
}

#[test]
fn tenure_run_on_s3() {
    let Some(server) = tenure_testkit::servers::launch(tenure_testkit::servers::Kind::Moto) else { return };
    let url = format!("s3://cli?endpoint={}", server.url());
    crash_takeover_on(url.clone());
    holders_on(url, "2s", Duration::from_secs(4));
}

#[test]
fn tenure_run_on_dynamodb() {
    let Some(server) = tenure_testkit::servers::launch(tenure_testkit::servers::Kind::Moto) else { return };
    let url = format!("dynamodb://cli-leases?endpoint={}", server.url());
    crash_takeover_on(url.clone());
    holders_on(url, "2s", Duration::from_secs(4));
}

#[test]
fn tenure_run_on_gcs() {
    let Some(server) = tenure_testkit::servers::launch(tenure_testkit::servers::Kind::FakeGcs) else { return };
    let url = format!("gs://cli?endpoint={}&project=cli", server.url());
    crash_takeover_on(url.clone());
    holders_on(url, "2s", Duration::from_secs(4));
}

/// Blob leases last 15 to 60 s: the takeover comes within a 15 s TTL plus 3 s.
#[test]
fn tenure_run_on_azure_blob() {
    let Some(server) = tenure_testkit::servers::launch(tenure_testkit::servers::Kind::Azurite) else { return };
    let url = format!("azblob://devstoreaccount1/cli?endpoint={}", server.url());
    crash_takeover_with(url.clone(), "15s", Duration::from_secs(18));
    holders_on(url, "15s", Duration::from_secs(17));
}

/// Every benchmark scenario runs, small, and reports what it measured (the figures
/// themselves are not asserted: they depend on the machine).
#[test]
fn bench_runs_every_scenario_and_reports_json() {
    let env = Env::new();
    // As a user runs it: no RUST_LOG, so the default log level applies.
    let out = env
        .cmd()
        .env_remove("RUST_LOG")
        .args([
            "bench",
            "--scenario",
            "rtt,acquire,handover,crash,load,scale,contest,run",
            "--samples",
            "5",
            "--handovers",
            "5",
            "--elections",
            "2",
            "--candidates",
            "2",
            "--duration",
            "1s",
            "--scale",
            "50",
            "--processes",
            "2",
            "--ttl",
            "1s",
            "--json",
        ])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{text}\n{err}");
    // The crash scenario cuts its own candidates off: those are not the user's warnings.
    assert!(!err.contains("WARN"), "the benchmark's own faults were reported as warnings:\n{err}");
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    for (k, n) in [("rtt", 5), ("acquire", 5), ("handover", 5), ("crash", 5)] {
        assert_eq!(v[k]["n"], n, "{k}: {text}");
        assert!(v[k]["p50"].as_f64().unwrap() > 0.0, "{k}: {text}");
    }
    assert!(v["acquire"]["p50_in_rtt"].as_f64().is_some() && v["crash"]["p50_in_ttl"].as_f64().is_some());
    // Every handover is cut into its steps: the release and the acquire were each seen.
    let steps = &v["handover"]["steps"];
    for k in
        ["to_release_sent", "release", "release_sent_to_heard", "heard_to_acquire_sent", "acquire", "to_elected_seen"]
    {
        assert_eq!(steps[k]["n"], 5, "handover step {k}: {text}");
    }
    assert!(steps["release"]["p50"].as_f64().unwrap() > 0.0 && steps["acquire"]["p50"].as_f64().unwrap() > 0.0);
    let (w, p) = (&v["load"]["watching"], &v["load"]["polling_baseline"]);
    if w["leadership_changes"] == 0 {
        assert_eq!(w["calls_per_s_per_follower"], 0.0, "watching followers call the store: {text}");
    }
    assert!(p["calls_per_s_per_follower"].as_f64().unwrap() > 0.0, "polling followers poll: {text}");
    let (b, s) = (&v["scale"]["batched"], &v["scale"]["per_election_baseline"]);
    assert_eq!((b["elections"].as_u64(), s["elections"].as_u64()), (Some(50), Some(50)));
    assert!(b["renewals"].as_u64().unwrap() > 0 && b["store_calls_per_s"].as_f64().is_some());
    // Two processes contested the same 50 elections (the scenario fails unless every one
    // got a leader in one of them) and both reported.
    let c = &v["contest"];
    assert_eq!((c["processes"].as_u64(), c["elections"].as_u64()), (Some(2), Some(50)), "{text}");
    let per = c["per_process"].as_array().unwrap();
    assert_eq!(per.len(), 2, "{text}");
    assert_ne!(per[0]["pid"], per[1]["pid"], "{text}");
    let leading: u64 = per.iter().map(|p| p["leading_when_measured"].as_u64().unwrap()).sum();
    assert!(leading > 0, "{text}");
    assert!(per.iter().all(|p| p["renewal_latency"]["n"].as_u64().is_some()), "{text}");
    // Five `tenure run` processes in turn took over from the one whose command exited
    // (the scenario fails if a standby's command started while the leader's ran).
    let r = &v["run"]["tenure_run"];
    assert_eq!(r["n"], 5, "{text}");
    assert!(r["p50"].as_f64().unwrap() > 0.0, "{text}");
}

/// Shell completions and man pages come from the same definitions as `--help`.
#[test]
fn completions_load_in_their_shells_and_man_pages_cover_every_command() {
    let env = Env::new();
    let bash = env.tenure(&["completions", "bash"]);
    assert!(bash.status.success(), "{}", String::from_utf8_lossy(&bash.stderr));
    let script = env.dir.path().join("tenure.bash");
    std::fs::write(&script, &bash.stdout).unwrap();
    let check = Command::new("bash").arg("-n").arg(&script).output().unwrap();
    assert!(check.status.success(), "bash -n: {}", String::from_utf8_lossy(&check.stderr));
    // Loaded, it registers a completion for `tenure` that offers the subcommands.
    let probe = format!(
        "source {}; complete -p tenure || exit 1; COMP_WORDS=(tenure ru); COMP_CWORD=1; COMP_LINE='tenure ru'; \
         COMP_POINT=9; _tenure tenure ru tenure; echo \"${{COMPREPLY[@]}}\"",
        script.display()
    );
    let out = Command::new("bash").arg("-c").arg(&probe).output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success() && text.contains("run"), "{text}{}", String::from_utf8_lossy(&out.stderr));
    let all = Command::new("bash")
        .arg("-c")
        .arg(format!(
            "source {}; COMP_WORDS=(tenure ''); COMP_CWORD=1; _tenure tenure '' tenure; echo \"${{COMPREPLY[@]}}\"",
            script.display()
        ))
        .output()
        .unwrap();
    let all = String::from_utf8_lossy(&all.stdout);
    assert!(all.contains("schedule") && !all.contains("__"), "internal commands are not offered: {all}");
    for shell in ["zsh", "fish", "elvish", "powershell"] {
        let out = env.tenure(&["completions", shell]);
        assert!(out.status.success() && String::from_utf8_lossy(&out.stdout).contains("schedule"), "{shell}");
    }
    let bad = env.tenure(&["completions", "tcsh"]);
    assert_eq!(bad.status.code(), Some(2), "an unknown shell is a usage error");

    let man = env.tenure(&["man"]);
    let page = String::from_utf8_lossy(&man.stdout);
    assert!(man.status.success() && page.contains(".TH tenure") && page.contains("schedule"), "{page}");
    let dir = env.dir.path().join("man1");
    let out = env.tenure(&["man", "--dir", dir.to_str().unwrap()]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    for name in ["tenure", "tenure-run", "tenure-schedule", "tenure-status", "tenure-evict", "tenure-gossip"] {
        let page = std::fs::read_to_string(dir.join(format!("{name}.1"))).unwrap_or_default();
        assert!(page.starts_with(".ie") || page.contains(".TH"), "{name}.1 is missing or empty");
    }
    assert!(!dir.join("tenure-__child.1").exists(), "hidden commands get no page");
}

/// `status`, `list` and `watch` describe a leader with one and the same object.
#[test]
fn status_list_and_watch_print_the_same_leader_object() {
    let env = Env::new();
    let _leader = env.run("a", "5s");
    wait_starts(&env.log(), 1, Duration::from_secs(20));
    let status: serde_json::Value =
        serde_json::from_slice(&env.tenure(&["status", "jobs/report", "--json"]).stdout).unwrap();
    let list: serde_json::Value = serde_json::from_slice(&env.tenure(&["list", "--json"]).stdout).unwrap();
    let mut watch =
        env.cmd().args(["watch", "jobs/report", "--json"]).stdout(Stdio::piped()).spawn().map(Proc).unwrap();
    let mut line = String::new();
    BufReader::new(watch.stdout.take().unwrap()).read_line(&mut line).unwrap();
    let watched: serde_json::Value = serde_json::from_str(&line).unwrap();
    let keys = |v: &serde_json::Value| {
        let mut k: Vec<String> = v["leader"].as_object().expect("a leader object").keys().cloned().collect();
        k.sort();
        k
    };
    let expected = ["acquired_at", "evicted", "expires_in_ms", "holder", "metadata", "renewed_at", "token"];
    for (what, v) in [("status", &status), ("list", &list[0]), ("watch", &watched)] {
        assert_eq!(keys(v), expected, "{what}: {v}");
        assert_eq!(
            (v["leader"]["holder"].as_str().map(name_of), v["leader"]["token"].as_u64()),
            (Some("a"), status["leader"]["token"].as_u64()),
            "{what}"
        );
        assert!(v["leader"]["acquired_at"].is_string(), "{what}: {v}");
    }
}

#[test]
fn a_leading_command_publishes_new_metadata_through_its_file_and_watch_shows_it() {
    let env = Env::new();
    let mut watch = Proc(env.cmd().args(["watch", "jobs/proclaim"]).stdout(Stdio::piped()).spawn().unwrap());
    let script = format!(
        "echo start ${{TENURE_HOLDER%.*}} $TENURE_TOKEN $$ $(date +%s%N) >> {log}; sleep 0.5; \
         printf 10.0.0.7:9090 > \"$TENURE_METADATA_FILE.new\" && mv \"$TENURE_METADATA_FILE.new\" \"$TENURE_METADATA_FILE\"; \
         sleep 60",
        log = env.log().display()
    );
    let args = ["run", "jobs/proclaim", "--id", "run-p", "--ttl", "3s", "--grace", "300ms"];
    let run = Proc(
        env.cmd()
            .args(args)
            .args(["--metadata", "10.0.0.7:8080", "--cool-down", "100ms", "--backoff", "200ms", "--", "sh", "-c"])
            .arg(&script)
            .stdout(Stdio::null())
            .spawn()
            .unwrap(),
    );
    let started = wait_starts(&env.log(), 1, Duration::from_secs(20)).remove(0);
    let status = || -> serde_json::Value {
        serde_json::from_slice(&env.tenure(&["status", "jobs/proclaim", "--json"]).stdout).unwrap()
    };
    assert_eq!(status()["leader"]["metadata"], "10.0.0.7:8080", "at first, what --metadata said");
    let t0 = Instant::now();
    while status()["leader"]["metadata"] != "10.0.0.7:9090" {
        assert!(t0.elapsed() < Duration::from_secs(10), "the new metadata was not published: {}", status());
        std::thread::sleep(Duration::from_millis(50));
    }
    let v = status();
    assert_eq!(v["leader"]["token"], started.token, "published within the same term");
    assert_eq!(starts(&env.log()).len(), 1, "the command was not restarted");
    std::thread::sleep(Duration::from_millis(300));
    stop_all(vec![run]);
    std::thread::sleep(Duration::from_millis(300));
    signal(watch.id(), rustix::process::Signal::INT);
    assert!(watch.wait().unwrap().success());
    let lines: Vec<String> = BufReader::new(watch.stdout.take().unwrap()).lines().map(Result::unwrap).collect();
    let holder = v["leader"]["holder"].as_str().unwrap();
    assert_eq!(name_of(holder), "run-p");
    let leader = format!("leader {holder} (token {})", started.token);
    let first = lines.iter().position(|l| l.ends_with(&leader)).unwrap_or_else(|| panic!("{lines:?}"));
    let published = format!("{leader} published 10.0.0.7:9090");
    assert!(lines[first + 1..].iter().any(|l| l.ends_with(&published)), "watch shows the new metadata: {lines:?}");
}

#[test]
fn status_lists_the_candidates_that_announce_themselves_and_list_hides_their_presence() {
    let env = Env::new();
    let announcing = |id: &str| {
        let script = format!(
            "echo start ${{TENURE_HOLDER%.*}} $TENURE_TOKEN $$ $(date +%s%N) >> {}; sleep 60",
            env.log().display()
        );
        let args = ["run", "jobs/announce", "--id", id, "--ttl", "3s", "--grace", "300ms", "--announce"];
        Proc(
            env.cmd()
                .args(args)
                .args(["--metadata", &format!("{id}:8080"), "--", "sh", "-c", &script])
                .stdout(Stdio::null())
                .spawn()
                .unwrap(),
        )
    };
    let runs = vec![announcing("run-a"), announcing("run-b")];
    let leader = wait_starts(&env.log(), 1, Duration::from_secs(20)).remove(0);
    let t0 = Instant::now();
    let v = loop {
        let v: serde_json::Value =
            serde_json::from_slice(&env.tenure(&["status", "jobs/announce", "--json"]).stdout).unwrap();
        if v["candidates"].as_array().is_some_and(|c| c.len() == 2) {
            break v;
        }
        assert!(t0.elapsed() < Duration::from_secs(10), "both candidates are listed: {v}");
        std::thread::sleep(Duration::from_millis(50));
    };
    assert_eq!(v["leader"]["holder"].as_str().map(name_of), Some(leader.holder.as_str()));
    let c = &v["candidates"];
    assert_eq!(
        (c[0]["holder"].as_str().map(name_of), c[0]["metadata"].as_str()),
        (Some("run-a"), Some("run-a:8080")),
        "{v}"
    );
    assert_eq!(
        (c[1]["holder"].as_str().map(name_of), c[1]["metadata"].as_str()),
        (Some("run-b"), Some("run-b:8080")),
        "{v}"
    );
    assert!(c[0]["expires_in_ms"].as_u64().unwrap() <= 3000);
    let human = String::from_utf8(env.tenure(&["status", "jobs/announce"]).stdout).unwrap();
    assert!(human.contains(&format!("{} (leader)", v["leader"]["holder"].as_str().unwrap())), "{human}");
    let listed: serde_json::Value = serde_json::from_slice(&env.tenure(&["list", "--json"]).stdout).unwrap();
    let names: Vec<&str> = listed.as_array().unwrap().iter().filter_map(|r| r["election"].as_str()).collect();
    assert_eq!(names, ["jobs/announce"], "presence leases are not elections to list");
    // A candidate that stops drops out of the list at once.
    stop_all(runs);
    let v: serde_json::Value =
        serde_json::from_slice(&env.tenure(&["status", "jobs/announce", "--json"]).stdout).unwrap();
    assert_eq!(v["candidates"], serde_json::json!([]), "{v}");
}

#[test]
fn priorities_hand_over_gracefully_and_evict_to_hands_over_to_the_named_candidate() {
    let env = Env::new();
    let run = |id: &str, priority: &str| {
        let script = format!(
            "echo start ${{TENURE_HOLDER%.*}} $TENURE_TOKEN $$ $(date +%s%N) >> {log}; \
             while true; do echo tick ${{TENURE_HOLDER%.*}} $TENURE_TOKEN $$ $(date +%s%N) >> {log}; sleep 0.05; done",
            log = env.log().display()
        );
        let args = ["run", "jobs/report", "--id", id, "--ttl", "3s", "--grace", "300ms", "--priority", priority];
        env.cmd().args(args).args(["--", "sh", "-c", &script]).stdout(Stdio::null()).spawn().map(Proc).unwrap()
    };
    let holders = || starts(&env.log()).into_iter().map(|l| l.holder).collect::<Vec<_>>();
    let mut runs = vec![run("a", "1")];
    wait_starts(&env.log(), 1, Duration::from_secs(20));
    // Equal priorities never preempt each other.
    runs.push(run("b", "1"));
    runs.push(run("c", "1"));
    let t0 = Instant::now();
    loop {
        let v: serde_json::Value =
            serde_json::from_slice(&env.tenure(&["status", "jobs/report", "--json"]).stdout).unwrap();
        if v["candidates"].as_array().is_some_and(|c| c.len() == 3) {
            break;
        }
        assert!(t0.elapsed() < Duration::from_secs(10), "three candidates are listed: {v}");
        std::thread::sleep(Duration::from_millis(50));
    }
    std::thread::sleep(Duration::from_secs(2));
    assert_eq!(holders(), ["a"]);
    // A handover to a named candidate: only it leads next, after the old command ended.
    let out = env.tenure(&["evict", "jobs/report", "--yes", "--to", "c"]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{stdout} {}", String::from_utf8_lossy(&out.stderr));
    let led = stdout.lines().find(|l| l.contains(" leads jobs/report now")).and_then(|l| l.split(' ').next());
    assert_eq!(led.map(name_of), Some("c"), "{stdout}");
    // `evict` returns once c holds the lease; c's command starts a moment later.
    wait_starts(&env.log(), 2, Duration::from_secs(10));
    assert_eq!(holders(), ["a", "c"]);
    let out = env.tenure(&["evict", "jobs/report", "--yes", "--to", "nobody"]);
    assert_eq!(out.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("nobody is not an announced candidate of jobs/report"), "{stderr}");
    // a, evicted, is not announced while it stands aside.
    assert!(stderr.contains("announced: b.") && stderr.contains(", c.") && !stderr.contains(", a."), "{stderr}");
    // A candidate of higher priority takes over: c renews on, so only a handover to d
    // (at c's next renewal, after the grace) lets d lead. How soon is for the benchmarks:
    // on a loaded host, starting d alone takes a second or more.
    runs.push(run("d", "9"));
    wait_starts(&env.log(), 3, Duration::from_secs(20));
    assert_eq!(holders(), ["a", "c", "d"]);
    std::thread::sleep(Duration::from_millis(500));
    stop_all(runs);
    assert_no_overlap(&env.log());
}

#[test]
fn a_store_that_is_down_is_named_with_its_cause_once() {
    let env = Env::new();
    let port = tenure_testkit::servers::free_port();
    for url in [format!("redis://127.0.0.1:{port}"), format!("etcd://127.0.0.1:{port}")] {
        let out = env.tenure(&["--store", &url, "status", "x"]);
        assert_eq!(out.status.code(), Some(1));
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(stderr.matches("Connection refused").count(), 1, "{url}: {stderr}");
        assert!(!stderr.contains("tonic::") && !stderr.contains("ConnectError("), "{url}: {stderr}");
    }
}
