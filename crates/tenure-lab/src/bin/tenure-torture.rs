//! `tenure-torture`: real `tenure run` candidates under injected faults, checked.
//!
//! Starts N `tenure run` processes against one store. Each runs, while it leads, a
//! **process tree** of probes, as real commands are: one under `timeout` (a process
//! group of its own), one that ignores SIGTERM in the background, one that ignores
//! SIGTERM in a new session (`setsid`), and one in a new session whose parent's main
//! thread has ended while another thread still runs. Every probe writes every 10 ms to a fenced
//! resource (a file that accepts a token only if it is at least the highest accepted so
//! far) and logs every attempt on the host's monotonic clock. Meanwhile the leader is
//! killed (SIGKILL), frozen (SIGSTOP for longer than the TTL, then SIGCONT) or stopped
//! (SIGTERM), or its command's supervisor is killed (SIGKILL), or `tenure run` is frozen
//! together with its supervisor, or frozen while its supervisor is killed (only the guard
//! beside them can stop the command then), as is now and then the
//! supervisor a follower keeps ready for its next term, or a follower itself is killed
//! (its standby supervisor must end with it within 2 s); with a server, its connection is cut, black-holed or slowed, the server
//! restarts, behind Sentinel (`--server redis --sentinel`) it fails over (forced, or a
//! killed primary), and the server refuses writes for a while as after a failover (Redis
//! `REPLICAOF` or `min-replicas-to-write`, PostgreSQL `default_transaction_read_only`,
//! MariaDB `read_only`); Redis is sometimes restarted from a snapshot taken a while
//! before, bringing back records of terms that have ended since. Now and then a second
//! process is given the leader's `--id`, and on SQLite (without `--slots`) the database is
//! deleted under its leader. At the end the history checker judges the log: one actor at a
//! time, counting every process of every term (I1), growing tokens (I2), no stale write
//! accepted (I3), a new leader within TTL + 1 s of a crash, a freeze or the end of a
//! refusal, and within 1 s of a stop (I4). A candidate that exits without being stopped
//! gave up campaigning (a refusal taken as final), which also fails the round, as does a
//! standby supervisor that outlives its killed `tenure run`.
//!
//! ```text
//! cargo build -p tenure-cli -p tenure-lab --bins
//! target/debug/tenure-torture --tenure target/debug/tenure --duration 60s
//! ```
//!
//! Exits 1 if any invariant was broken, 2 on bad arguments.

use std::collections::BTreeMap;
use std::io::Write;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitCode, Stdio};
use std::time::{Duration, Instant};

use rustix::process::{Pid, Signal};
use tenure_testkit::history::{self, Liveness, Record};
use tenure_testkit::proxy::{Mode, Proxy};
use tenure_testkit::servers::{self, Kind};

const ELECTION: &str = "torture/job";

fn now_ns() -> u64 {
    let t = rustix::time::clock_gettime(rustix::time::ClockId::Monotonic);
    t.tv_sec as u64 * 1_000_000_000 + t.tv_nsec as u64
}

fn parse_duration(s: &str) -> Option<Duration> {
    if let Some(ms) = s.strip_suffix("ms") {
        return ms.parse().ok().map(Duration::from_millis);
    }
    if let Some(m) = s.strip_suffix('m') {
        return m.parse::<u64>().ok().map(|m| Duration::from_secs(m * 60));
    }
    s.strip_suffix('s').unwrap_or(s).parse::<f64>().ok().map(Duration::from_secs_f64)
}

fn append(path: &Path, line: &str) {
    // One write of a short line to an O_APPEND file is atomic among processes.
    if let Ok(mut f) = std::fs::OpenOptions::new().append(true).create(true).open(path) {
        let _ = f.write_all(format!("{line}\n").as_bytes());
    }
}

/// What a probe does.
#[derive(Clone, Copy, PartialEq, Eq)]
enum ProbeMode {
    /// Writes until SIGTERM.
    Plain,
    /// Writes on after SIGTERM, as a careless worker does, until SIGKILL.
    IgnoreTerm,
    /// A slot's run (`TENURE_SLOT`): writes for `TORTURE_SLOT_RUN_MS`, logs the slot as
    /// started and done, and exits 0; a SIGTERM ends it early, unfinished.
    Slot,
    /// One link of a chain of forks: in a session of its own, it writes once, starts the
    /// next link 5 ms later and exits, so that each process lives a few milliseconds and
    /// no look over /proc keeps up with the chain (only a cgroup holds it).
    Chain,
}

/// The probe a candidate runs while it leads: it writes every 10 ms to the fenced file
/// and logs every attempt.
fn probe(dir: &Path, mode: ProbeMode) -> ExitCode {
    // The candidate process, as the torture round named it: two processes given one
    // `--id` (a fault of its own) are two actors.
    let holder = std::env::var("TORTURE_CAND").or_else(|_| std::env::var("TENURE_HOLDER")).unwrap_or_default();
    let token: u64 = std::env::var("TENURE_TOKEN").ok().and_then(|t| t.parse().ok()).unwrap_or(0);
    let slot: u64 = std::env::var("TENURE_SLOT").ok().and_then(|t| t.parse().ok()).unwrap_or(0);
    let run_for = std::env::var("TORTURE_SLOT_RUN_MS").ok().and_then(|t| t.parse().ok()).map(Duration::from_millis);
    let events = dir.join("events");
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let s = stop.clone();
    // SIGTERM: finish the current write, log, exit; or take it and go on.
    let _ = signal_hook_term(if mode == ProbeMode::IgnoreTerm { Default::default() } else { s });
    append(&events, &format!("start {holder} {token} {}", now_ns()));
    if mode == ProbeMode::Slot {
        append(&events, &format!("slot-start {holder} {token} {} {slot}", now_ns()));
    }
    if mode == ProbeMode::Chain {
        // The round is over: whatever is left of a chain ends here.
        if dir.join("chain-stop").exists() {
            return ExitCode::SUCCESS;
        }
        let _ = rustix::process::setsid();
        fenced_write(dir, &holder, token);
        std::thread::sleep(Duration::from_millis(5));
        if let Ok(me) = std::env::current_exe() {
            let _ = Command::new(me).args(["probe", "--dir"]).arg(dir).arg("--chain").stdin(Stdio::null()).spawn();
        }
        return ExitCode::SUCCESS;
    }
    let until = (mode == ProbeMode::Slot).then(|| Instant::now() + run_for.unwrap_or(Duration::from_millis(500)));
    while !stop.load(std::sync::atomic::Ordering::SeqCst) && until.is_none_or(|u| Instant::now() < u) {
        if !fenced_write(dir, &holder, token) {
            return ExitCode::from(1);
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    append(&events, &format!("stop {holder} {token} {}", now_ns()));
    if mode == ProbeMode::Slot {
        if stop.load(std::sync::atomic::Ordering::SeqCst) {
            return ExitCode::from(1);
        }
        append(&events, &format!("slot-done {holder} {token} {} {slot}", now_ns()));
    }
    ExitCode::SUCCESS
}

/// One write to the fenced file with `token` (refused below the highest token seen),
/// logged as accepted or rejected; `false` if the lock could not be taken.
fn fenced_write(dir: &Path, holder: &str, token: u64) -> bool {
    // With several holders, a fenced resource per holder index (docs/cli.md).
    let fence = match std::env::var("TENURE_HOLDERS").ok().and_then(|n| n.parse::<u32>().ok()) {
        Some(n) if n > 1 => format!("fence-{}", std::env::var("TENURE_HOLDER_INDEX").unwrap_or_default()),
        _ => "fence".to_string(),
    };
    let fence_path = dir.join(&fence);
    let Ok(lock) =
        std::fs::OpenOptions::new().create(true).truncate(false).write(true).open(dir.join(format!("{fence}.lock")))
    else {
        return false;
    };
    if rustix::fs::flock(&lock, rustix::fs::FlockOperation::LockExclusive).is_err() {
        return false;
    }
    let highest: u64 = std::fs::read_to_string(&fence_path).ok().and_then(|s| s.trim().parse().ok()).unwrap_or(0);
    let accepted = token >= highest;
    if accepted {
        let _ = std::fs::write(&fence_path, token.to_string());
    }
    let kind = if accepted { "accept" } else { "reject" };
    append(&dir.join("events"), &format!("{kind} {holder} {token} {}", now_ns()));
    true
}

/// Sets `flag` on SIGTERM, polling a signal in a thread (no unsafe handler needed).
fn signal_hook_term(flag: std::sync::Arc<std::sync::atomic::AtomicBool>) -> Option<()> {
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().ok()?;
    std::thread::spawn(move || {
        rt.block_on(async {
            if let Ok(mut term) = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
                term.recv().await;
                flag.store(true, std::sync::atomic::Ordering::SeqCst);
            }
        })
    });
    Some(())
}

struct Args {
    tenure: PathBuf,
    store: Option<String>,
    server: Option<Kind>,
    /// On moto: elect through DynamoDB instead of S3.
    dynamodb: bool,
    /// libfaketime, when candidates run with skewed clocks.
    skew: Option<PathBuf>,
    /// With `--server etcd` or `--server zookeeper`: a cluster of this many members instead
    /// of one server.
    members: usize,
    /// With `--server redis`: a primary, a replica and three sentinels, failed over.
    sentinel: bool,
    candidates: usize,
    duration: Duration,
    ttl: Duration,
    grace: Duration,
    seed: u64,
    /// The slot workload: candidates are `tenure schedule --every PERIOD`, and the round
    /// checks that no slot ran twice and none was lost, instead of leader takeover times.
    slots: Option<Duration>,
    /// Whether each leader's command also runs a chain of forks (see `ProbeMode::Chain`):
    /// where the host lets tenure make a cgroup for the command, which alone can stop one.
    chain: bool,
    /// Candidates run with `--holders N`: each holder index is an election of its own to
    /// the checker, and no more than N may believe they hold at once (I7).
    holders: u32,
}

/// How late a slot may run in the slot workload (`--catch-up`): longer than any
/// stretch without a leader the faults make, so that a lost slot is a violation.
const SLOT_CATCH_UP: Duration = Duration::from_secs(15);

fn parse_args(mut it: impl Iterator<Item = String>) -> Result<Args, String> {
    let mut a = Args {
        tenure: std::env::current_exe().ok().and_then(|p| p.parent().map(|d| d.join("tenure"))).unwrap_or_default(),
        store: None,
        server: None,
        dynamodb: false,
        skew: None,
        members: 1,
        sentinel: false,
        candidates: 4,
        duration: Duration::from_secs(60),
        ttl: Duration::from_secs(2),
        grace: Duration::from_millis(300),
        seed: 1,
        slots: None,
        chain: false,
        holders: 1,
    };
    while let Some(flag) = it.next() {
        let mut value = || it.next().ok_or(format!("{flag} needs a value"));
        match flag.as_str() {
            "--tenure" => a.tenure = PathBuf::from(value()?),
            "--store" => a.store = Some(value()?),
            "--server" => {
                a.server = Some(value()?.parse::<Kind>().map_err(|e| format!("--server: {e}"))?);
            }
            "--dynamodb" => a.dynamodb = true,
            "--sentinel" => a.sentinel = true,
            "--members" | "--etcd-members" => {
                a.members = value()?.parse().map_err(|e| format!("{flag}: {e}"))?;
            }
            "--candidates" => a.candidates = value()?.parse().map_err(|e| format!("--candidates: {e}"))?,
            "--duration" => a.duration = parse_duration(&value()?).ok_or("--duration: e.g. 60s or 10m")?,
            "--ttl" => a.ttl = parse_duration(&value()?).ok_or("--ttl: e.g. 2s")?,
            "--grace" => a.grace = parse_duration(&value()?).ok_or("--grace: e.g. 300ms")?,
            "--seed" => a.seed = value()?.parse().map_err(|e| format!("--seed: {e}"))?,
            "--slots" => a.slots = Some(parse_duration(&value()?).ok_or("--slots: a period, e.g. 1s")?),
            "--holders" => a.holders = value()?.parse().map_err(|e| format!("--holders: {e}"))?,
            "--skew" => {
                let lib = servers::libfaketime().ok_or("--skew needs libfaketime (Debian package faketime)")?;
                a.skew = Some(lib);
            }
            "-h" | "--help" => {
                return Err("usage: tenure-torture [--tenure PATH] [--store URL | --server postgres|redis|mariadb|etcd|nats|azurite|moto [--dynamodb]|fake-gcs|zookeeper] [--candidates 4] [--duration 60s] \
                            [--members 3] [--sentinel] [--ttl 2s] [--grace 300ms] [--seed N] [--skew] [--slots PERIOD | --holders N]\n       tenure-torture probe --dir DIR [--ignore-term | --slot]"
                    .into());
            }
            other => return Err(format!("unknown argument {other:?}; see --help")),
        }
    }
    if !a.tenure.is_file() {
        return Err(format!(
            "no tenure binary at {}; build it (cargo build -p tenure-cli) or pass --tenure PATH",
            a.tenure.display()
        ));
    }
    if a.candidates < 2 {
        return Err("--candidates must be at least 2".into());
    }
    if a.holders == 0 || (a.holders > 1 && a.slots.is_some()) {
        return Err("--holders must be at least 1, and does not go with --slots".into());
    }
    if a.members != 1 && (!matches!(a.server, Some(Kind::Etcd | Kind::ZooKeeper)) || a.members < 3) {
        return Err("--members needs --server etcd or zookeeper and at least 3 members".into());
    }
    if a.sentinel && a.server != Some(Kind::Redis) {
        return Err("--sentinel needs --server redis".into());
    }
    // Without a cgroup, nothing stops such a chain once `tenure run` and its supervisor
    // are both disabled (docs/safety.md): it runs only where one can be made.
    // Nor under skewed clocks: each link of the chain is a new process, whose faked clock
    // starts afresh, and its times would not compare with the long-lived probes'.
    a.chain = a.slots.is_none() && a.skew.is_none() && tenure_testkit::servers::cgroups_can_be_made().is_some();
    Ok(a)
}

struct Candidate {
    id: String,
    /// The `--id` it was given: its own id, or another live candidate's.
    name: String,
    child: Child,
    frozen_until: Option<Instant>,
    /// The command's supervisor, frozen together with `tenure run` (thawed with it).
    frozen_supervisor: Option<Pid>,
    /// Its own way to the server (server stores only), and when a network fault on it ends.
    proxy: Option<Proxy>,
    network_fault_until: Option<Instant>,
}

/// The supervisor `tenure run` (process `parent`) runs its command under, or, with
/// `standby`, the one it keeps ready while it follows: its live child `tenure __child
/// PARENT DEADLINE_FILE …`, which has started the command once `DEADLINE_FILE.started`
/// exists.
fn supervisor_of(parent: u32, standby: bool) -> Option<Pid> {
    for entry in std::fs::read_dir("/proc").ok()?.flatten() {
        let Some(pid) = entry.file_name().to_str().and_then(|n| n.parse::<i32>().ok()) else { continue };
        let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else { continue };
        let ppid = stat.rsplit_once(')').and_then(|(_, rest)| rest.split_whitespace().nth(1)?.parse::<u32>().ok());
        let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
        let zombie = stat.rsplit_once(')').and_then(|(_, rest)| rest.split_whitespace().next()) == Some("Z");
        let args: Vec<&[u8]> = cmdline.split(|b| *b == 0).collect();
        let Some(at) = args.iter().position(|a| *a == b"__child") else { continue };
        let started = args
            .get(at + 2)
            .map(|f| Path::new(std::ffi::OsStr::from_bytes(f)).with_extension("started"))
            .is_some_and(|m| m.exists());
        if ppid == Some(parent) && !zombie && started != standby {
            return Pid::from_raw(pid);
        }
    }
    None
}

/// The guard (`tenure __guard`) that `tenure run` (process `parent`) runs beside its
/// supervisor, if one runs.
fn guard_of(parent: u32) -> Option<Pid> {
    for entry in std::fs::read_dir("/proc").ok()?.flatten() {
        let Some(pid) = entry.file_name().to_str().and_then(|n| n.parse::<i32>().ok()) else { continue };
        let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else { continue };
        let mut rest = stat.rsplit_once(')').map(|(_, r)| r.split_whitespace()).into_iter().flatten();
        let (state, ppid) = (rest.next(), rest.next().and_then(|p| p.parse::<u32>().ok()));
        let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
        if ppid == Some(parent) && state != Some("Z") && cmdline.split(|b| *b == 0).any(|a| a == b"__guard") {
            return Pid::from_raw(pid);
        }
    }
    None
}

/// Whether process `pid` still runs and is still a supervisor (`tenure __child`): a
/// zombie has ended, and a pid taken again by another process is not it.
fn running_supervisor(pid: Pid) -> bool {
    let alive = std::fs::read_to_string(format!("/proc/{}/stat", pid.as_raw_pid())).is_ok_and(|stat| {
        !matches!(stat.rsplit_once(')').and_then(|(_, rest)| rest.split_whitespace().next()), Some("Z" | "X"))
    });
    let cmdline = std::fs::read(format!("/proc/{}/cmdline", pid.as_raw_pid())).unwrap_or_default();
    alive && cmdline.split(|b| *b == 0).any(|a| a == b"__child")
}

fn signal(child: &Child, sig: Signal) {
    if let Some(pid) = Pid::from_raw(child.id() as i32) {
        let _ = rustix::process::kill_process(pid, sig);
    }
}

/// The clock skew of candidate `n` with `--skew`: alternately 0.5 % slow and 2 h ahead,
/// 0.5 % fast and 90 min behind (monotonic clocks included), within the default 1 % bound.
/// With `--slots`, a few hundred milliseconds ahead and behind instead: the hosts' wall
/// clocks name the slots, and hours apart they would not agree on which is due, as
/// hosts under NTP do.
fn skew_of(n: usize, slots: bool) -> &'static str {
    match (slots, n.is_multiple_of(2)) {
        (false, true) => "+2h x0.995",
        (false, false) => "-90m x1.005",
        (true, true) => "+0.4 x0.995",
        (true, false) => "-0.3 x1.005",
    }
}

/// The store URL for a throwaway server; the emulators' credentials go in the environment
/// ([`emulator_env`]).
fn store_url(s: &servers::Server, dynamodb: bool) -> String {
    match s.kind() {
        Kind::Moto if dynamodb => format!("dynamodb://torture?endpoint={}", s.url()),
        Kind::Moto => format!("s3://torture?endpoint={}", s.url()),
        Kind::FakeGcs => format!("gs://torture?endpoint={}&project=torture", s.url()),
        Kind::Azurite => format!("azblob://devstoreaccount1/torture?endpoint={}", s.url()),
        _ => s.url(),
    }
}

/// Credentials the emulators accept: any AWS key for moto, the published development
/// account for Azurite.
fn emulator_env(cmd: &mut Command) {
    cmd.env("AWS_ACCESS_KEY_ID", "torture")
        .env("AWS_SECRET_ACCESS_KEY", "torture")
        .env("AZURE_STORAGE_CONNECTION_STRING", "UseDevelopmentStorage=true");
}

/// Starts candidate `id` (its probes log that name) as `tenure run --id NAME`.
fn spawn(a: &Args, store: &str, dir: &Path, id: &str, name: &str, n: usize) -> std::io::Result<Child> {
    let me = std::env::current_exe()?;
    let mut cmd = Command::new(&a.tenure);
    if a.server.is_some() {
        emulator_env(&mut cmd);
    }
    if let Some(lib) = &a.skew {
        cmd.env("LD_PRELOAD", lib).env("FAKETIME", skew_of(n, a.slots.is_some()));
    }
    // The command is a tree that leaves its process group and session, and ignores SIGTERM;
    // one probe is the child of a process whose main thread has ended while another
    // thread waits for the probe (it shows as a zombie in /proc).
    let ends_main = "import ctypes, subprocess, sys, threading\n\
        threading.Thread(target=subprocess.run, args=(sys.argv[1:],)).start()\n\
        ctypes.CDLL(None).pthread_exit(None)";
    let tree = r#"P="$0"; D="$1"
"$P" probe --dir "$D" --ignore-term &
setsid "$P" probe --dir "$D" --ignore-term &
setsid python3 -c "$ENDS_MAIN" "$P" probe --dir "$D" --ignore-term &
[ -n "$CHAIN" ] && "$P" probe --dir "$D" --chain &
timeout 600 "$P" probe --dir "$D"
wait"#;
    // A slot's run: a probe that works for a while and ends (logging the slot), and one in
    // a session of its own that ignores SIGTERM, which the supervisor must stop once the
    // run has ended.
    let slot_tree = r#"P="$0"; D="$1"
setsid "$P" probe --dir "$D" --ignore-term &
"$P" probe --dir "$D" --slot"#;
    let (ttl, grace) = (format!("{}ms", a.ttl.as_millis()), format!("{}ms", a.grace.as_millis()));
    match a.slots {
        None => {
            cmd.args(["run", ELECTION, "--store", store, "--id", name, "--ttl", &ttl, "--grace", &grace]);
            if a.holders > 1 {
                cmd.args(["--holders", &a.holders.to_string()]);
            }
            if a.chain {
                // A health check that, once a term, leaves a probe behind in a session of
                // its own: it counts as the command's, and must stop with it (the
                // command's cgroup holds it, as it holds the chain).
                let check = format!(
                    r#"M="{d}/check-$TORTURE_CAND-$TENURE_TOKEN"; [ -e "$M" ] || {{ : > "$M"; setsid "{me}" probe --dir "{d}" --ignore-term & }}"#,
                    d = dir.display(),
                    me = me.display()
                );
                cmd.args(["--health-cmd", &check, "--health-interval", "300ms", "--health-retries", "1000"]);
            }
            cmd.args(["--", "sh", "-c", tree]);
        }
        Some(period) => {
            let catch_up = format!("{}ms", SLOT_CATCH_UP.as_millis());
            cmd.args(["schedule", ELECTION, "--store", store, "--id", name, "--ttl", &ttl, "--grace", &grace])
                .args(["--every", &format!("{}ms", period.as_millis()), "--catch-up", &catch_up])
                .args(["--", "sh", "-c", slot_tree])
                // A run short beside the period: each slot also costs a claim, a process
                // tree and a completion (a few hundred milliseconds on a busy machine), and
                // a leader behind after an outage must catch up faster than slots fall due.
                .env("TORTURE_SLOT_RUN_MS", (period.as_millis() / 10).to_string());
        }
    }
    // The slot workload reads the candidates' logs for the slots they marked done.
    let log = if a.slots.is_some() { "warn,tenure=info" } else { "warn" };
    cmd.arg(me)
        .arg(dir)
        .env("ENDS_MAIN", ends_main)
        .env("CHAIN", if a.chain { "1" } else { "" })
        .env("TENURE_CGROUP", if a.chain { "on" } else { "off" })
        .env("TORTURE_CAND", id)
        .env("RUST_LOG", std::env::var("TORTURE_RUST_LOG").unwrap_or_else(|_| log.into()))
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(dir.join(format!("{id}.log")))?)
        .spawn()
}

/// Makes the server refuse writes, as after a failover, or serve again: for the servers
/// that can be told to, through their own command-line clients. Returns what it did.
fn refuse_writes(server: &servers::Server, on: bool, rng: &mut fastrand::Rng) -> Option<&'static str> {
    let run = |program: &str, args: &[&str]| -> Option<()> {
        let p = servers::find_program(program)?;
        let out = Command::new(p).args(args).output().ok()?;
        if !out.status.success() {
            eprintln!("torture: {program} {args:?}: {}", String::from_utf8_lossy(&out.stderr));
        }
        out.status.success().then_some(())
    };
    let port = server.port().to_string();
    match server.kind() {
        Kind::Redis => {
            let cli = |args: &[&str]| {
                let mut all = vec!["-h", "127.0.0.1", "-p", &port];
                all.extend_from_slice(args);
                run("redis-cli", &all)
            };
            if !on {
                cli(&["REPLICAOF", "NO", "ONE"])?;
                cli(&["CONFIG", "SET", "min-replicas-to-write", "0"])?;
                return Some("writes taken again");
            }
            if rng.bool() {
                cli(&["REPLICAOF", "127.0.0.1", "1"]).map(|_| "Redis READONLY (REPLICAOF, a failed-over primary)")
            } else {
                cli(&["CONFIG", "SET", "min-replicas-to-write", "1"])
                    .map(|_| "Redis NOREPLICAS (min-replicas-to-write)")
            }
        }
        Kind::Postgres => {
            let url = server.url();
            let set = format!("ALTER SYSTEM SET default_transaction_read_only = {}", if on { "on" } else { "off" });
            run("psql", &["-q", &url, "-c", &set, "-c", "SELECT pg_reload_conf()"])
                .map(|_| "PostgreSQL read-only (default_transaction_read_only)")
        }
        Kind::MariaDb => {
            let set = format!("SET GLOBAL read_only = {}", if on { "ON" } else { "OFF" });
            let client = if servers::find_program("mariadb").is_some() { "mariadb" } else { "mysql" };
            run(client, &["-h", "127.0.0.1", "-P", &port, "-u", "root", "-e", &set]).map(|_| "MariaDB read_only")
        }
        _ => None,
    }
}

/// Whether [`refuse_writes`] can work on `kind`.
fn can_refuse(kind: Kind) -> bool {
    matches!(kind, Kind::Redis | Kind::Postgres | Kind::MariaDb)
}

/// On MariaDB, a user without the privileges that bypass `read_only`, as applications
/// have: the candidates connect as it.
fn mariadb_app_url(server: &servers::Server) -> Result<String, String> {
    let client = servers::find_program("mariadb")
        .or_else(|| servers::find_program("mysql"))
        .ok_or("the mariadb client is not installed")?;
    let port = server.port().to_string();
    let sql = "CREATE USER IF NOT EXISTS 'torture'@'127.0.0.1' IDENTIFIED BY 'torture'; \
               GRANT ALL PRIVILEGES ON mysql.* TO 'torture'@'127.0.0.1'";
    let out = Command::new(client)
        .args(["-h", "127.0.0.1", "-P", &port, "-u", "root", "-e", sql])
        .output()
        .map_err(|e| format!("cannot run the mariadb client: {e}"))?;
    if !out.status.success() {
        return Err(format!("cannot create the torture user: {}", String::from_utf8_lossy(&out.stderr)));
    }
    Ok(format!("mysql://torture:torture@127.0.0.1:{port}/mysql"))
}

/// Counts a fault and writes it, with the time, to `DIR/faults`: the timeline kept with
/// the logs when a check fails.
fn note<'a>(faults: &mut BTreeMap<&'a str, u32>, dir: &Path, what: &'a str) {
    *faults.entry(what).or_default() += 1;
    append(&dir.join("faults"), &format!("{} {what}", now_ns()));
}

/// The holder whose probe started last: the leader as far as the log tells.
fn current_leader(events: &Path) -> Option<String> {
    let text = std::fs::read_to_string(events).ok()?;
    text.lines().rev().find(|l| l.starts_with("start ")).and_then(|l| l.split(' ').nth(1)).map(String::from)
}

fn percentile(sorted: &[u64], p: f64) -> Duration {
    if sorted.is_empty() {
        return Duration::ZERO;
    }
    Duration::from_nanos(sorted[((sorted.len() - 1) as f64 * p).round() as usize])
}

fn torture(a: Args) -> Result<bool, String> {
    let tmp = tempfile::tempdir().map_err(|e| format!("cannot create a temporary directory: {e}"))?;
    let dir = tmp.path().to_path_buf();
    // An etcd cluster or ZooKeeper ensemble whose members are killed, paused and restarted:
    // candidates reach all of them directly (no proxy), and the faults hit members, not
    // connections.
    let (mut cluster, cluster_url) = match (a.members, a.server) {
        (1, _) => (None, String::new()),
        (n, Some(Kind::ZooKeeper)) => {
            let e = servers::ZkEnsemble::launch(n).ok_or("ZooKeeper is not installed")?;
            let url = e.url();
            (Some(e.members), url)
        }
        (n, _) => {
            let c = servers::EtcdCluster::launch(n).ok_or("etcd is not installed")?;
            let url = c.url();
            (Some(c.members), url)
        }
    };
    // Redis behind Sentinel, failed over (forced, or a killed primary) as the faults:
    // candidates find the primary through the sentinels (no proxy).
    let mut sentinels =
        if a.sentinel { Some(servers::RedisSentinels::launch().ok_or("redis-server is not installed")?) } else { None };
    // A throwaway server, restarted now and then as one more fault.
    let mut server = match a.server {
        Some(_) if cluster.is_some() || sentinels.is_some() => None,
        Some(kind) => Some(servers::launch(kind).ok_or("the server binary is not installed")?),
        None => None,
    };
    let store = match (&a.store, &server) {
        (Some(url), _) => url.clone(),
        (None, None) if cluster.is_some() => cluster_url.clone(),
        (None, None) if sentinels.is_some() => sentinels.as_ref().map(servers::RedisSentinels::url).unwrap_or_default(),
        (None, Some(s)) if s.kind() == Kind::MariaDb => mariadb_app_url(s)?,
        (None, Some(s)) => store_url(s, a.dynamodb),
        (None, None) => format!("sqlite:{}", dir.join("store.db").display()),
    };
    let events = dir.join("events");
    // Not under slots: deleting the database deletes the work ledger, and with it which
    // slots ran (the user's data, lost), so slots would run again by right.
    let sqlite_file =
        store.strip_prefix("sqlite:").filter(|_| a.store.is_none() && a.slots.is_none()).map(PathBuf::from);
    let mut rng = fastrand::Rng::with_seed(a.seed);
    // Faults added later draw from streams of their own, so that a seed still gives the
    // sequence it gave before they were added.
    let mut guard_rng = fastrand::Rng::with_seed(a.seed ^ 0x0067_7561_7264);
    let mut next = 0;
    let mut cands: Vec<Candidate> = Vec::new();
    let server_port = server.as_ref().map(|s| s.port());
    let mut add = |cands: &mut Vec<Candidate>, name: Option<String>| -> Result<(), String> {
        next += 1;
        let id = format!("cand-{next}");
        let name = name.unwrap_or_else(|| id.clone());
        // With a server, each candidate reaches it through a proxy of its own.
        let (proxy, url) = match server_port {
            Some(port) => {
                let p = Proxy::start(("127.0.0.1", port)).map_err(|e| format!("cannot start a proxy: {e}"))?;
                let url = store.replacen(&format!(":{port}"), &format!(":{}", p.port()), 1);
                (Some(p), url)
            }
            None => (None, store.clone()),
        };
        let child = spawn(&a, &url, &dir, &id, &name, next).map_err(|e| format!("cannot start tenure run: {e}"))?;
        cands.push(Candidate {
            id,
            name,
            child,
            frozen_until: None,
            frozen_supervisor: None,
            proxy,
            network_fault_until: None,
        });
        Ok(())
    };
    for _ in 0..a.candidates {
        add(&mut cands, None)?;
    }
    println!(
        "torture: {} candidates on {store}, TTL {:?}, grace {:?}, for {:?} (seed {}){}",
        a.candidates,
        a.ttl,
        a.grace,
        a.duration,
        a.seed,
        if a.holders > 1 {
            format!(", --holders {} (liveness not judged; at most {} at once)", a.holders, a.holders)
        } else {
            String::new()
        }
    );
    if a.skew.is_some() {
        let slots = a.slots.is_some();
        println!(
            "clock skew          candidates alternate {} and {} (libfaketime)",
            skew_of(0, slots),
            skew_of(1, slots)
        );
    }
    let started = Instant::now();
    let started_wall = std::time::SystemTime::now();
    let mut records: Vec<Record> = Vec::new();
    let mut faults: BTreeMap<&str, u32> = BTreeMap::new();
    let mut restart_times: Vec<u64> = Vec::new();
    // While the server refuses writes: until when.
    let mut refusing_until: Option<Instant> = None;
    // A backup of the SQLite database, taken at some moment, to restore into it later,
    // and how many candidates had been started then.
    let mut backup_taken = false;
    let mut started_at_backup = 0;
    // A paused cluster member, and when it is thawed.
    let mut member_paused: Option<(usize, Instant)> = None;
    // The paused member is also cut off from the others (see `servers::cut_off`): when
    // it is thawed, it wakes alone for a moment (the others paused), so that, were it the
    // leader, it answers keep-alives from a stale copy of its leases, and then all run.
    let mut member_cut: Option<servers::PeerCut> = None;
    // The server stalled in bursts (see `servers::stutter`), and until when; and every
    // stretch of time it was (ns), in which no takeover is judged.
    let mut starved: Option<(servers::Stuttering, Instant)> = None;
    let mut starved_times: Vec<(u64, u64)> = Vec::new();
    // Candidates that exited without being stopped (tenure run must campaign on).
    let mut gave_up = 0usize;
    // Standby supervisors still running 2 s after their `tenure run` was killed.
    let mut outlived = 0usize;
    while started.elapsed() < a.duration {
        std::thread::sleep(a.ttl.mul_f64(0.75 + 1.5 * rng.f64()));
        if let Some(s) = server.as_ref()
            && refusing_until.is_some_and(|t| Instant::now() >= t)
        {
            refuse_writes(s, false, &mut rng).ok_or("cannot make the server take writes again")?;
            refusing_until = None;
            records.push(Record::Recovered { election: ELECTION.into(), at: now_ns() });
            append(&dir.join("faults"), &format!("{} writes taken again", now_ns()));
        }
        if starved.as_ref().is_some_and(|(_, until)| Instant::now() >= *until) {
            starved = None;
            // It ends now, which may be well after it was meant to (the loop sleeps first).
            if let Some((_, to)) = starved_times.last_mut() {
                *to = now_ns();
            }
            append(&dir.join("faults"), &format!("{} server fed again", now_ns()));
        }
        // Thaw candidates whose freeze is over; heal their network.
        for c in cands.iter_mut() {
            if c.frozen_until.is_some_and(|t| Instant::now() >= t) {
                signal(&c.child, Signal::CONT);
                if let Some(s) = c.frozen_supervisor.take() {
                    let _ = rustix::process::kill_process(s, Signal::CONT);
                }
                c.frozen_until = None;
            }
            if c.network_fault_until.is_some_and(|t| Instant::now() >= t) {
                if let Some(p) = &c.proxy {
                    p.set(Mode::Pass);
                }
                c.network_fault_until = None;
            }
        }
        // Cluster members: thaw a paused one; now and then kill one (the leader member
        // among them) and start it again, or pause one for longer than the TTL.
        if let Some(c) = cluster.as_mut() {
            if let Some((i, until)) = member_paused
                && Instant::now() >= until
            {
                if let Some(cut) = member_cut.take() {
                    let others: Vec<usize> = (0..c.len()).filter(|&j| j != i).collect();
                    others.iter().for_each(|&j| c[j].pause());
                    c[i].resume();
                    std::thread::sleep(a.ttl / 10);
                    drop(cut);
                    others.iter().for_each(|&j| c[j].resume());
                } else {
                    c[i].resume();
                }
                member_paused = None;
                append(&dir.join("faults"), &format!("{} member {i} thawed", now_ns()));
            }
            if member_paused.is_none() && rng.usize(0..3) == 0 {
                let i = rng.usize(0..c.len());
                restart_times.push(now_ns());
                let pause = a.ttl.mul_f64(1.2 + 1.3 * rng.f64());
                match rng.usize(0..3) {
                    0 => {
                        c[i].kill();
                        c[i].start();
                        note(&mut faults, &dir, "member killed and restarted");
                    }
                    1 => {
                        c[i].pause();
                        member_paused = Some((i, Instant::now() + pause));
                        note(&mut faults, &dir, "member paused");
                    }
                    _ => {
                        c[i].pause();
                        member_paused = Some((i, Instant::now() + pause));
                        if a.server != Some(Kind::ZooKeeper) {
                            member_cut = Some(servers::cut_off(c, i).ok_or("cannot cut a member off")?);
                            note(&mut faults, &dir, "member paused and cut off");
                        } else {
                            note(&mut faults, &dir, "member paused");
                        }
                    }
                }
                continue;
            }
        }
        // Behind Sentinel: now and then a failover, forced (`SENTINEL FAILOVER`: the old
        // primary takes writes until the sentinels demote it) or after the primary is
        // killed (it comes back as a replica). Either can lose the newest writes.
        if let Some(g) = sentinels.as_mut()
            && rng.usize(0..3) == 0
        {
            restart_times.push(now_ns());
            if rng.bool() {
                g.failover();
                note(&mut faults, &dir, "Sentinel failover (forced)");
            } else {
                let old = g.primary_port().ok_or("the sentinels name no primary")?;
                g.primary().kill();
                g.wait_for_new_primary(old);
                if let Some(n) = g.nodes.iter_mut().find(|n| n.port() == old) {
                    n.start();
                }
                note(&mut faults, &dir, "Sentinel failover (primary killed)");
            }
            g.wait_settled();
            // The new primary's guard holds grants back for a TTL from now.
            restart_times.push(now_ns());
            continue;
        }
        // A candidate that exited on its own gave up campaigning, which no fault here
        // excuses: it fails the round (after a replacement keeps the election going).
        let before = cands.len();
        cands.retain_mut(|c| !matches!(c.child.try_wait(), Ok(Some(_))));
        for _ in cands.len()..before {
            gave_up += 1;
            append(&dir.join("faults"), &format!("{} a candidate exited on its own", now_ns()));
            add(&mut cands, None)?;
        }
        // moto keeps everything in memory: its restart would wipe the store, which no real
        // S3 or DynamoDB does, so it is not one of the faults there. Nor on MariaDB and
        // Redis while they refuse writes: they do not keep the refusal across a restart,
        // so a leader would be elected before the refusal was over, and no election
        // would follow it. (PostgreSQL keeps it: `ALTER SYSTEM`.)
        if let Some(s) = server.as_mut()
            && s.kind() != Kind::Moto
            && rng.usize(0..5) == 0
            && (refusing_until.is_none() || s.kind() == Kind::Postgres)
        {
            // The outage starts now: a server can take seconds to stop (Redis waits up to
            // its shutdown-timeout with clients paused when it refuses writes).
            restart_times.push(now_ns());
            let snapshot = s.data_dir().join("older.rdb");
            if s.kind() == Kind::Redis && snapshot.exists() && rng.bool() {
                // A crash, and a start from a snapshot taken a while ago: records of terms
                // that have ended since come back.
                s.kill();
                let dump = s.data_dir().join("dump.rdb");
                std::fs::copy(&snapshot, &dump).map_err(|e| format!("cannot restore the snapshot: {e}"))?;
                s.start();
                // Later plain restarts lose everything again.
                let _ = std::fs::remove_file(dump);
                note(&mut faults, &dir, "Redis restart from an older snapshot");
            } else {
                s.restart();
                note(&mut faults, &dir, "server restart");
            }
            continue;
        }
        // The emulators, whose conditional writes are what keeps two candidates from
        // one grant: now and then the server is stalled in bursts, cut off in the midst
        // of its requests, for longer than the TTL. Grants slow down; none may be given
        // twice. (Under a loaded CI machine moto once granted one vacancy twice this way.)
        if let Some(s) = server.as_ref()
            && matches!(s.kind(), Kind::Moto | Kind::Azurite | Kind::FakeGcs)
            && starved.is_none()
            && rng.usize(0..5) == 0
        {
            let pid = s.pid().ok_or("the server does not run")?;
            // Stalled in bursts (SIGSTOP), which takes no CPU from the rest of the machine;
            // the emulators' own tests pin them beside busy loops instead.
            let guard = servers::stutter(pid).map_err(|e| format!("cannot stall the server: {e}"))?;
            let lasts = a.ttl.mul_f64(1.2 + 1.3 * rng.f64());
            starved = Some((guard, Instant::now() + lasts));
            // Its requests take long: a takeover meanwhile may too.
            // Until fed again (the end is set then; at the end of the round if never).
            starved_times.push((now_ns(), u64::MAX));
            note(&mut faults, &dir, "server stalled in bursts");
            continue;
        }
        // Redis: now and then a snapshot, which a later restart may bring back.
        if let Some(s) = server.as_ref()
            && s.kind() == Kind::Redis
            && rng.usize(0..3) == 0
        {
            let saved = Command::new(servers::find_program("redis-cli").ok_or("redis-cli is not installed")?)
                .args(["-h", "127.0.0.1", "-p", &s.port().to_string(), "SAVE"])
                .output()
                .is_ok_and(|o| o.status.success());
            let dump = s.data_dir().join("dump.rdb");
            if saved && dump.exists() {
                let _ = std::fs::rename(dump, s.data_dir().join("older.rdb"));
            }
        }
        // The server refuses writes for longer than a TTL, as a primary does after a
        // failover: every leader steps down, and none may give up campaigning.
        if let Some(s) = server.as_ref()
            && can_refuse(s.kind())
            && refusing_until.is_none()
            && rng.usize(0..5) == 0
        {
            let what = refuse_writes(s, true, &mut rng).ok_or("cannot make the server refuse writes")?;
            refusing_until = Some(Instant::now() + a.ttl.mul_f64(1.2 + 1.3 * rng.f64()));
            // Like a restart, it keeps any candidate from being elected while it lasts.
            restart_times.push(now_ns());
            note(&mut faults, &dir, what);
            continue;
        }
        // The database deleted under its leader (SQLite, the default store): the leader
        // must step down, and a fresh file must never grant a token already used. Half the
        // time the database alone (`rm e.db`), its -wal and -shm left in use by the old
        // file's processes: the new file must share neither with them.
        if sqlite_file.as_ref().is_some_and(|f| f.exists()) && rng.usize(0..10) == 0 {
            let file = sqlite_file.as_ref().expect("checked");
            let alone = rng.bool();
            let suffixes: &[&str] = if alone { &[""] } else { &["", "-wal", "-shm"] };
            for suffix in suffixes {
                let mut p = file.clone().into_os_string();
                p.push(suffix);
                let _ = std::fs::remove_file(p);
            }
            // The leader steps down and nobody leads until someone opens a new file.
            restart_times.push(now_ns());
            note(&mut faults, &dir, if alone { "SQLite database deleted alone" } else { "SQLite database deleted" });
            continue;
        }
        // A backup restored into the database in place (SQLite's `.restore` keeps the
        // file): terms that ended come back in it, and must neither run again beside the
        // leader of the moment nor bring back their tokens.
        if let Some(file) = sqlite_file.as_ref().filter(|f| f.exists())
            && rng.usize(0..10) == 0
        {
            let backup = dir.join("backup.db");
            // Only a process that has seen a later state of the file can tell it went
            // back (docs/stores/sqlite.md): not one frozen since before the backup, nor one
            // started since. Restores wait for a moment with neither.
            let number = |c: &Candidate| c.id.trim_start_matches("cand-").parse::<usize>().unwrap_or(usize::MAX);
            let newest = cands.iter().map(number).max().unwrap_or(0);
            let all_saw_later = newest <= started_at_backup && cands.iter().all(|c| c.frozen_until.is_none());
            if !backup_taken {
                let _ = std::fs::remove_file(&backup);
                backup_taken = sqlite_backup(file, &backup).is_ok();
                started_at_backup = cands.iter().map(number).max().unwrap_or(0);
            } else if all_saw_later && sqlite_restore(file, &backup).is_ok() {
                backup_taken = false;
                restart_times.push(now_ns());
                note(&mut faults, &dir, "SQLite backup restored into the database");
            }
            continue;
        }
        let Some(leader) = current_leader(&events) else {
            continue;
        };
        // A second process given the leader's `--id` (`--id $(hostname)` on two hosts
        // with one name, a copied configuration): it must not lead while the leader lives.
        if rng.usize(0..10) == 0
            && cands.len() < a.candidates + 2
            && let Some(name) = cands.iter().find(|c| c.id == leader).map(|c| c.name.clone())
        {
            add(&mut cands, Some(name))?;
            note(&mut faults, &dir, "a second process given the leader's --id");
            continue;
        }
        // A follower's standby supervisor is killed: the follower starts nothing for it,
        // and still starts its command, afresh, when its term comes.
        if rng.usize(0..6) == 0
            && let Some((parent, standby)) = cands
                .iter()
                .filter(|c| c.id != leader)
                .find_map(|c| supervisor_of(c.child.id(), true).map(|s| (c.child.id(), s)))
        {
            // Held still while it is looked at again: a follower just elected may have
            // told it to start meanwhile, and then it is a leader's supervisor.
            let _ = rustix::process::kill_process(standby, Signal::STOP);
            if supervisor_of(parent, true) == Some(standby) {
                let _ = rustix::process::kill_process(standby, Signal::KILL);
                note(&mut faults, &dir, "standby supervisor SIGKILL");
            } else {
                let _ = rustix::process::kill_process(standby, Signal::CONT);
            }
            continue;
        }
        // A follower is killed (SIGKILL): the supervisor it kept ready must end with it,
        // having started nothing, and a new candidate takes its place.
        if rng.usize(0..10) == 0
            && let Some(j) = cands.iter().position(|c| c.id != leader && c.frozen_until.is_none())
        {
            let standby = supervisor_of(cands[j].child.id(), true);
            let mut c = cands.remove(j);
            signal(&c.child, Signal::KILL);
            let _ = c.child.wait();
            // It may have won since the leader was looked up, and then its lease blocks
            // the election until it expires: like a restart, this widens the bound on the
            // next election after a stop that falls around it.
            restart_times.push(now_ns());
            note(&mut faults, &dir, "follower SIGKILL");
            if let Some(s) = standby {
                let gone_by = Instant::now() + Duration::from_secs(2);
                while running_supervisor(s) && Instant::now() < gone_by {
                    std::thread::sleep(Duration::from_millis(10));
                }
                if running_supervisor(s) {
                    outlived += 1;
                    let _ = rustix::process::kill_process(s, Signal::KILL);
                }
            }
            add(&mut cands, None)?;
            continue;
        }
        let Some(i) =
            cands.iter().position(|c| c.id == leader && c.frozen_until.is_none() && c.network_fault_until.is_none())
        else {
            continue;
        };
        let at = now_ns();
        let kinds = if server_port.is_some() { 8 } else { 5 };
        match rng.usize(0..kinds) {
            k if k == kinds - 2 => {
                // `tenure run` and its supervisor disabled together: both frozen, or
                // `tenure run` frozen and the supervisor killed. Neither can stop the
                // command: the guard beside them must, by the deadline.
                let Some(supervisor) = supervisor_of(cands[i].child.id(), false) else { continue };
                // A third of the time its guard was killed a moment before: `tenure run`
                // must have started another, or the pair leaves nobody to stop the command.
                let guard_killed = guard_rng.usize(0..3) == 0
                    && guard_of(cands[i].child.id()).is_some_and(|g| {
                        let _ = rustix::process::kill_process(g, Signal::KILL);
                        std::thread::sleep(Duration::from_millis(200));
                        true
                    });
                let c = &mut cands[i];
                signal(&c.child, Signal::STOP);
                c.frozen_until = Some(Instant::now() + a.ttl.mul_f64(1.2 + 1.3 * rng.f64()));
                if rng.bool() {
                    let _ = rustix::process::kill_process(supervisor, Signal::STOP);
                    c.frozen_supervisor = Some(supervisor);
                    note(&mut faults, &dir, "SIGSTOP to tenure run and its supervisor");
                } else {
                    let _ = rustix::process::kill_process(supervisor, Signal::KILL);
                    note(&mut faults, &dir, "SIGSTOP to tenure run, SIGKILL to its supervisor");
                }
                if guard_killed {
                    note(&mut faults, &dir, "SIGKILL to the guard 200 ms before the pair");
                }
                records.push(Record::Stop { election: ELECTION.into(), holder: c.id.clone(), at, graceful: false });
            }
            k if k == kinds - 1 => {
                // The leader's supervisor is killed (the OOM killer, an operator's
                // `kill -9`): the command's processes come to `tenure run`, which must stop
                // them all before it lets the lease go, and then ends with the command's
                // code. Not before the command has started.
                // A term that was ending anyway campaigns on instead: then it stays.
                let Some(supervisor) = supervisor_of(cands[i].child.id(), false) else { continue };
                let _ = rustix::process::kill_process(supervisor, Signal::KILL);
                note(&mut faults, &dir, "supervisor SIGKILL");
                let gone_by = Instant::now() + a.ttl * 3;
                while Instant::now() < gone_by && matches!(cands[i].child.try_wait(), Ok(None)) {
                    std::thread::sleep(Duration::from_millis(10));
                }
                if matches!(cands[i].child.try_wait(), Ok(Some(_))) {
                    let c = cands.remove(i);
                    records.push(Record::Stop { election: ELECTION.into(), holder: c.id, at, graceful: false });
                    add(&mut cands, None)?;
                }
            }
            3 | 4 => {
                // The leader loses the store: a cut (connections closed, refused) or a
                // black hole (nothing answers), for longer than the TTL.
                let c = &mut cands[i];
                let (mode, name) = if rng.bool() {
                    (Mode::Cut, "partition (cut)")
                } else {
                    (Mode::BlackHole, "partition (black hole)")
                };
                if let Some(p) = &c.proxy {
                    p.set(mode);
                }
                c.network_fault_until = Some(Instant::now() + a.ttl.mul_f64(1.2 + 1.3 * rng.f64()));
                records.push(Record::Stop { election: ELECTION.into(), holder: c.id.clone(), at, graceful: false });
                note(&mut faults, &dir, name);
            }
            5 => {
                // A slow network to the leader, or the server's host vanishing under the
                // leader's open connections (nothing answers on them, nothing resets them)
                // while new connections reach it (a failover to a new host at the same
                // address): it may keep leading or lose the lease.
                let c = &mut cands[i];
                let (mode, name) = if rng.bool() {
                    (Mode::Delay(a.ttl.mul_f64(0.05 + 0.2 * rng.f64())), "network delay")
                } else {
                    (Mode::Strand, "open connections stranded")
                };
                if let Some(p) = &c.proxy {
                    p.set(mode);
                }
                c.network_fault_until = Some(Instant::now() + a.ttl * 2);
                note(&mut faults, &dir, name);
            }
            0 => {
                let mut c = cands.remove(i);
                signal(&c.child, Signal::KILL);
                let _ = c.child.wait();
                records.push(Record::Stop { election: ELECTION.into(), holder: c.id, at, graceful: false });
                note(&mut faults, &dir, "SIGKILL");
                add(&mut cands, None)?;
            }
            1 => {
                let c = &mut cands[i];
                signal(&c.child, Signal::STOP);
                c.frozen_until = Some(Instant::now() + a.ttl.mul_f64(1.2 + 1.3 * rng.f64()));
                records.push(Record::Stop { election: ELECTION.into(), holder: c.id.clone(), at, graceful: false });
                note(&mut faults, &dir, "SIGSTOP");
            }
            _ => {
                let mut c = cands.remove(i);
                signal(&c.child, Signal::TERM);
                let _ = c.child.wait();
                records.push(Record::Stop { election: ELECTION.into(), holder: c.id, at, graceful: true });
                note(&mut faults, &dir, "SIGTERM");
                add(&mut cands, None)?;
            }
        }
    }
    if let (Some(s), Some(_)) = (server.as_ref(), refusing_until) {
        refuse_writes(s, false, &mut rng).ok_or("cannot make the server take writes again")?;
    }
    if let (Some(c), Some((i, _))) = (cluster.as_ref(), member_paused) {
        c[i].resume();
    }
    drop(member_cut);
    if starved.take().is_some()
        && let Some((_, to)) = starved_times.last_mut()
    {
        *to = now_ns();
    }
    let until = now_ns();
    for c in cands.iter_mut() {
        signal(&c.child, Signal::CONT);
        signal(&c.child, Signal::TERM);
    }
    for c in cands.iter_mut() {
        let _ = c.child.wait();
    }
    // A chain a term failed to stop would run on after the round: it ends itself now.
    append(&dir.join("chain-stop"), "");

    // The probes' log becomes the history.
    let text = std::fs::read_to_string(&events).unwrap_or_default();
    let mut granted: BTreeMap<(String, u64), u64> = BTreeMap::new();
    for line in text.lines() {
        let p: Vec<&str> = line.split(' ').collect();
        let (Some(kind), Some(holder), Some(token), Some(at)) = (
            p.first(),
            p.get(1),
            p.get(2).and_then(|t| t.parse::<u64>().ok()),
            p.get(3).and_then(|t| t.parse::<u64>().ok()),
        ) else {
            continue;
        };
        // With several holders, each index counts as an election of its own.
        let e = if a.holders > 1 { format!("{ELECTION}#{}", token % 1000) } else { ELECTION.to_string() };
        match *kind {
            "start" => {
                granted.entry((holder.to_string(), token)).or_insert(at);
                records.push(Record::Elected { election: e, holder: holder.to_string(), token, at });
            }
            "accept" | "reject" => {
                records.push(Record::Belief { election: e.clone(), holder: holder.to_string(), token, at });
                records.push(Record::Write { election: e, token, at, accepted: *kind == "accept" });
            }
            _ => {}
        }
    }
    for ((holder, token), at) in &granted {
        records.push(Record::Grant {
            election: if a.holders > 1 { format!("{ELECTION}#{}", token % 1000) } else { ELECTION.into() },
            holder: holder.clone(),
            token: *token,
            requested: *at,
            completed: *at,
        });
    }
    // TTL + 1 s after a crash. When the server itself restarts among the faults, a crash
    // can fall into its outage, and Redis's restart guard then withholds grants for one
    // more TTL: allow two TTLs and the restart.
    let restarts = [
        "server restart",
        "Redis restart from an older snapshot",
        "member killed and restarted",
        "member paused",
        "member paused and cut off",
        "Sentinel failover (forced)",
        "Sentinel failover (primary killed)",
    ]
    .iter()
    .map(|f| faults.get(f).copied().unwrap_or(0))
    .sum::<u32>()
        > 0;
    let crash_bound = if restarts { a.ttl * 2 + Duration::from_secs(2) } else { a.ttl + Duration::from_secs(1) };
    let stop_bound = if restarts { crash_bound } else { Duration::from_secs(1) };
    println!("liveness bound      {crash_bound:?} after a crash or freeze, {stop_bound:?} after a stop");
    let liveness =
        Liveness { after_crash: crash_bound.as_nanos() as u64, after_stop: stop_bound.as_nanos() as u64, until };
    // The bound allows for one server restart during a takeover; a stop followed by a
    // further restart, a refusal of writes or a follower killed (it may have just won)
    // within the bound gave the candidates no fair chance and is not judged (the
    // refusal's end is judged on its own); nor is a stop whose bound overlaps a time the
    // server was stalled (safety, I1-I3, is judged throughout).
    let before = records.len();
    records.retain(|r| match r {
        Record::Stop { at, .. } | Record::Recovered { at, .. } => {
            let end = at + liveness.after_crash;
            !restart_times.iter().any(|t| *t >= *at && *t <= end)
                && !starved_times.iter().any(|(from, to)| *from <= end && *to >= *at)
        }
        _ => true,
    });
    println!(
        "liveness excused    {} stops followed by another server restart, refusal or follower kill, or by a \
         starved server, within the bound",
        before - records.len()
    );
    // In the slot workload a leader's probes start at slots, not at its election: the
    // takeover times say nothing, and the slots are judged instead (below).
    // With several holders, a stopped holder's slot may have no free candidate to take
    // it: liveness is not judged, and at most N may hold at once (I7).
    let judged = a.slots.is_none() && a.holders == 1;
    let mut s = history::check(&records, if judged { Some(liveness) } else { None });
    if a.holders > 1 {
        s.violations.extend(history::check_at_most(&records, &format!("{ELECTION}#"), a.holders as usize));
    }
    let slot_violations = match a.slots {
        Some(period) => check_slots(&text, &dir, period, started_wall, std::time::SystemTime::now()),
        None => Vec::new(),
    };
    let mut takeovers = s.takeovers_after_crash.clone();
    takeovers.sort();
    let mut handovers = s.handovers_after_stop.clone();
    handovers.sort();
    let ttl = a.ttl.as_secs_f64();
    let ratio = |d: Duration| d.as_secs_f64() / ttl;
    println!("leadership terms    {}", s.terms);
    println!(
        "command             {}",
        if a.chain {
            "a tree, with a chain of forks in new sessions and a probe a health check leaves in a session of its \
             own (the command's cgroup holds both)"
        } else {
            "a tree"
        }
    );
    println!("faults injected     {}", faults.iter().map(|(k, v)| format!("{v} {k}")).collect::<Vec<_>>().join(", "));
    println!(
        "crash takeover      p50 {:?} ({:.2} TTL)  p99 {:?} ({:.2} TTL)  max {:?} ({:.2} TTL)",
        percentile(&takeovers, 0.5),
        ratio(percentile(&takeovers, 0.5)),
        percentile(&takeovers, 0.99),
        ratio(percentile(&takeovers, 0.99)),
        percentile(&takeovers, 1.0),
        ratio(percentile(&takeovers, 1.0))
    );
    println!("graceful handover   p50 {:?}  max {:?}", percentile(&handovers, 0.5), percentile(&handovers, 1.0));
    if !s.elections_after_recovery.is_empty() {
        let mut after = s.elections_after_recovery.clone();
        after.sort();
        println!(
            "after a refusal     p50 {:?}  max {:?} until a leader, once writes were taken again",
            percentile(&after, 0.5),
            percentile(&after, 1.0)
        );
    }
    println!(
        "writes              {} accepted, {} stale rejected by the fence",
        s.writes_accepted, s.stale_writes_rejected
    );
    println!("violations          {}", s.violations.len() + slot_violations.len());
    for v in s.violations.iter().take(10) {
        println!("  {v}");
    }
    for v in slot_violations.iter().take(10) {
        println!("  {v}");
    }
    println!("gave up campaigning {gave_up} candidates exited on their own");
    println!("standbys outlived   {outlived} standby supervisors ran on after their tenure run was killed");
    let failed = !s.violations.is_empty() || !slot_violations.is_empty() || gave_up > 0 || outlived > 0;
    if failed {
        let keep = std::env::temp_dir().join(format!("tenure-torture-{}", std::process::id()));
        let _ = std::fs::rename(&dir, &keep);
        println!("logs kept in {}", keep.display());
    }
    Ok(!failed)
}

/// The slot workload's checks (I6): no slot runs again once a term marked it done (the
/// candidates' logs say which; a rerun after a run cut short, or whose mark did not land,
/// is allowed and carries a larger token), no term runs a slot twice, and no slot due
/// while the round went on (after its first seconds, and up to the catch-up before its
/// end) was lost. Two runs of one slot at once would be two holders at once, which the
/// history check (I1) catches. Prints the figures; answers the violations.
fn check_slots(
    events: &str,
    dir: &Path,
    period: Duration,
    from: std::time::SystemTime,
    to: std::time::SystemTime,
) -> Vec<String> {
    let mut starts: BTreeMap<u64, Vec<(u64, String)>> = BTreeMap::new();
    // The slots each term finished, and the latest slot each term started.
    let mut finished: Vec<(u64, u64)> = Vec::new();
    let mut latest_of: BTreeMap<u64, u64> = BTreeMap::new();
    for line in events.lines() {
        let p: Vec<&str> = line.split(' ').collect();
        let (Some(holder), Some(token), Some(slot)) =
            (p.get(1), p.get(2).and_then(|t| t.parse::<u64>().ok()), p.get(4).and_then(|t| t.parse::<u64>().ok()))
        else {
            continue;
        };
        match p.first() {
            Some(&"slot-start") => {
                starts.entry(slot).or_default().push((token, holder.to_string()));
                let latest = latest_of.entry(token).or_default();
                *latest = (*latest).max(slot);
            }
            Some(&"slot-done") => finished.push((slot, token)),
            _ => {}
        }
    }
    // "slot-MS is done key=slot-MS token=T", as tenure schedule logs it at INFO.
    let mut marked: Vec<(u64, u64)> = Vec::new();
    for entry in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        let path = entry.path();
        if path.extension().is_none_or(|e| e != "log") {
            continue;
        }
        for line in std::fs::read_to_string(&path).unwrap_or_default().lines() {
            let Some(rest) = line.split_once(" is done ").map(|x| x.1) else { continue };
            let field = |name: &str| {
                rest.split_whitespace().find_map(|f| f.strip_prefix(name)).map(|v| v.trim_matches('"').to_string())
            };
            let slot = field("key=").and_then(|k| k.strip_prefix("slot-").and_then(|ms| ms.parse::<u64>().ok()));
            if let (Some(ms), Some(token)) = (slot, field("token=").and_then(|t| t.parse::<u64>().ok())) {
                marked.push((ms / 1000, token));
            }
        }
    }
    let mut v = Vec::new();
    for (slot, token) in &marked {
        for (t, holder) in starts.get(slot).into_iter().flatten() {
            if t > token {
                v.push(format!("I6: slot {slot} ran again (token {t}, {holder}) after token {token} marked it done"));
            }
        }
    }
    // A run that finished and was not marked done is run again only if its term ended
    // before it could mark it: a term that went on to start a later slot had marked it
    // (it marks a slot before it starts the next), so a rerun then repeats finished work.
    for (slot, token) in &finished {
        if marked.contains(&(*slot, *token)) || latest_of.get(token).is_none_or(|latest| latest <= slot) {
            continue;
        }
        for (t, holder) in starts.get(slot).into_iter().flatten() {
            if t > token {
                v.push(format!(
                    "I6: slot {slot} finished under token {token}, whose term went on, and ran again (token {t}, {holder})"
                ));
            }
        }
    }
    for (slot, runs) in &starts {
        let mut tokens: Vec<u64> = runs.iter().map(|r| r.0).collect();
        tokens.sort();
        if tokens.windows(2).any(|w| w[0] == w[1]) {
            v.push(format!("I6: slot {slot} ran twice in one term: {runs:?}"));
        }
    }
    let secs = |t: std::time::SystemTime| t.duration_since(std::time::UNIX_EPOCH).unwrap_or_default().as_secs_f64();
    let p = period.as_secs_f64();
    let (first, last) = (secs(from) + 3.0, secs(to) - SLOT_CATCH_UP.as_secs_f64() - 3.0);
    let mut judged = 0;
    let mut slot = (first / p).ceil() * p;
    while slot <= last {
        judged += 1;
        let s = slot.round() as u64;
        if !starts.contains_key(&s) {
            v.push(format!("I6: slot {s} was never run, though candidates led all along"));
        }
        slot += p;
    }
    let reruns = starts.values().filter(|r| r.len() > 1).count();
    println!(
        "slots               {} run, {} runs finished, {} marked done, {reruns} run again after a run cut short, {judged} judged for loss",
        starts.len(),
        finished.len(),
        marked.len()
    );
    v
}

fn main() -> ExitCode {
    let mut args = std::env::args().skip(1).peekable();
    if args.peek().map(String::as_str) == Some("probe") {
        args.next();
        let dir = match (args.next().as_deref(), args.next()) {
            (Some("--dir"), Some(d)) => PathBuf::from(d),
            _ => {
                eprintln!("usage: tenure-torture probe --dir DIR [--ignore-term | --slot | --chain]");
                return ExitCode::from(2);
            }
        };
        let mode = match args.next().as_deref() {
            Some("--ignore-term") => ProbeMode::IgnoreTerm,
            Some("--slot") => ProbeMode::Slot,
            Some("--chain") => ProbeMode::Chain,
            _ => ProbeMode::Plain,
        };
        return probe(&dir, mode);
    }
    match parse_args(args) {
        Err(e) => {
            eprintln!("tenure-torture: {e}");
            ExitCode::from(2)
        }
        Ok(a) => match torture(a) {
            Ok(true) => ExitCode::SUCCESS,
            Ok(false) => ExitCode::from(1),
            Err(e) => {
                eprintln!("tenure-torture: {e}");
                ExitCode::from(1)
            }
        },
    }
}

/// Copies the SQLite database `file` into `backup` (SQLite's online backup, as
/// `sqlite3 FILE ".backup BACKUP"` takes it).
fn sqlite_backup(file: &Path, backup: &Path) -> rusqlite::Result<()> {
    let conn = rusqlite::Connection::open(file)?;
    conn.busy_timeout(Duration::from_secs(2))?;
    conn.backup(rusqlite::MAIN_DB, backup, None::<fn(rusqlite::backup::Progress)>)
}

/// Restores `backup` into the database `file`, the file staying the same (as
/// `sqlite3 FILE ".restore BACKUP"` does).
fn sqlite_restore(file: &Path, backup: &Path) -> rusqlite::Result<()> {
    let mut conn = rusqlite::Connection::open(file)?;
    conn.busy_timeout(Duration::from_secs(2))?;
    conn.restore(rusqlite::MAIN_DB, backup, None::<fn(rusqlite::backup::Progress)>)
}
