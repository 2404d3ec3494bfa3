//! PostgreSQL lease store for tenure.
//!
//! One row per election in a lease table (default `tenure_leases`, created on first
//! use). Every decision is one statement that judges expiry with the **server's** clock
//! (`now()`, the start of the statement's transaction, which is after the server received
//! the request; a batch of renewals reads `clock_timestamp()`, see `Sql::new`). Tokens
//! live in the row, which is never deleted, so they keep growing across release,
//! eviction, expiry and server restarts. A trigger sends `NOTIFY <table>` on every
//! change, so followers wait on `LISTEN` instead of polling.
//!
//! ```no_run
//! # async fn t() -> Result<(), Box<dyn std::error::Error>> {
//! let store = tenure_postgres::PostgresStore::connect("postgres://app@db/app?table=leases").await?;
//! # Ok(()) }
//! ```
//!
//! The URL is a libpq-style URL as sqlx reads it (`sslmode=require` and the like work),
//! plus one parameter of our own, `table`. Credentials are never logged or shown.

use std::collections::HashMap;
use std::str::FromStr;
use std::sync::Arc;
use std::time::{Duration, UNIX_EPOCH};

use sqlx::postgres::{PgConnectOptions, PgListener, PgPool, PgPoolOptions, PgRow};
use sqlx::{Row, Transaction};
use tenure::store::{
    Acquire, AcquireRequest, LedgerEntry, LedgerWrite, Renew, Revision, WatchStream, check_ledger_value, check_ttl,
};
use tenure::{ElectionName, ErrorKind, Evict, FencingToken, HolderId, LeaseRecord, LeaseStore, StoreError, WorkKey};
use tokio::sync::OnceCell;

/// The default lease table.
pub const DEFAULT_TABLE: &str = "tenure_leases";

/// A lease store in a PostgreSQL table.
#[derive(Clone)]
pub struct PostgresStore {
    inner: Arc<Inner>,
}

struct Inner {
    /// Acquires, reads, evictions, schema.
    pool: PgPool,
    /// Renewals and releases, the calls a leader's term depends on: kept apart so that
    /// they never queue behind followers' acquires (thousands at once when many terms
    /// change hands) for a connection.
    holders: PgPool,
    options: PgConnectOptions,
    table: String,
    described: String,
    sql: Sql,
    schema: OnceCell<()>,
    /// Names of elections that changed, from the shared LISTEN connection.
    changes: tenure::store::ChangeHub,
}

/// The statements, with the table name filled in.
struct Sql {
    acquire: String,
    renew: String,
    renew_many: String,
    release: String,
    release_many: String,
    get: String,
    get_many: String,
    list: String,
    evict_now: String,
    evict_after_term: String,
    ledger_read: String,
    ledger_create: String,
    ledger_update: String,
    ledger_purge: String,
}

const COLUMNS: &str = "election, holder, token, revision, ttl_ms, evicted, metadata, \
    (EXTRACT(EPOCH FROM acquired_at) * 1000)::bigint AS acquired_ms, \
    (EXTRACT(EPOCH FROM renewed_at) * 1000)::bigint AS renewed_ms, \
    GREATEST(0, (EXTRACT(EPOCH FROM (expires_at - now())) * 1000000)::bigint) AS remaining_us";

impl Sql {
    fn new(t: &str) -> Self {
        let live = "holder IS NOT NULL AND expires_at > now()";
        // A renewal never moves a live lease's expiry earlier. `now()` is when the
        // statement's transaction began, and a batch that began, then waited on another
        // row's lock past its caller's request timeout, reaches a lease after the renewal
        // sent again for it (later, on another connection) has committed: written as
        // `now() + ttl`, its grant would end before the one the holder now dates its term
        // from, and another candidate could take the lease while the holder still leads.
        let extended = |old: &str, ttl: &str| {
            let grant = format!("now() + {ttl} * interval '1 millisecond'");
            if mutant("pg-renew-shortens") { grant } else { format!("GREATEST({old}, {grant})") }
        };
        let renewed = extended("expires_at", "$4");
        let renewed_l = extended("l.expires_at", "$4");
        let reacquired = extended("l.expires_at", "EXCLUDED.ttl_ms");
        Self {
            acquire: format!(
                "INSERT INTO {t} AS l (election, holder, token, revision, ttl_ms, expires_at, acquired_at, renewed_at, evicted, metadata)
                 VALUES ($1, $2, 1, 1, $3, now() + $3 * interval '1 millisecond', now(), now(), false, $4)
                 ON CONFLICT (election) DO UPDATE SET
                   token = CASE WHEN l.holder = EXCLUDED.holder AND l.expires_at > now() THEN l.token ELSE l.token + 1 END,
                   acquired_at = CASE WHEN l.holder = EXCLUDED.holder AND l.expires_at > now() THEN l.acquired_at ELSE now() END,
                   holder = EXCLUDED.holder,
                   revision = l.revision + 1,
                   ttl_ms = EXCLUDED.ttl_ms,
                   expires_at = CASE WHEN l.holder = EXCLUDED.holder AND l.expires_at > now() THEN {reacquired} ELSE EXCLUDED.expires_at END,
                   renewed_at = now(),
                   evicted = false,
                   metadata = EXCLUDED.metadata
                 WHERE l.holder IS NULL OR l.expires_at <= now() OR (l.holder = EXCLUDED.holder AND NOT l.evicted)
                 RETURNING {COLUMNS}"
            ),
            renew: format!(
                "UPDATE {t} SET revision = revision + 1, ttl_ms = $4, expires_at = {renewed}, renewed_at = now()
                 WHERE election = $1 AND holder = $2 AND token = $3 AND NOT evicted AND expires_at > now()
                 RETURNING {COLUMNS}"
            ),
            // Expiry is judged here with `clock_timestamp()`, not `now()`: the planner
            // estimates `expires_at > now()` from the column's statistics, whose newest
            // deadline is at most a TTL after the last ANALYZE, so a few seconds later it
            // believes no lease is live and may join by rescanning the whole batch for
            // every live row (thousands × thousands: seconds on the server, and every
            // renewal in the batch late). It cannot estimate a volatile function, so its
            // guess stays a fixed share of the table and the batch is read once. The
            // clock it reads is at or after `now()` (while the server's clock does not
            // step back), so a lease at its very end is judged expired a little sooner:
            // safe, a renewal refused is a term given up.
            renew_many: format!(
                "UPDATE {t} AS l SET revision = l.revision + 1, ttl_ms = $4, expires_at = {renewed_l}, renewed_at = now()
                 FROM unnest($1::text[], $2::text[], $3::bigint[]) AS x(e, h, k)
                 WHERE l.election = x.e AND l.holder = x.h AND l.token = x.k AND NOT l.evicted
                   AND l.expires_at > {renew_clock}
                 RETURNING {COLUMNS}",
                renew_clock = if mutant("pg-renew-estimated") { "now()" } else { "clock_timestamp()" }
            ),
            release: format!(
                "UPDATE {t} SET holder = NULL, evicted = false, revision = revision + 1
                 WHERE election = $1 AND holder = $2 AND token = $3 AND revision = $4"
            ),
            release_many: format!(
                "UPDATE {t} AS l SET holder = NULL, evicted = false, revision = l.revision + 1
                 FROM unnest($1::text[], $2::text[], $3::bigint[], $4::bigint[]) AS x(e, h, k, r)
                 WHERE l.election = x.e AND l.holder = x.h AND l.token = x.k AND l.revision = x.r"
            ),
            get: format!("SELECT {COLUMNS} FROM {t} WHERE election = $1 AND {live}"),
            get_many: format!("SELECT {COLUMNS} FROM {t} WHERE election = ANY($1::text[]) AND {live}"),
            list: format!(
                "SELECT {COLUMNS} FROM {t} WHERE {live} AND left(election, length($1)) = $1 ORDER BY election COLLATE \"C\""
            ),
            evict_now: format!(
                "WITH old AS (SELECT {COLUMNS} FROM {t} WHERE election = $1 AND {live} FOR UPDATE)
                 UPDATE {t} AS l SET holder = NULL, evicted = false, revision = l.revision + 1
                 FROM old WHERE l.election = old.election
                 RETURNING old.*"
            ),
            evict_after_term: format!(
                "UPDATE {t} SET evicted = true, revision = revision + 1 WHERE election = $1 AND {live}
                 RETURNING {COLUMNS}"
            ),
            // The work ledger (store duty 8): versions from a sequence, so that none
            // comes back; entries kept by the server's clock.
            ledger_read: format!(
                "SELECT value, version FROM {t}_work WHERE election = $1 AND key = $2 AND keep_until > now()"
            ),
            ledger_create: format!(
                "INSERT INTO {t}_work AS w (election, key, value, version, keep_until)
                 VALUES ($1, $2, $3, nextval('{t}_wv'), now() + $4 * interval '1 millisecond')
                 ON CONFLICT (election, key) DO UPDATE
                   SET value = EXCLUDED.value, version = EXCLUDED.version, keep_until = EXCLUDED.keep_until
                   WHERE w.keep_until <= now()
                 RETURNING version"
            ),
            ledger_update: format!(
                "UPDATE {t}_work SET value = $3, version = nextval('{t}_wv'),
                   keep_until = now() + $4 * interval '1 millisecond'
                 WHERE election = $1 AND key = $2 AND version = $5 AND keep_until > now()
                 RETURNING version"
            ),
            ledger_purge: format!(
                "DELETE FROM {t}_work WHERE ctid IN (SELECT ctid FROM {t}_work WHERE keep_until <= now() LIMIT 100)"
            ),
        }
    }
}

/// Splits our own `table` parameter off the URL and checks it.
fn split_table(url: &str) -> Result<(String, String), StoreError> {
    let (url, mut ours) = tenure::store::url::take_params(url, &["table"])
        .map_err(|why| StoreError::invalid(format!("PostgreSQL store URL: {why}")))?;
    let table = ours.remove(0).unwrap_or_else(|| DEFAULT_TABLE.to_string());
    // The trigger is named <table>_notify, and PostgreSQL names are at most 63 bytes.
    tenure::store::check_table_name(&table, 56)?;
    Ok((url, table))
}

impl PostgresStore {
    /// A store for the database `url` names (`postgres://user:password@host:port/db`, plus
    /// an optional `table=NAME`). No connection is made yet: a server that is down now
    /// only makes the first operations fail with retryable errors.
    pub async fn connect(url: &str) -> Result<Self, StoreError> {
        // TLS asks rustls for the process's crypto provider, which it can choose alone
        // only while one is built in (the ZooKeeper client builds in a second): ring, as
        // every store here uses; one installed already stays.
        let _ = rustls::crypto::ring::default_provider().install_default();
        let (url, table) = split_table(url)?;
        let mut options = PgConnectOptions::from_str(&url)
            .map_err(|e| StoreError::new(ErrorKind::Misconfigured, "the PostgreSQL URL is not valid").with_source(e))?
            .application_name("tenure");
        // As libpq does: `require` with a root certificate given verifies the server
        // against it (sqlx's `require` would take any server).
        let root_cert = url.split_once('?').is_some_and(|(_, q)| q.split('&').any(|p| p.starts_with("sslrootcert=")))
            || std::env::var_os("PGSSLROOTCERT").is_some();
        if root_cert && matches!(options.get_ssl_mode(), sqlx::postgres::PgSslMode::Require) {
            options = options.ssl_mode(sqlx::postgres::PgSslMode::VerifyCa);
        }
        let described = format!(
            "postgres://{}@{}:{}/{} (table {table})",
            options.get_username(),
            options.get_host(),
            options.get_port(),
            options.get_database().unwrap_or("")
        );
        let (pool, holders) = (pool_of(&options, 4), pool_of(&options, 2));
        Ok(Self {
            inner: Arc::new(Inner {
                pool,
                holders,
                options,
                sql: Sql::new(&table),
                table,
                described,
                schema: OnceCell::new(),
                changes: tenure::store::ChangeHub::new(),
            }),
        })
    }

    /// The statement that renews a batch of leases, as sent (`$1`–`$3`: elections,
    /// holders, tokens; `$4`: TTL in milliseconds). For tests of its plan.
    #[doc(hidden)]
    pub fn renew_many_statement(&self) -> &str {
        &self.inner.sql.renew_many
    }

    /// Creates the lease table, its notify trigger and function if they are missing.
    /// Every operation does this once on first use; call it to fail early.
    pub async fn ensure_schema(&self) -> Result<(), StoreError> {
        self.inner
            .schema
            .get_or_try_init(|| async {
                let t = &self.inner.table;
                let mut tx: Transaction<'_, sqlx::Postgres> = self.check("preparing the lease table", self.inner.pool.begin().await).await?;
                // One process at a time: concurrent CREATEs of the same objects conflict.
                sqlx::query("SELECT pg_advisory_xact_lock(hashtext('tenure schema ' || $1))")
                    .bind(t)
                    .execute(&mut *tx)
                    .await
                    .map_err(|e| pg_error("creating the lease table", e))?;
                let ddl = format!(
                    "CREATE TABLE IF NOT EXISTS {t} (
                        election    text PRIMARY KEY,
                        holder      text,
                        token       bigint NOT NULL,
                        revision    bigint NOT NULL,
                        ttl_ms      bigint NOT NULL,
                        expires_at  timestamptz NOT NULL,
                        acquired_at timestamptz,
                        renewed_at  timestamptz,
                        evicted     boolean NOT NULL DEFAULT false,
                        metadata    bytea NOT NULL DEFAULT '\\x'
                    );
                    CREATE OR REPLACE FUNCTION {t}_notify() RETURNS trigger LANGUAGE plpgsql AS $f$
                    BEGIN PERFORM pg_notify('{t}', CASE
                      WHEN NEW.holder IS NULL OR NEW.expires_at <= clock_timestamp() THEN NEW.election || E'\\t'
                      WHEN octet_length(NEW.metadata) > 3000 THEN NEW.election
                      ELSE concat_ws(E'\\t', NEW.election, NEW.holder, NEW.token, NEW.revision, NEW.ttl_ms,
                        GREATEST(0, (EXTRACT(EPOCH FROM (NEW.expires_at - clock_timestamp())) * 1000000)::bigint),
                        NEW.evicted::int, coalesce((EXTRACT(EPOCH FROM NEW.acquired_at) * 1000)::bigint::text, ''),
                        coalesce((EXTRACT(EPOCH FROM NEW.renewed_at) * 1000)::bigint::text, ''),
                        encode(NEW.metadata, 'hex'))
                    END); RETURN NEW; END $f$;
                    DO $d$ BEGIN
                      IF NOT EXISTS (SELECT 1 FROM pg_trigger WHERE tgname = '{t}_notify' AND tgrelid = '{t}'::regclass) THEN
                        CREATE TRIGGER {t}_notify AFTER INSERT OR UPDATE ON {t} FOR EACH ROW EXECUTE FUNCTION {t}_notify();
                      END IF;
                    END $d$;
                    CREATE TABLE IF NOT EXISTS {t}_work (
                        election   text NOT NULL,
                        key        text NOT NULL,
                        value      bytea NOT NULL,
                        version    bigint NOT NULL,
                        keep_until timestamptz NOT NULL,
                        PRIMARY KEY (election, key)
                    );
                    CREATE INDEX IF NOT EXISTS {t}_work_keep ON {t}_work (keep_until);
                    CREATE SEQUENCE IF NOT EXISTS {t}_wv;"
                );
                sqlx::raw_sql(audited(&ddl)).execute(&mut *tx).await.map_err(|e| pg_error("creating the lease table", e))?;
                tx.commit().await.map_err(|e| pg_error("creating the lease table", e))?;
                Ok(())
            })
            .await
            .map(|_| ())
    }

    async fn fetch_one(
        &self,
        what: &'static str,
        pool: &PgPool,
        sql: &str,
        binds: Binds<'_>,
    ) -> Result<Option<LeaseRecord>, StoreError> {
        self.ensure_schema().await?;
        let rows = fetch_all_on(pool, binds.apply(sqlx::query(audited(sql)))).await;
        let rows = self.check(what, rows).await?;
        rows.first().map(record).transpose()
    }

    /// Turns a driver error into a store error. When the pool gave up waiting for a
    /// connection, one direct attempt finds the real cause (refused, unknown host, bad
    /// password) for the message.
    async fn check<T>(&self, what: &str, r: Result<T, sqlx::Error>) -> Result<T, StoreError> {
        match r {
            Ok(v) => Ok(v),
            Err(sqlx::Error::PoolTimedOut) => {
                use sqlx::ConnectOptions;
                let direct = tokio::time::timeout(Duration::from_secs(3), self.inner.options.connect()).await;
                Err(match direct {
                    // Nothing was sent without a connection: whatever failed, a retry may help,
                    // except a refusal by the server itself (credentials, database).
                    Ok(Err(cause @ sqlx::Error::Database(_))) => pg_error(what, cause),
                    Ok(Err(cause)) => StoreError::unavailable(format!(
                        "PostgreSQL: {what} failed (cannot connect to {}:{}; check the host and port in the store URL)",
                        self.inner.options.get_host(),
                        self.inner.options.get_port()
                    ))
                    .with_source(cause),
                    _ => pg_error(what, sqlx::Error::PoolTimedOut),
                })
            }
            Err(e) => Err(pg_error(what, e)),
        }
    }

    /// The live record of `election`, read through `pool`.
    async fn get_on(&self, pool: &PgPool, election: &ElectionName) -> Result<Option<LeaseRecord>, StoreError> {
        self.fetch_one("get", pool, &self.inner.sql.get, Binds::Election(election.as_str())).await
    }

    /// The live records of the elections of `leases`, by name (those nobody holds are
    /// missing).
    async fn get_many(&self, leases: &[&LeaseRecord]) -> Result<HashMap<String, LeaseRecord>, StoreError> {
        let names: Vec<String> = leases.iter().map(|l| l.election.to_string()).collect();
        let rows = fetch_all_on(&self.inner.holders, sqlx::query(audited(&self.inner.sql.get_many)).bind(names)).await;
        let rows = self.check("get", rows).await?;
        rows.iter().map(|r| record(r).map(|l| (l.election.to_string(), l))).collect()
    }

    /// The change listener's feed: a `LISTEN` connection on the table's channel.
    async fn open_feed(inner: Arc<Inner>) -> Option<Box<dyn tenure::store::ChangeFeed>> {
        // A pool of its own for each feed: a feed dropped because its connection stopped
        // answering sends `UNLISTEN` and gives the connection back with a ping, neither
        // timed, and so holds the slot for good; only this pool's one slot, which goes
        // with it.
        let own = pool_of(&inner.options, 1);
        let mut listener = PgListener::connect_with(&own)
            .await
            .inspect_err(|e| tracing::debug!(error = %e, "LISTEN connection failed; retrying"))
            .ok()?;
        // A lost connection ends the feed (the hub opens a new one and every watcher reads
        // again) instead of being made again inside the listener, where notifications
        // sent meanwhile would be missed unnoticed.
        listener.eager_reconnect(false);
        tokio::time::timeout(STATEMENT_LIMIT, listener.listen(&inner.table)).await.ok()?.ok()?;
        Some(Box::new(Notifications(listener)))
    }
}

/// The trigger's notifications on the store's channel.
struct Notifications(PgListener);

#[async_trait::async_trait]
impl tenure::store::ChangeFeed for Notifications {
    async fn next(&mut self) -> Option<tenure::store::Change> {
        // Disconnected (None) or failed: the listener reconnects and resynchronises.
        self.0.try_recv().await.ok().flatten().map(|n| tenure::store::Change::parse(n.payload()))
    }

    /// `LISTEN` sends nothing while it waits: a statement on its connection shows whether
    /// the server is still there. (Notifications that arrive meanwhile are kept.)
    async fn answers(&mut self) -> bool {
        if mutant("pg-listen-unchecked") {
            return true;
        }
        sqlx::query("SELECT 1").execute(&mut self.0).await.is_ok()
    }
}

/// `leases` by election name. When PostgreSQL plans a batch statement as a nested loop
/// over the arrays (one primary-key lookup each: small batches, and the generic plan), it
/// locks its rows in the order of its arrays, so batches that overlap (a renewal sent
/// again while its first batch still runs, a release beside a renewal) take their common
/// rows in one order rather than each holding a row the other waits for. A large batch
/// planned as a hash join locks rows in the table's order, and overlapping ones can
/// deadlock; the server then aborts one statement, which applies nothing and is retried.
fn by_name(leases: &[LeaseRecord]) -> Vec<&LeaseRecord> {
    let mut sorted: Vec<&LeaseRecord> = leases.iter().collect();
    sorted.sort_by(|a, b| a.election.as_str().cmp(b.election.as_str()));
    sorted
}

/// A pool of up to `n` connections, opened as needed. A connection is checked (a ping, a
/// round trip of its own) before a call only after a quiet spell, when a middlebox may
/// have dropped it silently. One that went half-open since its last use (a server that
/// vanished without a reset) takes the next call, which times out and closes it (see
/// [`Pooled`]).
fn pool_of(options: &PgConnectOptions, n: u32) -> PgPool {
    PgPoolOptions::new()
        .max_connections(n)
        .min_connections(0)
        .acquire_timeout(Duration::from_secs(3))
        .test_before_acquire(false)
        .before_acquire(|conn, meta| {
            Box::pin(async move {
                if meta.idle_for >= CHECK_AFTER_IDLE {
                    sqlx::Connection::ping(conn).await?;
                }
                Ok(true)
            })
        })
        .connect_lazy_with(options.clone())
}

/// How long a pooled connection may sit unused and still take a call unchecked. Quiet
/// connections are dropped silently by NAT tables and load balancers after minutes; a
/// check before each call would add a round trip to every renewal, release and acquire.
const CHECK_AFTER_IDLE: Duration = Duration::from_secs(30);

/// A connection taken from a pool for one statement. If the call ends before the
/// statement does (the runtime's request timeout, [`STATEMENT_LIMIT`]), the connection is closed instead of
/// going back: sqlx would check it with a ping that has no timeout, and a connection to
/// a server that vanished would hold its pool slot until the kernel gave up on it.
/// (sqlx also pings each connection given back after a finished call; a server that
/// vanishes during that one round trip still holds the slot.)
struct Pooled(Option<sqlx::pool::PoolConnection<sqlx::Postgres>>);

impl Pooled {
    async fn take(pool: &PgPool) -> Result<Self, sqlx::Error> {
        Ok(Self(Some(pool.acquire().await?)))
    }

    fn conn(&mut self) -> &mut sqlx::PgConnection {
        self.0.as_mut().expect("a connection until it is given back")
    }

    /// The statement finished, well or not: back to the pool.
    fn give_back(mut self) {
        self.0.take();
    }
}

impl Drop for Pooled {
    fn drop(&mut self) {
        if let Some(conn) = self.0.take() {
            if mutant("pg-abandoned-connection-kept") {
                return;
            }
            // Out of the pool (which may open another in its place) and closed at once.
            drop(conn.detach());
        }
    }
}

use tenure::mutant;

type PgQuery<'q> = sqlx::query::Query<'q, sqlx::Postgres, sqlx::postgres::PgArguments>;

/// How long a statement may go unanswered before its connection is taken for lost (and
/// closed) and the call fails as ambiguous. The runtime's calls give up sooner at most
/// TTLs (its request timeout); this bounds the calls nothing else times (batches,
/// watches' reads, status reads) on a connection to a server that vanished.
const STATEMENT_LIMIT: Duration = Duration::from_secs(5);

/// The error of a statement that had no answer within [`STATEMENT_LIMIT`].
fn unanswered(_: tokio::time::error::Elapsed) -> sqlx::Error {
    let message = format!("no answer within {} s", STATEMENT_LIMIT.as_secs());
    sqlx::Error::Io(std::io::Error::new(std::io::ErrorKind::TimedOut, message))
}

/// The rows of one statement, on a connection from `pool`.
async fn fetch_all_on(pool: &PgPool, q: PgQuery<'_>) -> Result<Vec<PgRow>, sqlx::Error> {
    let mut c = Pooled::take(pool).await?;
    let rows = tokio::time::timeout(STATEMENT_LIMIT, q.fetch_all(c.conn())).await.map_err(unanswered)?;
    c.give_back();
    rows
}

/// One statement without rows, on a connection from `pool`.
async fn execute_on(pool: &PgPool, q: PgQuery<'_>) -> Result<sqlx::postgres::PgQueryResult, sqlx::Error> {
    let mut c = Pooled::take(pool).await?;
    let done = tokio::time::timeout(STATEMENT_LIMIT, q.execute(c.conn())).await.map_err(unanswered)?;
    c.give_back();
    done
}

/// A statement built from our fixed text and the table name, which [`split_table`]
/// restricts to letters, digits and underscores: nothing from outside reaches it.
fn audited(sql: &str) -> sqlx::AssertSqlSafe<String> {
    sqlx::AssertSqlSafe(sql.to_owned())
}

/// The parameters of one statement.
enum Binds<'a> {
    Election(&'a str),
    Prefix(&'a str),
    Acquire(&'a AcquireRequest),
    Renew(&'a LeaseRecord, i64),
    Release(&'a LeaseRecord),
}

impl Binds<'_> {
    fn apply<'q>(self, q: PgQuery<'q>) -> PgQuery<'q>
    where
        Self: 'q,
    {
        match self {
            Binds::Election(e) | Binds::Prefix(e) => q.bind(e.to_string()),
            Binds::Acquire(r) => q
                .bind(r.election.to_string())
                .bind(r.holder.to_string())
                .bind(r.ttl.as_millis() as i64)
                .bind(r.metadata.clone()),
            Binds::Renew(l, ttl_ms) => {
                q.bind(l.election.to_string()).bind(l.holder.to_string()).bind(l.token.0 as i64).bind(ttl_ms)
            }
            Binds::Release(l) => q
                .bind(l.election.to_string())
                .bind(l.holder.to_string())
                .bind(l.token.0 as i64)
                .bind(l.revision.0 as i64),
        }
    }
}

fn record(r: &PgRow) -> Result<LeaseRecord, StoreError> {
    let bad = |e: sqlx::Error| {
        StoreError::new(ErrorKind::Misconfigured, "the lease table has an unexpected shape").with_source(e)
    };
    let election: String = r.try_get("election").map_err(bad)?;
    let holder: Option<String> = r.try_get("holder").map_err(bad)?;
    let invalid = |e: tenure::NameError| {
        StoreError::new(ErrorKind::Misconfigured, "the lease table holds an invalid name").with_source(e)
    };
    let ms = |v: Option<i64>| v.map(|ms| UNIX_EPOCH + Duration::from_millis(ms.max(0) as u64));
    Ok(LeaseRecord {
        election: ElectionName::new(election).map_err(invalid)?,
        holder: HolderId::new(holder.unwrap_or_default()).map_err(invalid)?,
        token: FencingToken(r.try_get::<i64, _>("token").map_err(bad)? as u64),
        revision: Revision(r.try_get::<i64, _>("revision").map_err(bad)? as u64),
        ttl: Duration::from_millis(r.try_get::<i64, _>("ttl_ms").map_err(bad)? as u64),
        acquired_at: ms(r.try_get("acquired_ms").map_err(bad)?),
        renewed_at: ms(r.try_get("renewed_ms").map_err(bad)?),
        remaining: Some(Duration::from_micros(r.try_get::<i64, _>("remaining_us").map_err(bad)?.max(0) as u64)),
        evicted: r.try_get("evicted").map_err(bad)?,
        metadata: r.try_get("metadata").map_err(bad)?,
    })
}

/// Maps a driver error to a store error that says whether a retry can help.
fn pg_error(what: &str, e: sqlx::Error) -> StoreError {
    let (kind, hint) = match &e {
        sqlx::Error::Database(db) => match db.code().as_deref() {
            Some("28P01" | "28000") => (ErrorKind::Unauthorized, "check the user and password in the store URL"),
            Some("42501") => (ErrorKind::Unauthorized, "the user may not use the lease table"),
            Some("3D000") => (ErrorKind::Misconfigured, "the database in the store URL does not exist"),
            Some("25006") => {
                (ErrorKind::Unavailable, "the server takes no writes now (a standby after a failover?); retrying")
            }
            Some(c) if c.starts_with("08") => (ErrorKind::Ambiguous, "the connection broke"),
            Some(c) if c.starts_with("57") => (ErrorKind::Ambiguous, "the server is shutting down or restarting"),
            // What no retry mends: privileges, an incompatible schema, missing features.
            Some(c) if c.starts_with("28") || c.starts_with("42") || c.starts_with("3F") || c.starts_with("0A") => {
                (ErrorKind::Misconfigured, "the server refused the statement")
            }
            // Everything else can clear by itself (serialization failures, deadlocks,
            // locks, too many connections, a full disk, out of memory): retry.
            _ => (ErrorKind::Unavailable, "the server refused for now; retrying"),
        },
        sqlx::Error::Io(io)
            if matches!(io.kind(), std::io::ErrorKind::ConnectionRefused | std::io::ErrorKind::NotFound) =>
        {
            (ErrorKind::Unavailable, "nothing listens at the store URL's host and port")
        }
        sqlx::Error::Io(io) if io.to_string().contains("lookup address") => {
            (ErrorKind::Unavailable, "the host name in the store URL does not resolve")
        }
        sqlx::Error::Io(_) | sqlx::Error::Protocol(_) => {
            (ErrorKind::Ambiguous, "the connection broke; the request may have been applied")
        }
        sqlx::Error::PoolTimedOut => (ErrorKind::Unavailable, "no connection to the server could be made in time"),
        sqlx::Error::PoolClosed | sqlx::Error::WorkerCrashed => {
            (ErrorKind::Unavailable, "the connection pool is closed")
        }
        sqlx::Error::Tls(_) => (ErrorKind::Misconfigured, "TLS failed; check sslmode and certificates"),
        sqlx::Error::Configuration(_) => (ErrorKind::Misconfigured, "the store URL is not valid"),
        _ => (ErrorKind::Unavailable, "retrying"),
    };
    StoreError::new(kind, format!("PostgreSQL: {what} failed ({hint})")).with_source(e)
}

#[async_trait::async_trait]
impl LeaseStore for PostgresStore {
    fn describe(&self) -> String {
        self.inner.described.clone()
    }

    async fn try_acquire(&self, req: &AcquireRequest) -> Result<Acquire, StoreError> {
        req.validate()?;
        for _ in 0..5 {
            if let Some(l) =
                self.fetch_one("acquire", &self.inner.pool, &self.inner.sql.acquire, Binds::Acquire(req)).await?
            {
                return Ok(Acquire::Acquired(l));
            }
            if let Some(cur) = self.get(&req.election).await? {
                return Ok(Acquire::Held(cur));
            }
            // Released between the two statements: try again.
        }
        Err(StoreError::unavailable("PostgreSQL: acquire kept racing with releases; retrying"))
    }

    async fn renew(&self, held: &LeaseRecord, ttl: Duration) -> Result<Renew, StoreError> {
        check_ttl(ttl)?;
        match self
            .fetch_one("renew", &self.inner.holders, &self.inner.sql.renew, Binds::Renew(held, ttl.as_millis() as i64))
            .await?
        {
            Some(l) => Ok(Renew::Renewed(l)),
            // Read on the holders' connections too: a lost term must be known at once.
            None => Ok(Renew::Lost(self.get_on(&self.inner.holders, &held.election).await?)),
        }
    }

    /// One statement renews them all; only the leases it did not renew are read again,
    /// to say who holds them now.
    async fn renew_many(&self, held: &[LeaseRecord], ttl: Duration) -> Vec<Result<Renew, StoreError>> {
        let renewed = async {
            check_ttl(ttl)?;
            self.ensure_schema().await?;
            let sorted = by_name(held);
            let q = sqlx::query(audited(&self.inner.sql.renew_many))
                .bind(sorted.iter().map(|l| l.election.to_string()).collect::<Vec<_>>())
                .bind(sorted.iter().map(|l| l.holder.to_string()).collect::<Vec<_>>())
                .bind(sorted.iter().map(|l| l.token.0 as i64).collect::<Vec<_>>())
                .bind(ttl.as_millis() as i64);
            let rows = fetch_all_on(&self.inner.holders, q).await;
            let rows = self.check("renew", rows).await?;
            rows.iter().map(record).collect::<Result<Vec<_>, _>>()
        };
        let renewed = match renewed.await {
            Ok(r) => r,
            Err(e) => return held.iter().map(|_| Err(e.duplicate())).collect(),
        };
        // Thousands at a time (through `Batched`): look each answer up, not through a scan.
        let by_key: HashMap<(&str, &str, u64), &LeaseRecord> =
            renewed.iter().map(|r| ((r.election.as_str(), r.holder.as_str(), r.token.0), r)).collect();
        let found: Vec<Option<&&LeaseRecord>> =
            held.iter().map(|l| by_key.get(&(l.election.as_str(), l.holder.as_str(), l.token.0))).collect();
        let lost: Vec<&LeaseRecord> = held.iter().zip(&found).filter(|(_, f)| f.is_none()).map(|(l, _)| l).collect();
        // Who holds the ones it did not renew: one statement for them all, however many
        // (one read each would hold every renewed one's answer back a round trip per loss).
        let now_held = if lost.is_empty() { Ok(HashMap::new()) } else { self.get_many(&lost).await };
        held.iter()
            .zip(found)
            .map(|(l, found)| match found {
                Some(r) => Ok(Renew::Renewed((*r).clone())),
                None => match &now_held {
                    Ok(now) => Ok(Renew::Lost(now.get(l.election.as_str()).cloned())),
                    Err(e) => Err(e.duplicate()),
                },
            })
            .collect()
    }

    async fn release(&self, held: &LeaseRecord) -> Result<(), StoreError> {
        self.ensure_schema().await?;
        let r =
            execute_on(&self.inner.holders, Binds::Release(held).apply(sqlx::query(audited(&self.inner.sql.release))))
                .await;
        self.check("release", r).await?;
        Ok(())
    }

    /// One statement releases them all, each on its own compare.
    async fn release_many(&self, held: &[LeaseRecord]) -> Vec<Result<(), StoreError>> {
        if held.is_empty() {
            return Vec::new();
        }
        let released = async {
            self.ensure_schema().await?;
            let sorted = by_name(held);
            let q = sqlx::query(audited(&self.inner.sql.release_many))
                .bind(sorted.iter().map(|l| l.election.to_string()).collect::<Vec<_>>())
                .bind(sorted.iter().map(|l| l.holder.to_string()).collect::<Vec<_>>())
                .bind(sorted.iter().map(|l| l.token.0 as i64).collect::<Vec<_>>())
                .bind(sorted.iter().map(|l| l.revision.0 as i64).collect::<Vec<_>>());
            let r = execute_on(&self.inner.holders, q).await;
            self.check("release", r).await.map(drop)
        };
        match released.await {
            Ok(()) => held.iter().map(|_| Ok(())).collect(),
            Err(e) => held.iter().map(|_| Err(e.duplicate())).collect(),
        }
    }

    async fn get(&self, election: &ElectionName) -> Result<Option<LeaseRecord>, StoreError> {
        self.get_on(&self.inner.pool, election).await
    }

    async fn list(&self, prefix: &str) -> Result<Vec<LeaseRecord>, StoreError> {
        self.ensure_schema().await?;
        let rows =
            fetch_all_on(&self.inner.pool, Binds::Prefix(prefix).apply(sqlx::query(audited(&self.inner.sql.list))))
                .await;
        let rows = self.check("list", rows).await?;
        rows.iter().map(record).collect()
    }

    async fn evict(&self, election: &ElectionName, how: Evict) -> Result<Option<LeaseRecord>, StoreError> {
        let sql = match how {
            Evict::Now => &self.inner.sql.evict_now,
            Evict::AfterTerm => &self.inner.sql.evict_after_term,
        };
        self.fetch_one("evict", &self.inner.pool, sql, Binds::Election(election.as_str())).await
    }

    fn watch(&self, election: &ElectionName) -> Option<WatchStream> {
        Some(self.inner.changes.watch(Arc::new(self.clone()), &self.inner, election, Self::open_feed))
    }

    async fn ledger_read(&self, election: &ElectionName, key: &WorkKey) -> Result<Option<LedgerEntry>, StoreError> {
        self.ensure_schema().await?;
        let q = sqlx::query(audited(&self.inner.sql.ledger_read)).bind(election.as_str()).bind(key.as_str());
        let rows = fetch_all_on(&self.inner.pool, q).await;
        let rows = self.check("reading the work ledger", rows).await?;
        rows.first()
            .map(|r| {
                Ok(LedgerEntry { value: r.try_get("value")?, version: r.try_get::<i64, _>("version")?.to_string() })
            })
            .transpose()
            .map_err(|e| pg_error("reading the work ledger", e))
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
        self.ensure_schema().await?;
        let purged = execute_on(&self.inner.pool, sqlx::query(audited(&self.inner.sql.ledger_purge))).await;
        self.check(WHAT, purged).await?;
        let keep_ms = keep.as_millis().min(i64::MAX as u128 / 2) as i64;
        let sql = if expected.is_some() { &self.inner.sql.ledger_update } else { &self.inner.sql.ledger_create };
        let mut q =
            sqlx::query(audited(sql)).bind(election.as_str()).bind(key.as_str()).bind(value.to_vec()).bind(keep_ms);
        if let Some(v) = expected {
            // A version this store never gave matches nothing.
            let Ok(v) = v.parse::<i64>() else { return Ok(LedgerWrite::Conflict) };
            q = q.bind(v);
        }
        let rows = fetch_all_on(&self.inner.pool, q).await;
        let rows = self.check(WHAT, rows).await?;
        match rows.first() {
            Some(r) => {
                Ok(LedgerWrite::Written(r.try_get::<i64, _>("version").map_err(|e| pg_error(WHAT, e))?.to_string()))
            }
            None => Ok(LedgerWrite::Conflict),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The trigger's real payload, parsed, is the record a read returns (but for the time
    /// left, which the two measure at different moments).
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn the_trigger_payload_is_the_stored_record() {
        use tenure_testkit::servers::{self, Kind};
        let Some(server) = servers::launch(Kind::Postgres) else { return };
        let store = PostgresStore::connect(&server.url()).await.unwrap();
        store.ensure_schema().await.unwrap();
        let pool = sqlx::postgres::PgPool::connect(&server.url()).await.unwrap();
        let mut listener = PgListener::connect_with(&pool).await.unwrap();
        listener.listen(DEFAULT_TABLE).await.unwrap();
        let name = ElectionName::new("billing/nightly").unwrap();
        let req = tenure::store::AcquireRequest::new(
            name.clone(),
            HolderId::new("web-1.42.ab").unwrap(),
            Duration::from_secs(9),
        )
        .with_metadata(b"host:8080\t\x00".to_vec());
        let tenure::store::Acquire::Acquired(held) = store.try_acquire(&req).await.unwrap() else {
            panic!("not acquired")
        };
        store.renew(&held, Duration::from_secs(9)).await.unwrap();
        let mut compared = 0;
        for _ in 0..2 {
            let n = tokio::time::timeout(Duration::from_secs(5), listener.recv()).await.unwrap().unwrap();
            let tenure::store::Change::Election { carries: tenure::store::Carries::Record(carried), .. } =
                tenure::store::Change::parse(n.payload())
            else {
                panic!("the payload carries the record")
            };
            let stored = store.get(&name).await.unwrap();
            let strip = |r: Option<LeaseRecord>| r.map(|r| LeaseRecord { remaining: None, ..r });
            let carried = strip(Some(carried));
            // The first notification is the acquire's, the second the renewal's.
            assert_eq!(carried.as_ref().map(|r| (&r.holder, r.token)), Some((&held.holder, held.token)));
            if carried.as_ref().map(|r| r.revision) == stored.as_ref().map(|r| r.revision) {
                assert_eq!(carried, strip(stored));
                compared += 1;
            }
        }
        assert_eq!(compared, 1, "the renewal's notification matches the row as it stands");
        store.release(&store.get(&name).await.unwrap().unwrap()).await.unwrap();
        let n = tokio::time::timeout(Duration::from_secs(5), listener.recv()).await.unwrap().unwrap();
        assert!(
            matches!(
                tenure::store::Change::parse(n.payload()),
                tenure::store::Change::Election { carries: tenure::store::Carries::NoLease, .. }
            ),
            "a release carries no lease"
        );
    }

    #[test]
    fn the_table_parameter_is_ours_and_checked() {
        let (url, table) = split_table("postgres://u:p@h/db?sslmode=disable&table=leases").unwrap();
        assert_eq!((url.as_str(), table.as_str()), ("postgres://u:p@h/db?sslmode=disable", "leases"));
        let (url, table) = split_table("postgres://h/db").unwrap();
        assert_eq!((url.as_str(), table.as_str()), ("postgres://h/db", DEFAULT_TABLE));
        let err = split_table("postgres://h/db?table=x;drop").unwrap_err();
        assert_eq!(err.kind(), ErrorKind::Invalid);
    }
}
