//! A database deleted (or replaced) under a running leader: the leader's store notices
//! and the term ends within milliseconds, the new file grants nothing before the old
//! term's deadline, and never a token the old one granted.

use std::sync::Arc;
use std::time::{Duration, Instant};

use tenure::{Elector, LeaseStore};
use tenure_sqlite::SqliteStore;

fn elector(store: Arc<dyn LeaseStore>, holder: &str) -> Elector {
    Elector::builder(store, "jobs/report").holder(holder).ttl(TTL).build().unwrap()
}

const TTL: Duration = Duration::from_secs(3);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_database_deleted_under_its_leader_ends_the_term_and_never_repeats_a_token() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("t.db");
    let a = elector(Arc::new(SqliteStore::open(&path).await.unwrap()), "a");
    let la = a.leadership().await.unwrap();
    // The leader renews every TTL/3: what follows must not wait for that.
    tokio::time::sleep(Duration::from_millis(200)).await;
    // Every file (one the store makes meanwhile, noticing, may come and go).
    for entry in std::fs::read_dir(dir.path()).unwrap() {
        let _ = std::fs::remove_file(entry.unwrap().path());
    }
    let deleted = Instant::now();
    // As far as a knows, its lease holds until then, and so may its command run.
    let a_deadline = la.deadline();
    // A new candidate, as a process started after the deletion would be: the file it
    // makes grants nothing while the old leader may still run its command.
    let b = elector(Arc::new(SqliteStore::open(&path).await.unwrap()), "b");
    let lb = tokio::time::timeout(TTL * 3, b.leadership()).await.expect("b leads").unwrap();
    assert!(
        tenure::Instant::now() >= a_deadline,
        "b was elected {:?} after the deletion, {:?} before the deadline of a, the leader of the deleted database",
        deleted.elapsed(),
        a_deadline - tenure::Instant::now()
    );
    assert!(!la.is_valid(), "b was elected while a, the leader of the deleted database, led on");
    assert!(
        lb.token() > la.token(),
        "a token the deleted database granted came again: {} then {}",
        la.token(),
        lb.token()
    );
    let ended = tokio::time::timeout(Duration::from_secs(2), la.cancelled()).await;
    assert!(ended.is_ok(), "the leader of the deleted database led on past its next chance to notice");
    drop((la, lb));
    a.shutdown().await;
    b.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_backup_restored_under_a_new_leader_does_not_bring_back_the_old_leaders_term() {
    let dir = tempfile::tempdir().unwrap();
    let (path, backup) = (dir.path().join("t.db"), dir.path().join("backup.db"));
    let a = elector(Arc::new(SqliteStore::open(&path).await.unwrap()), "a");
    let la = a.leadership().await.unwrap();
    let b = elector(Arc::new(SqliteStore::open(&path).await.unwrap()), "b");
    // A backup while a leads: its record names a, live.
    rusqlite::Connection::open(&path).unwrap().execute("VACUUM INTO ?1", [backup.to_str().unwrap()]).unwrap();
    // a is evicted; b takes over.
    let evictor = SqliteStore::open(&path).await.unwrap();
    evictor.evict(&tenure::ElectionName::new("jobs/report").unwrap(), tenure::Evict::AfterTerm).await.unwrap();
    // a's work ends with its term (a campaigns again only once it has).
    tokio::time::timeout(TTL, la.cancelled()).await.expect("the eviction ends a's term");
    let a_token = la.token();
    drop(la);
    let lb = tokio::time::timeout(TTL * 3, b.leadership()).await.expect("b leads").unwrap();
    assert!(lb.token() > a_token);
    // The backup is moved into place: a's record is live in it again.
    for suffix in ["-wal", "-shm"] {
        let _ = std::fs::remove_file(format!("{}{suffix}", path.display()));
    }
    std::fs::rename(&backup, &path).unwrap();
    let b_deadline = lb.deadline();
    let la2 = tokio::time::timeout(TTL * 4, a.leadership()).await.expect("a leads again").unwrap();
    assert!(
        tenure::Instant::now() >= b_deadline,
        "a led again {:?} before the deadline of b, which led when the backup came back",
        b_deadline - tenure::Instant::now()
    );
    assert!(la2.token() > lb.token(), "a led again with token {} after b's {}", la2.token(), lb.token());
    drop((lb, la2));
    a.shutdown().await;
    b.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_database_deleted_twice_grants_nothing_before_the_first_leaders_deadline() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("t.db");
    let a = elector(Arc::new(SqliteStore::open(&path).await.unwrap()), "a");
    let la = a.leadership().await.unwrap();
    let a_deadline = la.deadline();
    let rm = || {
        for entry in std::fs::read_dir(dir.path()).unwrap() {
            let _ = std::fs::remove_file(entry.unwrap().path());
        }
    };
    rm();
    tokio::time::timeout(Duration::from_secs(2), la.cancelled()).await.expect("a notices the deletion");
    tokio::time::sleep(Duration::from_millis(150)).await;
    rm();
    let c = elector(Arc::new(SqliteStore::open(&path).await.unwrap()), "c");
    let lc = tokio::time::timeout(TTL * 3, c.leadership()).await.expect("c leads").unwrap();
    assert!(
        tenure::Instant::now() >= a_deadline,
        "c was elected {:?} before the deadline of a, the leader of the first file",
        a_deadline - tenure::Instant::now()
    );
    assert!(lc.token() > la.token());
    drop((la, lc));
    a.shutdown().await;
    c.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fifo_planted_where_the_wake_file_goes_does_not_hang_the_store() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("t.db");
    let fifo = dir.path().join("t.db-wake");
    let made = std::process::Command::new("mkfifo").arg(&fifo).status().unwrap();
    assert!(made.success());
    let open = tokio::time::timeout(Duration::from_secs(5), SqliteStore::open(&path)).await;
    let store = open.expect("opening the store hung on the FIFO").unwrap();
    let e = elector(Arc::new(store), "a");
    let l = tokio::time::timeout(Duration::from_secs(5), e.leadership()).await.expect("a leads").unwrap();
    drop(l);
    e.shutdown().await;
}

#[tokio::test]
async fn a_symbolic_link_to_nothing_is_refused_and_nothing_is_made_through_it() {
    let dir = tempfile::tempdir().unwrap();
    let (link, target) = (dir.path().join("t.db"), dir.path().join("elsewhere.db"));
    std::os::unix::fs::symlink(&target, &link).unwrap();
    let err = SqliteStore::open(&link).await.err().expect("a dangling link was opened");
    assert!(err.to_string().contains("symbolic link to a file that does not exist"), "{err}");
    assert!(!target.exists(), "a file was made through the link");
}

/// Waits for `candidate` to lead and asserts it was elected no earlier than `deadline`
/// (that of the leader of a file that went) with a larger token.
async fn leads_after(
    candidate: &Elector,
    deadline: tenure::Instant,
    old_token: tenure::FencingToken,
) -> tenure::Leadership {
    let won = tokio::time::timeout(TTL * 4, candidate.leadership()).await.expect("it leads").unwrap();
    assert!(
        tenure::Instant::now() >= deadline,
        "a leader was elected {:?} before the deadline of the leader of the file that went",
        deadline - tenure::Instant::now()
    );
    assert!(won.token() > old_token, "token {} after {}", won.token(), old_token);
    won
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_database_deleted_without_its_log_neither_crashes_its_leader_nor_lends_the_log_to_the_new_file() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("t.db");
    let a = elector(Arc::new(SqliteStore::open(&path).await.unwrap()), "a");
    let la = a.leadership().await.unwrap();
    tokio::time::sleep(Duration::from_millis(200)).await;
    // `rm t.db`, its -wal and -shm left. A new candidate in this same process: had it
    // attached the old -shm, its connection would truncate it under a's (SIGBUS kills the
    // test), and the new file would read the old one's log.
    std::fs::remove_file(&path).unwrap();
    let b = elector(Arc::new(SqliteStore::open(&path).await.unwrap()), "b");
    let lb = leads_after(&b, la.deadline(), la.token()).await;
    assert!(!la.is_valid(), "b was elected while a, the leader of the deleted database, led on");
    drop((la, lb));
    a.shutdown().await;
    b.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_leader_whose_log_is_deleted_steps_down_and_leads_no_more() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("t.db");
    let a = elector(Arc::new(SqliteStore::open(&path).await.unwrap()), "a");
    let la = a.leadership().await.unwrap();
    tokio::time::sleep(Duration::from_millis(200)).await;
    // Its -wal and -shm go: what it commits from now on nobody else would read (another
    // process opening the file makes a new log), so it must not lead on, nor again.
    for suffix in ["-wal", "-shm"] {
        std::fs::remove_file(format!("{}{suffix}", path.display())).unwrap();
    }
    tokio::time::timeout(TTL, la.cancelled()).await.expect("a led on in a log nobody reads");
    drop(la);
    // It stops campaigning, with an error that says why.
    let again = tokio::time::timeout(TTL * 2, a.leadership()).await.expect("a campaigns on, silently");
    let err = again.expect_err("a led again in a log nobody reads");
    let mut chain = err.to_string();
    let mut source = std::error::Error::source(&err);
    while let Some(s) = source {
        chain = format!("{chain}: {s}");
        source = s.source();
    }
    assert!(chain.contains("-shm was deleted or replaced"), "{chain}");
    a.shutdown().await;
}

#[tokio::test]
async fn a_database_made_anew_shares_no_memory_or_log_with_the_file_deleted_before_it() {
    use std::os::unix::fs::MetadataExt;
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("t.db");
    let (wal, shm) = (dir.path().join("t.db-wal"), dir.path().join("t.db-shm"));
    // A process of the old file wrote to it and still has it open (its log is not
    // checkpointed), then `rm t.db` alone: its -wal and -shm stay at the path.
    let old = rusqlite::Connection::open(&path).unwrap();
    old.query_row("PRAGMA journal_mode = WAL", [], |r| r.get::<_, String>(0)).unwrap();
    old.execute_batch("PRAGMA wal_autocheckpoint = 0; CREATE TABLE old_rows (x); INSERT INTO old_rows VALUES (1);")
        .unwrap();
    let old_shm = std::fs::metadata(&shm).unwrap().ino();
    let old_wal = std::fs::metadata(&wal).unwrap().ino();
    std::fs::remove_file(&path).unwrap();
    let store = SqliteStore::open(&path).await.unwrap();
    let e = elector(Arc::new(store), "b");
    let l = tokio::time::timeout(TTL * 3, e.leadership()).await.expect("b leads").unwrap();
    // Had the new file taken the old one's shared memory (its wal-index), SQLite would
    // rebuild that index for the new log under the old file's process, which then reads
    // its own log through an index of another (wrong pages, or SIGBUS when the file is
    // truncated under its mapping); and the old log would be read as the new file's.
    assert_ne!(std::fs::metadata(&shm).unwrap().ino(), old_shm, "the new file shares the old one's -shm");
    assert_ne!(std::fs::metadata(&wal).unwrap().ino(), old_wal, "the new file took the old one's -wal");
    let tables: Vec<String> = rusqlite::Connection::open(&path)
        .unwrap()
        .prepare("SELECT name FROM sqlite_master WHERE type = 'table'")
        .unwrap()
        .query_map([], |r| r.get(0))
        .unwrap()
        .collect::<Result<_, _>>()
        .unwrap();
    assert!(!tables.contains(&"old_rows".to_string()), "the new file reads the deleted file's log: {tables:?}");
    drop(l);
    e.shutdown().await;
    // Never closed, as a process of the old file would not be.
    std::mem::forget(old);
}

#[tokio::test]
async fn a_fifo_planted_where_the_database_is_made_neither_hangs_nor_is_passed_over() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("t.db");
    let made = std::process::Command::new("mkfifo").arg(dir.path().join("t.db-create")).status().unwrap();
    assert!(made.success());
    let open = tokio::time::timeout(Duration::from_secs(5), SqliteStore::open(&path)).await;
    let err = open.expect("opening the store hung on the FIFO").err().expect("a FIFO was taken for the lock");
    assert!(err.to_string().contains("t.db-create"), "{err}");
    assert!(!path.exists(), "the database was made without the lock");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_copy_moved_over_the_database_with_the_old_logs_left_is_refused_on_every_call() {
    let dir = tempfile::tempdir().unwrap();
    let (path, copy) = (dir.path().join("t.db"), dir.path().join("copy.db"));
    let a = elector(Arc::new(SqliteStore::open(&path).await.unwrap()), "a");
    let la = a.leadership().await.unwrap();
    rusqlite::Connection::open(&path).unwrap().execute("VACUUM INTO ?1", [copy.to_str().unwrap()]).unwrap();
    // Moved over the database; its -wal and -shm stay, still the ones a has open.
    std::fs::rename(&copy, &path).unwrap();
    tokio::time::timeout(TTL * 2, la.cancelled()).await.expect("a led on in the copy with the old logs");
    drop(la);
    // Not on the next call either: every call refuses until the logs are removed.
    let again = tokio::time::timeout(TTL * 2, a.leadership()).await;
    assert!(!matches!(again, Ok(Ok(_))), "a led again on the copy with the old logs");
    a.shutdown().await;
}

/// A grant request of `holder` for the election `jobs/report`.
fn request(holder: &str) -> tenure::store::AcquireRequest {
    let election = tenure::ElectionName::new("jobs/report").unwrap();
    tenure::store::AcquireRequest::new(election, tenure::HolderId::new(holder).unwrap(), TTL)
}

/// Removes the database at `path` with its log and shared memory.
fn remove_database(path: &std::path::Path) {
    for suffix in ["", "-wal", "-shm"] {
        let _ = std::fs::remove_file(format!("{}{suffix}", path.display()));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_leader_elected_while_its_directory_was_locked_takes_the_lock_at_its_next_renewal() {
    use tenure::store::{Acquire, Renew};
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("t.db");
    let a = SqliteStore::open(&path).await.unwrap();
    // Someone else holds the directory exclusively for a while (another user may).
    let other = std::fs::File::open(dir.path()).unwrap();
    rustix::fs::flock(&other, rustix::fs::FlockOperation::NonBlockingLockExclusive).unwrap();
    let Acquire::Acquired(lease) = a.try_acquire(&request("a")).await.unwrap() else { panic!("a was not elected") };
    drop(other);
    let Renew::Renewed(_) = a.renew(&lease, TTL).await.unwrap() else { panic!("a lost its lease") };
    // a freezes (it makes no call from here on) and its database goes; a new process
    // makes the file anew, and must not grant while a's term may go on.
    assert_a_new_file_grants_nothing(&path).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_leader_that_reaches_its_database_through_a_symbolic_link_is_seen_by_one_that_does_not() {
    use tenure::store::Acquire;
    let dir = tempfile::tempdir().unwrap();
    let (real, links) = (dir.path().join("y"), dir.path().join("x"));
    std::fs::create_dir(&real).unwrap();
    std::fs::create_dir(&links).unwrap();
    let path = real.join("e.db");
    let a = SqliteStore::open(&path).await.unwrap();
    drop(a);
    std::os::unix::fs::symlink(&path, links.join("link.db")).unwrap();
    let a = SqliteStore::open(links.join("link.db")).await.unwrap();
    let Acquire::Acquired(_) = a.try_acquire(&request("a")).await.unwrap() else { panic!("a was not elected") };
    // a freezes; the database goes, and a process that names the real path makes it anew.
    assert_a_new_file_grants_nothing(&path).await;
}

/// Removes the database at `path` under a frozen leader, and checks that the file a new
/// process makes there grants nothing while the leader's term may go on.
async fn assert_a_new_file_grants_nothing(path: &std::path::Path) {
    remove_database(path);
    let n = SqliteStore::open(path).await.unwrap();
    let got = n.try_acquire(&request("n")).await;
    assert!(
        got.as_ref().is_err_and(|e| e.kind() == tenure::ErrorKind::Unavailable),
        "a new file granted while the leader of the deleted one may run: {got:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_database_deleted_again_and_again_ends_in_a_final_error_not_in_running_out_of_descriptors() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("t.db");
    let store = SqliteStore::open(&path).await.unwrap();
    let election = tenure::ElectionName::new("jobs/report").unwrap();
    let mut failed = None;
    for round in 0..40 {
        remove_database(&path);
        if let Err(e) = store.get(&election).await {
            failed = Some((round, e));
            break;
        }
    }
    let (round, e) = failed.expect("40 replacements were all taken");
    assert_eq!(round, 32, "{e}");
    assert_eq!(e.kind(), tenure::ErrorKind::Misconfigured, "{e}");
    assert!(e.to_string().contains("start it again"), "{e}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_backup_restored_into_the_file_brings_back_no_ended_term_and_no_old_token() {
    use tenure::store::Acquire;
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("t.db");
    let a = SqliteStore::open(&path).await.unwrap();
    let b = SqliteStore::open(&path).await.unwrap();
    let Acquire::Acquired(la) = a.try_acquire(&request("a")).await.unwrap() else { panic!("a was not elected") };
    // A backup, taken while a leads.
    let backup = dir.path().join("backup.db");
    let conn = rusqlite::Connection::open(&path).unwrap();
    conn.execute("VACUUM INTO ?1", [backup.display().to_string()]).unwrap();
    // a's term ends (released) and b is elected.
    a.release(&la).await.unwrap();
    let Acquire::Acquired(lb) = b.try_acquire(&request("b")).await.unwrap() else { panic!("b was not elected") };
    // The backup restored into the file, which stays the same file (as `.restore` does):
    // a's record is back, live, with a's token.
    conn.execute("ATTACH ?1 AS bk", [backup.display().to_string()]).unwrap();
    conn.execute_batch(
        "BEGIN IMMEDIATE; DELETE FROM tenure_leases; INSERT INTO tenure_leases SELECT * FROM bk.tenure_leases;
         DELETE FROM tenure_seq; INSERT INTO tenure_seq SELECT * FROM bk.tenure_seq; COMMIT;",
    )
    .unwrap();
    // a, still a candidate, must not take the restored record for its own live term.
    let got = a.try_acquire(&request("a")).await;
    assert!(
        !matches!(&got, Ok(Acquire::Acquired(l)) if l.token <= lb.token),
        "a was elected again with token {:?} (a's old one {}) beside b (token {}) after the restore",
        got.as_ref().ok(),
        la.token,
        lb.token
    );
}

/// After a backup restored in place is noticed, leadership settles: a follower whose watch
/// had counted past the restored file must not notice the same rollback again at every
/// later transaction (each leader then lost its lease at its first renewal, over and
/// over, until the count caught up with the old one).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restore_is_noticed_once_and_the_next_leader_renews_on() {
    use tenure::store::{Acquire, AcquireRequest, Renew};
    let ttl = Duration::from_millis(600);
    let election = tenure::ElectionName::new("jobs/report").unwrap();
    let req = |h: &str| AcquireRequest::new(election.clone(), tenure::HolderId::new(h).unwrap(), ttl);
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("t.db");
    let a = SqliteStore::open(&path).await.unwrap();
    let b = SqliteStore::open(&path).await.unwrap();
    // b follows through its watch, as a candidate that does not lead does.
    let _watching = b.watch(&election).expect("SQLite tells of changes");
    let Acquire::Acquired(mut la) = a.try_acquire(&req("a")).await.unwrap() else { panic!("a was not elected") };
    assert!(matches!(b.try_acquire(&req("b")).await.unwrap(), Acquire::Held(_)));
    let backup = dir.path().join("backup.db");
    let conn = rusqlite::Connection::open(&path).unwrap();
    conn.execute("VACUUM INTO ?1", [backup.display().to_string()]).unwrap();
    // Many writes after the backup, which b's watch reads.
    for _ in 0..20 {
        let Renew::Renewed(next) = a.renew(&la, ttl).await.unwrap() else { panic!("a lost its lease") };
        la = next;
    }
    a.release(&la).await.unwrap();
    tokio::time::sleep(Duration::from_millis(300)).await;
    conn.execute("ATTACH ?1 AS bk", [backup.display().to_string()]).unwrap();
    conn.execute_batch(
        "BEGIN IMMEDIATE; DELETE FROM tenure_leases; INSERT INTO tenure_leases SELECT * FROM bk.tenure_leases;
         DELETE FROM tenure_seq; INSERT INTO tenure_seq SELECT * FROM bk.tenure_seq; COMMIT;",
    )
    .unwrap();
    tokio::time::sleep(Duration::from_millis(300)).await;
    // b is elected once the rollback's pause is over, and then renews on, every TTL/3.
    let t0 = Instant::now();
    let mut lb = loop {
        if let Ok(Acquire::Acquired(l)) = b.try_acquire(&req("b")).await {
            break l;
        }
        assert!(t0.elapsed() < Duration::from_secs(10), "b was not elected within 10 s of the restore");
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    for i in 0..6 {
        tokio::time::sleep(ttl / 3).await;
        match b.renew(&lb, ttl).await {
            Ok(Renew::Renewed(next)) => lb = next,
            other => panic!("renewal {i} after the restore: {other:?}"),
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_name_of_another_database_moved_over_the_file_is_refused_by_its_leader() {
    // a leads in t.db and b in other.db. A hard link to other.db moved over t.db makes the
    // two one file under two names, each with a log of its own beside it: a must not
    // reopen it and take b's lease, which it cannot see in b's log, for a term of its own.
    // Two guards hold it: the store refuses a file with two names when it reopens, and
    // SQLite itself refuses the second name's log while b's connection is open (with the
    // first guard planted away, the second still held here).
    let dir = tempfile::tempdir().unwrap();
    let (path, other, link) = (dir.path().join("t.db"), dir.path().join("other.db"), dir.path().join("link.db"));
    // other.db made whole first (its last connection closed, its log written back), as a
    // database in use for a while is.
    drop(SqliteStore::open(&other).await.unwrap());
    let t0 = Instant::now();
    while std::fs::exists(dir.path().join("other.db-wal")).unwrap() {
        assert!(t0.elapsed() < Duration::from_secs(10), "the dropped store's connection did not close");
        std::thread::sleep(Duration::from_millis(5));
    }
    let a = elector(Arc::new(SqliteStore::open(&path).await.unwrap()), "a");
    let b = elector(Arc::new(SqliteStore::open(&other).await.unwrap()), "b");
    let (la, lb) = (a.leadership().await.unwrap(), b.leadership().await.unwrap());
    std::fs::hard_link(&other, &link).unwrap();
    remove_database(&path);
    std::fs::rename(&link, &path).unwrap();
    tokio::time::timeout(TTL * 2, la.cancelled()).await.expect("a led on in a file with two names");
    drop(la);
    let again = tokio::time::timeout(TTL * 2, a.leadership()).await;

    assert!(
        !matches!(again, Ok(Ok(_))),
        "a was elected again in the file that other.db also names, while b led there: {again:?}"
    );
    assert!(lb.is_valid(), "b's term in other.db ended");
    drop(lb);
    a.shutdown().await;
    b.shutdown().await;
}
