//! A store's calls run on one thread of its own, which ends with the store. (A file of its
//! own: it counts this process's threads, which other tests would start too.)

use std::time::{Duration, Instant};

use tenure::store::{Acquire, AcquireRequest};
use tenure::{ElectionName, HolderId, LeaseStore};
use tenure_sqlite::SqliteStore;

/// Threads of this process whose name is `name`.
fn threads_named(name: &str) -> usize {
    std::fs::read_dir("/proc/self/task")
        .unwrap()
        .filter_map(|t| std::fs::read_to_string(t.ok()?.path().join("comm")).ok())
        .filter(|comm| comm.trim() == name)
        .count()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn many_calls_at_once_share_one_connection_thread_which_ends_with_the_store() {
    let dir = tempfile::tempdir().unwrap();
    let store = SqliteStore::open(dir.path().join("leases.db")).await.unwrap();
    // A new thread takes its name itself, once it runs: on a busy machine, a moment later.
    let named_by = Instant::now() + Duration::from_secs(5);
    while threads_named("tenure-sqlite") == 0 && Instant::now() < named_by {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    assert_eq!(threads_named("tenure-sqlite"), 1);
    let runtime_threads = threads_named("tokio-runtime-w");
    // 200 acquires at once: each waits its turn for the one connection, none of them in
    // a thread of its own.
    let calls: Vec<_> = (0..200)
        .map(|i| {
            let store = store.clone();
            tokio::spawn(async move {
                let e = ElectionName::new(format!("many/{i}")).unwrap();
                store.try_acquire(&AcquireRequest::new(e, HolderId::new("x").unwrap(), Duration::from_secs(30))).await
            })
        })
        .collect();
    for c in calls {
        assert!(matches!(c.await.unwrap(), Ok(Acquire::Acquired(_))));
    }
    assert_eq!(threads_named("tenure-sqlite"), 1);
    // (The blocking-pool thread that opened the store may have ended meanwhile.)
    assert!(threads_named("tokio-runtime-w") <= runtime_threads, "calls ran in threads of their own");
    assert_eq!(store.list("many/").await.unwrap().len(), 200);
    drop(store);
    let until = Instant::now() + Duration::from_secs(20);
    while threads_named("tenure-sqlite") > 0 && Instant::now() < until {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(threads_named("tenure-sqlite"), 0, "the connection's thread outlived its store");
}
