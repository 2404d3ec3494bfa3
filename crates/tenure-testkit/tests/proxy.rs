//! The proxy passes, cuts, black-holes and delays traffic, and answers requests itself.

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::time::{Duration, Instant};

use tenure_testkit::proxy::{Mode, Proxy};

/// An echo server on a free port.
fn echo() -> u16 {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = l.local_addr().unwrap().port();
    std::thread::spawn(move || {
        for s in l.incoming().flatten() {
            std::thread::spawn(move || {
                let mut s = s;
                let mut buf = [0u8; 1024];
                while let Ok(n) = s.read(&mut buf) {
                    if n == 0 || s.write_all(&buf[..n]).is_err() {
                        return;
                    }
                }
            });
        }
    });
    port
}

fn roundtrip(s: &mut TcpStream) -> std::io::Result<Duration> {
    let t0 = Instant::now();
    s.write_all(b"ping")?;
    let mut buf = [0u8; 4];
    s.read_exact(&mut buf)?;
    assert_eq!(&buf, b"ping");
    Ok(t0.elapsed())
}

#[test]
fn passes_delays_blackholes_and_cuts() {
    let proxy = Proxy::start(("127.0.0.1", echo())).unwrap();
    let mut s = TcpStream::connect(("127.0.0.1", proxy.port())).unwrap();
    s.set_read_timeout(Some(Duration::from_millis(500))).unwrap();
    roundtrip(&mut s).expect("pass");
    proxy.set(Mode::Delay(Duration::from_millis(100)));
    assert!(roundtrip(&mut s).unwrap() >= Duration::from_millis(200), "both directions are delayed");
    proxy.set(Mode::BlackHole);
    assert!(roundtrip(&mut s).is_err(), "a black hole answers nothing");
    proxy.set(Mode::Cut);
    std::thread::sleep(Duration::from_millis(100));
    let mut buf = [0u8; 4];
    assert!(matches!(s.read(&mut buf), Ok(0) | Err(_)), "a cut closes open connections");
    let mut fresh = TcpStream::connect(("127.0.0.1", proxy.port())).unwrap();
    fresh.set_read_timeout(Some(Duration::from_millis(500))).unwrap();
    assert!(roundtrip(&mut fresh).is_err(), "and refuses new ones");
    proxy.set(Mode::Pass);
    let mut again = TcpStream::connect(("127.0.0.1", proxy.port())).unwrap();
    roundtrip(&mut again).expect("traffic passes again");
}

#[test]
fn answers_requests_itself_without_passing_them_on_and_closes_open_connections() {
    let proxy = Proxy::start(("127.0.0.1", echo())).unwrap();
    let mut open = TcpStream::connect(("127.0.0.1", proxy.port())).unwrap();
    roundtrip(&mut open).unwrap();
    let reply: &'static [u8] = b"HTTP/1.1 503 Slow Down\r\nContent-Length: 0\r\nConnection: close\r\n\r\n";
    proxy.set(Mode::Answer(reply));
    // The open connection is closed (the proxy notices within 20 ms of idling).
    open.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let mut buf = [0u8; 16];
    assert_eq!(open.read(&mut buf).unwrap_or(0), 0, "an open connection went on passing traffic");
    // A new one gets the answer to its request, not an echo, and is closed after it.
    let mut s = TcpStream::connect(("127.0.0.1", proxy.port())).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    s.write_all(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n").unwrap();
    let mut got = Vec::new();
    s.read_to_end(&mut got).unwrap();
    assert_eq!(got, reply);
    proxy.set(Mode::Pass);
    let mut s = TcpStream::connect(("127.0.0.1", proxy.port())).unwrap();
    roundtrip(&mut s).unwrap();
}

#[test]
fn strands_open_connections_for_good_and_passes_new_ones() {
    let proxy = Proxy::start(("127.0.0.1", echo())).unwrap();
    let mut old = TcpStream::connect(("127.0.0.1", proxy.port())).unwrap();
    old.set_read_timeout(Some(Duration::from_millis(300))).unwrap();
    roundtrip(&mut old).unwrap();
    proxy.set(Mode::Strand);
    assert!(roundtrip(&mut old).is_err(), "a stranded connection answers nothing");
    let mut new = TcpStream::connect(("127.0.0.1", proxy.port())).unwrap();
    new.set_read_timeout(Some(Duration::from_millis(500))).unwrap();
    roundtrip(&mut new).expect("a connection opened after the strand passes");
    proxy.set(Mode::Pass);
    let mut buf = [0u8; 8];
    assert!(old.read(&mut buf).is_err(), "a stranded connection stays so when the mode changes");
    roundtrip(&mut new).expect("the new one still passes");
    proxy.set(Mode::Cut);
    old.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let closed = match old.read(&mut buf) {
        Ok(n) => n == 0,
        Err(e) => !matches!(e.kind(), std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut),
    };
    assert!(closed, "a cut closes a stranded connection");
}
