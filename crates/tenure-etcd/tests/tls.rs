//! `etcds://` against an etcd member that serves clients over TLS only and asks for a
//! client certificate, with a private CA: `ca=` verifies the member (one signed by
//! another CA is refused), `cert=` and `key=` let the store in, and TLS settings on
//! `etcd://` are refused before any connection.

use std::time::Duration;

use tenure::store::Acquire;
use tenure_etcd::EtcdStore;
use tenure_testkit::certs::{Certs, TlsServer, client_certificates_are_required, first_grant};
use tenure_testkit::servers;

/// An etcd member on loopback with TLS for clients (and client certificates required).
fn member(certs: &Certs) -> Option<TlsServer> {
    TlsServer::start("etcd", "etcd-server", |port, data| {
        let client = format!("https://127.0.0.1:{port}");
        let peer = format!("http://127.0.0.1:{}", servers::free_port());
        let cluster = format!("default={peer}");
        let data = data.display().to_string();
        [
            ["--data-dir", &data, "--listen-client-urls", &client, "--advertise-client-urls", &client].as_slice(),
            &["--listen-peer-urls", &peer, "--initial-advertise-peer-urls", &peer, "--initial-cluster", &cluster],
            &["--cert-file", &certs.path("server.pem"), "--key-file", &certs.path("server.key")],
            &["--trusted-ca-file", &certs.path("ca.pem"), "--client-cert-auth"],
        ]
        .concat()
        .into_iter()
        .map(String::from)
        .collect()
    })
}

async fn acquire(url: String) -> Result<Acquire, String> {
    first_grant(EtcdStore::connect(&url), Duration::from_secs(5)).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn etcds_verifies_the_member_against_the_ca_given_and_sends_a_client_certificate() {
    let Some(certs) = Certs::make() else { return };
    let Some(m) = member(&certs) else { return };
    client_certificates_are_required(&certs, |q| format!("etcds://127.0.0.1:{}?{q}", m.port), acquire).await;
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
