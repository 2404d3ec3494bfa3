//! `etcds://` against an etcd member that serves clients over TLS only and asks for a
//! client certificate, with a private CA: `ca=` verifies the member (one signed by
//! another CA is refused), `cert=` and `key=` let the store in, and TLS settings on
//! `etcd://` are refused before any connection.

use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use tenure::store::Acquire;
use tenure_etcd::EtcdStore;
use tenure_testkit::certs::{Certs, first_grant};
use tenure_testkit::servers;

/// An etcd member on loopback with TLS for clients (and client certificates required),
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
    let Some(etcd) = servers::find_program("etcd") else {
        servers::skip("etcd is not installed; install the Debian package etcd-server");
        return None;
    };
    let (port, peer) = (servers::free_port(), servers::free_port());
    let data = tempfile::tempdir().unwrap();
    let client = format!("https://127.0.0.1:{port}");
    let peer = format!("http://127.0.0.1:{peer}");
    let child = Command::new(etcd)
        .args(["--data-dir", &data.path().display().to_string(), "--listen-client-urls", &client])
        .args(["--advertise-client-urls", &client, "--listen-peer-urls", &peer, "--initial-advertise-peer-urls", &peer])
        .args(["--initial-cluster", &format!("default={peer}")])
        .args(["--cert-file", &certs.path("server.pem"), "--key-file", &certs.path("server.key")])
        .args(["--trusted-ca-file", &certs.path("ca.pem"), "--client-cert-auth"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("etcd starts");
    Some(Member { child, port, _data: data })
}

async fn acquire(url: &str) -> Result<Acquire, String> {
    first_grant(EtcdStore::connect(url), Duration::from_secs(5)).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn etcds_verifies_the_member_against_the_ca_given_and_sends_a_client_certificate() {
    let Some(certs) = Certs::make() else { return };
    let Some(m) = member(&certs) else { return };
    let base = format!("etcds://127.0.0.1:{}?ca={}", m.port, certs.path("ca.pem"));
    let good = format!("{base}&cert={}&key={}", certs.path("client.pem"), certs.path("client.key"));
    // The member takes a moment to serve.
    let t0 = Instant::now();
    loop {
        match acquire(&good).await {
            Ok(a) => {
                assert!(matches!(a, Acquire::Acquired(_) | Acquire::Held(_)));
                break;
            }
            Err(e) => assert!(t0.elapsed() < Duration::from_secs(30), "the TLS member never served: {e}"),
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let without = acquire(&base).await;
    assert!(without.is_err(), "a member that asks for a client certificate let one without in: {without:?}");
    let stranger = format!("{base}&cert={}&key={}", certs.path("stranger.pem"), certs.path("stranger.key"));
    let stranger = acquire(&stranger).await;
    assert!(stranger.is_err(), "a client certificate of another CA was let in: {stranger:?}");
    let other_ca = format!(
        "etcds://127.0.0.1:{}?ca={}&cert={}&key={}",
        m.port,
        certs.path("other-ca.pem"),
        certs.path("client.pem"),
        certs.path("client.key")
    );
    let other_ca = acquire(&other_ca).await;
    assert!(other_ca.is_err(), "a member signed by another CA than ca= was believed: {other_ca:?}");
}

#[tokio::test]
async fn tls_settings_on_a_plain_url_or_half_a_client_certificate_are_refused() {
    for (url, says) in [
        ("etcd://127.0.0.1:1?ca=/tmp/ca.pem", "need etcds://"),
        ("etcd://127.0.0.1:1?cert=/tmp/c.pem&key=/tmp/k.pem", "need etcds://"),
        ("etcds://127.0.0.1:1?cert=/tmp/c.pem", "go together"),
        ("etcds://127.0.0.1:1?ca=/nonexistent/ca.pem", "ca=/nonexistent/ca.pem: cannot read it"),
        ("etcds://127.0.0.1:1?ca=/dev/zero", "not a regular file"),
    ] {
        let err = EtcdStore::connect(url).await.err().unwrap_or_else(|| panic!("{url} was taken"));
        assert!(format!("{err:#}").contains(says), "{url}: {err:#}");
    }
}
