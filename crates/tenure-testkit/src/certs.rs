//! A private certificate authority for TLS tests, made with the `openssl` command: the CA
//! (`ca.pem`), a server certificate for 127.0.0.1 (`server.pem`, `server.key`), a client
//! certificate (`client.pem`, `client.key`), and a second CA (`other-ca.pem`) with a
//! client certificate of its own (`stranger.pem`, `stranger.key`) and a server certificate
//! for 127.0.0.1 (`other-server.pem`, `other-server.key`), for what must be refused. Keys
//! are P-256, certificates last two days.

use std::path::{Path, PathBuf};
use std::process::Command;

/// The files, in a temporary directory removed on drop.
pub struct Certs {
    dir: tempfile::TempDir,
}

impl Certs {
    /// Makes them all; `None` (after [`crate::servers::skip`]) without `openssl`.
    pub fn make() -> Option<Self> {
        if crate::servers::find_program("openssl").is_none() {
            crate::servers::skip("openssl is not installed; install the Debian package openssl");
            return None;
        }
        let dir = tempfile::tempdir().expect("a temporary directory");
        for name in ["ca", "other-ca"] {
            let (key, pem, subj) = (format!("{name}.key"), format!("{name}.pem"), format!("/CN=tenure test {name}"));
            openssl(
                dir.path(),
                &["req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes"],
                &["-keyout", &key, "-out", &pem, "-days", "2", "-subj", &subj],
            );
        }
        issue(dir.path(), "server", "ca", "IP:127.0.0.1");
        issue(dir.path(), "client", "ca", "DNS:client");
        issue(dir.path(), "stranger", "other-ca", "DNS:client");
        issue(dir.path(), "other-server", "other-ca", "IP:127.0.0.1");
        Some(Self { dir })
    }

    /// The directory that holds them.
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// The file `name` (`ca.pem`, `server.key`, …), as text for a URL or a command line.
    pub fn path(&self, name: &str) -> String {
        self.file(name).display().to_string()
    }

    /// The file `name`.
    pub fn file(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }
}

/// Runs `openssl` with `args` then `more` in `dir`; panics with its error output if it fails.
fn openssl(dir: &Path, args: &[&str], more: &[&str]) {
    let out = Command::new("openssl").current_dir(dir).args(args).args(more).output().expect("openssl runs");
    assert!(out.status.success(), "openssl {args:?} {more:?}: {}", String::from_utf8_lossy(&out.stderr));
}

/// A certificate `NAME.pem` with key `NAME.key` for `san`, signed by the CA `by`.
fn issue(dir: &Path, name: &str, by: &str, san: &str) {
    let ext = format!("{name}.ext");
    std::fs::write(dir.join(&ext), format!("subjectAltName={san}\n")).expect("the extension file is written");
    let (key, csr, pem, subj) =
        (format!("{name}.key"), format!("{name}.csr"), format!("{name}.pem"), format!("/CN={name}"));
    openssl(
        dir,
        &["req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes"],
        &["-keyout", &key, "-out", &csr, "-subj", &subj],
    );
    let (ca, ca_key) = (format!("{by}.pem"), format!("{by}.key"));
    openssl(
        dir,
        &["x509", "-req", "-in", &csr, "-CA", &ca, "-CAkey", &ca_key, "-CAcreateserial"],
        &["-out", &pem, "-days", "2", "-extfile", &ext],
    );
}

/// What a TLS test asks of a store made from a URL: one grant of a fresh election within
/// `within`, or the error, written out whole (`connect: …` when making the store failed).
pub async fn first_grant<S, F>(connecting: F, within: std::time::Duration) -> Result<tenure::store::Acquire, String>
where
    S: tenure::LeaseStore,
    F: std::future::Future<Output = Result<S, tenure::StoreError>>,
{
    let store = connecting.await.map_err(|e| format!("connect: {e}"))?;
    let req = tenure::store::AcquireRequest {
        election: tenure::ElectionName::new("tls/e").expect("a valid name"),
        holder: tenure::HolderId::generate(),
        ttl: std::time::Duration::from_secs(5),
        metadata: Vec::new(),
    };
    tokio::time::timeout(within, store.try_acquire(&req))
        .await
        .map_err(|_| "timed out".to_string())?
        .map_err(|e| format!("{e:#}"))
}

/// A server started by a TLS test from an installed binary, with a data directory of its
/// own, on a loopback port; killed when dropped. For servers whose TLS settings
/// [`crate::servers`]' launchers do not take.
pub struct TlsServer {
    child: std::process::Child,
    /// The port it serves on.
    pub port: u16,
    _data: tempfile::TempDir,
}

impl TlsServer {
    /// Starts `program` with the arguments `args(port, data_dir)` gives; `None` (after
    /// [`crate::servers::skip`], naming the Debian `package`) when it is not installed.
    /// It may not serve yet: [`client_certificates_are_required`] waits for it.
    pub fn start(program: &str, package: &str, args: impl FnOnce(u16, &Path) -> Vec<String>) -> Option<Self> {
        let Some(bin) = crate::servers::find_program(program) else {
            crate::servers::skip(&format!("{program} is not installed; install the Debian package {package}"));
            return None;
        };
        let port = crate::servers::free_port();
        let data = tempfile::tempdir().expect("a temporary directory");
        let child = Command::new(bin)
            .args(args(port, data.path()))
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .unwrap_or_else(|e| panic!("{program} starts: {e}"));
        Some(Self { child, port, _data: data })
    }
}

impl Drop for TlsServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// What a store that speaks TLS does against a server that asks for a client
/// certificate: with `ca=`, `cert=` and `key=` of this CA it is served (waited for up to
/// 30 s, while the server starts); without a client certificate, with one of another CA,
/// or trusting another CA than the server's, it is refused. `url(query)` is the store's
/// URL of the server with `query` (`ca=…&cert=…&key=…`) among its parameters; `acquire`
/// makes a store from a URL and asks it for a grant (see [`first_grant`]).
pub async fn client_certificates_are_required<F, Fut>(certs: &Certs, url: impl Fn(&str) -> String, acquire: F)
where
    F: Fn(String) -> Fut,
    Fut: std::future::Future<Output = Result<tenure::store::Acquire, String>>,
{
    use std::time::{Duration, Instant};
    let (ca, other_ca) = (certs.path("ca.pem"), certs.path("other-ca.pem"));
    let with = |ca: &str, who: &str| {
        url(&format!("ca={ca}&cert={}&key={}", certs.path(&format!("{who}.pem")), certs.path(&format!("{who}.key"))))
    };
    let t0 = Instant::now();
    loop {
        match acquire(with(&ca, "client")).await {
            Ok(a) => {
                assert!(matches!(a, tenure::store::Acquire::Acquired(_) | tenure::store::Acquire::Held(_)));
                break;
            }
            Err(e) => assert!(t0.elapsed() < Duration::from_secs(30), "the TLS server never served: {e}"),
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let without = acquire(url(&format!("ca={ca}"))).await;
    assert!(without.is_err(), "a server that asks for a client certificate let one without in: {without:?}");
    let stranger = acquire(with(&ca, "stranger")).await;
    assert!(stranger.is_err(), "a client certificate of another CA was let in: {stranger:?}");
    let other = acquire(with(&other_ca, "client")).await;
    assert!(other.is_err(), "a server signed by another CA than ca= was believed: {other:?}");
}
