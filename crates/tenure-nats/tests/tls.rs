//! NATS over TLS against a server that asks for a client certificate (`--tlsverify`),
//! with a private CA: `ca=` verifies the server (one signed by another CA is refused),
//! `cert=` and `key=` let the store in, and half a client certificate is refused before
//! any connection.

use std::time::Duration;

use tenure::store::Acquire;
use tenure_nats::NatsStore;
use tenure_testkit::certs::{Certs, TlsServer, client_certificates_are_required, first_grant};

/// A nats-server with JetStream on loopback, TLS only, client certificates required.
fn member(certs: &Certs) -> Option<TlsServer> {
    TlsServer::start("nats-server", "nats-server", |port, data| {
        let (port, data) = (port.to_string(), data.display().to_string());
        [
            ["-a", "127.0.0.1", "-p", &port, "-js", "-sd", &data].as_slice(),
            &["--tls", "--tlscert", &certs.path("server.pem"), "--tlskey", &certs.path("server.key")],
            &["--tlscacert", &certs.path("ca.pem"), "--tlsverify"],
        ]
        .concat()
        .into_iter()
        .map(String::from)
        .collect()
    })
}

async fn acquire(url: String) -> Result<Acquire, String> {
    first_grant(NatsStore::connect(&url), Duration::from_secs(5)).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls_verifies_the_server_against_the_ca_given_and_sends_a_client_certificate() {
    let Some(certs) = Certs::make() else { return };
    let Some(m) = member(&certs) else { return };
    client_certificates_are_required(&certs, |q| format!("nats://127.0.0.1:{}?{q}", m.port), acquire).await;
}

#[tokio::test]
async fn half_a_client_certificate_and_files_that_cannot_be_pem_are_refused() {
    for (url, says) in [
        ("nats://127.0.0.1:1?cert=/tmp/c.pem", "go together"),
        ("nats://127.0.0.1:1?ca=/tmp/ca.pem&key=/tmp/k.pem", "go together"),
        ("nats://127.0.0.1:1?ca=/dev/zero", "not a regular file"),
        ("nats://127.0.0.1:1?ca=/nonexistent/ca.pem", "cannot read it"),
    ] {
        let err = NatsStore::connect(url).await.err().unwrap_or_else(|| panic!("{url} was taken"));
        assert!(format!("{err:#}").contains(says), "{url}: {err:#}");
    }
}
