//! ZooKeeper lease store for tenure.
//!
//! Each election is one **ephemeral node**, `PATH/ELECTION` (the election's `/` written as
//! `%2F`, so every election is a child of `PATH`), created in a ZooKeeper session whose
//! timeout is the lease's TTL. The ZooKeeper leader expires a session that it has not
//! heard from for its timeout and deletes its nodes: the server, not a client's clock,
//! judges when a dead, frozen or cut-off holder's lease ends.
//!
//! **One session per TTL.** A store keeps one session per TTL it is asked for, shared by
//! every election it holds with that TTL; the client keeps it alive with pings, so a
//! process pays one session however many elections it leads. It is opened only to take
//! a grant (a follower looks through the session that reads and watches) and closed
//! once it holds none. The server grants a
//! session timeout between its `minSessionTimeout` and `maxSessionTimeout` (by default 2
//! and 20 times its `tickTime`); a TTL it would not grant exactly is refused with an
//! error that names both. Because the session outlives a lease that its holder stops
//! renewing while the process lives on, the store deletes such a node itself once a TTL
//! has passed since the last acquire or renewal was sent (after the holder's own
//! deadline, on the same clock).
//!
//! **Tokens and revisions.** The node's creation zxid is the fencing token: zxids only
//! grow, across leader changes and restarts, so a node created again after a release,
//! an eviction or an expiry gets a larger one. A renewal is a transaction (a write,
//! ordered through the ZooKeeper leader) that checks the grant node's version and
//! writes the election's renewal node, `PATH/ELECTION/renewed`; the record's revision is
//! the later of the two nodes' modification zxids. The grant node itself is written only
//! when what it says changes (a grant, new metadata, an eviction), so the watchers of an
//! election hear of those and not of every renewal.
//!
//! **Compare-and-set.** Every write names the node version it read: renewal checks holder,
//! token, eviction flag and that the node belongs to this store's session; release also
//! checks the revision. Eviction after term marks the node; the holder can no longer
//! renew, and the node lives until the holder releases it or its session or TTL runs out.
//!
//! Followers wait on one persistent recursive watch per store, not on polling; the store
//! adds it again after every reconnection.
//!
//! ```no_run
//! # async fn t() -> Result<(), Box<dyn std::error::Error>> {
//! let store = tenure_zookeeper::ZkStore::connect("zk://127.0.0.1:2181,127.0.0.1:2182/apps/tenure").await?;
//! # Ok(()) }
//! ```

use std::collections::HashMap;
use std::future::Future;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use tenure::store::{
    Acquire, AcquireRequest, LedgerEntry, LedgerWrite, Renew, Revision, WatchStream, check_ledger_value, check_ttl,
};
use tenure::{ElectionName, ErrorKind, Evict, FencingToken, HolderId, LeaseRecord, LeaseStore, StoreError, WorkKey};
use tokio::time::Instant;
use zookeeper_client as zk;

/// The default path under which election nodes live.
pub const DEFAULT_PATH: &str = "/tenure";

/// How long one request may take before it counts as lost.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(5);

/// The session timeout asked for the session that only reads and watches (the server
/// may grant less: any timeout will do). It holds no grant, so its timeout bounds only how
/// long a dead connection goes unnoticed; the client pings an idle session every 3/20 of
/// it, and a longer one pings less often (every 4.5 s instead of 1.5 s).
const READER_SESSION: Duration = Duration::from_secs(30);

/// A lease store on a ZooKeeper ensemble.
#[derive(Clone)]
pub struct ZkStore {
    inner: Arc<Inner>,
}

struct Inner {
    /// `HOST:PORT,…` for the client.
    hosts: String,
    /// The parent of every election node, e.g. `/tenure`.
    path: String,
    /// Digest credentials, `USER:PASSWORD`.
    auth: Option<String>,
    /// `zks://`: TLS to every server, verified against the URL's CA; and the same
    /// settings for rustls, to say why a handshake failed.
    tls: Option<(zk::TlsOptions, Arc<rustls::ClientConfig>)>,
    described: String,
    /// One session per TTL in milliseconds, opened to take a grant and closed once it
    /// holds none (an `Arc`, so that one a request in flight uses is never closed).
    sessions: tokio::sync::Mutex<HashMap<u64, Arc<zk::Client>>>,
    /// The session that reads, deletes and watches.
    reader: tokio::sync::Mutex<Option<zk::Client>>,
    /// Whether `path` is known to exist.
    path_ready: AtomicBool,
    /// The grant nodes this store holds, by election node path.
    held: Mutex<HashMap<String, Held>>,
    /// Wakes the task that deletes nodes whose TTL has passed.
    held_changed: tokio::sync::Notify,
    sweeping: AtomicBool,
    changes: tenure::store::ChangeHub,
    /// Tests stop the sweeper just before it deletes: it says so, then waits.
    #[cfg(test)]
    before_delete: Mutex<Option<(tokio::sync::oneshot::Sender<()>, tokio::sync::oneshot::Receiver<()>)>>,
}

/// A grant node this store created and keeps alive.
#[derive(Clone, Debug)]
struct Held {
    /// The grant node's path.
    path: String,
    /// Creation zxid (the token).
    token: i64,
    /// The node's data version after our last write.
    version: i32,
    /// The node's data as of that version, and its stat: what a renewal that finds the
    /// version unchanged answers with.
    data: Vec<u8>,
    stat: zk::Stat,
    /// The session that owns it.
    session: i64,
    /// A TTL after the latest acquire or renewal was sent: the holder's deadline has passed.
    due: Instant,
}

/// What a URL says.
#[derive(Debug, PartialEq)]
struct Parsed {
    hosts: String,
    path: String,
    auth: Option<String>,
    /// `zks://`: the files of its TLS.
    tls: Option<TlsFiles>,
}

/// The files `zks://` names: the CA that signed the servers' certificates, and a client
/// certificate and key for servers that ask for one (`ssl.clientAuth`).
#[derive(Debug, PartialEq)]
struct TlsFiles {
    ca: String,
    identity: Option<(String, String)>,
}

fn parse_url(url: &str) -> Result<Parsed, StoreError> {
    let bad = |why: &str| {
        StoreError::invalid(format!(
            "ZooKeeper store URL: {why}; write zk://[USER:PASSWORD@]HOST:PORT[,HOST:PORT…][/PATH], or \
             zks://…[/PATH]?ca=PATH[&cert=PATH&key=PATH] for TLS (PATH defaults to {DEFAULT_PATH})"
        ))
    };
    let (url, ours) = tenure::store::url::take_params(url, &["ca", "cert", "key"]).map_err(|why| bad(&why))?;
    let (rest, secure) = match (url.strip_prefix("zk://"), url.strip_prefix("zks://")) {
        (Some(rest), _) => (rest, false),
        (_, Some(rest)) => (rest, true),
        _ => return Err(bad("the scheme must be zk:// (or zks:// for TLS)")),
    };
    if rest.contains('?') || rest.contains('#') {
        return Err(bad("unknown parameter (known, with zks:// only: ca, cert, key)"));
    }
    let tls = match (secure, ours[0].clone(), ours[1].clone(), ours[2].clone()) {
        (false, None, None, None) => None,
        (false, ..) => return Err(bad("ca=, cert= and key= are for TLS: write zks://")),
        (true, None, ..) => {
            return Err(bad("zks:// needs ca=PATH, the PEM file of the CA that signed the servers' certificates"));
        }
        (true, Some(ca), Some(cert), Some(key)) => Some(TlsFiles { ca, identity: Some((cert, key)) }),
        (true, Some(ca), None, None) => Some(TlsFiles { ca, identity: None }),
        (true, Some(_), ..) => return Err(bad("cert= and key= go together")),
    };
    let (authority, path) = match rest.find('/') {
        Some(i) => (&rest[..i], &rest[i..]),
        None => (rest, ""),
    };
    let path = path.trim_end_matches('/');
    let path = if path.is_empty() { DEFAULT_PATH.to_string() } else { path.to_string() };
    let mut segments = path.split('/').skip(1);
    if segments.clone().next() == Some("zookeeper") || segments.any(|seg| seg.is_empty() || seg == "." || seg == "..") {
        return Err(bad(&format!("{path:?} is not a ZooKeeper path of our own")));
    }
    let (auth, hosts) = match authority.rsplit_once('@') {
        Some((info, hosts)) => {
            let (u, _) = info.split_once(':').ok_or_else(|| bad("user info needs USER:PASSWORD"))?;
            if u.is_empty() {
                return Err(bad("the user name is empty"));
            }
            (Some(info.to_string()), hosts)
        }
        None => (None, authority),
    };
    for h in hosts.split(',') {
        let (host, port) = h.rsplit_once(':').ok_or_else(|| bad(&format!("{h:?} needs a port")))?;
        if host.is_empty() || port.parse::<u16>().is_err() {
            return Err(bad(&format!("{h:?} is not HOST:PORT")));
        }
        // A name TLS cannot check a certificate against (the client would fail on it
        // deep inside a connection attempt).
        let name = host.strip_prefix('[').and_then(|h| h.strip_suffix(']')).unwrap_or(host);
        if rustls::pki_types::ServerName::try_from(name).is_err() {
            return Err(bad(&format!("{host:?} is not a host name or an IP address")));
        }
    }
    Ok(Parsed { hosts: hosts.to_string(), path, auth, tls })
}

/// The node name of an election: `/` is the one character of a name that ZooKeeper
/// would read as a path separator, and `%` never occurs in a name.
fn node_name(election: &str) -> String {
    election.replace('/', "%2F")
}

/// The value of a work-ledger node (`KEEP_UNTIL_MS\nVALUE`) if it is still kept by the
/// wall clock; `None` when it is past its keep or not such a node.
fn kept_entry(data: &[u8]) -> Option<Vec<u8>> {
    let nl = data.iter().position(|b| *b == b'\n')?;
    let until: u64 = std::str::from_utf8(&data[..nl]).ok()?.parse().ok()?;
    let now = SystemTime::now().duration_since(UNIX_EPOCH).unwrap_or_default().as_millis();
    (u128::from(until) > now).then(|| data[nl + 1..].to_vec())
}

fn election_of(node: &str) -> Option<ElectionName> {
    ElectionName::new(node.replace("%2F", "/")).ok()
}

/// The node's data: `tenure1`, holder, TTL in ms, evicted (0/1), each on a line; then
/// the metadata, as is.
fn encode(holder: &HolderId, ttl: Duration, evicted: bool, metadata: &[u8]) -> Vec<u8> {
    let mut v = format!("tenure1\n{}\n{}\n{}\n", holder, ttl.as_millis(), u8::from(evicted)).into_bytes();
    v.extend_from_slice(metadata);
    v
}

/// The record of a grant node with its data and stat, and the stat of the election's
/// renewal node (`None` if it has none yet): the revision and the renewal time are the
/// later of the two nodes' (a renewal writes only the renewal node).
fn record(
    election: &ElectionName,
    data: &[u8],
    stat: &zk::Stat,
    renewed: Option<&zk::Stat>,
) -> Result<LeaseRecord, StoreError> {
    let mut rec = decode(election, data, stat)?;
    if let Some(r) = renewed.filter(|r| r.mzxid > stat.mzxid) {
        rec.revision = Revision(r.mzxid as u64);
        rec.renewed_at = u64::try_from(r.mtime).ok().map(|ms| UNIX_EPOCH + Duration::from_millis(ms));
    }
    Ok(rec)
}

fn decode(election: &ElectionName, data: &[u8], stat: &zk::Stat) -> Result<LeaseRecord, StoreError> {
    let unreadable = || {
        StoreError::new(
            ErrorKind::Misconfigured,
            format!("ZooKeeper: the node of election {election} does not hold a tenure lease"),
        )
    };
    let mut parts = data.splitn(5, |b| *b == b'\n');
    let mut line = || parts.next().and_then(|l| std::str::from_utf8(l).ok()).ok_or_else(unreadable);
    if line()? != "tenure1" {
        return Err(unreadable());
    }
    let holder = HolderId::new(line()?).map_err(|_| unreadable())?;
    let ttl = Duration::from_millis(line()?.parse().map_err(|_| unreadable())?);
    let evicted = line()? == "1";
    let metadata = parts.next().unwrap_or_default().to_vec();
    let at = |ms: i64| u64::try_from(ms).ok().map(|ms| UNIX_EPOCH + Duration::from_millis(ms));
    Ok(LeaseRecord {
        election: election.clone(),
        holder,
        token: FencingToken(stat.czxid as u64),
        revision: Revision(stat.mzxid as u64),
        ttl,
        acquired_at: at(stat.ctime),
        renewed_at: at(stat.mtime),
        remaining: None,
        evicted,
        metadata,
    })
}

/// Maps a client error; `wrote` says whether the request may have changed something.
fn error(what: &str, e: zk::Error, wrote: bool) -> StoreError {
    use zk::Error as E;
    let kind = match &e {
        E::NoAuth | E::AuthFailed => ErrorKind::Unauthorized,
        E::InvalidAcl | E::BadArguments(_) => ErrorKind::Invalid,
        E::NoHosts | E::SessionExpired | E::ClientClosed | E::Throttled | E::NotReadOnly => ErrorKind::Unavailable,
        _ if wrote => ErrorKind::Ambiguous,
        _ => ErrorKind::Unavailable,
    };
    let hint = match kind {
        ErrorKind::Unauthorized => ": check the user and password in the URL, and the ACL of the store's path",
        _ => "",
    };
    StoreError::new(kind, format!("ZooKeeper: {what} failed: {e}{hint}")).with_source(e)
}

/// Runs one request with the store's timeout.
async fn timed<T, E>(
    what: &str,
    wrote: bool,
    f: impl Future<Output = Result<T, E>>,
) -> Result<Result<T, E>, StoreError> {
    match tokio::time::timeout(REQUEST_TIMEOUT, f).await {
        Ok(r) => Ok(r),
        Err(_) if wrote => Err(StoreError::timed_out(what, REQUEST_TIMEOUT)),
        Err(_) => Err(StoreError::unavailable(format!("ZooKeeper: {what} got no answer within {REQUEST_TIMEOUT:?}"))),
    }
}

/// The TLS settings of `zks://`: only the URL's CA is trusted, the server's name or
/// address must be in its certificate, and the client certificate is sent if given.
fn tls_options(files: &TlsFiles) -> Result<zk::TlsOptions, StoreError> {
    use tenure::store::url::{Pem, read_pem};
    // The client asks rustls for the process's crypto provider: ring, as every other
    // store of this workspace uses (installing fails harmlessly if one is installed).
    let _ = rustls::crypto::ring::default_provider().install_default();
    let text = |param: &str, path: &str, kind: Pem| {
        read_pem(param, path, kind).map(|bytes| String::from_utf8_lossy(&bytes).into_owned())
    };
    let bad = |param: &str, path: &str, e: zk::Error| {
        StoreError::new(ErrorKind::Misconfigured, format!("{param}={path}: cannot use it ({e})"))
    };
    let ca = text("ca", &files.ca, Pem::Certificate)?;
    let mut options = zk::TlsOptions::new().with_pem_ca(&ca).map_err(|e| bad("ca", &files.ca, e))?;
    if let Some((cert, key)) = &files.identity {
        let (cert_pem, key_pem) = (text("cert", cert, Pem::Certificate)?, text("key", key, Pem::Key)?);
        options = options.with_pem_identity(&cert_pem, &key_pem).map_err(|e| bad("cert", cert, e))?;
    }
    Ok(options)
}

/// The TLS settings of `zks://` as rustls takes them, for [`tls_refusal`].
fn tls_config(files: &TlsFiles) -> Result<Arc<rustls::ClientConfig>, StoreError> {
    use rustls::pki_types::pem::PemObject;
    use rustls::pki_types::{CertificateDer, PrivateKeyDer};
    use tenure::store::url::{Pem, read_pem};
    let bad = |param: &str, path: &str, why: String| {
        StoreError::new(ErrorKind::Misconfigured, format!("{param}={path}: cannot use it ({why})"))
    };
    let mut roots = rustls::RootCertStore::empty();
    let ca = read_pem("ca", &files.ca, Pem::Certificate)?;
    for cert in CertificateDer::pem_slice_iter(&ca) {
        let cert = cert.map_err(|e| bad("ca", &files.ca, e.to_string()))?;
        roots.add(cert).map_err(|e| bad("ca", &files.ca, e.to_string()))?;
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let builder = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| bad("ca", &files.ca, e.to_string()))?
        .with_root_certificates(roots);
    let config = match &files.identity {
        None => builder.with_no_client_auth(),
        Some((cert, key)) => {
            let certs = CertificateDer::pem_slice_iter(&read_pem("cert", cert, Pem::Certificate)?)
                .collect::<Result<Vec<_>, _>>()
                .map_err(|e| bad("cert", cert, e.to_string()))?;
            let key_der = PrivateKeyDer::from_pem_slice(&read_pem("key", key, Pem::Key)?)
                .map_err(|e| bad("key", key, e.to_string()))?;
            builder.with_client_auth_cert(certs, key_der).map_err(|e| bad("cert", cert, e.to_string()))?
        }
    };
    Ok(Arc::new(config))
}

/// Why TLS with `config` refuses the first of `hosts` whose handshake fails (the server's
/// certificate, or the server refusing ours), or `None` if none does: a handshake, then
/// a read, on a connection of its own to each.
fn tls_refusal(hosts: &str, config: Arc<rustls::ClientConfig>) -> Option<String> {
    use std::io::Read;
    use std::net::ToSocketAddrs;
    for h in hosts.split(',') {
        let (host, _) = h.rsplit_once(':')?;
        let name = host.trim_start_matches('[').trim_end_matches(']');
        let server = rustls::pki_types::ServerName::try_from(name.to_string()).ok()?;
        let Some(addr) = h.to_socket_addrs().ok().and_then(|mut a| a.next()) else { continue };
        let Ok(mut sock) = std::net::TcpStream::connect_timeout(&addr, Duration::from_secs(2)) else { continue };
        // Long enough for a refusal, short enough not to hold up the error much.
        let _ = sock.set_read_timeout(Some(Duration::from_millis(500)));
        let _ = sock.set_write_timeout(Some(Duration::from_secs(2)));
        let Ok(mut conn) = rustls::ClientConnection::new(config.clone(), server) else { continue };
        let mut tls = rustls::Stream::new(&mut conn, &mut sock);
        // A server that wants a client certificate it did not get says so after the
        // handshake (TLS 1.3): the first read tells.
        let failed = match tls.conn.complete_io(tls.sock) {
            Err(e) => Some(e),
            Ok(_) => tls.read(&mut [0u8; 1]).err().filter(|e| e.get_ref().is_some()),
        };
        if let Some(e) = failed {
            return Some(format!(
                "TLS to {h} failed ({e}): the server's certificate must chain to ca= and name {name}, and a server \
                 that asks for a client certificate needs cert= and key= signed by a CA it trusts"
            ));
        }
    }
    None
}

fn millis(ttl: Duration) -> u64 {
    // Round up: a session must last at least the TTL.
    let ms = ttl.as_millis() as u64;
    if Duration::from_millis(ms) < ttl { ms + 1 } else { ms }
}

impl ZkStore {
    /// A store on the ensemble named by a `zk://[USER:PASSWORD@]HOST:PORT[,HOST:PORT…][/PATH]`
    /// URL (credentials are ZooKeeper `digest` auth; nodes are then created readable and
    /// writable by that user only). Only the URL is checked here: sessions are opened on
    /// first use, so a server that is down is a retryable error of the first request,
    /// and `PATH` is created then if it is missing.
    pub async fn connect(url: &str) -> Result<Self, StoreError> {
        let p = parse_url(url)?;
        let tls = p.tls.as_ref().map(|f| Ok::<_, StoreError>((tls_options(f)?, tls_config(f)?))).transpose()?;
        let scheme = if tls.is_some() { "zks" } else { "zk" };
        let described = format!("{scheme}://{}{}", p.hosts, p.path);
        let store = ZkStore {
            inner: Arc::new(Inner {
                hosts: p.hosts,
                path: p.path,
                auth: p.auth,
                tls,
                described,
                sessions: Default::default(),
                reader: Default::default(),
                path_ready: AtomicBool::new(false),
                held: Default::default(),
                held_changed: Default::default(),
                sweeping: AtomicBool::new(false),
                changes: tenure::store::ChangeHub::new(),
                #[cfg(test)]
                before_delete: Mutex::new(None),
            }),
        };
        Ok(store)
    }

    async fn open_session(&self, timeout: Duration, detached: bool) -> Result<zk::Client, StoreError> {
        let mut connector = zk::Client::connector().with_session_timeout(timeout).with_fail_eagerly();
        if detached {
            connector = connector.with_detached();
        }
        if let Some(auth) = &self.inner.auth {
            connector = connector.with_auth("digest", auth.as_bytes());
        }
        let hosts = self.inner.hosts.clone();
        let connecting = async {
            match &self.inner.tls {
                Some((tls, _)) => connector.with_tls(tls.clone()).secure_connect(&hosts).await,
                None => connector.connect(&hosts).await,
            }
        };
        match tokio::time::timeout(REQUEST_TIMEOUT.max(timeout), connecting).await {
            Ok(Ok(c)) => Ok(c),
            Ok(Err(e)) => {
                let mut err = error(&format!("connecting to {hosts}"), e, false);
                // The client says only that no host could be reached: find out whether
                // TLS refused them, and why.
                if let Some((_, config)) = &self.inner.tls {
                    let (config, list) = (config.clone(), hosts.clone());
                    if let Ok(Some(why)) = tokio::task::spawn_blocking(move || tls_refusal(&list, config)).await {
                        err = StoreError::new(err.kind(), format!("{err}: {why}"));
                    }
                }
                Err(err)
            }
            Err(_) => Err(StoreError::unavailable(format!("ZooKeeper: no server of {hosts} answered"))),
        }
    }

    /// The session that reads, deletes and watches.
    async fn reader(&self) -> Result<zk::Client, StoreError> {
        let mut slot = self.inner.reader.lock().await;
        if let Some(c) = slot.as_ref()
            && !c.state().is_terminated()
        {
            return Ok(c.clone());
        }
        let c = self.open_session(READER_SESSION, false).await?;
        *slot = Some(c.clone());
        Ok(c)
    }

    /// Whether a session whose timeout is `ttl` is open.
    async fn has_session(&self, ttl: Duration) -> bool {
        self.inner.sessions.lock().await.get(&millis(ttl)).is_some_and(|c| !c.state().is_terminated())
    }

    /// The session whose timeout is `ttl`, opened (and checked) on first use.
    async fn session(&self, ttl: Duration) -> Result<Arc<zk::Client>, StoreError> {
        let ms = millis(ttl);
        let mut sessions = self.inner.sessions.lock().await;
        if let Some(c) = sessions.get(&ms)
            && !c.state().is_terminated()
        {
            return Ok(c.clone());
        }
        // Detached: dropping the store does not close the session, so its leases last
        // their TTL like any other store's (the work they guard may still be stopping).
        // The planted bug: a session shorter than the TTL, which the server expires while
        // the holder still believes it leads.
        // (A fifth of the TTL: a half could expire late enough on a busy machine to pass.)
        let asked = if mutant("session-shorter-than-ttl") { (ms / 5).max(200) } else { ms };
        let c = self.open_session(Duration::from_millis(asked), true).await?;
        let granted = c.session_timeout();
        if granted != Duration::from_millis(asked) {
            let side = if granted < Duration::from_millis(ms) { "maxSessionTimeout" } else { "minSessionTimeout" };
            return Err(StoreError::invalid(format!(
                "ZooKeeper at {} grants a session timeout of {granted:?} where the TTL is {ttl:?}: the server's \
                 {side} bounds it (by default minSessionTimeout is 2 and maxSessionTimeout 20 times tickTime); \
                 choose a TTL between the server's limits, or change them in its configuration",
                self.inner.hosts
            )));
        }
        self.ensure_path(&c).await?;
        let c = Arc::new(c);
        sessions.insert(ms, c.clone());
        Ok(c)
    }

    /// Closes the session `id` if it holds no grant and no request is using it: an idle
    /// session's pings would be most of what the server hears from this process. It is
    /// detached, so the server expires it a session timeout later, with nothing in it.
    fn close_if_idle(&self, id: i64) {
        let held = self.inner.held.lock().unwrap_or_else(|p| p.into_inner());
        if mutant("zk-idle-session-kept") || held.values().any(|h| h.session == id) {
            return;
        }
        // A request in flight holds a second reference; `session` hands references out only
        // under this lock, so none can be taken meanwhile. Contended: left open until the
        // next grant this store gives up.
        if let Ok(mut sessions) = self.inner.sessions.try_lock() {
            sessions.retain(|_, c| c.session_id().0 != id || Arc::strong_count(c) > 1);
        }
    }

    /// Creates the store's path (and its parents) if it is missing.
    async fn ensure_path(&self, c: &zk::Client) -> Result<(), StoreError> {
        if self.inner.path_ready.load(Ordering::Acquire) {
            return Ok(());
        }
        let acls = self.acls();
        let opts = zk::CreateMode::Persistent.with_acls(acls);
        match timed("creating the store's path", true, c.mkdir(&self.inner.path, &opts)).await? {
            Ok(()) | Err(zk::Error::NodeExists) => {}
            Err(e) => return Err(error(&format!("creating {}", self.inner.path), e, true)),
        }
        self.inner.path_ready.store(true, Ordering::Release);
        Ok(())
    }

    fn acls(&self) -> zk::Acls<'static> {
        if self.inner.auth.is_some() { zk::Acls::creator_all() } else { zk::Acls::anyone_all() }
    }

    /// The node of a work-ledger entry: under `PATH/tenure:work` (`:` is in no election
    /// name, so `list` and the watch pass it by), one node per election, one per key.
    fn work_node(&self, election: &ElectionName, key: &WorkKey) -> String {
        format!("{}/tenure:work/{}/{key}", self.inner.path, node_name(election.as_str()))
    }

    fn node(&self, election: &str) -> String {
        format!("{}/{}", self.inner.path, node_name(election))
    }

    /// Notes that we hold the grant node `path` of the election node `parent` (or renewed
    /// it), with `data` and `stat`: it is deleted once `due` passes unless renewed again.
    fn hold(&self, parent: &str, path: &str, data: &[u8], stat: &zk::Stat, due: Instant) {
        let fresh = || Held {
            path: path.to_string(),
            token: stat.czxid,
            version: stat.version,
            data: data.to_vec(),
            stat: *stat,
            session: stat.ephemeral_owner,
            due,
        };
        let mut held = self.inner.held.lock().unwrap_or_else(|p| p.into_inner());
        let h = held.entry(parent.to_string()).or_insert_with(fresh);
        if h.token != stat.czxid {
            *h = fresh();
        } else {
            if stat.version > h.version {
                (h.version, h.data, h.stat) = (stat.version, data.to_vec(), *stat);
            }
            h.due = h.due.max(due);
        }
        drop(held);
        self.inner.held_changed.notify_one();
        self.ensure_sweeper();
    }

    fn forget(&self, path: &str, token: i64) {
        let mut held = self.inner.held.lock().unwrap_or_else(|p| p.into_inner());
        let Some(h) = held.get(path).filter(|h| h.token == token) else { return };
        let session = h.session;
        held.remove(path);
        drop(held);
        self.close_if_idle(session);
    }

    /// Deletes the nodes of ours whose TTL has passed since the last acquire or renewal
    /// was sent: their holders' deadlines have passed on this same clock, and while this
    /// process lives its session would keep them.
    fn ensure_sweeper(&self) {
        if self.inner.sweeping.swap(true, Ordering::SeqCst) {
            return;
        }
        let weak = Arc::downgrade(&self.inner);
        tokio::spawn(async move {
            loop {
                let Some(inner) = weak.upgrade() else { return };
                let now = Instant::now();
                let due: Vec<(String, Held)> = {
                    let held = inner.held.lock().unwrap_or_else(|p| p.into_inner());
                    held.iter().filter(|(_, h)| h.due <= now).map(|(p, h)| (p.clone(), h.clone())).collect()
                };
                let store = ZkStore { inner };
                for (path, h) in due {
                    store.expire(&path, h).await;
                }
                // After the deletions: a renewal sent meanwhile, or a failed deletion, has
                // moved some entry's due time.
                let now = Instant::now();
                let next = {
                    let held = store.inner.held.lock().unwrap_or_else(|p| p.into_inner());
                    held.values().map(|h| h.due).min().map(|d| d.max(now))
                };
                let wake = store.inner.clone();
                drop(store);
                let sleep = tokio::time::sleep_until(next.unwrap_or(now + Duration::from_secs(3600)));
                tokio::select! {
                    _ = sleep => {}
                    _ = wake.held_changed.notified() => {}
                }
            }
        });
    }

    /// Deletes the grant node `h` of the election node `parent` if it is still ours and
    /// nobody renewed it since.
    ///
    /// Every renewal moves `due` before it is sent (see [`ZkStore::sending`]). So once the
    /// nodes have been read, `due` still past means that every renewal applied so far was
    /// sent a TTL ago or more (its term is over), and a renewal applied after the read
    /// moves the renewal node's version (a change of the grant, the grant node's), which
    /// fails the delete: a renewal and this deletion are a compare-and-set, whichever
    /// lands first.
    async fn expire(&self, parent: &str, h: Held) {
        let path = h.path.as_str();
        let still_due = || {
            let held = self.inner.held.lock().unwrap_or_else(|p| p.into_inner());
            matches!(held.get(parent), Some(now) if now.token == h.token && now.due <= Instant::now())
        };
        if !still_due() {
            return;
        }
        // Ok(true): the grant is gone (or not ours); Ok(false): renewed meanwhile.
        let done = async {
            let c = self.reader().await?;
            let renewal = renewal_node(path);
            loop {
                // The grant node, and the version of the renewal node that a renewal
                // writes: the deletion checks both, so a renewal applied after this read
                // fails it.
                let mut reader = c.new_multi_reader();
                reader.add_get_data(path).map_err(|e| error("reading a lease", e, false))?;
                reader.add_get_data(&renewal).map_err(|e| error("reading a lease", e, false))?;
                let read = match timed("reading a lease", false, reader.commit()).await? {
                    Ok(r) => r,
                    Err(e) => return Err(error("reading a lease", e, false)),
                };
                let mut read = read.into_iter();
                let stat = match read.next() {
                    Some(zk::MultiReadResult::Data { stat, .. }) => stat,
                    Some(zk::MultiReadResult::Error { err: zk::Error::NoNode }) => return Ok(true),
                    Some(zk::MultiReadResult::Error { err }) => return Err(error("reading a lease", err, false)),
                    _ => return Err(StoreError::unavailable("ZooKeeper: a read answered without the grant node")),
                };
                if stat.czxid != h.token || stat.ephemeral_owner != h.session {
                    return Ok(true);
                }
                let Some(zk::MultiReadResult::Data { stat: renewed, .. }) = read.next() else {
                    // No renewal node yet: made now, so that the deletion has a version to check.
                    let opts = zk::CreateMode::Persistent.with_acls(self.acls());
                    match timed("deleting an expired lease", true, c.create(&renewal, b"", &opts)).await? {
                        Ok(_) | Err(zk::Error::NodeExists) => continue,
                        Err(zk::Error::NoNode) => return Ok(true),
                        Err(e) => return Err(error("deleting an expired lease", e, true)),
                    }
                };
                if !still_due() {
                    return Ok(false);
                }
                #[cfg(test)]
                {
                    let gate = self.inner.before_delete.lock().unwrap_or_else(|p| p.into_inner()).take();
                    if let Some((reached, proceed)) = gate {
                        let _ = reached.send(());
                        let _ = proceed.await;
                    }
                }
                let mut w = c.new_multi_writer();
                if !mutant("zk-sweep-ignores-renewals") {
                    w.add_check_version(&renewal, renewed.version)
                        .map_err(|e| error("deleting an expired lease", e, true))?;
                }
                w.add_delete(path, Some(stat.version)).map_err(|e| error("deleting an expired lease", e, true))?;
                match timed("deleting an expired lease", true, w.commit()).await? {
                    Ok(_) => return Ok(true),
                    Err(zk::MultiWriteError::OperationFailed {
                        source: zk::Error::BadVersion | zk::Error::NoNode,
                        ..
                    }) => continue,
                    Err(
                        zk::MultiWriteError::OperationFailed { source, .. }
                        | zk::MultiWriteError::RequestFailed { source },
                    ) => return Err(error("deleting an expired lease", source, true)),
                }
            }
        };
        match done.await {
            Ok(true) => self.forget(parent, h.token),
            Ok(false) => {}
            Err(e) => {
                tracing::debug!(path, error = %e, "could not delete a lease whose TTL has passed; trying again");
                let mut held = self.inner.held.lock().unwrap_or_else(|p| p.into_inner());
                if let Some(now) = held.get_mut(parent)
                    && now.token == h.token
                {
                    now.due = now.due.max(Instant::now() + Duration::from_millis(200));
                }
            }
        }
    }

    /// Notes, before a renewal of our grant `token` of the election node `parent` is sent,
    /// that the grant must not be deleted before `due` (a TTL after the send).
    fn sending(&self, parent: &str, token: FencingToken, due: Instant) {
        let mut held = self.inner.held.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(h) = held.get_mut(parent)
            && h.token as u64 == token.0
        {
            h.due = h.due.max(due);
        }
    }

    /// The change listener's feed: a persistent recursive watch on the store's path.
    async fn open_feed(inner: Arc<Inner>) -> Option<Box<dyn tenure::store::ChangeFeed>> {
        let base = inner.path.clone();
        let hub = Arc::downgrade(&inner);
        let client = ZkStore { inner }.reader().await.ok()?;
        let watcher =
            timed("watching", false, client.watch(&base, zk::AddWatchMode::PersistentRecursive)).await.ok()?.ok()?;
        Some(Box::new(NodeEvents { watcher, client, base, hub, unread: None }))
    }

    /// The grant node of `election` as it stands: its path, record and stat, or `None`.
    async fn read(&self, c: &zk::Client, election: &ElectionName) -> Result<Option<Grant>, StoreError> {
        Ok(self.lookup(c, election).await?.1)
    }

    /// The election node's version (`None` if it does not exist yet) and its grant node,
    /// read together: a grant is created only by a transaction that also moves that version.
    async fn lookup(
        &self,
        c: &zk::Client,
        election: &ElectionName,
    ) -> Result<(Option<i32>, Option<Grant>), StoreError> {
        let parent = self.node(election.as_str());
        loop {
            let (children, parent_stat) = match timed("reading a lease", false, c.get_children(&parent)).await? {
                Ok(v) => v,
                Err(zk::Error::NoNode) => return Ok((None, None)),
                Err(e) => return Err(error("reading a lease", e, false)),
            };
            // One grant at a time: every grant is created by a write that also bumps the
            // election node's version, which it checks; the newest name sorts last.
            let Some(child) = children.iter().filter(|c| c.starts_with(GRANT)).max() else {
                return Ok((Some(parent_stat.version), None));
            };
            let path = format!("{parent}/{child}");
            match read_grant(c, election, &path).await? {
                Some((rec, stat)) => return Ok((Some(parent_stat.version), Some((path, rec, stat)))),
                None => continue,
            }
        }
    }

    /// Renews our own grant, if it is still the grant `holder`/`token` of this session and
    /// not evicted (`Ok(Err(current))` when it is not); with `metadata`, a same-holder
    /// acquire, it also publishes that metadata. A renewal keeps what the grant says.
    #[allow(clippy::too_many_arguments)]
    async fn rewrite(
        &self,
        c: &zk::Client,
        election: &ElectionName,
        holder: &HolderId,
        token: FencingToken,
        ttl: Duration,
        metadata: Option<&[u8]>,
        sent: Instant,
    ) -> Result<Result<LeaseRecord, Option<LeaseRecord>>, StoreError> {
        let parent = self.node(election.as_str());
        // The common case: the grant node is as our last write left it (a grant node's
        // path is never used twice, so its version names our grant); one round trip.
        let known = {
            let held = self.inner.held.lock().unwrap_or_else(|p| p.into_inner());
            held.get(&parent)
                .filter(|h| h.token as u64 == token.0 && h.session == c.session_id().0)
                .map(|h| (h.path.clone(), h.version, h.data.clone(), h.stat))
        };
        let data = metadata.map(|m| encode(holder, ttl, false, m));
        // The grant node's path, version, data and stat, as last written or read.
        let mut grant = known;
        loop {
            let (path, version, current, stat) = match grant.take() {
                Some(g) => g,
                None => {
                    let Some((p, cur, stat)) = self.read(c, election).await? else { return Ok(Err(None)) };
                    if cur.holder != *holder
                        || cur.token != token
                        || cur.evicted
                        || stat.ephemeral_owner != c.session_id().0
                    {
                        return Ok(Err(Some(cur)));
                    }
                    let current = encode(&cur.holder, cur.ttl, false, &cur.metadata);
                    (p, stat.version, current, stat)
                }
            };
            self.sending(&parent, token, sent + ttl);
            if let Some(data) = data.as_ref().filter(|d| **d != current) {
                // What the grant says changes (new metadata): its watchers hear of it.
                match timed("renewing a lease", true, c.set_data(&path, data, Some(version))).await? {
                    Ok(stat) => {
                        self.hold(&parent, &path, data, &stat, sent + ttl);
                        return Ok(Ok(decode(election, data, &stat)?));
                    }
                    Err(zk::Error::BadVersion | zk::Error::NoNode) => continue,
                    Err(e) => return Err(error("renewing a lease", e, true)),
                }
            }
            // A renewal: the grant node at the version last seen (not evicted, not
            // replaced), and a write of the renewal node, in one transaction.
            let renewal = renewal_node(&path);
            let mut w = c.new_multi_writer();
            if !mutant("zk-renewal-unchecked") {
                w.add_check_version(&path, version).map_err(|e| error("renewing a lease", e, true))?;
            }
            w.add_set_data(&renewal, b"", None).map_err(|e| error("renewing a lease", e, true))?;
            match timed("renewing a lease", true, w.commit()).await? {
                Ok(results) => {
                    let Some(zk::MultiWriteResult::SetData { stat: renewed }) = results.into_iter().last() else {
                        return Err(StoreError::ambiguous("ZooKeeper: a renewal answered without its write"));
                    };
                    self.hold(&parent, &path, &current, &stat, sent + ttl);
                    return Ok(Ok(record(election, &current, &stat, Some(&renewed))?));
                }
                // The grant node changed or is gone: read it.
                Err(zk::MultiWriteError::OperationFailed {
                    index: 0,
                    source: zk::Error::BadVersion | zk::Error::NoNode,
                }) => {}
                // The election has no renewal node yet: make it, then renew.
                Err(zk::MultiWriteError::OperationFailed { source: zk::Error::NoNode, .. }) => {
                    let opts = zk::CreateMode::Persistent.with_acls(self.acls());
                    match timed("renewing a lease", true, c.create(&renewal, b"", &opts)).await? {
                        Ok(_) | Err(zk::Error::NodeExists) => grant = Some((path, version, current, stat)),
                        Err(zk::Error::NoNode) => {}
                        Err(e) => return Err(error("renewing a lease", e, true)),
                    }
                }
                Err(
                    zk::MultiWriteError::OperationFailed { source, .. } | zk::MultiWriteError::RequestFailed { source },
                ) => return Err(error("renewing a lease", source, true)),
            }
        }
    }

    /// `try_acquire` in session `c`.
    async fn acquire_in(&self, req: &AcquireRequest, c: Arc<zk::Client>) -> Result<Acquire, StoreError> {
        let parent = self.node(req.election.as_str());
        let data = encode(&req.holder, req.ttl, false, &req.metadata);
        for _ in 0..10 {
            let sent = Instant::now();
            let (version, grant) = self.lookup(&c, &req.election).await?;
            if let Some((_, cur, stat)) = grant {
                if cur.holder != req.holder || cur.evicted || stat.ephemeral_owner != c.session_id().0 {
                    return Ok(Acquire::Held(cur));
                }
                // Our own live grant: a renewal that keeps the token.
                match self
                    .rewrite(&c, &req.election, &req.holder, cur.token, req.ttl, Some(&req.metadata), sent)
                    .await?
                {
                    Ok(rec) => return Ok(Acquire::Acquired(rec)),
                    Err(Some(cur)) => return Ok(Acquire::Held(cur)),
                    Err(None) => continue,
                }
            }
            let Some(version) = version else {
                let opts = zk::CreateMode::Persistent.with_acls(self.acls());
                match timed("creating an election node", true, c.create(&parent, b"", &opts)).await? {
                    Ok(_) | Err(zk::Error::NodeExists) => continue,
                    Err(zk::Error::NoNode) => {
                        self.inner.path_ready.store(false, Ordering::Release);
                        self.ensure_path(&c).await?;
                        continue;
                    }
                    Err(e) => return Err(error("creating an election node", e, true)),
                }
            };
            if let Some((path, stat)) = self.create_grant(&c, &parent, version, &data).await? {
                self.hold(&parent, &path, &data, &stat, sent + req.ttl);
                return Ok(Acquire::Acquired(decode(&req.election, &data, &stat)?));
            }
        }
        Err(StoreError::unavailable(format!("ZooKeeper: the lease of {} kept changing under us", req.election)))
    }

    /// Creates a grant node if the election has none, in one transaction that bumps the
    /// election node's version from `version`. `None` if someone else wrote first.
    async fn create_grant(
        &self,
        c: &zk::Client,
        parent: &str,
        version: i32,
        data: &[u8],
    ) -> Result<Option<(String, zk::Stat)>, StoreError> {
        let path = format!("{parent}/{GRANT}{:010}", i64::from(version) + 1);
        let opts = zk::CreateMode::Ephemeral.with_acls(self.acls());
        let mut w = c.new_multi_writer();
        w.add_set_data(parent, b"", Some(version)).map_err(|e| error("acquiring a lease", e, true))?;
        w.add_create(&path, data, &opts).map_err(|e| error("acquiring a lease", e, true))?;
        let stat = match timed("acquiring a lease", true, w.commit()).await? {
            Ok(results) => match results.into_iter().nth(1) {
                Some(zk::MultiWriteResult::Create { stat, .. }) => stat,
                _ => return Err(StoreError::ambiguous("ZooKeeper: a transaction answered without its create")),
            },
            Err(zk::MultiWriteError::OperationFailed {
                source: zk::Error::BadVersion | zk::Error::NodeExists, ..
            }) => {
                return Ok(None);
            }
            Err(
                zk::MultiWriteError::OperationFailed { source, .. } | zk::MultiWriteError::RequestFailed { source },
            ) => {
                return Err(error("acquiring a lease", source, true));
            }
        };
        if !stat.is_invalid() {
            return Ok(Some((path, stat)));
        }
        // Some servers answer a create inside a transaction without its stat: read it.
        match timed("reading a lease", false, c.get_data(&path)).await? {
            Ok((_, stat)) => Ok(Some((path, stat))),
            Err(e) => Err(error("reading a new lease", e, true)),
        }
    }
}

use tenure::mutant;

/// The store's recursive watch on its path. Only grant nodes, `PATH/ELECTION/grant-N`,
/// carry leases; a created or changed one is read once here for all its watchers. A
/// renewal writes the election's renewal node, which it passes by: followers hear of a
/// grant's start, its changes and its end, which is all they wait for.
struct NodeEvents {
    watcher: zk::PersistentWatcher,
    client: zk::Client,
    base: String,
    /// The store, held weakly (the feed must not keep it alive): a grant of an election
    /// nobody in this process watches is not read.
    hub: std::sync::Weak<Inner>,
    /// A grant node taken from the watcher and not yet read (election and path): the
    /// listener may drop a `next()` while it reads, and the next call reads it again.
    unread: Option<(ElectionName, String)>,
}

#[async_trait::async_trait]
impl tenure::store::ChangeFeed for NodeEvents {
    async fn next(&mut self) -> Option<tenure::store::Change> {
        loop {
            if let Some((election, path)) = self.unread.clone() {
                let change = match read_grant(&self.client, &election, &path).await {
                    Ok(Some((r, _))) => tenure::store::Change::record(r),
                    Ok(None) => tenure::store::Change::now(election.as_str(), None),
                    Err(_) => tenure::store::Change::read_again(election.as_str()),
                };
                self.unread = None;
                return Some(change);
            }
            let ev = self.watcher.changed().await;
            let created = match ev.event_type {
                zk::EventType::Session if ev.session_state.is_terminated() => return None,
                // Connected again (to this server or another), in the same session. The
                // client does not register persistent watches again on a new connection
                // (zookeeper-client 0.11 re-sends only one-shot watches), so this watch
                // would stay silent from now on: end the feed; the listener opens a new
                // one, which adds the watch on this connection and makes every follower
                // re-read what it missed meanwhile.
                zk::EventType::Session
                    if matches!(
                        ev.session_state,
                        zk::SessionState::SyncConnected | zk::SessionState::ConnectedReadOnly
                    ) && !mutant("zk-watch-lost-on-reconnect") =>
                {
                    return None;
                }
                // Events are lost across a reconnection: everyone re-reads.
                zk::EventType::Session => return Some(tenure::store::Change::Everything),
                zk::EventType::NodeCreated | zk::EventType::NodeDataChanged => true,
                zk::EventType::NodeDeleted => false,
                zk::EventType::NodeChildrenChanged => continue,
            };
            let Some((node, grant)) =
                ev.path.strip_prefix(&self.base).and_then(|p| p.strip_prefix('/')).and_then(|p| p.split_once('/'))
            else {
                continue;
            };
            let Some(election) = election_of(node).filter(|_| grant.starts_with(GRANT)) else { continue };
            if !created {
                return Some(tenure::store::Change::now(election.as_str(), None));
            }
            // One read per event, one at a time: those of elections nobody here watches
            // would only hold up the rest.
            if self.hub.upgrade().is_some_and(|inner| !inner.changes.is_watched(election.as_str())) {
                continue;
            }
            self.unread = Some((election, ev.path));
        }
    }
}

/// The name prefix of grant nodes under an election's node.
const GRANT: &str = "grant-";

/// The name of an election's renewal node, under its election node: a renewal writes it
/// (and checks the grant node's version), so that only a change of what the grant says
/// writes the grant node, and its watchers hear of nothing else.
const RENEWED: &str = "renewed";

/// The renewal node of the election whose grant node is `grant`.
fn renewal_node(grant: &str) -> String {
    let parent = grant.rsplit_once('/').map_or(grant, |(p, _)| p);
    format!("{parent}/{RENEWED}")
}

/// Reads the grant node `path` and its election's renewal node in one request: the
/// record, and the grant node's stat. `None` if the grant node does not exist.
async fn read_grant(
    c: &zk::Client,
    election: &ElectionName,
    path: &str,
) -> Result<Option<(LeaseRecord, zk::Stat)>, StoreError> {
    let mut reader = c.new_multi_reader();
    reader.add_get_data(path).map_err(|e| error("reading a lease", e, false))?;
    reader.add_get_data(&renewal_node(path)).map_err(|e| error("reading a lease", e, false))?;
    let results = match timed("reading a lease", false, reader.commit()).await? {
        Ok(r) => r,
        Err(e) => return Err(error("reading a lease", e, false)),
    };
    let mut results = results.into_iter();
    let (data, stat) = match results.next() {
        Some(zk::MultiReadResult::Data { data, stat }) => (data, stat),
        Some(zk::MultiReadResult::Error { err: zk::Error::NoNode }) => return Ok(None),
        Some(zk::MultiReadResult::Error { err }) => return Err(error("reading a lease", err, false)),
        _ => return Err(StoreError::unavailable("ZooKeeper: a read answered without the grant node")),
    };
    let renewed = match results.next() {
        Some(zk::MultiReadResult::Data { stat, .. }) => Some(stat),
        _ => None,
    };
    Ok(Some((record(election, &data, &stat, renewed.as_ref())?, stat)))
}

/// A grant node: its path, the record it holds and its stat.
type Grant = (String, LeaseRecord, zk::Stat);

#[async_trait::async_trait]
impl LeaseStore for ZkStore {
    fn describe(&self) -> String {
        self.inner.described.clone()
    }

    async fn try_acquire(&self, req: &AcquireRequest) -> Result<Acquire, StoreError> {
        req.validate()?;
        // A follower holds no session of its own: it looks through the reading session,
        // and the session that would hold a grant is opened only when there is one to take.
        // (A grant of this holder's in a session this store does not have is not its own.)
        if !self.has_session(req.ttl).await
            && !mutant("zk-idle-session-kept")
            && let (_, Some((_, cur, _))) = self.lookup(&self.reader().await?, &req.election).await?
        {
            return Ok(Acquire::Held(cur));
        }
        let c = self.session(req.ttl).await?;
        let id = c.session_id().0;
        let answer = self.acquire_in(req, c).await;
        // Lost to another candidate: the session holds nothing, unless another grant.
        if matches!(answer, Ok(Acquire::Held(_))) {
            self.close_if_idle(id);
        }
        answer
    }

    async fn renew(&self, held: &LeaseRecord, ttl: Duration) -> Result<Renew, StoreError> {
        check_ttl(ttl)?;
        let sent = Instant::now();
        let c = self.session(ttl).await?;
        match self.rewrite(&c, &held.election, &held.holder, held.token, ttl, None, sent).await? {
            Ok(rec) => Ok(Renew::Renewed(rec)),
            Err(cur) => Ok(Renew::Lost(cur)),
        }
    }

    async fn release(&self, held: &LeaseRecord) -> Result<(), StoreError> {
        let c = self.reader().await?;
        loop {
            let Some((path, cur, stat)) = self.read(&c, &held.election).await? else { return Ok(()) };
            if cur.holder != held.holder || cur.token != held.token || cur.revision != held.revision {
                return Ok(());
            }
            match timed("releasing a lease", true, c.delete(&path, Some(stat.version))).await? {
                Ok(()) | Err(zk::Error::NoNode) => {
                    self.forget(&self.node(held.election.as_str()), stat.czxid);
                    return Ok(());
                }
                Err(zk::Error::BadVersion) => continue,
                Err(e) => return Err(error("releasing a lease", e, true)),
            }
        }
    }

    async fn get(&self, election: &ElectionName) -> Result<Option<LeaseRecord>, StoreError> {
        let c = self.reader().await?;
        Ok(self.read(&c, election).await?.map(|(_, r, _)| r))
    }

    async fn list(&self, prefix: &str) -> Result<Vec<LeaseRecord>, StoreError> {
        let c = self.reader().await?;
        let nodes = match timed("listing leases", false, c.list_children(&self.inner.path)).await? {
            Ok(v) => v,
            Err(zk::Error::NoNode) => return Ok(Vec::new()),
            Err(e) => return Err(error("listing leases", e, false)),
        };
        let mut names: Vec<ElectionName> =
            nodes.iter().filter_map(|n| election_of(n)).filter(|e| e.as_str().starts_with(prefix)).collect();
        names.sort_by(|a, b| a.as_str().cmp(b.as_str()));
        let mut out = Vec::new();
        // Up to 100 elections per request: their grant nodes, then those nodes' data (with
        // their renewal nodes').
        for chunk in names.chunks(100) {
            let mut reader = c.new_multi_reader();
            for e in chunk {
                reader.add_get_children(&self.node(e.as_str())).map_err(|e| error("listing leases", e, false))?;
            }
            let children = match timed("listing leases", false, reader.commit()).await? {
                Ok(r) => r,
                Err(e) => return Err(error("listing leases", e, false)),
            };
            let mut grants = Vec::new();
            for (e, r) in chunk.iter().zip(children) {
                if let zk::MultiReadResult::Children { children } = r
                    && let Some(g) = children.iter().filter(|c| c.starts_with(GRANT)).max()
                {
                    grants.push((e, format!("{}/{g}", self.node(e.as_str()))));
                }
            }
            // Each grant node with its election's renewal node.
            let mut reader = c.new_multi_reader();
            for (_, path) in &grants {
                reader.add_get_data(path).map_err(|e| error("listing leases", e, false))?;
                reader.add_get_data(&renewal_node(path)).map_err(|e| error("listing leases", e, false))?;
            }
            let data = match timed("listing leases", false, reader.commit()).await? {
                Ok(r) => r,
                Err(e) => return Err(error("listing leases", e, false)),
            };
            let mut data = data.into_iter();
            for (e, _) in grants {
                let (grant, renewed) = (data.next(), data.next());
                if let Some(zk::MultiReadResult::Data { data, stat }) = grant {
                    let renewed = match renewed {
                        Some(zk::MultiReadResult::Data { stat, .. }) => Some(stat),
                        _ => None,
                    };
                    out.push(record(e, &data, &stat, renewed.as_ref())?);
                }
            }
        }
        Ok(out)
    }

    async fn evict(&self, election: &ElectionName, how: Evict) -> Result<Option<LeaseRecord>, StoreError> {
        let c = self.reader().await?;
        loop {
            let Some((path, cur, stat)) = self.read(&c, election).await? else { return Ok(None) };
            let done = match how {
                Evict::Now => timed("evicting", true, c.delete(&path, Some(stat.version))).await?,
                Evict::AfterTerm if cur.evicted => return Ok(Some(cur)),
                Evict::AfterTerm => {
                    let data = encode(&cur.holder, cur.ttl, true, &cur.metadata);
                    timed("evicting", true, c.set_data(&path, &data, Some(stat.version))).await?.map(|_| ())
                }
            };
            match done {
                Ok(()) => return Ok(Some(cur)),
                Err(zk::Error::BadVersion | zk::Error::NoNode) => continue,
                Err(e) => return Err(error("evicting", e, true)),
            }
        }
    }

    fn watch(&self, election: &ElectionName) -> Option<WatchStream> {
        Some(self.inner.changes.watch(Arc::new(self.clone()), &self.inner, election, Self::open_feed))
    }

    /// A grant ends only by a deletion of its node (a release, an eviction, this store's
    /// clean-up, or the server's expiry of its session), which the watch reports.
    fn watch_reports_expiry(&self) -> bool {
        true
    }

    async fn ledger_read(&self, election: &ElectionName, key: &WorkKey) -> Result<Option<LedgerEntry>, StoreError> {
        let c = self.reader().await?;
        match timed("reading the work ledger", false, c.get_data(&self.work_node(election, key))).await? {
            Ok((data, stat)) => {
                Ok(kept_entry(&data).map(|value| LedgerEntry { value, version: stat.version.to_string() }))
            }
            Err(zk::Error::NoNode) => Ok(None),
            Err(e) => Err(error("reading the work ledger", e, false)),
        }
    }

    /// Each entry is a persistent node holding the instant it may be let go (wall clock,
    /// ms) and the value. Nodes are never deleted: an entry past its keep reads as absent
    /// and is written over at its node version, so versions never come back.
    async fn ledger_write(
        &self,
        election: &ElectionName,
        key: &WorkKey,
        value: &[u8],
        expected: Option<&str>,
        keep: Duration,
    ) -> Result<LedgerWrite, StoreError> {
        const WHAT: &str = "writing the work ledger";
        check_ledger_value(value)?;
        let c = self.reader().await?;
        let path = self.work_node(election, key);
        let until = SystemTime::now().duration_since(UNIX_EPOCH).unwrap_or_default().saturating_add(keep);
        let mut data = format!("{}\n", until.as_millis().min(u64::MAX as u128)).into_bytes();
        data.extend_from_slice(value);
        let version = match expected {
            Some(v) => match v.parse::<i32>() {
                Ok(v) => v,
                Err(_) => return Ok(LedgerWrite::Conflict),
            },
            None => match timed(WHAT, false, c.get_data(&path)).await? {
                Ok((old, _)) if kept_entry(&old).is_some() => return Ok(LedgerWrite::Conflict),
                // Past its keep: written over at the version just read.
                Ok((_, stat)) => stat.version,
                Err(zk::Error::NoNode) => {
                    let opts = zk::CreateMode::Persistent.with_acls(self.acls());
                    let parent = path.rsplit_once('/').map_or("", |p| p.0).to_string();
                    match timed(WHAT, true, c.mkdir(&parent, &opts)).await? {
                        Ok(()) | Err(zk::Error::NodeExists) => {}
                        Err(e) => return Err(error(WHAT, e, true)),
                    }
                    return match timed(WHAT, true, c.create(&path, &data, &opts)).await? {
                        Ok((stat, _)) => Ok(LedgerWrite::Written(stat.version.to_string())),
                        Err(zk::Error::NodeExists) => Ok(LedgerWrite::Conflict),
                        Err(e) => Err(error(WHAT, e, true)),
                    };
                }
                Err(e) => return Err(error(WHAT, e, false)),
            },
        };
        match timed(WHAT, true, c.set_data(&path, &data, Some(version))).await? {
            Ok(stat) => Ok(LedgerWrite::Written(stat.version.to_string())),
            Err(zk::Error::BadVersion | zk::Error::NoNode) => Ok(LedgerWrite::Conflict),
            Err(e) => Err(error(WHAT, e, true)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_are_parsed_and_checked() {
        let p = parse_url("zk://u:s3cret@h1:2181,h2:2182/apps/tenure/").unwrap();
        assert_eq!(
            p,
            Parsed {
                hosts: "h1:2181,h2:2182".into(),
                path: "/apps/tenure".into(),
                auth: Some("u:s3cret".into()),
                tls: None
            }
        );
        assert_eq!(parse_url("zk://h:2181").unwrap().path, DEFAULT_PATH);
        let tls = parse_url("zks://h:2281/x?ca=/c.pem&cert=/u.pem&key=/u.key").unwrap().tls;
        let identity = Some(("/u.pem".to_string(), "/u.key".to_string()));
        assert_eq!(tls, Some(TlsFiles { ca: "/c.pem".into(), identity }));
        for bad in [
            "zk://h",
            "zk://h:x",
            "zk://h:1/a//b",
            "zk://h:1/zookeeper",
            "zk://h:1?x=1",
            "redis://h:1",
            "zk://:p@h:1",
            // TLS files without TLS, TLS without a CA, half an identity, a name no
            // certificate can hold.
            "zk://h:1?ca=/c.pem",
            "zks://h:1",
            "zks://h:1?ca=/c.pem&cert=/u.pem",
            "zks://h:1?ca=/c.pem&verify=no",
            "zks://a b:1?ca=/c.pem",
        ] {
            assert_eq!(parse_url(bad).err().map(|e| e.kind()), Some(ErrorKind::Invalid), "{bad}");
        }
    }

    /// The store's own clean-up and a renewal race: the clean-up found the grant due and
    /// read it, then the holder renewed it (a same-holder acquire after stepping down, or a
    /// slow renewal): the clean-up must not delete the renewed grant.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_grant_renewed_while_the_clean_up_runs_is_not_deleted() {
        use tenure_testkit::servers::{self, Kind};
        let Some(server) = servers::launch(Kind::ZooKeeper) else { return };
        let store = ZkStore::connect(&server.url()).await.unwrap();
        let ttl = Duration::from_secs(2);
        let e = ElectionName::new("sweep/race").unwrap();
        let req = AcquireRequest::new(e.clone(), HolderId::new("a").unwrap(), ttl);
        let Acquire::Acquired(lease) = store.try_acquire(&req).await.unwrap() else { panic!() };
        let (reached_tx, mut reached) = tokio::sync::oneshot::channel();
        let (proceed, proceed_rx) = tokio::sync::oneshot::channel();
        *store.inner.before_delete.lock().unwrap() = Some((reached_tx, proceed_rx));
        // The grant's TTL has passed, as far as the clean-up knows.
        for h in store.inner.held.lock().unwrap().values_mut() {
            h.due = Instant::now();
        }
        store.inner.held_changed.notify_one();
        tokio::time::timeout(Duration::from_secs(5), &mut reached).await.expect("the clean-up ran").unwrap();
        let Renew::Renewed(renewed) = store.renew(&lease, ttl).await.unwrap() else { panic!("lost") };
        proceed.send(()).unwrap();
        tokio::time::sleep(Duration::from_millis(300)).await;
        let now = store.get(&e).await.unwrap();
        assert_eq!(
            now.map(|r| (r.token, r.revision)),
            Some((renewed.token, renewed.revision)),
            "the renewed grant was deleted"
        );
    }

    #[test]
    fn names_map_to_one_node_each_and_back() {
        for name in ["a", "jobs/nightly", "a.b_c-d/e/f"] {
            let node = node_name(name);
            assert!(!node.contains('/'));
            assert_eq!(election_of(&node).unwrap().as_str(), name);
        }
        // A prefix maps to the prefix of the node names.
        assert!(node_name("jobs/nightly").starts_with(&node_name("jobs/")));
    }
}

#[cfg(test)]
mod fuzz {
    //! Fuzz targets for the store's URL parser and the nodes it reads back: arbitrary
    //! input never panics, and a refusal never prints the password.
    use proptest::prelude::*;

    fn stat(czxid: i64, mzxid: i64, ctime: i64, mtime: i64) -> super::zk::Stat {
        super::zk::Stat {
            czxid,
            mzxid,
            pzxid: 0,
            ctime,
            mtime,
            version: 0,
            cversion: 0,
            aversion: 0,
            ephemeral_owner: 0,
            data_length: 0,
            num_children: 0,
        }
    }

    proptest! {
        #[test]
        fn urls_never_panic_and_refusals_hide_the_password(
            scheme in prop_oneof![Just("zk://"), Just("zks://"), Just("zookeeper://"), Just("zk:/"), Just("")],
            pw in "[a-z]{10}",
            rest in "[ -~]{0,50}",
            any in any::<String>(),
        ) {
            let url = format!("{scheme}u:{pw}@{rest}");
            if let Err(e) = super::parse_url(&url) {
                prop_assert!(!e.to_string().contains(&pw), "{}", e);
            }
            let _ = super::parse_url(&any);
        }

        #[test]
        fn nodes_never_panic(
            raw in prop::collection::vec(any::<u8>(), 0..300),
            text in "tenure1\n[ -~]{0,20}\n[0-9]{0,22}\n[01]?\n[ -~]{0,10}",
            times in (any::<i64>(), any::<i64>(), any::<i64>(), any::<i64>()),
        ) {
            let election = tenure::ElectionName::new("e").unwrap();
            let s = stat(times.0, times.1, times.2, times.3);
            let _ = super::decode(&election, &raw, &s);
            let _ = super::decode(&election, text.as_bytes(), &s);
        }
    }
}
