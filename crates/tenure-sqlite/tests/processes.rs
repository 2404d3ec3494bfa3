//! Three OS processes on one database file: one leader at a time, takeover within
//! TTL plus one second after SIGKILL, near-instant handover after a clean stop, and
//! tokens that only grow. The test binary runs itself as the worker processes.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::Duration;

use tenure::{Elector, LeaseStore};
use tenure_sqlite::SqliteStore;

const TTL: Duration = Duration::from_secs(2);

fn now_ns() -> u64 {
    let t = rustix::time::clock_gettime(rustix::time::ClockId::Monotonic);
    t.tv_sec as u64 * 1_000_000_000 + t.tv_nsec as u64
}

/// The worker: leads "proc/job" and logs `start|tick|stop token pid ns` lines.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "run by sqlite_processes_elect_one_leader as a child process"]
async fn worker_process() {
    let db = std::env::var("TENURE_TEST_DB").expect("the worker runs only as a child of the process test");
    // The runtime's and the store's warnings (a call that failed or got no answer) on
    // stderr, with the events below.
    tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_ansi(false)
        .with_env_filter("tenure=debug,tenure_sqlite=debug")
        .init();
    let log_path = PathBuf::from(std::env::var("TENURE_TEST_LOG").unwrap());
    let store = Arc::new(SqliteStore::open(&db).await.unwrap());
    let elector = Elector::builder(store, "proc/job").ttl(TTL).build().unwrap();
    // Every event on stderr, which the test shows when a leader fails to appear.
    let mut events = elector.events();
    tokio::spawn(async move {
        loop {
            match events.recv().await {
                Ok(ev) => eprintln!("{} {ev:?}", now_ns()),
                Err(tokio::sync::broadcast::error::RecvError::Lagged(n)) => eprintln!("{} {n} events missed", now_ns()),
                Err(_) => break,
            }
        }
    });
    let stopper = elector.clone();
    tokio::spawn(async move {
        let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()).unwrap();
        term.recv().await;
        stopper.shutdown().await;
    });
    // Each line goes out in one write: `writeln!` on a file makes a write for each piece
    // of the line, and a worker killed between them (the test SIGKILLs the leader as it
    // ticks) left half a line, onto which the next leader's `start` line was appended,
    // unreadable.
    let log = move |what: &str, token: u64| {
        let mut f = std::fs::OpenOptions::new().append(true).create(true).open(&log_path).unwrap();
        f.write_all(format!("{what} {token} {} {}\n", std::process::id(), now_ns()).as_bytes()).unwrap();
    };
    let ended = elector
        .run_while_leader(|l| {
            let log = log.clone();
            async move {
                log("start", l.token().0);
                while l.is_valid() {
                    log("tick", l.token().0);
                    tokio::select! {
                        _ = l.cancelled() => break,
                        _ = tokio::time::sleep(Duration::from_millis(20)) => {}
                    }
                }
                log("stop", l.token().0);
            }
        })
        .await;
    // Said on stderr, which the test keeps: a worker that stops campaigning on its own
    // is a failure the test reports.
    eprintln!("worker {} ended: {ended:?}", std::process::id());
}

struct Line {
    what: String,
    token: u64,
    pid: u32,
    ns: u64,
}

fn read_log(path: &Path) -> Vec<Line> {
    std::fs::read_to_string(path)
        .unwrap_or_default()
        .lines()
        .filter_map(|l| {
            let mut p = l.split(' ');
            Some(Line {
                what: p.next()?.to_string(),
                token: p.next()?.parse().ok()?,
                pid: p.next()?.parse().ok()?,
                ns: p.next()?.parse().ok()?,
            })
        })
        .collect()
}

/// Starts a worker; what it says on stderr goes to `LOG.PID.err`, next to the log.
fn spawn_worker(db: &Path, log: &Path) -> Child {
    let err = tempfile::NamedTempFile::new_in(log.parent().unwrap()).unwrap();
    let child = Command::new(std::env::current_exe().unwrap())
        .args(["--ignored", "--exact", "worker_process", "--nocapture"])
        .env("TENURE_TEST_DB", db)
        .env("TENURE_TEST_LOG", log)
        .stdout(Stdio::null())
        .stderr(err.reopen().unwrap())
        .spawn()
        .unwrap();
    err.persist(log.with_extension(format!("{}.err", child.id()))).unwrap();
    child
}

/// What the workers said on stderr, for a failure's message.
fn workers_said(log: &Path) -> String {
    let mut said = String::new();
    for e in std::fs::read_dir(log.parent().unwrap()).unwrap().flatten() {
        if e.path().extension().is_some_and(|x| x == "err") {
            let text = std::fs::read_to_string(e.path()).unwrap_or_default();
            let tail: Vec<&str> = text.lines().rev().take(20).collect();
            said.push_str(&format!(
                "\n--- {}:\n{}",
                e.path().display(),
                tail.into_iter().rev().collect::<Vec<_>>().join("\n")
            ));
        }
    }
    said
}

/// Kills the workers it names when dropped (a failed test's too).
struct Reap(Vec<u32>);

impl Drop for Reap {
    fn drop(&mut self) {
        for &pid in &self.0 {
            // Still one of ours, not a process that took a reaped worker's pid.
            let ours = std::fs::read(format!("/proc/{pid}/cmdline"))
                .is_ok_and(|c| c.windows(b"worker_process".len()).any(|w| w == b"worker_process"));
            if ours && let Some(pid) = rustix::process::Pid::from_raw(pid as i32) {
                let _ = rustix::process::kill_process(pid, rustix::process::Signal::KILL);
            }
        }
    }
}

/// Waits until a start line beyond the first `seen` appears; returns it.
fn wait_start(log: &Path, seen: usize, within: Duration) -> Line {
    let t0 = std::time::Instant::now();
    loop {
        let starts: Vec<Line> = read_log(log).into_iter().filter(|l| l.what == "start").collect();
        if let Some(l) = starts.into_iter().nth(seen) {
            return l;
        }
        if t0.elapsed() >= within {
            let text = std::fs::read_to_string(log).unwrap_or_default();
            let tail: Vec<&str> = text.lines().rev().take(8).collect();
            panic!(
                "no new leader within {within:?}; the log ends with:\n{}\nthe workers said:{}",
                tail.into_iter().rev().collect::<Vec<_>>().join("\n"),
                workers_said(log)
            );
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

#[test]
fn sqlite_processes_elect_one_leader() {
    let dir = tempfile::tempdir().unwrap();
    let (db, log) = (dir.path().join("leases.db"), dir.path().join("log"));
    let mut children: Vec<Child> = (0..3).map(|_| spawn_worker(&db, &log)).collect();
    // Workers still running when the test fails are killed with it.
    let pids: Vec<u32> = children.iter().map(Child::id).collect();
    let _reap = Reap(pids);

    let first = wait_start(&log, 0, Duration::from_secs(30));
    std::thread::sleep(Duration::from_millis(500));
    assert_eq!(read_log(&log).iter().filter(|l| l.what == "start").count(), 1, "exactly one leader");

    for c in children.iter_mut() {
        assert!(c.try_wait().unwrap().is_none(), "worker {} ended; the workers said:{}", c.id(), workers_said(&log));
    }

    // SIGKILL the leader: another leads within TTL + 1 s.
    let idx = children.iter().position(|c| c.id() == first.pid).unwrap();
    let mut leader = children.remove(idx);
    let killed_at = now_ns();
    leader.kill().unwrap();
    leader.wait().unwrap();
    let second = wait_start(&log, 1, TTL + Duration::from_secs(5));
    let takeover = Duration::from_nanos(second.ns - killed_at);
    eprintln!("takeover after SIGKILL: {takeover:?} (TTL {TTL:?})");
    assert!(takeover <= TTL + Duration::from_secs(1), "takeover took {takeover:?}");
    assert!(second.token > first.token);

    // SIGTERM the new leader: it releases, and the last one leads well within a TTL.
    let idx = children.iter().position(|c| c.id() == second.pid).unwrap();
    let mut leader = children.remove(idx);
    let stopped_at = now_ns();
    rustix::process::kill_process(rustix::process::Pid::from_child(&leader), rustix::process::Signal::TERM).unwrap();
    let status = leader.wait().unwrap();
    assert!(status.success(), "a worker stopped by SIGTERM exits cleanly: {status:?}");
    let third = wait_start(&log, 2, TTL);
    let handover = Duration::from_nanos(third.ns - stopped_at);
    eprintln!("handover after a clean stop: {handover:?}");
    assert!(handover < TTL / 2, "a clean stop must hand over without waiting for expiry, took {handover:?}");
    assert!(third.token > second.token);

    for mut c in children {
        let _ = c.kill();
        let _ = c.wait();
    }

    // No two leaders' activity overlaps: each term's last line precedes the next start.
    let lines = read_log(&log);
    let mut terms: Vec<(u64, u64, u64)> = Vec::new(); // token, first ns, last ns
    for l in &lines {
        match terms.iter_mut().find(|t| t.0 == l.token) {
            Some(t) => t.2 = t.2.max(l.ns),
            None => terms.push((l.token, l.ns, l.ns)),
        }
    }
    terms.sort_by_key(|t| t.1);
    for w in terms.windows(2) {
        assert!(w[0].0 < w[1].0, "tokens grow in the order terms start");
        assert!(w[0].2 < w[1].1, "term {} was still active when term {} started", w[0].0, w[1].0);
    }
}

/// An opener: opens the database named by the environment, then exits.
#[tokio::test]
#[ignore = "run by many_processes_can_create_the_database_at_once as a child process"]
async fn opener_process() {
    let db = std::env::var("TENURE_TEST_DB").expect("the opener runs only as a child");
    if let Err(e) = SqliteStore::open(&db).await {
        eprintln!("{e}");
        std::process::exit(3);
    }
}

/// Replicas started together open one fresh database at once: every open succeeds
/// (switching to WAL takes a lock that SQLite does not wait for by itself).
#[test]
fn many_processes_can_create_the_database_at_once() {
    for round in 0..8 {
        let dir = tempfile::tempdir().unwrap();
        let db = dir.path().join(format!("fresh-{round}.db"));
        // One replica is already at work, writing, while the others start.
        let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let writer = {
            let (db, stop) = (db.clone(), stop.clone());
            std::thread::spawn(move || {
                let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
                rt.block_on(async {
                    let store = SqliteStore::open(&db).await.unwrap();
                    let req = tenure::store::AcquireRequest::new(
                        tenure::ElectionName::new("w").unwrap(),
                        tenure::HolderId::new("w").unwrap(),
                        Duration::from_secs(5),
                    );
                    while !stop.load(std::sync::atomic::Ordering::SeqCst) {
                        let _ = store.try_acquire(&req).await;
                        tokio::time::sleep(Duration::from_millis(1)).await;
                    }
                })
            })
        };
        std::thread::sleep(Duration::from_millis(20));
        let children: Vec<Child> = (0..6)
            .map(|_| {
                Command::new(std::env::current_exe().unwrap())
                    .args(["--ignored", "--exact", "opener_process", "--quiet", "--nocapture"])
                    .env("TENURE_TEST_DB", &db)
                    .stdout(Stdio::piped())
                    .stderr(Stdio::piped())
                    .spawn()
                    .unwrap()
            })
            .collect();
        let outs: Vec<_> = children.into_iter().map(|c| c.wait_with_output().unwrap()).collect();
        stop.store(true, std::sync::atomic::Ordering::SeqCst);
        writer.join().unwrap();
        for out in outs {
            assert!(
                out.status.success(),
                "an open failed ({}): {}{}",
                out.status,
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            );
        }
    }
}
