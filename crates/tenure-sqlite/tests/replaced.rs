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
    for entry in std::fs::read_dir(dir.path()).unwrap() {
        std::fs::remove_file(entry.unwrap().path()).unwrap();
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
