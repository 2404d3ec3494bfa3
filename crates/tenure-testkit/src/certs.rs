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
