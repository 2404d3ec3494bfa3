//! PostgreSQL with `ssl=on` and a private CA: `sslmode=verify-full` verifies the server
//! against `sslrootcert`, and so does `sslmode=require` when a root certificate is given
//! (as libpq does): a server signed by another CA is refused either way.

use std::time::Duration;

use tenure::{ElectionName, LeaseStore};
use tenure_postgres::PostgresStore;
use tenure_testkit::certs::Certs;
use tenure_testkit::servers::{self, Kind, Server};

/// A PostgreSQL server with TLS on, its certificate from `certs`. The server wants its
/// key readable by the user it runs as alone (the `postgres` user when the tests run as
/// root), so both files are copied to a directory of their own.
fn tls_server(certs: &Certs, dir: &std::path::Path) -> Option<Server> {
    use std::os::unix::fs::PermissionsExt;
    let (cert, key) = (dir.join("server.pem"), dir.join("server.key"));
    std::fs::copy(certs.file("server.pem"), &cert).unwrap();
    std::fs::copy(certs.file("server.key"), &key).unwrap();
    std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o755)).unwrap();
    std::fs::set_permissions(&key, std::fs::Permissions::from_mode(0o600)).unwrap();
    if rustix::process::geteuid().is_root() {
        let passwd = std::fs::read_to_string("/etc/passwd").unwrap();
        let ids = passwd.lines().find_map(|l| {
            let f: Vec<&str> = l.split(':').collect();
            (f.first() == Some(&"postgres")).then(|| (f[2].parse::<u32>().ok(), f[3].parse::<u32>().ok()))
        });
        let Some((Some(uid), Some(gid))) = ids else {
            servers::skip("no postgres user to run PostgreSQL as");
            return None;
        };
        for f in [&cert, &key] {
            std::os::unix::fs::chown(f, Some(uid), Some(gid)).unwrap();
        }
    }
    let cert_arg = format!("ssl_cert_file={}", cert.display());
    let key_arg = format!("ssl_key_file={}", key.display());
    servers::launch_configured(Kind::Postgres, None, &["-c", "ssl=on", "-c", &cert_arg, "-c", &key_arg])
}

async fn reads(url: &str) -> Result<(), String> {
    let store = PostgresStore::connect(url).await.map_err(|e| format!("connect: {e}"))?;
    tokio::time::timeout(Duration::from_secs(10), store.get(&ElectionName::new("tls/e").unwrap()))
        .await
        .map_err(|_| "timed out".to_string())?
        .map(|_| ())
        .map_err(|e| format!("{e:#}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_server_is_verified_against_sslrootcert_with_verify_full_and_with_require() {
    let Some(certs) = Certs::make() else { return };
    let dir = tempfile::tempdir().unwrap();
    let Some(server) = tls_server(&certs, dir.path()) else { return };
    let base = format!("postgres://postgres@127.0.0.1:{}/postgres", server.port());
    let (ca, other) = (certs.path("ca.pem"), certs.path("other-ca.pem"));
    for (mode, root, ok) in [
        ("verify-full", &ca, true),
        ("verify-full", &other, false),
        ("require", &ca, true),
        // sqlx alone would take any server here; libpq, and tenure, verify.
        ("require", &other, false),
    ] {
        let got = reads(&format!("{base}?sslmode={mode}&sslrootcert={root}")).await;
        assert_eq!(got.is_ok(), ok, "sslmode={mode} with {root}: {got:?}");
    }
}
