//! NATS over TLS against a server that asks for a client certificate (`--tlsverify`),
//! with a private CA: `ca=` verifies the server (one signed by another CA is refused),
//! `cert=` and `key=` let the store in, and half a client certificate is refused before
//! any connection.

use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use tenure::store::Acquire;
use tenure_nats::NatsStore;
use tenure_testkit::certs::{Certs, first_grant};
use tenure_testkit::servers;

/// A nats-server with JetStream on loopback, TLS only, client certificates required;
/// stopped when dropped.
struct Member {
    child: Child,
    port: u16,
    _data: tempfile::TempDir,
}

impl Drop for Member {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn member(certs: &Certs) -> Option<Member> {
    let Some(nats) = servers::find_program("nats-server") else {
        servers::skip("nats-server is not installed; install the Debian package nats-server");
        return None;
    };
    let port = servers::free_port();
    let data = tempfile::tempdir().unwrap();
    let child = Command::new(nats)
        .args(["-a", "127.0.0.1", "-p", &port.to_string(), "-js", "-sd", &data.path().display().to_string()])
        .args(["--tls", "--tlscert", &certs.path("server.pem"), "--tlskey", &certs.path("server.key")])
        .args(["--tlscacert", &certs.path("ca.pem"), "--tlsverify"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("nats-server starts");
    Some(Member { child, port, _data: data })
}

async fn acquire(url: &str) -> Result<Acquire, String> {
    first_grant(NatsStore::connect(url), Duration::from_secs(5)).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls_verifies_the_server_against_the_ca_given_and_sends_a_client_certificate() {
    let Some(certs) = Certs::make() else { return };
    let Some(m) = member(&certs) else { return };
    let base = format!("nats://127.0.0.1:{}?ca={}", m.port, certs.path("ca.pem"));
    let good = format!("{base}&cert={}&key={}", certs.path("client.pem"), certs.path("client.key"));
    // The server takes a moment to serve.
    let t0 = Instant::now();
    loop {
        match acquire(&good).await {
            Ok(a) => {
                assert!(matches!(a, Acquire::Acquired(_) | Acquire::Held(_)));
                break;
            }
            Err(e) => assert!(t0.elapsed() < Duration::from_secs(30), "the TLS server never served: {e}"),
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let without = acquire(&base).await;
    assert!(without.is_err(), "a server that asks for a client certificate let one without in: {without:?}");
    let stranger = format!("{base}&cert={}&key={}", certs.path("stranger.pem"), certs.path("stranger.key"));
    let stranger = acquire(&stranger).await;
    assert!(stranger.is_err(), "a client certificate of another CA was let in: {stranger:?}");
    let other_ca = format!(
        "nats://127.0.0.1:{}?ca={}&cert={}&key={}",
        m.port,
        certs.path("other-ca.pem"),
        certs.path("client.pem"),
        certs.path("client.key")
    );
    let other_ca = acquire(&other_ca).await;
    assert!(other_ca.is_err(), "a server signed by another CA than ca= was believed: {other_ca:?}");
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
