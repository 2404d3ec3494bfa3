//! etcd lease store for tenure.
//!
//! Each election is one key, `PREFIX/lease/ELECTION`, bound to an **etcd lease**: when
//! the lease runs out, etcd deletes the key, so the etcd leader's clock judges expiry.
//!
//! **One etcd lease per process.** A store keeps one etcd lease per TTL it is asked for
//! (in whole seconds, rounded up), shared by every election it holds with that TTL, and
//! keeps it alive with one keep-alive per renewal interval however many elections it
//! leads. A keep-alive is sent before every acquire and renewal unless one was already
//! sent after that call began, so an acquire or renewal that succeeds always finds the
//! lease refreshed after its request left: the key then lives at least a TTL after
//! the runtime dated its term.
//!
//! **Keep-alives are checked against Raft terms.** etcd answers a keep-alive from the
//! memory of the member that believes it leads, outside Raft, so a leader that was
//! paused while the others elected a new one can answer from a stale copy (a lease the
//! real leader lets run out sooner). A keep-alive's answer carries its Raft term, and so
//! does the write that uses the lease: the write counts only if the terms are equal.
//! When they differ (a leader changed in between), the store grants a new lease, a Raft
//! write no deposed leader can make, and writes the key again on it.
//!
//! **A keep-alive's answer goes to the call that sent it.** The stream answers in
//! order, without naming the request; a call dropped while waiting (the runtime's
//! request timeout) leaves its answer behind, so the next call opens a new stream rather
//! than read that answer as its own.
//!
//! **Tokens and revisions.** The key's create revision is the fencing token: etcd's
//! revision counter only grows, a key created again after a release, an eviction or
//! expiry gets a larger one, and it is durable across restarts. The key's mod revision
//! is the record's revision; a renewal rewrites the key (keeping its value) to move it.
//!
//! **Compare-and-set.** Renewal and release are transactions that compare the create
//! revision and the stored value (holder, TTL, eviction flag, metadata), so a record of
//! another grant, of another holder, or an evicted one never matches. A renewal also
//! compares the etcd lease the key is bound to, so one applied late cannot put the key
//! back on a lease the store has retired; a key found on an older lease is moved onto the
//! current one. Eviction after
//! term marks the value and moves the key to a fresh etcd lease of the record's TTL,
//! granted after the record was read, so the key outlives the holder's deadline but no
//! longer lives as long as the holder's process.
//!
//! Followers wait on one prefix watch per store, not on polling.
//!
//! ```no_run
//! # async fn t() -> Result<(), Box<dyn std::error::Error>> {
//! let store = tenure_etcd::EtcdStore::connect("etcd://127.0.0.1:2379,127.0.0.1:22379").await?;
//! # Ok(()) }
//! ```

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

mod rpc;

use rpc::{Client, pb, txn};
use tenure::store::{
    Acquire, AcquireRequest, LedgerEntry, LedgerWrite, Renew, Revision, StoredValue as Value, WatchStream,
    check_ledger_value, check_ttl,
};
use tenure::{ElectionName, ErrorKind, Evict, FencingToken, LeaseRecord, LeaseStore, StoreError, WorkKey};
use tokio::sync::OnceCell;

/// The default key prefix.
pub const DEFAULT_PREFIX: &str = "tenure";

/// How long one request may take before it counts as lost.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(3);

/// How many nested transactions one transaction carries: etcd refuses more than 128
/// operations in one transaction by default.
const TXN_CHUNK: usize = 100;

/// How many of a batch's transactions are in flight at once: etcd commits concurrent
/// transactions together, so 10,000 renewals take about the time of a dozen, not of a
/// hundred in a row.
const TXNS_IN_FLIGHT: usize = 8;

/// A lease store on an etcd cluster.
#[derive(Clone)]
pub struct EtcdStore {
    inner: Arc<Inner>,
}

struct Inner {
    options: rpc::Options,
    client: OnceCell<Client>,
    /// `PREFIX/lease/`: every election's key starts with it.
    keys: String,
    described: String,
    /// One etcd lease per TTL in whole seconds.
    leases: Mutex<HashMap<i64, Arc<tokio::sync::Mutex<LeaseSlot>>>>,
    changes: tenure::store::ChangeHub,
    /// Keys of ours whose release was sent and has not been answered as done: key →
    /// (create revision, mod revision), the term and the record the release names. They
    /// are bound to a shared etcd lease that the process's other elections keep alive, so
    /// they are swept before keep-alives instead of living as long as the process. The
    /// sweep deletes a key only if it is still that record, as the release would: a
    /// holder that takes its own key back (same token) moves its mod revision, so no
    /// sweep, however late, deletes a term this process leads again.
    abandoned: Mutex<HashMap<String, (i64, i64)>>,
    /// Held by the one caller that sweeps [`Inner::abandoned`]; others do not wait.
    sweeping: Arc<tokio::sync::Mutex<()>>,
    /// `PREFIX/work/`: every work-ledger entry's key starts with it.
    work: String,
    /// The etcd lease work-ledger entries are written on: its id, the keep it was granted
    /// for, and when. Granted for the keep plus [`WORK_LEASE_REUSE`] and used for that
    /// long, so that every entry lives at least its keep and a ledger costs one lease per
    /// hour, not one per write.
    work_lease: Mutex<Option<(i64, Duration, Instant)>>,
}

/// How long one etcd lease carries work-ledger entries (see [`Inner::work_lease`]).
const WORK_LEASE_REUSE: Duration = Duration::from_secs(3600);

/// One shared etcd lease and its keep-alive stream.
#[derive(Default)]
struct LeaseSlot {
    id: Option<i64>,
    stream: Option<rpc::Duplex<pb::LeaseKeepAliveRequest, pb::LeaseKeepAliveResponse>>,
    /// When the last keep-alive (or grant) that succeeded was sent, and what vouches for it.
    refreshed: Option<(Instant, Proof)>,
    /// A keep-alive was sent on `stream` and its answer not read: its caller stopped
    /// waiting (the runtime's request timeout). The stream answers in order without
    /// saying which request an answer is for, so that answer, read by the next call,
    /// would pass for the next keep-alive's, which may never have reached the leader.
    unanswered: bool,
}

/// What vouches that a refreshed lease lives a TTL from when the refresh was sent.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Proof {
    /// A grant: a Raft write, so only a member that leads can have made it.
    Granted,
    /// A keep-alive whose answer carried this Raft term (in etcd, the term of the last
    /// entry the answering member applied). etcd renews a lease in the memory of the
    /// member that believes it leads, not through Raft: a leader that was paused (or
    /// stalled) while the others elected a new one answers keep-alives from its stale
    /// copy until it hears of the new term, and the real leader lets the lease run out.
    /// Such an answer carries the old term, while a write committed after it lands
    /// behind the new leader's first entry, so its answer carries the new one: a write
    /// that uses this lease counts only if its answer carries this term.
    KeptAlive { term: u64 },
}

/// A shared lease refreshed for a call, and what vouches for it.
#[derive(Clone, Copy, Debug)]
struct Lease {
    id: i64,
    proof: Proof,
}

impl Lease {
    /// Whether the write answered by `header` may count on this lease: always after a
    /// grant; after a keep-alive, only under the same Raft term (no leader change between
    /// the keep-alive and the write, so the keep-alive was answered by the leader).
    fn vouched(&self, header: Option<&pb::ResponseHeader>) -> bool {
        match self.proof {
            Proof::Granted => true,
            Proof::KeptAlive { term } => {
                mutant("etcd-trusts-any-keepalive") || header.is_some_and(|h| h.raft_term == term)
            }
        }
    }
}

/// What one renewal transaction came to.
#[derive(Debug)]
enum Step {
    Done(Renew),
    /// Renewed on a lease nothing vouches for (see [`Proof`]): the record as written.
    Unvouched(LeaseRecord),
    /// Still our grant, but bound to the lease `from`, not the one renewed on.
    Move {
        from: i64,
    },
}

/// How many transactions one renewal may take: a move onto the current lease, a write on
/// a granted lease after a keep-alive nothing vouches for, and a transaction sent earlier
/// that moved the key meanwhile, may each add one.
const RENEW_ROUNDS: usize = 4;

/// The key a transaction's `get` answered, if it exists.
fn txn_kv(resp: &pb::TxnResponse) -> Option<&pb::KeyValue> {
    resp.responses.iter().find_map(|op| match &op.response {
        Some(pb::Response::Range(g)) => g.kvs.first(),
        _ => None,
    })
}

/// What one acquire attempt came to.
enum Attempt {
    Done(Acquire),
    /// The key changed in between: try again.
    Again,
    /// The key was written on a lease that nothing vouches for (see [`Proof`]).
    Unvouched,
}

impl Attempt {
    /// `done`, if the write `resp` answered may count on `lease`.
    fn vouched(lease: Lease, resp: &pb::TxnResponse, done: Acquire) -> Self {
        if lease.vouched(resp.header.as_ref()) { Attempt::Done(done) } else { Attempt::Unvouched }
    }
}

/// What the store URL says, split into the client's settings and ours.
struct Parsed {
    endpoints: Vec<String>,
    user: Option<(String, String)>,
    tls: bool,
    ca: Option<String>,
    /// A client certificate and its key (`cert=`, `key=`).
    identity: Option<(String, String)>,
    prefix: String,
}

fn parse_url(url: &str) -> Result<Parsed, StoreError> {
    let bad = |why: &str| {
        StoreError::invalid(format!(
            "etcd store URL: {why}; write etcd://[USER:PASSWORD@]HOST:PORT[,HOST:PORT…][?prefix=NAME] \
             (etcds:// for TLS, with ca=PATH for a private CA, cert=PATH&key=PATH for a client certificate)"
        ))
    };
    let (url, ours) =
        tenure::store::url::take_params(url, &["prefix", "ca", "cert", "key"]).map_err(|why| bad(&why))?;
    let (tls, rest) = if let Some(r) = url.strip_prefix("etcds://") {
        (true, r)
    } else if let Some(r) = url.strip_prefix("etcd://") {
        (false, r)
    } else {
        return Err(bad("the scheme must be etcd:// or etcds://"));
    };
    if rest.contains('?') {
        return Err(bad("unknown parameter (known: prefix, ca, cert, key)"));
    }
    let authority = rest.trim_end_matches('/');
    if authority.contains('/') {
        return Err(bad("a path is not allowed"));
    }
    let (user, hosts) = match authority.rsplit_once('@') {
        Some((info, hosts)) => {
            let (u, p) = info.split_once(':').ok_or_else(|| bad("user info needs USER:PASSWORD"))?;
            if u.is_empty() {
                return Err(bad("the user name is empty"));
            }
            (Some((u.to_string(), p.to_string())), hosts)
        }
        None => (None, authority),
    };
    let scheme = if tls { "https" } else { "http" };
    let mut endpoints = Vec::new();
    for h in hosts.split(',') {
        let (host, port) = h.rsplit_once(':').ok_or_else(|| bad(&format!("{h:?} needs a port")))?;
        if host.is_empty() || port.parse::<u16>().is_err() {
            return Err(bad(&format!("{h:?} is not HOST:PORT")));
        }
        endpoints.push(format!("{scheme}://{h}"));
    }
    let prefix = ours[0].clone().unwrap_or_else(|| DEFAULT_PREFIX.to_string());
    if prefix.is_empty() || !prefix.chars().all(|c| c.is_ascii_alphanumeric() || "._-/".contains(c)) {
        return Err(StoreError::invalid(format!(
            "key prefix {prefix:?} is not allowed: use letters, digits and . _ - /"
        )));
    }
    if (ours[1].is_some() || ours[2].is_some() || ours[3].is_some()) && !tls {
        return Err(bad("ca=, cert= and key= need etcds://"));
    }
    let identity = match (ours[2].clone(), ours[3].clone()) {
        (Some(c), Some(k)) => Some((c, k)),
        (None, None) => None,
        _ => return Err(bad("cert= and key= go together")),
    };
    Ok(Parsed { endpoints, user, tls, ca: ours[1].clone(), identity, prefix })
}

fn now_ms() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_millis() as u64)
}

/// The record a release of `held` names: its create revision (the term's token) and its
/// mod revision.
fn record_of(held: &LeaseRecord) -> (i64, i64) {
    (held.token.0 as i64, held.revision.0 as i64)
}

/// TTL in the whole seconds etcd leases count in, rounded up.
fn lease_secs(ttl: Duration) -> i64 {
    (ttl.as_millis().div_ceil(1000) as i64).max(1)
}

/// Maps a client error to a store error that says whether a retry can help.
fn etcd_error(what: &str, e: rpc::Error) -> StoreError {
    use rpc::Error as E;
    let (kind, hint) = match &e {
        E::Status(s) => {
            let m = s.message();
            match s.code() {
                tonic_code::Unauthenticated | tonic_code::PermissionDenied => {
                    (ErrorKind::Unauthorized, "check the user and password in the store URL")
                }
                _ if m.contains("authentication failed") || m.contains("invalid auth token") => {
                    (ErrorKind::Unauthorized, "check the user and password in the store URL")
                }
                _ if m.contains("requested lease not found") => {
                    (ErrorKind::Unavailable, "the process's etcd lease ran out; a new one is granted")
                }
                tonic_code::Unavailable if m.contains("onnection refused") || m.contains("tcp connect") => {
                    (ErrorKind::Unavailable, "nothing listens at the store URL's hosts and ports")
                }
                _ if m.contains("no leader") || m.contains("too many requests") || m.contains("not capable") => {
                    (ErrorKind::Unavailable, "the cluster cannot serve requests now")
                }
                tonic_code::Unavailable
                | tonic_code::DeadlineExceeded
                | tonic_code::Cancelled
                | tonic_code::Unknown => (ErrorKind::Ambiguous, "the request may or may not have been applied"),
                _ if m.contains("leader changed") || m.contains("timed out") => {
                    (ErrorKind::Ambiguous, "the request may or may not have been applied")
                }
                tonic_code::InvalidArgument | tonic_code::OutOfRange | tonic_code::FailedPrecondition => {
                    (ErrorKind::Misconfigured, "the server refused the request")
                }
                _ => (ErrorKind::Unavailable, "the server refused the request for now"),
            }
        }
        E::Config(_) => (ErrorKind::Misconfigured, "the store URL is not valid"),
    };
    StoreError::new(kind, format!("etcd: {what} failed ({hint})")).with_source(e)
}

/// Whether `e` says that the etcd lease no longer exists (it ran out or was revoked).
fn lease_gone(e: &StoreError) -> bool {
    let mut cur: Option<&(dyn std::error::Error + 'static)> = Some(e);
    while let Some(x) = cur {
        let m = x.to_string();
        if m.contains("lease not found") {
            return true;
        }
        cur = x.source();
    }
    false
}

/// gRPC status codes.
mod tonic_code {
    pub use tonic::Code::*;
}

/// Runs `f` with [`REQUEST_TIMEOUT`]; a timeout is an ambiguous answer.
async fn timed<T>(what: &str, f: impl std::future::Future<Output = Result<T, rpc::Error>>) -> Result<T, StoreError> {
    match tokio::time::timeout(REQUEST_TIMEOUT, f).await {
        Ok(r) => r.map_err(|e| etcd_error(what, e)),
        Err(_) => Err(StoreError::timed_out(&format!("etcd: {what}"), REQUEST_TIMEOUT)),
    }
}

impl EtcdStore {
    /// A store on the cluster `url` names:
    /// `etcd://[USER:PASSWORD@]HOST:PORT[,HOST:PORT…][?prefix=NAME]`, or `etcds://…` for TLS
    /// (the system's roots, or `ca=PATH` to a PEM file; `cert=PATH&key=PATH` for a client
    /// certificate). The connection is made on first
    /// use and remade after failures, so a cluster that is down now is not an error yet.
    pub async fn connect(url: &str) -> Result<Self, StoreError> {
        let p = parse_url(url)?;
        use tenure::store::url::{Pem, read_pem};
        let ca_pem = p.ca.as_deref().map(|path| read_pem("ca", path, Pem::Certificate)).transpose()?;
        let identity = match &p.identity {
            Some((c, k)) => Some((read_pem("cert", c, Pem::Certificate)?, read_pem("key", k, Pem::Key)?)),
            None => None,
        };
        let hosts: Vec<&str> = p.endpoints.iter().map(|e| e.split_once("://").map_or(e.as_str(), |x| x.1)).collect();
        let described = format!("{}://{} (prefix {})", if p.tls { "etcds" } else { "etcd" }, hosts.join(","), p.prefix);
        Ok(Self {
            inner: Arc::new(Inner {
                options: rpc::Options {
                    endpoints: p.endpoints,
                    user: p.user,
                    ca_pem,
                    identity,
                    connect_timeout: REQUEST_TIMEOUT,
                    keep_alive: (Duration::from_secs(2), Duration::from_secs(2)),
                },
                client: OnceCell::new(),
                keys: format!("{}/lease/", p.prefix),
                described,
                leases: Mutex::new(HashMap::new()),
                changes: tenure::store::ChangeHub::new(),
                abandoned: Mutex::new(HashMap::new()),
                sweeping: Arc::new(tokio::sync::Mutex::new(())),
                work: format!("{}/work/", p.prefix),
                work_lease: Mutex::new(None),
            }),
        })
    }

    async fn client(&self) -> Result<Client, StoreError> {
        self.inner
            .client
            .get_or_try_init(|| async {
                match tokio::time::timeout(REQUEST_TIMEOUT, Client::connect(&self.inner.options)).await {
                    Ok(r) => r.map_err(|e| {
                        let e = etcd_error("connecting", e);
                        // Nothing was applied yet: a broken connect is never ambiguous.
                        if e.kind() == ErrorKind::Ambiguous {
                            StoreError::unavailable(e.to_string()).with_source(e)
                        } else {
                            e
                        }
                    }),
                    Err(_) => Err(StoreError::unavailable("etcd: connecting timed out (cannot reach the server)")),
                }
            })
            .await
            .cloned()
    }

    /// The key of a work-ledger entry.
    fn work_key(&self, election: &ElectionName, key: &WorkKey) -> Vec<u8> {
        format!("{}{election}/{key}", self.inner.work).into_bytes()
    }

    /// The etcd lease to write a work-ledger entry kept for `keep` on (see
    /// [`Inner::work_lease`]); `fresh` grants a new one.
    async fn work_lease(&self, keep: Duration, fresh: bool) -> Result<i64, StoreError> {
        if !fresh
            && let Some((id, k, granted)) = *self.inner.work_lease.lock().unwrap()
            && k == keep
            && granted.elapsed() < WORK_LEASE_REUSE
        {
            return Ok(id);
        }
        let c = self.client().await?;
        let secs = (keep + WORK_LEASE_REUSE).as_secs().min(9_000_000_000) as i64;
        let granted = Instant::now();
        let id = timed("granting the work ledger's lease", c.lease_grant(secs)).await?.id;
        *self.inner.work_lease.lock().unwrap() = Some((id, keep, granted));
        Ok(id)
    }

    fn key(&self, election: &str) -> String {
        format!("{}{election}", self.inner.keys)
    }

    fn record(&self, kv: &pb::KeyValue) -> Result<LeaseRecord, StoreError> {
        let bad = |why: &str| {
            StoreError::new(
                ErrorKind::Misconfigured,
                format!(
                    "etcd key {} {why}; is another program writing under this prefix?",
                    String::from_utf8_lossy(&kv.key)
                ),
            )
        };
        let name = kv.key.strip_prefix(self.inner.keys.as_bytes()).ok_or_else(|| bad("is outside the prefix"))?;
        let name = std::str::from_utf8(name).ok().and_then(|n| ElectionName::new(n).ok());
        let election = name.ok_or_else(|| bad("does not name an election"))?;
        let v = Value::decode(&kv.value).ok_or_else(|| bad("does not hold a tenure lease"))?;
        Ok(LeaseRecord {
            election,
            holder: v.holder,
            token: FencingToken(kv.create_revision as u64),
            revision: Revision(kv.mod_revision as u64),
            ttl: v.ttl,
            acquired_at: (v.acquired_ms > 0).then(|| UNIX_EPOCH + Duration::from_millis(v.acquired_ms)),
            renewed_at: None,
            remaining: None,
            evicted: v.evicted,
            metadata: v.metadata,
        })
    }

    /// The record a transaction's `get` answered, if the key exists.
    fn txn_record(&self, resp: &pb::TxnResponse) -> Result<Option<LeaseRecord>, StoreError> {
        txn_kv(resp).map(|kv| self.record(kv)).transpose()
    }

    async fn txn(&self, what: &str, t: pb::TxnRequest) -> Result<pb::TxnResponse, StoreError> {
        let c = self.client().await?;
        let r = timed(what, c.txn(t)).await;
        if let Err(e) = &r
            && lease_gone(e)
        {
            self.inner.leases.lock().unwrap().clear();
        }
        r
    }

    /// One transaction per [`TXN_CHUNK`] of `indices`, holding `one(i)` for each as a
    /// nested transaction; sent up to [`TXNS_IN_FLIGHT`] at a time. Answers each chunk
    /// with its transaction's result, in order.
    async fn nested_in_chunks<'i>(
        &self,
        what: &'static str,
        indices: &'i [usize],
        one: impl Fn(usize) -> pb::TxnRequest,
    ) -> Vec<(&'i [usize], Result<pb::TxnResponse, StoreError>)> {
        let chunks: Vec<&[usize]> = indices.chunks(TXN_CHUNK).collect();
        let txns = chunks
            .iter()
            .map(|chunk| pb::TxnRequest {
                compare: Vec::new(),
                success: chunk.iter().map(|&i| txn::nested(one(i))).collect(),
                failure: Vec::new(),
            })
            .collect();
        chunks.into_iter().zip(self.txns(what, txns).await).collect()
    }

    /// Sends `txns`, up to [`TXNS_IN_FLIGHT`] at a time, and answers each in order.
    async fn txns(&self, what: &'static str, txns: Vec<pb::TxnRequest>) -> Vec<Result<pb::TxnResponse, StoreError>> {
        let mut out: Vec<Option<Result<pb::TxnResponse, StoreError>>> = (0..txns.len()).map(|_| None).collect();
        let mut running = tokio::task::JoinSet::new();
        for (i, t) in txns.into_iter().enumerate() {
            if running.len() >= TXNS_IN_FLIGHT
                && let Some(Ok((j, r))) = running.join_next().await
            {
                out[j] = Some(r);
            }
            let store = self.clone();
            running.spawn(async move { (i, store.txn(what, t).await) });
        }
        while let Some(done) = running.join_next().await {
            if let Ok((j, r)) = done {
                out[j] = Some(r);
            }
        }
        out.into_iter()
            .map(|r| {
                r.unwrap_or_else(|| Err(StoreError::ambiguous(format!("etcd: {what}: the request's task ended early"))))
            })
            .collect()
    }

    /// The shared etcd lease for `ttl`, refreshed by a keep-alive (or granted) that was
    /// sent no earlier than `since`; with `grant`, by a grant only (after a keep-alive
    /// that a write could not count on).
    async fn lease(&self, ttl: Duration, since: Instant, grant: bool) -> Result<Lease, StoreError> {
        let secs = lease_secs(ttl);
        self.sweep_abandoned();
        let slot = self.inner.leases.lock().unwrap().entry(secs).or_default().clone();
        let mut slot = slot.lock().await;
        if let (Some(id), Some((at, proof))) = (slot.id, slot.refreshed)
            && at >= since
            && (!grant || proof == Proof::Granted)
        {
            return Ok(Lease { id, proof });
        }
        if slot.unanswered && !mutant("etcd-keepalive-answer-unmatched") {
            slot.stream = None;
        }
        slot.unanswered = false;
        let c = self.client().await?;
        // Opening the stream sends its first keep-alive: date it from before the open.
        let mut sent = Instant::now();
        let mut opened_now = false;
        if let Some(id) = slot.id
            && slot.stream.is_none()
            && !grant
        {
            slot.unanswered = true;
            match timed("opening a lease keep-alive", c.lease_keep_alive(id)).await {
                Ok(s) => {
                    slot.stream = Some(s);
                    opened_now = true;
                }
                Err(e) if lease_gone(&e) => slot.id = None,
                Err(e) => return Err(e),
            }
        }
        if let (Some(id), Some(_), false) = (slot.id, slot.stream.as_ref(), grant) {
            if !opened_now {
                sent = Instant::now();
            }
            slot.unanswered = true;
            let (keeper, stream) = slot.stream.as_mut().expect("opened above");
            let answer = tokio::time::timeout(REQUEST_TIMEOUT, async {
                if !opened_now && keeper.send(pb::LeaseKeepAliveRequest { id }).await.is_err() {
                    return Ok(None); // the stream is gone: reported as ended
                }
                stream.message().await.map_err(rpc::Error::from)
            })
            .await;
            slot.unanswered = false;
            match answer {
                Ok(Ok(Some(r))) if r.ttl >= secs => {
                    // An answer without a Raft term cannot be checked: grant a new lease below.
                    if let Some(h) = r.header {
                        let proof = Proof::KeptAlive { term: h.raft_term };
                        slot.refreshed = Some((sent, proof));
                        return Ok(Lease { id, proof });
                    }
                }
                // The lease ran out (its keys are gone): grant a new one below.
                Ok(Ok(Some(r))) if r.ttl <= 0 => slot.id = None,
                Ok(Ok(Some(r))) => {
                    slot.stream = None;
                    return Err(StoreError::new(
                        ErrorKind::Misconfigured,
                        format!("etcd kept a {secs} s lease alive for only {} s", r.ttl),
                    ));
                }
                Ok(Ok(None)) => {
                    slot.stream = None;
                    return Err(StoreError::unavailable(
                        "etcd: the lease keep-alive stream ended (cannot reach the server)",
                    ));
                }
                Ok(Err(e)) => {
                    slot.stream = None;
                    let e = etcd_error("keeping the lease alive", e);
                    if lease_gone(&e) {
                        slot.id = None;
                    } else {
                        return Err(if e.kind() == ErrorKind::Ambiguous {
                            StoreError::unavailable(e.to_string())
                        } else {
                            e
                        });
                    }
                }
                Err(_) => {
                    slot.stream = None;
                    return Err(StoreError::unavailable(format!(
                        "etcd: the lease keep-alive got no answer within {REQUEST_TIMEOUT:?}"
                    )));
                }
            }
        }
        slot.stream = None;
        let sent = Instant::now();
        let granted = timed("granting a lease", c.lease_grant(secs)).await?;
        if granted.ttl < secs {
            return Err(StoreError::new(
                ErrorKind::Misconfigured,
                format!("etcd granted a {} s lease when {secs} s were asked", granted.ttl),
            ));
        }
        slot.id = Some(granted.id);
        slot.refreshed = Some((sent, Proof::Granted));
        Ok(Lease { id: granted.id, proof: Proof::Granted })
    }

    /// Sweeps the keys whose release failed, in a task of its own, so that no keep-alive
    /// goes on extending them. At most one sweep runs at a time and no caller waits for
    /// it; a failed sweep stops and is tried again on a later call (the keys die with the
    /// shared lease at the latest).
    fn sweep_abandoned(&self) {
        if self.inner.abandoned.lock().unwrap().is_empty() {
            return;
        }
        let Ok(sweeping) = self.inner.sweeping.clone().try_lock_owned() else { return };
        let store = self.clone();
        tokio::spawn(async move {
            let _sweeping = sweeping;
            loop {
                match store.sweep_chunk().await {
                    Ok(true) => {}
                    Ok(false) => return,
                    Err(e) => {
                        tracing::warn!(error = %e, "etcd: deleting leases whose release failed did not work; trying again later");
                        return;
                    }
                }
            }
        });
    }

    /// Deletes up to [`TXN_CHUNK`] listed keys that are still the records their releases
    /// named, and unlists them. False when nothing is listed.
    async fn sweep_chunk(&self) -> Result<bool, StoreError> {
        let chunk: Vec<(String, (i64, i64))> = {
            let abandoned = self.inner.abandoned.lock().unwrap();
            abandoned.iter().take(TXN_CHUNK).map(|(k, t)| (k.clone(), *t)).collect()
        };
        if chunk.is_empty() {
            return Ok(false);
        }
        let ops = chunk
            .iter()
            .map(|(key, (token, revision))| {
                let k = key.as_bytes();
                let mut compare = vec![txn::create_revision_is(k, *token)];
                if !mutant("etcd-sweep-ignores-revision") {
                    compare.push(txn::mod_revision_is(k, *revision));
                }
                txn::nested(pb::TxnRequest { compare, success: vec![txn::delete(k)], failure: Vec::new() })
            })
            .collect();
        let t = pb::TxnRequest { compare: Vec::new(), success: ops, failure: Vec::new() };
        self.txn("deleting leases whose release failed", t).await?;
        // No key of those records exists now, nor can again: revisions never repeat.
        chunk.iter().for_each(|(key, term)| self.forget(key, *term));
        Ok(true)
    }

    /// Lists `held` as released but not yet known to be (see [`Inner::abandoned`]); of
    /// two releases of one key, the later record stays listed.
    fn abandon(&self, held: &LeaseRecord) {
        let term = record_of(held);
        let mut abandoned = self.inner.abandoned.lock().unwrap();
        let entry = abandoned.entry(self.key(held.election.as_str())).or_insert(term);
        *entry = (*entry).max(term);
    }

    /// Unlists `held` once its release was answered.
    fn forget_release(&self, held: &LeaseRecord) {
        self.forget(&self.key(held.election.as_str()), record_of(held));
    }

    /// Unlists `key` if it is still listed for `term` (create and mod revision).
    fn forget(&self, key: &str, term: (i64, i64)) {
        let mut abandoned = self.inner.abandoned.lock().unwrap();
        if abandoned.get(key) == Some(&term) {
            abandoned.remove(key);
        }
    }

    /// The release of `held` as one transaction: deletes the key only if it is still that
    /// term at that revision with that value.
    fn release_txn(&self, held: &LeaseRecord) -> pb::TxnRequest {
        let key = self.key(held.election.as_str());
        let k = key.as_bytes();
        pb::TxnRequest {
            compare: vec![
                txn::create_revision_is(k, held.token.0 as i64),
                txn::mod_revision_is(k, held.revision.0 as i64),
                txn::value_is(k, Value::of(held).encode()),
            ],
            success: vec![txn::delete(k)],
            failure: Vec::new(),
        }
    }

    /// The change listener's feed: a watch on the store's key prefix.
    async fn open_feed(inner: Arc<Inner>) -> Option<Box<dyn tenure::store::ChangeFeed>> {
        let keys = inner.keys.clone();
        let weak = Arc::downgrade(&inner);
        let store = EtcdStore { inner };
        let client = store.client().await.ok()?;
        let watch = timed("watching", client.watch_prefix(keys.as_bytes())).await.ok()?;
        Some(Box::new(KeyEvents { watch, store: weak, keys, pending: Default::default() }))
    }

    /// Takes an absent key, or re-takes our own: one transaction in the common case.
    async fn acquire_once(&self, req: &AcquireRequest, lease: Lease) -> Result<Attempt, StoreError> {
        let key = self.key(req.election.as_str());
        let fresh = Value {
            holder: req.holder.clone(),
            ttl: req.ttl,
            acquired_ms: now_ms(),
            evicted: false,
            token: None,
            metadata: req.metadata.clone(),
        };
        let k = key.as_bytes();
        let t = pb::TxnRequest {
            compare: vec![txn::create_revision_is(k, 0)],
            success: vec![txn::put(k, Some(fresh.encode()), lease.id), txn::get(k)],
            failure: vec![txn::get(k)],
        };
        let resp = self.txn("acquire", t).await?;
        let current = self.txn_record(&resp)?;
        if resp.succeeded {
            let rec = current.ok_or_else(|| StoreError::ambiguous("etcd: the lease vanished while it was acquired"))?;
            return Ok(Attempt::vouched(lease, &resp, Acquire::Acquired(rec)));
        }
        let Some(cur) = current else {
            return Ok(Attempt::Again); // gone in between: try again
        };
        if cur.holder != req.holder || cur.evicted {
            return Ok(Attempt::Done(Acquire::Held(cur)));
        }
        // Our own record: a renewal that keeps the token and the grant time.
        let again = Value { acquired_ms: Value::of(&cur).acquired_ms, ..fresh };
        let t = pb::TxnRequest {
            compare: vec![txn::mod_revision_is(k, cur.revision.0 as i64)],
            success: vec![txn::put(k, Some(again.encode()), lease.id), txn::get(k)],
            failure: Vec::new(),
        };
        let resp = self.txn("acquire", t).await?;
        if !resp.succeeded {
            return Ok(Attempt::Again);
        }
        let rec = self.txn_record(&resp)?;
        let rec = rec.ok_or_else(|| StoreError::ambiguous("etcd: the lease vanished while it was acquired"))?;
        Ok(Attempt::vouched(lease, &resp, Acquire::Acquired(rec)))
    }

    /// The renewal of `held` as one transaction: if the key is still that grant (create
    /// revision and value) and bound to the etcd lease `on`, rewrite it on `lease` (moving
    /// its revision), and read it.
    ///
    /// The lease is compared because a renewal can be applied long after it was sent (its
    /// caller gave up on it): by then the store may have granted a new etcd lease, moved
    /// the key onto it, and stopped keeping the old one alive. Without the compare, that
    /// late renewal would put the key back on the old lease, which ends before the term
    /// the holder dates from its later renewals. A retired lease never becomes the one a
    /// store renews on again, so a key only ever moves forward.
    fn renew_txn(&self, held: &LeaseRecord, ttl: Duration, on: i64, lease: i64) -> pb::TxnRequest {
        let key = self.key(held.election.as_str());
        let k = key.as_bytes();
        let put = if ttl == held.ttl {
            // Same value: only the revision moves (and the lease, should it have changed).
            txn::put(k, None, lease)
        } else {
            let v = Value { ttl, ..Value::of(held) };
            txn::put(k, Some(v.encode()), lease)
        };
        let mut compare =
            vec![txn::create_revision_is(k, held.token.0 as i64), txn::value_is(k, Value::of(held).encode())];
        if !mutant("etcd-renew-ignores-lease") {
            compare.push(txn::lease_is(k, on));
        }
        pb::TxnRequest { compare, success: vec![put, txn::get(k)], failure: vec![txn::get(k)] }
    }

    /// What the answer `t` to a [`EtcdStore::renew_txn`] of `held` means; `vouched` tells
    /// whether the write may count on the lease it was made on (see [`Lease::vouched`]).
    fn renew_step(&self, held: &LeaseRecord, t: &pb::TxnResponse, vouched: bool) -> Result<Step, StoreError> {
        Ok(match (t.succeeded, self.txn_record(t)?) {
            (true, Some(rec)) if vouched => Step::Done(Renew::Renewed(rec)),
            (true, Some(rec)) => Step::Unvouched(rec),
            // Still our grant, but not on the lease compared: bound to an older one (move
            // it onto the current one), or already moved onto the current one by a
            // transaction sent earlier and applied meanwhile (the next round is then a
            // plain renewal).
            (false, Some(_))
                if let Some(kv) = txn_kv(t)
                    && kv.create_revision == held.token.0 as i64
                    && kv.value == Value::of(held).encode() =>
            {
                Step::Move { from: kv.lease }
            }
            (_, cur) => Step::Done(Renew::Lost(cur)),
        })
    }

    /// Acquires for a call that began at `since`: on a lease refreshed no earlier.
    async fn acquire_from(&self, req: &AcquireRequest, since: Instant) -> Result<Acquire, StoreError> {
        let mut grant = false;
        for _ in 0..5 {
            let lease = self.lease(req.ttl, since, grant).await?;
            match self.acquire_once(req, lease).await? {
                Attempt::Done(a) => return Ok(a),
                Attempt::Again => {}
                // The key is ours on a lease nothing vouches for: take it again (our own
                // record) on a granted one.
                Attempt::Unvouched => grant = true,
            }
        }
        Err(StoreError::unavailable("etcd: the record kept changing during the acquire; retrying"))
    }

    /// [`LeaseStore::renew_many`] for a call that began at `since`.
    async fn renew_many_from(
        &self,
        held: &[LeaseRecord],
        ttl: Duration,
        since: Instant,
    ) -> Vec<Result<Renew, StoreError>> {
        let mut out: Vec<Option<Result<Renew, StoreError>>> = (0..held.len()).map(|_| None).collect();
        if let Err(e) = check_ttl(ttl) {
            return held.iter().map(|_| Err(e.duplicate())).collect();
        }
        // Evicted copies and repeated elections take the one-by-one path.
        let mut seen = std::collections::HashSet::new();
        let mut todo: Vec<usize> =
            (0..held.len()).filter(|&i| !held[i].evicted && seen.insert(held[i].election.clone())).collect();
        // A copy written on a lease nothing vouches for, to compare with in the next round.
        let mut written: HashMap<usize, LeaseRecord> = HashMap::new();
        // The lease a key is bound to, where it is not the one the round renews on.
        let mut on: HashMap<usize, i64> = HashMap::new();
        let mut grant = false;
        for _ in 0..RENEW_ROUNDS {
            if todo.is_empty() {
                break;
            }
            let lease = match self.lease(ttl, since, grant).await {
                Ok(l) => l,
                Err(e) => {
                    todo.iter().for_each(|&i| out[i] = Some(Err(e.duplicate())));
                    break;
                }
            };
            let round = std::mem::take(&mut todo);
            let answers = self
                .nested_in_chunks("renew", &round, |i| {
                    let from = on.get(&i).copied().unwrap_or(lease.id);
                    self.renew_txn(written.get(&i).unwrap_or(&held[i]), ttl, from, lease.id)
                })
                .await;
            for (chunk, answer) in answers {
                let resp = match answer {
                    Ok(resp) => resp,
                    Err(e) => {
                        chunk.iter().for_each(|&i| out[i] = Some(Err(e.duplicate())));
                        continue;
                    }
                };
                let vouched = lease.vouched(resp.header.as_ref());
                for (&i, r) in chunk.iter().zip(resp.responses) {
                    let Some(pb::Response::Txn(t)) = r.response else {
                        out[i] =
                            Some(Err(StoreError::ambiguous("etcd answered a nested transaction with something else")));
                        continue;
                    };
                    match self.renew_step(written.get(&i).unwrap_or(&held[i]), &t, vouched) {
                        Ok(Step::Done(r)) => out[i] = Some(Ok(r)),
                        Ok(Step::Unvouched(rec)) => {
                            // Once more, on a granted lease.
                            grant = true;
                            on.insert(i, lease.id);
                            written.insert(i, rec);
                            todo.push(i);
                        }
                        Ok(Step::Move { from }) => {
                            on.insert(i, from);
                            todo.push(i);
                        }
                        Err(e) => out[i] = Some(Err(e)),
                    }
                }
            }
        }
        let mut answers = Vec::with_capacity(held.len());
        for (i, slot) in out.into_iter().enumerate() {
            answers.push(match slot {
                Some(a) => a,
                // Rounds ran out: once more alone, from the copy last written.
                None => self.renew(written.get(&i).unwrap_or(&held[i]), ttl).await,
            });
        }
        answers
    }

    /// Renews `held` on a lease refreshed no earlier than `since`.
    async fn renew_from(&self, held: &LeaseRecord, ttl: Duration, since: Instant) -> Result<Renew, StoreError> {
        let mut held = std::borrow::Cow::Borrowed(held);
        let mut grant = false;
        let mut on = None;
        for _ in 0..RENEW_ROUNDS {
            let lease = self.lease(ttl, since, grant).await?;
            let resp = self.txn("renew", self.renew_txn(&held, ttl, on.unwrap_or(lease.id), lease.id)).await?;
            match self.renew_step(&held, &resp, lease.vouched(resp.header.as_ref()))? {
                Step::Done(r) => return Ok(r),
                // Renewed on a lease nothing vouches for: once more on a granted one.
                Step::Unvouched(rec) => {
                    grant = true;
                    on = Some(lease.id);
                    held = std::borrow::Cow::Owned(rec);
                }
                Step::Move { from } => on = Some(from),
            }
        }
        Err(StoreError::unavailable("etcd: the record kept moving during the renewal; retrying"))
    }

    async fn get_key(&self, election: &str) -> Result<Option<LeaseRecord>, StoreError> {
        let c = self.client().await?;
        let resp = timed("get", c.range(self.key(election).into_bytes(), Vec::new())).await?;
        resp.kvs.first().map(|kv| self.record(kv)).transpose()
    }
}

#[async_trait::async_trait]
impl LeaseStore for EtcdStore {
    fn describe(&self) -> String {
        self.inner.described.clone()
    }

    async fn try_acquire(&self, req: &AcquireRequest) -> Result<Acquire, StoreError> {
        req.validate()?;
        self.acquire_from(req, Instant::now()).await
    }

    async fn renew(&self, held: &LeaseRecord, ttl: Duration) -> Result<Renew, StoreError> {
        check_ttl(ttl)?;
        if held.evicted {
            return Ok(Renew::Lost(self.get_key(held.election.as_str()).await?));
        }
        self.renew_from(held, ttl, Instant::now()).await
    }

    /// One keep-alive of the shared lease, then one transaction holding each lease's
    /// renewal as a nested transaction (in chunks under etcd's limit of operations). A
    /// chunk whose keep-alive nothing vouches for is renewed once more on a granted lease.
    async fn renew_many(&self, held: &[LeaseRecord], ttl: Duration) -> Vec<Result<Renew, StoreError>> {
        self.renew_many_from(held, ttl, Instant::now()).await
    }

    async fn release(&self, held: &LeaseRecord) -> Result<(), StoreError> {
        // Listed before it is sent: should the caller stop waiting (its future dropped) or
        // the request fail, the key may still be bound to the shared lease, and a later
        // call deletes it (our work has stopped, so deleting it can only free it sooner).
        self.abandon(held);
        self.txn("release", self.release_txn(held)).await?;
        self.forget_release(held);
        Ok(())
    }

    /// One transaction holding each release as a nested transaction (in chunks under
    /// etcd's limit of operations), so that a process that leads thousands of elections
    /// hands them over in a few round trips when it stops.
    async fn release_many(&self, held: &[LeaseRecord]) -> Vec<Result<(), StoreError>> {
        held.iter().for_each(|h| self.abandon(h));
        let mut out: Vec<Option<Result<(), StoreError>>> = (0..held.len()).map(|_| None).collect();
        // etcd refuses a transaction that writes one key twice: repeated elections take
        // the one-by-one path.
        let mut seen = std::collections::HashSet::new();
        let batchable: Vec<usize> = (0..held.len()).filter(|&i| seen.insert(held[i].election.clone())).collect();
        for (chunk, answer) in self.nested_in_chunks("release", &batchable, |i| self.release_txn(&held[i])).await {
            match answer {
                // Whether each compare held or not, the release is done: a release that
                // does not match the current term changes nothing and is no error.
                Ok(_) => chunk.iter().for_each(|&i| {
                    self.forget_release(&held[i]);
                    out[i] = Some(Ok(()));
                }),
                Err(e) => chunk.iter().for_each(|&i| out[i] = Some(Err(e.duplicate()))),
            }
        }
        let mut answers = Vec::with_capacity(held.len());
        for (i, slot) in out.into_iter().enumerate() {
            answers.push(match slot {
                Some(a) => a,
                None => self.release(&held[i]).await,
            });
        }
        answers
    }

    async fn get(&self, election: &ElectionName) -> Result<Option<LeaseRecord>, StoreError> {
        self.get_key(election.as_str()).await
    }

    async fn list(&self, prefix: &str) -> Result<Vec<LeaseRecord>, StoreError> {
        let c = self.client().await?;
        let start = self.key(prefix).into_bytes();
        let end = rpc::prefix_end(&start);
        let resp = timed("list", c.range(start, end)).await?;
        let mut out = resp.kvs.iter().map(|kv| self.record(kv)).collect::<Result<Vec<_>, _>>()?;
        out.sort_by(|a, b| a.election.as_str().cmp(b.election.as_str()));
        Ok(out)
    }

    async fn evict(&self, election: &ElectionName, how: Evict) -> Result<Option<LeaseRecord>, StoreError> {
        let key = self.key(election.as_str());
        if how == Evict::Now {
            let c = self.client().await?;
            let resp = timed("evict", c.delete(key.into_bytes())).await?;
            return resp.prev_kvs.first().map(|kv| self.record(kv)).transpose();
        }
        for _ in 0..5 {
            let Some(cur) = self.get_key(election.as_str()).await? else {
                return Ok(None);
            };
            if cur.evicted {
                return Ok(Some(cur));
            }
            // Granted after the read, and the write below only lands if nothing renewed
            // since the read: the key outlives every term the holder was granted.
            let c = self.client().await?;
            let lease = timed("granting a lease", c.lease_grant(lease_secs(cur.ttl))).await?.id;
            let marked = Value { evicted: true, ..Value::of(&cur) };
            let k = key.as_bytes();
            let t = pb::TxnRequest {
                compare: vec![txn::mod_revision_is(k, cur.revision.0 as i64)],
                success: vec![txn::put(k, Some(marked.encode()), lease)],
                failure: Vec::new(),
            };
            if self.txn("evict", t).await?.succeeded {
                return Ok(Some(cur));
            }
        }
        Err(StoreError::unavailable("etcd: the record kept changing during the eviction; try again"))
    }

    fn watch(&self, election: &ElectionName) -> Option<WatchStream> {
        Some(self.inner.changes.watch(Arc::new(self.clone()), &self.inner, election, Self::open_feed))
    }

    async fn ledger_read(&self, election: &ElectionName, key: &WorkKey) -> Result<Option<LedgerEntry>, StoreError> {
        let c = self.client().await?;
        let r = timed("reading the work ledger", c.range(self.work_key(election, key), Vec::new())).await?;
        Ok(r.kvs.first().map(|kv| LedgerEntry { value: kv.value.clone(), version: kv.mod_revision.to_string() }))
    }

    /// One transaction: the entry's mod revision compared (or its absence, as a create
    /// revision of 0), the value put on the ledger's lease. Versions are mod revisions,
    /// which never come back.
    async fn ledger_write(
        &self,
        election: &ElectionName,
        key: &WorkKey,
        value: &[u8],
        expected: Option<&str>,
        keep: Duration,
    ) -> Result<LedgerWrite, StoreError> {
        check_ledger_value(value)?;
        let at = self.work_key(election, key);
        let compare = match expected {
            None => txn::create_revision_is(&at, 0),
            Some(v) => match v.parse::<i64>() {
                Ok(v) => txn::mod_revision_is(&at, v),
                Err(_) => return Ok(LedgerWrite::Conflict),
            },
        };
        let mut fresh = false;
        loop {
            let lease = self.work_lease(keep, fresh).await?;
            let t = pb::TxnRequest {
                compare: vec![compare.clone()],
                success: vec![txn::put(&at, Some(value.to_vec()), lease)],
                failure: vec![],
            };
            // Not through `txn`, whose lease-gone handling is for the elections' leases.
            let c = self.client().await?;
            match timed("writing the work ledger", c.txn(t)).await {
                Ok(r) if r.succeeded => {
                    let rev = r.header.map(|h| h.revision).unwrap_or_default();
                    return Ok(LedgerWrite::Written(rev.to_string()));
                }
                Ok(_) => return Ok(LedgerWrite::Conflict),
                // The lease ran out or was revoked: nothing was written; once more on a new one.
                Err(e) if lease_gone(&e) && !fresh => fresh = true,
                Err(e) => return Err(e),
            }
        }
    }
}

/// The store's prefix watch. Each event carries the key as it now stands: followers need
/// no read while the leader renews.
struct KeyEvents {
    watch: tonic::Streaming<pb::WatchResponse>,
    /// To read records with (weakly: the listener must not keep the store).
    store: std::sync::Weak<Inner>,
    keys: String,
    /// Changes of a response not handed out yet.
    pending: std::collections::VecDeque<tenure::store::Change>,
}

#[async_trait::async_trait]
impl tenure::store::ChangeFeed for KeyEvents {
    async fn next(&mut self) -> Option<tenure::store::Change> {
        loop {
            if let Some(c) = self.pending.pop_front() {
                return Some(c);
            }
            let resp = self.watch.message().await.ok()??;
            if resp.canceled {
                return None;
            }
            let store = EtcdStore { inner: self.store.upgrade()? };
            for ev in &resp.events {
                let Some(kv) = &ev.kv else { continue };
                let Some(name) = kv.key.strip_prefix(self.keys.as_bytes()) else { continue };
                let name = String::from_utf8_lossy(name);
                self.pending.push_back(if ev.r#type == pb::EventType::Delete as i32 {
                    tenure::store::Change::now(&name, None)
                } else {
                    match store.record(kv) {
                        Ok(r) => tenure::store::Change::record(r),
                        Err(_) => tenure::store::Change::read_again(&name),
                    }
                });
            }
        }
    }
}

use tenure::mutant;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_are_parsed_and_checked() {
        let p = parse_url("etcd://root:s3cret@h1:2379,h2:22379?prefix=app/leases").unwrap();
        assert_eq!(p.endpoints, vec!["http://h1:2379", "http://h2:22379"]);
        assert_eq!(p.user, Some(("root".into(), "s3cret".into())));
        assert_eq!((p.tls, p.prefix.as_str()), (false, "app/leases"));
        let p = parse_url("etcds://h:2379/?ca=/etc/ca.pem").unwrap();
        assert_eq!((p.endpoints[0].as_str(), p.tls, p.ca.as_deref()), ("https://h:2379", true, Some("/etc/ca.pem")));
        for bad in
            ["etcd://h", "etcd://h:x", "etcd://h:2379/db", "etcd://h:2379?x=1", "http://h:2379", "etcd://h:1?ca=a"]
        {
            assert_eq!(parse_url(bad).err().map(|e| e.kind()), Some(ErrorKind::Invalid), "{bad}");
        }
        assert!(parse_url("etcd://h:1?prefix=a*b").is_err());
    }

    #[test]
    fn lease_seconds_round_up() {
        assert_eq!(lease_secs(Duration::from_millis(300)), 1);
        assert_eq!(lease_secs(Duration::from_millis(2000)), 2);
        assert_eq!(lease_secs(Duration::from_millis(2001)), 3);
    }

    /// A holder takes its own key back (same token) around a release of it that failed,
    /// in either order: a release listed before the re-take, and one listed after it (a
    /// release through `Batched` that timed out for the runtime, which campaigned again,
    /// and failed later). No sweep may delete the term it leads again: another candidate
    /// could take it at once.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_key_taken_back_after_a_failed_release_survives_the_sweep() {
        use tenure::HolderId;
        use tenure_testkit::proxy::{Mode, Proxy};
        use tenure_testkit::servers::{self, Kind};
        let Some(server) = servers::launch(Kind::Etcd) else { return };
        let proxy = Proxy::start(("127.0.0.1", server.port())).unwrap();
        let store = EtcdStore::connect(&format!("etcd://127.0.0.1:{}", proxy.port())).await.unwrap();
        let ttl = Duration::from_secs(5);
        let p = HolderId::new("p").unwrap();
        let acquire = async |req: &AcquireRequest| loop {
            // The connection is made again after a cut: retry what is retryable.
            match store.try_acquire(req).await {
                Ok(Acquire::Acquired(l)) => break l,
                Ok(Acquire::Held(r)) => panic!("held by {}", r.holder),
                Err(e) if e.is_retryable() => tokio::time::sleep(Duration::from_millis(100)).await,
                Err(e) => panic!("{e}"),
            }
        };
        let before = AcquireRequest::new(ElectionName::new("retaken/before").unwrap(), p.clone(), ttl);
        let after = AcquireRequest::new(ElectionName::new("retaken/after").unwrap(), p.clone(), ttl);
        let first_before = acquire(&before).await;
        let first_after = acquire(&after).await;
        // The release of one fails before its holder takes it back.
        proxy.set(Mode::Cut);
        assert!(store.release(&first_before).await.is_err(), "the release went through a cut connection");
        proxy.set(Mode::Pass);
        let again_before = acquire(&before).await;
        // The other is taken back first, and its old release fails afterwards.
        let again_after = acquire(&after).await;
        proxy.set(Mode::Cut);
        assert!(store.release(&first_after).await.is_err(), "the release went through a cut connection");
        proxy.set(Mode::Pass);
        // A call that starts a sweep of whatever is listed; wait for it to be done.
        let other = AcquireRequest::new(ElectionName::new("other").unwrap(), p.clone(), ttl);
        acquire(&other).await;
        let t0 = std::time::Instant::now();
        while !store.inner.abandoned.lock().unwrap().is_empty() {
            assert!(t0.elapsed() < Duration::from_secs(10), "the failed releases were not swept");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        for again in [again_before, again_after] {
            let now = store.get(&again.election).await.unwrap().map(|r| (r.holder, r.token));
            assert_eq!(
                now,
                Some((p.clone(), again.token)),
                "{}: the term taken back must outlive the sweep",
                again.election
            );
        }
    }

    /// A renewal can be applied by the cluster long after it was sent, when its caller
    /// has given up on it (the runtime's request timeout). Meanwhile the store may have
    /// granted a new etcd lease (after a keep-alive nothing vouched for), moved the key
    /// onto it with a later renewal, and stopped keeping the old lease alive. The late
    /// renewal must not put the key back on the old lease: that lease ends before the
    /// term the holder dates from its later renewal, and another candidate could take the
    /// election while the holder still leads.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_renewal_applied_late_does_not_put_the_key_back_on_a_retired_lease() {
        use tenure::HolderId;
        use tenure_testkit::servers::{self, Kind};
        let Some(server) = servers::launch(Kind::Etcd) else { return };
        let store = EtcdStore::connect(&format!("etcd://127.0.0.1:{}", server.port())).await.unwrap();
        let ttl = Duration::from_secs(3);
        let mut held = Vec::new();
        for name in ["late/single", "late/batch"] {
            let req = AcquireRequest::new(ElectionName::new(name).unwrap(), HolderId::new("p").unwrap(), ttl);
            let Acquire::Acquired(h) = store.try_acquire(&req).await.unwrap() else { panic!("held by another") };
            held.push(h);
        }
        // Renewals sent on the process's lease, refreshed now; the cluster applies them
        // below, after everything that follows.
        let old = store.lease(ttl, Instant::now(), false).await.unwrap();
        let late_single = store.renew_txn(&held[0], ttl, old.id, old.id);
        let late_batch = pb::TxnRequest {
            compare: Vec::new(),
            success: vec![txn::nested(store.renew_txn(&held[1], ttl, old.id, old.id))],
            failure: Vec::new(),
        };
        // The old lease now ends well before a TTL from the renewals below.
        tokio::time::sleep(Duration::from_millis(1500)).await;
        // A keep-alive found wanting makes the store grant a new lease; the old one is no
        // longer kept alive.
        let new = store.lease(ttl, Instant::now(), true).await.unwrap();
        assert_ne!(new.id, old.id, "no new lease was granted");
        let since = Instant::now();
        let mut renewed = Vec::new();
        match store.renew(&held[0], ttl).await {
            Ok(Renew::Renewed(r)) => renewed.push(r),
            other => panic!("the renewal should move the key onto the new lease: {other:?}"),
        }
        match store.renew_many(&held[1..], ttl).await.remove(0) {
            Ok(Renew::Renewed(r)) => renewed.push(r),
            other => panic!("the batch should move the key onto the new lease: {other:?}"),
        }
        store.txn("renew", late_single).await.unwrap();
        store.txn("renew", late_batch).await.unwrap();
        // The holder counts on each key for a TTL from `since`, less its margin; the old
        // lease, which nothing keeps alive, ends about 1.5 s before that.
        while since.elapsed() < ttl - Duration::from_millis(400) {
            for rec in &renewed {
                let now = store.get(&rec.election).await.unwrap().map(|r| r.token);
                assert_eq!(
                    now,
                    Some(rec.token),
                    "{}: the key renewed {:?} ago (TTL {ttl:?}) is gone: a renewal applied late \
                     put it back on a lease nothing keeps alive",
                    rec.election,
                    since.elapsed()
                );
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        // A renewal's later round compares the lease its first round found the key on; a
        // transaction sent earlier has moved the key onto the current lease meanwhile.
        // Still this holder's term, to renew once more: not lost.
        assert_eq!(store.lease(ttl, Instant::now(), false).await.unwrap().id, new.id, "the new lease ran out");
        let resp = store.txn("renew", store.renew_txn(&renewed[0], ttl, old.id, new.id)).await.unwrap();
        let step = store.renew_step(&renewed[0], &resp, true).unwrap();
        assert!(
            matches!(step, Step::Move { from } if from == new.id),
            "a key moved meanwhile was taken for lost: {step:?}"
        );
    }

    /// A member's own ID and the leader it knows of (0: none), or `None` if it does not
    /// answer within half a second.
    async fn member_status(store: &EtcdStore) -> Option<(u64, u64)> {
        let c = store.client().await.ok()?;
        let st = tokio::time::timeout(Duration::from_millis(500), c.status()).await.ok()?.ok()?;
        Some((st.header?.member_id, st.leader))
    }

    /// Waits (up to 10 s) until `ok` holds for what `store`'s member says of itself.
    async fn wait_status(store: &EtcdStore, what: &str, ok: impl Fn((u64, u64)) -> bool) -> (u64, u64) {
        let t0 = std::time::Instant::now();
        loop {
            if let Some(st) = member_status(store).await
                && ok(st)
            {
                return st;
            }
            assert!(t0.elapsed() < Duration::from_secs(10), "{what}: not within 10 s");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// etcd renews a lease in the memory of the member that believes it leads. A leader
    /// that was paused while the others elected another answers keep-alives from its
    /// stale copy when it wakes, until it hears of the new term, and the real leader lets
    /// the lease run out on its own schedule (from when it was elected). A renewal that
    /// counted such a keep-alive would tell its holder the key lives a TTL from the
    /// renewal's start while etcd deletes it seconds sooner: another candidate could take
    /// it while the holder still leads.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_keep_alive_answered_by_a_deposed_leader_does_not_make_a_renewal_count() {
        use tenure::HolderId;
        use tenure_testkit::servers::EtcdCluster;
        let Some(cluster) = EtcdCluster::launch(3) else { return };
        let url = |i: usize| format!("etcd://127.0.0.1:{}", cluster.members[i].port());
        let mut members = Vec::new();
        for i in 0..3 {
            members.push(EtcdStore::connect(&url(i)).await.unwrap());
        }
        let mut leader = None;
        let t0 = std::time::Instant::now();
        while leader.is_none() {
            for (i, m) in members.iter().enumerate() {
                if let Some((id, lead)) = member_status(m).await
                    && id == lead
                {
                    leader = Some(i);
                }
            }
            assert!(t0.elapsed() < Duration::from_secs(10), "no member says it leads");
        }
        let a = leader.unwrap();
        let others: Vec<usize> = (0..3).filter(|&i| i != a).collect();
        let (a_id, _) = member_status(&members[a]).await.unwrap();
        // The holder reaches the leader only; the observer reads through another member.
        let holder = EtcdStore::connect(&url(a)).await.unwrap();
        let observer = &members[others[0]];
        let ttl = Duration::from_secs(10);
        let req = |name: &str| AcquireRequest::new(ElectionName::new(name).unwrap(), HolderId::new("p").unwrap(), ttl);
        let mut held = Vec::new();
        for name in ["deposed/renew", "deposed/batch"] {
            let Acquire::Acquired(h) = holder.try_acquire(&req(name)).await.unwrap() else { panic!("held by another") };
            held.push(h);
        }

        // The leader freezes and is cut off from the others (so that no message of theirs
        // waits for it to read when it wakes); they elect one of them. Three more seconds
        // pass, so the lease's end on the new leader's schedule falls well before a TTL
        // from the renewal below.
        cluster.members[a].pause();
        let Some(cut) = cluster.cut_off(a) else { return };
        let (_, new_leader) = wait_status(observer, "a new leader", |(_, lead)| lead != 0 && lead != a_id).await;
        tokio::time::sleep(Duration::from_secs(3)).await;

        // The old leader wakes while the others are frozen, so it still believes it leads,
        // and answers a keep-alive from its copy of the lease (which has seconds left).
        for &i in &others {
            cluster.members[i].pause();
        }
        cluster.members[a].resume();
        let since = Instant::now();
        let mut refreshed = None;
        for _ in 0..3 {
            // A connection that the pause broke fails once and is made again.
            match tokio::time::timeout(Duration::from_millis(500), holder.lease(ttl, since, false)).await {
                Ok(Ok(lease)) => {
                    refreshed = Some(lease);
                    break;
                }
                other => eprintln!("keep-alive through the old leader, {:?} in: {other:?}", since.elapsed()),
            }
        }
        drop(cut);
        for &i in &others {
            cluster.members[i].resume();
        }
        let lease = refreshed.expect("the old leader answered no keep-alive");
        assert!(matches!(lease.proof, Proof::KeptAlive { .. }), "{lease:?}");

        // Once the old leader follows the new one, the calls that the keep-alive was sent
        // for (begun before it) write through it: an acquire, a batch of renewals and a
        // renewal. Each finds the shared lease as the keep-alive left it, as calls that
        // began together would.
        wait_status(&members[a], "the old leader learning of the new", |(_, lead)| lead == new_leader).await;
        let slot = holder.inner.leases.lock().unwrap().values().next().unwrap().clone();
        let left = {
            let s = slot.lock().await;
            (s.id, s.refreshed)
        };
        let as_left = async || {
            let mut s = slot.lock().await;
            (s.id, s.refreshed) = left;
        };
        as_left().await;
        let acquired = holder.acquire_from(&req("deposed/acquire"), since).await;
        as_left().await;
        let batch = holder.renew_many_from(&held[1..], ttl, since).await;
        as_left().await;
        let renewed = holder.renew_from(&held[0], ttl, since).await;
        let won = |a: Acquire| if let Acquire::Acquired(r) = a { Some(r) } else { None };
        let kept = |r: Renew| if let Renew::Renewed(r) = r { Some(r) } else { None };
        let mut counted = Vec::new();
        for (what, answer) in [
            ("acquire", acquired.map(won)),
            ("batch", batch.into_iter().next().unwrap().map(kept)),
            ("renewal", renewed.map(kept)),
        ] {
            match answer {
                Ok(Some(rec)) => counted.push((what, rec)),
                other => panic!("with every member back, the {what} should go through: {other:?}"),
            }
        }
        // The holder counts on each key for a TTL from `since`, less its own margin; each
        // must be there all that time, past when the new leader's schedule ends the lease
        // (about 8 s after `since`).
        assert!(since.elapsed() < Duration::from_secs(6), "too slow to check: {:?}", since.elapsed());
        while since.elapsed() < ttl - Duration::from_secs(1) {
            for (what, rec) in &counted {
                let now = observer.get(&rec.election).await.unwrap().map(|r| r.token);
                assert_eq!(
                    now,
                    Some(rec.token),
                    "the key of an {what} begun {:?} ago (TTL {ttl:?}) is gone",
                    since.elapsed()
                );
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        // They did so on a lease granted after the keep-alive was found wanting.
        let now = slot.lock().await.refreshed;
        assert!(matches!(now, Some((_, Proof::Granted))), "the keep-alive was not found wanting: {now:?}");
    }

    /// The runtime stops waiting for a call after its request timeout, which drops the
    /// call between sending a keep-alive and reading its answer; the answer comes later
    /// and waits on the stream. The next keep-alive must not take that answer for its
    /// own: it says the lease was refreshed when the earlier one arrived, not after the
    /// next call began, and the next one may never reach the server.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_keep_alive_whose_caller_gave_up_does_not_answer_the_next_one() {
        use tenure::HolderId;
        use tenure_testkit::proxy::{Mode, Proxy};
        use tenure_testkit::servers::{self, Kind};
        let Some(server) = servers::launch(Kind::Etcd) else { return };
        let proxy = Proxy::start(("127.0.0.1", server.port())).unwrap();
        let store = EtcdStore::connect(&format!("etcd://127.0.0.1:{}", proxy.port())).await.unwrap();
        let ttl = Duration::from_secs(3);
        let req =
            AcquireRequest::new(ElectionName::new("abandoned/keepalive").unwrap(), HolderId::new("p").unwrap(), ttl);
        let Acquire::Acquired(held) = store.try_acquire(&req).await.unwrap() else { panic!("held by another") };
        // A renewal opens the keep-alive stream.
        assert!(matches!(store.renew(&held, ttl).await, Ok(Renew::Renewed(_))));
        // The server stops answering, and a renewal's caller gives up on it.
        proxy.set(Mode::BlackHole);
        assert!(tokio::time::timeout(Duration::from_millis(200), store.renew(&held, ttl)).await.is_err());
        // The keep-alive goes through late and its answer comes back to nobody.
        proxy.set(Mode::Pass);
        tokio::time::sleep(Duration::from_millis(500)).await;
        // Unreachable again: nothing sent from now on refreshes the lease.
        proxy.set(Mode::BlackHole);
        let since = Instant::now();
        let refreshed = tokio::time::timeout(Duration::from_secs(1), store.lease(ttl, since, false)).await;
        assert!(
            !matches!(refreshed, Ok(Ok(_))),
            "a refresh was reported while the server could not be reached: {refreshed:?}"
        );
    }
}

#[cfg(test)]
mod fuzz {
    //! Fuzz target for the store's URL parser: arbitrary input never panics, and a
    //! refusal never prints the password.
    use proptest::prelude::*;

    proptest! {
        #[test]
        fn urls_never_panic_and_refusals_hide_the_password(
            scheme in prop_oneof![Just("etcd://"), Just("etcds://"), Just("etcd:/"), Just("")],
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
    }
}
