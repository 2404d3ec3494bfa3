//! A database deleted (or replaced) under a running leader: the leader's store notices
//! and the term ends within milliseconds, and the new file never grants a token the old
//! one granted.

use std::sync::Arc;
use std::time::{Duration, Instant};

use tenure::{Elector, LeaseStore};
use tenure_sqlite::SqliteStore;

fn elector(store: Arc<dyn LeaseStore>, holder: &str) -> Elector {
    Elector::builder(store, "jobs/report").holder(holder).ttl(Duration::from_secs(10)).build().unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_database_deleted_under_its_leader_ends_the_term_and_never_repeats_a_token() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("t.db");
    let a = elector(Arc::new(SqliteStore::open(&path).await.unwrap()), "a");
    let la = a.leadership().await.unwrap();
    // The leader renews every 3.3 s: what follows must not wait for that.
    tokio::time::sleep(Duration::from_millis(200)).await;
    for entry in std::fs::read_dir(dir.path()).unwrap() {
        std::fs::remove_file(entry.unwrap().path()).unwrap();
    }
    let deleted = Instant::now();
    // A new candidate, as a process started after the deletion would be.
    let b = elector(Arc::new(SqliteStore::open(&path).await.unwrap()), "b");
    let lb = tokio::time::timeout(Duration::from_secs(5), b.leadership()).await.expect("b leads").unwrap();
    assert!(
        lb.token() > la.token(),
        "a token the deleted database granted came again: {} then {}",
        la.token(),
        lb.token()
    );
    let ended = tokio::time::timeout(Duration::from_secs(2), la.cancelled()).await;
    assert!(ended.is_ok(), "the leader of the deleted database led on past its next chance to notice");
    eprintln!("the old term ended {:?} after the deletion", deleted.elapsed());
    assert!(deleted.elapsed() < Duration::from_secs(2), "the leader of the deleted database led on");
    drop((la, lb));
    a.shutdown().await;
    b.shutdown().await;
}
