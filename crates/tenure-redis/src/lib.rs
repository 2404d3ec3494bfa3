//! Redis lease store for tenure.
//!
//! Each election is a hash `PREFIX:lease:ELECTION` whose expiry (`PEXPIRE`) is the lease:
//! the **server** judges it. Every decision is one Lua script, so it is atomic. A second
//! hash, `PREFIX:meta:ELECTION`, without expiry, keeps the last token and revision.
//! Every write publishes the record as it now stands (or that no lease is live) on
//! `PREFIX:changes`, so followers wait on pub/sub and need not read the lease back.
//!
//! **Tokens survive a restart that loses data.** Each grant's token is the larger of the
//! last token plus one and the server's clock in microseconds (`TIME`). A lost or stale
//! counter therefore cannot make a token repeat: the clock has moved on since any grant
//! that was lost, as long as the server's clock does not step backwards. Tokens are large
//! numbers (about 1.7·10¹⁵) for that reason.
//!
//! **The restart guard.** A restart without persistence forgets every lease (one with
//! snapshot persistence may restore older ones), and a replica promoted in a failover may
//! lack the old primary's newest writes (replication is asynchronous), grants included,
//! while the leaders they named may still be acting until their deadlines. So after the
//! server started, or took over as primary, no acquire is granted, and no record written
//! before is renewed, for the longest TTL in use. The hash `PREFIX:epoch` keeps the
//! identity of the data's writer (the server's `run_id`, which a restart changes, and its
//! `master_replid`, which a promotion changes), since when it holds, and the longest TTL
//! requested; each record carries the identity it was written under. A server that never
//! took over counts the guard from its start; one that did, from the first request that
//! sees the change (it cannot date the takeover). The longest TTL is the largest of what
//! this client asked for or saw, what the server kept (lost by a restart without
//! persistence), and `?restart_guard=DURATION`, for candidates with different TTLs. With
//! persistence that keeps every write (AOF with `appendfsync always`) and no replicas, the
//! guard can be switched off with `?restart_guard=off`.
//!
//! ```no_run
//! # async fn t() -> Result<(), Box<dyn std::error::Error>> {
//! let store = tenure_redis::RedisStore::connect("redis://:secret@127.0.0.1:6379/0").await?;
//! # Ok(()) }
//! ```

use std::sync::Arc;
use std::time::{Duration, UNIX_EPOCH};

use redis::aio::ConnectionManager;
use redis::{Script, Value};
use tenure::store::{
    Acquire, AcquireRequest, LedgerEntry, LedgerWrite, Renew, Revision, WatchStream, check_ledger_value, check_ttl,
};
use tenure::{ElectionName, ErrorKind, Evict, FencingToken, HolderId, LeaseRecord, LeaseStore, StoreError, WorkKey};

mod target;
use target::Target;

/// How many scripts one pipeline carries. The client gives each request 500 ms: a
/// pipeline of thousands of scripts, queued behind others on the one connection, ran
/// past it and failed whole (the renewals of 10,000 elections through `Batched`).
const PIPELINE_CHUNK: usize = 500;

/// How long a grant or renewal waits for replicas to acknowledge it (`WAIT`), in ms.
const WAIT_MS: u64 = 250;

/// The default key prefix.
pub const DEFAULT_PREFIX: &str = "tenure";

/// Shared Lua: the next counter value (seeded from the server clock when missing), and
/// the record as a flat reply.
const LIB: &str = r#"
local lease, meta, epoch_key = KEYS[1], KEYS[2], KEYS[3]
local function next_value(field)
  -- max(last + 1, server clock in microseconds): grows even if `meta` was lost or
  -- restored from an older snapshot, since the clock has moved on since any lost grant.
  local t = redis.call('TIME')
  local us = tonumber(t[1]) * 1000000 + tonumber(t[2])
  local v = math.max(tonumber(redis.call('HGET', meta, field) or '0') + 1, us)
  local s = string.format('%.0f', v)
  redis.call('HSET', meta, field, s)
  return s
end
local function now_ms()
  local t = redis.call('TIME')
  return t[1] .. string.format('%03d', math.floor(tonumber(t[2]) / 1000))
end
local function guard_wait(guard_ms)
  -- For the longest TTL in use after the server started or took over as primary, grant
  -- nothing, nor renew a record from before: leases it forgot, lost in a failover, or
  -- restored from an older snapshot may still be believed. Returns how long the guard
  -- still lasts (ms) and the identity of the data's writer: a restart changes the run
  -- id, a takeover (failover) the replication id. guard_ms is the longest TTL the client
  -- knows of; the longest requested on the server is kept with the identity (and
  -- replicated, so a promoted replica knows it too). guard_ms '0': the guard is off.
  if guard_ms == '0' then return 0, '' end
  local srv = redis.call('INFO', 'server')
  local rep = redis.call('INFO', 'replication')
  local id = (string.match(srv, 'run_id:(%x+)') or '') .. '/' .. (string.match(rep, 'master_replid:(%x+)') or '')
  local up = tonumber(string.match(srv, 'uptime_in_seconds:(%d+)')) or 0
  local now = tonumber(now_ms())
  local e = redis.call('HMGET', epoch_key, 'id', 'since', 'longest', 'seen')
  local known = tonumber(e[3] or '0')
  local longest = math.max(known, tonumber(guard_ms))
  local since = tonumber(e[2] or '0')
  local seen = tonumber(e[4] or '0')
  local function run_of(x) return string.match(x, '^(%x+)/') end
  local same_run = e[1] and run_of(e[1]) and run_of(e[1]) == run_of(id)
  if e[1] ~= id and same_run and now - seen <= longest and string.match(rep, 'master_replid2:0+[\r\n]') then
    -- The same server process (same run id), serving tenure all along (a call within the
    -- longest TTL), whose new replication id was not taken over from another primary (no
    -- second id): a primary that made itself a new one when its first replica attached,
    -- or when it freed its backlog after its last replica left. The same writer: the
    -- guard goes on as it was. (A primary cut off for longer than that may have been
    -- replaced meanwhile, and is guarded.)
    redis.call('HSET', epoch_key, 'id', id)
  elseif e[1] ~= id then
    -- No guard state at all, on a server that never took over from another primary: a
    -- first use, or a restart that lost everything; the server holds only what it
    -- granted since it started, and the guard counts from its start: the latest its
    -- uptime allows (whole seconds, the difference of two whole-second clock readings,
    -- so up to one second short). Any other change of writer (a restart that restored
    -- data, a promotion, a replica restarted as a primary) cannot be dated: the other
    -- writer may have granted until a moment ago, so the guard counts from now.
    if not e[1] and string.match(rep, 'master_replid2:0+[\r\n]') then
      since = math.min(now, now - up * 1000 + 1000)
    else
      since = now
    end
    redis.call('HSET', epoch_key, 'id', id, 'since', string.format('%.0f', since))
  end
  if longest > known then redis.call('HSET', epoch_key, 'longest', string.format('%.0f', longest)) end
  -- When the server last served tenure, to a quarter of the longest TTL.
  if now - seen > longest / 4 then redis.call('HSET', epoch_key, 'seen', string.format('%.0f', now)) end
  return math.max(since + longest - now, 0), id
end
local function reply(status)
  local f = redis.call('HMGET', lease, 'holder', 'token', 'revision', 'ttl_ms', 'acquired_ms', 'renewed_ms', 'evicted', 'metadata')
  return {status, f[1], f[2], f[3], f[4], f[5], f[6], f[7], f[8], redis.call('PTTL', lease)}
end
local function publish(channel, election, r)
  -- r, a reply() read after the write, as text tenure::store::Change::parse reads, so that
  -- followers need not read the lease back: ELECTION<TAB> when no lease is live.
  local msg = election .. '\t'
  if r[2] then
    local hex = (string.gsub(r[9] or '', '.', function(c) return string.format('%02x', string.byte(c)) end))
    msg = table.concat({election, r[2], r[3], r[4], r[5], string.format('%.0f', math.max(r[10], 0) * 1000),
      r[8] or '0', r[6] or '', r[7] or '', hex}, '\t')
  end
  redis.call('PUBLISH', channel, msg)
  return r
end
"#;

/// ARGV: holder, ttl_ms, metadata, channel, election, guard_ms ('0': off).
const ACQUIRE: &str = r#"
local holder, ttl = ARGV[1], ARGV[2]
local cur = redis.call('HMGET', lease, 'holder', 'evicted')
if cur[1] and (cur[1] ~= holder or cur[2] == '1') then return reply('held') end
local wait, id = guard_wait(ARGV[6])
if wait > 0 then return {'guard', wait} end
local now = now_ms()
if cur[1] then
  redis.call('HSET', lease, 'revision', next_value('revision'), 'ttl_ms', ttl, 'renewed_ms', now, 'metadata', ARGV[3])
else
  redis.call('DEL', lease)
  redis.call('HSET', lease, 'holder', holder, 'token', next_value('token'), 'revision', next_value('revision'),
    'ttl_ms', ttl, 'acquired_ms', now, 'renewed_ms', now, 'evicted', '0', 'metadata', ARGV[3])
end
redis.call('PEXPIRE', lease, ttl)
if ARGV[6] ~= '0' then redis.call('HSET', lease, 'run', id) end
return publish(ARGV[4], ARGV[5], reply('ok'))
"#;

/// ARGV: holder, token, ttl_ms, channel, election, guard_ms ('0': off).
const RENEW: &str = r#"
local cur = redis.call('HMGET', lease, 'holder', 'token', 'evicted', 'run')
if cur[1] ~= ARGV[1] or cur[2] ~= ARGV[2] or cur[3] == '1' then return reply('lost') end
if ARGV[6] ~= '0' then
  -- A record written before the last restart or takeover (perhaps restored from a
  -- snapshot older than grants made since) is renewed only once the guard is over.
  local wait, id = guard_wait(ARGV[6])
  if cur[4] ~= id then
    if wait > 0 then return {'guard', wait} end
    redis.call('HSET', lease, 'run', id)
  end
end
redis.call('HSET', lease, 'revision', next_value('revision'), 'ttl_ms', ARGV[3], 'renewed_ms', now_ms())
redis.call('PEXPIRE', lease, ARGV[3])
return publish(ARGV[4], ARGV[5], reply('ok'))
"#;

/// ARGV: holder, token, revision, channel, election.
const RELEASE: &str = r#"
local cur = redis.call('HMGET', lease, 'holder', 'token', 'revision')
if cur[1] == ARGV[1] and cur[2] == ARGV[2] and cur[3] == ARGV[3] then
  redis.call('DEL', lease)
  next_value('revision')
  return publish(ARGV[4], ARGV[5], reply('ok'))
end
return reply('ok')
"#;

/// ARGV: how ('now' or 'term'), channel, election.
const EVICT: &str = r#"
if redis.call('EXISTS', lease) == 0 then return reply('none') end
local before = reply('ok')
if ARGV[1] == 'now' then
  redis.call('DEL', lease)
  next_value('revision')
else
  redis.call('HSET', lease, 'evicted', '1', 'revision', next_value('revision'))
end
publish(ARGV[2], ARGV[3], reply('ok'))
return before
"#;

const GET: &str = "return reply('ok')";

/// A lease store on a Redis server.
#[derive(Clone)]
pub struct RedisStore {
    inner: Arc<Inner>,
}

struct Inner {
    /// One server, or the primary the sentinels name.
    target: Target,
    /// How many replicas must acknowledge each grant and renewal (`WAIT`) before it counts.
    min_replicas: u64,
    prefix: String,
    described: String,
    scripts: Scripts,
    /// The restart guard (see the crate docs): `None` when off, else its least length
    /// in ms beyond the TTLs known (`restart_guard=DURATION`).
    guard: Option<u64>,
    /// The longest TTL this handle has asked for or seen in a record, in ms: the guard
    /// lasts that long, since a restart may have forgotten a lease of that TTL.
    longest_ttl_ms: std::sync::atomic::AtomicU64,
    changes: tenure::store::ChangeHub,
}

struct Scripts {
    acquire: Script,
    renew: Script,
    release: Script,
    evict: Script,
    get: Script,
    ledger_write: Script,
}

/// A work-ledger write (store duty 8). KEYS: the entry, the hash of the ledger's counter.
/// ARGV: value, the expected version ('' for none), how long to keep the entry (ms).
/// Versions grow as the lease counters do (at least the server clock in microseconds),
/// so that none comes back even if the counter was lost with a restart.
const LEDGER_WRITE: &str = r#"
local entry, counter = KEYS[1], KEYS[2]
local cur = redis.call('HGET', entry, 'version') or ''
if cur ~= ARGV[2] then return false end
local t = redis.call('TIME')
local us = tonumber(t[1]) * 1000000 + tonumber(t[2])
local v = string.format('%.0f', math.max(tonumber(redis.call('HGET', counter, 'work') or '0') + 1, us))
redis.call('HSET', counter, 'work', v)
redis.call('HSET', entry, 'value', ARGV[1], 'version', v)
redis.call('PEXPIRE', entry, ARGV[3])
return v
"#;

impl Scripts {
    fn new() -> Self {
        let mut lib = LIB.to_string();
        if mutant("failover-invisible") {
            // Planted: the guard counts from the server's start whatever changed, blind to
            // a takeover (a promoted replica has run for a while), as it did before.
            lib = lib.replace("if not e[1] and string.match(rep, 'master_replid2:0+[\\r\\n]') then", "if true then");
        }
        if mutant("guard-on-new-replid") {
            // Planted: any new replication id starts the guard, as it did before, though a
            // primary makes one itself when its first replica attaches.
            lib = lib.replace("if e[1] ~= id and same_run", "if false and same_run");
        }
        let s = |body: &str| Script::new(&format!("{lib}{body}"));
        Self {
            acquire: s(ACQUIRE),
            renew: s(RENEW),
            release: s(RELEASE),
            evict: s(EVICT),
            get: s(GET),
            ledger_write: Script::new(LEDGER_WRITE),
        }
    }
}

/// Our own URL parameters, split off before the client sees the URL.
struct Params {
    url: String,
    prefix: String,
    /// `None`: the guard is off; otherwise its least length in ms (0: the TTLs known).
    guard: Option<u64>,
    /// How many replicas must acknowledge a grant or renewal (`min_replicas=N`); `None`:
    /// the default for the URL's kind.
    min_replicas: Option<u64>,
    /// `ca=`, `cert=`, `key=`: files for TLS (`rediss://`).
    tls: target::TlsFiles,
}

/// The parameters a `redis://` or `rediss://` URL may carry: ours, then the client's.
const KNOWN_PARAMS: &str = "prefix, restart_guard, min_replicas, ca, cert, key, protocol";

/// A duration written as whole `ms`, `s` or `m`, in milliseconds.
fn parse_ms(v: &str) -> Option<u64> {
    let (n, unit) = v.find(|c: char| !c.is_ascii_digit()).map(|i| v.split_at(i))?;
    let n: u64 = n.parse().ok()?;
    n.checked_mul(match unit {
        "ms" => 1,
        "s" => 1000,
        "m" => 60_000,
        _ => return None,
    })
}

/// Splits our own parameters (`prefix`, `restart_guard`, `min_replicas`, `ca`, `cert`,
/// `key`) off the URL and checks them; on one server, any other but the client's
/// `protocol` is refused rather than ignored.
fn split_params(url: &str) -> Result<Params, StoreError> {
    let (url, ours) =
        tenure::store::url::take_params(url, &["prefix", "restart_guard", "min_replicas", "ca", "cert", "key"])
            .map_err(|why| StoreError::invalid(format!("Redis URL: {why}")))?;
    let tls = target::TlsFiles { ca: ours[3].clone(), cert: ours[4].clone(), key: ours[5].clone() };
    if !target::is_sentinel_url(&url) {
        let query = url.split_once('?').map(|(_, q)| q).unwrap_or_default();
        if let Some(k) = query
            .split('&')
            .filter(|p| !p.is_empty())
            .map(|p| p.split_once('=').map_or(p, |(k, _)| k))
            .find(|k| *k != "protocol")
        {
            return Err(StoreError::invalid(format!(
                "unknown parameter {k:?} in the Redis URL (known: {KNOWN_PARAMS})"
            )));
        }
    } else if tls.any() && !url.starts_with("rediss+sentinel://") {
        return Err(StoreError::invalid(
            "ca=, cert= and key= are TLS settings: write rediss+sentinel:// to reach the sentinels and the primary over TLS",
        ));
    }
    if url.contains("#insecure") {
        return Err(StoreError::invalid(
            "rediss://…#insecure (TLS that does not verify the server) is refused: give the server's CA with ca=PATH",
        ));
    }
    if tls.any() && !url.starts_with("rediss://") && !url.starts_with("rediss+sentinel://") {
        return Err(StoreError::invalid("ca=, cert= and key= are TLS settings: write rediss:// to use TLS"));
    }
    if tls.cert.is_some() != tls.key.is_some() {
        return Err(StoreError::invalid("cert= and key= go together: a client certificate needs its key"));
    }
    let min_replicas =
        match ours[2].as_deref() {
            None => None,
            Some(v) => Some(v.parse::<u64>().ok().filter(|n| *n <= 100).ok_or_else(|| {
                StoreError::invalid(format!("min_replicas={v:?}: write a number of replicas, 0 to 100"))
            })?),
        };
    let prefix = ours[0].clone().unwrap_or_else(|| DEFAULT_PREFIX.to_string());
    let guard = match ours[1].as_deref() {
        None | Some("on") => Some(0),
        Some("off") => None,
        Some(v) => match parse_ms(v) {
            Some(ms) if ms > 0 => Some(ms),
            _ => {
                return Err(StoreError::invalid(format!(
                    "restart_guard={v:?}: write restart_guard=on, restart_guard=off, or the longest TTL any \
                     candidate uses (restart_guard=30s, 1500ms, 2m)"
                )));
            }
        },
    };
    if prefix.is_empty() || !prefix.chars().all(|c| c.is_ascii_alphanumeric() || "._-:/".contains(c)) {
        return Err(StoreError::invalid(format!(
            "key prefix {prefix:?} is not allowed: use letters, digits and . _ - : /"
        )));
    }
    Ok(Params { url, prefix, guard, min_replicas, tls })
}

impl RedisStore {
    /// A store on the server `url` names (`redis://[:PASSWORD@]HOST[:PORT][/DB]`,
    /// `rediss://` for TLS), or on the primary Redis Sentinel names
    /// (`redis+sentinel://[:PASSWORD@]HOST:PORT[,HOST:PORT…]/MASTER_NAME[?db=N&sentinel_password=PW]`,
    /// `rediss+sentinel://` for TLS to the sentinels and the primary), plus our optional
    /// `prefix=NAME`, `restart_guard=on|off|DURATION`, `min_replicas=N` and, with TLS,
    /// `ca=`, `cert=` and `key=` (PEM files). The connection
    /// is made on first use and remade after failures (behind Sentinel, to the primary of
    /// the moment), so a server that is down now is not an error yet.
    pub async fn connect(url: &str) -> Result<Self, StoreError> {
        let Params { url, prefix, guard, min_replicas, tls } = split_params(url)?;
        let (target, described) = Target::new(&url, &tls)?;
        // Behind Sentinel a grant must reach a replica by default: a primary cut off from
        // its replicas (demoted, or restarted empty before the sentinels demote it) cannot
        // then grant or renew next to the one they promoted.
        let sentinel = matches!(target, Target::Sentinel(_)) && !mutant("sentinel-unacknowledged");
        let min_replicas = min_replicas.unwrap_or(if sentinel { 1 } else { 0 });
        let described = format!("{described} (prefix {prefix})");
        Ok(Self {
            inner: Arc::new(Inner {
                target,
                min_replicas,
                prefix,
                described,
                scripts: Scripts::new(),
                guard,
                longest_ttl_ms: std::sync::atomic::AtomicU64::new(0),
                changes: tenure::store::ChangeHub::new(),
            }),
        })
    }

    fn keys(&self, election: &str) -> (String, String) {
        let p = &self.inner.prefix;
        (format!("{p}:lease:{election}"), format!("{p}:meta:{election}"))
    }

    /// The key of a work-ledger entry, and the hash its versions are counted in.
    fn ledger_keys(&self, election: &ElectionName, key: &WorkKey) -> (String, String) {
        let p = &self.inner.prefix;
        (format!("{p}:work:{election}:{key}"), format!("{p}:work-counter"))
    }

    /// The hash that names the server run and primary history the data was written
    /// under, since when, and the longest TTL requested (the guard's state).
    fn epoch_key(&self) -> String {
        format!("{}:epoch", self.inner.prefix)
    }

    fn channel(&self) -> String {
        format!("{}:changes", self.inner.prefix)
    }

    async fn conn(&self) -> Result<(u64, ConnectionManager), StoreError> {
        self.inner.target.conn().await
    }

    /// Maps the error of a request that failed on connection number `on`, and makes a
    /// connection again next time if that one cannot reach a primary (see
    /// [`target::Target::failed`]).
    fn failed(&self, on: u64, what: &str, e: redis::RedisError) -> StoreError {
        self.inner.target.failed(Some(on), &e);
        redis_error(what, e)
    }

    /// An invocation of `script` on `election`'s keys (lease, meta, epoch), to add the
    /// arguments to.
    fn invocation<'a>(&self, script: &'a Script, election: &str) -> redis::ScriptInvocation<'a> {
        let (lease, meta) = self.keys(election);
        let mut inv = script.key(lease);
        inv.key(meta).key(self.epoch_key());
        inv
    }

    async fn run(&self, what: &str, script: &Script, election: &str, args: &[&[u8]]) -> Result<Reply, StoreError> {
        let (on, mut conn) = self.conn().await?;
        let mut inv = self.invocation(script, election);
        for a in args {
            inv.arg(*a);
        }
        let waits = self.inner.min_replicas > 0 && (what == "acquire" || what == "renew");
        let (v, acks) = if !waits {
            (inv.invoke_async(&mut conn).await.map_err(|e| self.failed(on, what, e))?, None)
        } else {
            // The script and its `WAIT` in one pipeline, so on one connection: `WAIT`
            // counts the replicas that acknowledged its own connection's writes, and sent
            // apart, it could go out on a connection made again in between, which wrote
            // nothing, and pass at once for a write no replica has.
            let mut pipe = redis::pipe();
            pipe.invoke_script(&inv);
            pipe.cmd("WAIT").arg(self.inner.min_replicas).arg(WAIT_MS);
            let mut values = if mutant("redis-wait-apart") {
                let v: Value = inv.invoke_async(&mut conn).await.map_err(|e| self.failed(on, what, e))?;
                let acks: redis::RedisResult<Value> =
                    redis::cmd("WAIT").arg(self.inner.min_replicas).arg(WAIT_MS).query_async(&mut conn).await;
                vec![v, acks.map_err(|e| self.failed(on, what, e))?]
            } else {
                self.query_pipeline(what, (on, &mut conn), &pipe, script).await?
            };
            let acks = acks_of(values.pop());
            let v =
                values.pop().ok_or_else(|| StoreError::ambiguous(format!("Redis answered the {what} with nothing")))?;
            (v, Some(acks))
        };
        let reply = Reply::parse(election, v)?;
        self.saw_ttl(reply.record.as_ref());
        if let Some(acks) = acks
            && reply.status == "ok"
        {
            self.check_acks(what, acks)?;
        }
        Ok(reply)
    }

    /// A grant or renewal that fewer replicas than `min_replicas` acknowledged may not
    /// survive a failover, and may have been made by a primary that has been replaced:
    /// it does not count.
    fn check_acks(&self, what: &str, acks: u64) -> Result<(), StoreError> {
        let need = self.inner.min_replicas;
        if acks >= need {
            return Ok(());
        }
        Err(StoreError::ambiguous(format!(
            "Redis: the {what} reached {acks} of the {need} replicas it must reach (min_replicas) within \
             {WAIT_MS} ms; a failover could lose it, or this server is no longer the primary: retrying"
        )))
    }

    /// The scripts' guard argument: how long the guard lasts after a restart, in ms
    /// (the longest TTL this handle knows of), or "0" when it is off.
    fn guard_arg(&self, ttl: Duration) -> String {
        let Some(least) = self.inner.guard else {
            return "0".into();
        };
        let ms = ttl.as_millis().min(u64::MAX as u128) as u64;
        let longest = self.inner.longest_ttl_ms.fetch_max(ms, std::sync::atomic::Ordering::Relaxed).max(ms);
        longest.max(least).to_string()
    }

    /// Remembers the TTL of a record this handle saw, for the guard.
    fn saw_ttl(&self, rec: Option<&LeaseRecord>) {
        if let Some(r) = rec {
            let ms = r.ttl.as_millis().min(u64::MAX as u128) as u64;
            self.inner.longest_ttl_ms.fetch_max(ms, std::sync::atomic::Ordering::Relaxed);
        }
    }

    /// Sends a pipeline of `script`'s invocations, loading the script once if the server
    /// forgot it (a restart, SCRIPT FLUSH).
    async fn query_pipeline(
        &self,
        what: &str,
        (on, conn): (u64, &mut ConnectionManager),
        pipe: &redis::Pipeline,
        script: &Script,
    ) -> Result<Vec<Value>, StoreError> {
        match pipe.query_async(conn).await {
            Ok(v) => Ok(v),
            Err(e) if e.kind() == redis::ErrorKind::Server(redis::ServerErrorKind::NoScript) => {
                script.prepare_invoke().load_async(conn).await.map_err(|e| self.failed(on, what, e))?;
                pipe.query_async(conn).await.map_err(|e| self.failed(on, what, e))
            }
            Err(e) => Err(self.failed(on, what, e)),
        }
    }

    /// The releases of `held` in one pipeline; each script is its own compare on holder,
    /// token and revision, and one that does not match changes nothing.
    async fn release_pipeline(&self, held: &[LeaseRecord]) -> Result<(), StoreError> {
        if held.is_empty() {
            return Ok(());
        }
        let (on, mut conn) = self.conn().await?;
        let chan = self.channel();
        let script = &self.inner.scripts.release;
        let mut pipe = redis::pipe();
        for l in held {
            let mut inv = self.invocation(script, l.election.as_str());
            inv.arg(l.holder.as_str())
                .arg(l.token.0.to_string())
                .arg(l.revision.0.to_string())
                .arg(&chan)
                .arg(l.election.as_str());
            pipe.invoke_script(&inv);
        }
        let values = self.query_pipeline("release", (on, &mut conn), &pipe, script).await?;
        if values.len() != held.len() {
            return Err(StoreError::ambiguous("Redis answered a release pipeline with the wrong number of replies"));
        }
        Ok(())
    }

    async fn renew_pipeline(
        &self,
        held: &[LeaseRecord],
        ttl: Duration,
    ) -> Result<Vec<Result<Renew, StoreError>>, StoreError> {
        check_ttl(ttl)?;
        if held.is_empty() {
            return Ok(Vec::new());
        }
        let (on, mut conn) = self.conn().await?;
        let guard = self.guard_arg(ttl);
        let (ttl, chan) = (ttl.as_millis().to_string(), self.channel());
        let script = &self.inner.scripts.renew;
        let mut invocations = Vec::with_capacity(held.len());
        for l in held {
            let mut inv = self.invocation(script, l.election.as_str());
            inv.arg(l.holder.as_str())
                .arg(l.token.0.to_string())
                .arg(&ttl)
                .arg(&chan)
                .arg(l.election.as_str())
                .arg(&guard);
            invocations.push(inv);
        }
        let mut pipe = redis::pipe();
        for inv in &invocations {
            pipe.invoke_script(inv);
        }
        if self.inner.min_replicas > 0 {
            pipe.cmd("WAIT").arg(self.inner.min_replicas).arg(WAIT_MS);
        }
        let mut values = self.query_pipeline("renew", (on, &mut conn), &pipe, script).await?;
        if self.inner.min_replicas > 0
            && let Err(e) = self.check_acks("renew", acks_of(values.pop()))
        {
            return Ok(held.iter().map(|_| Err(e.duplicate())).collect());
        }
        if values.len() != held.len() {
            return Err(StoreError::ambiguous("Redis answered a renewal pipeline with the wrong number of replies"));
        }
        Ok(held
            .iter()
            .zip(values)
            .map(|(l, v)| {
                let r = Reply::parse(l.election.as_str(), v)?;
                Ok(match (r.status.as_str(), r.record) {
                    ("ok", Some(rec)) => Renew::Renewed(rec),
                    (_, cur) => Renew::Lost(cur),
                })
            })
            .collect())
    }

    /// The change listener's feed: a subscription to the store's channel.
    async fn open_feed(inner: Arc<Inner>) -> Option<Box<dyn tenure::store::ChangeFeed>> {
        let channel = RedisStore { inner: inner.clone() }.channel();
        // Behind sentinels, the primary of the moment (a replica would do too: it passes
        // on what is published on its primary).
        let client = inner.target.client().await.ok()?;
        // Bounded: a new connection to a frozen server (accepted by the kernel, never
        // answered) would otherwise wait for good, and every watch with it.
        let subscribed = tokio::time::timeout(target::CONNECT_TIMEOUT, async {
            let mut pubsub = client.get_async_pubsub().await.inspect_err(|e| inner.target.failed(None, e)).ok()?;
            pubsub.subscribe(&channel).await.ok()?;
            Some(pubsub)
        });
        let (sink, stream) = subscribed.await.ok()??.split();
        Some(Box::new(Messages { stream: Box::pin(stream), sink }))
    }
}

/// The messages on the store's pub/sub channel, and the connection's sending half.
struct Messages {
    stream: std::pin::Pin<Box<dyn tokio_stream::Stream<Item = redis::Msg> + Send>>,
    sink: redis::aio::PubSubSink,
}

#[async_trait::async_trait]
impl tenure::store::ChangeFeed for Messages {
    async fn next(&mut self) -> Option<tenure::store::Change> {
        use tokio_stream::StreamExt;
        // None: disconnected; the listener subscribes again.
        let msg = self.stream.next().await?;
        Some(tenure::store::Change::parse(&msg.get_payload::<String>().unwrap_or_default()))
    }

    /// A subscription sends nothing while it waits: a `PING` on its connection shows
    /// whether the server is still there. One to a host that vanished without a reset
    /// would otherwise stay silent for good, and the process's watches would miss every
    /// release. (Messages that arrive meanwhile are kept.)
    async fn answers(&mut self) -> bool {
        if mutant("redis-feed-unchecked") {
            return true;
        }
        self.sink.ping::<Value>().await.is_ok()
    }
}

/// A script's answer: a status and the record fields.
struct Reply {
    status: String,
    record: Option<LeaseRecord>,
}

impl Reply {
    fn parse(election: &str, v: Value) -> Result<Self, StoreError> {
        let bad = || StoreError::new(ErrorKind::Misconfigured, "Redis answered in an unexpected shape");
        let Value::Array(items) = v else {
            return Err(bad());
        };
        let text = |i: usize| -> Option<String> {
            match items.get(i)? {
                Value::BulkString(b) => Some(String::from_utf8_lossy(b).into_owned()),
                Value::SimpleString(s) => Some(s.clone()),
                Value::Int(n) => Some(n.to_string()),
                _ => None,
            }
        };
        let num = |i: usize| text(i).and_then(|s| s.parse::<u64>().ok());
        let status = text(0).ok_or_else(bad)?;
        if status == "guard" {
            let wait = num(1).unwrap_or(0);
            return Err(StoreError::unavailable(format!(
                "Redis restarted or took over as primary (a failover) less than the longest TTL in use ago: no \
                 lease for {election} is granted, nor one from before renewed, for another {wait} ms, so that a \
                 lease it forgot, lost in the failover or restored from a snapshot cannot overlap another term \
                 (restart_guard; see docs/stores/redis.md)"
            )));
        }
        let record = match text(1) {
            None => None,
            Some(holder) => {
                let invalid = |e: tenure::NameError| {
                    StoreError::new(ErrorKind::Misconfigured, "Redis holds an invalid name").with_source(e)
                };
                let metadata = match items.get(8) {
                    Some(Value::BulkString(b)) => b.clone(),
                    _ => Vec::new(),
                };
                let pttl = match items.get(9) {
                    Some(Value::Int(n)) if *n > 0 => Some(Duration::from_millis(*n as u64)),
                    _ => Some(Duration::ZERO),
                };
                Some(LeaseRecord {
                    election: ElectionName::new(election).map_err(invalid)?,
                    holder: HolderId::new(holder).map_err(invalid)?,
                    token: FencingToken(num(2).ok_or_else(bad)?),
                    revision: Revision(num(3).ok_or_else(bad)?),
                    ttl: Duration::from_millis(num(4).unwrap_or(0)),
                    acquired_at: num(5).map(|ms| UNIX_EPOCH + Duration::from_millis(ms)),
                    renewed_at: num(6).map(|ms| UNIX_EPOCH + Duration::from_millis(ms)),
                    remaining: pttl,
                    evicted: text(7).as_deref() == Some("1"),
                    metadata,
                })
            }
        };
        Ok(Self { status, record })
    }
}

/// The replicas a `WAIT` reply counts (none for anything but a number).
fn acks_of(reply: Option<Value>) -> u64 {
    match reply {
        Some(Value::Int(n)) => n.max(0) as u64,
        _ => 0,
    }
}

pub(crate) use tenure::mutant;

/// Whether `e` carries the server's error code `c` ("READONLY", "OOM", …), or names it
/// in its text (older forms).
pub(crate) fn has_code(e: &redis::RedisError, c: &str) -> bool {
    e.code() == Some(c) || e.to_string().contains(c)
}

/// Maps a client error to a store error that says whether a retry can help.
///
/// Only what no retry mends is fatal: credentials and permissions, a bad URL, a key of
/// another type under our prefix, a server without the commands we need. Every other
/// refusal can clear by itself and is retried: a replica that was a primary before a
/// failover (READONLY), a primary that lost its replicas (NOREPLICAS, MASTERDOWN), a
/// failed snapshot (MISCONF), memory full (OOM), a server loading its data (LOADING),
/// a busy script (BUSY), too many clients, and anything not recognised: a fatal mistake
/// leaves an election without a leader until a person restarts every replica.
pub(crate) fn redis_error(what: &str, e: redis::RedisError) -> StoreError {
    let code = |c: &str| has_code(&e, c);
    let text = e.to_string();
    let (kind, hint) = if e.kind() == redis::ErrorKind::AuthenticationFailed || code("WRONGPASS") || code("NOAUTH") {
        (ErrorKind::Unauthorized, "check the password in the store URL")
    } else if code("NOPERM") {
        (ErrorKind::Unauthorized, "the user may not run the commands or keys tenure needs")
    } else if e.is_connection_refusal() {
        (ErrorKind::Unavailable, "nothing listens at the store URL's host and port")
    } else if e.is_timeout() || e.is_connection_dropped() {
        (ErrorKind::Ambiguous, "the connection broke; the request may have been applied")
    } else if e.is_io_error() && text.to_lowercase().contains("certificate") {
        (
            ErrorKind::Unavailable,
            "a TLS certificate was not accepted (the server's, or ours): check ca=, cert= and key=",
        )
    } else if e.is_io_error() {
        (ErrorKind::Unavailable, "cannot reach the server")
    } else if e.kind() == redis::ErrorKind::InvalidClientConfig {
        (ErrorKind::Misconfigured, "the store URL is not valid")
    } else if code("WRONGTYPE") {
        (ErrorKind::Misconfigured, "a key under the prefix is not tenure's; is another program writing there?")
    } else if text.contains("unknown command") {
        (ErrorKind::Misconfigured, "the server lacks a command tenure needs")
    } else if code("READONLY") && mutant("readonly-is-fatal") {
        (ErrorKind::Misconfigured, "the server does not take writes")
    } else if code("READONLY") || code("NOREPLICAS") || code("MASTERDOWN") {
        (ErrorKind::Unavailable, "the server does not take writes now (a failover?); retrying")
    } else {
        (ErrorKind::Unavailable, "the server refused for now; retrying")
    };
    StoreError::new(kind, format!("Redis: {what} failed ({hint})")).with_source(e)
}

#[async_trait::async_trait]
impl LeaseStore for RedisStore {
    fn describe(&self) -> String {
        self.inner.described.clone()
    }

    async fn try_acquire(&self, req: &AcquireRequest) -> Result<Acquire, StoreError> {
        req.validate()?;
        let (ttl, chan) = (req.ttl.as_millis().to_string(), self.channel());
        let guard = self.guard_arg(req.ttl);
        let e = req.election.as_str();
        let args: [&[u8]; 6] = [
            req.holder.as_str().as_bytes(),
            ttl.as_bytes(),
            &req.metadata,
            chan.as_bytes(),
            e.as_bytes(),
            guard.as_bytes(),
        ];
        let r = self.run("acquire", &self.inner.scripts.acquire, e, &args).await?;
        let rec = r.record.ok_or_else(|| StoreError::ambiguous("Redis: the lease vanished while it was acquired"))?;
        Ok(if r.status == "ok" { Acquire::Acquired(rec) } else { Acquire::Held(rec) })
    }

    async fn renew(&self, held: &LeaseRecord, ttl: Duration) -> Result<Renew, StoreError> {
        check_ttl(ttl)?;
        let guard = self.guard_arg(ttl);
        let (ttl, token, chan) = (ttl.as_millis().to_string(), held.token.0.to_string(), self.channel());
        let e = held.election.as_str();
        let r = self
            .run(
                "renew",
                &self.inner.scripts.renew,
                e,
                &[
                    held.holder.as_str().as_bytes(),
                    token.as_bytes(),
                    ttl.as_bytes(),
                    chan.as_bytes(),
                    e.as_bytes(),
                    guard.as_bytes(),
                ],
            )
            .await?;
        Ok(match (r.status.as_str(), r.record) {
            ("ok", Some(rec)) => Renew::Renewed(rec),
            (_, cur) => Renew::Lost(cur),
        })
    }

    /// Pipelines of renewal scripts, `PIPELINE_CHUNK` in each, one after another: one
    /// round trip per pipeline. With `min_replicas`, each pipeline ends with its own
    /// `WAIT`: one `WAIT` after them all would cover nothing if the connection had been
    /// made again in between (it counts only the writes of its own connection).
    async fn renew_many(&self, held: &[LeaseRecord], ttl: Duration) -> Vec<Result<Renew, StoreError>> {
        let mut out = Vec::with_capacity(held.len());
        for chunk in held.chunks(PIPELINE_CHUNK) {
            match self.renew_pipeline(chunk, ttl).await {
                Ok(v) => out.extend(v),
                Err(e) => out.extend(chunk.iter().map(|_| Err(e.duplicate()))),
            }
        }
        out
    }

    /// Pipelines of release scripts, `PIPELINE_CHUNK` in each, one after another: a
    /// process that leads thousands of elections hands them over in a few round trips.
    async fn release_many(&self, held: &[LeaseRecord]) -> Vec<Result<(), StoreError>> {
        let mut out = Vec::with_capacity(held.len());
        for chunk in held.chunks(PIPELINE_CHUNK) {
            match self.release_pipeline(chunk).await {
                Ok(()) => out.extend(chunk.iter().map(|_| Ok(()))),
                Err(e) => out.extend(chunk.iter().map(|_| Err(e.duplicate()))),
            }
        }
        out
    }

    async fn release(&self, held: &LeaseRecord) -> Result<(), StoreError> {
        let (token, rev, chan) = (held.token.0.to_string(), held.revision.0.to_string(), self.channel());
        let e = held.election.as_str();
        self.run(
            "release",
            &self.inner.scripts.release,
            e,
            &[held.holder.as_str().as_bytes(), token.as_bytes(), rev.as_bytes(), chan.as_bytes(), e.as_bytes()],
        )
        .await?;
        Ok(())
    }

    async fn get(&self, election: &ElectionName) -> Result<Option<LeaseRecord>, StoreError> {
        Ok(self.run("get", &self.inner.scripts.get, election.as_str(), &[]).await?.record)
    }

    async fn list(&self, prefix: &str) -> Result<Vec<LeaseRecord>, StoreError> {
        let (on, mut conn) = self.conn().await?;
        // Glob characters in the prefix are literal.
        let escaped: String =
            prefix.chars().flat_map(|c| if "*?[]\\".contains(c) { vec!['\\', c] } else { vec![c] }).collect();
        let pattern = format!("{}:lease:{escaped}*", self.inner.prefix);
        let lease_prefix = format!("{}:lease:", self.inner.prefix);
        let mut names = Vec::new();
        let mut cursor: u64 = 0;
        loop {
            let (next, keys): (u64, Vec<String>) = redis::cmd("SCAN")
                .arg(cursor)
                .arg("MATCH")
                .arg(&pattern)
                .arg("COUNT")
                .arg(500)
                .query_async(&mut conn)
                .await
                .map_err(|e| self.failed(on, "list", e))?;
            names.extend(keys.into_iter().filter_map(|k| k.strip_prefix(&lease_prefix).map(String::from)));
            cursor = next;
            if cursor == 0 {
                break;
            }
        }
        names.sort();
        names.dedup();
        let mut out = Vec::new();
        for n in names {
            let Ok(e) = ElectionName::new(&n) else { continue };
            match self.get(&e).await {
                Ok(Some(r)) => out.push(r),
                Ok(None) => {}
                // A record this build cannot read (written by hand, or corrupted) is left
                // out, not the whole list with it: `status` of that election says what is wrong.
                Err(err) if err.kind() == ErrorKind::Misconfigured => {
                    tracing::warn!(election = %e, "left out of the list: {err}");
                }
                Err(err) => return Err(err),
            }
        }
        Ok(out)
    }

    async fn evict(&self, election: &ElectionName, how: Evict) -> Result<Option<LeaseRecord>, StoreError> {
        let how = match how {
            Evict::Now => "now",
            Evict::AfterTerm => "term",
        };
        let (chan, e) = (self.channel(), election.as_str());
        let r =
            self.run("evict", &self.inner.scripts.evict, e, &[how.as_bytes(), chan.as_bytes(), e.as_bytes()]).await?;
        Ok(if r.status == "none" { None } else { r.record })
    }

    fn watch(&self, election: &ElectionName) -> Option<WatchStream> {
        Some(self.inner.changes.watch(Arc::new(self.clone()), &self.inner, election, Self::open_feed))
    }

    async fn ledger_read(&self, election: &ElectionName, key: &WorkKey) -> Result<Option<LedgerEntry>, StoreError> {
        const WHAT: &str = "reading the work ledger";
        let (on, mut conn) = self.conn().await?;
        let (entry, _) = self.ledger_keys(election, key);
        let (value, version): (Option<Vec<u8>>, Option<String>) = redis::cmd("HMGET")
            .arg(&entry)
            .arg("value")
            .arg("version")
            .query_async(&mut conn)
            .await
            .map_err(|e| self.failed(on, WHAT, e))?;
        Ok(match (value, version) {
            (Some(value), Some(version)) => Some(LedgerEntry { value, version }),
            _ => None,
        })
    }

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
        let (on, mut conn) = self.conn().await?;
        let (entry, counter) = self.ledger_keys(election, key);
        let script = &self.inner.scripts.ledger_write;
        let mut inv = script.key(entry);
        inv.key(counter)
            .arg(value)
            .arg(expected.unwrap_or(""))
            .arg(keep.as_millis().clamp(1, i64::MAX as u128 / 2).to_string());
        // With replicas to wait for, the write and its WAIT go out together, as grants do:
        // a key marked done must not be lost in a failover.
        let mut pipe = redis::pipe();
        pipe.invoke_script(&inv);
        if self.inner.min_replicas > 0 {
            pipe.cmd("WAIT").arg(self.inner.min_replicas).arg(WAIT_MS);
        }
        let mut values = self.query_pipeline(WHAT, (on, &mut conn), &pipe, script).await?;
        if self.inner.min_replicas > 0 {
            let acks = acks_of(values.pop());
            self.check_acks("work-ledger write", acks)?;
        }
        match values.pop() {
            Some(Value::Nil) => Ok(LedgerWrite::Conflict),
            Some(v) => Ok(LedgerWrite::Written(redis::from_redis_value::<String>(v).map_err(|e| {
                StoreError::ambiguous(format!(
                    "Redis answered a work-ledger write with something else than a version: {e}"
                ))
            })?)),
            None => Err(StoreError::ambiguous("Redis answered a work-ledger write with nothing")),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn our_parameters_are_split_off_and_checked() {
        let p = split_params("redis://:pw@h:6379/2?prefix=app:leases&protocol=resp3&restart_guard=off").unwrap();
        assert_eq!(
            (p.url.as_str(), p.prefix.as_str(), p.guard),
            ("redis://:pw@h:6379/2?protocol=resp3", "app:leases", None)
        );
        let p = split_params("redis://h").unwrap();
        assert_eq!((p.prefix.as_str(), p.guard), (DEFAULT_PREFIX, Some(0)));
        assert_eq!(split_params("redis://h?restart_guard=30s").unwrap().guard, Some(30_000));
        assert_eq!(split_params("redis://h?restart_guard=1500ms").unwrap().guard, Some(1500));
        assert_eq!(split_params("redis://h?restart_guard=0s").err().unwrap().kind(), ErrorKind::Invalid);
        assert_eq!(split_params("redis://h?prefix=a*b").err().unwrap().kind(), ErrorKind::Invalid);
        assert_eq!(split_params("redis://h?restart_guard=maybe").err().unwrap().kind(), ErrorKind::Invalid);
    }
}
