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
