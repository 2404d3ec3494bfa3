//! Each launcher starts its server, which answers; restarts keep the port.

use std::net::TcpStream;
use std::process::Command;

use tenure_testkit::servers::{self, Kind};

fn exercise(kind: Kind) {
    let Some(mut s) = servers::launch(kind) else {
        return;
    };
    let port = s.port();
    assert!(TcpStream::connect(("127.0.0.1", port)).is_ok(), "{kind:?} answers on {port}");
    let pid = s.pid().unwrap();
    s.restart();
    assert_ne!(s.pid().unwrap(), pid, "a restart is a new process");
    assert!(TcpStream::connect(("127.0.0.1", port)).is_ok(), "{kind:?} answers again on the same port");
    s.kill();
    assert!(TcpStream::connect(("127.0.0.1", port)).is_err(), "a killed server no longer answers");
}

#[test]
fn postgres_launcher() {
    exercise(Kind::Postgres);
}

#[test]
fn mariadb_launcher() {
    exercise(Kind::MariaDb);
}

#[test]
fn redis_launcher() {
    exercise(Kind::Redis);
}

#[test]
fn nats_launcher() {
    exercise(Kind::Nats);
}

#[test]
fn etcd_launcher() {
    exercise(Kind::Etcd);
}

#[test]
fn a_paused_server_answers_nothing_until_resumed() {
    use std::io::{Read, Write};
    let Some(s) = servers::launch(Kind::Redis) else { return };
    let mut c = TcpStream::connect(("127.0.0.1", s.port())).unwrap();
    c.set_read_timeout(Some(std::time::Duration::from_millis(300))).unwrap();
    let mut buf = [0u8; 7];
    s.pause();
    c.write_all(b"PING\r\n").unwrap();
    assert!(c.read_exact(&mut buf).is_err(), "a paused server must not answer");
    s.resume();
    c.set_read_timeout(Some(std::time::Duration::from_secs(5))).unwrap();
    c.read_exact(&mut buf).expect("the resumed server answers the waiting request");
    assert_eq!(&buf, b"+PONG\r\n");
}

/// The first line of the server's answer to a plain HTTP GET.
fn http_get(port: u16, path: &str) -> String {
    use std::io::{BufRead, Write};
    let mut c = TcpStream::connect(("127.0.0.1", port)).unwrap();
    c.set_read_timeout(Some(std::time::Duration::from_secs(10))).unwrap();
    write!(c, "GET {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nConnection: close\r\n\r\n").unwrap();
    let mut line = String::new();
    std::io::BufReader::new(c).read_line(&mut line).unwrap();
    line.trim_end().to_string()
}

/// An emulator launcher: its server answers HTTP on its port, across a restart.
fn exercise_http(kind: Kind, path: &str, status: &str) {
    let Some(mut s) = servers::launch(kind) else { return };
    let first = http_get(s.port(), path);
    assert!(first.starts_with(&format!("HTTP/1.1 {status}")), "{kind:?} answered {first:?}");
    s.restart();
    let again = http_get(s.port(), path);
    assert!(again.starts_with(&format!("HTTP/1.1 {status}")), "{kind:?} answered {again:?} after a restart");
    assert!(s.url().starts_with("http://127.0.0.1:"), "{}", s.url());
}

#[test]
fn azurite_launcher() {
    // The emulator wants a signed request: a plain one is refused, but answered.
    exercise_http(Kind::Azurite, "/devstoreaccount1?comp=list", "403");
    exercise(Kind::Azurite);
}

#[test]
fn moto_launcher() {
    exercise_http(Kind::Moto, "/", "200");
}

#[test]
fn fake_gcs_launcher() {
    exercise_http(Kind::FakeGcs, "/storage/v1/b", "200");
}

/// Run by the test below, in a process of its own.
#[test]
#[ignore = "run by a_test_skipped_for_a_missing_program_says_so_where_cargo_test_shows_it"]
fn skips_for_a_missing_program() {
    servers::skip("frobd is not installed (frobd not found); install frob-server");
}

#[test]
fn a_test_skipped_for_a_missing_program_says_so_where_cargo_test_shows_it() {
    let run = |required: Option<&str>| {
        let mut cmd = Command::new(std::env::current_exe().unwrap());
        cmd.args(["--ignored", "--exact", "skips_for_a_missing_program"]).env_remove("TENURE_REQUIRE_SERVERS");
        if let Some(v) = required {
            cmd.env("TENURE_REQUIRE_SERVERS", v);
        }
        let out = cmd.output().unwrap();
        (
            out.status.success(),
            String::from_utf8_lossy(&out.stdout).into_owned(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    };
    // The harness shows nothing a passing test printed with eprintln!; the skip must
    // still reach the terminal.
    let (passed, stdout, stderr) = run(None);
    assert!(passed, "{stdout}{stderr}");
    assert!(stderr.contains("skipping: frobd is not installed (frobd not found); install frob-server"), "{stderr}");
    // In CI a missing server fails the test, naming what to install.
    let (passed, stdout, stderr) = run(Some("1"));
    assert!(!passed, "{stdout}{stderr}");
    assert!(stdout.contains("install frob-server (TENURE_REQUIRE_SERVERS=1)"), "{stdout}{stderr}");
}

#[test]
fn free_ports_are_never_handed_out_twice() {
    // Two tests starting a process each at once must not be given one port.
    let ports: Vec<u16> = (0..2000).map(|_| servers::free_port()).collect();
    let distinct: std::collections::BTreeSet<u16> = ports.iter().copied().collect();
    assert_eq!(distinct.len(), ports.len(), "a port was handed out twice");
}

/// Run by the test below, in a process of its own: draws ports, prints them, and holds
/// them (stays alive) until its standard input closes.
#[test]
#[ignore = "run by free_ports_are_never_handed_to_two_live_processes"]
fn draws_ports_and_waits() {
    use std::io::{Read, Write};
    let ports: Vec<String> = (0..1000).map(|_| servers::free_port().to_string()).collect();
    println!("ports {}", ports.join(" "));
    std::io::stdout().flush().unwrap();
    let _ = std::io::stdin().read_to_end(&mut Vec::new());
}

#[test]
fn free_ports_are_never_handed_to_two_live_processes() {
    use std::io::{BufRead, BufReader};
    use std::process::Stdio;
    // CI runs torture rounds and test binaries side by side: a port one process was
    // given must not go to another while the first lives.
    let mut child = Command::new(std::env::current_exe().unwrap())
        .args(["--ignored", "--exact", "draws_ports_and_waits", "--nocapture"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let theirs: std::collections::BTreeSet<u16> = lines
        .by_ref()
        .map_while(Result::ok)
        .find_map(|l| l.strip_prefix("ports ").map(|p| p.split(' ').map(|p| p.parse().unwrap()).collect()))
        .expect("the other process printed its ports");
    assert_eq!(theirs.len(), 1000);
    let ours: Vec<u16> = (0..2000).map(|_| servers::free_port()).collect();
    drop(child.stdin.take());
    lines.for_each(drop);
    child.wait().unwrap();
    let shared: Vec<u16> = ours.into_iter().filter(|p| theirs.contains(p)).collect();
    assert!(shared.is_empty(), "ports handed to both processes: {shared:?}");
}
