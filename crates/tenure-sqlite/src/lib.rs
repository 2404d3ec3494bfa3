//! SQLite lease store for tenure: the embedded default.
//!
//! Several processes on **one host** share one database file. Every decision is one
//! `BEGIN IMMEDIATE` transaction; expiry is judged inside it on the host's
//! monotonic clock (`CLOCK_MONOTONIC`, one clock for every process on the host, which
//! NTP cannot step), tagged with the kernel's boot id so that records written before a
//! reboot count as expired. Fencing tokens live in the table, in a row that is never
//! deleted, so they keep growing across release, eviction, expiry and restarts.
//!
//! A database on a network file system is refused: SQLite's locking is not safe there,
//! and the processes would not share a clock.
//!
//! ```no_run
//! # async fn t() -> Result<(), Box<dyn std::error::Error>> {
//! let store = tenure_sqlite::SqliteStore::open("/var/lib/myapp/tenure.db").await?;
//! let elector = tenure::Elector::builder(std::sync::Arc::new(store), "myapp/sweeper").build()?;
//! # Ok(()) }
//! ```

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, LazyLock};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use rusqlite::{Connection, ErrorCode, OptionalExtension, TransactionBehavior, params};
use tenure::store::{
    Acquire, AcquireRequest, LedgerEntry, LedgerWrite, Renew, Revision, WatchStream, check_ledger_value, check_ttl,
};
use tenure::store::{Change, ChangeHub};
use tenure::{ElectionName, ErrorKind, Evict, FencingToken, HolderId, LeaseRecord, LeaseStore, StoreError, WorkKey};

const SCHEMA_VERSION: i64 = 2;

const SCHEMA: &str = "
CREATE TABLE IF NOT EXISTS tenure_leases (
    election     TEXT PRIMARY KEY NOT NULL,
    holder       TEXT,
    token        INTEGER NOT NULL,
    revision     INTEGER NOT NULL,
    ttl_ms       INTEGER NOT NULL,
    boot_id      TEXT NOT NULL,
    expires_ns   INTEGER NOT NULL,
    acquired_ms  INTEGER,
    renewed_ms   INTEGER,
    evicted      INTEGER NOT NULL DEFAULT 0,
    metadata     BLOB NOT NULL
) WITHOUT ROWID;
";

/// Version 2: every row carries `seq`, the database-wide order of its last change, drawn
/// from the one-row counter `tenure_seq` by triggers (so that every writer keeps it, and a
/// row replaced by a new grant still moves forward). The watch thread reads the rows whose
/// `seq` passed its cursor and tells the watchers of those elections only.
/// Every step may run again (the `seq` column is added apart, when missing): an older
/// tenure that created the file at the same moment may have set the version back to 1.
const SCHEMA_2: &str = "
CREATE INDEX IF NOT EXISTS tenure_leases_seq ON tenure_leases (seq);
CREATE TABLE IF NOT EXISTS tenure_seq (n INTEGER NOT NULL);
INSERT INTO tenure_seq (n) SELECT 0 WHERE NOT EXISTS (SELECT 1 FROM tenure_seq);
CREATE TRIGGER IF NOT EXISTS tenure_leases_seq_insert AFTER INSERT ON tenure_leases BEGIN
    UPDATE tenure_seq SET n = n + 1;
    UPDATE tenure_leases SET seq = (SELECT n FROM tenure_seq) WHERE election = NEW.election;
END;
CREATE TRIGGER IF NOT EXISTS tenure_leases_seq_update
AFTER UPDATE OF holder, token, revision, ttl_ms, boot_id, expires_ns, evicted, metadata ON tenure_leases BEGIN
    UPDATE tenure_seq SET n = n + 1;
    UPDATE tenure_leases SET seq = (SELECT n FROM tenure_seq) WHERE election = NEW.election;
END;
";

/// The work ledger (store duty 8), made when it is first written to rather than by a
/// schema version, so that a tenure that knows nothing of it still opens the database.
/// `version` comes from a counter of its own, so that it never comes back for a key, not
/// even after a row let go is written anew; `keep_until_ms` is on the wall clock: entries
/// are kept for days, and must outlive a reboot (which ends every lease).
const LEDGER_SCHEMA: &str = "
CREATE TABLE IF NOT EXISTS tenure_work (
    election      TEXT NOT NULL,
    key           TEXT NOT NULL,
    value         BLOB NOT NULL,
    version       INTEGER NOT NULL,
    keep_until_ms INTEGER NOT NULL,
    PRIMARY KEY (election, key)
) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS tenure_work_keep ON tenure_work (keep_until_ms);
CREATE TABLE IF NOT EXISTS tenure_work_seq (n INTEGER NOT NULL);
INSERT INTO tenure_work_seq (n) SELECT 0 WHERE NOT EXISTS (SELECT 1 FROM tenure_work_seq);
";

const COLUMNS: &str =
    "election, holder, token, revision, ttl_ms, boot_id, expires_ns, acquired_ms, renewed_ms, evicted, metadata";

/// Options for [`SqliteStore::open_with`].
#[derive(Clone, Debug)]
pub struct SqliteOptions {
    /// How long a writer waits for another process's transaction before the request
    /// fails as retryable ("database is locked"). Default 2 s.
    pub busy_timeout: Duration,
    /// How often a watch checks the database for changes by other connections. Default 20 ms.
    pub watch_interval: Duration,
}

impl Default for SqliteOptions {
    fn default() -> Self {
        Self { busy_timeout: Duration::from_secs(2), watch_interval: Duration::from_millis(20) }
    }
}

/// A lease store in one SQLite database file, shared by the processes of one host.
#[derive(Clone)]
pub struct SqliteStore {
    inner: Arc<Inner>,
}

struct Inner {
    path: PathBuf,
    /// Work for the connection's thread, which owns the store's connection and runs one
    /// job at a time (a connection serves one transaction at a time anyway). One thread,
    /// where a blocking-pool task per call parked a thread per waiting call: hundreds of
    /// threads, and their stacks, when thousands of elections start or stop at once.
    jobs: std::sync::mpsc::Sender<Job>,
    boot_id: String,
    options: SqliteOptions,
    changes: ChangeHub,
    poller: AtomicBool,
    /// The database's wake-up file (`NAME-wake` beside it), written after each commit that
    /// changed a row, so that watch threads in every process wake when the commit is
    /// already visible; None
    /// where it cannot be opened (the watches then find commits by looking again).
    wake: Option<std::fs::File>,
    /// How releases are committed: see [`release_durability`].
    release_durability: Durability,
    /// The files the connection has open, as the connection's thread last opened them: a
    /// grant committed while the path named another file (or another log) was made in a
    /// database nobody else reads.
    opened: std::sync::Mutex<Opened>,
    /// The connection's log or shared memory went under it (see [`Opened::log_lost`]):
    /// every call fails from then on.
    log_lost: AtomicBool,
    /// How many times the database was deleted or replaced under this store: each keeps
    /// the old file's connection open for good (see [`Opened`]), so past
    /// [`MAX_REPLACEMENTS`] every call fails instead, before the process runs out of
    /// descriptors.
    replacements: std::sync::atomic::AtomicU32,
    /// The highest change count (`tenure_seq`) this store's transactions have seen in the
    /// file it has open (-1 before the first): one lower later means the file was rolled
    /// back in place (a backup restored into it), see [`notice_rollback`].
    seq_seen: std::sync::atomic::AtomicI64,
    /// The file's incarnation (a random id kept in it, `tenure_incarnation`) as this
    /// store's transactions last saw it: another one means the file's content was replaced
    /// in place by that of another file (a backup of an earlier database restored into it).
    incarnation: std::sync::Mutex<Option<String>>,
    /// The highest token this store has read or been granted in the file it has open:
    /// the floor it gives a file found rolled back (see [`notice_rollback`]).
    token_seen: std::sync::atomic::AtomicI64,
    /// The longest TTL (ns) this store has been asked for: how long a rollback's mark
    /// withholds.
    longest_ttl_ns: std::sync::atomic::AtomicI64,
    /// Why the database at the path could not be opened again after it was replaced (the
    /// call that found it fails with this).
    reopen_error: std::sync::Mutex<Option<String>>,
    /// The elections this store may hold a lease of, and a shared lock on the database's
    /// directory kept while there is one: see [`a_leader_may_live`] and [`mark_withheld`].
    leading: std::sync::Mutex<Leading>,
    /// Tests only: what each transaction was, and the `synchronous` level it ran with.
    #[cfg(test)]
    levels: std::sync::Mutex<Vec<(&'static str, i64)>>,
}

/// What [`Inner::leading`] keeps.
#[derive(Default)]
struct Leading {
    /// The elections this store may hold a lease of: `None` while it may hold it now,
    /// `Some(t)` for one lost, whose command may run until `t` at the latest.
    elections: std::collections::HashMap<String, Option<std::time::Instant>>,
    lock: Option<std::fs::File>,
    /// Someone else holds the directory exclusively for longer than a moment (another
    /// user can lock a directory it may read): said once, and grants go on without it.
    said_locked: bool,
}

/// See [`Inner::settle`].
enum Holds {
    Now,
    Until(Duration),
    Not,
}

impl Inner {
    /// Takes the shared lock on the database's directory before a grant may be made
    /// (kept while this store may hold a lease), so that a process that makes the
    /// database anew meanwhile knows a leader may live.
    fn lock_for_grant(&self) {
        self.take_lock(200);
    }

    /// Takes the directory's lock, if this store may hold a lease and goes without it (it
    /// was refused when the lease was granted: someone held the directory for a while),
    /// with one try: a renewal is not held up by it.
    fn lock_again(&self) {
        let wanted = {
            let l = self.leading.lock().unwrap_or_else(|e| e.into_inner());
            l.lock.is_none() && !l.elections.is_empty()
        };
        if wanted {
            self.take_lock(1);
        }
    }

    /// Takes the shared lock on the database's directory, trying `tries` times a
    /// millisecond apart while another process holds it exclusively.
    fn take_lock(&self, tries: u32) {
        let mut l = self.leading.lock().unwrap_or_else(|e| e.into_inner());
        if l.lock.is_some() {
            return;
        }
        let dir = lock_dir(&self.path);
        let Ok(file) = std::fs::File::open(&dir) else {
            // A directory this user may not read: nobody can check it either.
            return;
        };
        // tenure holds it exclusively only for the moment a new file is checked; longer is
        // someone else's doing, and must not stop elections: they go on without the lock
        // (a database made anew meanwhile is then protected only by the processes that
        // had the old one open).
        for _ in 0..tries {
            match rustix::fs::flock(&file, rustix::fs::FlockOperation::NonBlockingLockShared) {
                Ok(()) => {
                    l.lock = Some(file);
                    return;
                }
                Err(rustix::io::Errno::WOULDBLOCK | rustix::io::Errno::INTR) => {
                    std::thread::sleep(Duration::from_millis(1));
                }
                Err(_) => return,
            }
        }
        if !std::mem::replace(&mut l.said_locked, true) {
            tracing::warn!(dir = %dir.display(), "the database's directory is locked by another process; electing without its lock");
        }
    }

    /// Notes whether this store may still hold a lease of `election`: `Holds::Now`, or
    /// `Holds::Until(ttl)` for one just lost (its command may still be stopping: the lock
    /// stays one TTL more), or `Holds::Not` for one released or never granted. With none
    /// left, the directory lock goes.
    fn settle(&self, election: &str, holds: Holds) {
        let mut l = self.leading.lock().unwrap_or_else(|e| e.into_inner());
        let now = std::time::Instant::now();
        match holds {
            Holds::Now => {
                l.elections.insert(election.to_string(), None);
            }
            Holds::Until(ttl) => {
                l.elections.insert(election.to_string(), Some(now + ttl));
            }
            Holds::Not => {
                if l.elections.get(election).is_some_and(Option::is_none) {
                    l.elections.remove(election);
                }
            }
        }
        l.elections.retain(|_, until| until.is_none_or(|t| t > now));
        if l.elections.is_empty() {
            l.lock = None;
        }
    }

    /// Notes a token read or granted in the file open now.
    fn saw_token(&self, token: u64) {
        self.token_seen.fetch_max(i64::try_from(token).unwrap_or(i64::MAX), Ordering::SeqCst);
    }

    /// Tells the watch threads on this database that a commit is visible now.
    fn announce(&self) {
        use std::os::unix::fs::FileExt;
        if let Some(f) = &self.wake {
            let _ = f.write_at(b"\n", 0);
        }
    }
}

/// The wake-up file of the database at `path`: its name starts with the database's, so
/// the watch threads' inotify filter takes its writes for the database's.
fn wake_file(path: &Path) -> Option<std::fs::File> {
    let mut name = path.as_os_str().to_owned();
    name.push("-wake");
    use std::os::unix::fs::OpenOptionsExt;
    // 0600 whatever the umask, and never through a symbolic link.
    // Never blocking on a FIFO planted at the name, and only a regular file of this user's.
    let opened = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(false)
        .mode(0o600)
        .custom_flags((rustix::fs::OFlags::NOFOLLOW | rustix::fs::OFlags::NONBLOCK).bits() as i32)
        .open(&name)
        .and_then(|f| {
            use std::os::unix::fs::MetadataExt;
            let m = f.metadata()?;
            if m.is_file() && m.uid() == rustix::process::geteuid().as_raw() {
                Ok(f)
            } else {
                Err(std::io::Error::other("not a regular file of this user's"))
            }
        });
    match opened {
        Ok(f) => Some(f),
        Err(e) => {
            tracing::debug!(error = %e, file = ?name, "no wake-up file; SQLite watches find commits by looking again");
            None
        }
    }
}

impl SqliteStore {
    /// Opens (creating if needed) the database at `path` with default options.
    pub async fn open(path: impl AsRef<Path>) -> Result<Self, StoreError> {
        Self::open_with(path, SqliteOptions::default()).await
    }

    /// Opens (creating if needed) the database at `path`.
    pub async fn open_with(path: impl AsRef<Path>, options: SqliteOptions) -> Result<Self, StoreError> {
        let path = path.as_ref().to_path_buf();
        tokio::task::spawn_blocking(move || Self::open_blocking(path, options))
            .await
            .map_err(|e| StoreError::unavailable("the open task failed").with_source(e))?
    }

    fn open_blocking(path: PathBuf, options: SqliteOptions) -> Result<Self, StoreError> {
        check_file_system(&path)?;
        // Before SQLite opens it: a second name would get a log of its own.
        check_one_name(&path)?;
        let conn = connect(&path, &options)?;
        let version: i64 = retry_busy(&options, || conn.query_row("PRAGMA user_version", [], |r| r.get(0)))
            .map_err(|e| sql_error(&path, "reading the schema version", e))?;
        // Read once: the log and shared-memory files exist now.
        let opened = Opened::at(&path);
        if version > SCHEMA_VERSION {
            return Err(StoreError::new(
                ErrorKind::Misconfigured,
                format!(
                    "{} has lease schema version {version}, written by a newer tenure; this one knows version {SCHEMA_VERSION}",
                    path.display()
                ),
            ));
        }
        // Only a new or older database is written to: opening one that is in use takes no
        // write lock.
        if version < SCHEMA_VERSION {
            retry_busy(&options, || migrate(&conn, &path, None))
                .map_err(|e| sql_error(&path, "creating the lease table", e))?;
        }
        let wake = wake_file(&path);
        let (jobs, queue) = std::sync::mpsc::channel();
        let boot_id = boot_id();
        let wal = conn
            .query_row("PRAGMA journal_mode", [], |r| r.get::<_, String>(0))
            .is_ok_and(|m| m.eq_ignore_ascii_case("wal"));
        let release_durability = release_durability(wal, &boot_id);
        let inner = Arc::new(Inner {
            path,
            jobs,
            boot_id,
            options,
            changes: ChangeHub::new(),
            poller: AtomicBool::new(false),
            wake,
            release_durability,
            opened: std::sync::Mutex::new(opened),
            log_lost: AtomicBool::new(false),
            replacements: Default::default(),
            seq_seen: std::sync::atomic::AtomicI64::new(-1),
            incarnation: Default::default(),
            token_seen: Default::default(),
            longest_ttl_ns: Default::default(),
            reopen_error: Default::default(),
            leading: Default::default(),
            #[cfg(test)]
            levels: Default::default(),
        });
        let weak = Arc::downgrade(&inner);
        std::thread::Builder::new()
            .name("tenure-sqlite".into())
            .spawn(move || serve(conn, &weak, &queue))
            .map_err(|e| StoreError::unavailable("could not start the SQLite connection's thread").with_source(e))?;
        Ok(Self { inner })
    }

    /// The database file.
    pub fn path(&self) -> &Path {
        &self.inner.path
    }

    /// Runs `f` on the connection, in the connection's thread. A call whose caller has
    /// given up (it timed out while the job waited for the connection) is skipped, so
    /// stale requests do not pile up and land late.
    async fn with_conn<T: Send + 'static>(
        &self,
        what: &'static str,
        f: impl FnOnce(&mut Connection, &Inner) -> rusqlite::Result<T> + Send + 'static,
    ) -> Result<T, StoreError> {
        if let Some(e) = final_error(&self.inner) {
            return Err(e);
        }
        let (tx, rx) = tokio::sync::oneshot::channel();
        let job: Job = Box::new(move |conn, inner| {
            if tx.is_closed() {
                return;
            }
            let _ = tx.send(f(conn, inner).map_err(|e| sql_error(&inner.path, what, e)));
        });
        self.inner
            .jobs
            .send(job)
            .map_err(|_| StoreError::unavailable(format!("{what}: the SQLite connection's thread has stopped")))?;
        rx.await.map_err(|_| {
            if let Some(e) = final_error(&self.inner) {
                return e;
            }
            match self.inner.reopen_error.lock().unwrap_or_else(|p| p.into_inner()).clone() {
                Some(why) => StoreError::unavailable(format!(
                    "{what}: {} was deleted or replaced, and cannot be opened again: {why}",
                    self.inner.path.display()
                )),
                None => StoreError::unavailable(format!("{what}: the database task failed")),
            }
        })?
    }

    /// Runs `f` in one `BEGIN IMMEDIATE` transaction with the store clock read inside it,
    /// committed to the disk before it answers.
    async fn transact<T: Send + 'static>(
        &self,
        what: &'static str,
        f: impl FnOnce(&rusqlite::Transaction<'_>, Now<'_>) -> rusqlite::Result<T> + Send + 'static,
    ) -> Result<T, StoreError> {
        self.transact_with(what, Durability::Full, f).await
    }

    /// [`transact`](Self::transact), with the commit synced as `durability` says. The setting is
    /// made before every transaction, not restored after one, so that no path (an error, a
    /// panic in a job) can leave a later grant unsynced.
    async fn transact_with<T: Send + 'static>(
        &self,
        what: &'static str,
        durability: Durability,
        f: impl FnOnce(&rusqlite::Transaction<'_>, Now<'_>) -> rusqlite::Result<T> + Send + 'static,
    ) -> Result<T, StoreError> {
        self.with_conn(what, move |conn, inner| {
            conn.prepare_cached(durability.pragma())?.execute([])?;
            let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
            #[cfg(test)]
            {
                let level = tx.query_row("PRAGMA synchronous", [], |r| r.get::<_, i64>(0))?;
                inner.levels.lock().unwrap().push((what, level));
            }
            let now = Now { ns: monotonic_ns(), boot_id: &inner.boot_id };
            notice_rollback(&tx, inner)?;
            let before = tx.total_changes();
            let out = f(&tx, now)?;
            // A transaction that changed nothing (a refusal, a release of a lease already
            // gone) wakes nobody.
            let wrote = tx.total_changes() != before;
            let seq: i64 = tx.query_row("SELECT n FROM tenure_seq", [], |r| r.get(0))?;
            tx.commit()?;
            inner.seq_seen.fetch_max(seq, Ordering::SeqCst);
            if wrote {
                inner.announce();
            }
            Ok(out)
        })
        .await
    }

    /// The grant itself, in the file the connection has open; `Err(left)` when the file
    /// withholds grants for `left` more (see [`a_leader_may_live`] and [`mark_withheld`]).
    async fn acquire_in_file(&self, req: AcquireRequest) -> Result<Result<Acquire, Duration>, StoreError> {
        self.transact("acquire", move |tx, now| {
            let e = req.election.as_str();
            let row = select_row(tx, e)?;
            let expires = now.ns.saturating_add(ttl_ns(req.ttl));
            let ttl_ms = req.ttl.as_millis() as i64;
            match row.as_ref().and_then(|r| r.live(now)) {
                Some(cur) if cur.holder != req.holder || cur.evicted => return Ok(Ok(Acquire::Held(cur))),
                Some(_) => {
                    // This holder's own record, in a file that withholds: one brought back
                    // by a restored backup, whose term ended when another began.
                    if let Some(left) = withheld(tx, now, req.ttl)? {
                        return Ok(Err(left));
                    }
                    exec(
                        tx,
                        "UPDATE tenure_leases SET revision = revision + 1, ttl_ms = ?2, expires_ns = ?3,
                         renewed_ms = ?4, metadata = ?5 WHERE election = ?1",
                        params![e, ttl_ms, expires, wall_ms(), req.metadata],
                    )?;
                }
                None => {
                    if let Some(left) = withheld(tx, now, req.ttl)? {
                        return Ok(Err(left));
                    }
                    // A row whose counters cannot go on (written by hand, or corrupted) is
                    // refused, never wrapped or panicked on: tokens only grow, from 1.
                    // At least the wall clock's microseconds, as a first token is (a
                    // database restored from a backup goes on above every token granted
                    // since the backup), and above the floor a process that had the file
                    // before this one open left (see `Carried`).
                    let least = first_token().max(floor(tx)?.saturating_add(1));
                    let (token, revision) = match row {
                        Some(r) => r
                            .token
                            .checked_add(1)
                            .filter(|t| *t > 0)
                            .map(|t| t.max(least))
                            .zip(r.revision.checked_add(1))
                            .ok_or(rusqlite::Error::IntegralValueOutOfRange(0, r.token))?,
                        None => (least, 1),
                    };
                    exec(
                        tx,
                        &INSERT_ROW,
                        params![
                            e,
                            req.holder.as_str(),
                            token,
                            revision,
                            ttl_ms,
                            now.boot_id,
                            expires,
                            wall_ms(),
                            req.metadata
                        ],
                    )?;
                }
            }
            Ok(Ok(Acquire::Acquired(reread(tx, e, now)?)))
        })
        .await
    }

    fn ensure_poller(&self) {
        if !self.inner.poller.swap(true, Ordering::SeqCst) {
            let inner = self.inner.clone();
            std::thread::Builder::new()
                .name("tenure-sqlite-watch".into())
                .spawn(move || poll_changes(&inner))
                .map_err(|e| tracing::warn!(error = %e, "could not start the SQLite watch thread"))
                .ok();
        }
    }
}

/// Renews `held` inside `tx` if it is still the same live, unevicted grant.
fn renew_in(
    tx: &rusqlite::Transaction<'_>,
    held: &LeaseRecord,
    ttl: Duration,
    now: Now<'_>,
) -> rusqlite::Result<Renew> {
    let e = held.election.as_str();
    let cur = select_row(tx, e)?.and_then(|r| r.live(now));
    // A file that withholds grants holds no term anyone may go on with: a record live in
    // it came back with a restored backup (its term ended when another began).
    if withheld(tx, now, ttl)?.is_some() {
        return Ok(Renew::Lost(cur));
    }
    match cur {
        Some(c) if c.holder == held.holder && c.token == held.token && !c.evicted => {
            exec(
                tx,
                "UPDATE tenure_leases SET revision = revision + 1, ttl_ms = ?2, expires_ns = ?3, renewed_ms = ?4
                 WHERE election = ?1",
                params![e, ttl.as_millis() as i64, now.ns.saturating_add(ttl_ns(ttl)), wall_ms()],
            )?;
            Ok(Renew::Renewed(reread(tx, e, now)?))
        }
        other => Ok(Renew::Lost(other)),
    }
}

/// How a transaction's commit reaches the disk.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Durability {
    /// Synced before the call answers (`synchronous = FULL`): grants, renewals, evictions.
    /// A grant lost to a power failure would let its token be handed out again.
    Full,
    /// Visible to every connection at once, and synced with the next synced commit on this
    /// database (`synchronous = NORMAL`: the write-ahead log is one file, written in order,
    /// so syncing a later commit syncs this one too). For releases only, where
    /// [`release_durability`] allows it. Only a crash of the operating system (or a power
    /// failure) loses such a commit, and after the reboot every lease of the old boot is
    /// over anyway (deadlines are on the boot's own clock, tagged with its id); a release
    /// changes no token; and a grant that followed the release, synced, made the release
    /// durable too. A handover then waits for one write to the disk (the successor's
    /// grant), not two. The one exception, recorded in docs/stores/internals.md: a disk that
    /// fails to write a release's pages back fails the next synced commit once, its retry
    /// succeeds, and a crash before the next checkpoint can then lose that grant.
    Visible,
}

/// How releases are committed on a database in WAL mode or not (`wal`), on a host whose
/// boot id reads `boot_id`: unsynced only when the log is one file written in order and the
/// boot id is a real one (a kernel's random UUID), so that a reboot ends every lease that
/// a lost release could bring back.
fn release_durability(wal: bool, boot_id: &str) -> Durability {
    let uuid = boot_id.len() == 36
        && boot_id
            .char_indices()
            .all(|(i, c)| if matches!(i, 8 | 13 | 18 | 23) { c == '-' } else { c.is_ascii_hexdigit() });
    if wal && uuid { Durability::Visible } else { Durability::Full }
}

impl Durability {
    fn pragma(self) -> &'static str {
        match self {
            Durability::Full => "PRAGMA synchronous = FULL",
            Durability::Visible => "PRAGMA synchronous = NORMAL",
        }
    }
}

/// Clears `held` inside `tx` if it is still exactly that grant (holder, token, revision).
fn release_in(tx: &rusqlite::Transaction<'_>, held: &LeaseRecord) -> rusqlite::Result<()> {
    exec(
        tx,
        "UPDATE tenure_leases SET holder = NULL, evicted = 0, revision = revision + 1
         WHERE election = ?1 AND holder = ?2 AND token = ?3 AND revision = ?4",
        params![held.election.as_str(), held.holder.as_str(), held.token.0 as i64, held.revision.0 as i64],
    )?;
    Ok(())
}

/// The store clock as read inside a transaction.
#[derive(Clone, Copy)]
struct Now<'a> {
    ns: i64,
    boot_id: &'a str,
}

/// One row of the lease table.
struct Row {
    election: String,
    holder: Option<String>,
    token: i64,
    revision: i64,
    ttl_ms: i64,
    boot_id: String,
    expires_ns: i64,
    acquired_ms: Option<i64>,
    renewed_ms: Option<i64>,
    evicted: bool,
    metadata: Vec<u8>,
}

impl Row {
    fn read(r: &rusqlite::Row<'_>) -> rusqlite::Result<Self> {
        // Counters are never negative as this crate writes them: one that is (written by
        // hand, or corrupted) makes the row unreadable, not a token of 18446744073709551615.
        // The errors carry the columns `sql_error` names: 0 for the token (as the grant's
        // refusal of a token that cannot grow does), 3 and 4 for the others.
        let counter = |i: usize, err_col: usize| -> rusqlite::Result<i64> {
            let v: i64 = r.get(i)?;
            if v < 0 { Err(rusqlite::Error::IntegralValueOutOfRange(err_col, v)) } else { Ok(v) }
        };
        Ok(Self {
            election: r.get(0)?,
            holder: r.get(1)?,
            token: counter(2, 0)?,
            revision: counter(3, 3)?,
            ttl_ms: counter(4, 4)?,
            boot_id: r.get(5)?,
            expires_ns: r.get(6)?,
            acquired_ms: r.get(7)?,
            renewed_ms: r.get(8)?,
            evicted: r.get::<_, i64>(9)? != 0,
            metadata: r.get(10)?,
        })
    }

    /// The record, if the row holds a lease that has not expired at `now`.
    fn live(&self, now: Now<'_>) -> Option<LeaseRecord> {
        let holder = self.holder.as_deref()?;
        if self.boot_id != now.boot_id || self.expires_ns <= now.ns {
            return None;
        }
        // Rows are written only through this crate; a name or id that no longer
        // validates (hand-edited table) is skipped rather than trusted.
        Some(LeaseRecord {
            election: ElectionName::new(&self.election).ok()?,
            holder: HolderId::new(holder).ok()?,
            token: FencingToken(self.token as u64),
            revision: Revision(self.revision as u64),
            ttl: Duration::from_millis(self.ttl_ms as u64),
            acquired_at: self.acquired_ms.map(wall_time),
            renewed_at: self.renewed_ms.map(wall_time),
            remaining: Some(Duration::from_nanos((self.expires_ns - now.ns) as u64)),
            evicted: self.evicted,
            metadata: self.metadata.clone(),
        })
    }
}

/// Runs one statement, prepared once per connection (SQLite's parse is most of a small
/// statement's time).
fn exec(tx: &Connection, sql: &str, params: impl rusqlite::Params) -> rusqlite::Result<usize> {
    tx.prepare_cached(sql)?.execute(params)
}

/// Statement texts that name [`COLUMNS`], built once rather than on every call.
static SELECT_ROW: LazyLock<String> =
    LazyLock::new(|| format!("SELECT {COLUMNS} FROM tenure_leases WHERE election = ?1"));
static INSERT_ROW: LazyLock<String> = LazyLock::new(|| {
    format!("INSERT OR REPLACE INTO tenure_leases ({COLUMNS}) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?8, 0, ?9)")
});
static CHANGED_SINCE: LazyLock<String> =
    LazyLock::new(|| format!("SELECT {COLUMNS}, seq FROM tenure_leases WHERE seq > ?1 ORDER BY seq"));

fn select_row(tx: &Connection, election: &str) -> rusqlite::Result<Option<Row>> {
    tx.prepare_cached(&SELECT_ROW)?.query_row([election], Row::read).optional()
}

fn wall_time(ms: i64) -> SystemTime {
    UNIX_EPOCH + Duration::from_millis(ms.max(0) as u64)
}

/// The token of an election's first grant in this database: the wall clock in
/// microseconds. A database deleted or replaced under its holders starts again with no
/// rows, and its tokens must still lie above every token the old one granted: the old
/// one's were drawn the same way, each +1 per grant, and the clock has moved on since by
/// far more than one microsecond a grant. (A wall clock stepped back across the
/// replacement is the one case left.)
fn first_token() -> i64 {
    let us = SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_micros() as i64).unwrap_or(0);
    if tenure::mutant("sqlite-tokens-from-one") { 1 } else { us.max(1) }
}

/// The files a connection has open (device, inode): the database and its log and
/// shared-memory files, as they were once it had run a statement (SQLite keeps both while
/// any connection is open, in every process). When any of them is no longer the one at
/// its path (deleted or replaced under it), what the connection commits is read by nobody
/// else: the store opens the files at the path instead. The old connection is never closed:
/// closing the last connection of a file checkpoints it and removes the log *by its
/// path*, which now names another file's log.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
struct Opened {
    db: Option<(u64, u64)>,
    wal: Option<(u64, u64)>,
    shm: Option<(u64, u64)>,
}

impl Opened {
    /// The files at `path` now.
    fn at(path: &Path) -> Self {
        Opened { db: file_id(path), wal: file_id(&beside(path, "-wal")), shm: file_id(&beside(path, "-shm")) }
    }

    /// Whether the database at `path` is no longer this one (or there is none).
    fn replaced(&self, path: &Path) -> bool {
        let now = file_id(path);
        now.is_none() || now != self.db
    }

    /// Whether the database is this one but its log or shared memory is not (deleted
    /// under it, or replaced): what this process commits goes to a log nobody else reads,
    /// and a new connection of this process to the same file would share the old shared
    /// memory with a new log (SQLite shares it per file within a process). Nothing is
    /// done on it any more: every call fails, so that a leader steps down, until the
    /// process starts again.
    fn log_lost(&self, path: &Path) -> bool {
        let now = Opened::at(path);
        now.db == self.db
            && ((self.wal.is_some() && now.wal != self.wal) || (self.shm.is_some() && now.shm != self.shm))
            && !tenure::mutant("sqlite-log-deletion-unseen")
    }
}

/// How many times the database may be deleted or replaced under one store (each costs a
/// few descriptors and the old file's cache, kept until the process ends).
const MAX_REPLACEMENTS: u32 = 32;

/// The error every call gets once the store can work no more (its log went under it,
/// or its database was replaced too often), if it is so.
fn final_error(inner: &Inner) -> Option<StoreError> {
    if inner.log_lost.load(Ordering::SeqCst) {
        return Some(log_lost_error(&inner.path));
    }
    (inner.replacements.load(Ordering::SeqCst) >= MAX_REPLACEMENTS).then(|| {
        StoreError::new(
            ErrorKind::Misconfigured,
            format!(
                "{} was deleted or replaced more than {MAX_REPLACEMENTS} times under this process, which keeps every \
                 file that went open until it ends: it works on it no more; start it again (and find what keeps \
                 deleting the database)",
                inner.path.display()
            ),
        )
    })
}

/// The error of every call once the connection's log went under it (final: the process
/// must start again to open the database anew).
fn log_lost_error(path: &Path) -> StoreError {
    StoreError::new(
        ErrorKind::Misconfigured,
        format!(
            "{0}-wal or {0}-shm was deleted or replaced while this process had the database open: what it \
             writes would go to a log nobody else reads, so it writes nothing more; start it again (and remove \
             a database's files only all together, with every process that uses them stopped)",
            path.display()
        ),
    )
}

/// How long a second name of the database may last before it counts as a hard link.
const ONE_NAME_WITHIN: Duration = Duration::from_secs(2);

/// Refuses a database file that has more than one name (hard links): SQLite keeps the log
/// and shared memory beside the name it was given, so processes that open the file by two
/// names each write a log the others never read, and two of them could lead at once.
/// A maker of the database (`create_fresh`) links its new file into place and then
/// removes the temporary name: a second name seen for less than [`ONE_NAME_WITHIN`] is
/// that moment, not a hard link.
fn check_one_name(path: &Path) -> Result<(), StoreError> {
    use std::os::unix::fs::MetadataExt;
    let links = || std::fs::metadata(path).map(|m| m.nlink()).unwrap_or(1);
    let t0 = std::time::Instant::now();
    let mut links_now = links();
    while links_now > 1 && t0.elapsed() < ONE_NAME_WITHIN {
        std::thread::sleep(Duration::from_millis(5));
        links_now = links();
    }
    let links = links_now;
    if links > 1 && !tenure::mutant("sqlite-hard-link-allowed") {
        return Err(StoreError::new(
            ErrorKind::Misconfigured,
            format!(
                "{} has {links} names (hard links): SQLite keeps a log beside each name, so candidates that open \
                 it by different names would not see each other's leases; give every candidate one name, and \
                 remove the other links",
                path.display()
            ),
        ));
    }
    Ok(())
}

/// The database file at `path` as the file system names it (device, inode), if it exists.
fn file_id(path: &Path) -> Option<(u64, u64)> {
    use std::os::unix::fs::MetadataExt;
    std::fs::metadata(path).ok().map(|m| (m.dev(), m.ino()))
}

fn wall_ms() -> i64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_millis() as i64).unwrap_or(0)
}

fn ttl_ns(ttl: Duration) -> i64 {
    ttl.as_nanos().min(i64::MAX as u128) as i64
}

/// Re-reads the row just written and returns it as a live record.
fn reread(tx: &Connection, election: &str, now: Now<'_>) -> rusqlite::Result<LeaseRecord> {
    select_row(tx, election)?.and_then(|r| r.live(now)).ok_or(rusqlite::Error::QueryReturnedNoRows)
}

#[async_trait::async_trait]
impl LeaseStore for SqliteStore {
    async fn try_acquire(&self, req: &AcquireRequest) -> Result<Acquire, StoreError> {
        req.validate()?;
        let req = req.clone();
        let e = req.election.as_str().to_string();
        let inner = &self.inner;
        inner.longest_ttl_ns.fetch_max(ttl_ns(req.ttl), Ordering::SeqCst);
        inner.lock_for_grant();
        let out = self.acquire_in_file(req).await;
        if let Ok(Ok(Acquire::Acquired(r) | Acquire::Held(r))) = &out {
            inner.saw_token(r.token.0);
        }
        match &out {
            Ok(Ok(Acquire::Acquired(_))) | Err(_) => inner.settle(&e, Holds::Now),
            Ok(_) => inner.settle(&e, Holds::Not),
        }
        // Made while the path named another file: in a database nobody else reads.
        let opened = *inner.opened.lock().unwrap_or_else(|e| e.into_inner());
        if out.is_ok() && (opened.replaced(&inner.path) || opened.log_lost(&inner.path)) {
            return Err(StoreError::ambiguous(format!(
                "{} was deleted or replaced while a lease was granted; the grant may be in the file that went",
                inner.path.display()
            )));
        }
        match out? {
            Ok(a) => Ok(a),
            Err(left) => Err(StoreError::unavailable(format!(
                "{} was made anew while a leader of the database it replaced may still run its command; \
                 nothing is granted for {} more",
                inner.path.display(),
                humantime_ms(left)
            ))),
        }
    }

    async fn renew(&self, held: &LeaseRecord, ttl: Duration) -> Result<Renew, StoreError> {
        check_ttl(ttl)?;
        let held = held.clone();
        let (e, lease_ttl) = (held.election.as_str().to_string(), held.ttl);
        self.inner.lock_again();
        let out = self.transact("renew", move |tx, now| renew_in(tx, &held, ttl, now)).await;
        if let Ok(Renew::Renewed(r) | Renew::Lost(Some(r))) = &out {
            self.inner.saw_token(r.token.0);
        }
        if let Ok(Renew::Lost(_)) = &out {
            self.inner.settle(&e, Holds::Until(lease_ttl.max(ttl)));
        }
        out
    }

    /// Every renewal in one transaction: one write to the disk for all of them.
    async fn renew_many(&self, held: &[LeaseRecord], ttl: Duration) -> Vec<Result<Renew, StoreError>> {
        if let Err(e) = check_ttl(ttl) {
            return held.iter().map(|_| Err(e.duplicate())).collect();
        }
        self.inner.lock_again();
        let names: Vec<(String, Duration)> =
            held.iter().map(|h| (h.election.as_str().to_string(), h.ttl.max(ttl))).collect();
        let held = held.to_vec();
        let n = held.len();
        match self
            .transact("renew", move |tx, now| {
                held.iter().map(|h| renew_in(tx, h, ttl, now)).collect::<rusqlite::Result<Vec<_>>>()
            })
            .await
        {
            Ok(v) => {
                for ((name, ttl), r) in names.iter().zip(&v) {
                    if let Renew::Lost(_) = r {
                        self.inner.settle(name, Holds::Until(*ttl));
                    }
                }
                v.into_iter().map(Ok).collect::<Vec<_>>()
            }
            Err(e) => (0..n).map(|_| Err(e.duplicate())).collect(),
        }
    }

    /// Committed without waiting for the disk where that is safe (see "Durability" in
    /// docs/stores/sqlite.md).
    async fn release(&self, held: &LeaseRecord) -> Result<(), StoreError> {
        let e = held.election.as_str().to_string();
        let held = held.clone();
        let out =
            self.transact_with("release", self.inner.release_durability, move |tx, _now| release_in(tx, &held)).await;
        if out.is_ok() {
            self.inner.settle(&e, Holds::Not);
        }
        out
    }

    /// Every release in one transaction, committed as [`release`](Self::release) is.
    async fn release_many(&self, held: &[LeaseRecord]) -> Vec<Result<(), StoreError>> {
        if held.is_empty() {
            return Vec::new();
        }
        let names: Vec<String> = held.iter().map(|h| h.election.as_str().to_string()).collect();
        let (all, n) = (held.to_vec(), held.len());
        let release_all =
            move |tx: &rusqlite::Transaction<'_>, _now: Now<'_>| all.iter().try_for_each(|h| release_in(tx, h));
        match self.transact_with("release", self.inner.release_durability, release_all).await {
            Ok(()) => {
                names.iter().for_each(|e| self.inner.settle(e, Holds::Not));
                (0..n).map(|_| Ok(())).collect()
            }
            Err(e) => (0..n).map(|_| Err(e.duplicate())).collect(),
        }
    }
    async fn get(&self, election: &ElectionName) -> Result<Option<LeaseRecord>, StoreError> {
        let election = election.clone();
        self.with_conn("get", move |conn, inner| {
            let row = select_row(conn, election.as_str())?;
            let now = Now { ns: monotonic_ns(), boot_id: &inner.boot_id };
            Ok(row.and_then(|r| r.live(now)))
        })
        .await
    }

    async fn list(&self, prefix: &str) -> Result<Vec<LeaseRecord>, StoreError> {
        let prefix = prefix.to_string();
        self.with_conn("list", move |conn, inner| {
            let mut stmt = conn.prepare(&format!(
                "SELECT {COLUMNS} FROM tenure_leases
                 WHERE holder IS NOT NULL AND substr(election, 1, length(?1)) = ?1 ORDER BY election"
            ))?;
            let mut rows = Vec::new();
            for row in stmt.query_map([&prefix], Row::read)? {
                match row {
                    Ok(r) => rows.push(r),
                    // A row this build cannot read (written by hand, or corrupted) is left
                    // out, not the whole list with it: `status` of it says what is wrong.
                    Err(
                        e @ (rusqlite::Error::InvalidColumnType(..)
                        | rusqlite::Error::FromSqlConversionFailure(..)
                        | rusqlite::Error::IntegralValueOutOfRange(..)),
                    ) => tracing::warn!("a lease row left out of the list: {e}"),
                    Err(e) => return Err(e),
                }
            }
            let now = Now { ns: monotonic_ns(), boot_id: &inner.boot_id };
            Ok(rows.iter().filter_map(|r| r.live(now)).collect())
        })
        .await
    }

    async fn evict(&self, election: &ElectionName, how: Evict) -> Result<Option<LeaseRecord>, StoreError> {
        let election = election.clone();
        self.transact("evict", move |tx, now| {
            let e = election.as_str();
            let Some(cur) = select_row(tx, e)?.and_then(|r| r.live(now)) else {
                return Ok(None);
            };
            let sql = match how {
                Evict::Now => {
                    "UPDATE tenure_leases SET holder = NULL, evicted = 0, revision = revision + 1 WHERE election = ?1"
                }
                Evict::AfterTerm => "UPDATE tenure_leases SET evicted = 1, revision = revision + 1 WHERE election = ?1",
            };
            exec(tx, sql, [e])?;
            Ok(Some(cur))
        })
        .await
    }

    fn watch(&self, election: &ElectionName) -> Option<WatchStream> {
        // Subscribed before the poller starts: its first round tells every watcher to read.
        let stream = tenure::store::watch_changes(Arc::new(self.clone()), &self.inner.changes, election);
        self.ensure_poller();
        Some(stream)
    }

    fn describe(&self) -> String {
        format!("sqlite:{}", self.inner.path.display())
    }

    async fn ledger_read(&self, election: &ElectionName, key: &WorkKey) -> Result<Option<LedgerEntry>, StoreError> {
        let (election, key) = (election.clone(), key.clone());
        self.with_conn("reading the work ledger", move |conn, _| {
            let read = conn
                .prepare_cached(
                    "SELECT value, version FROM tenure_work WHERE election = ?1 AND key = ?2 AND keep_until_ms > ?3",
                )
                .and_then(|mut st| {
                    st.query_row(params![election.as_str(), key.as_str(), wall_ms()], |r| {
                        Ok(LedgerEntry { value: r.get(0)?, version: r.get::<_, i64>(1)?.to_string() })
                    })
                    .optional()
                });
            match read {
                // A database nobody has kept a ledger in yet.
                Err(rusqlite::Error::SqliteFailure(_, Some(m))) if m.starts_with("no such table") => Ok(None),
                other => other,
            }
        })
        .await
    }

    async fn ledger_write(
        &self,
        election: &ElectionName,
        key: &WorkKey,
        value: &[u8],
        expected: Option<&str>,
        keep: Duration,
    ) -> Result<LedgerWrite, StoreError> {
        check_ledger_value(value)?;
        let (election, key, value) = (election.clone(), key.clone(), value.to_vec());
        let expected = expected.map(str::to_string);
        let keep_ms = keep.as_millis().min(i64::MAX as u128 / 2) as i64;
        self.transact("writing the work ledger", move |tx, _| {
            tx.execute_batch(LEDGER_SCHEMA)?;
            let now = wall_ms();
            // Entries kept past their time go first; the one written below may be one.
            exec(tx, "DELETE FROM tenure_work WHERE keep_until_ms <= ?1", [now])?;
            let current: Option<i64> = tx
                .prepare_cached("SELECT version FROM tenure_work WHERE election = ?1 AND key = ?2")?
                .query_row([election.as_str(), key.as_str()], |r| r.get(0))
                .optional()?;
            if current.map(|v| v.to_string()) != expected {
                return Ok(LedgerWrite::Conflict);
            }
            exec(tx, "UPDATE tenure_work_seq SET n = n + 1", [])?;
            let version: i64 = tx.query_row("SELECT n FROM tenure_work_seq", [], |r| r.get(0))?;
            exec(
                tx,
                "INSERT OR REPLACE INTO tenure_work (election, key, value, version, keep_until_ms)
                 VALUES (?1, ?2, ?3, ?4, ?5)",
                params![election.as_str(), key.as_str(), value, version, now.saturating_add(keep_ms)],
            )?;
            Ok(LedgerWrite::Written(version.to_string()))
        })
        .await
    }
}

/// The watch thread: checks `PRAGMA data_version` on its own connection (which changes
/// whenever another connection commits); when it changed, reads the rows changed since its
/// cursor (`seq`) and tells the watchers of those elections, with the record as it now
/// stands. It stops when nobody is watching.
fn poll_changes(inner: &Arc<Inner>) {
    let mut conn = match connect(&inner.path, &inner.options) {
        Ok(c) => c,
        Err(e) => {
            tracing::warn!(error = %e, "the SQLite watch could not open its connection");
            inner.poller.store(false, Ordering::SeqCst);
            return;
        }
    };
    let mut opened = Opened::at(&inner.path);
    let mut version: Option<i64> = None;
    let mut cursor: Option<i64> = None;
    let wakeup = Wakeup::new(&inner.path);
    // When a write to the database's files last said a commit is coming, which may not be
    // visible yet.
    let mut announced: Option<std::time::Instant> = None;
    loop {
        if inner.changes.prune() == 0 {
            inner.poller.store(false, Ordering::SeqCst);
            // A watcher may have subscribed between the check and the flag reset.
            if inner.changes.prune() == 0 || inner.poller.swap(true, Ordering::SeqCst) {
                return;
            }
        }
        // The database deleted or replaced: watch the file now at the path, and have every
        // watcher read again (a leader then finds its lease gone, and steps down).
        if opened.replaced(&inner.path)
            && !tenure::mutant("sqlite-replaced-file-kept")
            && inner.replacements.load(Ordering::SeqCst) < MAX_REPLACEMENTS
            && let Ok((c, now_open)) =
                reopen(&inner.path, &inner.options, Some((carried(&conn, &inner.boot_id), opened)))
        {
            // Never closed: see [`Opened`].
            std::mem::forget(std::mem::replace(&mut conn, c));
            opened = now_open;
            (version, cursor) = (None, None);
        }
        match conn.prepare_cached("PRAGMA data_version").and_then(|mut s| s.query_row([], |r| r.get::<_, i64>(0))) {
            Ok(v) if version != Some(v) => {
                version = Some(v);
                match cursor {
                    // First round: from here on, changes are told; what happened before
                    // the cursor is read by every watcher once.
                    None => match conn.query_row("SELECT n FROM tenure_seq", [], |r| r.get(0)) {
                        Ok(c) => {
                            cursor = Some(c);
                            inner.changes.publish(Change::Everything);
                        }
                        Err(e) => {
                            version = None;
                            tracing::debug!(error = %e, "the SQLite watch could not read its cursor");
                        }
                    },
                    Some(c) => match changed_since(&conn, c, &inner.boot_id) {
                        Ok((Some(changes), next)) => {
                            cursor = Some(next);
                            // A follower waits here, not in transactions: what it has seen
                            // counts for noticing a rollback at its next grant.
                            inner.seq_seen.fetch_max(next, Ordering::SeqCst);
                            for ch in changes {
                                inner.changes.publish(ch);
                            }
                        }
                        // Gone back: every watcher reads again. What was seen before stays
                        // in `seq_seen` for the next transaction to notice the rollback
                        // once; raising it to the old count again after that would have
                        // every later transaction notice it anew (each leader then lost
                        // its lease at its first renewal, until the count caught up).
                        Ok((None, now)) => {
                            cursor = Some(now);
                            inner.changes.publish(Change::Everything);
                        }
                        Err(e) => {
                            version = None;
                            tracing::debug!(error = %e, "the SQLite watch could not read the changed rows");
                        }
                    },
                }
            }
            Ok(_) => {}
            Err(e) => tracing::debug!(error = %e, "the SQLite watch could not read data_version"),
        }
        let interval = inner.options.watch_interval;
        let since = announced.map(|t| t.elapsed());
        match &wakeup {
            // A commit is visible once its write has been synced: look again soon, less
            // often as the sync takes longer. A change seen meanwhile does not end the
            // search: it may have been an earlier commit than the one last announced.
            Some(w) if since.is_some_and(|s| s < COMMIT_VISIBLE_WITHIN) => {
                let step = if since < Some(Duration::from_millis(20)) { 1 } else { 10 };
                if w.wait(Duration::from_millis(step).min(interval)) == Woken::Written {
                    announced = Some(std::time::Instant::now());
                }
            }
            Some(w) => {
                if w.wait(interval) == Woken::Written {
                    announced = Some(std::time::Instant::now());
                }
            }
            None => std::thread::sleep(interval),
        }
    }
}

/// How long after a write to the database's files the watch thread keeps looking for the
/// commit it announced (a sync on a slow disk).
const COMMIT_VISIBLE_WITHIN: Duration = Duration::from_secs(5);

/// Wakes the watch thread when a process writes the database's files (an inotify watch on
/// its directory), so that a follower hears of a release at once instead of at its next
/// look. Every tenure writer writes the wake-up file (`NAME-wake`) after each commit that
/// changed a row, so that write wakes the thread when the commit is already visible (and
/// asks for no looks after it). A write to the WAL comes before its commit is visible (a
/// synced commit is synced first), and a writer without the wake-up file announces
/// nothing else, so after each such write the thread also looks every millisecond, then
/// every 10 ms, until [`COMMIT_VISIBLE_WITHIN`] has passed (a write cannot be told apart
/// from the next commit's, so seeing a change does not end it). Without inotify the
/// thread looks every watch interval.
struct Wakeup {
    fd: rustix::fd::OwnedFd,
    /// The database's file name: its `-wal`, `-shm` and `-journal` files start with it.
    name: Vec<u8>,
}

impl Wakeup {
    fn new(path: &Path) -> Option<Self> {
        use rustix::fs::inotify;
        let dir = match path.parent() {
            Some(p) if !p.as_os_str().is_empty() => p,
            _ => Path::new("."),
        };
        let name = path.file_name()?.as_encoded_bytes().to_vec();
        let fd = inotify::init(inotify::CreateFlags::CLOEXEC | inotify::CreateFlags::NONBLOCK).ok()?;
        // Deletions and moves too: a database deleted or replaced under its holders.
        let flags = inotify::WatchFlags::MODIFY
            | inotify::WatchFlags::CREATE
            | inotify::WatchFlags::MOVED_TO
            | inotify::WatchFlags::DELETE
            | inotify::WatchFlags::MOVED_FROM;
        match inotify::add_watch(&fd, dir, flags) {
            Ok(_) => Some(Self { fd, name }),
            Err(e) => {
                tracing::debug!(error = %e, dir = %dir.display(), "no inotify watch on the database's directory; the SQLite watch polls");
                None
            }
        }
    }

    /// Waits up to `timeout` for a write to the database's files, and says which came.
    fn wait(&self, timeout: Duration) -> Woken {
        use rustix::event::{PollFd, PollFlags, Timespec};
        let mut fds = [PollFd::new(&self.fd, PollFlags::IN)];
        let limit = Timespec { tv_sec: timeout.as_secs() as i64, tv_nsec: timeout.subsec_nanos() as i64 };
        if !matches!(rustix::event::poll(&mut fds, Some(&limit)), Ok(n) if n > 0) {
            return Woken::Nothing;
        }
        // Read every queued event; any that names one of the database's files counts.
        let mut buf = [std::mem::MaybeUninit::<u8>::uninit(); 4096];
        let mut events = rustix::fs::inotify::Reader::new(&self.fd, &mut buf);
        let mut woken = Woken::Nothing;
        while let Ok(ev) = events.next() {
            let name = ev.file_name().map(|n| n.to_bytes());
            if name.is_some_and(|n| n.strip_prefix(&self.name[..]) == Some(b"-wake")) {
                woken = woken.max(Woken::Announced);
            } else if name.is_none_or(|n| n.starts_with(&self.name)) {
                woken = Woken::Written;
            }
        }
        woken
    }
}

/// What woke the watch thread.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Woken {
    /// Nothing within the wait.
    Nothing,
    /// Only the wake-up file: a commit that can already be read.
    Announced,
    /// Another of the database's files: a commit may follow once it is synced.
    Written,
}

/// A call for the connection's thread.
type Job = Box<dyn FnOnce(&mut Connection, &Inner) + Send>;

/// The connection's thread: runs the store's calls one after another until the store is
/// dropped (its job queue then closes).
///
/// Before each call it checks that the file at the database's path is still the one its
/// connection has open: one deleted or replaced under it (`rm`, a restore) would go on
/// taking renewals in a file nobody else reads, while candidates elect in the new one. It
/// then opens the new file (made afresh if the path is empty), where the holder's lease
/// does not exist, so its next renewal is lost and it steps down.
fn serve(mut conn: Connection, inner: &std::sync::Weak<Inner>, queue: &std::sync::mpsc::Receiver<Job>) {
    while let Ok(job) = queue.recv() {
        let Some(inner) = inner.upgrade() else { return };
        let opened = *inner.opened.lock().unwrap_or_else(|e| e.into_inner());
        if opened.replaced(&inner.path) && !tenure::mutant("sqlite-replaced-file-kept") {
            if inner.replacements.load(Ordering::SeqCst) >= MAX_REPLACEMENTS {
                // Its caller gets the final error.
                drop(job);
                continue;
            }
            tracing::warn!(path = %inner.path.display(), "the database file was deleted or replaced; opening the one at its path");
            let (c, opened) = match reopen(&inner.path, &inner.options, Some((carried(&conn, &inner.boot_id), opened)))
            {
                Ok(c) => c,
                Err(e) => {
                    // Nothing to work on: this call fails with why, and the next tries
                    // again, from the old connection and what it had open (its marks to
                    // carry, the shared memory to refuse).
                    tracing::warn!(error = %e, "cannot open the database again");
                    *inner.reopen_error.lock().unwrap_or_else(|p| p.into_inner()) = Some(e.to_string());
                    drop(job);
                    continue;
                }
            };
            inner.reopen_error.lock().unwrap_or_else(|p| p.into_inner()).take();
            // The old connection is never closed: see [`Opened`].
            std::mem::forget(std::mem::replace(&mut conn, c));
            inner.replacements.fetch_add(1, Ordering::SeqCst);
            *inner.opened.lock().unwrap_or_else(|e| e.into_inner()) = opened;
            // Another file: its changes are counted afresh.
            inner.seq_seen.store(-1, Ordering::SeqCst);
            inner.incarnation.lock().unwrap_or_else(|p| p.into_inner()).take();
        }
        if inner.log_lost.load(Ordering::SeqCst) || opened.log_lost(&inner.path) {
            // The job is dropped unrun: its caller gets the error.
            inner.log_lost.store(true, Ordering::SeqCst);
            drop(job);
            continue;
        }
        // A call that panics fails itself (its answer is dropped, its transaction rolled
        // back), not the calls after it.
        let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| job(&mut conn, &inner)));
    }
}

/// A new connection to the database at `path`, at the current schema, and the file it
/// has open. `replaced`: this process had another file open at the path (deleted or
/// replaced under it), and what it read there.
fn reopen(
    path: &Path,
    options: &SqliteOptions,
    replaced: Option<(Carried, Opened)>,
) -> Result<(Connection, Opened), StoreError> {
    create_fresh(path)?;
    // A file put in place that is a second name of another database (a hard link moved
    // over this one) is refused as at open.
    check_one_name(path)?;
    // The shared memory at the path is still the one this process has mapped for the file
    // that went (a copy moved over the database, its -wal and -shm left): a connection of
    // this process would take it for new and truncate it under the old one (SIGBUS), and
    // would read the old file's log as the new file's. Refused until they are removed.
    let old_shm = replaced.and_then(|(_, o)| o.shm);
    if old_shm.is_some() && file_id(&beside(path, "-shm")) == old_shm && !tenure::mutant("sqlite-stale-log-kept") {
        return Err(StoreError::new(
            ErrorKind::Misconfigured,
            format!(
                "{} was replaced but its -wal and -shm files were left: they belong to the file that went; \
                 stop the candidates and remove {0}-wal and {0}-shm (or remove them with the database)",
                path.display()
            ),
        ));
    }
    let replaced = replaced.map(|(c, _)| c);
    let conn = connect(path, options)?;
    retry_busy(options, || migrate(&conn, path, replaced))
        .map_err(|e| sql_error(path, "creating the lease table", e))?;
    let opened = Opened::at(path);
    // A file that was there already (a copy moved into place) gets the same, after the fact.
    if let Some(c) = replaced {
        retry_busy(options, || {
            conn.execute_batch("BEGIN IMMEDIATE")?;
            let out = carry(&conn, c);
            conn.execute_batch(if out.is_ok() { "COMMIT" } else { "ROLLBACK" })?;
            out
        })
        .map_err(|e| sql_error(path, "marking the replaced database", e))?;
    }
    Ok((conn, opened))
}

/// What a process reads from a database file deleted or replaced under it (a file stays
/// readable while open) for the file now at the path.
#[derive(Clone, Copy, Debug)]
struct Carried {
    /// Its highest token (rows and floor): the new file's floor, so that its tokens go on
    /// above the old ones whatever the clock of the process that grants first there says.
    floor: i64,
    /// When its last lease live now runs out (monotonic ns, this boot): its holder may
    /// run its command until then, so the new file grants nothing before.
    live_until: Option<i64>,
}

/// Reads [`Carried`] from the file `conn` has open; nothing on an error.
fn carried(conn: &Connection, boot: &str) -> Carried {
    let rows: i64 = conn.query_row("SELECT coalesce(max(token), 0) FROM tenure_leases", [], |r| r.get(0)).unwrap_or(0);
    let live_until: Option<i64> = conn
        .query_row(
            "SELECT max(expires_ns) FROM tenure_leases WHERE holder IS NOT NULL AND boot_id = ?1 AND expires_ns > ?2",
            params![boot, monotonic_ns()],
            |r| r.get(0),
        )
        .ok()
        .flatten();
    // A mark of its own that still withholds: a file deleted in turn before the term it
    // waited for was over (`rm` twice).
    let now = Now { ns: monotonic_ns(), boot_id: boot };
    let marked = withheld(conn, now, Duration::ZERO).ok().flatten().map(|left| now.ns.saturating_add(ttl_ns(left)));
    Carried { floor: rows.max(floor(conn).unwrap_or(0)), live_until: live_until.max(marked) }
}

/// Gives the file `conn` has open what [`Carried`] says, in the caller's transaction.
fn carry(conn: &Connection, c: Carried) -> rusqlite::Result<()> {
    raise_floor(conn, c.floor)?;
    match c.live_until {
        Some(until) if !tenure::mutant("sqlite-fresh-file-grants") => mark_withheld(conn, Some(until)),
        _ => Ok(()),
    }
}

/// The floor of the database's tokens (see [`Carried`]), 0 without one.
fn floor(conn: &Connection) -> rusqlite::Result<i64> {
    let has: bool = conn.query_row(
        "SELECT count(*) > 0 FROM sqlite_master WHERE type = 'table' AND name = 'tenure_floor'",
        [],
        |r| r.get(0),
    )?;
    if !has {
        return Ok(0);
    }
    conn.query_row("SELECT coalesce(max(token), 0) FROM tenure_floor", [], |r| r.get(0))
}

/// Raises the database's token floor to `to`, in the caller's transaction.
fn raise_floor(conn: &Connection, to: i64) -> rusqlite::Result<()> {
    if to <= 0 || floor(conn)? >= to {
        return Ok(());
    }
    conn.execute_batch("CREATE TABLE IF NOT EXISTS tenure_floor (token INTEGER NOT NULL); DELETE FROM tenure_floor;")?;
    conn.execute("INSERT INTO tenure_floor (token) VALUES (?1)", params![to])?;
    Ok(())
}

/// Notices, in a transaction's first step, a database rolled back in place: its change
/// count is below one this store has seen in the same file, or its incarnation (a random
/// id each file gets, in `tenure_incarnation`) is another file's (a backup restored into
/// it with SQLite's `.restore`, which keeps the file, so no replacement shows). Its records
/// are then from before terms that were granted since, and one of them may bring back a
/// term that ended (a restored holder would renew it, with its old token, beside the
/// leader of today): the file is marked to grant nothing, and renew nothing from before,
/// for one TTL, as a file made anew is (see [`mark_withheld`]). Tokens granted then are
/// above the old ones, as every first token is (at least the wall clock's microseconds).
fn notice_rollback(tx: &rusqlite::Transaction<'_>, inner: &Inner) -> rusqlite::Result<()> {
    // One read on every transaction; the table and its id are made only when missing (a
    // file made before it existed, or restored from such a backup).
    let read = |tx: &rusqlite::Transaction<'_>| tx.query_row("SELECT id FROM tenure_incarnation", [], |r| r.get(0));
    let id: String = match read(tx).optional() {
        Ok(Some(id)) => id,
        _ => {
            tx.execute_batch(
                "CREATE TABLE IF NOT EXISTS tenure_incarnation (id TEXT NOT NULL);
                 INSERT INTO tenure_incarnation (id) SELECT hex(randomblob(16))
                 WHERE NOT EXISTS (SELECT 1 FROM tenure_incarnation);",
            )?;
            read(tx)?
        }
    };
    let now: i64 = tx.prepare_cached("SELECT n FROM tenure_seq")?.query_row([], |r| r.get(0))?;
    let mut known = inner.incarnation.lock().unwrap_or_else(|p| p.into_inner());
    let seen = inner.seq_seen.load(Ordering::SeqCst);
    let rolled_back = known.as_ref().is_some_and(|k| *k != id || (seen >= 0 && now < seen));
    if rolled_back && !tenure::mutant("sqlite-rollback-unseen") {
        tracing::warn!(
            path = %inner.path.display(),
            "the database went back to an earlier state (a backup restored into it?): nothing is granted or renewed \
             from its old records for one TTL"
        );
        // One mark for the rollback: the first process to notice it makes it (its term
        // covers the leader's from before), and those that notice later do not extend it.
        let at = Now { ns: monotonic_ns(), boot_id: &inner.boot_id };
        match inner.longest_ttl_ns.load(Ordering::SeqCst) {
            0 => mark_withheld(tx, None)?,
            ttl if withheld(tx, at, Duration::from_nanos(ttl as u64))?.is_none() => {
                mark_withheld(tx, Some(at.ns.saturating_add(ttl)))?
            }
            _ => {}
        }
        // Its tokens go on above every token this store saw before the rollback, whatever
        // the clock of the process that grants next says.
        raise_floor(tx, inner.token_seen.load(Ordering::SeqCst))?;
        // Counted from here: the mark is made once.
        inner.seq_seen.store(now, Ordering::SeqCst);
    }
    *known = Some(id);
    Ok(())
}

/// The directory of the database at `path`.
fn database_dir(path: &Path) -> &Path {
    match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p,
        _ => Path::new("."),
    }
}

/// The directory whose lock says a leader of the database at `path` may live: the one
/// that holds the file, whatever way the path reaches it (a symbolic link to the
/// database or to a directory on the way names the same directory as the real path).
fn lock_dir(path: &Path) -> PathBuf {
    std::fs::canonicalize(path)
        .ok()
        .and_then(|real| real.parent().map(Path::to_path_buf))
        .or_else(|| std::fs::canonicalize(database_dir(path)).ok())
        .unwrap_or_else(|| database_dir(path).to_path_buf())
}

/// Whether a leader of a database at `path` may still run, for a process that makes the
/// file anew without having had the old one open (which would know, see [`Carried`]): a
/// leader of a file deleted under it finds out at its next call to the store (or through
/// its watch) and then stops its command within its grace period, so a grant in the new
/// file could give two leaders at once. Every store that may hold a lease (or has lost
/// one within a TTL) keeps a shared lock on the database's directory: if one is held
/// (this process's own included), the new file grants nothing for one TTL (see
/// [`mark_withheld`]). Nobody holds it when a deployment first starts, and then nothing
/// waits.
fn a_leader_may_live(path: &Path) -> bool {
    let free = std::fs::File::open(lock_dir(path))
        .is_ok_and(|f| rustix::fs::flock(&f, rustix::fs::FlockOperation::NonBlockingLockExclusive).is_ok());
    !free && !tenure::mutant("sqlite-fresh-file-grants")
}

/// Marks the database, in the caller's transaction, as granting nothing until `until`
/// (monotonic ns), or, with `None`, for one TTL from now (the TTL each request asks for:
/// the replaced term's deadline lies within one TTL of its last renewal, which came before
/// its file went). A later mark only extends an earlier one.
fn mark_withheld(conn: &Connection, until: Option<i64>) -> rusqlite::Result<()> {
    conn.execute_batch(
        "CREATE TABLE IF NOT EXISTS tenure_fresh (made_ns INTEGER NOT NULL, boot_id TEXT NOT NULL, until_ns INTEGER);",
    )?;
    let boot = boot_id();
    let earlier: Option<(i64, String, Option<i64>)> = conn
        .query_row("SELECT made_ns, boot_id, until_ns FROM tenure_fresh", [], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)))
        .optional()?;
    if let (Some((_, b, Some(was))), Some(now)) = (&earlier, until)
        && *b == boot
        && *was >= now
    {
        return Ok(());
    }
    tracing::warn!(
        "the database was made anew or replaced while a leader of the file before may still run its command: \
         no lease is granted here until that term is over"
    );
    conn.execute_batch("DELETE FROM tenure_fresh;")?;
    conn.execute(
        "INSERT INTO tenure_fresh (made_ns, boot_id, until_ns) VALUES (?1, ?2, ?3)",
        params![monotonic_ns(), boot, until],
    )?;
    Ok(())
}

/// How much longer the database withholds grants of a `ttl` lease, if it does (see
/// [`mark_withheld`]); a mark from before a reboot withholds nothing.
fn withheld(tx: &Connection, now: Now<'_>, ttl: Duration) -> rusqlite::Result<Option<Duration>> {
    let marked: bool = tx.query_row(
        "SELECT count(*) > 0 FROM sqlite_master WHERE type = 'table' AND name = 'tenure_fresh'",
        [],
        |r| r.get(0),
    )?;
    if !marked {
        return Ok(None);
    }
    let mark: Option<(i64, String, Option<i64>)> = tx
        .query_row("SELECT made_ns, boot_id, until_ns FROM tenure_fresh", [], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)))
        .optional()?;
    Ok(mark.and_then(|(made, boot, until)| {
        let until = until.unwrap_or_else(|| made.saturating_add(ttl_ns(ttl)));
        (boot == now.boot_id && now.ns < until).then(|| Duration::from_nanos((until - now.ns) as u64))
    }))
}

/// `d` in whole milliseconds, for messages.
fn humantime_ms(d: Duration) -> String {
    format!("{} ms", d.as_millis())
}

/// The rows changed after `cursor`, as changes for their watchers, and the new cursor.
fn changed_since(conn: &Connection, cursor: i64, boot_id: &str) -> rusqlite::Result<(Option<Vec<Change>>, i64)> {
    // The count went down: the file went back to an earlier state (a backup restored into
    // it). Counted from where it is now; what changed is unknown.
    let now: i64 = conn.prepare_cached("SELECT n FROM tenure_seq")?.query_row([], |r| r.get(0))?;
    if now < cursor && !tenure::mutant("sqlite-watch-keeps-count") {
        return Ok((None, now));
    }
    let mut stmt = conn.prepare_cached(&CHANGED_SINCE)?;
    let rows = stmt
        .query_map([cursor], |r| Ok((Row::read(r)?, r.get::<_, i64>(11)?)))?
        .collect::<rusqlite::Result<Vec<_>>>()?;
    let now = Now { ns: monotonic_ns(), boot_id };
    let next = rows.last().map_or(cursor, |(_, seq)| *seq);
    let changes = rows.iter().map(|(row, _)| Change::now(row.election.as_str(), row.live(now)));
    Ok((Some(changes.collect()), next))
}

/// Brings the database to the current schema version, in one transaction.
/// Brings the database to the current schema. A file made anew here gets, in the same
/// transaction, what `replaced` carries from the file this process had open before (see
/// [`Carried`]), or, from a process that had none, a mark when a leader may live (see
/// [`a_leader_may_live`]).
fn migrate(conn: &Connection, path: &Path, replaced: Option<Carried>) -> rusqlite::Result<()> {
    conn.execute_batch("BEGIN IMMEDIATE")?;
    let run = || -> rusqlite::Result<()> {
        // Read again under the write lock: another process may have migrated meanwhile.
        let version: i64 = conn.query_row("PRAGMA user_version", [], |r| r.get(0))?;
        if version >= SCHEMA_VERSION {
            return Ok(());
        }
        if version < 1 {
            // A file without the lease table: new, or made anew under a leader of the one
            // it replaced. Marked in the transaction that makes the table, so that no
            // grant in it comes first.
            let fresh: bool = conn.query_row(
                "SELECT count(*) = 0 FROM sqlite_master WHERE type = 'table' AND name = 'tenure_leases'",
                [],
                |r| r.get(0),
            )?;
            match replaced {
                Some(c) if fresh => carry(conn, c)?,
                None if fresh && a_leader_may_live(path) => mark_withheld(conn, None)?,
                _ => {}
            }
            conn.execute_batch(SCHEMA)?;
        }
        if version < 2 {
            let has_seq: bool = conn.query_row(
                "SELECT count(*) > 0 FROM pragma_table_info('tenure_leases') WHERE name = 'seq'",
                [],
                |r| r.get(0),
            )?;
            if !has_seq {
                conn.execute_batch("ALTER TABLE tenure_leases ADD COLUMN seq INTEGER NOT NULL DEFAULT 0")?;
            }
            conn.execute_batch(SCHEMA_2)?;
        }
        conn.execute_batch(&format!("PRAGMA user_version = {SCHEMA_VERSION}"))
    };
    match run() {
        Ok(()) => conn.execute_batch("COMMIT"),
        Err(e) => {
            let _ = conn.execute_batch("ROLLBACK");
            Err(e)
        }
    }
}

fn connect(path: &Path, options: &SqliteOptions) -> Result<Connection, StoreError> {
    // A symbolic link to nothing would have SQLite make the file it names with the
    // umask's mode, readable by others: refused.
    if std::fs::symlink_metadata(path).is_ok_and(|m| m.file_type().is_symlink()) && !path.exists() {
        return Err(StoreError::new(
            ErrorKind::Misconfigured,
            format!(
                "{} is a symbolic link to a file that does not exist; give the database's own path",
                path.display()
            ),
        ));
    }
    create_fresh(path)?;
    // Never made by SQLite itself: it would attach any log left at the path.
    let flags = rusqlite::OpenFlags::default() - rusqlite::OpenFlags::SQLITE_OPEN_CREATE;
    let conn = Connection::open_with_flags(path, flags).map_err(|e| sql_error(path, "opening the database", e))?;
    conn.busy_timeout(options.busy_timeout).map_err(|e| sql_error(path, "setting the busy timeout", e))?;
    // Switching a fresh database to WAL takes an exclusive lock for which SQLite does not
    // call the busy handler, so replicas starting together must retry here themselves.
    let mode: String = retry_busy(options, || conn.query_row("PRAGMA journal_mode = WAL", [], |r| r.get(0)))
        .map_err(|e| sql_error(path, "switching to WAL", e))?;
    if !mode.eq_ignore_ascii_case("wal") {
        tracing::warn!(path = %path.display(), %mode, "SQLite did not switch to WAL");
    }
    conn.execute_batch("PRAGMA synchronous = FULL;").map_err(|e| sql_error(path, "setting synchronous", e))?;
    Ok(conn)
}

/// `path` with `suffix` added (`-wal`, `-shm`, …).
fn beside(path: &Path, suffix: &str) -> PathBuf {
    let mut name = path.as_os_str().to_owned();
    name.push(suffix);
    PathBuf::from(name)
}

/// Makes the database at `path` if there is none: an empty file, this user's alone (0600
/// whatever the umask; SQLite gives its WAL and shared-memory files the same mode), put
/// in place only after any `-wal` and `-shm` left at the path are removed. Those belong to
/// a database file deleted under its users (`rm` of the database alone): SQLite would
/// attach them to the new file, so that it read the old file's log as its own and shared
/// its memory with processes of the old file, whose connections go on (one in this very
/// process makes SIGBUS of the shared memory when it is truncated under it). Makers take
/// turns under an exclusive lock on `NAME-create`, so that none removes the logs of a
/// file another has just put in place. An existing database is left as it is.
fn create_fresh(path: &Path) -> Result<(), StoreError> {
    use std::os::unix::fs::{MetadataExt, OpenOptionsExt, PermissionsExt};
    if std::fs::symlink_metadata(path).is_ok() {
        return Ok(());
    }
    // Never blocking on a FIFO planted at a name, never through a link.
    let flags = (rustix::fs::OFlags::NOFOLLOW | rustix::fs::OFlags::NONBLOCK).bits() as i32;
    let private = |p: &Path, new: bool| {
        let mut o = std::fs::OpenOptions::new();
        o.write(true).mode(0o600).custom_flags(flags);
        if new {
            o.create_new(true)
        } else {
            o.create(true).truncate(false)
        };
        o.open(p).and_then(|f| f.set_permissions(std::fs::Permissions::from_mode(0o600)).map(|()| f))
    };
    let name = beside(path, "-create");
    let refused = |why: String| StoreError::new(ErrorKind::Unavailable, why);
    let lock = private(&name, false)
        .map_err(|e| refused(format!("cannot open {} to make the database: {e}", name.display())))?;
    let meta = lock.metadata().map_err(|e| refused(format!("cannot read {}: {e}", name.display())))?;
    if !meta.is_file() || meta.uid() != rustix::process::geteuid().as_raw() {
        return Err(StoreError::new(
            ErrorKind::Misconfigured,
            format!(
                "{} is not a regular file of this user's: remove it (it serializes making the database)",
                name.display()
            ),
        ));
    }
    // Without the lock nothing is removed or made: another maker (stalled, or another
    // user's process) may be about to put a file in place, and its logs must not go.
    let locked = (0..200).any(|i| {
        if i > 0 {
            std::thread::sleep(Duration::from_millis(10));
        }
        rustix::fs::flock(&lock, rustix::fs::FlockOperation::NonBlockingLockExclusive).is_ok()
    });
    if !locked {
        return Err(refused(format!("another process holds {} while it makes the database; retry", name.display())));
    }
    if std::fs::symlink_metadata(path).is_ok() {
        return Ok(());
    }
    let tmp = beside(path, &format!("-new.{}", fastrand::u64(..)));
    private(&tmp, true).map_err(|e| {
        StoreError::new(ErrorKind::Unauthorized, format!("cannot make the database {}: {e}", path.display()))
    })?;
    if !tenure::mutant("sqlite-stale-log-kept") {
        // Planted, sqlite-stale-log-kept: the new file attaches the old one's log.
        for suffix in ["-wal", "-shm"] {
            let _ = std::fs::remove_file(beside(path, suffix));
        }
    }
    // Never over a file another maker put there meanwhile.
    let _ = std::fs::hard_link(&tmp, path);
    let _ = std::fs::remove_file(&tmp);
    Ok(())
}

/// Runs `op` again while SQLite answers "busy" or "locked", for up to the busy timeout.
fn retry_busy<T>(options: &SqliteOptions, mut op: impl FnMut() -> rusqlite::Result<T>) -> rusqlite::Result<T> {
    let until = std::time::Instant::now() + options.busy_timeout;
    loop {
        match op() {
            Err(e)
                if matches!(e.sqlite_error_code(), Some(ErrorCode::DatabaseBusy | ErrorCode::DatabaseLocked))
                    && std::time::Instant::now() < until =>
            {
                // A spread, so that retrying openers do not collide again.
                std::thread::sleep(Duration::from_millis(fastrand::u64(2..15)));
            }
            other => return other,
        }
    }
}

fn sql_error(path: &Path, what: &str, e: rusqlite::Error) -> StoreError {
    // A row whose counters cannot go on (see the grant), or that holds a negative one
    // (see `Row::read`): no retry can help.
    if let rusqlite::Error::IntegralValueOutOfRange(column @ (3 | 4), value) = e {
        let name = if column == 3 { "revision" } else { "ttl_ms" };
        return StoreError::new(
            ErrorKind::Misconfigured,
            format!(
                "SQLite {}: {what} failed: the election's row holds {name} {value}, which no build writes (written \
                 by hand, or corrupted); delete that row of tenure_leases to start the election again",
                path.display()
            ),
        );
    }
    if let rusqlite::Error::IntegralValueOutOfRange(0, token) = e {
        return StoreError::new(
            ErrorKind::Misconfigured,
            format!(
                "SQLite {}: {what} failed: the election's row holds token {token}, which cannot grow (written by \
                 hand, or corrupted); delete that row of tenure_leases to start the election again",
                path.display()
            ),
        );
    }
    let code = e.sqlite_error_code();
    let (kind, hint) = match code {
        Some(ErrorCode::DatabaseBusy | ErrorCode::DatabaseLocked) => {
            (ErrorKind::Unavailable, "another process holds the database lock; retry")
        }
        Some(ErrorCode::DiskFull) => (ErrorKind::Unavailable, "the disk is full; free space and retry"),
        Some(ErrorCode::ReadOnly | ErrorCode::PermissionDenied | ErrorCode::CannotOpen) => {
            (ErrorKind::Unauthorized, "check that the file and its directory exist and are writable by this user")
        }
        Some(ErrorCode::NotADatabase | ErrorCode::DatabaseCorrupt) => {
            (ErrorKind::Misconfigured, "the file is not a usable SQLite database")
        }
        _ => (ErrorKind::Unavailable, "retry"),
    };
    StoreError::new(kind, format!("SQLite {}: {what} failed ({hint})", path.display())).with_source(e)
}

/// The host's monotonic clock, shared by every process on the host, in nanoseconds.
fn monotonic_ns() -> i64 {
    let t = rustix::time::clock_gettime(rustix::time::ClockId::Monotonic);
    t.tv_sec.saturating_mul(1_000_000_000).saturating_add(t.tv_nsec as i64)
}

/// The boot id of a host whose own could not be read.
const UNKNOWN_BOOT: &str = "unknown-boot";

/// The kernel's boot id: monotonic readings from another boot mean nothing.
fn boot_id() -> String {
    std::fs::read_to_string("/proc/sys/kernel/random/boot_id")
        .map(|s| s.trim().to_string())
        .unwrap_or_else(|_| UNKNOWN_BOOT.to_string())
}

/// File systems on which SQLite's locking (and a shared clock) cannot be trusted.
const NETWORK_FS: &[(i64, &str)] = &[
    (0x6969, "NFS"),
    (0x517B, "SMB"),
    (0xFF53_4D42, "CIFS"),
    (0xFE53_4D42, "SMB2"),
    (0x0102_1997, "9P"),
    (0x00C3_6400, "CephFS"),
    (0x0116_1970, "GFS2"),
    (0x7461_636F, "OCFS2"),
    (0x0BD0_0BD0, "Lustre"),
    (0x5346_414F, "AFS"),
    (0x7375_7245, "Coda"),
];
const FUSE: i64 = 0x6573_5546;

fn check_file_system(path: &Path) -> Result<(), StoreError> {
    let dir = match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p,
        _ => Path::new("."),
    };
    let stat = match rustix::fs::statfs(dir) {
        Ok(s) => s,
        Err(e) => {
            return Err(StoreError::new(
                ErrorKind::Misconfigured,
                format!(
                    "cannot use {} for the SQLite store: its directory {} is not reachable",
                    path.display(),
                    dir.display()
                ),
            )
            .with_source(std::io::Error::from(e)));
        }
    };
    let fs_type = stat.f_type as i64;
    if let Some((_, name)) = NETWORK_FS.iter().find(|(magic, _)| *magic == fs_type) {
        return Err(StoreError::new(
            ErrorKind::Misconfigured,
            format!(
                "{} is on a network file system ({name}); SQLite's locking is not safe there and the hosts \
                 share no clock. Put the database on a local disk, or use a server store (postgres://, redis://, etcd://, …)",
                path.display()
            ),
        ));
    }
    if fs_type == FUSE {
        tracing::warn!(path = %path.display(), "the SQLite store is on a FUSE file system; if it is a network file system, SQLite's locking is not safe there");
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn req(election: &str, holder: &str) -> AcquireRequest {
        AcquireRequest::new(
            ElectionName::new(election).unwrap(),
            HolderId::new(holder).unwrap(),
            Duration::from_secs(30),
        )
    }

    /// A change's election and what it carries: the record, `Some(None)` for no lease,
    /// `None` for "read again".
    fn parts(c: &Change) -> (&str, Option<Option<LeaseRecord>>) {
        match c {
            Change::Election { name, carries } => (
                name,
                match carries {
                    tenure::store::Carries::Record(r) => Some(Some(r.clone())),
                    tenure::store::Carries::NoLease => Some(None),
                    tenure::store::Carries::ReadAgain => None,
                },
            ),
            Change::Everything => ("", None),
        }
    }

    #[tokio::test]
    async fn the_change_feed_names_each_changed_election_once_with_its_record() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("leases.db");
        let store = SqliteStore::open(&path).await.unwrap();
        let conn = connect(&path, &SqliteOptions::default()).unwrap();
        let boot = boot_id();
        let since = |cursor: i64| {
            let (changes, next) = changed_since(&conn, cursor, &boot).unwrap();
            (changes.expect("the count did not go down"), next)
        };
        let (none, start) = since(0);
        assert!(none.is_empty());
        let Acquire::Acquired(a) = store.try_acquire(&req("a", "x")).await.unwrap() else { panic!("a not won") };
        let Acquire::Acquired(b) = store.try_acquire(&req("b", "y")).await.unwrap() else { panic!("b not won") };
        let (changes, cursor) = since(start);
        let names: Vec<&str> = changes.iter().map(|c| parts(c).0).collect();
        assert_eq!(names, ["a", "b"]);
        let carried = parts(&changes[1]).1.unwrap().unwrap();
        assert_eq!((carried.holder.as_str(), carried.token), ("y", b.token));
        // A renewal of b (three rows in one batch would be three changes) concerns b only.
        let Renew::Renewed(b2) = store.renew(&b, Duration::from_secs(30)).await.unwrap() else { panic!("b lost") };
        let (changes, cursor) = since(cursor);
        assert_eq!(changes.len(), 1);
        assert_eq!(parts(&changes[0]).1.unwrap().unwrap().revision, b2.revision);
        // A release is told as "no record".
        store.release(&a).await.unwrap();
        let (changes, cursor) = since(cursor);
        assert_eq!((parts(&changes[0]).0, changes.len()), ("a", 1));
        assert!(parts(&changes[0]).1.unwrap().is_none());
        let (none, cursor) = since(cursor);
        assert!(none.is_empty());
        // A new grant after the release (the row is replaced) is told too.
        let Acquire::Acquired(a2) = store.try_acquire(&req("a", "z")).await.unwrap() else { panic!("a not won") };
        let (changes, _) = since(cursor);
        assert_eq!(changes.len(), 1, "{:?}", changes.iter().map(|c| parts(c).0).collect::<Vec<_>>());
        assert_eq!(parts(&changes[0]).1.unwrap().unwrap().token, a2.token);
        // A cursor past the count (the file went back): no changes to tell, and the count
        // as it is now.
        let (gone_back, now) = changed_since(&conn, i64::MAX, &boot).unwrap();
        assert!(gone_back.is_none() && now < i64::MAX);
    }

    #[test]
    fn releases_skip_the_sync_only_in_wal_mode_with_a_real_boot_id() {
        let id = "0f1e2d3c-4b5a-6978-8796-a5b4c3d2e1f0";
        assert_eq!(release_durability(true, id), Durability::Visible);
        assert_eq!(release_durability(false, id), Durability::Full);
        for bad in [
            UNKNOWN_BOOT,
            "",
            "0f1e2d3c-4b5a-6978-8796-a5b4c3d2e1f",
            "0f1e2d3c-4b5a-6978-8796-a5b4c3d2e1fg",
            "0f1e2d3c04b5a-6978-8796-a5b4c3d2e1f0",
        ] {
            assert_eq!(release_durability(true, bad), Durability::Full, "boot id {bad:?}");
        }
    }

    /// Releases are committed without waiting for the disk; every other write, even one
    /// right after a release (or a failed one) on the same connection, waits for it. The
    /// level is read inside each transaction.
    #[tokio::test]
    async fn only_releases_skip_the_sync_and_every_other_write_is_synced() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("leases.db");
        let options = SqliteOptions { busy_timeout: Duration::from_millis(50), ..SqliteOptions::default() };
        let store = SqliteStore::open_with(&path, options).await.unwrap();
        // SQLite's levels: 1 is NORMAL (no sync at commit), 2 is FULL. Releases on this
        // host skip the sync unless its boot id cannot be read.
        let release_level = if release_durability(true, &boot_id()) == Durability::Visible { 1 } else { 2 };
        // The level each write since the last look ran with, one per transaction.
        let ran = || std::mem::take(&mut *store.inner.levels.lock().unwrap());
        let ttl = Duration::from_secs(30);
        let won = |got: Acquire| match got {
            Acquire::Acquired(l) => l,
            Acquire::Held(r) => panic!("{} is held by {}", r.election, r.holder),
        };
        let renewed = |got: Renew| match got {
            Renew::Renewed(l) => l,
            Renew::Lost(_) => panic!("a renewal was lost"),
        };
        let a = won(store.try_acquire(&req("a", "x")).await.unwrap());
        assert_eq!(ran(), [("acquire", 2)]);
        store.release(&a).await.unwrap();
        assert_eq!(ran(), [("release", release_level)]);
        let a = won(store.try_acquire(&req("a", "y")).await.unwrap());
        store.release_many(std::slice::from_ref(&a)).await.into_iter().for_each(|r| r.unwrap());
        assert_eq!(ran(), [("acquire", 2), ("release", release_level)]);
        let a = won(store.try_acquire(&req("a", "z")).await.unwrap());
        let b = won(store.try_acquire(&req("b", "z")).await.unwrap());
        store.release(&b).await.unwrap();
        let a = renewed(store.renew(&a, ttl).await.unwrap());
        store.release(&b).await.unwrap();
        let mut many = store.renew_many(std::slice::from_ref(&a), ttl).await;
        let a = renewed(many.pop().unwrap().unwrap());
        assert_eq!(
            ran(),
            [
                ("acquire", 2),
                ("acquire", 2),
                ("release", release_level),
                ("renew", 2),
                ("release", release_level),
                ("renew", 2)
            ]
        );
        for how in [Evict::AfterTerm, Evict::Now] {
            store.release(&b).await.unwrap();
            store.evict(&a.election, how).await.unwrap();
            assert_eq!(ran(), [("release", release_level), ("evict", 2)], "{how:?}");
        }
        // A release that fails (another connection holds the write lock) leaves the
        // connection at its level, and the next grant is synced all the same.
        let b = won(store.try_acquire(&req("b", "w")).await.unwrap());
        let other = Connection::open(&path).unwrap();
        other.execute_batch("BEGIN IMMEDIATE").unwrap();
        assert!(store.release(&b).await.is_err(), "the release went through a held write lock");
        other.execute_batch("COMMIT").unwrap();
        won(store.try_acquire(&req("c", "w")).await.unwrap());
        assert_eq!(ran(), [("acquire", 2), ("acquire", 2)], "the failed release began no transaction");
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_watch_hears_another_connection_s_write_without_waiting_for_its_next_look() {
        use tokio_stream::StreamExt;
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("leases.db");
        // This handle looks for changes once an hour: only a wake-up can tell it sooner.
        let slow = SqliteOptions { watch_interval: Duration::from_secs(3600), ..SqliteOptions::default() };
        let watcher = SqliteStore::open_with(&path, slow).await.unwrap();
        let writer = SqliteStore::open(&path).await.unwrap();
        let e = ElectionName::new("woken").unwrap();
        let mut watch = watcher.watch(&e).unwrap();
        let within = Duration::from_secs(20);
        let first = tokio::time::timeout(within, watch.next()).await.expect("the first report").unwrap().unwrap();
        assert_eq!(first, None);
        let Acquire::Acquired(held) = writer.try_acquire(&req("woken", "x")).await.unwrap() else { panic!("not won") };
        let told =
            tokio::time::timeout(within, watch.next()).await.expect("the acquire was not told").unwrap().unwrap();
        assert_eq!(told.map(|r| r.token), Some(held.token));
        writer.release(&held).await.unwrap();
        let told =
            tokio::time::timeout(within, watch.next()).await.expect("the release was not told").unwrap().unwrap();
        assert_eq!(told, None);
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn each_commit_is_announced_on_the_wake_up_file() {
        use rustix::fs::inotify;
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("leases.db");
        let writer = SqliteStore::open(&path).await.unwrap();
        let wake = dir.path().join("leases.db-wake");
        let fd = inotify::init(inotify::CreateFlags::CLOEXEC).unwrap();
        inotify::add_watch(&fd, &wake, inotify::WatchFlags::MODIFY).expect("the wake-up file exists");
        // A reader that, like a watch thread in another process, reads the row as soon as
        // the file is written: it finds the commit that was announced. (The write follows
        // the commit in `transact`; this test cannot see an announcement made early, since
        // a commit here takes less time than a thread's wake-up.)
        let reader = |fd: rustix::fd::OwnedFd, path: PathBuf| {
            std::thread::spawn(move || {
                let conn = Connection::open(&path).unwrap();
                let mut buf = [std::mem::MaybeUninit::<u8>::uninit(); 1024];
                inotify::Reader::new(&fd, &mut buf).next().expect("an announcement");
                let holder = conn
                    .query_row("SELECT holder FROM tenure_leases WHERE election = 'told'", [], |r| r.get(0))
                    .optional()
                    .unwrap()
                    .flatten();
                (fd, holder)
            })
        };
        let seen = reader(fd, path.clone());
        let Acquire::Acquired(held) = writer.try_acquire(&req("told", "x")).await.unwrap() else { panic!("not won") };
        let (fd, holder): (_, Option<String>) = seen.join().unwrap();
        assert_eq!(holder.as_deref(), Some("x"), "woken before the acquire's commit could be read");
        let seen = reader(fd, path.clone());
        writer.release(&held).await.unwrap();
        let (fd, holder) = seen.join().unwrap();
        assert_eq!(holder, None, "woken before the release's commit could be read");
        // A read, and a release of a lease already gone, change nothing and announce nothing.
        writer.get(&held.election).await.unwrap();
        writer.release(&held).await.unwrap();
        rustix::fs::fcntl_setfl(&fd, rustix::fs::OFlags::NONBLOCK).unwrap();
        let mut buf = [std::mem::MaybeUninit::<u8>::uninit(); 1024];
        assert!(inotify::Reader::new(&fd, &mut buf).next().is_err(), "a commit that changed nothing was announced");
    }

    #[tokio::test]
    async fn a_version_1_database_is_migrated_with_its_leases() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("leases.db");
        {
            let conn = Connection::open(&path).unwrap();
            conn.execute_batch(&format!("{SCHEMA} PRAGMA user_version = 1;")).unwrap();
            conn.execute(
                &format!(
                    "INSERT INTO tenure_leases ({COLUMNS}) VALUES ('a', 'old', 7, 3, 30000, ?1, ?2, 0, 0, 0, x'')"
                ),
                params![boot_id(), monotonic_ns() + 30_000_000_000],
            )
            .unwrap();
        }
        let store = SqliteStore::open(&path).await.unwrap();
        let held = store.get(&ElectionName::new("a").unwrap()).await.unwrap().expect("the lease survived");
        assert_eq!((held.holder.as_str(), held.token), ("old", FencingToken(7)));
        assert!(matches!(store.try_acquire(&req("a", "new")).await.unwrap(), Acquire::Held(_)));
        let version: i64 = Connection::open(&path).unwrap().query_row("PRAGMA user_version", [], |r| r.get(0)).unwrap();
        assert_eq!(version, SCHEMA_VERSION);
        // A file set back to version 1 (an older tenure creating it at the same moment)
        // is brought up to date again without error.
        Connection::open(&path).unwrap().execute_batch("PRAGMA user_version = 1").unwrap();
        let store = SqliteStore::open(&path).await.unwrap();
        // Writes after the migration move the change feed.
        let conn = connect(&path, &SqliteOptions::default()).unwrap();
        store.release(&held).await.unwrap();
        let (changes, _) = changed_since(&conn, 0, &boot_id()).unwrap();
        assert_eq!(changes.map(|c| c.len()), Some(1));
        let Acquire::Acquired(next) = store.try_acquire(&req("a", "new")).await.unwrap() else { panic!("not won") };
        assert!(next.token > FencingToken(7), "{:?}", next.token);
    }

    #[tokio::test]
    async fn a_row_whose_token_cannot_grow_is_refused_with_an_error_that_says_so() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("t.db");
        let store = SqliteStore::open(&path).await.unwrap();
        let Acquire::Acquired(l) = store.try_acquire(&req("a", "x")).await.unwrap() else { panic!("not won") };
        store.release(&l).await.unwrap();
        connect(&path, &SqliteOptions::default())
            .unwrap()
            .execute("UPDATE tenure_leases SET token = ?1", [i64::MAX])
            .unwrap();
        let e = store.try_acquire(&req("a", "y")).await.unwrap_err();
        assert_eq!(e.kind(), ErrorKind::Misconfigured, "{e}");
        assert!(e.to_string().contains("cannot grow") && e.to_string().contains("delete that row"), "{e}");
    }

    /// Waits until the last connection to the database at `path` has closed: a dropped
    /// store's connection closes on its own thread, and the last one to close deletes the
    /// log and the shared memory by name.
    fn wait_until_closed(path: &Path) {
        let t0 = std::time::Instant::now();
        while ["-wal", "-shm"].iter().any(|s| beside(path, s).exists()) {
            assert!(t0.elapsed() < std::time::Duration::from_secs(10), "the dropped store's connection did not close");
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
    }

    #[tokio::test]
    async fn a_second_name_that_goes_within_moments_is_a_database_being_made_not_a_hard_link() {
        // A maker links its new file into place, then removes the temporary name: a
        // candidate that opens the database between the two must not stop campaigning.
        let dir = tempfile::tempdir().unwrap();
        let (path, tmp) = (dir.path().join("t.db"), dir.path().join("t.db-new.1"));
        drop(SqliteStore::open(&path).await.unwrap());
        wait_until_closed(&path);
        std::fs::hard_link(&path, &tmp).unwrap();
        let gone = std::thread::spawn(move || {
            std::thread::sleep(std::time::Duration::from_millis(200));
            std::fs::remove_file(&tmp).unwrap();
        });
        let opened = SqliteStore::open(&path).await;
        gone.join().unwrap();
        assert!(opened.is_ok(), "a database being made was taken for one with two names: {:?}", opened.err());
    }

    #[tokio::test]
    async fn a_database_with_two_names_is_refused_by_either() {
        let dir = tempfile::tempdir().unwrap();
        let (path, other) = (dir.path().join("t.db"), dir.path().join("u.db"));
        drop(SqliteStore::open(&path).await.unwrap());
        wait_until_closed(&path);
        std::fs::hard_link(&path, &other).unwrap();
        for p in [&path, &other] {
            let e = SqliteStore::open(p).await.err().expect("a database with two names was opened");
            assert_eq!(e.kind(), ErrorKind::Misconfigured, "{e}");
            assert!(e.to_string().contains("2 names (hard links)"), "{e}");
        }
        std::fs::remove_file(&other).unwrap();
        SqliteStore::open(&path).await.unwrap();
    }

    #[tokio::test]
    async fn a_database_restored_from_a_backup_grants_no_token_granted_since_the_backup() {
        let dir = tempfile::tempdir().unwrap();
        let (path, backup) = (dir.path().join("t.db"), dir.path().join("backup.db"));
        let store = SqliteStore::open(&path).await.unwrap();
        let Acquire::Acquired(first) = store.try_acquire(&req("a", "x")).await.unwrap() else { panic!("not won") };
        store.release(&first).await.unwrap();
        connect(&path, &SqliteOptions::default())
            .unwrap()
            .execute("VACUUM INTO ?1", [backup.to_str().unwrap()])
            .unwrap();
        let mut last = first.token;
        for _ in 0..3 {
            let Acquire::Acquired(l) = store.try_acquire(&req("a", "x")).await.unwrap() else { panic!("not won") };
            store.release(&l).await.unwrap();
            last = l.token;
        }
        drop(store);
        // A restore is done with every process that uses the database stopped: wait for
        // the dropped store's connection to close, or it could delete the restored
        // database's log and shared memory.
        wait_until_closed(&path);
        // A restore puts the backup in place of the database and its log.
        for suffix in ["-wal", "-shm"] {
            let _ = std::fs::remove_file(format!("{}{suffix}", path.display()));
        }
        std::fs::rename(&backup, &path).unwrap();
        let restored = SqliteStore::open(&path).await.unwrap();
        let Acquire::Acquired(l) = restored.try_acquire(&req("a", "x")).await.unwrap() else { panic!("not won") };
        assert!(l.token > last, "the restored database granted {:?} after {:?}", l.token, last);
    }
}
