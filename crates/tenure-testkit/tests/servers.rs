//! Each launcher starts its server, which answers; restarts keep the port.

use std::net::TcpStream;

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
