//! `rediss://` with a private certificate authority: the server is verified against
//! `ca=` (a server signed by another CA is refused), a server that asks for a client
//! certificate gets `cert=` and `key=`, and TLS settings that would be ignored or would
//! not verify are refused before any connection.

use std::path::Path;
use std::time::Duration;

use tenure::store::Acquire;
use tenure_redis::RedisStore;
use tenure_testkit::certs::{Certs, client_certificates_are_required, first_grant};
use tenure_testkit::servers::{self, Kind};

/// A Redis server with a TLS port beside its plain one; returns it and the TLS port.
fn tls_server(dir: &Path, auth_clients: bool) -> Option<(servers::Server, u16)> {
    let port = servers::free_port().to_string();
    let file = |n: &str| dir.join(n).display().to_string();
    let (cert, key, ca) = (file("server.pem"), file("server.key"), file("ca.pem"));
    let auth = if auth_clients { "yes" } else { "no" };
    let extra = [
        "--tls-port",
        &port,
        "--tls-cert-file",
        &cert,
        "--tls-key-file",
        &key,
        "--tls-ca-cert-file",
        &ca,
        "--tls-auth-clients",
        auth,
    ];
    let server = servers::launch_configured(Kind::Redis, None, &extra)?;
    Some((server, port.parse().unwrap()))
}

async fn acquire(url: &str) -> Result<Acquire, String> {
    first_grant(RedisStore::connect(url), Duration::from_secs(10)).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rediss_verifies_the_server_against_the_ca_given_and_sends_a_client_certificate() {
    let Some(certs) = Certs::make() else { return };
    let p = |n: &str| certs.path(n);
    let Some((_server, port)) = tls_server(certs.dir(), false) else { return };
    let base = format!("rediss://127.0.0.1:{port}/0");
    let ok = acquire(&format!("{base}?ca={}&restart_guard=off", p("ca.pem"))).await;
    assert!(matches!(ok, Ok(Acquire::Acquired(_))), "{ok:?}");
    // The system's roots do not know the private CA; another CA is not the server's.
    let no_ca = acquire(&format!("{base}?restart_guard=off")).await;
    assert!(no_ca.is_err(), "a server signed by a CA the system does not trust was believed: {no_ca:?}");
    let other = acquire(&format!("{base}?ca={}&restart_guard=off", p("other-ca.pem"))).await;
    assert!(other.is_err(), "a server signed by another CA than ca= was believed: {other:?}");

    // A server that asks for a client certificate.
    let Some((_server, port)) = tls_server(certs.dir(), true) else { return };
    let url = |q: &str| format!("rediss://127.0.0.1:{port}/0?{q}&restart_guard=off");
    client_certificates_are_required(&certs, url, |u| async move { acquire(&u).await }).await;
}

#[tokio::test]
async fn tls_settings_that_would_be_ignored_or_not_verify_are_refused() {
    for (url, says) in [
        ("redis://127.0.0.1:1/0?ca=/tmp/ca.pem", "write rediss://"),
        ("rediss://127.0.0.1:1/0?cas=/tmp/ca.pem", "unknown parameter \"cas\""),
        ("redis://127.0.0.1:1/0?sslmode=require", "unknown parameter \"sslmode\""),
        ("rediss://127.0.0.1:1/0#insecure", "is refused"),
        ("rediss://127.0.0.1:1/0?cert=/tmp/c.pem", "go together"),
        ("rediss://127.0.0.1:1/0?ca=/nonexistent/ca.pem", "ca=/nonexistent/ca.pem: cannot read it"),
        ("rediss://127.0.0.1:1/0?ca=/dev/zero", "not a regular file"),
        ("redis+sentinel://127.0.0.1:1/m?ca=/tmp/ca.pem", "write rediss+sentinel://"),
        ("rediss+sentinel://127.0.0.1:1/m?cert=/tmp/c.pem", "go together"),
        ("rediss+sentinel://127.0.0.1:1/m?ca=/nonexistent/ca.pem", "cannot read it"),
    ] {
        let err = RedisStore::connect(url).await.err().unwrap_or_else(|| panic!("{url} was taken"));
        assert!(format!("{err:#}").contains(says), "{url}: {err:#}");
    }
}
