//! The SQLite store passes the conformance suite, with every handle on its own connection.

use std::sync::Arc;

use tenure::LeaseStore;
use tenure_sqlite::SqliteStore;
use tenure_testkit::conformance::{self, Harness};

struct Sqlite {
    dir: tempfile::TempDir,
}

#[async_trait::async_trait]
impl Harness for Sqlite {
    async fn open(&self) -> Arc<dyn LeaseStore> {
        Arc::new(SqliteStore::open(self.dir.path().join("leases.db")).await.unwrap())
    }

    async fn restart(&self) -> bool {
        // Every `open` is a fresh connection to the file; closing them all and opening
        // again is what a restart of the processes amounts to.
        true
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_store_conforms() {
    conformance::run_all(Sqlite { dir: tempfile::tempdir().unwrap() }).await;
}
