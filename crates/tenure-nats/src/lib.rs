//! NATS JetStream key-value lease store for tenure.
//!
//! Each election is one key of a KV bucket (a JetStream stream `KV_BUCKET` keeping one
//! message per key). **The bucket's max-age is the TTL**: the server drops a key's
//! message one max-age after it was written, so every renewal (a new message) extends
//! the lease from when the server received it, and the server's clock judges expiry.
//! NATS 2.9 has no per-key TTL, so a bucket serves one TTL only: a request with another
//! TTL is refused with an error that names both. The bucket is created on first use,
//! with the TTL of the first acquire.
//!
//! **Tokens and revisions.** A key's revision is the stream sequence of its last
//! message. The fencing token is the sequence of the message that created the grant
//! (written as "this message" in that message, and copied into every later one): stream
//! sequences only grow, across deletes, expiry and restarts, as long as the bucket is
//! not deleted and created again.
//!
//! **Compare-and-set.** Every write names the revision it replaces (JetStream's
//! expected-last-subject-sequence check), and is made only after the record at that
//! revision was checked to be the same grant: holder, token, not evicted.
//!
//! Followers wait on one KV watch per store. NATS 2.9 sends no event when max-age drops
//! a key, so records carry the time left by the server's write time, and a follower
//! wakes at that moment too.
//!
//! ```no_run
//! # async fn t() -> Result<(), Box<dyn std::error::Error>> {
//! let store = tenure_nats::NatsStore::connect("nats://127.0.0.1:4222/leases").await?;
//! # Ok(()) }
//! ```

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use async_nats::jetstream::kv::{Entry, Operation, Store, UpdateErrorKind};
use async_nats::jetstream::{self, stream};
use tenure::store::{
    Acquire, AcquireRequest, LedgerEntry, LedgerWrite, Renew, Revision, WatchStream, check_ledger_value, check_ttl,
};
use tenure::{ElectionName, ErrorKind, Evict, FencingToken, HolderId, LeaseRecord, LeaseStore, StoreError, WorkKey};
use tokio::sync::OnceCell;
use tokio_stream::StreamExt;

/// The bucket used when the URL names none.
pub const DEFAULT_BUCKET: &str = "tenure";

/// How long one request may take before it counts as lost.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(3);

/// A lease store on a NATS JetStream key-value bucket.
#[derive(Clone)]
pub struct NatsStore {
    inner: Arc<Inner>,
}

struct Inner {
    url: Parsed,
    client: OnceCell<async_nats::Client>,
    /// The bucket and its max-age, once it exists.
    bucket: tokio::sync::Mutex<Option<(Store, Duration)>>,
    /// The work ledger's bucket (`BUCKET_work`) and its max-age, once it exists.
    work: tokio::sync::Mutex<Option<(Store, Duration)>>,
    described: String,
    changes: tenure::store::ChangeHub,
    /// Per election, the last revision this store wrote or read, with its holder and
    /// token: a renewal of exactly that record needs no read first.
    known: std::sync::Mutex<HashMap<ElectionName, (Revision, HolderId, FencingToken)>>,
}

/// What the store URL says.
#[derive(Clone, Debug, PartialEq)]
struct Parsed {
    servers: Vec<String>,
    auth: Auth,
    ca: Option<String>,
    /// A client certificate and its key (`cert=`, `key=`).
    identity: Option<(String, String)>,
    bucket: String,
}

#[derive(Clone, Debug, PartialEq)]
enum Auth {
    None,
    Token(String),
    User(String, String),
}

fn parse_url(url: &str) -> Result<Parsed, StoreError> {
    let bad = |why: &str| {
        StoreError::invalid(format!(
            "NATS store URL: {why}; write nats://[USER:PASSWORD@|TOKEN@]HOST:PORT[,HOST:PORT…][/BUCKET]\
             [?ca=PATH[&cert=PATH&key=PATH]]"
        ))
    };
    let (url, ours) = tenure::store::url::take_params(url, &["ca", "cert", "key"]).map_err(|why| bad(&why))?;
    let rest = url.strip_prefix("nats://").ok_or_else(|| bad("the scheme must be nats://"))?;
    if rest.contains('?') {
        return Err(bad("unknown parameter (known: ca, cert, key)"));
    }
    let (authority, path) = rest.split_once('/').unwrap_or((rest, ""));
    let bucket = match path.trim_end_matches('/') {
        "" => DEFAULT_BUCKET.to_string(),
        b if b.chars().all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-') => b.to_string(),
        b => return Err(bad(&format!("bucket {b:?} may hold only letters, digits, _ and -"))),
    };
    let (auth, hosts) = match authority.rsplit_once('@') {
        Some((info, hosts)) => match info.split_once(':') {
            Some((u, p)) if !u.is_empty() => (Auth::User(u.to_string(), p.to_string()), hosts),
            Some(_) => return Err(bad("the user name is empty")),
            None if !info.is_empty() => (Auth::Token(info.to_string()), hosts),
            None => return Err(bad("empty user info")),
        },
        None => (Auth::None, authority),
    };
    let mut servers = Vec::new();
    for h in hosts.split(',') {
        let (host, port) = h.rsplit_once(':').ok_or_else(|| bad(&format!("{h:?} needs a port")))?;
        if host.is_empty() || port.parse::<u16>().is_err() {
            return Err(bad(&format!("{h:?} is not HOST:PORT")));
        }
        servers.push(format!("nats://{h}"));
    }
    let identity = match (ours[1].clone(), ours[2].clone()) {
        (Some(c), Some(k)) => Some((c, k)),
        (None, None) => None,
        _ => return Err(bad("cert= and key= go together")),
    };
    Ok(Parsed { servers, auth, ca: ours[0].clone(), identity, bucket })
}

/// Checks the files `ca=`, `cert=` and `key=` name before the client reads them (it reads
/// them on every connection, and would block on a FIFO or read `/dev/zero` for ever).
fn check_tls_files(p: &Parsed) -> Result<(), StoreError> {
    use tenure::store::url::{Pem, read_pem};
    if let Some(ca) = &p.ca {
        read_pem("ca", ca, Pem::Certificate)?;
    }
    if let Some((cert, key)) = &p.identity {
        read_pem("cert", cert, Pem::Certificate)?;
        read_pem("key", key, Pem::Key)?;
    }
    Ok(())
}

/// Election names may hold `.`, which separates subject tokens in NATS; keys spell it
/// `=2E` (no election name holds `=`), so every key is one valid token.
fn key_of(election: &str) -> String {
    election.replace('.', "=2E")
}

/// The key of a work-ledger entry: the election as [`key_of`] spells it, a `.`, and the
/// work key with every character a NATS key cannot hold (and `=`, the escape) spelled
/// `=XX`, so that the two parts are tokens of their own.
fn work_key_of(election: &ElectionName, key: &WorkKey) -> String {
    let mut k = key_of(election.as_str());
    k.push('.');
    for c in key.as_str().chars() {
        if c.is_ascii_alphanumeric() || c == '-' || c == '_' {
            k.push(c);
        } else {
            k.push_str(&format!("={:02X}", c as u32));
        }
    }
    k
}

fn election_of(key: &str) -> Option<ElectionName> {
    ElectionName::new(key.replace("=2E", ".")).ok()
}

/// The stored value ([`StoredValue`](tenure::store::StoredValue)) with a token, where a
/// token of 0 means "this message's revision" and an acquired time of 0 "this message's
/// time" (the message that creates a grant cannot know its own sequence).
use tenure::store::StoredValue as Value;

/// The value `raw` holds; every value this store writes has a token.
fn decode(raw: &[u8]) -> Option<Value> {
    Value::decode(raw).filter(|v| v.token.is_some())
}

/// The value that continues `rec`'s grant, with explicit token and grant time.
fn continuing(rec: &LeaseRecord) -> Value {
    Value { token: Some(rec.token.0), ..Value::of(rec) }
}

/// The token a value stands for, written at `revision`.
fn token_of(v: &Value, revision: u64) -> FencingToken {
    FencingToken(v.token.filter(|t| *t != 0).unwrap_or(revision))
}

/// Maps a client error to a store error. `write`: the request may have changed data,
/// so a lost answer is ambiguous.
fn nats_error(what: &str, e: impl std::error::Error + Send + Sync + 'static, write: bool) -> StoreError {
    let mut text = String::new();
    let mut cur: Option<&(dyn std::error::Error + 'static)> = Some(&e);
    while let Some(x) = cur {
        text.push_str(&x.to_string().to_lowercase());
        text.push(' ');
        cur = x.source();
    }
    let (kind, hint) = if text.contains("authorization") || text.contains("authentication") {
        (ErrorKind::Unauthorized, "check the user and password or token in the store URL")
    } else if text.contains("permissions violation") {
        (ErrorKind::Unauthorized, "the user may not use this bucket")
    } else if text.contains("no responders") || text.contains("stream not found") || text.contains("no stream found") {
        // Nothing took the request (a write included): JetStream is off or not yet up, or
        // the bucket's stream is gone. It can come back, so retry.
        (ErrorKind::Unavailable, "JetStream does not answer, or the bucket is gone: is the server started with -js?")
    } else if text.contains("timed out") || text.contains("timeout") {
        if write {
            (ErrorKind::Ambiguous, "no answer in time; the request may have been applied")
        } else {
            (ErrorKind::Unavailable, "no answer in time")
        }
    } else if text.contains("refused") || text.contains("i/o") || text.contains("io error") || text.contains("connect")
    {
        (ErrorKind::Unavailable, "cannot reach the server")
    } else if write {
        (ErrorKind::Ambiguous, "the request failed; it may have been applied")
    } else {
        (ErrorKind::Unavailable, "the request failed")
    };
    StoreError::new(kind, format!("NATS: {what} failed ({hint})")).with_source(e)
}

/// Whether an update failed only because the key moved on (a lost compare-and-set).
fn wrong_revision(e: &async_nats::jetstream::kv::UpdateError) -> bool {
    e.kind() == UpdateErrorKind::WrongLastRevision || e.to_string().contains("wrong last sequence")
}

impl NatsStore {
    /// A store on the bucket `url` names:
    /// `nats://[USER:PASSWORD@|TOKEN@]HOST:PORT[,HOST:PORT…][/BUCKET][?ca=PATH]` (`ca=`
    /// requires TLS with that CA). The connection is made on first use and kept up by the
    /// client afterwards, so a server that is down now is not an error yet.
    pub async fn connect(url: &str) -> Result<Self, StoreError> {
        let url = parse_url(url)?;
        check_tls_files(&url)?;
        // The client's TLS asks rustls for the process's crypto provider, which rustls can
        // choose alone only while one provider is built in: ring, as every store here uses
        // (one installed already, by the program or another store, stays).
        let _ = async_nats::rustls::crypto::ring::default_provider().install_default();
        let hosts: Vec<&str> = url.servers.iter().map(|s| s.trim_start_matches("nats://")).collect();
        let described = format!("nats://{}/{}", hosts.join(","), url.bucket);
        Ok(Self {
            inner: Arc::new(Inner {
                url,
                client: OnceCell::new(),
                bucket: tokio::sync::Mutex::new(None),
                work: tokio::sync::Mutex::new(None),
                described,
                changes: tenure::store::ChangeHub::new(),
                known: std::sync::Mutex::new(HashMap::new()),
            }),
        })
    }

    async fn jetstream(&self) -> Result<jetstream::Context, StoreError> {
        let client = self
            .inner
            .client
            .get_or_try_init(|| async {
                let u = &self.inner.url;
                let mut o = async_nats::ConnectOptions::new()
                    .connection_timeout(REQUEST_TIMEOUT)
                    .request_timeout(Some(REQUEST_TIMEOUT));
                o = match &u.auth {
                    Auth::None => o,
                    Auth::Token(t) => o.token(t.clone()),
                    Auth::User(n, p) => o.user_and_password(n.clone(), p.clone()),
                };
                // TLS with a private CA (only it is trusted then), and a client certificate.
                if let Some(ca) = &u.ca {
                    o = o.require_tls(true).add_root_certificates(ca.into());
                }
                if let Some((cert, key)) = &u.identity {
                    o = o.require_tls(true).add_client_certificate(cert.into(), key.into());
                }
                let addrs: Vec<async_nats::ServerAddr> = u.servers.iter().filter_map(|s| s.parse().ok()).collect();
                match tokio::time::timeout(REQUEST_TIMEOUT * 2, o.connect(addrs)).await {
                    Ok(Ok(c)) => Ok(c),
                    Ok(Err(e)) => Err(nats_error("connecting", e, false)),
                    Err(_) => Err(StoreError::unavailable("NATS: connecting timed out (cannot reach the server)")),
                }
            })
            .await?
            .clone();
        let mut js = jetstream::new(client);
        js.set_timeout(REQUEST_TIMEOUT);
        Ok(js)
    }

    /// The bucket and its TTL; created with `create_with` if it does not exist yet, or
    /// `None` if it does not and nothing should create it.
    async fn bucket(&self, create_with: Option<Duration>) -> Result<Option<(Store, Duration)>, StoreError> {
        self.open_bucket(&self.inner.bucket, &self.inner.url.bucket, create_with).await
    }

    /// The work ledger's bucket and how long it keeps an entry (its max-age); created to
    /// keep entries `create_with` if it does not exist yet.
    async fn work_bucket(&self, create_with: Option<Duration>) -> Result<Option<(Store, Duration)>, StoreError> {
        self.open_bucket(&self.inner.work, &format!("{}_work", self.inner.url.bucket), create_with).await
    }

    /// Raises the work ledger bucket's max-age to `keep`, so that it keeps entries as long
    /// as asked (raising it only keeps older entries longer).
    async fn keep_work_longer(&self, keep: Duration) -> Result<(), StoreError> {
        let js = self.jetstream().await?;
        let name = format!("KV_{}_work", self.inner.url.bucket);
        let mut stream = js.get_stream(&name).await.map_err(|e| nats_error("looking up the work ledger", e, false))?;
        let info = stream.info().await.map_err(|e| nats_error("looking up the work ledger", e, false))?;
        let mut config = info.config.clone();
        if config.max_age < keep {
            config.max_age = keep;
            js.update_stream(&config)
                .await
                .map_err(|e| nats_error("raising the work ledger bucket's max-age", e, true))?;
        }
        if let Some(cached) = self.inner.work.lock().await.as_mut() {
            cached.1 = cached.1.max(keep);
        }
        Ok(())
    }

    /// The bucket `name`, cached in `cache`, with its max-age; created with that max-age
    /// if it does not exist and `create_with` gives one.
    async fn open_bucket(
        &self,
        cache: &tokio::sync::Mutex<Option<(Store, Duration)>>,
        name: &str,
        create_with: Option<Duration>,
    ) -> Result<Option<(Store, Duration)>, StoreError> {
        let mut cached = cache.lock().await;
        if let Some(b) = cached.as_ref() {
            return Ok(Some(b.clone()));
        }
        let js = self.jetstream().await?;
        let stream_name = format!("KV_{name}");
        for turn in 0..5 {
            if turn > 1 {
                // A racing creator's stream may take a moment to be found.
                tokio::time::sleep(Duration::from_millis(20 * turn)).await;
            }
            match js.get_stream(&stream_name).await {
                Ok(s) => {
                    let ttl = s.cached_info().config.max_age;
                    if ttl.is_zero() {
                        return Err(StoreError::new(
                            ErrorKind::Misconfigured,
                            format!(
                                "NATS bucket {name} has no max-age, so leases in it would never expire; use a bucket tenure created"
                            ),
                        ));
                    }
                    let kv = js.get_key_value(name).await.map_err(|e| nats_error("opening the bucket", e, false))?;
                    *cached = Some((kv, ttl));
                    return Ok(cached.clone());
                }
                Err(e) if not_found(&e) => {
                    let Some(ttl) = create_with else { return Ok(None) };
                    let config = stream::Config {
                        name: stream_name.clone(),
                        subjects: vec![format!("$KV.{name}.>")],
                        max_messages_per_subject: 1,
                        max_age: ttl,
                        duplicate_window: ttl.min(Duration::from_secs(120)),
                        allow_rollup: true,
                        deny_delete: true,
                        allow_direct: true,
                        discard: stream::DiscardPolicy::New,
                        storage: stream::StorageType::File,
                        num_replicas: 1,
                        ..Default::default()
                    };
                    // Racing creators: the loser finds the winner's bucket on the next turn.
                    // The server tells it "already in use", or, when the winner's stream is
                    // still being made, "subjects overlap with an existing stream" (a CI run).
                    if let Err(e) = js.create_stream(config).await
                        && !e.to_string().contains("already in use")
                        && !e.to_string().contains("subjects overlap")
                    {
                        return Err(nats_error("creating the bucket", e, true));
                    }
                }
                Err(e) => return Err(nats_error("looking up the bucket", e, false)),
            }
        }
        Err(StoreError::unavailable(format!("NATS: the bucket {name} could not be created; retrying")))
    }

    /// The bucket, checked to expire leases after `ttl`.
    async fn bucket_for(&self, ttl: Duration) -> Result<Store, StoreError> {
        let (kv, bucket_ttl) = self.bucket(Some(ttl)).await?.expect("created when missing");
        if bucket_ttl != ttl {
            return Err(StoreError::invalid(format!(
                "the NATS bucket {} expires a lease {bucket_ttl:?} after its last write (its max-age), \
                 but this election asks for a TTL of {ttl:?}: NATS 2.9 has no per-key TTL, so use \
                 --ttl {} or another bucket",
                self.inner.url.bucket,
                humanize(bucket_ttl)
            )));
        }
        Ok(kv)
    }

    fn record(&self, e: &Entry, ttl: Duration) -> Result<Option<LeaseRecord>, StoreError> {
        if e.operation != Operation::Put {
            return Ok(None);
        }
        let bad = |why: &str| {
            StoreError::new(
                ErrorKind::Misconfigured,
                format!("NATS key {} in bucket {} {why}; is another program writing to it?", e.key, e.bucket),
            )
        };
        let election = election_of(&e.key).ok_or_else(|| bad("does not name an election"))?;
        let v = decode(&e.value).ok_or_else(|| bad("does not hold a tenure lease"))?;
        let written = UNIX_EPOCH + Duration::from_nanos(e.created.unix_timestamp_nanos().max(0) as u64);
        let age = SystemTime::now().duration_since(written).unwrap_or(Duration::ZERO);
        Ok(Some(LeaseRecord {
            election,
            token: token_of(&v, e.revision),
            holder: v.holder,
            revision: Revision(e.revision),
            ttl: v.ttl,
            acquired_at: Some(if v.acquired_ms == 0 {
                written
            } else {
                UNIX_EPOCH + Duration::from_millis(v.acquired_ms)
            }),
            renewed_at: Some(written),
            // A hint from two clocks (the server's write time, ours now); never used for
            // safety. Clocks that disagree by more than a TTL give no hint at all.
            remaining: (age <= ttl * 2).then(|| ttl.saturating_sub(age)),
            evicted: v.evicted,
            metadata: v.metadata,
        }))
    }

    /// Drops what this store knew it last wrote for `election` (released or lost).
    fn forget(&self, election: &ElectionName) {
        self.inner.known.lock().unwrap_or_else(|e| e.into_inner()).remove(election);
    }

    /// The record as just written (its server time is not known: now, as a hint).
    fn written(&self, election: &ElectionName, v: &Value, revision: u64) -> LeaseRecord {
        let now = SystemTime::now();
        let token = token_of(v, revision);
        self.inner.known.lock().unwrap().insert(election.clone(), (Revision(revision), v.holder.clone(), token));
        LeaseRecord {
            election: election.clone(),
            holder: v.holder.clone(),
            token: token_of(v, revision),
            revision: Revision(revision),
            ttl: v.ttl,
            acquired_at: Some(if v.acquired_ms == 0 { now } else { UNIX_EPOCH + Duration::from_millis(v.acquired_ms) }),
            renewed_at: Some(now),
            remaining: Some(v.ttl),
            evicted: v.evicted,
            metadata: v.metadata.clone(),
        }
    }

    async fn read(
        &self,
        kv: &Store,
        ttl: Duration,
        election: &ElectionName,
    ) -> Result<Option<LeaseRecord>, StoreError> {
        let entry = match tokio::time::timeout(REQUEST_TIMEOUT, kv.entry(key_of(election.as_str()))).await {
            Ok(r) => r.map_err(|e| nats_error("get", e, false))?,
            Err(_) => {
                return Err(StoreError::unavailable(format!("NATS: get got no answer within {REQUEST_TIMEOUT:?}")));
            }
        };
        match entry {
            Some(e) => self.record(&e, ttl),
            None => Ok(None),
        }
    }

    /// Writes `v` if the key's last revision is still `expected` (0: no live message).
    /// `Ok(None)` when it is not.
    async fn write(
        &self,
        kv: &Store,
        what: &str,
        key: &str,
        v: &Value,
        expected: u64,
    ) -> Result<Option<u64>, StoreError> {
        match tokio::time::timeout(REQUEST_TIMEOUT, kv.update(key, v.encode().into(), expected)).await {
            Ok(Ok(rev)) => Ok(Some(rev)),
            Ok(Err(e)) if wrong_revision(&e) => Ok(None),
            Ok(Err(e)) => Err(nats_error(what, e, true)),
            Err(_) => Err(StoreError::timed_out(&format!("NATS: {what}"), REQUEST_TIMEOUT)),
        }
    }

    /// Deletes the key if its last revision is still `expected`; false when it is not.
    async fn delete(&self, kv: &Store, what: &str, key: &str, expected: u64) -> Result<bool, StoreError> {
        match tokio::time::timeout(REQUEST_TIMEOUT, kv.delete_expect_revision(key, Some(expected))).await {
            Ok(Ok(())) => Ok(true),
            Ok(Err(e)) if e.to_string().contains("wrong last sequence") => Ok(false),
            Ok(Err(e)) => Err(nats_error(what, e, true)),
            Err(_) => Err(StoreError::timed_out(&format!("NATS: {what}"), REQUEST_TIMEOUT)),
        }
    }

    /// The last entry of `key` in any state (a delete marker included), for writes that
    /// must name the revision they replace.
    async fn last(&self, kv: &Store, key: &str) -> Result<Option<Entry>, StoreError> {
        match tokio::time::timeout(REQUEST_TIMEOUT, kv.entry(key)).await {
            Ok(r) => r.map_err(|e| nats_error("get", e, false)),
            Err(_) => Err(StoreError::unavailable(format!("NATS: get got no answer within {REQUEST_TIMEOUT:?}"))),
        }
    }

    /// The change listener's feed: the bucket's watch.
    async fn open_feed(inner: Arc<Inner>) -> Option<Box<dyn tenure::store::ChangeFeed>> {
        let weak = Arc::downgrade(&inner);
        let store = NatsStore { inner };
        let (kv, ttl) = store.bucket(None).await.ok()??;
        let watch = tokio::time::timeout(REQUEST_TIMEOUT, kv.watch_all()).await.ok()?.ok()?;
        Some(Box::new(Entries { watch, store: weak, ttl }))
    }
}

/// The bucket's watch. Each entry is the key as it now stands: followers need no read
/// while the leader renews.
struct Entries {
    watch: async_nats::jetstream::kv::Watch,
    /// To read records with (weakly: the listener must not keep the store).
    store: std::sync::Weak<Inner>,
    ttl: Duration,
}

#[async_trait::async_trait]
impl tenure::store::ChangeFeed for Entries {
    async fn next(&mut self) -> Option<tenure::store::Change> {
        loop {
            let entry = self.watch.next().await?.ok()?;
            let Some(name) = election_of(&entry.key) else { continue };
            let store = NatsStore { inner: self.store.upgrade()? };
            return Some(match store.record(&entry, self.ttl) {
                Ok(r) => tenure::store::Change::now(name.as_str(), r),
                Err(_) => tenure::store::Change::read_again(name.as_str()),
            });
        }
    }
}

fn not_found(e: &async_nats::jetstream::context::GetStreamError) -> bool {
    use async_nats::jetstream::context::GetStreamErrorKind;
    match e.kind() {
        GetStreamErrorKind::JetStream(j) => j.error_code() == async_nats::jetstream::ErrorCode::STREAM_NOT_FOUND,
        _ => false,
    }
}

/// A duration as the CLI's `--ttl` takes it.
fn humanize(d: Duration) -> String {
    if d.subsec_millis() == 0 { format!("{}s", d.as_secs()) } else { format!("{}ms", d.as_millis()) }
}

#[async_trait::async_trait]
impl LeaseStore for NatsStore {
    fn describe(&self) -> String {
        self.inner.described.clone()
    }

    async fn try_acquire(&self, req: &AcquireRequest) -> Result<Acquire, StoreError> {
        req.validate()?;
        let kv = self.bucket_for(req.ttl).await?;
        let key = key_of(req.election.as_str());
        let fresh = Value {
            holder: req.holder.clone(),
            ttl: req.ttl,
            acquired_ms: 0,
            evicted: false,
            token: Some(0),
            metadata: req.metadata.clone(),
        };
        for _ in 0..5 {
            // No message for the key: create the grant; its sequence is the token.
            if let Some(rev) = self.write(&kv, "acquire", &key, &fresh, 0).await? {
                return Ok(Acquire::Acquired(self.written(&req.election, &fresh, rev)));
            }
            let Some(last) = self.last(&kv, &key).await? else { continue };
            let cur = match self.record(&last, req.ttl)? {
                // A delete marker: a new grant after it.
                None => {
                    if let Some(rev) = self.write(&kv, "acquire", &key, &fresh, last.revision).await? {
                        return Ok(Acquire::Acquired(self.written(&req.election, &fresh, rev)));
                    }
                    continue;
                }
                Some(cur) => cur,
            };
            if cur.holder != req.holder || cur.evicted {
                return Ok(Acquire::Held(cur));
            }
            // Our own grant: renewed, keeping its token and grant time.
            let again = Value { metadata: req.metadata.clone(), ..continuing(&cur) };
            if let Some(rev) = self.write(&kv, "acquire", &key, &again, cur.revision.0).await? {
                return Ok(Acquire::Acquired(self.written(&req.election, &again, rev)));
            }
        }
        Err(StoreError::unavailable("NATS: the record kept changing during the acquire; retrying"))
    }

    async fn renew(&self, held: &LeaseRecord, ttl: Duration) -> Result<Renew, StoreError> {
        check_ttl(ttl)?;
        let kv = self.bucket_for(ttl).await?;
        let key = key_of(held.election.as_str());
        if held.evicted {
            return Ok(Renew::Lost(self.read(&kv, ttl, &held.election).await?));
        }
        // Usually `held` is the record this store last wrote: one round trip, since its
        // revision names exactly that grant. Otherwise the record is read and checked first.
        let known = self.inner.known.lock().unwrap().get(&held.election).cloned();
        let mut base = (known == Some((held.revision, held.holder.clone(), held.token))).then(|| held.clone());
        for _ in 0..5 {
            let Some(b) = base.take() else {
                match self.read(&kv, ttl, &held.election).await? {
                    Some(cur) if cur.holder == held.holder && cur.token == held.token && !cur.evicted => {
                        base = Some(cur);
                        continue;
                    }
                    other => {
                        self.forget(&held.election);
                        return Ok(Renew::Lost(other));
                    }
                }
            };
            let v = Value { ttl, evicted: false, ..continuing(&b) };
            if let Some(rev) = self.write(&kv, "renew", &key, &v, b.revision.0).await? {
                return Ok(Renew::Renewed(self.written(&held.election, &v, rev)));
            }
        }
        Err(StoreError::unavailable("NATS: the record kept changing during the renewal; retrying"))
    }

    async fn release(&self, held: &LeaseRecord) -> Result<(), StoreError> {
        let Some((kv, ttl)) = self.bucket(None).await? else { return Ok(()) };
        match self.read(&kv, ttl, &held.election).await? {
            Some(cur) if cur.holder == held.holder && cur.token == held.token && cur.revision == held.revision => {
                self.delete(&kv, "release", &key_of(held.election.as_str()), held.revision.0).await?;
                self.forget(&held.election);
                Ok(())
            }
            _ => Ok(()),
        }
    }

    async fn get(&self, election: &ElectionName) -> Result<Option<LeaseRecord>, StoreError> {
        match self.bucket(None).await? {
            Some((kv, ttl)) => self.read(&kv, ttl, election).await,
            None => Ok(None),
        }
    }

    async fn list(&self, prefix: &str) -> Result<Vec<LeaseRecord>, StoreError> {
        let Some((kv, ttl)) = self.bucket(None).await? else { return Ok(Vec::new()) };
        let mut names = Vec::new();
        // The keys are the stream's subjects that hold a message, which the stream's info
        // lists (a request per page, and one more that finds the end). The bucket's key
        // listing would make a consumer instead, which waits for an idle heartbeat
        // (seconds) whenever a message it counted is removed before delivery.
        let collect = async {
            let mut subjects = kv
                .stream
                .info_with_subjects(format!("{}>", kv.prefix))
                .await
                .map_err(|e| nats_error("list", e, false))?;
            while let Some(subject) = subjects.next().await {
                let (subject, _) = subject.map_err(|e| nats_error("list", e, false))?;
                if let Some(n) = subject.strip_prefix(kv.prefix.as_str()).and_then(election_of)
                    && n.as_str().starts_with(prefix)
                {
                    names.push(n);
                }
            }
            Ok::<_, StoreError>(())
        };
        match tokio::time::timeout(REQUEST_TIMEOUT * 2, collect).await {
            Ok(r) => r?,
            Err(_) => return Err(StoreError::unavailable("NATS: listing the keys took too long")),
        }
        names.sort_by(|a, b| a.as_str().cmp(b.as_str()));
        names.dedup();
        let mut out = Vec::new();
        for n in names {
            if let Some(r) = self.read(&kv, ttl, &n).await? {
                out.push(r);
            }
        }
        Ok(out)
    }

    async fn evict(&self, election: &ElectionName, how: Evict) -> Result<Option<LeaseRecord>, StoreError> {
        let Some((kv, ttl)) = self.bucket(None).await? else { return Ok(None) };
        let key = key_of(election.as_str());
        for _ in 0..5 {
            let Some(cur) = self.read(&kv, ttl, election).await? else { return Ok(None) };
            let done = match how {
                Evict::Now => self.delete(&kv, "evict", &key, cur.revision.0).await?,
                Evict::AfterTerm if cur.evicted => true,
                // A new message: the key lives one max-age from now, past the holder's deadline.
                Evict::AfterTerm => {
                    let marked = Value { evicted: true, ..continuing(&cur) };
                    self.write(&kv, "evict", &key, &marked, cur.revision.0).await?.is_some()
                }
            };
            if done {
                return Ok(Some(cur));
            }
        }
        Err(StoreError::unavailable("NATS: the record kept changing during the eviction; try again"))
    }

    fn watch(&self, election: &ElectionName) -> Option<WatchStream> {
        Some(self.inner.changes.watch(Arc::new(self.clone()), &self.inner, election, Self::open_feed))
    }

    async fn ledger_read(&self, election: &ElectionName, key: &WorkKey) -> Result<Option<LedgerEntry>, StoreError> {
        let Some((kv, _)) = self.work_bucket(None).await? else { return Ok(None) };
        let entry = self.last(&kv, &work_key_of(election, key)).await?;
        Ok(entry
            .filter(|e| e.operation == Operation::Put)
            .map(|e| LedgerEntry { value: e.value.to_vec(), version: e.revision.to_string() }))
    }

    /// The ledger is a bucket of its own, `BUCKET_work`, whose max-age is how long it
    /// keeps an entry (NATS 2.9 has no per-key TTL): made with the first write's keep, its
    /// max-age is raised by a write that asks for longer, and entries of a shorter keep
    /// are kept longer than asked, which does no harm. Versions are the stream's sequence
    /// numbers, which never come back.
    async fn ledger_write(
        &self,
        election: &ElectionName,
        key: &WorkKey,
        value: &[u8],
        expected: Option<&str>,
        keep: Duration,
    ) -> Result<LedgerWrite, StoreError> {
        check_ledger_value(value)?;
        let (kv, kept) = self.work_bucket(Some(keep)).await?.expect("created when missing");
        if kept < keep {
            self.keep_work_longer(keep).await?;
        }
        let k = work_key_of(election, key);
        let expected = match expected {
            None => 0,
            Some(v) => match v.parse::<u64>() {
                Ok(v) if v > 0 => v,
                _ => return Ok(LedgerWrite::Conflict),
            },
        };
        if expected == 0 {
            // Only where no live message stands (a delete marker or nothing).
            return match tokio::time::timeout(REQUEST_TIMEOUT, kv.create(&k, value.to_vec().into())).await {
                Ok(Ok(rev)) => Ok(LedgerWrite::Written(rev.to_string())),
                Ok(Err(e)) if e.kind() == async_nats::jetstream::kv::CreateErrorKind::AlreadyExists => {
                    Ok(LedgerWrite::Conflict)
                }
                Ok(Err(e)) => Err(nats_error("writing the work ledger", e, true)),
                Err(_) => Err(StoreError::timed_out("NATS: writing the work ledger", REQUEST_TIMEOUT)),
            };
        }
        match tokio::time::timeout(REQUEST_TIMEOUT, kv.update(&k, value.to_vec().into(), expected)).await {
            Ok(Ok(rev)) => Ok(LedgerWrite::Written(rev.to_string())),
            Ok(Err(e)) if wrong_revision(&e) => Ok(LedgerWrite::Conflict),
            Ok(Err(e)) => Err(nats_error("writing the work ledger", e, true)),
            Err(_) => Err(StoreError::timed_out("NATS: writing the work ledger", REQUEST_TIMEOUT)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_are_single_tokens_and_map_back() {
        for name in ["a", "jobs/nightly.report", "x.y.z", "a-b_c/d"] {
            let key = key_of(name);
            assert!(!key.contains('.'), "{key}");
            assert_eq!(election_of(&key).unwrap().as_str(), name);
        }
    }

    #[test]
    fn urls_are_parsed_and_checked() {
        let p = parse_url("nats://app:s3cret@h1:4222,h2:4223/leases?ca=/etc/ca.pem").unwrap();
        assert_eq!(p.servers, vec!["nats://h1:4222", "nats://h2:4223"]);
        assert_eq!(p.auth, Auth::User("app".into(), "s3cret".into()));
        assert_eq!((p.bucket.as_str(), p.ca.as_deref()), ("leases", Some("/etc/ca.pem")));
        let p = parse_url("nats://tok@h:4222").unwrap();
        assert_eq!((p.auth, p.bucket.as_str()), (Auth::Token("tok".into()), DEFAULT_BUCKET));
        for bad in ["nats://h", "nats://h:x/b", "nats://h:1/a.b", "nats://h:1/b?x=1", "redis://h:1", "nats://@h:1"] {
            assert_eq!(parse_url(bad).err().map(|e| e.kind()), Some(ErrorKind::Invalid), "{bad}");
        }
    }

    #[test]
    fn values_round_trip() {
        let v = Value {
            holder: HolderId::new("h.1").unwrap(),
            ttl: Duration::from_millis(1500),
            acquired_ms: 17,
            evicted: true,
            token: Some(42),
            metadata: b"\n\x00 x".to_vec(),
        };
        assert_eq!(decode(&v.encode()), Some(v));
        assert_eq!(decode(b"tenure1 h 1 2 0\n"), None);
    }
}

#[cfg(test)]
mod fuzz {
    //! Fuzz targets for the store's URL parser and the values it reads back: arbitrary
    //! input never panics, and a refusal never prints the password.
    use proptest::prelude::*;

    proptest! {
        #[test]
        fn urls_never_panic_and_refusals_hide_the_password(
            scheme in prop_oneof![Just("nats://"), Just("tls://"), Just("nats:/"), Just("")],
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
        fn values_never_panic(raw in prop::collection::vec(any::<u8>(), 0..300), text in "tenure1 [ -~]{0,60}\n[ -~]{0,10}") {
            let _ = super::decode(&raw);
            let _ = super::decode(text.as_bytes());
        }
    }
}
