//! `--http`: a real Prometheus (Debian's `prometheus`, on a free loopback port) scrapes two
//! `tenure run` candidates; `/is-leader` follows a crash; `/healthz` and `/leader` answer.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use tenure_testkit::servers;

mod common;
use common::{Proc, tenure};

/// A GET on 127.0.0.1:`port`; the status and the body, or `None` if nothing answered
/// within `within`.
/// `GET path` answered within `within`, connecting included (as a probe's timeout counts:
/// a connect that waits in a full queue is a probe unanswered, not a test that hangs).
fn get(port: u16, path: &str, within: Duration) -> Option<(u16, String)> {
    let mut s = TcpStream::connect_timeout(&(std::net::Ipv4Addr::LOCALHOST, port).into(), within).ok()?;
    s.set_read_timeout(Some(within)).ok()?;
    write!(s, "GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n").ok()?;
    let mut text = String::new();
    s.read_to_string(&mut text).ok()?;
    let status = text.split_whitespace().nth(1)?.parse().ok()?;
    Some((status, text.split_once("\r\n\r\n").map(|(_, b)| b.to_string()).unwrap_or_default()))
}

fn wait_for(what: &str, limit: Duration, mut ok: impl FnMut() -> bool) -> Duration {
    let t0 = Instant::now();
    while !ok() {
        assert!(t0.elapsed() < limit, "waited {limit:?} for {what}");
        std::thread::sleep(Duration::from_millis(20));
    }
    t0.elapsed()
}

fn candidate(dir: &Path, id: &str, port: u16) -> Proc {
    let child = Command::new(tenure())
        .env("TENURE_STORE", format!("sqlite:{}", dir.join("s.db").display()))
        .env("RUST_LOG", "warn")
        .stdin(Stdio::null())
        .args(["run", "jobs/operated", "--id", id, "--ttl", "2s", "--grace", "300ms", "--announce"])
        .args(["--http", &format!("127.0.0.1:{port}"), "--", "sleep", "600"])
        .spawn()
        .unwrap();
    Proc(child)
}

/// Starts Prometheus scraping `targets` every second; `None` (after saying so) when it is
/// not installed and servers are not required.
fn prometheus(dir: &Path, targets: &[u16]) -> Option<(Proc, u16)> {
    let Some(program) = servers::find_program("prometheus") else {
        servers::skip("prometheus is not installed (Debian package prometheus)");
        return None;
    };
    let port = servers::free_port();
    let list = targets.iter().map(|p| format!("'127.0.0.1:{p}'")).collect::<Vec<_>>().join(", ");
    let config = dir.join("prometheus.yml");
    std::fs::write(
        &config,
        format!(
            "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\nscrape_configs:\n  - job_name: tenure\n    static_configs:\n      - targets: [{list}]\n"
        ),
    )
    .unwrap();
    let child = Command::new(program)
        .arg(format!("--config.file={}", config.display()))
        .arg(format!("--storage.tsdb.path={}", dir.join("tsdb").display()))
        .arg(format!("--web.listen-address=127.0.0.1:{port}"))
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(dir.join("prometheus.log")).unwrap())
        .spawn()
        .unwrap();
    let p = Proc(child);
    wait_for("Prometheus to be ready", Duration::from_secs(60), || {
        get(port, "/-/ready", Duration::from_secs(2)).is_some_and(|(s, _)| s == 200)
    });
    Some((p, port))
}

/// The value of a PromQL query that returns one number, if it does.
fn query(port: u16, promql: &str) -> Option<f64> {
    let q: String = promql
        .bytes()
        .map(|b| if b.is_ascii_alphanumeric() { (b as char).to_string() } else { format!("%{b:02X}") })
        .collect();
    let (status, body) = get(port, &format!("/api/v1/query?query={q}"), Duration::from_secs(5))?;
    if status != 200 {
        return None;
    }
    let v: serde_json::Value = serde_json::from_str(&body).ok()?;
    v["data"]["result"].get(0)?["value"][1].as_str()?.parse().ok()
}

#[test]
fn prometheus_sees_one_leader_and_is_leader_follows_a_crash() {
    let dir = tempfile::tempdir().unwrap();
    let ports = [servers::free_port(), servers::free_port()];
    let mut a = candidate(dir.path(), "a", ports[0]);
    wait_for("a to lead", Duration::from_secs(20), || {
        get(ports[0], "/is-leader", Duration::from_secs(2)).is_some_and(|(s, _)| s == 200)
    });
    let b = candidate(dir.path(), "b", ports[1]);
    wait_for("b to serve", Duration::from_secs(20), || get(ports[1], "/healthz", Duration::from_secs(2)).is_some());

    // The endpoints as a load balancer and a liveness probe see them.
    let (status, body) = get(ports[1], "/is-leader", Duration::from_secs(2)).unwrap();
    assert_eq!(status, 503, "{body}");
    let (status, body) = get(ports[0], "/is-leader", Duration::from_secs(2)).unwrap();
    assert_eq!(status, 200);
    let me: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(me["holder"].as_str().map(common::name_of), Some("a"), "{me}");
    assert!(me["token"].as_u64().unwrap() >= 1 && me["remaining_ms"].as_u64().unwrap() > 0, "{me}");
    for port in ports {
        assert_eq!(get(port, "/healthz", Duration::from_secs(2)).unwrap().0, 200);
        let (status, body) = get(port, "/leader", Duration::from_secs(2)).unwrap();
        assert_eq!(status, 200);
        let leader: serde_json::Value = serde_json::from_str(&body).unwrap();
        assert_eq!(leader["election"], "jobs/operated");
        assert_eq!(leader["leader"]["holder"].as_str().map(common::name_of), Some("a"), "{leader}");
        assert_eq!(get(port, "/nothing-here", Duration::from_secs(2)).unwrap().0, 404);
    }
    let (_, metrics) = get(ports[0], "/metrics", Duration::from_secs(2)).unwrap();
    assert!(metrics.contains(r#"tenure_is_leader{election="jobs/operated"} 1"#), "{metrics}");
    let (_, metrics) = get(ports[1], "/metrics", Duration::from_secs(2)).unwrap();
    assert!(metrics.contains(r#"tenure_is_leader{election="jobs/operated"} 0"#), "{metrics}");
    // Each announces itself through an election of tenure's own: none of it is reported.
    assert!(!metrics.contains(".tenure/"), "tenure's own elections reach the metrics: {metrics}");
    assert!(metrics.contains("# HELP tenure_is_leader "), "{metrics}");

    // A real Prometheus scrapes both and sees exactly one leader.
    let Some((_prom, prom)) = prometheus(dir.path(), &ports) else { return };
    wait_for("both targets up", Duration::from_secs(30), || query(prom, "sum(up)") == Some(2.0));
    wait_for("one leader", Duration::from_secs(30), || {
        query(prom, r#"sum(tenure_is_leader{election="jobs/operated"})"#) == Some(1.0)
    });
    // The query the docs give for "who leads" finds that one, and nothing else.
    assert_eq!(query(prom, "count(tenure_is_leader == 1)"), Some(1.0));

    // The leader dies: the survivor's /is-leader turns 200 within about a TTL.
    a.kill().unwrap();
    a.wait().unwrap();
    let took = wait_for("b to lead", Duration::from_secs(10), || {
        get(ports[1], "/is-leader", Duration::from_secs(2)).is_some_and(|(s, _)| s == 200)
    });
    eprintln!("b's /is-leader turned 200 {took:?} after a was killed (TTL 2 s)");
    wait_for("Prometheus to see b lead", Duration::from_secs(30), || {
        query(prom, r#"tenure_is_leader{election="jobs/operated"} == 1"#).is_some()
            && query(prom, "sum(up)") == Some(1.0)
            && query(prom, r#"sum(tenure_is_leader{election="jobs/operated"})"#) == Some(1.0)
    });
    drop(b);
}

#[test]
fn a_flood_of_idle_connections_neither_restarts_the_command_nor_keeps_a_core_busy() {
    // A lasting flood of idle connections against 256 descriptors: it must not take what
    // renewing the lease, keeping the command's deadline and starting its health checks
    // need (a health check that cannot start fails, and the leader steps down).
    let dir = tempfile::tempdir().unwrap();
    let port = servers::free_port();
    let log = dir.path().join("starts");
    let script = format!("echo start >> {}; exec sleep 600", log.display());
    let leader = Proc(
        Command::new("sh")
            .args(["-c", r#"ulimit -n 256; exec "$0" "$@""#, tenure()])
            .args(["run", "jobs/flooded", "--ttl", "2s", "--grace", "300ms"])
            .args(["--health-cmd", "true", "--health-interval", "200ms", "--health-retries", "1"])
            .args(["--http", &format!("127.0.0.1:{port}"), "--", "sh", "-c", &script])
            .env("TENURE_STORE", format!("sqlite:{}", dir.path().join("s.db").display()))
            .env("RUST_LOG", "warn")
            .stdin(Stdio::null())
            .spawn()
            .unwrap(),
    );
    wait_for("the command to start", Duration::from_secs(20), || log.exists());
    let cpu = || {
        let stat = std::fs::read_to_string(format!("/proc/{}/stat", leader.id())).unwrap();
        let fields: Vec<&str> = stat.rsplit_once(')').unwrap().1.split_whitespace().collect();
        // utime and stime, in clock ticks (100 a second here).
        fields[11].parse::<u64>().unwrap() + fields[12].parse::<u64>().unwrap()
    };
    let before = cpu();
    // A flood that lasts: 600 idle connections, each one closed by the server opened again
    // at once, as an attacker keeping the port busy would.
    let flooding = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(true));
    let flood = {
        let flooding = flooding.clone();
        std::thread::spawn(move || {
            let mut open: Vec<TcpStream> = Vec::new();
            let mut made = 0usize;
            while flooding.load(std::sync::atomic::Ordering::Relaxed) {
                // Kept while open and silent; closed by the server, a read finds its end.
                open.retain(|c| {
                    let _ = c.set_nonblocking(true);
                    matches!(c.peek(&mut [0u8; 1]), Err(e) if e.kind() == std::io::ErrorKind::WouldBlock)
                });
                while open.len() < 600 {
                    match TcpStream::connect(("127.0.0.1", port)) {
                        Ok(c) => open.push(c),
                        Err(_) => break,
                    }
                    made += 1;
                }
                std::thread::sleep(Duration::from_millis(20));
            }
            made
        })
    };
    std::thread::sleep(Duration::from_millis(500));
    // Three TTLs of flood, probed as a liveness probe would, with Kubernetes' default
    // timeout of 1 s: idle connections must not keep a request that comes whole waiting
    // behind them (each holds a place for the head timeout, 2 s, and the queue never
    // empties).
    let mut unanswered = 0;
    let mut slowest = Duration::ZERO;
    for _ in 0..12 {
        let t0 = std::time::Instant::now();
        if get(port, "/healthz", Duration::from_secs(1)).is_none_or(|(s, _)| s != 200) {
            unanswered += 1;
        }
        slowest = slowest.max(t0.elapsed());
        std::thread::sleep(Duration::from_millis(500).saturating_sub(t0.elapsed()));
    }
    let busy = cpu() - before;
    let starts = std::fs::read_to_string(&log).unwrap().lines().count();
    flooding.store(false, std::sync::atomic::Ordering::Relaxed);
    eprintln!("the slowest probe of /healthz took {slowest:?}");
    // The probes first: a server that keeps every idle connection starves the renewals
    // too, on a loaded host, but what it breaks first is the probes. Before the flood's
    // end is awaited: against such a server, its last connect waits in a full queue for
    // minutes.
    assert_eq!(unanswered, 0, "probes of /healthz unanswered within 1 s during the flood, of 12");
    let made = flood.join().unwrap();
    assert!(made >= 600, "only {made} connections were made");
    assert_eq!(starts, 1, "the command was started again during the flood");
    assert!(busy < 100, "tenure run used {busy} ticks of CPU in 6 s of idle connections");
    wait_for("/healthz to answer after the flood", Duration::from_secs(10), || {
        get(port, "/healthz", Duration::from_secs(2)).is_some_and(|(s, _)| s == 200)
    });
}

#[test]
fn a_frozen_leader_answers_no_probe_and_a_taken_address_is_a_clear_error() {
    let dir = tempfile::tempdir().unwrap();
    let port = servers::free_port();
    let a = candidate(dir.path(), "a", port);
    wait_for("a to lead", Duration::from_secs(20), || {
        get(port, "/is-leader", Duration::from_secs(2)).is_some_and(|(s, _)| s == 200)
    });
    // Frozen, it cannot say it is healthy: a liveness probe with a timeout fails.
    let pid = rustix::process::Pid::from_raw(a.id() as i32).unwrap();
    rustix::process::kill_process(pid, rustix::process::Signal::STOP).unwrap();
    assert!(get(port, "/healthz", Duration::from_millis(500)).is_none(), "a frozen process answered");
    rustix::process::kill_process(pid, rustix::process::Signal::CONT).unwrap();
    wait_for("a to answer again", Duration::from_secs(10), || {
        get(port, "/healthz", Duration::from_secs(2)).is_some_and(|(s, _)| s == 200)
    });
    // A second process on the same address says so and exits 1.
    let out = Command::new(tenure())
        .env("TENURE_STORE", format!("sqlite:{}", dir.path().join("s.db").display()))
        .args(["run", "jobs/operated", "--ttl", "2s", "--http", &format!("127.0.0.1:{port}"), "--", "true"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains(&format!("cannot listen on 127.0.0.1:{port} (--http)")), "{err}");
}

#[test]
fn the_documented_alert_rules_are_valid_prometheus_rules() {
    let Some(promtool) = servers::find_program("promtool") else {
        servers::skip("promtool is not installed (Debian package prometheus)");
        return;
    };
    let rules = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../docs/operations/alerts.yml");
    let out = Command::new(promtool).arg("check").arg("rules").arg(&rules).output().unwrap();
    assert!(out.status.success(), "{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
}

fn sidecar(dir: &Path, id: &str, port: u16, log: &Path) -> Proc {
    let hook =
        |what: &str| format!("echo {what} ${{TENURE_HOLDER%.*}} $TENURE_TOKEN $(date +%s%N) >> {}", log.display());
    let child = Command::new(tenure())
        .env("TENURE_STORE", format!("sqlite:{}", dir.join("s.db").display()))
        .env("RUST_LOG", "warn")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .args(["campaign", "api/writer", "--id", id, "--ttl", "2s", "--grace", "300ms"])
        .args(["--http", &format!("127.0.0.1:{port}")])
        .args(["--on-elected", &hook("elected"), "--on-stepped-down", &hook("stepped-down")])
        .spawn()
        .unwrap();
    Proc(child)
}

/// The hook log: (what, holder, token, wall ns) per line.
fn hooks(log: &Path) -> Vec<(String, String, u64, u64)> {
    std::fs::read_to_string(log)
        .unwrap_or_default()
        .lines()
        .filter_map(|l| {
            let f: Vec<&str> = l.split(' ').collect();
            Some((f.first()?.to_string(), f.get(1)?.to_string(), f.get(2)?.parse().ok()?, f.get(3)?.parse().ok()?))
        })
        .collect()
}

#[test]
fn a_campaign_sidecar_runs_its_hooks_and_answers_is_leader() {
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("hooks");
    let ports = [servers::free_port(), servers::free_port()];
    let mut a = sidecar(dir.path(), "a", ports[0], &log);
    wait_for("a's elected hook", Duration::from_secs(20), || hooks(&log).len() == 1);
    let mut b = sidecar(dir.path(), "b", ports[1], &log);
    wait_for("b to serve", Duration::from_secs(20), || get(ports[1], "/healthz", Duration::from_secs(2)).is_some());
    assert_eq!(get(ports[0], "/is-leader", Duration::from_secs(2)).unwrap().0, 200);
    assert_eq!(get(ports[1], "/is-leader", Duration::from_secs(2)).unwrap().0, 503);

    // A graceful stop: a's stepped-down hook runs before b is elected.
    let pid = rustix::process::Pid::from_raw(a.id() as i32).unwrap();
    rustix::process::kill_process(pid, rustix::process::Signal::TERM).unwrap();
    assert!(a.wait().unwrap().success());
    wait_for("b's elected hook", Duration::from_secs(10), || hooks(&log).len() == 3);
    let h = hooks(&log);
    assert_eq!((h[0].0.as_str(), h[0].1.as_str()), ("elected", "a"), "{h:?}");
    assert_eq!((h[1].0.as_str(), h[1].1.as_str(), h[1].2), ("stepped-down", "a", h[0].2), "{h:?}");
    assert_eq!((h[2].0.as_str(), h[2].1.as_str()), ("elected", "b"), "{h:?}");
    assert!(
        h[1].3 < h[2].3 && h[2].2 > h[0].2,
        "b was elected after a's stepped-down hook, with a larger token: {h:?}"
    );
    assert_eq!(get(ports[1], "/is-leader", Duration::from_secs(2)).unwrap().0, 200);

    // A crash: the survivor is elected once the lease runs out.
    let mut a = sidecar(dir.path(), "a", ports[0], &log);
    wait_for("a to serve", Duration::from_secs(20), || get(ports[0], "/healthz", Duration::from_secs(2)).is_some());
    b.kill().unwrap();
    b.wait().unwrap();
    wait_for("a's elected hook", Duration::from_secs(10), || hooks(&log).len() == 4);
    let h = hooks(&log);
    assert_eq!((h[3].0.as_str(), h[3].1.as_str()), ("elected", "a"), "{h:?}");
    assert!(h[3].2 > h[2].2);
    assert!(a.try_wait().unwrap().is_none());
}

#[test]
fn tenure_run_raises_its_descriptor_limit_and_gives_the_command_and_health_checks_the_one_it_started_with() {
    let dir = tempfile::tempdir().unwrap();
    let (seen, hook) = (dir.path().join("command"), dir.path().join("hook"));
    let script = format!("ulimit -S -n > {}.tmp; mv {0}.tmp {0}; exec sleep 600", seen.display());
    let leader = Proc(
        Command::new("sh")
            .args(["-c", r#"ulimit -S -n 256; exec "$0" "$@""#, tenure()])
            .args(["run", "jobs/limits", "--ttl", "2s"])
            // Written aside and moved into place, so that the file is never seen empty.
            .args(["--health-cmd", &format!("ulimit -S -n > {0}.tmp; mv {0}.tmp {0}", hook.display())])
            .args(["--health-interval", "200ms"])
            .args(["--", "sh", "-c", &script])
            .env("TENURE_STORE", format!("sqlite:{}", dir.path().join("s.db").display()))
            .env("RUST_LOG", "warn")
            .stdin(Stdio::null())
            .spawn()
            .unwrap(),
    );
    wait_for("the command to start", Duration::from_secs(20), || seen.exists() && hook.exists());
    assert_eq!(std::fs::read_to_string(&seen).unwrap().trim(), "256");
    assert_eq!(std::fs::read_to_string(&hook).unwrap().trim(), "256");
    let limits = std::fs::read_to_string(format!("/proc/{}/limits", leader.id())).unwrap();
    let line = limits.lines().find(|l| l.starts_with("Max open files")).unwrap().to_string();
    let fields: Vec<&str> = line.split_whitespace().collect();
    let (soft, hard) = (fields[3], fields[4]);
    assert_eq!(soft, hard, "tenure run kept the soft limit it started with: {line}");
}

/// The Python worker of docs/operations.md, as written there, against real sidecars.
fn python_snippet() -> String {
    let doc = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../../docs/operations.md")).unwrap();
    let start = doc.find("```python\n").expect("a Python snippet in docs/operations.md") + "```python\n".len();
    doc[start..][..doc[start..].find("```").unwrap()].to_string()
}

#[test]
fn the_documented_python_worker_waits_out_a_down_sidecar_and_starts_as_soon_as_it_is_elected() {
    if Command::new("python3").arg("--version").output().is_err() {
        return servers::skip("python3 is not installed (install python3)");
    }
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("hooks");
    let swept = dir.path().join("swept");
    let ports = [servers::free_port(), servers::free_port()];
    // The worker of replica b: it sweeps once with the token it was given, then exits.
    let script = format!(
        "import sys\ndef sweep_queue(fencing_token):\n    open({swept:?}, 'w').write(str(fencing_token))\n    sys.exit(0)\n{}",
        python_snippet().replace("127.0.0.1:9464", &format!("127.0.0.1:{}", ports[1])),
        swept = swept.display().to_string(),
    );
    // Started before its sidecar: it must wait, not die.
    let mut worker = Command::new("python3").arg("-c").arg(&script).stderr(Stdio::piped()).spawn().unwrap();
    let mut a = sidecar(dir.path(), "a", ports[0], &log);
    wait_for("a's elected hook", Duration::from_secs(20), || hooks(&log).len() == 1);
    std::thread::sleep(Duration::from_secs(2));
    assert!(worker.try_wait().unwrap().is_none(), "the worker died while its sidecar was down");
    let _b = sidecar(dir.path(), "b", ports[1], &log);
    wait_for("b to serve", Duration::from_secs(20), || get(ports[1], "/healthz", Duration::from_secs(2)).is_some());
    std::thread::sleep(Duration::from_secs(1));
    assert!(!swept.exists(), "the worker swept while another replica led");
    // a stops; b is elected, and its worker (in a long poll) sweeps with b's token at once.
    let pid = rustix::process::Pid::from_raw(a.id() as i32).unwrap();
    rustix::process::kill_process(pid, rustix::process::Signal::TERM).unwrap();
    assert!(a.wait().unwrap().success());
    wait_for("b's elected hook", Duration::from_secs(10), || hooks(&log).len() == 3);
    let elected = Instant::now();
    wait_for("the worker to sweep", Duration::from_secs(10), || swept.exists());
    let took = elected.elapsed();
    let status = worker.wait().unwrap();
    assert!(status.success(), "{status}");
    let b_token = hooks(&log)[2].2;
    assert_eq!(std::fs::read_to_string(&swept).unwrap().parse::<u64>().unwrap(), b_token);
    eprintln!("the worker swept {took:?} after b's elected hook ran");
}

#[test]
fn is_leader_long_polls_answer_on_a_change_or_at_the_end_of_the_wait() {
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("hooks");
    let ports = [servers::free_port(), servers::free_port()];
    let mut a = sidecar(dir.path(), "a", ports[0], &log);
    wait_for("a's elected hook", Duration::from_secs(20), || hooks(&log).len() == 1);
    let _b = sidecar(dir.path(), "b", ports[1], &log);
    wait_for("b to serve", Duration::from_secs(20), || get(ports[1], "/healthz", Duration::from_secs(2)).is_some());
    // Nothing changes: the poll answers at the end of its wait, with the same state.
    let t0 = Instant::now();
    let (status, _) = get(ports[1], "/is-leader?wait=1s&token=0", Duration::from_secs(10)).unwrap();
    assert_eq!(status, 503);
    assert!(t0.elapsed() >= Duration::from_millis(900), "answered after {:?}", t0.elapsed());
    // A state the client does not know yet is answered at once.
    let a_token = hooks(&log)[0].2;
    let t0 = Instant::now();
    let (status, body) = get(ports[0], "/is-leader?wait=30s&token=0", Duration::from_secs(10)).unwrap();
    assert_eq!(status, 200, "{body}");
    assert!(body.contains(&format!("\"token\":{a_token}")), "{body}");
    assert!(t0.elapsed() < Duration::from_secs(5), "answered after {:?}", t0.elapsed());
    // Bad parameters are refused.
    assert_eq!(get(ports[1], "/is-leader?wait=soon", Duration::from_secs(5)).unwrap().0, 400);
    assert_eq!(get(ports[1], "/is-leader?wait=1s&x=1", Duration::from_secs(5)).unwrap().0, 400);
    // A poll waiting on b is answered when b is elected.
    let waiting = std::thread::spawn(move || get(ports[1], "/is-leader?wait=30s&token=0", Duration::from_secs(40)));
    std::thread::sleep(Duration::from_millis(500));
    let pid = rustix::process::Pid::from_raw(a.id() as i32).unwrap();
    rustix::process::kill_process(pid, rustix::process::Signal::TERM).unwrap();
    assert!(a.wait().unwrap().success());
    let (status, body) = waiting.join().unwrap().expect("the long poll was answered");
    assert_eq!(status, 200, "{body}");
    // The hook runs once the term has begun: it may come after the answer.
    wait_for("b's elected hook", Duration::from_secs(10), || hooks(&log).len() == 3);
    let b_token = hooks(&log).iter().find(|h| h.0 == "elected" && h.1 == "b").expect("b was elected").2;
    assert!(body.contains(&format!("\"token\":{b_token}")), "{body}");
}

#[test]
fn a_huge_record_costs_the_http_endpoints_a_few_kilobytes_per_request() {
    // 20 MB of metadata written into the row by hand, and 100 clients that ask /leader
    // and never read the answer: the leader keeps its lease and its command, and answers
    // probes. (TTL 10 s: SQLite rewrites the whole row, 20 MB, at each renewal, which a
    // debug build may not fit in the 400 ms a renewal has under a 2 s TTL. Whoever can
    // write such a record into the store can end the lease anyway.)
    let dir = tempfile::tempdir().unwrap();
    let port = servers::free_port();
    let log = dir.path().join("starts");
    let script = format!("echo start >> {}; exec sleep 600", log.display());
    let leader = Proc(
        Command::new(tenure())
            .args(["run", "jobs/huge", "--ttl", "10s", "--grace", "300ms"])
            .args(["--http", &format!("127.0.0.1:{port}"), "--", "sh", "-c", &script])
            .env("TENURE_STORE", format!("sqlite:{}", dir.path().join("s.db").display()))
            .env("RUST_LOG", "warn")
            .stdin(Stdio::null())
            .spawn()
            .unwrap(),
    );
    wait_for("the command to start", Duration::from_secs(20), || log.exists());
    let db = rusqlite::Connection::open(dir.path().join("s.db")).unwrap();
    db.busy_timeout(Duration::from_secs(5)).unwrap();
    const HUGE: usize = 20_000_000;
    db.execute("UPDATE tenure_leases SET metadata = ?1 WHERE election = 'jobs/huge'", [vec![b'x'; HUGE]]).unwrap();
    let (status, body) = get(port, "/leader", Duration::from_secs(5)).unwrap();
    assert_eq!(status, 200, "{body}");
    let v: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(v["leader"]["metadata_bytes"], serde_json::json!(HUGE), "{body:.300}");
    assert!(body.len() < 8192, "/leader answered {} bytes", body.len());
    let silent: Vec<TcpStream> = (0..100)
        .map(|_| {
            let mut s = TcpStream::connect(("127.0.0.1", port)).unwrap();
            write!(s, "GET /leader HTTP/1.1\r\nHost: x\r\n\r\n").unwrap();
            s
        })
        .collect();
    let mut peak_kb = 0u64;
    for _ in 0..8 {
        peak_kb = peak_kb.max(common::rss_kb(leader.id()));
        assert!(
            get(port, "/healthz", Duration::from_secs(1)).is_some_and(|(s, _)| s == 200),
            "/healthz unanswered within 1 s with 100 readers of /leader that do not read"
        );
        std::thread::sleep(Duration::from_millis(250));
    }
    drop(silent);
    // A few reads at a time, each holding the record once or twice: where every request
    // read it at once, this went past 4 GB.
    assert!(peak_kb < 600_000, "tenure run reached {peak_kb} kB");
    assert_eq!(std::fs::read_to_string(&log).unwrap().lines().count(), 1, "the command was started again");
}

/// An election with two holders, as an operator sees it: `list`, `watch`, `/leader` and
/// `/is-leader` show both holders with their indices, and `watch` tells of a handover.
#[test]
fn several_holders_are_shown_by_list_watch_and_the_http_endpoints() {
    let dir = tempfile::tempdir().unwrap();
    let store = format!("sqlite:{}", dir.path().join("s.db").display());
    let port = servers::free_port();
    let run = |id: &str, http: bool| {
        let mut c = Command::new(tenure());
        c.env("TENURE_STORE", &store).env("RUST_LOG", "warn").stdin(Stdio::null());
        c.args(["run", "jobs/pool", "--holders", "2", "--id", id, "--ttl", "2s", "--grace", "300ms"]);
        if http {
            c.args(["--http", &format!("127.0.0.1:{port}")]);
        }
        Proc(c.args(["--", "sleep", "600"]).spawn().unwrap())
    };
    let mut watch = Proc(
        Command::new(tenure())
            .env("TENURE_STORE", &store)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .args(["watch", "jobs/pool"])
            .spawn()
            .unwrap(),
    );
    let lines = std::sync::Arc::new(std::sync::Mutex::new(Vec::<String>::new()));
    let sink = lines.clone();
    let out = watch.stdout.take().unwrap();
    std::thread::spawn(move || {
        use std::io::BufRead;
        for l in std::io::BufReader::new(out).lines().map_while(Result::ok) {
            sink.lock().unwrap().push(l);
        }
    });
    let mut runs = vec![("a", run("a", true)), ("b", run("b", false)), ("c", run("c", false))];
    let list = || {
        let out = Command::new(tenure()).env("TENURE_STORE", &store).args(["list"]).output().unwrap();
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    wait_for("two holders listed", Duration::from_secs(20), || {
        let l = list();
        l.contains("jobs/pool [0]") && l.contains("jobs/pool [1]")
    });
    // `a` serves once it campaigns, which may be after the others hold.
    let mut answer = None;
    wait_for("/leader to answer", Duration::from_secs(20), || {
        answer = get(port, "/leader", Duration::from_secs(2));
        answer.is_some()
    });
    let (status, body) = answer.unwrap();
    assert_eq!(status, 200);
    let v: serde_json::Value = serde_json::from_str(&body).unwrap();
    let holders: Vec<(u64, String)> = v["holders"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|h| Some((h["index"].as_u64()?, h["holder"].as_str()?.to_string())))
        .collect();
    assert_eq!(holders.iter().map(|h| h.0).collect::<Vec<_>>(), [0, 1], "/leader lists both holders: {body}");
    // `a` may hold or follow: /is-leader says which, with its index if it holds.
    if let Some((200, body)) = get(port, "/is-leader", Duration::from_secs(2)) {
        let v: serde_json::Value = serde_json::from_str(&body).unwrap();
        assert!(v["holder_index"].as_u64().is_some_and(|i| i < 2) && v["holders"] == 2, "{body}");
    }
    let shown =
        |i: u32| lines.lock().unwrap().iter().filter(|l| l.contains(&format!("jobs/pool [{i}]  holder"))).count();
    wait_for("watch to show both holders", Duration::from_secs(20), || shown(0) >= 1 && shown(1) >= 1);
    // A holder stops: the candidate left takes its index, and watch tells of it.
    let (index, name) = holders[0].clone();
    let before = shown(index as u32);
    let i = runs.iter().position(|(id, _)| name.starts_with(&format!("{id}."))).expect("the holder is one of ours");
    let (_, mut holder) = runs.remove(i);
    stop(&mut holder);
    wait_for("watch to show the new holder", Duration::from_secs(20), || shown(index as u32) > before);
    for (_, mut p) in runs {
        stop(&mut p);
    }
    let _ = watch.kill();
    let _ = watch.wait();
}

/// Stops a `tenure run` with SIGTERM and waits for it.
fn stop(p: &mut Proc) {
    let _ = rustix::process::kill_process(
        rustix::process::Pid::from_raw(p.id() as i32).unwrap(),
        rustix::process::Signal::TERM,
    );
    let _ = p.wait();
}
