//! `zks://` against a ZooKeeper server with a TLS port and a private certificate
//! authority: the server is verified against `ca=` and by its address (a server signed by
//! another CA, or reached by a name its certificate does not hold, is refused), a server
//! that asks for a client certificate gets `cert=` and `key=`, and the plain protocol does
//! not reach the TLS port.

use std::path::Path;
use std::time::Duration;

use tenure::store::Acquire;
use tenure_testkit::certs::{Certs, first_grant};
use tenure_testkit::servers::{self, Kind};
use tenure_zookeeper::ZkStore;

/// A ZooKeeper server with a TLS port beside its plain one (which the launcher uses to
/// see it serve); returns it and the TLS port. `client_auth`: it asks for a client
/// certificate signed by the CA.
fn tls_server(dir: &Path, client_auth: bool) -> Option<(servers::Server, u16)> {
    let file = |n: &str| dir.join(n).display().to_string();
    // ZooKeeper reads its key and certificate from one PEM file.
    let both = dir.join(format!("server-both-{client_auth}.pem"));
    let key = std::fs::read_to_string(dir.join("server.key")).unwrap();
    let cert = std::fs::read_to_string(dir.join("server.pem")).unwrap();
    std::fs::write(&both, format!("{key}{cert}")).unwrap();
    let port = servers::free_port();
    let auth = if client_auth { "need" } else { "none" };
    let extra = [
        format!("secureClientPort={port}"),
        "secureClientPortAddress=127.0.0.1".to_string(),
        "serverCnxnFactory=org.apache.zookeeper.server.NettyServerCnxnFactory".to_string(),
        format!("ssl.keyStore.location={}", both.display()),
        "ssl.keyStore.type=PEM".to_string(),
        format!("ssl.trustStore.location={}", file("ca.pem")),
        "ssl.trustStore.type=PEM".to_string(),
        format!("ssl.clientAuth={auth}"),
        // The server would check a client certificate's name against the client's
        // address; the test clients' certificates name no address.
        "ssl.hostnameVerification=false".to_string(),
    ];
    let extra: Vec<&str> = extra.iter().map(String::as_str).collect();
    let server = servers::launch_configured(Kind::ZooKeeper, None, &extra)?;
    // The launcher saw the plain port serve; the TLS port opens on its own, a moment
    // later or sooner (CI at 5c23077 found it refusing a connection).
    let t0 = std::time::Instant::now();
    while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
        assert!(t0.elapsed() < Duration::from_secs(30), "the TLS port {port} never opened");
        std::thread::sleep(Duration::from_millis(50));
    }
    Some((server, port))
}

async fn acquire(url: &str) -> Result<Acquire, String> {
    first_grant(ZkStore::connect(url), Duration::from_secs(15)).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn zks_verifies_the_server_against_the_ca_given_and_by_its_address() {
    let Some(certs) = Certs::make() else { return };
    let p = |n: &str| certs.path(n);
    let Some((_server, port)) = tls_server(certs.dir(), false) else { return };
    let ok = acquire(&format!("zks://127.0.0.1:{port}/t?ca={}", p("ca.pem"))).await;
    assert!(matches!(ok, Ok(Acquire::Acquired(_))), "{ok:?}");
    let other = acquire(&format!("zks://127.0.0.1:{port}/t?ca={}", p("other-ca.pem"))).await;
    assert!(other.as_ref().is_err_and(|e| e.contains("UnknownIssuer")), "another CA than ca= was believed: {other:?}");
    // The certificate is for 127.0.0.1 only.
    let by_name = acquire(&format!("zks://localhost:{port}/t?ca={}", p("ca.pem"))).await;
    assert!(
        by_name.as_ref().is_err_and(|e| e.contains("not valid for name")),
        "a server whose certificate does not name the host asked for was believed: {by_name:?}"
    );
    let plain = acquire(&format!("zk://127.0.0.1:{port}/t")).await;
    assert!(plain.is_err(), "the plain protocol was served on the TLS port: {plain:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn zks_sends_a_client_certificate_to_a_server_that_asks_for_one() {
    let Some(certs) = Certs::make() else { return };
    let p = |n: &str| certs.path(n);
    let Some((_server, port)) = tls_server(certs.dir(), true) else { return };
    let base = format!("zks://127.0.0.1:{port}/t?ca={}", p("ca.pem"));
    let without = acquire(&base).await;
    // The error says TLS refused it, not merely that no host answered.
    assert!(
        without.as_ref().is_err_and(|e| e.contains("TLS to 127.0.0.1")),
        "a server that asks for a client certificate let one without in: {without:?}"
    );
    let stranger = acquire(&format!("{base}&cert={}&key={}", p("stranger.pem"), p("stranger.key"))).await;
    assert!(
        stranger.as_ref().is_err_and(|e| e.contains("TLS to 127.0.0.1")),
        "a client certificate of another CA was let in: {stranger:?}"
    );
    let with = acquire(&format!("{base}&cert={}&key={}", p("client.pem"), p("client.key"))).await;
    assert!(matches!(with, Ok(Acquire::Acquired(_))), "{with:?}");
}

#[tokio::test]
async fn tls_files_that_cannot_be_used_are_refused_before_any_connection() {
    let Some(certs) = Certs::make() else { return };
    let p = |n: &str| certs.path(n);
    for (url, says) in [
        (format!("zks://127.0.0.1:1/t?ca={}", p("missing.pem")), "ca=".to_string()),
        (format!("zks://127.0.0.1:1/t?ca={}", p("client.key")), "holds no PEM certificate".to_string()),
        (format!("zks://127.0.0.1:1/t?ca={}&cert={}&key={}", p("ca.pem"), p("client.pem"), p("ca.pem")), "key=".into()),
        ("zks://127.0.0.1:1/t?ca=/dev/zero".to_string(), "not a regular file".to_string()),
        ("zk://127.0.0.1:1/t?ca=/etc/hosts".to_string(), "write zks://".to_string()),
    ] {
        let e = ZkStore::connect(&url).await.err().unwrap_or_else(|| panic!("{url} was taken"));
        assert!(e.to_string().contains(&says), "{url}: {e}");
    }
}
