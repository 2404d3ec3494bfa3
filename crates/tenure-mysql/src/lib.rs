//! MySQL/MariaDB lease store for tenure.
//!
//! One row per election in a lease table (default `tenure_leases`, created on first use).
//! Every decision is one transaction: the row is locked with `SELECT … FOR UPDATE`, which
//! also reads the server's clock (`UNIX_TIMESTAMP(NOW(6))`, the time that statement began,
//! after the server received the request and before any wait for the row's lock), and
//! the new state is written. Tokens live in the row, which is never deleted. MariaDB has
//! no `UPDATE … RETURNING` and no notifications, so the record is computed from the
//! locked row. Every write also moves a one-row change counter (`TABLE_seq`) and stamps
//! the row with its new value (`seq`), in the same transaction; a store handle with
//! watchers looks at the counter every 100 ms and reads only the rows changed since it
//! last looked, so a process's followers share one cheap query instead of polling each
//! election.
//!
//! ```no_run
//! # async fn t() -> Result<(), Box<dyn std::error::Error>> {
//! let store = tenure_mysql::MysqlStore::connect("mysql://app:secret@db:3306/app").await?;
//! # Ok(()) }
//! ```

use std::str::FromStr;
use std::sync::Arc;
use std::time::{Duration, UNIX_EPOCH};

use sqlx::mysql::{MySqlConnectOptions, MySqlPool, MySqlPoolOptions, MySqlRow};
use sqlx::{MySql, Row, Transaction};
use tenure::store::{
    Acquire, AcquireRequest, Change, ChangeHub, LedgerEntry, LedgerWrite, Renew, Revision, WatchStream,
    check_ledger_value, check_ttl,
};
use tenure::{ElectionName, ErrorKind, Evict, FencingToken, HolderId, LeaseRecord, LeaseStore, StoreError, WorkKey};
use tokio::sync::OnceCell;

/// The default lease table.
pub const DEFAULT_TABLE: &str = "tenure_leases";

/// A lease store in a MySQL or MariaDB table.
#[derive(Clone)]
pub struct MysqlStore {
    inner: Arc<Inner>,
}

struct Inner {
    pool: MySqlPool,
    table: String,
    described: String,
    schema: OnceCell<()>,
    /// The watchers of this handle, fed by one change feed.
    changes: ChangeHub,
}

/// How often a store handle with watchers looks at the change counter.
pub const WATCH_INTERVAL: Duration = Duration::from_millis(100);

/// One row of the lease table, with the server clock read under its lock.
struct LockedRow {
    holder: Option<String>,
    token: i64,
    revision: i64,
    ttl_ms: i64,
    expires_us: i64,
    acquired_ms: Option<i64>,
    renewed_ms: Option<i64>,
    evicted: bool,
    metadata: Vec<u8>,
    now_us: i64,
}

impl LockedRow {
    fn read(r: &MySqlRow) -> Result<Self, sqlx::Error> {
        Ok(Self {
            holder: r.try_get("holder")?,
            token: r.try_get("token")?,
            revision: r.try_get("revision")?,
            ttl_ms: r.try_get("ttl_ms")?,
            expires_us: r.try_get("expires_us")?,
            acquired_ms: r.try_get("acquired_ms")?,
            renewed_ms: r.try_get("renewed_ms")?,
            evicted: r.try_get::<i8, _>("evicted")? != 0,
            metadata: r.try_get("metadata")?,
            now_us: r.try_get("now_us")?,
        })
    }

    fn live(&self) -> bool {
        self.holder.is_some() && self.expires_us > self.now_us
    }

    fn record(&self, election: &ElectionName) -> Result<Option<LeaseRecord>, StoreError> {
        if !self.live() {
            return Ok(None);
        }
        let invalid = |e: tenure::NameError| {
            StoreError::new(ErrorKind::Misconfigured, "the lease table holds an invalid name").with_source(e)
        };
        let ms = |v: Option<i64>| v.map(|ms| UNIX_EPOCH + Duration::from_millis(ms.max(0) as u64));
        Ok(Some(LeaseRecord {
            election: election.clone(),
            holder: HolderId::new(self.holder.clone().unwrap_or_default()).map_err(invalid)?,
            token: FencingToken(self.token as u64),
            revision: Revision(self.revision as u64),
            ttl: Duration::from_millis(self.ttl_ms.max(0) as u64),
            acquired_at: ms(self.acquired_ms),
            renewed_at: ms(self.renewed_ms),
            remaining: Some(Duration::from_micros((self.expires_us - self.now_us).max(0) as u64)),
            evicted: self.evicted,
            metadata: self.metadata.clone(),
        }))
    }
}

/// Splits our own `table` parameter off the URL, and reads `mariadb://` as `mysql://`.
fn split_table(url: &str) -> Result<(String, String), StoreError> {
    let url = match url.strip_prefix("mariadb://") {
        Some(rest) => format!("mysql://{rest}"),
        None => url.to_string(),
    };
    let (url, mut ours) = tenure::store::url::take_params(&url, &["table"])
        .map_err(|why| StoreError::invalid(format!("MySQL store URL: {why}")))?;
    let table = ours.remove(0).unwrap_or_else(|| DEFAULT_TABLE.to_string());
    // The change counter's table is named TABLE_seq, within MySQL's 64 characters.
    tenure::store::check_table_name(&table, 60)?;
    Ok((url, table))
}

/// A statement built from our fixed text and the table name, which [`split_table`]
/// restricts to letters, digits and underscores.
fn audited(sql: String) -> sqlx::AssertSqlSafe<String> {
    sqlx::AssertSqlSafe(sql)
}

/// How long a store connection may sit idle inside a transaction before MariaDB ends
/// it (`idle_transaction_timeout`). A process frozen in the middle of a transaction (a
/// paused VM, SIGSTOP, a stalled host) otherwise keeps its election's row, and perhaps
/// the change counter that every write takes, locked until the server's `wait_timeout`
/// (8 hours by default): no candidate could take its elections, and every write to the
/// table would wait. A store's transactions are a few statements sent back to back, idle
/// for milliseconds.
const IDLE_IN_TRANSACTION: Duration = Duration::from_secs(1);

/// How long a statement waits for a row lock (`innodb_lock_wait_timeout`, 50 s by
/// default) before it fails, retryably: longer than [`IDLE_IN_TRANSACTION`], so that a
/// statement queued behind a frozen transaction gets the lock when the server ends it,
/// and short enough that one stuck behind something else does not hold its own locks
/// (a batch holds the change counter) for long.
const LOCK_WAIT: Duration = Duration::from_secs(2);

/// MySQL has no timeout for a transaction left idle; its connections get this
/// `wait_timeout` instead, which ends a connection idle for that long in or out of a
/// transaction (the pool closes idle ones before that).
const IDLE_CONNECTION: Duration = Duration::from_secs(60);

/// Limits how long a store connection can hold locks it no longer uses: see
/// [`IDLE_IN_TRANSACTION`] and [`LOCK_WAIT`]. Run once on every new connection.
async fn limit_lock_holding(conn: &mut sqlx::MySqlConnection) -> Result<(), sqlx::Error> {
    use sqlx::Executor;
    if mutant("mysql-idle-transaction-kept") {
        return Ok(());
    }
    let (idle, wait) = (IDLE_IN_TRANSACTION.as_secs(), LOCK_WAIT.as_secs());
    let mariadb = format!("SET SESSION idle_transaction_timeout = {idle}, SESSION innodb_lock_wait_timeout = {wait}");
    match conn.execute(audited(mariadb)).await {
        // MySQL: no such variable (unknown system variable).
        Err(e) if error_number(&e) == Some(1193) => {
            let idle = IDLE_CONNECTION.as_secs();
            let mysql = format!("SET SESSION wait_timeout = {idle}, SESSION innodb_lock_wait_timeout = {wait}");
            conn.execute(audited(mysql)).await.map(drop)
        }
        other => other.map(drop),
    }
}

/// The server's clock in microseconds (`NOW(6)` is the statement's start).
const NOW_US: &str = "CAST(UNIX_TIMESTAMP(NOW(6)) * 1000000 AS SIGNED)";

impl MysqlStore {
    /// A store for the database `url` names (`mysql://USER:PASSWORD@HOST:PORT/DB`, or
    /// `mariadb://`, plus an optional `table=NAME`). No connection is made yet.
    pub async fn connect(url: &str) -> Result<Self, StoreError> {
        // TLS asks rustls for the process's crypto provider, which it can choose alone
        // only while one is built in (the ZooKeeper client builds in a second): ring, as
        // every store here uses; one installed already stays.
        let _ = rustls::crypto::ring::default_provider().install_default();
        let (url, table) = split_table(url)?;
        let options = MySqlConnectOptions::from_str(&url)
            .map_err(|e| StoreError::new(ErrorKind::Misconfigured, "the MySQL URL is not valid").with_source(e))?
            // A fixed zone: under one with daylight saving, UNIX_TIMESTAMP(NOW()) jumps.
            .timezone(Some(String::from("+00:00")));
        let described = format!(
            "mysql://{}@{}:{}/{} (table {table})",
            options.get_username(),
            options.get_host(),
            options.get_port(),
            options.get_database().unwrap_or("")
        );
        // The ping before each call stays: see the PostgreSQL store (a half-open pooled
        // connection would otherwise hold its pool slot until the kernel gives up on it).
        let pool = MySqlPoolOptions::new()
            .max_connections(4)
            .min_connections(0)
            .acquire_timeout(Duration::from_secs(3))
            // Closed by the pool before a MySQL server's `wait_timeout` (set below) would.
            .idle_timeout(Some(IDLE_CONNECTION - Duration::from_secs(10)))
            .after_connect(|conn, _| Box::pin(limit_lock_holding(conn)))
            .connect_lazy_with(options);
        let inner = Inner { pool, table, described, schema: OnceCell::new(), changes: ChangeHub::new() };
        Ok(Self { inner: Arc::new(inner) })
    }

    /// Creates the lease table and its change counter if they are missing, and adds the
    /// change column to a table made by an earlier version. Every operation does this once.
    pub async fn ensure_schema(&self) -> Result<(), StoreError> {
        self.inner
            .schema
            .get_or_try_init(|| async {
                let t = &self.inner.table;
                let ddl = format!(
                    "CREATE TABLE IF NOT EXISTS {t} (
                        election    VARCHAR(200) CHARACTER SET ascii COLLATE ascii_bin PRIMARY KEY,
                        holder      VARCHAR(200) CHARACTER SET ascii COLLATE ascii_bin NULL,
                        token       BIGINT NOT NULL,
                        revision    BIGINT NOT NULL,
                        ttl_ms      BIGINT NOT NULL,
                        expires_us  BIGINT NOT NULL,
                        acquired_ms BIGINT NULL,
                        renewed_ms  BIGINT NULL,
                        evicted     TINYINT NOT NULL DEFAULT 0,
                        metadata    VARBINARY(4096) NOT NULL,
                        seq         BIGINT NOT NULL DEFAULT 0,
                        INDEX by_seq (seq)
                    ) ENGINE=InnoDB"
                );
                let pool = &self.inner.pool;
                let run = async |sql: String| sqlx::query(audited(sql)).execute(pool).await.map(drop);
                run(ddl).await.map_err(|e| my_error("creating the lease table", e))?;
                let has_seq: i64 = sqlx::query_scalar(
                    "SELECT COUNT(*) FROM information_schema.COLUMNS
                     WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME = ? AND COLUMN_NAME = 'seq'",
                )
                .bind(t)
                .fetch_one(pool)
                .await
                .map_err(|e| my_error("reading the lease table's columns", e))?;
                if has_seq == 0 {
                    let alter =
                        format!("ALTER TABLE {t} ADD COLUMN seq BIGINT NOT NULL DEFAULT 0, ADD INDEX by_seq (seq)");
                    match run(alter).await {
                        // Added by another process meanwhile (duplicate column or key name).
                        Err(e) if matches!(error_number(&e), Some(1060 | 1061)) => {}
                        other => other.map_err(|e| my_error("adding the change column", e))?,
                    }
                }
                run(format!(
                    "CREATE TABLE IF NOT EXISTS {t}_seq (id TINYINT PRIMARY KEY, n BIGINT NOT NULL) ENGINE=InnoDB"
                ))
                .await
                .map_err(|e| my_error("creating the change counter", e))?;
                run(format!("INSERT IGNORE INTO {t}_seq (id, n) VALUES (1, 0)"))
                    .await
                    .map_err(|e| my_error("creating the change counter", e))?;
                // The work ledger (store duty 8) and the counter its versions come from,
                // so that none comes back. Short names: the table's may take 60 of 64.
                run(format!(
                    "CREATE TABLE IF NOT EXISTS {t}_w (
                        election      VARCHAR(200) CHARACTER SET ascii COLLATE ascii_bin NOT NULL,
                        ledger_key    VARCHAR(200) CHARACTER SET ascii COLLATE ascii_bin NOT NULL,
                        value         VARBINARY(1024) NOT NULL,
                        version       BIGINT NOT NULL,
                        keep_until_us BIGINT NOT NULL,
                        PRIMARY KEY (election, ledger_key),
                        INDEX by_keep (keep_until_us)
                    ) ENGINE=InnoDB"
                ))
                .await
                .map_err(|e| my_error("creating the work ledger", e))?;
                run(format!(
                    "CREATE TABLE IF NOT EXISTS {t}_wv (id TINYINT PRIMARY KEY, n BIGINT NOT NULL) ENGINE=InnoDB"
                ))
                .await
                .map_err(|e| my_error("creating the work ledger", e))?;
                Ok(())
            })
            .await
            .map(|_| ())
    }

    /// Locks the election's row and reads it with the server clock; `None` if there is no
    /// row (the locking read then holds a lock on the gap where it would be).
    async fn lock_row(
        &self,
        tx: &mut Transaction<'_, MySql>,
        election: &str,
    ) -> Result<Option<LockedRow>, sqlx::Error> {
        let t = &self.inner.table;
        let select = format!(
            "SELECT holder, token, revision, ttl_ms, expires_us, acquired_ms, renewed_ms, evicted, metadata,
                    {NOW_US} AS now_us
             FROM {t} WHERE election = ? FOR UPDATE"
        );
        let row = sqlx::query(audited(select)).bind(election).fetch_optional(&mut **tx).await?;
        row.as_ref().map(LockedRow::read).transpose()
    }

    /// Makes an empty row for the election (no holder, token 0) if it has none, in a
    /// statement of its own. Made inside the transaction that found no row, the insert
    /// waited on the gap locks of every other transaction that had looked for a missing
    /// row nearby, and they on its: concurrent first acquires of different elections
    /// deadlocked, over and over (the conformance cases run at once).
    async fn create_row(&self, election: &str) -> Result<(), sqlx::Error> {
        let t = &self.inner.table;
        let insert = format!(
            "INSERT IGNORE INTO {t} (election, holder, token, revision, ttl_ms, expires_us, evicted, metadata)
             VALUES (?, NULL, 0, 0, 0, 0, 0, '')"
        );
        sqlx::query(audited(insert)).bind(election).execute(&self.inner.pool).await.map(|_| ())
    }

    /// Runs `f` in a transaction around the locked row; retries deadlocks, which roll back.
    async fn transact<T>(
        &self,
        what: &'static str,
        election: &str,
        f: impl Fn(&LockedRow) -> (Option<Write>, T),
    ) -> Result<(T, Option<LockedRow>), StoreError> {
        self.ensure_schema().await?;
        let mut attempt = 0;
        loop {
            attempt += 1;
            match self.transact_once(election, &f).await {
                Ok(out) => return Ok(out),
                Err(e) if attempt < 4 && is_deadlock(&e) => continue,
                Err(e) => return Err(my_error(what, e)),
            }
        }
    }

    async fn transact_once<T>(
        &self,
        election: &str,
        f: &impl Fn(&LockedRow) -> (Option<Write>, T),
    ) -> Result<(T, Option<LockedRow>), sqlx::Error> {
        let t = &self.inner.table;
        let mut tx = self.inner.pool.begin().await?;
        let row = match self.lock_row(&mut tx, election).await? {
            Some(row) => row,
            None => {
                // Let go of the gap lock before making the row, then lock it.
                tx.rollback().await?;
                self.create_row(election).await?;
                tx = self.inner.pool.begin().await?;
                self.lock_row(&mut tx, election).await?.ok_or(sqlx::Error::RowNotFound)?
            }
        };
        let (write, out) = f(&row);
        let after = match write {
            None => {
                tx.commit().await?;
                None
            }
            Some(w) => {
                let now_ms = row.now_us / 1000;
                self.count_change(&mut tx).await?;
                let q = format!(
                    "UPDATE {t} SET holder = ?, token = ?, revision = ?, ttl_ms = ?, expires_us = ?,
                        acquired_ms = ?, renewed_ms = ?, evicted = ?, metadata = ?, seq = LAST_INSERT_ID()
                     WHERE election = ?"
                );
                let next = LockedRow {
                    holder: w.holder,
                    token: w.token,
                    revision: row.revision + 1,
                    ttl_ms: w.ttl_ms,
                    expires_us: w.expires_us,
                    acquired_ms: w.acquired_ms.or(Some(now_ms)),
                    renewed_ms: if w.renewed { Some(now_ms) } else { row.renewed_ms },
                    evicted: w.evicted,
                    metadata: w.metadata,
                    now_us: row.now_us,
                };
                sqlx::query(audited(q))
                    .bind(&next.holder)
                    .bind(next.token)
                    .bind(next.revision)
                    .bind(next.ttl_ms)
                    .bind(next.expires_us)
                    .bind(next.acquired_ms)
                    .bind(next.renewed_ms)
                    .bind(next.evicted as i8)
                    .bind(&next.metadata)
                    .bind(election)
                    .execute(&mut *tx)
                    .await?;
                tx.commit().await?;
                Some(next)
            }
        };
        Ok((out, after))
    }

    /// Moves the change counter inside `tx`; the rows the transaction writes then take its
    /// new value (`seq = LAST_INSERT_ID()`). The counter's row stays locked until the
    /// transaction ends, so transactions take their numbers in the order they commit: a
    /// reader that has seen number N has seen every change numbered below it.
    ///
    /// Batches take the counter first, before any row: three batches of renewals that
    /// each locked their rows and then waited for the counter deadlocked in the scale
    /// benchmark (1,808 renewals failed after four tries), since a batch's `UPDATE` also
    /// takes locks in the `seq` index. Single-election transactions take it last, after
    /// their one row, so that one that decides not to write does not take it at all; a
    /// deadlock between one of those and a batch is rolled back and retried.
    async fn count_change(&self, tx: &mut Transaction<'_, MySql>) -> Result<(), sqlx::Error> {
        let t = &self.inner.table;
        // An upsert, so that a counter row deleted by hand is made again rather than
        // leaving LAST_INSERT_ID() at an older value.
        let bump = format!(
            "INSERT INTO {t}_seq (id, n) VALUES (1, LAST_INSERT_ID(1)) ON DUPLICATE KEY UPDATE n = LAST_INSERT_ID(n + 1)"
        );
        sqlx::query(audited(bump)).execute(&mut **tx).await.map(drop)
    }

    /// Releases each of `held` that is still exactly that grant, in one transaction: the
    /// change counter first (as every batch does), then the rows, locked and read by one
    /// `SELECT … FOR UPDATE` in election order, checked here, and the matching ones
    /// cleared by one `UPDATE` by key.
    async fn release_all(&self, held: &[LeaseRecord]) -> Result<(), sqlx::Error> {
        let t = &self.inner.table;
        let names = vec!["?"; held.len()].join(", ");
        let lock = format!(
            "SELECT election, holder, token, revision FROM {t} WHERE election IN ({names}) ORDER BY election FOR UPDATE"
        );
        let mut lock = sqlx::query(audited(lock));
        for h in held {
            lock = lock.bind(h.election.as_str());
        }
        let mut tx = self.inner.pool.begin().await?;
        self.count_change(&mut tx).await?;
        let mut rows = std::collections::HashMap::new();
        for r in lock.fetch_all(&mut *tx).await? {
            let key = (
                r.try_get::<Option<String>, _>("holder")?,
                r.try_get::<i64, _>("token")?,
                r.try_get::<i64, _>("revision")?,
            );
            rows.insert(r.try_get::<String, _>("election")?, key);
        }
        let same = |h: &&LeaseRecord| {
            rows.get(h.election.as_str()).is_some_and(|(holder, token, revision)| {
                holder.as_deref() == Some(h.holder.as_str())
                    && *token as u64 == h.token.0
                    && *revision as u64 == h.revision.0
            })
        };
        let mine: Vec<&str> = held.iter().filter(same).map(|h| h.election.as_str()).collect();
        if !mine.is_empty() {
            let marks = vec!["?"; mine.len()].join(", ");
            let update = format!(
                "UPDATE {t} SET holder = NULL, evicted = 0, revision = revision + 1, seq = LAST_INSERT_ID()
                 WHERE election IN ({marks})"
            );
            let mut q = sqlx::query(audited(update));
            for e in &mine {
                q = q.bind(*e);
            }
            q.execute(&mut *tx).await?;
        }
        tx.commit().await
    }

    /// Renews every lease of `held` in one transaction: their rows locked by one
    /// `SELECT … FOR UPDATE`, checked here, and the live ones written by one `UPDATE`.
    async fn renew_all(&self, held: &[LeaseRecord], ttl: Duration) -> Result<Vec<Renew>, sqlx::Error> {
        let t = &self.inner.table;
        let marks = vec!["?"; held.len()].join(", ");
        let select = format!(
            "SELECT election, holder, token, revision, ttl_ms, expires_us, acquired_ms, renewed_ms, evicted, metadata,
                    {NOW_US} AS now_us
             FROM {t} WHERE election IN ({marks}) ORDER BY election FOR UPDATE"
        );
        let mut tx = self.inner.pool.begin().await?;
        // The counter first, as every batch takes it (see `count_change`).
        self.count_change(&mut tx).await?;
        let mut q = sqlx::query(audited(select));
        for h in held {
            q = q.bind(h.election.as_str());
        }
        let mut rows = std::collections::HashMap::new();
        for r in q.fetch_all(&mut *tx).await? {
            rows.insert(r.try_get::<String, _>("election")?, LockedRow::read(&r)?);
        }
        let ttl_ms = ttl.as_millis() as i64;
        // The statement's clock is the same for every row.
        let Some(now_us) = rows.values().next().map(|r| r.now_us) else {
            tx.commit().await?;
            return Ok(held.iter().map(|_| Renew::Lost(None)).collect());
        };
        let mut renewed = Vec::new();
        let mut out = Vec::with_capacity(held.len());
        for h in held {
            let row = rows.get(h.election.as_str());
            let same = row.is_some_and(|r| {
                r.live() && r.holder.as_deref() == Some(h.holder.as_str()) && r.token as u64 == h.token.0 && !r.evicted
            });
            match row {
                Some(r) if same => {
                    let next = LockedRow {
                        revision: r.revision + 1,
                        ttl_ms,
                        expires_us: renewed_expiry(r, ttl_ms),
                        renewed_ms: Some(now_us / 1000),
                        holder: r.holder.clone(),
                        metadata: r.metadata.clone(),
                        ..*r
                    };
                    renewed.push(h.election.as_str());
                    out.push(Ok(next));
                }
                Some(r) => out.push(Err(r.record(&h.election))),
                None => out.push(Err(Ok(None))),
            }
        }
        if !renewed.is_empty() {
            let marks = vec!["?"; renewed.len()].join(", ");
            let update = format!(
                "UPDATE {t} SET revision = revision + 1, ttl_ms = ?, expires_us = GREATEST(expires_us, ?), renewed_ms = ?,
                    seq = LAST_INSERT_ID()
                 WHERE election IN ({marks})"
            );
            let mut q = sqlx::query(audited(update)).bind(ttl_ms).bind(now_us + ttl_ms * 1000).bind(now_us / 1000);
            for e in &renewed {
                q = q.bind(*e);
            }
            q.execute(&mut *tx).await?;
        }
        tx.commit().await?;
        // A record that cannot be built (a hand-edited row) is reported as lost to nobody.
        Ok(held
            .iter()
            .zip(out)
            .map(|(h, o)| match o {
                Ok(next) => match next.record(&h.election) {
                    Ok(Some(rec)) => Renew::Renewed(rec),
                    _ => Renew::Lost(None),
                },
                Err(cur) => Renew::Lost(cur.ok().flatten()),
            })
            .collect())
    }

    async fn read(&self, what: &str, sql: String, arg: &str) -> Result<Vec<(String, LockedRow)>, StoreError> {
        self.ensure_schema().await?;
        let rows =
            sqlx::query(audited(sql)).bind(arg).fetch_all(&self.inner.pool).await.map_err(|e| my_error(what, e))?;
        rows.iter()
            .map(|r| Ok((r.try_get::<String, _>("election")?, LockedRow::read(r)?)))
            .collect::<Result<Vec<_>, sqlx::Error>>()
            .map_err(|e| my_error(what, e))
    }
}

impl MysqlStore {
    /// One try of [`LeaseStore::ledger_write`]: the entry's row locked (made first, empty
    /// and let go, if missing, in a statement of its own as [`Self::lock_row`] explains),
    /// compared, and written with the next number of the ledger's counter.
    async fn ledger_write_once(
        &self,
        election: &str,
        key: &str,
        value: &[u8],
        expected: Option<&str>,
        keep_us: i64,
    ) -> Result<LedgerWrite, sqlx::Error> {
        let t = &self.inner.table;
        let select = format!(
            "SELECT version, CAST(keep_until_us > {NOW_US} AS SIGNED) AS live FROM {t}_w
             WHERE election = ? AND ledger_key = ? FOR UPDATE"
        );
        let lock = async |tx: &mut Transaction<'_, MySql>| {
            sqlx::query(audited(select.clone())).bind(election).bind(key).fetch_optional(&mut **tx).await
        };
        let mut tx = self.inner.pool.begin().await?;
        let row = match lock(&mut tx).await? {
            Some(row) => row,
            None => {
                tx.rollback().await?;
                sqlx::query(audited(format!(
                    "INSERT IGNORE INTO {t}_w (election, ledger_key, value, version, keep_until_us) VALUES (?, ?, '', 0, 0)"
                )))
                .bind(election)
                .bind(key)
                .execute(&self.inner.pool)
                .await?;
                tx = self.inner.pool.begin().await?;
                lock(&mut tx).await?.ok_or(sqlx::Error::RowNotFound)?
            }
        };
        let live: bool = row.try_get::<i64, _>("live")? != 0;
        let current = live.then(|| row.try_get::<i64, _>("version")).transpose()?.map(|v| v.to_string());
        if current.as_deref() != expected {
            tx.rollback().await?;
            return Ok(LedgerWrite::Conflict);
        }
        let counted = sqlx::query(audited(format!(
            "INSERT INTO {t}_wv (id, n) VALUES (1, LAST_INSERT_ID(1)) ON DUPLICATE KEY UPDATE n = LAST_INSERT_ID(n + 1)"
        )))
        .execute(&mut *tx)
        .await?;
        let version = counted.last_insert_id() as i64;
        sqlx::query(audited(format!(
            "UPDATE {t}_w SET value = ?, version = ?, keep_until_us = {NOW_US} + ? WHERE election = ? AND ledger_key = ?"
        )))
        .bind(value)
        .bind(version)
        .bind(keep_us)
        .bind(election)
        .bind(key)
        .execute(&mut *tx)
        .await?;
        tx.commit().await?;
        Ok(LedgerWrite::Written(version.to_string()))
    }
}

/// The expiry a renewal of the live lease in `row` writes: a TTL from the server's clock,
/// but never earlier than the expiry the row has (the store contract). The clock is read
/// when the locking `SELECT` begins, before any wait for the row's lock, and a renewal can
/// commit after its elector stopped waiting for it: a batch of renewals (`Batched`) is sent
/// by a task of its own that goes on after its callers gave up. So a renewal that waited
/// can land behind a later one of the same term, and only this maximum (with the
/// `GREATEST` in the statement) keeps it from moving the expiry earlier.
fn renewed_expiry(row: &LockedRow, ttl_ms: i64) -> i64 {
    row.expires_us.max(row.now_us + ttl_ms * 1000)
}

/// The new state of a row.
struct Write {
    holder: Option<String>,
    token: i64,
    ttl_ms: i64,
    expires_us: i64,
    /// `None`: set to now (a new grant); `Some`: keep.
    acquired_ms: Option<i64>,
    renewed: bool,
    evicted: bool,
    metadata: Vec<u8>,
}

impl Write {
    /// The row as it was, with only these changes.
    fn keep(row: &LockedRow) -> Self {
        Self {
            holder: row.holder.clone(),
            token: row.token,
            ttl_ms: row.ttl_ms,
            expires_us: row.expires_us,
            acquired_ms: row.acquired_ms,
            renewed: false,
            evicted: row.evicted,
            metadata: row.metadata.clone(),
        }
    }
}

fn is_deadlock(e: &sqlx::Error) -> bool {
    matches!(e, sqlx::Error::Database(db) if matches!(db.code().as_deref(), Some("40001")) || db.message().contains("Deadlock"))
}

/// The server's error number, if the server answered with an error.
fn error_number(e: &sqlx::Error) -> Option<u16> {
    match e {
        sqlx::Error::Database(db) => db.try_downcast_ref::<sqlx::mysql::MySqlDatabaseError>().map(|m| m.number()),
        _ => None,
    }
}

/// Maps a driver error to a store error that says whether a retry can help.
fn my_error(what: &str, e: sqlx::Error) -> StoreError {
    let code = error_number(&e);
    let (kind, hint) = match (&e, code) {
        (_, Some(1045 | 1044 | 1698)) => (ErrorKind::Unauthorized, "check the user and password in the store URL"),
        (_, Some(1142 | 1227)) => (ErrorKind::Unauthorized, "the user may not use the lease table"),
        (_, Some(1049)) => (ErrorKind::Misconfigured, "the database in the store URL does not exist"),
        (_, Some(1213 | 1205 | 1040 | 1203)) => (ErrorKind::Unavailable, "the server is busy; retrying"),
        (_, Some(1290 | 1792 | 1836)) => (
            ErrorKind::Unavailable,
            "the server takes no writes now (read-only, a replica after a failover?); retrying",
        ),
        (_, Some(2006 | 2013 | 1927 | 1053)) => {
            (ErrorKind::Ambiguous, "the connection broke; the request may have been applied")
        }
        // What no retry mends: an incompatible schema or statement.
        (_, Some(1054 | 1064 | 1146)) => (ErrorKind::Misconfigured, "the server refused the statement"),
        // Everything else can clear by itself (locks, resources, a full disk): retry.
        (sqlx::Error::Database(_), _) => (ErrorKind::Unavailable, "the server refused for now; retrying"),
        (sqlx::Error::Io(io), _) if io.kind() == std::io::ErrorKind::ConnectionRefused => {
            (ErrorKind::Unavailable, "nothing listens at the store URL's host and port")
        }
        (sqlx::Error::Io(io), _) if io.to_string().contains("lookup address") => {
            (ErrorKind::Unavailable, "the host name in the store URL does not resolve")
        }
        (sqlx::Error::Io(_) | sqlx::Error::Protocol(_), _) => {
            (ErrorKind::Ambiguous, "the connection broke; the request may have been applied")
        }
        (sqlx::Error::PoolTimedOut, _) => (ErrorKind::Unavailable, "no connection to the server could be made in time"),
        (sqlx::Error::Tls(_), _) => (ErrorKind::Misconfigured, "TLS failed; check ssl-mode and certificates"),
        (sqlx::Error::Configuration(_), _) => (ErrorKind::Misconfigured, "the store URL is not valid"),
        _ => (ErrorKind::Unavailable, "retrying"),
    };
    StoreError::new(kind, format!("MySQL: {what} failed ({hint})")).with_source(e)
}

#[async_trait::async_trait]
impl LeaseStore for MysqlStore {
    async fn try_acquire(&self, req: &AcquireRequest) -> Result<Acquire, StoreError> {
        req.validate()?;
        let ttl_ms = req.ttl.as_millis() as i64;
        let holder = req.holder.as_str().to_string();
        let (held, after) = self
            .transact("acquire", req.election.as_str(), |row| {
                let ours = row.live() && row.holder.as_deref() == Some(holder.as_str());
                if row.live() && (!ours || row.evicted) {
                    return (None, true);
                }
                let write = Write {
                    holder: Some(holder.clone()),
                    token: if ours { row.token } else { row.token + 1 },
                    ttl_ms,
                    expires_us: if ours { renewed_expiry(row, ttl_ms) } else { row.now_us + ttl_ms * 1000 },
                    acquired_ms: if ours { row.acquired_ms } else { None },
                    renewed: true,
                    evicted: false,
                    metadata: req.metadata.clone(),
                };
                (Some(write), false)
            })
            .await?;
        if held {
            let cur = self.get(&req.election).await?;
            return match cur {
                Some(c) => Ok(Acquire::Held(c)),
                None => Err(StoreError::unavailable("MySQL: the lease changed hands while it was read; retrying")),
            };
        }
        let rec = after.and_then(|r| r.record(&req.election).transpose()).transpose()?;
        rec.map(Acquire::Acquired).ok_or_else(|| StoreError::ambiguous("MySQL: the new lease could not be read back"))
    }

    async fn renew(&self, held: &LeaseRecord, ttl: Duration) -> Result<Renew, StoreError> {
        check_ttl(ttl)?;
        let ttl_ms = ttl.as_millis() as i64;
        let (ok, after) = self
            .transact("renew", held.election.as_str(), |row| {
                let same = row.live()
                    && row.holder.as_deref() == Some(held.holder.as_str())
                    && row.token as u64 == held.token.0
                    && !row.evicted;
                if !same {
                    return (None, false);
                }
                let w = Write { ttl_ms, expires_us: renewed_expiry(row, ttl_ms), renewed: true, ..Write::keep(row) };
                (Some(w), true)
            })
            .await?;
        if ok {
            let rec = after.and_then(|r| r.record(&held.election).transpose()).transpose()?;
            return rec
                .map(Renew::Renewed)
                .ok_or_else(|| StoreError::ambiguous("MySQL: the renewal could not be read back"));
        }
        Ok(Renew::Lost(self.get(&held.election).await?))
    }

    /// Every renewal in one transaction of two statements, however many there are.
    async fn renew_many(&self, held: &[LeaseRecord], ttl: Duration) -> Vec<Result<Renew, StoreError>> {
        let fail = |e: StoreError| held.iter().map(|_| Err(e.duplicate())).collect();
        if let Err(e) = check_ttl(ttl) {
            return fail(e);
        }
        if held.is_empty() {
            return Vec::new();
        }
        if let Err(e) = self.ensure_schema().await {
            return fail(e);
        }
        let mut attempt = 0;
        loop {
            attempt += 1;
            match self.renew_all(held, ttl).await {
                Ok(v) => return v.into_iter().map(Ok).collect(),
                Err(e) if attempt < 4 && is_deadlock(&e) => continue,
                Err(e) => return fail(my_error("renew", e)),
            }
        }
    }

    async fn release(&self, held: &LeaseRecord) -> Result<(), StoreError> {
        self.transact("release", held.election.as_str(), |row| {
            let same = row.holder.as_deref() == Some(held.holder.as_str())
                && row.token as u64 == held.token.0
                && row.revision as u64 == held.revision.0;
            let w = same.then(|| Write { holder: None, evicted: false, ..Write::keep(row) });
            (w, ())
        })
        .await?;
        Ok(())
    }

    /// One transaction per 2,000 leases, each lease on its own compare.
    async fn release_many(&self, held: &[LeaseRecord]) -> Vec<Result<(), StoreError>> {
        if let Err(e) = self.ensure_schema().await {
            return held.iter().map(|_| Err(e.duplicate())).collect();
        }
        let mut out = Vec::with_capacity(held.len());
        // Well under the server's 65,535 parameters a statement.
        for chunk in held.chunks(2000) {
            let mut attempt = 0;
            let r = loop {
                attempt += 1;
                match self.release_all(chunk).await {
                    Err(e) if attempt < 4 && is_deadlock(&e) => continue,
                    other => break other.map_err(|e| my_error("release", e)),
                }
            };
            out.extend(chunk.iter().map(|_| r.as_ref().map(|_| ()).map_err(StoreError::duplicate)));
        }
        out
    }

    async fn get(&self, election: &ElectionName) -> Result<Option<LeaseRecord>, StoreError> {
        let t = &self.inner.table;
        let sql = format!(
            "SELECT election, holder, token, revision, ttl_ms, expires_us, acquired_ms, renewed_ms, evicted, metadata,
                    {NOW_US} AS now_us FROM {t} WHERE election = ?"
        );
        match self.read("get", sql, election.as_str()).await?.first() {
            Some((_, row)) => row.record(election),
            None => Ok(None),
        }
    }

    async fn list(&self, prefix: &str) -> Result<Vec<LeaseRecord>, StoreError> {
        let t = &self.inner.table;
        let sql = format!(
            "SELECT election, holder, token, revision, ttl_ms, expires_us, acquired_ms, renewed_ms, evicted, metadata,
                    {NOW_US} AS now_us FROM {t}
             WHERE holder IS NOT NULL AND LEFT(election, CHAR_LENGTH(?)) = ? ORDER BY election"
        );
        self.ensure_schema().await?;
        let rows = sqlx::query(audited(sql))
            .bind(prefix)
            .bind(prefix)
            .fetch_all(&self.inner.pool)
            .await
            .map_err(|e| my_error("list", e))?;
        let mut out = Vec::new();
        for r in &rows {
            let name: String = r.try_get("election").map_err(|e| my_error("list", e))?;
            let row = LockedRow::read(r).map_err(|e| my_error("list", e))?;
            if let Ok(e) = ElectionName::new(&name)
                && let Some(rec) = row.record(&e)?
            {
                out.push(rec);
            }
        }
        Ok(out)
    }

    async fn evict(&self, election: &ElectionName, how: Evict) -> Result<Option<LeaseRecord>, StoreError> {
        let (before, _) = self
            .transact("evict", election.as_str(), |row| {
                if !row.live() {
                    return (None, None);
                }
                let before = row.record(election).ok().flatten();
                let w = match how {
                    Evict::Now => Write { holder: None, evicted: false, ..Write::keep(row) },
                    Evict::AfterTerm => Write { evicted: true, ..Write::keep(row) },
                };
                (Some(w), before)
            })
            .await?;
        Ok(before)
    }

    /// Fed by the handle's one change feed, which looks at the change counter every
    /// [`WATCH_INTERVAL`] while anyone watches.
    fn watch(&self, election: &ElectionName) -> Option<WatchStream> {
        Some(self.inner.changes.watch(Arc::new(self.clone()), &self.inner, election, open_feed))
    }

    fn describe(&self) -> String {
        self.inner.described.clone()
    }

    async fn ledger_read(&self, election: &ElectionName, key: &WorkKey) -> Result<Option<LedgerEntry>, StoreError> {
        const WHAT: &str = "reading the work ledger";
        self.ensure_schema().await?;
        let t = &self.inner.table;
        let row = sqlx::query(audited(format!(
            "SELECT value, version FROM {t}_w WHERE election = ? AND ledger_key = ? AND keep_until_us > {NOW_US}"
        )))
        .bind(election.as_str())
        .bind(key.as_str())
        .fetch_optional(&self.inner.pool)
        .await
        .map_err(|e| my_error(WHAT, e))?;
        row.map(|r| {
            Ok(LedgerEntry { value: r.try_get("value")?, version: r.try_get::<i64, _>("version")?.to_string() })
        })
        .transpose()
        .map_err(|e| my_error(WHAT, e))
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
        let t = &self.inner.table;
        // Entries kept past their time go first (not the empty rows a write is about to fill).
        // Housekeeping only: a sweep that fails (chosen as a deadlock's victim beside
        // concurrent writes) is left to the next write.
        if let Err(e) = sqlx::query(audited(format!(
            "DELETE FROM {t}_w WHERE keep_until_us > 0 AND keep_until_us <= {NOW_US} LIMIT 100"
        )))
        .execute(&self.inner.pool)
        .await
        {
            tracing::debug!(error = %e, "sweeping old work-ledger entries failed; the next write tries again");
        }
        let keep_us = keep.as_micros().min(i64::MAX as u128 / 4) as i64;
        let mut attempt = 0;
        loop {
            attempt += 1;
            match self.ledger_write_once(election.as_str(), key.as_str(), value, expected, keep_us).await {
                Ok(out) => return Ok(out),
                // Writes of many keys at once (and the sweep of old entries) deadlock on
                // the index's gap locks now and then; each is rolled back whole. Again
                // after a spread, so that the same writers do not meet again at once.
                Err(e) if attempt < 8 && is_deadlock(&e) => {
                    tokio::time::sleep(Duration::from_millis(fastrand::u64(2..20) * attempt)).await;
                }
                Err(e) => return Err(my_error(WHAT, e)),
            }
        }
    }
}

/// Opens the change feed: from the change counter as it stands (the listener then tells
/// every watcher to read once). Holds no handle on the store.
async fn open_feed(inner: Arc<Inner>) -> Option<Box<dyn tenure::store::ChangeFeed>> {
    let store = MysqlStore { inner };
    let opened = async {
        store.ensure_schema().await?;
        store.counter().await.map_err(|e| my_error("reading the change counter", e))
    };
    match opened.await {
        Ok(cursor) => {
            let inner = &store.inner;
            let (pool, table, hub) = (inner.pool.clone(), inner.table.clone(), inner.changes.clone());
            Some(Box::new(Changes { pool, table, hub, cursor, queue: Default::default() }))
        }
        Err(e) => {
            tracing::debug!(error = %e, "the MySQL change feed could not start; retrying");
            None
        }
    }
}

impl MysqlStore {
    /// The change counter as it stands.
    async fn counter(&self) -> Result<i64, sqlx::Error> {
        counter(&self.inner.pool, &self.inner.table).await
    }
}

async fn counter(pool: &MySqlPool, table: &str) -> Result<i64, sqlx::Error> {
    sqlx::query_scalar(audited(format!("SELECT n FROM {table}_seq WHERE id = 1"))).fetch_one(pool).await
}

/// The change feed of one store handle: every [`WATCH_INTERVAL`], while anyone watches,
/// one look at the change counter; when it moved, one read of the rows changed since.
struct Changes {
    pool: MySqlPool,
    table: String,
    hub: ChangeHub,
    /// Every change numbered up to here has been told.
    cursor: i64,
    /// Changes read and not yet handed to the listener.
    queue: std::collections::VecDeque<Change>,
}

impl Changes {
    /// Reads the rows changed since the cursor, if the counter moved. A read that fails
    /// or is dropped leaves the cursor where it was, so it is read again next time.
    async fn look(&mut self) -> Result<(), sqlx::Error> {
        let n = counter(&self.pool, &self.table).await?;
        if n == self.cursor {
            return Ok(());
        }
        if n < self.cursor {
            // The counter went back (its row was deleted and made again): numbers below
            // the cursor mean nothing now. Every watcher reads once; count from here.
            self.cursor = n;
            self.queue.push_back(Change::Everything);
            return Ok(());
        }
        // Up to `n` only: every change numbered up to the counter as read has committed,
        // and the cursor never passes the counter (rows stamped before a reset can carry
        // higher numbers; they are read again as the counter passes them).
        let t = &self.table;
        let select = format!(
            "SELECT election, holder, token, revision, ttl_ms, expires_us, acquired_ms, renewed_ms, evicted, metadata,
                    {NOW_US} AS now_us, seq
             FROM {t} WHERE seq > ? AND seq <= ? ORDER BY seq"
        );
        let rows = sqlx::query(audited(select)).bind(self.cursor).bind(n).fetch_all(&self.pool).await?;
        for r in &rows {
            let name: String = r.try_get("election")?;
            // A row whose name no longer validates (hand-edited) is nobody's election.
            let Ok(election) = ElectionName::new(&name) else { continue };
            let change = match LockedRow::read(r)?.record(&election) {
                Ok(rec) => Change::now(election.as_str(), rec),
                Err(_) => Change::read_again(election.as_str()),
            };
            self.queue.push_back(change);
        }
        self.cursor = n;
        Ok(())
    }
}

#[async_trait::async_trait]
impl tenure::store::ChangeFeed for Changes {
    async fn next(&mut self) -> Option<Change> {
        loop {
            if let Some(c) = self.queue.pop_front() {
                return Some(c);
            }
            tokio::time::sleep(WATCH_INTERVAL).await;
            // Nobody watches: no query.
            if self.hub.prune() == 0 {
                continue;
            }
            if let Err(e) = self.look().await {
                // The cursor still stands: nothing is missed, only told later.
                tracing::debug!(error = %e, "the MySQL change feed could not read; retrying");
            }
        }
    }
}

use tenure::mutant;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_and_table_names() {
        let (url, t) = split_table("mariadb://u:p@h/db?table=leases&ssl-mode=disabled").unwrap();
        assert_eq!((url.as_str(), t.as_str()), ("mysql://u:p@h/db?ssl-mode=disabled", "leases"));
        assert_eq!(split_table("mysql://h/db?table=a-b").unwrap_err().kind(), ErrorKind::Invalid);
    }

    /// A process frozen in the middle of a store transaction (a paused VM, SIGSTOP, a
    /// stalled host) leaves its connection idle on the server with the election's row
    /// and the change counter locked. The server must end that transaction soon: until
    /// it does, no candidate can take the election, and every write to the table waits.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_transaction_left_open_by_a_frozen_process_does_not_hold_its_row() {
        use tenure::store::{Acquire, AcquireRequest};
        use tenure_testkit::servers::{self, Kind};
        let Some(server) = servers::launch(Kind::MariaDb) else { return };
        let frozen = MysqlStore::connect(&server.url()).await.unwrap();
        let other = MysqlStore::connect(&server.url()).await.unwrap();
        let name = ElectionName::new("frozen/row").unwrap();
        let ttl = Duration::from_secs(1);
        let req = |h: &str| AcquireRequest::new(name.clone(), HolderId::new(h).unwrap(), ttl);
        assert!(matches!(frozen.try_acquire(&req("a")).await.unwrap(), Acquire::Acquired(_)));
        // A renewal that has locked the row and moved the change counter when its process
        // freezes: nothing more is sent on its connection.
        let mut tx = frozen.inner.pool.begin().await.unwrap();
        frozen.lock_row(&mut tx, name.as_str()).await.unwrap();
        frozen.count_change(&mut tx).await.unwrap();
        // The other candidate campaigns as the runtime does: each try given up on after a
        // request timeout, then tried again.
        let t0 = std::time::Instant::now();
        let limit = ttl + IDLE_IN_TRANSACTION + Duration::from_secs(5);
        loop {
            let tried = tokio::time::timeout(Duration::from_millis(500), other.try_acquire(&req("b"))).await;
            if let Ok(Ok(Acquire::Acquired(_))) = tried {
                break;
            }
            assert!(
                t0.elapsed() < limit,
                "the election was not taken within {limit:?} of its holder freezing mid-transaction \
                 (TTL {ttl:?}); the last try: {tried:?}"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        // The frozen transaction was ended by the server: it can commit nothing.
        assert!(tx.commit().await.is_err(), "the frozen transaction outlived the takeover");
    }
}
